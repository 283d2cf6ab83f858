//! `storebench master`: the master at the sizes a cluster reaches, driven over gRPC by many
//! simulated clients.
//!
//! For each store size of `--objects` (default 100k and 1M objects), a fresh `crescent-master`
//! is spawned (or the one of `--master` is used) and `--clients` simulated clients (64 by
//! default, each with its own gRPC channel, as tasks of one tokio runtime; their owner streams
//! acknowledge on a runtime of their own, `--ack-threads`) mount one segment
//! each. The segments are fake (names and addresses no process serves): the master only keeps
//! metadata, so no memory stands behind them. Their sizes are chosen so that the store reaches
//! the master's high watermark at about `--objects` values of `--value-size` (64 KiB KV blocks
//! by default). Then:
//!
//! 1. *fill* half the store (batched puts: `BatchPutStart` + `BatchPutEnd` of `--batch` keys);
//! 2. a mixed stream below the watermark, one key per call: per cycle a put (`PutStart` +
//!    `PutEnd`), two `GetReplicaList`, one `Exists` and one `Remove` of the client's own oldest
//!    new key, so that the store neither grows nor evicts;
//! 3. the same stream batched (`--batch` keys per call; gets and exists of as many keys as
//!    puts), without removes (there is no batch remove RPC): it stops before the store
//!    nears the watermark;
//! 4. *fill* to `--objects`; the master's RSS (`VmRSS` of `/proc/PID/status`) before the fill
//!    and after, divided by the objects, is its memory per object;
//! 5. eviction rounds: the store is topped up to one put below the watermark, then single puts
//!    follow until one of them makes the master evict (seen in `NodeStats`: used bytes drop).
//!    The master's evictor runs the round after that put answered: the time from the put's
//!    start to the last drop of the used bytes is one eviction round (over once nothing
//!    changed for 200 ms and no evicted range waits for its owner's acknowledgement); that
//!    put's `PutStart` time is shown beside an ordinary put's;
//! 6. and 7. the single and batched streams again (no removes), each started one put below the
//!    watermark, so that eviction runs while all clients call;
//! 8. the single-key stream while evicting again in *open loop*, once per share of
//!    `--open-loop` (default 0.5 and 0.75): all clients together offer that share of the RPC
//!    rate the closed-loop single-key stream reached below the watermark (phase 2), each client
//!    at a fixed pace. In the closed loop (2, 6) every client calls again the moment an answer
//!    comes, so 64 callers always wait and the latency is mostly their queue (Little's law:
//!    64 / rate); the open loop asks what a call costs at a load the master keeps up with. A
//!    call's latency counts from when it was due: a client that fell behind its pace (the
//!    master was slow) is charged for the wait, so slowness is not hidden by calling less
//!    (coordinated omission); a client ahead of its pace sleeps and counts from the send.
//!    Every share also runs right after phase 2, below the watermark (with removes, as
//!    phase 2): the same calls at the same load with nothing evicting, so the rows while
//!    evicting show what eviction adds to a call's tail.
//!
//! A put counts as one metadata op (its two RPCs are timed separately); gets, exists and
//! removes as one op per key. Latencies are of single RPCs as the clients see them (their
//! runtime shares the machine's cores with the master). Gets and exists ask for uniformly
//! random keys of the fill; after eviction some are gone, counted as misses, not failures.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use crescent_engine::parse_size;
use crescent_store::proto::master_client::MasterClient;
use crescent_store::proto::{
    BatchKeyRequest, BatchPutStartRequest, Checksum, Code, KeyRequest, MountSegmentRequest, NodeStatsRequest, OwnerAck,
    PingRequest, PutOptions, PutStartRequest, RemoveRequest, SegmentInfo, Status, Tier,
};
use hdrhistogram::Histogram;
use rand::Rng;
use tonic::transport::{Channel, Endpoint};

use crate::report;

mod fill;
mod lanes;
mod stream;
mod tables;

use fill::{fill_keys, put_batch, settled, top_up};
use lanes::Lanes;
use stream::{open_loop_phase, open_loop_stream, stream, Stream};
use tables::print_tables;

/// Largest gRPC message the simulated clients send or accept (the master's own limit).
const MAX_MESSAGE: usize = 256 << 20;

/// The checksum every simulated put starts with (no bytes move here): as a client's put of a
/// value up to `checksum::START_MAX` does, so that `PutEnd` is measured on its usual path
/// (the owners told at the start, nothing to wait for at the end).
const VALUE_CRC: Checksum = Checksum { crc32: 0 };

