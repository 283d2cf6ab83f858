"""The sequences of calls that SGLang's HiCache Mooncake backend, vLLM's MooncakeStoreConnector
and LMCache's Mooncake connector make, replayed through the `mooncake` alias with their
arguments and data checked, without installing those projects. (Their multi-buffer and parts
calls come with the store client's read/write pipeline.)"""

import asyncio
import uuid

import numpy as np
import pytest

from mooncake.store import MooncakeDistributedStore, ReplicateConfig

from conftest import MiB, Master

PAGE = 64 * 1024  # bytes of one page's K (or V) in a host pool


@pytest.fixture(scope="module")
def master():
    m = Master("--lease-ttl-ms", "1000")
    yield m
    m.stop()


def test_sglang_hicache_mooncake_backend(master):
    # MooncakeStore.__init__: setup with 8 positional arguments (transfer_engine None unless an
    # rdma engine is shared), sizes per rank, then warmup().
    stores = []
    for rank in range(2):
        s = MooncakeDistributedStore()
        rc = s.setup("127.0.0.1", "P2PHANDSHAKE", 128 * MiB // 2, 16 * MiB, "tcp", "", master.addr, None)
        assert rc == 0, f"Failed to setup Mooncake store, error code: {rc}"
        warmup_key = "sglang_mooncake_store_warmup_key" + uuid.uuid4().hex
        warmup_value = bytes(4 * 1024)
        assert s.put(warmup_key, warmup_value) == 0
        assert s.is_exist(warmup_key) == 1
        assert s.get(warmup_key) == warmup_value
        stores.append(s)
    writer, reader = stores
    try:
        # register_mem_pool_host: the host KV pool, registered by pointer and size.
        pools = [np.zeros(16 * 2 * PAGE, dtype=np.uint8) for _ in stores]
        for s, pool in zip(stores, pools):
            assert s.register_buffer(pool.ctypes.data, pool.nbytes) == 0
        pools[0][:] = np.random.default_rng(7).integers(0, 256, pools[0].nbytes, dtype=np.uint8)
        # batch_set_v1 (MHA, page_first): keys <hash>_<rank>_k / _v, one page buffer each;
        # batch_is_exist first, batch_put_from for the missing ones.
        pages = [f"{uuid.uuid4().hex}" for _ in range(6)]

        def meta(pool, indices):
            keys, ptrs, sizes = [], [], []
            for page, i in zip(pages, indices):
                for j, suffix in enumerate(("k", "v")):
                    keys.append(f"{page}_0_{suffix}")
                    ptrs.append(pool.ctypes.data + (2 * i + j) * PAGE)
                    sizes.append(PAGE)
            return keys, ptrs, sizes

        keys, ptrs, sizes = meta(pools[0], range(6))
        exist = writer.batch_is_exist(keys)
        assert exist == [0] * len(keys)
        assert writer.batch_put_from(keys[:4], ptrs[:4], sizes[:4]) == [0] * 4
        exist = writer.batch_is_exist(keys)
        missing = [i for i, e in enumerate(exist) if e != 1]
        assert missing == list(range(4, len(keys)))
        put = writer.batch_put_from([keys[i] for i in missing], [ptrs[i] for i in missing], [sizes[i] for i in missing])
        assert put == [0] * len(missing)
        # Setting the same pages again: they exist, nothing is put (and a put would return 0).
        assert writer.batch_is_exist(keys) == [1] * len(keys)
        assert writer.batch_put_from(keys[:2], ptrs[:2], sizes[:2]) == [0, 0]
        # batch_exists on the other rank, then batch_get_v1 into other slots of its pool.
        assert reader.batch_is_exist(keys) == [1] * len(keys)
        rkeys, rptrs, rsizes = meta(pools[1], range(8, 14))
        assert rkeys == keys
        got = reader.batch_get_into(rkeys, rptrs, rsizes)
        assert all(r > 0 for r in got), got
        assert np.array_equal(pools[1][16 * PAGE: 28 * PAGE], pools[0][: 12 * PAGE])
        # A page that is not there: a negative result for its keys, the others still read.
        got = reader.batch_get_into([keys[0], "absent_0_k"], rptrs[:2], rsizes[:2])
        assert got[0] == PAGE and got[1] < 0
        # ReplicateConfig with group_ids when the installed Mooncake supports them.
        assert hasattr(ReplicateConfig(), "group_ids")
        c = ReplicateConfig()
        c.group_ids = [f"sglang-hicache:{pages[0]}"] * 2
        fresh = [f"{uuid.uuid4().hex}_0_k", f"{uuid.uuid4().hex}_0_v"]
        assert writer.batch_put_from(fresh, ptrs[:2], sizes[:2], c) == [0, 0]
        c.group_ids = ["only-one"]
        assert writer.batch_put_from([f"{uuid.uuid4().hex}_0_k"] * 2, ptrs[:2], sizes[:2], c) == [-600, -600]
    finally:
        for s in stores:
            s.close()


def test_vllm_mooncake_store_connector(master):
    # MooncakeStoreWorker: one holder (embedded mode) and one standalone-store rank whose
    # global_segment_size is 0, both set up with 7 positional arguments.
    holder = MooncakeDistributedStore()
    assert holder.setup("127.0.0.1", "P2PHANDSHAKE", 128 * MiB, 16 * MiB, "tcp", "", master.addr) == 0
    worker = MooncakeDistributedStore()
    assert worker.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 * MiB, "tcp", "", master.addr) == 0
    try:
        config = ReplicateConfig()
        config.preferred_segment = holder.get_hostname()
        # register_kv_caches: each cache's storage registered by base address and length.
        caches = [np.zeros(8 * PAGE, dtype=np.uint8) for _ in range(2)]
        for c in caches:
            assert worker.register_buffer(c.ctypes.data, c.nbytes) == 0
        caches[0][:] = np.random.default_rng(3).integers(0, 256, caches[0].nbytes, dtype=np.uint8)
        keys = [f"model@tp0@pcp0@dcp0@pp0@g0@{uuid.uuid4().hex}" for _ in range(4)]
        # Lookup: batch_is_exist; save: batch_put_from of the missing blocks with the config.
        assert worker.batch_is_exist(keys) == [0] * 4
        addrs = [caches[0].ctypes.data + i * PAGE for i in range(4)]
        assert worker.batch_put_from(keys, addrs, [PAGE] * 4, config) == [0] * 4
        assert worker.batch_is_exist(keys) == [1] * 4
        # Tier logging: batch_get_replica_desc, read through .get() and is_memory_replica().
        descs = worker.batch_get_replica_desc(keys)
        assert all(descs.get(k) and descs.get(k)[0].is_memory_replica() for k in keys)
        assert all(descs.get(k)[0].get_memory_descriptor().buffer_descriptor.transport_endpoint ==
                   holder.get_hostname() for k in keys)
        # Load: into the other cache; results are byte counts (>= 0 is success).
        dst = [caches[1].ctypes.data + i * PAGE for i in range(4)]
        res = worker.batch_get_into(keys, dst, [PAGE] * 4)
        assert res == [PAGE] * 4
        assert np.array_equal(caches[1][: 4 * PAGE], caches[0][: 4 * PAGE])
        # Reset: remove_all(force=True), even with leases held by the loads just made.
        assert worker.remove_all(force=True) >= 4
        assert worker.batch_is_exist(keys) == [0] * 4
    finally:
        worker.close()
        holder.close()


