//! The master's side of the disk tier (tier SSD).
//!
//! A client with a storage root mounts a *disk segment*: a segment of tier SSD named
//! `ssd:<disk id>`, where the disk id is kept in the storage root and so survives restarts.
//! The master allocates nothing in it: the client writes its files itself and announces them
//! ([`Master::update_disk_replicas`]); the master records the disk as one more holder of the
//! object (`Object::ssd`). Readers get such replicas with tier `SSD` and the owner's disk
//! service address, and read them through the owner.
//!
//! * Eviction drops only memory replicas of an object that has a disk copy; the object stays
//!   readable from disk.
//! * Removing an object queues a removal for every disk that held it, keyed by the disk id
//!   (not the client), and hands it to the owner on its pings until the owner acknowledges
//!   the deletion — also across the owner's restart, whose re-announced files are checked
//!   against the queue. A disk segment has an owner link too ([`super::owners`]): the removal
//!   goes at once on the client's owner stream for the disk, the client deletes the file (or
//!   dooms the write of it in flight) before it acknowledges, and the removal is answered
//!   after that acknowledgement, as for a memory replica (so it needs no removal record).
//! * Versions start at the master's start time in nanoseconds, so a version names one put
//!   across master restarts, and a file announced after a master restart keeps its version.
//! * That first version is the master's *version floor*: a version below it was handed out
//!   by an earlier master. A fresh announcement (`restore` false) of a key the master does not
//!   know is a file whose object was removed while it was written only when this master
//!   handed its version out; one below the floor comes from a put made before a restart
//!   (committed to disk after its client remounted) and brings its object back, like a
//!   restored file. Telling the two apart needs no state that outlives the master: the
//!   version says which master made the put. (It assumes the wall clock does not go back
//!   across a restart by more than the old master's run; the client keeps its file when a
//!   refusal may come from a master that never knew the put, see `client::disk::announce`.)

use std::collections::{BTreeMap, HashMap};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use smallvec::SmallVec;

use super::{check_key, Client, DiskTotals, Master, Object, Segment, State};
use crate::allocator::SegmentAllocator;
use crate::error::{Result, StoreError};
use crate::proto::{DiskCounters, DiskEntry, HeldRemoval, OwnerNewsItem, ReplicaDescriptor, ReplicaStatus, Tier};
use crate::protocol::disk_segment_name;

/// Most removals kept for one disk while it is away; beyond it the oldest (first queued) are
/// forgotten, one per new removal (their files may then come back when that disk returns).
pub const MAX_PENDING_REMOVALS: usize = 1 << 20;
/// Most removals handed out in one ping reply.
pub const REMOVALS_PER_PING: usize = 10_000;
/// Most removals handed to clients to keep for the master (beyond it, the newest are not
/// kept by clients and do not outlive a master restart).
pub const MAX_HELD_REMOVALS: usize = 65_536;
/// Most often a client is sent a changed set of removals to keep.
pub const HELD_REMOVALS_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// Most news of objects left only on disk kept for one disk between its owner's pings
/// (hints: beyond it the oldest are forgotten).
pub const MAX_DISK_ONLY_NEWS: usize = 4096;

/// The first version a master hands out: its start time in nanoseconds.
pub(super) fn first_version() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64).max(1)
}

/// The removals waiting for one disk: key → version, in the order they were queued, so that
/// the cap ([`MAX_PENDING_REMOVALS`]) forgets the oldest.
#[derive(Debug, Default)]
pub(super) struct PendingRemovals {
    /// Key → (version, place in `order`).
    by_key: HashMap<String, (u64, u64)>,
    /// Place → key, oldest first.
    order: BTreeMap<u64, String>,
    next: u64,
}

impl PendingRemovals {
    pub fn get(&self, key: &str) -> Option<u64> {
        self.by_key.get(key).map(|(v, _)| *v)
    }

    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    pub fn remove(&mut self, key: &str) -> Option<u64> {
        let (version, place) = self.by_key.remove(key)?;
        self.order.remove(&place);
        Some(version)
    }

    /// Queues the removal of `key` at `version` (or newer, when one is queued already) as the
    /// newest; with `cap` removals queued already, forgets the oldest first and returns it.
    /// Returns also whether the queued version of `key` changed.
    pub fn insert(&mut self, key: &str, version: u64, cap: usize) -> (Option<(String, u64)>, bool) {
        let old = self.remove(key);
        let mut forgotten = None;
        if old.is_none() && self.by_key.len() >= cap.max(1) {
            if let Some((_, oldest)) = self.order.pop_first() {
                forgotten = self.by_key.remove(&oldest).map(|(v, _)| (oldest, v));
            }
        }
        let version = old.map_or(version, |v| v.max(version));
        self.next += 1;
        self.order.insert(self.next, key.to_string());
        self.by_key.insert(key.to_string(), (version, self.next));
        (forgotten, old != Some(version))
    }

