//! The master with fake owners: commits wait for acknowledgements, removals quarantine their
//! ranges, news come again after a reconnect, and a rebuilt master resolves its reports.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::error::StoreError;
use crate::master::{Master, MasterConfig};
use crate::proto::{OwnedObject, OwnerNews, OwnerNewsItem, PutOptions, SegmentInfo};

const SEG: u64 = 64 << 10;

fn master() -> Arc<Master> {
    let m = Master::new(MasterConfig::default()).unwrap();
    m.state.lock().instant_acks = false;
    m
}

fn info(name: &str, base: u64) -> SegmentInfo {
    SegmentInfo { name: name.into(), base, size: SEG, tier: 0 }
}

/// An owner on the other end of an owner stream, acknowledging only when told.
struct FakeOwner {
    client: String,
    segment: u64,
    rx: mpsc::UnboundedReceiver<OwnerNews>,
    seen: u64,
}

impl FakeOwner {
    fn mount(m: &Master, client: &str, base: u64) -> FakeOwner {
        let segment = m.mount_segment(client, &info(&format!("{client}:1"), base), "h").unwrap();
        FakeOwner::attach(m, client, segment, 0)
    }

    fn attach(m: &Master, client: &str, segment: u64, acked: u64) -> FakeOwner {
        let (tx, rx) = mpsc::unbounded_channel();
        m.attach_owner(client, m.term(), segment, acked, tx).unwrap();
        FakeOwner { client: client.into(), segment, rx, seen: acked }
    }

    fn news(&mut self) -> Vec<OwnerNewsItem> {
        let mut out = Vec::new();
        while let Ok(n) = self.rx.try_recv() {
            out.extend(n.items);
        }
        if let Some(last) = out.last() {
            self.seen = last.seq;
        }
        out
    }

    fn ack(&mut self, m: &Master) {
        self.news();
        m.owner_ack(&self.client, m.term(), self.segment, self.seen);
    }
}

fn opts(replicas: u32) -> PutOptions {
    PutOptions { replica_num: replicas, ..Default::default() }
}

#[test]
fn a_put_is_committed_only_where_its_owner_acknowledged() {
    let m = master();
    let mut a = FakeOwner::mount(&m, "a", 1 << 30);
    let mut b = FakeOwner::mount(&m, "b", 1 << 31);
    m.put_start("w", "k", 1000, &opts(2)).unwrap();
    let commit = m.put_end_begin("w", "k", None).unwrap();
    assert!(!commit.wait.is_empty());
    assert!(!m.exists("k").unwrap(), "not visible before its owners know");
    a.ack(&m);
    let told_b = b.news();
    assert_eq!(told_b.len(), 1);
    assert!(told_b[0].commit && told_b[0].key == "k" && told_b[0].size == 1000);
    // b never acknowledges: the put commits with a's replica only.
    m.put_end_finish(&commit).unwrap();
    let replicas = m.query("k").unwrap().replicas;
    assert_eq!(replicas.len(), 1);
    assert_eq!(replicas[0].client_id, "a");
    // b is told to drop what it may have applied; its range waits for that.
    let drop = b.news();
    assert!(drop.len() == 1 && !drop[0].commit && drop[0].key == "k");
    assert_eq!(m.quarantined_bytes(), 1024);
    b.ack(&m);
    assert_eq!(m.quarantined_bytes(), 0);
}

#[test]
fn a_put_no_owner_acknowledged_fails_and_leaves_nothing() {
    let m = master();
    let _a = FakeOwner::mount(&m, "a", 1 << 30);
    m.put_start("w", "k", 1000, &opts(1)).unwrap();
    let commit = m.put_end_begin("w", "k", None).unwrap();
    let e = m.put_end_finish(&commit).unwrap_err();
    assert!(matches!(e, StoreError::OwnersUnreachable(ref k) if k == "k"), "{e:?}");
    assert!(e.is_master_change(), "retryable");
    assert!(!m.exists("k").unwrap());
    assert!(m.query("k").unwrap().replicas.is_empty());
}

#[test]
fn a_batch_commit_tells_each_owner_once_and_answers_each_key() {
    // BatchPutEnd: the commit news of all its keys go to each owner in one message (one
    // acknowledgement each), not one message per key; each key then commits where its owner
    // acknowledged, in the batch's order.
    let m = master();
    let mut a = FakeOwner::mount(&m, "a", 1 << 30);
    let mut b = FakeOwner::mount(&m, "b", 1 << 31);
    // Placement is random: keys are put until both owners hold some (12 at least).
    let (mut keys, mut on_a) = (Vec::new(), Vec::new());
    while keys.len() < 12 || (keys.len() < 64 && !(on_a.contains(&true) && on_a.contains(&false))) {
        let k = format!("k{}", keys.len());
        let (replicas, _) = m.put_start("a", &k, 1000, &opts(1)).unwrap();
        on_a.push(replicas[0].segment_id == a.segment);
        keys.push(k);
    }
    assert!(on_a.iter().any(|x| *x) && on_a.iter().any(|x| !*x), "keys on both owners: {on_a:?}");
    m.put_start("other", "theirs", 1000, &opts(1)).unwrap();
    let mut batch = keys.clone();
    batch.extend(["missing".to_string(), "theirs".to_string(), String::new()]);
    let (commits, mut wait) = m.put_end_begin_batch("a", &batch, &[]);
    assert!(!wait.is_empty());
    let messages = |o: &mut FakeOwner| {
        let mut got = Vec::new();
        while let Ok(n) = o.rx.try_recv() {
            got.push(n.items);
        }
        got
    };
    let (to_a, to_b) = (messages(&mut a), messages(&mut b));
    assert_eq!(to_a.len(), 1, "one message to a for the whole batch");
    assert_eq!(to_b.len(), 1, "one message to b for the whole batch");
    let told = |items: &[OwnerNewsItem]| {
        let mut k: Vec<String> = items.iter().filter(|i| i.commit).map(|i| i.key.clone()).collect();
        k.sort();
        k
    };
    let mut expect_a: Vec<String> = keys.iter().zip(&on_a).filter(|(_, a)| **a).map(|(k, _)| k.clone()).collect();
    let mut expect_b: Vec<String> = keys.iter().zip(&on_a).filter(|(_, a)| !**a).map(|(k, _)| k.clone()).collect();
    expect_a.sort();
    expect_b.sort();
    assert_eq!(told(&to_a[0]), expect_a);
    assert_eq!(told(&to_b[0]), expect_b);
    assert!(keys.iter().all(|k| !m.exists(k).unwrap()), "nothing visible before the owners know");
    // a acknowledges its one message; b never does.
    a.seen = to_a[0].iter().map(|i| i.seq).max().unwrap();
    m.owner_ack("a", m.term(), a.segment, a.seen);
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
        .block_on(wait.wait(Duration::from_millis(50)));
    let done = m.put_end_finish_batch(commits);
    assert_eq!(done.len(), batch.len());
    for ((k, on_a), r) in keys.iter().zip(&on_a).zip(&done) {
        if *on_a {
            assert!(r.is_ok(), "{k}: {r:?}");
            assert!(m.exists(k).unwrap());
        } else {
            assert!(matches!(r, Err(StoreError::OwnersUnreachable(x)) if x == k), "{k}: {r:?}");
            assert!(!m.exists(k).unwrap());
        }
    }
    // "a" is a client this master knows: an unknown key is not found (not a master change).
    let tail = &done[keys.len()..];
    assert!(matches!(&tail[0], Err(StoreError::NotFound(k)) if k == "missing"), "{:?}", tail[0]);
    assert!(matches!(&tail[1], Err(StoreError::InvalidArgument(_))), "another writer's put: {:?}", tail[1]);
    assert!(matches!(&tail[2], Err(StoreError::InvalidArgument(_))), "an empty key: {:?}", tail[2]);
    assert!(!m.exists("theirs").unwrap(), "another writer's put is left alone");
}

