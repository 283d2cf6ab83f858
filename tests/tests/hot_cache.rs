//! The client's local hot cache against an in-process master on loopback: clients in one
//! process are separate segments (separate engines), so another client's replica is remote.
//! Puts land on the putter's own segment (local-first placement), so each test knows where
//! every object lives.

use std::sync::Arc;

use crescent_engine::TransportKind;
use crescent_store::client::hot_cache::{FillMode, HotCacheMetrics, HotCacheSettings};
use crescent_store::client::Extent;
use crescent_store::master::server::MasterHandle;
use crescent_store::{pattern, AllocationStrategy, ClientConfig, MasterConfig, StoreApi, StoreClient};

const MIB: u64 = 1 << 20;

fn master() -> MasterHandle {
    crescent_tests::store::loopback_master(MasterConfig {
        allocation_strategy: AllocationStrategy::LocalFirst,
        ..MasterConfig::default()
    })
}

fn client(m: &MasterHandle, segment: u64, hot: HotCacheSettings) -> Arc<StoreClient> {
    client_over(m, segment, hot, None)
}

/// A client on loopback; `protocol` forces a transport (default: chosen per peer).
fn client_over(
    m: &MasterHandle,
    segment: u64,
    hot: HotCacheSettings,
    protocol: Option<TransportKind>,
) -> Arc<StoreClient> {
    StoreClient::connect(ClientConfig {
        global_segment_size: segment,
        local_buffer_size: 4 * MIB,
        hot_cache: hot,
        protocol,
        ..crescent_tests::store::loopback_client_config(m)
    })
    .unwrap()
}

/// A reader whose cache has `blocks` blocks of 1 MiB, filled inline (these tests count
/// fills right after the gets; the default, auto, may defer them on loopback).
fn reader(m: &MasterHandle, blocks: u64) -> Arc<StoreClient> {
    client(m, 4 * MIB, inline(blocks * MIB, MIB))
}

/// Settings of a cache of `bytes` in blocks of `block` bytes whose misses fill inline.
fn inline(bytes: u64, block: u64) -> HotCacheSettings {
    HotCacheSettings { fill: FillMode::Inline, ..HotCacheSettings::with_sizes(bytes, Some(block)) }
}

/// Settings of a cache of `blocks` blocks of 1 MiB whose misses are filled by the filler.
fn deferred(blocks: u64) -> HotCacheSettings {
    HotCacheSettings { fill: FillMode::Deferred, ..HotCacheSettings::with_sizes(blocks * MIB, Some(MIB)) }
}

fn data(len: u64, seed: u64) -> Vec<u8> {
    crescent_tests::store::pattern_bytes(len as usize, seed)
}

fn ok(v: &[u8], len: u64, seed: u64) -> bool {
    v.len() as u64 == len && pattern::first_mismatch(v, seed, 0).is_none()
}

/// Waits until the cache's worker has entered every fill handed to it so far: a get that
/// missed returns before its fill is in the index, and a get right after it would join the
/// fill's flight (a miss) instead of hitting, or an invalidation would come before the entry.
fn flush(c: &StoreClient) {
    c.hot_cache().unwrap().flush();
}

fn metrics(c: &StoreClient) -> HotCacheMetrics {
    flush(c);
    c.hot_cache_metrics().unwrap()
}

#[test]
fn a_key_removed_and_put_again_elsewhere_is_read_anew_not_from_the_cache() {
    let m = master();
    let a = client(&m, 64 * MIB, HotCacheSettings::default());
    let c = client(&m, 64 * MIB, HotCacheSettings::default());
    let b = reader(&m, 8);

    a.put("k", &data(3 * MIB, 1)).unwrap();
    assert!(ok(&b.get("k").unwrap(), 3 * MIB, 1)); // miss: lands in the cache
    assert_eq!(metrics(&b).fills, 1);
    assert!(ok(&b.get("k").unwrap(), 3 * MIB, 1)); // hit
    let m1 = metrics(&b);
    assert_eq!((m1.hits, m1.misses, m1.bytes_served), (1, 1, 3 * MIB));

    // Another client removes it (B's read lease: forced) and a third puts new bytes, on its
    // own segment: B must read those.
    a.remove_with("k", true).unwrap();
    assert!(b.get("k").is_err(), "removed: not served from the cache");
    c.put("k", &data(2 * MIB, 2)).unwrap();
    assert!(ok(&b.get("k").unwrap(), 2 * MIB, 2), "new bytes from the new holder");
    flush(&b);
    assert!(ok(&b.get("k").unwrap(), 2 * MIB, 2), "and then from the cache");
    // Same size, same holder, likely the very same address: the version still tells them apart.
    c.remove_with("k", true).unwrap();
    c.put("k", &data(2 * MIB, 3)).unwrap();
    assert!(ok(&b.get("k").unwrap(), 2 * MIB, 3), "put again in place");
    flush(&b);
    let mut dst = vec![0u8; 2 * MIB as usize];
    b.register_buffer(dst.as_mut_ptr() as u64, dst.len() as u64).unwrap();
    assert_eq!(b.get_into("k", dst.as_mut_ptr() as u64, dst.len() as u64).unwrap(), 2 * MIB);
    assert!(ok(&dst, 2 * MIB, 3), "zero-copy hit of the new object");
    let m2 = metrics(&b);
    assert_eq!(m2.hits, 3, "{m2}");
    assert_eq!(m2.misses, 3, "{m2}");
    b.unregister_buffer(dst.as_mut_ptr() as u64).unwrap();
}

