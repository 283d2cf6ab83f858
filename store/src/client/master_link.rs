//! The client's standing with the master: mounting (first, again after the master dropped
//! it, or with a report under a new master), heartbeats, and the owner stream that feeds the
//! [`OwnerIndex`].
//!
//! A ping answered `NEED_REMOUNT` carries the master's term. The same term as this client's
//! mount: that master dropped the client (silent past its TTL) and its objects — the index is
//! discarded and the segment mounted afresh. Another term: a new master (a restart, a
//! failover) — the segment is mounted again with the index as its report, and the new master
//! reinstates the objects. Then the disk tier re-announces its files, as at start.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::disk_link::DiskLink;
use super::owner_index::OwnerIndex;
use super::owner_stream::NewsStream;
use super::rpc::check;
use super::StoreClient;
use crate::blank_record::RECORD_MAX;
use crate::error::{Result, StoreError};
use crate::proto::*;

/// How a segment is mounted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum MountKind {
    /// At start.
    First,
    /// The master that knew this client dropped it: its objects are gone.
    Dropped,
    /// A new master: tell it what the segment holds.
    NewMaster,
}

/// What a ping learnt.
enum Pinged {
    Ok(PingReply),
    /// `NEED_REMOUNT`: [`StoreClient::remount`] tells a new master from the one that dropped us.
    Remount,
    Failed(StoreError),
}

/// Wakes the heartbeat early and tells waiters when the master answered a ping.
#[derive(Default)]
pub(super) struct Link {
    state: Mutex<LinkState>,
    cv: Condvar,
}

#[derive(Default)]
struct LinkState {
    poked: bool,
    /// Pings answered OK so far.
    ok_pings: u64,
}

impl Link {
    /// The next ping goes now.
    pub fn poke(&self) {
        self.state.lock().poked = true;
        self.cv.notify_all();
    }

    fn wait_tick(&self, interval: Duration) {
        let mut st = self.state.lock();
        if !st.poked {
            self.cv.wait_for(&mut st, interval);
        }
        st.poked = false;
    }

    fn ping_ok(&self) {
        self.state.lock().ok_pings += 1;
        self.cv.notify_all();
    }

    /// Pokes the heartbeat and waits until a ping is answered OK after now (the client is
    /// mounted at a master that answers), or `deadline`. Returns whether one was.
    pub fn wait_answered(&self, deadline: Instant) -> bool {
        let mut st = self.state.lock();
        let seen = st.ok_pings;
        st.poked = true;
        self.cv.notify_all();
        while st.ok_pings == seen {
            if self.cv.wait_until(&mut st, deadline).timed_out() {
                return st.ok_pings != seen;
            }
        }
        true
    }
}

impl StoreClient {
    pub(super) fn mount(&self, kind: MountKind) -> Result<()> {
        if kind != MountKind::First {
            return self.mount_once(kind);
        }
        // At start, a master may be electing a leader or just deposed: follow it a while.
        let deadline = Instant::now() + FIRST_MOUNT_WAIT;
        loop {
            match self.mount_once(kind) {
                Err(e) if e.is_master_change() && Instant::now() < deadline => {
                    tracing::debug!("mounting: {e}; looking for the leader");
                    if !self.rpc.follow_leader() {
                        std::thread::sleep(DOWN_PING);
                    }
                }
                r => return r,
            }
        }
    }

    fn mount_once(&self, kind: MountKind) -> Result<()> {
        // A pure consumer contributes no memory of its own at start: the master does not know
        // it (until it mounts an extra segment).
        if let Some(segment) = self.segment_info() {
            let memory = self.own_memory();
            let segment_id = self.mount_segment_info(kind, segment, &self.index, memory)?;
            self.segment_id.store(segment_id, Ordering::Release);
        }
        if kind != MountKind::First {
            self.remount_extras(kind)?;
        }
        Ok(())
    }