#[test]
fn removed_ranges_are_not_reused_until_the_owner_acknowledged_the_drop() {
    let m = master();
    let mut a = FakeOwner::mount(&m, "a", 1 << 30);
    m.put_start("a", "k", SEG, &opts(1)).unwrap();
    let c = m.put_end_begin("a", "k", None).unwrap();
    a.ack(&m);
    m.put_end_finish(&c).unwrap();
    let wait = m.remove("k", false).unwrap();
    assert!(!wait.is_empty(), "the removal's answer waits for the owner");
    assert!(!m.exists("k").unwrap(), "invisible at once");
    // The whole segment is still quarantined: a new put finds no room.
    assert!(matches!(m.put_start("a", "k2", SEG, &opts(1)), Err(StoreError::NoSpace { .. })));
    a.ack(&m);
    m.put_start("a", "k2", SEG, &opts(1)).expect("room once the owner acknowledged");
}

#[test]
fn eviction_quarantines_and_a_put_waiting_for_room_gets_it_after_the_ack() {
    let m = master();
    let mut a = FakeOwner::mount(&m, "a", 1 << 30);
    m.put_start("a", "old", SEG / 2, &opts(1)).unwrap();
    let c = m.put_end_begin("a", "old", None).unwrap();
    a.ack(&m);
    m.put_end_finish(&c).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (m2, m3) = (m.clone(), m.clone());
    let got = rt.block_on(async move {
        let put = m2.retry_after_quarantine(|| m2.put_start("a", "new", SEG, &opts(1)));
        let ack = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            a.ack(&m3);
        };
        tokio::join!(put, ack).0
    });
    got.expect("the put got the evicted object's room once its drop was acknowledged");
    assert!(!m.exists("old").unwrap());
}

#[test]
fn a_step_of_eviction_tells_each_owner_once() {
    // The drops of one eviction step, whatever shards their objects are in, go to their owner
    // as one message (one acknowledgement back), not one message per shard.
    let m = Master::new(MasterConfig { eviction_ratio: 0.5, ..MasterConfig::default() }).unwrap();
    m.state.lock().instant_acks = false;
    let mut a = FakeOwner::mount(&m, "a", 1 << 30);
    let keys: Vec<String> = (0..15).map(|i| format!("e{i}")).collect();
    for k in &keys[..14] {
        m.put_start("a", k, 4096, &opts(1)).unwrap();
        let c = m.put_end_begin("a", k, None).unwrap();
        a.ack(&m);
        m.put_end_finish(&c).unwrap();
    }
    a.news();
    // The 15th crosses the high watermark (0.9 of 64 KiB): a round frees half of the segment.
    m.put_start("a", &keys[14], 4096, &opts(1)).unwrap();
    let mut messages = Vec::new();
    while let Ok(n) = a.rx.try_recv() {
        messages.push(n.items);
    }
    let evicted: Vec<&String> = keys[..14].iter().filter(|k| !m.exists(k).unwrap()).collect();
    assert_eq!(evicted.len(), 8, "half of the segment: {evicted:?}");
    let shards: std::collections::HashSet<usize> =
        evicted.iter().map(|k| crate::master::objects::shard_of(k)).collect();
    assert!(shards.len() > 1, "the victims are in several shards: {shards:?}");
    assert_eq!(messages.len(), 1, "one message for the step: {messages:?}");
    let mut dropped: Vec<&String> = messages[0].iter().filter(|i| !i.commit).map(|i| &i.key).collect();
    dropped.sort();
    let mut expect = evicted.clone();
    expect.sort();
    assert_eq!(dropped, expect);
}

#[test]
fn news_not_acknowledged_come_again_on_reconnect_and_other_terms_are_refused() {
    let m = master();
    let mut a = FakeOwner::mount(&m, "a", 1 << 30);
    for k in ["k1", "k2", "k3"] {
        m.put_start("a", k, 100, &opts(1)).unwrap();
        m.put_end_begin("a", k, None).unwrap();
    }
    let seqs: Vec<u64> = a.news().iter().map(|i| i.seq).collect();
    assert_eq!(seqs, [1, 2, 3]);
    // The stream breaks after the owner applied the first one; it reconnects saying so.
    let mut again = FakeOwner::attach(&m, "a", a.segment, 1);
    let items = again.news();
    assert_eq!(items.iter().map(|i| i.key.as_str()).collect::<Vec<_>>(), ["k2", "k3"]);
    // Another term's hello or acks are not this master's.
    let (tx, _rx) = mpsc::unbounded_channel();
    let stale = m.attach_owner("a", m.term() ^ 1, a.segment, 0, tx);
    assert!(matches!(stale, Err(StoreError::MasterChanged(_))), "{:?}", stale.err());
    m.owner_ack("a", m.term() ^ 1, a.segment, 3);
    assert!(!Master::is_acked(&m.state.lock(), a.segment, 3));
    // Nor may a client speak for another's segment.
    m.owner_ack("b", m.term(), a.segment, 3);
    assert!(!Master::is_acked(&m.state.lock(), a.segment, 3));
    again.ack(&m);
    assert!(Master::is_acked(&m.state.lock(), a.segment, 3));
}

#[test]
fn a_put_end_a_new_master_knows_nothing_of_is_a_master_change() {
    let m = master();
    let e = m.put_end_begin("unknown-client", "k", None).unwrap_err();
    assert!(matches!(e, StoreError::MasterChanged(_)), "{e:?}");
    FakeOwner::mount(&m, "c", 1 << 30);
    assert!(matches!(m.put_end_begin("c", "k", None), Err(StoreError::NotFound(_))), "a known client's unknown put");
}

fn owned(key: &str, version: u64, offset: u64, size: u64) -> OwnedObject {
    OwnedObject { key: key.into(), version, offset, size, ..Default::default() }
}

#[test]
fn a_rebuilt_master_takes_the_highest_version_and_drops_the_stale_copies() {
    let m = master();
    let now = Instant::now();
    let a_report = [
        owned("k1", 5, 0, 1000),
        owned("k2", 3, 1024, 500),
        OwnedObject { hard_pin: true, soft_pin_remaining_ms: 60_000, ..owned("pinned", 9, 4096, 100) },
    ];
    let r = m.remount_with_report_at("a", &info("a:1", 1 << 30), "h", &a_report, &[], now).unwrap();
    assert_eq!((r.reinstated, r.refused), (3, 0));
    let b_report = [owned("k1", 7, 0, 1000), owned("k2", 3, 8192, 500)];
    let rb = m.remount_with_report_at("b", &info("b:1", 1 << 31), "h", &b_report, &[], now).unwrap();
    assert_eq!((rb.reinstated, rb.refused), (2, 0));
    let mut a = FakeOwner::attach(&m, "a", r.segment_id, 0);
    // k1: b's newer version wins; a drops its copy, whose range waits for that.
    let k1 = m.query("k1").unwrap();
    assert_eq!((k1.version, k1.replicas.len()), (7, 1));
    assert_eq!(k1.replicas[0].client_id, "b");
    let told = a.news();
    assert!(told.len() == 1 && !told[0].commit && told[0].key == "k1" && told[0].version == 5, "{told:?}");
    assert_eq!(m.quarantined_bytes(), 1024);
    // k2: the same version from both owners: one object, two replicas, at the reported places.
    let k2 = m.query("k2").unwrap();
    assert_eq!(k2.replicas.len(), 2);
    let mut addrs: Vec<u64> = k2.replicas.iter().map(|x| x.address).collect();
    addrs.sort();
    assert_eq!(addrs, [(1 << 30) + 1024, (1 << 31) + 8192]);
    // Reinstated objects are complete, leased afresh, pinned as reported.
    let p = m.query("pinned").unwrap();
    assert!(p.exists && p.hard_pinned && p.lease_remaining_ms > 0);
    // Versions handed out later are newer than any reported.
    m.put_start("b", "later", 10, &opts(1)).unwrap();
    assert!(m.query("later").unwrap().version > 9);
    // New puts never land on reinstated ranges.
    let mut i = 0;
    while m
        .put_start("a", &format!("fill{i}"), 256, &PutOptions { preferred_segments: vec!["a:1".into()], ..opts(1) })
        .is_ok()
    {
        i += 1;
    }
    let mut taken: Vec<(u64, u64)> = Vec::new();
    for key in ["k2", "pinned"].into_iter().map(String::from).chain((0..i).map(|i| format!("fill{i}"))) {
        for x in m.query(&key).unwrap().replicas.iter().filter(|x| x.client_id == "a") {
            taken.push((x.address, x.address + x.size));
        }
    }
    taken.sort();
    assert!(taken.iter().all(|(start, _)| *start >= (1 << 30) + 1024), "k1's old range is quarantined: {taken:?}");
    for w in taken.windows(2) {
        assert!(w[0].1 <= w[1].0, "overlap {w:?}");
    }
}

