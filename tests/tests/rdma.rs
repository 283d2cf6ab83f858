//! The rdma transport on real verbs (soft-RoCE): run inside the VM of `ci/rdma-vm.sh` (or on
//! a machine with an rxe device, `RXE_VM=1`). Every test but the fallback one skips, saying
//! why, where `RXE_VM` is unset.

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crescent_benches::pattern;
use crescent_engine::{
    EngineConfig, EngineError, Opcode, TransferEngine, TransferRequest, TransferStatus, TransportKind,
};
use crescent_tests::{
    eventually, open_first_buffer, spawn_tebench_target, transfer_one, workspace_bin, BatchLoop, ChildGuard,
};
use crescent_transports::rdma::{RdmaConfig, RdmaTransport};
use crescent_transports::{
    Completion, CompletionSink, Endpoint, Region, RemoteRegion, SharedMemory, Slice, SliceOutcome, Transport,
};

/// The rxe device and GID index to use, or `None` (after saying why) outside the VM.
fn rxe() -> Option<(String, Option<u32>)> {
    if std::env::var_os("RXE_VM").is_none() {
        eprintln!("skipped: RXE_VM is not set; this test needs a soft-RoCE device (run ci/rdma-vm.sh)");
        return None;
    }
    let dev = std::env::var("RXE_VM_DEV").unwrap_or_else(|_| "rxe0".into());
    let gid = std::env::var("RXE_VM_GID_INDEX").ok().and_then(|g| g.parse().ok());
    Some((dev, gid))
}

fn rdma_engine(dev: &str, gid: Option<u32>, tweak: impl FnOnce(&mut EngineConfig)) -> Arc<TransferEngine> {
    let mut config = EngineConfig {
        local_hostname: Some("127.0.0.1".into()),
        protocol: Some(TransportKind::Rdma),
        transfer_timeout: Duration::from_secs(60),
        ..EngineConfig::default()
    };
    config.rdma.devices = vec![dev.to_string()];
    config.rdma.gid_index = gid;
    tweak(&mut config);
    TransferEngine::new(config).expect("an rdma engine starts on the rxe device")
}

fn fill(mem: &crescent_engine::RegisteredMemory, seed: u64) {
    // SAFETY: no transfer uses the buffer while the test fills it.
    pattern::fill(unsafe { mem.as_mut_slice() }, seed, 0);
}

#[test]
fn reads_and_writes_move_verified_bytes() {
    let Some((dev, gid)) = rxe() else { return };
    let target = rdma_engine(&dev, gid, |_| {});
    let initiator = rdma_engine(&dev, gid, |_| {});
    let remote = target.alloc_registered(4 << 20, "cpu:0").unwrap();
    fill(&remote, 7);
    let local = initiator.alloc_registered(4 << 20, "cpu:0").unwrap();
    let seg = initiator.open_segment(target.segment_name()).unwrap();
    assert_eq!(initiator.segment_transport(seg).unwrap(), TransportKind::Rdma);
    let keys = &initiator.segment_descriptor(seg).unwrap().buffers[0].keys;
    assert_eq!(keys.rdma.len(), 1, "the region's key on {dev}: {keys:?}");
    assert_eq!(keys.rdma[0].device, dev);

    // Reads: sizes around and across the 64 KiB slice size, odd offsets, the whole buffer.
    for &(off, len) in &[(0u64, 1u64), (1, 65_535), (12_345, 65_536 * 3 + 17), (65_536, 65_536), (0, 4 << 20)] {
        transfer_one(&initiator, Opcode::Read, local.addr(), seg, remote.addr() + off, len).unwrap();
        // SAFETY: the transfer ended.
        let got = unsafe { &local.as_slice()[..len as usize] };
        assert_eq!(pattern::first_mismatch(got, 7, off), None, "read of {len} bytes at {off}");
    }

    // Writes land where they were addressed and nowhere else.
    fill(&local, 9);
    let (off, len) = (100_001u64, 300_000u64);
    transfer_one(&initiator, Opcode::Write, local.addr(), seg, remote.addr() + off, len).unwrap();
    // SAFETY: the write completed; nothing else writes the target buffer.
    let bytes = unsafe { remote.as_slice() };
    assert_eq!(pattern::first_mismatch(&bytes[off as usize..(off + len) as usize], 9, 0), None);
    assert_eq!(pattern::first_mismatch(&bytes[..off as usize], 7, 0), None);
    assert_eq!(pattern::first_mismatch(&bytes[(off + len) as usize..], 7, off + len), None);
}

/// Records slice outcomes for transport-level tests.
#[derive(Default)]
struct Outcomes {
    ended: parking_lot::Mutex<Vec<Option<SliceOutcome>>>,
}

impl Outcomes {
    fn new(n: usize) -> Arc<Self> {
        Arc::new(Outcomes { ended: parking_lot::Mutex::new(vec![None; n]) })
    }

