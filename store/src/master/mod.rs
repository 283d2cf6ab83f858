//! The master: owns metadata only (key → replicas → segment, address, size, tier, status).
//! Clients contribute segments and move bytes themselves with the transfer engine.
//!
//! The objects live in 32 shards by key hash, each under its own mutex; the segments and their
//! allocators, clients, owner links, the disk tier's records and the other state that spans
//! keys live under one more (the private `shards` module). **Lock order: shards before the
//! global state, shards in ascending index; never a shard while holding the global state.** A
//! call on one key takes its shard, then the global state, for a few map look-ups; calls on
//! keys of different shards wait for each other only during those short global holds. Calls
//! that walk every object (a remount, the sweep, disk-file updates, prefix queries) take every
//! shard; unmount, remove-all, metrics scrapes and eviction take one shard at a time.
//!
//! Each shard keeps its objects in the order of their last use, and every use takes a tick of
//! one process-wide counter, so eviction merges the shards' least recently used ends into the
//! order a single list would give (the private `objects` module). A background evictor thread
//! runs eviction rounds in steps of [`EVICTION_STEP`] objects (`Master::evict_step`), so no
//! put or get waits behind a whole round. The gRPC layer ([`service`]) and the admin HTTP layer
//! ([`admin`]) are thin.

pub mod access;
pub mod admin;
pub mod cli;
pub mod config;
pub mod conn_limit;
mod disk;
pub mod events;
pub mod fence;
pub mod ha;
mod lease_holds;
pub mod metrics;
pub mod mooncake_metrics;
mod objects;
pub mod owners;
pub mod published;
pub mod query;
pub mod query_http;
pub mod rebuild;
pub mod removal_records;
mod removals_file;
pub mod replicate;
pub mod server;
pub mod service;
mod shards;
pub mod tasks;
pub mod tenant;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rand::Rng;
use smallvec::SmallVec;

use crate::allocator::{Block, SegmentAllocator};
use crate::error::{Result, StoreError};
use crate::proto::{EventKind, PutOptions, QueryKeyReply, ReplicaDescriptor, ReplicaStatus, SegmentInfo, Tier};
pub use crate::protocol::{disk_segment_name, MAX_KEY_LEN, MAX_OBJECT_SIZE};
pub use config::{AllocationStrategy, MasterConfig};
use metrics::Metrics;
use objects::{Object, ObjectMap, Replica, Stamp, SHARDS};
use removal_records::{Removal, Removed};
use shards::Locked;
use thin_vec::ThinVec;

/// Smallest segment a client may mount (one page; smaller ones cannot hold the allocator's units).
pub const MIN_SEGMENT_SIZE: u64 = 4096;
/// Most replicas per object.
pub const MAX_REPLICAS: u32 = 16;
/// Most objects one step of an eviction round takes (`Master::evict_step`), each shard's
/// under one hold of it and the global lock (about eight objects, microseconds, a hold): the
/// calls waiting for a lock go between two holds (a round of 5 % of a million objects is
/// about 50 000 objects, some 200 steps). Each step takes every shard's lock twice and the
/// global one once a shard, whatever its size: 64 objects a step made that a cost of each
/// object. The owners' news of a round go out every [`EVICTION_NEWS_BATCH`] objects.
pub const EVICTION_STEP: usize = 256;

/// Objects an eviction round evicts between two sends of its drops to the same owner (and at
/// its end): with 64 owners, about 64 drops a message, where sent after each step (one or two
/// an owner) the messages and their acknowledgements, not the eviction, made the round's cost.
/// The owners take turns: each step sends to its share of them (those waiting longest), so the
/// messages and acknowledgements go out evenly through the round; sent to every owner at once
/// every 4096 objects, each such burst held up the calls arriving meanwhile (the single-key
/// p99 of a 10 M-object store while a round ran rose from 3.5-3.9 ms to 4.6-5.2 ms; see
/// docs/src/benchmarks.md). Ranges wait in quarantine until their drop is acknowledged, so a
/// longer wait delays their reuse; a put that finds no room sends every queued drop at once
/// (`Master::evict_in`), and so does each sweep.
pub const EVICTION_NEWS_BATCH: u64 = 4096;

/// The evictor's pause after a step that took `took`: none when the round is `urgent` or
/// `duty` is 1, else what makes the step `duty` of the step and its pause together.
fn pause_after_step(took: Duration, duty: f64, urgent: bool) -> Duration {
    if urgent || duty >= 1.0 {
        return Duration::ZERO;
    }
    took.mul_f64((1.0 - duty) / duty)
}

/// The evictor thread's name (what `top -H` and `perf` show: 15 bytes at most, where
/// `crescent-master-evict` read as `crescent-master`, like every other thread of the master).
pub const EVICTOR_THREAD: &str = "crescent-evict";

struct Segment {
    name: String,
    client_id: String,
    host: String,
    base: u64,
    tier: Tier,
    alloc: SegmentAllocator,
    /// Recent gets and puts touching this segment (per-node load for schedulers).
    load: query::Load,
    /// Tier SSD: where the owner serves its files (`host:port`); empty for memory.
    disk_service: String,
}

/// What one object costs the master's memory beyond its key, as the metadata limit counts it
/// ([`MasterConfig::max_metadata_bytes`]): above the 192-210 B per object `storebench master`
/// measures at 1 M and 10 M objects, so the limit errs on the safe side.
pub const OBJECT_METADATA_BYTES: u64 = 256;

/// Once at the metadata limit, eviction takes the metadata down to this share of it.
const METADATA_LOW_WATERMARK: f64 = 0.95;

/// The machine's memory (bytes; at least a GiB).
fn physical_memory() -> u64 {
    let info = rustix::system::sysinfo();
    (info.totalram as u64).saturating_mul(u64::from(info.mem_unit.max(1))).max(1 << 30)
}

/// How long a committed object whose file is being written is spared by eviction (see
/// `Object::offload_held_until`): far longer than a disk tier takes with a full queue.
pub const OFFLOAD_HOLD: Duration = Duration::from_secs(10);

struct Client {
    last_ping: Instant,
    segments: HashSet<u64>,
    /// The `held_generation` of the removals this client last got, and when.
    held_sent: u64,
    held_sent_at: Option<Instant>,
}

#[derive(Default)]
struct State {
    segments: HashMap<u64, Segment>,
    segment_by_name: HashMap<String, u64>,
    /// The writers (client ids and their disks) objects refer to, shared ([`objects::Names`]).
    names: objects::Names,
    clients: HashMap<String, Client>,
    next_segment: u64,
    next_version: u64,
    /// The first version this master handed out (its start time in nanoseconds): a version
    /// below it was handed out by an earlier master, before a restart (see [`disk`]).
    version_floor: u64,
    /// Near-engine copies published by clients (never served by the store).
    published: published::Published,
    /// Replications in progress: new replicas allocated, bytes being copied.
    replications: HashMap<String, replicate::Pending>,
    /// Read counts of the hot-key replication policy.
    hot: replicate::HotKeys,
    /// Disk id → key → version of objects removed while that disk held a copy, until the
    /// disk acknowledges the deletion (it may be offline meanwhile; see [`disk`]).
    disk_removals: HashMap<String, disk::PendingRemovals>,
    /// Most removals kept for one disk ([`disk::MAX_PENDING_REMOVALS`]; lower in tests).
    max_pending_removals: usize,
    /// The counters each mounted disk's client last reported (by disk name).
    disk_counters: HashMap<String, crate::proto::DiskCounters>,
    /// Disk segment id → (key, version) of objects left with no memory replica while that
    /// disk held a copy: hints for its owner, handed out once on its pings ([`disk`]).
    disk_only_news: HashMap<u64, std::collections::VecDeque<(String, u64)>>,
    /// Changes whenever `disk_removals` does: clients with a disk keep a copy of the set
    /// ([`disk`]), sent again when their copy is older.
    held_generation: u64,
    /// Memory segment id → the news link to its owner ([`owners`]).
    owners: HashMap<u64, owners::OwnerLink>,
    /// Ranges of objects removed while a read lease on them ran ([`lease_holds`]).
    holds: lease_holds::LeaseHolds,
    /// What calls answered since taking over a later report must not undo ([`rebuild`]).
    window: rebuild::Window,
    /// Links with news queued by the operation in progress.
    dirty_links: Vec<u64>,
    /// Links with drops queued by the eviction round under way, first queued first: each step
    /// sends those of its share of the links ([`Master::flush_round_news_share`]), each link
    /// about once every [`EVICTION_NEWS_BATCH`] objects, and the round's end the rest
    /// ([`Master::flush_round_news`]), not every link after each step: a step's drops are
    /// spread over every owner, so sent per step they were about one message (and one
    /// acknowledgement) per evicted object. Any other flush of such a link sends them along.
    round_links: Vec<u64>,
    /// Set while an eviction round's step holds the lock: its drops go to `round_links`.
    round_news: bool,
    /// Links with news that may wait up to [`owners::LAZY_NEWS_DELAY`]: the *complete* commits
    /// of puts their owners knew as pending, which nothing waits for. They go out with the
    /// link's next news (in a stream of puts, the next put's pending commit) or, at the
    /// latest, when [`Master::flush_lazy_news`] runs; one message and one acknowledgement
    /// fewer per put on the master's and the owner's CPUs.
    lazy_links: Vec<u64>,
    /// Set while such news is queued: it goes to `lazy_links`.
    lazy_news: bool,
    /// A [`Master::flush_lazy_news`] is scheduled ([`Master::lazy_news_unscheduled`]).
    lazy_scheduled: bool,
    next_stream: u64,
    /// Unit tests without owner streams: every owner acknowledges at once, as one in sync would.
    instant_acks: bool,
    /// The eviction round under way, if any (`Master::evict_step`).
    round: Option<Round>,
    /// A put found no room since the last round began: the next step starts a round even
    /// below the high watermark.
    pressure: bool,
}

/// An eviction round: what it set out to free, and what it freed so far.
#[derive(Debug, Clone, Copy, Default)]
struct Round {
    target: u64,
    freed: u64,
    count: u64,
    /// Sends owed to the round's links, in objects x links: a step adds its objects times the
    /// links waiting, and each [`EVICTION_NEWS_BATCH`] of it is one link's turn.
    owed: u64,
}

/// Wakes the evictor thread ([`Master::start_sweeper`]); without one (unit tests), the call that
/// finds eviction needed runs the round's steps itself, letting waiting calls in between them.
#[derive(Default)]
struct Evictor {
    /// A round is wanted: set by puts and sweeps, taken by the evictor thread.
    wanted: Mutex<bool>,
    wake: parking_lot::Condvar,
    /// The evictor thread runs.
    running: std::sync::atomic::AtomicBool,
}

