//! The store's API as one trait, [`StoreApi`], implemented by the full client
//! ([`StoreClient`](super::StoreClient), which owns a segment, an engine and the disk tier)
//! and by a dummy client ([`super::dummy::DummyClient`], which forwards every call to a
//! standalone client on this host). Bindings (the Python `MooncakeDistributedStore`, the
//! `crescent` tool) hold an `Arc<dyn StoreApi>` and work with either.
//!
//! Each call is written once: the full client's bodies are its `impl StoreApi` (in
//! `client/mod.rs`, documented there where it does more than the trait says), so a caller
//! holding a `StoreClient` imports this trait. The provided methods are the short forms
//! (default options, one buffer) and what a dummy client does not carry.

use std::mem::MaybeUninit;

use crate::error::{Result, StoreError};
use crate::proto::{PutOptions, QueryKeyReply};

use super::op::{Batch, Buffer, Dest, Held, HeldBuffer, Kind, Op, Outcome, Placer, Source, ValueSink};
use super::sg::{Extent, Piece};
use super::{check_per_key, HeldBlock};

impl Held for HeldBlock {
    fn addr(&self) -> u64 {
        HeldBlock::addr(self)
    }
    fn len(&self) -> u64 {
        HeldBlock::len(self)
    }
}

impl From<HeldBlock> for HeldBuffer {
    fn from(block: HeldBlock) -> HeldBuffer {
        HeldBuffer::new(block)
    }
}

/// `sink`'s memory for a value of `size` bytes, refused unless it is exactly that long.
pub(crate) fn sink_buffer<'s>(
    key: &str,
    sink: &'s mut (dyn ValueSink + '_),
    size: u64,
) -> Result<&'s mut [MaybeUninit<u8>]> {
    let out = sink.buffer(size)?;
    let have = out.len() as u64;
    if have < size {
        return Err(StoreError::BufferTooSmall { key: key.to_string(), need: size, have });
    }
    if have > size {
        return Err(StoreError::invalid(format!(
            "get of {key:?}: the sink gave {have} bytes for a value of {size}; it must give exactly the size asked for"
        )));
    }
    Ok(out)
}

/// The store's calls, whichever client carries them out.
pub trait StoreApi: Send + Sync {
    /// The name of the segment this client's puts prefer (`local_first`): a full client's
    /// own, a dummy client's standalone client's.
    fn segment_name(&self) -> String;
    /// The options the calls without options use.
    fn default_options(&self) -> PutOptions;

    /// Whether the master answered lately (a dummy client asks its standalone client; false
    /// when that cannot be reached).
    fn master_reachable(&self) -> bool;

    /// How many values were read from another client's disk through its disk service
    /// (Mooncake's `get_offload_rpc_read_count`); 0 where this side reads none itself (a dummy
    /// client, as upstream's answers 0 for one).
    fn remote_disk_reads(&self) -> u64 {
        0
    }

    /// Registers memory of this process for the zero-copy calls (host memory, or a GPU's
    /// memory where the driver's pointer attributes say so).
    fn register_buffer(&self, addr: u64, len: u64) -> Result<()>;
    /// [`StoreApi::register_buffer`] at a location given (`cpu:N`, `cuda:N`, `*`: see the
    /// full client's, [`StoreClient`](super::StoreClient)). Provided: host locations only (a
    /// dummy client moves host memory only).
    fn register_buffer_at(&self, addr: u64, len: u64, location: &str) -> Result<()> {
        match location.trim() {
            "" | "*" => self.register_buffer(addr, len),
            l if l.to_ascii_lowercase().starts_with("cpu") => self.register_buffer(addr, len),
            l => Err(StoreError::invalid(format!(
                "register_buffer at {l}: this client moves host memory only (device memory needs a client set up with setup())"
            ))),
        }
    }
    /// Registers `[addr, +len)` for puts that read from it (a full client makes
    /// no pages resident). Provided: [`StoreApi::register_buffer`].
    fn register_source(&self, addr: u64, len: u64) -> Result<()> {
        self.register_buffer(addr, len)
    }
    /// The GPU whose registered memory `[addr, +len)` is, if it is device memory. Provided:
    /// none (a dummy client registers host memory only).
    fn device_of(&self, addr: u64, len: u64) -> Option<u32> {
        let _ = (addr, len);
        None
    }
    /// Unregisters the buffer registered at `addr`, waiting a bounded time for transfers that
    /// still use it (an error if they do not end).
    fn unregister_buffer(&self, addr: u64) -> Result<()>;
    /// Whether `[addr, +len)` may be handed to the zero-copy calls as it is.
    fn is_registered(&self, addr: u64, len: u64) -> bool;

