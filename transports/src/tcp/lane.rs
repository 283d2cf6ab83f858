//! Initiator side of the tcp transport: one connection ("lane") to a peer, with a writer
//! thread that sends requests and a reader thread that matches responses to them.

use std::collections::HashMap;
use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use parking_lot::Mutex;

use super::frame::{FrameKind, Header, Status, HEADER_LEN};
use super::io_util::{discard, read_header, write_all_vectored, HeaderRead};
use crate::{Completion, Opcode, Slice, SliceOutcome};

/// How long a send may stall (peer not reading) before the lane is declared broken.
const SEND_STALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Read requests coalesced into one `write` at most.
const MAX_COALESCED: usize = 256;

struct Pending {
    opcode: Opcode,
    local_addr: u64,
    len: u64,
    completion: Completion,
}

struct LaneShared {
    peer: String,
    pending: Mutex<HashMap<u64, Pending>>,
    dead: AtomicBool,
}

impl LaneShared {
    /// Marks the lane broken and fails every slice waiting on it.
    fn fail_all(&self, reason: &str) {
        let first = !self.dead.swap(true, Ordering::AcqRel);
        let drained: Vec<Pending> = self.pending.lock().drain().map(|(_, p)| p).collect();
        if first && !drained.is_empty() {
            tracing::warn!(
                "tcp transport: connection to {} broke with {} slice(s) in flight: {reason}",
                self.peer,
                drained.len()
            );
        } else if first {
            tracing::debug!("tcp transport: connection to {} closed: {reason}", self.peer);
        }
        for p in drained {
            p.completion.fail(format!("connection to {} broke: {reason}", self.peer));
        }
    }
}

pub(super) struct Lane {
    tx: Sender<Slice>,
    shared: Arc<LaneShared>,
    stream: TcpStream,
}

impl Lane {
    pub(super) fn connect(peer: &str, addr: std::net::SocketAddr, timeout: Duration) -> io::Result<Lane> {
        let stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_nodelay(true)?;
        stream.set_write_timeout(Some(SEND_STALL_TIMEOUT))?;
        let shared = Arc::new(LaneShared {
            peer: peer.to_string(),
            pending: Mutex::new(HashMap::new()),
            dead: AtomicBool::new(false),
        });
        let (tx, rx) = crossbeam_channel::unbounded();
        let (w, r) = (stream.try_clone()?, stream.try_clone()?);
        let (ws, rs) = (shared.clone(), shared.clone());
        std::thread::Builder::new().name("crescent-tcp-send".into()).spawn(move || writer_loop(w, rx, ws))?;
        std::thread::Builder::new().name("crescent-tcp-recv".into()).spawn(move || reader_loop(r, rs))?;
        Ok(Lane { tx, shared, stream })
    }

    pub(super) fn is_dead(&self) -> bool {
        self.shared.dead.load(Ordering::Acquire)
    }

    pub(super) fn send(&self, slice: Slice) {
        if let Err(err) = self.tx.send(slice) {
            err.0.completion.fail(format!("connection to {} is closed", self.shared.peer));
        }
    }
}

