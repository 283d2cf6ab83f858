//! The objects the master knows, kept in the order they were last used.
//!
//! [`ObjectMap`] is a hash map whose entries are also linked from the most to the least
//! recently used (the `lru` crate's list, unbounded: the master decides what goes, not a
//! capacity). A put, a commit and a get move their object to the front; everything else
//! (exists, queries, pins, disk announcements) leaves the order alone. Eviction walks from the
//! back and stops once it planned enough bytes ([`ObjectMap::eviction_plan`]), so what one
//! eviction costs is the objects it looks at, not the size of the store.
//!
//! Objects that eviction can never take as they are (unfinished puts, hard pins, objects with
//! no memory replica left) are moved to the front when the walk meets them: each is skipped at
//! most once until every other object was used or skipped, so they add a constant to each
//! walk, not one look per such object. Their place in the order is of no use to eviction: an
//! unfinished put moves to the front when it commits, a hard pin never ends, and an object
//! that gets a memory replica again (a report of an owner, a replication) is then as recent
//! as that. Protections that end with time (leases, soft pins) keep their place, as does an
//! object of another tenant: the walk passes them.

use std::collections::HashSet;
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use lru::LruCache;
use smallvec::SmallVec;
use thin_vec::ThinVec;

use crate::allocator::Block;

/// How many shards the objects are split into, by key hash ([`shard_of`]).
pub(super) const SHARDS: usize = 32;

/// The shard of `key`: a hash with fixed keys (the same shard in every run and process).
pub(super) fn shard_of(key: &str) -> usize {
    (BuildHasherDefault::<DefaultHasher>::default().hash_one(key) % SHARDS as u64) as usize
}

/// The use clock: every use of a committed object (its commit, a get, a report that brings it
/// back) takes the next tick, so that the shards' least-recently-used orders merge into one
/// ([`ObjectMap::eviction_plan`]). One for the process: ticks only need to grow.
static USE_CLOCK: AtomicU64 = AtomicU64::new(1);

fn next_tick() -> Stamp {
    Stamp(NonZeroU64::new(USE_CLOCK.fetch_add(1, Ordering::Relaxed)).expect("ticks start at 1"))
}

/// The instant [`Stamp`]s count from: the first time the master looks at the clock.
static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

/// An instant in 8 bytes (`Option<Stamp>` too, where `Option<Instant>` takes 16): nanoseconds
/// since [`EPOCH`], plus one. Instants before the epoch read as the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Stamp(NonZeroU64);

impl Stamp {
    /// Fixes the epoch: call before taking instants that will become stamps.
    pub(super) fn start_clock() {
        LazyLock::force(&EPOCH);
    }

    pub(super) fn of(t: Instant) -> Stamp {
        let nanos = t.saturating_duration_since(*EPOCH).as_nanos().min(u64::MAX as u128 - 1) as u64;
        Stamp(NonZeroU64::MIN.saturating_add(nanos))
    }

    pub(super) fn instant(self) -> Instant {
        *EPOCH + Duration::from_nanos(self.0.get() - 1)
    }
}

/// Later of a deadline and another.
pub(super) fn extend(until: &mut Option<Stamp>, to: Instant) {
    let to = Stamp::of(to);
    *until = Some(until.map_or(to, |t| t.max(to)));
}

/// Whether a deadline is still ahead at `now`.
pub(super) fn ahead(until: Option<Stamp>, now: Instant) -> bool {
    until.is_some_and(|t| t > Stamp::of(now))
}

/// One shared copy of the names objects refer to (their writers' client ids and disks): an
/// object holds a pointer, not a copy. Names no object refers to any more are dropped by
/// [`Names::prune`].
#[derive(Default)]
pub(super) struct Names(HashSet<Arc<str>>);

impl Names {
    pub(super) fn get(&mut self, name: &str) -> Arc<str> {
        if let Some(n) = self.0.get(name) {
            return n.clone();
        }
        let n: Arc<str> = name.into();
        self.0.insert(n.clone());
        n
    }

    pub(super) fn prune(&mut self) {
        self.0.retain(|n| Arc::strong_count(n) > 1);
    }
}

pub(super) struct Replica {
    pub(super) segment_id: u64,
    pub(super) block: Block,
    /// The seq of the commit news its owner was sent, plus one ([`Replica::news`]).
    news: Option<NonZeroU64>,
}

impl Replica {
    pub(super) fn new(segment_id: u64, block: Block, news: Option<u64>) -> Replica {
        let mut r = Replica { segment_id, block, news: None };
        r.set_news(news);
        r
    }

