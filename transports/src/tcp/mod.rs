//! The tcp transport: versioned, length-prefixed frames over several connections ("lanes")
//! per peer, so that large transfers use more than one core. Payloads go straight between the
//! socket and registered host memory; device memory is staged through pinned host buffers on
//! either end ([`crate::device::stage`]), never touched by the CPU. The target checks every
//! access against its region table.

pub mod frame;
mod lane;
pub mod server;

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use crate::net::{Auth, Limits, Server, Service};
use crate::{Endpoint, FailureReason, RegionTable, Slice, Transport, TransportError, TransportKind};
use lane::Lane;

/// Requests are not cut below this to spread them over lanes: small pieces cost more in
/// per-frame work than a second stream saves.
const MIN_SPREAD_SLICE: u64 = 64 << 10;

/// Bytes each end of a connection receives ahead of the frame it parses: a response (or
/// request) header and what follows it come in one receive, up to 64 headers (read requests,
/// write acknowledgements) at once, and a payload's last part comes with the next header.
pub const RECV_BUF: usize = 2 << 10;

/// Settings of the tcp transport.
#[derive(Debug, Clone)]
pub struct TcpConfig {
    /// Address to listen on (`0.0.0.0` for all interfaces).
    pub bind_host: String,
    /// Host name or address peers use to reach us (published in the descriptor).
    pub advertise_host: String,
    /// Port to listen on; 0 picks a free one.
    pub port: u16,
    /// Connections per peer.
    pub lanes: usize,
    /// Largest slice; larger requests are cut by the engine.
    pub max_slice_len: u64,
    /// Time the tcp connect of one lane to a peer may take (the authentication that follows
    /// has [`Auth::timeout`]).
    pub connect_timeout: Duration,
    /// Connections the server serves at once, from everyone.
    pub max_connections: usize,
    /// Connections the server serves at once from one peer address.
    pub max_connections_per_peer: usize,
    /// The server closes a connection that sends no request for this long. Initiators open
    /// a new lane instead of using one idle for [`LANE_REUSE_LIMIT`], so this must be longer.
    pub idle_timeout: Duration,
    /// Time for one frame either way (a request in, a response of up to 64 MiB out, on both
    /// sides); an initiator's lane with requests waiting and nothing heard for this long
    /// closes.
    pub io_timeout: Duration,
    /// The cluster secret both ends of a lane prove they know (none: open).
    pub auth: Auth,
}

/// An initiator opens new lanes to a peer rather than use ones idle this long, so that it
/// never sends on a connection the peer's server is closing for idleness.
pub const LANE_REUSE_LIMIT: Duration = Duration::from_secs(20);

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            bind_host: "0.0.0.0".into(),
            advertise_host: "127.0.0.1".into(),
            port: 0,
            lanes: 2,
            max_slice_len: 1 << 20,
            connect_timeout: Duration::from_secs(3),
            max_connections: 1024,
            max_connections_per_peer: 128,
            idle_timeout: Duration::from_secs(60),
            io_timeout: Duration::from_secs(30),
            auth: Auth::open(),
        }
    }
}

#[derive(Default)]
struct PeerSlot {
    lanes: Mutex<Option<Arc<PeerLanes>>>,
}

struct PeerLanes {
    lanes: Vec<Arc<Lane>>,
    next: AtomicUsize,
}

/// The tcp transport of one engine: the listener that serves peers' reads and writes of the
/// engine's registered regions, and the lanes it opened to the peers it reaches. Dropping it
/// closes the port and every served connection, and shuts its lanes down (slices still
/// pending on them fail).
pub struct TcpTransport {
    config: TcpConfig,
    port: u16,
    /// This process's registered memory: a slice whose local memory is on a device is staged
    /// through a pinned host buffer ([`crate::device::stage`]).
    table: Arc<RegionTable>,
    peers: Mutex<HashMap<Endpoint, Arc<PeerSlot>>>,
    /// The accept loop; dropping it closes the port and every served connection.
    server: Server,
}

impl TcpTransport {
    /// Starts listening; the listener serves peers' accesses to `table`'s regions.
    pub fn start(config: TcpConfig, table: Arc<RegionTable>) -> Result<Self, TransportError> {
        if config.lanes == 0 || config.max_slice_len == 0 || config.max_slice_len > frame::MAX_PAYLOAD {
            return Err(TransportError::InvalidArgument(format!(
                "tcp lanes must be >= 1 and the slice length in 1..={} (got {} lanes, {} bytes)",
                frame::MAX_PAYLOAD,
                config.lanes,
                config.max_slice_len
            )));
        }
        if config.max_connections == 0
            || config.max_connections_per_peer == 0
            || config.io_timeout.is_zero()
            || config.idle_timeout <= LANE_REUSE_LIMIT
        {
            return Err(TransportError::InvalidArgument(format!(
                "tcp server bounds must be positive and the idle timeout over {LANE_REUSE_LIMIT:?} (got {} \
                 connections, {} per peer, io timeout {:?}, idle timeout {:?})",
                config.max_connections, config.max_connections_per_peer, config.io_timeout, config.idle_timeout
            )));
        }
        let bind = format!("{}:{}", config.bind_host, config.port);
        let listener =
            TcpListener::bind(&bind).map_err(|source| TransportError::Listen { addr: bind.clone(), source })?;
        let port = listener.local_addr().map_err(|source| TransportError::Listen { addr: bind, source })?.port();
        let limits = Limits {
            max_connections: config.max_connections,
            max_per_peer: config.max_connections_per_peer,
            idle: Some(config.idle_timeout),
        };
        let server = server::start(listener, table.clone(), limits, config.auth.guard(Service::Tcp), config.io_timeout)
            .map_err(|e| TransportError::Unavailable("tcp", format!("cannot start the listener thread: {e}")))?;
        tracing::debug!("tcp transport listening on port {port}, {} lanes per peer", config.lanes);
        Ok(TcpTransport { config, port, table, peers: Mutex::new(HashMap::new()), server })
    }