    /// Puts `value` under `key` with `options`; a key that exists is left as it was.
    fn put_with(&self, key: &str, value: &[u8], options: &PutOptions) -> Result<()>;
    /// Zero-copy put of the value made of `pieces` of registered memory, in order.
    fn put_from_sg(&self, key: &str, pieces: &[Piece], options: &PutOptions) -> Result<()>;
    /// The whole value of `key`, copied into a new vector.
    fn get(&self, key: &str) -> Result<Vec<u8>>;
    /// The whole value of `key`, written into the memory `sink` gives once the size is known;
    /// returns the size. Provided: a [`StoreApi::get`] copied
    /// into the sink (a dummy client receives the value over its socket first).
    fn get_with(&self, key: &str, sink: &mut dyn ValueSink) -> Result<u64> {
        let value = self.get(key)?;
        sink_buffer(key, sink, value.len() as u64)?.write_copy_of_slice(&value);
        Ok(value.len() as u64)
    }
    /// Zero-copy get of the whole value into `pieces` of registered memory, in order; returns
    /// the object's size.
    fn get_into_sg(&self, key: &str, pieces: &[Piece]) -> Result<u64>;
    /// Zero-copy get of ranges of the value; returns the bytes read.
    fn get_into_ranges(&self, key: &str, ranges: &[Extent]) -> Result<u64>;
    /// Puts that replace the key's value if it has one (Mooncake's upserts).
    fn upsert_with(&self, key: &str, value: &[u8], options: &PutOptions) -> Result<()>;
    /// [`StoreApi::put_from_sg`] that replaces the key's value if it has one.
    fn upsert_from_sg(&self, key: &str, pieces: &[Piece], options: &PutOptions) -> Result<()>;
    /// The value made of `parts`, one after another (`put_parts` / `upsert_parts`).
    fn put_parts_with(&self, key: &str, parts: &[&[u8]], options: &PutOptions) -> Result<()>;
    /// [`StoreApi::put_parts_with`] that replaces the key's value if it has one.
    fn upsert_parts_with(&self, key: &str, parts: &[&[u8]], options: &PutOptions) -> Result<()>;
    /// The value held in memory of this process until the result is dropped.
    fn get_buffer(&self, key: &str) -> Result<HeldBuffer>;
    /// Whole values read into memory `place` gives once their sizes are known. Provided: each
    /// key's size asked on its own,
    /// then one batch of zero-copy gets (a dummy client).
    fn batch_get_into_placed(&self, keys: &[String], place: &mut Placer<'_>) -> Result<Vec<Result<u64>>> {
        let sizes: Vec<Result<u64>> = keys.iter().map(|k| self.get_size(k)).collect();
        let addrs = place(&sizes.iter().map(|s| s.as_ref().ok().copied()).collect::<Vec<_>>())?;
        check_per_key(keys.len(), addrs.len(), "places")?;
        let mut out: Vec<Result<u64>> = Vec::with_capacity(keys.len());
        let (mut wanted, mut pieces) = (Vec::new(), Vec::new());
        for (i, (size, addr)) in sizes.into_iter().zip(addrs).enumerate() {
            out.push(match (size, addr) {
                (Err(e), _) => Err(e),
                (Ok(_), None) => Err(StoreError::invalid(format!("{:?}: not placed by the caller", keys[i]))),
                (Ok(n), Some(addr)) => {
                    wanted.push(i);
                    pieces.push([Piece::new(addr, n)]);
                    Ok(n)
                }
            });
        }
        let names: Vec<String> = wanted.iter().map(|&i| keys[i].clone()).collect();
        let refs: Vec<&[Piece]> = pieces.iter().map(|p| &p[..]).collect();
        for (i, r) in wanted.into_iter().zip(self.batch_get_into_sg(&names, &refs)?) {
            if let Err(e) = r {
                out[i] = Err(e);
            }
        }
        Ok(out)
    }
    /// `len` bytes of the client's local buffer, held until the result is dropped, if they
    /// are free now. Provided: a client without a local buffer
    /// of its own (a dummy client, as in Mooncake) refuses.
    fn hold_local(&self, len: u64) -> Result<Option<HeldBuffer>> {
        let _ = len;
        Err(StoreError::invalid("this client has no local buffer of its own to lease from"))
    }
    /// The size of the client's local buffer in bytes, 0 for a client without one.
    fn local_buffer_size(&self) -> u64 {
        0
    }

