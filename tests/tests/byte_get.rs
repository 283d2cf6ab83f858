//! Byte gets (`get` returning a new vector) in one process against an in-process master on
//! loopback: the exact bytes at sizes around the 2 MiB piece a byte get moves at a time, and
//! the result vector written in place, never zeroed first (issue 28 §2: a byte get costs no
//! pass over the value beyond the transfer).
//!
//! The zeroing is seen through this binary's allocator, which counts zeroed allocations of at
//! least the value's size made on the calling thread.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use crescent_store::{ClientConfig, MasterConfig, StoreApi, StoreClient};

struct Counting;

thread_local! {
    /// Zeroed allocations of at least this many bytes are counted (0: none are).
    static WATCH: Cell<usize> = const { Cell::new(0) };
    /// Zeroed allocations counted on this thread.
    static ZEROED: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: every call is passed on to the system allocator unchanged; the counting touches
// only const-initialised thread-locals, which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let watch = WATCH.try_with(Cell::get).unwrap_or(0);
        if watch > 0 && layout.size() >= watch {
            let _ = ZEROED.try_with(|z| z.set(z.get() + 1));
        }
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// The piece a byte get moves at a time through the staging buffer or the hot cache.
const PIECE: usize = 2 << 20;

/// Gets `key` on this thread; returns the value and the zeroed allocations of at least
/// `len` bytes the call made here.
fn get_counting_zeroed(client: &StoreClient, key: &str, len: usize) -> (Vec<u8>, usize) {
    WATCH.with(|w| w.set(len.max(1)));
    ZEROED.with(|z| z.set(0));
    let got = client.get(key).expect("the get succeeds");
    WATCH.with(|w| w.set(0));
    (got, ZEROED.with(Cell::get))
}

#[test]
fn byte_gets_return_exact_bytes_around_piece_boundaries_without_zeroing_the_result() {
    let m = crescent_tests::store::loopback_master(MasterConfig::default());
    let holder = crescent_tests::store::loopback_client(&m, 64 << 20);
    // A reader with no segment of its own: every value it gets lies in the holder's memory.
    let reader = StoreClient::connect(ClientConfig {
        global_segment_size: 0,
        local_buffer_size: 4 << 20,
        ..crescent_tests::store::loopback_client_config(&m)
    })
    .expect("reader client");
    for (i, len) in [1, 4095, 4096, PIECE - 1, PIECE, PIECE + 1, 3 * PIECE + 5, 5 * PIECE].into_iter().enumerate() {
        let key = format!("bg/{len}");
        let value = crescent_tests::store::pattern_bytes(len, 40 + i as u64);
        holder.put(&key, &value).expect("put");
        for round in 0..2 {
            let (got, zeroed) = get_counting_zeroed(&reader, &key, len);
            assert_eq!(got.len(), len, "{len}-byte value, round {round}: wrong length");
            assert!(got == value, "{len}-byte value, round {round}: wrong bytes");
            if len >= 4096 {
                assert_eq!(zeroed, 0, "{len}-byte value, round {round}: the result was zeroed before the read");
            }
        }
    }
}