    fn wait(&self, limit: Duration) -> Vec<SliceOutcome> {
        let end = Instant::now() + limit;
        loop {
            let ended = self.ended.lock().clone();
            if ended.iter().all(Option::is_some) {
                return ended.into_iter().map(Option::unwrap).collect();
            }
            assert!(Instant::now() < end, "slices still pending after {limit:?}: {ended:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl CompletionSink for Outcomes {
    fn begin_local_access(&self, slice: usize) -> bool {
        self.ended.lock()[slice].is_none()
    }
    fn end_local_access(&self, _: usize) {}
    fn complete(&self, slice: usize, outcome: SliceOutcome) {
        let mut ended = self.ended.lock();
        if ended[slice].is_none() {
            ended[slice] = Some(outcome);
        }
    }
}

struct Side {
    transport: RdmaTransport,
    mem: Arc<SharedMemory>,
    region: Arc<Region>,
}

fn side(dev: &str, gid: Option<u32>, qps: usize, len: u64) -> Side {
    side_with(len, RdmaConfig { devices: vec![dev.to_string()], gid_index: gid, qps_per_peer: qps, ..small_queues() })
}

/// 4 KiB slices and 16 work requests per queue pair: small transfers already queue up.
fn small_queues() -> RdmaConfig {
    RdmaConfig { max_slice_len: 4096, max_send_wr: 16, ..RdmaConfig::default() }
}

fn side_with(len: u64, config: RdmaConfig) -> Side {
    let transport = RdmaTransport::start(config).expect("rdma transport starts");
    let mem = Arc::new(SharedMemory::allocate(len, "crescent-test").unwrap());
    let region = Arc::new(Region::new(mem.addr(), mem.len(), "cpu:0", None));
    region.set_keys(transport.register_region(&region).unwrap());
    Side { transport, mem, region }
}

fn slices(sink: &Arc<Outcomes>, opcode: Opcode, local: u64, remote: u64, n: usize, len: u64) -> Vec<Slice> {
    (0..n)
        .map(|i| Slice {
            opcode,
            local_addr: local + i as u64 * len,
            remote_addr: remote + i as u64 * len,
            len,
            completion: Completion::new(sink.clone(), i),
        })
        .collect()
}

#[test]
fn many_slices_spread_over_many_queue_pairs_with_back_pressure() {
    let Some((dev, gid)) = rxe() else { return };
    // 4 queue pairs of 16 work requests each: 1024 slices must queue and go out as room frees.
    let target = side(&dev, gid, 1, 4 << 20);
    let initiator = side(&dev, gid, 4, 4 << 20);
    // SAFETY: no transfer runs yet.
    pattern::fill(unsafe { std::slice::from_raw_parts_mut(target.mem.addr() as *mut u8, 4 << 20) }, 3, 0);
    let peer = target.transport.endpoint();
    initiator.transport.set_peer_regions(
        &peer,
        vec![RemoteRegion { addr: target.region.addr(), len: target.region.len(), keys: target.region.keys() }],
    );
    let sink = Outcomes::new(1024);
    initiator.transport.submit(&peer, slices(&sink, Opcode::Read, initiator.mem.addr(), target.mem.addr(), 1024, 4096));
    let outcomes = sink.wait(Duration::from_secs(120));
    assert!(outcomes.iter().all(|o| *o == SliceOutcome::Completed));
    // SAFETY: every slice ended.
    let got = unsafe { std::slice::from_raw_parts(initiator.mem.addr() as *const u8, 4 << 20) };
    assert_eq!(pattern::first_mismatch(got, 3, 0), None);
    let lanes = initiator.transport.lane_stats(&peer);
    assert_eq!(lanes.len(), 4, "{lanes:?}");
    assert!(lanes.iter().all(|l| l.posted > 0 && !l.broken), "every queue pair carried slices: {lanes:?}");
    assert_eq!(lanes.iter().map(|l| l.completed).sum::<u64>(), 1024);
}

#[test]
fn access_outside_the_targets_memory_fails_with_a_remote_access_error() {
    let Some((dev, gid)) = rxe() else { return };
    let target = side(&dev, gid, 1, 1 << 20);
    let initiator = side(&dev, gid, 2, 1 << 20);
    let peer = target.transport.endpoint();
    // The peer claims 1 MiB more than it registered (a stale or lying descriptor): only the
    // device's own check stands between the initiator and the target's other memory.
    initiator.transport.set_peer_regions(
        &peer,
        vec![RemoteRegion {
            addr: target.region.addr(),
            len: target.region.len() + (1 << 20),
            keys: target.region.keys(),
        }],
    );
    for opcode in [Opcode::Read, Opcode::Write] {
        let sink = Outcomes::new(1);
        initiator
            .transport
            .submit(&peer, slices(&sink, opcode, initiator.mem.addr(), target.mem.addr() + (1 << 20) - 100, 1, 4096));
        let outcome = sink.wait(Duration::from_secs(60)).remove(0);
        assert!(
            matches!(&outcome, SliceOutcome::Failed(r) if r.is_out_of_range() && r.message.contains("remote access error")),
            "{opcode:?}: {outcome:?}"
        );
    }
    // One bad slice among many: the queue pair it breaks flushes the others posted on it,
    // and those are retried on another queue pair; only the bad one fails.
    let sink = Outcomes::new(129);
    let mut batch = slices(&sink, Opcode::Write, initiator.mem.addr(), target.mem.addr(), 128, 4096);
    batch.insert(
        64,
        Slice {
            opcode: Opcode::Read,
            local_addr: initiator.mem.addr(),
            remote_addr: target.mem.addr() + (1 << 20),
            len: 4096,
            completion: Completion::new(sink.clone(), 128),
        },
    );
    initiator.transport.submit(&peer, batch);
    let outcomes = sink.wait(Duration::from_secs(60));
    assert!(
        matches!(&outcomes[128], SliceOutcome::Failed(r) if r.is_out_of_range() && r.message.contains("remote access error")),
        "{:?}",
        outcomes[128]
    );
    assert!(outcomes[..128].iter().all(|o| *o == SliceOutcome::Completed), "{outcomes:?}");
    // Broken queue pairs are rebuilt.
    assert!(
        eventually(Duration::from_secs(30), || {
            let lanes = initiator.transport.lane_stats(&peer);
            lanes.len() == 2 && lanes.iter().all(|l| !l.broken)
        }),
        "{:?}",
        initiator.transport.lane_stats(&peer)
    );
    let sink = Outcomes::new(64);
    initiator.transport.submit(&peer, slices(&sink, Opcode::Read, initiator.mem.addr(), target.mem.addr(), 64, 4096));
    let outcomes = sink.wait(Duration::from_secs(60));
    assert!(outcomes.iter().all(|o| *o == SliceOutcome::Completed), "{outcomes:?}");
}

#[test]
fn a_stale_descriptor_after_unregister_fails_the_request() {
    let Some((dev, gid)) = rxe() else { return };
    let target = rdma_engine(&dev, gid, |_| {});
    let initiator = rdma_engine(&dev, gid, |_| {});
    let remote = target.alloc_registered(1 << 20, "cpu:0").unwrap();
    let local = initiator.alloc_registered(1 << 20, "cpu:0").unwrap();
    let seg = initiator.open_segment(target.segment_name()).unwrap();
    let read = TransferRequest {
        opcode: Opcode::Read,
        source: local.addr(),
        target: seg,
        target_offset: remote.addr(),
        length: 8192,
    };
    initiator.transfer_sync(&[read]).unwrap();
    // The target unregisters; the initiator still holds the old descriptor and key.
    target.unregister(remote.addr()).unwrap();
    let err = initiator.transfer_sync(&[read]).unwrap_err();
    assert!(
        matches!(&err, EngineError::TransferFailed { reason: r, .. } if r.is_out_of_range() && r.message.contains("remote access error")),
        "{err}"
    );
}

#[test]
fn killing_the_target_mid_transfer_fails_requests_without_hanging() {
    let Some((dev, gid)) = rxe() else { return };
    let gid_arg = gid.map(|g| g.to_string()).unwrap_or_default();
    let mut args =
        vec!["--protocol", "rdma", "--device-name", &dev, "--buffer-size", "8M", "--local-hostname", "127.0.0.1"];
    if gid.is_some() {
        args.extend(["--gid-index", &gid_arg]);
    }
    let (mut target, name) = spawn_tebench_target(&[], &args);
    let engine = rdma_engine(&dev, gid, |c| c.transfer_timeout = Duration::from_secs(120));
    let (seg, remote) = open_first_buffer(&engine, &name);
    let local = engine.alloc_registered(8 << 20, "cpu:0").unwrap();
    let batches = BatchLoop::start(&engine, seg, local.addr(), remote.addr, 8, 1 << 20);
    // Let some batches complete first.
    batches.wait_for_batches(2);
    target.kill_now();
    let outcomes = batches.join();
    assert!(outcomes.len() > 1, "batches completed before the kill");
    let last = outcomes.last().unwrap();
    assert!(
        last.iter().any(|s| matches!(s, TransferStatus::Failed(_))),
        "the batch in flight at the kill failed (not timed out): {last:?}"
    );
    assert!(!last.contains(&TransferStatus::TimedOut), "no request waited for the timeout: {last:?}");
    // The peer is gone: later requests fail too, without waiting for the timeout.
    let err = transfer_one(&engine, Opcode::Read, local.addr(), seg, remote.addr, 10).unwrap_err();
    assert!(matches!(err, EngineError::TransferFailed { .. }), "{err}");
}

#[test]
fn devices_gid_and_mtu_are_chosen_from_the_port() {
    let Some((dev, _)) = rxe() else { return };
    // No GID index given: the RoCE v2 IPv4-mapped one is picked; the MTU asked for is
    // capped by the port's active MTU.
    let t = RdmaTransport::start(RdmaConfig { devices: vec![dev.clone()], mtu: Some(4096), ..RdmaConfig::default() })
        .unwrap();
    let summary = t.device_summary();
    assert_eq!(summary.len(), 1);
    let d = &summary[0];
    assert_eq!(d.name, dev);
    assert!(d.gid.starts_with("::ffff:"), "IPv4-mapped GID chosen: {d:?}");
    if let Ok(expected) = std::env::var("RXE_VM_GID_INDEX") {
        assert_eq!(d.gid_index.to_string(), expected, "{d:?}");
    }
    let active = std::fs::read_to_string(format!("/sys/class/infiniband/{dev}/ports/1/active_mtu"))
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|n| n.parse::<u32>().ok()));
    if let Some(active) = active {
        assert_eq!(d.mtu, active.min(4096), "{d:?}");
    }
    // Every active device when none is named.
    let all = RdmaTransport::start(RdmaConfig::default()).unwrap();
    assert!(all.devices().contains(&dev), "{:?}", all.devices());
    // A GID index beyond the table is refused with a reason.
    let err = RdmaTransport::start(RdmaConfig { devices: vec![dev], gid_index: Some(60_000), ..RdmaConfig::default() })
        .unwrap_err();
    assert!(err.to_string().contains("out of range"), "{err}");
}

/// Runs without RDMA too: on the host (no device) and in the VM (a device name that does not
/// exist, or a verbs library that cannot be loaded).
#[test]
fn missing_device_or_library_falls_back_to_tcp() {
    for (what, tweak) in [
        (
            "missing device",
            Box::new(|c: &mut EngineConfig| c.rdma.devices = vec!["crescent_nodev0".into()])
                as Box<dyn Fn(&mut EngineConfig)>,
        ),
        (
            "missing library",
            Box::new(|c: &mut EngineConfig| c.rdma.library = Some("libcrescent-no-such-verbs.so.1".into())),
        ),
    ] {
        let engine = |protocol: Option<TransportKind>| {
            let mut config =
                EngineConfig { local_hostname: Some("127.0.0.1".into()), protocol, ..EngineConfig::default() };
            tweak(&mut config);
            TransferEngine::new(config)
        };
        let (a, b) = (engine(None).unwrap(), engine(None).unwrap());
        assert!(
            a.local_descriptor().endpoints.iter().all(|e| !matches!(e, Endpoint::Rdma { .. })),
            "{what}: no rdma endpoint is published"
        );
        let remote = a.alloc_registered(1 << 20, "cpu:0").unwrap();
        fill(&remote, 5);
        let local = b.alloc_registered(1 << 20, "cpu:0").unwrap();
        assert!(
            a.local_descriptor().endpoints.iter().any(|e| matches!(e, Endpoint::Tcp { .. })),
            "{what}: peers on other hosts reach it over tcp"
        );
        let seg = b.open_segment(a.segment_name()).unwrap();
        // On one host the same-host transport is preferred; never rdma here.
        let kind = b.segment_transport(seg).unwrap();
        assert!(matches!(kind, TransportKind::Tcp | TransportKind::Shm), "{what}: {kind}");
        transfer_one(&b, Opcode::Read, local.addr(), seg, remote.addr(), 1 << 20).unwrap();
        // SAFETY: the transfer ended.
        assert_eq!(pattern::first_mismatch(unsafe { local.as_slice() }, 5, 0), None);
        // Asking for rdma explicitly is an error that says why.
        let err = engine(Some(TransportKind::Rdma)).unwrap_err();
        assert!(err.to_string().contains("rdma"), "{what}: {err}");
    }
}

#[test]
fn a_binary_without_rdma_says_so_in_one_line_and_serves_over_tcp() {
    let mut child = ChildGuard(
        Command::new(workspace_bin("tebench"))
            .args([
                "target",
                "--buffer-size",
                "1M",
                "--local-hostname",
                "127.0.0.1",
                "--device-name",
                "crescent_nodev0",
            ])
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stdout = child.0.stdout.take().unwrap();
    let segment = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .find_map(|l| l.strip_prefix("segment: ").map(str::to_string))
        .expect("the target started and printed its segment name");
    child.kill_now();
    let mut stderr = String::new();
    child.0.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    let rdma_lines: Vec<&str> = stderr.lines().filter(|l| l.to_ascii_lowercase().contains("rdma")).collect();
    assert_eq!(rdma_lines.len(), 1, "one line about rdma: {stderr}");
    assert!(
        rdma_lines[0].contains("crescent_nodev0") && rdma_lines[0].contains("tcp"),
        "it names the missing device and the fallback: {}",
        rdma_lines[0]
    );
    assert!(!segment.is_empty());
}

/// `tebench target` as an unprivileged process runs it: 8 MiB of locked memory (GitHub's
/// runners have that much) and no CAP_IPC_LOCK, so the devices cannot pin a bigger buffer.
fn low_memlock_target(dev: &str, gid: Option<u32>, extra: &[&str]) -> ChildGuard {
    let gid_arg = gid.map(|g| g.to_string());
    let mut cmd = Command::new("prlimit");
    cmd.args(["--memlock=8388608:8388608", "setpriv", "--inh-caps=-ipc_lock", "--bounding-set=-ipc_lock", "--"])
        .arg(workspace_bin("tebench"))
        .args(["target", "--device-name", dev, "--buffer-size", "64M", "--pattern", "--local-hostname", "127.0.0.1"])
        .args(gid_arg.iter().flat_map(|g| ["--gid-index", g.as_str()]))
        .args(extra)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    ChildGuard(cmd.spawn().expect("prlimit and setpriv (util-linux) run tebench"))
}

#[test]
fn too_little_locked_memory_for_the_buffer_turns_rdma_off_and_serves_over_tcp() {
    let Some((dev, gid)) = rxe() else { return };
    let mut target = low_memlock_target(&dev, gid, &[]);
    let stderr = target.0.stderr.take().unwrap();
    let warnings = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = BufReader::new(stderr).read_to_string(&mut text);
        text
    });
    // Read to the end: a target whose stdout is closed dies at its next line.
    let stdout = target.0.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(name) = line.strip_prefix("segment: ") {
                let _ = tx.send(name.to_string());
            }
        }
    });
    let Ok(segment) = rx.recv_timeout(Duration::from_secs(120)) else {
        target.kill_now();
        panic!("the target did not start: {}", warnings.join().unwrap());
    };
    // It publishes no rdma endpoint: peers on other hosts use tcp, this host shm.
    let engine = loopback_engine(&dev, gid);
    let seg = engine.open_segment(&segment).unwrap();
    let endpoints = engine.segment_descriptor(seg).unwrap().endpoints.clone();
    assert!(endpoints.iter().all(|e| !matches!(e, Endpoint::Rdma { .. })), "{endpoints:?}");
    assert!(endpoints.iter().any(|e| matches!(e, Endpoint::Tcp { .. })), "{endpoints:?}");
    assert_ne!(engine.segment_transport(seg).unwrap(), TransportKind::Rdma);
    let remote = engine.segment_descriptor(seg).unwrap().buffers[0].clone();
    let local = engine.alloc_registered(1 << 20, "cpu:0").unwrap();
    transfer_one(&engine, Opcode::Read, local.addr(), seg, remote.addr, 1 << 20).unwrap();
    // SAFETY: the transfer ended.
    assert_eq!(pattern::first_mismatch(unsafe { local.as_slice() }, 0, 0), None);
    target.kill_now();
    let warnings = warnings.join().unwrap();
    let lines: Vec<&str> = warnings.lines().filter(|l| l.contains("locked-memory limit")).collect();
    assert_eq!(lines.len(), 1, "one line says why: {warnings}");
    assert!(lines[0].contains("ulimit -l") && lines[0].contains("tcp"), "{}", lines[0]);

    // Asked for rdma, the same target fails to start, saying why.
    let mut asked = low_memlock_target(&dev, gid, &["--protocol", "rdma"]);
    let exited = eventually(Duration::from_secs(120), || asked.0.try_wait().is_ok_and(|s| s.is_some()));
    asked.kill_now();
    let mut stderr = String::new();
    asked.0.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    assert!(exited, "with --protocol rdma the target must not start: {stderr}");
    assert!(!asked.0.wait().unwrap().success(), "{stderr}");
    assert!(stderr.contains("locked-memory limit") && stderr.contains("ulimit -l"), "{stderr}");
}