    /// The seq of the commit news its owner was sent ([`super::owners`]; 0: the owner reported
    /// it): from then on its range is freed only once the owner acknowledged a drop.
    pub(super) fn news(&self) -> Option<u64> {
        self.news.map(|n| n.get() - 1)
    }

    pub(super) fn set_news(&mut self, seq: Option<u64>) {
        // Seqs count news one by one from 1: u64::MAX is never reached.
        self.news = seq.and_then(|s| NonZeroU64::new(s.saturating_add(1)));
    }
}

pub(super) struct Object {
    pub(super) size: u64,
    pub(super) version: u64,
    /// Almost always one (inline: no allocation of its own).
    pub(super) replicas: SmallVec<[Replica; 1]>,
    /// Disk segments (tier SSD) holding a copy, read through their owner ([`super::disk`]);
    /// one pointer while empty.
    pub(super) ssd: ThinVec<u64>,
    /// The disk of the client that put this version (its offload may be in flight): a removal
    /// is queued for it even before its file is announced ([`super::disk`]).
    pub(super) offload_disk: Option<Arc<str>>,
    /// Committed: visible to gets. Set only through [`ObjectMap::commit`] once in the map.
    pub(super) complete: bool,
    /// The client writing it (none for objects rebuilt from reports or disks).
    pub(super) writer: Option<Arc<str>>,
    /// While the put is unfinished: when it started (the sweep reclaims it after the put
    /// timeout). Once committed: its last use, a tick of [`USE_CLOCK`] (set by [`ObjectMap`]),
    /// which orders objects of different shards for eviction. (One field for both keeps the
    /// record in its budget: an unfinished put is never evicted, a committed one never reclaimed.)
    pub(super) started: Stamp,
    pub(super) lease_until: Option<Stamp>,
    pub(super) soft_pin_until: Option<Stamp>,
    pub(super) hard_pin: bool,
    /// Set when the put commits, if its writer has a disk tier: the writer's disk writes the
    /// file from the replica in the writer's memory, so eviction takes this object only after
    /// every other candidate, until its file is announced or this passes ([`super::OFFLOAD_HOLD`]).
    pub(super) offload_held_until: Option<Stamp>,
}

impl Object {
    pub(super) fn leased(&self, now: Instant) -> bool {
        ahead(self.lease_until, now)
    }
    pub(super) fn soft_pinned(&self, now: Instant) -> bool {
        ahead(self.soft_pin_until, now)
    }
    pub(super) fn offload_held(&self, now: Instant) -> bool {
        ahead(self.offload_held_until, now)
    }
    pub(super) fn evictable(&self, now: Instant) -> bool {
        self.complete && !self.hard_pin && !self.leased(now) && !self.soft_pinned(now)
    }
    /// Its last use, once committed ([`USE_CLOCK`]).
    pub(super) fn tick(&self) -> u64 {
        self.started.0.get()
    }
    /// Whether `client` is writing it.
    pub(super) fn written_by(&self, client: &str) -> bool {
        self.writer.as_deref() == Some(client)
    }
    /// Eviction cannot take it until something else changes it first (see the module doc).
    fn never_evictable_as_is(&self) -> bool {
        !self.complete || self.hard_pin || self.replicas.is_empty()
    }
    /// The bytes of memory its eviction gives up.
    fn memory_bytes(&self) -> u64 {
        self.replicas.iter().map(|r| r.block.reserved).sum()
    }
}

/// One object an eviction plan takes.
#[derive(Debug)]
pub(super) struct Victim {
    pub(super) key: String,
    /// Its last use ([`USE_CLOCK`]): the plans of several shards merge by it.
    pub(super) tick: u64,
    /// The memory its eviction frees.
    pub(super) bytes: u64,
    /// Its file is still being written from memory: it goes after every other candidate.
    pub(super) held: bool,
}

/// What an eviction takes, in its order, and what it moves out of its way.
#[derive(Debug, Default)]
pub(super) struct EvictionPlan {
    pub(super) victims: Vec<Victim>,
    /// Keys met that eviction cannot take as they are: to move to the front.
    pub(super) parked: Vec<String>,
    /// The plan stopped early (enough bytes, or `most` objects): the shard may have more
    /// candidates, all after its last victim.
    pub(super) more: bool,
}

/// Key → object, ordered by last use (see the module doc).
pub(super) struct ObjectMap {
    map: LruCache<Box<str>, Object>,
    /// Keys of the puts not committed yet (few: those in flight), for the sweep's reclaim.
    unfinished: std::collections::HashSet<Box<str>>,
}

impl Default for ObjectMap {
    fn default() -> Self {
        ObjectMap { map: LruCache::unbounded(), unfinished: Default::default() }
    }
}