    /// (key, version), oldest first.
    pub fn iter(&self) -> impl Iterator<Item = (&str, u64)> + '_ {
        self.order.values().map(|k| (k.as_str(), self.by_key[k].0))
    }
}

impl Master {
    /// Mounts a client's disk tier that hears of removals on pings only (see
    /// [`Self::mount_disk_linked`]).
    pub fn mount_disk(
        &self,
        client_id: &str,
        disk_id: &str,
        disk_service: &str,
        capacity: u64,
        host: &str,
    ) -> Result<u64> {
        self.mount_disk_linked(client_id, disk_id, disk_service, capacity, host, false)
    }

    /// Mounts a client's disk tier. A disk that is still mounted by a previous process (the
    /// client restarted before the master noticed) is taken over: the storage root is locked
    /// by one process at a time, so the old mount is stale. With `owner_stream` (the client
    /// keeps an owner stream for the disk), the disk gets an owner link: removals go on it at
    /// once and are answered after its acknowledgement; without it (an older client), a link
    /// nobody acknowledges would only hold every removal up for `owner_ack_timeout`.
    pub fn mount_disk_linked(
        &self,
        client_id: &str,
        disk_id: &str,
        disk_service: &str,
        capacity: u64,
        host: &str,
        owner_stream: bool,
    ) -> Result<u64> {
        if client_id.is_empty() || disk_id.is_empty() || disk_id.len() > 256 || disk_service.is_empty() {
            return Err(StoreError::InvalidArgument(
                "mounting a disk needs a client id, a disk id and its service".into(),
            ));
        }
        if capacity == 0 {
            return Err(StoreError::InvalidArgument("disk capacity 0".into()));
        }
        let name = disk_segment_name(disk_id);
        let now = Instant::now();
        let mut st = self.lock_all();
        self.fence.check(now)?;
        if let Some(&id) = st.core.segment_by_name.get(&name) {
            let seg = &st.core.segments[&id];
            if seg.client_id == client_id && seg.disk_service == disk_service {
                match owner_stream {
                    true if !st.owners.contains_key(&id) => Self::open_link(&mut st, id, client_id),
                    true => {}
                    false => {
                        st.owners.remove(&id);
                    }
                }
                return Ok(id);
            }
            // A disk moves to another client of its tenant only ([`super::tenant`]).
            if seg.tier != Tier::Ssd || super::tenant::tenant_of(&seg.client_id) != super::tenant::tenant_of(client_id)
            {
                return Err(StoreError::SegmentExists(name));
            }
            tracing::info!("disk {disk_id} moves from client {} to client {client_id}", seg.client_id);
            Self::drop_segment(&mut st, id);
        }
        let id = st.core.next_segment;
        st.core.next_segment += 1;
        st.core.segments.insert(
            id,
            Segment {
                name: name.clone(),
                client_id: client_id.to_string(),
                host: host.to_string(),
                base: 0,
                tier: Tier::Ssd,
                alloc: SegmentAllocator::new(capacity),
                disk_service: disk_service.to_string(),
                load: super::query::Load::default(),
            },
        );
        st.core.segment_by_name.insert(name.clone(), id);
        st.core
            .clients
            .entry(client_id.to_string())
            .or_insert_with(|| Client {
                last_ping: now,
                segments: Default::default(),
                held_sent: 0,
                held_sent_at: None,
            })
            .segments
            .insert(id);
        if owner_stream {
            // Removals reach the disk on this link at once (and on pings, until acknowledged there).
            Self::open_link(&mut st, id, client_id);
        }
        tracing::info!("client {client_id} mounted disk {name} ({capacity} bytes, served at {disk_service}) as {id}");
        Ok(id)
    }

