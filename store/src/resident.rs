//! Making memory the client will transfer into resident before the first transfer.
//!
//! A transfer into pages never touched takes one fault per 4 KiB page in the transport's
//! receiving threads. Memory a caller registers for zero-copy calls is meant to be used again
//! and again, so [`StoreApi::register_buffer`](crate::StoreApi::register_buffer) makes it
//! resident once, at registration, as registering it with an RDMA device (which pins it)
//! would. Measured (`storebench hot-cache`, `batch_get_into` of 5 x 25 MiB into buffers
//! allocated and registered once, unshaped veth, 2026-12-04): a fresh reader's first call took
//! 65-80 ms with the pages faulting in the receiving threads, and 180-260 ms in some readers
//! that had an 800 MiB hot cache; with the buffer resident, 44-52 ms in every reader. (The
//! slow ones met memory the VM's guest had handed back to its host, free page reporting, whose
//! first write faults on the host too: see `benches/src/hotbench.rs`, `warm_memory`.)

use rustix::mm::{madvise, Advice};

const PAGE: usize = 4096;

/// Makes the whole pages of `[addr, +len)` present and writable (`MADV_POPULATE_WRITE`, Linux
/// 5.14 on; before it, or where the range cannot be populated, nothing happens and pages fault
/// on first use as before). Contents are never changed. Returns whether the advice was taken.
pub(crate) fn populate(addr: u64, len: u64) -> bool {
    let start = (addr as usize).next_multiple_of(PAGE);
    let end = (addr as usize).saturating_add(len as usize) / PAGE * PAGE;
    if end <= start {
        return false;
    }
    // SAFETY: the advice only faults in pages of mappings the caller holds in `[addr, +len)`
    // (a range that is not mapped, or not writable, makes the call fail and nothing change);
    // populating never changes the contents of a page.
    unsafe { madvise(start as *mut _, end - start, Advice::LinuxPopulateWrite) }.is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::mm::{mmap_anonymous, munmap, MapFlags, ProtFlags};
    use std::io::{Read, Seek, SeekFrom};

    /// How many of the pages of `buf` are present (`/proc/self/pagemap`, bit 63).
    fn present_pages(buf: &[u8]) -> usize {
        let mut map = std::fs::File::open("/proc/self/pagemap").expect("pagemap");
        let first = buf.as_ptr() as usize / PAGE;
        let pages = buf.len() / PAGE;
        map.seek(SeekFrom::Start(first as u64 * 8)).expect("seek");
        let mut raw = vec![0u8; pages * 8];
        map.read_exact(&mut raw).expect("read pagemap");
        raw.chunks_exact(8).filter(|e| u64::from_le_bytes((*e).try_into().unwrap()) >> 63 == 1).count()
    }

    #[test]
    fn populated_memory_is_present_and_keeps_its_bytes() {
        // A mapping of its own, so that no page was touched before: memory from the allocator
        // may come from heap other tests of this process wrote and freed (glibc serves even a
        // request above its mmap threshold from a large enough free top of its heap).
        let len = 40 << 20;
        // SAFETY: a fresh private anonymous mapping, used below only as `len` bytes and
        // unmapped at the end of the test.
        let at =
            unsafe { mmap_anonymous(std::ptr::null_mut(), len, ProtFlags::READ | ProtFlags::WRITE, MapFlags::PRIVATE) }
                .expect("mmap");
        // SAFETY: the mapping above: `len` bytes, readable and writable, zero-filled, owned
        // by this test alone until it is unmapped.
        let buf = unsafe { std::slice::from_raw_parts_mut(at as *mut u8, len) };
        let inner_pages = len / PAGE;
        let before = present_pages(buf);
        assert_eq!(before, 0, "a fresh mapping has no page present");
        let half = &buf[..len / 2];
        assert!(populate(half.as_ptr() as u64 + 1, half.len() as u64 - 1), "whole pages inside the range");
        assert_eq!(present_pages(buf), inner_pages / 2 - 1, "every whole page of the range present, no other");
        assert!(populate(buf.as_ptr() as u64, len as u64));
        assert_eq!(present_pages(buf), inner_pages, "every page present");
        buf[12345] = 7;
        assert!(buf.iter().enumerate().all(|(i, &b)| b == if i == 12345 { 7 } else { 0 }));
        // SAFETY: the mapping made above, no longer borrowed.
        unsafe { munmap(at, len) }.expect("munmap");
    }

    #[test]
    fn ranges_without_a_whole_page_are_left_alone() {
        assert!(!populate(4096 + 1, 100));
        assert!(!populate(0, 0));
    }
}
