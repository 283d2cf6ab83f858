//! `tebench auth-pair`: the cost of the cluster secret (issue 26), measured in one process.
//!
//! Two engine pairs over tcp on loopback, one whose target and initiator hold a cluster
//! secret and one whose engines hold none, and two masters on loopback (one with the secret,
//! one without), each with a holder client (whose segment holds the values) and a user client
//! (which contributes no memory, so every value it puts or gets crosses the engine to the
//! holder). Each side's connections are made before its measured pairs, as a real
//! deployment's are.
//!
//! Each row alternates one operation with the secret on and the same one with it off (which
//! goes first alternates too); each pair's ratio on/off is taken within the pair, so that a
//! machine whose speed drifts between pairs moves both sides of a ratio alike. The pairs are
//! measured in `--rounds` rounds, each building both sides anew (in alternating order): two
//! instances of the same side differ by more than 2 % on a shared machine (one run measured
//! get_into at 0.63 and another at 1.49 with nothing changed), so one build per run would
//! measure its instances, not the secret. A row prints both medians, the median of the pooled
//! per-pair ratios, their p5-p95 range, a bootstrap 95 % confidence interval of that median
//! (resampling rounds, then pairs) and each round's median. Authentication is once per
//! connection (and the master verifies a client's token once), so the target is on/off >= 0.98.
//!
//! Before the rows, the run checks that the secret is really applied to the "on" side: an
//! engine without the secret must be refused by the secret-on target, a client without it by
//! the secret-on master; otherwise the run fails. It also times the handshake's added latency:
//! opening the target's segment and its first 4 KiB read (the handshake port's and the tcp
//! data connections' challenge-responses), with the secret and without, median of
//! `--connects`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use crescent_engine::{
    parse_size, EngineConfig, Opcode, RegisteredMemory, SegmentId, TransferEngine, TransferRequest, TransportKind,
};
use crescent_store::master::server::MasterHandle;
use crescent_store::{pattern, ClientConfig, MasterConfig, StoreApi, StoreClient, StoreError};
use crescent_transports::net::auth::{SECRET_ENV, SECRET_FILE_ENV, SECRET_NEXT_ENV};
use crescent_transports::net::{Keyring, Service};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::report::{self, median, Load, Pairs, Target};

#[derive(Args, Debug, Clone)]
pub struct AuthPairArgs {
    /// Pairs (secret on, secret off) per row, over all rounds.
    #[arg(long, default_value_t = 200)]
    pub pairs: usize,
    /// Rounds: each builds both sides' engines and masters anew and measures its share of
    /// the pairs.
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// Bytes per engine transfer: one batch of `--block-size` requests.
    #[arg(long, default_value = "32M", value_parser = parse_size)]
    pub chunk: u64,
    /// Bytes per engine request.
    #[arg(long, default_value = "1M", value_parser = parse_size)]
    pub block_size: u64,
    /// Size of the store's values (put, get, get_into).
    #[arg(long, default_value = "8M", value_parser = parse_size)]
    pub value_size: u64,
    /// Connections timed per side for the handshake's added latency.
    #[arg(long, default_value_t = 20)]
    pub connects: usize,
    /// Resamples of the bootstrap confidence interval.
    #[arg(long, default_value_t = 2000)]
    pub resamples: usize,
}

const TARGET: Target = Target::AtLeast(0.98);

/// A pair's side: with the cluster secret or without.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    On,
    Off,
}

fn engine(secret: Option<&Keyring>) -> Result<Arc<TransferEngine>> {
    Ok(TransferEngine::new(EngineConfig {
        local_hostname: Some("127.0.0.1".into()),
        protocol: Some(TransportKind::Tcp),
        cluster_secret: secret.cloned(),
        ..EngineConfig::default()
    })?)
}

/// A target serving `chunk` bytes and an initiator with a local buffer of as many, connected.
struct EnginePair {
    initiator: Arc<TransferEngine>,
    target: Arc<TransferEngine>,
    _target_mem: RegisteredMemory,
    local: RegisteredMemory,
    segment: SegmentId,
    remote: u64,
}

