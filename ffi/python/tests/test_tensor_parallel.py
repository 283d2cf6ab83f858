"""Mooncake's sharded tensor methods through ``mooncake.store``: the ``*_tensor_with_tp*``
wrappers, the ``*_tensor_with_parallelism*`` family with ``ParallelAxis`` /
``TensorParallelism`` / ``ReadTarget`` and ``writer_partition`` requests, and the safetensors
files — against the behaviour of Mooncake's binding (store_py.cpp, store_py_internal.h,
store_py_parallel_{read,write}.h at 3b5a5941) and its tests (scripts/test_tensor_api.py,
mooncake-wheel/tests/test_put_get_tensor.py, test_safetensor_functions.py).

Values are written by one client and read by another (store_a / store_b), so the shards
cross the loopback network as they would between a trainer and an inference worker.
"""

import struct
import uuid
from dataclasses import dataclass

import numpy as np
import pytest

from mooncake.store import ParallelAxis, ReadTarget, ReplicateConfig, TensorParallelism

INVALID_PARAMS = -600
FILE_NOT_FOUND = -1100
HEADER = 304


@dataclass
class WriterPartition:
    rank: int
    size: int
    split_dim: int


def key(tag: str) -> str:
    return f"tp/{tag}/{uuid.uuid4().hex}"


def arr(x):
    """A result as numpy (torch tensors when torch is importable)."""
    return x.numpy() if hasattr(x, "numpy") else x


def same(got, want) -> bool:
    got = arr(got)
    return got is not None and got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want)


def tp(rank, size, split_dim):
    return TensorParallelism([ParallelAxis("tp", rank, size, split_dim)])


def axes(*a):
    return TensorParallelism(list(a))


def registered(store, n):
    buf = np.zeros(n, dtype=np.uint8)
    assert store.register_buffer(buf.ctypes.data, n) == 0
    return buf


def shard_fields(raw):
    """(layout, global shape, local shape, [(kind, index, rank, count, split_dim, reserved0, extent)])."""
    ndim, layout = struct.unpack_from("<iI", raw, 12)
    shapes = struct.unpack_from("<8q8qI", raw, 40)
    n_axes = shapes[16]
    got_axes = [struct.unpack_from("<6iq", raw, 176 + 32 * i) for i in range(n_axes)]
    return layout, shapes[:ndim], shapes[8:8 + ndim], got_axes


def full(shape=(8, 12), dtype=np.float32):
    return np.arange(int(np.prod(shape))).astype(dtype).reshape(shape)


# ---- the request types ----

def test_module_names_and_request_types():
    import mooncake.store

    for name in ("ParallelAxis", "TensorParallelism", "ReadTarget"):
        assert name in mooncake.store.__all__ and getattr(mooncake.store, name) is not None
    a = ParallelAxis()
    assert (a.kind, a.rank, a.size, a.split_dim, a.expert_id, a.stage_id) == ("", 0, 1, None, None, None)
    assert TensorParallelism().axes == []
    t = ReadTarget()
    assert (t.mode, t.parallelism) == ("as_stored", None)
    t.mode = "FULL"
    assert t.mode == "full"
    with pytest.raises(RuntimeError):
        t.mode = "everything"
    with pytest.raises(AttributeError):
        a.colour = "red"


# ---- *_tensor_with_tp ----

@pytest.mark.parametrize("tp_size", [1, 2, 4])
@pytest.mark.parametrize("split_dim", [0, 1])
def test_put_tensor_with_tp_round_trip(store_a, store_b, tp_size, split_dim):
    a, k = full(), key("wrap")
    assert store_a.put_tensor_with_tp(k, a, tp_size=tp_size, split_dim=split_dim) == 0
    chunks = np.split(a, tp_size, axis=split_dim)
    if tp_size == 1:
        assert store_b.is_exist(k) == 1 and store_b.is_exist(f"{k}_tp_0") == 0
        assert same(store_b.get_tensor_with_tp(k), a)
        return
    assert store_b.is_exist(k) == 0
    got = []
    for rank in range(tp_size):
        assert store_b.is_exist(f"{k}_tp_{rank}") == 1
        shard = store_b.get_tensor_with_tp(k, tp_rank=rank, tp_size=tp_size, split_dim=split_dim)
        assert same(shard, chunks[rank])
        # The plain reader reads a shard as the tensor it holds.
        assert same(store_b.get_tensor(f"{k}_tp_{rank}"), chunks[rank])
        layout, g, local, stored = shard_fields(store_b.get(f"{k}_tp_{rank}"))
        assert (layout, g, local) == (1, a.shape, chunks[rank].shape)
        assert stored == [(1, 0, rank, tp_size, split_dim, 0, chunks[rank].shape[split_dim])]
        got.append(arr(shard))
    assert np.array_equal(np.concatenate(got, axis=split_dim), a)


