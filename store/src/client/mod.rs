//! The store client: contributes a registered segment to the pool, keeps a registered staging
//! buffer, talks to the master over gRPC and moves bytes client-to-client with the engine.
//!
//! A call goes one way through the client's parts:
//!
//! 1. [`StoreClient`] checks the caller's arguments (`calls`: each call of [`StoreApi`] once)
//!    and asks the master: a get's replica list (with its read lease, `lease`; `gets`), a put's
//!    placement (`puts`).
//! 2. `plan` decides, from the master's answer alone, what to read or write: for a get, the
//!    ordered sources (this client's replica, the hot cache's entry, remote replicas, this
//!    client's disk file, other clients' disk files), or none where the read made while the
//!    master answered (an early read: the hot cache's entry or this client's disk file, chosen
//!    on what the client knew before) holds the object already; for a put, the local and
//!    remote replicas.
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
//! [`StoreApi`] is the API as a trait, for callers that work with either this client or a
//! [`dummy::DummyClient`] (a worker's client that forwards every call to a standalone client,
//! `crescent-client`, on its host).

mod api;
mod blanks;
mod calls;
pub mod checksum;
pub mod config;
pub mod disk;
mod disk_link;
mod disk_news;
pub mod dummy;
mod exec;
mod fastrpc;
mod gets;
pub mod hot_cache;
mod lease;
mod master_link;
mod metrics;
mod op;
pub(crate) mod owner_index;
mod owner_stream;
mod plan;
mod put_retry;
mod puts;
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

use crescent_engine::{RegisteredMemory, TransferEngine};

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
use hot_cache::{HotCache, HotCacheMetrics};
pub use op::{Batch, Buffer, Dest, Held, HeldBuffer, Memory, Op, Outcome, Placer, Source, ValueSink};
use rpc::{check, MasterRpc};
pub use sg::{Extent, Piece};
use sg::{Reach, Src};

/// A byte put of at least this many bytes writes from the caller's memory, lent to the engine
/// for the call, instead of copying the value into the staging buffer first (see
/// [`StoreApi::put_with`]). Below it the copy is hidden: the value's first piece is staged
/// while the master places it, and a round trip outlasts the copy of 1 MiB here.
pub(crate) const LEND_PUT_MIN: u64 = 1 << 20;

/// A disk-tier offload prepared, or none (with a warning) when its value could not be had (a
/// copy out of device memory that failed): the put goes on without its disk copy.
fn offload_or_warn(key: &str, prepared: Result<PreparedOffload>) -> Option<PreparedOffload> {
    prepared.inspect_err(|e| tracing::warn!("not offloading {key:?} to disk: {e}")).ok()
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

/// A batch call's values, one per key: anything else is the caller's mistake.
pub(crate) fn one_value_per_key(keys: usize, values: usize) -> Result<()> {
    check_per_key(keys, values, "values")
}

/// A batch call's `items` (`what` they are, in the error), one per key: anything else is the
/// caller's mistake.
pub(crate) fn check_per_key(keys: usize, items: usize, what: &str) -> Result<()> {
    if keys == items {
        Ok(())
    } else {
        Err(StoreError::invalid(format!("{keys} keys but {items} {what}")))
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
    /// Placements the master granted ahead of our puts ([`blanks`]).
    blanks: Arc<blanks::Blanks>,
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
            blanks: Arc::default(),
        });
        if let Some(addr) = metrics_address {
            let weak = Arc::downgrade(&client);
            let render: metrics::Render = Arc::new(move || weak.upgrade().map(|c| c.render_metrics()));
            let server = metrics::MetricsServer::start(&addr, render, &client.rpc.handle())?;
            tracing::info!("store client metrics: http://{}/metrics", server.addr());
            *client.metrics_server.lock() = Some(server);
        }
        client.mount(master_link::MountKind::First)?;
        // A ping now names the master's fast RPC port before the owner stream opens (it opens
        // there, not over gRPC first) and before the caller's first call.
        client.learn_fast_rpc_port();
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

    /// After a removal: delete our own disk copies now rather than at the next heartbeat. The
    /// ping may also take replica tasks the master had for this client: they run as the
    /// heartbeat's do.
    fn sync_disk_removals(&self) {
        if self.disk.is_none() {
            return;
        }
        // Else the heartbeat brings them later.
        let Ok(reply) = self.ping() else { return };
        let tasks = self.took_ping(reply);
        if let (false, Some(me)) = (tasks.is_empty(), self.me.upgrade()) {
            me.run_tasks(tasks);
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

    // ---- gets ----

    // ---- batches: one master round trip per batch ----

    /// The client's own put or removal of `key`.
    fn hot_invalidate(&self, key: &str) {
        if let Some(hot) = &self.hot {
            hot.invalidate(key);
        }
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
