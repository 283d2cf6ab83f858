//! The client's local hot cache: objects read from a remote replica are kept in blocks of
//! registered memory, so that later gets of the same object are served locally.
//!
//! * **Memory.** `floor(LOCAL_HOT_CACHE_SIZE / LOCAL_HOT_BLOCK_SIZE)` blocks, allocated and
//!   registered once (one region) when the client starts. An object takes
//!   `ceil(size / block)` blocks (they need not be adjacent): objects larger than a block span
//!   several; objects larger than the whole cache are not cached.
//! * **Candidates.** Only objects read from a replica in another segment: a local replica is a
//!   memcpy away already.
//! * **Coherence.** An entry remembers the identity the master gave the object — version
//!   (which changes whenever the key is put again), size, and the replica it was read from. A
//!   hit still asks the master for the replica list (that is the version check, and it renews
//!   the read lease) and only skips the data transfer; an entry whose identity no longer
//!   matches is dropped, never served. A zero-copy batch get copies the entries it finds
//!   while the master answers ([`HotCache::peek`], an early copy) and keeps a copy only when
//!   the answer has the identity it copied.
//! * **Blocks in use.** A [`Guard`] holds an entry while its bytes are copied out. An entry
//!   that is held is never evicted, and its blocks go back to the free list only after the
//!   last holder lets go, even when the entry was invalidated meanwhile; so a block being read
//!   is never overwritten by a fill.
//! * **Fills** are made in one of two ways ([`FillMode`], setting `LOCAL_HOT_CACHE_FILL`);
//!   the default, **auto**, picks one per miss by how the link compares with a memory copy
//!   (`fill_choice`): inline while the copy adds at most a tenth to the client's remote
//!   reads, deferred beyond.
//!   * **Deferred**: a get that misses does exactly what it does without the cache
//!     (the same transfer into the caller's memory or its fresh result, no copy into the
//!     cache) and hands the fill, with blocks reserved for it, to a background **filler**
//!     thread, which later reads the replica again into those blocks with the engine (on RDMA
//!     a one-sided read the NIC does; on TCP the peer sends it again) and enters it. So the
//!     object crosses the network twice, but the second time off the get's critical path.
//!     The filler keeps these rules:
//!     1. *Off the critical path*: it reads in pieces of 2 MiB and, before each, waits (on a
//!        condition variable, no spinning) while any remote read of this client's own is in
//!        flight ([`HotCache::foreground`], held around every remote transfer of a get), and
//!        until none has been for longer than the client's usual gaps between reads
//!        (`idle_gaps`). It holds no lock a get needs while it transfers.
//!     2. *A repeat miss does not wait for idleness*: a get that misses a key whose deferred
//!        fill is still queued takes it over and fills inline (below); one that finds it
//!        started joins it (single flight), and from then on the filler no longer yields for
//!        that fill, so a waiting get and a yielding filler never wait for each other.
//!     3. *Bounded*: its queue has the fill queue's size (one slot per block, at most
//!        [`MAX_FILL_QUEUE`]); when full the fill is dropped (counted in `dropped_fills`),
//!        never waited for. The blocks of a dropped or failed fill go back. The read lease is
//!        checked after the filler's transfer, as an inline fill checks it after the get's:
//!        a fill whose lease ran out is dropped.
//!     4. *Invalidation*: the client's own put or remove of the key ([`HotCache::invalidate`])
//!        voids a queued or running fill of it: it is never entered (and a later hit would
//!        still have to match the master's identity of the object, as every hit does).
//!     5. *Shutdown*: [`HotCache::close`] (the client's `close`) drops the queued fills,
//!        abandons the running one before its next piece, and joins the thread.
//!   * **Inline**: every fill is made of the bytes the get itself brought;
//!     nothing is read from the network twice, at the cost of one more copy of the value
//!     inside the get. A byte get (`get`, `get_batch`) that misses lands the remote bytes directly in blocks
//!     reserved for the fill (instead of the staging buffer) and copies them to the caller
//!     from there: the same transfer and the same one copy as without the cache.
//!     A zero-copy get (`get_into`, `batch_get_into`) reads straight into the caller's memory
//!     as before and, once its transfers have ended, copies the bytes from there into the
//!     reserved blocks (one memcpy before the call returns: the caller owns its buffer
//!     afterwards). The copies into the blocks, and a byte get's copy out to its fresh result,
//!     use non-temporal stores ([`stream_copy`]): the destination is not read soon, and a
//!     plain `memcpy` reads every cold line before writing it. (A deferred fill taken over
//!     by a repeat miss is filled this way.) A hit's copy does too once it is larger than
//!     the caches would keep of it ([`stream_copy::HIT_STREAM_FROM`]).
//!
//!   Entering the filled object into the index goes through a bounded queue served by one
//!   worker thread; the queue has one slot per block (at most [`MAX_FILL_QUEUE`]) and every
//!   queued fill holds a block, so it does not overflow below that size; when it is full the
//!   fill is dropped (counted), never waited for. Reserving blocks never waits either: when
//!   every block is held or reserved, the fill is dropped.
//! * **Single flight.** While one get is fetching an object into the cache, other gets of the
//!   same object (same identity) do not fetch it again: they wait for that fetch and copy from
//!   its blocks (counted as `merged`); if it fails, or takes longer than half the read lease,
//!   they read the replica themselves.
//! * **Recency.** The index is a sharded map (`dashmap`); a hit takes one shard's lock and
//!   records the access in a bounded lock-free buffer. The order of use is kept by an
//!   `lru::LruCache`, updated from that buffer by whoever evicts (a miss reserving blocks) and
//!   by the worker; no lock is shared by all hits. Eviction takes the least recently used entry
//!   that nobody holds. Optional admission ([`Admission::SecondAccess`]) caches a key only on
//!   its second miss while it is remembered in a bounded ghost list.

