#!/usr/bin/env bash
# tebench --protocol tcp vs iperf3 on the same path (loopback), measured in one run.
#
#   benches/tcp-vs-iperf3.sh [seconds per measurement, default 5]
#
# Prints one row per (operation, block size, threads): tebench's GB/s, iperf3's GB/s over
# the same loopback path with as many streams as tebench uses lanes (2 by default) and with
# one stream, the ratio to the better iperf3 figure (target >= 0.85), and the ratio to
# Mooncake's TCP transport figures measured on this kind of machine (target >= 2x).
set -euo pipefail
cd "$(dirname "$0")/.."
DUR="${1:-5}"
command -v iperf3 >/dev/null || { echo "iperf3 is missing: apt-get install iperf3" >&2; exit 1; }
echo "building tebench (release)..." >&2
cargo build --release -q -p crescent-benches --bin tebench
TEBENCH=target/release/tebench
LANES="${MC_TCP_LANES:-2}"

PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

port=$((20000 + RANDOM % 20000))
iperf3 -s -p "$port" >/dev/null 2>&1 &
PIDS+=($!)
sleep 0.5
iperf_gbps() { # streams
  iperf3 -c 127.0.0.1 -p "$port" -t "$DUR" -P "$1" -J 2>/dev/null |
    python3 -c 'import json,sys; print("%.2f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/8e9))'
}
echo "iperf3 ($DUR s each)..." >&2
IPERF1=$(iperf_gbps 1)
IPERFN=$(iperf_gbps "$LANES")
IPERF=$(python3 -c "print(max($IPERF1, $IPERFN))")

out=$(mktemp)
$TEBENCH target --protocol tcp --buffer-size 1G --local-hostname 127.0.0.1 >"$out" 2>/dev/null &
PIDS+=($!)
for _ in $(seq 100); do grep -q '^segment: ' "$out" && break; sleep 0.1; done
SEG=$(sed -n 's/^segment: //p' "$out")
[ -n "$SEG" ] || { echo "tebench target did not start" >&2; exit 1; }

declare -A MOONCAKE=([read/64K]=0.54 [read/1M]=1.30 [read/16M]=1.03 [write/64K]=0.59 [write/1M]=1.33 [write/16M]=1.28)
printf '\n%s, loopback, batch 128, %s s per row, tcp lanes %s\n' "$(date -u +%F)" "$DUR" "$LANES"
printf 'iperf3: %s GB/s with 1 stream, %s GB/s with %s streams\n\n' "$IPERF1" "$IPERFN" "$LANES"
printf '| op | block | threads | tebench GB/s | iperf3 GB/s | ratio to iperf3 | Mooncake GB/s | vs Mooncake |\n'
printf '|---|---|---|---|---|---|---|---|\n'
for op in read write; do
  for bs in 64K 1M 16M; do
    for th in 1 2; do
      json=$($TEBENCH initiator --segment "$SEG" --protocol tcp --operation "$op" --block-size "$bs" \
        --batch-size 128 --threads "$th" --duration "$DUR" --report-interval 0 --json \
        --local-hostname 127.0.0.1 2>/dev/null | tail -n 1)
      gbps=$(printf '%s' "$json" | python3 -c 'import json,sys; print("%.2f" % json.load(sys.stdin)["gb_per_s"])')
      mc=${MOONCAKE[$op/$bs]}
      printf '| %s | %s | %s | %s | %s | %s | %s | %sx |\n' "$op" "$bs" "$th" "$gbps" "$IPERF" \
        "$(python3 -c "print('%.2f' % ($gbps / $IPERF))")" "$mc" "$(python3 -c "print('%.1f' % ($gbps / $mc))")"
    done
  done
done
