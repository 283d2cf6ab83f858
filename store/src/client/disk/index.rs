//! The disk tier's in-memory index: key → file, least-recently-used order, and the bytes
//! used and reserved against the capacity.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

/// One file on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub version: u64,
    pub value_len: u64,
    /// Bytes the file takes (header and value).
    pub file_len: u64,
    pub path: PathBuf,
    tick: u64,
    /// Reads in progress: a pinned file is never evicted.
    pins: u32,
}

impl Entry {
    pub fn new(version: u64, value_len: u64, file_len: u64, path: PathBuf) -> Entry {
        Entry { version, value_len, file_len, path, tick: 0, pins: 0 }
    }
}

/// Why a reservation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoRoom {
    /// More than the whole tier (less what other writes reserved).
    TooLarge,
    /// It would fit, but only by evicting files that are being read.
    Pinned,
}

#[derive(Debug)]
pub struct Index {
    map: HashMap<String, Entry>,
    lru: BTreeMap<u64, String>,
    tick: u64,
    /// Bytes of the files in the index.
    used: u64,
    /// Bytes promised to writes in progress.
    reserved: u64,
    capacity: u64,
}

impl Index {
    pub fn new(capacity: u64) -> Index {
        Index { map: HashMap::new(), lru: BTreeMap::new(), tick: 0, used: 0, reserved: 0, capacity }
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }
    pub fn used(&self) -> u64 {
        self.used
    }
    pub fn len(&self) -> usize {
        self.map.len()
    }
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn get(&self, key: &str) -> Option<&Entry> {
        self.map.get(key)
    }

    /// Marks a key as just used.
    pub fn touch(&mut self, key: &str) {
        self.tick += 1;
        if let Some(e) = self.map.get_mut(key) {
            self.lru.remove(&e.tick);
            e.tick = self.tick;
            self.lru.insert(self.tick, key.to_string());
        }
    }

    /// Pins the file of (`key`, `version`) against eviction while it is read; false when
    /// the key has no such file.
    pub fn pin(&mut self, key: &str, version: u64) -> bool {
        match self.map.get_mut(key) {
            Some(e) if e.version == version => {
                e.pins += 1;
                true
            }
            _ => false,
        }
    }

    /// Ends one read of (`key`, `version`) (nothing when the file went meanwhile).
    pub fn unpin(&mut self, key: &str, version: u64) {
        if let Some(e) = self.map.get_mut(key).filter(|e| e.version == version) {
            e.pins = e.pins.saturating_sub(1);
        }
    }

    /// Adds (or replaces) a key's file as the most recently used; returns the replaced entry.
    pub fn insert(&mut self, key: &str, mut entry: Entry) -> Option<Entry> {
        let old = self.remove(key);
        self.tick += 1;
        entry.tick = self.tick;
        self.used += entry.file_len;
        self.lru.insert(self.tick, key.to_string());
        self.map.insert(key.to_string(), entry);
        old
    }

    pub fn remove(&mut self, key: &str) -> Option<Entry> {
        let e = self.map.remove(key)?;
        self.lru.remove(&e.tick);
        self.used -= e.file_len;
        Some(e)
    }

    /// Reserves `bytes` for a write, evicting least recently used files that nobody is
    /// reading until they fit. Returns the evicted files (the caller deletes them and tells
    /// the master), or why not: `bytes` exceed the capacity even with every file evicted, or
    /// would need pinned files to go (nothing is evicted then).
    pub fn reserve(&mut self, bytes: u64) -> Result<Vec<(String, Entry)>, NoRoom> {
        if bytes > self.capacity.saturating_sub(self.reserved) {
            return Err(NoRoom::TooLarge);
        }
        let mut victims = Vec::new();
        let mut freed = 0;
        for (tick, key) in &self.lru {
            if self.used - freed + self.reserved + bytes <= self.capacity {
                break;
            }
            let e = &self.map[key];
            if e.pins == 0 {
                victims.push(*tick);
                freed += e.file_len;
            }
        }
        if self.used - freed + self.reserved + bytes > self.capacity {
            return Err(NoRoom::Pinned);
        }
        let mut evicted = Vec::with_capacity(victims.len());
        for tick in victims {
            let key = self.lru.remove(&tick).expect("a victim is indexed");
            let e = self.map.remove(&key).expect("lru and map agree");
            self.used -= e.file_len;
            evicted.push((key, e));
        }
        self.reserved += bytes;
        Ok(evicted)
    }

    /// Returns a reservation (after the write was indexed or abandoned).
    pub fn release(&mut self, bytes: u64) {
        self.reserved -= bytes.min(self.reserved);
    }

    /// Every key with its file (for announcing them).
    pub fn entries(&self) -> Vec<(String, Entry)> {
        self.map.iter().map(|(k, e)| (k.clone(), e.clone())).collect()
    }

    /// Keys matching `f`.
    pub fn keys_where(&self, f: impl Fn(&str) -> bool) -> Vec<String> {
        self.map.keys().filter(|k| f(k)).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(len: u64) -> Entry {
        Entry::new(1, len, len, PathBuf::from("x"))
    }

    #[test]
    fn reservations_evict_least_recently_used_first_and_never_overcommit() {
        let mut ix = Index::new(100);
        for k in ["a", "b", "c"] {
            assert_eq!(ix.reserve(30).unwrap(), vec![]);
            ix.insert(k, entry(30));
            ix.release(30);
        }
        ix.touch("a"); // b is now the least recently used
        let evicted = ix.reserve(30).unwrap();
        assert_eq!(evicted.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(), ["b"]);
        assert!(ix.used() + 30 <= ix.capacity());
        // A reservation counts until released: the next one evicts more.
        let evicted = ix.reserve(40).unwrap();
        assert_eq!(evicted.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(), ["c"]);
        assert_eq!(ix.reserve(31), Err(NoRoom::TooLarge), "70 reserved of 100: 31 more cannot fit, even evicting a");
        assert!(ix.get("a").is_some(), "a refused reservation evicts nothing");
        assert_eq!(ix.reserve(101), Err(NoRoom::TooLarge));
        ix.release(70);
        assert_eq!(ix.used(), 30);
    }

    #[test]
    fn files_being_read_are_never_evicted() {
        let mut ix = Index::new(100);
        for k in ["a", "b", "c"] {
            ix.insert(k, entry(30));
        }
        assert!(ix.pin("a", 1));
        assert!(!ix.pin("a", 2), "another version is not pinned");
        // "a" is the least recently used but is being read: "b" goes instead.
        let evicted = ix.reserve(30).unwrap();
        assert_eq!(evicted.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(), ["b"]);
        ix.release(30);
        assert!(ix.pin("c", 1));
        assert_eq!(ix.reserve(50), Err(NoRoom::Pinned), "only pinned files could make room");
        assert!(ix.get("a").is_some() && ix.get("c").is_some());
        ix.unpin("a", 1);
        let evicted = ix.reserve(50).unwrap();
        assert_eq!(evicted.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(), ["a"]);
    }

    #[test]
    fn replacing_a_key_frees_the_old_file() {
        let mut ix = Index::new(100);
        ix.insert("k", entry(60));
        let old = ix.insert("k", entry(10)).unwrap();
        assert_eq!(old.file_len, 60);
        assert_eq!(ix.used(), 10);
        assert_eq!(ix.len(), 1);
        assert_eq!(ix.remove("k").unwrap().file_len, 10);
        assert_eq!(ix.used(), 0);
    }
}
