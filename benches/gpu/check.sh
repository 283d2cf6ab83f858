#!/usr/bin/env bash
# Device memory on a real GPU: run on a host with an NVIDIA GPU and its driver (libcuda.so.1).
#
#   benches/gpu/check.sh [--sizes 1M,16M] [--seconds 3] [--device 0]
#
# 1. builds the workspace's device tests and gpubench (release: the figures are measured);
# 2. runs the device tests (tests/tests/device_memory.rs). They use the fake driver the tests
#    build, not this GPU: they must pass here as everywhere;
# 3. runs gpubench on the real driver: each scenario is checked byte for byte first, then
#    measured: GPU<->GPU over tcp loopback beside host<->host tcp, and over CUDA IPC between
#    two processes beside the driver's own DtoD; the driver's DtoH/HtoD/DtoD for each size.
#
# Output: the card (nvidia-smi), the driver's version, every figure as a line and a JSON
# line; everything is also written to benches/results/gpu-<date>.txt. Exits non-zero if a
# test fails or a transfer's bytes differ. Nothing here is run without a GPU: it says so and
# exits 2.
set -euo pipefail
cd "$(dirname "$0")/../.."

SIZES=1M,16M
SECONDS_PER_FIGURE=3
DEVICE=0
while [ $# -gt 0 ]; do
    case "$1" in
        --sizes) SIZES="$2"; shift 2 ;;
        --seconds) SECONDS_PER_FIGURE="$2"; shift 2 ;;
        --device) DEVICE="$2"; shift 2 ;;
        *) echo "unknown argument $1" >&2; exit 64 ;;
    esac
done

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "check.sh: no NVIDIA GPU here (nvidia-smi -L fails); nothing measured" >&2
    exit 2
fi
if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1'; then
    echo "check.sh: libcuda.so.1 is not in the loader's cache; set CRESCENT_CUDA_DRIVER to its path" >&2
    [ -n "${CRESCENT_CUDA_DRIVER:-}" ] || exit 2
fi

mkdir -p benches/results
out="benches/results/gpu-$(date -u +%Y%m%d-%H%M%S).txt"
exec > >(tee "$out") 2>&1

echo "# $(date -u +%FT%TZ) $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.current,pcie.link.width.current \
    --format=csv,noheader | sed 's/^/# gpu: /'
echo "# cpus: $(nproc), kernel $(uname -r)"

echo "## building"
cargo build --release -p crescent-benches --bin gpubench
cargo test --release -p crescent-tests --test device_memory --no-run

echo "## device tests (fake driver)"
cargo test --release -p crescent-tests --test device_memory

echo "## gpubench (real driver)"
# The real driver: CRESCENT_CUDA_DRIVER only if the caller set it.
target_dir="${CARGO_TARGET_DIR:-target}"
"$target_dir/release/gpubench" run --device "$DEVICE" --sizes "$SIZES" --seconds "$SECONDS_PER_FIGURE"

echo "# written to $out"
