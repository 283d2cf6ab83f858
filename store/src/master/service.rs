//! The master's gRPC service: a thin mapping of RPCs onto [`Master`]. Errors travel inside
//! replies as a `Status {code, message}`, so callers in any language get the store's codes.

use std::sync::Arc;
use std::time::Instant;

use tokio_stream::wrappers::errors::BroadcastStreamRecvError;
use tokio_stream::wrappers::BroadcastStream;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response};

use crate::error::StoreError;
use crate::master::access::Tenant;
use crate::master::mooncake_metrics::GetSource;
use crate::master::owners::LAZY_NEWS_DELAY;
use crate::master::removal_records::{Removal, RemovalRecords};
use crate::master::{tasks, tenant, Master, PingOutcome, MAX_KEY_LEN};
use crate::proto::master_server::{Master as MasterRpc, MasterServer};
use crate::proto::*;

/// The master's gRPC service (`crescent.master.v1.Master`, upstream's calls and Crescent's):
/// each call checks its arguments and bounds, maps to a [`Master`] method, and answers with a
/// status that carries the error's code.
pub struct MasterService {
    master: Arc<Master>,
    /// Where removals that a copy may still hold are recorded before they are answered (HA).
    records: Option<Arc<RemovalRecords>>,
}

/// Most keys in one batch call; a larger batch is refused whole with `INVALID_ARGUMENT` (the
/// client splits its batches).
pub use crate::protocol::MAX_BATCH_KEYS;

/// Bytes a request spends per key beyond the key itself, generously: field tags and lengths,
/// a size or version varint, an entry's enclosing message (a `DiskEntry`, a `HeldRemoval`
/// with its disk name).
const PER_KEY_OVERHEAD: usize = 64;

/// Largest request the master decodes: a batch of [`MAX_BATCH_KEYS`] keys of [`MAX_KEY_LEN`]
/// bytes each, their per-key fields, and 1 MiB for the rest (client id, options, names).
/// A message announcing more is refused from its 5-byte gRPC header with `OUT_OF_RANGE`,
/// before any of it is buffered.
pub const MAX_REQUEST_MESSAGE: usize = MAX_BATCH_KEYS * (MAX_KEY_LEN + PER_KEY_OVERHEAD) + (1 << 20);

pub use crate::protocol::MAX_MESSAGE;

impl MasterService {
    /// The service over `master`, as tonic serves it: requests up to [`MAX_REQUEST_MESSAGE`]
    /// bytes, replies up to [`MAX_MESSAGE`].
    pub fn new(master: Arc<Master>) -> MasterServer<MasterService> {
        Self::with_records(master, None)
    }

    /// The service, recording in `records` the removals a copy may still hold before it
    /// answers them (see the master's `removal_records` module).
    pub fn with_records(master: Arc<Master>, records: Option<Arc<RemovalRecords>>) -> MasterServer<MasterService> {
        MasterServer::new(MasterService { master, records })
            .max_decoding_message_size(MAX_REQUEST_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE)
    }

    /// Serves one request of `asked` items (1, or a batch's keys), timed and counted.
    #[allow(clippy::result_large_err)] // tonic's handler signature
    fn timed_n<T: Outcome>(
        &self,
        method: &str,
        asked: usize,
        f: impl FnOnce(&Master) -> T,
    ) -> Result<Response<T>, tonic::Status> {
        let start = Instant::now();
        let out = f(&self.master);
        Ok(self.observed_n(method, asked, start, out))
    }

    /// Counts and times a request of `asked` items that began at `start`.
    fn observed_n<T: Outcome>(&self, method: &str, asked: usize, start: Instant, out: T) -> Response<T> {
        let metrics = self.master.metrics();
        metrics.rpc_latency.with_label_values(&[method]).observe(start.elapsed().as_secs_f64());
        metrics.mooncake.record(method, asked, out.failed(asked));
        Response::new(out)
    }

    fn observed<T: Outcome>(&self, method: &str, start: Instant, out: T) -> Response<T> {
        self.observed_n(method, 1, start, out)
    }

    /// Waits for a removal's owners (at most `owner_ack_timeout`), then records what a copy may
    /// still hold, when there is somewhere to record it; an answer may go out once this is Ok.
    async fn settle(&self, mut removal: Removal) -> Result<(), StoreError> {
        let m = &self.master;
        removal.wait(m.config().owner_ack_timeout).await;
        let Some(records) = &self.records else { return Ok(()) };
        let unsettled = removal.unsettled();
        if unsettled.is_empty() {
            return Ok(());
        }
        records.record(m.term(), &unsettled).await
    }

    /// Commits a put once its owners acknowledged (or the wait ran out).
    async fn commit(&self, client: &str, key: &str, checksum: Option<u32>) -> Result<(), StoreError> {
        let m = &self.master;
        let mut commit = m.put_end_begin(client, key, checksum)?;
        commit.wait.wait(m.config().owner_ack_timeout).await;
        let done = m.put_end_finish(&commit);
        self.schedule_lazy_news();
        done
    }

