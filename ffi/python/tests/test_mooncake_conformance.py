"""Conformance with Mooncake's Python binding, through the `mooncake` alias package: method by
method, the behaviours Mooncake's own tests of its binding check (mooncake-wheel/tests at
3b5a5941), in this project's words, against a real crescent-master with a short read lease
(as Mooncake's tests sleep out the lease before removing)."""

import asyncio
import ctypes
import os
import pathlib
import socket
import struct
import subprocess
import sys
import textwrap
import time
import uuid

import numpy as np
import pytest

from mooncake.store import (
    MooncakeDistributedStore,
    MooncakeDistributedStoreAsync,
    ReplicaStatus,
    ReplicateConfig,
    SoftPinAction,
)

from conftest import MiB, Master, master_fixture

INVALID_PARAMS = -600
LEASE_S = 1.0


def key(tag: str) -> str:
    return f"mc/{tag}/{uuid.uuid4().hex}"


def setup_args(master, host="127.0.0.1", segment=64 * MiB, buffer=16 * MiB):
    return (host, "P2PHANDSHAKE", segment, buffer, "tcp", "", master.addr)


def connect(master, **kw) -> MooncakeDistributedStore:
    s = MooncakeDistributedStore()
    assert s.setup(*setup_args(master, **kw)) == 0
    return s


master = master_fixture("--lease-ttl-ms", str(int(LEASE_S * 1000)), "--allocation-strategy", "local-first")


@pytest.fixture(scope="module")
def store(master):
    s = connect(master, host="localhost")
    yield s
    s.close()


def after_lease():
    time.sleep(LEASE_S + 0.3)


# ---- names ----

def test_import_structure_matches_mooncakes():
    import mooncake
    import mooncake.engine
    import mooncake.store
    from mooncake.async_store import MooncakeDistributedStoreAsync as A

    assert mooncake.backend == "crescent"
    assert mooncake.engine.TransferEngine is not None
    assert A is MooncakeDistributedStoreAsync
    config = ReplicateConfig()
    config.group_ids = ["group-a", ""]
    assert config.group_ids == ["group-a", ""]
    config.group_ids = None
    assert config.group_ids is None
    # Module-level enum values, as pybind's export_values() gives them.
    assert mooncake.store.COMPLETE == ReplicaStatus.COMPLETE and mooncake.store.KVCACHE is not None


def test_the_alias_refuses_to_import_next_to_a_real_mooncake(tmp_path):
    # A distribution named like Mooncake's wheel on the path: `import mooncake` must not guess.
    info = tmp_path / "mooncake_transfer_engine-0.3.12.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mooncake-transfer-engine\nVersion: 0.3.12\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", "import mooncake"], capture_output=True, text=True, env=env,
                         timeout=60)
    assert out.returncode != 0
    assert "uninstall" in out.stderr and "mooncake-transfer-engine" in out.stderr


# ---- ReplicateConfig ----

def test_replicate_config_fields_and_soft_pin_ttl():
    c = ReplicateConfig()
    assert (c.replica_num, c.soft_pin_action, c.preferred_segment, c.soft_pin_ttl_ms) == (
        1, SoftPinAction.PRESERVE, "", None)
    assert (c.with_hard_pin, c.preferred_segments, c.prefer_alloc_in_same_node) == (False, [], False)
    c.replica_num, c.soft_pin_action, c.preferred_segment = 3, SoftPinAction.ENABLE, "node1:12345"
    assert (c.replica_num, c.soft_pin_action, c.preferred_segment) == (3, SoftPinAction.ENABLE, "node1:12345")
    assert "3" in str(c)
    c.soft_pin_ttl_ms = 1000
    assert c.soft_pin_ttl_ms == 1000
    c.soft_pin_ttl_ms = None
    assert c.soft_pin_ttl_ms is None
    for bad in (-1, 1 << 64):
        with pytest.raises(TypeError):
            c.soft_pin_ttl_ms = bad


