//! What the master must hear about this disk's files, as a sans-IO state machine: the tier
//! feeds it events (files committed, removals, a call's answer or failure, remounts) with the
//! time, and it says what to send ([`Call`]), what each answer means for a file
//! ([`Verdict`]) and when to try again ([`Announcements::wait`]); the tier's thin driver makes
//! the calls. Tested in memory with a made-up clock (below).
//!
//! * A call that fails (the master unreachable, restarting, or not knowing this disk yet) is
//!   kept, whole, to be told again after a backoff: [`RETRY_FIRST`], doubling per failure in a
//!   row, up to [`RETRY_MAX`]. A retry re-reads the files from the index (a file replaced or
//!   gone meanwhile is not announced; a removal of a file written anew meanwhile is not sent)
//!   and says `restore`: the master may have lost the objects meanwhile.
//! * Any answer shows the master is back: what earlier calls missed goes at once.
//! * **Ambiguous refusals.** A fresh announcement (`restore` false) refused by the master
//!   means the object was removed, or put again, while its file was written — when the master
//!   that answers is the one the put was made under. The tier cannot see which master made a
//!   put, but it sees when the master may have changed since: the disk was mounted again
//!   ([`Announcements::remounted`], at every mount) or a call failed. Each file carries the
//!   *generation* it was prepared under (before its put went to the master); a refusal of a
//!   file from an older generation is ambiguous: the file is kept and told again as a
//!   restore, which the master refuses only for a removal it knows of (queued, or handed back
//!   by the clients that keep removals) or another version. So a client never deletes the
//!   only copy of an acknowledged put because a restarted master did not know it.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use crate::proto::DiskEntry;

/// After a failed call to the master, the first retry waits this long, each further one twice
/// as long as the last, up to [`RETRY_MAX`] (the master spares an object whose file is being
/// written for 10 s: a file announced within that time keeps its object through evictions).
pub const RETRY_FIRST: Duration = Duration::from_millis(200);
/// The longest wait between two retries, however many calls failed in a row.
pub const RETRY_MAX: Duration = Duration::from_secs(2);
/// How long the committer sleeps with nothing to commit before it looks for retries due.
pub const RETRY_IDLE: Duration = Duration::from_secs(1);
/// Most removals kept to be told again (evictions, deletions, acknowledgements); beyond it the
/// oldest are forgotten (the master then lists a file that is gone until a read finds it gone).
pub const MAX_UNANNOUNCED_REMOVALS: usize = 65_536;
/// Most entries per retried (or restoring) call.
pub const RETRY_BATCH: usize = 1000;

/// One call to make: `UpdateDiskReplicas(added, removed, restore)`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Call {
    /// Files to list this disk as a holder of (key, version, size).
    pub added: Vec<DiskEntry>,
    /// Files this disk no longer holds.
    pub removed: Vec<DiskEntry>,
    /// A retry or a remount's report: the master may have lost the objects, and takes back an
    /// added file unless it knows of its removal or of another version.
    pub restore: bool,
    /// Per added entry, the generation its file was prepared under.
    generations: Vec<u64>,
}

/// What the master's answer means for one announced file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The master lists this disk as a holder.
    Accepted,
    /// Refused by the master that knew the put (or on a restore): the file is stale, delete it.
    Stale,
    /// Refused by a master that may never have known the put: the file stays and is told
    /// again as a restore ([`Announcements::take_retry`]).
    Kept,
}

/// What a failed call did to the state (for the log line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Until the next retry.
    pub wait: Duration,
    /// Files and removals waiting now.
    pub waiting: usize,
    /// Oldest removals forgotten to stay under the bound.
    pub forgotten: usize,
}

/// The state: what failed calls did not tell the master, and when to tell it again.
#[derive(Debug)]
pub struct Announcements {
    /// Files to tell again: key → version (announced as the index holds them then).
    added: HashMap<String, u64>,
    /// Files that went (evicted, deleted) and removals done, oldest first.
    removed: VecDeque<DiskEntry>,
    max_removed: usize,
    /// Failed calls in a row, and when the next retry is due.
    failures: u32,
    next_try: Option<Instant>,
    /// Bumped at every mount and failed call: the master may have changed since.
    generation: u64,
}