/// A byte get that misses lands the object in pieces of 2 MiB and copies each out as it
/// arrives: an object over several blocks of 3 MiB (so pieces start inside blocks, and the
/// last is short) comes back exact on the miss and again from the cache. Its hits (larger
/// than `HIT_STREAM_FROM`: copied with streaming stores) are exact too into registered
/// memory that starts off a cache line, alone and in a batch.
#[test]
fn an_object_over_several_blocks_larger_than_a_piece_is_read_exactly() {
    let m = master();
    let a = client(&m, 64 * MIB, HotCacheSettings::default());
    let b = client(&m, 4 * MIB, inline(12 * MIB, 3 * MIB));
    let len = 7 * MIB + 5;
    a.put("big", &data(len, 9)).unwrap();
    assert!(ok(&b.get("big").unwrap(), len, 9), "miss");
    assert_eq!(metrics(&b).fills, 1);
    assert!(ok(&b.get("big").unwrap(), len, 9), "hit");
    let got = metrics(&b);
    assert_eq!((got.hits, got.misses, got.bytes_served), (1, 1, len));

    let mut mem = vec![0u8; (len + 64) as usize];
    b.register_buffer(mem.as_mut_ptr() as u64, mem.len() as u64).unwrap();
    let at = mem.as_ptr() as u64 + 3;
    assert_eq!(b.get_into("big", at, len).unwrap(), len);
    assert!(ok(&mem[3..][..len as usize], len, 9), "zero-copy hit");
    mem.fill(0);
    let got = b.batch_get_into(&["big".to_string()], &[at], &[len]).unwrap();
    assert_eq!(*got[0].as_ref().unwrap(), len);
    assert!(ok(&mem[3..][..len as usize], len, 9), "zero-copy hit in a batch");
    assert!(mem[..3].iter().chain(&mem[3 + len as usize..]).all(|&b| b == 0), "nothing written outside");
    let got = metrics(&b);
    assert_eq!((got.hits, got.misses), (3, 1));
    b.unregister_buffer(mem.as_ptr() as u64).unwrap();
}

#[test]
fn only_remote_objects_are_cached() {
    let m = master();
    let a = client(&m, 64 * MIB, HotCacheSettings::default());
    let b = client(&m, 64 * MIB, inline(8 * MIB, MIB));
    b.put("mine", &data(MIB, 1)).unwrap(); // on B's own segment
    a.put("theirs", &data(MIB, 2)).unwrap();
    for _ in 0..3 {
        assert!(ok(&b.get("mine").unwrap(), MIB, 1));
    }
    let mut got = b.get_batch(&["mine".to_string()]).unwrap();
    assert!(ok(&got.remove(0).unwrap(), MIB, 1));
    let local = metrics(&b);
    assert_eq!((local.hits, local.misses, local.fills, local.entries), (0, 0, 0, 0), "{local}");
    assert!(ok(&b.get("theirs").unwrap(), MIB, 2));
    assert_eq!(metrics(&b).fills, 1);
    assert!(ok(&b.get("theirs").unwrap(), MIB, 2));
    assert_eq!(metrics(&b).hits, 1);
}

#[test]
fn batch_gets_mix_hits_misses_and_errors() {
    let m = master();
    let a = client(&m, 64 * MIB, HotCacheSettings::default());
    let b = reader(&m, 16);
    let sizes = [MIB / 2, MIB, 3 * MIB / 2, 2 * MIB + 7];
    let keys: Vec<String> = (0..4).map(|i| format!("b{i}")).collect();
    for (i, k) in keys.iter().enumerate() {
        a.put(k, &data(sizes[i], i as u64 + 10)).unwrap();
    }
    // Warm b0 and b2 (byte gets fill right away).
    assert!(ok(&b.get("b0").unwrap(), sizes[0], 10));
    assert!(ok(&b.get("b2").unwrap(), sizes[2], 12));
    assert_eq!(metrics(&b).entries, 2);

    let mixed: Vec<String> = vec!["b0".into(), "b1".into(), "nope".into(), "b2".into(), "b3".into()];
    let got = b.get_batch(&mixed).unwrap();
    assert!(ok(got[0].as_ref().unwrap(), sizes[0], 10));
    assert!(ok(got[1].as_ref().unwrap(), sizes[1], 11));
    assert!(got[2].is_err());
    assert!(ok(got[3].as_ref().unwrap(), sizes[2], 12));
    assert!(ok(got[4].as_ref().unwrap(), sizes[3], 13));
    let m1 = metrics(&b);
    assert_eq!((m1.hits, m1.misses, m1.entries), (2, 4, 4), "{m1}");

    // Zero copy: b1 and b3 are now hits, b0 and b2 too; a fresh key misses and is filled from
    // the bytes it read.
    a.put("b4", &data(MIB, 14)).unwrap();
    let zkeys: Vec<String> = vec!["b3".into(), "b4".into(), "nope".into(), "b1".into()];
    let slot = 2 * MIB + 4096;
    let mut buf = vec![0u8; 4 * slot as usize];
    b.register_buffer(buf.as_mut_ptr() as u64, buf.len() as u64).unwrap();
    let addrs: Vec<u64> = (0..4).map(|i| buf.as_ptr() as u64 + i * slot).collect();
    let lens = vec![slot; 4];
    let res = b.batch_get_into(&zkeys, &addrs, &lens).unwrap();
    assert_eq!(*res[0].as_ref().unwrap(), sizes[3]);
    assert_eq!(*res[1].as_ref().unwrap(), MIB);
    assert!(res[2].is_err());
    assert_eq!(*res[3].as_ref().unwrap(), sizes[1]);
    let at = |i: usize, len: u64| &buf[(addrs[i] - buf.as_ptr() as u64) as usize..][..len as usize];
    assert!(ok(at(0, sizes[3]), sizes[3], 13));
    assert!(ok(at(1, MIB), MIB, 14));
    assert!(ok(at(3, sizes[1]), sizes[1], 11));
    let m2 = metrics(&b);
    assert_eq!((m2.hits, m2.misses), (m1.hits + 2, m1.misses + 1), "{m2}");
    assert_eq!(m2.fills, m1.fills + 1, "the zero-copy miss filled the cache: {m2}");
    // ... and is a hit now.
    let res = b.batch_get_into(&zkeys[1..2], &addrs[..1], &lens[..1]).unwrap();
    assert_eq!(*res[0].as_ref().unwrap(), MIB);
    assert!(ok(at(0, MIB), MIB, 14));
    assert_eq!(metrics(&b).hits, m2.hits + 1);
    b.unregister_buffer(buf.as_mut_ptr() as u64).unwrap();
}

