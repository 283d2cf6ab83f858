//! The core of a put: the object record a started put makes, where its memory replicas are
//! as a client reads them, the checks of its commit and revocation, what its commit keeps,
//! and which unfinished puts the sweep reclaims.

use std::time::{Duration, Instant};

use smallvec::SmallVec;
use thin_vec::ThinVec;

use super::state::CoreState;
use crate::allocator::Block;
use crate::error::{Result, StoreError};
use crate::master::objects::{Checksum, Object, Replica, Stamp, Writer};
use crate::proto::{PutOptions, ReplicaDescriptor, ReplicaStatus};

/// How long a committed object whose file is being written is spared by eviction (see
/// `Object::offload_held_until`): far longer than a disk tier takes with a full queue.
pub const OFFLOAD_HOLD: Duration = Duration::from_secs(10);

/// Until when a put's object is soft-pinned: its own TTL, the default one for a bare
/// `soft_pin`, or never.
pub(crate) fn soft_pin_until(opts: &PutOptions, default_ttl: Duration, now: Instant) -> Option<Stamp> {
    let ttl = match (opts.soft_pin_ttl_ms, opts.soft_pin) {
        (0, false) => None,
        (0, true) => Some(default_ttl),
        (ms, _) => Some(Duration::from_millis(ms)),
    };
    ttl.map(|ttl| Stamp::of(now + ttl))
}

/// What a put started at `now` records: its blocks, unfinished, with the checksum its owners
/// are told with a pending commit (`crc`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn new_object(
    size: u64,
    version: u64,
    blocks: Vec<(u64, Block)>,
    writer: Option<std::sync::Arc<Writer>>,
    opts: &PutOptions,
    soft_pin_until: Option<Stamp>,
    crc: Option<u32>,
    now: Instant,
) -> Object {
    Object {
        size,
        version,
        replicas: blocks.into_iter().map(|(segment_id, block)| Replica::new(segment_id, block, None)).collect(),
        ssd: ThinVec::new(),
        complete: false,
        writer,
        started: Stamp::of(now),
        lease_until: None,
        soft_pin_until,
        hard_pin: opts.hard_pin,
        offload_held_until: None,
        // Until the commit: the checksum the owners were told with the pending commit.
        checksum: Checksum::new(crc),
    }
}

/// The memory replicas of `obj` whose segments are mounted, as a client reads them.
pub(crate) fn describe_memory<'a>(
    core: &'a CoreState,
    obj: &'a Object,
) -> impl Iterator<Item = ReplicaDescriptor> + 'a {
    obj.replicas.iter().filter_map(move |r| {
        let seg = core.segments.get(&r.segment_id)?;
        Some(ReplicaDescriptor {
            segment_name: seg.name.clone(),
            address: seg.base + r.block.offset,
            size: obj.size,
            tier: seg.tier as i32,
            status: if obj.complete { ReplicaStatus::Complete } else { ReplicaStatus::Processing } as i32,
            client_id: seg.client_id.clone(),
            host: seg.host.clone(),
            segment_id: r.segment_id,
            disk_service: String::new(),
        })
    })
}

/// Whether a put started at `started` outlived `put_timeout` at `now` (the sweep reclaims it).
pub(crate) fn put_timed_out(started: Instant, put_timeout: Duration, now: Instant) -> bool {
    now.saturating_duration_since(started) > put_timeout
}

/// Whether `client_id` may revoke its put of `key` (`obj`, if the key is known; `client_known`:
/// this master knows the client): only a put of its own not committed yet.
pub(crate) fn check_revoke(obj: Option<&Object>, client_known: bool, client_id: &str, key: &str) -> Result<()> {
    match obj {
        None if !client_known => {
            Err(StoreError::MasterChanged(format!("this master does not know the put of {key:?}")))
        }
        None => Err(StoreError::NotFound(key.to_string())),
        Some(o) if o.complete => {
            Err(StoreError::InvalidArgument(format!("object {key:?} is already committed; remove it instead")))
        }
        Some(o) if !o.written_by(client_id) => {
            Err(StoreError::InvalidArgument(format!("object {key:?} is being written by another client")))
        }
        Some(_) => Ok(()),
    }
}

/// Whether `client_id` may commit its put of `key` (`obj`, if the key is known; `client_known`:
/// this master knows the client): a put of its own, or one committed already (a commit made
/// again). Answers the object's version and whether it is committed already.
pub(crate) fn check_commit(
    obj: Option<&Object>,
    client_known: bool,
    client_id: &str,
    key: &str,
) -> Result<(u64, bool)> {
    let Some(obj) = obj else {
        return Err(if client_known {
            StoreError::NotFound(key.to_string())
        } else {
            StoreError::MasterChanged(format!("this master does not know the put of {key:?} nor its writer"))
        });
    };
    if !obj.written_by(client_id) && !obj.complete {
        return Err(StoreError::InvalidArgument(format!("object {key:?} is being written by another client")));
    }
    Ok((obj.version, obj.complete))
}

/// The error of a put of `key` whose value's checksum at its end (`end`) is not the one at its
/// start (`start`): the value changed while it was written. None when either was not taken.
pub(crate) fn checksum_changed(key: &str, start: Option<u32>, end: Option<u32>) -> Option<StoreError> {
    let (Some(start), Some(end)) = (start, end) else { return None };
    (start != end).then(|| {
        StoreError::InvalidArgument(format!(
            "the checksum of {key:?} at its end ({end:#010x}) is not the one at its start ({start:#010x}): \
             the value changed while it was written"
        ))
    })
}

/// Takes out of `obj` the replicas whose owners did not acknowledge the commit (`acked`, one
/// per replica, in order) and returns them; the others stay, in their order.
pub(crate) fn drop_unacked(obj: &mut Object, acked: &[bool]) -> SmallVec<[Replica; 1]> {
    let mut lost = SmallVec::new();
    if acked.iter().all(|a| *a) {
        // Every owner acknowledged (the usual case): the replicas stay where they are.
        return lost;
    }
    let all = std::mem::take(&mut obj.replicas);
    for (r, ok) in all.into_iter().zip(acked) {
        if *ok {
            obj.replicas.push(r);
        } else {
            lost.push(r);
        }
    }
    lost
}

/// A put committed at `now`: when its writer's disk writes its file from memory, eviction
/// spares it for [`OFFLOAD_HOLD`].
pub(crate) fn hold_for_offload(obj: &mut Object, now: Instant) {
    if obj.offload_disk().is_some() {
        obj.offload_held_until = Some(Stamp::of(now + OFFLOAD_HOLD));
    }
}
