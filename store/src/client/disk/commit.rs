//! Commit rounds: how files written under temporary names become durable under their final
//! names before anyone is told of them. The committer takes the files the writers finished
//! since its last round (up to [`COMMIT_BATCH`]) and, per the [`FsyncScope`], flushes their
//! data, renames each to its final name and flushes the renames ([`commit_round`]); the tier
//! then indexes the round's files and announces them in one call. A file the round cannot
//! make durable is given up (its temporary or final name removed): it is never announced.
//!
//! Crash guarantees: a final name names a complete file, also after a power loss (its data
//! was flushed before the rename, with `fsync` on); a file the master has heard of was
//! durable under its final name first. Without `fsync` (`disk_fsync false`), a crash of the
//! process is still safe (the page cache survives it) and a power loss may leave a final
//! name with missing data, which the value's checksum catches on every read.

use std::path::{Path, PathBuf};

use super::file::{self, Staged};
use crate::error::{Result, StoreError};

/// Most files one commit round flushes, renames and announces together.
pub const COMMIT_BATCH: usize = 64;

/// What one flush covers. Either way a file is flushed before its rename, and the renames
/// before the master hears of the files: a final name names a complete file, also after a
/// power loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FsyncScope {
    /// The committer takes the files written since its last round (up to `COMMIT_BATCH`),
    /// flushes the storage root's file system (`syncfs`), renames them, and flushes it again:
    /// two device flushes a round, however many files it has. The writers do not flush. Best
    /// where the storage root has its file system (or device) to itself, the usual case: a
    /// `syncfs` also writes out what other programs left unwritten on that file system.
    #[default]
    FileSystem,
    /// Each writer flushes its file (`fdatasync`); the committer renames a round's files and
    /// flushes their directories. A device flush or more per file (1 MiB offloads at 0.86-1.01
    /// of `dd` here against 1.01-1.28, see docs/src/benchmarks.md), but no flush waits for others'
    /// writes.
    File,
}

impl std::str::FromStr for FsyncScope {
    type Err = StoreError;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().replace(['-', '_'], "").as_str() {
            "filesystem" | "fs" | "" => Ok(FsyncScope::FileSystem),
            "file" => Ok(FsyncScope::File),
            _ => Err(StoreError::Config(format!("disk_fsync_scope {s:?}: expected \"filesystem\" or \"file\""))),
        }
    }
}

impl std::fmt::Display for FsyncScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FsyncScope::FileSystem => "filesystem",
            FsyncScope::File => "file",
        })
    }
}

/// A file written under its temporary name, on its way to the committer.
pub struct Written {
    /// The object's key.
    pub key: String,
    /// The object's version at the master.
    pub version: u64,
    /// The generation its offload was prepared under (see [`super::announce`]).
    pub generation: u64,
    /// The value's length, in bytes.
    pub value_len: u64,
    /// The file itself, under its temporary name.
    pub staged: Staged,
}

/// A file a round made durable under its final name.
#[derive(Debug)]
pub struct Committed {
    /// The object's key.
    pub key: String,
    /// The object's version at the master.
    pub version: u64,
    /// The generation its offload was prepared under.
    pub generation: u64,
    /// The value's length, in bytes.
    pub value_len: u64,
    /// Its final name.
    pub path: PathBuf,
    /// Its length (it takes [`super::format::disk_len`] of it on disk).
    pub file_len: u64,
}

/// A file a round gave up (the reason logged): no name of it is left.
#[derive(Debug)]
pub struct GivenUp {
    /// The object's key.
    pub key: String,
    /// The value's length, in bytes.
    pub value_len: u64,
    /// The file's length, in bytes (for the queue's and the capacity's accounts).
    pub file_len: u64,
}

/// What one round did.
#[derive(Debug, Default)]
pub struct Round {
    /// Files now durable under their final names, in the batch's order.
    pub committed: Vec<Committed>,
    /// Files it could not make durable (no name of them is left).
    pub given_up: Vec<GivenUp>,
}

