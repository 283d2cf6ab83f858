//! A dummy client's memory, as its standalone client sees it.
//!
//! * **Shared regions**: memfds (sealed against resizing) this process allocated through the
//!   API — the memory pool of `setup_dummy(mem_pool_size, ...)` that `alloc_from_mem_pool`
//!   carves, dedicated allocations beyond it, and the local buffer. Each is shared once with
//!   the standalone client, which maps it and registers it with its engine: gets land straight
//!   in these pages, puts read from them — no copy beyond the engine's own.
//! * **Registered heap memory** (`register_buffer` of memory allocated elsewhere: a numpy
//!   array, a `bytearray`): the standalone client cannot map it, so a call *bounces* it
//!   through the local buffer with one memcpy here — before a put, after a get.
//!
//! Anything else is not registered memory ([`StoreError::NotRegistered`]), as for a full client.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crescent_transports::SharedMemory;
use parking_lot::{Condvar, Mutex, RwLock};

use super::wire::Mem;
use crate::allocator::{Block, SegmentAllocator};
use crate::error::{Result, StoreError, Waited};

/// One memfd shared with the standalone client.
#[derive(Debug)]
pub struct Region {
    /// Its id on the wire (from 1, never reused by this client).
    pub id: u32,
    /// The memory itself, a sealed memfd mapped here.
    pub mem: SharedMemory,
}

impl Region {
    fn contains(&self, addr: u64, len: u64) -> bool {
        addr >= self.mem.addr() && addr.checked_add(len).is_some_and(|end| end <= self.mem.addr() + self.mem.len())
    }
}

/// Where a piece of caller memory is, for the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loc {
    /// In a shared region: named as is.
    Shared(Mem),
    /// Registered heap memory: bounced through the local buffer.
    Heap,
}

/// Blocks of one region handed out by an allocator.
struct Carver {
    region: Arc<Region>,
    alloc: Mutex<SegmentAllocator>,
    freed: Condvar,
}

impl Carver {
    fn new(region: Arc<Region>) -> Carver {
        let alloc = SegmentAllocator::new(region.mem.len());
        Carver { region, alloc: Mutex::new(alloc), freed: Condvar::new() }
    }
}

/// Blocks of the local buffer held for one call's heap pieces; returned on drop.
pub struct Bounce<'a> {
    carver: &'a Carver,
    blocks: Vec<Block>,
}

impl Bounce<'_> {
    /// The block of piece `i` (in the order asked), on the wire.
    pub fn mem(&self, i: usize, len: u64) -> Mem {
        Mem { region: self.carver.region.id, offset: self.blocks[i].offset, len }
    }

    /// The block of piece `i` in this process.
    pub fn addr(&self, i: usize) -> u64 {
        self.carver.region.mem.addr() + self.blocks[i].offset
    }
}

impl Drop for Bounce<'_> {
    fn drop(&mut self) {
        let mut alloc = self.carver.alloc.lock();
        for b in self.blocks.drain(..) {
            alloc.release(b);
        }
        self.carver.freed.notify_all();
    }
}

/// All memory of a dummy client that its calls may name: shared regions (the pool, the
/// local buffer, dedicated allocations) and registered heap buffers, by address.
pub struct Memory {
    regions: RwLock<Vec<Arc<Region>>>,
    next_id: AtomicU32,
    pool: Option<Carver>,
    /// Blocks of the pool handed out, by address.
    pool_blocks: Mutex<HashMap<u64, Block>>,
    local: Option<Carver>,
    heap: Mutex<BTreeMap<u64, u64>>,
}

impl Memory {
    /// The pool (`pool_size` bytes) and the local buffer (`local_size`), either may be 0.
    pub fn new(pool_size: u64, local_size: u64) -> Result<Memory> {
        let m = Memory {
            regions: RwLock::new(Vec::new()),
            next_id: AtomicU32::new(1),
            pool: None,
            pool_blocks: Mutex::new(HashMap::new()),
            local: None,
            heap: Mutex::new(BTreeMap::new()),
        };
        let pool = (pool_size > 0).then(|| m.new_region(pool_size)).transpose()?.map(Carver::new);
        let local = (local_size > 0).then(|| m.new_region(local_size)).transpose()?.map(Carver::new);
        Ok(Memory { pool, local, ..m })
    }

