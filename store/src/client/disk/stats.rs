//! The tier's statistics, with one source of truth: Prometheus metrics in a registry of the
//! tier's own (prefix `crescent_client_disk_`). What the tier did is a *counter*
//! (`..._total`, only ever rising, as Prometheus means it); its present sizes are *gauges*,
//! set from the index whenever they are read. [`DiskStats`] (the client's `disk_stats()`,
//! the pings' counters) is read back from them; [`Counters::gather`] is the exposition the
//! client's `/metrics` includes.

use prometheus::proto::MetricFamily;
use prometheus::{IntCounter, IntGauge, Registry};

use crate::error::Result;
use crate::metrics_registry::{counter, gauge, internal};

/// What the tier has done (counters since start, read back from `Counters`), plus its
/// current sizes.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct DiskStats {
    /// Files indexed now.
    pub files: u64,
    /// Bytes they take on disk now (whole 4 KiB blocks).
    pub used_bytes: u64,
    /// Bytes the tier may use.
    pub capacity: u64,
    /// Removed files kept to be written over, and their bytes (within the capacity).
    pub retired_files: u64,
    /// Bytes of those retired files.
    pub retired_bytes: u64,
    /// Files written over a retired or evicted file instead of a new one.
    pub recycled: u64,
    /// Offloads handed to the writers.
    pub queued: u64,
    /// Files written, made durable and indexed.
    pub written: u64,
    /// Bytes of the files written.
    pub bytes_written: u64,
    /// Offloads dropped because the queue was full (logged too).
    pub queue_full: u64,
    /// Values larger than the whole tier.
    pub too_large: u64,
    /// Offloads dropped because room could only be made by evicting files being read.
    pub busy_dropped: u64,
    /// Offloads dropped because their value's memory was given to another object (evicted
    /// or removed) before the writer had it.
    pub overwritten: u64,
    /// Files whose write, flush or rename failed (logged; never announced).
    pub write_failures: u64,
    /// Files the master refused (their object was removed or put again meanwhile).
    pub stale_refused: u64,
    /// Files evicted to make room.
    pub evicted: u64,
    /// Files deleted on the master's removals.
    pub removed: u64,
    /// Files found at start with a bad header or length (removed before they are announced),
    /// or whose value failed its checksum in the check after start ([`super::DiskTier::verify_found`]:
    /// removed and the master told); and temporary files of interrupted writes.
    pub corrupt_removed: u64,
    /// Temporary files of interrupted writes, deleted at start.
    pub incomplete_removed: u64,
    /// At start: older versions of a key.
    pub stale_removed: u64,
    /// Reads of this disk's files for gets of this client (early reads included).
    pub local_reads: u64,
    /// Reads of this disk's files served to other clients (through the disk service).
    pub served_reads: u64,
    /// Reads that found a corrupt value (the file is deleted).
    pub corrupt_reads: u64,
    /// Gets that read a file expected to be the object's only copy while the master was
    /// answering, and of those, the ones whose answer showed another version or no file here
    /// (their bytes were read again from where the answer said).
    pub early_reads: u64,
    /// Early reads whose answer showed another copy or version.
    pub early_reads_wasted: u64,
    /// Times a file was marked as its object's only copy after the start (the master's news
    /// on a ping, or a get that found no other copy): gets read such a file early.
    pub only_copy_marks: u64,
    /// Files written (and flushed) through the writers' io_uring.
    pub uring_writes: u64,
    /// Calls telling the master about files or removals that failed (the master unreachable,
    /// say); what they carried is told again ([`super::DiskTier::retry_announcements`]).
    pub announce_failures: u64,
    /// Files the master refused that it may never have known (the disk was mounted again,
    /// or a call failed, since their put): kept and told again as restores (`super::announce`).
    pub ambiguous_refusals: u64,
    /// Files and removals waiting to be told to the master again, now.
    pub unannounced: u64,
    /// Files found at start whose values the check after start has not read yet, now.
    pub unverified: u64,
    /// Offloads skipped because the file system was full (their puts succeeded in memory).
    pub full_skipped: u64,
    /// Whether the file system under the tier is full now: files are served, new offloads
    /// skipped until it has room again (`super::space`).
    pub full: bool,
}

/// The tier's present sizes (the index's and the announcements' own numbers).
#[derive(Debug, Clone, Copy, Default)]
pub struct Sizes {
    /// Files indexed.
    pub files: u64,
    /// Bytes they take on disk.
    pub used_bytes: u64,
    /// Bytes the tier may use.
    pub capacity: u64,
    /// Retired files kept for reuse.
    pub retired_files: u64,
    /// Bytes of those.
    pub retired_bytes: u64,
    /// Files and removals waiting to be told to the master again.
    pub unannounced: u64,
    /// Files found at start not checked yet.
    pub unverified: u64,
    /// Whether the file system is full.
    pub full: bool,
}

