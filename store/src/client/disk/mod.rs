//! The client's disk tier: with a storage root, every value this client puts is also written
//! to a file under `<root>/<cluster id>/`, asynchronously, by a bounded pool of writer
//! threads (each writes a file under a temporary name through its [`io`] engine) and one
//! committer (makes a round of written files durable under their final names, see
//! `commit`, then indexes them and announces them to the master in one call, see
//! `announce`); a get that finds no memory replica reads the file (here, or through the
//! owning client's [`service`]; a file being read is pinned against eviction); a restart
//! re-announces the files to the master, then reads them all once in the background and
//! removes those whose value fails its checksum (`verify`). The tier also keeps, for the
//! master, the removals pending at it (`TOMBSTONES`), handed back at every mount so they
//! outlive a master restart.
//!
//! One concern per module, each importing only those below it; this one wires them together
//! as [`DiskTier`]:
//!
//! * [`format`](mod@format): the file format and names (hash of the key; the key is inside the file).
//! * [`io`]: the writers' [`io::IoEngine`] (plain calls, or io_uring), chosen once at open.
//! * `offload`: what a put hands the tier ([`PreparedOffload`]) and the room it holds in the
//!   queue.
//! * `writer`: a writer thread's job: one file under a temporary name, new or written over.
//! * `file`: writing one file under a temporary name, and checked reading.
//! * `scan`: what an opening tier finds in its root (disk id, held removals, files).
//! * `commit`: commit rounds and the fsync policy ([`FsyncScope`]).
//! * `announce`: what the master must hear, and when, as a sans-IO state machine.
//! * `index`: key → file in LRU order (the `lru` crate), capacity in 4 KiB blocks, pins.
//! * `recycle`: removed files kept to be written over by later offloads.
//! * `verify`: the background check of the files found at start.
//! * `space`: whether the file system has room: a full disk is a state of the tier (offloads
//!   skipped, files still served, writes again once there is room), not a failure to start.
//! * `stats`: the tier's Prometheus registry, the one record of its counters ([`DiskStats`]).
//! * [`service`]: the tiny request/response service through which other clients read the
//!   files of this one with the transfer engine.
//! * [`hold`]: test support, holding commit rounds.
//!
//! Crash guarantees, whatever ends the process: a final name names a complete file (with
//! `fsync` on, also after a power loss); the master hears of no file before its rename is
//! durable; an interrupted write leaves at most a temporary file, removed at the next start; a
//! value that fails its checksum is never served; an acknowledged put's file is never deleted
//! on a refusal from a master that may not have known the put (`announce`).
//!
//! The parallelism comes from the threads: each job is one large sequential write (followed by
//! an `fdatasync` with [`FsyncScope::File`]), which blocks in the kernel anyway, and a few
//! writers keep the device busy (each write is megabytes). The pool is small and bounded, and
//! so is the queue in bytes.

mod announce;
mod commit;
pub(crate) mod file;
pub mod format;
pub mod hold;
mod index;
pub mod io;
mod offload;
mod recycle;
mod scan;
pub mod service;
mod space;
mod stats;
mod verify;
mod writer;

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use parking_lot::{Condvar, Mutex, RwLock};

use crate::error::{is_no_space, Result, StoreError};
use crate::proto::{DiskEntry, HeldRemoval};
use announce::{Announcements, Call, Verdict};
pub use commit::FsyncScope;
use commit::{Written, COMMIT_BATCH};
use file::FileReader;
use format::disk_len;
use index::{Entry, Index};
use io::EngineKind;
use offload::Job;
pub use offload::PreparedOffload;
use prometheus::IntCounter;
use recycle::{RetiredFiles, RETIRED_DIR};
use scan::{disk_id, load_held, scan, scan_retired, TOMBSTONES};
use space::{Probe, Space};
use stats::Counters;
pub use stats::DiskStats;

