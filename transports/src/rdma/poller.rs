//! One completion-queue poller thread per device: it polls, spins briefly when the queue is
//! empty, then arms the completion channel and sleeps on it (so an idle engine, or a VM with
//! one CPU, does not burn a core).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::device::Device;
use super::ffi::{self, ibv_wc};
use super::lane::Leftovers;
use super::Shared;

const BATCH: usize = 32;
/// Longest sleep on the completion channel before the stop flag is checked again.
const WAKE_EVERY: Duration = Duration::from_millis(100);

pub(crate) fn run(shared: Arc<Shared>, device: Arc<Device>) {
    let verbs = device.verbs.clone();
    let cq = device.cq;
    // SAFETY: the CQ's context is the device's; its ops table has the checked layout.
    let ops = unsafe { &(*(*cq).context).ops };
    let (Some(poll_cq), Some(req_notify)) = (ops.poll_cq, ops.req_notify_cq) else {
        tracing::error!("rdma: {} has no poll_cq/req_notify_cq", device.name);
        return;
    };
    let mut wcs = vec![ibv_wc::zeroed(); BATCH];
    let spin = shared.config.poll_spin;
    let mut idle_since: Option<Instant> = None;
    while !shared.is_stopping() {
        // SAFETY: a live CQ and room for BATCH completions.
        let n = unsafe { poll_cq(cq, BATCH as i32, wcs.as_mut_ptr()) };
        if n > 0 {
            idle_since = None;
            handle(&shared, &device, &wcs[..n as usize]);
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
            handle(&shared, &device, &wcs[..n as usize]);
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

fn handle(shared: &Arc<Shared>, device: &Arc<Device>, wcs: &[ibv_wc]) {
    for wc in wcs {
        let lane = device.lanes.read().get(&wc.qp_num).and_then(std::sync::Weak::upgrade);
        let Some(lane) = lane else {
            continue; // a queue pair destroyed since: its slices ended with it
        };
        let left = lane.on_completion(wc, shared.config.max_attempts);
        settle(&lane, left);
    }
    let starved = std::mem::take(&mut *device.starved.lock());
    for lane in starved.iter().filter_map(std::sync::Weak::upgrade) {
        let left = lane.pump();
        settle(&lane, left);
    }
}

fn settle(lane: &Arc<super::lane::Lane>, left: Leftovers) {
    if left.is_empty() {
        return;
    }
    match lane.peer.upgrade() {
        Some(peer) => peer.settle(left, Some(lane.slot), true),
        None => {
            for (w, outcome) in left.done {
                w.finish(outcome);
            }
            for w in left.reroute {
                w.fail(crate::FailureReason::peer_gone(format!("connection to {} was closed", lane.peer_name)));
            }
        }
    }
}
