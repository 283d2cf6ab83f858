#!/usr/bin/env bash
# Side by side on one RDMA device: perftest's ib_write_bw / ib_read_bw and
# `tebench --protocol rdma` write / read, at 64 KiB and 1 MiB, with tebench's share of
# perftest's bandwidth. Both run server and client on this host (loopback through the
# device). Runs inside the soft-RoCE VM:
#   ../shared/rxe-vm/run-in-rxe-vm.sh benches/rdma-vs-perftest.sh
# or on a host with a real NIC:
#   benches/rdma-vs-perftest.sh --device mlx5_0 --gid-index 3 --iters 20000 --duration 10
# Figures are in MiB/s on both sides (perftest's "MB/sec" is 2^20 bytes per second).
set -euo pipefail

dev=${RXE_VM_DEV:-rxe0}
gid=${RXE_VM_GID_INDEX:-}
tebench=${TEBENCH:-target/release/tebench}
duration=5
threads=2
reps=3
iters_64k=2000
iters_1m=200
sizes="65536 1048576"

usage() {
  sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'
  echo "Options: --device DEV  --gid-index N  --tebench PATH  --duration SECONDS  --threads N (tebench)"
  echo "         --reps N (runs of each, alternating; the best of each is shown; default 3)"
  echo "         --iters N (perftest iterations at 64 KiB; 1/10 of it at 1 MiB)  --sizes \"BYTES ...\""
}

while [ $# -gt 0 ]; do
  case $1 in
    --device) dev=$2; shift 2 ;;
    --gid-index) gid=$2; shift 2 ;;
    --tebench) tebench=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --iters) iters_64k=$2; iters_1m=$(( $2 / 10 > 5 ? $2 / 10 : 5 )); shift 2 ;;
    --sizes) sizes=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
done

for tool in ib_write_bw ib_read_bw; do
  command -v $tool >/dev/null || { echo "$tool not found (install perftest)" >&2; exit 1; }
done
[ -x "$tebench" ] || { echo "$tebench not found: cargo build --release -p crescent-benches" >&2; exit 1; }

gid_perftest=()
gid_tebench=()
if [ -n "$gid" ]; then
  gid_perftest=(-x "$gid")
  gid_tebench=(--gid-index "$gid")
fi
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

# perftest OP SIZE ITERS PORT -> average MiB/s
perftest() {
  local op=$1 size=$2 iters=$3 port=$4
  "ib_${op}_bw" -d "$dev" "${gid_perftest[@]}" -s "$size" -n "$iters" -p "$port" \
    >"$work/server.out" 2>&1 &
  local server=$!
  sleep 1
  local out
  out=$("ib_${op}_bw" -d "$dev" "${gid_perftest[@]}" -s "$size" -n "$iters" -p "$port" \
    127.0.0.1 2>&1) || { echo "$out" >&2; wait $server || true; return 1; }
  wait $server || true
  # The result row: "#bytes #iterations BW peak BW average MsgRate".
  echo "$out" | awk -v s="$size" '$1 == s && NF >= 4 { bw = $4 } END { if (bw == "") exit 1; print bw }'
}

# tebench OP SIZE SEGMENT -> MiB/s; each thread keeps 8 MiB / threads in flight per batch
# (perftest keeps 128 x 64 KiB = 8 MiB in flight at 64 KiB).
tebench_run() {
  local op=$1 size=$2 segment=$3
  local batch=$(( 8388608 / threads / size )); [ $batch -lt 4 ] && batch=4
  "$tebench" initiator --protocol rdma --device-name "$dev" "${gid_tebench[@]}" \
    --segment "$segment" --operation "$op" --block-size "$size" --batch-size "$batch" --threads "$threads" \
    --duration "$duration" --report-interval 0 --json --local-hostname 127.0.0.1 \
    2>"$work/initiator.err" | tail -n 1 |
    python3 -c 'import json,sys; r=json.load(sys.stdin); print("%.2f" % (r["bytes"] / r["duration_s"] / 2**20))'
}

RUST_LOG=${RUST_LOG:-warn} "$tebench" target --protocol rdma --device-name "$dev" "${gid_tebench[@]}" \
  --buffer-size 64M --local-hostname 127.0.0.1 >"$work/target.out" 2>"$work/target.err" &
pids+=($!)
for _ in $(seq 300); do
  grep -q '^segment: ' "$work/target.out" && break
  sleep 0.2
done
segment=$(sed -n 's/^segment: //p' "$work/target.out")
[ -n "$segment" ] || { cat "$work/target.err" >&2; echo "tebench target did not start" >&2; exit 1; }

printf '%-6s %-8s %15s %15s %8s\n' op size "perftest MiB/s" "tebench MiB/s" ratio
port=18515
for op in write read; do
  for size in $sizes; do
    iters=$iters_64k
    [ "$size" -ge 1048576 ] && iters=$iters_1m
    # Alternate the two tools and keep the best run of each: on a shared (or emulated)
    # machine single runs vary a lot.
    p=0 t=0
    for _ in $(seq "$reps"); do
      # perftest's own out-of-band exchange sometimes fails on an overloaded machine: retry.
      pr=""
      for _try in 1 2 3; do
        port=$((port + 1))
        pr=$(perftest "$op" "$size" "$iters" "$port") && break
        echo "  perftest $op $size failed, retrying" >&2
        pr=""
      done
      [ -n "$pr" ] || { echo "perftest $op $size failed 3 times" >&2; exit 1; }
      tr=$(RUST_LOG=${RUST_LOG:-warn} tebench_run "$op" "$size" "$segment") ||
        { cat "$work/initiator.err" >&2; echo "tebench $op $size failed" >&2; exit 1; }
      echo "  run: $op $size perftest $pr tebench $tr" >&2
      p=$(python3 -c "print(max($p, $pr))") t=$(python3 -c "print(max($t, $tr))")
    done
    ratio=$(python3 -c "print('%.0f%%' % (100 * $t / $p) if $p > 0 else 'n/a')")
    label=$([ "$size" -ge 1048576 ] && echo "$((size / 1048576))M" || echo "$((size / 1024))K")
    printf '%-6s %-8s %15s %15s %8s\n' "$op" "$label" "$p" "$t" "$ratio"
  done
done
