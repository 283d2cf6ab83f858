//! Owners hold the truth about their segments; the master is a rebuildable cache of them.
//!
//! Each mounted memory segment has an *owner link*: the ordered news the master sends the
//! segment's client about the objects placed in it — "commit" (the object is now visible with
//! a replica here, at this offset) and "drop" (it is gone) — numbered from 1 per mount, sent on
//! the client's `OwnerStream` and acknowledged cumulatively. The client keeps what it learns in
//! its owner index, which it reports to a new master ([`super::rebuild`]). Therefore:
//!
//! * A put is acknowledged to its writer only once the owners of its replicas acknowledged
//!   news of it ([`Master::put_end_begin`] / [`Master::put_end_finish`]); a replica whose owner
//!   does not acknowledge in time is not committed there, and with none left the put fails
//!   with [`StoreError::OwnersUnreachable`]. A put whose writer took the value's CRC-32 before
//!   it started ([`Master::put_start_checked`]) tells its owners at the start: a *pending*
//!   commit (key, version, range, checksum, and the put timeout), acknowledged while the bytes
//!   move. Its end then needs no further word from them (it waits only for that
//!   acknowledgement, in by then as a rule), commits, answers, and queues a *complete* commit
//!   behind, not waited for and sent lazily: with the link's next news, or within
//!   [`LAZY_NEWS_DELAY`]. Until the owner applied that, its index holds the object as
//!   pending; reporting to a new master, it checks the range's bytes against the checksum: an
//!   object whose bytes match was written whole (its put may have been answered OK) and is
//!   reported; one whose bytes do not cannot have been answered OK (the end comes after the
//!   transfer) and is dropped, its range held out of reuse until the put timeout (its writer
//!   may still be copying). A put written whole whose end never came is thus kept by a new
//!   master: the same as a put whose answer was lost. A put without a checksum (an older
//!   client, a put session, a value above the client's bound) is told only at its end, and
//!   the end waits for that acknowledgement, as before. A revoked (or reclaimed, or refused)
//!   pending put is dropped like a removal, and the revoke's answer waits for the drop's
//!   acknowledgement.
//! * A replica that goes (removal, eviction, a refused report) is invisible at once, but its
//!   range stays *quarantined* — not reallocated — until its owner acknowledged the drop: a
//!   master rebuilt from that owner's index could otherwise believe in a range that was reused.
//!   A segment that goes takes its quarantine with it.
//! * News not acknowledged are sent again when the owner's stream reconnects. An owner that
//!   lets more than [`MAX_UNACKED_NEWS`] pile up loses its link: its index cannot be trusted,
//!   so its next ping says `NEED_REMOUNT` under the same term and it starts afresh.
//!
//! News carry the master's term; an owner applies only news of the term it mounted under.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};

use super::{Master, State};
use crate::allocator::Block;
use crate::error::{Result, StoreError};
use crate::proto::{OwnerNews, OwnerNewsItem, Tier};

/// Most news waiting for an owner's acknowledgement; beyond it the link is lost (see above).
pub const MAX_UNACKED_NEWS: usize = 1 << 20;

/// Longest a *complete* commit waits to go out with its link's next news (see the master's
/// `lazy_links`). Nothing waits for it: until its owner applies it, the owner's index holds the
/// object as pending, which a master rebuilt meanwhile keeps from its checksum.
pub const LAZY_NEWS_DELAY: Duration = Duration::from_millis(5);

pub(super) struct OwnerLink {
    client_id: String,
    last_seq: u64,
    acked: u64,
    /// Sent (or to send) and not acknowledged, oldest first.
    unacked: VecDeque<OwnerNewsItem>,
    /// Queued by the operation in progress; sent as one message when it ends.
    outbox: Vec<OwnerNewsItem>,
    /// The connected stream, if any: (its id, where its messages go).
    stream: Option<(u64, mpsc::UnboundedSender<OwnerNews>)>,
    acked_tx: watch::Sender<u64>,
    /// Ranges waiting for a drop's acknowledgement: (seq of the drop, block).
    quarantine: VecDeque<(u64, Block)>,
    broken: bool,
}

