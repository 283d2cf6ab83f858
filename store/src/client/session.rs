//! Sessions: a batch's master round trip made once for several ranged transfers of the same
//! keys (Mooncake's `batch_get_session_*` and `batch_put_session_*`), for engines that load
//! or save a cache block layer by layer.
//!
//! A **get session** keeps, per key, the replica list the master gave at its start, with its
//! read lease ([`super::lease`]). Each ranged get then runs the executor's read plan on that
//! list without asking the master again. The list keeps the memory replicas only (a session
//! reads ranges; a disk copy is read whole); a key without one has no session
//! ([`PeerFault::NoReplica`]). The session lasts as long as its lease: a ranged get that starts
//! or ends after it fails with [`StoreError::LeaseExpired`] and ends the session (the bytes may
//! belong to another object by then), so that a new start asks for a new lease. Ending a
//! session drops the list (the lease runs out at the master by itself).
//!
//! A **put session** keeps, per key, the placement the master gave at its start (the object
//! reserved, not yet readable). Each ranged write puts some of the value's bytes into every
//! replica; the end commits the object, a revoke gives its space back. The master keeps a
//! placement for its put timeout (it says how long in its reply): once that has passed on this
//! client's clock, started before the request (so never behind the master's), ranged writes
//! are refused, since the space may be given to another object; end and revoke then get the
//! master's answer. End and revoke seal the session first (no new ranged writes), then wait —
//! at most the engine's transfer timeout — for the ranged writes in flight. A failed end keeps
//! the session, sealed, for another end or a revoke; a revoke of a placement the master no
//! longer has succeeds. Closing the client revokes the put sessions still open.
//!
//! Sessions are keyed by object key, one of each kind per key and client: a second put start
//! of a key with an open session is refused; a second get start replaces the session.

use std::collections::HashMap;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

use super::lease::{LeaseClock, Listed};
use super::plan;
use super::rpc::check;
use super::sg::{self, Extent};
use super::{check_per_key, one_per_key, StoreClient, Want};
use crate::error::{PeerFault, Result, StoreError, Waited};
use crate::proto::{BatchKeyRequest, BatchPutStartRequest, PutOptions, ReplicaDescriptor, Tier};
use crate::protocol::MAX_BATCH_KEYS;

/// The open sessions of one client.
#[derive(Default)]
pub(crate) struct Sessions {
    gets: Mutex<HashMap<String, Listed>>,
    puts: Mutex<HashMap<String, PutSession>>,
    /// Signalled whenever a put session's ranged writes in flight drop.
    writes_ended: Condvar,
}

/// A reserved object and what may still be done with it.
#[derive(Debug)]
struct PutSession {
    replicas: Vec<ReplicaDescriptor>,
    size: u64,
    /// Started before the master was asked: the placement holds for `put_timeout_ms` from it.
    clock: LeaseClock,
    put_timeout_ms: u64,
    /// False once an end or a revoke began: no new ranged writes.
    writable: bool,
    /// Ranged writes in flight.
    writing: usize,
}

fn no_get_session(key: &str) -> StoreError {
    StoreError::invalid(format!("no get session for {key:?} (batch_get_session_start first; it may have ended)"))
}

fn no_put_session(key: &str) -> StoreError {
    StoreError::invalid(format!("no put session for {key:?} (batch_put_session_start first; it may have ended)"))
}

/// Whether every replica of a placement is in memory (a session writes memory replicas).
fn in_memory(replicas: &[ReplicaDescriptor]) -> bool {
    !replicas.is_empty() && replicas.iter().all(|r| r.tier != Tier::Ssd as i32)
}

/// The ranges of `key` checked inside a value of `size` bytes: the bytes they move.
fn checked(client: &StoreClient, key: &str, ranges: &[Extent], size: u64) -> Result<u64> {
    let n = sg::check_ranges(key, ranges, size)?;
    client.check_registered(ranges.iter().filter(|e| e.len > 0).map(|e| (e.addr, e.len)))?;
    Ok(n)
}

/// Counts a put session's ranged writes in flight down when dropped (whatever became of them),
/// so that an end or a revoke waiting for them goes on.
struct Writing<'a> {
    sessions: &'a Sessions,
    keys: Vec<String>,
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        let mut puts = self.sessions.puts.lock();
        for key in &self.keys {
            if let Some(s) = puts.get_mut(key) {
                s.writing = s.writing.saturating_sub(1);
            }
        }
        drop(puts);
        self.sessions.writes_ended.notify_all();
    }
}