impl ObjectMap {
    /// The object, without changing the order.
    pub(super) fn get(&self, key: &str) -> Option<&Object> {
        self.map.peek(key)
    }

    /// The object to change, without changing the order.
    pub(super) fn get_mut(&mut self, key: &str) -> Option<&mut Object> {
        self.map.peek_mut(key)
    }

    pub(super) fn contains_key(&self, key: &str) -> bool {
        self.map.contains(key)
    }

    /// Adds (or replaces) an object as the most recently used; returns whether the key is new.
    pub(super) fn insert(&mut self, key: impl Into<Box<str>>, mut obj: Object) -> bool {
        let key = key.into();
        if obj.complete {
            obj.started = next_tick();
            self.unfinished.remove(&key);
        } else {
            self.unfinished.insert(key.clone());
        }
        self.map.put(key, obj).is_none()
    }

    pub(super) fn remove(&mut self, key: &str) -> Option<Object> {
        self.unfinished.remove(key);
        self.map.pop(key)
    }

    /// `key` was just used: it becomes the most recently used.
    pub(super) fn touch(&mut self, key: &str) {
        if let Some(obj) = self.map.get_mut(key) {
            if obj.complete {
                obj.started = next_tick();
            }
        }
    }

    /// Commits a put: visible from now on, and the most recently used.
    pub(super) fn commit(&mut self, key: &str) {
        if let Some(obj) = self.map.get_mut(key) {
            obj.complete = true;
            obj.started = next_tick();
            self.unfinished.remove(key);
        }
    }

    /// The keys of puts not committed yet.
    pub(super) fn unfinished(&self) -> impl Iterator<Item = &str> {
        self.unfinished.iter().map(|k| &**k)
    }

    /// Every object, most recently used first.
    pub(super) fn iter(&self) -> impl Iterator<Item = (&str, &Object)> {
        self.map.iter().map(|(k, v)| (&**k, v))
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &Object> {
        self.map.iter().map(|(_, v)| v)
    }

    pub(super) fn iter_mut(&mut self) -> impl Iterator<Item = (&str, &mut Object)> {
        self.map.iter_mut().map(|(k, v)| (&**k, v))
    }

    /// The objects eviction takes to free `target` bytes, least recently used first, among
    /// those `eligible` (a tenant's) and evictable at `now`; objects whose file is still being
    /// written from memory (`offload_held_until`) only after every other one. It stops at the
    /// first object that brings the bytes planned to `target`, or at `most` objects (the
    /// next plan goes on from there: the victims of this one will be gone).
    pub(super) fn eviction_plan(
        &self,
        now: Instant,
        target: u64,
        most: usize,
        eligible: impl Fn(&str) -> bool,
    ) -> EvictionPlan {
        let mut plan = EvictionPlan::default();
        let mut held = Vec::new();
        let mut planned = 0;
        for (key, obj) in self.map.iter().rev() {
            if planned >= target || plan.victims.len() >= most {
                // Enough, or the rest for the next plan: no object put aside is needed yet.
                plan.more = true;
                return plan;
            }
            if obj.never_evictable_as_is() {
                plan.parked.push(key.to_string());
                continue;
            }
            if !obj.evictable(now) || !eligible(key) {
                continue;
            }
            let victim =
                Victim { key: key.to_string(), tick: obj.started.0.get(), bytes: obj.memory_bytes(), held: false };
            if obj.offload_held(now) {
                held.push(Victim { held: true, ..victim });
                continue;
            }
            planned += victim.bytes;
            plan.victims.push(victim);
        }
        for victim in held {
            if planned >= target || plan.victims.len() >= most {
                plan.more = true;
                break;
            }
            planned += victim.bytes;
            plan.victims.push(victim);
        }
        plan
    }
}

impl std::ops::Index<&str> for ObjectMap {
    type Output = Object;
    fn index(&self, key: &str) -> &Object {
        self.get(key).expect("a key of the object map")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_object_record_fits_its_memory_budget() {
        // docs/src/store.md#inside-the-master: 136 bytes, and one replica without an
        // allocation of its own.
        assert!(std::mem::size_of::<Object>() <= 136, "Object is {} bytes", std::mem::size_of::<Object>());
        assert_eq!(std::mem::size_of::<Replica>(), 32);
        assert_eq!(std::mem::size_of::<Option<Stamp>>(), 8);
        let block = Block { offset: 0, reserved: 4096 };
        let replicas: SmallVec<[Replica; 1]> = smallvec::smallvec![Replica::new(1, block, Some(0))];
        assert!(!replicas.spilled());
        assert_eq!(replicas[0].news(), Some(0), "seq 0 (reported by its owner) is kept");
    }
}
