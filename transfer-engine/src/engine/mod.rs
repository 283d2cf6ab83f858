//! The transfer engine: registration, segments, batches and transport selection.

use std::collections::HashMap;
use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crescent_transports::device::{DeviceMemory, Devices, Location, Placement};
use crescent_transports::net::Auth;
use crescent_transports::rdma::gpudirect::DevicePath;
use crescent_transports::rdma::{RdmaConfig, RdmaTransport};
use crescent_transports::shm::{ShmConfig, ShmTransport};
use crescent_transports::tcp::{TcpConfig, TcpTransport};
use crescent_transports::{
    Endpoint, Opcode, Region, RegionKeys, RegionTable, RemoteRegion, SharedMemory, Transport, TransportError,
    TransportKind,
};
use parking_lot::{Mutex, RwLock};

use crate::batch::{Batch, BatchCompletion, BatchId, TransferStatus, Watchdog};
use crate::config::{EngineConfig, P2P_HANDSHAKE};
use crate::descriptor::{BufferDescriptor, SegmentDescriptor};
use crate::error::{EngineError, Result};
use crate::handshake::{self, HandshakeServer};
use crate::host;
use crate::memory::{LocalLoan, RegisteredMemory};
use crate::metadata::{Directory, RpcMeta, ServiceAddress};
use crate::notify::{self, Notification, NotifyQueue, Outbox};

mod submit;

/// Handle of an opened segment.
pub type SegmentId = u64;

/// How long an unregister waits for a peer's access in progress to end.
const UNREGISTER_WAIT: Duration = Duration::from_secs(5);
/// How long a request for an address its segment's cached descriptor does not list keeps
/// reading the descriptor again (the owner may still be registering that memory) before it
/// fails out of range; the request's deadline bounds it too.
const FOLLOW_LIMIT: Duration = Duration::from_secs(2);
/// The wait between the first two of those reads; each later wait doubles, up to
/// [`FOLLOW_MAX_WAIT`].
const FOLLOW_FIRST_WAIT: Duration = Duration::from_millis(20);
const FOLLOW_MAX_WAIT: Duration = Duration::from_millis(500);
/// Shortest time one of those reads may take over the P2P handshake, however little of the
/// window is left.
const FOLLOW_MIN_FETCH: Duration = Duration::from_millis(200);

/// One transfer: `length` bytes between local registered memory at `source` and the target
/// segment's registered memory at address `target_offset` (as listed in its descriptor's
/// buffers, which is how Mooncake addresses segments too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransferRequest {
    /// [`Opcode::Read`] pulls the target's bytes into `source`, [`Opcode::Write`] pushes them.
    pub opcode: Opcode,
    /// The local address (inside memory registered with this engine).
    pub source: u64,
    /// The target segment, from [`TransferEngine::open_segment`].
    pub target: SegmentId,
    /// The target's address.
    pub target_offset: u64,
    /// Bytes to move.
    pub length: u64,
}

struct Segment {
    name: String,
    descriptor: RwLock<Arc<SegmentDescriptor>>,
    /// The transport and the peer's endpoint that requests go to: replaced when a fetched
    /// descriptor names another endpoint (the peer restarted, with new ports).
    route: RwLock<Route>,
    /// When the last read of the descriptor for a request that looked out of range started;
    /// held across that read, so that callers that missed together share one read.
    last_refresh: Mutex<Option<Instant>>,
}

#[derive(Clone)]
struct Route {
    transport: Arc<dyn Transport>,
    endpoint: Endpoint,
}

impl Segment {
    fn route(&self) -> Route {
        self.route.read().clone()
    }
}

/// One process's transfer engine: its registered memory (its segment), the transports that
/// move slices of it, the segments of peers it opened, and its batches of requests.
pub struct TransferEngine {
    config: EngineConfig,
    name: String,
    host_id: String,
    table: Arc<RegionTable>,
    transports: Vec<Arc<dyn Transport>>,
    /// The rdma transport among `transports`, if it started.
    rdma: Option<Arc<RdmaTransport>>,
    segments: RwLock<HashMap<SegmentId, Arc<Segment>>>,
    by_name: Mutex<HashMap<String, SegmentId>>,
    next_segment: AtomicU64,
    batches: Mutex<HashMap<BatchId, Arc<Batch>>>,
    next_batch: AtomicU64,
    watchdog: Arc<Watchdog>,
    /// Where descriptors are found and this engine's is published (deleted on drop).
    directory: Directory,
    /// Notifications received, until taken.
    notifies: Arc<NotifyQueue>,
    /// Notifications attached to batches, until sent.
    outbox: Arc<Outbox>,
    _handshake: HandshakeServer,
    /// The cluster secret's check on every port, and its counters.
    auth: Auth,
    /// The failure of a transfer queued on a device stream, until the next such call reports it.
    stream_failure: Arc<Mutex<Option<String>>>,
}

