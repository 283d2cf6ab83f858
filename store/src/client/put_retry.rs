//! Puts across a master change: a put that failed because the master went away, changed or
//! is not the leader is put again, once the client is mounted at a master that answers, within
//! `master_failover_timeout`.
//!
//! A put is never half-visible: the new master never saw its start (a restart or failover
//! forgets puts in flight), or it committed before the old master died — then its owners knew
//! it and reported it. So before putting again, the client asks whether the key exists: a
//! commit whose reply was lost is found there and the put succeeds without a second write.
//! (Another writer's object of the same key and size, put meanwhile, is taken for ours; one of
//! another size makes the put fail as `AlreadyExists`, as a put of an existing key does.)
//!
//! An upsert asks the same, more precisely: whether the key holds the version the master gave
//! one of its puts whose commit a master change hid. Run again over its own committed value,
//! an upsert would remove that value to put it once more, and a reader's lease on it would make
//! the upsert answer [`StoreError::Leased`] (`OBJECT_LEASED`, Python's `OBJECT_HAS_LEASE`: "the
//! old value stays") with its own value in place. A new master may also learn of such a commit
//! late, from an owner's report after the question: so a lease's refusal at the end is checked
//! once more against those versions.

use std::time::Instant;

use super::plan::Mode;
use super::{StoreApi, StoreClient};
use crate::error::{Result, StoreError};

/// Whether a failed put is put again: the master changed, or its end found the put gone
/// (`OBJECT_NOT_FOUND` comes only from a put's end: a new master that had already heard from
/// this client knew nothing of it, or the put outlived `put_timeout`).
fn put_again(e: &StoreError) -> bool {
    e.is_master_change() || matches!(e, StoreError::NotFound(_))
}

/// Whether one of an upsert's puts committed although its caller saw a master change.
#[derive(Debug, PartialEq)]
enum Landed {
    /// The key holds one of the puts' versions: done, only the reply was lost.
    Yes,
    /// It holds none of them (or no put was started): upsert again.
    No,
    /// The master could not say: the outcome stays in doubt, and the master-change error
    /// stands (upserting again could find the upsert's own value and answer a refusal
    /// about it).
    Unknown,
}

impl StoreClient {
    /// Runs `put` (one key of `len` bytes), again after a master change, once it looked
    /// whether the commit landed: for a put, whether the key exists ([`Self::already_put`]);
    /// for an upsert, whether it holds the version of a put `put` started before a master
    /// change (`put` sets it; [`Self::upsert_landed`]).
    pub(super) fn put_retrying(
        &self,
        key: &str,
        len: u64,
        mode: Mode,
        mut put: impl FnMut(&mut Option<u64>) -> Result<()>,
    ) -> Result<()> {
        let deadline = Instant::now() + self.config.master_failover_timeout;
        let mut started = None;
        // An upsert's puts whose commit a master change hid.
        let mut hidden = Vec::new();
        loop {
            match put(&mut started) {
                Err(e) if put_again(&e) && Instant::now() < deadline => {
                    tracing::info!("put of {key:?} failed ({e}); putting it again once the master answers");
                    if !self.link.wait_answered(deadline) {
                        return Err(e);
                    }
                    match mode {
                        Mode::Put => {
                            if let Some(Some(done)) = self.already_put(&[key], &[len]).pop() {
                                return done;
                            }
                        }
                        Mode::Upsert => {
                            hidden.extend(started.take());
                            match self.upsert_landed(key, &hidden) {
                                Landed::Yes => return Ok(()),
                                Landed::No => {}
                                Landed::Unknown => return Err(e),
                            }
                        }
                    }
                }
                Err(StoreError::Leased(k)) if !hidden.is_empty() && self.upsert_landed(key, &hidden) == Landed::Yes => {
                    tracing::info!("upsert of {k:?}: the lease that refused it is on its own value, reported late");
                    return Ok(());
                }
                r => return r,
            }
        }
    }

    /// Whether the key holds one of `versions`, an upsert's puts whose commit a master change
    /// hid.
    fn upsert_landed(&self, key: &str, versions: &[u64]) -> Landed {
        if versions.is_empty() {
            return Landed::No;
        }
        match self.query(key) {
            Ok(q) if q.exists && versions.contains(&q.version) => Landed::Yes,
            Ok(_) => Landed::No,
            Err(e) => {
                tracing::warn!("upsert of {key:?}: whether its commit landed is unknown ({e})");
                Landed::Unknown
            }
        }
    }

