//! gpubench: device (GPU) memory moved by the engine, beside the driver's own copy bandwidth
//! measured in the same run, on one GPU (`benches/gpu/check.sh` runs it).
//!
//! ```text
//! gpubench run [--device 0] [--sizes 1M,16M] [--seconds 3]
//! ```
//!
//! For each size it measures, each figure a mean over `--seconds`:
//! * the driver's copies (`DtoH`, `HtoD` into and out of pinned host memory, `DtoD`): the
//!   limits the engine's figures are set beside;
//! * reads and writes between two processes (a `gpubench target` child it spawns) over tcp
//!   loopback with host memory on both ends (the baseline), over tcp with device memory on
//!   both ends, and over CUDA IPC (shm, the same GPU) with device memory on both ends.
//!
//! Every scenario is first checked byte for byte (a read of the target's pattern, then a
//! write read back), the device buffers copied to the host with the driver: a wrong byte
//! fails the run. The device driver is the one `CRESCENT_CUDA_DRIVER` names, else
//! `libcuda.so.1`.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use crescent_benches::pattern;
use crescent_engine::{parse_size, EngineConfig, Opcode, TransferEngine, TransferRequest, TransportKind};
use crescent_transports::device::{Devices, Driver};

#[derive(Parser)]
#[command(name = "gpubench", about = "Device memory through the engine, beside the driver's own copies")]
struct Cli {
    #[command(subcommand)]
    role: Role,
}

#[derive(Subcommand)]
enum Role {
    /// Measure everything and print one line per figure (and a JSON line each).
    Run {
        /// The GPU to use.
        #[arg(long, default_value_t = 0)]
        device: u32,
        /// Request sizes, comma-separated.
        #[arg(long, default_value = "1M,16M")]
        sizes: String,
        /// Seconds per figure.
        #[arg(long, default_value_t = 3.0)]
        seconds: f64,
    },
    /// Serve a buffer (device or host memory) until stdin closes (spawned by `run`).
    Target {
        /// `tcp`, or `auto` (shm on this host: CUDA IPC for device memory).
        #[arg(long)]
        protocol: String,
        /// `cuda:N`, or `cpu` for host memory.
        #[arg(long)]
        location: String,
        /// Buffer size in bytes.
        #[arg(long)]
        len: u64,
    },
}

fn main() -> Result<()> {
    match Cli::parse().role {
        Role::Run { device, sizes, seconds } => {
            let sizes =
                sizes.split(',').map(|s| parse_size(s).map_err(anyhow::Error::msg)).collect::<Result<Vec<_>>>()?;
            run(device, &sizes, Duration::from_secs_f64(seconds))
        }
        Role::Target { protocol, location, len } => target(&protocol, &location, len),
    }
}

fn protocol(name: &str) -> Result<Option<TransportKind>> {
    Ok(match name {
        "auto" => None,
        other => Some(other.parse()?),
    })
}

fn engine(protocol: Option<TransportKind>) -> Result<Arc<TransferEngine>> {
    let config = EngineConfig {
        local_hostname: Some("127.0.0.1".into()),
        protocol,
        transfer_timeout: Duration::from_secs(60),
        ..EngineConfig::default()
    };
    Ok(TransferEngine::new(config)?)
}

/// A buffer of `len` bytes at `location` (`cuda:N` or `cpu`), registered with `engine`.
struct Buffer {
    addr: u64,
    device: Option<(Arc<Driver>, u32)>,
    _host: Option<crescent_engine::RegisteredMemory>,
}

impl Buffer {
    fn new(engine: &TransferEngine, location: &str, len: u64) -> Result<Buffer> {
        if location == "cpu" {
            let mem = engine.alloc_registered(len, "cpu:0")?;
            return Ok(Buffer { addr: mem.addr(), device: None, _host: Some(mem) });
        }
        let device: u32 = location.strip_prefix("cuda:").context("location: cuda:N or cpu")?.parse()?;
        let driver = Devices::new(None).driver()?;
        let addr = driver.api().alloc(device, len)?;
        engine.register(addr, len, location)?;
        Ok(Buffer { addr, device: Some((driver, device)), _host: None })
    }

    /// Writes the pattern of `seed` into `[off, +len)` (through the driver for device memory).
    fn fill(&self, off: u64, len: u64, seed: u64) -> Result<()> {
        let mut host = vec![0u8; len as usize];
        pattern::fill(&mut host, seed, 0);
        self.put(off, &host)
    }

