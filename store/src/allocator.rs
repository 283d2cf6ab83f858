//! Space of one mounted segment: a free list of granule-aligned ranges.
//!
//! Besides handing out blocks ([`SegmentAllocator::allocate`], best fit) it can take a given
//! range ([`SegmentAllocator::reserve`]): a master rebuilt from its clients' reports puts
//! every reported object back at the exact offset its owner holds it at. Free ranges are kept
//! twice — by offset (to find a range's neighbours and the range holding an offset) and by
//! (length, offset) (for the best fit) — and a released block merges with free neighbours, so
//! that freed space comes back in one piece.
//!
//! The master allocates replicas' space in clients' segments with it, the client the blocks of
//! its staging buffer ([`crate::staging`]); it imports neither.

use std::collections::{BTreeMap, BTreeSet};

/// Smallest allocation unit; a segment's granule grows (powers of two) so that a segment has
/// at most `MAX_UNITS` of them (keeps the free list's worst case bounded).
const MIN_GRANULE: u64 = 256;
const MAX_UNITS: u64 = 1 << 31;

/// A block handed out by [`SegmentAllocator::allocate`] or [`SegmentAllocator::reserve`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    /// Byte offset from the segment's start.
    pub offset: u64,
    /// Bytes reserved (the request rounded up to the granule).
    pub reserved: u64,
}

/// Why [`SegmentAllocator::reserve`] refused a range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReserveError {
    /// The range is empty, wraps, or ends past [`SegmentAllocator::capacity`].
    #[error("range [{offset}, +{len}) is not inside the segment's {capacity} usable bytes")]
    OutOfRange {
        /// Requested offset, in bytes from the segment's start.
        offset: u64,
        /// Requested length, in bytes.
        len: u64,
        /// The segment's usable bytes.
        capacity: u64,
    },
    /// The offset is not on a granule boundary.
    #[error("offset {offset} is not a multiple of the segment's {granule}-byte granule")]
    Misaligned {
        /// Requested offset, in bytes.
        offset: u64,
        /// The segment's granule, in bytes.
        granule: u64,
    },
    /// Part of the range (rounded up to the granule) is already handed out.
    #[error("range [{offset}, +{len}) overlaps space in use")]
    InUse {
        /// Requested offset, in bytes.
        offset: u64,
        /// Requested length, in bytes.
        len: u64,
    },
}

/// The free space of one segment of `size` bytes, in granule units; not thread-safe (its
/// owner locks it). Invariant: free ranges never touch (a release merges them), and
/// `reserved + free == capacity`.
pub struct SegmentAllocator {
    /// Free ranges: offset → length (bytes, multiples of the granule), never adjacent.
    by_offset: BTreeMap<u64, u64>,
    /// The same ranges as (length, offset).
    by_len: BTreeSet<(u64, u64)>,
    granule: u64,
    size: u64,
    reserved: u64,
    blocks: u64,
}

impl SegmentAllocator {
    /// An allocator for a segment of `size` bytes, all free. The granule is the smallest power
    /// of two from 256 bytes up that keeps the segment at 2^31 units at most; the tail beyond
    /// the last whole granule is not usable.
    pub fn new(size: u64) -> Self {
        let mut granule = MIN_GRANULE;
        while size / granule > MAX_UNITS {
            granule *= 2;
        }
        let size = size / granule * granule;
        let mut a = SegmentAllocator {
            by_offset: BTreeMap::new(),
            by_len: BTreeSet::new(),
            granule,
            size,
            reserved: 0,
            blocks: 0,
        };
        if size > 0 {
            a.insert_free(0, size);
        }
        a
    }

    /// Usable bytes (the segment size rounded down to the granule).
    pub fn capacity(&self) -> u64 {
        self.size
    }

    /// Bytes handed out and not released (each block counts its rounded-up size).
    pub fn reserved(&self) -> u64 {
        self.reserved
    }

    /// Blocks handed out and not released.
    pub fn blocks(&self) -> u64 {
        self.blocks
    }

    /// Bytes not handed out: `capacity - reserved`, possibly in several pieces.
    pub fn free(&self) -> u64 {
        self.size - self.reserved
    }

    fn insert_free(&mut self, offset: u64, len: u64) {
        self.by_offset.insert(offset, len);
        self.by_len.insert((len, offset));
    }

