//! Buffers for values returned as bytes (`get`, `get_batch`).
//!
//! Such a value lands in memory the allocator has just handed out. Large allocations come
//! from fresh mappings, or from heap that glibc gave back to the kernel when the last batch of
//! values was freed, so each 4 KiB page faults on its first write: 12,800 faults for a batch
//! of five 10 MiB values, which cost about twice the copy itself on these machines. Asking
//! for transparent huge pages on the buffer's 2 MiB-aligned interior turns them into a few
//! dozen faults (5 x 10 MiB fresh buffers filled by memcpy: 31-41 ms -> 14-21 ms per batch).
//! Where the kernel has THP off (or `never`), the advice is refused and nothing changes.

use rustix::mm::{madvise, Advice};

/// Values at least this long get the advice: the interior must hold whole 2 MiB pages.
const ADVISE_FROM: usize = 4 << 20;
const HUGE_PAGE: usize = 2 << 20;

/// An empty vector with room for `len` bytes, none of them touched yet.
pub(crate) fn with_capacity(len: usize) -> Vec<u8> {
    let v = Vec::with_capacity(len);
    advise_huge_pages(v.as_ptr(), len);
    v
}

/// `len` zero bytes. `calloc` does not touch a fresh mapping (its pages are zero already),
/// so the advice given after it still decides how the first writes fault.
pub(crate) fn zeroed(len: usize) -> Vec<u8> {
    let v = vec![0u8; len];
    advise_huge_pages(v.as_ptr(), len);
    v
}

fn advise_huge_pages(at: *const u8, len: usize) {
    if len < ADVISE_FROM {
        return;
    }
    let start = (at as usize).next_multiple_of(HUGE_PAGE);
    let end = (at as usize + len) / HUGE_PAGE * HUGE_PAGE;
    if end > start {
        // SAFETY: [start, end) lies inside the allocation of `len` bytes at `at`; the advice
        // changes how the kernel backs those pages, never their contents.
        let _ = unsafe { madvise(start as *mut _, end - start, Advice::LinuxHugepage) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_have_the_asked_length_and_hold_what_is_written() {
        for len in [0, 1, 4096, ADVISE_FROM - 1, ADVISE_FROM, 10 << 20] {
            let v = zeroed(len);
            assert_eq!(v.len(), len);
            assert!(v.iter().all(|&b| b == 0));
            let mut w = with_capacity(len);
            assert!(w.is_empty() && w.capacity() >= len);
            w.extend((0..len).map(|i| (i % 251) as u8));
            assert!(w.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
        }
    }
}
