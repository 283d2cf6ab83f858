//! The store client: contributes a registered segment to the pool, keeps a registered staging
//! buffer, talks to the master over gRPC and moves bytes client-to-client with the engine.
//!
//! A call goes one way through the client's parts:
//!
//! 1. [`StoreClient`] (this file) checks the caller's arguments and asks the master: a get's
//!    replica list (with its read lease, `lease`), a put's placement.
//! 2. `plan` decides, from the master's answer alone, what to read or write: for a get, the
//!    ordered sources (this client's replica, the hot cache's entry, remote replicas, this
//!    client's disk file, other clients' disk files); for a put, the local and remote replicas.
//! 3. The executor (`exec`, `read`, `write`) carries the plan out over typed sources and
//!    destinations (`sg`: scatter/gather lists, so a ranged or multi-buffer get is a plain
//!    get with other extents), using the components: the engine, the staging buffer
//!    (`crate::staging`), the hot cache ([`hot_cache`]) and the disk tier ([`disk`], linked to the
//!    master by `disk_link`).
//! 4. [`StoreClient`] tells the master how it went (commit or revoke a put).
//!
//! A batch is the same executor over many keys, with one master round trip per step. A
//! session (`session`) keeps a batch's master answer (replica lists with their lease, or put
//! placements) for several ranged transfers of the same keys, then ends it.
//!
//! [`api::StoreApi`] is the API as a trait, for callers that work with either this client or a
//! [`dummy::DummyClient`] (a worker's client that forwards every call to a standalone client,
//! `crescent-client`, on its host).

mod api;
pub mod checksum;
pub mod config;
pub mod disk;
mod disk_link;
mod disk_news;
pub mod dummy;
mod exec;
pub mod hot_cache;
mod lease;
mod master_link;
mod metrics;
mod op;
pub(crate) mod owner_index;
mod plan;
mod put_retry;
mod read;
mod rpc;
pub mod sched;
mod segments;
mod session;
mod sg;
mod tasks;
mod write;

use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crescent_engine::{LocalLoan, RegisteredMemory, TransferEngine};

use crate::error::{Result, StoreError};
use crate::proto::*;
use crate::protocol::MAX_BATCH_KEYS;
pub use crate::staging::HeldBlock;
use crate::staging::Staging;
pub use api::StoreApi;
pub use config::ClientConfig;
use disk::{DiskStats, PreparedOffload};
use disk_link::DiskLink;
pub use dummy::{DummyClient, DummyConfig};
use exec::Exec;
use hot_cache::{HotCache, HotCacheMetrics, Identity};
use lease::{LeaseClock, Listed};
pub use op::{Batch, Buffer, Dest, Held, HeldBuffer, Memory, Op, Outcome, Placer, Source, ValueSink};
use plan::{Mode, Refusal, Written};
use rpc::{check, MasterRpc};
use sg::{Dst, Reach, Src};
pub use sg::{Extent, Piece};
use tasks::task_id;

/// Per key of a batch get: the identity of the hot-cache entry copied into the key's memory
/// while the master answered, if any (see `StoreClient::batch_replica_lists_copying_hits`).
type EarlyCopies = Vec<Option<Identity>>;

/// A get copies its hits early (while the master answers) only when it copies at least this
/// many bytes: the early path hands the call to the background runtime and, when the copy ends
/// before the answer, waits for that thread to wake it, which costs more than the copy hides
/// for small values. Measured on this VM (`benches/hotcache.sh hot-cache --link unshaped
/// --pairs 1 -- --methods get,batchGet --sizes 64K,256K,1M,4M`, 2026-12-04 22:51-22:53 UTC,
/// alternated, two runs each), warm call early / asking first: `get` 64 KiB 0.14 / 0.12 ms,
/// 256 KiB 0.21-0.23 / 0.13 ms, 1 MiB 0.14-0.16 / 0.25-0.26 ms; `batchGet` of 5 x 64 KiB
/// 0.16-0.24 / 0.14-0.16 ms, of 5 x 256 KiB 0.19-0.20 / 0.25-0.29 ms.
pub(crate) const EARLY_COPY_FROM: u64 = 1 << 20;

/// A byte put of at least this many bytes writes from the caller's memory, lent to the engine
/// for the call, instead of copying the value into the staging buffer first (see
/// [`StoreApi::put_with`]). Below it the copy is hidden: the value's first piece is staged
/// while the master places it, and a round trip outlasts the copy of 1 MiB here.
pub(crate) const LEND_PUT_MIN: u64 = 1 << 20;

/// Whether a get whose hits copy `bytes` in all copies them early (see [`EARLY_COPY_FROM`]).
fn worth_copying_early(bytes: u64) -> bool {
    bytes >= EARLY_COPY_FROM
}

/// The entry `cache` holds for `key`, with the extents of it the caller `wants` and their
/// bytes: what an early copy copies (`None`: not held, or the caller's memory does not fit the
/// cached value).
fn held_for_early_copy<'c>(
    cache: &'c HotCache,
    key: &str,
    want: &Want<'_>,
) -> Option<(hot_cache::Guard<'c>, Vec<Extent>, u64)> {
    let guard = cache.peek(key)?;
    let (extents, bytes) = want.extents(key, guard.size()).ok()?;
    Some((guard, extents, bytes))
}

/// A disk-tier offload prepared, or none (with a warning) when its value could not be had (a
/// copy out of device memory that failed): the put goes on without its disk copy.
fn offload_or_warn(key: &str, prepared: Result<PreparedOffload>) -> Option<PreparedOffload> {
    prepared.inspect_err(|e| tracing::warn!("not offloading {key:?} to disk: {e}")).ok()
}

/// Drops the hot cache's entry for `key` when the master's answer `e` says the key is gone
/// (removed or evicted since the entry was filled), so that later gets of it do not copy the
/// stale entry while they ask.
fn forget_if_gone(cache: &HotCache, key: &str, e: &StoreError) {
    if matches!(e, StoreError::NotFound(_)) {
        cache.invalidate(key);
    }
}

/// Runs `call` on consecutive ranges of `n` keys, at most [`MAX_BATCH_KEYS`] each (the master
/// refuses a larger batch whole), and joins their answers in order. The first range whose
/// call fails ends it with that error.
pub(crate) fn in_batches<T>(
    n: usize,
    mut call: impl FnMut(std::ops::Range<usize>) -> Result<Vec<T>>,
) -> Result<Vec<T>> {
    let mut out = Vec::with_capacity(n);
    let mut from = 0;
    while from < n {
        let to = n.min(from + MAX_BATCH_KEYS);
        out.extend(call(from..to)?);
        from = to;
    }
    Ok(out)
}

/// A batch reply must hold one item per key asked.
pub(crate) fn one_per_key(items: usize, keys: usize) -> Result<()> {
    if items == keys {
        Ok(())
    } else {
        Err(StoreError::BadReply(format!("{items} items for {keys} keys")))
    }
}

/// What a get takes of a value.
#[derive(Clone, Copy)]
enum Want<'a> {
    /// The whole value, into these pieces in order (they may hold more).
    Whole(&'a [Piece]),
    /// These ranges of the value.
    Ranges(&'a [Extent]),
}

impl Want<'_> {
    /// The extents to read of a value of `size` bytes, and how many bytes the get returns.
    fn extents(&self, key: &str, size: u64) -> Result<(Vec<Extent>, u64)> {
        match self {
            Want::Whole(pieces) => {
                let have = sg::total(pieces).unwrap_or(u64::MAX);
                if size > have {
                    return Err(StoreError::BufferTooSmall { key: key.to_string(), need: size, have });
                }
                Ok((sg::whole(pieces, size), size))
            }
            Want::Ranges(extents) => Ok((extents.to_vec(), sg::check_ranges(key, extents, size)?)),
        }
    }
}

