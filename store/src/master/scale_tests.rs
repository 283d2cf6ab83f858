//! Eviction's order and protections in a store of a million objects.

use super::*;
use crate::proto::PutOptions;
use thin_vec::ThinVec;

const SIZE: u64 = 4096;
/// Ordinary objects besides the few of each kind below.
const FILL: u64 = 1_000_000;
const FEW: usize = 10;

fn key(kind: &str, i: impl std::fmt::Display) -> String {
    format!("{kind}{i}")
}

impl Master {
    /// Commits objects of `size` bytes one after the other as puts and their commits leave
    /// them (placed by the allocator, the most recently used last), without each call's
    /// checks, news and events: a million of them in seconds in a debug build.
    fn fill(&self, client: &str, keys: impl Iterator<Item = String>, size: u64) {
        self.fill_with_news(client, keys, size, None)
    }

    /// [`Self::fill`], each replica known to its owner as of commit news `seq` (its drop is
    /// news for the owner, its range quarantined until acknowledged).
    fn fill_with_news(&self, client: &str, keys: impl Iterator<Item = String>, size: u64, seq: Option<u64>) {
        let now = Instant::now();
        let mut st = self.lock_all();
        for key in keys {
            let blocks = allocation::allocate(
                &mut st.core,
                &*self.allocator,
                access::DEFAULT_TENANT,
                size,
                1,
                &PutOptions::default(),
            )
            .unwrap();
            let version = st.core.next_version;
            st.core.next_version += 1;
            let writer = Some(st.core.names.writer(client, None));
            let object = Object {
                size,
                version,
                replicas: blocks.into_iter().map(|(id, block)| Replica::new(id, block, seq)).collect(),
                ssd: ThinVec::new(),
                complete: true,
                writer,
                started: Stamp::of(now),
                lease_until: None,
                soft_pin_until: None,
                hard_pin: false,
                offload_held_until: None,
                checksum: Default::default(),
            };
            st.objects.insert(key, object);
        }
    }
}

#[test]
fn eviction_order_and_protections_hold_at_a_million_objects() {
    // Nothing evicts until the segment is full; then one eviction frees 1 % of it.
    let config = MasterConfig {
        eviction_high_watermark: 1.0,
        eviction_ratio: 0.01,
        lease_ttl: Duration::from_secs(60),
        ..MasterConfig::default()
    };
    let m = Master::new(config).unwrap();
    let specials = 6 * FEW as u64;
    let capacity = (FILL + specials) * SIZE;
    let info = SegmentInfo { name: "s1".into(), base: 1 << 40, size: capacity, tier: Tier::Dram as i32 };
    m.mount_segment("c1", &info, "h").unwrap();
    let plain = PutOptions::default();
    let put = |k: &str, opts: &PutOptions| {
        m.put_start("c1", k, SIZE, opts).unwrap();
        m.put_end("c1", k).unwrap();
    };
    // The eviction runs an hour from now: leases granted now have ended by then, the ones
    // granted for then have not.
    let now = Instant::now();
    let later = now + Duration::from_secs(3600);
    let hard = PutOptions { hard_pin: true, ..Default::default() };
    let soft = PutOptions { soft_pin_ttl_ms: 2 * 3600 * 1000, ..Default::default() };
    // The oldest objects, in this order: probed (only asked about: no change of order), read
    // again at the end (most recently used then), leased for the eviction's time, hard- and
    // soft-pinned, and puts never ended.
    for i in 0..FEW {
        put(&key("probed", i), &plain);
    }
    for i in 0..FEW {
        put(&key("read", i), &plain);
    }
    for i in 0..FEW {
        put(&key("leased", i), &plain);
        m.get_replica_list_inner(&key("leased", i), later).unwrap();
    }
    for i in 0..FEW {
        put(&key("hard", i), &hard);
        put(&key("soft", i), &soft);
        m.put_start("c1", &key("unfinished", i), SIZE, &plain).unwrap();
    }
    m.fill("c1", (0..FILL).map(|i| key("k", i)), SIZE);
    assert_eq!(m.totals().used, capacity, "full, and nothing evicted yet");
    for i in 0..FEW {
        assert!(m.exists(&key("probed", i)).unwrap());
        m.query(&key("probed", i)).unwrap();
        m.get_replica_list_inner(&key("read", i), now).unwrap();
    }

    // The next put finds no room: it evicts the one object it needs, then (no evictor thread
    // here: the put runs its steps) a round of 1 % of the capacity, least recently used first,
    // EVICTION_STEP objects per step.
    m.put_start_inner("c1", "trigger", SIZE, &plain, later).unwrap();
    let evicted = 1 + ((capacity as f64 * 0.01) as u64).div_ceil(SIZE);
    assert_eq!(m.metrics().evictions.get(), evicted);
    for i in 0..FEW {
        assert!(!m.exists(&key("probed", i)).unwrap(), "probing does not make an object recent");
        assert!(m.exists(&key("read", i)).unwrap(), "read again: recently used");
        assert!(m.exists(&key("leased", i)).unwrap(), "leased when the eviction ran");
        assert!(m.exists(&key("hard", i)).unwrap(), "hard-pinned");
        assert!(m.exists(&key("soft", i)).unwrap(), "soft-pinned when the eviction ran");
        assert_eq!(m.query(&key("unfinished", i)).unwrap().replicas.len(), 1, "an unfinished put keeps its space");
    }
    // The rest of the victims are the oldest ordinary objects, in the order they were put.
    let ordinary = evicted - FEW as u64;
    let gone: Vec<bool> = (0..FILL).map(|i| !m.exists(&key("k", i)).unwrap()).collect();
    let first_kept = gone.iter().position(|g| !g).unwrap() as u64;
    assert_eq!(first_kept, ordinary, "the {ordinary} oldest went");
    assert_eq!(gone.iter().filter(|g| **g).count() as u64, ordinary, "and no other");
    assert_eq!(m.totals().keys, FILL + specials + 1 - evicted);
}

