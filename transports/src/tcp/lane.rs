//! Initiator side of the tcp transport: one connection ("lane") to a peer, with a writer
//! thread that sends requests and a reader thread that matches responses to them.
//!
//! # Deadlines and the caller's memory
//!
//! A slice's local memory may only be touched while its claim is held, and a slice that ends
//! (times out) may have its memory handed back at once; so a lane must never hold a claim
//! while it waits for the peer. Payloads are therefore moved by non-blocking system calls,
//! one claim per call: the lane waits (`poll`) with no claim held, claims the memory, copies
//! what the socket has or takes, and lets go. A slice whose deadline passes while the peer
//! stalls ends `TimedOut` at its deadline; the lane finds its claim refused at the next call
//! and does without the rest of that payload, keeping the stream in step: a response's rest is
//! read into scratch; a write request half sent is finished with zeros (the request has ended
//! `TimedOut`, and a failed write leaves the target range undefined anyway — only that range).
//!
//! The lane itself gives up on a peer that stalls: a frame (either way) must be complete
//! within the lane's io time, and a peer that answers nothing for that long while requests
//! wait is considered gone; the lane then closes and fails what is still pending.

use std::collections::HashMap;
use std::io::{self, IoSlice};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use parking_lot::Mutex;
use rustix::event::PollFlags;

use super::frame::{FrameKind, Header, Status, HEADER_LEN};
use super::RECV_BUF;
use crate::net::wire::{send_all_by, send_now, timed_out, wait_fd, RecvBuf};
use crate::net::Service;
use crate::{Completion, FailureKind, FailureReason, LocalAccess, Opcode, Slice, SliceOutcome};

/// Read requests coalesced into one `write` at most.
const MAX_COALESCED: usize = 256;
/// How often a lane waiting for the peer looks at its slices and its own deadlines.
const STEP: Duration = Duration::from_millis(100);

/// A monotonic clock in milliseconds, for "last used" stamps.
fn now_ms() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64
}

struct Pending {
    opcode: Opcode,
    local_addr: u64,
    len: u64,
    sent: Instant,
    completion: Completion,
}

struct LaneShared {
    peer: String,
    pending: Mutex<HashMap<u64, Pending>>,
    dead: AtomicBool,
    /// When a request last went out ([`now_ms`]).
    last_send: AtomicU64,
    io_timeout: Duration,
}

impl LaneShared {
    /// Marks the lane broken and fails every slice waiting on it.
    fn fail_all(&self, why: &io::Error) {
        let reason = why.to_string();
        let kind = if why.kind() == io::ErrorKind::TimedOut { FailureKind::TimedOut } else { FailureKind::PeerGone };
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
            p.completion.fail(FailureReason::new(kind, format!("connection to {} broke: {reason}", self.peer)));
        }
    }
}

pub(super) struct Lane {
    tx: Sender<Slice>,
    shared: Arc<LaneShared>,
    stream: TcpStream,
}

