//! Unit tests of the master's rules, against the state machine directly.

use super::*;
use crate::proto::PutOptions;

fn master_with(config: MasterConfig) -> Arc<Master> {
    Master::new(config).unwrap()
}

fn master() -> Arc<Master> {
    master_with(MasterConfig::default())
}

fn mount(m: &Master, client: &str, name: &str, size: u64) -> u64 {
    m.mount_segment(
        client,
        &SegmentInfo { name: name.into(), base: 0x10_0000_0000, size, tier: Tier::Dram as i32 },
        "h",
    )
    .unwrap()
}

fn put(m: &Master, key: &str, size: u64, replicas: u32) -> Result<Vec<ReplicaDescriptor>> {
    let opts = PutOptions { replica_num: replicas, ..Default::default() };
    let (r, _) = m.put_start("c1", key, size, &opts)?;
    m.put_end("c1", key)?;
    Ok(r)
}

#[test]
fn replicas_land_on_distinct_segments_inside_them() {
    let m = master();
    for i in 0..3 {
        mount(&m, &format!("c{i}"), &format!("s{i}"), 1 << 20);
    }
    let r = put(&m, "k", 1000, 3).unwrap();
    let mut names: Vec<_> = r.iter().map(|x| x.segment_name.clone()).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), 3);
    for x in &r {
        assert!(x.address >= 0x10_0000_0000 && x.address + 1000 <= 0x10_0000_0000 + (1 << 20));
    }
    // Four replicas need four segments.
    assert!(matches!(put(&m, "k4", 1000, 4), Err(StoreError::NoSpace { .. })));
}

#[test]
fn objects_are_not_readable_until_committed_and_keys_are_unique() {
    let m = master();
    mount(&m, "c1", "s1", 1 << 20);
    m.put_start("c1", "k", 10, &PutOptions::default()).unwrap();
    assert!(matches!(m.get_replica_list("k"), Err(StoreError::NotReady(_))));
    assert!(!m.exists("k").unwrap());
    assert!(matches!(m.put_start("c1", "k", 10, &PutOptions::default()), Err(StoreError::AlreadyExists(_))));
    m.put_end("c1", "k").unwrap();
    assert!(m.exists("k").unwrap());
    let list = m.get_replica_list("k").unwrap();
    assert_eq!((list.size, list.replicas.len()), (10, 1));
}

#[test]
fn revoke_frees_the_space() {
    let m = master();
    mount(&m, "c1", "s1", 1 << 20);
    m.put_start("c1", "k", 1 << 20, &PutOptions::default()).unwrap();
    assert_eq!(m.totals().used, 1 << 20);
    m.put_revoke("c1", "k").unwrap();
    assert_eq!(m.totals().used, 0);
    assert!(m.query("k").unwrap().replicas.is_empty());
}

#[test]
fn exists_and_query_never_grant_or_renew_a_lease() {
    let m = master();
    mount(&m, "c1", "s1", 1 << 20);
    put(&m, "k", 100, 1).unwrap();
    for _ in 0..100 {
        assert!(m.exists("k").unwrap());
        assert!(m.query("k").unwrap().exists);
        assert!(m.batch_exists(&["k".into()]).unwrap()[0]);
    }
    assert_eq!(m.query("k").unwrap().lease_remaining_ms, 0);
    m.remove("k", false).expect("no lease: removable");
}

#[test]
fn a_lease_blocks_removal_unless_forced() {
    let m = master();
    mount(&m, "c1", "s1", 1 << 20);
    put(&m, "k", 100, 1).unwrap();
    m.get_replica_list("k").unwrap();
    assert!(m.query("k").unwrap().lease_remaining_ms > 0);
    assert!(matches!(m.remove("k", false), Err(StoreError::Leased(_))));
    assert_eq!(m.remove_by_regex("^k$", false).unwrap().0, (0, 1));
    m.remove("k", true).unwrap();
    assert!(!m.exists("k").unwrap());
}

