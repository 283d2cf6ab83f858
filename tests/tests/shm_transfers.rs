//! The shm transport between two processes on one host: a `tebench target` serving either
//! shared memory (`alloc_registered`, a memfd the initiator maps) or heap memory (reached with
//! process_vm_readv/writev), and an initiator in this process whose own memory is either kind
//! too. Reads and writes of odd sizes at odd offsets, across slice boundaries, keep every byte.

use std::time::Duration;

use crescent_benches::pattern;
use crescent_engine::{Opcode, TransferEngine, TransferRequest, TransportKind};
use crescent_tests::{open_first_buffer, same_host_engine, spawn_tebench_target};

/// Local registered memory of one kind.
enum Local {
    Shared(crescent_engine::RegisteredMemory),
    Heap(Vec<u8>),
}

impl Local {
    fn new(engine: &TransferEngine, heap: bool, len: usize) -> Local {
        if heap {
            let mut v = vec![0u8; len];
            engine.register(v.as_mut_ptr() as u64, len as u64, "cpu:0").unwrap();
            Local::Heap(v)
        } else {
            Local::Shared(engine.alloc_registered(len as u64, "cpu:0").unwrap())
        }
    }
    fn addr(&self) -> u64 {
        match self {
            Local::Shared(m) => m.addr(),
            Local::Heap(v) => v.as_ptr() as u64,
        }
    }
    /// The bytes; only called while no transfer of this memory is in flight.
    fn bytes(&mut self) -> &mut [u8] {
        match self {
            // SAFETY: no transfer is in flight (callers wait for each transfer to end).
            Local::Shared(m) => unsafe { m.as_mut_slice() },
            Local::Heap(v) => v,
        }
    }
}

/// (offset in the target buffer, length): odd sizes, odd offsets, one more than a slice.
const CASES: [(u64, u64); 5] =
    [(0, 1), (4095, 4097), (12_345, 777_777), (1 << 20, 4 << 20), ((3 << 20) + 1, (5 << 20) + 3)];

fn check_reads_and_writes(target_args: &[&str], local_heap: bool) {
    let (_target, name) = spawn_tebench_target(&[], target_args);
    let engine = same_host_engine(Duration::from_secs(30));
    let seg = engine.open_segment(&name).unwrap();
    assert_eq!(engine.segment_transport(seg).unwrap(), TransportKind::Shm);
    let remote = engine.segment_descriptor(seg).unwrap().buffers[0].clone();
    let mut local = Local::new(&engine, local_heap, 12 << 20);
    let what = format!("target {target_args:?}, local heap: {local_heap}");
    let transfer = |opcode, source, offset, length| {
        engine
            .transfer_sync(&[TransferRequest {
                opcode,
                source,
                target: seg,
                target_offset: remote.addr + offset,
                length,
            }])
            .unwrap_or_else(|e| panic!("{what}: {opcode:?} of {length} at {offset}: {e}"));
    };
    // Reads: the target's pattern, byte for byte, into an odd local offset.
    for &(off, len) in &CASES {
        local.bytes().fill(0);
        transfer(Opcode::Read, local.addr() + 3, off, len);
        let got = &local.bytes()[3..3 + len as usize];
        assert_eq!(pattern::first_mismatch(got, 0, off), None, "{what}: read {len} at {off}");
        assert!(local.bytes()[..3].iter().all(|&b| b == 0), "{what}: bytes before untouched");
        assert_eq!(local.bytes()[3 + len as usize], 0, "{what}: byte after untouched");
    }
    // Writes into the second half of the target, checked by reading them back elsewhere.
    for (i, &(off, len)) in CASES.iter().enumerate() {
        let off = off + (16 << 20);
        let seed = 100 + i as u64;
        pattern::fill(&mut local.bytes()[..len as usize], seed, off);
        transfer(Opcode::Write, local.addr(), off, len);
        local.bytes()[6 << 20..].fill(0);
        transfer(Opcode::Read, local.addr() + (6 << 20), off, len);
        let back = &local.bytes()[6 << 20..(6 << 20) + len as usize];
        assert_eq!(pattern::first_mismatch(back, seed, off), None, "{what}: write {len} at {off}");
    }
    // Bytes just outside the written ranges keep the target's pattern.
    transfer(Opcode::Read, local.addr(), (16 << 20) - 100, 101);
    assert_eq!(pattern::first_mismatch(&local.bytes()[..100], 0, (16 << 20) - 100), None, "{what}");
    assert_ne!(local.bytes()[100], pattern::byte_at(0, 16 << 20), "{what}: first write landed");
    let (off, len) = CASES[4];
    let off = off + (16 << 20);
    transfer(Opcode::Read, local.addr(), off + len, 100);
    assert_eq!(pattern::first_mismatch(&local.bytes()[..100], 0, off + len), None, "{what}");
    if let Local::Heap(v) = &local {
        engine.unregister(v.as_ptr() as u64).unwrap();
    }
}

const SHARED: &[&str] = &["--buffer-size", "32M", "--pattern", "--local-hostname", "127.0.0.1"];
const HEAP: &[&str] = &["--buffer-size", "32M", "--pattern", "--heap", "--local-hostname", "127.0.0.1"];

#[test]
fn shared_target_memory_with_shared_local_memory() {
    check_reads_and_writes(SHARED, false);
}

#[test]
fn shared_target_memory_with_heap_local_memory() {
    check_reads_and_writes(SHARED, true);
}

#[test]
fn heap_target_memory_with_shared_local_memory() {
    check_reads_and_writes(HEAP, false);
}

#[test]
fn heap_target_memory_with_heap_local_memory() {
    check_reads_and_writes(HEAP, true);
}

#[test]
fn requests_outside_the_target_memory_fail_with_the_reason() {
    let (_target, name) = spawn_tebench_target(&[], SHARED);
    let engine = same_host_engine(Duration::from_secs(30));
    let (seg, remote) = open_first_buffer(&engine, &name);
    let local = engine.alloc_registered(1 << 20, "cpu:0").unwrap();
    for (offset, length) in [(remote.length - 10, 11), (remote.length, 1)] {
        let err = engine
            .transfer_sync(&[TransferRequest {
                opcode: Opcode::Write,
                source: local.addr(),
                target: seg,
                target_offset: remote.addr + offset,
                length,
            }])
            .unwrap_err();
        assert!(err.to_string().contains("outside"), "{err}");
    }
}