    /// Puts several values (bytes), `values[i]` under `keys[i]`; one result per key.
    fn put_batch_with(&self, keys: &[String], values: &[&[u8]], options: &PutOptions) -> Result<Vec<Result<()>>>;
    /// Zero-copy puts of values each made of pieces of registered memory; one result per key.
    fn batch_put_from_sg(&self, keys: &[String], values: &[&[Piece]], options: &PutOptions) -> Result<Vec<Result<()>>>;
    /// The values of several keys, as bytes; one result per key.
    fn get_batch(&self, keys: &[String]) -> Result<Vec<Result<Vec<u8>>>>;
    /// The values of several keys, each written into the memory its sink makes once the
    /// sizes are known; the size per key. Provided: a
    /// [`StoreApi::get_batch`] copied into the sinks.
    fn get_batch_with(&self, keys: &[String], sinks: &mut [&mut dyn ValueSink]) -> Result<Vec<Result<u64>>> {
        check_per_key(keys.len(), sinks.len(), "sinks")?;
        let values = self.get_batch(keys)?;
        Ok(values
            .into_iter()
            .zip(sinks.iter_mut())
            .zip(keys)
            .map(|((value, sink), key)| {
                let value = value?;
                sink_buffer(key, &mut **sink, value.len() as u64)?.write_copy_of_slice(&value);
                Ok(value.len() as u64)
            })
            .collect())
    }
    /// Zero-copy gets of several whole values, each into its pieces of registered memory;
    /// the size read per key.
    fn batch_get_into_sg(&self, keys: &[String], values: &[&[Piece]]) -> Result<Vec<Result<u64>>>;
    /// Zero-copy gets of ranges of several values; the bytes read per key.
    fn batch_get_into_ranges(&self, keys: &[String], ranges: &[&[Extent]]) -> Result<Vec<Result<u64>>>;
    /// [`StoreApi::put_batch_with`] that replaces each key's value if it has one.
    fn upsert_batch_with(&self, keys: &[String], values: &[&[u8]], options: &PutOptions) -> Result<Vec<Result<()>>>;
    /// [`StoreApi::batch_put_from_sg`] that replaces each key's value if it has one.
    fn batch_upsert_from_sg(
        &self,
        keys: &[String],
        values: &[&[Piece]],
        options: &PutOptions,
    ) -> Result<Vec<Result<()>>>;
    /// [`StoreApi::get_buffer`] for several keys; one result per key.
    fn batch_get_buffer(&self, keys: &[String]) -> Result<Vec<Result<HeldBuffer>>>;