/// Share of the file system's free space taken by default.
pub const DEFAULT_CAPACITY_SHARE: f64 = 0.9;
/// Writer threads unless configured otherwise (`disk_writer_threads`).
pub const DEFAULT_WRITERS: usize = 4;
/// Bytes of values that may wait to be written unless configured otherwise
/// (`disk_queue_size`): 256 MiB.
pub const DEFAULT_QUEUE_BYTES: u64 = 256 << 20;
/// How long opening waits for the storage root's lock before calling it taken.
const LOCK_WAIT: Duration = Duration::from_secs(1);
/// Bytes of removed files kept to be written over (see `recycle`).
pub const DEFAULT_RECYCLE_BYTES: u64 = 1 << 30;
/// Most offloads waiting at once, whatever their size.
const MAX_QUEUED_JOBS: usize = 4096;
/// Bytes of written images kept for the next offloads (their pages are already faulted in).
const SPARE_IMAGE_BYTES: usize = 64 << 20;
/// Most removals remembered to doom the writes of their keys that were queued before them
/// ([`DiskTier::apply_owner_removal`]): far more than the offloads that can be in flight.
const MAX_DOOMED: std::num::NonZeroUsize = std::num::NonZeroUsize::new(65_536).expect("not zero");
/// Settings of the disk tier (see [`crate::ClientConfig`]).
#[derive(Debug, Clone)]
pub struct DiskConfig {
    /// The storage root; must exist and be writable.
    pub root: PathBuf,
    /// Files go to `<root>/<cluster id>/`.
    pub cluster_id: String,
    /// Bytes the tier may use; `None`: what its files take now plus 90 % of the free space.
    pub capacity: Option<u64>,
    /// Writer threads.
    pub writers: usize,
    /// Bytes of values waiting to be written; beyond it offloads are dropped and counted.
    pub queue_bytes: u64,
    /// How files are made durable before they are announced; `None`: not at all (see
    /// [`FsyncScope`] and `commit`).
    pub fsync: Option<FsyncScope>,
    /// Bytes of removed files kept to be written over by later offloads; 0: none.
    pub recycle_bytes: u64,
    /// Writers write and flush through io_uring where the kernel has it (see [`io`]).
    pub io_uring: bool,
}

/// Checks a cluster id for use as one path component.
pub fn check_cluster_id(id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && id != "."
        && id != ".."
        && id.bytes().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(StoreError::Config(format!("cluster id {id:?}: use 1-128 of [A-Za-z0-9._-], not . or ..")))
    }
}

fn inc(c: &IntCounter) {
    c.inc();
}

/// Tells the master about files (the store client implements it over gRPC).
pub trait Announcer: Send + Sync {
    /// `restore`: the files come from a restart (the master may recreate lost objects).
    /// Returns, per added entry, whether the master lists this disk as a holder.
    fn announce(&self, added: &[DiskEntry], removed: &[DiskEntry], restore: bool) -> Result<Vec<bool>>;
}

#[derive(Default)]
struct Pending {
    jobs: u64,
    bytes: u64,
}

/// One client's disk tier over one storage root: the index of its files, the writer pool
/// and the committer, the announcements to the master and the counters. It holds the root's
/// lock while open (a second tier on the same root and cluster fails to open).
pub struct DiskTier {
    dir: PathBuf,
    disk_id: String,
    config: DiskConfig,
    /// How the writers reach the kernel (chosen once, at open).
    engine: EngineKind,
    index: Mutex<Index>,
    counters: Counters,
    queue: Mutex<Option<Sender<Job>>>,
    pending: Mutex<Pending>,
    idle: Condvar,
    announcer: RwLock<Option<Arc<dyn Announcer>>>,
    /// Keys with an offload queued or being written, with how many: a removal of such a key
    /// is not acknowledged yet (its file may appear after the removal; see [`Self::apply_removals`]).
    in_flight: Mutex<std::collections::HashMap<String, u32>>,
    /// Removals heard on the disk's owner stream ([`Self::apply_owner_removal`]), newest
    /// [`MAX_DOOMED`] kept: key → the version at or below which a file of it, written after
    /// the removal, is deleted instead of kept and announced.
    doomed: Mutex<lru::LruCache<String, u64>>,
    /// Removals pending at the master (for any disk), kept here so that they outlive a master
    /// restart: also in `<dir>/TOMBSTONES`, handed back at every mount.
    held: Mutex<Vec<HeldRemoval>>,
    /// Memory of written images, reused by the next offloads (at most [`SPARE_IMAGE_BYTES`]).
    spare_images: Mutex<Vec<Vec<u8>>>,
    /// What the master must hear again, and when ([`announce`]).
    announcements: Mutex<Announcements>,
    /// The files found at start (key, version, value size), until [`Self::verify_found`]
    /// takes them, and how many of them are still to be checked.
    found: Mutex<Vec<verify::Found>>,
    unverified: Arc<AtomicU64>,
    /// Gets reading a file of the tier now, and when the last one ended, in microseconds
    /// since `opened` (the check of the files found at start waits for a quiet device, see
    /// [`VERIFY_QUIET`]).
    quiet: Arc<verify::Quiet>,
    last_full_warning: Mutex<Option<Instant>>,
    /// Whether the file system is full now ([`space`]).
    space: Space,
    /// The disk id could not be saved at open (the file system was full): it is saved before
    /// the first file is written.
    id_unsaved: AtomicBool,
    /// Holds the storage root's lock (released when the process ends, however it ends).
    _lock: File,
    /// Tests: runs in [`Self::open_reader`] between the look-up and the open.
    #[cfg(test)]
    before_open: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl std::fmt::Debug for DiskTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskTier").field("dir", &self.dir).field("disk_id", &self.disk_id).finish()
    }
}

