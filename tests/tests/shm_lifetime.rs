//! Lifetime of memory a same-host peer can reach: once `unregister`/`free_registered`
//! returns, no write of the peer lands in the memory any more (heap memory reached with
//! process_vm_writev and shared memory the peer has mapped alike), requests to it fail with
//! a clear reason, and memory registered again is reached afresh, never through an old
//! mapping. Target and initiator are two engines in this process, which talk over the shm
//! transport exactly as two processes do.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crescent_benches::pattern;
use crescent_engine::{Opcode, TransferEngine, TransportKind};
use crescent_tests::{eventually, same_host_engine, transfer_one};

const LEN: u64 = 4 << 20;
const BLOCK: u64 = 64 << 10;

/// An initiator thread writing 0xAB blocks all over `[addr, +LEN)` of the target until told
/// to stop; counts writes that completed, and apart from them the writes that completed
/// although they began after `unregistered` was set, and keeps the failures (and counts
/// them as they come).
struct Writer {
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    unregistered: Arc<AtomicBool>,
    done_after_unregister: Arc<AtomicU64>,
    handle: Option<std::thread::JoinHandle<Vec<String>>>,
}

impl Writer {
    fn start(initiator: &Arc<TransferEngine>, seg: u64, addr: u64) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(AtomicU64::new(0));
        let unregistered = Arc::new(AtomicBool::new(false));
        let done_after_unregister = Arc::new(AtomicU64::new(0));
        let local = initiator.alloc_registered(BLOCK, "cpu:0").unwrap();
        // SAFETY: no transfer of `local` is in flight yet.
        unsafe { local.as_mut_slice() }.fill(0xAB);
        let (engine, stop2, done2, failed2) = (initiator.clone(), stop.clone(), done.clone(), failed.clone());
        let (unregistered2, after2) = (unregistered.clone(), done_after_unregister.clone());
        let handle = std::thread::spawn(move || {
            let mut failures = Vec::new();
            let mut i = 0u64;
            while !stop2.load(Ordering::Relaxed) {
                let offset = (i * 7919 * BLOCK) % (LEN - BLOCK);
                i += 1;
                // A write that began before the unregister returned may still complete (its
                // bytes land before the revoke is acknowledged); one that begins after may not.
                let began_after = unregistered2.load(Ordering::SeqCst);
                match transfer_one(&engine, Opcode::Write, local.addr(), seg, addr + offset, BLOCK) {
                    Ok(()) => {
                        done2.fetch_add(1, Ordering::Relaxed);
                        if began_after {
                            after2.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    Err(e) => {
                        failures.push(e.to_string());
                        failed2.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
            failures
        });
        Writer { stop, done, failed, unregistered, done_after_unregister, handle: Some(handle) }
    }

    fn finish(mut self) -> Vec<String> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.take().unwrap().join().unwrap()
    }
}

fn pair() -> (Arc<TransferEngine>, Arc<TransferEngine>) {
    (same_host_engine(Duration::from_secs(20)), same_host_engine(Duration::from_secs(20)))
}

/// Runs a writer against `[addr, +LEN)`, unregisters it with `unregister` mid-stream, then
/// zeroes the memory and checks that it stays zero while the writer keeps trying.
fn writes_stop_at_unregister(
    target: &Arc<TransferEngine>,
    initiator: &Arc<TransferEngine>,
    addr: u64,
    unregister: impl FnOnce(),
) {
    let seg = initiator.open_segment(target.segment_name()).unwrap();
    assert_eq!(initiator.segment_transport(seg).unwrap(), TransportKind::Shm);
    let writer = Writer::start(initiator, seg, addr);
    assert!(
        eventually(Duration::from_secs(20), || writer.done.load(Ordering::Relaxed) >= 20),
        "writes complete while the memory is registered"
    );
    unregister();
    writer.unregistered.store(true, Ordering::SeqCst);
    // The memory is ours alone now: clear it, and let the writer try for a while: 300 ms at
    // least, and until one of its writes has failed (a loaded host may keep the writer's
    // thread off the CPU for long).
    // SAFETY: `[addr, +LEN)` is live memory of this test, unregistered above.
    unsafe { std::ptr::write_bytes(addr as *mut u8, 0, LEN as usize) };
    std::thread::sleep(Duration::from_millis(300));
    let failed = eventually(Duration::from_secs(20), || writer.failed.load(Ordering::SeqCst) >= 1);
    let completed_after = writer.done_after_unregister.load(Ordering::SeqCst);
    let failures = writer.finish();
    // SAFETY: as above; the writer has stopped.
    let bytes = unsafe { std::slice::from_raw_parts(addr as *const u8, LEN as usize) };
    assert!(
        bytes.iter().all(|&b| b == 0),
        "a write landed after the unregister returned (byte {} is {:#x})",
        bytes.iter().position(|&b| b != 0).unwrap(),
        bytes.iter().find(|&&b| b != 0).unwrap()
    );
    assert_eq!(completed_after, 0, "no write begun after the unregister returned completes");
    assert!(failed && !failures.is_empty(), "the writer kept trying and failed");
    // Outside the target's memory, or — when the revocation's ack came late on a loaded machine
    // and the target disconnected this peer, as documented — the broken connection.
    assert!(
        failures.iter().all(|f| f.contains("outside") || f.contains("connection")),
        "failures name the reason: {failures:?}"
    );
}

#[test]
fn heap_memory_is_never_written_after_unregister() {
    let (target, initiator) = pair();
    let mut heap = vec![0u8; LEN as usize];
    let addr = heap.as_mut_ptr() as u64;
    target.register(addr, LEN, "cpu:0").unwrap();
    writes_stop_at_unregister(&target, &initiator, addr, || target.unregister(addr).unwrap());
    drop(heap);
}

#[test]
fn mapped_shared_memory_is_never_written_after_free() {
    let (target, initiator) = pair();
    let mem = target.alloc_registered(LEN, "cpu:0").unwrap();
    // The test keeps a handle, so the pages stay this process's after the free.
    let keep = mem.clone();
    writes_stop_at_unregister(&target, &initiator, keep.addr(), || target.free_registered(mem).unwrap());
}

#[test]
fn memory_registered_again_is_reached_afresh() {
    let (target, initiator) = pair();
    let seg = initiator.open_segment(target.segment_name()).unwrap();
    let local = initiator.alloc_registered(LEN, "cpu:0").unwrap();
    let write = |addr: u64, seed: u64| {
        // SAFETY: no transfer of `local` is in flight.
        pattern::fill(unsafe { local.as_mut_slice() }, seed, 0);
        transfer_one(&initiator, Opcode::Write, local.addr(), seg, addr, LEN)
    };
    // Shared memory: the initiator maps the first allocation; after it is freed, a new one
    // (wherever it lands, possibly at the same address) receives the next write, not the
    // old mapping.
    for round in 0..3u64 {
        let mem = target.alloc_registered(LEN, "cpu:0").unwrap();
        // At another address, the initiator needs the target's new descriptor, which it
        // fetches again at most every half second.
        assert!(eventually(Duration::from_secs(5), || write(mem.addr(), round).is_ok()));
        // SAFETY: the write ended.
        let got = unsafe { mem.as_slice() };
        assert_eq!(pattern::first_mismatch(got, round, 0), None, "round {round}");
        target.free_registered(mem).unwrap();
    }
    // Heap memory unregistered, then registered again at the same address.
    let mut heap = vec![0u8; LEN as usize];
    let addr = heap.as_mut_ptr() as u64;
    target.register(addr, LEN, "cpu:0").unwrap();
    assert!(eventually(Duration::from_secs(5), || write(addr, 7).is_ok()));
    target.unregister(addr).unwrap();
    let err = write(addr, 8).unwrap_err();
    assert!(err.to_string().contains("outside"), "{err}");
    target.register(addr, LEN, "cpu:0").unwrap();
    assert!(eventually(Duration::from_secs(5), || write(addr, 9).is_ok()));
    assert_eq!(pattern::first_mismatch(&heap, 9, 0), None);
    target.unregister(addr).unwrap();
    heap[0] = 1;
}
