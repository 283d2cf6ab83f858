//! The client's registered staging buffer: byte values (`put`, `get`) pass through it so
//! that the transfer engine only ever moves registered memory. Blocks are handed out by an
//! offset allocator; a caller waits while the buffer is full, until its request's deadline
//! (other calls, and the disk service's remote readers, hold blocks meanwhile).
//!
//! It sits below the client and its disk tier, which both use it.

use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

use crescent_engine::RegisteredMemory;

use crate::allocator::{Block, SegmentAllocator};
use crate::error::{Result, StoreError, Waited};

/// The client's staging buffer: one registered memory region cut into blocks on demand.
/// Shared by the calls of a client (and its disk service); every block goes back when its
/// holder drops it, and waiters are woken then.
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
    /// The block's start, a virtual address inside the registered staging memory (what a
    /// transfer names as its local address).
    pub fn addr(&self) -> u64 {
        self.staging.addr_of(&self.block)
    }
    /// Its usable length in bytes: what was asked, capped at [`Staging::chunk`].
    pub fn len(&self) -> u64 {
        self.len
    }
    /// True for a block of 0 bytes.
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
        self.staging.release(self.block.take());
    }
}

/// A block of the staging buffer that holds a whole value for its owner, however long that
/// lives (`get_buffer`'s result, as Mooncake's `BufferHandle` holds its client's local buffer):
/// returned to the buffer on drop. It keeps the buffer's registered memory alive, so its bytes
/// stay valid after the client closes.
pub struct HeldBlock {
    staging: Arc<Staging>,
    block: Option<Block>,
    len: u64,
}

impl HeldBlock {
    /// The block's start, a virtual address inside the registered staging memory.
    pub fn addr(&self) -> u64 {
        self.staging.addr_of(&self.block)
    }

    /// The value's length, in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True for a block of 0 bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes (what a get wrote there).
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: this block of the registered staging buffer belongs to this value alone
        // until it is dropped, and the memory lives as long as `staging`; the get that filled
        // it has ended.
        unsafe { std::slice::from_raw_parts(self.addr() as *const u8, self.len as usize) }
    }
}

impl std::fmt::Debug for HeldBlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldBlock").field("addr", &self.addr()).field("len", &self.len).finish()
    }
}

impl Drop for HeldBlock {
    fn drop(&mut self) {
        self.staging.release(self.block.take());
    }
}

impl Staging {
    /// A staging buffer over `mem`, all of it free (cut in granules of
    /// [`SegmentAllocator`]).
    pub fn new(mem: RegisteredMemory) -> Self {
        let alloc = SegmentAllocator::new(mem.len());
        Staging { mem, alloc: Mutex::new(alloc), freed: Condvar::new() }
    }

    /// The start of a block held (of a [`StagingBlock`] or [`HeldBlock`]).
    fn addr_of(&self, block: &Option<Block>) -> u64 {
        self.mem.addr() + block.as_ref().expect("held").offset
    }

    /// Gives a block back (on its holder's drop; `None`: given back already), waking the
    /// waiters for room.
    fn release(&self, block: Option<Block>) {
        if let Some(b) = block {
            self.alloc.lock().release(b);
            self.freed.notify_all();
        }
    }

    /// The registered memory the blocks are cut from.
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