    /// A new shareable region of `len` bytes (not yet shared).
    fn new_region(&self, len: u64) -> Result<Arc<Region>> {
        let mem = SharedMemory::allocate(len, "crescent-dummy")
            .map_err(|e| StoreError::Engine(crescent_engine::EngineError::from(e)))?;
        if !mem.sealed() {
            return Err(StoreError::system(
                format!("sharing {len} bytes with the standalone client"),
                std::io::Error::other("the kernel cannot seal the memfd against resizing"),
            ));
        }
        let region = Arc::new(Region { id: self.next_id.fetch_add(1, Ordering::Relaxed), mem });
        self.regions.write().push(region.clone());
        Ok(region)
    }

    /// Every shared region (to share again after a reconnection).
    pub fn regions(&self) -> Vec<Arc<Region>> {
        self.regions.read().clone()
    }

    /// `len` bytes of the pool, or, when the pool has no room, a region of their own; the
    /// second value is that new region, to share.
    pub fn alloc(&self, len: u64) -> Result<(u64, Option<Arc<Region>>)> {
        if len == 0 {
            return Err(StoreError::invalid("cannot allocate 0 bytes"));
        }
        if let Some(pool) = &self.pool {
            if let Some(block) = pool.alloc.lock().allocate(len) {
                let addr = pool.region.mem.addr() + block.offset;
                self.pool_blocks.lock().insert(addr, block);
                return Ok((addr, None));
            }
        }
        let region = self.new_region(len)?;
        Ok((region.mem.addr(), Some(region)))
    }

    /// Frees what [`Self::alloc`] returned at `addr`; the region to unshare, if it had one of
    /// its own.
    pub fn free(&self, addr: u64) -> Result<Option<Arc<Region>>> {
        if let (Some(pool), Some(block)) = (&self.pool, self.pool_blocks.lock().remove(&addr)) {
            pool.alloc.lock().release(block);
            return Ok(None);
        }
        let fixed =
            [self.pool.as_ref(), self.local.as_ref()].into_iter().flatten().map(|c| c.region.id).collect::<Vec<_>>();
        let mut regions = self.regions.write();
        match regions.iter().position(|r| r.mem.addr() == addr && !fixed.contains(&r.id)) {
            Some(i) => Ok(Some(regions.remove(i))),
            None => Err(StoreError::invalid(format!("{addr:#x} was not allocated with alloc_from_mem_pool"))),
        }
    }

    /// Registers memory not allocated through the API (bounced through the local buffer);
    /// memory in a shared region needs nothing.
    pub fn register(&self, addr: u64, len: u64) -> Result<()> {
        if len == 0 || addr.checked_add(len).is_none() {
            return Err(StoreError::invalid(format!("cannot register [{addr:#x}, +{len})")));
        }
        if self.regions.read().iter().any(|r| r.contains(addr, len)) {
            return Ok(());
        }
        let mut heap = self.heap.lock();
        let overlaps = heap.range(..addr.saturating_add(len)).next_back().is_some_and(|(&a, &n)| a + n > addr);
        if overlaps {
            return Err(StoreError::invalid(format!("[{addr:#x}, +{len}) overlaps a registered buffer")));
        }
        heap.insert(addr, len);
        Ok(())
    }

    /// Unregisters the heap buffer registered at `addr`; memory of a shared region needs no
    /// unregistering (it succeeds). Anything else is [`StoreError::NotRegistered`].
    pub fn unregister(&self, addr: u64) -> Result<()> {
        if self.heap.lock().remove(&addr).is_some() || self.regions.read().iter().any(|r| r.contains(addr, 1)) {
            return Ok(());
        }
        Err(StoreError::NotRegistered { addr, len: 0 })
    }

