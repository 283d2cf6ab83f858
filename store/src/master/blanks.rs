//! Blanks: placements granted to a client ahead of its puts, without a key, so that a put is
//! a transfer and one call (`PutCommitBlank`) instead of `PutStart`, the transfer and `PutEnd`.
//!
//! * **Grant** (`GrantBlanks`, off the put's path): the master allocates a blank as it would a
//!   one-replica put of `value size` + [`RECORD_MAX`] bytes, gives it a new version (its id),
//!   and tells the holder's owner of it: a pending commit without a key (`blank`), which the
//!   owner may hold for the blank's time and the put timeout. The grant answers once the owner
//!   acknowledged, so every blank a client holds is known to its owner.
//! * **Commit**: the client writes the value at the blank's start and the record
//!   ([`crate::blank_record`]) behind it, in one transfer, then commits the key with the
//!   value's CRC-32. The master makes the object complete at once (version = the blank's id,
//!   its block the blank's) and answers; the owner learns of it behind, lazily, as a pending
//!   put's owner does. If the master goes before the owner learnt it, the owner reads the
//!   record and reports the object to the next master when the record names this blank and the
//!   value's bytes match its checksum; a record that is not whole (a put still being written,
//!   or never made) is dropped and its range held for its writer's time, as any pending
//!   commit's. A removal of the object waits for its owner's acknowledgement of the drop, as
//!   for any object its owner knew as pending, so no rebuilt master brings it back.
//! * **Bounds**: a client holds at most [`MasterConfig::blank_bytes_per_client`]; a blank not
//!   committed within [`MasterConfig::blank_ttl`] is taken back by the sweep (its range
//!   quarantined until the owner acknowledged the drop, as a removal's); a client that is
//!   dropped loses its blanks at once; a segment that goes takes its blanks with it; a blank is
//!   granted only where it leaves memory use below the eviction watermark by one eviction's
//!   share, so that blanks never make the evictor take objects (puts then start at the master
//!   and evict as usual). A commit on a blank that
//!   is gone, expired or another client's is [`StoreError::BlankGone`]: nothing was stored,
//!   and the client puts the usual way. A commit of a key that exists gives the blank back
//!   and answers [`StoreError::AlreadyExists`] once its owner acknowledged the drop.
//!
//! [`MasterConfig::blank_bytes_per_client`]: super::MasterConfig::blank_bytes_per_client
//! [`MasterConfig::blank_ttl`]: super::MasterConfig::blank_ttl

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::core::puts;
use super::owners::AckWait;
use super::{allocation, check_key, tenant, Master, State};
use crate::allocator::Block;
use crate::blank_record::RECORD_MAX;
use crate::error::{Result, StoreError};
use crate::proto::{OwnerNewsItem, PutOptions, ReplicaDescriptor, ReplicaStatus};
use crate::protocol::MAX_OBJECT_SIZE;

/// Most blanks one grant hands out.
pub const MAX_GRANT: u32 = 16;

/// A blank granted and not yet used.
#[derive(Debug)]
struct Blank {
    client_id: String,
    segment_id: u64,
    block: Block,
    value_size: u64,
    expires: Instant,
    /// The owner's news of it (its pending commit).
    news: u64,
}

/// The blanks granted, by id, and the bytes each client holds.
#[derive(Debug, Default)]
pub(super) struct Blanks {
    by_id: HashMap<u64, Blank>,
    held: HashMap<String, u64>,
}

impl Blanks {
    fn insert(&mut self, id: u64, blank: Blank) {
        *self.held.entry(blank.client_id.clone()).or_default() += blank.block.reserved;
        self.by_id.insert(id, blank);
    }

    fn take(&mut self, id: u64) -> Option<Blank> {
        let blank = self.by_id.remove(&id)?;
        if let Some(held) = self.held.get_mut(&blank.client_id) {
            *held = held.saturating_sub(blank.block.reserved);
            if *held == 0 {
                self.held.remove(&blank.client_id);
            }
        }
        Some(blank)
    }

    /// Bytes of blanks `client_id` holds.
    fn held_by(&self, client_id: &str) -> u64 {
        self.held.get(client_id).copied().unwrap_or(0)
    }

    /// A segment went, and its blanks' space with it.
    pub(super) fn forget_segment(&mut self, segment_id: u64) {
        let gone: Vec<u64> = self.by_id.iter().filter(|(_, b)| b.segment_id == segment_id).map(|(id, _)| *id).collect();
        for id in gone {
            self.take(id);
        }
    }

    /// Blanks granted and not used.
    pub(super) fn len(&self) -> usize {
        self.by_id.len()
    }
}

/// A blank granted: its id, where to write (`replica.size` is its capacity), and how long it
/// is the client's.
#[derive(Debug, Clone)]
pub struct Granted {
    /// The blank's id, the version of the object committed in it.
    pub id: u64,
    /// Where the value and its record go.
    pub replica: ReplicaDescriptor,
    /// From the grant, how long the blank is the client's.
    pub ttl: Duration,
}

