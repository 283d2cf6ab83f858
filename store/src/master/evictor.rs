//! Eviction, as the master drives it: the rounds that keep memory use under the high
//! watermark, a step at a time ([`Master::evict_step`]), the evictions a put out of room or
//! the metadata limit asks for, and the evictor thread that runs the rounds off the calls.
//! Which objects go is the eviction policy's choice; this module takes the locks,
//! reads the clock, queues the owners' drops and counts the metrics.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::core::rounds::{self, AfterStep};
use super::objects::SHARDS;
use super::{tenant, Master, State, OBJECT_METADATA_BYTES};
use crate::error::{Result, StoreError};
use crate::proto::EventKind;

/// Most objects one step of an eviction round takes (`Master::evict_step`), each shard's
/// under one hold of it and the global lock (about eight objects, microseconds, a hold): the
/// calls waiting for a lock go between two holds (a round of 5 % of a million objects is
/// about 50 000 objects, some 200 steps). Each step takes every shard's lock twice and the
/// global one once a shard, whatever its size: 64 objects a step made that a cost of each
/// object. The owners' news of a round go out every [`super::EVICTION_NEWS_BATCH`] objects.
pub const EVICTION_STEP: usize = 256;

/// The evictor's pause after a step that took `took`: none when the round is `urgent` or
/// `duty` is 1, else what makes the step `duty` of the step and its pause together.
pub(super) fn pause_after_step(took: Duration, duty: f64, urgent: bool) -> Duration {
    if urgent || duty >= 1.0 {
        return Duration::ZERO;
    }
    took.mul_f64((1.0 - duty) / duty)
}

/// The evictor thread's name (what `top -H` and `perf` show: 15 bytes at most, where
/// `crescent-master-evict` read as `crescent-master`, like every other thread of the master).
pub const EVICTOR_THREAD: &str = "crescent-evict";

/// Once at the metadata limit, eviction takes the metadata down to this share of it.
pub(super) const METADATA_LOW_WATERMARK: f64 = 0.95;

/// Wakes the evictor thread ([`Master::start_sweeper`]); without one (unit tests), the call that
/// finds eviction needed runs the round's steps itself, letting waiting calls in between them.
#[derive(Default)]
pub(super) struct Evictor {
    /// A round is wanted: set by puts and sweeps, taken by the evictor thread.
    pub(super) wanted: Mutex<bool>,
    pub(super) wake: parking_lot::Condvar,
    /// The evictor thread runs.
    pub(super) running: std::sync::atomic::AtomicBool,
}

impl Master {
    /// Room in the metadata's budget for one more object of `key`: when it would pass the
    /// limit, the least recently used evictable objects of every tenant go until the metadata
    /// is under [`METADATA_LOW_WATERMARK`] of it (a put at the limit does not evict one object
    /// each time); when none can go, the put is refused.
    pub(super) fn make_metadata_room(&self, key: &str, size: u64, replicas: u32, now: Instant) -> Result<()> {
        let cost = OBJECT_METADATA_BYTES + key.len() as u64;
        if self.metadata_bytes() + cost <= self.metadata_limit {
            return Ok(());
        }
        let low = (self.metadata_limit as f64 * METADATA_LOW_WATERMARK) as u64;
        let (mut freed, mut count) = (0, 0);
        while self.metadata_bytes() + cost > low {
            let before = self.metadata_bytes();
            let Some((f, c)) = self.evict_some(now, u64::MAX, None, EVICTION_STEP, false) else { break };
            (freed, count) = (freed + f, count + c);
            // Objects that keep a disk copy stay listed: evicting them frees no metadata.
            if c == 0 || self.metadata_bytes() >= before {
                break;
            }
        }
        if count > 0 {
            self.flush_round_news(&mut self.state.lock());
            self.count_eviction(count, freed);
            self.update_gauges();
            tracing::debug!("metadata at its limit: evicted {count} object(s)");
        }
        if self.metadata_bytes() + cost > self.metadata_limit {
            return Err(StoreError::NoSpace {
                size,
                replicas,
                detail: format!(
                    "the master's metadata is at its limit ({} of {} bytes, --max-metadata-bytes) and no object \
                     can be evicted",
                    self.metadata_bytes(),
                    self.metadata_limit
                ),
            });
        }
        Ok(())
    }

    /// Whether memory use is above the high watermark (a round of eviction is due).
    pub(super) fn above_watermark(&self, st: &State) -> bool {
        st.core.used_above(self.config.eviction_high_watermark)
    }

