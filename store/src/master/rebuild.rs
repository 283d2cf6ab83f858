//! Rebuilding the master from its owners' reports.
//!
//! A client that finds a new master (a new term: a restart, a failover) mounts its segment
//! again with the objects its owner index holds ([`Master::remount_with_report`]). Each one is
//! reinstated at its exact range (reserved in the segment's allocator, so nothing else is
//! placed over it), complete, with a fresh read lease of `lease_ttl` (a lease in force at the
//! failover stays honoured) and the pins reported. Conflicts:
//!
//! * the same key, version and size from several owners: one object, one replica per owner;
//! * different versions: the highest complete version wins; the owners of the others are told
//!   to drop theirs (their ranges stay quarantined until they acknowledge, as for a removal);
//! * a put already started at this master for the key: it wins (it is newer), the reported
//!   copy is dropped;
//! * a range that is not free or not valid (overlapping another reported object, outside the
//!   segment): refused, and dropped by its owner.

use std::time::{Duration, Instant};

use super::owners::Pins;
use super::{check_key, objects, Master, Object, Replica, Stamp, MAX_OBJECT_SIZE};
use crate::error::Result;
use crate::proto::{OwnedObject, OwnerNewsItem, SegmentInfo};

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
    /// Mounts a segment under this master with the objects its owner holds in it.
    pub fn remount_with_report(
        &self,
        client_id: &str,
        info: &SegmentInfo,
        host: &str,
        objects: &[OwnedObject],
    ) -> Result<Rebuilt> {
        self.remount_with_report_at(client_id, info, host, objects, Instant::now())
    }

    pub(super) fn remount_with_report_at(
        &self,
        client_id: &str,
        info: &SegmentInfo,
        host: &str,
        objects: &[OwnedObject],
        now: Instant,
    ) -> Result<Rebuilt> {
        let mut st = self.lock_all();
        self.fence.check(now)?;
        // Whatever this master had of the segment from this client is stale: the report is
        // the truth now.
        if let Some(&id) = st.segment_by_name.get(&info.name) {
            if st.segments[&id].client_id == client_id {
                self.emit_segment_gone(&st, id);
                Self::drop_segment(&mut st, id);
            }
        }
        let segment_id = self.mount_locked(&mut st, client_id, info, host, now)?;
        let mut out = Rebuilt { segment_id, ..Rebuilt::default() };
        for o in objects {
            if self.reinstate(&mut st, segment_id, o, now) {
                out.reinstated += 1;
            } else {
                out.refused += 1;
            }
        }
        self.flush_news(&mut st);
        drop(st);
        tracing::info!(
            "client {client_id} remounted segment {} as {segment_id} with a report: {} object(s) reinstated, {} refused",
            info.name,
            out.reinstated,
            out.refused
        );
        self.update_gauges();
        Ok(out)
    }

    /// One reported object: true when it is listed now.
    fn reinstate(&self, st: &mut super::Locked<'_>, segment_id: u64, o: &OwnedObject, now: Instant) -> bool {
        let valid = check_key(&o.key).is_ok() && o.size > 0 && o.size <= MAX_OBJECT_SIZE && o.version > 0;
        let block = if valid {
            st.segments.get_mut(&segment_id).expect("mounted").alloc.reserve(o.offset, o.size).ok()
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
        let stale = match st.objects.get(&o.key) {
            None => false,
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
            Self::free_replica(st, &o.key, o.version, segment_id, block, true, None);
            return false;
        }
        st.next_version = st.next_version.max(o.version.saturating_add(1));
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