    /// Where `[addr, +len)` is.
    pub fn locate(&self, addr: u64, len: u64) -> Result<Loc> {
        if let Some(r) = self.regions.read().iter().find(|r| r.contains(addr, len)) {
            return Ok(Loc::Shared(Mem { region: r.id, offset: addr - r.mem.addr(), len }));
        }
        let heap = self.heap.lock();
        let inside = heap
            .range(..=addr)
            .next_back()
            .is_some_and(|(&a, &n)| addr.checked_add(len).is_some_and(|end| end <= a + n));
        if inside {
            Ok(Loc::Heap)
        } else {
            Err(StoreError::NotRegistered { addr, len })
        }
    }

    /// Blocks of the local buffer for pieces of `lens` bytes, all at once (so that two calls
    /// never each hold part of what they need), waiting for room until `deadline`.
    pub fn bounce(&self, lens: &[u64], deadline: Instant) -> Result<Bounce<'_>> {
        let Some(local) = &self.local else {
            return Err(StoreError::invalid(
                "memory registered with register_buffer (not from alloc_from_mem_pool) passes through the local \
                 buffer, and this dummy client has none: give setup_dummy a local_buffer_size",
            ));
        };
        let total: u64 = lens.iter().sum();
        let capacity = local.region.mem.len();
        if total > capacity {
            return Err(StoreError::invalid(format!(
                "{total} bytes of registered heap memory in one call exceed the local buffer ({capacity} bytes): \
                 use memory from alloc_from_mem_pool, or a larger local_buffer_size"
            )));
        }
        let start = Instant::now();
        let mut alloc = local.alloc.lock();
        loop {
            let mut blocks = Vec::with_capacity(lens.len());
            for &len in lens {
                match alloc.allocate(len.max(1)) {
                    Some(b) => blocks.push(b),
                    None => break,
                }
            }
            if blocks.len() == lens.len() {
                return Ok(Bounce { carver: local, blocks });
            }
            for b in blocks {
                alloc.release(b);
            }
            if local.freed.wait_until(&mut alloc, deadline).timed_out() {
                return Err(StoreError::TimedOut {
                    waited: Waited::Staging { len: total },
                    after: deadline.saturating_duration_since(start),
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn memory_is_shared_registered_or_refused() {
        let m = Memory::new(1 << 20, 64 << 10).unwrap();
        let (a, own) = m.alloc(4096).unwrap();
        assert!(own.is_none(), "carved from the pool");
        let Loc::Shared(mem) = m.locate(a + 10, 100).unwrap() else { panic!("pool memory is shared") };
        assert_eq!(mem.len, 100);
        let (big, own) = m.alloc(2 << 20).unwrap();
        assert!(own.is_some(), "beyond the pool: a region of its own");
        assert!(matches!(m.locate(big, 2 << 20).unwrap(), Loc::Shared(_)));
        let heap = vec![0u8; 1000];
        let h = heap.as_ptr() as u64;
        assert!(matches!(m.locate(h, 10), Err(StoreError::NotRegistered { .. })));
        m.register(h, 1000).unwrap();
        assert_eq!(m.locate(h + 10, 990).unwrap(), Loc::Heap);
        assert!(m.locate(h + 10, 991).is_err(), "past the registered buffer");
        assert!(m.register(h + 500, 10).is_err(), "overlap");
        m.unregister(h).unwrap();
        assert!(m.locate(h, 10).is_err());
        assert!(m.free(big).unwrap().is_some());
        assert!(m.free(a).unwrap().is_none());
        assert!(m.free(a).is_err(), "freed twice");
    }

    #[test]
    fn bounces_take_all_their_blocks_or_wait_for_them() {
        let m = Memory::new(0, 64 << 10).unwrap();
        let soon = || Instant::now() + Duration::from_millis(100);
        let held = m.bounce(&[40 << 10], soon()).unwrap();
        assert!(matches!(m.bounce(&[8 << 10, 30 << 10], soon()), Err(StoreError::TimedOut { .. })));
        drop(held);
        let b = m.bounce(&[8 << 10, 30 << 10], soon()).unwrap();
        assert_ne!(b.addr(0), b.addr(1));
        let e = m.bounce(&[65 << 10], soon()).err().expect("too large");
        assert!(e.to_string().contains("exceed the local buffer"), "{e}");
        assert!(Memory::new(0, 0).unwrap().bounce(&[1], soon()).is_err());
    }
}