    /// Sends the commits' lazy news ([`LAZY_NEWS_DELAY`]) after that delay, unless a
    /// send of them is scheduled already.
    fn schedule_lazy_news(&self) {
        if self.master.lazy_news_unscheduled() {
            let m = self.master.clone();
            tokio::spawn(async move {
                tokio::time::sleep(LAZY_NEWS_DELAY).await;
                m.flush_lazy_news();
            });
        }
    }

    #[allow(clippy::result_large_err)] // tonic's handler signature
    fn timed<T: Outcome>(&self, method: &str, f: impl FnOnce(&Master) -> T) -> Result<Response<T>, tonic::Status> {
        self.timed_n(method, 1, f)
    }
}

/// How many of a reply's `asked` items failed (a status other than OK), for the request
/// counters under Mooncake's names ([`crate::master::mooncake_metrics`]).
trait Outcome {
    fn failed(&self, asked: usize) -> usize;
}

fn is_failure(s: &Option<Status>) -> bool {
    s.as_ref().is_some_and(|s| s.code != Code::Ok as i32)
}

macro_rules! single_outcome {
    ($($reply:ty),* $(,)?) => {
        $(impl Outcome for $reply {
            fn failed(&self, _asked: usize) -> usize {
                is_failure(&self.status) as usize
            }
        })*
    };
}

single_outcome!(
    StatusReply,
    PutStartReply,
    GetReplicaListReply,
    ExistsReply,
    QueryKeyReply,
    RemoveByRegexReply,
    PingReply,
    MountSegmentReply,
    UnmountSegmentReply,
    ReplicateStartReply,
    ReplicateEndReply,
    TakeReplicationTasksReply,
    CreateTaskReply,
    QueryTaskReply,
    BatchReplicaClearReply,
    QueryKeysReply,
    PrefixQueryReply,
    NodeStatsReply,
    PublishReply,
    RemountWithReportReply,
);

impl Outcome for BatchPutStartReply {
    fn failed(&self, _asked: usize) -> usize {
        self.items.iter().filter(|i| is_failure(&i.status)).count()
    }
}

impl Outcome for BatchGetReplicaListReply {
    fn failed(&self, _asked: usize) -> usize {
        self.items.iter().filter(|i| is_failure(&i.status)).count()
    }
}

impl Outcome for BatchStatusReply {
    fn failed(&self, _asked: usize) -> usize {
        self.statuses.iter().filter(|s| s.code != Code::Ok as i32).count()
    }
}

impl Outcome for BatchExistsReply {
    fn failed(&self, asked: usize) -> usize {
        if is_failure(&self.status) {
            asked
        } else {
            0
        }
    }
}

/// Refuses a batch of more than [`MAX_BATCH_KEYS`] keys, whole: the caller's mistake.
#[allow(clippy::result_large_err)] // tonic's status
fn check_batch(keys: usize) -> Result<(), tonic::Status> {
    if keys > MAX_BATCH_KEYS {
        return Err(tonic::Status::invalid_argument(format!(
            "{keys} keys in one batch call; at most {MAX_BATCH_KEYS} (split the batch)"
        )));
    }
    Ok(())
}

fn ok() -> Option<Status> {
    Some(Status { code: Code::Ok as i32, message: String::new() })
}

/// The status a reply carries for `e`; counted in the master's errors by kind.
fn status(m: &Master, e: &StoreError) -> Option<Status> {
    m.metrics().error(e);
    Some(Status { code: e.code() as i32, message: e.to_string() })
}

fn status_of(m: &Master, r: &Result<(), StoreError>) -> Option<Status> {
    match r {
        Ok(()) => ok(),
        Err(e) => status(m, e),
    }
}

fn replica_list_reply(m: &Master, key: &str) -> GetReplicaListReply {
    let got = m.get_replica_list(key);
    let served = got.as_ref().ok().filter(|l| !l.replicas.is_empty()).map(|l| {
        let in_memory = l.replicas.iter().any(|r| r.tier != Tier::Ssd as i32);
        (if in_memory { GetSource::Memory } else { GetSource::Disk }, l.size)
    });
    m.metrics().mooncake.get(served);
    match got {
        Ok(l) => GetReplicaListReply {
            status: ok(),
            replicas: l.replicas,
            size: l.size,
            version: l.version,
            lease_ttl_ms: l.lease_ttl.as_millis() as u64,
            checksum: l.checksum.map(|crc32| Checksum { crc32 }),
        },
        Err(e) => GetReplicaListReply { status: status(m, &e), ..Default::default() },
    }
}

/// A request and the tenant it is served for ([`crate::master::access`] puts the tenant in
/// the request; [`crate::master::tenant`] says how names are scoped).
fn tenant_req<T>(req: Request<T>) -> (Tenant, T) {
    let t = req.extensions().get::<Tenant>().cloned().unwrap_or_default();
    (t, req.into_inner())
}

/// A tenant's name, scoped in place.
fn sc(t: &Tenant, name: &mut String) {
    *name = tenant::scope(&t.0, name);
}

fn sc_all(t: &Tenant, names: &mut [String]) {
    names.iter_mut().for_each(|n| sc(t, n));
}