impl State {
    fn fresh(first_version: u64) -> State {
        State {
            next_segment: 1,
            next_version: first_version,
            version_floor: first_version,
            held_generation: 1,
            max_pending_removals: disk::MAX_PENDING_REMOVALS,
            instant_acks: cfg!(test),
            ..State::default()
        }
    }
}

/// A put being committed ([`Master::put_end_begin`]): what its answer waits for.
#[derive(Debug)]
pub struct Commit {
    /// The object's key.
    pub key: String,
    /// The version being committed.
    pub version: u64,
    /// The owners' acknowledgements of its commit news: of the pending commit sent at the
    /// put's start (usually in already), or of the commit sent now (a put without a checksum).
    pub wait: owners::AckWait,
    /// The owners were told at the put's start (a pending commit): once committed, they are
    /// told it is complete, and the answer does not wait for that.
    pending: bool,
}

/// A commit begun (`Master::begin_commit`).
struct Begun {
    version: u64,
    /// The news (segment, seq) whose acknowledgements the commit needs.
    news: Vec<(u64, u64)>,
    /// Those are the pending commit sent at the put's start.
    pending: bool,
}

/// How a put starts ([`Master::put_start_checked`]).
#[derive(Debug, Clone, Copy)]
struct StartHow {
    /// The checksum its writer took of the value (none: not taken).
    crc: Option<u32>,
    /// Send the owners' news at once.
    flush: bool,
    /// The caller evicted for it already.
    evicted: bool,
}

/// A get's answer: the replicas to read from, under a lease.
#[derive(Debug, Clone)]
pub struct ReplicaList {
    /// Where the bytes are: memory replicas first, then disk copies (read through their owners).
    pub replicas: Vec<ReplicaDescriptor>,
    /// The object's size, in bytes.
    pub size: u64,
    /// The object's version (what the replicas hold).
    pub version: u64,
    /// How long the read lease lasts from now: read within it, or the bytes may be replaced.
    pub lease_ttl: Duration,
    /// The CRC-32 its writer took of the value (none: not taken).
    pub checksum: Option<u32>,
}

/// Totals for metrics and the admin page.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize)]
pub struct Totals {
    /// Bytes contributed by mounted memory segments.
    pub capacity: u64,
    /// Bytes allocated to objects in them.
    pub used: u64,
    /// Objects, committed or being written.
    pub keys: u64,
    /// Mounted segments.
    pub segments: u64,
    /// Live clients.
    pub clients: u64,
}

/// The disk tier as the master sees it (metrics and admin page).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct DiskTotals {
    /// Mounted disk segments, and the bytes they may use.
    pub segments: u64,
    /// Bytes those disk segments may use.
    pub capacity: u64,
    /// Bytes of the values with a copy on a disk (per copy).
    pub used: u64,
    /// Disk copies (one per object and disk).
    pub replicas: u64,
    /// Objects whose only copies are on disks.
    pub disk_only_keys: u64,
    /// Removals waiting for a disk to acknowledge them.
    pub removals_pending: u64,
}

/// One mounted segment, as the admin port lists it (and the `crescent` command reads it).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct SegmentView {
    /// The segment's id at this master.
    pub id: u64,
    /// Its name (the engine segment of its client, or `ssd:<disk id>`).
    pub name: String,
    /// The client that mounted it.
    pub client_id: String,
    /// That client's host, as it reported it.
    pub host: String,
    /// Its tier's name (`DRAM`, `VRAM`, `SSD`).
    pub tier: String,
    /// Bytes it contributes.
    pub capacity: u64,
    /// Bytes allocated in it.
    pub used: u64,
}

/// What a ping learns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PingOutcome {
    /// The client is known; its heartbeat is noted.
    Ok,
    /// The master does not know the client (dropped for silence, restarted, or its owner link was
    /// lost): it must mount again.
    NeedRemount,
    /// A standby or a deposed leader: the reason, naming the leader when known.
    NotLeader(String),
}

/// The master's state and logic: segments and clients, objects and their replicas, leases,
/// eviction, the owner links, the disk tier's records, events and metrics, all behind one lock.
/// Sans-IO where it can be: the network lives in [`service`] and [`server`]; every call that
/// changes the state first passes the [`fence`] (a standby refuses it).
pub struct Master {
    config: MasterConfig,
    /// The objects, by key hash ([`shards`]: the lock order).
    shards: Box<[Mutex<ObjectMap>]>,
    /// Objects in every shard.
    object_count: AtomicU64,
    /// The bytes of their keys ([`Self::metadata_bytes`]).
    key_bytes: AtomicU64,
    /// [`MasterConfig::max_metadata_bytes`], resolved.
    metadata_limit: u64,
    /// Everything but the objects.
    state: Mutex<State>,
    metrics: Metrics,
    events: events::Events,
    /// The state directory's record of removals waiting for absent disks, if configured.
    removals_file: Option<removals_file::RemovalsFile>,
    /// Whether this master may change its state now ([`fence`]).
    fence: fence::Fence,
    /// This master's term: a random id per run, or (HA) the revision of its leadership.
    term: AtomicU64,
    /// Signalled when quarantined ranges come back ([`owners`]).
    space_freed: tokio::sync::Notify,
    /// The background eviction's wake-up (`Master::evict_step`).
    evictor: Arc<Evictor>,
    /// Replica tasks ([`tasks`]); a leaf lock: nothing else is locked while it is held.
    tasks: Mutex<tasks::Tasks>,
    /// A commit queued lazy news with no flush of them scheduled: the caller of the commit is
    /// to schedule one ([`Master::lazy_news_unscheduled`]), without taking the state's lock
    /// again.
    lazy_due: AtomicBool,
}

pub(crate) fn check_key(key: &str) -> Result<()> {
    if key.is_empty() || key.len() > MAX_KEY_LEN {
        return Err(StoreError::InvalidArgument(format!("a key has 1 to {MAX_KEY_LEN} bytes (got {})", key.len())));
    }
    Ok(())
}

impl Master {
    /// A single master (no HA) with `config`, checked first; with a state directory, the removals
    /// saved there are loaded.
    pub fn new(config: MasterConfig) -> Result<Arc<Master>> {
        Self::with_role(config, fence::Role::Single)
    }

    /// A master starting as `role` (HA: a standby until elected).
    pub fn with_role(config: MasterConfig, role: fence::Role) -> Result<Arc<Master>> {
        config.validate()?;
        let removals_file = config.state_dir.as_deref().map(removals_file::RemovalsFile::open).transpose()?;
        Stamp::start_clock();
        let first_version = disk::first_version();
        let master = Arc::new(Master {
            config: config.clone(),
            shards: (0..SHARDS).map(|_| Mutex::new(ObjectMap::default())).collect(),
            object_count: AtomicU64::new(0),
            key_bytes: AtomicU64::new(0),
            metadata_limit: config.max_metadata_bytes.unwrap_or_else(|| physical_memory() / 2),
            state: Mutex::new(State::fresh(first_version)),
            metrics: Metrics::new()?,
            events: events::Events::new(config.event_buffer),
            removals_file,
            fence: fence::Fence::new(role),
            term: AtomicU64::new((rand::random::<u64>() >> 1).max(1)),
            space_freed: tokio::sync::Notify::new(),
            evictor: Arc::default(),
            tasks: Mutex::default(),
            lazy_due: AtomicBool::new(false),
        });
        master.state.lock().window = rebuild::Window::open_until(Instant::now() + config.client_ttl);
        master.load_saved_removals()?;
        Ok(master)
    }

    /// The settings it runs with.
    pub fn config(&self) -> &MasterConfig {
        &self.config
    }

    /// This master's term (see [`fence`] and [`owners`]).
    pub fn term(&self) -> u64 {
        self.term.load(Ordering::Acquire)
    }

    /// Who may change the state: the fence HA elections move.
    pub fn fence(&self) -> &fence::Fence {
        &self.fence
    }

    /// What this master is, for operators: ("single" | "leader" | "standby", term, leader).
    pub fn role_view(&self) -> (&'static str, u64, Option<String>) {
        match self.fence.role() {
            fence::Role::Single => ("single", self.term(), None),
            fence::Role::Leader { term, .. } if self.fence.leads(Instant::now()) => ("leader", term, None),
            fence::Role::Leader { term, .. } => ("deposed", term, None),
            fence::Role::Standby { leader } => ("standby", 0, leader),
        }
    }

    /// Became the HA leader of `term`: starts from an empty state (the owners' reports rebuild
    /// it), writable until `deadline`.
    /// `inherited`: the removals earlier leaders recorded ([`removal_records`]), buried in the
    /// rebuild window.
    pub fn become_leader(&self, term: u64, deadline: Instant, inherited: &[removal_records::Tombstone]) {
        let mut st = self.lock_all();
        Self::forget_everything(&mut st);
        st.window = rebuild::Window::open_until(Instant::now() + self.config.client_ttl);
        for t in inherited {
            st.window.inherit(&t.key, t.mark);
        }
        self.term.store(term, Ordering::Release);
        self.fence.lead(term, deadline);
        drop(st);
        if let Err(e) = self.load_saved_removals() {
            tracing::warn!("loading the saved disk removals: {e}");
        }
        self.update_gauges();
    }

    /// Removals recorded before this master started (`removal_records`), buried in its
    /// rebuild window.
    pub fn inherit_removals(&self, inherited: &[removal_records::Tombstone]) {
        let mut st = self.state.lock();
        for t in inherited {
            st.window.inherit(&t.key, t.mark);
        }
    }

    /// Stopped leading: forgets everything (a later leadership rebuilds from reports).
    pub fn step_down(&self, leader: Option<String>) {
        let mut st = self.lock_all();
        self.fence.stand_by(leader);
        Self::forget_everything(&mut st);
        drop(st);
        self.update_gauges();
    }

    /// A fresh state and no objects (every shard is held).
    fn forget_everything(st: &mut Locked<'_>) {
        *st.g = State::fresh(disk::first_version());
        let keys: Vec<String> = st.objects.iter().map(|(k, _)| k.to_string()).collect();
        for k in keys {
            st.objects.remove(&k);
        }
    }

    /// Its Prometheus series.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    // ---- segments and clients ----

