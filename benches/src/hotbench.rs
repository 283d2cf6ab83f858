//! `storebench hot-cache` and `storebench replay`: the client's local hot cache measured from
//! a reader on host B against objects held by a client on host A (see `benches/hotcache.sh`).
//!
//! Every reader is a fresh client (empty cache); puts come from a separate writer client in
//! this process that contributes 1 MiB only, so every object lands in the holder's memory on A.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use crescent_engine::parse_size;
use crescent_store::client::hot_cache::{Admission, FillMode, HotCacheSettings};
use crescent_store::{pattern, ClientConfig, StoreApi, StoreClient};

use crate::report;
use hdrhistogram::Histogram;

const MIB: u64 = 1 << 20;

/// `get`: one value per call, returned in a fresh buffer.
const GET: &str = "get";
/// `batch_get_into`: a batch per call into buffers registered once.
const BATCH_GET: &str = "batchGet";
/// `get_batch`: a batch per call, each value returned in a freshly allocated buffer.
const BATCH_GET_BYTES: &str = "batchGet (bytes)";

#[derive(Args, Debug, Clone)]
pub struct Common {
    /// The master, host:port.
    #[arg(long)]
    pub master: String,
    /// This host's address (peers reach the readers there).
    #[arg(long)]
    pub local_hostname: String,
    /// A label printed above the tables (e.g. the link's shaping).
    #[arg(long, default_value = "")]
    pub label: String,
}

impl Common {
    /// `", LABEL"` for the end of a table's title, or nothing without a label.
    fn label_suffix(&self) -> String {
        if self.label.is_empty() {
            String::new()
        } else {
            format!(", {}", self.label)
        }
    }
}

#[derive(Args, Debug, Clone)]
pub struct HotCacheArgs {
    #[command(flatten)]
    pub common: Common,
    #[arg(long, default_value_t = 10)]
    pub rounds: usize,
    #[arg(long, default_value_t = 25)]
    pub keys: usize,
    /// Value sizes (MiB when written as 10M).
    #[arg(long, value_delimiter = ',', default_value = "10M,25M", value_parser = parse_size)]
    pub sizes: Vec<u64>,
    /// Cache size for each value size, in order.
    #[arg(long, value_delimiter = ',', default_value = "400M,800M", value_parser = parse_size)]
    pub caches: Vec<u64>,
    /// Keys per batchGet call.
    #[arg(long, default_value_t = 5)]
    pub batch: usize,
    /// Pairs of fresh readers without and with the cache per row, alternating which goes
    /// first: the first runs every round, the others the first round only, for the first
    /// round's ratio (cached / uncached, target <= 1.10x).
    #[arg(long, default_value_t = 5)]
    pub pairs: usize,
    /// How the cached readers' misses fill the cache: `auto` (the client's default: each
    /// miss inline or deferred by how the link compares with a memory copy), `inline` (the
    /// get fills the cache from its own bytes) or `deferred` (a background filler reads the
    /// object again when the reader's own reads leave the link idle).
    #[arg(long, default_value = "auto", value_parser = parse_fill)]
    pub fill: FillMode,
    /// The rows to run, of `get`, `batchGet` and `bytes` (`batchGet (bytes)`).
    #[arg(long, value_delimiter = ',', default_value = "get,batchGet,bytes", value_parser = parse_method)]
    pub methods: Vec<&'static str>,
    /// Memory written and freed before each fresh reader starts (0: none), so that both
    /// readers of a pair start on memory the machine has backed (in a VM whose guest hands
    /// free memory back to its host, the first write to such memory faults on the host too).
    #[arg(long, default_value = "2G", value_parser = size_or_zero)]
    pub warm_memory: u64,
}

/// Writes `bytes` of fresh memory and frees it again.
///
/// In a VM whose guest hands free memory back to the hypervisor (virtio-balloon free page
/// reporting, as on the Firecracker VMs these benchmarks run on: `page_reporting_order` 9), the
/// first write to a page the guest gave back faults on the host as well. A reader that starts
/// an 800 MiB hot cache takes the guest's backed free pages first, so the fresh buffers of its
/// first call (a byte get's results) landed on pages given back: measured 2026-12-04, a
/// 5 x 10 MiB `get_batch` took 97-168 ms instead of 33 ms in such a first call, in the first
/// reader of the process too, whether it had a cache or not; the ratio of a pair then measured
/// which reader met given-back memory. Writing 2 GiB before every reader, cached or not, took
/// those calls back to 33-40 ms. On a machine without page reporting this only costs time.
fn warm_memory(bytes: u64) {
    if bytes > 0 {
        let pages = vec![1u8; bytes as usize];
        std::hint::black_box(&pages);
    }
}

