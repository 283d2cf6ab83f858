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
use crate::net::wire::{send_now, timed_out, wait_fd, RecvBuf};
use crate::net::Service;
use crate::{Completion, FailureKind, FailureReason, LocalAccess, LocalClaim, Opcode, Slice, SliceOutcome};

/// Requests sent with one gathered send at most (two iovecs each at most, within `IOV_MAX`).
const MAX_GROUP: usize = 256;
/// A group ends once it holds this many write payload bytes (more requests wait for the next
/// send), so a write of 512 KiB or more goes with its own send: gathering saves a send and a
/// kernel push per small frame, while large frames gathered into one long stream cost the
/// target more receives per byte (1 MiB writes with 4 MiB groups: 1.5 `recvmsg` per 512 KiB
/// slice against 1.04, and 1.91-1.94 GB per CPU second against 2.03-2.38 with one send per
/// frame, loaded machine). The group has the io time of a single frame.
const MAX_GROUP_BYTES: u64 = 512 << 10;
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
    let mut frames: Vec<Frame> = Vec::with_capacity(MAX_GROUP);
    while let Ok(first) = rx.recv() {
        take_group(&shared, first, &rx, &mut next_id, &mut frames);
        let result = send_group(&mut &stream, &shared.pending, &mut frames, Instant::now() + shared.io_timeout);
        frames.clear();
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

/// One request on its way out: its header and, for a write, the slice's memory (claimed for
/// each send only).
struct Frame {
    id: u64,
    header: [u8; HEADER_LEN],
    payload: Option<(LocalAccess, u64, usize)>,
}

impl Frame {
    fn wire_len(&self) -> usize {
        HEADER_LEN + self.payload.as_ref().map_or(0, |p| p.2)
    }
}

/// Turns `first` and the slices queued behind it (at most [`MAX_GROUP`] requests and
/// [`MAX_GROUP_BYTES`] write payload bytes) into `frames`, each registered as pending before
/// it is on the wire, so that its response always finds it.
fn take_group(shared: &LaneShared, first: Slice, rx: &Receiver<Slice>, next_id: &mut u64, frames: &mut Vec<Frame>) {
    let mut bytes = 0u64;
    let mut next = Some(first);
    while let Some(slice) = next.take() {
        if shared.dead.load(Ordering::Acquire) {
            slice.completion.fail(FailureReason::peer_gone(format!("connection to {} is broken", shared.peer)));
        } else {
            let id = *next_id;
            *next_id += 1;
            if slice.opcode == Opcode::Write {
                bytes += slice.len;
            }
            frames.extend(frame(shared, id, slice));
        }
        if frames.len() < MAX_GROUP && bytes < MAX_GROUP_BYTES {
            next = rx.try_recv().ok();
        }
    }
}

/// The frame of request `id`, registered as pending; none if the slice ended while queued or
/// the lane broke.
fn frame(shared: &LaneShared, id: u64, slice: Slice) -> Option<Frame> {
    let kind = match slice.opcode {
        Opcode::Read => FrameKind::ReadRequest,
        Opcode::Write => FrameKind::WriteRequest,
    };
    let header = Header { kind, status: Status::Ok, id, addr: slice.remote_addr, len: slice.len }.encode();
    let access = slice.completion.local_access();
    let (opcode, local_addr, len) = (slice.opcode, slice.local_addr, slice.len);
    let pending = Pending { opcode, local_addr, len, sent: Instant::now(), completion: slice.completion };
    shared.pending.lock().insert(id, pending);
    if shared.dead.load(Ordering::Acquire) {
        if let Some(p) = shared.pending.lock().remove(&id) {
            p.completion.fail(FailureReason::peer_gone(format!("connection to {} is broken", shared.peer)));
        }
        return None;
    }
    match (opcode, access) {
        // Ended (timed out) while queued: asking for its bytes would only make the peer send
        // what nobody reads.
        (Opcode::Read, Some(access)) if access.with(|| ()).is_some() => Some(Frame { id, header, payload: None }),
        (Opcode::Write, Some(access)) => Some(Frame { id, header, payload: Some((access, local_addr, len as usize)) }),
        _ => {
            shared.pending.lock().remove(&id);
            None
        }
    }
}

/// Where a lane's frames go: one gathered send that does not wait, and a wait for room.
trait Out {
    /// Sends a prefix of `bufs`; `Ok(None)` when there is no room now.
    fn send_now(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<Option<usize>>;
    /// Waits for room until `until` (returning then without an error).
    fn wait(&mut self, until: Instant) -> io::Result<()>;
}

impl Out for &TcpStream {
    fn send_now(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<Option<usize>> {
        send_now(self.as_fd(), bufs)
    }
    fn wait(&mut self, until: Instant) -> io::Result<()> {
        match wait_fd(self.as_fd(), PollFlags::OUT, Some(until)) {
            Err(e) if e.kind() == io::ErrorKind::TimedOut => Ok(()),
            other => other,
        }
    }
}

/// Sends `frames` in order by `deadline`, as many as the socket takes with each gathered send
/// (one send, and one push of the kernel, for a group of 64 KiB writes where each write cost
/// one before). Every write's memory is claimed for each send that does not wait, never while
/// waiting for room. A write whose slice ended before its first byte went is left out (and
/// dropped from `pending`); one that ends mid-frame is finished with zeros, which keeps the
/// stream in step without touching the memory again.
fn send_group(
    out: &mut impl Out,
    pending: &Mutex<HashMap<u64, Pending>>,
    frames: &mut Vec<Frame>,
    deadline: Instant,
) -> io::Result<()> {
    let (mut first, mut off) = (0usize, 0usize); // frames[first] is the next to go, `off` of it sent
    let mut claims: Vec<LocalClaim> = Vec::with_capacity(frames.len());
    while first < frames.len() {
        if Instant::now() >= deadline {
            return Err(timed_out());
        }
        let mut i = first;
        while i < frames.len() {
            match frames[i].payload.as_ref().map(|(access, ..)| access.claim()) {
                None => {}
                Some(Some(claim)) => claims.push(claim),
                Some(None) if i == first && off > 0 => {
                    // The header is ours: the rest of it goes as it is, so the target reads
                    // the frame it began; only the payload becomes zeros.
                    if off < HEADER_LEN {
                        let header = frames[i].header;
                        send_bytes(out, &header[off..], deadline)?;
                        off = HEADER_LEN;
                    }
                    let rest = frames[i].wire_len() - off;
                    tracing::debug!(
                        "tcp transport: a write's slice ended mid-frame; sending {rest} zero bytes in its place"
                    );
                    send_zeros(out, rest, deadline)?;
                    (first, off) = (first + 1, 0);
                }
                Some(None) => {
                    let ended = frames.remove(i);
                    pending.lock().remove(&ended.id);
                    continue;
                }
            }
            i += 1;
        }
        if first == frames.len() {
            break;
        }
        let sent = {
            let mut iov = Vec::with_capacity(2 * (frames.len() - first));
            for f in &frames[first..] {
                iov.push(IoSlice::new(&f.header));
                if let Some((_, addr, len)) = f.payload {
                    // SAFETY: the engine checked that [addr, +len) lies in a registered region
                    // whose in-flight count it raised; the claim taken above (in `claims`)
                    // keeps the slice from ending, and its memory from being handed back,
                    // until after this one send that does not wait.
                    iov.push(IoSlice::new(unsafe { std::slice::from_raw_parts(addr as *const u8, len) }));
                }
            }
            let mut bufs = &mut iov[..];
            IoSlice::advance_slices(&mut bufs, off);
            out.send_now(bufs)
        };
        claims.clear();
        match sent? {
            Some(0) => return Err(io::Error::new(io::ErrorKind::WriteZero, "peer stopped accepting bytes")),
            Some(mut n) => {
                while n > 0 {
                    let rest = frames[first].wire_len() - off;
                    if n < rest {
                        off += n;
                        break;
                    }
                    (first, off, n) = (first + 1, 0, n - rest);
                }
            }
            // No room: wait without the claims, a step at a time (slices may end meanwhile).
            None => out.wait(deadline.min(Instant::now() + STEP))?,
        }
    }
    Ok(())
}

/// Sends `n` zero bytes by `deadline`.
fn send_zeros(out: &mut impl Out, mut n: usize, deadline: Instant) -> io::Result<()> {
    static ZEROS: [u8; 64 << 10] = [0; 64 << 10];
    while n > 0 {
        let k = n.min(ZEROS.len());
        send_bytes(out, &ZEROS[..k], deadline)?;
        n -= k;
    }
    Ok(())
}

/// Sends all of `bytes` by `deadline`.
fn send_bytes(out: &mut impl Out, mut bytes: &[u8], deadline: Instant) -> io::Result<()> {
    while !bytes.is_empty() {
        if Instant::now() >= deadline {
            return Err(timed_out());
        }
        match out.send_now(&[IoSlice::new(bytes)])? {
            Some(0) => return Err(io::Error::new(io::ErrorKind::WriteZero, "peer stopped accepting bytes")),
            Some(k) => bytes = &bytes[k..],
            None => out.wait(deadline)?,
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CompletionSink;
    use std::collections::HashSet;

    /// Slices whose end the test decides.
    #[derive(Default)]
    struct Sink {
        ended: Mutex<HashSet<usize>>,
    }

    impl CompletionSink for Sink {
        fn begin_local_access(&self, slice: usize) -> bool {
            !self.ended.lock().contains(&slice)
        }
        fn end_local_access(&self, _: usize) {}
        fn complete(&self, _: usize, _: SliceOutcome) {}
    }

    /// A socket that takes at most `room` bytes per send and records them; `after` runs after
    /// each send with the number of sends so far.
    struct Recorder<F: FnMut(usize)> {
        wire: Vec<u8>,
        sends: usize,
        room: usize,
        after: F,
    }

    impl<F: FnMut(usize)> Out for Recorder<F> {
        fn send_now(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<Option<usize>> {
            let mut n = 0;
            for b in bufs {
                let k = b.len().min(self.room - n);
                self.wire.extend_from_slice(&b[..k]);
                n += k;
            }
            self.sends += 1;
            (self.after)(self.sends);
            Ok(Some(n))
        }
        fn wait(&mut self, _: Instant) -> io::Result<()> {
            Ok(())
        }
    }

    fn shared() -> LaneShared {
        LaneShared {
            peer: "test".into(),
            pending: Mutex::new(HashMap::new()),
            dead: AtomicBool::new(false),
            last_send: AtomicU64::new(0),
            io_timeout: Duration::from_secs(30),
        }
    }

    /// Queues a write of `memory` (or a read into it) as slice `n`; returns its request header.
    fn queue(tx: &Sender<Slice>, sink: &Arc<Sink>, n: usize, opcode: Opcode, memory: &[u8]) -> Vec<u8> {
        let (remote_addr, len) = (0x10_0000 * (n as u64 + 1), memory.len() as u64);
        let completion = Completion::new(sink.clone(), n);
        tx.send(Slice { opcode, local_addr: memory.as_ptr() as u64, remote_addr, len, completion }).unwrap();
        let kind = if opcode == Opcode::Write { FrameKind::WriteRequest } else { FrameKind::ReadRequest };
        Header { kind, status: Status::Ok, id: n as u64 + 1, addr: remote_addr, len }.encode().to_vec()
    }

    fn pattern(seed: u8, n: usize) -> Vec<u8> {
        (0..n).map(|i| seed.wrapping_add((i % 251) as u8)).collect()
    }

    #[test]
    fn queued_writes_and_reads_go_out_with_one_send_in_request_order() {
        let (shared, sink) = (shared(), Arc::new(Sink::default()));
        let (tx, rx) = crossbeam_channel::unbounded();
        let (a, b, c, d) = (pattern(1, 5000), vec![0u8; 4096], pattern(2, 3000), pattern(3, 70_000));
        let mut expected = queue(&tx, &sink, 0, Opcode::Write, &a);
        expected.extend(&a);
        expected.extend(queue(&tx, &sink, 1, Opcode::Read, &b));
        expected.extend(queue(&tx, &sink, 2, Opcode::Write, &c));
        expected.extend(&c);
        expected.extend(queue(&tx, &sink, 3, Opcode::Write, &d));
        expected.extend(&d);
        let (mut next_id, mut frames) = (1, Vec::new());
        take_group(&shared, rx.recv().unwrap(), &rx, &mut next_id, &mut frames);
        let mut out = Recorder { wire: Vec::new(), sends: 0, room: usize::MAX, after: |_| {} };
        send_group(&mut out, &shared.pending, &mut frames, Instant::now() + Duration::from_secs(30)).unwrap();
        assert_eq!(out.sends, 1, "four queued requests, one send");
        assert!(out.wire == expected, "headers and payloads in request order");
        let mut ids: Vec<u64> = shared.pending.lock().keys().copied().collect();
        ids.sort();
        assert_eq!(ids, vec![1, 2, 3, 4], "all four wait for their responses");
    }

    #[test]
    fn a_write_that_ends_mid_frame_is_finished_with_zeros_and_one_that_ended_before_is_left_out() {
        let (shared, sink) = (shared(), Arc::new(Sink::default()));
        let (tx, rx) = crossbeam_channel::unbounded();
        let (a, b, c, d) = (pattern(1, 5000), vec![0u8; 4096], pattern(2, 3000), pattern(3, 7000));
        let mut expected = queue(&tx, &sink, 0, Opcode::Write, &a);
        expected.extend(&a[..1000 - HEADER_LEN]);
        expected.extend(vec![0u8; a.len() - (1000 - HEADER_LEN)]);
        expected.extend(queue(&tx, &sink, 1, Opcode::Read, &b));
        queue(&tx, &sink, 2, Opcode::Write, &c); // ends before its first byte went
        expected.extend(queue(&tx, &sink, 3, Opcode::Write, &d));
        expected.extend(&d);
        let (mut next_id, mut frames) = (1, Vec::new());
        take_group(&shared, rx.recv().unwrap(), &rx, &mut next_id, &mut frames);
        // The socket takes 1000 bytes a send; after the first, slices 0 and 2 end (timed out).
        let ends = sink.clone();
        let after = move |sends: usize| {
            if sends == 1 {
                ends.ended.lock().extend([0, 2]);
            }
        };
        let mut out = Recorder { wire: Vec::new(), sends: 0, room: 1000, after };
        send_group(&mut out, &shared.pending, &mut frames, Instant::now() + Duration::from_secs(30)).unwrap();
        assert!(out.wire == expected, "the stream stays in step: zeros for the rest of 0, nothing of 2");
        let mut ids: Vec<u64> = shared.pending.lock().keys().copied().collect();
        ids.sort();
        assert_eq!(ids, vec![1, 2, 4], "the request never sent waits for no response");
    }

    #[test]
    fn a_write_that_ends_inside_its_header_still_sends_the_whole_header_then_zeros() {
        let (shared, sink) = (shared(), Arc::new(Sink::default()));
        let (tx, rx) = crossbeam_channel::unbounded();
        let a = pattern(4, 3000);
        let header = queue(&tx, &sink, 0, Opcode::Write, &a);
        let mut expected = header.clone();
        expected.extend(vec![0u8; a.len()]);
        let (mut next_id, mut frames) = (1, Vec::new());
        take_group(&shared, rx.recv().unwrap(), &rx, &mut next_id, &mut frames);
        // The socket takes 10 bytes a send (less than a header); the slice ends after the first.
        let ends = sink.clone();
        let after = move |sends: usize| {
            if sends == 1 {
                ends.ended.lock().insert(0);
            }
        };
        let mut out = Recorder { wire: Vec::new(), sends: 0, room: 10, after };
        send_group(&mut out, &shared.pending, &mut frames, Instant::now() + Duration::from_secs(30)).unwrap();
        assert_eq!(out.wire[..HEADER_LEN], header[..], "the header goes whole, as the target began to read it");
        assert!(out.wire == expected, "then zeros in place of the payload");
    }
}
