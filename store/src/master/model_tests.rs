//! The master's answers against a reference model of its metadata: random sequences of puts,
//! commits, revokes, gets, exists, removals and sweeps on a few keys, on a clock the test
//! moves (leases end, unfinished puts are reclaimed, the space of objects force-removed under
//! a lease comes back once it ended), compared answer by answer; and eviction
//! rounds, which must take the least recently used unleased committed objects of all shards
//! in order (the keys spread over several shards).
//!
//! The master is new (it took over: its rebuild window is open throughout), and a second
//! holder reports, now and then, a copy of a key made by an earlier master (`Report`): it is
//! reinstated unless a removal this master answered buried the key, and a plain put this
//! master started of the key gives way to it (see the `rebuild` module).

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;
use crate::proto::PutOptions;

const KEYS: u8 = 6;
const GRANULE: u64 = 256;
const LEASE: Duration = Duration::from_millis(1000);
const PUT_TIMEOUT: Duration = Duration::from_millis(3000);
/// Each segment's: the writer's, and the reporting holder's.
const CAPACITY: u64 = 1 << 20;
/// Share of the capacity (both segments) an eviction round frees: one to a few objects here.
const EVICTION_RATIO: f64 = 0.01;

#[derive(Debug, Clone)]
enum Op {
    PutStart(u8, u64),
    PutEnd(u8),
    Revoke(u8),
    Get(u8),
    Exists(u8),
    BatchExists,
    Remove(u8, bool),
    RemoveAll(bool),
    /// Moves the clock on by this many milliseconds.
    Advance(u64),
    Sweep,
    /// A round of eviction (as a put that found no room asks for), in steps of this many objects.
    Evict(usize),
    /// The second holder mounts its segment again with a report of one object of this key and
    /// size, made by an earlier master (what it held before goes with the remount).
    Report(u8, u64),
}

fn op() -> impl Strategy<Value = Op> {
    let k = 0..KEYS;
    prop_oneof![
        3 => (k.clone(), 1..=20_000u64).prop_map(|(k, s)| Op::PutStart(k, s)),
        3 => k.clone().prop_map(Op::PutEnd),
        1 => k.clone().prop_map(Op::Revoke),
        3 => k.clone().prop_map(Op::Get),
        1 => k.clone().prop_map(Op::Exists),
        1 => Just(Op::BatchExists),
        2 => (k.clone(), any::<bool>()).prop_map(|(k, f)| Op::Remove(k, f)),
        1 => any::<bool>().prop_map(Op::RemoveAll),
        2 => (1..2500u64).prop_map(Op::Advance),
        1 => Just(Op::Sweep),
        1 => (1..4usize).prop_map(Op::Evict),
        2 => (k.clone(), 1..=20_000u64).prop_map(|(k, s)| Op::Report(k, s)),
    ]
}

/// What an answer was, as the model tells it.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    Ok,
    Size(u64),
    Bool(bool),
    Bools(Vec<bool>),
    Counts(u64, u64),
    NotFound,
    NotReady,
    AlreadyExists,
    Leased,
    Invalid,
    Other(String),
}

fn answer<T>(r: Result<T>, ok: impl FnOnce(T) -> Answer) -> Answer {
    match r {
        Ok(v) => ok(v),
        Err(StoreError::NotFound(_)) => Answer::NotFound,
        Err(StoreError::NotReady(_)) => Answer::NotReady,
        Err(StoreError::AlreadyExists(_)) => Answer::AlreadyExists,
        Err(StoreError::Leased(_)) => Answer::Leased,
        Err(StoreError::InvalidArgument(_)) => Answer::Invalid,
        Err(e) => Answer::Other(e.to_string()),
    }
}