    /// Mounts `client_id`'s segment `info` (its memory contributed to the pool) and returns its
    /// id; mounting the same segment again returns the same id. A name another client (or
    /// another range) holds is [`StoreError::SegmentExists`].
    pub fn mount_segment(&self, client_id: &str, info: &SegmentInfo, host: &str) -> Result<u64> {
        let now = Instant::now();
        let mut st = self.state.lock();
        self.fence.check(now)?;
        if let Some(&id) = st.segment_by_name.get(&info.name) {
            let seg = &st.segments[&id];
            if seg.client_id == client_id && seg.base == info.base && seg.alloc.capacity() <= info.size {
                return Ok(id); // the same mount again
            }
            return Err(StoreError::SegmentExists(info.name.clone()));
        }
        let id = self.mount_locked(&mut st, client_id, info, host, now)?;
        drop(st);
        self.update_gauges();
        Ok(id)
    }

    /// Mounts a memory segment whose name is free; opens its owner link.
    fn mount_locked(
        &self,
        st: &mut State,
        client_id: &str,
        info: &SegmentInfo,
        host: &str,
        now: Instant,
    ) -> Result<u64> {
        if client_id.is_empty() || info.name.is_empty() {
            return Err(StoreError::InvalidArgument("mount needs a client id and a segment name".into()));
        }
        if info.size < MIN_SEGMENT_SIZE
            || info.size > MAX_OBJECT_SIZE * 64
            || info.base.checked_add(info.size).is_none()
        {
            return Err(StoreError::InvalidArgument(format!(
                "segment size {} at {:#x} is not valid (at least {MIN_SEGMENT_SIZE} bytes, within the address space)",
                info.size, info.base
            )));
        }
        if st.segment_by_name.contains_key(&info.name) {
            return Err(StoreError::SegmentExists(info.name.clone()));
        }
        let id = st.next_segment;
        st.next_segment += 1;
        let tier = Tier::try_from(info.tier).ok().filter(|t| *t != Tier::Unspecified).unwrap_or(Tier::Dram);
        st.segments.insert(
            id,
            Segment {
                name: info.name.clone(),
                client_id: client_id.to_string(),
                host: host.to_string(),
                base: info.base,
                tier,
                alloc: SegmentAllocator::new(info.size),
                load: query::Load::default(),
                disk_service: String::new(),
            },
        );
        st.segment_by_name.insert(info.name.clone(), id);
        st.clients
            .entry(client_id.to_string())
            .or_insert_with(|| Client { last_ping: now, segments: HashSet::new(), held_sent: 0, held_sent_at: None })
            .segments
            .insert(id);
        if tier != Tier::Ssd {
            Self::open_link(st, id, client_id);
        }
        tracing::info!("client {client_id} mounted segment {} ({} bytes, {host}) as {id}", info.name, info.size);
        Ok(id)
    }

    /// Mount after a `NeedRemount`: whatever the master still had of this client is dropped first.
    pub fn remount_segment(&self, client_id: &str, info: &SegmentInfo, host: &str) -> Result<u64> {
        {
            let mut st = self.lock_all();
            self.fence.check(Instant::now())?;
            if let Some(&id) = st.segment_by_name.get(&info.name) {
                if st.segments[&id].client_id == client_id {
                    self.emit_segment_gone(&st, id);
                    Self::drop_segment(&mut st, id);
                }
            }
        }
        self.mount_segment(client_id, info, host)
    }

    /// Unmounts a segment of `client_id`: its replicas go (objects left with none are dropped),
    /// and so does its owner link.
    pub fn unmount_segment(&self, client_id: &str, segment_id: u64) -> Result<()> {
        self.unmount_segment_leased(client_id, segment_id).map(|_| ())
    }

    /// [`Self::unmount_segment`], answering how long from now the segment's memory may still
    /// be read or written by calls the master granted before: the last read lease on an object
    /// with a replica there, the last lease holding a range of it, and the put timeout of a put
    /// still writing there. The owner keeps the memory (registered, unchanged) that long, so a
    /// read granted before the unmount never sees other bytes: it ends within its lease, or
    /// fails with the lease expired.
    pub fn unmount_segment_leased(&self, client_id: &str, segment_id: u64) -> Result<Duration> {
        let now = Instant::now();
        let mut busy_until = now;
        // The segment's records go first, under the global lock alone (nothing is placed on it
        // from then on); its replicas then go one shard at a time, the calls on the other
        // shards going on meanwhile. (A get in between finds a replica whose segment is gone:
        // it is not listed, as after the unmount.)
        let seg = {
            let mut st = self.state.lock();
            self.fence.check(Instant::now())?;
            match st.segments.get(&segment_id) {
                Some(s) if s.client_id == client_id => {}
                Some(_) => {
                    return Err(StoreError::InvalidArgument(format!("segment {segment_id} belongs to another client")))
                }
                None => return Err(StoreError::SegmentNotFound(segment_id.to_string())),
            }
            if let Some(end) = st.holds.last_end_of(segment_id) {
                busy_until = busy_until.max(end);
            }
            Self::drop_segment_record(&mut st, segment_id).expect("looked up above")
        };
        let place = events::Place { tier: seg.tier, client_id: &seg.client_id, host: &seg.host, segment: &seg.name };
        let mut dropped = 0;
        for i in 0..SHARDS {
            let mut st = self.lock_shard(i);
            if self.events.active() {
                for (key, obj) in st.objects.iter().filter(|(_, o)| o.complete) {
                    if obj.replicas.iter().any(|r| r.segment_id == segment_id) {
                        self.emit(EventKind::Removed, key, obj.size, place);
                    }
                }
            }
            for (_, obj) in st.objects.iter() {
                if !obj.replicas.iter().any(|r| r.segment_id == segment_id) {
                    continue;
                }
                if let Some(lease) = obj.lease_until {
                    busy_until = busy_until.max(lease.instant());
                }
                if !obj.complete {
                    busy_until = busy_until.max(obj.started.instant() + self.config.put_timeout);
                }
            }
            dropped += Self::strip_segment(&mut st, segment_id);
        }
        tracing::info!(
            "client {client_id} unmounted segment {segment_id}; {dropped} object(s) lost their last replica"
        );
        self.update_gauges();
        Ok(busy_until.saturating_duration_since(now))
    }

    /// Removes a segment and every replica on it; returns how many objects were removed.
    fn drop_segment(st: &mut Locked<'_>, segment_id: u64) -> usize {
        if Self::drop_segment_record(st, segment_id).is_none() {
            return 0;
        }
        Self::strip_segment(st, segment_id)
    }

    /// Removes a segment's records (not its replicas: [`Self::strip_segment`]); returns it.
    fn drop_segment_record(st: &mut State, segment_id: u64) -> Option<Segment> {
        let seg = st.segments.remove(&segment_id)?;
        st.segment_by_name.remove(&seg.name);
        if let Some(c) = st.clients.get_mut(&seg.client_id) {
            c.segments.remove(&segment_id);
        }
        // Its quarantine goes with it: the owner is gone or gave the memory up.
        st.owners.remove(&segment_id);
        st.holds.forget_segment(segment_id);
        st.dirty_links.retain(|s| *s != segment_id);
        st.round_links.retain(|s| *s != segment_id);
        st.lazy_links.retain(|s| *s != segment_id);
        st.disk_only_news.remove(&segment_id);
        Some(seg)
    }

    /// Drops the replicas and disk copies on a dropped segment from the objects of the shards
    /// held; returns how many objects were left with none and removed.
    fn strip_segment(st: &mut Locked<'_>, segment_id: u64) -> usize {
        let mut gone = Vec::new();
        let mut disk_only = Vec::new();
        for (key, obj) in st.objects.iter_mut() {
            let had_memory = !obj.replicas.is_empty();
            obj.replicas.retain(|r| r.segment_id != segment_id);
            obj.ssd.retain(|s| *s != segment_id);
            if obj.replicas.is_empty() && obj.ssd.is_empty() {
                gone.push(key.to_string());
            } else if had_memory && obj.replicas.is_empty() {
                disk_only.push(key.to_string());
            }
        }
        for key in &gone {
            st.objects.remove(key);
        }
        for key in &disk_only {
            Self::tell_disks_memory_is_gone(st, key);
        }
        gone.len()
    }

    /// A client's heartbeat: keeps it alive, or says it must remount or ask the leader.
    pub fn ping(&self, client_id: &str) -> PingOutcome {
        let mut st = self.state.lock();
        if let Err(e) = self.fence.check(Instant::now()) {
            return PingOutcome::NotLeader(e.to_string());
        }
        if Self::link_broken(&st, client_id) {
            return PingOutcome::NeedRemount;
        }
        match st.clients.get_mut(client_id) {
            Some(c) => {
                c.last_ping = Instant::now();
                PingOutcome::Ok
            }
            None => PingOutcome::NeedRemount,
        }
    }

    // ---- puts ----

    /// Starts a put of `size` bytes under `key`: allocates its replicas per `opts` (evicting if
    /// needed) and returns where to write them and the object's new version. The put must end
    /// ([`Self::put_end_begin`], then [`Self::put_end_finish`]) or be revoked within the put
    /// timeout.
    pub fn put_start(
        &self,
        client_id: &str,
        key: &str,
        size: u64,
        opts: &PutOptions,
    ) -> Result<(Vec<ReplicaDescriptor>, u64)> {
        self.put_start_checked(client_id, key, size, opts, None, true)
    }

    /// [`Self::put_start`] of a value whose CRC-32 its writer took before (`crc`): the owners
    /// of its replicas are told of the placement now, with the checksum (a *pending* commit,
    /// see [`owners`]), so that its end needs no further word from them. `flush`: send the
    /// owners' news now (a batch sends them once, with [`Self::flush_owner_news`]).
    pub fn put_start_checked(
        &self,
        client_id: &str,
        key: &str,
        size: u64,
        opts: &PutOptions,
        crc: Option<u32>,
        flush: bool,
    ) -> Result<(Vec<ReplicaDescriptor>, u64)> {
        let how = StartHow { crc, flush, evicted: false };
        let r = self.put_start_how(client_id, key, size, opts, how, Instant::now());
        // (Errors are counted where they become a reply's status, as every RPC's are.)
        match &r {
            Ok(_) => {
                self.metrics.puts.inc();
                self.metrics.mooncake.value_size.observe(size as f64);
            }
            Err(StoreError::NoSpace { .. }) => self.metrics.mooncake.put_start_alloc_failures.inc(),
            Err(_) => {}
        }
        self.update_gauges();
        r
    }

