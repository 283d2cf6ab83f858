#!/usr/bin/env bash
# The main job, from a fresh Debian 12 machine: installs what is needed, builds Crescent
# (release), and runs it on the embedded defaults (P2P handshake, no external service):
# `crescent demo` (a master and two clients: puts on one, verified gets on the other), then a
# tebench target and a tebench initiator that read and write verified data on loopback.
set -euo pipefail
cd "$(dirname "$0")/.."
. ci/lib.sh
. ci/ffi.sh

ci_apt_install "${CI_BASE_PACKAGES[@]}"
ci_ensure_rust

ci_log "building (release)"
cargo build --release --workspace --locked
BIN="${CARGO_TARGET_DIR:-target}/release"

# The tools' logs (at info unless RUST_LOG says otherwise) go to a file: the terminal shows the
# demo's own lines; a step that fails prints its cause, the log's last lines and where it is.
DEMO_LOG=$(mktemp /tmp/crescent-demo.XXXXXX.log)
step() {
  local what=$1
  shift
  if ! RUST_LOG="${RUST_LOG:-info}" "$@" 2>>"$DEMO_LOG"; then
    echo "demo: failed: $what; its last log lines:" >&2
    tail -n 15 "$DEMO_LOG" >&2
    echo "demo: the full log is $DEMO_LOG" >&2
    exit 1
  fi
}

ci_log "crescent demo: a master and two clients on this machine"
step "crescent demo" "$BIN/crescent" demo

PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

ci_log "tebench: a target serving 256 MiB on loopback"
out=$(mktemp)
RUST_LOG="${RUST_LOG:-info}" "$BIN/tebench" target --buffer-size 256M --pattern --local-hostname 127.0.0.1 \
  >"$out" 2>>"$DEMO_LOG" &
PIDS+=($!)
for _ in $(seq 300); do grep -q '^segment: ' "$out" && break; sleep 0.1; done
SEG=$(sed -n 's/^segment: //p' "$out")
[ -n "$SEG" ] || { echo "demo: the tebench target did not start; the full log is $DEMO_LOG" >&2; exit 1; }
echo "target segment: $SEG"

for op in read write; do
  ci_log "tebench: initiator $op, 64 KiB blocks, batch 128, 2 threads, 3 s, data verified"
  step "tebench initiator $op" "$BIN/tebench" initiator --segment "$SEG" --operation "$op" --block-size 64K \
    --batch-size 128 --threads 2 --duration 3 --verify --local-hostname 127.0.0.1
done
ci_log "tebench: initiator read, 1 MiB blocks, 3 s (throughput, not verified)"
step "tebench initiator read 1 MiB" "$BIN/tebench" initiator --segment "$SEG" --operation read --block-size 1M \
  --batch-size 128 --threads 1 --duration 3 --local-hostname 127.0.0.1

ci_python_env
ci_python_wheel release
ci_log "Python: batch_get_into of 10 MiB values through the crescent package vs from Rust"
step "Python batch_get_into" "$CI_VENV/bin/python" benches/ffi-batch-get.py --bin-dir "$BIN" --repeats 1 --rounds 20

ci_log "demo finished (the tools' logs: $DEMO_LOG)"
