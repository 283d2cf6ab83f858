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

/// What kind of failure ended a slice: whose fault it was, for the layers above (the
/// engine's `EngineError::is_caller_error`, the store's errors).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FailureKind {
    /// The target refused the access: the range is not inside its registered memory (a
    /// remote access error). The request named memory the target does not have (a mistake,
    /// or a stale descriptor).
    OutOfRange,
    /// The connection to the peer broke, or the peer is gone (closed, reset, killed, no
    /// queue pair left to it).
    PeerGone,
    /// The peer did not answer within the transport's own time (it is stalled or stopped).
    TimedOut,
    /// The peer broke the protocol: an answer that contradicts the request.
    Protocol,
    /// The connection to the peer was not authenticated: the two ends do not share a cluster
    /// secret (one has none, or another one), or the peer could not prove it knows it.
    Unauthenticated,
    /// A local failure: the local memory (not registered with the device, a local access
    /// error), resources (threads, descriptors), or the transport shutting down.
    Local,
}

impl FailureKind {
    /// The kind in words (`"peer gone"`), as shown in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::OutOfRange => "out of range",
            FailureKind::PeerGone => "peer gone",
            FailureKind::TimedOut => "timed out",
            FailureKind::Protocol => "protocol violation",
            FailureKind::Unauthenticated => "not authenticated",
            FailureKind::Local => "local failure",
        }
    }
}

impl std::fmt::Display for FailureKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a slice failed: its [`FailureKind`] and what happened, in words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct FailureReason {
    /// Whose fault it was.
    pub kind: FailureKind,
    /// What happened.
    pub message: String,
}

impl FailureReason {
    /// A failure of `kind`.
    pub fn new(kind: FailureKind, message: impl Into<String>) -> Self {
        FailureReason { kind, message: message.into() }
    }
    /// A [`FailureKind::OutOfRange`] failure.
    pub fn out_of_range(message: impl Into<String>) -> Self {
        Self::new(FailureKind::OutOfRange, message)
    }
    /// A [`FailureKind::PeerGone`] failure.
    pub fn peer_gone(message: impl Into<String>) -> Self {
        Self::new(FailureKind::PeerGone, message)
    }
    /// A [`FailureKind::TimedOut`] failure.
    pub fn timed_out(message: impl Into<String>) -> Self {
        Self::new(FailureKind::TimedOut, message)
    }
    /// A [`FailureKind::Protocol`] failure.
    pub fn protocol(message: impl Into<String>) -> Self {
        Self::new(FailureKind::Protocol, message)
    }
    /// A [`FailureKind::Unauthenticated`] failure: the peer did not prove the cluster secret.
    pub fn unauthenticated(message: impl Into<String>) -> Self {
        Self::new(FailureKind::Unauthenticated, message)
    }
    /// A [`FailureKind::Local`] failure.
    pub fn local(message: impl Into<String>) -> Self {
        Self::new(FailureKind::Local, message)
    }

    /// Whose fault it was.
    pub fn kind(&self) -> FailureKind {
        self.kind
    }

    /// The peer failed: it is gone, stalled, or broke the protocol. (Another replica may work.)
    pub fn is_peer_fault(&self) -> bool {
        matches!(
            self.kind,
            FailureKind::PeerGone | FailureKind::TimedOut | FailureKind::Protocol | FailureKind::Unauthenticated
        )
    }

    /// The request named memory the target does not have.
    pub fn is_out_of_range(&self) -> bool {
        self.kind == FailureKind::OutOfRange
    }

    /// The same failure, its message prefixed with `context` (`"<context>: <message>"`).
    pub fn context(self, context: impl std::fmt::Display) -> Self {
        FailureReason { kind: self.kind, message: format!("{context}: {}", self.message) }
    }
}

/// How a slice ended, as reported by a transport. Timeouts are decided by the slice's owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SliceOutcome {
    /// All its bytes moved.
    Completed,
    /// It failed, and why.
    Failed(FailureReason),
}

