//! How long the deferred filler waits for the client's reads to leave the link idle.
//!
//! A piece the filler starts just before the client's next read slows that read down (in the
//! `get` rows of `storebench hot-cache` on the unshaped veth, a filler that started pieces 2 ms
//! into each gap between gets made them 1.25-1.48x slower; one that waited out the gaps left
//! them at 0.93-1.05x). So the wait is not fixed: it is twice the median of the last gaps
//! between the client's reads, so that a client reading at a steady pace is left alone, and
//! the filler runs when a gap lasts longer than the client's usual ones. It is at least
//! [`MIN_GRACE`] and at most [`MAX_GRACE`] (a client whose reads are seconds apart has its
//! fills made within a tenth of a second of idleness). Until three gaps are known the wait is
//! [`MAX_GRACE`]: a batch reader's first calls leave long gaps (it checks or uses 5 x 25 MiB
//! between them), and a short wait there put the filler beside its next call.

use std::time::Duration;

/// The shortest wait: back-to-back gets leave gaps of one master round trip between their
/// transfers, too short for a piece.
pub const MIN_GRACE: Duration = Duration::from_millis(2);
/// The longest wait.
pub const MAX_GRACE: Duration = Duration::from_millis(100);
/// Gaps remembered.
const KEPT: usize = 8;
/// Gaps needed before the median counts (until then: [`MIN_GRACE`]).
const ENOUGH: usize = 3;

/// The last gaps between the client's reads.
#[derive(Debug, Default, Clone)]
pub struct IdleGaps {
    last: [Duration; KEPT],
    seen: usize,
}

impl IdleGaps {
    /// Records a gap that just ended (a read began after the link was idle for `gap`).
    pub fn push(&mut self, gap: Duration) {
        self.last[self.seen % KEPT] = gap;
        self.seen += 1;
    }

    /// How long the link must have been idle before the filler starts a piece.
    pub fn grace(&self) -> Duration {
        let n = self.seen.min(KEPT);
        if n < ENOUGH {
            return MAX_GRACE;
        }
        let mut gaps = self.last;
        let gaps = &mut gaps[..n];
        gaps.sort_unstable();
        (gaps[n / 2] * 2).clamp(MIN_GRACE, MAX_GRACE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_steady_pace_is_waited_out_and_a_longer_gap_is_used() {
        let mut g = IdleGaps::default();
        assert_eq!(g.grace(), MAX_GRACE, "nothing known yet: the longest wait");
        g.push(ms(10));
        g.push(ms(10));
        assert_eq!(g.grace(), MAX_GRACE, "two gaps are not enough");
        for _ in 0..8 {
            g.push(ms(10)); // reads every 10 ms apart (e.g. work between gets)
        }
        assert_eq!(g.grace(), ms(20), "a usual gap ends before the filler starts");
        g.push(ms(200)); // one long pause does not move the median
        assert_eq!(g.grace(), ms(20));
    }

    #[test]
    fn the_wait_stays_within_its_bounds() {
        let mut g = IdleGaps::default();
        for _ in 0..8 {
            g.push(Duration::from_micros(300)); // back-to-back gets
        }
        assert_eq!(g.grace(), MIN_GRACE);
        for _ in 0..8 {
            g.push(Duration::from_secs(3));
        }
        assert_eq!(g.grace(), MAX_GRACE);
    }

    #[test]
    fn the_median_follows_the_latest_gaps() {
        let mut g = IdleGaps::default();
        for _ in 0..8 {
            g.push(ms(40));
        }
        for _ in 0..5 {
            g.push(ms(5)); // the pace changed: 5 of the 8 kept gaps are short now
        }
        assert_eq!(g.grace(), ms(10));
    }
}
