//! Warm-up: adding replicas to an existing object at run time, and the hot-key policy.
//!
//! The master moves no bytes, so a client does the copy:
//!
//! 1. `ReplicateStart(key, n)`: the master picks up to `n` segments that hold no replica of
//!    the object and have room (emptiest first), allocates a block on each (kept aside, not
//!    yet part of the object), and grants the object a read lease so that its sources stay
//!    put while they are read. One replication per key at a time.
//! 2. The client reads a source replica and writes the new blocks with the engine.
//! 3. `ReplicateEnd(key, done)`: the written blocks join the object's replicas (a `Stored`
//!    event each); the others are freed. If the object was removed or put again meanwhile,
//!    every new block is freed and the call fails with `OBJECT_NOT_FOUND`. A replication not
//!    ended within `put_timeout` is reclaimed like an unfinished put.
//!
//! Hot-key policy (`hot_read_threshold` > 0): the master counts replica-list reads per key
//! over `hot_window`; at the end of each window, keys read faster than the threshold that have
//! fewer than `hot_max_replicas` replicas (and room on another segment) are queued, at most
//! `hot_queue` of them, for one more replica each. Clients running a warm-up worker take
//! tasks with `TakeReplicationTasks` and replicate them; a key still hot in a later window gets
//! another one, up to the cap.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Instant;

use crate::allocator::Block;
use crate::error::{Result, StoreError};
use crate::master::{check_key, tenant, Master, Replica, State, MAX_REPLICAS};
use crate::proto::{EventKind, ReplicaDescriptor, ReplicaStatus, ReplicationTask};

/// Distinct keys counted per hot-key window at most (memory bound).
const MAX_TRACKED_KEYS: usize = 1 << 20;

pub(super) struct Pending {
    client: String,
    version: u64,
    targets: Vec<(u64, Block)>,
    started: Instant,
    /// Once the end began: per target, the seq of the commit news its owner was sent.
    news: Option<Vec<Option<u64>>>,
}

/// A replication being ended ([`Master::replicate_end_begin`]): what its answer waits for.
#[derive(Debug)]
pub struct ReplicationCommit {
    /// The object's key.
    pub key: String,
    /// The copying client's id.
    pub client: String,
    /// The owners' acknowledgements of the new replicas' commit news.
    pub wait: super::owners::AckWait,
}

/// What `ReplicateStart` hands the copying client.
#[derive(Debug, Clone)]
pub struct ReplicationPlan {
    /// The object's size, in bytes.
    pub size: u64,
    /// The object's version (the copy is of this version only).
    pub version: u64,
    /// Complete replicas to copy from.
    pub sources: Vec<ReplicaDescriptor>,
    /// Places reserved for the new replicas: copy the value there, then end the replication.
    pub targets: Vec<ReplicaDescriptor>,
}

#[derive(Default)]
pub(super) struct HotKeys {
    reads: HashMap<String, u32>,
    window_start: Option<Instant>,
    queue: VecDeque<String>,
    queued: HashSet<String>,
}

impl HotKeys {
    pub fn record(&mut self, key: &str) {
        if let Some(n) = self.reads.get_mut(key) {
            *n = n.saturating_add(1);
        } else if self.reads.len() < MAX_TRACKED_KEYS {
            self.reads.insert(key.to_string(), 1);
        }
    }
}

impl Master {
    /// Allocates up to `count` new replicas of a committed object; see the module docs.
    pub fn replicate_start(&self, client_id: &str, key: &str, count: u32) -> Result<ReplicationPlan> {
        self.replicate_start_to(client_id, key, count, &[])
    }