/// How a transport that holds a slice's local memory across a wait on a device or a peer
/// (RDMA: from posting a work request to its completion) lets go of it at once: it must make
/// the access end promptly (e.g. move the queue pair to the error state, which flushes its
/// work requests). See [`Completion::claim_local_abortable`].
pub type Abort = Arc<dyn Fn() + Send + Sync>;

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
    /// Tells how to abort the slice's access in progress: the sink calls `abort` if it ends
    /// the slice (its deadline passed) while the memory is claimed. The default ignores it.
    fn set_abort(&self, _slice: usize, _abort: Abort) {}
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
    /// The completion of slice number `slice`, reported to `sink`.
    pub fn new(sink: Arc<dyn CompletionSink>, slice: usize) -> Self {
        Completion { sink: Some(sink), slice }
    }

    /// Runs `f` while holding the slice's claim on its local memory. Returns `None` without
    /// running `f` if the slice already ended.
    pub fn with_local_access<R>(&self, f: impl FnOnce() -> R) -> Option<R> {
        // The sink borrowed, not cloned: no reference count to bump on a line every thread
        // completing this submission's slices also touches.
        with_claim(self.sink.as_deref()?, self.slice, f)
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

    /// [`Completion::claim_local`] borrowed from the completion (no reference to the sink
    /// taken): for claiming several slices' memory before copying them all, so that the
    /// copies run back to back and only the end of the last claim waits for their stores to
    /// land (each claim's end is an atomic read-modify-write, which waits for every store
    /// before it). `None` if the slice already ended.
    pub fn claim_here(&self) -> Option<BorrowedClaim<'_>> {
        let sink = self.sink.as_deref()?;
        sink.begin_local_access(self.slice).then_some(BorrowedClaim { sink, slice: self.slice })
    }

    /// [`Completion::claim_local`] for a claim held across a wait on a device or a peer: if
    /// the slice's owner ends the slice while the claim is held (its deadline passed), it
    /// calls `abort`, which must make the transport release the claim promptly. So the
    /// slice ends at its deadline, and its memory is still never touched after its end.
    pub fn claim_local_abortable(&self, abort: &Abort) -> Option<LocalClaim> {
        let sink = self.sink.as_ref()?;
        sink.set_abort(self.slice, abort.clone());
        self.claim_local()
    }

    /// Ends the slice with `outcome` (reported once any claim on its local memory is released).
    pub fn complete(mut self, outcome: SliceOutcome) {
        if let Some(sink) = self.sink.take() {
            sink.complete(self.slice, outcome);
        }
    }

    /// Ends the slice as failed, for `reason`.
    pub fn fail(self, reason: FailureReason) {
        self.complete(SliceOutcome::Failed(reason));
    }
}

impl Drop for Completion {
    fn drop(&mut self) {
        if let Some(sink) = self.sink.take() {
            sink.complete(self.slice, SliceOutcome::Failed(FailureReason::local("the transport dropped the slice")));
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
        with_claim(self.sink.as_ref(), self.slice, f)
    }

    /// Claims the memory until the returned claim is dropped, so that several slices' memory
    /// can be held for one call (a gathered send); `None` if the slice already ended. Hold it
    /// for a call that does not wait only, never across a wait on the peer.
    pub fn claim(&self) -> Option<LocalClaim> {
        self.sink.begin_local_access(self.slice).then(|| LocalClaim { sink: self.sink.clone(), slice: self.slice })
    }
}

/// Runs `f` between `sink`'s begin and end of an access to `slice`'s local memory (the end
/// even when `f` panics); `None` without running it if the slice already ended.
fn with_claim<R>(sink: &dyn CompletionSink, slice: usize, f: impl FnOnce() -> R) -> Option<R> {
    if !sink.begin_local_access(slice) {
        return None;
    }
    let _end = BorrowedClaim { sink, slice };
    Some(f())
}

/// A claim on a slice's local memory that lives no longer than its [`Completion`]; see
/// [`Completion::claim_here`]. Dropping it ends the access.
pub struct BorrowedClaim<'a> {
    sink: &'a dyn CompletionSink,
    slice: usize,
}

impl Drop for BorrowedClaim<'_> {
    fn drop(&mut self) {
        self.sink.end_local_access(self.slice);
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
    /// Read (remote into local) or write (local into remote).
    pub opcode: Opcode,
    /// Where it starts in this process's registered memory.
    pub local_addr: u64,
    /// Where it starts in the peer's registered memory.
    pub remote_addr: u64,
    /// Its length in bytes.
    pub len: u64,
    /// How it is ended; every slice is ended exactly once.
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
        assert!(matches!(&out[0], (3, SliceOutcome::Failed(r)) if r.message.contains("dropped")));
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
