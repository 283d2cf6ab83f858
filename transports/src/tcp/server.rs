//! Target side of the tcp transport: serves peers' reads and writes of local registered memory.

use std::io::{self, IoSlice, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::frame::{FrameKind, Header, Status, HEADER_LEN};
use super::io_util::{discard, read_header, write_all_vectored, HeaderRead};
use crate::RegionTable;

/// How long a peer may stall in the middle of a frame before its connection is closed.
pub const STALL_TIMEOUT: Duration = Duration::from_secs(30);
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
    loop {
        match read_header(&mut stream, &mut buf)? {
            HeaderRead::Closed => return Ok(()),
            HeaderRead::Header => {}
        }
        let req = Header::decode(&buf).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        match req.kind {
            FrameKind::ReadRequest => serve_read(&mut stream, table, &req)?,
            FrameKind::WriteRequest => serve_write(&mut stream, table, &req)?,
            kind => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("a peer sent a {kind:?} frame, which only targets send"),
                ))
            }
        }
    }
}

fn response(req: &Header, kind: FrameKind, status: Status, len: u64) -> [u8; HEADER_LEN] {
    Header { kind, status, id: req.id, addr: req.addr, len }.encode()
}

fn serve_read(stream: &mut TcpStream, table: &RegionTable, req: &Header) -> io::Result<()> {
    match table.access(req.addr, req.len) {
        Some(access) => {
            let header = response(req, FrameKind::ReadResponse, Status::Ok, req.len);
            // Gather straight from registered memory: no staging copy.
            write_all_vectored(stream, &mut [IoSlice::new(&header), IoSlice::new(access.as_slice())])
        }
        None => {
            tracing::debug!("tcp transport: read of [{:#x}, +{}) is out of range", req.addr, req.len);
            stream.write_all(&response(req, FrameKind::ReadResponse, Status::OutOfRange, 0))
        }
    }
}

fn serve_write(stream: &mut TcpStream, table: &RegionTable, req: &Header) -> io::Result<()> {
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
    stream.write_all(&response(req, FrameKind::WriteResponse, status, 0))
}
