//! The least recently used objects first ([`Lru`]): each shard keeps its objects in the order
//! of their last use, every use a tick of one process-wide counter, so the shards' plans merge
//! by tick into the order a single list would give. Objects whose file is still being written
//! from memory go after every other one.

use std::time::Instant;

use super::EvictionPolicy;
use crate::master::objects::{EvictionPlan, ObjectMap, Victim};

/// Least recently used first.
pub(crate) struct Lru;

impl EvictionPolicy for Lru {
    fn plan(
        &self,
        shard: &mut ObjectMap,
        now: Instant,
        target: u64,
        most: usize,
        eligible: &dyn Fn(&str) -> bool,
    ) -> EvictionPlan {
        let plan = shard.eviction_plan(now, target, most, eligible);
        for key in &plan.parked {
            shard.touch(key);
        }
        plan
    }

    /// The plans merge by their objects' last use ([`Victim::tick`]) into the globally least
    /// recently used, cut where a shard's plan stopped early (what it did not list comes after
    /// its last victim).
    fn choose(&self, plans: Vec<(usize, EvictionPlan)>, target: u64, most: usize) -> Vec<(usize, Victim)> {
        // The latest (held, tick) the merge may take: the last victim of a plan that stopped early.
        let mut bound = (true, u64::MAX);
        let mut candidates: Vec<(usize, Victim)> = Vec::new();
        for (i, plan) in plans {
            if plan.more {
                if let Some(last) = plan.victims.last() {
                    bound = bound.min((last.held, last.tick));
                }
            }
            candidates.extend(plan.victims.into_iter().map(|v| (i, v)));
        }
        candidates.sort_unstable_by_key(|(_, v)| (v.held, v.tick));
        let (mut planned, mut chosen) = (0, 0);
        for (_, v) in &candidates {
            if planned >= target || chosen >= most || (v.held, v.tick) > bound {
                break;
            }
            planned += v.bytes;
            chosen += 1;
        }
        candidates.truncate(chosen);
        // By shard, in the merged order within each (in place: a stable sort allocates).
        candidates.sort_unstable_by_key(|(i, v)| (*i, v.held, v.tick));
        candidates
    }
}
