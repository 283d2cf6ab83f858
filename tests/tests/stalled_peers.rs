//! Every request ends, whatever the peer does (issue 24): a tcp peer that stalls halfway
//! through a response, one that stops reading a large write, a target stopped with SIGSTOP
//! mid-batch, and a peer that holds a thousand idle connections to the target. Each test
//! bounds its wait generously (only to never hang) and asserts how the requests ended, never
//! how fast.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

use crescent_engine::{EngineError, Opcode, TransferEngine, TransferStatus};
use crescent_tests::{loopback_engine, open_first_buffer, spawn_tebench_target, transfer_one, BatchLoop, SilentPeer};
use crescent_transports::tcp::frame::{FrameKind, Header, Status, HEADER_LEN};

/// The transfer timeout of these tests' engines (`MC_TRANSFER_TIMEOUT`).
const TIMEOUT: Duration = Duration::from_secs(2);
/// Only there so that a regression fails instead of hanging: ten times the request's timeout,
/// yet below the tcp lanes' own stall limit (`TcpConfig::io_timeout`, 30 s), after which a
/// lane closes and would end the requests anyway — what must end them is their deadline.
const OUTER_BOUND: Duration = Duration::from_secs(20);

/// Runs `f` on a thread; its result, or `None` if it did not return within [`OUTER_BOUND`].
fn within<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(OUTER_BOUND).ok()
}

fn request(engine: &TransferEngine, peer: &SilentPeer, opcode: Opcode, len: u64) -> crescent_engine::Result<()> {
    let seg = engine.open_segment(&peer.name)?;
    let local = engine.alloc_registered(len, "cpu:0")?;
    transfer_one(engine, opcode, local.addr(), seg, peer.buffer, len)
}

#[test]
fn a_response_that_stops_halfway_through_its_payload_ends_timed_out() {
    // Answers each read request with its header and half its bytes, then goes quiet (while
    // keeping the connection open, reading whatever comes).
    let peer = SilentPeer::serving(|mut conn: TcpStream| {
        let mut b = [0u8; HEADER_LEN];
        if conn.read_exact(&mut b).is_err() {
            return;
        }
        let req = Header::decode(&b).unwrap();
        let resp =
            Header { kind: FrameKind::ReadResponse, status: Status::Ok, id: req.id, addr: req.addr, len: req.len };
        let _ = conn.write_all(&resp.encode());
        let _ = conn.write_all(&vec![0xab; (req.len / 2) as usize]);
        let mut sink = [0u8; 4096];
        while matches!(conn.read(&mut sink), Ok(n) if n > 0) {}
    });
    let engine = loopback_engine(TIMEOUT);
    let outcome = within(move || request(&engine, &peer, Opcode::Read, 1 << 20)).expect("the get ended");
    assert!(matches!(outcome, Err(EngineError::TimedOut)), "{outcome:?}");
}

#[test]
fn a_peer_that_stops_reading_a_large_write_does_not_hold_it() {
    // Reads a trickle (1 KiB every 200 ms): every partial write makes some progress, so only a
    // deadline over the whole request can end it (a timeout per write would never fire).
    let peer = SilentPeer::serving(|mut conn: TcpStream| {
        let mut sink = [0u8; 1024];
        for _ in 0..1000 {
            match conn.read(&mut sink) {
                Ok(n) if n > 0 => std::thread::sleep(Duration::from_millis(200)),
                _ => return,
            }
        }
    });
    let engine = loopback_engine(TIMEOUT);
    // More than loopback's socket buffers hold (some 10 MiB per connection), so the sender
    // really waits on the peer.
    let outcome = within(move || request(&engine, &peer, Opcode::Write, 64 << 20)).expect("the put ended");
    assert!(matches!(outcome, Err(EngineError::TimedOut)), "{outcome:?}");
}

fn kill(pid: u32, signal: rustix::process::Signal) {
    let pid = rustix::process::Pid::from_raw(pid as i32).expect("a child's pid");
    rustix::process::kill_process(pid, signal).expect("signalling the target");
}

#[test]
fn a_target_stopped_mid_batch_times_the_batch_out_and_works_again_once_continued() {
    let (target, name) = spawn_tebench_target(&[], &["--buffer-size", "128M", "--local-hostname", "127.0.0.1"]);
    let engine = loopback_engine(TIMEOUT);
    let (seg, remote) = open_first_buffer(&engine, &name);
    let local = engine.alloc_registered(128 << 20, "cpu:0").unwrap();
    // Large requests both ways, so that the stop lands in the middle of a payload.
    let batches = BatchLoop::start(&engine, seg, local.addr(), remote.addr, 16, 8 << 20);
    batches.wait_for_batches(1);
    std::thread::sleep(Duration::from_millis(50));
    let pid = target.0.id();
    kill(pid, rustix::process::Signal::STOP);
    let outcomes = within(move || batches.join());
    kill(pid, rustix::process::Signal::CONT);
    let outcomes = outcomes.expect("the batch in flight ended while the target was stopped");
    let last = outcomes.last().unwrap();
    assert!(last.contains(&TransferStatus::TimedOut), "{last:?}");
    // Continued, the target serves a new batch.
    let engine2 = engine.clone();
    let again = within(move || transfer_one(&engine2, Opcode::Read, local.addr(), seg, remote.addr, 8 << 20));
    assert!(matches!(again, Some(Ok(()))), "{again:?}");
    drop(target);
}

/// A tcp connection to `port` on 127.0.0.1 from the source address 127.0.0.2 (another peer,
/// as far as the target's per-peer bound is concerned).
fn connect_from_another_address(port: u16) -> std::io::Result<TcpStream> {
    use rustix::net::{AddressFamily, SocketAddrV4, SocketType};
    let fd: OwnedFd = rustix::net::socket(AddressFamily::INET, SocketType::STREAM, None)?;
    rustix::net::bind(&fd, &SocketAddrV4::new([127, 0, 0, 2].into(), 0))?;
    rustix::net::connect(&fd, &SocketAddrV4::new([127, 0, 0, 1].into(), port))?;
    Ok(TcpStream::from(fd))
}

#[test]
fn a_thousand_idle_connections_from_one_peer_do_not_lock_another_out() {
    let target = loopback_engine(Duration::from_secs(10));
    let buffer = target.alloc_registered(1 << 20, "cpu:0").unwrap();
    let tcp_port = target
        .local_descriptor()
        .endpoints
        .iter()
        .find_map(|e| match e {
            crescent_transports::Endpoint::Tcp { port, .. } => Some(*port),
            _ => None,
        })
        .unwrap();
    // One peer opens more connections than the server serves in total, and sends nothing.
    let idle: Vec<TcpStream> = (0..1100).filter_map(|_| connect_from_another_address(tcp_port).ok()).collect();
    assert!(idle.len() >= 1025, "opened {} connections", idle.len());
    // Another peer (this address) still reads.
    let initiator = loopback_engine(Duration::from_secs(10));
    let name = target.segment_name().to_string();
    let initiator2: Arc<TransferEngine> = initiator.clone();
    let addr = buffer.addr();
    let read = within(move || {
        let seg = initiator2.open_segment(&name)?;
        let local = initiator2.alloc_registered(1 << 20, "cpu:0")?;
        transfer_one(&initiator2, Opcode::Read, local.addr(), seg, addr, 1 << 20)
    });
    assert!(matches!(read, Some(Ok(()))), "{read:?}");
    drop(idle);
}