impl Drop for Lane {
    fn drop(&mut self) {
        // Ends both threads: the reader sees the shutdown and fails what is still pending.
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

fn writer_loop(mut stream: TcpStream, rx: Receiver<Slice>, shared: Arc<LaneShared>) {
    let mut next_id: u64 = 1;
    let mut coalesced: Vec<u8> = Vec::with_capacity(MAX_COALESCED * HEADER_LEN);
    while let Ok(first) = rx.recv() {
        let mut result = Ok(());
        for slice in std::iter::once(first).chain(rx.try_iter().take(MAX_COALESCED - 1)) {
            if result.is_err() || shared.dead.load(Ordering::Acquire) {
                slice.completion.fail(format!("connection to {} is broken", shared.peer));
                continue;
            }
            let id = next_id;
            next_id += 1;
            result = send_one(&mut stream, &shared, &mut coalesced, id, slice);
        }
        if result.is_ok() && !coalesced.is_empty() {
            result = stream.write_all(&coalesced);
            coalesced.clear();
        }
        if let Err(e) = result {
            shared.fail_all(&format!("send failed: {e}"));
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
    // The lane was dropped: fail what was queued but never sent.
    for slice in rx.try_iter() {
        slice.completion.fail(format!("connection to {} was closed", shared.peer));
    }
}

fn send_one(
    stream: &mut TcpStream,
    shared: &LaneShared,
    coalesced: &mut Vec<u8>,
    id: u64,
    slice: Slice,
) -> io::Result<()> {
    let kind = match slice.opcode {
        Opcode::Read => FrameKind::ReadRequest,
        Opcode::Write => FrameKind::WriteRequest,
    };
    let header = Header { kind, status: Status::Ok, id, addr: slice.remote_addr, len: slice.len }.encode();
    let access = slice.completion.local_access();
    let (opcode, local_addr, len) = (slice.opcode, slice.local_addr, slice.len);
    // Registered before the request is on the wire, so the response always finds it.
    shared.pending.lock().insert(id, Pending { opcode, local_addr, len, completion: slice.completion });
    if shared.dead.load(Ordering::Acquire) {
        if let Some(p) = shared.pending.lock().remove(&id) {
            p.completion.fail(format!("connection to {} is broken", shared.peer));
        }
        return Ok(());
    }
    match opcode {
        Opcode::Read => {
            coalesced.extend_from_slice(&header);
            if coalesced.len() >= MAX_COALESCED * HEADER_LEN {
                stream.write_all(coalesced)?;
                coalesced.clear();
            }
            Ok(())
        }
        Opcode::Write => {
            if !coalesced.is_empty() {
                stream.write_all(coalesced)?;
                coalesced.clear();
            }
            let sent = access.and_then(|a| {
                a.with(|| {
                    // SAFETY: the engine checked that [local_addr, +len) lies in a registered
                    // region whose in-flight count it raised; the access claim keeps the slice
                    // from ending (and the memory from being handed back) while we read it.
                    let payload = unsafe { std::slice::from_raw_parts(local_addr as *const u8, len as usize) };
                    write_all_vectored(stream, &mut [IoSlice::new(&header), IoSlice::new(payload)])
                })
            });
            match sent {
                Some(result) => result,
                None => {
                    // The slice ended (timed out) before it was sent: nothing goes on the wire.
                    shared.pending.lock().remove(&id);
                    Ok(())
                }
            }
        }
    }
}

fn reader_loop(mut stream: TcpStream, shared: Arc<LaneShared>) {
    let reason = match read_responses(&mut stream, &shared) {
        Ok(()) => "the peer closed the connection".to_string(),
        Err(e) => e.to_string(),
    };
    shared.fail_all(&reason);
    let _ = stream.shutdown(Shutdown::Both);
}

fn read_responses(stream: &mut TcpStream, shared: &LaneShared) -> io::Result<()> {
    let mut buf = [0u8; HEADER_LEN];
    loop {
        if let HeaderRead::Closed = read_header(stream, &mut buf)? {
            return Ok(());
        }
        let resp = Header::decode(&buf).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        let pending = shared.pending.lock().remove(&resp.id).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidData, format!("response to unknown request id {}", resp.id))
        })?;
        let expected = match pending.opcode {
            Opcode::Read => FrameKind::ReadResponse,
            Opcode::Write => FrameKind::WriteResponse,
        };
        if resp.kind != expected
            || (resp.status == Status::Ok && resp.kind == FrameKind::ReadResponse && resp.len != pending.len)
        {
            let err = format!("response {:?} of {} bytes does not match request {}", resp.kind, resp.len, resp.id);
            pending.completion.fail(err.clone());
            return Err(io::Error::new(io::ErrorKind::InvalidData, err));
        }
        if resp.status == Status::OutOfRange {
            pending.completion.fail(format!(
                "target {} rejected the access: [{:#x}, +{}) is outside its registered memory",
                shared.peer, resp.addr, pending.len
            ));
            continue;
        }
        if resp.kind == FrameKind::WriteResponse {
            pending.completion.complete(SliceOutcome::Completed);
            continue;
        }
        let (local_addr, len) = (pending.local_addr, pending.len);
        let received = pending.completion.with_local_access(|| {
            // SAFETY: as in the writer: a registered, in-flight local range, claimed for this access.
            let dest = unsafe { std::slice::from_raw_parts_mut(local_addr as *mut u8, len as usize) };
            stream.read_exact(dest)
        });
        match received {
            Some(Ok(())) => pending.completion.complete(SliceOutcome::Completed),
            Some(Err(e)) => {
                pending.completion.fail(format!("receiving from {} failed: {e}", shared.peer));
                return Err(e);
            }
            None => discard(stream, len)?,
        }
    }
}
