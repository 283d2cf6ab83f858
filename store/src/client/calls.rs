//! The store's calls as the full client carries them out: [`StoreClient`]'s implementation of
//! [`StoreApi`], each call one body over the client's pipeline (plan and executor), its master
//! link and its tiers.

use std::mem::MaybeUninit;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::disk_link::DiskLink;
use super::gets::Target;
use super::plan::Mode;
use super::rpc::check;
use super::sg::{Dst, Reach};
use super::tasks::task_id;
use super::{
    api, check_per_key, in_batches, one_per_key, Extent, HeldBlock, HeldBuffer, Piece, Placer, StoreApi, StoreClient,
    ValueSink, VecSink, Want,
};
use crate::error::{Result, StoreError};
use crate::proto::{
    BatchKeyRequest, BatchReplicaClearRequest, CreateCopyTaskRequest, CreateMoveTaskRequest, KeyRequest, PutOptions,
    QueryKeyReply, QueryTaskRequest, RemoveAllRequest, RemoveByRegexRequest, RemoveRequest, TaskId, TaskInfo,
    UnmountSegmentRequest,
};

impl StoreApi for StoreClient {
    fn segment_name(&self) -> String {
        self.engine.segment_name().to_string()
    }

    fn device_of(&self, addr: u64, len: u64) -> Option<u32> {
        self.engine.local_device_memory(addr, len).map(|m| m.allocation.device)
    }

    fn is_registered(&self, addr: u64, len: u64) -> bool {
        self.engine.is_registered(addr, len)
    }

    /// The options `put` and the other calls without options use: the configured
    /// `replica_num`, and this client's segment as the one `local_first` places on. A start
    /// for the options of the `*_with` calls.
    fn default_options(&self) -> PutOptions {
        PutOptions {
            replica_num: self.config.replica_num,
            preferred_segment: if self.segment.is_some() { self.segment_name().to_string() } else { String::new() },
            ..Default::default()
        }
    }

    /// Whether the master could be reached at the last heartbeat (once a second by default).
    fn master_reachable(&self) -> bool {
        self.master_reachable.load(Ordering::Acquire)
    }

    /// How many values this client read from another client's disk (through its disk
    /// service): Mooncake's `get_offload_rpc_read_count`.
    fn remote_disk_reads(&self) -> u64 {
        self.remote_disk_reads.load(Ordering::Relaxed)
    }

    /// Registers caller memory for `put_from` / `get_into` (once, then reuse it): host memory,
    /// or device memory, told apart by the driver's pointer attributes as upstream's
    /// `register_buffer` does (location `*`; without a driver, host memory). Host pages are
    /// made resident now, as an RDMA registration pins them, so that the first transfers into
    /// it do not fault page by page in the transport's threads (`resident.rs`).
    fn register_buffer(&self, addr: u64, len: u64) -> Result<()> {
        self.register_buffer_at(addr, len, "*")
    }

    /// [`StoreApi::register_buffer`] at a given location: `cpu:N` (host memory), `cuda:N` (memory
    /// of GPU `N`, checked with the driver: an unknown device, a pointer that is not its memory,
    /// a range crossing two allocations or a missing driver is an error), `cuda` (memory of
    /// whichever GPU the driver says, checked likewise: what a binding knows of a tensor that
    /// offers `__cuda_array_interface__`) or `*` (detected).
    fn register_buffer_at(&self, addr: u64, len: u64, location: &str) -> Result<()> {
        let any_gpu = location.trim().eq_ignore_ascii_case("cuda");
        self.engine.register(addr, len, if any_gpu { "*" } else { location })?;
        if self.engine.local_device_memory(addr, len).is_some() {
            return Ok(());
        }
        if any_gpu {
            // Not device memory after all (or no driver to tell): undone, and a registration on
            // GPU 0 says why (the driver missing, or not device memory) without touching it.
            let _ = self.engine.unregister(addr);
            return self.engine.register(addr, len, "cuda:0").map_err(StoreError::from);
        }
        crate::resident::populate(addr, len);
        Ok(())
    }