#[test]
fn reports_that_overlap_or_lose_to_an_upsert_in_flight_are_refused() {
    let m = master();
    // An upsert started at this master before the owner reported the key: the upsert wins.
    FakeOwner::mount(&m, "w", 1 << 32);
    m.put_start("w", "k", 100, &upsert()).unwrap();
    let report = [owned("k", 1, 0, 100), owned("x", 2, 512, 1000), owned("y", 3, 1024, 100), owned("z", 4, SEG, 10)];
    let r = m.remount_with_report_at("a", &info("a:1", 1 << 30), "h", &report, &[], Instant::now()).unwrap();
    // x and y overlap: the first reported keeps its range; z lies outside the segment.
    assert_eq!((r.reinstated, r.refused), (1, 3));
    assert!(m.exists("x").unwrap() && !m.exists("y").unwrap() && !m.exists("z").unwrap());
    let mut a = FakeOwner::attach(&m, "a", r.segment_id, 0);
    let mut dropped: Vec<String> = a.news().into_iter().filter(|i| !i.commit).map(|i| i.key).collect();
    dropped.sort();
    assert_eq!(dropped, ["k", "y", "z"]);
    assert_eq!(m.query("k").unwrap().replicas[0].client_id, "w", "the upsert in flight keeps the key");
}

fn upsert() -> PutOptions {
    PutOptions { replace: true, ..opts(1) }
}

/// Puts and commits `key` of `size` bytes on `owner`'s segment.
fn put_on(m: &Master, owner: &mut FakeOwner, key: &str, size: u64, o: &PutOptions) -> u64 {
    let o = PutOptions { preferred_segments: vec![format!("{}:1", owner.client)], ..o.clone() };
    let (_, version) = m.put_start(&owner.client, key, size, &o).unwrap();
    let c = m.put_end_begin(&owner.client, key, None).unwrap();
    owner.ack(m);
    m.put_end_finish(&c).unwrap();
    version
}

#[test]
fn a_removal_answered_while_the_holders_report_is_not_undone_by_a_later_report() {
    // Issue 48's soak: a new master answered a forced removal of a key whose holder had not
    // reported yet; the report then brought the object back, and a later put of the key
    // answered OK and left the old value.
    let m = master();
    let now = Instant::now();
    // Not reported yet: the removal answers NOT_FOUND, which tells the caller it is gone.
    assert!(matches!(m.remove("k", true), Err(StoreError::NotFound(_))));
    // Reported by one holder, removed (OK), then reported by a second holder of a replica.
    let rb = m.remount_with_report_at("b", &info("b:1", 1 << 31), "h", &[owned("r", 6, 0, 100)], &[], now).unwrap();
    assert_eq!(rb.reinstated, 1);
    m.remove("r", true).unwrap();
    let report = [owned("k", 5, 0, 100), owned("r", 6, 4096, 100), owned("kept", 7, 8192, 100)];
    let ra = m.remount_with_report_at("a", &info("a:1", 1 << 30), "h", &report, &[], now).unwrap();
    assert_eq!((ra.reinstated, ra.refused), (1, 2));
    assert!(!m.exists("k").unwrap() && !m.exists("r").unwrap(), "removed keys stay removed");
    assert!(m.exists("kept").unwrap());
    let mut a = FakeOwner::attach(&m, "a", ra.segment_id, 0);
    let mut dropped: Vec<String> = a.news().into_iter().filter(|i| !i.commit).map(|i| i.key).collect();
    dropped.sort();
    assert_eq!(dropped, ["k", "r"], "their holder drops them");
    // A put of the key now writes a new value rather than finding the old one.
    let v = put_on(&m, &mut a, "k", 100, &opts(1));
    assert!(v > 5 && m.query("k").unwrap().version == v);
    // Nor does a disk copy of the removed version come back.
    let disk = m.mount_disk("a", "d1", "h:1", 1 << 20, "h").unwrap();
    let e = crate::proto::DiskEntry { key: "r".into(), size: 100, version: 6 };
    let got = m.update_disk_replicas("a", disk, &[e], &[], true).unwrap();
    assert!(matches!(got[0], Err(StoreError::NotFound(_))), "{got:?}");
    assert!(!m.exists("r").unwrap());
}

#[test]
fn a_plain_put_of_a_key_not_reported_yet_leaves_the_reported_value_an_upsert_replaces_it() {
    // Issue 48's soak: a value acknowledged just before a leader's kill was gone afterwards. A
    // put of the key (which leaves an existing value, and answers OK) reached the new master
    // before the key's holder reported; the master started it as a new object, and refused
    // the report as older.
    let m = master();
    let now = Instant::now();
    let mut w = FakeOwner::mount(&m, "w", 1 << 32);
    let put = put_on(&m, &mut w, "k", 100, &opts(1));
    m.put_start("w", "inflight", 100, &opts(1)).unwrap();
    let upserted = put_on(&m, &mut w, "u", 100, &upsert());
    let report = [owned("k", 5, 0, 100), owned("inflight", 6, 4096, 100), owned("u", 7, 8192, 100)];
    let r = m.remount_with_report_at("a", &info("a:1", 1 << 30), "h", &report, &[], now).unwrap();
    assert_eq!((r.reinstated, r.refused), (2, 1));
    // The plain puts' keys keep the values that were there first; their own objects go.
    assert_eq!(m.query("k").unwrap().version, 5);
    assert_eq!(m.query("k").unwrap().replicas[0].client_id, "a");
    assert_eq!(m.query("inflight").unwrap().version, 6);
    // The put in flight ends as a put of an existing key does: OK, the value left as it was.
    let c = m.put_end_begin("w", "inflight", None).unwrap();
    m.put_end_finish(&c).unwrap();
    assert_eq!(m.query("inflight").unwrap().version, 6);
    // Its range stays out of reuse until its put timeout (its writer may still be copying).
    assert!(m.quarantined_bytes() >= 256);
    let dropped: Vec<String> = w.news().into_iter().filter(|i| !i.commit).map(|i| i.key).collect();
    assert_eq!(dropped, ["k"], "the committed put's object is dropped by its owner (put {put})");
    // The upsert replaced the key: the older reported copy is refused.
    assert_eq!(m.query("u").unwrap().version, upserted);
}

#[test]
fn a_report_after_the_rebuild_window_is_refused() {
    let m = master();
    let late = Instant::now() + m.config().client_ttl + Duration::from_secs(1);
    let r = m.remount_with_report_at("a", &info("a:1", 1 << 30), "h", &[owned("k", 5, 0, 100)], &[], late).unwrap();
    assert_eq!((r.reinstated, r.refused), (0, 1), "its client was silent for the client TTL");
    assert!(!m.exists("k").unwrap());
}

