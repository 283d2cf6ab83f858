//! `storebench failover`: masters with HA on a three-member etcd (all on loopback), clients
//! putting and getting under load, and the leader SIGKILLed again and again.
//!
//! ```text
//! storebench failover [--kills 20] [--ping-ms 200] [--steady-secs 3]
//! ```
//!
//! Per kill, the failover time is from the kill (the process reaped) to the first put that the
//! next leader acknowledges (one probe put, which the client library retries across the
//! change); the killed master is started again as a standby afterwards. At the end every put
//! the load threads had acknowledged is read back: keys lost (goal 0). Then the steady-state
//! put+get rate with HA on (the elected leader) and off (a plain master), alternating, in the
//! same run (goal: HA on / off ≥ 0.9).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use crescent_store::{pattern, ClientConfig, StoreApi, StoreClient};
use hdrhistogram::Histogram;

use crate::etcd_cluster::EtcdCluster;

#[derive(Parser)]
#[command(name = "storebench failover")]
struct Cli {
    /// Leader kills.
    #[arg(long, default_value_t = 20)]
    kills: usize,
    /// The clients' ping interval (how soon they notice a dead leader).
    #[arg(long, default_value_t = 200)]
    ping_ms: u64,
    /// Length of each steady-state measurement.
    #[arg(long, default_value_t = 3)]
    steady_secs: u64,
    /// Value size of the load.
    #[arg(long, default_value_t = 4096)]
    value: usize,
}

const CLUSTER: &str = "storebench-failover";

/// A `crescent-master` process, killed when dropped (the soak starts its masters as this too).
pub(crate) struct MasterProc {
    pub(crate) child: Child,
    /// Its gRPC address.
    pub(crate) addr: String,
}

impl Drop for MasterProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn master_binary() -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let bin = exe.parent().context("the executable's directory")?.join("crescent-master");
    if !bin.exists() {
        bail!("{} not built (cargo build --release -p crescent-store)", bin.display());
    }
    Ok(bin)
}

fn spawn_master(extra: &[&str]) -> Result<MasterProc> {
    let mut child = Command::new(master_binary()?)
        .args(["--rpc-address", "127.0.0.1:0", "--admin-address", ""])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting crescent-master")?;
    let out = child.stdout.take().context("its stdout")?;
    let mut lines = BufReader::new(out).lines();
    let addr = loop {
        match lines.next() {
            Some(Ok(l)) => {
                if let Some(a) = l.strip_prefix("master: ") {
                    break a.trim().to_string();
                }
            }
            _ => bail!("crescent-master exited before printing its address"),
        }
    };
    // Keep reading (and dropping) its output so that it never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    Ok(MasterProc { child, addr })
}

fn ha_master(etcd: &EtcdCluster) -> Result<MasterProc> {
    let eps = format!("--etcd_endpoints={}", etcd.endpoints());
    let cluster = format!("--cluster_id={CLUSTER}");
    spawn_master(&["--enable_ha", "--ha_backend_type=etcd", &eps, &cluster])
}

fn client(master: &str, ping: Duration) -> Result<Arc<StoreClient>> {
    Ok(StoreClient::connect(ClientConfig {
        master_server_address: master.to_string(),
        cluster_id: Some(CLUSTER.into()),
        local_hostname: Some("127.0.0.1".into()),
        global_segment_size: 256 << 20,
        local_buffer_size: 16 << 20,
        ping_interval: ping,
        ..ClientConfig::default()
    })?)
}

fn value(len: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; len];
    pattern::fill(&mut v, seed, 0);
    v
}

/// Load threads putting fresh keys and getting acknowledged ones; counts operations.
struct Load {
    stop: Arc<AtomicBool>,
    ops: Arc<AtomicU64>,
    acked: Arc<Mutex<Vec<u64>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    fn start(clients: &[Arc<StoreClient>], len: usize, prefix: &str, next: &Arc<AtomicU64>) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let ops = Arc::new(AtomicU64::new(0));
        let acked = Arc::new(Mutex::new(Vec::new()));
        let threads = clients
            .iter()
            .map(|c| {
                let (c, stop, ops, acked, next) = (c.clone(), stop.clone(), ops.clone(), acked.clone(), next.clone());
                let prefix = prefix.to_string();
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let n = next.fetch_add(1, Ordering::Relaxed);
                        if c.put(&format!("{prefix}{n}"), &value(len, n)).is_ok() {
                            acked.lock().unwrap().push(n);
                            ops.fetch_add(1, Ordering::Relaxed);
                            if c.get(&format!("{prefix}{n}")).is_ok() {
                                ops.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                })
            })
            .collect();
        Load { stop, ops, acked, threads }
    }

    fn stop(self) -> Vec<u64> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            let _ = t.join();
        }
        std::mem::take(&mut *self.acked.lock().unwrap())
    }
}

