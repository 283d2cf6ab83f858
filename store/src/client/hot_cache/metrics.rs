//! What the cache counts ([`HotCacheMetrics`]) and its counters.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// What the cache did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HotCacheMetrics {
    /// Blocks the cache has (fixed at its start).
    pub blocks: u64,
    /// Bytes of one block.
    pub block_size: u64,
    /// Objects in the cache now.
    pub entries: u64,
    /// Blocks not on the free list (held by entries or by fills in progress).
    pub blocks_in_use: u64,
    /// Gets of remote objects served from the cache.
    pub hits: u64,
    /// Gets of remote objects that were not (or no longer validly) in the cache.
    pub misses: u64,
    /// Objects put into the cache.
    pub fills: u64,
    /// Fills given up: queue full, no block free, fetch failed or too late.
    pub dropped_fills: u64,
    /// Entries evicted to make room.
    pub evictions: u64,
    /// Bytes copied to callers out of the cache.
    pub bytes_served: u64,
    /// Misses served by another get's fetch of the same object (single flight) instead of a
    /// transfer of their own.
    pub merged: u64,
    /// Fills handed to the deferred filler.
    pub deferred_fills: u64,
    /// Deferred fills a repeat miss took over (and filled inline) before the filler began them.
    pub taken_over: u64,
    /// Times the filler waited, before a piece, for this client's own reads to end.
    pub filler_waits: u64,
    /// Hits whose bytes were copied while the master answered (a zero-copy batch get copies
    /// the entry it holds for a key before the answer confirms it; see [`HotCache::peek`](super::HotCache::peek)).
    pub early_copies: u64,
    /// Such copies the answer did not confirm (the object changed or went): the get then read
    /// the object as it would have, over the copy.
    pub early_copies_wasted: u64,
}

impl std::fmt::Display for HotCacheMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "hits={} early_copies={} early_copies_wasted={} misses={} merged={} fills={} deferred={} taken_over={} filler_waits={} dropped_fills={} evictions={} bytes_served={} entries={} blocks_in_use={}/{}",
            self.hits,
            self.early_copies,
            self.early_copies_wasted,
            self.misses,
            self.merged,
            self.fills,
            self.deferred_fills,
            self.taken_over,
            self.filler_waits,
            self.dropped_fills,
            self.evictions,
            self.bytes_served,
            self.entries,
            self.blocks_in_use,
            self.blocks
        )
    }
}

#[derive(Default)]
pub(super) struct Counters {
    pub(super) hits: AtomicU64,
    pub(super) misses: AtomicU64,
    pub(super) fills: AtomicU64,
    pub(super) dropped: AtomicU64,
    pub(super) evictions: AtomicU64,
    pub(super) bytes_served: AtomicU64,
    pub(super) merged: AtomicU64,
    pub(super) deferred: AtomicU64,
    pub(super) taken_over: AtomicU64,
    pub(super) filler_waits: AtomicU64,
    pub(super) early_copies: AtomicU64,
    pub(super) early_copies_wasted: AtomicU64,
    pub(super) local_reads: AtomicU64,
    pub(super) said_all_local: AtomicBool,
}

pub(super) fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}