impl EnginePair {
    fn new(secret: Option<&Keyring>, chunk: u64) -> Result<EnginePair> {
        let target = engine(secret)?;
        let target_mem = target.alloc_registered(chunk, "cpu:0").context("the target's buffer")?;
        let initiator = engine(secret)?;
        let local = initiator.alloc_registered(chunk, "cpu:0").context("the initiator's buffer")?;
        let segment = initiator.open_segment(target.segment_name())?;
        Ok(EnginePair { remote: target_mem.addr(), initiator, target, _target_mem: target_mem, local, segment })
    }

    /// Moves one chunk in `block`-sized requests; bytes per second.
    fn chunk(&self, op: Opcode, chunk: u64, block: u64) -> Result<f64> {
        let requests: Vec<TransferRequest> = (0..chunk / block)
            .map(|i| TransferRequest {
                opcode: op,
                source: self.local.addr() + i * block,
                target: self.segment,
                target_offset: self.remote + i * block,
                length: block,
            })
            .collect();
        let t = Instant::now();
        self.initiator.transfer_sync(&requests)?;
        Ok((chunk / block * block) as f64 / t.elapsed().as_secs_f64())
    }
}

/// A master, a holder client whose segment holds the values, a user client without memory
/// of its own that puts and gets them, and a registered buffer of the user's for `get_into`.
/// (Fields drop in order: the clients close before their master stops.)
struct StoreSide {
    dst: RegisteredMemory,
    user: Arc<StoreClient>,
    holder: Arc<StoreClient>,
    master: MasterHandle,
}

fn client_config(master: &MasterHandle, secret: Option<&Keyring>) -> ClientConfig {
    ClientConfig {
        master_server_address: master.client_address(),
        local_hostname: Some("127.0.0.1".into()),
        protocol: Some(TransportKind::Tcp),
        cluster_secret: secret.cloned(),
        ..ClientConfig::default()
    }
}

impl StoreSide {
    fn new(secret: Option<&Keyring>, value: u64) -> Result<StoreSide> {
        let master = crescent_store::master::server::start(MasterConfig {
            rpc_address: "127.0.0.1:0".into(),
            admin_address: String::new(),
            lease_ttl: Duration::from_secs(60),
            cluster_secret: secret.cloned(),
            ..MasterConfig::default()
        })?;
        let holder = StoreClient::connect(ClientConfig {
            global_segment_size: (4 * value + (64 << 20)).next_multiple_of(2 << 20),
            ..client_config(&master, secret)
        })?;
        let user = StoreClient::connect(ClientConfig {
            global_segment_size: 0,
            local_buffer_size: (2 * value + (16 << 20)).next_multiple_of(2 << 20),
            ..client_config(&master, secret)
        })?;
        let dst = user.engine().alloc_registered(value.next_multiple_of(2 << 20), "cpu:0")?;
        Ok(StoreSide { dst, user, holder, master })
    }
}

/// The value at `q` (0..=1) of sorted `v`, nearest rank.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// A 95 % bootstrap confidence interval of the median of the pooled `rounds` (percentile
/// method, `resamples` resamples, a fixed seed so that a run's figures can be recomputed).
/// Each resample draws rounds with replacement, then each drawn round's values with
/// replacement: the rounds' own differences (each builds its engines and masters anew) widen
/// the interval, as they should.
fn bootstrap_median_ci(rounds: &[Vec<f64>], resamples: usize) -> (f64, f64) {
    let rounds: Vec<&Vec<f64>> = rounds.iter().filter(|r| !r.is_empty()).collect();
    if rounds.is_empty() || resamples == 0 {
        return (0.0, 0.0);
    }
    let mut rng = StdRng::seed_from_u64(0x9e37_79b9_7f4a_7c15);
    let mut next = |n: usize| rng.random_range(0..n);
    let mut medians: Vec<f64> = (0..resamples)
        .map(|_| {
            let mut sample = Vec::new();
            for _ in 0..rounds.len() {
                let r = rounds[next(rounds.len())];
                sample.extend((0..r.len()).map(|_| r[next(r.len())]));
            }
            median(&sample)
        })
        .collect();
    medians.sort_by(|a, b| a.total_cmp(b));
    (quantile(&medians, 0.025), quantile(&medians, 0.975))
}