/// A forced removal takes the key at once, but not the space a reader was told about: until
/// the read lease ends, no put is given it (a reader may still be copying those bytes, and
/// would return a value mixing two objects).
/// A master whose one segment of 64 KiB is filled by object `k`, read (leased) at the
/// returned instant; its range's address, and the lease's length.
fn one_leased_object() -> (Arc<Master>, Instant, u64, Duration) {
    let lease = Duration::from_secs(5);
    let m = master_with(MasterConfig { lease_ttl: lease, ..MasterConfig::default() });
    mount(&m, "c1", "s1", 64 << 10);
    let t0 = Instant::now();
    m.put_start_inner("c1", "k", 64 << 10, &PutOptions::default(), t0).unwrap();
    m.put_end("c1", "k").unwrap();
    let range = m.get_replica_list_inner("k", t0).unwrap().replicas[0].address;
    (m, t0, range, lease)
}

#[test]
fn a_forced_removal_keeps_a_leased_range_from_new_puts_until_the_lease_ends() {
    let (m, t0, range, lease) = one_leased_object();
    let opts = PutOptions::default();

    m.remove_at("k", true, t0 + Duration::from_secs(1)).unwrap();
    assert!(!m.exists("k").unwrap(), "the key goes at once");
    assert_eq!(m.quarantined_bytes(), 64 << 10, "its range waits for the lease");
    let during = m.put_start_inner("c1", "k", 64 << 10, &opts, t0 + Duration::from_secs(2));
    assert!(matches!(during, Err(StoreError::NoSpace { .. })), "no put gets the range while read: {during:?}");

    let (placed, _) = m.put_start_inner("c1", "k", 64 << 10, &opts, t0 + lease).unwrap();
    assert_eq!(placed[0].address, range, "the lease ended: the range is free again");
    assert_eq!(m.quarantined_bytes(), 0);
}

/// Upstream's master ran out of memory under long-context load (long keys, many objects):
/// here the metadata has a limit; puts past it evict the least recently used objects, and
/// are refused with a clear answer when none can go, never growing past it.
#[test]
fn the_metadata_stays_under_its_limit_by_evicting_and_refuses_when_nothing_can_go() {
    let key = |i: usize| format!("{i:06}/{}", "x".repeat(1000));
    let per_object = OBJECT_METADATA_BYTES + key(0).len() as u64;
    let limit = 100 * per_object;
    let m = master_with(MasterConfig { max_metadata_bytes: Some(limit), ..MasterConfig::default() });
    mount(&m, "c1", "s1", 64 << 20);
    for i in 0..1000 {
        put(&m, &key(i), 1024, 1).unwrap_or_else(|e| panic!("put {i} past the limit: {e}"));
        assert!(m.metadata_bytes() <= limit, "put {i}: {} > {limit}", m.metadata_bytes());
    }
    assert!(m.exists(&key(999)).unwrap(), "the newest object is there");
    assert!(!m.exists(&key(0)).unwrap(), "the oldest went");
    assert!(m.metrics().evictions.get() >= 900, "{} evictions", m.metrics().evictions.get());
    // Everything leased: nothing can go, so a new put is refused, with the reason.
    for k in m.keys(usize::MAX) {
        m.get_replica_list(&k).unwrap();
    }
    let refused = put(&m, &key(1000), 1024, 1);
    match refused {
        Err(StoreError::NoSpace { detail, .. }) => assert!(detail.contains("metadata"), "{detail}"),
        other => panic!("expected NoSpace for the metadata, got {other:?}"),
    }
    assert!(m.metadata_bytes() <= limit);
}

/// A range whose object was removed with no lease on it (or after its lease) is free at once.
#[test]
fn a_removal_after_the_lease_frees_the_range_at_once() {
    let (m, t0, range, lease) = one_leased_object();
    m.remove_at("k", true, t0 + lease).unwrap();
    assert_eq!(m.quarantined_bytes(), 0);
    let (placed, _) = m.put_start_inner("c1", "k2", 64 << 10, &PutOptions::default(), t0 + lease).unwrap();
    assert_eq!(placed[0].address, range);
}

