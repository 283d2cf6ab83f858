//! Removals that must outlive the master which answered them (HA on etcd).
//!
//! A removal is invisible at once, and is answered once the owners of its memory replicas
//! acknowledged their drop ([`super::owners`]). Two kinds of copies can still hold the object
//! when the answer goes out:
//!
//! * a memory replica whose owner did not acknowledge within `owner_ack_timeout` (the owner is
//!   cut off, frozen, or slow);
//! * a disk copy: disks learn their removals on their client's next ping (the master's `disk` module),
//!   and a removal made just before the leader dies never reaches them.
//!
//! A new leader rebuilds from what the owners report and what the disks announce
//! ([`super::rebuild`]); such a copy would bring the removed object back, and a reader would
//! get a value its writer was told was gone. So, with HA, such a removal is *recorded* before
//! it is answered: one key per removed object under `/crescent/<cluster>/master/removed/`,
//! valued with the version the removal marks (a copy older than that is gone), written in one
//! transaction that holds only while this master's leadership key is still the one it won —
//! a deposed leader's record is refused, and its removal is answered `NOT_LEADER` (the client
//! removes the key again at the new leader). A new leader reads every record before it takes
//! its first call and buries them in its rebuild window. Records expire after
//! [`RECORD_TTL`] (an etcd lease shared by the records of a minute): long past any rebuild
//! window, and long enough for the copies to have heard of their removal since (an owner's
//! acknowledgement, a disk's ping, or the client copies of disk removals handed back to a
//! new master).
//!
//! A single master (no HA) records nothing: removals answered without every copy's
//! acknowledgement can come back after a restart of the master, as before.

use std::time::{Duration, Instant};

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};

use super::ha::HaSettings;
use crate::error::{Result, StoreError};
use crate::leader::{leader_key, Members};

/// How long a record lives in etcd.
pub const RECORD_TTL: Duration = Duration::from_secs(600);
/// How long one etcd lease takes new records (each record lives `RECORD_TTL` to this longer).
const LEASE_SHARED_FOR: Duration = Duration::from_secs(60);
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
    /// The memory segments its replicas were in.
    pub segments: Vec<u64>,
    /// Whether a disk held a copy.
    pub on_disk: bool,
}

impl Removed {
    /// Whether a copy may still hold the object, given the segments whose owners have not
    /// acknowledged.
    pub fn unsettled(&self, unacked: &[u64]) -> bool {
        self.on_disk || self.segments.iter().any(|s| unacked.contains(s))
    }
}

/// The records of one cluster in etcd.
pub struct RemovalRecords {
    /// Connected on first use.
    etcd: tokio::sync::Mutex<Option<Members>>,
    endpoints: Vec<String>,
    prefix: String,
    leader_key: String,
    /// The lease new records share, and when it was granted.
    lease: parking_lot::Mutex<Option<(i64, Instant)>>,
}

impl RemovalRecords {
    /// Records in the etcd of `ha` (nothing is asked yet).
    pub fn new(ha: &HaSettings) -> RemovalRecords {
        RemovalRecords {
            etcd: tokio::sync::Mutex::new(None),
            endpoints: ha.endpoints.clone(),
            prefix: format!("/crescent/{}/master/removed/", ha.cluster_id),
            leader_key: leader_key(&ha.cluster_id),
            lease: parking_lot::Mutex::new(None),
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
        let ttl = (RECORD_TTL + LEASE_SHARED_FOR).as_secs() as i64;
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
