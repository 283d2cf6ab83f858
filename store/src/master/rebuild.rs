//! Rebuilding the master from its owners' reports.
//!
//! A client that finds a new master (a new term: a restart, a failover) mounts its segment
//! again with the objects its owner index holds ([`Master::remount_with_report`]). Each one is
//! reinstated at its exact range (reserved in the segment's allocator, so nothing else is
//! placed over it), complete, with a fresh read lease of `lease_ttl` (a lease in force at the
//! failover stays honoured) and the pins reported. The report also lists the ranges of objects
//! dropped while a read lease on them still ran (a forced removal, see the `lease_holds`
//! module): they are held out of reuse for what remains of that lease. Conflicts:
//!
//! * the same key, version and size from several owners: one object, one replica per owner;
//! * different versions: the highest complete version wins; the owners of the others are told
//!   to drop theirs (their ranges stay quarantined until they acknowledge, as for a removal);
//! * a put already started at this master for the key: an upsert's wins (it is newer and
//!   replaces the value), the reported copy is dropped; a plain put's gives way (see below);
//! * a range that is not free or not valid (overlapping another reported object, outside the
//!   segment): refused, and dropped by its owner.
//!
//! **The rebuild window.** The reports come in over the first second or so after the new
//! master took over, while it already answers calls; until a key's holder reported, the master
//! takes the key for absent. A later report must not undo what such an answer told its caller
//! (`Window`), for the client TTL from taking over:
//!
//! * a removal answered (OK or `OBJECT_NOT_FOUND`: both tell the caller the key is gone) leaves
//!   a *tombstone*: a copy of the key older than the removal, reported or restored from a disk
//!   later, is refused;
//! * a plain put of a key the master does not know is *provisional*: a put of an existing key
//!   leaves the value as it was, so a reported copy of the key (older, committed) replaces the
//!   put's object — the put answered (or will answer) OK, as a put of an existing key does; one
//!   still in flight finds its object gone at its end and the client looks again. An upsert's
//!   put (`PutOptions.replace`) is final, and leaves a tombstone like a removal;
//! * a report that comes after the window is refused whole: its client has been silent for
//!   the client TTL, and the master that knew it would have dropped it and its objects then.
//!   The window's records go when it closes.
//!
//! Parking the calls on keys not reported yet instead was not possible: the master cannot know
//! which keys those are, nor which holders are still to report, and parking every put of a
//! new key would stop writes for the whole window after each failover.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::owners::Pins;
use super::{check_key, objects, Master, Object, Replica, Stamp, MAX_OBJECT_SIZE};
use crate::allocator::Block;
use crate::error::Result;
use crate::proto::{HeldRange, OwnedObject, OwnerNewsItem, SegmentInfo};

/// Longest a reported held range is kept out of reuse (a client's claim: its lease ended long
/// before; the range is in the client's own segment, so only it would lose room).
pub const MAX_HELD_RANGE: Duration = Duration::from_secs(3600);

/// What a master that took over remembers while its owners report (see the module doc).
#[derive(Debug, Default)]
pub(super) struct Window {
    /// Reports are taken until then; later ones are refused. `None`: no window (a standby).
    until: Option<Instant>,
    /// Key → the version the removal (or upsert) that left the tombstone would have handed
    /// out next: a copy of the key older than that is refused.
    tombstones: HashMap<String, u64>,
    /// Key → version of a plain put of it this master started not knowing the key: a reported
    /// copy replaces that object.
    provisional: HashMap<String, u64>,
    /// The matches of `RemoveByRegex` / `RemoveAll` calls, each with its mark: a copy of a
    /// matching key older than the mark is refused (the oldest go past [`MAX_PATTERNS`]).
    patterns: VecDeque<(Pattern, u64)>,
}

/// Most removals by pattern a rebuild window remembers.
pub const MAX_PATTERNS: usize = 4096;

/// What a removal by pattern matched, and the keys it skipped (leased: not removed).
#[derive(Clone)]
pub(super) struct Pattern {
    matches: Arc<dyn Fn(&str) -> bool + Send + Sync>,
    spared: Spared,
}