    /// Mounts `segment` at the master, as `kind` says, with `index` its owner index (`memory`,
    /// the segment's, settles its pending commits and blanks for a new master); returns its id.
    pub(super) fn mount_segment_info(
        &self,
        kind: MountKind,
        segment: SegmentInfo,
        index: &OwnerIndex,
        memory: Option<OwnMemory>,
    ) -> Result<u64> {
        let host = self.host();
        let name = segment.name.clone();
        let (term, segment_id) = match kind {
            MountKind::First | MountKind::Dropped => {
                if kind == MountKind::Dropped {
                    index.discard();
                }
                let req = MountSegmentRequest { client_id: self.id.clone(), segment: Some(segment), host };
                let reply = if kind == MountKind::Dropped {
                    self.rpc.call(|mut c| async move { c.remount_segment(req).await })?
                } else {
                    self.rpc.call(|mut c| async move { c.mount_segment(req).await })?
                };
                check(reply.status, "")?;
                index.mounted(reply.term, reply.segment_id, false);
                (reply.term, reply.segment_id)
            }
            MountKind::NewMaster => {
                index.unmount();
                let now = Instant::now();
                let holds = |offset, size, crc| memory.is_some_and(|m| m.holds(offset, size, crc));
                let settled = index.settle_blanks(now, |offset| memory.and_then(|m| m.record(offset)), holds);
                if settled > 0 {
                    tracing::info!("{settled} blank(s) of segment {name} hold a whole value: reported as objects");
                }
                let (objects, held) = (index.report(now, holds), index.held(now));
                let reported = objects.len();
                let req = RemountWithReportRequest {
                    client_id: self.id.clone(),
                    segment: Some(segment),
                    host,
                    objects,
                    held,
                };
                let reply = self.rpc.call(|mut c| async move { c.remount_with_report(req).await })?;
                check(reply.status, "")?;
                index.mounted(reply.term, reply.segment_id, true);
                tracing::info!(
                    "segment {name} mounted under the master's term {}: {reported} object(s) reported, {} reinstated, {} refused",
                    reply.term,
                    reply.reinstated,
                    reply.refused
                );
                (reply.term, reply.segment_id)
            }
        };
        tracing::debug!("segment {name} mounted as {segment_id} (term {term})");
        Ok(segment_id)
    }

    /// Our segment's memory, as its owner reads it to settle its index for a new master.
    fn own_memory(&self) -> Option<OwnMemory> {
        self.segment.as_ref().map(|segment| OwnMemory { addr: segment.addr(), len: segment.len() })
    }

    /// The address of the master this client talks to now (with an `etcd://` master address:
    /// the leader it follows).
    pub fn master_address(&self) -> String {
        self.rpc.addr()
    }

    pub(super) fn start_heartbeat(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        let stop = self.stop.clone();
        let link = self.link.clone();
        let interval = self.config.ping_interval;
        std::thread::Builder::new()
            .name("crescent-heartbeat".into())
            .spawn(move || {
                let mut master_was_down = false;
                // The first ping went at start (`learn_fast_rpc_port`): the next one an interval later.
                while !stop.load(Ordering::Acquire) {
                    // While the master is away, look for it (or a new leader) more often.
                    link.wait_tick(if master_was_down { interval.min(DOWN_PING) } else { interval });
                    let Some(client) = weak.upgrade() else { return };
                    if stop.load(Ordering::Acquire) {
                        return;
                    }
                    let tasks = client.heartbeat(&mut master_was_down);
                    if !tasks.is_empty() {
                        client.run_tasks(tasks);
                    }
                }
            })
            .expect("spawning the heartbeat thread");
    }

