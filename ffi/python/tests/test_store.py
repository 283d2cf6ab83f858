"""MooncakeDistributedStore against a real master, with two clients: every method, Mooncake's
return conventions, zero copy with numpy, several Python threads, bad arguments."""

import os
import socket
import subprocess
import sys
import textwrap
import threading
import uuid

import numpy as np
import pytest

import crescent
from crescent.store import CrescentStore, MooncakeDistributedStore

from conftest import MiB, connect


def key(tag: str) -> str:
    return f"{tag}/{uuid.uuid4().hex}"


def pattern(n: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def test_names_match_mooncake():
    assert CrescentStore is MooncakeDistributedStore is crescent.MooncakeDistributedStore
    assert crescent.CrescentStore is MooncakeDistributedStore
    for name in [
        "setup", "put", "get", "put_batch", "get_batch", "register_buffer", "unregister_buffer", "put_from",
        "get_into", "batch_put_from", "batch_get_into", "is_exist", "batch_is_exist", "get_size", "remove",
        "remove_by_regex", "remove_all", "close",
    ]:
        assert callable(getattr(MooncakeDistributedStore, name)), name
        assert getattr(MooncakeDistributedStore, name).__doc__, f"{name} has no docstring"
    assert crescent.OBJECT_NOT_FOUND == -704 and crescent.status_name(-704) == "OBJECT_NOT_FOUND"


def test_a_lookup_client_set_up_with_zero_sizes_as_lmcache_does_sees_what_others_stored(master, store_a):
    """LMCache's scheduler-side lookup client: the dict form with sizes of "0" (a pure consumer,
    no local buffer), then existence checks of what the workers stored."""
    keys = ["lookup-0", "lookup-1"]
    for k in keys:
        assert store_a.put(k, b"chunk of " + k.encode()) == 0
    lookup = MooncakeDistributedStore()
    rc = lookup.setup({"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE",
                       "global_segment_size": "0", "local_buffer_size": "0", "protocol": "tcp",
                       "master_server_address": master.addr})
    assert rc == 0, crescent.last_error()
    assert lookup.batch_is_exist(keys + ["lookup-missing"]) == [1, 1, 0]
    assert lookup.is_exist("lookup-0") == 1
    assert lookup.close() == 0


def test_setup_forms_and_failures(master):
    s = MooncakeDistributedStore()
    rc = s.setup({"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE", "global_segment_size": "32MB",
                  "local_buffer_size": 8 * MiB, "protocol": "tcp", "master_server_addr": master.addr})
    assert rc == 0, crescent.last_error()
    assert s.get_hostname().startswith("127.0.0.1:")
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 16 * MiB, 16 * MiB, "tcp", "", master.addr) == \
        crescent.INVALID_PARAMS
    assert s.close() == 0
    assert s.close() == 0  # twice is fine
    # Mooncake's dict form requires local_hostname and metadata_server: a code, not an exception.
    assert MooncakeDistributedStore().setup({"master_server_addr": master.addr}) == crescent.INVALID_PARAMS
    assert "local_hostname" in crescent.last_error()
    with pytest.raises(TypeError):
        MooncakeDistributedStore().setup("127.0.0.1")  # metadata_server missing
    # A master that is not there: a status code, with the address in the message.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{sock.getsockname()[1]}"
    rc = MooncakeDistributedStore().setup("127.0.0.1", "P2PHANDSHAKE", 16 * MiB, 16 * MiB, "tcp", "", dead)
    assert rc == crescent.RPC_FAIL
    assert dead in crescent.last_error()
    rc = MooncakeDistributedStore().setup("127.0.0.1", "P2PHANDSHAKE", 16 * MiB, 16 * MiB, "carrier-pigeon", "",
                                          master.addr)
    assert rc == crescent.INVALID_PARAMS and "carrier-pigeon" in crescent.last_error()


def test_put_on_one_client_get_on_the_other(store_a, store_b):
    for i, n in enumerate([1, 4097, MiB + 3, 20 * MiB + 1]):  # the last one is larger than the staging buffer
        k = key("bytes")
        v = pattern(n, i)
        assert store_a.put(k, v) == 0, crescent.last_error()
        assert store_b.get(k) == v
        assert store_b.get_size(k) == n
    # Any buffer object is a value.
    for i, v in enumerate([bytearray(b"abc" * 100), memoryview(b"xyz" * 7), np.arange(1000, dtype=np.float32)]):
        k = key("obj")
        assert store_a.put(k, v) == 0
        assert store_b.get(k) == bytes(v)
    # Both hold the values in memory: no read went to another client's disk.
    assert store_a.get_offload_rpc_read_count() == store_b.get_offload_rpc_read_count() == 0
    # Missing: empty bytes, a negative size, the message names the key.
    k = key("missing")
    assert store_b.get(k) == b""
    assert k in crescent.last_error()
    assert store_b.get_size(k) == crescent.OBJECT_NOT_FOUND
    assert store_a.put(key("empty"), b"") == crescent.INVALID_PARAMS


