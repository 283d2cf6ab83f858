//! Initiator side of the shm transport: one connection to a same-host peer, the grants it
//! received (mapped memfds and process_vm ranges) and the thread that reads the peer's
//! replies and revocations.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{bounded, Sender};
use parking_lot::{Mutex, RwLock, RwLockReadGuard};

use super::copy;
use super::mapping::Mapping;
use super::socket::Socket;
use super::wire::{Frame, Kind, Mode, Status, FEATURES};
use crate::device::{IpcMapping, VmmMapping};
use crate::{FailureReason, RegionTable, Slice};

/// Slices of one grant claimed together and copied back to back (see [`Peer::copy_run`]).
pub const RUN: usize = 4;

/// How long the peer may take to answer a hello or a map request.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(5);

/// How a granted region is reached.
enum Access {
    Mapped(Mapping),
    ProcessVm,
    /// The peer's device allocation, opened here; the region starts `offset` bytes into it.
    Device {
        mapping: Arc<IpcMapping>,
        offset: u64,
    },
    /// The peer's VMM allocation, mapped here for this grant; the region starts `offset`
    /// bytes into it.
    Vmm {
        mapping: VmmMapping,
        offset: u64,
    },
}

/// Access to one registered region of the peer, until the peer revokes it.
pub(super) struct Grant {
    id: u64,
    addr: u64,
    len: u64,
    access: Access,
    /// Read-held by every copy; the reader thread takes it for writing to revoke the grant,
    /// which waits for copies in progress and fails later ones.
    live: RwLock<bool>,
}

impl Grant {
    fn contains(&self, addr: u64, len: u64) -> bool {
        addr >= self.addr && addr.checked_add(len).is_some_and(|end| end <= self.addr + self.len)
    }
}

/// Why a copy did not happen.
pub(super) enum CopyError {
    /// The range is not inside one registered region of the peer.
    OutOfRange,
    /// The grant was revoked meanwhile: ask again.
    Revoked,
    Failed(FailureReason),
}

struct PendingMap {
    addr: u64,
    len: u64,
    reply: Sender<Result<Option<Arc<Grant>>, String>>,
}

pub(super) struct Peer {
    name: String,
    socket: Socket,
    /// This process's registered memory: which local ranges are on a device, and the driver
    /// that opens a peer's device memory.
    table: Arc<RegionTable>,
    pid: i32,
    /// Why process_vm_readv/writev cannot reach the peer, if it cannot.
    process_vm_denied: Option<String>,
    grants: RwLock<BTreeMap<u64, Arc<Grant>>>,
    /// One map request at a time (regions are mapped once, then reused).
    map_lock: Mutex<()>,
    pending: Mutex<HashMap<u64, PendingMap>>,
    next_id: AtomicU64,
    /// Grant lookups so far (each a shared lock of `grants`; a run of copies inside one grant
    /// looks it up once).
    lookups: AtomicU64,
    dead: AtomicBool,
    dead_reason: Mutex<Option<String>>,
}

impl Peer {
    /// Connects to the peer listening on `socket_name`, learns its pid from the kernel and
    /// whether process_vm access to it works.
    pub(super) fn connect(
        socket_name: &str,
        auth: &crate::net::Auth,
        table: Arc<RegionTable>,
    ) -> Result<Arc<Peer>, String> {
        use std::os::fd::AsFd;
        let name = format!("shm peer @{socket_name}");
        let socket =
            Socket::connect(socket_name, REPLY_TIMEOUT).map_err(|e| format!("cannot connect to {name}: {e}"))?;
        auth.dial(crate::net::Service::Shm, &mut socket.as_fd(), Some(std::time::Instant::now() + REPLY_TIMEOUT))
            .map_err(|e| format!("{name}: {e}"))?;
        let cred = socket.peer_cred().map_err(|e| format!("cannot identify {name}: {e}"))?;
        let pid = cred.pid.as_raw_nonzero().get();
        let hello = Self::hello(&socket).map_err(|e| format!("{name} did not complete the hello: {e}"))?;
        let denied = copy::probe(pid, hello.addr, hello.id).err();
        if let Some(why) = &denied {
            tracing::debug!("{name} (pid {pid}): no process_vm access: {why}");
        }
        let peer = Arc::new(Peer {
            name: format!("{name} (pid {pid})"),
            socket,
            table,
            pid,
            process_vm_denied: denied,
            grants: RwLock::new(BTreeMap::new()),
            map_lock: Mutex::new(()),
            pending: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            lookups: AtomicU64::new(0),
            dead: AtomicBool::new(false),
            dead_reason: Mutex::new(None),
        });
        let reader = peer.clone();
        std::thread::Builder::new()
            .name("crescent-shm-peer".into())
            .spawn(move || reader.read_loop())
            .map_err(|e| format!("cannot start the reader thread for {name}: {e}"))?;
        Ok(peer)
    }