#[test]
fn eviction_keeps_puts_succeeding_and_spares_leased_pinned_and_unfinished_objects() {
    let m = master_with(MasterConfig { eviction_high_watermark: 0.9, eviction_ratio: 0.05, ..MasterConfig::default() });
    mount(&m, "c1", "s1", 100 << 10);
    put(&m, "leased", 10 << 10, 1).unwrap();
    m.get_replica_list("leased").unwrap();
    m.put_start("c1", "pinned", 10 << 10, &PutOptions { hard_pin: true, ..Default::default() }).unwrap();
    m.put_end("c1", "pinned").unwrap();
    m.put_start("c1", "soft", 10 << 10, &PutOptions { soft_pin_ttl_ms: 60_000, ..Default::default() }).unwrap();
    m.put_end("c1", "soft").unwrap();
    // A soft pin with no TTL of its own lasts the master's default (30 min).
    m.put_start("c1", "soft-default", 10 << 10, &PutOptions { soft_pin: true, ..Default::default() }).unwrap();
    m.put_end("c1", "soft-default").unwrap();
    m.put_start("c1", "unfinished", 10 << 10, &PutOptions::default()).unwrap();
    // 60 more puts of 10 KiB into the remaining 50 KiB: eviction must keep making room.
    for i in 0..60 {
        put(&m, &format!("k{i}"), 10 << 10, 1).unwrap_or_else(|e| panic!("put {i}: {e}"));
    }
    for key in ["leased", "pinned", "soft", "soft-default", "unfinished"] {
        assert!(!m.query(key).unwrap().replicas.is_empty(), "{key} survived eviction");
    }
    assert!(m.exists("k59").unwrap(), "the newest object is there");
    assert!(!m.exists("k0").unwrap(), "the oldest unleased object was evicted");
    assert!(m.metrics().evictions.get() > 0);
    // Nothing evictable left and no room: NoSpace.
    let m2 = master();
    mount(&m2, "c1", "s1", 20 << 10);
    put(&m2, "a", 20 << 10, 1).unwrap();
    m2.get_replica_list("a").unwrap();
    assert!(matches!(put(&m2, "b", 10 << 10, 1), Err(StoreError::NoSpace { .. })));
}

#[test]
fn eviction_is_least_recently_used_first() {
    let m = master_with(MasterConfig { lease_ttl: Duration::from_millis(1), ..MasterConfig::default() });
    mount(&m, "c1", "s1", 100 << 10);
    for k in ["a", "b", "c", "d"] {
        put(&m, k, 20 << 10, 1).unwrap();
        std::thread::sleep(Duration::from_millis(2));
    }
    m.get_replica_list("a").unwrap(); // a becomes the most recently used
    std::thread::sleep(Duration::from_millis(5)); // its lease ends
    put(&m, "e", 20 << 10, 1).unwrap(); // 100 % > the 90 % watermark: evicts 5 %
    assert!(m.exists("a").unwrap(), "recently read");
    assert!(!m.exists("b").unwrap(), "least recently used goes first");
}

#[test]
fn unfinished_puts_are_reclaimed_after_the_put_timeout() {
    let m = master_with(MasterConfig { put_timeout: Duration::from_millis(20), ..MasterConfig::default() });
    mount(&m, "c1", "s1", 1 << 20);
    // Sweeps at given instants, not the real clock's: a loaded host does not age the put.
    let before = Instant::now();
    m.put_start("c1", "k", 1000, &PutOptions::default()).unwrap();
    let after = Instant::now();
    m.sweep_at(before);
    assert_eq!(m.query("k").unwrap().replicas.len(), 1, "not yet");
    m.sweep_at(before + Duration::from_millis(19));
    assert_eq!(m.query("k").unwrap().replicas.len(), 1, "not yet, just before the timeout");
    m.sweep_at(after + Duration::from_millis(30));
    assert!(m.query("k").unwrap().replicas.is_empty());
    assert_eq!(m.totals().used, 0);
}

#[test]
fn silent_clients_lose_their_segments_and_must_remount() {
    let m = master_with(MasterConfig { client_ttl: Duration::from_millis(50), ..MasterConfig::default() });
    mount(&m, "a", "sa", 1 << 20);
    mount(&m, "b", "sb", 1 << 20);
    let mut on_a = None;
    for i in 0..20 {
        let r = put(&m, &format!("k{i}"), 100, 1).unwrap();
        if r[0].segment_name == "sa" {
            on_a = Some(format!("k{i}"));
        }
    }
    let on_a = on_a.expect("random placement used segment a");
    for _ in 0..4 {
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(m.ping("b"), PingOutcome::Ok);
    }
    m.sweep();
    assert!(!m.exists(&on_a).unwrap(), "replicas on the silent client's segment are dropped");
    assert!(matches!(m.get_replica_list(&on_a), Err(StoreError::NotFound(_))));
    assert_eq!(m.segments().len(), 1);
    assert_eq!(m.ping("a"), PingOutcome::NeedRemount);
    m.remount_segment("a", &SegmentInfo { name: "sa".into(), base: 0x10_0000_0000, size: 1 << 20, tier: 0 }, "h")
        .unwrap();
    assert_eq!(m.ping("a"), PingOutcome::Ok);
    assert_eq!(m.segments().len(), 2);
}