/// `pairs` pairs of `measure(side, pair)` (bytes per second), on and off in alternating order,
/// after one unmeasured warm-up of each.
fn measure_pairs(pairs: usize, mut measure: impl FnMut(Side, usize) -> Result<f64>) -> Result<Pairs> {
    measure(Side::On, usize::MAX)?;
    measure(Side::Off, usize::MAX)?;
    let mut out = Pairs::default();
    for p in 0..pairs {
        let (on, off) = if p % 2 == 0 {
            let on = measure(Side::On, p)?;
            (on, measure(Side::Off, p)?)
        } else {
            let off = measure(Side::Off, p)?;
            (measure(Side::On, p)?, off)
        };
        out.push(on, off);
    }
    Ok(out)
}

/// Prints a row from its rounds' pairs; returns whether it met the target.
fn print_row(label: &str, size: u64, rounds: &[Pairs], resamples: usize) -> bool {
    let all = Pairs {
        ours: rounds.iter().flat_map(|p| p.ours.clone()).collect(),
        limit: rounds.iter().flat_map(|p| p.limit.clone()).collect(),
    };
    let mut ratios = all.ratios();
    let ratio = median(&ratios);
    let per_round: Vec<Vec<f64>> = rounds.iter().map(Pairs::ratios).collect();
    let (lo, hi) = bootstrap_median_ci(&per_round, resamples);
    ratios.sort_by(|a, b| a.total_cmp(b));
    let met = TARGET.met(ratio);
    let round_medians: Vec<String> = per_round.iter().map(|r| format!("{:.2}", median(r))).collect();
    println!(
        "| {label} | {} | {:.2} | {:.2} | {ratio:.3} | {:.3}-{:.3} | {lo:.3}-{hi:.3} | {} | {TARGET} | {} |",
        report::fmt_bytes(size),
        median(&all.ours) / 1e9,
        median(&all.limit) / 1e9,
        quantile(&ratios, 0.05),
        quantile(&ratios, 0.95),
        round_medians.join(" "),
        if met { "met" } else { "NOT met" }
    );
    met
}

/// Median microseconds to open the segment `name` from `dialer` and read its first 4 KiB
/// (both the handshake port and the tcp data connections authenticate), the segment closed
/// (its connections dropped) after each.
fn connect_us(dialer: &TransferEngine, local: &RegisteredMemory, name: &str, remote: u64) -> Result<f64> {
    let t = Instant::now();
    let id = dialer.open_segment(name)?;
    dialer.transfer_sync(&[TransferRequest {
        opcode: Opcode::Read,
        source: local.addr(),
        target: id,
        target_offset: remote,
        length: 4096,
    }])?;
    let us = t.elapsed().as_secs_f64() * 1e6;
    dialer.close_segment(id)?;
    Ok(us)
}

/// Connections `engine`'s listeners admitted after authenticating them, every service.
fn admitted(engine: &TransferEngine) -> u64 {
    Service::ALL.iter().map(|&s| engine.auth().stats().accepted(s)).sum()
}

