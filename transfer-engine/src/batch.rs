//! Batches of transfer requests and the bookkeeping of their slices' completions.
//!
//! A slice's state is one atomic byte: bit 0 = its local memory is being accessed by a
//! transport, bits 1-2 = its outcome (none yet, completed, failed, timed out). The first
//! outcome wins; a slice that ends while an access is in progress is only counted as ended
//! (and its local region released) when the access ends, so memory handed back to the
//! application after a timeout is never touched again.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use atomic_waker::AtomicWaker;
use crescent_transports::{Abort, CompletionSink, FailureReason, InflightGuard, SliceOutcome};
use parking_lot::{Condvar, Mutex};

use crate::error::{EngineError, Result};

/// A batch's number, from [`TransferEngine::allocate_batch`](crate::TransferEngine::allocate_batch).
pub type BatchId = u64;

/// Where one transfer request stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransferStatus {
    /// Submitted and not ended yet.
    Pending,
    /// All its bytes moved.
    Completed,
    /// Why it failed, typed: [`FailureReason::kind`] says whose fault it was.
    Failed(FailureReason),
    /// Its deadline passed before it ended.
    TimedOut,
}

impl TransferStatus {
    /// It has ended (anything but [`TransferStatus::Pending`]).
    pub fn is_final(&self) -> bool {
        !matches!(self, TransferStatus::Pending)
    }
}

const BUSY: u8 = 1;
const COMPLETED: u8 = 1;
const FAILED: u8 = 2;
const TIMED_OUT: u8 = 3;

#[derive(Default)]
struct RequestState {
    /// Slices not yet ended.
    remaining: AtomicUsize,
    /// First error outcome (FAILED or TIMED_OUT), 0 if none.
    error: AtomicU8,
    reason: Mutex<Option<FailureReason>>,
}

/// The shared state of one batch.
pub struct Batch {
    id: BatchId,
    requests: Box<[RequestState]>,
    /// Request slots taken by submissions so far.
    submitted: AtomicUsize,
    /// Submitted requests that have not ended.
    unfinished: AtomicUsize,
    lock: Mutex<()>,
    done: Condvar,
    waker: AtomicWaker,
    /// Called each time the last unfinished request ends (after waiters are woken).
    idle: Mutex<Option<IdleHook>>,
}

/// What [`Batch::on_idle`] installs.
pub(crate) type IdleHook = Arc<dyn Fn(&Batch) + Send + Sync>;

impl Batch {
    pub(crate) fn new(id: BatchId, capacity: usize) -> Arc<Self> {
        Arc::new(Batch {
            id,
            requests: (0..capacity).map(|_| RequestState::default()).collect(),
            submitted: AtomicUsize::new(0),
            unfinished: AtomicUsize::new(0),
            lock: Mutex::new(()),
            done: Condvar::new(),
            waker: AtomicWaker::new(),
            idle: Mutex::new(None),
        })
    }

    /// The batch's number.
    pub fn id(&self) -> BatchId {
        self.id
    }

    /// Most requests it holds.
    pub fn capacity(&self) -> usize {
        self.requests.len()
    }

    /// Requests submitted to it so far.
    pub fn submitted(&self) -> usize {
        self.submitted.load(Ordering::Acquire)
    }

    /// Requests submitted and not yet ended.
    pub fn unfinished(&self) -> usize {
        self.unfinished.load(Ordering::Acquire)
    }

    /// Calls `hook` (on the thread that ends it) each time the batch's last unfinished
    /// request ends; it must not block. Replaces an earlier hook.
    pub(crate) fn on_idle(&self, hook: IdleHook) {
        *self.idle.lock() = Some(hook);
    }

