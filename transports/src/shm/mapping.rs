//! A peer's memfd mapped into this process.

use std::os::fd::OwnedFd;
use std::ptr::NonNull;

use rustix::fs::{fcntl_get_seals, fstat, SealFlags};
use rustix::mm::{madvise, mmap, munmap, Advice, MapFlags, ProtFlags};

/// `len` bytes of a peer's shareable memory, mapped `MAP_SHARED`. Unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory owned by this value; who may touch which bytes
// when is decided by the grant that holds it (see the module documentation of `shm`).
unsafe impl Send for Mapping {}
// SAFETY: as for `Send`: `&Mapping` only hands out the address.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `fd`, a descriptor received from a peer (untrusted): it must be a
    /// memfd sealed against shrinking, at least `len` bytes long, so that no access to the
    /// mapping can ever fault (SIGBUS) whatever the peer does later.
    pub fn map(fd: OwnedFd, len: u64) -> Result<Mapping, String> {
        let seals = fcntl_get_seals(&fd).map_err(|e| format!("the peer's memory is not a sealable memfd: {e}"))?;
        if !seals.contains(SealFlags::SHRINK) {
            return Err("the peer's memfd is not sealed against shrinking".into());
        }
        let size = fstat(&fd).map_err(|e| format!("cannot stat the peer's memfd: {e}"))?.st_size;
        if u64::try_from(size).map_or(true, |size| size < len) {
            return Err(format!("the peer's memfd holds {size} bytes, fewer than the {len} granted"));
        }
        let len = usize::try_from(len).map_err(|_| format!("{len} bytes cannot be mapped"))?;
        // SAFETY: a new shared mapping of a file we checked to be large enough and unable to
        // shrink; it does not touch any existing memory of this process.
        let ptr =
            unsafe { mmap(std::ptr::null_mut(), len, ProtFlags::READ | ProtFlags::WRITE, MapFlags::SHARED, &fd, 0) }
                .map_err(|e| format!("cannot map the peer's memfd ({len} bytes): {e}"))?;
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or("mmap returned null")?;
        Ok(Mapping { ptr, len })
    }

    /// Faults `[offset, +len)` of the mapping in (page tables only: the pages exist in the
    /// peer's memfd), so that copies do not pay page faults. False when the kernel cannot
    /// (before Linux 5.14): faults then happen on first use, which is only slower.
    pub fn prefault(&self, offset: u64, len: u64) -> bool {
        let Some(at) = self.at(offset, len) else {
            return false;
        };
        // SAFETY: the range lies in this mapping (checked by `at`); populating page tables
        // does not change its contents.
        unsafe { madvise(at.cast(), len as usize, Advice::LinuxPopulateWrite) }.is_ok()
    }

    /// Address in this process of byte `offset` of the mapping, if `[offset, +len)` lies in it.
    pub fn at(&self, offset: u64, len: u64) -> Option<*mut u8> {
        let end = offset.checked_add(len)?;
        (end <= self.len as u64).then(|| {
            // SAFETY: `offset` is within the mapping (checked above).
            unsafe { self.ptr.as_ptr().add(offset as usize) }
        })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping created in `map`; its grant has been revoked (or the
        // peer is gone), so no copy uses it any more.
        if let Err(e) = unsafe { munmap(self.ptr.as_ptr().cast(), self.len) } {
            tracing::warn!("shm transport: munmap of a peer's {} bytes failed: {e}", self.len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SharedMemory;
    use rustix::fs::{memfd_create, MemfdFlags};

    #[test]
    fn maps_the_same_pages() {
        let mem = SharedMemory::allocate(8192, "crescent-test").unwrap();
        let fd = mem.fd().try_clone_to_owned().unwrap();
        let map = Mapping::map(fd, 8192).unwrap();
        let p = map.at(100, 1).unwrap();
        // SAFETY: test-only access to memory both values own.
        unsafe {
            *p = 42;
            assert_eq!(*(mem.addr() as *const u8).add(100), 42);
        }
        assert!(map.prefault(0, 8192));
        assert!(!map.prefault(4096, 8192));
        assert!(map.at(8191, 1).is_some());
        assert!(map.at(8191, 2).is_none());
        assert!(map.at(u64::MAX, 2).is_none());
    }

    #[test]
    fn unsealed_short_or_foreign_descriptors_are_refused() {
        let unsealed = memfd_create("crescent-test", MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&unsealed, 4096).unwrap();
        assert!(Mapping::map(unsealed, 4096).unwrap_err().contains("seal"));
        let mem = SharedMemory::allocate(4096, "crescent-test").unwrap();
        let fd = mem.fd().try_clone_to_owned().unwrap();
        assert!(Mapping::map(fd, 8192).unwrap_err().contains("fewer"));
        let file = std::fs::File::open("/proc/self/stat").unwrap();
        assert!(Mapping::map(file.into(), 1).is_err());
    }
}