/// Operations per second of a load over `secs`.
fn steady_rate(clients: &[Arc<StoreClient>], len: usize, secs: u64, tag: &str, next: &Arc<AtomicU64>) -> f64 {
    let load = Load::start(clients, len, tag, next);
    std::thread::sleep(Duration::from_millis(300)); // warm up
    let (o0, t0) = (load.ops.load(Ordering::Relaxed), Instant::now());
    std::thread::sleep(Duration::from_secs(secs));
    let rate = (load.ops.load(Ordering::Relaxed) - o0) as f64 / t0.elapsed().as_secs_f64();
    let keys = load.stop();
    for c in clients {
        let _ = c.remove_all();
    }
    drop(keys);
    rate
}

pub fn main(args: impl Iterator<Item = String>) -> Result<()> {
    let cli = Cli::parse_from(args);
    let ping = Duration::from_millis(cli.ping_ms);
    let etcd = EtcdCluster::start(3).map_err(|e| anyhow::anyhow!("etcd: {e}"))?;
    let mut masters: Vec<MasterProc> = (0..3).map(|_| ha_master(&etcd)).collect::<Result<_>>()?;
    let clients: Vec<Arc<StoreClient>> = (0..2).map(|_| client(&etcd.url(), ping)).collect::<Result<_>>()?;
    let next = Arc::new(AtomicU64::new(0));
    let load = Load::start(&clients, cli.value, "load-", &next);
    std::thread::sleep(Duration::from_secs(1));
    let mut hist = Histogram::<u64>::new(3)?;
    for kill in 0..cli.kills {
        let leader = clients[0].master_address();
        let i = masters.iter().position(|m| m.addr == leader).context("the leader is one of ours")?;
        let mut dead = masters.remove(i);
        let t0 = Instant::now();
        dead.child.kill()?;
        dead.child.wait()?;
        let probe = format!("probe-{kill}");
        clients[0].put(&probe, &value(cli.value, u64::MAX - kill as u64)).context("the probe put")?;
        let took = t0.elapsed();
        hist.record(took.as_micros() as u64)?;
        println!(
            "kill {kill:2}: leader {leader} killed; {} serves after {:.0} ms",
            clients[0].master_address(),
            took.as_secs_f64() * 1e3
        );
        drop(dead);
        masters.push(ha_master(&etcd)?);
        std::thread::sleep(Duration::from_millis(500));
    }
    let acked = load.stop();
    let mut lost = 0;
    for n in &acked {
        match clients[1].get(&format!("load-{n}")) {
            Ok(v) if v == value(cli.value, *n) => {}
            _ => lost += 1,
        }
    }
    let ms = |q: f64| hist.value_at_quantile(q) as f64 / 1e3;
    println!(
        "failover time over {} leader kills: p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms (ping every {} ms, lease 2 s)",
        cli.kills,
        ms(0.5),
        ms(0.99),
        hist.max() as f64 / 1e3,
        cli.ping_ms
    );
    println!("keys lost: {lost} of {} acknowledged", acked.len());
    for c in &clients {
        let _ = c.remove_all();
    }
    // Steady state, alternating: the HA leader, then a plain master, three times each.
    let plain = spawn_master(&[])?;
    let plain_clients: Vec<Arc<StoreClient>> = (0..2).map(|_| client(&plain.addr, ping)).collect::<Result<_>>()?;
    let (mut on, mut off) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        on.push(steady_rate(&clients, cli.value, cli.steady_secs, "on-", &next));
        off.push(steady_rate(&plain_clients, cli.value, cli.steady_secs, "off-", &next));
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (on, off) = (median(&mut on), median(&mut off));
    println!(
        "steady state (2 clients, {} B values, put+get ops/s, median of 3 alternating runs): HA on {on:.0}, HA off {off:.0}, ratio {:.2}",
        cli.value,
        on / off
    );
    drop(plain_clients);
    drop(clients);
    drop(masters);
    Ok(())
}