#[test]
fn the_clients_own_puts_and_removals_invalidate() {
    let m = master();
    let a = client(&m, 64 * MIB, HotCacheSettings::default());
    let b = reader(&m, 8);
    for k in ["x/1", "x/2", "y"] {
        a.put(k, &data(MIB, 5)).unwrap();
        assert!(ok(&b.get(k).unwrap(), MIB, 5));
    }
    assert_eq!(metrics(&b).entries, 3);
    b.remove_with("y", true).unwrap();
    assert_eq!(metrics(&b).entries, 2);
    // remove_by_regex forgets matching keys even when the master keeps them (leased).
    b.remove_by_regex("^x/").unwrap();
    assert_eq!(metrics(&b).entries, 0);
    assert!(ok(&b.get("x/1").unwrap(), MIB, 5));
    flush(&b);
    b.put("x/1", &data(MIB, 6)).unwrap(); // exists: kept (the put succeeds, as Mooncake's), but forgotten all the same
    assert_eq!(metrics(&b).entries, 0);
    assert!(ok(&b.get("x/1").unwrap(), MIB, 5));
    assert!(ok(&b.get("x/2").unwrap(), MIB, 5));
    flush(&b);
    b.remove_all().unwrap();
    assert_eq!(metrics(&b).entries, 0);
}

#[test]
fn unusable_settings_leave_a_working_client_without_a_cache() {
    let m = master();
    let a = client(&m, 16 * MIB, HotCacheSettings::default());
    for settings in [
        HotCacheSettings::default(),
        HotCacheSettings::with_sizes(MIB, Some(2 * MIB)), // smaller than one block
        HotCacheSettings::with_sizes(8 * MIB, Some(0)),
    ] {
        let b = client(&m, 4 * MIB, settings);
        assert!(b.hot_cache().is_none());
        a.put("v", &data(MIB, 1)).unwrap();
        assert!(ok(&b.get("v").unwrap(), MIB, 1));
        a.remove_with("v", true).unwrap();
    }
}

#[test]
fn concurrent_gets_through_a_churning_cache_return_the_right_bytes() {
    let m = master();
    let a = client(&m, 128 * MIB, HotCacheSettings::default());
    let c = client(&m, 128 * MIB, HotCacheSettings::default());
    let b = reader(&m, 6); // 6 MiB of cache for 12 objects of 0.5-2.5 MiB: constant eviction
    let size = |i: u64| MIB / 2 + (i * 211_111) % (2 * MIB);
    let keys: Vec<String> = (0..12).map(|i| format!("s{i}")).collect();
    for (i, k) in keys.iter().enumerate() {
        a.put(k, &data(size(i as u64), i as u64)).unwrap();
    }
    let run = |gen: u64| {
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let (b, keys) = (b.clone(), keys.clone());
                s.spawn(move || {
                    let mut buf = vec![0u8; 3 * MIB as usize];
                    b.register_buffer(buf.as_mut_ptr() as u64, buf.len() as u64).unwrap();
                    for n in 0..60u64 {
                        let i = ((n * 7 + t * 5) % 12) as usize;
                        let (len, seed) = (size(i as u64), i as u64 + gen);
                        match (n + t) % 3 {
                            0 => assert!(ok(&b.get(&keys[i]).unwrap(), len, seed), "get {} gen {gen}", keys[i]),
                            1 => {
                                let got = b.get_into(&keys[i], buf.as_mut_ptr() as u64, buf.len() as u64).unwrap();
                                assert!(ok(&buf[..got as usize], len, seed), "get_into {} gen {gen}", keys[i]);
                            }
                            _ => {
                                let j = (i + 1) % 12;
                                let got = b.get_batch(&[keys[i].clone(), keys[j].clone()]).unwrap();
                                assert!(ok(got[0].as_ref().unwrap(), len, seed));
                                assert!(ok(got[1].as_ref().unwrap(), size(j as u64), j as u64 + gen));
                            }
                        }
                    }
                    b.unregister_buffer(buf.as_mut_ptr() as u64).unwrap();
                });
            }
        })
    };
    run(0);
    let m1 = metrics(&b);
    assert!(m1.hits > 0 && m1.evictions > 0 && m1.fills > 0, "{m1}");
    // Every object replaced by another client (new holder, new bytes) while B keeps its cache.
    for (i, k) in keys.iter().enumerate() {
        a.remove_with(k, true).unwrap();
        c.put(k, &data(size(i as u64), i as u64 + 100)).unwrap();
    }
    run(100);
    let m2 = metrics(&b);
    assert!(m2.hits > m1.hits, "{m2}");
    assert!(m2.blocks_in_use <= 6);
}

