"""The calls over the store client's scatter/gather pipeline, through the `mooncake` alias:
multi-buffer puts and gets, ranged gets, puts in parts, and `get_buffer`'s handle over the
client's own registered memory (no copy after the one read). Bad input gets Mooncake's codes
(INVALID_PARAMS, -600) per key or per range and a message, never an exception or a crash."""

import uuid

import numpy as np
import pytest

import crescent
from mooncake.store import MooncakeDistributedStore

from conftest import MiB, connect, pattern, registered

INVALID = -600
NOT_FOUND = -704


def key(tag: str) -> str:
    return f"{tag}/{uuid.uuid4().hex}"


def test_multi_buffer_values_come_back_whole_into_another_layout(store_a, store_b):
    # Per key, four layer buffers (K and V of two layers) in separate registered arrays.
    layers = [registered(store_a, 8 * 4096) for _ in range(4)]
    for i, layer in enumerate(layers):
        layer[:] = pattern(layer.nbytes, 40 + i)
    keys = [key("mb") for _ in range(3)]
    ptrs = [[layer.ctypes.data + b * 4096 for layer in layers] for b in range(3)]
    sizes = [[4096] * 4 for _ in range(3)]
    assert store_a.batch_put_from_multi_buffers(keys, ptrs, sizes) == [0, 0, 0]
    value = [np.concatenate([layer[b * 4096:(b + 1) * 4096] for layer in layers]) for b in range(3)]
    assert bytes(store_b.get(keys[1])) == value[1].tobytes()
    # Into the other client's layout: two buffers per key, one 8 KiB array per half.
    for reader in (store_b, store_a):
        halves = [registered(reader, 3 * 8192, 0xEE) for _ in range(2)]
        dst = [[h.ctypes.data + b * 8192 for h in halves] for b in range(3)]
        got = reader.batch_get_into_multi_buffers(keys, dst, [[8192, 8192]] * 3)
        assert got == [4 * 4096] * 3
        for b in range(3):
            assert np.array_equal(np.concatenate([h[b * 8192:(b + 1) * 8192] for h in halves]), value[b])
        # Buffers may hold more than the value: the rest is left alone.
        big = registered(reader, 20000, 0x11)
        assert reader.batch_get_into_multi_buffers([keys[0]], [[big.ctypes.data, big.ctypes.data + 10000]],
                                                   [[10000, 10000]], True) == [16384]
        assert np.array_equal(big[:16384], value[0]) and (big[16384:] == 0x11).all()
        for h in halves + [big]:
            assert reader.unregister_buffer(h.ctypes.data) == 0
    # A put of existing keys keeps the values and returns 0.
    assert store_a.batch_put_from_multi_buffers(keys[:1], [ptrs[1]], [sizes[1]]) == [0]
    assert bytes(store_b.get(keys[0])) == value[0].tobytes()
    # Registered by address: released here, before numpy frees (and may reuse) the memory.
    for layer in layers:
        assert store_a.unregister_buffer(layer.ctypes.data) == 0


def test_multi_buffer_bad_input_is_invalid_params_per_key(store_a, store_b):
    src = registered(store_a, 8192)
    src[:] = pattern(8192, 9)
    k = [key("mbbad") for _ in range(2)]
    p = src.ctypes.data
    # Lists of other lengths: every key refused, nothing stored.
    assert store_a.batch_put_from_multi_buffers(k, [[p]], [[100]]) == [INVALID, INVALID]
    assert store_a.batch_put_from_multi_buffers(k, [[p], [p]], [[100], [100, 100]]) == [INVALID, INVALID]
    assert "buffers and 2 sizes" in crescent.last_error()
    assert store_a.batch_is_exist(k) == [0, 0]
    # Memory that is not registered, or nothing at all: that key alone.
    heap = np.zeros(4096, dtype=np.uint8)
    assert store_a.batch_put_from_multi_buffers(k, [[heap.ctypes.data], [p, p + 100]], [[4096], [100, 200]]) == \
        [INVALID, 0]
    assert "not registered" in crescent.last_error()
    assert store_a.batch_put_from_multi_buffers([key("e")], [[]], [[]]) == [INVALID]
    assert store_a.batch_is_exist(k) == [0, 1]
    # Gets: too small, not registered, missing, mismatched per key; the others still read.
    dst = registered(store_b, 1000)
    got = store_b.batch_get_into_multi_buffers(
        [k[1], k[1], k[1], "mbbad/absent", k[1]],
        [[dst.ctypes.data], [heap.ctypes.data], [dst.ctypes.data, dst.ctypes.data + 300], [dst.ctypes.data], [0]],
        [[299], [300], [100, 200], [300], []])
    assert got == [INVALID, INVALID, 300, NOT_FOUND, INVALID]
    assert np.array_equal(dst[:100], src[:100]) and np.array_equal(dst[300:500], src[100:300])
    assert store_b.batch_get_into_multi_buffers(k, [[dst.ctypes.data]], [[300], [300]]) == [INVALID, INVALID]
    # A buffer object with a size larger than itself.
    small = bytearray(10)
    assert store_b.batch_get_into_multi_buffers([k[1]], [[small]], [[300]]) == [INVALID]
    assert store_b.unregister_buffer(dst.ctypes.data) == 0
    assert store_a.unregister_buffer(src.ctypes.data) == 0