/// A full store client: it contributes a segment of registered memory to the pool, keeps a
/// registered staging buffer, optionally a hot cache and a disk tier, and talks to the master
/// (heartbeats, the owner stream). Calls are blocking and may be made from any thread;
/// [`StoreApi::close`] (or the drop of the last `Arc`) ends it.
pub struct StoreClient {
    /// Itself, for the tasks it starts after set-up (an extra segment's owner stream).
    me: std::sync::Weak<StoreClient>,
    /// Segments mounted at run time ([`segments`]).
    extras: segments::Extras,
    id: String,
    config: ClientConfig,
    engine: Arc<TransferEngine>,
    /// The memory contributed to the pool; none for a pure consumer (`global_segment_size` 0).
    segment: Option<RegisteredMemory>,
    segment_id: AtomicU64,
    staging: Arc<Staging>,
    /// Whether the last put wrote our own segment only: a byte put then stages nothing ahead.
    last_put_local: AtomicBool,
    hot: Option<HotCache>,
    rpc: Arc<MasterRpc>,
    /// Whether the last heartbeat reached the master.
    master_reachable: AtomicBool,
    stop: Arc<AtomicBool>,
    closed: AtomicBool,
    /// Held while remounting (a put and the heartbeat may find out together).
    remounting: parking_lot::Mutex<()>,
    /// The disk tier, with a storage root.
    disk: Option<DiskLink>,
    /// Reads of values from another client's disk, through its disk service (Mooncake's
    /// offload RPC reads).
    remote_disk_reads: AtomicU64,
    metrics: metrics::ClientMetrics,
    /// The Prometheus endpoint, when `metrics_address` is set; stopped by `close`.
    metrics_server: parking_lot::Mutex<Option<metrics::MetricsServer>>,
    /// What our segment holds, as the master told us ([`owner_index`]).
    index: Arc<owner_index::OwnerIndex>,
    /// Heartbeat wake-ups and answers ([`master_link`]).
    link: Arc<master_link::Link>,
    /// Open get and put sessions ([`session`]).
    sessions: session::Sessions,
    /// End-to-end checksums' counters ([`checksum`]; used with `verify_checksums` on).
    checksums: Arc<checksum::Checksums>,
}

impl std::fmt::Debug for StoreClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreClient").field("id", &self.id).field("segment", &self.engine.segment_name()).finish()
    }
}

impl StoreClient {
    /// Starts the engine, contributes `global_segment_size` bytes, mounts them at the master
    /// and starts heartbeats.
    pub fn connect(config: ClientConfig) -> Result<Arc<Self>> {
        Self::connect_using(config, None)
    }

    /// [`Self::connect`] on a transfer engine the caller already runs (Mooncake's
    /// `setup(..., engine)`): the segment and buffers are registered with that engine, which
    /// then also serves the store's reads and writes; its own configuration (local hostname,
    /// metadata, transports) applies, and the config's engine settings are not used. The
    /// engine outlives the client: closing the client unregisters its memory only.
    pub fn connect_with_engine(config: ClientConfig, engine: Arc<TransferEngine>) -> Result<Arc<Self>> {
        Self::connect_using(config, Some(engine))
    }

    fn connect_using(config: ClientConfig, engine: Option<Arc<TransferEngine>>) -> Result<Arc<Self>> {
        // Mooncake's variables set here that Crescent ignores: one warning each, once.
        crescent_engine::env_vars::check_environment();
        let tier = DiskLink::open_tier(&config)?;
        let engine_config = config.engine_config()?;
        let credentials = rpc::Credentials::new(engine_config.cluster_secret.as_ref(), &config.tenant_id)?;
        let rpc = Arc::new(MasterRpc::connect_with(
            &config.master_server_address,
            &config.leader_cluster_id(),
            credentials,
            config.rpc_timeouts,
        )?);
        let engine = match engine {
            Some(engine) => engine,
            None => TransferEngine::new(engine_config)?,
        };
        let segment = match config.global_segment_size {
            0 => None,
            size => Some(engine.alloc_registered(size, "cpu:0")?),
        };
        let staging = Arc::new(Staging::new(engine.alloc_registered(config.local_buffer_size, "cpu:0")?));
        let id = uuid::Uuid::new_v4().to_string();
        let disk = match tier {
            Some(tier) => {
                Some(DiskLink::new(tier, &engine, staging.clone(), rpc.clone(), id.clone(), config.disk_news_stream)?)
            }
            None => None,
        };
        let hot = HotCache::start(&engine, &config.hot_cache);
        let metrics_address = config.metrics_address.clone();
        let client_metrics = metrics::ClientMetrics::new()?;
        let client = Arc::new_cyclic(|me| StoreClient {
            me: me.clone(),
            extras: segments::Extras::default(),
            id,
            config,
            engine,
            segment,
            segment_id: AtomicU64::new(0),
            staging,
            last_put_local: AtomicBool::new(false),
            hot,
            rpc,
            master_reachable: AtomicBool::new(true),
            stop: Arc::new(AtomicBool::new(false)),
            closed: AtomicBool::new(false),
            remounting: parking_lot::Mutex::new(()),
            disk,
            remote_disk_reads: AtomicU64::new(0),
            metrics: client_metrics,
            metrics_server: parking_lot::Mutex::new(None),
            index: Arc::default(),
            link: Arc::default(),
            sessions: session::Sessions::default(),
            checksums: Arc::default(),
        });
        if let Some(addr) = metrics_address {
            let weak = Arc::downgrade(&client);
            let render: metrics::Render = Arc::new(move || weak.upgrade().map(|c| c.render_metrics()));
            let server = metrics::MetricsServer::start(&addr, render, &client.rpc.handle())?;
            tracing::info!("store client metrics: http://{}/metrics", server.addr());
            *client.metrics_server.lock() = Some(server);
        }
        client.mount(master_link::MountKind::First)?;
        if client.segment.is_some() {
            client.start_owner_stream();
        }
        if let Some(disk) = &client.disk {
            disk.start()?;
        }
        client.start_heartbeat();
        tracing::info!(
            "store client {} up: segment {} ({} bytes), master {}",
            client.id,
            client.engine.segment_name(),
            client.segment.as_ref().map_or(0, RegisteredMemory::len),
            client.rpc.addr()
        );
        Ok(client)
    }

    /// The client's id at the master: a UUID made at connect.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The transfer engine that moves the client's bytes (its own, or the one given to
    /// [`Self::connect_with_engine`]); register memory with it for the zero-copy calls.
    pub fn engine(&self) -> &Arc<TransferEngine> {
        &self.engine
    }

    /// The engine's segment name: what other clients open to reach this client's memory, and
    /// what `local_first` placements name.
    pub fn segment_name(&self) -> &str {
        self.engine.segment_name()
    }

    /// The client's metrics (the hot cache's and the disk tier's counters) in Prometheus' text
    /// format.
    pub fn render_metrics(&self) -> String {
        self.metrics.render(
            self.hot_cache_metrics(),
            self.disk.as_ref().map(|d| d.tier.metric_families()),
            self.engine.auth(),
            self.checksum_counts(),
        )
    }

    /// What end-to-end checksums found so far (see [`checksum`]): reads verified, reads whose
    /// bytes did not match (each failed with [`StoreError::ChecksumMismatch`], or a hot-cache
    /// fill dropped), reads of objects put without a checksum. All 0 with
    /// `verify_checksums` off.
    pub fn checksum_counts(&self) -> checksum::ChecksumCounts {
        self.checksums.counts()
    }

    /// The checksum to send with the start of a put of `src` (see [`checksum::START_MAX`]):
    /// with `verify_checksums` on, always (the commit carries it too); otherwise for values up
    /// to [`checksum::START_MAX`].
    fn start_checksum(&self, src: &Src<'_>) -> Option<u32> {
        // None for a value in device memory (see `checksum::of_src`).
        checksum::take_at_start(self.config.verify_checksums, [src.len()]).then(|| checksum::of_src(src)).flatten()
    }