    /// The port it listens on (the one picked when [`TcpConfig::port`] was 0).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Connections the server serves now.
    pub fn served_connections(&self) -> usize {
        self.server.connections()
    }

    fn lanes_to(&self, peer: &Endpoint) -> Result<Arc<PeerLanes>, FailureReason> {
        let Endpoint::Tcp { host, port } = peer else {
            return Err(FailureReason::local(format!("{peer} is not a tcp endpoint")));
        };
        let slot = self.peers.lock().entry(peer.clone()).or_default().clone();
        let mut current = slot.lanes.lock();
        // Dead lanes are replaced, and so are quiet ones idle for long (the peer's server may
        // be closing them); the others keep their requests in flight.
        let stale = |l: &Arc<Lane>| l.is_quiet() && l.idle_for() >= LANE_REUSE_LIMIT;
        let usable = |l: &Arc<Lane>| !(l.is_dead() || stale(l));
        if let Some(lanes) = current.as_ref() {
            if lanes.lanes.iter().all(usable) {
                return Ok(lanes.clone());
            }
        }
        let old: Vec<Arc<Lane>> = current.take().map(|l| l.lanes.clone()).unwrap_or_default();
        let name = format!("{host}:{port}");
        let addr: SocketAddr = (host.as_str(), *port)
            .to_socket_addrs()
            .map_err(|e| FailureReason::peer_gone(format!("cannot resolve {name}: {e}")))?
            .next()
            .ok_or_else(|| FailureReason::peer_gone(format!("{name} resolves to no address")))?;
        let lanes = (0..self.config.lanes)
            .map(|i| match old.get(i) {
                Some(l) if usable(l) => Ok(l.clone()),
                _ => Lane::connect(&name, addr, &self.config).map(Arc::new),
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| {
                let message = format!("cannot connect to {name}: {e}");
                match e.kind() {
                    std::io::ErrorKind::PermissionDenied => FailureReason::unauthenticated(message),
                    _ => FailureReason::peer_gone(message),
                }
            })?;
        let lanes = Arc::new(PeerLanes { lanes, next: AtomicUsize::new(0) });
        *current = Some(lanes.clone());
        Ok(lanes)
    }
}

impl Transport for TcpTransport {
    fn kind(&self) -> TransportKind {
        TransportKind::Tcp
    }

    fn endpoint(&self) -> Endpoint {
        Endpoint::Tcp { host: self.config.advertise_host.clone(), port: self.port }
    }

    fn max_slice_len(&self) -> u64 {
        self.config.max_slice_len
    }

    /// Spreads one request over every lane: a single tcp stream between two hosts moves a
    /// large response at a fraction of what two streams do on two cores (a 1 MiB read between
    /// two network namespaces: about 800 us on one lane, about 250 us as 512 KiB on each of two).
    fn slice_len_for(&self, request_len: u64) -> u64 {
        let max = self.config.max_slice_len;
        let per_lane = request_len.div_ceil(self.config.lanes as u64).next_multiple_of(4096);
        per_lane.max(MIN_SPREAD_SLICE).min(max)
    }

    fn submit(&self, peer: &Endpoint, slices: Vec<Slice>) {
        match self.lanes_to(peer) {
            Ok(peer_lanes) => {
                let n = peer_lanes.lanes.len();
                for slice in slices {
                    // Device memory: staged here, slice by slice, so that a lane sends one
                    // slice while the next is copied off the device.
                    let slice = match self.table.device_memory(slice.local_addr, slice.len) {
                        None => slice,
                        Some(memory) => match crate::device::stage(slice, &memory) {
                            Some(staged) => staged,
                            None => continue,
                        },
                    };
                    let i = peer_lanes.next.fetch_add(1, Ordering::Relaxed) % n;
                    peer_lanes.lanes[i].send(slice);
                }
            }
            Err(reason) => {
                for slice in slices {
                    slice.completion.fail(reason.clone());
                }
            }
        }
    }

    fn forget_peer(&self, peer: &Endpoint) {
        self.peers.lock().remove(peer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transport(lanes: usize, max_slice_len: u64) -> TcpTransport {
        let config = TcpConfig { bind_host: "127.0.0.1".into(), lanes, max_slice_len, ..TcpConfig::default() };
        TcpTransport::start(config, Arc::new(RegionTable::new())).expect("tcp transport")
    }

    #[test]
    fn one_request_is_spread_over_every_lane() {
        let t = transport(2, 1 << 20);
        // A 1 MiB get becomes one 512 KiB slice per lane, not one 1 MiB slice on one lane.
        assert_eq!(t.slice_len_for(1 << 20), 512 << 10);
        // Odd sizes round up to whole pages, so two slices still cover them.
        assert_eq!(t.slice_len_for(600_001), 303_104);
        assert!(600_001u64.div_ceil(t.slice_len_for(600_001)) == 2);
        // Large requests are cut at the maximum and fill the lanes round-robin.
        assert_eq!(t.slice_len_for(25 << 20), 1 << 20);
        // Small requests are not cut into tiny frames.
        assert_eq!(t.slice_len_for(100 << 10), 64 << 10);
        assert_eq!(t.slice_len_for(1), 64 << 10);
    }

    #[test]
    fn a_small_configured_maximum_still_bounds_slices() {
        let t = transport(4, 16 << 10);
        assert_eq!(t.slice_len_for(1 << 20), 16 << 10);
        assert_eq!(t.slice_len_for(1), 16 << 10);
    }
}
