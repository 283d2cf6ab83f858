//! Events for external indexers: stored / removed / evicted / published / retracted, each with
//! the replica's node and tier.
//!
//! A bounded broadcast channel: sending never blocks and never waits for a subscriber. A
//! subscriber that falls more than `event_buffer` events behind loses the oldest ones and its
//! stream says how many (`EventMessage.lost`). With no subscriber, no event is even built.

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::broadcast;

use crate::master::{Master, State};
use crate::proto::{Event, EventKind, Tier};

/// The master's event channel: a bounded broadcast of [`Event`]s, each numbered (`seq`, from
/// 1, one sequence for all kinds).
pub struct Events {
    tx: broadcast::Sender<Event>,
    seq: AtomicU64,
}

impl Events {
    /// A channel keeping `capacity` events (at least 1) for subscribers that fall behind.
    pub fn new(capacity: usize) -> Self {
        let (tx, _) = broadcast::channel(capacity.max(1));
        Events { tx, seq: AtomicU64::new(0) }
    }

    /// Whether anyone listens (events are built only then).
    pub fn active(&self) -> bool {
        self.tx.receiver_count() > 0
    }

    /// A new subscriber: it receives the events sent from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.tx.subscribe()
    }

    fn send(&self, mut event: Event) -> bool {
        event.seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        self.tx.send(event).is_ok()
    }
}

/// What an event says about where a copy is.
#[derive(Clone, Copy)]
pub(super) struct Place<'a> {
    pub tier: Tier,
    pub client_id: &'a str,
    pub host: &'a str,
    pub segment: &'a str,
}

impl Master {
    /// Subscribes to the master's events.
    pub fn subscribe_events(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    pub(super) fn emit(&self, kind: EventKind, key: &str, size: u64, place: Place<'_>) {
        if !self.events.active() {
            return;
        }
        let sent = self.events.send(Event {
            seq: 0,
            kind: kind as i32,
            key: key.to_string(),
            tier: place.tier as i32,
            size,
            client_id: place.client_id.to_string(),
            host: place.host.to_string(),
            segment: place.segment.to_string(),
        });
        if sent {
            self.metrics.events.inc();
        }
    }

    /// One event per replica of a committed object (before it is removed, or once committed).
    pub(super) fn emit_object(&self, st: &super::Locked<'_>, key: &str, kind: EventKind) {
        if !self.events.active() {
            return;
        }
        let Some(obj) = st.objects.get(key).filter(|o| o.complete) else {
            return;
        };
        for r in &obj.replicas {
            self.emit_replica(st, key, obj.size, r.segment_id, kind);
        }
    }

    pub(super) fn emit_replica(&self, st: &State, key: &str, size: u64, segment_id: u64, kind: EventKind) {
        if let Some(seg) = st.core.segments.get(&segment_id) {
            let place = Place { tier: seg.tier, client_id: &seg.client_id, host: &seg.host, segment: &seg.name };
            self.emit(kind, key, size, place);
        }
    }

    /// `Removed` for every committed replica on a segment about to be dropped.
    pub(super) fn emit_segment_gone(&self, st: &super::Locked<'_>, segment_id: u64) {
        if !self.events.active() {
            return;
        }
        for (key, obj) in st.objects.iter().filter(|(_, o)| o.complete) {
            if obj.replicas.iter().any(|r| r.segment_id == segment_id) {
                self.emit_replica(st, key, obj.size, segment_id, EventKind::Removed);
            }
        }
    }
}
