#!/usr/bin/env bash
# The fault-injection suite (issue 24): tests/tests/faults_{tcp,shm,store}.rs and the master's
# connection flood (tests/tests/master_flood.rs); `cargo test --workspace` runs them once.
# The rdma cases are in tests/tests/rdma.rs and run in the soft-RoCE VM (ci/rdma-vm.sh).
#
# Usage: ci/faults.sh          each fault once, as CI does
#        ci/faults.sh --long   each fault 5 times (CRESCENT_FAULT_ROUNDS to choose)
# Needs root (network namespaces, nftables, tc, prlimit) and the workspace's binaries built.
set -euo pipefail
cd "$(dirname "$0")/.."
. ci/lib.sh
ci_ensure_rust

if [ "${1:-}" = "--long" ]; then export CRESCENT_FAULT_ROUNDS="${CRESCENT_FAULT_ROUNDS:-5}"; fi
if [ "$(id -u)" -eq 0 ]; then export CRESCENT_NO_SKIP=1; fi
cargo build --workspace --locked
cargo test --locked -p crescent-tests --test faults_tcp --test faults_shm --test faults_store --test master_flood