impl OwnerLink {
    fn new(client_id: &str) -> Self {
        OwnerLink {
            client_id: client_id.to_string(),
            last_seq: 0,
            acked: 0,
            unacked: VecDeque::new(),
            outbox: Vec::new(),
            stream: None,
            acked_tx: watch::channel(0).0,
            quarantine: VecDeque::new(),
            broken: false,
        }
    }

    pub fn is_broken(&self) -> bool {
        self.broken
    }

    pub fn quarantined_bytes(&self) -> u64 {
        self.quarantine.iter().map(|(_, b)| b.reserved).sum()
    }

    /// The news acknowledged so far (cumulative).
    pub(super) fn acked(&self) -> u64 {
        self.acked
    }
}

/// What a call waits for before it answers: owners' acknowledgements up to sequence numbers.
#[derive(Debug, Default)]
pub struct AckWait {
    owners: Vec<(u64, u64, watch::Receiver<u64>)>,
}

impl AckWait {
    /// True when there is nothing to wait for (no owner was sent news).
    pub fn is_empty(&self) -> bool {
        self.owners.is_empty()
    }

    /// Waits for `other`'s acknowledgements too.
    pub fn merge(&mut self, other: AckWait) {
        self.owners.extend(other.owners);
    }

    /// Waits until every owner acknowledged, or one is gone, or `timeout` passed.
    pub async fn wait(&mut self, timeout: Duration) {
        let deadline = tokio::time::Instant::now() + timeout;
        for (_, seq, rx) in &mut self.owners {
            let seq = *seq;
            // A closed channel (the segment went away) ends the wait for that owner.
            let _ = tokio::time::timeout_at(deadline, rx.wait_for(|a| *a >= seq)).await;
        }
    }

    /// The segments whose owners have not acknowledged (so far): an owner whose segment went
    /// away without acknowledging counts, since it may still report to a new master.
    pub fn unacked_segments(&self) -> Vec<u64> {
        self.owners.iter().filter(|(_, seq, rx)| *rx.borrow() < *seq).map(|(s, _, _)| *s).collect()
    }
}

/// The pins a commit news carries (the owner reports them to a new master).
#[derive(Clone, Copy)]
pub(super) struct Pins {
    pub hard: bool,
    pub soft_until: Option<Instant>,
}

/// The object a commit news is about.
pub(super) struct Announced<'a> {
    pub key: &'a str,
    pub version: u64,
    pub size: u64,
    pub pins: Pins,
    /// The object's checksum, for the owner to report back to a rebuilt master.
    pub checksum: super::objects::Checksum,
    /// A put still being written (a *pending* commit, sent at its start with the checksum its
    /// writer took before): how long the writer may still write the range (its put timeout).
    /// `None`: the object is committed.
    pub pending_for: Option<Duration>,
}

impl Master {
    /// A link for a memory segment just mounted.
    pub(super) fn open_link(st: &mut State, segment_id: u64, client_id: &str) {
        st.owners.insert(segment_id, OwnerLink::new(client_id));
    }

    pub(super) fn push_news(st: &mut State, segment_id: u64, mut item: OwnerNewsItem) -> Option<u64> {
        let link = st.owners.get_mut(&segment_id)?;
        link.last_seq += 1;
        item.seq = link.last_seq;
        if link.unacked.len() >= MAX_UNACKED_NEWS {
            link.unacked.pop_front();
            if !link.broken {
                tracing::warn!(
                    "client {} has not acknowledged {MAX_UNACKED_NEWS} news about segment {segment_id}: it must remount",
                    link.client_id
                );
            }
            link.broken = true;
        }
        link.unacked.push_back(item.clone());
        link.outbox.push(item);
        let links = if st.round_news {
            &mut st.round_links
        } else if st.lazy_news {
            &mut st.lazy_links
        } else {
            &mut st.dirty_links
        };
        if !links.contains(&segment_id) {
            links.push(segment_id);
        }
        Some(link.last_seq)
    }