#[test]
fn an_eviction_round_takes_the_oldest_in_order_across_its_steps() {
    // The put that passes half the capacity evicts 35 % of it: many steps.
    let n = 40 * EVICTION_STEP as u64;
    let config = MasterConfig {
        eviction_high_watermark: 0.5,
        eviction_ratio: 0.35,
        lease_ttl: Duration::from_secs(60),
        ..MasterConfig::default()
    };
    let m = Master::new(config).unwrap();
    let info = SegmentInfo { name: "s1".into(), base: 1 << 40, size: n * SIZE, tier: Tier::Dram as i32 };
    m.mount_segment("c1", &info, "h").unwrap();
    let later = Instant::now() + Duration::from_secs(3600);
    // Half the capacity; every seventh of the first 2000 is leased when the eviction runs
    // (and, read, moves behind the others of those 2000).
    m.fill("c1", (0..2000).map(|i| key("k", i)), SIZE);
    let leased = |i: u64| i < 2000 && i.is_multiple_of(7);
    for i in (0..2000).filter(|i| leased(*i)) {
        m.get_replica_list_inner(&key("k", i), later).unwrap();
    }
    m.fill("c1", (2000..n / 2).map(|i| key("k", i)), SIZE);
    assert_eq!(m.metrics().evictions.get(), 0);
    m.put_start_inner("c1", "trigger", SIZE, &PutOptions::default(), later).unwrap();

    let evicted = (((n * SIZE) as f64 * 0.35) as u64).div_ceil(SIZE);
    assert!(evicted > 10 * EVICTION_STEP as u64);
    assert_eq!(m.metrics().evictions.get(), evicted);
    let expected: Vec<u64> = (0..n / 2).filter(|i| !leased(*i)).take(evicted as usize).collect();
    let gone: Vec<u64> = (0..n / 2).filter(|i| !m.exists(&key("k", *i)).unwrap()).collect();
    assert_eq!(gone, expected, "the oldest unleased objects, and only they");
    assert_eq!(m.query("trigger").unwrap().replicas.len(), 1, "the put that passed the watermark is placed");
}

