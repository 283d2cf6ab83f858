//! The cache on its own (no master): recency order, held blocks, spans, admission, staleness,
//! the bounded fill queue, single flight, and readers racing fills with every byte checked.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crescent_engine::{EngineConfig, TransferEngine};

use super::*;
use crate::pattern;
use crate::proto::{GetReplicaListReply, ReplicaDescriptor, ReplicaStatus};

const B: u64 = 4096;

fn cache(blocks: u32, admission: Admission) -> HotCache {
    let engine =
        TransferEngine::new(EngineConfig { local_hostname: Some("127.0.0.1".into()), ..EngineConfig::default() })
            .unwrap();
    HotCache::with_layout(&engine, Layout { blocks, block_size: B, admission, fill: FillMode::Inline }).unwrap()
}

fn list(version: u64, size: u64) -> GetReplicaListReply {
    GetReplicaListReply {
        status: None,
        replicas: vec![ReplicaDescriptor {
            segment_name: "10.0.0.9:4000".into(),
            address: 0x1000_0000,
            size,
            status: ReplicaStatus::Complete as i32,
            ..Default::default()
        }],
        size,
        version,
        lease_ttl_ms: 10_000,
        checksum: None,
    }
}

fn bytes(version: u64, size: u64) -> Vec<u8> {
    let mut b = vec![0u8; size as usize];
    pattern::fill(&mut b, version, 0);
    b
}

/// Fills `key` with `size` bytes of pattern `version` and publishes it (waiting for the
/// worker); false when the cache did not take it.
fn put(c: &HotCache, key: &str, version: u64, size: u64) -> bool {
    let l = list(version, size);
    let Miss::Lead(mut fill) = c.begin(key, &l, &l.replicas[0]) else { return false };
    fill.copy_from(&bytes(version, size));
    c.publish(fill);
    c.flush();
    true
}

/// Blocks for `key` (version 1, one block), not yet published.
fn lead(c: &HotCache, key: &str) -> Fill {
    let l = list(1, B);
    match c.begin(key, &l, &l.replicas[0]) {
        Miss::Lead(fill) => fill,
        _ => panic!("{key}: expected to lead its fetch"),
    }
}

fn cached(c: &HotCache, key: &str, version: u64, size: u64) -> bool {
    match c.lookup(key, &list(version, size)) {
        Some(g) => {
            let v = g.to_vec();
            assert_eq!(pattern::first_mismatch(&v, version, 0), None, "{key} bytes");
            true
        }
        None => false,
    }
}

#[test]
fn eviction_takes_the_least_recently_used() {
    let c = cache(3, Admission::Always);
    for k in ["a", "b", "c"] {
        assert!(put(&c, k, 1, B));
    }
    assert!(cached(&c, "a", 1, B)); // order of use now: b, c, a
    assert!(put(&c, "d", 1, B)); // evicts b
    assert!(!cached(&c, "b", 1, B));
    assert!(cached(&c, "c", 1, B)); // order: a, d, c
    assert!(put(&c, "e", 1, B)); // evicts a
    assert!(!cached(&c, "a", 1, B));
    for k in ["c", "d", "e"] {
        assert!(cached(&c, k, 1, B), "{k}");
    }
    let m = c.metrics();
    assert_eq!((m.evictions, m.fills, m.entries, m.blocks_in_use), (2, 5, 3, 3));
    assert_eq!(m.hits, 5);
    assert_eq!(m.misses, 2);
    assert_eq!(m.bytes_served, 5 * B);
}

#[test]
fn a_held_entry_is_never_evicted_nor_its_blocks_reused() {
    let c = cache(2, Admission::Always);
    assert!(put(&c, "a", 1, B));
    assert!(put(&c, "b", 2, B));
    let held = c.lookup("a", &list(1, B)).unwrap(); // a is now the most recent, b the oldest
    assert!(cached(&c, "b", 2, B)); // b most recent: a is the LRU one, but held
    assert!(put(&c, "x", 3, B)); // must evict b, not the held a
    assert!(!cached(&c, "b", 2, B));
    assert_eq!(pattern::first_mismatch(&held.to_vec(), 1, 0), None);
    // Both entries held: a fill cannot get a block and is dropped (counted), the others stay.
    let held_x = c.lookup("x", &list(3, B)).unwrap();
    let before = c.metrics().dropped_fills;
    assert!(!put(&c, "y", 4, B));
    assert_eq!(c.metrics().dropped_fills, before + 1);
    // Invalidated while held: gone from the index, but its block comes back only after the
    // holder lets go, and the holder still reads the right bytes.
    c.invalidate("a");
    assert!(!put(&c, "y", 4, B), "a's block is still held");
    assert_eq!(pattern::first_mismatch(&held.to_vec(), 1, 0), None);
    drop(held);
    assert!(put(&c, "y", 4, B), "a's block came back");
    assert_eq!(pattern::first_mismatch(&held_x.to_vec(), 3, 0), None);
}

