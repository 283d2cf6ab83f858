//! Unit tests of the cache-aware scheduling support: queries, the near-engine tier,
//! replication, the hot-key policy, events and the default placement.

use super::*;
use crate::proto::PutOptions;
use crate::proto::{EventKind, PublishedKey, ReplicaStatus};
use tokio::sync::broadcast::error::TryRecvError;

const BASE: u64 = 0x10_0000_0000;

fn master_with(config: MasterConfig) -> Arc<Master> {
    Master::new(config).unwrap()
}

fn mount_tier(m: &Master, client: &str, name: &str, size: u64, tier: Tier) -> u64 {
    m.mount_segment(
        client,
        &SegmentInfo { name: name.into(), base: BASE, size, tier: tier as i32 },
        &format!("h-{client}"),
    )
    .unwrap()
}

/// Puts from `client` with its own segment preferred (as the client library does).
fn put_from(m: &Master, client: &str, own: &str, key: &str, size: u64, replicas: u32) -> Vec<ReplicaDescriptor> {
    let opts = PutOptions { replica_num: replicas, preferred_segment: own.into(), ..Default::default() };
    let (r, _) = m.put_start(client, key, size, &opts).unwrap();
    m.put_end(client, key).unwrap();
    r
}

fn publish(m: &Master, client: &str, keys: &[&str], tier: Tier, ttl_ms: u64) -> Result<u64> {
    let keys: Vec<PublishedKey> = keys.iter().map(|k| PublishedKey { key: k.to_string(), size: 4096 }).collect();
    m.publish(client, tier as i32, ttl_ms, &keys)
}

fn strings(keys: &[&str]) -> Vec<String> {
    keys.iter().map(|k| k.to_string()).collect()
}

