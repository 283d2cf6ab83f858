//! Where the hot cache meets the client: the get paths ask it first and feed it on a miss; the
//! client's own puts and removals invalidate it.

use std::collections::VecDeque;

use crescent_engine::{BatchId, Opcode, TransferEngine, TransferRequest};

use super::{Fill, Guard, HotCache, HotCacheMetrics, Miss};
use crate::client::lease::Listed;
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

    /// The cache's entry for a remote object, on a hit (held until the guard is dropped).
    pub(in crate::client) fn hot_lookup(&self, key: &str, list: &GetReplicaListReply) -> Option<Guard<'_>> {
        self.hot_for(list)?.lookup(key, list)
    }

    /// A byte get's value from the cache, on a hit.
    pub(in crate::client) fn hot_get_vec(&self, key: &str, list: &GetReplicaListReply) -> Option<Vec<u8>> {
        Some(self.hot_lookup(key, list)?.to_vec())
    }

    /// Serves a zero-copy get into registered memory at `addr` from the cache, on a hit.
    pub(in crate::client) fn hot_get_into(&self, key: &str, list: &GetReplicaListReply, addr: u64) -> bool {
        match self.hot_lookup(key, list) {
            Some(guard) => {
                copy_out(&guard, addr);
                true
            }
            None => false,
        }
    }

    /// What a get that missed does about the cache (see [`HotCache::begin`]).
    pub(in crate::client) fn hot_begin(&self, key: &str, list: &GetReplicaListReply, r: &ReplicaDescriptor) -> Miss {
        match self.hot_for(list) {
            Some(hot) => hot.begin(key, list, r),
            None => Miss::Skip,
        }
    }

    /// Reads a remote replica. With the cache, a byte get lands the bytes in blocks reserved
    /// for the fill and copies them to the caller from there (in place of the staging buffer);
    /// a zero-copy get reads into the caller's memory and copies from there into the blocks.
    /// A get of an object another get is fetching waits for that fetch instead. A read that
    /// ends after the list's lease fails and fills nothing (see [`crate::client::lease`]).
    pub(in crate::client) fn read_remote_hot(
        &self,
        key: &str,
        list: &Listed,
        r: &ReplicaDescriptor,
        dst: &mut Buf<'_>,
    ) -> Result<()> {
        let Some(hot) = &self.hot else {
            return self.read_remote_leased(key, list, r, dst);
        };
        let size = list.size;
        match (hot.begin(key, list, r), dst) {
            (Miss::Lead(fill), Buf::BytesMut(out)) => {
                // On failure the fill's blocks go back.
                self.land(key, r, &fill, &mut out[..size as usize])?;
                list.lease_held(key)?;
                hot.publish(fill);
                Ok(())
            }
            (Miss::Lead(mut fill), dst @ Buf::Registered(_)) => {
                self.read_remote_leased(key, list, r, dst)?;
                let Buf::Registered(addr) = dst else { unreachable!("matched above") };
                fill_from(&mut fill, *addr);
                hot.publish(fill);
                Ok(())
            }
            (Miss::Join(joined), dst) => match hot.wait(joined) {
                Some(guard) => {
                    match dst {
                        Buf::BytesMut(out) => guard.copy_to(&mut out[..size as usize]),
                        Buf::Registered(addr) => copy_out(&guard, *addr),
                        Buf::Bytes(_) => unreachable!("gets write to the caller"),
                    }
                    Ok(())
                }
                None => self.read_remote_leased(key, list, r, dst),
            },
            (_, dst) => self.read_remote_leased(key, list, r, dst),
        }
    }

    /// Reads a remote replica into `dst`; fails if the read ended after the list's lease.
    fn read_remote_leased(&self, key: &str, list: &Listed, r: &ReplicaDescriptor, dst: &mut Buf<'_>) -> Result<()> {
        self.read_remote(key, r, list.size, dst)?;
        list.lease_held(key)
    }

    /// Reads the replica into the fill's blocks and copies it to `out` as it arrives: every
    /// piece is started at once, and each is copied out while the later ones still move (as
    /// the staged get without the cache overlaps its copies), so that only the last piece's
    /// copy adds to the get.
    fn land(&self, key: &str, r: &ReplicaDescriptor, fill: &Fill, out: &mut [u8]) -> Result<()> {
        let seg = self
            .engine
            .open_segment(&r.segment_name)
            .map_err(|e| StoreError::PeerGone { key: key.to_string(), reason: e.to_string() })?;
        let mut landing = Landing { engine: &self.engine, pieces: VecDeque::new() };
        for (off, addr, len) in fill.pieces() {
            let mut at = 0;
            while at < len {
                let n = LAND_PIECE.min(len - at);
                let request = TransferRequest {
                    opcode: Opcode::Read,
                    source: addr + at,
                    target: seg,
                    target_offset: r.address + off + at,
                    length: n,
                };
                let id = self.engine.transfer_start(&[request]).map_err(|e| self.transfer_error(key, e))?;
                landing.pieces.push_back((id, off + at, n));
                at += n;
            }
        }
        while let Some((id, off, n)) = landing.pieces.pop_front() {
            self.engine.transfer_finish(id).map_err(|e| self.transfer_error(key, e))?;
            fill.copy_range_to(off, &mut out[off as usize..(off + n) as usize]);
        }
        Ok(())
    }

    /// The client's own put or removal of `key`.
    pub(in crate::client) fn hot_invalidate(&self, key: &str) {
        if let Some(hot) = &self.hot {
            hot.invalidate(key);
        }
    }
}

/// Copies a cached object into registered memory at `addr` that the caller of a zero-copy get
/// registered for at least its size.
pub(in crate::client) fn copy_out(guard: &Guard<'_>, addr: u64) {
    // SAFETY: the caller registered [addr, +len >= size) for this call and keeps it valid.
    guard.copy_to(unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, guard.size() as usize) });
}

/// Fills the cache's blocks from the bytes a zero-copy get read into registered memory at
/// `addr` (its transfers have ended).
pub(in crate::client) fn fill_from(fill: &mut Fill, addr: u64) {
    // SAFETY: the caller registered [addr, +len >= size) for this call, keeps it valid, and
    // the get's transfers into it have ended.
    fill.copy_from(unsafe { std::slice::from_raw_parts(addr as *const u8, fill.size() as usize) });
}

/// Piece a byte get with the cache lands at a time (see [`StoreClient::land`]).
const LAND_PIECE: u64 = 2 << 20;

/// The pieces of a landing still in flight: `(batch, offset in the object, length)`. Dropped
/// early (an error), it waits for them, so that the fill's blocks never go back while a
/// transfer still writes into them.
struct Landing<'a> {
    engine: &'a TransferEngine,
    pieces: VecDeque<(BatchId, u64, u64)>,
}

impl Drop for Landing<'_> {
    fn drop(&mut self) {
        for (id, _, _) in self.pieces.drain(..) {
            let _ = self.engine.transfer_finish(id);
        }
    }
}
