//! Host memory whose pages exist once, in one process of a group (the owner), and that every
//! process of the group maps: what Mooncake's `SharedSegment` (`mooncake.engine`) offers, for
//! KV data written once and read by every rank of a tensor-parallel group.
//!
//! Creation has two phases, because the group's only communicator is usually the framework's
//! (a torch process group):
//!
//! 1. [`SharedSegment::create`] on every rank: the owner creates POSIX shared memory
//!    (`shm_open` + `mmap`), the others reserve an address window of the same size. Each
//!    returns a fixed-size blob ([`BLOB_LEN`] bytes) for the caller to all-gather.
//! 2. [`SharedSegment::complete`] with every rank's blob, indexed by rank: checks that all
//!    ranks declared the same segment (name, size, group, owner, options: a fingerprint), then
//!    maps the owner's pages into a non-owner's window.
//!
//! Addresses differ between ranks; the layout inside the segment is the caller's. The owner
//! must outlive the others: its drop unlinks the shared memory. The segment's memory is
//! ordinary host memory once complete: it registers with an engine like any other.
//!
//! Only the POSIX shared-memory path exists: the platform VMM path (`mmap = false`) and the
//! registration of the pages with an Ascend device (`host_register`) are hardware Crescent
//! does not drive; [`SharedSegment::supported`] says so and `create` refuses them.

use std::hash::{BuildHasher, Hasher};
use std::os::fd::OwnedFd;

use crescent_transports::TransportError;
use rustix::fs::Mode;
use rustix::mm::{MapFlags, ProtFlags};

use crate::error::{EngineError, Result};

/// Bytes of every rank's blob.
pub const BLOB_LEN: usize = 160;
/// The largest segment, in bytes.
pub const MAX_SEGMENT: u64 = 1 << 46;
const MAGIC: &[u8; 4] = b"CRSS";
const VERSION: u16 = 1;
/// The backend of a blob: POSIX shared memory.
const BACKEND_SHM: u16 = 1;
const HEADER_LEN: usize = 32;
const MAX_HANDLE: usize = BLOB_LEN - HEADER_LEN;

/// What every rank declares about a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentOptions {
    /// Ranks of the group.
    pub world_size: u32,
    /// This process's rank.
    pub rank_id: u32,
    /// The rank whose process holds the pages.
    pub owner_rank: u32,
    /// The accelerator granted access to the pages (used only by hardware paths).
    pub device_id: i32,
    /// POSIX shared memory (true); false asks for the platform VMM path.
    pub mmap: bool,
    /// Register the pages with an Ascend device.
    pub host_register: bool,
}

/// One rank's share of a segment.
#[derive(Debug)]
pub struct SharedSegment {
    size: u64,
    options: SegmentOptions,
    fingerprint: u64,
    alloc_size: u64,
    /// The mapping (the owner's pages, or a non-owner's window), unmapped on drop.
    base: usize,
    /// The owner's shared-memory name, unlinked on drop.
    owned_name: Option<String>,
    ready: bool,
}

fn invalid(m: impl Into<String>) -> EngineError {
    EngineError::InvalidArgument(m.into())
}

fn memory(len: u64, source: std::io::Error) -> EngineError {
    EngineError::Transport(TransportError::Alloc { len, source })
}

/// FNV-1a over what the ranks must agree on.
fn fingerprint(name: &str, size: u64, o: &SegmentOptions) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            h = (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    eat(name.as_bytes());
    eat(&size.to_le_bytes());
    eat(&o.world_size.to_le_bytes());
    eat(&o.owner_rank.to_le_bytes());
    eat(&[u8::from(o.mmap), u8::from(o.host_register)]);
    h
}

fn page_size() -> u64 {
    rustix::param::page_size() as u64
}

/// A fresh shared-memory name: the pid tells owners on one host apart, the random part covers
/// a pid reused after a crash left a name behind.
fn shm_name() -> String {
    let random = std::collections::hash_map::RandomState::new().build_hasher().finish();
    format!("/crescent_ss_{}_{random:016x}", std::process::id())
}

struct Blob {
    rank: u32,
    backend: u16,
    fingerprint: u64,
    alloc_size: u64,
    handle: Vec<u8>,
}