def test_soft_pin_actions_are_checked_like_mooncakes_master(store):
    k, v = key("softpin"), b"soft-pin forwarding"
    enable = ReplicateConfig()
    enable.soft_pin_action = SoftPinAction.ENABLE
    enable.soft_pin_ttl_ms = 1000
    assert store.put(k, v, enable) == 0
    for action in (SoftPinAction.PRESERVE, SoftPinAction.DISABLE):
        c = ReplicateConfig()
        c.soft_pin_action = action
        c.soft_pin_ttl_ms = 1000
        assert store.upsert(k, v, c) == INVALID_PARAMS, action
    assert store.upsert(k, v) == 0
    disable = ReplicateConfig()
    disable.soft_pin_action = SoftPinAction.DISABLE
    assert store.upsert(k, v, disable) == 0
    assert store.get(k) == v


# ---- setup ----

def test_setup_dict_form_sizes_and_required_keys(master):
    def conf(**over):
        d = {"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE", "global_segment_size": "16MB",
             "local_buffer_size": "16 MB", "protocol": "tcp", "rdma_devices": "", "master_server_addr": master.addr}
        d.update(over)
        return d

    s = MooncakeDistributedStore()
    assert s.setup(conf()) == 0
    k = key("dict")
    assert s.put(k, b"human readable sizes") == 0
    assert s.get(k) == b"human readable sizes"
    assert s.close() == 0
    for bad in (conf(global_segment_size="50%"), conf(global_segment_size=512), {"metadata_server": "x"},
                conf(client_http_port="x")):
        assert MooncakeDistributedStore().setup(bad) != 0, bad


def test_setup_takes_mooncakes_eight_positional_arguments_and_keywords(master):
    s = MooncakeDistributedStore()
    assert s.setup(*setup_args(master), None) == 0
    assert s.close() == 0
    s = MooncakeDistributedStore()
    rc = s.setup(*setup_args(master), engine=None, enable_ssd_offload=False, ssd_offload_path="", tenant_id="default",
                 enable_client_http_server=False, client_http_port=9300)
    assert rc == 0
    assert s.close() == 0
    # Codes, not exceptions, for what Mooncake answers with a code.
    for args, kw in [
        (setup_args(master, segment=-1), {}),
        (setup_args(master, buffer=100), {}),
        (setup_args(master, segment="12XB"), {}),
        (setup_args(master), {"tenant_id": "_reserved"}),
        (setup_args(master), {"enable_client_http_server": True, "client_http_port": 70000}),
    ]:
        fresh = MooncakeDistributedStore()
        assert fresh.setup(*args, **kw) == INVALID_PARAMS, (args, kw)
        assert fresh.health_check() == 1
    with pytest.raises(TypeError):
        MooncakeDistributedStore().setup(*setup_args(master), engine=object())
    assert MooncakeDistributedStore().setup_dummy(16 * MiB, 16 * MiB, "127.0.0.1:50052") == -1
    assert MooncakeDistributedStore().init_all("tcp", "") == -1


def test_setup_shares_a_transfer_engine_given_as_its_eighth_argument(master, store):
    from mooncake.engine import TransferEngine

    te = TransferEngine()
    # Not initialized yet: a code, as for any bad argument.
    assert MooncakeDistributedStore().setup(*setup_args(master), te) == INVALID_PARAMS
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    for engine in (te, te.get_engine()):
        s = MooncakeDistributedStore()
        assert s.setup(*setup_args(master), engine) == 0
        # The store serves from the engine it was given: its segment is that engine's.
        assert s.get_hostname() == te.get_segment_name()
        k = key("shared-engine")
        value = os.urandom(300_000)
        assert s.put(k, value) == 0
        assert store.get(k) == value
        assert s.close() == 0
    # The engine outlives the stores that shared it.
    buf = np.zeros(4096, dtype=np.uint8)
    assert te.register_memory(buf.ctypes.data, buf.nbytes) == 0
    assert te.unregister_memory(buf.ctypes.data) == 0