    /// [`Self::replicate_start`] onto the segments named `targets` (those that hold no replica
    /// of the object yet; `count` is then ignored), as a replica task's copy does. When every
    /// target holds one already, the plan has no targets and nothing is to be ended.
    pub fn replicate_start_to(
        &self,
        client_id: &str,
        key: &str,
        count: u32,
        targets: &[String],
    ) -> Result<ReplicationPlan> {
        check_key(key)?;
        let count = if targets.is_empty() { count } else { u32::try_from(targets.len()).unwrap_or(u32::MAX) };
        if count == 0 || count > MAX_REPLICAS {
            return Err(StoreError::InvalidArgument(format!("replica count {count} is not in 1..={MAX_REPLICAS}")));
        }
        let now = Instant::now();
        let mut st = self.lock_key(key);
        self.fence.check(now)?;
        let st = &mut st;
        Self::release_ended_holds(st, now);
        let obj = st.objects.get(key).ok_or_else(|| StoreError::NotFound(key.to_string()))?;
        if !obj.complete || st.replications.contains_key(key) {
            return Err(StoreError::NotReady(key.to_string()));
        }
        let (size, version) = (obj.size, obj.version);
        let room = MAX_REPLICAS.saturating_sub(obj.replicas.len() as u32);
        let holding: HashSet<u64> = obj.replicas.iter().map(|r| r.segment_id).collect();
        let mut candidates: Vec<u64> = st
            .core
            .segments
            .iter()
            .filter(|(id, s)| {
                !holding.contains(id)
                    && s.alloc.free() >= size
                    && tenant::tenant_of(&s.client_id) == tenant::tenant_of(key)
            })
            .map(|(id, _)| *id)
            .collect();
        // Emptiest first: warm copies spread the load.
        candidates.sort_by(|a, b| {
            let ratio = |id: &u64| {
                let a = &st.core.segments[id].alloc;
                a.free() as f64 / a.capacity() as f64
            };
            ratio(b).total_cmp(&ratio(a)).then(a.cmp(b))
        });
        if !targets.is_empty() {
            let mut named = Vec::new();
            for name in targets {
                let id = Self::task_target(st, key, name)?;
                if holding.contains(&id) || named.contains(&id) {
                    continue;
                }
                if !candidates.contains(&id) {
                    return Err(StoreError::NoSpace {
                        size,
                        replicas: 1,
                        detail: format!("segment {name:?} has no room for a replica"),
                    });
                }
                named.push(id);
            }
            if named.is_empty() {
                // Every target holds one already: nothing to copy.
                return Ok(ReplicationPlan { size, version, sources: Vec::new(), targets: Vec::new() });
            }
            candidates = named;
        }
        let targets_asked = !targets.is_empty();
        let mut targets = Vec::new();
        for id in candidates {
            if targets.len() as u32 == count.min(room) {
                break;
            }
            let seg = st.core.segments.get_mut(&id).expect("candidate");
            if let Some(block) = seg.alloc.allocate(size) {
                seg.load.puts.record(now);
                targets.push((id, block));
            }
        }
        if targets_asked && (targets.len() as u32) < count.min(room) {
            // A named segment's room went to fragmentation: all or none.
            for (id, block) in targets {
                Self::free_replica(st, key, version, id, block, false, None);
            }
            return Err(StoreError::NoSpace {
                size,
                replicas: count,
                detail: "a target segment has no block large enough".into(),
            });
        }
        if targets.is_empty() {
            return Err(StoreError::NoSpace {
                size,
                replicas: count,
                detail: format!(
                    "no other segment has room for a new replica ({} segment(s) hold one already)",
                    holding.len()
                ),
            });
        }
        let obj = st.objects.get_mut(key).expect("looked up above");
        let until = now + self.config.lease_ttl;
        super::objects::extend(&mut obj.lease_until, until);
        let obj = &st.objects[key];
        // Copies come from memory replicas; disk copies are read through their owner, not the engine.
        let sources: Vec<ReplicaDescriptor> =
            Self::describe(st, obj).into_iter().filter(|r| r.tier != crate::proto::Tier::Ssd as i32).collect();
        let target_descriptors = targets
            .iter()
            .filter_map(|(id, block)| {
                let seg = st.core.segments.get(id)?;
                Some(ReplicaDescriptor {
                    segment_name: seg.name.clone(),
                    address: seg.base + block.offset,
                    size,
                    tier: seg.tier as i32,
                    status: ReplicaStatus::Processing as i32,
                    client_id: seg.client_id.clone(),
                    host: seg.host.clone(),
                    segment_id: *id,
                    disk_service: String::new(),
                })
            })
            .collect();
        st.replications.insert(
            key.to_string(),
            Pending { client: client_id.to_string(), version, targets, started: now, news: None },
        );
        Ok(ReplicationPlan { size, version, sources, targets: target_descriptors })
    }

