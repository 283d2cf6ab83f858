//! Target side of the shm transport: grants peers access to registered regions and revokes
//! the grants when a region is unregistered (see the lifetime design in [`super`]).

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::socket::Socket;
use super::wire::{Frame, IpcGrant, Kind, Mode, Status, VmmGrant, FEATURE_DEVICE_VMM, PROBE_LEN};
use crate::device::DeviceMemory;
use crate::net::serve::Accepted;
use crate::{Region, RegionTable, TransportError};

/// Connections served at once; more are closed right after accept.
pub const MAX_CONNECTIONS: usize = 1024;
/// Connections served at once from one process (an initiator needs one).
pub const MAX_CONNECTIONS_PER_PROCESS: usize = 16;
/// How long a new connection may take to send its first frame (its hello).
pub const FIRST_FRAME_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a send to an initiator may block before its connection is given up.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(5);

struct Export {
    id: u64,
    region: Weak<Region>,
}

/// One initiator's connection.
struct Conn {
    socket: Arc<Socket>,
    /// Held from the region lookup of a grant until its reply is sent, and while a revoke is
    /// sent: a grant is thus either sent before the revoke of its region or refused.
    send: Mutex<()>,
    /// Regions granted to this initiator and not yet released by a `RevokeAck`.
    granted: Mutex<HashSet<u64>>,
    changed: Condvar,
    dead: AtomicBool,
    /// What the initiator's hello announced it takes ([`super::wire::FEATURES`]).
    features: AtomicU64,
}

impl Conn {
    fn mark_dead(&self) {
        let _g = self.granted.lock();
        self.dead.store(true, Ordering::Release);
        self.changed.notify_all();
    }
}

pub(super) struct Server {
    table: Arc<RegionTable>,
    exports: Mutex<HashMap<u64, Export>>,
    next_region: AtomicU64,
    conns: Mutex<Vec<Weak<Conn>>>,
    /// A word whose address and value go to every initiator, which reads it with
    /// `process_vm_readv` to learn whether the kernel lets it reach this process's memory.
    probe: Box<u64>,
}

impl Server {
    pub(super) fn new(table: Arc<RegionTable>) -> Arc<Server> {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        Arc::new(Server {
            table,
            exports: Mutex::new(HashMap::new()),
            next_region: AtomicU64::new(1),
            conns: Mutex::new(Vec::new()),
            probe: Box::new(seed ^ (u64::from(std::process::id()) << 32) | 1),
        })
    }

    /// Serves one initiator's connection (on its own thread, from the net layer's accept
    /// loop) until it closes, breaks the protocol or is shut down.
    pub(super) fn serve_connection(&self, accepted: Accepted<Socket>) {
        let peer = accepted.peer.clone();
        if let Err(e) = accepted.stream.set_send_timeout(SEND_TIMEOUT) {
            tracing::warn!("shm transport: cannot set a send timeout for {peer}: {e}");
            return;
        }
        let conn = Arc::new(Conn {
            socket: accepted.stream,
            send: Mutex::new(()),
            granted: Mutex::new(HashSet::new()),
            changed: Condvar::new(),
            dead: AtomicBool::new(false),
            features: AtomicU64::new(0),
        });
        {
            let mut conns = self.conns.lock();
            conns.retain(|c| c.strong_count() > 0);
            conns.push(Arc::downgrade(&conn));
        }
        if let Err(e) = self.serve(&conn) {
            tracing::warn!("shm transport: closing the connection of {peer}: {e}");
        }
        conn.mark_dead();
        conn.socket.shutdown();
    }

    fn serve(&self, conn: &Conn) -> Result<(), String> {
        // A peer that connects and says nothing is closed; after its hello, a connection idles
        // for as long as the peer holds grants (copies go through the mapping, not here).
        let mut deadline = Some(Instant::now() + FIRST_FRAME_TIMEOUT);
        loop {
            let received = conn.socket.recv_by(deadline);
            deadline = None;
            let frame = match received {
                Ok(Some((frame, _))) => frame,
                Ok(None) => return Ok(()),
                Err(e) => return Err(e.to_string()),
            };
            match frame.kind {
                Kind::Hello => {
                    conn.features.store(frame.id, Ordering::Relaxed);
                    let reply = Frame {
                        id: *self.probe,
                        addr: &*self.probe as *const u64 as u64,
                        len: PROBE_LEN,
                        ..Frame::new(Kind::HelloReply)
                    };
                    let _send = conn.send.lock();
                    conn.socket.send(&reply, None).map_err(|e| e.to_string())?;
                }
                Kind::Map => self.grant(conn, &frame)?,
                Kind::RevokeAck => {
                    let mut granted = conn.granted.lock();
                    granted.remove(&frame.region);
                    conn.changed.notify_all();
                }
                kind => return Err(format!("a peer sent a {kind:?} frame, which only targets send")),
            }
        }
    }