mod blocks;
mod config;
mod fill;
mod fill_choice;
mod filler;
mod idle_gaps;
mod metrics;
pub mod stream_copy;
#[cfg(test)]
mod tests;
pub(crate) mod value_buffer;

use std::mem::MaybeUninit;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, Sender, TrySendError};
use dashmap::DashMap;
use lru::LruCache;
use parking_lot::{Condvar, Mutex};

use crescent_engine::TransferEngine;

use blocks::{Blocks, Region};
pub use config::{Admission, FillMode, HotCacheSettings, Layout, Resolved, SizeSetting};
pub use fill::Fill;
use fill_choice::FillChoice;
use idle_gaps::IdleGaps;
pub use metrics::HotCacheMetrics;
use metrics::{bump, Counters};

use crate::proto::{GetReplicaListReply, ReplicaDescriptor, ReplicaStatus};

/// Bytes the deferred filler reads at a time, checking for the client's own reads before each.
pub const FILL_PIECE: u64 = 2 << 20;

/// The most fills waiting for the worker (the queue has one slot per block up to this); more
/// are dropped.
pub const MAX_FILL_QUEUE: usize = 4096;
/// Hits whose recency is buffered before the order of use is updated.
const TOUCH_BUFFER: usize = 4096;
/// Local reads, with no remote one, after which the client says the cache gains it nothing.
const ALL_LOCAL_NOTICE: u64 = 100;

/// What the master said an object is: an entry serves a get only while this still holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The object's version (a new put of the key is a new version).
    pub version: u64,
    /// The object's size, in bytes.
    pub size: u64,
    /// The replica the bytes came from.
    pub segment: String,
    /// The replica's address in that segment (the engine's `target_offset`).
    pub address: u64,
}

impl Identity {
    /// The identity of the object `list` describes, read from `replica` (one of its replicas).
    pub fn of(list: &GetReplicaListReply, replica: &ReplicaDescriptor) -> Self {
        Identity {
            version: list.version,
            size: list.size,
            segment: replica.segment_name.clone(),
            address: replica.address,
        }
    }

    /// Whether `list` (a fresh answer of the master) describes the same object.
    pub fn matches(&self, list: &GetReplicaListReply) -> bool {
        list.version == self.version
            && list.size == self.size
            && list.replicas.iter().any(|r| {
                r.status == ReplicaStatus::Complete as i32
                    && r.segment_name == self.segment
                    && r.address == self.address
            })
    }
}

struct Entry {
    id: Identity,
    blocks: Blocks,
}

/// Order of use of the resident keys, and the ghost list of keys missed once.
struct Policy {
    recency: LruCache<String, ()>,
    ghost: LruCache<String, ()>,
}

/// One get's fetch of an object into the cache, which other gets of the same object wait for.
struct Flight {
    id: Identity,
    /// `None` while the fetch runs; then the entry, or `None` when the fetch failed.
    landed: Mutex<Option<Option<Arc<Entry>>>>,
    cv: Condvar,
    /// A deferred fill's job while it waits in the filler's queue: a repeat miss takes its
    /// fill over from there. (Weak: the queue owns the job.)
    parked: Mutex<Weak<Deferred>>,
    /// A get waits for this fetch: the filler no longer yields to the client's reads for it.
    urgent: AtomicBool,
    /// The key was invalidated (the client's own put or remove) during the fetch: its bytes
    /// are never entered.
    void: AtomicBool,
}

impl Flight {
    fn new(id: Identity) -> Self {
        Flight {
            id,
            landed: Mutex::new(None),
            cv: Condvar::new(),
            parked: Mutex::new(Weak::new()),
            urgent: AtomicBool::new(false),
            void: AtomicBool::new(false),
        }
    }

