//! How a put goes: the master places it (one key, or a batch in rounds), the bytes go through
//! the executor (lent, staged or zero-copy), then the master commits it or revokes it; an
//! upsert removes what it replaces; the disk tier is handed its copy.

use std::sync::atomic::Ordering;
use std::time::Instant;

use crescent_engine::LocalLoan;

use super::disk::PreparedOffload;
use super::exec::Exec;
use super::plan::{self, Mode, Refusal, Written};
use super::rpc::{self, check};
use super::sg::{Piece, Reach, Src};
use super::{checksum, offload_or_warn, one_per_key, one_value_per_key, StoreApi, StoreClient, LEND_PUT_MIN};
use crate::blank_record;
use crate::error::{Result, StoreError};
use crate::fastrpc::Method;
use crate::proto::{
    BatchKeyRequest, BatchPutStartRequest, Code, KeyRequest, PutCommitBlankRequest, PutOptions, PutStartReply,
    PutStartRequest, ReplicaDescriptor, StatusReply,
};
use crate::protocol::MAX_BATCH_KEYS;

/// A byte value of at least this many bytes put into a blank is written from the caller's
/// memory, lent to the engine, rather than copied into the staging buffer with its record.
/// Below it the copy costs less than the second slice lending makes (the record's): in
/// alternated runs of a Python client putting and getting through one holder over tcp
/// loopback (2026-12-07, release build), lending took 30-55 us off a 512 KiB put's time over
/// its get's and nothing off a 64 KiB one's (55-60 us with, 39-61 us without).
const LEND_BLANK_MIN: u64 = 256 << 10;

/// Whether a put with `options` may go into a blank: one replica placed as the master likes
/// (a blank is a default put's placement), pins its record can carry (a soft pin of the
/// master's default length cannot: the holder does not know it).
fn blank_fits(options: &PutOptions) -> bool {
    options.replica_num <= 1
        && !(options.soft_pin && options.soft_pin_ttl_ms == 0)
        && options.preferred_segment.is_empty()
        && options.preferred_segments.is_empty()
        && !options.replace
}

/// Puts an upsert makes while other writers keep putting the key it removed.
const UPSERT_TRIES: usize = 3;

impl StoreClient {
    /// A put or upsert of a value of plain bytes: one of [`LEND_PUT_MIN`] bytes or more is
    /// written from the caller's memory, lent to the engine for the call
    /// ([`TransferEngine::lend_local`], where no transport needs registered memory), as a
    /// zero-copy put writes; a smaller one (or with rdma up) through the staging buffer.
    pub(super) fn put_value(&self, key: &str, value: &[u8], options: &PutOptions, mode: Mode) -> Result<()> {
        let pieces = [[Piece::new(value.as_ptr() as u64, value.len() as u64)]];
        // Dropped when this returns, after every transfer from the value ended.
        let loans = if pieces[0][0].len >= LEND_PUT_MIN { self.lend_values(pieces.iter().flatten()) } else { None };
        let src = match loans {
            Some(_) => Src::Registered(&pieces[0], Reach::host()),
            None => Src::Bytes(value),
        };
        self.put_retrying(key, value.len() as u64, mode, |started| self.put_one(key, src, options, mode, started))
    }

    /// A put or upsert of the value made of `pieces` of registered memory, in order.
    pub(super) fn put_pieces(&self, key: &str, pieces: &[Piece], options: &PutOptions, mode: Mode) -> Result<()> {
        self.check_registered(pieces.iter().map(|p| (p.addr, p.len)))?;
        let len = pieces.iter().map(|p| p.len).sum();
        self.put_retrying(key, len, mode, |started| {
            self.put_one(key, Src::Registered(pieces, self.reach(pieces)), options, mode, started)
        })
    }

    /// A put or upsert of the value made of `parts` one after another: gathered as the parts
    /// are copied to the replicas, the same single copy a byte put makes.
    pub(super) fn put_parts(&self, key: &str, parts: &[&[u8]], options: &PutOptions, mode: Mode) -> Result<()> {
        let len = parts.iter().map(|p| p.len() as u64).sum();
        self.put_retrying(key, len, mode, |started| self.put_one(key, Src::Parts(parts), options, mode, started))
    }

