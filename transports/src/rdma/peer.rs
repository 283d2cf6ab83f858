//! The initiator's side of one peer: its lanes (queue pairs, several per device pair), the
//! control connection they were set up through, and the keeper thread that checks the peer
//! is alive and rebuilds broken lanes with backoff. A peer owns its lanes ([`LaneOwner`]):
//! what a lane cannot end itself comes back here to be moved to another lane.
//!
//! Layer: peers (the layer map is in the [rdma module](super)).

use std::io;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};

use super::device::Device;
use super::lane::{Lane, LaneOwner, Leftovers, Work};
use super::mr::RemoteKeys;
use super::qp::Qp;
use super::shared::Shared;
use super::wire::Message;
use crate::{Endpoint, FailureReason, SliceOutcome};

/// Keepalive period of the control connection.
pub const KEEPALIVE: Duration = Duration::from_millis(1000);
/// How long an answer on the control connection may take.
pub const CONTROL_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest wait between two attempts to rebuild a broken lane.
const MAX_BACKOFF: Duration = Duration::from_secs(10);
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// A rebuilt lane that works this long has its backoff start over.
const HEALTHY_FOR: Duration = MAX_BACKOFF;
/// Most devices a peer may list.
pub const MAX_PEER_DEVICES: usize = 64;

pub(crate) struct Peer {
    pub name: String,
    shared: Arc<Shared>,
    remote_devices: Vec<String>,
    remote: Arc<RwLock<RemoteKeys>>,
    lanes: RwLock<Vec<Arc<Lane>>>,
    next: AtomicUsize,
    dead: Mutex<Option<String>>,
    /// Slices waiting for a lane while every lane is being rebuilt.
    parked: Mutex<Vec<Work>>,
    /// Slices moved to another lane after theirs failed.
    failed_over: AtomicU64,
}

fn io_msg(e: &io::Error) -> String {
    e.to_string()
}