    /// Registers `[addr, +len)` as the source of the puts about to be made from it (memory
    /// this process wrote, so resident): as [`StoreApi::register_buffer`] but without making the
    /// pages resident, which costs 8-20 ms per 256 MiB even where every page is present
    /// (`MADV_POPULATE_WRITE` walks them all) and buys nothing to a transfer that only reads.
    fn register_source(&self, addr: u64, len: u64) -> Result<()> {
        Ok(self.engine.register(addr, len, "*")?)
    }

    /// Unregisters the buffer registered at `addr`, waiting a bounded time for transfers that
    /// still use it (an error if they do not end).
    fn unregister_buffer(&self, addr: u64) -> Result<()> {
        Ok(self.engine.unregister(addr)?)
    }

    /// A put of a key that exists (or is being put) succeeds and leaves the object as it was,
    /// as Mooncake's puts do ([`StoreApi::upsert_with`] replaces it).
    fn put_with(&self, key: &str, value: &[u8], options: &PutOptions) -> Result<()> {
        self.put_value(key, value, options, Mode::Put)
    }

    /// Zero-copy put of the value made of `pieces` of registered memory, in order (a value
    /// laid out in several buffers, e.g. one per layer).
    fn put_from_sg(&self, key: &str, pieces: &[Piece], options: &PutOptions) -> Result<()> {
        self.put_pieces(key, pieces, options, Mode::Put)
    }

    /// The whole value of `key`, read from the best source (a local replica, the hot cache, a
    /// remote replica, a disk file) into a new vector.
    ///
    /// The vector is not zeroed first (that cost a pass over the value, ~0.45 ms per 10 MiB
    /// here, on top of the transfer): the read writes into its spare capacity, and its length
    /// is set only once a source has written every byte. A get that fails returns the error
    /// and drops the vector unseen.
    fn get(&self, key: &str) -> Result<Vec<u8>> {
        let mut sink = VecSink(Vec::new());
        let size = self.get_with(key, &mut sink)?;
        let mut out = sink.0;
        // SAFETY: the get succeeded, so it wrote all `size` bytes of the memory the sink last
        // gave: `[0, size)` of this vector's capacity.
        unsafe { out.set_len(size as usize) };
        Ok(out)
    }

    /// The whole value of `key`, read from the best source (a local replica, the hot cache, a
    /// remote replica, a disk file) straight into the memory `sink` gives once the size is
    /// known (a binding's own object, such as a Python `bytes`, so that the value is not
    /// copied again after the get); returns the size. Over tcp and shm the transfer writes
    /// into that memory directly, lent to the engine for the call as [`StoreApi::get`]'s vector
    /// is. A sink's memory of the wrong length is the caller's mistake
    /// ([`StoreError::BufferTooSmall`], [`StoreError::InvalidArgument`]), refused before
    /// anything is read.
    fn get_with(&self, key: &str, sink: &mut dyn ValueSink) -> Result<u64> {
        self.get_one(key, Target::Sink(sink))
    }

    /// Zero-copy get of the whole value into `pieces` of registered memory, in order (a value
    /// laid out in several buffers); returns the object's size.
    fn get_into_sg(&self, key: &str, pieces: &[Piece]) -> Result<u64> {
        self.check_registered(pieces.iter().map(|p| (p.addr, p.len)))?;
        self.get_one(key, Target::Registered(Want::Whole(pieces), Vec::new()))
    }

    /// Zero-copy get of ranges of a value: each extent takes `[offset, offset + len)` of the
    /// value into registered memory at `addr`. A range outside the value is the caller's
    /// mistake ([`StoreError::BadRange`]). Returns the bytes read.
    fn get_into_ranges(&self, key: &str, ranges: &[Extent]) -> Result<u64> {
        self.check_registered(ranges.iter().map(|e| (e.addr, e.len)))?;
        self.get_one(key, Target::Registered(Want::Ranges(ranges), Vec::new()))
    }

