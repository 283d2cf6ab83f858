#!/usr/bin/env bash
# Crescent side by side with upstream Mooncake's own build, in one run, on this machine.
#
#   benches/vs-mooncake.sh [seconds per engine measurement, default 5] [--pairs N] [--out DIR]
#       [--only engine|store] [--blocks "64K 1M 16M"] [--ops "read write"] [--threads "1"]
#       [--window 256M] [--sizes "1M 10M 25M"] [--calls "64K"] [--iperf-streams N]
#
# Installs upstream's non-CUDA wheel (MOONCAKE_WHEEL, default
# mooncake-transfer-engine-non-cuda==0.3.13.post1, from PyPI) into a venv of its own
# (MOONCAKE_VENV, default ci/.work/venv-mooncake), apart from Crescent's (PYTHON, default
# .venv/bin/python, with the `crescent` wheel and the `mooncake` alias; built with ci/ffi.sh's
# release wheel when it has no `crescent`). Then, loopback tcp only:
#
# engine  upstream's transfer_engine_bench against Crescent's tebench (target + initiator,
#         P2PHANDSHAKE), read and write of --blocks, with the same threads, batch and memory
#         window on both: batch 128, or fewer where 128 blocks x threads would pass --window
#         (16 at 16 MiB), and buffers of --window bytes on both ends; upstream with its
#         connection pool (MOONCAKE_ENV, default MC_TCP_ENABLE_CONNECTION_POOL=1, its lanes at
#         their default of 4), Crescent with its defaults. Limit: iperf3 over loopback with
#         --iperf-streams streams (default 2, Crescent's tcp lanes).
# store   each system's own master (mooncake_master, crescent-master; the same flags, with a
#         0.5 s read lease so that a reader can free its keys) and a holder process (a
#         MooncakeDistributedStore with a 1 GiB segment), and per measurement one reader
#         process without a segment that puts --sizes values (into the holder) and gets them
#         back, 256 MiB each way, through `from mooncake.store import MooncakeDistributedStore`
#         of its own venv (benches/vs-mooncake-store.py). Limit: memcpy of the same size
#         (memcpy-bench, one thread). Sizes under 1 MiB get a row of puts per second too.
#         Then `batch_put_from` of 32 x 1 MiB from registered memory, 256 MiB per measurement;
#         limit: the engine's write throughput on the same link (tebench write, 1 MiB blocks).
#         Then single calls (--calls sizes; "" for none): the median of 2000 `is_exist`, `put`
#         and `get` each, timed one by one, as calls per second; limit: a 64-byte tcp
#         ping-pong between two Python processes (round trips per second).
#
# Every row runs --pairs pairs (default 3): the limit, then Mooncake then Crescent in odd
# pairs and Crescent then Mooncake in even ones. It prints both medians, the median of the
# per-pair ratios Crescent / Mooncake and their range, the limit and each side's share of it,
# with the load average at start and end; writes DIR/raw.csv, DIR/summary.csv, DIR/table.md and
# DIR/vs-mooncake-{engine,store}.svg (DIR: --out, default ci/.work/vs-mooncake), and every
# process's log under DIR/logs/ (a failed run prints the end of its log). Every process it
# starts is ended when it exits.
#
#   BIN_DIR=DIR   use DIR's tebench, crescent-master and memcpy-bench instead of building
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=5 PAIRS=3 OUT=ci/.work/vs-mooncake ONLY="" BLOCKS="64K 1M 16M" OPS="read write" THREADS=1
SIZES="1M 10M 25M" STREAMS=2 WINDOW=256M CALLS=64K
. benches/lib-args.sh
BENCH_OPTIONS="--pairs=PAIRS --out=OUT --only=ONLY --blocks=BLOCKS --ops=OPS --threads=THREADS --sizes=SIZES
  --calls=CALLS --iperf-streams=STREAMS --window=WINDOW"