struct Entry {
    size: u64,
    complete: bool,
    /// Milliseconds on the test's clock.
    started: u64,
    lease_until: Option<u64>,
    /// Its last use (commit or get), on the model's use counter.
    used: u64,
    /// Reported by the second holder (in its segment).
    reported: bool,
    /// A put this master started without a removal of the key before: a reported copy of
    /// the key replaces it.
    provisional: bool,
}

/// The metadata as the documentation states it: one map of keys.
#[derive(Default)]
struct Model {
    objects: BTreeMap<String, Entry>,
    /// Bytes of objects removed under a running lease (or of a put in flight that gave way to
    /// a report), when the hold ends and whether in the reporting holder's segment: still in
    /// use until a put or a sweep after that finds them free.
    held: Vec<(u64, u64, bool)>,
    /// Keys a removal answered since taking over (reported copies of them are refused).
    buried: std::collections::BTreeSet<String>,
    /// Each `RemoveAll` since taking over, with the leased keys it skipped: reported copies of
    /// every other key are refused.
    removed_all: Vec<std::collections::BTreeSet<String>>,
    now: u64,
    uses: u64,
}

impl Model {
    fn leased(&self, e: &Entry) -> bool {
        e.lease_until.is_some_and(|t| t > self.now)
    }

    /// Removes `key`; its bytes stay in use while a lease on it runs.
    fn remove(&mut self, key: &str) {
        let e = self.objects.remove(key).expect("removing a known key");
        if let Some(until) = e.lease_until.filter(|t| *t > self.now) {
            self.held.push((until, e.size.next_multiple_of(GRANULE), e.reported));
        }
    }

    /// Lets the holds whose lease ended go.
    fn release_holds(&mut self) {
        let now = self.now;
        self.held.retain(|(until, _, _)| *until > now);
    }

    /// The second holder's report of `key`: (reinstated, refused).
    fn report(&mut self, key: String, size: u64) -> Answer {
        // The remount drops what its segment held, and the holds in it.
        self.objects.retain(|_, e| !e.reported);
        self.held.retain(|(_, _, reported)| !reported);
        if self.buried.contains(&key) || self.removed_all.iter().any(|spared| !spared.contains(&key)) {
            // Refused; a reader may hold a lease on it from the earlier master.
            self.held.push((self.now + LEASE.as_millis() as u64, size.next_multiple_of(GRANULE), true));
            return Answer::Counts(0, 1);
        }
        if let Some(e) = self.objects.get(&key) {
            assert!(e.provisional, "a key not buried was put provisionally");
            if e.complete {
                self.remove(&key);
            } else {
                // In flight: held until its put timeout.
                let until = (e.started + PUT_TIMEOUT.as_millis() as u64).max(self.now);
                self.held.push((until, e.size.next_multiple_of(GRANULE), false));
                self.objects.remove(&key);
            }
        }
        self.uses += 1;
        let lease_until = Some(self.now + LEASE.as_millis() as u64);
        let e = Entry {
            size,
            complete: true,
            started: self.now,
            lease_until,
            used: self.uses,
            reported: true,
            provisional: false,
        };
        self.objects.insert(key, e);
        Answer::Counts(1, 0)
    }