#[derive(Args, Debug, Clone)]
pub struct MasterArgs {
    /// A running master (host:port) instead of spawning one; then one size of --objects only,
    /// and its RSS only with --master-pid.
    #[arg(long)]
    pub master: Option<String>,
    /// Pid of the master given with --master (for its RSS).
    #[arg(long)]
    pub master_pid: Option<u32>,
    /// The master to spawn [default: crescent-master beside this executable, else on PATH].
    #[arg(long)]
    pub master_bin: Option<PathBuf>,
    /// Simulated clients, one segment and one gRPC channel each.
    #[arg(long, default_value_t = 64)]
    pub clients: usize,
    /// Store sizes in objects (decimal k/M suffixes), each on a fresh master.
    #[arg(long, value_delimiter = ',', default_value = "100k,1M", value_parser = parse_count)]
    pub objects: Vec<u64>,
    /// Value size the segments are sized for (a KV block).
    #[arg(long, default_value = "64K", value_parser = parse_size)]
    pub value_size: u64,
    /// Keys per batch call (fills and the batched streams).
    #[arg(long, default_value_t = 128)]
    pub batch: usize,
    /// Seconds per mixed-stream phase.
    #[arg(long, default_value_t = 5.0)]
    pub duration: f64,
    /// Eviction rounds timed per store size.
    #[arg(long, default_value_t = 5)]
    pub eviction_rounds: usize,
    /// The master's eviction high watermark (passed to a spawned master; with --master, say
    /// what it runs with).
    #[arg(long, default_value_t = 0.90)]
    pub high_watermark: f64,
    /// Read lease of a spawned master, in ms. Leased objects are not evicted: with the 10 s
    /// default, the clients' random gets would lease most of a 100k-object store.
    #[arg(long, default_value_t = 1000)]
    pub lease_ttl_ms: u64,
    /// Deadline of every RPC, in seconds.
    #[arg(long, default_value_t = 30.0)]
    pub rpc_timeout: f64,
    /// Threads of a runtime of their own for the simulated owners to acknowledge the master's
    /// news on; 0: each owner on its client's runtime, as a real client acknowledges on the
    /// runtime its calls use (on two CPUs one thread fewer for the scheduler to share out).
    #[arg(long, default_value_t = 0)]
    pub ack_threads: usize,
    /// Threads the simulated clients' calls run on, each a single-threaded runtime serving
    /// its share of the clients (client i on thread i mod N); 0: one work-stealing runtime
    /// of two threads for all of them. Default: half the CPUs, at least one (the master
    /// needs the rest).
    #[arg(long)]
    pub client_threads: Option<usize>,
    /// Open-loop single-key phases while evicting: the RPC rates the clients offer together, as
    /// shares of the rate the closed-loop single-key stream reached below the watermark
    /// (comma-separated, each in (0, 1]; empty for none).
    #[arg(long, default_value = "0.5,0.75", value_parser = parse_shares)]
    pub open_loop: Shares,
}

/// Shares of a rate, from a comma-separated list (empty: none).
#[derive(Clone, Debug, PartialEq)]
pub struct Shares(pub Vec<f64>);

impl std::ops::Deref for Shares {
    type Target = [f64];
    fn deref(&self) -> &[f64] {
        &self.0
    }
}

/// "0.5,0.75" as shares, each in (0, 1]; "" as none.
pub fn parse_shares(s: &str) -> Result<Shares, String> {
    let share = |t: &str| match t.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= 1.0 => Ok(v),
        _ => Err(format!("{t:?} is not a share in (0, 1] (examples: 0.5, 0.75)")),
    };
    Ok(Shares(if s.trim().is_empty() { Vec::new() } else { s.split(',').map(share).collect::<Result<_, _>>()? }))
}

/// "100k", "1M", "10M", "2500" as a count (decimal suffixes).
pub fn parse_count(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (digits, mult) = match t.char_indices().last() {
        Some((i, 'k' | 'K')) => (&t[..i], 1_000),
        Some((i, 'm' | 'M')) => (&t[..i], 1_000_000),
        Some((i, 'g' | 'G')) => (&t[..i], 1_000_000_000),
        _ => (t, 1),
    };
    let n: u64 = digits.parse().map_err(|_| format!("{s:?} is not a count (examples: 2000, 100k, 1M, 10M)"))?;
    n.checked_mul(mult).filter(|n| *n > 0).ok_or_else(|| format!("{s:?} is not a positive count"))
}

