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
use crate::master::{tenant, Master, PingOutcome, MAX_KEY_LEN};
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

/// The tenant a request is served for ([`crate::master::access`] puts it in the request).
fn tenant_of<T>(req: &Request<T>) -> Tenant {
    req.extensions().get::<Tenant>().cloned().unwrap_or_default()
}

/// The master's names for a tenant's names ([`tenant::scope`]).
fn scoped(t: &Tenant, names: &[String]) -> Result<Vec<String>, StoreError> {
    names.iter().map(|n| tenant::scope(&t.0, n)).collect()
}

/// A client id going out to `t`'s client: its own name ("" for another tenant's, which the
/// master's rules never hand out).
fn unscope_id(t: &Tenant, id: &mut String) {
    *id = tenant::unscope(&t.0, id).unwrap_or_default().to_string();
}

fn unscope_replicas(t: &Tenant, replicas: &mut [ReplicaDescriptor]) {
    replicas.iter_mut().for_each(|r| unscope_id(t, &mut r.client_id));
}

/// Disk entries going out to `t`'s client: its keys, under its names.
fn unscope_entries(t: &Tenant, entries: Vec<DiskEntry>) -> Vec<DiskEntry> {
    entries
        .into_iter()
        .filter_map(|e| Some(DiskEntry { key: tenant::unscope(&t.0, &e.key)?.to_string(), ..e }))
        .collect()
}

fn scope_entries(t: &Tenant, entries: &[DiskEntry]) -> Result<Vec<DiskEntry>, StoreError> {
    entries.iter().map(|e| Ok(DiskEntry { key: tenant::scope(&t.0, &e.key)?, ..e.clone() })).collect()
}

/// A tenant's request with its names scoped; a name that cannot be scoped fails the reply
/// (`$fail` builds it from the error).
macro_rules! scope_or {
    ($m:expr, $e:expr, $fail:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => return $fail(status($m, &e)),
        }
    };
}

#[tonic::async_trait]
impl MasterRpc for MasterService {
    async fn mount_segment(
        &self,
        req: Request<MountSegmentRequest>,
    ) -> Result<Response<MountSegmentReply>, tonic::Status> {
        let t = tenant_of(&req);
        let r = req.into_inner();
        self.timed("MountSegment", |m| {
            let fail = |status| MountSegmentReply { status, segment_id: 0 };
            let client = scope_or!(m, tenant::scope(&t.0, &r.client_id), fail);
            let seg = r.segment.unwrap_or_default();
            match m.mount_segment(&client, &seg, &r.host) {
                Ok(id) => MountSegmentReply { status: ok(), segment_id: id },
                Err(e) => fail(status(m, &e)),
            }
        })
    }

    async fn remount_segment(
        &self,
        req: Request<MountSegmentRequest>,
    ) -> Result<Response<MountSegmentReply>, tonic::Status> {
        let t = tenant_of(&req);
        let r = req.into_inner();
        self.timed("RemountSegment", |m| {
            let fail = |status| MountSegmentReply { status, segment_id: 0 };
            let client = scope_or!(m, tenant::scope(&t.0, &r.client_id), fail);
            let seg = r.segment.unwrap_or_default();
            match m.remount_segment(&client, &seg, &r.host) {
                Ok(id) => MountSegmentReply { status: ok(), segment_id: id },
                Err(e) => fail(status(m, &e)),
            }
        })
    }

    async fn unmount_segment(
        &self,
        req: Request<UnmountSegmentRequest>,
    ) -> Result<Response<StatusReply>, tonic::Status> {
        let t = tenant_of(&req);
        let r = req.into_inner();
        self.timed("UnmountSegment", |m| {
            let client = scope_or!(m, tenant::scope(&t.0, &r.client_id), |status| StatusReply { status });
            StatusReply { status: status_of(m, &m.unmount_segment(&client, r.segment_id)) }
        })
    }

    async fn put_start(&self, req: Request<PutStartRequest>) -> Result<Response<PutStartReply>, tonic::Status> {
        let t = tenant_of(&req);
        let r = req.into_inner();
        self.timed("PutStart", |m| {
            let fail = |status| PutStartReply { status, ..Default::default() };
            let client = scope_or!(m, tenant::scope(&t.0, &r.client_id), fail);
            let key = scope_or!(m, tenant::scope(&t.0, &r.key), fail);
            let mut reply = put_start_reply(m, &client, &key, r.size, &r.options.unwrap_or_default());
            unscope_replicas(&t, &mut reply.replicas);
            reply
        })
    }

