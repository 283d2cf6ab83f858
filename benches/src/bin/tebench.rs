//! tebench: the transfer benchmark, run as a target on one host and an initiator on another.
//!
//! ```text
//! host A$ tebench target --protocol tcp --buffer-size 1G
//! host B$ tebench initiator --segment <A's name> --operation read --block-size 64K \
//!             --batch-size 128 --threads 2 --duration 10
//! ```
//! `tebench auth-pair` measures the cluster secret's cost in one process (no target needed).
//! Flag names follow Mooncake's `transfer_engine_bench` (`--mode target|initiator`,
//! `--segment_id`, `--block_size`, ... are accepted too).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use crescent_benches::blocks::{BlockArgs, Operation, MAX_LOCAL_WINDOW};
use crescent_benches::{init_tool_logging, pattern, process_cpu_seconds, report};
use crescent_engine::{
    parse_device_list, parse_size, BufferDescriptor, EngineConfig, EngineError, Opcode, RegisteredMemory, SegmentId,
    TransferEngine, TransferRequest, TransferStatus, TransportKind,
};
use hdrhistogram::Histogram;

#[derive(Parser)]
#[command(
    name = "tebench",
    about = "Crescent transfer benchmark: a target serves a buffer, an initiator reads or writes it"
)]
struct Cli {
    #[command(subcommand)]
    role: Role,
}

#[derive(Subcommand)]
enum Role {
    /// Allocate and register a buffer, print the segment name, serve until interrupted.
    Target(TargetArgs),
    /// Move data to or from a target and report throughput and batch latency.
    Initiator(InitiatorArgs),
    /// The cluster secret on vs off, in one process: engine pairs over tcp loopback and
    /// masters with their clients, alternating pairs (see `crescent_benches::authpair`).
    AuthPair(crescent_benches::authpair::AuthPairArgs),
}

#[derive(Args, Clone)]
struct EngineArgs {
    /// Transport: tcp, rdma or shm (same host); default: chosen per peer (shm on the same host,
    /// else rdma when both ends have a device, else tcp).
    #[arg(long)]
    protocol: Option<String>,
    /// RDMA devices to use, comma-separated (default: MC_DEVICE, else every active device).
    #[arg(long, visible_alias = "device_name")]
    device_name: Option<String>,
    /// GID index of the RDMA port (default: MC_GID_INDEX, else RoCE v2 IPv4-mapped preferred).
    #[arg(long, visible_alias = "gid_index")]
    gid_index: Option<u32>,
    /// Metadata service: P2PHANDSHAKE (ask the peer itself), etcd://host:port[,host:port],
    /// redis://[user:pass@]host:port[/db] or http://host:port/metadata.
    #[arg(long, visible_alias = "metadata_server", default_value = "P2PHANDSHAKE")]
    metadata_server: String,
    /// Address (or host:port) peers use to reach this process.
    #[arg(long, visible_alias = "local_server_name", visible_alias = "local-server-name")]
    local_hostname: Option<String>,
    /// Handshake port (0: any free port).
    #[arg(long, default_value_t = 0)]
    port: u16,
}

#[derive(Args)]
struct TargetArgs {
    #[command(flatten)]
    engine: EngineArgs,
    /// Size of the registered buffer served to initiators.
    #[arg(long, visible_alias = "buffer_size", default_value = "1G", value_parser = size)]
    buffer_size: u64,
    /// Fill the buffer with a position-keyed pattern that `initiator --verify` checks.
    #[arg(long)]
    pattern: bool,
    /// Serve ordinary heap memory registered with `register` (same-host peers then copy with
    /// process_vm_readv/writev) instead of memory from `alloc_registered` (a shared memfd).
    #[arg(long)]
    heap: bool,
    /// Make this process non-dumpable (prctl PR_SET_DUMPABLE 0), as hardened services are:
    /// processes without CAP_SYS_PTRACE may then not read its memory with process_vm_readv.
    #[arg(long)]
    not_dumpable: bool,
}