def test_tp_reader_of_another_size(store_a, store_b):
    a, k = full((8, 4)), key("resize")
    assert store_a.put_tensor_with_tp(k, a, tp_size=4, split_dim=0) == 0
    # The wrapper reads <key>_tp_<rank> as stored: rank 1 of 2 gets the writer's shard 1 of 4.
    assert same(store_b.get_tensor_with_tp(k, tp_rank=1, tp_size=2), a[2:4])
    # The unified read re-splits the stored shards for the reader's layout, or joins them.
    for rank in range(2):
        got = store_b.get_tensor_with_parallelism(k, ReadTarget("shard", tp(rank, 2, 0)))
        assert same(got, np.split(a, 2)[rank])
    assert same(store_b.get_tensor_with_parallelism(k, ReadTarget("full", tp(0, 2, 0))), a)
    assert same(store_b.get_tensor_with_parallelism(k, ReadTarget("shard", tp(3, 8, 0))), a[3:4])
    # Another split_dim than the writer's is refused.
    assert store_b.get_tensor_with_parallelism(k, ReadTarget("full", tp(0, 2, 1))) is None


def test_tp_bad_input(store_a):
    a = full((6, 4))
    k = key("bad")
    assert store_a.put_tensor_with_tp(k, a, tp_size=4, split_dim=0) == INVALID_PARAMS  # 6 rows in 4 shards
    assert store_a.is_exist(f"{k}_tp_0") == 0
    for split_dim in (2, -1):
        assert store_a.put_tensor_with_tp(k, a, tp_size=2, split_dim=split_dim) == INVALID_PARAMS
    assert store_a.put_tensor_with_tp(k, "not a tensor", tp_size=2) == INVALID_PARAMS
    assert store_a.put_tensor_with_tp(k, None, tp_size=2) == INVALID_PARAMS
    # tp_size 0 or 1 is the plain put.
    assert store_a.put_tensor_with_tp(k, a, tp_size=0) == 0 and same(store_a.get_tensor(k), a)
    assert store_a.put_tensor_with_tp(key("ok"), a, tp_size=2, split_dim=1) == 0
    assert store_a.get_tensor_with_tp(key("missing"), tp_rank=0, tp_size=2) is None
    k2 = key("rank")
    assert store_a.put_tensor_with_tp(k2, a, tp_size=2) == 0
    assert store_a.get_tensor_with_tp(k2, tp_rank=2, tp_size=2) is None  # rank >= size: no such shard


def test_zero_size_tensor_with_tp(store_a, store_b):
    a, k = np.empty((2, 0, 3), dtype=np.float32), key("zero")
    assert store_a.put_tensor_with_tp(k, a, tp_size=2, split_dim=0) == 0
    for rank in range(2):
        assert same(store_b.get_tensor_with_tp(k, tp_rank=rank, tp_size=2), a[rank:rank + 1])
    assert same(store_b.get_tensor_with_parallelism(k, ReadTarget("full", tp(0, 2, 0))), a)


def test_batch_tensor_with_tp(store_a, store_b):
    tensors = [full((4, 6)), full((2, 4), np.int64), full((4, 3))]
    keys = [key(f"batch{i}") for i in range(3)]
    assert store_a.batch_put_tensor_with_tp(keys, tensors, tp_size=2, split_dim=1) == [0, 0, INVALID_PARAMS]
    for rank in range(2):
        got = store_b.batch_get_tensor_with_tp(keys, tp_rank=rank, tp_size=2)
        assert same(got[0], np.split(tensors[0], 2, axis=1)[rank])
        assert same(got[1], np.split(tensors[1], 2, axis=1)[rank])
        assert got[2] is None
    assert store_a.batch_put_tensor_with_tp(keys, tensors[:2], tp_size=2) == [INVALID_PARAMS] * 3
    assert store_a.batch_put_tensor_with_tp([], [], tp_size=2) == []
    assert store_b.batch_get_tensor_with_tp([keys[0]]) == [None]  # tp_size 1: the plain key, not written


def test_pub_tensor_with_tp(store_a, store_b):
    a, k = full(), key("pub")
    config = ReplicateConfig()
    config.replica_num = 1
    assert store_a.pub_tensor_with_tp(k, a, config=config, tp_size=2, split_dim=1) == 0
    assert same(store_b.get_tensor_with_tp(k, tp_rank=1, tp_size=2), a[:, 6:])
    keys = [key("bpub0"), key("bpub1")]
    assert store_a.batch_pub_tensor_with_tp(keys, [a, a * 2], config=config, tp_size=4, split_dim=0) == [0, 0]
    assert same(store_b.batch_get_tensor_with_tp(keys, tp_rank=3, tp_size=4)[1], a[6:] * 2)
    bad = ReplicateConfig()
    bad.preferred_segments = ["a", "b"]  # two names for one replica
    assert store_a.pub_tensor_with_tp(key("badpub"), a, config=bad, tp_size=2) == INVALID_PARAMS
    assert store_a.batch_pub_tensor_with_tp([key("badpub")], [a], config=bad, tp_size=2) == [INVALID_PARAMS]
    grouped = ReplicateConfig()
    grouped.group_ids = ["g0", "g1"]  # one per key, each key's shards in its group
    assert store_a.batch_pub_tensor_with_tp([key("g0"), key("g1")], [a, a], config=grouped, tp_size=2) == [0, 0]
    assert store_a.batch_pub_tensor_with_tp([key("g")], [a], config=grouped, tp_size=2) == [INVALID_PARAMS]
    ps = [tp(0, 1, 0), None]
    assert store_a.batch_put_tensor_with_parallelism([key("g2"), key("g3")], [a, a], ps, config=grouped) == [0, 0]


