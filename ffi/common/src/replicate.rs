//! Mooncake's `ReplicateConfig`: how many replicas a put makes, its pins and the segments
//! it prefers, turned into the store's [`PutOptions`].

use crescent_store::proto::PutOptions;
use crescent_store::{StoreClient, StoreError};

/// Mooncake's `SoftPinAction`: what a put or an upsert does to the object's soft pin (an
/// object soft-pinned is not evicted while its pin lasts).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SoftPinAction {
    /// A new object gets no pin; an upsert keeps the pin the object had.
    #[default]
    Preserve,
    /// Pinned for `soft_pin_ttl_ms`, or the master's default soft-pin time (30 min).
    Enable,
    /// No pin.
    Disable,
}

/// The fields of Mooncake's `ReplicateConfig`, with its defaults (one replica, no pin, no
/// preferred segment).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicateConfig {
    pub replica_num: u32,
    /// NVMe-oF replicas: Mooncake's optional pool, not in Crescent (only 0 is accepted).
    pub nof_replica_num: u32,
    /// DFS replicas: Mooncake's optional pool, not in Crescent (only 0 is accepted).
    pub dfs_replica_num: u32,
    pub soft_pin_action: SoftPinAction,
    /// The pin's time with [`SoftPinAction::Enable`]; `None`: the master's default. Any other
    /// action with a time is refused, as Mooncake's master does.
    pub soft_pin_ttl_ms: Option<u64>,
    /// Never evicted (only removed).
    pub with_hard_pin: bool,
    /// Tried first for the first replica, whatever the master's allocation strategy.
    pub preferred_segment: String,
    /// Tried next, in order, one replica each.
    pub preferred_segments: Vec<String>,
    /// Mooncake refuses this on puts ("not supported"); so does Crescent.
    pub prefer_alloc_in_same_node: bool,
}

impl Default for ReplicateConfig {
    fn default() -> Self {
        ReplicateConfig {
            replica_num: 1,
            nof_replica_num: 0,
            dfs_replica_num: 0,
            soft_pin_action: SoftPinAction::Preserve,
            soft_pin_ttl_ms: None,
            with_hard_pin: false,
            preferred_segment: String::new(),
            preferred_segments: Vec::new(),
            prefer_alloc_in_same_node: false,
        }
    }
}

impl ReplicateConfig {
    /// The options of a put made by `client` with this configuration: the client's own
    /// defaults (its segment as `local_first`'s choice) with these fields over them.
    pub fn put_options(&self, client: &StoreClient) -> Result<PutOptions, StoreError> {
        let base = client.default_options();
        self.apply(base)
    }

    /// These fields over `base`; the combinations Mooncake refuses are refused here too.
    pub fn apply(&self, base: PutOptions) -> Result<PutOptions, StoreError> {
        let invalid = |m: &str| Err(StoreError::InvalidArgument(m.to_string()));
        if self.replica_num == 0 {
            return invalid("replica_num must be at least 1");
        }
        if self.nof_replica_num != 0 || self.dfs_replica_num != 0 {
            return invalid("nof_replica_num and dfs_replica_num must be 0: Crescent has no NVMe-oF or DFS pool");
        }
        if self.prefer_alloc_in_same_node {
            return invalid("prefer_alloc_in_same_node is not supported by puts");
        }
        let (soft_pin, soft_pin_ttl_ms) = match (self.soft_pin_action, self.soft_pin_ttl_ms) {
            (SoftPinAction::Enable, ttl) => (true, ttl.unwrap_or(0)),
            (_, Some(_)) => return invalid("soft_pin_ttl_ms needs soft_pin_action ENABLE"),
            (_, None) => (false, 0),
        };
        let preferred = std::iter::once(&self.preferred_segment).chain(&self.preferred_segments);
        Ok(PutOptions {
            replica_num: self.replica_num,
            soft_pin,
            soft_pin_ttl_ms,
            hard_pin: self.with_hard_pin,
            preferred_segments: preferred.filter(|s| !s.is_empty()).cloned().collect(),
            ..base
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn soft_pin_follows_mooncakes_rules() {
        let base = PutOptions::default;
        let enable = ReplicateConfig { soft_pin_action: SoftPinAction::Enable, ..Default::default() };
        let o = enable.apply(base()).unwrap();
        assert!(o.soft_pin && o.soft_pin_ttl_ms == 0);
        let o = ReplicateConfig { soft_pin_ttl_ms: Some(1000), ..enable.clone() }.apply(base()).unwrap();
        assert!(o.soft_pin && o.soft_pin_ttl_ms == 1000);
        for action in [SoftPinAction::Preserve, SoftPinAction::Disable] {
            let c = ReplicateConfig { soft_pin_action: action, soft_pin_ttl_ms: Some(1000), ..Default::default() };
            assert!(matches!(c.apply(base()), Err(StoreError::InvalidArgument(_))), "{action:?}");
            let c = ReplicateConfig { soft_pin_action: action, ..Default::default() };
            assert!(!c.apply(base()).unwrap().soft_pin);
        }
    }

    #[test]
    fn unsupported_placements_are_refused() {
        for c in [
            ReplicateConfig { replica_num: 0, ..Default::default() },
            ReplicateConfig { nof_replica_num: 1, ..Default::default() },
            ReplicateConfig { dfs_replica_num: 1, ..Default::default() },
            ReplicateConfig { prefer_alloc_in_same_node: true, ..Default::default() },
        ] {
            assert!(matches!(c.apply(PutOptions::default()), Err(StoreError::InvalidArgument(_))), "{c:?}");
        }
        let c = ReplicateConfig {
            replica_num: 2,
            with_hard_pin: true,
            preferred_segment: "a:1".into(),
            preferred_segments: vec![String::new(), "b:2".into()],
            ..Default::default()
        };
        let o = c.apply(PutOptions::default()).unwrap();
        assert_eq!((o.replica_num, o.hard_pin), (2, true));
        assert_eq!(o.preferred_segments, ["a:1", "b:2"]);
    }
}