def test_batches_of_bytes(store_a, store_b):
    keys = [key("batch") for _ in range(5)]
    values = [pattern(1000 * (i + 1), i) for i in range(5)]
    assert store_a.put_batch(keys, values) == 0
    assert store_b.get_batch(keys) == values
    got = store_b.get_batch([keys[0], key("missing"), keys[4]])
    assert got == [values[0], b"", values[4]]
    assert store_a.put_batch([key("x"), key("y")], [b"ok", b""]) == crescent.INVALID_PARAMS


def test_zero_copy_with_numpy(store_a, store_b):
    n = 4
    size = MiB + 5
    src = np.random.default_rng(1).integers(0, 256, n * size, dtype=np.uint8)
    dst = np.zeros(n * size, dtype=np.uint8)
    # A buffer object, and Mooncake's int address + size.
    assert store_a.register_buffer(src) == 0
    assert store_b.register_buffer(dst.ctypes.data, dst.nbytes) == 0
    keys = [key("zc") for _ in range(n)]
    # One by one: put_from with a numpy view and with an int address.
    assert store_a.put_from(keys[0], src[:size]) == 0
    assert store_a.put_from(keys[1], src.ctypes.data + size, size) == 0
    assert store_b.get_into(keys[0], dst[:size]) == size
    assert store_b.get_into(keys[1], dst.ctypes.data + size, size) == size
    assert np.array_equal(dst[: 2 * size], src[: 2 * size])
    # Batches: a status / a size per key.
    rs = store_a.batch_put_from(keys[2:], [src[2 * size: 3 * size], src.ctypes.data + 3 * size], [size, size])
    assert rs == [0, 0], crescent.last_error()
    dst[:] = 0
    views = [dst[i * size: (i + 1) * size] for i in range(n)]
    assert store_b.batch_get_into(keys, views) == [size] * n
    assert np.array_equal(dst, src)
    # Addresses as a numpy array (numpy integers are addresses, not buffers).
    dst[:] = 0
    addrs = dst.ctypes.data + np.arange(n, dtype=np.uint64) * np.uint64(size)
    assert store_b.batch_get_into(keys, addrs, [size] * n) == [size] * n
    assert np.array_equal(dst, src)
    # Per-key failures do not fail the others.
    missing = key("missing")
    rs = store_b.batch_get_into([keys[0], missing], [dst.ctypes.data, dst.ctypes.data + size], [size, size])
    assert rs == [size, crescent.OBJECT_NOT_FOUND]
    # A buffer smaller than the object: BUFFER_OVERFLOW, not a partial write.
    assert store_b.get_into(keys[0], dst[: size - 1]) == crescent.BUFFER_OVERFLOW
    # Unregistered memory is refused with a status (the int address is not trusted).
    other = np.zeros(size, dtype=np.uint8)
    assert store_b.get_into(keys[0], other) == crescent.INVALID_PARAMS
    assert "register_buffer" in crescent.last_error()
    assert store_a.put_from(key("bad"), 4096, 100) == crescent.INVALID_PARAMS
    # Unregistering: by object or by address; then zero-copy calls are refused.
    assert store_a.unregister_buffer(src) == 0
    assert store_b.unregister_buffer(dst.ctypes.data) == 0
    assert store_b.get_into(keys[0], dst[:size]) == crescent.INVALID_PARAMS
    assert store_b.unregister_buffer(dst.ctypes.data) == crescent.INVALID_PARAMS


def test_exist_size_and_removal(store_a, store_b):
    prefix = f"rm-{uuid.uuid4().hex[:8]}"
    keys = [f"{prefix}/{i}" for i in range(4)]
    assert store_a.put_batch(keys, [b"v" * (i + 1) for i in range(4)]) == 0
    assert store_b.is_exist(keys[0]) == 1
    assert store_b.is_exist(key("missing")) == 0
    assert store_b.batch_is_exist([keys[1], key("missing"), keys[3]]) == [1, 0, 1]
    assert store_b.get_size(keys[2]) == 3
    assert store_b.remove(keys[0]) == 0
    assert store_b.is_exist(keys[0]) == 0
    assert store_b.remove(keys[0]) == crescent.OBJECT_NOT_FOUND
    assert store_b.remove_by_regex(f"^{prefix}/") == 3
    assert store_b.batch_is_exist(keys) == [0, 0, 0, 0]
    assert store_b.remove_by_regex("(unclosed") == crescent.INVALID_PARAMS


def test_remove_all(master):
    s = connect(master)
    try:
        keys = [key("all") for _ in range(3)]
        assert s.put_batch(keys, [b"1", b"2", b"3"]) == 0
        assert s.remove_all() >= 3
        assert s.batch_is_exist(keys) == [0, 0, 0]
    finally:
        s.close()


def test_leased_object_cannot_be_removed(store_a, store_b):
    k = key("lease")
    assert store_a.put(k, b"leased") == 0
    assert store_b.get(k) == b"leased"  # grants a read lease (30 s on this master)
    assert store_a.remove(k) == crescent.OBJECT_HAS_LEASE


