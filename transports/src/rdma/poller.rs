//! Completion dispatch: one completion-queue poller thread per device, and the [`Dispatch`]
//! that hands each work completion to the owner of its queue pair ([`CompletionOwner`], a
//! lane) by queue-pair number. It knows owners only through that trait, so this layer sits
//! below the lanes.
//!
//! The poller polls, spins briefly when the queue is empty, then arms the completion channel
//! and sleeps on it (so an idle engine, or a VM with one CPU, does not burn a core).
//!
//! Layer: completion dispatch (the layer map is in the [rdma module](super)).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};

use super::device::Device;
use super::ffi::{self, ibv_wc};

/// What the work completions of a queue pair are handed to (the lane that posts on it).
pub(crate) trait CompletionOwner: Send + Sync {
    /// One work completion of the owner's queue pair.
    fn on_work_completion(self: Arc<Self>, wc: &ibv_wc);
    /// The device's completion queue has room again (the owner asked with
    /// [`Dispatch::wait_for_room`]).
    fn on_cq_room(self: Arc<Self>);
}

/// One device's completion owners by queue-pair number, and the owners waiting for room on
/// its completion queue.
#[derive(Default)]
pub(crate) struct Dispatch {
    owners: RwLock<HashMap<u32, Weak<dyn CompletionOwner>>>,
    /// Owners that could not post for want of completion-queue room.
    starved: Mutex<Vec<Weak<dyn CompletionOwner>>>,
}

impl Dispatch {
    /// Completions of queue pair `qpn` go to `owner` from now on.
    pub fn register(&self, qpn: u32, owner: Weak<dyn CompletionOwner>) {
        self.owners.write().insert(qpn, owner);
    }

    /// Forgets the owner of `qpn` if it is still `owner` (the number may have been given to
    /// a newer queue pair).
    pub fn unregister<T: ?Sized>(&self, qpn: u32, owner: *const T) {
        let mut owners = self.owners.write();
        if owners.get(&qpn).is_some_and(|w| std::ptr::addr_eq(w.as_ptr(), owner)) {
            owners.remove(&qpn);
        }
    }

    /// `owner` is called back ([`CompletionOwner::on_cq_room`]) after the next completions.
    pub fn wait_for_room(&self, owner: Weak<dyn CompletionOwner>) {
        self.starved.lock().push(owner);
    }

    /// Hands each completion to its queue pair's owner, then calls back those waiting for room.
    fn deliver(&self, wcs: &[ibv_wc]) {
        for wc in wcs {
            let owner = self.owners.read().get(&wc.qp_num).and_then(Weak::upgrade);
            let Some(owner) = owner else {
                continue; // a queue pair destroyed since: its slices ended with it
            };
            owner.on_work_completion(wc);
        }
        let starved = std::mem::take(&mut *self.starved.lock());
        for owner in starved.iter().filter_map(Weak::upgrade) {
            owner.on_cq_room();
        }
    }
}

const BATCH: usize = 32;
/// Longest sleep on the completion channel before the stop flag is checked again.
const WAKE_EVERY: Duration = Duration::from_millis(100);