    /// Takes `n` request slots; returns the first one.
    pub(crate) fn reserve(&self, n: usize) -> Result<usize> {
        let capacity = self.capacity();
        self.submitted
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| (s + n <= capacity).then_some(s + n))
            .map_err(|_| EngineError::BatchFull { id: self.id, capacity, requested: n })
    }

    /// Starts tracking request `slot`, which has `slices` slices to wait for.
    pub(crate) fn start_request(&self, slot: usize, slices: usize) {
        self.requests[slot].remaining.store(slices, Ordering::Release);
        self.unfinished.fetch_add(1, Ordering::AcqRel);
    }

    /// Ends request `slot` at once (it never reached a transport).
    pub(crate) fn fail_request(&self, slot: usize, reason: FailureReason) {
        let req = &self.requests[slot];
        *req.reason.lock() = Some(reason);
        req.error.store(FAILED, Ordering::Release);
        req.remaining.store(0, Ordering::Release);
    }

    /// Where its `index`th submitted request stands; an index not submitted is an
    /// [`EngineError::InvalidArgument`].
    pub fn status(&self, index: usize) -> Result<TransferStatus> {
        if index >= self.submitted() {
            return Err(EngineError::InvalidArgument(format!(
                "batch {} has {} submitted request(s); there is no request {index}",
                self.id,
                self.submitted()
            )));
        }
        let req = &self.requests[index];
        if req.remaining.load(Ordering::Acquire) > 0 {
            return Ok(TransferStatus::Pending);
        }
        Ok(match req.error.load(Ordering::Acquire) {
            0 => TransferStatus::Completed,
            TIMED_OUT => TransferStatus::TimedOut,
            _ => TransferStatus::Failed(
                req.reason.lock().clone().unwrap_or_else(|| FailureReason::local("unknown failure")),
            ),
        })
    }

    /// Where each submitted request stands, in submission order.
    pub fn statuses(&self) -> Vec<TransferStatus> {
        (0..self.submitted()).map(|i| self.status(i).expect("index below submitted")).collect()
    }

    /// Blocks until every submitted request has ended or `timeout` passes; true if all ended.
    pub fn wait(&self, timeout: Option<Duration>) -> bool {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut guard = self.lock.lock();
        while self.unfinished() > 0 {
            match deadline {
                Some(d) => {
                    if self.done.wait_until(&mut guard, d).timed_out() {
                        return self.unfinished() == 0;
                    }
                }
                None => self.done.wait(&mut guard),
            }
        }
        true
    }

    fn end_slice(&self, request: usize, code: u8, reason: Option<FailureReason>) {
        let req = &self.requests[request];
        if code != COMPLETED && req.error.compare_exchange(0, code, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            *req.reason.lock() = reason;
        }
        if req.remaining.fetch_sub(1, Ordering::AcqRel) == 1 && self.unfinished.fetch_sub(1, Ordering::AcqRel) == 1 {
            drop(self.lock.lock());
            self.done.notify_all();
            self.waker.wake();
            let hook = self.idle.lock().clone();
            if let Some(hook) = hook {
                hook(self);
            }
        }
    }
}

/// A future that resolves to the statuses of a batch's requests once all have ended.
pub struct BatchCompletion {
    pub(crate) batch: Arc<Batch>,
}

impl Future for BatchCompletion {
    type Output = Vec<TransferStatus>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.batch.waker.register(cx.waker());
        if self.batch.unfinished() == 0 {
            Poll::Ready(self.batch.statuses())
        } else {
            Poll::Pending
        }
    }
}

struct SliceSlot {
    request: usize,
    state: AtomicU8,
    reason: Mutex<Option<FailureReason>>,
    guard: Mutex<Option<InflightGuard>>,
    /// How the transport lets go of the memory at once if the slice times out while a claim
    /// is held across a wait (RDMA).
    abort: Mutex<Option<Abort>>,
}

/// The slices of one submission: what transports report completions to.
pub(crate) struct Submission {
    batch: Arc<Batch>,
    slots: Vec<SliceSlot>,
    deadline: Instant,
}

impl Submission {
    pub(crate) fn new(batch: Arc<Batch>, deadline: Instant) -> Self {
        Submission { batch, slots: Vec::new(), deadline }
    }

    /// Adds a slice of request `request`, holding its local region in use until it ends.
    pub(crate) fn add_slice(&mut self, request: usize, guard: InflightGuard) -> usize {
        self.slots.push(SliceSlot {
            request,
            state: AtomicU8::new(0),
            reason: Mutex::new(None),
            guard: Mutex::new(Some(guard)),
            abort: Mutex::new(None),
        });
        self.slots.len() - 1
    }