    /// A put started at `now` without a checksum (unit tests).
    #[cfg(test)]
    fn put_start_inner(
        &self,
        client_id: &str,
        key: &str,
        size: u64,
        opts: &PutOptions,
        now: Instant,
    ) -> Result<(Vec<ReplicaDescriptor>, u64)> {
        self.put_start_how(client_id, key, size, opts, StartHow { crc: None, flush: true, evicted: false }, now)
    }

    fn put_start_how(
        &self,
        client_id: &str,
        key: &str,
        size: u64,
        opts: &PutOptions,
        how: StartHow,
        now: Instant,
    ) -> Result<(Vec<ReplicaDescriptor>, u64)> {
        self.make_metadata_room(key, size, opts.replica_num.max(1), now)?;
        let mut evict = false;
        let mut r = self.put_start_locked(client_id, key, size, opts, now, &mut evict, how);
        if let Err(StoreError::NoSpace { size, replicas, .. }) = &r {
            if evict {
                // No room: evict what this put needs (the tenant's objects: only they free its
                // segments; a few objects, not a round), then try once more (evicted ranges in
                // quarantine come back when their owners acknowledge: the service tries again
                // then). The round that makes room ahead of the next puts runs off this call.
                let tenant = tenant::tenant_of(key);
                let freed = self.evict_in(now, size * *replicas as u64, Some(tenant));
                tracing::debug!("put of {key:?} found no room; evicted {freed} bytes");
                self.state.lock().pressure = true;
                r = self.put_start_locked(
                    client_id,
                    key,
                    *size,
                    opts,
                    now,
                    &mut evict,
                    StartHow { evicted: true, ..how },
                );
            }
        }
        if evict {
            self.evict_soon(now);
        }
        r
    }

    /// Memory the objects' metadata takes, as [`MasterConfig::max_metadata_bytes`] counts it:
    /// [`OBJECT_METADATA_BYTES`] per object plus its key.
    pub fn metadata_bytes(&self) -> u64 {
        self.object_count() * OBJECT_METADATA_BYTES + self.key_bytes.load(Ordering::Relaxed)
    }

    /// The limit of [`Self::metadata_bytes`] this master keeps.
    pub fn metadata_limit(&self) -> u64 {
        self.metadata_limit
    }

    /// Room in the metadata's budget for one more object of `key`: when it would pass the
    /// limit, the least recently used evictable objects of every tenant go until the metadata
    /// is under [`METADATA_LOW_WATERMARK`] of it (a put at the limit does not evict one object
    /// each time); when none can go, the put is refused.
    fn make_metadata_room(&self, key: &str, size: u64, replicas: u32, now: Instant) -> Result<()> {
        let cost = OBJECT_METADATA_BYTES + key.len() as u64;
        if self.metadata_bytes() + cost <= self.metadata_limit {
            return Ok(());
        }
        let low = (self.metadata_limit as f64 * METADATA_LOW_WATERMARK) as u64;
        let (mut freed, mut count) = (0, 0);
        while self.metadata_bytes() + cost > low {
            let before = self.metadata_bytes();
            let Some((f, c)) = self.evict_some(now, u64::MAX, None, EVICTION_STEP, false) else { break };
            (freed, count) = (freed + f, count + c);
            // Objects that keep a disk copy stay listed: evicting them frees no metadata.
            if c == 0 || self.metadata_bytes() >= before {
                break;
            }
        }
        if count > 0 {
            self.flush_round_news(&mut self.state.lock());
            self.count_eviction(count, freed);
            self.update_gauges();
            tracing::debug!("metadata at its limit: evicted {count} object(s)");
        }
        if self.metadata_bytes() + cost > self.metadata_limit {
            return Err(StoreError::NoSpace {
                size,
                replicas,
                detail: format!(
                    "the master's metadata is at its limit ({} of {} bytes, --max-metadata-bytes) and no object \
                     can be evicted",
                    self.metadata_bytes(),
                    self.metadata_limit
                ),
            });
        }
        Ok(())
    }

    /// Sends the owners' news queued and not sent yet (a `BatchPutStart`'s pending commits,
    /// one message per owner for the whole batch).
    pub fn flush_owner_news(&self) {
        self.flush_news(&mut self.state.lock());
    }

    /// [`Self::put_start_how`] under the key's locks; sets `evict` when eviction is wanted
    /// (above the high watermark, or no room: then it answers [`StoreError::NoSpace`], and
    /// the caller evicts and calls again with `how.evicted`).
    #[allow(clippy::too_many_arguments)]
    fn put_start_locked(
        &self,
        client_id: &str,
        key: &str,
        size: u64,
        opts: &PutOptions,
        now: Instant,
        evict: &mut bool,
        how: StartHow,
    ) -> Result<(Vec<ReplicaDescriptor>, u64)> {
        let StartHow { crc, flush, evicted } = how;
        check_key(key)?;
        if size == 0 || size > MAX_OBJECT_SIZE {
            return Err(StoreError::InvalidArgument(format!("object size {size} is not in 1..={MAX_OBJECT_SIZE}")));
        }
        let replicas = opts.replica_num.max(1);
        if replicas > MAX_REPLICAS {
            return Err(StoreError::InvalidArgument(format!("replica_num {replicas} exceeds {MAX_REPLICAS}")));
        }
        let mut st = self.lock_key(key);
        self.fence.check(now)?;
        if st.objects.contains_key(key) {
            return Err(StoreError::AlreadyExists(key.to_string()));
        }
        // A key's replicas go only to segments of its tenant's clients ([`tenant`]).
        let tenant = tenant::tenant_of(key);
        let memory_segments =
            st.segments.values().filter(|s| s.tier != Tier::Ssd && tenant::tenant_of(&s.client_id) == tenant).count();
        if (memory_segments as u32) < replicas {
            return Err(StoreError::NoSpace {
                size,
                replicas,
                detail: format!("{memory_segments} memory segment(s) mounted; replicas need distinct segments"),
            });
        }
        Self::release_ended_holds(&mut st, now);
        let blocks = match self.allocate(&mut st, tenant, size, replicas, opts) {
            Some(b) => b,
            None => {
                // No room: the caller evicts (other shards than this key's) and asks again.
                *evict |= !evicted;
                return Err(StoreError::NoSpace {
                    size,
                    replicas,
                    detail: "every segment is full of leased, pinned or unfinished objects".into(),
                });
            }
        };
        for (segment_id, _) in &blocks {
            if let Some(seg) = st.segments.get_mut(segment_id) {
                seg.load.puts.record(now);
            }
        }
        let version = st.next_version;
        st.next_version += 1;
        let soft_pin = match (opts.soft_pin_ttl_ms, opts.soft_pin) {
            (0, false) => None,
            (0, true) => Some(self.config.default_soft_pin_ttl),
            (ms, _) => Some(Duration::from_millis(ms)),
        };
        let soft_pin_until = soft_pin.map(|ttl| Stamp::of(now + ttl));
        let disk = Self::disk_of_client(&st, client_id);
        let writer = Some(st.names.writer(client_id, disk.as_deref()));
        let object = Object {
            size,
            version,
            replicas: blocks.into_iter().map(|(segment_id, block)| Replica::new(segment_id, block, None)).collect(),
            ssd: ThinVec::new(),
            complete: false,
            writer,
            started: Stamp::of(now),
            lease_until: None,
            soft_pin_until,
            hard_pin: opts.hard_pin,
            offload_held_until: None,
            // Until the commit: the checksum the owners were told with the pending commit.
            checksum: objects::Checksum::new(crc),
        };
        let descriptors = Self::describe(&st, &object);
        if crc.is_some() {
            // The pending commit: each owner learns the placement while the bytes move.
            let what = owners::Announced {
                key,
                version,
                size,
                pins: Self::pins_of(&object),
                checksum: object.checksum,
                pending_for: Some(self.config.put_timeout),
            };
            let placed: SmallVec<[(u64, Block); 2]> = object.replicas.iter().map(|r| (r.segment_id, r.block)).collect();
            let mut object = object;
            for (i, (segment_id, block)) in placed.into_iter().enumerate() {
                let seq = Self::queue_commit(&mut st, segment_id, block, &what, now);
                object.replicas[i].set_news(seq);
            }
            st.objects.insert(key.to_string(), object);
        } else {
            st.objects.insert(key.to_string(), object);
        }
        st.window.put_started(key, version, opts.replace, now);
        // Above the high watermark: make room ahead of the next puts (off this call).
        *evict |= self.above_watermark(&st);
        if flush {
            self.flush_news(&mut st);
        }
        Ok((descriptors, version))
    }

    /// One block on each of `replicas` distinct memory segments: the caller's preferred
    /// segments first (in its order), then the strategy's order.
    fn allocate(
        &self,
        st: &mut State,
        tenant: &str,
        size: u64,
        replicas: u32,
        opts: &PutOptions,
    ) -> Option<Vec<(u64, Block)>> {
        let mut candidates: Vec<u64> = st
            .segments
            .iter()
            .filter(|(_, s)| s.tier != Tier::Ssd && s.alloc.free() >= size && tenant::tenant_of(&s.client_id) == tenant)
            .map(|(id, _)| *id)
            .collect();
        // Random order (but for free-ratio-first) is drawn as far as the loop below walks it (a
        // Fisher-Yates shuffle one step per candidate tried): the same order as shuffling every
        // segment first, for the one or two draws a put needs, under the global lock.
        let shuffled = self.config.allocation_strategy != AllocationStrategy::FreeRatioFirst;
        if !shuffled {
            candidates.sort_by(|a, b| {
                let ratio = |id: &u64| {
                    let a = &st.segments[id].alloc;
                    a.free() as f64 / a.capacity() as f64
                };
                ratio(b).total_cmp(&ratio(a))
            });
        }
        let local_first = self.config.allocation_strategy == AllocationStrategy::LocalFirst;
        let local = local_first.then_some(&opts.preferred_segment);
        let mut front = 0;
        for name in opts.preferred_segments.iter().chain(local) {
            if let Some(&id) = st.segment_by_name.get(name) {
                if let Some(pos) = candidates[front..].iter().position(|c| *c == id) {
                    candidates.remove(front + pos);
                    candidates.insert(front, id);
                    front += 1;
                }
            }
        }
        let mut got = Vec::new();
        let mut rng = rand::rng();
        for i in 0..candidates.len() {
            if got.len() == replicas as usize {
                break;
            }
            if shuffled && i >= front {
                let j = rng.random_range(i..candidates.len());
                candidates.swap(i, j);
            }
            let id = candidates[i];
            if let Some(block) = st.segments.get_mut(&id).expect("candidate").alloc.allocate(size) {
                got.push((id, block));
            }
        }
        if got.len() < replicas as usize {
            for (id, block) in got {
                st.segments.get_mut(&id).expect("allocated above").alloc.release(block);
            }
            return None;
        }
        Some(got)
    }