    /// Starts ending a replication: the owners of the written new replicas (`done` segment
    /// ids) are told; [`Self::replicate_end_finish`] commits those acknowledged, frees the rest.
    pub fn replicate_end_begin(&self, client_id: &str, key: &str, done: &[u64]) -> Result<ReplicationCommit> {
        check_key(key)?;
        let now = Instant::now();
        let mut st = self.lock_key(key);
        self.fence.check(now)?;
        let st = &mut st;
        let pending = match st.replications.get(key) {
            None => {
                return Err(StoreError::InvalidArgument(format!("no replication of {key:?} is in progress")));
            }
            Some(p) if p.client != client_id => {
                return Err(StoreError::InvalidArgument(format!(
                    "the replication of {key:?} belongs to another client"
                )));
            }
            Some(p) if p.news.is_some() => {
                return Err(StoreError::InvalidArgument(format!("the replication of {key:?} is ending already")));
            }
            Some(p) => p,
        };
        let (version, targets) = (pending.version, pending.targets.clone());
        let alive = st.objects.get(key).filter(|o| o.complete && o.version == version);
        let Some(obj) = alive else {
            let p = st.replications.remove(key).expect("looked up above");
            for (id, block) in p.targets {
                Self::free_replica(st, key, version, id, block, false, None);
            }
            return Err(StoreError::NotFound(key.to_string()));
        };
        let (size, pins, checksum) = (obj.size, Self::pins_of(obj), obj.checksum);
        let mut news = Vec::with_capacity(targets.len());
        let mut told = Vec::new();
        for (id, block) in targets {
            let seq = if done.contains(&id) {
                let what = super::owners::Announced { key, version, size, pins, checksum, pending_for: None };
                Self::queue_commit(st, id, block, &what, now)
            } else {
                None
            };
            if seq.is_some() {
                told.push(id);
            }
            news.push(seq);
        }
        st.replications.get_mut(key).expect("looked up above").news = Some(news);
        self.flush_news(st);
        let wait = Self::waits(st, told);
        Ok(ReplicationCommit { key: key.to_string(), client: client_id.to_string(), wait })
    }

    /// Ends a replication begun by [`Self::replicate_end_begin`]; returns (replicas added,
    /// replicas of the object now). If the object was removed or put again meanwhile, every new
    /// block goes and the call fails with `OBJECT_NOT_FOUND`.
    pub fn replicate_end_finish(&self, c: &ReplicationCommit) -> Result<(u32, u32)> {
        let key = c.key.as_str();
        let mut st = self.lock_key(key);
        self.fence.check(Instant::now())?;
        let st = &mut st;
        let pending = match st.replications.remove(key) {
            Some(p) if p.client == c.client && p.news.is_some() => p,
            Some(p) => {
                st.replications.insert(key.to_string(), p);
                return Err(StoreError::InvalidArgument(format!("no ending replication of {key:?}")));
            }
            None => return Err(StoreError::NotFound(key.to_string())),
        };
        let alive = st.objects.get(key).is_some_and(|o| o.complete && o.version == pending.version);
        let mut added = Vec::new();
        let news = pending.news.expect("checked above");
        for ((id, block), seq) in pending.targets.into_iter().zip(news) {
            let acked = seq.is_some_and(|s| Self::is_acked(st, id, s));
            if alive && acked {
                added.push(id);
                let replica = Replica::new(id, block, seq);
                st.objects.get_mut(key).expect("alive").replicas.push(replica);
            } else {
                Self::free_replica(st, key, pending.version, id, block, seq.is_some(), None);
            }
        }
        self.flush_news(st);
        if !alive {
            return Err(StoreError::NotFound(key.to_string()));
        }
        let obj = &st.objects[key];
        for &id in &added {
            self.emit_replica(st, key, obj.size, id, EventKind::Stored);
        }
        self.metrics.replicas_added.inc_by(added.len() as u64);
        self.metrics.replicated_bytes.inc_by(added.len() as u64 * obj.size);
        Ok((added.len() as u32, obj.replicas.len() as u32))
    }