/// A client id going out to `t`'s client: its own name ("" for another tenant's, which the
/// master's rules never hand out).
fn unscope_id(t: &Tenant, id: &mut String) {
    *id = tenant::unscope(&t.0, id).unwrap_or_default().to_string();
}

fn unscope_replicas(t: &Tenant, replicas: &mut [ReplicaDescriptor]) {
    replicas.iter_mut().for_each(|r| unscope_id(t, &mut r.client_id));
}

/// Disk entries going out to `t`'s client: its keys only, under its names.
fn unscope_entries(t: &Tenant, entries: Vec<DiskEntry>) -> Vec<DiskEntry> {
    entries
        .into_iter()
        .filter_map(|e| Some(DiskEntry { key: tenant::unscope(&t.0, &e.key)?.to_string(), ..e }))
        .collect()
}

fn sc_entries(t: &Tenant, entries: &mut [DiskEntry]) {
    entries.iter_mut().for_each(|e| sc(t, &mut e.key));
}

#[tonic::async_trait]
impl MasterRpc for MasterService {
    async fn mount_segment(
        &self,
        req: Request<MountSegmentRequest>,
    ) -> Result<Response<MountSegmentReply>, tonic::Status> {
        let (t, mut r) = tenant_req(req);
        sc(&t, &mut r.client_id);
        self.timed("MountSegment", |m| {
            let seg = r.segment.unwrap_or_default();
            match m.mount_segment(&r.client_id, &seg, &r.host) {
                Ok(id) => MountSegmentReply { status: ok(), segment_id: id, term: m.term() },
                Err(e) => MountSegmentReply { status: status(m, &e), segment_id: 0, term: m.term() },
            }
        })
    }

    async fn remount_segment(
        &self,
        req: Request<MountSegmentRequest>,
    ) -> Result<Response<MountSegmentReply>, tonic::Status> {
        let (t, mut r) = tenant_req(req);
        sc(&t, &mut r.client_id);
        self.timed("RemountSegment", |m| {
            let seg = r.segment.unwrap_or_default();
            match m.remount_segment(&r.client_id, &seg, &r.host) {
                Ok(id) => MountSegmentReply { status: ok(), segment_id: id, term: m.term() },
                Err(e) => MountSegmentReply { status: status(m, &e), segment_id: 0, term: m.term() },
            }
        })
    }

    async fn unmount_segment(
        &self,
        req: Request<UnmountSegmentRequest>,
    ) -> Result<Response<UnmountSegmentReply>, tonic::Status> {
        let (t, mut r) = tenant_req(req);
        sc(&t, &mut r.client_id);
        self.timed("UnmountSegment", |m| match m.unmount_segment_leased(&r.client_id, r.segment_id) {
            Ok(busy) => UnmountSegmentReply { status: ok(), busy_ms: busy.as_millis().try_into().unwrap_or(u64::MAX) },
            Err(e) => UnmountSegmentReply { status: status(m, &e), busy_ms: 0 },
        })
    }

    async fn put_start(&self, req: Request<PutStartRequest>) -> Result<Response<PutStartReply>, tonic::Status> {
        let start = Instant::now();
        let (t, mut r) = tenant_req(req);
        sc(&t, &mut r.client_id);
        sc(&t, &mut r.key);
        let m = &self.master;
        let opts = r.options.unwrap_or_default();
        let crc = r.checksum.map(|c| c.crc32);
        // Space freed by eviction waits for its owners' acknowledgements (see owners.rs).
        let placed =
            m.retry_after_quarantine(|| m.put_start_checked(&r.client_id, &r.key, r.size, &opts, crc, true)).await;
        let reply = match placed {
            Ok((mut replicas, version)) => {
                unscope_replicas(&t, &mut replicas);
                PutStartReply {
                    status: ok(),
                    replicas,
                    version,
                    put_timeout_ms: m.config().put_timeout.as_millis() as u64,
                }
            }
            Err(e) => PutStartReply { status: status(m, &e), ..Default::default() },
        };
        Ok(self.observed("PutStart", start, reply))
    }

    async fn put_end(&self, req: Request<KeyRequest>) -> Result<Response<StatusReply>, tonic::Status> {
        let start = Instant::now();
        let (t, mut r) = tenant_req(req);
        sc(&t, &mut r.client_id);
        sc(&t, &mut r.key);
        let done = self.commit(&r.client_id, &r.key, r.checksum.map(|c| c.crc32)).await;
        Ok(self.observed("PutEnd", start, StatusReply { status: status_of(&self.master, &done) }))
    }

    async fn put_revoke(&self, req: Request<KeyRequest>) -> Result<Response<StatusReply>, tonic::Status> {
        let (t, mut r) = tenant_req(req);
        sc(&t, &mut r.client_id);
        sc(&t, &mut r.key);
        let start = Instant::now();
        let m = &self.master;
        // Answered once the owners told of the put at its start acknowledged its drop.
        let revoked = match m.put_revoke(&r.client_id, &r.key) {
            Ok(mut wait) => {
                wait.wait(m.config().owner_ack_timeout).await;
                Ok(())
            }
            Err(e) => Err(e),
        };
        Ok(self.observed("PutRevoke", start, StatusReply { status: status_of(m, &revoked) }))
    }

