//! Space of one mounted segment: an offset allocator over its bytes.

use offset_allocator::{Allocation, Allocator};

/// Smallest allocation unit; a segment's granule grows (powers of two) so that its size
/// fits the allocator's 32-bit unit count.
const MIN_GRANULE: u64 = 256;
const MAX_UNITS: u64 = 1 << 31;
const MAX_ALLOCATIONS: u32 = 1 << 20;

/// A block handed out by [`SegmentAllocator::allocate`].
#[derive(Clone, Copy)]
pub struct Block {
    /// Byte offset from the segment's start.
    pub offset: u64,
    /// Bytes reserved (the request rounded up to the granule).
    pub reserved: u64,
    handle: Allocation,
}

impl std::fmt::Debug for Block {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Block").field("offset", &self.offset).field("reserved", &self.reserved).finish()
    }
}

pub struct SegmentAllocator {
    inner: Allocator,
    granule: u64,
    size: u64,
    reserved: u64,
    blocks: u64,
}

impl SegmentAllocator {
    pub fn new(size: u64) -> Self {
        let mut granule = MIN_GRANULE;
        while size / granule > MAX_UNITS {
            granule *= 2;
        }
        let units = (size / granule) as u32;
        SegmentAllocator {
            // The allocator keeps its free region in a node too: fewer than two nodes make it
            // underflow (a panic in debug builds) before the first allocation.
            inner: Allocator::with_max_allocs(units, MAX_ALLOCATIONS.min(units.saturating_add(2))),
            granule,
            size: units as u64 * granule,
            reserved: 0,
            blocks: 0,
        }
    }

    /// Usable bytes (the segment size rounded down to the granule).
    pub fn capacity(&self) -> u64 {
        self.size
    }

    pub fn reserved(&self) -> u64 {
        self.reserved
    }

    /// Blocks handed out and not released.
    pub fn blocks(&self) -> u64 {
        self.blocks
    }

    pub fn free(&self) -> u64 {
        self.size - self.reserved
    }

    pub fn allocate(&mut self, len: u64) -> Option<Block> {
        if len == 0 || len > self.size {
            return None;
        }
        let units = len.div_ceil(self.granule);
        let handle = self.inner.allocate(u32::try_from(units).ok()?)?;
        let reserved = units * self.granule;
        self.reserved += reserved;
        self.blocks += 1;
        Some(Block { offset: handle.offset as u64 * self.granule, reserved, handle })
    }

    pub fn release(&mut self, block: Block) {
        self.reserved -= block.reserved;
        self.blocks -= 1;
        self.inner.free(block.handle);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
