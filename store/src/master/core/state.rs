//! The core's state: the mounted segments with their allocators, the clients that mounted
//! them, the version counter and the eviction round under way, with the functions over them
//! that need no lock, channel or clock of their own (the caller passes `now`).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use super::limits::MIN_SEGMENT_SIZE;
use super::load::Load;
use super::views::{SegmentView, Totals};
use crate::allocator::SegmentAllocator;
use crate::error::{Result, StoreError};
use crate::master::objects::Names;
use crate::proto::{SegmentInfo, Tier};
use crate::protocol::MAX_OBJECT_SIZE;

/// One mounted segment: a client's memory (or disk) contributed to the pool.
pub(crate) struct Segment {
    pub(crate) name: String,
    pub(crate) client_id: String,
    pub(crate) host: String,
    pub(crate) base: u64,
    pub(crate) tier: Tier,
    pub(crate) alloc: SegmentAllocator,
    /// Recent gets and puts touching this segment (per-node load for schedulers).
    pub(crate) load: Load,
    /// Tier SSD: where the owner serves its files (`host:port`); empty for memory.
    pub(crate) disk_service: String,
}

/// One client that mounted segments.
pub(crate) struct Client {
    pub(crate) last_ping: Instant,
    pub(crate) segments: HashSet<u64>,
    /// The `held_generation` of the removals this client last got, and when.
    pub(crate) held_sent: u64,
    pub(crate) held_sent_at: Option<Instant>,
}

impl Client {
    /// A client first heard of at `now`, with no segment yet.
    pub(crate) fn new(now: Instant) -> Client {
        Client { last_ping: now, segments: HashSet::new(), held_sent: 0, held_sent_at: None }
    }
}

/// An eviction round: what it set out to free, and what it freed so far.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Round {
    pub(crate) target: u64,
    pub(crate) freed: u64,
    pub(crate) count: u64,
    /// Sends owed to the round's links, in objects x links: a step adds its objects times the
    /// links waiting, and each [`super::rounds::EVICTION_NEWS_BATCH`] of it is one link's turn.
    pub(crate) owed: u64,
}

/// Segments, clients, versions and the eviction round: the part of the master's global state
/// that the core keeps (the owner links, the disk tier's records and the other bookkeeping
/// stand beside it, in the master's state).
#[derive(Default)]
pub(crate) struct CoreState {
    pub(crate) segments: HashMap<u64, Segment>,
    pub(crate) segment_by_name: HashMap<String, u64>,
    /// The writers (client ids and their disks) objects refer to, shared ([`Names`]).
    pub(crate) names: Names,
    pub(crate) clients: HashMap<String, Client>,
    pub(crate) next_segment: u64,
    pub(crate) next_version: u64,
    /// The first version this master handed out (its start time in nanoseconds): a version
    /// below it was handed out by an earlier master, before a restart.
    pub(crate) version_floor: u64,
    /// The eviction round under way, if any.
    pub(crate) round: Option<Round>,
    /// A put found no room since the last round began: the next step starts a round even
    /// below the high watermark.
    pub(crate) pressure: bool,
}

impl CoreState {
    /// An empty core whose versions start at `first_version`.
    pub(crate) fn fresh(first_version: u64) -> CoreState {
        CoreState { next_segment: 1, next_version: first_version, version_floor: first_version, ..Self::default() }
    }

    /// A new version for an object.
    pub(crate) fn take_version(&mut self) -> u64 {
        let v = self.next_version;
        self.next_version += 1;
        v
    }

    /// A mount of `info` by `client_id` again: the segment's id when it is the same mount, or
    /// [`StoreError::SegmentExists`] when its name is taken otherwise; `None` when it is free.
    pub(crate) fn mounted_again(&self, client_id: &str, info: &SegmentInfo) -> Option<Result<u64>> {
        let &id = self.segment_by_name.get(&info.name)?;
        let seg = &self.segments[&id];
        if seg.client_id == client_id && seg.base == info.base && seg.alloc.capacity() <= info.size {
            return Some(Ok(id));
        }
        Some(Err(StoreError::SegmentExists(info.name.clone())))
    }