/// The RPCs timed, by kind.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Rpc {
    PutStart,
    PutEnd,
    Get,
    Exists,
    Remove,
    BatchPutStart,
    BatchPutEnd,
    BatchGet,
    BatchExists,
}

const RPCS: [Rpc; 9] = [
    Rpc::PutStart,
    Rpc::PutEnd,
    Rpc::Get,
    Rpc::Exists,
    Rpc::Remove,
    Rpc::BatchPutStart,
    Rpc::BatchPutEnd,
    Rpc::BatchGet,
    Rpc::BatchExists,
];

impl Rpc {
    fn name(self) -> &'static str {
        match self {
            Rpc::PutStart => "PutStart",
            Rpc::PutEnd => "PutEnd",
            Rpc::Get => "GetReplicaList",
            Rpc::Exists => "Exists",
            Rpc::Remove => "Remove",
            Rpc::BatchPutStart => "BatchPutStart",
            Rpc::BatchPutEnd => "BatchPutEnd",
            Rpc::BatchGet => "BatchGetReplicaList",
            Rpc::BatchExists => "BatchExists",
        }
    }
}

/// What one phase (or one client's share of it) measured.
struct Tally {
    hist: Vec<Histogram<u64>>,
    all: Histogram<u64>,
    ops: u64,
    puts: u64,
    removes: u64,
    misses: u64,
    failed: u64,
    first_failure: Option<String>,
}

impl Tally {
    fn new() -> Self {
        let h = || Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("histogram bounds");
        Tally {
            hist: RPCS.iter().map(|_| h()).collect(),
            all: h(),
            ops: 0,
            puts: 0,
            removes: 0,
            misses: 0,
            failed: 0,
            first_failure: None,
        }
    }
    fn record(&mut self, rpc: Rpc, took: Duration) {
        let us = (took.as_micros() as u64).max(1);
        let i = RPCS.iter().position(|r| *r == rpc).expect("listed");
        self.hist[i].saturating_record(us);
        self.all.saturating_record(us);
    }
    fn fail(&mut self, what: String) {
        self.failed += 1;
        self.first_failure.get_or_insert(what);
    }
    fn add(&mut self, o: &Tally) {
        for (a, b) in self.hist.iter_mut().zip(&o.hist) {
            a.add(b).expect("same bounds");
        }
        self.all.add(&o.all).expect("same bounds");
        self.ops += o.ops;
        self.puts += o.puts;
        self.removes += o.removes;
        self.misses += o.misses;
        self.failed += o.failed;
        if self.first_failure.is_none() {
            self.first_failure.clone_from(&o.first_failure);
        }
    }
}

/// One simulated client: its id, channel, and the keys it put in the streams (oldest first).
struct Sim {
    index: usize,
    id: String,
    rpc: MasterClient<Channel>,
    /// The runtime this client's calls run on.
    lane: tokio::runtime::Handle,
    next: u64,
    live: VecDeque<String>,
}

fn ok(s: &Option<Status>) -> bool {
    s.as_ref().is_none_or(|s| s.code == Code::Ok as i32)
}

fn code_of(s: &Option<Status>) -> i32 {
    s.as_ref().map_or(0, |s| s.code)
}

fn describe(s: &Option<Status>) -> String {
    match s {
        Some(s) => format!("{:?}: {}", Code::try_from(s.code).unwrap_or(Code::Internal), s.message),
        None => "no status".into(),
    }
}

/// A spawned master, killed and reaped when dropped.
struct Spawned(Child);

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn master_bin(args: &MasterArgs) -> Result<PathBuf> {
    if let Some(p) = &args.master_bin {
        return Ok(p.clone());
    }
    let beside = std::env::current_exe()?.parent().map(|d| d.join("crescent-master"));
    if let Some(p) = beside.filter(|p| p.exists()) {
        return Ok(p);
    }
    Ok(PathBuf::from("crescent-master"))
}

fn spawn_master(args: &MasterArgs) -> Result<(Spawned, String, u32, String)> {
    let bin = master_bin(args)?;
    let mut child = Command::new(&bin)
        .args(["--rpc-address", "127.0.0.1:0", "--admin-address", ""])
        .args(["--eviction-high-watermark", &args.high_watermark.to_string()])
        .args(["--lease-ttl-ms", &args.lease_ttl_ms.to_string()])
        // The simulated clients ping every second; a long eviction round may hold their pings.
        .args(["--client-ttl-ms", "60000"])
        // Its per-mount and per-eviction info lines would bury the tables; warnings still show.
        .env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("spawning {} (build it: cargo build -p crescent-store)", bin.display()))?;
    let pid = child.id();
    let stdout = child.stdout.take().context("master stdout")?;
    let guard = Spawned(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(a) = line.strip_prefix("master: ") {
                let _ = tx.send(a.trim().to_string());
            }
        }
    });
    let addr = rx.recv_timeout(Duration::from_secs(60)).context("the master did not print its address")?;
    Ok((guard, addr, pid, bin.display().to_string()))
}