    async fn put_end(&self, req: Request<KeyRequest>) -> Result<Response<StatusReply>, tonic::Status> {
        let t = tenant_of(&req);
        let r = req.into_inner();
        self.timed("PutEnd", |m| {
            let fail = |status| StatusReply { status };
            let client = scope_or!(m, tenant::scope(&t.0, &r.client_id), fail);
            let key = scope_or!(m, tenant::scope(&t.0, &r.key), fail);
            StatusReply { status: status_of(m, &m.put_end(&client, &key)) }
        })
    }

    async fn put_revoke(&self, req: Request<KeyRequest>) -> Result<Response<StatusReply>, tonic::Status> {
        let t = tenant_of(&req);
        let r = req.into_inner();
        self.timed("PutRevoke", |m| {
            let fail = |status| StatusReply { status };
            let client = scope_or!(m, tenant::scope(&t.0, &r.client_id), fail);
            let key = scope_or!(m, tenant::scope(&t.0, &r.key), fail);
            StatusReply { status: status_of(m, &m.put_revoke(&client, &key)) }
        })
    }

    async fn batch_put_start(
        &self,
        req: Request<BatchPutStartRequest>,
    ) -> Result<Response<BatchPutStartReply>, tonic::Status> {
        let t = tenant_of(&req);
        let r = req.into_inner();
        check_batch(r.keys.len())?;
        self.timed_n("BatchPutStart", r.keys.len(), |m| {
            let n = r.keys.len().max(1);
            let fail = |status| BatchPutStartReply { items: vec![PutStartReply { status, ..Default::default() }; n] };
            if r.keys.len() != r.sizes.len() {
                let e = StoreError::InvalidArgument(format!("{} keys but {} sizes", r.keys.len(), r.sizes.len()));
                return fail(status(m, &e));
            }
            let client = scope_or!(m, tenant::scope(&t.0, &r.client_id), fail);
            let keys = scope_or!(m, scoped(&t, &r.keys), fail);
            let opts = r.options.unwrap_or_default();
            let items = keys
                .iter()
                .zip(&r.sizes)
                .map(|(k, s)| {
                    let mut reply = put_start_reply(m, &client, k, *s, &opts);
                    unscope_replicas(&t, &mut reply.replicas);
                    reply
                })
                .collect();
            BatchPutStartReply { items }
        })
    }

    async fn batch_put_end(&self, req: Request<BatchKeyRequest>) -> Result<Response<BatchStatusReply>, tonic::Status> {
        let t = tenant_of(&req);
        let r = req.into_inner();
        check_batch(r.keys.len())?;
        self.timed_n("BatchPutEnd", r.keys.len(), |m| {
            let fail = |s: Option<Status>| BatchStatusReply { statuses: vec![s.expect("some"); r.keys.len().max(1)] };
            let client = scope_or!(m, tenant::scope(&t.0, &r.client_id), fail);
            let keys = scope_or!(m, scoped(&t, &r.keys), fail);
            BatchStatusReply {
                statuses: keys.iter().map(|k| status_of(m, &m.put_end(&client, k)).expect("some")).collect(),
            }
        })
    }

    async fn batch_put_revoke(
        &self,
        req: Request<BatchKeyRequest>,
    ) -> Result<Response<BatchStatusReply>, tonic::Status> {
        let t = tenant_of(&req);
        let r = req.into_inner();
        check_batch(r.keys.len())?;
        self.timed_n("BatchPutRevoke", r.keys.len(), |m| {
            let fail = |s: Option<Status>| BatchStatusReply { statuses: vec![s.expect("some"); r.keys.len().max(1)] };
            let client = scope_or!(m, tenant::scope(&t.0, &r.client_id), fail);
            let keys = scope_or!(m, scoped(&t, &r.keys), fail);
            BatchStatusReply {
                statuses: keys.iter().map(|k| status_of(m, &m.put_revoke(&client, k)).expect("some")).collect(),
            }
        })
    }

    async fn get_replica_list(&self, req: Request<KeyRequest>) -> Result<Response<GetReplicaListReply>, tonic::Status> {
        let t = tenant_of(&req);
        let r = req.into_inner();
        self.timed("GetReplicaList", |m| {
            let key = scope_or!(m, tenant::scope(&t.0, &r.key), |status| GetReplicaListReply {
                status,
                ..Default::default()
            });
            let mut reply = replica_list_reply(m, &key);
            unscope_replicas(&t, &mut reply.replicas);
            reply
        })
    }