/// Whether this (virtual) machine may hand free memory back to its host: a virtio balloon
/// device, and the kernel's free page reporting order.
fn page_reporting() -> String {
    let balloon = std::fs::read_dir("/sys/bus/virtio/drivers/virtio_balloon")
        .map(|d| d.flatten().any(|e| e.file_name().to_string_lossy().starts_with("virtio")))
        .unwrap_or(false);
    match std::fs::read_to_string("/sys/module/page_reporting/parameters/page_reporting_order") {
        Ok(order) if balloon => format!("virtio balloon, reporting order {}", order.trim()),
        _ => "no virtio balloon seen".into(),
    }
}

fn parse_method(s: &str) -> Result<&'static str, String> {
    match s {
        "get" => Ok(GET),
        "batchGet" => Ok(BATCH_GET),
        "bytes" => Ok(BATCH_GET_BYTES),
        _ => Err(format!("{s:?}: get, batchGet or bytes")),
    }
}

fn parse_fill(s: &str) -> Result<FillMode, String> {
    s.parse().map_err(|e: crescent_store::StoreError| e.to_string())
}

#[derive(Args, Debug, Clone)]
pub struct ReplayArgs {
    #[command(flatten)]
    pub common: Common,
    /// Requests per run.
    #[arg(long, default_value_t = 60)]
    pub requests: usize,
    #[arg(long, value_delimiter = ',', default_value = "5,10")]
    pub concurrency: Vec<usize>,
    /// Percent of the requests that ask for the same prompt.
    #[arg(long, value_delimiter = ',', default_value = "50,70")]
    pub identical: Vec<u32>,
    #[arg(long, default_value_t = 4096)]
    pub tokens: u64,
    /// KV bytes per token here; a Llama-3-8B-like model in fp16 has 128 KiB (32 layers x 8 KV
    /// heads x 128 x 2 x 2 bytes). Cache sizes are scaled by the same factor.
    #[arg(long, default_value = "8K", value_parser = parse_size)]
    pub kv_bytes_per_token: u64,
    #[arg(long, default_value = "128K", value_parser = parse_size)]
    pub model_kv_bytes_per_token: u64,
    /// Tokens per chunk (one object per chunk; also the cache's block size).
    #[arg(long, default_value_t = 256)]
    pub chunk_tokens: u64,
    /// Cache sizes at model scale (scaled down by kv-bytes-per-token / model-kv-bytes-per-token).
    #[arg(long, value_delimiter = ',', default_value = "0,1G,2G,4G", value_parser = size_or_zero)]
    pub caches: Vec<u64>,
}

fn size_or_zero(s: &str) -> Result<u64, String> {
    if s.trim() == "0" {
        Ok(0)
    } else {
        parse_size(s)
    }
}

fn writer(c: &Common) -> Result<Arc<StoreClient>> {
    Ok(StoreClient::connect(ClientConfig {
        master_server_address: c.master.clone(),
        local_hostname: Some(c.local_hostname.clone()),
        global_segment_size: MIB,
        local_buffer_size: 64 * MIB,
        hot_cache: HotCacheSettings::default(),
        ..ClientConfig::from_env()?
    })?)
}

fn reader(
    c: &Common,
    cache: u64,
    block: Option<u64>,
    (admission, fill): (Admission, FillMode),
    buffer: u64,
) -> Result<Arc<StoreClient>> {
    let hot_cache = if cache == 0 {
        HotCacheSettings::default()
    } else {
        HotCacheSettings { admission, fill, ..HotCacheSettings::with_sizes(cache, block) }
    };
    let client = StoreClient::connect(ClientConfig {
        master_server_address: c.master.clone(),
        local_hostname: Some(c.local_hostname.clone()),
        global_segment_size: MIB,
        local_buffer_size: buffer,
        hot_cache,
        ..ClientConfig::from_env()?
    })?;
    if cache > 0 && client.hot_cache().is_none() {
        bail!("the hot cache of {cache} bytes did not start (see the warning above)");
    }
    Ok(client)
}

