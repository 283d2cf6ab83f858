//! Prometheus metrics of the master (one registry per master, so several can run in a process).

use prometheus::{
    Counter, Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Registry,
    TextEncoder,
};

use crate::error::{Result, StoreError};
use crate::master::mooncake_metrics::MooncakeMetrics;
use crate::master::{DiskTotals, Totals};
use crate::metrics_registry::{counter, counter_vec, gauge, gauge_vec, internal, register};
use crate::proto::DiskCounters;

/// The master's Prometheus series (prefix `crescent_master_`), in a registry of its own, and
/// Mooncake's names beside them ([`MooncakeMetrics`]). Each field's doc names its series.
pub struct Metrics {
    registry: Registry,
    /// `capacity_bytes`: bytes contributed by mounted segments.
    pub capacity: IntGauge,
    /// `used_bytes`: bytes allocated to objects.
    pub used: IntGauge,
    /// `keys`: objects, committed or being written.
    pub keys: IntGauge,
    /// `segments`: mounted segments.
    pub segments: IntGauge,
    /// `clients`: live clients.
    pub clients: IntGauge,
    /// `metadata_bytes`: the objects' metadata as the metadata limit counts it.
    pub metadata_bytes: IntGauge,
    /// `metadata_limit_bytes`: that limit (`--max-metadata-bytes`).
    pub metadata_limit: IntGauge,
    /// `puts_total`: puts started.
    pub puts: IntCounter,
    /// `gets_total`: replica lists served.
    pub gets: IntCounter,
    /// `evictions_total`: objects evicted.
    pub evictions: IntCounter,
    /// `evicted_bytes_total`: bytes freed by eviction.
    pub evicted_bytes: IntCounter,
    /// `puts_reclaimed_total`: unfinished puts reclaimed after the put timeout.
    pub puts_reclaimed: IntCounter,
    /// `blanks_granted_total`: blanks granted to clients ahead of their puts.
    pub blanks_granted: IntCounter,
    /// `blanks_committed_total`: puts committed in a blank (one call, no `PutStart`).
    pub blanks_committed: IntCounter,
    /// `blanks_expired_total`: blanks taken back unused after their time.
    pub blanks_expired: IntCounter,
    /// `clients_dropped_total`: clients dropped for missing heartbeats.
    pub clients_dropped: IntCounter,
    /// `errors_total{kind}`: failed operations, by the error's code.
    pub errors: IntCounterVec,
    /// `rpc_latency_seconds{method}`: time to serve an RPC, by method.
    pub rpc_latency: HistogramVec,
    // cache-aware scheduling
    /// `queried_keys_total`: keys asked about by `QueryKeys` and `PrefixQuery`.
    pub queried_keys: IntCounter,
    /// `published_keys`: near-engine keys published by clients now.
    pub published_keys: IntGauge,
    /// `events_total`: events sent to subscribers.
    pub events: IntCounter,
    /// `replicas_added_total`: replicas added to existing objects (warm-up).
    pub replicas_added: IntCounter,
    /// `replicated_bytes_total`: bytes copied into added replicas.
    pub replicated_bytes: IntCounter,
    /// `hot_keys_total`: keys found above the hot-key read rate.
    pub hot_keys: IntCounter,
    /// `replication_tasks_queued_total`: hot keys queued for replication.
    pub replication_tasks_queued: IntCounter,
    /// `replication_tasks_dropped_total`: hot keys not queued because the queue was full.
    pub replication_tasks_dropped: IntCounter,
    /// `replication_tasks_taken_total`: replication tasks handed to workers.
    pub replication_tasks_taken: IntCounter,
    // disk tier (set at each scrape, see [`crate::master::Master::render_metrics`])
    /// `disk_segments`: mounted disk segments (tier SSD).
    pub disk_segments: IntGauge,
    /// `disk_capacity_bytes`: bytes the mounted disk segments may use.
    pub disk_capacity: IntGauge,
    /// `disk_used_bytes`: bytes of the values with a copy on a mounted disk, per copy.
    pub disk_used: IntGauge,
    /// `disk_replicas`: disk copies of objects (one per object and disk).
    pub disk_replicas: IntGauge,
    /// `disk_only_keys`: objects whose only copies are on disks.
    pub disk_only_keys: IntGauge,
    /// `disk_removals_pending`: removals waiting for a disk to delete its files.
    pub disk_removals_pending: IntGauge,
    /// What each disk's client reported (label `disk`, `counter`): its counters since it started.
    pub disk_client: IntGaugeVec,
    // high availability (see [`crate::master::ha`])
    /// `elections_total`: times this master was elected leader (HA).
    pub elections: IntCounter,
    /// `is_leader`: 1 while this master may serve (the leader, or the only master), else 0.
    pub is_leader: IntGauge,
    /// `term`: this master's term (HA: the revision of its leadership; else a random id).
    pub term: IntGauge,
    /// The same (and more) under Mooncake's names, for upstream's dashboard.
    pub mooncake: MooncakeMetrics,
    /// Requests refused for want of the cluster secret's token (label `port`: grpc, admin).
    pub auth_refused: IntCounterVec,
    /// `fast_rpc_calls_total`: calls served on the fast RPC port (`crate::fastrpc`); their
    /// latency and outcome are counted with gRPC's, by method.
    pub fast_rpc_calls: IntCounter,
    /// `fast_rpc_owner_streams_total`: owner streams opened on the fast RPC port.
    pub fast_rpc_owner_streams: IntCounter,
    /// `commit_owner_waits_total`: commits (`PutEnd`, one per call of `BatchPutEnd`) that came
    /// before their replicas' owners acknowledged the news of the put, and waited for them.
    pub commit_owner_waits: IntCounter,
    /// `commit_owner_wait_seconds_total`: the time those commits waited.
    pub commit_owner_wait_seconds: Counter,
}

