//! The rdma transport: one-sided RDMA READ and WRITE over RC queue pairs (libibverbs).
//!
//! The target side needs no CPU per transfer: its devices check every access against the
//! memory regions it registered (an access outside them fails with a remote access error).
//!
//! Its modules stand in layers, each importing only those below it (checked by
//! `tests/tests/layers.rs`, which holds the same order); where a lower layer must reach up,
//! it owns a trait the higher one implements:
//!
//! ```text
//! transport   mod.rs: the Transport impl, one PeerSlot per peer, connect backoff
//!   peers     wire, shared, peer, server: the queue-pair exchange on a TCP control
//!             connection, keepalive, lane rebuild          (implements lane::LaneOwner)
//!   lanes     lane: posting chained work requests, back-pressure, retries on another lane
//!                                                          (implements poller::CompletionOwner)
//!   dispatch  poller: a completion-queue thread per device, completions to their owner by
//!             queue-pair number (CompletionOwner)
//!   verbs     ffi, device, mr, gpudirect, qp: libibverbs loaded at run time, devices with
//!             their protection domain and completion queue, memory regions (device memory's
//!             too), queue pairs
//!   settings  config: RdmaConfig, read by every layer
//! ```
//!
//! * [`ffi`]: libibverbs loaded at run time (`dlopen`), so binaries start on hosts without it;
//! * [`device`]: device, port, GID and MTU selection; a protection domain and a completion
//!   queue per device;
//! * [`mr`]: every registered region registered on every device; peers' remote keys;
//! * [`gpudirect`]: device memory registered with the devices through a dma-buf or a
//!   peer-memory module (GPUDirect RDMA), or the reason it is staged over tcp instead;
//! * [`qp`]: RC queue pairs and their state changes;
//! * `poller`: one completion-queue thread per device, dispatching by queue-pair number;
//! * `lane`: slices posted as chained work requests with back-pressure, failed ones retried
//!   on another queue pair a bounded number of times;
//! * [`wire`], `server`, `peer`: queue pairs connected through a small exchange on a TCP port
//!   published in [`Endpoint::Rdma`] (several per device pair), kept alive and rebuilt with
//!   backoff.

mod config;
pub mod device;
pub mod ffi;
pub mod gpudirect;
pub(crate) mod lane;
pub mod mr;
pub(crate) mod peer;
mod poller;
pub mod qp;
mod server;
mod shared;
pub mod wire;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::TcpListener;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};

use crate::{Endpoint, Region, RegionKeys, RemoteRegion, Slice, Transport, TransportError, TransportKind};
pub use config::RdmaConfig;
use gpudirect::DevicePath;
use lane::Work;
use mr::RemoteKeys;
use peer::Peer;
use shared::Shared;

/// A peer's connection and when it may be tried again after a failure.
#[derive(Default)]
struct PeerSlot {
    state: Mutex<SlotState>,
}

#[derive(Default)]
struct SlotState {
    peer: Option<Arc<Peer>>,
    failures: u32,
    /// Connection attempts so far (each one a control connection plus its queue pairs).
    attempts: u64,
    retry_at: Option<Instant>,
    last_error: String,
}

/// How a device in use is set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSummary {
    /// The device's name (`mlx5_0`, `rxe0`).
    pub name: String,
    /// The port used (its first active one).
    pub port: u8,
    /// The index of the GID used in the port's GID table.
    pub gid_index: u8,
    /// The GID, as an IPv6 address (`::ffff:a.b.c.d` for RoCE v2 over IPv4).
    pub gid: String,
    /// Path MTU in bytes.
    pub mtu: u32,
}

/// The connection to one peer (for tests and diagnostics).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerStats {
    /// Attempts to connect (or reconnect) to the peer so far; failed ones are spaced out by
    /// a backoff, so a peer that is gone is not hammered however many requests name it.
    pub connect_attempts: u64,
    /// A live connection exists.
    pub connected: bool,
    /// Slices of the live connection moved to another queue pair after theirs failed.
    pub failed_over: u64,
}

/// What one queue pair to a peer has done (for tests and diagnostics).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaneStats {
    /// The local device of the queue pair.
    pub device: String,
    /// The peer's device it is connected to.
    pub remote_device: String,
    /// The local queue-pair number.
    pub qpn: u32,
    /// Slices posted on it.
    pub posted: u64,
    /// Slices whose work completion came back (successful or not).
    pub completed: u64,
    /// It failed and waits to be rebuilt.
    pub broken: bool,
}