#[test]
fn a_put_above_the_watermark_leaves_the_round_to_the_evictor_which_takes_it_in_steps() {
    let n = 40 * EVICTION_STEP as u64;
    let config = MasterConfig { eviction_high_watermark: 0.5, eviction_ratio: 0.35, ..MasterConfig::default() };
    let m = Master::new(config).unwrap();
    let info = SegmentInfo { name: "s1".into(), base: 1 << 40, size: n * SIZE, tier: Tier::Dram as i32 };
    m.mount_segment("c1", &info, "h").unwrap();
    m.fill("c1", (0..n / 2).map(|i| key("k", i)), SIZE);
    // As if the evictor thread ran: the put only asks for the round.
    m.evictor.running.store(true, Ordering::Release);
    let now = Instant::now();
    m.put_start_inner("c1", "trigger", SIZE, &PutOptions::default(), now).unwrap();
    assert_eq!(m.metrics().evictions.get(), 0, "the put evicted nothing itself");
    assert!(*m.evictor.wanted.lock(), "it asked the evictor for a round");
    assert!(m.exists("k0").unwrap());

    let evicted = (((n * SIZE) as f64 * 0.35) as u64).div_ceil(SIZE);
    let mut steps = 0;
    loop {
        let before = m.metrics().evictions.get();
        let more = m.evict_step(now, EVICTION_STEP);
        let taken = m.metrics().evictions.get() - before;
        assert!(taken <= EVICTION_STEP as u64, "step {steps} took {taken} objects");
        steps += 1;
        if !more {
            break;
        }
    }
    assert_eq!(m.metrics().evictions.get(), evicted, "the round freed its share of the capacity");
    assert!(steps as u64 >= evicted.div_ceil(EVICTION_STEP as u64), "{steps} steps");
    // And mostly full ones, of 256 objects: each step's fixed cost (every shard's lock taken
    // twice, the global one once a shard) spread over that many.
    assert!(steps as u64 <= 2 * evicted.div_ceil(256), "{steps} steps for {evicted} objects");
    let gone: Vec<u64> = (0..n / 2).filter(|i| !m.exists(&key("k", *i)).unwrap()).collect();
    assert_eq!(gone, (0..evicted).collect::<Vec<_>>(), "the oldest went, in order");
    assert!(!m.evict_step(now, EVICTION_STEP), "below the watermark now: no new round");
    assert_eq!(m.metrics().evictions.get(), evicted);
}

/// Four owners with streams (acknowledging only when told), and a store filled so that a round
/// evicts 35 % of the capacity, some 23 steps, each taking objects of every owner.
type OwnerStream = (String, u64, tokio::sync::mpsc::UnboundedReceiver<crate::proto::OwnerNews>);
fn four_owners_above_the_watermark() -> (Arc<Master>, Vec<OwnerStream>, u64) {
    let per_owner = 4096;
    let config = MasterConfig { eviction_high_watermark: 0.5, eviction_ratio: 0.35, ..MasterConfig::default() };
    let m = Master::new(config).unwrap();
    m.state.lock().instant_acks = false;
    let mut owners = Vec::new();
    for o in 0..4u64 {
        let client = format!("c{o}");
        let info =
            SegmentInfo { name: format!("s{o}"), base: (o + 1) << 40, size: per_owner * SIZE, tier: Tier::Dram as i32 };
        let segment = m.mount_segment(&client, &info, "h").unwrap();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        m.attach_owner(&client, m.term(), segment, 0, tx).unwrap();
        owners.push((client, segment, rx));
    }
    m.fill_with_news("c0", (0..2 * per_owner + 1).map(|i| key("k", i)), SIZE, Some(0));
    (m, owners, per_owner)
}

#[test]
fn an_eviction_round_sends_its_drops_to_each_owner_in_batches_not_per_step() {
    let (m, mut owners, per_owner) = four_owners_above_the_watermark();
    let now = Instant::now();
    let mut steps = 0;
    while m.evict_step(now, EVICTION_STEP) {
        steps += 1;
    }
    let evicted = m.metrics().evictions.get();
    assert_eq!(evicted, ((4 * per_owner * SIZE) as f64 * 0.35 / SIZE as f64).ceil() as u64);
    assert!(steps as u64 >= evicted / EVICTION_STEP as u64, "{steps} steps");
    assert_eq!(m.quarantined_bytes(), evicted * SIZE, "every evicted range waits for its owner");

    let mut drops = 0;
    for (client, segment, rx) in &mut owners {
        let (mut messages, mut last) = (0, 0);
        while let Ok(news) = rx.try_recv() {
            messages += 1;
            assert!(news.items.iter().all(|i| !i.commit));
            drops += news.items.len() as u64;
            last = news.items.last().map_or(last, |i| i.seq);
        }
        // One message per EVICTION_NEWS_BATCH objects of the round, and one at its end, at most
        // (one a step before).
        assert!(
            messages >= 1 && messages <= evicted.div_ceil(EVICTION_NEWS_BATCH) + 1,
            "{client}: {messages} messages"
        );
        m.owner_ack(client, m.term(), *segment, last);
    }
    assert_eq!(drops, evicted, "every drop was sent by the round's end");
    assert_eq!(m.quarantined_bytes(), 0, "and, acknowledged, every range is free again");
}

