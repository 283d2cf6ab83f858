//! Segments a client mounts and unmounts while it runs, beside the one it contributes at
//! start (Mooncake's `mount_segment`, `allocate_and_mount_segment`, `unmount_segment`,
//! `unmount_and_free_segment`).
//!
//! Each is memory registered with the client's one engine, mounted at the master under the
//! name `host:port#<uuid>` (the uuid is the segment id the caller holds; readers open
//! `host:port`, see [`crate::protocol::engine_segment`]), with an owner index and owner stream
//! of its own, like the first segment: a new master is told what each holds, and a master
//! that dropped the client has each mounted afresh.
//!
//! An unmount drops the segment's replicas at the master at once (an object whose only replica
//! it held is gone). The master answers how long reads and puts it granted before may still
//! use the memory; the memory stays registered and unchanged that long (and for the caller's
//! grace period), then is unregistered and freed: a read never returns bytes that are not its
//! object's (it ends within its lease, or fails with the lease expired).

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crescent_engine::{RegisteredMemory, TransferEngine};
use rustix::mm::{MapFlags, ProtFlags};

use super::master_link::{MountKind, OwnMemory};
use super::owner_index::OwnerIndex;
use super::rpc::check;
use super::StoreClient;
use crate::error::{Result, StoreError};
use crate::proto::*;
use crate::protocol::EXTRA_SEGMENT_MARK;

/// Upstream rounds an allocated segment up to a multiple of its allocator's slab (4 MiB).
pub const SEGMENT_ALIGN: u64 = 4 << 20;

/// The memory of an extra segment.
enum Memory {
    /// Allocated and registered by the engine (`allocate_and_mount_segment`).
    Allocated { engine: Arc<TransferEngine>, mem: Option<RegisteredMemory> },
    /// A file's range mapped shared and registered (`mount_segment`).
    Mapped { engine: Arc<TransferEngine>, addr: u64, len: u64 },
}

impl Memory {
    fn addr(&self) -> u64 {
        match self {
            Memory::Allocated { mem, .. } => mem.as_ref().map_or(0, RegisteredMemory::addr),
            Memory::Mapped { addr, .. } => *addr,
        }
    }
    fn len(&self) -> u64 {
        match self {
            Memory::Allocated { mem, .. } => mem.as_ref().map_or(0, RegisteredMemory::len),
            Memory::Mapped { len, .. } => *len,
        }
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        match self {
            Memory::Allocated { engine, mem } => {
                if let Some(mem) = mem.take() {
                    if let Err(e) = engine.free_registered(mem) {
                        tracing::warn!("freeing an unmounted segment: {e}");
                    }
                }
            }
            Memory::Mapped { engine, addr, len } => {
                if let Err(e) = engine.unregister(*addr) {
                    tracing::warn!("unregistering an unmounted segment at {addr:#x}: {e}");
                }
                // SAFETY: our own mapping of `len` bytes at `addr` (`map_file`), unregistered
                // just above (the engine waits for the transfers using it), never used again.
                if let Err(e) = unsafe { rustix::mm::munmap(*addr as *mut std::ffi::c_void, *len as usize) } {
                    tracing::warn!("unmapping an unmounted segment at {addr:#x}: {e}");
                }
            }
        }
    }
}

/// One extra segment.
pub(super) struct Extra {
    /// The id the caller holds (a uuid).
    pub uuid: String,
    /// Its name at the master.
    name: String,
    /// Allocated by the client (`unmount_and_free_segment` frees it) or mounted from the
    /// caller's file (`unmount_segment`).
    allocated: bool,
    memory: Memory,
    pub index: Arc<OwnerIndex>,
    /// Its id at the current master (0: not mounted).
    segment_id: AtomicU64,
}

impl Extra {
    fn info(&self) -> SegmentInfo {
        SegmentInfo {
            name: self.name.clone(),
            base: self.memory.addr(),
            size: self.memory.len(),
            tier: Tier::Dram as i32,
        }
    }

    /// Its memory, as its owner reads it for a new master.
    fn memory(&self) -> OwnMemory {
        OwnMemory { addr: self.memory.addr(), len: self.memory.len() }
    }
}

/// The extra segments of a client, and those unmounted whose memory is still kept.
#[derive(Default)]
pub(super) struct Extras {
    mounted: parking_lot::Mutex<Vec<Arc<Extra>>>,
    /// Unmounted, kept until the instant.
    retired: parking_lot::Mutex<Vec<(Instant, Arc<Extra>)>>,
}

