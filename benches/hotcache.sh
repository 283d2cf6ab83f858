#!/usr/bin/env bash
# The client's local hot cache between two hosts (network namespaces), in one run:
#
#   benches/hotcache.sh [hot-cache|replay|all] [--pairs N] [--pin] [--link shaped|unshaped|both]
#                       [--fill auto|inline|deferred] [-- STOREBENCH-HOT-CACHE-ARGS...]
#   (default: all, 5 pairs, both links, auto fills (the client's default); BIN_DIR=DIR runs DIR's binaries instead
#   of building)
#
# Host A runs crescent-master and a holder client (crescent client, 2 GiB segment) that holds
# every object; host B runs storebench, whose readers fetch them over tcp. The reference table
# (storebench hot-cache) runs twice: on the veth shaped to 2.5 Gbit/s with tc tbf (what the
# reference's TCP path delivered), then unshaped. storebench replay runs on the shaped link.
# iperf3 measures each link state in the same run. In hot-cache, every row's first round with
# the cache is held against the first round without it in --pairs pairs of fresh readers
# (storebench hot-cache --pairs; target <= 1.10x); the load average is printed at start and end.
# --pin gives each host a core of its own (A's processes on CPU 0, B's on CPU 1, iperf3 too),
# as two machines have, instead of both sharing the two cores.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "hotcache.sh needs root (network namespaces)" >&2; exit 1; }
WHAT=all PAIRS=5 PIN= LINK=both FILL=auto EXTRA=()
while [ $# -gt 0 ]; do
  case $1 in
    --pairs) PAIRS=$2; shift 2 ;;
    --pin) PIN=1; shift ;;
    --link) LINK=$2; shift 2 ;;
    --fill) FILL=$2; shift 2 ;;
    hot-cache|replay|all) WHAT=$1; shift ;;
    --) shift; EXTRA=("$@"); break ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
. benches/lib-netns.sh
bench_hosts_up crescent-store crescent-benches
VETH_B="cb$$b"

bench_store_up
ON_A=() ON_B=()
if [ -n "$PIN" ]; then
  [ "$(nproc)" -ge 2 ] || { echo "--pin needs two CPUs" >&2; exit 1; }
  # Threads inherit their creator's CPUs, so pinning every thread now pins the later ones too.
  for p in "${PIDS[@]}"; do taskset -a -p -c 0 "$p" >/dev/null; done
  ON_A=(taskset -c 0) ON_B=(taskset -c 1)
  echo "pinned: host A (master, holder) on CPU 0, host B (storebench) on CPU 1"
fi

shape() { # on|off
  for pair in "$NS_A $VETH_A" "$NS_B $VETH_B"; do
    set -- $pair
    ip netns exec "$1" tc qdisc del dev "$2" root 2>/dev/null || true
    if [ "$SHAPE" = on ]; then
      ip netns exec "$1" tc qdisc add dev "$2" root tbf rate 2.5gbit burst 1mb latency 100ms
    fi
  done
}
iperf() {
  if command -v iperf3 >/dev/null; then
    ip netns exec "$NS_A" "${ON_A[@]}" iperf3 -s -1 -B "$ADDR_A" >/dev/null 2>&1 &
    sleep 0.3
    ip netns exec "$NS_B" "${ON_B[@]}" iperf3 -c "$ADDR_A" -R -t 2 -f g 2>/dev/null | awk '/receiver/ {print "iperf3 A->B: " $(NF-2) " " $(NF-1)}'
  fi
}
run() { # label, storebench args
  local label=$1; shift
  echo "$(date -u +%F), $label: $(iperf)"
  echo
  ip netns exec "$NS_B" "${ON_B[@]}" "$BIN/storebench" "$@" --master "$MASTER" --local-hostname "$ADDR_B" --label "$label"
}

if [ "$WHAT" = all ] || [ "$WHAT" = hot-cache ]; then
  case $LINK in shaped|unshaped|both) ;; *) echo "--link shaped, unshaped or both" >&2; exit 2 ;; esac
  if [ "$LINK" != unshaped ]; then SHAPE=on shape; run "veth shaped to 2.5 Gbit/s (tc tbf)" hot-cache --pairs "$PAIRS" --fill "$FILL" "${EXTRA[@]}"; fi
  if [ "$LINK" != shaped ]; then SHAPE=off shape; run "veth unshaped" hot-cache --pairs "$PAIRS" --fill "$FILL" "${EXTRA[@]}"; fi
fi
if [ "$WHAT" = all ] || [ "$WHAT" = replay ]; then
  SHAPE=on shape; run "veth shaped to 2.5 Gbit/s (tc tbf)" replay
fi