/// A client whose transfers go over tcp (whose target checks every access against its
/// registered memory).
fn tcp_client(m: &MasterHandle, segment: u64, hot: HotCacheSettings) -> Arc<StoreClient> {
    client_over(m, segment, hot, Some(TransportKind::Tcp))
}

#[test]
fn an_inline_zero_copy_miss_fills_the_cache_from_the_bytes_it_read() {
    let m = master();
    let a = tcp_client(&m, 16 * MIB, HotCacheSettings::default());
    // Inline mode: the fill is made of the get's own bytes (a deferred fill reads again).
    let b = tcp_client(&m, 4 * MIB, inline(8 * MIB, MIB));
    assert_eq!(b.hot_cache().unwrap().fill_mode(), FillMode::Inline);
    let size = 4 * MIB;
    a.put("z", &data(size, 21)).unwrap();
    // The first object of A's fresh segment sits at the segment's start.
    let segment_base = a.query("z").unwrap().replicas[0].address;
    let mut dst = vec![0u8; size as usize];
    let addr = dst.as_mut_ptr() as u64;
    b.register_buffer(addr, size).unwrap();
    assert_eq!(b.get_into("z", addr, size).unwrap(), size);
    // A stops serving its memory at once (the master still lists the replica): a cache that
    // had to read the object a second time in the background gets nothing now.
    a.engine().unregister(segment_base).unwrap();
    flush(&b); // (after the unregister: a fill that read the object again would get nothing)
    dst.fill(0);
    assert_eq!(b.get_into("z", addr, size).unwrap(), size);
    assert!(ok(&dst, size, 21), "served from the cache, filled from the first get's bytes");
    let mb = metrics(&b);
    assert_eq!((mb.misses, mb.hits, mb.fills), (1, 1, 1), "{mb}");
    b.unregister_buffer(addr).unwrap();
}

#[test]
fn a_key_twice_in_a_batch_is_fetched_once() {
    let m = master();
    let a = client(&m, 16 * MIB, HotCacheSettings::default());
    let b = reader(&m, 8);
    a.put("d", &data(2 * MIB, 31)).unwrap();
    let slot = 2 * MIB;
    let mut buf = vec![0u8; 2 * slot as usize];
    let base = buf.as_mut_ptr() as u64;
    b.register_buffer(base, buf.len() as u64).unwrap();
    let keys = vec!["d".to_string(), "d".to_string()];
    let res = b.batch_get_into(&keys, &[base, base + slot], &[slot, slot]).unwrap();
    assert_eq!(res.iter().map(|r| *r.as_ref().unwrap()).collect::<Vec<_>>(), [slot, slot]);
    assert!(ok(&buf[..slot as usize], slot, 31));
    assert!(ok(&buf[slot as usize..], slot, 31));
    // The second one waited for the first one's fetch (single flight) instead of moving the
    // bytes again.
    let mb = metrics(&b);
    assert_eq!((mb.misses, mb.merged, mb.fills, mb.hits), (2, 1, 1, 0), "{mb}");
    b.unregister_buffer(base).unwrap();
}

/// A master, two clients without a cache that hold values (the first has put `keys`: 2 MiB of
/// `seed`, then 1 MiB of `seed + 1`) and a reader with an 8 MiB cache: `[holder, other, reader]`.
fn two_holders_and_a_reader(keys: [&str; 2], seed: u64) -> (MasterHandle, [Arc<StoreClient>; 3]) {
    let m = master();
    let a = client(&m, 16 * MIB, HotCacheSettings::default());
    let c = client(&m, 16 * MIB, HotCacheSettings::default());
    let b = reader(&m, 8);
    a.put(keys[0], &data(2 * MIB, seed)).unwrap();
    a.put(keys[1], &data(MIB, seed + 1)).unwrap();
    (m, [a, c, b])
}