impl Lane {
    /// Connects to `addr` and authenticates both ends (with a cluster secret) before any
    /// request goes out.
    pub(super) fn connect(peer: &str, addr: std::net::SocketAddr, config: &super::TcpConfig) -> io::Result<Lane> {
        let io_timeout = config.io_timeout;
        let stream = TcpStream::connect_timeout(&addr, config.connect_timeout)?;
        stream.set_nodelay(true)?;
        config
            .auth
            .dial(Service::Tcp, &mut &stream, None)
            .map_err(|e| io::Error::new(io::ErrorKind::PermissionDenied, e))?;
        let shared = Arc::new(LaneShared {
            peer: peer.to_string(),
            pending: Mutex::new(HashMap::new()),
            dead: AtomicBool::new(false),
            last_send: AtomicU64::new(now_ms()),
            io_timeout,
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

    /// How long since a request last went out on this lane.
    pub(super) fn idle_for(&self) -> Duration {
        Duration::from_millis(now_ms().saturating_sub(self.shared.last_send.load(Ordering::Relaxed)))
    }

    /// True when no request waits for a response.
    pub(super) fn is_quiet(&self) -> bool {
        self.shared.pending.lock().is_empty()
    }

    pub(super) fn send(&self, slice: Slice) {
        if let Err(err) = self.tx.send(slice) {
            err.0.completion.fail(FailureReason::peer_gone(format!("connection to {} is closed", self.shared.peer)));
        }
    }
}

impl Drop for Lane {
    fn drop(&mut self) {
        // Ends both threads: the reader sees the shutdown and fails what is still pending.
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

fn writer_loop(stream: TcpStream, rx: Receiver<Slice>, shared: Arc<LaneShared>) {
    let mut next_id: u64 = 1;
    let mut coalesced: Vec<u8> = Vec::with_capacity(MAX_COALESCED * HEADER_LEN);
    while let Ok(first) = rx.recv() {
        let mut result = Ok(());
        for slice in std::iter::once(first).chain(rx.try_iter().take(MAX_COALESCED - 1)) {
            if result.is_err() || shared.dead.load(Ordering::Acquire) {
                slice.completion.fail(FailureReason::peer_gone(format!("connection to {} is broken", shared.peer)));
                continue;
            }
            let id = next_id;
            next_id += 1;
            result = send_one(&stream, &shared, &mut coalesced, id, slice);
        }
        if result.is_ok() {
            result = flush(&stream, &shared, &mut coalesced);
        }
        shared.last_send.store(now_ms(), Ordering::Relaxed);
        if let Err(e) = result {
            shared.fail_all(&io::Error::new(e.kind(), format!("send failed: {e}")));
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
    // The lane was dropped: fail what was queued but never sent.
    for slice in rx.try_iter() {
        slice.completion.fail(FailureReason::peer_gone(format!("connection to {} was closed", shared.peer)));
    }
}

/// Sends the coalesced read requests, all of them within the lane's io time.
fn flush(stream: &TcpStream, shared: &LaneShared, coalesced: &mut Vec<u8>) -> io::Result<()> {
    if coalesced.is_empty() {
        return Ok(());
    }
    let deadline = Instant::now() + shared.io_timeout;
    send_all_by(&mut &*stream, &mut [IoSlice::new(coalesced)], Some(deadline))?;
    coalesced.clear();
    Ok(())
}

fn send_one(stream: &TcpStream, shared: &LaneShared, coalesced: &mut Vec<u8>, id: u64, slice: Slice) -> io::Result<()> {
    let kind = match slice.opcode {
        Opcode::Read => FrameKind::ReadRequest,
        Opcode::Write => FrameKind::WriteRequest,
    };
    let header = Header { kind, status: Status::Ok, id, addr: slice.remote_addr, len: slice.len }.encode();
    let access = slice.completion.local_access();
    let (opcode, local_addr, len) = (slice.opcode, slice.local_addr, slice.len);
    // Registered before the request is on the wire, so the response always finds it.
    let pending = Pending { opcode, local_addr, len, sent: Instant::now(), completion: slice.completion };
    shared.pending.lock().insert(id, pending);
    if shared.dead.load(Ordering::Acquire) {
        if let Some(p) = shared.pending.lock().remove(&id) {
            p.completion.fail(FailureReason::peer_gone(format!("connection to {} is broken", shared.peer)));
        }
        return Ok(());
    }
    match opcode {
        Opcode::Read if access.as_ref().and_then(|a| a.with(|| ())).is_none() => {
            // Ended (timed out) while queued: asking for its bytes would only make the peer
            // send what nobody reads.
            shared.pending.lock().remove(&id);
            Ok(())
        }
        Opcode::Read => {
            coalesced.extend_from_slice(&header);
            if coalesced.len() >= MAX_COALESCED * HEADER_LEN {
                flush(stream, shared, coalesced)?;
            }
            Ok(())
        }
        Opcode::Write => {
            flush(stream, shared, coalesced)?;
            let Some(access) = access else {
                shared.pending.lock().remove(&id);
                return Ok(());
            };
            let deadline = Instant::now() + shared.io_timeout;
            if !send_payload(stream, &header, &access, local_addr, len, deadline)? {
                // The slice ended (timed out) before it was sent: nothing goes on the wire.
                shared.pending.lock().remove(&id);
            }
            Ok(())
        }
    }
}

/// Sends `header` and the slice's `[local_addr, +len)` by `deadline`, claiming the memory for
/// each non-blocking send only (never while waiting for room). False if the slice ended before
/// its first byte went (nothing was sent); if it ends mid-frame, the frame is finished with
/// zeros, which keeps the stream in step without touching the memory again.
fn send_payload(
    stream: &TcpStream,
    header: &[u8; HEADER_LEN],
    access: &LocalAccess,
    local_addr: u64,
    len: u64,
    deadline: Instant,
) -> io::Result<bool> {
    let total = HEADER_LEN + len as usize;
    let mut sent = 0usize;
    while sent < total {
        if Instant::now() >= deadline {
            return Err(timed_out());
        }
        let step = access.with(|| {
            // SAFETY: the engine checked that [local_addr, +len) lies in a registered region
            // whose in-flight count it raised; the claim keeps the slice from ending (and the
            // memory from being handed back) during this one non-blocking send.
            let payload = unsafe { std::slice::from_raw_parts(local_addr as *const u8, len as usize) };
            if sent < HEADER_LEN {
                send_now(stream.as_fd(), &[IoSlice::new(&header[sent..]), IoSlice::new(payload)])
            } else {
                send_now(stream.as_fd(), &[IoSlice::new(&payload[sent - HEADER_LEN..])])
            }
        });
        match step {
            None if sent == 0 => return Ok(false),
            None => {
                let rest = total - sent;
                tracing::debug!(
                    "tcp transport: a write's slice ended mid-frame; sending {rest} zero bytes in its place"
                );
                send_zeros(stream, rest, deadline)?;
                return Ok(true);
            }
            Some(Ok(Some(0))) => return Err(io::Error::new(io::ErrorKind::WriteZero, "peer stopped accepting bytes")),
            Some(Ok(Some(n))) => sent += n,
            // No room: wait without the claim, a step at a time (the slice may end meanwhile).
            Some(Ok(None)) => {
                match wait_fd(stream.as_fd(), PollFlags::OUT, Some(deadline.min(Instant::now() + STEP))) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::TimedOut => {}
                    Err(e) => return Err(e),
                }
            }
            Some(Err(e)) => return Err(e),
        }
    }
    Ok(true)
}

/// Sends `n` zero bytes by `deadline`.
fn send_zeros(stream: &TcpStream, mut n: usize, deadline: Instant) -> io::Result<()> {
    static ZEROS: [u8; 64 << 10] = [0; 64 << 10];
    while n > 0 {
        let k = n.min(ZEROS.len());
        send_all_by(&mut &*stream, &mut [IoSlice::new(&ZEROS[..k])], Some(deadline))?;
        n -= k;
    }
    Ok(())
}

fn reader_loop(stream: TcpStream, shared: Arc<LaneShared>) {
    let reason = match read_responses(&stream, &shared) {
        Ok(()) => io::Error::new(io::ErrorKind::ConnectionAborted, "the peer closed the connection"),
        Err(e) => e,
    };
    shared.fail_all(&reason);
    let _ = stream.shutdown(Shutdown::Both);
}

/// Waits for the first bytes of a response header (false: the peer closed the connection).
/// Idle lanes wait as long as they like; a lane with requests waiting gives up once the oldest
/// has waited the io time with nothing heard from the peer since.
fn await_response(stream: &TcpStream, shared: &LaneShared, rb: &mut RecvBuf, last_heard: Instant) -> io::Result<bool> {
    loop {
        if !rb.buffered().is_empty() {
            return Ok(true);
        }
        match rb.recv_by(stream.as_fd(), Some(Instant::now() + Duration::from_secs(1))) {
            Ok(0) => return Ok(false),
            Ok(_) => return Ok(true),
            Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                let oldest = shared.pending.lock().values().map(|p| p.sent).min();
                let limit = shared.io_timeout;
                if oldest.is_some_and(|t| t.elapsed() >= limit) && last_heard.elapsed() >= limit {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("no response from {} for {limit:?} with requests waiting", shared.peer),
                    ));
                }
            }
            Err(e) => return Err(e),
        }
    }
}

fn read_responses(stream: &TcpStream, shared: &LaneShared) -> io::Result<()> {
    let mut rb = RecvBuf::new(RECV_BUF);
    let mut last_heard = Instant::now();
    loop {
        if !await_response(stream, shared, &mut rb, last_heard)? {
            return Ok(());
        }
        // From its first byte, a response (header and payload) has the lane's io time.
        let deadline = Instant::now() + shared.io_timeout;
        rb.fill_by(stream.as_fd(), HEADER_LEN, Some(deadline))?;
        last_heard = Instant::now();
        let header: &[u8; HEADER_LEN] = rb.buffered()[..HEADER_LEN].try_into().expect("a whole header is buffered");
        let resp = Header::decode(header).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
        rb.consume(HEADER_LEN);
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
            pending.completion.fail(FailureReason::protocol(err.clone()));
            return Err(io::Error::new(io::ErrorKind::InvalidData, err));
        }
        if resp.status == Status::OutOfRange {
            pending.completion.fail(FailureReason::out_of_range(format!(
                "target {} rejected the access: [{:#x}, +{}) is outside its registered memory",
                shared.peer, resp.addr, pending.len
            )));
            continue;
        }
        if resp.kind == FrameKind::WriteResponse {
            pending.completion.complete(SliceOutcome::Completed);
            continue;
        }
        match recv_payload(stream, &mut rb, &pending, deadline) {
            Ok(true) => pending.completion.complete(SliceOutcome::Completed),
            Ok(false) => drop(pending), // ended before its bytes were all in: already reported
            Err(e) => {
                let kind =
                    if e.kind() == io::ErrorKind::TimedOut { FailureKind::TimedOut } else { FailureKind::PeerGone };
                pending
                    .completion
                    .fail(FailureReason::new(kind, format!("receiving from {} failed: {e}", shared.peer)));
                return Err(e);
            }
        }
        last_heard = Instant::now();
    }
}

/// Receives a read response's payload into the slice's memory by `deadline` (the bytes of it
/// already in `rb` first), claiming the memory for each non-blocking receive only. False if
/// the slice ended meanwhile (the rest of the payload is then read into scratch, keeping the
/// stream in step).
fn recv_payload(stream: &TcpStream, rb: &mut RecvBuf, pending: &Pending, deadline: Instant) -> io::Result<bool> {
    let (local_addr, len) = (pending.local_addr, pending.len as usize);
    let mut got = 0usize;
    while got < len {
        if Instant::now() >= deadline {
            return Err(timed_out());
        }
        let step = pending.completion.with_local_access(|| {
            // SAFETY: as in the writer: a registered, in-flight local range, claimed for this
            // one non-blocking receive.
            let dest = unsafe { std::slice::from_raw_parts_mut((local_addr as usize + got) as *mut u8, len - got) };
            rb.recv_payload_now(stream.as_fd(), dest)
        });
        match step {
            None => {
                rb.discard_by(stream.as_fd(), (len - got) as u64, Some(deadline))?;
                return Ok(false);
            }
            Some(Ok(Some(0))) => {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the peer closed the connection mid-response"))
            }
            Some(Ok(Some(n))) => got += n,
            Some(Ok(None)) => wait_fd(stream.as_fd(), PollFlags::IN, Some(deadline))?,
            Some(Err(e)) => return Err(e),
        }
    }
    Ok(true)
}
