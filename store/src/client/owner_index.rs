//! The owner index: what this client's memory segment holds, as the master told it.
//!
//! The master sends the owner of a segment ordered news — "commit" and "drop" — and commits a
//! put only once the owners acknowledged (see the master's `owners` module). The index is the
//! owner's copy of that news: key → (version, offset, size, pins, checksum). A commit may be
//! *pending*: sent at the put's start, with the CRC-32 its writer took of the value, while the
//! bytes are still moving; a later commit of the same version makes it complete, a drop removes
//! it. The master may answer the put before the owner learnt it is complete, so a report to a
//! new master settles each pending commit by the bytes the segment holds ([`OwnerIndex::report`]).
//! When a *new* master answers
//! (a new term: a restart or a failover), the client mounts its segment again with this index
//! as its report, and the new master reinstates every object; when the *same* master dropped
//! the client (silent past its TTL), its objects were dropped too, and the index is discarded.
//!
//! The index belongs to one mount: (term, segment id). News of any other mount are ignored
//! and not acknowledged. Sans-IO: the time is an argument.
//!
//! It also keeps the ranges of objects dropped while a read lease on them still ran (a drop
//! whose news carry `hold_ms`): the master keeps them out of reuse until the lease ends, and a
//! new master taking over before then learns them from the report (its allocator is fresh:
//! otherwise it could place a put where a reader is still copying from). They go once ended.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::blank_record::{Record, RECORD_MAX};
use crate::proto::{HeldRange, OwnedObject, OwnerNews};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Owned {
    version: u64,
    offset: u64,
    size: u64,
    hard_pin: bool,
    soft_pin_until: Option<Instant>,
    /// The object's checksum as the commit news had it, for a rebuilt master to keep.
    checksum: Option<u32>,
    /// A pending commit (the put is being written): until when its writer may write the
    /// range. `None`: committed.
    pending_until: Option<Instant>,
}

/// Which mount the index belongs to, and how far its news are applied.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Mount {
    /// The master's term the segment was mounted under (0: not mounted yet).
    pub term: u64,
    /// The segment's id at that master (0: between an unmount and the next mount).
    pub segment_id: u64,
    /// News applied up to this sequence number.
    pub acked: u64,
    /// Changes at every mount (for the stream to reconnect with the new identity).
    pub generation: u64,
}

/// A blank the master granted in this segment (see the master's `blanks`): not yet committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Blank {
    offset: u64,
    /// Its capacity: the value's size and [`RECORD_MAX`].
    size: u64,
    /// Until when its writer may write it.
    until: Instant,
}

#[derive(Default)]
struct State {
    mount: Mount,
    objects: HashMap<String, Owned>,
    /// Blanks by id (the version of the object a commit makes of one).
    blanks: HashMap<u64, Blank>,
    /// Ranges held for read leases: (offset, size, until).
    held: Vec<(u64, u64, Instant)>,
}

/// Longest a pending commit's range is held after its bytes did not match (its news'
/// `hold_ms`, the old master's put timeout, is the master's word; bounded all the same).
pub const MAX_PENDING_MS: u64 = 3_600_000;

/// The owner index of one client's segment: key → where the object lies in the segment,
/// its version and pins, kept under a lock (the owner stream's thread applies news, the
/// heartbeat reads it for a remount).
#[derive(Default)]
pub struct OwnerIndex {
    state: Mutex<State>,
}

impl OwnerIndex {
    /// The mount the index belongs to now, and how far its news are applied.
    pub fn mount(&self) -> Mount {
        self.state.lock().mount
    }

    /// Objects the index holds.
    pub fn len(&self) -> usize {
        self.state.lock().objects.len()
    }

    /// True when it holds no object.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A remount with a report is starting: no news is applied until [`Self::mounted`]; the
    /// objects and the last term stay.
    pub fn unmount(&self) {
        let mut st = self.state.lock();
        st.mount.segment_id = 0;
        st.mount.generation += 1;
    }

