//! What the master and its clients agree on besides the messages of [`crate::proto`]: the
//! longest key, the largest object and gRPC message, how a disk's segment is named, and the
//! default cluster id. Both sides import it from here; neither imports the other.

/// Longest key accepted.
pub const MAX_KEY_LEN: usize = 4096;

/// Largest object accepted.
pub const MAX_OBJECT_SIZE: u64 = 1 << 40;

/// Largest reply the master encodes, and the client decodes: a batch's replica lists
/// (`master::service::MAX_BATCH_KEYS` × up to 16 replicas) or a scheduler query's locations fit.
pub const MAX_MESSAGE: usize = 256 << 20;

/// A disk segment's name for a disk id.
pub fn disk_segment_name(disk_id: &str) -> String {
    format!("ssd:{disk_id}")
}

/// Mooncake's default `--cluster_id`: the masters' election and the clients' leader lookup
/// both use it when none is given.
pub const DEFAULT_CLUSTER_ID: &str = "mooncake_cluster";
