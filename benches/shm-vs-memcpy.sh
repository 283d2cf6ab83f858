#!/usr/bin/env bash
# Same-host transfers over the shm transport beside a plain memcpy of the same blocks,
# measured in one run: tebench read/write at 64K, 1M and 16M blocks with 1 and 2 threads,
# then memcpy-bench with the same blocks, buffers and address pattern.
#
# Usage: benches/shm-vs-memcpy.sh [seconds per point]      (default 3; builds --release)
#   BUFFER=1G    size of the target's buffer (and of memcpy-bench's stand-in for it)
#   BATCH=128    requests (blocks) per batch
#
# The shm transport copies with MC_SHM_THREADS threads; the script sets it to the thread
# count of each point, so that both columns copy with the same number of threads.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${1:-3}
BUFFER=${BUFFER:-1G}
BATCH=${BATCH:-128}

cargo build --release --quiet -p crescent-benches
bin=target/release
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

gbps() { sed -n 's/.*"gb_per_s":\([0-9.eE+-]*\).*/\1/p' | tail -n 1; }

echo "# shm transport vs memcpy: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs," \
  "$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)"
echo "# target buffer $BUFFER, $BATCH blocks per batch, $DURATION s per point"
echo
echo "| op | block | threads | shm GB/s | memcpy GB/s | shm / memcpy |"
echo "|---|---|---|---|---|---|"
for op in read write; do
  for block in 64K 1M 16M; do
    for threads in 1 2; do
      shm=$(MC_SHM_THREADS=$threads "$bin/tebench" initiator --protocol shm \
        --segment "$segment" --local-hostname 127.0.0.1 --operation "$op" \
        --block-size "$block" --batch-size "$BATCH" --threads "$threads" \
        --duration "$DURATION" --report-interval 0 --json 2>>"$work/initiator.err" | gbps)
      mem=$("$bin/memcpy-bench" --operation "$op" --block-size "$block" \
        --batch-size "$BATCH" --threads "$threads" --buffer-size "$BUFFER" \
        --duration "$DURATION" --json | gbps)
      if [ -z "$shm" ] || [ -z "$mem" ]; then
        echo "a run failed ($op $block $threads):" >&2
        tail -n 5 "$work/initiator.err" >&2
        exit 1
      fi
      awk -v op="$op" -v b="$block" -v t="$threads" -v s="$shm" -v m="$mem" \
        'BEGIN { printf "| %s | %s | %d | %.2f | %.2f | %.0f %% |\n", op, b, t, s, m, 100 * s / m }'
    done
  done
done