    fn put(&self, off: u64, bytes: &[u8]) -> Result<()> {
        match &self.device {
            Some((driver, device)) => {
                driver.copy(*device, self.addr + off, bytes.as_ptr() as u64, bytes.len() as u64)?
            }
            // SAFETY: registered host memory of this process that no transfer uses now.
            None => unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), (self.addr + off) as *mut u8, bytes.len()) },
        }
        Ok(())
    }

    /// `[off, +len)` copied to the host.
    fn get(&self, off: u64, len: u64) -> Result<Vec<u8>> {
        let mut host = vec![0u8; len as usize];
        match &self.device {
            Some((driver, device)) => driver.copy(*device, host.as_mut_ptr() as u64, self.addr + off, len)?,
            // SAFETY: as in `put`.
            None => unsafe {
                std::ptr::copy_nonoverlapping((self.addr + off) as *const u8, host.as_mut_ptr(), len as usize)
            },
        }
        Ok(host)
    }
}

fn target(protocol_name: &str, location: &str, len: u64) -> Result<()> {
    let engine = engine(protocol(protocol_name)?)?;
    let buffer = Buffer::new(&engine, location, len)?;
    buffer.fill(0, len, 1)?;
    println!("segment: {}", engine.segment_name());
    println!("addr: {:#x}", buffer.addr);
    std::io::stdout().flush()?;
    // Serve until the parent closes stdin.
    for line in std::io::stdin().lock().lines() {
        line?;
    }
    engine.unregister(buffer.addr)?;
    if let Some((driver, device)) = &buffer.device {
        driver.api().free(*device, buffer.addr)?;
    }
    Ok(())
}

/// A target process, killed when dropped.
struct Target {
    child: Child,
    segment: String,
    addr: u64,
}

