#!/usr/bin/env bash
# Runs where an rxe (soft-RoCE) device exists: inside the VM of ci/rdma-vm.sh, or on a CI
# runner that loaded rdma_rxe. Usage: ci/rdma-in-vm.sh RDMA_TEST_BINARY TEBENCH
# RXE_VM_DEV (default rxe0) names the device; RXE_VM_GID_INDEX the GID index (default: auto).
# A second device rxe1 on a dummy netdev crescent1 is added for the two-device test
# (RXE_VM_DEV2 / RXE_VM_NETDEV2 name an existing one instead).
set -euo pipefail
test_bin=$1
tebench=$2
dev=${RXE_VM_DEV:-rxe0}
export RXE_VM=${RXE_VM:-1}
gid_args=()
[ -n "${RXE_VM_GID_INDEX:-}" ] && gid_args=(--gid-index "$RXE_VM_GID_INDEX")
log() { printf '\n==> %s\n' "$*" >&2; }

# A second soft-RoCE device on its own dummy netdev, for the two-device test (it takes that
# netdev down and up again). Needs root, as the VM and the GitHub runner (sudo) give.
if [ -z "${RXE_VM_DEV2:-}" ]; then
  if [ -e /sys/class/infiniband/rxe1 ] && [ -e /sys/class/net/crescent1 ]; then
    export RXE_VM_DEV2=rxe1 RXE_VM_NETDEV2=crescent1
  elif ip link add crescent1 type dummy && ip addr add 203.0.113.1/24 dev crescent1 &&
    ip link set crescent1 up && rdma link add rxe1 type rxe netdev crescent1; then
    export RXE_VM_DEV2=rxe1 RXE_VM_NETDEV2=crescent1
  else
    log "could not add a second rxe device: the two-device test will skip"
  fi
fi

log "rdma integration tests on $dev${RXE_VM_DEV2:+ (and $RXE_VM_DEV2)}"
"$test_bin" --test-threads=1

log "tebench --protocol rdma: target and initiator on $dev"
work=$(mktemp -d)
"$tebench" target --protocol rdma --device-name "$dev" "${gid_args[@]}" --buffer-size 16M \
  --pattern --local-hostname 127.0.0.1 >"$work/target.out" &
target=$!
trap 'kill $target 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 300); do
  grep -q '^segment: ' "$work/target.out" && break
  kill -0 $target 2>/dev/null || { echo "tebench target exited" >&2; exit 1; }
  sleep 0.2
done
segment=$(sed -n 's/^segment: //p' "$work/target.out")
[ -n "$segment" ] || { echo "tebench target printed no segment name" >&2; exit 1; }
for op in read write; do
  "$tebench" initiator --protocol rdma --device-name "$dev" "${gid_args[@]}" --segment "$segment" \
    --operation "$op" --block-size 64K --batch-size 16 --duration 2 --report-interval 0 \
    --verify --local-hostname 127.0.0.1
done
log "rdma suite passed"
