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

use std::collections::HashMap;
use std::hash::BuildHasher;
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

/// The hash that picks a key's shard: foldhash's quality variant, seeded at random once per
/// process. Keys come from the network; a seed nobody outside knows keeps a peer from
/// choosing keys that all fall into one shard (which would serialise them on one lock, as
/// the master before shards did), and a call hashes its key several times ([`shard_of`] per
/// look-up): SipHash, with the fixed keys it had, was 3-4 % of the master's CPU in
/// `storebench master`. The shards' own maps (the `lru` crate's hashbrown) use foldhash with
/// a random seed per map as well.
static SHARD_HASH: LazyLock<foldhash::quality::RandomState> = LazyLock::new(Default::default);

/// The shard of `key` (the same for the same key throughout the process, not across runs).
pub(super) fn shard_of(key: &str) -> usize {
    (SHARD_HASH.hash_one(key) % SHARDS as u64) as usize
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

/// Who wrote an object: its client, and that client's disk (whose offload of the object may
/// be in flight: a removal is queued for it even before its file is announced, see
/// [`super::disk`]). One copy per (client, disk), shared by all its objects ([`Names`]): an
/// object holds one thin pointer.
#[derive(Debug)]
pub(super) struct Writer {
    pub(super) client: Box<str>,
    pub(super) disk: Option<Box<str>>,
}

/// The [`Writer`]s objects refer to, one copy each, by client id. Writers no object refers to
/// any more are dropped by [`Names::prune`].
#[derive(Default)]
pub(super) struct Names(HashMap<Box<str>, SmallVec<[Arc<Writer>; 1]>>);

impl Names {
    pub(super) fn writer(&mut self, client: &str, disk: Option<&str>) -> Arc<Writer> {
        let of_client = match self.0.get_mut(client) {
            Some(w) => w,
            None => self.0.entry(client.into()).or_default(),
        };
        if let Some(w) = of_client.iter().find(|w| w.disk.as_deref() == disk) {
            return w.clone();
        }
        let w = Arc::new(Writer { client: client.into(), disk: disk.map(Into::into) });
        of_client.push(w.clone());
        w
    }

    pub(super) fn prune(&mut self) {
        self.0.retain(|_, of_client| {
            of_client.retain(|w| Arc::strong_count(w) > 1);
            !of_client.is_empty()
        });
    }
}

/// An object's key: up to 24 bytes inside the record (where a `Box<str>` takes 16 and an
/// allocation of 32 with malloc's header for a 12-24-byte key), longer ones on the heap.
/// Hashes and compares as its `str`, so maps of keys are looked up by `&str`.
pub(super) type Key = compact_str::CompactString;

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

    /// The seq of the last commit news its owner was sent, pending or complete
    /// ([`super::owners`]; 0: the owner reported it): from then on its range is freed only
    /// once the owner acknowledged a drop.
    pub(super) fn news(&self) -> Option<u64> {
        self.news.map(|n| n.get() - 1)
    }

    pub(super) fn set_news(&mut self, seq: Option<u64>) {
        // Seqs count news one by one from 1: u64::MAX is never reached.
        self.news = seq.and_then(|s| NonZeroU64::new(s.saturating_add(1)));
    }
}

/// An object's end-to-end checksum as the master keeps it: the CRC-32 its writer took of the
/// value (see the proto's `Checksum`), or none. 5 bytes of alignment 1 (an `Option<u32>` takes
/// 8 with alignment 4), so that it fits in the padding after the record's flags: the record
/// stays at 112 bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Checksum(Option<[u8; 4]>);

impl Checksum {
    pub(super) fn new(crc32: Option<u32>) -> Checksum {
        Checksum(crc32.map(u32::to_le_bytes))
    }

    pub(super) fn get(self) -> Option<u32> {
        self.0.map(u32::from_le_bytes)
    }

    /// As the wire has it (absent: none).
    pub(super) fn to_proto(self) -> Option<crate::proto::Checksum> {
        self.get().map(|crc32| crate::proto::Checksum { crc32 })
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
    /// Committed: visible to gets. Set only through [`ObjectMap::commit`] once in the map.
    pub(super) complete: bool,
    /// The client that put this version and its disk (none for objects rebuilt from reports
    /// or disks): one shared pointer.
    pub(super) writer: Option<Arc<Writer>>,
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
    /// The checksum its writer took of the value at the commit (none: not taken; objects
    /// rebuilt from disk reports have none).
    pub(super) checksum: Checksum,
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
        self.writer.as_ref().is_some_and(|w| &*w.client == client)
    }
    /// The disk of the client that put this version, if it has one: its offload may be in
    /// flight, so a removal is queued for it even before its file is announced.
    pub(super) fn offload_disk(&self) -> Option<&str> {
        self.writer.as_ref()?.disk.as_deref()
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
    /// Inline up to 24 bytes, as in the map: planning allocates nothing per object.
    pub(super) key: Key,
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
    pub(super) parked: Vec<Key>,
    /// The plan stopped early (enough bytes, or `most` objects): the shard may have more
    /// candidates, all after its last victim.
    pub(super) more: bool,
}

/// Key → object, ordered by last use (see the module doc).
pub(super) struct ObjectMap {
    map: LruCache<Key, Object>,
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
    pub(super) fn insert(&mut self, key: impl Into<Key>, mut obj: Object) -> bool {
        let key = key.into();
        if obj.complete {
            obj.started = next_tick();
            self.unfinished.remove(key.as_str());
        } else {
            self.unfinished.insert(key.as_str().into());
        }
        self.map.put(key, obj).is_none()
    }

