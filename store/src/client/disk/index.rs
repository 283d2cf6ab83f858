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
}

impl Entry {
    pub fn new(version: u64, value_len: u64, file_len: u64, path: PathBuf) -> Entry {
        Entry { version, value_len, file_len, path, tick: 0 }
    }
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

    /// Reserves `bytes` for a write, evicting least recently used files until they fit.
    /// Returns the evicted files (the caller deletes them and tells the master), or `None`
    /// when `bytes` exceed the capacity even with every file evicted (nothing is evicted then).
    pub fn reserve(&mut self, bytes: u64) -> Option<Vec<(String, Entry)>> {
        if bytes > self.capacity.saturating_sub(self.reserved) {
            return None;
        }
        let mut evicted = Vec::new();
        while self.used + self.reserved + bytes > self.capacity {
            let (_, key) = self.lru.pop_first().expect("used > 0 means files are indexed");
            let e = self.map.remove(&key).expect("lru and map agree");
            self.used -= e.file_len;
            evicted.push((key, e));
        }
        self.reserved += bytes;
        Some(evicted)
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
        assert!(ix.reserve(31).is_none(), "70 reserved of 100: 31 more cannot fit, even evicting a");
        assert!(ix.get("a").is_some(), "a refused reservation evicts nothing");
        assert!(ix.reserve(101).is_none());
        ix.release(70);
        assert_eq!(ix.used(), 30);
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
