//! Unit tests of the disk tier against a temporary directory (no master: a recording announcer).

use std::sync::atomic::AtomicU32;

use super::*;
use crate::pattern;

#[derive(Default)]
struct Recorder {
    added: Mutex<Vec<DiskEntry>>,
    removed: Mutex<Vec<DiskEntry>>,
    refuse: Mutex<Vec<String>>,
    /// Refused only when announced fresh (as a master that never knew their puts would).
    refuse_fresh: Mutex<Vec<String>>,
    /// Files announced as restores.
    restored: Mutex<Vec<String>>,
    /// How many of the next calls fail, as they do while the master is unreachable.
    fail: AtomicU32,
}

fn unreachable() -> StoreError {
    StoreError::master_unreachable("127.0.0.1:1", "connection refused")
}

/// Takes one of the calls `fail` says must fail.
fn failing(fail: &AtomicU32) -> bool {
    fail.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok()
}

impl Announcer for Recorder {
    fn announce(&self, added: &[DiskEntry], removed: &[DiskEntry], restore: bool) -> Result<Vec<bool>> {
        if failing(&self.fail) {
            return Err(unreachable());
        }
        self.added.lock().extend_from_slice(added);
        self.removed.lock().extend_from_slice(removed);
        if restore {
            self.restored.lock().extend(added.iter().map(|e| e.key.clone()));
        }
        let (refuse, refuse_fresh) = (self.refuse.lock(), self.refuse_fresh.lock());
        Ok(added.iter().map(|e| !refuse.contains(&e.key) && (restore || !refuse_fresh.contains(&e.key))).collect())
    }
}

fn config(root: &Path) -> DiskConfig {
    DiskConfig {
        root: root.to_path_buf(),
        cluster_id: "c1".into(),
        capacity: Some(64 << 20),
        writers: 2,
        queue_bytes: 256 << 20,
        fsync: Some(FsyncScope::FileSystem),
        recycle_bytes: 16 << 20,
        io_uring: true,
    }
}

fn value(len: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; len];
    pattern::fill(&mut v, seed, 0);
    v
}

fn started(c: DiskConfig) -> (Arc<DiskTier>, Arc<Recorder>) {
    let tier = DiskTier::open(c).unwrap();
    let rec = Arc::new(Recorder::default());
    tier.start(rec.clone());
    (tier, rec)
}

/// Drops `tier` once nothing else holds it, so that its lock is free when this returns and
/// the next open of the directory does not have to wait for it. Its threads hold the tier
/// only for a moment at a time, but a loaded host may keep one off the CPU for longer than
/// an open waits for the lock.
fn close(mut tier: Arc<DiskTier>) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match Arc::try_unwrap(tier) {
            Ok(sole) => return drop(sole),
            Err(shared) => tier = shared,
        }
        assert!(Instant::now() < deadline, "the tier's threads never let go of it");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The value files (and temporary files) under the tier's directory, not the retired ones.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for sub in std::fs::read_dir(dir).unwrap().flatten() {
        if sub.path().is_dir() && sub.file_name() != RETIRED_DIR {
            out.extend(std::fs::read_dir(sub.path()).unwrap().flatten().map(|f| f.path()));
        }
    }
    out
}

#[test]
fn offloaded_values_read_back_exactly_and_survive_a_restart() {
    let root = tempfile::tempdir().unwrap();
    let keys = ["plain", "../../../etc/passwd", "a/b/c", &"long/".repeat(800)];
    {
        let (tier, rec) = started(config(root.path()));
        for (i, k) in keys.iter().enumerate() {
            tier.offload(k, 10 + i as u64, &value(100_000 + i, i as u64));
        }
        assert!(tier.flush(Duration::from_secs(30)));
        assert_eq!(rec.added.lock().len(), keys.len());
        for (i, k) in keys.iter().enumerate() {
            let mut dst = vec![0u8; 100_000 + i];
            tier.read_local(k, 10 + i as u64, &mut dst).unwrap();
            assert_eq!(dst, value(100_000 + i, i as u64));
            // Another version, or another size, is not served.
            assert!(tier.read_local(k, 9, &mut dst).is_err());
        }
        let s = tier.stats();
        assert_eq!((s.files, s.written, s.local_reads), (keys.len() as u64, keys.len() as u64, keys.len() as u64));
        // Everything stays inside the cluster's directory.
        for f in files_under(tier.dir()) {
            assert!(f.starts_with(root.path().join("c1")), "{}", f.display());
        }
        close(tier);
    }
    // A second process (the first one's lock is gone with it) finds the files.
    let tier = DiskTier::open(config(root.path())).unwrap();
    assert_eq!(tier.stats().files, keys.len() as u64);
    let mut dst = vec![0u8; 100_000];
    tier.read_local("plain", 10, &mut dst).unwrap();
    assert_eq!(dst, value(100_000, 0));
}

#[test]
fn damaged_files_are_never_served_and_go_at_the_next_start() {
    let root = tempfile::tempdir().unwrap();
    let (tier, rec) = started(config(root.path()));
    for i in 0..4u64 {
        tier.offload(&format!("k{i}"), i + 1, &value(50_000, i));
    }
    assert!(tier.flush(Duration::from_secs(30)));
    let path = |i: u64| {
        let (sub, name) = format::file_name(&format!("k{i}"), i + 1);
        tier.dir().join(sub).join(name)
    };
    // k0: a flipped value byte; k1: truncated; k2: a flipped header byte.
    let flip = |p: PathBuf, at: u64| {
        let mut b = std::fs::read(&p).unwrap();
        b[at as usize] ^= 0x40;
        std::fs::write(&p, b).unwrap();
    };
    flip(path(0), format::ALIGN + 1234);
    let f = OpenOptions::new().write(true).open(path(1)).unwrap();
    f.set_len(format::ALIGN + 100).unwrap();
    flip(path(2), 20);
    let mut dst = vec![0u8; 50_000];
    let e = tier.read_local("k0", 1, &mut dst).unwrap_err();
    assert!(matches!(e, StoreError::CorruptFile(_)), "{e}");
    assert!(tier.read_local("k0", 1, &mut dst).is_err(), "the damaged file was dropped");
    assert!(rec.removed.lock().iter().any(|r| r.key == "k0"), "and the master told");
    assert!(tier.read_local("k1", 2, &mut dst).is_err());
    assert!(tier.read_local("k2", 3, &mut dst).is_err());
    tier.read_local("k3", 4, &mut dst).unwrap();
    assert_eq!(dst, value(50_000, 3));
    // Leftovers of interrupted writes, damaged files and foreign files at the next start.
    std::fs::write(path(3).with_extension("crs.0badc0de.tmp"), b"half a file").unwrap();
    let (sub, name) = format::file_name("k9", 99);
    std::fs::create_dir_all(tier.dir().join(&sub)).unwrap();
    std::fs::write(tier.dir().join(&sub).join(name), b"CRSD garbage").unwrap();
    std::fs::write(tier.dir().join(&sub).join("README"), b"not ours").unwrap();
    let dir = tier.dir().to_path_buf();
    close(tier);
    let tier = DiskTier::open(config(root.path())).unwrap();
    let s = tier.stats();
    assert_eq!(s.files, 1, "{s:?}");
    assert_eq!(s.incomplete_removed, 1);
    assert!(s.corrupt_removed >= 1, "{s:?}");
    assert!(dir.join(&sub).join("README").exists(), "files the tier did not write are left alone");
}