/// The tier's metrics.
pub struct Counters {
    registry: Registry,
    /// Offloads handed to the writers.
    pub queued: IntCounter,
    /// Files written, made durable and indexed.
    pub written: IntCounter,
    /// Bytes of the files written.
    pub bytes_written: IntCounter,
    /// Files written over a retired or evicted file instead of a new one.
    pub recycled: IntCounter,
    /// Offloads dropped because the queue was full.
    pub queue_full: IntCounter,
    /// Offloads of values larger than the whole tier.
    pub too_large: IntCounter,
    /// Offloads dropped because room could only be made by evicting files being read.
    pub busy_dropped: IntCounter,
    /// Offloads dropped because their value's memory was reused before the writer had it.
    pub overwritten: IntCounter,
    /// Files whose write, flush or rename failed.
    pub write_failures: IntCounter,
    /// Files the master refused (removed or put again while written): deleted.
    pub stale_refused: IntCounter,
    /// Files evicted to make room.
    pub evicted: IntCounter,
    /// Files deleted on the master's removals.
    pub removed: IntCounter,
    /// Files found damaged at start or by the check after start: deleted.
    pub corrupt_removed: IntCounter,
    /// Temporary files of interrupted writes deleted at start.
    pub incomplete_removed: IntCounter,
    /// Older versions of a key deleted at start.
    pub stale_removed: IntCounter,
    /// Reads of this disk's files for gets of this client.
    pub local_reads: IntCounter,
    /// Reads of this disk's files served to other clients.
    pub served_reads: IntCounter,
    /// Reads that found a damaged file (deleted).
    pub corrupt_reads: IntCounter,
    /// Gets that read an only copy while the master answered.
    pub early_reads: IntCounter,
    /// Early reads whose answer showed another copy or version.
    pub early_reads_wasted: IntCounter,
    /// Times a file was marked as its object's only copy.
    pub only_copy_marks: IntCounter,
    /// Files written through the writers' io_uring.
    pub uring_writes: IntCounter,
    /// Calls telling the master about files or removals that failed (told again).
    pub announce_failures: IntCounter,
    /// Files refused by a master that may never have known their put: kept, told again as restores.
    pub ambiguous_refusals: IntCounter,
    /// Offloads skipped because the file system was full.
    pub full_skipped: IntCounter,
    files: IntGauge,
    used_bytes: IntGauge,
    capacity: IntGauge,
    retired_files: IntGauge,
    retired_bytes: IntGauge,
    unannounced: IntGauge,
    unverified: IntGauge,
    full: IntGauge,
}

impl Counters {
    /// The tier's registry with every series at 0; fails only if two series were given one name
    /// (a bug: [`crate::StoreError::Internal`]).
    pub fn new() -> Result<Counters> {
        let registry = Registry::new_custom(Some("crescent_client_disk".into()), None).map_err(internal)?;
        Ok(Counters {
            queued: counter(&registry, "queued_total", "Offloads handed to the writers")?,
            written: counter(&registry, "written_total", "Files written, made durable and indexed")?,
            bytes_written: counter(&registry, "bytes_written_total", "Bytes of the files written")?,
            recycled: counter(
                &registry,
                "recycled_total",
                "Files written over a retired or evicted file instead of a new one",
            )?,
            queue_full: counter(&registry, "queue_full_total", "Offloads dropped because the queue was full")?,
            too_large: counter(&registry, "too_large_total", "Offloads of values larger than the whole tier")?,
            busy_dropped: counter(
                &registry,
                "busy_dropped_total",
                "Offloads dropped because room could only be made by evicting files being read",
            )?,
            overwritten: counter(
                &registry,
                "overwritten_total",
                "Offloads dropped because their value's memory was reused before the writer had it",
            )?,
            write_failures: counter(&registry, "write_failures_total", "Files whose write, flush or rename failed")?,
            stale_refused: counter(
                &registry,
                "stale_refused_total",
                "Files the master refused (removed or put again while written): deleted",
            )?,
            evicted: counter(&registry, "evicted_total", "Files evicted to make room")?,
            removed: counter(&registry, "removed_total", "Files deleted on the master's removals")?,
            corrupt_removed: counter(
                &registry,
                "corrupt_removed_total",
                "Files found damaged at start or by the check after start: deleted",
            )?,
            incomplete_removed: counter(
                &registry,
                "incomplete_removed_total",
                "Temporary files of interrupted writes deleted at start",
            )?,
            stale_removed: counter(&registry, "stale_removed_total", "Older versions of a key deleted at start")?,
            local_reads: counter(&registry, "local_reads_total", "Reads of this disk's files for gets of this client")?,
            served_reads: counter(
                &registry,
                "served_reads_total",
                "Reads of this disk's files served to other clients",
            )?,
            corrupt_reads: counter(&registry, "corrupt_reads_total", "Reads that found a damaged file (deleted)")?,
            early_reads: counter(
                &registry,
                "early_reads_total",
                "Gets that read an only copy while the master answered",
            )?,
            early_reads_wasted: counter(
                &registry,
                "early_reads_wasted_total",
                "Early reads whose answer showed another copy or version",
            )?,
            only_copy_marks: counter(
                &registry,
                "only_copy_marks_total",
                "Times a file was marked as its object's only copy",
            )?,
            uring_writes: counter(&registry, "uring_writes_total", "Files written through the writers' io_uring")?,
            announce_failures: counter(
                &registry,
                "announce_failures_total",
                "Calls telling the master about files or removals that failed (told again)",
            )?,
            ambiguous_refusals: counter(
                &registry,
                "ambiguous_refusals_total",
                "Files refused by a master that may never have known their put: kept, told again as restores",
            )?,
            full_skipped: counter(
                &registry,
                "full_skipped_total",
                "Offloads skipped because the file system was full (their puts succeeded in memory)",
            )?,
            files: gauge(&registry, "files", "Files on this disk")?,
            used_bytes: gauge(&registry, "used_bytes", "Bytes the files take on disk")?,
            capacity: gauge(&registry, "capacity", "Bytes the tier may use")?,
            retired_files: gauge(&registry, "retired_files", "Removed files kept to be written over")?,
            retired_bytes: gauge(&registry, "retired_bytes", "Bytes of the retired files")?,
            unannounced: gauge(&registry, "unannounced", "Files and removals waiting to be told to the master again")?,
            unverified: gauge(&registry, "unverified", "Files found at start not checked yet")?,
            full: gauge(
                &registry,
                "full",
                "1 while the file system is full: files served, new offloads skipped until it has room",
            )?,
            registry,
        })
    }

