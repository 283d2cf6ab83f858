//! The check of the files found at start: each is read once, in the background (one thread,
//! files in the order they were written), and one whose value fails its checksum is dropped
//! (the tier removes it and tells the master). Until a file is checked, a get that reads it
//! checks it (as every read does), so a damaged value is never served meanwhile either.
//!
//! The check reads only while no get has read the tier for a while ([`VERIFY_QUIET`]): the
//! gets have the device to themselves, the check takes the idle time ([`Quiet`]), so that a
//! client that restarts into a busy cluster serves its gets at the device's full speed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::format::ALIGN;

/// Bytes read at a time by the check (small, so that a get that comes while it reads waits
/// little).
pub const VERIFY_CHUNK: usize = 1 << 20;
/// The check reads only after this long without a get reading the tier. (20 ms was too
/// short: a client that checks each value it gets, as storebench does, leaves gaps that long
/// between its gets, and the check's reads landed beside them.)
pub const VERIFY_QUIET: Duration = Duration::from_millis(200);

/// A file found at start, to check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The object's key.
    pub key: String,
    /// The object's version, as the index holds it.
    pub version: u64,
    /// Its value's size.
    pub size: u64,
}

/// Gets reading the tier now, and when the last one ended.
#[derive(Debug)]
pub struct Quiet {
    active: AtomicU64,
    /// Microseconds since `start` when the last get's read ended; 0: none yet.
    last_us: AtomicU64,
    start: Instant,
    quiet_us: AtomicU64,
}

impl Default for Quiet {
    fn default() -> Self {
        Quiet {
            active: AtomicU64::new(0),
            last_us: AtomicU64::new(0),
            start: Instant::now(),
            quiet_us: AtomicU64::new(VERIFY_QUIET.as_micros() as u64),
        }
    }
}

impl Quiet {
    /// A get starts reading the tier (until the guard is dropped).
    pub fn busy(self: &Arc<Self>) -> ReadBusy {
        self.active.fetch_add(1, Ordering::AcqRel);
        ReadBusy { quiet: self.clone() }
    }

    /// Returns once no get has read the tier for the quiet time.
    pub fn wait(&self) {
        let quiet = Duration::from_micros(self.quiet_us.load(Ordering::Relaxed));
        loop {
            if self.active.load(Ordering::Acquire) > 0 {
                std::thread::sleep(quiet);
                continue;
            }
            let last = Duration::from_micros(self.last_us.load(Ordering::Relaxed));
            let since = self.start.elapsed().saturating_sub(last);
            if last.is_zero() || since >= quiet {
                return;
            }
            std::thread::sleep(quiet - since);
        }
    }

    /// How long the check waits for quiet ([`VERIFY_QUIET`]; tests change it).
    #[cfg(test)]
    pub fn set_quiet(&self, quiet: Duration) {
        self.quiet_us.store(quiet.as_micros() as u64, Ordering::Relaxed);
    }
}

/// A get reading the tier, from before its open until its reader is dropped.
#[derive(Debug)]
pub struct ReadBusy {
    quiet: Arc<Quiet>,
}

impl Drop for ReadBusy {
    fn drop(&mut self) {
        let q = &self.quiet;
        q.last_us.store((q.start.elapsed().as_micros() as u64).max(1), Ordering::Relaxed);
        q.active.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Checks `files` on a thread of its own: `check` reads one file through the buffer it is
/// given (waiting for quiet as it goes) and says whether it was damaged, or `None` when the
/// tier is gone (the check ends). `unverified` counts down as files are checked (to 0 at once
/// when no thread can start: reads still check every file).
pub fn spawn(
    files: Vec<Found>,
    unverified: Arc<AtomicU64>,
    mut check: impl FnMut(&Found, &mut [u8]) -> Option<bool> + Send + 'static,
) {
    if files.is_empty() {
        return;
    }
    let counter = unverified.clone();
    let spawned = std::thread::Builder::new().name("crescent-disk-verify".into()).spawn(move || {
        let mut buf = vec![0u8; VERIFY_CHUNK + ALIGN as usize];
        let at = buf.as_ptr().align_offset(ALIGN as usize);
        let buf = &mut buf[at..at + VERIFY_CHUNK];
        let (mut checked, mut damaged) = (0, 0);
        for f in &files {
            let Some(bad) = check(f, buf) else { return };
            unverified.fetch_sub(1, Ordering::Relaxed);
            checked += 1;
            damaged += usize::from(bad);
        }
        tracing::info!("disk tier: checked the {checked} file(s) found at start; removed {damaged} damaged");
    });
    if let Err(e) = spawned {
        tracing::warn!("disk tier: not checking the files found at start ({e}); reads still check them");
        counter.store(0, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(key: &str) -> Found {
        Found { key: key.into(), version: 1, size: 10 }
    }

    #[test]
    fn every_file_is_checked_once_in_order_until_the_tier_is_gone() {
        let unverified = Arc::new(AtomicU64::new(3));
        let (tx, rx) = std::sync::mpsc::channel();
        spawn(vec![found("a"), found("b"), found("c")], unverified.clone(), move |f, buf| {
            assert!(buf.as_ptr().align_offset(ALIGN as usize) == 0 && buf.len() == VERIFY_CHUNK);
            tx.send(f.key.clone()).unwrap();
            // "b" is the last the tier sees: it is gone after it.
            (f.key != "c").then_some(f.key == "b")
        });
        let seen: Vec<String> = rx.iter().collect();
        assert_eq!(seen, ["a", "b", "c"]);
        assert_eq!(unverified.load(Ordering::Relaxed), 1, "c was not checked: the tier went first");
    }

    #[test]
    fn the_quiet_comes_once_no_get_has_read_for_the_quiet_time() {
        let q = Arc::new(Quiet::default());
        q.set_quiet(Duration::from_millis(30));
        q.wait(); // no get ever read: at once
        let busy = q.busy();
        assert_eq!(q.active.load(Ordering::Relaxed), 1);
        drop(busy);
        q.wait();
        let ended = q.last_us.load(Ordering::Relaxed);
        assert!(q.start.elapsed().as_micros() as u64 >= ended + 30_000, "returned before the quiet time passed");
    }
}
