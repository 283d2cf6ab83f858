"""Get and put sessions through the `mooncake` alias (Mooncake's `batch_get_session_start` /
`batch_get_into_multi_buffer_ranges` / `batch_get_session_end` and `batch_put_session_start` /
`batch_put_from_multi_buffer_ranges` / `batch_put_session_end` / `batch_put_session_revoke`):
a block saved and loaded layer by layer, byte for byte, and upstream's codes for what a session
does not hold — never started, ended, ended twice, revoked, past its lease — and for bad input
(lists of other lengths, memory not registered, buffers too small, ranges past the value), each
failing its key alone."""

import time
import uuid

import numpy as np

import crescent
from mooncake.store import MooncakeDistributedStore

from conftest import Master, MiB, connect, pattern, registered

INVALID = -600
INVALID_REPLICA = -702
NOT_FOUND = -704
ALREADY_EXISTS = -705
LEASE_EXPIRED = -707
PAGE = 16 * 1024
LAYERS = 4


def key(tag: str) -> str:
    return f"sess/{tag}/{uuid.uuid4().hex}"


def layer_args(bufs, layer: int, nkeys: int):
    """Per key: page `k` of the layer's buffer is `[layer * PAGE, +PAGE)` of key `k`."""
    ptrs = [[bufs[layer].ctypes.data + k * PAGE] for k in range(nkeys)]
    return ptrs, [[PAGE]] * nkeys, [[layer * PAGE]] * nkeys


def test_a_block_saved_layer_by_layer_loads_back_layer_by_layer(store_a, store_b):
    assert isinstance(store_a, MooncakeDistributedStore)
    keys = [key("blk") for _ in range(3)]
    src = [registered(store_a, len(keys) * PAGE) for _ in range(LAYERS)]
    for i, s in enumerate(src):
        s[:] = pattern(s.nbytes, 30 + i)
    assert store_a.batch_put_session_start(keys, [LAYERS * PAGE] * len(keys)) == [0, 0, 0]
    for layer in reversed(range(LAYERS)):
        assert store_a.batch_put_from_multi_buffer_ranges(keys, *layer_args(src, layer, len(keys))) == [PAGE] * 3
    assert store_b.batch_is_exist(keys) == [0, 0, 0], "reserved, not readable before the end"
    assert store_a.batch_put_session_end(keys) == [0, 0, 0]
    value = [np.concatenate([s[k * PAGE:(k + 1) * PAGE] for s in src]) for k in range(len(keys))]
    assert bytes(store_b.get(keys[2])) == value[2].tobytes()
    # Loaded by the other client (its reads cross the network) and by the writer (its own
    # segment), one layer at a time.
    for reader in (store_b, store_a):
        dst = [registered(reader, len(keys) * PAGE, 0xEE) for _ in range(LAYERS)]
        assert reader.batch_get_session_start(keys) == [0, 0, 0]
        for layer in range(LAYERS):
            assert reader.batch_get_into_multi_buffer_ranges(keys, *layer_args(dst, layer, len(keys))) == [PAGE] * 3
        assert reader.batch_get_session_end(keys) == 0
        for d, s in zip(dst, src):
            assert np.array_equal(d, s)
            assert reader.unregister_buffer(d.ctypes.data) == 0
    # Several buffers for one key in one call: a range each, in any order.
    out = registered(store_b, 3 * PAGE)
    assert store_b.batch_get_session_start([keys[0]]) == [0]
    got = store_b.batch_get_into_multi_buffer_ranges(
        [keys[0]], [[out.ctypes.data + 2 * PAGE, out.ctypes.data, out.ctypes.data + PAGE]],
        [[PAGE, PAGE, 10]], [[0, 3 * PAGE, 5]])
    assert got == [2 * PAGE + 10]
    assert np.array_equal(out[2 * PAGE:], value[0][:PAGE])
    assert np.array_equal(out[:PAGE], value[0][3 * PAGE:])
    assert np.array_equal(out[PAGE:PAGE + 10], value[0][5:15])
    assert store_b.batch_get_session_end([keys[0]]) == 0
    for a in src:
        assert store_a.unregister_buffer(a.ctypes.data) == 0
    assert store_b.unregister_buffer(out.ctypes.data) == 0


