//! The client's link to its disk tier ([`super::disk`]): the tier and its disk service, the
//! disk's mount at the master, the tier's announcements to the master, what pings bring for
//! it, and the offload of a put (prepared while the master places the value, queued once the
//! put committed). The executor reads the tier's files through [`DiskLink::tier`]; nothing
//! here reads or writes values itself.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crescent_engine::{RegisteredMemory, TransferEngine};

use super::config::ClientConfig;
use super::disk::file::ResidentValue;
use super::disk::service::DiskService;
use super::disk::{Announcer, DiskTier, PreparedOffload};
use super::disk_news::DiskMount;
use super::rpc::{check, MasterRpc};
use super::sg::Src;
use crate::error::{Result, StoreError};
use crate::proto::*;
use crate::protocol::disk_segment_name;
use crate::staging::Staging;

/// How long `close` waits for queued offloads.
pub const CLOSE_FLUSH_TIMEOUT: Duration = Duration::from_secs(60);

/// The disk tier's link to the master.
struct MasterAnnouncer {
    rpc: Arc<MasterRpc>,
    client_id: String,
    segment_id: Arc<AtomicU64>,
}

impl Announcer for MasterAnnouncer {
    fn announce(&self, added: &[DiskEntry], removed: &[DiskEntry], restore: bool) -> Result<Vec<bool>> {
        let req = UpdateDiskReplicasRequest {
            client_id: self.client_id.clone(),
            segment_id: self.segment_id.load(Ordering::Acquire),
            added: added.to_vec(),
            removed: removed.to_vec(),
            restore,
        };
        let reply = self.rpc.call(|mut c| async move { c.update_disk_replicas(req).await })?;
        if added.is_empty() {
            return Ok(Vec::new());
        }
        if reply.statuses.len() != added.len() {
            let got = reply.statuses.len();
            // The whole request failed (e.g. the disk is not mounted right now).
            check(reply.statuses.into_iter().next(), "")?;
            return Err(StoreError::BadReply(format!("{got} statuses for {} announced files", added.len())));
        }
        Ok(reply.statuses.into_iter().map(|s| check(Some(s), "").is_ok()).collect())
    }
}

/// A client's disk tier and what links it to the master.
pub(crate) struct DiskLink {
    pub tier: Arc<DiskTier>,
    service: DiskService,
    /// The disk's mount at the master (segment and term).
    mount: Arc<DiskMount>,
    /// Ends the disk's owner stream ([`super::disk_news`]).
    stop: Arc<AtomicBool>,
    /// Whether to keep that stream (`ClientConfig::disk_news_stream`).
    news_stream: bool,
    /// The disk's name in replica lists.
    segment_name: String,
    rpc: Arc<MasterRpc>,
    client_id: String,
    host: String,
    /// Unmounted by [`Self::drain`]: not mounted again.
    drained: AtomicBool,
}

impl DiskLink {
    /// Opens the tier of `config`, if it has one (before anything else: an invalid root fails
    /// the start).
    pub(crate) fn open_tier(config: &ClientConfig) -> Result<Option<Arc<DiskTier>>> {
        config.disk_config()?.map(DiskTier::open).transpose()
    }

    /// Starts the tier's disk service, serving files to other clients through `staging`.
    pub(crate) fn new(
        tier: Arc<DiskTier>,
        engine: &TransferEngine,
        staging: Arc<Staging>,
        rpc: Arc<MasterRpc>,
        client_id: String,
        news_stream: bool,
    ) -> Result<DiskLink> {
        let host = engine.segment_name().rsplit_once(':').map_or("127.0.0.1", |(h, _)| h).to_string();
        let service = DiskService::start(&host, engine.auth(), &tier, staging, engine.segment_name().to_string())?;
        let segment_name = disk_segment_name(tier.disk_id());
        Ok(DiskLink {
            tier,
            service,
            mount: Arc::default(),
            stop: Arc::default(),
            news_stream,
            segment_name,
            rpc,
            client_id,
            host,
            drained: AtomicBool::new(false),
        })
    }

    /// The disk's name in replica lists.
    pub(crate) fn segment_name(&self) -> &str {
        &self.segment_name
    }

    /// Mounts the disk at the master, re-announces its files, starts its writers and the
    /// check of the files found at start.
    pub(crate) fn start(&self) -> Result<()> {
        self.mount()?;
        self.tier.start(Arc::new(MasterAnnouncer {
            rpc: self.rpc.clone(),
            client_id: self.client_id.clone(),
            segment_id: self.mount.segment_id.clone(),
        }));
        if self.news_stream {
            let news = super::disk_news::run(
                Arc::downgrade(&self.rpc),
                Arc::downgrade(&self.tier),
                self.client_id.clone(),
                self.mount.clone(),
                self.stop.clone(),
            );
            self.rpc.handle().spawn(news);
        }
        self.tier.restore_all()?;
        self.tier.verify_found();
        Ok(())
    }

    fn mount(&self) -> Result<()> {
        let req = MountDiskRequest {
            client_id: self.client_id.clone(),
            disk_id: self.tier.disk_id().to_string(),
            disk_service: self.service.address(),
            capacity: self.tier.capacity(),
            host: self.host.clone(),
            held_removals: self.tier.held_removals(),
            owner_stream: self.news_stream,
        };
        let reply = self.rpc.call(|mut c| async move { c.mount_disk(req).await })?;
        check(reply.status, "")?;
        self.mount.term.store(reply.term, Ordering::Release);
        self.mount.segment_id.store(reply.segment_id, Ordering::Release);
        Ok(())
    }