    /// Whether a committed object has this key (no lease is granted).
    fn exists(&self, key: &str) -> Result<bool>;
    /// [`StoreApi::exists`] for several keys, in one call to the master; one answer per key.
    fn batch_exists(&self, keys: &[String]) -> Result<Vec<bool>>;
    /// Everything the master knows of a key (replicas, size, lease), without side effects.
    fn query(&self, key: &str) -> Result<QueryKeyReply>;
    /// The size in bytes of a committed object (no lease is granted).
    fn get_size(&self, key: &str) -> Result<u64>;
    /// Removes an object; refused with [`crate::StoreError::Leased`] while a reader holds its
    /// lease, unless `force`.
    fn remove_with(&self, key: &str, force: bool) -> Result<()>;
    /// `force`: leased objects too.
    fn remove_by_regex_with(&self, pattern: &str, force: bool) -> Result<u64>;
    /// Removes every committed object (`force`: leased ones too); returns how many.
    fn remove_all_with(&self, force: bool) -> Result<u64>;

    /// Ends the client (a full client unmounts its segment; a dummy client releases what it
    /// shared with its standalone client). Twice is fine.
    fn close(&self) -> Result<()>;

    /// `len` bytes of memory shared with the standalone client (a dummy client's pool), usable
    /// by the zero-copy calls without registering. A full client has no pool: it allocates
    /// nothing here (register the caller's memory instead).
    fn alloc_from_mem_pool(&self, len: u64) -> Result<u64> {
        Err(crate::StoreError::invalid(format!(
            "alloc_from_mem_pool({len}): only a dummy client (setup_dummy) has a memory pool; register memory with \
             register_buffer instead"
        )))
    }

    // ---- segments mounted at run time: a full client's (upstream's need a `RealClient`) ----

    /// Mounts `[offset, +size)` of the file at `path` (mapped shared, read-write, and
    /// registered with the engine) as a segment of this client; returns its ids (one, or none
    /// for `size` 0, as Mooncake). `offset` must be a multiple of the page size, the range
    /// within the file. The file's bytes are the pool's until [`StoreApi::unmount_segments`].
    fn mount_segment(&self, path: &std::path::Path, offset: u64, size: u64, location: &str) -> Result<Vec<String>> {
        let _ = (path, offset, size, location);
        Err(no_segments("mount_segment"))
    }
    /// Allocates `size` bytes (rounded up to a multiple of 4 MiB, as Mooncake) of page-aligned host memory,
    /// registers them with the engine and mounts them as a segment of this client; returns its
    /// ids and the size allocated.
    fn allocate_and_mount_segment(&self, size: u64, location: &str) -> Result<(Vec<String>, u64)> {
        let _ = (size, location);
        Err(no_segments("allocate_and_mount_segment"))
    }
    /// Unmounts the segments `ids` that [`StoreApi::mount_segment`] (`free` false) or
    /// [`StoreApi::allocate_and_mount_segment`] (`free` true) mounted; one result per id. Their
    /// replicas leave the pool at once (objects whose only copy was there are gone); their
    /// memory stays registered and unchanged while calls the master granted before may still
    /// use it, and at least `grace`, then is unregistered (and freed, or unmapped).
    fn unmount_segments(&self, ids: &[String], free: bool, grace: std::time::Duration) -> Vec<Result<()>> {
        let _ = grace;
        let name = if free { "unmount_and_free_segment" } else { "unmount_segment" };
        ids.iter().map(|_| Err(no_segments(name))).collect()
    }
    /// Mooncake's `unmount_local_disk_segment`: unmounts this client's disk tier at the master
    /// (see `DiskLink::drain`) and waits `grace`; without a disk tier, nothing (as upstream).
    fn unmount_local_disk_segment(&self, grace: std::time::Duration) -> Result<()> {
        let _ = grace;
        Err(no_segments("unmount_local_disk_segment"))
    }

    // ---- sessions (Mooncake's `batch_*_session_*`): a full client keeps them ----