    /// The fill of this flight's deferred job, if it is still queued (not begun by the filler).
    fn take_parked(&self) -> Option<Fill> {
        let job = self.parked.lock().upgrade()?;
        let fill = job.fill.lock().take();
        fill
    }

    fn finish(&self, entry: Option<Arc<Entry>>) {
        let mut landed = self.landed.lock();
        if landed.is_none() {
            *landed = Some(entry);
        }
        self.cv.notify_all();
    }
}

struct Inner {
    region: Arc<Region>,
    blocks: u32,
    admission: Admission,
    index: DashMap<String, Arc<Entry>>,
    /// Fetches into the cache in progress, by key (single flight).
    flights: DashMap<String, Arc<Flight>>,
    policy: Mutex<Policy>,
    touch_tx: Sender<String>,
    touch_rx: Receiver<String>,
    counters: Counters,
    /// Jobs queued or running (the worker's and the filler's).
    pending: AtomicU64,
    fill_mode: FillMode,
    /// How [`FillMode::Auto`] fills each miss (`None` in the other modes, or when the cache is
    /// too small to measure a copy: then inline).
    choice: Option<FillChoice>,
    /// Remote reads of this client's own in flight (deferred and auto modes): the filler
    /// waits for none, for the grace its gaps give ([`idle_gaps`]), before each piece.
    foreground: Mutex<Busy>,
    /// Signalled when `foreground` drops to 0, a get joins a deferred fill, or the cache closes.
    idle: Condvar,
    /// Set by [`HotCache::close`]: the filler drops what it has.
    closing: AtomicBool,
}

/// A fill handed to the filler: the reserved blocks (taken by the filler when it begins, or by
/// a repeat miss before that) and when the lease of the get's replica list ends (the filler's
/// read must end before; `None`: no lease stated).
struct Deferred {
    fill: Mutex<Option<Fill>>,
    lease_end: Option<Instant>,
}

impl Deferred {
    fn lease_held(&self) -> std::result::Result<(), String> {
        match self.lease_end {
            Some(end) if Instant::now() >= end => Err("the read lease ran out".into()),
            _ => Ok(()),
        }
    }
}

/// The client's own remote reads in flight, since when there has been none, and the last
/// gaps between them.
struct Busy {
    reads: usize,
    idle_since: Instant,
    /// Whether any read was seen (the time before the first is no gap).
    read_before: bool,
    gaps: IdleGaps,
}

/// Stands for a remote read of the client in flight while held (see [`HotCache::foreground`]).
pub struct Foreground<'a> {
    inner: Option<&'a Inner>,
}

impl Drop for Foreground<'_> {
    fn drop(&mut self) {
        if let Some(inner) = self.inner {
            let mut busy = inner.foreground.lock();
            busy.reads -= 1;
            if busy.reads == 0 {
                busy.idle_since = Instant::now();
                inner.idle.notify_all();
            }
        }
    }
}

/// What a get that missed does about the cache.
pub enum Miss {
    /// Read the object into this fill's blocks (or into the caller's memory, then
    /// [`Fill::copy_from`]) and publish it.
    Lead(Fill),
    /// Read the object as without the cache, then hand this fill to the filler
    /// ([`HotCache::defer`]) once the read succeeded within its lease.
    Defer(Fill),
    /// Another get is fetching the same object: wait for it ([`HotCache::wait`]).
    Join(Joined),
    /// Not cached (not admitted, too large, or no block free); read as without the cache.
    Skip,
}

/// A get waiting for another get's fetch of the same object.
pub struct Joined {
    flight: Arc<Flight>,
    patience: Duration,
}

/// Holds an entry while its bytes are read: the entry is not evicted and its blocks are not
/// reused until the guard is dropped.
pub struct Guard<'a> {
    entry: Arc<Entry>,
    counters: &'a Counters,
}