/// An engine on the rxe device that chooses its transports itself.
fn loopback_engine(dev: &str, gid: Option<u32>) -> Arc<TransferEngine> {
    rdma_engine(dev, gid, |c| c.protocol = None)
}

fn fill_side(side: &Side, seed: u64) {
    // SAFETY: no transfer touches the memory while it is filled.
    pattern::fill(
        unsafe { std::slice::from_raw_parts_mut(side.mem.addr() as *mut u8, side.mem.len() as usize) },
        seed,
        0,
    );
}

/// Hands `target`'s region to `initiator`; returns the target's endpoint.
fn know(initiator: &Side, target: &Side) -> Endpoint {
    let peer = target.transport.endpoint();
    initiator.transport.set_peer_regions(
        &peer,
        vec![RemoteRegion { addr: target.region.addr(), len: target.region.len(), keys: target.region.keys() }],
    );
    peer
}

/// Reads `n` slices of 4 KiB from the start of `target` into the start of `initiator` and
/// waits for them; checks the bytes of every completed one against `seed`.
fn read_slices(initiator: &Side, target: &Side, peer: &Endpoint, n: usize, seed: u64) -> Vec<SliceOutcome> {
    let sink = Outcomes::new(n);
    initiator.transport.submit(peer, slices(&sink, Opcode::Read, initiator.mem.addr(), target.mem.addr(), n, 4096));
    let outcomes = sink.wait(Duration::from_secs(120));
    check_completed(initiator, &outcomes, seed);
    outcomes
}