#[test]
fn a_client_that_unmounted_everything_is_forgotten_not_counted_as_dropped() {
    let m = master_with(MasterConfig { client_ttl: Duration::from_millis(20), ..MasterConfig::default() });
    let closed = mount(&m, "closed", "sc", 1 << 20);
    mount(&m, "silent", "ss", 1 << 20);
    m.unmount_segment("closed", closed).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    m.sweep();
    // Only the client that still had a segment is a dropped client (metric and warning).
    assert_eq!(m.metrics.clients_dropped.get(), 1);
    assert!(m.segments().is_empty());
}

#[test]
fn bad_input_is_rejected_with_errors() {
    let m = master();
    mount(&m, "c1", "s1", 1 << 20);
    let huge = "k".repeat(MAX_KEY_LEN + 1);
    assert!(matches!(m.put_start("c1", &huge, 10, &PutOptions::default()), Err(StoreError::InvalidArgument(_))));
    assert!(matches!(m.put_start("c1", "", 10, &PutOptions::default()), Err(StoreError::InvalidArgument(_))));
    assert!(matches!(m.put_start("c1", "k", 0, &PutOptions::default()), Err(StoreError::InvalidArgument(_))));
    assert!(matches!(m.put_start("c1", "k", u64::MAX, &PutOptions::default()), Err(StoreError::InvalidArgument(_))));
    assert!(matches!(
        m.put_start("c1", "k", 10, &PutOptions { replica_num: 1000, ..Default::default() }),
        Err(StoreError::InvalidArgument(_))
    ));
    assert!(matches!(m.put_start("c1", "k", 2 << 20, &PutOptions::default()), Err(StoreError::NoSpace { .. })));
    assert!(matches!(m.unmount_segment("c1", 999), Err(StoreError::SegmentNotFound(_))));
    assert!(
        m.mount_segment("c2", &SegmentInfo { name: "s1".into(), base: 1, size: 10, tier: 0 }, "h").is_err(),
        "name taken"
    );
    assert!(m.mount_segment("c2", &SegmentInfo { name: "s2".into(), base: u64::MAX, size: 10, tier: 0 }, "h").is_err());
    assert!(m.mount_segment("c2", &SegmentInfo { name: "s2".into(), base: 1, size: 0, tier: 0 }, "h").is_err());
    // Segments too small to hold one allocation unit are refused, not mounted half-working.
    for size in [1, 100, 255, 511, 4095] {
        let info = SegmentInfo { name: format!("tiny{size}"), base: 1 << 30, size, tier: 0 };
        assert!(matches!(m.mount_segment("c2", &info, "h"), Err(StoreError::InvalidArgument(_))), "{size} bytes");
    }
    let small = SegmentInfo { name: "small".into(), base: 1 << 30, size: 4096, tier: 0 };
    m.mount_segment("c3", &small, "h").unwrap();
    assert!(m.remove_by_regex("(unclosed", false).is_err());
    assert!(matches!(m.remove("nope", false), Err(StoreError::NotFound(_))));
}

#[test]
fn strategies_place_replicas_as_documented() {
    let m =
        master_with(MasterConfig { allocation_strategy: AllocationStrategy::LocalFirst, ..MasterConfig::default() });
    mount(&m, "a", "sa", 1 << 20);
    mount(&m, "b", "sb", 1 << 20);
    for i in 0..10 {
        let opts = PutOptions { preferred_segment: "sb".into(), ..Default::default() };
        let (r, _) = m.put_start("b", &format!("k{i}"), 1000, &opts).unwrap();
        assert_eq!(r[0].segment_name, "sb");
    }
    let m = master_with(MasterConfig {
        allocation_strategy: AllocationStrategy::FreeRatioFirst,
        ..MasterConfig::default()
    });
    mount(&m, "a", "sa", 1 << 20);
    mount(&m, "b", "sb", 4 << 20);
    for i in 0..10 {
        let ratios: Vec<(String, f64)> =
            m.segments().iter().map(|s| (s.name.clone(), 1.0 - s.used as f64 / s.capacity as f64)).collect();
        let (r, _) = m.put_start("a", &format!("k{i}"), 100 << 10, &PutOptions::default()).unwrap();
        let chosen = ratios.iter().find(|(n, _)| *n == r[0].segment_name).unwrap().1;
        assert!(
            ratios.iter().all(|(_, ratio)| *ratio <= chosen),
            "put {i} went to the emptier segment: {ratios:?} -> {}",
            r[0].segment_name
        );
    }
}