impl Guard<'_> {
    /// The object's size, in bytes.
    pub fn size(&self) -> u64 {
        self.entry.blocks.len
    }

    /// What the master said the object was when the entry was filled.
    pub fn identity(&self) -> &Identity {
        &self.entry.id
    }

    /// Copies the object into `dst` (at least [`Self::size`] bytes).
    pub fn copy_to(&self, dst: &mut [u8]) {
        self.entry.blocks.copy_to(dst);
        bump(&self.counters.bytes_served, self.size());
    }

    /// Copies the object's bytes `[from, from + dst.len())` into `dst`; with non-temporal
    /// stores from [`stream_copy::HIT_STREAM_FROM`] bytes (see [`stream_copy::streams_hit`]).
    pub fn copy_range_to(&self, from: u64, dst: &mut [MaybeUninit<u8>]) {
        self.copy_range_early(from, dst);
        bump(&self.counters.bytes_served, dst.len() as u64);
    }

    /// [`Self::copy_range_to`] for an early copy (see [`HotCache::peek`]): counted as served
    /// only when [`Self::confirm_early_copy`] is.
    pub fn copy_range_early(&self, from: u64, dst: &mut [MaybeUninit<u8>]) {
        self.entry.blocks.copy_range_to(from, dst, stream_copy::streams_hit(dst.len()));
    }

    /// Counts an early copy of `bytes` of this entry that the master's answer confirmed: the
    /// get's hit (this guard, from [`HotCache::lookup`]) need not copy again.
    pub fn confirm_early_copy(&self, bytes: u64) {
        bump(&self.counters.early_copies, 1);
        bump(&self.counters.bytes_served, bytes);
    }

    /// The object's bytes, copied into a new vector.
    pub fn to_vec(&self) -> Vec<u8> {
        bump(&self.counters.bytes_served, self.size());
        self.entry.blocks.to_vec()
    }
}

/// An object whose bytes have landed, to be put into the index; its flight ends (leaves the
/// map) once it is there.
struct Job {
    key: String,
    entry: Arc<Entry>,
    flight: Arc<Flight>,
}

/// The hot cache of one client.
pub struct HotCache {
    inner: Arc<Inner>,
    jobs: Option<Sender<Job>>,
    worker: Option<JoinHandle<()>>,
    /// The filler's queue and thread (deferred mode); taken by [`Self::close`].
    deferred: Mutex<Option<Sender<Arc<Deferred>>>>,
    filler: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for HotCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HotCache({} x {} bytes)", self.inner.blocks, self.inner.region.block_size)
    }
}

impl HotCache {
    /// Starts the cache the settings ask for: `None` when they disable it (logging the one
    /// warning that names an unusable value) or when its memory cannot be had.
    pub fn start(engine: &Arc<TransferEngine>, settings: &HotCacheSettings) -> Option<HotCache> {
        match settings.resolve() {
            Resolved::Disabled { warning: None } => None,
            Resolved::Disabled { warning: Some(w) } => {
                tracing::warn!("{w}");
                None
            }
            Resolved::Enabled(layout) => match Self::with_layout(engine, layout) {
                Ok(cache) => {
                    tracing::info!(
                        "local hot cache enabled: {} blocks of {} bytes ({} bytes registered), admission {:?}, \
                         fill {:?}; it keeps objects read from other clients' replicas (a client whose data is \
                         all local gains nothing from it)",
                        layout.blocks,
                        layout.block_size,
                        layout.blocks as u64 * layout.block_size,
                        layout.admission,
                        layout.fill
                    );
                    Some(cache)
                }
                Err(e) => {
                    tracing::warn!(
                        "local hot cache disabled: cannot allocate {} blocks of {} bytes: {e}",
                        layout.blocks,
                        layout.block_size
                    );
                    None
                }
            },
        }
    }

