//! Notifications: short `(name, message)` pairs one engine hands to another beside the data
//! path — Mooncake's `submitTransferWithNotify` / `getNotifies` (NIXL's `genNotif` /
//! `getNotifs`).
//!
//! * **Carried** over the peer's handshake listener as one request ([`MessageKind::Notify`],
//!   payload `name length (u32 LE) | name | message`) answered by [`MessageKind::NotifyAck`]
//!   (one byte: [`ACCEPTED`], [`QUEUE_FULL`], [`TOO_LARGE`]). Each send has the handshake's
//!   deadline; no byte of a transfer waits for it.
//! * **Bounded**: name and message together at most [`MAX_NOTIFY_BYTES`] (refused before
//!   sending); the receiver queues at most [`QUEUE_CAPACITY`] notifications and
//!   [`QUEUE_BYTES`] bytes until [`crate::TransferEngine::take_notifies`] drains them, and
//!   refuses more with a typed error at the sender ([`EngineError::NotifyQueueFull`]).
//! * **After the transfer**: a notification attached to a batch
//!   ([`crate::TransferEngine::submit_with_notify`]) is sent once every request of the batch
//!   submitted up to it has completed — by a sender thread of its own, never from a
//!   transport's completion path — and dropped (with a warning) if one of them failed. Each is
//!   sent once: a lost acknowledgement is not retried, so a notification is delivered at most
//!   once, and exactly once when the peer answers.
//!
//! Names and messages are bytes (Mooncake's `std::string`), not necessarily UTF-8.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Weak};
use std::time::Duration;

use crescent_transports::net::Auth;
use parking_lot::Mutex;

use crate::batch::{Batch, BatchId, TransferStatus};
use crate::error::{EngineError, Result};
use crate::handshake_wire::{self as wire, MessageKind};

/// Most bytes of name and message together (what fits in one handshake request).
pub const MAX_NOTIFY_BYTES: usize = wire::MAX_REQUEST as usize - 4;
/// Most notifications a receiver holds until they are taken.
pub const QUEUE_CAPACITY: usize = 4096;
/// Most bytes (names and messages) a receiver holds until they are taken.
pub const QUEUE_BYTES: usize = 4 << 20;
/// Notifications waiting for the sender thread; more are dropped with a warning.
pub const OUTBOX_CAPACITY: usize = 4096;

/// [`MessageKind::NotifyAck`] payloads.
pub const ACCEPTED: u8 = 0;
/// Refused: the receiver's queue is full.
pub const QUEUE_FULL: u8 = 1;
/// Refused: the notification is larger than the receiver takes.
pub const TOO_LARGE: u8 = 2;

/// One notification: who sends it (by convention the sender's agent or segment name) and
/// what it says.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Notification {
    /// Who sends it.
    pub name: Vec<u8>,
    /// What it says.
    pub message: Vec<u8>,
}

impl Notification {
    /// A notification from `name` saying `message`.
    pub fn new(name: impl Into<Vec<u8>>, message: impl Into<Vec<u8>>) -> Self {
        Notification { name: name.into(), message: message.into() }
    }

    fn size(&self) -> usize {
        self.name.len() + self.message.len()
    }

    /// Refuses a notification larger than [`MAX_NOTIFY_BYTES`] (the caller's mistake).
    pub fn check(&self) -> Result<()> {
        if self.size() > MAX_NOTIFY_BYTES {
            return Err(EngineError::NotifyTooLarge { len: self.size(), max: MAX_NOTIFY_BYTES });
        }
        Ok(())
    }

    /// The wire form: `name length (u32 LE) | name | message`.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(4 + self.size());
        out.extend_from_slice(&(self.name.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.name);
        out.extend_from_slice(&self.message);
        out
    }

    /// Parses the wire form; bytes from a peer, so every length is checked.
    pub fn decode(payload: &[u8]) -> std::result::Result<Self, String> {
        let (len, rest) = payload.split_first_chunk::<4>().ok_or("a notification shorter than its header")?;
        let len = u32::from_le_bytes(*len) as usize;
        if len > rest.len() {
            return Err(format!("a notification name of {len} bytes in {} bytes", rest.len()));
        }
        let (name, message) = rest.split_at(len);
        let n = Notification::new(name, message);
        if n.size() > MAX_NOTIFY_BYTES {
            return Err(format!("a notification of {} bytes (at most {MAX_NOTIFY_BYTES})", n.size()));
        }
        Ok(n)
    }
}

/// The notifications received and not yet taken, bounded in count and bytes.
#[derive(Debug, Default)]
pub struct NotifyQueue {
    state: Mutex<(VecDeque<Notification>, usize)>,
}