/// A zero-copy batch get copies the values its cache holds while the master answers, and
/// keeps a copy only where the answer is the object copied: a key put again meanwhile is read
/// anew over the copy, a key removed meanwhile fails, and neither is served stale. A batch
/// whose hits copy less than 1 MiB asks first.
#[test]
fn a_zero_copy_batch_copies_hits_while_the_master_answers_and_never_keeps_a_stale_copy() {
    let (_m, [a, c, b]) = two_holders_and_a_reader(["e1", "e2"], 41);
    let slot = 2 * MIB;
    let mut buf = vec![0u8; 2 * slot as usize];
    let base = buf.as_mut_ptr() as u64;
    b.register_buffer(base, buf.len() as u64).unwrap();
    let keys = vec!["e1".to_string(), "e2".to_string()];
    let get = |b: &StoreClient| b.batch_get_into(&keys, &[base, base + slot], &[slot, slot]).unwrap();

    let sizes = |r: Vec<crescent_store::Result<u64>>| r.into_iter().map(|r| r.ok()).collect::<Vec<_>>();
    assert_eq!(sizes(get(&b)), [Some(2 * MIB), Some(MIB)]); // misses: fill the cache
    flush(&b);
    buf.fill(0);
    assert_eq!(sizes(get(&b)), [Some(2 * MIB), Some(MIB)]);
    assert!(ok(&buf[..slot as usize], 2 * MIB, 41) && ok(&buf[slot as usize..][..MIB as usize], MIB, 42));
    let m1 = metrics(&b);
    assert_eq!((m1.hits, m1.early_copies, m1.early_copies_wasted), (2, 2, 0), "{m1}");
    assert_eq!(m1.bytes_served, 3 * MIB, "each hit's bytes counted once: {m1}");

    // e1 put again by another client (same size, new version): the early copy of the old
    // entry is written over by a read of the new object.
    a.remove_with("e1", true).unwrap();
    c.put("e1", &data(2 * MIB, 43)).unwrap();
    buf.fill(0);
    assert_eq!(sizes(get(&b)), [Some(2 * MIB), Some(MIB)]);
    assert!(ok(&buf[..slot as usize], 2 * MIB, 43), "the new object, not the cached one");
    assert!(ok(&buf[slot as usize..][..MIB as usize], MIB, 42));
    let m2 = metrics(&b);
    assert_eq!((m2.early_copies, m2.early_copies_wasted), (3, 1), "{m2}");

    // e2 removed: its copy is made, then the get fails for it.
    a.remove_with("e2", true).unwrap();
    let r = get(&b);
    assert_eq!(r[0].as_ref().ok(), Some(&(2 * MIB)));
    assert!(r[1].is_err(), "removed: not served from the cache ({:?})", r[1]);
    assert!(ok(&buf[..slot as usize], 2 * MIB, 43));
    let m3 = metrics(&b);
    assert_eq!((m3.early_copies, m3.early_copies_wasted), (4, 2), "{m3}");

    // A batch whose hits copy less than 1 MiB in all asks first and copies after.
    a.put("e3", &data(MIB / 4, 44)).unwrap();
    let small = ["e3".to_string()];
    assert_eq!(sizes(b.batch_get_into(&small, &[base], &[slot]).unwrap()), [Some(MIB / 4)]); // miss
    flush(&b);
    buf.fill(0);
    assert_eq!(sizes(b.batch_get_into(&small, &[base], &[slot]).unwrap()), [Some(MIB / 4)]);
    assert!(ok(&buf[..(MIB / 4) as usize], MIB / 4, 44));
    let m4 = metrics(&b);
    assert_eq!((m4.hits, m4.early_copies, m4.early_copies_wasted), (m3.hits + 1, 4, 2), "{m4}");
    b.unregister_buffer(base).unwrap();
}

/// A single-key get (bytes, zero copy) copies a value its cache holds while the master
/// answers, and keeps the copy only where the answer is the object copied: a key put again
/// meanwhile with another size is read anew into memory of the new size, a key removed
/// meanwhile fails, and neither is served stale. A hit that copies less than 1 MiB (a small
/// range) asks first and copies after, where the early path would cost more than it hides.
#[test]
fn a_single_get_copies_its_hit_while_the_master_answers_and_never_keeps_a_stale_copy() {
    let (_m, [a, c, b]) = two_holders_and_a_reader(["s1", "s2"], 51);
    let mut buf = vec![0u8; 2 * MIB as usize];
    let base = buf.as_mut_ptr() as u64;
    b.register_buffer(base, buf.len() as u64).unwrap();
    let early = |b: &StoreClient| {
        let m = metrics(b);
        (m.hits, m.early_copies, m.early_copies_wasted)
    };

    assert!(ok(&b.get("s1").unwrap(), 2 * MIB, 51)); // miss: fills the cache
    assert_eq!(b.get_into("s2", base, MIB).unwrap(), MIB);
    flush(&b);
    assert!(ok(&b.get("s1").unwrap(), 2 * MIB, 51));
    buf.fill(0);
    assert_eq!(b.get_into("s2", base, 2 * MIB).unwrap(), MIB);
    assert!(ok(&buf[..MIB as usize], MIB, 52));
    buf.fill(0);
    assert_eq!(early(&b), (2, 2, 0), "every hit copied while the master answered");
    let range = [Extent { offset: 1000, addr: base, len: 5000 }];
    assert_eq!(b.get_into_ranges("s2", &range).unwrap(), 5000);
    assert_eq!(&buf[..5000], &data(MIB, 52)[1000..6000]);
    assert_eq!(early(&b), (3, 2, 0), "a hit of 5000 bytes, copied after the answer");
    assert_eq!(metrics(&b).bytes_served, 3 * MIB + 5000, "each hit's bytes counted once");

    // s1 put again by another client with another size: the copy of the old entry is not
    // kept; the get reads the new object into memory of its size.
    a.remove_with("s1", true).unwrap();
    c.put("s1", &data(MIB + 7, 53)).unwrap();
    assert!(ok(&b.get("s1").unwrap(), MIB + 7, 53), "the new object, not the cached one");
    assert_eq!(early(&b), (3, 2, 1), "a copy made, not kept");

    // s2 removed: its copy is made, then the get fails, and the entry is dropped, so the next
    // get of it copies nothing.
    a.remove_with("s2", true).unwrap();
    assert!(b.get_into("s2", base, MIB).is_err(), "removed: not served from the cache");
    assert_eq!(early(&b), (3, 2, 2));
    assert!(b.get("s2").is_err());
    assert_eq!(early(&b), (3, 2, 2), "the gone key's entry was dropped");
    b.unregister_buffer(base).unwrap();
}

