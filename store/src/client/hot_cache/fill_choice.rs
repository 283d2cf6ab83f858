//! How [`FillMode::Auto`] fills a miss: inline where the copy it adds
//! is small beside the transfer, deferred where it is not.
//!
//! An inline fill costs the get one copy of the value; a deferred fill costs it nothing but
//! reads the value over the link a second time when the client's reads leave it idle. Which
//! is cheaper depends on how the link compares with a memory copy: on the 2.5 Gbit/s link a
//! 10 MiB value takes about 35 ms to arrive and 1-2 ms to copy (the inline fill's first round
//! measured 1.00-1.01x the uncached one, while a deferred fill's second transfer cost the next
//! round), on the unshaped veth it arrives in about 4.5 ms and the copy made the first round
//! 1.09-1.31x (docs: benchmarks, hot cache).
//!
//! So the cache measures both: how fast a streaming copy into its own blocks goes, once when
//! it starts ([`FillChoice::calibrate`]), and how long each remote read of a miss takes
//! ([`FillChoice::note_read`]). The *copy share* of a read is the time the copy of its bytes
//! would take over the time the read took; the cache fills inline while the median share of
//! the last [`KEPT`] reads is at most [`INLINE_UP_TO`] (no read seen yet: deferred, see
//! [`FillChoice::mode`]). A median,
//! not a moving average: a fresh client's first read also opens its connections to the
//! holder and can take ten times as long as the next ones, and an average that starts there
//! took more than a round of the benchmark's batches to leave inline.

use std::mem::MaybeUninit;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::stream_copy;
use super::FillMode;

/// The largest share of a read's time the inline fill's copy may add (the first round's
/// target is at most 1.10x the uncached one).
pub const INLINE_UP_TO: f64 = 0.10;

/// Bytes the calibration copies at a time: more than a core's caches hold, as a fill's copy
/// of a value of several MiB; the rate is the median of [`CALIBRATION_ROUNDS`] copies, not
/// the best (a best of three 4 MiB copies, the first build's rule, can only err high).
const CALIBRATION_BYTES: usize = 16 << 20;
const CALIBRATION_ROUNDS: usize = 5;
/// Reads whose copy share is remembered.
pub const KEPT: usize = 8;

/// The copy rate of this machine and the copy share of the last reads.
#[derive(Debug)]
pub struct FillChoice {
    /// Bytes per second of a streaming copy into the cache's blocks.
    copy_rate: f64,
    shares: Mutex<Shares>,
}

#[derive(Debug, Default)]
struct Shares {
    last: [f64; KEPT],
    seen: usize,
}

impl FillChoice {
    /// A choice for a machine whose streaming copies move `copy_rate` bytes per second.
    pub fn with_copy_rate(copy_rate: f64) -> Self {
        FillChoice { copy_rate: copy_rate.max(1.0), shares: Mutex::new(Shares::default()) }
    }

    /// Measures the copy rate with streaming copies inside `blocks` (the cache's own memory,
    /// not yet in use: its bytes are overwritten); `None` when it is too small to measure
    /// (under two pieces of [`stream_copy::STREAM_FROM`] bytes).
    pub fn calibrate(blocks: &mut [MaybeUninit<u8>]) -> Option<Self> {
        let n = (blocks.len() / 2).min(CALIBRATION_BYTES);
        if n < stream_copy::STREAM_FROM {
            return None;
        }
        let (src, dst) = blocks.split_at_mut(n);
        src.fill(MaybeUninit::new(0));
        // SAFETY: every byte of `src` was just written.
        let src: &[u8] = unsafe { src.assume_init_ref() };
        let dst = &mut dst[..n];
        let mut took = [Duration::ZERO; CALIBRATION_ROUNDS];
        for t in &mut took {
            let started = Instant::now();
            stream_copy::copy_streaming(dst, src);
            *t = started.elapsed();
        }
        took.sort_unstable();
        let median = took[CALIBRATION_ROUNDS / 2];
        Some(Self::with_copy_rate(n as f64 / median.as_secs_f64().max(1e-9)))
    }

    /// Bytes per second of a streaming copy here.
    pub fn copy_rate(&self) -> f64 {
        self.copy_rate
    }

