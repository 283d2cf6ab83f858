//! Shared pieces of Crescent's benchmark binaries.

pub use crescent_store::pattern;
pub mod authpair;
pub mod blocks;
pub mod checksumbench;
pub mod dummybench;
pub mod etcd_cluster;
pub mod failover;
pub mod hotbench;
pub mod masterbench;
pub mod report;
pub mod soak;
pub mod ssd;

use std::time::{Duration, Instant};

pub use crescent_store::{init_logging, init_tool_logging};

/// Longest duration a benchmark's command line takes, in seconds (a year).
pub const MAX_SECONDS: f64 = 365.0 * 24.0 * 3600.0;

/// A command-line number of seconds: finite, not negative, at most [`MAX_SECONDS`]
/// (`Duration::from_secs_f64` panics on what is not).
pub fn parse_seconds(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|e| format!("{s:?} is not a number of seconds: {e}"))?;
    if !v.is_finite() || !(0.0..=MAX_SECONDS).contains(&v) {
        return Err(format!("{s:?}: seconds must be between 0 and {MAX_SECONDS}"));
    }
    Ok(v)
}

/// Polls `f` (every 20 ms) until it returns true or `timeout` passes; whether it did.
pub fn eventually(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    f()
}

/// CPU time this process has used so far (all threads, user and system), in seconds. Unlike
/// wall-clock time it does not grow while other programs hold the CPUs, so bytes per CPU
/// second compare fairly on a busy machine.
///
/// Read with `getrusage` through libc: rustix's `clock_gettime` parses the vDSO itself, which
/// crashes under valgrind (rustix issue 1559), and the benchmarks must run under
/// `valgrind --tool=callgrind` for profiling.
pub fn process_cpu_seconds() -> f64 {
    // SAFETY: an all-zero `rusage` is a valid value of the plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `usage` is a valid, writable `rusage` for the call.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return 0.0;
    }
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

#[cfg(test)]
mod tests {
    #[test]
    fn seconds_out_of_range_are_refused_not_panicked_on() {
        assert_eq!(super::parse_seconds("2.5"), Ok(2.5));
        assert_eq!(super::parse_seconds("0"), Ok(0.0));
        for bad in ["-1", "nan", "inf", "1e300", "99922222222222222222222", "x"] {
            assert!(super::parse_seconds(bad).is_err(), "{bad}");
        }
    }
}