    /// Runs `put` over the keys at the given indices (all at first), again for the keys that
    /// failed with a master change (as [`Self::put_retrying`] does one key; `put` sets the
    /// version of each key's put it started, by the key's index); one result per key.
    pub(super) fn batch_put_retrying(
        &self,
        keys: &[String],
        sizes: &[u64],
        mode: Mode,
        mut put: impl FnMut(&[usize], &mut [Option<u64>]) -> Result<Vec<Result<()>>>,
    ) -> Result<Vec<Result<()>>> {
        let deadline = Instant::now() + self.config.master_failover_timeout;
        let mut results: Vec<Option<Result<()>>> = (0..keys.len()).map(|_| None).collect();
        let mut started: Vec<Option<u64>> = vec![None; keys.len()];
        let mut hidden: Vec<Vec<u64>> = vec![Vec::new(); keys.len()];
        let mut todo: Vec<usize> = (0..keys.len()).collect();
        loop {
            let got = match put(&todo, &mut started) {
                Ok(got) if got.len() == todo.len() => got,
                Ok(got) => {
                    return Err(StoreError::Internal(format!("{} results for {} keys", got.len(), todo.len())));
                }
                Err(e) if e.is_master_change() && Instant::now() < deadline => {
                    todo.iter().map(|_| Err(StoreError::MasterChanged(e.to_string()))).collect()
                }
                Err(e) => return Err(e),
            };
            let mut again = Vec::new();
            for (i, r) in todo.iter().copied().zip(got) {
                match r {
                    Err(e) if put_again(&e) && Instant::now() < deadline => {
                        again.push(i);
                        results[i] = Some(Err(e));
                    }
                    r => results[i] = Some(r),
                }
            }
            if again.is_empty() || !self.link.wait_answered(deadline) {
                break;
            }
            todo.clear();
            if mode == Mode::Upsert {
                for i in again {
                    hidden[i].extend(started[i].take());
                    match self.upsert_landed(&keys[i], &hidden[i]) {
                        Landed::Yes => results[i] = Some(Ok(())),
                        Landed::No => todo.push(i),
                        Landed::Unknown => {} // its master-change error stands
                    }
                }
            } else {
                let ks: Vec<&str> = again.iter().map(|&i| keys[i].as_str()).collect();
                let ls: Vec<u64> = again.iter().map(|&i| sizes[i]).collect();
                for (i, done) in again.into_iter().zip(self.already_put(&ks, &ls)) {
                    match done {
                        Some(r) => results[i] = Some(r),
                        None => todo.push(i),
                    }
                }
            }
            if todo.is_empty() {
                break;
            }
            tracing::info!("putting {} key(s) again after a master change", todo.len());
        }
        // A lease's refusal on a value of our own that a new master learnt late: done.
        for (i, r) in results.iter_mut().enumerate() {
            if matches!(r, Some(Err(StoreError::Leased(_)))) && self.upsert_landed(&keys[i], &hidden[i]) == Landed::Yes
            {
                *r = Some(Ok(()));
            }
        }
        Ok(results.into_iter().map(|r| r.expect("every key has a result")).collect())
    }

