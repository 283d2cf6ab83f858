#!/usr/bin/env bash
# Coverage-guided fuzzing (libFuzzer, through the libfuzzer-sys crate) of every parser of bytes
# from another process: the targets of fuzz/ (fuzz/src/lib.rs says what each covers).
#
# Usage: ci/fuzz.sh SECONDS [TARGET...]   each target for SECONDS (all targets when none named)
#        ci/fuzz.sh --runs N [TARGET...]  each target for N executions instead
#        ci/fuzz.sh --regress [TARGET...] only the committed corpora, as regression inputs
# Prints one line per target: executions, seconds, crashes; exits 1 if any target crashed.
#
# On the pinned stable toolchain, without cargo-fuzz (whose sanitizer flags need nightly): the
# coverage instrumentation (`-Cpasses=sancov-module` and LLVM's sanitizer-coverage options) is
# stable, libfuzzer-sys builds libFuzzer from source with the C++ compiler (build-essential),
# and the build uses `--target` so that build scripts and proc macros stay uninstrumented.
# No AddressSanitizer: safe Rust's bounds and overflow checks (on in this profile) are the
# oracle, plus each target's own assertions.
set -euo pipefail
cd "$(dirname "$0")/.."
. ci/lib.sh
ci_ensure_rust

mode=time; amount=""
case "${1:-}" in
  --runs) mode=runs; amount="${2:?--runs needs a count}"; shift 2 ;;
  --regress) mode=regress; shift ;;
  ''|-*) echo "usage: ci/fuzz.sh SECONDS|--runs N|--regress [TARGET...]" >&2; exit 2 ;;
  *) amount="$1"; shift ;;
esac

ALL_TARGETS=(tcp_frame shm_wire rdma_wire handshake rpc_frame disk_service descriptor_json master_request client_config
  master_config env_values)
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=("${ALL_TARGETS[@]}")

triple="$(rustc -vV | sed -n 's/^host: //p')"
# Absolute: the build runs in fuzz/, the binaries are run from here.
CARGO_TARGET_DIR="$(realpath -m "${FUZZ_TARGET_DIR:-${CARGO_TARGET_DIR:-target}/fuzz}")"
export CARGO_TARGET_DIR
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares -Cllvm-args=-sanitizer-coverage-stack-depth \
--cfg fuzzing ${FUZZ_RUSTFLAGS:-}"
ci_log "building the fuzz targets (instrumented, release)"
bins=()
for t in "${targets[@]}"; do bins+=(--bin "$t"); done
(cd fuzz && cargo build --locked --release --target "$triple" "${bins[@]}")

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
failed=0
printf '%-16s %12s %8s %8s %s\n' target execs seconds crashes corpus
for t in "${targets[@]}"; do
  bin="$CARGO_TARGET_DIR/$triple/release/$t"
  seeds="fuzz/corpus/$t"
  mkdir -p "$work/$t/corpus" "$work/$t/artifacts"
  [ -d "$seeds" ] && cp -r "$seeds/." "$work/$t/corpus/"
  args=(-artifact_prefix="$work/$t/artifacts/" -print_final_stats=1 -rss_limit_mb=2048 -timeout=10 -max_len=65536)
  case "$mode" in
    time) args+=(-max_total_time="$amount" "$work/$t/corpus") ;;
    runs) args+=(-runs="$amount" "$work/$t/corpus") ;;
    regress) args+=(-runs=0 "$work/$t/corpus") ;;
  esac
  start=$(date +%s.%N)
  set +e
  "$bin" "${args[@]}" >"$work/$t/log" 2>&1
  rc=$?
  set -e
  secs=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.0f", e - s }')
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/$t/log" | tail -1)
  crashes=$(find "$work/$t/artifacts" -type f | wc -l)
  if [ "$rc" -ne 0 ] && [ "$crashes" -eq 0 ]; then crashes=1; fi
  printf '%-16s %12s %8s %8s %s\n' "$t" "${execs:-?}" "$secs" "$crashes" "$(ls "$work/$t/corpus" | wc -l)"
  if [ "$crashes" -ne 0 ]; then
    failed=1
    tail -40 "$work/$t/log" >&2
    mkdir -p fuzz/artifacts/"$t"
    cp "$work/$t/artifacts/"* fuzz/artifacts/"$t"/ 2>/dev/null || true
  fi
done
[ "$failed" -eq 0 ] || { echo "crashes: inputs in fuzz/artifacts/" >&2; exit 1; }
