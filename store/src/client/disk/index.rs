//! The disk tier's in-memory index: key → file in least-recently-used order (an unbounded
//! [`lru::LruCache`]: the bound is in bytes, which this module keeps), and the bytes used and
//! reserved against the capacity, counted as the files take them on disk (whole 4 KiB blocks),
//! with the retired files kept for reuse (see `super::recycle`).
//!
//! The rules: a file being read (pinned) is never evicted, and so never cut short or written
//! over under its reader; a reservation holds its bytes until released, so writes in progress
//! never overcommit the capacity together.

use std::path::PathBuf;

use lru::LruCache;

use super::recycle::{Retired, RetiredFiles};

/// One file on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The object's version at the master.
    pub version: u64,
    /// The value's length, in bytes.
    pub value_len: u64,
    /// Bytes the file takes on disk: its header and value in whole 4 KiB blocks
    /// ([`super::format::disk_len`]); the capacity counts these.
    pub disk_len: u64,
    /// The file's final name.
    pub path: PathBuf,
    /// Reads in progress: a pinned file is never evicted.
    pins: u32,
    /// The object had no replica in memory when this client last looked (a file found at
    /// start, or one a get fell back to): a get reads the file while it asks the master.
    pub only_copy: bool,
}

impl Entry {
    /// The entry of a file at `path`, not pinned and not marked the only copy.
    pub fn new(version: u64, value_len: u64, disk_len: u64, path: PathBuf) -> Entry {
        Entry { version, value_len, disk_len, path, pins: 0, only_copy: false }
    }

    /// Whether a read of the file is in progress.
    pub fn is_pinned(&self) -> bool {
        self.pins > 0
    }
}

/// Room made for a write by [`Index::reserve`].
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Room {
    /// Indexed files evicted: the caller tells the master, and deletes them except `reuse`.
    pub evicted: Vec<(String, Entry)>,
    /// A file to write over (a retired one, or one of `evicted`), with its present length.
    pub reuse: Option<Retired>,
    /// Retired files whose room was needed: the caller deletes them.
    pub discard: Vec<Retired>,
}

/// Why a reservation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoRoom {
    /// More than the whole tier (less what other writes reserved).
    TooLarge,
    /// It would fit, but only by evicting files that are being read.
    Pinned,
}

/// The index of one disk tier: its files by key in least-recently-used order, and the bytes
/// they use, writes have reserved and retired files keep, against the capacity. A write
/// reserves its bytes before it starts ([`Index::reserve`]), evicting unpinned files and
/// retired ones as needed, so writes in progress never overcommit the capacity together.
#[derive(Debug)]
pub struct Index {
    /// Most recently used first.
    map: LruCache<String, Entry>,
    /// Bytes of the files in the index.
    used: u64,
    /// Bytes promised to writes in progress.
    reserved: u64,
    capacity: u64,
    retired: RetiredFiles,
}

impl Index {
    /// An empty index of `capacity` bytes over the retired-file pool `retired`.
    pub fn new(capacity: u64, retired: RetiredFiles) -> Index {
        Index { map: LruCache::unbounded(), used: 0, reserved: 0, capacity, retired }
    }

    /// Bytes the tier may use on disk.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Sets the bytes the tier may use (an automatic capacity taken anew); files over a
    /// smaller one go at the next write's reservation.
    pub fn set_capacity(&mut self, capacity: u64) {
        self.capacity = capacity;
    }

    /// Bytes the indexed files take on disk (whole 4 KiB blocks).
    pub fn used(&self) -> u64 {
        self.used
    }
    /// Bytes of the retired files kept for reuse.
    pub fn retired_bytes(&self) -> u64 {
        self.retired.bytes()
    }
    /// Retired files kept for reuse.
    pub fn retired_files(&self) -> usize {
        self.retired.len()
    }
    /// Files in the index.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// The file of `key` (not a use: the order stays).
    pub fn get(&self, key: &str) -> Option<&Entry> {
        self.map.peek(key)
    }