    /// Adds a segment whose name is free, of a client heard of at `now` (added if new): its
    /// id and tier.
    pub(crate) fn add_segment(
        &mut self,
        client_id: &str,
        info: &SegmentInfo,
        host: &str,
        now: Instant,
    ) -> Result<(u64, Tier)> {
        if client_id.is_empty() || info.name.is_empty() {
            return Err(StoreError::InvalidArgument("mount needs a client id and a segment name".into()));
        }
        if info.size < MIN_SEGMENT_SIZE
            || info.size > MAX_OBJECT_SIZE * 64
            || info.base.checked_add(info.size).is_none()
        {
            return Err(StoreError::InvalidArgument(format!(
                "segment size {} at {:#x} is not valid (at least {MIN_SEGMENT_SIZE} bytes, within the address space)",
                info.size, info.base
            )));
        }
        if self.segment_by_name.contains_key(&info.name) {
            return Err(StoreError::SegmentExists(info.name.clone()));
        }
        let id = self.next_segment;
        self.next_segment += 1;
        let tier = Tier::try_from(info.tier).ok().filter(|t| *t != Tier::Unspecified).unwrap_or(Tier::Dram);
        self.segments.insert(
            id,
            Segment {
                name: info.name.clone(),
                client_id: client_id.to_string(),
                host: host.to_string(),
                base: info.base,
                tier,
                alloc: SegmentAllocator::new(info.size),
                load: Load::default(),
                disk_service: String::new(),
            },
        );
        self.segment_by_name.insert(info.name.clone(), id);
        self.clients.entry(client_id.to_string()).or_insert_with(|| Client::new(now)).segments.insert(id);
        Ok((id, tier))
    }

    /// Removes a segment's records (its name, its client's list); returns it.
    pub(crate) fn remove_segment(&mut self, segment_id: u64) -> Option<Segment> {
        let seg = self.segments.remove(&segment_id)?;
        self.segment_by_name.remove(&seg.name);
        if let Some(c) = self.clients.get_mut(&seg.client_id) {
            c.segments.remove(&segment_id);
        }
        Some(seg)
    }

    /// A heartbeat of `client_id` at `now`: whether the client is known.
    pub(crate) fn ping(&mut self, client_id: &str, now: Instant) -> bool {
        match self.clients.get_mut(client_id) {
            Some(c) => {
                c.last_ping = now;
                true
            }
            None => false,
        }
    }

    /// Clients that have not pinged within `ttl` of `now`.
    pub(crate) fn silent_clients(&self, ttl: Duration, now: Instant) -> impl Iterator<Item = &str> + '_ {
        self.clients.iter().filter(move |(_, c)| now.saturating_duration_since(c.last_ping) > ttl).map(|(id, _)| &**id)
    }

    /// The memory segments of `tenant`'s clients.
    pub(crate) fn memory_segments_of(&self, tenant: &str) -> usize {
        self.segments
            .values()
            .filter(|s| s.tier != Tier::Ssd && crate::master::tenant::tenant_of(&s.client_id) == tenant)
            .count()
    }

    /// The totals of the memory segments and the clients (`keys` is the caller's to fill).
    pub(crate) fn totals(&self) -> Totals {
        let (capacity, used) = self
            .segments
            .values()
            .filter(|s| s.tier != Tier::Ssd)
            .fold((0, 0), |(c, u), s| (c + s.alloc.capacity(), u + s.alloc.reserved()));
        Totals { capacity, used, keys: 0, segments: self.segments.len() as u64, clients: self.clients.len() as u64 }
    }

    /// Whether memory use is above `fraction` of the capacity (never, with no capacity).
    pub(crate) fn used_above(&self, fraction: f64) -> bool {
        let totals = self.totals();
        totals.capacity > 0 && totals.used as f64 > totals.capacity as f64 * fraction
    }

    /// What an eviction round sets out to free: `ratio` of the memory capacity.
    pub(crate) fn eviction_target(&self, ratio: f64) -> u64 {
        (self.totals().capacity as f64 * ratio) as u64
    }

    /// Every mounted segment, by id.
    pub(crate) fn segment_views(&self) -> Vec<SegmentView> {
        let mut v: Vec<SegmentView> = self
            .segments
            .iter()
            .map(|(id, s)| SegmentView {
                id: *id,
                name: s.name.clone(),
                client_id: s.client_id.clone(),
                host: s.host.clone(),
                tier: s.tier.as_str_name().to_string(),
                capacity: s.alloc.capacity(),
                used: s.alloc.reserved(),
            })
            .collect();
        v.sort_by_key(|s| s.id);
        v
    }
}