    /// A cache of exactly this layout.
    pub fn with_layout(engine: &Arc<TransferEngine>, layout: Layout) -> crate::Result<HotCache> {
        let len = layout.blocks as u64 * layout.block_size;
        let mem = engine.alloc_registered(len, "cpu:0")?;
        // Fault every page in now: the blocks are meant to stay resident, and first-touch faults
        // would otherwise slow down the first fills' transfers (measured: up to 2.5x on a
        // fast link).
        let started = Instant::now();
        for at in (0..len).step_by(4096) {
            // SAFETY: inside the mapping just allocated; nothing else uses it yet.
            unsafe { std::ptr::write_volatile((mem.addr() + at) as *mut u8, 0) };
        }
        tracing::debug!("hot cache: {len} bytes faulted in in {:?}", started.elapsed());
        let choice = match layout.fill {
            FillMode::Auto => {
                // SAFETY: inside the mapping just allocated and faulted in; nothing else uses
                // it yet (the calibration's copies overwrite bytes no entry holds).
                let blocks =
                    unsafe { std::slice::from_raw_parts_mut(mem.addr() as *mut MaybeUninit<u8>, len as usize) };
                let choice = FillChoice::calibrate(blocks);
                match &choice {
                    Some(c) => tracing::debug!("hot cache: streaming copies at {:.1} GB/s", c.copy_rate() / 1e9),
                    None => tracing::debug!("hot cache: too small to measure a copy; misses fill inline"),
                }
                choice
            }
            FillMode::Inline | FillMode::Deferred => None,
        };
        let region = Arc::new(Region {
            mem,
            block_size: layout.block_size,
            // Popped from the end: blocks are handed out from the start of the region.
            free: Mutex::new((0..layout.blocks).rev().collect()),
        });
        let ghost = NonZeroUsize::new((layout.blocks as usize * 4).max(256)).expect("non-zero");
        let (touch_tx, touch_rx) = bounded(TOUCH_BUFFER);
        let inner = Arc::new(Inner {
            region,
            blocks: layout.blocks,
            admission: layout.admission,
            index: DashMap::new(),
            flights: DashMap::new(),
            policy: Mutex::new(Policy { recency: LruCache::unbounded(), ghost: LruCache::new(ghost) }),
            touch_tx,
            touch_rx,
            counters: Counters::default(),
            pending: AtomicU64::new(0),
            fill_mode: layout.fill,
            choice,
            foreground: Mutex::new(Busy {
                reads: 0,
                idle_since: Instant::now(),
                read_before: false,
                gaps: IdleGaps::default(),
            }),
            idle: Condvar::new(),
            closing: AtomicBool::new(false),
        });
        // Every queued fill holds at least one block: one slot per block and the queue never
        // overflows (up to MAX_FILL_QUEUE blocks). The filler's queue is sized alike.
        let slots = (layout.blocks as usize).clamp(1, MAX_FILL_QUEUE);
        let (jobs, rx) = bounded(slots);
        let worker_inner = inner.clone();
        let worker = std::thread::Builder::new()
            .name("crescent-hot-fill".into())
            .spawn(move || worker_inner.serve(rx))
            .map_err(|e| crate::StoreError::Internal(format!("spawning the hot cache's fill worker: {e}")))?;
        let mut cache = HotCache {
            inner,
            jobs: Some(jobs),
            worker: Some(worker),
            deferred: Mutex::new(None),
            filler: Mutex::new(None),
        };
        if cache.inner.uses_filler() {
            let (tx, rx) = bounded(slots);
            let (filler_inner, engine) = (cache.inner.clone(), engine.clone());
            let filler = std::thread::Builder::new()
                .name("crescent-hot-filler".into())
                .spawn(move || filler_inner.fill_deferred(&engine, rx))
                .map_err(|e| crate::StoreError::Internal(format!("spawning the hot cache's filler: {e}")))?;
            cache.deferred = Mutex::new(Some(tx));
            cache.filler = Mutex::new(Some(filler));
        }
        Ok(cache)
    }

    /// How misses fill this cache.
    pub fn fill_mode(&self) -> FillMode {
        self.inner.fill_mode
    }