impl Master {
    /// Grants `client_id` up to `count` blanks for values of `value_size` bytes (fewer where
    /// its bound, the space or the watermark says so; none with blanks off). The caller answers
    /// once the returned wait is over: the owners know the blanks then.
    pub fn grant_blanks(&self, client_id: &str, value_size: u64, count: u32) -> Result<(Vec<Granted>, AckWait)> {
        self.grant_blanks_at(client_id, value_size, count, Instant::now())
    }

    pub(super) fn grant_blanks_at(
        &self,
        client_id: &str,
        value_size: u64,
        count: u32,
        now: Instant,
    ) -> Result<(Vec<Granted>, AckWait)> {
        if value_size == 0 || value_size > MAX_OBJECT_SIZE {
            return Err(StoreError::InvalidArgument(format!(
                "blanks for values of {value_size} bytes: a value has 1 to {MAX_OBJECT_SIZE} bytes"
            )));
        }
        let ttl = self.config.blank_ttl;
        let mut st = self.state.lock();
        self.fence.check(now)?;
        // A client need not be known (a pure consumer mounts nothing): its blanks end with their
        // time, or at once when a known client is dropped.
        if ttl.is_zero() {
            return Ok((Vec::new(), AckWait::default()));
        }
        Self::release_ended_holds(&mut st, now);
        let capacity = value_size + RECORD_MAX;
        let tenant = tenant::tenant_of(client_id).to_string();
        // The owner may hold an unsettled blank for a new master as long as its writer may
        // still be writing it: its time, and a put's.
        let hold = ttl + self.config.put_timeout;
        let (mut granted, mut news) = (Vec::new(), Vec::new());
        // Memory use may rise to one eviction's share below the watermark: blanks never make
        // the evictor take objects.
        let totals = st.core.totals();
        let below = self.config.eviction_high_watermark - self.config.eviction_ratio;
        let mut used = totals.used;
        for _ in 0..count.min(MAX_GRANT) {
            let room = (used + capacity) as f64 <= totals.capacity as f64 * below;
            if st.blanks.held_by(client_id) + capacity > self.config.blank_bytes_per_client || !room {
                break;
            }
            let opts = PutOptions::default();
            let Some(blocks) = allocation::allocate(&mut st.core, &*self.allocator, &tenant, capacity, 1, &opts) else {
                break;
            };
            let (segment_id, block) = blocks[0];
            let id = st.core.take_version();
            let Some(seq) = Self::queue_blank(&mut st, segment_id, block, id, capacity, hold) else {
                // No owner link (it went meanwhile): not a blank anyone could settle.
                if let Some(seg) = st.core.segments.get_mut(&segment_id) {
                    seg.alloc.release(block);
                }
                break;
            };
            let seg = &st.core.segments[&segment_id];
            let replica = ReplicaDescriptor {
                segment_name: seg.name.clone(),
                address: seg.base + block.offset,
                size: capacity,
                tier: seg.tier as i32,
                status: ReplicaStatus::Processing as i32,
                client_id: seg.client_id.clone(),
                host: seg.host.clone(),
                segment_id,
                disk_service: String::new(),
            };
            let expires = now + ttl;
            let blank = Blank { client_id: client_id.to_string(), segment_id, block, value_size, expires, news: seq };
            st.blanks.insert(id, blank);
            news.push((segment_id, seq));
            granted.push(Granted { id, replica, ttl });
            used += block.reserved;
        }
        self.flush_news(&mut st);
        let wait = Self::waits_for(&st, news);
        drop(st);
        if !granted.is_empty() {
            self.metrics.blanks_granted.inc_by(granted.len() as u64);
            self.update_gauges();
        }
        Ok((granted, wait))
    }