impl StoreClient {
    // ---- get sessions ----

    /// The full client's [`StoreApi::batch_get_session_start`](super::StoreApi::batch_get_session_start).
    pub(crate) fn batch_get_session_start(&self, keys: &[String]) -> Result<Vec<Result<()>>> {
        let lists = self.batch_replica_lists(keys)?;
        let mut gets = self.sessions.gets.lock();
        // Sessions whose lease ran out are of no use any more.
        gets.retain(|key, list| list.lease_held(key).is_ok());
        Ok(keys
            .iter()
            .zip(lists)
            .map(|(key, list)| {
                gets.remove(key);
                let mut list = list?;
                list.reply.replicas.retain(plan::readable_in_memory);
                if list.replicas.is_empty() {
                    return Err(StoreError::peer_gone(key, PeerFault::NoReplica));
                }
                gets.insert(key.clone(), list);
                Ok(())
            })
            .collect())
    }

    /// The full client's [`StoreApi::batch_get_into_session_ranges`](super::StoreApi::batch_get_into_session_ranges).
    pub(crate) fn batch_get_into_session_ranges(
        &self,
        keys: &[String],
        ranges: &[&[Extent]],
    ) -> Result<Vec<Result<u64>>> {
        check_per_key(keys.len(), ranges.len(), "range lists")?;
        let mut results: Vec<Result<()>> = Vec::with_capacity(keys.len());
        let mut lists: Vec<Option<Listed>> = Vec::with_capacity(keys.len());
        {
            let mut gets = self.sessions.gets.lock();
            for (key, r) in keys.iter().zip(ranges) {
                let found = match gets.get(key) {
                    None => Err(no_get_session(key)),
                    Some(list) => match list.lease_held(key) {
                        Err(e) => {
                            gets.remove(key);
                            Err(e)
                        }
                        Ok(()) => checked(self, key, r, list.size).map(|_| list.clone()),
                    },
                };
                let (list, result) = match found {
                    Ok(list) => (Some(list), Ok(())),
                    Err(e) => (None, Err(e)),
                };
                lists.push(list);
                results.push(result);
            }
        }
        let wants: Vec<Want<'_>> = ranges.iter().map(|r| Want::Ranges(r)).collect();
        let results = self.read_lists(keys, &lists, &wants, results, &[])?;
        // A read that ended after the lease ends its session too.
        let expired: Vec<&String> = keys
            .iter()
            .zip(&results)
            .filter(|(_, r)| matches!(r, Err(StoreError::LeaseExpired { .. })))
            .map(|(k, _)| k)
            .collect();
        if !expired.is_empty() {
            let mut gets = self.sessions.gets.lock();
            for key in expired {
                gets.remove(key);
            }
        }
        Ok(results)
    }

    /// The full client's [`StoreApi::batch_get_session_end`](super::StoreApi::batch_get_session_end).
    pub(crate) fn batch_get_session_end(&self, keys: &[String]) {
        let mut gets = self.sessions.gets.lock();
        for key in keys {
            gets.remove(key);
        }
    }

    // ---- put sessions ----

