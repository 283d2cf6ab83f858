//! Files kept for reuse: a removed file is renamed into `<dir>/retired/` instead of being
//! deleted, and a later write renames it back under its temporary name and writes over it.
//!
//! Why: writing over blocks a file already owns skips what a new file costs the file system
//! (an inode, block allocation, and the metadata that `fdatasync` must then flush). On this
//! project's ext4 (no journal) a new file per value made 1 MiB offloads 20-30 % slower than
//! overwriting an old one (`benches/storebench ssd`, see docs/src/benchmarks.md). A file evicted to make
//! room is reused the same way by the write that evicted it ([`super::index::Room::reuse`]).
//!
//! The pool is bookkeeping only (the tier does the renames): its bytes count against the
//! tier's capacity like files', and when room is needed they go before any indexed file.
//! It holds at most `limit` bytes and [`MAX_FILES`] files; a restart adopts what it finds
//! in the directory. Only files nobody is reading are retired, since a reader's open
//! descriptor would otherwise see the next value's bytes.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};

/// The directory, under the tier's cluster directory.
pub const RETIRED_DIR: &str = "retired";
/// Most files kept, whatever their size.
pub const MAX_FILES: usize = 4096;

/// One retired file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retired {
    /// Its name in the retired directory.
    pub path: PathBuf,
    /// Bytes it takes on disk (whole 4 KiB blocks, see [`super::format::disk_len`]).
    pub len: u64,
}

/// The retired files, oldest first.
#[derive(Debug)]
pub struct RetiredFiles {
    dir: PathBuf,
    files: VecDeque<Retired>,
    bytes: u64,
    limit: u64,
    next_name: u64,
}

impl RetiredFiles {
    /// An empty pool whose files go to `dir` (made by the caller), holding at most `limit` bytes.
    pub fn new(dir: PathBuf, limit: u64) -> RetiredFiles {
        RetiredFiles { dir, files: VecDeque::new(), bytes: 0, limit, next_name: 0 }
    }

    /// Bytes of the files kept.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Files kept.
    pub fn len(&self) -> usize {
        self.files.len()
    }

    /// True when no file is kept.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// Whether a file of `len` bytes fits under the pool's own bounds.
    pub fn has_room_for(&self, len: u64) -> bool {
        self.files.len() < MAX_FILES && self.bytes + len <= self.limit
    }

    /// Takes a name for a file of `len` bytes about to be renamed into the pool (the caller
    /// checked [`Self::has_room_for`] and the capacity). [`Self::forget`] undoes it when the
    /// rename fails.
    pub fn admit(&mut self, len: u64) -> PathBuf {
        let path = self.dir.join(self.next_name.to_string());
        self.next_name += 1;
        self.bytes += len;
        self.files.push_back(Retired { path: path.clone(), len });
        path
    }

    /// Adds a file found in the directory at start (named by [`Self::admit`] in an earlier run).
    pub fn adopt(&mut self, name_number: u64, len: u64) {
        self.next_name = self.next_name.max(name_number + 1);
        self.bytes += len;
        self.files.push_back(Retired { path: self.dir.join(name_number.to_string()), len });
    }

    /// Drops `path` from the pool (its rename failed, or it went missing).
    pub fn forget(&mut self, path: &Path) {
        if let Some(i) = self.files.iter().position(|f| f.path == path) {
            let f = self.files.remove(i).expect("position is in range");
            self.bytes -= f.len;
        }
    }

    /// Takes the file best suited to be written over with `len` bytes: the smallest that
    /// holds them (no new blocks, least to trim), else the largest.
    pub fn take(&mut self, len: u64) -> Option<Retired> {
        let fits = self.files.iter().enumerate().filter(|(_, f)| f.len >= len).min_by_key(|(_, f)| f.len);
        let i = match fits {
            Some((i, _)) => i,
            None => self.files.iter().enumerate().max_by_key(|(_, f)| f.len)?.0,
        };
        let f = self.files.remove(i).expect("index from the same deque");
        self.bytes -= f.len;
        Some(f)
    }

    /// Takes the oldest file (to delete it when its room is needed).
    pub fn pop_oldest(&mut self) -> Option<Retired> {
        let f = self.files.pop_front()?;
        self.bytes -= f.len;
        Some(f)
    }
}

/// The number in a retired file's name, if `name` is one.
pub fn parse_retired_name(name: &str) -> Option<u64> {
    if name.is_empty() || name.len() > 20 || !name.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    name.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_the_smallest_file_that_holds_the_bytes_else_the_largest() {
        let mut pool = RetiredFiles::new(PathBuf::from("/r"), 1000);
        for len in [300, 100, 200] {
            assert!(pool.has_room_for(len));
            pool.admit(len);
        }
        assert_eq!(pool.bytes(), 600);
        assert_eq!(pool.take(150).unwrap().len, 200, "smallest that holds 150");
        assert_eq!(pool.take(500).unwrap().len, 300, "none holds 500: the largest");
        assert_eq!(pool.bytes(), 100);
        assert_eq!(pool.pop_oldest().unwrap().len, 100);
        assert!(pool.take(1).is_none() && pool.is_empty() && pool.bytes() == 0);
    }

    #[test]
    fn names_are_never_reused_and_bounds_hold() {
        let mut pool = RetiredFiles::new(PathBuf::from("/r"), 250);
        pool.adopt(7, 100);
        let a = pool.admit(100);
        assert_eq!(a, PathBuf::from("/r/8"), "after an adopted file's number");
        assert!(!pool.has_room_for(51), "250 bytes at most");
        assert!(pool.has_room_for(50));
        pool.forget(&a);
        assert_eq!((pool.len(), pool.bytes()), (1, 100));
        assert_ne!(pool.admit(10), a, "a forgotten name is not handed out again");
        assert_eq!(parse_retired_name("12"), Some(12));
        for bad in ["", "x1", "1.tmp", "-1", "123456789012345678901"] {
            assert_eq!(parse_retired_name(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_zero_limit_keeps_nothing() {
        let pool = RetiredFiles::new(PathBuf::from("/r"), 0);
        assert!(!pool.has_room_for(1));
    }
}