def test_tensor_with_tp_from_and_into(store_a, store_b):
    a = full((4, 8))
    seed, k = key("seed"), key("from")
    buf, into = registered(store_a, 1 << 16), registered(store_b, 1 << 16)
    try:
        assert store_a.put_tensor(seed, a) == 0
        n = HEADER + a.nbytes
        assert same(store_a.get_tensor_into(seed, buf.ctypes.data, buf.nbytes), a)
        # The buffer holds the full tensor: every shard is written, whatever tp_rank.
        assert store_a.put_tensor_with_tp_from(k, buf.ctypes.data, n, tp_rank=1, tp_size=2, split_dim=1) == 0
        for rank in range(2):
            got = store_b.get_tensor_with_tp_into(k, into.ctypes.data, into.nbytes, tp_rank=rank, tp_size=2)
            assert same(got, np.split(a, 2, axis=1)[rank])
        keys = [key("bfrom0"), key("bfrom1")]
        assert store_a.batch_put_tensor_with_tp_from(keys, [buf.ctypes.data, 0], [n, n], tp_size=4) == [
            0, INVALID_PARAMS]
        half = into.nbytes // 2
        got = store_b.batch_get_tensor_with_tp_into([keys[0], keys[1]], [into.ctypes.data, into.ctypes.data + half],
                                                    [half, half], tp_rank=2, tp_size=4)
        assert same(got[0], a[2:3]) and got[1] is None
        assert store_a.put_tensor_with_tp_from(k, buf.ctypes.data, 100, tp_size=2) == INVALID_PARAMS
        assert store_a.put_tensor_with_tp_from(k, 0, n, tp_size=2) == INVALID_PARAMS
    finally:
        store_a.unregister_buffer(buf.ctypes.data)
        store_b.unregister_buffer(into.ctypes.data)


# ---- *_tensor_with_parallelism ----

def test_parallelism_as_stored(store_a, store_b):
    a, k = full(), key("stored")
    assert store_a.put_tensor_with_parallelism(k, a) == 0
    assert same(store_b.get_tensor_with_parallelism(k), a)
    assert same(store_b.get_tensor_with_parallelism(k, ReadTarget("as_stored")), a)
    assert same(store_b.get_tensor_with_parallelism(k, ReadTarget("full")), a)
    assert store_b.get_tensor_with_parallelism(key("missing")) is None
    # as_stored with a parallelism is no mode Mooncake serves.
    assert store_b.get_tensor_with_parallelism(k, ReadTarget("as_stored", tp(0, 2, 0))) is None


def test_parallelism_single_tp_takes_shards(store_a, store_b):
    a, k = full((4, 6)), key("single")
    shards = np.split(a, 3, axis=1)
    # Only rank 0 written: the other ranks are missing, whichever way they are read.
    assert store_a.put_tensor_with_parallelism(k, shards[0], tp(0, 3, 1)) == 0
    assert same(store_b.get_tensor_with_tp(k, tp_rank=0, tp_size=3), shards[0])
    assert store_b.get_tensor_with_tp(k, tp_rank=1, tp_size=3) is None
    assert store_b.get_tensor_with_parallelism(k, ReadTarget("shard", tp(1, 3, 1))) is None
    assert store_b.get_tensor_with_parallelism(k, ReadTarget("full", tp(0, 3, 1))) is None
    for rank in (1, 2):
        assert store_a.put_tensor_with_parallelism(k, shards[rank], tp(rank, 3, 1)) == 0
    manifest = store_b.get(f"{k}__parallelism_manifest")
    assert len(manifest) == 96
    assert struct.unpack_from("<IHHiiii", manifest) == (0x574D414E, 1, 96, 0, 2, 1, 3)
    assert struct.unpack_from("<2q", manifest, 32) == (4, 6)
    _, g, local, _ = shard_fields(store_b.get(f"{k}_tp_2"))
    assert (g, local) == ((4, 6), (4, 2))
    for rank in range(3):
        assert same(store_b.get_tensor_with_parallelism(k, ReadTarget("shard", tp(rank, 3, 1))), shards[rank])
    assert same(store_b.get_tensor_with_parallelism(k, ReadTarget("full", tp(2, 3, 1))), a)
    assert same(store_b.get_tensor_with_parallelism(k, ReadTarget("shard", tp(1, 2, 1))), a[:, 3:])
    # 6 columns do not split in 4: as Mooncake, a single-TP read then falls back to <key>_tp_<rank> as stored.
    assert same(store_b.get_tensor_with_parallelism(k, ReadTarget("shard", tp(0, 4, 1))), shards[0])
    assert store_b.get_tensor_with_parallelism(k, ReadTarget("full", tp(0, 4, 1))) is None