impl std::fmt::Debug for TransferEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransferEngine").field("name", &self.name).finish_non_exhaustive()
    }
}

impl TransferEngine {
    /// Starts an engine: its handshake listener and its transports.
    pub fn new(config: EngineConfig) -> Result<Arc<Self>> {
        crate::env_vars::check_environment();
        // A malformed connection string fails before anything starts.
        ServiceAddress::parse(&config.metadata_server)?;
        // Mooncake's legacy binding: with a metadata service, a fixed handshake port.
        let unnamed_port = match config.legacy_rpc_port {
            Some(p) if config.metadata_server.trim() != P2P_HANDSHAKE => p,
            _ => config.rpc_port,
        };
        let (host, port) = match config.local_hostname.as_deref() {
            Some(h) if h.contains(':') && handshake::split_host_port(h).is_ok() => handshake::split_host_port(h)?,
            Some(h) if !h.trim().is_empty() => (h.trim().to_string(), unnamed_port),
            _ => match config.tcp_bind_address {
                Some(ip) if !ip.is_unspecified() => (ip.to_string(), unnamed_port),
                _ => (host::default_advertise_host(), unnamed_port),
            },
        };
        let listener = TcpListener::bind(("0.0.0.0", port))
            .map_err(|e| EngineError::Config(format!("cannot listen for handshakes on port {port}: {e}")))?;
        let port = listener.local_addr()?.port();
        let name = format!("{host}:{port}");
        let auth = Auth::new(config.cluster_secret.clone());
        warn_if_open(&auth, &host, port);
        let host_id = host::host_id();
        let table = Arc::new(RegionTable::with_devices(Devices::new(config.cuda_driver.clone())));
        let tcp = TcpTransport::start(
            TcpConfig {
                bind_host: config.tcp_bind_address.map_or_else(|| TcpConfig::default().bind_host, |ip| ip.to_string()),
                advertise_host: match config.tcp_bind_address {
                    Some(ip) if !ip.is_unspecified() => ip.to_string(),
                    _ => host.clone(),
                },
                lanes: config.tcp_lanes,
                max_slice_len: config.tcp_slice_len,
                auth: auth.clone(),
                ..TcpConfig::default()
            },
            table.clone(),
        )?;
        let mut transports: Vec<Arc<dyn Transport>> = vec![Arc::new(tcp)];
        let mut rdma = None;
        match start_shm(&config, &auth, port, &table) {
            Ok(shm) => transports.push(Arc::new(shm)),
            Err(e) if config.protocol == Some(TransportKind::Shm) => return Err(e.into()),
            Err(e) => tracing::warn!("shm transport unavailable, same-host peers use tcp: {e}"),
        }
        if matches!(config.protocol, None | Some(TransportKind::Rdma)) {
            let rdma_config = RdmaConfig { advertise_host: host.clone(), auth: auth.clone(), ..config.rdma.clone() };
            match RdmaTransport::start(rdma_config) {
                Ok(started) => {
                    let started = Arc::new(started);
                    transports.push(started.clone());
                    rdma = Some(started);
                }
                Err(e) if config.protocol == Some(TransportKind::Rdma) || e.is_caller_error() => {
                    return Err(EngineError::Config(format!("protocol rdma cannot start: {e}")))
                }
                Err(e) => tracing::info!("{e}; peers on other hosts will be reached over tcp"),
            }
        }
        let endpoints: Vec<Endpoint> = transports.iter().map(|t| t.endpoint()).collect();
        let describe = {
            let (name, host_id, table, rdma) = (name.clone(), host_id.clone(), table.clone(), rdma.clone());
            Arc::new(move || describe(&name, &host_id, &offered(&endpoints, rdma.as_deref()), &table).to_json())
        };
        let notifies = Arc::new(NotifyQueue::default());
        let handshake = HandshakeServer::start(listener, &auth, describe.clone(), notifies.clone())?;
        let rpc = RpcMeta { ip_or_host_name: host.clone(), rpc_port: port };
        let directory = Directory::start(&config, &auth, &name, rpc, describe)?;
        tracing::info!(
            "transfer engine {name} up: transports {}",
            transports.iter().map(|t| t.endpoint().to_string()).collect::<Vec<_>>().join(", ")
        );
        Ok(Arc::new(TransferEngine {
            watchdog: Watchdog::start(config.transfer_timeout),
            name,
            host_id,
            table,
            transports,
            rdma,
            segments: RwLock::new(HashMap::new()),
            by_name: Mutex::new(HashMap::new()),
            next_segment: AtomicU64::new(1),
            batches: Mutex::new(HashMap::new()),
            next_batch: AtomicU64::new(1),
            directory,
            notifies,
            outbox: Outbox::start(config.handshake_timeout, auth.clone())?,
            auth,
            _handshake: handshake,
            stream_failure: Arc::default(),
            config,
        }))
    }