    /// Held around every remote read of the client's own (its transfers): while any is held,
    /// the deferred filler starts no piece of its own (except for a fill a get waits for).
    /// In inline mode it counts nothing.
    pub fn foreground(&self) -> Foreground<'_> {
        if !self.inner.uses_filler() {
            return Foreground { inner: None };
        }
        let mut busy = self.inner.foreground.lock();
        if busy.reads == 0 {
            if busy.read_before {
                let gap = busy.idle_since.elapsed();
                busy.gaps.push(gap);
            }
            busy.read_before = true;
        }
        busy.reads += 1;
        Foreground { inner: Some(&self.inner) }
    }

    /// Takes a remote read of a miss (`bytes` in `took`) into [`FillMode::Auto`]'s choice
    /// (`fill_choice`); nothing in the other modes.
    pub fn note_read(&self, bytes: u64, took: Duration) {
        if let Some(choice) = &self.inner.choice {
            choice.note_read(bytes, took);
        }
    }

    /// The median share a copy of a miss's bytes would add to its read (of the last ones), as
    /// [`FillMode::Auto`] measures it (`None`: another mode, or no read seen yet).
    pub fn copy_share(&self) -> Option<f64> {
        self.inner.choice.as_ref().and_then(FillChoice::copy_share)
    }

    /// Bytes per second of a streaming copy into the blocks, as [`FillMode::Auto`] measured
    /// it at start (`None`: another mode, or a cache too small to measure).
    pub fn copy_rate(&self) -> Option<f64> {
        self.inner.choice.as_ref().map(FillChoice::copy_rate)
    }

    /// Hands a fill whose get read the object within its read lease to the filler, with the
    /// time that lease ends (`None`: the master stated none): the filler's read must end
    /// before it, as the get's had to. Dropped (counted, its blocks back) when the filler's
    /// queue is full or closed.
    pub fn defer(&self, fill: Fill, lease_end: Option<Instant>) {
        let flight = fill.flight.clone();
        let job = Arc::new(Deferred { fill: Mutex::new(Some(fill)), lease_end });
        *flight.parked.lock() = Arc::downgrade(&job);
        let inner = &self.inner;
        inner.pending.fetch_add(1, Ordering::AcqRel);
        let sent = match &*self.deferred.lock() {
            Some(tx) => tx.try_send(job).map_err(|_| ()),
            None => Err(()),
        };
        match sent {
            Ok(()) => bump(&inner.counters.deferred, 1),
            Err(()) => {
                // The job (and with it the fill, unless a repeat miss took it just now) is
                // dropped: its blocks go back, gets waiting for it read for themselves.
                inner.pending.fetch_sub(1, Ordering::AcqRel);
                bump(&inner.counters.dropped, 1);
            }
        }
    }

    /// Stops the deferred filler: queued fills are dropped, the running one is abandoned
    /// before its next piece (a piece in flight ends within the engine's transfer timeout),
    /// and its thread is joined. Gets still work afterwards; their fills are dropped.
    pub fn close(&self) {
        self.inner.closing.store(true, Ordering::SeqCst);
        {
            let _fg = self.inner.foreground.lock();
            self.inner.idle.notify_all();
        }
        self.deferred.lock().take(); // the filler ends once the queue is closed and drained
        let filler = self.filler.lock().take();
        if let Some(f) = filler {
            let _ = f.join();
        }
    }

    /// Its counters now, and how many entries and blocks are in use.
    pub fn metrics(&self) -> HotCacheMetrics {
        let c = &self.inner.counters;
        let free = self.inner.region.free.lock().len() as u64;
        HotCacheMetrics {
            blocks: self.inner.blocks as u64,
            block_size: self.inner.region.block_size,
            entries: self.inner.index.len() as u64,
            blocks_in_use: self.inner.blocks as u64 - free,
            hits: c.hits.load(Ordering::Relaxed),
            misses: c.misses.load(Ordering::Relaxed),
            fills: c.fills.load(Ordering::Relaxed),
            dropped_fills: c.dropped.load(Ordering::Relaxed),
            evictions: c.evictions.load(Ordering::Relaxed),
            bytes_served: c.bytes_served.load(Ordering::Relaxed),
            merged: c.merged.load(Ordering::Relaxed),
            deferred_fills: c.deferred.load(Ordering::Relaxed),
            taken_over: c.taken_over.load(Ordering::Relaxed),
            filler_waits: c.filler_waits.load(Ordering::Relaxed),
            early_copies: c.early_copies.load(Ordering::Relaxed),
            early_copies_wasted: c.early_copies_wasted.load(Ordering::Relaxed),
        }
    }

    /// The entry the cache holds for `key` now, whatever object the master will say the key
    /// is: for a copy made while the master answers (an early copy), which only counts once
    /// [`Guard::confirm_early_copy`] finds the answer matching. Counts nothing and does not
    /// touch the key's recency (the get's [`Self::lookup`] does, once the answer is in).
    pub fn peek(&self, key: &str) -> Option<Guard<'_>> {
        let entry = self.inner.index.get(key).map(|e| e.value().clone())?;
        Some(Guard { entry, counters: &self.inner.counters })
    }

    /// Counts early copies (see [`Self::peek`]) that the master's answer did not confirm.
    pub fn note_early_copies_wasted(&self, n: u64) {
        bump(&self.inner.counters.early_copies_wasted, n);
    }

    /// The entry for `key` if it still is the object `list` describes; counts a hit or a miss.
    /// A stale entry is dropped.
    pub fn lookup(&self, key: &str, list: &GetReplicaListReply) -> Option<Guard<'_>> {
        let inner = &self.inner;
        let found = inner.index.get(key).map(|e| (e.id.matches(list), e.value().clone()));
        match found {
            Some((true, entry)) => {
                bump(&inner.counters.hits, 1);
                inner.touch(key);
                Some(Guard { entry, counters: &inner.counters })
            }
            Some((false, stale)) => {
                let stale_id = stale.id.clone();
                drop(stale);
                inner.index.remove_if(key, |_, e| e.id == stale_id);
                bump(&inner.counters.misses, 1);
                None
            }
            None => {
                bump(&inner.counters.misses, 1);
                None
            }
        }
    }

    /// What a get that missed `key` does about the cache when it reads the object `list`
    /// describes from `replica`: fetch it into reserved blocks ([`Miss::Lead`]: blocks free or
    /// evictable right now, object admitted and not larger than the cache), wait for another
    /// get's fetch of the same object ([`Miss::Join`]), or read it as without the cache.
    pub fn begin(&self, key: &str, list: &GetReplicaListReply, replica: &ReplicaDescriptor) -> Miss {
        let inner = &self.inner;
        if let Some(flight) = inner.flights.get(key).map(|f| f.value().clone()) {
            if flight.id.matches(list) {
                // A deferred fill not begun yet: this get fills it inline instead.
                if let Some(fill) = flight.take_parked() {
                    bump(&inner.counters.taken_over, 1);
                    return Miss::Lead(fill);
                }
                // Begun (or led by another get): wait for it, and the filler stops yielding.
                flight.urgent.store(true, Ordering::SeqCst);
                inner.wake_filler();
                let patience = Duration::from_millis((list.lease_ttl_ms / 2).max(100));
                return Miss::Join(Joined { flight, patience });
            }
            return Miss::Skip; // another version of the key is being fetched: leave it be
        }
        if !inner.admit(key, list.size) {
            return Miss::Skip;
        }
        let id = Identity::of(list, replica);
        let flight = Arc::new(Flight::new(id.clone()));
        match inner.flights.entry(key.to_string()) {
            dashmap::Entry::Occupied(_) => return Miss::Skip, // another get began it just now
            dashmap::Entry::Vacant(v) => {
                v.insert(flight.clone());
            }
        }
        match inner.reserve(&id) {
            Some(blocks) => {
                let fill =
                    Fill { key: key.to_string(), id, blocks: Some(blocks), flight, inner: inner.clone(), verify: None };
                match inner.miss_mode() {
                    FillMode::Deferred => Miss::Defer(fill),
                    FillMode::Inline | FillMode::Auto => Miss::Lead(fill),
                }
            }
            None => {
                inner.flights.remove_if(key, |_, f| Arc::ptr_eq(f, &flight));
                flight.finish(None);
                bump(&inner.counters.dropped, 1);
                Miss::Skip
            }
        }
    }

    /// Waits for the fetch `joined` waits for; the object's entry when it landed in time.
    pub fn wait(&self, joined: Joined) -> Option<Guard<'_>> {
        let Joined { flight, patience } = joined;
        let deadline = Instant::now() + patience;
        let mut landed = flight.landed.lock();
        while landed.is_none() {
            if flight.cv.wait_until(&mut landed, deadline).timed_out() {
                break;
            }
        }
        let entry = landed.clone().flatten()?;
        bump(&self.inner.counters.merged, 1);
        Some(Guard { entry, counters: &self.inner.counters })
    }

    /// Hands a fill whose bytes have landed to the worker (the gets waiting for it are served
    /// at once); dropped (counted) when the queue is full.
    pub fn publish(&self, mut fill: Fill) {
        if fill.flight.void.load(Ordering::SeqCst) {
            bump(&self.inner.counters.dropped, 1);
            return; // invalidated meanwhile: dropped, its blocks go back
        }
        let Some(blocks) = fill.blocks.take() else { return };
        let entry = Arc::new(Entry { id: fill.id.clone(), blocks });
        fill.flight.finish(Some(entry.clone()));
        let job = Job { key: std::mem::take(&mut fill.key), entry, flight: fill.flight.clone() };
        let Some(jobs) = &self.jobs else { return };
        self.inner.pending.fetch_add(1, Ordering::AcqRel);
        match jobs.try_send(job) {
            Ok(()) => {}
            Err(TrySendError::Full(job)) | Err(TrySendError::Disconnected(job)) => {
                self.inner.pending.fetch_sub(1, Ordering::AcqRel);
                self.inner.flights.remove_if(&job.key, |_, f| Arc::ptr_eq(f, &job.flight));
                bump(&self.inner.counters.dropped, 1)
            }
        }
    }

    /// Forgets `key` (the client's own put or remove): a fill of it queued or running is
    /// voided (never entered). Holders finish their reads first.
    pub fn invalidate(&self, key: &str) {
        let flight = self.inner.flights.get(key).map(|f| f.value().clone());
        self.inner.void(flight.into_iter());
        self.inner.index.remove(key);
    }

    /// Forgets every key `re` matches.
    pub fn invalidate_matching(&self, re: &regex::Regex) {
        let flights: Vec<_> =
            self.inner.flights.iter().filter(|f| re.is_match(f.key())).map(|f| f.value().clone()).collect();
        self.inner.void(flights.into_iter());
        self.inner.index.retain(|k, _| !re.is_match(k));
    }

    /// Forgets every key: later gets miss (a get that already holds a [`Guard`] still reads
    /// its entry).
    pub fn clear(&self) {
        let flights: Vec<_> = self.inner.flights.iter().map(|f| f.value().clone()).collect();
        self.inner.void(flights.into_iter());
        self.inner.index.clear();
    }

    /// Notes a get served by a local replica; says once when the cache looks useless here.
    pub fn note_local_read(&self) {
        let c = &self.inner.counters;
        let n = c.local_reads.fetch_add(1, Ordering::Relaxed) + 1;
        if n >= ALL_LOCAL_NOTICE
            && c.hits.load(Ordering::Relaxed) + c.misses.load(Ordering::Relaxed) == 0
            && !c.said_all_local.swap(true, Ordering::Relaxed)
        {
            tracing::info!(
                "local hot cache: the first {n} gets were all served by this client's own memory; the cache \
                 only keeps objects read from other clients, so a client whose data is all local (standalone, \
                 single client) gains nothing from it"
            );
        }
    }

    /// Waits (up to 30 s) until the worker has handled every job queued so far (tests,
    /// benchmarks).
    pub fn flush(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.inner.pending.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl Drop for HotCache {
    fn drop(&mut self) {
        self.close();
        self.jobs = None; // the worker ends when the queue is closed and empty
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

impl Inner {
    /// Records a hit's use of `key` without waiting for a lock.
    fn touch(&self, key: &str) {
        if self.touch_tx.try_send(key.to_string()).is_err() {
            if let Some(mut p) = self.policy.try_lock() {
                self.drain_touches(&mut p);
                p.recency.promote(key);
            }
        }
    }

    fn drain_touches(&self, p: &mut Policy) {
        while let Ok(k) = self.touch_rx.try_recv() {
            p.recency.promote(&k);
        }
    }

    fn admit(&self, key: &str, size: u64) -> bool {
        if size == 0 || size > self.blocks as u64 * self.region.block_size {
            return false;
        }
        match self.admission {
            Admission::Always => true,
            Admission::SecondAccess => {
                let mut p = self.policy.lock();
                if p.ghost.pop(key).is_some() {
                    true
                } else {
                    p.ghost.put(key.to_string(), ());
                    false
                }
            }
        }
    }

    /// Blocks for an object of `id.size` bytes: free ones, else evicted ones; `None` when
    /// too many are held.
    fn reserve(&self, id: &Identity) -> Option<Blocks> {
        let n = id.size.div_ceil(self.region.block_size) as usize;
        let take = |free: &mut Vec<u32>| (free.len() >= n).then(|| free.split_off(free.len() - n));
        let first = take(&mut self.region.free.lock()); // (the lock is released here: evicting frees blocks)
        let ids = match first {
            Some(ids) => ids,
            None => {
                self.evict(n);
                take(&mut self.region.free.lock())?
            }
        };
        Some(Blocks { region: self.region.clone(), ids, len: id.size })
    }

    /// Evicts the least recently used entries nobody holds until `n` blocks are free.
    fn evict(&self, n: usize) {
        let mut p = self.policy.lock();
        self.drain_touches(&mut p);
        let oldest_first: Vec<String> = p.recency.iter().rev().map(|(k, _)| k.clone()).collect();
        for key in oldest_first {
            if self.region.free.lock().len() >= n {
                break;
            }
            // Guards clone the entry under the shard's read lock; this check runs under its
            // write lock, so a held entry is never taken.
            match self.index.remove_if(&key, |_, e| Arc::strong_count(e) == 1) {
                Some((_, entry)) => {
                    p.recency.pop(&key);
                    bump(&self.counters.evictions, 1);
                    drop(entry); // its blocks go back to the free list
                }
                None if !self.index.contains_key(&key) => {
                    p.recency.pop(&key); // invalidated meanwhile
                }
                None => {} // held: try the next one
            }
        }
    }

    fn insert(&self, key: String, entry: Arc<Entry>) {
        let replaced = match self.index.entry(key.clone()) {
            dashmap::Entry::Occupied(mut o) if o.get().id != entry.id => Some(o.insert(entry)),
            dashmap::Entry::Occupied(_) => return, // the same object, filled twice: keep the first
            dashmap::Entry::Vacant(v) => {
                v.insert(entry);
                None
            }
        };
        drop(replaced);
        self.policy.lock().recency.put(key, ());
        bump(&self.counters.fills, 1);
    }

    /// Enters a landed object unless its key was invalidated meanwhile (checked before and
    /// after: an invalidation between the two finds the entry and removes it, or is seen by
    /// the second check), and ends its flight.
    fn enter(&self, key: String, entry: Arc<Entry>, flight: &Arc<Flight>) {
        if flight.void.load(Ordering::SeqCst) {
            bump(&self.counters.dropped, 1);
        } else {
            let id = entry.id.clone();
            self.insert(key.clone(), entry);
            if flight.void.load(Ordering::SeqCst) {
                self.index.remove_if(&key, |_, e| e.id == id);
            }
        }
        self.flights.remove_if(&key, |_, f| Arc::ptr_eq(f, flight));
    }

    /// Marks these flights' fills as void; a deferred one still queued is dropped at once
    /// (its blocks back).
    fn void(&self, flights: impl Iterator<Item = Arc<Flight>>) {
        for flight in flights {
            flight.void.store(true, Ordering::SeqCst);
            if let Some(fill) = flight.take_parked() {
                bump(&self.counters.dropped, 1);
                drop(fill);
            }
        }
        self.wake_filler(); // a running fill that was voided stops before its next piece
    }
}