    /// The checksum the commit of a put carries (kept with the object, verified by readers):
    /// the start's, with `verify_checksums` on.
    fn end_checksum(&self, start: Option<u32>) -> Option<u32> {
        start.filter(|_| self.config.verify_checksums)
    }

    /// Where the client's `GET /metrics` endpoint listens, when `metrics_address` is set.
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.metrics_server.lock().as_ref().map(|s| s.addr())
    }

    /// A pure consumer contributes no memory, so the master does not know it (and asks it to
    /// remount at every heartbeat).
    fn contributes(&self) -> bool {
        self.segment.is_some() || self.disk.is_some() || !self.extras.is_empty()
    }

    /// The client's hot cache, when enabled.
    pub fn hot_cache(&self) -> Option<&HotCache> {
        self.hot.as_ref()
    }

    /// The hot cache's counters, when it is enabled.
    pub fn hot_cache_metrics(&self) -> Option<HotCacheMetrics> {
        self.hot.as_ref().map(HotCache::metrics)
    }

    /// The disk tier's counters, if this client has one.
    pub fn disk_stats(&self) -> Option<DiskStats> {
        self.disk.as_ref().map(|d| d.tier.stats())
    }

    /// The disk tier's directory (`<root>/<cluster id>`), if any.
    pub fn disk_dir(&self) -> Option<&std::path::Path> {
        self.disk.as_ref().map(|d| d.tier.dir())
    }

    /// Waits until every queued offload is on disk and known to the master (or the timeout
    /// passes; returns false then). Without a disk tier, true at once.
    pub fn flush_offload(&self, timeout: Duration) -> bool {
        self.disk.as_ref().is_none_or(|d| d.tier.flush(timeout))
    }

    /// The executor for one request, with the request's deadline (the engine's transfer
    /// timeout from now).
    fn exec(&self) -> Exec<'_> {
        Exec {
            engine: &self.engine,
            segment: self.segment.as_ref(),
            staging: &self.staging,
            hot: self.hot.as_ref(),
            disk: self.disk.as_ref(),
            deadline: Instant::now() + self.engine.config().transfer_timeout,
            early: &[],
            verify: self.config.verify_checksums.then_some(&self.checksums),
            remote_disk_reads: &self.remote_disk_reads,
        }
    }

    fn host(&self) -> String {
        self.engine.segment_name().rsplit_once(':').map(|(h, _)| h.to_string()).unwrap_or_default()
    }

    /// The segment as the master is told of it (a pure consumer has none).
    fn segment_info(&self) -> Option<SegmentInfo> {
        let segment = self.segment.as_ref()?;
        Some(SegmentInfo {
            name: self.engine.segment_name().to_string(),
            base: segment.addr(),
            size: segment.len(),
            tier: Tier::Dram as i32,
        })
    }

    /// Whether the master had lost this client and it is mounted again now (a put refused for
    /// space asks; if the check itself fails, the put keeps its answer).
    fn remounted(&self) -> bool {
        self.remount().unwrap_or_else(|e| {
            tracing::debug!("checking whether the master knows this client: {e}");
            false
        })
    }

    fn ping(&self) -> Result<PingReply> {
        let req = PingRequest { client_id: self.id.clone(), disk: self.disk.as_ref().map(DiskLink::counters) };
        let mut reply = self.rpc.call(|mut c| async move { c.ping(req).await })?;
        check(reply.status.take(), "")?;
        Ok(reply)
    }

    /// After a removal: delete our own disk copies now rather than at the next heartbeat.
    fn sync_disk_removals(&self) {
        if let Some(disk) = &self.disk {
            if let Ok(reply) = self.ping() {
                disk.apply_ping(&reply);
            } // else the heartbeat brings them later
        }
    }

    // ---- memory the caller registers for zero-copy calls ----

    /// How the client reaches `pieces` of the caller's registered memory (see [`Reach`]).
    fn reach(&self, pieces: &[Piece]) -> Reach<'_> {
        Reach::of(&self.engine, pieces.iter().map(|p| (p.addr, p.len)))
    }

    /// How the client reaches the caller's registered memory that `extents` go to.
    fn extents_reach(&self, extents: &[Extent]) -> Reach<'_> {
        Reach::of(&self.engine, extents.iter().map(|e| (e.addr, e.len)))
    }

    /// Zero-copy calls take registered memory only (register it once with `register_buffer`).
    fn check_registered(&self, pieces: impl IntoIterator<Item = (u64, u64)>) -> Result<()> {
        for (addr, len) in pieces {
            if !self.engine.is_registered(addr, len) {
                return Err(StoreError::NotRegistered { addr, len });
            }
        }
        Ok(())
    }

    // ---- puts ----

    /// A put or upsert of a value of plain bytes: one of [`LEND_PUT_MIN`] bytes or more is
    /// written from the caller's memory, lent to the engine for the call
    /// ([`TransferEngine::lend_local`], where no transport needs registered memory), as a
    /// zero-copy put writes; a smaller one (or with rdma up) through the staging buffer.
    fn put_value(&self, key: &str, value: &[u8], options: &PutOptions, mode: Mode) -> Result<()> {
        let pieces = [[Piece::new(value.as_ptr() as u64, value.len() as u64)]];
        // Dropped when this returns, after every transfer from the value ended.
        let loans = if pieces[0][0].len >= LEND_PUT_MIN { self.lend_values(&pieces) } else { None };
        let src = match loans {
            Some(_) => Src::Registered(&pieces[0], Reach::host()),
            None => Src::Bytes(value),
        };
        self.put_retrying(key, value.len() as u64, mode, |started| self.put_one(key, src, options, mode, started))
    }

    /// A put or upsert of the value made of `pieces` of registered memory, in order.
    fn put_pieces(&self, key: &str, pieces: &[Piece], options: &PutOptions, mode: Mode) -> Result<()> {
        self.check_registered(pieces.iter().map(|p| (p.addr, p.len)))?;
        let len = pieces.iter().map(|p| p.len).sum();
        self.put_retrying(key, len, mode, |started| {
            self.put_one(key, Src::Registered(pieces, self.reach(pieces)), options, mode, started)
        })
    }

    /// A put or upsert of the value made of `parts` one after another: gathered as the parts
    /// are copied to the replicas, the same single copy a byte put makes.
    fn put_parts(&self, key: &str, parts: &[&[u8]], options: &PutOptions, mode: Mode) -> Result<()> {
        let len = parts.iter().map(|p| p.len() as u64).sum();
        self.put_retrying(key, len, mode, |started| self.put_one(key, Src::Parts(parts), options, mode, started))
    }

    /// Puts or upserts of several values (bytes); one result per key.
    fn put_values(
        &self,
        keys: &[String],
        values: &[&[u8]],
        options: &PutOptions,
        mode: Mode,
    ) -> Result<Vec<Result<()>>> {
        if keys.len() != values.len() {
            return Err(StoreError::invalid(format!("{} keys but {} values", keys.len(), values.len())));
        }
        let pieces: Vec<[Piece; 1]> = values.iter().map(|v| [Piece::new(v.as_ptr() as u64, v.len() as u64)]).collect();
        let (srcs, _loans) = self.batch_sources(values, &pieces);
        self.put_many(keys, &srcs, options, mode)
    }

    /// Puts or upserts of values each made of pieces of registered memory, in order: all
    /// remote writes go in one engine batch.
    fn put_many_pieces(
        &self,
        keys: &[String],
        values: &[&[Piece]],
        options: &PutOptions,
        mode: Mode,
    ) -> Result<Vec<Result<()>>> {
        if keys.len() != values.len() {
            return Err(StoreError::invalid(format!("{} keys but {} values", keys.len(), values.len())));
        }
        self.check_registered(values.iter().flat_map(|v| v.iter().map(|p| (p.addr, p.len))))?;
        let srcs: Vec<Src<'_>> = values.iter().map(|v| Src::Registered(v, self.reach(v))).collect();
        self.put_many(keys, &srcs, options, mode)
    }

    /// Lends the memory of `values` (one piece each) to the engine for one call
    /// ([`TransferEngine::lend_local`]): every value's, or none — where a transport needs
    /// registered memory (rdma), or a value overlaps memory the caller registered; the caller
    /// then copies the values through the staging buffer. Each loan ends when it is dropped,
    /// which the caller does after every transfer from it ended.
    fn lend_values(&self, values: &[[Piece; 1]]) -> Option<Vec<LocalLoan<'_>>> {
        let mut loans = Vec::with_capacity(values.len());
        for [p] in values {
            match self.engine.lend_local(None, p.addr, p.len) {
                Ok(Some(loan)) => loans.push(loan),
                Ok(None) => return None,
                Err(e) => {
                    tracing::debug!("byte values put through the staging buffer: {e}");
                    return None;
                }
            }
        }
        Some(loans)
    }

    /// The sources of a batch of byte values: lent to the engine, so that they move in one
    /// engine batch as `batch_put_from`'s do, where every value can be (`pieces`, one per value,
    /// and the loans, kept by the caller until the batch ended); else plain bytes, copied
    /// through the staging buffer one after another.
    fn batch_sources<'v>(
        &self,
        values: &'v [&'v [u8]],
        pieces: &'v [[Piece; 1]],
    ) -> (Vec<Src<'v>>, Option<Vec<LocalLoan<'_>>>) {
        let loans = if values.iter().all(|v| !v.is_empty()) { self.lend_values(pieces) } else { None };
        let srcs = match loans {
            Some(_) => pieces.iter().map(|p| Src::Registered(p, Reach::host())).collect(),
            None => values.iter().map(|v| Src::Bytes(v)).collect(),
        };
        (srcs, loans)
    }

    /// One key's write: a put, and for an upsert that finds the key, its removal and a put
    /// again (another writer may put the key in between: a few tries). `started` is set to the
    /// version of each put the master starts ([`Self::put_retrying`] asks about it after a
    /// master change).
    fn put_one(
        &self,
        key: &str,
        src: Src<'_>,
        options: &PutOptions,
        mode: Mode,
        started: &mut Option<u64>,
    ) -> Result<()> {
        let options = &*mode.options(options);
        let mut refused = None;
        for _ in 0..UPSERT_TRIES {
            let e = match self.put_new(key, src, options, started)? {
                Written::Refused(e) => e,
                Written::Done => return Ok(()),
                Written::Failed(e) => return Err(e),
            };
            match plan::refusal(e, mode) {
                Refusal::Kept => return Ok(()),
                Refusal::Failed(e) => return Err(e),
                Refusal::Replace(e) => {
                    self.remove_to_replace(key)?;
                    refused = Some(e);
                }
            }
        }
        Err(refused.unwrap_or_else(|| StoreError::AlreadyExists(key.to_string())))
    }

    /// An upsert's removal of the object it replaces (not forced: a reader's lease protects
    /// it); gone meanwhile is as good.
    fn remove_to_replace(&self, key: &str) -> Result<()> {
        match self.remove(key) {
            Ok(()) | Err(StoreError::NotFound(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// A put as the master sees it: `Refused` when it would not start it, `Done` once
    /// committed; any other failure is an error (the put revoked). `started` is set to the
    /// version the master gives the put once it starts it.
    fn put_new(&self, key: &str, src: Src<'_>, options: &PutOptions, started: &mut Option<u64>) -> Result<Written> {
        let len = src.len();
        if len == 0 {
            return Err(StoreError::invalid(format!("empty value for key {key:?}")));
        }
        self.hot_invalidate(key);
        let exec = self.exec();
        // Taken before the start: the holders are told of the placement with it, and the
        // commit then needs no further word from them (see `checksum::START_MAX`).
        let crc = self.start_checksum(&src);
        let req = PutStartRequest {
            client_id: self.id.clone(),
            key: key.to_string(),
            size: len,
            options: Some(options.clone()),
            checksum: crc.map(|crc32| crate::proto::Checksum { crc32 }),
        };
        let start = |req: PutStartRequest| move |mut c: rpc::Client| async move { c.put_start(req).await };
        // While the master places the object: the disk tier's copy of the value, and a byte
        // put's first piece in the staging buffer (unless the last put stayed in our own
        // segment, where nothing is staged).
        // When the last put stayed in our own segment, this one likely does too: the disk
        // tier then takes only the CRC now and writes the file from our replica.
        let local = self.last_put_local.load(Ordering::Relaxed);
        let stage_early = src.is_plain() && !local;
        let (reply, (offload, first_piece)) = if self.disk.is_some() || stage_early {
            self.rpc.call_while(start(req.clone()), || {
                let offload = self.disk.as_ref().and_then(|d| offload_or_warn(key, d.prepare(key, &src, local)));
                let first = if stage_early { exec.stage_first_piece(&src) } else { Ok(None) };
                (offload, first)
            })
        } else {
            (self.rpc.call(start(req.clone())), (None, Ok(None)))
        };
        let checksum = self.end_checksum(crc);
        let mut reply = reply?;
        let mut begun = check(reply.status.take(), key);
        // No room: after a restart (or once it dropped us) the master has no segment of ours
        // until we remount. Remount now and place the value again, rather than fail until the
        // heartbeat remounts.
        if matches!(begun, Err(StoreError::NoSpace { .. })) && self.remounted() {
            reply = self.rpc.call(start(req))?;
            begun = check(reply.status.take(), key);
        }
        if let Err(e) = begun {
            return Ok(Written::Refused(e));
        }
        *started = Some(reply.version);
        let written = first_piece.and_then(|first| exec.write(key, &reply.replicas, &src, first));
        if let Ok(all_local) = written {
            self.last_put_local.store(all_local, Ordering::Relaxed);
        }
        self.finish_put(key, written.map(|_| ()), checksum)?;
        if let Some(offload) = offload {
            self.queue_offload(&exec, offload, reply.version, &reply.replicas, &src);
        }
        Ok(Written::Done)
    }

    /// Commits a put whose bytes were written (with the value's `checksum`, if taken); revokes
    /// one that failed, whatever the reason.
    fn finish_put(&self, key: &str, written: Result<()>, checksum: Option<u32>) -> Result<()> {
        let req = KeyRequest {
            client_id: self.id.clone(),
            key: key.to_string(),
            checksum: checksum.map(|crc32| crate::proto::Checksum { crc32 }),
        };
        match written {
            Ok(()) => {
                let r = self.rpc.call(|mut c| async move { c.put_end(req).await })?;
                check(r.status, key)
            }
            Err(e) => {
                if let Err(revoke) =
                    self.rpc.call(|mut c| async move { c.put_revoke(req).await }).and_then(|r| check(r.status, key))
                {
                    tracing::warn!("revoking the failed put of {key:?}: {revoke}");
                }
                Err(e)
            }
        }
    }

    /// Hands a committed put's offload to the disk tier's writers, who read the value from the
    /// put's replica in our own segment when it has one.
    fn queue_offload(
        &self,
        exec: &Exec<'_>,
        offload: PreparedOffload,
        version: u64,
        replicas: &[ReplicaDescriptor],
        src: &Src<'_>,
    ) {
        let Some(disk) = &self.disk else { return };
        let resident = self
            .segment
            .as_ref()
            .and_then(|segment| Some((&*replicas.iter().find_map(|r| exec.local_replica(r, src.len()))?, segment)));
        disk.queue(offload, version, resident, src);
    }

    // ---- gets ----

    fn replica_list(&self, key: &str) -> Result<Listed> {
        let req = KeyRequest { client_id: self.id.clone(), key: key.to_string(), ..Default::default() };
        let clock = LeaseClock::start();
        let mut reply = self.rpc.call(|mut c| async move { c.get_replica_list(req).await })?;
        check(reply.status.take(), key)?;
        Ok(Listed { reply, clock })
    }

    /// [`Self::replica_list`] with `meanwhile` run on the calling thread while the master
    /// answers (the call on the background runtime, [`MasterRpc::call_beside`]): for work
    /// that does not wait for the answer and outlasts the round trip.
    fn replica_list_beside<R>(&self, key: &str, meanwhile: impl FnOnce() -> R) -> (Result<Listed>, R) {
        let req = KeyRequest { client_id: self.id.clone(), key: key.to_string(), ..Default::default() };
        let clock = LeaseClock::start();
        let (reply, side) = self.rpc.call_beside(|mut c| async move { c.get_replica_list(req).await }, meanwhile);
        (reply.and_then(|mut reply| check(reply.status.take(), key).map(|()| Listed { reply, clock })), side)
    }

    /// [`Self::replica_list`] for a get of a value the hot cache holds (`guard`, from
    /// [`HotCache::peek`]): while the master answers, `copy` copies the entry into the get's
    /// destination (an early copy, as [`Self::batch_replica_lists_copying_hits`] makes for a
    /// batch), so that a hit costs the larger of the round trip and the copy instead of their
    /// sum. Returns the answer and the identity of the entry copied, for [`Exec::early`]: the
    /// read keeps the copy only where the answer says the key still is that object.
    fn replica_list_copying_hit(
        &self,
        key: &str,
        guard: hot_cache::Guard<'_>,
        copy: impl FnOnce(&hot_cache::Guard<'_>),
    ) -> Result<(Listed, [Option<Identity>; 1])> {
        // Beside, not while: sending the request and reading the answer on the calling thread
        // cost more than the hand-off to the background runtime (0.95 against 0.90-0.91 of
        // memcpy + master for a warm 10 MiB get).
        let (listed, ()) = self.replica_list_beside(key, || copy(&guard));
        match listed {
            Ok(listed) => Ok((listed, [Some(guard.identity().clone())])),
            Err(e) => {
                if let Some(cache) = &self.hot {
                    cache.note_early_copies_wasted(1);
                    forget_if_gone(cache, key, &e);
                }
                Err(e)
            }
        }
    }

    /// Asks the master for `key`'s replicas. When this client's disk holds what was, the last
    /// time it looked, the object's only copy, the file is read into `dst(size)` while the
    /// master answers: the round trip is then hidden behind the read instead of before it.
    /// Returns the answer and whether `dst` holds the object it describes (the answer lists
    /// this disk's file of that very version; otherwise the get reads where the answer says).
    fn replica_list_reading_disk<'d>(
        &self,
        key: &str,
        dst: impl FnOnce(u64) -> Option<&'d mut [u8]>,
    ) -> Result<(Listed, bool)> {
        let guess = self.disk.as_ref().and_then(|d| Some((d, d.tier.only_copy(key)?)));
        let Some((disk, (version, size))) = guess else {
            return Ok((self.replica_list(key)?, false));
        };
        let Some(out) = dst(size) else {
            return Ok((self.replica_list(key)?, false));
        };
        let tier = &disk.tier;
        let (listed, read) = self.replica_list_beside(key, || tier.read_local(key, version, out));
        let confirmed = match (&listed, &read) {
            (Ok(Listed { reply: l, .. }), Ok(())) => {
                l.version == version
                    && l.size == size
                    && l.replicas.iter().any(|r| {
                        r.tier == Tier::Ssd as i32
                            && r.status == ReplicaStatus::Complete as i32
                            && r.segment_name == disk.segment_name()
                    })
            }
            _ => false,
        };
        tier.early_read_judged(key, version, confirmed);
        let listed = listed?;
        if confirmed && listed.reply.replicas.iter().any(plan::readable_in_memory) {
            // Back in memory meanwhile: later gets read it from there.
            tier.note_only_copy(key, version, false);
        }
        Ok((listed, confirmed))
    }

    /// A zero-copy get of a value the hot cache holds, with an early copy (see
    /// [`Self::replica_list_copying_hit`]); `None` when the cache does not hold the key, the
    /// caller's memory does not fit the cached value, or the copy is too small to be worth it
    /// ([`EARLY_COPY_FROM`]): the get then asks first.
    fn get_into_copying_hit(&self, key: &str, want: Want<'_>) -> Option<Result<u64>> {
        let (guard, extents, bytes) = held_for_early_copy(self.hot.as_ref()?, key, &want)?;
        if self.extents_reach(&extents).has_device() {
            return None; // a hit into device memory is copied once the master confirms it
        }
        if !worth_copying_early(bytes) {
            return None;
        }
        let got = self
            .replica_list_copying_hit(key, guard, |g| read::copy_entry_early(g, &extents))
            .and_then(|(list, early)| self.read_listed(key, &list, want, &early));
        Some(got)
    }

    /// Reads what `want` takes of the object `list` describes into registered memory; `early`:
    /// its early copy, if any (see [`Exec::early`]). Returns the bytes read.
    fn read_listed(&self, key: &str, list: &Listed, want: Want<'_>, early: &[Option<Identity>]) -> Result<u64> {
        let (extents, n) = want.extents(key, list.size)?;
        let reach = self.extents_reach(&extents);
        Exec { early, ..self.exec() }.read(key, list, &mut Dst::Registered(&extents, reach))?;
        Ok(n)
    }

    // ---- batches: one master round trip per batch ----

    /// The batch write: [`Self::put_once`], then, for an upsert, the keys that existed are
    /// removed and put again (a few rounds, as [`Self::put_one`]). `started[i]` is set to the
    /// version of each put of key `i` the master starts.
    fn put_many_rounds(
        &self,
        keys: &[String],
        srcs: &[Src<'_>],
        options: &PutOptions,
        mode: Mode,
        started: &mut [Option<u64>],
    ) -> Result<Vec<Result<()>>> {
        let options = &*mode.options(options);
        let (mut results, mut replace) = self.put_once(keys, srcs, options, mode, started)?;
        for _ in 1..UPSERT_TRIES {
            if replace.is_empty() {
                break;
            }
            let mut again = Vec::with_capacity(replace.len());
            for i in replace {
                match self.remove_to_replace(&keys[i]) {
                    Ok(()) => again.push(i),
                    Err(e) => results[i] = Err(e),
                }
            }
            let sub_keys: Vec<String> = again.iter().map(|&i| keys[i].clone()).collect();
            let sub_srcs: Vec<Src<'_>> = again.iter().map(|&i| srcs[i]).collect();
            let mut sub_started: Vec<Option<u64>> = again.iter().map(|&i| started[i]).collect();
            let round = self.put_once(&sub_keys, &sub_srcs, options, mode, &mut sub_started);
            for (&i, v) in again.iter().zip(sub_started) {
                started[i] = v;
            }
            let (sub_results, sub_replace) = round?;
            for (&i, r) in again.iter().zip(sub_results) {
                results[i] = r;
            }
            replace = sub_replace.into_iter().map(|j| again[j]).collect();
        }
        Ok(results)
    }

    /// The batch put, with the keys that fail for a master change put again ([`put_retry`]).
    fn put_many(&self, keys: &[String], srcs: &[Src<'_>], options: &PutOptions, mode: Mode) -> Result<Vec<Result<()>>> {
        let sizes: Vec<u64> = srcs.iter().map(Src::len).collect();
        self.batch_put_retrying(keys, &sizes, mode, |todo, started| {
            self.put_some(keys, srcs, options, mode, todo, started)
        })
    }

    /// [`Self::put_many_rounds`] of the keys at the indices `todo`; `started` is by index into
    /// `keys`.
    fn put_some(
        &self,
        keys: &[String],
        srcs: &[Src<'_>],
        options: &PutOptions,
        mode: Mode,
        todo: &[usize],
        started: &mut [Option<u64>],
    ) -> Result<Vec<Result<()>>> {
        let ks: Vec<String> = todo.iter().map(|&i| keys[i].clone()).collect();
        let ss: Vec<Src<'_>> = todo.iter().map(|&i| srcs[i]).collect();
        let mut sub_started: Vec<Option<u64>> = todo.iter().map(|&i| started[i]).collect();
        let r = self.put_many_rounds(&ks, &ss, options, mode, &mut sub_started);
        for (&i, v) in todo.iter().zip(sub_started) {
            started[i] = v;
        }
        r
    }

    /// The batch put: placed in one round trip, written by the executor (registered values in
    /// one engine batch), then committed and revoked in one round trip each. Returns the
    /// results and the keys an upsert is to replace; `started[i]` is set to the version of
    /// key `i`'s put if the master started it.
    #[allow(clippy::type_complexity)]
    fn put_once(
        &self,
        keys: &[String],
        srcs: &[Src<'_>],
        options: &PutOptions,
        mode: Mode,
        started: &mut [Option<u64>],
    ) -> Result<(Vec<Result<()>>, Vec<usize>)> {
        let sizes: Vec<u64> = srcs.iter().map(Src::len).collect();
        if let Some(i) = sizes.iter().position(|s| *s == 0) {
            return Err(StoreError::invalid(format!("empty value for key {:?}", keys[i])));
        }
        keys.iter().for_each(|k| self.hot_invalidate(k));
        let exec = self.exec();
        // As a single put's (see `put_new`): each value's checksum before the start, or none
        // (the bound is on the batch's bytes: it saves one owner round trip in all).
        let take = checksum::take_at_start(self.config.verify_checksums, sizes.iter().copied());
        let crcs: Vec<Option<u32>> = srcs.iter().map(|src| if take { checksum::of_src(src) } else { None }).collect();
        let (starts, offloads) = self.batch_put_start(keys, &sizes, srcs, &crcs, options)?;
        let mut results: Vec<Result<()>> = Vec::with_capacity(keys.len());
        let mut placed: Vec<(Vec<ReplicaDescriptor>, u64)> = Vec::with_capacity(keys.len());
        for (i, start) in starts.into_iter().enumerate() {
            match start {
                Ok(p) => {
                    started[i] = Some(p.1);
                    placed.push(p);
                    results.push(Ok(()));
                }
                Err(e) => {
                    placed.push((Vec::new(), 0));
                    results.push(Err(e));
                }
            }
        }
        let begun: Vec<bool> = results.iter().map(Result::is_ok).collect();
        let replicas: Vec<&[ReplicaDescriptor]> = placed.iter().map(|(r, _)| &r[..]).collect();
        match exec.write_batch(keys, &replicas, srcs, &mut results) {
            Ok(all_local) => self.last_put_local.store(all_local, Ordering::Relaxed),
            Err(e) => {
                // The batch failed as a whole: every put it started goes back at once.
                let revoke: Vec<String> =
                    keys.iter().zip(&begun).filter(|(_, s)| **s).map(|(k, _)| k.clone()).collect();
                self.batch_revoke(revoke);
                return Err(e);
            }
        }
        let written = results
            .into_iter()
            .zip(begun)
            .map(|(r, begun)| match (r, begun) {
                (Ok(()), _) => Written::Done,
                (Err(e), true) => Written::Failed(e),
                (Err(e), false) => Written::Refused(e),
            })
            .collect();
        let (results, settled) = self.batch_put_finish(keys, &crcs, written, mode)?;
        let mut offloads: Vec<Option<PreparedOffload>> = offloads;
        for &i in &settled.commit {
            if let (Ok(()), Some(offload)) = (&results[i], offloads.get_mut(i).and_then(Option::take)) {
                self.queue_offload(&exec, offload, placed[i].1, &placed[i].0, &srcs[i]);
            }
        }
        Ok((results, settled.replace))
    }

    /// Per key: the replicas to write and the object's version; and the values' disk tier
    /// images, made while the master places them.
    #[allow(clippy::type_complexity)]
    fn batch_put_start(
        &self,
        keys: &[String],
        sizes: &[u64],
        srcs: &[Src<'_>],
        crcs: &[Option<u32>],
        options: &PutOptions,
    ) -> Result<(Vec<Result<(Vec<ReplicaDescriptor>, u64)>>, Vec<Option<PreparedOffload>>)> {
        if keys.len() <= MAX_BATCH_KEYS {
            return self.batch_put_start_call(keys, sizes, srcs, crcs, options);
        }
        // One call per range of keys; where a later call fails, the puts the earlier ones
        // started go back before the error is returned.
        let (mut starts, mut offloads) = (Vec::with_capacity(keys.len()), Vec::new());
        let mut from = 0;
        while from < keys.len() {
            let to = keys.len().min(from + MAX_BATCH_KEYS);
            match self.batch_put_start_call(
                &keys[from..to],
                &sizes[from..to],
                &srcs[from..to],
                &crcs[from..to],
                options,
            ) {
                Ok((s, o)) => {
                    starts.extend(s);
                    offloads.extend(o);
                }
                Err(e) => {
                    let started = starts.iter().enumerate().filter(|(_, s)| s.is_ok()).map(|(i, _)| keys[i].clone());
                    self.batch_revoke(started.collect());
                    return Err(e);
                }
            }
            from = to;
        }
        Ok((starts, offloads))
    }

    /// [`Self::batch_put_start`] of at most [`MAX_BATCH_KEYS`] keys: one call to the master.
    #[allow(clippy::type_complexity)]
    fn batch_put_start_call(
        &self,
        keys: &[String],
        sizes: &[u64],
        srcs: &[Src<'_>],
        crcs: &[Option<u32>],
        options: &PutOptions,
    ) -> Result<(Vec<Result<(Vec<ReplicaDescriptor>, u64)>>, Vec<Option<PreparedOffload>>)> {
        let checksums = match crcs.iter().all(Option::is_some) {
            true => crcs.iter().map(|c| crate::proto::Checksum { crc32: c.expect("all some") }).collect(),
            false => Vec::new(),
        };
        let req = BatchPutStartRequest {
            client_id: self.id.clone(),
            keys: keys.to_vec(),
            sizes: sizes.to_vec(),
            options: Some(options.clone()),
            checksums,
        };
        let start = |req: BatchPutStartRequest| move |mut c: rpc::Client| async move { c.batch_put_start(req).await };
        let (reply, offloads) = match &self.disk {
            // The disk tier's copies of the values (or their CRCs, see `put_one`) are made
            // while the master places them.
            Some(disk) => {
                let local = self.last_put_local.load(Ordering::Relaxed);
                self.rpc.call_while(start(req.clone()), || {
                    keys.iter()
                        .zip(srcs)
                        .map(|(key, src)| offload_or_warn(key, disk.prepare(key, src, local)))
                        .collect()
                })
            }
            None => (self.rpc.call(start(req.clone())), Vec::new()),
        };
        let mut reply = reply?;
        one_per_key(reply.items.len(), keys.len())?;
        // No room for any key: maybe the master restarted and has no segment of ours yet
        // (see `put_one`).
        let no_space = |items: &[PutStartReply]| {
            items.iter().all(|i| i.status.as_ref().is_some_and(|s| s.code == Code::NoSpace as i32))
        };
        if !keys.is_empty() && no_space(&reply.items) && self.remounted() {
            reply = self.rpc.call(start(req))?;
            one_per_key(reply.items.len(), keys.len())?;
        }
        let starts = reply
            .items
            .into_iter()
            .zip(keys)
            .map(|(item, key)| check(item.status, key).map(|()| (item.replicas, item.version)))
            .collect();
        Ok((starts, offloads))
    }

    /// Tells the master how each put of a batch ended: commits the written ones, revokes
    /// every other one it had started ([`plan::settle`]). Returns each key's result and the
    /// settlement.
    fn batch_put_finish(
        &self,
        keys: &[String],
        crcs: &[Option<u32>],
        written: Vec<Written>,
        mode: Mode,
    ) -> Result<(Vec<Result<()>>, plan::Settled)> {
        let (settled, mut results) = plan::settle(written, mode);
        self.batch_revoke(settled.revoke.iter().map(|&i| keys[i].clone()).collect());
        let commit = &settled.commit;
        for commit in commit.chunks(MAX_BATCH_KEYS) {
            // Taken before the start (with checksums on, always).
            // One per key or none (a value in device memory has none: see `checksum::of_src`).
            let all = commit.iter().all(|&i| crcs[i].is_some());
            let checksums = match self.config.verify_checksums && all {
                true => commit
                    .iter()
                    .filter_map(|&i| Some(crate::proto::Checksum { crc32: self.end_checksum(crcs[i])? }))
                    .collect(),
                false => Vec::new(),
            };
            let req = BatchKeyRequest {
                client_id: self.id.clone(),
                keys: commit.iter().map(|&i| keys[i].clone()).collect(),
                checksums,
            };
            let reply = self.rpc.call(|mut c| async move { c.batch_put_end(req).await })?;
            one_per_key(reply.statuses.len(), commit.len())?;
            for (&i, status) in commit.iter().zip(reply.statuses) {
                results[i] = check(Some(status), &keys[i]);
            }
        }
        Ok((results, settled))
    }

    fn batch_revoke(&self, keys: Vec<String>) {
        if keys.is_empty() {
            return;
        }
        for keys in keys.chunks(MAX_BATCH_KEYS) {
            let req = BatchKeyRequest { client_id: self.id.clone(), keys: keys.to_vec(), ..Default::default() };
            if let Err(e) = self.rpc.call(|mut c| async move { c.batch_put_revoke(req).await }) {
                tracing::warn!("revoking failed puts: {e}");
            }
        }
    }

    /// The master's answers for a batch of keys (one round trip), each with its lease's clock.
    fn batch_replica_lists(&self, keys: &[String]) -> Result<Vec<Result<Listed>>> {
        in_batches(keys.len(), |r| {
            let keys = &keys[r];
            let req = BatchKeyRequest { client_id: self.id.clone(), keys: keys.to_vec(), ..Default::default() };
            let clock = LeaseClock::start();
            let reply = self.rpc.call(|mut c| async move { c.batch_get_replica_list(req).await })?;
            Self::lists_of(reply, keys, clock)
        })
    }

    /// The master's answers to a batch of replica-list requests, one per key.
    fn lists_of(reply: BatchGetReplicaListReply, keys: &[String], clock: LeaseClock) -> Result<Vec<Result<Listed>>> {
        one_per_key(reply.items.len(), keys.len())?;
        Ok(reply
            .items
            .into_iter()
            .zip(keys)
            .map(|(mut item, key)| check(item.status.take(), key).map(|()| Listed { reply: item, clock }))
            .collect())
    }

    /// [`Self::batch_replica_lists`] for a zero-copy batch get: while the master answers, each
    /// key's value that the hot cache holds is copied into the registered memory the key
    /// `wants` it in (an early copy), so that a hit costs the larger of the round trip and the
    /// copy instead of their sum. Returns the answers and, per key, the identity of the entry
    /// copied; the batch read (`Exec::read_batch`) keeps a copy only where the answer says the key still
    /// is that object, and otherwise reads over it as it would have. A key whose answer is an
    /// error keeps whatever the copy wrote (the caller's memory holds no value after a failed
    /// get). Batches of more than one call's keys, batches whose hits copy less than
    /// [`EARLY_COPY_FROM`] in all, and clients without a cache, ask as before.
    fn batch_replica_lists_copying_hits(
        &self,
        keys: &[String],
        wants: &[Want<'_>],
    ) -> Result<(Vec<Result<Listed>>, EarlyCopies)> {
        let none = || vec![None; keys.len()];
        let Some(cache) = self.hot.as_ref().filter(|_| keys.len() <= MAX_BATCH_KEYS) else {
            return Ok((self.batch_replica_lists(keys)?, none()));
        };
        // Hits into device memory are copied once the master confirms them (no early copy).
        let held: Vec<Option<(hot_cache::Guard<'_>, Vec<Extent>, u64)>> = keys
            .iter()
            .zip(wants)
            .map(|(key, want)| {
                held_for_early_copy(cache, key, want).filter(|(_, e, _)| !self.extents_reach(e).has_device())
            })
            .collect();
        let bytes = held.iter().flatten().map(|(_, _, bytes)| bytes).sum();
        if !worth_copying_early(bytes) {
            return Ok((self.batch_replica_lists(keys)?, none()));
        }
        let req = BatchKeyRequest { client_id: self.id.clone(), keys: keys.to_vec(), ..Default::default() };
        let clock = LeaseClock::start();
        let (reply, ()) = self.rpc.call_beside(
            |mut c| async move { c.batch_get_replica_list(req).await },
            || {
                for (guard, extents, _) in held.iter().flatten() {
                    read::copy_entry_early(guard, extents);
                }
            },
        );
        let lists = Self::lists_of(reply?, keys, clock)?;
        for ((key, list), _) in keys.iter().zip(&lists).zip(&held).filter(|(_, h)| h.is_some()) {
            if let Err(e) = list {
                forget_if_gone(cache, key, e);
            }
        }
        Ok((lists, held.into_iter().map(|h| h.map(|(guard, _, _)| guard.identity().clone())).collect()))
    }

    /// The answers split into those to read and the master's refusals (per-key results).
    fn split_lists(lists: Vec<Result<Listed>>) -> (Vec<Option<Listed>>, Vec<Result<()>>) {
        lists
            .into_iter()
            .map(|l| match l {
                Ok(l) => (Some(l), Ok(())),
                Err(e) => (None, Err(e)),
            })
            .unzip()
    }

    /// Reads the values `lists` describes into `outs` (each the value's size; `None`: a key
    /// that is not read, its result an error already): lent to the engine where every buffer
    /// can be, else through the staging buffer.
    fn read_batch_bytes(
        &self,
        keys: &[String],
        lists: &[Option<Listed>],
        mut outs: Vec<Option<&mut [u8]>>,
        mut results: Vec<Result<()>>,
    ) -> Result<Vec<Result<()>>> {
        let mut loans = Vec::with_capacity(outs.len());
        let mut lent = true;
        for b in outs.iter_mut().flatten().filter(|b| !b.is_empty()) {
            match self.engine.lend_local(None, b.as_mut_ptr() as u64, b.len() as u64) {
                Ok(Some(loan)) => loans.push(loan),
                _ => {
                    lent = false;
                    break;
                }
            }
        }
        let exec = self.exec();
        if lent {
            let extents: Vec<Option<[Extent; 1]>> = outs
                .iter_mut()
                .map(|b| b.as_mut().map(|b| [Extent { offset: 0, addr: b.as_mut_ptr() as u64, len: b.len() as u64 }]))
                .collect();
            let mut dsts: Vec<Option<Dst<'_>>> = extents
                .iter()
                .map(|e| e.as_ref().filter(|e| e[0].len > 0).map(|e| Dst::Registered(&e[..], Reach::host())))
                .collect();
            let read = exec.read_batch(keys, lists, &mut dsts, &mut results, true);
            drop(loans); // after every transfer into the buffers has ended
            read?;
        } else {
            drop(loans);
            // SAFETY: the same layout; the read writes only initialised bytes into them.
            let as_out = |b: &mut [u8]| unsafe { &mut *(b as *mut [u8] as *mut [MaybeUninit<u8>]) };
            let mut dsts: Vec<Option<Dst<'_>>> = outs
                .into_iter()
                .map(|b| b.filter(|b| !b.is_empty()).map(|b| Dst::Bytes { out: as_out(b), offset: 0 }))
                .collect();
            exec.read_batch(keys, lists, &mut dsts, &mut results, false)?;
        }
        Ok(results)
    }

    /// The batch get into registered memory: one round trip, then the executor.
    fn read_many(&self, keys: &[String], wants: &[Want<'_>]) -> Result<Vec<Result<u64>>> {
        let (lists, early) = self.batch_replica_lists_copying_hits(keys, wants)?;
        let (lists, results) = Self::split_lists(lists);
        self.read_lists(keys, &lists, wants, results, &early)
    }

    /// The executor's part of a batch get into registered memory, on answers the master gave
    /// (now, or at a get session's start): what each key `wants` of the value `lists` describes.
    /// Keys whose result is an error already are left alone. `early`: the keys' early copies
    /// (see [`Self::batch_replica_lists_copying_hits`]; empty: none). Returns the bytes read per
    /// key.
    fn read_lists(
        &self,
        keys: &[String],
        lists: &[Option<Listed>],
        wants: &[Want<'_>],
        mut results: Vec<Result<()>>,
        early: &[Option<Identity>],
    ) -> Result<Vec<Result<u64>>> {
        let mut sizes = vec![0u64; keys.len()];
        let mut extents: Vec<Vec<Extent>> = vec![Vec::new(); keys.len()];
        for i in 0..keys.len() {
            let Some(list) = &lists[i] else { continue };
            match wants[i].extents(&keys[i], list.size) {
                Ok((e, n)) => (extents[i], sizes[i]) = (e, n),
                Err(e) => results[i] = Err(e),
            }
        }
        let mut dsts: Vec<Option<Dst<'_>>> =
            extents.iter().map(|e| Some(Dst::Registered(e, self.extents_reach(e)))).collect();
        let exec = Exec { early, ..self.exec() };
        exec.read_batch(keys, lists, &mut dsts, &mut results, false)?;
        Ok(results.into_iter().zip(sizes).map(|(r, n)| r.map(|()| n)).collect())
    }

    /// The client's own put or removal of `key`.
    fn hot_invalidate(&self, key: &str) {
        if let Some(hot) = &self.hot {
            hot.invalidate(key);
        }
    }
}

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
        if let Some(guard) =
            self.hot.as_ref().and_then(|cache| cache.peek(key)).filter(|g| worth_copying_early(g.size()))
        {
            // A hit (most likely): the sink's memory for the cached size, copied into while
            // the master answers; asked for again if the answer gives another size.
            let size = guard.size();
            let out = api::sink_buffer(key, sink, size)?;
            let (list, early) = self.replica_list_copying_hit(key, guard, |g| g.copy_range_early(0, &mut out[..]))?;
            let out = if list.size == size { out } else { api::sink_buffer(key, sink, list.size)? };
            Exec { early: &early, ..self.exec() }.read(key, &list, &mut Dst::Bytes { out, offset: 0 })?;
            return Ok(list.size);
        }
        let mut refused = None;
        let (list, served) = self.replica_list_reading_disk(key, |size| match api::sink_buffer(key, sink, size) {
            Ok(out) => {
                // A file read wants initialised memory: zeroed first (on this path the disk
                // costs far more than the pass).
                out.fill(MaybeUninit::new(0));
                // SAFETY: every byte was just written.
                Some(unsafe { out.assume_init_mut() })
            }
            Err(e) => {
                refused = Some(e);
                None
            }
        })?;
        if let Some(e) = refused {
            return Err(e);
        }
        if !served {
            let out = api::sink_buffer(key, sink, list.size)?;
            self.exec().read(key, &list, &mut Dst::Bytes { out, offset: 0 })?;
        }
        Ok(list.size)
    }

    /// Zero-copy get of the whole value into `pieces` of registered memory, in order (a value
    /// laid out in several buffers); returns the object's size.
    fn get_into_sg(&self, key: &str, pieces: &[Piece]) -> Result<u64> {
        self.check_registered(pieces.iter().map(|p| (p.addr, p.len)))?;
        if let Some(got) = self.get_into_copying_hit(key, Want::Whole(pieces)) {
            return got;
        }
        // The disk file read straight into the caller's memory while the master answers: host
        // memory only (the CPU must not touch a device's).
        let early = match pieces {
            [p] if !self.reach(pieces).has_device() => Some(*p),
            _ => None,
        };
        let (list, served) = self.replica_list_reading_disk(key, |size| {
            let p = early.filter(|p| size <= p.len)?;
            // SAFETY: the caller registered [addr, +len) for this call, and size <= len.
            Some(unsafe { std::slice::from_raw_parts_mut(p.addr as *mut u8, size as usize) })
        })?;
        if served {
            return Ok(list.size);
        }
        self.read_listed(key, &list, Want::Whole(pieces), &[])
    }

    /// Zero-copy get of ranges of a value: each extent takes `[offset, offset + len)` of the
    /// value into registered memory at `addr`. A range outside the value is the caller's
    /// mistake ([`StoreError::BadRange`]). Returns the bytes read.
    fn get_into_ranges(&self, key: &str, ranges: &[Extent]) -> Result<u64> {
        self.check_registered(ranges.iter().map(|e| (e.addr, e.len)))?;
        if let Some(got) = self.get_into_copying_hit(key, Want::Ranges(ranges)) {
            return got;
        }
        let list = self.replica_list(key)?;
        self.read_listed(key, &list, Want::Ranges(ranges), &[])
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
        if addrs.len() != keys.len() {
            return Err(StoreError::invalid(format!("{} keys but {} places", keys.len(), addrs.len())));
        }
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
    /// ([`TransferEngine::lend_local`]); otherwise one after another through the staging
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
        if keys.len() != sinks.len() {
            return Err(StoreError::invalid(format!("{} keys but {} sinks", keys.len(), sinks.len())));
        }
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
        if keys.len() != values.len() {
            return Err(StoreError::invalid(format!("{} keys but {} buffer lists", keys.len(), values.len())));
        }
        self.check_registered(values.iter().flat_map(|v| v.iter().map(|p| (p.addr, p.len))))?;
        let wants: Vec<Want<'_>> = values.iter().map(|v| Want::Whole(v)).collect();
        self.read_many(keys, &wants)
    }

    /// [`StoreApi::get_into_ranges`] for several keys: one master round trip, remote reads in one
    /// engine batch. Returns the bytes read per key.
    fn batch_get_into_ranges(&self, keys: &[String], ranges: &[&[Extent]]) -> Result<Vec<Result<u64>>> {
        if keys.len() != ranges.len() {
            return Err(StoreError::invalid(format!("{} keys but {} range lists", keys.len(), ranges.len())));
        }
        self.check_registered(ranges.iter().flat_map(|v| v.iter().map(|e| (e.addr, e.len))))?;
        let wants: Vec<Want<'_>> = ranges.iter().map(|r| Want::Ranges(r)).collect();
        self.read_many(keys, &wants)
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
        let reply = self.rpc.call(|mut c| async move { c.exists(req).await })?;
        check(reply.status, key)?;
        Ok(reply.exists)
    }

    /// [`StoreApi::exists`] for several keys, in one call to the master; one answer per key.
    fn batch_exists(&self, keys: &[String]) -> Result<Vec<bool>> {
        in_batches(keys.len(), |r| {
            let req =
                BatchKeyRequest { client_id: self.id.clone(), keys: keys[r.clone()].to_vec(), ..Default::default() };
            let reply = self.rpc.call(|mut c| async move { c.batch_exists(req).await })?;
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

impl Drop for StoreClient {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if !self.closed.load(Ordering::Acquire) {
            if let Err(e) = self.close() {
                tracing::debug!("closing store client {}: {e}", self.id);
            }
        }
    }
}

/// Puts an upsert makes while other writers keep putting the key it removed.
const UPSERT_TRIES: usize = 3;

/// How long the master keeps a silent client (for callers that wait on it).
pub const DEFAULT_CLIENT_TTL: Duration = Duration::from_secs(10);

/// [`StoreApi::get`]'s sink: the spare capacity of a vector, kept between calls of one get
/// (never zeroed: the get writes every byte it returns).
struct VecSink(Vec<u8>);

impl ValueSink for VecSink {
    fn buffer(&mut self, size: u64) -> Result<&mut [MaybeUninit<u8>]> {
        let size = usize::try_from(size).map_err(|_| StoreError::invalid(format!("a value of {size} bytes")))?;
        self.0.clear();
        self.0.reserve(size);
        Ok(&mut self.0.spare_capacity_mut()[..size])
    }
}
