//! A lane: one connected RC queue pair to a peer, the slices queued for it and those posted
//! on it. Slices are posted as chained work-request lists, as many as the queue pair and
//! the device's completion queue have room for; the rest wait in the lane's queue and are
//! posted as completions free room (back-pressure, never an error).
//!
//! Only every [`SIGNAL_EVERY`]th work request and the last of each chain ask for a completion:
//! on an RC queue pair work requests complete in order, so a completion also ends every
//! request posted before it (successfully, unless the queue pair had already failed). Errors
//! are reported whether or not a request was signaled.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::{Mutex, RwLock};

use super::ffi::{self, ibv_send_wr, ibv_sge, ibv_wc};
use super::mr::{MrTable, RemoteKeys};
use super::peer::Peer;
use super::qp::Qp;
use crate::{Abort, Completion, FailureReason, LocalClaim, Opcode, Slice, SliceOutcome};

/// One work request in this many asks for a completion (and the last of each chain).
pub const SIGNAL_EVERY: usize = 16;

/// A slice on its way through the transport.
pub(crate) struct Work {
    pub opcode: Opcode,
    pub local_addr: u64,
    pub remote_addr: u64,
    pub len: u64,
    pub completion: Completion,
    /// Failed attempts so far.
    pub attempts: u32,
    /// Held from posting until the work request completes: the device uses the memory.
    claim: Option<LocalClaim>,
}

impl Work {
    pub fn new(s: Slice) -> Work {
        Work {
            opcode: s.opcode,
            local_addr: s.local_addr,
            remote_addr: s.remote_addr,
            len: s.len,
            completion: s.completion,
            attempts: 0,
            claim: None,
        }
    }

    /// Ends the slice; its end is reported once the device no longer uses its memory.
    pub fn finish(mut self, outcome: SliceOutcome) {
        let claim = self.claim.take();
        self.completion.complete(outcome);
        drop(claim);
    }

    pub fn fail(self, reason: FailureReason) {
        self.finish(SliceOutcome::Failed(reason))
    }

    fn describe(&self) -> String {
        let op = match self.opcode {
            Opcode::Read => "read",
            Opcode::Write => "write",
        };
        format!("RDMA {op} of [{:#x}, +{})", self.remote_addr, self.len)
    }
}

/// What a lane hands back to its caller to do outside its lock.
#[derive(Default)]
pub(crate) struct Leftovers {
    /// Slices to end with this outcome.
    pub done: Vec<(Work, SliceOutcome)>,
    /// Slices to move to another lane (this one broke).
    pub reroute: Vec<Work>,
}

impl Leftovers {
    pub fn is_empty(&self) -> bool {
        self.done.is_empty() && self.reroute.is_empty()
    }

    /// Counts a failed attempt of `work`: it is moved to another lane, or fails with `why` once
    /// it has had `max_attempts`. Every slice that failed on a lane goes through here, whether
    /// its own completion said so or a later one ended it.
    fn retry_or_fail(&mut self, mut work: Work, max_attempts: u32, peer: &str, why: impl FnOnce() -> String) {
        work.attempts += 1;
        work.claim = None;
        if work.attempts >= max_attempts {
            let reason = format!("{} on {peer} failed after {} attempts: {}", work.describe(), work.attempts, why());
            self.done.push((work, SliceOutcome::Failed(FailureReason::peer_gone(reason))));
        } else {
            self.reroute.push(work);
        }
    }

    /// Ends the slices posted before one whose completion arrived: completed if `ok`, else
    /// (flushed) each one counts a failed attempt like the completed one's.
    fn end_earlier(
        &mut self,
        earlier: Vec<Work>,
        ok: bool,
        max_attempts: u32,
        peer: &str,
        why: impl Fn() -> String + Copy,
    ) {
        for w in earlier {
            if ok {
                self.done.push((w, SliceOutcome::Completed));
            } else {
                self.retry_or_fail(w, max_attempts, peer, why);
            }
        }
    }
}