fn check_completed(initiator: &Side, outcomes: &[SliceOutcome], seed: u64) {
    // SAFETY: every slice ended; nothing writes the initiator's memory any more.
    let got = unsafe { std::slice::from_raw_parts(initiator.mem.addr() as *const u8, initiator.mem.len() as usize) };
    for (i, o) in outcomes.iter().enumerate() {
        if *o == SliceOutcome::Completed {
            let at = i * 4096;
            assert_eq!(pattern::first_mismatch(&got[at..at + 4096], seed, at as u64), None, "slice {i}");
        }
    }
}

#[test]
fn a_failed_work_completion_moves_its_slice_to_another_queue_pair_within_the_attempt_bound() {
    let Some((dev, gid)) = rxe() else { return };
    let target = side(&dev, gid, 1, 4 << 20);
    fill_side(&target, 11);
    for max_attempts in [2, 1] {
        let initiator = side_with(
            4 << 20,
            RdmaConfig { devices: vec![dev.clone()], gid_index: gid, qps_per_peer: 2, max_attempts, ..small_queues() },
        );
        let peer = know(&initiator, &target);
        let sink = Outcomes::new(1024);
        initiator
            .transport
            .submit(&peer, slices(&sink, Opcode::Read, initiator.mem.addr(), target.mem.addr(), 1024, 4096));
        // A device fault on one queue pair while it holds work: its requests complete with
        // errors (flushed), as after a real fatal error.
        let broken = initiator.transport.inject_queue_pair_error(&peer).expect("a queue pair had work outstanding");
        let outcomes = sink.wait(Duration::from_secs(120));
        check_completed(&initiator, &outcomes, 11);
        let stats = initiator.transport.peer_stats(&peer);
        assert!(stats.failed_over > 0, "slices of queue pair {broken} moved to the other one: {stats:?}");
        let failed: Vec<&SliceOutcome> = outcomes.iter().filter(|o| **o != SliceOutcome::Completed).collect();
        if max_attempts == 2 {
            // One failed attempt, then success on the other queue pair: nothing is lost.
            assert!(failed.is_empty(), "{failed:?}");
        } else {
            // One attempt allowed: the slices that failed on the broken queue pair fail, with
            // the reason; the ones only queued behind them still complete elsewhere.
            assert!(!failed.is_empty(), "the posted slices of queue pair {broken} failed");
            assert!(
                failed.iter().all(|o| matches!(o, SliceOutcome::Failed(r) if r.message.contains("after 1 attempts"))),
                "{failed:?}"
            );
            assert!(failed.len() < 1024, "the others completed");
        }
        // The broken queue pair is rebuilt, and the connection works as before.
        assert!(
            eventually(Duration::from_secs(30), || {
                let lanes = initiator.transport.lane_stats(&peer);
                lanes.len() == 2 && lanes.iter().all(|l| !l.broken && l.qpn != broken)
            }),
            "{:?}",
            initiator.transport.lane_stats(&peer)
        );
        let outcomes = read_slices(&initiator, &target, &peer, 64, 11);
        assert!(outcomes.iter().all(|o| *o == SliceOutcome::Completed), "{outcomes:?}");
    }
}

