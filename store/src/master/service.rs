//! The master's gRPC service: a thin mapping of RPCs onto [`Master`]. Errors travel inside
//! replies as a `Status {code, message}`, so callers in any language get the store's codes.

use std::sync::Arc;
use std::time::Instant;

use tokio_stream::wrappers::errors::BroadcastStreamRecvError;
use tokio_stream::wrappers::BroadcastStream;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response};

use crate::error::StoreError;
use crate::master::mooncake_metrics::GetSource;
use crate::master::{Master, PingOutcome, MAX_KEY_LEN};
use crate::proto::master_server::{Master as MasterRpc, MasterServer};
use crate::proto::*;

pub struct MasterService {
    master: Arc<Master>,
}

/// Most keys in one batch call (BatchPutStart/End/Revoke, BatchGetReplicaList, BatchExists);
/// a larger batch is refused whole with `INVALID_ARGUMENT` (the client splits its batches).
pub const MAX_BATCH_KEYS: usize = 16_384;

/// Bytes a request spends per key beyond the key itself, generously: field tags and lengths,
/// a size or version varint, an entry's enclosing message (a `DiskEntry`, a `HeldRemoval`
/// with its disk name).
const PER_KEY_OVERHEAD: usize = 64;

/// Largest request the master decodes: a batch of [`MAX_BATCH_KEYS`] keys of [`MAX_KEY_LEN`]
/// bytes each, their per-key fields, and 1 MiB for the rest (client id, options, names).
/// A message announcing more is refused from its 5-byte gRPC header with `OUT_OF_RANGE`,
/// before any of it is buffered.
pub const MAX_REQUEST_MESSAGE: usize = MAX_BATCH_KEYS * (MAX_KEY_LEN + PER_KEY_OVERHEAD) + (1 << 20);

/// Largest reply the master encodes, and the client decodes: a batch's replica lists
/// ([`MAX_BATCH_KEYS`] × up to 16 replicas) or a scheduler query's locations fit.
pub const MAX_MESSAGE: usize = 256 << 20;

impl MasterService {
    pub fn new(master: Arc<Master>) -> MasterServer<MasterService> {
        MasterServer::new(MasterService { master })
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
        let metrics = self.master.metrics();
        metrics.rpc_latency.with_label_values(&[method]).observe(start.elapsed().as_secs_f64());
        metrics.mooncake.record(method, asked, out.failed(asked));
        Ok(Response::new(out))
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
    ReplicateStartReply,
    ReplicateEndReply,
    TakeReplicationTasksReply,
    QueryKeysReply,
    PrefixQueryReply,
    NodeStatsReply,
    PublishReply,
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

fn put_start_reply(m: &Master, client: &str, key: &str, size: u64, opts: &PutOptions) -> PutStartReply {
    match m.put_start(client, key, size, opts) {
        Ok((replicas, version)) => PutStartReply { status: ok(), replicas, version },
        Err(e) => PutStartReply { status: status(m, &e), ..Default::default() },
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
        },
        Err(e) => GetReplicaListReply { status: status(m, &e), ..Default::default() },
    }
}

#[tonic::async_trait]
impl MasterRpc for MasterService {
    async fn mount_segment(
        &self,
        req: Request<MountSegmentRequest>,
    ) -> Result<Response<MountSegmentReply>, tonic::Status> {
        let r = req.into_inner();
        self.timed("MountSegment", |m| {
            let seg = r.segment.unwrap_or_default();
            match m.mount_segment(&r.client_id, &seg, &r.host) {
                Ok(id) => MountSegmentReply { status: ok(), segment_id: id },
                Err(e) => MountSegmentReply { status: status(m, &e), segment_id: 0 },
            }
        })
    }

    async fn remount_segment(
        &self,
        req: Request<MountSegmentRequest>,
    ) -> Result<Response<MountSegmentReply>, tonic::Status> {
        let r = req.into_inner();
        self.timed("RemountSegment", |m| {
            let seg = r.segment.unwrap_or_default();
            match m.remount_segment(&r.client_id, &seg, &r.host) {
                Ok(id) => MountSegmentReply { status: ok(), segment_id: id },
                Err(e) => MountSegmentReply { status: status(m, &e), segment_id: 0 },
            }
        })
    }