fn value(size: u64, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; size as usize];
    pattern::fill(&mut v, seed, 0);
    v
}

struct Row {
    method: &'static str,
    size: u64,
    cache: u64,
    calls: usize,
    batch: Option<usize>,
    rounds_ms: Vec<f64>,
    metrics: String,
    /// A cached reader's warm calls against their limit (see [`HitLimit`]), one pair per warm
    /// round.
    hits: report::Pairs,
}

impl Row {
    fn first(&self) -> f64 {
        self.rounds_ms[0]
    }
    fn avg(&self) -> f64 {
        self.rounds_ms.iter().sum::<f64>() / self.rounds_ms.len() as f64
    }
    fn warm(&self) -> f64 {
        let w = &self.rounds_ms[1..];
        w.iter().sum::<f64>() / w.len().max(1) as f64
    }
}

/// What a warm hit may cost (issue 28 §4): one memcpy of the call's values into the kind of
/// memory the call returns them in (a fresh vector per value for `get` and `batchGet (bytes)`,
/// the registered buffers for `batchGet`) plus the master's answer for its keys (`exists` /
/// `batch_exists`: a round trip to the master for the same keys, as a hit's replica-list
/// check is). Measured in the cached reader right after each warm round, call for call, so
/// that the round and its limit form a pair. The copies read a source as large as the cached
/// values (one value's room per key, in the round's order), not one value again and again: a
/// source that stays in the CPU's caches would make the limit a cache-to-cache copy, which a
/// hit from a cache of hundreds of MiB is not.
struct HitLimit {
    src: Vec<u8>,
    size: usize,
}

impl HitLimit {
    /// Milliseconds of each call-sized unit of the limit for `keys` in calls of `batch`.
    fn unit_ms(
        &self,
        r: &StoreClient,
        method: &str,
        keys: &[String],
        batch: usize,
        bufs: &mut [u8],
    ) -> Result<Vec<f64>> {
        let size = self.size;
        let value = |i: usize| &self.src[i * size..][..size];
        let mut units = Vec::new();
        if method == GET {
            for (i, k) in keys.iter().enumerate() {
                let t = Instant::now();
                r.exists(k)?;
                let v = value(i).to_vec();
                units.push(t.elapsed().as_secs_f64() * 1e3);
                std::hint::black_box(&v);
            }
        } else {
            for (n, chunk) in keys.chunks(batch).enumerate() {
                let t = Instant::now();
                r.batch_exists(chunk)?;
                let fresh: Vec<Vec<u8>> = if method == BATCH_GET {
                    for j in 0..chunk.len() {
                        bufs[j * size..][..size].copy_from_slice(value(n * batch + j));
                    }
                    Vec::new()
                } else {
                    (0..chunk.len()).map(|j| value(n * batch + j).to_vec()).collect()
                };
                units.push(t.elapsed().as_secs_f64() * 1e3);
                std::hint::black_box(&fresh);
            }
        }
        Ok(units)
    }
}