def test_ranges_of_values_into_buffers_with_a_result_per_range(store_a, store_b):
    value = pattern(100_000, 12)
    k1, k2 = key("r"), key("r")
    assert store_a.put(k1, value.tobytes()) == 0
    assert store_a.put(k2, value[:500].tobytes()) == 0
    out = [registered(store_b, 4096), registered(store_b, 4096)]
    res = store_b.get_into_ranges(
        [o.ctypes.data for o in out],
        [[k1, k2], [k1]],
        [[[0, 1000], [2000]], [[100]]],
        [[[99_000, 10], [400]], [[50_000]]],
        [[[1000, 50], [100]], [[3000]]],
    )
    assert res == [[[1000, 50], [100]], [[3000]]]
    assert np.array_equal(out[0][:1000], value[99_000:])
    assert np.array_equal(out[0][1000:1050], value[10:60])
    assert np.array_equal(out[0][2000:2100], value[400:500])
    assert np.array_equal(out[1][100:3100], value[50_000:53_000])
    # A range past its value's end, or outside registered memory: that range alone; a
    # missing key: each of its ranges.
    res = store_b.get_into_ranges(
        [out[0].ctypes.data],
        [[k2, "r/absent"]],
        [[[0, 100, 4000], [0]]],
        [[[450, 0, 0], [0]]],
        [[[51, 100, 200], [10]]],
    )
    assert res == [[[INVALID, 100, INVALID], [NOT_FOUND]]]
    assert np.array_equal(out[0][100:200], value[:100])
    # Shapes that do not agree: INVALID_PARAMS in Mooncake's shape of the results.
    assert store_b.get_into_ranges([out[0].ctypes.data], [[k1]], [[[0, 1]]], [[[0]]], [[[1, 1]]]) == [[[INVALID, INVALID]]]
    assert store_b.get_into_ranges([out[0].ctypes.data, 0], [[k1]], [[[0]]], [[[0]]], [[[1]]]) == \
        [[[INVALID]], [[INVALID]]]
    for o in out:
        assert store_b.unregister_buffer(o.ctypes.data) == 0


def test_put_parts_stores_the_concatenation_and_upsert_parts_replaces(store_a, store_b):
    meta = np.arange(28, dtype=np.uint8)
    kv = pattern(3 * MiB + 7, 5)
    k = key("parts")
    assert store_a.put_parts(k, meta.tobytes(), memoryview(kv)) == 0
    assert bytes(store_b.get(k)) == meta.tobytes() + kv.tobytes()
    # A put of an existing key keeps the value; upsert_parts replaces it (a key nobody read:
    # a reader's lease would refuse the replacement).
    assert store_b.put_parts(k, b"other") == 0
    assert store_b.get_size(k) == 28 + kv.nbytes
    k2 = key("parts")
    assert store_b.put_parts(k2, b"old") == 0
    assert store_b.upsert_parts(k2, b"new ", bytearray(b"value")) == 0
    assert bytes(store_a.get(k2)) == b"new value"
    assert store_b.upsert_parts(k, b"leased") == -706
    # No bytes: success, nothing stored (Mooncake's warning); not a buffer: TypeError.
    empty = key("parts")
    assert store_a.put_parts(empty) == 0 and store_a.put_parts(empty, b"") == 0
    assert store_a.is_exist(empty) == 0
    with pytest.raises(TypeError):
        store_a.put_parts(k, "text")


def test_get_buffer_is_the_clients_own_registered_memory_not_a_copy(store_a, store_b):
    value = pattern(2 * MiB, 77)
    k = key("gb")
    assert store_a.put(k, value.tobytes()) == 0
    handle = store_b.get_buffer(k)
    assert handle is not None and handle.size() == value.nbytes
    view = np.frombuffer(handle, dtype=np.uint8)
    # The buffer protocol exposes the handle's memory itself...
    assert view.ctypes.data == handle.ptr()
    assert np.array_equal(view, value)
    # ...which is memory the client registered: the zero-copy calls take it as it is, where
    # memory nobody registered is refused.
    k2 = key("gb")
    heap = np.zeros(16, dtype=np.uint8)
    assert store_b.put_from(k2, heap.ctypes.data, 16) == INVALID
    assert store_b.put_from(k2, handle.ptr(), handle.size()) == 0
    assert bytes(store_a.get(k2)) == value.tobytes()
    # Writable, as in Mooncake, and held while the handle lives: the object's removal does
    # not touch it.
    assert not memoryview(handle).readonly
    assert store_a.remove(k, True) == 0
    assert np.array_equal(np.frombuffer(handle, dtype=np.uint8), value)
    handles = store_b.batch_get_buffer([k2, "gb/absent"])
    assert handles[1] is None and bytes(handles[0]) == value.tobytes()
    assert handles[0].ptr() != handle.ptr()


def test_get_buffer_of_a_value_larger_than_the_local_buffer_is_none(master):
    s = connect(master, buffer=1 * MiB)
    try:
        k = key("gb")
        assert s.put(k, bytes(2 * MiB)) == 0
        assert s.get_buffer(k) is None
        assert "local buffer" in crescent.last_error()
        assert s.batch_get_buffer([k]) == [None]
    finally:
        s.close()


def test_a_closed_store_answers_with_codes(master):
    s = connect(master)
    assert s.close() == 0
    assert s.batch_put_from_multi_buffers(["a"], [[1]], [[1]]) == []
    assert s.batch_get_into_multi_buffers(["a", "b"], [[1], [1]], [[1], [1]]) == [INVALID, INVALID]
    assert s.get_into_ranges([1], [["a"]], [[[0]]], [[[0]]], [[[1]]]) == [[[INVALID]]]
    assert s.put_parts("a", b"x") == INVALID
    assert s.upsert_parts("a", b"x") == INVALID
    assert s.get_buffer("a") is None and s.batch_get_buffer(["a"]) == [None]
    assert isinstance(s, MooncakeDistributedStore)
