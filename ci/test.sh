#!/usr/bin/env bash
# The test command: installs what the tests need, then runs every test suite.
# Usage: ci/test.sh        (CI runs it through .ci/run with CI=true)
set -euo pipefail
cd "$(dirname "$0")/.."
. ci/lib.sh
. ci/services.sh

ci_apt_install "${CI_BASE_PACKAGES[@]}" "${CI_SERVICE_PACKAGES[@]}"
ci_ensure_rust

ci_log "formatting and lints"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings

trap ci_stop_services EXIT
ci_start_services

ci_log "unit, integration and multi-process tests (two hosts in network namespaces need root)"
cargo test --workspace --locked

ci_log "rdma on real verbs: the rdma tests and tebench in a soft-RoCE VM"
bash ci/rdma-vm.sh

ci_log "all test suites passed"