#[test]
fn a_range_held_for_a_read_lease_stays_held_at_a_new_master() {
    // A forced removal under a read lease keeps the object's range out of reuse until the
    // lease ends; a master that takes over meanwhile learns the range from its owner.
    let m1 = master();
    let mut a = FakeOwner::mount(&m1, "a", 1 << 30);
    let ix = crate::client::owner_index::OwnerIndex::default();
    ix.mounted(m1.term(), a.segment, false);
    m1.put_start("w", "k", SEG, &opts(1)).unwrap();
    let c = m1.put_end_begin("w", "k", None).unwrap();
    let news = a.news();
    ix.apply(&OwnerNews { term: m1.term(), items: news, tasks_waiting: false }, Instant::now());
    a.ack(&m1);
    m1.put_end_finish(&c).unwrap();
    let lease = m1.get_replica_list("k").unwrap().lease_ttl;
    m1.remove("k", true).unwrap();
    let news = a.news();
    assert!(news[0].hold_ms > 0 && news[0].size == SEG, "{news:?}");
    let now = Instant::now();
    ix.apply(&OwnerNews { term: m1.term(), items: news, tasks_waiting: false }, now);
    assert!(ix.is_empty());
    // m1 goes; m2 is rebuilt from a's report.
    let m2 = master();
    let r = m2
        .remount_with_report_at("a", &info("a:1", 1 << 30), "h", &ix.report(now, |_, _, _| false), &ix.held(now), now)
        .unwrap();
    assert_eq!(r.reinstated, 0);
    let put = |at| m2.put_start_inner("w", "n", SEG, &opts(1), at);
    assert!(matches!(put(now), Err(StoreError::NoSpace { .. })), "a reader may still copy from k's range");
    put(now + lease + Duration::from_millis(10)).expect("room once the lease ended");
}

#[test]
fn a_leader_whose_lease_may_have_lapsed_refuses_writes_and_a_standby_knows_nothing() {
    let m = Master::with_role(MasterConfig::default(), crate::master::fence::Role::Standby { leader: None }).unwrap();
    let e = m.mount_segment("a", &info("a:1", 1 << 30), "h").unwrap_err();
    assert!(matches!(e, StoreError::NotLeader(_)), "{e:?}");
    let now = Instant::now();
    m.become_leader(42, now + Duration::from_secs(60), &[]);
    assert_eq!(m.term(), 42);
    m.mount_segment("a", &info("a:1", 1 << 30), "h").unwrap();
    m.put_start("a", "k", 10, &opts(1)).unwrap();
    m.put_end("a", "k").unwrap();
    // The lease was not renewed: the deadline passes.
    m.fence().lead(42, now);
    for e in [
        m.put_start("a", "k2", 10, &opts(1)).unwrap_err(),
        m.remove("k", true).unwrap_err(),
        m.get_replica_list("k").unwrap_err(),
    ] {
        assert!(matches!(e, StoreError::NotLeader(ref why) if why.contains("term 42")), "{e:?}");
    }
    assert!(matches!(m.ping("a"), crate::master::PingOutcome::NotLeader(_)));
    m.step_down(Some("10.0.0.9:50051".into()));
    let e = m.exists("k").unwrap_err();
    assert!(e.to_string().contains("the leader is 10.0.0.9:50051"), "{e}");
    m.become_leader(43, Instant::now() + Duration::from_secs(60), &[]);
    assert!(!m.exists("k").unwrap(), "a new leadership starts empty (reports rebuild it)");
}

#[test]
fn a_checksum_taken_at_the_put_goes_to_its_readers_its_owners_and_a_rebuilt_master() {
    let m = master();
    let mut a = FakeOwner::mount(&m, "a", 1 << 30);
    m.put_start("w", "k", 1000, &opts(1)).unwrap();
    let commit = m.put_end_begin("w", "k", Some(0)).unwrap();
    let told = a.news();
    assert_eq!(told[0].checksum, Some(crate::proto::Checksum { crc32: 0 }), "a CRC of 0 is one");
    a.ack(&m);
    m.put_end_finish(&commit).unwrap();
    assert_eq!(m.get_replica_list("k").unwrap().checksum, Some(0));
    // A put without one (an older client, a put session): none, and no news field either.
    m.put_start("w", "n", 10, &opts(1)).unwrap();
    let commit = m.put_end_begin("w", "n", None).unwrap();
    assert_eq!(a.news()[0].checksum, None);
    a.ack(&m);
    m.put_end_finish(&commit).unwrap();
    assert_eq!(m.get_replica_list("n").unwrap().checksum, None);
    // A batch commit: one per key, or another count refused.
    let keys: Vec<String> = vec!["b1".into(), "b2".into()];
    for k in &keys {
        m.put_start("w", k, 10, &opts(1)).unwrap();
    }
    let (refused, _) = m.put_end_begin_batch("w", &keys, &[Some(1)]);
    assert!(refused.iter().all(|c| matches!(c, Err(StoreError::InvalidArgument(_)))));
    let (commits, _) = m.put_end_begin_batch("w", &keys, &[Some(1), Some(2)]);
    a.ack(&m);
    assert!(m.put_end_finish_batch(commits).iter().all(Result::is_ok));
    assert_eq!(m.get_replica_list("b2").unwrap().checksum, Some(2));
    // A new master rebuilt from the owner's report keeps it.
    let rebuilt = master();
    let report = [OwnedObject { checksum: Some(crate::proto::Checksum { crc32: 0xabcd }), ..owned("k", 5, 0, 1000) }];
    rebuilt.remount_with_report_at("a", &info("a:1", 1 << 30), "h", &report, &[], Instant::now()).unwrap();
    assert_eq!(rebuilt.get_replica_list("k").unwrap().checksum, Some(0xabcd));
}

#[test]
fn a_removal_its_owner_did_not_acknowledge_is_unsettled_and_a_new_leader_inheriting_it_refuses_the_copy() {
    let m = master();
    let mut a = FakeOwner::mount(&m, "a", 1 << 30);
    let v = put_on(&m, &mut a, "k", 100, &opts(1));
    let kept = put_on(&m, &mut a, "kept", 100, &opts(1));
    let removal = m.remove("k", true).unwrap();
    let unsettled = removal.unsettled();
    assert_eq!(unsettled.len(), 1, "the owner has not acknowledged the drop: {unsettled:?}");
    assert_eq!(unsettled[0].key, "k");
    assert!(unsettled[0].mark > v, "the mark buries the removed version");
    // Once the owner acknowledged, nothing is left to record.
    let mut other = m.remove("kept", true).unwrap();
    a.ack(&m);
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
        .block_on(other.wait(Duration::from_millis(50)));
    assert!(other.unsettled().is_empty(), "an acknowledged removal is settled");

    // A new leader that inherited the record: the owner's report of the old copy is refused;
    // without the record it would be reinstated.
    let fresh = |inherited: &[crate::master::removal_records::Tombstone]| {
        let n = master();
        n.become_leader(7, Instant::now() + Duration::from_secs(60), inherited);
        let report = [owned("k", v, 0, 100), owned("kept2", kept, 4096, 100)];
        let r = n.remount_with_report_at("a", &info("a:1", 1 << 30), "h", &report, &[], Instant::now()).unwrap();
        (r.reinstated, n.exists("k").unwrap())
    };
    assert_eq!(fresh(&[]), (2, true), "without the record the removed copy comes back");
    assert_eq!(fresh(&unsettled), (1, false), "the inherited record buries it");
}

#[test]
fn a_removal_by_pattern_in_the_rebuild_window_buries_matching_keys_not_reported_yet() {
    let m = master();
    let now = Instant::now();
    // Nothing reported yet: both calls find nothing, and say so.
    assert_eq!(m.remove_by_regex("^tmp/", true).unwrap().0, (0, 0));
    let report = [owned("tmp/a", 5, 0, 100), owned("keep/b", 6, 4096, 100)];
    let r = m.remount_with_report_at("a", &info("a:1", 1 << 30), "h", &report, &[], now).unwrap();
    assert_eq!((r.reinstated, r.refused), (1, 1), "the matching key is refused, the other reinstated");
    assert!(!m.exists("tmp/a").unwrap() && m.exists("keep/b").unwrap());
    assert_eq!(m.remove_all(true).unwrap().0, (1, 0));
    let rb =
        m.remount_with_report_at("b", &info("b:1", 1 << 31), "h", &[owned("late/c", 7, 0, 100)], &[], now).unwrap();
    assert_eq!((rb.reinstated, rb.refused), (0, 1), "RemoveAll buries every older copy");
    // A put after the removal is newer than its mark.
    let mut b = FakeOwner::attach(&m, "b", rb.segment_id, 0);
    let _ = b.news();
    put_on(&m, &mut b, "tmp/new", 100, &opts(1));
    assert!(m.exists("tmp/new").unwrap());
}

