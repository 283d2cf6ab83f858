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

use std::time::Instant;

use super::plan::Mode;
use super::StoreClient;
use crate::error::{Result, StoreError};

/// Whether a failed put is put again: the master changed, or its end found the put gone
/// (`OBJECT_NOT_FOUND` comes only from a put's end: a new master that had already heard from
/// this client knew nothing of it, or the put outlived `put_timeout`).
fn put_again(e: &StoreError) -> bool {
    e.is_master_change() || matches!(e, StoreError::NotFound(_))
}

impl StoreClient {
    /// Runs `put` (one key of `len` bytes), again after a master change. An upsert is simply
    /// run again (replacing once more is what it asks); a put first looks whether its commit
    /// landed.
    pub(super) fn put_retrying(
        &self,
        key: &str,
        len: u64,
        mode: Mode,
        mut put: impl FnMut() -> Result<()>,
    ) -> Result<()> {
        let deadline = Instant::now() + self.config.master_failover_timeout;
        loop {
            match put() {
                Err(e) if put_again(&e) && Instant::now() < deadline => {
                    tracing::info!("put of {key:?} failed ({e}); putting it again once the master answers");
                    if !self.link.wait_answered(deadline) {
                        return Err(e);
                    }
                    if mode == Mode::Upsert {
                        continue;
                    }
                    match self.already_put(&[key], &[len]).pop() {
                        Some(Some(done)) => return done,
                        _ => continue,
                    }
                }
                r => return r,
            }
        }
    }

    /// Runs `put` over the keys at the given indices (all at first), again for the keys that
    /// failed with a master change; one result per key.
    pub(super) fn batch_put_retrying(
        &self,
        keys: &[String],
        sizes: &[u64],
        mode: Mode,
        mut put: impl FnMut(&[usize]) -> Result<Vec<Result<()>>>,
    ) -> Result<Vec<Result<()>>> {
        let deadline = Instant::now() + self.config.master_failover_timeout;
        let mut results: Vec<Option<Result<()>>> = (0..keys.len()).map(|_| None).collect();
        let mut todo: Vec<usize> = (0..keys.len()).collect();
        loop {
            let got = match put(&todo) {
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
                todo = again;
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