    pub(super) fn remove(&mut self, key: &str) -> Option<Object> {
        let obj = self.map.pop(key)?;
        // Only an unfinished put's key is in the set: a committed object's removal (every
        // eviction's) does not hash the key for it.
        if !obj.complete {
            self.unfinished.remove(key);
        }
        Some(obj)
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
                plan.parked.push(key.clone());
                continue;
            }
            if !obj.evictable(now) || !eligible(key) {
                continue;
            }
            let victim = Victim { key: key.clone(), tick: obj.started.0.get(), bytes: obj.memory_bytes(), held: false };
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
        // docs/src/store.md#inside-the-master: 112 bytes, one replica without an allocation of
        // its own, the writer one thin pointer, and a short key inside the list's node.
        assert!(std::mem::size_of::<Object>() <= 112, "Object is {} bytes", std::mem::size_of::<Object>());
        assert_eq!(std::mem::size_of::<Replica>(), 32);
        assert_eq!(std::mem::size_of::<Option<Stamp>>(), 8);
        assert_eq!(std::mem::size_of::<Option<Arc<Writer>>>(), 8);
        assert_eq!(std::mem::size_of::<Key>(), 24);
        let block = Block { offset: 0, reserved: 4096 };
        let replicas: SmallVec<[Replica; 1]> = smallvec::smallvec![Replica::new(1, block, Some(0))];
        assert!(!replicas.spilled());
        assert_eq!(replicas[0].news(), Some(0), "seq 0 (reported by its owner) is kept");
    }

    fn object(writer: Option<Arc<Writer>>) -> Object {
        Object {
            size: 1,
            version: 1,
            replicas: SmallVec::new(),
            ssd: ThinVec::new(),
            complete: true,
            writer,
            started: Stamp::of(Instant::now()),
            lease_until: None,
            soft_pin_until: None,
            hard_pin: false,
            offload_held_until: None,
            checksum: Default::default(),
        }
    }

    #[test]
    fn keys_inline_or_boxed_are_found_by_their_str() {
        let short = "o/0000000042";
        let at_limit = "k".repeat(24);
        let long = "l".repeat(25);
        let utf8 = "ключ/é"; // multi-byte, within the limit in bytes
        assert!(!Key::from(short).is_heap_allocated());
        assert!(!Key::from(at_limit.as_str()).is_heap_allocated());
        assert!(Key::from(long.clone()).is_heap_allocated());
        let mut map = ObjectMap::default();
        for k in [short, at_limit.as_str(), long.as_str(), utf8] {
            assert!(map.insert(k.to_string(), object(None)), "{k} is new");
        }
        for k in [short, at_limit.as_str(), long.as_str(), utf8] {
            assert!(map.contains_key(k), "{k}");
            assert_eq!(map.iter().filter(|(key, _)| *key == k).count(), 1, "{k} listed as itself");
        }
        assert!(!map.contains_key(&at_limit[1..]) && !map.contains_key(&long[1..]));
        assert!(!map.insert(short, object(None)), "the same key again replaces it");
        assert!(map.remove(&long).is_some() && !map.contains_key(&long));
        // A shard is chosen by the key's str: the same for a key inline or not.
        assert_eq!(shard_of(Key::from(long.as_str()).as_str()), shard_of(&long));
    }

    #[test]
    fn writers_are_shared_per_client_and_disk_and_pruned() {
        let mut names = Names::default();
        let a = names.writer("a", None);
        let a_disk = names.writer("a", Some("ssd:a"));
        assert!(Arc::ptr_eq(&a, &names.writer("a", None)));
        assert!(!Arc::ptr_eq(&a, &a_disk));
        let (o, o_disk) = (object(Some(a.clone())), object(Some(a_disk.clone())));
        assert!(o.written_by("a") && !o.written_by("b"));
        assert_eq!((o.offload_disk(), o_disk.offload_disk()), (None, Some("ssd:a")));
        drop((a, a_disk, o_disk));
        names.prune();
        assert!(Arc::ptr_eq(o.writer.as_ref().unwrap(), &names.writer("a", None)), "still referred to: kept");
        assert_eq!(names.0["a"].len(), 1, "the writer with the disk no object refers to is gone");
        drop(o);
        names.prune();
        assert!(names.0.is_empty());
    }
}