    fn set_outcome(&self, slice: usize, code: u8, reason: Option<FailureReason>) {
        let slot = &self.slots[slice];
        let mut old = slot.state.load(Ordering::Acquire);
        loop {
            if old >> 1 != 0 {
                return; // already ended: the first outcome wins
            }
            if code != COMPLETED {
                *slot.reason.lock() = reason.clone();
            }
            match slot.state.compare_exchange(old, old | (code << 1), Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break,
                Err(now) => old = now,
            }
        }
        if old & BUSY == 0 {
            self.finish(slice);
        } else if code == TIMED_OUT {
            // An access is in progress: the slice ends once it does, so make the transport
            // end it now (without this slot's lock held: the abort takes the transport's).
            let abort = slot.abort.lock().take();
            if let Some(abort) = abort {
                abort();
            }
        }
    }

    fn finish(&self, slice: usize) {
        let slot = &self.slots[slice];
        let code = slot.state.load(Ordering::Acquire) >> 1;
        drop(slot.guard.lock().take());
        // Only an error outcome leaves a reason (see `set_outcome`).
        let reason = if code == COMPLETED { None } else { slot.reason.lock().take() };
        self.batch.end_slice(slot.request, code, reason);
    }

    /// Times out every slice that has not ended; true when the submission has nothing left.
    fn expire_if_due(&self, now: Instant, timeout: Duration) -> bool {
        if now < self.deadline {
            return false;
        }
        for i in 0..self.slots.len() {
            self.set_outcome(i, TIMED_OUT, Some(FailureReason::timed_out(format!("no completion within {timeout:?}"))));
        }
        true
    }
}

impl CompletionSink for Submission {
    fn begin_local_access(&self, slice: usize) -> bool {
        self.slots[slice].state.compare_exchange(0, BUSY, Ordering::AcqRel, Ordering::Acquire).is_ok()
    }

    fn end_local_access(&self, slice: usize) {
        let old = self.slots[slice].state.fetch_and(!BUSY, Ordering::AcqRel);
        if old >> 1 != 0 {
            self.finish(slice);
        }
    }

    fn set_abort(&self, slice: usize, abort: Abort) {
        *self.slots[slice].abort.lock() = Some(abort);
    }

    fn complete(&self, slice: usize, outcome: SliceOutcome) {
        match outcome {
            SliceOutcome::Completed => self.set_outcome(slice, COMPLETED, None),
            SliceOutcome::Failed(reason) => self.set_outcome(slice, FAILED, Some(reason)),
        }
    }
}

/// Times out slices whose submission passed its deadline. One thread per engine.
pub(crate) struct Watchdog {
    submissions: Mutex<Vec<Weak<Submission>>>,
    timeout: Duration,
}

impl Watchdog {
    pub(crate) fn start(timeout: Duration) -> Arc<Watchdog> {
        let dog = Arc::new(Watchdog { submissions: Mutex::new(Vec::new()), timeout });
        let weak = Arc::downgrade(&dog);
        std::thread::Builder::new()
            .name("crescent-timeouts".into())
            .spawn(move || {
                let tick = (timeout / 10).clamp(Duration::from_millis(5), Duration::from_millis(100));
                while let Some(dog) = weak.upgrade() {
                    dog.sweep(Instant::now());
                    drop(dog);
                    std::thread::sleep(tick);
                }
            })
            .expect("spawning the timeout thread");
        dog
    }

    pub(crate) fn watch(&self, submission: &Arc<Submission>) {
        self.submissions.lock().push(Arc::downgrade(submission));
    }