def test_many_python_threads(store_a, store_b):
    errors = []

    def worker(t: int):
        try:
            buf = np.zeros(64 * 1024, dtype=np.uint8)
            for i in range(10):
                k = key(f"thread{t}")
                v = pattern(64 * 1024, t * 100 + i)
                writer, reader = (store_a, store_b) if i % 2 else (store_b, store_a)
                assert writer.put(k, v) == 0, crescent.last_error()
                assert reader.get(k) == v
                assert reader.is_exist(k) == 1
                assert reader.batch_get_into([k], [buf.ctypes.data], [buf.nbytes]) == [crescent.INVALID_PARAMS]
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors


def test_second_process_reads_what_this_one_wrote(master, store_a):
    k = key("proc")
    v = pattern(3 * MiB, 42)
    assert store_a.put(k, v) == 0
    script = textwrap.dedent(f"""
        import hashlib, sys, crescent
        s = crescent.MooncakeDistributedStore()
        assert s.setup("127.0.0.1", "P2PHANDSHAKE", 16 << 20, 16 << 20, "tcp", "", {master.addr!r}) == 0
        v = s.get({k!r})
        print(len(v), hashlib.sha256(v).hexdigest())
        assert s.put({k!r} + "/back", b"from the other process") == 0
        s.close()
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ))
    assert out.returncode == 0, out.stderr
    import hashlib
    assert out.stdout.split() == [str(len(v)), hashlib.sha256(v).hexdigest()]
    # The other process closed: its segment (and the object on it) left the pool.
    assert store_a.is_exist(k + "/back") == 0


def test_bad_arguments_raise(store_a):
    arr = np.zeros(1024, dtype=np.uint8)
    with pytest.raises(TypeError):
        store_a.put(123, b"x")
    with pytest.raises(TypeError):
        store_a.put("k", 5)
    with pytest.raises(TypeError):
        store_a.put("k", "a str is not bytes")
    with pytest.raises(TypeError):
        store_a.get_batch("not-a-list")
    with pytest.raises(BufferError):
        store_a.get_into("k", b"read-only bytes")
    with pytest.raises((BufferError, ValueError)):  # numpy: "ndarray is not C-contiguous"
        store_a.put_from("k", np.zeros((8, 8), dtype=np.uint8)[:, ::2])
    # Sizes and lengths that do not fit: Mooncake's codes (per key in batches), with a message.
    assert store_a.put_from("k", arr, arr.nbytes + 1) == crescent.INVALID_PARAMS
    assert "larger than the buffer" in crescent.last_error()
    assert store_a.get_into("k", arr, 4096) == crescent.INVALID_PARAMS
    assert store_a.register_buffer(arr, 1 << 30) == crescent.INVALID_PARAMS
    assert store_a.register_buffer(arr.ctypes.data) == crescent.INVALID_PARAMS
    assert "size is required" in crescent.last_error()
    with pytest.raises(ValueError):
        store_a.put_from("k", -1, 10)
    assert store_a.batch_get_into(["a", "b"], [arr]) == [crescent.INVALID_PARAMS] * 2
    assert "2 keys but 1 buffers" in crescent.last_error()
    assert store_a.batch_put_from(["a"], [arr], [1, 2]) == [crescent.INVALID_PARAMS]
    assert store_a.put_batch(["a", "b"], [b"x"]) == crescent.INVALID_PARAMS
    assert "values" in crescent.last_error()
    with pytest.raises(TypeError):
        store_a.batch_get_into(["a"], [object()])
    # Nothing was left registered or broken by those calls.
    assert store_a.put(key("after"), b"still fine") == 0


def test_calls_before_setup_and_after_close(master):
    s = MooncakeDistributedStore()
    # Mooncake's bindings answer INVALID_PARAMS ("Client is not initialized").
    assert s.put("k", b"v") == crescent.INVALID_PARAMS
    assert "setup" in crescent.last_error()
    assert s.get("k") == b""
    assert s.is_exist("k") == crescent.INVALID_PARAMS
    assert s.batch_is_exist(["a", "b"]) == [crescent.INVALID_PARAMS] * 2
    assert s.get_batch(["a"]) == [b""]
    assert s.batch_get_into(["a"], [0], [1]) == [crescent.INVALID_PARAMS]
    assert s.health_check() == 1
    assert s.close() == 0
    c = connect(master)
    k = key("closing")
    assert c.put(k, b"v") == 0
    with c:
        pass  # the context manager closes it
    assert c.get(k) == b""
    assert c.remove_all() == crescent.INVALID_PARAMS
    assert c.health_check() == 1


def test_stubs_cover_the_module():
    import ast
    import pathlib

    stub = pathlib.Path(crescent.__file__).with_name("_crescent.pyi")
    tree = ast.parse(stub.read_text())
    classes = {n.name: {f.name for f in n.body if isinstance(f, ast.FunctionDef)}
               for n in tree.body if isinstance(n, ast.ClassDef)}
    for cls in (crescent._crescent.MooncakeDistributedStore,):  # the engine's classes: test_engine.py
        public = {m for m in dir(cls) if not m.startswith("_")}
        assert public <= classes[cls.__name__], public - classes[cls.__name__]
    assert (stub.parent / "py.typed").exists()
