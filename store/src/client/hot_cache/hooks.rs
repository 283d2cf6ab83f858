//! Where the hot cache meets the client: the get paths ask it first and feed it on a miss; the
//! client's own puts and removals invalidate it.

use crescent_engine::{Opcode, TransferRequest};

use super::{Fill, HotCache, HotCacheMetrics};
use crate::client::{Buf, StoreClient};
use crate::error::{Result, StoreError};
use crate::proto::{GetReplicaListReply, ReplicaDescriptor, ReplicaStatus};

impl StoreClient {
    /// The client's hot cache, when enabled.
    pub fn hot_cache(&self) -> Option<&HotCache> {
        self.hot.as_ref()
    }

    pub fn hot_cache_metrics(&self) -> Option<HotCacheMetrics> {
        self.hot.as_ref().map(HotCache::metrics)
    }

    /// The cache, if the object is a candidate: it has no replica in our own segment.
    fn hot_for(&self, list: &GetReplicaListReply) -> Option<&HotCache> {
        let hot = self.hot.as_ref()?;
        let me = self.engine.segment_name();
        if list.replicas.iter().any(|r| r.status == ReplicaStatus::Complete as i32 && r.segment_name == me) {
            hot.note_local_read();
            return None;
        }
        Some(hot)
    }

    /// A byte get's value from the cache, on a hit.
    pub(in crate::client) fn hot_get_vec(&self, key: &str, list: &GetReplicaListReply) -> Option<Vec<u8>> {
        Some(self.hot_for(list)?.lookup(key, list)?.to_vec())
    }

    /// Serves a zero-copy get into registered memory at `addr` from the cache, on a hit.
    pub(in crate::client) fn hot_get_into(&self, key: &str, list: &GetReplicaListReply, addr: u64) -> bool {
        let Some(guard) = self.hot_for(list).and_then(|hot| hot.lookup(key, list)) else {
            return false;
        };
        // SAFETY: the caller registered [addr, +len >= size) for this call and keeps it valid.
        guard.copy_to(unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, guard.size() as usize) });
        true
    }

    /// Reads a remote replica. With the cache, a byte get lands the bytes in blocks reserved
    /// for the fill and copies them to the caller from there (in place of the staging buffer);
    /// a zero-copy get reads into the caller's memory and leaves a fetch job for the worker.
    pub(in crate::client) fn read_remote_hot(
        &self,
        key: &str,
        list: &GetReplicaListReply,
        r: &ReplicaDescriptor,
        dst: &mut Buf<'_>,
    ) -> Result<()> {
        let Some(hot) = &self.hot else {
            return self.read_remote(key, r, list.size, dst);
        };
        match dst {
            Buf::BytesMut(out) => match hot.reserve(key, list, r) {
                Some(fill) => {
                    self.land(key, r, &fill)?; // on failure the fill's blocks go back
                    fill.copy_to(&mut out[..list.size as usize]);
                    hot.publish(fill);
                    Ok(())
                }
                None => self.read_remote(key, r, list.size, dst),
            },
            Buf::Registered(_) => {
                self.read_remote(key, r, list.size, dst)?;
                hot.fetch_later(key, list, r);
                Ok(())
            }
            Buf::Bytes(_) => unreachable!("gets write to the caller"),
        }
    }

    /// Reads the replica into the fill's blocks (one request per block).
    fn land(&self, key: &str, r: &ReplicaDescriptor, fill: &Fill) -> Result<()> {
        let seg = self
            .engine
            .open_segment(&r.segment_name)
            .map_err(|e| StoreError::PeerGone { key: key.to_string(), reason: e.to_string() })?;
        self.transfer(
            key,
            fill.pieces().into_iter().map(|(off, addr, len)| TransferRequest {
                opcode: Opcode::Read,
                source: addr,
                target: seg,
                target_offset: r.address + off,
                length: len,
            }),
        )
    }

    /// After a zero-copy batch: fetch jobs for the keys read from their first complete replica.
    pub(in crate::client) fn hot_after_batch(
        &self,
        keys: &[String],
        lists: &[Result<GetReplicaListReply>],
        read: &[usize],
        results: &[Result<()>],
    ) {
        let Some(hot) = &self.hot else { return };
        for &i in read {
            if let (Ok(()), Ok(list)) = (&results[i], &lists[i]) {
                // Memory replicas only: disk copies (tier SSD) are read through their owner.
                if let Some(r) = list.replicas.iter().find(|r| crate::client::readable_in_memory(r)) {
                    hot.fetch_later(&keys[i], list, r);
                }
            }
        }
    }

    /// The client's own put or removal of `key`.
    pub(in crate::client) fn hot_invalidate(&self, key: &str) {
        if let Some(hot) = &self.hot {
            hot.invalidate(key);
        }
    }
}
