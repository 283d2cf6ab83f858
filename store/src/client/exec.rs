//! The executor: carries out read and write plans ([`super::plan`]) over typed sources and
//! destinations ([`super::sg`]), with the parts of the client that move bytes — the engine,
//! this client's segment, the staging buffer, the hot cache, the disk tier. It never talks to
//! the master: [`super::StoreClient`] asks the master, hands the answer to the executor, and
//! tells the master how it went. Reads are in [`super::read`], writes in [`super::write`].

use std::sync::Arc;
use std::time::Instant;

use crescent_engine::{BatchId, EngineError, RegisteredMemory, TransferEngine, TransferRequest, TransferStatus};

use super::checksum::Checksums;
use super::disk_link::DiskLink;
use super::hot_cache::HotCache;
use super::plan::Early;
use crate::error::{PeerFault, Result, StoreError, Waited};
use crate::proto::ReplicaDescriptor;
use crate::staging::{Staging, StagingBlock};

/// The parts one request uses, and its deadline.
pub(crate) struct Exec<'c> {
    pub engine: &'c Arc<TransferEngine>,
    /// This client's segment (replicas the master places here are a memcpy away); none for a
    /// pure consumer.
    pub segment: Option<&'c RegisteredMemory>,
    pub staging: &'c Staging,
    pub hot: Option<&'c HotCache>,
    pub disk: Option<&'c DiskLink>,
    /// When the request gives up waiting (for room in the staging buffer, for a transfer).
    pub deadline: Instant,
    /// Per key of the read (one for a single get): what was read into the key's destination
    /// while the master answered (an early read), if anything. Empty: nothing.
    pub early: &'c [Option<Early>],
    /// With checksums on: the counters whole-value reads are verified against (see
    /// [`super::checksum`]); none: reads are not verified.
    pub verify: Option<&'c Arc<Checksums>>,
    /// Counts the reads of another client's disk (`StoreApi::remote_disk_reads`).
    pub remote_disk_reads: &'c std::sync::atomic::AtomicU64,
}

impl<'c> Exec<'c> {
    /// Bytes of our own segment at a replica's address, if the replica is ours.
    #[allow(clippy::mut_from_ref)] // the bytes are our registered segment, not a field of self
    pub(crate) fn local_replica(&self, r: &ReplicaDescriptor, len: u64) -> Option<&'c mut [u8]> {
        if r.segment_name != self.engine.segment_name() {
            return None;
        }
        let segment = self.segment?;
        let (base, end) = (segment.addr(), segment.addr() + segment.len());
        if r.address < base || r.address.checked_add(len).is_none_or(|e| e > end) {
            tracing::error!("the master placed a replica outside our segment: {:#x}+{len}", r.address);
            return None;
        }
        // SAFETY: inside our own registered segment; the master hands this range to one object
        // at a time, and a put/get of it is the only user while its lease or put lasts.
        Some(unsafe { std::slice::from_raw_parts_mut(r.address as *mut u8, len as usize) })
    }

    /// `len` bytes (at most a staging chunk) of the staging buffer, waiting for them until the
    /// request's deadline.
    pub(crate) fn stage(&self, len: u64) -> Result<StagingBlock<'c>> {
        self.staging.acquire(len, self.deadline)
    }

    /// Opens the segment of a peer's replica (the holder is gone if it cannot be reached).
    pub(crate) fn open(&self, key: &str, segment: &str) -> Result<crescent_engine::SegmentId> {
        let segment = crate::protocol::engine_segment(segment);
        self.engine.open_segment(segment).map_err(|e| StoreError::peer_gone(key, e))
    }

    /// Moves `requests` for `key` and waits for them.
    pub(crate) fn transfer(&self, key: &str, requests: impl Iterator<Item = TransferRequest>) -> Result<()> {
        let requests: Vec<_> = requests.collect();
        if requests.is_empty() {
            return Ok(());
        }
        self.engine.transfer_sync(&requests).map_err(|e| self.transfer_error(key, e))
    }

    /// What an engine error moving `key`'s bytes means for the store.
    pub(crate) fn transfer_error(&self, key: &str, e: EngineError) -> StoreError {
        match e {
            EngineError::TimedOut => self.transfer_timed_out(key),
            e if e.is_caller_error() => StoreError::Engine(e),
            // Out of range is not the holder's fault: the request named memory it lacks.
            EngineError::TransferFailed { ref reason, .. } if reason.is_out_of_range() => StoreError::Engine(e),
            e => StoreError::peer_gone(key, e),
        }
    }

    fn transfer_timed_out(&self, key: &str) -> StoreError {
        StoreError::TimedOut {
            waited: Waited::Transfer { key: key.to_string() },
            after: self.engine.config().transfer_timeout,
        }
    }

    /// Submits one engine batch (none when there is nothing to move); the transfers run while
    /// the caller does other work, until [`Self::finish_batch`].
    pub(crate) fn start_batch(&self, requests: &[TransferRequest]) -> Result<Option<BatchId>> {
        if requests.is_empty() {
            return Ok(None);
        }
        let batch = self.engine.allocate_batch(requests.len())?;
        if let Err(e) = self.engine.submit(batch, requests) {
            let _ = self.engine.free_batch(batch);
            return Err(e.into());
        }
        Ok(Some(batch))
    }

    /// Waits for a batch of [`Self::start_batch`]; a failed request fails its key:
    /// `results[owner[i]]` for request `i` (the first failure of a key is kept).
    pub(crate) fn finish_batch(
        &self,
        batch: Option<BatchId>,
        keys: &[String],
        owner: &[usize],
        results: &mut [Result<()>],
    ) -> Result<()> {
        let Some(batch) = batch else { return Ok(()) };
        let statuses = self.engine.wait_batch(batch, None);
        let freed = self.engine.free_batch(batch);
        let statuses = statuses?;
        freed?;
        for (status, &i) in statuses.into_iter().zip(owner) {
            let err = match status {
                TransferStatus::Completed => continue,
                TransferStatus::TimedOut => self.transfer_timed_out(&keys[i]),
                // Out of range is not the holder's fault: the request named memory it lacks.
                TransferStatus::Failed(reason) if reason.is_out_of_range() => {
                    StoreError::Engine(crescent_engine::EngineError::TransferFailed { request: i, reason })
                }
                TransferStatus::Failed(reason) => StoreError::peer_gone(&keys[i], PeerFault::Transfer(reason)),
                TransferStatus::Pending => StoreError::Internal("batch ended with a pending request".into()),
            };
            if results[i].is_ok() {
                results[i] = Err(err);
            }
        }
        Ok(())
    }
}
