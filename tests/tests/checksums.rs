//! End-to-end checksums (issue 48 §2): with `verify_checksums` on, a value whose bytes were
//! changed in the holder's memory after the put fails a verifying reader's get, get_into,
//! batch_get_into and get_batch with `ChecksumMismatch` (counted), while a reader with the
//! setting off returns the changed bytes as before; a hot-cache fill of such bytes is never
//! entered; a value put without a checksum (as an older client puts it) is read unverified.
//! A put started without one waits at its commit for its holder, counted by the master.
//! In one process against an in-process master on loopback: the holder's segment is memory
//! of this process, which the test changes behind the store's back.

use std::sync::Arc;

use crescent_store::client::hot_cache::{FillMode, HotCacheSettings};
use crescent_store::master::server::MasterHandle;
use crescent_store::{ClientConfig, MasterConfig, StoreApi, StoreClient, StoreError};

const MIB: u64 = 1 << 20;

fn client(m: &MasterHandle, segment: u64, verify: bool, hot: HotCacheSettings) -> Arc<StoreClient> {
    StoreClient::connect(ClientConfig {
        global_segment_size: segment,
        local_buffer_size: 4 * MIB,
        verify_checksums: verify,
        hot_cache: hot,
        ..crescent_tests::store::loopback_client_config(m)
    })
    .expect("client")
}

/// Flips the bits of one byte of `key`'s replica, which lies in `holder`'s segment (memory of
/// this process), behind the store's back.
fn corrupt(holder: &StoreClient, key: &str, at: u64) {
    let q = holder.query(key).expect("query");
    let r = q.replicas.iter().find(|r| r.segment_name == holder.segment_name()).expect("a replica in the holder");
    assert!(at < q.size);
    // SAFETY: the replica lies in the holder's registered segment, mapped in this process for
    // the client's life; no transfer touches it while the test runs between the calls.
    unsafe {
        let p = (r.address + at) as *mut u8;
        p.write_volatile(!p.read_volatile());
    }
}

fn is_mismatch(e: &StoreError, key: &str) -> bool {
    matches!(e, StoreError::ChecksumMismatch { key: k, expected, got } if k == key && expected != got)
}

#[test]
fn a_value_changed_in_the_holders_memory_fails_every_verifying_get_and_only_those() {
    let m = crescent_tests::store::loopback_master(MasterConfig::default());
    let holder = client(&m, 32 * MIB, true, HotCacheSettings::default());
    let verifying = client(&m, 0, true, HotCacheSettings::default());
    let plain = client(&m, 0, false, HotCacheSettings::default());
    let len = MIB as usize + 5;
    let value = crescent_tests::store::pattern_bytes(len, 48);
    let keys: Vec<String> = vec!["ck/0".into(), "ck/1".into()];
    holder.put(&keys[0], &value).expect("put");
    holder.put_batch(&keys[1..], &[&value]).expect("batch put").remove(0).expect("batch put of ck/1");
    let mut buf = vec![0u8; len];
    verifying.register_buffer(buf.as_mut_ptr() as u64, len as u64).expect("register");

    // Untouched: every get verifies and returns the value.
    for key in &keys {
        assert!(verifying.get(key).expect("get") == value);
        assert_eq!(verifying.get_into(key, buf.as_mut_ptr() as u64, len as u64).expect("get_into"), len as u64);
        assert!(buf == value);
    }
    assert_eq!(verifying.checksum_counts().verified, 4);
    assert_eq!(verifying.checksum_counts().mismatches, 0);

    for key in &keys {
        corrupt(&holder, key, 4097);
    }
    // A verifying reader: every get path fails with the typed error, counted.
    let e = verifying.get(&keys[0]).unwrap_err();
    assert!(is_mismatch(&e, &keys[0]), "get: {e:?}");
    assert_eq!(e.code(), crescent_store::proto::Code::ChecksumMismatch);
    assert_eq!(e.fault(), crescent_store::error::Fault::Peer);
    let e = verifying.get_into(&keys[1], buf.as_mut_ptr() as u64, len as u64).unwrap_err();
    assert!(is_mismatch(&e, &keys[1]), "get_into: {e:?}");
    let got = verifying.batch_get_into(&keys[..1], &[buf.as_mut_ptr() as u64], &[len as u64]).expect("batch_get_into");
    assert!(got[0].as_ref().is_err_and(|e| is_mismatch(e, &keys[0])), "batch_get_into: {got:?}");
    let got = verifying.get_batch(&keys).expect("get_batch");
    for (key, r) in keys.iter().zip(&got) {
        assert!(r.as_ref().is_err_and(|e| is_mismatch(e, key)), "get_batch of {key}: {:?}", r.as_ref().err());
    }
    assert_eq!(verifying.checksum_counts().mismatches, 5);
    assert!(
        verifying.render_metrics().contains("crescent_client_checksum_mismatches_total 5"),
        "{}",
        verifying.render_metrics()
    );
    // The holder reads its own replica (a memcpy) and checks it too.
    assert!(is_mismatch(&holder.get(&keys[0]).unwrap_err(), &keys[0]));

    // A reader with checksums off returns the changed bytes, as without the feature.
    let changed = plain.get(&keys[0]).expect("a plain get");
    assert_eq!(changed.len(), len);
    assert_eq!(changed.iter().zip(&value).filter(|(a, b)| a != b).count(), 1);
    assert_eq!(plain.checksum_counts(), Default::default(), "nothing verified or counted");

    // A range is not verified (nothing to compare it with).
    let range = crescent_store::client::Extent { offset: 0, addr: buf.as_mut_ptr() as u64, len: 4096 };
    assert_eq!(verifying.get_into_ranges(&keys[0], &[range]).expect("a ranged get"), 4096);

    // Put back: verified again.
    corrupt(&holder, &keys[0], 4097);
    assert!(verifying.get(&keys[0]).expect("get after the repair") == value);
}