def test_put_sessions_end_once_and_refuse_what_they_do_not_hold(store_a, store_b):
    buf = registered(store_a, 2 * PAGE)
    buf[:] = pattern(buf.nbytes, 8)
    p = buf.ctypes.data
    k = key("once")
    # Never started: writes, ends and revokes are INVALID_PARAMS.
    assert store_a.batch_put_from_multi_buffer_ranges([k], [[p]], [[PAGE]], [[0]]) == [INVALID]
    assert store_a.batch_put_session_end([k]) == [INVALID]
    assert store_a.batch_put_session_revoke([k]) == [INVALID]
    # Lists of other lengths: every key.
    assert store_a.batch_put_session_start([k, key("x")], [2 * PAGE]) == [INVALID, INVALID]
    assert "sizes" in crescent.last_error()
    # A second start of an open session; an existing key; size 0.
    exists = key("exists")
    assert store_a.put(exists, b"v") == 0
    assert store_a.batch_put_session_start([k, exists, key("empty")], [2 * PAGE, 1, 0]) == [0, ALREADY_EXISTS, INVALID]
    assert store_a.batch_put_session_start([k], [2 * PAGE]) == [INVALID]
    # Per key: a range past the value, memory not registered, a buffer object too small, one
    # key's lists of other lengths; the good key is written.
    heap = np.zeros(PAGE, dtype=np.uint8)
    small = bytearray(10)
    rc = store_a.batch_put_from_multi_buffer_ranges(
        [k, k, k, k, k],
        [[p], [heap.ctypes.data], [small], [p, p], [p + PAGE]],
        [[PAGE], [PAGE], [PAGE], [PAGE], [PAGE]],
        [[PAGE + 1], [0], [0], [0], [PAGE]])
    assert rc == [INVALID, INVALID, INVALID, INVALID, PAGE]
    assert store_a.batch_put_from_multi_buffer_ranges([k], [[p]], [[PAGE]], [[0]]) == [PAGE]
    # Lists of other lengths: every key.
    assert store_a.batch_put_from_multi_buffer_ranges([k, k], [[p]], [[PAGE]], [[0]]) == [INVALID, INVALID]
    # End once; then end, revoke and writes are INVALID_PARAMS and the value is readable.
    assert store_a.batch_put_session_end([k]) == [0]
    assert store_a.batch_put_session_end([k]) == [INVALID]
    assert store_a.batch_put_session_revoke([k]) == [INVALID]
    assert store_a.batch_put_from_multi_buffer_ranges([k], [[p]], [[PAGE]], [[0]]) == [INVALID]
    assert bytes(store_b.get(k)) == buf.tobytes()
    # Revoke: nothing stored; a get session finds nothing; the key takes a new put.
    r = key("revoked")
    assert store_a.batch_put_session_start([r], [2 * PAGE]) == [0]
    assert store_a.batch_put_from_multi_buffer_ranges([r], [[p]], [[PAGE]], [[0]]) == [PAGE]
    assert store_a.batch_put_session_revoke([r]) == [0]
    assert store_a.batch_put_session_revoke([r]) == [INVALID]
    assert store_b.batch_get_session_start([r]) == [NOT_FOUND]
    assert store_b.batch_get_into_multi_buffer_ranges([r], [[p]], [[1]], [[0]]) == [INVALID]
    assert store_a.put(r, b"again") == 0 and bytes(store_b.get(r)) == b"again"
    assert store_a.unregister_buffer(p) == 0


def test_get_sessions_refuse_what_they_do_not_hold(store_a, store_b):
    k = key("get")
    value = pattern(3 * PAGE, 21)
    assert store_a.put(k, value.tobytes()) == 0
    dst = registered(store_b, 2 * PAGE)
    d = dst.ctypes.data
    assert store_b.batch_get_into_multi_buffer_ranges([k], [[d]], [[PAGE]], [[0]]) == [INVALID], "never started"
    assert store_b.batch_get_session_start([k, key("missing")]) == [0, NOT_FOUND]
    # Per key: a range past the value, memory not registered, a buffer object too small, lists
    # of other lengths; the good key is read, and the session stays.
    heap = np.zeros(PAGE, dtype=np.uint8)
    rc = store_b.batch_get_into_multi_buffer_ranges(
        [k, k, k, k, k],
        [[d], [heap.ctypes.data], [bytearray(5)], [d], [d + PAGE]],
        [[PAGE], [PAGE], [PAGE], [PAGE, PAGE], [PAGE]],
        [[2 * PAGE + 1], [0], [0], [0], [2 * PAGE]])
    assert rc == [INVALID, INVALID, INVALID, INVALID, PAGE]
    assert np.array_equal(dst[PAGE:], value[2 * PAGE:])
    assert store_b.batch_get_into_multi_buffer_ranges([k, k], [[d]], [[PAGE]], [[0]]) == [INVALID, INVALID]
    assert store_b.batch_get_into_multi_buffer_ranges([k], [[d]], [[PAGE]], [[0]]) == [PAGE]
    assert np.array_equal(dst[:PAGE], value[:PAGE])
    # Ended (twice is fine): ranges are INVALID_PARAMS again.
    assert store_b.batch_get_session_end([k]) == 0
    assert store_b.batch_get_session_end([k]) == 0
    assert store_b.batch_get_into_multi_buffer_ranges([k], [[d]], [[PAGE]], [[0]]) == [INVALID]
    assert store_b.unregister_buffer(d) == 0