/// One fresh reader (cache `c`, 0: none) over `keys` for `rounds` rounds with `method`;
/// returns each round's milliseconds, the cache's metrics and, for a cached reader, its warm
/// calls against their limit.
fn reader_rounds(
    a: &HotCacheArgs,
    size: u64,
    keys: &[String],
    method: &str,
    c: u64,
    rounds: usize,
) -> Result<(Vec<f64>, String, report::Pairs)> {
    warm_memory(a.warm_memory);
    let r = reader(&a.common, c, None, (Admission::Always, a.fill), 64 * MIB)?;
    // batchGet reads into buffers allocated and registered once, as an inference
    // engine does (and as the reference's batch call does): `batch_get_into`.
    let mut bufs = vec![0u8; a.batch * size as usize];
    let base = bufs.as_mut_ptr() as u64;
    if method == BATCH_GET {
        r.register_buffer(base, bufs.len() as u64)?;
    }
    let addrs: Vec<u64> = (0..a.batch as u64).map(|j| base + j * size).collect();
    let lens = vec![size; a.batch];
    let mut rounds_ms = Vec::new();
    let limit =
        (c > 0 && rounds > 1).then(|| HitLimit { src: vec![1u8; keys.len() * size as usize], size: size as usize });
    let mut hits = report::Pairs::default();
    for round in 0..rounds {
        let verify = round == 0 || round == rounds - 1;
        let mut calls_ms = Vec::new();
        if method == GET {
            for (i, k) in keys.iter().enumerate() {
                let t = Instant::now();
                let v = r.get(k)?;
                calls_ms.push(t.elapsed().as_secs_f64() * 1e3);
                if verify && (v.len() as u64 != size || pattern::first_mismatch(&v, i as u64, 0).is_some()) {
                    bail!("wrong bytes for {k}");
                }
            }
        } else if method == BATCH_GET {
            for (n, chunk) in keys.chunks(a.batch).enumerate() {
                let t = Instant::now();
                let got = r.batch_get_into(chunk, &addrs, &lens)?;
                calls_ms.push(t.elapsed().as_secs_f64() * 1e3);
                for (j, n_read) in got.into_iter().enumerate() {
                    let seed = (n * a.batch + j) as u64;
                    let v = &bufs[j * size as usize..][..size as usize];
                    if n_read? != size || (verify && pattern::first_mismatch(v, seed, 0).is_some()) {
                        bail!("wrong bytes for {}", chunk[j]);
                    }
                }
            }
        } else {
            for (n, chunk) in keys.chunks(a.batch).enumerate() {
                let t = Instant::now();
                let got = r.get_batch(chunk)?;
                calls_ms.push(t.elapsed().as_secs_f64() * 1e3);
                for (j, v) in got.into_iter().enumerate() {
                    let v = v?;
                    let seed = (n * a.batch + j) as u64;
                    if verify && (v.len() as u64 != size || pattern::first_mismatch(&v, seed, 0).is_some()) {
                        bail!("wrong bytes for {}", chunk[j]);
                    }
                }
            }
        }
        rounds_ms.push(calls_ms.iter().sum());
        if let (Some(limit), true) = (&limit, round > 0) {
            let units = limit.unit_ms(&r, method, keys, a.batch, &mut bufs)?;
            hits.push(report::median(&calls_ms), report::median(&units));
        }
    }
    if method == BATCH_GET {
        r.unregister_buffer(base)?;
    }
    let mut metrics = r.hot_cache_metrics().map(|m| m.to_string()).unwrap_or_default();
    if let Some(cache) = r.hot_cache() {
        // The auto fill's view: the copy rate it measured at start and the copy share of the
        // last reads (see the client's hot_cache::fill_choice).
        if let Some(rate) = cache.copy_rate() {
            metrics += &format!(" copy_rate={:.1}GB/s", rate / 1e9);
        }
        if let Some(share) = cache.copy_share() {
            metrics += &format!(" copy_share={share:.3}");
        }
    }
    r.close()?;
    Ok((rounds_ms, metrics, hits))
}

/// The reference table's measurement: rounds over the same keys, get or batchGet, with and
/// without the cache; then the first round's cost with the cache against without, in pairs.
pub fn hot_cache(a: HotCacheArgs) -> Result<()> {
    if a.sizes.len() != a.caches.len() {
        bail!("one cache size per value size");
    }
    if a.rounds < 2 || a.keys == 0 || a.batch == 0 || !a.keys.is_multiple_of(a.batch) {
        bail!("need rounds >= 2 and keys a multiple of batch");
    }
    let w = writer(&a.common)?;
    let mut rows = Vec::new();
    let mut pairs = Vec::new();
    let load = report::Load::start();
    for (&size, &cache) in a.sizes.iter().zip(&a.caches) {
        let keys: Vec<String> = (0..a.keys).map(|i| format!("hc/{size}/{i}")).collect();
        for (i, k) in keys.iter().enumerate() {
            w.put(k, &value(size, i as u64)).with_context(|| format!("putting {k}"))?;
        }
        for &method in &a.methods {
            // Pair 1 runs every round (the table); the further pairs only the first round,
            // which is all their ratio needs. Uncached first in odd pairs, cached first in even.
            let mut first = report::Pairs::default();
            for pair in 0..a.pairs.max(1) {
                let rounds = if pair == 0 { a.rounds } else { 1 };
                let order = if pair % 2 == 0 { [0, cache] } else { [cache, 0] };
                let mut firsts = [0.0; 2];
                for c in order {
                    let (rounds_ms, metrics, hits) = reader_rounds(&a, size, &keys, method, c, rounds)?;
                    firsts[usize::from(c > 0)] = rounds_ms[0];
                    if pair == 0 {
                        let (calls, batch) =
                            if method == GET { (a.keys, None) } else { (a.keys / a.batch, Some(a.batch)) };
                        rows.push(Row { method, size, cache: c, calls, batch, rounds_ms, metrics, hits });
                    }
                }
                first.push(firsts[1], firsts[0]);
            }
            pairs.push((method, size, cache, first));
        }
        for k in &keys {
            w.remove_with(k, true)?;
        }
    }
    w.close()?;
    print_hot_table(&a, &rows);
    print_first_round_pairs(&a, &pairs);
    print_warm_hits(&a, &rows);
    load.finish();
    Ok(())
}

