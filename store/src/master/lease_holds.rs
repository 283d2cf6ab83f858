//! Ranges of objects that went while a read lease on them still ran.
//!
//! A read lease is the master's promise that the ranges a get was told about hold that
//! object's bytes until the lease ends (the reader refuses a read that ends later, see the
//! client's `lease` module). Eviction and a plain removal wait for the lease; a *forced*
//! removal does not, and if its ranges went back to the allocator at once, the next put could
//! be given them and write over bytes a reader is still copying: the reader would return a
//! value whose pages belong to two objects, with success. So a replica of an object removed
//! under a lease is *held* here, allocated but owned by no object, until both the lease has
//! ended and — where its owner was told of the drop — the owner acknowledged it (the ordinary
//! quarantine, [`super::owners`]). Releasing is lazy: the master sweeps the ended holds before
//! it allocates ([`Master::release_ended_holds`]) and on its periodic sweep. A segment that goes
//! takes its holds with it (its memory went with its owner).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Instant;

use super::{Master, State};
use crate::allocator::Block;

/// One held range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Held {
    /// When the last lease on its object ends.
    until: Instant,
    segment_id: u64,
    block: Block,
    /// The drop's news, if the owner was told: released only once it acknowledged.
    drop_seq: Option<u64>,
}

impl Ord for Held {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.until, self.segment_id, self.block.offset).cmp(&(other.until, other.segment_id, other.block.offset))
    }
}

impl PartialOrd for Held {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// The held ranges, soonest lease end first.
#[derive(Debug, Default)]
pub(super) struct LeaseHolds {
    /// Leases still running.
    running: BinaryHeap<Reverse<Held>>,
    /// Leases ended, the owner's acknowledgement of the drop still due.
    unacked: Vec<Held>,
    bytes: u64,
}

impl LeaseHolds {
    /// Holds `block` of `segment_id` until `until` (and the acknowledgement of `drop_seq`).
    pub(super) fn hold(&mut self, segment_id: u64, block: Block, until: Instant, drop_seq: Option<u64>) {
        self.bytes += block.reserved;
        self.running.push(Reverse(Held { until, segment_id, block, drop_seq }));
    }

    /// Bytes held, all segments together.
    pub(super) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// When the soonest running lease ends (`None`: none runs).
    pub(super) fn next_end(&self) -> Option<Instant> {
        self.running.peek().map(|Reverse(h)| h.until)
    }

    /// Takes out the holds whose lease ended by `now` and whose drop `acked` says was
    /// acknowledged (`acked(segment, seq)`); returns them as (segment, block).
    fn take_ended(&mut self, now: Instant, acked: impl Fn(u64, u64) -> bool) -> Vec<(u64, Block)> {
        while self.running.peek().is_some_and(|Reverse(h)| h.until <= now) {
            let Reverse(h) = self.running.pop().expect("peeked");
            self.unacked.push(h);
        }
        let mut out = Vec::new();
        self.unacked.retain(|h| {
            let done = h.drop_seq.is_none_or(|seq| acked(h.segment_id, seq));
            if done {
                out.push((h.segment_id, h.block));
            }
            !done
        });
        self.bytes -= out.iter().map(|(_, b)| b.reserved).sum::<u64>();
        out
    }

    /// When the last lease holding a range of `segment_id` ends (`None`: none holds one).
    pub(super) fn last_end_of(&self, segment_id: u64) -> Option<Instant> {
        self.running.iter().filter(|Reverse(h)| h.segment_id == segment_id).map(|Reverse(h)| h.until).max()
    }

    /// Forgets the holds of a segment that went (its allocator went with it).
    pub(super) fn forget_segment(&mut self, segment_id: u64) {
        self.running.retain(|Reverse(h)| h.segment_id != segment_id);
        self.unacked.retain(|h| h.segment_id != segment_id);
        self.bytes = self.running.iter().map(|Reverse(h)| h.block.reserved).sum::<u64>()
            + self.unacked.iter().map(|h| h.block.reserved).sum::<u64>();
    }
}

impl Master {
    /// Gives the held ranges whose lease ended (and whose drop was acknowledged) back to their
    /// segments' allocators. Cheap when nothing ended: the allocation paths call it first.
    pub(super) fn release_ended_holds(st: &mut State, now: Instant) -> bool {
        if st.holds.unacked.is_empty() && st.holds.next_end().is_none_or(|t| t > now) {
            return false;
        }
        let State { holds, owners, core, .. } = st;
        let ended = holds.take_ended(now, |segment_id, seq| owners.get(&segment_id).is_some_and(|l| l.acked() >= seq));
        let freed = !ended.is_empty();
        for (segment_id, block) in ended {
            if let Some(seg) = core.segments.get_mut(&segment_id) {
                seg.alloc.release(block);
            }
        }
        freed
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn block(offset: u64, reserved: u64) -> Block {
        Block { offset, reserved }
    }

    #[test]
    fn a_hold_ends_with_its_lease_and_its_acknowledgement_not_before() {
        let t0 = Instant::now();
        let mut h = LeaseHolds::default();
        h.hold(1, block(0, 4096), t0 + Duration::from_secs(2), Some(7));
        h.hold(1, block(4096, 4096), t0 + Duration::from_secs(1), None);
        assert_eq!(h.bytes(), 8192);
        assert_eq!(h.next_end(), Some(t0 + Duration::from_secs(1)));

        assert!(h.take_ended(t0, |_, _| true).is_empty(), "no lease ended yet");
        assert_eq!(h.take_ended(t0 + Duration::from_secs(1), |_, _| true), vec![(1, block(4096, 4096))]);
        assert!(
            h.take_ended(t0 + Duration::from_secs(3), |_, _| false).is_empty(),
            "the lease ended, the drop is not acknowledged"
        );
        assert_eq!(h.bytes(), 4096);
        assert_eq!(h.take_ended(t0 + Duration::from_secs(3), |s, seq| s == 1 && seq == 7), vec![(1, block(0, 4096))]);
        assert_eq!(h.bytes(), 0);
        assert_eq!(h.next_end(), None);
    }

    #[test]
    fn a_segment_that_goes_takes_its_holds_with_it() {
        let t0 = Instant::now();
        let mut h = LeaseHolds::default();
        h.hold(1, block(0, 4096), t0 + Duration::from_secs(1), None);
        h.hold(2, block(0, 8192), t0 + Duration::from_secs(1), None);
        h.forget_segment(1);
        assert_eq!(h.bytes(), 8192);
        assert_eq!(h.take_ended(t0 + Duration::from_secs(1), |_, _| true), vec![(2, block(0, 8192))]);
    }
}