    /// Mooncake's upsert: stores `value`, replacing the key's value if it has one (the old
    /// object is removed, then the value put again). A reader's lease still protects the old
    /// value: [`StoreError::Leased`] until it ends.
    fn upsert_with(&self, key: &str, value: &[u8], options: &PutOptions) -> Result<()> {
        self.put_value(key, value, options, Mode::Upsert)
    }

    /// [`StoreApi::upsert_with`] of the value made of `pieces` of registered memory, in order.
    fn upsert_from_sg(&self, key: &str, pieces: &[Piece], options: &PutOptions) -> Result<()> {
        self.put_pieces(key, pieces, options, Mode::Upsert)
    }

    /// Puts the value made of `parts` one after another (Mooncake's `put_parts`): gathered as
    /// the parts are copied to the replicas, the same single copy a byte put makes.
    fn put_parts_with(&self, key: &str, parts: &[&[u8]], options: &PutOptions) -> Result<()> {
        self.put_parts(key, parts, options, Mode::Put)
    }

    /// [`StoreApi::put_parts_with`] that replaces the key's value if it has one (`upsert_parts`).
    fn upsert_parts_with(&self, key: &str, parts: &[&[u8]], options: &PutOptions) -> Result<()> {
        self.put_parts(key, parts, options, Mode::Upsert)
    }

    /// Mooncake's `get_buffer`: the value read into a block of this client's local (staging)
    /// buffer, held for the caller until it drops the block. The bytes are copied once, from
    /// wherever they lie (the engine writes a remote replica's straight into the block), and
    /// not again: the block is registered memory, so it can also be handed to the zero-copy
    /// calls. A value larger than the local buffer is the caller's mistake; while the buffer
    /// is full the get waits for room until its deadline.
    fn get_buffer(&self, key: &str) -> Result<HeldBuffer> {
        let list = self.replica_list(key)?;
        let exec = self.exec();
        let block = self.staging.acquire_held(list.size, exec.deadline)?;
        let whole = [Extent { offset: 0, addr: block.addr(), len: list.size }];
        exec.read(key, &list, &mut Dst::Registered(&whole, Reach::host()))?;
        Ok(block.into())
    }

    /// Whole values read into memory the caller places once their sizes are known, with one
    /// master round trip for them all: `place` is given each key's size (`None` where the key
    /// has no value to read) and answers where each value goes (registered memory of at least
    /// that size, or `None` to skip the key); then every read goes in one engine batch. Per
    /// key: the value's size, or why it was not read. For a reader that keeps values in
    /// memory of its own (the sharded tensor reads' results), which would otherwise ask for
    /// the sizes first, in a round trip of their own.
    fn batch_get_into_placed(&self, keys: &[String], place: &mut Placer<'_>) -> Result<Vec<Result<u64>>> {
        let (mut lists, mut results) = Self::split_lists(self.batch_replica_lists(keys)?);
        let sizes: Vec<Option<u64>> = lists.iter().map(|l| l.as_ref().map(|l| l.size)).collect();
        let addrs = place(&sizes)?;
        check_per_key(keys.len(), addrs.len(), "places")?;
        let mut wholes: Vec<Option<[Extent; 1]>> = Vec::with_capacity(keys.len());
        for (i, addr) in addrs.into_iter().enumerate() {
            let whole = match (sizes[i], addr) {
                (Some(len), Some(addr)) if results[i].is_ok() => match self.check_registered([(addr, len)]) {
                    Ok(()) => Some([Extent { offset: 0, addr, len }]),
                    Err(e) => {
                        results[i] = Err(e);
                        None
                    }
                },
                (Some(_), None) if results[i].is_ok() => {
                    results[i] = Err(StoreError::invalid(format!("{:?}: not placed by the caller", keys[i])));
                    None
                }
                _ => None,
            };
            if whole.is_none() {
                lists[i] = None;
            }
            wholes.push(whole);
        }
        let mut dsts: Vec<Option<Dst<'_>>> =
            wholes.iter().map(|w| w.as_ref().map(|w| Dst::Registered(w, Reach::host()))).collect();
        self.exec().read_batch(keys, &lists, &mut dsts, &mut results, false)?;
        Ok(results.into_iter().zip(sizes).map(|(r, n)| r.map(|()| n.unwrap_or(0))).collect())
    }