    /// Starts committing a put: its replicas' owners are told; the commit completes with
    /// [`Self::put_end_finish`] once they acknowledged (or the wait timed out).
    /// `checksum`: the CRC-32 the writer took of the value (none: not taken), kept with the
    /// object and handed out with its replica lists.
    pub fn put_end_begin(&self, client_id: &str, key: &str, checksum: Option<u32>) -> Result<Commit> {
        check_key(key)?;
        let now = Instant::now();
        let mut st = self.lock_key(key);
        self.fence.check(now)?;
        let begun = Self::begin_commit(&mut st, client_id, key, checksum, now);
        self.flush_news(&mut st);
        let Begun { version, news, pending } = begun?;
        Ok(Commit { key: key.to_string(), version, wait: Self::waits_for(&st, news), pending })
    }

    /// Starts committing many puts of `client_id` (a `BatchPutEnd`): the keys of each shard
    /// under one hold of it and the global state, and the owners told once for the whole
    /// batch (one message per owner, not one per key: each message is one more acknowledgement
    /// for the owner to send and for the master to take the global lock for). Returns each
    /// key's commit, in the order of `keys` (their `wait` empty), and one wait for them all.
    /// `checksums`: empty (none taken), or each key's, as [`Self::put_end_begin`] takes it;
    /// another count fails every key.
    pub fn put_end_begin_batch(
        &self,
        client_id: &str,
        keys: &[String],
        checksums: &[Option<u32>],
    ) -> (Vec<Result<Commit>>, owners::AckWait) {
        let now = Instant::now();
        let mut out: Vec<Option<Result<Commit>>> = keys.iter().map(|_| None).collect();
        for (i, key) in keys.iter().enumerate() {
            if !checksums.is_empty() && checksums.len() != keys.len() {
                let e = format!("{} keys but {} checksums", keys.len(), checksums.len());
                out[i] = Some(Err(StoreError::InvalidArgument(e)));
            } else if let Err(e) = check_key(key) {
                out[i] = Some(Err(e));
            }
        }
        let by_shard =
            shards::by_shard(keys.iter().enumerate().filter(|(i, _)| out[*i].is_none()).map(|(i, k)| (i, k.as_str())));
        let mut news = Vec::new();
        for group in by_shard.chunk_by(|a, b| a.0 == b.0) {
            let mut st = self.lock_shard(group[0].0);
            for &(_, i) in group {
                let key = keys[i].as_str();
                let checksum = checksums.get(i).copied().flatten();
                let begun =
                    self.fence.check(now).and_then(|()| Self::begin_commit(&mut st, client_id, key, checksum, now));
                out[i] = Some(begun.map(|Begun { version, news: seqs, pending }| {
                    news.extend(seqs);
                    Commit { key: key.to_string(), version, wait: owners::AckWait::default(), pending }
                }));
            }
        }
        let mut st = self.state.lock();
        self.flush_news(&mut st);
        let wait = Self::waits_for(&st, news);
        (out.into_iter().map(|c| c.expect("every key answered")).collect(), wait)
    }

    /// Queues the commit news of `client_id`'s put of `key` for its replicas' owners (the
    /// caller flushes them); returns its version, the news (segment, seq) whose
    /// acknowledgements the commit needs (none when it is committed already), and whether
    /// those are the pending commit sent at the put's start. The object keeps `checksum` (a
    /// commit already made keeps the one it had).
    ///
    /// A put started with a checksum told its owners then (a pending commit, see [`owners`]):
    /// nothing is sent now, and the commit needs only their acknowledgements of that, in by now
    /// as a rule. Its end's `checksum`, when taken, must be the start's: a value that changed
    /// while it was written fails the put (`INVALID_ARGUMENT`) and the object goes.
    fn begin_commit(
        st: &mut Locked<'_>,
        client_id: &str,
        key: &str,
        checksum: Option<u32>,
        now: Instant,
    ) -> Result<Begun> {
        let known = st.clients.contains_key(client_id);
        let Some(obj) = st.objects.get_mut(key) else {
            return Err(if known {
                StoreError::NotFound(key.to_string())
            } else {
                StoreError::MasterChanged(format!("this master does not know the put of {key:?} nor its writer"))
            });
        };
        if !obj.written_by(client_id) && !obj.complete {
            return Err(StoreError::InvalidArgument(format!("object {key:?} is being written by another client")));
        }
        let version = obj.version;
        if obj.complete {
            return Ok(Begun { version, news: Vec::new(), pending: false });
        }
        let started = obj.checksum.get();
        if let (Some(start), Some(end)) = (started, checksum) {
            if start != end {
                Self::remove_object(st, key, now);
                tracing::warn!("put of {key:?} failed: the value changed while it was written");
                return Err(StoreError::InvalidArgument(format!(
                    "the checksum of {key:?} at its end ({end:#010x}) is not the one at its start ({start:#010x}): \
                     the value changed while it was written"
                )));
            }
        }
        let obj = st.objects.get_mut(key).expect("looked up above");
        // Every replica's owner was told already: at the put's start (a pending commit), or
        // by an earlier end of this put (its answer lost, the call made again).
        let pending = obj.replicas.iter().all(|r| r.news().is_some());
        obj.checksum = objects::Checksum::new(checksum);
        if pending {
            let news = obj.replicas.iter().filter_map(|r| Some((r.segment_id, r.news()?))).collect();
            return Ok(Begun { version, news, pending: started.is_some() });
        }
        let (size, pins) = (obj.size, Self::pins_of(obj));
        let fresh: SmallVec<[(usize, u64, Block); 2]> = obj
            .replicas
            .iter()
            .enumerate()
            .filter(|(_, r)| r.news().is_none())
            .map(|(i, r)| (i, r.segment_id, r.block))
            .collect();
        for (i, segment_id, block) in fresh {
            let what = owners::Announced {
                key,
                version,
                size,
                pins,
                checksum: objects::Checksum::new(checksum),
                pending_for: None,
            };
            let seq = Self::queue_commit(st, segment_id, block, &what, now);
            st.objects.get_mut(key).expect("looked up above").replicas[i].set_news(seq);
        }
        let obj = st.objects.get(key).expect("looked up above");
        let news = obj.replicas.iter().filter_map(|r| Some((r.segment_id, r.news()?))).collect();
        Ok(Begun { version, news, pending: false })
    }

    /// Ends a commit begun by [`Self::put_end_begin`]: the replicas whose owners acknowledged
    /// become visible; the others are dropped; with none left the put fails.
    pub fn put_end_finish(&self, commit: &Commit) -> Result<()> {
        let key = commit.key.as_str();
        let now = Instant::now();
        let mut st = self.lock_key(key);
        self.fence.check(now)?;
        let done = self.finish_commit(&mut st, commit, now);
        self.flush_news(&mut st);
        drop(st);
        if done.is_err() {
            self.update_gauges();
        }
        done
    }

    /// Ends the commits begun by [`Self::put_end_begin_batch`] (a key that did not begin keeps
    /// its error): each shard's under one hold of it and the global state. Answers in order.
    pub fn put_end_finish_batch(&self, commits: Vec<Result<Commit>>) -> Vec<Result<()>> {
        let now = Instant::now();
        let mut out: Vec<Option<Result<()>>> = commits.iter().map(|_| None).collect();
        let by_shard =
            shards::by_shard(commits.iter().enumerate().filter_map(|(i, c)| Some((i, c.as_ref().ok()?.key.as_str()))));
        let mut failed = false;
        for group in by_shard.chunk_by(|a, b| a.0 == b.0) {
            let mut st = self.lock_shard(group[0].0);
            for &(_, i) in group {
                let commit = commits[i].as_ref().expect("listed above");
                let done = self.fence.check(now).and_then(|()| self.finish_commit(&mut st, commit, now));
                failed |= done.is_err();
                out[i] = Some(done);
            }
            self.flush_news(&mut st);
        }
        if failed {
            self.update_gauges();
        }
        commits
            .into_iter()
            .zip(out)
            .map(|(c, done)| match c {
                Err(e) => Err(e),
                Ok(_) => done.expect("every commit answered"),
            })
            .collect()
    }

    /// [`Self::put_end_finish`] under the key's locks (the caller flushes the news).
    fn finish_commit(&self, st: &mut Locked<'_>, commit: &Commit, now: Instant) -> Result<()> {
        let key = commit.key.as_str();
        let obj = match st.objects.get(key) {
            Some(o) if o.version == commit.version => o,
            _ => return Err(StoreError::NotFound(key.to_string())), // revoked or reclaimed meanwhile
        };
        if obj.complete {
            return Ok(());
        }
        let acked: SmallVec<[bool; 2]> =
            obj.replicas.iter().map(|r| r.news().is_some_and(|seq| Self::is_acked(st, r.segment_id, seq))).collect();
        if !acked.iter().any(|a| *a) {
            Self::remove_object(st, key, now);
            tracing::warn!("put of {key:?} failed: no owner of its replicas acknowledged the commit");
            return Err(StoreError::OwnersUnreachable(key.to_string()));
        }
        let obj = st.objects.get_mut(key).expect("looked up above");
        let version = obj.version;
        if acked.iter().all(|a| *a) {
            // Every owner acknowledged (the usual case): the replicas stay where they are.
        } else {
            let all = std::mem::take(&mut obj.replicas);
            let mut lost = Vec::new();
            for (r, ok) in all.into_iter().zip(acked) {
                if ok {
                    st.objects.get_mut(key).expect("looked up above").replicas.push(r);
                } else {
                    lost.push(r);
                }
            }
            for r in lost {
                tracing::warn!(
                    "put of {key:?}: the owner of segment {} did not acknowledge; replica dropped",
                    r.segment_id
                );
                Self::free_replica(st, key, version, r.segment_id, r.block, r.news().is_some(), None);
            }
        }
        st.objects.commit(key);
        let obj = st.objects.get_mut(key).expect("looked up above");
        if obj.offload_disk().is_some() {
            obj.offload_held_until = Some(Stamp::of(now + OFFLOAD_HOLD));
        }
        if commit.pending {
            // The owners knew of it as pending: now they learn it is complete (not waited for:
            // until they do, a master rebuilt from their reports keeps it from its checksum).
            let what = owners::Announced {
                key,
                version,
                size: obj.size,
                pins: Self::pins_of(obj),
                checksum: obj.checksum,
                pending_for: None,
            };
            let placed: SmallVec<[(u64, Block); 2]> = obj.replicas.iter().map(|r| (r.segment_id, r.block)).collect();
            st.lazy_news = !st.instant_acks;
            for (i, (segment_id, block)) in placed.into_iter().enumerate() {
                let seq = Self::queue_commit(st, segment_id, block, &what, now);
                if seq.is_some() {
                    st.objects.get_mut(key).expect("looked up above").replicas[i].set_news(seq);
                }
            }
            st.lazy_news = false;
            if !st.lazy_links.is_empty() && !st.lazy_scheduled {
                st.lazy_scheduled = true;
                self.lazy_due.store(true, Ordering::Release);
            }
        }
        self.emit_object(st, key, EventKind::Stored);
        Ok(())
    }

