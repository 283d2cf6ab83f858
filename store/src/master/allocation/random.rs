//! [`AllocationStrategy::Random`](crate::master::AllocationStrategy::Random): any segments
//! with room, chosen at random.

use super::Allocator;

/// Segments with room in random order.
pub(super) struct Random;

impl Allocator for Random {
    fn random(&self) -> bool {
        true
    }
}