    async fn unmount_segment(
        &self,
        req: Request<UnmountSegmentRequest>,
    ) -> Result<Response<StatusReply>, tonic::Status> {
        let r = req.into_inner();
        self.timed("UnmountSegment", |m| StatusReply {
            status: status_of(m, &m.unmount_segment(&r.client_id, r.segment_id)),
        })
    }

    async fn put_start(&self, req: Request<PutStartRequest>) -> Result<Response<PutStartReply>, tonic::Status> {
        let r = req.into_inner();
        self.timed("PutStart", |m| put_start_reply(m, &r.client_id, &r.key, r.size, &r.options.unwrap_or_default()))
    }

    async fn put_end(&self, req: Request<KeyRequest>) -> Result<Response<StatusReply>, tonic::Status> {
        let r = req.into_inner();
        self.timed("PutEnd", |m| StatusReply { status: status_of(m, &m.put_end(&r.client_id, &r.key)) })
    }

    async fn put_revoke(&self, req: Request<KeyRequest>) -> Result<Response<StatusReply>, tonic::Status> {
        let r = req.into_inner();
        self.timed("PutRevoke", |m| StatusReply { status: status_of(m, &m.put_revoke(&r.client_id, &r.key)) })
    }

    async fn batch_put_start(
        &self,
        req: Request<BatchPutStartRequest>,
    ) -> Result<Response<BatchPutStartReply>, tonic::Status> {
        let r = req.into_inner();
        check_batch(r.keys.len())?;
        self.timed_n("BatchPutStart", r.keys.len(), |m| {
            if r.keys.len() != r.sizes.len() {
                let e = StoreError::InvalidArgument(format!("{} keys but {} sizes", r.keys.len(), r.sizes.len()));
                return BatchPutStartReply {
                    items: vec![PutStartReply { status: status(m, &e), ..Default::default() }; r.keys.len().max(1)],
                };
            }
            let opts = r.options.unwrap_or_default();
            let items =
                r.keys.iter().zip(&r.sizes).map(|(k, s)| put_start_reply(m, &r.client_id, k, *s, &opts)).collect();
            BatchPutStartReply { items }
        })
    }

    async fn batch_put_end(&self, req: Request<BatchKeyRequest>) -> Result<Response<BatchStatusReply>, tonic::Status> {
        let r = req.into_inner();
        check_batch(r.keys.len())?;
        self.timed_n("BatchPutEnd", r.keys.len(), |m| BatchStatusReply {
            statuses: r.keys.iter().map(|k| status_of(m, &m.put_end(&r.client_id, k)).expect("some")).collect(),
        })
    }

    async fn batch_put_revoke(
        &self,
        req: Request<BatchKeyRequest>,
    ) -> Result<Response<BatchStatusReply>, tonic::Status> {
        let r = req.into_inner();
        check_batch(r.keys.len())?;
        self.timed_n("BatchPutRevoke", r.keys.len(), |m| BatchStatusReply {
            statuses: r.keys.iter().map(|k| status_of(m, &m.put_revoke(&r.client_id, k)).expect("some")).collect(),
        })
    }

    async fn get_replica_list(&self, req: Request<KeyRequest>) -> Result<Response<GetReplicaListReply>, tonic::Status> {
        let r = req.into_inner();
        self.timed("GetReplicaList", |m| replica_list_reply(m, &r.key))
    }

    async fn batch_get_replica_list(
        &self,
        req: Request<BatchKeyRequest>,
    ) -> Result<Response<BatchGetReplicaListReply>, tonic::Status> {
        let r = req.into_inner();
        check_batch(r.keys.len())?;
        self.timed_n("BatchGetReplicaList", r.keys.len(), |m| BatchGetReplicaListReply {
            items: r.keys.iter().map(|k| replica_list_reply(m, k)).collect(),
        })
    }