#[test]
fn a_hot_cache_fill_of_changed_bytes_is_never_entered() {
    let m = crescent_tests::store::loopback_master(MasterConfig::default());
    let holder = client(&m, 32 * MIB, true, HotCacheSettings::default());
    for fill in [FillMode::Inline, FillMode::Deferred] {
        let hot = HotCacheSettings { fill, ..HotCacheSettings::with_sizes(8 * MIB, Some(MIB)) };
        let reader = client(&m, 0, true, hot);
        let key = format!("hot/{fill:?}");
        let value = crescent_tests::store::pattern_bytes(2 * MIB as usize, 7);
        holder.put(&key, &value).expect("put");
        corrupt(&holder, &key, 10);
        for _ in 0..2 {
            assert!(is_mismatch(&reader.get(&key).unwrap_err(), &key), "{fill:?}");
        }
        let cache = reader.hot_cache().expect("a cache");
        cache.flush();
        assert_eq!(cache.metrics().entries, 0, "{fill:?}: changed bytes entered the cache");
        assert!(reader.checksum_counts().mismatches >= 2);
        // Put back: the get verifies, fills, and the next one hits the verified entry.
        corrupt(&holder, &key, 10);
        assert!(reader.get(&key).expect("get") == value);
        cache.flush();
        if fill == FillMode::Deferred {
            // The filler reads (and checks) in the background; wait for it to enter.
            for _ in 0..200 {
                if cache.metrics().entries == 1 {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
        assert_eq!(cache.metrics().entries, 1, "{fill:?}");
        assert!(reader.get(&key).expect("a hit") == value);
        assert!(cache.metrics().hits >= 1);
    }
}

#[test]
fn a_value_put_without_a_checksum_is_read_unverified() {
    // A writer with checksums off sends PutEnd without the field: on the wire, what a client
    // older than the field sends.
    let m = crescent_tests::store::loopback_master(MasterConfig::default());
    let old_writer = client(&m, 16 * MIB, false, HotCacheSettings::default());
    let verifying = client(&m, 0, true, HotCacheSettings::default());
    let value = crescent_tests::store::pattern_bytes(100_000, 3);
    old_writer.put("old/0", &value).expect("put");
    assert!(verifying.get("old/0").expect("get") == value);
    let c = verifying.checksum_counts();
    assert_eq!((c.verified, c.mismatches, c.unchecked), (0, 0, 1));
    // And changed bytes go unnoticed there: the checksum is the writer's to take.
    corrupt(&old_writer, "old/0", 0);
    assert!(verifying.get("old/0").expect("get") != value);
}

#[test]
fn a_put_started_without_a_checksum_waits_for_its_holder_at_the_commit_and_the_master_counts_it() {
    // Above 2 MiB a put is started without a checksum: its holder hears of it only at the
    // commit, which answers once the holder acknowledged. The master counts such waits (the
    // holders' share of a put's latency, for the operator).
    let m = crescent_tests::store::loopback_master(MasterConfig::default());
    let holder = client(&m, 16 * MIB, false, HotCacheSettings::default());
    let writer = client(&m, 0, false, HotCacheSettings::default());
    let waits = || m.master.metrics().commit_owner_waits.get();
    let before = waits();
    let value = crescent_tests::store::pattern_bytes(3 * MIB as usize, 5);
    writer.put("big/0", &value).expect("put");
    assert_eq!(waits(), before + 1, "the commit of a put its holder had not heard of waited");
    assert!(m.master.metrics().commit_owner_wait_seconds.get() > 0.0);
    assert!(holder.get("big/0").expect("get") == value);
}
