//! `storebench ssd`: the disk tier's offload write throughput and read-on-miss latency,
//! beside plain `dd` with direct I/O on the same file system, in the same run.
//!
//! Per value size: a client with a storage root puts `bytes-per-row` of values, `--batch` at a
//! time (`put_batch`, as an inference engine stores a request's KV blocks), and waits until
//! every offload is on disk (written, fsynced, renamed, announced): offload MiB/s from the
//! first put to the end of the flush, and the put calls' p50 latency (a put returns before
//! its file is written). One by one (`--batch 1`), 1 MiB puts come slower than the disk
//! writes: each is two master round trips plus the copy into the segment, so that row would
//! measure the put, not the offload. Then the client restarts on the same root, so every
//! value exists only as a disk copy, and reads each one with `get_into` into a registered
//! buffer reused for every value (master round trip, direct read of the file, checksum
//! check): read-on-miss MiB/s and latency. The buffer is 4 KiB-aligned (dd's is too), so the
//! value is read with direct I/O straight into it. `dd if=/dev/zero of=F bs=SIZE count=N
//! oflag=direct conv=fdatasync` and `dd if=F of=/dev/null bs=SIZE iflag=direct` move the same
//! bytes on the same file system, each beside crescent's (dd first in odd passes, second in
//! even ones). `--repeat` passes (default 7) alternate the two, because a virtual disk's
//! speed drifts by tens of percent from one minute to the next; each row prints medians,
//! `ratio` = the median of the passes' crescent / dd ratios (target >= 0.80), and the ratios'
//! range.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use crescent_engine::parse_size;
use crescent_store::client::disk::FsyncScope;
use crescent_store::master::server;
use crescent_store::{pattern, ClientConfig, MasterConfig, StoreApi, StoreClient};
use hdrhistogram::Histogram;

use crate::report;

#[derive(Parser)]
#[command(name = "storebench ssd", about = "Disk tier: offload and read-on-miss beside dd with direct I/O")]
pub struct Cli {
    /// Directory on the file system to measure (a storage root is made inside it).
    #[arg(long, default_value = "/var/tmp")]
    dir: PathBuf,
    #[arg(long, value_delimiter = ',', default_value = "1M,10M,25M", value_parser = parse_size)]
    sizes: Vec<u64>,
    /// Bytes per row (the value count follows from it).
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    bytes_per_row: u64,
    /// Alternating crescent/dd passes (pairs) per size; rows show medians.
    #[arg(long, visible_alias = "pairs", default_value_t = 7)]
    repeat: usize,
    /// Disk tier writer threads.
    #[arg(long, default_value_t = 4)]
    writers: usize,
    /// Flush each file before renaming it, and the renames before announcing (the client's
    /// `disk_fsync`; off shows what the flushes cost).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    fsync: bool,
    /// What one flush covers (the client's `disk_fsync_scope`): `filesystem` (one `syncfs`
    /// before and one after each commit round's renames) or `file` (an `fdatasync` per file
    /// and an `fsync` per directory of a round).
    #[arg(long, default_value_t = FsyncScope::default())]
    fsync_scope: FsyncScope,
    /// Bytes of removed files the client keeps to write over (its `disk_recycle_size`; 0
    /// turns reuse off, so that every offload makes a new file). Each pass removes its
    /// values at the end, so from the second pass on the offloads write over those files.
    #[arg(long, default_value = "1G", value_parser = parse_size_or_zero)]
    recycle_size: u64,
    /// Write and flush through io_uring where the kernel has it (the client's
    /// `disk_io_uring`; off: plain system calls).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    io_uring: bool,
    /// Values per put call in the offload row: more than 1 puts them in batches
    /// (`put_batch`, one pair of master round trips per batch), 1 one by one (`put`).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..))]
    batch: u64,
}

fn parse_size_or_zero(s: &str) -> Result<u64, String> {
    if s.trim() == "0" {
        return Ok(0);
    }
    parse_size(s).map_err(|e| e.to_string())
}

pub fn main(args: impl Iterator<Item = String>) -> Result<()> {
    let cli = Cli::parse_from(args);
    let work = cli.dir.join(format!("crescent-ssdbench-{}", std::process::id()));
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let result = run(&cli, &work);
    let _ = std::fs::remove_dir_all(&work);
    result
}