#[test]
fn a_peer_that_is_gone_is_retried_with_backoff_and_reconnected_when_it_is_back() {
    let Some((dev, gid)) = rxe() else { return };
    let config = |port| RdmaConfig { devices: vec![dev.clone()], gid_index: gid, port, ..small_queues() };
    let target = side_with(1 << 20, config(0));
    let port = target.transport.port();
    fill_side(&target, 21);
    let initiator = side_with(1 << 20, config(0));
    let peer = know(&initiator, &target);
    let outcomes = read_slices(&initiator, &target, &peer, 16, 21);
    assert!(outcomes.iter().all(|o| *o == SliceOutcome::Completed), "{outcomes:?}");
    assert_eq!(initiator.transport.peer_stats(&peer).connect_attempts, 1);

    // The target goes away. The application keeps sending requests: each one fails (none
    // waits for a timeout), and reconnecting is tried only now and then, not per request.
    let gone = target.mem.addr();
    drop(target);
    let mut submitted = 0u64;
    while submitted < 150 {
        let sink = Outcomes::new(1);
        initiator.transport.submit(&peer, slices(&sink, Opcode::Read, initiator.mem.addr(), gone, 1, 4096));
        let outcome = sink.wait(Duration::from_secs(30)).remove(0);
        assert!(matches!(outcome, SliceOutcome::Failed(_)), "{outcome:?}");
        submitted += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    let stats = initiator.transport.peer_stats(&peer);
    assert!(!stats.connected, "{stats:?}");
    assert!(
        stats.connect_attempts >= 2 && stats.connect_attempts * 10 <= submitted,
        "reconnects are spaced out: {} attempts for {submitted} requests",
        stats.connect_attempts
    );

    // It comes back at the same address (new memory, new keys): the connection is rebuilt
    // by a later request once the backoff allows, and transfers work again.
    let target = side_with(1 << 20, config(port));
    fill_side(&target, 22);
    let peer_again = know(&initiator, &target);
    assert_eq!(peer_again, peer);
    assert!(
        eventually(Duration::from_secs(60), || {
            let sink = Outcomes::new(1);
            initiator
                .transport
                .submit(&peer, slices(&sink, Opcode::Read, initiator.mem.addr(), target.mem.addr(), 1, 4096));
            sink.wait(Duration::from_secs(30))[0] == SliceOutcome::Completed
        }),
        "{:?}",
        initiator.transport.peer_stats(&peer)
    );
    let outcomes = read_slices(&initiator, &target, &peer, 64, 22);
    assert!(outcomes.iter().all(|o| *o == SliceOutcome::Completed), "{outcomes:?}");
    let after = initiator.transport.peer_stats(&peer);
    assert!(after.connected, "{after:?}");
    assert!(
        after.connect_attempts > stats.connect_attempts && after.connect_attempts <= stats.connect_attempts + 10,
        "{after:?}"
    );
}

/// Takes a netdev down; brings it up again when dropped.
struct LinkDown(String);

impl LinkDown {
    fn new(netdev: &str) -> LinkDown {
        let ok = Command::new("ip").args(["link", "set", netdev, "down"]).status().is_ok_and(|s| s.success());
        assert!(ok, "ip link set {netdev} down");
        LinkDown(netdev.to_string())
    }
}

impl Drop for LinkDown {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "set", &self.0, "up"]).status();
    }
}

/// A target and an initiator on both soft-RoCE devices (one queue pair each), the target's
/// `len` bytes filled with `seed` and read once whole.
struct TwoDevices {
    dev: String,
    dev2: String,
    netdev2: String,
    target: Side,
    initiator: Side,
    peer: Endpoint,
}

