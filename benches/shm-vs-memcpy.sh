#!/usr/bin/env bash
# Same-host transfers over the shm transport beside a plain memcpy of the same blocks,
# measured in one run: tebench read/write at 64K, 1M and 16M blocks with 1 and 2 threads,
# then memcpy-bench with the same blocks, buffers and address pattern.
#
# Usage: benches/shm-vs-memcpy.sh [seconds per run]      (default 3; builds --release)
#   BUFFER=1G    size of the target's buffer (and of memcpy-bench's stand-in for it)
#   BATCH=128    requests (blocks) per batch
#   REPEAT=2     runs per point and side, alternating shm and memcpy; the best run counts
#                (on a busy machine the best run is the one least disturbed by others)
#
# The shm transport copies with MC_SHM_THREADS threads; the script sets it to the thread
# count of each point, so that both columns copy with the same number of threads.
#
# Two figures per side: bytes per second of wall-clock time, and bytes per second of CPU
# time the process used (all its threads: for shm that includes submitting, waking and
# completing, and pre-faulting the peer's mapping). On a machine shared with other work the
# first mostly measures how much CPU each program got; the second does not depend on that.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${1:-3}
BUFFER=${BUFFER:-1G}
BATCH=${BATCH:-128}
REPEAT=${REPEAT:-2}

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

# "<GB per wall second> <GB per CPU second>" from a JSON summary line.
figures() {
  sed -n 's/.*"bytes":\([0-9]*\).*"cpu_s":\([0-9.eE+-]*\).*"gb_per_s":\([0-9.eE+-]*\).*/\1 \2 \3/p' |
    tail -n 1 | awk '$2 > 0 { printf "%s %.6f\n", $3, $1 / $2 / 1e9 }'
}
best() { awk -v a="$1" -v b="$2" 'BEGIN { print (a == "" || b + 0 > a + 0) ? b : a }'; }

echo "# shm transport vs memcpy: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs," \
  "$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)"
echo "# target buffer $BUFFER, $BATCH blocks per batch, best of $REPEAT runs of $DURATION s," \
  "$(cat /proc/loadavg | cut -d' ' -f1-3) load average at start"
echo
echo "| op | block | threads | shm GB/s | memcpy GB/s | shm / memcpy | shm GB/CPU-s | memcpy GB/CPU-s | shm / memcpy |"
echo "|---|---|---|---|---|---|---|---|---|"
for op in read write; do
  for block in 64K 1M 16M; do
    for threads in 1 2; do
      shm="" mem="" shm_cpu="" mem_cpu=""
      for _ in $(seq 1 "$REPEAT"); do
        s=$(MC_SHM_THREADS=$threads "$bin/tebench" initiator --protocol shm \
          --segment "$segment" --local-hostname 127.0.0.1 --operation "$op" \
          --block-size "$block" --batch-size "$BATCH" --threads "$threads" \
          --duration "$DURATION" --report-interval 0 --json 2>>"$work/initiator.err" | figures || true)
        m=$("$bin/memcpy-bench" --operation "$op" --block-size "$block" \
          --batch-size "$BATCH" --threads "$threads" --buffer-size "$BUFFER" \
          --duration "$DURATION" --json | figures || true)
        if [ -z "$s" ] || [ -z "$m" ]; then
          echo "a run failed ($op $block $threads):" >&2
          tail -n 5 "$work/initiator.err" >&2
          exit 1
        fi
        shm=$(best "$shm" "${s% *}")
        shm_cpu=$(best "$shm_cpu" "${s#* }")
        mem=$(best "$mem" "${m% *}")
        mem_cpu=$(best "$mem_cpu" "${m#* }")
      done
      awk -v op="$op" -v b="$block" -v t="$threads" -v s="$shm" -v m="$mem" \
        -v sc="$shm_cpu" -v mc="$mem_cpu" 'BEGIN {
          printf "| %s | %s | %d | %.2f | %.2f | %.0f %% | %.2f | %.2f | %.0f %% |\n",
            op, b, t, s, m, 100 * s / m, sc, mc, 100 * sc / mc }'
    done
  done
done
