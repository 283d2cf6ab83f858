//! `storebench soak-worker`: one client process of the soak. It owns `--keys` keys
//! (`soak-ID-I`) and runs a mixed workload on them — put, upsert, forced remove, put_batch,
//! get, get_into, get_batch, batch_get_into — at `--rate` calls a second, while a second thread
//! reads the other workers' keys. It writes one JSON object a line on stdout:
//!
//! - `{"ready":true}` once connected (after touching its segment, so that its RSS starts where
//!   it stays);
//! - `{"b":[GID,..]}` before a call that changes keys (flushed: a `kill -9` during the call
//!   leaves the coordinator knowing the keys are in doubt);
//! - `{"op":NAME,"us":MICROS,"err":CODE|null,"errs":[CODE..],"set":[[GID,GEN],..],
//!   "torn":N,"stale":N,"missing":N}` after every call (`set`: what the call made of its keys,
//!   GEN 0 = absent, -1 = in doubt);
//! - `{"stopped":true}` after the line `stop` on stdin; it then stays connected (its segment
//!   holds values the coordinator reads back) until stdin closes.
//!
//! A value is one 8-byte word repeated, `GID << 32 | GEN`, of a length that GEN picks: a read
//! handed over with success is torn unless every word is that of the key it asked for.

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;
use crescent_engine::TransportKind;
use crescent_store::proto::Code;
use crescent_store::{ClientConfig, StoreApi, StoreClient, StoreError};
use rand::Rng;
use serde_json::{json, Value};

/// Value lengths, picked by the generation.
pub const SIZES: [usize; 3] = [4 << 10, 16 << 10, 64 << 10];

/// The length of a value of generation `generation`.
pub fn size_of(generation: u32) -> usize {
    SIZES[generation as usize % SIZES.len()]
}

/// The key of global id `gid` (worker `gid / keys`, key `gid % keys`).
pub fn key(gid: u64, keys: u64) -> String {
    format!("soak-{}-{}", gid / keys, gid % keys)
}

/// The value of key `gid` at generation `generation`.
pub fn value(gid: u64, generation: u32) -> Vec<u8> {
    let word = (gid << 32 | generation as u64).to_ne_bytes();
    word.iter().copied().cycle().take(size_of(generation)).collect()
}

/// The generation of `v` if it is a whole value of key `gid`; otherwise why not.
pub fn check(v: &[u8], gid: u64) -> std::result::Result<u32, String> {
    if v.len() < 8 || !v.len().is_multiple_of(8) {
        return Err(format!("{} bytes", v.len()));
    }
    let first = u64::from_ne_bytes(v[..8].try_into().expect("8 bytes"));
    if first >> 32 != gid {
        return Err(format!("starts with a word of key {}", first >> 32));
    }
    let generation = first as u32;
    if v.len() != size_of(generation) {
        return Err(format!("{} bytes, generation {generation} has {}", v.len(), size_of(generation)));
    }
    match v.chunks_exact(8).position(|w| w != &v[..8]) {
        None => Ok(generation),
        Some(at) => Err(format!("generation {generation} up to byte {}, then other words", at * 8)),
    }
}

/// The name an error is counted under: its wire code, and for `INTERNAL` the kind of error.
pub fn code(e: &StoreError) -> String {
    let c = e.code();
    if c == Code::Internal {
        let debug = format!("{e:?}");
        let kind: String = debug.chars().take_while(|c| c.is_alphanumeric()).collect();
        format!("INTERNAL:{kind}")
    } else {
        c.as_str_name().to_string()
    }
}

#[derive(Parser)]
#[command(name = "storebench soak-worker")]
pub struct WorkerArgs {
    /// This worker's number (its keys are `soak-ID-*`).
    #[arg(long)]
    id: u64,
    /// Workers in the soak (the cross reads pick among them).
    #[arg(long)]
    workers: u64,
    /// Keys per worker.
    #[arg(long)]
    keys: u64,
    /// The master (`etcd://…` with HA).
    #[arg(long)]
    master: String,
    #[arg(long)]
    cluster: String,
    /// Bytes of segment this worker contributes (0: none).
    #[arg(long)]
    segment: u64,
    /// The disk tier's root.
    #[arg(long)]
    storage_root: Option<PathBuf>,
    /// Calls a second of the workload thread (the cross reader makes half as many).
    #[arg(long)]
    rate: f64,
    /// Generations of this process start above it (a restarted worker's values are new).
    #[arg(long, default_value_t = 0)]
    gen_base: u32,
}