def test_lmcache_mooncakestore_connector(master):
    # MooncakestoreConnector.__init__: setup (7 positional), ReplicateConfig with replica_num 1
    # and preferred_segment = get_hostname() (prefer_local_alloc), the pinned CPU buffer
    # registered by data_ptr and numel.
    store = MooncakeDistributedStore()
    store.setup("127.0.0.1", "P2PHANDSHAKE", 128 * MiB, 32 * MiB, "tcp", "", master.addr)
    peer = MooncakeDistributedStore()
    assert peer.setup("127.0.0.1", "P2PHANDSHAKE", 64 * MiB, 32 * MiB, "tcp", "", master.addr) == 0
    try:
        replica_config = ReplicateConfig()
        replica_config.replica_num = 1
        replica_config.preferred_segment = store.get_hostname()
        pinned = np.zeros(8 * PAGE, dtype=np.uint8)
        assert store.register_buffer(pinned.ctypes.data, pinned.size) == 0
        chunk = np.random.default_rng(5).integers(0, 256, 2 * PAGE, dtype=np.uint8)
        pinned[: 2 * PAGE] = chunk
        key = f"vllm@model@1@0@{uuid.uuid4().hex}"

        async def put_then_get():
            # _put_without_metadata: put_from(key, data_ptr, size, replica_config) in a thread.
            rc = await asyncio.to_thread(store.put_from, key, pinned.ctypes.data, 2 * PAGE, replica_config)
            assert rc == 0
            assert store.is_exist(key)
            # _batch_get_into: buffers from the pinned pool, batch_get_into in a thread.
            n = await asyncio.to_thread(store.batch_get_into, [key, "vllm@absent"],
                                        [pinned.ctypes.data + 4 * PAGE, pinned.ctypes.data + 6 * PAGE],
                                        [2 * PAGE, 2 * PAGE])
            assert n[0] == 2 * PAGE and n[1] <= 0
            # save_chunk_meta mode reads with batch_get_buffer and torch.frombuffer-style views.
            handles = await asyncio.to_thread(peer.batch_get_buffer, [key])
            return handles

        handles = asyncio.run(put_then_get())
        assert np.array_equal(pinned[4 * PAGE: 6 * PAGE], chunk)
        view = memoryview(handles[0])
        assert len(view) == 2 * PAGE and np.array_equal(np.frombuffer(handles[0], dtype=np.uint8), chunk)
        assert store.get_replica_desc(key)[0].get_memory_descriptor().buffer_descriptor.transport_endpoint == \
            store.get_hostname()
        # close(): unregister the pinned buffer, then close.
        assert store.unregister_buffer(pinned.ctypes.data) == 0
    finally:
        assert store.close() == 0
        peer.close()