/// One commit round over `batch` (files under `dir`): flush them (all at once, with
/// [`FsyncScope::FileSystem`]; the writers did, with [`FsyncScope::File`]), rename each, make
/// the renames durable (one flush of the file system, or of each directory once: a flush
/// covers every rename before it). A flush that fails gives up every file it was to cover.
pub fn commit_round(dir: &Path, fsync: Option<FsyncScope>, batch: Vec<Written>) -> Round {
    let mut round = Round::default();
    let give_up = |w: &Written| GivenUp { key: w.key.clone(), value_len: w.value_len, file_len: w.staged.file_len };
    if fsync == Some(FsyncScope::FileSystem) {
        if let Err(e) = file::sync_file_system(dir) {
            // Not known to be on the device: the files go rather than be renamed.
            tracing::warn!("disk tier: {e}");
            for w in batch {
                round.given_up.push(give_up(&w));
                w.staged.abandon();
            }
            return round;
        }
    }
    let mut renamed = Vec::with_capacity(batch.len());
    for w in batch {
        let (path, sub, file_len) = (w.staged.path.clone(), w.staged.dir.clone(), w.staged.file_len);
        let gone = give_up(&w);
        match w.staged.rename() {
            Ok(()) => renamed.push((
                Committed {
                    key: w.key,
                    version: w.version,
                    generation: w.generation,
                    value_len: w.value_len,
                    path,
                    file_len,
                },
                sub,
            )),
            Err(e) => {
                tracing::warn!("disk tier: {e}");
                round.given_up.push(gone);
            }
        }
    }
    let renames_flushed = match fsync {
        None => Ok(()),
        Some(FsyncScope::FileSystem) => file::sync_file_system(dir),
        Some(FsyncScope::File) => file::sync_dirs(renamed.iter().map(|(_, sub)| sub.as_path())),
    };
    match renames_flushed {
        Ok(()) => round.committed = renamed.into_iter().map(|(c, _)| c).collect(),
        Err(e) => {
            // The renames may not be durable: the files go rather than be announced.
            tracing::warn!("disk tier: {e}");
            for (c, _) in renamed {
                let _ = std::fs::remove_file(&c.path);
                round.given_up.push(GivenUp { key: c.key, value_len: c.value_len, file_len: c.file_len });
            }
        }
    }
    round
}

#[cfg(test)]
mod tests {
    use super::super::file::{write_staged, FileBody, FileImage};
    use super::super::io::psync::Psync;
    use super::*;

    fn written(dir: &Path, key: &str, value: &[u8]) -> Written {
        let mut body = FileBody::Image(FileImage::new(key, value));
        let staged = write_staged(dir, key, 1, &mut body, None, &mut Psync, false).unwrap();
        Written { key: key.into(), version: 1, generation: 0, value_len: value.len() as u64, staged }
    }

    #[test]
    fn a_round_renames_what_it_can_and_gives_up_the_rest_leaving_no_temporary_name() {
        for fsync in [Some(FsyncScope::FileSystem), Some(FsyncScope::File), None] {
            let root = tempfile::tempdir().unwrap();
            let (a, b) = (written(root.path(), "a", b"value a"), written(root.path(), "b", b"value b"));
            assert_ne!(a.staged.dir, b.staged.dir, "the keys hash to different directories");
            // b's directory vanishes under it: its rename fails.
            std::fs::remove_dir_all(&b.staged.dir).unwrap();
            let a_path = a.staged.path.clone();
            let round = commit_round(root.path(), fsync, vec![a, b]);
            let committed: Vec<&str> = round.committed.iter().map(|c| c.key.as_str()).collect();
            let given_up: Vec<&str> = round.given_up.iter().map(|g| g.key.as_str()).collect();
            assert_eq!((committed, given_up), (vec!["a"], vec!["b"]), "{fsync:?}");
            assert_eq!(round.committed[0].path, a_path);
            let left: Vec<_> =
                std::fs::read_dir(a_path.parent().unwrap()).unwrap().flatten().map(|f| f.path()).collect();
            assert_eq!(left, [a_path], "only the final name is left ({fsync:?})");
        }
    }
}
