//! The store client: contributes a registered segment to the pool, keeps a registered staging
//! buffer, talks to the master over gRPC and moves bytes client-to-client with the engine.

pub mod config;
pub mod disk;
pub mod hot_cache;
mod lease;
pub mod metrics;
pub mod rpc;
pub mod sched;
mod ssd;
pub mod staging;
mod value_buffer;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crescent_engine::{Opcode, RegisteredMemory, TransferEngine, TransferRequest, TransferStatus};
use tonic::transport::Channel;

use crate::error::{Result, StoreError};
use crate::proto::master_client::MasterClient;
use crate::proto::*;
pub use config::ClientConfig;
use disk::PreparedOffload;
use hot_cache::{HotCache, Miss};
use lease::{LeaseClock, Listed};
use rpc::{check, MasterRpc};
use staging::Staging;

/// A committed replica in a memory segment: what the engine reads. Disk copies (tier SSD) are
/// read through their owner instead.
pub(crate) fn readable_in_memory(r: &ReplicaDescriptor) -> bool {
    r.status == ReplicaStatus::Complete as i32 && r.tier != Tier::Ssd as i32
}

/// Per key of a batch put: where the master placed it and its version (none for a key
/// refused).
fn placements(starts: &[Result<(Vec<ReplicaDescriptor>, u64)>]) -> Vec<(Vec<ReplicaDescriptor>, u64)> {
    starts.iter().map(|s| s.as_ref().map_or_else(|_| (Vec::new(), 0), |p| p.clone())).collect()
}

/// A batch reply must hold one item per key asked.
fn one_per_key(items: usize, keys: usize) -> Result<()> {
    if items == keys {
        Ok(())
    } else {
        Err(StoreError::Internal(format!("master answered {items} items for {keys} keys")))
    }
}

/// Where a value's bytes come from or go to.
enum Buf<'a> {
    /// Plain memory: moved through the staging buffer.
    Bytes(&'a [u8]),
    BytesMut(&'a mut [u8]),
    /// Registered memory at this address: moved by the engine directly (zero copy).
    Registered(u64),
}

impl Buf<'_> {
    /// The same bytes, to read from again.
    fn reread(&self) -> Buf<'_> {
        match self {
            Buf::Bytes(b) => Buf::Bytes(b),
            Buf::BytesMut(b) => Buf::Bytes(b),
            Buf::Registered(addr) => Buf::Registered(*addr),
        }
    }
}

pub struct StoreClient {
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
    /// The disk tier, with a storage root ([`ssd`]).
    ssd: Option<ssd::Ssd>,
    metrics: metrics::ClientMetrics,
    /// The Prometheus endpoint, when `metrics_address` is set; stopped by `close`.
    metrics_server: parking_lot::Mutex<Option<metrics::MetricsServer>>,
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
        let disk = ssd::open_tier(&config)?;
        let rpc = Arc::new(MasterRpc::connect(&config.master_server_address)?);
        let engine = TransferEngine::new(config.engine_config()?)?;
        let segment = match config.global_segment_size {
            0 => None,
            size => Some(engine.alloc_registered(size, "cpu:0")?),
        };
        let staging = Arc::new(Staging::new(engine.alloc_registered(config.local_buffer_size, "cpu:0")?));
        let ssd = match disk {
            Some(tier) => {
                let host = engine.segment_name().rsplit_once(':').map_or("127.0.0.1", |(h, _)| h);
                let service =
                    disk::service::DiskService::start(host, &tier, staging.clone(), engine.segment_name().to_string())?;
                Some(ssd::Ssd { tier, service, segment_id: Arc::new(AtomicU64::new(0)) })
            }
            None => None,
        };
        let hot = HotCache::start(&engine, &config.hot_cache);
        let metrics_address = config.metrics_address.clone();
        let client = Arc::new(StoreClient {
            id: uuid::Uuid::new_v4().to_string(),
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
            ssd,
            metrics: metrics::ClientMetrics::new()?,
            metrics_server: parking_lot::Mutex::new(None),
        });
        if let Some(addr) = metrics_address {
            let server = metrics::MetricsServer::start(&addr, Arc::downgrade(&client), &client.rpc.handle())?;
            tracing::info!("store client metrics: http://{}/metrics", server.addr());
            *client.metrics_server.lock() = Some(server);
        }
        client.mount(false)?;
        client.start_disk()?;
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

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn engine(&self) -> &Arc<TransferEngine> {
        &self.engine
    }

    pub fn segment_name(&self) -> &str {
        self.engine.segment_name()
    }

    /// The client's metrics (the hot cache's and the disk tier's counters) in Prometheus' text
    /// format.
    pub fn render_metrics(&self) -> String {
        self.metrics.render(self.hot_cache_metrics(), self.disk_stats())
    }