def test_parallelism_multi_axis(store_a, store_b):
    a, k = full((4, 6)), key("dptp")
    for rank in range(3):
        p = axes(ParallelAxis("dp", 1, 2), ParallelAxis("tp", rank, 3, 1))
        assert store_a.put_tensor_with_parallelism(k, a, p) == 0  # the full tensor in, shard `rank` stored
    for rank in range(3):
        assert store_b.is_exist(f"{k}__dp_1of2__tp_{rank}of3_sd1") == 1
    # The axes may come in any order: the key and the match do not depend on it.
    reordered = axes(ParallelAxis("TP", 2, 3, 1), ParallelAxis("dp", 1, 2))
    assert same(store_b.get_tensor_with_parallelism(k, ReadTarget("shard", reordered)), a[:, 4:])
    assert same(store_b.get_tensor_with_parallelism(k, ReadTarget("full", reordered)), a)
    other_dp = axes(ParallelAxis("dp", 0, 2), ParallelAxis("tp", 0, 3, 1))
    assert store_b.get_tensor_with_parallelism(k, ReadTarget("shard", other_dp)) is None
    layout, g, local, stored = shard_fields(store_b.get(f"{k}__dp_1of2__tp_0of3_sd1"))
    assert (layout, g, local) == (1, (4, 6), (4, 2))
    assert stored == [(0, 0, 1, 2, -1, 0, 0), (1, 1, 0, 3, 1, 0, 2)]

    pp = ParallelAxis("pp", 0, 2, stage_id=7)
    k2 = key("pptp")
    for rank in range(2):
        assert store_a.put_tensor_with_parallelism(k2, a, axes(pp, ParallelAxis("tp", rank, 2, 0))) == 0
    assert store_b.is_exist(f"{k2}__tp_1of2_sd0__pp_0of2_sid7") == 1
    assert same(store_b.get_tensor_with_parallelism(k2, ReadTarget("shard", axes(pp, ParallelAxis("tp", 1, 2, 0)))),
                a[2:])

    # No TP axis: the tensor is stored as given, under the key of its axes.
    ep, k3 = axes(ParallelAxis("ep", 1, 4, expert_id=3)), key("ep")
    assert store_a.put_tensor_with_parallelism(k3, a, ep) == 0
    assert store_b.is_exist(f"{k3}__ep_1of4_eid3") == 1
    assert same(store_b.get_tensor_with_parallelism(k3, ReadTarget("shard", ep)), a)
    assert store_b.get_tensor_with_parallelism(k3, ReadTarget("full", ep)) is None  # full needs a TP axis


def layout(mode, rank, size, split_dim):
    """Mooncake's test layouts: TP alone, or TP with a DP, PP or EP axis."""
    t = ParallelAxis("tp", rank, size, split_dim)
    other = {"tp": None, "dp_tp": ParallelAxis("dp", 0, 2), "pp_tp": ParallelAxis("pp", 0, 2, stage_id=7),
             "ep_tp": ParallelAxis("ep", 0, 2, expert_id=11)}[mode]
    return axes(t) if other is None else axes(other, t)


@pytest.mark.parametrize("shape,split_dim,put_size,get_size,mode", [
    ((8, 12, 6), 0, 4, 2, "tp"),
    ((8, 12, 6), 1, 4, 2, "dp_tp"),
    ((8, 12, 6), 2, 2, 4, "pp_tp"),
    ((8, 12, 6), 1, 2, 4, "ep_tp"),
    ((12, 8, 6), 0, 2, 2, "tp"),
    ((12, 8, 8), 2, 4, 4, "dp_tp"),
    ((8, 12, 6), 2, 2, 4, "tp"),
])
def test_target_shard_matrix(store_a, store_b, shape, split_dim, put_size, get_size, mode):
    """Mooncake's test_40 / test_41: shards written at one TP size, read at another."""
    a, k = full(shape), key(f"matrix-{mode}")
    for rank in range(put_size):
        # TP alone takes the shard; with another axis, the full tensor (the shard is cut from it).
        given = np.split(a, put_size, axis=split_dim)[rank] if mode == "tp" else a
        assert store_a.put_tensor_with_parallelism(k, np.ascontiguousarray(given),
                                                   layout(mode, rank, put_size, split_dim)) == 0
    into = registered(store_b, 1 << 16)
    try:
        if shape[split_dim] % get_size:
            # Not uniform for the reader: nothing to cut, except Mooncake's last resort for TP
            # alone, <key>_tp_<rank> as stored (not for the _into form).
            target = ReadTarget("shard", layout(mode, 0, get_size, split_dim))
            got = store_b.get_tensor_with_parallelism(k, target)
            assert got is None if mode != "tp" else same(got, np.split(a, put_size, axis=split_dim)[0])
            assert store_b.get_tensor_with_parallelism_into(k, into.ctypes.data, into.nbytes, target) is None
            return
        for rank in range(get_size):
            want = np.split(a, get_size, axis=split_dim)[rank]
            target = ReadTarget("shard", layout(mode, rank, get_size, split_dim))
            assert same(store_b.get_tensor_with_parallelism(k, target), want)
            assert same(store_b.get_tensor_with_parallelism_into(k, into.ctypes.data, into.nbytes, target), want)
        target = ReadTarget("full", layout(mode, 0, get_size, split_dim))
        assert same(store_b.get_tensor_with_parallelism(k, target), a)
        assert same(store_b.get_tensor_with_parallelism_into(k, into.ctypes.data, into.nbytes, target), a)
    finally:
        store_b.unregister_buffer(into.ctypes.data)