    async fn exists(&self, req: Request<KeyRequest>) -> Result<Response<ExistsReply>, tonic::Status> {
        let r = req.into_inner();
        self.timed("Exists", |m| match m.exists(&r.key) {
            Ok(exists) => ExistsReply { status: ok(), exists },
            Err(e) => ExistsReply { status: status(m, &e), exists: false },
        })
    }

    async fn batch_exists(&self, req: Request<BatchKeyRequest>) -> Result<Response<BatchExistsReply>, tonic::Status> {
        let r = req.into_inner();
        check_batch(r.keys.len())?;
        self.timed_n("BatchExists", r.keys.len(), |m| match m.batch_exists(&r.keys) {
            Ok(exists) => BatchExistsReply { status: ok(), exists },
            Err(e) => BatchExistsReply { status: status(m, &e), exists: Vec::new() },
        })
    }

    async fn query_key(&self, req: Request<KeyRequest>) -> Result<Response<QueryKeyReply>, tonic::Status> {
        let r = req.into_inner();
        self.timed("QueryKey", |m| match m.query(&r.key) {
            Ok(reply) => QueryKeyReply { status: ok(), ..reply },
            Err(e) => QueryKeyReply { status: status(m, &e), ..Default::default() },
        })
    }

    async fn remove(&self, req: Request<RemoveRequest>) -> Result<Response<StatusReply>, tonic::Status> {
        let r = req.into_inner();
        self.timed("Remove", |m| StatusReply { status: status_of(m, &m.remove(&r.key, r.force)) })
    }

    async fn remove_by_regex(
        &self,
        req: Request<RemoveByRegexRequest>,
    ) -> Result<Response<RemoveByRegexReply>, tonic::Status> {
        let r = req.into_inner();
        self.timed("RemoveByRegex", |m| match m.remove_by_regex(&r.pattern, r.force) {
            Ok((removed, skipped_leased)) => RemoveByRegexReply { status: ok(), removed, skipped_leased },
            Err(e) => RemoveByRegexReply { status: status(m, &e), ..Default::default() },
        })
    }

    async fn remove_all(&self, req: Request<RemoveAllRequest>) -> Result<Response<RemoveByRegexReply>, tonic::Status> {
        let r = req.into_inner();
        self.timed("RemoveAll", |m| {
            let (removed, skipped_leased) = m.remove_all(r.force);
            RemoveByRegexReply { status: ok(), removed, skipped_leased }
        })
    }

    async fn ping(&self, req: Request<PingRequest>) -> Result<Response<PingReply>, tonic::Status> {
        let r = req.into_inner();
        self.timed("Ping", |m| match m.ping(&r.client_id) {
            PingOutcome::Ok => {
                if let Some(d) = &r.disk {
                    m.record_disk_counters(&r.client_id, d);
                }
                let (held_generation, held_removals) = m.held_removals_for(&r.client_id).unwrap_or_default();
                PingReply {
                    status: ok(),
                    view_version: 0,
                    disk_removals: m.disk_removals_for(&r.client_id),
                    held_generation,
                    held_removals,
                    disk_only: m.disk_only_news_for(&r.client_id),
                }
            }
            PingOutcome::NeedRemount => PingReply { status: status(m, &StoreError::NeedRemount), ..Default::default() },
        })
    }

    async fn mount_disk(&self, req: Request<MountDiskRequest>) -> Result<Response<MountSegmentReply>, tonic::Status> {
        let r = req.into_inner();
        self.timed("MountDisk", |m| {
            m.merge_held_removals(&r.held_removals);
            match m.mount_disk(&r.client_id, &r.disk_id, &r.disk_service, r.capacity, &r.host) {
                Ok(id) => MountSegmentReply { status: ok(), segment_id: id },
                Err(e) => MountSegmentReply { status: status(m, &e), segment_id: 0 },
            }
        })
    }

    async fn update_disk_replicas(
        &self,
        req: Request<UpdateDiskReplicasRequest>,
    ) -> Result<Response<BatchStatusReply>, tonic::Status> {
        let r = req.into_inner();
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
        let r = req.into_inner();
        self.timed("QueryKeys", |m| match m.query_keys(&r.keys) {
            Ok(reply) => QueryKeysReply { status: ok(), ..reply },
            Err(e) => QueryKeysReply { status: status(m, &e), ..Default::default() },
        })
    }