    /// The master that knew this client dropped it, and its objects with it: forget them all.
    pub fn discard(&self) {
        let mut st = self.state.lock();
        st.objects.clear();
        st.blanks.clear();
        st.held.clear();
        st.mount.segment_id = 0;
        st.mount.generation += 1;
    }

    /// The segment is mounted as `segment_id` under `term`; `keep` the objects (a new master
    /// reinstated them from the report) or discard them (a fresh mount; the master that
    /// dropped this client dropped them).
    pub fn mounted(&self, term: u64, segment_id: u64, keep: bool) {
        let mut st = self.state.lock();
        if !keep {
            st.objects.clear();
            st.blanks.clear();
            st.held.clear();
        }
        let generation = st.mount.generation + 1;
        st.mount = Mount { term, segment_id, acked: 0, generation };
    }

    /// Applies news; returns the sequence number to acknowledge, or `None` when the news are
    /// not about the current mount (they are then ignored, unacknowledged).
    pub fn apply(&self, news: &OwnerNews, now: Instant) -> Option<u64> {
        let mut st = self.state.lock();
        if news.term == 0 || news.term != st.mount.term || st.mount.segment_id == 0 {
            return None;
        }
        let segment_id = st.mount.segment_id;
        st.held.retain(|(_, _, until)| *until > now);
        for item in &news.items {
            // Sequence numbers are per mount and have no gaps: an item seen already (sent
            // again after a reconnect) is skipped.
            if item.seq <= st.mount.acked {
                continue;
            }
            st.mount.acked = item.seq;
            if item.segment_id != segment_id {
                continue;
            }
            if item.blank {
                if item.commit {
                    let until = now + Duration::from_millis(item.hold_ms.min(MAX_PENDING_MS));
                    st.blanks.insert(item.version, Blank { offset: item.offset, size: item.size, until });
                } else {
                    st.blanks.remove(&item.version);
                }
                continue;
            }
            if item.commit {
                // A commit in a blank settles it.
                st.blanks.remove(&item.version);
                let soft_pin_until =
                    (item.soft_pin_ttl_ms > 0).then(|| now + Duration::from_millis(item.soft_pin_ttl_ms));
                let pending_until = item.pending.then(|| now + Duration::from_millis(item.hold_ms.min(MAX_PENDING_MS)));
                let owned = Owned {
                    version: item.version,
                    offset: item.offset,
                    size: item.size,
                    hard_pin: item.hard_pin,
                    soft_pin_until,
                    checksum: item.checksum.map(|c| c.crc32),
                    pending_until,
                };
                match st.objects.get(&item.key) {
                    Some(o) if o.version > item.version => {}
                    // A pending commit after the complete one (never sent so) changes nothing.
                    Some(o) if o.version == item.version && o.pending_until.is_none() && item.pending => {}
                    _ => {
                        st.objects.insert(item.key.clone(), owned);
                    }
                }
            } else {
                if item.hold_ms > 0 && item.size > 0 {
                    st.held.push((item.offset, item.size, now + Duration::from_millis(item.hold_ms)));
                }
                if st.objects.get(&item.key).is_some_and(|o| o.version <= item.version) {
                    st.objects.remove(&item.key);
                }
            }
        }
        Some(st.mount.acked)
    }