impl Default for Announcements {
    fn default() -> Self {
        Announcements::new(MAX_UNANNOUNCED_REMOVALS)
    }
}

impl Announcements {
    /// Keeping at most `max_removed` removals to tell again.
    pub fn new(max_removed: usize) -> Announcements {
        Announcements {
            added: HashMap::new(),
            removed: VecDeque::new(),
            max_removed,
            failures: 0,
            next_try: None,
            generation: 0,
        }
    }

    /// The generation a file prepared now belongs to.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Files and removals waiting to be told again.
    pub fn len(&self) -> usize {
        self.added.len() + self.removed.len()
    }

    /// True when nothing waits to be told again.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A fresh call for files just committed (each with the generation it was prepared
    /// under) and files gone.
    pub fn fresh(&self, added: Vec<(DiskEntry, u64)>, removed: Vec<DiskEntry>) -> Call {
        let (added, generations) = added.into_iter().unzip();
        Call { added, removed, restore: false, generations }
    }

    /// The disk was mounted (again): every file on it is about to be told as a restore, in
    /// these calls. Files prepared before now may have been put under another master.
    pub fn remounted(&mut self, files: Vec<DiskEntry>) -> Vec<Call> {
        self.generation += 1;
        let generation = self.generation;
        let mut calls = Vec::new();
        let mut files = files.into_iter().peekable();
        while files.peek().is_some() {
            let added: Vec<DiskEntry> = files.by_ref().take(RETRY_BATCH).collect();
            calls.push(Call { generations: vec![generation; added.len()], added, removed: Vec::new(), restore: true });
        }
        calls
    }

    /// The master answered `call` (one flag per added entry: whether it lists this disk as a
    /// holder; missing flags are refusals). Returns the verdict per added entry.
    pub fn answered(&mut self, call: &Call, accepted: &[bool]) -> Vec<Verdict> {
        self.failures = 0;
        self.next_try = None;
        call.added
            .iter()
            .zip(&call.generations)
            .enumerate()
            .map(|(i, (e, &generation))| {
                if accepted.get(i).copied().unwrap_or(false) {
                    Verdict::Accepted
                } else if call.restore || generation >= self.generation {
                    Verdict::Stale
                } else {
                    self.keep_added(e);
                    Verdict::Kept
                }
            })
            .collect()
    }

    /// `calls` failed (the first was made and failed; the others were not made): what they
    /// carried is kept to be told again after a backoff from `now`.
    pub fn failed(&mut self, calls: Vec<Call>, now: Instant) -> Backoff {
        self.generation += 1;
        for call in calls {
            for a in &call.added {
                self.keep_added(a);
            }
            self.removed.extend(call.removed);
        }
        let mut forgotten = 0;
        while self.removed.len() > self.max_removed {
            self.removed.pop_front();
            forgotten += 1;
        }
        self.failures = self.failures.saturating_add(1);
        let wait = RETRY_FIRST.saturating_mul(1 << (self.failures - 1).min(16)).min(RETRY_MAX);
        self.next_try = Some(now + wait);
        Backoff { wait, waiting: self.len(), forgotten }
    }

    fn keep_added(&mut self, e: &DiskEntry) {
        let v = self.added.entry(e.key.clone()).or_insert(e.version);
        *v = (*v).max(e.version);
    }

    /// How long the driver may wait (for files to commit) before a retry is due.
    pub fn wait(&self, now: Instant) -> Duration {
        match self.next_try {
            Some(t) if !self.is_empty() => t.saturating_duration_since(now),
            // Kept without a failure (an ambiguous refusal): due now.
            None if !self.is_empty() => Duration::ZERO,
            _ => RETRY_IDLE,
        }
    }

