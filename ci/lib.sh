# Shared helpers of the ci/ scripts (sourced, not run).

ci_log() { printf '\n==> %s\n' "$*" >&2; }

# Installs Debian packages that are missing (root or sudo needed).
ci_apt_install() {
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  ci_log "installing ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# Makes sure cargo is there: the machine's rustup toolchain, or rustup from its installer.
ci_ensure_rust() {
  [ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
  if ! command -v cargo >/dev/null 2>&1; then
    ci_log "installing Rust with rustup (toolchain pinned by rust-toolchain.toml)"
    ci_apt_install curl ca-certificates
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal --default-toolchain none
    . "$HOME/.cargo/env"
  fi
}

# The packages every build and test needs.
CI_BASE_PACKAGES=(build-essential pkg-config iproute2 nftables iperf3 protobuf-compiler python3 python3-venv python3-dev
  libibverbs-dev)

# Builds the rdma integration test binary (crescent-tests, test `rdma`) without running it and
# prints its path. Compiler diagnostics go to stderr, and a failed build fails the caller.
ci_rdma_test_bin() {
  cargo test --workspace --locked --test rdma --no-run --message-format=json |
    python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-message" and m["message"].get("rendered"):
        sys.stderr.write(m["message"]["rendered"])
    elif m.get("reason") == "compiler-artifact" and m["target"]["name"] == "rdma" and m.get("executable"):
        print(m["executable"])'
}