    fn remove_free(&mut self, offset: u64, len: u64) {
        self.by_offset.remove(&offset);
        self.by_len.remove(&(len, offset));
    }

    fn round(&self, len: u64) -> Option<u64> {
        len.checked_next_multiple_of(self.granule)
    }

    /// The smallest free range that fits `len` bytes (rounded up to the granule); its start.
    pub fn allocate(&mut self, len: u64) -> Option<Block> {
        if len == 0 || len > self.size {
            return None;
        }
        let need = self.round(len)?;
        let &(free_len, offset) = self.by_len.range((need, 0)..).next()?;
        self.remove_free(offset, free_len);
        if free_len > need {
            self.insert_free(offset + need, free_len - need);
        }
        self.reserved += need;
        self.blocks += 1;
        Some(Block { offset, reserved: need })
    }

    /// Takes exactly `[offset, offset + len)` (len rounded up to the granule), if it is free.
    pub fn reserve(&mut self, offset: u64, len: u64) -> Result<Block, ReserveError> {
        let out_of_range = ReserveError::OutOfRange { offset, len, capacity: self.size };
        let need = self.round(len).filter(|n| *n > 0).ok_or(out_of_range)?;
        if offset.checked_add(need).is_none_or(|end| end > self.size) {
            return Err(out_of_range);
        }
        if !offset.is_multiple_of(self.granule) {
            return Err(ReserveError::Misaligned { offset, granule: self.granule });
        }
        let in_use = ReserveError::InUse { offset, len };
        let (&start, &free_len) = self.by_offset.range(..=offset).next_back().ok_or(in_use)?;
        if start + free_len < offset + need {
            return Err(in_use);
        }
        self.remove_free(start, free_len);
        if offset > start {
            self.insert_free(start, offset - start);
        }
        let end = offset + need;
        if start + free_len > end {
            self.insert_free(end, start + free_len - end);
        }
        self.reserved += need;
        self.blocks += 1;
        Ok(Block { offset, reserved: need })
    }