fn config_err(root: &Path, what: impl std::fmt::Display) -> StoreError {
    StoreError::Config(format!("storage root {}: {what}", root.display()))
}

impl DiskTier {
    /// Checks the root, takes its lock, and indexes the valid files (removing incomplete and
    /// corrupt ones). Writers start with [`Self::start`], once the master knows the disk.
    pub fn open(mut config: DiskConfig) -> Result<Arc<DiskTier>> {
        let root = &config.root;
        check_cluster_id(&config.cluster_id)?;
        match std::fs::metadata(root) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(config_err(root, "not a directory")),
            Err(e) => return Err(config_err(root, format!("{e} (create it first)"))),
        }
        let dir = root.join(&config.cluster_id);
        std::fs::create_dir_all(&dir).map_err(|e| config_err(root, format!("cannot create {}: {e}", dir.display())))?;
        // A root that is merely full opens, full: its files are served, and offloads are
        // written again once there is room ([`space`]). One that refuses writes otherwise
        // (read-only, not ours) is a configuration to fix.
        let full = space::probe(&dir).map_err(|source| StoreError::StorageRoot {
            root: root.clone(),
            what: "not writable",
            source,
        })? == Probe::Full;
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join("LOCK"))
            .map_err(|e| config_err(root, format!("cannot open its lock file: {e}")))?;
        // A client that just closed may still be letting go (its writer threads drop their
        // last references a moment after the final flush): wait briefly before calling the
        // directory taken.
        let locked = || rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_ok();
        let deadline = Instant::now() + LOCK_WAIT;
        while !locked() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        if !locked() {
            return Err(config_err(
                root,
                format!("cluster directory {} is in use by another client process", dir.display()),
            ));
        }
        let (disk_id, id_saved) = disk_id(&dir).map_err(|e| config_err(root, format!("disk id: {e}")))?;
        if config.fsync == Some(FsyncScope::FileSystem) {
            // A sandbox may refuse `syncfs` (or a file system not support it): flushing each
            // file instead keeps the files as safe.
            if let Err(e) = file::sync_file_system(&dir) {
                tracing::warn!("disk tier: {e}; flushing each file instead (disk_fsync_scope file)");
                config.fsync = Some(FsyncScope::File);
            }
        }
        let counters = Counters::new()?;
        let files = scan(&dir, &counters);
        let retired_dir = dir.join(RETIRED_DIR);
        match std::fs::create_dir_all(&retired_dir) {
            // No room for it: removed files are deleted rather than kept (a rename into it fails).
            Err(e) if is_no_space(&e) => {}
            r => r.map_err(|e| config_err(root, format!("cannot create {}: {e}", retired_dir.display())))?,
        }
        let retired = scan_retired(&retired_dir);
        let existing: u64 =
            files.iter().map(|(_, e, _)| e.disk_len).sum::<u64>() + retired.iter().map(|(_, _, len)| len).sum::<u64>();
        let capacity = match config.capacity {
            Some(c) => c,
            None => {
                let st = rustix::fs::statvfs(&dir).map_err(|e| config_err(root, format!("statvfs: {e}")))?;
                // Never 0 (the master refuses a disk of no capacity): on a full root with no
                // files of ours, one block, taken anew once there is room ([`Self::room_again`]).
                let share = (st.f_bavail as f64 * st.f_frsize as f64 * DEFAULT_CAPACITY_SHARE) as u64;
                (existing + share).max(format::ALIGN)
            }
        };
        let mut index = Index::new(capacity, RetiredFiles::new(retired_dir, config.recycle_bytes));
        let found: Vec<verify::Found> = files
            .iter()
            .map(|(k, e, _)| verify::Found { key: k.clone(), version: e.version, size: e.value_len })
            .collect();
        for (key, entry, _) in files {
            index.insert(&key, entry);
        }
        // Over capacity (a smaller limit than last time): least recently modified files go.
        if let Ok(room) = index.reserve(0) {
            for (_, e) in &room.evicted {
                let _ = std::fs::remove_file(&e.path);
                inc(&counters.evicted);
            }
        }
        for (path, number, len) in retired {
            if !index.adopt_retired(number, len) {
                let _ = std::fs::remove_file(&path);
            }
        }
        let c = &counters;
        if full {
            tracing::warn!(
                "disk tier {}: the file system is full; serving the {} file(s) there, skipping new offloads \
                 until it has room again",
                dir.display(),
                index.len()
            );
        }
        tracing::info!(
            "disk tier {} (disk {disk_id}): {} file(s), {} of {} bytes, {} retired file(s) to reuse; \
             removed {} corrupt, {} incomplete, {} stale",
            dir.display(),
            index.len(),
            index.used(),
            capacity,
            index.retired_files(),
            c.corrupt_removed.get(),
            c.incomplete_removed.get(),
            c.stale_removed.get()
        );
        Ok(Arc::new(DiskTier {
            held: Mutex::new(load_held(&dir)),
            dir,
            disk_id,
            engine: EngineKind::choose(config.io_uring),
            config,
            index: Mutex::new(index),
            counters,
            queue: Mutex::new(None),
            pending: Mutex::new(Pending::default()),
            idle: Condvar::new(),
            announcer: RwLock::new(None),
            in_flight: Mutex::new(Default::default()),
            doomed: Mutex::new(lru::LruCache::new(MAX_DOOMED)),
            spare_images: Mutex::new(Vec::new()),
            announcements: Mutex::new(Announcements::default()),
            unverified: Arc::new(AtomicU64::new(found.len() as u64)),
            found: Mutex::new(found),
            quiet: Arc::default(),
            last_full_warning: Mutex::new(None),
            space: Space::new(full),
            id_unsaved: AtomicBool::new(!id_saved),
            _lock: lock,
            #[cfg(test)]
            before_open: Mutex::new(None),
        }))
    }

    /// Stable id of this storage root (and cluster), kept in a file beside the data.
    pub fn disk_id(&self) -> &str {
        &self.disk_id
    }

    /// The tier's directory, `<root>/<cluster id>`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Bytes the tier may use on disk (configured, or taken from the free space at open).
    pub fn capacity(&self) -> u64 {
        self.index.lock().capacity()
    }

    /// Sets who hears about files, and starts the writers and the committer (once).
    pub fn start(self: &Arc<Self>, announcer: Arc<dyn Announcer>) {
        *self.announcer.write() = Some(announcer);
        let mut queue = self.queue.lock();
        if queue.is_some() {
            return;
        }
        let (tx, rx) = crossbeam_channel::bounded::<Job>(MAX_QUEUED_JOBS);
        // Unbounded: at most one file per queued job is ever in it.
        let (written_tx, written_rx) = crossbeam_channel::unbounded::<Written>();
        for i in 0..self.config.writers.max(1) {
            let rx: Receiver<Job> = rx.clone();
            let written_tx = written_tx.clone();
            let weak: Weak<DiskTier> = Arc::downgrade(self);
            let engine_kind = self.engine;
            std::thread::Builder::new()
                .name(format!("crescent-disk-writer-{i}"))
                .spawn(move || {
                    let mut engine = engine_kind.engine();
                    for job in rx {
                        match weak.upgrade() {
                            Some(tier) => tier.write_job(job, &written_tx, engine.as_mut()),
                            None => return,
                        }
                    }
                })
                .expect("spawning a disk writer");
        }
        let weak: Weak<DiskTier> = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("crescent-disk-commit".into())
            .spawn(move || loop {
                let Some(wait) = weak.upgrade().map(|t| t.retry_wait()) else { return };
                match written_rx.recv_timeout(wait) {
                    Ok(first) => {
                        let mut batch = vec![first];
                        batch.extend(written_rx.try_iter().take(COMMIT_BATCH - 1));
                        match weak.upgrade() {
                            Some(tier) => {
                                hold::wait_if_held(&tier.dir);
                                tier.commit(batch)
                            }
                            None => return,
                        }
                    }
                    Err(RecvTimeoutError::Timeout) => match weak.upgrade() {
                        Some(tier) => tier.retry_announcements(false),
                        None => return,
                    },
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            })
            .expect("spawning the disk committer");
        *queue = Some(tx);
    }

    /// Re-announces every file (after a restart or a remount); files the master refuses go.
    /// When a call fails, the files not announced yet are told again later (like any failed
    /// announcement) and the error returned.
    pub fn restore_all(&self) -> Result<()> {
        let Some(announcer) = self.announcer.read().clone() else { return Ok(()) };
        let entries: Vec<DiskEntry> = self
            .index
            .lock()
            .entries()
            .into_iter()
            .map(|(key, e)| DiskEntry { key, size: e.value_len, version: e.version })
            .collect();
        let total = entries.len();
        let calls = self.announcements.lock().remounted(entries);
        let accepted = self.send(announcer.as_ref(), calls)?;
        tracing::info!("disk tier: announced {accepted} of {total} file(s) to the master");
        Ok(())
    }

    /// Waits until every queued offload is written and announced, or kept to be announced
    /// again when the call failed (see [`DiskStats::unannounced`]), or until `timeout` passes.
    pub fn flush(&self, timeout: Duration) -> bool {
        let end = Instant::now() + timeout;
        let mut p = self.pending.lock();
        while p.jobs > 0 {
            if self.idle.wait_until(&mut p, end).timed_out() {
                return p.jobs == 0;
            }
        }
        true
    }

    /// Stops the writers after the queue drains.
    pub fn shutdown(&self) {
        self.queue.lock().take();
    }

    /// Tells the master about files written (`added`, each with the generation it was
    /// prepared under) and gone (`removed`); false when the call failed: then they are kept
    /// and told again ([`Self::retry_announcements`]). Refused files go, unless the refusal
    /// may come from a master that never knew their put (see [`announce`]).
    fn announce(&self, added: Vec<(DiskEntry, u64)>, removed: Vec<DiskEntry>) -> bool {
        let Some(announcer) = self.announcer.read().clone() else { return false };
        let call = self.announcements.lock().fresh(added, removed);
        self.send(announcer.as_ref(), vec![call]).is_ok()
    }

    /// The driver of [`announce::Announcements`]: makes `calls` in order and hands each answer
    /// to the state, acting on its verdicts; after a failure, the calls not made are kept with
    /// the failed one. Returns how many added files the master accepted.
    fn send(&self, announcer: &dyn Announcer, calls: Vec<Call>) -> Result<usize> {
        let mut accepted = 0;
        let mut calls = calls.into_iter();
        while let Some(call) = calls.next() {
            let answer = match announcer.announce(&call.added, &call.removed, call.restore) {
                Ok(answer) => answer,
                Err(e) => {
                    inc(&self.counters.announce_failures);
                    let (files, removals) = (call.added.len(), call.removed.len());
                    let b =
                        self.announcements.lock().failed(std::iter::once(call).chain(calls).collect(), Instant::now());
                    tracing::warn!(
                        "disk tier: telling the master about {files} file(s) and {removals} removal(s) failed: {e}; \
                         {} waiting, told again in {:?}{}",
                        b.waiting,
                        b.wait,
                        if b.forgotten > 0 {
                            format!(" ({} oldest removal(s) forgotten)", b.forgotten)
                        } else {
                            String::new()
                        }
                    );
                    return Err(e);
                }
            };
            let verdicts = self.announcements.lock().answered(&call, &answer);
            for (e, verdict) in call.added.iter().zip(verdicts) {
                match verdict {
                    Verdict::Accepted => accepted += 1,
                    // Removed or put again while we wrote: the file is stale.
                    Verdict::Stale => {
                        self.drop_file(&e.key, e.version, true);
                        inc(&self.counters.stale_refused);
                    }
                    Verdict::Kept => {
                        inc(&self.counters.ambiguous_refusals);
                        tracing::info!(
                            "disk tier: the master refused {:?} v{}, put before it may have restarted: \
                             keeping the file, telling it again as a restore",
                            e.key,
                            e.version
                        );
                    }
                }
            }
        }
        Ok(accepted)
    }

    /// How long the committer may wait for files before retries are due.
    fn retry_wait(&self) -> Duration {
        self.announcements.lock().wait(Instant::now())
    }

    /// Tells the master again what failed calls did not (with `force`, now; otherwise once the
    /// backoff has passed): the files still indexed at the version that was to be announced,
    /// and the removals of files not written anew since. The committer calls it when a retry is
    /// due and after each commit whose own call went through. The call says `restore`: the
    /// master may have lost the objects meanwhile (restarted); a removal made meanwhile still
    /// refuses its file, being kept at the master until this disk acknowledges it.
    pub fn retry_announcements(&self, force: bool) {
        let Some(announcer) = self.announcer.read().clone() else { return };
        let calls = {
            let ix = self.index.lock();
            self.announcements.lock().take_retry(
                Instant::now(),
                force,
                |key, version| ix.get(key).filter(|e| e.version == version).map(|e| e.value_len),
                |r| ix.get(&r.key).is_none_or(|e| e.version != r.version),
            )
        };
        if calls.is_empty() {
            return;
        }
        let files: usize = calls.iter().map(|c| c.added.len()).sum();
        let removals: usize = calls.iter().map(|c| c.removed.len()).sum();
        if self.send(announcer.as_ref(), calls).is_ok() {
            tracing::info!(
                "disk tier: told the master about {files} file(s) and {removals} removal(s) that earlier calls missed"
            );
        }
    }

    /// The committer's part, for a round of written files ([`commit::commit_round`] makes
    /// them durable under their final names): index them, and tell the master about all of
    /// them in one call. No file is announced before its rename is durable.
    fn commit(&self, batch: Vec<Written>) {
        let round = commit::commit_round(&self.dir, self.config.fsync, batch);
        for g in round.given_up {
            self.not_committed(&g.key, g.value_len, g.file_len);
        }
        let mut added = Vec::with_capacity(round.committed.len());
        let mut removed = Vec::new();
        for c in &round.committed {
            let replaced = {
                let mut ix = self.index.lock();
                ix.release(disk_len(c.file_len));
                if self.is_doomed(&c.key, c.version) {
                    // Removed while it was written: never indexed, never announced.
                    drop(ix);
                    let _ = std::fs::remove_file(&c.path);
                    continue;
                }
                let old = ix.insert(&c.key, Entry::new(c.version, c.value_len, disk_len(c.file_len), c.path.clone()));
                // The same name (key and version) is the file just renamed over it: nothing went.
                let old = old.filter(|old| old.path != c.path);
                if let Some(old) = &old {
                    retire_or_delete(&mut ix, old);
                }
                old
            };
            inc(&self.counters.written);
            self.counters.bytes_written.inc_by(c.file_len);
            if let Some(old) = replaced {
                removed.push(DiskEntry { key: c.key.clone(), size: old.value_len, version: old.version });
            }
            added.push((DiskEntry { key: c.key.clone(), size: c.value_len, version: c.version }, c.generation));
        }
        if self.announce(added, removed) {
            // The master answers again: what earlier calls missed goes now.
            self.retry_announcements(true);
        }
        for c in round.committed {
            self.job_done(&c.key, c.value_len);
        }
    }

    /// A written file the committer gave up (its file is gone or going): its room goes back,
    /// counted as a failed write.
    fn not_committed(&self, key: &str, value_len: u64, file_len: u64) {
        self.index.lock().release(disk_len(file_len));
        inc(&self.counters.write_failures);
        self.job_done(key, value_len);
    }

    /// Drops the file of `key` if it holds `version` or older (kept for reuse when `reuse`
    /// and there is room, deleted otherwise); returns whether one went.
    fn drop_file(&self, key: &str, version: u64, reuse: bool) -> bool {
        let mut ix = self.index.lock();
        let gone = match ix.get(key) {
            Some(e) if e.version <= version => ix.remove(key),
            _ => None,
        };
        match gone {
            Some(e) if reuse => {
                retire_or_delete(&mut ix, &e);
                true
            }
            Some(e) => {
                drop(ix);
                let _ = std::fs::remove_file(&e.path);
                true
            }
            None => false,
        }
    }

    /// Removals handed out by the master: deletes the files, then acknowledges them. A key
    /// whose offload is still queued or being written is not acknowledged: its file may be
    /// renamed into place after this call, and the master keeps the removal queued until a
    /// later call finds no write in flight (the file's announcement is refused meanwhile, and
    /// after a crash the queued removal refuses its re-announcement).
    pub fn apply_removals(&self, removals: &[DiskEntry]) {
        if removals.is_empty() {
            return;
        }
        for r in removals {
            if self.drop_file(&r.key, r.version, true) {
                inc(&self.counters.removed);
            }
        }
        let acked: Vec<DiskEntry> = {
            let in_flight = self.in_flight.lock();
            removals.iter().filter(|r| !in_flight.contains_key(&r.key)).cloned().collect()
        };
        if !acked.is_empty() {
            self.announce(Vec::new(), acked);
        }
    }

    /// A removal heard on the disk's owner stream (the client's `disk_news`), acknowledged once this
    /// returns: the file of `key`, if it holds `version` or older, is deleted (or retired), and
    /// a write of it queued before the removal (in flight, or prepared with its put and not yet
    /// queued) deletes its file instead of keeping and announcing it — so that no copy of the
    /// removed object can come back at a new master, whatever happens to this one. (The same
    /// removal still comes on pings, until its deletion is announced: [`Self::apply_removals`].)
    pub fn apply_owner_removal(&self, key: &str, version: u64) {
        // Under the index's lock: a write of `key` commits either before (its file is in the
        // index, and goes here) or after (and finds the key doomed: `commit`).
        let mut ix = self.index.lock();
        {
            let mut doomed = self.doomed.lock();
            let at = doomed.get(key).map_or(version, |v| (*v).max(version));
            doomed.put(key.to_string(), at);
        }
        let gone = match ix.get(key) {
            Some(e) if e.version <= version => ix.remove(key),
            _ => None,
        };
        if let Some(e) = gone {
            retire_or_delete(&mut ix, &e);
            inc(&self.counters.removed);
        }
    }

    /// Whether a file of `key` at `version` is of an object removed since ([`Self::apply_owner_removal`]).
    fn is_doomed(&self, key: &str, version: u64) -> bool {
        self.doomed.lock().peek(key).is_some_and(|v| version <= *v)
    }

    /// The removals this tier keeps for the master (handed back at every mount).
    pub fn held_removals(&self) -> Vec<HeldRemoval> {
        self.held.lock().clone()
    }

    /// Keeps `set` (replacing the previous set) for the master, durably: written to a
    /// temporary file, flushed, renamed over `TOMBSTONES`, directory flushed.
    pub fn keep_held_removals(&self, set: Vec<HeldRemoval>) {
        let mut held = self.held.lock();
        let path = self.dir.join(TOMBSTONES);
        let saved = if set.is_empty() {
            match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            }
        } else {
            let rows: Vec<(&str, &str, u64)> =
                set.iter().map(|h| (h.disk.as_str(), h.key.as_str(), h.version)).collect();
            let tmp = self.dir.join(format!("{TOMBSTONES}.tmp"));
            serde_json::to_vec(&rows).map_err(std::io::Error::other).and_then(|bytes| {
                std::fs::write(&tmp, bytes)?;
                File::open(&tmp)?.sync_data()?;
                std::fs::rename(&tmp, &path)?;
                File::open(&self.dir)?.sync_all()
            })
        };
        if let Err(e) = saved {
            tracing::warn!("disk tier: keeping {} removal(s) for the master in {}: {e}", set.len(), path.display());
        }
        *held = set;
    }

    /// The file of `key` (version, value size) when the object had no replica in memory the last
    /// time this client looked: a get reads it while the master answers
    /// ([`Self::early_read_judged`] then says whether the answer confirmed it).
    pub fn only_copy(&self, key: &str) -> Option<(u64, u64)> {
        self.index.lock().get(key).filter(|e| e.only_copy).map(|e| (e.version, e.value_len))
    }

    /// What a get saw of (`key`, `version`): whether this file was the only copy it could read.
    pub fn note_only_copy(&self, key: &str, version: u64, only: bool) {
        self.index.lock().set_only_copy(key, version, only);
        if only {
            inc(&self.counters.only_copy_marks);
        }
    }

    /// Counts an early read; a wasted one stops further early reads of its file.
    pub fn early_read_judged(&self, key: &str, version: u64, confirmed: bool) {
        inc(&self.counters.early_reads);
        if !confirmed {
            inc(&self.counters.early_reads_wasted);
            self.note_only_copy(key, version, false);
        }
    }

    /// The version of `key` on this disk, if any.
    pub fn version_of(&self, key: &str) -> Option<u64> {
        self.index.lock().get(key).map(|e| e.version)
    }

    /// Opens the file of (`key`, `version`) for reading (marks it used, and pins it against
    /// eviction until the reader is dropped). A file that went (evicted, removed) before it
    /// was opened — also between the look-up and the open — is [`StoreError::NotFound`], not
    /// a fault; once open, the reader keeps reading the same file (an open descriptor) even
    /// if a removal unlinks its name.
    pub fn open_reader(self: &Arc<Self>, key: &str, version: u64, size: u64) -> Result<TierReader> {
        let busy = self.quiet.busy();
        self.open_pinned(key, version, size, true)
            .map(|reader| TierReader { _busy: Some(busy), ..reader })
            .inspect_err(|e| self.on_read_error(key, version, e))
    }

    /// [`Self::open_reader`] (`touch`: the read counts as a use, in the LRU order), leaving a
    /// damaged or missing file to the caller.
    fn open_pinned(self: &Arc<Self>, key: &str, version: u64, size: u64, touch: bool) -> Result<TierReader> {
        let path = {
            let mut ix = self.index.lock();
            let path = match ix.get(key) {
                Some(e) if e.version == version => e.path.clone(),
                _ => return Err(StoreError::NotFound(key.to_string())),
            };
            if touch {
                ix.touch(key);
            }
            ix.pin(key, version);
            path
        };
        let pin = Pin { tier: Arc::downgrade(self), key: key.to_string(), version };
        #[cfg(test)]
        if let Some(hook) = self.before_open.lock().take() {
            hook();
        }
        match FileReader::open(&path, key, version, size) {
            Ok(reader) => Ok(TierReader { reader, _pin: pin, _busy: None }),
            Err(e) => {
                drop(pin);
                Err(match e {
                    // A removal takes the file out of the index before it unlinks it: a file
                    // still indexed under that name went behind the tier's back (a fault).
                    StoreError::NotFound(_) if !self.indexed_at(key, version, &path) => e,
                    StoreError::NotFound(_) => StoreError::Disk(format!("{} is missing", path.display())),
                    e => e,
                })
            }
        }
    }

    /// Whether the index still has (`key`, `version`) at `path`.
    fn indexed_at(&self, key: &str, version: u64, path: &Path) -> bool {
        self.index.lock().get(key).is_some_and(|e| e.version == version && e.path == path)
    }

    /// A read found the file damaged (or gone): it is dropped and the master told.
    pub fn on_read_error(&self, key: &str, version: u64, e: &StoreError) {
        self.drop_damaged(key, version, e, &self.counters.corrupt_reads);
    }

    /// Drops a file that a read found damaged (`e`, when it says so), counted in `counter`,
    /// and tells the master.
    fn drop_damaged(&self, key: &str, version: u64, e: &StoreError, counter: &IntCounter) {
        if matches!(e, StoreError::CorruptFile(_) | StoreError::Disk(_) | StoreError::DiskIo { .. }) {
            tracing::warn!("disk tier: {e}; dropping the file");
            inc(counter);
            // Not reused: the device may be what corrupted it.
            if self.drop_file(key, version, false) {
                self.announce(Vec::new(), vec![DiskEntry { key: key.to_string(), size: 0, version }]);
            }
        }
    }

    /// Reads every file found at start once, in the background, and drops those whose value
    /// fails its checksum: removed, counted as `corrupt_removed`, the master told (see
    /// `verify`). Called once the files are announced (a later call does nothing).
    pub fn verify_found(self: &Arc<Self>) {
        let found = std::mem::take(&mut *self.found.lock());
        let weak = Arc::downgrade(self);
        verify::spawn(found, self.unverified.clone(), move |f, buf| Some(weak.upgrade()?.verify_one(f, buf)));
    }

    /// Reads the value of a file found at start through `buf`, checking it, in the quiet; a
    /// damaged file goes (returns true).
    fn verify_one(self: &Arc<Self>, f: &verify::Found, buf: &mut [u8]) -> bool {
        self.quiet.wait();
        let read = self.open_pinned(&f.key, f.version, f.size, false).and_then(|mut reader| {
            while reader.remaining() > 0 {
                self.quiet.wait();
                reader.read_next(buf)?;
            }
            Ok(())
        });
        match read {
            // Gone meanwhile (evicted, removed, written anew): nothing to check.
            Ok(()) | Err(StoreError::NotFound(_)) => false,
            Err(e) => {
                self.drop_damaged(&f.key, f.version, &e, &self.counters.corrupt_removed);
                matches!(e, StoreError::CorruptFile(_) | StoreError::Disk(_) | StoreError::DiskIo { .. })
            }
        }
    }

    /// Tests: how long the check of the files found at start waits for quiet.
    #[cfg(test)]
    pub fn set_verify_quiet(&self, quiet: Duration) {
        self.quiet.set_quiet(quiet);
    }

    /// Reads the value of (`key`, `version`) into `dst` (exactly its size), checking it.
    pub fn read_local(self: &Arc<Self>, key: &str, version: u64, dst: &mut [u8]) -> Result<()> {
        let mut reader = self.open_reader(key, version, dst.len() as u64)?;
        let mut off = 0;
        while off < dst.len() {
            match reader.read_next(&mut dst[off..]) {
                Ok(n) => off += n,
                Err(e) => {
                    self.on_read_error(key, version, &e);
                    return Err(e);
                }
            }
        }
        inc(&self.counters.local_reads);
        Ok(())
    }

    pub(crate) fn count_served(&self) {
        inc(&self.counters.served_reads);
    }

    /// Its counters and sizes now.
    pub fn stats(&self) -> DiskStats {
        self.counters.snapshot(self.sizes())
    }

    /// The tier's metrics, for the client's `/metrics` (see `stats`).
    pub fn metric_families(&self) -> Vec<prometheus::proto::MetricFamily> {
        self.counters.gather(self.sizes())
    }

    fn sizes(&self) -> stats::Sizes {
        let (files, used_bytes, capacity, retired_files, retired_bytes) = {
            let ix = self.index.lock();
            (ix.len() as u64, ix.used(), ix.capacity(), ix.retired_files() as u64, ix.retired_bytes())
        };
        stats::Sizes {
            files,
            used_bytes,
            capacity,
            retired_files,
            retired_bytes,
            unannounced: self.announcements.lock().len() as u64,
            unverified: self.unverified.load(Ordering::Relaxed),
            full: self.space.is_full(),
        }
    }
}