def test_a_get_session_ends_with_its_lease():
    m = Master("--lease-ttl-ms", "500")
    try:
        s = connect(m)
        k = key("lease")
        assert s.put(k, pattern(PAGE, 3).tobytes()) == 0
        dst = registered(s, PAGE)
        args = ([k], [[dst.ctypes.data]], [[PAGE]], [[0]])
        assert s.batch_get_session_start([k]) == [0]
        assert s.batch_get_into_multi_buffer_ranges(*args) == [PAGE]
        time.sleep(0.7)
        assert s.batch_get_into_multi_buffer_ranges(*args) == [LEASE_EXPIRED]
        assert s.batch_get_into_multi_buffer_ranges(*args) == [INVALID], "the session ended with its lease"
        assert s.batch_get_session_start([k]) == [0], "a new start, a new lease"
        assert s.batch_get_into_multi_buffer_ranges(*args) == [PAGE]
        assert s.batch_get_session_end([k]) == 0
        assert s.unregister_buffer(dst.ctypes.data) == 0
        s.close()
    finally:
        m.stop()


def test_a_put_session_past_the_masters_put_timeout_writes_nothing():
    m = Master("--put-timeout-ms", "500")
    try:
        s = connect(m)
        k = key("slow")
        src = registered(s, PAGE, 7)
        args = ([k], [[src.ctypes.data]], [[PAGE]], [[0]])
        assert s.batch_put_session_start([k], [PAGE]) == [0]
        assert s.batch_put_from_multi_buffer_ranges(*args) == [PAGE]
        time.sleep(0.7)
        assert s.batch_put_from_multi_buffer_ranges(*args) == [INVALID]
        assert "put timeout" in crescent.last_error()
        assert s.batch_put_session_revoke([k]) == [0]
        assert s.unregister_buffer(src.ctypes.data) == 0
        s.close()
    finally:
        m.stop()


def test_before_setup_and_after_close_sessions_answer_as_mooncake(master, store_a):
    never = MooncakeDistributedStore()
    assert never.batch_get_session_start(["k"]) == []
    assert never.batch_get_into_multi_buffer_ranges(["k"], [[0]], [[1]], [[0]]) == []
    assert never.batch_get_session_end(["k"]) == -1
    assert never.batch_put_session_start(["k"], [1]) == []
    assert never.batch_put_from_multi_buffer_ranges(["k"], [[0]], [[1]], [[0]]) == []
    assert never.batch_put_session_end(["k"]) == []
    assert never.batch_put_session_revoke(["k"]) == []
    assert "not set up" in crescent.last_error()
    # Closing revokes the open put sessions: the key is free for another client at once (the
    # reservation is in store_a's segment: this client contributes none).
    s = connect(master, segment=0)
    k = key("closed")
    assert s.batch_put_session_start([k], [PAGE]) == [0]
    assert s.close() == 0
    other = connect(master)
    assert other.batch_put_session_start([k], [PAGE]) == [0]
    assert other.batch_put_session_revoke([k]) == [0]
    assert s.batch_put_session_end([k]) == []
    other.close()


def test_empty_batches_are_empty(store_a):
    assert store_a.batch_get_session_start([]) == []
    assert store_a.batch_put_session_start([], []) == []
    assert store_a.batch_get_into_multi_buffer_ranges([], [], [], []) == []
    assert store_a.batch_put_from_multi_buffer_ranges([], [], [], []) == []
    assert store_a.batch_put_session_end([]) == []
    assert store_a.batch_put_session_revoke([]) == []
    assert store_a.batch_get_session_end([]) == 0
