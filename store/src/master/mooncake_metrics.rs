//! The master's metrics under Mooncake's names (`master_*`, as upstream's
//! `master_metric_manager.cpp` exports them, no prefix), so that Mooncake's Grafana dashboard
//! and alerts find their series on a Crescent master. Crescent's own `crescent_master_*`
//! metrics ([`super::metrics`]) stay beside them.
//!
//! What Crescent does, these count: each gRPC method is counted under its Mooncake
//! counterpart ([`OPS`], [`BATCHES`]; failures are replies whose status is not OK, as
//! upstream counts them), evictions, reclaimed puts, the gauges of capacity, keys, soft pins
//! and clients, the per-segment gauges, the value sizes, and the get "cache" counters. What
//! Crescent has no counterpart of (NoF segments, file storage on a shared file system,
//! promotion, snapshots, copy/move tasks, drain jobs) is exported at zero, because Crescent
//! never does it: a dashboard panel over them shows 0, not "no data".

use std::collections::HashMap;

use prometheus::{Histogram, HistogramOpts, IntCounter, IntGauge, IntGaugeVec, Registry};

use crate::error::Result;
use crate::metrics_registry::{counter, gauge, gauge_vec, internal, register};

/// Crescent's gRPC method → the Mooncake operation it is counted as
/// (`master_<op>_requests_total`, `master_<op>_failures_total`).
pub const OPS: &[(&str, &str)] = &[
    ("PutStart", "put_start"),
    ("PutEnd", "put_end"),
    ("PutRevoke", "put_revoke"),
    ("GetReplicaList", "get_replica_list"),
    ("Exists", "exist_key"),
    ("Remove", "remove"),
    ("RemoveByRegex", "remove_by_regex"),
    ("RemoveAll", "remove_all"),
    ("MountSegment", "mount_segment"),
    ("UnmountSegment", "unmount_segment"),
    ("RemountSegment", "remount_segment"),
    ("Ping", "ping"),
    // Crescent's replication adds a replica by copying one: Mooncake's Copy{Start,End}.
    ("ReplicateStart", "copy_start"),
    ("ReplicateEnd", "copy_end"),
    // Warm-up workers take replication tasks: Mooncake's FetchTasks.
    ("TakeReplicationTasks", "fetch_tasks"),
    ("CreateCopyTask", "create_copy_task"),
    ("CreateMoveTask", "create_move_task"),
    ("QueryTask", "query_task"),
    // A client's report of a task it ran: Mooncake's MarkTaskToComplete (`update_task`).
    ("FinishTask", "update_task"),
];

/// Mooncake operations Crescent has no RPC for (their counters stay at zero).
const OPS_ABSENT: &[&str] = &[
    "get_replica_list_by_regex",
    "mount_nof_segment",
    "unmount_nof_segment",
    "remount_nof_segment",
    "copy_revoke",
    "move_start",
    "move_end",
    "move_revoke",
    "evict_disk_replica",
];

/// Crescent's batch gRPC method → Mooncake's batch operation (`master_batch_<op>_*`).
pub const BATCHES: &[(&str, &str)] = &[
    ("BatchPutStart", "put_start"),
    ("BatchPutEnd", "put_end"),
    ("BatchPutRevoke", "put_revoke"),
    ("BatchGetReplicaList", "get_replica_list"),
    ("BatchExists", "exist_key"),
    ("BatchReplicaClear", "replica_clear"),
];

const BATCHES_ABSENT: &[&str] = &["query_ip"];