fn print_first_round_pairs(a: &HotCacheArgs, pairs: &[(&str, u64, u64, report::Pairs)]) {
    println!(
        "First round with the cache vs without it: {} pairs of fresh readers per row (uncached first in odd pairs), \
         medians in ms{}",
        a.pairs.max(1),
        a.common.label_suffix()
    );
    println!();
    print_pairs_table(
        "cached first round",
        "uncached first round",
        report::Target::AtMost(1.10),
        pairs.iter().map(|(method, size, cache, p)| (*method, *size, *cache, p)),
    );
}

/// A table of pairs in ms, a row per (method, value size, cache size, pairs): the medians of
/// both sides (`ours` and `limit` head their columns) and the ratio's cells against `target`.
fn print_pairs_table<'a>(
    ours: &str,
    limit: &str,
    target: report::Target,
    rows: impl Iterator<Item = (&'a str, u64, u64, &'a report::Pairs)>,
) {
    println!("| Method | Value (MB) | Cache (MB) | {ours} (ms) | {limit} (ms) | ratio | range | target | met |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for (method, size, cache, p) in rows {
        let s = p.summary();
        println!(
            "| {method} | {} | {} | {:.2} | {:.2} | {}",
            size / MIB,
            cache / MIB,
            s.ours,
            s.limit,
            s.ratio_cells(target)
        );
    }
    println!();
}

fn print_warm_hits(a: &HotCacheArgs, rows: &[Row]) {
    println!(
        "A warm hit against one memcpy of its values plus the master's answer: per cached row, each warm round's \
         median call against the median of the same calls' limit measured right after it (a memcpy of the call's \
         values into the memory the call returns them in, plus exists / batch_exists of its keys), {} pairs, ms{}",
        a.rounds - 1,
        a.common.label_suffix()
    );
    println!();
    print_pairs_table(
        "warm call",
        "memcpy + master",
        report::Target::AtMost(1.00),
        rows.iter().filter(|r| !r.hits.is_empty()).map(|r| (r.method, r.size, r.cache, &r.hits)),
    );
}