    async fn batch_put_start(
        &self,
        req: Request<BatchPutStartRequest>,
    ) -> Result<Response<BatchPutStartReply>, tonic::Status> {
        let start = Instant::now();
        let (t, mut r) = tenant_req(req);
        check_batch(r.keys.len())?;
        sc(&t, &mut r.client_id);
        sc_all(&t, &mut r.keys);
        let m = &self.master;
        if r.keys.len() != r.sizes.len() {
            let e = StoreError::InvalidArgument(format!("{} keys but {} sizes", r.keys.len(), r.sizes.len()));
            let items = vec![PutStartReply { status: status(m, &e), ..Default::default() }; r.keys.len().max(1)];
            return Ok(self.observed_n("BatchPutStart", r.keys.len(), start, BatchPutStartReply { items }));
        }
        if !r.checksums.is_empty() && r.checksums.len() != r.keys.len() {
            let e = StoreError::InvalidArgument(format!("{} keys but {} checksums", r.keys.len(), r.checksums.len()));
            let items = vec![PutStartReply { status: status(m, &e), ..Default::default() }; r.keys.len().max(1)];
            return Ok(self.observed_n("BatchPutStart", r.keys.len(), start, BatchPutStartReply { items }));
        }
        let opts = r.options.unwrap_or_default();
        let mut items = Vec::with_capacity(r.keys.len());
        // The owners' pending commits go once for the whole batch (one message per owner).
        for (i, (k, s)) in r.keys.iter().zip(&r.sizes).enumerate() {
            let crc = r.checksums.get(i).map(|c| c.crc32);
            let mut placed = m.put_start_checked(&r.client_id, k, *s, &opts, crc, false);
            // Refused for room while evicted ranges wait in quarantine: again once released.
            if matches!(placed, Err(StoreError::NoSpace { .. })) && m.quarantined_bytes() > 0 {
                m.flush_owner_news();
                placed = m.retry_after_quarantine(|| m.put_start_checked(&r.client_id, k, *s, &opts, crc, false)).await;
            }
            items.push(match placed {
                Ok((mut replicas, version)) => {
                    unscope_replicas(&t, &mut replicas);
                    PutStartReply {
                        status: ok(),
                        replicas,
                        version,
                        put_timeout_ms: m.config().put_timeout.as_millis() as u64,
                    }
                }
                Err(e) => PutStartReply { status: status(m, &e), ..Default::default() },
            });
        }
        m.flush_owner_news();
        Ok(self.observed_n("BatchPutStart", r.keys.len(), start, BatchPutStartReply { items }))
    }

    async fn batch_put_end(&self, req: Request<BatchKeyRequest>) -> Result<Response<BatchStatusReply>, tonic::Status> {
        let start = Instant::now();
        let (t, mut r) = tenant_req(req);
        check_batch(r.keys.len())?;
        sc(&t, &mut r.client_id);
        sc_all(&t, &mut r.keys);
        let m = &self.master;
        // Every key's owners are told at once (one message each); one wait for all their
        // acknowledgements; then every key committed, each shard's under one hold.
        let checksums: Vec<Option<u32>> = r.checksums.iter().map(|c| Some(c.crc32)).collect();
        let (commits, mut wait) = m.put_end_begin_batch(&r.client_id, &r.keys, &checksums);
        wait.wait(m.config().owner_ack_timeout).await;
        let statuses = m.put_end_finish_batch(commits).iter().map(|done| status_of(m, done).expect("some")).collect();
        self.schedule_lazy_news();
        Ok(self.observed_n("BatchPutEnd", r.keys.len(), start, BatchStatusReply { statuses }))
    }

    async fn batch_put_revoke(
        &self,
        req: Request<BatchKeyRequest>,
    ) -> Result<Response<BatchStatusReply>, tonic::Status> {
        let (t, mut r) = tenant_req(req);
        check_batch(r.keys.len())?;
        sc(&t, &mut r.client_id);
        sc_all(&t, &mut r.keys);
        let start = Instant::now();
        let m = &self.master;
        // One wait for every drop's acknowledgement (see `put_revoke`).
        let mut wait = crate::master::owners::AckWait::default();
        let statuses = r
            .keys
            .iter()
            .map(|k| {
                let revoked = m.put_revoke(&r.client_id, k).map(|w| wait.merge(w));
                status_of(m, &revoked).expect("some")
            })
            .collect();
        wait.wait(m.config().owner_ack_timeout).await;
        Ok(self.observed_n("BatchPutRevoke", r.keys.len(), start, BatchStatusReply { statuses }))
    }

    async fn get_replica_list(&self, req: Request<KeyRequest>) -> Result<Response<GetReplicaListReply>, tonic::Status> {
        let (t, mut r) = tenant_req(req);
        sc(&t, &mut r.key);
        self.timed("GetReplicaList", |m| {
            let mut reply = replica_list_reply(m, &r.key);
            unscope_replicas(&t, &mut reply.replicas);
            reply
        })
    }

