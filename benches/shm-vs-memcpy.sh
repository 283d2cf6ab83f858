#!/usr/bin/env bash
# Same-host transfers over the shm transport beside a plain memcpy of the same blocks, in
# alternating pairs: tebench read/write at 64K, 1M and 16M blocks with 1 and 2 threads, and
# memcpy-bench with the same blocks, buffers and address pattern.
#
# Usage: benches/shm-vs-memcpy.sh [seconds per run, default 2] [--pairs N] [--csv FILE]
#            [--blocks "64K 1M 16M"] [--threads "1 2"] [--ops "read write"]
#   BUFFER=1G    size of the target's buffer (and of memcpy-bench's stand-in for it)
#   BATCH=128    requests (blocks) per batch
#   PAIRS=5      memcpy/shm pairs per row (--pairs; REPEAT, its old name, is read too)
#   BIN_DIR=DIR  use DIR's tebench and memcpy-bench as they are instead of building
#
# The shm transport copies with MC_SHM_THREADS threads; the script sets it to the thread
# count of each row, so that both sides copy with the same number of threads.
#
# Two figures per side: bytes per second of wall-clock time (the one the target is about:
# shm >= 0.90 of memcpy), and bytes per second of CPU time the process used (all its threads:
# for shm that includes submitting, waking and completing). tebench's unmeasured warm-up
# moves its whole share of the target's buffer once (--warm-up-pass), so the one-time mapping
# of the peer's memory (page tables for 1 GiB of 4 KiB pages: about a tenth of a 3 s run's CPU)
# comes before the measured part, as memcpy-bench's MAP_POPULATE does. Each row prints the
# medians of both, the median of the per-pair ratios and their range; the load average is
# printed at start and end.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=2
BUFFER=${BUFFER:-1G}
BATCH=${BATCH:-128}
PAIRS=${PAIRS:-${REPEAT:-5}}
CSV=${CSV:-}
BLOCKS="64K 1M 16M" THREADS="1 2" OPS="read write"
. benches/lib-args.sh
BENCH_OPTIONS="--pairs=PAIRS --csv=CSV --blocks=BLOCKS --threads=THREADS --ops=OPS" BENCH_NUMBER=DURATION
bench_args "$@"
. benches/lib-pairs.sh

if [ -n "${BIN_DIR:-}" ]; then
  bin=$BIN_DIR # a build kept aside (to compare two builds), used as it is
else
  cargo build --release --quiet -p crescent-benches
  bin=${CARGO_TARGET_DIR:-$PWD/target}/release
fi
work=$(mktemp -d)
target_pid=""
cleanup() {
  [ -n "$target_pid" ] && kill "$target_pid" 2>/dev/null && wait "$target_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

: >"$work/target.out"
"$bin/tebench" target --buffer-size "$BUFFER" --local-hostname 127.0.0.1 \
  >"$work/target.out" 2>"$work/target.err" &
target_pid=$!
segment=""
for _ in $(seq 1 100); do
  segment=$(sed -n 's/^segment: //p' "$work/target.out" || true)
  [ -n "$segment" ] && break
  kill -0 "$target_pid" 2>/dev/null || { cat "$work/target.err" >&2; exit 1; }
  sleep 0.1
done
[ -n "$segment" ] || { echo "tebench target printed no segment name" >&2; exit 1; }

# "<GB per wall second> <GB per CPU second>" from a JSON summary line.
figures() {
  sed -n 's/.*"bytes":\([0-9]*\).*"cpu_s":\([0-9.eE+-]*\).*"gb_per_s":\([0-9.eE+-]*\).*/\1 \2 \3/p' |
    tail -n 1 | awk '$2 > 0 { printf "%s %.6f\n", $3, $1 / $2 / 1e9 }'
}
shm_run() { # op block threads
  MC_SHM_THREADS=$3 "$bin/tebench" initiator --protocol shm --segment "$segment" \
    --local-hostname 127.0.0.1 --operation "$1" --block-size "$2" --batch-size "$BATCH" \
    --threads "$3" --duration "$DURATION" --warm-up-pass --report-interval 0 --json 2>>"$work/initiator.err" | figures
}
memcpy_run() { # op block threads
  "$bin/memcpy-bench" --operation "$1" --block-size "$2" --batch-size "$BATCH" --threads "$3" \
    --buffer-size "$BUFFER" --duration "$DURATION" --json | figures
}

echo "# shm transport vs memcpy: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs," \
  "$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)"
echo "# target buffer $BUFFER, $BATCH blocks per batch, $PAIRS alternating memcpy/shm pairs of $DURATION s per row"
pairs_load start
echo
pairs_header "op|block|threads" "shm GB/s" "memcpy GB/s" --metric "CPU,shm GB/CPU-s,memcpy GB/CPU-s"
pairs_grid ">= 0.90" shm_run memcpy_run || { tail -n 5 "$work/initiator.err" >&2; exit 1; }
echo
pairs_load end
