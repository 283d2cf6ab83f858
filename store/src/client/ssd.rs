//! The store client's hooks into its disk tier ([`super::disk`]): start-up (mount the disk at
//! the master, re-announce the files), offload after a committed put, reads of disk copies
//! (local file, or another client's file through its disk service), removals handed out on
//! pings.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crescent_engine::{Opcode, TransferRequest};

use super::disk::file::ResidentValue;
use super::disk::service::{DiskReader, DiskService};
use super::disk::{Announcer, DiskStats, DiskTier, PreparedOffload};
use super::lease::{LeaseClock, Listed};
use super::rpc::{check, MasterRpc};
use super::{readable_in_memory, Buf, StoreClient};
use crate::error::{Result, StoreError};
use crate::master::disk_segment_name;
use crate::proto::*;

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
            // The whole request failed (e.g. the disk is not mounted right now).
            check(reply.statuses.into_iter().next(), "")?;
            return Err(StoreError::Internal("master answered a different number of statuses".into()));
        }
        Ok(reply.statuses.into_iter().map(|s| check(Some(s), "").is_ok()).collect())
    }
}

/// The disk tier's parts inside a client.
pub(super) struct Ssd {
    pub tier: Arc<DiskTier>,
    pub service: DiskService,
    pub segment_id: Arc<AtomicU64>,
}

impl StoreClient {
    /// Mounts the disk at the master, re-announces its files, starts its writers and the
    /// check of the files found at start.
    pub(super) fn start_disk(&self) -> Result<()> {
        let Some(ssd) = &self.ssd else { return Ok(()) };
        self.mount_disk(ssd)?;
        ssd.tier.start(Arc::new(MasterAnnouncer {
            rpc: self.rpc.clone(),
            client_id: self.id.clone(),
            segment_id: ssd.segment_id.clone(),
        }));
        ssd.tier.restore_all()?;
        ssd.tier.verify_found();
        Ok(())
    }

    fn mount_disk(&self, ssd: &Ssd) -> Result<()> {
        let req = MountDiskRequest {
            client_id: self.id.clone(),
            disk_id: ssd.tier.disk_id().to_string(),
            disk_service: ssd.service.address(),
            capacity: ssd.tier.capacity(),
            host: self.engine.segment_name().rsplit_once(':').map(|(h, _)| h.to_string()).unwrap_or_default(),
            held_removals: ssd.tier.held_removals(),
        };
        let reply = self.rpc.call(|mut c| async move { c.mount_disk(req).await })?;
        check(reply.status, "")?;
        ssd.segment_id.store(reply.segment_id, Ordering::Release);
        Ok(())
    }

    /// After the master dropped this client: mount the disk again and re-announce its files.
    pub(super) fn remount_disk(&self) {
        let Some(ssd) = &self.ssd else { return };
        if let Err(e) = self.mount_disk(ssd).and_then(|()| ssd.tier.restore_all()) {
            tracing::warn!("remounting the disk tier: {e}");
        }
    }

    /// What a ping brought for the disk tier: removals to make, objects whose only copies
    /// are now files, and (when it changed) the set of removals to keep for the master.
    pub(super) fn apply_disk_ping(&self, reply: PingReply) {
        if let Some(ssd) = &self.ssd {
            ssd.tier.apply_removals(&reply.disk_removals);
            for e in &reply.disk_only {
                ssd.tier.note_only_copy(&e.key, e.version, true);
            }
            if reply.held_generation > 0 {
                ssd.tier.keep_held_removals(reply.held_removals);
            }
        }
    }

    /// After a removal: delete our own copies now rather than at the next heartbeat.
    pub(super) fn sync_disk_removals(&self) {
        if self.ssd.is_none() {
            return;
        }
        let req = PingRequest { client_id: self.id.clone(), disk: self.disk_counters() };
        match self.rpc.call(|mut c| async move { c.ping(req).await }) {
            Ok(reply) if check(reply.status.clone(), "").is_ok() => self.apply_disk_ping(reply),
            _ => {} // the heartbeat brings them later
        }
    }

    /// The value's file image (or, with `in_place`, only its CRC-32), made before its put
    /// commits (see [`DiskTier::prepare`]): queued once the put committed
    /// ([`Self::queue_offload`]), it never makes the put wait for the disk. None without a
    /// disk tier.
    pub(super) fn prepare_offload(
        &self,
        key: &str,
        src: &Buf<'_>,
        len: u64,
        in_place: bool,
    ) -> Option<PreparedOffload> {
        let ssd = self.ssd.as_ref()?;
        let bytes = put_bytes(src, len);
        Some(if in_place { ssd.tier.prepare_resident(key, bytes) } else { ssd.tier.prepare(key, bytes) })
    }