#[test]
fn objects_larger_than_a_block_span_blocks_and_larger_than_the_cache_are_skipped() {
    let c = cache(4, Admission::Always);
    let size = 2 * B + 123;
    assert!(put(&c, "span", 7, size));
    assert_eq!(c.metrics().blocks_in_use, 3);
    assert!(cached(&c, "span", 7, size));
    let mut out = vec![0u8; size as usize];
    c.lookup("span", &list(7, size)).unwrap().copy_to(&mut out);
    assert_eq!(pattern::first_mismatch(&out, 7, 0), None);
    // Larger than the whole cache: not a candidate, not counted as a dropped fill.
    assert!(!put(&c, "huge", 1, 4 * B + 1));
    assert_eq!(c.metrics().dropped_fills, 0);
    // Exactly the cache: evicts what is there.
    assert!(put(&c, "whole", 2, 4 * B));
    assert!(!cached(&c, "span", 7, size));
    assert!(cached(&c, "whole", 2, 4 * B));
}

#[test]
fn a_changed_version_size_or_replica_is_a_miss_and_drops_the_entry() {
    let c = cache(4, Admission::Always);
    assert!(put(&c, "k", 5, B));
    assert!(!cached(&c, "k", 6, B), "put again: new version");
    assert_eq!(c.metrics().entries, 0, "the stale entry is gone");
    assert!(put(&c, "k", 5, B));
    assert!(!cached(&c, "k", 5, B - 1), "another size");
    assert!(put(&c, "k", 5, B));
    let mut moved = list(5, B);
    moved.replicas[0].address += B;
    assert!(c.lookup("k", &moved).is_none(), "another replica address");
    assert!(put(&c, "k", 5, B));
    let mut processing = list(5, B);
    processing.replicas[0].status = ReplicaStatus::Processing as i32;
    assert!(c.lookup("k", &processing).is_none(), "its replica is not complete");
}

#[test]
fn second_access_admission_skips_one_off_reads() {
    let c = cache(2, Admission::SecondAccess);
    assert!(put(&c, "hot", 1, B) || put(&c, "hot", 1, B), "admitted on the second miss");
    assert!(!put(&c, "once-1", 1, B));
    assert!(!put(&c, "once-2", 1, B));
    assert!(cached(&c, "hot", 1, B), "one-off reads did not push the hot key out");
    assert_eq!(c.metrics().fills, 1);
}

#[test]
fn own_invalidation_forgets_keys() {
    let c = cache(4, Admission::Always);
    for k in ["p/1", "p/2", "q/1", "r"] {
        assert!(put(&c, k, 1, B));
    }
    c.invalidate("r");
    c.invalidate_matching(&regex::Regex::new("^p/").unwrap());
    assert!(!cached(&c, "p/1", 1, B) && !cached(&c, "p/2", 1, B) && !cached(&c, "r", 1, B));
    assert!(cached(&c, "q/1", 1, B));
    c.clear();
    assert!(!cached(&c, "q/1", 1, B));
    assert_eq!(c.metrics().blocks_in_use, 0);
}

#[test]
fn a_full_fill_queue_drops_fills_without_waiting() {
    let c = cache(MAX_FILL_QUEUE as u32 + 8, Admission::Always);
    let total = MAX_FILL_QUEUE + 8;
    {
        // The worker publishes under the policy lock: holding it stalls the worker, so the
        // queue fills up; publish must neither wait nor lose count.
        let _stall = c.inner.policy.lock();
        for i in 0..total {
            c.publish(lead(&c, &format!("k{i}")));
        }
    }
    c.flush();
    let m = c.metrics();
    assert!(m.dropped_fills >= 1, "{m}");
    assert_eq!(m.fills + m.dropped_fills, total as u64, "{m}");
    assert_eq!(m.blocks_in_use, m.fills, "dropped fills gave their blocks back: {m}");
}

