//! Two engines in one process over loopback tcp: data integrity, bounds, batch and
//! registration rules, timeouts and dead peers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crescent_engine::{EngineError, Opcode, SegmentId, TransferEngine, TransferRequest, TransferStatus};
use crescent_tests::{loopback_engine, SilentPeer};
use crescent_transports::SharedMemory;
use rand::{Rng, RngCore, SeedableRng};

fn pair() -> (Arc<TransferEngine>, Arc<TransferEngine>, SegmentId) {
    let target = loopback_engine(Duration::from_secs(30));
    let initiator = loopback_engine(Duration::from_secs(30));
    let _ = &target;
    let seg = initiator.open_segment(target.segment_name()).unwrap();
    (target, initiator, seg)
}

fn bytes(addr: u64, len: u64) -> &'static mut [u8] {
    // SAFETY: test memory allocated by the test and not being transferred while inspected.
    unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len as usize) }
}

fn req(opcode: Opcode, source: u64, target: SegmentId, target_offset: u64, length: u64) -> TransferRequest {
    TransferRequest { opcode, source, target, target_offset, length }
}

#[test]
fn read_and_write_move_exact_bytes_at_odd_sizes_and_offsets() {
    let (target, initiator, seg) = pair();
    let remote = target.alloc_registered(8 << 20, "cpu:0").unwrap();
    let local = initiator.alloc_registered(8 << 20, "cpu:0").unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    rng.fill_bytes(bytes(remote.addr(), remote.len()));
    // Re-open so that the descriptor lists the buffer registered after the first open.
    let seg2 = initiator.open_segment(target.segment_name()).unwrap();
    assert_eq!(seg, seg2, "opening a name twice returns the same handle");
    for &(len, l_off, r_off) in
        &[(1u64, 0u64, 0u64), (7, 3, 4093), (4095, 1, 17), (65537, 4097, 12345), ((1 << 20) + 3, 99, (6 << 20) + 5)]
    {
        initiator.transfer_sync(&[req(Opcode::Read, local.addr() + l_off, seg, remote.addr() + r_off, len)]).unwrap();
        assert_eq!(
            bytes(local.addr() + l_off, len),
            bytes(remote.addr() + r_off, len),
            "read of {len} bytes at local+{l_off} <- remote+{r_off}"
        );
        rng.fill_bytes(bytes(local.addr() + l_off, len));
        initiator.transfer_sync(&[req(Opcode::Write, local.addr() + l_off, seg, remote.addr() + r_off, len)]).unwrap();
        assert_eq!(bytes(remote.addr() + r_off, len), bytes(local.addr() + l_off, len), "write of {len} bytes");
    }
}

#[test]
fn requests_span_adjacent_regions_but_not_gaps() {
    let (target, initiator, seg) = pair();
    let t_mem = SharedMemory::allocate(4 << 20, "t").unwrap();
    let l_mem = SharedMemory::allocate(4 << 20, "l").unwrap();
    let (t, l) = (t_mem.addr(), l_mem.addr());
    // Target: [t, t+1M) and [t+1M, t+2M) adjacent; [t+2M+4K, t+3M) after a gap.
    target.register_batch(&[(t, 1 << 20), (t + (1 << 20), 1 << 20), (t + (2 << 20) + 4096, 1 << 20)], "cpu:0").unwrap();
    initiator.register_batch(&[(l, 1 << 19), (l + (1 << 19), 1 << 20)], "cpu:0").unwrap();
    rand::rng().fill_bytes(bytes(t, 2 << 20));
    // Crosses the local boundary at l+512K and the remote one at t+1M.
    let (l_off, r_off, len) = ((1 << 19) - 1000, (1 << 20) - 3000, 10_000);
    initiator.transfer_sync(&[req(Opcode::Read, l + l_off, seg, t + r_off, len)]).unwrap();
    assert_eq!(bytes(l + l_off, len), bytes(t + r_off, len));
    // Across the gap: fails with the reason, nothing hangs.
    let err = initiator.transfer_sync(&[req(Opcode::Read, l, seg, t + (2 << 20) - 10, 100)]).unwrap_err();
    assert!(err.to_string().contains("outside the registered memory"), "{err}");
    drop((t_mem, l_mem, target));
}