/// What a key of this worker is known to hold.
#[derive(Clone, Copy, PartialEq)]
enum State {
    Absent,
    Present(u32),
    /// Generation `g` was present and an upsert since answered `OBJECT_LEASED`, which
    /// `upsert_with` documents as leaving the old value: this worker's reads check that (a
    /// stale read otherwise), but the coordinator counts the key in doubt, as after any failed
    /// call (a key upserted later is not one whose put must read back).
    Refused(u32),
    Unknown,
}

impl State {
    fn wire(self) -> i64 {
        match self {
            State::Absent => 0,
            State::Present(g) => g as i64,
            State::Refused(_) | State::Unknown => -1,
        }
    }

    /// The generation reads should return, if one is known.
    fn expected(self) -> Option<u32> {
        match self {
            State::Present(g) | State::Refused(g) => Some(g),
            _ => None,
        }
    }

    /// The state after an upsert that answered `OBJECT_LEASED`.
    fn refused(self) -> State {
        self.expected().map_or(State::Unknown, State::Refused)
    }
}

/// stdout, one flushed line per message.
#[derive(Clone)]
struct Out(Arc<Mutex<std::io::Stdout>>);

impl Out {
    fn emit(&self, v: Value) {
        let out = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = out.lock();
        // The coordinator gone (a closed pipe): the worker ends with its stdin.
        let _ = writeln!(out, "{v}");
        let _ = out.flush();
    }
}

/// Counts of one call's checks.
#[derive(Default)]
struct Checks {
    torn: u64,
    stale: u64,
    missing: u64,
}

struct Worker {
    c: Arc<StoreClient>,
    a: Arc<WorkerArgs>,
    out: Out,
    state: Vec<State>,
    /// The last calls on each key (what they did and answered), logged beside a stale read.
    history: Vec<std::collections::VecDeque<String>>,
    next_gen: u32,
    /// Registered buffers for get_into / batch_get_into (4 values of the largest size).
    buf: Vec<u8>,
}

const BATCH: usize = 4;

impl Worker {
    fn gid(&self, i: usize) -> u64 {
        self.a.id * self.a.keys + i as u64
    }

    fn new_gen(&mut self) -> u32 {
        self.next_gen += 1;
        self.next_gen
    }

    /// What a successful read of key `i` handed over says, against what the key holds.
    fn judge(
        &self,
        i: usize,
        got: std::result::Result<&[u8], &StoreError>,
        checks: &mut Checks,
        errs: &mut Vec<String>,
    ) {
        let gid = self.gid(i);
        match got {
            Ok(v) => match check(v, gid) {
                Err(why) => {
                    tracing::error!(key = %key(gid, self.a.keys), "soak: a read returned a torn value: {why}");
                    checks.torn += 1;
                }
                Ok(g) => {
                    let expected = self.state[i].expected();
                    if expected != Some(g) && (expected.is_some() || self.state[i] == State::Absent) {
                        tracing::error!(key = %key(gid, self.a.keys), got = g, want = self.state[i].wire(), history = ?self.history[i], "soak: a read returned another generation than the last acknowledged write (want: 0 absent)");
                        checks.stale += 1;
                    }
                }
            },
            Err(e) => {
                if matches!(e, StoreError::NotFound(_)) && self.state[i].expected().is_some() {
                    checks.missing += 1;
                }
                errs.push(code(e));
            }
        }
    }

    fn begin(&self, keys: &[usize]) {
        let gids: Vec<u64> = keys.iter().map(|&i| self.gid(i)).collect();
        self.out.emit(json!({ "b": gids }));
    }

