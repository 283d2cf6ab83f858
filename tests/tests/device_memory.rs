//! Device (GPU) memory on the fake CUDA driver (`tests/fake-cuda`, built by `tests/build.rs`):
//! device memory there is a `PROT_NONE` mapping, so a transport that touched it with the CPU
//! would kill the test. Registration (good and bad input), tcp within a process and between
//! two, CUDA IPC over shm between two processes, and mixed host/device requests, each checked
//! byte for byte by copying the device memory back with the driver.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use crescent_engine::{EngineConfig, EngineError, Opcode, TransferEngine, TransferRequest, TransportKind};
use crescent_store::pattern;
use crescent_tests::{shm_socket, ChildGuard};
use crescent_transports::device::{Devices, Driver};
use crescent_transports::TransportError;

const MIB: u64 = 1 << 20;

fn fake_driver() -> PathBuf {
    PathBuf::from(env!("FAKE_CUDA_DRIVER"))
}

/// The fake driver, loaded in this process (the engines load the same library).
fn driver() -> Arc<Driver> {
    Devices::new(Some(fake_driver())).driver().expect("the fake CUDA driver loads")
}

fn engine(protocol: Option<TransportKind>, cuda_driver: PathBuf) -> Arc<TransferEngine> {
    let config = EngineConfig {
        local_hostname: Some("127.0.0.1".into()),
        protocol,
        transfer_timeout: Duration::from_secs(30),
        cuda_driver: Some(cuda_driver),
        ..EngineConfig::default()
    };
    TransferEngine::new(config).expect("engine starts on loopback")
}

/// Device memory of the fake driver, freed when dropped.
struct DeviceBuffer {
    driver: Arc<Driver>,
    device: u32,
    addr: u64,
    len: u64,
    /// Allocated through the virtual memory management API (`cuMemCreate` + `cuMemMap`).
    vmm: bool,
}

impl DeviceBuffer {
    fn new(device: u32, len: u64) -> Self {
        let driver = driver();
        let addr = driver.api().alloc(device, len).expect("fake device memory");
        DeviceBuffer { driver, device, addr, len, vmm: false }
    }

    /// Memory of the virtual memory management API (`len` a multiple of its granularity).
    fn vmm(device: u32, len: u64) -> Self {
        let driver = driver();
        let addr = driver.api().vmm_alloc(device, len).expect("fake VMM device memory");
        DeviceBuffer { driver, device, addr, len, vmm: true }
    }

    /// Filled with the pattern of `seed` (copied from the host with the driver).
    fn with_pattern(device: u32, len: u64, seed: u64) -> Self {
        Self::new(device, len).filled(seed)
    }

    /// Its bytes set to the pattern of `seed`.
    fn filled(self, seed: u64) -> Self {
        let (device, len) = (self.device, self.len);
        let buffer = self;
        let mut host = vec![0u8; len as usize];
        pattern::fill(&mut host, seed, 0);
        buffer.driver.copy(device, buffer.addr, host.as_ptr() as u64, len).unwrap();
        buffer
    }

    /// `[off, +len)` copied back to the host with the driver.
    fn read_back(&self, off: u64, len: u64) -> Vec<u8> {
        let mut host = vec![0u8; len as usize];
        self.driver.copy(self.device, host.as_mut_ptr() as u64, self.addr + off, len).unwrap();
        host
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        let _ = match self.vmm {
            true => self.driver.api().vmm_free(self.device, self.addr),
            false => self.driver.api().free(self.device, self.addr),
        };
    }
}

/// How many mappings this process has of the fake's VMM allocations made by process `pid`
/// (their memfds are named after it): a peer's memory imported here and not yet released.
fn vmm_mappings_of(pid: u32) -> usize {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let name = format!("fake-cuda-vmm-{pid} ");
    maps.lines().filter(|l| l.contains(&name)).count()
}