    fn hello(socket: &Socket) -> Result<Frame, String> {
        socket.send(&Frame { id: FEATURES, ..Frame::new(Kind::Hello) }, None).map_err(|e| e.to_string())?;
        let reply = match socket.recv_by(Some(std::time::Instant::now() + REPLY_TIMEOUT)) {
            Ok(Some((frame, _))) if frame.kind == Kind::HelloReply => frame,
            Ok(Some((frame, _))) => return Err(format!("it answered with {:?}", frame.kind)),
            Ok(None) => return Err("it closed the connection".into()),
            Err(e) => return Err(e.to_string()),
        };
        Ok(reply)
    }

    pub(super) fn name(&self) -> &str {
        &self.name
    }

    /// Why the kernel refuses process_vm access to this peer, if it does.
    pub(super) fn process_vm_denied(&self) -> Option<&str> {
        self.process_vm_denied.as_deref()
    }

    pub(super) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    fn gone(&self) -> String {
        let reason = self.dead_reason.lock().clone().unwrap_or_default();
        format!("{} is gone: {reason}", self.name)
    }

    /// Closes the connection; the reader thread then revokes every grant.
    pub(super) fn close(&self) {
        self.socket.shutdown();
    }

    /// Grant lookups made so far.
    #[cfg(test)]
    pub(super) fn lookups(&self) -> u64 {
        self.lookups.load(Ordering::Relaxed)
    }

    fn find_grant(&self, addr: u64, len: u64) -> Option<Arc<Grant>> {
        self.lookups.fetch_add(1, Ordering::Relaxed);
        let grants = self.grants.read();
        let (_, g) = grants.range(..=addr).next_back()?;
        g.contains(addr, len).then(|| g.clone())
    }

