//! store-race: the two sides of the torn-read race test (`tests/tests/store_race.rs`), each a
//! store client in a process of its own.
//!
//! ```text
//! store-race writer --master ADDR --keys N --size BYTES --seconds S [--protocol tcp]
//! store-race reader --master ADDR --keys N --size BYTES --seconds S [--protocol tcp] [--hot-cache BYTES]
//! ```
//!
//! Every value is made of one 8-byte word repeated: `key << 32 | generation`. The writer
//! contributes a segment and cycles over the keys: `remove(key, force)` — while the reader's
//! gets hold leases on them — then a `put_from` of the next generation. It prints `ready` once
//! every key has a value, and at the end `writer puts P removes R refused F`. The reader runs
//! `get`, `get_into`, `batch_get_into` and `get_batch` in four threads and checks every value
//! it is handed with success: all words equal, of its key. At the end it prints, per method,
//! `METHOD ok N torn T failed F` (failed: calls that answered an error, e.g. the key was
//! removed meanwhile or the read outlived its lease), then `done`.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use crescent_engine::TransportKind;
use crescent_store::client::hot_cache::HotCacheSettings;
use crescent_store::{ClientConfig, StoreApi, StoreClient};

struct Args {
    role: String,
    master: String,
    keys: u64,
    size: u64,
    seconds: f64,
    protocol: Option<TransportKind>,
    hot_cache: u64,
}

fn parse_args() -> Result<Args> {
    let mut it = std::env::args().skip(1);
    let role = it.next().context("writer or reader")?;
    let mut a =
        Args { role, master: String::new(), keys: 8, size: 4 << 20, seconds: 4.0, protocol: None, hot_cache: 0 };
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--master" => a.master = value()?,
            "--keys" => a.keys = value()?.parse().context("--keys")?,
            "--size" => a.size = value()?.parse().context("--size")?,
            "--seconds" => a.seconds = value()?.parse().context("--seconds")?,
            "--hot-cache" => a.hot_cache = value()?.parse().context("--hot-cache")?,
            "--protocol" => {
                a.protocol = Some(match value()?.as_str() {
                    "tcp" => TransportKind::Tcp,
                    "shm" => TransportKind::Shm,
                    other => bail!("unknown protocol {other}"),
                })
            }
            other => bail!("unknown flag {other}"),
        }
    }
    if a.master.is_empty() || !a.size.is_multiple_of(8) || a.keys == 0 {
        bail!("--master is needed, --size a multiple of 8, --keys at least 1");
    }
    Ok(a)
}

fn key(i: u64) -> String {
    format!("race-{i}")
}

fn word(i: u64, generation: u64) -> u64 {
    (i << 32) | generation
}

/// Why a value handed over with success is wrong, if it is.
fn torn(v: &[u8], i: u64, size: u64) -> Option<String> {
    if v.len() as u64 != size {
        return Some(format!("{} bytes, not {size}", v.len()));
    }
    let first = u64::from_ne_bytes(v[..8].try_into().expect("8 bytes"));
    if first >> 32 != i {
        return Some(format!("starts with a word of key {}", first >> 32));
    }
    let at = v.chunks_exact(8).position(|w| u64::from_ne_bytes(w.try_into().expect("8 bytes")) != first)?;
    let other = u64::from_ne_bytes(v[at * 8..at * 8 + 8].try_into().expect("8 bytes"));
    Some(format!("generation {} up to byte {}, then {other:#x}", first & 0xffff_ffff, at * 8))
}

fn connect(a: &Args, segment: u64) -> Result<Arc<StoreClient>> {
    let hot_cache = if a.hot_cache > 0 {
        HotCacheSettings::with_sizes(a.hot_cache, Some(a.size))
    } else {
        HotCacheSettings::default()
    };
    Ok(StoreClient::connect(ClientConfig {
        master_server_address: a.master.clone(),
        local_hostname: Some("127.0.0.1".into()),
        protocol: a.protocol,
        global_segment_size: segment,
        local_buffer_size: 2 * a.size,
        hot_cache,
        ..ClientConfig::default()
    })?)
}

