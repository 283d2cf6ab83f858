#!/usr/bin/env bash
# storebench between two hosts (network namespaces), beside a real redis-server, in one run.
#
#   benches/storebench.sh [storebench flags, e.g. --sizes 1M,10M,25M --bytes-per-row 512M]
#
# Host A runs crescent-master, a holder client (crescent client, 2 GiB segment) and
# redis-server; host B runs storebench as client B (its puts land in A's memory, its gets
# cross the veth link) and talks to redis-server on A over the same link.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "storebench.sh needs root (network namespaces)" >&2; exit 1; }
command -v redis-server >/dev/null || { echo "redis-server is missing: apt-get install redis-server" >&2; exit 1; }
. benches/lib-netns.sh
echo "building (release)..." >&2
cargo build --release -q -p crescent-store -p crescent-benches
BIN=$PWD/target/release
WORK=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; sleep 0.2; bench_netns_down; rm -rf "$WORK"; }
trap cleanup EXIT
bench_netns_up

ip netns exec "$NS_A" redis-server --bind "$ADDR_A" --port 6390 --save "" --appendonly no \
  --protected-mode no --logfile "$WORK/redis.log" &
PIDS+=($!)
bench_store_up
for _ in $(seq 50); do redis-cli -h "$ADDR_A" -p 6390 ping >/dev/null 2>&1 && break; ip netns exec "$NS_A" redis-cli -h "$ADDR_A" -p 6390 ping >/dev/null 2>&1 && break; sleep 0.1; done

printf '%s, storebench: store (tcp over a veth between two network namespaces) vs redis-server on the same path\n\n' "$(date -u +%F)"
ip netns exec "$NS_B" "$BIN/storebench" --master "$MASTER" --local-hostname "$ADDR_B" --redis "$ADDR_A:6390" "$@"
