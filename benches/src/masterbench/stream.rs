//! The request streams the clients send: each client's mix of calls, closed loop or paced
//! open loop at an offered rate.

use super::*;

/// The single-key stream of `clients` clients offering `offered` calls per second together
/// (each paced at `clients / offered` between its calls), for `dur`, with or without removes.
pub(super) fn open_loop_stream(
    args: &MasterArgs,
    clients: usize,
    offered: f64,
    removes: bool,
    dur: Duration,
) -> Stream {
    let pace = Duration::from_secs_f64(clients as f64 / offered.max(1.0));
    Stream { batch: 1, value_size: args.value_size, removes, dur, put_budget: None, pace: Some(pace) }
}

/// An open-loop phase's name: "mixed, 1 key per call, open loop: R RPCs/s offered (S % of
/// the closed loop)".
pub(super) fn open_loop_phase(offered: f64, share: f64) -> String {
    format!("mixed, 1 key per call, open loop: {offered:.0} RPCs/s offered ({:.0} % of the closed loop)", share * 100.0)
}

#[derive(Clone, Copy)]
pub(super) struct Stream {
    pub(super) batch: usize,
    pub(super) value_size: u64,
    pub(super) removes: bool,
    pub(super) dur: Duration,
    /// Most puts (keys) of all clients together.
    pub(super) put_budget: Option<u64>,
    /// Open loop: each client's interval between the starts of two calls (closed loop: none).
    pub(super) pace: Option<Duration>,
}

/// When a client's next call starts and from when its latency counts.
pub(super) struct Pacer {
    pub(super) pace: Option<Duration>,
    /// When the next call is due (open loop).
    pub(super) due: Instant,
}

impl Pacer {
    pub(super) fn new(pace: Option<Duration>) -> Self {
        // Clients start spread over one interval, not all at once.
        let offset = pace.map_or(Duration::ZERO, |p| p.mul_f64(rand::rng().random_range(0.0..1.0)));
        Pacer { pace, due: Instant::now() + offset }
    }

    /// Waits until the next call is due and returns the instant its latency counts from: the
    /// send in the closed loop or when ahead of the pace; when the call is late, the moment it
    /// was due, so the wait the master's slowness caused is charged to it.
    pub(super) async fn start(&mut self) -> Instant {
        let Some(pace) = self.pace else { return Instant::now() };
        let due = self.due;
        self.due += pace;
        let now = Instant::now();
        if now >= due {
            due
        } else {
            tokio::time::sleep_until(due.into()).await;
            Instant::now()
        }
    }
}

/// Every client runs the mixed stream for `spec.dur`; returns the tally and the seconds.
pub(super) async fn stream(sims: &mut Vec<Sim>, filled: u64, spec: Stream) -> (Tally, f64) {
    let budget = Arc::new(AtomicU64::new(spec.put_budget.unwrap_or(u64::MAX)));
    let deadline = Instant::now() + spec.dur;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for mut sim in std::mem::take(sims) {
        let budget = budget.clone();
        let lane = sim.lane.clone();
        tasks.push(lane.spawn(async move {
            let mut t = Tally::new();
            client_stream(&mut sim, filled, spec, deadline, &budget, &mut t).await;
            (sim, t)
        }));
    }
    let mut all = Tally::new();
    for task in tasks {
        match task.await {
            Ok((sim, t)) => {
                all.add(&t);
                sims.push(sim);
            }
            Err(e) => all.fail(format!("a client task failed: {e}")),
        }
    }
    sims.sort_by_key(|s| s.index);
    (all, started.elapsed().as_secs_f64())
}