    /// `len` bytes of this client's local (staging) buffer, held for the caller until it drops
    /// the block, if that much is free in one piece now (none while the buffer is too full;
    /// 0 bytes, or more than the buffer holds, is the caller's mistake). What Mooncake's
    /// `BufferPool` leases: registered memory the zero-copy calls take as it is.
    fn hold_local(&self, len: u64) -> Result<Option<HeldBuffer>> {
        Ok(self.staging.try_acquire_held(len)?.map(HeldBuffer::from))
    }

    /// The size of this client's local (staging) buffer, in bytes.
    fn local_buffer_size(&self) -> u64 {
        self.staging.capacity()
    }

    /// [`StoreApi::put_batch`] with `options`.
    fn put_batch_with(&self, keys: &[String], values: &[&[u8]], options: &PutOptions) -> Result<Vec<Result<()>>> {
        self.put_values(keys, values, options, Mode::Put)
    }

    /// Zero-copy puts of values each made of pieces of registered memory, in order: all remote
    /// writes go in one engine batch.
    fn batch_put_from_sg(&self, keys: &[String], values: &[&[Piece]], options: &PutOptions) -> Result<Vec<Result<()>>> {
        self.put_many_pieces(keys, values, options, Mode::Put)
    }

    /// Gets several values (bytes); one result per key.
    ///
    /// Where no transport needs registered memory (tcp, shm), the values are read as
    /// `batch_get_into` reads them (hits copied from the hot cache, misses as one engine
    /// batch), straight into their result buffers lent to the engine for the call
    /// ([`TransferEngine::lend_local`](crescent_engine::TransferEngine::lend_local)); otherwise one after another through the staging
    /// buffer.
    fn get_batch(&self, keys: &[String]) -> Result<Vec<Result<Vec<u8>>>> {
        let (lists, results) = Self::split_lists(self.batch_replica_lists(keys)?);
        let mut bufs: Vec<Vec<u8>> =
            lists.iter().map(|l| vec![0u8; l.as_ref().map_or(0, |l| l.size) as usize]).collect();
        let outs = bufs.iter_mut().map(|b| Some(&mut b[..])).collect();
        let results = self.read_batch_bytes(keys, &lists, outs, results)?;
        Ok(results.into_iter().zip(bufs).map(|(r, buf)| r.map(|()| buf)).collect())
    }

    /// [`StoreApi::get_batch`] into memory each key's sink makes once the master has given the
    /// sizes (a binding's own objects, such as Python `bytes`, so that no value is copied
    /// again after the get); returns the size read per key. A sink's memory of the wrong
    /// length, or a sink's error, fails its key alone (the caller's mistake for a wrong length,
    /// as in [`StoreApi::get_with`]). The memory is zeroed before the read (a batch lends it to
    /// the engine as registered memory, which the disk tier's reads take as written bytes).
    fn get_batch_with(&self, keys: &[String], sinks: &mut [&mut dyn ValueSink]) -> Result<Vec<Result<u64>>> {
        check_per_key(keys.len(), sinks.len(), "sinks")?;
        let (lists, mut results) = Self::split_lists(self.batch_replica_lists(keys)?);
        let mut outs = Vec::with_capacity(keys.len());
        for (i, sink) in sinks.iter_mut().enumerate() {
            let out = match (&lists[i], &results[i]) {
                (Some(list), Ok(())) => match api::sink_buffer(&keys[i], &mut **sink, list.size) {
                    Ok(out) => {
                        out.fill(MaybeUninit::new(0));
                        // SAFETY: every byte was just written.
                        Some(unsafe { out.assume_init_mut() })
                    }
                    Err(e) => {
                        results[i] = Err(e);
                        None
                    }
                },
                _ => None,
            };
            outs.push(out);
        }
        let results = self.read_batch_bytes(keys, &lists, outs, results)?;
        Ok(results.into_iter().zip(&lists).map(|(r, l)| r.map(|()| l.as_ref().map_or(0, |l| l.size))).collect())
    }

