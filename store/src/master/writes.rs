//! A put's calls, as the master drives them: its start (allocation of its replicas, the
//! pending commit its owners are told of), its commit (the owners' acknowledgements its
//! answer waits for) and its revocation. The object records and the checks are the core's
//! ([`super::core`]); this module takes the locks, reads the clock and queues the owners' news.

use std::sync::atomic::Ordering;
use std::time::Instant;

use smallvec::SmallVec;

use super::core::limits::check_put;
use super::core::puts;
use super::objects;
use super::shards::{self, Locked};
use super::{allocation, check_key, owners, tenant, Master};
use crate::allocator::Block;
use crate::error::{Result, StoreError};
use crate::proto::{EventKind, PutOptions, ReplicaDescriptor};

/// A put being committed ([`Master::put_end_begin`]): what its answer waits for.
#[derive(Debug)]
pub struct Commit {
    /// The object's key.
    pub key: String,
    /// The version being committed.
    pub version: u64,
    /// The owners' acknowledgements of its commit news: of the pending commit sent at the
    /// put's start (usually in already), or of the commit sent now (a put without a checksum).
    pub wait: owners::AckWait,
    /// The owners were told at the put's start (a pending commit): once committed, they are
    /// told it is complete, and the answer does not wait for that.
    pub(super) pending: bool,
}

/// A commit begun (`Master::begin_commit`).
pub(super) struct Begun {
    pub(super) version: u64,
    /// The news (segment, seq) whose acknowledgements the commit needs.
    pub(super) news: Vec<(u64, u64)>,
    /// Those are the pending commit sent at the put's start.
    pub(super) pending: bool,
}

/// How a put starts ([`Master::put_start_checked`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct StartHow {
    /// The checksum its writer took of the value (none: not taken).
    pub(super) crc: Option<u32>,
    /// Send the owners' news at once.
    pub(super) flush: bool,
    /// The caller evicted for it already.
    pub(super) evicted: bool,
}

impl Master {
    /// Starts a put of `size` bytes under `key`: allocates its replicas per `opts` (evicting if
    /// needed) and returns where to write them and the object's new version. The put must end
    /// ([`Self::put_end_begin`], then [`Self::put_end_finish`]) or be revoked within the put
    /// timeout.
    pub fn put_start(
        &self,
        client_id: &str,
        key: &str,
        size: u64,
        opts: &PutOptions,
    ) -> Result<(Vec<ReplicaDescriptor>, u64)> {
        self.put_start_checked(client_id, key, size, opts, None, true)
    }

    /// [`Self::put_start`] of a value whose CRC-32 its writer took before (`crc`): the owners
    /// of its replicas are told of the placement now, with the checksum (a *pending* commit,
    /// see `owners`), so that its end needs no further word from them. `flush`: send the
    /// owners' news now (a batch sends them once, with [`Self::flush_owner_news`]).
    pub fn put_start_checked(
        &self,
        client_id: &str,
        key: &str,
        size: u64,
        opts: &PutOptions,
        crc: Option<u32>,
        flush: bool,
    ) -> Result<(Vec<ReplicaDescriptor>, u64)> {
        let how = StartHow { crc, flush, evicted: false };
        let r = self.put_start_how(client_id, key, size, opts, how, Instant::now());
        // (Errors are counted where they become a reply's status, as every RPC's are.)
        match &r {
            Ok(_) => {
                self.metrics.puts.inc();
                self.metrics.mooncake.value_size.observe(size as f64);
            }
            Err(StoreError::NoSpace { .. }) => self.metrics.mooncake.put_start_alloc_failures.inc(),
            Err(_) => {}
        }
        self.update_gauges();
        r
    }

    /// A put started at `now` without a checksum (unit tests).
    #[cfg(test)]
    pub(super) fn put_start_inner(
        &self,
        client_id: &str,
        key: &str,
        size: u64,
        opts: &PutOptions,
        now: Instant,
    ) -> Result<(Vec<ReplicaDescriptor>, u64)> {
        self.put_start_how(client_id, key, size, opts, StartHow { crc: None, flush: true, evicted: false }, now)
    }

