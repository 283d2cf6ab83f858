//! storebench: the store's benchmark, beside Redis measured in the same run.
//!
//! Run it through `benches/storebench.sh`, which makes two hosts (network namespaces), starts
//! the master, a holder client and redis-server on host A, and this binary on host B:
//!
//! ```text
//! storebench --master A:PORT --local-hostname B --redis A:PORT [--sizes 1M,10M,25M] [--batch 4]
//! ```
//! This process is client B; it contributes only a small segment, so the values it puts land
//! in the holder's memory on host A and every get crosses the link.
//!
//! `storebench query [--master HOST:PORT] [--keys 100000]` measures the master's query API for
//! schedulers instead: the rate of one `QueryKeys` call over 100k stored keys (beside
//! `BatchExists` of the same keys, in the same run) and the latency of single-key queries while
//! other clients put, beside the same queries on an idle master. Without `--master` it starts a
//! master in this process on loopback.
//! `storebench ssd [--dir DIR]` measures the disk tier instead (see `crescent_benches::ssd`).
//! `storebench failover [--kills 20]` measures HA failovers (see `crescent_benches::failover`).
//! `storebench soak [--minutes 3]` runs a mixed workload under scheduled faults and checks that
//! nothing acknowledged is lost, nothing read is torn, and no process grows (see
//! `crescent_benches::soak`).
//! Two more modes measure the client's local hot cache (`benches/hotcache.sh` runs them):
//! `storebench hot-cache --master A:PORT --local-hostname B` and `storebench replay ...`.
//! `storebench master [--objects 100k,1M] [--clients 64]` drives a spawned `crescent-master`
//! with simulated clients at scale (see `crescent_benches::masterbench`).
//! `storebench dummy [--sizes 64K,1M,4M] [--batch 16]` measures a dummy client's
//! `batch_get_into` beside its standalone client's own (see `crescent_benches::dummybench`).
//! `storebench checksums [--sizes 64K,1M,16M]` measures what end-to-end checksums cost a
//! get_into and a put_from (see `crescent_benches::checksumbench`).

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use crescent_benches::{checksumbench, dummybench, hotbench, masterbench, report};
use crescent_engine::parse_size;
use crescent_store::{pattern, ClientConfig, StoreApi, StoreClient};
use hdrhistogram::Histogram;
use redis::Commands;

#[derive(Parser)]
#[command(
    name = "storebench",
    about = "Crescent store benchmark beside Redis",
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
struct Cli {
    #[command(subcommand)]
    mode: Option<Mode>,
    #[arg(long)]
    master: Option<String>,
    #[arg(long)]
    local_hostname: Option<String>,
    /// redis-server address host:port.
    #[arg(long)]
    redis: Option<String>,
    #[arg(long, value_delimiter = ',', default_value = "1M,10M,25M", value_parser = parse_size)]
    sizes: Vec<u64>,
    /// Values per batch call.
    #[arg(long, default_value_t = 4)]
    batch: usize,
    /// Bytes moved per row (the operation count follows from it).
    #[arg(long, default_value = "512M", value_parser = parse_size)]
    bytes_per_row: u64,
    /// Keys for the metadata-rate row (0: no metadata row).
    #[arg(long, default_value_t = 100_000)]
    meta_keys: usize,
    /// Also write every row as one JSON object a line to this file (benches/storebench.sh
    /// reads them to pair the runs with iperf3).
    #[arg(long)]
    json: Option<std::path::PathBuf>,
    /// What the path carries in MiB/s (iperf3 on the same link, measured by storebench.sh); each
    /// row then shows the store's figure as a share of it. 0: not measured.
    #[arg(long, default_value_t = 0.0)]
    link_mib_s: f64,
}

#[derive(Subcommand)]
enum Mode {
    /// The query API for schedulers: batch query rate and single-key latency under puts.
    Query(QueryArgs),
    /// The local hot cache: rounds of get / batchGet over the same keys, with and without it.
    HotCache(hotbench::HotCacheArgs),
    /// The local hot cache under an inference-shaped request stream.
    Replay(hotbench::ReplayArgs),
    /// The master at scale: many simulated clients, 100k-10M objects, eviction running.
    Master(masterbench::MasterArgs),
    /// A dummy client's batch_get_into beside its standalone client's own, alternating pairs.
    Dummy(dummybench::DummyArgs),
    /// End-to-end checksums: get_into and put_from with verify_checksums on beside off.
    Checksums(checksumbench::ChecksumArgs),
}