    /// Commits `client_id`'s put of `key` in blank `id`: `size` bytes at its start, of CRC-32
    /// `crc`. Returns the outcome and what the answer waits for (the owner's acknowledgement
    /// of the blank's drop, where the key exists).
    /// `opts` gives its pins (one replica, placed as the blank is).
    pub fn commit_blank(
        &self,
        client_id: &str,
        key: &str,
        id: u64,
        size: u64,
        crc: u32,
        opts: &PutOptions,
    ) -> (Result<()>, AckWait) {
        self.commit_blank_at(client_id, key, id, size, crc, opts, Instant::now())
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn commit_blank_at(
        &self,
        client_id: &str,
        key: &str,
        id: u64,
        size: u64,
        crc: u32,
        opts: &PutOptions,
        now: Instant,
    ) -> (Result<()>, AckWait) {
        let none = AckWait::default();
        if let Err(e) = check_key(key).and_then(|()| self.make_metadata_room(key, size, 1, now)) {
            return (Err(e), none);
        }
        if opts.replica_num > 1 || !opts.preferred_segment.is_empty() || !opts.preferred_segments.is_empty() {
            let e = "a put into a blank has one replica, where the blank is".to_string();
            return (Err(StoreError::InvalidArgument(e)), none);
        }
        let mut st = self.lock_key(key);
        if let Err(e) = self.fence.check(now) {
            return (Err(e), none);
        }
        match st.blanks.by_id.get(&id) {
            None => return (Err(StoreError::BlankGone(format!("blank {id} is not known to this master"))), none),
            Some(b) if b.client_id != client_id => {
                return (Err(StoreError::BlankGone(format!("blank {id} is another client's"))), none)
            }
            Some(b) if b.value_size != size => {
                let e = format!("blank {id} holds a value of {} bytes, not {size}", b.value_size);
                return (Err(StoreError::InvalidArgument(e)), none);
            }
            Some(_) => {}
        }
        let blank = st.blanks.take(id).expect("looked up above");
        let gone = if blank.expires <= now {
            Some(StoreError::BlankGone(format!("blank {id} expired")))
        } else if st.objects.contains_key(key) {
            Some(StoreError::AlreadyExists(key.to_string()))
        } else {
            None
        };
        if let Some(e) = gone {
            // Given back: its record may name `key`, so the answer waits until its owner
            // dropped it (no rebuilt master then takes the record for an object).
            let segment_id = blank.segment_id;
            Self::free_blank(&mut st, id, blank);
            self.flush_news(&mut st);
            let wait = Self::waits(&st, [segment_id]);
            return (Err(e), wait);
        }
        let soft_pin_until = puts::soft_pin_until(opts, self.config.default_soft_pin_ttl, now);
        let disk = Self::disk_of_client(&st, client_id);
        let writer = Some(st.core.names.writer(client_id, disk.as_deref()));
        let mut object = puts::new_object(
            size,
            id,
            vec![(blank.segment_id, blank.block)],
            writer,
            opts,
            soft_pin_until,
            Some(crc),
            now,
        );
        object.replicas[0].set_news(Some(blank.news));
        if let Some(seg) = st.core.segments.get_mut(&blank.segment_id) {
            seg.load.puts.record(now);
        }
        st.objects.insert(key.to_string(), object);
        st.window.put_started(key, id, opts.replace, now);
        let commit = super::Commit { key: key.to_string(), version: id, wait: AckWait::default(), pending: true };
        let done = self.finish_commit(&mut st, &commit, now);
        self.flush_news(&mut st);
        drop(st);
        if done.is_ok() {
            self.metrics.blanks_committed.inc();
            self.metrics.puts.inc();
            self.metrics.mooncake.value_size.observe(size as f64);
        }
        self.update_gauges();
        (done, none)
    }

    /// Takes back the blanks whose time ran out (the sweep).
    pub(super) fn expire_blanks(st: &mut State, now: Instant) -> usize {
        let expired: Vec<u64> = st.blanks.by_id.iter().filter(|(_, b)| b.expires <= now).map(|(id, _)| *id).collect();
        for &id in &expired {
            let blank = st.blanks.take(id).expect("listed above");
            Self::free_blank(st, id, blank);
        }
        expired.len()
    }

    /// Blanks granted and not used yet.
    pub fn blanks_held(&self) -> usize {
        self.state.lock().blanks.len()
    }

    /// Takes back every blank of `client_id` (dropped).
    pub(super) fn release_blanks_of(st: &mut State, client_id: &str) {
        let ids: Vec<u64> =
            st.blanks.by_id.iter().filter(|(_, b)| b.client_id == client_id).map(|(id, _)| *id).collect();
        for id in ids {
            let blank = st.blanks.take(id).expect("listed above");
            Self::free_blank(st, id, blank);
        }
    }

    /// Tells a blank's owner of it (a pending commit without a key); returns the news' seq.
    fn queue_blank(
        st: &mut State,
        segment_id: u64,
        block: Block,
        id: u64,
        capacity: u64,
        hold: Duration,
    ) -> Option<u64> {
        let item = OwnerNewsItem {
            commit: true,
            pending: true,
            blank: true,
            version: id,
            segment_id,
            offset: block.offset,
            size: capacity,
            hold_ms: u64::try_from(hold.as_millis()).unwrap_or(u64::MAX).max(1),
            ..Default::default()
        };
        Self::push_news(st, segment_id, item)
    }

    /// A blank given back: its owner told, its range quarantined until it acknowledged.
    fn free_blank(st: &mut State, id: u64, blank: Blank) {
        if !st.core.segments.contains_key(&blank.segment_id) {
            return;
        }
        let item = OwnerNewsItem {
            commit: false,
            blank: true,
            version: id,
            segment_id: blank.segment_id,
            offset: blank.block.offset,
            size: blank.block.reserved,
            ..Default::default()
        };
        match Self::push_news(st, blank.segment_id, item) {
            Some(seq) => Self::quarantine(st, blank.segment_id, seq, blank.block),
            None => st.core.segments.get_mut(&blank.segment_id).expect("checked above").alloc.release(blank.block),
        }
    }
}
