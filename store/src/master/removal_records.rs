//! Removals that must outlive the master which answered them (HA on etcd).
//!
//! A removal is invisible at once, and is answered once the owners of its memory replicas and
//! of the disks with a copy acknowledged it on their owner streams ([`super::owners`]; a client
//! keeps one stream per memory segment and one for its disk). Two kinds of copies can still
//! hold the object when the answer goes out:
//!
//! * a copy whose owner did not acknowledge within `owner_ack_timeout` (the owner is cut off,
//!   frozen, or slow);
//! * a disk copy on a client that keeps no owner stream for its disk (an older client): it
//!   learns its removals on its client's next ping (the master's `disk` module), and a removal
//!   made just before the leader dies never reaches it.
//!
//! A new leader rebuilds from what the owners report and what the disks announce
//! ([`super::rebuild`]); such a copy would bring the removed object back, and a reader would
//! get a value its writer was told was gone. So, with HA, such a removal is *recorded* before
//! it is answered: one key per removed object under `/crescent/<cluster>/master/removed/`,
//! valued with the version the removal marks (a copy older than that is gone), written in one
//! transaction that holds only while this master's leadership key is still the one it won —
//! a deposed leader's record is refused, and its removal is answered `NOT_LEADER` (the client
//! removes the key again at the new leader). A new leader reads every record before it takes
//! its first call and buries them in its rebuild window. Records expire after [`record_ttl`]
//! (three client TTLs, at least a minute; an etcd lease shared by the records of ten seconds):
//! past any rebuild window, and long enough for the copies to have heard of their removal
//! since (an owner's acknowledgement, a disk's ping, or the client copies of disk removals
//! handed back to a new master). Each record is an etcd write: etcd keeps their history until
//! it is compacted, so run it with auto-compaction (docs: HA).
//!
//! A single master with a state directory (`--state-dir`) appends the same records to
//! `<dir>/removed-keys.jsonl` and flushes it before answering; it reads the file when it
//! starts (dropping expired records and rewriting the rest) and buries them in its rebuild
//! window, as a new leader does. A single master without one records nothing: a removal
//! answered without every copy's acknowledgement can come back after its restart.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};

use crate::error::{Result, StoreError};
use crate::leader::{leader_key, Members};

/// How long a record lives, given the client TTL: longer than a copy that has not heard of its
/// removal can stay silent and still report (its client TTL, at the old master or in a new
/// master's rebuild window), with room for a failover between.
pub fn record_ttl(client_ttl: Duration) -> Duration {
    (3 * client_ttl).max(Duration::from_secs(60))
}
/// How long one etcd lease takes new records (each record lives up to this longer).
const LEASE_SHARED_FOR: Duration = Duration::from_secs(10);
/// Records written per transaction (etcd refuses more than 128 operations by default).
const PER_TXN: usize = 100;
/// Most records a new leader reads; more are a sign of a fault, and the rest are logged.
pub const MAX_LOADED: usize = 1 << 20;

/// A removed object's key and the version its removal marks: copies older than that are gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tombstone {
    /// The key, as the master names it (tenant scope included).
    pub key: String,
    /// Copies of a version below this are gone.
    pub mark: u64,
}

/// What a removal left behind: the copies it could not yet be sure of.
#[derive(Debug, Clone)]
pub struct Removed {
    /// The key, as the master names it.
    pub key: String,
    /// Copies of a version below this are gone.
    pub mark: u64,
    /// The segments told of it on their owner streams: the memory segments its replicas
    /// were in, and the disks with a copy whose clients keep a stream for them.
    pub segments: Vec<u64>,
    /// Whether a disk without an owner stream held (or may be writing) a copy: it hears of
    /// the removal on its client's next ping only.
    pub disk_unlinked: bool,
}

impl Removed {
    /// Whether a copy may still hold the object, given the segments whose owners have not
    /// acknowledged.
    pub fn unsettled(&self, unacked: &[u64]) -> bool {
        self.disk_unlinked || self.segments.iter().any(|s| unacked.contains(s))
    }
}

/// Where a master records its unsettled removals.
pub enum RemovalRecords {
    /// HA: the cluster's etcd.
    Etcd(EtcdRecords),
    /// A single master's state directory.
    File(FileRecords),
}