BENCH_NUMBER=DUR
bench_args "$@"
case $ONLY in ""|engine|store) ;; *) echo "vs-mooncake.sh: --only engine or store" >&2; exit 2 ;; esac
[[ $DUR =~ ^[0-9]+$ ]] || { echo "vs-mooncake.sh: the duration is whole seconds (transfer_engine_bench's)" >&2; exit 2; }
WHEEL=${MOONCAKE_WHEEL:-mooncake-transfer-engine-non-cuda==0.3.13.post1}
MVENV=${MOONCAKE_VENV:-ci/.work/venv-mooncake}
CPY=${PYTHON:-.venv/bin/python}
read -r -a MENV <<<"${MOONCAKE_ENV:-MC_TCP_ENABLE_CONNECTION_POOL=1}"
die() { echo "vs-mooncake.sh: $*" >&2; exit 1; }
command -v iperf3 >/dev/null || die "iperf3 is missing: apt-get install iperf3"

# --- upstream's wheel, in its own venv -------------------------------------------------------
if ! "$MVENV/bin/python" -c 'import mooncake.store' 2>/dev/null; then
  echo "installing $WHEEL into $MVENV ..." >&2
  [ -x "$MVENV/bin/python" ] || python3 -m venv "$MVENV" || die "cannot make a venv at $MVENV (apt-get install python3-venv)"
  "$MVENV/bin/python" -m pip install -q --disable-pip-version-check "$WHEEL" ||
    die "cannot install $WHEEL from PyPI into $MVENV (pip's reason above: no network, or no wheel of it for $(python3 -V) on $(uname -m) Linux)"
fi
MPKG=$("$MVENV/bin/python" -c 'import mooncake, os; print(os.path.dirname(os.path.realpath(mooncake.__file__)))') ||
  die "$MVENV cannot import upstream's mooncake package"
for b in transfer_engine_bench mooncake_master; do
  [ -x "$MPKG/$b" ] || die "upstream's $b is missing from $MPKG (is $WHEEL installed whole?)"