    /// Answers a `Map` request: the registered region holding the range, or a refusal.
    fn grant(&self, conn: &Conn, req: &Frame) -> Result<(), String> {
        let _send = conn.send.lock();
        let found = self.table.find(req.addr, req.len).and_then(|region| {
            let exports = self.exports.lock();
            let export = exports.get(&region.addr())?;
            let same = export.region.upgrade().is_some_and(|r| Arc::ptr_eq(&r, &region));
            same.then_some((region, export.id))
        });
        let Some((region, id)) = found else {
            tracing::debug!("shm transport: a peer asked for [{:#x}, +{}), which is not registered", req.addr, req.len);
            let refusal = Frame { status: Status::OutOfRange, id: req.id, ..Frame::new(Kind::MapReply) };
            return conn.socket.send(&refusal, None).map_err(|e| e.to_string());
        };
        // Device memory is opened by the peer through its allocation's IPC handle; memory the
        // engine allocated (sealed, one memfd per region) is mapped by the peer; any other
        // registered memory is reached with process_vm_readv/writev.
        let memfd =
            region.shared_memory().filter(|m| m.sealed() && m.addr() == region.addr() && m.len() == region.len());
        let (mode, ipc, vmm, device_fd) = match region.device() {
            Some(memory) => match export_device(conn, memory, region.addr()) {
                Ok(grant) => grant,
                Err(e) => {
                    tracing::warn!("shm transport: cannot export device memory at {:#x} to a peer: {e}", region.addr());
                    let refusal = Frame { status: Status::DeviceUnavailable, id: req.id, ..Frame::new(Kind::MapReply) };
                    return conn.socket.send(&refusal, None).map_err(|e| e.to_string());
                }
            },
            None if memfd.is_some() => (Mode::Memfd, None, None, None),
            None => (Mode::ProcessVm, None, None, None),
        };
        let reply = Frame {
            mode,
            id: req.id,
            addr: region.addr(),
            len: region.len(),
            region: id,
            ipc,
            vmm,
            ..Frame::new(Kind::MapReply)
        };
        conn.granted.lock().insert(id);
        let fd = match mode {
            Mode::Memfd => memfd.map(|m| m.fd()),
            Mode::DeviceVmm => device_fd.as_ref().map(|fd| fd.as_fd()),
            _ => None,
        };
        // The exported descriptor (a VMM allocation's) is closed here once sent: the peer
        // holds its own copy.
        conn.socket.send(&reply, fd).map_err(|e| e.to_string())
    }

    pub(super) fn export(&self, region: &Arc<Region>) {
        let id = self.next_region.fetch_add(1, Ordering::Relaxed);
        self.exports.lock().insert(region.addr(), Export { id, region: Arc::downgrade(region) });
    }

    /// Revokes every grant of `region` and waits (up to `wait`) until each initiator that
    /// holds one has acknowledged, i.e. no copy of theirs touches the region any more.
    pub(super) fn revoke(&self, region: &Arc<Region>, wait: Duration) -> Result<(), TransportError> {
        let id = {
            let mut exports = self.exports.lock();
            match exports.get(&region.addr()) {
                Some(e) if e.region.as_ptr() == Arc::as_ptr(region) => {
                    let id = e.id;
                    exports.remove(&region.addr());
                    id
                }
                _ => return Ok(()),
            }
        };
        let conns: Vec<Arc<Conn>> = self.conns.lock().iter().filter_map(Weak::upgrade).collect();
        let mut waiting = Vec::new();
        for conn in conns {
            let _send = conn.send.lock();
            if conn.dead.load(Ordering::Acquire) || !conn.granted.lock().contains(&id) {
                continue;
            }
            let revoke = Frame { region: id, ..Frame::new(Kind::Revoke) };
            match conn.socket.send(&revoke, None) {
                Ok(()) => waiting.push(conn.clone()),
                Err(e) => {
                    tracing::warn!("shm transport: cannot send a revoke, dropping the peer: {e}");
                    conn.socket.shutdown();
                }
            }
        }
        let deadline = Instant::now() + wait;
        let mut stuck = 0;
        for conn in waiting {
            let mut granted = conn.granted.lock();
            while granted.contains(&id) && !conn.dead.load(Ordering::Acquire) {
                if conn.changed.wait_until(&mut granted, deadline).timed_out() {
                    break;
                }
            }
            if granted.contains(&id) && !conn.dead.load(Ordering::Acquire) {
                // Its copies may still run: cut the peer off so it asks again (and is refused).
                stuck += 1;
                drop(granted);
                conn.socket.shutdown();
            }
        }
        if stuck > 0 {
            return Err(TransportError::RegionBusy {
                addr: region.addr(),
                why: format!(
                    "{stuck} same-host peer(s) did not release their mapping within {wait:?}; \
                     they were disconnected"
                ),
            });
        }
        Ok(())
    }
}

/// A device grant's mode, its IPC handle or VMM block, and the descriptor sent with it.
type DeviceExport = (Mode, Option<IpcGrant>, Option<VmmGrant>, Option<OwnedFd>);

/// How a peer reaches registered device memory at `addr` (the region's start): memory of the
/// virtual memory management API as a descriptor of its allocation (`DeviceVmm`, to a peer
/// that takes it), any other through its allocation's IPC handle (`DeviceIpc`).
fn export_device(conn: &Conn, memory: &DeviceMemory, addr: u64) -> Result<DeviceExport, TransportError> {
    let allocation = &memory.allocation;
    let offset = addr - allocation.base;
    if let Some(fd) = memory.driver.api().vmm_export(allocation)? {
        if conn.features.load(Ordering::Relaxed) & FEATURE_DEVICE_VMM == 0 {
            return Err(TransportError::Driver {
                call: "vmm_export",
                reason: "it is VMM memory (cuMemCreate), which this peer's version cannot import".into(),
            });
        }
        let vmm = VmmGrant { device: allocation.device, offset, size: allocation.len };
        return Ok((Mode::DeviceVmm, None, Some(vmm), Some(fd)));
    }
    let handle = memory.driver.api().ipc_export(allocation)?;
    Ok((Mode::DeviceIpc, Some(IpcGrant { device: allocation.device, offset, handle: handle.0 }), None, None))
}