    /// Starts a get session for each key: its replica list asked once (one master round
    /// trip), kept with its lease for [`StoreApi::batch_get_into_session_ranges`]. Per key: Ok, or
    /// why there is no session (the master's answer, or no replica in memory). A key's
    /// previous get session is replaced (or dropped, when the new start fails).
    fn batch_get_session_start(&self, keys: &[String]) -> Result<Vec<Result<()>>> {
        let _ = keys;
        Err(no_sessions())
    }
    /// Ranged gets on get sessions, without asking the master: for key `i`, each extent of
    /// `ranges[i]` takes `[offset, +len)` of the value into registered memory at `addr`; the
    /// remote reads of every key go in one engine batch. Per key: the bytes read, or an error —
    /// no session, a range outside the value or memory not registered (caller's mistakes), the
    /// lease ended (the session with it), a transfer that failed.
    fn batch_get_into_session_ranges(&self, keys: &[String], ranges: &[&[Extent]]) -> Result<Vec<Result<u64>>> {
        let _ = (keys, ranges);
        Err(no_sessions())
    }
    /// Ends the get sessions of `keys` (those without one are fine).
    fn batch_get_session_end(&self, keys: &[String]) -> Result<()> {
        let _ = keys;
        Err(no_sessions())
    }
    /// Starts a put session for each key: the object of `sizes[i]` bytes placed by the master
    /// (one round trip) and kept for [`StoreApi::batch_put_from_session_ranges`] until
    /// [`StoreApi::batch_put_session_end`] or [`StoreApi::batch_put_session_revoke`]. Per key: Ok, or
    /// why there is no session (one is open already, an empty value, the master's answer — an
    /// existing key is [`StoreError::AlreadyExists`]).
    fn batch_put_session_start(&self, keys: &[String], sizes: &[u64], options: &PutOptions) -> Result<Vec<Result<()>>> {
        let _ = (keys, sizes, options);
        Err(no_sessions())
    }
    /// Ranged writes on put sessions, without asking the master: for key `i`, each extent of
    /// `ranges[i]` puts `len` bytes from registered memory at `addr` at `offset` of the value,
    /// into every replica (the remote writes of every key in one engine batch). Per key: the
    /// bytes written, or an error — no session or one sealed by an end or revoke, a range
    /// outside the value, memory not registered, the placement past the master's put timeout,
    /// a transfer that failed.
    fn batch_put_from_session_ranges(&self, keys: &[String], ranges: &[&[Extent]]) -> Result<Vec<Result<u64>>> {
        let _ = (keys, ranges);
        Err(no_sessions())
    }
    /// Ends the put sessions of `keys`: the objects are committed (one master round trip) and
    /// readable. Per key: Ok (the session is gone), or an error — no session, the master's
    /// answer (the session stays, sealed: end or revoke it again).
    fn batch_put_session_end(&self, keys: &[String]) -> Result<Vec<Result<()>>> {
        let _ = keys;
        Err(no_sessions())
    }
    /// Revokes the put sessions of `keys`: the reserved space goes back (one master round
    /// trip). Per key: Ok (the session is gone; also when the master had dropped the
    /// placement), or an error — no session, the master's answer (the session stays, sealed).
    fn batch_put_session_revoke(&self, keys: &[String]) -> Result<Vec<Result<()>>> {
        let _ = keys;
        Err(no_sessions())
    }

    // ---- replica tasks (Mooncake's `create_copy_task`, ...): a full client's ----

    /// Mooncake's `create_copy_task`: the master queues a task copying `key` to each segment
    /// of `targets`; returns its id.
    fn create_copy_task(&self, key: &str, targets: &[String]) -> Result<(u64, u64)> {
        let _ = (key, targets);
        Err(no_tasks())
    }
    /// Mooncake's `create_move_task`: the master queues a task moving `key`'s replica on
    /// segment `source` to segment `target`; returns its id.
    fn create_move_task(&self, key: &str, source: &str, target: &str) -> Result<(u64, u64)> {
        let _ = (key, source, target);
        Err(no_tasks())
    }
    /// Mooncake's `query_task`: the task's type, status, times, client and message.
    fn query_task(&self, id: (u64, u64)) -> Result<crate::proto::TaskInfo> {
        let _ = id;
        Err(no_tasks())
    }
    /// Mooncake's `batch_replica_clear`: of `keys`, the objects this client put whose read
    /// leases are over lose their replicas on `segment_name` (or, with "", go); returns the
    /// keys cleared.
    fn batch_replica_clear(&self, keys: &[String], segment_name: &str) -> Result<Vec<String>> {
        let _ = (keys, segment_name);
        Err(no_tasks())
    }