impl Blob {
    fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; BLOB_LEN];
        b[0..4].copy_from_slice(MAGIC);
        b[4..6].copy_from_slice(&VERSION.to_le_bytes());
        b[6..8].copy_from_slice(&self.backend.to_le_bytes());
        b[8..12].copy_from_slice(&self.rank.to_le_bytes());
        b[12..16].copy_from_slice(&(self.handle.len() as u32).to_le_bytes());
        b[16..24].copy_from_slice(&self.fingerprint.to_le_bytes());
        b[24..32].copy_from_slice(&self.alloc_size.to_le_bytes());
        b[HEADER_LEN..HEADER_LEN + self.handle.len()].copy_from_slice(&self.handle);
        b
    }

    fn decode(b: &[u8]) -> Result<Blob> {
        if b.len() != BLOB_LEN {
            return Err(invalid(format!("a shared segment blob of {} bytes ({BLOB_LEN} expected)", b.len())));
        }
        if &b[0..4] != MAGIC {
            return Err(invalid("a shared segment blob without its magic (not from SharedSegment.create)"));
        }
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        if u16_at(4) != VERSION {
            return Err(invalid(format!(
                "a shared segment blob of version {} (this build: {VERSION}): the ranks run different builds",
                u16_at(4)
            )));
        }
        let handle_len = u32_at(12) as usize;
        if handle_len > MAX_HANDLE {
            return Err(invalid(format!("a shared segment blob announces a handle of {handle_len} bytes")));
        }
        Ok(Blob {
            rank: u32_at(8),
            backend: u16_at(6),
            fingerprint: u64_at(16),
            alloc_size: u64_at(24),
            handle: b[HEADER_LEN..HEADER_LEN + handle_len].to_vec(),
        })
    }
}

impl SharedSegment {
    /// Whether this build can share memory this way: POSIX shared memory yes; the VMM path
    /// and Ascend registration no.
    pub fn supported(mmap: bool, host_register: bool) -> bool {
        mmap && !host_register
    }

    /// Phase one (see the module): the owner creates and maps the shared memory, another rank
    /// reserves its window; returns this rank's segment and its blob.
    pub fn create(name: &str, size: u64, options: SegmentOptions) -> Result<(SharedSegment, Vec<u8>)> {
        let o = &options;
        if o.world_size == 0 {
            return Err(invalid("a shared segment's world_size must not be zero"));
        }
        if o.rank_id >= o.world_size || o.owner_rank >= o.world_size {
            return Err(invalid(format!(
                "a shared segment's rank_id ({}) and owner_rank ({}) must be below world_size ({})",
                o.rank_id, o.owner_rank, o.world_size
            )));
        }
        if o.host_register && !o.mmap {
            return Err(invalid("a shared segment's host_register needs mmap=True"));
        }
        if size == 0 || size > MAX_SEGMENT {
            return Err(invalid(format!("a shared segment's size must be in (0, {MAX_SEGMENT}], not {size}")));
        }
        if !o.mmap {
            return Err(EngineError::Unsupported("the platform VMM path of shared segments (mmap=False)".into()));
        }
        let owner = o.rank_id == o.owner_rank;
        if owner && o.host_register {
            return Err(EngineError::Unsupported("registering a shared segment's pages with an Ascend device".into()));
        }
        let page = page_size();
        let alloc_size = size.div_ceil(page) * page;
        let len = usize::try_from(alloc_size).map_err(|_| invalid("a shared segment larger than the address space"))?;
        let mut segment = SharedSegment {
            size,
            options,
            fingerprint: fingerprint(name, size, o),
            alloc_size,
            base: 0,
            owned_name: None,
            ready: false,
        };
        let handle = if owner {
            let (shm, fd) = create_shm(alloc_size)?;
            // From here on, drop unlinks it.
            segment.owned_name = Some(shm.clone());
            // SAFETY: a fresh mapping of the whole shared-memory object just sized to `len`;
            // nothing else in the process refers to that range. Unmapped in Drop.
            let addr = unsafe {
                rustix::mm::mmap(
                    std::ptr::null_mut(),
                    len,
                    ProtFlags::READ | ProtFlags::WRITE,
                    MapFlags::SHARED,
                    &fd,
                    0,
                )
            }
            .map_err(|e| memory(alloc_size, e.into()))?;
            segment.base = addr as usize;
            shm.into_bytes()
        } else {
            // SAFETY: a fresh anonymous reservation (no access) at an address the kernel picks;
            // `complete` maps the owner's pages over exactly this range; unmapped in Drop.
            let addr =
                unsafe { rustix::mm::mmap_anonymous(std::ptr::null_mut(), len, ProtFlags::empty(), MapFlags::PRIVATE) }
                    .map_err(|e| memory(alloc_size, e.into()))?;
            segment.base = addr as usize;
            Vec::new()
        };
        let blob = Blob { rank: o.rank_id, backend: BACKEND_SHM, fingerprint: segment.fingerprint, alloc_size, handle };
        tracing::info!(
            "shared segment {}: rank {} of {}, {alloc_size} bytes at {:#x}",
            name.split('|').next().unwrap_or(name),
            o.rank_id,
            o.world_size,
            segment.base
        );
        Ok((segment, blob.encode()))
    }