/// The rdma [`Transport`]: the devices in use, the exchange listener that targets accept
/// queue pairs on, and one connection (control connection plus queue pairs) per peer.
pub struct RdmaTransport {
    shared: Arc<Shared>,
    port: u16,
    peers: Mutex<HashMap<Endpoint, Arc<PeerSlot>>>,
    remote_keys: Mutex<HashMap<Endpoint, Arc<RwLock<RemoteKeys>>>>,
    /// How each registered region of device memory reaches the devices, by start address.
    device_paths: Mutex<BTreeMap<u64, DevicePath>>,
    /// The log lines about device memory said so far (each is said once).
    said: Mutex<HashSet<String>>,
    /// The queue-pair exchange's accept loop (dropped first when the transport is).
    exchange: Mutex<Option<crate::net::Server>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl std::fmt::Debug for RdmaTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RdmaTransport")
            .field("devices", &self.shared.devices)
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

const MAX_SLICE: u64 = 1 << 30;
const MAX_RECONNECT_DELAY: Duration = Duration::from_secs(5);

impl RdmaTransport {
    /// Loads libibverbs, opens the devices and starts the exchange listener and pollers.
    /// Fails with [`TransportError::Unavailable`] where there is no library or no usable
    /// device (the engine then falls back to tcp).
    pub fn start(config: RdmaConfig) -> Result<Self, TransportError> {
        if config.max_slice_len == 0
            || config.max_slice_len > MAX_SLICE
            || config.qps_per_peer == 0
            || config.qps_per_peer > 64
            || config.max_send_wr == 0
            || config.max_attempts == 0
            || config.ib_timeout > 31
            || config.retry_cnt > 7
            || config.service_level > 15
            || config.ib_port == Some(0)
        {
            return Err(TransportError::InvalidArgument(format!(
                "rdma settings out of range: slice {} (1..={MAX_SLICE}), {} queue pairs per peer \
                 (1..=64), {} work requests per queue pair, {} attempts, timeout {} (0..=31), \
                 retry count {} (0..=7), service level {} (0..=15), port {:?} (1..)",
                config.max_slice_len,
                config.qps_per_peer,
                config.max_send_wr,
                config.max_attempts,
                config.ib_timeout,
                config.retry_cnt,
                config.service_level,
                config.ib_port
            )));
        }
        let unavailable = |why: String| TransportError::Unavailable("rdma", why);
        let verbs = Arc::new(ffi::Verbs::load(config.library.as_deref()).map_err(unavailable)?);
        let devices = device::open_devices(&verbs, &config).map_err(unavailable)?;
        let bind = format!("{}:{}", config.bind_host, config.port);
        let listener =
            TcpListener::bind(&bind).map_err(|source| TransportError::Listen { addr: bind.clone(), source })?;
        let port = listener.local_addr().map_err(|source| TransportError::Listen { addr: bind, source })?.port();
        let shared = Arc::new(Shared::new(config, devices));
        let mut threads = Vec::new();
        let spawn_err = |e: std::io::Error| unavailable(format!("cannot start an rdma thread: {e}"));
        for (d, dispatch) in shared.devices.iter().zip(&shared.dispatch) {
            let (d, dispatch, spin, stop) = (d.clone(), dispatch.clone(), shared.config.poll_spin, shared.stop_flag());
            threads.push(
                std::thread::Builder::new()
                    .name(format!("crescent-rdma-cq-{}", d.name))
                    .spawn(move || poller::run(d, dispatch, spin, stop))
                    .map_err(spawn_err)?,
            );
        }
        let exchange = server::start(shared.clone(), listener).map_err(spawn_err)?;
        tracing::debug!(
            "rdma transport on {} (exchange port {port})",
            shared
                .devices
                .iter()
                .map(|d| format!("{} port {} GID {}", d.name, d.port, d.gid_index))
                .collect::<Vec<_>>()
                .join(", ")
        );
        Ok(RdmaTransport {
            shared,
            port,
            peers: Mutex::new(HashMap::new()),
            remote_keys: Mutex::new(HashMap::new()),
            device_paths: Mutex::new(BTreeMap::new()),
            said: Mutex::new(HashSet::new()),
            exchange: Mutex::new(Some(exchange)),
            threads: Mutex::new(threads),
        })
    }

