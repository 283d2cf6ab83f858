"""The sequences of calls that SGLang's HiCache Mooncake backend, vLLM's MooncakeStoreConnector
and LMCache's Mooncake connector make, replayed through the `mooncake` alias with their
arguments and data checked, without installing those projects: their single-buffer paths, the
multi-buffer layouts (SGLang's MLA / hybrid pools, vLLM's per-layer KV caches) and LMCache's
put_parts / batch_get_buffer."""

import asyncio
import uuid

import numpy as np

from mooncake.store import MooncakeDistributedStore, ReplicateConfig

from conftest import MiB, master_fixture

PAGE = 64 * 1024  # bytes of one page's K (or V) in a host pool


master = master_fixture("--lease-ttl-ms", "1000")


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


def test_sglang_hicache_multi_buffer_layouts(master):
    # MooncakeStore._put_batch_zero_copy_impl / _get_batch_zero_copy_impl: when a page's
    # buffer metadata is a list per key (hybrid models: the KV pool and a second pool such as
    # NSA's indexer or a mamba state pool; MLA with split latent / rope parts), the batch goes
    # through the multi-buffer calls, with a ReplicateConfig (group_ids) on the put.
    writer, reader = MooncakeDistributedStore(), MooncakeDistributedStore()
    for s in (writer, reader):
        assert s.setup("127.0.0.1", "P2PHANDSHAKE", 64 * MiB, 16 * MiB, "tcp", "", master.addr, None) == 0
    try:
        kv_page, extra_page = 48 * 1024, 4 * 1024
        pools = {s: (np.zeros(16 * kv_page, dtype=np.uint8), np.zeros(16 * extra_page, dtype=np.uint8))
                 for s in (writer, reader)}
        for s, (kv, extra) in pools.items():
            assert s.register_buffer(kv.ctypes.data, kv.nbytes) == 0
            assert s.register_buffer(extra.ctypes.data, extra.nbytes) == 0
        kv, extra = pools[writer]
        kv[:] = np.random.default_rng(11).integers(0, 256, kv.nbytes, dtype=np.uint8)
        extra[:] = np.random.default_rng(12).integers(0, 256, extra.nbytes, dtype=np.uint8)
        keys = [f"{uuid.uuid4().hex}_0" for _ in range(5)]

        def meta(store, slots):
            kv, extra = pools[store]
            ptrs = [[kv.ctypes.data + i * kv_page, extra.ctypes.data + i * extra_page] for i in slots]
            return ptrs, [[kv_page, extra_page] for _ in slots]

        ptrs, sizes = meta(writer, range(5))
        assert writer.batch_is_exist(keys) == [0] * 5
        config = ReplicateConfig()
        config.group_ids = [f"sglang-hicache:{k}" for k in keys]
        assert writer.batch_put_from_multi_buffers(keys, ptrs, sizes, config) == [0] * 5
        assert reader.batch_is_exist(keys) == [1] * 5
        rptrs, rsizes = meta(reader, range(10, 15))
        got = reader.batch_get_into_multi_buffers(keys, rptrs, rsizes)
        assert got == [kv_page + extra_page] * 5
        rkv, rextra = pools[reader]
        assert np.array_equal(rkv[10 * kv_page: 15 * kv_page], kv[: 5 * kv_page])
        assert np.array_equal(rextra[10 * extra_page: 15 * extra_page], extra[: 5 * extra_page])
        # A page that is not there fails alone; the hit pages before it still load.
        got = reader.batch_get_into_multi_buffers([keys[0], "absent_0"], rptrs[:2], rsizes[:2])
        assert got[0] == kv_page + extra_page and got[1] < 0
    finally:
        writer.close()
        reader.close()