/// The keys a removal by pattern skipped, filled in while it runs.
pub(super) type Spared = Arc<parking_lot::Mutex<std::collections::HashSet<String>>>;

impl Pattern {
    fn buries(&self, key: &str) -> bool {
        (self.matches)(key) && !self.spared.lock().contains(key)
    }
}

impl std::fmt::Debug for Pattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Pattern")
    }
}

impl Window {
    /// A window open until `until`.
    pub(super) fn open_until(until: Instant) -> Window {
        Window { until: Some(until), ..Window::default() }
    }

    /// Whether calls are still remembered at `now`.
    fn is_open(&self, now: Instant) -> bool {
        self.until.is_some_and(|t| now < t)
    }

    /// Once the window closed, its records go (called by the paths that add to them, and the
    /// sweep). Returns whether it is open.
    pub(super) fn close_if_over(&mut self, now: Instant) -> bool {
        if self.is_open(now) {
            return true;
        }
        if !self.tombstones.is_empty() || !self.provisional.is_empty() || !self.patterns.is_empty() {
            tracing::info!(
                "rebuild window closed: {} tombstone(s), {} removal(s) by pattern, {} provisional put(s) forgotten",
                self.tombstones.len(),
                self.patterns.len(),
                self.provisional.len()
            );
            self.tombstones = HashMap::new();
            self.provisional = HashMap::new();
            self.patterns = VecDeque::new();
        }
        false
    }

    /// Whether a report at `now` comes after the window.
    fn late(&self, now: Instant) -> bool {
        self.until.is_some_and(|t| now >= t)
    }

    /// `key` was removed (or an upsert replaced it) at `now`, this master's next version
    /// being `next`: copies older than that are gone.
    pub(super) fn removed(&mut self, key: &str, next: u64, now: Instant) {
        if !self.close_if_over(now) {
            return;
        }
        self.provisional.remove(key);
        let mark = self.tombstones.entry(key.to_string()).or_default();
        *mark = (*mark).max(next);
    }

    /// Keys matching `matches` were removed at `now`, this master's next version being `next`
    /// (a `RemoveByRegex` or `RemoveAll`): copies of a matching key older than that are gone,
    /// found or not, but for the leased keys it skipped (noted in what this returns when the
    /// window is open).
    pub(super) fn removed_matching(
        &mut self,
        matches: Arc<dyn Fn(&str) -> bool + Send + Sync>,
        next: u64,
        now: Instant,
    ) -> Option<Spared> {
        if !self.close_if_over(now) {
            return None;
        }
        if self.patterns.len() >= MAX_PATTERNS {
            tracing::warn!("{MAX_PATTERNS} removals by pattern in this rebuild window: the oldest is forgotten");
            self.patterns.pop_front();
        }
        let spared = Spared::default();
        self.patterns.push_back((Pattern { matches, spared: spared.clone() }, next));
        Some(spared)
    }

    /// A removal an earlier leader recorded ([`super::removal_records`]): copies of `key` older
    /// than `mark` are gone.
    pub(super) fn inherit(&mut self, key: &str, mark: u64) {
        let m = self.tombstones.entry(key.to_string()).or_default();
        *m = (*m).max(mark);
    }

    /// A put of `key` (unknown to this master) started at `now` as `version`; `replace`: an
    /// upsert's.
    pub(super) fn put_started(&mut self, key: &str, version: u64, replace: bool, now: Instant) {
        if replace {
            self.removed(key, version, now);
        } else if self.close_if_over(now) && !self.tombstones.contains_key(key) {
            self.provisional.insert(key.to_string(), version);
        }
    }

    /// Whether a copy of `key` at `version`, reported or restored at `now`, is one a call
    /// this master answered took for gone.
    pub(super) fn buried(&self, key: &str, version: u64, now: Instant) -> bool {
        self.is_open(now)
            && (self.tombstones.get(key).is_some_and(|mark| version < *mark)
                || self.patterns.iter().any(|(p, mark)| version < *mark && p.buries(key)))
    }

    /// Whether this master's object of `key` at `version` is a plain put's that a reported
    /// copy replaces.
    fn yields(&self, key: &str, version: u64, now: Instant) -> bool {
        self.is_open(now) && self.provisional.get(key) == Some(&version)
    }
}