    /// Commits a put at once (unit tests: owners acknowledge instantly there).
    #[cfg(test)]
    pub fn put_end(&self, client_id: &str, key: &str) -> Result<()> {
        let commit = self.put_end_begin(client_id, key, None)?;
        self.put_end_finish(&commit)
    }

    /// Gives up `client_id`'s put of `key` before it committed: the object and its space go.
    /// Revoking a committed object is [`StoreError::InvalidArgument`] (remove it instead).
    /// Returns what the answer waits for: the owners told of the put at its start (a pending
    /// commit) acknowledging its drop, so that no master rebuilt from their reports after the
    /// answer brings it back.
    pub fn put_revoke(&self, client_id: &str, key: &str) -> Result<owners::AckWait> {
        check_key(key)?;
        let mut st = self.lock_key(key);
        self.fence.check(Instant::now())?;
        match st.objects.get(key) {
            None if !st.clients.contains_key(client_id) => {
                return Err(StoreError::MasterChanged(format!("this master does not know the put of {key:?}")))
            }
            None => return Err(StoreError::NotFound(key.to_string())),
            Some(o) if o.complete => {
                return Err(StoreError::InvalidArgument(format!(
                    "object {key:?} is already committed; remove it instead"
                )))
            }
            Some(o) if !o.written_by(client_id) => {
                return Err(StoreError::InvalidArgument(format!("object {key:?} is being written by another client")))
            }
            Some(_) => {}
        }
        let told: SmallVec<[u64; 2]> =
            st.objects[key].replicas.iter().filter(|r| r.news().is_some()).map(|r| r.segment_id).collect();
        Self::remove_object(&mut st, key, Instant::now());
        self.flush_news(&mut st);
        let wait = Self::waits(&st, told);
        drop(st);
        self.update_gauges();
        Ok(wait)
    }

    /// Removes an object; its replicas' owners are told (their ranges wait in quarantine, and,
    /// while a read lease on the object runs at `now`, until it ends: [`lease_holds`]).
    /// Returns the bytes given up.
    fn remove_object(st: &mut Locked<'_>, key: &str, now: Instant) -> Option<u64> {
        let obj = st.objects.remove(key)?;
        Self::queue_disk_removals(st, key, &obj);
        let hold = obj.lease_until.map(|t| t.instant()).filter(|t| *t > now);
        let mut freed = 0;
        for r in obj.replicas {
            freed += Self::free_replica(st, key, obj.version, r.segment_id, r.block, r.news().is_some(), hold);
        }
        Some(freed)
    }

    fn describe(st: &State, obj: &Object) -> Vec<ReplicaDescriptor> {
        obj.replicas
            .iter()
            .filter_map(|r| {
                let seg = st.segments.get(&r.segment_id)?;
                Some(ReplicaDescriptor {
                    segment_name: seg.name.clone(),
                    address: seg.base + r.block.offset,
                    size: obj.size,
                    tier: seg.tier as i32,
                    status: if obj.complete { ReplicaStatus::Complete } else { ReplicaStatus::Processing } as i32,
                    client_id: seg.client_id.clone(),
                    host: seg.host.clone(),
                    segment_id: r.segment_id,
                    disk_service: String::new(),
                })
            })
            .chain(Self::describe_disk_copies(st, obj))
            .collect()
    }

    // ---- gets and queries ----

    /// The replicas of a committed object; grants (or extends) a read lease.
    pub fn get_replica_list(&self, key: &str) -> Result<ReplicaList> {
        let r = self.get_replica_list_inner(key, Instant::now());
        if r.is_ok() {
            self.metrics.gets.inc();
        }
        r
    }

    fn get_replica_list_inner(&self, key: &str, now: Instant) -> Result<ReplicaList> {
        check_key(key)?;
        let mut st = self.lock_key(key);
        self.fence.check(now)?;
        let obj = st.objects.get_mut(key).ok_or_else(|| StoreError::NotFound(key.to_string()))?;
        if !obj.complete {
            return Err(StoreError::NotReady(key.to_string()));
        }
        let until = now + self.config.lease_ttl;
        objects::extend(&mut obj.lease_until, until);
        st.objects.touch(key);
        let Locked { objects, g } = &mut st;
        let (obj, st) = (&objects[key], &mut **g);
        for r in &obj.replicas {
            if let Some(seg) = st.segments.get_mut(&r.segment_id) {
                seg.load.gets.record(now);
            }
        }
        if self.config.hot_read_threshold > 0.0 {
            st.hot.record(key);
        }
        Ok(ReplicaList {
            replicas: Self::describe(st, obj),
            size: obj.size,
            version: obj.version,
            lease_ttl: self.config.lease_ttl,
            checksum: obj.checksum.get(),
        })
    }

    /// Whether a committed object exists. No lease, no change of eviction order.
    pub fn exists(&self, key: &str) -> Result<bool> {
        check_key(key)?;
        let shard = self.shard_of_key(key);
        self.fence.check(Instant::now())?;
        Ok(shard.get(key).is_some_and(|o| o.complete))
    }

    /// Per key, whether a committed object has it (no lease is granted).
    pub fn batch_exists(&self, keys: &[String]) -> Result<Vec<bool>> {
        for k in keys {
            check_key(k)?;
        }
        self.fence.check(Instant::now())?;
        Ok(keys.iter().map(|k| self.shard_of_key(k).get(k).is_some_and(|o| o.complete)).collect())
    }

    /// Everything known about a key, with no side effect.
    pub fn query(&self, key: &str) -> Result<QueryKeyReply> {
        check_key(key)?;
        let now = Instant::now();
        let st = self.lock_key(key);
        self.fence.check(now)?;
        let Some(obj) = st.objects.get(key) else {
            return Ok(QueryKeyReply { exists: false, ..Default::default() });
        };
        Ok(QueryKeyReply {
            status: None,
            exists: obj.complete,
            size: obj.size,
            version: obj.version,
            replicas: Self::describe(&st, obj),
            lease_remaining_ms: obj
                .lease_until
                .map_or(0, |t| t.instant().saturating_duration_since(now).as_millis() as u64),
            hard_pinned: obj.hard_pin,
        })
    }

    // ---- removal ----

    /// Removes a committed object: invisible at once; the returned wait ends when its owners
    /// acknowledged (the service answers then, so that a removed key cannot come back from an
    /// owner's report).
    pub fn remove(&self, key: &str, force: bool) -> Result<Removal> {
        self.remove_at(key, force, Instant::now())
    }

    fn remove_at(&self, key: &str, force: bool, now: Instant) -> Result<Removal> {
        check_key(key)?;
        let mut st = self.lock_key(key);
        self.fence.check(now)?;
        if !st.objects.contains_key(key) {
            // Gone, as far as this master knows: a copy a holder reports later is older.
            let next = st.next_version;
            st.window.removed(key, next, now);
            return Err(StoreError::NotFound(key.to_string()));
        }
        let obj = st.objects.get(key).expect("looked up above");
        if !obj.complete {
            return Err(StoreError::NotReady(key.to_string()));
        }
        if obj.leased(now) && !force {
            return Err(StoreError::Leased(key.to_string()));
        }
        let (disks, disk_unlinked) = Self::disk_holders(&st, obj);
        let segments: Vec<u64> = obj.replicas.iter().map(|r| r.segment_id).chain(disks).collect();
        self.emit_object(&st, key, EventKind::Removed);
        Self::remove_object(&mut st, key, now);
        let next = st.next_version;
        st.window.removed(key, next, now);
        self.flush_news(&mut st);
        let wait = Self::waits(&st, segments.iter().copied());
        drop(st);
        self.update_gauges();
        Ok(Removal { wait, removed: vec![Removed { key: key.to_string(), mark: next, segments, disk_unlinked }] })
    }

    /// Removes committed objects whose key matches `pattern`; returns (removed, skipped as leased).
    pub fn remove_by_regex(&self, pattern: &str, force: bool) -> Result<((u64, u64), Removal)> {
        let re = regex::RegexBuilder::new(pattern)
            .size_limit(1 << 20)
            .build()
            .map_err(|e| StoreError::InvalidArgument(format!("bad regex {pattern:?}: {e}")))?;
        self.remove_matching(move |k| re.is_match(k), force)
    }

    /// Removes every committed object (`force`: leased ones too); returns (removed, skipped as
    /// leased) and the owners' acknowledgements to wait for.
    pub fn remove_all(&self, force: bool) -> Result<((u64, u64), Removal)> {
        self.remove_matching(|_| true, force)
    }

    pub(crate) fn remove_matching(
        &self,
        matches: impl Fn(&str) -> bool + Send + Sync + 'static,
        force: bool,
    ) -> Result<((u64, u64), Removal)> {
        self.remove_matching_at(matches, force, Instant::now())
    }