def test_vllm_connector_saves_and_loads_per_layer_blocks(master):
    # KVCacheStoreSendingThread._handle_request / KVCacheStoreRecvingThread: a key per block
    # chunk, its value the chunk's bytes in every layer's K and V cache (one address per
    # cache: base + block_id * block_bytes), put with the connector's ReplicateConfig after a
    # batch_is_exist dedup, loaded into other block ids by a standalone rank
    # (global_segment_size 0) with batch_get_into_multi_buffers; results are byte counts.
    holder = MooncakeDistributedStore()
    assert holder.setup("127.0.0.1", "P2PHANDSHAKE", 128 * MiB, 16 * MiB, "tcp", "", master.addr) == 0
    ranks = [MooncakeDistributedStore() for _ in range(2)]
    for r in ranks:
        assert r.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 * MiB, "tcp", "", master.addr) == 0
    try:
        layers, blocks, block_bytes = 4, 16, 16 * 1024
        caches = {r: [np.zeros(blocks * block_bytes, dtype=np.uint8) for _ in range(2 * layers)] for r in ranks}
        for r, cs in caches.items():
            for c in cs:
                assert r.register_buffer(c.ctypes.data, c.nbytes) == 0
        saver, loader = ranks
        for i, c in enumerate(caches[saver]):
            c[:] = np.random.default_rng(100 + i).integers(0, 256, c.nbytes, dtype=np.uint8)
        config = ReplicateConfig()
        config.preferred_segment = holder.get_hostname()

        def prepare_value(rank, block_id):
            return [c.ctypes.data + block_id * block_bytes for c in caches[rank]], [block_bytes] * (2 * layers)

        keys = [f"model@tp0@pp0@g0@{uuid.uuid4().hex}" for _ in range(6)]
        exists = saver.batch_is_exist(keys[:2])
        assert exists == [0, 0]
        addrs, sizes = zip(*(prepare_value(saver, b) for b in range(6)))
        res = saver.batch_put_from_multi_buffers(keys, list(addrs), list(sizes), config)
        assert [i for i, v in enumerate(res) if v < 0] == []
        # Saved again (a later chunk of the same request): existing keys succeed, unchanged.
        assert saver.batch_put_from_multi_buffers(keys[:2], list(addrs[2:4]), list(sizes[:2]), config) == [0, 0]
        descs = loader.batch_get_replica_desc(keys)
        assert all(descs[k][0].get_memory_descriptor().buffer_descriptor.transport_endpoint ==
                   holder.get_hostname() for k in keys)
        # Load into block ids 8..13, rotated by tp rank as the connector does.
        load = list(range(8, 14))
        rot = 1
        key_list = keys[rot:] + keys[:rot]
        block_list = load[rot:] + load[:rot]
        laddrs, lsizes = zip(*(prepare_value(loader, b) for b in block_list))
        res = loader.batch_get_into_multi_buffers(key_list, list(laddrs), list(lsizes))
        assert res == [2 * layers * block_bytes] * 6
        for src, dst in zip(caches[saver], caches[loader]):
            assert np.array_equal(dst[8 * block_bytes: 14 * block_bytes], src[: 6 * block_bytes])
        assert holder.remove_all(force=True) >= 6
    finally:
        for r in ranks:
            r.close()
        holder.close()


def test_lmcache_put_parts_then_batch_get_buffer(master):
    # MooncakestoreConnector with save_chunk_meta: put_parts(key, metadata, kv bytes) in a
    # thread; reads with batch_get_buffer, the metadata parsed from the first bytes and the
    # chunk copied out of the handle (torch.frombuffer-style view).
    store = MooncakeDistributedStore()
    assert store.setup("127.0.0.1", "P2PHANDSHAKE", 128 * MiB, 32 * MiB, "tcp", "", master.addr) == 0
    peer = MooncakeDistributedStore()
    assert peer.setup("127.0.0.1", "P2PHANDSHAKE", 64 * MiB, 32 * MiB, "tcp", "", master.addr) == 0
    try:
        import struct
        chunks = {f"vllm@model@1@0@{uuid.uuid4().hex}": np.random.default_rng(i).integers(0, 256, 2 * PAGE + i,
                                                                                        dtype=np.uint8)
                  for i in range(3)}

        async def save_all():
            for k, chunk in chunks.items():
                meta = struct.pack("<iiiii", chunk.nbytes, 0, 3, 2, 64)  # length, fmt, dtype, shape
                rc = await asyncio.to_thread(store.put_parts, k, meta, memoryview(chunk))
                assert rc == 0

        asyncio.run(save_all())
        handles = peer.batch_get_buffer(list(chunks) + ["vllm@absent"])
        assert handles[-1] is None
        for h, chunk in zip(handles, chunks.values()):
            view = memoryview(h)
            length = struct.unpack_from("<i", view)[0]
            assert length == chunk.nbytes and len(view) == 20 + length
            assert np.array_equal(np.frombuffer(h, dtype=np.uint8, offset=20), chunk)
        del view
        handles.clear()
    finally:
        store.close()
        peer.close()