    /// The grant covering `[addr, +len)`, asking the peer for it if needed.
    fn grant_for(&self, addr: u64, len: u64) -> Result<Arc<Grant>, CopyError> {
        if let Some(g) = self.find_grant(addr, len) {
            return Ok(g);
        }
        let _one = self.map_lock.lock();
        if let Some(g) = self.find_grant(addr, len) {
            return Ok(g);
        }
        if self.is_dead() {
            return Err(CopyError::Failed(FailureReason::peer_gone(self.gone())));
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = bounded(1);
        self.pending.lock().insert(id, PendingMap { addr, len, reply: tx });
        let request = Frame { id, addr, len, ..Frame::new(Kind::Map) };
        if let Err(e) = self.socket.send(&request, None) {
            self.pending.lock().remove(&id);
            self.close();
            return Err(CopyError::Failed(FailureReason::peer_gone(format!("cannot send to {}: {e}", self.name))));
        }
        match rx.recv_timeout(REPLY_TIMEOUT) {
            Ok(Ok(Some(grant))) => Ok(grant),
            Ok(Ok(None)) => Err(CopyError::OutOfRange),
            Ok(Err(reason)) => Err(CopyError::Failed(FailureReason::local(reason))),
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                self.pending.lock().remove(&id);
                Err(CopyError::Failed(FailureReason::timed_out(format!(
                    "{} did not answer a map request within {REPLY_TIMEOUT:?}",
                    self.name
                ))))
            }
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                Err(CopyError::Failed(FailureReason::peer_gone(self.gone())))
            }
        }
    }

    /// Copies `slice` (`[remote, +len)` of the peer) inside a grant, asking the peer for one if
    /// none is held; the copy runs while the slice's local memory is claimed (not at all when
    /// the slice already ended).
    fn copy(&self, slice: Slice) -> (Slice, Result<(), CopyError>) {
        let grant = match self.grant_for(slice.remote_addr, slice.len) {
            Ok(grant) => grant,
            Err(e) => return (slice, Err(e)),
        };
        let live = grant.live.read();
        if !*live {
            return (slice, Err(CopyError::Revoked));
        }
        let run = [slice];
        let mut results = Vec::with_capacity(1);
        self.copy_in(&grant, &live, &run, &mut results);
        let [slice] = run;
        (slice, results.pop().expect("one outcome per slice"))
    }

    /// Copies the slices `next` hands out and reports each with its outcome to `done`.
    /// Consecutive slices inside one grant share its lookup and its shared lock, and are
    /// copied in runs of up to [`RUN`]: every slice of a run is claimed first, then all are
    /// copied back to back, then the claims end (see [`crate::Completion::claim_here`]). The
    /// lock is yielded between runs to a revoke that waits for it
    /// ([`RwLockReadGuard::bump`]), so a revoke waits for one run at most.
    ///
    /// `wait`: a slice without a grant at hand asks the peer for it (as [`Peer::copy`]).
    /// Otherwise the run stops there and gives that slice back undone: the submitting thread
    /// copies only what it can copy at once, and leaves the asking to a copy thread.
    pub(super) fn copy_run(
        &self,
        wait: bool,
        next: &mut dyn FnMut() -> Option<Slice>,
        done: &mut dyn FnMut(Slice, Result<(), CopyError>),
    ) -> Option<Slice> {
        let mut slice = next()?;
        let mut run: Vec<Slice> = Vec::with_capacity(RUN);
        let mut results: Vec<Result<(), CopyError>> = Vec::with_capacity(RUN);
        loop {
            let (remote, len) = (slice.remote_addr, slice.len);
            let grant = if wait {
                match self.grant_for(remote, len) {
                    Ok(grant) => grant,
                    Err(e) => {
                        done(slice, Err(e));
                        slice = next()?;
                        continue;
                    }
                }
            } else {
                match self.find_grant(remote, len) {
                    Some(grant) => grant,
                    None => return Some(slice),
                }
            };
            let mut live = match wait {
                true => grant.live.read(),
                false => match grant.live.try_read() {
                    Some(live) => live,
                    None => return Some(slice),
                },
            };
            if !*live {
                drop(live);
                if !wait {
                    return Some(slice);
                }
                // Revoked under our feet: ask again once (the region may be registered anew).
                let (s, result) = self.copy(slice);
                done(s, result);
                slice = next()?;
                continue;
            }
            // Runs inside this grant; `slice` is the first slice of the next run.
            loop {
                run.push(slice);
                let mut after = None;
                while run.len() < RUN {
                    match next() {
                        Some(s) if grant.contains(s.remote_addr, s.len) => run.push(s),
                        other => {
                            after = other;
                            break;
                        }
                    }
                }
                let full = run.len() == RUN;
                self.copy_in(&grant, &live, &run, &mut results);
                for (s, result) in run.drain(..).zip(results.drain(..)) {
                    done(s, result);
                }
                slice = match after {
                    Some(s) => s,
                    None if full => next()?,
                    None => return None, // `next` has nothing left
                };
                if !grant.contains(slice.remote_addr, slice.len) {
                    break;
                }
                RwLockReadGuard::bump(&mut live);
                if !*live {
                    break; // revoked meanwhile: looked up again above
                }
            }
        }
    }

    /// The copies of `run`, inside `grant`, whose lock the caller holds shared (`_live`,
    /// which keeps the grant's memory from being revoked until the copies are done) and found
    /// live; one outcome per slice goes to `results`. A slice that already ended is not copied
    /// (and counts as done: its outcome was decided).
    fn copy_in(
        &self,
        grant: &Grant,
        _live: &RwLockReadGuard<'_, bool>,
        run: &[Slice],
        results: &mut Vec<Result<(), CopyError>>,
    ) {
        debug_assert!(run.len() <= RUN);
        // Every slice's local memory claimed first; the claims end together below.
        let claims: [Option<crate::BorrowedClaim<'_>>; RUN] =
            std::array::from_fn(|i| run.get(i).and_then(|s| s.completion.claim_here()));
        for (slice, claim) in run.iter().zip(&claims) {
            // Checked before each copy, so that process_vm never reaches a pid known dead.
            if self.is_dead() {
                results.push(Err(CopyError::Failed(FailureReason::peer_gone(self.gone()))));
                continue;
            }
            if claim.is_none() {
                results.push(Ok(()));
                continue;
            }
            let Slice { opcode: op, local_addr: local, remote_addr: remote, len, .. } = *slice;
            let offset = remote - grant.addr;
            // Local device memory is never touched by the CPU: the driver copies it.
            let local_device = self.table.device_memory(local, len);
            let outcome = match (&grant.access, &local_device) {
                (Access::Mapped(mapping), None) => match mapping.at(offset, len) {
                    Some(at) => {
                        // SAFETY: `local` is registered memory of a live slice, claimed
                        // above; `at` is inside the mapping, which the read-held live grant
                        // keeps mapped.
                        unsafe { copy::memcpy(op, local as *mut u8, at, len as usize) };
                        Ok(())
                    }
                    None => Err("range outside the peer's mapping".to_string()),
                },
                (Access::Mapped(mapping), Some(memory)) => match mapping.at(offset, len) {
                    Some(at) => copy::device(&memory.driver, memory.allocation.device, op, local, at as u64, len),
                    None => Err("range outside the peer's mapping".to_string()),
                },
                // SAFETY: as above for `local`; the grant (read-held) guarantees that the
                // peer still has `[remote, +len)` registered, and the peer is alive (its pid
                // cannot have been reused: see the module documentation).
                (Access::ProcessVm, None) => unsafe { copy::process_vm(self.pid, op, local, remote, len) },
                // SAFETY: as for the plain process_vm copy; the device side is the driver's.
                (Access::ProcessVm, Some(memory)) => unsafe {
                    copy::process_vm_staged(self.pid, op, memory, local, remote, len)
                },
                // The opened allocation holds the region at `base + offset` (checked against
                // the allocation's size when the grant was installed).
                (Access::Device { mapping, offset: at }, _) => {
                    let remote = mapping.base() + at + offset;
                    copy::device(mapping.driver(), mapping.device(), op, local, remote, len)
                }
                // Likewise (checked against the mapping's size when the grant was installed).
                (Access::Vmm { mapping, offset: at }, _) => {
                    let remote = mapping.base() + at + offset;
                    copy::device(mapping.driver(), mapping.device(), op, local, remote, len)
                }
            };
            // The peer's memory could not be copied (it may have died meanwhile: its grants
            // are then revoked, and the next copy says so).
            results.push(
                outcome
                    .map_err(|reason| CopyError::Failed(FailureReason::peer_gone(format!("{}: {reason}", self.name)))),
            );
        }
        drop(claims);
    }

    fn read_loop(self: Arc<Self>) {
        let reason = loop {
            match self.socket.recv() {
                Ok(Some((frame, fd))) => {
                    if let Err(e) = self.handle(frame, fd) {
                        break e;
                    }
                }
                Ok(None) => break "it closed the connection".to_string(),
                Err(e) => break format!("it broke the protocol: {e}"),
            }
        };
        tracing::debug!("shm transport: {}: {reason}", self.name);
        *self.dead_reason.lock() = Some(reason);
        self.dead.store(true, Ordering::Release);
        self.socket.shutdown();
        // Fail map requests in flight, then revoke every grant (waiting for copies).
        self.pending.lock().clear();
        let grants = std::mem::take(&mut *self.grants.write());
        for grant in grants.values() {
            *grant.live.write() = false;
        }
    }

    fn handle(&self, frame: Frame, fd: Option<OwnedFd>) -> Result<(), String> {
        match frame.kind {
            Kind::MapReply => {
                let Some(pending) = self.pending.lock().remove(&frame.id) else {
                    // A reply to a request that timed out: a mapping nobody asked for now.
                    tracing::debug!("shm transport: {}: late map reply", self.name);
                    return Ok(());
                };
                match self.install(&frame, fd, &pending) {
                    Ok(outcome) => {
                        let _ = pending.reply.send(outcome);
                        Ok(())
                    }
                    Err(Fatal(reason)) => {
                        let _ = pending.reply.send(Err(reason.clone()));
                        Err(reason)
                    }
                }
            }
            Kind::Revoke => {
                let grant = {
                    let mut grants = self.grants.write();
                    let addr = grants.iter().find(|(_, g)| g.id == frame.region).map(|(a, _)| *a);
                    addr.and_then(|a| grants.remove(&a))
                };
                if let Some(grant) = grant {
                    // Waits for copies in progress; later copies see the grant dead.
                    *grant.live.write() = false;
                }
                let ack = Frame { region: frame.region, ..Frame::new(Kind::RevokeAck) };
                self.socket.send(&ack, None).map_err(|e| e.to_string())
            }
            kind => Err(format!("it sent a {kind:?} frame, which only initiators send")),
        }
    }

    /// Turns a map reply into a grant (`Ok(Ok(None))`: out of range; `Ok(Err)`: a grant
    /// this process cannot use); a reply that contradicts the request is fatal.
    fn install(
        &self,
        frame: &Frame,
        fd: Option<OwnedFd>,
        pending: &PendingMap,
    ) -> Result<Result<Option<Arc<Grant>>, String>, Fatal> {
        if frame.status == Status::OutOfRange {
            return Ok(Ok(None));
        }
        if frame.status == Status::DeviceUnavailable {
            return Ok(Err(format!("{} cannot export its device memory to this process", self.name)));
        }
        if !frame.contains(pending.addr, pending.len) {
            return Err(Fatal(format!(
                "{} granted [{:#x}, +{}) for a request of [{:#x}, +{}]",
                self.name, frame.addr, frame.len, pending.addr, pending.len
            )));
        }
        let access = match (frame.mode, fd) {
            (Mode::Memfd, Some(fd)) => match Mapping::map(fd, frame.len) {
                Ok(m) => Access::Mapped(m),
                Err(e) => return Err(Fatal(format!("{}: {e}", self.name))),
            },
            (Mode::ProcessVm, None) => match &self.process_vm_denied {
                None => Access::ProcessVm,
                // Not fatal: the peer's memfd regions remain reachable.
                Some(why) => return Ok(Err(format!("{}: {why}", self.name))),
            },
            // Not fatal either: the peer's host memory remains reachable.
            (Mode::DeviceIpc, None) => match self.open_device(frame) {
                Ok(access) => access,
                Err(why) => return Ok(Err(format!("{}: {why}", self.name))),
            },
            (Mode::DeviceVmm, Some(fd)) => match self.import_device(frame, fd) {
                Ok(access) => access,
                Err(why) => return Ok(Err(format!("{}: {why}", self.name))),
            },
            _ => return Err(Fatal(format!("{}: a grant without its memory", self.name))),
        };
        let grant =
            Arc::new(Grant { id: frame.region, addr: frame.addr, len: frame.len, access, live: RwLock::new(true) });
        let mut grants = self.grants.write();
        let end = frame.addr + frame.len;
        let overlaps = grants.range(..end).next_back().is_some_and(|(_, g)| g.addr + g.len > frame.addr);
        if overlaps {
            return Err(Fatal(format!("{} granted a region overlapping one it granted before", self.name)));
        }
        grants.insert(frame.addr, grant.clone());
        drop(grants);
        if matches!(grant.access, Access::Mapped(_)) {
            prefault_in_background(grant.clone());
        }
        Ok(Ok(Some(grant)))
    }
}

