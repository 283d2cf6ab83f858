//! How a get goes: the replica list from the master, with an early read beside it where
//! this client knows a source already (the hot cache's entry, its disk file of an object
//! that had no other copy), then the executor runs the read plan, which keeps the early
//! read where the answer confirms it; the batch forms ask for all lists in one call.

use std::mem::MaybeUninit;

use super::exec::Exec;
use super::lease::{LeaseClock, Listed};
use super::plan::{worth_copying_early, Early};
use super::read::Speculative;
use super::rpc::check;
use super::sg::{Dst, Extent, Reach};
use super::{api, in_batches, one_per_key, StoreClient, ValueSink, Want};
use crate::error::Result;
use crate::proto::{BatchGetReplicaListReply, BatchKeyRequest, KeyRequest};
use crate::protocol::MAX_BATCH_KEYS;

/// Where one get puts what it reads: memory asked for once a size is known, before the
/// master answers at the size an early read's source holds, after it at the answer's (the
/// same memory where the two agree).
pub(super) enum Target<'a, 's> {
    /// The whole value, into memory the caller's sink makes (a byte get).
    Sink(&'a mut (dyn ValueSink + 's)),
    /// What the caller wants of the value, into its registered memory: the extents of the
    /// size last asked for are kept here.
    Registered(Want<'a>, Vec<Extent>),
}

