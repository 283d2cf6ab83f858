//! Where a put's replicas go: one [`Allocator`] per strategy of
//! [`AllocationStrategy`], chosen once when the master starts ([`for_strategy`]), and the walk
//! they share ([`allocate`]): the caller's preferred segments first, in its order, then the
//! strategy's order, one block on each of `replicas` distinct memory segments.

mod free_ratio_first;
mod local_first;
mod random;

use rand::Rng;

use super::config::AllocationStrategy;
use super::core::state::CoreState;
use super::tenant;
use crate::allocator::Block;
use crate::proto::{PutOptions, Tier};

/// A placement strategy: how the segments with room are ordered for a put's replicas.
pub(crate) trait Allocator: Send + Sync {
    /// Orders `candidates` (memory segments with room) before the preferred ones go first;
    /// the default leaves them as they are.
    fn order(&self, _core: &CoreState, _candidates: &mut [u64]) {}

    /// Whether the writer's own segment (`PutOptions::preferred_segment`) goes first, after
    /// the segments it names in `preferred_segments`.
    fn local_first(&self) -> bool {
        false
    }

    /// Whether the candidates after the preferred ones are tried in random order.
    fn random(&self) -> bool;
}

/// The allocator of `strategy`.
pub(crate) fn for_strategy(strategy: AllocationStrategy) -> Box<dyn Allocator> {
    match strategy {
        AllocationStrategy::Random => Box::new(random::Random),
        AllocationStrategy::LocalFirst => Box::new(local_first::LocalFirst),
        AllocationStrategy::FreeRatioFirst => Box::new(free_ratio_first::FreeRatioFirst),
    }
}

/// One block of `size` bytes on each of `replicas` distinct memory segments of `tenant`'s
/// clients, in `allocator`'s order after the caller's preferred segments; `None` (nothing
/// allocated) when fewer have room.
pub(crate) fn allocate(
    core: &mut CoreState,
    allocator: &dyn Allocator,
    tenant: &str,
    size: u64,
    replicas: u32,
    opts: &PutOptions,
) -> Option<Vec<(u64, Block)>> {
    let mut candidates: Vec<u64> = core
        .segments
        .iter()
        .filter(|(_, s)| s.tier != Tier::Ssd && s.alloc.free() >= size && tenant::tenant_of(&s.client_id) == tenant)
        .map(|(id, _)| *id)
        .collect();
    allocator.order(core, &mut candidates);
    // A random order is drawn as far as the loop below walks it (a Fisher-Yates shuffle one
    // step per candidate tried): the same order as shuffling every segment first, for the one
    // or two draws a put needs, under the global lock.
    let shuffled = allocator.random();
    let local = allocator.local_first().then_some(&opts.preferred_segment);
    let mut front = 0;
    for name in opts.preferred_segments.iter().chain(local) {
        if let Some(&id) = core.segment_by_name.get(name) {
            if let Some(pos) = candidates[front..].iter().position(|c| *c == id) {
                candidates.remove(front + pos);
                candidates.insert(front, id);
                front += 1;
            }
        }
    }
    let mut got = Vec::new();
    let mut rng = rand::rng();
    for i in 0..candidates.len() {
        if got.len() == replicas as usize {
            break;
        }
        if shuffled && i >= front {
            let j = rng.random_range(i..candidates.len());
            candidates.swap(i, j);
        }
        let id = candidates[i];
        if let Some(block) = core.segments.get_mut(&id).expect("candidate").alloc.allocate(size) {
            got.push((id, block));
        }
    }
    if got.len() < replicas as usize {
        for (id, block) in got {
            core.segments.get_mut(&id).expect("allocated above").alloc.release(block);
        }
        return None;
    }
    Some(got)
}