    /// One ping; returns the replica tasks its reply assigned to this client.
    fn heartbeat(&self, master_was_down: &mut bool) -> Vec<TaskAssignment> {
        self.extras.sweep(Instant::now());
        self.rpc.trim_fast_rpc();
        let disk = self.disk.as_ref().map(DiskLink::counters);
        let outcome = self.ping_with_term(disk).map(|(mut r, _)| match check(r.status.take(), "") {
            Ok(()) => Pinged::Ok(r),
            Err(StoreError::NeedRemount) => Pinged::Remount,
            Err(e) => Pinged::Failed(e),
        });
        let outcome = outcome.unwrap_or_else(Pinged::Failed);
        // Unreachable means no answer at all (gone, or frozen past the ping's timeout); a
        // master that answers, even with an error, is reachable.
        let unreachable =
            matches!(outcome, Pinged::Failed(StoreError::MasterUnreachable { .. } | StoreError::TimedOut { .. }));
        self.master_reachable.store(!unreachable, Ordering::Release);
        match outcome {
            Pinged::Ok(reply) => {
                if *master_was_down {
                    tracing::info!("master {} reachable again", self.rpc.addr());
                }
                *master_was_down = false;
                self.link.ping_ok();
                return self.took_ping(reply);
            }
            Pinged::Remount => {
                if let Err(e) = self.remount() {
                    tracing::warn!("remount failed: {e}");
                }
            }
            Pinged::Failed(e) => {
                if !*master_was_down {
                    tracing::warn!("heartbeat failed: {e}");
                }
                *master_was_down = true;
                // Gone, deposed or a standby: with an etcd address, another master may lead.
                if self.rpc.follow_leader() {
                    self.link.poke();
                }
            }
        }
        Vec::new()
    }

    /// One ping, at start, for the fast RPC port its reply names. A ping that fails is only a
    /// debug line (the caller's first call meets the same fault and reports it, a one-shot
    /// `crescent get` with a wrong secret included; the heartbeat warns an interval later if
    /// it holds); replica tasks it takes are run as the heartbeat's are.
    pub(super) fn learn_fast_rpc_port(self: &Arc<Self>) {
        match self.ping_with_term(None) {
            Ok((reply, _)) => {
                let tasks = self.took_ping(reply);
                if !tasks.is_empty() {
                    self.run_tasks(tasks);
                }
            }
            Err(e) => tracing::debug!("the first ping: {e}"),
        }
    }

    /// What every answered ping brings, whoever sent it (the heartbeat, or a removal that
    /// wants its disk copies gone now): the disk tier's news, applied; and the replica tasks
    /// the master assigned (it marked them running when it answered), returned to be run.
    pub(super) fn took_ping(&self, reply: PingReply) -> Vec<TaskAssignment> {
        if let Some(disk) = &self.disk {
            disk.apply_ping(&reply);
        }
        reply.tasks
    }

    /// A ping (with a short timeout: a master that accepts connections but does not answer,
    /// a frozen one, is noticed soon) and the term its reply carries.
    fn ping_with_term(&self, disk: Option<DiskCounters>) -> Result<(PingReply, u64)> {
        let mut req = tonic::Request::new(PingRequest { client_id: self.id.clone(), disk });
        req.set_timeout(self.config.ping_interval.clamp(PING_TIMEOUT_MIN, PING_TIMEOUT_MAX) * 2);
        let reply = self.rpc.call(|mut c| async move { c.ping(req).await })?;
        self.rpc.offer_fast_rpc(reply.fast_rpc_port);
        let term = reply.term;
        Ok((reply, term))
    }

