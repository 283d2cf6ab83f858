//! The client's registered staging buffer: byte values (`put`, `get`) pass through it so
//! that the transfer engine only ever moves registered memory. Blocks are handed out by an
//! offset allocator; a caller waits while the buffer is full.

use parking_lot::{Condvar, Mutex};

use crescent_engine::RegisteredMemory;

use crate::master::allocator::{Block, SegmentAllocator};

pub struct Staging {
    mem: RegisteredMemory,
    alloc: Mutex<SegmentAllocator>,
    freed: Condvar,
}

/// A piece of the staging buffer, returned to it on drop.
pub struct StagingBlock<'a> {
    staging: &'a Staging,
    block: Option<Block>,
    len: u64,
}

impl StagingBlock<'_> {
    pub fn addr(&self) -> u64 {
        self.staging.mem.addr() + self.block.as_ref().expect("held").offset
    }
    pub fn len(&self) -> u64 {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The block's bytes.
    pub fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: this block of the registered staging buffer belongs to this value alone
        // until it is dropped; transfers using it are synchronous and have ended.
        unsafe { std::slice::from_raw_parts_mut(self.addr() as *mut u8, self.len as usize) }
    }
}

impl Drop for StagingBlock<'_> {
    fn drop(&mut self) {
        if let Some(b) = self.block.take() {
            self.staging.alloc.lock().release(b);
            self.staging.freed.notify_all();
        }
    }
}

impl Staging {
    pub fn new(mem: RegisteredMemory) -> Self {
        let alloc = SegmentAllocator::new(mem.len());
        Staging { mem, alloc: Mutex::new(alloc), freed: Condvar::new() }
    }

    pub fn memory(&self) -> &RegisteredMemory {
        &self.mem
    }

    /// Largest piece one operation takes at a time (so several threads share the buffer).
    pub fn chunk(&self) -> u64 {
        (self.alloc.lock().capacity() / 4).max(4096)
    }

    /// Takes `len` bytes (at most [`Self::chunk`]) if they are free now.
    pub fn try_acquire(&self, len: u64) -> Option<StagingBlock<'_>> {
        let len = len.min(self.chunk());
        let block = self.alloc.lock().allocate(len)?;
        Some(StagingBlock { staging: self, block: Some(block), len })
    }

    /// Takes `len` bytes (at most [`Self::chunk`]), waiting while the buffer is full.
    pub fn acquire(&self, len: u64) -> StagingBlock<'_> {
        let len = len.min(self.chunk());
        let mut alloc = self.alloc.lock();
        loop {
            if let Some(block) = alloc.allocate(len) {
                return StagingBlock { staging: self, block: Some(block), len };
            }
            self.freed.wait(&mut alloc);
        }
    }
}