    async fn batch_get_replica_list(
        &self,
        req: Request<BatchKeyRequest>,
    ) -> Result<Response<BatchGetReplicaListReply>, tonic::Status> {
        let t = tenant_of(&req);
        let r = req.into_inner();
        check_batch(r.keys.len())?;
        self.timed_n("BatchGetReplicaList", r.keys.len(), |m| {
            let n = r.keys.len().max(1);
            let keys = scope_or!(m, scoped(&t, &r.keys), |status| BatchGetReplicaListReply {
                items: vec![GetReplicaListReply { status, ..Default::default() }; n]
            });
            BatchGetReplicaListReply {
                items: keys
                    .iter()
                    .map(|k| {
                        let mut reply = replica_list_reply(m, k);
                        unscope_replicas(&t, &mut reply.replicas);
                        reply
                    })
                    .collect(),
            }
        })
    }

    async fn exists(&self, req: Request<KeyRequest>) -> Result<Response<ExistsReply>, tonic::Status> {
        let t = tenant_of(&req);
        let r = req.into_inner();
        self.timed("Exists", |m| {
            let fail = |status| ExistsReply { status, exists: false };
            let key = scope_or!(m, tenant::scope(&t.0, &r.key), fail);
            match m.exists(&key) {
                Ok(exists) => ExistsReply { status: ok(), exists },
                Err(e) => fail(status(m, &e)),
            }
        })
    }

    async fn batch_exists(&self, req: Request<BatchKeyRequest>) -> Result<Response<BatchExistsReply>, tonic::Status> {
        let t = tenant_of(&req);
        let r = req.into_inner();
        check_batch(r.keys.len())?;
        self.timed_n("BatchExists", r.keys.len(), |m| {
            let fail = |status| BatchExistsReply { status, exists: Vec::new() };
            let keys = scope_or!(m, scoped(&t, &r.keys), fail);
            match m.batch_exists(&keys) {
                Ok(exists) => BatchExistsReply { status: ok(), exists },
                Err(e) => fail(status(m, &e)),
            }
        })
    }

    async fn query_key(&self, req: Request<KeyRequest>) -> Result<Response<QueryKeyReply>, tonic::Status> {
        let t = tenant_of(&req);
        let r = req.into_inner();
        self.timed("QueryKey", |m| {
            let fail = |status| QueryKeyReply { status, ..Default::default() };
            let key = scope_or!(m, tenant::scope(&t.0, &r.key), fail);
            match m.query(&key) {
                Ok(mut reply) => {
                    unscope_replicas(&t, &mut reply.replicas);
                    QueryKeyReply { status: ok(), ..reply }
                }
                Err(e) => fail(status(m, &e)),
            }
        })
    }

    async fn remove(&self, req: Request<RemoveRequest>) -> Result<Response<StatusReply>, tonic::Status> {
        let t = tenant_of(&req);
        let r = req.into_inner();
        self.timed("Remove", |m| {
            let key = scope_or!(m, tenant::scope(&t.0, &r.key), |status| StatusReply { status });
            StatusReply { status: status_of(m, &m.remove(&key, r.force)) }
        })
    }

    async fn remove_by_regex(
        &self,
        req: Request<RemoveByRegexRequest>,
    ) -> Result<Response<RemoveByRegexReply>, tonic::Status> {
        let t = tenant_of(&req);
        let r = req.into_inner();
        self.timed("RemoveByRegex", |m| {
            let fail = |status| RemoveByRegexReply { status, ..Default::default() };
            let re = regex::RegexBuilder::new(&r.pattern)
                .size_limit(1 << 20)
                .build()
                .map_err(|e| StoreError::InvalidArgument(format!("bad regex {:?}: {e}", r.pattern)));
            let re = scope_or!(m, re, fail);
            // The tenant's keys, matched by their names.
            let mine = |k: &str| tenant::unscope(&t.0, k).is_some_and(|k| re.is_match(k));
            let (removed, skipped_leased) = m.remove_matching(mine, r.force);
            RemoveByRegexReply { status: ok(), removed, skipped_leased }
        })
    }

    async fn remove_all(&self, req: Request<RemoveAllRequest>) -> Result<Response<RemoveByRegexReply>, tonic::Status> {
        let t = tenant_of(&req);
        let r = req.into_inner();
        self.timed("RemoveAll", |m| {
            let (removed, skipped_leased) = m.remove_matching(|k| tenant::unscope(&t.0, k).is_some(), r.force);
            RemoveByRegexReply { status: ok(), removed, skipped_leased }
        })
    }

