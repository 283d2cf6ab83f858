//! `storebench dummy`: a dummy client's `batch_get_into` beside its standalone client's own,
//! in one run.
//!
//! In this process: a master on loopback, a holder client whose segment holds the values, and
//! the standalone client (a [`StoreClient`] with a small segment, so every get reads the
//! holder's replica through the engine) serving a [`DummyClient`] over its unix socket. Per
//! pair, the same batches of gets run once through the dummy client into its pool (shared by
//! memfd, so the engine reads into the dummy client's pages) and once straight on the
//! standalone client into a buffer registered there; which goes first alternates. The
//! target: the dummy client moves at least 90 % of what the standalone client moves.
//!
//! With `--heap` (the default), a second row per size reads into the dummy client's heap
//! memory (registered with `register_buffer`, not from its pool): that goes through the dummy
//! client's local buffer, one memcpy per byte in the worker; it has no target, it shows the
//! cost of the copy.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use crescent_engine::parse_size;
use crescent_store::client::dummy::DEFAULT_REPLY_POLL;
use crescent_store::standalone::{Access, StandaloneServer};
use crescent_store::{pattern, ClientConfig, DummyClient, DummyConfig, MasterConfig, StoreApi, StoreClient};

use crate::report::{self, Load, Pairs, Target};

#[derive(Args, Debug, Clone)]
pub struct DummyArgs {
    /// Value sizes; one row each.
    #[arg(long, value_delimiter = ',', default_value = "64K,1M,4M", value_parser = parse_size)]
    pub sizes: Vec<u64>,
    /// Keys per batch_get_into call.
    #[arg(long, default_value_t = 16)]
    pub batch: usize,
    /// Bytes each side moves per pair (the call count follows from it).
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    pub bytes_per_side: u64,
    #[arg(long, default_value_t = 8)]
    pub pairs: usize,
    /// Transport between the standalone client and the holder: shm, tcp (default: chosen, shm
    /// on one host).
    #[arg(long)]
    pub protocol: Option<String>,
    /// Also a row per size into heap memory (bounced through the local buffer).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub heap: bool,
    /// The dummy client's polling for a reply, in µs (`DummyConfig::reply_poll`; 0: never).
    #[arg(long)]
    pub client_poll_us: Option<u64>,
    /// The standalone client's polling for the next request, in µs (`Access::poll`; 0: never).
    #[arg(long)]
    pub server_poll_us: Option<u64>,
}

const TARGET: Target = Target::AtLeast(0.9);

/// Bytes per second of `calls` batch gets.
fn measure(calls: usize, bytes: u64, mut get: impl FnMut() -> Result<()>) -> Result<f64> {
    let t = Instant::now();
    for _ in 0..calls {
        get()?;
    }
    Ok(bytes as f64 * calls as f64 / t.elapsed().as_secs_f64())
}

fn check(rs: Vec<crescent_store::Result<u64>>, size: u64) -> Result<()> {
    for r in rs {
        if r? != size {
            bail!("a get returned a different size");
        }
    }
    Ok(())
}