#[test]
fn preferred_segments_are_used_first_whatever_the_strategy_and_full_ones_fall_back() {
    for strategy in [AllocationStrategy::Random, AllocationStrategy::FreeRatioFirst, AllocationStrategy::LocalFirst] {
        let m = master_with(MasterConfig { allocation_strategy: strategy, ..MasterConfig::default() });
        mount(&m, "a", "sa", 1 << 20);
        mount(&m, "b", "sb", 8 << 20);
        mount(&m, "c", "sc", 8 << 20);
        for i in 0..10 {
            // Against local_first's own segment and free_ratio_first's emptier ones.
            let opts = PutOptions {
                replica_num: 2,
                preferred_segment: "sc".into(),
                preferred_segments: vec!["sa".into(), "sb".into()],
                ..Default::default()
            };
            let (r, _) = m.put_start("c", &format!("k{i}"), 1000, &opts).unwrap();
            let names: Vec<&str> = r.iter().map(|x| x.segment_name.as_str()).collect();
            assert_eq!(names, ["sa", "sb"], "{strategy:?}, put {i}");
        }
        // An unknown name and one too full to hold the value: the replicas go elsewhere.
        let opts = PutOptions {
            replica_num: 2,
            preferred_segments: vec!["nowhere".into(), "sa".into()],
            ..Default::default()
        };
        let (r, _) = m.put_start("c", "big", 2 << 20, &opts).unwrap();
        let mut names: Vec<&str> = r.iter().map(|x| x.segment_name.as_str()).collect();
        names.sort();
        assert_eq!(names, ["sb", "sc"], "{strategy:?}");
    }
}

#[test]
fn version_changes_when_a_key_is_put_again() {
    let m = master();
    mount(&m, "c1", "s1", 1 << 20);
    put(&m, "k", 10, 1).unwrap();
    let v1 = m.query("k").unwrap().version;
    m.remove("k", false).unwrap();
    put(&m, "k", 10, 1).unwrap();
    assert_ne!(m.query("k").unwrap().version, v1);
}

use crate::proto::HeldRemoval;

fn disk_entry(key: &str, size: u64, version: u64) -> crate::proto::DiskEntry {
    crate::proto::DiskEntry { key: key.into(), size, version }
}

#[test]
fn a_key_removed_before_its_file_was_announced_does_not_come_back_at_the_writers_restart() {
    let m = master();
    mount(&m, "c1", "s1", 1 << 20);
    m.mount_disk("c1", "d1", "h:1", 1 << 30, "h").unwrap();
    let (_, v) = m.put_start("c1", "k", 10, &PutOptions::default()).unwrap();
    m.put_end("c1", "k").unwrap();
    // The writer renamed its file but was killed before announcing it; meanwhile "k" is removed.
    m.remove("k", false).unwrap();
    // The writer restarts (new client id, same disk) and re-announces the file.
    let disk = m.mount_disk("c2", "d1", "h:2", 1 << 30, "h").unwrap();
    let r = m.update_disk_replicas("c2", disk, &[disk_entry("k", 10, v)], &[], true).unwrap();
    assert!(r[0].is_err(), "the removed key must not come back from the writer's disk");
    assert!(!m.exists("k").unwrap());
    assert_eq!(m.disk_removals_for("c2"), vec![disk_entry("k", 0, v)], "the client is told to delete it");
    // A client without a disk leaves no removal behind.
    mount(&m, "c3", "s3", 1 << 20);
    m.put_start("c3", "m", 10, &PutOptions::default()).unwrap();
    m.put_end("c3", "m").unwrap();
    m.remove("m", false).unwrap();
    assert_eq!(m.disk_removals_for("c2").len(), 1);
}