fn writer(a: &Args) -> Result<()> {
    // Room for every key twice over and for the ranges that wait for leases to end.
    let c = connect(a, 16 * a.keys * a.size)?;
    let mut buf = vec![0u64; (a.size / 8) as usize];
    let addr = buf.as_ptr() as u64;
    c.register_buffer(addr, a.size)?;
    let fill = |buf: &mut Vec<u64>, i: u64, generation: u64| buf.fill(word(i, generation));
    for i in 0..a.keys {
        fill(&mut buf, i, 0);
        c.put_from(&key(i), addr, a.size)?;
    }
    println!("ready");
    std::io::stdout().flush()?;
    let (mut puts, mut removes, mut refused) = (0u64, 0u64, 0u64);
    let end = Instant::now() + Duration::from_secs_f64(a.seconds);
    let mut generation = 0;
    while Instant::now() < end {
        generation += 1;
        for i in 0..a.keys {
            if c.remove_with(&key(i), true).is_ok() {
                removes += 1;
            }
            fill(&mut buf, i, generation);
            match c.put_from(&key(i), addr, a.size) {
                Ok(()) => puts += 1,
                Err(_) => refused += 1,
            }
        }
    }
    c.unregister_buffer(addr)?;
    println!("writer puts {puts} removes {removes} refused {refused}");
    Ok(())
}

#[derive(Default)]
struct Tally {
    ok: AtomicU64,
    torn: AtomicU64,
    failed: AtomicU64,
    /// The first error of each kind (its message up to the key), for the report.
    errors: parking_lot::Mutex<std::collections::BTreeMap<String, u64>>,
}

impl Tally {
    fn check(&self, method: &str, v: Result<&[u8], String>, i: u64, size: u64) {
        match v {
            Err(e) => {
                let kind = e.replace(&key(i), "KEY");
                *self.errors.lock().entry(kind).or_default() += 1;
                self.failed.fetch_add(1, Ordering::Relaxed)
            }
            Ok(v) => match torn(v, i, size) {
                None => self.ok.fetch_add(1, Ordering::Relaxed),
                Some(why) => {
                    eprintln!("store-race: {method} of {} returned a torn value: {why}", key(i));
                    self.torn.fetch_add(1, Ordering::Relaxed)
                }
            },
        };
    }
}

fn reader(a: &Args) -> Result<()> {
    let c = connect(a, 0)?;
    let end = Instant::now() + Duration::from_secs_f64(a.seconds);
    let methods = ["get", "get_into", "batch_get_into", "get_batch"];
    let tallies: Vec<Arc<Tally>> = methods.iter().map(|_| Arc::new(Tally::default())).collect();
    std::thread::scope(|s| -> Result<()> {
        let mut threads = Vec::new();
        for (m, tally) in methods.iter().zip(&tallies) {
            let (c, tally, a) = (c.clone(), tally.clone(), &*a);
            threads.push(s.spawn(move || -> Result<()> {
                let (keys, size) = (a.keys, a.size);
                let mut buf = vec![0u8; size as usize];
                let addr = buf.as_mut_ptr() as u64;
                c.register_buffer(addr, size)?;
                let mut n = 0u64;
                while Instant::now() < end {
                    let i = n % keys;
                    n += 1;
                    match *m {
                        "get" => {
                            let v = c.get(&key(i));
                            tally.check(m, v.as_deref().map_err(|e| e.to_string()), i, size);
                        }
                        "get_into" => {
                            buf.fill(0);
                            let r = c.get_into(&key(i), addr, size);
                            tally.check(m, r.map(|n| &buf[..n as usize]).map_err(|e| e.to_string()), i, size);
                        }
                        "batch_get_into" => {
                            buf.fill(0);
                            let r = c.batch_get_into(&[key(i)], &[addr], &[size]);
                            let got = r.and_then(|mut v| v.pop().expect("one answer")).map_err(|e| e.to_string());
                            tally.check(m, got.map(|n| &buf[..n as usize]), i, size);
                        }
                        _ => {
                            let r = c.get_batch(&[key(i)]);
                            let got = r.and_then(|mut v| v.pop().expect("one answer")).map_err(|e| e.to_string());
                            tally.check(m, got.as_deref().map_err(Clone::clone), i, size);
                        }
                    }
                }
                c.unregister_buffer(addr)?;
                Ok(())
            }));
        }
        for t in threads {
            t.join().expect("reader thread")?;
        }
        Ok(())
    })?;
    for (m, t) in methods.iter().zip(&tallies) {
        eprintln!("store-race: {m} failed with {:?}", t.errors.lock());
        println!(
            "{m} ok {} torn {} failed {}",
            t.ok.load(Ordering::Relaxed),
            t.torn.load(Ordering::Relaxed),
            t.failed.load(Ordering::Relaxed)
        );
    }
    println!("done");
    Ok(())
}

fn main() -> Result<()> {
    let a = parse_args()?;
    match a.role.as_str() {
        "writer" => writer(&a),
        "reader" => reader(&a),
        other => bail!("unknown role {other}: writer or reader"),
    }
}