    /// How this engine's connections authenticate, and what its listeners admitted and
    /// refused ([`Auth::stats`]).
    pub fn auth(&self) -> &Auth {
        &self.auth
    }

    /// This engine's segment name (`host:port` of its handshake listener).
    pub fn segment_name(&self) -> &str {
        &self.name
    }

    /// The port of its handshake listener (its segment name's port).
    pub fn rpc_port(&self) -> u16 {
        self._handshake.port()
    }

    /// Its host's identity: engines with the same one share a kernel and network namespace.
    pub fn host_id(&self) -> &str {
        &self.host_id
    }

    /// The configuration it was started with.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// This engine's own descriptor, as peers receive it.
    pub fn local_descriptor(&self) -> SegmentDescriptor {
        let endpoints: Vec<Endpoint> = self.transports.iter().map(|t| t.endpoint()).collect();
        describe(&self.name, &self.host_id, &offered(&endpoints, self.rdma.as_deref()), &self.table)
    }

    /// The transports in use: all that started, less rdma once it was turned off.
    fn live_transports(&self) -> impl Iterator<Item = &Arc<dyn Transport>> {
        self.transports.iter().filter(move |t| !self.turned_off(t))
    }

    /// Whether `t` is the rdma transport and was turned off ([`Self::turn_rdma_off`]).
    fn turned_off(&self, t: &Arc<dyn Transport>) -> bool {
        t.kind() == TransportKind::Rdma && self.rdma.as_ref().is_some_and(|r| r.is_withdrawn())
    }

    // ---- registration ----

    /// Registers `[addr, addr+len)`; `location` is Mooncake's: `cpu:N` (host memory, taken
    /// as given), `cuda:N` (memory of CUDA device `N`, checked with the driver: the device must
    /// exist and the range lie inside one of its allocations), or `*` (the driver's pointer
    /// attributes decide, as upstream's do; host memory where no driver loads).
    ///
    /// The caller keeps the memory valid until it is unregistered.
    pub fn register(&self, addr: u64, len: u64, location: &str) -> Result<()> {
        self.register_region(self.region_at(addr, len, location)?)?;
        self.directory.publish();
        Ok(())
    }

    /// The region `[addr, +len)` registered at `location` is: on a device or in host memory.
    fn region_at(&self, addr: u64, len: u64, location: &str) -> Result<Region> {
        Ok(match self.table.devices().place(addr, len, location)? {
            Placement::Host(label) => Region::new(addr, len, label, None),
            Placement::Device(memory) => Region::on_device(addr, len, memory),
        })
    }

    /// Registers several regions; all or none.
    pub fn register_batch(&self, regions: &[(u64, u64)], location: &str) -> Result<()> {
        for (i, &(addr, len)) in regions.iter().enumerate() {
            if let Err(e) = self.region_at(addr, len, location).and_then(|r| self.register_region(r)) {
                for &(done, _) in &regions[..i] {
                    let _ = self.unregister(done);
                }
                return Err(e);
            }
        }
        self.directory.publish();
        Ok(())
    }

    fn register_region(&self, region: Region) -> Result<()> {
        let region = self.table.insert(region)?;
        for (i, t) in self.transports.iter().enumerate() {
            if self.turned_off(t) {
                continue;
            }
            match t.register_region(&region) {
                Ok(keys) if keys != Default::default() => region.set_keys(keys),
                Ok(_) => {}
                Err(e @ TransportError::PinLimit { .. }) if self.turn_rdma_off(t, &e) => {}
                Err(e) => {
                    for t in &self.transports[..i] {
                        let _ = t.unregister_region(&region);
                    }
                    let _ = self.table.remove(region.addr(), UNREGISTER_WAIT);
                    return Err(e.into());
                }
            }
        }
        tracing::debug!("registered [{:#x}, +{}) at {}", region.addr(), region.len(), region.location());
        Ok(())
    }

