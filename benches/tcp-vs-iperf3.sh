#!/usr/bin/env bash
# tebench --protocol tcp vs iperf3 on the same path (loopback), in alternating pairs.
#
#   benches/tcp-vs-iperf3.sh [seconds per measurement, default 2] [--pairs N] [--csv FILE]
#       [--blocks "64K 1M 16M"] [--threads "1 2"] [--ops "read write"] [--iperf-streams N]
#
# Every row (operation, block size, threads) runs iperf3 and tebench alternately, --pairs times
# (default 5): iperf3 over loopback with as many streams as tebench uses tcp lanes (MC_TCP_LANES,
# default 2; --iperf-streams to change), then tebench (batch 128), or the other way round in
# every other pair. The row prints both medians, the median of the per-pair ratios, their range
# and the target (>= 0.90 of iperf3); the load average is printed at start and end. A second
# table sets the medians beside Mooncake's TCP transport on this kind of machine (target >= 2x).
#
# Each side also gets bytes per CPU second, both ends together (user + system time of all
# threads): tebench's initiator (its own `cpu_s`) plus the target process over the same run
# (from /proc/PID/stat, so it includes the unmeasured warm-up batch), and iperf3's client and
# server (its `cpu_utilization_percent` host and remote totals times the test's length). On a
# machine that other programs keep busy, wall-clock rates measure the scheduler as much as the
# code; CPU per byte does not.
#
#   BIN_DIR=DIR   use DIR/tebench as it is instead of building (to compare two builds)
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=2 PAIRS=5 CSV=${CSV:-} BLOCKS="64K 1M 16M" THREADS="1 2" OPS="read write"
LANES="${MC_TCP_LANES:-2}"
STREAMS=$LANES
. benches/lib-args.sh
BENCH_OPTIONS="--pairs=PAIRS --csv=CSV --blocks=BLOCKS --threads=THREADS --ops=OPS --iperf-streams=STREAMS"
BENCH_NUMBER=DUR
bench_args "$@"
command -v iperf3 >/dev/null || { echo "iperf3 is missing: apt-get install iperf3" >&2; exit 1; }
. benches/lib-pairs.sh
if [ -n "${BIN_DIR:-}" ]; then
  TEBENCH=$BIN_DIR/tebench # a build kept aside (to compare two builds), used as it is
else
  echo "building tebench (release)..." >&2
  cargo build --release -q -p crescent-benches --bin tebench
  TEBENCH=${CARGO_TARGET_DIR:-$PWD/target}/release/tebench
fi

PIDS=()
WORK=$(mktemp -d)
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT
[ -n "$CSV" ] || CSV=$WORK/rows.csv
: >"$CSV"

port=$((20000 + RANDOM % 20000))
iperf3 -s -p "$port" >/dev/null 2>&1 &
PIDS+=($!)
sleep 0.5
# "<GB per wall second> <GB per CPU second of both ends>"
iperf_gbps() {
  iperf3 -c 127.0.0.1 -p "$port" -t "$DUR" -P "$STREAMS" -J 2>/dev/null | python3 -c '
import json, sys
end = json.load(sys.stdin)["end"]
r, cpu = end["sum_received"], end["cpu_utilization_percent"]
cpu_s = (cpu["host_total"] + cpu["remote_total"]) / 100 * r["seconds"]
print("%.3f %.3f" % (r["bits_per_second"] / 8e9, r["bytes"] / cpu_s / 1e9 if cpu_s > 0 else 0))'
}

$TEBENCH target --protocol tcp --buffer-size 1G --local-hostname 127.0.0.1 >"$WORK/target.out" 2>/dev/null &
PIDS+=($!)
for _ in $(seq 100); do grep -q '^segment: ' "$WORK/target.out" && break; sleep 0.1; done
SEG=$(sed -n 's/^segment: //p' "$WORK/target.out")
[ -n "$SEG" ] || { echo "tebench target did not start" >&2; exit 1; }
TARGET_PID=${PIDS[-1]}
# CPU seconds the target process has used so far (user + system, all threads).
target_cpu() { awk -v hz="$(getconf CLK_TCK)" '{ sub(/^.*\) /, ""); printf "%.3f\n", ($12 + $13) / hz }' "/proc/$TARGET_PID/stat"; }
tebench_gbps() { # op block threads -> "<GB per wall second> <GB per CPU second of both ends>"
  local before after
  before=$(target_cpu)
  $TEBENCH initiator --segment "$SEG" --protocol tcp --operation "$1" --block-size "$2" \
    --batch-size 128 --threads "$3" --duration "$DUR" --report-interval 0 --json \
    --local-hostname 127.0.0.1 2>>"$WORK/initiator.err" | tail -n 1 >"$WORK/run.json"
  after=$(target_cpu)
  python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
cpu_s = r["cpu_s"] + float(sys.argv[3]) - float(sys.argv[2])
print("%.3f %.3f" % (r["gb_per_s"], r["bytes"] / cpu_s / 1e9 if cpu_s > 0 else 0))' "$WORK/run.json" "$before" "$after"
}

printf '%s, tcp loopback, batch 128, tcp lanes %s, iperf3 -P %s, %s s per measurement, %s pairs per row\n' \
  "$(date -u '+%F %H:%M UTC')" "$LANES" "$STREAMS" "$DUR" "$PAIRS"
pairs_load start
echo
pairs_header "op|block|threads" "tebench GB/s" "iperf3 GB/s" --metric "CPU,tebench GB/CPU-s,iperf3 GB/CPU-s"
pairs_grid ">= 0.90" tebench_gbps iperf_gbps # iperf3's run takes no arguments: it ignores them
echo
# Mooncake's TCP transport, measured on this kind of machine (target: tebench >= 2x).
python3 - "$CSV" <<'PY'
import csv, sys
mooncake = {("read", "64K"): 0.54, ("read", "1M"): 1.30, ("read", "16M"): 1.03,
            ("write", "64K"): 0.59, ("write", "1M"): 1.33, ("write", "16M"): 1.28}
print("| op | block | threads | tebench GB/s (median) | Mooncake GB/s | vs Mooncake (target >= 2x) |")
print("|---|---|---|---|---|---|")
for r in csv.DictReader(open(sys.argv[1])):
    m = mooncake.get((r["op"], r["block"]))
    if m:
        print("| %s | %s | %s | %.2f | %.2f | %.1fx |" % (r["op"], r["block"], r["threads"], float(r["ours"]), m, float(r["ours"]) / m))
PY
echo
pairs_load end
