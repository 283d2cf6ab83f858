//! How a get goes: the replica list from the master (with the hot cache's early copy or the
//! disk tier's early read beside it), then the executor reads the replicas; the batch forms
//! ask for all lists in one call.

use std::mem::MaybeUninit;

use super::exec::Exec;
use super::hot_cache::{self, Identity};
use super::lease::{LeaseClock, Listed};
use super::rpc::check;
use super::sg::{Dst, Extent, Reach};
use super::{
    forget_if_gone, held_for_early_copy, in_batches, one_per_key, plan, read, worth_copying_early, EarlyCopies,
    StoreClient, Want,
};
use crate::error::Result;
use crate::proto::{BatchGetReplicaListReply, BatchKeyRequest, KeyRequest, ReplicaStatus, Tier};
use crate::protocol::MAX_BATCH_KEYS;

impl StoreClient {
    pub(super) fn replica_list(&self, key: &str) -> Result<Listed> {
        let req = KeyRequest { client_id: self.id.clone(), key: key.to_string(), ..Default::default() };
        let clock = LeaseClock::start();
        let mut reply = self.rpc.unary(crate::fastrpc::Method::GetReplicaList, req, |mut c, req| async move {
            c.get_replica_list(req).await
        })?;
        check(reply.status.take(), key)?;
        Ok(Listed { reply, clock })
    }

    /// [`Self::replica_list`] with `meanwhile` run on the calling thread while the master
    /// answers (the call on the background runtime, [`MasterRpc::call_beside`]): for work
    /// that does not wait for the answer and outlasts the round trip.
    pub(super) fn replica_list_beside<R>(&self, key: &str, meanwhile: impl FnOnce() -> R) -> (Result<Listed>, R) {
        let req = KeyRequest { client_id: self.id.clone(), key: key.to_string(), ..Default::default() };
        let clock = LeaseClock::start();
        let (reply, side) = self.rpc.call_beside(|mut c| async move { c.get_replica_list(req).await }, meanwhile);
        (reply.and_then(|mut reply| check(reply.status.take(), key).map(|()| Listed { reply, clock })), side)
    }

    /// [`Self::replica_list`] for a get of a value the hot cache holds (`guard`, from
    /// [`HotCache::peek`]): while the master answers, `copy` copies the entry into the get's
    /// destination (an early copy, as [`Self::batch_replica_lists_copying_hits`] makes for a
    /// batch), so that a hit costs the larger of the round trip and the copy instead of their
    /// sum. Returns the answer and the identity of the entry copied, for [`Exec::early`]: the
    /// read keeps the copy only where the answer says the key still is that object.
    pub(super) fn replica_list_copying_hit(
        &self,
        key: &str,
        guard: hot_cache::Guard<'_>,
        copy: impl FnOnce(&hot_cache::Guard<'_>),
    ) -> Result<(Listed, [Option<Identity>; 1])> {
        // Beside, not while: sending the request and reading the answer on the calling thread
        // cost more than the hand-off to the background runtime (0.95 against 0.90-0.91 of
        // memcpy + master for a warm 10 MiB get).
        let (listed, ()) = self.replica_list_beside(key, || copy(&guard));
        match listed {
            Ok(listed) => Ok((listed, [Some(guard.identity().clone())])),
            Err(e) => {
                if let Some(cache) = &self.hot {
                    cache.note_early_copies_wasted(1);
                    forget_if_gone(cache, key, &e);
                }
                Err(e)
            }
        }
    }

    /// Asks the master for `key`'s replicas. When this client's disk holds what was, the last
    /// time it looked, the object's only copy, the file is read into `dst(size)` while the
    /// master answers: the round trip is then hidden behind the read instead of before it.
    /// Returns the answer and whether `dst` holds the object it describes (the answer lists
    /// this disk's file of that very version; otherwise the get reads where the answer says).
    pub(super) fn replica_list_reading_disk<'d>(
        &self,
        key: &str,
        dst: impl FnOnce(u64) -> Option<&'d mut [u8]>,
    ) -> Result<(Listed, bool)> {
        let guess = self.disk.as_ref().and_then(|d| Some((d, d.tier.only_copy(key)?)));
        let Some((disk, (version, size))) = guess else {
            return Ok((self.replica_list(key)?, false));
        };
        let Some(out) = dst(size) else {
            return Ok((self.replica_list(key)?, false));
        };
        let tier = &disk.tier;
        let (listed, read) = self.replica_list_beside(key, || tier.read_local(key, version, out));
        let confirmed = match (&listed, &read) {
            (Ok(Listed { reply: l, .. }), Ok(())) => {
                l.version == version
                    && l.size == size
                    && l.replicas.iter().any(|r| {
                        r.tier == Tier::Ssd as i32
                            && r.status == ReplicaStatus::Complete as i32
                            && r.segment_name == disk.segment_name()
                    })
            }
            _ => false,
        };
        tier.early_read_judged(key, version, confirmed);
        let listed = listed?;
        if confirmed && listed.reply.replicas.iter().any(plan::readable_in_memory) {
            // Back in memory meanwhile: later gets read it from there.
            tier.note_only_copy(key, version, false);
        }
        Ok((listed, confirmed))
    }