    /// After `t` (rdma) could not pin memory for want of locked memory: when rdma was not
    /// asked for and has not carried anything yet, turns it off (as on a host without RDMA)
    /// and says so once; its registrations are undone, and its endpoint is no longer published.
    /// False where rdma must stay (asked for, or in use): the registration then fails.
    fn turn_rdma_off(&self, t: &Arc<dyn Transport>, e: &TransportError) -> bool {
        let Some(rdma) = self.rdma.as_ref().filter(|_| t.kind() == TransportKind::Rdma) else {
            return false;
        };
        if self.config.protocol.is_some() {
            return false;
        }
        let first = !rdma.is_withdrawn();
        if !rdma.withdraw_if_unused() {
            return false;
        }
        for region in self.table.snapshot() {
            if region.keys() != RegionKeys::default() {
                let _ = rdma.unregister_region(&region);
                region.set_keys(RegionKeys::default());
            }
        }
        if first {
            tracing::warn!("{e}; rdma is turned off, peers will reach this engine over tcp");
        }
        true
    }

    /// Unregisters the region that starts at `addr`. Refused while transfers use it.
    pub fn unregister(&self, addr: u64) -> Result<()> {
        let region = self.table.remove(addr, UNREGISTER_WAIT)?;
        for t in &self.transports {
            if let Err(e) = t.unregister_region(&region) {
                tracing::warn!("transport {} failed to unregister {addr:#x}: {e}", t.kind());
            }
        }
        self.directory.publish();
        Ok(())
    }

    /// Whether `[addr, addr+len)` lies inside one registered region.
    pub fn is_registered(&self, addr: u64, len: u64) -> bool {
        self.table.find(addr, len).is_some()
    }