    /// Mounts the segment (and the disk) again if the master dropped this client or a new
    /// master answers; returns whether it did. Once, however many threads found out at the
    /// same time (a second remount would drop what was put after the first).
    pub(super) fn remount(&self) -> Result<bool> {
        if !self.contributes() {
            return Ok(false);
        }
        let _one = self.remounting.lock();
        let (reply, term) = self.ping_with_term(None)?;
        match check(reply.status, "") {
            Err(StoreError::NeedRemount) => {}
            // Known to the master (remounted by another thread meanwhile), or it is not there.
            other => return other.map(|()| false),
        }
        // The term this client mounted under: its first segment's, else an extra one's.
        let mounted_term = std::iter::once(self.index.mount().term)
            .chain(self.extras.all().iter().map(|e| e.index.mount().term))
            .find(|t| *t != 0)
            .unwrap_or(0);
        let kind = if term != 0 && term == mounted_term {
            tracing::warn!(
                "the master dropped this client; remounting segment {} (its objects are gone)",
                self.segment_name()
            );
            MountKind::Dropped
        } else {
            tracing::warn!(
                "a new master (term {term}) answers; remounting segment {} with its {} object(s)",
                self.segment_name(),
                self.index.len()
            );
            MountKind::NewMaster
        };
        self.mount(kind)?;
        if let Some(disk) = &self.disk {
            disk.remount();
        }
        self.link.poke(); // confirm with a ping now
        Ok(true)
    }

    /// Keeps an owner stream open to the master for the current mount (a new one after each
    /// remount), applying its news to the index and acknowledging them.
    pub(super) fn start_owner_stream(self: &Arc<Self>) {
        self.start_owner_stream_of(&self.index);
    }

    /// [`Self::start_owner_stream`] for the segment whose owner index is `index`; it ends
    /// when the index or the client goes.
    pub(super) fn start_owner_stream_of(&self, index: &Arc<OwnerIndex>) {
        let weak = self.me.clone();
        self.rpc.handle().spawn(owner_stream(weak, Arc::downgrade(index)));
    }
}

/// A ping's timeout is twice the ping interval, within twice these.
const PING_TIMEOUT_MIN: Duration = Duration::from_millis(250);
const PING_TIMEOUT_MAX: Duration = Duration::from_secs(2);

/// How long the first mount keeps looking for a leader that answers.
const FIRST_MOUNT_WAIT: Duration = Duration::from_secs(15);

/// Ping period while the master does not answer.
const DOWN_PING: Duration = Duration::from_millis(100);

/// How often an open owner stream checks whether its mount is still the current one (and
/// whether a stream on gRPC can move to the master's fast port).
const MOUNT_CHECK: Duration = Duration::from_millis(100);
/// Pause before opening an owner stream again after it failed or closed.
const STREAM_RETRY: Duration = Duration::from_millis(50);

async fn owner_stream(weak: Weak<StoreClient>, index_of: Weak<OwnerIndex>) {
    // A fast port that refused a stream (a master that serves only calls there) is not
    // asked again; gRPC carries the stream.
    let mut refused = None;
    loop {
        let Some(client) = weak.upgrade() else { return };
        if client.stop.load(Ordering::Acquire) {
            return;
        }
        let Some(index) = index_of.upgrade() else { return };
        let (id, mut grpc) = (client.id.clone(), client.rpc.client());
        let fast = client.rpc.fast_rpc().filter(|f| Some(f.addr()) != refused);
        drop(client);
        let mount = index.mount();
        if mount.segment_id == 0 {
            tokio::time::sleep(STREAM_RETRY).await;
            continue;
        }
        match run_stream(&index, &id, &mut grpc, fast, &mut refused, &weak).await {
            // For the fast port, now advertised: at once.
            Ok(Ended::FastPortNow) => continue,
            Ok(Ended::Stale) => {}
            Err(e) => tracing::debug!("owner stream of segment {} (term {}): {e}", mount.segment_id, mount.term),
        }
        tokio::time::sleep(STREAM_RETRY).await;
    }
}

/// Why an owner stream ended without an error.
enum Ended {
    /// The mount changed, the client stops, or the news are of another mount.
    Stale,
    /// The stream ran over gRPC and the master's fast port is known now: open it there.
    FastPortNow,
}