struct LaneState {
    queue: VecDeque<Work>,
    /// Posted work, indexed by work-request id.
    slots: Vec<Option<Work>>,
    free: Vec<usize>,
    /// Posted work-request ids in posting order (= completion order).
    order: VecDeque<usize>,
    /// Work requests posted since the last signaled one.
    unsignaled: usize,
    inflight: usize,
    broken: Option<String>,
}

pub(crate) struct Lane {
    pub slot: u32,
    pub qp: Qp,
    pub remote_device: String,
    depth: usize,
    pub peer: Weak<Peer>,
    pub peer_name: String,
    mrs: Arc<MrTable>,
    remote: Arc<RwLock<RemoteKeys>>,
    state: Mutex<LaneState>,
    pub posted: AtomicU64,
    pub completed: AtomicU64,
    /// Handed with every claim: a slice whose deadline passes while posted here flushes the
    /// queue pair, so that its memory is released (and the slice ends) at once.
    abort: Abort,
}

impl Lane {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        slot: u32,
        qp: Qp,
        remote_device: String,
        depth: usize,
        peer: Weak<Peer>,
        peer_name: String,
        mrs: Arc<MrTable>,
        remote: Arc<RwLock<RemoteKeys>>,
    ) -> Arc<Lane> {
        let lane = Arc::new_cyclic(|me: &Weak<Lane>| Lane {
            abort: {
                let me = me.clone();
                Arc::new(move || {
                    if let Some(lane) = me.upgrade() {
                        lane.abort_overdue();
                    }
                })
            },
            slot,
            qp,
            remote_device,
            depth,
            peer,
            peer_name,
            mrs,
            remote,
            state: Mutex::new(LaneState {
                queue: VecDeque::new(),
                slots: Vec::new(),
                free: Vec::new(),
                order: VecDeque::new(),
                unsignaled: 0,
                inflight: 0,
                broken: None,
            }),
            posted: AtomicU64::new(0),
            completed: AtomicU64::new(0),
        });
        lane.qp.device.lanes.write().insert(lane.qp.qpn, Arc::downgrade(&lane));
        lane
    }

    pub fn is_broken(&self) -> bool {
        self.state.lock().broken.is_some()
    }

    pub fn broken_reason(&self) -> Option<String> {
        self.state.lock().broken.clone()
    }

    /// Work requests posted and not yet completed.
    pub fn inflight(&self) -> usize {
        self.state.lock().inflight
    }

    /// Marks the lane broken and flushes what it has posted (each flushed slice completes
    /// with an error and moves to another lane). Returns the slices still queued.
    pub fn break_with(&self, reason: &str) -> Vec<Work> {
        let mut st = self.state.lock();
        if st.broken.is_none() {
            st.broken = Some(reason.to_string());
            self.qp.to_error();
        }
        st.queue.drain(..).collect()
    }

    /// Moves the queue pair to the error state if it has work requests outstanding, without
    /// marking the lane broken: the lane learns of it from the failed completions (test hook
    /// behind `RdmaTransport::inject_queue_pair_error`).
    pub fn inject_error(&self) -> bool {
        let st = self.state.lock();
        if st.broken.is_some() || st.inflight == 0 {
            return false;
        }
        self.qp.to_error();
        true
    }

    /// A slice posted here passed its deadline: flushes the queue pair (as a device fault
    /// would), so that the device lets go of every posted slice's memory now; the lane learns
    /// of it from the flushed completions, and the other slices move to another lane.
    fn abort_overdue(&self) {
        if self.inject_error() {
            tracing::info!(
                "rdma: a slice on queue pair {} to {} passed its deadline; flushing the queue pair",
                self.qp.qpn,
                self.peer_name
            );
        }
    }

    /// Queues slices and posts what fits. Slices a broken lane cannot take come back in
    /// `reroute`.
    pub fn enqueue(self: &Arc<Self>, works: Vec<Work>) -> Leftovers {
        let mut st = self.state.lock();
        if st.broken.is_some() {
            return Leftovers { done: Vec::new(), reroute: works };
        }
        st.queue.extend(works);
        self.pump_locked(&mut st)
    }

    /// Posts queued slices if there is room.
    pub fn pump(self: &Arc<Self>) -> Leftovers {
        let mut st = self.state.lock();
        if st.broken.is_some() {
            let reroute = st.queue.drain(..).collect();
            return Leftovers { done: Vec::new(), reroute };
        }
        self.pump_locked(&mut st)
    }

    fn pump_locked(self: &Arc<Self>, st: &mut LaneState) -> Leftovers {
        let mut out = Leftovers::default();
        let device = &self.qp.device;
        while !st.queue.is_empty() {
            let room = self.depth.saturating_sub(st.inflight);
            let want = room.min(st.queue.len());
            if want == 0 {
                return out; // the queue pair is full: completions will pump again
            }
            let credits = device.take_cq_room(want);
            if credits == 0 {
                device.starved.lock().push(Arc::downgrade(self));
                return out;
            }
            let mut wrs: Vec<ibv_send_wr> = Vec::with_capacity(credits);
            let mut sges: Vec<ibv_sge> = Vec::with_capacity(credits);
            let mut ids: Vec<usize> = Vec::with_capacity(credits);
            let remote = self.remote.read();
            while ids.len() < credits {
                let Some(mut work) = st.queue.pop_front() else {
                    break;
                };
                if work.claim.is_none() {
                    match work.completion.claim_local_abortable(&self.abort) {
                        Some(c) => work.claim = Some(c),
                        None => {
                            // The slice already ended (timed out): nothing to move.
                            out.done.push((work, SliceOutcome::Failed(FailureReason::local("slice ended"))));
                            continue;
                        }
                    }
                }
                let Some(lkey) = self.mrs.lkey(work.local_addr, work.len, device.index) else {
                    let reason = format!(
                        "local range [{:#x}, +{}) is not registered with {}",
                        work.local_addr, work.len, device.name
                    );
                    out.done.push((work, SliceOutcome::Failed(FailureReason::local(reason))));
                    continue;
                };
                let Some(rkey) = remote.rkey(work.remote_addr, work.len, &self.remote_device) else {
                    let reason = format!(
                        "{}: {} lists no key of device {} for that range",
                        work.describe(),
                        self.peer_name,
                        self.remote_device
                    );
                    out.done.push((work, SliceOutcome::Failed(FailureReason::out_of_range(reason))));
                    continue;
                };
                let id = match st.free.pop() {
                    Some(i) => i,
                    None => {
                        st.slots.push(None);
                        st.slots.len() - 1
                    }
                };
                sges.push(ibv_sge { addr: work.local_addr, length: work.len as u32, lkey });
                let mut wr = ibv_send_wr::zeroed();
                wr.wr_id = id as u64;
                wr.num_sge = 1;
                wr.opcode = match work.opcode {
                    Opcode::Read => ffi::IBV_WR_RDMA_READ,
                    Opcode::Write => ffi::IBV_WR_RDMA_WRITE,
                };
                wr.remote_addr = work.remote_addr;
                wr.rkey = rkey;
                wrs.push(wr);
                st.slots[id] = Some(work);
                ids.push(id);
            }
            drop(remote);
            if credits > ids.len() {
                device.give_cq_room(credits - ids.len());
            }
            if ids.is_empty() {
                continue;
            }
            let n = wrs.len();
            for i in 0..n {
                wrs[i].sg_list = &mut sges[i];
                wrs[i].next = if i + 1 < n { &mut wrs[i + 1] } else { std::ptr::null_mut() };
                st.unsignaled += 1;
                if i + 1 == n || st.unsignaled >= SIGNAL_EVERY {
                    wrs[i].send_flags = ffi::IBV_SEND_SIGNALED;
                    st.unsignaled = 0;
                }
            }
            let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
            let qp = self.qp.raw();
            // SAFETY: `qp` is a live queue pair; `post_send` comes from its context's ops
            // table (checked layout). The chain and its scatter entries live until the call
            // returns; the memory they name is registered and claimed until completion.
            let rc = unsafe {
                let ops = &(*(*qp).context).ops;
                match ops.post_send {
                    Some(post) => post(qp, wrs.as_mut_ptr(), &mut bad),
                    None => libc_enosys(),
                }
            };
            st.inflight += n;
            if rc == 0 {
                st.order.extend(ids.iter().copied());
                self.posted.fetch_add(n as u64, Ordering::Relaxed);
                continue;
            }
            // Work requests from `bad` on were not posted.
            let first_bad = if bad.is_null() {
                0
            } else {
                // SAFETY: `bad` points into `wrs` (the library returns the failed element).
                (unsafe { bad.offset_from(wrs.as_ptr()) }).clamp(0, n as isize) as usize
            };
            self.posted.fetch_add(first_bad as u64, Ordering::Relaxed);
            // What was posted may end without a signaled request: the queue pair is broken
            // below, and flushed requests complete whether signaled or not.
            st.order.extend(ids[..first_bad].iter().copied());
            for &id in ids[first_bad..].iter().rev() {
                if let Some(mut w) = st.slots[id].take() {
                    w.claim = None;
                    st.queue.push_front(w);
                }
                st.free.push(id);
                st.inflight -= 1;
                device.give_cq_room(1);
            }
            let err = std::io::Error::from_raw_os_error(rc);
            let reason = format!("posting to queue pair {} failed: {err}", self.qp.qpn);
            tracing::warn!("rdma: {} to {}: {reason}", self.qp.device.name, self.peer_name);
            st.broken = Some(reason);
            self.qp.to_error();
            out.reroute.extend(st.queue.drain(..));
            return out;
        }
        out
    }

    /// Handles one work completion of this lane's queue pair. The slice ends, or comes back
    /// in `reroute` with its attempt counted when the error is worth another try elsewhere.
    pub fn on_completion(self: &Arc<Self>, wc: &ibv_wc, max_attempts: u32) -> Leftovers {
        let device = &self.qp.device;
        let mut st = self.state.lock();
        let id = wc.wr_id as usize;
        let status = wc.status;
        // Requests posted before this one ended before it: successfully if this one did or
        // if this is the queue pair's first error; flushed if it had already failed.
        let earlier_ok = status == ffi::IBV_WC_SUCCESS || st.broken.is_none();
        let mut earlier = Vec::new();
        let mut work = None;
        if st.slots.get(id).is_some_and(Option::is_some) {
            while let Some(done) = st.order.pop_front() {
                let w = st.slots[done].take();
                st.free.push(done);
                st.inflight -= 1;
                device.give_cq_room(1);
                self.completed.fetch_add(1, Ordering::Relaxed);
                if done == id {
                    work = w;
                    break;
                }
                earlier.extend(w);
            }
        }
        let status_text =
            || format!("{} (status {status}, vendor error {:#x})", device.verbs.status_str(status), wc.vendor_err);
        if status != ffi::IBV_WC_SUCCESS && st.broken.is_none() {
            let reason = format!("queue pair {} broke: {}", self.qp.qpn, status_text());
            if status != ffi::IBV_WC_WR_FLUSH_ERR {
                tracing::warn!("rdma: {} -> {} ({}): {reason}", device.name, self.peer_name, self.remote_device);
            }
            st.broken = Some(reason);
            self.qp.to_error();
        }
        let mut out = if st.broken.is_some() {
            Leftovers { done: Vec::new(), reroute: st.queue.drain(..).collect() }
        } else {
            self.pump_locked(&mut st)
        };
        let broken = st.broken.clone();
        drop(st);
        let why = || broken.clone().unwrap_or_else(status_text);
        out.end_earlier(earlier, earlier_ok, max_attempts, &self.peer_name, why);
        let Some(work) = work else {
            return out;
        };
        match status {
            ffi::IBV_WC_SUCCESS => out.done.push((work, SliceOutcome::Completed)),
            ffi::IBV_WC_REM_ACCESS_ERR | ffi::IBV_WC_REM_INV_REQ_ERR => {
                let reason = format!(
                    "{} on {} failed: remote access error, the range is outside the target's \
                     registered memory ({})",
                    work.describe(),
                    self.peer_name,
                    status_text()
                );
                out.done.push((work, SliceOutcome::Failed(FailureReason::out_of_range(reason))));
            }
            ffi::IBV_WC_LOC_PROT_ERR | ffi::IBV_WC_LOC_ACCESS_ERR | ffi::IBV_WC_LOC_LEN_ERR => {
                let reason = format!(
                    "{} to local [{:#x}, +{}) failed: local memory error ({})",
                    work.describe(),
                    work.local_addr,
                    work.len,
                    status_text()
                );
                out.done.push((work, SliceOutcome::Failed(FailureReason::local(reason))));
            }
            _ => out.retry_or_fail(work, max_attempts, &self.peer_name, why),
        }
        out
    }
}

