#!/usr/bin/env bash
# perftest's ib_write_bw / ib_read_bw against `tebench --protocol rdma` write / read on one
# RDMA device, at 64 KiB and 1 MiB, with the same parameters on both sides:
#   message size      perftest -s = tebench --block-size
#   queue pairs       perftest -q = MC_NUM_QP_PER_EP
#   path MTU          perftest -m = MC_MTU (default: the port's active MTU)
#   bytes in flight   perftest -q x -t x size = tebench --threads x --batch-size x size
#   measured time     perftest -D (duration + 2 s) -f 1 (1 s margins not measured) = tebench --duration
# The two tools run alternately (perftest, tebench, perftest, tebench, ...) in short runs; each
# pair is printed, then per case (through benches/pairs.py) the median of each tool, the median
# and range of the per-pair ratios and the target (>= 0.90 of perftest); the load average is
# printed at start and end; --csv FILE appends the rows to a CSV file. Both ends run on this
# host (loopback through the device). In the VM, with two vCPUs so that soft-RoCE's kernel
# work does not share one CPU with the tools' threads:
#   ../shared/rxe-vm/run-in-rxe-vm.sh --smp 2 benches/rdma-vs-perftest.sh
# On a host with a real NIC:
#   benches/rdma-vs-perftest.sh --device mlx5_0 --gid-index 3 --duration 5 --pairs 7
# Figures in MiB/s (perftest's "MB/sec" is 2^20 bytes per second).
set -euo pipefail

dev=${RXE_VM_DEV:-rxe0}
gid=${RXE_VM_GID_INDEX:-}
tebench=${TEBENCH:-target/release/tebench}
duration=2
pairs=5
qps=1
threads=2
inflight=$((8 << 20))
mtu=""
slice=""
sizes="65536 1048576"
ops="write read"
CSV=${CSV:-}
. "$(dirname "$0")/lib-pairs.sh"

usage() {
  sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
  echo "Options: --device DEV  --gid-index N  --tebench PATH  --duration SECONDS (measured, default 2)"
  echo "         --pairs N (perftest+tebench pairs per case, default 5)  --qps N (default 1)"
  echo "         --threads N (tebench, default 2)  --inflight BYTES (default 8 MiB)  --mtu BYTES"
  echo "         --slice BYTES (MC_SLICE_SIZE for tebench; default the engine's 64 KiB)"
  echo "         --sizes \"BYTES ...\"  --ops \"write read\"  --csv FILE"
}

while [ $# -gt 0 ]; do
  case $1 in
    --device) dev=$2; shift 2 ;;
    --gid-index) gid=$2; shift 2 ;;
    --tebench) tebench=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --pairs) pairs=$2; shift 2 ;;
    --qps) qps=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --inflight) inflight=$2; shift 2 ;;
    --mtu) mtu=$2; shift 2 ;;
    --slice) slice=$2; shift 2 ;;
    --sizes) sizes=$2; shift 2 ;;
    --ops) ops=$2; shift 2 ;;
    --csv) CSV=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
done

for tool in ib_write_bw ib_read_bw; do
  command -v $tool >/dev/null || { echo "$tool not found (install perftest)" >&2; exit 1; }
done
[ -x "$tebench" ] || { echo "$tebench not found: cargo build --release -p crescent-benches" >&2; exit 1; }
if [ -z "$mtu" ]; then
  mtu=$(ibv_devinfo -d "$dev" -i 1 2>/dev/null | awk '/active_mtu/ { print $2; exit }' || true)
  [ -n "$mtu" ] || { echo "cannot read the active MTU of $dev; pass --mtu" >&2; exit 1; }
fi

gid_perftest=()
gid_tebench=()
if [ -n "$gid" ]; then
  gid_perftest=(-x "$gid")
  gid_tebench=(--gid-index "$gid")
fi
export MC_NUM_QP_PER_EP=$qps MC_MTU=$mtu
[ -n "$slice" ] && export MC_SLICE_SIZE=$slice
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

# perftest OP SIZE DEPTH PORT -> average MiB/s over the measured `duration` seconds
perftest() {
  local op=$1 size=$2 depth=$3 port=$4
  local args=(-d "$dev" "${gid_perftest[@]}" -s "$size" -q "$qps" -t "$depth" -m "$mtu"
    -D $((duration + 2)) -f 1 -F -p "$port")
  "ib_${op}_bw" "${args[@]}" >"$work/server.out" 2>&1 &
  local server=$!
  sleep 1
  local out
  out=$("ib_${op}_bw" "${args[@]}" 127.0.0.1 2>&1) || { echo "$out" >&2; wait $server || true; return 1; }
  wait $server || true
  # The result row: "#bytes #iterations BW peak BW average MsgRate".
  echo "$out" | awk -v s="$size" '$1 == s && NF >= 4 { bw = $4 } END { if (bw == "") exit 1; print bw }'
}

# tebench OP SIZE BATCH SEGMENT -> MiB/s
tebench_run() {
  local op=$1 size=$2 batch=$3 segment=$4
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

pairs_load start
echo "device $dev, MTU $mtu, $qps queue pair(s), $((inflight >> 20)) MiB in flight, ${duration} s measured per run," \
  "$pairs pairs per case, tebench slice ${slice:-default}, $threads tebench thread(s)"
port=18515
: >"$work/rows"
for op in $ops; do
  for size in $sizes; do
    label=$([ "$size" -ge 1048576 ] && echo "$((size / 1048576))M" || echo "$((size / 1024))K")
    # perftest keeps DEPTH messages in flight per queue pair; tebench THREADS batches of BATCH.
    depth=$(( inflight / qps / size )); [ $depth -lt 1 ] && depth=1
    batch=$(( inflight / threads / size )); [ $batch -lt 1 ] && batch=1
    : >"$work/pairs"
    for i in $(seq "$pairs"); do
      # perftest's own out-of-band exchange sometimes fails on an overloaded machine: retry.
      pr=""
      for _try in 1 2 3; do
        port=$((port + 1))
        pr=$(perftest "$op" "$size" "$depth" "$port") && break
        echo "  perftest $op $size failed, retrying" >&2
        pr=""
      done
      [ -n "$pr" ] || { echo "perftest $op $size failed 3 times" >&2; exit 1; }
      tr=$(RUST_LOG=${RUST_LOG:-warn} tebench_run "$op" "$size" "$batch" "$segment") ||
        { cat "$work/initiator.err" >&2; echo "tebench $op $size failed" >&2; exit 1; }
      echo "$tr $pr" >>"$work/pairs"
      python3 -c "print('  pair %d: %-5s %-3s perftest %7.2f  tebench %7.2f  ratio %4.0f%%' % ($i, '$op', '$label', $pr, $tr, 100 * $tr / $pr))"
    done
    python3 "$PAIRS_PY" row "$op|$label" "$work/pairs" --target ">= 0.90" ${CSV:+--csv "$CSV"} \
      --columns "op|size" >>"$work/rows"
  done
done
echo
pairs_header "op|size" "tebench MiB/s" "perftest MiB/s"
cat "$work/rows"
echo
pairs_load end
