//! `storebench soak`: a mixed workload across several client processes for `--minutes`, while
//! faults come on a schedule, and an account of what survived.
//!
//! ```text
//! storebench soak [--minutes 3] [--holders 3] [--keys 128] [--rate 50] [--out target/soak]
//! ```
//!
//! Everything runs in a network namespace of its own (the command re-runs itself under
//! `ip netns exec`; root is needed): one etcd member, two `crescent-master`s with HA over it,
//! `--holders` worker processes that each contribute a segment and a disk tier on one small
//! tmpfs, and one more worker, the *victim*, that contributes no segment and is the one killed.
//! Each worker (`storebench soak-worker`, see [`worker`]) runs put / upsert / forced remove /
//! put_batch / get / get_into / get_batch / batch_get_into on its own keys and reads the others'.
//!
//! The run is cycles of five phases of `--phase-secs` each:
//!
//! | phase | fault |
//! |---|---|
//! | steady | none |
//! | client-kill | the victim is SIGKILLed, and started again 2 s later |
//! | master-failover | the leader master is SIGKILLed; the standby takes over; the killed one comes back as standby |
//! | link-blip | every TCP packet in the namespace but etcd's is dropped for 3.5 s (nftables) |
//! | disk-full | the tmpfs of the disk tier is filled; the victim is killed and started on the full disk; the filler is removed |
//!
//! At the end the workers stop, each first giving its keys in doubt (last call failed, or cut
//! by a kill) a known value with an upsert tried again while leases end; then this process
//! reads back every key: a key acknowledged present must read back whole with its last
//! generation, a key acknowledged removed must be absent (a key still in doubt is skipped and
//! counted). The killed victim holds no segment, so that no kill drops a replica by
//! design; the store is sized so that nothing is evicted, and the masters' eviction counters are
//! sampled to show it.
//!
//! It prints (and writes to `OUT/report.md`) calls, errors by code, p50/p99/max per phase, and
//! the verdict `lost 0 (limit 0), torn 0 (limit 0), RSS growth X % (limit 10 %); stale reads N
//! (no limit)`; the RSS of every process every `--sample-secs` goes to `OUT/rss.csv` and
//! `OUT/rss.svg`. It exits non-zero when a limit is broken. RSS growth is measured on the
//! processes that live through the run (the holders, etcd, this process): the mean of the
//! samples of the last cycle beside that of the cycle after the first.

pub mod tally;
pub mod worker;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use crescent_store::{ClientConfig, StoreApi, StoreClient, StoreError};

use crate::etcd_cluster::EtcdCluster;
use crate::failover::MasterProc;
use crate::report;
use tally::{Known, Sample, Tally};

#[derive(Parser, Clone)]
#[command(name = "storebench soak")]
pub struct SoakArgs {
    /// Length of the run (whole cycles of five phases; at least one).
    #[arg(long, default_value_t = 3.0)]
    minutes: f64,
    /// Length of each phase.
    #[arg(long, default_value_t = 12)]
    phase_secs: u64,
    /// Workers that contribute a segment (and are never killed).
    #[arg(long, default_value_t = 3)]
    holders: u64,
    /// Keys per worker.
    #[arg(long, default_value_t = 128)]
    keys: u64,
    /// Calls a second of each worker's workload thread (its cross reader adds half as many).
    #[arg(long, default_value_t = 50.0)]
    rate: f64,
    /// Segment of each holder.
    #[arg(long, default_value = "64M", value_parser = crescent_engine::parse_size)]
    segment: u64,
    /// Size of the tmpfs under the disk tiers (`mount -o size=`).
    #[arg(long, default_value = "96M")]
    disk: String,
    /// Seconds between RSS samples.
    #[arg(long, default_value_t = 5)]
    sample_secs: u64,
    /// RSS growth allowed, in percent.
    #[arg(long, default_value_t = 10.0)]
    rss_limit_pct: f64,
    /// Where the report, the RSS CSV and plot and the processes' logs go.
    #[arg(long, default_value = "target/soak")]
    out: PathBuf,
}