#[derive(Args)]
struct InitiatorArgs {
    #[command(flatten)]
    engine: EngineArgs,
    /// The target's segment name (printed by `tebench target`).
    #[arg(long, visible_alias = "segment_id", visible_alias = "segment-id")]
    segment: String,
    #[command(flatten)]
    blocks: BlockArgs,
    /// Seconds measured. Each thread's first batch (connection set-up, first touch of the
    /// memory; with `--warm-up-pass`, its first pass over its share) comes before and is not
    /// measured.
    #[arg(long, default_value_t = 10.0, value_parser = crescent_benches::parse_seconds)]
    duration: f64,
    /// Print one JSON object with the results (after the human-readable lines).
    #[arg(long)]
    json: bool,
    /// Check the bytes: reads against the target's `--pattern`; writes by reading them back.
    #[arg(long)]
    verify: bool,
    /// The unmeasured warm-up moves every block of the thread's share of the target's buffer
    /// once, not one batch: the first touch of each page (page faults, and for shm the
    /// mapping of the peer's memory, which a helper thread pre-faults meanwhile) then comes
    /// before the measured part, as it does for memcpy-bench's buffers.
    #[arg(long)]
    warm_up_pass: bool,
    /// Seconds between progress lines (0: none).
    #[arg(long, default_value_t = 1.0, value_parser = crescent_benches::parse_seconds)]
    report_interval: f64,
    /// Seconds to wait for the target to be published and to register its buffer (an
    /// initiator started together with its target); then the run gives up with the reason.
    #[arg(long, default_value_t = 30.0, value_parser = crescent_benches::parse_seconds)]
    wait_for_target: f64,
}

/// Longest pause between two looks at a target that is not ready yet.
const TARGET_POLL_MAX: Duration = Duration::from_millis(500);

fn size(s: &str) -> Result<u64, String> {
    parse_size(s)
}

/// Accepts Mooncake's `--mode target|initiator` as the subcommand.
fn normalized_args() -> Vec<String> {
    let mut args: Vec<String> = std::env::args().collect();
    let mut mode = None;
    let mut i = 1;
    while i < args.len() {
        if let Some(m) = args[i].strip_prefix("--mode=") {
            mode = Some(m.to_string());
            args.remove(i);
        } else if args[i] == "--mode" && i + 1 < args.len() {
            mode = Some(args.remove(i + 1));
            args.remove(i);
        } else {
            i += 1;
        }
    }
    if let Some(m) = mode {
        args.insert(1, m);
    }
    args
}

fn engine(args: &EngineArgs) -> Result<Arc<TransferEngine>> {
    let mut config = EngineConfig::from_env()?;
    config.metadata_server = args.metadata_server.clone();
    config.local_hostname = args.local_hostname.clone();
    config.rpc_port = args.port;
    if let Some(p) = &args.protocol {
        config.protocol = Some(p.parse::<TransportKind>()?);
    }
    if let Some(d) = &args.device_name {
        config.rdma.devices = parse_device_list(d)?;
    }
    if let Some(g) = args.gid_index {
        config.rdma.gid_index = Some(g);
    }
    Ok(TransferEngine::new(config)?)
}

fn main() {
    init_tool_logging();
    let cli = Cli::parse_from(normalized_args());
    let result = match cli.role {
        Role::Target(a) => run_target(a),
        Role::Initiator(a) => run_initiator(a),
        Role::AuthPair(a) => crescent_benches::authpair::run(a),
    };
    if let Err(e) = result {
        eprintln!("tebench: error: {e:#}");
        std::process::exit(1);
    }
}

