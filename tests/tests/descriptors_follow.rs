//! A segment opened before its owner registered memory (a decode node that opens a prefill
//! node's segment while that node is still registering) follows what the owner registers: a
//! request for memory its cached descriptor does not list reads the descriptor again, for a
//! bounded while, before it fails out of range. Over the P2P handshake here; through etcd,
//! redis and http in `metadata_services.rs`.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crescent_benches::pattern;
use crescent_engine::handshake;
use crescent_engine::{EngineError, Opcode, TransferEngine};
use crescent_tests::{loopback_engine, transfer_one, workspace_bin, ChildGuard};
use crescent_transports::net::Auth;
use crescent_transports::SharedMemory;

const TIMEOUT: Duration = Duration::from_secs(20);
const LEN: u64 = 1 << 20;

/// Registers `mem` with `owner` once told to, a moment later: the owner is still registering
/// when the other side's request arrives.
fn register_when_told(
    owner: Arc<TransferEngine>,
    mem: Arc<SharedMemory>,
) -> (mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let (go, told) = mpsc::channel::<()>();
    let registrar = std::thread::spawn(move || {
        told.recv().unwrap();
        std::thread::sleep(Duration::from_millis(200));
        owner.register(mem.addr(), mem.len(), "cpu:0").unwrap();
    });
    (go, registrar)
}

#[test]
fn a_request_for_memory_registered_after_the_segment_was_opened_waits_for_it() {
    let owner = loopback_engine(TIMEOUT);
    let initiator = loopback_engine(TIMEOUT);
    let seg = initiator.open_segment(owner.segment_name()).unwrap();
    assert!(initiator.segment_descriptor(seg).unwrap().buffers.is_empty(), "nothing registered yet");

    // The owner's memory exists (its address is known, as a master would hand it out) but is
    // registered only after the initiator's request has started.
    let mem = Arc::new(SharedMemory::allocate(LEN, "late").unwrap());
    // SAFETY: nothing transfers this memory yet.
    pattern::fill(unsafe { std::slice::from_raw_parts_mut(mem.addr() as *mut u8, LEN as usize) }, 5, 0);
    let local = initiator.alloc_registered(LEN, "cpu:0").unwrap();
    let (go, registrar) = register_when_told(owner.clone(), mem.clone());
    go.send(()).unwrap();
    transfer_one(&initiator, Opcode::Read, local.addr(), seg, mem.addr(), LEN)
        .expect("the read waits for the owner's registration");
    registrar.join().unwrap();
    // SAFETY: the transfer ended.
    assert_eq!(pattern::first_mismatch(unsafe { local.as_slice() }, 5, 0), None, "bytes read");

    // The registration is what any peer now fetches over the handshake, and what the
    // initiator's cached descriptor holds.
    let fetched = handshake::fetch_descriptor(owner.segment_name(), TIMEOUT, &Auth::open()).unwrap();
    assert!(fetched.buffers.iter().any(|b| b.addr == mem.addr() && b.length == LEN), "{fetched:?}");
    assert!(initiator.segment_descriptor(seg).unwrap().buffers.iter().any(|b| b.addr == mem.addr()));
    drop(owner);
}

#[test]
fn a_write_into_memory_registered_meanwhile_lands() {
    let owner = loopback_engine(TIMEOUT);
    let initiator = loopback_engine(TIMEOUT);
    // Some memory registered first: the segment is opened with a descriptor that lists it.
    let _first = owner.alloc_registered(LEN, "cpu:0").unwrap();
    let seg = initiator.open_segment(owner.segment_name()).unwrap();
    let mem = Arc::new(SharedMemory::allocate(LEN, "later").unwrap());
    let local = initiator.alloc_registered(LEN, "cpu:0").unwrap();
    // SAFETY: nothing transfers `local` yet.
    pattern::fill(unsafe { local.as_mut_slice() }, 8, 0);
    let (go, registrar) = register_when_told(owner.clone(), mem.clone());
    go.send(()).unwrap();
    transfer_one(&initiator, Opcode::Write, local.addr(), seg, mem.addr(), LEN)
        .expect("the write waits for the owner's registration");
    registrar.join().unwrap();
    // SAFETY: the write ended; nothing else touches the memory.
    let landed = unsafe { std::slice::from_raw_parts(mem.addr() as *const u8, LEN as usize) };
    assert_eq!(pattern::first_mismatch(landed, 8, 0), None, "bytes written");
    drop(owner);
}

#[test]
fn an_address_never_registered_still_fails_out_of_range_before_the_deadline() {
    let owner = loopback_engine(TIMEOUT);
    let initiator = loopback_engine(TIMEOUT);
    let remote = owner.alloc_registered(LEN, "cpu:0").unwrap();
    let seg = initiator.open_segment(owner.segment_name()).unwrap();
    let local = initiator.alloc_registered(LEN, "cpu:0").unwrap();
    let started = Instant::now();
    let err =
        transfer_one(&initiator, Opcode::Read, local.addr(), seg, remote.addr() + LEN + (1 << 30), 4096).unwrap_err();
    match &err {
        EngineError::TransferFailed { reason, .. } => {
            assert!(reason.is_out_of_range(), "{err}");
            assert!(reason.message.contains("outside the registered memory"), "{err}");
            // It was looked up again before failing.
            assert!(reason.message.contains("read again"), "{err}");
        }
        other => panic!("an out-of-range failure, not {other}"),
    }
    assert!(started.elapsed() < TIMEOUT, "the request ended within its deadline");
    // The segment still works.
    transfer_one(&initiator, Opcode::Read, local.addr(), seg, remote.addr(), LEN).unwrap();
}

/// `tebench initiator` started as soon as its target's engine is up, before the target
/// registered its buffer: it says that it waits, and runs once the buffer is registered.
#[test]
fn tebench_initiator_waits_for_its_target_to_register() {
    let owner = loopback_engine(TIMEOUT);
    let mut child = ChildGuard(
        Command::new(workspace_bin("tebench"))
            .args(["initiator", "--segment", owner.segment_name(), "--operation", "write"])
            .args(["--local-hostname", "127.0.0.1", "--protocol", "tcp", "--block-size", "64K"])
            .args(["--batch-size", "4", "--duration", "0.3", "--verify", "--json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stdout = child.0.stdout.take().unwrap();
    let printed = std::thread::spawn(move || std::io::read_to_string(stdout).unwrap());
    let mut stderr = BufReader::new(child.0.stderr.take().unwrap());
    let mut said = String::new();
    let mut line = String::new();
    while stderr.read_line(&mut line).unwrap() > 0 && !line.contains("waiting up to") {
        said.push_str(&line);
        line.clear();
    }
    assert!(line.contains("has no registered buffer yet"), "the initiator said: {said}{line}");
    let _buffer = owner.alloc_registered(4 << 20, "cpu:0").unwrap();
    let rest = std::io::read_to_string(stderr).unwrap();
    let status = child.0.wait().unwrap();
    let out = printed.join().unwrap();
    assert!(status.success(), "tebench initiator: {out}\n{said}{line}{rest}");
    assert!(out.contains("\"verified\":true"), "verified bytes: {out}");
}