/// [`TwoDevices`] with the queue pairs' `ib_timeout` and `retry_cnt`; `None` (the test skips)
/// without rxe or without the second device of `ci/rdma-in-vm.sh`.
fn two_devices(len: u64, ib_timeout: u8, retry_cnt: u8, seed: u64) -> Option<TwoDevices> {
    let (dev, gid) = rxe()?;
    let (Ok(dev2), Ok(netdev2)) = (std::env::var("RXE_VM_DEV2"), std::env::var("RXE_VM_NETDEV2")) else {
        eprintln!("skipped: RXE_VM_DEV2 / RXE_VM_NETDEV2 name no second soft-RoCE device (ci/rdma-in-vm.sh adds one)");
        return None;
    };
    let config = || RdmaConfig {
        devices: vec![dev.clone(), dev2.clone()],
        gid_index: gid,
        qps_per_peer: 1,
        ib_timeout,
        retry_cnt,
        ..small_queues()
    };
    let target = side_with(len, config());
    fill_side(&target, seed);
    let initiator = side_with(len, config());
    let peer = know(&initiator, &target);
    let outcomes = read_slices(&initiator, &target, &peer, 256, seed);
    assert!(outcomes.iter().all(|o| *o == SliceOutcome::Completed), "{outcomes:?}");
    Some(TwoDevices { dev, dev2, netdev2, target, initiator, peer })
}

#[test]
fn traffic_spreads_over_two_devices_and_moves_to_one_when_the_others_link_goes_down() {
    let Some(TwoDevices { dev, dev2, netdev2, target, initiator, peer }) = two_devices(16 << 20, 16, 5, 31) else {
        return;
    };
    let lanes = initiator.transport.lane_stats(&peer);
    let on = |lanes: &[crescent_transports::rdma::LaneStats], d: &str| {
        lanes.iter().filter(|l| l.device == d).map(|l| l.completed).sum::<u64>()
    };
    assert_eq!(lanes.len(), 2, "{lanes:?}");
    assert!(on(&lanes, &dev) > 0 && on(&lanes, &dev2) > 0, "both devices carried slices: {lanes:?}");

    // 16 MiB in flight over both devices; the second device's link goes down meanwhile.
    let sink = Outcomes::new(4096);
    initiator.transport.submit(&peer, slices(&sink, Opcode::Read, initiator.mem.addr(), target.mem.addr(), 4096, 4096));
    let down = LinkDown::new(&netdev2);
    let outcomes = sink.wait(Duration::from_secs(180));
    check_completed(&initiator, &outcomes, 31);
    assert!(outcomes.iter().all(|o| *o == SliceOutcome::Completed), "every slice completed: {outcomes:?}");
    // And while it stays down, new requests complete on the first device.
    let before = on(&initiator.transport.lane_stats(&peer), &dev);
    let outcomes = read_slices(&initiator, &target, &peer, 256, 31);
    assert!(outcomes.iter().all(|o| *o == SliceOutcome::Completed), "{outcomes:?}");
    let lanes = initiator.transport.lane_stats(&peer);
    assert!(on(&lanes, &dev) > before, "{dev} carried the traffic: {lanes:?}");
    let stats = initiator.transport.peer_stats(&peer);
    assert!(stats.failed_over > 0, "slices on {dev2} moved to {dev}: {stats:?} {lanes:?}");
    drop(down);
}

/// Mooncake #3299 and #3868: after an RDMA link flapped, every client reconnected at once, over
/// and over. Here the second device's link goes down and up five times while reads run over
/// both devices: every request ends (completed with the right bytes, or failed: none hangs),
/// the peer's connection is rebuilt a bounded number of times (no storm), and afterwards every
/// read completes.
#[test]
fn a_flapping_link_ends_every_request_and_reconnects_a_bounded_number_of_times() {
    let Some(TwoDevices { netdev2, target, initiator, peer, .. }) = two_devices(4 << 20, 14, 3, 41) else { return };
    let before = initiator.transport.peer_stats(&peer);

    const FLAPS: u64 = 5;
    let (mut completed, mut failed) = (0, 0);
    for flap in 0..FLAPS {
        let sink = Outcomes::new(1024);
        initiator
            .transport
            .submit(&peer, slices(&sink, Opcode::Read, initiator.mem.addr(), target.mem.addr(), 1024, 4096));
        let down = LinkDown::new(&netdev2);
        std::thread::sleep(Duration::from_millis(500));
        drop(down);
        // Every request of the flap ends within the bound: none waits for ever on the link.
        let outcomes = sink.wait(Duration::from_secs(120));
        check_completed(&initiator, &outcomes, 41);
        completed += outcomes.iter().filter(|o| **o == SliceOutcome::Completed).count();
        failed += outcomes.len() - outcomes.iter().filter(|o| **o == SliceOutcome::Completed).count();
        eprintln!("flap {flap}: {:?}", initiator.transport.peer_stats(&peer));
        std::thread::sleep(Duration::from_millis(500));
    }
    // Afterwards every read completes, with the right bytes.
    assert!(
        eventually(Duration::from_secs(60), || read_slices(&initiator, &target, &peer, 256, 41)
            .iter()
            .all(|o| *o == SliceOutcome::Completed)),
        "reads complete again after the flaps: {:?}",
        initiator.transport.peer_stats(&peer)
    );
    let after = initiator.transport.peer_stats(&peer);
    let reconnects = after.connect_attempts - before.connect_attempts;
    eprintln!(
        "{FLAPS} flaps: {completed} reads completed, {failed} failed, {reconnects} reconnects; {after:?}; lanes {:?}",
        initiator.transport.lane_stats(&peer)
    );
    assert!(reconnects <= 2 * FLAPS + 2, "no reconnect storm: {reconnects} reconnects for {FLAPS} flaps");
}

// ---- fault injection (issue 24): the contract of `crescent_tests::faults` over rdma ----

/// A `tebench target` and a `fault-prober` over rdma on the rxe device, on loopback.
fn rdma_fault_case() -> Option<(crescent_tests::faults::EngineCase, crescent_tests::faults::Prober)> {
    let (dev, gid) = rxe()?;
    let mut env = vec![format!("MC_DEVICE={dev}")];
    env.extend(gid.map(|g| format!("MC_GID_INDEX={g}")));
    Some(crescent_tests::faults::EngineCase::start_at(crescent_tests::faults::Place::Loopback { env }, "rdma"))
}

