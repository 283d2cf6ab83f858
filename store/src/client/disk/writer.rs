//! The writer threads' work: one queued offload written to a file under a temporary name
//! (a new file, or a retired one written over), handed to the committer.

use std::sync::atomic::Ordering;

use crossbeam_channel::Sender;

use super::commit::{FsyncScope, Written};
use super::format::{data_offset, disk_len};
use super::index::{NoRoom, Room};
use super::io::{EngineKind, IoEngine};
use super::offload::Job;
use super::scan::save_disk_id;
use super::{file, inc, recycle, DiskTier};
use crate::error::StoreError;
use crate::proto::DiskEntry;

impl DiskTier {
    /// A writer's part: room, the file's bytes under a temporary name; the committer does
    /// the rest. A job that ends here (nothing written) is done at once.
    pub(super) fn write_job(&self, mut job: Job, committer: &Sender<Written>, engine: &mut dyn IoEngine) {
        let len = job.body.value_len();
        let staged = self.write_one(&mut job, engine);
        if let Some(buf) =
            std::mem::replace(&mut job.body, file::FileBody::Image(file::FileImage::new("", &[]))).into_buffer()
        {
            self.keep_spare(buf);
        }
        match staged {
            Some(staged) => {
                let w =
                    Written { key: job.key, version: job.version, generation: job.generation, value_len: len, staged };
                if let Err(e) = committer.send(w) {
                    let w = e.into_inner();
                    self.index.lock().release(disk_len(w.staged.file_len));
                    w.staged.abandon();
                    self.job_done(&w.key, len);
                }
            }
            None => self.job_done(&job.key, len),
        }
    }

    pub(super) fn write_one(&self, job: &mut Job, engine: &mut dyn IoEngine) -> Option<file::Staged> {
        if self.space.is_full() {
            // Queued before the disk filled: not tried (each would fail the same way).
            inc(&self.counters.full_skipped);
            tracing::debug!("not offloading {:?}: the disk tier's file system is full", job.key);
            return None;
        }
        if self.id_unsaved.load(Ordering::Acquire) {
            match save_disk_id(&self.dir, &self.disk_id) {
                Ok(()) => self.id_unsaved.store(false, Ordering::Release),
                Err(source) => {
                    inc(&self.counters.write_failures);
                    let e = StoreError::DiskIo { what: "saving the disk id in", path: self.dir.clone(), source };
                    if e.is_disk_full() {
                        self.became_full(&e, "");
                    } else {
                        tracing::warn!("{e}");
                    }
                    return None;
                }
            }
        }
        let value_len = job.body.value_len();
        let room = disk_len(data_offset(job.key.len()) + value_len);
        let evicted = {
            let mut ix = self.index.lock();
            if ix.get(&job.key).is_some_and(|e| e.version >= job.version) {
                return None; // this or a newer version is on disk already
            }
            if self.is_doomed(&job.key, job.version) {
                return None; // removed while it waited
            }
            ix.reserve(room)
        };
        let Room { evicted, reuse, discard } = match evicted {
            Ok(room) => room,
            Err(NoRoom::TooLarge) => {
                inc(&self.counters.too_large);
                return None;
            }
            Err(NoRoom::Pinned) => {
                inc(&self.counters.busy_dropped);
                tracing::debug!("not offloading {:?}: room only by evicting files being read", job.key);
                return None;
            }
        };
        if !evicted.is_empty() {
            let removed: Vec<DiskEntry> = evicted
                .iter()
                .map(|(k, e)| {
                    if reuse.as_ref().is_none_or(|r| r.path != e.path) {
                        let _ = std::fs::remove_file(&e.path);
                    }
                    inc(&self.counters.evicted);
                    DiskEntry { key: k.clone(), size: e.value_len, version: e.version }
                })
                .collect();
            tracing::debug!("disk tier: evicted {} file(s) to make room", removed.len());
            self.announce(Vec::new(), removed);
        }
        for f in discard {
            let _ = std::fs::remove_file(&f.path);
        }
        if let file::FileBody::Resident(v) = &job.body {
            if !v.in_place() {
                // Not 4 KiB-aligned for direct I/O: through an image after all.
                let file::FileBody::Resident(v) =
                    std::mem::replace(&mut job.body, file::FileBody::Image(file::FileImage::new("", &[])))
                else {
                    unreachable!()
                };
                match v.into_image(self.spare_image(&job.key, value_len as usize), &job.key) {
                    Some(image) => job.body = file::FileBody::Image(image),
                    None => return self.overwritten(&job.key, room, reuse),
                }
            }
        }
        let through_ring = engine.kind() == EngineKind::IoUring;
        let written = file::write_staged(
            &self.dir,
            &job.key,
            job.version,
            &mut job.body,
            reuse.as_ref(),
            engine,
            self.config.fsync == Some(FsyncScope::File),
        );
        // (A write the ring refused was made with plain calls, and the ring given up.)
        if through_ring && engine.kind() == EngineKind::IoUring && written.is_ok() {
            inc(&self.counters.uring_writes);
        }
        if written.as_ref().is_ok_and(|s| s.recycled) {
            inc(&self.counters.recycled);
        }
        let written = match written {
            Ok(staged) if matches!(&job.body, file::FileBody::Resident(v) if !v.unchanged()) => {
                staged.abandon();
                return self.overwritten(&job.key, room, None);
            }
            other => other,
        };
        let written = written.and_then(|staged| {
            // Flushed here, so that the writers' flushes overlap (each waits for the device).
            if self.config.fsync == Some(FsyncScope::File) {
                if let Err(e) = staged.flush(engine) {
                    staged.abandon();
                    return Err(e);
                }
            }
            Ok(staged)
        });
        match written {
            Ok(staged) => Some(staged),
            Err(e) => {
                // The file system may be full (of others' files too): the retired files are
                // ours to give back first.
                let retired = {
                    let mut ix = self.index.lock();
                    ix.release(room);
                    ix.drain_retired()
                };
                for f in &retired {
                    let _ = std::fs::remove_file(&f.path);
                }
                inc(&self.counters.write_failures);
                let gave_back = match retired.len() {
                    0 => String::new(),
                    n => format!("; deleted the {n} file(s) kept for reuse"),
                };
                if e.is_disk_full() {
                    self.became_full(&e, &gave_back);
                } else {
                    tracing::warn!("{e}{gave_back}");
                }
                None
            }
        }
    }

    /// An offload whose value changed in memory before the writer had it (the master gave
    /// its range to another object): dropped and counted. The room reserved goes back, and
    /// so does the file to reuse, when it was not used.
    pub(super) fn overwritten(&self, key: &str, room: u64, unused: Option<recycle::Retired>) -> Option<file::Staged> {
        inc(&self.counters.overwritten);
        tracing::debug!("not offloading {key:?}: its memory was reused before it was written");
        let mut ix = self.index.lock();
        ix.release(room);
        if let Some(f) = unused {
            drop(ix);
            let _ = std::fs::remove_file(&f.path);
        }
        None
    }
}