/// `VmRSS` of a process, in bytes.
fn rss(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kb| kb * 1024)
}

/// CPU time (user + system) of the process's threads named `name`: `/proc/PID/task/*/stat`,
/// in clock ticks (10 ms at the usual 100 per second).
fn thread_cpu(pid: u32, name: &str) -> Option<Duration> {
    let mut ticks = 0u64;
    let mut found = false;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()?.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim_end() != name {
            continue;
        }
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        // After "pid (comm) ": state is field 3, utime 14 and stime 15.
        let fields: Vec<&str> = stat.rsplit_once(')').map_or("", |(_, rest)| rest).split_whitespace().collect();
        let time = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok());
        ticks += time(11)? + time(12)?;
        found = true;
    }
    let per_second = rustix::param::clock_ticks_per_second();
    found.then(|| Duration::from_secs_f64(ticks as f64 / per_second.max(1) as f64))
}

struct Sizes {
    capacity: u64,
    used: u64,
    objects: u64,
}

async fn node_stats(rpc: &mut MasterClient<Channel>, client: &str) -> Result<Sizes> {
    let r = rpc.node_stats(NodeStatsRequest { client_id: client.into() }).await?.into_inner();
    if !ok(&r.status) {
        bail!("NodeStats: {}", describe(&r.status));
    }
    Ok(r.nodes.iter().fold(Sizes { capacity: 0, used: 0, objects: 0 }, |s, n| Sizes {
        capacity: s.capacity + n.capacity,
        used: s.used + n.used,
        objects: s.objects + n.objects,
    }))
}

/// The figures of one phase of one store size.
struct PhaseRow {
    objects: u64,
    phase: String,
    secs: f64,
    tally: Tally,
    evicted: Option<u64>,
    target: &'static str,
}

struct SizeRow {
    objects: u64,
    rss_mounted: Option<u64>,
    rss_filled: Option<u64>,
    filled: u64,
    rounds_us: Vec<u64>,
    evicted_per_round: Vec<u64>,
    plain_put_us: Vec<u64>,
    /// PutStart of the put that crossed the watermark (the round runs after it answered).
    crossing_put_us: Vec<u64>,
    /// The evictor thread's CPU time over the eviction rounds (phase 5), when the master's pid
    /// is known: a round is paced (`--evictor-duty`), so its wall time is not its cost.
    evictor_cpu: Option<Duration>,
}

pub fn run(args: MasterArgs) -> Result<()> {
    if args.clients == 0 || args.batch == 0 || args.objects.is_empty() {
        bail!("--clients, --batch and --objects must be positive");
    }
    let positive = |v: f64| v > 0.0 && v.is_finite();
    if !positive(args.duration) || !positive(args.rpc_timeout) {
        bail!("--duration and --rpc-timeout must be positive");
    }
    if !(args.high_watermark > 0.1 && args.high_watermark <= 1.0) {
        bail!("--high-watermark must be in (0.1, 1]");
    }
    if args.master.is_some() && args.objects.len() > 1 {
        bail!("with --master, give one size of --objects (each size needs a fresh master)");
    }
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let client_threads = args
        .client_threads
        .unwrap_or_else(|| client_threads_for(std::thread::available_parallelism().map_or(1, |n| n.get())));
    let lanes = Lanes::start(client_threads)?;
    let ack_runtime = match args.ack_threads {
        0 => None,
        n => Some(
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(n)
                .thread_name("storebench-acks")
                .enable_all()
                .build()?,
        ),
    };
    let acks = ack_runtime.as_ref().map(|r| r.handle().clone());
    let load = report::Load::start();
    println!(
        "{} storebench master: {} simulated clients (one gRPC channel and one fake segment each), values of {}, \
         batches of {} keys, {} s per stream, lease {} ms, high watermark {}, clients' calls on {}, owners' \
         acknowledgements on {}",
        report::utc_now(),
        args.clients,
        report::fmt_bytes(args.value_size),
        args.batch,
        args.duration,
        args.lease_ttl_ms,
        args.high_watermark,
        match client_threads {
            0 => "a work-stealing runtime of 2 threads".to_string(),
            n => format!("{n} single-threaded runtime(s)"),
        },
        match args.ack_threads {
            0 => "the clients' runtimes".to_string(),
            n => format!("a runtime of {n} thread(s) of their own"),
        }
    );
    let mut phases = Vec::new();
    let mut sizes = Vec::new();
    for &n in &args.objects {
        let (_guard, addr, pid, what) = match &args.master {
            Some(a) => (None, a.clone(), args.master_pid, format!("given, {a}")),
            None => {
                let (g, a, pid, bin) = spawn_master(&args)?;
                (Some(g), a.clone(), Some(pid), format!("{bin}, pid {pid}, {a}"))
            }
        };
        println!("{n} objects: master {what}");
        let (p, s) = runtime.block_on(one_size(&args, &addr, pid, n, &acks, &lanes))?;
        phases.extend(p);
        sizes.push(s);
    }
    print_tables(&phases, &sizes);
    load.finish();
    let failed: u64 = phases.iter().map(|p| p.tally.failed).sum();
    println!("failed calls: {failed}");
    if failed > 0 {
        let first = phases.iter().find_map(|p| p.tally.first_failure.clone()).unwrap_or_default();
        bail!("{failed} call(s) failed; first: {first}");
    }
    Ok(())
}

