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
//! (`admin`) are thin.
//!
//! The state and the logic over it that needs no lock, channel or clock are the private `core`
//! module's (segments, clients, versions, the eviction round's accounting, a put's record and
//! checks): functions of the state and `now`. Where replicas go is an allocator per strategy
//! (the private `allocation` module), which objects eviction takes an eviction policy (the
//! private `eviction` module). [`Master`] drives them: it reads the clock, holds the locks and
//! turns what they decide into owner news, events and metrics (a put's calls in the private
//! `writes` module, eviction rounds and the evictor thread in `evictor`).

pub mod access;
mod admin;
mod allocation;
mod blanks;
pub mod cli;
mod config;
pub mod conn_limit;
mod core;
mod disk;
mod events;
mod eviction;
mod evictor;
mod fence;
mod ha;
mod lease_holds;
mod metrics;
mod mooncake_metrics;
mod objects;
mod owners;
mod published;
mod query;
mod query_http;
mod rebuild;
mod removal_records;
mod removals_file;
mod replicate;
pub mod server;
pub mod service;
mod shards;
mod tasks;
pub mod tenant;
mod writes;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

pub(crate) use self::core::limits::check_key;
pub use self::core::limits::{MAX_REPLICAS, MIN_SEGMENT_SIZE, OBJECT_METADATA_BYTES};
use self::core::puts;
pub use self::core::puts::OFFLOAD_HOLD;
pub use self::core::rounds::EVICTION_NEWS_BATCH;
use self::core::state::{Client, CoreState, Segment};
pub use self::core::views::{DiskTotals, PingOutcome, ReplicaList, SegmentView, Totals};
use crate::error::{Result, StoreError};
use crate::proto::{EventKind, QueryKeyReply, ReplicaDescriptor, SegmentInfo, Tier};
pub use crate::protocol::{disk_segment_name, MAX_KEY_LEN, MAX_OBJECT_SIZE};
pub use blanks::{Granted, MAX_GRANT};
pub use config::{AllocationStrategy, MasterConfig};
#[cfg(test)]
use evictor::pause_after_step;
use evictor::Evictor;
pub use evictor::{EVICTION_STEP, EVICTOR_THREAD};
use metrics::Metrics;
use objects::{Object, ObjectMap, Replica, Stamp, SHARDS};
use removal_records::{Removal, Removed};
use shards::Locked;
pub use writes::Commit;

/// The machine's memory (bytes; at least a GiB).
fn physical_memory() -> u64 {
    let info = rustix::system::sysinfo();
    (info.totalram as u64).saturating_mul(u64::from(info.mem_unit.max(1))).max(1 << 30)
}

#[derive(Default)]
struct State {
    /// Segments, clients, versions and the eviction round ([`core::state`]).
    core: CoreState,
    /// Near-engine copies published by clients (never served by the store).
    published: published::Published,
    /// Blanks granted to clients and not used yet ([`blanks`]).
    blanks: blanks::Blanks,
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
}

impl State {
    fn fresh(first_version: u64) -> State {
        State {
            core: CoreState::fresh(first_version),
            held_generation: 1,
            max_pending_removals: disk::MAX_PENDING_REMOVALS,
            instant_acks: cfg!(test),
            ..State::default()
        }
    }
}

/// The master's state and logic: segments and clients, objects and their replicas, leases,
/// eviction, the owner links, the disk tier's records, events and metrics, all behind one lock.
/// Sans-IO where it can be: the network lives in [`service`] and [`server`]; every call that
/// changes the state first passes the `fence` (a standby refuses it).
pub struct Master {
    config: MasterConfig,
    /// Where puts' replicas go: [`MasterConfig::allocation_strategy`]'s allocator.
    allocator: Box<dyn allocation::Allocator>,
    /// Which objects eviction takes ([`eviction`]).
    eviction: Box<dyn eviction::EvictionPolicy>,
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
            allocator: allocation::for_strategy(config.allocation_strategy),
            eviction: Box::new(eviction::Lru),
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

    /// This master's term (see `fence` and `owners`).
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
    /// `inherited`: the removals earlier leaders recorded (`removal_records`), buried in the
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
        if let Some(again) = st.core.mounted_again(client_id, info) {
            return again;
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
        let (id, tier) = st.core.add_segment(client_id, info, host, now)?;
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
            if let Some(&id) = st.core.segment_by_name.get(&info.name) {
                if st.core.segments[&id].client_id == client_id {
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
            self.fence.check(now)?;
            match st.core.segments.get(&segment_id) {
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
        let seg = st.core.remove_segment(segment_id)?;
        // Its quarantine goes with it: the owner is gone or gave the memory up.
        st.owners.remove(&segment_id);
        st.holds.forget_segment(segment_id);
        st.blanks.forget_segment(segment_id);
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
        let now = Instant::now();
        let mut st = self.state.lock();
        if let Err(e) = self.fence.check(now) {
            return PingOutcome::NotLeader(e.to_string());
        }
        if Self::link_broken(&st, client_id) {
            return PingOutcome::NeedRemount;
        }
        if st.core.ping(client_id, now) {
            PingOutcome::Ok
        } else {
            PingOutcome::NeedRemount
        }
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

    /// Sends the owners' news queued and not sent yet (a `BatchPutStart`'s pending commits,
    /// one message per owner for the whole batch).
    pub fn flush_owner_news(&self) {
        self.flush_news(&mut self.state.lock());
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

    /// Where `obj`'s bytes are, as a client reads them: its memory replicas, then its disk copies.
    fn describe(st: &State, obj: &Object) -> Vec<ReplicaDescriptor> {
        puts::describe_memory(&st.core, obj).chain(Self::describe_disk_copies(st, obj)).collect()
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
            if let Some(seg) = st.core.segments.get_mut(&r.segment_id) {
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
            let next = st.core.next_version;
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
        let next = st.core.next_version;
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
            let next = st.core.next_version;
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
            let next = st.core.next_version;
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
            let timed_out = |started: Instant| puts::put_timed_out(started, self.config.put_timeout, now);
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
        let expired = Self::expire_blanks(&mut st, now);
        if expired > 0 {
            self.metrics.blanks_expired.inc_by(expired as u64);
            self.flush_news(&mut st);
        }
        st.window.close_if_over(now);
        drop(st);
        self.expire_tasks(now);
        let mut st = self.state.lock();
        if Self::release_ended_holds(&mut st, now) {
            self.space_freed.notify_waiters();
        }
        st.core.names.prune();
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
        st.core.silent_clients(self.config.client_ttl, now)
    }

    /// Drops the clients silent for longer than the client TTL, with their segments' objects.
    fn drop_silent_clients(&self, st: &mut Locked<'_>, now: Instant) {
        let silent: Vec<String> = self.silent_clients(st, now).map(str::to_string).collect();
        for id in silent {
            let client = st.core.clients.remove(&id).expect("listed above");
            Self::release_blanks_of(st, &id);
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

    // ---- views ----

    /// Its sizes now.
    pub fn totals(&self) -> Totals {
        Totals { keys: self.object_count(), ..self.state.lock().core.totals() }
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
            for s in st.core.segments.values().filter(|s| s.tier != Tier::Ssd) {
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
        self.state.lock().core.segment_views()
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
