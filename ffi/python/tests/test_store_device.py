"""Device (GPU) memory through the Python MooncakeDistributedStore, on the fake CUDA driver of
the Rust tests (cuda_driver.py): device pointers (ints) registered with `register_buffer`, and
arrays offering `__cuda_array_interface__` or DLPack where upstream takes pointers, put and got
through a client's own segment and another's (tcp), one at a time, in batches mixing host and
device memory, and in several buffers per key; bad input; a host without a driver.

Device memory there is a PROT_NONE mapping: a path that touched it with the CPU would kill the
process, not fail a check. Every value is verified byte for byte through the driver.
"""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import crescent
from conftest import Master, connect
from cuda_driver import CudaArray, DLPackArray, Driver, driver, fake_driver_path  # noqa: F401 (driver: a fixture)

MiB = 1 << 20
ODD = MiB + 4097


def rand(n: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


@pytest.fixture(scope="module")
def stores(driver):
    """A client holding the replicas (local-first: its own puts stay in its segment) and a
    consumer with no segment (its gets and puts cross tcp)."""
    m = Master("--lease-ttl-ms", "30000", "--allocation-strategy", "local-first")
    holder, consumer = connect(m), connect(m, segment=0)
    yield holder, consumer
    holder.close()
    consumer.close()
    m.stop()


def device(driver, data: bytes) -> CudaArray:
    a = CudaArray(driver, len(data))
    a.write(data)
    return a


def test_device_pointers_put_and_get_through_own_and_remote_replicas(stores, driver):
    holder, consumer = stores
    value = rand(ODD, 1)
    src, dst, cdst = device(driver, value), CudaArray(driver, ODD), CudaArray(driver, ODD)
    assert holder.register_buffer(src.ptr, ODD) == 0, crescent.last_error()
    assert holder.register_buffer(dst.ptr, ODD) == 0
    assert consumer.register_buffer(cdst.ptr, ODD) == 0
    assert holder.put_from("py-dev", src.ptr, ODD) == 0, crescent.last_error()
    assert holder.get_into("py-dev", dst.ptr, ODD) == ODD, "own replica into device memory"
    assert dst.read() == value
    assert consumer.get_into("py-dev", cdst.ptr, ODD) == ODD, "remote replica into device memory"
    assert cdst.read() == value
    assert holder.get("py-dev") == value
    # From the consumer's device memory into the holder's segment.
    csrc = device(driver, rand(ODD, 2))
    assert consumer.register_buffer(csrc.ptr, ODD) == 0
    assert consumer.put_from("py-dev2", csrc.ptr, ODD) == 0, crescent.last_error()
    assert holder.get("py-dev2") == rand(ODD, 2)
    for s, a in ((holder, src), (holder, dst), (consumer, cdst), (consumer, csrc)):
        assert s.unregister_buffer(a.ptr) == 0


def test_arrays_by_interface_and_dlpack_where_upstream_takes_pointers(stores, driver):
    holder, consumer = stores
    n = 256 * 1024
    cai, dl = device(driver, rand(n, 3)), DLPackArray(driver, n)
    driver.htod(dl.ptr, rand(n, 4))
    into_cai, into_dl = CudaArray(driver, n), DLPackArray(driver, n)
    for s in (holder, consumer):
        for a in (cai, dl, into_cai, into_dl):
            assert s.register_buffer(a) == 0, crescent.last_error()
    assert holder.batch_put_from(["py-cai", "py-dl"], [cai, dl]) == [0, 0], crescent.last_error()
    for s in (holder, consumer):
        assert s.batch_get_into(["py-cai", "py-dl"], [into_dl, into_cai]) == [n, n], crescent.last_error()
        assert driver.dtoh(into_dl.ptr, n) == rand(n, 3) and into_cai.read() == rand(n, 4)
        assert s.get_into("py-dl", into_cai) == n and into_cai.read() == rand(n, 4)
    for s in (holder, consumer):
        for a in (cai, dl, into_cai, into_dl):
            assert s.unregister_buffer(a) == 0


def test_batches_mix_host_and_device_and_multi_buffers(stores, driver):
    holder, consumer = stores
    n = 128 * 1024 + 3
    dev, part1, part2 = device(driver, rand(n, 5)), device(driver, rand(n, 6)), device(driver, rand(n, 7))
    host = np.frombuffer(bytearray(rand(n, 8)), dtype=np.uint8)
    for w, writer in enumerate((holder, consumer)):
        for a in (dev, part1, part2):
            assert writer.register_buffer(a.ptr, n) == 0
        assert writer.register_buffer(host.ctypes.data, n) == 0
        keys = [f"py-mix-dev{w}", f"py-mix-host{w}"]
        assert writer.batch_put_from(keys, [dev.ptr, host.ctypes.data], [n, n]) == [0, 0], crescent.last_error()
        multi = f"py-multi{w}"
        rc = writer.batch_put_from_multi_buffers([multi], [[part1.ptr, host.ctypes.data, part2.ptr]], [[n, n, n]])
        assert rc == [0], crescent.last_error()
        for reader in (holder, consumer):
            out_dev, out1, out2 = CudaArray(driver, n), CudaArray(driver, n), CudaArray(driver, n)
            out_host = np.zeros(n, dtype=np.uint8)
            for a in (out_dev, out1, out2):
                assert reader.register_buffer(a.ptr, n) == 0
            assert reader.register_buffer(out_host.ctypes.data, n) == 0
            got = reader.batch_get_into(keys, [out_host.ctypes.data, out_dev.ptr], [n, n])
            assert got == [n, n], crescent.last_error()
            assert out_host.tobytes() == rand(n, 5) and out_dev.read() == rand(n, 8)
            out_host[:] = 0
            got = reader.batch_get_into_multi_buffers([multi], [[out1.ptr, out_host.ctypes.data, out2.ptr]], [[n, n, n]])
            assert got == [3 * n], crescent.last_error()
            assert out1.read() == rand(n, 6) and out_host.tobytes() == rand(n, 8) and out2.read() == rand(n, 7)
            for a in (out_dev.ptr, out1.ptr, out2.ptr, out_host.ctypes.data):
                assert reader.unregister_buffer(a) == 0
        for a in (dev.ptr, part1.ptr, part2.ptr, host.ctypes.data):
            assert writer.unregister_buffer(a) == 0


def test_bad_device_input_is_a_code_never_a_crash(stores, driver):
    holder, _ = stores
    a = device(driver, rand(MiB, 9))
    # Not registered: INVALID_PARAMS, nothing read.
    assert holder.put_from("py-bad", a.ptr, MiB) < 0
    assert "not registered" in crescent.last_error()
    # A range past the end of its allocation.
    assert holder.register_buffer(a.ptr + MiB - 10, 100) != 0
    assert "allocation" in crescent.last_error()
    assert holder.is_exist("py-bad") == 0


NO_DRIVER = textwrap.dedent(
    """
    import sys, crescent
    sys.path.insert(0, sys.argv[1])
    from conftest import Master, connect
    from cuda_driver import CudaArray, Driver
    array = CudaArray(Driver(sys.argv[2]), 4096)
    m = Master()
    s = connect(m, segment=0)
    print(s.register_buffer(array))
    print(crescent.last_error())
    s.close()
    m.stop()
    """
)


def test_without_a_driver_a_device_array_is_refused_clearly(driver, tmp_path):
    env = dict(os.environ, CRESCENT_CUDA_DRIVER=str(tmp_path / "libcuda-missing.so.1"), RUST_LOG="error")
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run(
        [sys.executable, "-c", NO_DRIVER, here, str(fake_driver_path())],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    code, message = out.stdout.splitlines()[-2:]
    assert int(code) < 0, "refused with a code"
    assert "device memory is unavailable" in message and "libcuda-missing" in message, message


def test_a_dummy_client_refuses_device_memory_clearly(driver):
    """A dummy client copies registered memory through its local buffer with the CPU: device
    memory is refused at registration, never touched."""
    import random

    from test_dummy import Standalone

    m = Master("--lease-ttl-ms", "30000")
    port = random.randrange(20000, 60000)
    sc = Standalone(m, port)
    try:
        s = crescent.MooncakeDistributedStore()
        assert s.setup_dummy(8 * MiB, 4 * MiB, f"127.0.0.1:{port}") == 0, crescent.last_error()
        a = device(driver, rand(4096, 10))
        assert s.register_buffer(a.ptr, 4096) < 0
        assert "dummy client" in crescent.last_error() and "cuda:0" in crescent.last_error()
        assert s.register_buffer(a) < 0
        assert "host memory only" in crescent.last_error()
        assert s.put_from("py-dummy-dev", a.ptr, 4096) < 0, "not registered"
        s.close()
    finally:
        sc.stop()
        m.stop()