impl NotifyQueue {
    /// Queues `n`, or says why not ([`QUEUE_FULL`], [`TOO_LARGE`]).
    pub fn push(&self, n: Notification) -> std::result::Result<(), u8> {
        if n.size() > MAX_NOTIFY_BYTES {
            return Err(TOO_LARGE);
        }
        let mut state = self.state.lock();
        let (items, bytes) = &mut *state;
        if items.len() >= QUEUE_CAPACITY || *bytes + n.size() > QUEUE_BYTES {
            return Err(QUEUE_FULL);
        }
        *bytes += n.size();
        items.push_back(n);
        Ok(())
    }

    /// Takes every queued notification, oldest first.
    pub fn take_all(&self) -> Vec<Notification> {
        let mut state = self.state.lock();
        state.1 = 0;
        state.0.drain(..).collect()
    }

    /// Notifications waiting to be taken.
    pub fn len(&self) -> usize {
        self.state.lock().0.len()
    }

    /// None is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Serves one [`MessageKind::Notify`] request: the [`MessageKind::NotifyAck`] byte.
    pub fn receive(&self, payload: &[u8]) -> u8 {
        match Notification::decode(payload) {
            Ok(n) => match self.push(n) {
                Ok(()) => ACCEPTED,
                Err(why) => {
                    tracing::warn!("notification refused: the queue is full ({QUEUE_CAPACITY} or {QUEUE_BYTES} bytes)");
                    why
                }
            },
            Err(e) => {
                tracing::warn!("notification refused: {e}");
                TOO_LARGE
            }
        }
    }
}

/// Sends `n` to the engine whose handshake listener is `address` (`host:port`), waiting at
/// most `timeout` for each step; `peer` names it in errors.
pub fn send(peer: &str, address: &str, n: &Notification, timeout: Duration, auth: &Auth) -> Result<()> {
    n.check()?;
    let unreachable = |reason: String| EngineError::SegmentUnreachable { name: peer.to_string(), reason };
    let mut stream = wire::connect(peer, address, timeout, auth)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    wire::write_message(&mut stream, MessageKind::Notify, &n.encode())
        .map_err(|e| unreachable(format!("sending the notification: {e}")))?;
    let bad = |reason: String| EngineError::BadPeerReply { peer: peer.to_string(), reason };
    match wire::read_message(&mut stream, 64) {
        Ok((MessageKind::NotifyAck, ack)) => match ack.as_slice() {
            [ACCEPTED] => Ok(()),
            [QUEUE_FULL] => Err(EngineError::NotifyQueueFull { peer: peer.to_string() }),
            [TOO_LARGE] => Err(bad("the peer refused the notification as malformed or too large".into())),
            other => Err(bad(format!("unknown notification acknowledgement {other:?}"))),
        },
        Ok((MessageKind::Error, text)) => Err(bad(String::from_utf8_lossy(&text).into_owned())),
        Ok((kind, _)) => Err(bad(format!("unexpected reply {kind:?} to a notification"))),
        Err(e) => Err(bad(e.to_string())),
    }
}

/// A notification waiting for its batch.
struct Pending {
    /// The batch's requests it follows: the first `upto`.
    upto: usize,
    peer: String,
    address: String,
    notification: Notification,
}

struct Job {
    peer: String,
    address: String,
    notification: Notification,
}

/// Notifications attached to batches, and the thread that sends them once their batch is done.
pub(crate) struct Outbox {
    pending: Mutex<HashMap<BatchId, Pending>>,
    jobs: crossbeam_channel::Sender<Job>,
    timeout: Duration,
}

