//! The offload queue: what a put hands the tier ([`PreparedOffload`], prepared while the master
//! places the put, queued once it committed) and the room it holds in the queue until the
//! writers are done with it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::TrySendError;

use super::format::{data_offset, disk_len};
use super::{file, inc, space, DiskTier, DEFAULT_CAPACITY_SHARE, SPARE_IMAGE_BYTES};
use crate::error::StoreError;

pub(super) struct Job {
    pub(super) key: String,
    pub(super) version: u64,
    /// The announcements' generation when the offload was prepared ([`announce`]).
    pub(super) generation: u64,
    pub(super) body: file::FileBody,
}

/// A value on its way to the writers: see [`DiskTier::prepare`].
pub struct PreparedOffload {
    tier: Arc<DiskTier>,
    key: String,
    len: u64,
    /// The announcements' generation now, before the put goes to the master ([`announce`]).
    generation: u64,
    state: Prepared,
}

pub(super) enum Prepared {
    /// The file image, holding its room in the queue.
    Image(file::FileImage),
    /// Only the value's CRC-32, holding its room in the queue: the writers read the value
    /// where the put leaves it ([`PreparedOffload::queue_resident`]).
    Checksum(u32),
    /// Larger than the whole disk tier: counted when queued.
    TooLarge,
    /// The file system is full ([`space`]): skipped, counted when queued.
    DiskFull,
    /// No room in the queue: counted (and warned about) when queued.
    QueueFull,
    Queued,
}

impl PreparedOffload {
    /// Hands the image to the writers as object `version` (its put committed). Never blocks.
    /// (Prepared by [`DiskTier::prepare`].)
    pub fn queue(self, version: u64) {
        self.queue_resident(version, None, &[]);
    }

    /// Like [`Self::queue`]; prepared by [`DiskTier::prepare_resident`], the writers read the
    /// value from `resident` (the put's own replica), or from a copy of `value` made now when
    /// there is none.
    pub fn queue_resident(mut self, version: u64, resident: Option<file::ResidentValue>, value: &[u8]) {
        let tier = self.tier.clone();
        let body = match std::mem::replace(&mut self.state, Prepared::Queued) {
            Prepared::TooLarge => {
                inc(&tier.counters.too_large);
                tracing::debug!("not offloading {:?}: {} bytes exceed the disk tier's capacity", self.key, self.len);
                return;
            }
            Prepared::QueueFull => return tier.queue_full(&self.key),
            Prepared::DiskFull => {
                inc(&tier.counters.full_skipped);
                tracing::debug!("not offloading {:?}: the disk tier's file system is full", self.key);
                return;
            }
            Prepared::Queued => return,
            Prepared::Image(image) => file::FileBody::Image(image),
            Prepared::Checksum(crc) => match resident {
                Some(v) if v.value_len() as u64 == self.len => file::FileBody::Resident(v.expecting(crc)),
                None if value.len() as u64 == self.len => file::FileBody::Image(file::FileImage::reusing(
                    tier.spare_image(&self.key, value.len()),
                    &self.key,
                    value,
                )),
                _ => {
                    tracing::error!("offload of {:?}: no bytes to write (a bug); not persisted", self.key);
                    return tier.release(self.len);
                }
            },
        };
        let key = std::mem::take(&mut self.key);
        *tier.in_flight.lock().entry(key.clone()).or_default() += 1;
        let job = Job { key: key.clone(), version, generation: self.generation, body };
        let sent = match tier.queue.lock().as_ref() {
            Some(tx) => tx.try_send(job).map_err(|e| matches!(e, TrySendError::Full(_))),
            None => Err(false),
        };
        match sent {
            Ok(()) => inc(&tier.counters.queued),
            Err(full) => {
                tier.job_done(&key, self.len);
                if full {
                    tier.queue_full(&key);
                }
            }
        }
    }
}

impl Drop for PreparedOffload {
    /// Not queued (its put failed): the room in the queue and the memory go back.
    fn drop(&mut self) {
        match std::mem::replace(&mut self.state, Prepared::Queued) {
            Prepared::Image(image) => {
                self.tier.release(self.len);
                self.tier.keep_spare(image.into_buffer());
            }
            Prepared::Checksum(_) => self.tier.release(self.len),
            _ => {}
        }
    }
}

impl DiskTier {
    /// Queues `value` (object `version` of `key`, just committed) for writing. Never blocks
    /// on the disk: a full queue drops the offload, counted and logged. (The client prepares
    /// and queues in two steps, around its put's commit.)
    #[cfg(test)]
    pub fn offload(self: &Arc<Self>, key: &str, version: u64, value: &[u8]) {
        self.prepare(key, value).queue(version);
    }

    /// Copies `value` into its file image and takes its room in the queue, before its put
    /// commits: the copy then overlaps the put's call to the master. [`PreparedOffload::queue`]
    /// hands it to the writers once the put committed; dropping it gives the room back.
    pub fn prepare(self: &Arc<Self>, key: &str, value: &[u8]) -> PreparedOffload {
        self.reserve(key, value.len() as u64, || {
            Prepared::Image(file::FileImage::reusing(self.spare_image(key, value.len()), key, value))
        })
    }