    /// Per key: `Some(result)` when it exists at the master now (a commit whose reply was
    /// lost: done, if its size is ours), `None` when it must be put again.
    fn already_put(&self, keys: &[&str], sizes: &[u64]) -> Vec<Option<Result<()>>> {
        keys.iter()
            .zip(sizes)
            .map(|(key, &len)| match self.query(key) {
                Ok(q) if q.exists && q.size == len => Some(Ok(())),
                Ok(q) if q.exists => Some(Err(StoreError::AlreadyExists(key.to_string()))),
                _ => None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::client::sg::Src;
    use crate::master::server;
    use crate::ClientConfig;

    fn client(m: &server::MasterHandle, segment: u64) -> Arc<StoreClient> {
        StoreClient::connect(ClientConfig {
            master_server_address: m.client_address(),
            local_hostname: Some("127.0.0.1".into()),
            global_segment_size: segment,
            local_buffer_size: 1 << 20,
            ping_interval: Duration::from_millis(50),
            ..ClientConfig::default()
        })
        .expect("a client of the loopback master")
    }

    /// What the writer sees when the master committed its put and then went away before
    /// the reply (a leader killed, or deposed, between the commit and the answer).
    fn reply_lost() -> StoreError {
        StoreError::MasterChanged("the reply to the commit was lost with the master".into())
    }

    #[test]
    fn an_upsert_whose_commit_landed_before_a_master_change_succeeds_while_a_reader_leases_its_value() {
        let m = server::start_loopback();
        let (writer, reader) = (client(&m, 8 << 20), client(&m, 0));
        writer.put("k", b"the old value").unwrap();
        let new = b"the upserted value".to_vec();
        let options = writer.default_options();
        let mut lost = false;
        let r = writer.put_retrying("k", new.len() as u64, Mode::Upsert, |started| {
            let r = writer.put_one("k", Src::Bytes(&new), &options, Mode::Upsert, started);
            if r.is_ok() && !std::mem::replace(&mut lost, true) {
                // Committed; a reader leases the new value before the writer hears again.
                assert_eq!(reader.get("k").unwrap(), new);
                return Err(reply_lost());
            }
            r
        });
        assert!(lost, "the first commit's reply was lost");
        // Before the fix the upsert ran again, found its own value, failed to remove it for the
        // reader's lease and answered OBJECT_LEASED ("the old value stays") over the new value.
        assert!(r.is_ok(), "the key holds the upsert's value, so the upsert succeeded: {r:?}");
        assert_eq!(reader.get("k").unwrap(), new);
    }

    #[test]
    fn a_batch_upsert_whose_commits_landed_before_a_master_change_succeeds_while_readers_lease_its_values() {
        let m = server::start_loopback();
        let (writer, reader) = (client(&m, 8 << 20), client(&m, 0));
        let keys: Vec<String> = vec!["a".into(), "b".into()];
        for k in &keys {
            writer.put(k, b"an old value").unwrap();
        }
        let values: Vec<Vec<u8>> = keys.iter().map(|k| format!("the upserted value of {k}").into_bytes()).collect();
        let srcs: Vec<Src<'_>> = values.iter().map(|v| Src::Bytes(v)).collect();
        let sizes: Vec<u64> = values.iter().map(|v| v.len() as u64).collect();
        let options = writer.default_options();
        let mut lost = false;
        let results = writer
            .batch_put_retrying(&keys, &sizes, Mode::Upsert, |todo, started| {
                let r = writer.put_some(&keys, &srcs, &options, Mode::Upsert, todo, started);
                let all_ok = r.as_ref().is_ok_and(|rs| rs.iter().all(Result::is_ok));
                if all_ok && !std::mem::replace(&mut lost, true) {
                    for (k, v) in keys.iter().zip(&values) {
                        assert_eq!(&reader.get(k).unwrap(), v);
                    }
                    return Err(reply_lost());
                }
                r
            })
            .unwrap();
        assert!(lost, "the first commits' reply was lost");
        for ((k, v), r) in keys.iter().zip(&values).zip(&results) {
            assert!(r.is_ok(), "{k} holds the upsert's value, so its upsert succeeded: {r:?}");
            assert_eq!(&reader.get(k).unwrap(), v);
        }
    }

    #[test]
    fn an_upsert_that_had_not_landed_when_the_master_changed_is_refused_by_a_lease_and_leaves_the_old_value() {
        let m = server::start_loopback();
        let (writer, reader) = (client(&m, 8 << 20), client(&m, 0));
        let old = b"the old value".to_vec();
        writer.put("k", &old).unwrap();
        assert_eq!(reader.get("k").unwrap(), old); // leased from now on
        let new = b"the upserted value".to_vec();
        let options = writer.default_options();
        let mut tries = 0;
        let r = writer.put_retrying("k", new.len() as u64, Mode::Upsert, |started| {
            tries += 1;
            if tries == 1 {
                // The master went away before it started anything of this upsert.
                return Err(reply_lost());
            }
            writer.put_one("k", Src::Bytes(&new), &options, Mode::Upsert, started)
        });
        assert_eq!(tries, 2, "upserted again once the master answered");
        assert!(matches!(r, Err(StoreError::Leased(_))), "{r:?}");
        assert_eq!(reader.get("k").unwrap(), old, "a refused upsert leaves the old value");
    }
}
