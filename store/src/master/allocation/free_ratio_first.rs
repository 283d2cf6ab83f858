//! [`AllocationStrategy::FreeRatioFirst`](crate::master::AllocationStrategy::FreeRatioFirst):
//! the segments with the largest share of free space first.

use super::Allocator;
use crate::master::core::state::CoreState;

/// Segments with room by their free share, largest first.
pub(super) struct FreeRatioFirst;

impl Allocator for FreeRatioFirst {
    fn order(&self, core: &CoreState, candidates: &mut [u64]) {
        candidates.sort_by(|a, b| {
            let ratio = |id: &u64| {
                let a = &core.segments[id].alloc;
                a.free() as f64 / a.capacity() as f64
            };
            ratio(b).total_cmp(&ratio(a))
        });
    }

    fn random(&self) -> bool {
        false
    }
}
