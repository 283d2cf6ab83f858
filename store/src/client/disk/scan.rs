//! What a tier finds in its storage root when it opens: its disk id, the removals it held for
//! the master (`TOMBSTONES`), the retired files kept for reuse and the value files to index.

use std::fs::File;
use std::path::{Path, PathBuf};

use super::format::{disk_len, key_hash, parse_name, NameKind};
use super::index::Entry;
use super::recycle::parse_retired_name;
use super::stats::Counters;
use super::{file, inc};
use crate::error::is_no_space;
use crate::proto::HeldRemoval;

/// The removals kept for the master, from `<dir>/TOMBSTONES` (none when missing or damaged).
pub(super) fn load_held(dir: &Path) -> Vec<HeldRemoval> {
    let path = dir.join(TOMBSTONES);
    let Ok(text) = std::fs::read(&path) else { return Vec::new() };
    match serde_json::from_slice::<Vec<(String, String, u64)>>(&text) {
        Ok(v) => v.into_iter().map(|(disk, key, version)| HeldRemoval { disk, key, version }).collect(),
        Err(e) => {
            tracing::warn!("disk tier: ignoring {}: {e}", path.display());
            Vec::new()
        }
    }
}

/// The file of removals kept for the master.
pub(super) const TOMBSTONES: &str = "TOMBSTONES";

/// Reads (or makes and saves) the disk id kept in `dir`; with it, whether it is saved: a new
/// id is not when the file system is full ([`save_disk_id`] then saves it before the first
/// file is written).
pub(super) fn disk_id(dir: &Path) -> std::io::Result<(String, bool)> {
    let path = dir.join("DISK_ID");
    if let Ok(text) = std::fs::read_to_string(&path) {
        let id = text.trim();
        if !id.is_empty() && id.len() <= 64 && id.bytes().all(|c| c.is_ascii_hexdigit() || c == b'-') {
            return Ok((id.to_string(), true));
        }
        tracing::warn!("{} holds no valid id; making a new one", path.display());
    }
    let id = uuid::Uuid::new_v4().to_string();
    match save_disk_id(dir, &id) {
        Ok(()) => Ok((id, true)),
        Err(e) if is_no_space(&e) => Ok((id, false)),
        Err(e) => Err(e),
    }
}

/// Saves `id` as the disk id of `dir`, durably (no temporary file is left when it fails).
pub(super) fn save_disk_id(dir: &Path, id: &str) -> std::io::Result<()> {
    let tmp = dir.join(format!("DISK_ID.{}.tmp", std::process::id()));
    let saved = std::fs::write(&tmp, id)
        .and_then(|()| File::open(&tmp)?.sync_all())
        .and_then(|()| std::fs::rename(&tmp, dir.join("DISK_ID")))
        .and_then(|()| File::open(dir)?.sync_all());
    if saved.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    saved
}

/// The retired files under `dir` (path, number in the name, bytes), oldest name first;
/// deletes anything else there.
pub(super) fn scan_retired(dir: &Path) -> Vec<(PathBuf, u64, u64)> {
    let mut found = Vec::new();
    for f in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = f.path();
        let number = parse_retired_name(&f.file_name().to_string_lossy());
        match (number, f.metadata()) {
            (Some(n), Ok(m)) if m.is_file() => found.push((path, n, disk_len(m.len()))),
            _ => {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
    found.sort_by_key(|(_, n, _)| *n);
    found
}

/// Indexes the valid files under `dir`, oldest first; removes temporary files, files with a
/// bad header or length and older versions (counted). The values' checksums are checked on
/// every read and, once the files are announced, by [`DiskTier::verify_found`], not here.
pub(super) fn scan(dir: &Path, c: &Counters) -> Vec<(String, Entry, std::time::SystemTime)> {
    let mut found: std::collections::HashMap<String, (Entry, std::time::SystemTime)> = Default::default();
    let Ok(subs) = std::fs::read_dir(dir) else { return Vec::new() };
    for sub in subs.flatten() {
        let name = sub.file_name();
        let name = name.to_string_lossy();
        if name.len() != 2 || !name.bytes().all(|b| b.is_ascii_hexdigit()) || !sub.path().is_dir() {
            continue;
        }
        let Ok(files) = std::fs::read_dir(sub.path()) else { continue };
        for f in files.flatten() {
            let path = f.path();
            let fname = f.file_name().to_string_lossy().to_string();
            match parse_name(&fname) {
                NameKind::Other => continue,
                NameKind::Temporary => {
                    let _ = std::fs::remove_file(&path);
                    inc(&c.incomplete_removed);
                }
                NameKind::File { hash, version } => {
                    let valid = file::read_header(&path)
                        .ok()
                        .filter(|(_, h)| h.version == version && key_hash(&h.key) == hash && hash.starts_with(&*name));
                    let Some((file, h)) = valid else {
                        tracing::warn!("disk tier: removing damaged file {}", path.display());
                        let _ = std::fs::remove_file(&path);
                        inc(&c.corrupt_removed);
                        continue;
                    };
                    let mtime = file.metadata().and_then(|m| m.modified()).unwrap_or(std::time::UNIX_EPOCH);
                    let mut entry = Entry::new(h.version, h.value_len, h.disk_len(), path.clone());
                    // Whatever was in memory went with the process that wrote it (unless
                    // another client holds a replica: the first get finds out).
                    entry.only_copy = true;
                    match found.get(&h.key) {
                        Some((old, _)) if old.version >= version => {
                            let _ = std::fs::remove_file(&path);
                            inc(&c.stale_removed);
                        }
                        Some((old, _)) => {
                            let _ = std::fs::remove_file(&old.path);
                            inc(&c.stale_removed);
                            found.insert(h.key, (entry, mtime));
                        }
                        None => {
                            found.insert(h.key, (entry, mtime));
                        }
                    }
                }
            }
        }
    }
    let mut files: Vec<_> = found.into_iter().map(|(k, (e, t))| (k, e, t)).collect();
    files.sort_by_key(|(_, _, t)| *t);
    files
}