    async fn ping(&self, req: Request<PingRequest>) -> Result<Response<PingReply>, tonic::Status> {
        let t = tenant_of(&req);
        let r = req.into_inner();
        self.timed("Ping", |m| {
            let client =
                scope_or!(m, tenant::scope(&t.0, &r.client_id), |status| PingReply { status, ..Default::default() });
            match m.ping(&client) {
                PingOutcome::Ok => {
                    if let Some(d) = &r.disk {
                        m.record_disk_counters(&client, d);
                    }
                    let (held_generation, held_removals) = m.held_removals_for(&client).unwrap_or_default();
                    // The removals of the tenant's keys only.
                    let held_removals = held_removals
                        .into_iter()
                        .filter_map(|h| Some(HeldRemoval { key: tenant::unscope(&t.0, &h.key)?.to_string(), ..h }))
                        .collect();
                    PingReply {
                        status: ok(),
                        view_version: 0,
                        disk_removals: unscope_entries(&t, m.disk_removals_for(&client)),
                        held_generation,
                        held_removals,
                        disk_only: unscope_entries(&t, m.disk_only_news_for(&client)),
                    }
                }
                PingOutcome::NeedRemount => {
                    PingReply { status: status(m, &StoreError::NeedRemount), ..Default::default() }
                }
            }
        })
    }

    async fn mount_disk(&self, req: Request<MountDiskRequest>) -> Result<Response<MountSegmentReply>, tonic::Status> {
        let t = tenant_of(&req);
        let r = req.into_inner();
        self.timed("MountDisk", |m| {
            let fail = |status| MountSegmentReply { status, segment_id: 0 };
            let client = scope_or!(m, tenant::scope(&t.0, &r.client_id), fail);
            let held: Vec<HeldRemoval> = r
                .held_removals
                .iter()
                .filter_map(|h| Some(HeldRemoval { key: tenant::scope(&t.0, &h.key).ok()?, ..h.clone() }))
                .collect();
            m.merge_held_removals(&held);
            match m.mount_disk(&client, &r.disk_id, &r.disk_service, r.capacity, &r.host) {
                Ok(id) => MountSegmentReply { status: ok(), segment_id: id },
                Err(e) => fail(status(m, &e)),
            }
        })
    }

    async fn update_disk_replicas(
        &self,
        req: Request<UpdateDiskReplicasRequest>,
    ) -> Result<Response<BatchStatusReply>, tonic::Status> {
        let t = tenant_of(&req);
        let r = req.into_inner();
        self.timed("UpdateDiskReplicas", |m| {
            let fail = |s: Option<Status>| BatchStatusReply { statuses: vec![s.expect("some"); r.added.len().max(1)] };
            let client = scope_or!(m, tenant::scope(&t.0, &r.client_id), fail);
            let added = scope_or!(m, scope_entries(&t, &r.added), fail);
            let removed = scope_or!(m, scope_entries(&t, &r.removed), fail);
            match m.update_disk_replicas(&client, r.segment_id, &added, &removed, r.restore) {
                Ok(results) => {
                    BatchStatusReply { statuses: results.iter().map(|x| status_of(m, x).expect("some")).collect() }
                }
                Err(e) => fail(status(m, &e)),
            }
        })
    }

    // ---- cache-aware scheduling (see query.rs, published.rs, replicate.rs, events.rs) ----

    async fn query_keys(&self, req: Request<QueryKeysRequest>) -> Result<Response<QueryKeysReply>, tonic::Status> {
        let t = tenant_of(&req);
        let r = req.into_inner();
        self.timed("QueryKeys", |m| {
            let fail = |status| QueryKeysReply { status, ..Default::default() };
            let keys = scope_or!(m, scoped(&t, &r.keys), fail);
            match m.query_keys(&keys) {
                Ok(mut reply) => {
                    reply.nodes.iter_mut().for_each(|n| unscope_id(&t, &mut n.client_id));
                    QueryKeysReply { status: ok(), ..reply }
                }
                Err(e) => fail(status(m, &e)),
            }
        })
    }

    async fn prefix_query(&self, req: Request<QueryKeysRequest>) -> Result<Response<PrefixQueryReply>, tonic::Status> {
        let t = tenant_of(&req);
        let r = req.into_inner();
        self.timed("PrefixQuery", |m| {
            let fail = |status| PrefixQueryReply { status, ..Default::default() };
            let keys = scope_or!(m, scoped(&t, &r.keys), fail);
            match m.prefix_query(&keys) {
                Ok(mut reply) => {
                    reply.nodes.iter_mut().for_each(|n| unscope_id(&t, &mut n.client_id));
                    PrefixQueryReply { status: ok(), ..reply }
                }
                Err(e) => fail(status(m, &e)),
            }
        })
    }