/// Waits (up to 10 s) until this process has no mapping left of `pid`'s VMM allocations.
fn wait_unmapped(pid: u32) -> usize {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let left = vmm_mappings_of(pid);
        if left == 0 || std::time::Instant::now() > deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn request(opcode: Opcode, source: u64, target: u64, target_offset: u64, length: u64) -> TransferRequest {
    TransferRequest { opcode, source, target, target_offset, length }
}

fn transport_error(e: EngineError) -> TransportError {
    match e {
        EngineError::Transport(t) => t,
        other => panic!("expected a transport error, got {other}"),
    }
}

#[test]
fn registration_takes_device_locations_and_auto_detection_and_refuses_bad_input() {
    let e = engine(Some(TransportKind::Tcp), fake_driver());
    let (a, b) = (DeviceBuffer::new(0, MIB), DeviceBuffer::new(1, MIB));
    let mut host = vec![0u8; 4096];
    e.register(a.addr, MIB, "cuda:0").unwrap();
    // `*`: the driver's pointer attributes decide (upstream's register_buffer of a CUDA pointer).
    e.register(b.addr + 4096, 8192, "*").unwrap();
    e.register(host.as_mut_ptr() as u64, 4096, "*").unwrap();
    let locations: Vec<(u64, String)> =
        e.local_descriptor().buffers.iter().map(|b| (b.addr, b.location.clone())).collect();
    assert!(locations.contains(&(a.addr, "cuda:0".to_string())), "{locations:?}");
    assert!(locations.contains(&(b.addr + 4096, "cuda:1".to_string())), "auto-detected: {locations:?}");
    assert!(locations.contains(&(host.as_ptr() as u64, "*".to_string())), "host memory stays host: {locations:?}");

    let c = DeviceBuffer::new(0, MIB);
    let other = [0u8; 64];
    let refused = |addr: u64, len: u64, location: &str, expected: &dyn Fn(&TransportError) -> bool| {
        let err = e.register(addr, len, location).unwrap_err();
        assert!(err.is_caller_error(), "{location}: {err}");
        let err = transport_error(err);
        assert!(expected(&err), "{location} [{addr:#x}, +{len}): {err}");
        assert!(!e.is_registered(addr, 1), "a refused registration leaves nothing registered");
    };
    refused(c.addr, 4096, "cuda:7", &|e| matches!(e, TransportError::UnknownDevice { devices: 2, .. }));
    refused(other.as_ptr() as u64, 64, "cuda:0", &|e| matches!(e, TransportError::NotDeviceMemory { .. }));
    refused(c.addr, 4096, "cuda:1", &|e| matches!(e, TransportError::WrongDevice { actual: 0, .. }));
    refused(c.addr + MIB - 10, 100, "cuda:0", &|e| matches!(e, TransportError::SpansAllocations { .. }));
    refused(c.addr + MIB - 10, 100, "*", &|e| matches!(e, TransportError::SpansAllocations { .. }));
    refused(c.addr, 4096, "cuda:zero", &|e| matches!(e, TransportError::InvalidArgument(_)));
    let err = e.alloc_registered(MIB, "cuda:0").unwrap_err();
    assert!(err.is_caller_error() && err.to_string().contains("cuda:0"), "{err}");
    e.unregister(a.addr).unwrap();
    e.unregister(b.addr + 4096).unwrap();
    e.unregister(host.as_ptr() as u64).unwrap();
}

#[test]
fn without_a_driver_a_device_registration_is_a_clear_error_and_host_memory_still_works() {
    let e = engine(Some(TransportKind::Tcp), PathBuf::from("/nonexistent/libcuda.so.1"));
    let mut host = vec![0u8; 4096];
    let err = e.register(0x7000_0000, 4096, "cuda:0").unwrap_err();
    assert!(!err.is_caller_error(), "the host lacks the driver: {err}");
    assert!(matches!(transport_error(err), TransportError::DriverUnavailable { .. }));
    e.register(host.as_mut_ptr() as u64, 4096, "*").unwrap();
    let d = e.local_descriptor();
    assert_eq!(d.buffers[0].location, "*", "host memory, the driver being absent");
}

#[test]
fn tcp_moves_device_memory_both_ways_and_between_host_and_device() {
    let target = engine(Some(TransportKind::Tcp), fake_driver());
    let initiator = engine(Some(TransportKind::Tcp), fake_driver());
    let len = 3 * MIB + 12_345;
    let remote = DeviceBuffer::with_pattern(0, 8 * MIB, 1);
    let mut remote_host = vec![0u8; (4 * MIB) as usize];
    pattern::fill(&mut remote_host, 3, 0);
    target.register(remote.addr, remote.len, "cuda:0").unwrap();
    target.register(remote_host.as_mut_ptr() as u64, 4 * MIB, "cpu:0").unwrap();
    let local = DeviceBuffer::new(1, 8 * MIB);
    initiator.register(local.addr, local.len, "*").unwrap();
    let local_host = initiator.alloc_registered(4 * MIB, "cpu:0").unwrap();
    let seg = initiator.open_segment(target.segment_name()).unwrap();
    assert_eq!(initiator.segment_transport(seg).unwrap(), TransportKind::Tcp);

    // Device to device: read 3 MiB and a bit from an odd offset (several slices, both lanes).
    initiator.transfer_sync(&[request(Opcode::Read, local.addr + 7, seg, remote.addr + 1001, len)]).unwrap();
    assert_eq!(pattern::first_mismatch(&local.read_back(7, len), 1, 1001), None);
    // Device to device, written: a fresh pattern of the initiator's device lands on the target's.
    let fresh = DeviceBuffer::with_pattern(1, len, 2);
    initiator.register(fresh.addr, fresh.len, "cuda:1").unwrap();
    initiator.transfer_sync(&[request(Opcode::Write, fresh.addr, seg, remote.addr + 4 * MIB, len)]).unwrap();
    assert_eq!(pattern::first_mismatch(&remote.read_back(4 * MIB, len), 2, 0), None);
    assert_eq!(pattern::first_mismatch(&remote.read_back(0, 4 * MIB), 1, 0), None, "nothing else written");

    // Mixed: the target's device into host memory here, and the target's host memory into a device.
    initiator.transfer_sync(&[request(Opcode::Read, local_host.addr(), seg, remote.addr, 2 * MIB)]).unwrap();
    // SAFETY: the transfer ended.
    assert_eq!(pattern::first_mismatch(unsafe { &local_host.as_slice()[..(2 * MIB) as usize] }, 1, 0), None);
    initiator
        .transfer_sync(&[request(Opcode::Read, local.addr, seg, remote_host.as_ptr() as u64 + 5, 2 * MIB)])
        .unwrap();
    assert_eq!(pattern::first_mismatch(&local.read_back(0, 2 * MIB), 3, 5), None);
    // Host here into the target's device.
    // SAFETY: no transfer uses the memory now.
    pattern::fill(unsafe { &mut local_host.as_mut_slice()[..MIB as usize] }, 4, 0);
    initiator.transfer_sync(&[request(Opcode::Write, local_host.addr(), seg, remote.addr + MIB, MIB)]).unwrap();
    assert_eq!(pattern::first_mismatch(&remote.read_back(MIB, MIB), 4, 0), None);

    // Out of range stays out of range on a device too.
    let err = initiator.transfer_sync(&[request(Opcode::Read, local.addr, seg, remote.addr + 8 * MIB - 10, 100)]);
    assert!(err.is_err(), "a read past the target's device region fails");
    initiator.unregister(fresh.addr).unwrap();
    initiator.unregister(local.addr).unwrap();
    target.unregister(remote.addr).unwrap();
}

/// The fake driver's dma-buf export (what GPUDirect RDMA registers with a NIC): whole host
/// pages inside one `cuMemAlloc` allocation. On a host without RDMA, registering device
/// memory is unchanged: no NIC path, no keys.
#[test]
fn the_fake_driver_exports_whole_pages_as_a_dma_buf_and_without_rdma_nothing_changes() {
    let d = driver();
    let buffer = DeviceBuffer::new(0, 2 * MIB + 100);
    let buf = d.api().dmabuf(0, buffer.addr + 4097, MIB).unwrap().expect("the fake exports dma-bufs");
    assert_eq!(buf.offset, 1, "the range's start inside the page-aligned export");
    // The fake's stand-in for a dma-buf is the allocation's memfd: its size is the allocation's.
    assert_eq!(std::fs::File::from(buf.fd).metadata().unwrap().len(), buffer.len);
    // The allocation's last page is whole on the device; past it the driver refuses.
    assert!(d.api().dmabuf(0, buffer.addr + 2 * MIB, 100).unwrap().is_some());
    let err = d.api().dmabuf(0, buffer.addr + 2 * MIB, 8192).unwrap_err();
    assert!(matches!(err, TransportError::Driver { call: "cuMemGetHandleForAddressRange", .. }), "{err}");
    // VMM memory (not allocated GPUDirect-capable) is refused, as the real driver does.
    let vmm = DeviceBuffer::vmm(0, 2 * MIB);
    assert!(d.api().dmabuf(0, vmm.addr, MIB).is_err());

    let e = engine(None, fake_driver());
    e.register(buffer.addr, buffer.len, "cuda:0").unwrap();
    if !e.transport_kinds().contains(&TransportKind::Rdma) {
        assert_eq!(e.rdma_device_path(buffer.addr), None);
        let published = e.local_descriptor();
        let b = published.buffers.iter().find(|b| b.addr == buffer.addr).unwrap();
        assert_eq!((b.location.as_str(), b.keys.rdma.len()), ("cuda:0", 0));
    }
    e.unregister(buffer.addr).unwrap();
}

#[test]
fn tcp_pipelines_device_payloads_of_odd_sizes_across_several_chunks_both_ways() {
    // Slices of an odd size spanning several of the target's 256 KiB chunks, at odd offsets.
    let slice = 700_001;
    let config = EngineConfig {
        local_hostname: Some("127.0.0.1".into()),
        protocol: Some(TransportKind::Tcp),
        transfer_timeout: Duration::from_secs(30),
        cuda_driver: Some(fake_driver()),
        tcp_slice_len: slice,
        ..EngineConfig::default()
    };
    let target = TransferEngine::new(config.clone()).unwrap();
    let initiator = TransferEngine::new(config).unwrap();
    // Read from [0, 3 MiB) of it, written at 3 MiB and on.
    let remote = DeviceBuffer::with_pattern(0, 8 * MIB, 11);
    target.register(remote.addr, remote.len, "cuda:0").unwrap();
    let local = DeviceBuffer::new(1, 4 * MIB);
    initiator.register(local.addr, local.len, "cuda:1").unwrap();
    let local_host = initiator.alloc_registered(4 * MIB, "cpu:0").unwrap();
    let seg = initiator.open_segment(target.segment_name()).unwrap();
    for len in [1, 262_143, 262_145, slice, 3 * slice + 17] {
        // Device to device, read then written back elsewhere.
        initiator.transfer_sync(&[request(Opcode::Read, local.addr + 5, seg, remote.addr + 3, len)]).unwrap();
        assert_eq!(pattern::first_mismatch(&local.read_back(5, len), 11, 3), None, "read {len}");
        let at = 3 * MIB + 9;
        initiator.transfer_sync(&[request(Opcode::Write, local.addr + 5, seg, remote.addr + at, len)]).unwrap();
        assert_eq!(pattern::first_mismatch(&remote.read_back(at, len), 11, 3), None, "written {len}");
        // The target's device into host memory here, and host memory into the target's device.
        initiator.transfer_sync(&[request(Opcode::Read, local_host.addr() + 1, seg, remote.addr + 7, len)]).unwrap();
        // SAFETY: the transfer ended.
        let host = unsafe { &local_host.as_slice()[1..1 + len as usize] };
        assert_eq!(pattern::first_mismatch(host, 11, 7), None, "read into host {len}");
        let at = 5 * MIB + 1;
        initiator.transfer_sync(&[request(Opcode::Write, local_host.addr() + 1, seg, remote.addr + at, len)]).unwrap();
        assert_eq!(pattern::first_mismatch(&remote.read_back(at, len), 11, 7), None, "written from host {len}");
    }
    assert_eq!(pattern::first_mismatch(&remote.read_back(0, 3 * MIB), 11, 0), None, "nothing else written");
    initiator.unregister(local.addr).unwrap();
    target.unregister(remote.addr).unwrap();
}

#[test]
fn a_transfer_on_a_stream_runs_on_the_drivers_time_and_reports_a_later_failure_once() {
    let target = engine(Some(TransportKind::Tcp), fake_driver());
    let initiator = engine(Some(TransportKind::Tcp), fake_driver());
    let remote = DeviceBuffer::new(0, 4 * MIB);
    target.register(remote.addr, remote.len, "cuda:0").unwrap();
    let local = DeviceBuffer::with_pattern(0, 2 * MIB, 7);
    initiator.register(local.addr, local.len, "cuda:0").unwrap();
    let seg = initiator.open_segment(target.segment_name()).unwrap();
    let (held, dropped) = std::sync::mpsc::channel::<()>();

    // Stream 0 (the default stream; no context is current on this thread: device 0's is used).
    let write = request(Opcode::Write, local.addr + 3, seg, remote.addr + 5, 2 * MIB - 3);
    initiator.transfer_on_stream(0, vec![write], held).unwrap();
    // `hold` goes once the transfer has ended: then the bytes are there.
    let ended = dropped.recv_timeout(Duration::from_secs(30));
    assert_eq!(ended, Err(std::sync::mpsc::RecvTimeoutError::Disconnected), "dropped, not timed out");
    assert_eq!(pattern::first_mismatch(&remote.read_back(5, 2 * MIB - 3), 7, 3), None);

    // Refused at once, nothing queued: memory not registered, length 0, an unknown segment.
    let refused = |r: TransferRequest| initiator.transfer_on_stream(0, vec![r], ()).unwrap_err();
    let err = refused(request(Opcode::Write, local.addr + 2 * MIB, seg, remote.addr, 16));
    assert!(matches!(err, EngineError::LocalNotRegistered { .. }), "{err}");
    let err = refused(request(Opcode::Write, local.addr, seg, remote.addr, 0));
    assert!(matches!(err, EngineError::InvalidArgument(_)), "{err}");
    let err = refused(request(Opcode::Write, local.addr, 999, remote.addr, 16));
    assert!(matches!(err, EngineError::UnknownSegment(999)), "{err}");

    // A read past the target's region fails on the stream's time: the next call reports it, once.
    let past = request(Opcode::Read, local.addr, seg, remote.addr + 4 * MIB - 10, 100);
    initiator.transfer_on_stream(0, vec![past], ()).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let reported = loop {
        match initiator.transfer_on_stream(0, Vec::new(), ()) {
            Err(e) => break e,
            Ok(()) if std::time::Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Ok(()) => panic!("the failed transfer was never reported"),
        }
    };
    assert!(matches!(reported, EngineError::StreamTransferFailed { .. }), "{reported}");
    assert!(reported.to_string().contains("outside"), "{reported}");
    initiator.transfer_on_stream(0, Vec::new(), ()).unwrap();
    assert_eq!(pattern::first_mismatch(&local.read_back(0, 2 * MIB), 7, 0), None, "the failed read wrote nothing");
    initiator.unregister(local.addr).unwrap();
    target.unregister(remote.addr).unwrap();
}

/// A `device-peer` process and its lines.
struct Peer {
    _child: ChildGuard,
    stdin: ChildStdin,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
    segment: String,
    device: u64,
    host: u64,
}

impl Peer {
    fn spawn(args: &[&str], driver: &std::path::Path) -> Peer {
        let mut child = Command::new(env!("CARGO_BIN_EXE_device-peer"))
            .args(args)
            .env("CRESCENT_CUDA_DRIVER", driver)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn device-peer");
        let stdin = child.stdin.take().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let (mut segment, mut device, mut host) = (String::new(), 0, 0);
        for line in lines.by_ref() {
            let line = line.unwrap();
            let hex = |v: &str| u64::from_str_radix(v.trim().trim_start_matches("0x"), 16).unwrap();
            if let Some(v) = line.strip_prefix("segment: ") {
                segment = v.trim().to_string();
            } else if let Some(v) = line.strip_prefix("device: ") {
                device = hex(v);
            } else if let Some(v) = line.strip_prefix("host: ") {
                host = hex(v);
            } else if line == "ready" {
                break;
            }
        }
        assert!(device != 0 && host != 0 && !segment.is_empty(), "device-peer started");
        Peer { _child: ChildGuard(child), stdin, lines, segment, device, host }
    }

    fn ask(&mut self, command: &str) -> String {
        writeln!(self.stdin, "{command}").unwrap();
        self.lines.next().expect("device-peer answers").unwrap()
    }
}

/// Both directions between this process's device (and host) memory and the peer's device
/// (and host) memory, over `protocol` (`None`: chosen, shm on this host). `vmm`: the device
/// memory of both processes is of the virtual memory management API (`cuMemCreate`), which
/// shm reaches through exported descriptors instead of IPC handles.
fn moves_device_memory_with_another_process(protocol: Option<TransportKind>, expected: TransportKind, vmm: bool) {
    let mut args: Vec<&str> = if protocol.is_some() { vec!["--protocol", "tcp"] } else { Vec::new() };
    if vmm {
        args.push("--vmm");
    }
    let mut peer = Peer::spawn(&args, &fake_driver());
    let peer_pid = peer._child.0.id();
    let e = engine(protocol, fake_driver());
    let seg = e.open_segment(&peer.segment).unwrap();
    assert_eq!(e.segment_transport(seg).unwrap(), expected);
    let alloc =
        |device: u32, len: u64| if vmm { DeviceBuffer::vmm(device, len) } else { DeviceBuffer::new(device, len) };
    let local = alloc(0, 4 * MIB);
    e.register(local.addr, local.len, "cuda:0").unwrap();
    let local_host = e.alloc_registered(4 * MIB, "cpu:0").unwrap();

    // Their device into our device.
    e.transfer_sync(&[request(Opcode::Read, local.addr + 3, seg, peer.device + 999, 3 * MIB)]).unwrap();
    assert_eq!(pattern::first_mismatch(&local.read_back(3, 3 * MIB), 1, 999), None);
    if vmm && expected == TransportKind::Shm {
        assert!(vmm_mappings_of(peer_pid) > 0, "the peer's VMM allocation is mapped here");
    }
    // Our device into theirs: checked by the peer, which copies it back with its driver.
    let fresh = alloc(0, 2 * MIB).filled(5);
    e.register(fresh.addr, fresh.len, "*").unwrap();
    e.transfer_sync(&[request(Opcode::Write, fresh.addr, seg, peer.device + MIB + 17, 2 * MIB)]).unwrap();
    assert_eq!(peer.ask(&format!("verify {} {} 5 0", MIB + 17, 2 * MIB)), "ok");
    assert_eq!(peer.ask(&format!("verify 0 {} 1 0", MIB + 17)), "ok", "nothing written before the range");
    // Their device into our host memory, their host memory into our device.
    e.transfer_sync(&[request(Opcode::Read, local_host.addr(), seg, peer.device, MIB)]).unwrap();
    // SAFETY: the transfer ended.
    assert_eq!(pattern::first_mismatch(unsafe { &local_host.as_slice()[..MIB as usize] }, 1, 0), None);
    e.transfer_sync(&[request(Opcode::Read, local.addr, seg, peer.host + 11, 2 * MIB)]).unwrap();
    assert_eq!(pattern::first_mismatch(&local.read_back(0, 2 * MIB), 3, 11), None);
    // Our device into their host memory, read back into ours.
    e.transfer_sync(&[request(Opcode::Write, fresh.addr, seg, peer.host, MIB)]).unwrap();
    e.transfer_sync(&[request(Opcode::Read, local_host.addr(), seg, peer.host, MIB)]).unwrap();
    // SAFETY: the transfer ended.
    assert_eq!(pattern::first_mismatch(unsafe { &local_host.as_slice()[..MIB as usize] }, 5, 0), None);
    // The peer unregisters its device memory while this process holds it (an IPC mapping over
    // shm): the unregister waits for the revoke, later requests fail out of range, none crashes.
    assert_eq!(peer.ask("unregister"), "ok");
    assert_eq!(wait_unmapped(peer_pid), 0, "the revoked VMM allocation is unmapped here");
    let err = e.transfer_sync(&[request(Opcode::Read, local.addr, seg, peer.device, MIB)]).unwrap_err();
    assert!(err.to_string().contains("outside"), "{err}");
    e.transfer_sync(&[request(Opcode::Read, local.addr, seg, peer.host, MIB)]).unwrap();
    writeln!(peer.stdin, "quit").unwrap();
    e.unregister(fresh.addr).unwrap();
    e.unregister(local.addr).unwrap();
}

#[test]
fn shm_moves_device_memory_between_two_processes_through_ipc() {
    moves_device_memory_with_another_process(None, TransportKind::Shm, false);
}

#[test]
fn tcp_moves_device_memory_between_two_processes() {
    moves_device_memory_with_another_process(Some(TransportKind::Tcp), TransportKind::Tcp, false);
}

#[test]
fn shm_moves_vmm_device_memory_between_two_processes_through_exported_descriptors() {
    moves_device_memory_with_another_process(None, TransportKind::Shm, true);
}

#[test]
fn tcp_moves_vmm_device_memory_between_two_processes() {
    moves_device_memory_with_another_process(Some(TransportKind::Tcp), TransportKind::Tcp, true);
}

#[test]
fn a_peers_vmm_memory_is_unmapped_when_its_process_dies_and_legacy_memory_reads_it_too() {
    let mut peer = Peer::spawn(&["--vmm"], &fake_driver());
    let peer_pid = peer._child.0.id();
    let e = engine(None, fake_driver());
    let seg = e.open_segment(&peer.segment).unwrap();
    assert_eq!(e.segment_transport(seg).unwrap(), TransportKind::Shm);
    // VMM memory on their end only: into memory of cuMemAlloc on another device here, and
    // into host memory.
    let local = DeviceBuffer::new(1, 2 * MIB);
    e.register(local.addr, local.len, "*").unwrap();
    e.transfer_sync(&[request(Opcode::Read, local.addr + 1, seg, peer.device + 4097, 2 * MIB - 1)]).unwrap();
    assert_eq!(pattern::first_mismatch(&local.read_back(1, 2 * MIB - 1), 1, 4097), None);
    let local_host = e.alloc_registered(MIB, "cpu:0").unwrap();
    e.transfer_sync(&[request(Opcode::Read, local_host.addr(), seg, peer.device + 5, MIB)]).unwrap();
    // SAFETY: the transfer ended.
    assert_eq!(pattern::first_mismatch(unsafe { local_host.as_slice() }, 1, 5), None);
    assert!(vmm_mappings_of(peer_pid) > 0, "the peer's VMM allocation is mapped here");
    // The peer dies without unregistering: its connection closes, the grant goes, and with it
    // the mapping of its allocation.
    peer._child.kill_now();
    assert_eq!(wait_unmapped(peer_pid), 0, "the dead peer's VMM allocation is unmapped here");
    let err = e.transfer_sync(&[request(Opcode::Read, local.addr, seg, peer.device, MIB)]);
    assert!(err.is_err(), "the dead peer's memory is out of reach");
    e.unregister(local.addr).unwrap();
}

#[test]
fn a_peer_that_cannot_open_the_device_memory_fails_the_request_clearly() {
    let peer = Peer::spawn(&[], &fake_driver());
    // This process has no driver: the peer's device memory cannot be opened here over shm.
    let e = engine(None, PathBuf::from("/nonexistent/libcuda.so.1"));
    let seg = e.open_segment(&peer.segment).unwrap();
    assert_eq!(e.segment_transport(seg).unwrap(), TransportKind::Shm);
    let local = e.alloc_registered(MIB, "cpu:0").unwrap();
    let err = e.transfer_sync(&[request(Opcode::Read, local.addr(), seg, peer.device, MIB)]).unwrap_err();
    assert!(err.to_string().contains("device memory"), "{err}");
    // Its host memory is still reachable.
    e.transfer_sync(&[request(Opcode::Read, local.addr(), seg, peer.host, MIB)]).unwrap();
    // SAFETY: the transfer ended.
    assert_eq!(pattern::first_mismatch(unsafe { local.as_slice() }, 3, 0), None);
}

#[test]
fn the_fake_drivers_device_memory_cannot_be_touched_by_the_cpu() {
    let status = Command::new(env!("CARGO_BIN_EXE_device-peer"))
        .arg("--touch")
        .env("CRESCENT_CUDA_DRIVER", fake_driver())
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert_eq!(status.signal(), Some(SIGSEGV), "a CPU read of device memory kills the process: {status}");
}

/// SIGSEGV's number on Linux.
const SIGSEGV: i32 = 11;

#[test]
fn vmm_memory_goes_as_a_descriptor_only_to_an_initiator_that_announced_it() {
    use crescent_transports::shm::socket::Socket;
    use crescent_transports::shm::wire::{Frame, Kind, Mode, Status, FEATURES};
    let target = engine(None, fake_driver());
    let memory = DeviceBuffer::vmm(0, 4 * MIB);
    target.register(memory.addr + MIB, 2 * MIB, "cuda:0").unwrap();
    let name = shm_socket(&target);
    let ask = |features: u64| {
        let s = Socket::connect(&name, Duration::from_secs(5)).unwrap();
        s.set_recv_timeout(Some(Duration::from_secs(5))).unwrap();
        s.send(&Frame { id: features, ..Frame::new(Kind::Hello) }, None).unwrap();
        assert_eq!(s.recv().unwrap().unwrap().0.kind, Kind::HelloReply);
        s.send(&Frame { id: 1, addr: memory.addr + MIB + 5, len: 10, ..Frame::new(Kind::Map) }, None).unwrap();
        s.recv().unwrap().expect("a map reply")
    };
    // An initiator of before the feature (its hello's id is 0): refused cleanly, no descriptor.
    let (old, fd) = ask(0);
    assert_eq!((old.kind, old.status, old.mode), (Kind::MapReply, Status::DeviceUnavailable, Mode::None));
    assert!(fd.is_none());
    // One that announced it: the allocation's descriptor, its size and the region's offset.
    let (new, fd) = ask(FEATURES);
    assert_eq!((new.status, new.mode), (Status::Ok, Mode::DeviceVmm));
    assert_eq!((new.addr, new.len), (memory.addr + MIB, 2 * MIB));
    let vmm = new.vmm.expect("the allocation's size and the region's offset");
    assert_eq!((vmm.device, vmm.offset, vmm.size), (0, MIB, 4 * MIB));
    let fd = fd.expect("the exported descriptor");
    let size = std::fs::File::from(fd).metadata().unwrap().len();
    assert_eq!(size, 4 * MIB, "the fake's descriptor is the allocation's memfd");
    target.unregister(memory.addr + MIB).unwrap();
}