    /// Phase two: `blobs` are every rank's, indexed by rank. Checks that all ranks declared
    /// the same segment, then (on a non-owner) maps the owner's pages. Once only.
    pub fn complete<B: AsRef<[u8]>>(&mut self, blobs: &[B]) -> Result<()> {
        if self.ready {
            return Err(invalid("SharedSegment.complete was called already"));
        }
        if blobs.len() != self.options.world_size as usize {
            return Err(invalid(format!(
                "a shared segment of {} ranks needs one blob per rank, not {}",
                self.options.world_size,
                blobs.len()
            )));
        }
        let mut owner_handle = Vec::new();
        for (rank, b) in blobs.iter().enumerate() {
            let blob = Blob::decode(b.as_ref())?;
            if blob.rank as usize != rank {
                return Err(invalid(format!("the blob at index {rank} is rank {}'s", blob.rank)));
            }
            if blob.backend != BACKEND_SHM {
                return Err(invalid(format!("rank {rank} uses another shared segment backend")));
            }
            if blob.fingerprint != self.fingerprint {
                return Err(invalid(format!(
                    "rank {rank} declared another shared segment than this rank (name, size, world_size, \
                     owner_rank or options differ)"
                )));
            }
            if blob.alloc_size != self.alloc_size {
                return Err(invalid(format!("rank {rank} allocates another size than this rank")));
            }
            if rank == self.options.owner_rank as usize {
                owner_handle = blob.handle;
            }
        }
        if owner_handle.is_empty() {
            return Err(invalid("the owner rank's blob carries no shared memory name"));
        }
        if self.options.rank_id != self.options.owner_rank {
            if self.options.host_register {
                return Err(EngineError::Unsupported(
                    "registering a shared segment's pages with an Ascend device".into(),
                ));
            }
            self.map_owner(&owner_handle)?;
        }
        self.ready = true;
        Ok(())
    }

    fn map_owner(&mut self, handle: &[u8]) -> Result<()> {
        let name = std::str::from_utf8(handle).map_err(|_| invalid("the owner's shared memory name is not UTF-8"))?;
        if !name.starts_with('/') || name[1..].contains('/') {
            return Err(invalid(format!("the owner's handle {name:?} is not a POSIX shared memory name")));
        }
        let fd = rustix::shm::open(name, rustix::shm::OFlags::RDWR, Mode::empty())
            .map_err(|e| memory(self.alloc_size, std::io::Error::from(e)))?;
        let st = rustix::fs::fstat(&fd).map_err(|e| memory(self.alloc_size, e.into()))?;
        if (st.st_size as u64) < self.alloc_size {
            return Err(invalid(format!(
                "the owner's shared memory {name} holds {} bytes, less than the segment's {}",
                st.st_size, self.alloc_size
            )));
        }
        // SAFETY: maps over this segment's own reservation (made in `create`, `alloc_size`
        // bytes at `base`, nothing else uses it): MAP_FIXED replaces exactly that range, and the
        // object is at least that long (checked above), so no access can fault past its end.
        unsafe {
            rustix::mm::mmap(
                self.base as *mut std::ffi::c_void,
                self.alloc_size as usize,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED | MapFlags::FIXED,
                &fd,
                0,
            )
        }
        .map_err(|e| memory(self.alloc_size, e.into()))?;
        Ok(())
    }

    /// True once `complete` succeeded.
    pub fn ready(&self) -> bool {
        self.ready
    }

    /// This rank's address of the segment's first byte.
    pub fn base_addr(&self) -> u64 {
        self.base as u64
    }

    /// The accelerator's address of the pages when they were mapped for it separately: 0 here
    /// (no device registration in this build).
    pub fn device_addr(&self) -> u64 {
        0
    }

    /// The size asked for, in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }
}

fn create_shm(alloc_size: u64) -> Result<(String, OwnedFd)> {
    let flags = rustix::shm::OFlags::CREATE | rustix::shm::OFlags::EXCL | rustix::shm::OFlags::RDWR;
    let mut last = None;
    for _ in 0..4 {
        let name = shm_name();
        match rustix::shm::open(name.as_str(), flags, Mode::RUSR | Mode::WUSR) {
            Ok(fd) => {
                if let Err(e) = rustix::fs::ftruncate(&fd, alloc_size) {
                    let _ = rustix::shm::unlink(name.as_str());
                    return Err(memory(alloc_size, e.into()));
                }
                return Ok((name, fd));
            }
            Err(rustix::io::Errno::EXIST) => last = Some(rustix::io::Errno::EXIST),
            Err(e) => return Err(memory(alloc_size, e.into())),
        }
    }
    Err(memory(alloc_size, last.unwrap_or(rustix::io::Errno::EXIST).into()))
}