impl Target<'_, '_> {
    /// Memory for a value of `size` bytes, and the bytes of it the get returns.
    fn memory<'t>(&'t mut self, client: &'t StoreClient, key: &str, size: u64) -> Result<(Dst<'t>, u64)> {
        match self {
            Target::Sink(sink) => Ok((Dst::Bytes { out: api::sink_buffer(key, &mut **sink, size)?, offset: 0 }, size)),
            Target::Registered(want, extents) => {
                let n;
                (*extents, n) = want.extents(key, size)?;
                Ok((Dst::Registered(extents, client.extents_reach(extents)), n))
            }
        }
    }

    /// Whether the memory takes the whole value in one piece (a sink's, or a single buffer's):
    /// the only memory a disk file is read into early (the file is read whole).
    fn one_piece(&self) -> bool {
        matches!(self, Target::Sink(_) | Target::Registered(Want::Whole([_]), _))
    }

    /// Memory for an early read from `source`, where one goes (see [`Speculative::fits`]):
    /// host memory only, a disk file only into [one piece](Self::one_piece). A sink is asked
    /// only then, and its refusal ends the get; registered memory that does not fit the
    /// size `source` holds (a stale entry's) makes no early read.
    fn early_memory<'t>(
        &'t mut self,
        client: &'t StoreClient,
        key: &str,
        source: &Speculative<'_>,
    ) -> Result<Option<(Dst<'t>, u64)>> {
        let size = source.size();
        let one_piece = self.one_piece();
        match self {
            Target::Sink(_) if !source.fits(size, true) => Ok(None),
            Target::Sink(_) => self.memory(client, key, size).map(Some),
            Target::Registered(want, extents) => {
                let Ok((e, n)) = want.extents(key, size) else { return Ok(None) };
                *extents = e;
                let dst = Dst::Registered(extents, client.extents_reach(extents));
                let fits = !dst.on_device() && source.fits(n, one_piece && dst.whole_in_one(size));
                Ok(fits.then_some((dst, n)))
            }
        }
    }
}

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

    /// One get of `key` into `target`: asks the master for the replicas while an early read
    /// reads into `target`'s memory, where this client knows a source that fits it (the hot
    /// cache's entry, else its disk file of an object that had no other copy), so that the get
    /// costs the larger of the round trip and that read instead of their sum; then the
    /// executor runs the read plan into the memory `target` gives for the answer's size (the
    /// early read's, where the sizes agree), which keeps the early read where the answer
    /// confirms it. Returns the bytes read.
    pub(super) fn get_one(&self, key: &str, mut target: Target<'_, '_>) -> Result<u64> {
        let exec = self.exec();
        let mut source = exec.hot_entry(key);
        let mut early = match &source {
            Some(s) => target.early_memory(self, key, s)?,
            None => None,
        };
        if early.is_none() {
            source = if target.one_piece() { exec.only_file(key) } else { None };
            early = match &source {
                Some(s) => target.early_memory(self, key, s)?,
                None => None,
            };
        }
        let (listed, made) = match (&source, early.as_mut()) {
            // Beside, not while: sending the request and reading the answer on the calling
            // thread cost more than the hand-off to the background runtime (0.95 against
            // 0.90-0.91 of memcpy + master for a warm 10 MiB hot-cache get).
            (Some(source), Some((dst, _))) => {
                let (listed, made) = self.replica_list_beside(key, || exec.read_early(key, source, dst));
                (listed, Some(made))
            }
            _ => (self.replica_list(key), None),
        };
        let early_size = source.as_ref().map(Speculative::size);
        drop(source); // the entry copied goes back: the read looks the answer up itself
        if let Some(made) = &made {
            exec.early_answered(key, made, listed.as_ref());
        }
        let listed = listed?;
        let (mut dst, n) = match early {
            Some(early) if early_size == Some(listed.size) => early,
            _ => target.memory(self, key, listed.size)?,
        };
        Exec { early: std::slice::from_ref(&made), ..self.exec() }.read(key, &listed, &mut dst)?;
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

    /// The batch get into registered memory: one round trip, then the executor. While the
    /// master answers, each key's value that the hot cache holds is copied into the host
    /// memory the key `wants` it in (an early copy), so that a hit costs the larger of the
    /// round trip and the copy instead of their sum; the batch read keeps a copy only where
    /// the answer says the key still is that object, and otherwise reads over it as it would
    /// have. A key whose answer is an error keeps whatever the copy wrote (the caller's memory
    /// holds no value after a failed get). Batches of more than one call's keys, batches whose
    /// hits copy less than [`EARLY_COPY_FROM`](super::plan::EARLY_COPY_FROM) in all, and
    /// clients without a cache, ask first.
    pub(super) fn read_many(&self, keys: &[String], wants: &[Want<'_>]) -> Result<Vec<Result<u64>>> {
        let exec = self.exec();
        let mut held: Vec<Option<(Speculative<'_>, Vec<Extent>, u64)>> = Vec::new();
        if self.hot.is_some() && keys.len() <= MAX_BATCH_KEYS {
            // Hits into device memory are copied once the master confirms them (no early copy).
            held = keys
                .iter()
                .zip(wants)
                .map(|(key, want)| {
                    let source = exec.hot_entry(key)?;
                    let (extents, bytes) = want.extents(key, source.size()).ok()?;
                    (!self.extents_reach(&extents).has_device()).then_some((source, extents, bytes))
                })
                .collect();
        }
        let bytes = held.iter().flatten().map(|(_, _, bytes)| bytes).sum();
        let (lists, early) = if worth_copying_early(bytes) {
            let req = BatchKeyRequest { client_id: self.id.clone(), keys: keys.to_vec(), ..Default::default() };
            let clock = LeaseClock::start();
            let (reply, early) = self.rpc.call_beside(
                |mut c| async move { c.batch_get_replica_list(req).await },
                || -> Vec<Option<Early>> {
                    let early = held.iter().zip(keys).map(|(h, key)| {
                        let (source, extents, _) = h.as_ref()?;
                        Some(exec.read_early(key, source, &mut Dst::Registered(extents, Reach::host())))
                    });
                    early.collect()
                },
            );
            drop(held); // the entries copied go back: the reads look the answers up themselves
            let lists = Self::lists_of(reply?, keys, clock)?;
            for ((key, list), made) in keys.iter().zip(&lists).zip(&early) {
                if let Some(made) = made {
                    exec.early_answered(key, made, list.as_ref());
                }
            }
            (lists, early)
        } else {
            drop(held); // no early copy: the entries go back before the round trip, not after the reads
            (self.batch_replica_lists(keys)?, Vec::new())
        };
        let (lists, results) = Self::split_lists(lists);
        self.read_lists(keys, &lists, wants, results, &early)
    }

    /// The executor's part of a batch get into registered memory, on answers the master gave
    /// (now, or at a get session's start): what each key `wants` of the value `lists` describes.
    /// Keys whose result is an error already are left alone. `early`: what early reads put in
    /// the keys' memory (see [`Self::read_many`]; empty: nothing). Returns the bytes read per
    /// key.
    pub(super) fn read_lists(
        &self,
        keys: &[String],
        lists: &[Option<Listed>],
        wants: &[Want<'_>],
        mut results: Vec<Result<()>>,
        early: &[Option<Early>],
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
