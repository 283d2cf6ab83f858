"""Bad input through the `mooncake` alias gets Mooncake's codes and a message, never a crash,
and loses nothing: lists of different lengths, unregistered memory, buffers too small, zero and
huge sizes, closed stores."""

import uuid

import numpy as np
import pytest

import crescent
from mooncake.store import MooncakeDistributedStore, ReplicateConfig

from conftest import MiB

INVALID_PARAMS, BUFFER_OVERFLOW = -600, -10


def key(tag: str) -> str:
    return f"bad/{tag}/{uuid.uuid4().hex}"


@pytest.fixture
def s(master):
    st = MooncakeDistributedStore()
    assert st.setup("127.0.0.1", "P2PHANDSHAKE", 32 * MiB, 8 * MiB, "tcp", "", master.addr) == 0
    yield st
    st.close()


def test_lists_of_other_lengths_get_a_code_per_key(s):
    buf = np.zeros(4096, dtype=np.uint8)
    assert s.register_buffer(buf) == 0
    p = buf.ctypes.data
    assert s.batch_put_from(["a", "b", "c"], [p, p], [10, 10, 10]) == [INVALID_PARAMS] * 3
    assert s.batch_put_from(["a", "b"], [p, p], [10]) == [INVALID_PARAMS] * 2
    assert s.batch_get_into(["a", "b"], [p], [10, 10]) == [INVALID_PARAMS] * 2
    assert s.batch_upsert_from(["a"], [p, p], [1, 1]) == [INVALID_PARAMS]
    assert s.put_batch(["a"], [b"1", b"2"]) == INVALID_PARAMS
    assert s.upsert_batch(["a", "b"], [b"1"]) == INVALID_PARAMS
    assert s.batch_put_tensor(["a", "b"], [np.zeros(2)]) == [INVALID_PARAMS] * 2
    assert "keys" in crescent.last_error()
    assert s.batch_is_exist(["a", "b", "c"]) == [0, 0, 0]  # nothing was stored by any of them


def test_unregistered_and_too_small_buffers(s):
    k = key("v")
    assert s.put(k, b"x" * 10000) == 0
    unregistered = np.zeros(20000, dtype=np.uint8)
    assert s.get_into(k, unregistered.ctypes.data, unregistered.nbytes) == INVALID_PARAMS
    assert "register_buffer" in crescent.last_error()
    assert s.put_from(key("u"), unregistered.ctypes.data, 100) == INVALID_PARAMS
    assert s.batch_get_into([k], [unregistered.ctypes.data], [20000]) == [INVALID_PARAMS]
    small = np.zeros(100, dtype=np.uint8)
    assert s.register_buffer(small) == 0
    assert s.get_into(k, small) == BUFFER_OVERFLOW
    assert s.batch_get_into([k], [small], [100]) == [BUFFER_OVERFLOW]
    assert s.get_tensor_into(k, small.ctypes.data, 100) is None
    assert not small.any()  # no partial write
    assert s.get(k) == b"x" * 10000  # and the value is untouched


def test_zero_and_huge_sizes(master, s):
    assert s.put(key("empty"), b"") == INVALID_PARAMS
    assert s.put_batch([key("e1"), key("e2")], [b"ok", b""]) == INVALID_PARAMS
    buf = np.zeros(4096, dtype=np.uint8)
    assert s.register_buffer(buf) == 0
    huge = 1 << 60
    assert s.put_from(key("huge"), buf.ctypes.data, huge) == INVALID_PARAMS
    assert s.get_into(key("huge"), buf.ctypes.data, huge) < 0
    assert s.register_buffer(buf.ctypes.data, huge) < 0
    too_big = MooncakeDistributedStore()
    assert too_big.setup("127.0.0.1", "P2PHANDSHAKE", 1 << 50, 8 * MiB, "tcp", "", master.addr) < 0
    assert too_big.health_check() == 1
    c = ReplicateConfig()
    c.replica_num = 0
    assert s.put(key("r0"), b"v", c) == INVALID_PARAMS
    c.replica_num = 1
    c.nof_replica_num = 1
    assert s.put(key("nof"), b"v", c) == INVALID_PARAMS
    assert s.put(key("fine"), b"still fine") == 0


def test_closed_and_never_set_up_stores(master):
    never = MooncakeDistributedStore()
    closed = MooncakeDistributedStore()
    assert closed.setup("127.0.0.1", "P2PHANDSHAKE", 16 * MiB, 8 * MiB, "tcp", "", master.addr) == 0
    assert closed.close() == 0
    for st in (never, closed):
        assert st.put("k", b"v") == INVALID_PARAMS
        assert st.upsert("k", b"v") == INVALID_PARAMS
        assert st.put_from("k", 4096, 10) == INVALID_PARAMS
        assert st.get("k") == b""
        assert st.get_buffer("k") is None
        assert st.batch_get_buffer(["k"]) == [None]
        assert st.get_into("k", 4096, 10) == INVALID_PARAMS
        assert st.batch_put_from(["a", "b"], [4096, 8192], [1, 1]) == [INVALID_PARAMS] * 2
        assert st.is_exist("k") == INVALID_PARAMS
        assert st.get_size("k") == INVALID_PARAMS
        assert st.remove("k") == INVALID_PARAMS
        assert st.batch_remove(["k"]) == [INVALID_PARAMS]
        assert st.remove_all(force=True) == INVALID_PARAMS
        assert st.get_replica_desc("k") == []
        assert st.batch_get_replica_desc(["k"]) == {}
        assert st.put_tensor("k", np.zeros(2)) == INVALID_PARAMS
        assert st.get_tensor("k") is None
        assert st.register_buffer(4096, 10) == INVALID_PARAMS
        assert st.health_check() == 1
        assert st.get_hostname() == ""
        assert st.get_offload_rpc_read_count() == 0
        assert st.close() == 0