    /// A round of eviction is wanted: the evictor thread is woken, or, without one (unit
    /// tests), this call runs the round's steps, releasing the lock between them.
    pub(super) fn evict_soon(&self, now: Instant) {
        if self.evictor.running.load(Ordering::Acquire) {
            *self.evictor.wanted.lock() = true;
            self.evictor.wake.notify_one();
        } else {
            while self.evict_step(now, EVICTION_STEP) {}
        }
    }

    /// One step of the eviction round: starts a round when none is under way and memory use is
    /// above the high watermark (or a put found no room since the last one), then evicts at most
    /// `most` of the least recently used evictable objects of every tenant toward the round's
    /// target ([`super::MasterConfig::eviction_ratio`] of the capacity), each shard's under one short
    /// hold of its lock ([`Self::evict_some`]). Returns whether the round goes on (call again).
    /// The evictor thread calls it in a loop; tests call it to drive eviction step by step.
    pub(crate) fn evict_step(&self, now: Instant, most: usize) -> bool {
        let left = {
            let mut st = self.state.lock();
            if !self.fence.leads(now) {
                st.core.round = None;
                self.flush_round_news(&mut st);
                return false;
            }
            let (high, ratio) = (self.config.eviction_high_watermark, self.config.eviction_ratio);
            match rounds::step_budget(&mut st.core, high, ratio) {
                Some(left) => left,
                None => return false,
            }
        };
        let step = self.evict_some(now, left, None, most, true);
        let mut st = self.state.lock();
        let (freed, count) = step.unwrap_or((0, 0));
        self.count_eviction(count, freed);
        let waiting = st.round_links.len();
        let (more, gauges) = match rounds::end_step(&mut st.core, freed, count, waiting) {
            AfterStep::More { turns, gauges } => {
                self.flush_round_news_share(&mut st, turns);
                (true, gauges)
            }
            AfterStep::Done(round) => {
                if round.count > 0 {
                    tracing::info!("eviction round: {} object(s), {} bytes", round.count, round.freed);
                }
                self.flush_round_news(&mut st);
                (false, true)
            }
            AfterStep::Gone => {
                self.flush_round_news(&mut st);
                (false, false)
            }
        };
        drop(st);
        if gauges {
            self.update_gauges();
        }
        more
    }

    /// Evicts least-recently-used evictable objects of `tenant` (every tenant's when none)
    /// until `at_least` bytes are freed (or nothing evictable is left); objects whose file is
    /// still being written from memory (`offload_held_until`) go last. Returns bytes freed.
    /// Holds no lock when called: it takes the shards one at a time.
    pub(super) fn evict_in(&self, now: Instant, at_least: u64, tenant: Option<&str>) -> u64 {
        let (mut freed, mut count) = (0, 0);
        while freed < at_least {
            let Some((f, c)) = self.evict_some(now, at_least - freed, tenant, EVICTION_STEP, false) else { break };
            (freed, count) = (freed + f, count + c);
            if c == 0 {
                break;
            }
        }
        // A put waits for this room: its drops go out now, and the round's queued ones too
        // (their ranges come back once acknowledged, which a put out of room may wait for).
        self.flush_round_news(&mut self.state.lock());
        self.count_eviction(count, freed);
        self.update_gauges();
        freed
    }

    /// At most `most` objects toward `target` bytes, the least recently used of all shards
    /// first, evicted: (bytes freed, objects), or `None` when nothing is left to take.
    ///
    /// Each shard plans from its least recently used end (a few more than its share of
    /// `most`), under its lock alone; the policy ([`super::eviction`]) merges the plans into
    /// the globally least recently used ([`super::eviction::EvictionPolicy::choose`]). Then each shard's
    /// chosen objects go under one hold of the shard and the global state, each only if it was
    /// not used, pinned or removed since it was planned. So the order is the one a single
    /// map would give, and a step's cost is its plans' objects, not the store's size.
    ///
    /// The owners' drops are queued, not sent: for a `round`'s step, with the round's
    /// ([`super::EVICTION_NEWS_BATCH`]); the caller sends them.
    pub(super) fn evict_some(
        &self,
        now: Instant,
        target: u64,
        tenant: Option<&str>,
        most: usize,
        round: bool,
    ) -> Option<(u64, u64)> {
        if target == 0 || most == 0 {
            return None;
        }
        let eligible = |k: &str| tenant.is_none_or(|t| tenant::tenant_of(k) == t);
        let per_shard = (most / SHARDS * 2).clamp(4, most.max(4));
        let plans: Vec<_> = (0..SHARDS)
            .map(|i| (i, self.eviction.plan(&mut self.shard(i), now, target, per_shard, &eligible)))
            .collect();
        let candidates = self.eviction.choose(plans, target, most);
        if candidates.is_empty() {
            return None;
        }
        let (mut freed, mut count) = (0, 0);
        for group in candidates.chunk_by(|a, b| a.0 == b.0) {
            let mut st = self.lock_shard(group[0].0);
            st.round_news = round;
            for (_, v) in group {
                let as_planned = st
                    .objects
                    .get(&v.key)
                    .is_some_and(|o| o.complete && o.tick() == v.tick && o.evictable(now) && !o.replicas.is_empty());
                if !as_planned {
                    continue;
                }
                self.emit_object(&st, &v.key, EventKind::Evicted);
                // An object with a disk copy loses its memory replicas only: gets read the disk.
                freed += Self::evict_memory_replicas(&mut st, &v.key, now).unwrap_or(0);
                count += 1;
            }
            st.round_news = false;
        }
        Some((freed, count))
    }