impl Metrics {
    /// Every series at 0; fails only if two series were given one name (a bug:
    /// [`StoreError::Internal`]).
    pub fn new() -> Result<Self> {
        let registry = Registry::new_custom(Some("crescent_master".into()), None).map_err(internal)?;
        let gauge = |name: &str, help: &str| gauge(&registry, name, help);
        let counter = |name: &str, help: &str| counter(&registry, name, help);
        let errors = counter_vec(&registry, "errors_total", "Failed operations by kind", &["kind"])?;
        let rpc_latency = HistogramVec::new(
            HistogramOpts::new("rpc_latency_seconds", "Time to serve an RPC, by method")
                .buckets(prometheus::exponential_buckets(0.000_01, 4.0, 10).map_err(internal)?),
            &["method"],
        )
        .map_err(internal)?;
        let rpc_latency = register(&registry, rpc_latency)?;
        let disk_client = gauge_vec(
            &registry,
            "disk_client",
            "Disk tier counters each mounted disk's client reported on its last ping (since it started)",
            &["disk", "counter"],
        )?;
        let auth_refused = counter_vec(
            &registry,
            "auth_refused_total",
            "Requests refused for want of the cluster secret's token, by port",
            &["port"],
        )?;
        Ok(Metrics {
            auth_refused,
            fast_rpc_calls: counter("fast_rpc_calls_total", "Calls served on the fast RPC port")?,
            fast_rpc_owner_streams: counter(
                "fast_rpc_owner_streams_total",
                "Owner streams opened on the fast RPC port",
            )?,
            commit_owner_waits: counter(
                "commit_owner_waits_total",
                "Commits that came before their owners acknowledged the put's news, and waited for them",
            )?,
            commit_owner_wait_seconds: register(
                &registry,
                Counter::new(
                    "commit_owner_wait_seconds_total",
                    "Time commits waited for their owners' acknowledgements",
                )
                .map_err(internal)?,
            )?,
            disk_client,
            capacity: gauge("capacity_bytes", "Bytes contributed by mounted segments")?,
            used: gauge("used_bytes", "Bytes allocated to objects")?,
            keys: gauge("keys", "Objects (committed or being written)")?,
            segments: gauge("segments", "Mounted segments")?,
            clients: gauge("clients", "Live clients")?,
            metadata_bytes: gauge("metadata_bytes", "The objects' metadata, as --max-metadata-bytes counts it")?,
            metadata_limit: gauge("metadata_limit_bytes", "The limit of metadata_bytes (--max-metadata-bytes)")?,
            puts: counter("puts_total", "Puts started")?,
            elections: counter("elections_total", "Times this master was elected leader (HA)")?,
            is_leader: gauge("is_leader", "1 while this master may serve (the leader, or the only master), else 0")?,
            term: gauge("term", "This master's term (HA: the revision of its leadership; else a random id)")?,
            gets: counter("gets_total", "Replica lists served")?,
            evictions: counter("evictions_total", "Objects evicted")?,
            evicted_bytes: counter("evicted_bytes_total", "Bytes freed by eviction")?,
            puts_reclaimed: counter("puts_reclaimed_total", "Unfinished puts reclaimed after the put timeout")?,
            blanks_granted: counter("blanks_granted_total", "Blanks granted to clients ahead of their puts")?,
            blanks_committed: counter("blanks_committed_total", "Puts committed in a blank")?,
            blanks_expired: counter("blanks_expired_total", "Blanks taken back unused after their time")?,
            clients_dropped: counter("clients_dropped_total", "Clients dropped for missing heartbeats")?,
            errors,
            rpc_latency,
            queried_keys: counter("queried_keys_total", "Keys asked about by QueryKeys and PrefixQuery")?,
            published_keys: gauge("published_keys", "Near-engine keys published by clients")?,
            events: counter("events_total", "Events sent to subscribers")?,
            replicas_added: counter("replicas_added_total", "Replicas added to existing objects (warm-up)")?,
            replicated_bytes: counter("replicated_bytes_total", "Bytes copied into added replicas")?,
            hot_keys: counter("hot_keys_total", "Keys found above the hot-key read rate")?,
            replication_tasks_queued: counter("replication_tasks_queued_total", "Hot keys queued for replication")?,
            replication_tasks_dropped: counter(
                "replication_tasks_dropped_total",
                "Hot keys not queued because the replication queue was full",
            )?,
            replication_tasks_taken: counter("replication_tasks_taken_total", "Replication tasks handed to workers")?,
            disk_segments: gauge("disk_segments", "Mounted disk segments (tier SSD)")?,
            disk_capacity: gauge("disk_capacity_bytes", "Bytes the mounted disk segments may use")?,
            disk_used: gauge("disk_used_bytes", "Bytes of the values with a copy on a mounted disk, per copy")?,
            disk_replicas: gauge("disk_replicas", "Disk copies of objects (one per object and disk)")?,
            disk_only_keys: gauge("disk_only_keys", "Objects whose only copies are on disks")?,
            disk_removals_pending: gauge(
                "disk_removals_pending",
                "Removals waiting for a disk to delete its files (acknowledged removals leave)",
            )?,
            mooncake: MooncakeMetrics::new()?,
            registry,
        })
    }