    /// Gives a block back; it merges with the free ranges beside it.
    pub fn release(&mut self, block: Block) {
        debug_assert!(block.offset + block.reserved <= self.size, "{block:?} is not of this segment");
        self.reserved -= block.reserved;
        self.blocks -= 1;
        let (mut offset, mut len) = (block.offset, block.reserved);
        if let Some((&prev, &prev_len)) = self.by_offset.range(..offset).next_back() {
            debug_assert!(prev + prev_len <= offset, "{block:?} released twice");
            if prev + prev_len == offset {
                self.remove_free(prev, prev_len);
                offset = prev;
                len += prev_len;
            }
        }
        if let Some(next_len) = self.by_offset.get(&(offset + len)).copied() {
            self.remove_free(offset + len, next_len);
            len += next_len;
        }
        self.insert_free(offset, len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn segments_of_any_size_are_safe_and_tiny_ones_hold_what_fits() {
        for size in [0, 1, 255, 256, 257, 511, 512, 4095, 4096] {
            let mut a = SegmentAllocator::new(size);
            assert_eq!(a.capacity(), size / MIN_GRANULE * MIN_GRANULE);
            let mut got = 0;
            while let Some(b) = a.allocate(1) {
                assert!(b.offset + b.reserved <= a.capacity(), "{size}: {b:?}");
                got += 1;
            }
            assert_eq!(got, size / MIN_GRANULE, "{size} bytes hold this many 1-byte blocks");
        }
    }

    #[test]
    fn allocations_do_not_overlap_and_space_comes_back() {
        let mut a = SegmentAllocator::new(1 << 20);
        let blocks: Vec<Block> = (0..16).map(|_| a.allocate(60_000).unwrap()).collect();
        let mut ranges: Vec<(u64, u64)> = blocks.iter().map(|b| (b.offset, b.offset + 60_000)).collect();
        ranges.sort();
        for w in ranges.windows(2) {
            assert!(w[0].1 <= w[1].0, "{w:?}");
        }
        assert!(ranges.last().unwrap().1 <= 1 << 20);
        assert!(a.allocate(200_000).is_none(), "full");
        for b in blocks {
            a.release(b);
        }
        assert_eq!(a.reserved(), 0);
        assert!(a.allocate(1 << 20).is_some(), "all space is back in one piece");
    }

    #[test]
    fn huge_segments_use_a_larger_granule() {
        let a = SegmentAllocator::new(1 << 40);
        assert!(a.granule > MIN_GRANULE);
        assert_eq!(a.capacity(), 1 << 40);
    }

    #[test]
    fn a_rebuilt_segment_takes_back_the_exact_ranges_and_refuses_overlaps() {
        let mut a = SegmentAllocator::new(1 << 20);
        let b = a.reserve(4096, 1000).unwrap();
        assert_eq!(b, Block { offset: 4096, reserved: 1024 });
        assert_eq!(a.reserve(4096 + 768, 10), Err(ReserveError::InUse { offset: 4096 + 768, len: 10 }));
        assert_eq!(a.reserve(3840, 512), Err(ReserveError::InUse { offset: 3840, len: 512 }), "overlaps the start");
        assert!(matches!(a.reserve(100, 10), Err(ReserveError::Misaligned { .. })));
        assert!(matches!(a.reserve(1 << 20, 1), Err(ReserveError::OutOfRange { .. })));
        assert!(matches!(a.reserve((1 << 20) - 256, 512), Err(ReserveError::OutOfRange { .. })));
        assert!(matches!(a.reserve(u64::MAX - 255, 256), Err(ReserveError::OutOfRange { .. })));
        assert!(matches!(a.reserve(0, 0), Err(ReserveError::OutOfRange { .. })));
        // Right beside it, at both ends: fine.
        a.reserve(3840, 256).unwrap();
        a.reserve(5120, 256).unwrap();
        assert_eq!(a.reserved(), 1024 + 512);
        // Allocations never land on reserved ranges.
        while let Some(n) = a.allocate(3000) {
            assert!(n.offset + n.reserved <= 3840 || n.offset >= 5376, "{n:?}");
        }
        assert!(a.reserve(8192, 256).is_err(), "allocated meanwhile");
    }

    #[derive(Debug, Clone)]
    enum Op {
        Allocate(u64),
        Reserve(u64, u64),
        Release(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (1u64..40_000).prop_map(Op::Allocate),
            ((0u64..300).prop_map(|u| u * 256), 1u64..20_000).prop_map(|(o, l)| Op::Reserve(o, l)),
            any::<usize>().prop_map(Op::Release),
        ]
    }

    proptest! {
        /// The allocator agrees with a model of the segment as one flag per granule: blocks never
        /// overlap, a reserve succeeds exactly when its range is free, and everything released
        /// comes back in one piece.
        #[test]
        fn matches_a_model_of_one_flag_per_granule(ops in proptest::collection::vec(op(), 1..200)) {
            const SIZE: u64 = 64 * 1024;
            let mut a = SegmentAllocator::new(SIZE);
            let mut used = vec![false; (SIZE / 256) as usize];
            let mut live: Vec<Block> = Vec::new();
            for op in ops {
                match op {
                    Op::Allocate(len) => {
                        if let Some(b) = a.allocate(len) {
                            prop_assert_eq!(b.reserved, len.div_ceil(256) * 256);
                            for u in b.offset / 256..(b.offset + b.reserved) / 256 {
                                prop_assert!(!used[u as usize], "{:?} overlaps", b);
                                used[u as usize] = true;
                            }
                            live.push(b);
                        }
                    }
                    Op::Reserve(offset, len) => {
                        let end = offset + len.div_ceil(256) * 256;
                        let free = end <= SIZE && (offset / 256..end / 256).all(|u| !used[u as usize]);
                        let r = a.reserve(offset, len);
                        prop_assert_eq!(r.is_ok(), free, "reserve({}, {}) = {:?}", offset, len, r);
                        if let Ok(b) = r {
                            for u in b.offset / 256..(b.offset + b.reserved) / 256 {
                                used[u as usize] = true;
                            }
                            live.push(b);
                        }
                    }
                    Op::Release(i) if !live.is_empty() => {
                        let b = live.swap_remove(i % live.len());
                        for u in b.offset / 256..(b.offset + b.reserved) / 256 {
                            used[u as usize] = false;
                        }
                        a.release(b);
                    }
                    Op::Release(_) => {}
                }
                prop_assert_eq!(a.reserved(), used.iter().filter(|u| **u).count() as u64 * 256);
            }
            for b in live.drain(..) {
                a.release(b);
            }
            prop_assert_eq!(a.reserved(), 0);
            prop_assert!(a.allocate(SIZE).is_some());
        }
    }
}
