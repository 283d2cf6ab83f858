//! The stdin-driven harnesses the multi-process tests drive (`crescent client`, `crescent
//! dummy`): a long-lived client that runs one command per line and answers one line each.
//! Hidden from `--help`: they are test support, not an operator's tools.

use std::io::{BufRead, Write};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Args;
use crescent_engine::parse_size;
use crescent_store::client::{Extent, Piece};
use crescent_store::proto::Tier;
use crescent_store::{pattern, ClientConfig, DummyClient, DummyConfig, StoreApi, StoreClient, StoreError};

#[derive(Args)]
pub struct DummyArgs {
    /// The standalone client: host:port (its --port), @name or a socket path.
    #[arg(long)]
    server: String,
    #[arg(long, default_value = "64M", value_parser = parse_size)]
    mem_pool_size: u64,
    #[arg(long, default_value = "16M", value_parser = parse_size)]
    local_buffer_size: u64,
    /// Deadline of each call, in milliseconds.
    #[arg(long, default_value_t = 60_000)]
    call_timeout_ms: u64,
}

#[derive(Args)]
pub struct ClientArgs {
    /// The master's address (overrides master_server_address of MOONCAKE_CONFIG_PATH).
    #[arg(long)]
    master: Option<String>,
    /// Address peers use to reach this client.
    #[arg(long)]
    local_hostname: Option<String>,
    /// Metadata service (overrides metadata_server of MOONCAKE_CONFIG_PATH): P2PHANDSHAKE,
    /// etcd://host:port, redis://[user:pass@]host:port[/db] or http://host:port/metadata.
    #[arg(long, visible_alias = "metadata_server")]
    metadata_server: Option<String>,
    #[arg(long, value_parser = parse_size)]
    segment_size: Option<u64>,
    #[arg(long, value_parser = parse_size)]
    buffer_size: Option<u64>,
    /// tcp, shm, rdma; default: chosen per peer.
    #[arg(long)]
    protocol: Option<String>,
    #[arg(long)]
    replicas: Option<u32>,
    /// Disk tier: persist values under DIR/<cluster id>/ (overrides MOONCAKE_STORAGE_ROOT_DIR
    /// and storage_root_dir of MOONCAKE_CONFIG_PATH).
    #[arg(long, value_name = "DIR")]
    storage_root: Option<std::path::PathBuf>,
    /// Bytes the disk tier may use (default: 90 % of the free space at start).
    #[arg(long, value_parser = parse_size)]
    storage_capacity: Option<u64>,
    /// Cluster id naming the disk tier's directory (default: MC_METADATA_CLUSTER_ID, else "default").
    #[arg(long)]
    cluster_id: Option<String>,
    /// Serve the client's Prometheus metrics (hot cache counters) at http://ADDR/metrics
    /// (overrides CRESCENT_CLIENT_METRICS_ADDRESS and client_metrics_address); port 0 picks one.
    #[arg(long, value_name = "HOST:PORT")]
    metrics_address: Option<String>,
}

pub fn client(args: ClientArgs) -> Result<()> {
    let mut config = ClientConfig::from_env()?;
    if let Some(m) = args.master {
        config.master_server_address = m;
    }
    if args.local_hostname.is_some() {
        config.local_hostname = args.local_hostname;
    }
    if let Some(m) = args.metadata_server {
        config.metadata_server = m;
    }
    if let Some(s) = args.segment_size {
        config.global_segment_size = s;
    }
    if let Some(s) = args.buffer_size {
        config.local_buffer_size = s;
    }
    if let Some(p) = args.protocol {
        config.protocol = Some(crescent_store::client::config::parse_protocol(&p)?);
    }
    if let Some(r) = args.replicas {
        config.replica_num = r;
    }
    if args.storage_root.is_some() {
        config.storage_root_dir = args.storage_root;
    }
    if args.storage_capacity.is_some() {
        config.storage_capacity = args.storage_capacity;
    }
    if args.cluster_id.is_some() {
        config.cluster_id = args.cluster_id;
    }
    if args.metrics_address.is_some() {
        config.metrics_address = args.metrics_address;
    }
    let client = StoreClient::connect(config).context("starting the client")?;
    serve_stdin(client.segment_name(), |w| match w.first().copied() {
        Some("flush") => {
            if !client.flush_offload(std::time::Duration::from_secs(120)) {
                bail!("offloads still queued after 120 s");
            }
            Ok(String::new())
        }
        Some("disk_stats") => Ok(client
            .disk_stats()
            .map_or_else(|| "none".to_string(), |s| serde_json::to_string(&s).unwrap_or_default())),
        _ => run_command(&*client, w),
    })?;
    client.close()?;
    Ok(())
}

