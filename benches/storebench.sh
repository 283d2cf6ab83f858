#!/usr/bin/env bash
# storebench between two hosts (network namespaces), beside a real redis-server and iperf3 on
# the same link, in alternating pairs.
#
#   benches/storebench.sh [--pairs N] [--csv FILE] [storebench flags, e.g. --sizes 1M,10M,25M --bytes-per-row 512M]
#
# Host A runs crescent-master, a holder client (crescent client, 2 GiB segment) and
# redis-server; host B runs storebench as client B (its puts land in A's memory, its gets
# cross the veth link) and talks to redis-server on A over the same link. Each pair (--pairs,
# default 5) measures the link A->B with iperf3 (the better of 1 and 2 streams of 1 MiB
# writes) and runs storebench once (its figures beside Redis's, measured call by call in the
# same run), the link first in odd pairs and storebench first in even ones. The tables give
# medians over the pairs: every row as a share of the link, store beside Redis, and the byte
# get beside get_into (target >= 0.85); the load average is printed at start and end. The last
# pair's storebench prints its own tables and the metadata rate.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "storebench.sh needs root (network namespaces)" >&2; exit 1; }
command -v redis-server >/dev/null || { echo "redis-server is missing: apt-get install redis-server" >&2; exit 1; }
command -v iperf3 >/dev/null || { echo "iperf3 is missing: apt-get install iperf3" >&2; exit 1; }
PAIRS=5 CSV=${CSV:-}
ARGS=()
while [ $# -gt 0 ]; do
  case $1 in
    --pairs) PAIRS=$2; shift 2 ;;
    --csv) CSV=$2; shift 2 ;;
    *) ARGS+=("$1"); shift ;;
  esac
done
. benches/lib-netns.sh
. benches/lib-pairs.sh
bench_hosts_up crescent-store crescent-benches

ip netns exec "$NS_A" redis-server --bind "$ADDR_A" --port 6390 --save "" --appendonly no \
  --protected-mode no --logfile "$WORK/redis.log" &
PIDS+=($!)
bench_store_up
for _ in $(seq 50); do ip netns exec "$NS_B" redis-cli -h "$ADDR_A" -p 6390 ping >/dev/null 2>&1 && break; sleep 0.1; done

# What any tcp client moves A->B here: iperf3, the better of 1 and 2 streams of 1 MiB writes.
link_mib_s() {
  local best=0 p v
  for p in "-P 1" "-P 2"; do
    # (bounded: a server whose client never came would hold the run forever)
    ip netns exec "$NS_A" timeout 15 iperf3 -s -1 -B "$ADDR_A" -p 5399 >/dev/null 2>&1 &
    local server=$!
    sleep 0.3
    v=$(ip netns exec "$NS_B" iperf3 -c "$ADDR_A" -p 5399 -R $p -l 1M -t 2 -J 2>/dev/null |
      python3 -c 'import json,sys; print(int(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/8/2**20))' 2>/dev/null || echo 0)
    [ "$v" -gt "$best" ] && best=$v
    wait "$server" 2>/dev/null || true
  done
  echo "$best"
}
store_run() { # pair
  local meta=(--meta-keys 0)
  # Only the last pair measures the metadata rate, unless the caller set --meta-keys itself.
  { [ "$1" -eq "$PAIRS" ] || [[ " ${ARGS[*]} " == *" --meta-keys "* ]]; } && meta=()
  ip netns exec "$NS_B" "$BIN/storebench" --master "$MASTER" --local-hostname "$ADDR_B" --redis "$ADDR_A:6390" \
    --link-mib-s "$2" --json "$WORK/store.$1.json" "${meta[@]}" "${ARGS[@]}" >"$WORK/store.$1.out"
}

printf '%s, storebench: store (tcp over a veth between two network namespaces) vs redis-server and iperf3 on the same path, %s pairs\n' \
  "$(date -u '+%F %H:%M UTC')" "$PAIRS"
pairs_load start
: >"$WORK/links"
for i in $(seq 1 "$PAIRS"); do
  if [ $((i % 2)) -eq 1 ]; then
    link=$(link_mib_s); store_run "$i" "$link"
  else
    store_run "$i" 0; link=$(link_mib_s)
  fi
  echo "$link" >>"$WORK/links"
  echo "  pair $i of $PAIRS: link $link MiB/s" >&2
done

# Per (op, value): one pairs file each for store/link, store/redis and (gets) get/get_into.
python3 - "$WORK" "$PAIRS" <<'PY'
import json, os, sys
work, pairs = sys.argv[1], int(sys.argv[2])
links = [float(l) for l in open(os.path.join(work, "links"))]
rows, order = {}, []
for i in range(1, pairs + 1):
    for line in open(os.path.join(work, f"store.{i}.json")):
        r = json.loads(line)
        k = (r["op"], r["value"])
        if k not in rows:
            rows[k] = []
            order.append(k)
        rows[k].append((r, links[i - 1]))
def name(op, value):
    return op.replace(" ", "_").replace("(", "").replace(")", "") + "." + value.replace(" ", "")
with open(os.path.join(work, "order"), "w") as o:
    for op, value in order:
        n = name(op, value)
        o.write(f"{op}|{value}\t{n}\n")
        with open(os.path.join(work, f"link.{n}"), "w") as f:
            for r, link in rows[(op, value)]:
                f.write(f"{r['store_mib_s']:.1f} {link:.1f}\n")
        with open(os.path.join(work, f"redis.{n}"), "w") as f:
            for r, _ in rows[(op, value)]:
                f.write(f"{r['store_mib_s']:.1f} {r['redis_mib_s']:.1f}\n")
        if op == "get":
            into = rows.get(("get_into (zero copy)", value), [])
            with open(os.path.join(work, f"bytes.{n}"), "w") as f:
                for (g, _), (z, _) in zip(rows[(op, value)], into):
                    f.write(f"{g['store_mib_s']:.1f} {z['store_mib_s']:.1f}\n")
PY
echo
echo "Store figures as a share of the link (iperf3 in the same pair), medians of $PAIRS pairs:"
echo
pairs_header "op|value" "store MiB/s" "link MiB/s"
while IFS=$'\t' read -r labels n; do
  python3 "$PAIRS_PY" row "$labels" "$WORK/link.$n" --target "-" ${CSV:+--csv "$CSV"} --columns "op|value"
done <"$WORK/order"
echo
echo "Store beside Redis (measured call by call in the same runs):"
echo
pairs_header "op|value" "store MiB/s" "redis MiB/s"
while IFS=$'\t' read -r labels n; do
  python3 "$PAIRS_PY" row "$labels" "$WORK/redis.$n" --target "-"
done <"$WORK/order"
echo
echo "Byte get (a fresh buffer per call) beside get_into (registered memory), same runs:"
echo
pairs_header "op|value" "get MiB/s" "get_into MiB/s"
while IFS=$'\t' read -r labels n; do
  [ -f "$WORK/bytes.$n" ] || continue
  python3 "$PAIRS_PY" row "get / get_into|${labels#*|}" "$WORK/bytes.$n" --target ">= 0.85"
done <"$WORK/order"
echo
echo "The last pair's run (pair $PAIRS), as storebench prints it:"
echo
cat "$WORK/store.$PAIRS.out"
pairs_load end