    /// Counts a failed operation under its error's code.
    pub fn error(&self, e: &StoreError) {
        self.errors.with_label_values(&[e.code().as_str_name()]).inc();
    }

    /// Sets the size gauges (ours and Mooncake's) from the master's totals.
    pub fn set_totals(&self, t: &Totals) {
        self.capacity.set(t.capacity as i64);
        self.used.set(t.used as i64);
        self.keys.set(t.keys as i64);
        self.segments.set(t.segments as i64);
        self.clients.set(t.clients as i64);
        let mc = &self.mooncake;
        mc.total_capacity_bytes.set(t.capacity as i64);
        mc.allocated_bytes.set(t.used as i64);
        mc.key_count.set(t.keys as i64);
        mc.active_clients.set(t.clients as i64);
    }

    /// Sets the disk tier's gauges from the master's totals, and `disk_client` from what each
    /// disk's client (by disk id) reported on its last ping.
    pub fn set_disk(&self, d: &DiskTotals, clients: &[(String, DiskCounters)]) {
        self.disk_client.reset();
        for (disk, c) in clients {
            for (name, v) in [
                ("files", c.files),
                ("used_bytes", c.used_bytes),
                ("written", c.written),
                ("bytes_written", c.bytes_written),
                ("queue_full", c.queue_full),
                ("write_failures", c.write_failures),
                ("evicted", c.evicted),
                ("busy_dropped", c.busy_dropped),
                ("too_large", c.too_large),
                ("recycled", c.recycled),
                ("retired_files", c.retired_files),
                ("retired_bytes", c.retired_bytes),
            ] {
                self.disk_client.with_label_values(&[disk.as_str(), name]).set(v as i64);
            }
        }
        self.disk_segments.set(d.segments as i64);
        self.disk_capacity.set(d.capacity as i64);
        self.disk_used.set(d.used as i64);
        self.disk_replicas.set(d.replicas as i64);
        self.disk_only_keys.set(d.disk_only_keys as i64);
        self.disk_removals_pending.set(d.removals_pending as i64);
    }

    /// The Prometheus text exposition: Crescent's metrics, then Mooncake's names.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let mut families = self.registry.gather();
        families.extend(self.mooncake.registry().gather());
        let _ = TextEncoder::new().encode(&families, &mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    }
}