async fn connect(args: &MasterArgs, addr: &str) -> Result<MasterClient<Channel>> {
    let channel = Endpoint::from_shared(format!("http://{addr}"))?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs_f64(args.rpc_timeout))
        .tcp_nodelay(true)
        .connect()
        .await
        .with_context(|| format!("connecting to the master at {addr}"))?;
    Ok(MasterClient::new(channel).max_decoding_message_size(MAX_MESSAGE).max_encoding_message_size(MAX_MESSAGE))
}

async fn one_size(
    args: &MasterArgs,
    addr: &str,
    pid: Option<u32>,
    n: u64,
    acks: &Option<tokio::runtime::Handle>,
    lanes: &Lanes,
) -> Result<(Vec<PhaseRow>, SizeRow)> {
    let clients = args.clients as u64;
    let s = args.value_size;
    // Segments sized so that the watermark falls at about n objects.
    let per_segment = ((n as f64 * s as f64 / (args.high_watermark - 0.005) / clients as f64).ceil() as u64)
        .div_ceil(1 << 20)
        * (1 << 20);
    let run_id = std::process::id();
    let mut sims = Vec::new();
    // Each simulated client is the owner of its segment: it acknowledges the master's news,
    // as a real client does, or no put of its segment would commit.
    let mut owners = Vec::new();
    for i in 0..args.clients {
        let lane = lanes.of(i);
        // Connected on its lane: the channel's connection is driven there.
        let (lane_args, lane_addr) = (args.clone(), addr.to_string());
        let mut rpc = lane.spawn(async move { connect(&lane_args, &lane_addr).await }).await??;
        let id = format!("storebench-master-{run_id}-{i}");
        let r = rpc
            .mount_segment(MountSegmentRequest {
                client_id: id.clone(),
                segment: Some(SegmentInfo {
                    name: format!("198.18.{}.{}:{}", 1 + i / 250, 1 + i % 250, 20000 + i),
                    base: (i as u64 + 1) << 40,
                    size: per_segment,
                    tier: Tier::Dram as i32,
                }),
                host: format!("198.18.{}.{}", 1 + i / 250, 1 + i % 250),
            })
            .await?
            .into_inner();
        if !ok(&r.status) {
            bail!("MountSegment: {}", describe(&r.status));
        }
        // On the acknowledging runtime, channel included (its connection is driven there).
        let (owner_args, owner_addr, owner_id) = (args.clone(), addr.to_string(), id.clone());
        let (term, segment_id) = (r.term, r.segment_id);
        let owner = acks.as_ref().unwrap_or(&lane).spawn(async move {
            let rpc = connect(&owner_args, &owner_addr).await?;
            acknowledge_news(rpc, owner_id, term, segment_id).await;
            anyhow::Ok(())
        });
        owners.push(owner);
        sims.push(Sim { index: i, id, rpc, lane, next: 0, live: VecDeque::new() });
    }
    // Heartbeats for every simulated client, on a channel of their own.
    let stop_pings = Arc::new(AtomicBool::new(false));
    let pinger = {
        let mut rpc = connect(args, addr).await?;
        let ids: Vec<String> = sims.iter().map(|s| s.id.clone()).collect();
        let stop = stop_pings.clone();
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                for id in &ids {
                    let _ = rpc.ping(PingRequest { client_id: id.clone(), disk: None }).await;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
    };
    let result = phases_of_size(args, pid, n, per_segment, &mut sims).await;
    stop_pings.store(true, Ordering::Relaxed);
    let _ = pinger.await;
    owners.iter().for_each(tokio::task::JoinHandle::abort);
    result
}

/// The default client threads on a machine of `cpus`: half of them, at least one.
fn client_threads_for(cpus: usize) -> usize {
    (cpus / 2).max(1)
}

/// A simulated owner's stream: every item of news acknowledged as soon as it arrives (a real
/// client applies it to its owner index first).
async fn acknowledge_news(mut rpc: MasterClient<Channel>, client_id: String, term: u64, segment_id: u64) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<OwnerAck>();
    let ack = |acked| OwnerAck { client_id: client_id.clone(), term, acked, segment_id };
    if tx.send(ack(0)).is_err() {
        return;
    }
    let Ok(opened) = rpc.owner_stream(tokio_stream::wrappers::UnboundedReceiverStream::new(rx)).await else {
        return;
    };
    let mut news = opened.into_inner();
    while let Ok(Some(n)) = news.message().await {
        if let Some(last) = n.items.iter().map(|i| i.seq).max() {
            if tx.send(ack(last)).is_err() {
                return;
            }
        }
    }
}