#[test]
fn out_of_range_and_unregistered_requests_fail_clearly() {
    let (target, initiator, seg) = pair();
    let remote = target.alloc_registered(1 << 20, "cpu:0").unwrap();
    let local = initiator.alloc_registered(1 << 20, "cpu:0").unwrap();
    let _ = initiator.segment_descriptor(seg).unwrap();
    // Remote past the end: that request fails, the other in the batch completes.
    let batch = initiator.allocate_batch(2).unwrap();
    initiator
        .submit(
            batch,
            &[
                req(Opcode::Read, local.addr(), seg, remote.addr() + (1 << 20) - 10, 20),
                req(Opcode::Read, local.addr(), seg, remote.addr(), 20),
            ],
        )
        .unwrap();
    let statuses = initiator.wait_batch(batch, None).unwrap();
    assert!(
        matches!(&statuses[0], TransferStatus::Failed(r) if r.kind == crescent_transports::FailureKind::OutOfRange && r.message.contains("outside the registered memory")),
        "{statuses:?}"
    );
    assert_eq!(statuses[1], TransferStatus::Completed);
    initiator.free_batch(batch).unwrap();
    // Local memory that is not registered: the caller's mistake, nothing submitted.
    let heap = [0u8; 64];
    let err = initiator.transfer_sync(&[req(Opcode::Read, heap.as_ptr() as u64, seg, remote.addr(), 64)]).unwrap_err();
    assert!(err.is_caller_error() && err.to_string().contains("not registered"), "{err}");
    let err = initiator.transfer_sync(&[req(Opcode::Read, local.addr(), seg, remote.addr(), 0)]).unwrap_err();
    assert!(err.is_caller_error(), "{err}");
    let err = initiator.transfer_sync(&[req(Opcode::Read, local.addr(), 999, remote.addr(), 1)]).unwrap_err();
    assert!(matches!(err, EngineError::UnknownSegment(999)));
}

#[test]
fn the_target_itself_rejects_accesses_to_memory_it_unregistered() {
    let target = loopback_engine(Duration::from_secs(30));
    let initiator = loopback_engine(Duration::from_secs(30));
    let remote = target.alloc_registered(1 << 20, "cpu:0").unwrap();
    let other = initiator.open_segment(target.segment_name()).unwrap();
    let local = initiator.alloc_registered(1 << 20, "cpu:0").unwrap();
    // The initiator's cached descriptor still lists the buffer after this.
    assert!(initiator.segment_descriptor(other).unwrap().buffers.iter().any(|b| b.addr == remote.addr()));
    target.free_registered(remote.clone()).unwrap();
    let err = initiator.transfer_sync(&[req(Opcode::Write, local.addr(), other, remote.addr(), 4096)]).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("outside") && msg.contains("registered memory"), "{msg}");
}

