//! The master's own record of the removals waiting for absent disks (`--state-dir`).
//!
//! A removal of an object whose disk copy sits on a client that is away waits in the master
//! until that disk comes back ([`super::disk`]). Clients with a disk tier keep a copy of the
//! waiting removals and hand it back after a master restart, but when none of them is up
//! across the restart, the removals were lost and the removed objects came back from the
//! absent disk on its return. With a state directory, the master writes the waiting removals
//! to `<dir>/disk-removals.json` whenever they change (at most once per sweep), by writing a
//! temporary file, flushing it and renaming it into place, and loads them when it starts.
//! A file that cannot be read stops the start with an error naming it: starting without it
//! would let removed objects come back.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::Master;
use crate::error::{Result, StoreError};
use crate::proto::HeldRemoval;

pub const FILE_NAME: &str = "disk-removals.json";

#[derive(Serialize, Deserialize)]
struct SavedRemoval {
    disk: String,
    key: String,
    version: u64,
}

#[derive(Serialize, Deserialize)]
struct Saved {
    /// The format of this file.
    format: u32,
    removals: Vec<SavedRemoval>,
}

const FORMAT: u32 = 1;

fn state_err(what: &str, path: &Path, e: impl std::fmt::Display) -> StoreError {
    StoreError::Config(format!("{what} {}: {e}", path.display()))
}

/// Where the master keeps its removals file, and the generation of the removals last written.
pub(super) struct RemovalsFile {
    path: PathBuf,
    saved_generation: parking_lot::Mutex<u64>,
}

impl RemovalsFile {
    /// Makes the directory if needed and checks that it can be written.
    pub fn open(dir: &Path) -> Result<RemovalsFile> {
        std::fs::create_dir_all(dir).map_err(|e| state_err("cannot create the state directory", dir, e))?;
        let probe = dir.join(".write-test");
        File::create(&probe).map_err(|e| state_err("cannot write in the state directory", dir, e))?;
        let _ = std::fs::remove_file(&probe);
        Ok(RemovalsFile { path: dir.join(FILE_NAME), saved_generation: parking_lot::Mutex::new(0) })
    }

    /// The removals saved by a previous master, if any.
    fn load(&self) -> Result<Vec<HeldRemoval>> {
        let text = match std::fs::read(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(state_err("cannot read", &self.path, e)),
        };
        let saved: Saved = serde_json::from_slice(&text).map_err(|e| {
            state_err("cannot parse", &self.path, format!("{e} (move the file away to start without its removals)"))
        })?;
        if saved.format != FORMAT {
            return Err(state_err("unknown format in", &self.path, saved.format));
        }
        Ok(saved.removals.into_iter().map(|r| HeldRemoval { disk: r.disk, key: r.key, version: r.version }).collect())
    }

    /// Replaces the file with `removals` (temporary file, flush, rename, flush of the directory).
    fn write(&self, removals: Vec<HeldRemoval>) -> std::io::Result<()> {
        let saved = Saved {
            format: FORMAT,
            removals: removals
                .into_iter()
                .map(|r| SavedRemoval { disk: r.disk, key: r.key, version: r.version })
                .collect(),
        };
        let tmp = self.path.with_extension("json.tmp");
        let mut f = File::create(&tmp)?;
        f.write_all(&serde_json::to_vec(&saved)?)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &self.path)?;
        if let Some(dir) = self.path.parent() {
            File::open(dir)?.sync_all()?;
        }
        Ok(())
    }
}

impl Master {
    /// Loads the removals a previous master saved in the state directory (none configured:
    /// nothing to do) and queues them again for their disks.
    pub(super) fn load_saved_removals(&self) -> Result<()> {
        let Some(file) = &self.removals_file else { return Ok(()) };
        let saved = file.load()?;
        if !saved.is_empty() {
            tracing::info!("{} disk removal(s) loaded from {}", saved.len(), file.path.display());
            self.merge_held_removals(&saved);
        }
        *file.saved_generation.lock() = self.state.lock().held_generation;
        Ok(())
    }

    /// Writes the waiting removals to the state directory when they changed since the last
    /// write (called by the sweeper). A failed write is logged and tried again next time.
    pub(super) fn save_removals_if_changed(&self) {
        let Some(file) = &self.removals_file else { return };
        let mut saved = file.saved_generation.lock();
        let (generation, removals) = {
            let st = self.state.lock();
            if st.held_generation == *saved {
                return;
            }
            (st.held_generation, Self::pending_removals(&st).collect::<Vec<_>>())
        };
        match file.write(removals) {
            Ok(()) => *saved = generation,
            Err(e) => tracing::warn!("writing the disk removals to {}: {e} (tried again)", file.path.display()),
        }
    }
}