/// What a report brought.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rebuilt {
    /// The id the reported segment is mounted as.
    pub segment_id: u64,
    /// Objects or replicas now listed.
    pub reinstated: u64,
    /// Stale or invalid: their owner is told to drop them.
    pub refused: u64,
}

impl Master {
    /// Mounts a segment under this master with the objects its owner holds in it, and the
    /// ranges it reports held for read leases.
    pub fn remount_with_report(
        &self,
        client_id: &str,
        info: &SegmentInfo,
        host: &str,
        objects: &[OwnedObject],
        held: &[HeldRange],
    ) -> Result<Rebuilt> {
        self.remount_with_report_at(client_id, info, host, objects, held, Instant::now())
    }

    pub(super) fn remount_with_report_at(
        &self,
        client_id: &str,
        info: &SegmentInfo,
        host: &str,
        objects: &[OwnedObject],
        held: &[HeldRange],
        now: Instant,
    ) -> Result<Rebuilt> {
        let mut st = self.lock_all();
        self.fence.check(now)?;
        // Whatever this master had of the segment from this client is stale: the report is
        // the truth now.
        if let Some(&id) = st.core.segment_by_name.get(&info.name) {
            if st.core.segments[&id].client_id == client_id {
                self.emit_segment_gone(&st, id);
                Self::drop_segment(&mut st, id);
            }
        }
        let segment_id = self.mount_locked(&mut st, client_id, info, host, now)?;
        let mut out = Rebuilt { segment_id, ..Rebuilt::default() };
        let late = st.window.late(now);
        for o in objects {
            if self.reinstate(&mut st, segment_id, o, late, now) {
                out.reinstated += 1;
            } else {
                out.refused += 1;
            }
        }
        let mut holding = 0;
        for h in held {
            let remaining = Duration::from_millis(h.remaining_ms).min(MAX_HELD_RANGE);
            let seg = st.core.segments.get_mut(&segment_id).expect("mounted");
            // A range a reported object lies in is out of reuse already.
            if let Ok(block) = seg.alloc.reserve(h.offset, h.size) {
                st.holds.hold(segment_id, block, now + remaining, None);
                holding += 1;
            }
        }
        self.flush_news(&mut st);
        drop(st);
        if late {
            tracing::warn!(
                "client {client_id} reported segment {} after the rebuild window (the client TTL from taking over): its {} object(s) are refused",
                info.name,
                objects.len()
            );
        }
        tracing::info!(
            "client {client_id} remounted segment {} as {segment_id} with a report: {} object(s) reinstated, {} refused, {holding} range(s) held for read leases",
            info.name,
            out.reinstated,
            out.refused
        );
        self.update_gauges();
        Ok(out)
    }