// ---- pending commits: the owners told at the put's start ----

/// An owner whose news go into a real owner index (the client's), acknowledged when told.
struct IndexedOwner {
    fake: FakeOwner,
    index: crate::client::owner_index::OwnerIndex,
}

impl IndexedOwner {
    fn mount(m: &Master, client: &str, base: u64) -> IndexedOwner {
        let fake = FakeOwner::mount(m, client, base);
        let index = crate::client::owner_index::OwnerIndex::default();
        index.mounted(m.term(), fake.segment, false);
        IndexedOwner { fake, index }
    }

    /// Applies the news sent so far; acknowledges them when `ack`.
    fn apply(&mut self, m: &Master, ack: bool) -> Vec<OwnerNewsItem> {
        let items = self.fake.news();
        if !items.is_empty() {
            let news = OwnerNews { term: m.term(), items: items.clone(), tasks_waiting: false };
            let acked = self.index.apply(&news, Instant::now()).unwrap();
            if ack {
                m.owner_ack(&self.fake.client, m.term(), self.fake.segment, acked);
            }
        }
        items
    }
}

fn crc(bytes: &[u8]) -> u32 {
    crate::client::checksum::of_bytes(bytes)
}

#[test]
fn a_put_started_with_a_checksum_commits_without_waiting_for_its_owner_again() {
    let m = master();
    let mut a = IndexedOwner::mount(&m, "a", 1 << 30);
    m.put_start_checked("w", "k", 1000, &opts(1), Some(0xabcd), true).unwrap();
    // The owner learns of the placement at the start, with the checksum, and acknowledges
    // while the bytes move.
    let told = a.apply(&m, true);
    assert_eq!(told.len(), 1);
    assert!(told[0].commit && told[0].pending && told[0].key == "k" && told[0].size == 1000, "{told:?}");
    assert_eq!(told[0].checksum, Some(crate::proto::Checksum { crc32: 0xabcd }));
    assert!(told[0].hold_ms > 0, "the put timeout goes with it");
    assert!(!m.exists("k").unwrap(), "not visible before its end");
    // From here on the owner acknowledges nothing: the end does not wait for it.
    let commit = m.put_end_begin("w", "k", Some(0xabcd)).unwrap();
    assert!(commit.wait.is_empty(), "the pending commit was acknowledged: nothing to wait for");
    m.put_end_finish(&commit).unwrap();
    assert!(m.exists("k").unwrap());
    assert_eq!(m.get_replica_list("k").unwrap().checksum, Some(0xabcd));
    // The owner is told it is complete, behind the answer and lazily: with its next news, or
    // when the flush scheduled for it runs (the service runs it LAZY_NEWS_DELAY later).
    assert!(a.apply(&m, false).is_empty(), "not sent with the answer");
    assert!(m.lazy_news_unscheduled(), "a flush is to be scheduled");
    assert!(!m.lazy_news_unscheduled(), "once");
    m.flush_lazy_news();
    let complete = a.apply(&m, false);
    assert!(complete.len() == 1 && complete[0].commit && !complete[0].pending && complete[0].key == "k");
    assert!(!m.lazy_news_unscheduled(), "nothing left to send");
    // A put without a checksum commits as before: the end waits for the commit's acknowledgement.
    m.put_start_checked("w", "old", 10, &opts(1), None, true).unwrap();
    assert!(a.apply(&m, true).is_empty(), "nothing told at the start");
    let commit = m.put_end_begin("w", "old", None).unwrap();
    assert!(!commit.wait.is_empty());
}

#[test]
fn a_checksum_sent_behind_the_start_tells_the_owner_as_a_start_with_it_does() {
    let m = master();
    let mut a = IndexedOwner::mount(&m, "a", 1 << 30);
    m.put_start_checked("w", "k", 1000, &opts(1), None, true).unwrap();
    assert!(a.apply(&m, false).is_empty(), "nothing told at a start without a checksum");
    // Another client's checksum, or one for a key nobody puts: refused, nothing told.
    assert!(matches!(m.put_checksum("x", "k", 1), Err(StoreError::InvalidArgument(_))));
    assert!(m.put_checksum("w", "nope", 1).is_err());
    assert!(a.apply(&m, false).is_empty());
    // The writer's checksum: the owner learns the placement with it, a pending commit, and
    // acknowledges while the bytes move; the end then waits for nothing.
    m.put_checksum("w", "k", 0xabcd).unwrap();
    let told = a.apply(&m, true);
    assert!(told.len() == 1 && told[0].commit && told[0].pending && told[0].key == "k", "{told:?}");
    assert_eq!(told[0].checksum, Some(crate::proto::Checksum { crc32: 0xabcd }));
    // Sent again (a retry): nothing more to tell; another value's checksum is refused.
    m.put_checksum("w", "k", 0xabcd).unwrap();
    assert!(matches!(m.put_checksum("w", "k", 0xdcba), Err(StoreError::InvalidArgument(_))));
    assert!(a.apply(&m, false).is_empty());
    // (The end of a writer that verifies checksums carries it again, and readers get it.)
    let commit = m.put_end_begin("w", "k", Some(0xabcd)).unwrap();
    assert!(commit.wait.is_empty(), "the pending commit was acknowledged: nothing to wait for");
    m.put_end_finish(&commit).unwrap();
    assert_eq!(m.get_replica_list("k").unwrap().checksum, Some(0xabcd));
    // Committed: a late checksum changes nothing.
    m.put_checksum("w", "k", 0xabcd).unwrap();
    assert!(a.apply(&m, false).is_empty());
}

#[test]
fn in_a_stream_of_puts_each_put_costs_its_owner_one_message_and_one_acknowledgement() {
    // A put started with a checksum tells its owner at the start (pending) and, once
    // committed, that it is complete; the complete news waits for the next put's pending one,
    // so that the owner (and the master) handle one message per put, not two.
    let m = master();
    let mut a = IndexedOwner::mount(&m, "a", 1 << 30);
    let puts = 20;
    let mut messages = 0;
    for i in 0..puts {
        let key = format!("k{i}");
        m.put_start_checked("w", &key, 1000, &opts(1), Some(i), true).unwrap();
        while let Ok(n) = a.fake.rx.try_recv() {
            messages += 1;
            let acked = a.index.apply(&n, Instant::now()).unwrap();
            m.owner_ack("a", m.term(), a.fake.segment, acked);
        }
        let commit = m.put_end_begin("w", &key, Some(i)).unwrap();
        assert!(commit.wait.is_empty(), "the pending news was acknowledged");
        m.put_end_finish(&commit).unwrap();
    }
    assert_eq!(messages, puts, "one message per put: each start's, carrying the last put's completion");
    m.flush_lazy_news();
    let last = a.apply(&m, true);
    assert!(last.len() == 1 && last[0].key == format!("k{}", puts - 1) && !last[0].pending, "{last:?}");
    // The owner's index holds every object as complete: it reports them all to a new master
    // without looking at their bytes (a pending one whose bytes did not match would go).
    let reported = a.index.report(Instant::now(), |_, _, _| false);
    assert_eq!(reported.len(), puts as usize, "{reported:?}");
}