@pytest.mark.parametrize("bad", [
    [ParallelAxis("dp", 0, 2, split_dim=0)],
    [ParallelAxis("ep", 0, 2)],
    [ParallelAxis("pp", 0, 2)],
    [ParallelAxis("tp", 0, 2)],
    [ParallelAxis("tp", 2, 2, 0)],
    [ParallelAxis("tp", 0, 0, 0)],
    [ParallelAxis("xp", 0, 2)],
    [ParallelAxis("tp", 0, 2, 0), ParallelAxis("tp", 1, 2, 0)],
    [],
    [ParallelAxis("dp", 0, 2), ParallelAxis("tp", 0, 2, 0), ParallelAxis("ep", 0, 1, expert_id=0),
     ParallelAxis("pp", 0, 1, stage_id=0), ParallelAxis("dp", 1, 2)],
])
def test_parallelism_bad_requests(store_a, bad):
    a, k = full(), key("badaxes")
    assert store_a.put_tensor_with_parallelism(k, a, axes(*bad)) == INVALID_PARAMS
    assert store_a.get_tensor_with_parallelism(k, ReadTarget("shard", axes(*bad))) is None


def test_parallelism_bad_shapes(store_a):
    a = full((6, 4))
    # a split_dim out of range for the shard given, and a full tensor not divisible by the TP size
    assert store_a.put_tensor_with_parallelism(key("sd"), a, tp(0, 2, 2)) == INVALID_PARAMS
    p = axes(ParallelAxis("dp", 0, 2), ParallelAxis("tp", 0, 4, 0))
    assert store_a.put_tensor_with_parallelism(key("uneven"), a, p) == INVALID_PARAMS
    assert store_a.put_tensor_with_parallelism(key("nt"), "not a tensor", tp(0, 2, 0)) == INVALID_PARAMS


def test_writer_partition(store_a, store_b):
    a, k = full((4, 6)), key("writer")
    for rank in range(3):
        assert store_a.put_tensor_with_parallelism(k, a, writer_partition=WriterPartition(rank, 3, 1)) == 0
        assert store_b.is_exist(f"{k}__writer_{rank}of3_sd1") == 1
    assert len(store_b.get(f"{k}__writer_manifest")) == 96
    assert same(store_b.get_tensor_with_parallelism(k, ReadTarget("full")), a)
    for rank in range(3):
        assert same(store_b.get_tensor_with_parallelism(k, ReadTarget("shard", tp(rank, 3, 1))),
                    np.split(a, 3, axis=1)[rank])
    assert store_a.put_tensor_with_parallelism(k, a, tp(0, 3, 1), writer_partition=WriterPartition(0, 3, 1)) == \
        INVALID_PARAMS
    for bad in (WriterPartition(3, 3, 1), WriterPartition(0, 0, 0), WriterPartition(0, 2, -1),
                WriterPartition(0, 4, 1), WriterPartition(0, 2, 5), object()):
        assert store_a.put_tensor_with_parallelism(key("badw"), a, writer_partition=bad) == INVALID_PARAMS
    # A writer manifest whose shards are not all there: the full read falls back to the key.
    k2 = key("writer-partial")
    assert store_a.put_tensor_with_parallelism(k2, a, writer_partition=WriterPartition(0, 2, 0)) == 0
    assert store_b.get_tensor_with_parallelism(k2, ReadTarget("full")) is None