    /// Tells a memory segment's owner that `key` is committed there; returns the news' seq.
    pub(super) fn queue_commit(
        st: &mut State,
        segment_id: u64,
        block: Block,
        obj: &Announced<'_>,
        now: Instant,
    ) -> Option<u64> {
        let Announced { key, version, size, pins, checksum, pending_for } = *obj;
        if st.core.segments.get(&segment_id).is_none_or(|s| s.tier == Tier::Ssd) {
            return None;
        }
        let soft_pin_ttl_ms = pins.soft_until.map_or(0, |t| t.saturating_duration_since(now).as_millis().max(1) as u64);
        let item = OwnerNewsItem {
            seq: 0,
            commit: true,
            key: key.to_string(),
            version,
            segment_id,
            offset: block.offset,
            size,
            hard_pin: pins.hard,
            soft_pin_ttl_ms,
            checksum: checksum.to_proto(),
            hold_ms: pending_for.map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)),
            pending: pending_for.is_some(),
            blank: false,
        };
        Self::push_news(st, segment_id, item)
    }

    /// `block` waits for the owner's acknowledgement of news `seq` (a drop) before its reuse.
    pub(super) fn quarantine(st: &mut State, segment_id: u64, seq: u64, block: Block) {
        if let Some(link) = st.owners.get_mut(&segment_id) {
            link.quarantine.push_back((seq, block));
        }
    }

    /// A replica goes: its owner is told, and its range waits for the acknowledgement (when the
    /// owner was told of it at all; otherwise it is free at once) and, with `hold`, until then:
    /// the end of a read lease still running on the object ([`super::lease_holds`]). Returns the
    /// bytes given up.
    pub(super) fn free_replica(
        st: &mut State,
        key: &str,
        version: u64,
        segment_id: u64,
        block: Block,
        announced: bool,
        hold: Option<Instant>,
    ) -> u64 {
        if !st.core.segments.contains_key(&segment_id) {
            return 0;
        }
        let seq = if announced {
            // With a read lease still running, the owner keeps the range's hold too, for a
            // new master to keep if this one goes before the lease ends (see `rebuild`).
            let hold_ms = hold.map_or(0, |until| {
                let left = until.saturating_duration_since(Instant::now());
                u64::try_from(left.as_millis()).unwrap_or(u64::MAX).max(1)
            });
            let item = OwnerNewsItem {
                seq: 0,
                commit: false,
                key: key.to_string(),
                version,
                segment_id,
                offset: block.offset,
                size: block.reserved,
                hold_ms,
                ..Default::default()
            };
            Self::push_news(st, segment_id, item)
        } else {
            None
        };
        match (seq, hold) {
            (seq, Some(until)) => st.holds.hold(segment_id, block, until, seq),
            (Some(seq), None) => {
                st.owners.get_mut(&segment_id).expect("pushed above").quarantine.push_back((seq, block))
            }
            (None, None) => st.core.segments.get_mut(&segment_id).expect("checked above").alloc.release(block),
        }
        if st.instant_acks {
            if let Some(seq) = seq {
                Self::apply_ack(st, segment_id, seq);
            }
        }
        block.reserved
    }

    /// Sends what the operation queued, one message per owner.
    pub(super) fn flush_news(&self, st: &mut State) {
        let links = std::mem::take(&mut st.dirty_links);
        self.flush_links(st, links);
    }

    /// Sends the drops the eviction round queued to the `turns` links that have waited longest
    /// (see [`super::EVICTION_NEWS_BATCH`]).
    pub(super) fn flush_round_news_share(&self, st: &mut State, turns: usize) {
        let links: Vec<u64> = st.round_links.drain(..turns.min(st.round_links.len())).collect();
        self.flush_links(st, links);
    }

    /// Sends what the operation queued and the drops the eviction round queued so far
    /// ([`super::EVICTION_NEWS_BATCH`]).
    pub(super) fn flush_round_news(&self, st: &mut State) {
        let mut links = std::mem::take(&mut st.round_links);
        links.extend(std::mem::take(&mut st.dirty_links));
        self.flush_links(st, links);
    }

    /// Whether a commit queued news in the lazy links with no [`Self::flush_lazy_news`]
    /// scheduled (the commit marked one scheduled, under the lock it held); true once: the
    /// caller then runs it within `LAZY_NEWS_DELAY`.
    pub fn lazy_news_unscheduled(&self) -> bool {
        self.lazy_due.swap(false, std::sync::atomic::Ordering::AcqRel)
    }

    /// Sends the news waiting in the lazy links (those another flush did not send already).
    pub fn flush_lazy_news(&self) {
        let mut st = self.state.lock();
        st.lazy_scheduled = false;
        let links = std::mem::take(&mut st.lazy_links);
        self.flush_links(&mut st, links);
    }

    fn flush_links(&self, st: &mut State, links: Vec<u64>) {
        let term = self.term();
        for segment_id in links {
            let instant = st.instant_acks;
            let Some(link) = st.owners.get_mut(&segment_id) else { continue };
            let items = std::mem::take(&mut link.outbox);
            if items.is_empty() {
                continue;
            }
            if instant {
                let last = link.last_seq;
                Self::apply_ack(st, segment_id, last);
                continue;
            }
            if let Some((_, tx)) = &link.stream {
                // A closed stream keeps the items unacknowledged: sent again on reconnect.
                let _ = tx.send(OwnerNews { term, items, tasks_waiting: false });
            }
        }
    }

    /// Tells `client_id` on its owner streams that replica tasks wait for it, so that it pings
    /// now and its ping reply hands them over, instead of at its next tick (a client that
    /// misses this, its stream being down, takes them at that tick).
    pub(super) fn nudge_owner(&self, client_id: &str) {
        let term = self.term();
        let st = self.state.lock();
        for link in st.owners.values().filter(|l| l.client_id == client_id && !l.broken) {
            if let Some((_, tx)) = &link.stream {
                let _ = tx.send(OwnerNews { term, items: Vec::new(), tasks_waiting: true });
            }
        }
    }

    /// What to wait for: each of these segments' owners acknowledging all news queued so far.
    pub(super) fn waits(st: &State, segments: impl IntoIterator<Item = u64>) -> AckWait {
        let mut w = AckWait::default();
        for id in segments {
            if w.owners.iter().any(|(s, _, _)| *s == id) {
                continue;
            }
            if let Some(link) = st.owners.get(&id).filter(|l| l.last_seq > l.acked) {
                w.owners.push((id, link.last_seq, link.acked_tx.subscribe()));
            }
        }
        w
    }

    /// What to wait for: each `(segment, seq)`'s owner acknowledging the news `seq` (those
    /// acknowledged already are left out: nothing to wait for when all are).
    pub(super) fn waits_for(st: &State, news: impl IntoIterator<Item = (u64, u64)>) -> AckWait {
        let mut w = AckWait::default();
        for (id, seq) in news {
            if let Some(link) = st.owners.get(&id).filter(|l| l.acked < seq) {
                match w.owners.iter_mut().find(|(s, _, _)| *s == id) {
                    Some(o) => o.1 = o.1.max(seq),
                    None => w.owners.push((id, seq, link.acked_tx.subscribe())),
                }
            }
        }
        w
    }

    pub(super) fn is_acked(st: &State, segment_id: u64, seq: u64) -> bool {
        st.owners.get(&segment_id).is_some_and(|l| l.acked >= seq)
    }

    /// Records an owner's acknowledgement up to `acked`: released quarantined ranges go back to
    /// the segment's allocator. Returns whether any did.
    fn apply_ack(st: &mut State, segment_id: u64, acked: u64) -> bool {
        let Some(link) = st.owners.get_mut(&segment_id) else { return false };
        let acked = acked.min(link.last_seq);
        if acked <= link.acked {
            return false;
        }
        link.acked = acked;
        while link.unacked.front().is_some_and(|i| i.seq <= acked) {
            link.unacked.pop_front();
        }
        let mut released = Vec::new();
        while link.quarantine.front().is_some_and(|(seq, _)| *seq <= acked) {
            released.push(link.quarantine.pop_front().expect("checked").1);
        }
        link.acked_tx.send_replace(acked);
        let freed = !released.is_empty();
        if let Some(seg) = st.core.segments.get_mut(&segment_id) {
            for b in released {
                seg.alloc.release(b);
            }
        }
        freed
    }

    /// An owner's acknowledgement (from its stream). Acks of another term or mount are ignored.
    pub fn owner_ack(&self, client_id: &str, term: u64, segment_id: u64, acked: u64) {
        if term != self.term() {
            return;
        }
        let mut st = self.state.lock();
        if st.owners.get(&segment_id).is_none_or(|l| l.client_id != client_id) {
            return;
        }
        if Self::apply_ack(&mut st, segment_id, acked) {
            self.space_freed.notify_waiters();
        }
    }

    /// An owner's stream connected, having applied news up to `acked`: the rest are sent again
    /// on it. Returns the stream's id (for [`Self::detach_owner`]).
    pub fn attach_owner(
        &self,
        client_id: &str,
        term: u64,
        segment_id: u64,
        acked: u64,
        tx: mpsc::UnboundedSender<OwnerNews>,
    ) -> Result<u64> {
        let now = Instant::now();
        let mut st = self.state.lock();
        self.fence.check(now)?;
        if term != self.term() {
            return Err(StoreError::MasterChanged(format!(
                "this master's term is {}, not {term}: mount again",
                self.term()
            )));
        }
        match st.owners.get(&segment_id) {
            Some(l) if l.client_id == client_id && !l.broken => {}
            _ => return Err(StoreError::NeedRemount),
        }
        if Self::apply_ack(&mut st, segment_id, acked) {
            self.space_freed.notify_waiters();
        }
        st.next_stream += 1;
        let id = st.next_stream;
        let link = st.owners.get_mut(&segment_id).expect("checked above");
        link.outbox.clear(); // everything in it is in `unacked`, sent now
        let items: Vec<OwnerNewsItem> = link.unacked.iter().cloned().collect();
        if !items.is_empty() {
            let _ = tx.send(OwnerNews { term, items, tasks_waiting: false });
        }
        link.stream = Some((id, tx));
        Ok(id)
    }

    /// The owner stream `stream` of `segment_id` ended: news wait for the next one (nothing is
    /// detached when another stream took its place meanwhile).
    pub fn detach_owner(&self, segment_id: u64, stream: u64) {
        let mut st = self.state.lock();
        if let Some(link) = st.owners.get_mut(&segment_id) {
            if link.stream.as_ref().is_some_and(|(id, _)| *id == stream) {
                link.stream = None;
            }
        }
    }

    /// Whether any of this client's links is lost (it must remount and start afresh).
    pub(super) fn link_broken(st: &State, client_id: &str) -> bool {
        st.core
            .clients
            .get(client_id)
            .is_some_and(|c| c.segments.iter().any(|s| st.owners.get(s).is_some_and(|l| l.is_broken())))
    }

    /// Bytes waiting in quarantine (for their owners' acknowledgements, or for read leases to
    /// end: see the master's `lease_holds` module), all segments together.
    pub fn quarantined_bytes(&self) -> u64 {
        let st = self.state.lock();
        st.owners.values().map(|l| l.quarantined_bytes()).sum::<u64>() + st.holds.bytes()
    }

    /// Runs `f` (a call that may need quarantined space) and, while it fails for lack of space
    /// with ranges in quarantine, waits for owners' acknowledgements or the end of the soonest
    /// read lease holding a range, and runs it again, for at most `owner_ack_timeout`.
    pub async fn retry_after_quarantine<T>(&self, mut f: impl FnMut() -> Result<T>) -> Result<T> {
        let deadline = tokio::time::Instant::now() + self.config.owner_ack_timeout;
        loop {
            let freed = self.space_freed.notified();
            match f() {
                Err(StoreError::NoSpace { .. })
                    if self.quarantined_bytes() > 0 && tokio::time::Instant::now() < deadline =>
                {
                    let lease_end = self.state.lock().holds.next_end().map(tokio::time::Instant::from_std);
                    let wake = lease_end.map_or(deadline, |t| t.min(deadline));
                    let _ = tokio::time::timeout_at(wake, freed).await;
                }
                r => return r,
            }
        }
    }
}

#[cfg(test)]
mod tests;