#[test]
fn a_pending_commit_its_owner_never_acknowledged_fails_the_put_as_before() {
    let m = master();
    let mut a = FakeOwner::mount(&m, "a", 1 << 30);
    m.put_start_checked("w", "k", 1000, &opts(1), Some(7), true).unwrap();
    assert!(a.news()[0].pending);
    let commit = m.put_end_begin("w", "k", None).unwrap();
    assert!(!commit.wait.is_empty(), "waits for the pending commit's acknowledgement");
    let e = m.put_end_finish(&commit).unwrap_err();
    assert!(matches!(e, StoreError::OwnersUnreachable(ref k) if k == "k"), "{e:?}");
    assert!(!m.exists("k").unwrap());
    // The owner is told to drop it; the range waits for that.
    let drop = a.news();
    assert!(drop.len() == 1 && !drop[0].commit && drop[0].key == "k", "{drop:?}");
    assert_eq!(m.quarantined_bytes(), 1024);
    a.ack(&m);
    assert_eq!(m.quarantined_bytes(), 0);
}

#[test]
fn a_revoked_or_changed_pending_put_is_dropped_at_its_owner_before_the_answer() {
    let m = master();
    let mut a = IndexedOwner::mount(&m, "a", 1 << 30);
    m.put_start_checked("w", "r", 1000, &opts(1), Some(1), true).unwrap();
    a.apply(&m, true);
    assert_eq!(a.index.len(), 1, "pending at the owner");
    // Revoked: the answer waits for the owner's drop (a new master then cannot bring it back).
    let wait = m.put_revoke("w", "r").unwrap();
    assert!(!wait.is_empty());
    assert!(!a.apply(&m, true)[0].commit);
    assert!(a.index.is_empty());
    assert_eq!(m.quarantined_bytes(), 0);
    // A revoke of a put without a checksum has nothing to wait for, as before.
    m.put_start_checked("w", "plain", 1000, &opts(1), None, true).unwrap();
    assert!(m.put_revoke("w", "plain").unwrap().is_empty());
    // An end whose checksum is not the start's: the value changed while written.
    m.put_start_checked("w", "c", 1000, &opts(1), Some(1), true).unwrap();
    a.apply(&m, true);
    let e = m.put_end_begin("w", "c", Some(2)).unwrap_err();
    assert!(matches!(e, StoreError::InvalidArgument(_)), "{e:?}");
    assert!(!m.exists("c").unwrap());
    assert!(!a.apply(&m, true)[0].commit, "dropped at its owner");
    assert!(a.index.is_empty());
}

#[test]
fn a_pending_put_whose_space_expired_ends_with_not_found_and_leaves_nothing() {
    let config = MasterConfig { put_timeout: Duration::from_secs(1), ..MasterConfig::default() };
    let m = Master::new(config).unwrap();
    m.state.lock().instant_acks = false;
    let mut a = IndexedOwner::mount(&m, "a", 1 << 30);
    m.put_start_checked("a", "late", 1000, &opts(1), Some(1), true).unwrap();
    a.apply(&m, true);
    // Reclaimed after the put timeout (within the client TTL: the writer is still alive).
    m.sweep_at(Instant::now() + Duration::from_secs(2));
    let e = m.put_end_begin("a", "late", Some(1)).unwrap_err();
    assert!(matches!(e, StoreError::NotFound(ref k) if k == "late"), "{e:?}");
    assert!(!a.apply(&m, true)[0].commit, "the owner drops it");
    assert!(a.index.is_empty());
    assert_eq!(m.quarantined_bytes(), 0);
}

#[test]
fn a_forced_removal_racing_a_pending_put_leaves_nothing_at_its_owner() {
    let m = master();
    let mut a = IndexedOwner::mount(&m, "a", 1 << 30);
    m.put_start_checked("w", "k", 1000, &opts(1), Some(3), true).unwrap();
    a.apply(&m, true);
    // While the bytes move, the key cannot be removed, even forced: it is not committed.
    assert!(matches!(m.remove("k", true), Err(StoreError::NotReady(_))));
    let commit = m.put_end_begin("w", "k", Some(3)).unwrap();
    m.put_end_finish(&commit).unwrap();
    m.get_replica_list("k").unwrap(); // a reader's lease
                                      // Removed (forced, under the lease) before the owner heard it is complete: the owner gets
                                      // both news in order and ends with nothing, and the removal waits for that.
    let wait = m.remove("k", true).unwrap();
    assert!(!wait.is_empty());
    let told = a.apply(&m, true);
    assert_eq!(told.iter().map(|i| (i.commit, i.pending)).collect::<Vec<_>>(), [(true, false), (false, false)]);
    assert!(a.index.is_empty());
    assert!(a.index.report(Instant::now(), |_, _, _| true).is_empty(), "nothing to bring back");
    assert!(!m.exists("k").unwrap());
}

#[test]
fn a_new_master_keeps_a_pending_put_whose_bytes_match_and_drops_a_torn_one() {
    let m = master();
    let base = 1 << 30;
    let mut a = IndexedOwner::mount(&m, "a", base);
    let mut segment = vec![0u8; SEG as usize];
    let (done, torn) = (vec![7u8; 3000], vec![9u8; 2000]);
    let offset = |key: &str, value: &[u8]| {
        let (replicas, _) =
            m.put_start_checked("w", key, value.len() as u64, &opts(1), Some(crc(value)), true).unwrap();
        replicas[0].address - base
    };
    let (done_at, torn_at) = (offset("done", &done), offset("torn", &torn));
    a.apply(&m, true);
    // "done" was written whole and answered OK; the owner never heard it is complete (the
    // master went first). "torn" is half written: its writer was still copying.
    segment[done_at as usize..][..done.len()].copy_from_slice(&done);
    segment[torn_at as usize..][..1000].copy_from_slice(&torn[..1000]);
    let commit = m.put_end_begin("w", "done", None).unwrap();
    assert!(commit.wait.is_empty());
    m.put_end_finish(&commit).unwrap();
    // A new master: the owner settles its pending commits by their bytes, then reports.
    let now = Instant::now();
    a.index.unmount();
    let holds = |off: u64, size: u64, crc32: u32| crc(&segment[off as usize..(off + size) as usize]) == crc32;
    let report = a.index.report(now, holds);
    let held = a.index.held(now);
    assert_eq!(report.iter().map(|o| o.key.as_str()).collect::<Vec<_>>(), ["done"]);
    assert_eq!(report[0].checksum, Some(crate::proto::Checksum { crc32: crc(&done) }));
    assert_eq!((held.len(), held[0].offset, held[0].size), (1, torn_at, 2000), "the torn range stays held");
    assert!(held[0].remaining_ms > 0 && held[0].remaining_ms <= m.config().put_timeout.as_millis() as u64);
    let rebuilt = master();
    let r = rebuilt.remount_with_report_at("a", &info("a:1", base), "h", &report, &held, now).unwrap();
    assert_eq!((r.reinstated, r.refused), (1, 0));
    let list = rebuilt.get_replica_list("done").unwrap();
    assert_eq!((list.size, list.replicas[0].address), (3000, base + done_at));
    assert!(!rebuilt.exists("torn").unwrap(), "nothing half-written is readable");
    assert!(rebuilt.quarantined_bytes() >= 2000, "the torn range is not reused while its writer may write");
    // Settled once: a later report does not look at the bytes again.
    assert_eq!(a.index.report(now, |_, _, _| false).len(), 1);
}

#[test]
fn a_batch_start_tells_each_owner_of_its_pending_commits_once() {
    // BatchPutStart: the pending commits of all its keys go to each owner in one message,
    // sent when the batch has been placed (`flush_owner_news`), not one per key.
    let m = master();
    let mut a = FakeOwner::mount(&m, "a", 1 << 30);
    let mut b = FakeOwner::mount(&m, "b", 1 << 31);
    for i in 0..12 {
        m.put_start_checked("w", &format!("k{i}"), 1000, &opts(1), Some(i), false).unwrap();
    }
    assert!(a.rx.try_recv().is_err() && b.rx.try_recv().is_err(), "nothing sent before the batch ends");
    m.flush_owner_news();
    let mut items = 0;
    for owner in [&mut a, &mut b] {
        let mut messages = 0;
        while let Ok(n) = owner.rx.try_recv() {
            messages += 1;
            items += n.items.len();
            assert!(n.items.iter().all(|i| i.pending && i.commit));
        }
        assert!(messages <= 1, "one message per owner, not one per key: {messages}");
    }
    assert_eq!(items, 12, "one item per key");
}