def test_batch_parallelism(store_a, store_b):
    a, b = full((4, 6)), full((2, 8), np.int32)
    keys = [key("bp0"), key("bp1"), key("bp2")]
    ps = [tp(1, 2, 1), None, axes(ParallelAxis("dp", 0, 2), ParallelAxis("tp", 1, 2, 0))]
    assert store_a.batch_put_tensor_with_parallelism(keys, [a[:, 3:], b, a], ps) == [0, 0, 0]
    targets = [ReadTarget("shard", ps[0]), None, ReadTarget("shard", ps[2])]
    got = store_b.batch_get_tensor_with_parallelism(keys, targets)
    assert same(got[0], a[:, 3:]) and same(got[1], b) and same(got[2], a[2:])
    assert same(store_b.batch_get_tensor_with_parallelism([keys[1]])[0], b)
    assert store_b.batch_get_tensor_with_parallelism(keys, targets[:2]) == [None] * 3
    assert store_b.batch_get_tensor_with_parallelism(keys, tuple(targets)) == [None] * 3
    n = len(keys)
    assert store_a.batch_put_tensor_with_parallelism(keys, [a, b, a], tuple(ps)) == [INVALID_PARAMS] * n
    assert store_a.batch_put_tensor_with_parallelism(keys, [a, b], ps) == [INVALID_PARAMS] * n
    wps = [WriterPartition(0, 2, 0)] * n
    assert store_a.batch_put_tensor_with_parallelism(keys, [a, b, a], ps, writer_partitions=wps) == \
        [INVALID_PARAMS] * n
    wkeys = [key("bw0"), key("bw1")]
    assert store_a.batch_put_tensor_with_parallelism(wkeys, [a, b], writer_partitions=[
        WriterPartition(0, 1, 1), WriterPartition(1, 3, 1)]) == [0, INVALID_PARAMS]
    assert same(store_b.get_tensor_with_parallelism(wkeys[0], ReadTarget("full")), a)
    assert store_a.batch_put_tensor_with_parallelism([], []) == []


def test_upsert_tensor_with_parallelism(store_a, store_b):
    # (No read before an upsert of the same key: a reader's lease would hold the old value.)
    a, kept, k = full((4, 6)), key("kept"), key("upsert")
    assert store_a.put_tensor_with_parallelism(kept, a[:2], tp(0, 2, 0)) == 0
    assert store_a.put_tensor_with_parallelism(kept, a[:2] + 100, tp(0, 2, 0)) == 0  # a put keeps the value
    assert same(store_b.get_tensor_with_tp(kept, tp_rank=0, tp_size=2), a[:2])
    assert store_a.put_tensor_with_parallelism(k, a[:2], tp(0, 2, 0)) == 0
    assert store_a.upsert_tensor_with_parallelism(k, a[:2] + 100, tp(0, 2, 0)) == 0  # an upsert replaces it
    assert store_a.upsert_tensor_with_parallelism(k, a[2:] + 100, tp(1, 2, 0)) == 0
    assert same(store_b.get_tensor_with_parallelism(k, ReadTarget("full", tp(0, 2, 0))), a + 100)
    keys = [key("bu0"), key("bu1")]
    assert store_a.batch_upsert_tensor_with_parallelism(keys, [a, a]) == [0, 0]
    assert store_a.batch_upsert_tensor_with_parallelism(keys, [a * 3, a], writer_partitions=[
        WriterPartition(0, 1, 0), WriterPartition(0, 3, 0)]) == [0, INVALID_PARAMS]
    assert same(store_b.get_tensor_with_parallelism(keys[0], ReadTarget("full")), a * 3)
    assert same(store_b.get_tensor(keys[1]), a)
    assert store_a.upsert_tensor_with_parallelism(k, a, tp(0, 2, 0), writer_partition=WriterPartition(0, 2, 0)) == \
        INVALID_PARAMS


def test_parallelism_from_and_into(store_a, store_b):
    a = full((4, 6))
    seed = key("seed")
    buf, into = registered(store_a, 1 << 16), registered(store_b, 1 << 16)
    try:
        assert store_a.put_tensor(seed, a) == 0
        n = HEADER + a.nbytes
        assert store_a.get_into(seed, buf.ctypes.data, buf.nbytes) == n
        k = key("pfrom")
        # _from with one TP axis: the buffer is the full tensor, every shard is written.
        assert store_a.put_tensor_with_parallelism_from(k, buf.ctypes.data, n, tp(1, 2, 1)) == 0
        assert same(store_b.get_tensor_with_tp(k, tp_rank=0, tp_size=2), a[:, :3])
        got = store_b.get_tensor_with_parallelism_into(k, into.ctypes.data, into.nbytes,
                                                       ReadTarget("full", tp(0, 2, 1)))
        assert same(got, a)
        # What an into read leaves in the buffer is a tensor object: it can be put as it is.
        assert store_b.put_tensor_from(key("again"), into.ctypes.data, n) == 0
        got = store_b.get_tensor_with_parallelism_into(k, into.ctypes.data, into.nbytes,
                                                       ReadTarget("shard", tp(2, 3, 1)))
        assert same(got, a[:, 4:])
        assert same(store_b.get_tensor_with_parallelism_into(k, into.ctypes.data, into.nbytes,
                                                             ReadTarget("shard", tp(1, 2, 1))), a[:, 3:])
        assert store_b.get_tensor_with_parallelism_into(k, into.ctypes.data, 100, ReadTarget("full", tp(0, 2, 1))) \
            is None
        unregistered = np.zeros(1 << 12, dtype=np.uint8)
        assert store_b.get_tensor_with_parallelism_into(k, unregistered.ctypes.data, unregistered.nbytes,
                                                        ReadTarget("full", tp(0, 2, 1))) is None
        kw = key("wfrom")
        for rank in range(2):
            assert store_a.upsert_tensor_with_parallelism_from(kw, buf.ctypes.data, n,
                                                               writer_partition=WriterPartition(rank, 2, 0)) == 0
        assert same(store_b.get_tensor_with_parallelism_into(kw, into.ctypes.data, into.nbytes, ReadTarget("full")),
                    a)
        keys = [key("bfrom0"), key("bfrom1")]
        ps = [None, axes(ParallelAxis("dp", 0, 2), ParallelAxis("tp", 0, 2, 0))]
        assert store_a.batch_put_tensor_with_parallelism_from(keys, [buf.ctypes.data] * 2, [n, n], ps) == [0, 0]
        assert store_a.batch_upsert_tensor_with_parallelism_from(keys, [buf.ctypes.data] * 2, [n, n]) == [0, 0]
        half = into.nbytes // 2
        got = store_b.batch_get_tensor_with_parallelism_into(
            keys + [key("missing")], [into.ctypes.data, into.ctypes.data + half, into.ctypes.data],
            [half, half, half], [None, ReadTarget("full", ps[1]), None])
        assert same(got[0], a) and same(got[1], a) and got[2] is None
        assert store_a.put_tensor_with_parallelism_from(key("bad"), buf.ctypes.data, 100, tp(0, 2, 0)) == \
            INVALID_PARAMS
        assert store_b.batch_get_tensor_with_parallelism_into(keys, [into.ctypes.data], [half]) == [None, None]
    finally:
        store_a.unregister_buffer(buf.ctypes.data)
        store_b.unregister_buffer(into.ctypes.data)


