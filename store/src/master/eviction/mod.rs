//! Which objects eviction takes: an [`EvictionPolicy`] plans each shard's candidates and
//! chooses among every shard's plans, one file per policy ([`lru`]: the least recently used
//! first, the master's policy). The policy decides; the driver (the master's evictor) holds
//! the locks, checks each chosen object is as planned and evicts it.

mod lru;

use std::time::Instant;

pub(crate) use lru::Lru;

use super::objects::{EvictionPlan, ObjectMap, Victim};

/// How eviction picks its victims among the objects of the shards.
pub(crate) trait EvictionPolicy: Send + Sync {
    /// One shard's candidates for freeing `target` bytes at `now`: at most `most` of its
    /// evictable objects whose keys are `eligible`, the first to go first. It may reorder the
    /// shard (objects it never takes out of its way).
    fn plan(
        &self,
        shard: &mut ObjectMap,
        now: Instant,
        target: u64,
        most: usize,
        eligible: &dyn Fn(&str) -> bool,
    ) -> EvictionPlan;

    /// The victims among every shard's plan (`(shard, plan)`): at most `most` objects toward
    /// `target` bytes, by shard in ascending order and in the order they go within each.
    fn choose(&self, plans: Vec<(usize, EvictionPlan)>, target: u64, most: usize) -> Vec<(usize, Victim)>;
}
