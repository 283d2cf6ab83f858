"""setup_dummy: MooncakeDistributedStore as a dummy client of a crescent-client process (the
standalone client) on this host, as upstream's ``setup_dummy`` against ``mooncake_client``."""

import ctypes
import random

import numpy as np
import pytest

import crescent
from conftest import MiB, Master, Process, connect, master_fixture


class Standalone(Process):
    """A crescent-client serving dummy clients at @crescent_client_<port>.sock."""

    def __init__(self, master: Master, port: int):
        super().__init__(
            "crescent-client",
            [f"--master_server_address={master.addr}", "--host=127.0.0.1",
             "--global_segment_size=64MB", "--local_buffer_size=16MB", f"--port={port}"],
            "socket: ",
            "crescent-client did not start",
        )


master = master_fixture("--lease-ttl-ms", "30000")


@pytest.fixture(scope="module")
def port(master):
    p = random.randrange(20000, 60000)
    sc = Standalone(master, p)
    yield p
    sc.stop()


def dummy(port: int) -> crescent.MooncakeDistributedStore:
    s = crescent.MooncakeDistributedStore()
    rc = s.setup_dummy(32 * MiB, 8 * MiB, f"127.0.0.1:{port}")
    assert rc == 0, crescent.last_error()
    return s


def pattern(n: int, seed: int) -> bytes:
    return bytes((i * 31 + seed) % 251 for i in range(n))


def test_two_dummy_clients_and_a_full_client_see_the_same_objects(master, port):
    a, b = dummy(port), dummy(port)
    full = connect(master)
    v = pattern(300_000, 1)
    assert a.put("py/bytes", v) == 0
    assert b.get("py/bytes") == v
    assert full.get("py/bytes") == v
    assert b.is_exist("py/bytes") == 1 and b.get_size("py/bytes") == len(v)

    # Zero copy: memory from the pool, shared with the standalone client.
    n = 1 * MiB
    src = a.alloc_from_mem_pool(n)
    dst = b.alloc_from_mem_pool(n)
    assert src and dst
    data = pattern(n, 2)
    ctypes.memmove(src, data, n)
    assert a.register_buffer(src, n) == 0  # accepted, as upstream's for pool memory
    assert a.put_from("py/zero-copy", src, n) == 0
    assert b.get_into("py/zero-copy", dst, n) == n
    assert ctypes.string_at(dst, n) == data
    assert full.get("py/zero-copy") == data

    # Batches, and heap memory (a numpy array) through the local buffer.
    keys = ["py/b0", "py/b1"]
    assert a.put_batch(keys, [pattern(1000, 3), pattern(2000, 4)]) == 0
    arr = np.zeros(4096, dtype=np.uint8)
    assert b.register_buffer(arr) == 0
    got = b.batch_get_into(keys, [arr.ctypes.data, arr.ctypes.data + 2048], [1000, 2000])
    assert got == [1000, 2000]
    assert arr[:1000].tobytes() == pattern(1000, 3) and arr[2048:4048].tobytes() == pattern(2000, 4)
    assert b.batch_is_exist(["py/b0", "py/none"]) == [1, 0]
    assert b.remove("py/none") == crescent.OBJECT_NOT_FOUND
    assert b.get_into("py/zero-copy", dst, 10) == crescent.BUFFER_OVERFLOW
    stray = bytearray(16)
    assert b.get_into("py/b0", (ctypes.c_char * 16).from_buffer(stray), 16) < 0, "unregistered memory"
    for s in (a, b, full):
        assert s.close() == 0


def test_setup_dummy_and_init_all_return_codes(port):
    s = crescent.MooncakeDistributedStore()
    assert s.setup_dummy(MiB, MiB, "127.0.0.1:1") == -1, "nothing serves port 1"
    assert "unavailable" in crescent.last_error()
    assert s.alloc_from_mem_pool(4096) == 0, "not set up"
    assert s.setup_dummy(MiB, MiB, f"127.0.0.1:{port}") == 0
    assert s.setup_dummy(MiB, MiB, f"127.0.0.1:{port}") == -1, "already set up"
    assert s.init_all("tcp", "") == -1
    assert s.get_hostname() != "", "the standalone client's segment"
    s.close()


def test_a_dummy_client_has_the_whole_store_api(port):
    s = dummy(port)
    assert s.health_check() == 0, "the standalone client's master answers"
    assert s.put("py/u", b"old") == 0
    assert s.upsert("py/u", b"new") == 0
    assert s.get("py/u") == b"new"
    assert s.put_parts("py/parts", b"ab", b"cd", b"e") == 0
    assert s.upsert_parts("py/parts2", b"x", b"yz") == 0
    assert s.get("py/parts") == b"abcde" and s.get("py/parts2") == b"xyz"
    # get_buffer: the value in this process's memory shared with the standalone client.
    v = pattern(200_000, 5)
    assert s.put("py/held", v) == 0
    h = s.get_buffer("py/held")
    assert h is not None and h.size() == len(v) and bytes(memoryview(h)) == v
    assert s.get_into("py/held", h.ptr(), h.size()) == len(v), "held memory is usable by zero-copy calls"
    hs = s.batch_get_buffer(["py/parts", "py/missing"])
    assert bytes(memoryview(hs[0])) == b"abcde" and hs[1] is None
    del h, hs
    assert s.remove_by_regex("^py/parts", force=True) == 2
    assert s.remove_all(force=True) >= 2
    assert s.is_exist("py/held") == 0
    s.close()
    assert s.health_check() == 1, "closed"


def test_a_dummy_client_refuses_sessions_with_a_code_and_says_why(port):
    s = dummy(port)
    assert s.batch_get_session_start(["py/s"]) == [-600]
    assert "setup_dummy" in crescent.last_error()
    assert s.batch_put_session_start(["py/s"], [10]) == [-600]
    assert s.batch_put_from_multi_buffer_ranges(["py/s"], [[]], [[]], [[]]) == [-600]
    assert s.batch_get_into_multi_buffer_ranges(["py/s"], [[]], [[]], [[]]) == [-600]
    assert s.batch_put_session_end(["py/s"]) == [-600]
    assert s.batch_put_session_revoke(["py/s"]) == [-600]
    assert s.batch_get_session_end(["py/s"]) == -600
    assert s.is_exist("py/s") == 0
    s.close()