async fn phases_of_size(
    args: &MasterArgs,
    pid: Option<u32>,
    n: u64,
    per_segment: u64,
    sims: &mut Vec<Sim>,
) -> Result<(Vec<PhaseRow>, SizeRow)> {
    let dur = Duration::from_secs_f64(args.duration);
    let b = args.batch;
    let mut rows = Vec::new();
    let admin_id = sims[0].id.clone();
    let mut admin = sims[0].rpc.clone();
    let rss_mounted = pid.and_then(rss);
    let sizes = node_stats(&mut admin, &admin_id).await?;
    println!(
        "  {} segments of {} ({} in all); master RSS after mounting: {}",
        sims.len(),
        report::fmt_bytes(per_segment),
        report::fmt_bytes(sizes.capacity),
        rss_mounted.map_or("-".into(), report::fmt_bytes)
    );

    // 1. Fill half.
    let started = Instant::now();
    let mut fill = fill_keys(sims, 0, n / 2, b, args.value_size).await?;
    let half_secs = started.elapsed().as_secs_f64();
    let mut filled = n / 2;

    // 2. Single calls below the watermark.
    let (t, secs) = stream(
        sims,
        filled,
        Stream { batch: 1, value_size: args.value_size, removes: true, dur, put_budget: None, pace: None },
    )
    .await;
    let closed_loop_rate = t.all.len() as f64 / secs.max(1e-9);
    rows.push(PhaseRow {
        objects: n,
        phase: "mixed, 1 key per call, below the watermark".into(),
        secs,
        tally: t,
        evicted: Some(0),
        target: "-",
    });
    // 2b. The same in open loop at each share: the tail of a call with nothing evicting, beside
    // which the open-loop phases at the same shares while evicting (8.) tell what eviction adds.
    for &share in args.open_loop.iter() {
        let offered = closed_loop_rate * share;
        let spec = open_loop_stream(args, sims.len(), offered, true, dur);
        let (t, secs) = stream(sims, filled, spec).await;
        rows.push(PhaseRow {
            objects: n,
            phase: format!("{}, below the watermark", open_loop_phase(offered, share)),
            secs,
            tally: t,
            evicted: Some(0),
            target: "-",
        });
    }
    // 3. Batched, below the watermark: the puts may fill up to 0.85 of capacity.
    let now = node_stats(&mut admin, &admin_id).await?;
    let per = (now.used / now.objects.max(1)).max(1);
    let budget = ((now.capacity as f64 * (args.high_watermark - 0.05)) as u64).saturating_sub(now.used) / per;
    let (t, secs) = stream(
        sims,
        filled,
        Stream { batch: b, value_size: args.value_size, removes: false, dur, put_budget: Some(budget), pace: None },
    )
    .await;
    rows.push(PhaseRow {
        objects: n,
        phase: format!("mixed, batched x{b}, below the watermark"),
        secs,
        tally: t,
        evicted: Some(0),
        target: ">= 100000 ops/s",
    });
    // 4. Fill to n objects.
    let now = node_stats(&mut admin, &admin_id).await?;
    let more = n.saturating_sub(now.objects);
    let started = Instant::now();
    let rest = fill_keys(sims, filled, more, b, args.value_size).await?;
    let rest_secs = started.elapsed().as_secs_f64();
    filled += more;
    fill.add(&rest);
    let after_fill = node_stats(&mut admin, &admin_id).await?;
    let rss_filled = pid.and_then(rss);
    rows.insert(
        0,
        PhaseRow {
            objects: n,
            phase: format!("fill (BatchPutStart + BatchPutEnd x{b})"),
            secs: half_secs + rest_secs,
            tally: fill,
            evicted: None,
            target: ">= 100000 ops/s",
        },
    );
    let reserved = (after_fill.used / after_fill.objects.max(1)).max(1);

    // 5. Eviction rounds.
    let mut rounds_us = Vec::new();
    let mut evicted_per_round = Vec::new();
    let mut plain_put_us = Vec::new();
    let mut crossing_put_us = Vec::new();
    let evictor_cpu_before =
        pid.and_then(|p| thread_cpu(p, crescent_store::master::EVICTOR_THREAD)).unwrap_or_default();
    for _ in 0..args.eviction_rounds {
        top_up(sims, args, &mut filled, reserved).await?;
        let sim = &mut sims[0];
        let mut found = false;
        for _ in 0..64 {
            let before = node_stats(&mut sim.rpc, &sim.id).await?;
            let key = format!("e/{}/{}", sim.index, sim.next);
            sim.next += 1;
            let t = Instant::now();
            let r = sim
                .rpc
                .put_start(PutStartRequest {
                    client_id: sim.id.clone(),
                    key: key.clone(),
                    size: args.value_size,
                    options: Some(PutOptions::default()),
                    checksum: Some(VALUE_CRC),
                })
                .await?
                .into_inner();
            let took = t.elapsed().as_micros() as u64;
            if !ok(&r.status) {
                bail!("PutStart {key}: {}", describe(&r.status));
            }
            let e = sim
                .rpc
                .put_end(KeyRequest { client_id: sim.id.clone(), key: key.clone(), ..Default::default() })
                .await?
                .into_inner();
            if !ok(&e.status) {
                bail!("PutEnd {key}: {}", describe(&e.status));
            }
            // The round runs in the master's evictor, after this put answered: watch the used
            // bytes drop (for a while), then until they stop dropping.
            let mut after = node_stats(&mut sim.rpc, &sim.id).await?;
            let wait_start = Instant::now();
            while after.used >= before.used && wait_start.elapsed() < Duration::from_millis(200) {
                tokio::time::sleep(Duration::from_millis(1)).await;
                after = node_stats(&mut sim.rpc, &sim.id).await?;
            }
            if after.used < before.used {
                // Until every drop was acknowledged and nothing changed for QUIET (on a loaded
                // machine the evictor's steps and the acks pause: a short pause is not the
                // round's end); the round ended at the last change.
                let (last, changed) = settled(&mut sim.rpc, &sim.id, reserved).await?;
                after = last;
                rounds_us.push(changed.duration_since(t).as_micros() as u64);
                crossing_put_us.push(took);
                evicted_per_round.push(before.objects + 1 - after.objects);
                found = true;
                break;
            }
            plain_put_us.push(took);
        }
        if !found {
            let now = node_stats(&mut sim.rpc, &sim.id).await?;
            bail!(
                "64 puts at the watermark and no eviction: is the master's high watermark {}? (now {} objects, \
                 {} of {} bytes used: {:.4} of capacity)",
                args.high_watermark,
                now.objects,
                now.used,
                now.capacity,
                now.used as f64 / now.capacity.max(1) as f64
            );
        }
    }

    let evictor_cpu = pid
        .and_then(|p| thread_cpu(p, crescent_store::master::EVICTOR_THREAD))
        .map(|t| t.saturating_sub(evictor_cpu_before));

    // 6, 7. The streams with eviction running: each starts one put below the watermark.
    for batch in [1, b] {
        top_up(sims, args, &mut filled, reserved).await?;
        let before = node_stats(&mut admin, &admin_id).await?;
        let spec = Stream { batch, value_size: args.value_size, removes: false, dur, put_budget: None, pace: None };
        let (t, secs) = stream(sims, filled, spec).await;
        let after = node_stats(&mut admin, &admin_id).await?;
        let evicted = (before.objects + t.puts).saturating_sub(t.removes).saturating_sub(after.objects);
        let phase = if batch == 1 {
            "mixed, 1 key per call, evicting".to_string()
        } else {
            format!("mixed, batched x{batch}, evicting")
        };
        rows.push(PhaseRow {
            objects: n,
            phase,
            secs,
            tally: t,
            evicted: Some(evicted),
            // The latency target is a single call's; a batch of 128 keys is 128 ops in one call.
            target: if batch == 1 { "p99 <= 5 ms" } else { ">= 100000 ops/s" },
        });
    }
    // 8. The single-key stream while evicting, in open loop at shares of the closed loop's rate.
    for &share in args.open_loop.iter() {
        top_up(sims, args, &mut filled, reserved).await?;
        let offered = closed_loop_rate * share;
        let before = node_stats(&mut admin, &admin_id).await?;
        let spec = open_loop_stream(args, sims.len(), offered, false, dur);
        let (t, secs) = stream(sims, filled, spec).await;
        let after = node_stats(&mut admin, &admin_id).await?;
        let evicted = (before.objects + t.puts).saturating_sub(t.removes).saturating_sub(after.objects);
        rows.push(PhaseRow {
            objects: n,
            phase: format!("{}, evicting", open_loop_phase(offered, share)),
            secs,
            tally: t,
            evicted: Some(evicted),
            target: "p99 <= 5 ms",
        });
    }
    let size = SizeRow {
        objects: n,
        rss_mounted,
        rss_filled,
        filled: after_fill.objects,
        rounds_us,
        evicted_per_round,
        plain_put_us,
        crossing_put_us,
        evictor_cpu,
    };
    Ok((rows, size))
}

