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
use crate::net::serve::Accepted;
use crate::net::wire::{send_all_by, RecvBuf};
use crate::net::{serve, FrameError, Guard, Limits, Server};
use crate::RegionTable;

/// Acknowledgements queued at most before they are written.
const MAX_PENDING_ACKS: usize = 64;

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
            FrameKind::ReadRequest => serve_read(&mut s, table, &req, &mut acks, io_timeout)?,
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

fn serve_read(
    s: &mut &TcpStream,
    table: &RegionTable,
    req: &Header,
    acks: &mut Vec<u8>,
    io_timeout: Duration,
) -> io::Result<()> {
    match table.access(req.addr, req.len) {
        Some(access) => {
            let header = response(req, FrameKind::ReadResponse, Status::Ok, req.len);
            // Gather straight from registered memory (no staging copy), queued acks first. The
            // region stays in use until the whole response is out or its deadline passed.
            let deadline = Instant::now() + io_timeout;
            send_all_by(
                s,
                &mut [IoSlice::new(acks), IoSlice::new(&header), IoSlice::new(access.as_slice())],
                Some(deadline),
            )?;
            acks.clear();
            Ok(())
        }
        None => {
            tracing::debug!("tcp transport: read of [{:#x}, +{}) is out of range", req.addr, req.len);
            acks.extend_from_slice(&response(req, FrameKind::ReadResponse, Status::OutOfRange, 0));
            Ok(())
        }
    }
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
        Some(access) => {
            // Receive straight into registered memory.
            rb.recv_exact_by(fd, access.as_mut_slice(), Some(deadline))?;
            Status::Ok
        }
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

    #[test]
    fn a_connection_that_sends_nothing_is_closed_after_the_idle_time() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let limits = Limits { max_connections: 8, max_per_peer: 8, idle: Some(Duration::from_millis(200)) };
        let server =
            start(listener, Arc::new(RegionTable::new()), limits, Guard::open(), Duration::from_secs(5)).unwrap();
        let mut idle = TcpStream::connect(addr).unwrap();
        idle.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut b = [0u8; 1];
        assert_eq!(idle.read(&mut b).unwrap(), 0, "the server closed the idle connection");
        drop(server);
    }

    #[test]
    fn a_request_that_stalls_mid_header_is_closed_after_its_frame_time() {
        use std::io::Write;
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let limits = Limits { max_connections: 8, max_per_peer: 8, idle: Some(Duration::from_secs(60)) };
        let server =
            start(listener, Arc::new(RegionTable::new()), limits, Guard::open(), Duration::from_millis(300)).unwrap();
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
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
