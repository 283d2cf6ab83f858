//! device-peer: the target process of the device-memory tests (`tests/tests/device_memory.rs`).
//!
//! ```text
//! device-peer [--protocol tcp] [--location cuda:0|*] [--len BYTES] [--vmm]
//! device-peer --touch
//! ```
//!
//! Starts an engine on loopback, allocates `--len` bytes (default 4 MiB) of device memory on
//! device 0 through the CUDA driver that `CRESCENT_CUDA_DRIVER` names, fills it with the
//! pattern of seed 1 (with `--vmm`: through the virtual memory management API, as
//! `cuMemCreate` + `cuMemMap`, rounded up to the driver's granularity), registers it at `--location` (default `cuda:0`), registers as much host
//! memory (heap, `cpu:0`) with the pattern of seed 3, and prints `segment: NAME`,
//! `device: ADDR`, `host: ADDR`, then `ready`. Then it answers commands from stdin, one line
//! each:
//! * `verify OFF LEN SEED BASE`: copies `[device+OFF, +LEN)` to the host with the driver and
//!   compares it with the pattern of `SEED` at offset `BASE`: `ok`, or `mismatch AT`;
//! * `unregister`: unregisters the device memory (peers holding it are revoked first): `ok`,
//!   or `err MESSAGE`;
//! * `quit`.
//!
//! `--touch` allocates device memory and reads a byte of it with the CPU: with the fake driver
//! that kills the process (SIGSEGV), which is what the tests check.

use std::io::{BufRead, Write};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use crescent_engine::{EngineConfig, TransferEngine, TransportKind};
use crescent_store::pattern;
use crescent_transports::device::{Devices, Driver};

fn main() -> Result<()> {
    let mut protocol = None;
    let mut location = "cuda:0".to_string();
    let mut len: u64 = 4 << 20;
    let mut touch = false;
    let mut vmm = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--protocol" => protocol = Some(args.next().context("--protocol takes a value")?.parse::<TransportKind>()?),
            "--location" => location = args.next().context("--location takes a value")?,
            "--len" => len = args.next().context("--len takes a value")?.parse()?,
            "--touch" => touch = true,
            "--vmm" => vmm = true,
            other => bail!("unknown argument {other:?}"),
        }
    }
    let driver = Devices::new(None).driver()?;
    let device = if vmm { driver.api().vmm_alloc(0, len)? } else { driver.api().alloc(0, len)? };
    if touch {
        // SAFETY: none: this reads device memory with the CPU on purpose, to show that the
        // fake driver's device mappings cannot be read (the process dies here).
        let byte = unsafe { std::ptr::read_volatile(device as *const u8) };
        println!("read {byte}");
        return Ok(());
    }
    let mut staging = vec![0u8; len as usize];
    pattern::fill(&mut staging, 1, 0);
    driver.copy(0, device, staging.as_ptr() as u64, len)?;
    let mut host = vec![0u8; len as usize];
    pattern::fill(&mut host, 3, 0);

    let config = EngineConfig {
        local_hostname: Some("127.0.0.1".into()),
        protocol,
        transfer_timeout: Duration::from_secs(30),
        ..EngineConfig::default()
    };
    let engine = TransferEngine::new(config)?;
    engine.register(device, len, &location)?;
    engine.register(host.as_mut_ptr() as u64, len, "cpu:0")?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "segment: {}", engine.segment_name())?;
    writeln!(out, "device: {device:#x}")?;
    writeln!(out, "host: {:#x}", host.as_ptr() as u64)?;
    writeln!(out, "ready")?;
    out.flush()?;
    let mut registered = true;
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let words: Vec<&str> = line.split_whitespace().collect();
        let answer = match words.as_slice() {
            ["verify", off, len, seed, base] => {
                verify(&driver, device, off.parse()?, len.parse()?, seed.parse()?, base.parse()?)?
            }
            ["unregister"] => match engine.unregister(device) {
                Ok(()) => {
                    registered = false;
                    "ok".to_string()
                }
                Err(e) => format!("err {e}"),
            },
            ["quit"] => break,
            _ => format!("unknown command {line:?}"),
        };
        writeln!(out, "{answer}")?;
        out.flush()?;
    }
    if registered {
        engine.unregister(device)?;
    }
    engine.unregister(host.as_ptr() as u64)?;
    if vmm {
        driver.api().vmm_free(0, device)?;
    } else {
        driver.api().free(0, device)?;
    }
    Ok(())
}

/// Reads `[device+off, +len)` back with the driver and compares it with the pattern.
fn verify(driver: &Arc<Driver>, device: u64, off: u64, len: u64, seed: u64, base: u64) -> Result<String> {
    let mut back = vec![0u8; len as usize];
    driver.copy(0, back.as_mut_ptr() as u64, device + off, len)?;
    Ok(match pattern::first_mismatch(&back, seed, base) {
        None => "ok".to_string(),
        Some(at) => format!("mismatch {at}"),
    })
}