#[test]
fn a_removal_is_settled_once_a_linked_disk_with_a_copy_acknowledged_it() {
    // Issue 48's hour soak: every forced remove of a disk-backed key was recorded in etcd,
    // since disks heard of removals on pings only. A disk whose client keeps an owner stream
    // for it is told at once, and the removal needs no record once it acknowledged.
    let m = master();
    let mut a = FakeOwner::mount(&m, "a", 1 << 30);
    let disk = m.mount_disk_linked("a", "d1", "h:1", 1 << 20, "h", true).unwrap();
    let mut d = FakeOwner::attach(&m, "a", disk, 0);
    let old = m.mount_disk("b", "d2", "h:2", 1 << 20, "h").unwrap(); // an older client: no link
    let mut on_disks = |key: &str, disks: &[u64]| {
        let v = put_on(&m, &mut a, key, 100, &opts(1));
        for &disk in disks {
            let e = crate::proto::DiskEntry { key: key.into(), size: 100, version: v };
            let client = if disk == old { "b" } else { "a" };
            assert!(m.update_disk_replicas(client, disk, &[e], &[], false).unwrap()[0].is_ok());
        }
        v
    };
    let v = on_disks("k", &[disk]);
    on_disks("both", &[disk, old]);

    let removal = m.remove("k", true).unwrap();
    let told = d.news();
    assert_eq!(told.len(), 1);
    assert!(!told[0].commit && told[0].key == "k" && told[0].version == v && told[0].segment_id == disk);
    let unsettled = |r: &crate::master::removal_records::Removal| -> Vec<String> {
        r.unsettled().into_iter().map(|t| t.key).collect()
    };
    assert_eq!(unsettled(&removal), ["k"], "not acknowledged yet: a record is needed");
    a.ack(&m);
    assert_eq!(unsettled(&removal), ["k"], "the disk has not acknowledged yet");
    d.ack(&m);
    assert!(unsettled(&removal).is_empty(), "every copy acknowledged: nothing to record");

    // A copy on a disk without a link still needs its record, whatever the others did.
    let removal = m.remove("both", true).unwrap();
    a.ack(&m);
    d.ack(&m);
    assert_eq!(unsettled(&removal), ["both"]);
}

// ---- blanks: placements granted ahead of the puts ----

/// A blank's value and record, as a writer puts them into `segment` (the owner's memory).
fn write_blank(segment: &mut [u8], offset: u64, id: u64, key: &str, value: &[u8]) {
    let record = crate::blank_record::Record {
        blank: id,
        key: key.into(),
        size: value.len() as u64,
        crc: crc(value),
        hard_pin: true,
        soft_pin_ms: 0,
    };
    let at = offset as usize;
    segment[at..][..value.len()].copy_from_slice(value);
    let record = record.encode().unwrap();
    segment[at + value.len()..][..record.len()].copy_from_slice(&record);
}

/// The owner settles its blanks and reports, as it does for a new master.
fn report_to_new_master(
    a: &IndexedOwner,
    segment: &[u8],
    now: Instant,
) -> (usize, Vec<OwnedObject>, Vec<crate::proto::HeldRange>) {
    a.index.unmount();
    let holds = |off: u64, size: u64, crc32: u32| {
        segment.get(off as usize..(off + size) as usize).is_some_and(|b| crc(b) == crc32)
    };
    let record =
        |off: u64| segment.get(off as usize..(off + crate::blank_record::RECORD_MAX) as usize).map(<[u8]>::to_vec);
    let settled = a.index.settle_blanks(now, record, holds);
    (settled, a.index.report(now, holds), a.index.held(now))
}

#[test]
fn a_put_in_a_blank_is_one_call_and_a_new_master_keeps_it_by_its_record() {
    let m = master();
    let base = 1 << 30;
    let mut a = IndexedOwner::mount(&m, "a", base);
    let (granted, wait) = m.grant_blanks("w", 3000, 2).unwrap();
    assert_eq!(granted.len(), 2);
    assert!(!wait.is_empty(), "the grant answers once the owner knows its blanks");
    let told = a.apply(&m, true);
    assert!(told.iter().all(|i| i.blank && i.commit && i.pending && i.key.is_empty() && i.hold_ms > 0), "{told:?}");
    assert_eq!(told.iter().map(|i| i.size).collect::<Vec<_>>(), [3512, 3512], "the value and its record");
    assert!(!m.exists("k").unwrap());
    // The writer puts the value and its record in the first blank, then commits: one call,
    // answered without a further word from the owner.
    let mut segment = vec![0u8; SEG as usize];
    let value = vec![5u8; 3000];
    let (id, at) = (granted[0].id, granted[0].replica.address - base);
    write_blank(&mut segment, at, id, "k", &value);
    let (done, wait) = m.commit_blank_default("w", "k", id, 3000, crc(&value));
    done.unwrap();
    assert!(wait.is_empty());
    let list = m.get_replica_list("k").unwrap();
    assert_eq!((list.size, list.replicas[0].address, list.checksum), (3000, base + at, Some(crc(&value))));
    assert!(a.apply(&m, false).is_empty(), "the owner learns of it behind the answer");
    assert_eq!(m.blanks_held(), 1);
    // The master goes before the owner heard of the commit: the owner reads the record and
    // reports the object; the unused blank's range stays held for its writer.
    let now = Instant::now();
    let (settled, report, held) = report_to_new_master(&a, &segment, now);
    assert_eq!(settled, 1);
    assert_eq!(report.iter().map(|o| (o.key.as_str(), o.version, o.size)).collect::<Vec<_>>(), [("k", id, 3000)]);
    assert!(report[0].hard_pin, "its record carries its pins");
    let other = granted[1].replica.address - base;
    assert_eq!(held.iter().map(|h| (h.offset, h.size)).collect::<Vec<_>>(), [(other, 3512)]);
    let rebuilt = master();
    let r = rebuilt.remount_with_report_at("a", &info("a:1", base), "h", &report, &held, now).unwrap();
    assert_eq!((r.reinstated, r.refused), (1, 0));
    let list = rebuilt.get_replica_list("k").unwrap();
    assert_eq!((list.size, list.replicas[0].address, list.checksum), (3000, base + at, Some(crc(&value))));
    // The unused blank is not this master's: a commit in it puts the usual way.
    let (done, _) = rebuilt.commit_blank_default("w", "k2", granted[1].id, 3000, 1);
    assert!(matches!(done, Err(StoreError::BlankGone(_))), "{done:?}");
    assert!(!rebuilt.exists("k2").unwrap());
    assert!(rebuilt.quarantined_bytes() >= 3512, "its range is not reused while its writer may write");
}

#[test]
fn a_blank_written_but_not_committed_or_torn_is_settled_by_its_bytes() {
    let m = master();
    let base = 1 << 30;
    let mut a = IndexedOwner::mount(&m, "a", base);
    let (granted, _) = m.grant_blanks("w", 1000, 4).unwrap();
    a.apply(&m, true);
    let mut segment = vec![0u8; SEG as usize];
    let at = |i: usize| granted[i].replica.address - base;
    let value = vec![3u8; 1000];
    // 0: written whole, its commit never came (the writer or the master went first): kept,
    // as a put whose answer was lost. 1: torn (the value's bytes do not match the record).
    // 2: a record naming another blank. 3: never written.
    write_blank(&mut segment, at(0), granted[0].id, "whole", &value);
    write_blank(&mut segment, at(1), granted[1].id, "torn", &value);
    segment[at(1) as usize + 10] ^= 1;
    write_blank(&mut segment, at(2), granted[0].id, "stray", &value);
    let (settled, report, held) = report_to_new_master(&a, &segment, Instant::now());
    assert_eq!(settled, 1);
    assert_eq!(report.iter().map(|o| o.key.as_str()).collect::<Vec<_>>(), ["whole"]);
    let mut held: Vec<u64> = held.iter().map(|h| h.offset).collect();
    held.sort();
    let mut expected = vec![at(1), at(2), at(3)];
    expected.sort();
    assert_eq!(held, expected, "nothing half-written is reported; its range waits for its writer");
}