impl Drop for Lane {
    fn drop(&mut self) {
        let mut lanes = self.qp.device.lanes.write();
        if lanes.get(&self.qp.qpn).is_some_and(|w| std::ptr::eq(w.as_ptr(), self)) {
            lanes.remove(&self.qp.qpn);
        }
        drop(lanes);
        // Posted work still here: the queue pair is destroyed right after (no more DMA), so
        // the slices end as failed when their completions drop.
        let st = self.state.get_mut();
        if st.inflight > 0 {
            self.qp.device.give_cq_room(st.inflight);
        }
    }
}

fn libc_enosys() -> i32 {
    38
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CompletionSink;

    #[derive(Default)]
    struct Ended(Mutex<Vec<(usize, SliceOutcome)>>);

    impl CompletionSink for Ended {
        fn begin_local_access(&self, _: usize) -> bool {
            true
        }
        fn end_local_access(&self, _: usize) {}
        fn complete(&self, slice: usize, outcome: SliceOutcome) {
            self.0.lock().push((slice, outcome));
        }
    }

    fn work(sink: &Arc<Ended>, slice: usize, attempts: u32) -> Work {
        let mut w = Work::new(Slice {
            opcode: Opcode::Read,
            local_addr: 0x1000,
            remote_addr: 0x2000 + slice as u64 * 4096,
            len: 4096,
            completion: Completion::new(sink.clone(), slice),
        });
        w.attempts = attempts;
        w
    }

    fn ended(sink: &Ended, out: Leftovers) -> Vec<(usize, SliceOutcome)> {
        for (w, outcome) in out.done {
            w.finish(outcome);
        }
        let mut ended = sink.0.lock().clone();
        ended.sort_by_key(|(slice, _)| *slice);
        ended
    }

    #[test]
    fn flushed_slices_posted_before_a_failed_one_are_retried_only_until_their_attempts_are_spent() {
        let sink = Arc::new(Ended::default());
        let mut out = Leftovers::default();
        // Three attempts allowed; slice 2 has failed twice already (on two other queue pairs).
        let earlier = vec![work(&sink, 0, 0), work(&sink, 1, 1), work(&sink, 2, 2)];
        out.end_earlier(earlier, false, 3, "peer", || "queue pair 7 broke: flushed".into());
        let rerouted: Vec<(u64, u32)> = out.reroute.iter().map(|w| (w.remote_addr, w.attempts)).collect();
        assert_eq!(rerouted, vec![(0x2000, 1), (0x3000, 2)], "two move on, their attempt counted");
        let ended = ended(&sink, out);
        assert_eq!(ended.len(), 1, "{ended:?}");
        assert_eq!(ended[0].0, 2, "the one out of attempts fails");
        assert!(
            matches!(&ended[0].1, SliceOutcome::Failed(r) if r.message.contains("after 3 attempts") && r.message.contains("flushed")),
            "{ended:?}"
        );
    }

    #[test]
    fn slices_posted_before_a_successful_completion_completed() {
        let sink = Arc::new(Ended::default());
        let mut out = Leftovers::default();
        out.end_earlier(vec![work(&sink, 0, 2), work(&sink, 1, 0)], true, 3, "peer", || unreachable!());
        assert!(out.reroute.is_empty());
        let ended = ended(&sink, out);
        assert_eq!(ended, vec![(0, SliceOutcome::Completed), (1, SliceOutcome::Completed)]);
    }
}