/// A read of one file: pinned against the tier's eviction while it lasts.
pub struct TierReader {
    reader: FileReader,
    _pin: Pin,
    /// A get's reader (not the check's): the device is busy while it lasts.
    _busy: Option<verify::ReadBusy>,
}

impl std::ops::Deref for TierReader {
    type Target = FileReader;
    fn deref(&self) -> &FileReader {
        &self.reader
    }
}

impl std::ops::DerefMut for TierReader {
    fn deref_mut(&mut self) -> &mut FileReader {
        &mut self.reader
    }
}

struct Pin {
    tier: Weak<DiskTier>,
    key: String,
    version: u64,
}

impl Drop for Pin {
    fn drop(&mut self) {
        if let Some(tier) = self.tier.upgrade() {
            tier.index.lock().unpin(&self.key, self.version);
        }
    }
}

/// A file that just left the index: renamed into the retired files when nobody is reading
/// it and the pool has room (the rename happens under the index's lock, so no write can take
/// the name before the file is there), deleted otherwise.
fn retire_or_delete(ix: &mut Index, e: &Entry) {
    if !e.is_pinned() {
        if let Some(to) = ix.retire(e.disk_len) {
            match std::fs::rename(&e.path, &to) {
                Ok(()) => return,
                Err(err) => {
                    tracing::debug!("disk tier: keeping {} for reuse: {err}", e.path.display());
                    ix.forget_retired(&to);
                }
            }
        }
    }
    let _ = std::fs::remove_file(&e.path);
}

#[cfg(test)]
mod tests;