impl RemovalRecords {
    /// Writes `records` before their removals are answered (`term`: the leadership they
    /// were made under, for etcd).
    pub async fn record(&self, term: u64, records: &[Tombstone]) -> Result<()> {
        if records.is_empty() {
            return Ok(());
        }
        match self {
            RemovalRecords::Etcd(e) => e.record(term, records).await,
            RemovalRecords::File(f) => f.record(records).await,
        }
    }

    /// The records a master about to lead inherits (etcd's; a file's are read once, when
    /// the single master starts: [`FileRecords::open`]).
    pub async fn load(&self) -> Result<Vec<Tombstone>> {
        match self {
            RemovalRecords::Etcd(e) => e.load().await,
            RemovalRecords::File(_) => Ok(Vec::new()),
        }
    }
}

/// The records of one cluster in etcd.
pub struct EtcdRecords {
    /// Connected on first use.
    etcd: tokio::sync::Mutex<Option<Members>>,
    endpoints: Vec<String>,
    prefix: String,
    leader_key: String,
    /// The lease new records share, and when it was granted.
    lease: parking_lot::Mutex<Option<(i64, Instant)>>,
    /// How long a record lives.
    ttl: Duration,
}

impl EtcdRecords {
    /// Records of cluster `cluster_id` in the etcd at `endpoints`, living `ttl` (nothing is
    /// asked yet).
    pub fn new(endpoints: &[String], cluster_id: &str, ttl: Duration) -> EtcdRecords {
        EtcdRecords {
            etcd: tokio::sync::Mutex::new(None),
            endpoints: endpoints.to_vec(),
            prefix: format!("/crescent/{cluster_id}/master/removed/"),
            leader_key: leader_key(cluster_id),
            lease: parking_lot::Mutex::new(None),
            ttl,
        }
    }