    /// Marks a key as just used.
    pub fn touch(&mut self, key: &str) {
        self.map.promote(key);
    }

    /// Pins the file of (`key`, `version`) against eviction while it is read; false when
    /// the key has no such file.
    pub fn pin(&mut self, key: &str, version: u64) -> bool {
        match self.map.peek_mut(key) {
            Some(e) if e.version == version => {
                e.pins += 1;
                true
            }
            _ => false,
        }
    }

    /// Records whether (`key`, `version`) is, as far as a get just saw, the object's only copy
    /// (nothing when the key has another file now).
    pub fn set_only_copy(&mut self, key: &str, version: u64, only: bool) {
        if let Some(e) = self.map.peek_mut(key).filter(|e| e.version == version) {
            e.only_copy = only;
        }
    }

    /// Ends one read of (`key`, `version`) (nothing when the file went meanwhile).
    pub fn unpin(&mut self, key: &str, version: u64) {
        if let Some(e) = self.map.peek_mut(key).filter(|e| e.version == version) {
            e.pins = e.pins.saturating_sub(1);
        }
    }

    /// Adds (or replaces) a key's file as the most recently used; returns the replaced entry.
    pub fn insert(&mut self, key: &str, entry: Entry) -> Option<Entry> {
        let old = self.remove(key);
        self.used += entry.disk_len;
        self.map.put(key.to_string(), entry);
        old
    }

    /// Takes `key`'s file out of the index (its bytes no longer count as used), pinned or not;
    /// the caller deletes or retires it.
    pub fn remove(&mut self, key: &str) -> Option<Entry> {
        let e = self.map.pop(key)?;
        self.used -= e.disk_len;
        Some(e)
    }

    /// Reserves `bytes` for a write, making room by deleting retired files first (oldest
    /// first), then by evicting least recently used files that nobody is reading. The room
    /// names a file to write over when there is one (see [`Room`]). Fails, changing nothing,
    /// when `bytes` exceed the capacity even with every file evicted, or when only files being
    /// read could make room.
    pub fn reserve(&mut self, bytes: u64) -> Result<Room, NoRoom> {
        if bytes > self.capacity.saturating_sub(self.reserved) {
            return Err(NoRoom::TooLarge);
        }
        // Victims as if every retired file went: those go before any indexed file.
        let mut victims = Vec::new();
        let mut freed = 0;
        for (key, e) in self.map.iter().rev() {
            if self.used - freed + self.reserved + bytes <= self.capacity {
                break;
            }
            if e.pins == 0 {
                victims.push(key.clone());
                freed += e.disk_len;
            }
        }
        if self.used - freed + self.reserved + bytes > self.capacity {
            return Err(NoRoom::Pinned);
        }
        let mut room = Room::default();
        if bytes > 0 {
            room.reuse = self.retired.take(bytes);
        }
        while self.used - freed + self.retired.bytes() + self.reserved + bytes > self.capacity {
            match self.retired.pop_oldest() {
                Some(f) => room.discard.push(f),
                None => break,
            }
        }
        for key in victims {
            let e = self.map.pop(&key).expect("a victim is indexed");
            self.used -= e.disk_len;
            room.evicted.push((key, e));
        }
        if room.reuse.is_none() && bytes > 0 {
            let fits = room.evicted.iter().filter(|(_, e)| e.disk_len >= bytes).min_by_key(|(_, e)| e.disk_len);
            let best = fits.or_else(|| room.evicted.iter().max_by_key(|(_, e)| e.disk_len));
            room.reuse = best.map(|(_, e)| Retired { path: e.path.clone(), len: e.disk_len });
        }
        self.reserved += bytes;
        Ok(room)
    }

    /// A name in the retired files' directory for a file of `len` bytes that just left the
    /// index, when the pool and the capacity have room for it; the caller renames the file
    /// there (or calls [`Self::forget_retired`] when that fails).
    pub fn retire(&mut self, len: u64) -> Option<PathBuf> {
        self.can_keep_retired(len).then(|| self.retired.admit(len))
    }