    /// Lends `[addr, +len)` of this process's memory to its own transfers until the returned
    /// loan is dropped, without registering it: the range enters the region table as
    /// local-only (never published, exported or registered with a NIC, and refused to peers).
    /// For a one-off transfer into memory the caller owns (a value returned as bytes), where
    /// registering would publish a descriptor. `via`: the segment the transfers go to, or
    /// `None` for any. `None` is returned where that transport needs registered memory (rdma:
    /// the NIC needs its keys; for any segment, wherever rdma is up); the caller then stages
    /// through registered memory.
    pub fn lend_local(&self, via: Option<SegmentId>, addr: u64, len: u64) -> Result<Option<LocalLoan<'_>>> {
        let needs_keys = match via {
            Some(segment) => self.segment_transport(segment)? == TransportKind::Rdma,
            None => self.live_transports().any(|t| t.kind() == TransportKind::Rdma),
        };
        if needs_keys {
            return Ok(None);
        }
        self.table.insert(Region::local_only(addr, len))?;
        Ok(Some(LocalLoan { table: &self.table, addr }))
    }

    /// The device memory `[addr, +len)` lies in, when it is registered memory of a device (the
    /// CPU must not touch it: its bytes move through the driver's copies).
    pub fn local_device_memory(&self, addr: u64, len: u64) -> Option<DeviceMemory> {
        self.table.device_memory(addr, len)
    }

    /// How the registered device memory that starts at `addr` reaches this engine's RDMA
    /// devices: GPUDirect (dma-buf or peer memory), or staged over tcp with the reason.
    /// `None` where rdma is not running or no region of device memory starts at `addr`.
    pub fn rdma_device_path(&self, addr: u64) -> Option<DevicePath> {
        self.rdma.as_ref().filter(|r| !r.is_withdrawn())?.device_path(addr)
    }

    /// Slices posted to segment `id` over rdma so far, summed over its queue pairs (0 where its
    /// route is not rdma or nothing is connected yet): diagnostics, and what tests use to tell
    /// which transport carried a request.
    pub fn rdma_slices_posted(&self, id: SegmentId) -> Result<u64> {
        let route = self.segment(id)?.route();
        Ok(match (&self.rdma, route.transport.kind()) {
            (Some(rdma), TransportKind::Rdma) => rdma.lane_stats(&route.endpoint).iter().map(|l| l.posted).sum(),
            _ => 0,
        })
    }

    /// Allocates `len` bytes of shareable host memory and registers them. A device location is
    /// refused: device memory is allocated by the caller's framework and registered.
    pub fn alloc_registered(&self, len: u64, location: &str) -> Result<RegisteredMemory> {
        if let Location::Cuda(_) = location.parse::<Location>()? {
            return Err(EngineError::InvalidArgument(format!(
                "alloc_registered allocates host memory; allocate {location} memory on the device and register it"
            )));
        }
        let mem = Arc::new(SharedMemory::allocate(len, "crescent")?);
        self.register_region(Region::new(mem.addr(), mem.len(), location, Some(mem.clone())))?;
        self.directory.publish();
        Ok(RegisteredMemory { mem })
    }

    /// Unregisters memory from [`Self::alloc_registered`]; it is freed once no transfer uses it.
    pub fn free_registered(&self, mem: RegisteredMemory) -> Result<()> {
        self.unregister(mem.addr())
    }

    // ---- segments ----

    /// Opens the segment `name` (`host:port` of its handshake listener) and returns its handle.
    /// Its descriptor comes from the metadata service, or with P2P handshake from the peer.
    /// Opening the same name again returns the same handle.
    pub fn open_segment(&self, name: &str) -> Result<SegmentId> {
        if let Some(id) = self.by_name.lock().get(name) {
            return Ok(*id);
        }
        let descriptor = self.directory.fetch(name, self.config.handshake_timeout)?;
        let (transport, endpoint) = self.choose_transport(name, &descriptor)?;
        tracing::info!("segment {name}: using {endpoint}");
        transport.set_peer_regions(&endpoint, remote_regions(&descriptor));
        let segment = Arc::new(Segment {
            name: name.to_string(),
            descriptor: RwLock::new(Arc::new(descriptor)),
            route: RwLock::new(Route { transport, endpoint }),
            last_refresh: Mutex::new(None),
        });
        let mut by_name = self.by_name.lock();
        if let Some(id) = by_name.get(name) {
            return Ok(*id);
        }
        let id = self.next_segment.fetch_add(1, Ordering::Relaxed);
        self.segments.write().insert(id, segment);
        by_name.insert(name.to_string(), id);
        Ok(id)
    }

    /// Forgets an opened segment and its connections.
    pub fn close_segment(&self, id: SegmentId) -> Result<()> {
        let segment = self.segments.write().remove(&id).ok_or(EngineError::UnknownSegment(id))?;
        self.by_name.lock().remove(&segment.name);
        let route = segment.route();
        route.transport.forget_peer(&route.endpoint);
        Ok(())
    }

    /// The descriptor of an opened segment, as last fetched.
    pub fn segment_descriptor(&self, id: SegmentId) -> Result<Arc<SegmentDescriptor>> {
        Ok(self.segment(id)?.descriptor.read().clone())
    }

    /// Which transport moves bytes to and from an opened segment.
    pub fn segment_transport(&self, id: SegmentId) -> Result<TransportKind> {
        Ok(self.segment(id)?.route().transport.kind())
    }

    /// Fetches an opened segment's descriptor again (it registered or unregistered memory
    /// since); the handle stays the same.
    pub fn resync_segment(&self, id: SegmentId) -> Result<()> {
        let segment = self.segment(id)?;
        let d = self.directory.fetch(&segment.name, self.config.handshake_timeout)?;
        self.install_descriptor(&segment, d)
    }

    /// Puts a freshly fetched descriptor of `segment` in place: its regions, and its endpoint
    /// when that changed (a peer restarted under the same name listens on new ports; requests
    /// to the old ones would fail until the segment was closed and opened again).
    fn install_descriptor(&self, segment: &Segment, d: SegmentDescriptor) -> Result<()> {
        let old = segment.route();
        let same_host = segment.descriptor.read().host_id == d.host_id;
        let same_kind = d.endpoints.iter().find(|e| e.kind() == old.transport.kind());
        if same_kind != Some(&old.endpoint) {
            let (transport, endpoint) = match same_kind {
                Some(ep) if same_host && old.transport.connect(ep).is_ok() => (old.transport.clone(), ep.clone()),
                _ => self.choose_transport(&segment.name, &d)?,
            };
            tracing::info!("segment {}: now using {endpoint} (was {})", segment.name, old.endpoint);
            old.transport.forget_peer(&old.endpoint);
            *segment.route.write() = Route { transport, endpoint };
        }
        let route = segment.route();
        route.transport.set_peer_regions(&route.endpoint, remote_regions(&d));
        *segment.descriptor.write() = Arc::new(d);
        Ok(())
    }

    /// The segments opened, by handle: name and transport, in handle order.
    pub fn open_segments(&self) -> Vec<(SegmentId, String, TransportKind)> {
        let mut v: Vec<_> =
            self.segments.read().iter().map(|(id, s)| (*id, s.name.clone(), s.route().transport.kind())).collect();
        v.sort_by_key(|(id, ..)| *id);
        v
    }

    /// The transports this engine runs (rdma only while it is not turned off).
    pub fn transport_kinds(&self) -> Vec<TransportKind> {
        self.live_transports().map(|t| t.kind()).collect()
    }

    fn segment(&self, id: SegmentId) -> Result<Arc<Segment>> {
        self.segments.read().get(&id).cloned().ok_or(EngineError::UnknownSegment(id))
    }

    fn choose_transport(&self, name: &str, d: &SegmentDescriptor) -> Result<(Arc<dyn Transport>, Endpoint)> {
        let order: Vec<TransportKind> = match self.config.protocol {
            Some(kind) => vec![kind],
            None => vec![TransportKind::Shm, TransportKind::Rdma, TransportKind::Tcp],
        };
        let mut unusable = Vec::new();
        for kind in &order {
            let Some(local) = self.live_transports().find(|t| t.kind() == *kind) else {
                continue;
            };
            let Some(ep) = d.endpoints.iter().find(|e| e.kind() == *kind) else {
                continue;
            };
            // Same host = same kernel and same network namespace.
            if *kind == TransportKind::Shm && d.host_id != self.host_id {
                unusable.push(format!("{kind}: the segment is on another host"));
                continue;
            }
            match local.connect(ep) {
                Ok(()) => return Ok((local.clone(), ep.clone())),
                Err(e) => {
                    tracing::warn!("segment {name}: not using {kind}: {e}");
                    unusable.push(format!("{kind}: {e}"));
                }
            }
        }
        let list = |kinds: Vec<String>| {
            if kinds.is_empty() {
                "none".to_string()
            } else {
                kinds.join(", ")
            }
        };
        Err(EngineError::NoCommonTransport {
            name: name.to_string(),
            offered: list(d.endpoints.iter().map(|e| e.kind().to_string()).collect()),
            allowed: list(
                order
                    .iter()
                    .filter(|k| self.live_transports().any(|t| t.kind() == **k))
                    .map(|k| k.to_string())
                    .chain(unusable.iter().map(|why| format!("unusable {why}")))
                    .collect(),
            ),
        })
    }

    /// Reads `segment`'s descriptor again and puts it in place, unless a read that started
    /// after `missed` (when the caller looked at the descriptor it found wanting) has done so
    /// already: callers that miss together share one read. `timeout` bounds a P2P read.
    fn refresh_segment(&self, segment: &Segment, missed: Instant, timeout: Duration) -> Result<()> {
        // Held across the read: concurrent callers wait for one read instead of each doing one.
        let mut last = segment.last_refresh.lock();
        if last.is_some_and(|started| started >= missed) {
            return Ok(());
        }
        *last = Some(Instant::now());
        let d = self.directory.fetch(&segment.name, timeout)?;
        self.install_descriptor(segment, d)
    }

    // ---- batches ----

    /// Creates a batch that holds up to `capacity` requests.
    pub fn allocate_batch(&self, capacity: usize) -> Result<BatchId> {
        if capacity == 0 {
            return Err(EngineError::InvalidArgument("a batch needs a capacity of at least 1".into()));
        }
        let id = self.next_batch.fetch_add(1, Ordering::Relaxed);
        self.batches.lock().insert(id, Batch::new(id, capacity));
        Ok(id)
    }

    fn batch(&self, id: BatchId) -> Result<Arc<Batch>> {
        self.batches.lock().get(&id).cloned().ok_or(EngineError::UnknownBatch(id))
    }

    /// Frees a batch. Refused while any of its requests is in flight.
    pub fn free_batch(&self, id: BatchId) -> Result<()> {
        let mut batches = self.batches.lock();
        let batch = batches.get(&id).ok_or(EngineError::UnknownBatch(id))?;
        let pending = batch.unfinished();
        if pending > 0 {
            return Err(EngineError::BatchInFlight { id, pending });
        }
        self.outbox.release(batch);
        batches.remove(&id);
        Ok(())
    }

    /// Statuses of every request submitted to the batch so far.
    pub fn batch_status(&self, id: BatchId) -> Result<Vec<TransferStatus>> {
        Ok(self.batch(id)?.statuses())
    }

    /// Status of request `index` of the batch.
    pub fn transfer_status(&self, id: BatchId, index: usize) -> Result<TransferStatus> {
        self.batch(id)?.status(index)
    }

    /// Blocks until every request submitted to the batch has ended (or `timeout` passes) and
    /// returns their statuses.
    pub fn wait_batch(&self, id: BatchId, timeout: Option<Duration>) -> Result<Vec<TransferStatus>> {
        let batch = self.batch(id)?;
        batch.wait(timeout);
        Ok(batch.statuses())
    }

    /// A future resolving to the batch's statuses once every submitted request has ended.
    pub fn batch_completion(&self, id: BatchId) -> Result<BatchCompletion> {
        Ok(BatchCompletion { batch: self.batch(id)? })
    }

    /// Moves `requests` and blocks until all have ended; `Ok` only if all completed.
    pub fn transfer_sync(&self, requests: &[TransferRequest]) -> Result<()> {
        let id = self.transfer_start(requests)?;
        self.transfer_finish(id)
    }

    /// Starts moving `requests` in a batch of their own; [`Self::transfer_finish`] waits for
    /// it. Lets a caller overlap its own work with the transfer.
    pub fn transfer_start(&self, requests: &[TransferRequest]) -> Result<BatchId> {
        let id = self.allocate_batch(requests.len().max(1))?;
        if let Err(e) = self.submit(id, requests) {
            let _ = self.free_batch(id);
            return Err(e);
        }
        Ok(id)
    }

    /// Waits for a batch from [`Self::transfer_start`] to end and frees it; `Ok` only if every
    /// request completed.
    pub fn transfer_finish(&self, id: BatchId) -> Result<()> {
        let result = self.wait_batch(id, None);
        let freed = self.free_batch(id);
        let statuses = result?;
        freed?;
        for (i, s) in statuses.into_iter().enumerate() {
            match s {
                TransferStatus::Completed => {}
                TransferStatus::Failed(reason) => return Err(EngineError::TransferFailed { request: i, reason }),
                TransferStatus::TimedOut => return Err(EngineError::TimedOut),
                TransferStatus::Pending => unreachable!("wait_batch returns once all ended"),
            }
        }
        Ok(())
    }

    // ---- transfers ordered on a device stream (upstream's `transfer_*_on_cuda`) ----

    /// Queues `requests` on the caller's device stream (`stream`: the driver's handle, 0 for
    /// the default stream of the calling thread's context): they start once the work queued on
    /// the stream before them is done, and the work queued after them waits until they have
    /// ended. Returns once they are queued.
    ///
    /// Checked now, each a typed error with nothing queued: a request of length 0, local
    /// memory that is not registered, an unknown segment, no device driver, a stream the
    /// driver refuses. A failure of the transfer itself comes later, on the driver's time: it
    /// is logged, the stream goes on, and this engine's next call of this method returns it
    /// as [`EngineError::StreamTransferFailed`] (once). Upstream ends the process instead.
    ///
    /// `hold` is dropped once the transfer has ended (on a thread of the engine's, after the
    /// stream went on): what keeps the local memory alive, say; it is dropped at once when
    /// nothing is queued.
    pub fn transfer_on_stream<H: Send + 'static>(
        self: &Arc<Self>,
        stream: u64,
        requests: Vec<TransferRequest>,
        hold: H,
    ) -> Result<()> {
        if let Some(reason) = self.stream_failure.lock().take() {
            return Err(EngineError::StreamTransferFailed { reason });
        }
        let mut device = None;
        for (i, r) in requests.iter().enumerate() {
            if r.length == 0 {
                return Err(EngineError::InvalidArgument(format!("request {i} has length 0")));
            }
            if !self.is_registered(r.source, r.length) {
                return Err(EngineError::LocalNotRegistered { request: i, addr: r.source, len: r.length });
            }
            self.segment(r.target)?;
            device = device.or_else(|| self.table.device_memory(r.source, r.length));
        }
        if requests.is_empty() {
            return Ok(());
        }
        // The stream's context: the local device memory's device (the first request's on a
        // device), unless the caller has a context current.
        let (driver, ordinal) = match device {
            Some(memory) => (memory.driver, memory.allocation.device),
            None => (self.table.devices().driver()?, 0),
        };
        let engine = Arc::clone(self);
        let failure = Arc::clone(&self.stream_failure);
        let count = requests.len();
        let work = Box::new(move || {
            // The driver's thread must not call the driver, and the transfer's copies do: it
            // runs on a thread of its own while this one holds the stream.
            let (done, ended) = std::sync::mpsc::channel();
            let spawned = std::thread::Builder::new().name("crescent-on-stream".into()).spawn(move || {
                if let Err(e) = engine.transfer_sync(&requests) {
                    tracing::error!(
                        "a transfer of {} request(s) queued on a device stream failed: {e}",
                        requests.len()
                    );
                    *engine.stream_failure.lock() = Some(e.to_string());
                }
                let _ = done.send(());
                // The engine's last reference may go here, not on the driver's thread (which
                // must not call the driver, as closing the engine's IPC mappings does).
                drop(engine);
                drop(hold);
            });
            match spawned {
                Ok(_) => {
                    let _ = ended.recv();
                }
                Err(e) => {
                    tracing::error!("a transfer queued on a device stream cannot start a thread: {e}");
                    *failure.lock() = Some(format!("cannot start a thread for it: {e}"));
                }
            }
        });
        driver.api().launch_host_func(ordinal, stream, work)?;
        tracing::debug!("{count} request(s) queued on device stream {stream:#x}");
        Ok(())
    }

    // ---- notifications ([`crate::notify`]) ----

    /// [`Self::submit`], then attaches `notification` to the batch: once every request
    /// submitted to it so far has completed, it is sent to the engine of the first request's
    /// segment (by a thread of its own), and dropped with a warning if one failed (Mooncake's
    /// `submitTransferWithNotify`). A notification attached earlier and not sent yet is replaced.
    pub fn submit_with_notify(
        &self,
        batch_id: BatchId,
        requests: &[TransferRequest],
        notification: Notification,
    ) -> Result<()> {
        notification.check()?;
        let first = requests
            .first()
            .ok_or_else(|| EngineError::InvalidArgument("a notification follows at least one request".into()))?;
        let segment = self.segment(first.target)?;
        let address = self.directory.handshake_address(&segment.name)?;
        self.submit(batch_id, requests)?;
        self.outbox.arm(&self.batch(batch_id)?, &segment.name, address, notification);
        Ok(())
    }

    /// Sends `notification` now to the engine of an opened segment (Mooncake's
    /// `sendNotifyByID`); `Err(NotifyQueueFull)` when its queue is full.
    pub fn send_notify(&self, target: SegmentId, notification: &Notification) -> Result<()> {
        let name = self.segment(target)?.name.clone();
        self.send_notify_to(&name, notification)
    }

    /// Sends `notification` now to the engine of segment `name` (`sendNotifyByName`).
    pub fn send_notify_to(&self, name: &str, notification: &Notification) -> Result<()> {
        notification.check()?;
        let address = self.directory.handshake_address(name)?;
        notify::send(name, &address, notification, self.outbox.timeout(), &self.auth)
    }

    /// Takes the notifications this engine received and nobody took yet, oldest first.
    pub fn take_notifies(&self) -> Vec<Notification> {
        self.notifies.take_all()
    }

    /// Checks that the engine of segment `name` answers on its handshake listener (Mooncake's
    /// `sendProbe`): its address from the metadata service (or the name with P2P handshake),
    /// then one descriptor request within the handshake's deadline.
    pub fn probe(&self, name: &str) -> Result<()> {
        let address = self.directory.handshake_address(name)?;
        handshake::fetch_descriptor(&address, self.config.handshake_timeout, &self.auth).map(|_| ())
    }
}

