//! Cache-aware scheduling from a client: side-effect-free queries (where keys are, longest
//! cached prefix per node, per-node load), the near-engine tier (publish/retract keys held in
//! the engine's own VRAM/DRAM), warm-up replication, and the master's event stream.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use crescent_engine::{Opcode, TransferRequest};

use super::lease::LeaseClock;
use super::rpc::{check, outside_async};
use super::sg::{Dst, Extent, Reach};
use super::StoreClient;
use crate::error::{PeerFault, Result, StoreError};
use crate::proto::*;

/// What a replication achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replicated {
    /// Replicas added by this call.
    pub added: u32,
    /// Replicas of the object now.
    pub replicas: u32,
}

/// A subscription to the master's events; dropping it ends it.
pub struct EventSubscription {
    rx: tokio::sync::mpsc::Receiver<Result<EventMessage>>,
    handle: tokio::runtime::Handle,
    task: tokio::task::JoinHandle<()>,
}

impl EventSubscription {
    /// The next event or loss notice; `Ok(None)` when none came within `timeout`. An error
    /// means the stream ended (the master went away).
    pub fn recv_timeout(&mut self, timeout: Duration) -> Result<Option<EventMessage>> {
        let (rx, handle) = (&mut self.rx, &self.handle);
        match outside_async(|| handle.block_on(async { tokio::time::timeout(timeout, rx.recv()).await })) {
            Err(_) => Ok(None),
            Ok(Some(item)) => item.map(Some),
            Ok(None) => Err(StoreError::BadReply("the event stream has ended".into())),
        }
    }
}