    /// Takes `len` bytes (at most [`Self::chunk`]), waiting while the buffer is full; fails
    /// with [`StoreError::TimedOut`] if they are not free by `deadline`.
    pub fn acquire(&self, len: u64, deadline: Instant) -> Result<StagingBlock<'_>> {
        let len = len.min(self.chunk());
        let block = self.wait_for(len, deadline)?;
        Ok(StagingBlock { staging: self, block: Some(block), len })
    }

    /// Takes `len` bytes in one block for as long as the returned block lives (a whole value,
    /// however large; more than the buffer holds is the caller's mistake), waiting while the
    /// buffer is full as [`Self::acquire`] does.
    pub fn acquire_held(self: &Arc<Self>, len: u64, deadline: Instant) -> Result<HeldBlock> {
        self.check_held(len)?;
        let block = self.wait_for(len, deadline)?;
        Ok(HeldBlock { staging: self.clone(), block: Some(block), len })
    }

    /// [`Self::acquire_held`] without waiting: the block if `len` bytes in one piece are free
    /// now, none while the buffer is too full (Mooncake's `BufferPool` leases, which fall back
    /// to memory of their own then).
    pub fn try_acquire_held(self: &Arc<Self>, len: u64) -> Result<Option<HeldBlock>> {
        self.check_held(len)?;
        let block = self.alloc.lock().allocate(len);
        Ok(block.map(|block| HeldBlock { staging: self.clone(), block: Some(block), len }))
    }

    /// The buffer's size, in bytes.
    pub fn capacity(&self) -> u64 {
        self.alloc.lock().capacity()
    }

    fn check_held(&self, len: u64) -> Result<()> {
        let capacity = self.capacity();
        if len == 0 || len > capacity {
            return Err(StoreError::invalid(format!(
                "a value of {len} bytes cannot be held in the local buffer of {capacity} bytes (set \
                 local_buffer_size larger)"
            )));
        }
        Ok(())
    }

    fn wait_for(&self, len: u64, deadline: Instant) -> Result<Block> {
        let start = Instant::now();
        let mut alloc = self.alloc.lock();
        loop {
            if let Some(block) = alloc.allocate(len) {
                return Ok(block);
            }
            if self.freed.wait_until(&mut alloc, deadline).timed_out() {
                return alloc.allocate(len).ok_or_else(|| StoreError::TimedOut {
                    waited: Waited::Staging { len },
                    after: deadline.saturating_duration_since(start),
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    /// A staging buffer of `len` bytes registered with an engine of its own (kept with it).
    fn staging_of(len: u64) -> (Arc<crescent_engine::TransferEngine>, Arc<Staging>) {
        let engine = crescent_engine::TransferEngine::new(crescent_engine::EngineConfig {
            local_hostname: Some("127.0.0.1".into()),
            ..Default::default()
        })
        .unwrap();
        let staging = Arc::new(Staging::new(engine.alloc_registered(len, "cpu:0").unwrap()));
        (engine, staging)
    }

    #[test]
    fn a_full_buffer_makes_a_caller_wait_until_its_deadline_and_no_longer() {
        let (_engine, staging) = staging_of(64 << 10);
        // Whoever holds the whole buffer (other calls, a remote disk reader that went quiet).
        let held: Vec<StagingBlock<'_>> =
            (0..4).map(|_| staging.acquire(staging.chunk(), Instant::now()).unwrap()).collect();
        assert!(staging.try_acquire(1).is_none(), "the buffer is full");
        let waiter = {
            let staging = staging.clone();
            std::thread::spawn(move || {
                staging
                    .acquire(4096, Instant::now() + Duration::from_millis(200))
                    .map(|b| b.len())
                    .map_err(|e| e.to_string())
            })
        };
        // Without a deadline the waiter would wait as long as the blocks are held: here, until
        // this test gives up on it.
        let deadline = Instant::now() + Duration::from_secs(20);
        while !waiter.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(waiter.is_finished(), "acquire waited past its deadline");
        let e = waiter.join().unwrap().unwrap_err();
        assert!(e.contains("staging buffer"), "{e}");
        drop(held);
        assert_eq!(staging.acquire(4096, Instant::now()).unwrap().len(), 4096, "free again: taken at once");
    }

    #[test]
    fn a_lease_of_the_buffer_is_there_at_once_or_not_at_all_and_comes_back_when_dropped() {
        let (_engine, staging) = staging_of(64 << 10);
        assert_eq!(staging.capacity(), 64 << 10);
        let whole = staging.try_acquire_held(64 << 10).unwrap().expect("an empty buffer has room for all of it");
        assert_eq!((whole.len(), whole.addr()), (64 << 10, staging.memory().addr()));
        assert!(staging.try_acquire_held(1).unwrap().is_none(), "full: none, without waiting");
        drop(whole);
        let a = staging.try_acquire_held(32 << 10).unwrap().expect("room again");
        let b = staging.try_acquire_held(32 << 10).unwrap().expect("the other half");
        assert!(a.addr() + a.len() <= b.addr() || b.addr() + b.len() <= a.addr(), "two leases never overlap");
        assert!(staging.try_acquire_held(0).is_err(), "0 bytes is the caller's mistake");
        assert!(staging.try_acquire_held((64 << 10) + 1).is_err(), "more than the buffer holds too");
    }
}