/// Resolves and checks an rdma endpoint from a peer's descriptor.
pub fn endpoint_parts(peer: &Endpoint) -> Result<(SocketAddr, Vec<String>), String> {
    let Endpoint::Rdma { host, port, devices } = peer else {
        return Err(format!("{peer} is not an rdma endpoint"));
    };
    if devices.is_empty() || devices.len() > MAX_PEER_DEVICES {
        return Err(format!("{peer} lists {} devices (1..={MAX_PEER_DEVICES} allowed)", devices.len()));
    }
    if *port == 0 {
        return Err(format!("{peer} has port 0"));
    }
    let addr = (host.as_str(), *port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {host}: {e}"))?
        .next()
        .ok_or_else(|| format!("{host} resolves to no address"))?;
    Ok((addr, devices.clone()))
}

impl Peer {
    /// Connects the control connection and every lane; starts the keeper.
    pub fn connect(
        shared: &Arc<Shared>,
        endpoint: &Endpoint,
        remote: Arc<RwLock<RemoteKeys>>,
    ) -> Result<Arc<Peer>, String> {
        let name = endpoint.to_string();
        let (addr, remote_devices) = endpoint_parts(endpoint)?;
        let mut stream = TcpStream::connect_timeout(&addr, shared.config.connect_timeout)
            .map_err(|e| format!("cannot connect to {name}: {}", io_msg(&e)))?;
        stream.set_nodelay(true).map_err(|e| format!("control connection to {name}: {e}"))?;
        let deadline = std::time::Instant::now() + shared.config.connect_timeout;
        shared
            .config
            .auth
            .dial(crate::net::Service::RdmaControl, &mut &stream, Some(deadline))
            .map_err(|e| format!("control connection to {name}: {e}"))?;
        let peer = Arc::new(Peer {
            name: name.clone(),
            shared: shared.clone(),
            remote_devices,
            remote,
            lanes: RwLock::new(Vec::new()),
            next: AtomicUsize::new(0),
            dead: Mutex::new(None),
            parked: Mutex::new(Vec::new()),
            failed_over: AtomicU64::new(0),
        });
        let qpp = shared.config.qps_per_peer;
        let mut lanes = Vec::new();
        for slot in 0..shared.devices.len() * qpp {
            lanes.push(peer.connect_lane(&mut stream, slot as u32)?);
        }
        tracing::debug!(
            "rdma: connected to {name}: {} queue pairs ({})",
            lanes.len(),
            lanes.iter().map(|l| format!("{}->{}", l.qp.device.name, l.remote_device)).collect::<Vec<_>>().join(", ")
        );
        *peer.lanes.write() = lanes;
        let weak = Arc::downgrade(&peer);
        std::thread::Builder::new()
            .name("crescent-rdma-keeper".into())
            .spawn(move || keeper(weak, stream))
            .map_err(|e| format!("cannot start the keeper thread: {e}"))?;
        Ok(peer)
    }

    fn lane_devices(&self, slot: u32) -> (Arc<Device>, String) {
        let i = slot as usize / self.shared.config.qps_per_peer;
        let device = self.shared.devices[i % self.shared.devices.len()].clone();
        let remote = self.remote_devices[i % self.remote_devices.len()].clone();
        (device, remote)
    }

    /// Creates a queue pair for lane `slot` and connects it through the control connection.
    fn connect_lane(self: &Arc<Self>, stream: &mut TcpStream, slot: u32) -> Result<Arc<Lane>, String> {
        let (device, remote_device) = self.lane_devices(slot);
        let cfg = &self.shared.config;
        let depth = cfg.max_send_wr.min(device.max_qp_wr).max(1);
        let qp = Qp::create(&device, depth)?;
        qp.to_init()?;
        Message::Connect {
            slot,
            target_device: remote_device.clone(),
            initiator_device: device.name.clone(),
            qp: qp.info(),
        }
        .write_to(stream)
        .map_err(|e| format!("control connection to {}: {e}", self.name))?;
        let remote_qp = match Message::read(stream, Some(CONTROL_TIMEOUT)) {
            Ok(Message::Accept { slot: s, qp }) if s == slot => qp,
            Ok(Message::Reject { reason }) => return Err(format!("{} refused a queue pair: {reason}", self.name)),
            Ok(other) => return Err(format!("{} answered {other:?} to Connect", self.name)),
            Err(e) => return Err(format!("control connection to {}: {e}", self.name)),
        };
        qp.to_rtr(&remote_qp)?;
        qp.to_rts(&remote_qp, self.shared.timing)?;
        Ok(Lane::new(
            slot,
            qp,
            remote_device,
            depth as usize,
            Arc::<Peer>::downgrade(self),
            self.name.clone(),
            self.shared.mrs.clone(),
            self.remote.clone(),
            self.shared.dispatch[device.index].clone(),
            cfg.max_attempts,
        ))
    }

    pub fn is_dead(&self) -> bool {
        self.dead.lock().is_some()
    }

    pub fn failed_over(&self) -> u64 {
        self.failed_over.load(Ordering::Relaxed)
    }

    pub fn lanes(&self) -> Vec<Arc<Lane>> {
        self.lanes.read().clone()
    }

    /// Spreads slices over the working lanes (chained posts per lane); slices arriving while
    /// every lane is being rebuilt wait for the rebuild.
    pub fn dispatch(&self, works: Vec<Work>, exclude: Option<u32>) {
        if works.is_empty() {
            return;
        }
        if let Some(reason) = self.dead.lock().clone() {
            for w in works {
                w.fail(FailureReason::peer_gone(format!("connection to {} is gone: {reason}", self.name)));
            }
            return;
        }
        let lanes = self.lanes.read().clone();
        let healthy: Vec<&Arc<Lane>> = lanes.iter().filter(|l| !l.is_broken() && Some(l.slot) != exclude).collect();
        let healthy = if healthy.is_empty() { lanes.iter().filter(|l| !l.is_broken()).collect() } else { healthy };
        if healthy.is_empty() {
            self.parked.lock().extend(works);
            return;
        }
        let n = healthy.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let mut groups: Vec<Vec<Work>> = (0..n).map(|_| Vec::new()).collect();
        // Contiguous runs per lane: long requests go out as long chains.
        let per = works.len().div_ceil(n);
        for (i, w) in works.into_iter().enumerate() {
            groups[(start + i / per) % n].push(w);
        }
        for (lane, group) in healthy.into_iter().zip(groups) {
            if !group.is_empty() {
                let left = lane.enqueue(group);
                self.settle(left, Some(lane.slot), false);
            }
        }
    }

    /// Ends and re-dispatches what a lane handed back. `again` is false for slices that were
    /// just re-dispatched once, to never loop between lanes breaking at the same time.
    pub fn settle(&self, left: Leftovers, from: Option<u32>, again: bool) {
        for (w, outcome) in left.done {
            w.finish(outcome);
        }
        if left.reroute.is_empty() {
            return;
        }
        self.failed_over.fetch_add(left.reroute.len() as u64, Ordering::Relaxed);
        if again {
            self.dispatch(left.reroute, from);
        } else {
            // The lane broke between the choice and the post: park for its rebuild.
            let dead = self.dead.lock().clone();
            match dead {
                Some(reason) => {
                    for w in left.reroute {
                        w.fail(FailureReason::peer_gone(format!("connection to {} is gone: {reason}", self.name)));
                    }
                }
                None => self.parked.lock().extend(left.reroute),
            }
        }
    }

    /// The peer is gone: flush every lane; queued and parked slices fail now, posted ones
    /// as their flushed completions arrive.
    pub fn die(&self, reason: &str) {
        {
            let mut dead = self.dead.lock();
            if dead.is_some() {
                return;
            }
            *dead = Some(reason.to_string());
        }
        tracing::warn!("rdma: lost {}: {reason}", self.name);
        let msg = format!("connection to {} is gone: {reason}", self.name);
        for lane in self.lanes.read().iter() {
            for w in lane.break_with(&msg) {
                w.fail(FailureReason::peer_gone(msg.clone()));
            }
        }
        for w in self.parked.lock().drain(..) {
            w.fail(FailureReason::peer_gone(msg.clone()));
        }
    }

    fn take_parked(&self) -> Vec<Work> {
        std::mem::take(&mut *self.parked.lock())
    }
}

impl LaneOwner for Peer {
    fn take_back(&self, left: Leftovers, slot: u32) {
        self.settle(left, Some(slot), true);
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        for w in self.parked.get_mut().drain(..) {
            w.finish(SliceOutcome::Failed(FailureReason::peer_gone(format!("connection to {} was closed", self.name))));
        }
    }
}

/// When one broken lane may be rebuilt. Failed rebuilds back off exponentially
/// ([`FIRST_BACKOFF`] doubling to [`MAX_BACKOFF`]), and so does a lane that breaks again within
/// [`HEALTHY_FOR`] of its rebuild: whatever keeps breaking it (a faulty link, an application
/// that keeps addressing memory the target no longer has) gets one rebuild per backoff period,
/// not one per fault. A lane that stayed healthy that long is rebuilt at once, as is one that
/// breaks for the first time.
#[derive(Debug, Clone)]
struct Backoff {
    delay: Duration,
    /// When the lane was last rebuilt (`None`: it is the first queue pair of its slot).
    rebuilt_at: Option<Instant>,
    /// When the broken lane may be rebuilt; `None`: not decided since it last worked.
    not_before: Option<Instant>,
    /// The last rebuild attempt failed.
    failed: bool,
}

impl Backoff {
    fn new() -> Self {
        Backoff { delay: Duration::ZERO, rebuilt_at: None, not_before: None, failed: false }
    }

    fn grow(&mut self) -> Duration {
        self.delay = (self.delay * 2).clamp(FIRST_BACKOFF, MAX_BACKOFF);
        self.delay
    }

    /// The lane is broken and drained: whether it may be rebuilt at `now`.
    fn may_rebuild(&mut self, now: Instant) -> bool {
        let at = match self.not_before {
            Some(at) => at,
            None => {
                let at = match self.rebuilt_at {
                    Some(t) if now.saturating_duration_since(t) < HEALTHY_FOR => now + self.grow(),
                    _ => {
                        self.delay = Duration::ZERO;
                        now
                    }
                };
                self.not_before = Some(at);
                at
            }
        };
        now >= at
    }

    fn rebuilt(&mut self, now: Instant) {
        self.rebuilt_at = Some(now);
        self.not_before = None;
        self.failed = false;
    }

    /// A rebuild attempt at `now` failed; returns the wait before the next one.
    fn rebuild_failed(&mut self, now: Instant) -> Duration {
        let delay = self.grow();
        self.not_before = Some(now + delay);
        self.failed = true;
        delay
    }
}

/// Keeps the control connection alive (ping every [`KEEPALIVE`]) and rebuilds broken lanes
/// once their posted work has drained, with a [`Backoff`] per lane.
fn keeper(peer: Weak<Peer>, mut stream: TcpStream) {
    let mut last_ping = Instant::now();
    let mut backoff: Vec<Backoff> = Vec::new();
    let tick = Duration::from_millis(50);
    loop {
        std::thread::sleep(tick);
        let Some(peer) = peer.upgrade() else {
            return; // forgotten: dropping the stream tells the target to free its side
        };
        if peer.shared.is_stopping() || peer.is_dead() {
            return;
        }
        let lanes = peer.lanes();
        if backoff.len() < lanes.len() {
            backoff.resize(lanes.len(), Backoff::new());
        }
        let mut failure = None;
        for (i, lane) in lanes.iter().enumerate() {
            if !lane.is_broken() || lane.inflight() > 0 || !backoff[i].may_rebuild(Instant::now()) {
                continue;
            }
            match peer.connect_lane(&mut stream, lane.slot) {
                Ok(new) => {
                    tracing::info!(
                        "rdma: rebuilt queue pair {} -> {} of {} (was {}: {})",
                        new.qp.device.name,
                        new.remote_device,
                        peer.name,
                        lane.qp.qpn,
                        lane.broken_reason().unwrap_or_default()
                    );
                    peer.lanes.write()[i] = new;
                    backoff[i].rebuilt(Instant::now());
                    last_ping = Instant::now();
                }
                Err(e) => {
                    let delay = backoff[i].rebuild_failed(Instant::now());
                    tracing::warn!(
                        "rdma: rebuilding a queue pair to {} failed (next try in {delay:?}): {e}",
                        peer.name
                    );
                    if e.contains("control connection") {
                        failure = Some(e);
                        break;
                    }
                }
            }
        }
        if failure.is_none() {
            let parked = peer.take_parked();
            if !parked.is_empty() {
                if peer.lanes().iter().any(|l| !l.is_broken()) {
                    peer.dispatch(parked, None);
                } else if lanes.iter().zip(&backoff).all(|(l, b)| l.is_broken() && l.inflight() == 0 && b.failed) {
                    // Nothing works and rebuilding failed: do not hold the slices. (A lane only
                    // waiting out its backoff will be rebuilt: they wait for it.)
                    let reason = lanes.first().and_then(|l| l.broken_reason()).unwrap_or_default();
                    for w in parked {
                        w.fail(FailureReason::peer_gone(format!(
                            "no working queue pair to {} (rebuilding after: {reason})",
                            peer.name
                        )));
                    }
                } else {
                    peer.parked.lock().extend(parked);
                }
            }
        }
        if failure.is_none() && last_ping.elapsed() >= KEEPALIVE {
            last_ping = Instant::now();
            let answer =
                Message::Ping.write_to(&mut stream).and_then(|()| Message::read(&mut stream, Some(CONTROL_TIMEOUT)));
            match answer {
                Ok(Message::Pong) => {}
                Ok(other) => failure = Some(format!("unexpected {other:?} on the control connection")),
                Err(e) if e.is_closed() => failure = Some("the peer closed the control connection".into()),
                Err(e) if e.is_idle() => failure = Some(format!("no answer to a ping within {CONTROL_TIMEOUT:?}")),
                Err(e) => failure = Some(format!("control connection: {e}")),
            }
        }
        if let Some(reason) = failure {
            peer.die(&reason);
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Breaks the lane at `at` (drained at once); returns how long its rebuild waits.
    fn breaks(b: &mut Backoff, at: Instant) -> Duration {
        if b.may_rebuild(at) {
            return Duration::ZERO;
        }
        let ready = b.not_before.expect("a rebuild time is set");
        assert!(!b.may_rebuild(ready - Duration::from_millis(1)), "not before its time");
        assert!(b.may_rebuild(ready));
        ready - at
    }

    #[test]
    fn a_lane_that_breaks_again_soon_after_each_rebuild_waits_longer_each_time() {
        let mut b = Backoff::new();
        let mut now = Instant::now();
        let mut waits = Vec::new();
        // A bad request every 50 ms, each breaking the lane right after its rebuild.
        for _ in 0..10 {
            let wait = breaks(&mut b, now);
            waits.push(wait.as_millis());
            now += wait;
            b.rebuilt(now);
            now += Duration::from_millis(50);
        }
        assert_eq!(waits, vec![0, 100, 200, 400, 800, 1600, 3200, 6400, 10_000, 10_000]);
    }

    #[test]
    fn a_lane_that_stayed_healthy_starts_its_backoff_over() {
        let mut b = Backoff::new();
        let mut now = Instant::now();
        for _ in 0..8 {
            now += breaks(&mut b, now);
            b.rebuilt(now);
        }
        assert!(b.delay >= Duration::from_secs(3), "{b:?}");
        now += HEALTHY_FOR;
        assert_eq!(breaks(&mut b, now), Duration::ZERO, "healthy long enough: rebuilt at once");
        b.rebuilt(now);
        assert_eq!(breaks(&mut b, now + Duration::from_millis(1)), FIRST_BACKOFF, "and the backoff starts over");
    }

    #[test]
    fn failed_rebuilds_back_off_until_one_succeeds() {
        let mut b = Backoff::new();
        let now = Instant::now();
        assert!(b.may_rebuild(now), "a first break is rebuilt at once");
        let waits: Vec<Duration> = (0..3).map(|_| b.rebuild_failed(now)).collect();
        assert_eq!(waits, vec![FIRST_BACKOFF, FIRST_BACKOFF * 2, FIRST_BACKOFF * 4]);
        assert!(b.failed && !b.may_rebuild(now + FIRST_BACKOFF * 3));
        assert!(b.may_rebuild(now + FIRST_BACKOFF * 4));
        b.rebuilt(now + FIRST_BACKOFF * 4);
        assert!(!b.failed);
    }
}
