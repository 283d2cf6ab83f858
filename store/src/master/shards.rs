//! The master's locks: the objects in [`SHARDS`] shards by key hash, each an [`ObjectMap`]
//! under its own mutex, and everything else ([`State`]: segments and their allocators,
//! clients, owner links, the disk tier's records, replications) under one more.
//!
//! Lock order: shards before the global state, shards in ascending index; never a shard while
//! holding the global state. A call on one key takes its shard, then the global state
//! ([`Master::lock_key`]); calls on keys of different shards wait for each other only for the
//! global state's short holds, never for each other's object work. Calls that walk every object
//! (a remount, a sweep that drops a silent client or ends a hot-key window, disk-file updates,
//! prefix queries) take every shard ([`Master::lock_all`]); unmount, remove-all, eviction
//! ([`Master::evict_step`]) and the sweep's reclaim of stale puts take one shard at a time.

use std::ops::{Deref, DerefMut, Index};
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::MutexGuard;
use smallvec::SmallVec;

use super::objects::{shard_of, Key, Object, ObjectMap, SHARDS};
use super::{Master, State};

/// The shards a call holds, seen as one map of the keys they hold: a key of a shard not held
/// is a bug of the call (it panics).
pub(super) struct Objects<'a> {
    /// Inline for the one shard of a call on one key: no allocation per call.
    guards: SmallVec<[MutexGuard<'a, ObjectMap>; 1]>,
    /// The shard of `guards[0]`; the others follow it.
    first: usize,
    /// The master's count of objects, kept by inserts and removals.
    count: &'a AtomicU64,
    /// The bytes of their keys, likewise.
    key_bytes: &'a AtomicU64,
}

impl Objects<'_> {
    fn shard(&self, key: &str) -> &ObjectMap {
        let i = shard_of(key);
        self.guards.get(i.wrapping_sub(self.first)).unwrap_or_else(|| panic!("shard {i} of {key:?} is not held"))
    }

    fn shard_mut(&mut self, key: &str) -> &mut ObjectMap {
        let i = shard_of(key);
        self.guards.get_mut(i.wrapping_sub(self.first)).unwrap_or_else(|| panic!("shard {i} of {key:?} is not held"))
    }

    pub(super) fn get(&self, key: &str) -> Option<&Object> {
        self.shard(key).get(key)
    }

    pub(super) fn get_mut(&mut self, key: &str) -> Option<&mut Object> {
        self.shard_mut(key).get_mut(key)
    }

    pub(super) fn contains_key(&self, key: &str) -> bool {
        self.shard(key).contains_key(key)
    }

    pub(super) fn insert(&mut self, key: impl Into<Key>, obj: Object) {
        let key = key.into();
        let len = key.as_str().len() as u64;
        if self.shard_mut(&key).insert(key, obj) {
            self.count.fetch_add(1, Ordering::Relaxed);
            self.key_bytes.fetch_add(len, Ordering::Relaxed);
        }
    }

    pub(super) fn remove(&mut self, key: &str) -> Option<Object> {
        let gone = self.shard_mut(key).remove(key);
        if gone.is_some() {
            self.count.fetch_sub(1, Ordering::Relaxed);
            self.key_bytes.fetch_sub(key.len() as u64, Ordering::Relaxed);
        }
        gone
    }

    pub(super) fn touch(&mut self, key: &str) {
        self.shard_mut(key).touch(key)
    }

    pub(super) fn commit(&mut self, key: &str) {
        self.shard_mut(key).commit(key)
    }

    /// The unfinished puts of the shards held.
    pub(super) fn unfinished(&self) -> impl Iterator<Item = &str> {
        self.guards.iter().flat_map(|g| g.unfinished())
    }

    /// The objects of the shards held.
    pub(super) fn iter(&self) -> impl Iterator<Item = (&str, &Object)> {
        self.guards.iter().flat_map(|g| g.iter())
    }

    pub(super) fn iter_mut(&mut self) -> Box<dyn Iterator<Item = (&str, &mut Object)> + '_> {
        Box::new(self.guards.iter_mut().flat_map(|g| g.iter_mut()))
    }
}

impl Index<&str> for Objects<'_> {
    type Output = Object;
    fn index(&self, key: &str) -> &Object {
        self.get(key).expect("a key of the object map")
    }
}

/// Shards and the global state, held together (in the lock order); reads as the [`State`].
pub(super) struct Locked<'a> {
    pub(super) objects: Objects<'a>,
    pub(super) g: MutexGuard<'a, State>,
}

impl Deref for Locked<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        &self.g
    }
}

impl DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut State {
        &mut self.g
    }
}

/// `(shard, index)` of each `(index, key)`, in ascending shard order: a batch walks it with
/// `chunk_by` to take each shard's lock once, in the lock order.
pub(super) fn by_shard<'k>(keys: impl IntoIterator<Item = (usize, &'k str)>) -> Vec<(usize, usize)> {
    let mut v: Vec<(usize, usize)> = keys.into_iter().map(|(i, key)| (shard_of(key), i)).collect();
    v.sort_unstable();
    v
}

impl Master {
    fn lock_shards(&self, first: usize, end: usize) -> Locked<'_> {
        let guards = self.shards[first..end].iter().map(|s| s.lock()).collect();
        let objects = Objects { guards, first, count: &self.object_count, key_bytes: &self.key_bytes };
        Locked { objects, g: self.state.lock() }
    }

    /// The shard of `key`, then the global state.
    pub(super) fn lock_key(&self, key: &str) -> Locked<'_> {
        self.lock_shard(shard_of(key))
    }

    /// Shard `i`, then the global state.
    pub(super) fn lock_shard(&self, i: usize) -> Locked<'_> {
        self.lock_shards(i, i + 1)
    }

    /// Every shard, then the global state: for the calls that walk every object.
    pub(super) fn lock_all(&self) -> Locked<'_> {
        self.lock_shards(0, SHARDS)
    }

    /// Shard `i` alone, for reads of its objects that need nothing global.
    pub(super) fn shard(&self, i: usize) -> MutexGuard<'_, ObjectMap> {
        self.shards[i].lock()
    }

    /// The shard of `key` alone.
    pub(super) fn shard_of_key(&self, key: &str) -> MutexGuard<'_, ObjectMap> {
        self.shard(shard_of(key))
    }

    /// Objects, committed or being written, in every shard.
    pub(super) fn object_count(&self) -> u64 {
        self.object_count.load(Ordering::Relaxed)
    }
}