#[test]
fn an_eviction_round_spreads_its_sends_over_its_steps_instead_of_every_owner_at_once() {
    let (m, mut owners, _) = four_owners_above_the_watermark();
    let now = Instant::now();
    let (mut busiest_step, mut during) = (0, vec![0; owners.len()]);
    loop {
        let more = m.evict_step(now, EVICTION_STEP);
        if !more {
            break; // the round's end sends what is left to every owner
        }
        let mut sent_to = 0;
        for (i, (_, _, rx)) in owners.iter_mut().enumerate() {
            let mut messages = 0;
            while rx.try_recv().is_ok() {
                messages += 1;
            }
            during[i] += messages;
            sent_to += usize::from(messages > 0);
        }
        busiest_step = busiest_step.max(sent_to);
    }
    // 256 objects a step over 4 owners: an owner's turn every 4 steps (4096 objects each).
    assert_eq!(busiest_step, 1, "no step sends to more than one owner");
    assert!(during.iter().all(|&n| n >= 1), "each owner had its turn before the round's end: {during:?}");
}

#[test]
fn a_call_on_a_key_of_another_shard_does_not_wait_for_a_held_shard() {
    let m = Master::new(MasterConfig::default()).unwrap();
    let info = SegmentInfo { name: "s1".into(), base: 1 << 40, size: 1 << 20, tier: Tier::Dram as i32 };
    m.mount_segment("c1", &info, "h").unwrap();
    let a = "a".to_string();
    let b = (0..).map(|i| format!("b{i}")).find(|k| objects::shard_of(k) != objects::shard_of(&a)).unwrap();
    m.put_start("c1", &a, 4096, &PutOptions::default()).unwrap();
    m.put_end("c1", &a).unwrap();

    // Key a's shard is held (as by a call stalled on it): every call on b goes through.
    let held = m.shard_of_key(&a);
    let (done, finished) = std::sync::mpsc::channel();
    let m2 = m.clone();
    let b2 = b.clone();
    std::thread::spawn(move || {
        let r = (|| -> Result<()> {
            m2.put_start("c1", &b2, 4096, &PutOptions::default())?;
            m2.put_end("c1", &b2)?;
            assert!(m2.exists(&b2)?);
            m2.get_replica_list(&b2)?;
            assert!(m2.query(&b2)?.exists);
            m2.evict_step(Instant::now(), EVICTION_STEP); // below the watermark: nothing to do
            m2.remove(&b2, true)?;
            Ok(())
        })();
        done.send(r).unwrap();
    });
    // (A guard against a hang, not a measure: the calls take microseconds.)
    let r = finished.recv_timeout(Duration::from_secs(120)).expect("the calls on b waited for a's shard");
    r.unwrap();
    drop(held);
    assert!(m.exists(&a).unwrap(), "a's shard works again once released");
    assert!(!m.exists(&b).unwrap());
}

#[test]
fn a_sweep_waiting_for_a_held_shard_holds_no_other_shard() {
    let m = Master::new(MasterConfig::default()).unwrap();
    let info = SegmentInfo { name: "s1".into(), base: 1 << 40, size: 1 << 20, tier: Tier::Dram as i32 };
    m.mount_segment("c1", &info, "h").unwrap();
    // a in the last shard a sweep visits, b in the first.
    let a = (0..).map(|i| format!("a{i}")).find(|k| objects::shard_of(k) == SHARDS - 1).unwrap();
    let b = (0..).map(|i| format!("b{i}")).find(|k| objects::shard_of(k) == 0).unwrap();

    // a's shard is held (as by a call stalled on it) while a sweep runs: the sweep waits for it.
    let held = m.shard_of_key(&a);
    let sweeping = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (m2, sweeping2) = (m.clone(), sweeping.clone());
    let sweep = std::thread::spawn(move || {
        sweeping2.store(true, std::sync::atomic::Ordering::Release);
        m2.sweep();
    });
    // Calls on b go through meanwhile: the sweep holds b's shard only while it looks at it, not
    // while it waits for a's (a sweep used to take every shard, in order, and hold them).
    let (done, finished) = std::sync::mpsc::channel();
    let m3 = m.clone();
    std::thread::spawn(move || {
        while !sweeping.load(std::sync::atomic::Ordering::Acquire) {
            std::thread::yield_now();
        }
        let r = (|| -> Result<()> {
            for _ in 0..20_000 {
                m3.put_start("c1", &b, 4096, &PutOptions::default())?;
                m3.put_end("c1", &b)?;
                assert!(m3.exists(&b)?);
                m3.remove(&b, true)?;
            }
            Ok(())
        })();
        done.send(r).unwrap();
    });
    // (A guard against a hang, not a measure: the calls take milliseconds.)
    let r = finished.recv_timeout(Duration::from_secs(120)).expect("the calls on b waited for the sweep");
    r.unwrap();
    drop(held);
    sweep.join().unwrap();
}