/// One owner stream, until it fails or the mount changes: over the master's fast port
/// `fast`, if given and it takes the stream (else gRPC; a port that refused is left in
/// `refused`).
async fn run_stream(
    index: &Arc<OwnerIndex>,
    client_id: &str,
    grpc: &mut super::rpc::Client,
    fast: Option<Arc<super::fastrpc::FastRpc>>,
    refused: &mut Option<std::net::SocketAddr>,
    weak: &Weak<StoreClient>,
) -> std::result::Result<Ended, String> {
    let mount = index.mount();
    let ack =
        |acked| OwnerAck { client_id: client_id.to_string(), term: mount.term, acked, segment_id: mount.segment_id };
    let mut news = match fast {
        Some(fast) => {
            let port = fast.addr();
            match NewsStream::fast(fast, ack(mount.acked)).await {
                Ok(news) => news,
                Err(e) => {
                    tracing::debug!("owner stream over the fast port {port}: {e}; over gRPC");
                    *refused = Some(port);
                    NewsStream::grpc(grpc, ack(mount.acked)).await?
                }
            }
        }
        None => NewsStream::grpc(grpc, ack(mount.acked)).await?,
    };
    // Checked every MOUNT_CHECK, however often news come.
    let mut check = tokio::time::interval(MOUNT_CHECK);
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    check.tick().await;
    loop {
        let next = tokio::select! {
            n = news.message() => n,
            _ = check.tick() => {
                let Some(client) = weak.upgrade().filter(|c| !c.stop.load(Ordering::Acquire)) else {
                    return Ok(Ended::Stale);
                };
                if index.mount().generation != mount.generation {
                    return Ok(Ended::Stale);
                }
                let fast_now = client.rpc.fast_rpc().map(|f| f.addr()).filter(|a| Some(*a) != *refused);
                if news.fast_port().is_none() && fast_now.is_some() {
                    return Ok(Ended::FastPortNow);
                }
                continue;
            }
        };
        match next {
            Ok(Some(n)) if n.tasks_waiting && n.items.is_empty() => {
                // Replica tasks wait for this client: ping now to take them.
                if let Some(client) = weak.upgrade() {
                    client.link.poke();
                }
            }
            Ok(Some(n)) => match index.apply(&n, Instant::now()) {
                Some(acked) => news.ack(ack(acked))?,
                None => return Ok(Ended::Stale), // about another mount: this stream is stale
            },
            Ok(None) => return Err("closed by the master".into()),
            Err(e) => return Err(e),
        }
    }
}

/// A segment's memory, as its owner reads it to settle its owner index for a new master
/// ([`OwnerIndex::report`], [`OwnerIndex::settle_blanks`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct OwnMemory {
    /// The segment's first byte.
    pub addr: u64,
    /// Its length.
    pub len: u64,
}

impl OwnMemory {
    /// `[offset, +size)` of the segment; `None` for a range not inside it.
    fn bytes(&self, offset: u64, size: u64) -> Option<&[u8]> {
        if size == 0 || offset.checked_add(size).is_none_or(|end| end > self.len) {
            return None;
        }
        // SAFETY: inside a segment of this client's, registered and alive while it is mounted
        // (the caller mounts it). A writer whose put the old master placed there may still be
        // copying into the range: the bytes read then are a mix that does not match a checksum
        // or a record's, and the put is dropped (the range held for that writer), which is what
        // such a put needs.
        Some(unsafe { std::slice::from_raw_parts((self.addr + offset) as *const u8, size as usize) })
    }

    /// Whether `[offset, +size)` holds bytes whose checksum is `crc`.
    fn holds(&self, offset: u64, size: u64, crc: u32) -> bool {
        self.bytes(offset, size).is_some_and(|b| super::checksum::of_bytes(b) == crc)
    }

    /// The bytes where a blank's record would be: [`RECORD_MAX`] of them at `offset`.
    fn record(&self, offset: u64) -> Option<Vec<u8>> {
        self.bytes(offset, RECORD_MAX).map(<[u8]>::to_vec)
    }
}