#[cfg(test)]
mod tests {
    use super::stream::Pacer;
    use super::*;

    #[test]
    fn counts_take_decimal_suffixes() {
        assert_eq!(parse_count("100k"), Ok(100_000));
        assert_eq!(parse_count("1M"), Ok(1_000_000));
        assert_eq!(parse_count("10M"), Ok(10_000_000));
        assert_eq!(parse_count("2500"), Ok(2500));
        assert!(parse_count("0").is_err());
        assert!(parse_count("1.5M").is_err());
        assert!(parse_count("x").is_err());
    }

    /// The default leaves the master half the CPUs, and each simulated client's tasks run on
    /// its own lane's one thread (client i on lane i mod N).
    #[test]
    fn clients_are_dealt_to_their_lanes_and_each_lane_is_one_thread() {
        assert_eq!(client_threads_for(2), 1, "on two CPUs the master keeps one");
        assert_eq!(client_threads_for(1), 1);
        assert_eq!(client_threads_for(16), 8);
        let lanes = Lanes::start(2).expect("lanes");
        let thread_of = |client: usize| {
            let (tx, rx) = std::sync::mpsc::channel();
            lanes.of(client).spawn(async move {
                let _ = tx.send(std::thread::current().id());
            });
            rx.recv_timeout(Duration::from_secs(10)).expect("the lane runs its tasks")
        };
        let (a, b) = (thread_of(0), thread_of(1));
        assert_ne!(a, b, "two lanes, two threads");
        assert_eq!(thread_of(2), a, "client 2 shares client 0's lane");
        assert_eq!(thread_of(3), b);
        assert_eq!(thread_of(4), a);
    }