/// Polls `device`'s completion queue until `stop` is set, handing completions to `dispatch`;
/// spins for `spin` on an empty queue before sleeping on the completion channel.
pub(crate) fn run(device: Arc<Device>, dispatch: Arc<Dispatch>, spin: Duration, stop: Arc<AtomicBool>) {
    let verbs = device.verbs.clone();
    let cq = device.cq;
    // SAFETY: the CQ's context is the device's; its ops table has the checked layout.
    let ops = unsafe { &(*(*cq).context).ops };
    let (Some(poll_cq), Some(req_notify)) = (ops.poll_cq, ops.req_notify_cq) else {
        tracing::error!("rdma: {} has no poll_cq/req_notify_cq", device.name);
        return;
    };
    let mut wcs = vec![ibv_wc::zeroed(); BATCH];
    let mut idle_since: Option<Instant> = None;
    while !stop.load(Ordering::Acquire) {
        // SAFETY: a live CQ and room for BATCH completions.
        let n = unsafe { poll_cq(cq, BATCH as i32, wcs.as_mut_ptr()) };
        if n > 0 {
            idle_since = None;
            dispatch.deliver(&wcs[..n as usize]);
            continue;
        }
        if n < 0 {
            tracing::error!("rdma: polling the completion queue of {} failed", device.name);
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        let since = *idle_since.get_or_insert_with(Instant::now);
        if since.elapsed() < spin {
            std::hint::spin_loop();
            continue;
        }
        // Arm, then poll once more: a completion that arrived before arming raises no event.
        // SAFETY: a live CQ.
        unsafe { req_notify(cq, 0) };
        // SAFETY: as above.
        let n = unsafe { poll_cq(cq, BATCH as i32, wcs.as_mut_ptr()) };
        if n > 0 {
            idle_since = None;
            dispatch.deliver(&wcs[..n as usize]);
            continue;
        }
        let fd = device.channel_fd();
        let mut fds = [rustix::event::PollFd::new(&fd, rustix::event::PollFlags::IN)];
        let timeout = rustix::event::Timespec { tv_sec: 0, tv_nsec: WAKE_EVERY.as_nanos() as i64 };
        let _ = rustix::event::poll(&mut fds, Some(&timeout));
        drain_events(&verbs, &device);
        idle_since = None;
    }
    drain_events(&verbs, &device);
}

/// Takes and acknowledges every pending completion event (the channel is non-blocking).
fn drain_events(verbs: &ffi::Verbs, device: &Device) {
    loop {
        let mut cq = std::ptr::null_mut();
        let mut ctx = std::ptr::null_mut();
        // SAFETY: the device's channel; returns -1 (EAGAIN) when no event is pending.
        if unsafe { (verbs.get_cq_event)(device.channel(), &mut cq, &mut ctx) } != 0 {
            return;
        }
        // SAFETY: `cq` is the CQ the event was for; each event is acknowledged once, as
        // destroying the CQ requires.
        unsafe { (verbs.ack_cq_events)(cq, 1) };
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    /// An owner that records what it was handed.
    #[derive(Default)]
    struct Recorder {
        completions: Mutex<Vec<u64>>,
        room: AtomicUsize,
    }

    impl CompletionOwner for Recorder {
        fn on_work_completion(self: Arc<Self>, wc: &ibv_wc) {
            self.completions.lock().push(wc.wr_id);
        }

        fn on_cq_room(self: Arc<Self>) {
            self.room.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn wc(qp_num: u32, wr_id: u64) -> ibv_wc {
        let mut wc = ibv_wc::zeroed();
        wc.qp_num = qp_num;
        wc.wr_id = wr_id;
        wc
    }

    #[test]
    fn completions_reach_the_owner_of_their_queue_pair_only() {
        let d = Dispatch::default();
        let (a, b) = (Arc::new(Recorder::default()), Arc::new(Recorder::default()));
        d.register(7, Arc::<Recorder>::downgrade(&a));
        d.register(9, Arc::<Recorder>::downgrade(&b));
        d.deliver(&[wc(7, 1), wc(9, 2), wc(7, 3), wc(11, 4)]);
        assert_eq!(*a.completions.lock(), vec![1, 3], "in order, and not those of others");
        assert_eq!(*b.completions.lock(), vec![2]);

        // Queue pair number 7 given to a newer owner: the older one leaving does not unhook it.
        let c = Arc::new(Recorder::default());
        d.register(7, Arc::<Recorder>::downgrade(&c));
        d.unregister(7, Arc::as_ptr(&a));
        d.deliver(&[wc(7, 5)]);
        assert_eq!(*c.completions.lock(), vec![5]);
        assert_eq!(*a.completions.lock(), vec![1, 3]);
        d.unregister(7, Arc::as_ptr(&c));
        d.deliver(&[wc(7, 6)]);
        assert_eq!(*c.completions.lock(), vec![5], "unregistered: no more completions");

        // An owner gone without unregistering is skipped.
        drop(b);
        d.deliver(&[wc(9, 7)]);
    }

    #[test]
    fn an_owner_waiting_for_room_is_called_back_once_after_the_next_completions() {
        let d = Dispatch::default();
        let a = Arc::new(Recorder::default());
        d.register(3, Arc::<Recorder>::downgrade(&a));
        d.wait_for_room(Arc::<Recorder>::downgrade(&a));
        assert_eq!(a.room.load(Ordering::Relaxed), 0);
        d.deliver(&[wc(3, 1)]);
        assert_eq!(a.room.load(Ordering::Relaxed), 1);
        d.deliver(&[wc(3, 2)]);
        assert_eq!(a.room.load(Ordering::Relaxed), 1, "once per wait");
        assert_eq!(*a.completions.lock(), vec![1, 2]);
    }
}