    /// Like [`Self::prepare`], but takes only the value's CRC-32: for a put expected to
    /// leave a replica in this client's own segment, which the writers then read in place
    /// ([`PreparedOffload::queue_resident`]): no copy on the putting thread.
    pub fn prepare_resident(self: &Arc<Self>, key: &str, value: &[u8]) -> PreparedOffload {
        self.reserve(key, value.len() as u64, || Prepared::Checksum(crc32fast::hash(value)))
    }

    /// Takes room in the queue for `len` bytes, then prepares them with `make`.
    pub(super) fn reserve(self: &Arc<Self>, key: &str, len: u64, make: impl FnOnce() -> Prepared) -> PreparedOffload {
        let generation = self.announcements.lock().generation();
        let prepared = |state| PreparedOffload { tier: self.clone(), key: key.to_string(), len, generation, state };
        let room = disk_len(data_offset(key.len()) + len);
        if self.space.is_full() && !self.room_again(room) {
            return prepared(Prepared::DiskFull);
        }
        if room > self.capacity() {
            return prepared(Prepared::TooLarge);
        }
        {
            let mut p = self.pending.lock();
            if p.jobs > 0 && p.bytes + len > self.config.queue_bytes {
                return prepared(Prepared::QueueFull);
            }
            p.jobs += 1;
            p.bytes += len;
        }
        prepared(make())
    }

    /// While the tier is full: whether the file system has room again for a file of `room`
    /// bytes and a margin ([`space::has_room`]). The first call that finds it ends the state
    /// (logged once), and an automatic capacity (none configured) is taken anew: what the
    /// tier's files take plus [`DEFAULT_CAPACITY_SHARE`] of the free space.
    pub(super) fn room_again(&self, room: u64) -> bool {
        let (free, size) = match space::free_and_size(&self.dir) {
            Ok(v) => v,
            Err(e) => {
                tracing::debug!("disk tier: statvfs {}: {e}", self.dir.display());
                return false;
            }
        };
        if !space::has_room(free, size, room) {
            return false;
        }
        if self.space.recover() {
            let capacity = {
                let mut ix = self.index.lock();
                if self.config.capacity.is_none() {
                    let taken = ix.used() + ix.retired_bytes();
                    ix.set_capacity(taken + (free as f64 * DEFAULT_CAPACITY_SHARE) as u64);
                }
                ix.capacity()
            };
            tracing::info!(
                "disk tier {}: the file system has room again ({free} bytes free); writing offloads again \
                 (capacity {capacity} bytes; {} skipped while it was full so far)",
                self.dir.display(),
                self.counters.full_skipped.get()
            );
        }
        true
    }

    /// A write was refused for want of space: the tier is full (logged when it becomes so).
    pub(super) fn became_full(&self, e: &StoreError, gave_back: &str) {
        if self.space.fill() {
            tracing::warn!(
                "disk tier {}: the file system is full ({e}{gave_back}); serving the files there, skipping new \
                 offloads until it has room again",
                self.dir.display()
            );
        } else {
            tracing::debug!("disk tier: {e}{gave_back}");
        }
    }

    /// Whether the file system under the tier is full now (`space`).
    pub fn is_full(&self) -> bool {
        self.space.is_full()
    }

    /// A kept image's memory large enough for this value, if any.
    pub(super) fn spare_image(&self, key: &str, value_len: usize) -> Vec<u8> {
        let want = file::FileImage::memory_len(key.len(), value_len);
        let mut spare = self.spare_images.lock();
        spare.iter().position(|b| b.len() >= want).map(|i| spare.swap_remove(i)).unwrap_or_default()
    }

    pub(super) fn queue_full(&self, key: &str) {
        inc(&self.counters.queue_full);
        let mut last = self.last_full_warning.lock();
        if last.is_none_or(|t| t.elapsed() > Duration::from_secs(1)) {
            *last = Some(Instant::now());
            tracing::warn!(
                "disk tier: offload queue full ({} bytes waiting): {key:?} is not persisted ({} dropped so far)",
                self.pending.lock().bytes,
                self.counters.queue_full.get()
            );
        }
    }

    pub(super) fn job_done(&self, key: &str, len: u64) {
        {
            let mut f = self.in_flight.lock();
            if let Some(n) = f.get_mut(key) {
                *n -= 1;
                if *n == 0 {
                    f.remove(key);
                }
            }
        }
        self.release(len);
    }

    /// Gives back a job's room in the queue.
    pub(super) fn release(&self, len: u64) {
        let mut p = self.pending.lock();
        p.jobs -= 1;
        p.bytes -= len;
        if p.jobs == 0 {
            self.idle.notify_all();
        }
    }

    /// Keeps a written (or unused) image's memory for the next offloads, up to a bound.
    pub(super) fn keep_spare(&self, buf: Vec<u8>) {
        let mut spare = self.spare_images.lock();
        if spare.iter().map(Vec::len).sum::<usize>() + buf.len() <= SPARE_IMAGE_BYTES {
            spare.push(buf);
        }
    }
}