def test_get_hostname_picks_a_port_in_mooncakes_range(store):
    hostname = store.get_hostname()
    assert hostname.startswith("localhost:")
    assert 12300 <= int(hostname.split(":")[1]) <= 14300


def test_zero_local_buffer_fails_byte_puts_but_not_zero_copy(master):
    s = connect(master, buffer=0)
    try:
        k = key("zerobuf")
        assert s.put(k, b"test_zero_buffer_value") != 0
        assert s.is_exist(k) == 0
        buf = np.frombuffer(b"zero copy still works" * 10, dtype=np.uint8).copy()
        assert s.register_buffer(buf) == 0
        assert s.put_from(k, buf) == 0
        out = np.zeros_like(buf)
        assert s.register_buffer(out) == 0
        assert s.get_into(k, out) == buf.nbytes and bytes(out) == bytes(buf)
    finally:
        s.close()


def test_pure_consumer_contributes_no_segment(master, store):
    consumer = connect(master, segment=0)
    try:
        k = key("consumer")
        assert consumer.put(k, b"lands elsewhere") == 0
        assert store.get(k) == b"lands elsewhere"
        replicas = consumer.get_replica_desc(k)
        assert replicas and replicas[0].get_memory_descriptor().buffer_descriptor.transport_endpoint == \
            store.get_hostname()
    finally:
        consumer.close()


def test_close_and_setup_again(master):
    s = connect(master)
    k = key("teardown")
    assert s.put(k, b"Hello, World!") == 0
    assert s.close() == 0
    assert s.health_check() == 1
    assert s.setup(*setup_args(master)) == 0
    assert s.get(k) == b""  # its segment left with the first client
    assert s.put(k, b"Hello, World!") == 0
    assert s.get(k) == b"Hello, World!"
    assert s.close() == 0


def test_health_check_follows_the_master():
    m = Master()
    s = connect(m)
    try:
        assert s.health_check() == 0
        m.stop()
        deadline = time.monotonic() + 15
        while s.health_check() == 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert s.health_check() == 2
    finally:
        s.close()
    assert s.health_check() == 1


# ---- puts, gets, existence, removal ----

def test_put_get_exist_and_idempotent_put(store):
    k, v = key("basic"), b"Hello, World!"
    assert store.put(k, v) == 0
    assert store.get_size(k) == len(v)
    assert store.get(k) == v
    assert store.put(k, b"another value") == 0  # exists: 0, and the value stays
    assert store.get(k) == v
    after_lease()
    assert store.remove(k) == 0
    assert store.is_exist(k) == 0


def test_batch_is_exist(store):
    keys = [key("exist") for _ in range(20)]
    for k in keys[:10]:
        assert store.put(k, b"Hello, Batch World!") == 0
    assert store.batch_is_exist(keys) == [1] * 10 + [0] * 10
    assert store.batch_is_exist([]) == []
    assert store.batch_is_exist([keys[0]]) == [1]
    assert store.batch_is_exist(["non_existent_key"]) == [0]