#[test]
fn a_commit_in_a_blank_gone_expired_or_not_the_callers_stores_nothing() {
    let m = master();
    let mut a = IndexedOwner::mount(&m, "a", 1 << 30);
    let (granted, _) = m.grant_blanks("w", 1000, 3).unwrap();
    a.apply(&m, true);
    let ids: Vec<u64> = granted.iter().map(|g| g.id).collect();
    let gone = |r: (crate::error::Result<()>, _)| matches!(r.0, Err(StoreError::BlankGone(_)));
    assert!(gone(m.commit_blank_default("w", "k", 12345, 1000, 1)), "unknown");
    assert!(gone(m.commit_blank_default("x", "k", ids[0], 1000, 1)), "another client's");
    let (wrong, _) = m.commit_blank_default("w", "k", ids[0], 999, 1);
    assert!(matches!(wrong, Err(StoreError::InvalidArgument(_))), "{wrong:?}");
    assert!(a.apply(&m, false).is_empty(), "refusals leave the blank as it was");
    // Expired: given back, its owner told, its range free once the owner acknowledged.
    let late = Instant::now() + m.config().blank_ttl + Duration::from_secs(1);
    let (expired, wait) = m.commit_blank_at("w", "k", ids[0], 1000, 1, &pinned(), late);
    assert!(matches!(expired, Err(StoreError::BlankGone(_))), "{expired:?}");
    assert!(!wait.is_empty(), "answered once its owner dropped it");
    assert!(m.quarantined_bytes() > 0);
    let dropped = a.apply(&m, true);
    assert!(dropped.len() == 1 && dropped[0].blank && !dropped[0].commit && dropped[0].version == ids[0]);
    assert_eq!(m.quarantined_bytes(), 0);
    assert!(gone(m.commit_blank_default("w", "k", ids[0], 1000, 1)), "used once");
    // A key that exists: the blank goes back (its record may name the key) before the answer.
    let (_, _) = m.put_start("w", "k", 10, &opts(1)).unwrap();
    let commit = m.put_end_begin("w", "k", None).unwrap();
    a.apply(&m, true);
    m.put_end_finish(&commit).unwrap();
    let (exists, wait) = m.commit_blank_default("w", "k", ids[1], 1000, 1);
    assert!(matches!(exists, Err(StoreError::AlreadyExists(_))), "{exists:?}");
    assert!(!wait.is_empty());
    assert!(a.apply(&m, true).iter().any(|i| i.blank && !i.commit && i.version == ids[1]));
    assert_eq!(m.get_replica_list("k").unwrap().size, 10, "the value put first stays");
    assert_eq!(m.blanks_held(), 1);
}

#[test]
fn a_forced_removal_racing_a_blank_commit_leaves_nothing_at_its_owner() {
    let m = master();
    let mut a = IndexedOwner::mount(&m, "a", 1 << 30);
    let (granted, _) = m.grant_blanks("w", 1000, 1).unwrap();
    a.apply(&m, true);
    m.commit_blank_default("w", "k", granted[0].id, 1000, 7).0.unwrap();
    m.get_replica_list("k").unwrap(); // a reader's lease
                                      // Removed (forced, under the lease) before the owner heard of the commit: the owner gets
                                      // both news in order and ends with nothing, and the removal's answer waits for that.
    let wait = m.remove("k", true).unwrap();
    assert!(!wait.is_empty());
    let told = a.apply(&m, true);
    assert_eq!(told.iter().map(|i| (i.commit, i.blank)).collect::<Vec<_>>(), [(true, false), (false, false)]);
    assert!(a.index.is_empty());
    let mut segment = vec![0u8; SEG as usize];
    write_blank(&mut segment, granted[0].replica.address - (1 << 30), granted[0].id, "k", &[0u8; 1000]);
    let (settled, report, _) = report_to_new_master(&a, &segment, Instant::now());
    assert_eq!((settled, report.len()), (0, 0), "no rebuilt master brings it back");
}

#[test]
fn blanks_are_bounded_expire_and_go_with_their_dropped_client() {
    let blank = (10_000 + crate::blank_record::RECORD_MAX).next_multiple_of(256);
    let config = MasterConfig {
        blank_bytes_per_client: 3 * blank + 100,
        blank_ttl: Duration::from_secs(1),
        ..MasterConfig::default()
    };
    let m = Master::new(config.clone()).unwrap();
    m.state.lock().instant_acks = false;
    let mut a = IndexedOwner::mount(&m, "a", 1 << 30);
    // Bounded per client: three of them, not five (the segment would hold five).
    let (granted, _) = m.grant_blanks("w", 10_000, 5).unwrap();
    assert_eq!(granted.len(), 3);
    assert!(m.grant_blanks("w", 10_000, 1).unwrap().0.is_empty());
    assert!(matches!(m.grant_blanks("w", 0, 1), Err(StoreError::InvalidArgument(_))));
    a.apply(&m, true);
    // Their time runs out: the sweep takes them back, through the owner.
    m.sweep_at(Instant::now() + Duration::from_secs(2));
    assert_eq!(m.blanks_held(), 0);
    assert_eq!(m.quarantined_bytes(), 3 * blank);
    let dropped = a.apply(&m, true);
    assert_eq!(dropped.iter().filter(|i| i.blank && !i.commit).count(), 3);
    assert_eq!(m.quarantined_bytes(), 0);
    assert_eq!(m.grant_blanks("w", 10_000, 5).unwrap().0.len(), 3, "the space and the bound came back");

    // A known client (one with a segment, too small for a blank) that goes silent loses its
    // blanks at once.
    let m = Master::new(MasterConfig { client_ttl: Duration::from_millis(50), ..config }).unwrap();
    m.state.lock().instant_acks = false;
    let mut a = IndexedOwner::mount(&m, "a", 1 << 30);
    m.mount_segment("c", &SegmentInfo { name: "c:1".into(), base: 1 << 32, size: 4096, tier: 0 }, "h").unwrap();
    assert_eq!(m.grant_blanks("c", 10_000, 2).unwrap().0.len(), 2);
    a.apply(&m, true);
    for _ in 0..10 {
        std::thread::sleep(Duration::from_millis(10));
        m.ping("a");
    }
    m.sweep_at(Instant::now());
    assert_eq!(m.blanks_held(), 0);
    assert_eq!(a.apply(&m, true).iter().filter(|i| i.blank && !i.commit).count(), 2);
}

#[test]
fn no_blanks_when_they_are_off() {
    let m = Master::new(MasterConfig { blank_ttl: Duration::ZERO, ..MasterConfig::default() }).unwrap();
    let _a = FakeOwner::mount(&m, "a", 1 << 30);
    assert!(m.grant_blanks("w", 1000, 4).unwrap().0.is_empty());
}

fn pinned() -> PutOptions {
    PutOptions { hard_pin: true, ..Default::default() }
}

impl Master {
    /// A commit in a blank of a hard-pinned put (as `write_blank` records it).
    fn commit_blank_default(
        &self,
        client: &str,
        key: &str,
        id: u64,
        size: u64,
        crc: u32,
    ) -> (crate::error::Result<()>, super::AckWait) {
        self.commit_blank(client, key, id, size, crc, &pinned())
    }
}
