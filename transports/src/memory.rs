//! Shareable memory for `alloc_registered`: a memfd mapped `MAP_SHARED`, so that a
//! same-host peer can map the very same pages (by file descriptor) and copy with one memcpy.
//!
//! The memfd is sealed against shrinking and growing: a peer that holds it cannot truncate
//! it under this process (which would turn our own accesses into SIGBUS), and a peer that
//! receives it can check the seal before mapping it.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;

use rustix::fs::{fcntl_add_seals, ftruncate, memfd_create, MemfdFlags, SealFlags};
use rustix::mm::{mmap, munmap, MapFlags, ProtFlags};

use crate::TransportError;

const HUGE_PAGE: u64 = 2 << 20;

/// An anonymous, file-backed (memfd) mapping owned by this process.
#[derive(Debug)]
pub struct SharedMemory {
    ptr: NonNull<u8>,
    len: u64,
    fd: OwnedFd,
    huge_pages: bool,
    sealed: bool,
}

// SAFETY: the mapping is plain memory owned by this value; concurrent access to its bytes is
// coordinated by the region table (transfers), exactly as for any registered memory.
unsafe impl Send for SharedMemory {}
// SAFETY: see `Send`; `&SharedMemory` only hands out the address.
unsafe impl Sync for SharedMemory {}

impl SharedMemory {
    /// Allocates `len` bytes, trying 2 MiB huge pages first when `len` is a multiple of
    /// 2 MiB, and pre-faults the pages so that the first transfers do not pay for them.
    pub fn allocate(len: u64, name: &str) -> Result<Self, TransportError> {
        if len == 0 {
            return Err(TransportError::InvalidArgument("cannot allocate 0 bytes of registered memory".into()));
        }
        let alloc_err = |source: io::Error| TransportError::Alloc { len, source };
        if len.is_multiple_of(HUGE_PAGE) {
            if let Ok(mem) = Self::map(len, name, true) {
                return Ok(mem);
            }
        }
        Self::map(len, name, false).map_err(alloc_err)
    }

    fn map(len: u64, name: &str, huge_pages: bool) -> io::Result<Self> {
        let mut flags = MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING;
        if huge_pages {
            flags |= MemfdFlags::HUGETLB;
        }
        let fd = memfd_create(name, flags)?;
        ftruncate(&fd, len)?;
        // Kernels without seals on hugetlbfs (before 4.16) refuse: the memory then stays
        // private to this process (peers reach it with process_vm_readv/writev instead).
        let sealed = fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
            .map_err(|e| tracing::debug!("cannot seal a memfd of {len} bytes: {e}"))
            .is_ok();
        let size = usize::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: a fresh shared mapping of a memfd we own and sized above; no existing memory
        // is touched. MAP_POPULATE pre-faults it (fails with ENOMEM for missing huge pages).
        let ptr = unsafe {
            mmap(
                std::ptr::null_mut(),
                size,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED | MapFlags::POPULATE,
                &fd,
                0,
            )?
        };
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(SharedMemory { ptr, len, fd, huge_pages, sealed })
    }

    /// Its first byte's address in this process.
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// Its length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// It has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// It is backed by huge pages.
    pub fn huge_pages(&self) -> bool {
        self.huge_pages
    }

    /// The memfd backing the mapping (what a same-host peer maps).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// True when the memfd cannot change size any more, so a peer may safely map it.
    pub fn sealed(&self) -> bool {
        self.sealed
    }
}

impl Drop for SharedMemory {
    fn drop(&mut self) {
        // SAFETY: we unmap exactly the mapping created in `map`; the region table holds an
        // `Arc` to this value while the memory is registered, so nothing references it now.
        if let Err(e) = unsafe { munmap(self.ptr.as_ptr().cast(), self.len as usize) } {
            tracing::warn!("munmap of {} bytes failed: {e}", self.len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocation_is_zeroed_and_writable() {
        let mem = SharedMemory::allocate(3 << 20, "crescent-test").unwrap();
        assert_eq!(mem.len(), 3 << 20);
        // SAFETY: test-only access to memory we own.
        let bytes = unsafe { std::slice::from_raw_parts_mut(mem.addr() as *mut u8, mem.len() as usize) };
        assert!(bytes.iter().all(|&b| b == 0));
        bytes[12345] = 7;
        assert_eq!(bytes[12345], 7);
    }

    #[test]
    fn memfd_cannot_be_shrunk_by_whoever_holds_it() {
        let mem = SharedMemory::allocate(1 << 20, "crescent-test").unwrap();
        assert!(mem.sealed());
        assert!(ftruncate(mem.fd(), 4096).is_err(), "sealed against shrinking");
        assert!(ftruncate(mem.fd(), 2 << 20).is_err(), "sealed against growing");
    }

    #[test]
    fn zero_length_is_a_caller_error() {
        let err = SharedMemory::allocate(0, "x").unwrap_err();
        assert!(err.is_caller_error());
    }
}
