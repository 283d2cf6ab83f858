//! Target side of the tcp transport: serves peers' reads and writes of local registered memory.

use std::io::{self, IoSlice, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rustix::io::Errno;
use rustix::net::RecvFlags;

use super::frame::{FrameKind, Header, Status, HEADER_LEN};
use super::io_util::{discard, read_header_from, write_all_vectored, HeaderRead};
use crate::RegionTable;

/// How long a peer may stall in the middle of a frame before its connection is closed.
pub const STALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Acknowledgements queued at most before they are written.
const MAX_PENDING_ACKS: usize = 64;
/// Connections served at once; more are closed right after accept.
pub const MAX_CONNECTIONS: usize = 1024;

pub(super) fn run_listener(listener: TcpListener, table: Arc<RegionTable>, stop: Arc<AtomicBool>) {
    let active = Arc::new(AtomicUsize::new(0));
    for stream in listener.incoming() {
        if stop.load(Ordering::Acquire) {
            break;
        }
        let stream = match stream {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("tcp transport: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        if active.load(Ordering::Acquire) >= MAX_CONNECTIONS {
            tracing::warn!("tcp transport: {MAX_CONNECTIONS} connections already open, refusing one more");
            continue;
        }
        active.fetch_add(1, Ordering::AcqRel);
        let (table, active) = (table.clone(), active.clone());
        let spawned = std::thread::Builder::new().name("crescent-tcp-serve".into()).spawn(move || {
            let peer = stream.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "?".into());
            match serve_connection(stream, &table) {
                Ok(()) => tracing::debug!("tcp transport: {peer} closed its connection"),
                Err(e) => tracing::warn!("tcp transport: closing connection from {peer}: {e}"),
            }
            active.fetch_sub(1, Ordering::AcqRel);
        });
        if let Err(e) = spawned {
            tracing::error!("tcp transport: cannot start a connection thread: {e}");
        }
    }
}

/// Serves one connection until the peer closes it or breaks the protocol.
pub fn serve_connection(mut stream: TcpStream, table: &RegionTable) -> io::Result<()> {
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(STALL_TIMEOUT))?;
    let mut buf = [0u8; HEADER_LEN];
    // Payload-less responses (write acknowledgements, errors) wait here and leave in one write:
    // before this thread would block reading, ahead of a read response, or when many are queued.
    let mut acks: Vec<u8> = Vec::with_capacity(MAX_PENDING_ACKS * HEADER_LEN);
    loop {
        // Take a header that has already arrived without blocking; flush acknowledgements first
        // when none has (the initiator may be waiting for them).
        let filled = match rustix::net::recv(&stream, &mut buf[..], RecvFlags::DONTWAIT) {
            Ok((0, _)) => {
                let _ = stream.write_all(&acks);
                return Ok(());
            }
            Ok((n, _)) => n,
            Err(e) if e == Errno::AGAIN || e == Errno::INTR => 0,
            Err(e) => return Err(e.into()),
        };
        if filled < HEADER_LEN {
            if !acks.is_empty() {
                stream.write_all(&acks)?;
                acks.clear();
            }
            if let HeaderRead::Closed = read_header_from(&mut stream, &mut buf, filled)? {
                return Ok(());
            }
        }
        let req = Header::decode(&buf).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        match req.kind {
            FrameKind::ReadRequest => serve_read(&mut stream, table, &req, &mut acks)?,
            FrameKind::WriteRequest => serve_write(&mut stream, table, &req, &mut acks)?,
            kind => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("a peer sent a {kind:?} frame, which only targets send"),
                ))
            }
        }
        if acks.len() >= MAX_PENDING_ACKS * HEADER_LEN {
            stream.write_all(&acks)?;
            acks.clear();
        }
    }
}

fn response(req: &Header, kind: FrameKind, status: Status, len: u64) -> [u8; HEADER_LEN] {
    Header { kind, status, id: req.id, addr: req.addr, len }.encode()
}

fn serve_read(stream: &mut TcpStream, table: &RegionTable, req: &Header, acks: &mut Vec<u8>) -> io::Result<()> {
    match table.access(req.addr, req.len) {
        Some(access) => {
            let header = response(req, FrameKind::ReadResponse, Status::Ok, req.len);
            // Gather straight from registered memory (no staging copy), queued acks first.
            write_all_vectored(
                stream,
                &mut [IoSlice::new(acks), IoSlice::new(&header), IoSlice::new(access.as_slice())],
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

fn serve_write(stream: &mut TcpStream, table: &RegionTable, req: &Header, acks: &mut Vec<u8>) -> io::Result<()> {
    let status = match table.access(req.addr, req.len) {
        Some(access) => {
            // Receive straight into registered memory.
            stream.read_exact(access.as_mut_slice())?;
            Status::Ok
        }
        None => {
            tracing::debug!("tcp transport: write of [{:#x}, +{}) is out of range", req.addr, req.len);
            discard(stream, req.len)?;
            Status::OutOfRange
        }
    };
    acks.extend_from_slice(&response(req, FrameKind::WriteResponse, status, 0));
    Ok(())
}