impl Extras {
    pub fn is_empty(&self) -> bool {
        self.mounted.lock().is_empty()
    }

    pub fn all(&self) -> Vec<Arc<Extra>> {
        self.mounted.lock().clone()
    }

    /// Frees the retired segments whose time came (at each heartbeat and unmount).
    pub fn sweep(&self, now: Instant) {
        let gone: Vec<_> = {
            let mut retired = self.retired.lock();
            let (gone, kept) = retired.drain(..).partition(|(until, _)| *until <= now);
            *retired = kept;
            gone
        };
        drop(gone); // unregisters and frees (outside the lock: the engine may wait)
    }
}

/// Maps `[offset, +size)` of the file at `path` shared, read-write; returns its address.
fn map_file(path: &Path, offset: u64, size: u64) -> Result<u64> {
    let bad = |why: String| StoreError::invalid(format!("mount_segment({}): {why}", path.display()));
    let fd = rustix::fs::open(path, rustix::fs::OFlags::RDWR | rustix::fs::OFlags::CLOEXEC, rustix::fs::Mode::empty())
        .map_err(|e| bad(format!("cannot open it: {e}")))?;
    let st = rustix::fs::fstat(&fd).map_err(|e| bad(format!("cannot stat it: {e}")))?;
    let file_len = u64::try_from(st.st_size).unwrap_or(0);
    if offset > file_len || size > file_len - offset {
        return Err(bad(format!("offset {offset} + size {size} is beyond its {file_len} bytes")));
    }
    let page = rustix::param::page_size() as u64;
    if !offset.is_multiple_of(page) {
        return Err(bad(format!("offset {offset} is not a multiple of the page size {page}")));
    }
    // SAFETY: a fresh shared mapping of an open file's range checked above; nothing else in
    // this process refers to the address it returns. The caller owns the file's bytes.
    let ptr = unsafe {
        rustix::mm::mmap(
            std::ptr::null_mut(),
            size as usize,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::SHARED,
            &fd,
            offset,
        )
    }
    .map_err(|e| bad(format!("mmap failed: {e}")))?;
    Ok(ptr as u64)
}

impl StoreClient {
    /// The full client's [`StoreApi::mount_segment`](super::StoreApi::mount_segment).
    pub(crate) fn mount_segment(&self, path: &Path, offset: u64, size: u64, location: &str) -> Result<Vec<String>> {
        if size == 0 {
            return Ok(Vec::new());
        }
        let addr = map_file(path, offset, size)?;
        let location = location_or_host(location);
        if let Err(e) = self.engine.register(addr, size, location) {
            // SAFETY: the mapping just made, registered with nothing.
            let _ = unsafe { rustix::mm::munmap(addr as *mut std::ffi::c_void, size as usize) };
            return Err(StoreError::invalid(format!("mount_segment({}): {e}", path.display())));
        }
        let memory = Memory::Mapped { engine: self.engine.clone(), addr, len: size };
        self.mount_extra(memory, false).map(|id| vec![id])
    }

    /// The full client's [`StoreApi::allocate_and_mount_segment`](super::StoreApi::allocate_and_mount_segment).
    pub(crate) fn allocate_and_mount_segment(&self, size: u64, location: &str) -> Result<(Vec<String>, u64)> {
        if size == 0 {
            return Err(StoreError::invalid("allocate_and_mount_segment: size is 0"));
        }
        let size = size
            .checked_next_multiple_of(SEGMENT_ALIGN)
            .ok_or_else(|| StoreError::invalid(format!("allocate_and_mount_segment: size {size} overflows")))?;
        let mem = self
            .engine
            .alloc_registered(size, location_or_host(location))
            .map_err(|e| StoreError::invalid(format!("allocate_and_mount_segment({size}): {e}")))?;
        let memory = Memory::Allocated { engine: self.engine.clone(), mem: Some(mem) };
        self.mount_extra(memory, true).map(|id| (vec![id], size))
    }

    fn mount_extra(&self, memory: Memory, allocated: bool) -> Result<String> {
        let uuid = uuid::Uuid::new_v4().to_string();
        let extra = Arc::new(Extra {
            name: format!("{}{EXTRA_SEGMENT_MARK}{uuid}", self.engine.segment_name()),
            uuid,
            allocated,
            memory,
            index: Arc::default(),
            segment_id: AtomicU64::new(0),
        });
        // Under the remount lock: a remount meanwhile either sees it listed or ran before.
        {
            let _one = self.remounting.lock();
            self.mount_extra_once(&extra, MountKind::First)?;
            self.extras.mounted.lock().push(extra.clone());
        }
        self.start_owner_stream_of(&extra.index);
        tracing::info!(
            "segment {} ({} bytes at {:#x}) mounted as {}",
            extra.name,
            extra.memory.len(),
            extra.memory.addr(),
            extra.segment_id.load(Ordering::Acquire)
        );
        Ok(extra.uuid.clone())
    }