#[derive(clap::Args)]
struct QueryArgs {
    /// Master address host:port; default: a master started in this process on loopback.
    #[arg(long)]
    master: Option<String>,
    /// Address this process' clients use; default 127.0.0.1.
    #[arg(long, default_value = "127.0.0.1")]
    local_hostname: String,
    /// Keys stored (and asked for in one batch query).
    #[arg(long, default_value_t = 100_000)]
    keys: usize,
    /// Of those, keys also published as near-engine VRAM copies by a second client.
    #[arg(long, default_value_t = 10_000)]
    published: usize,
    /// Client threads putting values during the single-key latency run.
    #[arg(long, default_value_t = 2)]
    writers: usize,
    /// Single-key queries per latency run.
    #[arg(long, default_value_t = 20_000)]
    single: usize,
    /// Size of the values the writers put.
    #[arg(long, default_value = "4K", value_parser = parse_size)]
    value_size: u64,
}

struct Row {
    ops: u64,
    bytes: u64,
    secs: f64,
    hist: Histogram<u64>,
}

impl Row {
    fn new() -> Self {
        Row { ops: 0, bytes: 0, secs: 0.0, hist: Histogram::new(3).expect("histogram") }
    }
    fn time<T>(&mut self, bytes: u64, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let t = Instant::now();
        let r = f()?;
        let e = t.elapsed();
        self.secs += e.as_secs_f64();
        self.ops += 1;
        self.bytes += bytes;
        self.hist.record(e.as_micros() as u64)?;
        Ok(r)
    }
    fn mib_s(&self) -> f64 {
        self.bytes as f64 / (1 << 20) as f64 / self.secs.max(1e-9)
    }
    fn p(&self, q: f64) -> String {
        report::fmt_us(self.hist.value_at_quantile(q))
    }
}