fn dd(args: &[String]) -> Result<f64> {
    let t = Instant::now();
    let out = Command::new("dd").args(args).output().context("running dd")?;
    let secs = t.elapsed().as_secs_f64();
    if !out.status.success() {
        bail!("dd {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(secs)
}

fn mib_s(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / (1 << 20) as f64 / secs.max(1e-9)
}

fn run(cli: &Cli, work: &Path) -> Result<()> {
    let master = server::start(MasterConfig {
        rpc_address: "127.0.0.1:0".into(),
        admin_address: "127.0.0.1:0".into(),
        ..MasterConfig::default()
    })?;
    let max_row = cli.sizes.iter().map(|s| (cli.bytes_per_row / s).max(4) * s).max().context("no sizes")?;
    let config = ClientConfig {
        master_server_address: master.client_address(),
        local_hostname: Some("127.0.0.1".into()),
        global_segment_size: max_row + (64 << 20),
        local_buffer_size: 64 << 20,
        storage_root_dir: Some(work.join("root")),
        storage_capacity: Some(max_row * 2 + (64 << 20)),
        disk_writer_threads: cli.writers,
        disk_queue_bytes: max_row + (64 << 20),
        disk_fsync: cli.fsync,
        disk_fsync_scope: cli.fsync_scope,
        disk_recycle_bytes: cli.recycle_size,
        disk_io_uring: cli.io_uring,
        ..ClientConfig::default()
    };
    std::fs::create_dir_all(work.join("root"))?;
    let fs = Command::new("df").args(["--output=fstype,source"]).arg(work).output()?;
    let fs = String::from_utf8_lossy(&fs.stdout)
        .lines()
        .nth(1)
        .unwrap_or("?")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    println!(
        "storebench ssd: {} ({fs}), {} writer thread(s){}, fsync {}, removed files kept for reuse: {}",
        cli.dir.display(),
        cli.writers,
        if cli.io_uring { " (io_uring where the kernel has it)" } else { "" },
        if cli.fsync { format!("on (scope: {})", cli.fsync_scope) } else { "off".into() },
        if cli.recycle_size == 0 { "none".to_string() } else { report::fmt_bytes(cli.recycle_size) }
    );
    println!();
    let load = report::Load::start();
    println!(
        "medians of {} alternating crescent/dd passes per row; ratio = the median of the passes' crescent / dd \
         ratios, range = theirs",
        cli.repeat
    );
    println!();
    println!(
        "| op | value | values | crescent MiB/s | crescent p50 | dd MiB/s | dd per value | ratio | range | target | met |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let mut early = Vec::new();
    for &size in &cli.sizes {
        let n = (cli.bytes_per_row / size).max(4);
        let total = n * size;
        let label = report::fmt_bytes(size);
        // Pairs alternate crescent and dd, so that both meet the same state of the disk (and
        // of the host's cache under a virtual disk); rows give medians and the ratio's range.
        let passes = (0..cli.repeat.max(1))
            .map(|pass| one_pass(&config, work, size, n, pass, cli.batch))
            .collect::<Result<Vec<_>>>()?;
        let row = |op: &str, ours: &dyn Fn(&Pass) -> f64, theirs: &dyn Fn(&Pass) -> f64, p50: String| {
            let mut pairs = report::Pairs::default();
            for p in &passes {
                pairs.push(mib_s(total, ours(p)), mib_s(total, theirs(p)));
            }
            let s = pairs.summary();
            let dd_secs = median(passes.iter().map(theirs).collect());
            println!(
                "| {op} | {label} | {n} | {:.0} | {p50} | {:.0} | {} | {}",
                s.ours,
                s.limit,
                report::fmt_us((dd_secs * 1e6 / n as f64) as u64),
                s.ratio_cells(report::Target::AtLeast(0.80)),
            );
        };
        let put_p50 = median(passes.iter().map(|p| p.put_p50_us as f64).collect()) as u64;
        let offload = if cli.batch > 1 {
            format!("offload write (put_batch x{})", cli.batch)
        } else {
            "offload write (put)".into()
        };
        row(&offload, &|p| p.offload_secs, &|p| p.dd_write_secs, report::fmt_us(put_p50));
        let p50 = median(passes.iter().map(|p| p.read_p50_us as f64).collect()) as u64;
        row("read on miss", &|p| p.read_secs, &|p| p.dd_read_secs, report::fmt_us(p50));
        let (read_early, wasted) = passes.iter().fold((0, 0), |(e, w), p| (e + p.early_reads, w + p.early_wasted));
        let all = n * passes.len() as u64;
        early.push(format!(
            "{label}: {} of {all} offloads written through io_uring; \
             {read_early} of {all} gets read their file while asking the master ({wasted} of those wasted)",
            passes.iter().map(|p| p.uring_writes).sum::<u64>(),
        ));
    }
    println!();
    for line in early {
        println!("{line}");
    }
    load.finish();
    Ok(())
}

/// One pass at one value size: crescent's offload and read-on-miss, each followed by dd
/// moving the same bytes.
struct Pass {
    offload_secs: f64,
    /// A put call's latency with the disk tier on (it returns before its files are written).
    put_p50_us: u64,
    dd_write_secs: f64,
    read_secs: f64,
    read_p50_us: u64,
    dd_read_secs: f64,
    /// Gets that read their file while the master answered, and those whose read was wasted.
    early_reads: u64,
    early_wasted: u64,
    /// Offloads written through io_uring.
    uring_writes: u64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn one_pass(config: &ClientConfig, work: &Path, size: u64, n: u64, pass: usize, batch: u64) -> Result<Pass> {
    // Keys of their own per pass: the reads' leases keep the last pass's objects a while.
    let key = |i: u64| format!("ssdbench/{size}/{pass}/{i}");
    let mut value = vec![0u8; size as usize];
    pattern::fill(&mut value, size, 0);
    let dd_file = work.join("dd.bin");
    let dd_write = || {
        dd(&[
            "if=/dev/zero".into(),
            format!("of={}", dd_file.display()),
            format!("bs={size}"),
            format!("count={n}"),
            "oflag=direct".into(),
            "conv=fdatasync".into(),
        ])
    };
    let dd_read = || {
        dd(&[format!("if={}", dd_file.display()), "of=/dev/null".into(), format!("bs={size}"), "iflag=direct".into()])
    };
    // Which tool goes first alternates from pass to pass, so that neither always meets the
    // disk (and, under a virtual disk, the host's cache) right after the other's writes.
    let dd_first = pass % 2 == 1;
    let mut dd_write_secs = if dd_first { dd_write()? } else { 0.0 };

    // Offload: puts, then wait until every file is durable and announced.
    let client = StoreClient::connect(config.clone())?;
    let t = Instant::now();
    let mut puts = Histogram::<u64>::new(3)?;
    for first in (0..n).step_by(batch as usize) {
        let keys: Vec<String> = (first..n.min(first + batch)).map(key).collect();
        let p = Instant::now();
        if batch == 1 {
            client.put(&keys[0], &value)?;
        } else {
            let values = vec![value.as_slice(); keys.len()];
            client.put_batch(&keys, &values)?.into_iter().collect::<Result<Vec<_>, _>>()?;
        }
        puts.record(p.elapsed().as_micros() as u64)?;
    }
    if !client.flush_offload(Duration::from_secs(600)) {
        bail!("offloads did not finish");
    }
    let offload_secs = t.elapsed().as_secs_f64();
    let stats = client.disk_stats().context("disk tier")?;
    let uring_writes = stats.uring_writes;
    if stats.queue_full > 0 || stats.written < n {
        bail!("only {} of {n} values were offloaded ({} dropped: queue full)", stats.written, stats.queue_full);
    }
    client.close()?;
    drop(client);
    if !dd_first {
        dd_write_secs = dd_write()?;
    }

    // Read on miss: a restarted client has only the disk copies.
    // get_into a registered buffer reused for every value, as dd reuses its buffer.
    // The buffer is page-aligned, as dd's is and as registered memory usually is (mmap).
    let client = StoreClient::connect(config.clone())?;
    let mut backing = vec![0u8; size as usize + 4096];
    let at = backing.as_ptr().align_offset(4096);
    let buf = &mut backing[at..at + size as usize];
    client.register_buffer(buf.as_mut_ptr() as u64, size)?;
    let mut dd_read_secs = if dd_first { dd_read()? } else { 0.0 };
    let mut hist = Histogram::<u64>::new(3)?;
    let mut read_secs = 0.0;
    for i in 0..n {
        buf.fill(0);
        let g = Instant::now();
        let got = client.get_into(&key(i), buf.as_mut_ptr() as u64, size)?;
        let e = g.elapsed();
        read_secs += e.as_secs_f64();
        hist.record(e.as_micros() as u64)?;
        if got != size || pattern::first_mismatch(buf, size, 0).is_some() {
            bail!("get of {} returned wrong bytes", key(i));
        }
    }
    client.unregister_buffer(buf.as_mut_ptr() as u64)?;
    let stats = client.disk_stats().context("disk tier")?;
    if stats.local_reads < n {
        bail!("not every get was served by the disk tier");
    }
    if !dd_first {
        dd_read_secs = dd_read()?;
    }
    for i in 0..n {
        client.remove_with(&key(i), true)?;
    }
    client.close()?;
    let _ = std::fs::remove_file(&dd_file);
    Ok(Pass {
        offload_secs,
        put_p50_us: puts.value_at_quantile(0.5),
        dd_write_secs,
        read_secs,
        read_p50_us: hist.value_at_quantile(0.5),
        dd_read_secs,
        early_reads: stats.early_reads,
        early_wasted: stats.early_reads_wasted,
        uring_writes,
    })
}