    /// Runs `batch`: one outcome per op, in order (see `super::op`). An op refused before it
    /// runs (a buffer tagged as a GPU's memory that is not) fails alone; an error of a whole batched call is the error of
    /// the run. Provided: the ops are mapped onto the calls above.
    fn run(&self, batch: Batch<'_>) -> Result<Vec<Result<Outcome>>> {
        run_ops(self, batch)
    }

    // ---- short forms ----

    /// [`StoreApi::put_with`] with the default options.
    fn put(&self, key: &str, value: &[u8]) -> Result<()> {
        self.put_with(key, value, &self.default_options())
    }
    /// Zero-copy put of the `len` bytes of registered memory at `addr`.
    fn put_from_with(&self, key: &str, addr: u64, len: u64, options: &PutOptions) -> Result<()> {
        self.put_from_sg(key, &[Piece::new(addr, len)], options)
    }
    /// [`StoreApi::put_from_with`] with the default options.
    fn put_from(&self, key: &str, addr: u64, len: u64) -> Result<()> {
        self.put_from_with(key, addr, len, &self.default_options())
    }
    /// [`StoreApi::put_from_with`] that replaces the key's value if it has one.
    fn upsert_from_with(&self, key: &str, addr: u64, len: u64, options: &PutOptions) -> Result<()> {
        self.upsert_from_sg(key, &[Piece::new(addr, len)], options)
    }
    /// Zero-copy get of the whole value into the `len` bytes of registered memory at `addr`;
    /// returns the object's size ([`crate::StoreError::BufferTooSmall`] if `len` is less).
    fn get_into(&self, key: &str, addr: u64, len: u64) -> Result<u64> {
        self.get_into_sg(key, &[Piece::new(addr, len)])
    }
    /// [`StoreApi::put_batch_with`] with the default options.
    fn put_batch(&self, keys: &[String], values: &[&[u8]]) -> Result<Vec<Result<()>>> {
        self.put_batch_with(keys, values, &self.default_options())
    }
    /// Zero-copy puts of `sizes[i]` bytes at `addrs[i]` under `keys[i]`; the three lists must
    /// have one length ([`crate::StoreError::InvalidArgument`] otherwise).
    fn batch_put_from_with(
        &self,
        keys: &[String],
        addrs: &[u64],
        sizes: &[u64],
        options: &PutOptions,
    ) -> Result<Vec<Result<()>>> {
        let pieces = one_piece_each(keys, addrs, sizes)?;
        let values: Vec<&[Piece]> = pieces.iter().map(|p| &p[..]).collect();
        self.batch_put_from_sg(keys, &values, options)
    }
    /// [`StoreApi::batch_put_from_with`] with the default options.
    fn batch_put_from(&self, keys: &[String], addrs: &[u64], sizes: &[u64]) -> Result<Vec<Result<()>>> {
        self.batch_put_from_with(keys, addrs, sizes, &self.default_options())
    }
    /// Zero-copy gets of `keys[i]` into the `lens[i]` bytes at `addrs[i]`; the size read per
    /// key. The three lists must have one length.
    fn batch_get_into(&self, keys: &[String], addrs: &[u64], lens: &[u64]) -> Result<Vec<Result<u64>>> {
        let pieces = one_piece_each(keys, addrs, lens)?;
        let values: Vec<&[Piece]> = pieces.iter().map(|p| &p[..]).collect();
        self.batch_get_into_sg(keys, &values)
    }
    /// [`StoreApi::remove_with`] without `force`.
    fn remove(&self, key: &str) -> Result<()> {
        self.remove_with(key, false)
    }
    /// [`StoreApi::remove_by_regex_with`] without `force`.
    fn remove_by_regex(&self, pattern: &str) -> Result<u64> {
        self.remove_by_regex_with(pattern, false)
    }
    /// [`StoreApi::remove_all_with`] without `force`.
    fn remove_all(&self) -> Result<u64> {
        self.remove_all_with(false)
    }
}