#[test]
fn removals_for_an_absent_disk_outlive_a_master_restart_through_the_clients_that_keep_them() {
    let m = master();
    mount(&m, "a", "sa", 1 << 20);
    let disk_a = m.mount_disk("a", "da", "h:1", 1 << 30, "h").unwrap();
    m.mount_disk("b", "db", "h:2", 1 << 30, "h").unwrap();
    let (_, v) = m.put_start("a", "k", 10, &PutOptions::default()).unwrap();
    m.put_end("a", "k").unwrap();
    m.update_disk_replicas("a", disk_a, &[disk_entry("k", 10, v)], &[], false).unwrap();
    // A goes away with its disk; "k" is removed meanwhile: the removal waits for disk "da".
    m.unmount_segment("a", disk_a).unwrap();
    m.remove("k", false).unwrap();
    // B (a client with a disk) is handed the pending removals to keep; a client without a
    // disk is not, and B is not sent the same set twice.
    let (generation, held) = m.held_removals_for("b").expect("b keeps removals");
    assert!(generation > 0);
    assert_eq!(held, vec![HeldRemoval { disk: disk_segment_name("da"), key: "k".into(), version: v }]);
    assert!(m.held_removals_for("b").is_none());
    mount(&m, "c", "sc", 1 << 20);
    assert!(m.held_removals_for("c").is_none());

    // The master restarts: a new one knows nothing. B mounts again and hands the set back.
    let m2 = master();
    m2.merge_held_removals(&held);
    m2.mount_disk("b2", "db", "h:2", 1 << 30, "h").unwrap();
    // A comes back with its file of "k": refused, and told to delete it.
    let disk_a2 = m2.mount_disk("a2", "da", "h:3", 1 << 30, "h").unwrap();
    let r = m2.update_disk_replicas("a2", disk_a2, &[disk_entry("k", 10, v)], &[], true).unwrap();
    assert!(r[0].is_err(), "a key removed before the master restarted does not come back");
    assert!(!m2.exists("k").unwrap());
    assert_eq!(m2.disk_removals_for("a2"), vec![disk_entry("k", 0, v)]);

    // The other order: A is back first (the object comes back from its disk), then B returns
    // the removal: the object goes again.
    let m3 = master();
    let disk_a3 = m3.mount_disk("a3", "da", "h:3", 1 << 30, "h").unwrap();
    assert!(m3.update_disk_replicas("a3", disk_a3, &[disk_entry("k", 10, v)], &[], true).unwrap()[0].is_ok());
    m3.merge_held_removals(&held);
    assert!(!m3.exists("k").unwrap());
    assert_eq!(m3.disk_removals_for("a3"), vec![disk_entry("k", 0, v)]);
    // A later put of the key (a newer version) is not touched by the old removal.
    mount(&m3, "a3", "sa3", 1 << 20);
    m3.put_start("a3", "k", 10, &PutOptions::default()).unwrap();
    m3.put_end("a3", "k").unwrap();
    m3.merge_held_removals(&held);
    assert!(m3.exists("k").unwrap());
}