    /// [`StoreApi::batch_get_into`] for values laid out in several buffers: each key's whole value
    /// goes into its pieces of registered memory, in order. Returns sizes read.
    fn batch_get_into_sg(&self, keys: &[String], values: &[&[Piece]]) -> Result<Vec<Result<u64>>> {
        read_into_registered(self, keys, values, "buffer lists", |p| (p.addr, p.len), Want::Whole)
    }

    /// [`StoreApi::get_into_ranges`] for several keys: one master round trip, remote reads in one
    /// engine batch. Returns the bytes read per key.
    fn batch_get_into_ranges(&self, keys: &[String], ranges: &[&[Extent]]) -> Result<Vec<Result<u64>>> {
        read_into_registered(self, keys, ranges, "range lists", |e| (e.addr, e.len), Want::Ranges)
    }

    /// [`StoreApi::upsert_with`] of several values (bytes); one result per key.
    fn upsert_batch_with(&self, keys: &[String], values: &[&[u8]], options: &PutOptions) -> Result<Vec<Result<()>>> {
        self.put_values(keys, values, options, Mode::Upsert)
    }

    /// [`StoreApi::upsert_with`] of values each made of pieces of registered memory, in order.
    fn batch_upsert_from_sg(
        &self,
        keys: &[String],
        values: &[&[Piece]],
        options: &PutOptions,
    ) -> Result<Vec<Result<()>>> {
        self.put_many_pieces(keys, values, options, Mode::Upsert)
    }

    /// [`StoreApi::get_buffer`] for several keys: one master round trip, remote reads in one
    /// engine batch; one result per key.
    fn batch_get_buffer(&self, keys: &[String]) -> Result<Vec<Result<HeldBuffer>>> {
        let (lists, mut results) = Self::split_lists(self.batch_replica_lists(keys)?);
        let exec = self.exec();
        let mut blocks: Vec<Option<HeldBlock>> = Vec::with_capacity(keys.len());
        for (list, result) in lists.iter().zip(results.iter_mut()) {
            let held = list.as_ref().map(|l| self.staging.acquire_held(l.size, exec.deadline));
            blocks.push(match held {
                Some(Ok(block)) => Some(block),
                Some(Err(e)) => {
                    *result = Err(e);
                    None
                }
                None => None,
            });
        }
        let wholes: Vec<Option<[Extent; 1]>> =
            blocks.iter().map(|b| b.as_ref().map(|b| [Extent { offset: 0, addr: b.addr(), len: b.len() }])).collect();
        let mut dsts: Vec<Option<Dst<'_>>> =
            wholes.iter().map(|w| w.as_ref().map(|w| Dst::Registered(w, Reach::host()))).collect();
        exec.read_batch(keys, &lists, &mut dsts, &mut results, false)?;
        Ok(results
            .into_iter()
            .zip(blocks)
            .map(|(r, block)| {
                r.and_then(|()| {
                    block.map(HeldBuffer::from).ok_or_else(|| StoreError::Internal("a read without its block".into()))
                })
            })
            .collect())
    }

    /// Whether a committed object exists (no lease is granted).
    fn exists(&self, key: &str) -> Result<bool> {
        let req = KeyRequest { client_id: self.id.clone(), key: key.to_string(), ..Default::default() };
        let reply =
            self.rpc.unary(crate::fastrpc::Method::Exists, req, |mut c, req| async move { c.exists(req).await })?;
        check(reply.status, key)?;
        Ok(reply.exists)
    }

    /// [`StoreApi::exists`] for several keys, in one call to the master; one answer per key.
    fn batch_exists(&self, keys: &[String]) -> Result<Vec<bool>> {
        in_batches(keys.len(), |r| {
            let req =
                BatchKeyRequest { client_id: self.id.clone(), keys: keys[r.clone()].to_vec(), ..Default::default() };
            let reply = self.rpc.unary(crate::fastrpc::Method::BatchExists, req, |mut c, req| async move {
                c.batch_exists(req).await
            })?;
            check(reply.status, "")?;
            one_per_key(reply.exists.len(), r.len())?;
            Ok(reply.exists)
        })
    }