/// Whether `engine` refused a connection since its count was `before`, waiting up to 5 s for
/// the count (its listener counts as it drops the connection).
fn refused_since(engine: &TransferEngine, before: u64) -> bool {
    let until = Instant::now() + Duration::from_secs(5);
    while engine.auth().stats().refused_total() <= before {
        if Instant::now() > until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

/// The rows, in the order printed.
const ROWS: [&str; 5] = ["engine read", "engine write", "store put", "store get", "store get_into (zero copy)"];

/// `build(side)` for both sides, `on_first` deciding which is built first: (on, off).
fn both<T>(on_first: bool, mut build: impl FnMut(Side) -> Result<T>) -> Result<(T, T)> {
    if on_first {
        let on = build(Side::On)?;
        Ok((on, build(Side::Off)?))
    } else {
        let off = build(Side::Off)?;
        Ok((build(Side::On)?, off))
    }
}

/// Fails unless the secret-on target refuses an engine without the secret.
fn check_engine_refuses(on: &EnginePair) -> Result<()> {
    let stranger = engine(None)?;
    let refused_before = on.target.auth().stats().refused_total();
    match stranger.open_segment(on.target.segment_name()) {
        Ok(_) => bail!("the secret-on target served an engine without the secret: the secret is not applied"),
        // The target's own count says why: it refused the dialer's authentication (counted
        // as the target's thread returns from the exchange; waited for, a few seconds at most).
        Err(e) if refused_since(&on.target, refused_before) => {
            println!("secret applied: the secret-on target refused an engine without the secret ({e})");
            Ok(())
        }
        Err(e) => bail!("an engine without the secret failed otherwise than refused by the target: {e}"),
    }
}

/// Fails unless the secret-on master refuses a client without the secret.
fn check_master_refuses(on: &StoreSide) -> Result<()> {
    match StoreClient::connect(ClientConfig { global_segment_size: 16 << 20, ..client_config(&on.master, None) }) {
        Ok(_) => bail!("the secret-on master served a client without the secret: the secret is not applied"),
        Err(StoreError::Unauthenticated { addr, .. }) => {
            println!("secret applied: the secret-on master at {addr} refused a client without the secret");
            Ok(())
        }
        Err(e) => bail!("a client without the secret failed otherwise than refused: {e}"),
    }
}

/// Prints the handshake's added latency: `connects` connections to each target, alternately.
fn handshake(keyring: &Keyring, on: &EnginePair, off: &EnginePair, connects: usize) -> Result<()> {
    let dialers = [(engine(Some(keyring))?, on), (engine(None)?, off)];
    let locals =
        dialers.iter().map(|(d, _)| d.alloc_registered(4096, "cpu:0")).collect::<std::result::Result<Vec<_>, _>>()?;
    let mut times: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for i in 0..connects + 1 {
        for j in [i % 2, 1 - i % 2] {
            let (dialer, pair) = &dialers[j];
            let us = connect_us(dialer, &locals[j], pair.target.segment_name(), pair.remote)?;
            if i > 0 {
                // The first of each is a warm-up (first use of the code paths).
                times[j].push(us);
            }
        }
    }
    let (con_on, con_off) = (median(&times[0]), median(&times[1]));
    println!(
        "handshake: open_segment + first 4 KiB read, median of {connects}: secret on {con_on:.0} us, off {con_off:.0} \
         us: authentication adds {:.0} us per connection",
        con_on - con_off
    );
    Ok(())
}

pub fn run(args: AuthPairArgs) -> Result<()> {
    if args.pairs == 0
        || args.rounds == 0
        || args.block_size == 0
        || args.chunk < args.block_size
        || args.value_size == 0
    {
        bail!("--pairs, --rounds, --block-size and --value-size must be positive and --chunk at least --block-size");
    }
    // The "off" side must hold no secret: engines and masters built without one would take
    // the environment's.
    for var in [SECRET_ENV, SECRET_NEXT_ENV, SECRET_FILE_ENV] {
        if std::env::var_os(var).is_some() {
            bail!("{var} is set: run tebench auth-pair without a cluster secret in the environment (it makes its own)");
        }
    }
    let load = Load::start();
    let secret = format!("{:032x}{:032x}", rand::random::<u128>(), rand::random::<u128>());
    let keyring = Keyring::new(&[secret.as_str()])?;
    let per_round = args.pairs.div_ceil(args.rounds);
    println!(
        "tebench auth-pair: the cluster secret on vs off in one process, loopback, {} rounds of {per_round} pairs per \
         row, {}",
        args.rounds,
        report::utc_now()
    );
    let mut rows: Vec<Vec<Pairs>> = vec![Vec::new(); ROWS.len()];
    // Connections the secret-on target and holder authenticated while their rows ran.
    let mut handshakes = [0u64; 2];
    let size = args.value_size;
    let mut value = vec![0u8; size as usize];
    pattern::fill(&mut value, 7, 0);
    for round in 0..args.rounds {
        // Each round builds both sides anew, in alternating order: what one instance has
        // that the other has not (where its threads run, its memory) varies between rounds
        // instead of biasing every pair alike.
        let on_first = round % 2 == 0;
        let (on, off) = both(on_first, |s| EnginePair::new((s == Side::On).then_some(&keyring), args.chunk))?;
        if round == 0 {
            check_engine_refuses(&on)?;
            handshake(&keyring, &on, &off, args.connects)?;
        }
        let engines = |s: Side| if s == Side::On { &on } else { &off };
        let before = admitted(&on.target);
        for (i, op) in [Opcode::Read, Opcode::Write].into_iter().enumerate() {
            rows[i].push(measure_pairs(per_round, |s, _| engines(s).chunk(op, args.chunk, args.block_size))?);
        }
        handshakes[0] += admitted(&on.target) - before;
        drop((on, off));
        let (on, off) = both(on_first, |s| StoreSide::new((s == Side::On).then_some(&keyring), size))?;
        if round == 0 {
            check_master_refuses(&on)?;
        }
        let store = |s: Side| if s == Side::On { &on } else { &off };
        let before = admitted(on.holder.engine());
        // put: a new key each time, removed after it is measured.
        rows[2].push(measure_pairs(per_round, |s, p| {
            let key = format!("auth-pair/put/{p}");
            let user = &store(s).user;
            let t = Instant::now();
            user.put(&key, &value)?;
            let rate = size as f64 / t.elapsed().as_secs_f64();
            user.remove_with(&key, true)?;
            Ok(rate)
        })?);
        for st in [&on, &off] {
            st.user.put("auth-pair/get", &value)?;
            if st.user.get("auth-pair/get")? != value {
                bail!("a get returned other bytes than were put");
            }
        }
        rows[3].push(measure_pairs(per_round, |s, _| {
            let t = Instant::now();
            let got = store(s).user.get("auth-pair/get")?;
            let rate = size as f64 / t.elapsed().as_secs_f64();
            if got.len() as u64 != size {
                bail!("a get returned {} bytes, not {size}", got.len());
            }
            Ok(rate)
        })?);
        rows[4].push(measure_pairs(per_round, |s, _| {
            let st = store(s);
            let t = Instant::now();
            let got = st.user.get_into("auth-pair/get", st.dst.addr(), size)?;
            let rate = size as f64 / t.elapsed().as_secs_f64();
            if got != size {
                bail!("a get_into returned {got} bytes, not {size}");
            }
            Ok(rate)
        })?);
        handshakes[1] += admitted(on.holder.engine()) - before;
    }
    println!();
    println!(
        "| row | size | secret on GB/s | secret off GB/s | on/off (median of pairs) | p5-p95 | 95 % CI of the median \
         | rounds' medians | target | |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut missed = 0;
    for (i, label) in ROWS.iter().enumerate() {
        let row_size = if i < 2 { args.chunk } else { size };
        missed += usize::from(!print_row(label, row_size, &rows[i], args.resamples));
    }
    println!();
    // Per connection, not per request: a handful of connections for hundreds of transfers.
    let per_side = args.rounds * (per_round + 1);
    println!(
        "authenticated connections while the rows ran (secret-on side): engine target {} for {} transfers, store \
         holder {} for {} puts, gets and get_intos",
        handshakes[0],
        2 * per_side,
        handshakes[1],
        3 * per_side + args.rounds
    );
    load.finish();
    if missed > 0 {
        println!("tebench auth-pair: {missed} row(s) below the target");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_and_the_bootstrap_interval_hold_the_median() {
        let v: Vec<f64> = (1..=101).map(f64::from).collect();
        assert_eq!((quantile(&v, 0.05), quantile(&v, 0.5), quantile(&v, 0.95)), (6.0, 51.0, 96.0));
        let (lo, hi) = bootstrap_median_ci(&[v], 500);
        assert!(lo <= 51.0 && 51.0 <= hi && lo >= 30.0 && hi <= 72.0, "{lo}-{hi}");
        assert_eq!(bootstrap_median_ci(&[vec![1.0; 9]], 100), (1.0, 1.0));
        // Two rounds that disagree: the interval spans both, not the pooled pairs' spread.
        let (lo, hi) = bootstrap_median_ci(&[vec![0.9; 50], vec![1.1; 50]], 500);
        assert_eq!((lo, hi), (0.9, 1.1));
    }
}