#[test]
fn capacity_evicts_the_least_recently_used_files_and_tells_the_master() {
    let root = tempfile::tempdir().unwrap();
    let mut c = config(root.path());
    c.capacity = Some(5 * (1 << 20) + 5 * format::ALIGN);
    c.writers = 1; // in order
    let (tier, rec) = started(c);
    for i in 0..5u64 {
        tier.offload(&format!("k{i}"), i + 1, &value(1 << 20, i));
        assert!(tier.flush(Duration::from_secs(30)));
    }
    let mut dst = vec![0u8; 1 << 20];
    tier.read_local("k0", 1, &mut dst).unwrap(); // k1 is now the least recently used
    tier.offload("k5", 6, &value(1 << 20, 5));
    tier.offload("k6", 7, &value(1 << 20, 6));
    assert!(tier.flush(Duration::from_secs(30)));
    let s = tier.stats();
    assert!(s.used_bytes <= s.capacity);
    assert_eq!((s.files, s.evicted), (5, 2));
    let removed: Vec<String> = rec.removed.lock().iter().map(|r| r.key.clone()).collect();
    assert_eq!(removed, ["k1", "k2"]);
    assert!(tier.read_local("k0", 1, &mut dst).is_ok());
    // A value larger than the whole tier is not written (and nothing is evicted for it).
    tier.offload("huge", 8, &value(6 << 20, 1));
    assert!(tier.flush(Duration::from_secs(30)));
    assert_eq!(tier.stats().too_large, 1);
    assert_eq!(tier.stats().files, 5);
}

/// A tier whose writers are not started: its offloads wait in the returned queue, for the test
/// to write (`write_job`) and commit; the recorder hears what it announces.
fn held_tier(c: DiskConfig) -> (Arc<DiskTier>, Arc<Recorder>, crossbeam_channel::Receiver<Job>) {
    let tier = DiskTier::open(c).unwrap();
    let rec = Arc::new(Recorder::default());
    *tier.announcer.write() = Some(rec.clone());
    let (tx, rx) = crossbeam_channel::bounded(MAX_QUEUED_JOBS);
    *tier.queue.lock() = Some(tx);
    (tier, rec, rx)
}

#[test]
fn a_full_queue_is_counted_not_blocking() {
    let root = tempfile::tempdir().unwrap();
    let mut c = config(root.path());
    c.queue_bytes = 1 << 20;
    let (tier, _rec, _rx) = held_tier(c); // nothing drains the queue
    for i in 0..4u64 {
        tier.offload(&format!("k{i}"), i + 1, &value(600 << 10, i));
    }
    let s = tier.stats();
    assert_eq!((s.queued, s.queue_full), (1, 3), "{s:?}");
}

#[test]
fn removals_and_stale_files_are_deleted() {
    let root = tempfile::tempdir().unwrap();
    let (tier, rec) = started(config(root.path()));
    rec.refuse.lock().push("stale".into());
    tier.offload("stale", 1, &value(1000, 1));
    tier.offload("keep", 2, &value(1000, 2));
    tier.offload("gone", 3, &value(1000, 3));
    assert!(tier.flush(Duration::from_secs(30)));
    assert_eq!(tier.version_of("stale"), None, "the master refused it");
    assert_eq!(tier.stats().stale_refused, 1);
    tier.apply_removals(&[DiskEntry { key: "gone".into(), size: 0, version: 3 }]);
    tier.apply_removals(&[DiskEntry { key: "keep".into(), size: 0, version: 1 }]); // an older version
    assert_eq!(tier.version_of("gone"), None);
    assert_eq!(tier.version_of("keep"), Some(2));
    assert_eq!(files_under(tier.dir()).len(), 1);
    assert_eq!(tier.stats().retired_files, 2, "the two files that went are kept for reuse, under no key");
}

#[test]
fn invalid_roots_and_a_second_process_are_clear_errors() {
    let root = tempfile::tempdir().unwrap();
    let missing = config(&root.path().join("nope"));
    let e = DiskTier::open(missing).unwrap_err().to_string();
    assert!(e.contains("nope") && e.contains("storage root"), "{e}");
    let file = root.path().join("file");
    std::fs::write(&file, b"x").unwrap();
    assert!(DiskTier::open(config(&file)).unwrap_err().to_string().contains("not a directory"));
    let mut bad = config(root.path());
    bad.cluster_id = "../x".into();
    assert!(DiskTier::open(bad).unwrap_err().to_string().contains("cluster id"));
    let _first = DiskTier::open(config(root.path())).unwrap();
    let e = DiskTier::open(config(root.path())).unwrap_err().to_string();
    assert!(e.contains("in use"), "{e}");
    // Another cluster id on the same root is independent.
    let mut other = config(root.path());
    other.cluster_id = "c2".into();
    assert_ne!(DiskTier::open(other).unwrap().disk_id(), _first.disk_id());
}

#[test]
fn read_only_roots_are_refused() {
    if rustix::process::geteuid().is_root() {
        println!("SKIPPED: root can write anywhere");
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let mut perm = std::fs::metadata(root.path()).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o500);
    std::fs::set_permissions(root.path(), perm).unwrap();
    let e = DiskTier::open(config(root.path())).unwrap_err().to_string();
    assert!(e.contains("storage root"), "{e}");
}