fn run_target(args: TargetArgs) -> Result<()> {
    if args.not_dumpable {
        rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
            .context("prctl(PR_SET_DUMPABLE, 0)")?;
    }
    let engine = engine(&args.engine)?;
    let mut heap: Vec<u8>;
    let (addr, len, kind) = if args.heap {
        let len = usize::try_from(args.buffer_size).context("--buffer-size")?;
        // Written once, so every page is faulted in before peers copy.
        heap = vec![1u8; len];
        engine.register(heap.as_mut_ptr() as u64, len as u64, "cpu:0").context("registering the target buffer")?;
        (heap.as_mut_ptr(), len, "heap")
    } else {
        let buf = engine.alloc_registered(args.buffer_size, "cpu:0").context("allocating the target buffer")?;
        let kind = if buf.shared_memory().huge_pages() { "shared, huge pages" } else { "shared" };
        // The registration keeps the memory alive until the process exits.
        (buf.addr() as *mut u8, buf.len() as usize, kind)
    };
    if args.pattern {
        // SAFETY: `[addr, +len)` is the live buffer registered above; nothing can transfer
        // yet: the segment name is printed below.
        pattern::fill(unsafe { std::slice::from_raw_parts_mut(addr, len) }, 0, 0);
    }
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    println!("segment: {}", engine.segment_name());
    println!("tebench target: serving {} at {addr:#x?} ({kind} memory); Ctrl-C to stop", report::fmt_bytes(len as u64),);
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("tebench target: stopping");
    Ok(())
}

/// Opens the target's segment, waiting until `give_up` while a metadata service does not list
/// it yet (its target is still starting); the handle and how long the successful open took in
/// µs. Opening dials the target's handshake port: with a cluster secret, this is where the
/// connection's challenge-response happens (the JSON's `open_segment_us`).
fn open_target(engine: &TransferEngine, name: &str, give_up: Instant, waiting: Duration) -> Result<(SegmentId, f64)> {
    let mut pause = Duration::from_millis(20);
    let mut said = false;
    loop {
        let opening = Instant::now();
        match engine.open_segment(name) {
            Ok(id) => return Ok((id, opening.elapsed().as_secs_f64() * 1e6)),
            Err(e @ EngineError::SegmentNotFound { .. }) => {
                if Instant::now() >= give_up {
                    return Err(e).with_context(|| {
                        format!("opening segment {name}: not published after waiting {waiting:?} (--wait-for-target)")
                    });
                }
                if !std::mem::replace(&mut said, true) {
                    eprintln!("tebench: segment {name} is not published yet ({e}); waiting up to {waiting:?} for it");
                }
            }
            Err(e) => return Err(e).with_context(|| format!("opening segment {name}")),
        }
        std::thread::sleep(pause.min(give_up.saturating_duration_since(Instant::now())));
        pause = (pause * 2).min(TARGET_POLL_MAX);
    }
}

/// The largest buffer the target's descriptor lists. A target that has not registered one yet
/// (an initiator started as soon as the target's engine was up) is looked up again, with
/// growing pauses, until `give_up`.
fn registered_buffer(
    engine: &TransferEngine,
    target: SegmentId,
    name: &str,
    give_up: Instant,
    waiting: Duration,
) -> Result<BufferDescriptor> {
    let mut pause = Duration::from_millis(20);
    let mut said = false;
    let mut last_error = None;
    loop {
        let descriptor = engine.segment_descriptor(target)?;
        if let Some(b) = descriptor.buffers.iter().max_by_key(|b| b.length) {
            return Ok(b.clone());
        }
        if Instant::now() >= give_up {
            let why = last_error.map(|e| format!(" (reading its descriptor last failed: {e})")).unwrap_or_default();
            bail!(
                "segment {name} has no registered buffer after waiting {waiting:?}{why}: has its target registered \
                 memory? (--wait-for-target sets the wait)"
            );
        }
        if !std::mem::replace(&mut said, true) {
            eprintln!("tebench: segment {name} has no registered buffer yet; waiting up to {waiting:?} for its target");
        }
        std::thread::sleep(pause.min(give_up.saturating_duration_since(Instant::now())));
        pause = (pause * 2).min(TARGET_POLL_MAX);
        last_error = engine.resync_segment(target).err();
    }
}