done
case $MPKG in "$(cd "$MVENV" && pwd -P)"/*) ;; *) die "$MVENV imports mooncake from $MPKG, outside the venv" ;; esac
! "$MVENV/bin/python" -c 'import crescent' 2>/dev/null || die "$MVENV has Crescent's crescent package: keep the venvs apart"
MVERSION=$("$MVENV/bin/python" -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' "${WHEEL%%[=<>]*}" 2>/dev/null) || MVERSION="?"

# --- Crescent: release binaries and the release wheel in its own venv ------------------------
if [ -n "${BIN_DIR:-}" ]; then
  BIN=$BIN_DIR
else
  echo "building tebench, memcpy-bench and crescent-master (release)..." >&2
  cargo build --release -q -p crescent-benches -p crescent-store || die "cargo build failed"
  BIN=${CARGO_TARGET_DIR:-$PWD/target}/release
fi
for b in tebench crescent-master memcpy-bench; do [ -x "$BIN/$b" ] || die "$BIN/$b is missing"; done
if [ "$ONLY" != engine ] && ! "$CPY" -c 'import crescent' 2>/dev/null; then
  [ -z "${PYTHON:-}" ] || die "$CPY cannot import crescent: install the release wheel there (ci/ffi.sh)"
  echo "building Crescent's release wheel into .venv (ci/ffi.sh)..." >&2
  # shellcheck source=ci/lib.sh
  . ci/lib.sh
  # shellcheck source=ci/ffi.sh
  . ci/ffi.sh
  ci_python_env || die "making Crescent's venv .venv failed"
  ci_python_wheel release || die "building Crescent's wheel failed"
fi
if [ "$ONLY" != engine ]; then
  CPKG=$("$CPY" -c 'import mooncake.store, os; print(os.path.dirname(os.path.realpath(mooncake.__file__)), mooncake.store.MooncakeDistributedStore.__module__)') ||
    die "$CPY cannot import the mooncake alias (ffi/python-mooncake): install it with the crescent wheel"
  case $CPKG in
    "$MPKG "*) die "$CPY imports upstream's mooncake package: keep the venvs apart" ;;
    *" crescent"*) ;;
    *) die "$CPY's mooncake.store is not Crescent's ($CPKG)" ;;
  esac
fi

# --- processes and their end -----------------------------------------------------------------
PIDS=()
WORK=$(mktemp -d)
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null || true
  done
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
LOGS=$OUT/logs
rm -rf "$LOGS"
mkdir -p "$LOGS"
RAW=$OUT/raw.csv
echo "part,op,size,threads,pair,first,mooncake,crescent,limit,unit,limit_name" >"$RAW"
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_for() { # file pattern what pid
  for _ in $(seq 300); do
    grep -q "$2" "$1" 2>/dev/null && return 0
    kill -0 "$4" 2>/dev/null || { tail -n 5 "$1" >&2; die "$3 exited at start"; }
    sleep 0.1
  done
  tail -n 5 "$1" >&2; die "$3 did not start in 30 s"
}
# measure LOG COMMAND...: the command's stdout into $WORK/out, its stderr appended to LOG; when
# it fails, the log's last lines and where the whole of it is.
measure() {
  local log=$1
  shift
  if ! "$@" >"$WORK/out" 2>>"$log"; then
    echo "vs-mooncake.sh: $(basename "$log" .log) failed; the last lines of $log:" >&2
    tail -n 8 "$log" | cut -c 1-300 >&2
    return 1
  fi
}
bytes() { python3 -c 'import sys; t = sys.argv[1].upper(); u = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}; print(int(t[:-1]) * u[t[-1]] if t[-1] in u else int(t))' "$1"; }

# raw PART OP MOONCAKE CRESCENT [LIMIT UNIT]: one measurement's line of $RAW, from the size,
# threads, pair, order, limit, unit and limit's name of the pair `row` is in.
raw() {
  echo "$1,$2,$size,$th,$i,$first,$3,$4,${5:-$l},${6:-$unit},$lname" >>"$RAW"
}

# One row: pairs of (limit, Mooncake, Crescent) with the order of the two alternating.
# row PART OP SIZE THREADS UNIT LIMIT_NAME "limit command" "mooncake command" "crescent command"
# A command prints one figure (the store's readers print put and get: FIELD picks one).
row() {
  local part=$1 op=$2 size=$3 th=$4 unit=$5 lname=$6 lcmd=$7 mcmd=$8 ccmd=$9 i l m c first
  for i in $(seq 1 "$PAIRS"); do
    l=$(eval "$lcmd") || die "limit run failed: $lcmd"
    if [ $((i % 2)) -eq 1 ]; then
      first=mooncake
      m=$(eval "$mcmd") || die "Mooncake run failed ($part $op $size, pair $i)"
      c=$(eval "$ccmd") || die "Crescent run failed ($part $op $size, pair $i)"
    else
      first=crescent
      c=$(eval "$ccmd") || die "Crescent run failed ($part $op $size, pair $i)"
      m=$(eval "$mcmd") || die "Mooncake run failed ($part $op $size, pair $i)"
    fi
    if [ -z "$l" ] || [ -z "$m" ] || [ -z "$c" ]; then
      die "a run printed no figure ($part $op $size, pair $i): '$l' '$m' '$c'"
    fi
    if [ "$part" = store ] && [ "$op" = calls ]; then # "exists put get" calls per second
      local me mp mg ce cp cg
      read -r me mp mg <<<"$m"
      read -r ce cp cg <<<"$c"
      echo "  pair $i of $PAIRS, store calls $size (exists put get, calls/s): Mooncake $m, Crescent $c, ping-pong $l ($first first)" >&2
      raw store exists "$me" "$ce"
      raw store "put call" "$mp" "$cp"
      raw store "get call" "$mg" "$cg"
    elif [ "$part" = store ] && [ "$op" = put ]; then # readers print "put get puts/s": a line per op
      local mp mg mo cp cg co
      read -r mp mg mo <<<"$m"
      read -r cp cg co <<<"$c"
      echo "  pair $i of $PAIRS, store $size (put get MiB/s, puts/s): Mooncake $m, Crescent $c, memcpy $l ($first first)" >&2
      raw store put "$mp" "$cp"
      raw store get "$mg" "$cg"
      if [ "$(bytes "$size")" -lt $((1 << 20)) ]; then # small values: puts per second too (memcpy's in values/s)
        raw store put/s "$mo" "$co" "$(python3 -c 'import sys; print("%.0f" % (float(sys.argv[1]) * 2**20 / int(sys.argv[2])))' "$l" "$(bytes "$size")")" puts/s
      fi
    else
      echo "  pair $i of $PAIRS, $part $op $size x$th ($unit): Mooncake $m, Crescent $c, $lname $l ($first first)" >&2
      raw "$part" "$op" "$m" "$c"
    fi
  done
}

printf '%s, Crescent %s vs Mooncake %s (%s), tcp loopback, %s pairs per row\n' "$(date -u '+%F %H:%M UTC')" \
  "$(git rev-parse --short HEAD 2>/dev/null || echo '?')" "${MVERSION:-?}" "$WHEEL" "$PAIRS"
python3 benches/pairs.py load start

# --- engine ----------------------------------------------------------------------------------
if [ "$ONLY" != store ]; then
  IPORT=$(free_port)
  iperf3 -s -B 127.0.0.1 -p "$IPORT" >/dev/null 2>&1 &
  PIDS+=($!)
  "$BIN/tebench" target --protocol tcp --buffer-size "$WINDOW" --local-hostname 127.0.0.1 >"$LOGS/tebench-target.log" 2>&1 &
  PIDS+=($!)
  wait_for "$LOGS/tebench-target.log" '^segment: ' "tebench target" "${PIDS[-1]}"
  CSEG=$(sed -n 's/^segment: //p' "$LOGS/tebench-target.log")
  env "${MENV[@]}" "$MPKG/transfer_engine_bench" --mode=target --protocol=tcp --metadata_server=P2PHANDSHAKE \
    --local_server_name=127.0.0.1 --buffer_size="$(bytes "$WINDOW")" --logtostderr >"$LOGS/mooncake-target.log" 2>&1 &
  PIDS+=($!)
  wait_for "$LOGS/mooncake-target.log" 'listening on 127\.0\.0\.1:[0-9]' "transfer_engine_bench --mode=target" "${PIDS[-1]}"
  MSEG=$(sed -n 's/.*listening on \(127\.0\.0\.1:[0-9]*\).*/\1/p' "$LOGS/mooncake-target.log" | head -n 1)
  sleep 0.5
  iperf_gbps() {
    measure "$LOGS/iperf3.log" iperf3 -c 127.0.0.1 -p "$IPORT" -t "$DUR" -P "$STREAMS" -J || return 1
    python3 -c 'import json, sys; print("%.3f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"] / 8e9))' <"$WORK/out"
  }
  crescent_gbps() { # op block threads batch
    measure "$LOGS/tebench-initiator.log" "$BIN/tebench" initiator --segment "$CSEG" --protocol tcp --operation "$1" \
      --block-size "$2" --batch-size "$4" --threads "$3" --duration "$DUR" --report-interval 0 --json \
      --local-hostname 127.0.0.1 || return 1
    tail -n 1 "$WORK/out" | python3 -c 'import json, sys; print("%.3f" % json.load(sys.stdin)["gb_per_s"])'
  }
  mooncake_gbps() { # op block threads batch: GB/s from its batch count and duration (10^9 B)
    local log=$LOGS/mooncake-initiator.log
    measure "$log" env "${MENV[@]}" "$MPKG/transfer_engine_bench" --mode=initiator --protocol=tcp \
      --metadata_server=P2PHANDSHAKE --local_server_name=127.0.0.1 --segment_id="$MSEG" --operation="$1" \
      --block_size="$(bytes "$2")" --batch_size="$4" --threads="$3" --duration="$DUR" \
      --buffer_size="$(bytes "$WINDOW")" --logtostderr || return 1
    grep 'Test completed: ' "$log" | tail -n 1 | python3 -c '
import re, sys
m = re.search(r"Test completed: duration ([0-9.]+), batch count ([0-9]+)", sys.stdin.read())
m or sys.exit("transfer_engine_bench printed no result")
print("%.3f" % (int(m.group(2)) * int(sys.argv[1]) * int(sys.argv[2]) / float(m.group(1)) / 1e9))' "$4" "$(bytes "$2")"
  }
  echo "engine: Mooncake segment $MSEG (${MENV[*]}), Crescent segment $CSEG, window $WINDOW, iperf3 -P $STREAMS, ${DUR} s per measurement" >&2
  for op in $OPS; do
    for bs in $BLOCKS; do
      for th in $THREADS; do
        batch=$(( $(bytes "$WINDOW") / ($(bytes "$bs") * th) ))
        [ "$batch" -le 128 ] || batch=128
        [ "$batch" -ge 1 ] || die "one block of $bs x $th threads passes --window $WINDOW"
        row engine "$op" "$bs" "$th" GB/s iperf3 iperf_gbps "mooncake_gbps $op $bs $th $batch" "crescent_gbps $op $bs $th $batch"
      done
    done
  done
  for _ in 1 2 3; do # the two targets and iperf3: their memory back before the store's runs
    kill "${PIDS[-1]}" 2>/dev/null || true
    wait "${PIDS[-1]}" 2>/dev/null || true
    unset 'PIDS[-1]'
  done