    /// Hands a committed put's offload to the writers, who read the value from the put's
    /// replica in our own segment when it has one.
    pub(super) fn queue_offload(
        &self,
        offload: PreparedOffload,
        version: u64,
        replicas: &[ReplicaDescriptor],
        src: &Buf<'_>,
        len: u64,
    ) {
        let resident = replicas.iter().find_map(|r| self.local_replica(r, len)).and_then(|bytes| {
            let segment = self.segment.clone()?;
            // SAFETY: a range of our own segment (checked by `local_replica`), mapped while
            // the segment's memory (kept by the clone) lives.
            Some(unsafe { ResidentValue::new(Box::new(segment), bytes.as_ptr() as u64, bytes.len()) })
        });
        offload.queue_resident(version, resident, put_bytes(src, len));
    }

    /// [`Self::queue_offload`] for each put of a batch that committed (the others' offloads
    /// are dropped).
    pub(super) fn queue_offloads(
        &self,
        results: &[Result<()>],
        offloads: Vec<Option<PreparedOffload>>,
        placed: &[(Vec<ReplicaDescriptor>, u64)],
        srcs: &[Buf<'_>],
        sizes: &[u64],
    ) {
        for (i, (r, offload)) in results.iter().zip(offloads).enumerate() {
            if let (Ok(()), Some(offload)) = (r, offload) {
                self.queue_offload(offload, placed[i].1, &placed[i].0, &srcs[i], sizes[i]);
            }
        }
    }

    /// Waits until every queued offload is on disk and known to the master (or the timeout
    /// passes; returns false then). Without a disk tier, true at once.
    pub fn flush_offload(&self, timeout: Duration) -> bool {
        self.ssd.as_ref().is_none_or(|s| s.tier.flush(timeout))
    }

    /// The disk tier's counters as the master's metrics show them (sent on pings).
    pub(super) fn disk_counters(&self) -> Option<DiskCounters> {
        let s = self.ssd.as_ref()?.tier.stats();
        Some(DiskCounters {
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
        })
    }

    /// The disk tier's counters, if this client has one.
    pub fn disk_stats(&self) -> Option<DiskStats> {
        self.ssd.as_ref().map(|s| s.tier.stats())
    }

    /// The disk tier's directory (`<root>/<cluster id>`), if any.
    pub fn disk_dir(&self) -> Option<&std::path::Path> {
        self.ssd.as_ref().map(|s| s.tier.dir())
    }

    /// Flushes the writers and unmounts the disk (its copies are no longer served).
    pub(super) fn close_disk(&self) -> Result<()> {
        let Some(ssd) = &self.ssd else { return Ok(()) };
        if !ssd.tier.flush(CLOSE_FLUSH_TIMEOUT) {
            tracing::warn!("closing: offloads still queued after {CLOSE_FLUSH_TIMEOUT:?}");
        }
        ssd.tier.shutdown();
        let req =
            UnmountSegmentRequest { client_id: self.id.clone(), segment_id: ssd.segment_id.load(Ordering::Acquire) };
        let reply = self.rpc.call(|mut c| async move { c.unmount_segment(req).await })?;
        check(reply.status, "")
    }

    /// Asks the master for `key`'s replicas. When this client's disk holds what was, the last
    /// time it looked, the object's only copy, the file is read into `dst(size)` while the
    /// master answers: the round trip is then hidden behind the read instead of before it.
    /// Returns the answer and whether `dst` holds the object it describes (the answer lists
    /// this disk's file of that very version; otherwise the get reads where the answer says).
    pub(super) fn replica_list_reading_disk<'d>(
        &self,
        key: &str,
        dst: impl FnOnce(u64) -> Option<&'d mut [u8]>,
    ) -> Result<(Listed, bool)> {
        let guess = self.ssd.as_ref().and_then(|s| Some((&s.tier, s.tier.only_copy(key)?)));
        let Some((tier, (version, size))) = guess else {
            return Ok((self.replica_list(key)?, false));
        };
        let Some(out) = dst(size) else {
            return Ok((self.replica_list(key)?, false));
        };
        let req = KeyRequest { client_id: self.id.clone(), key: key.to_string() };
        let clock = LeaseClock::start();
        let (reply, read) = self
            .rpc
            .call_beside(|mut c| async move { c.get_replica_list(req).await }, || tier.read_local(key, version, out));
        let list = reply.and_then(|mut list| check(list.status.take(), key).map(|()| list));
        let ours = disk_segment_name(tier.disk_id());
        let confirmed = match (&list, &read) {
            (Ok(l), Ok(())) => {
                l.version == version
                    && l.size == size
                    && l.replicas.iter().any(|r| {
                        r.tier == Tier::Ssd as i32
                            && r.status == ReplicaStatus::Complete as i32
                            && r.segment_name == ours
                    })
            }
            _ => false,
        };
        tier.early_read_judged(key, version, confirmed);
        let list = list?;
        if confirmed && list.replicas.iter().any(readable_in_memory) {
            // Back in memory meanwhile: later gets read it from there.
            tier.note_only_copy(key, version, false);
        }
        Ok((Listed { reply: list, clock }, confirmed))
    }