struct ThreadResult {
    hist: Histogram<u64>,
    errors: u64,
    first_error: Option<String>,
    mismatch: Option<String>,
}

fn run_initiator(args: InitiatorArgs) -> Result<()> {
    if args.blocks.batch_size == 0 || args.blocks.threads == 0 || !args.duration.is_finite() || args.duration <= 0.0 {
        bail!("--batch-size, --threads and --duration must be positive");
    }
    let engine = engine(&args.engine)?;
    let waiting = Duration::from_secs_f64(args.wait_for_target);
    let give_up = Instant::now() + waiting;
    let (target, open_segment_us) = open_target(&engine, &args.segment, give_up, waiting)?;
    let remote = registered_buffer(&engine, target, &args.segment, give_up, waiting)?;
    // Without --verify, requests may share local memory: a batch of 128 x 16 MiB needs no
    // 2 GiB of local buffer to measure the transport.
    let local_blocks = if args.verify {
        args.blocks.batch_size as u64
    } else {
        (MAX_LOCAL_WINDOW / args.blocks.block_size).clamp(1, args.blocks.batch_size as u64)
    };
    if remote.length < args.blocks.block_size {
        bail!("the target's buffer ({} bytes) is smaller than one block", remote.length);
    }
    let protocol = engine.segment_transport(target)?;
    let bytes = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let locals = (0..args.blocks.threads)
        .map(|_| {
            engine.alloc_registered(local_blocks * args.blocks.block_size * if args.verify { 2 } else { 1 }, "cpu:0")
        })
        .collect::<Result<Vec<_>, _>>()
        .context("allocating local buffers")?;
    // Each thread first moves one batch that is not measured (it sets up the connection to the
    // target and touches the memory), then all start the measured part together.
    let warmed_up = Arc::new(Barrier::new(args.blocks.threads + 1));
    let mut handles = Vec::new();
    for (t, local) in locals.into_iter().enumerate() {
        let (engine, bytes, stop, warmed_up) = (engine.clone(), bytes.clone(), stop.clone(), warmed_up.clone());
        let (op, block, batch, verify) =
            (args.blocks.operation, args.blocks.block_size, args.blocks.batch_size, args.verify);
        let warm_up_pass = args.warm_up_pass;
        let threads = args.blocks.threads;
        let (remote_base, remote_len) = (remote.addr, remote.length);
        handles.push(std::thread::spawn(move || {
            initiator_thread(
                &engine,
                target,
                local,
                t,
                threads,
                op,
                block,
                batch,
                verify,
                warm_up_pass,
                remote_base,
                remote_len,
                &bytes,
                &stop,
                &warmed_up,
            )
        }));
    }
    warmed_up.wait();
    let started = Instant::now();
    let cpu_started = process_cpu_seconds();
    let deadline = started + Duration::from_secs_f64(args.duration);
    let mut last = (started, 0u64);
    let interval = (args.report_interval > 0.0).then(|| Duration::from_secs_f64(args.report_interval));
    let mut next_report = interval.map(|i| started + i);
    while Instant::now() < deadline {
        // A thread stops early only when a batch failed: once all have, there is nothing left
        // to measure, and the run ends with their reason rather than at --duration.
        if handles.iter().all(|h| h.is_finished()) {
            eprintln!("tebench: every initiator thread stopped before --duration");
            break;
        }
        let until = next_report.map_or(deadline, |r| r.min(deadline));
        std::thread::sleep(until.saturating_duration_since(Instant::now()).min(Duration::from_millis(100)));
        if let (Some(at), Some(interval)) = (next_report, interval) {
            if Instant::now() >= at {
                let (now, b) = (Instant::now(), bytes.load(Ordering::Relaxed));
                eprintln!(
                    "[{:>5.1}s] {:.2} GB/s",
                    (now - started).as_secs_f64(),
                    report::gb_per_s(b - last.1, (now - last.0).as_secs_f64())
                );
                last = (now, b);
                next_report = Some(at + interval);
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let mut hist = Histogram::<u64>::new(3)?;
    let (mut errors, mut first_error, mut mismatch) = (0, None, None);
    for h in handles {
        let r = h.join().map_err(|_| anyhow::anyhow!("an initiator thread panicked"))??;
        hist.add(&r.hist)?;
        errors += r.errors;
        first_error = first_error.or(r.first_error);
        mismatch = mismatch.or(r.mismatch);
    }
    let elapsed = started.elapsed().as_secs_f64();
    let cpu_s = process_cpu_seconds() - cpu_started;
    let total = bytes.load(Ordering::Relaxed);
    let gbps = report::gb_per_s(total, elapsed);
    let op = args.blocks.operation.name();
    let (p50, p99, p999) = (hist.value_at_quantile(0.5), hist.value_at_quantile(0.99), hist.value_at_quantile(0.999));
    println!(
        "tebench {op} {} x {} per batch, {} thread(s), {protocol}: {gbps:.2} GB/s ({} in {elapsed:.1} s, {} batches); batch latency p50 {} p99 {} p999 {}",
        report::fmt_bytes(args.blocks.block_size),
        args.blocks.batch_size,
        args.blocks.threads,
        report::fmt_bytes(total),
        hist.len(),
        report::fmt_us(p50),
        report::fmt_us(p99),
        report::fmt_us(p999),
    );
    if args.json {
        let json = serde_json::json!({
            "operation": op, "protocol": protocol.to_string(), "segment": args.segment,
            "block_size": args.blocks.block_size, "batch_size": args.blocks.batch_size, "threads": args.blocks.threads,
            "duration_s": elapsed, "bytes": total, "gb_per_s": gbps, "batches": hist.len(),
            "cpu_s": cpu_s, "open_segment_us": open_segment_us,
            "latency_us": {"p50": p50, "p99": p99, "p999": p999},
            "failed_requests": errors, "verified": args.verify && mismatch.is_none() && errors == 0,
        });
        println!("{json}");
    }
    if let Some(m) = mismatch {
        bail!("data verification failed: {m}");
    }
    if errors > 0 {
        bail!("{errors} request(s) failed; first: {}", first_error.unwrap_or_default());
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn initiator_thread(
    engine: &TransferEngine,
    target: u64,
    local: RegisteredMemory,
    thread: usize,
    threads: usize,
    op: Operation,
    block: u64,
    batch: usize,
    verify: bool,
    warm_up_pass: bool,
    remote_base: u64,
    remote_len: u64,
    bytes: &AtomicU64,
    stop: &AtomicBool,
    warmed_up: &Barrier,
) -> Result<ThreadResult> {
    let mut result = ThreadResult { hist: Histogram::new(3)?, errors: 0, first_error: None, mismatch: None };
    let local_blocks = (local.len() / block / if verify { 2 } else { 1 }).max(1);
    // Each thread owns its own share of the target's blocks, so written blocks read back as written.
    let share = (remote_len / block / threads as u64).max(1);
    let first_block = (thread as u64 * share) % (remote_len / block);
    let window = block * batch as u64;
    let mut iteration: u64 = 0;
    // The first batch (or pass over the share) is the unmeasured warm-up; the barrier is
    // passed whatever its outcome.
    let warm_up_batches = if warm_up_pass { share.div_ceil(batch as u64) } else { 1 };
    let mut warming_up = true;
    while warming_up || (!stop.load(Ordering::Relaxed) && result.mismatch.is_none()) {
        let offsets: Vec<u64> =
            (0..batch as u64).map(|j| (first_block + (iteration * batch as u64 + j) % share) * block).collect();
        let opcode = if op == Operation::Read { Opcode::Read } else { Opcode::Write };
        let seed = (thread as u64) << 32 | iteration;
        if verify && op == Operation::Write {
            // SAFETY: no transfer of this thread's buffer is in flight between batches.
            let buf = unsafe { local.as_mut_slice() };
            for (j, chunk) in buf[..window as usize].chunks_mut(block as usize).enumerate() {
                pattern::fill(chunk, seed, offsets[j]);
            }
        }
        let requests: Vec<TransferRequest> = offsets
            .iter()
            .enumerate()
            .map(|(j, &off)| TransferRequest {
                opcode,
                source: local.addr() + (j as u64 % local_blocks) * block,
                target,
                target_offset: remote_base + off,
                length: block,
            })
            .collect();
        let begin = Instant::now();
        let statuses = match move_batch(engine, batch, &requests) {
            Ok(s) => s,
            Err(e) => {
                warm_up_done(&mut warming_up, warmed_up);
                return Err(e);
            }
        };
        let measured = !warming_up;
        if measured {
            result.hist.record(begin.elapsed().as_micros() as u64)?;
        }
        let mut ok = 0;
        for s in &statuses {
            match s {
                TransferStatus::Completed => ok += 1,
                other => {
                    result.errors += 1;
                    result.first_error.get_or_insert_with(|| format!("{other:?}"));
                }
            }
        }
        if measured {
            bytes.fetch_add(ok * block, Ordering::Relaxed);
        }
        if verify && result.errors == 0 {
            match verify_batch(engine, target, &local, op, block, &offsets, seed, remote_base, window) {
                Ok(m) => result.mismatch = m,
                Err(e) => {
                    warm_up_done(&mut warming_up, warmed_up);
                    return Err(e);
                }
            }
        }
        if iteration + 1 >= warm_up_batches || result.errors > 0 || result.mismatch.is_some() {
            warm_up_done(&mut warming_up, warmed_up);
        }
        if result.errors > 0 {
            break;
        }
        iteration += 1;
    }
    Ok(result)
}

/// Ends a thread's warm-up (once): it waits for the other threads' at the barrier.
fn warm_up_done(warming_up: &mut bool, barrier: &Barrier) {
    if std::mem::take(warming_up) {
        barrier.wait();
    }
}

/// One batch, submitted and waited for.
fn move_batch(engine: &TransferEngine, batch: usize, requests: &[TransferRequest]) -> Result<Vec<TransferStatus>> {
    let id = engine.allocate_batch(batch)?;
    engine.submit(id, requests)?;
    let statuses = engine.wait_batch(id, None)?;
    engine.free_batch(id)?;
    Ok(statuses)
}

#[allow(clippy::too_many_arguments)]
fn verify_batch(
    engine: &TransferEngine,
    target: u64,
    local: &RegisteredMemory,
    op: Operation,
    block: u64,
    offsets: &[u64],
    seed: u64,
    remote_base: u64,
    window: u64,
) -> Result<Option<String>> {
    let (check_base, seed) = match op {
        // Reads: the target's buffer holds pattern seed 0 keyed by offset.
        Operation::Read => (local.addr(), 0),
        // Writes: read what was written back into the second half and compare.
        Operation::Write => {
            let back: Vec<TransferRequest> = offsets
                .iter()
                .enumerate()
                .map(|(j, &off)| TransferRequest {
                    opcode: Opcode::Read,
                    source: local.addr() + window + j as u64 * block,
                    target,
                    target_offset: remote_base + off,
                    length: block,
                })
                .collect();
            engine.transfer_sync(&back)?;
            (local.addr() + window, seed)
        }
    };
    let base = (check_base - local.addr()) as usize;
    // SAFETY: every transfer of this buffer has ended.
    let buf = unsafe { local.as_slice() };
    for (j, &off) in offsets.iter().enumerate() {
        let start = base + j * block as usize;
        if let Some(at) = pattern::first_mismatch(&buf[start..start + block as usize], seed, off) {
            return Ok(Some(format!("byte at remote offset {at} differs from what was expected")));
        }
    }
    Ok(None)
}
