//! fault-prober: the initiator of the fault-injection tests (`tests/tests/faults_*.rs`), a
//! process of its own (in a network namespace, or beside the target) so that its file
//! descriptors, threads and memory can be watched from outside while a fault hits its peer.
//!
//! ```text
//! fault-prober --segment NAME [--local-hostname ADDR] [--protocol tcp|shm|rdma] --timeout SECS
//! ```
//!
//! Runs commands read from stdin against the segment of a `tebench target --pattern` (16 MiB
//! or more), one per line, each answered by one line: `ok MS`, `err MS KIND message` (KIND:
//! `timed-out`, `failed`, `unreachable`, `other`) or `corrupt MS AT` (a transfer that completed
//! with bytes other than the right ones: what must never happen). MS is how long it took.
//! The segment is opened by the first command, which then answers for the opening only (and
//! again by later ones while that fails): tests send `open` first.
//!
//! * `open`: opens the segment (nothing else);
//! * `resync`: fetches the segment's descriptor again (after the target restarted);
//! * `read OFF LEN`: reads `[buffer+OFF, +LEN)` (within 8 MiB), checked against the pattern;
//! * `writeback LEN`: writes a fresh pattern to the next slot of LEN bytes in `[8, 16 MiB)` and
//!   reads it back, checked (unless an earlier write to that slot did not complete);
//! * `batch N LEN`: one batch of N reads of LEN bytes at offsets `i*LEN`, each completed one
//!   checked; `ok MS` only when all completed, else `err MS KIND` of the first other;
//! * `quit`.

use std::io::{BufRead, Write};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use crescent_engine::{
    EngineConfig, EngineError, Opcode, TransferEngine, TransferRequest, TransferStatus, TransportKind,
};
use crescent_store::pattern;

struct Args {
    segment: String,
    local_hostname: Option<String>,
    protocol: Option<TransportKind>,
    timeout: Duration,
}

fn parse_args() -> Result<Args> {
    let mut args =
        Args { segment: String::new(), local_hostname: None, protocol: None, timeout: Duration::from_secs(2) };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = || it.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--segment" => args.segment = value()?,
            "--local-hostname" => args.local_hostname = Some(value()?),
            "--protocol" => {
                args.protocol = Some(match value()?.as_str() {
                    "tcp" => TransportKind::Tcp,
                    "shm" => TransportKind::Shm,
                    "rdma" => TransportKind::Rdma,
                    other => bail!("unknown protocol {other}"),
                })
            }
            "--timeout" => args.timeout = Duration::from_secs_f64(value()?.parse().context("--timeout")?),
            other => bail!("unknown argument {other}"),
        }
    }
    if args.segment.is_empty() {
        bail!("--segment is required");
    }
    Ok(args)
}

fn kind(e: &EngineError) -> &'static str {
    match e {
        EngineError::TimedOut | EngineError::PeerTimedOut { .. } => "timed-out",
        EngineError::TransferFailed { .. } => "failed",
        EngineError::SegmentUnreachable { .. } | EngineError::BadPeerReply { .. } => "unreachable",
        _ => "other",
    }
}

fn status_kind(s: &TransferStatus) -> &'static str {
    match s {
        TransferStatus::TimedOut => "timed-out",
        TransferStatus::Failed(_) => "failed",
        _ => "other",
    }
}

/// The opened segment: its handle, its largest buffer, and local memory as large.
struct Opened {
    seg: crescent_engine::SegmentId,
    remote: u64,
    local: crescent_engine::RegisteredMemory,
}

fn open(engine: &TransferEngine, name: &str, resync: Option<&Opened>) -> crescent_engine::Result<Opened> {
    let seg = match resync {
        Some(o) => {
            engine.resync_segment(o.seg)?;
            o.seg
        }
        None => engine.open_segment(name)?,
    };
    let d = engine.segment_descriptor(seg)?;
    let b = d.buffers.iter().max_by_key(|b| b.length).cloned();
    let b = b.ok_or_else(|| EngineError::InvalidArgument(format!("segment {name} has no buffer")))?;
    if b.length < WRITE_AREA.end {
        return Err(EngineError::InvalidArgument(format!("segment {name}'s buffer is smaller than 16 MiB")));
    }
    let local = match resync {
        Some(o) => engine.alloc_registered(o.local.len(), "cpu:0")?,
        None => engine.alloc_registered(WRITE_AREA.end, "cpu:0")?,
    };
    Ok(Opened { seg, remote: b.addr, local })
}

/// Reads use `[0, 8 MiB)` of the target (its pattern, seed 0); `writeback` writes and reads
/// back slots of `[8 MiB, 16 MiB)`.
const WRITE_AREA: std::ops::Range<u64> = 8 << 20..16 << 20;