    fn apply(&mut self, op: &Op) -> Answer {
        let now = self.now;
        match op {
            Op::PutStart(k, size) => {
                let key = name(*k);
                if self.objects.contains_key(&key) {
                    return Answer::AlreadyExists;
                }
                self.release_holds();
                let provisional = !self.buried.contains(&key);
                let e = Entry {
                    size: *size,
                    complete: false,
                    started: now,
                    lease_until: None,
                    used: 0,
                    reported: false,
                    provisional,
                };
                self.objects.insert(key, e);
                Answer::Size(*size)
            }
            Op::PutEnd(k) => match self.objects.get_mut(&name(*k)) {
                None => Answer::NotFound,
                Some(e) => {
                    if !e.complete {
                        e.complete = true;
                        self.uses += 1;
                        e.used = self.uses;
                    }
                    Answer::Ok
                }
            },
            Op::Revoke(k) => match self.objects.get(&name(*k)) {
                None => Answer::NotFound,
                Some(e) if e.complete => Answer::Invalid,
                Some(_) => {
                    self.objects.remove(&name(*k));
                    Answer::Ok
                }
            },
            Op::Get(k) => match self.objects.get_mut(&name(*k)) {
                None => Answer::NotFound,
                Some(e) if !e.complete => Answer::NotReady,
                Some(e) => {
                    let until = now + LEASE.as_millis() as u64;
                    e.lease_until = Some(e.lease_until.map_or(until, |t| t.max(until)));
                    self.uses += 1;
                    e.used = self.uses;
                    Answer::Size(e.size)
                }
            },
            Op::Exists(k) => Answer::Bool(self.objects.get(&name(*k)).is_some_and(|e| e.complete)),
            Op::BatchExists => {
                Answer::Bools((0..KEYS).map(|k| self.objects.get(&name(k)).is_some_and(|e| e.complete)).collect())
            }
            Op::Remove(k, force) => match self.objects.get(&name(*k)) {
                None => {
                    self.buried.insert(name(*k));
                    Answer::NotFound
                }
                Some(e) if !e.complete => Answer::NotReady,
                Some(e) if self.leased(e) && !force => Answer::Leased,
                Some(_) => {
                    self.remove(&name(*k));
                    self.buried.insert(name(*k));
                    Answer::Ok
                }
            },
            Op::RemoveAll(force) => {
                let (mut removed, mut skipped) = (Vec::new(), 0);
                let mut spared = std::collections::BTreeSet::new();
                for (k, e) in &self.objects {
                    if e.complete {
                        if self.leased(e) && !force {
                            skipped += 1;
                            spared.insert(k.clone());
                        } else {
                            removed.push(k.clone());
                        }
                    }
                }
                for k in &removed {
                    self.remove(k);
                    self.buried.insert(k.clone());
                }
                self.removed_all.push(spared);
                Answer::Counts(removed.len() as u64, skipped)
            }
            Op::Advance(ms) => {
                self.now += ms;
                Answer::Ok
            }
            Op::Sweep => {
                let timeout = PUT_TIMEOUT.as_millis() as u64;
                self.objects.retain(|_, e| e.complete || now - e.started <= timeout);
                self.release_holds();
                Answer::Ok
            }
            Op::Report(k, size) => self.report(name(*k), *size),
            Op::Evict(_) => {
                let target = ((2 * CAPACITY) as f64 * EVICTION_RATIO) as u64;
                let mut order: Vec<(u64, String)> = self
                    .objects
                    .iter()
                    .filter(|(_, e)| e.complete && !self.leased(e))
                    .map(|(k, e)| (e.used, k.clone()))
                    .collect();
                order.sort();
                let (mut count, mut freed) = (0, 0);
                for (_, k) in order {
                    if freed >= target {
                        break;
                    }
                    freed += self.objects.remove(&k).expect("listed").size.next_multiple_of(GRANULE);
                    count += 1;
                }
                Answer::Counts(count, freed)
            }
        }
    }
}

fn name(k: u8) -> String {
    format!("key-{k}")
}

