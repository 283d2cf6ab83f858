//! The tcp transport: versioned, length-prefixed frames over several connections ("lanes")
//! per peer, so that large transfers use more than one core. Payloads go straight between the
//! socket and registered memory; the target checks every access against its region table.

pub mod frame;
mod io_util;
mod lane;
pub mod server;

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use crate::{Endpoint, RegionTable, Slice, Transport, TransportError, TransportKind};
use lane::Lane;

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
    pub connect_timeout: Duration,
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            bind_host: "0.0.0.0".into(),
            advertise_host: "127.0.0.1".into(),
            port: 0,
            lanes: 2,
            max_slice_len: 1 << 20,
            connect_timeout: Duration::from_secs(3),
        }
    }
}

#[derive(Default)]
struct PeerSlot {
    lanes: Mutex<Option<Arc<PeerLanes>>>,
}

struct PeerLanes {
    lanes: Vec<Lane>,
    next: AtomicUsize,
}

pub struct TcpTransport {
    config: TcpConfig,
    port: u16,
    peers: Mutex<HashMap<Endpoint, Arc<PeerSlot>>>,
    stop: Arc<AtomicBool>,
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
        let bind = format!("{}:{}", config.bind_host, config.port);
        let listener =
            TcpListener::bind(&bind).map_err(|source| TransportError::Listen { addr: bind.clone(), source })?;
        let port = listener.local_addr().map_err(|source| TransportError::Listen { addr: bind, source })?.port();
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        std::thread::Builder::new()
            .name("crescent-tcp-accept".into())
            .spawn(move || server::run_listener(listener, table, stop2))
            .map_err(|e| TransportError::Unavailable("tcp", format!("cannot start the listener thread: {e}")))?;
        tracing::debug!("tcp transport listening on port {port}, {} lanes per peer", config.lanes);
        Ok(TcpTransport { config, port, peers: Mutex::new(HashMap::new()), stop })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    fn lanes_to(&self, peer: &Endpoint) -> Result<Arc<PeerLanes>, String> {
        let Endpoint::Tcp { host, port } = peer else {
            return Err(format!("{peer} is not a tcp endpoint"));
        };
        let slot = self.peers.lock().entry(peer.clone()).or_default().clone();
        let mut current = slot.lanes.lock();
        if let Some(lanes) = current.as_ref() {
            if !lanes.lanes.iter().any(Lane::is_dead) {
                return Ok(lanes.clone());
            }
        }
        *current = None;
        let name = format!("{host}:{port}");
        let addr: SocketAddr = (host.as_str(), *port)
            .to_socket_addrs()
            .map_err(|e| format!("cannot resolve {name}: {e}"))?
            .next()
            .ok_or_else(|| format!("{name} resolves to no address"))?;
        let lanes = (0..self.config.lanes)
            .map(|_| Lane::connect(&name, addr, self.config.connect_timeout))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("cannot connect to {name}: {e}"))?;
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

    fn submit(&self, peer: &Endpoint, slices: Vec<Slice>) {
        match self.lanes_to(peer) {
            Ok(peer_lanes) => {
                let n = peer_lanes.lanes.len();
                for slice in slices {
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

impl Drop for TcpTransport {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the accept loop so that it sees the stop flag.
        let _ = TcpStream::connect_timeout(&SocketAddr::from(([127, 0, 0, 1], self.port)), Duration::from_millis(200));
    }
}