#[test]
fn faults_rdma_target_stopped_and_continued() {
    let Some((c, mut p)) = rdma_fault_case() else { return };
    // One-sided reads and writes need no target CPU: a stopped target need not be felt, but
    // every call keeps its bound and its bytes.
    c.target_stopped_and_continued(&mut p, false);
}

#[test]
fn faults_rdma_target_killed_and_restarted() {
    let Some((c, mut p)) = rdma_fault_case() else { return };
    c.target_killed_and_restarted(&mut p);
}

#[test]
fn faults_rdma_target_out_of_file_descriptors() {
    let Some((c, mut p)) = rdma_fault_case() else { return };
    c.target_out_of_fds(&mut p);
}

// ---- device memory (the fake CUDA driver) on rdma: GPUDirect or staged ----

const MIB: u64 = 1 << 20;

/// The fake CUDA driver of `tests/fake-cuda`, as this process and its engines load it.
fn fake_cuda() -> Arc<crescent_transports::device::Driver> {
    crescent_transports::device::Devices::new(Some(env!("FAKE_CUDA_DRIVER").into())).driver().expect("the fake driver")
}

/// `len` bytes of the fake's device memory on device 0, filled with the pattern of `seed`
/// (through the driver), freed when dropped.
struct Gpu {
    driver: Arc<crescent_transports::device::Driver>,
    addr: u64,
    len: u64,
}

impl Gpu {
    fn new(len: u64, seed: u64) -> Gpu {
        let driver = fake_cuda();
        let addr = driver.api().alloc(0, len).expect("fake device memory");
        let mut host = vec![0u8; len as usize];
        pattern::fill(&mut host, seed, 0);
        driver.copy(0, addr, host.as_ptr() as u64, len).unwrap();
        Gpu { driver, addr, len }
    }

    /// Where `[addr+off, +len)` differs from the pattern of `seed` at `base` (copied out with
    /// the driver).
    fn mismatch(&self, off: u64, len: u64, seed: u64, base: u64) -> Option<u64> {
        let mut host = vec![0u8; len as usize];
        self.driver.copy(0, host.as_mut_ptr() as u64, self.addr + off, len).unwrap();
        pattern::first_mismatch(&host, seed, base)
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        let _ = self.driver.api().free(0, self.addr);
    }
}

/// Descriptors this process holds open on the fake's device memory (its memfds and any
/// duplicate handed out as a "dma-buf").
fn fake_cuda_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy().starts_with("/memfd:fake-cuda "))
        .count()
}

fn read(source: u64, target: u64, target_offset: u64, length: u64) -> TransferRequest {
    TransferRequest { opcode: Opcode::Read, source, target, target_offset, length }
}

fn write(source: u64, target: u64, target_offset: u64, length: u64) -> TransferRequest {
    TransferRequest { opcode: Opcode::Write, source, target, target_offset, length }
}

/// Device to device both ways, and device with host memory on the other end both ways, over
/// several 64 KiB slices at odd offsets, each checked byte for byte. `local` and `remote` are
/// registered (device memory holding seeds 1 and 2); `local_host` and `remote_host` are
/// registered host memory of at least 1 MiB.
fn device_transfers_arrive_intact(
    initiator: &TransferEngine,
    seg: u64,
    (local, remote): (&Gpu, &Gpu),
    (local_host, remote_host): (&crescent_engine::RegisteredMemory, &crescent_engine::RegisteredMemory),
) {
    let len = 300_001;
    initiator.transfer_sync(&[read(local.addr + 7, seg, remote.addr + 12_345, len)]).unwrap();
    assert_eq!(local.mismatch(7, len, 2, 12_345), None, "device read into device");
    initiator.transfer_sync(&[write(local.addr + 7, seg, remote.addr + MIB + 3, len)]).unwrap();
    assert_eq!(remote.mismatch(MIB + 3, len, 2, 12_345), None, "device written into device");
    assert_eq!(remote.mismatch(0, MIB + 3, 2, 0), None, "nothing written before the range");
    // Mixed: the remote device into local host memory, remote host memory into a local device.
    initiator.transfer_sync(&[read(local_host.addr() + 1, seg, remote.addr, len)]).unwrap();
    // SAFETY: the transfer ended.
    let got = unsafe { &local_host.as_slice()[1..1 + len as usize] };
    assert_eq!(pattern::first_mismatch(got, 2, 0), None, "device read into host");
    fill(remote_host, 5);
    initiator.transfer_sync(&[read(local.addr + 2 * MIB, seg, remote_host.addr() + 11, len)]).unwrap();
    assert_eq!(local.mismatch(2 * MIB, len, 5, 11), None, "host read into device");
    // A local device into remote host memory, local host memory into the remote device.
    initiator.transfer_sync(&[write(local.addr + 3 * MIB, seg, remote_host.addr(), len)]).unwrap();
    // SAFETY: the write completed; nothing else writes the buffer.
    let got = unsafe { &remote_host.as_slice()[..len as usize] };
    assert_eq!(pattern::first_mismatch(got, 1, 3 * MIB), None, "device written into host");
    fill(local_host, 6);
    initiator.transfer_sync(&[write(local_host.addr(), seg, remote.addr + 3 * MIB, len)]).unwrap();
    assert_eq!(remote.mismatch(3 * MIB, len, 6, 0), None, "host written into device");
}

