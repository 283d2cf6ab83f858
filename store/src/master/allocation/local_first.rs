//! [`AllocationStrategy::LocalFirst`](crate::master::AllocationStrategy::LocalFirst): the
//! writer's own segment first when it has room, then random (the default).

use super::Allocator;

/// The writer's segment first, then the others with room in random order.
pub(super) struct LocalFirst;

impl Allocator for LocalFirst {
    fn local_first(&self) -> bool {
        true
    }

    fn random(&self) -> bool {
        true
    }
}