# ---- safetensors files ----

def test_safetensors_round_trip(store_a, store_b, tmp_path, monkeypatch):
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    a, k = full((3, 5)), key("st")
    assert store_a.put_tensor(k, a) == 0
    path = str(tmp_path / "one.safetensors")
    assert store_a.save_tensor_to_safetensor(k, path) == 0
    assert np.array_equal(safetensors_numpy.load_file(path)[k], a)  # a file the safetensors package reads
    k2 = key("st-load")
    assert same(store_b.load_tensor_from_safetensor(k2, path), a)  # k2 is not in the file: its first tensor
    assert same(store_b.get_tensor(k2), a)
    assert same(store_b.load_tensor_from_safetensor(k, path), a)
    assert store_a.save_tensor_to_safetensor(key("missing"), path) == FILE_NOT_FOUND
    monkeypatch.chdir(tmp_path)
    plain = f"st-{uuid.uuid4().hex}"
    assert store_a.put_tensor(plain, a) == 0
    assert store_a.save_tensor_to_safetensor(plain) == 0  # the file is named after the key
    assert (tmp_path / plain).exists()
    assert same(store_b.load_tensor_from_safetensor(file_name=plain), a)  # and its tensor stored under that name
    b, other = full((2, 2), np.int16), f"st-{uuid.uuid4().hex}"
    safetensors_numpy.save_file({"w": b}, str(tmp_path / other))
    assert same(store_b.load_tensor_from_safetensor(file_name=other), b)
    assert same(store_a.get_tensor(other), b)
    assert store_b.load_tensor_from_safetensor("x", str(tmp_path / "absent.safetensors")) is None


def test_safetensors_package_missing(store_a, tmp_path, monkeypatch):
    import sys

    import crescent

    a, k = full((2, 2)), key("st-missing")
    assert store_a.put_tensor(k, a) == 0
    for name in ("safetensors", "safetensors.numpy", "safetensors.torch"):
        monkeypatch.setitem(sys.modules, name, None)  # as if it were not installed
    assert store_a.save_tensor_to_safetensor(k, str(tmp_path / "f")) == INVALID_PARAMS
    assert "safetensors" in crescent.last_error()
    assert store_a.load_tensor_from_safetensor(k, str(tmp_path / "f")) is None
    assert "safetensors" in crescent.last_error()
    assert crescent.status_name(FILE_NOT_FOUND) == "UNKNOWN"


# ---- no copy: shards from the tensor's memory in one batch, reads into memory of their own ----

def spy(monkeypatch, store, *names):
    """The calls of `store`'s methods `names` (their positional arguments), recorded while the
    test runs (the instance's attributes shadow the class's)."""
    calls = {n: [] for n in names}
    for n in names:
        def record(*args, _real=getattr(store, n), _name=n, **kwargs):
            calls[_name].append(args)
            return _real(*args, **kwargs)

        monkeypatch.setattr(store, n, record)
    return calls


BYTE_PUTS = ("put_parts", "put_batch", "put", "upsert_parts", "upsert_batch")