    pub(super) fn put_start_how(
        &self,
        client_id: &str,
        key: &str,
        size: u64,
        opts: &PutOptions,
        how: StartHow,
        now: Instant,
    ) -> Result<(Vec<ReplicaDescriptor>, u64)> {
        self.make_metadata_room(key, size, opts.replica_num.max(1), now)?;
        let mut evict = false;
        let mut r = self.put_start_locked(client_id, key, size, opts, now, &mut evict, how);
        if let Err(StoreError::NoSpace { size, replicas, .. }) = &r {
            if evict {
                // No room: evict what this put needs (the tenant's objects: only they free its
                // segments; a few objects, not a round), then try once more (evicted ranges in
                // quarantine come back when their owners acknowledge: the service tries again
                // then). The round that makes room ahead of the next puts runs off this call.
                let tenant = tenant::tenant_of(key);
                let freed = self.evict_in(now, size * *replicas as u64, Some(tenant));
                tracing::debug!("put of {key:?} found no room; evicted {freed} bytes");
                self.state.lock().core.pressure = true;
                r = self.put_start_locked(
                    client_id,
                    key,
                    *size,
                    opts,
                    now,
                    &mut evict,
                    StartHow { evicted: true, ..how },
                );
            }
        }
        if evict {
            self.evict_soon(now);
        }
        r
    }