    /// Mounts one extra segment at the master (`kind` as the first segment's mount).
    pub(super) fn mount_extra_once(&self, extra: &Extra, kind: MountKind) -> Result<()> {
        let id = self.mount_segment_info(kind, extra.info(), &extra.index, Some(extra.memory()))?;
        extra.segment_id.store(id, Ordering::Release);
        Ok(())
    }

    /// Mounts every extra segment again (after a remount of the first one).
    pub(super) fn remount_extras(&self, kind: MountKind) -> Result<()> {
        let mut first_error = Ok(());
        for extra in self.extras.all() {
            if let Err(e) = self.mount_extra_once(&extra, kind) {
                tracing::warn!("remounting segment {}: {e}", extra.name);
                if first_error.is_ok() {
                    first_error = Err(e);
                }
            }
        }
        first_error
    }

    /// The full client's [`StoreApi::unmount_segments`](super::StoreApi::unmount_segments).
    pub(crate) fn unmount_segments(&self, ids: &[String], free: bool, grace: Duration) -> Vec<Result<()>> {
        self.extras.sweep(Instant::now());
        ids.iter().map(|id| self.unmount_extra(id, free, grace)).collect()
    }

    fn unmount_extra(&self, id: &str, free: bool, grace: Duration) -> Result<()> {
        let what = if free { "unmount_and_free_segment" } else { "unmount_segment" };
        let _one = self.remounting.lock();
        let extra = {
            let mounted = self.extras.mounted.lock();
            let found = mounted.iter().find(|e| e.uuid == id).cloned();
            match found {
                Some(e) if e.allocated == free => e,
                Some(_) if free => {
                    return Err(StoreError::invalid(format!(
                        "{what}({id}): mounted by mount_segment; unmount it with unmount_segment"
                    )))
                }
                Some(_) => {
                    return Err(StoreError::invalid(format!(
                    "{what}({id}): allocated by allocate_and_mount_segment; unmount it with unmount_and_free_segment"
                )))
                }
                None => return Err(StoreError::invalid(format!("{what}({id}): not a segment this client mounted"))),
            }
        };
        let segment_id = extra.segment_id.load(Ordering::Acquire);
        let req = UnmountSegmentRequest { client_id: self.id.clone(), segment_id };
        let reply = self.rpc.call(|mut c| async move { c.unmount_segment(req).await })?;
        match check(reply.status, "") {
            // Already gone at the master (it dropped this client): nothing of it is listed.
            Ok(()) | Err(StoreError::SegmentNotFound(_)) => {}
            Err(e) => return Err(e),
        }
        extra.index.discard();
        extra.segment_id.store(0, Ordering::Release);
        self.extras.mounted.lock().retain(|e| e.uuid != id);
        let keep = Duration::from_millis(reply.busy_ms).max(grace);
        tracing::info!("segment {} unmounted; its memory is kept {keep:?} more", extra.name);
        self.extras.retired.lock().push((Instant::now() + keep, extra));
        Ok(())
    }

    /// Unmounts every extra segment at the master (at close).
    pub(super) fn unmount_all_extras(&self) -> Result<()> {
        let ids: Vec<_> = self.extras.all().iter().map(|e| (e.uuid.clone(), e.allocated)).collect();
        let mut first = Ok(());
        for (id, free) in ids {
            if let Err(e) = self.unmount_extra(&id, free, Duration::ZERO) {
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        first
    }

    /// The full client's [`StoreApi::unmount_local_disk_segment`](super::StoreApi::unmount_local_disk_segment).
    pub(crate) fn unmount_local_disk_segment(&self, grace: Duration) -> Result<()> {
        match &self.disk {
            Some(disk) => disk.drain(grace),
            None => {
                tracing::warn!("unmount_local_disk_segment: this client has no disk tier");
                Ok(())
            }
        }
    }
}

/// Mooncake's `location` "" is the host's memory.
fn location_or_host(location: &str) -> &str {
    if location.is_empty() {
        "cpu:0"
    } else {
        location
    }
}