fn print_hot_table(a: &HotCacheArgs, rows: &[Row]) {
    println!(
        "hot cache ({:?} fill), {} rounds, {} keys{}; values and caches in MiB; Avg round = mean of all rounds, Warm avg = \
         rounds 2-{}; Delta = 1 - Avg round / First round of the same row, as the reference computes it (its \
         row 2: 1 - 287.38 / 1204.43 = 76.14 %), Warm delta = 1 - Warm avg / First round; batchGet = \
         batch_get_into into buffers registered once, batchGet (bytes) = get_batch, which allocates a fresh \
         buffer per value and call; before each reader {} MiB of memory written and freed (--warm-memory; the guest's free \
         page reporting: {})",
        a.fill,
        a.rounds,
        a.keys,
        a.common.label_suffix(),
        a.rounds,
        a.warm_memory / MIB,
        page_reporting()
    );
    println!();
    println!(
        "| Method | Keys | Value (MB) | Cache (MB) | Calls per round | Batch | First round (ms) | Avg round (ms) | Delta | \
         Warm avg (ms) | Warm delta | First round vs no cache |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut checks = Vec::new();
    for (i, r) in rows.iter().enumerate() {
        let base = rows[..i].iter().rev().find(|b| b.cache == 0 && b.method == r.method && b.size == r.size);
        let (delta, warm_delta, first_ratio) = match base.filter(|_| r.cache > 0) {
            Some(b) => {
                // The reference's delta compares a row with its own first (cold, filling) round; the
                // first round's cost against the uncached row is checked on its own.
                let wd = 1.0 - r.warm() / r.first();
                let fr = r.first() / b.first();
                checks.push(format!(
                    "{} {} MiB / {} MiB: warm delta {:.2} % (target >= 90 %: {}), first round {:.2}x the uncached first \
                     round (target <= 1.10x: {}); rounds (ms): {}; cache: {}",
                    r.method,
                    r.size / MIB,
                    r.cache / MIB,
                    wd * 100.0,
                    if wd >= 0.90 { "met" } else { "NOT met" },
                    fr,
                    if fr <= 1.10 { "met" } else { "NOT met" },
                    r.rounds_ms.iter().map(|ms| format!("{ms:.1}")).collect::<Vec<_>>().join(" "),
                    r.metrics
                ));
                (
                    format!("{:.2} %", (1.0 - r.avg() / r.first()) * 100.0),
                    format!("{:.2} %", wd * 100.0),
                    format!("{fr:.2}x"),
                )
            }
            None => ("-".into(), "-".into(), "-".into()),
        };
        println!(
            "| {} | {} | {} | {} | {} | {} | {:.2} | {:.2} | {} | {:.2} | {} | {} |",
            r.method,
            a.keys,
            r.size / MIB,
            r.cache / MIB,
            r.calls,
            r.batch.map(|b| b.to_string()).unwrap_or("-".into()),
            r.first(),
            r.avg(),
            delta,
            r.warm(),
            warm_delta,
            first_ratio
        );
    }
    println!();
    for c in checks {
        println!("{c}");
    }
    println!();
}

/// An inference-shaped stream: each request fetches a prompt's KV bytes in fixed-size chunks
/// (one zero-copy batch get); a share of the requests ask for the same prompt.
pub fn replay(a: ReplayArgs) -> Result<()> {
    if a.tokens == 0 || a.chunk_tokens == 0 || !a.tokens.is_multiple_of(a.chunk_tokens) || a.requests == 0 {
        bail!("tokens must be a positive multiple of chunk-tokens, requests > 0");
    }
    let chunk = a.chunk_tokens * a.kv_bytes_per_token;
    let chunks = (a.tokens / a.chunk_tokens) as usize;
    let prompt = chunk * chunks as u64;
    let scale = a.kv_bytes_per_token as f64 / a.model_kv_bytes_per_token as f64;
    let max_unique = a.identical.iter().map(|p| a.requests - shared(a.requests, *p)).max().unwrap_or(0);
    println!(
        "replay{}: {} requests, each the KV bytes of a {}-token prompt = {} chunks of {} tokens x {} bytes/token = \
         {} MiB per request (batch_get_into, zero copy); scaled down from {} bytes/token: cache sizes x {scale} \
         (block size = one chunk, {} KiB)",
        a.common.label_suffix(),
        a.requests,
        a.tokens,
        chunks,
        a.chunk_tokens,
        a.kv_bytes_per_token,
        prompt / MIB,
        a.model_kv_bytes_per_token,
        chunk >> 10
    );
    let w = writer(&a.common)?;
    let key = |p: usize, c: usize| format!("rp/{p}/{c}");
    // Prompt 0 is the shared one; prompts 1.. are asked once each.
    for p in 0..=max_unique {
        for c in 0..chunks {
            w.put(&key(p, c), &value(chunk, (p * 1000 + c) as u64))?;
        }
    }
    println!();
    println!(
        "| concurrency | identical | cache (model scale) | cache here (MiB) | admission | p50 (ms) | p95 (ms) | \
         requests/s | GB/s | hits | misses | merged | fills | dropped fills |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for &conc in &a.concurrency {
        for &ident in &a.identical {
            let same = shared(a.requests, ident);
            // Request i asks for prompt 0 when it is one of `same` spread evenly, else a fresh one.
            let mut plan = Vec::with_capacity(a.requests);
            let mut next_unique = 1;
            for i in 0..a.requests {
                if (i * same) / a.requests != ((i + 1) * same) / a.requests {
                    plan.push(0);
                } else {
                    plan.push(next_unique);
                    next_unique += 1;
                }
            }
            for &model_cache in &a.caches {
                let here = ((model_cache as f64 * scale) as u64 / chunk) * chunk;
                let admissions: &[Admission] =
                    if here == 0 { &[Admission::Always] } else { &[Admission::Always, Admission::SecondAccess] };
                for &adm in admissions {
                    let r = reader(&a.common, here, Some(chunk), (adm, FillMode::default()), 16 * MIB)?;
                    let (lat, secs) = run_replay(&r, &plan, conc, chunks, chunk, &key)?;
                    let m = r.hot_cache().map(|h| {
                        h.flush();
                        h.metrics()
                    });
                    println!(
                        "| {conc} | {ident} % | {} | {} | {} | {:.1} | {:.1} | {:.1} | {:.2} | {} | {} | {} | {} | {} |",
                        crate::report::fmt_bytes(model_cache),
                        here / MIB,
                        if here == 0 { "-".to_string() } else { format!("{adm:?}") },
                        lat.value_at_quantile(0.5) as f64 / 1e3,
                        lat.value_at_quantile(0.95) as f64 / 1e3,
                        plan.len() as f64 / secs,
                        (plan.len() as u64 * prompt) as f64 / secs / 1e9,
                        m.map_or("-".into(), |m| m.hits.to_string()),
                        m.map_or("-".into(), |m| m.misses.to_string()),
                        m.map_or("-".into(), |m| m.merged.to_string()),
                        m.map_or("-".into(), |m| m.fills.to_string()),
                        m.map_or("-".into(), |m| m.dropped_fills.to_string()),
                    );
                    r.close()?;
                }
            }
        }
    }
    for p in 0..=max_unique {
        for c in 0..chunks {
            w.remove_with(&key(p, c), true)?;
        }
    }
    w.close()?;
    println!();
    Ok(())
}

fn shared(requests: usize, percent: u32) -> usize {
    (requests * percent.min(100) as usize).div_ceil(100)
}

/// Runs the plan with `conc` workers; returns per-request KV-fetch latency (us) and the wall time.
fn run_replay(
    r: &Arc<StoreClient>,
    plan: &[usize],
    conc: usize,
    chunks: usize,
    chunk: u64,
    key: &(dyn Fn(usize, usize) -> String + Sync),
) -> Result<(Histogram<u64>, f64)> {
    let next = AtomicUsize::new(0);
    let hist = Mutex::new(Histogram::<u64>::new(3)?);
    let started = Instant::now();
    std::thread::scope(|s| -> Result<()> {
        let workers: Vec<_> = (0..conc)
            .map(|_| {
                s.spawn(|| -> Result<()> {
                    let mut buf = vec![0u8; chunks * chunk as usize];
                    r.register_buffer(buf.as_mut_ptr() as u64, buf.len() as u64)?;
                    let addrs: Vec<u64> = (0..chunks as u64).map(|c| buf.as_ptr() as u64 + c * chunk).collect();
                    let lens = vec![chunk; chunks];
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(&p) = plan.get(i) else { break };
                        let keys: Vec<String> = (0..chunks).map(|c| key(p, c)).collect();
                        let t = Instant::now();
                        let res = r.batch_get_into(&keys, &addrs, &lens)?;
                        let us = t.elapsed().as_micros() as u64;
                        for (c, got) in res.into_iter().enumerate() {
                            if got? != chunk {
                                bail!("short read of {}", keys[c]);
                            }
                            // The head of every chunk and all of the last one: enough to catch a
                            // wrong object or a wrong block, cheap enough for two cores.
                            let at = c * chunk as usize;
                            let n = if c == chunks - 1 { chunk as usize } else { 65536.min(chunk as usize) };
                            if pattern::first_mismatch(&buf[at..at + n], (p * 1000 + c) as u64, 0).is_some() {
                                bail!("wrong bytes for {}", keys[c]);
                            }
                        }
                        hist.lock().expect("histogram").record(us)?;
                    }
                    r.unregister_buffer(buf.as_mut_ptr() as u64)?;
                    Ok(())
                })
            })
            .collect();
        for w in workers {
            w.join().map_err(|_| anyhow::anyhow!("a replay worker panicked"))??;
        }
        Ok(())
    })?;
    let secs = started.elapsed().as_secs_f64();
    Ok((hist.into_inner().expect("histogram"), secs))
}