fn main() -> Result<()> {
    let args = parse_args()?;
    // The environment's settings (MC_DEVICE, MC_GID_INDEX for rdma), then the arguments.
    let engine = TransferEngine::new(EngineConfig {
        local_hostname: args.local_hostname.clone(),
        protocol: args.protocol,
        transfer_timeout: args.timeout,
        ..EngineConfig::from_env()?
    })?;
    println!("ready");
    let mut opened: Option<Opened> = None;
    // Slots whose write did not complete: their bytes are undefined from then on (a write that
    // timed out may still land), so they are never checked again.
    let mut tainted = std::collections::HashSet::new();
    let mut round = 0u64;
    let out = std::io::stdout();
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let words: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| -> Result<u64> { words.get(i).context("missing argument")?.parse().context("a number") };
        let start = Instant::now();
        let ms = |start: Instant| start.elapsed().as_millis();
        let fail = |e: &EngineError| format!("err {} {} {e}", ms(start), kind(e));
        let answer = match words.first().copied() {
            Some("quit") => break,
            Some("resync") if opened.is_some() => match open(&engine, &args.segment, opened.as_ref()) {
                Ok(o) => {
                    opened = Some(o);
                    format!("ok {}", ms(start))
                }
                Err(e) => fail(&e),
            },
            Some(_) if opened.is_none() => match open(&engine, &args.segment, None) {
                Ok(o) => {
                    opened = Some(o);
                    format!("ok {}", ms(start))
                }
                Err(e) => fail(&e),
            },
            Some("open" | "resync") => format!("ok {}", ms(start)),
            Some(op @ ("read" | "writeback" | "batch")) => {
                let o = opened.as_ref().expect("opened above");
                // SAFETY: `o.local` is registered memory owned by this process while `o` lives;
                // the engine writes it only during a transfer, which this loop waits for
                // before it reads or fills the bytes.
                let mem = unsafe { std::slice::from_raw_parts_mut(o.local.addr() as *mut u8, o.local.len() as usize) };
                let req = |opcode, off: u64, len: u64| TransferRequest {
                    opcode,
                    source: o.local.addr() + off,
                    target: o.seg,
                    target_offset: o.remote + off,
                    length: len,
                };
                let read_checked = |mem: &mut [u8], off: u64, len: u64, seed: Option<u64>| -> String {
                    let range = off as usize..(off + len) as usize;
                    mem[range.clone()].fill(0);
                    match engine.transfer_sync(&[req(Opcode::Read, off, len)]) {
                        Ok(()) => match seed.and_then(|seed| pattern::first_mismatch(&mem[range], seed, off)) {
                            Some(at) => format!("corrupt {} {at}", ms(start)),
                            None => format!("ok {}", ms(start)),
                        },
                        Err(e) => fail(&e),
                    }
                };
                match op {
                    "read" => {
                        let (off, len) = (num(1)?, num(2)?);
                        read_checked(mem, off, len, Some(0))
                    }
                    "writeback" => {
                        let len = num(1)?;
                        let slots = (WRITE_AREA.end - WRITE_AREA.start) / len;
                        round += 1;
                        let slot = round % slots;
                        let off = WRITE_AREA.start + slot * len;
                        let seed = 1000 + round;
                        pattern::fill(&mut mem[off as usize..(off + len) as usize], seed, off);
                        match engine.transfer_sync(&[req(Opcode::Write, off, len)]) {
                            Ok(()) => {
                                let check = (!tainted.contains(&(off, len))).then_some(seed);
                                read_checked(mem, off, len, check)
                            }
                            Err(e) => {
                                tainted.insert((off, len));
                                fail(&e)
                            }
                        }
                    }
                    _ => {
                        let (n, len) = (num(1)?, num(2)?);
                        mem[..(n * len) as usize].fill(0);
                        let reqs: Vec<_> = (0..n).map(|i| req(Opcode::Read, i * len, len)).collect();
                        let result = engine.allocate_batch(n as usize).and_then(|id| {
                            engine.submit(id, &reqs)?;
                            let statuses = engine.wait_batch(id, None)?;
                            engine.free_batch(id)?;
                            Ok(statuses)
                        });
                        match result {
                            Err(e) => fail(&e),
                            Ok(statuses) => {
                                let corrupt = statuses.iter().enumerate().find_map(|(i, s)| {
                                    let off = i as u64 * len;
                                    (*s == TransferStatus::Completed)
                                        .then(|| {
                                            pattern::first_mismatch(&mem[off as usize..(off + len) as usize], 0, off)
                                        })
                                        .flatten()
                                });
                                match (corrupt, statuses.iter().find(|s| **s != TransferStatus::Completed)) {
                                    (Some(at), _) => format!("corrupt {} {at}", ms(start)),
                                    (None, None) => format!("ok {}", ms(start)),
                                    (None, Some(s)) => format!("err {} {} {s:?}", ms(start), status_kind(s)),
                                }
                            }
                        }
                    }
                }
            }
            _ => format!("err 0 other unknown command {line:?}"),
        };
        let mut o = out.lock();
        writeln!(o, "{answer}")?;
        o.flush()?;
    }
    Ok(())
}