#[test]
fn with_a_state_dir_removals_for_an_absent_disk_outlive_a_master_restart_with_no_client_up() {
    let dir = tempfile::tempdir().unwrap();
    let config = || MasterConfig { state_dir: Some(dir.path().to_path_buf()), ..MasterConfig::default() };
    let m = master_with(config());
    mount(&m, "a", "sa", 1 << 20);
    let disk_a = m.mount_disk("a", "da", "h:1", 1 << 30, "h").unwrap();
    let (_, v) = m.put_start("a", "k", 10, &PutOptions::default()).unwrap();
    m.put_end("a", "k").unwrap();
    m.update_disk_replicas("a", disk_a, &[disk_entry("k", 10, v)], &[], false).unwrap();
    // A, the only client with a disk, goes away; "k" is removed meanwhile; then the master
    // restarts with nobody to hand the removal back.
    m.unmount_segment("a", disk_a).unwrap();
    m.remove("k", false).unwrap();
    m.save_removals_if_changed();
    drop(m);
    let m2 = master_with(config());
    let disk_a2 = m2.mount_disk("a2", "da", "h:3", 1 << 30, "h").unwrap();
    let r = m2.update_disk_replicas("a2", disk_a2, &[disk_entry("k", 10, v)], &[], true).unwrap();
    assert!(r[0].is_err(), "a key removed before the master restarted does not come back");
    assert!(!m2.exists("k").unwrap());
    assert_eq!(m2.disk_removals_for("a2"), vec![disk_entry("k", 0, v)], "A is told to delete its file");
    // Without a state directory the same sequence brings the key back: what the file is for.
    let m3 = master();
    let disk_a3 = m3.mount_disk("a3", "da", "h:3", 1 << 30, "h").unwrap();
    assert!(m3.update_disk_replicas("a3", disk_a3, &[disk_entry("k", 10, v)], &[], true).unwrap()[0].is_ok());
    // Once A acknowledges the deletion, the saved set is empty: the next master has nothing.
    m2.update_disk_replicas("a2", disk_a2, &[], &[disk_entry("k", 0, v)], false).unwrap();
    assert!(m2.disk_removals_for("a2").is_empty());
    m2.save_removals_if_changed();
    drop(m2);
    let m4 = master_with(config());
    let disk_a4 = m4.mount_disk("a4", "da", "h:3", 1 << 30, "h").unwrap();
    assert!(m4.disk_removals_for("a4").is_empty());
    let _ = disk_a4;
    drop(m4);
    // A damaged file stops the start with an error that names it, rather than losing removals.
    std::fs::write(dir.path().join(removals_file::FILE_NAME), b"{not json").unwrap();
    let e = Master::new(config()).err().expect("a damaged state file is an error");
    assert!(e.to_string().contains(removals_file::FILE_NAME), "{e}");
}

#[test]
fn metrics_show_the_disk_tier() {
    let m = master();
    mount(&m, "c1", "s1", 1 << 20);
    let disk = m.mount_disk("c1", "d1", "h:1", 1 << 30, "h").unwrap();
    let (_, v) = m.put_start("c1", "k", 1000, &PutOptions::default()).unwrap();
    m.put_end("c1", "k").unwrap();
    m.update_disk_replicas("c1", disk, &[disk_entry("k", 1000, v)], &[], false).unwrap();
    // A file whose object the master lost comes back as a disk-only object.
    m.update_disk_replicas("c1", disk, &[disk_entry("old", 500, 7)], &[], true).unwrap();
    let t = m.disk_totals();
    assert_eq!(
        t,
        DiskTotals { segments: 1, capacity: 1 << 30, used: 1500, replicas: 2, disk_only_keys: 1, removals_pending: 0 }
    );
    m.remove("k", false).unwrap();
    // The client's own counters arrive with its pings.
    let counters = crate::proto::DiskCounters { written: 5, queue_full: 3, ..Default::default() };
    m.record_disk_counters("c1", &counters);
    m.record_disk_counters("nobody", &counters);
    let text = m.render_metrics();
    for line in [
        "crescent_master_disk_client{counter=\"queue_full\",disk=\"ssd:d1\"} 3",
        "crescent_master_disk_client{counter=\"written\",disk=\"ssd:d1\"} 5",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} missing from:\n{text}");
    }
    let text = m.render_metrics();
    for line in [
        "crescent_master_disk_segments 1",
        "crescent_master_disk_capacity_bytes 1073741824",
        "crescent_master_disk_used_bytes 500",
        "crescent_master_disk_replicas 1",
        "crescent_master_disk_only_keys 1",
        "crescent_master_disk_removals_pending 1",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} missing from:\n{text}");
    }
    m.unmount_segment("c1", disk).unwrap();
    assert!(!m.render_metrics().contains("crescent_master_disk_client{"), "an unmounted disk's counters go");
}

/// The nice values of this process's threads named [`EVICTOR_THREAD`] (Linux's `/proc`).
fn evictor_nice_values() -> Vec<i32> {
    let mut out = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim_end() != EVICTOR_THREAD {
            continue;
        }
        // After "pid (comm) ": state is field 3, nice field 19.
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        let fields: Vec<&str> = stat.rsplit_once(')').map_or("", |(_, rest)| rest).split_whitespace().collect();
        if let Some(nice) = fields.get(16).and_then(|n| n.parse().ok()) {
            out.push(nice);
        }
    }
    out
}