    pub(super) fn count_eviction(&self, count: u64, freed: u64) {
        self.metrics.mooncake.eviction(count, freed);
        if count > 0 {
            self.metrics.evictions.inc_by(count);
            self.metrics.evicted_bytes.inc_by(freed);
            tracing::debug!("evicted {count} object(s), {freed} bytes");
        }
    }

    /// The evictor thread: woken when a round is wanted, it runs the round's steps, each under
    /// one short hold of the lock, so no put or get waits behind a whole round; at the nice
    /// value [`super::MasterConfig::evictor_nice`] (0 by default), above 0 so that on a busy machine
    /// the calls come first (a put that finds no room evicts what it needs itself,
    /// [`Self::evict_in`], so none fails for an evictor behind).
    pub(super) fn start_evictor(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        let evictor = self.evictor.clone();
        if evictor.running.swap(true, Ordering::AcqRel) {
            return; // one is running already
        }
        let nice = self.config.evictor_nice;
        std::thread::Builder::new()
            .name(EVICTOR_THREAD.into())
            .spawn(move || {
                if nice != 0 {
                    // This thread only: on Linux a nice value is a thread's (who = 0: the
                    // caller), and a new thread starts with its creator's.
                    let to = rustix::process::getpriority_process(None).map_or(nice, |n| (n + nice).min(19));
                    if let Err(e) = rustix::process::setpriority_process(None, to) {
                        tracing::warn!("the evictor thread keeps the master's priority: setpriority({to}): {e}");
                    }
                }
                loop {
                    {
                        let mut wanted = evictor.wanted.lock();
                        if !*wanted {
                            // Woken by a request, or now and then to see whether the master is gone.
                            evictor.wake.wait_for(&mut wanted, Duration::from_millis(500));
                        }
                        if !std::mem::take(&mut *wanted) {
                            if weak.strong_count() == 0 {
                                return;
                            }
                            continue;
                        }
                    }
                    let Some(master) = weak.upgrade() else { return };
                    master.run_round_paced();
                }
            })
            .expect("spawning the evictor");
    }

    /// The evictor thread's round: its steps, each followed by a pause that keeps the round
    /// to [`super::MasterConfig::evictor_duty`] of one core, unless the round is urgent
    /// ([`Self::eviction_urgent`]). A round at full speed holds one core for its whole length
    /// (90 ms for 56 k objects at 1 M, over a second at 10 M), and on a machine whose cores the
    /// calls use, the calls that arrive meanwhile queue behind it; paced, the round takes
    /// longer and the calls keep their cores.
    pub(super) fn run_round_paced(&self) {
        let duty = self.config.evictor_duty;
        loop {
            let started = Instant::now();
            if !self.evict_step(started, EVICTION_STEP) {
                return;
            }
            let pause = pause_after_step(started.elapsed(), duty, duty < 1.0 && self.eviction_urgent());
            if !pause.is_zero() {
                std::thread::sleep(pause);
            }
        }
    }

    /// Whether the round must go at full speed: a put found no room since it started, or
    /// memory use is past halfway from the high watermark to full.
    pub(super) fn eviction_urgent(&self) -> bool {
        let st = self.state.lock();
        let hw = self.config.eviction_high_watermark;
        st.core.pressure || st.core.used_above(hw + (1.0 - hw) / 2.0)
    }
}