/// `GET /metrics` from `addr`: the body.
fn scrape(addr: std::net::SocketAddr) -> String {
    let (status, head, body) = crescent_tests::http(addr, "GET", "/metrics", "", "");
    assert!(status == 200, "{head}\r\n\r\n{body}");
    body
}

#[test]
fn the_hot_cache_metrics_are_served_for_prometheus() {
    let m = master();
    let a = client(&m, 16 * MIB, HotCacheSettings::default());
    let b = StoreClient::connect(ClientConfig {
        global_segment_size: 4 * MIB,
        local_buffer_size: 4 * MIB,
        hot_cache: inline(8 * MIB, MIB),
        metrics_address: Some("127.0.0.1:0".into()),
        ..crescent_tests::store::loopback_client_config(&m)
    })
    .unwrap();
    a.put("p", &data(MIB, 41)).unwrap();
    assert!(ok(&b.get("p").unwrap(), MIB, 41)); // miss, fill
    metrics(&b);
    assert!(ok(&b.get("p").unwrap(), MIB, 41)); // hit
    let body = scrape(b.metrics_addr().expect("the endpoint is up"));
    for line in [
        "crescent_client_hot_cache_enabled 1",
        "crescent_client_hot_cache_hits_total 1",
        "crescent_client_hot_cache_misses_total 1",
        "crescent_client_hot_cache_fills_total 1",
        "crescent_client_hot_cache_dropped_fills_total 0",
        "crescent_client_hot_cache_deferred_fills_total 0",
        "crescent_client_hot_cache_taken_over_total 0",
        "crescent_client_hot_cache_evictions_total 0",
        "crescent_client_hot_cache_served_bytes_total 1048576",
        "crescent_client_hot_cache_entries 1",
        "crescent_client_hot_cache_blocks 8",
    ] {
        assert!(body.lines().any(|l| l == line), "{line:?} missing from:\n{body}");
    }
    // Counters keep counting between scrapes, and the same text is there without HTTP.
    assert!(ok(&b.get("p").unwrap(), MIB, 41));
    assert!(scrape(b.metrics_addr().unwrap()).lines().any(|l| l == "crescent_client_hot_cache_hits_total 2"));
    assert!(b.render_metrics().lines().any(|l| l == "crescent_client_hot_cache_hits_total 2"));
    // A client without the cache exports it as off.
    assert!(a.render_metrics().lines().any(|l| l == "crescent_client_hot_cache_enabled 0"));
}

#[test]
fn gets_into_several_buffers_and_by_ranges_fill_and_hit_the_cache() {
    use crescent_store::client::Piece;
    let m = master();
    let a = client(&m, 64 * MIB, HotCacheSettings::default());
    let b = reader(&m, 8);
    let value = data(3 * MIB + 777, 5);
    a.put("layers", &value).unwrap();
    let buf = vec![0u8; 4 * MIB as usize];
    let at = buf.as_ptr() as u64;
    b.register_buffer(at, buf.len() as u64).unwrap();
    let view = |n: usize| buf[..n].to_vec();
    // A miss into three buffers fills the cache from the buffers, piece by piece.
    let three = [Piece::new(at, MIB / 3), Piece::new(at + MIB / 3, 2 * MIB), Piece::new(at + MIB / 3 + 2 * MIB, MIB)];
    assert_eq!(b.get_into_sg("layers", &three).unwrap(), value.len() as u64);
    assert!(view(value.len()) == value);
    let m1 = metrics(&b);
    assert_eq!((m1.misses, m1.fills, m1.hits), (1, 1, 0), "{m1}");
    // Hits into another split, by ranges, and as bytes: the same bytes.
    b.unregister_buffer(at).unwrap();
    let mut buf = vec![0u8; 4 * MIB as usize];
    let at = buf.as_mut_ptr() as u64;
    b.register_buffer(at, buf.len() as u64).unwrap();
    let two = [Piece::new(at, 5), Piece::new(at + 5, 4 * MIB - 5)];
    assert_eq!(b.get_into_sg("layers", &two).unwrap(), value.len() as u64);
    assert!(buf[..value.len()] == value[..]);
    buf.fill(0);
    let ranges = [Extent { offset: 2 * MIB - 3, addr: at, len: 10 }, Extent { offset: 0, addr: at + 10, len: 4 }];
    assert_eq!(b.get_into_ranges("layers", &ranges).unwrap(), 14);
    assert!(buf[..10] == value[2 * MIB as usize - 3..2 * MIB as usize + 7] && buf[10..14] == value[..4]);
    assert!(b.get("layers").unwrap() == value);
    let m2 = metrics(&b);
    assert_eq!((m2.misses, m2.fills, m2.hits), (1, 1, 3), "{m2}");
    b.unregister_buffer(at).unwrap();
}