    /// What to tell a new master: every object, with its soft pin's remaining time.
    ///
    /// A pending commit (a put the old master may have answered without a further word to
    /// this owner) is settled first by its bytes: `matches(offset, size, crc)` says whether
    /// the segment's range holds bytes of that checksum. Matching, the writer's transfer
    /// finished and the object is reported (and kept) as committed; not matching (or with no
    /// checksum to compare), the put cannot have been answered OK, and the object is dropped
    /// here, its range held until its writer's put timeout ran out ([`Self::held`]: the writer
    /// may still be copying into it).
    pub fn report(&self, now: Instant, matches: impl Fn(u64, u64, u32) -> bool) -> Vec<OwnedObject> {
        let mut st = self.state.lock();
        let pending: Vec<String> =
            st.objects.iter().filter(|(_, o)| o.pending_until.is_some()).map(|(k, _)| k.clone()).collect();
        for key in pending {
            let o = st.objects[&key];
            if o.checksum.is_some_and(|crc| matches(o.offset, o.size, crc)) {
                st.objects.get_mut(&key).expect("listed above").pending_until = None;
                tracing::debug!("pending put of {key:?} (version {}) holds its whole value: reported", o.version);
                continue;
            }
            st.objects.remove(&key);
            let until = o.pending_until.expect("pending");
            if until > now && o.size > 0 {
                st.held.push((o.offset, o.size, until));
            }
            tracing::info!(
                "pending put of {key:?} (version {}) was not written whole: dropped, its range held for its writer",
                o.version
            );
        }
        let mut out: Vec<OwnedObject> = st
            .objects
            .iter()
            .map(|(key, o)| OwnedObject {
                key: key.clone(),
                version: o.version,
                offset: o.offset,
                size: o.size,
                hard_pin: o.hard_pin,
                soft_pin_remaining_ms: o
                    .soft_pin_until
                    .map_or(0, |t| t.saturating_duration_since(now).as_millis() as u64),
                checksum: o.checksum.map(|crc32| crate::proto::Checksum { crc32 }),
            })
            .collect();
        out.sort_by_key(|o| o.offset);
        out
    }

    /// Settles the blanks not committed as far as this owner heard, for a new master (before
    /// [`Self::report`]): `record(offset)` reads the [`RECORD_MAX`] bytes at `offset` of the
    /// segment, `matches` is [`Self::report`]'s. A blank whose record is whole, names it and
    /// sits behind a value of that checksum was committed (or could have been: its writer's
    /// transfer ended) and becomes the object the record names, complete; any other was not
    /// answered OK, and its range is held while its writer may still write it. Returns how
    /// many became objects.
    pub fn settle_blanks(
        &self,
        now: Instant,
        record: impl Fn(u64) -> Option<Vec<u8>>,
        matches: impl Fn(u64, u64, u32) -> bool,
    ) -> usize {
        let mut st = self.state.lock();
        let blanks: Vec<(u64, Blank)> = st.blanks.drain().collect();
        let mut settled = 0;
        for (id, b) in blanks {
            let value_size = b.size.saturating_sub(RECORD_MAX);
            let whole = (value_size > 0)
                .then(|| record(b.offset + value_size))
                .flatten()
                .and_then(|bytes| Record::decode(&bytes))
                .filter(|r| r.blank == id && r.size == value_size && matches(b.offset, value_size, r.crc));
            let newer = whole.as_ref().is_some_and(|r| st.objects.get(&r.key).is_some_and(|o| o.version > id));
            match whole {
                Some(r) if !newer => {
                    tracing::debug!("blank {id} holds the whole value of {:?}: reported", r.key);
                    let owned = Owned {
                        version: id,
                        offset: b.offset,
                        size: value_size,
                        hard_pin: r.hard_pin,
                        // (From now: the owner does not know when the commit came.)
                        soft_pin_until: (r.soft_pin_ms > 0).then(|| now + Duration::from_millis(r.soft_pin_ms)),
                        checksum: Some(r.crc),
                        pending_until: None,
                    };
                    st.objects.insert(r.key, owned);
                    settled += 1;
                }
                _ => {
                    if b.until > now {
                        st.held.push((b.offset, b.size, b.until));
                    }
                    tracing::debug!("blank {id} holds no whole value: its range held for its writer");
                }
            }
        }
        settled
    }