    /// The full client's [`StoreApi::batch_put_session_start`](super::StoreApi::batch_put_session_start).
    pub(crate) fn batch_put_session_start(
        &self,
        keys: &[String],
        sizes: &[u64],
        options: &PutOptions,
    ) -> Result<Vec<Result<()>>> {
        check_per_key(keys.len(), sizes.len(), "sizes")?;
        let mut results: Vec<Result<()>> = {
            let puts = self.sessions.puts.lock();
            keys.iter()
                .zip(sizes)
                .map(|(key, &size)| {
                    if puts.contains_key(key) {
                        Err(StoreError::invalid(format!("a put session for {key:?} is open already")))
                    } else if size == 0 {
                        Err(StoreError::invalid(format!("empty value for key {key:?}")))
                    } else {
                        Ok(())
                    }
                })
                .collect()
        };
        let todo: Vec<usize> = (0..keys.len()).filter(|&i| results[i].is_ok()).collect();
        if todo.is_empty() {
            return Ok(results);
        }
        todo.iter().for_each(|&i| self.hot_invalidate(&keys[i]));
        // At most MAX_BATCH_KEYS keys per call to the master.
        let (mut revoke, mut opened) = (Vec::new(), Vec::new());
        for todo in todo.chunks(MAX_BATCH_KEYS) {
            let req = BatchPutStartRequest {
                client_id: self.id.clone(),
                keys: todo.iter().map(|&i| keys[i].clone()).collect(),
                sizes: todo.iter().map(|&i| sizes[i]).collect(),
                options: Some(options.clone()),
                // A put session's bytes come later: no checksum, its end waits for the owners.
                checksums: Vec::new(),
            };
            let clock = LeaseClock::start();
            let reply = self.rpc.call(|mut c| async move { c.batch_put_start(req).await });
            let reply = match reply.and_then(|r| one_per_key(r.items.len(), todo.len()).map(|()| r)) {
                Ok(reply) => reply,
                Err(e) => {
                    // The sessions this call opened before go back with it.
                    let mut puts = self.sessions.puts.lock();
                    opened.iter().for_each(|k| {
                        puts.remove(k);
                    });
                    drop(puts);
                    revoke.extend(opened);
                    self.batch_revoke(revoke);
                    return Err(e);
                }
            };
            {
                let mut puts = self.sessions.puts.lock();
                for (&i, item) in todo.iter().zip(reply.items) {
                    let key = &keys[i];
                    results[i] = check(item.status, key);
                    if results[i].is_err() {
                        continue;
                    }
                    if puts.contains_key(key) {
                        // Started meanwhile by another call (the master places a key once: this
                        // answer is that placement's, which the open session holds).
                        results[i] = Err(StoreError::invalid(format!("a put session for {key:?} is open already")));
                        continue;
                    }
                    if !in_memory(&item.replicas) {
                        // Nothing a session can write.
                        revoke.push(key.clone());
                        results[i] = Err(StoreError::peer_gone(key, PeerFault::NoReplica));
                        continue;
                    }
                    let session = PutSession {
                        replicas: item.replicas,
                        size: sizes[i],
                        clock,
                        put_timeout_ms: item.put_timeout_ms,
                        writable: true,
                        writing: 0,
                    };
                    puts.insert(key.clone(), session);
                    opened.push(key.clone());
                }
            }
        }
        self.batch_revoke(revoke);
        Ok(results)
    }

    /// The full client's [`StoreApi::batch_put_from_session_ranges`](super::StoreApi::batch_put_from_session_ranges).
    pub(crate) fn batch_put_from_session_ranges(
        &self,
        keys: &[String],
        ranges: &[&[Extent]],
    ) -> Result<Vec<Result<u64>>> {
        check_per_key(keys.len(), ranges.len(), "range lists")?;
        let n = keys.len();
        let mut results: Vec<Result<()>> = Vec::with_capacity(n);
        let mut bytes = vec![0u64; n];
        let mut placed: Vec<Vec<ReplicaDescriptor>> = vec![Vec::new(); n];
        let mut sizes = vec![0u64; n];
        let mut clocks: Vec<Option<(LeaseClock, u64)>> = vec![None; n];
        let mut writing = Writing { sessions: &self.sessions, keys: Vec::new() };
        {
            let mut puts = self.sessions.puts.lock();
            for i in 0..n {
                let key = &keys[i];
                let result = match puts.get_mut(key) {
                    None => Err(no_put_session(key)),
                    Some(s) if !s.writable => {
                        Err(StoreError::invalid(format!("the put session of {key:?} is ending: no more writes")))
                    }
                    Some(s) if s.clock.past(s.put_timeout_ms) => Err(past_put_timeout(key, s.put_timeout_ms)),
                    Some(s) => checked(self, key, ranges[i], s.size).map(|n| {
                        s.writing += 1;
                        writing.keys.push(key.clone());
                        (bytes[i], placed[i], sizes[i], clocks[i]) =
                            (n, s.replicas.clone(), s.size, Some((s.clock, s.put_timeout_ms)));
                    }),
                };
                results.push(result);
            }
        }
        let refs: Vec<&[ReplicaDescriptor]> = placed.iter().map(|p| &p[..]).collect();
        self.exec().write_ranges(keys, &refs, &sizes, ranges, &mut results)?;
        // A write that ended after the placement's time may have landed in another object's
        // space: not a success.
        for i in 0..n {
            if let (Ok(()), Some((clock, ttl))) = (&results[i], clocks[i]) {
                if clock.past(ttl) {
                    results[i] = Err(past_put_timeout(&keys[i], ttl));
                }
            }
        }
        drop(writing);
        Ok(results.into_iter().zip(bytes).map(|(r, n)| r.map(|()| n)).collect())
    }