#[test]
fn a_file_being_read_is_not_evicted_and_reads_back_whole() {
    let root = tempfile::tempdir().unwrap();
    let mut c = config(root.path());
    c.capacity = Some(3 * ((1 << 20) + format::ALIGN));
    c.writers = 1; // in order
    let (tier, rec) = started(c);
    for i in 0..3u64 {
        tier.offload(&format!("k{i}"), i + 1, &value(1 << 20, i));
        assert!(tier.flush(Duration::from_secs(30)));
    }
    // A remote reader (the disk service) has k0 open and read half of it; k0 is the least
    // recently used file... apart from the read itself, so make k1 and k2 younger.
    let mut reader = tier.open_reader("k0", 1, 1 << 20).unwrap();
    let mut got = vec![0u8; 1 << 20];
    reader.read_next(&mut got[..1 << 19]).unwrap();
    let mut dst = vec![0u8; 1 << 20];
    tier.read_local("k1", 2, &mut dst).unwrap();
    tier.read_local("k2", 3, &mut dst).unwrap();
    // Room for a new file: k0 is being read, so k1 goes.
    tier.offload("k3", 4, &value(1 << 20, 3));
    assert!(tier.flush(Duration::from_secs(30)));
    assert_eq!(tier.version_of("k0"), Some(1), "a file being read is not evicted");
    assert_eq!(tier.version_of("k1"), None);
    assert!(!rec.removed.lock().iter().any(|r| r.key == "k0"));
    reader.read_next(&mut got[1 << 19..]).unwrap();
    assert_eq!(got, value(1 << 20, 0));
    // Room only by evicting files being read (all of them): the offload is dropped, counted.
    let _readers: Vec<_> =
        [("k0", 1), ("k2", 3), ("k3", 4)].iter().map(|(k, v)| tier.open_reader(k, *v, 1 << 20).unwrap()).collect();
    drop(reader);
    tier.offload("k4", 5, &value(1 << 20, 4));
    assert!(tier.flush(Duration::from_secs(30)));
    assert_eq!(tier.version_of("k4"), None);
    assert_eq!(tier.stats().busy_dropped, 1);
    assert_eq!(tier.stats().files, 3);
}

#[test]
fn a_removal_of_a_key_whose_offload_is_in_flight_is_not_acknowledged() {
    let root = tempfile::tempdir().unwrap();
    let (tier, rec, rx) = held_tier(config(root.path())); // the job waits
    tier.offload("k", 5, &value(1000, 1));
    tier.offload("other", 6, &value(1000, 2));
    let removal = |key: &str, version| DiskEntry { key: key.into(), size: 0, version };
    tier.apply_removals(&[removal("k", 5), removal("gone", 3)]);
    let acked: Vec<String> = rec.removed.lock().iter().map(|r| r.key.clone()).collect();
    assert_eq!(acked, ["gone"], "the master keeps the removal of k queued while its file may still appear");
    // Once the write is done (here: the job is taken and finished), the removal is acknowledged.
    let (written_tx, written_rx) = crossbeam_channel::unbounded();
    for job in rx.try_iter() {
        tier.write_job(job, &written_tx, &mut io::psync::Psync);
    }
    tier.commit(written_rx.try_iter().collect());
    tier.apply_removals(&[removal("k", 5)]);
    assert!(rec.removed.lock().iter().any(|r| r.key == "k"));
    assert_eq!(tier.version_of("k"), None);
}

/// A removal heard on the disk's owner stream is acknowledged at once, so a write of the key
/// queued before it (or written and not yet committed) must not leave a file that a new master
/// would take back: it is deleted, never indexed nor announced. A newer put's file stays.
#[test]
fn a_removal_on_the_owner_stream_dooms_the_writes_of_its_key_in_flight() {
    let root = tempfile::tempdir().unwrap();
    let (tier, rec, rx) = held_tier(config(root.path())); // the jobs wait
    tier.offload("queued", 5, &value(1000, 1));
    tier.offload("staged", 5, &value(1000, 2));
    tier.offload("newer", 7, &value(1000, 3));
    let (written_tx, written_rx) = crossbeam_channel::unbounded();
    let mut jobs: Vec<_> = rx.try_iter().collect();
    let queued = jobs.remove(0);
    for job in jobs {
        tier.write_job(job, &written_tx, &mut io::psync::Psync); // staged, not committed
    }
    for key in ["queued", "staged", "newer"] {
        tier.apply_owner_removal(key, 5);
    }
    tier.write_job(queued, &written_tx, &mut io::psync::Psync);
    tier.commit(written_rx.try_iter().collect());
    assert_eq!(tier.version_of("queued"), None);
    assert_eq!(tier.version_of("staged"), None);
    assert_eq!(tier.version_of("newer"), Some(7), "a put after the removal keeps its file");
    let announced: Vec<String> = rec.added.lock().iter().map(|e| e.key.clone()).collect();
    assert_eq!(announced, ["newer"]);
    assert_eq!(tier.stats().files, 1);
    // A file indexed before the removal goes with it.
    tier.apply_owner_removal("newer", 7);
    assert_eq!(tier.version_of("newer"), None);
}

#[test]
fn removals_kept_for_the_master_survive_a_restart_of_this_client() {
    let root = tempfile::tempdir().unwrap();
    let set = vec![
        HeldRemoval { disk: "ssd:other".into(), key: "a/\n\"weird\" key".into(), version: 7 },
        HeldRemoval { disk: "ssd:x".into(), key: "b".into(), version: u64::MAX },
    ];
    {
        let tier = DiskTier::open(config(root.path())).unwrap();
        assert!(tier.held_removals().is_empty());
        tier.keep_held_removals(set.clone());
        assert_eq!(tier.held_removals(), set);
        close(tier);
    }
    let tier = DiskTier::open(config(root.path())).unwrap();
    assert_eq!(tier.held_removals(), set, "kept on disk");
    tier.keep_held_removals(Vec::new());
    close(tier);
    assert!(DiskTier::open(config(root.path())).unwrap().held_removals().is_empty());
}

#[test]
fn an_image_made_before_a_failed_put_gives_its_room_back_and_writes_nothing() {
    let root = tempfile::tempdir().unwrap();
    let mut c = config(root.path());
    c.queue_bytes = 1 << 20;
    let (tier, rec) = started(c);
    // The put of "failed" did not commit: its image is dropped, not queued.
    let failed = tier.prepare("failed", &value(700 << 10, 1));
    assert_eq!(tier.pending.lock().jobs, 1, "a prepared image holds its room in the queue");
    drop(failed);
    // Its room is free again: a flush does not wait for it, and the next value fits.
    assert!(tier.flush(Duration::from_millis(100)), "the dropped image left a job pending");
    tier.prepare("committed", &value(700 << 10, 2)).queue(5);
    assert!(tier.flush(Duration::from_secs(30)));
    let s = tier.stats();
    assert_eq!((s.queue_full, s.files), (0, 1), "{s:?}");
    assert_eq!(tier.version_of("failed"), None);
    assert_eq!(tier.version_of("committed"), Some(5));
    let announced: Vec<String> = rec.added.lock().iter().map(|e| e.key.clone()).collect();
    assert_eq!(announced, ["committed"]);
    let mut dst = vec![0u8; 700 << 10];
    tier.read_local("committed", 5, &mut dst).unwrap();
    assert_eq!(dst, value(700 << 10, 2));
}

