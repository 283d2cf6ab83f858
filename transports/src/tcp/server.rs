//! Target side of the tcp transport: serves peers' reads and writes of local registered memory.
//!
//! Runs on the net layer's accept loop ([`crate::net::serve()`]): connections are bounded in
//! total and per peer address, a connection idle for [`super::TcpConfig::idle_timeout`] is
//! closed, and every frame — a request coming in, a response of up to 64 MiB going out — has
//! one deadline ([`super::TcpConfig::io_timeout`]), so a peer that stalls mid-frame or stops
//! reading a response holds neither a thread nor a region longer than that.

use std::io::{self, IoSlice};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::frame::{FrameKind, Header, Status, HEADER_LEN};
use crate::device::{pipeline, Bounce};
use crate::net::serve::Accepted;
use crate::net::wire::{send_all_by, RecvBuf};
use crate::net::{serve, FrameError, Guard, Limits, Server};
use crate::{RegionAccess, RegionTable};

/// Acknowledgements queued at most before they are written.
const MAX_PENDING_ACKS: usize = 64;
/// Read responses sent with one gathered send at most (two iovecs each, within `IOV_MAX`).
const MAX_GATHERED_READS: usize = 64;
/// Payload bytes of one gathered send of read responses at most (more requests wait for the
/// next send); their deadline is the one of a single response.
const MAX_GATHERED_BYTES: u64 = 4 << 20;

/// Starts serving `table` on `listener` under `limits`, each frame within `io_timeout`.
pub(super) fn start(
    listener: TcpListener,
    table: Arc<RegionTable>,
    limits: Limits,
    guard: Guard,
    io_timeout: Duration,
) -> io::Result<Server> {
    serve("tcp-serve", listener, limits, guard, move |c: Accepted<TcpStream>| {
        let peer = c.peer.clone();
        match serve_connection(&c.stream, &table, c.idle, io_timeout) {
            Ok(()) => tracing::debug!("tcp transport: {peer} closed its connection"),
            Err(e) => tracing::info!("tcp transport: closing a connection from {peer}: {e}"),
        }
    })
}

fn invalid(e: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e.to_string())
}