    /// Names of the devices in use.
    pub fn devices(&self) -> Vec<String> {
        self.shared.devices.iter().map(|d| d.name.clone()).collect()
    }

    /// The TCP port of the queue-pair exchange listener (published in [`Endpoint::Rdma`]).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// How each device in use is set up.
    pub fn device_summary(&self) -> Vec<DeviceSummary> {
        self.shared
            .devices
            .iter()
            .map(|d| DeviceSummary {
                name: d.name.clone(),
                port: d.port,
                gid_index: d.gid_index,
                gid: d.gid_string(),
                mtu: device::mtu_bytes(d.mtu),
            })
            .collect()
    }

    /// Per queue pair counters of the connection to `peer` (empty if not connected).
    pub fn lane_stats(&self, peer: &Endpoint) -> Vec<LaneStats> {
        let slot = self.peers.lock().get(peer).cloned();
        let Some(peer) = slot.and_then(|s| s.state.lock().peer.clone()) else {
            return Vec::new();
        };
        peer.lanes()
            .iter()
            .map(|l| LaneStats {
                device: l.qp.device.name.clone(),
                remote_device: l.remote_device.clone(),
                qpn: l.qp.qpn,
                posted: l.posted.load(Ordering::Relaxed),
                completed: l.completed.load(Ordering::Relaxed),
                broken: l.is_broken(),
            })
            .collect()
    }

    /// Connection attempts and failovers for `peer`.
    pub fn peer_stats(&self, peer: &Endpoint) -> PeerStats {
        let Some(slot) = self.peers.lock().get(peer).cloned() else {
            return PeerStats::default();
        };
        let st = slot.state.lock();
        let live = st.peer.as_ref().filter(|p| !p.is_dead());
        PeerStats {
            connect_attempts: st.attempts,
            connected: live.is_some(),
            failed_over: live.map_or(0, |p| p.failed_over()),
        }
    }

    /// Fault injection for tests: moves one queue pair to `peer` that has work requests
    /// outstanding to the error state, as a device does after a fatal error, so that they
    /// complete with errors (flushed). The transport is not told: it learns it from those
    /// completions, as from a real fault. Returns the queue pair's number, or `None` when no
    /// queue pair has work outstanding.
    #[doc(hidden)]
    pub fn inject_queue_pair_error(&self, peer: &Endpoint) -> Option<u32> {
        let slot = self.peers.lock().get(peer).cloned()?;
        let peer = slot.state.lock().peer.clone()?;
        peer.lanes().iter().find(|l| l.inject_error()).map(|l| l.qp.qpn)
    }

    /// Turns the transport off if no queue pair to or from a peer was set up yet: peers that
    /// still try it are refused (and use another transport), and connecting out fails. True
    /// if it is off (now or before). For an engine that cannot register its memory with the
    /// devices: it then withdraws its rdma endpoint and registers without rdma.
    pub fn withdraw_if_unused(&self) -> bool {
        self.shared.withdraw_if_unused()
    }

    /// Whether [`Self::withdraw_if_unused`] turned the transport off.
    pub fn is_withdrawn(&self) -> bool {
        self.shared.is_withdrawn()
    }

    /// How the registered region of device memory that starts at `addr` reaches the devices:
    /// GPUDirect (through a dma-buf or a peer-memory module) or staged over tcp, and why.
    /// `None` where no region of device memory starts there.
    pub fn device_path(&self, addr: u64) -> Option<DevicePath> {
        self.device_paths.lock().get(&addr).cloned()
    }

    /// Says how device memory at `location` reaches the devices, once per distinct line.
    fn say_device_path(&self, location: &str, path: &DevicePath) {
        let line = match path {
            DevicePath::DmaBuf => {
                format!("rdma: device memory ({location}) is registered with the NIC through a dma-buf: GPUDirect RDMA")
            }
            DevicePath::PeerMemory => format!(
                "rdma: device memory ({location}) is registered with the NIC through a peer-memory module (nvidia-peermem): GPUDirect RDMA"
            ),
            DevicePath::Staged(why) => format!(
                "rdma: device memory ({location}) is not registered with the NIC, no GPUDirect RDMA ({why}); \
                 requests that touch it go over tcp, staged through pinned host buffers"
            ),
        };
        if self.said.lock().insert(line.clone()) {
            match path {
                DevicePath::Staged(_) => tracing::warn!("{line}"),
                _ => tracing::info!("{line}"),
            }
        }
    }