    /// The etcd client, connected on first use.
    async fn etcd(&self) -> Result<tokio::sync::MappedMutexGuard<'_, Members>> {
        let mut guard = self.etcd.lock().await;
        if guard.is_none() {
            *guard = Some(Members::connect(&self.endpoints).await?);
        }
        Ok(tokio::sync::MutexGuard::map(guard, |m| m.as_mut().expect("connected above")))
    }

    /// Writes `records` while this master still holds the leadership of `term` (the create
    /// revision of the leader key); refused with [`StoreError::NotLeader`] otherwise.
    pub async fn record(&self, term: u64, records: &[Tombstone]) -> Result<()> {
        let mut etcd = self.etcd().await?;
        for chunk in records.chunks(PER_TXN) {
            // A second try with a fresh lease: the shared one may have expired in etcd.
            let mut tries = 0;
            loop {
                tries += 1;
                match self.record_chunk(&mut etcd, term, chunk).await {
                    Ok(true) => break,
                    Ok(false) => {
                        return Err(StoreError::NotLeader(format!(
                            "term {term} ended before the removal of {:?} was recorded; remove it again",
                            chunk[0].key
                        )))
                    }
                    Err(e) => {
                        *self.lease.lock() = None;
                        if tries == 2 {
                            return Err(StoreError::NotLeader(format!(
                                "the removal of {:?} could not be recorded in etcd ({e}); remove it again",
                                chunk[0].key
                            )));
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// One transaction: whether the leadership still held.
    async fn record_chunk(&self, etcd: &mut Members, term: u64, chunk: &[Tombstone]) -> Result<bool> {
        let lease = self.lease(etcd).await?;
        let ops: Vec<TxnOp> = chunk
            .iter()
            .map(|t| {
                let key = format!("{}{}", self.prefix, t.key);
                TxnOp::put(key, t.mark.to_string(), Some(PutOptions::new().with_lease(lease)))
            })
            .collect();
        let leader = self.leader_key.clone();
        let resp = etcd
            .run(|mut c| {
                let txn = Txn::new()
                    .when([Compare::create_revision(leader.clone(), CompareOp::Equal, term as i64)])
                    .and_then(ops.clone());
                async move { c.txn(txn).await }
            })
            .await?;
        Ok(resp.succeeded())
    }

    /// The lease new records take: the shared one, or a fresh one once it is a minute old.
    async fn lease(&self, etcd: &mut Members) -> Result<i64> {
        if let Some((id, granted)) = *self.lease.lock() {
            if granted.elapsed() < LEASE_SHARED_FOR {
                return Ok(id);
            }
        }
        let ttl = (self.ttl + LEASE_SHARED_FOR).as_secs() as i64;
        let id = etcd.run(|mut c| async move { c.lease_grant(ttl, None).await }).await?.id();
        *self.lease.lock() = Some((id, Instant::now()));
        Ok(id)
    }

    /// Every record (at most [`MAX_LOADED`]), for a master about to lead.
    pub async fn load(&self) -> Result<Vec<Tombstone>> {
        let prefix = self.prefix.clone();
        let resp = self
            .etcd()
            .await?
            .run(|mut c| {
                let prefix = prefix.clone();
                async move { c.get(prefix, Some(GetOptions::new().with_prefix().with_limit(MAX_LOADED as i64))).await }
            })
            .await?;
        if resp.more() {
            tracing::warn!(
                "more than {MAX_LOADED} removal records in etcd under {}: the rest are ignored",
                self.prefix
            );
        }
        let mut out = Vec::with_capacity(resp.kvs().len());
        for kv in resp.kvs() {
            let key = kv.key().strip_prefix(self.prefix.as_bytes()).and_then(|k| std::str::from_utf8(k).ok());
            let mark = kv.value_str().ok().and_then(|v| v.parse::<u64>().ok());
            match (key, mark) {
                (Some(key), Some(mark)) => out.push(Tombstone { key: key.to_string(), mark }),
                _ => tracing::warn!("ignoring a malformed removal record {:?} in etcd", kv.key_str().unwrap_or("?")),
            }
        }
        Ok(out)
    }
}

/// A removal's answer: what it waits for, and what it removed.
#[derive(Debug)]
pub struct Removal {
    /// The memory owners' acknowledgements of the drops.
    pub wait: super::owners::AckWait,
    /// The objects removed.
    pub removed: Vec<Removed>,
}

impl Removal {
    /// Waits for the owners' acknowledgements, at most `timeout` (see [`super::owners::AckWait::wait`]).
    pub async fn wait(&mut self, timeout: Duration) {
        self.wait.wait(timeout).await
    }

    /// True when there is nothing to wait for.
    pub fn is_empty(&self) -> bool {
        self.wait.is_empty()
    }

    /// After the wait: the removals a copy may still hold, to record before answering.
    pub fn unsettled(&self) -> Vec<Tombstone> {
        let unacked = self.wait.unacked_segments();
        self.removed
            .iter()
            .filter(|r| r.unsettled(&unacked))
            .map(|r| Tombstone { key: r.key.clone(), mark: r.mark })
            .collect()
    }
}

/// The name of a single master's records in its state directory.
pub const FILE_NAME: &str = "removed-keys.jsonl";

/// One line of the file.
#[derive(serde::Serialize, serde::Deserialize)]
struct Line {
    key: String,
    mark: u64,
    /// When it was recorded, in seconds since the Unix epoch.
    at: u64,
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn file_err(what: &str, path: &Path, e: impl std::fmt::Display) -> StoreError {
    StoreError::Config(format!("{what} {}: {e}", path.display()))
}

/// A single master's records: an append-only file of JSON lines, rewritten without the
/// expired ones at start and whenever it holds more than twice the live ones.
pub struct FileRecords {
    state: Arc<parking_lot::Mutex<FileState>>,
}

struct FileState {
    path: PathBuf,
    file: std::fs::File,
    /// The live records, oldest first (what a rewrite keeps).
    live: std::collections::VecDeque<Line>,
    /// Lines in the file.
    lines: usize,
    /// How long a record lives, in seconds.
    ttl: u64,
}

impl FileState {
    fn drop_expired(&mut self, now: u64) {
        while self.live.front().is_some_and(|l| l.at + self.ttl < now) {
            self.live.pop_front();
        }
        while self.live.len() > MAX_LOADED {
            self.live.pop_front();
        }
    }

    /// Replaces the file with the live records (temporary file, flush, rename).
    fn rewrite(&mut self) -> std::io::Result<()> {
        let tmp = self.path.with_extension("jsonl.tmp");
        let mut out = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
        for l in &self.live {
            serde_json::to_writer(&mut out, l)?;
            out.write_all(b"\n")?;
        }
        let f = out.into_inner().map_err(|e| e.into_error())?;
        f.sync_all()?;
        std::fs::rename(&tmp, &self.path)?;
        if let Some(dir) = self.path.parent() {
            std::fs::File::open(dir)?.sync_all()?;
        }
        self.file = std::fs::OpenOptions::new().append(true).open(&self.path)?;
        self.lines = self.live.len();
        Ok(())
    }

    fn append(&mut self, records: &[Tombstone], now: u64) -> std::io::Result<()> {
        let mut buf = Vec::new();
        for t in records {
            let line = Line { key: t.key.clone(), mark: t.mark, at: now };
            serde_json::to_writer(&mut buf, &line)?;
            buf.push(b'\n');
            self.live.push_back(line);
        }
        self.file.write_all(&buf)?;
        self.file.sync_data()?;
        self.lines += records.len();
        self.drop_expired(now);
        if self.lines > 2 * self.live.len() + 10_000 {
            self.rewrite()?;
        }
        Ok(())
    }
}

impl FileRecords {
    /// Opens (or creates) the records in `dir` and returns the live ones. A file that cannot
    /// be read stops the start: starting without it would let removed objects come back. A
    /// malformed line (a write cut by a crash ends the file with one) is skipped.
    pub fn open(dir: &Path, ttl: Duration) -> Result<(FileRecords, Vec<Tombstone>)> {
        let path = dir.join(FILE_NAME);
        let now = unix_now();
        let mut live = std::collections::VecDeque::new();
        match std::fs::File::open(&path) {
            Ok(f) => {
                for (n, line) in std::io::BufReader::new(f).lines().enumerate() {
                    let line = line.map_err(|e| file_err("cannot read", &path, e))?;
                    match serde_json::from_str::<Line>(&line) {
                        Ok(l) if l.at + ttl.as_secs() >= now => live.push_back(l),
                        Ok(_) => {}
                        Err(e) => tracing::warn!("{}: line {} skipped: {e}", path.display(), n + 1),
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(file_err("cannot read", &path, e)),
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| file_err("cannot open", &path, e))?;
        let mut state = FileState { path: path.clone(), file, live, lines: 0, ttl: ttl.as_secs() };
        state.drop_expired(now);
        state.rewrite().map_err(|e| file_err("cannot rewrite", &path, e))?;
        let loaded = state.live.iter().map(|l| Tombstone { key: l.key.clone(), mark: l.mark }).collect();
        Ok((FileRecords { state: Arc::new(parking_lot::Mutex::new(state)) }, loaded))
    }

    async fn record(&self, records: &[Tombstone]) -> Result<()> {
        let state = self.state.clone();
        let records = records.to_vec();
        let written = tokio::task::spawn_blocking(move || {
            let mut st = state.lock();
            let path = st.path.clone();
            st.append(&records, unix_now()).map_err(|e| (path, e))
        })
        .await;
        match written {
            Ok(Ok(())) => Ok(()),
            Ok(Err((path, e))) => Err(StoreError::Internal(format!(
                "the removal could not be recorded in {} ({e}); remove it again",
                path.display()
            ))),
            Err(e) => Err(StoreError::Internal(format!("recording a removal: {e}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(key: &str, mark: u64) -> Tombstone {
        Tombstone { key: key.into(), mark }
    }

    #[test]
    fn a_state_dir_keeps_live_records_across_starts_and_drops_expired_and_torn_lines() {
        let dir = tempfile::tempdir().unwrap();
        let ttl = Duration::from_secs(60);
        let (f, loaded) = FileRecords::open(dir.path(), ttl).unwrap();
        assert!(loaded.is_empty());
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).build().unwrap();
        rt.block_on(RemovalRecords::File(f).record(0, &[t("a", 5), t("b/ü", 6)])).unwrap();
        // An expired record and a line cut by a crash, appended by hand.
        let path = dir.path().join(FILE_NAME);
        let old = unix_now() - ttl.as_secs() - 5;
        let mut file = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        writeln!(file, r#"{{"key":"old","mark":1,"at":{old}}}"#).unwrap();
        write!(file, r#"{{"key":"cut","ma"#).unwrap();
        drop(file);
        let (_, loaded) = FileRecords::open(dir.path(), ttl).unwrap();
        assert_eq!(loaded, [t("a", 5), t("b/ü", 6)]);
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 2, "rewritten without the expired and the cut line: {text}");
    }
}
