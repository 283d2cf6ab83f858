#!/usr/bin/env bash
# The cost of the cluster secret (issue 26): tebench (tcp, loopback) and storebench (master,
# holder client and storebench on loopback) with the secret on, beside the same runs with it
# off, in alternating pairs (benches/lib-pairs.sh). Authentication is once per connection, so
# the target is >= 0.98. Also prints the handshake's added latency: tebench's
# `open_segment_us` (dialling the target's handshake port, where the challenge-response is)
# with the secret on and off.
#
#   benches/auth-on-off.sh [--pairs N] [--store-bytes SIZE] [--no-build] [SECONDS]
#   (default 5 pairs, 2 s per tebench run, 512M moved per storebench row: a row of 128M lasts
#   about 60 ms on loopback, too short to rise above the machine's noise)
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=2 PAIRS=5 BUILD=1 STORE_BYTES=512M
while [ $# -gt 0 ]; do
  case $1 in
    --pairs) PAIRS=$2; shift 2 ;;
    --store-bytes) STORE_BYTES=$2; shift 2 ;;
    --no-build) BUILD=0; shift ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    [0-9]*) DUR=$1; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
command -v redis-server >/dev/null || { echo "redis-server is missing: apt-get install redis-server" >&2; exit 1; }
. benches/lib-pairs.sh
if [ "$BUILD" = 1 ]; then
  echo "building (release)..." >&2
  cargo build --release -q -p crescent-benches --bin tebench --bin storebench
  cargo build --release -q -p crescent-store --bin crescent-master --bin crescent
fi
BIN=${CARGO_TARGET_DIR:-$PWD/target}/release
SECRET=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')

PIDS=()
WORK=$(mktemp -d)
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT
wait_line() { # file prefix
  for _ in $(seq 300); do
    if grep -q "^$2" "$1" 2>/dev/null; then sed -n "s/^$2//p" "$1" | head -n 1; return 0; fi
    sleep 0.1
  done
  echo "timed out waiting for '$2' in $1" >&2; return 1
}
# `with on|off CMD...`: CMD with the secret in its environment, or without any. It runs in
# place of the (sub)shell, so that `$!` of `with ... &` is CMD's pid, which cleanup kills.
with() {
  local mode=$1; shift
  if [ "$mode" = on ]; then
    exec env -u CRESCENT_CLUSTER_SECRET_FILE -u CRESCENT_CLUSTER_SECRET_NEXT CRESCENT_CLUSTER_SECRET="$SECRET" "$@"
  else
    exec env -u CRESCENT_CLUSTER_SECRET_FILE -u CRESCENT_CLUSTER_SECRET_NEXT -u CRESCENT_CLUSTER_SECRET "$@"
  fi
}

# ---- tebench: one target with the secret, one without ----
declare -A SEG MASTER
for mode in on off; do
  with $mode "$BIN/tebench" target --protocol tcp --buffer-size 1G --local-hostname 127.0.0.1 \
    >"$WORK/target.$mode.out" 2>/dev/null &
  PIDS+=($!)
  SEG[$mode]=$(wait_line "$WORK/target.$mode.out" "segment: ")
done
tebench_gbps() { # on|off op block
  with "$1" "$BIN/tebench" initiator --segment "${SEG[$1]}" --protocol tcp --operation "$2" --block-size "$3" \
    --batch-size 128 --threads 1 --duration "$DUR" --report-interval 0 --json \
    --local-hostname 127.0.0.1 2>>"$WORK/initiator.err" | tail -n 1 | tee -a "$WORK/tebench.$1.json" |
    python3 -c 'import json,sys; print("%.3f" % json.load(sys.stdin)["gb_per_s"])'
}

# ---- storebench: a master and a holder client each, with and without the secret ----
redis_port=$((20000 + RANDOM % 20000))
redis-server --bind 127.0.0.1 --port "$redis_port" --save "" --appendonly no --logfile "$WORK/redis.log" &
PIDS+=($!)
for mode in on off; do
  with $mode "$BIN/crescent-master" --rpc-address 127.0.0.1:0 --admin-address "" \
    >"$WORK/master.$mode.out" 2>"$WORK/master.$mode.err" &
  PIDS+=($!)
  MASTER[$mode]=$(wait_line "$WORK/master.$mode.out" "master: ")
  mkfifo "$WORK/holder.$mode.in"
  with $mode "$BIN/crescent" client --master "${MASTER[$mode]}" --local-hostname 127.0.0.1 \
    --segment-size 1G --buffer-size 16M <"$WORK/holder.$mode.in" >"$WORK/holder.$mode.out" 2>"$WORK/holder.$mode.err" &
  PIDS+=($!)
  if [ $mode = on ]; then exec 8>"$WORK/holder.on.in"; else exec 9>"$WORK/holder.off.in"; fi
  wait_line "$WORK/holder.$mode.out" "ready " >/dev/null
done
for _ in $(seq 50); do redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break; sleep 0.1; done
store_mib_s() { # on|off op
  local out run
  # Each run's values are 1 MiB and a few bytes, a new size each run: its keys (which name the
  # size) are new, so its puts store (a put of a stored key is kept, not written again).
  echo >>"$WORK/runs"
  run=$(wc -l <"$WORK/runs")
  out=$WORK/store.$run.json
  (with "$1" "$BIN/storebench" --master "${MASTER[$1]}" --local-hostname 127.0.0.1 --redis "127.0.0.1:$redis_port" \
    --sizes $((1048576 + run)) --bytes-per-row "$STORE_BYTES" --meta-keys 0 --json "$out") >/dev/null 2>>"$WORK/storebench.err"
  python3 - "$out" "$2" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("%.1f" % next(r["store_mib_s"] for r in rows if r["op"] == sys.argv[2]))
PY
}

printf '%s, the cluster secret on vs off, loopback, %s pairs per row (tebench: tcp, batch 128, 1 thread, %s s)\n' \
  "$(date -u '+%F %H:%M UTC')" "$PAIRS" "$DUR"
pairs_load start
echo
pairs_header "bench|op|size" "secret on" "secret off"
for op in read write; do
  pairs_row "tebench GB/s|$op|1M" ">= 0.98" "tebench_gbps on $op 1M" "tebench_gbps off $op 1M"
done
for op in put get "get_into (zero copy)"; do
  pairs_row "storebench MiB/s|$op|1M" ">= 0.98" "store_mib_s on '$op'" "store_mib_s off '$op'"
done
echo
python3 - "$WORK/tebench.on.json" "$WORK/tebench.off.json" <<'PY'
import json, statistics, sys
on, off = ([json.loads(l)["open_segment_us"] for l in open(p) if l.strip()] for p in sys.argv[1:3])
m_on, m_off = statistics.median(on), statistics.median(off)
print(f"handshake (tebench open_segment, median of {len(on)} / {len(off)}): secret on {m_on:.0f} us, "
      f"off {m_off:.0f} us: authentication adds {m_on - m_off:.0f} us per connection")
PY
pairs_load end
