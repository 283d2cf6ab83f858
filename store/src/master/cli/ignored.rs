//! `mooncake_master`'s flags that Crescent accepts with no feature behind them: checked as
//! upstream's types (hidden from `--help`), then named in one warning.

use clap::{Arg, ArgAction};

use super::{duration_flag, gflags_bool};

/// A flag of `mooncake_master` that Crescent accepts without a feature behind it.
pub(super) struct Ignored {
    pub(super) name: &'static str,
    kind: Kind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Bool,
    Int,
    Uint,
    Double,
    Str,
    Duration,
}

pub(super) const fn ig(name: &'static str, kind: Kind) -> Ignored {
    Ignored { name, kind }
}

/// `mooncake_master`'s flags (and glog's) with no Crescent feature behind them: their values
/// are checked as upstream's types, then they are named in one warning. Crescent's
/// counterparts, where there are, are in the docs' compatibility table.
pub(super) const IGNORED: &[Ignored] = &[
    ig("max_kv_soft_pin_ttl", Kind::Duration),
    ig("allow_evict_soft_pinned_objects", Kind::Bool),
    ig("nof_eviction_ratio", Kind::Double),
    ig("nof_eviction_high_watermark_ratio", Kind::Double),
    ig("rpc_interface", Kind::Str),
    ig("rpc_conn_timeout_seconds", Kind::Int),
    ig("enable_offload", Kind::Bool),
    ig("offload_on_evict", Kind::Bool),
    ig("offload_force_evict", Kind::Bool),
    ig("offloading_queue_limit", Kind::Uint),
    ig("offload_cap_ratio", Kind::Double),
    ig("promotion_on_hit", Kind::Bool),
    ig("promotion_admission_threshold", Kind::Uint),
    ig("promotion_queue_limit", Kind::Uint),
    ig("promotion_max_per_heartbeat", Kind::Uint),
    ig("dynamic_replication_mode", Kind::Str),
    ig("dynamic_replication_heat_window_seconds", Kind::Uint),
    ig("dynamic_replication_admission_qps_threshold", Kind::Double),
    ig("dynamic_replication_max_memory_replicas", Kind::Uint),
    ig("enable_kv_events", Kind::Bool),
    ig("kv_events_bind_endpoint", Kind::Str),
    ig("kv_events_model_name", Kind::Str),
    ig("kv_events_backend_id", Kind::Str),
    ig("kv_events_tenant_id", Kind::Str),
    ig("kv_events_additional_salt", Kind::Str),
    ig("kv_events_lora_name", Kind::Str),
    ig("kv_events_block_size", Kind::Uint),
    ig("kv_events_dp_rank", Kind::Uint),
    ig("kv_events_emit_legacy_compat", Kind::Bool),
    ig("kv_events_emit_object_key", Kind::Bool),
    ig("kv_events_queue_capacity", Kind::Uint),
    ig("nof_heartbeat_interval_sec", Kind::Int),
    ig("nof_heartbeat_probe_timeout_ms", Kind::Uint),
    ig("nof_heartbeat_failures_threshold", Kind::Uint),
    ig("root_fs_dir", Kind::Str),
    ig("global_file_segment_size", Kind::Int),
    ig("oplog_poll_interval_ms", Kind::Int),
    ig("oplog_batch_max_entries", Kind::Uint),
    ig("batch_oplog_retry_timeout_sec", Kind::Uint),
    ig("enable_metadata_cleanup_on_timeout", Kind::Bool),
    ig("pod_name", Kind::Str),
    ig("pod_namespace", Kind::Str),
    ig("put_start_release_timeout_sec", Kind::Uint),
    ig("enable_disk_eviction", Kind::Bool),
    ig("quota_bytes", Kind::Uint),
    ig("enable_multi_tenants", Kind::Bool),
    ig("tenant_quota_connector_type", Kind::Str),
    ig("tenant_quota_connector_uri", Kind::Str),
    ig("snapshot_backup_dir", Kind::Str),
    ig("enable_snapshot_restore", Kind::Bool),
    ig("enable_snapshot", Kind::Bool),
    ig("snapshot_interval_seconds", Kind::Uint),
    ig("snapshot_child_timeout_seconds", Kind::Uint),
    ig("snapshot_retention_count", Kind::Uint),
    ig("snapshot_object_store_type", Kind::Str),
    ig("snapshot_payload_store_type", Kind::Str),
    ig("snapshot_payload_backend_type", Kind::Str),
    ig("snapshot_catalog_store_type", Kind::Str),
    ig("snapshot_catalog_backend_type", Kind::Str),
    ig("snapshot_catalog_store_connstring", Kind::Str),
    ig("snapshot_catalog_backend_connstring", Kind::Str),
    ig("max_total_processing_tasks", Kind::Uint),
    ig("max_retry_attempts", Kind::Uint),
    ig("cxl_path", Kind::Str),
    ig("cxl_size", Kind::Uint),
    ig("enable_cxl", Kind::Bool),
    // glog's, which mooncake_master also takes (Crescent logs through tracing: RUST_LOG).
    ig("log_dir", Kind::Str),
    ig("logtostderr", Kind::Bool),
    ig("alsologtostderr", Kind::Bool),
    ig("colorlogtostderr", Kind::Bool),
    ig("minloglevel", Kind::Int),
    ig("stderrthreshold", Kind::Int),
    ig("vmodule", Kind::Str),
    ig("max_log_size", Kind::Uint),
    ig("logbufsecs", Kind::Int),
];

pub(super) fn ignored_arg(f: &Ignored) -> Arg {
    let a = Arg::new(f.name).long(f.name).hide(true).action(ArgAction::Set);
    match f.kind {
        Kind::Bool => a.value_parser(gflags_bool).num_args(0..=1).require_equals(true).default_missing_value("true"),
        Kind::Int => a.value_parser(clap::value_parser!(i64)),
        Kind::Uint => a.value_parser(clap::value_parser!(u64)),
        Kind::Double => a.value_parser(clap::value_parser!(f64)),
        Kind::Str => a,
        Kind::Duration => a.value_parser(duration_flag),
    }
}