    async fn batch_get_replica_list(
        &self,
        req: Request<BatchKeyRequest>,
    ) -> Result<Response<BatchGetReplicaListReply>, tonic::Status> {
        let (t, mut r) = tenant_req(req);
        check_batch(r.keys.len())?;
        sc_all(&t, &mut r.keys);
        self.timed_n("BatchGetReplicaList", r.keys.len(), |m| BatchGetReplicaListReply {
            items: r
                .keys
                .iter()
                .map(|k| {
                    let mut reply = replica_list_reply(m, k);
                    unscope_replicas(&t, &mut reply.replicas);
                    reply
                })
                .collect(),
        })
    }

    async fn exists(&self, req: Request<KeyRequest>) -> Result<Response<ExistsReply>, tonic::Status> {
        let (t, mut r) = tenant_req(req);
        sc(&t, &mut r.key);
        self.timed("Exists", |m| match m.exists(&r.key) {
            Ok(exists) => ExistsReply { status: ok(), exists },
            Err(e) => ExistsReply { status: status(m, &e), exists: false },
        })
    }

    async fn batch_exists(&self, req: Request<BatchKeyRequest>) -> Result<Response<BatchExistsReply>, tonic::Status> {
        let (t, mut r) = tenant_req(req);
        check_batch(r.keys.len())?;
        sc_all(&t, &mut r.keys);
        self.timed_n("BatchExists", r.keys.len(), |m| match m.batch_exists(&r.keys) {
            Ok(exists) => BatchExistsReply { status: ok(), exists },
            Err(e) => BatchExistsReply { status: status(m, &e), exists: Vec::new() },
        })
    }

    async fn query_key(&self, req: Request<KeyRequest>) -> Result<Response<QueryKeyReply>, tonic::Status> {
        let (t, mut r) = tenant_req(req);
        sc(&t, &mut r.key);
        self.timed("QueryKey", |m| match m.query(&r.key) {
            Ok(mut reply) => {
                unscope_replicas(&t, &mut reply.replicas);
                QueryKeyReply { status: ok(), ..reply }
            }
            Err(e) => QueryKeyReply { status: status(m, &e), ..Default::default() },
        })
    }

    async fn remove(&self, req: Request<RemoveRequest>) -> Result<Response<StatusReply>, tonic::Status> {
        let start = Instant::now();
        let (t, mut r) = tenant_req(req);
        sc(&t, &mut r.key);
        let m = &self.master;
        // Answered once the owners acknowledged (or the wait ran out): see owners.rs.
        let removed = match m.remove(&r.key, r.force) {
            Ok(removal) => self.settle(removal).await,
            Err(e) => Err(e),
        };
        Ok(self.observed("Remove", start, StatusReply { status: status_of(m, &removed) }))
    }

    async fn remove_by_regex(
        &self,
        req: Request<RemoveByRegexRequest>,
    ) -> Result<Response<RemoveByRegexReply>, tonic::Status> {
        let start = Instant::now();
        let (t, r) = tenant_req(req);
        let re = regex::RegexBuilder::new(&r.pattern)
            .size_limit(1 << 20)
            .build()
            .map_err(|e| StoreError::InvalidArgument(format!("bad regex {:?}: {e}", r.pattern)));
        // The tenant's keys, matched by their names.
        let removed = re.and_then(|re| {
            self.master.remove_matching(move |k| tenant::unscope(&t.0, k).is_some_and(|k| re.is_match(k)), r.force)
        });
        let reply = self.removed_reply(removed).await;
        Ok(self.observed("RemoveByRegex", start, reply))
    }

    async fn remove_all(&self, req: Request<RemoveAllRequest>) -> Result<Response<RemoveByRegexReply>, tonic::Status> {
        let start = Instant::now();
        let (t, r) = tenant_req(req);
        let mine = move |k: &str| tenant::unscope(&t.0, k).is_some();
        let reply = self.removed_reply(self.master.remove_matching(mine, r.force)).await;
        Ok(self.observed("RemoveAll", start, reply))
    }

    async fn ping(&self, req: Request<PingRequest>) -> Result<Response<PingReply>, tonic::Status> {
        let (t, mut r) = tenant_req(req);
        sc(&t, &mut r.client_id);
        self.timed("Ping", |m| match m.ping(&r.client_id) {
            PingOutcome::NotLeader(why) => {
                PingReply { status: status(m, &StoreError::NotLeader(why)), term: m.term(), ..Default::default() }
            }
            PingOutcome::Ok => {
                if let Some(d) = &r.disk {
                    m.record_disk_counters(&r.client_id, d);
                }
                let (held_generation, held_removals) = m.held_removals_for(&r.client_id).unwrap_or_default();
                // The removals of the tenant's keys only.
                let held_removals = held_removals
                    .into_iter()
                    .filter_map(|h| Some(HeldRemoval { key: tenant::unscope(&t.0, &h.key)?.to_string(), ..h }))
                    .collect();
                PingReply {
                    status: ok(),
                    view_version: 0,
                    disk_removals: unscope_entries(&t, m.disk_removals_for(&r.client_id)),
                    held_generation,
                    held_removals,
                    disk_only: unscope_entries(&t, m.disk_only_news_for(&r.client_id)),
                    term: m.term(),
                    tasks: m
                        .take_tasks(&r.client_id)
                        .into_iter()
                        .filter_map(|a| Some(TaskAssignment { key: tenant::unscope(&t.0, &a.key)?.to_string(), ..a }))
                        .collect(),
                }
            }
            PingOutcome::NeedRemount => {
                PingReply { status: status(m, &StoreError::NeedRemount), term: m.term(), ..Default::default() }
            }
        })
    }