/// The cache's counters now, without waiting for the worker or the filler (which may be
/// held back on purpose).
fn now(c: &StoreClient) -> HotCacheMetrics {
    c.hot_cache_metrics().unwrap()
}

/// Polls `cond` on `c`'s counters for up to 20 s (a guard against a hang, not a timing).
fn until(c: &StoreClient, what: &str, cond: impl Fn(&HotCacheMetrics) -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !cond(&now(c)) {
        assert!(std::time::Instant::now() < deadline, "{what}: {}", now(c));
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// Runs `f` on a thread and fails the test if it panicked or has not returned within 60 s (a
/// hang guard, not a timing).
fn within_deadline<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(std::time::Duration::from_secs(60)) {
        Ok(v) => v,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("{what}: hung"),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => panic!("{what}: failed (see its panic above)"),
    }
}

/// Deferred mode: a cold get reads as without the cache; the filler then reads
/// the object again into the cache, and the next get is a hit that moves nothing over the
/// network (the holder has stopped serving its memory by then). Byte gets and batches into
/// registered buffers alike.
#[test]
fn a_deferred_miss_is_filled_in_the_background_and_the_next_get_hits_without_the_network() {
    let m = master();
    let a = tcp_client(&m, 16 * MIB, HotCacheSettings::default());
    let b = tcp_client(&m, 4 * MIB, deferred(8));
    assert_eq!(b.hot_cache().unwrap().fill_mode(), FillMode::Deferred);
    let size = 3 * MIB + 5;
    a.put("one", &data(size, 51)).unwrap();
    a.put("two", &data(MIB, 52)).unwrap();
    let base = a.query("one").unwrap().replicas[0].address;
    assert!(ok(&b.get("one").unwrap(), size, 51), "the cold get's own bytes");
    let mut buf = vec![0u8; MIB as usize];
    let at = buf.as_mut_ptr() as u64;
    b.register_buffer(at, MIB).unwrap();
    let got = b.batch_get_into(&["two".to_string()], &[at], &[MIB]).unwrap();
    assert_eq!(*got[0].as_ref().unwrap(), MIB);
    assert!(ok(&buf, MIB, 52));
    let m1 = metrics(&b); // waits for the filler
    assert_eq!((m1.misses, m1.deferred_fills, m1.fills, m1.dropped_fills, m1.hits), (2, 2, 2, 0, 0), "{m1}");
    // The holder stops serving: only the cache can answer now.
    a.engine().unregister(base).unwrap();
    assert!(ok(&b.get("one").unwrap(), size, 51), "a hit");
    buf.fill(0);
    let got = b.batch_get_into(&["two".to_string()], &[at], &[MIB]).unwrap();
    assert_eq!(*got[0].as_ref().unwrap(), MIB);
    assert!(ok(&buf, MIB, 52), "a hit");
    let m2 = metrics(&b);
    assert_eq!((m2.hits, m2.misses, m2.bytes_served), (2, 2, size + MIB), "{m2}");
    b.unregister_buffer(at).unwrap();
}

/// While a read of the client's own is in flight the filler transfers nothing; a repeat miss
/// of a key whose deferred fill is still queued fills it inline, and one of a key whose fill
/// the filler has begun joins it and is served by it — all while that read is still in
/// flight (the filler stops yielding for a fill a get waits for).
#[test]
fn the_filler_yields_to_the_clients_reads_but_a_repeat_miss_never_waits_for_idleness() {
    let m = master();
    let a = client(&m, 16 * MIB, HotCacheSettings::default());
    let b = client(&m, 4 * MIB, deferred(8));
    a.put("k1", &data(MIB, 61)).unwrap();
    a.put("k2", &data(MIB, 62)).unwrap();
    // A read of B's own in flight throughout (a test's stand-in for one).
    let busy = {
        let b = b.clone();
        let (hold, release) = std::sync::mpsc::channel::<()>();
        let (held, is_held) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            let _fg = b.hot_cache().unwrap().foreground();
            held.send(()).unwrap();
            let _ = release.recv();
        });
        is_held.recv().unwrap();
        (hold, t)
    };
    let b2 = b.clone();
    within_deadline("repeat misses while the client reads", move || {
        let b = b2;
        assert!(ok(&b.get("k1").unwrap(), MIB, 61));
        assert!(ok(&b.get("k2").unwrap(), MIB, 62));
        // The filler has begun k1's fill and waits before its first piece; k2's is queued.
        until(&b, "the filler waits for the client's read", |m| m.filler_waits >= 1);
        let m1 = now(&b);
        assert_eq!((m1.deferred_fills, m1.fills, m1.entries), (2, 0, 0), "nothing transferred yet: {m1}");
        // k2: still queued, taken over and filled inline by this get.
        assert!(ok(&b.get("k2").unwrap(), MIB, 62));
        // k1: begun, joined, and served by the filler's fetch although the read still runs.
        assert!(ok(&b.get("k1").unwrap(), MIB, 61));
        let m2 = now(&b);
        assert_eq!((m2.taken_over, m2.merged, m2.misses, m2.hits), (1, 1, 4, 0), "{m2}");
    });
    drop(busy.0);
    busy.1.join().unwrap();
    let m3 = metrics(&b);
    assert_eq!((m3.fills, m3.entries, m3.dropped_fills), (2, 2, 0), "{m3}");
    assert!(ok(&b.get("k1").unwrap(), MIB, 61) && ok(&b.get("k2").unwrap(), MIB, 62));
    assert_eq!(metrics(&b).hits, 2);
}