fn removal(key: &str, version: u64) -> DiskEntry {
    DiskEntry { key: key.into(), size: 0, version }
}

/// Bytes of every file under the tier's directory (values, temporary and retired files).
fn bytes_on_disk(dir: &Path) -> u64 {
    let mut n = 0;
    for sub in std::fs::read_dir(dir).unwrap().flatten().filter(|s| s.path().is_dir()) {
        n += std::fs::read_dir(sub.path()).unwrap().flatten().map(|f| f.metadata().unwrap().len()).sum::<u64>();
    }
    n
}

fn exact_file_len(tier: &DiskTier, key: &str, version: u64) -> u64 {
    let (sub, name) = format::file_name(key, version);
    std::fs::metadata(tier.dir().join(sub).join(name)).unwrap().len()
}

/// Offloads `n` values of `len` bytes as `{prefix}{i}` (version i + 1), waits for them, then
/// removes them all (so their files are retired, room permitting).
fn offload_then_remove(tier: &Arc<DiskTier>, prefix: &str, n: u64, len: usize) {
    for i in 0..n {
        tier.offload(&format!("{prefix}{i}"), i + 1, &value(len, i));
    }
    assert!(tier.flush(Duration::from_secs(30)));
    tier.apply_removals(&(0..n).map(|i| removal(&format!("{prefix}{i}"), i + 1)).collect::<Vec<_>>());
}

#[test]
fn removed_files_are_written_over_by_later_offloads_and_read_back_exactly() {
    let root = tempfile::tempdir().unwrap();
    let (tier, _rec) = started(config(root.path()));
    offload_then_remove(&tier, "old", 4, 300_000);
    let s = tier.stats();
    assert_eq!((s.files, s.removed, s.retired_files), (0, 4, 4));
    assert_eq!(std::fs::read_dir(tier.dir().join(RETIRED_DIR)).unwrap().count(), 4);
    let mut dst = vec![0u8; 300_000];
    assert!(tier.read_local("old0", 1, &mut dst).is_err(), "a removed key is not served from a retired file");
    // New values the same size as the old files, smaller (the file is cut) and larger (it grows).
    let sizes = [300_000usize, 100_000, 500_000, 300_000];
    for (i, len) in sizes.iter().enumerate() {
        tier.offload(&format!("new{i}"), 10 + i as u64, &value(*len, 100 + i as u64));
    }
    assert!(tier.flush(Duration::from_secs(30)));
    let s = tier.stats();
    assert_eq!((s.files, s.written, s.recycled, s.retired_files), (4, 8, 4, 0));
    for (i, len) in sizes.iter().enumerate() {
        let key = format!("new{i}");
        let mut dst = vec![0u8; *len];
        tier.read_local(&key, 10 + i as u64, &mut dst).unwrap();
        assert_eq!(dst, value(*len, 100 + i as u64), "{key}");
        assert_eq!(exact_file_len(&tier, &key, 10 + i as u64), format::data_offset(key.len()) + *len as u64);
    }
    // A restart indexes the written-over files as the new keys only.
    close(tier);
    let tier = DiskTier::open(config(root.path())).unwrap();
    let s = tier.stats();
    assert_eq!((s.files, s.corrupt_removed, s.stale_removed), (4, 0, 0));
    assert_eq!(tier.version_of("old0"), None);
}

#[test]
fn retired_files_outlive_a_restart_and_count_against_the_capacity() {
    let root = tempfile::tempdir().unwrap();
    {
        let (tier, _rec) = started(config(root.path()));
        offload_then_remove(&tier, "k", 3, 200_000);
        assert_eq!(tier.stats().retired_files, 3);
        std::fs::write(tier.dir().join(RETIRED_DIR).join("junk.tmp"), b"not ours").unwrap();
        close(tier);
    }
    let (tier, _rec) = started(config(root.path()));
    let s = tier.stats();
    assert_eq!((s.files, s.retired_files), (0, 3), "adopted again, never indexed as keys");
    assert_eq!(s.retired_bytes, 3 * format::disk_len(format::data_offset(2) + 200_000), "whole 4 KiB blocks");
    assert_eq!(tier.version_of("k0"), None);
    assert_eq!(std::fs::read_dir(tier.dir().join(RETIRED_DIR)).unwrap().count(), 3, "junk.tmp went");
    tier.offload("n", 7, &value(200_000, 7));
    assert!(tier.flush(Duration::from_secs(30)));
    assert_eq!(tier.stats().recycled, 1);
    // A smaller capacity than the retired files take: they go first, files stay.
    close(tier);
    let mut c = config(root.path());
    c.capacity = Some(format::data_offset(1) + 200_000 + 1000);
    let tier = DiskTier::open(c).unwrap();
    let s = tier.stats();
    assert_eq!((s.files, s.retired_files), (1, 0));
    assert_eq!(std::fs::read_dir(tier.dir().join(RETIRED_DIR)).unwrap().count(), 0);
}

#[test]
fn eviction_writes_over_the_evicted_file_and_the_disk_never_holds_more_than_the_capacity() {
    let root = tempfile::tempdir().unwrap();
    let mut c = config(root.path());
    let file_len = format::data_offset(2) + (1 << 20);
    c.capacity = Some(4 * file_len);
    let (tier, rec) = started(c);
    for i in 0..12u64 {
        tier.offload(&format!("k{}", i % 10), i + 1, &value(1 << 20, i));
        assert!(tier.flush(Duration::from_secs(30)));
        assert!(bytes_on_disk(tier.dir()) <= 4 * file_len, "after write {i}");
    }
    let s = tier.stats();
    assert_eq!((s.files, s.written), (4, 12));
    assert_eq!(s.evicted, 8);
    assert_eq!(s.recycled, 8, "each write after the fourth wrote over the file it evicted");
    assert_eq!(rec.removed.lock().len(), 8, "the master heard of every eviction");
    for i in 8..12u64 {
        let mut dst = vec![0u8; 1 << 20];
        tier.read_local(&format!("k{}", i % 10), i + 1, &mut dst).unwrap();
        assert_eq!(dst, value(1 << 20, i));
    }
}

#[test]
fn a_file_removed_while_being_read_is_deleted_not_written_over() {
    let root = tempfile::tempdir().unwrap();
    let mut c = config(root.path());
    c.writers = 1;
    let (tier, _rec) = started(c);
    tier.offload("k0", 1, &value(1 << 20, 0));
    assert!(tier.flush(Duration::from_secs(30)));
    let mut reader = tier.open_reader("k0", 1, 1 << 20).unwrap();
    let mut got = vec![0u8; 1 << 20];
    reader.read_next(&mut got[..1 << 19]).unwrap();
    tier.apply_removals(&[removal("k0", 1)]);
    assert_eq!(tier.stats().retired_files, 0, "its reader still has it open");
    // If k0's file had been retired, this write would go over it under the reader.
    tier.offload("k1", 2, &value(1 << 20, 1));
    assert!(tier.flush(Duration::from_secs(30)));
    assert_eq!(tier.stats().recycled, 0);
    reader.read_next(&mut got[1 << 19..]).unwrap();
    assert_eq!(got, value(1 << 20, 0));
}