/// A client that keeps no sessions (a dummy client: its standalone client would have to keep
/// them for it).
fn no_segments(method: &str) -> crate::StoreError {
    crate::StoreError::invalid(format!(
        "{method} needs a client set up with setup(); a dummy client (setup_dummy) mounts no segments"
    ))
}

fn no_sessions() -> crate::StoreError {
    crate::StoreError::invalid(
        "get and put sessions need a client set up with setup(); a dummy client (setup_dummy) does not keep them",
    )
}

/// A client that does not carry replica tasks (a dummy client: they are its standalone
/// client's to ask for).
fn no_tasks() -> crate::StoreError {
    crate::StoreError::invalid(
        "replica tasks and batch_replica_clear need a client set up with setup(); a dummy client (setup_dummy) does not forward them",
    )
}

/// One piece per key, from parallel lists of addresses and lengths.
fn one_piece_each(keys: &[String], addrs: &[u64], lens: &[u64]) -> Result<Vec<[Piece; 1]>> {
    if keys.len() != addrs.len() || keys.len() != lens.len() {
        return Err(crate::StoreError::invalid("keys, buffers and sizes differ in length"));
    }
    Ok(addrs.iter().zip(lens).map(|(&a, &n)| [Piece::new(a, n)]).collect())
}

// ---- the executor of `StoreApi::run` ----

/// Buffers as pieces of registered memory (host or device: the registration says which).
fn pieces(buffers: &[Buffer]) -> Vec<Piece> {
    buffers.iter().map(|b| Piece::new(b.addr, b.len)).collect()
}

/// Runs `batch` on `api` (see [`StoreApi::run`]).
fn run_ops<A: StoreApi + ?Sized>(api: &A, batch: Batch<'_>) -> Result<Vec<Result<Outcome>>> {
    let Batch { ops, options, together } = batch;
    let mut out: Vec<Option<Result<Outcome>>> = Vec::with_capacity(ops.len());
    // The ops to run, in groups of one kind (one op each unless `together`).
    let mut groups: Vec<Vec<(usize, Op<'_>)>> = Vec::new();
    for (i, op) in ops.into_iter().enumerate() {
        if let Some(e) = op.refusal(|addr, len| api.device_of(addr, len)) {
            out.push(Some(Err(e)));
            continue;
        }
        out.push(None);
        match groups.last_mut() {
            Some(g) if together && g[0].1.kind() == op.kind() => g.push((i, op)),
            _ => groups.push(vec![(i, op)]),
        }
    }
    for group in groups {
        let (slots, ops): (Vec<usize>, Vec<Op<'_>>) = group.into_iter().unzip();
        let outcomes = if together {
            run_batched(api, ops, &options)?
        } else {
            ops.into_iter().map(|op| run_one(api, op, &options)).collect()
        };
        for (slot, r) in slots.into_iter().zip(outcomes) {
            out[slot] = Some(r);
        }
    }
    Ok(out
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(StoreError::Internal("an op without an outcome".into()))))
        .collect())
}