/// Answers the commands read from stdin, one line each ("ok ..." or "err CODE message"),
/// after a first line "ready NAME".
fn serve_stdin(name: &str, mut run: impl FnMut(&[&str]) -> Result<String>) -> Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready {name}")?;
    out.flush()?;
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.first() == Some(&"quit") {
            break;
        }
        let answer = match run(&words) {
            Ok(s) => format!("ok{}{s}", if s.is_empty() { "" } else { " " }),
            Err(e) => match e.downcast_ref::<StoreError>() {
                Some(se) => format!(
                    "err {} {}{se}",
                    se.code().as_str_name(),
                    if se.is_retryable() { "retryable: " } else { "" }
                ),
                None => format!("err USAGE {e}"),
            },
        };
        writeln!(out, "{answer}")?;
        out.flush()?;
    }
    Ok(())
}

pub fn dummy(args: DummyArgs) -> Result<()> {
    let client = Arc::new(
        DummyClient::connect(DummyConfig {
            server_address: args.server,
            mem_pool_size: args.mem_pool_size,
            local_buffer_size: args.local_buffer_size,
            call_timeout: std::time::Duration::from_millis(args.call_timeout_ms),
            ..DummyConfig::default()
        })
        .context("attaching to the standalone client")?,
    );
    let name = format!("{} {}", client.id(), client.server());
    serve_stdin(&name, |w| run_dummy_command(&client, w))?;
    client.close()?;
    Ok(())
}

/// Memory for a zero-copy command: from the pool, or (`heap`) a registered heap buffer.
struct Buf {
    addr: u64,
    len: u64,
    heap: Option<Vec<u8>>,
}

/// Frees a command's buffers, then gives its answer.
fn freed<T>(
    c: &DummyClient,
    bufs: impl IntoIterator<Item = Buf>,
    answer: std::result::Result<T, StoreError>,
) -> Result<T> {
    for b in bufs {
        b.free(c)?;
    }
    Ok(answer?)
}

impl Buf {
    fn new(c: &DummyClient, len: u64, heap: bool) -> Result<Buf> {
        if heap {
            let v = vec![0u8; len as usize];
            let addr = v.as_ptr() as u64;
            c.register_buffer(addr, len)?;
            return Ok(Buf { addr, len, heap: Some(v) });
        }
        Ok(Buf { addr: c.alloc_from_mem_pool(len)?, len, heap: None })
    }

    fn bytes(&mut self) -> &mut [u8] {
        match &mut self.heap {
            Some(v) => v,
            // SAFETY: `len` bytes of the dummy client's pool, this command's alone.
            None => unsafe { std::slice::from_raw_parts_mut(self.addr as *mut u8, self.len as usize) },
        }
    }

    fn free(self, c: &DummyClient) -> Result<()> {
        match self.heap {
            Some(_) => Ok(c.unregister_buffer(self.addr)?),
            None => Ok(c.free_to_mem_pool(self.addr)?),
        }
    }
}

fn key_sizes(words: &[&str]) -> Result<(Vec<String>, Vec<u64>)> {
    let mut keys = Vec::new();
    let mut sizes = Vec::new();
    for kv in words {
        let (k, s) = kv.rsplit_once(':').context("takes KEY:SIZE")?;
        keys.push(k.to_string());
        sizes.push(parse_size(s).map_err(anyhow::Error::msg)?);
    }
    Ok((keys, sizes))
}