impl Peer {
    /// Opens the device allocation of a `DeviceIpc` grant, on the same device ordinal when
    /// this process sees it (else its first device), and checks that the granted region lies
    /// inside what was opened (the peer's numbers are not trusted).
    fn open_device(&self, frame: &Frame) -> Result<Access, String> {
        let ipc = frame.ipc.as_ref().ok_or("a device grant without its handle")?;
        let driver = self.table.devices().driver().map_err(|e| format!("cannot open its device memory: {e}"))?;
        let count = driver.api().device_count().map_err(|e| e.to_string())?;
        let device = if ipc.device < count { ipc.device } else { 0 };
        let handle = crate::device::IpcHandle(ipc.handle);
        let mapping = driver.open_ipc(device, &handle).map_err(|e| format!("cannot open its device memory: {e}"))?;
        let opened = driver.api().allocation(mapping.base()).map_err(|e| e.to_string())?;
        let start = ipc.offset.checked_add(mapping.base()).filter(|s| s.checked_add(frame.len).is_some());
        let inside = start.is_some_and(|start| opened.is_some_and(|a| a.contains(start, frame.len)));
        if !inside {
            return Err(format!(
                "its device grant [+{}, +{}) does not lie inside the allocation it opens",
                ipc.offset, frame.len
            ));
        }
        Ok(Access::Device { mapping, offset: ipc.offset })
    }
}