    /// One reported object: true when it is listed now. `late`: the report came after the
    /// rebuild window (refused).
    fn reinstate(
        &self,
        st: &mut super::Locked<'_>,
        segment_id: u64,
        o: &OwnedObject,
        late: bool,
        now: Instant,
    ) -> bool {
        let valid = check_key(&o.key).is_ok() && o.size > 0 && o.size <= MAX_OBJECT_SIZE && o.version > 0;
        let block = if valid {
            st.core.segments.get_mut(&segment_id).expect("mounted").alloc.reserve(o.offset, o.size).ok()
        } else {
            None
        };
        let Some(block) = block else {
            // Not ours to quarantine (the range is invalid or another object's): the owner
            // drops its entry, nothing else.
            if valid {
                tracing::warn!("report of {:?} at offset {} refused: the range is not free", o.key, o.offset);
            }
            let item = OwnerNewsItem {
                commit: false,
                key: o.key.clone(),
                version: o.version,
                segment_id,
                offset: o.offset,
                ..Default::default()
            };
            Self::push_news(st, segment_id, item);
            return false;
        };
        if late || st.window.buried(&o.key, o.version, now) {
            // Removed by a call this master answered (or its client silent too long).
            if !late {
                tracing::info!("report of {:?} version {} refused: removed since", o.key, o.version);
            }
            self.refuse(st, o, segment_id, block, now);
            return false;
        }
        let stale = match st.objects.get(&o.key) {
            None => false,
            Some(obj) if obj.version > o.version && st.window.yields(&o.key, obj.version, now) => {
                // A plain put this master started, not knowing the key: the reported value
                // was there first, and a put leaves an existing value.
                tracing::info!(
                    "report of {:?} version {} replaces a put of the key started meanwhile",
                    o.key,
                    o.version
                );
                self.give_way(st, &o.key, now);
                false
            }
            Some(obj) if !obj.complete => true,
            Some(obj) if obj.version == o.version && obj.size == o.size => {
                let obj = st.objects.get_mut(&o.key).expect("looked up");
                if obj.replicas.iter().all(|r| r.segment_id != segment_id) {
                    obj.replicas.push(Replica::new(segment_id, block, Some(0)));
                    if obj.checksum.get().is_none() {
                        obj.checksum = objects::Checksum::new(o.checksum.map(|c| c.crc32));
                    }
                    Self::merge_pins(obj, o, now, self.config.lease_ttl);
                    return true;
                }
                true
            }
            Some(obj) if obj.version > o.version => true,
            Some(_) => {
                // An older version listed by another owner: ours replaces it.
                Self::remove_object(st, &o.key, now);
                false
            }
        };
        if stale {
            self.refuse(st, o, segment_id, block, now);
            return false;
        }
        st.core.next_version = st.core.next_version.max(o.version.saturating_add(1));
        let mut obj = Object {
            size: o.size,
            version: o.version,
            replicas: smallvec::smallvec![Replica::new(segment_id, block, Some(0))],
            ssd: Default::default(),
            complete: true,
            writer: None,
            started: Stamp::of(now),
            lease_until: None,
            soft_pin_until: None,
            hard_pin: false,
            offload_held_until: None,
            checksum: objects::Checksum::new(o.checksum.map(|c| c.crc32)),
        };
        Self::merge_pins(&mut obj, o, now, self.config.lease_ttl);
        st.objects.insert(o.key.clone(), obj);
        true
    }

    /// A reported copy is not listed: its owner drops it. A reader may hold a lease on it
    /// granted by the master before (as long as this master's leases at most): its range stays
    /// out of reuse that long, as after a forced removal (see `lease_holds`).
    fn refuse(&self, st: &mut super::Locked<'_>, o: &OwnedObject, segment_id: u64, block: Block, now: Instant) {
        let hold = Some(now + self.config.lease_ttl);
        Self::free_replica(st, &o.key, o.version, segment_id, block, true, hold);
    }

    /// Removes this master's object of `key`, for a reported copy to take its place. A put in
    /// flight keeps its ranges out of reuse until its put timeout, as its writer may still be
    /// copying into them (its end then finds the object gone).
    fn give_way(&self, st: &mut super::Locked<'_>, key: &str, now: Instant) {
        let Some(obj) = st.objects.get(key) else { return };
        if obj.complete {
            self.emit_object(st, key, crate::proto::EventKind::Removed);
            Self::remove_object(st, key, now);
            return;
        }
        let obj = st.objects.remove(key).expect("looked up above");
        let until = (obj.started.instant() + self.config.put_timeout).max(now);
        Self::queue_disk_removals(st, key, &obj);
        for r in obj.replicas {
            Self::free_replica(st, key, obj.version, r.segment_id, r.block, r.news().is_some(), Some(until));
        }
    }

    /// A reinstated object keeps the pins reported and gets a fresh read lease.
    fn merge_pins(obj: &mut Object, o: &OwnedObject, now: Instant, lease_ttl: Duration) {
        obj.hard_pin |= o.hard_pin;
        if o.soft_pin_remaining_ms > 0 {
            let until = now + Duration::from_millis(o.soft_pin_remaining_ms);
            objects::extend(&mut obj.soft_pin_until, until);
        }
        let until = now + lease_ttl;
        objects::extend(&mut obj.lease_until, until);
    }

    /// What a commit news for `obj` carries.
    pub(super) fn pins_of(obj: &Object) -> Pins {
        Pins { hard: obj.hard_pin, soft_until: obj.soft_pin_until.map(Stamp::instant) }
    }
}