fn run_dummy_command(c: &Arc<DummyClient>, w: &[&str]) -> Result<String> {
    let (w, heap) = match w.split_last() {
        Some((&"heap", rest)) => (rest, true),
        _ => (w, false),
    };
    let key = || w.get(1).copied().context("missing key");
    match w.first().copied() {
        Some("put_from") => {
            let (size, seed) = (num(w.get(2), "size")?, num(w.get(3), "seed")?);
            let mut b = Buf::new(c, size, heap)?;
            pattern::fill(b.bytes(), seed, 0);
            let r = c.put_from(key()?, b.addr, size);
            freed(c, [b], r.map(|()| String::new()))
        }
        Some("get_into") => {
            let (size, seed) = (num(w.get(2), "size")?, num(w.get(3), "seed")?);
            let mut b = Buf::new(c, size, heap)?;
            let r = c.get_into(key()?, b.addr, size);
            let answer = r.map(|n| match pattern::first_mismatch(&b.bytes()[..n as usize], seed, 0) {
                None => format!("{n} verified"),
                Some(at) => format!("MISMATCH at {at}"),
            });
            freed(c, [b], answer)
        }
        Some("get_sg") => {
            let seed = num(w.get(2), "seed")?;
            let lens = w
                .get(3)
                .context("missing LEN,LEN...")?
                .split(',')
                .map(|s| num(Some(&s), "len"))
                .collect::<Result<Vec<_>>>()?;
            let mut bufs = lens.iter().map(|&n| Buf::new(c, n, heap)).collect::<Result<Vec<_>>>()?;
            let pieces: Vec<Piece> = bufs.iter().map(|b| Piece::new(b.addr, b.len)).collect();
            let r = c.get_into_sg(key()?, &pieces);
            let answer = r.map(|n| {
                let mut at = 0u64;
                for b in bufs.iter_mut() {
                    let take = b.len.min(n.saturating_sub(at));
                    if let Some(m) = pattern::first_mismatch(&b.bytes()[..take as usize], seed, at) {
                        return format!("MISMATCH at {}", at + m);
                    }
                    at += take;
                }
                format!("{n} verified")
            });
            freed(c, bufs, answer)
        }
        Some("get_ranges") => {
            let seed = num(w.get(2), "seed")?;
            let mut ranges = Vec::new();
            for r in &w[3..] {
                let (o, n) = r.split_once(':').context("ranges are OFF:LEN")?;
                ranges.push((num(Some(&o), "offset")?, num(Some(&n), "len")?));
            }
            let mut bufs = ranges.iter().map(|&(_, n)| Buf::new(c, n, heap)).collect::<Result<Vec<_>>>()?;
            let extents: Vec<Extent> =
                ranges.iter().zip(&bufs).map(|(&(offset, len), b)| Extent { offset, addr: b.addr, len }).collect();
            let r = c.get_into_ranges(key()?, &extents);
            let answer = r.map(|n| {
                for (b, &(offset, _)) in bufs.iter_mut().zip(&ranges) {
                    if let Some(m) = pattern::first_mismatch(b.bytes(), seed, offset) {
                        return format!("MISMATCH at {}", offset + m);
                    }
                }
                format!("{n} verified")
            });
            freed(c, bufs, answer)
        }
        Some("batch_put_from") => {
            let seed = num(w.get(1), "seed")?;
            let (keys, sizes) = key_sizes(&w[2..])?;
            let mut bufs = sizes.iter().map(|&n| Buf::new(c, n, heap)).collect::<Result<Vec<_>>>()?;
            for b in bufs.iter_mut() {
                pattern::fill(b.bytes(), seed, 0);
            }
            let addrs: Vec<u64> = bufs.iter().map(|b| b.addr).collect();
            let r = c.batch_put_from(&keys, &addrs, &sizes);
            Ok(freed(c, bufs, r)?
                .iter()
                .map(|r| r.as_ref().map_or_else(|e| e.code().as_str_name().to_string(), |()| "ok".into()))
                .collect::<Vec<_>>()
                .join(" "))
        }
        Some("batch_get_into") => {
            let seed = num(w.get(1), "seed")?;
            let (keys, sizes) = key_sizes(&w[2..])?;
            let mut bufs = sizes.iter().map(|&n| Buf::new(c, n, heap)).collect::<Result<Vec<_>>>()?;
            let addrs: Vec<u64> = bufs.iter().map(|b| b.addr).collect();
            let r = c.batch_get_into(&keys, &addrs, &sizes);
            let answer = r.map(|rs| {
                rs.iter()
                    .zip(bufs.iter_mut())
                    .map(|(r, b)| match r {
                        Ok(n) if pattern::first_mismatch(&b.bytes()[..*n as usize], seed, 0).is_none() => n.to_string(),
                        Ok(_) => "MISMATCH".into(),
                        Err(e) => e.code().as_str_name().to_string(),
                    })
                    .collect::<Vec<_>>()
                    .join(" ")
            });
            freed(c, bufs, answer)
        }
        Some("batch_exists") => {
            let keys: Vec<String> = w[1..].iter().map(|k| k.to_string()).collect();
            Ok(c.batch_exists(&keys)?.iter().map(|e| e.to_string()).collect::<Vec<_>>().join(" "))
        }
        Some("remove_all") => Ok(c.remove_all()?.to_string()),
        Some("spin_get_into") => {
            let (key, size) = (key()?.to_string(), num(w.get(2), "size")?);
            let b = Buf::new(c, size, heap)?;
            let c = c.clone();
            std::thread::spawn(move || loop {
                let _ = c.get_into(&key, b.addr, size);
            });
            Ok("spinning".into())
        }
        _ => run_command(&**c, w),
    }
}