    /// Ends a replication at once (unit tests: owners acknowledge instantly there).
    #[cfg(test)]
    pub fn replicate_end(&self, client_id: &str, key: &str, done: &[u64]) -> Result<(u32, u32)> {
        let c = self.replicate_end_begin(client_id, key, done)?;
        self.replicate_end_finish(&c)
    }

    /// Frees the blocks of replications not ended within `put_timeout`.
    pub(super) fn reclaim_replications(&self, st: &mut State, now: Instant) {
        let stale: Vec<String> = st
            .replications
            .iter()
            .filter(|(_, p)| now.saturating_duration_since(p.started) > self.config.put_timeout)
            .map(|(k, _)| k.clone())
            .collect();
        for key in stale {
            let p = st.replications.remove(&key).expect("listed above");
            let news = p.news.unwrap_or_else(|| vec![None; p.targets.len()]);
            for ((id, block), seq) in p.targets.into_iter().zip(news) {
                Self::free_replica(st, &key, p.version, id, block, seq.is_some(), None);
            }
            tracing::warn!("replication of {key:?} by {} never ended: reclaimed", p.client);
        }
    }

    /// Whether [`Self::hot_tick`] has work (it opens the first window, or ends one).
    pub(super) fn hot_tick_due(&self, st: &super::State, now: Instant) -> bool {
        self.config.hot_read_threshold > 0.0
            && st.hot.window_start.is_none_or(|start| now.saturating_duration_since(start) >= self.config.hot_window)
    }

    /// Ends a hot-key window: queues keys read faster than the threshold.
    pub(super) fn hot_tick(&self, st: &mut super::Locked<'_>, now: Instant) {
        if self.config.hot_read_threshold <= 0.0 {
            return;
        }
        let start = *st.hot.window_start.get_or_insert(now);
        let window = now.saturating_duration_since(start);
        if window < self.config.hot_window {
            return;
        }
        st.hot.window_start = Some(now);
        let needed = (self.config.hot_read_threshold * window.as_secs_f64()).ceil().max(1.0) as u64;
        let reads = std::mem::take(&mut st.hot.reads);
        let segments = st.core.segments.len();
        for (key, n) in reads {
            if (n as u64) < needed {
                continue;
            }
            self.metrics.hot_keys.inc();
            let Some(obj) = st.objects.get(&key).filter(|o| o.complete) else { continue };
            let replicas = obj.replicas.len();
            if replicas >= self.config.hot_max_replicas as usize
                || replicas >= segments
                || st.replications.contains_key(&key)
                || st.hot.queued.contains(&key)
            {
                continue;
            }
            if st.hot.queue.len() >= self.config.hot_queue {
                self.metrics.replication_tasks_dropped.inc();
                continue;
            }
            tracing::debug!("hot key {key:?}: {n} reads in {window:?}; queued for one more replica");
            st.hot.queued.insert(key.clone());
            st.hot.queue.push_back(key);
            self.metrics.replication_tasks_queued.inc();
        }
    }

    /// Hands up to `max` queued hot keys to a warm-up worker (one more replica each).
    pub fn take_replication_tasks(&self, max: u32) -> Vec<ReplicationTask> {
        self.take_replication_tasks_of(max, |_| true)
    }

    /// [`Self::take_replication_tasks`] of the keys `mine` accepts (a tenant's); the others
    /// stay queued, in their order.
    pub fn take_replication_tasks_of(&self, max: u32, mine: impl Fn(&str) -> bool) -> Vec<ReplicationTask> {
        let mut st = self.lock_all();
        let mut tasks = Vec::new();
        let mut others = Vec::new();
        while tasks.len() < max as usize {
            let Some(key) = st.hot.queue.pop_front() else { break };
            if !mine(&key) {
                others.push(key);
                continue;
            }
            st.hot.queued.remove(&key);
            if st.objects.get(&key).is_some_and(|o| o.complete) && !st.replications.contains_key(&key) {
                tasks.push(ReplicationTask { key, count: 1 });
            }
        }
        for key in others.into_iter().rev() {
            st.hot.queue.push_front(key);
        }
        self.metrics.replication_tasks_taken.inc_by(tasks.len() as u64);
        tasks
    }
}
