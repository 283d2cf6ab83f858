//! memcpy-bench: what a plain memcpy achieves with the same blocks, buffers and address
//! pattern as `tebench initiator` against a `tebench target` on the same host, so that the
//! shm transport can be put beside it (see `benches/shm-vs-memcpy.sh`).
//!
//! ```text
//! memcpy-bench --operation read --block-size 1M --threads 2 --duration 3 --json
//! ```
//! A "remote" buffer of `--buffer-size` stands for the target's buffer, each thread copies
//! between its share of it and its own local window (at most 256 MiB, like tebench), batch
//! after batch, block by block. Both buffers are shared memfd memory, as `alloc_registered`
//! gives tebench.
//!
//! `--streaming` copies with the hot cache's non-temporal stores
//! (`crescent_store::client::hot_cache::stream_copy`) instead of `memcpy`: with `--operation
//! write` and a buffer larger than the caches, what a fill into the cache's blocks costs
//! either way (`memcpy-bench --operation write --block-size 2M --batch-size 16 [--streaming]`).

use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use crescent_benches::blocks::{BlockArgs, Operation, MAX_LOCAL_WINDOW};
use crescent_benches::{process_cpu_seconds, report};
use crescent_engine::parse_size;
use crescent_store::client::hot_cache::stream_copy::copy_streaming;
use crescent_transports::SharedMemory;

#[derive(Parser)]
#[command(name = "memcpy-bench", about = "memcpy bandwidth with tebench's blocks and buffers")]
struct Cli {
    #[command(flatten)]
    blocks: BlockArgs,
    /// Size of the buffer that stands for the target's.
    #[arg(long, visible_alias = "buffer_size", default_value = "1G", value_parser = size)]
    buffer_size: u64,
    /// Seconds to run.
    #[arg(long, default_value_t = 3.0, value_parser = crescent_benches::parse_seconds)]
    duration: f64,
    /// Print one JSON object with the results (after the human-readable line).
    #[arg(long)]
    json: bool,
    /// Copy with non-temporal stores (the hot cache's fill copy) instead of memcpy.
    #[arg(long)]
    streaming: bool,
}

fn size(s: &str) -> Result<u64, String> {
    parse_size(s)
}

fn main() -> Result<()> {
    let args = Cli::parse();
    if args.blocks.batch_size == 0 || args.blocks.threads == 0 || !args.duration.is_finite() || args.duration <= 0.0 {
        bail!("--batch-size, --threads and --duration must be positive");
    }
    if args.buffer_size < args.blocks.block_size {
        bail!("--buffer-size must hold at least one block");
    }
    let remote = Arc::new(SharedMemory::allocate(args.buffer_size, "memcpy-bench")?);
    let local_blocks = (MAX_LOCAL_WINDOW / args.blocks.block_size).clamp(1, args.blocks.batch_size as u64);
    let locals = (0..args.blocks.threads)
        .map(|_| SharedMemory::allocate(local_blocks * args.blocks.block_size, "memcpy-bench"))
        .collect::<Result<Vec<_>, _>>()
        .context("allocating local windows")?;
    let bytes = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let cpu_started = process_cpu_seconds();
    let handles: Vec<_> = locals
        .into_iter()
        .enumerate()
        .map(|(t, local)| {
            let (remote, bytes, stop) = (remote.clone(), bytes.clone(), stop.clone());
            let (op, block, batch, threads) = (
                args.blocks.operation,
                args.blocks.block_size,
                args.blocks.batch_size as u64,
                args.blocks.threads as u64,
            );
            let streaming = args.streaming;
            std::thread::spawn(move || {
                let total_blocks = remote.len() / block;
                let share = (total_blocks / threads).max(1);
                let first = (t as u64 * share) % total_blocks;
                let mut iteration = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for j in 0..batch {
                        let r = remote.addr() + (first + (iteration * batch + j) % share) * block;
                        let l = local.addr() + (j % local_blocks) * block;
                        let (src, dst) = match op {
                            Operation::Read => (r, l),
                            Operation::Write => (l, r),
                        };
                        // SAFETY: both ranges lie inside mappings this program owns (two
                        // different ones, so they do not overlap), and no two threads copy
                        // into the same bytes (each has its own share and its own local
                        // window); the slices live for this one copy.
                        unsafe {
                            if streaming {
                                copy_streaming(
                                    std::slice::from_raw_parts_mut(dst as *mut MaybeUninit<u8>, block as usize),
                                    std::slice::from_raw_parts(src as *const u8, block as usize),
                                );
                            } else {
                                std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, block as usize);
                            }
                        }
                    }
                    bytes.fetch_add(batch * block, Ordering::Relaxed);
                    iteration += 1;
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(args.duration));
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.join().map_err(|_| anyhow::anyhow!("a copy thread panicked"))?;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let cpu_s = process_cpu_seconds() - cpu_started;
    let total = bytes.load(Ordering::Relaxed);
    let gbps = report::gb_per_s(total, elapsed);
    let op = args.blocks.operation.name();
    println!(
        "memcpy-bench {op}{} {} x {} per batch, {} thread(s): {gbps:.2} GB/s ({} in {elapsed:.1} s)",
        if args.streaming { " (streaming stores)" } else { "" },
        report::fmt_bytes(args.blocks.block_size),
        args.blocks.batch_size,
        args.blocks.threads,
        report::fmt_bytes(total),
    );
    if args.json {
        let json = serde_json::json!({
            "operation": op, "block_size": args.blocks.block_size, "batch_size": args.blocks.batch_size,
            "threads": args.blocks.threads, "duration_s": elapsed, "bytes": total, "gb_per_s": gbps,
            "cpu_s": cpu_s, "streaming": args.streaming,
        });
        println!("{json}");
    }
    Ok(())
}