    fn sweep(&self, now: Instant) {
        let due: Vec<Arc<Submission>> = {
            let mut subs = self.submissions.lock();
            let mut due = Vec::new();
            subs.retain(|w| match w.upgrade() {
                None => false,
                Some(s) if now >= s.deadline => {
                    due.push(s);
                    false
                }
                Some(_) => true,
            });
            due
        };
        for s in due {
            s.expire_if_due(now, self.timeout);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crescent_transports::{Region, RegionTable};

    fn setup(capacity: usize) -> (Arc<Batch>, RegionTable) {
        let table = RegionTable::new();
        table.insert(Region::new(0x1000, 0x1000, "cpu:0", None)).unwrap();
        (Batch::new(7, capacity), table)
    }

    fn submission(batch: &Arc<Batch>, table: &RegionTable, slices_per_request: &[usize]) -> Arc<Submission> {
        let base = batch.reserve(slices_per_request.len()).unwrap();
        let mut sub = Submission::new(batch.clone(), Instant::now() + Duration::from_secs(60));
        for (i, &n) in slices_per_request.iter().enumerate() {
            batch.start_request(base + i, n);
            for _ in 0..n {
                sub.add_slice(base + i, table.acquire_local(0x1000, 8).unwrap());
            }
        }
        Arc::new(sub)
    }

    #[test]
    fn request_completes_when_all_its_slices_do() {
        let (batch, table) = setup(4);
        let sub = submission(&batch, &table, &[2, 1]);
        assert_eq!(batch.statuses(), vec![TransferStatus::Pending, TransferStatus::Pending]);
        sub.complete(0, SliceOutcome::Completed);
        assert_eq!(batch.status(0).unwrap(), TransferStatus::Pending);
        sub.complete(1, SliceOutcome::Completed);
        assert_eq!(batch.status(0).unwrap(), TransferStatus::Completed);
        assert_eq!(batch.unfinished(), 1);
        sub.complete(2, SliceOutcome::Failed(FailureReason::peer_gone("boom")));
        assert_eq!(
            batch.statuses(),
            vec![TransferStatus::Completed, TransferStatus::Failed(FailureReason::peer_gone("boom"))]
        );
        assert!(batch.wait(Some(Duration::ZERO)));
        // Every slice released its region.
        assert_eq!(table.find(0x1000, 1).unwrap().inflight(), 0);
    }

    #[test]
    fn first_outcome_wins() {
        let (batch, table) = setup(1);
        let sub = submission(&batch, &table, &[1]);
        sub.complete(0, SliceOutcome::Failed(FailureReason::out_of_range("first")));
        sub.complete(0, SliceOutcome::Completed);
        assert_eq!(batch.status(0).unwrap(), TransferStatus::Failed(FailureReason::out_of_range("first")));
    }

    #[test]
    fn timeout_during_an_access_defers_the_end() {
        let (batch, table) = setup(1);
        let sub = submission(&batch, &table, &[1]);
        assert!(sub.begin_local_access(0));
        assert!(sub.expire_if_due(Instant::now() + Duration::from_secs(61), Duration::from_secs(60)));
        // Timed out, but the access is still running: not ended, region still in use.
        assert_eq!(batch.status(0).unwrap(), TransferStatus::Pending);
        assert_eq!(table.find(0x1000, 1).unwrap().inflight(), 1);
        sub.end_local_access(0);
        assert_eq!(batch.status(0).unwrap(), TransferStatus::TimedOut);
        assert_eq!(table.find(0x1000, 1).unwrap().inflight(), 0);
        // The ended slice refuses further access to its memory.
        assert!(!sub.begin_local_access(0));
    }

    #[test]
    fn a_timeout_during_a_held_claim_aborts_the_access() {
        let (batch, table) = setup(1);
        let sub = submission(&batch, &table, &[1]);
        let aborted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let a = aborted.clone();
        sub.set_abort(
            0,
            Arc::new(move || {
                a.fetch_add(1, Ordering::SeqCst);
            }),
        );
        assert!(sub.begin_local_access(0));
        sub.expire_if_due(Instant::now() + Duration::from_secs(61), Duration::from_secs(60));
        assert_eq!(aborted.load(Ordering::SeqCst), 1, "the transport was told to let go");
        sub.end_local_access(0);
        assert_eq!(batch.status(0).unwrap(), TransferStatus::TimedOut);
    }

    #[test]
    fn batch_capacity_is_enforced() {
        let (batch, _) = setup(3);
        batch.reserve(2).unwrap();
        assert!(matches!(batch.reserve(2), Err(EngineError::BatchFull { .. })));
        batch.reserve(1).unwrap();
    }

    #[test]
    fn future_resolves_when_done() {
        let (batch, table) = setup(1);
        let sub = submission(&batch, &table, &[1]);
        let fut = BatchCompletion { batch: batch.clone() };
        let sub2 = sub.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            sub2.complete(0, SliceOutcome::Completed);
        });
        let statuses = block_on(fut);
        t.join().unwrap();
        assert_eq!(statuses, vec![TransferStatus::Completed]);
    }

    fn block_on<F: Future>(fut: F) -> F::Output {
        use std::task::{Wake, Waker};
        struct Unpark(std::thread::Thread);
        impl Wake for Unpark {
            fn wake(self: Arc<Self>) {
                self.0.unpark();
            }
        }
        let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
        let mut cx = Context::from_waker(&waker);
        let mut fut = std::pin::pin!(fut);
        loop {
            if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
                return v;
            }
            std::thread::park_timeout(Duration::from_millis(50));
        }
    }
}