/// (client id, tier, published) of each location of item `i`.
fn places(r: &crate::proto::QueryKeysReply, i: usize) -> Vec<(String, Tier, bool)> {
    let mut v: Vec<_> = r.items[i]
        .locations
        .iter()
        .map(|l| (r.nodes[l.node as usize].client_id.clone(), Tier::try_from(l.tier).unwrap(), l.published))
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

#[test]
fn query_reports_pool_replicas_and_published_copies_with_node_and_tier() {
    let m = master_with(MasterConfig::default());
    mount_tier(&m, "a", "sa", 1 << 20, Tier::Dram);
    mount_tier(&m, "b", "sb", 1 << 20, Tier::Dram);
    mount_tier(&m, "c", "sc", 1 << 20, Tier::Vram);
    put_from(&m, "a", "sa", "on-a", 1000, 1);
    put_from(&m, "b", "sb", "on-b", 2000, 1);
    // b also keeps "on-b" on its disk tier.
    let disk = m.mount_disk("b", "disk-b", "h-b:1", 1 << 30, "h-b").unwrap();
    let version = m.query("on-b").unwrap().version;
    let entry = crate::proto::DiskEntry { key: "on-b".into(), size: 2000, version };
    assert!(m.update_disk_replicas("b", disk, &[entry], &[], false).unwrap()[0].is_ok());
    let three = put_from(&m, "c", "sc", "on-all", 3000, 3);
    assert_eq!(three[0].segment_name, "sc", "the writer's own segment first");
    publish(&m, "a", &["on-b", "only-published"], Tier::Vram, 60_000).unwrap();
    m.put_start("a", "unfinished", 10, &PutOptions::default()).unwrap();

    let keys = strings(&["on-a", "on-b", "on-all", "only-published", "unfinished", "missing"]);
    let r = m.query_keys(&keys).unwrap();
    assert_eq!(r.items.len(), 6);
    assert_eq!((r.items[0].exists, r.items[0].size), (true, 1000));
    assert_eq!(places(&r, 0), vec![("a".into(), Tier::Dram, false)]);
    assert_eq!(
        places(&r, 1),
        vec![("a".into(), Tier::Vram, true), ("b".into(), Tier::Dram, false), ("b".into(), Tier::Ssd, false)]
    );
    assert_eq!(
        places(&r, 2),
        vec![("a".into(), Tier::Dram, false), ("b".into(), Tier::Dram, false), ("c".into(), Tier::Vram, false)]
    );
    // Published only: visible to schedulers, not an object of the store.
    assert!(!r.items[3].exists);
    assert_eq!(places(&r, 3), vec![("a".into(), Tier::Vram, true)]);
    assert!(matches!(m.get_replica_list("only-published"), Err(StoreError::NotFound(_))));
    assert!(!m.exists("only-published").unwrap());
    // Unfinished and missing keys are absent.
    assert!(!r.items[4].exists && r.items[4].locations.is_empty());
    assert!(!r.items[5].exists && r.items[5].locations.is_empty());
    // Nodes carry the segment, its client and host; a publisher is shown as its segment.
    let a = r.nodes.iter().find(|n| n.client_id == "a").unwrap();
    assert_eq!((a.segment.as_str(), a.host.as_str()), ("sa", "h-a"));
    assert_eq!(r.nodes.iter().filter(|n| n.client_id == "a").count(), 1);
}

#[test]
fn queries_grant_no_lease_and_do_not_protect_from_eviction() {
    let m = master_with(MasterConfig { lease_ttl: Duration::from_secs(60), ..MasterConfig::default() });
    mount_tier(&m, "a", "sa", 100 << 10, Tier::Dram);
    put_from(&m, "a", "sa", "probed", 20 << 10, 1);
    put_from(&m, "a", "sa", "read", 20 << 10, 1);
    std::thread::sleep(Duration::from_millis(2));
    put_from(&m, "a", "sa", "other", 20 << 10, 1);
    m.get_replica_list("read").unwrap(); // the control: a get leases it
    let keys = strings(&["probed", "read", "other"]);
    for _ in 0..1000 {
        assert!(m.query_keys(&keys).unwrap().items[0].exists);
        assert_eq!(m.prefix_query(&keys).unwrap().pool_prefix_len, 3);
        m.node_stats();
    }
    assert_eq!(m.query("probed").unwrap().lease_remaining_ms, 0, "queries granted no lease");
    assert!(m.query("read").unwrap().lease_remaining_ms > 0);
    // Fill the segment: eviction takes the least recently used unleased object, which is the
    // probed one however often it was queried.
    put_from(&m, "a", "sa", "fill1", 20 << 10, 1);
    put_from(&m, "a", "sa", "fill2", 20 << 10, 1);
    put_from(&m, "a", "sa", "fill3", 20 << 10, 1);
    assert!(!m.exists("probed").unwrap(), "probing did not change the eviction order");
    assert!(m.exists("read").unwrap(), "the leased object stays");
}

#[test]
fn a_batch_of_ten_thousand_keys_is_answered_in_one_call() {
    let m = master_with(MasterConfig::default());
    mount_tier(&m, "a", "sa", 64 << 20, Tier::Dram);
    mount_tier(&m, "b", "sb", 64 << 20, Tier::Dram);
    let keys: Vec<String> = (0..10_000).map(|i| format!("k{i:05}")).collect();
    for (i, k) in keys.iter().enumerate() {
        if i % 2 == 0 {
            let (own, client) = if i % 4 == 0 { ("sa", "a") } else { ("sb", "b") };
            put_from(&m, client, own, k, 100 + i as u64, 1);
        }
    }
    let r = m.query_keys(&keys).unwrap();
    assert_eq!(r.items.len(), 10_000);
    assert_eq!(r.nodes.len(), 2);
    for (i, item) in r.items.iter().enumerate() {
        assert_eq!(item.exists, i % 2 == 0, "key {i}");
        if i % 2 == 0 {
            assert_eq!(item.size, 100 + i as u64);
            let want = if i % 4 == 0 { "sa" } else { "sb" };
            assert_eq!(r.nodes[item.locations[0].node as usize].segment, want, "key {i}");
        }
    }
    let too_many = vec!["k".to_string(); query::MAX_QUERY_KEYS + 1];
    assert!(matches!(m.query_keys(&too_many), Err(StoreError::InvalidArgument(_))));
    assert!(matches!(m.query_keys(&["".into()]), Err(StoreError::InvalidArgument(_))));
}

#[test]
fn prefix_query_counts_leading_chunks_per_node_with_their_best_tier() {
    let m = master_with(MasterConfig::default());
    mount_tier(&m, "a", "sa", 1 << 20, Tier::Dram);
    mount_tier(&m, "b", "sb", 1 << 20, Tier::Dram);
    mount_tier(&m, "c", "sc", 1 << 20, Tier::Dram);
    let chunks: Vec<String> = (0..10).map(|i| format!("req/chunk{i}")).collect();
    // a: chunks 0..6 in its DRAM segment; b: 0..3 published in VRAM; c: chunk 1 published and
    // chunks 7.. in its segment, but not chunk 0 (no prefix); chunk 6 is nowhere.
    for c in &chunks[..6] {
        put_from(&m, "a", "sa", c, 1000, 1);
    }
    let c0: Vec<&str> = chunks[..3].iter().map(|s| s.as_str()).collect();
    publish(&m, "b", &c0, Tier::Vram, 60_000).unwrap();
    publish(&m, "c", &["req/chunk1"], Tier::Vram, 60_000).unwrap();
    for c in &chunks[7..] {
        put_from(&m, "c", "sc", c, 1000, 1);
    }
    let r = m.prefix_query(&chunks).unwrap();
    assert_eq!(r.pool_prefix_len, 6);
    let got: Vec<(String, u32, u32, u32)> =
        r.nodes.iter().map(|n| (n.client_id.clone(), n.prefix_len, n.vram, n.dram)).collect();
    assert_eq!(got, vec![("a".into(), 6, 0, 6), ("b".into(), 3, 3, 0)], "longest first; c lacks chunk 0");
    assert_eq!(r.nodes[0].prefix_bytes, 6000);
    assert_eq!(r.nodes[1].prefix_bytes, 3 * 4096);
    // Nothing cached: empty answer.
    let r = m.prefix_query(&strings(&["nope", "req/chunk0"])).unwrap();
    assert_eq!(r.pool_prefix_len, 0);
    assert!(r.nodes.is_empty());
}

#[test]
fn published_keys_expire_can_be_retracted_and_go_with_their_client() {
    let m = master_with(MasterConfig { client_ttl: Duration::from_millis(50), ..MasterConfig::default() });
    mount_tier(&m, "a", "sa", 1 << 20, Tier::Dram);
    mount_tier(&m, "b", "sb", 1 << 20, Tier::Dram);
    assert_eq!(publish(&m, "a", &["k1", "k2", "k3"], Tier::Vram, 60_000).unwrap(), 3);
    assert_eq!(publish(&m, "a", &["short"], Tier::Dram, 1).unwrap(), 1);
    std::thread::sleep(Duration::from_millis(5));
    let q = |k: &str| m.query_keys(&[k.to_string()]).unwrap().items[0].locations.len();
    assert_eq!(q("short"), 0, "past its TTL");
    assert_eq!(q("k1"), 1);
    assert_eq!(m.retract("a", &strings(&["k1", "never"]), false).unwrap(), 1);
    assert_eq!(q("k1"), 0);
    assert_eq!(m.node_stats().nodes.iter().find(|n| n.client_id == "a").unwrap().published_keys, 3);
    m.sweep_at(Instant::now() + Duration::from_secs(2)); // drops the expired entry (and silent a, b)
    assert_eq!(q("k2"), 0, "a was dropped for silence: its publications went with it");
    assert_eq!(m.metrics().published_keys.get(), 0);
    // Bad input.
    mount_tier(&m, "c", "sc", 1 << 20, Tier::Dram);
    assert!(matches!(publish(&m, "c", &["k"], Tier::Ssd, 1000), Err(StoreError::InvalidArgument(_))));
    assert!(matches!(publish(&m, "c", &["k"], Tier::Vram, 0), Err(StoreError::InvalidArgument(_))));
    assert!(matches!(publish(&m, "c", &["k"], Tier::Vram, 1 << 40), Err(StoreError::InvalidArgument(_))));
    assert!(matches!(publish(&m, "c", &[""], Tier::Vram, 1000), Err(StoreError::InvalidArgument(_))));
    assert!(matches!(publish(&m, "nobody", &["k"], Tier::Vram, 1000), Err(StoreError::ClientNotFound(_))));
    assert_eq!(publish(&m, "c", &["k"], Tier::Vram, 1000).unwrap(), 1);
    assert_eq!(m.retract("c", &[], true).unwrap(), 1);
}

#[test]
fn published_keys_are_bounded() {
    let m = master_with(MasterConfig { max_published_keys: 2, ..MasterConfig::default() });
    mount_tier(&m, "a", "sa", 1 << 20, Tier::Dram);
    publish(&m, "a", &["k1", "k2"], Tier::Vram, 60_000).unwrap();
    publish(&m, "a", &["k1", "k2"], Tier::Vram, 60_000).expect("renewals fit");
    assert!(matches!(publish(&m, "a", &["k3"], Tier::Vram, 60_000), Err(StoreError::NoSpace { .. })));
}

#[test]
fn replicate_adds_replicas_on_other_segments_and_commits_only_written_ones() {
    let m = master_with(MasterConfig::default());
    for c in ["a", "b", "c"] {
        mount_tier(&m, c, &format!("s{c}"), 1 << 20, Tier::Dram);
    }
    put_from(&m, "a", "sa", "k", 1000, 1);
    let used = m.totals().used;
    let plan = m.replicate_start("x", "k", 5).unwrap();
    assert_eq!(plan.sources.len(), 1);
    assert_eq!(plan.targets.len(), 2, "only two other segments");
    assert!(plan.targets.iter().all(|t| t.segment_name != "sa" && t.status == ReplicaStatus::Processing as i32));
    assert!(matches!(m.replicate_start("x", "k", 1), Err(StoreError::NotReady(_))), "one at a time");
    assert!(matches!(m.replicate_end("y", "k", &[]), Err(StoreError::InvalidArgument(_))), "not y's");
    // Only one target was written: it joins, the other is freed.
    let written = plan.targets[0].segment_id;
    assert_eq!(m.replicate_end("x", "k", &[written]).unwrap(), (1, 2));
    assert_eq!(m.query("k").unwrap().replicas.len(), 2);
    assert_eq!(m.totals().used, used * 2);
    // A removal during replication frees the new blocks and fails the end.
    m.remove("k", true).unwrap();
    put_from(&m, "a", "sa", "k2", 1000, 1);
    let plan = m.replicate_start("x", "k2", 1).unwrap();
    m.remove("k2", true).unwrap();
    let done: Vec<u64> = plan.targets.iter().map(|t| t.segment_id).collect();
    assert!(matches!(m.replicate_end("x", "k2", &done), Err(StoreError::NotFound(_))));
    // The new blocks are free; the removed objects' own ranges wait for the read leases the
    // replications' sources were given.
    assert_eq!(m.totals().used, m.quarantined_bytes());
    // Missing, unfinished, no room.
    assert!(matches!(m.replicate_start("x", "nope", 1), Err(StoreError::NotFound(_))));
    m.put_start("a", "busy", 10, &PutOptions::default()).unwrap();
    assert!(matches!(m.replicate_start("x", "busy", 1), Err(StoreError::NotReady(_))));
    put_from(&m, "a", "sa", "three", 1000, 3);
    assert!(matches!(m.replicate_start("x", "three", 1), Err(StoreError::NoSpace { .. })));
    assert!(matches!(m.replicate_start("x", "three", 0), Err(StoreError::InvalidArgument(_))));
}

#[test]
fn abandoned_replications_are_reclaimed() {
    let m = master_with(MasterConfig { put_timeout: Duration::from_millis(20), ..MasterConfig::default() });
    mount_tier(&m, "a", "sa", 1 << 20, Tier::Dram);
    mount_tier(&m, "b", "sb", 1 << 20, Tier::Dram);
    put_from(&m, "a", "sa", "k", 1000, 1);
    let used = m.totals().used;
    m.replicate_start("x", "k", 1).unwrap();
    assert_eq!(m.totals().used, used * 2);
    std::thread::sleep(Duration::from_millis(30));
    m.sweep();
    assert_eq!(m.totals().used, used);
    m.replicate_start("x", "k", 1).expect("a new replication may start");
}

#[test]
fn hot_keys_are_queued_for_replication_within_bounds() {
    let m = master_with(MasterConfig {
        hot_read_threshold: 10.0,
        hot_window: Duration::from_millis(100),
        hot_max_replicas: 2,
        hot_queue: 1,
        ..MasterConfig::default()
    });
    for c in ["a", "b", "c"] {
        mount_tier(&m, c, &format!("s{c}"), 1 << 20, Tier::Dram);
    }
    for k in ["hot", "hot2", "cold"] {
        put_from(&m, "a", "sa", k, 1000, 1);
    }
    let t0 = Instant::now();
    m.hot_tick(&mut m.lock_all(), t0); // opens the window
    for _ in 0..50 {
        m.get_replica_list("hot").unwrap();
        m.get_replica_list("hot2").unwrap();
    }
    m.get_replica_list("cold").unwrap();
    m.hot_tick(&mut m.lock_all(), t0 + Duration::from_millis(150));
    assert_eq!(m.metrics().hot_keys.get(), 2);
    assert_eq!(m.metrics().replication_tasks_queued.get(), 1, "the queue holds one");
    assert_eq!(m.metrics().replication_tasks_dropped.get(), 1);
    let tasks = m.take_replication_tasks(10);
    assert_eq!(tasks.len(), 1);
    assert!(tasks[0].key.starts_with("hot"));
    assert!(m.take_replication_tasks(10).is_empty());
    // At the cap (2 replicas), a hot key is not queued again.
    let plan = m.replicate_start("w", &tasks[0].key, tasks[0].count).unwrap();
    m.replicate_end("w", &tasks[0].key, &[plan.targets[0].segment_id]).unwrap();
    for _ in 0..50 {
        m.get_replica_list(&tasks[0].key).unwrap();
    }
    m.hot_tick(&mut m.lock_all(), t0 + Duration::from_millis(300));
    assert!(m.take_replication_tasks(10).is_empty());
}

#[test]
fn events_follow_puts_removals_evictions_and_publications() {
    let m = master_with(MasterConfig { lease_ttl: Duration::from_millis(1), ..MasterConfig::default() });
    mount_tier(&m, "a", "sa", 100 << 10, Tier::Dram);
    mount_tier(&m, "b", "sb", 100 << 10, Tier::Vram);
    let mut rx = m.subscribe_events();
    put_from(&m, "a", "sa", "two", 1000, 2);
    m.remove("two", false).unwrap();
    publish(&m, "a", &["p"], Tier::Vram, 60_000).unwrap();
    publish(&m, "a", &["p"], Tier::Vram, 60_000).unwrap(); // a renewal: no event
    m.retract("a", &strings(&["p"]), false).unwrap();
    let mut seen = Vec::new();
    while let Ok(e) = rx.try_recv() {
        seen.push((EventKind::try_from(e.kind).unwrap(), e.key, Tier::try_from(e.tier).unwrap(), e.segment, e.seq));
    }
    let kinds: Vec<(EventKind, &str)> = seen.iter().map(|s| (s.0, s.1.as_str())).collect();
    assert_eq!(
        kinds,
        vec![
            (EventKind::Stored, "two"),
            (EventKind::Stored, "two"),
            (EventKind::Removed, "two"),
            (EventKind::Removed, "two"),
            (EventKind::Published, "p"),
            (EventKind::Retracted, "p"),
        ]
    );
    let mut tiers: Vec<(String, Tier)> = seen[..2].iter().map(|s| (s.3.clone(), s.2)).collect();
    tiers.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(tiers, vec![("sa".into(), Tier::Dram), ("sb".into(), Tier::Vram)]);
    assert!(seen.windows(2).all(|w| w[1].4 == w[0].4 + 1), "sequence numbers increase by one");
    // Eviction.
    for i in 0..12 {
        put_from(&m, "a", "sa", &format!("f{i}"), 20 << 10, 1);
    }
    let mut evicted = 0;
    while let Ok(e) = rx.try_recv() {
        evicted += (e.kind == EventKind::Evicted as i32) as u32;
    }
    assert!(evicted > 0);
    assert_eq!(evicted as u64, m.metrics().evictions.get());
    // Unmounting a segment removes its replicas.
    m.unmount_segment("b", 2).unwrap();
    let mut removed_on_b = 0;
    while let Ok(e) = rx.try_recv() {
        assert_eq!((e.kind, e.segment.as_str()), (EventKind::Removed as i32, "sb"));
        removed_on_b += 1;
    }
    assert!(removed_on_b > 0);
}

#[test]
fn a_slow_subscriber_loses_events_and_is_told_without_slowing_the_master() {
    let m = master_with(MasterConfig { event_buffer: 8, ..MasterConfig::default() });
    mount_tier(&m, "a", "sa", 1 << 20, Tier::Dram);
    let mut rx = m.subscribe_events();
    for i in 0..100 {
        put_from(&m, "a", "sa", &format!("k{i}"), 100, 1);
    }
    match rx.try_recv() {
        Err(TryRecvError::Lagged(n)) => assert_eq!(n, 92),
        other => panic!("expected a loss notice, got {other:?}"),
    }
    let rest: Vec<String> = std::iter::from_fn(|| rx.try_recv().ok()).map(|e| e.key).collect();
    assert_eq!(rest.len(), 8);
    assert_eq!(rest.last().unwrap(), "k99", "the newest events are kept");
}

#[test]
fn local_first_is_the_default_and_falls_back_when_the_writer_is_full() {
    let m = master_with(MasterConfig::default());
    assert_eq!(m.config().allocation_strategy, AllocationStrategy::LocalFirst);
    mount_tier(&m, "a", "sa", 64 << 10, Tier::Dram);
    mount_tier(&m, "b", "sb", 1 << 20, Tier::Dram);
    for i in 0..4 {
        assert_eq!(put_from(&m, "a", "sa", &format!("k{i}"), 16 << 10, 1)[0].segment_name, "sa");
    }
    assert_eq!(put_from(&m, "a", "sa", "k4", 16 << 10, 1)[0].segment_name, "sb", "a is full");
}

#[test]
fn node_stats_show_capacity_use_objects_and_recent_rates() {
    let m = master_with(MasterConfig::default());
    mount_tier(&m, "a", "sa", 1 << 20, Tier::Dram);
    mount_tier(&m, "b", "sb", 1 << 20, Tier::Dram);
    for i in 0..10 {
        put_from(&m, "a", "sa", &format!("k{i}"), 1000, 1);
    }
    for _ in 0..30 {
        m.get_replica_list("k0").unwrap();
    }
    let s = m.node_stats();
    let a = s.nodes.iter().find(|n| n.client_id == "a").unwrap();
    let b = s.nodes.iter().find(|n| n.client_id == "b").unwrap();
    assert_eq!((a.capacity, a.objects, a.segments.clone()), (1 << 20, 10, vec!["sa".to_string()]));
    assert_eq!(a.used, 10 * 1024, "1000 bytes rounded up to the 256-byte granule");
    assert_eq!((a.get_rate, a.put_rate), (3.0, 1.0), "30 gets and 10 puts over the 10 s window");
    assert_eq!((b.objects, b.get_rate, b.put_rate), (0, 0.0, 0.0));
    assert_eq!(a.host, "h-a");
}
