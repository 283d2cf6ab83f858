"""examples/hicache_backend.py: the SGLang HiCache-shaped adapter over the store."""

import importlib.util
import pathlib
import uuid

import numpy as np
import pytest

from conftest import REPO

spec = importlib.util.spec_from_file_location("hicache_backend", REPO / "examples" / "hicache_backend.py")
hicache_backend = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hicache_backend)


@pytest.fixture
def backends(store_a, store_b):
    prefix = f"hicache-{uuid.uuid4().hex[:8]}/"
    pool_a = np.zeros(8 * 65536, dtype=np.uint8)
    pool_b = np.zeros(8 * 65536, dtype=np.uint8)
    a = hicache_backend.CrescentHiCacheStorage(store_a, host_pool=pool_a, key_prefix=prefix)
    b = hicache_backend.CrescentHiCacheStorage(store_b, host_pool=(pool_b.ctypes.data, pool_b.nbytes),
                                               key_prefix=prefix)
    yield a, b, pool_a, pool_b
    a.close()
    b.close()


def test_bytes_values_and_consecutive_hits(backends):
    a, b, _, _ = backends
    assert a.set("p0", b"page zero")
    assert a.set("p0", b"ignored: already stored")
    assert a.batch_set(["p1", "p2", "p4"], [b"one", b"two", b"four"])
    assert b.get("p0") == b"page zero"
    assert b.get("p3") is None
    assert b.batch_get(["p1", "p3", "p4"]) == [b"one", None, b"four"]
    assert b.exists("p2") and not b.exists("p3")
    assert b.batch_exists(["p0", "p1", "p2", "p3", "p4"]) == 3  # p3 breaks the run
    assert b.batch_exists(["p3", "p0"]) == 0
    assert b.batch_exists([]) == 0


def test_zero_copy_pages_between_host_pools(backends):
    a, b, pool_a, pool_b = backends
    page = 65536
    pool_a[:] = np.random.default_rng(7).integers(0, 256, pool_a.nbytes, dtype=np.uint8)
    keys = [f"kv{i}" for i in range(8)]
    locs = [pool_a[i * page:(i + 1) * page] for i in range(8)]
    assert a.batch_set(keys, target_locations=locs, target_sizes=[page] * 8)
    assert b.batch_exists(keys) == 8
    # Read them back in reverse order into the other pool.
    got = b.batch_get(keys, target_locations=[pool_b.ctypes.data + (7 - i) * page for i in range(8)],
                      target_sizes=[page] * 8)
    assert got == [page] * 8
    for i in range(8):
        assert np.array_equal(pool_b[(7 - i) * page:(8 - i) * page], pool_a[i * page:(i + 1) * page])
    assert b.get("kv3", target_location=pool_b[:page], target_sizes=page) == page
    assert np.array_equal(pool_b[:page], pool_a[3 * page:4 * page])
    assert b.get("missing", target_location=pool_b[:page], target_sizes=page) is None
