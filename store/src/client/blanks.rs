//! The blanks this client holds (placements the master granted ahead of its puts, see the
//! master's `blanks`) and the thread that asks for more, so that a put of a size this client
//! puts often is the transfer and one call, `PutCommitBlank`, instead of `PutStart`, the
//! transfer and `PutEnd`.
//!
//! A blank holds a value of one exact size (and its record, [`crate::blank_record`]): the pool
//! keeps blanks for the few sizes seen more than once among the last puts, a handful of each
//! (fewer for large values), asked for off the put's path by a thread of its own, in batches:
//! whenever a put leaves half of them or fewer. A blank is used only in the first half of its time at the
//! master, so that no write into it can still be under way when the master takes it back.
//! When the master says a blank is gone (a new master, an expiry), the pool forgets them all;
//! a master that grants none (blanks off, full, an older master) is asked again a while later.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::rpc::check;
use super::StoreClient;
use crate::fastrpc::Method;
use crate::proto::{GrantBlanksRequest, ReplicaDescriptor};

/// Bytes of blanks the pool keeps for one size, and the most and fewest blanks that makes
/// (many small ones: each grant is one more call for the master and one more message for each
/// owner, so the fewer grants per put the better).
const BYTES_PER_SIZE: u64 = 32 << 20;
const MOST_PER_SIZE: u64 = 32;
const FEWEST_PER_SIZE: u64 = 2;
/// Sizes the pool keeps blanks for at once.
const SIZES: usize = 4;
/// Puts remembered to find the sizes worth blanks (seen twice among them).
const RECENT: usize = 8;
/// How long a size gets no blanks after the master granted none for it.
const BACK_OFF: Duration = Duration::from_secs(1);
/// How long the refill thread waits for work before it looks whether the client is gone.
const IDLE: Duration = Duration::from_millis(500);

/// A blank this client holds.
#[derive(Debug, Clone)]
pub(super) struct Held {
    /// Its id (the version of the object committed in it).
    pub id: u64,
    /// Where the value and its record go.
    pub replica: ReplicaDescriptor,
    /// Until when a put may start writing it.
    usable_until: Instant,
}

#[derive(Default)]
struct State {
    /// Blanks by value size, oldest first.
    by_size: HashMap<u64, VecDeque<Held>>,
    /// Sizes of the last puts, newest last.
    recent: VecDeque<u64>,
    /// Sizes to ask blanks for, most recently wanted last.
    wanted: Vec<u64>,
    /// Sizes the master granted none for, until when.
    backed_off: HashMap<u64, Instant>,
    /// The refill thread runs.
    refilling: bool,
    stopped: bool,
}

/// The pool of blanks (see the module doc).
#[derive(Default)]
pub(super) struct Blanks {
    state: Mutex<State>,
    wake: Condvar,
}

/// How many blanks the pool keeps for values of `size` bytes.
fn target(size: u64) -> u64 {
    (BYTES_PER_SIZE / size.max(1)).clamp(FEWEST_PER_SIZE, MOST_PER_SIZE)
}

impl Blanks {
    /// A blank for a value of `size` bytes, if the pool holds one; notes the put's size and
    /// asks the refill thread for more where the size is worth it (`start` starts the thread
    /// the first time).
    pub(super) fn take(&self, size: u64, now: Instant, start: impl FnOnce()) -> Option<Held> {
        let mut st = self.state.lock();
        if st.stopped {
            return None;
        }
        st.recent.push_back(size);
        if st.recent.len() > RECENT {
            st.recent.pop_front();
        }
        let taken = st.by_size.get_mut(&size).and_then(|q| {
            q.retain(|b| b.usable_until > now);
            q.pop_front()
        });
        let often = st.recent.iter().filter(|s| **s == size).count() >= 2;
        let backed_off = st.backed_off.get(&size).is_some_and(|until| *until > now);
        // Asked for in batches: once half the size's blanks are used (one grant, one message
        // to each owner, for several puts).
        let left = st.by_size.get(&size).map_or(0, |q| q.len() as u64);
        if often && !backed_off && left <= target(size) / 2 {
            st.wanted.retain(|s| *s != size);
            st.wanted.push(size);
            if !st.refilling {
                st.refilling = true;
                start();
            }
            self.wake.notify_one();
        }
        taken
    }