impl Outbox {
    pub(crate) fn start(timeout: Duration, auth: Auth) -> Result<Arc<Outbox>> {
        let (jobs, queue) = crossbeam_channel::bounded::<Job>(OUTBOX_CAPACITY);
        std::thread::Builder::new().name("crescent-notify".into()).spawn(move || {
            // Ends when the outbox (the only sender) is dropped with its engine.
            for job in queue {
                if let Err(e) = send(&job.peer, &job.address, &job.notification, timeout, &auth) {
                    tracing::warn!("notification to {} not delivered: {e}", job.peer);
                }
            }
        })?;
        Ok(Arc::new(Outbox { pending: Mutex::new(HashMap::new()), jobs, timeout }))
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Attaches `n` to `batch`: it follows the requests submitted so far (replacing one
    /// attached before and not sent yet, as Mooncake does).
    pub(crate) fn arm(self: &Arc<Self>, batch: &Arc<Batch>, peer: &str, address: String, n: Notification) {
        let pending = Pending { upto: batch.submitted(), peer: peer.to_string(), address, notification: n };
        if let Some(old) = self.pending.lock().insert(batch.id(), pending) {
            tracing::warn!("batch {}: a notification to {} was replaced before it was sent", batch.id(), old.peer);
        }
        let me: Weak<Outbox> = Arc::downgrade(self);
        batch.on_idle(Arc::new(move |b: &Batch| {
            if let Some(outbox) = me.upgrade() {
                outbox.check(b);
            }
        }));
        // The batch may have ended before the hook was in place.
        self.check(batch);
    }

    /// Once `batch` has nothing in flight: sends its notification if the requests it follows
    /// all completed, drops it otherwise. At most once per notification.
    pub(crate) fn check(&self, batch: &Batch) {
        if batch.unfinished() > 0 {
            return;
        }
        let Some(p) = self.pending.lock().remove(&batch.id()) else { return };
        let failed = (0..p.upto).find_map(|i| match batch.status(i) {
            Ok(TransferStatus::Completed) => None,
            Ok(other) => Some(format!("request {i} ended {other:?}")),
            Err(e) => Some(e.to_string()),
        });
        if let Some(why) = failed {
            tracing::warn!("batch {}: notification to {} dropped: {why}", batch.id(), p.peer);
            return;
        }
        let job = Job { peer: p.peer, address: p.address, notification: p.notification };
        if let Err(e) = self.jobs.try_send(job) {
            tracing::warn!(
                "batch {}: notification to {} dropped: {OUTBOX_CAPACITY} notifications wait to be sent",
                batch.id(),
                e.into_inner().peer
            );
        }
    }

    /// The batch is being freed: a notification still attached is sent if due, else dropped.
    pub(crate) fn release(&self, batch: &Batch) {
        self.check(batch);
        if let Some(p) = self.pending.lock().remove(&batch.id()) {
            tracing::warn!("batch {} freed before its notification to {} was due; dropped", batch.id(), p.peer);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn wire_form_roundtrips_and_is_checked() {
        let n = Notification::new(&b"agent-a"[..], &b"\x00binary\xff"[..]);
        assert_eq!(Notification::decode(&n.encode()).unwrap(), n);
        assert_eq!(Notification::decode(&Notification::default().encode()).unwrap(), Notification::default());
        assert!(Notification::decode(b"\x01\x00").is_err());
        assert!(Notification::decode(&[9, 0, 0, 0, b'a']).is_err());
        assert!(Notification::decode(&u32::MAX.to_le_bytes()).is_err());
        let big = Notification::new(vec![b'n'; 10], vec![b'm'; MAX_NOTIFY_BYTES - 10]);
        assert!(big.check().is_ok());
        let too_big = Notification::new(vec![b'n'; 11], vec![b'm'; MAX_NOTIFY_BYTES - 10]);
        assert!(matches!(too_big.check(), Err(EngineError::NotifyTooLarge { .. })));
        assert!(Notification::decode(&too_big.encode()).is_err());
        // The largest one fits one handshake request.
        assert!(big.encode().len() <= wire::MAX_REQUEST as usize);
    }

    #[test]
    fn queue_is_bounded_in_count_and_bytes_and_drains_in_order() {
        let q = NotifyQueue::default();
        for i in 0..QUEUE_CAPACITY {
            q.push(Notification::new(format!("n{i}"), "")).unwrap();
        }
        assert_eq!(q.push(Notification::new("one more", "")), Err(QUEUE_FULL));
        let all = q.take_all();
        assert_eq!(all.len(), QUEUE_CAPACITY);
        assert_eq!(all[0].name, b"n0");
        assert_eq!(all[QUEUE_CAPACITY - 1].name, format!("n{}", QUEUE_CAPACITY - 1).into_bytes());
        assert!(q.take_all().is_empty(), "taken once");
        let chunk = Notification::new("", vec![0u8; MAX_NOTIFY_BYTES]);
        let fit = QUEUE_BYTES / MAX_NOTIFY_BYTES;
        for _ in 0..fit {
            q.push(chunk.clone()).unwrap();
        }
        assert_eq!(q.push(chunk.clone()), Err(QUEUE_FULL));
        assert_eq!(q.take_all().len(), fit);
        q.push(chunk).unwrap();
        assert_eq!(q.receive(b"\x05"), TOO_LARGE);
        assert_eq!(q.len(), 1);
    }

    proptest! {
        #[test]
        fn arbitrary_payloads_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let q = NotifyQueue::default();
            let ack = q.receive(&bytes);
            prop_assert!(ack == ACCEPTED || ack == TOO_LARGE);
        }
    }
}