    async fn node_stats(&self, req: Request<NodeStatsRequest>) -> Result<Response<NodeStatsReply>, tonic::Status> {
        let t = tenant_of(&req);
        self.timed("NodeStats", |m| {
            let mut reply = m.node_stats();
            // The tenant's own clients only.
            reply.nodes.retain(|n| tenant::unscope(&t.0, &n.client_id).is_some());
            reply.nodes.iter_mut().for_each(|n| unscope_id(&t, &mut n.client_id));
            NodeStatsReply { status: ok(), ..reply }
        })
    }

    async fn publish(&self, req: Request<PublishRequest>) -> Result<Response<PublishReply>, tonic::Status> {
        let t = tenant_of(&req);
        let r = req.into_inner();
        self.timed("Publish", |m| {
            let fail = |status| PublishReply { status, count: 0 };
            let client = scope_or!(m, tenant::scope(&t.0, &r.client_id), fail);
            let keys: Result<Vec<PublishedKey>, StoreError> =
                r.keys.iter().map(|k| Ok(PublishedKey { key: tenant::scope(&t.0, &k.key)?, ..k.clone() })).collect();
            let keys = scope_or!(m, keys, fail);
            match m.publish(&client, r.tier, r.ttl_ms, &keys) {
                Ok(count) => PublishReply { status: ok(), count },
                Err(e) => fail(status(m, &e)),
            }
        })
    }

    async fn retract(&self, req: Request<RetractRequest>) -> Result<Response<PublishReply>, tonic::Status> {
        let t = tenant_of(&req);
        let r = req.into_inner();
        self.timed("Retract", |m| {
            let fail = |status| PublishReply { status, count: 0 };
            let client = scope_or!(m, tenant::scope(&t.0, &r.client_id), fail);
            let keys = scope_or!(m, scoped(&t, &r.keys), fail);
            match m.retract(&client, &keys, r.all) {
                Ok(count) => PublishReply { status: ok(), count },
                Err(e) => fail(status(m, &e)),
            }
        })
    }

    async fn replicate_start(
        &self,
        req: Request<ReplicateStartRequest>,
    ) -> Result<Response<ReplicateStartReply>, tonic::Status> {
        let t = tenant_of(&req);
        let r = req.into_inner();
        self.timed("ReplicateStart", |m| {
            let fail = |status| ReplicateStartReply { status, ..Default::default() };
            let client = scope_or!(m, tenant::scope(&t.0, &r.client_id), fail);
            let key = scope_or!(m, tenant::scope(&t.0, &r.key), fail);
            match m.replicate_start(&client, &key, r.count) {
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
                Err(e) => fail(status(m, &e)),
            }
        })
    }

    async fn replicate_end(
        &self,
        req: Request<ReplicateEndRequest>,
    ) -> Result<Response<ReplicateEndReply>, tonic::Status> {
        let t = tenant_of(&req);
        let r = req.into_inner();
        self.timed("ReplicateEnd", |m| {
            let fail = |status| ReplicateEndReply { status, ..Default::default() };
            let client = scope_or!(m, tenant::scope(&t.0, &r.client_id), fail);
            let key = scope_or!(m, tenant::scope(&t.0, &r.key), fail);
            match m.replicate_end(&client, &key, &r.done_segments) {
                Ok((added, replicas)) => ReplicateEndReply { status: ok(), added, replicas },
                Err(e) => fail(status(m, &e)),
            }
        })
    }

    async fn take_replication_tasks(
        &self,
        req: Request<TakeReplicationTasksRequest>,
    ) -> Result<Response<TakeReplicationTasksReply>, tonic::Status> {
        let t = tenant_of(&req);
        let r = req.into_inner();
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
        let t = tenant_of(&req);
        let prefix = req.into_inner().key_prefix;
        let events = BroadcastStream::new(self.master.subscribe_events());
        // The tenant's events only, under its names.
        let stream = events.filter_map(move |item| match item {
            Ok(mut event) => {
                let key = tenant::unscope(&t.0, &event.key).filter(|k| k.starts_with(&prefix))?.to_string();
                event.key = key;
                unscope_id(&t, &mut event.client_id);
                Some(Ok(EventMessage { event: Some(event), lost: 0 }))
            }
            Err(BroadcastStreamRecvError::Lagged(lost)) => Some(Ok(EventMessage { event: None, lost })),
        });
        Ok(Response::new(Box::pin(stream)))
    }
}

/// A subscriber's event stream.
pub type EventStream = std::pin::Pin<Box<dyn Stream<Item = Result<EventMessage, tonic::Status>> + Send>>;