impl Drop for EventSubscription {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Counters of a [`WarmupWorker`].
#[derive(Debug, Default)]
pub struct WarmupStats {
    /// Replication tasks taken from the master.
    pub tasks: AtomicU64,
    /// Replicas those tasks added.
    pub replicas_added: AtomicU64,
    /// Tasks that failed (logged at debug level).
    pub failures: AtomicU64,
}

/// A thread that takes hot-key replication tasks from the master and carries them out; it
/// stops when dropped.
pub struct WarmupWorker {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Its counters, shared with the worker's thread.
    pub stats: Arc<WarmupStats>,
}

impl Drop for WarmupWorker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Events a subscription buffers on the client before it stops reading from the master (the
/// master then drops events for it and says how many).
const SUBSCRIPTION_BUFFER: usize = 4096;

impl StoreClient {
    /// Its cache-aware scheduling calls: where keys are, the longest cached prefix per node,
    /// per-node load, the near-engine tier (publish, retract), warm-up replication and the
    /// master's events.
    pub fn sched(self: &Arc<Self>) -> Scheduling<'_> {
        Scheduling { client: self }
    }

    fn retract_with(&self, keys: Vec<String>, all: bool) -> Result<u64> {
        let req = RetractRequest { client_id: self.id.clone(), keys, all };
        let reply = self.rpc.call(|mut c| async move { c.retract(req).await })?;
        check(reply.status, "")?;
        Ok(reply.count)
    }

    /// [`Self::replicate`] onto the segments named `targets` (those holding no replica yet);
    /// with none, `count` segments the master picks.
    pub(super) fn replicate_with(&self, key: &str, count: u32, targets: Vec<String>) -> Result<Replicated> {
        let req =
            ReplicateStartRequest { client_id: self.id.clone(), key: key.to_string(), count, target_segments: targets };
        let clock = LeaseClock::start();
        let mut plan = self.rpc.call(|mut c| async move { c.replicate_start(req).await })?;
        check(plan.status.take(), key)?;
        if plan.targets.is_empty() {
            // Every named target holds a replica already: nothing was reserved.
            return Ok(Replicated { added: 0, replicas: plan.sources.len() as u32 });
        }
        // A copy that ended after the sources' lease may hold another object's bytes: none
        // of its targets is committed (the master reclaims them with the warm-up).
        let copied = self.copy_to_targets(key, &plan).and_then(|done| {
            clock.held(key, plan.lease_ttl_ms)?;
            Ok(done)
        });
        let done = copied.as_ref().map(|d| d.clone()).unwrap_or_default();
        let req = ReplicateEndRequest { client_id: self.id.clone(), key: key.to_string(), done_segments: done };
        let end = self.rpc.call(|mut c| async move { c.replicate_end(req).await })?;
        let copied = copied?;
        check(end.status, key)?;
        if copied.len() < plan.targets.len() {
            tracing::warn!("replicating {key:?}: {} of {} new replicas written", copied.len(), plan.targets.len());
        }
        Ok(Replicated { added: end.added, replicas: end.replicas })
    }

    /// Copies the object into the plan's targets; returns the segment ids written. Zero copy
    /// when this client holds a source or a target (it is registered memory), else through the
    /// staging buffer.
    fn copy_to_targets(&self, key: &str, plan: &ReplicateStartReply) -> Result<Vec<u64>> {
        let exec = self.exec();
        let size = plan.size;
        let mut sources: Vec<&ReplicaDescriptor> =
            plan.sources.iter().filter(|r| r.status == ReplicaStatus::Complete as i32).collect();
        sources.sort_by_key(|r| r.segment_name != self.segment_name());
        let local_target = plan.targets.iter().find(|t| exec.local_replica(t, size).is_some());
        let local_source = sources.iter().copied().find(|s| exec.local_replica(s, size).is_some());
        // Reads the value's bytes into `into` from the first source that gives them.
        let read_any = |into: &[Extent]| {
            let mut last = Err(StoreError::peer_gone(key, PeerFault::NoReplica));
            for s in &sources {
                last = exec.read_replica(key, s, &mut Dst::Registered(into, Reach::host()));
                if last.is_ok() {
                    break;
                }
            }
            last
        };
        let mut done = Vec::new();
        // The registered copy of the bytes on this client, if there is or will be one.
        let mut origin = local_source.map(|s| s.address);
        if let Some(t) = local_target {
            let dst = exec.local_replica(t, size).expect("found local above");
            match local_source.and_then(|s| exec.local_replica(s, size)) {
                Some(src) => dst.copy_from_slice(src),
                None => {
                    read_any(&[Extent { offset: 0, addr: t.address, len: size }])?;
                    origin = Some(t.address);
                }
            }
            done.push(t.segment_id);
        }
        let remote: Vec<&ReplicaDescriptor> =
            plan.targets.iter().filter(|t| Some(t.segment_id) != local_target.map(|l| l.segment_id)).collect();
        let write = |key: &str, t: &ReplicaDescriptor, source: u64, off: u64, length: u64| {
            let seg = exec.open(key, &t.segment_name)?;
            exec.transfer(
                key,
                std::iter::once(TransferRequest {
                    opcode: Opcode::Write,
                    source,
                    target: seg,
                    target_offset: t.address + off,
                    length,
                }),
            )
        };
        if let Some(src) = origin {
            for t in remote {
                match write(key, t, src, 0, size) {
                    Ok(()) => done.push(t.segment_id),
                    Err(e) => tracing::debug!("replicating {key:?} to {}: {e}", t.segment_name),
                }
            }
            return Ok(done);
        }
        // Neither a source nor a target here: chunks through the staging buffer.
        let mut ok: Vec<bool> = vec![true; remote.len()];
        let mut off = 0;
        while off < size {
            let block = exec.stage(size - off)?;
            let n = block.len();
            read_any(&[Extent { offset: off, addr: block.addr(), len: n }])?;
            for (i, t) in remote.iter().enumerate() {
                if !ok[i] {
                    continue;
                }
                if let Err(e) = write(key, t, block.addr(), off, n) {
                    tracing::debug!("replicating {key:?} to {}: {e}", t.segment_name);
                    ok[i] = false;
                }
            }
            off += n;
        }
        done.extend(remote.iter().zip(&ok).filter(|(_, ok)| **ok).map(|(t, _)| t.segment_id));
        Ok(done)
    }

    /// Takes up to `max` hot-key tasks from the master's replication policy.
    pub(crate) fn take_replication_tasks(&self, max: u32) -> Result<Vec<ReplicationTask>> {
        let req = TakeReplicationTasksRequest { client_id: self.id.clone(), max };
        let mut reply = self.rpc.call(|mut c| async move { c.take_replication_tasks(req).await })?;
        check(reply.status.take(), "")?;
        Ok(reply.tasks)
    }
}

/// A client's cache-aware scheduling calls ([`StoreClient::sched`]).
pub struct Scheduling<'c> {
    client: &'c Arc<StoreClient>,
}