    /// Files a client wrote (`added`) or no longer has (`removed`, which also acknowledges
    /// queued removals). One result per added entry: `Ok` when the master now lists the disk
    /// as a holder; an error when the file is stale and the client must delete it.
    pub fn update_disk_replicas(
        &self,
        client_id: &str,
        segment_id: u64,
        added: &[DiskEntry],
        removed: &[DiskEntry],
        restore: bool,
    ) -> Result<Vec<Result<()>>> {
        let mut st = self.lock_all();
        self.fence.check(Instant::now())?;
        let disk_name = match st.core.segments.get(&segment_id) {
            Some(s) if s.client_id == client_id && s.tier == Tier::Ssd => s.name.clone(),
            Some(_) => {
                return Err(StoreError::InvalidArgument(format!(
                    "segment {segment_id} is not a disk of client {client_id}"
                )))
            }
            None => return Err(StoreError::SegmentNotFound(segment_id.to_string())),
        };
        for e in removed {
            if check_key(&e.key).is_err() {
                continue;
            }
            if let Some(pending) = st.disk_removals.get_mut(&disk_name) {
                if pending.get(&e.key).is_some_and(|v| v <= e.version) {
                    pending.remove(&e.key);
                    st.held_generation += 1;
                }
            }
            let gone = match st.objects.get_mut(&e.key) {
                Some(obj) if obj.version == e.version => {
                    obj.ssd.retain(|s| *s != segment_id);
                    obj.replicas.is_empty() && obj.ssd.is_empty()
                }
                _ => false,
            };
            if gone {
                st.objects.remove(&e.key);
            }
        }
        if st.disk_removals.get(&disk_name).is_some_and(|p| p.is_empty()) {
            st.disk_removals.remove(&disk_name);
        }
        let now = Instant::now();
        let results =
            added.iter().map(|e| Self::add_disk_copy(&mut st, &disk_name, segment_id, e, restore, now)).collect();
        drop(st);
        self.update_gauges();
        Ok(results)
    }

    fn add_disk_copy(
        st: &mut super::Locked<'_>,
        disk_name: &str,
        segment_id: u64,
        e: &DiskEntry,
        restore: bool,
        now: Instant,
    ) -> Result<()> {
        check_key(&e.key)?;
        if e.size == 0 || e.size > super::MAX_OBJECT_SIZE {
            return Err(StoreError::InvalidArgument(format!("object size {} of {:?}", e.size, e.key)));
        }
        if st.disk_removals.get(disk_name).and_then(|p| p.get(&e.key)).is_some_and(|v| v >= e.version) {
            return Err(StoreError::NotFound(e.key.clone())); // removed while the disk was away
        }
        if st.window.buried(&e.key, e.version, now) {
            return Err(StoreError::NotFound(e.key.clone())); // removed since this master took over
        }
        let floor = st.core.version_floor;
        match st.objects.get_mut(&e.key) {
            Some(obj) if obj.complete && obj.version == e.version && obj.size == e.size => {
                if !obj.ssd.contains(&segment_id) {
                    obj.ssd.push(segment_id);
                }
                obj.offload_held_until = None;
                Ok(())
            }
            Some(_) => Err(StoreError::AlreadyExists(e.key.clone())), // another version: the file is stale
            // A fresh file of an object this master handed the version out for, and that is
            // gone: removed (or lost with its holders) while its file was written.
            None if !restore && e.version >= floor => Err(StoreError::NotFound(e.key.clone())),
            None => {
                // The master lost the object (its holders went away), or never knew it: its
                // version is older than this master (a put made before a restart, whose file
                // was committed after its client remounted). The disk copy brings it back
                // under its own version. (A removal made before the restart refuses it above,
                // once handed back by the clients that keep removals.)
                st.core.next_version = st.core.next_version.max(e.version.saturating_add(1));
                st.objects.insert(
                    e.key.clone(),
                    Object {
                        size: e.size,
                        version: e.version,
                        replicas: Default::default(),
                        ssd: thin_vec::thin_vec![segment_id],
                        complete: true,
                        writer: None,
                        started: super::Stamp::of(now),
                        lease_until: None,
                        soft_pin_until: None,
                        hard_pin: false,
                        offload_held_until: None,
                        checksum: Default::default(),
                    },
                );
                Ok(())
            }
        }
    }

    /// The pending removals of every disk, for a client with a disk tier to keep, when its copy
    /// is older than the current set: (generation, set). `None` when it has nothing new to
    /// keep (or no disk to keep it on).
    pub fn held_removals_for(&self, client_id: &str) -> Option<(u64, Vec<HeldRemoval>)> {
        let mut st = self.state.lock();
        let generation = st.held_generation;
        let st = &mut *st;
        let client = st.core.clients.get_mut(client_id)?;
        let now = Instant::now();
        if client.held_sent == generation
            || client.held_sent_at.is_some_and(|t| now.duration_since(t) < HELD_REMOVALS_INTERVAL)
            || !client.segments.iter().any(|id| st.core.segments.get(id).is_some_and(|s| s.tier == Tier::Ssd))
        {
            return None;
        }
        client.held_sent = generation;
        client.held_sent_at = Some(now);
        let set = Self::pending_removals(st).take(MAX_HELD_REMOVALS).collect();
        Some((generation, set))
    }