    /// Where the client's `GET /metrics` endpoint listens, when `metrics_address` is set.
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.metrics_server.lock().as_ref().map(|s| s.addr())
    }

    /// Whether the master could be reached at the last heartbeat (once a second by default).
    pub fn master_reachable(&self) -> bool {
        self.master_reachable.load(Ordering::Acquire)
    }

    /// A pure consumer contributes no memory, so the master does not know it (and asks it to
    /// remount at every heartbeat).
    fn contributes(&self) -> bool {
        self.segment.is_some() || self.ssd.is_some()
    }

    fn mount(&self, remount: bool) -> Result<()> {
        let Some(segment) = &self.segment else { return Ok(()) };
        let info = SegmentInfo {
            name: self.engine.segment_name().to_string(),
            base: segment.addr(),
            size: segment.len(),
            tier: Tier::Dram as i32,
        };
        let req = MountSegmentRequest {
            client_id: self.id.clone(),
            segment: Some(info),
            host: self.engine.segment_name().rsplit_once(':').map(|(h, _)| h.to_string()).unwrap_or_default(),
        };
        let reply = if remount {
            self.rpc.call(|mut c| async move { c.remount_segment(req).await })?
        } else {
            self.rpc.call(|mut c| async move { c.mount_segment(req).await })?
        };
        check(reply.status, "")?;
        self.segment_id.store(reply.segment_id, Ordering::Release);
        Ok(())
    }

    fn start_heartbeat(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        let stop = self.stop.clone();
        let interval = self.config.ping_interval;
        std::thread::Builder::new()
            .name("crescent-heartbeat".into())
            .spawn(move || {
                let mut master_was_down = false;
                while !stop.load(Ordering::Acquire) {
                    std::thread::sleep(interval);
                    let Some(client) = weak.upgrade() else { return };
                    if stop.load(Ordering::Acquire) {
                        return;
                    }
                    let req = PingRequest { client_id: client.id.clone(), disk: client.disk_counters() };
                    let reply = client.rpc.call(|mut c| async move { c.ping(req).await });
                    let reply = reply.and_then(|mut r| check(r.status.take(), "").map(|()| r));
                    let unreachable =
                        matches!(reply, Err(StoreError::MasterUnreachable { .. }) | Err(StoreError::TimedOut(_)));
                    client.master_reachable.store(!unreachable, Ordering::Release);
                    match reply {
                        Ok(reply) => {
                            client.apply_disk_ping(reply);
                            if master_was_down {
                                tracing::info!("master {} reachable again", client.rpc.addr());
                            }
                            master_was_down = false;
                        }
                        Err(StoreError::NeedRemount) if !client.contributes() => {}
                        Err(StoreError::NeedRemount) => {
                            tracing::warn!(
                                "the master dropped this client; remounting segment {}",
                                client.segment_name()
                            );
                            match client.mount(true) {
                                Ok(()) => client.remount_disk(),
                                Err(e) => tracing::warn!("remount failed: {e}"),
                            }
                        }
                        Err(e) => {
                            if !master_was_down {
                                tracing::warn!("heartbeat failed: {e}");
                            }
                            master_was_down = true;
                        }
                    }
                }
            })
            .expect("spawning the heartbeat thread");
    }

    // ---- memory the caller registers for zero-copy calls ----

    /// Registers caller memory for `put_from` / `get_into` (once, then reuse it).
    pub fn register_buffer(&self, addr: u64, len: u64) -> Result<()> {
        Ok(self.engine.register(addr, len, "cpu:0")?)
    }

    pub fn unregister_buffer(&self, addr: u64) -> Result<()> {
        Ok(self.engine.unregister(addr)?)
    }

    // ---- puts ----

    pub fn put(&self, key: &str, value: &[u8]) -> Result<()> {
        self.put_with(key, value, &self.default_options())
    }

    pub fn put_with(&self, key: &str, value: &[u8], options: &PutOptions) -> Result<()> {
        self.put_one(key, Buf::Bytes(value), value.len() as u64, options)
    }

    /// Zero-copy put from registered memory.
    pub fn put_from(&self, key: &str, addr: u64, len: u64) -> Result<()> {
        self.put_from_with(key, addr, len, &self.default_options())
    }

    pub fn put_from_with(&self, key: &str, addr: u64, len: u64, options: &PutOptions) -> Result<()> {
        self.put_one(key, Buf::Registered(addr), len, options)
    }

    /// Mooncake's upsert: stores `value`, replacing the key's value if it has one.
    pub fn upsert_with(&self, key: &str, value: &[u8], options: &PutOptions) -> Result<()> {
        self.upsert_one(key, Buf::Bytes(value), value.len() as u64, options)
    }

    /// [`Self::upsert_with`] from registered memory (zero copy).
    pub fn upsert_from_with(&self, key: &str, addr: u64, len: u64, options: &PutOptions) -> Result<()> {
        self.upsert_one(key, Buf::Registered(addr), len, options)
    }

    /// The options `put` and the other calls without options use: the configured
    /// `replica_num`, and this client's segment as the one `local_first` places on. A start
    /// for the options of the `*_with` calls.
    pub fn default_options(&self) -> PutOptions {
        PutOptions {
            replica_num: self.config.replica_num,
            preferred_segment: if self.segment.is_some() { self.segment_name().to_string() } else { String::new() },
            ..Default::default()
        }
    }

    /// Zero-copy calls take registered memory only (register it once with `register_buffer`).
    fn check_registered(&self, addr: u64, len: u64) -> Result<()> {
        if self.engine.is_registered(addr, len) {
            Ok(())
        } else {
            Err(StoreError::InvalidArgument(format!(
                "buffer [{addr:#x}, +{len}) is not registered memory: call register_buffer first"
            )))
        }
    }

    /// A put of a key that exists (or is being put) succeeds and leaves the object as it
    /// was, as Mooncake's puts do.
    fn put_one(&self, key: &str, src: Buf<'_>, len: u64, options: &PutOptions) -> Result<()> {
        match self.put_new(key, src, len, options) {
            Err(StoreError::AlreadyExists(_)) => Ok(()),
            r => r,
        }
    }

    /// Insert or replace (Mooncake's upsert): a put; if the key exists, it is removed and
    /// put again. A reader's lease still protects the old value: `Leased` until it ends.
    fn upsert_one(&self, key: &str, src: Buf<'_>, len: u64, options: &PutOptions) -> Result<()> {
        // Another writer may put the key between the removal and our put: try again.
        for _ in 0..UPSERT_TRIES {
            match self.put_new(key, src.reread(), len, options) {
                Err(StoreError::AlreadyExists(_)) => match self.remove(key) {
                    Ok(()) | Err(StoreError::NotFound(_)) => continue,
                    Err(e) => return Err(e),
                },
                r => return r,
            }
        }
        Err(StoreError::AlreadyExists(key.to_string()))
    }

    fn put_new(&self, key: &str, src: Buf<'_>, len: u64, options: &PutOptions) -> Result<()> {
        if len == 0 {
            return Err(StoreError::InvalidArgument(format!("empty value for key {key:?}")));
        }
        if let Buf::Registered(addr) = src {
            self.check_registered(addr, len)?;
        }
        self.hot_invalidate(key);
        let req = PutStartRequest {
            client_id: self.id.clone(),
            key: key.to_string(),
            size: len,
            options: Some(options.clone()),
        };
        let start = |mut c: MasterClient<Channel>| async move { c.put_start(req).await };
        // While the master places the object: the disk tier's copy of the value, and a byte
        // put's first piece in the staging buffer (unless the last put stayed in our own
        // segment, where nothing is staged).
        // When the last put stayed in our own segment, this one likely does too: the disk
        // tier then takes only the CRC now and writes the file from our replica.
        let local = self.last_put_local.load(Ordering::Relaxed);
        let stage_early = matches!(src, Buf::Bytes(_)) && !local;
        let (reply, (offload, first_piece)) = if self.ssd.is_some() || stage_early {
            self.rpc.call_while(start, || {
                let offload = self.prepare_offload(key, &src, len, local);
                (offload, if stage_early { self.stage_first_piece(&src, len) } else { None })
            })
        } else {
            (self.rpc.call(start), (None, None))
        };
        let reply = reply?;
        check(reply.status, key)?;
        let written = self.write_replicas(key, &reply.replicas, &src, len, first_piece);
        self.finish_put(key, written)?;
        if let Some(offload) = offload {
            self.queue_offload(offload, reply.version, &reply.replicas, &src, len);
        }
        Ok(())
    }

    fn finish_put(&self, key: &str, written: Result<()>) -> Result<()> {
        let req = KeyRequest { client_id: self.id.clone(), key: key.to_string() };
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

    /// Bytes of our own segment at a replica's address, if the replica is ours.
    #[allow(clippy::mut_from_ref)] // the bytes are our registered segment, not a field of self
    fn local_replica(&self, r: &ReplicaDescriptor, len: u64) -> Option<&mut [u8]> {
        if r.segment_name != self.engine.segment_name() {
            return None;
        }
        let segment = self.segment.as_ref()?;
        let (base, end) = (segment.addr(), segment.addr() + segment.len());
        if r.address < base || r.address.checked_add(len).is_none_or(|e| e > end) {
            tracing::error!("the master placed a replica outside our segment: {:#x}+{len}", r.address);
            return None;
        }
        // SAFETY: inside our own registered segment; the master hands this range to one object
        // at a time, and a put/get of it is the only user while its lease or put lasts.
        Some(unsafe { std::slice::from_raw_parts_mut(r.address as *mut u8, len as usize) })
    }

    /// The first piece of a byte put, copied into the staging buffer.
    fn stage_first_piece(&self, src: &Buf<'_>, len: u64) -> Option<staging::StagingBlock<'_>> {
        let Buf::Bytes(bytes) = src else { return None };
        Some(self.stage_piece(&bytes[..len as usize], 0))
    }

    /// The piece of `bytes` from `off` on (as much as one staging block takes), copied into
    /// the staging buffer.
    fn stage_piece(&self, bytes: &[u8], off: u64) -> staging::StagingBlock<'_> {
        let mut block = self.staging.acquire(bytes.len() as u64 - off);
        let n = block.len();
        block.bytes().copy_from_slice(&bytes[off as usize..(off + n) as usize]);
        block
    }

    /// Writes the value to each replica: ours by memcpy, others through the engine (a byte
    /// value through the staging buffer, starting with `first_piece` when it was staged).
    fn write_replicas(
        &self,
        key: &str,
        replicas: &[ReplicaDescriptor],
        src: &Buf<'_>,
        len: u64,
        mut first_piece: Option<staging::StagingBlock<'_>>,
    ) -> Result<()> {
        let mut remote = Vec::new();
        for r in replicas {
            match (self.local_replica(r, len), src) {
                (Some(dst), Buf::Bytes(b)) => dst.copy_from_slice(&b[..len as usize]),
                (Some(dst), Buf::Registered(addr)) => {
                    // SAFETY: the caller registered [addr, +len) and keeps it valid during the call.
                    dst.copy_from_slice(unsafe { std::slice::from_raw_parts(*addr as *const u8, len as usize) })
                }
                (Some(_), Buf::BytesMut(_)) => unreachable!("puts read from the caller"),
                (None, _) => remote.push(r),
            }
        }
        self.last_put_local.store(remote.is_empty(), Ordering::Relaxed);
        if remote.is_empty() {
            return Ok(());
        }
        let targets = remote
            .iter()
            .map(|r| Ok((self.engine.open_segment(&r.segment_name)?, r.address)))
            .collect::<Result<Vec<_>>>()
            .map_err(|e| StoreError::PeerGone { key: key.to_string(), reason: e.to_string() })?;
        match src {
            Buf::Registered(addr) => self.transfer(
                key,
                targets.iter().map(|&(seg, at)| TransferRequest {
                    opcode: Opcode::Write,
                    source: *addr,
                    target: seg,
                    target_offset: at,
                    length: len,
                }),
            ),
            Buf::Bytes(bytes) => {
                let mut off = 0;
                while off < len {
                    let block = match first_piece.take() {
                        Some(staged) => staged,
                        None => self.stage_piece(&bytes[..len as usize], off),
                    };
                    let n = block.len();
                    let src = block.addr();
                    self.transfer(
                        key,
                        targets.iter().map(|&(seg, at)| TransferRequest {
                            opcode: Opcode::Write,
                            source: src,
                            target: seg,
                            target_offset: at + off,
                            length: n,
                        }),
                    )?;
                    off += n;
                }
                Ok(())
            }
            Buf::BytesMut(_) => unreachable!("puts read from the caller"),
        }
    }

    fn transfer(&self, key: &str, requests: impl Iterator<Item = TransferRequest>) -> Result<()> {
        let requests: Vec<_> = requests.collect();
        self.engine.transfer_sync(&requests).map_err(|e| self.transfer_error(key, e))
    }

    fn transfer_error(&self, key: &str, e: crescent_engine::EngineError) -> StoreError {
        match e {
            crescent_engine::EngineError::TimedOut => StoreError::TimedOut(format!("moving object {key:?}")),
            e if e.is_caller_error() => StoreError::Engine(e),
            e => StoreError::PeerGone { key: key.to_string(), reason: e.to_string() },
        }
    }

    /// Waits for a staged piece of a get and copies it to its place in `out`.
    fn finish_staged(&self, key: &str, mut piece: InFlight<'_>, out: &mut [u8]) -> Result<()> {
        let id = piece.id.take().expect("finished once");
        self.engine.transfer_finish(id).map_err(|e| self.transfer_error(key, e))?;
        let (off, n) = (piece.off as usize, piece.block.len() as usize);
        out[off..off + n].copy_from_slice(piece.block.bytes());
        Ok(())
    }

    // ---- gets ----

    fn replica_list(&self, key: &str) -> Result<Listed> {
        let req = KeyRequest { client_id: self.id.clone(), key: key.to_string() };
        let clock = LeaseClock::start();
        let mut reply = self.rpc.call(|mut c| async move { c.get_replica_list(req).await })?;
        check(reply.status.take(), key)?;
        Ok(Listed { reply, clock })
    }

    pub fn get(&self, key: &str) -> Result<Vec<u8>> {
        let mut early = Vec::new();
        let (list, served) = self.replica_list_reading_disk(key, |size| {
            let early = &mut early;
            early.resize(size as usize, 0);
            Some(&mut early[..])
        })?;
        if served {
            return Ok(early);
        }
        self.get_listed(key, &list)
    }

    /// A byte get once the master has answered with `list`: from the hot cache, or read.
    fn get_listed(&self, key: &str, list: &Listed) -> Result<Vec<u8>> {
        if let Some(hit) = self.hot_get_vec(key, list) {
            return Ok(hit);
        }
        let mut out = vec![0u8; list.size as usize];
        self.read_replicas(key, list, Buf::BytesMut(&mut out))?;
        Ok(out)
    }

    /// Zero-copy get into registered memory; returns the object's size.
    pub fn get_into(&self, key: &str, addr: u64, len: u64) -> Result<u64> {
        self.check_registered(addr, len)?;
        let (list, served) = self.replica_list_reading_disk(key, |size| {
            // SAFETY: the caller registered [addr, +len) for this call, and size <= len.
            (size <= len).then(|| unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, size as usize) })
        })?;
        if served {
            return Ok(list.size);
        }
        if list.size > len {
            return Err(StoreError::BufferTooSmall { key: key.to_string(), need: list.size, have: len });
        }
        if self.hot_get_into(key, &list, addr) {
            return Ok(list.size);
        }
        self.read_replicas(key, &list, Buf::Registered(addr))?;
        Ok(list.size)
    }

    /// Reads from the best replica: our own memory first (a memcpy), then the others in turn.
    /// A read from memory that ends after the list's lease fails (see [`lease`]).
    fn read_replicas(&self, key: &str, list: &Listed, mut dst: Buf<'_>) -> Result<()> {
        let size = list.size;
        let mut order: Vec<&ReplicaDescriptor> = list.replicas.iter().filter(|r| readable_in_memory(r)).collect();
        order.sort_by_key(|r| r.segment_name != self.engine.segment_name());
        let mut last_err = None;
        for r in order {
            if let Some(src) = self.local_replica(r, size) {
                match &mut dst {
                    Buf::BytesMut(out) => out[..size as usize].copy_from_slice(src),
                    Buf::Registered(addr) => {
                        // SAFETY: the caller registered [addr, +len >= size) for this call.
                        unsafe { std::slice::from_raw_parts_mut(*addr as *mut u8, size as usize) }.copy_from_slice(src)
                    }
                    Buf::Bytes(_) => unreachable!("gets write to the caller"),
                }
                return list.lease_held(key);
            }
            match self.read_remote_hot(key, list, r, &mut dst) {
                Ok(()) => return Ok(()),
                // Every replica shares the one lease: the others would be no better.
                Err(e) if e.is_caller_error() || matches!(e, StoreError::LeaseExpired { .. }) => return Err(e),
                Err(e) => {
                    tracing::debug!("reading {key:?} from {}: {e}; trying the next replica", r.segment_name);
                    last_err = Some(e);
                }
            }
        }
        // No memory replica (evicted, or its holder is gone): a disk copy.
        match self.read_disk_copies(key, list, &mut dst) {
            Some(Ok(())) => return Ok(()),
            Some(Err(e)) => last_err = Some(e),
            None => {}
        }
        Err(last_err
            .unwrap_or_else(|| StoreError::PeerGone { key: key.to_string(), reason: "no readable replica".into() }))
    }

    fn read_remote(&self, key: &str, r: &ReplicaDescriptor, size: u64, dst: &mut Buf<'_>) -> Result<()> {
        let seg = self
            .engine
            .open_segment(&r.segment_name)
            .map_err(|e| StoreError::PeerGone { key: key.to_string(), reason: e.to_string() })?;
        let read = |source: u64, off: u64, n: u64| TransferRequest {
            opcode: Opcode::Read,
            source,
            target: seg,
            target_offset: r.address + off,
            length: n,
        };
        match dst {
            Buf::Registered(addr) => self.transfer(key, std::iter::once(read(*addr, 0, size))),
            Buf::BytesMut(_) if size == 0 => Ok(()),
            Buf::BytesMut(out) => {
                // Where the transport needs no registration (tcp, shm), straight into the
                // caller's bytes in one transfer, as a zero-copy get.
                // (Memory the caller registered overlapping these bytes, a caller's mistake,
                // makes the loan fail: then the staged path below.)
                let at = out.as_mut_ptr() as u64;
                match self.engine.lend_local(Some(seg), at, size) {
                    // The loan ends once the transfer has (it is dropped after it).
                    Ok(Some(_loan)) => return self.transfer(key, std::iter::once(read(at, 0, size))),
                    Ok(None) => {}
                    Err(e) => tracing::debug!("reading {key:?} through the staging buffer: {e}"),
                }
                // Through the staging buffer in pieces, two in flight: the next piece moves
                // while the last one is copied out (the copy into fresh memory, page faults
                // included, costs about as much as the transfer).
                let piece = STAGED_GET_PIECE.min(self.staging.chunk());
                let mut off = 0;
                // Dropped on an early return: waits for its transfer before its block goes back.
                let mut previous: Option<InFlight<'_>> = None;
                while off < size {
                    // The second block only if it is free now: a thread waiting for a second
                    // block while holding one could wait forever on others doing the same.
                    let block = match previous {
                        None => Some(self.staging.acquire((size - off).min(piece))),
                        Some(_) => self.staging.try_acquire((size - off).min(piece)),
                    };
                    let Some(block) = block else {
                        self.finish_staged(key, previous.take().expect("a piece is in flight"), out)?;
                        continue;
                    };
                    let n = block.len();
                    let id = self.engine.transfer_start(&[read(block.addr(), off, n)]);
                    let next = InFlight {
                        engine: &self.engine,
                        id: Some(id.map_err(|e| self.transfer_error(key, e))?),
                        block,
                        off,
                    };
                    if let Some(done) = previous.replace(next) {
                        self.finish_staged(key, done, out)?;
                    }
                    off += n;
                }
                if let Some(done) = previous {
                    self.finish_staged(key, done, out)?;
                }
                Ok(())
            }
            Buf::Bytes(_) => unreachable!("gets write to the caller"),
        }
    }

    // ---- batches: one master round trip per batch ----

    /// Puts several values (bytes); one result per key.
    pub fn put_batch(&self, keys: &[String], values: &[&[u8]]) -> Result<Vec<Result<()>>> {
        self.put_batch_with(keys, values, &self.default_options())
    }

    pub fn put_batch_with(&self, keys: &[String], values: &[&[u8]], options: &PutOptions) -> Result<Vec<Result<()>>> {
        if keys.len() != values.len() {
            return Err(StoreError::InvalidArgument(format!("{} keys but {} values", keys.len(), values.len())));
        }
        let sizes: Vec<u64> = values.iter().map(|v| v.len() as u64).collect();
        let srcs: Vec<Buf<'_>> = values.iter().map(|v| Buf::Bytes(v)).collect();
        let (starts, offloads) = self.batch_put_start(keys, &sizes, &srcs, options)?;
        let placed = placements(&starts);
        let written: Vec<Result<()>> = starts
            .into_iter()
            .zip(keys.iter().zip(values))
            .map(|(start, (key, value))| {
                start.and_then(|(replicas, _)| {
                    self.write_replicas(key, &replicas, &Buf::Bytes(value), value.len() as u64, None)
                })
            })
            .collect();
        let results = self.batch_put_finish(keys, written)?;
        self.queue_offloads(&results, offloads, &placed, &srcs, &sizes);
        Ok(results)
    }

    /// Zero-copy puts from registered memory: all remote writes go in one engine batch.
    pub fn batch_put_from(&self, keys: &[String], addrs: &[u64], sizes: &[u64]) -> Result<Vec<Result<()>>> {
        self.batch_put_from_with(keys, addrs, sizes, &self.default_options())
    }

    pub fn batch_put_from_with(
        &self,
        keys: &[String],
        addrs: &[u64],
        sizes: &[u64],
        options: &PutOptions,
    ) -> Result<Vec<Result<()>>> {
        if keys.len() != addrs.len() || keys.len() != sizes.len() {
            return Err(StoreError::InvalidArgument("keys, buffers and sizes differ in length".into()));
        }
        for (&addr, &len) in addrs.iter().zip(sizes) {
            self.check_registered(addr, len)?;
        }
        let srcs: Vec<Buf<'_>> = addrs.iter().map(|&a| Buf::Registered(a)).collect();
        let (starts, offloads) = self.batch_put_start(keys, sizes, &srcs, options)?;
        let placed = placements(&starts);
        let mut results: Vec<Result<()>> = Vec::with_capacity(keys.len());
        let mut requests = Vec::new();
        let mut owner = Vec::new();
        for (i, start) in starts.into_iter().enumerate() {
            let replicas = match start {
                Ok((r, _)) => r,
                Err(e) => {
                    results.push(Err(e));
                    continue;
                }
            };
            results.push(Ok(()));
            for r in &replicas {
                if let Some(dst) = self.local_replica(r, sizes[i]) {
                    // SAFETY: the caller registered [addrs[i], +sizes[i]) for this call.
                    dst.copy_from_slice(unsafe {
                        std::slice::from_raw_parts(addrs[i] as *const u8, sizes[i] as usize)
                    });
                    continue;
                }
                match self.engine.open_segment(&r.segment_name) {
                    Ok(seg) => {
                        requests.push(TransferRequest {
                            opcode: Opcode::Write,
                            source: addrs[i],
                            target: seg,
                            target_offset: r.address,
                            length: sizes[i],
                        });
                        owner.push(i);
                    }
                    Err(e) => results[i] = Err(StoreError::PeerGone { key: keys[i].clone(), reason: e.to_string() }),
                }
            }
        }
        self.last_put_local.store(requests.is_empty(), Ordering::Relaxed);
        self.run_batch(keys, &requests, &owner, &mut results)?;
        let results = self.batch_put_finish(keys, results)?;
        self.queue_offloads(&results, offloads, &placed, &srcs, sizes);
        Ok(results)
    }

    /// Per key: the replicas to write and the object's version; and the values' disk tier
    /// images, made while the master places them.
    #[allow(clippy::type_complexity)]
    fn batch_put_start(
        &self,
        keys: &[String],
        sizes: &[u64],
        srcs: &[Buf<'_>],
        options: &PutOptions,
    ) -> Result<(Vec<Result<(Vec<ReplicaDescriptor>, u64)>>, Vec<Option<PreparedOffload>>)> {
        if let Some(i) = sizes.iter().position(|s| *s == 0) {
            return Err(StoreError::InvalidArgument(format!("empty value for key {:?}", keys[i])));
        }
        keys.iter().for_each(|k| self.hot_invalidate(k));
        let req = BatchPutStartRequest {
            client_id: self.id.clone(),
            keys: keys.to_vec(),
            sizes: sizes.to_vec(),
            options: Some(options.clone()),
        };
        let start = |mut c: MasterClient<Channel>| async move { c.batch_put_start(req).await };
        let (reply, offloads) = if self.ssd.is_some() {
            // The disk tier's copies of the values (or their CRCs, see `put_one`) are made
            // while the master places them.
            let local = self.last_put_local.load(Ordering::Relaxed);
            self.rpc.call_while(start, || {
                keys.iter()
                    .zip(srcs)
                    .zip(sizes)
                    .map(|((key, src), &len)| self.prepare_offload(key, src, len, local))
                    .collect()
            })
        } else {
            (self.rpc.call(start), Vec::new())
        };
        let reply = reply?;
        one_per_key(reply.items.len(), keys.len())?;
        let starts = reply
            .items
            .into_iter()
            .zip(keys)
            .map(|(item, key)| check(item.status, key).map(|()| (item.replicas, item.version)))
            .collect();
        Ok((starts, offloads))
    }

    /// Commits the keys whose bytes were written, revokes the others (whose put had started).
    fn batch_put_finish(&self, keys: &[String], mut results: Vec<Result<()>>) -> Result<Vec<Result<()>>> {
        let ok: Vec<String> = keys.iter().zip(&results).filter(|(_, r)| r.is_ok()).map(|(k, _)| k.clone()).collect();
        let failed: Vec<String> = keys
            .iter()
            .zip(&results)
            .filter(|(_, r)| {
                matches!(
                    r,
                    Err(StoreError::PeerGone { .. }) | Err(StoreError::TimedOut(_)) | Err(StoreError::Engine(_))
                )
            })
            .map(|(k, _)| k.clone())
            .collect();
        if !failed.is_empty() {
            let req = BatchKeyRequest { client_id: self.id.clone(), keys: failed };
            if let Err(e) = self.rpc.call(|mut c| async move { c.batch_put_revoke(req).await }) {
                tracing::warn!("revoking failed puts: {e}");
            }
        }
        if !ok.is_empty() {
            let req = BatchKeyRequest { client_id: self.id.clone(), keys: ok.clone() };
            let reply = self.rpc.call(|mut c| async move { c.batch_put_end(req).await })?;
            one_per_key(reply.statuses.len(), ok.len())?;
            let mut statuses = reply.statuses.into_iter();
            for (key, r) in keys.iter().zip(results.iter_mut()) {
                if r.is_ok() {
                    *r = check(statuses.next(), key);
                }
            }
        }
        // Keys that exist already keep their value, and their put succeeds (Mooncake's puts).
        for r in &mut results {
            if matches!(r, Err(StoreError::AlreadyExists(_))) {
                *r = Ok(());
            }
        }
        Ok(results)
    }

    /// Runs one engine batch; failures land in `results[owner[i]]`.
    fn run_batch(
        &self,
        keys: &[String],
        requests: &[TransferRequest],
        owner: &[usize],
        results: &mut [Result<()>],
    ) -> Result<()> {
        let batch = self.start_batch(requests)?;
        self.finish_batch(batch, keys, owner, results)
    }

    /// Submits one engine batch (none when there is nothing to move); the transfers run while
    /// the caller does other work, until [`Self::finish_batch`].
    fn start_batch(&self, requests: &[TransferRequest]) -> Result<Option<crescent_engine::BatchId>> {
        if requests.is_empty() {
            return Ok(None);
        }
        let batch = self.engine.allocate_batch(requests.len())?;
        if let Err(e) = self.engine.submit(batch, requests) {
            let _ = self.engine.free_batch(batch);
            return Err(e.into());
        }
        Ok(Some(batch))
    }

    /// Waits for a batch of [`Self::start_batch`]; failures land in `results[owner[i]]`.
    fn finish_batch(
        &self,
        batch: Option<crescent_engine::BatchId>,
        keys: &[String],
        owner: &[usize],
        results: &mut [Result<()>],
    ) -> Result<()> {
        let Some(batch) = batch else { return Ok(()) };
        let statuses = self.engine.wait_batch(batch, None);
        let freed = self.engine.free_batch(batch);
        let statuses = statuses?;
        freed?;
        for (status, &i) in statuses.into_iter().zip(owner) {
            let err = match status {
                TransferStatus::Completed => continue,
                TransferStatus::TimedOut => StoreError::TimedOut(format!("moving object {:?}", keys[i])),
                TransferStatus::Failed(reason) => StoreError::PeerGone { key: keys[i].clone(), reason },
                TransferStatus::Pending => StoreError::Internal("batch ended with a pending request".into()),
            };
            if results[i].is_ok() {
                results[i] = Err(err);
            }
        }
        Ok(())
    }

    fn batch_replica_lists(&self, keys: &[String]) -> Result<Vec<Result<Listed>>> {
        let req = BatchKeyRequest { client_id: self.id.clone(), keys: keys.to_vec() };
        let clock = LeaseClock::start();
        let reply = self.rpc.call(|mut c| async move { c.batch_get_replica_list(req).await })?;
        one_per_key(reply.items.len(), keys.len())?;
        Ok(reply
            .items
            .into_iter()
            .zip(keys)
            .map(|(mut item, key)| check(item.status.take(), key).map(|()| Listed { reply: item, clock }))
            .collect())
    }

    /// Gets several values (bytes); one result per key.
    ///
    /// Where no transport needs registered memory (tcp, shm), the values are read as
    /// `batch_get_into` reads them (hits copied from the hot cache, misses as one engine
    /// batch), straight into their result buffers lent to the engine for the call
    /// ([`TransferEngine::lend_local`]); otherwise one after another through the staging
    /// buffer.
    pub fn get_batch(&self, keys: &[String]) -> Result<Vec<Result<Vec<u8>>>> {
        let lists = self.batch_replica_lists(keys)?;
        let mut out: Vec<Option<Result<Vec<u8>>>> = lists
            .iter()
            .zip(keys)
            .map(|(list, key)| match list {
                Err(e) => Some(Err(StoreError::from_status(e.code(), &e.to_string(), key))),
                Ok(l) if l.size == 0 => Some(Ok(Vec::new())),
                Ok(_) => None,
            })
            .collect();
        let rest: Vec<usize> = (0..keys.len()).filter(|&i| out[i].is_none()).collect();
        let mut bufs: Vec<Vec<u8>> =
            rest.iter().map(|&i| vec![0u8; lists[i].as_ref().map_or(0, |l| l.size) as usize]).collect();
        let mut loans = Vec::with_capacity(bufs.len());
        for b in &mut bufs {
            match self.engine.lend_local(None, b.as_mut_ptr() as u64, b.len() as u64) {
                Ok(Some(loan)) => loans.push(loan),
                _ => break,
            }
        }
        if loans.len() == bufs.len() && !bufs.is_empty() {
            let sub_keys: Vec<String> = rest.iter().map(|&i| keys[i].clone()).collect();
            let sub_lists: Vec<_> = rest.iter().map(|&i| &lists[i]).collect();
            let addrs: Vec<u64> = bufs.iter_mut().map(|b| b.as_mut_ptr() as u64).collect();
            let lens: Vec<u64> = bufs.iter().map(|b| b.len() as u64).collect();
            let got = self.get_lists_into(&sub_keys, &sub_lists, &addrs, &lens, true);
            drop(loans); // after every transfer into the buffers has ended
            for ((&i, buf), r) in rest.iter().zip(bufs).zip(got?) {
                out[i] = Some(r.map(|_| buf));
            }
        } else {
            drop(loans);
            for &i in &rest {
                let list = lists[i].as_ref().expect("errors were answered above");
                out[i] = Some(self.get_listed(&keys[i], list));
            }
        }
        Ok(out.into_iter().map(|r| r.expect("every key answered")).collect())
    }

    /// Zero-copy gets into registered memory: remote reads go in one engine batch; a key whose
    /// first remote replica fails is retried on its other replicas. Returns sizes read.
    ///
    /// With the hot cache: hits are copied out while the misses' transfers run; misses then
    /// fill the cache from the bytes they brought; a key another get is fetching waits for
    /// that fetch, after this batch's own fills are published (so two batches waiting for each
    /// other's keys never wait forever).
    pub fn batch_get_into(&self, keys: &[String], addrs: &[u64], lens: &[u64]) -> Result<Vec<Result<u64>>> {
        if keys.len() != addrs.len() || keys.len() != lens.len() {
            return Err(StoreError::InvalidArgument("keys, buffers and sizes differ in length".into()));
        }
        for (&addr, &len) in addrs.iter().zip(lens) {
            self.check_registered(addr, len)?;
        }
        let lists = self.batch_replica_lists(keys)?;
        self.get_lists_into(keys, &lists.iter().collect::<Vec<_>>(), addrs, lens, false)
    }

    /// [`Self::batch_get_into`] once the master has answered with `lists`; `addrs` are
    /// registered or lent. `fresh`: the buffers are newly allocated, so a hit's buffer is
    /// populated before its copy (see `value_buffer`).
    fn get_lists_into(
        &self,
        keys: &[String],
        lists: &[&Result<Listed>],
        addrs: &[u64],
        lens: &[u64],
        fresh: bool,
    ) -> Result<Vec<Result<u64>>> {
        let mut results: Vec<Result<()>> = Vec::with_capacity(keys.len());
        let (mut requests, mut owner) = (Vec::new(), Vec::new());
        let mut sizes = vec![0u64; keys.len()];
        let (mut hits, mut fills, mut joins) = (Vec::new(), Vec::new(), Vec::new());
        for (i, list) in lists.iter().enumerate() {
            let list = match list {
                Ok(l) => l,
                Err(e) => {
                    results.push(Err(StoreError::from_status(e.code(), &e.to_string(), &keys[i])));
                    continue;
                }
            };
            sizes[i] = list.size;
            if list.size > lens[i] {
                results.push(Err(StoreError::BufferTooSmall { key: keys[i].clone(), need: list.size, have: lens[i] }));
                continue;
            }
            results.push(Ok(()));
            if let Some(guard) = self.hot_lookup(&keys[i], list) {
                hits.push((i, guard));
                continue;
            }
            let complete: Vec<&ReplicaDescriptor> = list.replicas.iter().filter(|r| readable_in_memory(r)).collect();
            if let Some(src) = complete.iter().find_map(|r| self.local_replica(r, list.size)) {
                // SAFETY: the caller registered [addrs[i], +lens[i] >= size) for this call.
                unsafe { std::slice::from_raw_parts_mut(addrs[i] as *mut u8, list.size as usize) }.copy_from_slice(src);
                results[i] = list.lease_held(&keys[i]);
                continue;
            }
            if let Some(r) = complete.first() {
                match self.hot_begin(&keys[i], list, r) {
                    Miss::Lead(fill) => fills.push((i, fill)),
                    Miss::Join(joined) => {
                        joins.push((i, joined));
                        continue;
                    }
                    Miss::Skip => {}
                }
            }
            match complete.first().map(|r| (self.engine.open_segment(&r.segment_name), r.address)) {
                Some((Ok(seg), at)) => {
                    requests.push(TransferRequest {
                        opcode: Opcode::Read,
                        source: addrs[i],
                        target: seg,
                        target_offset: at,
                        length: list.size,
                    });
                    owner.push(i);
                }
                Some((Err(e), _)) => {
                    results[i] = Err(StoreError::PeerGone { key: keys[i].clone(), reason: e.to_string() })
                }
                // No memory replica: a disk copy, if there is one.
                None => results[i] = self.read_replicas(&keys[i], list, Buf::Registered(addrs[i])),
            }
        }
        let batch = self.start_batch(&requests)?;
        for (i, guard) in hits.drain(..) {
            if fresh {
                value_buffer::populate(addrs[i] as *const u8, guard.size() as usize);
            }
            hot_cache::copy_out(&guard, addrs[i]);
        }
        if let (Some(hot), Some(id)) = (&self.hot, batch) {
            self.fill_as_transfers_end(hot, id, &owner, fills, addrs, (keys, lists));
        }
        self.finish_batch(batch, keys, &owner, &mut results)?;
        // A read that ended after the lease may hold another object's bytes (see [`lease`]).
        for &i in &owner {
            if let (Ok(()), Ok(list)) = (&results[i], lists[i]) {
                results[i] = list.lease_held(&keys[i]);
            }
        }
        if let Some(hot) = &self.hot {
            for (i, joined) in joins.drain(..) {
                match hot.wait(joined) {
                    Some(guard) => hot_cache::copy_out(&guard, addrs[i]),
                    None => {
                        if let Ok(list) = &lists[i] {
                            results[i] = self.read_replicas(&keys[i], list, Buf::Registered(addrs[i]));
                        }
                    }
                }
            }
        }
        // Retry failed keys on their other replicas.
        for i in 0..keys.len() {
            if matches!(results[i], Err(StoreError::PeerGone { .. }) | Err(StoreError::TimedOut(_))) {
                if let Ok(list) = &lists[i] {
                    if list.replicas.len() > 1 {
                        results[i] = self.read_replicas(&keys[i], list, Buf::Registered(addrs[i]));
                    }
                }
            }
        }
        Ok(results.into_iter().zip(sizes).map(|(r, s)| r.map(|()| s)).collect())
    }

    /// Fills the cache from each miss of a running batch as soon as its own transfer has
    /// completed, while the others still move. A fill whose transfer failed (or that has none)
    /// is dropped: its blocks go back and the gets waiting for it read for themselves. So is
    /// one whose read ended after its lease (`listed`: the batch's keys and replica lists).
    fn fill_as_transfers_end(
        &self,
        hot: &HotCache,
        batch: crescent_engine::BatchId,
        owner: &[usize],
        fills: Vec<(usize, hot_cache::Fill)>,
        addrs: &[u64],
        (keys, lists): (&[String], &[&Result<Listed>]),
    ) {
        // (request index, key index, fill)
        let mut waiting: Vec<(usize, usize, hot_cache::Fill)> = fills
            .into_iter()
            .filter_map(|(i, fill)| owner.iter().position(|&o| o == i).map(|k| (k, i, fill)))
            .collect();
        while !waiting.is_empty() {
            let Ok(statuses) = self.engine.batch_status(batch) else { return };
            let mut pending = Vec::with_capacity(waiting.len());
            for (k, i, mut fill) in waiting {
                match statuses.get(k) {
                    Some(TransferStatus::Pending) => pending.push((k, i, fill)),
                    Some(TransferStatus::Completed)
                        if lists[i].as_ref().is_ok_and(|l| l.lease_held(&keys[i]).is_ok()) =>
                    {
                        hot_cache::fill_from(&mut fill, addrs[i]);
                        hot.publish(fill);
                    }
                    _ => {} // failed, or ended after the lease: dropped
                }
            }
            waiting = pending;
            if !waiting.is_empty() {
                // Returns early once every request has ended.
                let _ = self.engine.wait_batch(batch, Some(Duration::from_millis(1)));
            }
        }
    }

    // ---- probes and removal ----

    /// Whether a committed object exists (no lease is granted).
    pub fn exists(&self, key: &str) -> Result<bool> {
        let req = KeyRequest { client_id: self.id.clone(), key: key.to_string() };
        let reply = self.rpc.call(|mut c| async move { c.exists(req).await })?;
        check(reply.status, key)?;
        Ok(reply.exists)
    }

    pub fn batch_exists(&self, keys: &[String]) -> Result<Vec<bool>> {
        let req = BatchKeyRequest { client_id: self.id.clone(), keys: keys.to_vec() };
        let reply = self.rpc.call(|mut c| async move { c.batch_exists(req).await })?;
        check(reply.status, "")?;
        Ok(reply.exists)
    }

    /// Everything the master knows of a key, without side effects.
    pub fn query(&self, key: &str) -> Result<QueryKeyReply> {
        let req = KeyRequest { client_id: self.id.clone(), key: key.to_string() };
        let mut reply = self.rpc.call(|mut c| async move { c.query_key(req).await })?;
        check(reply.status.take(), key)?;
        Ok(reply)
    }

    /// Size of a committed object (no lease).
    pub fn get_size(&self, key: &str) -> Result<u64> {
        let q = self.query(key)?;
        if !q.exists {
            return Err(StoreError::NotFound(key.to_string()));
        }
        Ok(q.size)
    }

    /// Removes an object; refused while a reader holds its lease.
    pub fn remove(&self, key: &str) -> Result<()> {
        self.remove_with(key, false)
    }

    pub fn remove_with(&self, key: &str, force: bool) -> Result<()> {
        self.hot_invalidate(key);
        let req = RemoveRequest { client_id: self.id.clone(), key: key.to_string(), force };
        let reply = self.rpc.call(|mut c| async move { c.remove(req).await })?;
        check(reply.status, key)?;
        self.sync_disk_removals();
        Ok(())
    }

    /// Removes every committed object whose key matches `pattern`; returns how many.
    pub fn remove_by_regex(&self, pattern: &str) -> Result<u64> {
        self.remove_by_regex_with(pattern, false)
    }

    /// [`Self::remove_by_regex`]; `force` removes leased objects too.
    pub fn remove_by_regex_with(&self, pattern: &str, force: bool) -> Result<u64> {
        if let (Some(hot), Ok(re)) = (&self.hot, regex::Regex::new(pattern)) {
            hot.invalidate_matching(&re);
        }
        let req = RemoveByRegexRequest { client_id: self.id.clone(), pattern: pattern.to_string(), force };
        let reply = self.rpc.call(|mut c| async move { c.remove_by_regex(req).await })?;
        check(reply.status, pattern)?;
        self.sync_disk_removals();
        Ok(reply.removed)
    }

    pub fn remove_all(&self) -> Result<u64> {
        self.remove_all_with(false)
    }

    /// Removes every committed object (`force`: leased ones too); returns how many.
    pub fn remove_all_with(&self, force: bool) -> Result<u64> {
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
    pub fn close(&self) -> Result<()> {
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        self.stop.store(true, Ordering::Release);
        self.metrics_server.lock().take();
        let disk_closed = self.close_disk();
        if self.segment.is_some() {
            let req = UnmountSegmentRequest {
                client_id: self.id.clone(),
                segment_id: self.segment_id.load(Ordering::Acquire),
            };
            let reply = self.rpc.call(|mut c| async move { c.unmount_segment(req).await })?;
            check(reply.status, "")?;
        }
        disk_closed
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

/// Piece of a byte `get` staged at a time (two are in flight).
const STAGED_GET_PIECE: u64 = 2 << 20;

/// A piece of a staged get whose transfer is in flight. Dropped unfinished (an error
/// elsewhere in the get), it waits for the transfer before its block goes back.
struct InFlight<'a> {
    engine: &'a TransferEngine,
    id: Option<crescent_engine::BatchId>,
    block: staging::StagingBlock<'a>,
    off: u64,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            let _ = self.engine.transfer_finish(id);
        }
    }
}

/// How long the master keeps a silent client (for callers that wait on it).
pub const DEFAULT_CLIENT_TTL: Duration = Duration::from_secs(10);