    async fn mount_disk(&self, req: Request<MountDiskRequest>) -> Result<Response<MountSegmentReply>, tonic::Status> {
        let (t, mut r) = tenant_req(req);
        sc(&t, &mut r.client_id);
        r.held_removals.iter_mut().for_each(|h| sc(&t, &mut h.key));
        self.timed("MountDisk", |m| {
            m.merge_held_removals(&r.held_removals);
            match m.mount_disk_linked(&r.client_id, &r.disk_id, &r.disk_service, r.capacity, &r.host, r.owner_stream) {
                Ok(id) => MountSegmentReply { status: ok(), segment_id: id, term: m.term() },
                Err(e) => MountSegmentReply { status: status(m, &e), segment_id: 0, term: m.term() },
            }
        })
    }

    async fn update_disk_replicas(
        &self,
        req: Request<UpdateDiskReplicasRequest>,
    ) -> Result<Response<BatchStatusReply>, tonic::Status> {
        let (t, mut r) = tenant_req(req);
        sc(&t, &mut r.client_id);
        sc_entries(&t, &mut r.added);
        sc_entries(&t, &mut r.removed);
        self.timed("UpdateDiskReplicas", |m| {
            match m.update_disk_replicas(&r.client_id, r.segment_id, &r.added, &r.removed, r.restore) {
                Ok(results) => {
                    BatchStatusReply { statuses: results.iter().map(|x| status_of(m, x).expect("some")).collect() }
                }
                Err(e) => BatchStatusReply { statuses: vec![status(m, &e).expect("some"); r.added.len().max(1)] },
            }
        })
    }

    // ---- cache-aware scheduling (see query.rs, published.rs, replicate.rs, events.rs) ----

    async fn query_keys(&self, req: Request<QueryKeysRequest>) -> Result<Response<QueryKeysReply>, tonic::Status> {
        let (t, mut r) = tenant_req(req);
        sc_all(&t, &mut r.keys);
        self.timed("QueryKeys", |m| match m.query_keys(&r.keys) {
            Ok(mut reply) => {
                reply.nodes.iter_mut().for_each(|n| unscope_id(&t, &mut n.client_id));
                QueryKeysReply { status: ok(), ..reply }
            }
            Err(e) => QueryKeysReply { status: status(m, &e), ..Default::default() },
        })
    }

    async fn prefix_query(&self, req: Request<QueryKeysRequest>) -> Result<Response<PrefixQueryReply>, tonic::Status> {
        let (t, mut r) = tenant_req(req);
        sc_all(&t, &mut r.keys);
        self.timed("PrefixQuery", |m| match m.prefix_query(&r.keys) {
            Ok(mut reply) => {
                reply.nodes.iter_mut().for_each(|n| unscope_id(&t, &mut n.client_id));
                PrefixQueryReply { status: ok(), ..reply }
            }
            Err(e) => PrefixQueryReply { status: status(m, &e), ..Default::default() },
        })
    }

    async fn node_stats(&self, req: Request<NodeStatsRequest>) -> Result<Response<NodeStatsReply>, tonic::Status> {
        let (t, _) = tenant_req(req);
        self.timed("NodeStats", |m| {
            let mut reply = m.node_stats();
            // The tenant's own clients only.
            reply.nodes.retain(|n| tenant::unscope(&t.0, &n.client_id).is_some());
            reply.nodes.iter_mut().for_each(|n| unscope_id(&t, &mut n.client_id));
            NodeStatsReply { status: ok(), ..reply }
        })
    }

    async fn publish(&self, req: Request<PublishRequest>) -> Result<Response<PublishReply>, tonic::Status> {
        let (t, mut r) = tenant_req(req);
        sc(&t, &mut r.client_id);
        r.keys.iter_mut().for_each(|k| sc(&t, &mut k.key));
        self.timed("Publish", |m| match m.publish(&r.client_id, r.tier, r.ttl_ms, &r.keys) {
            Ok(count) => PublishReply { status: ok(), count },
            Err(e) => PublishReply { status: status(m, &e), count: 0 },
        })
    }

    async fn retract(&self, req: Request<RetractRequest>) -> Result<Response<PublishReply>, tonic::Status> {
        let (t, mut r) = tenant_req(req);
        sc(&t, &mut r.client_id);
        sc_all(&t, &mut r.keys);
        self.timed("Retract", |m| match m.retract(&r.client_id, &r.keys, r.all) {
            Ok(count) => PublishReply { status: ok(), count },
            Err(e) => PublishReply { status: status(m, &e), count: 0 },
        })
    }

