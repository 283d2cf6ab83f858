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

# The path's ceiling, measured the same way: the most bytes A->B that any tcp client moves here
# (iperf3: the best of 1 and 2 streams, 128 KiB and 1 MiB writes). Every row's store figure is
# also shown as a share of it.
link_mib_s() {
  local best=0 p v
  command -v iperf3 >/dev/null || { echo 0; return; }
  for p in "-P 1" "-P 2" "-P 1 -l 1M" "-P 2 -l 1M"; do
    ip netns exec "$NS_A" iperf3 -s -1 -B "$ADDR_A" -p 5399 >/dev/null 2>&1 &
    local server=$!
    sleep 0.3
    v=$(ip netns exec "$NS_B" iperf3 -c "$ADDR_A" -p 5399 -R $p -t 2 -J 2>/dev/null |
      python3 -c 'import json,sys; print(int(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/8/2**20))' 2>/dev/null || echo 0)
    [ "$v" -gt "$best" ] && best=$v
    wait "$server" 2>/dev/null || true
  done
  echo "$best"
}
LINK=$(link_mib_s)

printf '%s, storebench: store (tcp over a veth between two network namespaces) vs redis-server on the same path\n\n' "$(date -u +%F)"
ip netns exec "$NS_B" "$BIN/storebench" --master "$MASTER" --local-hostname "$ADDR_B" --redis "$ADDR_A:6390" --link-mib-s "$LINK" "$@"