    async fn prefix_query(&self, req: Request<QueryKeysRequest>) -> Result<Response<PrefixQueryReply>, tonic::Status> {
        let r = req.into_inner();
        self.timed("PrefixQuery", |m| match m.prefix_query(&r.keys) {
            Ok(reply) => PrefixQueryReply { status: ok(), ..reply },
            Err(e) => PrefixQueryReply { status: status(m, &e), ..Default::default() },
        })
    }

    async fn node_stats(&self, _req: Request<NodeStatsRequest>) -> Result<Response<NodeStatsReply>, tonic::Status> {
        self.timed("NodeStats", |m| NodeStatsReply { status: ok(), ..m.node_stats() })
    }

    async fn publish(&self, req: Request<PublishRequest>) -> Result<Response<PublishReply>, tonic::Status> {
        let r = req.into_inner();
        self.timed("Publish", |m| match m.publish(&r.client_id, r.tier, r.ttl_ms, &r.keys) {
            Ok(count) => PublishReply { status: ok(), count },
            Err(e) => PublishReply { status: status(m, &e), count: 0 },
        })
    }

    async fn retract(&self, req: Request<RetractRequest>) -> Result<Response<PublishReply>, tonic::Status> {
        let r = req.into_inner();
        self.timed("Retract", |m| match m.retract(&r.client_id, &r.keys, r.all) {
            Ok(count) => PublishReply { status: ok(), count },
            Err(e) => PublishReply { status: status(m, &e), count: 0 },
        })
    }

    async fn replicate_start(
        &self,
        req: Request<ReplicateStartRequest>,
    ) -> Result<Response<ReplicateStartReply>, tonic::Status> {
        let r = req.into_inner();
        self.timed("ReplicateStart", |m| match m.replicate_start(&r.client_id, &r.key, r.count) {
            Ok(p) => ReplicateStartReply {
                status: ok(),
                size: p.size,
                version: p.version,
                sources: p.sources,
                targets: p.targets,
                lease_ttl_ms: m.config().lease_ttl.as_millis() as u64,
            },
            Err(e) => ReplicateStartReply { status: status(m, &e), ..Default::default() },
        })
    }

    async fn replicate_end(
        &self,
        req: Request<ReplicateEndRequest>,
    ) -> Result<Response<ReplicateEndReply>, tonic::Status> {
        let r = req.into_inner();
        self.timed("ReplicateEnd", |m| match m.replicate_end(&r.client_id, &r.key, &r.done_segments) {
            Ok((added, replicas)) => ReplicateEndReply { status: ok(), added, replicas },
            Err(e) => ReplicateEndReply { status: status(m, &e), ..Default::default() },
        })
    }

    async fn take_replication_tasks(
        &self,
        req: Request<TakeReplicationTasksRequest>,
    ) -> Result<Response<TakeReplicationTasksReply>, tonic::Status> {
        let r = req.into_inner();
        self.timed("TakeReplicationTasks", |m| TakeReplicationTasksReply {
            status: ok(),
            tasks: m.take_replication_tasks(r.max.min(10_000)),
        })
    }

    type SubscribeStream = EventStream;

    async fn subscribe(&self, req: Request<SubscribeRequest>) -> Result<Response<EventStream>, tonic::Status> {
        let prefix = req.into_inner().key_prefix;
        let events = BroadcastStream::new(self.master.subscribe_events());
        let stream = events.filter_map(move |item| match item {
            Ok(event) if event.key.starts_with(&prefix) => Some(Ok(EventMessage { event: Some(event), lost: 0 })),
            Ok(_) => None,
            Err(BroadcastStreamRecvError::Lagged(lost)) => Some(Ok(EventMessage { event: None, lost })),
        });
        Ok(Response::new(Box::pin(stream)))
    }
}

/// A subscriber's event stream.
pub type EventStream = std::pin::Pin<Box<dyn Stream<Item = Result<EventMessage, tonic::Status>> + Send>>;