pub(super) async fn client_stream(
    sim: &mut Sim,
    filled: u64,
    spec: Stream,
    deadline: Instant,
    budget: &AtomicU64,
    t: &mut Tally,
) {
    let b = spec.batch;
    let random_keys = |n: usize| -> Vec<String> {
        let mut rng = rand::rng();
        (0..n).map(|_| format!("o/{:010}", rng.random_range(0..filled.max(1)))).collect()
    };
    let size = spec.value_size;
    let mut pacer = Pacer::new(spec.pace);
    while Instant::now() < deadline {
        // A put of b new keys, within the budget.
        let take = b as u64;
        if budget.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| left.checked_sub(take)).is_err() {
            break;
        }
        let keys: Vec<String> = (0..b)
            .map(|_| {
                sim.next += 1;
                format!("n/{}/{}", sim.index, sim.next)
            })
            .collect();
        if b == 1 {
            let key = keys.into_iter().next().expect("one key");
            let s = pacer.start().await;
            let r = sim
                .rpc
                .put_start(PutStartRequest {
                    client_id: sim.id.clone(),
                    key: key.clone(),
                    size,
                    options: Some(PutOptions::default()),
                    checksum: Some(VALUE_CRC),
                })
                .await;
            t.record(Rpc::PutStart, s.elapsed());
            match r.map(|r| r.into_inner()) {
                Ok(r) if ok(&r.status) => {
                    let s = pacer.start().await;
                    let e = sim
                        .rpc
                        .put_end(KeyRequest { client_id: sim.id.clone(), key: key.clone(), ..Default::default() })
                        .await;
                    t.record(Rpc::PutEnd, s.elapsed());
                    match e.map(|e| e.into_inner()) {
                        Ok(e) if ok(&e.status) => {
                            t.ops += 1;
                            t.puts += 1;
                            sim.live.push_back(key);
                        }
                        Ok(e) => t.fail(format!("PutEnd {key}: {}", describe(&e.status))),
                        Err(e) => t.fail(format!("PutEnd {key}: {e}")),
                    }
                }
                Ok(r) => t.fail(format!("PutStart {key}: {}", describe(&r.status))),
                Err(e) => t.fail(format!("PutStart {key}: {e}")),
            }
        } else {
            let done = put_batch(&mut sim.rpc, &sim.id, keys, size, t).await;
            sim.live.extend(done);
        }
        // Two gets and one exists of b random fill keys each.
        for _ in 0..2 {
            let keys = random_keys(b);
            if b == 1 {
                let key = keys.into_iter().next().expect("one key");
                let s = pacer.start().await;
                let r = sim
                    .rpc
                    .get_replica_list(KeyRequest { client_id: sim.id.clone(), key: key.clone(), ..Default::default() })
                    .await;
                t.record(Rpc::Get, s.elapsed());
                match r.map(|r| r.into_inner()) {
                    Ok(r) if ok(&r.status) => t.ops += 1,
                    Ok(r) if code_of(&r.status) == Code::ObjectNotFound as i32 => {
                        t.ops += 1;
                        t.misses += 1;
                    }
                    Ok(r) => t.fail(format!("GetReplicaList {key}: {}", describe(&r.status))),
                    Err(e) => t.fail(format!("GetReplicaList {key}: {e}")),
                }
            } else {
                let s = pacer.start().await;
                let r = sim
                    .rpc
                    .batch_get_replica_list(BatchKeyRequest { client_id: sim.id.clone(), keys, ..Default::default() })
                    .await;
                t.record(Rpc::BatchGet, s.elapsed());
                match r.map(|r| r.into_inner()) {
                    Ok(r) => {
                        for item in &r.items {
                            t.ops += 1;
                            if code_of(&item.status) == Code::ObjectNotFound as i32 {
                                t.misses += 1;
                            } else if !ok(&item.status) {
                                t.fail(format!("BatchGetReplicaList: {}", describe(&item.status)));
                            }
                        }
                    }
                    Err(e) => t.fail(format!("BatchGetReplicaList: {e}")),
                }
            }
        }
        let keys = random_keys(b);
        let s = pacer.start().await;
        if b == 1 {
            let key = keys.into_iter().next().expect("one key");
            let r =
                sim.rpc.exists(KeyRequest { client_id: sim.id.clone(), key: key.clone(), ..Default::default() }).await;
            t.record(Rpc::Exists, s.elapsed());
            match r.map(|r| r.into_inner()) {
                Ok(r) if ok(&r.status) => {
                    t.ops += 1;
                    t.misses += u64::from(!r.exists);
                }
                Ok(r) => t.fail(format!("Exists {key}: {}", describe(&r.status))),
                Err(e) => t.fail(format!("Exists {key}: {e}")),
            }
        } else {
            let r =
                sim.rpc.batch_exists(BatchKeyRequest { client_id: sim.id.clone(), keys, ..Default::default() }).await;
            t.record(Rpc::BatchExists, s.elapsed());
            match r.map(|r| r.into_inner()) {
                Ok(r) if ok(&r.status) => {
                    t.ops += r.exists.len() as u64;
                    t.misses += r.exists.iter().filter(|e| !**e).count() as u64;
                }
                Ok(r) => t.fail(format!("BatchExists: {}", describe(&r.status))),
                Err(e) => t.fail(format!("BatchExists: {e}")),
            }
        }
        // One remove of this client's oldest new key (keeps the store's size).
        if spec.removes {
            if let Some(key) = sim.live.pop_front() {
                let s = pacer.start().await;
                let r =
                    sim.rpc.remove(RemoveRequest { client_id: sim.id.clone(), key: key.clone(), force: false }).await;
                t.record(Rpc::Remove, s.elapsed());
                match r.map(|r| r.into_inner()) {
                    Ok(r) if ok(&r.status) => {
                        t.ops += 1;
                        t.removes += 1;
                    }
                    Ok(r) => t.fail(format!("Remove {key}: {}", describe(&r.status))),
                    Err(e) => t.fail(format!("Remove {key}: {e}")),
                }
            }
        }
    }
}