    /// Seals the put sessions of `keys` and waits for their ranged writes in flight (at most
    /// the engine's transfer timeout). Returns a result per key (no session; still writing
    /// when the wait ended) and the keys to tell the master about.
    fn seal(&self, keys: &[String]) -> (Vec<Result<()>>, Vec<usize>) {
        let after = self.engine.config().transfer_timeout;
        let deadline = Instant::now() + after;
        let mut puts = self.sessions.puts.lock();
        let mut results: Vec<Result<()>> = Vec::with_capacity(keys.len());
        for key in keys {
            results.push(match puts.get_mut(key) {
                Some(s) => {
                    s.writable = false;
                    Ok(())
                }
                None => Err(no_put_session(key)),
            });
        }
        let busy = |puts: &HashMap<String, PutSession>, key: &String| puts.get(key).is_some_and(|s| s.writing > 0);
        while keys.iter().zip(&results).any(|(k, r)| r.is_ok() && busy(&puts, k)) {
            if self.sessions.writes_ended.wait_until(&mut puts, deadline).timed_out() {
                break;
            }
        }
        let mut todo = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            if results[i].is_err() {
                continue;
            }
            if busy(&puts, key) {
                results[i] = Err(StoreError::TimedOut { waited: Waited::Transfer { key: key.clone() }, after });
            } else if !puts.contains_key(key) {
                results[i] = Err(no_put_session(key)); // ended by another call meanwhile
            } else {
                todo.push(i);
            }
        }
        (results, todo)
    }

    /// The full client's [`StoreApi::batch_put_session_end`](super::StoreApi::batch_put_session_end).
    pub(crate) fn batch_put_session_end(&self, keys: &[String]) -> Result<Vec<Result<()>>> {
        self.finish_put_sessions(keys, false, |ended, puts, key| {
            if ended.is_ok() {
                puts.remove(key);
            }
            ended
        })
    }

    /// The full client's [`StoreApi::batch_put_session_revoke`](super::StoreApi::batch_put_session_revoke).
    pub(crate) fn batch_put_session_revoke(&self, keys: &[String]) -> Result<Vec<Result<()>>> {
        self.finish_put_sessions(keys, true, |revoked, puts, key| match revoked {
            Ok(()) | Err(StoreError::NotFound(_)) => {
                puts.remove(key);
                Ok(())
            }
            Err(e) => Err(e),
        })
    }

    /// Ends (`revoke` false) or revokes the put sessions of `keys` once sealed, at most
    /// [`MAX_BATCH_KEYS`] keys a call to the master; `settle` makes a key's result of the
    /// master's answer, under the sessions' lock (dropping the session where it is over).
    fn finish_put_sessions(
        &self,
        keys: &[String],
        revoke: bool,
        settle: impl Fn(Result<()>, &mut HashMap<String, PutSession>, &str) -> Result<()>,
    ) -> Result<Vec<Result<()>>> {
        let (mut results, todo) = self.seal(keys);
        if todo.is_empty() {
            return Ok(results);
        }
        if revoke {
            todo.iter().for_each(|&i| self.hot_invalidate(&keys[i]));
        }
        for todo in todo.chunks(MAX_BATCH_KEYS) {
            let req = BatchKeyRequest {
                client_id: self.id.clone(),
                keys: todo.iter().map(|&i| keys[i].clone()).collect(),
                ..Default::default()
            };
            let reply = if revoke {
                self.rpc.call(|mut c| async move { c.batch_put_revoke(req).await })?
            } else {
                self.rpc.call(|mut c| async move { c.batch_put_end(req).await })?
            };
            one_per_key(reply.statuses.len(), todo.len())?;
            let mut puts = self.sessions.puts.lock();
            for (&i, status) in todo.iter().zip(reply.statuses) {
                results[i] = settle(check(Some(status), &keys[i]), &mut puts, &keys[i]);
            }
        }
        Ok(results)
    }

    /// At close: the put sessions still open are revoked (their space is not held until the
    /// master's put timeout), the get sessions dropped.
    pub(crate) fn close_sessions(&self) {
        self.sessions.gets.lock().clear();
        let open: Vec<String> = self.sessions.puts.lock().drain().map(|(k, _)| k).collect();
        self.batch_revoke(open);
    }
}

fn past_put_timeout(key: &str, ttl_ms: u64) -> StoreError {
    StoreError::invalid(format!(
        "the put session of {key:?} is past the master's put timeout ({ttl_ms} ms): its space may be given to other \
         objects; revoke it and start again"
    ))
}