def test_put_tensor_with_tp_puts_every_shard_from_the_tensor_in_one_batch(store_a, store_b, monkeypatch):
    from crescent._crescent import _is_registered

    a, k = full((8, 1 << 16)), key("direct")  # 2 MiB
    base, shard = a.ctypes.data, a.nbytes // 8
    calls = spy(monkeypatch, store_a, "batch_put_from_multi_buffers", *BYTE_PUTS)
    assert store_a.put_tensor_with_tp(k, a, tp_size=8, split_dim=0) == 0
    assert all(calls[n] == [] for n in BYTE_PUTS)
    ((keys, ptrs, sizes, *_),) = calls["batch_put_from_multi_buffers"]
    assert keys == [f"{k}_tp_{r}" for r in range(8)]
    # Each object is its header and its shard, the shard read where the tensor holds it.
    assert [p[1] for p in ptrs] == [base + r * shard for r in range(8)]
    assert sizes == [[HEADER, shard]] * 8
    # The tensor's memory was registered for the call only.
    assert not _is_registered(store_a, base, a.nbytes)
    monkeypatch.undo()
    for r in range(8):
        assert same(store_b.get_tensor_with_tp(k, tp_rank=r, tp_size=8), a[r:r + 1])
        assert same(store_b.get_tensor(f"{k}_tp_{r}"), a[r:r + 1])


def test_sharded_put_of_registered_memory_and_of_another_split_dim(store_a, store_b, monkeypatch):
    from crescent._crescent import _is_registered

    # Memory the caller registered is used as it is, and stays registered.
    a, k = full((4, 1 << 17)), key("registered")  # 2 MiB
    assert store_a.register_buffer(a.ctypes.data, a.nbytes) == 0
    try:
        calls = spy(monkeypatch, store_a, "batch_put_from_multi_buffers", *BYTE_PUTS)
        assert store_a.put_tensor_with_tp(k, a, tp_size=4, split_dim=0) == 0
        assert _is_registered(store_a, a.ctypes.data, a.nbytes)
        # Shards along dim 1 are gathered (as Mooncake's contiguous() does), then put in one batch too.
        assert store_a.put_tensor_with_tp(k + "/sd1", a, tp_size=4, split_dim=1) == 0
        assert len(calls["batch_put_from_multi_buffers"]) == 2 and all(calls[n] == [] for n in BYTE_PUTS)
        monkeypatch.undo()
    finally:
        assert store_a.unregister_buffer(a.ctypes.data) == 0
    for r, part in enumerate(np.split(a, 4, axis=1)):
        assert same(store_b.get_tensor_with_tp(k, tp_rank=r, tp_size=4), a[r:r + 1])
        assert same(store_b.get_tensor_with_tp(k + "/sd1", tp_rank=r, tp_size=4), part)


def test_sharded_reads_land_in_memory_of_their_own(store_a, store_b, monkeypatch):
    # 24 MiB in two shards: more than the reader's 16 MiB local buffer holds at once.
    a, k = full((2, 3 << 20)), key("big")
    assert store_a.put_tensor_with_tp(k, a, tp_size=2, split_dim=0) == 0
    calls = spy(monkeypatch, store_b, "get_buffer", "batch_get_buffer")
    whole = store_b.get_tensor_with_parallelism(k, ReadTarget("full", tp(0, 2, 0)))
    shards = store_b.batch_get_tensor_with_tp([k, key("missing")], tp_rank=1, tp_size=2)
    # Only the 96-byte manifests pass through the local buffer, never a shard.
    held = [args[0] for args in calls["get_buffer"]] + [k for args in calls["batch_get_buffer"] for k in args[0]]
    assert all(h.endswith("_manifest") for h in held)
    monkeypatch.undo()
    assert same(whole, a) and arr(whole).flags.writeable
    assert same(shards[0], a[1:]) and shards[1] is None
    # Results own their memory: writing one changes nothing stored.
    arr(whole)[0, 0] = -1
    assert same(store_b.get_tensor_with_tp(k, tp_rank=0, tp_size=2), a[:1])


def test_sharded_read_memory_is_used_again_only_once_its_results_are_gone(store_a, store_b, monkeypatch):
    import gc

    a, k = full((2, 1 << 18)), key("pool")  # 2 MiB
    assert store_a.put_tensor_with_tp(k, a, tp_size=2, split_dim=0) == 0
    first = store_b.get_tensor_with_tp(k, tp_rank=0, tp_size=2)
    kept = arr(first)[:, :4]  # a view that outlives the result
    del first
    gc.collect()
    calls = spy(monkeypatch, store_b, "register_buffer")
    second = store_b.get_tensor_with_tp(k, tp_rank=1, tp_size=2)
    # The kept view's memory is not read into: the second result got memory of its own.
    assert same(kept, a[:1, :4]) and same(second, a[1:])
    assert len(calls["register_buffer"]) == 1  # the new memory (no header read: one read of each value)
    del kept, second
    gc.collect()
    calls["register_buffer"].clear()
    assert same(store_b.get_tensor_with_tp(k, tp_rank=0, tp_size=2), a[:1])
    assert not calls["register_buffer"]  # memory used again