impl Peer {
    /// Maps the VMM allocation of a `DeviceVmm` grant (`fd`, from the peer) on the same
    /// device ordinal when this process sees it (else its first device). The frame's checks
    /// put the region inside the allocation's size, which is what is mapped: the driver
    /// refuses a descriptor of a smaller allocation.
    fn import_device(&self, frame: &Frame, fd: OwnedFd) -> Result<Access, String> {
        let vmm = frame.vmm.as_ref().ok_or("a device grant without its allocation")?;
        let driver = self.table.devices().driver().map_err(|e| format!("cannot map its device memory: {e}"))?;
        let count = driver.api().device_count().map_err(|e| e.to_string())?;
        let device = if vmm.device < count { vmm.device } else { 0 };
        let mapping =
            driver.import_vmm(device, fd, vmm.size).map_err(|e| format!("cannot map its device memory: {e}"))?;
        let inside = vmm.offset.checked_add(frame.len).is_some_and(|end| end <= mapping.len());
        if !inside {
            return Err(format!(
                "its device grant [+{}, +{}) does not lie inside the allocation it maps",
                vmm.offset, frame.len
            ));
        }
        Ok(Access::Vmm { mapping, offset: vmm.offset })
    }
}

/// Bytes pre-faulted per step; the grant's lock is held (shared) for one step at a time, so
/// a revoke waits for one step at most.
const PREFAULT_STEP: u64 = 32 << 20;

/// Faults a new mapping in, step by step, while copies already use it: a mapping is made
/// once per grant, so its page faults should not land inside transfers.
fn prefault_in_background(grant: Arc<Grant>) {
    let spawned = std::thread::Builder::new().name("crescent-shm-prefault".into()).spawn(move || {
        let mut offset = 0;
        while offset < grant.len {
            let live = grant.live.read();
            let Access::Mapped(mapping) = &grant.access else {
                return;
            };
            let step = PREFAULT_STEP.min(grant.len - offset);
            if !*live || !mapping.prefault(offset, step) {
                return;
            }
            drop(live);
            offset += step;
        }
    });
    if let Err(e) = spawned {
        tracing::debug!("shm transport: no thread to pre-fault a mapping: {e}");
    }
}

struct Fatal(String);
