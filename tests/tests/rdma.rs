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
use crescent_tests::{eventually, spawn_tebench_target, workspace_bin, BatchLoop, ChildGuard};
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
        initiator
            .transfer_sync(&[TransferRequest {
                opcode: Opcode::Read,
                source: local.addr(),
                target: seg,
                target_offset: remote.addr() + off,
                length: len,
            }])
            .unwrap();
        // SAFETY: the transfer ended.
        let got = unsafe { &local.as_slice()[..len as usize] };
        assert_eq!(pattern::first_mismatch(got, 7, off), None, "read of {len} bytes at {off}");
    }

    // Writes land where they were addressed and nowhere else.
    fill(&local, 9);
    let (off, len) = (100_001u64, 300_000u64);
    initiator
        .transfer_sync(&[TransferRequest {
            opcode: Opcode::Write,
            source: local.addr(),
            target: seg,
            target_offset: remote.addr() + off,
            length: len,
        }])
        .unwrap();
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
    let transport = RdmaTransport::start(RdmaConfig {
        devices: vec![dev.to_string()],
        gid_index: gid,
        qps_per_peer: qps,
        max_slice_len: 4096,
        max_send_wr: 16,
        ..RdmaConfig::default()
    })
    .expect("rdma transport starts");
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
            matches!(&outcome, SliceOutcome::Failed(r) if r.contains("remote access error")),
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
        matches!(&outcomes[128], SliceOutcome::Failed(r) if r.contains("remote access error")),
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
    assert!(matches!(&err, EngineError::TransferFailed(r) if r.contains("remote access error")), "{err}");
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
    let seg = engine.open_segment(&name).unwrap();
    let remote = engine.segment_descriptor(seg).unwrap().buffers[0].clone();
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
    let err = engine
        .transfer_sync(&[TransferRequest {
            opcode: Opcode::Read,
            source: local.addr(),
            target: seg,
            target_offset: remote.addr,
            length: 10,
        }])
        .unwrap_err();
    assert!(matches!(err, EngineError::TransferFailed(_)), "{err}");
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
        b.transfer_sync(&[TransferRequest {
            opcode: Opcode::Read,
            source: local.addr(),
            target: seg,
            target_offset: remote.addr(),
            length: 1 << 20,
        }])
        .unwrap();
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
