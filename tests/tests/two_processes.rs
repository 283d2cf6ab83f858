//! A target in another process (`tebench target`) on loopback: the initiator in this process
//! and the tebench initiator both move verified data; killing the target mid-transfer fails
//! the requests in flight without hanging.

use std::process::Command;
use std::time::{Duration, Instant};

use crescent_benches::pattern;
use crescent_engine::{Opcode, TransferStatus};
use crescent_tests::{
    loopback_engine, open_first_buffer, spawn_tebench_target, transfer_one, workspace_bin, BatchLoop,
};
use crescent_transports::FailureKind;

#[test]
fn reads_from_another_process_match_its_pattern() {
    let (_target, name) =
        spawn_tebench_target(&[], &["--buffer-size", "32M", "--pattern", "--local-hostname", "127.0.0.1"]);
    let engine = loopback_engine(Duration::from_secs(30));
    let (seg, remote) = open_first_buffer(&engine, &name);
    let local = engine.alloc_registered(8 << 20, "cpu:0").unwrap();
    for &(off, len) in &[(0u64, 1u64), (12_345, 777_777), (31 << 20, 1 << 20)] {
        transfer_one(&engine, Opcode::Read, local.addr(), seg, remote.addr + off, len).unwrap();
        // SAFETY: the transfer ended.
        let got = unsafe { &local.as_slice()[..len as usize] };
        assert_eq!(pattern::first_mismatch(got, 0, off), None, "read of {len} bytes at {off}");
    }
}

#[test]
fn tebench_initiator_verifies_reads_and_writes_with_threads() {
    let (_target, name) =
        spawn_tebench_target(&[], &["--buffer-size", "64M", "--pattern", "--local-hostname", "127.0.0.1"]);
    for op in ["read", "write"] {
        let out = Command::new(workspace_bin("tebench"))
            .args(["initiator", "--segment", &name, "--operation", op, "--block-size", "96K", "--batch-size", "16"])
            .args(["--threads", "3", "--duration", "1", "--verify", "--json", "--local-hostname", "127.0.0.1"])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{op}: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        assert!(stdout.contains(" GB/s"), "summary line with the figure: {stdout}");
        let json: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
        assert_eq!(json["verified"], true, "{op}: {json}");
        assert!(json["bytes"].as_u64().unwrap() > 0);
        assert_eq!(json["failed_requests"], 0);
    }
}

#[test]
fn killing_the_target_mid_transfer_fails_requests_without_hanging() {
    let (mut target, name) = spawn_tebench_target(&[], &["--buffer-size", "256M", "--local-hostname", "127.0.0.1"]);
    let engine = loopback_engine(Duration::from_secs(20));
    let (seg, remote) = open_first_buffer(&engine, &name);
    let local = engine.alloc_registered(256 << 20, "cpu:0").unwrap();
    let batches = BatchLoop::start(&engine, seg, local.addr(), remote.addr, 16, 16 << 20);
    // Kill once transfers are flowing (a loaded machine may take a while for the first batch).
    batches.wait_for_batches(1);
    std::thread::sleep(Duration::from_millis(100));
    let killed_at = Instant::now();
    target.kill_now();
    let outcomes = batches.join();
    assert!(killed_at.elapsed() < Duration::from_secs(15), "in-flight requests ended before their timeout");
    let last = outcomes.last().expect("at least one batch ran");
    assert!(
        last.iter().any(|s| matches!(s, TransferStatus::Failed(r) if r.kind == FailureKind::PeerGone && r.message.contains("connection"))),
        "the batch in flight at the kill failed with the connection's reason: {last:?}"
    );
    assert!(outcomes.len() > 1, "batches completed before the kill");
    // Later requests fail fast too: the peer is gone.
    let err = transfer_one(&engine, Opcode::Read, local.addr(), seg, remote.addr, 10).unwrap_err();
    assert!(err.to_string().contains("connect"), "{err}");
}

#[test]
fn tebench_initiator_exits_with_the_reason_once_its_target_is_gone() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let (mut target, name) = spawn_tebench_target(&[], &["--buffer-size", "64M", "--local-hostname", "127.0.0.1"]);
    let mut initiator = crescent_tests::ChildGuard(
        Command::new(workspace_bin("tebench"))
            .args(["initiator", "--segment", &name, "--block-size", "1M", "--batch-size", "8", "--threads", "2"])
            .args(["--duration", "600", "--report-interval", "0.2", "--local-hostname", "127.0.0.1"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stderr = initiator.0.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    // Once it reports figures, it is moving data: then the target goes away.
    let reporting = Instant::now() + Duration::from_secs(60);
    while !rx.recv_timeout(Duration::from_secs(60)).expect("the initiator reports").contains("GB/s") {
        assert!(Instant::now() < reporting, "the initiator reports figures");
    }
    target.kill_now();
    let mut status = None;
    let until = Instant::now() + Duration::from_secs(90);
    while status.is_none() && Instant::now() < until {
        status = initiator.0.try_wait().unwrap();
        std::thread::sleep(Duration::from_millis(50));
    }
    let status = status.expect("the initiator exited long before --duration");
    assert!(!status.success(), "{status}");
    let said: Vec<String> = rx.try_iter().collect();
    assert!(said.iter().any(|l| l.contains("failed")), "it says why: {said:?}");
}