impl Target {
    fn spawn(protocol: &str, location: &str, len: u64) -> Result<Target> {
        let mut child = Command::new(std::env::current_exe()?)
            .args(["target", "--protocol", protocol, "--location", location, "--len", &len.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let mut lines = BufReader::new(child.stdout.take().context("stdout")?).lines();
        let (mut segment, mut addr) = (None, None);
        while segment.is_none() || addr.is_none() {
            let line = lines.next().context("the target exited before it was ready")??;
            if let Some(v) = line.strip_prefix("segment: ") {
                segment = Some(v.trim().to_string());
            } else if let Some(v) = line.strip_prefix("addr: ") {
                addr = Some(u64::from_str_radix(v.trim().trim_start_matches("0x"), 16)?);
            }
        }
        Ok(Target { child, segment: segment.unwrap_or_default(), addr: addr.unwrap_or_default() })
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        // Closing stdin ends it; one that does not end within 10 s is killed.
        drop(self.child.stdin.take());
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One figure, printed as a line and a JSON line.
fn report(what: &str, op: &str, size: u64, bytes: u64, elapsed: Duration, limit: Option<(&str, f64)>) -> f64 {
    let gbps = bytes as f64 / elapsed.as_secs_f64() / 1e9;
    let beside = match limit {
        Some((name, l)) => format!("  ({:.2} of {name} {l:.2} GB/s)", gbps / l),
        None => String::new(),
    };
    println!("{what:<24} {op:<6} {:>9} {gbps:>8.2} GB/s{beside}", size_label(size));
    let json = serde_json::json!({
        "scenario": what, "op": op, "size": size, "gbps": gbps,
        "limit": limit.map(|(n, _)| n), "limit_gbps": limit.map(|(_, l)| l),
    });
    println!("{json}");
    gbps
}

fn size_label(size: u64) -> String {
    match size {
        s if s >= 1 << 20 && s % (1 << 20) == 0 => format!("{} MiB", s >> 20),
        s if s >= 1 << 10 && s % (1 << 10) == 0 => format!("{} KiB", s >> 10),
        s => format!("{s} B"),
    }
}

/// Runs `f` (which moves `per_call` bytes) back to back for `time`; the bytes moved and the
/// time taken.
fn timed(time: Duration, per_call: u64, mut f: impl FnMut() -> Result<()>) -> Result<(u64, Duration)> {
    f()?; // warm-up
    let start = Instant::now();
    let mut bytes = 0;
    while start.elapsed() < time {
        f()?;
        bytes += per_call;
    }
    Ok((bytes, start.elapsed()))
}

/// Requests in flight per batch for `size`: about 64 MiB, 1 to 16 requests.
fn depth(size: u64) -> u64 {
    ((64 << 20) / size.max(1)).clamp(1, 16)
}

struct Limits {
    dtoh: f64,
    htod: f64,
    dtod: f64,
}

fn driver_copies(driver: &Arc<Driver>, device: u32, size: u64, time: Duration) -> Result<Limits> {
    let api = driver.api();
    let (a, b) = (api.alloc(device, size)?, api.alloc(device, size)?);
    let pinned = api.alloc_pinned(size)?;
    let dtoh = timed(time, size, || Ok(driver.copy(device, pinned, a, size)?))?;
    let htod = timed(time, size, || Ok(driver.copy(device, a, pinned, size)?))?;
    let dtod = timed(time, size, || Ok(driver.copy(device, b, a, size)?))?;
    api.free(device, a)?;
    api.free(device, b)?;
    api.free_pinned(pinned)?;
    Ok(Limits {
        dtoh: report("driver copy", "DtoH", size, dtoh.0, dtoh.1, None),
        htod: report("driver copy", "HtoD", size, htod.0, htod.1, None),
        dtod: report("driver copy", "DtoD", size, dtod.0, dtod.1, None),
    })
}

/// Checks one scenario byte for byte, then measures its reads and writes of `size`.
fn scenario(
    name: &str,
    protocol: &str,
    location: &str,
    size: u64,
    time: Duration,
    limits: Option<(&str, f64, f64)>,
) -> Result<(f64, f64)> {
    let n = depth(size).max(2);
    let target = Target::spawn(protocol, location, n * size)?;
    let engine = engine(self::protocol(protocol)?)?;
    let local = Buffer::new(&engine, location, n * size)?;
    let seg = engine.open_segment(&target.segment)?;
    let request = |opcode, i: u64| TransferRequest {
        opcode,
        source: local.addr + i * size,
        target: seg,
        target_offset: target.addr + i * size,
        length: size,
    };
    // Verified first: the target's pattern read, then a fresh pattern written and read back.
    engine.transfer_sync(&[request(Opcode::Read, 0)])?;
    if let Some(at) = pattern::first_mismatch(&local.get(0, size)?, 1, 0) {
        bail!("{name}: a read of {size} bytes differs at byte {at}");
    }
    local.fill(0, size, 2)?;
    engine.transfer_sync(&[request(Opcode::Write, 0)])?;
    engine.transfer_sync(&[TransferRequest { source: local.addr + size, ..request(Opcode::Read, 0) }])?;
    if let Some(at) = pattern::first_mismatch(&local.get(size, size)?, 2, 0) {
        bail!("{name}: a write of {size} bytes read back differs at byte {at}");
    }
    let batch = |opcode| (0..depth(size)).map(|i| request(opcode, i)).collect::<Vec<_>>();
    let (reads, writes) = (batch(Opcode::Read), batch(Opcode::Write));
    let per_batch = depth(size) * size;
    let read = timed(time, per_batch, || Ok(engine.transfer_sync(&reads)?))?;
    let write = timed(time, per_batch, || Ok(engine.transfer_sync(&writes)?))?;
    let r = report(name, "read", size, read.0, read.1, limits.map(|(n, r, _)| (n, r)));
    let w = report(name, "write", size, write.0, write.1, limits.map(|(n, _, w)| (n, w)));
    engine.unregister(local.addr)?;
    if let Some((driver, device)) = &local.device {
        driver.api().free(*device, local.addr)?;
    }
    Ok((r, w))
}

fn run(device: u32, sizes: &[u64], time: Duration) -> Result<()> {
    let driver = Devices::new(None).driver()?;
    let cuda = format!("cuda:{device}");
    println!(
        "# gpubench: device {cuda}, {} device(s) seen, {:.1} s per figure",
        driver.api().device_count()?,
        time.as_secs_f64()
    );
    for &size in sizes {
        let limits = driver_copies(&driver, device, size, time)?;
        let (host_read, host_write) = scenario("tcp host<->host", "tcp", "cpu", size, time, None)?;
        let (tcp_read, tcp_write) = scenario(
            "tcp device<->device",
            "tcp",
            &cuda,
            size,
            time,
            Some(("tcp host<->host", host_read, host_write)),
        )?;
        let (ipc_read, ipc_write) = scenario(
            "ipc device<->device",
            "auto",
            &cuda,
            size,
            time,
            Some(("driver DtoD", limits.dtod, limits.dtod)),
        )?;
        println!(
            "# {}: tcp device/host read {:.2} write {:.2} (target >= 0.85); ipc/DtoD read {:.2} write {:.2} \
             (target >= 0.90); driver DtoH {:.2} HtoD {:.2} GB/s",
            size_label(size),
            tcp_read / host_read,
            tcp_write / host_write,
            ipc_read / limits.dtod,
            ipc_write / limits.dtod,
            limits.dtoh,
            limits.htod,
        );
    }
    Ok(())
}
