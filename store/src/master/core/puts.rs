//! The core of a put: the object record a started put makes, where its memory replicas are
//! as a client reads them, and which unfinished puts the sweep reclaims.

use std::time::{Duration, Instant};

use thin_vec::ThinVec;

use super::state::CoreState;
use crate::allocator::Block;
use crate::error::{Result, StoreError};
use crate::master::objects::{Checksum, Object, Replica, Stamp, Writer};
use crate::proto::{PutOptions, ReplicaDescriptor, ReplicaStatus};

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