    /// The counters and `sizes`, as [`DiskStats`].
    pub fn snapshot(&self, sizes: Sizes) -> DiskStats {
        DiskStats {
            queued: self.queued.get(),
            written: self.written.get(),
            bytes_written: self.bytes_written.get(),
            recycled: self.recycled.get(),
            queue_full: self.queue_full.get(),
            too_large: self.too_large.get(),
            busy_dropped: self.busy_dropped.get(),
            overwritten: self.overwritten.get(),
            write_failures: self.write_failures.get(),
            stale_refused: self.stale_refused.get(),
            evicted: self.evicted.get(),
            removed: self.removed.get(),
            corrupt_removed: self.corrupt_removed.get(),
            incomplete_removed: self.incomplete_removed.get(),
            stale_removed: self.stale_removed.get(),
            local_reads: self.local_reads.get(),
            served_reads: self.served_reads.get(),
            corrupt_reads: self.corrupt_reads.get(),
            early_reads: self.early_reads.get(),
            early_reads_wasted: self.early_reads_wasted.get(),
            only_copy_marks: self.only_copy_marks.get(),
            uring_writes: self.uring_writes.get(),
            announce_failures: self.announce_failures.get(),
            ambiguous_refusals: self.ambiguous_refusals.get(),
            full_skipped: self.full_skipped.get(),
            files: sizes.files,
            used_bytes: sizes.used_bytes,
            capacity: sizes.capacity,
            retired_files: sizes.retired_files,
            retired_bytes: sizes.retired_bytes,
            unannounced: sizes.unannounced,
            unverified: sizes.unverified,
            full: sizes.full,
        }
    }

    /// The metrics for an exposition, the gauges set to `sizes` first.
    pub fn gather(&self, sizes: Sizes) -> Vec<MetricFamily> {
        self.files.set(sizes.files.min(i64::MAX as u64) as i64);
        self.used_bytes.set(sizes.used_bytes.min(i64::MAX as u64) as i64);
        self.capacity.set(sizes.capacity.min(i64::MAX as u64) as i64);
        self.retired_files.set(sizes.retired_files.min(i64::MAX as u64) as i64);
        self.retired_bytes.set(sizes.retired_bytes.min(i64::MAX as u64) as i64);
        self.unannounced.set(sizes.unannounced.min(i64::MAX as u64) as i64);
        self.unverified.set(sizes.unverified.min(i64::MAX as u64) as i64);
        self.full.set(i64::from(sizes.full));
        self.registry.gather()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_the_tier_did_is_a_counter_and_its_sizes_are_gauges_and_the_stats_read_them_back() {
        let c = Counters::new().unwrap();
        c.written.inc_by(3);
        c.announce_failures.inc();
        let sizes = Sizes { files: 2, used_bytes: 8192, ..Sizes::default() };
        let s = c.snapshot(sizes);
        assert_eq!((s.written, s.announce_failures, s.files, s.used_bytes, s.queued), (3, 1, 2, 8192, 0));
        let families = c.gather(sizes);
        let kind = |name: &str| {
            families.iter().find(|f| f.name() == name).map(|f| (f.get_field_type(), f.get_metric()[0].clone()))
        };
        let (t, m) = kind("crescent_client_disk_written_total").unwrap();
        assert_eq!((t, m.get_counter().value()), (prometheus::proto::MetricType::COUNTER, 3.0));
        let (t, m) = kind("crescent_client_disk_files").unwrap();
        assert_eq!((t, m.get_gauge().value()), (prometheus::proto::MetricType::GAUGE, 2.0));
        assert_eq!(families.len(), 33, "every field of DiskStats, once");
    }
}
