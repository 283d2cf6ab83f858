#!/usr/bin/env bash
# Device memory on a real GPU: run on a host with an NVIDIA GPU and its driver (libcuda.so.1).
#
#   benches/gpu/check.sh [--sizes 1M,16M] [--seconds 3] [--device 0] [--no-build]
#
# --no-build: use binaries built before (CARGO_TARGET_DIR, default target/): release
# gpubench, and the device_memory test binary if one is there (for a machine without the
# crates' sources or network; the test binary names the fake driver and device-peer by the
# absolute paths of its build, so build it at the same path).
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
BUILD=1
while [ $# -gt 0 ]; do
    case "$1" in
        --sizes) SIZES="$2"; shift 2 ;;
        --seconds) SECONDS_PER_FIGURE="$2"; shift 2 ;;
        --device) DEVICE="$2"; shift 2 ;;
        --no-build) BUILD=0; shift ;;
        *) echo "unknown argument $1" >&2; exit 64 ;;
    esac
done

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "check.sh: no NVIDIA GPU here (nvidia-smi -L fails); nothing measured" >&2
    exit 2
fi
if [ -z "${CRESCENT_CUDA_DRIVER:-}" ] && ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1'; then
    # Not fatal: the loader may still find it (LD_LIBRARY_PATH); gpubench says so if not.
    echo "check.sh: libcuda.so.1 is not in the loader's cache (set CRESCENT_CUDA_DRIVER to its path if loading fails)" >&2
fi

mkdir -p benches/results
out="benches/results/gpu-$(date -u +%Y%m%d-%H%M%S).txt"
exec > >(tee "$out") 2>&1

echo "# $(date -u +%FT%TZ) $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.current,pcie.link.width.current \
    --format=csv,noheader | sed 's/^/# gpu: /'
echo "# cpus: $(nproc), kernel $(uname -r)"

target_dir="${CARGO_TARGET_DIR:-target}"
if [ "$BUILD" = 1 ]; then
    echo "## building"
    cargo build --release -p crescent-benches --bin gpubench
    cargo test --release -p crescent-tests --test device_memory --no-run
    echo "## device tests (fake driver)"
    cargo test --release -p crescent-tests --test device_memory
else
    tests_bin=$(ls -t "$target_dir"/release/deps/device_memory-* 2>/dev/null | grep -v '\.d$' | head -1 || true)
    if [ -n "$tests_bin" ]; then
        echo "## device tests (fake driver, prebuilt $tests_bin)"
        "$tests_bin"
    else
        echo "## device tests: no prebuilt test binary under $target_dir/release/deps, not run"
    fi
fi

echo "## gpubench (real driver)"
# The real driver: CRESCENT_CUDA_DRIVER only if the caller set it.
"$target_dir/release/gpubench" run --device "$DEVICE" --sizes "$SIZES" --seconds "$SECONDS_PER_FIGURE"

echo "# written to $out"