#[test]
fn recycling_can_be_turned_off() {
    let root = tempfile::tempdir().unwrap();
    let mut c = config(root.path());
    c.recycle_bytes = 0;
    let (tier, _rec) = started(c);
    tier.offload("k0", 1, &value(100_000, 0));
    assert!(tier.flush(Duration::from_secs(30)));
    tier.apply_removals(&[removal("k0", 1)]);
    assert_eq!(tier.stats().retired_files, 0);
    assert_eq!(bytes_on_disk(tier.dir()), 0, "the removed file is deleted");
}

#[test]
fn the_same_version_offloaded_twice_stays_readable_and_announced() {
    // Two writers may both write (key, version) when it is queued twice: the second rename
    // lands on the first file's name, which must not then be dropped as "replaced".
    let root = tempfile::tempdir().unwrap();
    let mut c = config(root.path());
    c.writers = 4;
    let (tier, rec) = started(c);
    for i in 0..40u64 {
        let v = value(64 << 10, i);
        tier.offload(&format!("k{i}"), 7, &v);
        tier.offload(&format!("k{i}"), 7, &v);
    }
    assert!(tier.flush(Duration::from_secs(30)));
    let mut dst = vec![0u8; 64 << 10];
    for i in 0..40u64 {
        tier.read_local(&format!("k{i}"), 7, &mut dst).unwrap_or_else(|e| panic!("k{i}: {e}"));
        assert_eq!(dst, value(64 << 10, i));
    }
    assert!(rec.removed.lock().is_empty(), "no removal announced for a version still on disk");
}

#[test]
fn a_failed_write_gives_the_retired_files_back_to_the_file_system() {
    let root = tempfile::tempdir().unwrap();
    let mut c = config(root.path());
    c.recycle_bytes = 2 << 20; // room for three retired files of 600 KB, not four
    let (tier, _rec) = started(c);
    offload_then_remove(&tier, "old", 4, 600_000);
    assert_eq!(tier.stats().retired_files, 3, "the fourth would exceed disk_recycle_size: deleted");
    // A write that fails (here its hash directory's name is taken by a plain file; on a
    // full disk, ENOSPC) deletes the retired files, which may be what fills the disk.
    let (sub, _) = format::file_name("victim", 9);
    std::fs::write(tier.dir().join(&sub), b"in the way").unwrap();
    tier.offload("victim", 9, &value(600_000, 9));
    assert!(tier.flush(Duration::from_secs(30)));
    let s = tier.stats();
    assert_eq!((s.write_failures, s.retired_files, s.retired_bytes), (1, 0, 0));
    assert_eq!(std::fs::read_dir(tier.dir().join(RETIRED_DIR)).unwrap().count(), 0);
}

/// Memory standing in for a client's segment: `len` bytes at `shift` bytes past a 4 KiB
/// boundary, holding `value(len, seed)`.
fn segment_with(len: usize, seed: u64, shift: usize) -> (Vec<u8>, usize) {
    let mut mem = vec![0u8; len + shift + 2 * ALIGN_USIZE];
    let at = mem.as_ptr().align_offset(ALIGN_USIZE) + shift;
    mem[at..at + len].copy_from_slice(&value(len, seed));
    (mem, at)
}

const ALIGN_USIZE: usize = format::ALIGN as usize;

/// Queues an offload prepared from `value(len, seed)` (its CRC), the writers to read it from
/// `mem[at..]`.
fn queue_in_place(tier: &Arc<DiskTier>, key: &str, version: u64, mem: Vec<u8>, at: usize, len: usize, seed: u64) {
    let prepared = tier.prepare_resident(key, &value(len, seed));
    let mem = Arc::new(mem);
    let addr = mem.as_ptr() as u64 + at as u64;
    // SAFETY: `mem` (kept by the box) holds [addr, +len).
    let resident = unsafe { file::ResidentValue::new(Box::new(mem.clone()), addr, len) };
    prepared.queue_resident(version, Some(resident), &[]);
}

#[test]
fn values_written_from_where_they_lie_read_back_exactly_and_changed_ones_are_dropped() {
    let root = tempfile::tempdir().unwrap();
    let (tier, rec) = started(config(root.path()));
    // Aligned (written in place, with a partial last 4 KiB), and not (copied first).
    let (aligned, unaligned) = ((1 << 20) + 1000, 300_000);
    let (mem, at) = segment_with(aligned, 1, 0);
    queue_in_place(&tier, "aligned", 1, mem, at, aligned, 1);
    let (mem, at) = segment_with(unaligned, 2, 256);
    queue_in_place(&tier, "unaligned", 2, mem, at, unaligned, 2);
    // The memory was given to another object between the put and the write: both kinds dropped.
    for (key, shift) in [("changed-aligned", 0), ("changed-unaligned", 256)] {
        let (mut mem, at) = segment_with(aligned, 3, shift);
        mem[at + 70_000] ^= 0x40;
        queue_in_place(&tier, key, 3, mem, at, aligned, 3);
    }
    // No replica of ours after all: the bytes are copied when queued.
    tier.prepare_resident("copied", &value(5000, 4)).queue_resident(4, None, &value(5000, 4));
    assert!(tier.flush(Duration::from_secs(30)));

    let s = tier.stats();
    assert_eq!((s.files, s.overwritten, s.write_failures), (3, 2, 0), "{s:?}");
    for (key, version, len, seed) in
        [("aligned", 1, aligned, 1), ("unaligned", 2, unaligned, 2), ("copied", 4, 5000, 4)]
    {
        let mut dst = vec![0u8; len];
        tier.read_local(key, version, &mut dst).unwrap();
        assert!(dst == value(len, seed), "{key} read back different bytes");
    }
    for key in ["changed-aligned", "changed-unaligned"] {
        assert_eq!(tier.version_of(key), None, "{key} was written although its bytes changed");
    }
    let mut announced: Vec<String> = rec.added.lock().iter().map(|e| e.key.clone()).collect();
    announced.sort();
    assert_eq!(announced, ["aligned", "copied", "unaligned"]);
    assert_eq!(files_under(tier.dir()).len(), 3, "a dropped offload left a file behind");
}