    /// A zero-copy get of a value the hot cache holds, with an early copy (see
    /// [`Self::replica_list_copying_hit`]); `None` when the cache does not hold the key, the
    /// caller's memory does not fit the cached value, or the copy is too small to be worth it
    /// ([`EARLY_COPY_FROM`]): the get then asks first.
    pub(super) fn get_into_copying_hit(&self, key: &str, want: Want<'_>) -> Option<Result<u64>> {
        let (guard, extents, bytes) = held_for_early_copy(self.hot.as_ref()?, key, &want)?;
        if self.extents_reach(&extents).has_device() {
            return None; // a hit into device memory is copied once the master confirms it
        }
        if !worth_copying_early(bytes) {
            return None;
        }
        let got = self
            .replica_list_copying_hit(key, guard, |g| read::copy_entry_early(g, &extents))
            .and_then(|(list, early)| self.read_listed(key, &list, want, &early));
        Some(got)
    }

    /// Reads what `want` takes of the object `list` describes into registered memory; `early`:
    /// its early copy, if any (see [`Exec::early`]). Returns the bytes read.
    pub(super) fn read_listed(
        &self,
        key: &str,
        list: &Listed,
        want: Want<'_>,
        early: &[Option<Identity>],
    ) -> Result<u64> {
        let (extents, n) = want.extents(key, list.size)?;
        let reach = self.extents_reach(&extents);
        Exec { early, ..self.exec() }.read(key, list, &mut Dst::Registered(&extents, reach))?;
        Ok(n)
    }

    /// The master's answers for a batch of keys (one round trip), each with its lease's clock.
    pub(super) fn batch_replica_lists(&self, keys: &[String]) -> Result<Vec<Result<Listed>>> {
        in_batches(keys.len(), |r| {
            let keys = &keys[r];
            let req = BatchKeyRequest { client_id: self.id.clone(), keys: keys.to_vec(), ..Default::default() };
            let clock = LeaseClock::start();
            let reply = self.rpc.unary(crate::fastrpc::Method::BatchGetReplicaList, req, |mut c, req| async move {
                c.batch_get_replica_list(req).await
            })?;
            Self::lists_of(reply, keys, clock)
        })
    }

    /// The master's answers to a batch of replica-list requests, one per key.
    pub(super) fn lists_of(
        reply: BatchGetReplicaListReply,
        keys: &[String],
        clock: LeaseClock,
    ) -> Result<Vec<Result<Listed>>> {
        one_per_key(reply.items.len(), keys.len())?;
        Ok(reply
            .items
            .into_iter()
            .zip(keys)
            .map(|(mut item, key)| check(item.status.take(), key).map(|()| Listed { reply: item, clock }))
            .collect())
    }