    async fn replicate_start(
        &self,
        req: Request<ReplicateStartRequest>,
    ) -> Result<Response<ReplicateStartReply>, tonic::Status> {
        let (t, mut r) = tenant_req(req);
        sc(&t, &mut r.client_id);
        sc(&t, &mut r.key);
        self.timed("ReplicateStart", |m| {
            match m.replicate_start_to(&r.client_id, &r.key, r.count, &r.target_segments) {
                Ok(mut p) => {
                    unscope_replicas(&t, &mut p.sources);
                    unscope_replicas(&t, &mut p.targets);
                    ReplicateStartReply {
                        status: ok(),
                        size: p.size,
                        version: p.version,
                        sources: p.sources,
                        targets: p.targets,
                        lease_ttl_ms: m.config().lease_ttl.as_millis() as u64,
                    }
                }
                Err(e) => ReplicateStartReply { status: status(m, &e), ..Default::default() },
            }
        })
    }

    async fn replicate_end(
        &self,
        req: Request<ReplicateEndRequest>,
    ) -> Result<Response<ReplicateEndReply>, tonic::Status> {
        let start = Instant::now();
        let (t, mut r) = tenant_req(req);
        sc(&t, &mut r.client_id);
        sc(&t, &mut r.key);
        let m = &self.master;
        let ended = match m.replicate_end_begin(&r.client_id, &r.key, &r.done_segments) {
            Ok(mut c) => {
                c.wait.wait(m.config().owner_ack_timeout).await;
                m.replicate_end_finish(&c)
            }
            Err(e) => Err(e),
        };
        let reply = match ended {
            Ok((added, replicas)) => ReplicateEndReply { status: ok(), added, replicas },
            Err(e) => ReplicateEndReply { status: status(m, &e), ..Default::default() },
        };
        Ok(self.observed("ReplicateEnd", start, reply))
    }

    async fn create_copy_task(
        &self,
        req: Request<CreateCopyTaskRequest>,
    ) -> Result<Response<CreateTaskReply>, tonic::Status> {
        let (t, mut r) = tenant_req(req);
        sc(&t, &mut r.key);
        self.timed("CreateCopyTask", |m| match m.create_copy_task(&r.key, &r.targets) {
            Ok(id) => CreateTaskReply { status: ok(), id: Some(tasks::wire_id(id)) },
            Err(e) => CreateTaskReply { status: status(m, &e), id: None },
        })
    }

    async fn create_move_task(
        &self,
        req: Request<CreateMoveTaskRequest>,
    ) -> Result<Response<CreateTaskReply>, tonic::Status> {
        let (t, mut r) = tenant_req(req);
        sc(&t, &mut r.key);
        self.timed("CreateMoveTask", |m| match m.create_move_task(&r.key, &r.source, &r.target) {
            Ok(id) => CreateTaskReply { status: ok(), id: Some(tasks::wire_id(id)) },
            Err(e) => CreateTaskReply { status: status(m, &e), id: None },
        })
    }

    async fn query_task(&self, req: Request<QueryTaskRequest>) -> Result<Response<QueryTaskReply>, tonic::Status> {
        let (t, r) = tenant_req(req);
        self.timed("QueryTask", |m| {
            match m.query_task(tasks::from_wire(r.id.as_ref()), |k| tenant::unscope(&t.0, k).is_some()) {
                Ok(mut info) => {
                    unscope_id(&t, &mut info.assigned_client);
                    QueryTaskReply { status: ok(), task: Some(info) }
                }
                Err(e) => QueryTaskReply { status: status(m, &e), task: None },
            }
        })
    }

    async fn finish_task(&self, req: Request<FinishTaskRequest>) -> Result<Response<StatusReply>, tonic::Status> {
        let (t, mut r) = tenant_req(req);
        sc(&t, &mut r.client_id);
        self.timed("FinishTask", |m| StatusReply {
            status: status_of(m, &m.finish_task(&r.client_id, tasks::from_wire(r.id.as_ref()), r.ok, &r.message)),
        })
    }

    async fn batch_replica_clear(
        &self,
        req: Request<BatchReplicaClearRequest>,
    ) -> Result<Response<BatchReplicaClearReply>, tonic::Status> {
        let start = Instant::now();
        let (t, mut r) = tenant_req(req);
        sc(&t, &mut r.client_id);
        sc_all(&t, &mut r.keys);
        let m = &self.master;
        let cleared = match m.batch_replica_clear(&r.client_id, &r.keys, &r.segment_name) {
            Ok((keys, removal)) => self.settle(removal).await.map(|()| keys),
            Err(e) => Err(e),
        };
        let reply = match cleared {
            Ok(keys) => BatchReplicaClearReply {
                status: ok(),
                cleared_keys: keys.iter().filter_map(|k| tenant::unscope(&t.0, k).map(str::to_string)).collect(),
            },
            Err(e) => BatchReplicaClearReply { status: status(m, &e), cleared_keys: Vec::new() },
        };
        let asked = r.keys.len();
        Ok(self.observed_n("BatchReplicaClear", asked, start, reply))
    }

