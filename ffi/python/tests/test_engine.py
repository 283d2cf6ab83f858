"""TransferEngine: two engines in this process moving bytes over loopback tcp."""

import numpy as np
import pytest

import crescent
from crescent.engine import TransferEngine

MiB = 1 << 20


@pytest.fixture(scope="module")
def engines():
    a, b = TransferEngine(), TransferEngine()
    assert a.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0, crescent.last_error()
    assert b.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0, crescent.last_error()
    return a, b


def test_names_match_mooncake():
    assert crescent.TransferEngine is TransferEngine
    for name in [
        "initialize", "get_rpc_port", "register_memory", "batch_register_memory", "unregister_memory",
        "transfer_sync_read", "transfer_sync_write", "batch_transfer_sync_read", "batch_transfer_sync_write",
        "allocate_managed_buffer", "free_managed_buffer", "get_first_buffer_address",
    ]:
        assert callable(getattr(TransferEngine, name)), name


def test_read_and_write_between_engines(engines):
    a, b = engines
    assert b.get_rpc_port() > 0
    name_b = b.get_segment_name()
    assert name_b == f"127.0.0.1:{b.get_rpc_port()}"
    remote = b.allocate_managed_buffer(4 * MiB)
    assert remote != 0
    assert a.get_first_buffer_address(name_b) == remote
    data = np.random.default_rng(3).integers(0, 256, 4 * MiB, dtype=np.uint8)
    assert b.write_bytes_to_buffer(remote, data.tobytes(), data.nbytes) == 0

    local = np.zeros(4 * MiB, dtype=np.uint8)
    assert a.register_memory(local) == 0
    # Read: a numpy view, then an int address.
    assert a.transfer_sync_read(name_b, local[:MiB], remote, MiB) == 0
    assert a.transfer_sync_read(name_b, local.ctypes.data + MiB, remote + MiB, 3 * MiB) == 0
    assert np.array_equal(local, data)
    # Write back, shifted, in one batch of two requests.
    assert a.batch_transfer_sync_write(name_b, [local[:MiB], local.ctypes.data + MiB], [remote + 3 * MiB, remote],
                                       [MiB, MiB]) == 0
    back = np.frombuffer(b.read_bytes_from_buffer(remote, 4 * MiB), dtype=np.uint8)
    assert np.array_equal(back[3 * MiB:], data[:MiB])
    assert np.array_equal(back[:MiB], data[MiB: 2 * MiB])
    local[:] = 0
    assert a.batch_transfer_sync_read(name_b, [local[:10], local[10:20]], [remote, remote + 10], [10, 10]) == 0
    assert np.array_equal(local[:20], back[:20])

    # Out of the target's registered memory: a failed transfer, nothing touched.
    assert a.transfer_sync_read(name_b, local, remote + 4 * MiB - 1, 2) == crescent.TRANSFER_FAIL
    assert "outside" in crescent.last_error()
    # Local memory not registered: refused.
    other = np.zeros(16, dtype=np.uint8)
    assert a.transfer_sync_read(name_b, other, remote, 16) == crescent.INVALID_PARAMS
    # An unknown peer.
    assert a.transfer_sync_read("127.0.0.1:1", local, remote, 16) < 0
    assert a.get_first_buffer_address("127.0.0.1:1") == 0

    assert a.unregister_memory(local) == 0
    assert b.free_managed_buffer(remote, 4 * MiB) == 0
    assert b.free_managed_buffer(remote, 4 * MiB) == crescent.INVALID_PARAMS


def test_batch_register_and_bad_arguments(engines):
    a, _ = engines
    x, y = np.zeros(4096, dtype=np.uint8), np.zeros(8192, dtype=np.uint8)
    assert a.batch_register_memory([x, y.ctypes.data], [4096, 8192]) == 0
    # Overlapping registration: all or nothing.
    z = np.zeros(100, dtype=np.uint8)
    assert a.batch_register_memory([z, x], [100, 4096]) == crescent.INVALID_PARAMS
    assert a.register_memory(z) == 0  # z was rolled back, so it can be registered now
    for m in (x, y, z):
        assert a.unregister_memory(m) == 0
    with pytest.raises(TypeError):
        a.register_memory("not memory", 10)
    with pytest.raises(ValueError, match="larger than the buffer"):
        a.transfer_sync_read("127.0.0.1:1", x, 0, 4097)
    with pytest.raises(ValueError):
        a.batch_transfer_sync_read("127.0.0.1:1", [x], [0, 1], [1, 1])
    with pytest.raises(ValueError):
        a.write_bytes_to_buffer(x.ctypes.data, b"abc", 4)
    assert a.write_bytes_to_buffer(x.ctypes.data, b"abc", 3) == crescent.INVALID_PARAMS  # unregistered now
    assert a.read_bytes_from_buffer(8, 16) == b""
    e = TransferEngine()
    assert e.get_rpc_port() == crescent.UNAVAILABLE_IN_CURRENT_STATUS
    assert e.allocate_managed_buffer(10) == 0
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "carrier-pigeon", "") == crescent.INVALID_PARAMS