#[test]
fn readers_racing_fills_always_read_whole_right_objects() {
    // 6 blocks, 8 keys of 1-2 blocks rewritten with new versions all the time: blocks are
    // evicted and reused constantly while readers copy out of them.
    let c = Arc::new(cache(6, Admission::Always));
    let stop = Arc::new(AtomicBool::new(false));
    let version = Arc::new(AtomicU64::new(1));
    let checked = Arc::new(AtomicU64::new(0));
    let size_of = |k: usize| B + (k as u64 * 997) % B;
    std::thread::scope(|s| {
        for w in 0..2 {
            let (c, stop, version) = (c.clone(), stop.clone(), version.clone());
            s.spawn(move || {
                let mut i = w;
                while !stop.load(Ordering::Relaxed) {
                    let k = i % 8;
                    let v = version.fetch_add(1, Ordering::Relaxed);
                    put(&c, &format!("k{k}"), v, size_of(k));
                    i += 1;
                }
            });
        }
        for _ in 0..3 {
            let (c, stop, checked) = (c.clone(), stop.clone(), checked.clone());
            s.spawn(move || {
                let mut i = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    let k = i % 8;
                    i += 1;
                    let key = format!("k{k}");
                    // Whatever version is cached now: the reader asks for it, as a get whose
                    // master reply names that version would.
                    let Some(v) = c.inner.index.get(&key).map(|e| e.id.version) else { continue };
                    if let Some(g) = c.lookup(&key, &list(v, size_of(k))) {
                        std::thread::yield_now(); // let fills run while we hold the entry
                        let bytes = g.to_vec();
                        assert_eq!(bytes.len() as u64, size_of(k));
                        assert_eq!(pattern::first_mismatch(&bytes, v, 0), None, "{key} v{v} read whole and right");
                        checked.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
        let started = std::time::Instant::now();
        while checked.load(Ordering::Relaxed) < 2000 && started.elapsed() < std::time::Duration::from_secs(20) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        stop.store(true, Ordering::Relaxed);
    });
    assert!(checked.load(Ordering::Relaxed) >= 100, "readers got hits: {}", checked.load(Ordering::Relaxed));
    let m = c.metrics();
    assert!(m.evictions > 0, "blocks were reused: {m}");
    assert!(m.blocks_in_use <= 6);
}

#[test]
fn the_fill_queue_takes_a_fill_for_every_block() {
    // Every queued fill holds a block: with one slot per block, a stalled worker never makes a
    // fill of a cache with free blocks be dropped (a fixed queue of 64 dropped the 66th).
    let c = cache(200, Admission::Always);
    {
        let _stall = c.inner.policy.lock();
        for i in 0..200 {
            c.publish(lead(&c, &format!("k{i}")));
        }
    }
    c.flush();
    let m = c.metrics();
    assert_eq!((m.fills, m.dropped_fills, m.entries), (200, 0, 200), "{m}");
}

#[test]
fn a_get_of_an_object_being_fetched_waits_for_that_fetch() {
    let c = cache(4, Admission::Always);
    let (l1, l2) = (list(1, B), list(2, B));
    let mut first = lead(&c, "k");
    // Same object: wait for the fetch in flight. Another version of the key: read it alone.
    let Miss::Join(joined) = c.begin("k", &l1, &l1.replicas[0]) else { panic!("expected to join") };
    assert!(matches!(c.begin("k", &l2, &l2.replicas[0]), Miss::Skip));
    std::thread::scope(|s| {
        let waiter = s.spawn(|| c.wait(joined).map(|g| g.to_vec()));
        first.copy_from(&bytes(1, B));
        c.publish(first);
        let got = waiter.join().unwrap().expect("served by the first get's fetch");
        assert_eq!(pattern::first_mismatch(&got, 1, 0), None);
    });
    c.flush();
    let m = c.metrics();
    assert_eq!((m.merged, m.fills, m.blocks_in_use, m.bytes_served), (1, 1, 1, B), "{m}");
    assert!(cached(&c, "k", 1, B));

    // A fetch that fails (its fill dropped unpublished): the waiter reads for itself at once,
    // and the blocks come back.
    let failed = lead(&c, "j");
    let l = list(1, B);
    let Miss::Join(joined) = c.begin("j", &l, &l.replicas[0]) else { panic!("expected to join") };
    drop(failed);
    assert!(c.wait(joined).is_none());
    assert_eq!(c.metrics().blocks_in_use, 1);
    // ... and the next miss of it leads a fetch again.
    drop(lead(&c, "j"));
}

fn deferred_cache(blocks: u32) -> HotCache {
    let engine =
        TransferEngine::new(EngineConfig { local_hostname: Some("127.0.0.1".into()), ..EngineConfig::default() })
            .unwrap();
    let layout = Layout { blocks, block_size: B, admission: Admission::Always, fill: FillMode::Deferred };
    HotCache::with_layout(&engine, layout).unwrap()
}

#[test]
fn a_full_filler_queue_drops_deferred_fills_and_close_ends_the_filler_with_fills_queued() {
    let lease_end = || Some(std::time::Instant::now() + std::time::Duration::from_secs(10));
    let total = MAX_FILL_QUEUE + 8;
    let c = Arc::new(deferred_cache(total as u32));
    // A read of the client's own in flight: the filler takes the first fill and waits, the
    // queue fills up; deferring must neither wait nor lose count.
    let fg = c.foreground();
    for i in 0..total {
        let l = list(1, B);
        let Miss::Defer(fill) = c.begin(&format!("k{i}"), &l, &l.replicas[0]) else {
            panic!("k{i}: expected to defer")
        };
        c.defer(fill, lease_end());
    }
    let m = c.metrics();
    assert!(m.dropped_fills >= 7, "{m}");
    assert_eq!(m.deferred_fills + m.dropped_fills, total as u64, "{m}");
    assert_eq!(m.blocks_in_use, m.deferred_fills, "dropped fills gave their blocks back: {m}");
    // close returns although the read is still in flight, and the filler's thread is joined.
    // (On a thread of its own: a close that hung fails the test instead of hanging it.)
    let (tx, rx) = std::sync::mpsc::channel();
    let closing = c.clone();
    std::thread::spawn(move || {
        closing.close();
        let _ = tx.send(());
    });
    rx.recv_timeout(std::time::Duration::from_secs(30)).expect("close returned");
    assert!(c.filler.lock().is_none(), "the filler was joined");
    drop(fg);
    c.flush();
    let m = c.metrics();
    assert_eq!((m.dropped_fills, m.fills, m.blocks_in_use), (total as u64, 0, 0), "{m}");
    // After close a miss's fill is dropped at once.
    let l = list(2, B);
    let Miss::Defer(fill) = c.begin("late", &l, &l.replicas[0]) else { panic!("expected to defer") };
    c.defer(fill, lease_end());
    assert_eq!((c.metrics().dropped_fills, c.metrics().blocks_in_use), (total as u64 + 1, 0));
}

#[test]
fn auto_defers_until_a_read_is_measured_then_follows_the_link() {
    let engine =
        TransferEngine::new(EngineConfig { local_hostname: Some("127.0.0.1".into()), ..EngineConfig::default() })
            .unwrap();
    let size = 512 << 10;
    let layout = Layout { blocks: 4, block_size: size, admission: Admission::Always, fill: FillMode::Auto };
    let c = HotCache::with_layout(&engine, layout).unwrap();
    let begin = |key: &str| {
        let l = list(1, size);
        c.begin(key, &l, &l.replicas[0])
    };
    assert_eq!(c.copy_share(), None);
    assert!(matches!(begin("first"), Miss::Defer(_)), "no read seen yet: deferred");
    // Reads that take a hundred times what a copy of their bytes takes (a slow link): inline.
    let rate = c.inner.choice.as_ref().expect("a cache of 2 MiB measures its copies").copy_rate();
    let copy = std::time::Duration::from_secs_f64(size as f64 / rate);
    for _ in 0..4 {
        c.note_read(size, copy * 100);
    }
    assert!(matches!(begin("slow"), Miss::Lead(_)));
    // Reads as fast as the copy (a fast link, RDMA): the copy would double the get, so the
    // filler does it later.
    for _ in 0..32 {
        c.note_read(size, copy);
    }
    assert!(c.copy_share().unwrap() > fill_choice::INLINE_UP_TO);
    assert!(matches!(begin("fast"), Miss::Defer(_)));
    c.close();
}

#[test]
fn a_deferred_fill_whose_lease_ends_while_the_client_keeps_reading_gives_its_blocks_back() {
    let c = deferred_cache(4);
    // The client's reads never leave the link idle (one held in flight throughout).
    let fg = c.foreground();
    let l = list(1, B);
    let Miss::Defer(fill) = c.begin("k", &l, &l.replicas[0]) else { panic!("expected to defer") };
    c.defer(fill, Some(std::time::Instant::now() + std::time::Duration::from_millis(50)));
    assert_eq!(c.metrics().blocks_in_use, 1);
    // The filler gives up at the lease's end instead of waiting for idleness forever.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while c.metrics().dropped_fills == 0 {
        assert!(std::time::Instant::now() < deadline, "the fill still holds its block: {}", c.metrics());
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    c.flush();
    let m = c.metrics();
    assert_eq!((m.dropped_fills, m.fills, m.blocks_in_use), (1, 0, 0), "{m}");
    drop(fg);
    c.close();
}

#[test]
fn a_fills_chunks_cover_the_object_in_order_within_blocks() {
    let c = cache(4, Admission::Always);
    let size = 2 * B + 100;
    let l = list(1, size);
    let Miss::Lead(fill) = c.begin("k", &l, &l.replicas[0]) else { panic!("expected to lead") };
    let chunks = fill.chunks(1000);
    let mut next = 0;
    for &(off, addr, n) in &chunks {
        assert_eq!(off, next, "in order, no gap: {chunks:?}");
        assert!(n > 0 && n <= 1000);
        // Within one block: the chunk starts and ends in the same block of the region.
        assert_eq!(off / B, (off + n - 1) / B, "{chunks:?}");
        assert_eq!((addr - c.inner.region.mem.addr()) % B, off % B);
        next += n;
    }
    assert_eq!(next, size);
    assert_eq!(fill.chunks(u64::MAX).len(), 3, "one per block");
}