    /// The ranges still held for read leases at `now`, with what remains of each, for a new
    /// master (see the module doc).
    pub fn held(&self, now: Instant) -> Vec<HeldRange> {
        let st = self.state.lock();
        st.held
            .iter()
            .filter(|(_, _, until)| *until > now)
            .map(|&(offset, size, until)| HeldRange {
                offset,
                size,
                remaining_ms: until.saturating_duration_since(now).as_millis().max(1) as u64,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::OwnerNewsItem;

    fn commit(seq: u64, key: &str, version: u64, offset: u64) -> OwnerNewsItem {
        OwnerNewsItem {
            seq,
            commit: true,
            key: key.into(),
            version,
            segment_id: 3,
            offset,
            size: 100,
            ..Default::default()
        }
    }

    fn drop(seq: u64, key: &str, version: u64) -> OwnerNewsItem {
        OwnerNewsItem { seq, commit: false, key: key.into(), version, segment_id: 3, ..Default::default() }
    }

    fn news(term: u64, items: Vec<OwnerNewsItem>) -> OwnerNews {
        OwnerNews { term, items, tasks_waiting: false }
    }

    #[test]
    fn news_of_the_current_mount_build_the_report() {
        let ix = OwnerIndex::default();
        let now = Instant::now();
        ix.mounted(7, 3, false);
        let pinned = OwnerNewsItem { soft_pin_ttl_ms: 60_000, hard_pin: true, ..commit(3, "p", 1, 4096) };
        assert_eq!(ix.apply(&news(7, vec![commit(1, "a", 10, 0), commit(2, "b", 11, 256), pinned]), now), Some(3));
        assert_eq!(ix.apply(&news(7, vec![drop(4, "a", 10)]), now), Some(4));
        let later = now + Duration::from_secs(10);
        let report = ix.report(later, |_, _, _| false);
        assert_eq!(report.iter().map(|o| o.key.as_str()).collect::<Vec<_>>(), ["b", "p"]);
        assert_eq!((report[0].version, report[0].offset, report[0].size), (11, 256, 100));
        assert!(report[1].hard_pin);
        assert_eq!(report[1].soft_pin_remaining_ms, 50_000);
    }

    #[test]
    fn a_drop_under_a_read_lease_is_reported_held_until_the_lease_ends() {
        let ix = OwnerIndex::default();
        let now = Instant::now();
        ix.mounted(7, 3, false);
        let held = OwnerNewsItem { size: 256, hold_ms: 5_000, offset: 512, ..drop(2, "a", 1) };
        ix.apply(&news(7, vec![commit(1, "a", 1, 512), held, drop(3, "b", 1)]), now);
        assert!(ix.is_empty());
        let later = now + Duration::from_secs(2);
        assert_eq!(ix.held(later), [HeldRange { offset: 512, size: 256, remaining_ms: 3_000 }]);
        // Kept across a remount under a new master (it may go too before the lease ends).
        ix.unmount();
        ix.mounted(8, 4, true);
        assert_eq!(ix.held(later).len(), 1);
        assert!(ix.held(now + Duration::from_secs(5)).is_empty(), "the lease ended");
        ix.discard();
        assert!(ix.held(later).is_empty());
    }

    #[test]
    fn the_report_keeps_the_checksum_the_commit_news_had() {
        let ix = OwnerIndex::default();
        let now = Instant::now();
        ix.mounted(7, 3, false);
        let checked = OwnerNewsItem { checksum: Some(crate::proto::Checksum { crc32: 0 }), ..commit(1, "c", 1, 0) };
        ix.apply(&news(7, vec![checked, commit(2, "n", 1, 256)]), now);
        let report = ix.report(now, |_, _, _| false);
        assert_eq!(report[0].checksum, Some(crate::proto::Checksum { crc32: 0 }), "a crc of 0 is a checksum");
        assert_eq!(report[1].checksum, None, "none taken, none reported");
    }

    #[test]
    fn news_of_another_term_or_mount_are_ignored_and_repeats_skipped() {
        let ix = OwnerIndex::default();
        let now = Instant::now();
        assert_eq!(ix.apply(&news(7, vec![commit(1, "a", 1, 0)]), now), None, "not mounted");
        ix.mounted(7, 3, false);
        assert_eq!(ix.apply(&news(6, vec![commit(1, "a", 1, 0)]), now), None, "an older master");
        assert!(ix.is_empty());
        ix.apply(&news(7, vec![commit(1, "a", 1, 0), commit(2, "b", 1, 256)]), now);
        // Sent again after a reconnect: the drop of "a" at seq 1 would be wrong; seq 1 is old.
        assert_eq!(ix.apply(&news(7, vec![drop(1, "a", 1), commit(2, "b", 1, 256)]), now), Some(2));
        assert_eq!(ix.len(), 2);
        // An item about another segment is acknowledged but not applied.
        let other = OwnerNewsItem { segment_id: 99, ..commit(3, "c", 1, 512) };
        assert_eq!(ix.apply(&news(7, vec![other]), now), Some(3));
        assert_eq!(ix.len(), 2);
        // A drop of an older version keeps the newer one.
        ix.apply(&news(7, vec![commit(4, "a", 5, 0), drop(5, "a", 1)]), now);
        assert_eq!(ix.report(now, |_, _, _| false)[0].version, 5);
        // During a remount nothing is applied, and the last term is remembered.
        ix.unmount();
        assert_eq!(ix.apply(&news(7, vec![drop(6, "a", 5)]), now), None);
        assert_eq!(ix.mount().term, 7);
        ix.mounted(8, 4, true);
        assert_eq!(ix.len(), 2);
        assert_eq!(ix.mount().acked, 0);
        ix.discard();
        assert!(ix.is_empty());
        assert_eq!(ix.apply(&news(8, vec![commit(1, "x", 1, 0)]), now), None);
    }

    #[test]
    fn a_pending_commit_is_settled_by_its_bytes_for_a_new_master() {
        let ix = OwnerIndex::default();
        let now = Instant::now();
        ix.mounted(7, 3, false);
        let pending = |seq, key: &str, offset, crc32| OwnerNewsItem {
            pending: true,
            hold_ms: 60_000,
            checksum: Some(crate::proto::Checksum { crc32 }),
            ..commit(seq, key, 1, offset)
        };
        let unchecked = OwnerNewsItem { checksum: None, ..pending(3, "none", 512, 0) };
        ix.apply(&news(7, vec![pending(1, "whole", 0, 11), pending(2, "torn", 256, 22), unchecked]), now);
        // A complete news makes a pending commit complete; a pending one after it changes nothing.
        ix.apply(
            &news(7, vec![pending(4, "done", 768, 44), commit(5, "done", 1, 768), pending(6, "done", 768, 44)]),
            now,
        );
        assert_eq!(ix.len(), 4);
        let later = now + Duration::from_secs(10);
        let asked = Mutex::new(Vec::new());
        let report = ix.report(later, |offset, size, crc| {
            asked.lock().push((offset, size, crc));
            crc == 11
        });
        let mut asked = asked.into_inner();
        asked.sort();
        assert_eq!(asked, [(0, 100, 11), (256, 100, 22)], "only pending commits with a checksum are checked");
        assert_eq!(report.iter().map(|o| o.key.as_str()).collect::<Vec<_>>(), ["whole", "done"]);
        assert_eq!(report[0].checksum, Some(crate::proto::Checksum { crc32: 11 }));
        // The others are dropped; their ranges held for what remains of their writers' time.
        let mut held = ix.held(later);
        held.sort_by_key(|h| h.offset);
        assert_eq!(
            held,
            [
                HeldRange { offset: 256, size: 100, remaining_ms: 50_000 },
                HeldRange { offset: 512, size: 100, remaining_ms: 50_000 },
            ]
        );
        // Settled once: the next report checks nothing.
        assert_eq!(ix.report(later, |_, _, _| unreachable!("settled")).len(), 2);
    }
}