    fn keys_of(&self, peer: &Endpoint) -> Arc<RwLock<RemoteKeys>> {
        self.remote_keys.lock().entry(peer.clone()).or_default().clone()
    }

    /// The live connection to `peer`, connecting (at most every so often after failures).
    fn peer(&self, endpoint: &Endpoint) -> Result<Arc<Peer>, String> {
        let slot = self.peers.lock().entry(endpoint.clone()).or_default().clone();
        let mut st = slot.state.lock();
        if let Some(p) = &st.peer {
            if !p.is_dead() {
                return Ok(p.clone());
            }
        }
        st.peer = None;
        let now = Instant::now();
        if let Some(at) = st.retry_at.filter(|at| *at > now) {
            return Err(format!("{endpoint} is unreachable ({}); next attempt in {:?}", st.last_error, at - now));
        }
        self.shared.begin_use()?;
        st.attempts += 1;
        match Peer::connect(&self.shared, endpoint, self.keys_of(endpoint)) {
            Ok(p) => {
                st.failures = 0;
                st.retry_at = None;
                st.peer = Some(p.clone());
                Ok(p)
            }
            Err(e) => {
                st.failures += 1;
                let delay = (Duration::from_millis(50) * 2u32.saturating_pow(st.failures)).min(MAX_RECONNECT_DELAY);
                st.retry_at = Some(now + delay);
                st.last_error = e.clone();
                Err(e)
            }
        }
    }
}

impl Transport for RdmaTransport {
    fn kind(&self) -> TransportKind {
        TransportKind::Rdma
    }

    fn endpoint(&self) -> Endpoint {
        Endpoint::Rdma { host: self.shared.config.advertise_host.clone(), port: self.port, devices: self.devices() }
    }

    fn max_slice_len(&self) -> u64 {
        self.shared.config.max_slice_len
    }

    fn register_region(&self, region: &Arc<Region>) -> Result<RegionKeys, TransportError> {
        if let Some(memory) = region.device() {
            // GPUDirect where the driver and the NICs allow it; else the engine moves requests
            // that touch this memory over tcp, staged (see `gpudirect`).
            let peer_memory = self.shared.config.peer_memory.unwrap_or_else(gpudirect::peer_memory_loaded);
            let (rdma, path) = gpudirect::register(
                &self.shared.mrs,
                &self.shared.devices,
                memory,
                region.addr(),
                region.len(),
                peer_memory,
            );
            self.say_device_path(&memory.location(), &path);
            self.device_paths.lock().insert(region.addr(), path);
            return Ok(RegionKeys { rdma });
        }
        let rdma = self.shared.mrs.register(&self.shared.devices, region.addr(), region.len())?;
        Ok(RegionKeys { rdma })
    }

    fn unregister_region(&self, region: &Arc<Region>) -> Result<(), TransportError> {
        self.shared.mrs.unregister(region.addr());
        self.device_paths.lock().remove(&region.addr());
        Ok(())
    }

    fn connect(&self, peer: &Endpoint) -> Result<(), TransportError> {
        self.peer(peer).map(|_| ()).map_err(|e| TransportError::Unavailable("rdma", e))
    }

    fn set_peer_regions(&self, peer: &Endpoint, regions: Vec<RemoteRegion>) {
        *self.keys_of(peer).write() = RemoteKeys::from_regions(regions);
    }

    fn submit(&self, peer: &Endpoint, slices: Vec<Slice>) {
        if slices.is_empty() {
            return;
        }
        match self.peer(peer) {
            Ok(p) => p.dispatch(slices.into_iter().map(Work::new).collect(), None),
            Err(reason) => {
                for s in slices {
                    s.completion.fail(crate::FailureReason::peer_gone(reason.clone()));
                }
            }
        }
    }

    fn forget_peer(&self, peer: &Endpoint) {
        self.peers.lock().remove(peer);
        self.remote_keys.lock().remove(peer);
    }
}

impl Drop for RdmaTransport {
    fn drop(&mut self) {
        self.shared.stop();
        // Closes the exchange port and ends every control connection (their queue pairs go).
        drop(self.exchange.lock().take());
        self.peers.lock().clear();
        for t in self.threads.lock().drain(..) {
            let _ = t.join();
        }
        self.shared.mrs.clear();
    }
}