    async fn take_replication_tasks(
        &self,
        req: Request<TakeReplicationTasksRequest>,
    ) -> Result<Response<TakeReplicationTasksReply>, tonic::Status> {
        let (t, r) = tenant_req(req);
        self.timed("TakeReplicationTasks", |m| {
            let tasks = m.take_replication_tasks_of(r.max.min(10_000), |k| tenant::unscope(&t.0, k).is_some());
            let tasks = tasks
                .into_iter()
                .filter_map(|x| Some(ReplicationTask { key: tenant::unscope(&t.0, &x.key)?.to_string(), ..x }))
                .collect();
            TakeReplicationTasksReply { status: ok(), tasks }
        })
    }

    type SubscribeStream = EventStream;

    async fn subscribe(&self, req: Request<SubscribeRequest>) -> Result<Response<EventStream>, tonic::Status> {
        let (t, r) = tenant_req(req);
        let prefix = r.key_prefix;
        let events = BroadcastStream::new(self.master.subscribe_events());
        // The tenant's events only, under its names.
        let stream = events.filter_map(move |item| match item {
            Ok(mut event) => {
                event.key = tenant::unscope(&t.0, &event.key).filter(|k| k.starts_with(&prefix))?.to_string();
                unscope_id(&t, &mut event.client_id);
                Some(Ok(EventMessage { event: Some(event), lost: 0 }))
            }
            Err(BroadcastStreamRecvError::Lagged(lost)) => Some(Ok(EventMessage { event: None, lost })),
        });
        Ok(Response::new(Box::pin(stream)))
    }

    type OwnerStreamStream = NewsStream;

    async fn owner_stream(
        &self,
        req: Request<tonic::Streaming<OwnerAck>>,
    ) -> Result<Response<NewsStream>, tonic::Status> {
        let (t, mut acks) = tenant_req(req);
        let hello = tokio::time::timeout(HELLO_TIMEOUT, acks.message())
            .await
            .map_err(|_| tonic::Status::deadline_exceeded("no hello on the owner stream"))??
            .ok_or_else(|| tonic::Status::invalid_argument("the owner stream closed before its hello"))?;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let m = self.master.clone();
        let client = tenant::scope(&t.0, &hello.client_id);
        let (term, segment) = (hello.term, hello.segment_id);
        let id = m.attach_owner(&client, term, segment, hello.acked, tx).map_err(|e| {
            m.metrics().error(&e);
            tonic::Status::failed_precondition(format!("{}: {e}", e.code().as_str_name()))
        })?;
        tokio::spawn(async move {
            while let Ok(Some(ack)) = acks.message().await {
                m.owner_ack(&client, ack.term, ack.segment_id, ack.acked);
            }
            m.detach_owner(segment, id);
        });
        // The news are of the owner's segment, so of its tenant's keys: under its names.
        #[allow(clippy::result_large_err)] // tonic's Status
        let news = tokio_stream::wrappers::UnboundedReceiverStream::new(rx).map(move |mut news: OwnerNews| {
            news.items.retain_mut(|i| tenant::unscope_in_place(&t.0, &mut i.key));
            Ok(news)
        });
        Ok(Response::new(Box::pin(news)))
    }

    async fn remount_with_report(
        &self,
        req: Request<RemountWithReportRequest>,
    ) -> Result<Response<RemountWithReportReply>, tonic::Status> {
        let (t, mut r) = tenant_req(req);
        sc(&t, &mut r.client_id);
        r.objects.iter_mut().for_each(|o| sc(&t, &mut o.key));
        self.timed("RemountWithReport", |m| {
            let seg = r.segment.unwrap_or_default();
            match m.remount_with_report(&r.client_id, &seg, &r.host, &r.objects, &r.held) {
                Ok(b) => RemountWithReportReply {
                    status: ok(),
                    segment_id: b.segment_id,
                    term: m.term(),
                    reinstated: b.reinstated,
                    refused: b.refused,
                },
                Err(e) => RemountWithReportReply { status: status(m, &e), term: m.term(), ..Default::default() },
            }
        })
    }
}

impl MasterService {
    /// The answer to a removal by pattern, once the owners acknowledged.
    async fn removed_reply(&self, r: Result<((u64, u64), Removal), StoreError>) -> RemoveByRegexReply {
        let m = &self.master;
        match r {
            Ok(((removed, skipped_leased), removal)) => match self.settle(removal).await {
                Ok(()) => RemoveByRegexReply { status: ok(), removed, skipped_leased },
                Err(e) => RemoveByRegexReply { status: status(m, &e), ..Default::default() },
            },
            Err(e) => RemoveByRegexReply { status: status(m, &e), ..Default::default() },
        }
    }
}

/// How long a new owner stream may take to say who it is.
const HELLO_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// An owner's news stream.
pub type NewsStream = std::pin::Pin<Box<dyn Stream<Item = Result<OwnerNews, tonic::Status>> + Send>>;

/// A subscriber's event stream.
pub type EventStream = std::pin::Pin<Box<dyn Stream<Item = Result<EventMessage, tonic::Status>> + Send>>;
