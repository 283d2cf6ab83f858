//! A fill in progress ([`Fill`]): the blocks reserved for one object, written by the get that
//! missed or by the filler, then published.

use std::mem::MaybeUninit;
use std::sync::Arc;

use super::blocks::Blocks;
use super::{Flight, Identity, Inner};
use crate::client::checksum::{self, Checksums};

/// Blocks reserved for one object being read, and the flight other gets of it wait for;
/// published into the cache by [`HotCache::publish`](super::HotCache::publish), or given back when dropped (the waiting
/// gets then read the object themselves).
pub struct Fill {
    pub(super) key: String,
    pub(super) id: Identity,
    /// Taken when published.
    pub(super) blocks: Option<Blocks>,
    pub(super) flight: Arc<Flight>,
    pub(super) inner: Arc<Inner>,
    /// With checksums on, for a fill the deferred filler makes: the object's checksum, which
    /// the blocks must match before they are entered, and the counters a mismatch goes to.
    pub(super) verify: Option<(u32, Arc<Checksums>)>,
}

impl Fill {
    /// Makes the deferred filler check the blocks it read against `expected` (the object's
    /// checksum) before it enters them; a mismatch drops the fill and is counted in `checks`.
    pub fn verify_with(&mut self, expected: u32, checks: Arc<Checksums>) {
        self.verify = Some((expected, checks));
    }

    /// Whether the blocks hold what the fill's checksum (if any) says: true without one.
    pub(super) fn matches_checksum(&self) -> bool {
        let Some((expected, checks)) = &self.verify else { return true };
        let got = checksum::of_parts(self.blocks().slices());
        checks.judge(&self.key, *expected, got).is_ok()
    }

    pub(super) fn blocks(&self) -> &Blocks {
        self.blocks.as_ref().expect("a fill holds its blocks until published")
    }

    /// `(offset in the object, address, length)` of the places in the registered blocks the
    /// object's bytes go to, in order, each at most `most` bytes (none crosses a block): the
    /// transfers that fill it.
    pub fn chunks(&self, most: u64) -> Vec<(u64, u64, u64)> {
        let most = most.max(1);
        let mut out = Vec::new();
        for (off, addr, len) in self.blocks().pieces() {
            let mut at = 0;
            while at < len {
                let n = most.min(len - at);
                out.push((off + at, addr + at, n));
                at += n;
            }
        }
        out
    }

    /// The object's size.
    pub fn size(&self) -> u64 {
        self.id.size
    }

    /// Copies the object's bytes `[from, from + dst.len())` out, once the transfers into that
    /// range of [`Self::chunks`] have ended (those into the rest may still run). With
    /// non-temporal stores (see [`stream_copy`](super::stream_copy)): the destination is a fresh result, which
    /// the caches could not hold whole at the sizes where that matters.
    pub fn copy_range_to(&self, from: u64, dst: &mut [MaybeUninit<u8>]) {
        self.blocks().copy_range_to(from, dst, true)
    }

    /// Copies the object's bytes in from where the get put them (`src`: the whole object, read
    /// for the caller).
    pub fn copy_from(&mut self, src: &[u8]) {
        self.copy_range_from(0, src)
    }

    /// Copies the object's bytes `[from, from + src.len())` in from where the get put them (a
    /// get into several buffers fills the entry piece by piece).
    pub fn copy_range_from(&mut self, from: u64, src: &[u8]) {
        self.blocks.as_mut().expect("a fill holds its blocks until published").copy_range_from(from, src)
    }
}

impl Drop for Fill {
    fn drop(&mut self) {
        if self.blocks.is_some() {
            // Not published: the gets waiting for this fetch read the object themselves.
            self.flight.finish(None);
            self.inner.flights.remove_if(&self.key, |_, f| Arc::ptr_eq(f, &self.flight));
        }
    }
}