    /// Puts or upserts of several values (bytes); one result per key.
    pub(super) fn put_values(
        &self,
        keys: &[String],
        values: &[&[u8]],
        options: &PutOptions,
        mode: Mode,
    ) -> Result<Vec<Result<()>>> {
        one_value_per_key(keys.len(), values.len())?;
        let pieces: Vec<[Piece; 1]> = values.iter().map(|v| [Piece::new(v.as_ptr() as u64, v.len() as u64)]).collect();
        let (srcs, _loans) = self.batch_sources(values, &pieces);
        self.put_many(keys, &srcs, options, mode)
    }

    /// Puts or upserts of values each made of pieces of registered memory, in order: all
    /// remote writes go in one engine batch.
    pub(super) fn put_many_pieces(
        &self,
        keys: &[String],
        values: &[&[Piece]],
        options: &PutOptions,
        mode: Mode,
    ) -> Result<Vec<Result<()>>> {
        one_value_per_key(keys.len(), values.len())?;
        self.check_registered(values.iter().flat_map(|v| v.iter().map(|p| (p.addr, p.len))))?;
        let srcs: Vec<Src<'_>> = values.iter().map(|v| Src::Registered(v, self.reach(v))).collect();
        self.put_many(keys, &srcs, options, mode)
    }

    /// Lends the memory of the pieces `values` to the engine for one call
    /// ([`TransferEngine::lend_local`]): every value's, or none — where a transport needs
    /// registered memory (rdma), or a value overlaps memory the caller registered; the caller
    /// then copies the values through the staging buffer. Each loan ends when it is dropped,
    /// which the caller does after every transfer from it ended.
    pub(super) fn lend_values<'p>(&self, values: impl IntoIterator<Item = &'p Piece>) -> Option<Vec<LocalLoan<'_>>> {
        let mut loans = Vec::new();
        for p in values {
            match self.engine.lend_local(None, p.addr, p.len) {
                Ok(Some(loan)) => loans.push(loan),
                Ok(None) => return None,
                Err(e) => {
                    tracing::debug!("byte values put through the staging buffer: {e}");
                    return None;
                }
            }
        }
        Some(loans)
    }

    /// The sources of a batch of byte values: lent to the engine, so that they move in one
    /// engine batch as `batch_put_from`'s do, where every value can be (`pieces`, one per value,
    /// and the loans, kept by the caller until the batch ended); else plain bytes, copied
    /// through the staging buffer one after another.
    pub(super) fn batch_sources<'v>(
        &self,
        values: &'v [&'v [u8]],
        pieces: &'v [[Piece; 1]],
    ) -> (Vec<Src<'v>>, Option<Vec<LocalLoan<'_>>>) {
        let loans = if values.iter().all(|v| !v.is_empty()) { self.lend_values(pieces.iter().flatten()) } else { None };
        let srcs = match loans {
            Some(_) => pieces.iter().map(|p| Src::Registered(p, Reach::host())).collect(),
            None => values.iter().map(|v| Src::Bytes(v)).collect(),
        };
        (srcs, loans)
    }

    /// One key's write: a put, and for an upsert that finds the key, its removal and a put
    /// again (another writer may put the key in between: a few tries). `started` is set to the
    /// version of each put the master starts ([`Self::put_retrying`] asks about it after a
    /// master change).
    pub(super) fn put_one(
        &self,
        key: &str,
        src: Src<'_>,
        options: &PutOptions,
        mode: Mode,
        started: &mut Option<u64>,
    ) -> Result<()> {
        let options = &*mode.options(options);
        if mode == Mode::Put && blank_fits(options) {
            if let Some(done) = self.put_in_blank(key, src, options, started) {
                return match done {
                    Err(e @ StoreError::AlreadyExists(_)) => match plan::refusal(e, mode) {
                        Refusal::Failed(e) | Refusal::Replace(e) => Err(e),
                        Refusal::Kept => Ok(()),
                    },
                    done => done,
                };
            }
        }
        let mut refused = None;
        for _ in 0..UPSERT_TRIES {
            let e = match self.put_new(key, src, options, started)? {
                Written::Refused(e) => e,
                Written::Done => return Ok(()),
                Written::Failed(e) => return Err(e),
            };
            match plan::refusal(e, mode) {
                Refusal::Kept => return Ok(()),
                Refusal::Failed(e) => return Err(e),
                Refusal::Replace(e) => {
                    self.remove_to_replace(key)?;
                    refused = Some(e);
                }
            }
        }
        Err(refused.unwrap_or_else(|| StoreError::AlreadyExists(key.to_string())))
    }

    /// A put into a blank the pool holds for its size ([`super::blanks`]): the value and its
    /// record in one transfer, then one call to commit it. `None` where there is no blank to
    /// use, or where the blank failed in a way the usual put gets past (the master forgot it,
    /// the transfer to its holder failed: the blank is left to expire); the usual put then
    /// runs. A master change is returned as it is, for [`Self::put_retrying`] to look whether
    /// the commit landed.
    fn put_in_blank(
        &self,
        key: &str,
        src: Src<'_>,
        options: &PutOptions,
        started: &mut Option<u64>,
    ) -> Option<Result<()>> {
        let len = src.len();
        // Only values whose checksum costs less than the round trip it saves (see
        // `checksum::START_MAX`): a larger one starts at the master, which takes its checksum
        // while the master places it.
        if len == 0 || len > checksum::START_MAX || key.len() > blank_record::KEY_MAX || self.disk.is_some() {
            return None;
        }
        if let Src::Registered(_, reach) = &src {
            if reach.has_device() {
                return None;
            }
        }
        let start = || Self::start_refilling_blanks(self.me.clone(), self.blanks.clone());
        let blank = self.blanks.take(len, Instant::now(), start)?;
        let crc = checksum::of_src(&src)?;
        let record = blank_record::Record {
            blank: blank.id,
            key: key.to_string(),
            size: len,
            crc,
            hard_pin: options.hard_pin,
            soft_pin_ms: options.soft_pin_ttl_ms,
        }
        .encode()?;
        // The value and its record, one after the other: one transfer.
        let parts: Vec<&[u8]> = match src {
            Src::Bytes(value) => vec![value, &record],
            Src::Parts(value) => value.iter().copied().filter(|p| !p.is_empty()).chain([&record[..]]).collect(),
            Src::Registered(..) => Vec::new(),
        };
        let pieces: Vec<Piece>;
        let loans;
        let _loan;
        let with_record = match src {
            Src::Bytes(_) | Src::Parts(_) => {
                // From [`LEND_BLANK_MIN`] up, written from where the bytes are, lent to the
                // engine for the call: no master round trip hides the copy into the staging
                // buffer here (`put_new`'s first piece). Smaller values, and values that cannot
                // be lent (rdma), go through the staging buffer, as one piece with the record.
                pieces = match len >= LEND_BLANK_MIN {
                    true => parts.iter().map(|p| Piece::new(p.as_ptr() as u64, p.len() as u64)).collect(),
                    false => Vec::new(),
                };
                loans = if pieces.is_empty() { None } else { self.lend_values(&pieces) };
                match loans {
                    Some(_) => Src::Registered(&pieces, Reach::host()),
                    None => Src::Parts(&parts),
                }
            }
            Src::Registered(value, reach) => {
                // The record is lent to the engine for the call, as a byte value is.
                _loan = match self.engine.lend_local(None, record.as_ptr() as u64, record.len() as u64) {
                    Ok(Some(loan)) => loan,
                    _ => return None,
                };
                pieces =
                    value.iter().copied().chain([Piece::new(record.as_ptr() as u64, record.len() as u64)]).collect();
                Src::Registered(&pieces, reach)
            }
        };
        self.hot_invalidate(key);
        *started = Some(blank.id);
        let replica = ReplicaDescriptor { size: len + record.len() as u64, ..blank.replica };
        let exec = self.exec();
        if let Err(e) = exec.write(key, std::slice::from_ref(&replica), &with_record, None) {
            tracing::debug!("the put of {key:?} into blank {} failed ({e}); putting it the usual way", blank.id);
            return None;
        }
        let req = PutCommitBlankRequest {
            client_id: self.id.clone(),
            key: key.to_string(),
            blank_id: blank.id,
            size: len,
            checksum: Some(crate::proto::Checksum { crc32: crc }),
            options: Some(options.clone()),
        };
        let commit = |mut c: rpc::Client, req| async move { c.put_commit_blank(req).await };
        match self.rpc.unary(Method::PutCommitBlank, req, commit).and_then(|r| check(r.status, key)) {
            Ok(()) => {
                self.last_put_local.store(exec.local_replica(&replica, len).is_some(), Ordering::Relaxed);
                Some(Ok(()))
            }
            Err(e @ StoreError::AlreadyExists(_)) => Some(Err(e)),
            Err(e) if e.is_master_change() => Some(Err(e)),
            Err(e) => {
                if matches!(e, StoreError::BlankGone(_)) {
                    self.blanks.forget();
                }
                tracing::debug!("the commit of {key:?} in blank {} failed ({e}); putting it the usual way", blank.id);
                *started = None;
                None
            }
        }
    }

    /// An upsert's removal of the object it replaces (not forced: a reader's lease protects
    /// it); gone meanwhile is as good.
    pub(super) fn remove_to_replace(&self, key: &str) -> Result<()> {
        match self.remove(key) {
            Ok(()) | Err(StoreError::NotFound(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// A put as the master sees it: `Refused` when it would not start it, `Done` once
    /// committed; any other failure is an error (the put revoked). `started` is set to the
    /// version the master gives the put once it starts it.
    pub(super) fn put_new(
        &self,
        key: &str,
        src: Src<'_>,
        options: &PutOptions,
        started: &mut Option<u64>,
    ) -> Result<Written> {
        let len = src.len();
        if len == 0 {
            return Err(StoreError::invalid(format!("empty value for key {key:?}")));
        }
        self.hot_invalidate(key);
        let exec = self.exec();
        // The holders are told of the placement with the value's checksum, and the commit then
        // needs no further word from them (see `checksum::START_MAX`). For a value of
        // `checksum::BEHIND_MIN` or more, where the hot calls go to the master's fast port, the
        // checksum is taken while the master places the put and sent right behind the start
        // (`PutChecksum`); else it is taken before, and the start carries it.
        let behind = len >= checksum::BEHIND_MIN && self.rpc.has_fast_rpc();
        let crc_first = if behind { None } else { self.start_checksum(&src) };
        let req = PutStartRequest {
            client_id: self.id.clone(),
            key: key.to_string(),
            size: len,
            options: Some(options.clone()),
            checksum: crc_first.map(|crc32| crate::proto::Checksum { crc32 }),
        };
        let start = |mut c: rpc::Client, req: PutStartRequest| async move { c.put_start(req).await };
        // While the master places the object: the disk tier's copy of the value, and a byte
        // put's first piece in the staging buffer (unless the last put stayed in our own
        // segment, where nothing is staged).
        // When the last put stayed in our own segment, this one likely does too: the disk
        // tier then takes only the CRC now and writes the file from our replica.
        let local = self.last_put_local.load(Ordering::Relaxed);
        let stage_early = src.is_plain() && !local;
        let meanwhile = |fast: bool| {
            let crc = if behind { self.start_checksum(&src) } else { crc_first };
            let told = crc.filter(|_| behind && fast).map(|crc32| {
                let checksum = Some(crate::proto::Checksum { crc32 });
                (Method::PutChecksum, KeyRequest { client_id: self.id.clone(), key: key.to_string(), checksum })
            });
            let offload = self.disk.as_ref().and_then(|d| offload_or_warn(key, d.prepare(key, &src, local)));
            let first = if stage_early { exec.stage_first_piece(&src) } else { Ok(None) };
            ((offload, first, crc), told)
        };
        let (reply, (offload, first_piece, crc), told) =
            self.rpc.unary_then::<_, _, _, _, _, _, StatusReply>(Method::PutStart, req.clone(), start, meanwhile);
        if let Some(Err(e)) = told.map(|r| r.and_then(|r| check(r.status, key))) {
            // The commit then waits for the holders, as a put started without a checksum does.
            tracing::debug!("the checksum of the put of {key:?} did not reach the master: {e}");
        }
        let checksum = self.end_checksum(crc);
        let mut reply = reply?;
        let mut begun = check(reply.status.take(), key);
        // No room: after a restart (or once it dropped us) the master has no segment of ours
        // until we remount. Remount now and place the value again, rather than fail until the
        // heartbeat remounts.
        if matches!(begun, Err(StoreError::NoSpace { .. })) && self.remounted() {
            reply = self.rpc.unary(Method::PutStart, req, start)?;
            begun = check(reply.status.take(), key);
        }
        if let Err(e) = begun {
            return Ok(Written::Refused(e));
        }
        *started = Some(reply.version);
        let written = first_piece.and_then(|first| exec.write(key, &reply.replicas, &src, first));
        if let Ok(all_local) = written {
            self.last_put_local.store(all_local, Ordering::Relaxed);
        }
        self.finish_put(key, written.map(|_| ()), checksum)?;
        if let Some(offload) = offload {
            self.queue_offload(&exec, offload, reply.version, &reply.replicas, &src);
        }
        Ok(Written::Done)
    }

    /// Commits a put whose bytes were written (with the value's `checksum`, if taken); revokes
    /// one that failed, whatever the reason.
    pub(super) fn finish_put(&self, key: &str, written: Result<()>, checksum: Option<u32>) -> Result<()> {
        let req = KeyRequest {
            client_id: self.id.clone(),
            key: key.to_string(),
            checksum: checksum.map(|crc32| crate::proto::Checksum { crc32 }),
        };
        match written {
            Ok(()) => {
                let r = self.rpc.unary(Method::PutEnd, req, |mut c, req| async move { c.put_end(req).await })?;
                check(r.status, key)
            }
            Err(e) => {
                if let Err(revoke) = self
                    .rpc
                    .unary(Method::PutRevoke, req, |mut c, req| async move { c.put_revoke(req).await })
                    .and_then(|r| check(r.status, key))
                {
                    tracing::warn!("revoking the failed put of {key:?}: {revoke}");
                }
                Err(e)
            }
        }
    }

    /// Hands a committed put's offload to the disk tier's writers, who read the value from the
    /// put's replica in our own segment when it has one.
    pub(super) fn queue_offload(
        &self,
        exec: &Exec<'_>,
        offload: PreparedOffload,
        version: u64,
        replicas: &[ReplicaDescriptor],
        src: &Src<'_>,
    ) {
        let Some(disk) = &self.disk else { return };
        let resident = self
            .segment
            .as_ref()
            .and_then(|segment| Some((&*replicas.iter().find_map(|r| exec.local_replica(r, src.len()))?, segment)));
        disk.queue(offload, version, resident, src);
    }

    /// The batch write: [`Self::put_once`], then, for an upsert, the keys that existed are
    /// removed and put again (a few rounds, as [`Self::put_one`]). `started[i]` is set to the
    /// version of each put of key `i` the master starts.
    pub(super) fn put_many_rounds(
        &self,
        keys: &[String],
        srcs: &[Src<'_>],
        options: &PutOptions,
        mode: Mode,
        started: &mut [Option<u64>],
    ) -> Result<Vec<Result<()>>> {
        let options = &*mode.options(options);
        let (mut results, mut replace) = self.put_once(keys, srcs, options, mode, started)?;
        for _ in 1..UPSERT_TRIES {
            if replace.is_empty() {
                break;
            }
            let mut again = Vec::with_capacity(replace.len());
            for i in replace {
                match self.remove_to_replace(&keys[i]) {
                    Ok(()) => again.push(i),
                    Err(e) => results[i] = Err(e),
                }
            }
            let sub_keys: Vec<String> = again.iter().map(|&i| keys[i].clone()).collect();
            let sub_srcs: Vec<Src<'_>> = again.iter().map(|&i| srcs[i]).collect();
            let mut sub_started: Vec<Option<u64>> = again.iter().map(|&i| started[i]).collect();
            let round = self.put_once(&sub_keys, &sub_srcs, options, mode, &mut sub_started);
            for (&i, v) in again.iter().zip(sub_started) {
                started[i] = v;
            }
            let (sub_results, sub_replace) = round?;
            for (&i, r) in again.iter().zip(sub_results) {
                results[i] = r;
            }
            replace = sub_replace.into_iter().map(|j| again[j]).collect();
        }
        Ok(results)
    }

    /// The batch put, with the keys that fail for a master change put again ([`put_retry`]).
    pub(super) fn put_many(
        &self,
        keys: &[String],
        srcs: &[Src<'_>],
        options: &PutOptions,
        mode: Mode,
    ) -> Result<Vec<Result<()>>> {
        let sizes: Vec<u64> = srcs.iter().map(Src::len).collect();
        self.batch_put_retrying(keys, &sizes, mode, |todo, started| {
            self.put_some(keys, srcs, options, mode, todo, started)
        })
    }

    /// [`Self::put_many_rounds`] of the keys at the indices `todo`; `started` is by index into
    /// `keys`.
    pub(super) fn put_some(
        &self,
        keys: &[String],
        srcs: &[Src<'_>],
        options: &PutOptions,
        mode: Mode,
        todo: &[usize],
        started: &mut [Option<u64>],
    ) -> Result<Vec<Result<()>>> {
        let ks: Vec<String> = todo.iter().map(|&i| keys[i].clone()).collect();
        let ss: Vec<Src<'_>> = todo.iter().map(|&i| srcs[i]).collect();
        let mut sub_started: Vec<Option<u64>> = todo.iter().map(|&i| started[i]).collect();
        let r = self.put_many_rounds(&ks, &ss, options, mode, &mut sub_started);
        for (&i, v) in todo.iter().zip(sub_started) {
            started[i] = v;
        }
        r
    }

    /// The batch put: placed in one round trip, written by the executor (registered values in
    /// one engine batch), then committed and revoked in one round trip each. Returns the
    /// results and the keys an upsert is to replace; `started[i]` is set to the version of
    /// key `i`'s put if the master started it.
    #[allow(clippy::type_complexity)]
    pub(super) fn put_once(
        &self,
        keys: &[String],
        srcs: &[Src<'_>],
        options: &PutOptions,
        mode: Mode,
        started: &mut [Option<u64>],
    ) -> Result<(Vec<Result<()>>, Vec<usize>)> {
        let sizes: Vec<u64> = srcs.iter().map(Src::len).collect();
        if let Some(i) = sizes.iter().position(|s| *s == 0) {
            return Err(StoreError::invalid(format!("empty value for key {:?}", keys[i])));
        }
        keys.iter().for_each(|k| self.hot_invalidate(k));
        let exec = self.exec();
        // As a single put's (see `put_new`): each value's checksum before the start, or none
        // (the bound is on the batch's bytes: it saves one owner round trip in all).
        let take = checksum::take_at_start(self.config.verify_checksums, sizes.iter().copied());
        let crcs: Vec<Option<u32>> = srcs.iter().map(|src| if take { checksum::of_src(src) } else { None }).collect();
        let (starts, offloads) = self.batch_put_start(keys, &sizes, srcs, &crcs, options)?;
        let mut results: Vec<Result<()>> = Vec::with_capacity(keys.len());
        let mut placed: Vec<(Vec<ReplicaDescriptor>, u64)> = Vec::with_capacity(keys.len());
        for (i, start) in starts.into_iter().enumerate() {
            match start {
                Ok(p) => {
                    started[i] = Some(p.1);
                    placed.push(p);
                    results.push(Ok(()));
                }
                Err(e) => {
                    placed.push((Vec::new(), 0));
                    results.push(Err(e));
                }
            }
        }
        let begun: Vec<bool> = results.iter().map(Result::is_ok).collect();
        let replicas: Vec<&[ReplicaDescriptor]> = placed.iter().map(|(r, _)| &r[..]).collect();
        match exec.write_batch(keys, &replicas, srcs, &mut results) {
            Ok(all_local) => self.last_put_local.store(all_local, Ordering::Relaxed),
            Err(e) => {
                // The batch failed as a whole: every put it started goes back at once.
                let revoke: Vec<String> =
                    keys.iter().zip(&begun).filter(|(_, s)| **s).map(|(k, _)| k.clone()).collect();
                self.batch_revoke(revoke);
                return Err(e);
            }
        }
        let written = results
            .into_iter()
            .zip(begun)
            .map(|(r, begun)| match (r, begun) {
                (Ok(()), _) => Written::Done,
                (Err(e), true) => Written::Failed(e),
                (Err(e), false) => Written::Refused(e),
            })
            .collect();
        let (results, settled) = self.batch_put_finish(keys, &crcs, written, mode)?;
        let mut offloads: Vec<Option<PreparedOffload>> = offloads;
        for &i in &settled.commit {
            if let (Ok(()), Some(offload)) = (&results[i], offloads.get_mut(i).and_then(Option::take)) {
                self.queue_offload(&exec, offload, placed[i].1, &placed[i].0, &srcs[i]);
            }
        }
        Ok((results, settled.replace))
    }

    /// Per key: the replicas to write and the object's version; and the values' disk tier
    /// images, made while the master places them.
    #[allow(clippy::type_complexity)]
    pub(super) fn batch_put_start(
        &self,
        keys: &[String],
        sizes: &[u64],
        srcs: &[Src<'_>],
        crcs: &[Option<u32>],
        options: &PutOptions,
    ) -> Result<(Vec<Result<(Vec<ReplicaDescriptor>, u64)>>, Vec<Option<PreparedOffload>>)> {
        if keys.len() <= MAX_BATCH_KEYS {
            return self.batch_put_start_call(keys, sizes, srcs, crcs, options);
        }
        // One call per range of keys; where a later call fails, the puts the earlier ones
        // started go back before the error is returned.
        let (mut starts, mut offloads) = (Vec::with_capacity(keys.len()), Vec::new());
        let mut from = 0;
        while from < keys.len() {
            let to = keys.len().min(from + MAX_BATCH_KEYS);
            match self.batch_put_start_call(
                &keys[from..to],
                &sizes[from..to],
                &srcs[from..to],
                &crcs[from..to],
                options,
            ) {
                Ok((s, o)) => {
                    starts.extend(s);
                    offloads.extend(o);
                }
                Err(e) => {
                    let started = starts.iter().enumerate().filter(|(_, s)| s.is_ok()).map(|(i, _)| keys[i].clone());
                    self.batch_revoke(started.collect());
                    return Err(e);
                }
            }
            from = to;
        }
        Ok((starts, offloads))
    }

    /// [`Self::batch_put_start`] of at most [`MAX_BATCH_KEYS`] keys: one call to the master.
    #[allow(clippy::type_complexity)]
    pub(super) fn batch_put_start_call(
        &self,
        keys: &[String],
        sizes: &[u64],
        srcs: &[Src<'_>],
        crcs: &[Option<u32>],
        options: &PutOptions,
    ) -> Result<(Vec<Result<(Vec<ReplicaDescriptor>, u64)>>, Vec<Option<PreparedOffload>>)> {
        let checksums = match crcs.iter().all(Option::is_some) {
            true => crcs.iter().map(|c| crate::proto::Checksum { crc32: c.expect("all some") }).collect(),
            false => Vec::new(),
        };
        let req = BatchPutStartRequest {
            client_id: self.id.clone(),
            keys: keys.to_vec(),
            sizes: sizes.to_vec(),
            options: Some(options.clone()),
            checksums,
        };
        let start = |mut c: rpc::Client, req: BatchPutStartRequest| async move { c.batch_put_start(req).await };
        let (reply, offloads) = match &self.disk {
            // The disk tier's copies of the values (or their CRCs, see `put_one`) are made
            // while the master places them.
            Some(disk) => {
                let local = self.last_put_local.load(Ordering::Relaxed);
                self.rpc.unary_while(Method::BatchPutStart, req.clone(), start, || {
                    keys.iter()
                        .zip(srcs)
                        .map(|(key, src)| offload_or_warn(key, disk.prepare(key, src, local)))
                        .collect()
                })
            }
            None => (self.rpc.unary(Method::BatchPutStart, req.clone(), start), Vec::new()),
        };
        let mut reply = reply?;
        one_per_key(reply.items.len(), keys.len())?;
        // No room for any key: maybe the master restarted and has no segment of ours yet
        // (see `put_one`).
        let no_space = |items: &[PutStartReply]| {
            items.iter().all(|i| i.status.as_ref().is_some_and(|s| s.code == Code::NoSpace as i32))
        };
        if !keys.is_empty() && no_space(&reply.items) && self.remounted() {
            reply = self.rpc.unary(Method::BatchPutStart, req, start)?;
            one_per_key(reply.items.len(), keys.len())?;
        }
        let starts = reply
            .items
            .into_iter()
            .zip(keys)
            .map(|(item, key)| check(item.status, key).map(|()| (item.replicas, item.version)))
            .collect();
        Ok((starts, offloads))
    }

    /// Tells the master how each put of a batch ended: commits the written ones, revokes
    /// every other one it had started ([`plan::settle`]). Returns each key's result and the
    /// settlement.
    pub(super) fn batch_put_finish(
        &self,
        keys: &[String],
        crcs: &[Option<u32>],
        written: Vec<Written>,
        mode: Mode,
    ) -> Result<(Vec<Result<()>>, plan::Settled)> {
        let (settled, mut results) = plan::settle(written, mode);
        self.batch_revoke(settled.revoke.iter().map(|&i| keys[i].clone()).collect());
        let commit = &settled.commit;
        for commit in commit.chunks(MAX_BATCH_KEYS) {
            // Taken before the start (with checksums on, always).
            // One per key or none (a value in device memory has none: see `checksum::of_src`).
            let all = commit.iter().all(|&i| crcs[i].is_some());
            let checksums = match self.config.verify_checksums && all {
                true => commit
                    .iter()
                    .filter_map(|&i| Some(crate::proto::Checksum { crc32: self.end_checksum(crcs[i])? }))
                    .collect(),
                false => Vec::new(),
            };
            let req = BatchKeyRequest {
                client_id: self.id.clone(),
                keys: commit.iter().map(|&i| keys[i].clone()).collect(),
                checksums,
            };
            let reply =
                self.rpc.unary(Method::BatchPutEnd, req, |mut c, req| async move { c.batch_put_end(req).await })?;
            one_per_key(reply.statuses.len(), commit.len())?;
            for (&i, status) in commit.iter().zip(reply.statuses) {
                results[i] = check(Some(status), &keys[i]);
            }
        }
        Ok((results, settled))
    }

    pub(super) fn batch_revoke(&self, keys: Vec<String>) {
        if keys.is_empty() {
            return;
        }
        for keys in keys.chunks(MAX_BATCH_KEYS) {
            let req = BatchKeyRequest { client_id: self.id.clone(), keys: keys.to_vec(), ..Default::default() };
            if let Err(e) =
                self.rpc.unary(Method::BatchPutRevoke, req, |mut c, req| async move { c.batch_put_revoke(req).await })
            {
                tracing::warn!("revoking failed puts: {e}");
            }
        }
    }
}