    /// Whether a retired file of `len` bytes fits the capacity and the pool's own bounds.
    fn can_keep_retired(&self, len: u64) -> bool {
        self.used + self.retired.bytes() + self.reserved + len <= self.capacity && self.retired.has_room_for(len)
    }

    /// Takes every retired file out of the pool (the caller deletes them).
    pub fn drain_retired(&mut self) -> Vec<Retired> {
        std::iter::from_fn(|| self.retired.pop_oldest()).collect()
    }

    /// Drops `path` from the retired-file pool (its rename failed, or it went missing).
    pub fn forget_retired(&mut self, path: &std::path::Path) {
        self.retired.forget(path);
    }

    /// Takes a retired file found at start into the pool, when there is room; false: delete it.
    pub fn adopt_retired(&mut self, name_number: u64, len: u64) -> bool {
        let ok = self.can_keep_retired(len);
        if ok {
            self.retired.adopt(name_number, len);
        }
        ok
    }

    /// Returns a reservation (after the write was indexed or abandoned).
    pub fn release(&mut self, bytes: u64) {
        self.reserved -= bytes.min(self.reserved);
    }

    /// Every key with its file (for announcing them).
    pub fn entries(&self) -> Vec<(String, Entry)> {
        self.map.iter().map(|(k, e)| (k.clone(), e.clone())).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(len: u64) -> Entry {
        Entry::new(1, len, len, PathBuf::from("x"))
    }

    fn at(path: &str, len: u64) -> Entry {
        Entry::new(1, len, len, PathBuf::from(path))
    }

    /// An index of `capacity` bytes that keeps up to `retired` bytes of removed files.
    fn index(capacity: u64, retired: u64) -> Index {
        Index::new(capacity, RetiredFiles::new(PathBuf::from("/r"), retired))
    }

    fn keys(room: &Room) -> Vec<&str> {
        room.evicted.iter().map(|(k, _)| k.as_str()).collect()
    }

    #[test]
    fn reservations_evict_least_recently_used_first_and_never_overcommit() {
        let mut ix = index(100, 0);
        for k in ["a", "b", "c"] {
            assert_eq!(ix.reserve(30).unwrap(), Room::default());
            ix.insert(k, entry(30));
            ix.release(30);
        }
        ix.touch("a"); // b is now the least recently used
        let evicted = ix.reserve(30).unwrap();
        assert_eq!(keys(&evicted), ["b"]);
        assert!(ix.used() + 30 <= ix.capacity());
        // A reservation counts until released: the next one evicts more.
        let evicted = ix.reserve(40).unwrap();
        assert_eq!(keys(&evicted), ["c"]);
        assert_eq!(ix.reserve(31), Err(NoRoom::TooLarge), "70 reserved of 100: 31 more cannot fit, even evicting a");
        assert!(ix.get("a").is_some(), "a refused reservation evicts nothing");
        assert_eq!(ix.reserve(101), Err(NoRoom::TooLarge));
        ix.release(70);
        assert_eq!(ix.used(), 30);
    }

    #[test]
    fn files_being_read_are_never_evicted() {
        let mut ix = index(100, 0);
        for k in ["a", "b", "c"] {
            ix.insert(k, entry(30));
        }
        assert!(ix.pin("a", 1));
        assert!(!ix.pin("a", 2), "another version is not pinned");
        // "a" is the least recently used but is being read: "b" goes instead.
        let evicted = ix.reserve(30).unwrap();
        assert_eq!(keys(&evicted), ["b"]);
        ix.release(30);
        assert!(ix.pin("c", 1));
        assert_eq!(ix.reserve(50), Err(NoRoom::Pinned), "only pinned files could make room");
        assert!(ix.get("a").is_some() && ix.get("c").is_some());
        ix.unpin("a", 1);
        let evicted = ix.reserve(50).unwrap();
        assert_eq!(keys(&evicted), ["a"]);
    }

    #[test]
    fn replacing_a_key_frees_the_old_file() {
        let mut ix = index(100, 0);
        ix.insert("k", entry(60));
        let old = ix.insert("k", entry(10)).unwrap();
        assert_eq!(old.disk_len, 60);
        assert_eq!(ix.used(), 10);
        assert_eq!(ix.len(), 1);
        assert_eq!(ix.remove("k").unwrap().disk_len, 10);
        assert_eq!(ix.used(), 0);
    }

    #[test]
    fn a_write_reuses_the_file_it_evicts() {
        let mut ix = index(100, 0);
        ix.insert("a", at("/a", 30));
        ix.insert("b", at("/b", 60));
        let room = ix.reserve(50).unwrap();
        assert_eq!(keys(&room), ["a", "b"], "50 more need both out");
        assert_eq!(room.reuse, Some(Retired { path: "/b".into(), len: 60 }), "the smallest that holds 50");
        let mut ix = index(100, 0);
        ix.insert("a", at("/a", 30));
        ix.insert("b", at("/b", 60));
        let room = ix.reserve(80).unwrap();
        assert_eq!(room.reuse.unwrap().len, 60, "none holds 80: the largest");
        assert_eq!(index(100, 0).reserve(10).unwrap().reuse, None, "nothing to reuse in an empty tier");
    }

    #[test]
    fn retired_files_count_against_the_capacity_and_go_before_any_indexed_file() {
        let mut ix = index(100, 1000);
        ix.insert("a", at("/a", 40));
        ix.insert("b", at("/b", 40));
        let gone = ix.remove("a").unwrap();
        let name = ix.retire(gone.disk_len).expect("room for a retired file");
        assert_eq!(name.parent(), Some(std::path::Path::new("/r")));
        assert_eq!((ix.used(), ix.retired_bytes()), (40, 40));
        // 30 more: the retired file is written over, nothing indexed is evicted.
        let room = ix.reserve(30).unwrap();
        assert_eq!(room.reuse, Some(Retired { path: name, len: 40 }));
        assert!(room.evicted.is_empty() && room.discard.is_empty());
        assert_eq!(ix.retired_bytes(), 0);
        ix.insert("c", at("/c", 30));
        ix.release(30);
        let b = ix.remove("b").unwrap();
        let kept = ix.retire(b.disk_len).unwrap();
        assert!(ix.retire(31).is_none(), "30 used + 40 kept + 31 exceed the capacity: not kept");
        // A write of 60 takes the retired file (40 bytes, the largest there is) and needs
        // no eviction: 30 used + 60 reserved fit.
        let room = ix.reserve(60).unwrap();
        assert_eq!(room.reuse.map(|r| r.path), Some(kept));
        assert!(room.evicted.is_empty());
        ix.release(60);
    }

    #[test]
    fn retired_files_are_deleted_before_live_ones_are_evicted() {
        let mut ix = index(100, 1000);
        for (k, len) in [("a", 20), ("b", 20), ("c", 30)] {
            ix.insert(k, at(k, len));
        }
        for k in ["a", "b"] {
            let e = ix.remove(k).unwrap();
            ix.retire(e.disk_len).unwrap();
        }
        // 70 more: one retired file is reused, the other deleted, c stays.
        let room = ix.reserve(70).unwrap();
        assert!(room.reuse.is_some());
        assert_eq!(room.discard.len(), 1);
        assert!(room.evicted.is_empty(), "c stays: deleting retired files made the room");
        assert!(ix.get("c").is_some());
        assert_eq!(ix.retired_files(), 0);
        // A refused reservation changes nothing.
        let e = ix.remove("c").unwrap();
        ix.retire(e.disk_len).unwrap();
        assert_eq!(ix.reserve(31), Err(NoRoom::TooLarge));
        assert_eq!(ix.retired_files(), 1);
    }

    #[test]
    fn a_zero_retired_limit_keeps_nothing() {
        let mut ix = index(100, 0);
        ix.insert("a", at("/a", 10));
        let e = ix.remove("a").unwrap();
        assert!(ix.retire(e.disk_len).is_none());
        assert!(!ix.adopt_retired(1, 10));
    }
}