    fn end(&mut self, op: &str, t: Instant, errs: &[String], keys: &[usize], checks: &Checks) {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        for &i in keys {
            let h = &mut self.history[i];
            if h.len() == 4 {
                h.pop_front();
            }
            h.push_back(format!("{:.3} {op} -> {} {errs:?}", now.as_secs_f64(), self.state[i].wire()));
        }
        let set: Vec<[i64; 2]> = keys.iter().map(|&i| [self.gid(i) as i64, self.state[i].wire()]).collect();
        self.out.emit(json!({
            "op": op,
            "us": t.elapsed().as_micros() as u64,
            "errs": errs,
            "set": set,
            "torn": checks.torn,
            "stale": checks.stale,
            "missing": checks.missing,
        }));
    }

    /// Gives every key in doubt a known value before the read-back: an upsert, tried again
    /// (for up to 15 s a key, 40 s in all) while leases of reads that are ending refuse it.
    fn settle(&mut self) {
        let all = Instant::now() + Duration::from_secs(40);
        for i in 0..self.state.len() {
            if Instant::now() > all {
                break;
            }
            if matches!(self.state[i], State::Present(_) | State::Absent) {
                continue;
            }
            let end = (Instant::now() + Duration::from_secs(15)).min(all);
            while Instant::now() < end {
                let g = self.new_gen();
                let t = Instant::now();
                self.begin(&[i]);
                let mut errs = Vec::new();
                self.upsert_key(i, g, &mut errs);
                self.end("settle_upsert", t, &errs, &[i], &Checks::default());
                if errs.is_empty() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }

    /// Upserts key `i` with generation `g`, noting what its state is now and any error's code
    /// in `errs`.
    fn upsert_key(&mut self, i: usize, g: u32, errs: &mut Vec<String>) {
        let was = self.state[i];
        self.state[i] = State::Unknown;
        match self.c.upsert_with(&key(self.gid(i), self.a.keys), &value(self.gid(i), g), &self.c.default_options()) {
            Ok(()) => self.state[i] = State::Present(g),
            // A reader's lease protects the old value, says upsert_with.
            Err(e @ StoreError::Leased(_)) => {
                self.state[i] = was.refused();
                errs.push(code(&e));
            }
            Err(e) => errs.push(code(&e)),
        }
    }

    /// One call of the mix on random keys.
    fn step(&mut self, rng: &mut impl Rng) {
        let n = self.a.keys as usize;
        let i = rng.random_range(0..n);
        let dice = rng.random_range(0..100);
        let mut checks = Checks::default();
        let mut errs = Vec::new();
        let t = Instant::now();
        match dice {
            0..=14 => {
                let got = self.c.get(&key(self.gid(i), self.a.keys));
                self.judge(i, got.as_deref(), &mut checks, &mut errs);
                self.end("get", t, &errs, &[], &checks);
            }
            15..=24 => {
                let (addr, len) = (self.buf.as_ptr() as u64, SIZES[2] as u64);
                let got = self.c.get_into(&key(self.gid(i), self.a.keys), addr, len);
                let got = got.map(|n| &self.buf[..n as usize]);
                self.judge(i, got.as_ref().map(|v| &**v), &mut checks, &mut errs);
                self.end("get_into", t, &errs, &[], &checks);
            }
            25..=39 => {
                let idx: Vec<usize> = (0..BATCH).map(|_| rng.random_range(0..n)).collect();
                let keys: Vec<String> = idx.iter().map(|&i| key(self.gid(i), self.a.keys)).collect();
                if dice < 32 {
                    match self.c.get_batch(&keys) {
                        Ok(all) => {
                            for (&i, r) in idx.iter().zip(&all) {
                                self.judge(i, r.as_deref(), &mut checks, &mut errs);
                            }
                        }
                        Err(e) => errs.push(code(&e)),
                    }
                    self.end("get_batch", t, &errs, &[], &checks);
                } else {
                    let base = self.buf.as_ptr() as u64;
                    let addrs: Vec<u64> = (0..BATCH as u64).map(|k| base + k * SIZES[2] as u64).collect();
                    let lens = vec![SIZES[2] as u64; BATCH];
                    match self.c.batch_get_into(&keys, &addrs, &lens) {
                        Ok(all) => {
                            for (k, (&i, r)) in idx.iter().zip(&all).enumerate() {
                                let at = k * SIZES[2];
                                let got = r.as_ref().map(|&n| &self.buf[at..at + n as usize]);
                                self.judge(i, got, &mut checks, &mut errs);
                            }
                        }
                        Err(e) => errs.push(code(&e)),
                    }
                    self.end("batch_get_into", t, &errs, &[], &checks);
                }
            }
            40..=59 => {
                // A put where the key is known absent; an upsert otherwise (a put of a key that
                // exists succeeds and leaves the old value).
                let g = self.new_gen();
                let k = key(self.gid(i), self.a.keys);
                self.begin(&[i]);
                let was = self.state[i];
                let absent = was == State::Absent;
                self.state[i] = State::Unknown;
                let r = if absent {
                    self.c.put(&k, &value(self.gid(i), g))
                } else {
                    self.c.upsert_with(&k, &value(self.gid(i), g), &self.c.default_options())
                };
                match r {
                    Ok(()) => self.state[i] = State::Present(g),
                    Err(e @ StoreError::Leased(_)) if !absent => {
                        self.state[i] = was.refused();
                        errs.push(code(&e));
                    }
                    Err(e) => errs.push(code(&e)),
                }
                self.end(if absent { "put" } else { "upsert" }, t, &errs, &[i], &checks);
            }
            60..=69 => {
                let mut idx: Vec<usize> = (0..BATCH).map(|_| rng.random_range(0..n)).collect();
                idx.sort_unstable();
                idx.dedup();
                let gens: Vec<u32> = idx.iter().map(|_| self.new_gen()).collect();
                let keys: Vec<String> = idx.iter().map(|&i| key(self.gid(i), self.a.keys)).collect();
                let values: Vec<Vec<u8>> = idx.iter().zip(&gens).map(|(&i, &g)| value(self.gid(i), g)).collect();
                let refs: Vec<&[u8]> = values.iter().map(|v| &v[..]).collect();
                self.begin(&idx);
                // Keys that are known absent become the new value; others keep theirs (a put
                // leaves a present value) or are in doubt.
                let before: Vec<State> = idx.iter().map(|&i| self.state[i]).collect();
                for &i in &idx {
                    self.state[i] = State::Unknown;
                }
                match self.c.put_batch(&keys, &refs) {
                    Ok(all) => {
                        for ((&i, r), (&g, &was)) in idx.iter().zip(&all).zip(gens.iter().zip(&before)) {
                            match r {
                                Ok(()) if was == State::Absent => self.state[i] = State::Present(g),
                                Ok(()) if was.expected().is_some() => self.state[i] = was,
                                Ok(()) => {}
                                Err(e) => errs.push(code(e)),
                            }
                        }
                    }
                    Err(e) => errs.push(code(&e)),
                }
                self.end("put_batch", t, &errs, &idx, &checks);
            }
            70..=84 => {
                let g = self.new_gen();
                self.begin(&[i]);
                self.upsert_key(i, g, &mut errs);
                self.end("upsert", t, &errs, &[i], &checks);
            }
            _ => {
                self.begin(&[i]);
                self.state[i] = State::Unknown;
                let op = match self.c.remove_with(&key(self.gid(i), self.a.keys), true) {
                    Ok(()) => {
                        self.state[i] = State::Absent;
                        "remove_force"
                    }
                    Err(StoreError::NotFound(_)) => {
                        self.state[i] = State::Absent;
                        "remove_force_not_found"
                    }
                    Err(e) => {
                        errs.push(code(&e));
                        "remove_force"
                    }
                };
                self.end(op, t, &errs, &[i], &checks);
            }
        }
    }
}

/// Reads of the other workers' keys: only wholeness can be checked there.
fn cross_reads(c: Arc<StoreClient>, a: &WorkerArgs, out: Out, stop: Arc<AtomicBool>) {
    let mut rng = rand::rng();
    paced(Duration::from_secs_f64(2.0 / a.rate.max(0.01)), &stop, || {
        let total = a.workers * a.keys;
        let gids: Vec<u64> = (0..2).map(|_| rng.random_range(0..total)).collect();
        let mut torn = 0;
        let mut errs = Vec::new();
        let t = Instant::now();
        let mut judge = |gid: u64, r: std::result::Result<&[u8], &StoreError>| match r {
            Ok(v) => {
                if let Err(why) = check(v, gid) {
                    tracing::error!(key = %key(gid, a.keys), "soak: a cross read returned a torn value: {why}");
                    torn += 1;
                }
            }
            Err(e) => errs.push(code(e)),
        };
        let op = if rng.random_bool(0.5) {
            let got = c.get(&key(gids[0], a.keys));
            judge(gids[0], got.as_deref());
            "cross_get"
        } else {
            let keys: Vec<String> = gids.iter().map(|&g| key(g, a.keys)).collect();
            match c.get_batch(&keys) {
                Ok(all) => {
                    for (&g, r) in gids.iter().zip(&all) {
                        judge(g, r.as_deref());
                    }
                }
                Err(e) => errs.push(code(&e)),
            }
            "cross_get_batch"
        };
        out.emit(json!({ "op": op, "us": t.elapsed().as_micros() as u64, "errs": errs, "torn": torn }));
    });
}

/// Runs `step` once every `period` until `stop`; a step that starts late moves the later ones
/// along rather than running them back to back.
fn paced(period: Duration, stop: &AtomicBool, mut step: impl FnMut()) {
    let mut next = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        next += period;
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        } else {
            next = Instant::now();
        }
        step();
    }
}

