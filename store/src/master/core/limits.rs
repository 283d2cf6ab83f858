//! The limits the core checks a request against: segment and key sizes, replica counts, and
//! what one object's metadata is counted as.

use crate::error::{Result, StoreError};
use crate::protocol::{MAX_KEY_LEN, MAX_OBJECT_SIZE};

/// Smallest segment a client may mount (one page; smaller ones cannot hold the allocator's units).
pub const MIN_SEGMENT_SIZE: u64 = 4096;
/// Most replicas per object.
pub const MAX_REPLICAS: u32 = 16;
/// What one object costs the master's memory beyond its key, as the metadata limit counts it
/// ([`crate::master::MasterConfig::max_metadata_bytes`]): above the 192-210 B per object `storebench master`
/// measures at 1 M and 10 M objects, so the limit errs on the safe side.
pub const OBJECT_METADATA_BYTES: u64 = 256;

/// A key of 1 to [`MAX_KEY_LEN`] bytes, or [`StoreError::InvalidArgument`].
pub(crate) fn check_key(key: &str) -> Result<()> {
    if key.is_empty() || key.len() > MAX_KEY_LEN {
        return Err(StoreError::InvalidArgument(format!("a key has 1 to {MAX_KEY_LEN} bytes (got {})", key.len())));
    }
    Ok(())
}

/// A put of `size` bytes under `key` with `replica_num` replicas (0: one) within the limits:
/// the replicas it takes.
pub(crate) fn check_put(key: &str, size: u64, replica_num: u32) -> Result<u32> {
    check_key(key)?;
    if size == 0 || size > MAX_OBJECT_SIZE {
        return Err(StoreError::InvalidArgument(format!("object size {size} is not in 1..={MAX_OBJECT_SIZE}")));
    }
    let replicas = replica_num.max(1);
    if replicas > MAX_REPLICAS {
        return Err(StoreError::InvalidArgument(format!("replica_num {replicas} exceeds {MAX_REPLICAS}")));
    }
    Ok(replicas)
}