const NETNS_ENV: &str = "CRESCENT_SOAK_NETNS";
const PHASES: [&str; 5] = ["steady", "client-kill", "master-failover", "link-blip", "disk-full"];
const NFT_TABLE: &str = "crescent_soak";

pub fn main(args: impl Iterator<Item = String>) -> Result<()> {
    let args: Vec<String> = args.collect();
    let cli = SoakArgs::parse_from(&args);
    match std::env::var(NETNS_ENV) {
        Ok(_) => run(cli),
        Err(_) => in_own_netns(&args[1..]),
    }
}

fn cmd(program: &str, args: &[&str]) -> Result<()> {
    let out = Command::new(program).args(args).output().with_context(|| format!("running {program}"))?;
    if !out.status.success() {
        bail!("{program} {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// A network namespace of this run, deleted when dropped.
struct Netns(String);

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = cmd("ip", &["netns", "del", &self.0]);
    }
}

/// Makes a network namespace (loopback only) and runs this command again inside it.
fn in_own_netns(args: &[String]) -> Result<()> {
    if !rustix::process::geteuid().is_root() {
        bail!("the soak needs root: it makes a network namespace, drops packets with nftables and mounts a tmpfs");
    }
    let ns = Netns(format!("crsc-soak-{}", std::process::id()));
    cmd("ip", &["netns", "add", &ns.0])?;
    cmd("ip", &["-n", &ns.0, "link", "set", "lo", "up"])?;
    on_signals()?;
    let mut child = Command::new("ip")
        .args(["netns", "exec", &ns.0])
        .arg(std::env::current_exe()?)
        .arg("soak")
        .args(args)
        .env(NETNS_ENV, &ns.0)
        .spawn()
        .context("ip netns exec")?;
    // `ip netns exec` execs the command: the child is the run; a signal here is passed on.
    let mut forwarded = false;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if INTERRUPTED.load(Ordering::Relaxed) && !forwarded {
            let _ = cmd("kill", &["-TERM", &child.id().to_string()]);
            forwarded = true;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    drop(ns);
    if !status.success() {
        std::process::exit(status.code().unwrap_or(1));
    }
    Ok(())
}

/// A tmpfs mounted for the run, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(size: &str) -> Result<Tmpfs> {
        let dir = std::env::temp_dir().join(format!("crescent-soak-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        cmd("mount", &["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs", &dir.to_string_lossy()])?;
        Ok(Tmpfs(dir))
    }

    /// Writes the file `filler` until the file system refuses (ENOSPC); bytes written.
    fn fill(&self) -> Result<u64> {
        let mut f = std::fs::File::create(self.0.join("filler"))?;
        let chunk = vec![0x5au8; 64 << 10];
        let mut n = 0u64;
        loop {
            match f.write(&chunk) {
                Ok(0) => bail!("the filler wrote nothing"),
                Ok(k) => n += k as u64,
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => return Ok(n),
                Err(e) => return Err(e).context("filling the tmpfs"),
            }
        }
    }

    fn empty(&self) {
        let _ = std::fs::remove_file(self.0.join("filler"));
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = cmd("umount", &["-l", &self.0.to_string_lossy()]);
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// The processes whose RSS is sampled: name, pid, admin address (masters).
type Tracked = Arc<Mutex<Vec<(String, u32, Option<String>)>>>;

fn track(t: &Tracked, name: &str, pid: u32, admin: Option<String>) {
    t.lock().unwrap().push((name.to_string(), pid, admin));
}

fn untrack(t: &Tracked, pid: u32) {
    t.lock().unwrap().retain(|p| p.1 != pid);
}

fn log_file(out: &Path, name: &str) -> Result<std::fs::File> {
    Ok(std::fs::OpenOptions::new().create(true).append(true).open(out.join(format!("{name}.log")))?)
}

fn sibling(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let bin = exe.parent().context("the executable's directory")?.join(name);
    if !bin.exists() {
        bail!("{} not built (cargo build -p crescent-store)", bin.display());
    }
    Ok(bin)
}

fn spawn_master(etcd: &EtcdCluster, cluster: &str, slot: usize, s: &Setup) -> Result<MasterProc> {
    let mut child = Command::new(sibling("crescent-master")?)
        .args(["--rpc-address", "127.0.0.1:0", "--admin-address", "127.0.0.1:0"])
        .args(["--enable_ha", "--ha_backend_type=etcd"])
        .arg(format!("--etcd_endpoints={}", etcd.endpoints()))
        .arg(format!("--cluster_id={cluster}"))
        .stdout(Stdio::piped())
        .stderr(log_file(&s.out, &format!("master-{slot}"))?)
        .spawn()
        .context("starting crescent-master")?;
    let mut lines = BufReader::new(child.stdout.take().context("its stdout")?).lines();
    let (mut addr, mut admin) = (None, None);
    while addr.is_none() || admin.is_none() {
        match lines.next() {
            Some(Ok(l)) => {
                if let Some(a) = l.strip_prefix("master: ") {
                    addr = Some(a.trim().to_string());
                } else if let Some(a) = l.strip_prefix("admin: http://") {
                    admin = Some(a.trim().trim_end_matches("/metrics").to_string());
                }
            }
            _ => bail!("crescent-master exited before printing its addresses"),
        }
    }
    std::thread::spawn(move || lines.for_each(drop));
    track(&s.tracked, &format!("master-{slot}"), child.id(), admin);
    Ok(MasterProc { child, addr: addr.expect("read above") })
}

/// What every part of the run needs.
struct Setup {
    cli: SoakArgs,
    out: PathBuf,
    master_url: String,
    cluster: String,
    disk: PathBuf,
    tracked: Tracked,
    tally: Arc<Mutex<Tally>>,
    workers: u64,
}

/// A worker process, killed when dropped (its last lines counted).
struct WorkerProc {
    child: Child,
    stdin: Option<ChildStdin>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl WorkerProc {
    fn kill(self, s: &Setup) {
        untrack(&s.tracked, self.child.id());
    }

    /// Closes its stdin (it exits), waits up to `grace`, then kills it.
    fn finish(mut self, grace: Duration) {
        drop(self.stdin.take());
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline && matches!(self.child.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for WorkerProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

fn worker_name(s: &Setup, id: u64) -> String {
    if id < s.cli.holders {
        format!("holder-{id}")
    } else {
        "victim".into()
    }
}

/// Starts worker `id` (its `incarnation`-th start); waits until it is ready.
fn spawn_worker(s: &Setup, id: u64, incarnation: u32) -> Result<WorkerProc> {
    let segment = if id < s.cli.holders { s.cli.segment } else { 0 };
    let root = s.disk.join(format!("w{id}"));
    std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
    let mut child = Command::new(std::env::current_exe()?)
        .arg("soak-worker")
        .args(["--id", &id.to_string(), "--workers", &s.workers.to_string(), "--keys", &s.cli.keys.to_string()])
        .args(["--master", &s.master_url, "--cluster", &s.cluster, "--segment", &segment.to_string()])
        .args(["--rate", &s.cli.rate.to_string(), "--gen-base", &(incarnation << 24).to_string()])
        .arg("--storage-root")
        .arg(&root)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(log_file(&s.out, &worker_name(s, id))?)
        .spawn()
        .context("starting a soak worker")?;
    let stdin = child.stdin.take().context("its stdin")?;
    let mut lines = BufReader::new(child.stdout.take().context("its stdout")?).lines();
    let (tx, rx) = std::sync::mpsc::channel();
    let tally = s.tally.clone();
    let reader = std::thread::spawn(move || {
        let mut ready = Some(tx);
        for line in lines.by_ref().map_while(std::result::Result::ok) {
            if line.contains("\"ready\"") {
                if let Some(tx) = ready.take() {
                    let _ = tx.send(());
                }
                continue;
            }
            tally.lock().unwrap().line(id, &line);
        }
    });
    let w = WorkerProc { child, stdin: Some(stdin), reader: Some(reader) };
    match rx.recv_timeout(Duration::from_secs(120)) {
        Ok(()) => {
            track(&s.tracked, &worker_name(s, id), w.child.id(), None);
            Ok(w)
        }
        Err(_) => {
            drop(w);
            bail!("{} did not start; see its log", worker_name(s, id))
        }
    }
}

/// The master's `evictions_total` from its admin port (`None`: unreachable).
fn evictions(admin: &str) -> Option<u64> {
    use std::io::Read;
    let mut s = std::net::TcpStream::connect_timeout(&admin.parse().ok()?, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(s, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once(' '))
        .filter(|(name, _)| name.ends_with("evictions_total"))
        .filter_map(|(_, v)| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
        .max()
}

/// Samples every tracked process's RSS (and the masters' evictions) until `stop`.
fn sampler(
    s: Arc<Setup>,
    start: Instant,
    stop: Arc<AtomicBool>,
) -> Result<std::thread::JoinHandle<(Vec<Sample>, u64)>> {
    let mut csv = std::fs::File::create(s.out.join("rss.csv"))?;
    writeln!(csv, "t_s,process,pid,vm_rss_kib,rss_shmem_kib")?;
    Ok(std::thread::spawn(move || {
        let mut samples = Vec::new();
        let mut evicted: std::collections::HashMap<u32, u64> = Default::default();
        let mut next = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            let t = start.elapsed().as_secs_f64();
            let procs = s.tracked.lock().unwrap().clone();
            for (name, pid, admin) in procs {
                if let Some((rss, shmem)) = tally::rss_of(pid) {
                    let _ = writeln!(csv, "{t:.1},{name},{pid},{rss},{shmem}");
                    samples.push(Sample { t, name, pid, rss_kib: rss });
                }
                if let Some(n) = admin.as_deref().and_then(evictions) {
                    evicted.insert(pid, n);
                }
            }
            let _ = csv.flush();
            next += Duration::from_secs(s.cli.sample_secs.max(1));
            while Instant::now() < next && !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        (samples, evicted.values().sum())
    }))
}

/// The nftables script of a link blip: every TCP packet that arrives in the namespace is
/// dropped, but those to or from a port of `spare` (etcd's client ports).
///
/// The spared ports are accepted first and everything else dropped after. The obvious single
/// rule, `tcp dport != P tcp sport != P drop`, does not mean that: nft (1.0.6 here) merges the
/// two adjacent 16-bit comparisons into one 32-bit `!=` of both ports at once, so it drops
/// every packet whose ports are not *both* `P` — etcd's too. With that rule every blip cut the
/// leader master off etcd, and the leader rightly stepped down (issue 48).
pub fn blip_script(spare: &[u16]) -> String {
    let mut script = format!(
        "add table inet {NFT_TABLE}\n\
         add chain inet {NFT_TABLE} input {{ type filter hook input priority 0; policy accept; }}\n"
    );
    if !spare.is_empty() {
        let set: Vec<String> = spare.iter().map(u16::to_string).collect();
        let set = set.join(", ");
        script += &format!(
            "add rule inet {NFT_TABLE} input tcp dport {{ {set} }} accept\n\
             add rule inet {NFT_TABLE} input tcp sport {{ {set} }} accept\n"
        );
    }
    script + &format!("add rule inet {NFT_TABLE} input meta l4proto tcp drop\n")
}

/// Starts a link blip ([`blip_script`]) in the network namespace of the calling thread.
pub fn blip_start(spare: &[u16]) -> Result<()> {
    let mut child = Command::new("nft").args(["-f", "-"]).stdin(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    child.stdin.take().context("nft's stdin")?.write_all(blip_script(spare).as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!("nft: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// Ends the link blip of [`blip_start`].
pub fn blip_end() -> Result<()> {
    cmd("nft", &["delete", "table", "inet", NFT_TABLE])
}

/// Set by SIGINT / SIGTERM: the run ends early (every process it started is killed).
static INTERRUPTED: std::sync::LazyLock<Arc<AtomicBool>> = std::sync::LazyLock::new(Default::default);

/// Sleeps until `secs` after `t0`; `Err` once the run is interrupted.
fn at(t0: Instant, secs: f64) -> Result<()> {
    let end = t0 + Duration::from_secs_f64(secs);
    loop {
        if INTERRUPTED.load(Ordering::Relaxed) {
            bail!("interrupted");
        }
        match end.checked_duration_since(Instant::now()) {
            Some(d) => std::thread::sleep(d.min(Duration::from_millis(100))),
            None => return Ok(()),
        }
    }
}

/// Sets [`INTERRUPTED`] on SIGINT and SIGTERM.
fn on_signals() -> Result<()> {
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, INTERRUPTED.clone())?;
    }
    Ok(())
}

/// The faults done and what they took.
#[derive(Default)]
struct Faults {
    client_kills: u64,
    restarts_failed: u64,
    failovers: u64,
    failover_ms: Vec<f64>,
    blips: u64,
    disk_fills: u64,
    /// Notable events, with the time into the run.
    events: Vec<String>,
}

impl Faults {
    fn event(&mut self, start: Instant, what: String) {
        let line = format!("{:7.1} s  {what}", start.elapsed().as_secs_f64());
        println!("{line}");
        self.events.push(line);
    }
}

fn run(cli: SoakArgs) -> Result<()> {
    on_signals()?;
    let out = std::env::current_dir()?.join(&cli.out);
    std::fs::create_dir_all(&out)?;
    for old in std::fs::read_dir(&out)? {
        let p = old?.path();
        if p.extension().is_some_and(|e| e == "log") {
            let _ = std::fs::remove_file(p);
        }
    }
    let date = report::utc_now();
    let load = report::Load::start();
    let load_start = report::loadavg();
    let cycles = ((cli.minutes * 60.0) / (cli.phase_secs as f64 * PHASES.len() as f64)).round().max(1.0) as u64;
    let cycle_secs = cli.phase_secs as f64 * PHASES.len() as f64;

    let disk = Tmpfs::mount(&cli.disk)?;
    let mut etcd = EtcdCluster::start(1).map_err(|e| anyhow::anyhow!("etcd: {e}"))?;
    let cluster = format!("soak-{}", std::process::id());
    let s = Arc::new(Setup {
        out: out.clone(),
        master_url: etcd.url(),
        cluster: cluster.clone(),
        disk: disk.0.clone(),
        tracked: Arc::new(Mutex::new(Vec::new())),
        tally: Arc::new(Mutex::new(Tally::new(PHASES.iter().copied().chain(["settle (end)"]).collect()))),
        workers: cli.holders + 1,
        cli: cli.clone(),
    });
    track(&s.tracked, "soak", std::process::id(), None);
    for pid in etcd.pids() {
        track(&s.tracked, "etcd", pid, None);
    }
    let mut masters: Vec<Option<MasterProc>> =
        vec![Some(spawn_master(&etcd, &cluster, 0, &s)?), Some(spawn_master(&etcd, &cluster, 1, &s)?)];
    let probe = StoreClient::connect(ClientConfig {
        master_server_address: s.master_url.clone(),
        cluster_id: Some(cluster.clone()),
        local_hostname: Some("127.0.0.1".into()),
        global_segment_size: 0,
        local_buffer_size: 4 << 20,
        ping_interval: Duration::from_millis(200),
        ..ClientConfig::default()
    })
    .context("the soak's own client")?;

    println!(
        "soak: {cycles} cycle(s) of {} phases x {} s; {} holders + 1 victim, {} keys each, {} calls/s each (+{} cross reads/s); out {}",
        PHASES.len(),
        cli.phase_secs,
        cli.holders,
        cli.keys,
        cli.rate,
        cli.rate / 2.0,
        out.display()
    );
    let mut workers: Vec<Option<WorkerProc>> = Vec::new();
    // The holders touch their segments at start; starting them one after another keeps that
    // off the measured part.
    for id in 0..cli.holders {
        workers.push(Some(spawn_worker(&s, id, 0)?));
    }
    let victim = cli.holders;
    let mut incarnation = 0u32;
    workers.push(Some(spawn_worker(&s, victim, incarnation)?));

    let start = Instant::now();
    let stop_sampling = Arc::new(AtomicBool::new(false));
    let sampling = sampler(s.clone(), start, stop_sampling.clone())?;
    let mut faults = Faults::default();
    let restart_victim = |workers: &mut Vec<Option<WorkerProc>>, incarnation: &mut u32, faults: &mut Faults| {
        *incarnation += 1;
        let t = Instant::now();
        match spawn_worker(&s, victim, *incarnation) {
            Ok(w) => {
                workers[victim as usize] = Some(w);
                faults.event(start, format!("victim started again in {:.0} ms", t.elapsed().as_secs_f64() * 1e3));
            }
            Err(e) => {
                faults.restarts_failed += 1;
                faults.event(start, format!("victim failed to start: {e:#}"));
            }
        }
    };
    let kill_victim = |workers: &mut Vec<Option<WorkerProc>>, faults: &mut Faults| {
        if let Some(w) = workers[victim as usize].take() {
            w.kill(&s);
            faults.client_kills += 1;
            faults.event(start, "victim killed (SIGKILL)".into());
        }
    };

    for cycle in 0..cycles {
        for (p, phase) in PHASES.iter().enumerate() {
            let t0 = start + Duration::from_secs_f64(cycle_secs * cycle as f64 + (cli.phase_secs * p as u64) as f64);
            at(t0, 0.0)?;
            s.tally.lock().unwrap().phase = p;
            if workers[victim as usize].is_none() {
                restart_victim(&mut workers, &mut incarnation, &mut faults);
            }
            match *phase {
                "client-kill" => {
                    at(t0, 2.0)?;
                    kill_victim(&mut workers, &mut faults);
                    at(t0, 4.0)?;
                    restart_victim(&mut workers, &mut incarnation, &mut faults);
                }
                "master-failover" => {
                    at(t0, 2.0)?;
                    let leader = probe.master_address();
                    let Some(slot) = masters.iter().position(|m| m.as_ref().is_some_and(|m| m.addr == leader)) else {
                        faults.event(start, format!("the leader {leader} is none of the masters; no failover"));
                        continue;
                    };
                    let dead = masters[slot].take().expect("found above");
                    untrack(&s.tracked, dead.child.id());
                    drop(dead);
                    let t = Instant::now();
                    faults.failovers += 1;
                    // Until the soak's own client follows a new leader (and it answers).
                    while t.elapsed() < Duration::from_secs(30)
                        && (probe.master_address() == leader || probe.exists("soak-probe").is_err())
                    {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    let ms = t.elapsed().as_secs_f64() * 1e3;
                    faults.failover_ms.push(ms);
                    faults.event(
                        start,
                        format!("leader {leader} killed; {} answers after {ms:.0} ms", probe.master_address()),
                    );
                    at(t0, 5.0)?;
                    match spawn_master(&etcd, &cluster, slot, &s) {
                        Ok(m) => masters[slot] = Some(m),
                        Err(e) => faults.event(start, format!("master {slot} failed to start again: {e:#}")),
                    }
                }
                "link-blip" => {
                    at(t0, 2.0)?;
                    blip_start(&etcd.client_ports)?;
                    faults.blips += 1;
                    faults.event(start, "link down: TCP dropped for 3.5 s".into());
                    at(t0, 5.5)?;
                    blip_end()?;
                }
                "disk-full" => {
                    at(t0, 1.0)?;
                    let n = disk.fill()?;
                    faults.disk_fills += 1;
                    faults.event(start, format!("disk full: {} filled", report::fmt_bytes(n)));
                    at(t0, 4.0)?;
                    kill_victim(&mut workers, &mut faults);
                    restart_victim(&mut workers, &mut incarnation, &mut faults);
                    at(t0, 9.0)?;
                    disk.empty();
                    faults.event(start, "disk space back".into());
                }
                _ => {}
            }
        }
    }
    at(start, cycle_secs * cycles as f64)?;
    if workers[victim as usize].is_none() {
        restart_victim(&mut workers, &mut incarnation, &mut faults);
    }
    let run_secs = start.elapsed().as_secs_f64();

    // Stop the workload (each worker first gives its keys in doubt a value), then read every
    // key back.
    s.tally.lock().unwrap().phase = PHASES.len();
    for w in workers.iter_mut().flatten() {
        if let Some(stdin) = w.stdin.as_mut() {
            let _ = writeln!(stdin, "stop");
            let _ = stdin.flush();
        }
    }
    let live = workers.iter().flatten().count();
    let t = Instant::now();
    while s.tally.lock().unwrap().stopped.len() < live && t.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let model: Vec<(u64, Known)> = {
        let tally = s.tally.lock().unwrap();
        let mut m: Vec<(u64, Known)> = tally.model.iter().map(|(k, v)| (*k, *v)).collect();
        m.sort_unstable_by_key(|e| e.0);
        m
    };
    let check = verify(&probe, &model, cli.keys);
    for w in &check.details {
        faults.event(start, w.clone());
    }

    stop_sampling.store(true, Ordering::Relaxed);
    let (samples, evicted) = sampling.join().map_err(|_| anyhow::anyhow!("the sampler panicked"))?;
    for w in workers.into_iter().flatten() {
        w.finish(Duration::from_secs(10));
    }
    drop(probe);
    drop(masters);
    for i in 0..etcd.client_ports.len() {
        etcd.kill(i);
    }
    drop(disk);

    // The report.
    let tally = s.tally.lock().unwrap();
    let growth = tally::growth(&samples, cycle_secs.min(run_secs / 3.0), run_secs, cycle_secs.min(run_secs / 3.0));
    let worst = growth.iter().map(|g| g.pct).fold(f64::NEG_INFINITY, f64::max);
    let worst = if worst.is_finite() { worst } else { 0.0 };
    let torn = tally.torn + check.torn;
    let stale = tally.stale + check.resurrected;
    let mut r = String::new();
    use std::fmt::Write as _;
    let _ = writeln!(
        r,
        "storebench soak --minutes {} ({date}; {cycles} cycles of 5 phases x {} s; {} holders + 1 victim; {} keys each; {} calls/s + {} cross reads/s per worker)\n",
        cli.minutes,
        cli.phase_secs,
        cli.holders,
        cli.keys,
        cli.rate,
        cli.rate / 2.0
    );
    let l = |l: Option<[f64; 3]>| l.map_or("unknown".into(), |[a, b, c]| format!("{a:.2} {b:.2} {c:.2}"));
    let _ = writeln!(r, "load average (1, 5, 15 min) at start {}, at end {}\n", l(load_start), l(report::loadavg()));
    r.push_str(&tally.table());
    let fo = &faults.failover_ms;
    let fo_max = fo.iter().copied().fold(0.0, f64::max);
    let _ = writeln!(
        r,
        "\nfaults: {} client kills ({} restarts failed), {} master failovers (new leader answering after median {:.0} ms, max {fo_max:.0} ms), {} link blips of 3.5 s, {} disk fills",
        faults.client_kills,
        faults.restarts_failed,
        faults.failovers,
        report::median(fo),
        faults.blips,
        faults.disk_fills
    );
    let _ = writeln!(
        r,
        "read back at the end: {} keys acknowledged present, {} acknowledged removed, {} in doubt (last call failed or cut) and skipped; lost {}; reads during the run that missed a present key: {}; evictions seen by the masters: {evicted}",
        check.present, check.absent, check.doubt, check.lost, tally.missing
    );
    let _ = writeln!(
        r,
        "\n| process | pid | RSS after cycle 1 | RSS at end | peak | growth |\n|---|---:|---:|---:|---:|---:|"
    );
    for g in &growth {
        let _ = writeln!(
            r,
            "| {} | {} | {:.1} MiB | {:.1} MiB | {:.1} MiB | {:+.1} % |",
            g.name, g.pid, g.base_mib, g.end_mib, g.peak_mib, g.pct
        );
    }
    let pass_lost = check.lost == 0;
    let pass_torn = torn == 0;
    let pass_rss = worst <= cli.rss_limit_pct;
    let pass = pass_lost && pass_torn && pass_rss;
    // Stale reads (a read, or the read-back, that saw a value older than the last acknowledged
    // write or remove) are reported beside the limits, not one of them: see the soak's section
    // in docs/src/benchmarks.md.
    let verdict = format!(
        "lost {} (limit 0), torn {torn} (limit 0), RSS growth {worst:.1} % (limit {} %); stale reads {stale} (no limit): {}",
        check.lost,
        cli.rss_limit_pct,
        if pass { "pass" } else { "FAIL" }
    );
    let _ = writeln!(r, "\n{verdict}");
    let _ = writeln!(r, "\nevents:\n```\n{}\n```", faults.events.join("\n"));
    std::fs::write(out.join("report.md"), &r)?;
    std::fs::write(
        out.join("rss.svg"),
        tally::svg(&samples, &format!("RSS of every process, storebench soak --minutes {} ({date})", cli.minutes)),
    )?;
    println!("\n{r}");
    load.finish();
    if !pass {
        bail!("{verdict}");
    }
    Ok(())
}

/// What the final read-back found.
#[derive(Default)]
struct Check {
    present: u64,
    absent: u64,
    doubt: u64,
    lost: u64,
    torn: u64,
    resurrected: u64,
    /// The first few problems, one line each.
    details: Vec<String>,
}

/// Reads every key of the model back (a few tries for errors that are not "not found").
fn verify(c: &StoreClient, model: &[(u64, Known)], keys: u64) -> Check {
    let mut k = Check::default();
    let note = |k: &mut Check, what: String| {
        if k.details.len() < 20 {
            k.details.push(what);
        }
    };
    for &(gid, known) in model {
        let name = worker::key(gid, keys);
        let mut got = c.get(&name);
        for _ in 0..3 {
            match &got {
                Ok(_) | Err(StoreError::NotFound(_)) => break,
                Err(_) => {
                    std::thread::sleep(Duration::from_secs(1));
                    got = c.get(&name);
                }
            }
        }
        match known {
            Known::Doubt => k.doubt += 1,
            Known::Present(g) => {
                k.present += 1;
                match got {
                    Ok(v) => match worker::check(&v, gid) {
                        Ok(have) if have == g => {}
                        Ok(have) => {
                            k.lost += 1;
                            note(&mut k, format!("lost: {name} reads generation {have}, not the acknowledged {g}"));
                        }
                        Err(why) => {
                            k.lost += 1;
                            k.torn += 1;
                            note(&mut k, format!("lost: {name} reads torn: {why}"));
                        }
                    },
                    Err(e) => {
                        k.lost += 1;
                        note(&mut k, format!("lost: {name} (generation {g}): {e}"));
                    }
                }
            }
            Known::Absent => {
                k.absent += 1;
                if let Ok(v) = got {
                    k.resurrected += 1;
                    note(&mut k, format!("stale: {name} was removed but reads {:?}", worker::check(&v, gid)));
                }
            }
        }
    }
    k
}