#[test]
fn files_written_with_or_without_io_uring_read_back_exactly() {
    let have_ring = io::uring::Ring::for_tests().is_some();
    for io_uring in [true, false] {
        let root = tempfile::tempdir().unwrap();
        let (tier, _rec) = started(DiskConfig { io_uring, ..config(root.path()) });
        // Whole 4 KiB blocks (written and flushed in one submission) and a partial last block
        // (cut to length after the write, then flushed), copied or written where they lie.
        let sizes = [1 << 20, (1 << 20) + 1000, 4096 - 4096 / 2, 1];
        for (i, len) in sizes.iter().enumerate() {
            tier.offload(&format!("k{i}"), 1 + i as u64, &value(*len, i as u64));
        }
        let (mem, at) = segment_with(1 << 20, 9, 0);
        queue_in_place(&tier, "resident", 9, mem, at, 1 << 20, 9);
        assert!(tier.flush(Duration::from_secs(30)));
        let mut expect: Vec<(String, u64, usize, u64)> =
            sizes.iter().enumerate().map(|(i, len)| (format!("k{i}"), 1 + i as u64, *len, i as u64)).collect();
        expect.push(("resident".into(), 9, 1 << 20, 9));
        for (key, version, len, seed) in &expect {
            let mut dst = vec![0u8; *len];
            tier.read_local(key, *version, &mut dst).unwrap();
            assert!(dst == value(*len, *seed), "{key} (io_uring {io_uring})");
            assert_eq!(exact_file_len(&tier, key, *version), format::data_offset(key.len()) + *len as u64);
        }
        // Over the files of removed keys: shorter, longer and the same length.
        tier.apply_removals(&expect.iter().map(|(k, v, _, _)| removal(k, *v)).collect::<Vec<_>>());
        let again = [300_000usize, (1 << 20) + 8192, 1 << 20];
        for (i, len) in again.iter().enumerate() {
            tier.offload(&format!("again{i}"), 20 + i as u64, &value(*len, 20 + i as u64));
        }
        assert!(tier.flush(Duration::from_secs(30)));
        let s = tier.stats();
        assert_eq!((s.written, s.write_failures), (8, 0), "{s:?}");
        assert!(s.recycled >= 3, "{s:?}");
        assert_eq!(s.uring_writes, if io_uring && have_ring { 8 } else { 0 }, "{s:?}");
        for (i, len) in again.iter().enumerate() {
            let key = format!("again{i}");
            let mut dst = vec![0u8; *len];
            tier.read_local(&key, 20 + i as u64, &mut dst).unwrap();
            assert!(dst == value(*len, 20 + i as u64), "{key} (io_uring {io_uring})");
            assert_eq!(exact_file_len(&tier, &key, 20 + i as u64), format::data_offset(key.len()) + *len as u64);
        }
        // A restart finds every file whole.
        close(tier);
        let tier = DiskTier::open(DiskConfig { io_uring, ..config(root.path()) }).unwrap();
        let s = tier.stats();
        assert_eq!((s.files, s.corrupt_removed), (3, 0), "{s:?}");
    }
}

/// Bytes the files under the tier's directory (values, temporary and retired files) take on a
/// file system that allocates whole 4 KiB blocks.
fn blocks_on_disk(dir: &Path) -> u64 {
    let mut n = 0;
    for sub in std::fs::read_dir(dir).unwrap().flatten().filter(|s| s.path().is_dir()) {
        for f in std::fs::read_dir(sub.path()).unwrap().flatten() {
            n += f.metadata().unwrap().len().div_ceil(4096) * 4096;
        }
    }
    n
}

#[test]
fn small_values_never_take_more_disk_than_the_capacity() {
    // A 5000-byte value under a short key: a 9096-byte file, three 4 KiB blocks on disk.
    let root = tempfile::tempdir().unwrap();
    let mut c = config(root.path());
    let capacity = 10 * 3 * 4096;
    c.capacity = Some(capacity);
    c.writers = 1;
    let (tier, _rec) = started(c);
    for i in 0..30u64 {
        tier.offload(&format!("k{i:02}"), i + 1, &value(5000, i));
        assert!(tier.flush(Duration::from_secs(30)));
        let taken = blocks_on_disk(tier.dir());
        assert!(taken <= capacity, "after write {i}: the files take {taken} bytes, the capacity is {capacity}");
    }
    let s = tier.stats();
    assert_eq!((s.files, s.used_bytes, s.evicted), (10, capacity, 20), "{s:?}");
    for i in 20..30u64 {
        let mut dst = vec![0u8; 5000];
        tier.read_local(&format!("k{i:02}"), i + 1, &mut dst).unwrap();
        assert!(dst == value(5000, i));
    }
}

#[test]
fn a_file_removed_between_the_look_up_and_the_open_is_not_found_and_not_corrupt() {
    let root = tempfile::tempdir().unwrap();
    let (tier, rec) = started(config(root.path()));
    tier.offload("k", 1, &value(100_000, 1));
    tier.offload("lost", 2, &value(100_000, 2));
    assert!(tier.flush(Duration::from_secs(30)));
    // A removal lands right after the reader found the file in the index.
    let t = tier.clone();
    *tier.before_open.lock() = Some(Box::new(move || t.apply_removals(&[removal("k", 1)])));
    let mut dst = vec![0u8; 100_000];
    let e = tier.read_local("k", 1, &mut dst).unwrap_err();
    assert!(matches!(e, StoreError::NotFound(_)), "{e}");
    assert_eq!(tier.stats().corrupt_reads, 0, "a removed file is not a damaged one");
    // A file deleted behind the tier's back while still indexed is a fault: counted, dropped
    // and the master told.
    let (sub, name) = format::file_name("lost", 2);
    std::fs::remove_file(tier.dir().join(sub).join(name)).unwrap();
    let e = tier.read_local("lost", 2, &mut dst).unwrap_err();
    assert!(matches!(e, StoreError::Disk(_)), "{e}");
    assert_eq!(tier.stats().corrupt_reads, 1);
    assert_eq!(tier.version_of("lost"), None);
    assert!(rec.removed.lock().iter().any(|r| r.key == "lost"));
}

/// Waits (up to 30 s) until `f` holds.
fn eventually(mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + Duration::from_secs(30);
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    f()
}

