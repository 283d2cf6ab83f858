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
//! Two more modes measure the client's local hot cache (`benches/hotcache.sh` runs them):
//! `storebench hot-cache --master A:PORT --local-hostname B` and `storebench replay ...`.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use crescent_benches::{hotbench, report};
use crescent_engine::parse_size;
use crescent_store::{pattern, ClientConfig, StoreClient};
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
    #[arg(long, required = true)]
    master: Option<String>,
    #[arg(long, required = true)]
    local_hostname: Option<String>,
    /// redis-server address host:port.
    #[arg(long, required = true)]
    redis: Option<String>,
    #[arg(long, value_delimiter = ',', default_value = "1M,10M,25M", value_parser = parse_size)]
    sizes: Vec<u64>,
    /// Values per batch call.
    #[arg(long, default_value_t = 4)]
    batch: usize,
    /// Bytes moved per row (the operation count follows from it).
    #[arg(long, default_value = "512M", value_parser = parse_size)]
    bytes_per_row: u64,
    /// Keys for the metadata-rate row.
    #[arg(long, default_value_t = 100_000)]
    meta_keys: usize,
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

#[derive(Subcommand)]
enum Mode {
    /// The local hot cache: rounds of get / batchGet over the same keys, with and without it.
    HotCache(hotbench::HotCacheArgs),
    /// The local hot cache under an inference-shaped request stream.
    Replay(hotbench::ReplayArgs),
}

fn main() {
    crescent_store::init_logging();
    let cli = Cli::parse();
    let result = match cli.mode {
        Some(Mode::HotCache(a)) => hotbench::hot_cache(a),
        Some(Mode::Replay(a)) => hotbench::replay(a),
        None => run(cli),
    };
    if let Err(e) = result {
        eprintln!("storebench: error: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<()> {
    let max = *cli.sizes.iter().max().context("no sizes")?;
    let (master, local_hostname, redis) = (
        cli.master.clone().context("--master")?,
        cli.local_hostname.clone().context("--local-hostname")?,
        cli.redis.clone().context("--redis")?,
    );
    let client = StoreClient::connect(ClientConfig {
        master_server_address: master,
        local_hostname: Some(local_hostname),
        global_segment_size: 1 << 20,
        local_buffer_size: (max * cli.batch as u64 * 2).max(64 << 20),
        ..ClientConfig::from_env()?
    })?;
    let mut redis =
        redis::Client::open(format!("redis://{redis}/"))?.get_connection().context("connecting to redis")?;
    let _: () = redis::cmd("FLUSHALL").query(&mut redis)?;

    // One registered buffer for the zero-copy calls: batch x max bytes, twice (source, destination).
    let mut buf = vec![0u8; (max as usize) * cli.batch * 2];
    client.register_buffer(buf.as_mut_ptr() as u64, buf.len() as u64)?;
    let half = max as usize * cli.batch;

    println!(
        "| op | value | calls | store MiB/s | store p50 | store p99 | redis MiB/s | redis p50 | redis p99 | ratio |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
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
        print_row("put", &label, n, &s, &r);
        // get / GET (bytes returned to the caller)
        let (mut s, mut r) = (Row::new(), Row::new());
        for i in 0..n {
            let got = s.time(size, || Ok(client.get(&key("p", i))?))?;
            if got.len() != value.len() || pattern::first_mismatch(&got, size, 0).is_some() {
                bail!("store get returned wrong bytes for {}", key("p", i));
            }
            let got: Vec<u8> = r.time(size, || Ok(redis.get(key("p", i))?))?;
            if got != value {
                bail!("redis returned wrong bytes");
            }
        }
        print_row("get", &label, n, &s, &r);
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
        print_row("get_into (zero copy)", &label, n, &s, &r);
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
        print_row(&format!("batch_put x{b}"), &label, calls, &s, &r);
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
        print_row(&format!("batch_get x{b}"), &label, calls, &s, &r);
        // Clean up so that the next size has room (the reads above hold leases: force).
        for i in 0..n {
            client.remove_with(&key("p", i), true)?;
        }
        for i in 0..calls * b {
            client.remove_with(&key("b", i), true)?;
        }
        let _: () = redis::cmd("FLUSHALL").query(&mut redis)?;
    }
    client.unregister_buffer(buf.as_mut_ptr() as u64)?;
    metadata_rate(&client, cli.meta_keys)?;
    client.close()?;
    Ok(())
}

fn print_row(op: &str, value: &str, calls: u64, s: &Row, r: &Row) {
    println!(
        "| {op} | {value} | {calls} | {:.0} | {} | {} | {:.0} | {} | {} | {:.1}x vs redis |",
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
    client.remove_by_regex("^meta/")?;
    client.unregister_buffer(one.as_mut_ptr() as u64)?;
    Ok(())
}
