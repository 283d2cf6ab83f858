//! Room on the file system under the tier: a full disk is a state of the tier, not a fault.
//!
//! The tier becomes *full* when a write is refused for want of space (`ENOSPC`, or `EDQUOT`
//! on a full quota) or when it opens on a root that cannot take a byte ([`probe`]). While full,
//! the files already there are served as ever, and new offloads are skipped before they are
//! written (their puts succeed in memory; each skip counted, see
//! [`super::DiskStats::full_skipped`]). Each offload then asks the file system (one `statvfs`)
//! whether it has room again for the file and a margin ([`headroom`]); the first that finds
//! it ends the state, and offloads are written again, without a restart. The state's changes
//! are logged by the tier, once each: [`Space::fill`] and [`Space::recover`] say which call
//! made the change.

use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::is_no_space;

/// The most free space asked for beyond a file before a full tier writes again: 64 MiB, or a
/// hundredth of the file system when that is less (so that one freed file does not end the
/// state only for the next write to fill the disk again).
const MAX_HEADROOM: u64 = 64 << 20;

/// Whether the tier's file system is full now.
#[derive(Debug, Default)]
pub struct Space {
    full: AtomicBool,
}

impl Space {
    /// The state at open: `full` when the start-up [`probe`] found no room.
    pub fn new(full: bool) -> Space {
        Space { full: AtomicBool::new(full) }
    }

    /// Whether the file system was full at the last write (or at open) and has not been
    /// seen with room since.
    pub fn is_full(&self) -> bool {
        self.full.load(Ordering::Acquire)
    }

    /// A write was refused for want of space: the tier is full. True for the call that made
    /// the change (it logs it).
    pub fn fill(&self) -> bool {
        !self.full.swap(true, Ordering::AcqRel)
    }

    /// The file system has room again: the tier is no longer full. True for the call that
    /// made the change (it logs it).
    pub fn recover(&self) -> bool {
        self.full.compare_exchange(true, false, Ordering::AcqRel, Ordering::Acquire).is_ok()
    }
}

/// Bytes free on the file system of `dir` for this process (`f_bavail`) and its size.
pub fn free_and_size(dir: &Path) -> std::io::Result<(u64, u64)> {
    let st = rustix::fs::statvfs(dir)?;
    Ok((st.f_bavail.saturating_mul(st.f_frsize), st.f_blocks.saturating_mul(st.f_frsize)))
}

/// The margin a full tier wants free beyond a file before it writes again, on a file system
/// of `size` bytes.
pub fn headroom(size: u64) -> u64 {
    (size / 100).min(MAX_HEADROOM)
}

/// Whether a file system with `free` of `size` bytes free has room again for a file of `room`
/// bytes (and the [`headroom`]).
pub fn has_room(free: u64, size: u64, room: u64) -> bool {
    free >= room.saturating_add(headroom(size))
}

/// What the start-up probe found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// A file could be created, written and removed.
    Writable,
    /// The file system has no room (`ENOSPC`, `EDQUOT`) but is not read-only nor refused to
    /// this process: the tier opens full.
    Full,
}

/// Checks that `dir` takes files: creates, writes and removes `.probe-<pid>` in it. A root
/// that is merely full is [`Probe::Full`]; one that refuses the write otherwise (read-only,
/// permission denied, ...) is the error. The probe leaves no file behind either way.
pub fn probe(dir: &Path) -> std::io::Result<Probe> {
    let path = dir.join(format!(".probe-{}", std::process::id()));
    let written = std::fs::File::create(&path).and_then(|mut f| f.write_all(b"probe").and_then(|()| f.sync_data()));
    let removed = std::fs::remove_file(&path);
    match (written, removed) {
        (Ok(()), Ok(())) => Ok(Probe::Writable),
        (Err(e), _) if is_no_space(&e) => Ok(Probe::Full),
        (Err(e), _) => Err(e),
        // Written, but its name cannot go: the directory is not (fully) ours to write.
        (Ok(()), Err(e)) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_changes_once_each_way_and_says_which_call_changed_it() {
        let s = Space::new(false);
        assert!(!s.is_full() && !s.recover(), "not full: nothing to recover from");
        assert!(s.fill() && s.is_full());
        assert!(!s.fill(), "already full: a second refusal changes nothing (and logs nothing)");
        assert!(s.recover() && !s.is_full());
        assert!(!s.recover());
        assert!(Space::new(true).is_full());
    }

    #[test]
    fn room_again_means_the_file_and_a_margin_bounded_by_the_file_system_and_64_mib() {
        let mib = 1 << 20;
        // 100 MiB file system: a margin of 1 MiB.
        assert!(has_room(3 * mib, 100 * mib, 2 * mib));
        assert!(!has_room(3 * mib - 1, 100 * mib, 2 * mib));
        // 1 TiB: the margin is capped at 64 MiB.
        assert_eq!(headroom(1 << 40), 64 * mib);
        assert!(has_room(65 * mib, 1 << 40, mib) && !has_room(65 * mib - 1, 1 << 40, mib));
    }

    #[test]
    fn a_writable_directory_passes_the_probe_and_keeps_no_probe_file() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(probe(dir.path()).unwrap(), Probe::Writable);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        assert!(probe(&dir.path().join("missing")).is_err());
    }
}