    /// Everything the master knows of a key, without side effects.
    fn query(&self, key: &str) -> Result<QueryKeyReply> {
        let req = KeyRequest { client_id: self.id.clone(), key: key.to_string(), ..Default::default() };
        let mut reply = self.rpc.call(|mut c| async move { c.query_key(req).await })?;
        check(reply.status.take(), key)?;
        Ok(reply)
    }

    /// Size of a committed object (no lease).
    fn get_size(&self, key: &str) -> Result<u64> {
        let q = self.query(key)?;
        if !q.exists {
            return Err(StoreError::NotFound(key.to_string()));
        }
        Ok(q.size)
    }

    /// [`StoreApi::remove`]; `force` removes an object even while a reader holds its lease.
    fn remove_with(&self, key: &str, force: bool) -> Result<()> {
        self.hot_invalidate(key);
        let req = RemoveRequest { client_id: self.id.clone(), key: key.to_string(), force };
        let reply = self.rpc.call(|mut c| async move { c.remove(req).await })?;
        check(reply.status, key)?;
        self.sync_disk_removals();
        Ok(())
    }

    /// [`StoreApi::remove_by_regex`]; `force` removes leased objects too.
    fn remove_by_regex_with(&self, pattern: &str, force: bool) -> Result<u64> {
        if let (Some(hot), Ok(re)) = (&self.hot, regex::Regex::new(pattern)) {
            hot.invalidate_matching(&re);
        }
        let req = RemoveByRegexRequest { client_id: self.id.clone(), pattern: pattern.to_string(), force };
        let reply = self.rpc.call(|mut c| async move { c.remove_by_regex(req).await })?;
        check(reply.status, pattern)?;
        self.sync_disk_removals();
        Ok(reply.removed)
    }

    /// Removes every committed object (`force`: leased ones too); returns how many.
    fn remove_all_with(&self, force: bool) -> Result<u64> {
        if let Some(hot) = &self.hot {
            hot.clear();
        }
        let req = RemoveAllRequest { client_id: self.id.clone(), force };
        let reply = self.rpc.call(|mut c| async move { c.remove_all(req).await })?;
        check(reply.status, "")?;
        self.sync_disk_removals();
        Ok(reply.removed)
    }

    /// Stops heartbeats and unmounts the segment (its objects are dropped by the master).
    fn close(&self) -> Result<()> {
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        self.stop.store(true, Ordering::Release);
        self.blanks.stop();
        if let Some(hot) = &self.hot {
            hot.close(); // the deferred filler stops (its queued fills dropped)
        }
        self.metrics_server.lock().take();
        self.close_sessions();
        let disk_closed = self.disk.as_ref().map_or(Ok(()), DiskLink::close);
        let extras_closed = self.unmount_all_extras();
        // Segment 0 is none: a client whose first mount failed (a master that refused its
        // credentials, say) has nothing to unmount, and the master would answer
        // `SegmentNotFound` to a call it might refuse besides.
        let segment_id = self.segment_id.load(Ordering::Acquire);
        if self.segment.is_some() && segment_id != 0 {
            let req = UnmountSegmentRequest { client_id: self.id.clone(), segment_id };
            let reply = self.rpc.call(|mut c| async move { c.unmount_segment(req).await })?;
            check(reply.status, "")?;
        }
        disk_closed.and(extras_closed)
    }

    // ---- segments mounted at run time (segments.rs), replica tasks, sessions (session.rs) ----