    /// Every removal waiting for a disk, as (disk, key, version).
    pub(super) fn pending_removals(st: &State) -> impl Iterator<Item = HeldRemoval> + '_ {
        st.disk_removals.iter().flat_map(|(disk, pending)| {
            pending.iter().map(|(key, v)| HeldRemoval { disk: disk.clone(), key: key.to_string(), version: v })
        })
    }

    /// Removals a client kept for the master (handed back at its mount): queued again for
    /// their disks. An object the master knows at that version or older (brought back from a
    /// disk before this client returned, after a master restart) is removed again.
    pub fn merge_held_removals(&self, held: &[HeldRemoval]) {
        if held.is_empty() {
            return;
        }
        let mut st = self.lock_all();
        let (mut merged, mut forgotten) = (0, 0);
        for h in held {
            if h.disk.is_empty() || h.disk.len() > 300 || check_key(&h.key).is_err() {
                continue;
            }
            if st.objects.get(&h.key).is_some_and(|o| o.complete && o.version <= h.version) {
                Self::remove_object(&mut st, &h.key, Instant::now());
            }
            let cap = st.max_pending_removals;
            let pending = st.disk_removals.entry(h.disk.clone()).or_default();
            let (gone, changed) = pending.insert(&h.key, h.version, cap);
            forgotten += usize::from(gone.is_some());
            merged += usize::from(changed);
        }
        self.flush_news(&mut st);
        if merged > 0 {
            st.held_generation += 1;
            tracing::info!("{merged} disk removal(s) handed back by a client queued again");
        }
        if forgotten > 0 {
            let cap = st.max_pending_removals;
            tracing::warn!("{forgotten} disk removal(s) forgotten, the oldest of disks with {cap} pending");
        }
        drop(st);
        self.update_gauges();
    }

    /// Removals waiting for this client's disks (handed out on its pings until acknowledged).
    pub fn disk_removals_for(&self, client_id: &str) -> Vec<DiskEntry> {
        let st = self.state.lock();
        let Some(client) = st.core.clients.get(client_id) else { return Vec::new() };
        let mut out = Vec::new();
        for id in &client.segments {
            let Some(seg) = st.core.segments.get(id).filter(|s| s.tier == Tier::Ssd) else { continue };
            if let Some(pending) = st.disk_removals.get(&seg.name) {
                out.extend(
                    pending.iter().take(REMOVALS_PER_PING - out.len().min(REMOVALS_PER_PING)).map(|(k, v)| DiskEntry {
                        key: k.to_string(),
                        size: 0,
                        version: v,
                    }),
                );
            }
        }
        out
    }

    /// The name of the disk segment a client has mounted, if any.
    pub(super) fn disk_of_client(st: &State, client_id: &str) -> Option<String> {
        let client = st.core.clients.get(client_id)?;
        client
            .segments
            .iter()
            .filter_map(|id| st.core.segments.get(id))
            .find(|s| s.tier == Tier::Ssd)
            .map(|s| s.name.clone())
    }

    /// Queues the deletion of a removed object's disk copies: the disks that hold one, and
    /// the writer's disk, whose file may be written (or renamed and not yet announced) right
    /// now; that removal is acknowledged like any other once the file is gone or was never made.
    pub(super) fn queue_disk_removals(st: &mut State, key: &str, obj: &Object) {
        let mut names: Vec<String> =
            obj.ssd.iter().filter_map(|id| st.core.segments.get(id).map(|s| s.name.clone())).collect();
        if let Some(d) = obj.offload_disk() {
            if !names.iter().any(|n| n == d) {
                names.push(d.to_string());
            }
        }
        if !names.is_empty() {
            st.held_generation += 1;
        }
        let cap = st.max_pending_removals;
        for name in names {
            // Told at once on the disk's owner stream too, where its client keeps one.
            if let Some(&id) = st.core.segment_by_name.get(&name).filter(|id| st.owners.contains_key(id)) {
                let item = OwnerNewsItem {
                    commit: false,
                    key: key.to_string(),
                    version: obj.version,
                    segment_id: id,
                    ..Default::default()
                };
                Self::push_news(st, id, item);
            }
            let pending = st.disk_removals.entry(name.clone()).or_default();
            if let Some((oldest, _)) = pending.insert(key, obj.version, cap).0 {
                tracing::warn!("disk {name} has {cap} removals pending; forgetting the oldest, of {oldest:?}");
            }
        }
    }

    /// The disk segments holding (or maybe writing) a copy of `obj` whose clients keep an
    /// owner stream for them (a removal waits for their acknowledgement, as for memory), and
    /// whether another disk does (it hears of the removal on its client's next ping only).
    pub(super) fn disk_holders(st: &State, obj: &Object) -> (SmallVec<[u64; 2]>, bool) {
        let mut linked = SmallVec::new();
        let mut unlinked = false;
        let by_name = obj.offload_disk().and_then(|d| st.core.segment_by_name.get(d).copied());
        for id in obj.ssd.iter().copied().chain(by_name) {
            if linked.contains(&id) {
                continue;
            }
            if st.owners.contains_key(&id) {
                linked.push(id);
            } else {
                unlinked = true;
            }
        }
        // A writer's disk that is not mounted (yet) may still be writing its copy.
        unlinked |= obj.offload_disk().is_some() && by_name.is_none();
        (linked, unlinked)
    }

    /// Eviction: an object with a disk copy loses its memory replicas and stays; one without
    /// is removed. Returns the bytes of memory freed.
    pub(super) fn evict_memory_replicas(st: &mut super::Locked<'_>, key: &str, now: Instant) -> Option<u64> {
        let has_disk = !st.objects.get(key)?.ssd.is_empty();
        if !has_disk {
            return Self::remove_object(st, key, now);
        }
        let obj = st.objects.get_mut(key)?;
        let (version, replicas) = (obj.version, std::mem::take(&mut obj.replicas));
        let mut freed = 0;
        for r in replicas {
            freed += Self::free_replica(st, key, version, r.segment_id, r.block, r.news().is_some(), None);
        }
        Self::tell_disks_memory_is_gone(st, key);
        Some(freed)
    }

    /// `key` has no memory replica left: its disks' owners are told on their next ping, so
    /// that their gets of it read the file while they ask (see the client's early reads).
    pub(super) fn tell_disks_memory_is_gone(st: &mut super::Locked<'_>, key: &str) {
        let super::Locked { objects, g } = st;
        let disk_only_news = &mut g.disk_only_news;
        let Some(obj) = objects.get(key) else { return };
        for id in &obj.ssd {
            let news = disk_only_news.entry(*id).or_default();
            if news.len() >= MAX_DISK_ONLY_NEWS {
                news.pop_front();
            }
            news.push_back((key.to_string(), obj.version));
        }
    }

    /// The news for this client's disk since its last ping (handed out once: they are hints).
    pub fn disk_only_news_for(&self, client_id: &str) -> Vec<DiskEntry> {
        let mut st = self.state.lock();
        let Some(client) = st.core.clients.get(client_id) else { return Vec::new() };
        let disks: Vec<u64> = client.segments.iter().copied().collect();
        let mut out = Vec::new();
        for id in disks {
            if let Some(news) = st.disk_only_news.remove(&id) {
                out.extend(news.into_iter().map(|(key, version)| DiskEntry { key, size: 0, version }));
            }
        }
        out
    }

    pub(super) fn describe_disk_copies<'a>(
        st: &'a State,
        obj: &'a Object,
    ) -> impl Iterator<Item = ReplicaDescriptor> + 'a {
        obj.ssd.iter().filter_map(move |id| {
            let seg = st.core.segments.get(id)?;
            Some(ReplicaDescriptor {
                segment_name: seg.name.clone(),
                address: 0,
                size: obj.size,
                tier: Tier::Ssd as i32,
                status: if obj.complete { ReplicaStatus::Complete } else { ReplicaStatus::Processing } as i32,
                client_id: seg.client_id.clone(),
                host: seg.host.clone(),
                segment_id: *id,
                disk_service: seg.disk_service.clone(),
            })
        })
    }

    /// Totals of the disk tier (one pass over the objects: computed when metrics are scraped).
    pub fn disk_totals(&self) -> DiskTotals {
        let mut t = DiskTotals::default();
        {
            let st = self.state.lock();
            for s in st.core.segments.values().filter(|s| s.tier == Tier::Ssd) {
                t.segments += 1;
                t.capacity += s.alloc.capacity();
            }
            t.removals_pending = st.disk_removals.values().map(|p| p.len() as u64).sum();
        }
        // One shard at a time, without the global lock: calls on the other shards go on.
        for i in 0..super::SHARDS {
            for obj in self.shard(i).values().filter(|o| !o.ssd.is_empty()) {
                t.replicas += obj.ssd.len() as u64;
                t.used += obj.size * obj.ssd.len() as u64;
                if obj.replicas.is_empty() {
                    t.disk_only_keys += 1;
                }
            }
        }
        t
    }

    /// Keeps the disk counters a client reported on its ping (for its mounted disk).
    pub fn record_disk_counters(&self, client_id: &str, counters: &DiskCounters) {
        let mut st = self.state.lock();
        if let Some(name) = Self::disk_of_client(&st, client_id) {
            st.disk_counters.insert(name, *counters);
        }
    }

    /// The counters last reported for each mounted disk, by disk name.
    pub fn disk_counters(&self) -> Vec<(String, DiskCounters)> {
        let mut st = self.state.lock();
        let st = &mut *st;
        st.disk_counters.retain(|name, _| st.core.segment_by_name.contains_key(name));
        let mut v: Vec<_> = st.disk_counters.iter().map(|(k, c)| (k.clone(), *c)).collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// The Prometheus exposition, with the disk tier's gauges brought up to date.
    pub fn render_metrics(&self) -> String {
        self.metrics.set_disk(&self.disk_totals(), &self.disk_counters());
        let (role, term, _) = self.role_view();
        self.metrics.is_leader.set(i64::from(role == "single" || role == "leader"));
        self.metrics.term.set(term as i64);
        self.metrics.render()
    }

    /// Per disk: how many objects it holds (for the admin page and tests).
    pub fn disk_holdings(&self) -> HashMap<String, u64> {
        let mut by_id: HashMap<u64, u64> = HashMap::new();
        for i in 0..super::SHARDS {
            for obj in self.shard(i).values() {
                for id in &obj.ssd {
                    *by_id.entry(*id).or_default() += 1;
                }
            }
        }
        let st = self.state.lock();
        let mut out: HashMap<String, u64> = HashMap::new();
        for (id, n) in by_id {
            if let Some(seg) = st.core.segments.get(&id) {
                *out.entry(seg.name.clone()).or_default() += n;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::master::MasterConfig;
    use crate::proto::{PutOptions, SegmentInfo};

    /// A master past its rebuild window (these tests restore files of keys it removed itself,
    /// standing for a disk that missed the removal; in the window a tombstone refuses them).
    fn setup() -> (std::sync::Arc<Master>, u64) {
        let m = Master::new(MasterConfig::default()).unwrap();
        m.state.lock().window = crate::master::rebuild::Window::default();
        m.mount_segment("c1", &SegmentInfo { name: "mem".into(), base: 1 << 30, size: 4 << 20, tier: 0 }, "h").unwrap();
        let disk = m.mount_disk("c1", "d1", "h:1", 1 << 30, "h").unwrap();
        (m, disk)
    }

    fn put(m: &Master, key: &str, size: u64) -> u64 {
        let (_, v) = m.put_start("c1", key, size, &PutOptions::default()).unwrap();
        m.put_end("c1", key).unwrap();
        v
    }

    const FRESH: bool = false;
    const RESTORE: bool = true;

    fn entry(key: &str, size: u64, version: u64) -> DiskEntry {
        DiskEntry { key: key.into(), size, version }
    }

    #[test]
    fn eviction_keeps_objects_with_a_disk_copy_readable_from_the_disk() {
        let (m, disk) = setup();
        let v = put(&m, "a", 1 << 20);
        assert!(m.update_disk_replicas("c1", disk, &[entry("a", 1 << 20, v)], &[], FRESH).unwrap()[0].is_ok());
        put(&m, "b", 1 << 20);
        // Fill memory: "a" and "b" are the oldest; "a" keeps its disk copy, "b" goes.
        for i in 0..6 {
            put(&m, &format!("fill{i}"), 1 << 20);
        }
        assert!(!m.exists("b").unwrap());
        let list = m.get_replica_list("a").unwrap();
        assert_eq!(list.replicas.len(), 1);
        assert_eq!(list.replicas[0].tier, Tier::Ssd as i32);
        assert_eq!(list.replicas[0].disk_service, "h:1");
        assert_eq!(m.totals().capacity, 4 << 20, "disk capacity is not memory capacity");
        // The disk's owner hears, once, that its file of "a" is now the only copy.
        assert_eq!(m.disk_only_news_for("c1"), vec![entry("a", 0, v)]);
        assert!(m.disk_only_news_for("c1").is_empty());
    }

    #[test]
    fn a_disk_hears_when_the_client_holding_the_memory_replica_leaves() {
        let (m, disk) = setup();
        m.mount_segment("c2", &SegmentInfo { name: "mem2".into(), base: 1 << 40, size: 4 << 20, tier: 0 }, "h2")
            .unwrap();
        // c2 holds "k" in memory; c1's disk holds its file.
        let opts = PutOptions { preferred_segment: "mem2".into(), ..PutOptions::default() };
        let (replicas, v) = m.put_start("c2", "k", 1000, &opts).unwrap();
        assert_eq!(replicas[0].segment_name, "mem2");
        m.put_end("c2", "k").unwrap();
        assert!(m.update_disk_replicas("c1", disk, &[entry("k", 1000, v)], &[], FRESH).unwrap()[0].is_ok());
        assert!(m.disk_only_news_for("c1").is_empty(), "still in memory");
        let mem2 = m.query("k").unwrap().replicas[0].segment_id;
        m.unmount_segment("c2", mem2).unwrap();
        assert_eq!(m.disk_only_news_for("c1"), vec![entry("k", 0, v)]);
        assert!(m.disk_only_news_for("c2").is_empty(), "c2 has no disk");
    }

    #[test]
    fn objects_whose_file_is_not_written_yet_are_evicted_last() {
        let (m, disk) = setup();
        // "held" (put by c1, which has a disk) is the oldest; "plain" comes from a client
        // without a disk, so nothing is writing its file.
        put(&m, "held", 1 << 20);
        m.put_start("c2", "plain", 1 << 20, &PutOptions::default()).unwrap();
        m.put_end("c2", "plain").unwrap();
        let v2 = put(&m, "held2", 1 << 20);
        // Memory is full: the next put evicts one object, the one not being written to disk.
        put(&m, "next", 1 << 20);
        assert!(!m.exists("plain").unwrap(), "the object with no file in flight goes first");
        assert!(m.exists("held").unwrap() && m.exists("held2").unwrap());
        // Once its file is announced, "held2" is an ordinary candidate again, taken before the
        // older "held", whose file is still being written: "held2" loses its memory replica
        // and stays readable from the disk.
        assert!(m.update_disk_replicas("c1", disk, &[entry("held2", 1 << 20, v2)], &[], FRESH).unwrap()[0].is_ok());
        put(&m, "last", 1 << 20);
        let tiers = |key| m.query(key).unwrap().replicas.iter().map(|r| r.tier).collect::<Vec<_>>();
        assert_eq!(tiers("held"), [Tier::Dram as i32], "still spared while its file is written");
        assert_eq!(tiers("held2"), [Tier::Ssd as i32]);
    }

    #[test]
    fn stale_files_are_refused_and_lost_objects_come_back_from_disk() {
        let (m, disk) = setup();
        let v1 = put(&m, "k", 100);
        m.remove("k", true).unwrap();
        let v2 = put(&m, "k", 100);
        assert!(v2 > v1);
        let r = m.update_disk_replicas("c1", disk, &[entry("k", 100, v1), entry("k", 100, v2)], &[], FRESH).unwrap();
        assert!(r[0].is_err(), "an older version's file is stale");
        assert!(r[1].is_ok());
        // A fresh file of a key this master put and removed while it was written: refused.
        // (Put by a client without a disk, so that no removal is queued for this disk: the
        // version alone says the object is gone.)
        let (_, gone) = m.put_start("c2", "new", 7, &PutOptions::default()).unwrap();
        m.put_end("c2", "new").unwrap();
        m.remove("new", true).unwrap();
        assert!(m.state.lock().disk_removals.values().all(|p| p.get("new").is_none()));
        let r = m.update_disk_replicas("c1", disk, &[entry("new", 7, gone)], &[], FRESH).unwrap();
        assert!(r[0].is_err());
        assert!(!m.exists("new").unwrap());
        // A restored file of an unknown key (the master restarted) becomes an object.
        let r = m.update_disk_replicas("c1", disk, &[entry("new", 7, 12345)], &[], RESTORE).unwrap();
        assert!(r[0].is_ok());
        assert_eq!(m.query("new").unwrap().size, 7);
        let (_, v) = m.put_start("c1", "later", 1, &PutOptions::default()).unwrap();
        assert!(v > 12345);
        // Bad entries are refused one by one.
        let r = m.update_disk_replicas("c1", disk, &[entry("", 1, 1), entry("z", 0, 1)], &[], FRESH).unwrap();
        assert!(r.iter().all(|x| x.is_err()));
        assert!(m.update_disk_replicas("c2", disk, &[], &[], FRESH).is_err(), "another client's disk");
    }

    #[test]
    fn a_file_of_a_put_made_before_a_master_restart_is_not_taken_for_a_removed_one() {
        // The first master: "k" and "gone" are put with c1's disk mounted; "gone" is removed
        // while its file is written, and c1 keeps that removal (handed back at its mount).
        let (m1, _) = setup();
        let v = put(&m1, "k", 100);
        let v_gone = put(&m1, "gone", 100);
        m1.remove("gone", true).unwrap();
        let held: Vec<HeldRemoval> = Master::pending_removals(&m1.state.lock()).collect();
        assert_eq!(held, [HeldRemoval { disk: "ssd:d1".into(), key: "gone".into(), version: v_gone }]);
        drop(m1);
        // A new master (kill -9 and restart: it knows nothing); c1 remounts, hands the removal
        // back, and its files of "k" and "gone" are committed only now: fresh announcements.
        let (m2, disk) = setup();
        assert!(v < m2.state.lock().core.version_floor, "an earlier master's version");
        m2.merge_held_removals(&held);
        let r =
            m2.update_disk_replicas("c1", disk, &[entry("k", 100, v), entry("gone", 100, v_gone)], &[], FRESH).unwrap();
        assert!(r[0].is_ok(), "a put the master never knew of is not a removed one: {r:?}");
        assert!(r[1].is_err(), "a removal made before the restart still refuses its file");
        let list = m2.get_replica_list("k").unwrap();
        assert_eq!((list.version, list.replicas.len()), (v, 1));
        assert_eq!(list.replicas[0].tier, Tier::Ssd as i32);
        assert!(!m2.exists("gone").unwrap());
        // The new master's own puts keep newer versions than the restored one.
        assert!(put(&m2, "later", 100) > v);
    }

    #[test]
    fn removals_reach_the_disk_even_across_its_restart_until_acknowledged() {
        let (m, disk) = setup();
        let v = put(&m, "k", 10);
        m.update_disk_replicas("c1", disk, &[entry("k", 10, v)], &[], FRESH).unwrap();
        m.remove("k", false).unwrap();
        assert_eq!(m.disk_removals_for("c1").len(), 1);
        // The client restarts (new id) with the same disk before acknowledging.
        let disk2 = m.mount_disk("c9", "d1", "h:2", 1 << 30, "h").unwrap();
        assert_ne!(disk, disk2);
        let r = m.update_disk_replicas("c9", disk2, &[entry("k", 10, v)], &[], RESTORE).unwrap();
        assert!(r[0].is_err(), "a removed object does not come back");
        assert!(!m.exists("k").unwrap());
        assert_eq!(m.disk_removals_for("c9"), vec![entry("k", 0, v)]);
        m.update_disk_replicas("c9", disk2, &[], &[entry("k", 10, v)], false).unwrap();
        assert!(m.disk_removals_for("c9").is_empty(), "acknowledged");
    }

    #[test]
    fn a_disk_with_too_many_removals_pending_forgets_the_oldest() {
        let (m, disk) = setup();
        let cap = 8;
        m.state.lock().max_pending_removals = cap;
        let mut versions = Vec::new();
        for i in 0..40 {
            let key = format!("k{i}");
            let v = put(&m, &key, 10);
            m.update_disk_replicas("c1", disk, &[entry(&key, 10, v)], &[], FRESH).unwrap();
            versions.push(v);
        }
        // The disk's owner is deaf (never acknowledges): each removal past the cap forgets one.
        for i in 0..40usize {
            m.remove(&format!("k{i}"), false).unwrap();
            let pending = m.disk_removals_for("c1");
            let first = (i + 1).saturating_sub(cap);
            let want: Vec<DiskEntry> = (first..=i).map(|j| entry(&format!("k{j}"), 0, versions[j])).collect();
            assert_eq!(pending, want, "after removing k{i}: the newest {cap}, oldest first");
        }
        // A forgotten removal no longer refuses the file; a kept one still does.
        let r = m
            .update_disk_replicas(
                "c1",
                disk,
                &[entry("k0", 10, versions[0]), entry("k39", 10, versions[39])],
                &[],
                RESTORE,
            )
            .unwrap();
        assert!(r[0].is_ok() && r[1].is_err(), "{r:?}");
        // Removals handed back by a client go through the same cap.
        let held: Vec<HeldRemoval> =
            (0..3).map(|i| HeldRemoval { disk: "ssd:d1".into(), key: format!("h{i}"), version: 1 }).collect();
        m.merge_held_removals(&held);
        let keys: Vec<String> = m.disk_removals_for("c1").into_iter().map(|e| e.key).collect();
        assert_eq!(keys, ["k35", "k36", "k37", "k38", "k39", "h0", "h1", "h2"]);
    }

    #[test]
    fn a_disk_that_drops_its_file_leaves_no_dangling_replica() {
        let (m, disk) = setup();
        let v = put(&m, "k", 10);
        m.update_disk_replicas("c1", disk, &[entry("k", 10, v)], &[], FRESH).unwrap();
        m.remove("k", false).unwrap();
        m.update_disk_replicas("c1", disk, &[], &[entry("k", 10, v)], false).unwrap();
        // Disk-only object whose file is evicted: gone.
        let created = m.update_disk_replicas("c1", disk, &[entry("only", 10, 5)], &[], RESTORE).unwrap();
        assert!(created[0].is_ok());
        m.update_disk_replicas("c1", disk, &[], &[entry("only", 10, 5)], false).unwrap();
        assert!(!m.exists("only").unwrap());
        // Unmounting the disk drops its copies.
        let v = put(&m, "x", 10);
        m.update_disk_replicas("c1", disk, &[entry("x", 10, v)], &[], FRESH).unwrap();
        m.unmount_segment("c1", disk).unwrap();
        assert_eq!(m.get_replica_list("x").unwrap().replicas.len(), 1);
    }
}