/// On soft-RoCE, GPUDirect cannot work with the fake driver: its "dma-buf" is a memfd (and
/// rxe takes no dma-buf at all: EOPNOTSUPP), and its device pointer is `PROT_NONE`, which no
/// NIC can pin. So device memory is staged: the reason is typed and names the NIC's errno, the
/// descriptor publishes no keys for it, the exported descriptor was closed, and every request
/// that touches it, device or mixed, goes over tcp and arrives intact while host memory keeps
/// using rdma.
#[test]
fn device_memory_without_gpudirect_falls_back_to_staged_tcp_with_the_reason() {
    let Some((dev, gid)) = rxe() else { return };
    let cuda = Some(std::path::PathBuf::from(env!("FAKE_CUDA_DRIVER")));
    let target = rdma_engine(&dev, gid, |c| c.cuda_driver = cuda.clone());
    // The initiator is told to try a peer-memory module too: the NIC refuses the pointer.
    let initiator = rdma_engine(&dev, gid, |c| {
        c.cuda_driver = cuda.clone();
        c.rdma.peer_memory = Some(true);
    });
    let (local, remote) = (Gpu::new(4 * MIB, 1), Gpu::new(4 * MIB, 2));
    let fds = fake_cuda_fds();
    target.register(remote.addr, remote.len, "cuda:0").unwrap();
    initiator.register(local.addr, local.len, "cuda:0").unwrap();
    assert_eq!(fake_cuda_fds(), fds, "each exported dma-buf was closed after the NIC refused it");

    use crescent_transports::rdma::gpudirect::{DevicePath, DmaBufSupport, PeerMemorySupport};
    let staged = |path: Option<DevicePath>| match path {
        Some(DevicePath::Staged(why)) => why,
        other => panic!("device memory staged, got {other:?}"),
    };
    let why = staged(target.rdma_device_path(remote.addr));
    let DmaBufSupport::NicRefused { device, errno } = &why.dmabuf else { panic!("the NIC refused the dma-buf: {why}") };
    assert_eq!(device, &dev);
    eprintln!("{dev} refused the fake's dma-buf: {}", std::io::Error::from_raw_os_error(*errno));
    assert_ne!(*errno, 0, "{why}");
    assert_eq!(why.peer_memory, PeerMemorySupport::NotLoaded, "no nvidia_peermem in the VM: {why}");
    let why = staged(initiator.rdma_device_path(local.addr));
    assert!(matches!(why.dmabuf, DmaBufSupport::NicRefused { .. }), "{why}");
    assert!(
        matches!(&why.peer_memory, PeerMemorySupport::NicRefused { device, errno } if device == &dev && *errno != 0),
        "the NIC cannot pin a PROT_NONE device mapping: {why}"
    );
    assert!(why.to_string().contains("refused its dma-buf"), "{why}");

    let remote_host = target.alloc_registered(4 * MIB, "cpu:0").unwrap();
    let local_host = initiator.alloc_registered(4 * MIB, "cpu:0").unwrap();
    let seg = initiator.open_segment(target.segment_name()).unwrap();
    assert_eq!(initiator.segment_transport(seg).unwrap(), TransportKind::Rdma);
    let published = initiator.segment_descriptor(seg).unwrap();
    let keys = |addr: u64| published.buffers.iter().find(|b| b.addr == addr).unwrap().keys.rdma.len();
    assert_eq!((keys(remote.addr), keys(remote_host.addr())), (0, 1), "keys for host memory only");

    device_transfers_arrive_intact(&initiator, seg, (&local, &remote), (&local_host, &remote_host));
    assert_eq!(
        initiator.rdma_slices_posted(seg).unwrap(),
        0,
        "every request touched device memory: none went over rdma"
    );
    fill(&remote_host, 8);
    initiator.transfer_sync(&[read(local_host.addr(), seg, remote_host.addr(), MIB)]).unwrap();
    // SAFETY: the transfer ended.
    assert_eq!(pattern::first_mismatch(unsafe { &local_host.as_slice()[..MIB as usize] }, 8, 0), None);
    assert!(initiator.rdma_slices_posted(seg).unwrap() >= 16, "host to host stays on rdma");
    initiator.unregister(local.addr).unwrap();
    assert_eq!(initiator.rdma_device_path(local.addr), None, "forgotten when unregistered");
    target.unregister(remote.addr).unwrap();
}

/// The GPUDirect route itself, end to end on soft-RoCE: the fake driver maps its device
/// memory readable here (`FAKE_CUDA_HOST_VISIBLE=1`) so that the NIC can pin the device
/// pointer, as a NIC pins real device memory through nvidia-peermem, and both engines are
/// told a peer-memory module is loaded. Device memory is then registered with the NIC (its
/// keys published), and every request on it, device to device and mixed, goes over rdma.
#[test]
fn device_memory_registered_with_the_nic_moves_over_rdma() {
    let Some((dev, gid)) = rxe() else { return };
    let cuda = Some(std::path::PathBuf::from(env!("FAKE_CUDA_DRIVER")));
    let engine = || {
        rdma_engine(&dev, gid, |c| {
            c.cuda_driver = cuda.clone();
            c.rdma.peer_memory = Some(true);
        })
    };
    let (target, initiator) = (engine(), engine());
    // The fake reads it at each allocation; the suite runs one test at a time.
    std::env::set_var("FAKE_CUDA_HOST_VISIBLE", "1");
    let (local, remote) = (Gpu::new(4 * MIB, 1), Gpu::new(4 * MIB, 2));
    std::env::remove_var("FAKE_CUDA_HOST_VISIBLE");
    let fds = fake_cuda_fds();
    target.register(remote.addr, remote.len, "cuda:0").unwrap();
    initiator.register(local.addr, local.len, "*").unwrap();
    assert_eq!(fake_cuda_fds(), fds, "each exported dma-buf was closed");
    use crescent_transports::rdma::gpudirect::DevicePath;
    // dma-buf is tried first (rxe refuses it), then the pointer.
    assert_eq!(target.rdma_device_path(remote.addr), Some(DevicePath::PeerMemory));
    assert_eq!(initiator.rdma_device_path(local.addr), Some(DevicePath::PeerMemory));

    let remote_host = target.alloc_registered(4 * MIB, "cpu:0").unwrap();
    let local_host = initiator.alloc_registered(4 * MIB, "cpu:0").unwrap();
    let seg = initiator.open_segment(target.segment_name()).unwrap();
    let published = initiator.segment_descriptor(seg).unwrap();
    let remote_buffer = published.buffers.iter().find(|b| b.addr == remote.addr).unwrap();
    assert_eq!((remote_buffer.location.as_str(), remote_buffer.keys.rdma.len()), ("cuda:0", 1));

    device_transfers_arrive_intact(&initiator, seg, (&local, &remote), (&local_host, &remote_host));
    // Six requests of 300,001 bytes, five 64 KiB slices each: all of them over rdma.
    let posted = initiator.rdma_slices_posted(seg).unwrap();
    assert!(posted >= 30, "device memory went over rdma: {posted} slices posted");
    initiator.unregister(local.addr).unwrap();
    target.unregister(remote.addr).unwrap();
}
