//! The cache's memory: one registered region cut into blocks, and an object's blocks
//! ([`Blocks`]) with the copies in and out of them.

use std::mem::MaybeUninit;
use std::sync::Arc;

use parking_lot::Mutex;

use crescent_engine::RegisteredMemory;

use super::{stream_copy, value_buffer};

/// The registered memory, cut into blocks, and the free list.
pub(super) struct Region {
    pub(super) mem: RegisteredMemory,
    pub(super) block_size: u64,
    pub(super) free: Mutex<Vec<u32>>,
}

/// Blocks owned by one fill or one entry, holding `len` bytes of an object in order; they go
/// back to the free list when dropped.
pub(super) struct Blocks {
    pub(super) region: Arc<Region>,
    pub(super) ids: Vec<u32>,
    pub(super) len: u64,
}

impl Blocks {
    /// `(offset in the object, address, length)` of each block's part of the object.
    pub(super) fn pieces(&self) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
        let b = self.region.block_size;
        self.ids.iter().enumerate().map(move |(i, &id)| {
            let off = i as u64 * b;
            (off, self.region.mem.addr() + id as u64 * b, b.min(self.len - off))
        })
    }

    /// The object's bytes, block by block.
    ///
    /// Callers hold the blocks exclusively (a fill whose transfers have ended) or through an
    /// entry (whose bytes never change once published).
    pub(super) fn slices(&self) -> impl Iterator<Item = &[u8]> + '_ {
        self.pieces().map(|(_, addr, len)| {
            // SAFETY: inside the cache's registered mapping (block id < block count, len <= the
            // block size), which lives as long as `self.region`. These blocks belong to this
            // value alone: nothing writes them while it lives (a fill's transfers have ended
            // before its bytes are read, an entry is never written after it is published).
            unsafe { std::slice::from_raw_parts(addr as *const u8, len as usize) }
        })
    }

    pub(super) fn copy_to(&self, dst: &mut [u8]) {
        // SAFETY: the same layout, and only initialised bytes are written through it (below),
        // so `dst` stays initialised.
        self.copy_range_to(0, unsafe { &mut *(dst as *mut [u8] as *mut [MaybeUninit<u8>]) }, false)
    }

    /// Copies the object's bytes `[from, from + dst.len())` out. Only that range is read, so
    /// transfers into the rest of the blocks may still be running. `stream`: with
    /// non-temporal stores (see [`stream_copy`]), for a destination not read soon.
    pub(super) fn copy_range_to(&self, from: u64, dst: &mut [MaybeUninit<u8>], stream: bool) {
        let end = from + dst.len() as u64;
        for (off, addr, len) in self.pieces() {
            let (lo, hi) = (off.max(from), (off + len).min(end));
            if lo >= hi {
                continue;
            }
            // SAFETY: inside the cache's registered mapping (see `slices`), in blocks that
            // belong to this value alone; the transfers into [lo, hi) have ended (the caller's
            // contract) and nothing else writes there.
            let src = unsafe { std::slice::from_raw_parts((addr + lo - off) as *const u8, (hi - lo) as usize) };
            let dst = &mut dst[(lo - from) as usize..(hi - from) as usize];
            if stream {
                stream_copy::copy_streaming(dst, src);
            } else {
                dst.write_copy_of_slice(src);
            }
        }
    }

    pub(super) fn to_vec(&self) -> Vec<u8> {
        let mut out = value_buffer::with_capacity(self.len as usize);
        for s in self.slices() {
            out.extend_from_slice(s);
        }
        out
    }

    /// Writes the object's bytes `[from, from + src.len())` into the blocks, with
    /// non-temporal stores (see [`stream_copy`]): nothing reads them before a later hit.
    ///
    /// `&mut self`: only a fill, which owns its blocks exclusively and whose transfers have
    /// ended, writes them.
    pub(super) fn copy_range_from(&mut self, from: u64, src: &[u8]) {
        let end = (from + src.len() as u64).min(self.len);
        for (off, addr, len) in self.pieces() {
            let (lo, hi) = (off.max(from), (off + len).min(end));
            if lo >= hi {
                continue;
            }
            // SAFETY: inside the cache's registered mapping (see `slices`); these blocks belong
            // to this fill alone and no transfer into them is running.
            let dst = unsafe {
                std::slice::from_raw_parts_mut((addr + lo - off) as *mut MaybeUninit<u8>, (hi - lo) as usize)
            };
            stream_copy::copy_streaming(dst, &src[(lo - from) as usize..(hi - from) as usize]);
        }
    }
}

impl Drop for Blocks {
    fn drop(&mut self) {
        self.region.free.lock().append(&mut self.ids);
    }
}