fn main() {
    crescent_store::init_tool_logging();
    if std::env::args().nth(1).as_deref() == Some("ssd") {
        if let Err(e) = crescent_benches::ssd::main(std::env::args().skip(1)) {
            eprintln!("storebench ssd: error: {e:#}");
            std::process::exit(1);
        }
        return;
    }
    for (mode, run) in [
        ("soak", crescent_benches::soak::main as fn(std::iter::Skip<std::env::Args>) -> anyhow::Result<()>),
        ("soak-worker", crescent_benches::soak::worker::main),
    ] {
        if std::env::args().nth(1).as_deref() == Some(mode) {
            if let Err(e) = run(std::env::args().skip(1)) {
                eprintln!("storebench {mode}: error: {e:#}");
                std::process::exit(1);
            }
            return;
        }
    }
    if std::env::args().nth(1).as_deref() == Some("failover") {
        if let Err(e) = crescent_benches::failover::main(std::env::args().skip(1)) {
            eprintln!("storebench failover: error: {e:#}");
            std::process::exit(1);
        }
        return;
    }
    let mut cli = Cli::parse();
    let result = match cli.mode.take() {
        Some(Mode::Query(args)) => query_bench(&args),
        Some(Mode::HotCache(a)) => hotbench::hot_cache(a),
        Some(Mode::Replay(a)) => hotbench::replay(a),
        Some(Mode::Master(a)) => masterbench::run(a),
        Some(Mode::Dummy(a)) => dummybench::run(a),
        Some(Mode::Checksums(a)) => checksumbench::run(a),
        None => run(cli),
    };
    if let Err(e) = result {
        eprintln!("storebench: error: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<()> {
    let (Some(master), Some(local_hostname), Some(redis_addr)) = (&cli.master, &cli.local_hostname, &cli.redis) else {
        bail!("--master, --local-hostname and --redis are needed (or use `storebench query`)");
    };
    let max = *cli.sizes.iter().max().context("no sizes")?;
    let client = StoreClient::connect(ClientConfig {
        master_server_address: master.clone(),
        local_hostname: Some(local_hostname.clone()),
        // Smaller than any value: with local_first placement, B's puts still land on host A.
        global_segment_size: 64 << 10,
        local_buffer_size: (max * cli.batch as u64 * 2).max(64 << 20),
        ..ClientConfig::from_env()?
    })?;
    let mut redis =
        redis::Client::open(format!("redis://{redis_addr}/"))?.get_connection().context("connecting to redis")?;
    let _: () = redis::cmd("FLUSHALL").query(&mut redis)?;

    // One registered buffer for the zero-copy calls: batch x max bytes, twice (source, destination).
    let mut buf = vec![0u8; (max as usize) * cli.batch * 2];
    client.register_buffer(buf.as_mut_ptr() as u64, buf.len() as u64)?;
    let half = max as usize * cli.batch;

    let link = cli.link_mib_s;
    if link > 0.0 {
        println!("link A->B (iperf3, best of 1/2 streams x 128K/1M writes): {link:.0} MiB/s\n");
    }
    println!(
        "| op | value | calls | store MiB/s | store p50 | store p99 | redis MiB/s | redis p50 | redis p99 | store / link | ratio |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let mut get_rows: Vec<(String, f64)> = Vec::new();
    let mut records = Vec::new();
    for &size in &cli.sizes {
        let n = (cli.bytes_per_row / size).clamp(4, 200);
        let value = {
            let mut v = vec![0u8; size as usize];
            pattern::fill(&mut v, size, 0);
            v
        };
        for i in 0..cli.batch {
            buf[i * size as usize..(i + 1) * size as usize].copy_from_slice(&value);
        }
        let label = report::fmt_bytes(size);
        let key = |op: &str, i: u64| format!("sb/{op}/{size}/{i}");
        // put / SET
        let (mut s, mut r) = (Row::new(), Row::new());
        for i in 0..n {
            s.time(size, || Ok(client.put(&key("p", i), &value)?))?;
            r.time(size, || Ok(redis.set::<_, _, ()>(key("p", i), value.as_slice())?))?;
        }
        print_row(&mut records, "put", size, n, &s, &r, link);
        // get / GET (bytes returned to the caller). Each side's value is checked and dropped
        // before the other side's call, as a user's loop drops what it has used: a value kept
        // alive across the other's call makes the allocator hand both back to the kernel (above
        // its trim threshold) and every next get starts on fresh pages (see benchmarks.md).
        let (mut s, mut r) = (Row::new(), Row::new());
        for i in 0..n {
            let got = s.time(size, || Ok(client.get(&key("p", i))?))?;
            if got.len() != value.len() || pattern::first_mismatch(&got, size, 0).is_some() {
                bail!("store get returned wrong bytes for {}", key("p", i));
            }
            drop(got);
            let got: Vec<u8> = r.time(size, || Ok(redis.get(key("p", i))?))?;
            if got != value {
                bail!("redis returned wrong bytes");
            }
            drop(got);
        }
        print_row(&mut records, "get", size, n, &s, &r, link);
        // zero-copy get_into registered memory / GET
        let (mut s, mut r) = (Row::new(), Row::new());
        for i in 0..n {
            let dst = buf[half..].as_mut_ptr() as u64;
            s.time(size, || Ok(client.get_into(&key("p", i), dst, size)?))?;
            let _: Vec<u8> = r.time(size, || Ok(redis.get(key("p", i))?))?;
        }
        if pattern::first_mismatch(&buf[half..half + size as usize], size, 0).is_some() {
            bail!("store get_into returned wrong bytes");
        }
        print_row(&mut records, "get_into (zero copy)", size, n, &s, &r, link);
        get_rows.push((label.clone(), r.mib_s()));
        // batches: batch_put_from / MSET, batch_get_into / MGET
        let b = cli.batch as u64;
        let calls = (n / b).max(2);
        let (mut s, mut r) = (Row::new(), Row::new());
        for c in 0..calls {
            let keys: Vec<String> = (0..b).map(|j| key("b", c * b + j)).collect();
            let addrs: Vec<u64> = (0..b).map(|j| buf.as_ptr() as u64 + j * size).collect();
            let sizes = vec![size; cli.batch];
            s.time(size * b, || {
                let res = client.batch_put_from(&keys, &addrs, &sizes)?;
                res.into_iter().collect::<Result<Vec<_>, _>>()?;
                Ok(())
            })?;
            let pairs: Vec<(String, &[u8])> = keys.iter().map(|k| (format!("r{k}"), value.as_slice())).collect();
            r.time(size * b, || Ok(redis.mset::<_, _, ()>(&pairs)?))?;
        }
        print_row(&mut records, &format!("batch_put x{b}"), size, calls, &s, &r, link);
        let (mut s, mut r) = (Row::new(), Row::new());
        for c in 0..calls {
            let keys: Vec<String> = (0..b).map(|j| key("b", c * b + j)).collect();
            let addrs: Vec<u64> = (0..b).map(|j| buf[half..].as_ptr() as u64 + j * size).collect();
            let sizes = vec![size; cli.batch];
            s.time(size * b, || {
                let res = client.batch_get_into(&keys, &addrs, &sizes)?;
                res.into_iter().collect::<Result<Vec<_>, _>>()?;
                Ok(())
            })?;
            let rkeys: Vec<String> = keys.iter().map(|k| format!("r{k}")).collect();
            let got: Vec<Vec<u8>> = r.time(size * b, || Ok(redis.mget(&rkeys)?))?;
            if got.len() != cli.batch {
                bail!("redis MGET returned {} values", got.len());
            }
        }
        print_row(&mut records, &format!("batch_get x{b}"), size, calls, &s, &r, link);
        // Clean up so that the next size has room (the reads above hold leases: force).
        for i in 0..n {
            client.remove_with(&key("p", i), true)?;
        }
        for i in 0..calls * b {
            client.remove_with(&key("b", i), true)?;
        }
        let _: () = redis::cmd("FLUSHALL").query(&mut redis)?;
    }
    if link > 0.0 {
        // The target (get >= 3x redis) set beside what the path can carry at all.
        println!();
        for (label, redis) in &get_rows {
            println!(
                "{label}: 3x redis's GET would be {:.0} MiB/s, {:.0} % of what iperf3 moves over this link",
                3.0 * redis,
                300.0 * redis / link
            );
        }
        println!();
    }
    client.unregister_buffer(buf.as_mut_ptr() as u64)?;
    if let Some(path) = &cli.json {
        let lines: String = records.iter().map(|r| format!("{r}\n")).collect();
        std::fs::write(path, lines).with_context(|| format!("writing {}", path.display()))?;
    }
    if cli.meta_keys > 0 {
        metadata_rate(&client, cli.meta_keys)?;
    }
    client.close()?;
    Ok(())
}

fn print_row(records: &mut Vec<serde_json::Value>, op: &str, size: u64, calls: u64, s: &Row, r: &Row, link: f64) {
    let value = report::fmt_bytes(size);
    records.push(serde_json::json!({
        "op": op, "value": value, "value_bytes": size, "calls": calls,
        "store_mib_s": s.mib_s(), "redis_mib_s": r.mib_s(),
        "store_p50_us": s.hist.value_at_quantile(0.5), "store_p99_us": s.hist.value_at_quantile(0.99),
        "redis_p50_us": r.hist.value_at_quantile(0.5), "redis_p99_us": r.hist.value_at_quantile(0.99),
    }));
    let of_link = if link > 0.0 { format!("{:.0} %", 100.0 * s.mib_s() / link) } else { "-".into() };
    println!(
        "| {op} | {value} | {calls} | {:.0} | {} | {} | {:.0} | {} | {} | {of_link} | {:.1}x vs redis |",
        s.mib_s(),
        s.p(0.5),
        s.p(0.99),
        r.mib_s(),
        r.p(0.5),
        r.p(0.99),
        s.mib_s() / r.mib_s().max(1e-9)
    );
}

/// The master's metadata rate: batch exists over `n` stored keys in one call.
fn metadata_rate(client: &StoreClient, n: usize) -> Result<()> {
    let mut one = vec![7u8; 1000];
    client.register_buffer(one.as_mut_ptr() as u64, one.len() as u64)?;
    let keys: Vec<String> = (0..n).map(|i| format!("meta/{i:08}")).collect();
    let started = Instant::now();
    for chunk in keys.chunks(1000) {
        let addrs: Vec<u64> = (0..chunk.len()).map(|i| one.as_ptr() as u64 + i as u64).collect();
        let sizes = vec![1u64; chunk.len()];
        for r in client.batch_put_from(chunk, &addrs, &sizes)? {
            r?;
        }
    }
    let put_secs = started.elapsed().as_secs_f64();
    let mut best = Duration::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        let exists = client.batch_exists(&keys)?;
        best = best.min(t.elapsed());
        if exists.iter().filter(|e| **e).count() != n {
            bail!("batch exists missed stored keys");
        }
    }
    println!();
    println!(
        "metadata: batch_exists of {n} keys in one call: {:.0} keys/s ({:.1} ms, best of 3; target >= 100000 keys/s); setup put {n} 1-byte keys in {:.1} s",
        n as f64 / best.as_secs_f64(),
        best.as_secs_f64() * 1e3,
        put_secs
    );
    // What every single get pays before its transfer: one master round trip.
    let mut rtt = Row::new();
    for key in keys.iter().take(2000) {
        rtt.time(0, || Ok(client.exists(key)?))?;
    }
    println!("master round trip (single exists, 2000 calls): p50 {} p99 {}", rtt.p(0.5), rtt.p(0.99));
    client.remove_by_regex("^meta/")?;
    client.unregister_buffer(one.as_mut_ptr() as u64)?;
    Ok(())
}

/// `storebench query`: the master's query API as a scheduler uses it.
fn query_bench(args: &QueryArgs) -> Result<()> {
    use crescent_store::master::server;
    use crescent_store::proto::Tier;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;

    let _local_master;
    let master = match &args.master {
        Some(m) => m.clone(),
        None => {
            let h = server::start(crescent_store::MasterConfig {
                rpc_address: "127.0.0.1:0".into(),
                admin_address: String::new(),
                ..Default::default()
            })?;
            let addr = h.client_address();
            _local_master = h;
            addr
        }
    };
    let connect = |segment: u64| {
        StoreClient::connect(ClientConfig {
            master_server_address: master.clone(),
            local_hostname: Some(args.local_hostname.clone()),
            global_segment_size: segment,
            local_buffer_size: 8 << 20,
            ..ClientConfig::from_env()?
        })
    };
    let n = args.keys;
    // 64-byte values take one 256-byte block each.
    let loader = connect(((n as u64 * 256) * 2).max(64 << 20))?;
    let engine = connect(16 << 20)?;
    let value = [5u8; 64];
    loader.register_buffer(value.as_ptr() as u64, value.len() as u64)?;
    let keys: Vec<String> = (0..n).map(|i| format!("qb/{i:08}")).collect();
    let t = Instant::now();
    for chunk in keys.chunks(1000) {
        let addrs = vec![value.as_ptr() as u64; chunk.len()];
        for r in loader.batch_put_from(chunk, &addrs, &vec![64; chunk.len()])? {
            r?;
        }
    }
    let published: Vec<(String, u64)> = keys.iter().take(args.published).map(|k| (k.clone(), 64)).collect();
    for chunk in published.chunks(10_000) {
        engine.sched().publish(chunk, Tier::Vram, Duration::from_secs(600))?;
    }
    println!(
        "{}, storebench query: master {}; {n} keys stored (64 B each) in {:.1} s, {} of them also published in VRAM",
        report_date(),
        args.master.as_deref().unwrap_or("in this process (loopback)"),
        t.elapsed().as_secs_f64(),
        published.len()
    );

    // Batch rate: one QueryKeys call over every key, beside BatchExists of the same keys.
    let mut query_times = Vec::new();
    let mut exists_times = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let r = loader.sched().query_keys(&keys)?;
        query_times.push(t.elapsed());
        let found = r.items.iter().filter(|i| i.exists).count();
        let with_vram = r.items.iter().filter(|i| i.locations.iter().any(|l| l.published)).count();
        if found != n || with_vram != published.len() {
            bail!("QueryKeys found {found} keys and {with_vram} published (stored {n}, published {})", published.len());
        }
        let t = Instant::now();
        let e = loader.batch_exists(&keys)?;
        exists_times.push(t.elapsed());
        if e.iter().filter(|x| **x).count() != n {
            bail!("BatchExists missed stored keys");
        }
    }
    query_times.sort();
    exists_times.sort();
    let (q, e) = (query_times[2], exists_times[2]);
    println!();
    println!("| call | keys per call | median time | rate |");
    println!("|---|---|---|---|");
    println!(
        "| QueryKeys (exists, nodes, tiers, sizes) | {n} | {:.1} ms | {:.0} keys/s (target >= 100000 keys/s) |",
        q.as_secs_f64() * 1e3,
        n as f64 / q.as_secs_f64()
    );
    println!(
        "| BatchExists (exists only), same run | {n} | {:.1} ms | {:.0} keys/s |",
        e.as_secs_f64() * 1e3,
        n as f64 / e.as_secs_f64()
    );

    // Single-key latency: idle master, then with writers putting.
    let single = |label: &str, puts: Option<&AtomicU64>| -> Result<()> {
        let mut hist = Histogram::<u64>::new(3)?;
        let before = puts.map(|p| p.load(Ordering::Relaxed));
        let started = Instant::now();
        for i in 0..args.single {
            let key = keys[(i * 7919) % n].clone();
            let t = Instant::now();
            let r = loader.sched().query_keys(std::slice::from_ref(&key))?;
            hist.record(t.elapsed().as_micros() as u64)?;
            if !r.items[0].exists {
                bail!("{key} not found");
            }
        }
        let secs = started.elapsed().as_secs_f64();
        let put_rate = match (puts, before) {
            (Some(p), Some(b)) => format!("{:.0} puts/s", (p.load(Ordering::Relaxed) - b) as f64 / secs),
            _ => "none".to_string(),
        };
        println!(
            "| {label} | {} | {} | {} | {} | {} |",
            args.single,
            report::fmt_us(hist.value_at_quantile(0.5)),
            report::fmt_us(hist.value_at_quantile(0.99)),
            report::fmt_us(hist.value_at_quantile(0.999)),
            put_rate
        );
        Ok(())
    };
    println!();
    println!("| single-key QueryKeys | queries | p50 | p99 | p99.9 | concurrent puts |");
    println!("|---|---|---|---|---|---|");
    single("idle master", None)?;
    let stop = Arc::new(AtomicBool::new(false));
    let puts = Arc::new(AtomicU64::new(0));
    let mut writers = Vec::new();
    for w in 0..args.writers {
        let c = connect(64 << 20)?;
        let (stop, puts) = (stop.clone(), puts.clone());
        let value = vec![w as u8; args.value_size as usize];
        writers.push(std::thread::spawn(move || -> Result<()> {
            let mut i = 0u64;
            // A rolling window of 1000 live values per writer: puts plus removals, no eviction.
            while !stop.load(Ordering::Relaxed) {
                c.put(&format!("qw/{w}/{i}"), &value)?;
                puts.fetch_add(1, Ordering::Relaxed);
                if i >= 1000 {
                    c.remove(&format!("qw/{w}/{}", i - 1000))?;
                }
                i += 1;
            }
            c.close()?;
            Ok(())
        }));
    }
    // Let the writers get going first.
    std::thread::sleep(Duration::from_secs(1));
    let result = single(
        &format!("{} writer(s) putting {} values", args.writers, report::fmt_bytes(args.value_size)),
        Some(&puts),
    );
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.join().map_err(|_| anyhow::anyhow!("a writer panicked"))??;
    }
    result?;
    loader.remove_by_regex("^qb/")?;
    loader.unregister_buffer(value.as_ptr() as u64)?;
    engine.sched().retract_all()?;
    Ok(())
}

fn report_date() -> String {
    std::process::Command::new("date")
        .args(["-u", "+%F"])
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}