#[test]
fn many_threads_move_their_own_data_concurrently() {
    let (target, initiator, seg) = pair();
    let threads = 8u64;
    let per = 2u64 << 20;
    let remote = target.alloc_registered(threads * per, "cpu:0").unwrap();
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let initiator = initiator.clone();
            let remote_base = remote.addr() + t * per;
            std::thread::spawn(move || {
                let local = initiator.alloc_registered(2 * per, "cpu:0").unwrap();
                let mut rng = rand::rngs::StdRng::seed_from_u64(t);
                for round in 0..5 {
                    let len = rng.random_range(1..per);
                    rng.fill_bytes(bytes(local.addr(), len));
                    initiator.transfer_sync(&[req(Opcode::Write, local.addr(), seg, remote_base, len)]).unwrap();
                    initiator.transfer_sync(&[req(Opcode::Read, local.addr() + per, seg, remote_base, len)]).unwrap();
                    assert_eq!(bytes(local.addr(), len), bytes(local.addr() + per, len), "thread {t} round {round}");
                }
                initiator.free_registered(local).unwrap();
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

#[test]
fn batch_can_be_awaited_and_polled() {
    let (target, initiator, seg) = pair();
    let remote = target.alloc_registered(4 << 20, "cpu:0").unwrap();
    let local = initiator.alloc_registered(4 << 20, "cpu:0").unwrap();
    bytes(remote.addr(), 4 << 20).fill(0xab);
    let batch = initiator.allocate_batch(4).unwrap();
    let reqs: Vec<_> = (0..4)
        .map(|i| req(Opcode::Read, local.addr() + i * (1 << 20), seg, remote.addr() + i * (1 << 20), 1 << 20))
        .collect();
    initiator.submit(batch, &reqs).unwrap();
    let statuses = pollster::block_on(initiator.batch_completion(batch).unwrap());
    assert_eq!(statuses, vec![TransferStatus::Completed; 4]);
    assert_eq!(initiator.transfer_status(batch, 3).unwrap(), TransferStatus::Completed);
    assert!(initiator.transfer_status(batch, 4).is_err());
    assert!(bytes(local.addr(), 4 << 20).iter().all(|&b| b == 0xab));
    // More than the capacity does not fit.
    assert!(matches!(initiator.submit(batch, &reqs[..1]), Err(EngineError::BatchFull { .. })));
    initiator.free_batch(batch).unwrap();
    assert!(matches!(initiator.free_batch(batch), Err(EngineError::UnknownBatch(_))));
}

/// Memory lent for one transfer (how a byte get receives its value over tcp) gets the
/// bytes, is never published, cannot be written by a peer, and is out of the engine once
/// the loan ends.
#[test]
fn lent_memory_receives_a_read_but_is_never_published_nor_open_to_peers() {
    let (target, initiator, _) = pair();
    let remote = target.alloc_registered(1 << 20, "cpu:0").unwrap();
    rand::rng().fill_bytes(bytes(remote.addr(), remote.len()));
    let seg = initiator.open_segment(target.segment_name()).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let at = buf.as_mut_ptr() as u64;
    let loan = initiator.lend_local(Some(seg), at, 1 << 20).unwrap().expect("tcp needs no registration");
    initiator.transfer_sync(&[req(Opcode::Read, at, seg, remote.addr(), 1 << 20)]).unwrap();
    assert!(initiator.local_descriptor().buffers.iter().all(|b| b.addr != at), "published");
    let back = target.open_segment(initiator.segment_name()).unwrap();
    let err = target.transfer_sync(&[req(Opcode::Write, remote.addr(), back, at, 16)]).unwrap_err();
    assert!(err.to_string().contains("outside the registered memory"), "{err}");
    drop(loan);
    assert_eq!(&buf[..], bytes(remote.addr(), remote.len()));
    let err = initiator.transfer_sync(&[req(Opcode::Read, at, seg, remote.addr(), 16)]).unwrap_err();
    assert!(err.to_string().contains("not registered"), "{err}");
}

#[test]
fn overlapping_registration_is_rejected() {
    let engine = loopback_engine(Duration::from_secs(5));
    let mem = SharedMemory::allocate(1 << 20, "o").unwrap();
    engine.register(mem.addr(), 1 << 19, "cpu:0").unwrap();
    let err = engine.register(mem.addr() + 4096, 4096, "cpu:0").unwrap_err();
    assert!(err.is_caller_error(), "{err}");
    // The batch form is all-or-nothing.
    let err = engine.register_batch(&[(mem.addr() + (1 << 19), 4096), (mem.addr(), 4096)], "cpu:0").unwrap_err();
    assert!(err.is_caller_error());
    engine.register(mem.addr() + (1 << 19), 4096, "cpu:0").expect("rolled back by the failed batch");
    engine.unregister(mem.addr()).unwrap();
    assert!(engine.unregister(mem.addr()).is_err());
}

#[test]
fn requests_to_a_silent_peer_time_out_and_in_flight_rules_hold() {
    let peer = SilentPeer::start(None);
    // Long enough that the checks made while the requests are in flight come before their
    // timeout even on a loaded host (the test waits it out).
    let timeout = Duration::from_secs(4);
    let engine = loopback_engine(timeout);
    let seg = engine.open_segment(&peer.name).unwrap();
    let local = engine.alloc_registered(1 << 20, "cpu:0").unwrap();
    let batch = engine.allocate_batch(2).unwrap();
    let started = Instant::now();
    engine
        .submit(
            batch,
            &[
                req(Opcode::Read, local.addr(), seg, peer.buffer, 4096),
                req(Opcode::Write, local.addr(), seg, peer.buffer, 4096),
            ],
        )
        .unwrap();
    // In flight: freeing the batch and unregistering its memory are refused.
    assert!(matches!(engine.free_batch(batch), Err(EngineError::BatchInFlight { pending: 2, .. })));
    let err = engine.unregister(local.addr()).unwrap_err();
    assert!(err.to_string().contains("in flight"), "{err}");
    let statuses = engine.wait_batch(batch, Some(Duration::from_secs(30))).unwrap();
    assert_eq!(statuses, vec![TransferStatus::TimedOut, TransferStatus::TimedOut]);
    assert!(started.elapsed() >= timeout);
    engine.free_batch(batch).unwrap();
    engine.free_registered(local).unwrap();
}

#[test]
fn a_peer_that_drops_the_connection_fails_requests_before_the_timeout() {
    let peer = SilentPeer::start(Some(Duration::from_millis(200)));
    let engine = loopback_engine(Duration::from_secs(60));
    let seg = engine.open_segment(&peer.name).unwrap();
    let local = engine.alloc_registered(1 << 20, "cpu:0").unwrap();
    let started = Instant::now();
    let err = engine.transfer_sync(&[req(Opcode::Read, local.addr(), seg, peer.buffer, 1 << 20)]).unwrap_err();
    assert!(
        matches!(err, EngineError::TransferFailed { ref reason, .. } if reason.is_peer_fault() && reason.message.contains("connection")),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(30), "failed promptly, not at the 60 s timeout");
    // The engine reconnects for later requests (which fail the same way, not hang).
    assert!(engine.transfer_sync(&[req(Opcode::Write, local.addr(), seg, peer.buffer, 10)]).is_err());
}

#[test]
fn unreachable_segments_give_a_clear_error() {
    let engine = loopback_engine(Duration::from_secs(5));
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let err = engine.open_segment(&closed.to_string()).unwrap_err();
    assert!(matches!(err, EngineError::SegmentUnreachable { .. }) && !err.is_caller_error(), "{err}");
    assert!(engine.open_segment("no-port-here").unwrap_err().is_caller_error());
}
