//! Per-segment load: the gets and puts that touched a segment lately, counted in one-second
//! buckets ([`Rate`]), for the schedulers' node statistics and the load-aware placements.

use std::sync::OnceLock;
use std::time::Instant;

/// Seconds of history behind the per-node rates.
pub const RATE_WINDOW_SECS: u64 = 10;

/// Events per second over the last [`RATE_WINDOW_SECS`] seconds, in one-second buckets.
#[derive(Default)]
pub struct Rate {
    buckets: [u64; RATE_WINDOW_SECS as usize],
    /// The second (since the process' first rate) the newest bucket belongs to.
    newest: u64,
}

fn second(now: Instant) -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    now.saturating_duration_since(*BASE.get_or_init(Instant::now)).as_secs()
}

impl Rate {
    fn advance(&mut self, s: u64) {
        if s <= self.newest {
            return;
        }
        let gap = (s - self.newest).min(RATE_WINDOW_SECS);
        for i in 1..=gap {
            self.buckets[((self.newest + i) % RATE_WINDOW_SECS) as usize] = 0;
        }
        self.newest = s;
    }

    /// Counts one event at `now` (an event older than the window is not counted).
    pub fn record(&mut self, now: Instant) {
        let s = second(now);
        self.advance(s);
        if s + RATE_WINDOW_SECS > self.newest {
            self.buckets[(s % RATE_WINDOW_SECS) as usize] += 1;
        }
    }

    /// Average per second over the window ending now (read-only: stale buckets are skipped).
    pub fn per_second(&self, now: Instant) -> f64 {
        let s = second(now);
        let oldest = s.saturating_sub(RATE_WINDOW_SECS - 1);
        let sum: u64 = (oldest..=s.min(self.newest)).map(|t| self.buckets[(t % RATE_WINDOW_SECS) as usize]).sum();
        sum as f64 / RATE_WINDOW_SECS as f64
    }
}

/// Recent gets and puts that touched a segment.
#[derive(Default)]
pub struct Load {
    /// Replica lists naming a replica on this segment.
    pub gets: Rate,
    /// Replicas allocated on this segment (puts and replications).
    pub puts: Rate,
}
