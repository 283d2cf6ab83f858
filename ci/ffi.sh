# The C ABI's and the Python package's build and test steps (sourced by test.sh and demo.sh).

CI_VENV="${CI_VENV:-.venv}"

# A virtual environment under the repository (.venv, git-ignored) with maturin, numpy, pytest,
# setuptools (the mooncake alias wheel's build backend) and safetensors (the safetensors file
# methods' tests): CI never touches the system's Python.
ci_python_env() {
  [ -x "$CI_VENV/bin/python" ] || python3 -m venv "$CI_VENV"
  "$CI_VENV/bin/python" -m pip install -q --disable-pip-version-check "maturin>=1.9.4,<2" numpy pytest \
    "setuptools>=70.1" safetensors
}

# Builds the wheel of ffi/python with maturin ($1: release or debug) and the pure-Python wheel of
# the `mooncake` alias package (ffi/python-mooncake), and installs both in the venv.
ci_python_wheel() {
  local profile=$1 out=ci/.work/wheels
  rm -rf "$out"
  local flags=()
  [ "$profile" = release ] && flags+=(--release)
  ci_log "building the Python wheel (maturin, $profile)"
  "$CI_VENV/bin/maturin" build "${flags[@]}" --locked -m ffi/python/Cargo.toml -o "$out" -i "$CI_VENV/bin/python"
  rm -rf ffi/python-mooncake/build
  "$CI_VENV/bin/python" -m pip wheel -q --disable-pip-version-check --no-deps --no-build-isolation -w "$out" \
    ffi/python-mooncake
  "$CI_VENV/bin/python" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps \
    "$out"/crescent-*.whl "$out"/crescent_mooncake-*.whl
}

# Starts crescent-master from $1 on a free loopback port: CI_MASTER_ADDR, CI_MASTER_PID.
ci_start_master() {
  local bin_dir=$1 out
  out=$(mktemp /tmp/crescent-master.XXXXXX)
  "$bin_dir/crescent-master" --rpc-address 127.0.0.1:0 --admin-address "" >"$out" &
  CI_MASTER_PID=$!
  for _ in $(seq 300); do grep -q '^master: ' "$out" && break; sleep 0.1; done
  CI_MASTER_ADDR=$(sed -n 's/^master: //p' "$out")
  rm -f "$out"
  [ -n "$CI_MASTER_ADDR" ] || { echo "crescent-master did not start" >&2; return 1; }
}

ci_stop_master() {
  [ -n "${CI_MASTER_PID:-}" ] && kill "$CI_MASTER_PID" 2>/dev/null && wait "$CI_MASTER_PID" 2>/dev/null
  CI_MASTER_PID=""
  return 0
}

# examples/store_example.c compiled against libcrescent and the generated crescent.h of $1
# (target/<profile>), run against a fresh master.
ci_c_example() {
  local dir=$1
  ci_log "C ABI: examples/store_example.c (gcc) against a crescent-master"
  mkdir -p ci/.work
  gcc -std=c11 -Wall -Wextra -Werror -I "$dir/include" examples/store_example.c -L "$dir" -lcrescent \
    -Wl,-rpath,"$(cd "$dir" && pwd)" -o ci/.work/store_example
  ci_start_master "$dir"
  local rc=0
  ci/.work/store_example "$CI_MASTER_ADDR" || rc=$?
  ci_stop_master
  return $rc
}

# ffi/c/tests/transfer_engine_test.c against libtransfer_engine and transfer_engine_c.h of $1
# (Mooncake's C interface): every function between two engines, over shm (same host) and over
# tcp (MC_FORCE_TCP=1); the header also compiles as C++ (NIXL's backend is C++).
ci_c_te_test() {
  local dir=$1
  ci_log "C ABI: ffi/c/tests/transfer_engine_test.c (gcc) against libtransfer_engine"
  mkdir -p ci/.work
  echo '#include "transfer_engine_c.h"' | g++ -std=c++17 -Wall -Wextra -Werror -fsyntax-only -x c++ -I "$dir/include" -
  gcc -std=c11 -Wall -Wextra -Werror -I "$dir/include" ffi/c/tests/transfer_engine_test.c -L "$dir" -ltransfer_engine \
    -Wl,-rpath,"$(cd "$dir" && pwd)" -o ci/.work/transfer_engine_test
  RUST_LOG=error ci/.work/transfer_engine_test
  MC_FORCE_TCP=1 RUST_LOG=error ci/.work/transfer_engine_test
}

# ffi/c/tests/transfer_engine_device_test.c against libtransfer_engine of $1 on the fake CUDA
# driver: a child process's cuda:0 memory and this one's device and host memory moved both ways,
# over shm (CUDA IPC between the processes) and over tcp (MC_FORCE_TCP=1, staged).
ci_c_te_device_test() {
  local dir=$1 fake
  ci_log "C ABI: ffi/c/tests/transfer_engine_device_test.c on the fake CUDA driver"
  fake=$(ci_fake_cuda_driver "$dir")
  mkdir -p ci/.work
  gcc -std=c11 -Wall -Wextra -Werror -I "$dir/include" ffi/c/tests/transfer_engine_device_test.c -L "$dir" \
    -ltransfer_engine -ldl -Wl,-rpath,"$(cd "$dir" && pwd)" -o ci/.work/transfer_engine_device_test
  CRESCENT_CUDA_DRIVER="$fake" RUST_LOG=error ci/.work/transfer_engine_device_test
  CRESCENT_CUDA_DRIVER="$fake" MC_FORCE_TCP=1 RUST_LOG=error ci/.work/transfer_engine_device_test
}

# The fake CUDA driver tests/build.rs built into the cargo tree of $1 (target/<profile>): the
# newest, where builds of several configurations left more than one.
ci_fake_cuda_driver() {
  local found
  found=$(ls -t "$1"/build/crescent-tests-*/out/libfake_cuda.so 2>/dev/null | head -1)
  [ -n "$found" ] || { echo "no fake CUDA driver under $1/build (cargo build -p crescent-tests builds it)" >&2; return 1; }
  echo "$found"
}

# The pytest suite against binaries of $1. pytest's exit 5 ("no tests collected") fails too.
# The device tests (test_device.py) run on the fake CUDA driver: named here, so that they run
# rather than skip.
ci_pytest() {
  ci_log "Python package: pytest ffi/python/tests"
  local fake
  fake=$(ci_fake_cuda_driver "$1")
  CRESCENT_BIN_DIR="$1" CRESCENT_FAKE_CUDA_DRIVER="$fake" "$CI_VENV/bin/python" -m pytest ffi/python/tests -q \
    -p no:cacheprovider
}