    fn remove_matching_at(
        &self,
        matches: impl Fn(&str) -> bool + Send + Sync + 'static,
        force: bool,
        now: Instant,
    ) -> Result<((u64, u64), Removal)> {
        let matches = Arc::new(matches);
        // In a rebuild window, keys no holder has reported yet match too: their copies
        // reported later are older than this removal. The leased keys it skips are spared.
        let spared = {
            let mut st = self.state.lock();
            self.fence.check(now)?;
            let next = st.next_version;
            st.window.removed_matching(matches.clone(), next, now)
        };
        // One shard at a time (with the global state): the calls on the other shards go on
        // meanwhile, and what they do is theirs (a put into a shard already done stays).
        let (mut removed, mut skipped) = (0, 0);
        let mut segments = HashSet::new();
        let mut gone = Vec::new();
        for i in 0..SHARDS {
            let mut st = self.lock_shard(i);
            self.fence.check(now)?;
            let mut victims = Vec::new();
            for (k, o) in st.objects.iter() {
                if o.complete && matches(k) {
                    if o.leased(now) && !force {
                        skipped += 1;
                        if let Some(spared) = &spared {
                            spared.lock().insert(k.to_string());
                        }
                    } else {
                        victims.push(k.to_string());
                    }
                }
            }
            let next = st.next_version;
            for k in &victims {
                let obj = &st.objects[k.as_str()];
                let (disks, disk_unlinked) = Self::disk_holders(&st, obj);
                let its: Vec<u64> = obj.replicas.iter().map(|r| r.segment_id).chain(disks).collect();
                segments.extend(its.iter().copied());
                gone.push(Removed { key: k.clone(), mark: next, segments: its, disk_unlinked });
                self.emit_object(&st, k, EventKind::Removed);
                Self::remove_object(&mut st, k, now);
                st.window.removed(k, next, now);
            }
            self.flush_news(&mut st);
            removed += victims.len() as u64;
        }
        let wait = Self::waits(&self.state.lock(), segments);
        self.update_gauges();
        Ok(((removed, skipped), Removal { wait, removed: gone }))
    }

    // ---- eviction, reclaim, liveness ----

    /// Whether memory use is above the high watermark (a round of eviction is due).
    fn above_watermark(&self, st: &State) -> bool {
        Self::used_above(st, self.config.eviction_high_watermark)
    }

    /// Whether memory use is above `fraction` of the capacity (never, with no capacity).
    fn used_above(st: &State, fraction: f64) -> bool {
        let totals = Self::totals_of(st);
        totals.capacity > 0 && totals.used as f64 > totals.capacity as f64 * fraction
    }

    /// A round of eviction is wanted: the evictor thread is woken, or, without one (unit
    /// tests), this call runs the round's steps, releasing the lock between them.
    fn evict_soon(&self, now: Instant) {
        if self.evictor.running.load(Ordering::Acquire) {
            *self.evictor.wanted.lock() = true;
            self.evictor.wake.notify_one();
        } else {
            while self.evict_step(now, EVICTION_STEP) {}
        }
    }

    /// One step of the eviction round: starts a round when none is under way and memory use is
    /// above the high watermark (or a put found no room since the last one), then evicts at most
    /// `most` of the least recently used evictable objects of every tenant toward the round's
    /// target ([`MasterConfig::eviction_ratio`] of the capacity), each shard's under one short
    /// hold of its lock ([`Self::evict_some`]). Returns whether the round goes on (call again).
    /// The evictor thread calls it in a loop; tests call it to drive eviction step by step.
    pub(crate) fn evict_step(&self, now: Instant, most: usize) -> bool {
        let left = {
            let mut st = self.state.lock();
            if !self.fence.leads(now) {
                st.round = None;
                self.flush_round_news(&mut st);
                return false;
            }
            if st.round.is_none() {
                if !(std::mem::take(&mut st.pressure) || self.above_watermark(&st)) {
                    return false;
                }
                st.round = Some(Round { target: self.eviction_target(&st), ..Round::default() });
            }
            let round = st.round.expect("set above");
            round.target.saturating_sub(round.freed)
        };
        let step = self.evict_some(now, left, None, most, true);
        let mut st = self.state.lock();
        let (freed, count) = step.unwrap_or((0, 0));
        self.count_eviction(count, freed);
        let waiting = st.round_links.len() as u64;
        let Some(round) = st.round.as_mut() else {
            // A new term meanwhile.
            self.flush_round_news(&mut st);
            return false;
        };
        (round.freed, round.count) = (round.freed + freed, round.count + count);
        let more = count > 0 && round.freed < round.target;
        // The gauges are set every EVICTION_NEWS_BATCH objects of the round, and at its end.
        let gauge = !more || round.count / EVICTION_NEWS_BATCH != (round.count - count) / EVICTION_NEWS_BATCH;
        if more {
            round.owed += count * waiting;
            let turns = round.owed / EVICTION_NEWS_BATCH;
            round.owed %= EVICTION_NEWS_BATCH;
            self.flush_round_news_share(&mut st, turns as usize);
        } else {
            let round = st.round.take().expect("looked up above");
            if round.count > 0 {
                tracing::info!("eviction round: {} object(s), {} bytes", round.count, round.freed);
            }
            self.flush_round_news(&mut st);
        }
        drop(st);
        if gauge {
            self.update_gauges();
        }
        more
    }

    /// Evicts least-recently-used evictable objects of `tenant` (every tenant's when none)
    /// until `at_least` bytes are freed (or nothing evictable is left); objects whose file is
    /// still being written from memory (`offload_held_until`) go last. Returns bytes freed.
    /// Holds no lock when called: it takes the shards one at a time.
    fn evict_in(&self, now: Instant, at_least: u64, tenant: Option<&str>) -> u64 {
        let (mut freed, mut count) = (0, 0);
        while freed < at_least {
            let Some((f, c)) = self.evict_some(now, at_least - freed, tenant, EVICTION_STEP, false) else { break };
            (freed, count) = (freed + f, count + c);
            if c == 0 {
                break;
            }
        }
        // A put waits for this room: its drops go out now, and the round's queued ones too
        // (their ranges come back once acknowledged, which a put out of room may wait for).
        self.flush_round_news(&mut self.state.lock());
        self.count_eviction(count, freed);
        self.update_gauges();
        freed
    }

    fn eviction_target(&self, st: &State) -> u64 {
        (Self::totals_of(st).capacity as f64 * self.config.eviction_ratio) as u64
    }

    /// At most `most` objects toward `target` bytes, the least recently used of all shards
    /// first, evicted: (bytes freed, objects), or `None` when nothing is left to take.
    ///
    /// Each shard plans from its least recently used end (a few more than its share of
    /// `most`), under its lock alone; the plans merge by their objects' last use
    /// ([`objects::Victim::tick`]) into the globally least recently used, cut where a shard's
    /// plan stopped early (what it did not list comes after its last victim). Then each shard's
    /// chosen objects go under one hold of the shard and the global state, each only if it was
    /// not used, pinned or removed since it was planned. So the order is the one a single
    /// map would give, and a step's cost is its plans' objects, not the store's size.
    ///
    /// The owners' drops are queued, not sent: for a `round`'s step, with the round's
    /// ([`EVICTION_NEWS_BATCH`]); the caller sends them.
    fn evict_some(
        &self,
        now: Instant,
        target: u64,
        tenant: Option<&str>,
        most: usize,
        round: bool,
    ) -> Option<(u64, u64)> {
        if target == 0 || most == 0 {
            return None;
        }
        let eligible = |k: &str| tenant.is_none_or(|t| tenant::tenant_of(k) == t);
        let per_shard = (most / SHARDS * 2).clamp(4, most.max(4));
        let mut candidates: Vec<(usize, objects::Victim)> = Vec::new();
        // The latest (held, tick) the merge may take: the last victim of a plan that stopped early.
        let mut bound = (true, u64::MAX);
        for i in 0..SHARDS {
            let mut shard = self.shard(i);
            let plan = shard.eviction_plan(now, target, per_shard, eligible);
            for key in &plan.parked {
                shard.touch(key);
            }
            drop(shard);
            if plan.more {
                if let Some(last) = plan.victims.last() {
                    bound = bound.min((last.held, last.tick));
                }
            }
            candidates.extend(plan.victims.into_iter().map(|v| (i, v)));
        }
        if candidates.is_empty() {
            return None;
        }
        candidates.sort_unstable_by_key(|(_, v)| (v.held, v.tick));
        let (mut planned, mut chosen) = (0, 0);
        for (_, v) in &candidates {
            if planned >= target || chosen >= most || (v.held, v.tick) > bound {
                break;
            }
            planned += v.bytes;
            chosen += 1;
        }
        candidates.truncate(chosen);
        // By shard, in the merged order within each (in place: a stable sort allocates).
        candidates.sort_unstable_by_key(|(i, v)| (*i, v.held, v.tick));
        let (mut freed, mut count) = (0, 0);
        for group in candidates.chunk_by(|a, b| a.0 == b.0) {
            let mut st = self.lock_shard(group[0].0);
            st.round_news = round;
            for (_, v) in group {
                let as_planned = st
                    .objects
                    .get(&v.key)
                    .is_some_and(|o| o.complete && o.tick() == v.tick && o.evictable(now) && !o.replicas.is_empty());
                if !as_planned {
                    continue;
                }
                self.emit_object(&st, &v.key, EventKind::Evicted);
                // An object with a disk copy loses its memory replicas only: gets read the disk.
                freed += Self::evict_memory_replicas(&mut st, &v.key, now).unwrap_or(0);
                count += 1;
            }
            st.round_news = false;
        }
        Some((freed, count))
    }

    fn count_eviction(&self, count: u64, freed: u64) {
        self.metrics.mooncake.eviction(count, freed);
        if count > 0 {
            self.metrics.evictions.inc_by(count);
            self.metrics.evicted_bytes.inc_by(freed);
            tracing::debug!("evicted {count} object(s), {freed} bytes");
        }
    }

    /// Drops silent clients, reclaims unfinished puts and evicts above the high watermark.
    pub fn sweep(&self) {
        self.sweep_at(Instant::now());
    }