    /// [`Self::batch_replica_lists`] for a zero-copy batch get: while the master answers, each
    /// key's value that the hot cache holds is copied into the registered memory the key
    /// `wants` it in (an early copy), so that a hit costs the larger of the round trip and the
    /// copy instead of their sum. Returns the answers and, per key, the identity of the entry
    /// copied; the batch read (`Exec::read_batch`) keeps a copy only where the answer says the key still
    /// is that object, and otherwise reads over it as it would have. A key whose answer is an
    /// error keeps whatever the copy wrote (the caller's memory holds no value after a failed
    /// get). Batches of more than one call's keys, batches whose hits copy less than
    /// [`EARLY_COPY_FROM`] in all, and clients without a cache, ask as before.
    pub(super) fn batch_replica_lists_copying_hits(
        &self,
        keys: &[String],
        wants: &[Want<'_>],
    ) -> Result<(Vec<Result<Listed>>, EarlyCopies)> {
        let none = || vec![None; keys.len()];
        let Some(cache) = self.hot.as_ref().filter(|_| keys.len() <= MAX_BATCH_KEYS) else {
            return Ok((self.batch_replica_lists(keys)?, none()));
        };
        // Hits into device memory are copied once the master confirms them (no early copy).
        let held: Vec<Option<(hot_cache::Guard<'_>, Vec<Extent>, u64)>> = keys
            .iter()
            .zip(wants)
            .map(|(key, want)| {
                held_for_early_copy(cache, key, want).filter(|(_, e, _)| !self.extents_reach(e).has_device())
            })
            .collect();
        let bytes = held.iter().flatten().map(|(_, _, bytes)| bytes).sum();
        if !worth_copying_early(bytes) {
            return Ok((self.batch_replica_lists(keys)?, none()));
        }
        let req = BatchKeyRequest { client_id: self.id.clone(), keys: keys.to_vec(), ..Default::default() };
        let clock = LeaseClock::start();
        let (reply, ()) = self.rpc.call_beside(
            |mut c| async move { c.batch_get_replica_list(req).await },
            || {
                for (guard, extents, _) in held.iter().flatten() {
                    read::copy_entry_early(guard, extents);
                }
            },
        );
        let lists = Self::lists_of(reply?, keys, clock)?;
        for ((key, list), _) in keys.iter().zip(&lists).zip(&held).filter(|(_, h)| h.is_some()) {
            if let Err(e) = list {
                forget_if_gone(cache, key, e);
            }
        }
        Ok((lists, held.into_iter().map(|h| h.map(|(guard, _, _)| guard.identity().clone())).collect()))
    }

    /// The answers split into those to read and the master's refusals (per-key results).
    pub(super) fn split_lists(lists: Vec<Result<Listed>>) -> (Vec<Option<Listed>>, Vec<Result<()>>) {
        lists
            .into_iter()
            .map(|l| match l {
                Ok(l) => (Some(l), Ok(())),
                Err(e) => (None, Err(e)),
            })
            .unzip()
    }

    /// Reads the values `lists` describes into `outs` (each the value's size; `None`: a key
    /// that is not read, its result an error already): lent to the engine where every buffer
    /// can be, else through the staging buffer.
    pub(super) fn read_batch_bytes(
        &self,
        keys: &[String],
        lists: &[Option<Listed>],
        mut outs: Vec<Option<&mut [u8]>>,
        mut results: Vec<Result<()>>,
    ) -> Result<Vec<Result<()>>> {
        let mut loans = Vec::with_capacity(outs.len());
        let mut lent = true;
        for b in outs.iter_mut().flatten().filter(|b| !b.is_empty()) {
            match self.engine.lend_local(None, b.as_mut_ptr() as u64, b.len() as u64) {
                Ok(Some(loan)) => loans.push(loan),
                _ => {
                    lent = false;
                    break;
                }
            }
        }
        let exec = self.exec();
        if lent {
            let extents: Vec<Option<[Extent; 1]>> = outs
                .iter_mut()
                .map(|b| b.as_mut().map(|b| [Extent { offset: 0, addr: b.as_mut_ptr() as u64, len: b.len() as u64 }]))
                .collect();
            let mut dsts: Vec<Option<Dst<'_>>> = extents
                .iter()
                .map(|e| e.as_ref().filter(|e| e[0].len > 0).map(|e| Dst::Registered(&e[..], Reach::host())))
                .collect();
            let read = exec.read_batch(keys, lists, &mut dsts, &mut results, true);
            drop(loans); // after every transfer into the buffers has ended
            read?;
        } else {
            drop(loans);
            // SAFETY: the same layout; the read writes only initialised bytes into them.
            let as_out = |b: &mut [u8]| unsafe { &mut *(b as *mut [u8] as *mut [MaybeUninit<u8>]) };
            let mut dsts: Vec<Option<Dst<'_>>> = outs
                .into_iter()
                .map(|b| b.filter(|b| !b.is_empty()).map(|b| Dst::Bytes { out: as_out(b), offset: 0 }))
                .collect();
            exec.read_batch(keys, lists, &mut dsts, &mut results, false)?;
        }
        Ok(results)
    }

    /// The batch get into registered memory: one round trip, then the executor.
    pub(super) fn read_many(&self, keys: &[String], wants: &[Want<'_>]) -> Result<Vec<Result<u64>>> {
        let (lists, early) = self.batch_replica_lists_copying_hits(keys, wants)?;
        let (lists, results) = Self::split_lists(lists);
        self.read_lists(keys, &lists, wants, results, &early)
    }

    /// The executor's part of a batch get into registered memory, on answers the master gave
    /// (now, or at a get session's start): what each key `wants` of the value `lists` describes.
    /// Keys whose result is an error already are left alone. `early`: the keys' early copies
    /// (see [`Self::batch_replica_lists_copying_hits`]; empty: none). Returns the bytes read per
    /// key.
    pub(super) fn read_lists(
        &self,
        keys: &[String],
        lists: &[Option<Listed>],
        wants: &[Want<'_>],
        mut results: Vec<Result<()>>,
        early: &[Option<Identity>],
    ) -> Result<Vec<Result<u64>>> {
        let mut sizes = vec![0u64; keys.len()];
        let mut extents: Vec<Vec<Extent>> = vec![Vec::new(); keys.len()];
        for i in 0..keys.len() {
            let Some(list) = &lists[i] else { continue };
            match wants[i].extents(&keys[i], list.size) {
                Ok((e, n)) => (extents[i], sizes[i]) = (e, n),
                Err(e) => results[i] = Err(e),
            }
        }
        let mut dsts: Vec<Option<Dst<'_>>> =
            extents.iter().map(|e| Some(Dst::Registered(e, self.extents_reach(e)))).collect();
        let exec = Exec { early, ..self.exec() };
        exec.read_batch(keys, lists, &mut dsts, &mut results, false)?;
        Ok(results.into_iter().zip(sizes).map(|(r, n)| r.map(|()| n)).collect())
    }
}