/// Serves one connection until the peer closes it, idles past `idle`, stalls a frame past
/// `io_timeout` or breaks the protocol.
pub fn serve_connection(
    stream: &TcpStream,
    table: &RegionTable,
    idle: Option<Duration>,
    io_timeout: Duration,
) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let mut s = stream;
    let fd = stream.as_fd();
    // Requests arrive ahead of their turn here: read requests come coalesced, up to 64 in one
    // receive, and a write's next header comes with the end of its payload.
    let mut rb = RecvBuf::new(super::RECV_BUF);
    // Payload-less responses (write acknowledgements, errors) wait here and leave in one write:
    // before this thread would block reading, ahead of a read response, or when many are queued.
    let mut acks: Vec<u8> = Vec::with_capacity(MAX_PENDING_ACKS * HEADER_LEN);
    let flush = |s: &mut &TcpStream, acks: &mut Vec<u8>| -> io::Result<()> {
        if !acks.is_empty() {
            send_all_by(s, &mut [IoSlice::new(acks)], Some(Instant::now() + io_timeout))?;
            acks.clear();
        }
        Ok(())
    };
    loop {
        // Take a header that has already arrived without blocking; flush acknowledgements first
        // when none has (the initiator may be waiting for them).
        if rb.buffered().is_empty() {
            match rb.recv_now(fd)? {
                Some(0) => {
                    flush(&mut s, &mut acks)?;
                    return Ok(());
                }
                Some(_) => {}
                None => {
                    flush(&mut s, &mut acks)?;
                    match rb.recv_by(fd, idle.map(|d| Instant::now() + d)) {
                        Ok(0) => return Ok(()),
                        Ok(_) => {}
                        Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                            return Err(invalid(FrameError::Idle(idle.unwrap_or_default())))
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
        }
        // From the first byte of a request, its header and payload have one deadline.
        let deadline = Instant::now() + io_timeout;
        rb.fill_by(fd, HEADER_LEN, Some(deadline))?;
        let header: &[u8; HEADER_LEN] = rb.buffered()[..HEADER_LEN].try_into().expect("a whole header is buffered");
        let req = Header::decode(header).map_err(invalid)?;
        rb.consume(HEADER_LEN);
        match req.kind {
            FrameKind::ReadRequest => serve_reads(&mut s, &mut rb, table, req, &mut acks, io_timeout)?,
            FrameKind::WriteRequest => serve_write(fd, &mut rb, table, &req, &mut acks, deadline)?,
            kind => return Err(invalid(format!("a peer sent a {kind:?} frame, which only targets send"))),
        }
        if acks.len() >= MAX_PENDING_ACKS * HEADER_LEN {
            flush(&mut s, &mut acks)?;
        }
    }
}

fn response(req: &Header, kind: FrameKind, status: Status, len: u64) -> [u8; HEADER_LEN] {
    Header { kind, status, id: req.id, addr: req.addr, len }.encode()
}

/// Serves `first` and the read requests buffered right behind it (at most
/// [`MAX_GATHERED_READS`] requests and [`MAX_GATHERED_BYTES`] payload bytes) with one gathered
/// send: responses in request order, queued acks first, payloads straight from registered
/// memory (no staging copy). One send of several responses costs the kernel one push where one
/// send per response cost one each (64 KiB reads: a tenth of the target's CPU).
fn serve_reads(
    s: &mut &TcpStream,
    rb: &mut RecvBuf,
    table: &RegionTable,
    first: Header,
    acks: &mut Vec<u8>,
    io_timeout: Duration,
) -> io::Result<()> {
    let mut responses: Vec<([u8; HEADER_LEN], Option<RegionAccess>)> = Vec::new();
    let mut bytes = 0u64;
    let mut req = first; // taken from the buffer by the caller; later ones are only peeked at
    loop {
        // The first access may wait for an unregister; later ones may not (the accesses
        // already held would keep that unregister, and so this thread, waiting for ever).
        let access = if responses.is_empty() {
            table.access(req.addr, req.len)
        } else {
            match table.try_access(req.addr, req.len) {
                Ok(access) => {
                    rb.consume(HEADER_LEN);
                    access
                }
                Err(()) => break, // left buffered: served on its own once this group is out
            }
        };
        let header = match &access {
            Some(_) => response(&req, FrameKind::ReadResponse, Status::Ok, req.len),
            None => {
                tracing::debug!("tcp transport: read of [{:#x}, +{}) is out of range", req.addr, req.len);
                response(&req, FrameKind::ReadResponse, Status::OutOfRange, 0)
            }
        };
        bytes += access.as_ref().map_or(0, |a| a.len());
        responses.push((header, access));
        if responses.len() >= MAX_GATHERED_READS || bytes >= MAX_GATHERED_BYTES {
            break;
        }
        match buffered_read_request(rb) {
            Some(next) => req = next,
            None => break,
        }
    }
    // Device memory of one chunk at most is staged through a pinned host buffer and gathered
    // with the rest; larger device payloads go out chunk by chunk, each copied off the device
    // while the one before is sent. Host memory goes out as it is.
    let deadline = Instant::now() + io_timeout;
    let staged = responses
        .iter()
        .map(|(_, access)| access.as_ref().map_or(Ok(None), |a| stage_out(a).map_err(io::Error::other)))
        .collect::<io::Result<Vec<Option<Bounce>>>>()?;
    let mut iov = Vec::with_capacity(1 + 2 * responses.len());
    iov.push(IoSlice::new(acks));
    for ((header, access), bounce) in responses.iter().zip(&staged) {
        iov.push(IoSlice::new(header));
        match (access, bounce) {
            (Some(a), Some(b)) => iov.push(IoSlice::new(b.bytes(a.len()))),
            (Some(a), None) => match a.device() {
                // What is gathered so far (this header last) goes first.
                Some(memory) => {
                    send_all_by(s, &mut iov, Some(deadline))?;
                    iov.clear();
                    pipeline::send_from_device(memory, a.addr(), a.len(), |bytes| {
                        send_all_by(s, &mut [IoSlice::new(bytes)], Some(deadline))
                    })?;
                }
                None => iov.push(IoSlice::new(a.as_slice())),
            },
            (None, _) => {}
        }
    }
    // The regions stay in use until the whole group is out or its deadline passed.
    send_all_by(s, &mut iov, Some(deadline))?;
    drop(iov);
    acks.clear();
    Ok(())
}

/// A copy of `access`'s bytes in a bounce buffer when they are device memory of one chunk at
/// most (`None` for host memory, which is sent as it is, and larger device memory, which is
/// sent through [`pipeline::send_from_device`]).
fn stage_out(access: &RegionAccess) -> Result<Option<Bounce>, crate::TransportError> {
    let Some(memory) = access.device().filter(|_| access.len() <= pipeline::CHUNK) else {
        return Ok(None);
    };
    let bounce = memory.driver.bounce(access.len())?;
    memory.driver.copy(memory.allocation.device, bounce.addr(), access.addr(), access.len())?;
    Ok(Some(bounce))
}

/// The next request if it is a read request whose header is already buffered (left in the
/// buffer); anything else is for the main loop (which also reports a bad header).
fn buffered_read_request(rb: &RecvBuf) -> Option<Header> {
    let header: &[u8; HEADER_LEN] = rb.buffered().get(..HEADER_LEN)?.try_into().ok()?;
    Header::decode(header).ok().filter(|h| h.kind == FrameKind::ReadRequest)
}

fn serve_write(
    fd: BorrowedFd<'_>,
    rb: &mut RecvBuf,
    table: &RegionTable,
    req: &Header,
    acks: &mut Vec<u8>,
    deadline: Instant,
) -> io::Result<()> {
    let status = match table.access(req.addr, req.len) {
        Some(access) => match access.device() {
            // Device memory: received chunk by chunk into pinned buffers, each copied to the
            // device while the next is received.
            Some(memory) => {
                pipeline::recv_into_device(memory, access.addr(), access.len(), |buf| {
                    rb.recv_exact_by(fd, buf, Some(deadline))
                })?;
                Status::Ok
            }
            // Receive straight into registered memory.
            None => {
                rb.recv_exact_by(fd, access.as_mut_slice(), Some(deadline))?;
                Status::Ok
            }
        },
        None => {
            tracing::debug!("tcp transport: write of [{:#x}, +{}) is out of range", req.addr, req.len);
            rb.discard_by(fd, req.len, Some(deadline))?;
            Status::OutOfRange
        }
    };
    acks.extend_from_slice(&response(req, FrameKind::WriteResponse, status, 0));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// A server of `table` on a loopback port (8 connections, 8 from one peer, each closed
    /// after `idle` without a request, a frame's time `io_timeout`), and a connection to it
    /// whose reads wait up to 30 s.
    fn serving(table: Arc<RegionTable>, idle: Duration, io_timeout: Duration) -> (Server, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let limits = Limits { max_connections: 8, max_per_peer: 8, idle: Some(idle) };
        let server = start(listener, table, limits, Guard::open(), io_timeout).unwrap();
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        (server, s)
    }

    #[test]
    fn read_requests_sent_together_are_answered_in_order_around_errors_and_writes() {
        use crate::Region;
        use std::io::Write;
        let mut memory: Vec<u8> = (0..1 << 20).map(|i: u32| (i % 251) as u8).collect();
        let base = memory.as_mut_ptr() as u64;
        let table = Arc::new(RegionTable::new());
        table.insert(Region::new(base, 1 << 20, "cpu:0", None)).unwrap();
        let (server, mut s) = serving(table, Duration::from_secs(60), Duration::from_secs(30));
        let req = |kind, id, at: u64, len| Header { kind, status: Status::Ok, id, addr: at, len }.encode();
        // Three reads (the middle one out of range), a write, a read of what was written, and
        // 70 small reads (more than one gathered send takes), all in one write.
        let written = vec![0xabu8; 5000];
        let mut wire = Vec::new();
        wire.extend(req(FrameKind::ReadRequest, 1, base, 70_000));
        wire.extend(req(FrameKind::ReadRequest, 2, base + (2 << 20), 10));
        wire.extend(req(FrameKind::ReadRequest, 3, base + 300_000, 4096));
        wire.extend(req(FrameKind::WriteRequest, 4, base + 500_000, written.len() as u64));
        wire.extend(&written);
        wire.extend(req(FrameKind::ReadRequest, 5, base + 499_999, 5002));
        for id in 6..76 {
            wire.extend(req(FrameKind::ReadRequest, id, base + id * 1000, 100));
        }
        s.write_all(&wire).unwrap();
        let mut expected: Vec<(u64, FrameKind, Status, Vec<u8>)> = vec![
            (1, FrameKind::ReadResponse, Status::Ok, (0..70_000u32).map(|i| (i % 251) as u8).collect()),
            (2, FrameKind::ReadResponse, Status::OutOfRange, vec![]),
            (3, FrameKind::ReadResponse, Status::Ok, (300_000..304_096u32).map(|i| (i % 251) as u8).collect()),
            (4, FrameKind::WriteResponse, Status::Ok, vec![]),
        ];
        let mut fifth = vec![(499_999 % 251) as u8];
        fifth.extend(&written);
        fifth.push((505_000 % 251) as u8);
        expected.push((5, FrameKind::ReadResponse, Status::Ok, fifth));
        for id in 6..76u32 {
            expected.push((
                id as u64,
                FrameKind::ReadResponse,
                Status::Ok,
                (id * 1000..id * 1000 + 100).map(|i| (i % 251) as u8).collect(),
            ));
        }
        for (id, kind, status, payload) in expected {
            let mut header = [0u8; HEADER_LEN];
            s.read_exact(&mut header).unwrap();
            let h = Header::decode(&header).unwrap();
            assert_eq!((h.id, h.kind, h.status), (id, kind, status));
            let mut got = vec![0u8; h.payload_len() as usize];
            s.read_exact(&mut got).unwrap();
            assert!(got == payload, "response {id}: the bytes differ");
        }
        drop(server);
        drop(memory);
    }

    #[test]
    fn a_connection_that_sends_nothing_is_closed_after_the_idle_time() {
        let (server, mut idle) =
            serving(Arc::new(RegionTable::new()), Duration::from_millis(200), Duration::from_secs(5));
        let mut b = [0u8; 1];
        assert_eq!(idle.read(&mut b).unwrap(), 0, "the server closed the idle connection");
        drop(server);
    }

    #[test]
    fn a_request_that_stalls_mid_header_is_closed_after_its_frame_time() {
        use std::io::Write;
        let (server, mut s) =
            serving(Arc::new(RegionTable::new()), Duration::from_secs(60), Duration::from_millis(300));
        let header = Header { kind: FrameKind::ReadRequest, status: Status::Ok, id: 1, addr: 0x1000, len: 8 }.encode();
        // Half a header, then a byte now and then: each read is quick, the frame never ends.
        s.write_all(&header[..10]).unwrap();
        let mut b = [0u8; 1];
        for byte in &header[10..20] {
            std::thread::sleep(Duration::from_millis(100));
            if s.write_all(std::slice::from_ref(byte)).is_err() {
                break;
            }
        }
        assert!(matches!(s.read(&mut b), Ok(0) | Err(_)), "the server closed the stalled connection");
        drop(server);
    }
}
