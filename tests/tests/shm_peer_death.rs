//! A same-host target killed mid-transfer: requests in flight end (none hangs), and its
//! segment is gone: later requests fail with a clear reason, even those to memory the
//! initiator had mapped (whose pages outlive the target and must not be used).

use std::time::{Duration, Instant};

use crescent_engine::{Opcode, TransferRequest, TransferStatus, TransportKind};
use crescent_tests::{same_host_engine, spawn_tebench_target, BatchLoop};

fn killing_the_target_ends_its_segment(target_args: &[&str]) {
    let (mut target, name) = spawn_tebench_target(&[], target_args);
    let engine = same_host_engine(Duration::from_secs(20));
    let seg = engine.open_segment(&name).unwrap();
    assert_eq!(engine.segment_transport(seg).unwrap(), TransportKind::Shm);
    let remote = engine.segment_descriptor(seg).unwrap().buffers[0].clone();
    let local = engine.alloc_registered(64 << 20, "cpu:0").unwrap();
    let batches = BatchLoop::start(&engine, seg, local.addr(), remote.addr, 16, 4 << 20);
    batches.wait_for_batches(1);
    let killed_at = Instant::now();
    target.kill_now();
    // The loop goes on until its batches fail (the kill is noticed asynchronously).
    let outcomes = batches.join();
    assert!(killed_at.elapsed() < Duration::from_secs(15), "requests ended before their timeout");
    assert!(outcomes.len() > 1, "batches completed before the kill");
    let last = outcomes.last().unwrap();
    assert!(last.iter().any(|s| matches!(s, TransferStatus::Failed(_))), "the batch after the kill failed: {last:?}");
    // Later requests fail fast: the peer is gone, its old mapping is not used.
    for opcode in [Opcode::Write, Opcode::Read] {
        let err = engine
            .transfer_sync(&[TransferRequest {
                opcode,
                source: local.addr(),
                target: seg,
                target_offset: remote.addr,
                length: 4096,
            }])
            .unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("connect") || msg.contains("gone"), "{msg}");
    }
}

#[test]
fn killed_target_with_shared_memory() {
    killing_the_target_ends_its_segment(&["--buffer-size", "64M", "--local-hostname", "127.0.0.1"]);
}

#[test]
fn killed_target_with_heap_memory() {
    killing_the_target_ends_its_segment(&["--buffer-size", "64M", "--heap", "--local-hostname", "127.0.0.1"]);
}