/// The shm transport, listening on a name derived from the handshake port (unique in the
/// network namespace, and the same after a restart on a fixed port).
fn start_shm(
    config: &EngineConfig,
    auth: &Auth,
    port: u16,
    table: &Arc<RegionTable>,
) -> std::result::Result<ShmTransport, crescent_transports::TransportError> {
    let shm = ShmConfig {
        socket_name: format!("crescent-shm-{port}"),
        copy_threads: config.shm_copy_threads,
        auth: auth.clone(),
        ..ShmConfig::default()
    };
    ShmTransport::start(shm.clone(), table.clone()).or_else(|e| {
        tracing::debug!("shm socket @{} taken ({e}); using a unique name", shm.socket_name);
        let default = ShmConfig::default();
        ShmTransport::start(ShmConfig { socket_name: default.socket_name, ..shm }, table.clone())
    })
}

/// Without a cluster secret, on an address other hosts reach, says once per process that
/// every port of the engine is open (as Redis's protected mode does, but without refusing).
fn warn_if_open(auth: &Auth, host: &str, port: u16) {
    static WARNED: std::sync::Once = std::sync::Once::new();
    if auth.is_required() || is_loopback(host) {
        return;
    }
    WARNED.call_once(|| {
        tracing::warn!(
            "transfer engine {host}:{port} runs WITHOUT a cluster secret: anyone who reaches its ports can read and \
             write its registered memory; set CRESCENT_CLUSTER_SECRET_FILE (or CRESCENT_CLUSTER_SECRET) on every \
             node to require one (see docs: security)"
        )
    });
}

