//! Prometheus metrics of the master (one registry per master, so several can run in a process).

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::error::{Result, StoreError};
use crate::master::mooncake_metrics::MooncakeMetrics;
use crate::master::{DiskTotals, Totals};
use crate::metrics_registry::{counter, gauge, internal, register};
use crate::proto::DiskCounters;

pub struct Metrics {
    registry: Registry,
    pub capacity: IntGauge,
    pub used: IntGauge,
    pub keys: IntGauge,
    pub segments: IntGauge,
    pub clients: IntGauge,
    pub puts: IntCounter,
    pub gets: IntCounter,
    pub evictions: IntCounter,
    pub evicted_bytes: IntCounter,
    pub puts_reclaimed: IntCounter,
    pub clients_dropped: IntCounter,
    pub errors: IntCounterVec,
    pub rpc_latency: HistogramVec,
    // cache-aware scheduling
    pub queried_keys: IntCounter,
    pub published_keys: IntGauge,
    pub events: IntCounter,
    pub replicas_added: IntCounter,
    pub replicated_bytes: IntCounter,
    pub hot_keys: IntCounter,
    pub replication_tasks_queued: IntCounter,
    pub replication_tasks_dropped: IntCounter,
    pub replication_tasks_taken: IntCounter,
    // disk tier (set at each scrape, see [`crate::master::Master::render_metrics`])
    pub disk_segments: IntGauge,
    pub disk_capacity: IntGauge,
    pub disk_used: IntGauge,
    pub disk_replicas: IntGauge,
    pub disk_only_keys: IntGauge,
    pub disk_removals_pending: IntGauge,
    /// What each disk's client reported (label `disk`, `counter`): its counters since it started.
    pub disk_client: IntGaugeVec,
    // high availability (see [`crate::master::ha`])
    pub elections: IntCounter,
    pub is_leader: IntGauge,
    pub term: IntGauge,
    /// The same (and more) under Mooncake's names, for upstream's dashboard.
    pub mooncake: MooncakeMetrics,
}

impl Metrics {
    pub fn new() -> Result<Self> {
        let registry = Registry::new_custom(Some("crescent_master".into()), None).map_err(internal)?;
        let gauge = |name: &str, help: &str| gauge(&registry, name, help);
        let counter = |name: &str, help: &str| counter(&registry, name, help);
        let errors =
            IntCounterVec::new(Opts::new("errors_total", "Failed operations by kind"), &["kind"]).map_err(internal)?;
        let errors = register(&registry, errors)?;
        let rpc_latency = HistogramVec::new(
            HistogramOpts::new("rpc_latency_seconds", "Time to serve an RPC, by method")
                .buckets(prometheus::exponential_buckets(0.000_01, 4.0, 10).map_err(internal)?),
            &["method"],
        )
        .map_err(internal)?;
        let rpc_latency = register(&registry, rpc_latency)?;
        let disk_client = IntGaugeVec::new(
            Opts::new(
                "disk_client",
                "Disk tier counters each mounted disk's client reported on its last ping (since it started)",
            ),
            &["disk", "counter"],
        )
        .map_err(internal)?;
        let disk_client = register(&registry, disk_client)?;
        Ok(Metrics {
            disk_client,
            capacity: gauge("capacity_bytes", "Bytes contributed by mounted segments")?,
            used: gauge("used_bytes", "Bytes allocated to objects")?,
            keys: gauge("keys", "Objects (committed or being written)")?,
            segments: gauge("segments", "Mounted segments")?,
            clients: gauge("clients", "Live clients")?,
            puts: counter("puts_total", "Puts started")?,
            elections: counter("elections_total", "Times this master was elected leader (HA)")?,
            is_leader: gauge("is_leader", "1 while this master may serve (the leader, or the only master), else 0")?,
            term: gauge("term", "This master's term (HA: the revision of its leadership; else a random id)")?,
            gets: counter("gets_total", "Replica lists served")?,
            evictions: counter("evictions_total", "Objects evicted")?,
            evicted_bytes: counter("evicted_bytes_total", "Bytes freed by eviction")?,
            puts_reclaimed: counter("puts_reclaimed_total", "Unfinished puts reclaimed after the put timeout")?,
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

    pub fn error(&self, e: &StoreError) {
        self.errors.with_label_values(&[e.code().as_str_name()]).inc();
    }

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