    /// Reads a disk copy: ours first, then the others'. `None` when the object has none.
    pub(super) fn read_disk_copies(
        &self,
        key: &str,
        list: &GetReplicaListReply,
        dst: &mut Buf<'_>,
    ) -> Option<Result<()>> {
        let ours = self.ssd.as_ref().map(|s| disk_segment_name(s.tier.disk_id()));
        let mut disks: Vec<&ReplicaDescriptor> = list
            .replicas
            .iter()
            .filter(|r| r.tier == Tier::Ssd as i32 && r.status == ReplicaStatus::Complete as i32)
            .collect();
        if disks.is_empty() {
            return None;
        }
        disks.sort_by_key(|r| Some(&r.segment_name) != ours.as_ref());
        let mut last_err = None;
        for r in disks {
            let read = if Some(&r.segment_name) == ours.as_ref() {
                let read = self.read_own_disk(key, list, dst);
                if read.is_ok() {
                    // The next get of it reads the file while it asks the master.
                    self.ssd.as_ref().expect("ours").tier.note_only_copy(key, list.version, true);
                }
                read
            } else {
                self.read_remote_disk(key, r, list.version, list.size, dst)
            };
            match read {
                Ok(()) => return Some(Ok(())),
                Err(e) => {
                    tracing::debug!("reading the disk copy of {key:?} on {}: {e}", r.segment_name);
                    last_err = Some(e);
                }
            }
        }
        last_err.map(Err)
    }

    fn read_own_disk(&self, key: &str, list: &GetReplicaListReply, dst: &mut Buf<'_>) -> Result<()> {
        let tier = &self.ssd.as_ref().expect("checked by the caller").tier;
        let size = list.size as usize;
        match dst {
            Buf::BytesMut(out) => tier.read_local(key, list.version, &mut out[..size]),
            Buf::Registered(addr) => {
                // SAFETY: the caller registered [addr, +len >= size) for this call.
                let out = unsafe { std::slice::from_raw_parts_mut(*addr as *mut u8, size) };
                tier.read_local(key, list.version, out)
            }
            Buf::Bytes(_) => unreachable!("gets write to the caller"),
        }
    }

    /// Reads another client's file through its disk service: it stages pieces in its
    /// registered memory and we read them with the engine.
    fn read_remote_disk(
        &self,
        key: &str,
        r: &ReplicaDescriptor,
        version: u64,
        size: u64,
        dst: &mut Buf<'_>,
    ) -> Result<()> {
        let (mut reader, segment) = DiskReader::open(&r.disk_service, key, version, size)?;
        let seg = self
            .engine
            .open_segment(&segment)
            .map_err(|e| StoreError::PeerGone { key: key.to_string(), reason: e.to_string() })?;
        let mut off = 0u64;
        let mut confirmed = false;
        while off < size {
            let read = |to: u64, at: u64, n: u64| TransferRequest {
                opcode: Opcode::Read,
                source: to,
                target: seg,
                target_offset: at,
                length: n,
            };
            let piece = match dst {
                Buf::Registered(addr) => {
                    let p = reader.next(size - off)?;
                    self.transfer(key, std::iter::once(read(*addr + off, p.addr, p.len)))?;
                    p
                }
                Buf::BytesMut(out) => {
                    let mut block = self.staging.acquire(size - off);
                    let p = reader.next(block.len())?;
                    self.transfer(key, std::iter::once(read(block.addr(), p.addr, p.len)))?;
                    out[off as usize..(off + p.len) as usize].copy_from_slice(&block.bytes()[..p.len as usize]);
                    p
                }
                Buf::Bytes(_) => unreachable!("gets write to the caller"),
            };
            off += piece.len;
            confirmed = piece.last;
            if piece.last != (off == size) {
                return Err(StoreError::Disk(format!("the owner of {key:?} ended its pieces at {off} of {size}")));
            }
        }
        if !confirmed {
            return Err(StoreError::Disk(format!("the owner of {key:?} did not confirm the checksum")));
        }
        Ok(())
    }
}

/// Opens the disk tier of `config` (before anything else: an invalid root fails the start).
pub(super) fn open_tier(config: &super::ClientConfig) -> Result<Option<Arc<DiskTier>>> {
    config.disk_config()?.map(DiskTier::open).transpose()
}

/// A put's bytes.
fn put_bytes<'a>(src: &'a Buf<'_>, len: u64) -> &'a [u8] {
    match src {
        Buf::Bytes(b) => &b[..len as usize],
        // SAFETY: the caller registered [addr, +len) and keeps it valid during the put.
        Buf::Registered(addr) => unsafe { std::slice::from_raw_parts(*addr as *const u8, len as usize) },
        Buf::BytesMut(_) => unreachable!("puts read from the caller"),
    }
}