#[test]
fn the_evictor_thread_runs_at_its_nice_value_and_still_evicts() {
    // A nice value no other test's master uses (7 above this process's): its evictor is this one's.
    let nice = (rustix::process::getpriority_process(None).unwrap() + 7).min(19);
    let config = MasterConfig { evictor_nice: 7, eviction_high_watermark: 0.5, ..MasterConfig::default() };
    let m = master_with(config);
    mount(&m, "c1", "s1", 64 * 4096);
    m.start_sweeper();
    for i in 0..40 {
        put(&m, &format!("k{i}"), 4096, 1).unwrap();
    }
    // (A guard against a hang, not a measure: the thread starts and evicts in milliseconds.)
    let deadline = Instant::now() + Duration::from_secs(60);
    // Its rounds bring the use back to the watermark.
    while !(evictor_nice_values().contains(&nice) && m.totals().used <= 32 * 4096) {
        assert!(
            Instant::now() < deadline,
            "evictor threads at nice {:?}, {} of {} bytes used",
            evictor_nice_values(),
            m.totals().used,
            64 * 4096
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(m.metrics().evictions.get() >= 8);
}

#[test]
fn a_round_pauses_after_each_step_to_keep_its_duty_until_it_is_urgent() {
    let step = Duration::from_millis(2);
    // A quarter of a core: each step is followed by three times its length.
    assert_eq!(pause_after_step(step, 0.25, false), Duration::from_millis(6));
    assert_eq!(pause_after_step(step, 1.0, false), Duration::ZERO, "duty 1: no pauses");
    assert_eq!(pause_after_step(step, 0.25, true), Duration::ZERO, "an urgent round runs at full speed");

    // Urgent past halfway from the high watermark (0.5) to full: 48 of 64 pages. Pinned
    // objects, so the rounds their puts start free nothing and the use stays where it is put.
    let m = master_with(MasterConfig { eviction_high_watermark: 0.5, ..MasterConfig::default() });
    mount(&m, "c1", "s1", 64 * 4096);
    let pinned = PutOptions { hard_pin: true, ..Default::default() };
    for i in 0..48 {
        m.put_start("c1", &format!("k{i}"), 4096, &pinned).unwrap();
        m.put_end("c1", &format!("k{i}")).unwrap();
    }
    assert_eq!(m.totals().used, 48 * 4096);
    assert!(!m.eviction_urgent(), "at 0.75 of capacity: not yet past halfway");
    m.put_start("c1", "k48", 4096, &pinned).unwrap();
    assert!(m.eviction_urgent(), "past halfway from the watermark to full");

    // A put that found no room makes it urgent whatever the use.
    let m = master_with(MasterConfig { eviction_high_watermark: 0.5, ..MasterConfig::default() });
    mount(&m, "c1", "s1", 64 * 4096);
    put(&m, "a", 4096, 1).unwrap();
    assert!(!m.eviction_urgent());
    m.state.lock().core.pressure = true;
    assert!(m.eviction_urgent());
    assert!(MasterConfig { evictor_duty: 0.0, ..MasterConfig::default() }.validate().is_err());
    assert!(MasterConfig { evictor_duty: 1.5, ..MasterConfig::default() }.validate().is_err());
}

#[test]
fn an_unmount_says_how_long_calls_granted_before_may_still_use_the_segment() {
    let m = master_with(MasterConfig { lease_ttl: Duration::from_secs(30), ..MasterConfig::default() });
    let busy = |id: u64| m.unmount_segment_leased("c1", id).unwrap();
    // Nothing read, nothing being written: the memory is free at once.
    let idle = mount(&m, "c1", "idle", 1 << 20);
    put(&m, "idle-k", 1000, 1).unwrap();
    assert_eq!(busy(idle), Duration::ZERO);
    // A read lease granted before the unmount: kept until it ends.
    let read = mount(&m, "c1", "read", 1 << 20);
    put(&m, "read-k", 1000, 1).unwrap();
    m.get_replica_list("read-k").unwrap();
    assert!(busy(read) > Duration::from_secs(20));
    assert!(!m.exists("read-k").unwrap(), "its only replica went with the segment");
    // A put still writing there: kept for its put timeout.
    let write = mount(&m, "c1", "write", 1 << 20);
    m.put_start("c1", "write-k", 1000, &PutOptions::default()).unwrap();
    assert!(busy(write) > m.config.put_timeout / 2);
}