fi

# --- store -----------------------------------------------------------------------------------
if [ "$ONLY" != engine ]; then
  MASTER_FLAGS=(--rpc_address=127.0.0.1 --metrics_host=127.0.0.1 --default_kv_lease_ttl=500)
  MPORT=$(free_port)
  "$MPKG/mooncake_master" "${MASTER_FLAGS[@]}" --rpc_port="$MPORT" --metrics_port="$(free_port)" \
    --logtostderr >"$LOGS/mooncake_master.log" 2>&1 &
  PIDS+=($!)
  CPORT=$(free_port)
  "$BIN/crescent-master" "${MASTER_FLAGS[@]}" --rpc_port="$CPORT" --metrics_port="$(free_port)" \
    >"$LOGS/crescent-master.log" 2>&1 &
  PIDS+=($!)
  for p in "$MPORT" "$CPORT"; do
    for _ in $(seq 300); do python3 -c 'import socket, sys; socket.create_connection(("127.0.0.1", int(sys.argv[1])), 1)' "$p" 2>/dev/null && break; sleep 0.1; done
  done
  env "${MENV[@]}" "$MVENV/bin/python" benches/vs-mooncake-store.py holder --master "127.0.0.1:$MPORT" \
    >"$LOGS/mooncake-holder.log" 2>&1 &
  PIDS+=($!)
  wait_for "$LOGS/mooncake-holder.log" '^ready ' "Mooncake's holder (see $LOGS/mooncake_master.log)" "${PIDS[-1]}"
  "$CPY" benches/vs-mooncake-store.py holder --master "127.0.0.1:$CPORT" >"$LOGS/crescent-holder.log" 2>&1 &
  PIDS+=($!)
  wait_for "$LOGS/crescent-holder.log" '^ready ' "Crescent's holder (see $LOGS/crescent-master.log)" "${PIDS[-1]}"
  echo "store: Mooncake's package $(sed -n 's/^ready //p' "$LOGS/mooncake-holder.log"), Crescent's $(sed -n 's/^ready //p' "$LOGS/crescent-holder.log")" >&2
  mooncake_reader() { # size -> "put get" (MiB/s)
    measure "$LOGS/mooncake-reader.log" env "${MENV[@]}" "$MVENV/bin/python" benches/vs-mooncake-store.py reader \
      --master "127.0.0.1:$MPORT" --size "$1" || return 1
    tail -n 1 "$WORK/out"
  }
  crescent_reader() { # size -> "put get" (MiB/s)
    measure "$LOGS/crescent-reader.log" "$CPY" benches/vs-mooncake-store.py reader --master "127.0.0.1:$CPORT" --size "$1" ||
      return 1
    tail -n 1 "$WORK/out"
  }
  memcpy_mibs() { # size -> MiB/s of one thread's memcpy of that size
    measure "$LOGS/memcpy-bench.log" "$BIN/memcpy-bench" --operation write --block-size "$1" --batch-size 16 --threads 1 \
      --duration 1 --json || return 1
    tail -n 1 "$WORK/out" | python3 -c 'import json, sys; print("%.0f" % (json.load(sys.stdin)["gb_per_s"] * 1e9 / 2**20))'
  }
  for sz in $SIZES; do
    row store put "$sz" 1 MiB/s memcpy "memcpy_mibs $sz" "mooncake_reader $sz" "crescent_reader $sz"
  done
  # batch_put_from of 32 x 1 MiB from registered memory, beside the engine's write throughput on
  # the same link (tebench write of 1 MiB blocks over tcp loopback, as the engine rows run it).
  "$BIN/tebench" target --protocol tcp --buffer-size "$WINDOW" --local-hostname 127.0.0.1 >"$LOGS/tebench-store-target.log" 2>&1 &
  PIDS+=($!)
  wait_for "$LOGS/tebench-store-target.log" '^segment: ' "tebench target" "${PIDS[-1]}"
  TSEG=$(sed -n 's/^segment: //p' "$LOGS/tebench-store-target.log")
  tebench_write_mibs() { # MiB/s of tebench's 1 MiB writes, batch as the engine rows (WINDOW / 1 MiB, at most 128)
    local batch=$(( $(bytes "$WINDOW") / (1 << 20) ))
    [ "$batch" -le 128 ] || batch=128
    measure "$LOGS/tebench-store-initiator.log" "$BIN/tebench" initiator --segment "$TSEG" --protocol tcp \
      --operation write --block-size 1M --batch-size "$batch" --threads 1 --duration "$DUR" --report-interval 0 \
      --json --local-hostname 127.0.0.1 || return 1
    tail -n 1 "$WORK/out" | python3 -c 'import json, sys; print("%.0f" % (json.load(sys.stdin)["gb_per_s"] * 1e9 / 2**20))'
  }
  batch_put() { # python master_port -> MiB/s of batch_put_from of 32 x 1 MiB
    measure "$LOGS/batch-put.log" env "${MENV[@]}" "$1" benches/vs-mooncake-store.py batch --master "127.0.0.1:$2" \
      --count 32 --size 1M || return 1
    tail -n 1 "$WORK/out"
  }
  row store batch_put_from 32x1M 1 MiB/s "tebench write 1M" tebench_write_mibs "batch_put $MVENV/bin/python $MPORT" \
    "batch_put $CPY $CPORT"
  # Single calls, each timed: what a call costs beside a bare round trip between two processes.
  calls_of() { # python master_port size -> "exists put get" in calls per second (1e6 / median us)
    measure "$LOGS/calls.log" env "${MENV[@]}" "$1" benches/vs-mooncake-store.py calls --master "127.0.0.1:$2" \
      --size "$3" || return 1
    tail -n 1 "$WORK/out" | python3 -c 'import sys; print(" ".join("%.0f" % (1e6 / float(x)) for x in sys.stdin.read().split()))'
  }
  pingpong_rate() { # round trips per second of a 64-byte tcp ping-pong between two Python processes
    measure "$LOGS/pingpong.log" python3 benches/vs-mooncake-store.py pingpong || return 1
    tail -n 1 "$WORK/out" | python3 -c 'import sys; print("%.0f" % (1e6 / float(sys.stdin.read())))'
  }
  for sz in $CALLS; do
    row store calls "$sz" 1 calls/s ping-pong pingpong_rate "calls_of $MVENV/bin/python $MPORT $sz" \
      "calls_of $CPY $CPORT $sz"
  done
fi

echo
python3 benches/vs-mooncake-report.py "$RAW" --out "$OUT"
echo
python3 benches/pairs.py load end
echo "raw pairs, table and plots in $OUT" >&2