    fn mount_segment(&self, path: &std::path::Path, offset: u64, size: u64, location: &str) -> Result<Vec<String>> {
        StoreClient::mount_segment(self, path, offset, size, location)
    }
    fn allocate_and_mount_segment(&self, size: u64, location: &str) -> Result<(Vec<String>, u64)> {
        StoreClient::allocate_and_mount_segment(self, size, location)
    }
    fn unmount_segments(&self, ids: &[String], free: bool, grace: Duration) -> Vec<Result<()>> {
        StoreClient::unmount_segments(self, ids, free, grace)
    }
    fn unmount_local_disk_segment(&self, grace: Duration) -> Result<()> {
        StoreClient::unmount_local_disk_segment(self, grace)
    }
    fn create_copy_task(&self, key: &str, targets: &[String]) -> Result<(u64, u64)> {
        let req = CreateCopyTaskRequest { client_id: self.id.clone(), key: key.to_string(), targets: targets.to_vec() };
        let mut reply = self.rpc.call(|mut c| async move { c.create_copy_task(req).await })?;
        check(reply.status.take(), key)?;
        task_id(reply.id.as_ref())
    }
    fn create_move_task(&self, key: &str, source: &str, target: &str) -> Result<(u64, u64)> {
        let req = CreateMoveTaskRequest {
            client_id: self.id.clone(),
            key: key.to_string(),
            source: source.to_string(),
            target: target.to_string(),
        };
        let mut reply = self.rpc.call(|mut c| async move { c.create_move_task(req).await })?;
        check(reply.status.take(), key)?;
        task_id(reply.id.as_ref())
    }
    fn query_task(&self, id: (u64, u64)) -> Result<TaskInfo> {
        let req = QueryTaskRequest { client_id: self.id.clone(), id: Some(TaskId { high: id.0, low: id.1 }) };
        let mut reply = self.rpc.call(|mut c| async move { c.query_task(req).await })?;
        check(reply.status.take(), "")?;
        reply.task.ok_or_else(|| StoreError::BadReply("a task query's reply carries no task".into()))
    }
    fn batch_replica_clear(&self, keys: &[String], segment_name: &str) -> Result<Vec<String>> {
        let req = BatchReplicaClearRequest {
            client_id: self.id.clone(),
            keys: keys.to_vec(),
            segment_name: segment_name.to_string(),
        };
        let mut reply = self.rpc.call(|mut c| async move { c.batch_replica_clear(req).await })?;
        check(reply.status.take(), "")?;
        Ok(reply.cleared_keys)
    }
    fn batch_get_session_start(&self, keys: &[String]) -> Result<Vec<Result<()>>> {
        StoreClient::batch_get_session_start(self, keys)
    }
    fn batch_get_into_session_ranges(&self, keys: &[String], ranges: &[&[Extent]]) -> Result<Vec<Result<u64>>> {
        StoreClient::batch_get_into_session_ranges(self, keys, ranges)
    }
    fn batch_get_session_end(&self, keys: &[String]) -> Result<()> {
        StoreClient::batch_get_session_end(self, keys);
        Ok(())
    }
    fn batch_put_session_start(&self, keys: &[String], sizes: &[u64], options: &PutOptions) -> Result<Vec<Result<()>>> {
        StoreClient::batch_put_session_start(self, keys, sizes, options)
    }
    fn batch_put_from_session_ranges(&self, keys: &[String], ranges: &[&[Extent]]) -> Result<Vec<Result<u64>>> {
        StoreClient::batch_put_from_session_ranges(self, keys, ranges)
    }
    fn batch_put_session_end(&self, keys: &[String]) -> Result<Vec<Result<()>>> {
        StoreClient::batch_put_session_end(self, keys)
    }
    fn batch_put_session_revoke(&self, keys: &[String]) -> Result<Vec<Result<()>>> {
        StoreClient::batch_put_session_revoke(self, keys)
    }
}

/// Reads `keys[i]` into the registered memory of `lists[i]` (`what` the lists are, in errors)
/// as `want` makes of it; `span` is an element's address and length.
fn read_into_registered<'a, T>(
    client: &StoreClient,
    keys: &[String],
    lists: &[&'a [T]],
    what: &str,
    span: impl Fn(&T) -> (u64, u64),
    want: fn(&'a [T]) -> Want<'a>,
) -> Result<Vec<Result<u64>>> {
    check_per_key(keys.len(), lists.len(), what)?;
    client.check_registered(lists.iter().flat_map(|l| l.iter().map(&span)))?;
    let wants: Vec<Want<'_>> = lists.iter().map(|l| want(l)).collect();
    client.read_many(keys, &wants)
}