    /// `--open-loop ''` runs no open-loop phase, as its help says; shares outside (0, 1] are
    /// refused at parsing.
    #[test]
    fn open_loop_shares_parse_and_empty_means_none() {
        assert_eq!(parse_shares("0.5,0.75"), Ok(Shares(vec![0.5, 0.75])));
        assert_eq!(parse_shares(""), Ok(Shares(Vec::new())));
        for bad in ["0", "1.5", "x", "0.5,", "nan"] {
            assert!(parse_shares(bad).is_err(), "{bad:?}");
        }
    }

    /// The open loop charges a late call for its wait: a client whose previous call overran its
    /// pace counts the next call's latency from when it was due, not from when it was sent.
    #[tokio::test]
    async fn a_late_call_counts_from_when_it_was_due() {
        let pace = Duration::from_millis(20);
        let first_due = Instant::now() + pace;
        let mut pacer = Pacer { pace: Some(pace), due: first_due };
        // Ahead of the pace: it waits for the due time and counts from the send.
        let started = pacer.start().await;
        assert!(started >= first_due, "a call ahead of its pace is not sent early");
        // A call that takes five paces: the next one is late.
        std::thread::sleep(pace * 5);
        let before = Instant::now();
        let counted_from = pacer.start().await;
        assert_eq!(counted_from, first_due + pace, "a late call counts from when it was due");
        assert!(counted_from < before);
        // The closed loop counts from the send.
        let mut closed = Pacer::new(None);
        let before = Instant::now();
        assert!(closed.start().await >= before);
    }
}