    /// What to tell again now (with `force`, whatever the backoff says; otherwise only once it
    /// has passed), as calls saying `restore`: the files that `current` still finds at the
    /// version to be told (it returns their value size), and the removals `gone` confirms (no
    /// file of that version came back). Empty when nothing is due or left.
    pub fn take_retry(
        &mut self,
        now: Instant,
        force: bool,
        current: impl Fn(&str, u64) -> Option<u64>,
        gone: impl Fn(&DiskEntry) -> bool,
    ) -> Vec<Call> {
        if self.is_empty() || (!force && self.next_try.is_some_and(|t| now < t)) {
            return Vec::new();
        }
        let generation = self.generation;
        let mut added: Vec<DiskEntry> = std::mem::take(&mut self.added)
            .into_iter()
            .filter_map(|(key, version)| Some(DiskEntry { size: current(&key, version)?, key, version }))
            .collect();
        added.sort_by(|a, b| a.key.cmp(&b.key));
        let removed: Vec<DiskEntry> = std::mem::take(&mut self.removed).into_iter().filter(|r| gone(r)).collect();
        if added.is_empty() && removed.is_empty() {
            self.failures = 0;
            self.next_try = None;
            return Vec::new();
        }
        let mut calls: Vec<Call> = added
            .chunks(RETRY_BATCH)
            .map(|a| Call {
                added: a.to_vec(),
                removed: Vec::new(),
                restore: true,
                generations: vec![generation; a.len()],
            })
            .collect();
        if calls.is_empty() {
            calls.push(Call { restore: true, ..Call::default() });
        }
        calls[0].removed = removed;
        calls
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(key: &str, version: u64) -> DiskEntry {
        DiskEntry { key: key.into(), size: 10, version }
    }

    fn keys(call: &Call) -> Vec<&str> {
        call.added.iter().map(|e| e.key.as_str()).collect()
    }

    /// Every file is still indexed at its version, every removal still holds.
    fn all_current(_: &str, _: u64) -> Option<u64> {
        Some(10)
    }
    fn all_gone(_: &DiskEntry) -> bool {
        true
    }

    #[test]
    fn a_failed_call_is_told_again_as_a_restore_after_a_backoff_that_doubles_up_to_its_cap() {
        let t0 = Instant::now();
        let mut a = Announcements::default();
        assert_eq!(a.wait(t0), RETRY_IDLE, "nothing to tell: the driver idles");
        let call = a.fresh(vec![(e("k", 1), a.generation())], vec![e("gone", 3)]);
        let b = a.failed(vec![call], t0);
        assert_eq!(b, Backoff { wait: RETRY_FIRST, waiting: 2, forgotten: 0 });
        assert_eq!(a.wait(t0), RETRY_FIRST);
        assert!(a.take_retry(t0 + RETRY_FIRST / 2, false, all_current, all_gone).is_empty(), "not due yet");
        let calls = a.take_retry(t0 + RETRY_FIRST, false, all_current, all_gone);
        assert_eq!(calls.len(), 1);
        assert!(calls[0].restore, "the master may have lost the objects meanwhile");
        assert_eq!((keys(&calls[0]), calls[0].removed.clone()), (vec!["k"], vec![e("gone", 3)]));
        // It fails again, and again: 400 ms, 800 ms, 1.6 s, then 2 s each.
        let mut now = t0 + RETRY_FIRST;
        let mut calls = calls;
        let mut waits = Vec::new();
        for _ in 0..5 {
            waits.push(a.failed(calls, now).wait);
            now += a.wait(now);
            calls = a.take_retry(now, false, all_current, all_gone);
            assert_eq!(calls.len(), 1);
        }
        let ms = |d: &Duration| d.as_millis() as u64;
        assert_eq!(waits.iter().map(ms).collect::<Vec<_>>(), [400, 800, 1600, 2000, 2000]);
        // An answer: the backoff starts over, nothing is left.
        assert_eq!(a.answered(&calls[0], &[true]), [Verdict::Accepted]);
        assert!(a.is_empty());
        assert_eq!(a.wait(now), RETRY_IDLE);
        assert_eq!(a.failed(vec![Call::default()], now).wait, RETRY_FIRST);
    }

    #[test]
    fn a_retry_sends_only_what_still_holds() {
        let t0 = Instant::now();
        let mut a = Announcements::default();
        let call = a.fresh(
            vec![(e("replaced", 1), 0), (e("evicted", 1), 0), (e("kept", 1), 0)],
            vec![e("written-anew", 1), e("removed", 1)],
        );
        a.failed(vec![call], t0);
        let current = |key: &str, version: u64| match key {
            "replaced" => (version == 2).then_some(10),
            "evicted" => None,
            _ => Some(77),
        };
        let calls = a.take_retry(t0, true, current, |r| r.key != "written-anew");
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].added, [DiskEntry { key: "kept".into(), size: 77, version: 1 }], "sizes from the index");
        assert_eq!(calls[0].removed, [e("removed", 1)]);
        // Nothing left that holds: no call, and the backoff is over.
        a.failed(calls, t0);
        assert!(a.take_retry(t0, true, |_, _| None, |_| false).is_empty());
        assert!(a.is_empty() && a.wait(t0) == RETRY_IDLE);
    }

    #[test]
    fn many_files_go_in_batches_with_the_removals_in_the_first_and_old_removals_are_forgotten() {
        let t0 = Instant::now();
        let mut a = Announcements::new(3);
        let files: Vec<(DiskEntry, u64)> = (0..2 * RETRY_BATCH + 1).map(|i| (e(&format!("k{i:05}"), 1), 0)).collect();
        let removed: Vec<DiskEntry> = (0..5).map(|i| e(&format!("r{i}"), 1)).collect();
        let b = a.failed(vec![a.fresh(files, removed)], t0);
        assert_eq!(b.forgotten, 2, "5 removals, 3 kept");
        let calls = a.take_retry(t0, true, all_current, all_gone);
        assert_eq!(calls.iter().map(|c| c.added.len()).collect::<Vec<_>>(), [RETRY_BATCH, RETRY_BATCH, 1]);
        let removed: Vec<&str> = calls[0].removed.iter().map(|r| r.key.as_str()).collect();
        assert_eq!(removed, ["r2", "r3", "r4"], "the newest kept, oldest first");
        assert!(calls[1..].iter().all(|c| c.removed.is_empty()));
        // The first call fails, the others were not made: all of it is kept.
        a.failed(calls, t0);
        assert_eq!(a.len(), 2 * RETRY_BATCH + 1 + 3);
        // A remount tells every file in batches too.
        let calls = a.remounted((0..RETRY_BATCH + 1).map(|i| e(&format!("f{i}"), 1)).collect());
        assert_eq!(
            calls.iter().map(|c| (c.added.len(), c.restore)).collect::<Vec<_>>(),
            [(RETRY_BATCH, true), (1, true)]
        );
    }

    #[test]
    fn a_refusal_by_a_master_that_may_never_have_known_the_put_keeps_the_file() {
        let t0 = Instant::now();
        let mut a = Announcements::default();
        // Prepared under the current generation, refused: the same master removed it.
        let same = a.fresh(vec![(e("removed", 1), a.generation())], vec![]);
        assert_eq!(a.answered(&same, &[false]), [Verdict::Stale]);
        assert!(a.is_empty());
        // Prepared, then the disk is mounted again (the master restarted), then refused.
        let before = a.generation();
        assert!(a.remounted(vec![]).is_empty());
        let call = a.fresh(vec![(e("put-before", 7), before), (e("accepted", 1), before)], vec![]);
        assert_eq!(a.answered(&call, &[false, true]), [Verdict::Kept, Verdict::Accepted]);
        assert_eq!(a.wait(t0), Duration::ZERO, "told again at once, the master answers");
        let retry = a.take_retry(t0, false, all_current, all_gone);
        assert_eq!((keys(&retry[0]), retry[0].restore), (vec!["put-before"], true));
        // A restore refused is final: a removal the master knows of, or another version.
        assert_eq!(a.answered(&retry[0], &[false]), [Verdict::Stale]);
        assert!(a.is_empty());
        // A failed call in between counts as a possible change of master too.
        let before = a.generation();
        a.failed(vec![Call::default()], t0);
        let call = a.fresh(vec![(e("put-before-failure", 1), before)], vec![]);
        assert_eq!(a.answered(&call, &[]), [Verdict::Kept], "a missing answer is a refusal");
    }
}
