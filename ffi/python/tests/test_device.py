"""Device (GPU) memory through the Python TransferEngine, on the fake CUDA driver of the Rust
tests (cuda_driver.py): device arrays handed in by `__cuda_array_interface__` and DLPack,
registration as `cuda:0` and `*`, transfers between two processes over shm (CUDA IPC) and tcp
(staged through pinned buffers) in both directions, device to device and mixed, upstream's
`*_on_cuda` calls ordered on a stream, and a host without a driver.

Device memory there is a PROT_NONE mapping: a path that touched it with the CPU would kill the
process, not fail a check. Every transfer is verified byte for byte through the driver.

The fake driver is found as cuda_driver.fake_driver_path() says; without it these tests skip,
unless CRESCENT_NO_SKIP=1 (CI), where they fail.
"""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import crescent
from crescent.engine import TransferEngine, TransferOpcode
from cuda_driver import CudaArray, DLPackArray, Driver, driver  # noqa: F401 (driver: a fixture)
from test_engine import Peer

MiB = 1 << 20
# Larger than a tcp slice and not a multiple of anything: several slices, bounce buffers
# reused, a short last piece.
ODD = 2 * MiB + 4097


def rand(n: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def engine(protocol: str = "tcp") -> TransferEngine:
    te = TransferEngine()
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", protocol, "") == 0, crescent.last_error()
    return te


def test_device_arrays_register_by_interface_and_dlpack(driver):
    te = engine()
    a = CudaArray(driver, MiB, rows=4)
    # `*` (the default): the driver's attributes make it cuda:0; the object is taken as is.
    assert te.register_memory(a) == 0, crescent.last_error()
    assert te.register_memory(a.ptr + 100, 10, "cuda:0") == -7, "the same memory: it was registered at its pointer"
    data = rand(4096, 1)
    # write/read_bytes go through the driver for device memory (a CPU copy would crash).
    assert te.write_bytes_to_buffer(a.ptr + 10, data, len(data)) == 0, crescent.last_error()
    assert a.read(10, 4096) == data
    assert te.read_bytes_from_buffer(a.ptr + 10, 4096) == data
    assert te.unregister_memory(a) == 0
    # A capacity within the array; beyond it, refused before the engine sees it.
    assert te.register_memory(a, MiB // 2, "cuda:0") == 0
    assert te.unregister_memory(a.ptr) == 0
    with pytest.raises(ValueError, match="larger than the array"):
        te.register_memory(a, MiB + 1)
    # DLPack: a device tensor and (byte_offset) a view into another allocation.
    d = DLPackArray(driver, 64 * 1024)
    view = DLPackArray(driver, 8192, ptr=driver.alloc(8192), byte_offset=4096)
    assert te.batch_register_memory([d, view], None, "cuda:0") == 0, crescent.last_error()
    assert te.register_memory(view.ptr + 4096, 1) == -7, "registered from byte_offset on"
    assert te.register_memory(view.ptr, 4096) == 0, "the bytes before byte_offset were not registered"
    assert te.batch_unregister_memory([d, view, view.ptr]) == 0
    # DLPack of host memory (a framework's CPU tensor without the buffer protocol).
    host = np.arange(1024, dtype=np.float32)
    wrapped = DLPackArray(driver, host.nbytes, device_type=1, ptr=host.ctypes.data)
    assert te.register_memory(wrapped, None, "cpu:0") == 0
    assert te.unregister_memory(host.ctypes.data) == 0


def test_bad_device_input_is_refused_with_a_code_and_message(driver):
    te = engine()
    a = CudaArray(driver, MiB)
    assert te.register_memory(a.ptr, 4096, "cuda:7") == -1
    assert "no such device" in crescent.last_error()
    host = bytearray(4096)
    assert te.register_memory(host, None, "cuda:0") == -1
    assert "not device memory" in crescent.last_error()
    assert te.register_memory(a.ptr + MiB - 10, 100, "cuda:0") == -1
    assert "not inside one allocation" in crescent.last_error()
    # Not C-contiguous, masked, read-only where a read writes: refused before the engine.
    a.rows, a.strides = 2, (1, 2)
    with pytest.raises(BufferError, match="not C-contiguous"):
        te.register_memory(a)
    a.rows, a.strides = 1, None
    ro = CudaArray(driver, 4096, readonly=True)
    assert te.register_memory(ro) == 0
    with pytest.raises(BufferError, match="read-only"):
        te.transfer_sync_read(te.get_segment_name(), ro, ro.ptr, 16)
    with pytest.raises(TypeError, match="DLPack device type 7"):
        te.register_memory(DLPackArray(driver, 4096, device_type=7))
    # The store's calls take device arrays too (test_store_device.py): before setup, a code.
    assert crescent.MooncakeDistributedStore().put_from("k", a, 16) < 0


@pytest.fixture(scope="module", params=["shm", "tcp"])
def pair(request, driver):
    """(initiator here, a peer process whose buffer is 16 MiB of cuda:0 memory), over shm
    (CUDA IPC between the processes) or tcp (MC_FORCE_TCP=1: staged through pinned buffers)."""
    forced = {"MC_FORCE_TCP": "1"} if request.param == "tcp" else {}
    saved = {k: os.environ.get(k) for k in forced}
    os.environ.update(forced)
    try:
        peer = Peer(request.param, 16 * MiB, "cuda:0")
        te = engine(request.param)
    finally:
        for k, v in saved.items():
            if v is None:
                del os.environ[k]
            else:
                os.environ[k] = v
    yield te, peer
    peer.stop()


def test_device_to_device_both_ways_with_odd_sizes(pair, driver):
    te, peer = pair
    a = CudaArray(driver, 4 * MiB)
    assert te.register_memory(a) == 0, crescent.last_error()
    data = rand(ODD, 2)
    a.write(data, 3)
    # The array object itself, then an int pointer into it at an odd offset.
    assert te.transfer_sync_write(peer.name, a.ptr + 3, peer.addr + 5, ODD) == 0, crescent.last_error()
    assert peer.read(5, ODD) == data
    back = rand(ODD, 3)
    peer.fill(MiB + 1, back)
    assert te.transfer_sync_read(peer.name, a, peer.addr + MiB + 1, ODD) == 0, crescent.last_error()
    assert a.read(0, ODD) == back
    # Batches: pieces of the device array to scattered places and back.
    offs, remote = [0, 700_001, 1_500_000], [9 * MiB, 8 * MiB + 1, 10 * MiB + 33]
    lens = [300_000, 500_000, 123]
    assert te.batch_transfer_sync_write(peer.name, [a.ptr + o for o in offs], [peer.addr + r for r in remote], lens) == 0
    full = a.read()
    for o, r, n in zip(offs, remote, lens):
        assert peer.read(r, n) == full[o:o + n]
    b = CudaArray(driver, MiB)
    assert te.register_memory(b) == 0
    bid = te.batch_transfer_async_read(peer.name, [b.ptr, b.ptr + 600_000], [peer.addr + remote[0],
                                       peer.addr + remote[1]], [300_000, 400_000])
    assert bid != 0 and te.get_batch_transfer_status([bid]) == 0, crescent.last_error()
    assert b.read(0, 300_000) == full[:300_000] and b.read(600_000, 400_000) == full[700_001:1_100_001]
    assert te.unregister_memory(a) == 0 and te.unregister_memory(b) == 0


def test_mixed_host_and_device(pair, driver):
    te, peer = pair
    host = np.frombuffer(bytearray(rand(ODD, 4)), dtype=np.uint8)
    assert te.register_memory(host) == 0
    assert te.transfer_sync(peer.name, host, peer.addr + 7, ODD, TransferOpcode.Write) == 0, crescent.last_error()
    assert peer.read(7, ODD) == host.tobytes()
    zero = np.zeros(ODD, dtype=np.uint8)
    assert te.register_memory(zero) == 0
    assert te.transfer_sync_read(peer.name, zero, peer.addr + 7, ODD) == 0, crescent.last_error()
    assert zero.tobytes() == host.tobytes()
    # Out of the peer's device range: a failed transfer (-1), nothing crashes.
    assert te.transfer_sync_read(peer.name, zero, peer.addr + peer.len - 10, 100) == -1
    assert te.unregister_memory(host) == 0 and te.unregister_memory(zero) == 0


class TorchLikeStream:
    """What torch.cuda.Stream offers: the handle as `cuda_stream`."""

    def __init__(self, handle: int):
        self.cuda_stream = handle


def test_on_cuda_transfers_are_ordered_on_the_stream(pair, driver):
    te, peer = pair
    a = CudaArray(driver, 2 * MiB)
    assert te.register_memory(a) == 0
    stream = driver.stream_create()
    first, second = rand(MiB, 5), rand(MiB, 6)
    a.write(first)
    assert te.transfer_write_on_cuda(peer.name, a, peer.addr + 11 * MiB, MiB, stream) is None
    # Queued after the write on the same stream: the write must have read `first` already.
    driver.lib.cuMemcpyAsync(a.ptr, np.frombuffer(second, dtype=np.uint8).ctypes.data, MiB, stream)
    driver.synchronize(stream)
    assert peer.read(11 * MiB, MiB) == first
    assert a.read(0, MiB) == second
    # Reads; the default stream (0), a stream object; batch forms.
    peer.fill(12 * MiB, second[::-1])
    te.transfer_read_on_cuda(peer.name, a.ptr + MiB, peer.addr + 12 * MiB, MiB)
    driver.synchronize(0)
    assert a.read(MiB, MiB) == second[::-1]
    te.batch_transfer_write_on_cuda(peer.name, [a.ptr, a.ptr + MiB], [peer.addr + 13 * MiB, peer.addr + 14 * MiB],
                                    [MiB, 100], TorchLikeStream(stream))
    te.batch_transfer_read_on_cuda(peer.name, [a.ptr + 5], [peer.addr + 13 * MiB], [1000], stream_ptr=stream)
    driver.synchronize(stream)
    assert peer.read(13 * MiB, MiB) == second and peer.read(14 * MiB, 100) == second[::-1][:100]
    assert a.read(5, 1000) == second[:1000]
    # Refused at once (RuntimeError, as upstream): lists of other lengths, memory not registered.
    with pytest.raises(RuntimeError, match="different sizes"):
        te.batch_transfer_write_on_cuda(peer.name, [a.ptr], [peer.addr, peer.addr], [1, 1], stream)
    with pytest.raises(RuntimeError, match="not registered"):
        te.transfer_write_on_cuda(peer.name, a.ptr + 2 * MiB, peer.addr, 16, stream)
    # A transfer that fails on the stream's time: the stream goes on, the next call raises it.
    te.transfer_read_on_cuda(peer.name, a, peer.addr + peer.len - 10, 100, stream)
    driver.synchronize(stream)
    with pytest.raises(RuntimeError, match="earlier failed"):
        te.transfer_read_on_cuda(peer.name, a, peer.addr, 100, stream)
    te.transfer_read_on_cuda(peer.name, a, peer.addr, 100, stream)
    driver.synchronize(stream)
    assert a.read(0, 100) == peer.read(0, 100)
    assert te.unregister_memory(a) == 0


NO_DRIVER = textwrap.dedent(
    """
    import ctypes, crescent
    from crescent.engine import TransferEngine
    te = TransferEngine()
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    buf = ctypes.create_string_buffer(4096)
    print(te.register_memory(ctypes.addressof(buf), 4096, "cuda:0"))
    print(crescent.last_error())
    print(te.register_memory(ctypes.addressof(buf), 4096, "*"))
    try:
        te.transfer_write_on_cuda(te.get_segment_name(), ctypes.addressof(buf), ctypes.addressof(buf), 16, 0)
        print("queued")
    except RuntimeError as e:
        print("RuntimeError:", e)
    """
)


def test_without_a_driver_device_registration_fails_clearly(tmp_path):
    env = dict(os.environ, CRESCENT_CUDA_DRIVER=str(tmp_path / "libcuda-missing.so.1"), RUST_LOG="error")
    out = subprocess.run([sys.executable, "-c", NO_DRIVER], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    code, message, host, on_cuda = out.stdout.splitlines()
    assert code == "-202", "ERR_CONTEXT: the host's fault"
    assert "device memory is unavailable" in message and "libcuda-missing" in message
    assert host == "0", "`*` without a driver: host memory"
    assert on_cuda.startswith("RuntimeError:") and "device memory is unavailable" in on_cuda