/// Counters and gauges Crescent has no counterpart of (exported at zero).
const COUNTERS_ABSENT: &[(&str, &str)] = &[
    ("master_put_start_partial_allocations_total", "PutStart requests given fewer replicas than asked"),
    ("master_nof_heartbeat_success_total", "NoF segment heartbeats that succeeded (no NoF segments in Crescent)"),
    ("master_nof_heartbeat_failure_total", "NoF segment heartbeats that failed"),
    ("master_nof_heartbeat_timeout_total", "NoF segment heartbeats that timed out"),
    ("master_nof_segments_unmounted_by_heartbeat_total", "NoF segments unmounted after failed heartbeats"),
    ("master_successful_evictions_nof", "Eviction runs in NoF SSD that freed objects"),
    ("master_attempted_evictions_nof", "Eviction runs in NoF SSD"),
    ("master_evicted_key_count_nof", "Keys evicted from NoF SSD"),
    ("master_evicted_size_bytes_nof", "Bytes evicted from NoF SSD"),
    ("master_promotion_admitted_total", "Promotions of disk-only keys to memory admitted (none in Crescent)"),
    ("master_promotion_completed_total", "Promotions completed"),
    ("master_promotion_completed_bytes_total", "Bytes promoted"),
    ("master_promotion_expired_total", "Promotions expired"),
    ("master_promotion_failed_total", "Promotions failed"),
    ("master_promotion_cancelled_total", "Promotions cancelled"),
    ("master_promotion_rejected_frequency_total", "Promotions rejected by the admission frequency"),
    ("master_promotion_rejected_watermark_total", "Promotions rejected by the memory watermark"),
    ("master_promotion_rejected_cap_total", "Promotions rejected by the queue cap"),
    ("master_promotion_candidate_recorded_total", "Promotion candidates recorded"),
    ("master_promotion_candidate_admitted_total", "Promotion candidates admitted"),
    ("master_promotion_candidate_admission_rejected_total", "Promotion candidates rejected"),
    ("master_promotion_candidate_expired_evaluated_total", "Promotion candidates expired after evaluation"),
    ("master_promotion_candidate_expired_unevaluated_total", "Promotion candidates expired unevaluated"),
    ("master_promotion_candidate_dropped_limit_total", "Promotion candidates dropped at the limit"),
    ("master_snapshot_success", "Metadata snapshots taken (none in Crescent)"),
    ("master_snapshot_fail", "Metadata snapshots failed"),
];

const GAUGES_ABSENT: &[(&str, &str)] = &[
    ("master_nof_allocated_bytes", "NoF SSD bytes allocated (no NoF segments in Crescent)"),
    ("master_total_nof_capacity_bytes", "NoF SSD capacity"),
    (
        "master_allocated_file_size_bytes",
        "Bytes stored on a shared file system (3FS/NFS; Crescent's disk tier is crescent_master_disk_*)",
    ),
    ("master_total_file_capacity_bytes", "Capacity of the shared file system storage"),
    ("master_put_start_discarded_staging_size", "Bytes of discarded puts not released yet (Crescent frees at once)"),
    ("master_promotion_in_flight", "Promotions in flight"),
];

/// One Mooncake batch operation's counters.
struct Batch {
    requests: IntCounter,
    failures: IntCounter,
    partial: IntCounter,
    items: IntCounter,
    failed_items: IntCounter,
}

/// Mooncake's master metrics under upstream's names (no prefix: `master_*` and the cache
/// counters), for upstream's dashboards; in a registry of their own, rendered after Crescent's.
pub struct MooncakeMetrics {
    registry: Registry,
    /// `master_allocated_bytes`: memory bytes allocated across all segments.
    pub allocated_bytes: IntGauge,
    /// `master_total_capacity_bytes`: memory capacity of all mounted segments.
    pub total_capacity_bytes: IntGauge,
    /// Per memory segment (label `segment`): allocated and capacity bytes.
    pub segment_allocated_bytes: IntGaugeVec,
    /// `segment_total_capacity_bytes{segment}`: the segment's memory capacity.
    pub segment_total_capacity_bytes: IntGaugeVec,
    /// `master_key_count`: keys the master holds (committed or being written).
    pub key_count: IntGauge,
    /// `master_soft_pin_key_count`: keys under a soft pin.
    pub soft_pin_key_count: IntGauge,
    /// `master_active_clients`: live clients.
    pub active_clients: IntGauge,
    /// `master_value_size_bytes`: sizes of the values put.
    pub value_size: Histogram,
    /// `master_put_start_alloc_failures_total`: `PutStart` requests refused for want of space.
    pub put_start_alloc_failures: IntCounter,
    ops: HashMap<&'static str, (IntCounter, IntCounter)>,
    batches: HashMap<&'static str, Batch>,
    eviction_attempts: [IntCounter; 2],
    eviction_successes: [IntCounter; 2],
    evicted_keys: [IntCounter; 2],
    evicted_bytes: [IntCounter; 2],
    /// `master_put_start_discard_cnt`: puts not ended in time, discarded.
    pub put_start_discard_cnt: IntCounter,
    /// `master_put_start_release_cnt`: discarded puts whose space was freed.
    pub put_start_release_cnt: IntCounter,
    /// Gets (GetReplicaList results): all, with a complete replica, served from memory or
    /// from a disk, and their bytes.
    total_gets: IntCounter,
    valid_gets: IntCounter,
    mem_hits: IntCounter,
    file_hits: IntCounter,
    mem_hit_bytes: IntCounter,
    file_hit_bytes: IntCounter,
    /// Objects with a memory replica, and with a disk copy.
    pub mem_cache_nums: IntGauge,
    /// `file_cache_nums_`: objects with a disk copy.
    pub file_cache_nums: IntGauge,
}