fn run(m: &Master, t0: Instant, now_ms: u64, op: &Op) -> Answer {
    let now = t0 + Duration::from_millis(now_ms);
    // The writer's segment: the reporting holder's is for its reports.
    let plain = PutOptions { preferred_segments: vec!["s1".into()], ..PutOptions::default() };
    match op {
        Op::PutStart(k, size) => answer(m.put_start_inner("c1", &name(*k), *size, &plain, now), |(r, _)| {
            assert_eq!(r.len(), 1);
            Answer::Size(r[0].size)
        }),
        Op::PutEnd(k) => answer(m.put_end("c1", &name(*k)), |_| Answer::Ok),
        Op::Revoke(k) => answer(m.put_revoke("c1", &name(*k)), |_| Answer::Ok),
        Op::Get(k) => answer(m.get_replica_list_inner(&name(*k), now), |l| Answer::Size(l.size)),
        Op::Exists(k) => answer(m.exists(&name(*k)), Answer::Bool),
        Op::BatchExists => answer(m.batch_exists(&(0..KEYS).map(name).collect::<Vec<_>>()), Answer::Bools),
        Op::Remove(k, force) => answer(m.remove_at(&name(*k), *force, now), |_| Answer::Ok),
        Op::RemoveAll(force) => answer(m.remove_matching_at(|_| true, *force, now), |((r, s), _)| Answer::Counts(r, s)),
        Op::Advance(_) => Answer::Ok,
        Op::Sweep => {
            m.sweep_at(now);
            Answer::Ok
        }
        Op::Report(k, size) => {
            let o =
                crate::proto::OwnedObject { key: name(*k), version: 1, offset: 0, size: *size, ..Default::default() };
            answer(m.remount_with_report_at("c2", &holder_segment(), "h", &[o], &[], now), |r| {
                Answer::Counts(r.reinstated, r.refused)
            })
        }
        Op::Evict(step) => {
            let (count, freed) = (m.metrics().evictions.get(), m.metrics().evicted_bytes.get());
            m.state.lock().core.pressure = true;
            while m.evict_step(now, *step) {}
            Answer::Counts(m.metrics().evictions.get() - count, m.metrics().evicted_bytes.get() - freed)
        }
    }
}

fn holder_segment() -> SegmentInfo {
    SegmentInfo { name: "s2".into(), base: 1 << 40, size: CAPACITY, tier: Tier::Dram as i32 }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn answers_match_a_model_of_the_metadata(ops in proptest::collection::vec(op(), 1..80)) {
        let config = MasterConfig {
            lease_ttl: LEASE,
            put_timeout: PUT_TIMEOUT,
            // The test's clock runs ahead of the real one: the client must not look silent.
            client_ttl: Duration::from_secs(86_400),
            eviction_ratio: EVICTION_RATIO,
            ..MasterConfig::default()
        };
        let m = Master::new(config).unwrap();
        let shards: std::collections::HashSet<usize> = (0..KEYS).map(|k| objects::shard_of(&name(k))).collect();
        prop_assert!(shards.len() > 1, "the keys spread over several shards");
        // Room for every key at its largest: nothing is evicted but by the Evict steps.
        let info = SegmentInfo { name: "s1".into(), base: 1 << 30, size: CAPACITY, tier: Tier::Dram as i32 };
        m.mount_segment("c1", &info, "h").unwrap();
        let t0 = Instant::now();
        // The second holder reports at once (nothing), and again with each Report.
        m.remount_with_report_at("c2", &holder_segment(), "h", &[], &[], t0).unwrap();
        let mut model = Model::default();
        for (i, op) in ops.iter().enumerate() {
            let now = model.now;
            let expected = model.apply(op);
            let got = run(&m, t0, now, op);
            prop_assert_eq!(&got, &expected, "op {} ({:?}) of {:?}", i, op, ops);
            let t = m.totals();
            prop_assert_eq!(t.keys, model.objects.len() as u64, "keys after op {} of {:?}", i, ops);
            let used: u64 = model.objects.values().map(|e| e.size.next_multiple_of(GRANULE)).sum::<u64>()
                + model.held.iter().map(|(_, bytes, _)| bytes).sum::<u64>();
            prop_assert_eq!(t.used, used, "bytes in use after op {} of {:?}", i, ops);
            let mut listed = m.keys(usize::MAX);
            listed.sort();
            let committed: Vec<String> =
                model.objects.iter().filter(|(_, e)| e.complete).map(|(k, _)| k.clone()).collect();
            prop_assert_eq!(listed, committed, "committed keys after op {} of {:?}", i, ops);
        }
    }
}