    /// [`Self::put_start_how`] under the key's locks; sets `evict` when eviction is wanted
    /// (above the high watermark, or no room: then it answers [`StoreError::NoSpace`], and
    /// the caller evicts and calls again with `how.evicted`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn put_start_locked(
        &self,
        client_id: &str,
        key: &str,
        size: u64,
        opts: &PutOptions,
        now: Instant,
        evict: &mut bool,
        how: StartHow,
    ) -> Result<(Vec<ReplicaDescriptor>, u64)> {
        let StartHow { crc, flush, evicted } = how;
        let replicas = check_put(key, size, opts.replica_num)?;
        let mut st = self.lock_key(key);
        self.fence.check(now)?;
        if st.objects.contains_key(key) {
            return Err(StoreError::AlreadyExists(key.to_string()));
        }
        // A key's replicas go only to segments of its tenant's clients ([`tenant`]).
        let tenant = tenant::tenant_of(key);
        let memory_segments = st.core.memory_segments_of(tenant);
        if (memory_segments as u32) < replicas {
            return Err(StoreError::NoSpace {
                size,
                replicas,
                detail: format!("{memory_segments} memory segment(s) mounted; replicas need distinct segments"),
            });
        }
        Self::release_ended_holds(&mut st, now);
        let blocks = match allocation::allocate(&mut st.core, &*self.allocator, tenant, size, replicas, opts) {
            Some(b) => b,
            None => {
                // No room: the caller evicts (other shards than this key's) and asks again.
                *evict |= !evicted;
                return Err(StoreError::NoSpace {
                    size,
                    replicas,
                    detail: "every segment is full of leased, pinned or unfinished objects".into(),
                });
            }
        };
        for (segment_id, _) in &blocks {
            if let Some(seg) = st.core.segments.get_mut(segment_id) {
                seg.load.puts.record(now);
            }
        }
        let version = st.core.take_version();
        let soft_pin_until = puts::soft_pin_until(opts, self.config.default_soft_pin_ttl, now);
        let disk = Self::disk_of_client(&st, client_id);
        let writer = Some(st.core.names.writer(client_id, disk.as_deref()));
        let object = puts::new_object(size, version, blocks, writer, opts, soft_pin_until, crc, now);
        let descriptors = Self::describe(&st, &object);
        st.objects.insert(key.to_string(), object);
        if crc.is_some() {
            self.queue_pending(&mut st, key, now);
        }
        st.window.put_started(key, version, opts.replace, now);
        // Above the high watermark: make room ahead of the next puts (off this call).
        *evict |= self.above_watermark(&st);
        if flush {
            self.flush_news(&mut st);
        }
        Ok((descriptors, version))
    }

    /// The pending commit of the put of `key` (started, its checksum known): each owner learns
    /// the placement, with the checksum, while the bytes move (the caller flushes the news).
    fn queue_pending(&self, st: &mut Locked<'_>, key: &str, now: Instant) {
        let object = &st.objects[key];
        let what = owners::Announced {
            key,
            version: object.version,
            size: object.size,
            pins: Self::pins_of(object),
            checksum: object.checksum,
            pending_for: Some(self.config.put_timeout),
        };
        let placed: SmallVec<[(u64, Block); 2]> = object.replicas.iter().map(|r| (r.segment_id, r.block)).collect();
        for (i, (segment_id, block)) in placed.into_iter().enumerate() {
            let seq = Self::queue_commit(st, segment_id, block, &what, now);
            st.objects.get_mut(key).expect("looked up above").replicas[i].set_news(seq);
        }
    }

    /// The checksum of a put started without one, taken by its writer while the master placed
    /// it (`PutChecksum`, right behind `PutStart` on the fast RPC port): kept with the object,
    /// and its owners told of the placement now, a pending commit as a put started with it
    /// has, so that the commit needs no further word from them. A put committed or told
    /// already is left as it is; a second, different checksum is the caller's mistake.
    pub fn put_checksum(&self, client_id: &str, key: &str, crc: u32) -> Result<()> {
        check_key(key)?;
        let now = Instant::now();
        let mut st = self.lock_key(key);
        self.fence.check(now)?;
        let known = st.core.clients.contains_key(client_id);
        let (_, complete) = puts::check_commit(st.objects.get(key), known, client_id, key)?;
        let object = st.objects.get_mut(key).expect("checked above");
        if let Some(e) = puts::checksum_changed(key, object.checksum.get(), Some(crc)) {
            return Err(e);
        }
        if complete || object.replicas.iter().any(|r| r.news().is_some()) {
            return Ok(());
        }
        object.checksum = objects::Checksum::new(Some(crc));
        self.queue_pending(&mut st, key, now);
        self.flush_news(&mut st);
        Ok(())
    }

    /// Starts committing a put: its replicas' owners are told; the commit completes with
    /// [`Self::put_end_finish`] once they acknowledged (or the wait timed out).
    /// `checksum`: the CRC-32 the writer took of the value (none: not taken), kept with the
    /// object and handed out with its replica lists.
    pub fn put_end_begin(&self, client_id: &str, key: &str, checksum: Option<u32>) -> Result<Commit> {
        check_key(key)?;
        let now = Instant::now();
        let mut st = self.lock_key(key);
        self.fence.check(now)?;
        let begun = Self::begin_commit(&mut st, client_id, key, checksum, now);
        self.flush_news(&mut st);
        let Begun { version, news, pending } = begun?;
        Ok(Commit { key: key.to_string(), version, wait: Self::waits_for(&st, news), pending })
    }

    /// Starts committing many puts of `client_id` (a `BatchPutEnd`): the keys of each shard
    /// under one hold of it and the global state, and the owners told once for the whole
    /// batch (one message per owner, not one per key: each message is one more acknowledgement
    /// for the owner to send and for the master to take the global lock for). Returns each
    /// key's commit, in the order of `keys` (their `wait` empty), and one wait for them all.
    /// `checksums`: empty (none taken), or each key's, as [`Self::put_end_begin`] takes it;
    /// another count fails every key.
    pub fn put_end_begin_batch(
        &self,
        client_id: &str,
        keys: &[String],
        checksums: &[Option<u32>],
    ) -> (Vec<Result<Commit>>, owners::AckWait) {
        let now = Instant::now();
        let mut out: Vec<Option<Result<Commit>>> = keys.iter().map(|_| None).collect();
        for (i, key) in keys.iter().enumerate() {
            if !checksums.is_empty() && checksums.len() != keys.len() {
                let e = format!("{} keys but {} checksums", keys.len(), checksums.len());
                out[i] = Some(Err(StoreError::InvalidArgument(e)));
            } else if let Err(e) = check_key(key) {
                out[i] = Some(Err(e));
            }
        }
        let by_shard =
            shards::by_shard(keys.iter().enumerate().filter(|(i, _)| out[*i].is_none()).map(|(i, k)| (i, k.as_str())));
        let mut news = Vec::new();
        for group in by_shard.chunk_by(|a, b| a.0 == b.0) {
            let mut st = self.lock_shard(group[0].0);
            for &(_, i) in group {
                let key = keys[i].as_str();
                let checksum = checksums.get(i).copied().flatten();
                let begun =
                    self.fence.check(now).and_then(|()| Self::begin_commit(&mut st, client_id, key, checksum, now));
                out[i] = Some(begun.map(|Begun { version, news: seqs, pending }| {
                    news.extend(seqs);
                    Commit { key: key.to_string(), version, wait: owners::AckWait::default(), pending }
                }));
            }
        }
        let mut st = self.state.lock();
        self.flush_news(&mut st);
        let wait = Self::waits_for(&st, news);
        (out.into_iter().map(|c| c.expect("every key answered")).collect(), wait)
    }

    /// Queues the commit news of `client_id`'s put of `key` for its replicas' owners (the
    /// caller flushes them); returns its version, the news (segment, seq) whose
    /// acknowledgements the commit needs (none when it is committed already), and whether
    /// those are the pending commit sent at the put's start. The object keeps `checksum` (a
    /// commit already made keeps the one it had).
    ///
    /// A put started with a checksum told its owners then (a pending commit, see [`owners`]):
    /// nothing is sent now, and the commit needs only their acknowledgements of that, in by now
    /// as a rule. Its end's `checksum`, when taken, must be the start's: a value that changed
    /// while it was written fails the put (`INVALID_ARGUMENT`) and the object goes.
    pub(super) fn begin_commit(
        st: &mut Locked<'_>,
        client_id: &str,
        key: &str,
        checksum: Option<u32>,
        now: Instant,
    ) -> Result<Begun> {
        let known = st.core.clients.contains_key(client_id);
        let (version, complete) = puts::check_commit(st.objects.get(key), known, client_id, key)?;
        if complete {
            return Ok(Begun { version, news: Vec::new(), pending: false });
        }
        let started = st.objects[key].checksum.get();
        if let Some(e) = puts::checksum_changed(key, started, checksum) {
            Self::remove_object(st, key, now);
            tracing::warn!("put of {key:?} failed: the value changed while it was written");
            return Err(e);
        }
        let obj = st.objects.get_mut(key).expect("looked up above");
        // Every replica's owner was told already: at the put's start (a pending commit), or
        // by an earlier end of this put (its answer lost, the call made again).
        let pending = obj.replicas.iter().all(|r| r.news().is_some());
        obj.checksum = objects::Checksum::new(checksum);
        if pending {
            let news = obj.replicas.iter().filter_map(|r| Some((r.segment_id, r.news()?))).collect();
            return Ok(Begun { version, news, pending: started.is_some() });
        }
        let (size, pins) = (obj.size, Self::pins_of(obj));
        let fresh: SmallVec<[(usize, u64, Block); 2]> = obj
            .replicas
            .iter()
            .enumerate()
            .filter(|(_, r)| r.news().is_none())
            .map(|(i, r)| (i, r.segment_id, r.block))
            .collect();
        for (i, segment_id, block) in fresh {
            let what = owners::Announced {
                key,
                version,
                size,
                pins,
                checksum: objects::Checksum::new(checksum),
                pending_for: None,
            };
            let seq = Self::queue_commit(st, segment_id, block, &what, now);
            st.objects.get_mut(key).expect("looked up above").replicas[i].set_news(seq);
        }
        let obj = st.objects.get(key).expect("looked up above");
        let news = obj.replicas.iter().filter_map(|r| Some((r.segment_id, r.news()?))).collect();
        Ok(Begun { version, news, pending: false })
    }

    /// Ends a commit begun by [`Self::put_end_begin`]: the replicas whose owners acknowledged
    /// become visible; the others are dropped; with none left the put fails.
    pub fn put_end_finish(&self, commit: &Commit) -> Result<()> {
        let key = commit.key.as_str();
        let now = Instant::now();
        let mut st = self.lock_key(key);
        self.fence.check(now)?;
        let done = self.finish_commit(&mut st, commit, now);
        self.flush_news(&mut st);
        drop(st);
        if done.is_err() {
            self.update_gauges();
        }
        done
    }

    /// Ends the commits begun by [`Self::put_end_begin_batch`] (a key that did not begin keeps
    /// its error): each shard's under one hold of it and the global state. Answers in order.
    pub fn put_end_finish_batch(&self, commits: Vec<Result<Commit>>) -> Vec<Result<()>> {
        let now = Instant::now();
        let mut out: Vec<Option<Result<()>>> = commits.iter().map(|_| None).collect();
        let by_shard =
            shards::by_shard(commits.iter().enumerate().filter_map(|(i, c)| Some((i, c.as_ref().ok()?.key.as_str()))));
        let mut failed = false;
        for group in by_shard.chunk_by(|a, b| a.0 == b.0) {
            let mut st = self.lock_shard(group[0].0);
            for &(_, i) in group {
                let commit = commits[i].as_ref().expect("listed above");
                let done = self.fence.check(now).and_then(|()| self.finish_commit(&mut st, commit, now));
                failed |= done.is_err();
                out[i] = Some(done);
            }
            self.flush_news(&mut st);
        }
        if failed {
            self.update_gauges();
        }
        commits
            .into_iter()
            .zip(out)
            .map(|(c, done)| match c {
                Err(e) => Err(e),
                Ok(_) => done.expect("every commit answered"),
            })
            .collect()
    }

    /// [`Self::put_end_finish`] under the key's locks (the caller flushes the news).
    pub(super) fn finish_commit(&self, st: &mut Locked<'_>, commit: &Commit, now: Instant) -> Result<()> {
        let key = commit.key.as_str();
        let obj = match st.objects.get(key) {
            Some(o) if o.version == commit.version => o,
            _ => return Err(StoreError::NotFound(key.to_string())), // revoked or reclaimed meanwhile
        };
        if obj.complete {
            return Ok(());
        }
        let acked: SmallVec<[bool; 2]> =
            obj.replicas.iter().map(|r| r.news().is_some_and(|seq| Self::is_acked(st, r.segment_id, seq))).collect();
        if !acked.iter().any(|a| *a) {
            Self::remove_object(st, key, now);
            tracing::warn!("put of {key:?} failed: no owner of its replicas acknowledged the commit");
            return Err(StoreError::OwnersUnreachable(key.to_string()));
        }
        let obj = st.objects.get_mut(key).expect("looked up above");
        let version = obj.version;
        for r in puts::drop_unacked(obj, &acked) {
            tracing::warn!(
                "put of {key:?}: the owner of segment {} did not acknowledge; replica dropped",
                r.segment_id
            );
            Self::free_replica(st, key, version, r.segment_id, r.block, r.news().is_some(), None);
        }
        st.objects.commit(key);
        let obj = st.objects.get_mut(key).expect("looked up above");
        puts::hold_for_offload(obj, now);
        if commit.pending {
            // The owners knew of it as pending: now they learn it is complete (not waited for:
            // until they do, a master rebuilt from their reports keeps it from its checksum).
            let what = owners::Announced {
                key,
                version,
                size: obj.size,
                pins: Self::pins_of(obj),
                checksum: obj.checksum,
                pending_for: None,
            };
            let placed: SmallVec<[(u64, Block); 2]> = obj.replicas.iter().map(|r| (r.segment_id, r.block)).collect();
            st.lazy_news = !st.instant_acks;
            for (i, (segment_id, block)) in placed.into_iter().enumerate() {
                let seq = Self::queue_commit(st, segment_id, block, &what, now);
                if seq.is_some() {
                    st.objects.get_mut(key).expect("looked up above").replicas[i].set_news(seq);
                }
            }
            st.lazy_news = false;
            if !st.lazy_links.is_empty() && !st.lazy_scheduled {
                st.lazy_scheduled = true;
                self.lazy_due.store(true, Ordering::Release);
            }
        }
        self.emit_object(st, key, EventKind::Stored);
        Ok(())
    }

    /// Commits a put at once (unit tests: owners acknowledge instantly there).
    #[cfg(test)]
    pub fn put_end(&self, client_id: &str, key: &str) -> Result<()> {
        let commit = self.put_end_begin(client_id, key, None)?;
        self.put_end_finish(&commit)
    }

    /// Gives up `client_id`'s put of `key` before it committed: the object and its space go.
    /// Revoking a committed object is [`StoreError::InvalidArgument`] (remove it instead).
    /// Returns what the answer waits for: the owners told of the put at its start (a pending
    /// commit) acknowledging its drop, so that no master rebuilt from their reports after the
    /// answer brings it back.
    pub fn put_revoke(&self, client_id: &str, key: &str) -> Result<owners::AckWait> {
        check_key(key)?;
        let mut st = self.lock_key(key);
        let now = Instant::now();
        self.fence.check(now)?;
        puts::check_revoke(st.objects.get(key), st.core.clients.contains_key(client_id), client_id, key)?;
        let told: SmallVec<[u64; 2]> =
            st.objects[key].replicas.iter().filter(|r| r.news().is_some()).map(|r| r.segment_id).collect();
        Self::remove_object(&mut st, key, now);
        self.flush_news(&mut st);
        let wait = Self::waits(&st, told);
        drop(st);
        self.update_gauges();
        Ok(wait)
    }
}