    /// A sweep holds every shard only for what walks every object: dropping a silent client's
    /// segments, ending a hot-key window. The reclaim of puts that never ended takes one shard
    /// at a time (each shard's unfinished puts are few: those in flight), and the rest needs the
    /// global state alone. So a sweep, every `sweep_interval`, stops no call on another shard:
    /// holding every shard it queued them all behind its holds and behind any call it waited
    /// for, a pause of every call in the master five times a second.
    fn sweep_at(&self, now: Instant) {
        let walk_all = {
            let st = self.state.lock();
            if !self.fence.leads(now) {
                return;
            }
            self.silent_clients(&st, now).next().is_some() || self.hot_tick_due(&st, now)
        };
        if walk_all {
            let mut st = self.lock_all();
            if !self.fence.leads(now) {
                return;
            }
            let gone: Vec<String> = self.silent_clients(&st, now).map(str::to_string).collect();
            self.drop_silent_clients(&mut st, now);
            // Their replica tasks will never be reported (the tasks' lock is a leaf).
            self.fail_tasks_of(&gone);
            self.hot_tick(&mut st, now);
            self.flush_news(&mut st);
        }
        for i in 0..SHARDS {
            let timed_out = |started: Instant| now.saturating_duration_since(started) > self.config.put_timeout;
            let shard = self.shard(i);
            let any_stale = shard.unfinished().any(|k| timed_out(shard[k].started.instant()));
            drop(shard);
            if !any_stale {
                continue;
            }
            let mut st = self.lock_shard(i);
            if !self.fence.leads(now) {
                return;
            }
            let stale: Vec<String> = st
                .objects
                .unfinished()
                .filter(|k| timed_out(st.objects[*k].started.instant()))
                .map(str::to_string)
                .collect();
            for key in stale {
                Self::remove_object(&mut st, &key, now);
                self.metrics.puts_reclaimed.inc();
                // Mooncake discards a stale put, then frees its space later; Crescent does both now.
                self.metrics.mooncake.put_start_discard_cnt.inc();
                self.metrics.mooncake.put_start_release_cnt.inc();
                tracing::warn!("put of {key:?} never ended: reclaimed after {:?}", self.config.put_timeout);
            }
            self.flush_news(&mut st);
        }
        let mut st = self.state.lock();
        if !self.fence.leads(now) {
            return;
        }
        self.reclaim_replications(&mut st, now);
        st.window.close_if_over(now);
        drop(st);
        self.expire_tasks(now);
        let mut st = self.state.lock();
        if Self::release_ended_holds(&mut st, now) {
            self.space_freed.notify_waiters();
        }
        st.names.prune();
        self.expire_published(&mut st, now);
        let evict = self.above_watermark(&st);
        // With the round's drops too: a round whose evictor gets little CPU still sends them
        // every sweep interval at least.
        self.flush_round_news(&mut st);
        drop(st);
        self.update_gauges();
        if evict {
            self.evict_soon(now);
        }
    }

    /// Clients that have not pinged within the client TTL.
    fn silent_clients<'s>(&self, st: &'s State, now: Instant) -> impl Iterator<Item = &'s str> + 's {
        let ttl = self.config.client_ttl;
        st.clients.iter().filter(move |(_, c)| now.saturating_duration_since(c.last_ping) > ttl).map(|(id, _)| &**id)
    }

    /// Drops the clients silent for longer than the client TTL, with their segments' objects.
    fn drop_silent_clients(&self, st: &mut Locked<'_>, now: Instant) {
        let silent: Vec<String> = self.silent_clients(st, now).map(str::to_string).collect();
        for id in silent {
            let client = st.clients.remove(&id).expect("listed above");
            if client.segments.is_empty() {
                // It unmounted everything (closed cleanly): nothing to drop, nothing to warn of.
                self.retract_client(st, &id);
                tracing::debug!("client {id} closed: forgotten");
                continue;
            }
            let mut lost = 0;
            for seg in client.segments {
                self.emit_segment_gone(st, seg);
                lost += Self::drop_segment(st, seg);
            }
            self.retract_client(st, &id);
            self.metrics.clients_dropped.inc();
            tracing::warn!(
                "client {id} silent for more than {:?}: dropped its segments; {lost} object(s) lost",
                self.config.client_ttl
            );
        }
    }

    /// Runs [`Self::sweep`] every `sweep_interval`, and the evictor (rounds of
    /// `evict_step` when a put or a sweep asks for one), until the master is dropped.
    pub fn start_sweeper(self: &Arc<Self>) {
        self.start_evictor();
        let weak = Arc::downgrade(self);
        let interval = self.config.sweep_interval;
        std::thread::Builder::new()
            .name("crescent-master-sweep".into())
            .spawn(move || {
                while let Some(master) = weak.upgrade() {
                    master.sweep();
                    master.save_removals_if_changed();
                    drop(master);
                    std::thread::sleep(interval);
                }
            })
            .expect("spawning the sweeper");
    }

    /// The evictor thread: woken when a round is wanted, it runs the round's steps, each under
    /// one short hold of the lock, so no put or get waits behind a whole round; at the nice
    /// value [`MasterConfig::evictor_nice`] (0 by default), above 0 so that on a busy machine
    /// the calls come first (a put that finds no room evicts what it needs itself,
    /// [`Self::evict_in`], so none fails for an evictor behind).
    fn start_evictor(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        let evictor = self.evictor.clone();
        if evictor.running.swap(true, Ordering::AcqRel) {
            return; // one is running already
        }
        let nice = self.config.evictor_nice;
        std::thread::Builder::new()
            .name(EVICTOR_THREAD.into())
            .spawn(move || {
                if nice != 0 {
                    // This thread only: on Linux a nice value is a thread's (who = 0: the
                    // caller), and a new thread starts with its creator's.
                    let to = rustix::process::getpriority_process(None).map_or(nice, |n| (n + nice).min(19));
                    if let Err(e) = rustix::process::setpriority_process(None, to) {
                        tracing::warn!("the evictor thread keeps the master's priority: setpriority({to}): {e}");
                    }
                }
                loop {
                    {
                        let mut wanted = evictor.wanted.lock();
                        if !*wanted {
                            // Woken by a request, or now and then to see whether the master is gone.
                            evictor.wake.wait_for(&mut wanted, Duration::from_millis(500));
                        }
                        if !std::mem::take(&mut *wanted) {
                            if weak.strong_count() == 0 {
                                return;
                            }
                            continue;
                        }
                    }
                    let Some(master) = weak.upgrade() else { return };
                    master.run_round_paced();
                }
            })
            .expect("spawning the evictor");
    }

    /// The evictor thread's round: its steps, each followed by a pause that keeps the round
    /// to [`MasterConfig::evictor_duty`] of one core, unless the round is urgent
    /// ([`Self::eviction_urgent`]). A round at full speed holds one core for its whole length
    /// (90 ms for 56 k objects at 1 M, over a second at 10 M), and on a machine whose cores the
    /// calls use, the calls that arrive meanwhile queue behind it; paced, the round takes
    /// longer and the calls keep their cores.
    fn run_round_paced(&self) {
        let duty = self.config.evictor_duty;
        loop {
            let started = Instant::now();
            if !self.evict_step(started, EVICTION_STEP) {
                return;
            }
            let pause = pause_after_step(started.elapsed(), duty, duty < 1.0 && self.eviction_urgent());
            if !pause.is_zero() {
                std::thread::sleep(pause);
            }
        }
    }

    /// Whether the round must go at full speed: a put found no room since it started, or
    /// memory use is past halfway from the high watermark to full.
    fn eviction_urgent(&self) -> bool {
        let st = self.state.lock();
        let hw = self.config.eviction_high_watermark;
        st.pressure || Self::used_above(&st, hw + (1.0 - hw) / 2.0)
    }

    // ---- views ----

    fn totals_of(st: &State) -> Totals {
        let (capacity, used) = st
            .segments
            .values()
            .filter(|s| s.tier != Tier::Ssd)
            .fold((0, 0), |(c, u), s| (c + s.alloc.capacity(), u + s.alloc.reserved()));
        Totals {
            capacity,
            used,
            keys: 0, // kept outside the global state: see Self::totals
            segments: st.segments.len() as u64,
            clients: st.clients.len() as u64,
        }
    }

    /// Its sizes now.
    pub fn totals(&self) -> Totals {
        Totals { keys: self.object_count(), ..Self::totals_of(&self.state.lock()) }
    }

    /// Sets the gauges a scrape reads that no operation keeps up to date: per-segment bytes,
    /// soft-pinned keys, values in memory and on disks (Mooncake's names).
    pub fn refresh_scrape_gauges(&self) {
        let now = Instant::now();
        let mc = &self.metrics.mooncake;
        {
            let st = self.state.lock();
            mc.segment_allocated_bytes.reset();
            mc.segment_total_capacity_bytes.reset();
            for s in st.segments.values().filter(|s| s.tier != Tier::Ssd) {
                mc.segment_allocated_bytes.with_label_values(&[s.name.as_str()]).set(s.alloc.reserved() as i64);
                mc.segment_total_capacity_bytes.with_label_values(&[s.name.as_str()]).set(s.alloc.capacity() as i64);
            }
        }
        // Every object, one shard at a time (no global lock): calls on the other shards go on.
        let (mut pinned, mut in_memory, mut on_disk) = (0, 0, 0);
        for i in 0..SHARDS {
            for o in self.shard(i).values() {
                pinned += o.soft_pinned(now) as i64;
                in_memory += (o.complete && !o.replicas.is_empty()) as i64;
                on_disk += (!o.ssd.is_empty()) as i64;
            }
        }
        mc.soft_pin_key_count.set(pinned);
        mc.mem_cache_nums.set(in_memory);
        mc.file_cache_nums.set(on_disk);
    }

    /// One line for the periodic log (`--enable_metric_reporting`).
    pub fn summary(&self) -> String {
        let t = self.totals();
        let m = &self.metrics;
        format!(
            "keys={} used={}/{} bytes segments={} clients={} puts={} gets={} evictions={}",
            t.keys,
            t.used,
            t.capacity,
            t.segments,
            t.clients,
            m.puts.get(),
            m.gets.get(),
            m.evictions.get()
        )
    }

    fn update_gauges(&self) {
        self.metrics.set_totals(&self.totals());
        self.metrics.metadata_bytes.set(self.metadata_bytes() as i64);
        self.metrics.metadata_limit.set(self.metadata_limit as i64);
    }

    /// At most `limit` keys of committed objects, in no particular order.
    pub fn keys(&self, limit: usize) -> Vec<String> {
        let mut keys = Vec::new();
        for i in 0..SHARDS {
            let shard = self.shard(i);
            keys.extend(shard.iter().filter(|(_, o)| o.complete).map(|(k, _)| k.to_string()).take(limit - keys.len()));
            if keys.len() == limit {
                break;
            }
        }
        keys
    }

    /// Every mounted segment, by id.
    pub fn segments(&self) -> Vec<SegmentView> {
        let st = self.state.lock();
        let mut v: Vec<SegmentView> = st
            .segments
            .iter()
            .map(|(id, s)| SegmentView {
                id: *id,
                name: s.name.clone(),
                client_id: s.client_id.clone(),
                host: s.host.clone(),
                tier: s.tier.as_str_name().to_string(),
                capacity: s.alloc.capacity(),
                used: s.alloc.reserved(),
            })
            .collect();
        v.sort_by_key(|s| s.id);
        v
    }
}

#[cfg(test)]
mod model_tests;
#[cfg(test)]
mod scale_tests;
#[cfg(test)]
mod sched_tests;
#[cfg(test)]
mod tests;