    /// The master no longer knows the blanks (a new master, or they expired): forget them all.
    pub(super) fn forget(&self) {
        self.state.lock().by_size.clear();
    }

    /// No more blanks: the client closes (the master takes back what it granted).
    pub(super) fn stop(&self) {
        let mut st = self.state.lock();
        st.stopped = true;
        st.by_size.clear();
        self.wake.notify_all();
    }

    /// Blanks held now (all sizes).
    #[cfg(test)]
    pub(super) fn held(&self) -> usize {
        self.state.lock().by_size.values().map(VecDeque::len).sum()
    }

    /// The next size to ask blanks for, with how many, waiting up to [`IDLE`]; `None` when
    /// nothing is wanted (or the pool stopped).
    fn next_wanted(&self, now: Instant) -> Option<(u64, u64)> {
        let mut st = self.state.lock();
        if st.wanted.is_empty() && !st.stopped {
            self.wake.wait_for(&mut st, IDLE);
        }
        if st.stopped {
            return None;
        }
        let size = st.wanted.pop()?;
        // Only the sizes of the last few puts keep blanks: older ones' go unused and expire.
        let mut keep: Vec<u64> = Vec::with_capacity(SIZES);
        for s in st.recent.iter().rev() {
            if keep.len() < SIZES && !keep.contains(s) {
                keep.push(*s);
            }
        }
        st.by_size.retain(|s, _| keep.contains(s));
        let have = st.by_size.get(&size).map_or(0, |q| q.iter().filter(|b| b.usable_until > now).count() as u64);
        Some((size, target(size).saturating_sub(have)))
    }

    /// Adds the blanks granted for `size` (asked at `asked`); none granted backs the size off.
    fn add(&self, size: u64, asked: Instant, granted: Vec<(u64, ReplicaDescriptor, Duration)>) {
        let mut st = self.state.lock();
        if st.stopped {
            return;
        }
        if granted.is_empty() {
            st.backed_off.insert(size, asked + BACK_OFF);
            return;
        }
        st.backed_off.remove(&size);
        let q = st.by_size.entry(size).or_default();
        for (id, replica, ttl) in granted {
            q.push_back(Held { id, replica, usable_until: asked + ttl / 2 });
        }
    }

    /// Backs every size off for a while (the master failed the call).
    fn back_off_all(&self, now: Instant) {
        let mut st = self.state.lock();
        let sizes: Vec<u64> = st.wanted.drain(..).collect();
        for size in sizes {
            st.backed_off.insert(size, now + BACK_OFF);
        }
    }
}