    /// After the master dropped this client: mount the disk again and re-announce its files
    /// (not once drained, [`Self::drain`]).
    pub(crate) fn remount(&self) {
        if self.drained.load(Ordering::Acquire) {
            return;
        }
        if let Err(e) = self.mount().and_then(|()| self.tier.restore_all()) {
            tracing::warn!("remounting the disk tier: {e}");
        }
    }

    /// What a ping brought for the disk tier: removals to make, objects whose only copies
    /// are now files, and (when it changed) the set of removals to keep for the master.
    pub(crate) fn apply_ping(&self, reply: &PingReply) {
        self.tier.apply_removals(&reply.disk_removals);
        for e in &reply.disk_only {
            self.tier.note_only_copy(&e.key, e.version, true);
        }
        if reply.held_generation > 0 {
            self.tier.keep_held_removals(reply.held_removals.clone());
        }
    }

    /// The tier's counters as the master's metrics show them (sent on pings).
    pub(crate) fn counters(&self) -> DiskCounters {
        let s = self.tier.stats();
        DiskCounters {
            files: s.files,
            used_bytes: s.used_bytes,
            written: s.written,
            bytes_written: s.bytes_written,
            queue_full: s.queue_full,
            write_failures: s.write_failures,
            evicted: s.evicted,
            busy_dropped: s.busy_dropped,
            too_large: s.too_large,
            recycled: s.recycled,
            retired_files: s.retired_files,
            retired_bytes: s.retired_bytes,
        }
    }

    /// The value's file image (or, with `in_place`, only its CRC-32), made before its put
    /// commits (see [`DiskTier::prepare`]): queued once the put committed ([`Self::queue`]),
    /// it never makes the put wait for the disk.
    /// A value in device memory is copied to the host for it (the disk tier stays host-side);
    /// an error is that copy's.
    pub(crate) fn prepare(&self, key: &str, src: &Src<'_>, in_place: bool) -> Result<PreparedOffload> {
        let mut scratch = Vec::new();
        let bytes = src.gathered(&mut scratch)?;
        Ok(if in_place { self.tier.prepare_resident(key, bytes) } else { self.tier.prepare(key, bytes) })
    }

    /// Hands a committed put's offload to the writers, who read the value from `resident`, the
    /// put's replica in our own segment (and the segment), when it has one.
    pub(crate) fn queue(
        &self,
        offload: PreparedOffload,
        version: u64,
        resident: Option<(&[u8], &RegisteredMemory)>,
        src: &Src<'_>,
    ) {
        let resident = resident.map(|(bytes, segment)| {
            // SAFETY: a range of our own segment (checked by the executor's `local_replica`),
            // mapped while the segment's memory (kept by the clone) lives.
            unsafe { ResidentValue::new(Box::new(segment.clone()), bytes.as_ptr() as u64, bytes.len()) }
        });
        let mut scratch = Vec::new();
        let bytes: &[u8] = match resident {
            Some(_) => &[],
            None => match src.gathered(&mut scratch) {
                Ok(bytes) => bytes,
                Err(e) => {
                    tracing::warn!("not offloading a value to disk: {e}");
                    return;
                }
            },
        };
        offload.queue_resident(version, resident, bytes);
    }

    /// Mooncake's `unmount_local_disk_segment`: unmounts the disk at the master (objects whose
    /// only copy was a file of it are gone, the others lose that copy), keeps it from being
    /// mounted again, and waits `grace` (reads of its files granted before may finish). Once
    /// drained, a second call does nothing.
    pub(crate) fn drain(&self, grace: Duration) -> Result<()> {
        if self.drained.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let req = UnmountSegmentRequest {
            client_id: self.client_id.clone(),
            segment_id: self.mount.segment_id.load(Ordering::Acquire),
        };
        let reply = self.rpc.call(|mut c| async move { c.unmount_segment(req).await });
        if let Err(e) = reply.and_then(|r| check(r.status, "")) {
            self.drained.store(false, Ordering::Release);
            return Err(e);
        }
        // The master keeps no link for it any more: its owner stream ends.
        self.stop.store(true, Ordering::Release);
        tracing::info!("disk segment {} unmounted (drained); waiting {grace:?}", self.segment_name);
        std::thread::sleep(grace);
        Ok(())
    }

    /// Flushes the writers and unmounts the disk (its copies are no longer served).
    pub(crate) fn close(&self) -> Result<()> {
        self.stop.store(true, Ordering::Release);
        if !self.tier.flush(CLOSE_FLUSH_TIMEOUT) {
            tracing::warn!("closing: offloads still queued after {CLOSE_FLUSH_TIMEOUT:?}");
        }
        self.tier.shutdown();
        if self.drained.load(Ordering::Acquire) {
            return Ok(());
        }
        let req = UnmountSegmentRequest {
            client_id: self.client_id.clone(),
            segment_id: self.mount.segment_id.load(Ordering::Acquire),
        };
        let reply = self.rpc.call(|mut c| async move { c.unmount_segment(req).await })?;
        check(reply.status, "")
    }
}