    /// Takes a remote read of `bytes` that took `took` into account.
    pub fn note_read(&self, bytes: u64, took: Duration) {
        if bytes == 0 {
            return;
        }
        let share = bytes as f64 / self.copy_rate / took.as_secs_f64().max(1e-9);
        let mut s = self.shares.lock();
        let at = s.seen % KEPT;
        s.last[at] = share;
        s.seen += 1;
    }

    /// The median copy share of the last reads (of two in the middle, the larger), if any.
    pub fn copy_share(&self) -> Option<f64> {
        let s = self.shares.lock();
        let n = s.seen.min(KEPT);
        if n == 0 {
            return None;
        }
        let mut last = s.last;
        let last = &mut last[..n];
        last.sort_unstable_by(f64::total_cmp);
        Some(last[n / 2])
    }

    /// How the next miss fills: inline while the copy share is at most [`INLINE_UP_TO`],
    /// deferred above it, and deferred before any read was measured. Why deferred first: the
    /// time of a read that fills inline includes the copy's competition for the CPU, so it
    /// makes the link look slower than it is and an inline start tends to stay inline; a
    /// deferred read is measured as the link gives it. (One object read twice on a slow link
    /// is the price.)
    pub fn mode(&self) -> FillMode {
        match self.copy_share() {
            Some(share) if share <= INLINE_UP_TO => FillMode::Inline,
            _ => FillMode::Deferred,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GB: f64 = 1e9;

    #[test]
    fn a_link_much_slower_than_the_copy_fills_inline_and_a_fast_one_deferred() {
        let c = FillChoice::with_copy_rate(8.0 * GB);
        assert_eq!(c.mode(), FillMode::Deferred, "no read seen yet: measured as the link gives it");
        // 10 MiB in 35 ms (the 2.5 Gbit/s link): the copy is ~4 % of the read.
        for _ in 0..4 {
            c.note_read(10 << 20, Duration::from_millis(35));
        }
        assert!(c.copy_share().unwrap() < 0.05);
        assert_eq!(c.mode(), FillMode::Inline);
        // 10 MiB in 4.5 ms (the unshaped veth): ~29 %; deferred once half the last reads were
        // that fast.
        for _ in 0..3 {
            c.note_read(10 << 20, Duration::from_micros(4500));
        }
        assert_eq!(c.mode(), FillMode::Inline, "3 fast reads of 7");
        c.note_read(10 << 20, Duration::from_micros(4500));
        assert!(c.copy_share().unwrap() > 0.25);
        assert_eq!(c.mode(), FillMode::Deferred);
        // And back when the link slows down.
        for _ in 0..KEPT / 2 {
            c.note_read(10 << 20, Duration::from_millis(35));
        }
        assert_eq!(c.mode(), FillMode::Deferred, "half the last reads fast still");
        c.note_read(10 << 20, Duration::from_millis(35));
        assert_eq!(c.mode(), FillMode::Inline);
    }

    #[test]
    fn one_outlier_does_not_flip_the_mode() {
        let c = FillChoice::with_copy_rate(8.0 * GB);
        for _ in 0..8 {
            c.note_read(10 << 20, Duration::from_millis(35));
        }
        c.note_read(10 << 20, Duration::from_millis(4)); // one fast read (~33 %)
        assert_eq!(c.mode(), FillMode::Inline);
        // A fresh client's first read, slowed by opening its connections, does not hold a
        // fast link inline for long either.
        let c = FillChoice::with_copy_rate(8.0 * GB);
        c.note_read(50 << 20, Duration::from_millis(300));
        c.note_read(50 << 20, Duration::from_millis(23));
        assert_eq!(c.mode(), FillMode::Deferred, "the second read of two decides (the larger middle)");
    }

    #[test]
    fn calibration_measures_a_positive_rate_and_needs_room() {
        let mut small = vec![MaybeUninit::new(0u8); stream_copy::STREAM_FROM];
        assert!(FillChoice::calibrate(&mut small).is_none());
        let mut room = vec![MaybeUninit::new(0u8); 2 * stream_copy::STREAM_FROM];
        let c = FillChoice::calibrate(&mut room).expect("room for two pieces");
        assert!(c.copy_rate() > 1.0 && c.copy_rate().is_finite());
        assert_eq!(c.copy_share(), None);
    }
}
