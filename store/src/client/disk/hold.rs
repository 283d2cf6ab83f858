//! Test support: holding a tier's commit rounds, so that a test can make something happen
//! between a put's commit and its file's announcement (a master restart, say) without
//! sleeping. A hold names the tier by its directory ([`super::DiskTier::dir`], which a
//! storage root's lock gives to one tier at a time), so that a test outside this crate, which
//! sees only the store client, can reach it. Without a hold (always, outside tests) the
//! committer pays one atomic load a round.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

/// The holds in force; `ANY` says whether to look.
static HOLDS: Mutex<Vec<Weak<Hold>>> = Mutex::new(Vec::new());
static ANY: AtomicBool = AtomicBool::new(false);

struct Hold {
    dir: PathBuf,
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    /// A commit round of the tier is waiting at the hold.
    reached: bool,
    released: bool,
}

/// Holds the commit rounds of the tier whose directory is `dir` (see the module doc): each
/// waits, its files written under their temporary names and not announced, until the hold is
/// released or dropped.
#[doc(hidden)]
pub struct CommitHold(Arc<Hold>);

/// Holds the next commit rounds of the tier at `dir` (see [`CommitHold`]).
#[doc(hidden)]
pub fn hold_commits(dir: &Path) -> CommitHold {
    let hold = Arc::new(Hold { dir: dir.to_path_buf(), state: Mutex::new(State::default()), changed: Condvar::new() });
    let mut holds = HOLDS.lock();
    holds.retain(|h| h.strong_count() > 0);
    holds.push(Arc::downgrade(&hold));
    ANY.store(true, Ordering::Release);
    CommitHold(hold)
}

impl CommitHold {
    /// Waits until a commit round is held (false when none came within `timeout`).
    pub fn wait_reached(&self, timeout: Duration) -> bool {
        let mut st = self.0.state.lock();
        let _ = self.0.changed.wait_while_for(&mut st, |s| !s.reached, timeout);
        st.reached
    }

    /// Lets the held round, and every later one, go on.
    pub fn release(&self) {
        self.0.state.lock().released = true;
        self.0.changed.notify_all();
    }
}

impl Drop for CommitHold {
    fn drop(&mut self) {
        self.release();
    }
}

/// The committer's side: waits while a hold of `dir` is in force.
pub(super) fn wait_if_held(dir: &Path) {
    if !ANY.load(Ordering::Acquire) {
        return;
    }
    let hold = HOLDS.lock().iter().filter_map(Weak::upgrade).find(|h| h.dir == dir);
    let Some(hold) = hold else { return };
    let mut st = hold.state.lock();
    st.reached = true;
    hold.changed.notify_all();
    hold.changed.wait_while(&mut st, |s| !s.released);
}