pub fn run(args: DummyArgs) -> Result<()> {
    let load = Load::start();
    let master = crescent_store::master::server::start(MasterConfig {
        rpc_address: "127.0.0.1:0".into(),
        admin_address: "127.0.0.1:0".into(),
        lease_ttl: Duration::from_secs(60),
        ..MasterConfig::default()
    })?;
    let max = *args.sizes.iter().max().context("no sizes")?;
    let batch_bytes = max * args.batch as u64;
    let protocol = args.protocol.as_deref().map(crescent_store::client::config::parse_protocol).transpose()?;
    let base = ClientConfig {
        master_server_address: master.client_address(),
        local_hostname: Some("127.0.0.1".into()),
        protocol,
        ..ClientConfig::default()
    };
    let holder = StoreClient::connect(ClientConfig {
        global_segment_size: (batch_bytes * args.sizes.len() as u64 + (64 << 20)).next_multiple_of(2 << 20),
        ..base.clone()
    })?;
    let standalone =
        StoreClient::connect(ClientConfig { global_segment_size: 4 << 20, local_buffer_size: 16 << 20, ..base })?;
    let socket = format!("@crescent-dummybench-{}", std::process::id());
    let access = Access::default();
    let server_poll = args.server_poll_us.map_or(access.poll, Duration::from_micros);
    let server = StandaloneServer::start(
        standalone.clone(),
        &crescent_store::client::dummy::frame::Address::parse(&socket)?,
        Access { poll: server_poll, ..access },
    )?;
    let client_poll = args.client_poll_us.map_or(DEFAULT_REPLY_POLL, Duration::from_micros);
    let dummy = DummyClient::connect(DummyConfig {
        server_address: socket,
        mem_pool_size: batch_bytes.next_multiple_of(2 << 20),
        local_buffer_size: if args.heap { batch_bytes.next_multiple_of(2 << 20) } else { 0 },
        reply_poll: client_poll,
        ..DummyConfig::default()
    })?;
    // The standalone client's own destination: registered once, as a caller would.
    let own = standalone.engine().alloc_registered(batch_bytes.next_multiple_of(2 << 20), "cpu:0")?;
    let pool = dummy.alloc_from_mem_pool(batch_bytes)?;
    let heap = vec![0u8; batch_bytes as usize];
    if args.heap {
        dummy.register_buffer(heap.as_ptr() as u64, batch_bytes)?;
    }
    println!(
        "storebench dummy: batch_get_into of {} keys per call, standalone client <- holder via {}, {} per side per \
         pair, {} pairs, polling for a reply up to {} µs and for the next request {} µs, {}",
        args.batch,
        args.protocol.as_deref().unwrap_or("the engine's choice"),
        report::fmt_bytes(args.bytes_per_side),
        args.pairs,
        client_poll.as_micros(),
        server_poll.as_micros(),
        report::utc_now()
    );
    println!();
    println!(
        "| value, dummy's memory | dummy client GB/s | standalone client GB/s | ratio (median) | range | target | | \
         µs per call, dummy / standalone | replies polled | requests polled |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut all_met = true;
    for (row, &size) in args.sizes.iter().enumerate() {
        let keys: Vec<String> = (0..args.batch).map(|i| format!("dummybench/{row}/{i}")).collect();
        let mut value = vec![0u8; size as usize];
        for (i, k) in keys.iter().enumerate() {
            pattern::fill(&mut value, i as u64 + 1, 0);
            holder.put(k, &value)?;
        }
        let sizes = vec![size; args.batch];
        let dummy_addrs: Vec<u64> = (0..args.batch as u64).map(|i| pool + i * size).collect();
        let own_addrs: Vec<u64> = (0..args.batch as u64).map(|i| own.addr() + i * size).collect();
        let bytes = size * args.batch as u64;
        let calls = (args.bytes_per_side / bytes).max(1) as usize;
        let direct = || check(standalone.batch_get_into(&keys, &own_addrs, &sizes)?, size);
        // Warm both paths (first contact with the holder, page faults), and check the bytes.
        check(dummy.batch_get_into(&keys, &dummy_addrs, &sizes)?, size)?;
        direct()?;
        for (i, &a) in dummy_addrs.iter().enumerate() {
            // SAFETY: `size` bytes of the dummy client's pool, written by the gets above.
            let got = unsafe { std::slice::from_raw_parts(a as *const u8, size as usize) };
            if pattern::first_mismatch(got, i as u64 + 1, 0).is_some() {
                bail!("the dummy client read wrong bytes for {}", keys[i]);
            }
        }
        let mut row = |label: String, dst: &[u64], target: Option<Target>| -> Result<()> {
            let via_dummy = || check(dummy.batch_get_into(&keys, dst, &sizes)?, size);
            via_dummy()?;
            let (replies, requests) = (dummy.replies(), server.requests());
            let mut pairs = Pairs::default();
            for p in 0..args.pairs {
                let (d, s) = if p % 2 == 0 {
                    let d = measure(calls, bytes, via_dummy)?;
                    (d, measure(calls, bytes, direct)?)
                } else {
                    let s = measure(calls, bytes, direct)?;
                    (measure(calls, bytes, via_dummy)?, s)
                };
                pairs.push(d, s);
            }
            let s = pairs.summary();
            let cells = match target {
                Some(t) => {
                    all_met &= t.met(s.ratio);
                    s.ratio_cells(t)
                }
                None => format!("{:.2} | {:.2}-{:.2} | none (one copy) | |", s.ratio, s.lo, s.hi),
            };
            let (replies_now, requests_now) = (dummy.replies(), server.requests());
            let share =
                |polled: u64, waited: u64| format!("{:.0} %", 100.0 * polled as f64 / (polled + waited).max(1) as f64);
            println!(
                "| {label} | {:.2} | {:.2} | {cells} {:.0} / {:.0} | {} | {} |",
                s.ours / 1e9,
                s.limit / 1e9,
                bytes as f64 / s.ours * 1e6,
                bytes as f64 / s.limit * 1e6,
                share(replies_now.polled - replies.polled, replies_now.waited - replies.waited),
                share(requests_now.polled - requests.polled, requests_now.waited - requests.waited),
            );
            Ok(())
        };
        row(format!("{} pool", report::fmt_bytes(size)), &dummy_addrs, Some(TARGET))?;
        if args.heap {
            let heap_addrs: Vec<u64> = (0..args.batch as u64).map(|i| heap.as_ptr() as u64 + i * size).collect();
            row(format!("{} heap", report::fmt_bytes(size)), &heap_addrs, None)?;
            for (i, &a) in heap_addrs.iter().enumerate() {
                // SAFETY: `size` bytes of `heap`, written by the gets above (copied back from
                // the local buffer).
                let got = unsafe { std::slice::from_raw_parts(a as *const u8, size as usize) };
                if pattern::first_mismatch(got, i as u64 + 1, 0).is_some() {
                    bail!("the dummy client read wrong bytes into heap memory for {}", keys[i]);
                }
            }
        }
        for k in &keys {
            let _ = holder.remove_with(k, true);
        }
    }
    println!();
    load.finish();
    dummy.close()?;
    if !all_met {
        println!("storebench dummy: a row is below its target");
    }
    Ok(())
}
