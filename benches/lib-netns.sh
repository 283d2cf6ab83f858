# Two hosts on one machine for the benchmark scripts (sourced): network namespaces A and B
# joined by a veth pair, 198.18.<n>.1 and 198.18.<n>.2 (the benchmarking range). Needs root.
# Defines NS_A NS_B ADDR_A ADDR_B VETH_A and bench_netns_up / bench_netns_down, and
# bench_hosts_up, which a script calls first: it builds, makes BIN, WORK and PIDS, and brings
# the hosts up, to be taken down at exit.

bench_netns_up() {
  local n=$((RANDOM % 200 + 20))
  NS_A="crsc-bench-a-$$"; NS_B="crsc-bench-b-$$"
  ADDR_A="198.18.$n.1"; ADDR_B="198.18.$n.2"
  VETH_A="cb$$a"; local veth_b="cb$$b"
  ip netns add "$NS_A"; ip netns add "$NS_B"
  ip link add "$VETH_A" type veth peer name "$veth_b"
  ip link set "$VETH_A" netns "$NS_A"; ip link set "$veth_b" netns "$NS_B"
  ip -n "$NS_A" addr add "$ADDR_A/24" dev "$VETH_A"; ip -n "$NS_B" addr add "$ADDR_B/24" dev "$veth_b"
  for ns in "$NS_A" "$NS_B"; do ip -n "$ns" link set lo up; done
  ip -n "$NS_A" link set "$VETH_A" up; ip -n "$NS_B" link set "$veth_b" up
}

bench_netns_down() {
  ip netns del "$NS_A" 2>/dev/null || true
  ip netns del "$NS_B" 2>/dev/null || true
}

# Builds the release binaries of the packages named (or, with BIN_DIR=DIR set, takes DIR's as
# they are), sets BIN (where they are), WORK (a scratch
# directory) and PIDS (what the script starts, stopped at exit) and brings the two hosts up;
# at exit the processes are stopped, the hosts taken down and WORK removed.
bench_hosts_up() { # package...
  if [ -n "${BIN_DIR:-}" ]; then
    # A build kept aside (to compare two builds on the same machine state): used as it is.
    BIN=$(cd "$BIN_DIR" && pwd)
    echo "binaries from $BIN (not built)" >&2
  else
    echo "building (release)..." >&2
    local pkg args=()
    for pkg in "$@"; do args+=(-p "$pkg"); done
    cargo build --release -q "${args[@]}"
    BIN=${CARGO_TARGET_DIR:-$PWD/target}/release
  fi
  WORK=$(mktemp -d)
  PIDS=()
  trap bench_hosts_down EXIT
  bench_netns_up
}

bench_hosts_down() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  sleep 0.2
  bench_netns_down
  rm -rf "$WORK"
}

# Waits until FILE has a line starting with PREFIX and prints the rest of it.
wait_line() { # file prefix
  for _ in $(seq 600); do
    if grep -q "^$2" "$1" 2>/dev/null; then sed -n "s/^$2//p" "$1" | head -n 1; return 0; fi
    sleep 0.1
  done
  echo "timed out waiting for '$2' in $1" >&2; return 1
}

# Starts crescent-master and a holder client (`crescent client` with a 2 GiB segment) on host A
# and sets MASTER. Uses the caller's BIN, WORK and PIDS; keeps the holder's stdin open on fd 9.
bench_store_up() {
  ip netns exec "$NS_A" "$BIN/crescent-master" --rpc-address "$ADDR_A:0" --admin-address "" \
    >"$WORK/master.out" 2>"$WORK/master.err" &
  PIDS+=($!)
  MASTER=$(wait_line "$WORK/master.out" "master: ")
  mkfifo "$WORK/holder.in"
  ip netns exec "$NS_A" "$BIN/crescent" client --master "$MASTER" --local-hostname "$ADDR_A" \
    --segment-size 2G --buffer-size 16M <"$WORK/holder.in" >"$WORK/holder.out" 2>"$WORK/holder.err" &
  PIDS+=($!)
  exec 9>"$WORK/holder.in"
  wait_line "$WORK/holder.out" "ready " >/dev/null
}