#[test]
fn a_file_whose_announcement_failed_is_announced_again_and_so_is_an_eviction() {
    let root = tempfile::tempdir().unwrap();
    let mut c = config(root.path());
    c.capacity = Some(2 * (format::ALIGN + (1 << 20)));
    c.writers = 1;
    let (tier, rec) = started(c);
    // The commit's call and the first retry fail; the second retry goes through.
    rec.fail.store(2, Ordering::SeqCst);
    tier.offload("k", 1, &value(1 << 20, 1));
    assert!(tier.flush(Duration::from_secs(30)));
    assert_eq!(tier.version_of("k"), Some(1), "the file is kept, not lost with the call");
    assert!(eventually(|| rec.added.lock().iter().any(|e| e.key == "k" && e.version == 1)), "never announced");
    let s = tier.stats();
    assert_eq!((s.announce_failures, s.unannounced), (2, 0), "{s:?}");
    // An eviction the master could not be told about is told later too.
    tier.offload("a", 2, &value(1 << 20, 2));
    assert!(tier.flush(Duration::from_secs(30)));
    rec.fail.store(1, Ordering::SeqCst);
    tier.offload("b", 3, &value(1 << 20, 3)); // evicts "k"
    assert!(tier.flush(Duration::from_secs(30)));
    assert_eq!(tier.version_of("k"), None);
    assert!(eventually(|| rec.removed.lock().iter().any(|e| e.key == "k")), "the eviction never reached the master");
    assert!(eventually(|| rec.added.lock().iter().any(|e| e.key == "b")));
    assert_eq!(tier.stats().unannounced, 0);
}

/// The master of this process, called directly; `fail` calls fail as if it were unreachable.
struct MasterLink {
    master: Arc<crate::master::Master>,
    disk: u64,
    fail: AtomicU32,
}

impl Announcer for MasterLink {
    fn announce(&self, added: &[DiskEntry], removed: &[DiskEntry], restore: bool) -> Result<Vec<bool>> {
        if failing(&self.fail) {
            return Err(unreachable());
        }
        let r = self.master.update_disk_replicas("c1", self.disk, added, removed, restore)?;
        Ok(r.iter().map(|r| r.is_ok()).collect())
    }
}

#[test]
fn a_value_whose_announcement_failed_is_still_readable_once_memory_evicted_it() {
    use crate::master::{Master, MasterConfig};
    use crate::proto::{PutOptions, SegmentInfo, Tier};
    let m = Master::new(MasterConfig::default()).unwrap();
    m.mount_segment("c1", &SegmentInfo { name: "mem".into(), base: 1 << 30, size: 4 << 20, tier: 0 }, "h").unwrap();
    let root = tempfile::tempdir().unwrap();
    let tier = DiskTier::open(config(root.path())).unwrap();
    let disk = m.mount_disk("c1", tier.disk_id(), "h:1", tier.capacity(), "h").unwrap();
    // The master is unreachable when the file's announcement goes out.
    tier.start(Arc::new(MasterLink { master: m.clone(), disk, fail: AtomicU32::new(1) }));
    let (_, v) = m.put_start("c1", "k", 1 << 20, &PutOptions::default()).unwrap();
    m.put_end("c1", "k").unwrap();
    tier.offload("k", v, &value(1 << 20, 7));
    assert!(tier.flush(Duration::from_secs(30)));
    let on_disk = || m.query("k").is_ok_and(|q| q.replicas.iter().any(|r| r.tier == Tier::Ssd as i32));
    assert!(eventually(on_disk), "the master never learnt of the file");
    // Memory fills up: the object loses its memory replica and keeps the disk copy.
    for i in 0..6 {
        let (_, _) = m.put_start("c1", &format!("fill{i}"), 1 << 20, &PutOptions::default()).unwrap();
        m.put_end("c1", &format!("fill{i}")).unwrap();
    }
    let list = m.get_replica_list("k").unwrap();
    assert_eq!(list.replicas.iter().map(|r| r.tier).collect::<Vec<_>>(), [Tier::Ssd as i32]);
    assert!(!m.disk_removals_for("c1").iter().any(|r| r.key == "k"), "the master does not ask for the file's deletion");
    let mut dst = vec![0u8; 1 << 20];
    tier.read_local("k", list.version, &mut dst).unwrap();
    assert!(dst == value(1 << 20, 7));
    assert_eq!(tier.stats().announce_failures, 1);
}

#[test]
fn a_value_damaged_while_the_tier_was_closed_is_removed_by_the_check_after_start() {
    let root = tempfile::tempdir().unwrap();
    let sizes = [(1 << 20) + 1000, 5000, 3 << 20];
    {
        let (tier, _rec) = started(config(root.path()));
        for (i, len) in sizes.iter().enumerate() {
            tier.offload(&format!("k{i}"), 1 + i as u64, &value(*len, i as u64));
        }
        assert!(tier.flush(Duration::from_secs(30)));
        close(tier);
    }
    // One value byte of k0 goes bad on the device; its header and length stay right.
    let dir = root.path().join("c1");
    let (sub, name) = format::file_name("k0", 1);
    let path = dir.join(sub).join(name);
    let mut b = std::fs::read(&path).unwrap();
    b[format::ALIGN as usize + 700_000] ^= 0x01;
    std::fs::write(&path, b).unwrap();
    let (tier, rec) = started(config(root.path()));
    let s = tier.stats();
    assert_eq!((s.files, s.unverified, s.corrupt_removed), (3, 3, 0), "headers and lengths pass at start: {s:?}");
    tier.verify_found();
    assert!(eventually(|| tier.stats().unverified == 0), "the check after start never ended");
    let s = tier.stats();
    assert_eq!((s.files, s.corrupt_removed, s.corrupt_reads), (2, 1, 0), "{s:?}");
    assert!(!path.exists(), "the damaged file is removed");
    assert!(rec.removed.lock().iter().any(|r| r.key == "k0" && r.version == 1), "and the master told");
    let mut dst = vec![0u8; sizes[0]];
    assert!(matches!(tier.read_local("k0", 1, &mut dst), Err(StoreError::NotFound(_))));
    for (i, len) in sizes.iter().enumerate().skip(1) {
        let mut dst = vec![0u8; *len];
        tier.read_local(&format!("k{i}"), 1 + i as u64, &mut dst).unwrap();
        assert!(dst == value(*len, i as u64), "k{i}");
    }
    tier.verify_found(); // once only
    assert_eq!(tier.stats().corrupt_removed, 1);
}

