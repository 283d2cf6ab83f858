//! Mooncake's `ReplicateConfig`: how many replicas a put makes, its pins and the segments
//! it prefers, turned into the store's [`PutOptions`].

use crescent_store::proto::PutOptions;
use crescent_store::{StoreApi, StoreError};

/// The fields of Mooncake's `ReplicateConfig`, with its defaults (one replica, no pin, no
/// preferred segment).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicateConfig {
    pub replica_num: u32,
    /// Kept for the master's default soft-pin time (30 min): not evicted meanwhile.
    pub with_soft_pin: bool,
    /// Never evicted (only removed).
    pub with_hard_pin: bool,
    /// Tried first for the first replica, whatever the master's allocation strategy.
    pub preferred_segment: String,
    /// Tried next, in order, one replica each.
    pub preferred_segments: Vec<String>,
}

impl Default for ReplicateConfig {
    fn default() -> Self {
        ReplicateConfig {
            replica_num: 1,
            with_soft_pin: false,
            with_hard_pin: false,
            preferred_segment: String::new(),
            preferred_segments: Vec::new(),
        }
    }
}

impl ReplicateConfig {
    /// The options of a put made by `client` with this configuration: the client's own
    /// defaults (its segment as `local_first`'s choice) with these fields over them.
    pub fn put_options(&self, client: &dyn StoreApi) -> Result<PutOptions, StoreError> {
        if self.replica_num == 0 {
            return Err(StoreError::InvalidArgument("replica_num must be at least 1".into()));
        }
        let preferred = std::iter::once(&self.preferred_segment).chain(&self.preferred_segments);
        Ok(PutOptions {
            replica_num: self.replica_num,
            soft_pin: self.with_soft_pin,
            hard_pin: self.with_hard_pin,
            preferred_segments: preferred.filter(|s| !s.is_empty()).cloned().collect(),
            ..client.default_options()
        })
    }
}
