#!/usr/bin/env bash
# The test command: installs what the tests need, then runs every test suite.
# Usage: ci/test.sh        (CI runs it through .ci/run with CI=true)
set -euo pipefail
cd "$(dirname "$0")/.."
. ci/lib.sh
. ci/services.sh
. ci/ffi.sh
. ci/docs.sh

ci_apt_install "${CI_BASE_PACKAGES[@]}" "${CI_SERVICE_PACKAGES[@]}"
ci_ensure_rust

# A clean CI build keeps its target dir small: no incremental caches, and line tables rather
# than full debug info (backtraces keep file:line). A full-debuginfo build of every test binary,
# the wheel and the rdma binary filled a CI disk once (the linker died with SIGBUS).
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
export CARGO_PROFILE_DEV_DEBUG="${CARGO_PROFILE_DEV_DEBUG:-line-tables-only}"

ci_log "formatting and lints"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# The fuzz crate has a lockfile of its own (it is not a workspace member): a new dependency of a
# crate it builds must be locked there too, or the fuzz step, last, fails on --locked.
(cd fuzz && cargo metadata --locked --format-version 1 >/dev/null)
ci_docs
bash ci/k8s-validate.sh

trap ci_stop_services EXIT
ci_start_services

ci_log "building every binary (the multi-process, C and Python tests run them)"
cargo build --workspace --locked

ci_log "unit, integration and multi-process tests (two hosts in network namespaces need root)"
# Here the tests have what they need (root for the namespaces, etcd and redis): a test that
# would skip fails instead, so nothing passes untested.
if [ "$(id -u)" -eq 0 ]; then export CRESCENT_NO_SKIP=1; fi
cargo test --workspace --locked

TARGET_DIR="${CARGO_TARGET_DIR:-target}"

# The soak's short form: 3 minutes of mixed calls across client processes under scheduled
# faults; it fails when an acknowledged key is lost, a read is torn or a process's RSS grows
# past 10 % (stale reads are reported, not failed: docs/src/testing.md, the soak).
# It needs root (a network namespace, nftables, a tmpfs), as the namespace tests do;
# CRESCENT_CI_SOAK=0 skips it.
if [ "${CRESCENT_CI_SOAK:-1}" = 0 ]; then
  ci_log "soak skipped (CRESCENT_CI_SOAK=0)"
elif [ "$(id -u)" -eq 0 ]; then
  ci_log "soak, short form: 3 minutes of mixed calls across client processes under scheduled faults"
  "$TARGET_DIR/debug/storebench" soak --minutes 3 --out "$TARGET_DIR/soak"
else
  ci_log "soak skipped: it needs root"
fi

ci_c_example "$TARGET_DIR/debug"
ci_c_te_test "$TARGET_DIR/debug"
ci_c_te_device_test "$TARGET_DIR/debug"
ci_python_env
ci_python_wheel debug
ci_pytest "$TARGET_DIR/debug"

ci_log "disk left after the tests: $(df -h --output=avail . | tail -1 | tr -d ' ')"
ci_log "rdma on real verbs: the rdma tests and tebench in a soft-RoCE VM"
bash ci/rdma-vm.sh

ci_log "the image: deploy/Containerfile's runtime stage over these binaries, a master and two clients as containers"
bash ci/image.sh "$TARGET_DIR/debug" ci/.work/wheels

# Last: its instrumented release build is the longest step, and needs disk of its own.
ci_log "coverage-guided fuzzing, short form: each target from its committed corpus for a few seconds"
# The instrumented release build is most of this step; the long runs are in docs/src/testing.md.
bash ci/fuzz.sh "${CRESCENT_FUZZ_SECONDS:-5}"

ci_log "all test suites passed"
