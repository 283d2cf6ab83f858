//! The master's gRPC service: a thin mapping of RPCs onto [`Master`]. Errors travel inside
//! replies as a `Status {code, message}`, so callers in any language get the store's codes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_stream::wrappers::errors::BroadcastStreamRecvError;
use tokio_stream::wrappers::BroadcastStream;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response};

use crate::error::StoreError;
use crate::master::access::Tenant;
use crate::master::mooncake_metrics::GetSource;
use crate::master::owners::{AckWait, LAZY_NEWS_DELAY};
use crate::master::removal_records::{Removal, RemovalRecords};
use crate::master::{tasks, tenant, Master, PingOutcome, MAX_KEY_LEN};

mod fastrpc;
mod outcome;
mod scoping;

pub use fastrpc::serve as serve_fast_rpc;

use crate::proto::master_server::{Master as MasterRpc, MasterServer};
use crate::proto::*;
use outcome::{answer, ok, status, status_of, status_reply, Outcome};
use scoping::{Inbound, Outbound};

/// The master's gRPC service (`crescent.master.v1.Master`, upstream's calls and Crescent's):
/// each call checks its arguments and bounds, maps to a [`Master`] method, and answers with a
/// status that carries the error's code.
pub struct MasterService {
    master: Arc<Master>,
    /// Where removals that a copy may still hold are recorded before they are answered (HA).
    records: Option<Arc<RemovalRecords>>,
    /// The fast RPC port its pings advertise (0: none).
    fast_rpc_port: u16,
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
        Self::grpc(Self::shared(master, records, 0))
    }

    /// The service, to be shared by gRPC ([`Self::grpc`]) and the fast RPC port
    /// ([`serve_fast_rpc`]) whose port (0: none) its pings advertise.
    pub fn shared(master: Arc<Master>, records: Option<Arc<RemovalRecords>>, fast_rpc_port: u16) -> Arc<MasterService> {
        Arc::new(MasterService { master, records, fast_rpc_port })
    }

    /// gRPC's server of the shared service: requests up to [`MAX_REQUEST_MESSAGE`] bytes,
    /// replies up to [`MAX_MESSAGE`].
    pub fn grpc(service: Arc<MasterService>) -> MasterServer<MasterService> {
        MasterServer::from_arc(service)
            .max_decoding_message_size(MAX_REQUEST_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE)
    }

    /// Serves one request of `asked` items (1, or a batch's keys) for tenant `t`, timed and
    /// counted.
    #[allow(clippy::result_large_err)] // tonic's handler signature
    fn timed_n<T: Outcome + Outbound>(
        &self,
        t: &Tenant,
        method: &str,
        asked: usize,
        f: impl FnOnce(&Master) -> T,
    ) -> Result<Response<T>, tonic::Status> {
        let start = Instant::now();
        let out = f(&self.master);
        Ok(self.observed_n(t, method, asked, start, out))
    }

    /// Serves one request: scoped to its tenant ([`inbound`]), then [`Self::timed`].
    #[allow(clippy::result_large_err)] // tonic's handler signature
    fn unary<Q: Inbound, T: Outcome + Outbound>(
        &self,
        req: Request<Q>,
        method: &str,
        f: impl FnOnce(&Master, Q) -> T,
    ) -> Result<Response<T>, tonic::Status> {
        let (t, r) = inbound(req);
        self.timed(&t, method, |m| f(m, r))
    }

    #[allow(clippy::result_large_err)] // tonic's handler signature
    fn timed<T: Outcome + Outbound>(
        &self,
        t: &Tenant,
        method: &str,
        f: impl FnOnce(&Master) -> T,
    ) -> Result<Response<T>, tonic::Status> {
        self.timed_n(t, method, 1, f)
    }

    /// Counts and times a request of `asked` items that began at `start`; its reply goes out
    /// under `t`'s names.
    fn observed_n<T: Outcome + Outbound>(
        &self,
        t: &Tenant,
        method: &str,
        asked: usize,
        start: Instant,
        mut out: T,
    ) -> Response<T> {
        let metrics = self.master.metrics();
        metrics.rpc_latency.with_label_values(&[method]).observe(start.elapsed().as_secs_f64());
        metrics.mooncake.record(method, asked, out.failed(asked));
        out.unscope(t);
        Response::new(out)
    }

    fn observed<T: Outcome + Outbound>(&self, t: &Tenant, method: &str, start: Instant, out: T) -> Response<T> {
        self.observed_n(t, method, 1, start, out)
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
        self.wait_owners(&mut commit.wait).await;
        let done = m.put_end_finish(&commit);
        self.schedule_lazy_news();
        done
    }

    /// Waits (up to the owner timeout) for the owners a commit told of the put, counted in the
    /// metrics when there was anything to wait for.
    async fn wait_owners(&self, wait: &mut AckWait) {
        if wait.is_empty() {
            return;
        }
        let (m, start) = (&self.master, Instant::now());
        wait.wait(m.config().owner_ack_timeout).await;
        m.metrics().commit_owner_waits.inc();
        m.metrics().commit_owner_wait_seconds.inc_by(start.elapsed().as_secs_f64());
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

    /// The answer to a removal by pattern, once the owners acknowledged.
    async fn removed_reply(&self, r: Result<((u64, u64), Removal), StoreError>) -> RemoveByRegexReply {
        let removed = match r {
            Ok((counts, removal)) => self.settle(removal).await.map(|()| counts),
            Err(e) => Err(e),
        };
        answer(
            &self.master,
            removed.map(|(removed, skipped_leased)| RemoveByRegexReply {
                removed,
                skipped_leased,
                ..Default::default()
            }),
        )
    }

    /// The placement of a put, or its error, as the reply says it.
    fn placed_reply(&self, placed: Result<(Vec<ReplicaDescriptor>, u64), StoreError>) -> PutStartReply {
        let m = &self.master;
        let put_timeout_ms = m.config().put_timeout.as_millis() as u64;
        answer(
            m,
            placed.map(|(replicas, version)| PutStartReply { replicas, version, put_timeout_ms, ..Default::default() }),
        )
    }

    /// A mount's reply: the segment's id, and the master's term either way.
    fn mounted_reply(&self, mounted: Result<u64, StoreError>) -> MountSegmentReply {
        let m = &self.master;
        let reply = answer(m, mounted.map(|segment_id| MountSegmentReply { segment_id, ..Default::default() }));
        MountSegmentReply { term: m.term(), ..reply }
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

fn replica_list_reply(m: &Master, key: &str) -> GetReplicaListReply {
    let got = m.get_replica_list(key);
    let served = got.as_ref().ok().filter(|l| !l.replicas.is_empty()).map(|l| {
        let in_memory = l.replicas.iter().any(|r| r.tier != Tier::Ssd as i32);
        (if in_memory { GetSource::Memory } else { GetSource::Disk }, l.size)
    });
    m.metrics().mooncake.get(served);
    answer(
        m,
        got.map(|l| GetReplicaListReply {
            replicas: l.replicas,
            size: l.size,
            version: l.version,
            lease_ttl_ms: l.lease_ttl.as_millis() as u64,
            checksum: l.checksum.map(|crc32| Checksum { crc32 }),
            ..Default::default()
        }),
    )
}

/// A request and the tenant it is served for ([`crate::master::access`] puts the tenant in
/// the request), its names scoped to the tenant's ([`scoping`]).
fn inbound<T: Inbound>(req: Request<T>) -> (Tenant, T) {
    let t = req.extensions().get::<Tenant>().cloned().unwrap_or_default();
    let mut r = req.into_inner();
    r.scope(&t);
    (t, r)
}

/// Whether a key of the master's belongs to tenant `t`.
fn owns(t: &Tenant, key: &str) -> bool {
    tenant::unscope(&t.0, key).is_some()
}

#[tonic::async_trait]
impl MasterRpc for MasterService {
    async fn mount_segment(
        &self,
        req: Request<MountSegmentRequest>,
    ) -> Result<Response<MountSegmentReply>, tonic::Status> {
        self.unary(req, "MountSegment", |m, r| {
            self.mounted_reply(m.mount_segment(&r.client_id, &r.segment.unwrap_or_default(), &r.host))
        })
    }

    async fn remount_segment(
        &self,
        req: Request<MountSegmentRequest>,
    ) -> Result<Response<MountSegmentReply>, tonic::Status> {
        self.unary(req, "RemountSegment", |m, r| {
            self.mounted_reply(m.remount_segment(&r.client_id, &r.segment.unwrap_or_default(), &r.host))
        })
    }

    async fn unmount_segment(
        &self,
        req: Request<UnmountSegmentRequest>,
    ) -> Result<Response<UnmountSegmentReply>, tonic::Status> {
        self.unary(req, "UnmountSegment", |m, r| {
            let busy = m.unmount_segment_leased(&r.client_id, r.segment_id);
            let ms = |b: Duration| b.as_millis().try_into().unwrap_or(u64::MAX);
            answer(m, busy.map(|b| UnmountSegmentReply { busy_ms: ms(b), ..Default::default() }))
        })
    }

    async fn put_start(&self, req: Request<PutStartRequest>) -> Result<Response<PutStartReply>, tonic::Status> {
        let start = Instant::now();
        let (t, r) = inbound(req);
        let m = &self.master;
        let opts = r.options.unwrap_or_default();
        let crc = r.checksum.map(|c| c.crc32);
        // Space freed by eviction waits for its owners' acknowledgements (see owners.rs).
        let placed =
            m.retry_after_quarantine(|| m.put_start_checked(&r.client_id, &r.key, r.size, &opts, crc, true)).await;
        Ok(self.observed(&t, "PutStart", start, self.placed_reply(placed)))
    }

    async fn put_end(&self, req: Request<KeyRequest>) -> Result<Response<StatusReply>, tonic::Status> {
        let start = Instant::now();
        let (t, r) = inbound(req);
        let done = self.commit(&r.client_id, &r.key, r.checksum.map(|c| c.crc32)).await;
        Ok(self.observed(&t, "PutEnd", start, status_reply(&self.master, done)))
    }

    async fn grant_blanks(
        &self,
        req: Request<GrantBlanksRequest>,
    ) -> Result<Response<GrantBlanksReply>, tonic::Status> {
        let start = Instant::now();
        let (t, r) = inbound(req);
        let m = &self.master;
        let granted = m.grant_blanks(&r.client_id, r.value_size, r.count);
        let reply = match granted {
            Ok((granted, mut wait)) => {
                // Answered once their owners know them (a commit then needs no word from them).
                self.wait_owners(&mut wait).await;
                let blanks = granted
                    .into_iter()
                    .map(|g| Blank {
                        id: g.id,
                        replica: Some(g.replica),
                        ttl_ms: u64::try_from(g.ttl.as_millis()).unwrap_or(u64::MAX),
                    })
                    .collect();
                answer(m, Ok(GrantBlanksReply { blanks, ..Default::default() }))
            }
            Err(e) => answer(m, Err(e)),
        };
        Ok(self.observed(&t, "GrantBlanks", start, reply))
    }

    async fn put_commit_blank(
        &self,
        req: Request<PutCommitBlankRequest>,
    ) -> Result<Response<StatusReply>, tonic::Status> {
        let start = Instant::now();
        let (t, r) = inbound(req);
        let m = &self.master;
        let done = match r.checksum {
            None => Err(StoreError::InvalidArgument("a put into a blank needs the value's checksum".into())),
            Some(c) => {
                let opts = r.options.unwrap_or_default();
                let (done, mut wait) = m.commit_blank(&r.client_id, &r.key, r.blank_id, r.size, c.crc32, &opts);
                self.wait_owners(&mut wait).await;
                self.schedule_lazy_news();
                done
            }
        };
        Ok(self.observed(&t, "PutCommitBlank", start, status_reply(m, done)))
    }

    async fn put_checksum(&self, req: Request<KeyRequest>) -> Result<Response<StatusReply>, tonic::Status> {
        self.unary(req, "PutChecksum", |m, r| {
            let told = match r.checksum {
                Some(c) => m.put_checksum(&r.client_id, &r.key, c.crc32),
                None => Err(StoreError::invalid("PutChecksum without a checksum")),
            };
            status_reply(m, told)
        })
    }

    async fn put_revoke(&self, req: Request<KeyRequest>) -> Result<Response<StatusReply>, tonic::Status> {
        let (t, r) = inbound(req);
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
        Ok(self.observed(&t, "PutRevoke", start, status_reply(m, revoked)))
    }

    async fn batch_put_start(
        &self,
        req: Request<BatchPutStartRequest>,
    ) -> Result<Response<BatchPutStartReply>, tonic::Status> {
        let start = Instant::now();
        let (t, r) = inbound(req);
        check_batch(r.keys.len())?;
        let m = &self.master;
        let mismatch = if r.keys.len() != r.sizes.len() {
            Some(format!("{} keys but {} sizes", r.keys.len(), r.sizes.len()))
        } else if !r.checksums.is_empty() && r.checksums.len() != r.keys.len() {
            Some(format!("{} keys but {} checksums", r.keys.len(), r.checksums.len()))
        } else {
            None
        };
        if let Some(why) = mismatch {
            let refused = self.placed_reply(Err(StoreError::InvalidArgument(why)));
            let items = vec![refused; r.keys.len().max(1)];
            return Ok(self.observed_n(&t, "BatchPutStart", r.keys.len(), start, BatchPutStartReply { items }));
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
            items.push(self.placed_reply(placed));
        }
        m.flush_owner_news();
        Ok(self.observed_n(&t, "BatchPutStart", r.keys.len(), start, BatchPutStartReply { items }))
    }

    async fn batch_put_end(&self, req: Request<BatchKeyRequest>) -> Result<Response<BatchStatusReply>, tonic::Status> {
        let start = Instant::now();
        let (t, r) = inbound(req);
        check_batch(r.keys.len())?;
        let m = &self.master;
        // Every key's owners are told at once (one message each); one wait for all their
        // acknowledgements; then every key committed, each shard's under one hold.
        let checksums: Vec<Option<u32>> = r.checksums.iter().map(|c| Some(c.crc32)).collect();
        let (commits, mut wait) = m.put_end_begin_batch(&r.client_id, &r.keys, &checksums);
        self.wait_owners(&mut wait).await;
        let statuses = m.put_end_finish_batch(commits).iter().map(|done| status_of(m, done)).collect();
        self.schedule_lazy_news();
        Ok(self.observed_n(&t, "BatchPutEnd", r.keys.len(), start, BatchStatusReply { statuses }))
    }

    async fn batch_put_revoke(
        &self,
        req: Request<BatchKeyRequest>,
    ) -> Result<Response<BatchStatusReply>, tonic::Status> {
        let (t, r) = inbound(req);
        check_batch(r.keys.len())?;
        let start = Instant::now();
        let m = &self.master;
        // One wait for every drop's acknowledgement (see `put_revoke`).
        let mut wait = AckWait::default();
        let statuses = r
            .keys
            .iter()
            .map(|k| {
                let revoked = m.put_revoke(&r.client_id, k).map(|w| wait.merge(w));
                status_of(m, &revoked)
            })
            .collect();
        wait.wait(m.config().owner_ack_timeout).await;
        Ok(self.observed_n(&t, "BatchPutRevoke", r.keys.len(), start, BatchStatusReply { statuses }))
    }

    async fn get_replica_list(&self, req: Request<KeyRequest>) -> Result<Response<GetReplicaListReply>, tonic::Status> {
        self.unary(req, "GetReplicaList", |m, r| replica_list_reply(m, &r.key))
    }

    async fn batch_get_replica_list(
        &self,
        req: Request<BatchKeyRequest>,
    ) -> Result<Response<BatchGetReplicaListReply>, tonic::Status> {
        let (t, r) = inbound(req);
        check_batch(r.keys.len())?;
        self.timed_n(&t, "BatchGetReplicaList", r.keys.len(), |m| BatchGetReplicaListReply {
            items: r.keys.iter().map(|k| replica_list_reply(m, k)).collect(),
        })
    }

    async fn exists(&self, req: Request<KeyRequest>) -> Result<Response<ExistsReply>, tonic::Status> {
        self.unary(req, "Exists", |m, r| {
            answer(m, m.exists(&r.key).map(|exists| ExistsReply { exists, ..Default::default() }))
        })
    }

    async fn batch_exists(&self, req: Request<BatchKeyRequest>) -> Result<Response<BatchExistsReply>, tonic::Status> {
        let (t, r) = inbound(req);
        check_batch(r.keys.len())?;
        self.timed_n(&t, "BatchExists", r.keys.len(), |m| match m.batch_exists(&r.keys) {
            Ok(exists) => BatchExistsReply { status: ok(), exists },
            Err(e) => BatchExistsReply { status: status(m, &e), exists: Vec::new() },
        })
    }

    async fn query_key(&self, req: Request<KeyRequest>) -> Result<Response<QueryKeyReply>, tonic::Status> {
        self.unary(req, "QueryKey", |m, r| answer(m, m.query(&r.key)))
    }

    async fn remove(&self, req: Request<RemoveRequest>) -> Result<Response<StatusReply>, tonic::Status> {
        let start = Instant::now();
        let (t, r) = inbound(req);
        let m = &self.master;
        // Answered once the owners acknowledged (or the wait ran out): see owners.rs.
        let removed = match m.remove(&r.key, r.force) {
            Ok(removal) => self.settle(removal).await,
            Err(e) => Err(e),
        };
        Ok(self.observed(&t, "Remove", start, status_reply(m, removed)))
    }

    async fn remove_by_regex(
        &self,
        req: Request<RemoveByRegexRequest>,
    ) -> Result<Response<RemoveByRegexReply>, tonic::Status> {
        let start = Instant::now();
        let (t, r) = inbound(req);
        let re = regex::RegexBuilder::new(&r.pattern)
            .size_limit(1 << 20)
            .build()
            .map_err(|e| StoreError::InvalidArgument(format!("bad regex {:?}: {e}", r.pattern)));
        // The tenant's keys, matched by their names.
        let tm = t.clone();
        let removed = re.and_then(|re| {
            self.master.remove_matching(move |k| tenant::unscope(&tm.0, k).is_some_and(|k| re.is_match(k)), r.force)
        });
        let reply = self.removed_reply(removed).await;
        Ok(self.observed(&t, "RemoveByRegex", start, reply))
    }

    async fn remove_all(&self, req: Request<RemoveAllRequest>) -> Result<Response<RemoveByRegexReply>, tonic::Status> {
        let start = Instant::now();
        let (t, r) = inbound(req);
        let tm = t.clone();
        let reply = self.removed_reply(self.master.remove_matching(move |k| owns(&tm, k), r.force)).await;
        Ok(self.observed(&t, "RemoveAll", start, reply))
    }

    async fn ping(&self, req: Request<PingRequest>) -> Result<Response<PingReply>, tonic::Status> {
        self.unary(req, "Ping", |m, r| {
            let pinged = match m.ping(&r.client_id) {
                PingOutcome::NotLeader(why) => Err(StoreError::NotLeader(why)),
                PingOutcome::NeedRemount => Err(StoreError::NeedRemount),
                PingOutcome::Ok => {
                    if let Some(d) = &r.disk {
                        m.record_disk_counters(&r.client_id, d);
                    }
                    let (held_generation, held_removals) = m.held_removals_for(&r.client_id).unwrap_or_default();
                    Ok(PingReply {
                        view_version: 0,
                        disk_removals: m.disk_removals_for(&r.client_id),
                        held_generation,
                        held_removals,
                        disk_only: m.disk_only_news_for(&r.client_id),
                        tasks: m.take_tasks(&r.client_id),
                        ..Default::default()
                    })
                }
            };
            PingReply { term: m.term(), fast_rpc_port: self.fast_rpc_port.into(), ..answer(m, pinged) }
        })
    }

    async fn mount_disk(&self, req: Request<MountDiskRequest>) -> Result<Response<MountSegmentReply>, tonic::Status> {
        self.unary(req, "MountDisk", |m, r| {
            m.merge_held_removals(&r.held_removals);
            self.mounted_reply(m.mount_disk_linked(
                &r.client_id,
                &r.disk_id,
                &r.disk_service,
                r.capacity,
                &r.host,
                r.owner_stream,
            ))
        })
    }

    async fn update_disk_replicas(
        &self,
        req: Request<UpdateDiskReplicasRequest>,
    ) -> Result<Response<BatchStatusReply>, tonic::Status> {
        self.unary(req, "UpdateDiskReplicas", |m, r| {
            match m.update_disk_replicas(&r.client_id, r.segment_id, &r.added, &r.removed, r.restore) {
                Ok(results) => BatchStatusReply { statuses: results.iter().map(|x| status_of(m, x)).collect() },
                Err(e) => BatchStatusReply { statuses: vec![status_of(m, &Err(e)); r.added.len().max(1)] },
            }
        })
    }

    // ---- cache-aware scheduling (see query.rs, published.rs, replicate.rs, events.rs) ----

    async fn query_keys(&self, req: Request<QueryKeysRequest>) -> Result<Response<QueryKeysReply>, tonic::Status> {
        self.unary(req, "QueryKeys", |m, r| answer(m, m.query_keys(&r.keys)))
    }

    async fn prefix_query(&self, req: Request<QueryKeysRequest>) -> Result<Response<PrefixQueryReply>, tonic::Status> {
        self.unary(req, "PrefixQuery", |m, r| answer(m, m.prefix_query(&r.keys)))
    }

    async fn node_stats(&self, req: Request<NodeStatsRequest>) -> Result<Response<NodeStatsReply>, tonic::Status> {
        self.unary(req, "NodeStats", |m, _| answer(m, Ok(m.node_stats())))
    }

    async fn publish(&self, req: Request<PublishRequest>) -> Result<Response<PublishReply>, tonic::Status> {
        self.unary(req, "Publish", |m, r| {
            let published = m.publish(&r.client_id, r.tier, r.ttl_ms, &r.keys);
            answer(m, published.map(|count| PublishReply { count, ..Default::default() }))
        })
    }

    async fn retract(&self, req: Request<RetractRequest>) -> Result<Response<PublishReply>, tonic::Status> {
        self.unary(req, "Retract", |m, r| {
            let retracted = m.retract(&r.client_id, &r.keys, r.all);
            answer(m, retracted.map(|count| PublishReply { count, ..Default::default() }))
        })
    }

    async fn replicate_start(
        &self,
        req: Request<ReplicateStartRequest>,
    ) -> Result<Response<ReplicateStartReply>, tonic::Status> {
        self.unary(req, "ReplicateStart", |m, r| {
            let planned = m.replicate_start_to(&r.client_id, &r.key, r.count, &r.target_segments);
            answer(
                m,
                planned.map(|p| ReplicateStartReply {
                    size: p.size,
                    version: p.version,
                    sources: p.sources,
                    targets: p.targets,
                    lease_ttl_ms: m.config().lease_ttl.as_millis() as u64,
                    ..Default::default()
                }),
            )
        })
    }

    async fn replicate_end(
        &self,
        req: Request<ReplicateEndRequest>,
    ) -> Result<Response<ReplicateEndReply>, tonic::Status> {
        let start = Instant::now();
        let (t, r) = inbound(req);
        let m = &self.master;
        let ended = match m.replicate_end_begin(&r.client_id, &r.key, &r.done_segments) {
            Ok(mut c) => {
                c.wait.wait(m.config().owner_ack_timeout).await;
                m.replicate_end_finish(&c)
            }
            Err(e) => Err(e),
        };
        let reply =
            answer(m, ended.map(|(added, replicas)| ReplicateEndReply { added, replicas, ..Default::default() }));
        Ok(self.observed(&t, "ReplicateEnd", start, reply))
    }

    async fn create_copy_task(
        &self,
        req: Request<CreateCopyTaskRequest>,
    ) -> Result<Response<CreateTaskReply>, tonic::Status> {
        self.unary(req, "CreateCopyTask", |m, r| task_reply(m, m.create_copy_task(&r.key, &r.targets)))
    }

    async fn create_move_task(
        &self,
        req: Request<CreateMoveTaskRequest>,
    ) -> Result<Response<CreateTaskReply>, tonic::Status> {
        self.unary(req, "CreateMoveTask", |m, r| task_reply(m, m.create_move_task(&r.key, &r.source, &r.target)))
    }

    async fn query_task(&self, req: Request<QueryTaskRequest>) -> Result<Response<QueryTaskReply>, tonic::Status> {
        let (t, r) = inbound(req);
        self.timed(&t, "QueryTask", |m| {
            let task = m.query_task(tasks::from_wire(r.id.as_ref()), |k| owns(&t, k));
            answer(m, task.map(|info| QueryTaskReply { task: Some(info), ..Default::default() }))
        })
    }

    async fn finish_task(&self, req: Request<FinishTaskRequest>) -> Result<Response<StatusReply>, tonic::Status> {
        self.unary(req, "FinishTask", |m, r| {
            status_reply(m, m.finish_task(&r.client_id, tasks::from_wire(r.id.as_ref()), r.ok, &r.message))
        })
    }

    async fn batch_replica_clear(
        &self,
        req: Request<BatchReplicaClearRequest>,
    ) -> Result<Response<BatchReplicaClearReply>, tonic::Status> {
        let start = Instant::now();
        let (t, r) = inbound(req);
        let m = &self.master;
        let cleared = match m.batch_replica_clear(&r.client_id, &r.keys, &r.segment_name) {
            Ok((keys, removal)) => self.settle(removal).await.map(|()| keys),
            Err(e) => Err(e),
        };
        let reply =
            answer(m, cleared.map(|cleared_keys| BatchReplicaClearReply { cleared_keys, ..Default::default() }));
        Ok(self.observed_n(&t, "BatchReplicaClear", r.keys.len(), start, reply))
    }

    async fn take_replication_tasks(
        &self,
        req: Request<TakeReplicationTasksRequest>,
    ) -> Result<Response<TakeReplicationTasksReply>, tonic::Status> {
        let (t, r) = inbound(req);
        self.timed(&t, "TakeReplicationTasks", |m| {
            let tasks = m.take_replication_tasks_of(r.max.min(10_000), |k| owns(&t, k));
            answer(m, Ok(TakeReplicationTasksReply { tasks, ..Default::default() }))
        })
    }

    type SubscribeStream = EventStream;

    async fn subscribe(&self, req: Request<SubscribeRequest>) -> Result<Response<EventStream>, tonic::Status> {
        let (t, r) = inbound(req);
        let prefix = r.key_prefix;
        let events = BroadcastStream::new(self.master.subscribe_events());
        // The tenant's events only, under its names.
        let stream = events.filter_map(move |item| match item {
            Ok(mut event) => {
                event.key = tenant::unscope(&t.0, &event.key).filter(|k| k.starts_with(&prefix))?.to_string();
                scoping::unscope_id(&t, &mut event.client_id);
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
        let t = req.extensions().get::<Tenant>().cloned().unwrap_or_default();
        let mut acks = req.into_inner();
        let hello = tokio::time::timeout(HELLO_TIMEOUT, acks.message())
            .await
            .map_err(|_| tonic::Status::deadline_exceeded("no hello on the owner stream"))??
            .ok_or_else(|| tonic::Status::invalid_argument("the owner stream closed before its hello"))?;
        let OwnerLink { news, acks: link } = self.attach_owner_link(&t, hello)?;
        let m = self.master.clone();
        tokio::spawn(async move {
            while let Ok(Some(ack)) = acks.message().await {
                link.ack(&m, &ack);
            }
            link.detach(&m);
        });
        Ok(Response::new(Box::pin(news.into_stream().map(Ok))))
    }

    async fn remount_with_report(
        &self,
        req: Request<RemountWithReportRequest>,
    ) -> Result<Response<RemountWithReportReply>, tonic::Status> {
        self.unary(req, "RemountWithReport", |m, r| {
            let seg = r.segment.unwrap_or_default();
            let remounted = m.remount_with_report(&r.client_id, &seg, &r.host, &r.objects, &r.held);
            let reply = answer(
                m,
                remounted.map(|b| RemountWithReportReply {
                    segment_id: b.segment_id,
                    reinstated: b.reinstated,
                    refused: b.refused,
                    ..Default::default()
                }),
            );
            RemountWithReportReply { term: m.term(), ..reply }
        })
    }
}

/// An owner stream attached at the master, over gRPC or the fast port: the news to send,
/// and where its acknowledgements go.
pub(super) struct OwnerLink {
    pub news: NewsOut,
    pub acks: OwnerAcks,
}

/// The news of an owner stream, on their way out.
pub(super) struct NewsOut {
    rx: tokio::sync::mpsc::UnboundedReceiver<OwnerNews>,
    tenant: Tenant,
}

impl NewsOut {
    /// The next news to send, its keys the owner's tenant's names; `None` once the master
    /// dropped the link (another stream of the segment took over, or the segment went).
    pub async fn next(&mut self) -> Option<OwnerNews> {
        let mut news = self.rx.recv().await?;
        news.unscope(&self.tenant);
        Some(news)
    }

    /// The news as a stream ([`Self::next`]'s items).
    pub fn into_stream(self) -> impl Stream<Item = OwnerNews> + Send {
        let tenant = self.tenant;
        tokio_stream::wrappers::UnboundedReceiverStream::new(self.rx).map(move |mut news| {
            news.unscope(&tenant);
            news
        })
    }
}

/// Where an owner stream's acknowledgements go: the owner its hello named.
pub(super) struct OwnerAcks {
    client: String,
    segment: u64,
    stream: u64,
}

impl OwnerAcks {
    /// Takes an acknowledgement the owner sent (of the term and segment it names).
    pub fn ack(&self, m: &Master, ack: &OwnerAck) {
        m.owner_ack(&self.client, ack.term, ack.segment_id, ack.acked);
    }

    /// The stream ended: its segment's news wait for the next one.
    pub fn detach(&self, m: &Master) {
        m.detach_owner(self.segment, self.stream);
    }
}

impl MasterService {
    /// Attaches the owner stream whose first acknowledgement is `hello`, under tenant `t`: the
    /// news not acknowledged yet come first, then the new ones as they are queued; a news's keys
    /// are the tenant's names. Refused (`FAILED_PRECONDITION`) for an owner of another term or
    /// a segment it does not hold.
    #[allow(clippy::result_large_err)] // tonic's Status, as gRPC's handler returns it
    pub(super) fn attach_owner_link(&self, t: &Tenant, mut hello: OwnerAck) -> Result<OwnerLink, tonic::Status> {
        hello.scope(t);
        let m = &self.master;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let (client, segment) = (hello.client_id, hello.segment_id);
        let stream = m.attach_owner(&client, hello.term, segment, hello.acked, tx).map_err(|e| {
            m.metrics().error(&e);
            tonic::Status::failed_precondition(format!("{}: {e}", e.code().as_str_name()))
        })?;
        Ok(OwnerLink { news: NewsOut { rx, tenant: t.clone() }, acks: OwnerAcks { client, segment, stream } })
    }
}

/// A created task's reply: its id.
fn task_reply(m: &Master, created: Result<tasks::Id, StoreError>) -> CreateTaskReply {
    answer(m, created.map(|id| CreateTaskReply { id: Some(tasks::wire_id(id)), ..Default::default() }))
}

/// How long a new owner stream may take to say who it is.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// An owner's news stream.
pub type NewsStream = std::pin::Pin<Box<dyn Stream<Item = Result<OwnerNews, tonic::Status>> + Send>>;

/// A subscriber's event stream.
pub type EventStream = std::pin::Pin<Box<dyn Stream<Item = Result<EventMessage, tonic::Status>> + Send>>;