fn seeded(size: u64, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; size as usize];
    pattern::fill(&mut v, seed, 0);
    v
}

/// How a got value differs from the pattern of `seed`; with `size`, its length is checked too.
fn mismatch(got: &[u8], seed: u64, size: Option<u64>) -> Option<pattern::Mismatch> {
    match size {
        Some(len) => pattern::value_mismatch(got, seed, len),
        None => pattern::first_mismatch(got, seed, 0).map(pattern::Mismatch::Byte),
    }
}

fn num(s: Option<&&str>, what: &str) -> Result<u64> {
    let s = s.with_context(|| format!("missing {what}"))?;
    parse_size(s).or_else(|_| s.parse::<u64>().map_err(|e| anyhow::anyhow!("{what} {s:?}: {e}")))
}

fn run_command(c: &dyn StoreApi, w: &[&str]) -> Result<String> {
    let key = || w.get(1).copied().context("missing key");
    match w.first().copied() {
        Some("put") => {
            let v = seeded(num(w.get(2), "size")?, num(w.get(3), "seed")?);
            c.put(key()?, &v)?;
            Ok(String::new())
        }
        Some("get") => {
            let seed = num(w.get(2), "seed")?;
            let size = w.get(3).map(|_| num(w.get(3), "size")).transpose()?;
            let got = c.get(key()?)?;
            match mismatch(&got, seed, size) {
                None => Ok(format!("{} verified", got.len())),
                Some(m) => bail!("{}: {m}", key()?),
            }
        }
        Some("exists") => Ok(c.exists(key()?)?.to_string()),
        Some("size") => Ok(c.get_size(key()?)?.to_string()),
        Some("remove") => Ok(c.remove(key()?).map(|()| String::new())?),
        Some("remove_regex") => Ok(c.remove_by_regex(key()?)?.to_string()),
        Some("query") => {
            let q = c.query(key()?)?;
            let replicas: Vec<String> = q
                .replicas
                .iter()
                .map(|r| match Tier::try_from(r.tier) {
                    Ok(Tier::Ssd) => format!("{}(SSD)", r.segment_name),
                    _ => r.segment_name.clone(),
                })
                .collect();
            Ok(format!(
                "exists={} size={} version={} lease_ms={} replicas={}",
                q.exists,
                q.size,
                q.version,
                q.lease_remaining_ms,
                replicas.join(",")
            ))
        }
        Some("batch_put") => {
            let seed = num(w.get(1), "seed")?;
            let mut keys = Vec::new();
            let mut values = Vec::new();
            for kv in &w[2..] {
                let (k, s) = kv.split_once(':').context("batch_put takes KEY:SIZE")?;
                keys.push(k.to_string());
                values.push(seeded(parse_size(s).map_err(anyhow::Error::msg)?, seed));
            }
            let refs: Vec<&[u8]> = values.iter().map(|v| v.as_slice()).collect();
            let results = c.put_batch(&keys, &refs)?;
            Ok(results
                .iter()
                .map(|r| match r {
                    Ok(()) => "ok".to_string(),
                    Err(e) => e.code().as_str_name().to_string(),
                })
                .collect::<Vec<_>>()
                .join(" "))
        }
        Some("batch_get") => {
            let seed = num(w.get(1), "seed")?;
            let mut keys = Vec::new();
            let mut sizes = Vec::new();
            for k in &w[2..] {
                // KEY:SIZE, or a KEY (which may hold ':') alone.
                let (key, size) = match k.rsplit_once(':').and_then(|(key, s)| Some((key, parse_size(s).ok()?))) {
                    Some((key, size)) => (key, Some(size)),
                    None => (*k, None),
                };
                keys.push(key.to_string());
                sizes.push(size);
            }
            let results = c.get_batch(&keys)?;
            Ok(results
                .iter()
                .zip(sizes)
                .map(|(r, size)| match r {
                    Ok(v) if mismatch(v, seed, size).is_none() => format!("{}", v.len()),
                    Ok(_) => "MISMATCH".to_string(),
                    Err(e) => e.code().as_str_name().to_string(),
                })
                .collect::<Vec<_>>()
                .join(" "))
        }
        Some("remove_force") => Ok(c.remove_with(key()?, true).map(|()| String::new())?),
        Some(other) => bail!("unknown command {other:?}"),
        None => bail!("empty command"),
    }
}