/// True for `localhost` and loopback addresses.
pub fn is_loopback(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost") || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The endpoints to publish: all, less rdma's once it was turned off.
fn offered(endpoints: &[Endpoint], rdma: Option<&RdmaTransport>) -> Vec<Endpoint> {
    let rdma_off = rdma.is_some_and(RdmaTransport::is_withdrawn);
    endpoints.iter().filter(|e| !(rdma_off && e.kind() == TransportKind::Rdma)).cloned().collect()
}

/// A descriptor's buffers as the transports see them.
fn remote_regions(d: &SegmentDescriptor) -> Vec<RemoteRegion> {
    d.buffers.iter().map(|b| RemoteRegion { addr: b.addr, len: b.length, keys: b.keys.clone() }).collect()
}

fn describe(name: &str, host_id: &str, endpoints: &[Endpoint], table: &RegionTable) -> SegmentDescriptor {
    SegmentDescriptor {
        name: name.to_string(),
        host_id: host_id.to_string(),
        endpoints: endpoints.to_vec(),
        buffers: table
            .snapshot()
            .iter()
            .filter(|r| !r.is_local_only())
            .map(|r| BufferDescriptor {
                addr: r.addr(),
                length: r.len(),
                location: r.location().to_string(),
                keys: r.keys(),
            })
            .collect(),
    }
}
