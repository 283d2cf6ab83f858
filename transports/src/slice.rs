//! Slices: the unit of work a transport moves, and how it reports their end.

use std::sync::Arc;

/// Direction of a one-sided transfer, seen from the initiator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Opcode {
    /// Pull remote bytes into local memory.
    Read,
    /// Push local bytes into remote memory.
    Write,
}

/// How a slice ended, as reported by a transport. Timeouts are decided by the slice's owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SliceOutcome {
    Completed,
    Failed(String),
}

/// Receives the outcome of slices; implemented by the engine's batches.
///
/// Local memory may only be touched between a successful `begin_local_access` and the
/// matching `end_local_access`: a slice that has already ended (timed out, for example) may
/// have had its memory handed back to the application. A slice completed while an access is
/// in progress must only be reported ended once the access ends.
pub trait CompletionSink: Send + Sync {
    /// Claims the slice's local memory for an access; false if the slice has already ended.
    fn begin_local_access(&self, slice: usize) -> bool;
    /// Ends an access begun with `begin_local_access`.
    fn end_local_access(&self, slice: usize);
    /// Records the slice's outcome; the first outcome recorded wins.
    fn complete(&self, slice: usize, outcome: SliceOutcome);
}

/// The completion handle of one slice. Dropping it without completing fails the slice, so a
/// slice can never be forgotten.
pub struct Completion {
    sink: Option<Arc<dyn CompletionSink>>,
    slice: usize,
}

impl std::fmt::Debug for Completion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Completion").field("slice", &self.slice).finish()
    }
}

impl Completion {
    pub fn new(sink: Arc<dyn CompletionSink>, slice: usize) -> Self {
        Completion { sink: Some(sink), slice }
    }

    /// Runs `f` while holding the slice's claim on its local memory. Returns `None` without
    /// running `f` if the slice already ended.
    pub fn with_local_access<R>(&self, f: impl FnOnce() -> R) -> Option<R> {
        self.local_access()?.with(f)
    }

    /// A handle that can claim the slice's local memory after the `Completion` itself has
    /// been handed to another thread (which may complete the slice meanwhile: its end is then
    /// deferred until the access ends).
    pub fn local_access(&self) -> Option<LocalAccess> {
        let sink = self.sink.clone()?;
        Some(LocalAccess { sink, slice: self.slice })
    }

    /// Claims the slice's local memory until the returned guard is dropped: for a transport
    /// whose device reads or writes the memory on its own (RDMA) between posting the slice and
    /// its completion. `None` if the slice already ended. Complete the slice before dropping
    /// the claim: its end is then reported once the claim is released.
    pub fn claim_local(&self) -> Option<LocalClaim> {
        let sink = self.sink.clone()?;
        sink.begin_local_access(self.slice).then_some(LocalClaim { sink, slice: self.slice })
    }

    pub fn complete(mut self, outcome: SliceOutcome) {
        if let Some(sink) = self.sink.take() {
            sink.complete(self.slice, outcome);
        }
    }

    pub fn fail(self, reason: impl Into<String>) {
        self.complete(SliceOutcome::Failed(reason.into()));
    }
}

impl Drop for Completion {
    fn drop(&mut self) {
        if let Some(sink) = self.sink.take() {
            sink.complete(self.slice, SliceOutcome::Failed("the transport dropped the slice".into()));
        }
    }
}

/// See [`Completion::local_access`].
pub struct LocalAccess {
    sink: Arc<dyn CompletionSink>,
    slice: usize,
}

impl LocalAccess {
    /// Runs `f` while holding the claim; `None` if the slice already ended.
    pub fn with<R>(&self, f: impl FnOnce() -> R) -> Option<R> {
        if !self.sink.begin_local_access(self.slice) {
            return None;
        }
        struct End<'a>(&'a dyn CompletionSink, usize);
        impl Drop for End<'_> {
            fn drop(&mut self) {
                self.0.end_local_access(self.1);
            }
        }
        let _end = End(self.sink.as_ref(), self.slice);
        Some(f())
    }
}

/// A claim on a slice's local memory held across threads; see [`Completion::claim_local`].
pub struct LocalClaim {
    sink: Arc<dyn CompletionSink>,
    slice: usize,
}

impl std::fmt::Debug for LocalClaim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalClaim").field("slice", &self.slice).finish()
    }
}

impl Drop for LocalClaim {
    fn drop(&mut self) {
        self.sink.end_local_access(self.slice);
    }
}

/// A piece of a transfer request that lies inside one local and one remote registered region
/// and is no longer than the transport's maximum slice length.
#[derive(Debug)]
pub struct Slice {
    pub opcode: Opcode,
    pub local_addr: u64,
    pub remote_addr: u64,
    pub len: u64,
    pub completion: Completion,
}

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;

    #[derive(Default)]
    struct Recorder {
        outcomes: Mutex<Vec<(usize, SliceOutcome)>>,
        ended: std::sync::atomic::AtomicBool,
    }
    impl CompletionSink for Recorder {
        fn begin_local_access(&self, _: usize) -> bool {
            !self.ended.load(std::sync::atomic::Ordering::SeqCst)
        }
        fn end_local_access(&self, _: usize) {}
        fn complete(&self, slice: usize, outcome: SliceOutcome) {
            self.outcomes.lock().push((slice, outcome));
        }
    }

    #[test]
    fn dropped_completion_fails_the_slice() {
        let rec = Arc::new(Recorder::default());
        drop(Completion::new(rec.clone(), 3));
        let out = rec.outcomes.lock();
        assert_eq!(out.len(), 1);
        assert!(matches!(&out[0], (3, SliceOutcome::Failed(r)) if r.contains("dropped")));
    }

    #[test]
    fn completion_reports_once() {
        let rec = Arc::new(Recorder::default());
        Completion::new(rec.clone(), 1).complete(SliceOutcome::Completed);
        assert_eq!(*rec.outcomes.lock(), vec![(1, SliceOutcome::Completed)]);
    }

    #[test]
    fn a_claim_is_refused_once_the_slice_ended() {
        let rec = Arc::new(Recorder::default());
        let c = Completion::new(rec.clone(), 2);
        assert!(c.claim_local().is_some());
        rec.ended.store(true, std::sync::atomic::Ordering::SeqCst);
        assert!(c.claim_local().is_none());
        c.complete(SliceOutcome::Completed);
    }

    #[test]
    fn ended_slice_denies_local_access() {
        let rec = Arc::new(Recorder::default());
        let c = Completion::new(rec.clone(), 0);
        assert_eq!(c.with_local_access(|| 5), Some(5));
        rec.ended.store(true, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(c.with_local_access(|| 5), None);
        c.complete(SliceOutcome::Completed);
    }
}