#[test]
fn the_check_after_start_waits_while_gets_read_the_tier() {
    let root = tempfile::tempdir().unwrap();
    {
        let (tier, _rec) = started(config(root.path()));
        for i in 0..8 {
            tier.offload(&format!("k{i}"), 1 + i, &value(100_000, i));
        }
        assert!(tier.flush(Duration::from_secs(30)));
        close(tier);
    }
    let (tier, _rec) = started(config(root.path()));
    tier.set_verify_quiet(Duration::from_secs(5));
    let mut dst = vec![0u8; 100_000];
    tier.read_local("k0", 1, &mut dst).unwrap(); // a get: the device is busy
    tier.verify_found();
    // Gets keep coming, far more often than the quiet 5 s the check waits for (a loaded host
    // may leave gaps between them, far shorter than that).
    let busy_until = Instant::now() + Duration::from_millis(600);
    while Instant::now() < busy_until {
        tier.read_local("k1", 2, &mut dst).unwrap();
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(tier.stats().unverified, 8, "the check read nothing while gets did");
    assert!(eventually(|| tier.stats().unverified == 0), "once the gets stopped, the check ran");
    assert_eq!(tier.stats().corrupt_removed, 0);
}

/// An announcer that, when told of a file, reads it at its final name: the master must only
/// ever hear of a file that is there, whole.
struct CheckingAnnouncer {
    dir: PathBuf,
    /// Key, version and whether the file was there, whole, when announced.
    seen: Mutex<Vec<(String, u64, bool)>>,
}

impl Announcer for CheckingAnnouncer {
    fn announce(&self, added: &[DiskEntry], _removed: &[DiskEntry], _restore: bool) -> Result<Vec<bool>> {
        for e in added {
            let (sub, name) = format::file_name(&e.key, e.version);
            let path = self.dir.join(sub).join(name);
            let whole = FileReader::open(&path, &e.key, e.version, e.size)
                .and_then(|mut r| {
                    let mut got = vec![0u8; e.size as usize];
                    let mut off = 0;
                    while off < got.len() {
                        off += r.read_next(&mut got[off..])?;
                    }
                    Ok(got == value(e.size as usize, e.version))
                })
                .unwrap_or(false);
            self.seen.lock().push((e.key.clone(), e.version, whole));
        }
        Ok(vec![true; added.len()])
    }
}

#[test]
fn every_flush_setting_announces_only_whole_files_at_their_final_names() {
    for fsync in [Some(FsyncScope::FileSystem), Some(FsyncScope::File), None] {
        let root = tempfile::tempdir().unwrap();
        let c = DiskConfig { fsync, writers: 3, ..config(root.path()) };
        let tier = DiskTier::open(c.clone()).unwrap();
        let announcer = Arc::new(CheckingAnnouncer { dir: tier.dir().to_path_buf(), seen: Mutex::default() });
        tier.start(announcer.clone());
        // Enough files that commit rounds hold several, over 256 hash directories' worth of
        // keys, sizes with and without a partial last block.
        let n = 40u64;
        for v in 1..=n {
            let len = if v % 2 == 0 { 300_000 } else { 262_144 };
            tier.offload(&format!("key-{v}"), v, &value(len, v));
        }
        assert!(tier.flush(Duration::from_secs(60)), "{fsync:?}: the writes never finished");
        let seen = announcer.seen.lock().clone();
        assert_eq!(seen.len() as u64, n, "{fsync:?}: every file is announced once");
        for (key, version, whole) in &seen {
            assert!(whole, "{fsync:?}: {key} v{version} was announced before it was whole at its final name");
        }
        let s = tier.stats();
        assert_eq!((s.written, s.write_failures), (n, 0), "{fsync:?}: {s:?}");
        let leftovers: Vec<PathBuf> =
            files_under(tier.dir()).into_iter().filter(|p| p.to_string_lossy().ends_with(format::TMP_SUFFIX)).collect();
        assert!(leftovers.is_empty(), "{fsync:?}: temporary files left: {leftovers:?}");
        close(tier);
        // A restart finds them all, whole.
        let tier = DiskTier::open(c).unwrap();
        let s = tier.stats();
        assert_eq!((s.files, s.corrupt_removed), (n, 0), "{fsync:?}: {s:?}");
    }
}

#[test]
fn large_values_read_back_exactly_and_damage_in_any_piece_is_caught() {
    // 17 MiB and a bit: read in pieces whose checksums are taken beside the reads.
    let len = (17 << 20) + 12_345;
    let root = tempfile::tempdir().unwrap();
    let (tier, _rec) = started(DiskConfig { capacity: Some(256 << 20), ..config(root.path()) });
    for i in 0..4u64 {
        tier.offload(&format!("big{i}"), i + 1, &value(len, i));
    }
    assert!(tier.flush(Duration::from_secs(60)));
    // Into page-aligned memory (straight into it) and into memory that is not (through the
    // scratch buffer).
    let mut dst = vec![0u8; len + 1];
    tier.read_local("big0", 1, &mut dst[..len]).unwrap();
    assert!(dst[..len] == value(len, 0), "big0 read back different bytes");
    tier.read_local("big0", 1, &mut dst[1..]).unwrap();
    assert!(dst[1..] == value(len, 0), "big0 read back different bytes into unaligned memory");
    // A flipped byte in the first piece, a middle one, the last one.
    let data = format::data_offset("big1".len());
    for (i, at) in [(1u64, 100u64), (2, (9 << 20) + 7), (3, len as u64 - 1)] {
        let (sub, name) = format::file_name(&format!("big{i}"), i + 1);
        let p = tier.dir().join(sub).join(name);
        let mut b = std::fs::read(&p).unwrap();
        b[(data + at) as usize] ^= 0x01;
        std::fs::write(&p, b).unwrap();
        let e = tier.read_local(&format!("big{i}"), i + 1, &mut dst[..len]).unwrap_err();
        assert!(matches!(e, StoreError::CorruptFile(_)), "big{i}, byte {at}: {e}");
    }
}

#[test]
fn a_file_refused_by_a_master_that_may_never_have_known_its_put_is_kept_and_told_again_as_a_restore() {
    let root = tempfile::tempdir().unwrap();
    let (tier, rec) = started(config(root.path()));
    // The master answering knows neither put (it restarted): it refuses them when fresh.
    rec.refuse_fresh.lock().extend(["k".to_string(), "j".to_string()]);
    // k is prepared (before its put goes to the master), then the disk is mounted again, then
    // the put commits and its file is announced.
    let prepared = tier.prepare("k", &value(50_000, 1));
    tier.restore_all().unwrap();
    prepared.queue(5);
    assert!(tier.flush(Duration::from_secs(30)));
    let mut dst = vec![0u8; 50_000];
    tier.read_local("k", 5, &mut dst).unwrap();
    assert!(dst == value(50_000, 1), "the only copy of an acknowledged put stays");
    assert_eq!(*rec.restored.lock(), ["k"], "told again as a restore, which the master took");
    let s = tier.stats();
    assert_eq!((s.files, s.ambiguous_refusals, s.stale_refused, s.unannounced), (1, 1, 0, 0), "{s:?}");
    // With no remount (nor failed call) since its put, the same refusal comes from the master
    // the put was made under: the object was removed while the file was written.
    tier.prepare("j", &value(50_000, 2)).queue(6);
    assert!(tier.flush(Duration::from_secs(30)));
    assert!(tier.read_local("j", 6, &mut dst).is_err());
    let s = tier.stats();
    assert_eq!((s.files, s.ambiguous_refusals, s.stale_refused), (1, 1, 1), "{s:?}");
}