/// Puts and force-removes values over most of the segment once, so that its pages are resident
/// before the RSS baseline (a fresh segment's pages become resident only as values land there).
fn touch_segment(c: &StoreClient, a: &WorkerArgs) {
    let chunk = vec![0x5au8; 1 << 20];
    let n = (a.segment * 3 / 4) >> 20;
    let mut put = Vec::new();
    for k in 0..n {
        let key = format!("soak-warm-{}-{k}", a.id);
        if c.put(&key, &chunk).is_ok() {
            put.push(key);
        }
    }
    for key in put {
        let _ = c.remove_with(&key, true);
    }
}

pub fn main(args: impl Iterator<Item = String>) -> Result<()> {
    let a = WorkerArgs::parse_from(args);
    let c = StoreClient::connect(ClientConfig {
        master_server_address: a.master.clone(),
        cluster_id: Some(a.cluster.clone()),
        local_hostname: Some("127.0.0.1".into()),
        protocol: Some(TransportKind::Tcp),
        global_segment_size: a.segment,
        local_buffer_size: 16 << 20,
        ping_interval: Duration::from_millis(200),
        storage_root_dir: a.storage_root.clone(),
        ..ClientConfig::default()
    })
    .context("connecting")?;
    if a.segment > 0 {
        touch_segment(&c, &a);
    }
    let out = Out(Arc::new(Mutex::new(std::io::stdout())));
    let mut buf = vec![0u8; BATCH * SIZES[2]];
    c.register_buffer(buf.as_mut_ptr() as u64, buf.len() as u64)?;
    out.emit(json!({ "ready": true, "pid": std::process::id() }));

    let stop = Arc::new(AtomicBool::new(false));
    let closed = Arc::new(AtomicBool::new(false));
    {
        let (stop, closed) = (stop.clone(), closed.clone());
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                match line {
                    Ok(l) if l.trim() == "stop" => stop.store(true, Ordering::Relaxed),
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
            stop.store(true, Ordering::Relaxed);
            closed.store(true, Ordering::Relaxed);
        });
    }
    let a = Arc::new(a);
    let reader = {
        let (c, a, out, stop) = (c.clone(), a.clone(), out.clone(), stop.clone());
        std::thread::spawn(move || cross_reads(c, &a, out, stop))
    };
    let mut w = Worker {
        c: c.clone(),
        state: vec![State::Unknown; a.keys as usize],
        history: vec![Default::default(); a.keys as usize],
        next_gen: a.gen_base,
        a: a.clone(),
        out: out.clone(),
        buf,
    };
    let mut rng = rand::rng();
    paced(Duration::from_secs_f64(1.0 / a.rate.max(0.01)), &stop, || w.step(&mut rng));
    let _ = reader.join();
    w.settle();
    out.emit(json!({ "stopped": true }));
    while !closed.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = c.unregister_buffer(w.buf.as_ptr() as u64);
    Ok(())
}
