//! store-batch-get: `batch_get_into` of values another client holds, in a loop, from Rust.
//!
//! The reference for the Python binding's benchmark (`benches/ffi-batch-get.py`), which runs
//! this binary and the same loop through `crescent.MooncakeDistributedStore` in one run:
//!
//! ```text
//! store-batch-get --master 127.0.0.1:PORT --prefix bench/ --count 16 --size 10M --batch 4 --rounds 50 --seed 7
//!                 [--pieces 8]
//! ```
//! The keys are `<prefix>0` .. `<prefix><count-1>`, filled with `crescent_store::pattern`
//! (`--seed`); the first round is checked byte by byte and not timed. Prints one JSON line.
//! With `--pieces N` (N > 1) each value goes into N buffers, as a KV cache's layers hold one
//! block each (`batch_get_into_sg`, what Python's `batch_get_into_multi_buffers` runs): the
//! destination is N layers of `batch` pieces, piece `l` of value `j` at layer `l`, slot `j`.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Parser;
use crescent_engine::parse_size;
use crescent_store::client::Piece;
use crescent_store::{pattern, ClientConfig, StoreApi, StoreClient};

#[derive(Parser)]
#[command(name = "store-batch-get", about = "batch_get_into of existing values in a loop (Rust reference)")]
struct Cli {
    #[arg(long)]
    master: String,
    #[arg(long, default_value = "127.0.0.1")]
    local_hostname: String,
    #[arg(long)]
    prefix: String,
    #[arg(long)]
    count: usize,
    #[arg(long, value_parser = parse_size)]
    size: u64,
    #[arg(long, default_value_t = 4)]
    batch: usize,
    /// Timed batches (after one checked, untimed batch).
    #[arg(long, default_value_t = 50)]
    rounds: usize,
    #[arg(long)]
    seed: u64,
    /// Buffers per value (1: `batch_get_into`; more: `batch_get_into_sg`, the multi-buffer get).
    #[arg(long, default_value_t = 1)]
    pieces: u64,
}

fn main() {
    crescent_store::init_tool_logging();
    if let Err(e) = run(Cli::parse()) {
        eprintln!("store-batch-get: error: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<()> {
    if cli.batch == 0 || cli.count == 0 || cli.batch > cli.count {
        bail!("need 0 < batch <= count");
    }
    if cli.pieces == 0 || !cli.size.is_multiple_of(cli.pieces) {
        bail!("--pieces must divide --size");
    }
    let config = ClientConfig {
        master_server_address: cli.master.clone(),
        local_hostname: Some(cli.local_hostname.clone()),
        protocol: Some(crescent_engine::TransportKind::Tcp),
        global_segment_size: 16 << 20,
        local_buffer_size: 16 << 20,
        ..ClientConfig::default()
    };
    let client = StoreClient::connect(config).context("connecting")?;
    let mut buf = vec![0u8; cli.batch * cli.size as usize];
    let base = buf.as_mut_ptr() as u64;
    client.register_buffer(base, buf.len() as u64)?;
    let addrs: Vec<u64> = (0..cli.batch).map(|j| base + j as u64 * cli.size).collect();
    let lens = vec![cli.size; cli.batch];
    // The multi-buffer layout: piece l of value j at layer l, slot j.
    let piece = cli.size / cli.pieces;
    let layer = cli.batch as u64 * piece;
    let layout: Vec<Vec<Piece>> = (0..cli.batch as u64)
        .map(|j| (0..cli.pieces).map(|l| Piece::new(base + l * layer + j * piece, piece)).collect())
        .collect();
    let values: Vec<&[Piece]> = layout.iter().map(|v| &v[..]).collect();
    let keys_of = |round: usize| -> Vec<String> {
        (0..cli.batch).map(|j| format!("{}{}", cli.prefix, (round * cli.batch + j) % cli.count)).collect()
    };
    let get = |round: usize| -> Result<()> {
        let results = if cli.pieces == 1 {
            client.batch_get_into(&keys_of(round), &addrs, &lens)?
        } else {
            client.batch_get_into_sg(&keys_of(round), &values)?
        };
        for (j, r) in results.into_iter().enumerate() {
            let n = r.with_context(|| format!("key {j} of round {round}"))?;
            if n != cli.size {
                bail!("read {n} bytes, expected {}", cli.size);
            }
        }
        Ok(())
    };
    get(0)?;
    for (j, pieces) in layout.iter().enumerate() {
        let value: Vec<u8> = pieces
            .iter()
            .flat_map(|p| {
                let at = (p.addr - base) as usize;
                buf[at..at + p.len as usize].iter().copied()
            })
            .collect();
        if let Some(at) = pattern::first_mismatch(&value, cli.seed, 0) {
            bail!("value {j} differs from the pattern at byte {at}");
        }
    }
    let t = Instant::now();
    for round in 1..=cli.rounds {
        get(round)?;
    }
    let secs = t.elapsed().as_secs_f64();
    let bytes = cli.rounds as u64 * cli.batch as u64 * cli.size;
    println!(
        "{}",
        serde_json::json!({"reader": "rust", "pieces": cli.pieces, "bytes": bytes, "secs": secs, "gb_s": bytes as f64 / secs / 1e9})
    );
    client.unregister_buffer(base)?;
    client.close()?;
    Ok(())
}
