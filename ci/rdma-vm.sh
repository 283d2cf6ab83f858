#!/usr/bin/env bash
# Runs the RDMA suite on real verbs: builds the rdma test binary and tebench here (debug),
# then runs ci/rdma-in-vm.sh in ONE soft-RoCE VM (../shared/rxe-vm/run-in-rxe-vm.sh, the same
# beside a local origin, or $RXE_VM_SCRIPT). Without the VM script this fails, unless CRESCENT_SKIP_RDMA_VM=1.
set -euo pipefail
cd "$(dirname "$0")/.."
. ci/lib.sh

# A clone made elsewhere (a temporary directory) finds it beside the repository it was cloned
# from, when that is a local path.
vm="${RXE_VM_SCRIPT:-../shared/rxe-vm/run-in-rxe-vm.sh}"
if [ -z "${RXE_VM_SCRIPT:-}" ] && [ ! -x "$vm" ]; then
  origin=$(git config --get remote.origin.url 2>/dev/null || true)
  if [ -n "$origin" ] && [ -d "$origin" ] && [ -x "$origin/../shared/rxe-vm/run-in-rxe-vm.sh" ]; then
    vm="$origin/../shared/rxe-vm/run-in-rxe-vm.sh"
  fi
fi
if [ ! -x "$vm" ]; then
  if [ "${CRESCENT_SKIP_RDMA_VM:-0}" = 1 ]; then
    ci_log "rdma: skipped (no VM script at $vm, CRESCENT_SKIP_RDMA_VM=1)"
    exit 0
  fi
  echo "rdma: the soft-RoCE VM script $vm is missing; set RXE_VM_SCRIPT, or CRESCENT_SKIP_RDMA_VM=1 to skip" >&2
  exit 1
fi

ci_log "rdma: building the test binary and tebench"
# --workspace: the same feature set as ci/test.sh's build, so nothing is compiled twice.
cargo build --workspace --locked --bin tebench
test_bin=$(ci_rdma_test_bin) || { echo "rdma: building the rdma test binary failed" >&2; exit 1; }
[ -x "$test_bin" ] || { echo "rdma: test binary not found" >&2; exit 1; }

ci_log "rdma: tests and a tebench run inside the soft-RoCE VM"
"$vm" --timeout "${RDMA_VM_TIMEOUT:-1500}" -- ci/rdma-in-vm.sh "$test_bin" target/debug/tebench
