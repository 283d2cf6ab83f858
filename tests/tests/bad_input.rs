//! Untrusted bytes on the engine's two listeners (handshake and tcp transport): garbage,
//! oversized, truncated and stalled input never crash or hang them, and out-of-range
//! requests get an error frame on a connection that stays usable.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crescent_engine::handshake::{fetch_descriptor, read_message, write_message, MessageKind, MAX_REPLY};
use crescent_tests::loopback_engine;
use crescent_transports::tcp::frame::{FrameKind, Header, Status, HEADER_LEN};
use crescent_transports::Endpoint;

fn connect(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// True once the server closed the connection (read returns 0 or a reset).
fn closed_by_peer(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 64];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

#[test]
fn handshake_listener_survives_garbage_oversized_truncated_and_stalled_input() {
    let engine = loopback_engine(Duration::from_secs(5));
    let port = engine.rpc_port();
    let name = engine.segment_name().to_string();

    let mut s = connect(port);
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    assert!(closed_by_peer(&mut s), "garbage closes the connection");

    let mut s = connect(port);
    let mut header = Vec::new();
    write_message(&mut header, MessageKind::GetDescriptor, b"").unwrap();
    header[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
    s.write_all(&header).unwrap();
    assert!(closed_by_peer(&mut s), "an oversized length closes the connection without allocating it");

    let mut s = connect(port);
    s.write_all(&header[..5]).unwrap();
    drop(s); // truncated, then gone

    // A client that stalls mid-message does not block others.
    let mut stalled = connect(port);
    stalled.write_all(&header[..7]).unwrap();
    let d = fetch_descriptor(&name, Duration::from_secs(5), &crescent_transports::net::Auth::open())
        .expect("the listener still answers");
    assert_eq!(d.name, name);

    // A well-formed request of an unexpected kind gets an error reply.
    let mut s = connect(port);
    write_message(&mut s, MessageKind::Descriptor, b"{}").unwrap();
    let (kind, _) = read_message(&mut s, MAX_REPLY).unwrap();
    assert_eq!(kind, MessageKind::Error);
    drop(stalled);
}

fn frame(kind: FrameKind, id: u64, addr: u64, len: u64) -> [u8; HEADER_LEN] {
    Header { kind, status: Status::Ok, id, addr, len }.encode()
}

fn read_header(s: &mut TcpStream) -> Header {
    let mut b = [0u8; HEADER_LEN];
    s.read_exact(&mut b).unwrap();
    Header::decode(&b).unwrap()
}

fn tcp_port(engine: &crescent_engine::TransferEngine) -> u16 {
    let endpoints = engine.local_descriptor().endpoints;
    endpoints
        .iter()
        .find_map(|e| match e {
            Endpoint::Tcp { port, .. } => Some(*port),
            _ => None,
        })
        .expect("a tcp endpoint")
}

#[test]
fn tcp_transport_rejects_out_of_range_requests_and_keeps_the_connection() {
    let engine = loopback_engine(Duration::from_secs(5));
    let mem = engine.alloc_registered(1 << 20, "cpu:0").unwrap();
    // SAFETY: nothing transfers this buffer yet.
    let bytes = unsafe { mem.as_mut_slice() };
    bytes[..4].copy_from_slice(b"abcd");
    let port = tcp_port(&engine);
    let mut s = connect(port);

    // Read past the end of the buffer: an error frame, no payload.
    s.write_all(&frame(FrameKind::ReadRequest, 1, mem.addr() + (1 << 20) - 2, 4)).unwrap();
    let h = read_header(&mut s);
    assert_eq!((h.kind, h.status, h.id, h.len), (FrameKind::ReadResponse, Status::OutOfRange, 1, 0));

    // Write to unregistered memory: its payload is consumed, an error frame comes back.
    s.write_all(&frame(FrameKind::WriteRequest, 2, 0x1000, 3)).unwrap();
    s.write_all(b"xyz").unwrap();
    let h = read_header(&mut s);
    assert_eq!((h.kind, h.status, h.id), (FrameKind::WriteResponse, Status::OutOfRange, 2));

    // The same connection still serves a valid read.
    s.write_all(&frame(FrameKind::ReadRequest, 3, mem.addr(), 4)).unwrap();
    let h = read_header(&mut s);
    assert_eq!((h.kind, h.status, h.id, h.len), (FrameKind::ReadResponse, Status::Ok, 3, 4));
    let mut data = [0u8; 4];
    s.read_exact(&mut data).unwrap();
    assert_eq!(&data, b"abcd");
}

#[test]
fn tcp_transport_closes_only_the_connection_that_breaks_the_protocol() {
    let engine = loopback_engine(Duration::from_secs(5));
    let mem = engine.alloc_registered(1 << 20, "cpu:0").unwrap();
    let port = tcp_port(&engine);

    let mut bystander = connect(port);

    let mut garbage = connect(port);
    garbage.write_all(&[0x55; HEADER_LEN]).unwrap();
    assert!(closed_by_peer(&mut garbage), "bad magic closes the connection");

    let mut oversized = connect(port);
    oversized.write_all(&frame(FrameKind::WriteRequest, 1, mem.addr(), u64::MAX)).unwrap();
    assert!(closed_by_peer(&mut oversized), "an oversized payload closes the connection");

    let mut wrong_way = connect(port);
    wrong_way.write_all(&frame(FrameKind::ReadResponse, 1, mem.addr(), 0)).unwrap();
    assert!(closed_by_peer(&mut wrong_way), "a response sent to a target closes the connection");

    let mut truncated = connect(port);
    truncated.write_all(&frame(FrameKind::WriteRequest, 1, mem.addr(), 1000)).unwrap();
    truncated.write_all(&[1u8; 10]).unwrap();
    drop(truncated);

    // The connection opened before all that, and a new one, both still work.
    for s in [&mut bystander, &mut connect(port)] {
        s.write_all(&frame(FrameKind::ReadRequest, 9, mem.addr(), 8)).unwrap();
        let h = read_header(s);
        assert_eq!((h.status, h.id), (Status::Ok, 9));
        let mut data = [0u8; 8];
        s.read_exact(&mut data).unwrap();
    }
}

#[test]
fn a_request_of_absurd_length_is_a_typed_error_not_an_abort() {
    use crescent_engine::{EngineError, Opcode};
    let target = loopback_engine(Duration::from_secs(5));
    let remote = target.alloc_registered(1 << 20, "cpu:0").unwrap();
    let engine = loopback_engine(Duration::from_secs(5));
    let seg = engine.open_segment(target.segment_name()).unwrap();
    let local = engine.alloc_registered(1 << 20, "cpu:0").unwrap();
    let read = |target_offset: u64, length: u64| {
        crescent_tests::transfer_one(&engine, Opcode::Read, local.addr(), seg, target_offset, length)
    };
    for length in [1u64 << 63, u64::MAX] {
        // More than the local registered memory: the caller's mistake.
        let err = read(remote.addr(), length).unwrap_err();
        assert!(matches!(err, EngineError::LocalNotRegistered { .. }) && err.is_caller_error(), "{err}");
    }
    // A remote range that wraps around the address space: outside the target's memory.
    let err = read(u64::MAX - 8, 1 << 20).unwrap_err();
    assert!(
        matches!(&err, EngineError::TransferFailed { reason, .. } if reason.is_out_of_range() && reason.message.contains("outside")),
        "{err}"
    );
    // The process is alive and the engine still works.
    read(remote.addr(), 4096).unwrap();
}
