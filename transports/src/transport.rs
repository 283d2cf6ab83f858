//! The `Transport` trait, implemented by `tcp` and `shm`, and next by `rdma`.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::{Region, RegionKeys, Slice, TransportError};

/// A peer's registered region and the keys its transports need to reach it, as listed in
/// the peer's segment descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteRegion {
    /// Its first byte's address in the peer.
    pub addr: u64,
    /// Its length in bytes.
    pub len: u64,
    /// Its keys, per transport.
    pub keys: RegionKeys,
}

/// Which transport moves the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TransportKind {
    /// Shared memory with a peer on the same host.
    Shm,
    /// One-sided RDMA over RC queue pairs.
    Rdma,
    /// TCP connections.
    Tcp,
}

impl TransportKind {
    /// Its protocol name (`"tcp"`, `"rdma"`, `"shm"`), as Mooncake's `--protocol` takes it.
    pub fn as_str(self) -> &'static str {
        match self {
            TransportKind::Shm => "shm",
            TransportKind::Rdma => "rdma",
            TransportKind::Tcp => "tcp",
        }
    }
}

impl fmt::Display for TransportKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for TransportKind {
    type Err = TransportError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "tcp" => Ok(TransportKind::Tcp),
            "rdma" => Ok(TransportKind::Rdma),
            "shm" => Ok(TransportKind::Shm),
            other => {
                Err(TransportError::InvalidArgument(format!("unknown protocol {other:?} (expected tcp, rdma or shm)")))
            }
        }
    }
}

/// How to reach one transport of a peer; published in the peer's segment descriptor.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "protocol", rename_all = "lowercase")]
pub enum Endpoint {
    /// TCP: the peer's transport listener.
    Tcp {
        /// Its host.
        host: String,
        /// Its port.
        port: u16,
    },
    /// RDMA: queue pairs are set up through a small exchange on `host:port`, between
    /// this side's devices and the peer's `devices` (names, in the peer's order).
    Rdma {
        /// The exchange listener's host.
        host: String,
        /// The exchange listener's port.
        port: u16,
        /// The peer's devices, by name.
        devices: Vec<String>,
    },
    /// A same-host peer: the abstract unix socket it listens on. Its pid is not published:
    /// the kernel tells it on connection (`SO_PEERCRED`), which is also right across pid
    /// namespaces and after a restart.
    Shm {
        /// The socket's abstract name (without the leading NUL).
        socket: String,
    },
}

impl Endpoint {
    /// The transport it reaches.
    pub fn kind(&self) -> TransportKind {
        match self {
            Endpoint::Tcp { .. } => TransportKind::Tcp,
            Endpoint::Rdma { .. } => TransportKind::Rdma,
            Endpoint::Shm { .. } => TransportKind::Shm,
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Tcp { host, port } => write!(f, "tcp://{host}:{port}"),
            Endpoint::Rdma { host, port, devices } => write!(f, "rdma://{host}:{port}[{}]", devices.join(",")),
            Endpoint::Shm { socket } => write!(f, "shm://@{socket}"),
        }
    }
}

/// A way of moving slices between this process's registered memory and a peer's.
///
/// Contract:
/// * `submit` never blocks on the network for long and never fails as a whole: each slice ends
///   through its [`crate::Completion`] (`Completed` or `Failed`), including when the peer
///   cannot be reached or dies;
/// * the target side checks every access against its [`crate::RegionTable`];
/// * received bytes go straight into registered memory and sent bytes come straight from it.
pub trait Transport: Send + Sync {
    /// Which transport this is.
    fn kind(&self) -> TransportKind;

    /// What peers need to reach this transport.
    fn endpoint(&self) -> Endpoint;

    /// The longest slice this transport takes; the engine cuts requests accordingly.
    fn max_slice_len(&self) -> u64;

    /// The slice length for a request of `request_len` bytes: at most [`Self::max_slice_len`].
    /// A transport with several parallel paths to a peer may cut smaller, so that one request
    /// keeps all of them busy.
    fn slice_len_for(&self, request_len: u64) -> u64 {
        let _ = request_len;
        self.max_slice_len()
    }

    /// Called for each newly registered region; returns the data peers need to access it
    /// (none for tcp, memory keys for rdma).
    fn register_region(&self, _region: &Arc<Region>) -> Result<RegionKeys, TransportError> {
        Ok(RegionKeys::default())
    }

    /// Called once the region has left the table, before the unregister returns: afterwards
    /// no peer may access the region through this transport.
    fn unregister_region(&self, _region: &Arc<Region>) -> Result<(), TransportError> {
        Ok(())
    }

    /// Tells the transport which regions `peer` exports and their keys (from the peer's
    /// descriptor, each time it is fetched); replaces what was known before.
    fn set_peer_regions(&self, _peer: &Endpoint, _regions: Vec<RemoteRegion>) {}
    /// Checks, when the engine chooses a transport for a segment, that this transport can
    /// reach `peer` now; an error says why not, and the engine tries the next transport.
    fn connect(&self, _peer: &Endpoint) -> Result<(), TransportError> {
        Ok(())
    }

    /// Starts moving `slices` to or from `peer`.
    fn submit(&self, peer: &Endpoint, slices: Vec<Slice>);

    /// Drops cached connections to `peer` (its descriptor changed or it is gone).
    fn forget_peer(&self, peer: &Endpoint);
}
