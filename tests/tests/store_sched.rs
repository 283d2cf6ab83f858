//! Cache-aware scheduling against an in-process master on loopback, through the client
//! library, raw gRPC and the HTTP JSON API: queries against known placements, published
//! near-engine keys, 10k-key batches, prefix queries, replication with real bytes, the hot-key
//! warm-up worker and the event stream (including a subscriber that falls behind).

use std::time::{Duration, Instant};

use crescent_store::master::server::MasterHandle;
use crescent_store::proto::{EventKind, EventMessage, Tier};
use crescent_store::{MasterConfig, StoreApi, StoreError};
use crescent_tests::eventually;

fn master_with(config: MasterConfig) -> MasterHandle {
    crescent_tests::store::loopback_master(config)
}

use crescent_tests::store::loopback_client as client;

fn data(len: usize, seed: u64) -> Vec<u8> {
    crescent_tests::store::pattern_bytes(len, seed)
}

fn http(m: &MasterHandle, method: &str, path: &str, body: &str) -> (u16, serde_json::Value) {
    crescent_tests::store::admin_http(m, method, path, body)
}

/// (segment, tier, published) of each location of item `i`, sorted.
fn places(r: &crescent_store::proto::QueryKeysReply, i: usize) -> Vec<(String, Tier, bool)> {
    let mut v: Vec<_> = r.items[i]
        .locations
        .iter()
        .map(|l| (r.nodes[l.node as usize].segment.clone(), Tier::try_from(l.tier).unwrap(), l.published))
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

#[test]
fn queries_over_grpc_and_http_match_known_placements_and_leave_leases_alone() {
    let m = master_with(MasterConfig::default());
    let (a, b) = (client(&m, 32 << 20), client(&m, 32 << 20));
    // local_first (the default): each writer's values land in its own segment.
    a.put("a/0", &data(1000, 1)).unwrap();
    a.put("a/1", &data(2000, 2)).unwrap();
    b.put("b/0", &data(3000, 3)).unwrap();
    // a's inference engine holds b/0 and x/vram-only in its own GPU memory.
    a.sched()
        .publish(&[("b/0".into(), 3000), ("x/vram-only".into(), 4096)], Tier::Vram, Duration::from_secs(60))
        .unwrap();

    let keys: Vec<String> = ["a/0", "a/1", "b/0", "x/vram-only", "missing"].iter().map(|s| s.to_string()).collect();
    let r = b.sched().query_keys(&keys).unwrap();
    let (sa, sb) = (a.segment_name().to_string(), b.segment_name().to_string());
    assert_eq!(places(&r, 0), vec![(sa.clone(), Tier::Dram, false)]);
    assert_eq!((r.items[1].exists, r.items[1].size), (true, 2000));
    let mut want = vec![(sa.clone(), Tier::Vram, true), (sb.clone(), Tier::Dram, false)];
    want.sort_by(|x, y| x.0.cmp(&y.0));
    assert_eq!(places(&r, 2), want);
    assert!(!r.items[3].exists, "published only: not in the store");
    assert_eq!(places(&r, 3), vec![(sa.clone(), Tier::Vram, true)]);
    assert!(!r.items[4].exists && r.items[4].locations.is_empty());
    assert!(r.nodes.iter().all(|n| n.host == "127.0.0.1"));
    // The store never serves a published copy.
    assert!(matches!(b.get("x/vram-only"), Err(StoreError::NotFound(_))));

    // Longest prefix: a holds a/0, a/1 (pool); b holds neither.
    let p = b.sched().prefix_query(&["a/0".into(), "a/1".into(), "b/0".into(), "missing".into()]).unwrap();
    assert_eq!(p.pool_prefix_len, 3);
    assert_eq!(p.nodes.len(), 1);
    assert_eq!((p.nodes[0].client_id.as_str(), p.nodes[0].prefix_len, p.nodes[0].vram), (a.id(), 3, 1));

    // Queries hold no lease: the objects stay removable without force.
    for _ in 0..200 {
        b.sched().query_keys(&keys).unwrap();
    }
    a.remove("a/1").expect("no lease from queries");

    // The same over HTTP JSON.
    let (status, body) = http(&m, "POST", "/query", r#"{"keys": ["a/0", "b/0", "missing"]}"#);
    assert_eq!(status, 200, "{body}");
    let items = body["items"].as_array().unwrap();
    assert_eq!(items[0]["key"], "a/0");
    assert_eq!(items[0]["locations"][0]["segment"], sa.as_str());
    assert_eq!(items[0]["locations"][0]["tier"], "DRAM");
    assert_eq!(items[1]["locations"].as_array().unwrap().len(), 2);
    assert_eq!(items[2]["exists"], false);
    let (status, body) = http(&m, "GET", "/query?key=x/vram-only", "");
    assert_eq!(status, 200);
    assert_eq!(body["items"][0]["locations"][0]["published"], true);
    assert_eq!(body["items"][0]["locations"][0]["tier"], "VRAM");
    let (status, body) = http(&m, "POST", "/prefix", r#"{"keys": ["a/0", "b/0"]}"#);
    assert_eq!(status, 200);
    assert_eq!(body["pool_prefix_len"], 2);
    assert_eq!(body["nodes"][0]["client_id"], a.id());
    let (status, body) = http(&m, "GET", "/nodes", "");
    assert_eq!(status, 200);
    let nodes = body["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 2);
    let na = nodes.iter().find(|n| n["client_id"] == a.id()).unwrap();
    assert_eq!(na["capacity"], 32u64 << 20);
    assert_eq!(na["objects"], 1);
    assert_eq!(na["published_keys"], 2);
    // Bad input: typed errors, no crash.
    assert!(http(&m, "POST", "/query", "{not json").0 >= 400);
    assert_eq!(http(&m, "POST", "/query", r#"{"keys": [""]}"#).0, 400);
    assert_eq!(http(&m, "GET", "/query", "").0, 400);
    assert!(matches!(b.sched().query_keys(&["".into()]), Err(StoreError::InvalidArgument(_))));

    // Retracting makes the published copies disappear.
    assert_eq!(a.sched().retract_all().unwrap(), 2);
    assert!(b.sched().query_keys(&["x/vram-only".into()]).unwrap().items[0].locations.is_empty());
}

#[test]
fn a_batch_of_ten_thousand_keys_in_one_grpc_call() {
    let m = master_with(MasterConfig::default());
    let a = client(&m, 16 << 20);
    let one = [7u8; 64];
    a.register_buffer(one.as_ptr() as u64, one.len() as u64).unwrap();
    let keys: Vec<String> = (0..10_000).map(|i| format!("batch/{i:05}")).collect();
    for chunk in keys.chunks(2000) {
        let addrs = vec![one.as_ptr() as u64; chunk.len()];
        let sizes = vec![64u64; chunk.len()];
        assert!(a.batch_put_from(chunk, &addrs, &sizes).unwrap().iter().all(|r| r.is_ok()));
    }
    let mut asked = keys.clone();
    asked.push("batch/missing".into());
    let r = a.sched().query_keys(&asked).unwrap();
    assert_eq!(r.items.len(), 10_001);
    assert!(r.items[..10_000].iter().all(|i| i.exists && i.size == 64 && i.locations.len() == 1));
    assert!(!r.items[10_000].exists);
    assert_eq!(r.nodes.len(), 1);
    assert_eq!(r.nodes[0].segment, a.segment_name());
}

#[test]
fn replicate_copies_the_bytes_to_other_nodes_which_then_serve_them() {
    let m = master_with(MasterConfig::default());
    let a = client(&m, 32 << 20);
    let b = client(&m, 32 << 20);
    let c = client(&m, 32 << 20);
    let d = client(&m, 1 << 20); // too small to hold a replica: copies through its staging buffer
    let v1 = data(9 << 20, 11);
    let v2 = data(9 << 20, 12);
    let v3 = data(3 << 20, 13);
    a.put("r/1", &v1).unwrap();
    a.put("r/2", &v2).unwrap();
    a.put("r/3", &v3).unwrap();
    // c holds no source: it reads a's replica into its own new replica, then writes b's from it.
    assert_eq!(
        c.sched().replicate("r/1", 2).unwrap(),
        crescent_store::client::sched::Replicated { added: 2, replicas: 3 }
    );
    // d holds neither a source nor a target: 9 MiB through its 4 MiB staging buffer.
    let r = d.sched().replicate("r/2", 1).unwrap();
    assert_eq!((r.added, r.replicas), (1, 2));
    // a holds the source: it writes the new replica straight from its segment.
    assert_eq!(a.sched().replicate("r/3", 1).unwrap().replicas, 2);
    assert!(matches!(a.sched().replicate("nope", 1), Err(StoreError::NotFound(_))));
    // The new replicas hold the bytes: with a gone, the others serve every value.
    let where_before = d.sched().query_keys(&["r/2".into()]).unwrap();
    assert_eq!(where_before.items[0].locations.len(), 2);
    a.close().unwrap();
    assert_eq!(d.get("r/1").unwrap(), v1);
    assert_eq!(d.get("r/2").unwrap(), v2);
    assert_eq!(d.get("r/3").unwrap(), v3);
    assert_eq!(b.get("r/1").unwrap(), v1, "b's own replica, a memcpy");
    let m_added = m.master.metrics().replicas_added.get();
    assert_eq!(m_added, 4);
}

#[test]
fn hot_keys_get_more_replicas_through_a_warmup_worker() {
    let m = master_with(MasterConfig {
        hot_read_threshold: 20.0,
        hot_window: Duration::from_millis(300),
        hot_max_replicas: 2,
        ..MasterConfig::default()
    });
    let (a, b, c) = (client(&m, 16 << 20), client(&m, 16 << 20), client(&m, 16 << 20));
    let v = data(100_000, 5);
    a.put("hot", &v).unwrap();
    a.put("cold", &v).unwrap();
    let worker = c.sched().start_warmup_worker(Duration::from_millis(50));
    let replicas = |k: &str| b.sched().query_keys(&[k.to_string()]).unwrap().items[0].locations.len();
    let warmed = eventually(Duration::from_secs(30), || {
        for _ in 0..20 {
            assert_eq!(b.get("hot").unwrap().len(), v.len());
        }
        replicas("hot") >= 2
    });
    assert!(warmed, "the hot key got a second replica");
    b.get("cold").unwrap();
    // Still hot for several more windows: the cap holds it at two.
    for _ in 0..10 {
        for _ in 0..20 {
            b.get("hot").unwrap();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(replicas("hot"), 2);
    assert_eq!(replicas("cold"), 1);
    assert!(worker.stats.replicas_added.load(std::sync::atomic::Ordering::Relaxed) >= 1);
    assert!(m.master.metrics().replication_tasks_queued.get() >= 1);
    drop(worker);
    // The new replica holds the bytes.
    a.close().unwrap();
    assert_eq!(b.get("hot").unwrap(), v);
}

fn next_event(s: &mut crescent_store::client::sched::EventSubscription) -> EventMessage {
    s.recv_timeout(Duration::from_secs(10)).unwrap().expect("an event within 10 s")
}

#[test]
fn the_event_stream_sees_puts_removals_evictions_and_publications() {
    let m = master_with(MasterConfig::default());
    let a = client(&m, 8 << 20);
    let mut all = a.sched().subscribe("").unwrap();
    let mut only_p = a.sched().subscribe("p/").unwrap();
    a.put("e/1", &data(1000, 1)).unwrap();
    a.remove("e/1").unwrap();
    a.sched().publish(&[("p/1".into(), 10)], Tier::Vram, Duration::from_secs(60)).unwrap();
    let kinds: Vec<(EventKind, String, Tier, String)> = (0..3)
        .map(|_| {
            let e = next_event(&mut all).event.unwrap();
            (EventKind::try_from(e.kind).unwrap(), e.key, Tier::try_from(e.tier).unwrap(), e.segment)
        })
        .collect();
    let seg = a.segment_name().to_string();
    assert_eq!(
        kinds,
        vec![
            (EventKind::Stored, "e/1".into(), Tier::Dram, seg.clone()),
            (EventKind::Removed, "e/1".into(), Tier::Dram, seg.clone()),
            (EventKind::Published, "p/1".into(), Tier::Vram, seg.clone()),
        ]
    );
    let e = next_event(&mut only_p).event.unwrap();
    assert_eq!((e.kind, e.key.as_str()), (EventKind::Published as i32, "p/1"), "the prefix filter");
    // Fill the 8 MiB pool: evictions show up.
    for i in 0..12 {
        a.put(&format!("fill/{i}"), &data(1 << 20, i)).unwrap();
    }
    // Every eviction the master counted comes as an event (each may take up to 10 s on a
    // loaded host); once the two agree, a quiet spell ends the drain (an extra event would
    // show there).
    let mut evicted = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let counted = m.master.metrics().evictions.get();
        let settled = evicted > 0 && evicted == counted;
        let wait = Duration::from_millis(if settled { 500 } else { 10_000 });
        match all.recv_timeout(wait).unwrap() {
            Some(msg) => {
                if msg.event.is_some_and(|e| e.kind == EventKind::Evicted as i32) {
                    evicted += 1;
                }
            }
            None if settled => break,
            None => panic!("no event for 10 s: {evicted} eviction events of {counted} evictions"),
        }
        assert!(Instant::now() < deadline, "{evicted} eviction events of {counted} evictions");
    }
    assert!(evicted > 0);
    assert_eq!(evicted, m.master.metrics().evictions.get());
}

#[test]
fn a_subscriber_that_falls_behind_is_told_how_many_events_it_lost() {
    let m = master_with(MasterConfig { event_buffer: 64, ..MasterConfig::default() });
    let a = client(&m, 16 << 20);
    let mut slow = a.sched().subscribe("").unwrap();
    // 20k events while the subscriber reads nothing: the master keeps going.
    let one = [1u8; 8];
    a.register_buffer(one.as_ptr() as u64, one.len() as u64).unwrap();
    for c in 0..20 {
        let keys: Vec<String> = (0..1000).map(|i| format!("slow/{c}/{i}")).collect();
        let r = a.batch_put_from(&keys, &vec![one.as_ptr() as u64; 1000], &vec![8; 1000]).unwrap();
        assert!(r.iter().all(|r| r.is_ok()));
    }
    // Until every event is accounted for, each message may take up to 10 s (a loaded host);
    // then a quiet spell shows that no extra one comes.
    let (mut events, mut lost) = (0u64, 0u64);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let done = events + lost >= 20_000;
        let wait = Duration::from_millis(if done { 500 } else { 10_000 });
        match slow.recv_timeout(wait).unwrap() {
            Some(msg) => match msg.event {
                Some(_) => events += 1,
                None => lost += msg.lost,
            },
            None if done => break,
            None => panic!("no message for 10 s: {events} events and {lost} lost of 20000"),
        }
        assert!(Instant::now() < deadline, "{events} events and {lost} lost of 20000");
    }
    assert!(lost > 0, "a loss notice came ({events} events)");
    assert_eq!(events + lost, 20_000, "every event is either delivered or counted as lost");
}
