//! The background filler: deferred fills read again off the get's critical path, piece by
//! piece once the client's own reads leave the link idle, then entered by the worker.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;

use crescent_engine::TransferEngine;

use super::fill_choice::FillChoice;
use super::metrics::bump;
use super::{Deferred, Entry, Fill, FillMode, Flight, Inner, Job, FILL_PIECE};

impl Inner {
    /// Whether this cache has a filler (deferred mode, and auto where it measured a copy).
    pub(super) fn uses_filler(&self) -> bool {
        match self.fill_mode {
            FillMode::Deferred => true,
            FillMode::Auto => self.choice.is_some(),
            FillMode::Inline => false,
        }
    }

    /// How the next miss fills (never [`FillMode::Auto`]).
    pub(super) fn miss_mode(&self) -> FillMode {
        match self.fill_mode {
            FillMode::Auto => self.choice.as_ref().map_or(FillMode::Inline, FillChoice::mode),
            mode => mode,
        }
    }

    pub(super) fn wake_filler(&self) {
        if self.uses_filler() {
            let _fg = self.foreground.lock();
            self.idle.notify_all();
        }
    }

    /// Waits until no read of the client's own has been in flight for the grace of its gaps
    /// ([`IdleGaps::grace`]), unless a get waits for this fill (or it was voided, or the cache
    /// closes), and no longer than `lease_end`: a client that keeps reading at its usual pace
    /// never leaves the link idle that long, and its deferred fills must not hold their blocks
    /// beyond the time they could be entered. Whether the fill goes on (the caller checks the
    /// lease).
    pub(super) fn wait_for_idle(&self, flight: &Flight, lease_end: Option<Instant>) -> bool {
        let go_on = || !self.closing.load(Ordering::SeqCst) && !flight.void.load(Ordering::SeqCst);
        let free = || flight.urgent.load(Ordering::SeqCst) || !go_on();
        let mut busy = self.foreground.lock();
        let mut counted = false;
        loop {
            if free() || lease_end.is_some_and(|end| Instant::now() >= end) {
                break;
            }
            let wait = if busy.reads > 0 {
                None
            } else {
                match busy.gaps.grace().checked_sub(busy.idle_since.elapsed()) {
                    Some(left) if !left.is_zero() => Some(left),
                    _ => break, // idle long enough
                }
            };
            if !counted {
                bump(&self.counters.filler_waits, 1);
                counted = true;
            }
            // Until idle long enough or the lease's end, whichever comes first (neither: a read
            // ending wakes it).
            match [wait.map(|left| Instant::now() + left), lease_end].into_iter().flatten().min() {
                None => self.idle.wait(&mut busy),
                Some(until) => {
                    self.idle.wait_until(&mut busy, until);
                }
            }
        }
        go_on()
    }

    /// The filler: reads each deferred fill's replica into its blocks, piece by piece when
    /// this client's own reads leave the link idle, and enters it if its lease still held when
    /// the read ended and its key was not invalidated.
    pub(super) fn fill_deferred(&self, engine: &TransferEngine, jobs: Receiver<Arc<Deferred>>) {
        while let Ok(job) = jobs.recv() {
            let fill = job.fill.lock().take(); // None: a repeat miss took it over
            if let Some(fill) = fill {
                if self.closing.load(Ordering::SeqCst) {
                    bump(&self.counters.dropped, 1);
                } else {
                    self.fill_one(engine, fill, &job);
                }
            }
            drop(job);
            self.pending.fetch_sub(1, Ordering::AcqRel);
        }
    }

    pub(super) fn fill_one(&self, engine: &TransferEngine, mut fill: Fill, job: &Deferred) {
        let flight = fill.flight.clone();
        let read = || -> std::result::Result<(), String> {
            let mut seg = None;
            for (off, addr, n) in fill.chunks(FILL_PIECE) {
                if !self.wait_for_idle(&flight, job.lease_end) {
                    return Err("closing or invalidated".into());
                }
                // A lease already over: the read could not be entered anyway.
                job.lease_held()?;
                let target = match seg {
                    Some(s) => s,
                    None => *seg.insert(
                        engine
                            .open_segment(crate::protocol::engine_segment(&fill.id.segment))
                            .map_err(|e| e.to_string())?,
                    ),
                };
                let request = crescent_engine::TransferRequest {
                    opcode: crescent_engine::Opcode::Read,
                    source: addr,
                    target,
                    target_offset: fill.id.address + off,
                    length: n,
                };
                // Synchronous: the piece has ended (or the engine gave up on it) before the
                // blocks can go back.
                engine.transfer_sync(&[request]).map_err(|e| e.to_string())?;
            }
            job.lease_held()?;
            match fill.matches_checksum() {
                true => Ok(()),
                false => Err("its bytes do not match the object's checksum".into()),
            }
        };
        match read() {
            Ok(()) if flight.void.load(Ordering::SeqCst) => {
                bump(&self.counters.dropped, 1); // the fill's drop gives its blocks back
            }
            Ok(()) => {
                let Some(blocks) = fill.blocks.take() else { return };
                let entry = Arc::new(Entry { id: fill.id.clone(), blocks });
                flight.finish(Some(entry.clone()));
                let key = std::mem::take(&mut fill.key);
                self.enter(key, entry, &flight);
            }
            Err(why) => {
                tracing::debug!("hot cache: deferred fill of {:?} dropped: {why}", fill.key);
                bump(&self.counters.dropped, 1);
            }
        }
    }

    pub(super) fn serve(&self, jobs: Receiver<Job>) {
        loop {
            match jobs.recv_timeout(Duration::from_millis(200)) {
                Ok(Job { key, entry, flight }) => {
                    self.enter(key, entry, &flight);
                    self.pending.fetch_sub(1, Ordering::AcqRel);
                }
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                    // Keep the hits' recency buffer from filling up.
                    if let Some(mut p) = self.policy.try_lock() {
                        self.drain_touches(&mut p);
                    }
                }
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return,
            }
        }
    }
}