impl StoreClient {
    /// The refill thread of the pool of blanks: asks the master for the sizes puts want, until
    /// the client goes.
    pub(super) fn start_refilling_blanks(me: Weak<StoreClient>, blanks: Arc<Blanks>) {
        let spawned = std::thread::Builder::new().name("crescent-blanks".into()).spawn(move || loop {
            let now = Instant::now();
            let Some((size, count)) = blanks.next_wanted(now) else {
                if blanks.state.lock().stopped {
                    return;
                }
                if me.strong_count() == 0 {
                    return;
                }
                continue;
            };
            let Some(client) = me.upgrade() else { return };
            if count == 0 {
                continue;
            }
            let req = GrantBlanksRequest { client_id: client.id.clone(), value_size: size, count: count as u32 };
            let reply =
                client.rpc.unary(Method::GrantBlanks, req, |mut c, req| async move { c.grant_blanks(req).await });
            match reply.and_then(|mut r| check(r.status.take(), "").map(|()| r)) {
                Ok(r) => {
                    let granted = r
                        .blanks
                        .into_iter()
                        .filter_map(|b| Some((b.id, b.replica?, Duration::from_millis(b.ttl_ms))))
                        .collect();
                    blanks.add(size, now, granted);
                }
                Err(e) => {
                    tracing::debug!("asking the master for blanks of {size} bytes: {e}");
                    blanks.back_off_all(now);
                    blanks.add(size, now, Vec::new());
                }
            }
        });
        if let Err(e) = spawned {
            tracing::warn!("no blanks (puts start at the master): the refill thread did not start: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replica() -> ReplicaDescriptor {
        ReplicaDescriptor { segment_name: "s".into(), size: 1 << 20, ..Default::default() }
    }

    #[test]
    fn sizes_put_twice_among_the_last_puts_get_blanks_and_a_half_used_blank_is_not_used() {
        let pool = Blanks::default();
        let now = Instant::now();
        let started = std::cell::Cell::new(0);
        let start = || started.set(started.get() + 1);
        assert!(pool.take(1000, now, start).is_none());
        assert!(pool.state.lock().wanted.is_empty(), "seen once: not worth blanks");
        assert!(pool.take(1000, now, start).is_none());
        assert_eq!(pool.state.lock().wanted, [1000]);
        assert_eq!(started.get(), 1, "the refill thread starts once");
        assert_eq!(pool.next_wanted(now), Some((1000, MOST_PER_SIZE)));
        let ttl = Duration::from_secs(10);
        pool.add(1000, now, vec![(1, replica(), ttl), (2, replica(), ttl)]);
        assert_eq!(pool.take(1000, now, start).map(|b| b.id), Some(1));
        assert_eq!(started.get(), 1);
        // Past half its time at the master, a blank is not used (a write could outlast it).
        assert!(pool.take(1000, now + ttl / 2, start).is_none());
        // A size the master granted none for is not asked for again for a while.
        pool.add(5000, now, Vec::new());
        pool.take(5000, now, start);
        pool.take(5000, now, start);
        assert!(!pool.state.lock().wanted.contains(&5000));
        pool.take(5000, now + BACK_OFF, start);
        assert!(pool.state.lock().wanted.contains(&5000));
        // Forgotten at once when the master says they are gone; none after the client stops.
        pool.add(1000, now, vec![(3, replica(), ttl)]);
        pool.forget();
        assert_eq!(pool.held(), 0);
        pool.stop();
        pool.add(1000, now, vec![(4, replica(), ttl)]);
        assert!(pool.take(1000, now, start).is_none());
        assert_eq!(pool.next_wanted(now), None);
    }

    #[test]
    fn blanks_are_asked_for_in_batches_once_half_are_used() {
        let pool = Blanks::default();
        let now = Instant::now();
        let ttl = Duration::from_secs(10);
        pool.take(1000, now, || {});
        pool.take(1000, now, || {});
        assert_eq!(pool.next_wanted(now), Some((1000, MOST_PER_SIZE)));
        pool.add(1000, now, (0..MOST_PER_SIZE).map(|id| (id, replica(), ttl)).collect());
        for used in 1..=MOST_PER_SIZE {
            assert!(pool.take(1000, now, || {}).is_some());
            let wanted = !pool.state.lock().wanted.is_empty();
            assert_eq!(wanted, used >= MOST_PER_SIZE / 2, "after {used} used");
        }
        assert_eq!(pool.next_wanted(now), Some((1000, MOST_PER_SIZE)), "asked for all that were used");
    }

    #[test]
    fn large_values_keep_fewer_blanks() {
        assert_eq!(target(64 << 10), MOST_PER_SIZE);
        assert_eq!(target(1 << 20), MOST_PER_SIZE);
        assert_eq!(target(2 << 20), 16);
        assert_eq!(target(25 << 20), FEWEST_PER_SIZE);
    }
}