/// The client's own remove of a key while its deferred fill waits: the fill is voided (never
/// entered, its blocks back), and the next get reads the key's new bytes.
#[test]
fn an_invalidation_voids_a_waiting_deferred_fill() {
    let m = master();
    let a = client(&m, 16 * MIB, HotCacheSettings::default());
    let b = client(&m, 4 * MIB, deferred(8));
    let size = 2 * MIB;
    a.put("k", &data(size, 71)).unwrap();
    let fg = b.hot_cache().unwrap().foreground(); // the filler waits
    assert!(ok(&b.get("k").unwrap(), size, 71));
    b.remove_with("k", true).unwrap();
    // Same size, same holder: the new bytes likely sit where the old ones were.
    a.put("k", &data(size, 72)).unwrap();
    drop(fg);
    let m1 = metrics(&b);
    assert_eq!((m1.deferred_fills, m1.fills, m1.entries, m1.blocks_in_use), (1, 0, 0, 0), "{m1}");
    assert_eq!(m1.dropped_fills, 1, "{m1}");
    assert!(ok(&b.get("k").unwrap(), size, 72), "the new bytes");
    flush(&b);
    assert!(ok(&b.get("k").unwrap(), size, 72), "and then from the cache");
    let m2 = metrics(&b);
    assert_eq!((m2.hits, m2.fills), (1, 1), "{m2}");
}

/// `close` with deferred fills queued behind a read of the client's own returns (the filler
/// stops; the queued fills go, with their blocks).
#[test]
fn close_stops_the_filler_with_fills_queued() {
    let m = master();
    let a = client(&m, 16 * MIB, HotCacheSettings::default());
    let b = client(&m, 4 * MIB, deferred(8));
    for i in 0..4 {
        a.put(&format!("q{i}"), &data(MIB, 80 + i)).unwrap();
    }
    let fg = b.hot_cache().unwrap().foreground();
    for i in 0..4 {
        assert!(ok(&b.get(&format!("q{i}")).unwrap(), MIB, 80 + i));
    }
    until(&b, "the filler waits", |m| m.filler_waits >= 1);
    let b2 = b.clone();
    within_deadline("close with fills queued", move || b2.close().unwrap());
    drop(fg);
    let m1 = metrics(&b);
    assert_eq!((m1.deferred_fills, m1.dropped_fills, m1.fills, m1.blocks_in_use), (4, 4, 0, 0), "{m1}");
}

/// The default fill mode (auto) measures the client's reads: between two clients of one host
/// (shm, a transfer as fast as memory) a copy of each cold get's bytes would add far more than
/// a tenth to it, so after the first read the misses go to the filler. Every get returns the
/// object's bytes, and every object filled either way is a hit next time.
#[test]
fn the_default_auto_fill_defers_where_the_link_is_as_fast_as_a_copy() {
    let m = master();
    let a = client(&m, 64 * MIB, HotCacheSettings::default());
    let b = client(&m, 4 * MIB, HotCacheSettings::with_sizes(32 * MIB, Some(MIB)));
    assert_eq!(b.hot_cache().unwrap().fill_mode(), FillMode::Auto, "the default");
    let n = 16u64;
    for i in 0..n {
        a.put(&format!("auto{i}"), &data(MIB, 70 + i)).unwrap();
    }
    for i in 0..n {
        assert!(ok(&b.get(&format!("auto{i}")).unwrap(), MIB, 70 + i), "cold get {i}");
    }
    let cold = metrics(&b); // waits for the filler
    let share = b.hot_cache().unwrap().copy_share().expect("the reads were measured");
    assert!(cold.deferred_fills > 0 && share > 0.10, "share {share:.3}: {cold}");
    assert_eq!((cold.misses, cold.fills + cold.dropped_fills), (n, n), "{cold}");
    for i in 0..n {
        assert!(ok(&b.get(&format!("auto{i}")).unwrap(), MIB, 70 + i), "warm get {i}");
    }
    let warm = metrics(&b);
    assert_eq!(warm.hits - cold.hits, cold.fills, "{warm}");
}