/// One op, by the single-key call of its kind.
fn run_one<A: StoreApi + ?Sized>(api: &A, op: Op<'_>, options: &PutOptions) -> Result<Outcome> {
    match op {
        Op::Get { key, into: Dest::Bytes } => api.get(key).map(Outcome::Bytes),
        Op::Get { key, into: Dest::Sink(sink) } => api.get_with(key, sink).map(Outcome::Size),
        Op::Get { key, into: Dest::Buffers(b) } => api.get_into_sg(key, &pieces(&b)).map(Outcome::Size),
        Op::Get { key, into: Dest::Held } => api.get_buffer(key).map(Outcome::Held),
        Op::Put { key, from: Source::Bytes(v), upsert: false } => api.put_with(key, v, options).map(done),
        Op::Put { key, from: Source::Bytes(v), upsert: true } => api.upsert_with(key, v, options).map(done),
        Op::Put { key, from: Source::Parts(p), upsert: false } => api.put_parts_with(key, &p, options).map(done),
        Op::Put { key, from: Source::Parts(p), upsert: true } => api.upsert_parts_with(key, &p, options).map(done),
        Op::Put { key, from: Source::Buffers(b), upsert: false } => {
            api.put_from_sg(key, &pieces(&b), options).map(done)
        }
        Op::Put { key, from: Source::Buffers(b), upsert: true } => {
            api.upsert_from_sg(key, &pieces(&b), options).map(done)
        }
        Op::Exists { key } => api.exists(key).map(Outcome::Exists),
        Op::Size { key } => api.get_size(key).map(Outcome::Size),
        Op::Remove { key, force } => api.remove_with(key, force).map(done),
        Op::RemoveMatching { pattern, force } => api.remove_by_regex_with(pattern, force).map(Outcome::Count),
        Op::RemoveAll { force } => api.remove_all_with(force).map(Outcome::Count),
    }
}

fn done(_: ()) -> Outcome {
    Outcome::Done
}

/// Ops of one kind as one batched call; an error of the whole call ends the run.
fn run_batched<A: StoreApi + ?Sized>(api: &A, ops: Vec<Op<'_>>, options: &PutOptions) -> Result<Vec<Result<Outcome>>> {
    let keys: Vec<String> = ops.iter().map(|op| op.key().to_string()).collect();
    let each = |rs: Vec<Result<()>>| rs.into_iter().map(|r| r.map(done)).collect();
    let sizes = |rs: Vec<Result<u64>>| rs.into_iter().map(|r| r.map(Outcome::Size)).collect();
    Ok(match ops[0].kind() {
        Kind::GetBytes => api.get_batch(&keys)?.into_iter().map(|r| r.map(Outcome::Bytes)).collect(),
        Kind::GetSink => {
            let mut sinks: Vec<&mut dyn ValueSink> = ops
                .into_iter()
                .filter_map(|op| match op {
                    Op::Get { into: Dest::Sink(s), .. } => Some(s),
                    _ => None,
                })
                .collect();
            sizes(api.get_batch_with(&keys, &mut sinks)?)
        }
        Kind::GetBuffers => {
            let values: Vec<Vec<Piece>> = ops.iter().map(|op| pieces(op.buffers())).collect();
            let refs: Vec<&[Piece]> = values.iter().map(|v| &v[..]).collect();
            sizes(api.batch_get_into_sg(&keys, &refs)?)
        }
        Kind::GetHeld => api.batch_get_buffer(&keys)?.into_iter().map(|r| r.map(Outcome::Held)).collect(),
        Kind::PutBytes(upsert) => {
            let values: Vec<&[u8]> = ops
                .iter()
                .map(|op| match op {
                    Op::Put { from: Source::Bytes(v), .. } => *v,
                    _ => &[],
                })
                .collect();
            each(if upsert {
                api.upsert_batch_with(&keys, &values, options)?
            } else {
                api.put_batch_with(&keys, &values, options)?
            })
        }
        Kind::PutBuffers(upsert) => {
            let values: Vec<Vec<Piece>> = ops.iter().map(|op| pieces(op.buffers())).collect();
            let refs: Vec<&[Piece]> = values.iter().map(|v| &v[..]).collect();
            each(if upsert {
                api.batch_upsert_from_sg(&keys, &refs, options)?
            } else {
                api.batch_put_from_sg(&keys, &refs, options)?
            })
        }
        Kind::Exists => {
            let found = api.batch_exists(&keys)?;
            if found.len() != keys.len() {
                return Err(StoreError::Internal(format!("{} answers for {} keys", found.len(), keys.len())));
            }
            found.into_iter().map(|b| Ok(Outcome::Exists(b))).collect()
        }
        // No batched call of their own: one call each.
        Kind::PutParts(_) | Kind::Size | Kind::Remove | Kind::RemoveMany => {
            ops.into_iter().map(|op| run_one(api, op, options)).collect()
        }
    })
}
