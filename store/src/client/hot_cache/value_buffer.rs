//! Buffers for values the hot cache returns as bytes (hits of `get`, `get_batch`).
//!
//! Such a value is copied into memory the allocator has just handed out. Large allocations come
//! from fresh mappings, or from heap that glibc gave back to the kernel when the last batch of
//! values was freed, so each 4 KiB page faults on its first write: 12,800 faults for a batch
//! of five 10 MiB values, which cost about as much as the copy itself on these machines.
//! `MADV_POPULATE_WRITE` makes those pages present in one call instead of one trap per page
//! (5 x 10 MiB fresh buffers filled by memcpy, C on this VM: 29-39 ms -> 23-26 ms per batch).
//! Huge pages (`MADV_HUGEPAGE`) would fault less still (14-18 ms), but with THP's default
//! `defrag=madvise` a fault in an advised range may compact memory synchronously: in runs
//! with it the byte gets' p99 reached 37-98 ms at 10-25 MiB (11-25 ms without; an earlier
//! attempt saw the same). Before Linux 5.14 the advice is
//! refused and the pages fault on first write, as without it.
//!
//! For hits, whose copy starts at once. A miss's buffer is written by its transfer: populating
//! it first would put all the faults before the transfer (the first round of `get_batch` with
//! the cache was 1.4x instead of 1.0x in a run made that way); a byte `get` lent to the engine
//! populates it while the transfer runs instead, from the calling thread, which otherwise only
//! waits (the pages the receiving threads reach first fault there, as before).

/// Values at least this long get the advice (smaller ones come from heap that stays mapped).
const ADVISE_FROM: usize = 4 << 20;

/// An empty vector with room for `len` bytes, none of them touched yet.
pub(crate) fn with_capacity(len: usize) -> Vec<u8> {
    let v = Vec::with_capacity(len);
    populate(v.as_ptr(), len);
    v
}

/// Makes the pages of `[at, +len)`, memory this process allocated, present and writable
/// (for a hit's copy into a fresh buffer).
pub(crate) fn populate(at: *const u8, len: usize) {
    if len >= ADVISE_FROM {
        crate::resident::populate(at as u64, len as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_have_the_asked_room_and_hold_what_is_written() {
        for len in [0, 1, 4096, ADVISE_FROM - 1, ADVISE_FROM, 10 << 20] {
            let mut w = with_capacity(len);
            assert!(w.is_empty() && w.capacity() >= len);
            w.extend((0..len).map(|i| (i % 251) as u8));
            assert!(w.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
        }
    }
}
