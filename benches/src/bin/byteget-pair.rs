//! A byte `get` (a new vector per call) beside `get_into` (registered memory, zero copy) of the
//! same value, call by call: each pair times one of each (in alternating order), so a load
//! that moves between rows moves both halves of a pair alike. Prints per size the median of
//! the per-pair ratios get / get_into (throughput; target >= 0.85, issue 28 §2), their range,
//! the medians of both calls, and the process's minor page faults per call of each, with the
//! load average at start and end.
//!
//! ```text
//! byteget-pair --master HOST:PORT --local-hostname ADDR [--sizes 1M,10M,25M] [--pairs 40]
//! ```
//! Run it on another host than the value's holder (benches/storebench.sh's two namespaces),
//! or its gets read its own memory.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Parser;
use crescent_benches::report;
use crescent_engine::parse_size;
use crescent_store::{pattern, ClientConfig, StoreApi, StoreClient};

#[derive(Parser)]
struct Cli {
    #[arg(long)]
    master: String,
    #[arg(long)]
    local_hostname: String,
    #[arg(long, value_delimiter = ',', value_parser = parse_size, default_value = "1M,10M,25M")]
    sizes: Vec<u64>,
    /// Pairs (one get, one get_into) per size.
    #[arg(long, default_value_t = 40)]
    pairs: usize,
}

/// This process's minor page faults so far (`/proc/self/stat`, field 10).
fn minor_faults() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The command name (field 2) may hold spaces; the fields after it are plain.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    rest.split_whitespace().nth(7).and_then(|f| f.parse().ok()).unwrap_or(0)
}

/// A byte get's share of `get_into`'s rate (issue 28 §2).
const TARGET: report::Target = report::Target::AtLeast(0.85);

fn main() -> Result<()> {
    let cli = Cli::parse();
    let load = report::Load::start();
    let max = *cli.sizes.iter().max().context("no sizes")?;
    let client = StoreClient::connect(ClientConfig {
        master_server_address: cli.master.clone(),
        local_hostname: Some(cli.local_hostname.clone()),
        // Smaller than any value: the puts land on the holder's host.
        global_segment_size: 64 << 10,
        local_buffer_size: (2 * max).max(64 << 20),
        ..ClientConfig::from_env()?
    })?;
    let mut buf = vec![0u8; max as usize];
    client.register_buffer(buf.as_mut_ptr() as u64, buf.len() as u64)?;
    println!("| value | pairs | get ms (p50) | get_into ms (p50) | faults per get | per get_into | get / get_into | range | target | met |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for &size in &cli.sizes {
        let key = format!("bgp/{size}");
        let mut value = vec![0u8; size as usize];
        pattern::fill(&mut value, size, 0);
        client.put(&key, &value)?;
        let (mut t_get, mut t_into, mut pairs) = (Vec::new(), Vec::new(), report::Pairs::default());
        let (mut f_get, mut f_into) = (0, 0);
        for i in 0..cli.pairs + 2 {
            let mut get = || -> Result<f64> {
                let f = minor_faults();
                let start = Instant::now();
                let got = client.get(&key)?;
                let t = start.elapsed().as_secs_f64();
                f_get += minor_faults() - f;
                if got.len() != size as usize || pattern::first_mismatch(&got, size, 0).is_some() {
                    bail!("get returned wrong bytes");
                }
                Ok(t)
            };
            let (a, b) = if i % 2 == 0 {
                let a = get()?;
                let f = minor_faults();
                let start = Instant::now();
                client.get_into(&key, buf.as_mut_ptr() as u64, size)?;
                let b = start.elapsed().as_secs_f64();
                f_into += minor_faults() - f;
                (a, b)
            } else {
                let f = minor_faults();
                let start = Instant::now();
                client.get_into(&key, buf.as_mut_ptr() as u64, size)?;
                let b = start.elapsed().as_secs_f64();
                f_into += minor_faults() - f;
                (get()?, b)
            };
            if i < 2 {
                (f_get, f_into) = (0, 0); // warm-up pairs
                continue;
            }
            t_get.push(a);
            t_into.push(b);
            pairs.push(1.0 / a, 1.0 / b); // rates: get / get_into = b / a
        }
        if pattern::first_mismatch(&buf[..size as usize], size, 0).is_some() {
            bail!("get_into returned wrong bytes");
        }
        let n = cli.pairs as f64;
        println!(
            "| {} | {} | {:.2} | {:.2} | {:.0} | {:.0} | {}",
            report::fmt_bytes(size),
            cli.pairs,
            1e3 * report::median(&t_get),
            1e3 * report::median(&t_into),
            f_get as f64 / n,
            f_into as f64 / n,
            pairs.summary().ratio_cells(TARGET),
        );
        // Best effort: a lease from the last gets may still hold it (the holder has room).
        let _ = client.remove(&key);
    }
    client.unregister_buffer(buf.as_mut_ptr() as u64)?;
    client.close()?;
    load.finish();
    Ok(())
}