def test_zero_copy_with_ctypes_buffers(store):
    data = b"Hello, Zero-Copy World! " * 1000
    k = key("zerocopy")
    size = len(data) + 1024
    buf = (ctypes.c_ubyte * size)()
    ptr = ctypes.addressof(buf)
    assert store.register_buffer(ptr, size) == 0
    ctypes.memmove(buf, data, len(data))
    assert store.put_from(k, ptr, len(data)) == 0
    assert store.get(k) == data
    ctypes.memset(buf, 0, size)
    assert store.get_into(k, ptr, size) == len(data)
    assert bytes(buf[: len(data)]) == data
    small = (ctypes.c_ubyte * (len(data) // 2))()
    assert store.register_buffer(ctypes.addressof(small), len(data) // 2) == 0
    assert store.get_into(k, ctypes.addressof(small), len(data) // 2) < 0
    assert store.put_from(key("empty"), ptr, 0) == 0  # Mooncake: an empty put_from is a no-op success
    after_lease()
    assert store.unregister_buffer(ptr) == 0
    assert store.unregister_buffer(ctypes.addressof(small)) == 0
    assert store.remove(k) == 0


def test_batch_zero_copy_calls_and_mismatched_lists(store):
    values = [b"Batch Put Data 1! " * 100, b"Batch Put Data 2! " * 200, b"Batch Put Data 3! " * 150]
    keys = [key("bpf") for _ in values]
    spacing = MiB
    big = (ctypes.c_ubyte * (spacing * 3))()
    base = ctypes.addressof(big)
    assert store.register_buffer(base, spacing * 3) == 0
    ptrs = [base + i * spacing for i in range(3)]
    for p, v in zip(ptrs, values):
        ctypes.memmove(p, v, len(v))
    assert store.batch_put_from(keys, ptrs, [len(v) for v in values]) == [0, 0, 0]
    assert [store.get(k) for k in keys] == values
    assert all(r < 0 for r in store.batch_put_from(keys[:2], ptrs, [spacing] * 3))
    assert len(store.batch_put_from(keys[:2], ptrs, [spacing] * 3)) == 2
    assert store.batch_put_from([], [], []) == []
    ctypes.memset(base, 0, spacing * 3)
    assert store.batch_get_into(keys, ptrs, [spacing] * 3) == [len(v) for v in values]
    assert [bytes(big[i * spacing: i * spacing + len(v)]) for i, v in enumerate(values)] == values
    bad = store.batch_get_into(keys[:2], ptrs, [spacing] * 3)
    assert len(bad) == 2 and all(r < 0 for r in bad)
    assert store.batch_get_into([], [], []) == []
    assert store.unregister_buffer(base) == 0


def test_batch_get_buffer(store):
    values = [b"Batch Buffer Data 1! " * 100, b"Batch Buffer Data 2! " * 200]
    keys = [key("bgb") for _ in values]
    for k, v in zip(keys, values):
        assert store.put(k, v) == 0
    handles = store.batch_get_buffer(keys)
    assert [h.size() for h in handles] == [len(v) for v in values]
    assert [bytes(h) for h in handles] == values
    assert len(handles[0]) == len(values[0]) and handles[0].ptr() != 0
    mixed = store.batch_get_buffer([keys[0], "non_existent_key"])
    assert bytes(mixed[0]) == values[0] and mixed[1] is None
    assert store.batch_get_buffer([]) == []
    assert store.get_buffer("definitely_non_existent_key") is None
    assert np.frombuffer(store.get_buffer(keys[1]), dtype=np.uint8).tobytes() == values[1]


def test_put_batch_upserts_and_metadata_puts(store):
    keys = [key("pb") for _ in range(3)]
    assert store.put_batch(keys, [b"a", b"bb", b"ccc"]) == 0
    assert store.get_batch(keys) == [b"a", b"bb", b"ccc"]
    assert store.put_batch(keys, [b"x"]) == INVALID_PARAMS
    fresh = [key("ub") for _ in range(2)]
    assert store.upsert_batch(fresh, [b"one", b"two"]) == 0
    assert store.upsert_batch(fresh, [b"three", b"four, longer"]) == 0
    assert store.get_batch(fresh) == [b"three", b"four, longer"]
    buf = np.frombuffer(b"META" + b"payload" * 100, dtype=np.uint8).copy()
    assert store.register_buffer(buf) == 0
    k = key("upfrom")
    assert store.upsert_from(k, buf.ctypes.data + 4, 700) == 0
    assert store.batch_upsert_from([k], [buf.ctypes.data], [4]) == [0]
    assert store.get(k) == b"META"
    k = key("meta")
    assert store.put_from_with_metadata(k, buf.ctypes.data + 4, buf.ctypes.data, 700, 4) == 0
    assert store.get(k) == b"META" + b"payload" * 100
    other = np.zeros(16, dtype=np.uint8)
    assert store.put_from_with_metadata(key("meta"), other.ctypes.data, buf.ctypes.data, 16, 4) == INVALID_PARAMS
    assert store.unregister_buffer(buf) == 0


def test_removal_with_force_regex_all_and_batches(master):
    s = connect(master)
    try:
        prefix = f"rm{uuid.uuid4().hex[:6]}"
        keys = [f"{prefix}/{i}" for i in range(4)]
        assert s.put_batch(keys, [b"v"] * 4) == 0
        assert s.get(keys[0]) == b"v"  # leased now
        assert s.remove(keys[0]) == -706
        assert s.remove(keys[0], force=True) == 0
        assert s.batch_remove([keys[1], "missing-key"]) == [0, -704]
        assert s.get(keys[2]) == b"v"
        assert s.remove_by_regex(regex_pattern=f"^{prefix}/", force=True) == 2
        assert s.put_batch(keys, [b"w"] * 4) == 0
        assert s.get(keys[0]) == b"w"
        assert s.remove_all(force=True) >= 4
        assert s.batch_is_exist(keys) == [0] * 4
    finally:
        s.close()


def test_replica_descriptors(store):
    k, v = key("desc"), b"d" * 5000
    assert store.put(k, v) == 0
    replicas = store.get_replica_desc(k)
    assert len(replicas) == 1
    r = replicas[0]
    assert r.is_memory_replica() and not r.is_disk_replica() and not r.is_local_disk_replica()
    assert r.status == ReplicaStatus.COMPLETE
    d = r.get_memory_descriptor().buffer_descriptor
    assert (d.size, d.transport_endpoint) == (len(v), store.get_hostname())
    assert store.get_replica_desc("missing-key") == []
    got = store.batch_get_replica_desc([k, "missing-key"])
    assert list(got) == [k] and got.get(k)[0].is_memory_replica()


def test_replicate_config_reaches_every_put(master):
    a, b = connect(master), connect(master)
    try:
        c = ReplicateConfig()
        c.replica_num = 2
        buf = np.arange(4096, dtype=np.uint8)
        assert a.register_buffer(buf) == 0
        keys = [key("rep") for _ in range(4)]
        assert a.put(keys[0], b"x" * 4096, c) == 0
        assert a.put_batch([keys[1]], [b"y" * 4096], c) == 0
        assert a.put_from(keys[2], buf.ctypes.data, 4096, c) == 0
        assert a.batch_put_from([keys[3]], [buf.ctypes.data], [4096], c) == [0]
        for k in keys:
            assert len(a.get_replica_desc(k)) == 2, k
        c.prefer_alloc_in_same_node = True
        assert a.put(key("same-node"), b"z", c) == INVALID_PARAMS
        assert a.unregister_buffer(buf) == 0
    finally:
        a.close()
        b.close()


# ---- tensors, in Mooncake's layout ----

def test_put_get_tensor_numpy(store):
    for a in [np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32), np.array([1, 2, 3, 4], dtype=np.int32),
              np.array([True, False, False, True]), np.random.default_rng(0).random(1000, dtype=np.float32),
              np.arange(4, dtype=np.float32).reshape(2, 2), np.arange(8, dtype=np.int64).reshape(2, 2, 2)]:
        k = key("tensor")
        assert store.put_tensor(k, a) == 0
        got = store.get_tensor(k)
        got = got.numpy() if hasattr(got, "numpy") else got
        assert got.dtype == a.dtype and got.shape == a.shape and np.array_equal(got, a)
    assert store.get_tensor(key("missing")) is None
    assert store.put_tensor(key("bad"), "not a tensor") == INVALID_PARAMS


def test_tensor_values_are_mooncakes_layout(store):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    k = key("layout")
    assert store.put_tensor(k, a) == 0
    raw = store.get(k)
    assert len(raw) == 304 + a.nbytes
    magic, version, header_size, dtype, ndim, layout, _, offset, nbytes = struct.unpack_from("<IHHiiIIQQ", raw)
    assert (magic, version, header_size, dtype, ndim, layout, offset, nbytes) == (0x4D4F4F4E, 1, 304, 0, 2, 0, 304, 24)
    assert struct.unpack_from("<8q", raw, 40) == (2, 3, -1, -1, -1, -1, -1, -1)
    assert raw[304:] == a.tobytes()
    # A value written by hand in that layout (as Mooncake writes it) reads back as a tensor.
    shape = (3,)
    header = struct.pack("<IHHiiIIQQ", 0x4D4F4F4E, 1, 304, 8, 1, 0, 0, 304, 24)
    header += struct.pack("<8q8qII", *(shape + (-1,) * 7), *(shape + (-1,) * 7), 0, 0) + bytes(128)
    k2 = key("byhand")
    assert store.put(k2, header + np.array([7, 8, 9], dtype=np.int64).tobytes()) == 0
    got = store.get_tensor(k2)
    assert list(np.asarray(got)) == [7, 8, 9]
    # A value that is not a tensor: None, not a crash.
    k3 = key("nottensor")
    assert store.put(k3, b"\x00" * 400) == 0
    assert store.get_tensor(k3) is None


def test_batch_tensors_upserts_and_zero_sized(store):
    keys = [key("bt") for _ in range(2)]
    tensors = [np.arange(16, dtype=np.float32).reshape(4, 4), np.arange(24, dtype=np.int64).reshape(2, 3, 4)]
    assert store.batch_put_tensor(keys, tensors) == [0, 0]
    for k, t in zip(keys, tensors):
        assert np.array_equal(np.asarray(store.get_tensor(k)), t)
    assert [np.asarray(t).shape for t in store.batch_get_tensor(keys)] == [(4, 4), (2, 3, 4)]
    ukeys = [key("bu") for _ in range(2)]
    assert store.batch_upsert_tensor(ukeys, [np.arange(8, dtype=np.float32), np.arange(12, dtype=np.int32)]) == [0, 0]
    assert store.upsert_tensor(ukeys[0], np.ones(3, dtype=np.float64)) == 0
    assert np.array_equal(np.asarray(store.get_tensor(ukeys[0])), np.ones(3))
    assert store.batch_put_tensor(keys, tensors[:1]) == [INVALID_PARAMS, INVALID_PARAMS]
    c = ReplicateConfig()
    assert store.pub_tensor(key("pub"), tensors[0], c) == 0
    for shape, dtype in [((0,), np.float32), ((0, 4096), np.float16), ((1, 0), np.int64)]:
        k = key("zero")
        z = np.empty(shape, dtype=dtype)
        assert store.put_tensor(k, z) == 0
        got = np.asarray(store.get_tensor(k))
        assert got.shape == shape and got.dtype == dtype and got.size == 0


def test_tensor_into_and_from_registered_memory(store):
    t = np.arange(100, dtype=np.int16).reshape(10, 10)
    k, k2 = key("into"), key("from")
    assert store.put_tensor(k, t) == 0
    size = 4096
    buf = (ctypes.c_ubyte * size)()
    ptr = ctypes.addressof(buf)
    assert store.register_buffer(ptr, size) == 0
    total = store.get_size(k)
    assert total == 304 + t.nbytes
    got = store.get_tensor_into(k, ptr, size)
    assert np.array_equal(np.asarray(got), t)
    assert store.put_tensor_from(k2, ptr, total) == 0
    assert np.array_equal(np.asarray(store.get_tensor(k2)), t)
    assert store.batch_get_tensor_into([k], [ptr], [size])[0] is not None
    assert store.batch_get_tensor_into([k, k2], [ptr], [size]) == [INVALID_PARAMS] * 2
    assert store.put_tensor_from(key("junk"), ptr, 100) == INVALID_PARAMS
    ctypes.memset(ptr, 0, 304)
    assert store.put_tensor_from(key("junk"), ptr, total) == INVALID_PARAMS
    assert store.get_tensor_into_cuda(k, None) == INVALID_PARAMS
    assert store.unregister_buffer(ptr) == 0


def test_torch_tensors_when_torch_is_there(store):
    torch = pytest.importorskip("torch")
    for t in [torch.tensor([1.0, 2.0], dtype=torch.float32), torch.arange(6, dtype=torch.bfloat16).reshape(2, 3),
              torch.tensor([True, False])]:
        k = key("torch")
        assert store.put_tensor(k, t) == 0
        got = store.get_tensor(k)
        assert got.dtype == t.dtype and torch.equal(got, t)


def test_dlpack_and_buffer_objects_are_tensors(store):
    k = key("dlpack")
    a = np.arange(5, dtype=np.uint16)

    class OnlyDlpack:
        def __dlpack__(self, *args, **kwargs):
            return a.__dlpack__(*args, **kwargs)

        def __dlpack_device__(self):
            return a.__dlpack_device__()

    assert store.put_tensor(k, OnlyDlpack()) == 0
    assert np.array_equal(np.asarray(store.get_tensor(k)), a)
    k = key("bufobj")
    assert store.put_tensor(k, bytearray(b"\x01\x02\x03")) == 0
    assert list(np.asarray(store.get_tensor(k))) == [1, 2, 3]


# ---- subclassing and asyncio ----

def test_mooncakes_async_subclass_pattern_and_asyncstore(master):
    from crescent.store import AsyncStore

    s = MooncakeDistributedStoreAsync()
    assert s.setup(*setup_args(master)) == 0

    async def main():
        k = key("async")
        assert await s.async_put(k, b"awaited") == 0
        got = await asyncio.gather(*(s.async_get(k) for _ in range(4)))
        assert got == [b"awaited"] * 4
        wrapped = AsyncStore(s)
        assert await wrapped.is_exist(k) == 1
        with pytest.raises(AttributeError):
            s.not_a_method

    try:
        asyncio.run(main())
    finally:
        s.close()


def test_a_second_process_through_the_alias(master, store):
    k = key("proc")
    assert store.put_tensor(k, np.arange(10, dtype=np.float64)) == 0
    script = textwrap.dedent(f"""
        import numpy as np
        from mooncake.store import MooncakeDistributedStore
        s = MooncakeDistributedStore()
        assert s.setup("127.0.0.1", "P2PHANDSHAKE", 16 << 20, 16 << 20, "tcp", "", {master.addr!r}) == 0
        print(np.asarray(s.get_tensor({k!r})).sum())
        s.close()
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert float(out.stdout.strip()) == 45.0


def test_ports_of_mooncakes_range_are_free_to_pick():
    # The range is configurable as in Mooncake; a client picks within it.
    lo = 20000 + (os.getpid() % 1000) * 10
    m = Master()
    try:
        script = textwrap.dedent(f"""
            from mooncake.store import MooncakeDistributedStore
            s = MooncakeDistributedStore()
            assert s.setup("127.0.0.1", "P2PHANDSHAKE", 16 << 20, 16 << 20, "tcp", "", {m.addr!r}) == 0
            print(s.get_hostname())
            s.close()
        """)
        env = dict(os.environ, MC_STORE_CLIENT_MIN_PORT=str(lo), MC_STORE_CLIENT_MAX_PORT=str(lo + 9))
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
        assert out.returncode == 0, out.stderr
        assert lo <= int(out.stdout.strip().rsplit(":", 1)[1]) <= lo + 9
    finally:
        m.stop()