/// Where one get's replicas were (for the cache counters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GetSource {
    /// A complete memory replica served it.
    Memory,
    /// Only disk copies could serve it.
    Disk,
}

impl MooncakeMetrics {
    /// Every series at 0; fails only if two series were given one name (a bug:
    /// [`crate::StoreError::Internal`]).
    pub fn new() -> Result<Self> {
        let registry = Registry::new();
        let r = &registry;
        let c = |name: &str, help: &str| counter(r, name, help);
        let g = |name: &str, help: &str| gauge(r, name, help);
        let mut ops = HashMap::new();
        for (method, op) in OPS {
            let requests = c(&format!("master_{op}_requests_total"), &format!("{op} requests ({method} RPCs)"))?;
            let failures = c(&format!("master_{op}_failures_total"), &format!("{op} requests that failed"))?;
            ops.insert(*method, (requests, failures));
        }
        for op in OPS_ABSENT {
            c(&format!("master_{op}_requests_total"), &format!("{op} requests (no such request in Crescent)"))?;
            c(&format!("master_{op}_failures_total"), &format!("{op} requests that failed"))?;
        }
        let batch = |op: &str| -> Result<Batch> {
            let n = |what: &str| format!("master_batch_{op}_{what}");
            Ok(Batch {
                requests: c(&n("requests_total"), &format!("Batch {op} requests"))?,
                failures: c(&n("failures_total"), &format!("Batch {op} requests where every item failed"))?,
                partial: c(&n("partial_successes_total"), &format!("Batch {op} requests where some items failed"))?,
                items: c(&n("items_total"), &format!("Items of batch {op} requests"))?,
                failed_items: c(&n("failed_items_total"), &format!("Failed items of batch {op} requests"))?,
            })
        };
        let mut batches = HashMap::new();
        for (method, op) in BATCHES {
            batches.insert(*method, batch(op)?);
        }
        for op in BATCHES_ABSENT {
            batch(op)?;
        }
        for (name, help) in COUNTERS_ABSENT {
            c(name, help)?;
        }
        for (name, help) in GAUGES_ABSENT {
            g(name, help)?;
        }
        let histogram = |name: &str, help: &str, buckets: Vec<f64>| {
            register(r, Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets)).map_err(internal)?)
        };
        histogram(
            "master_nof_heartbeat_probe_latency_ms",
            "NoF heartbeat probe latency in milliseconds (no NoF segments in Crescent)",
            vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0],
        )?;
        histogram(
            "master_snapshot_duration_ms",
            "Metadata snapshot durations in milliseconds (none in Crescent)",
            vec![0.0, 500.0, 1000.0, 5000.0, 10000.0, 30000.0, 60000.0, 120000.0, 180000.0, 240000.0, 300000.0],
        )?;
        let per_segment = |name: &str, help: &str| gauge_vec(r, name, help, &["segment"]);
        // Upstream's totals and their `_mem` halves (Crescent evicts memory only).
        let evictions = |total: &str, mem: &str, help: &str| -> Result<[IntCounter; 2]> {
            Ok([c(total, help)?, c(mem, &format!("{help}, in memory"))?])
        };
        Ok(MooncakeMetrics {
            allocated_bytes: g("master_allocated_bytes", "Memory bytes allocated across all segments")?,
            total_capacity_bytes: g("master_total_capacity_bytes", "Memory capacity of all mounted segments")?,
            segment_allocated_bytes: per_segment("segment_allocated_bytes", "Memory bytes allocated in the segment")?,
            segment_total_capacity_bytes: per_segment(
                "segment_total_capacity_bytes",
                "Memory capacity of the segment",
            )?,
            key_count: g("master_key_count", "Keys the master holds (committed or being written)")?,
            soft_pin_key_count: g("master_soft_pin_key_count", "Keys under a soft pin")?,
            active_clients: g("master_active_clients", "Live clients")?,
            value_size: histogram(
                "master_value_size_bytes",
                "Sizes of the values put",
                vec![4096.0, 65536.0, 262144.0, 1048576.0, 4194304.0, 16777216.0, 67108864.0],
            )?,
            put_start_alloc_failures: c(
                "master_put_start_alloc_failures_total",
                "PutStart requests refused for want of space",
            )?,
            ops,
            batches,
            eviction_attempts: evictions(
                "master_attempted_evictions_total",
                "master_attempted_evictions_mem",
                "Eviction runs",
            )?,
            eviction_successes: evictions(
                "master_successful_evictions_total",
                "master_successful_evictions_mem",
                "Eviction runs that freed objects",
            )?,
            evicted_keys: evictions("master_evicted_key_count", "master_evicted_key_count_mem", "Keys evicted")?,
            evicted_bytes: evictions("master_evicted_size_bytes", "master_evicted_size_bytes_mem", "Bytes evicted")?,
            put_start_discard_cnt: c("master_put_start_discard_cnt", "Puts not ended in time, discarded")?,
            put_start_release_cnt: c("master_put_start_release_cnt", "Discarded puts whose space was freed")?,
            total_gets: c("total_get_nums_", "GetReplicaList results")?,
            valid_gets: c("valid_get_nums_", "GetReplicaList results with at least one complete replica")?,
            mem_hits: c("mem_cache_hit_nums_", "GetReplicaList results served from memory")?,
            file_hits: c("file_cache_hit_nums_", "GetReplicaList results served from a disk only")?,
            mem_hit_bytes: c("mem_cache_hit_bytes_total", "Bytes of GetReplicaList results served from memory")?,
            file_hit_bytes: c("file_cache_hit_bytes_total", "Bytes of GetReplicaList results served from a disk")?,
            mem_cache_nums: g("mem_cache_nums_", "Values with a replica in memory")?,
            file_cache_nums: g("file_cache_nums_", "Values with a copy on a disk")?,
            registry,
        })
    }

    /// Counts one reply of gRPC `method` with `items` items of which `failed` failed (a
    /// single request: 1 item). Methods without a Mooncake counterpart are not counted here.
    pub fn record(&self, method: &str, items: usize, failed: usize) {
        if method == "PutCommitBlank" {
            // A put into a blank started and ended in this one call: Mooncake counts it as
            // both (its clients' put is always PutStart and PutEnd).
            self.record("PutStart", items, failed);
            self.record("PutEnd", items, failed);
            return;
        }
        if let Some((requests, failures)) = self.ops.get(method) {
            requests.inc();
            if failed > 0 {
                failures.inc();
            }
        } else if let Some(b) = self.batches.get(method) {
            b.requests.inc();
            b.items.inc_by(items as u64);
            if failed > 0 {
                b.failed_items.inc_by(failed as u64);
                if failed >= items { &b.failures } else { &b.partial }.inc();
            }
        }
    }

    /// One eviction run that took `keys` objects and freed `bytes` (of memory).
    pub fn eviction(&self, keys: u64, bytes: u64) {
        for i in 0..2 {
            self.eviction_attempts[i].inc();
            if keys > 0 {
                self.eviction_successes[i].inc();
                self.evicted_keys[i].inc_by(keys);
                self.evicted_bytes[i].inc_by(bytes);
            }
        }
    }

    /// One get's answer: `None` when it found no complete replica.
    pub fn get(&self, served: Option<(GetSource, u64)>) {
        self.total_gets.inc();
        match served {
            Some((GetSource::Memory, size)) => {
                self.valid_gets.inc();
                self.mem_hits.inc();
                self.mem_hit_bytes.inc_by(size);
            }
            Some((GetSource::Disk, size)) => {
                self.valid_gets.inc();
                self.file_hits.inc();
                self.file_hit_bytes.inc_by(size);
            }
            None => {}
        }
    }

    /// The registry holding these series.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }
}