impl Scheduling<'_> {
    // ---- queries (no lease, no change of eviction order) ----

    /// Where each key is: pool replicas and published near-engine copies, by node and tier.
    pub fn query_keys(&self, keys: &[String]) -> Result<QueryKeysReply> {
        let req = QueryKeysRequest { client_id: self.client.id.clone(), keys: keys.to_vec() };
        let mut reply = self.client.rpc.call(|mut c| async move { c.query_keys(req).await })?;
        check(reply.status.take(), "")?;
        super::one_per_key(reply.items.len(), keys.len())?;
        Ok(reply)
    }

    /// For ordered chunk keys: the pool's leading chunks, and each node's longest cached prefix.
    pub fn prefix_query(&self, keys: &[String]) -> Result<PrefixQueryReply> {
        let req = QueryKeysRequest { client_id: self.client.id.clone(), keys: keys.to_vec() };
        let mut reply = self.client.rpc.call(|mut c| async move { c.prefix_query(req).await })?;
        check(reply.status.take(), "")?;
        Ok(reply)
    }

    /// Per-node capacity, used, objects, recent get/put rates and published keys.
    pub fn node_stats(&self) -> Result<NodeStatsReply> {
        let req = NodeStatsRequest { client_id: self.client.id.clone() };
        let mut reply = self.client.rpc.call(|mut c| async move { c.node_stats(req).await })?;
        check(reply.status.take(), "")?;
        Ok(reply)
    }

    // ---- the near-engine tier ----

    /// Tells schedulers this client holds `keys` (key, size) in `tier` (VRAM or DRAM) outside
    /// the pool, for `ttl` (publish again to renew). The store never serves these copies.
    pub fn publish(&self, keys: &[(String, u64)], tier: Tier, ttl: Duration) -> Result<u64> {
        let req = PublishRequest {
            client_id: self.client.id.clone(),
            tier: tier as i32,
            ttl_ms: ttl.as_millis().min(u64::MAX as u128) as u64,
            keys: keys.iter().map(|(key, size)| PublishedKey { key: key.clone(), size: *size }).collect(),
        };
        let reply = self.client.rpc.call(|mut c| async move { c.publish(req).await })?;
        check(reply.status, "")?;
        Ok(reply.count)
    }

    /// Withdraws published keys; returns how many were published.
    pub fn retract(&self, keys: &[String]) -> Result<u64> {
        self.client.retract_with(keys.to_vec(), false)
    }

    /// Withdraws every key this client published.
    pub fn retract_all(&self) -> Result<u64> {
        self.client.retract_with(Vec::new(), true)
    }

    // ---- warm-up ----

    /// Adds up to `count` replicas of `key` on segments that hold none: the master allocates,
    /// this client copies the bytes with the engine, then commits the copies that succeeded.
    pub fn replicate(&self, key: &str, count: u32) -> Result<Replicated> {
        self.client.replicate_with(key, count, Vec::new())
    }

    /// Starts a thread that, every `interval`, takes hot-key tasks from the master and
    /// replicates them (the master's `hot_read_threshold` policy decides which keys).
    pub fn start_warmup_worker(&self, interval: Duration) -> WarmupWorker {
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(WarmupStats::default());
        let weak: Weak<StoreClient> = Arc::downgrade(self.client);
        let (stop2, stats2) = (stop.clone(), stats.clone());
        let thread = std::thread::Builder::new()
            .name("crescent-warmup".into())
            .spawn(move || {
                while !stop2.load(Ordering::Acquire) {
                    std::thread::sleep(interval);
                    let Some(client) = weak.upgrade() else { return };
                    let tasks = match client.take_replication_tasks(64) {
                        Ok(t) => t,
                        Err(e) => {
                            tracing::debug!("warm-up worker: {e}");
                            continue;
                        }
                    };
                    for task in tasks {
                        stats2.tasks.fetch_add(1, Ordering::Relaxed);
                        match client.sched().replicate(&task.key, task.count) {
                            Ok(r) => {
                                stats2.replicas_added.fetch_add(r.added as u64, Ordering::Relaxed);
                                tracing::debug!("warm-up: {:?} now has {} replicas", task.key, r.replicas);
                            }
                            Err(e) => {
                                stats2.failures.fetch_add(1, Ordering::Relaxed);
                                tracing::debug!("warm-up of {:?}: {e}", task.key);
                            }
                        }
                    }
                }
            })
            .expect("spawning the warm-up worker");
        WarmupWorker { stop, thread: Some(thread), stats }
    }

    // ---- events ----

    /// Follows the master's stored/removed/evicted/published/retracted events for keys that
    /// start with `key_prefix` ("" for all). Events emitted after this returns are delivered
    /// unless the subscriber falls behind, in which case a loss notice says how many it missed.
    pub fn subscribe(&self, key_prefix: &str) -> Result<EventSubscription> {
        let req = SubscribeRequest { client_id: self.client.id.clone(), key_prefix: key_prefix.to_string() };
        let mut client = self.client.rpc.client();
        let handle = self.client.rpc.handle();
        let addr = self.client.rpc.addr().to_string();
        let unreachable = move |s: tonic::Status| StoreError::master_unreachable(&addr, s);
        #[allow(clippy::result_large_err)] // tonic's status, as the call returns it
        let subscribed = outside_async(|| handle.block_on(async { client.subscribe(req).await }));
        let mut stream = subscribed.map_err(&unreachable)?.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel(SUBSCRIPTION_BUFFER);
        let task = handle.spawn(async move {
            loop {
                let item = match stream.message().await {
                    Ok(Some(m)) => Ok(m),
                    Ok(None) => Err(StoreError::BadReply("the master closed the event stream".into())),
                    Err(s) => Err(unreachable(s)),
                };
                let end = item.is_err();
                if tx.send(item).await.is_err() || end {
                    return;
                }
            }
        });
        Ok(EventSubscription { rx, handle, task })
    }
}
