"""Mooncake's ``EngramStore``: one layer's embedding tables, one key per head, populated once
and looked up by row ids ``[B, L, H]`` into ``[B, L, H, D]``; create-only populate, a failed
populate leaving nothing readable, out-of-range ids refused, removal counts; and
``MooncakeDistributedNoFRegister`` (NVMe-oF) answering its failure code."""

import uuid

import numpy as np
import pytest

import crescent
from crescent.store import EngramStore, EngramStoreConfig, MooncakeDistributedNoFRegister

from conftest import MiB, Master, connect


def layer() -> int:
    return uuid.uuid4().int % 1_000_000_000


def config(sizes, dim):
    c = EngramStoreConfig()
    c.table_vocab_sizes = list(sizes)
    c.embedding_dim = dim
    return c


def tables(sizes, dim, seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((n, dim), dtype=np.float32) for n in sizes]


def test_rows_come_back_as_the_tables_hold_them_from_arrays_and_from_lists(store_a, store_b):
    sizes, dim = [100, 37, 5], 8
    lid = layer()
    writer = EngramStore(lid, config(sizes, dim), store_a)
    assert writer.get_store_keys() == [f"engram:l{lid}:h{h}" for h in range(3)]
    assert (writer.get_num_heads(), writer.get_embedding_dim(), writer.get_table_vocab_sizes()) == (3, dim, sizes)
    t = tables(sizes, dim, 1)
    writer.populate(t)
    for k, table in zip(writer.get_store_keys(), t):
        assert store_b.get_size(k) == table.nbytes
    reader = EngramStore(lid, config(sizes, dim), store_b)
    rng = np.random.default_rng(2)
    ids = np.stack([rng.integers(0, n, (4, 6)) for n in sizes], axis=-1)  # [B=4, L=6, H=3]
    want = np.stack([t[h][ids[:, :, h]] for h in range(3)], axis=2)
    got = reader.lookup(ids)
    assert got.shape == (4, 6, 3, dim) and got.dtype == np.float32
    assert np.array_equal(got, want)
    assert np.array_equal(reader.lookup(ids.tolist()), want)
    assert np.array_equal(reader.lookup(ids.astype(np.int32)), want)
    with pytest.raises(RuntimeError, match="rc=-706"):
        reader.remove_from_store()  # the lookups' read leases (30 s here) hold the tables
    assert reader.remove_from_store(force=True) == 3
    assert reader.remove_from_store(force=True) == 0
    with pytest.raises(RuntimeError, match="lookup failed"):
        reader.lookup(ids)


def test_populate_is_create_only(store_a):
    sizes, dim = [10, 10], 4
    e = EngramStore(layer(), config(sizes, dim), store_a)
    first = tables(sizes, dim, 3)
    e.populate(first)
    with pytest.raises(RuntimeError, match="populate failed"):
        e.populate(tables(sizes, dim, 4))
    ids = np.array([[[9, 0]]])
    assert np.array_equal(e.lookup(ids)[0, 0], np.stack([first[0][9], first[1][0]]))
    assert e.remove_from_store(force=True) == 2


def test_a_failed_populate_leaves_nothing_readable():
    master = Master()
    try:
        store = connect(master, segment=8 * MiB)
        e = EngramStore(layer(), config([16, 1 << 20], 4), store)  # head 1: 16 MiB, past the pool
        with pytest.raises(RuntimeError, match="populate failed"):
            e.populate(tables([16, 1 << 20], 4, 5))
        assert store.batch_is_exist(e.get_store_keys()) == [0, 0]
        store.close()
    finally:
        master.stop()


def test_bad_row_ids_and_tables_are_refused(store_a):
    sizes, dim = [10, 20], 4
    e = EngramStore(layer(), config(sizes, dim), store_a)
    with pytest.raises(RuntimeError, match="num_heads"):
        e.populate(tables(sizes, dim, 6)[:1])
    with pytest.raises(RuntimeError, match="does not match"):
        e.populate([np.zeros((10, 4), np.float32), np.zeros((20, 5), np.float32)])
    with pytest.raises(RuntimeError, match="NumPy"):
        e.populate([[[0.0] * 4] * 10, np.zeros((20, 4), np.float32)])
    assert store_a.batch_is_exist(e.get_store_keys()) == [0, 0]
    e.populate(tables(sizes, dim, 7))
    for bad in ([[[10, 0]]], [[[0, 20]]], [[[-1, 0]]]):
        with pytest.raises(RuntimeError, match="lookup failed"):
            e.lookup(np.array(bad))
    with pytest.raises(RuntimeError, match="last dimension"):
        e.lookup(np.zeros((1, 1, 3), np.int64))
    with pytest.raises(RuntimeError, match=r"\[B, L, H\]"):
        e.lookup(np.zeros((2, 2), np.int64))
    with pytest.raises(RuntimeError, match="empty"):
        e.lookup([])
    with pytest.raises(RuntimeError, match="lookup failed"):
        e.lookup([[[0, 0]], [[0, 0], [1, 1]]])  # ragged
    assert e.remove_from_store() == 2  # no lookup read anything: no read lease holds them


def test_a_bad_config_and_a_missing_store():
    for sizes, dim in (([], 4), ([4, 0], 4), ([4], 0)):
        with pytest.raises(ValueError):
            EngramStore(1, config(sizes, dim))
    default = EngramStoreConfig()
    assert (default.table_vocab_sizes, default.embedding_dim) == ([1024], 64)
    alone = EngramStore(3, default)
    assert alone.get_store_keys() == ["engram:l3:h0"]
    with pytest.raises(RuntimeError, match="lookup failed"):
        alone.lookup([[[0]]])
    with pytest.raises(RuntimeError, match="populate failed"):
        alone.populate(tables([1024], 64, 8))
    with pytest.raises(RuntimeError, match="rc=-600"):
        alone.remove_from_store()


def test_nvme_of_registration_answers_its_failure_code():
    r = MooncakeDistributedNoFRegister()
    assert r.real_register("nqn.test", 1, "10.0.0.1", 4420, 0, 1 << 30, "127.0.0.1:1") == -1
    assert "NVMe-oF" in crescent.last_error()
    assert r.real_unregister_by_endpoint(nqn="nqn.test") == -1