impl Drop for SharedSegment {
    fn drop(&mut self) {
        if self.base != 0 {
            // SAFETY: the mapping or reservation made in `create` (and perhaps replaced in
            // `complete`), `alloc_size` bytes at `base`, owned by this segment alone. Memory a
            // caller still uses after dropping the segment is the caller's bug, as with any
            // freed allocation.
            let _ = unsafe { rustix::mm::munmap(self.base as *mut std::ffi::c_void, self.alloc_size as usize) };
        }
        if let Some(name) = &self.owned_name {
            let _ = rustix::shm::unlink(name.as_str());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(world_size: u32, rank_id: u32) -> SegmentOptions {
        SegmentOptions { world_size, rank_id, owner_rank: 0, device_id: 0, mmap: true, host_register: false }
    }

    #[test]
    fn a_peer_sees_the_owners_writes_and_the_owner_the_peers() {
        let (mut owner, b0) = SharedSegment::create("kv", 5000, opts(2, 0)).unwrap();
        let (mut peer, b1) = SharedSegment::create("kv", 5000, opts(2, 1)).unwrap();
        assert_eq!((b0.len(), b1.len()), (BLOB_LEN, BLOB_LEN));
        let blobs = [b0, b1];
        owner.complete(&blobs).unwrap();
        peer.complete(&blobs).unwrap();
        assert!(owner.ready() && peer.ready());
        assert_eq!((owner.size(), peer.size()), (5000, 5000));
        // SAFETY: both are complete mappings of the same 5000+ bytes.
        unsafe {
            std::ptr::write_bytes(owner.base_addr() as *mut u8, 7, 5000);
            assert_eq!(*(peer.base_addr() as *const u8).add(4999), 7);
            *(peer.base_addr() as *mut u8) = 9;
            assert_eq!(*(owner.base_addr() as *const u8), 9);
        }
        assert!(matches!(peer.complete(&blobs), Err(EngineError::InvalidArgument(_))));
    }

    #[test]
    fn ranks_that_declared_different_segments_are_refused() {
        let (_owner, b0) = SharedSegment::create("kv", 4096, opts(2, 0)).unwrap();
        let (mut other, b1) = SharedSegment::create("other", 4096, opts(2, 1)).unwrap();
        let e = other.complete(&[b0.clone(), b1.clone()]).unwrap_err();
        assert!(e.to_string().contains("rank 0 declared another shared segment"), "{e}");
        assert!(other.complete(std::slice::from_ref(&b0)).is_err());
        assert!(other.complete(&[b1.clone(), b1.clone()]).is_err());
        let mut short = b0.clone();
        short.pop();
        assert!(other.complete(&[short, b1.clone()]).is_err());
        let mut oversized_handle = b0;
        oversized_handle[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(other.complete(&[oversized_handle, b1]).is_err());
        assert!(!other.ready());
    }

    #[test]
    fn bad_declarations_and_hardware_paths_are_refused() {
        assert!(SharedSegment::supported(true, false));
        assert!(!SharedSegment::supported(false, false) && !SharedSegment::supported(true, true));
        assert!(matches!(SharedSegment::create("x", 4096, opts(0, 0)), Err(EngineError::InvalidArgument(_))));
        assert!(matches!(SharedSegment::create("x", 4096, opts(2, 2)), Err(EngineError::InvalidArgument(_))));
        assert!(matches!(SharedSegment::create("x", 0, opts(1, 0)), Err(EngineError::InvalidArgument(_))));
        let vmm = SegmentOptions { mmap: false, ..opts(1, 0) };
        assert!(matches!(SharedSegment::create("x", 4096, vmm), Err(EngineError::Unsupported(_))));
        let ascend = SegmentOptions { host_register: true, ..opts(1, 0) };
        assert!(matches!(SharedSegment::create("x", 4096, ascend), Err(EngineError::Unsupported(_))));
    }

    #[test]
    fn the_owner_unlinks_its_memory_when_dropped() {
        let (owner, b0) = SharedSegment::create("kv", 4096, opts(2, 0)).unwrap();
        let (mut peer, b1) = SharedSegment::create("kv", 4096, opts(2, 1)).unwrap();
        drop(owner);
        let e = peer.complete(&[b0, b1]).unwrap_err();
        assert!(matches!(e, EngineError::Transport(TransportError::Alloc { .. })), "{e}");
    }
}
