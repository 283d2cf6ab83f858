//! `crescent get` and `crescent put`: a store client that contributes no memory (a pure
//! consumer) moves the bytes between this process and the holder; a progress bar on stderr
//! when a step takes longer than a second and stderr is a terminal.

use std::fs::File;
use std::io::{ErrorKind, IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Args;
use crescent_store::client::hot_cache::HotCacheSettings;
use crescent_store::{ClientConfig, StoreApi, StoreClient};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::json;

use super::{bytes, print_json, CliError, ClusterArgs, Target};

/// The staging buffer of the tool's client at most (values larger than it move in pieces).
const MAX_STAGING: u64 = 64 << 20;
/// A step shorter than this shows no progress bar.
const SHOW_AFTER: Duration = Duration::from_secs(1);
/// Bytes read or written at a time (the progress bar's step).
const CHUNK: usize = 4 << 20;

#[derive(Args)]
pub struct GetArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    pub key: String,
    /// Write the value to FILE (created or replaced) instead of stdout.
    #[arg(long, short = 'o', value_name = "FILE")]
    pub output: Option<PathBuf>,
}

#[derive(Args)]
pub struct PutArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    pub key: String,
    /// The value's file; - or nothing: stdin.
    pub file: Option<PathBuf>,
    /// Replace the key's value if it exists (a put of an existing key is refused otherwise).
    #[arg(long)]
    pub replace: bool,
    /// Replicas to store [default: replica_num of the configuration, 1].
    #[arg(long)]
    pub replicas: Option<u32>,
}

/// A client of `target`'s master that contributes no memory, no disk and no hot cache.
pub fn consumer(target: &Target) -> Result<Arc<StoreClient>> {
    let config = ClientConfig {
        global_segment_size: 0,
        local_buffer_size: target.config.local_buffer_size.min(MAX_STAGING),
        storage_root_dir: None,
        metrics_address: None,
        hot_cache: HotCacheSettings::default(),
        ..target.config.clone()
    };
    let master = config.master_server_address.clone();
    StoreClient::connect(config).with_context(|| format!("connecting to the master at {master}"))
}

/// A progress bar on stderr that appears once its step has lasted [`SHOW_AFTER`], only when
/// stderr is a terminal.
struct Progress {
    bar: ProgressBar,
    done: Option<mpsc::Sender<()>>,
    timer: Option<std::thread::JoinHandle<()>>,
}

impl Progress {
    /// Bytes done of `total` (`count`: the position moves; `total` 0: unknown), or a spinner
    /// beside the size of a step whose progress cannot be seen (a transfer the client runs in
    /// one call).
    fn start(message: String, total: u64, count: bool) -> Progress {
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::hidden());
        if !std::io::stderr().is_terminal() {
            return Progress { bar, done: None, timer: None };
        }
        let template = if count && total == 0 {
            // A pipe: its length is known only at its end.
            "{spinner} {msg} {bytes} [{elapsed}] {binary_bytes_per_sec}"
        } else if count {
            "{spinner} {msg} {bytes}/{total_bytes} [{elapsed}] {binary_bytes_per_sec}"
        } else {
            "{spinner} {msg} ({total_bytes}) [{elapsed}]"
        };
        if let Ok(style) = ProgressStyle::with_template(template) {
            bar.set_style(style);
        }
        bar.set_message(message);
        let (done, wait) = mpsc::channel::<()>();
        let shown = bar.clone();
        let timer = std::thread::spawn(move || {
            if wait.recv_timeout(SHOW_AFTER) == Err(mpsc::RecvTimeoutError::Timeout) {
                shown.set_draw_target(ProgressDrawTarget::stderr());
                shown.enable_steady_tick(Duration::from_millis(100));
            }
        });
        Progress { bar, done: Some(done), timer: Some(timer) }
    }

    fn inc(&self, n: usize) {
        self.bar.inc(n as u64);
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        drop(self.done.take());
        if let Some(t) = self.timer.take() {
            let _ = t.join();
        }
        self.bar.finish_and_clear();
    }
}

/// The value to put: FILE's bytes, or stdin's (refused when stdin is a terminal).
fn read_value(file: Option<&Path>) -> Result<Vec<u8>> {
    let (mut source, total, name): (Box<dyn Read>, u64, String) = match file {
        Some(path) if path != Path::new("-") => {
            let f = File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
            let len = f.metadata().map(|m| m.len()).unwrap_or(0);
            if f.metadata().is_ok_and(|m| m.is_dir()) {
                return Err(CliError::Usage(format!("cannot read {}: it is a directory", path.display())).into());
            }
            (Box::new(f), len, path.display().to_string())
        }
        _ => {
            if std::io::stdin().is_terminal() {
                return Err(CliError::Usage(
                    "no FILE, and stdin is a terminal: name a FILE or pipe the value in".into(),
                )
                .into());
            }
            (Box::new(std::io::stdin().lock()), 0, "stdin".to_string())
        }
    };
    let progress = Progress::start(format!("reading {name}"), total, true);
    let mut value = Vec::with_capacity(total as usize);
    let mut chunk = vec![0u8; CHUNK];
    loop {
        match source.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => {
                value.extend_from_slice(&chunk[..n]);
                progress.inc(n);
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e).with_context(|| format!("cannot read {name}")),
        }
    }
    Ok(value)
}

/// `crescent put KEY [FILE|-]`.
pub fn put(a: PutArgs) -> Result<()> {
    let target = a.cluster.target()?;
    // The file first: one that cannot be read fails before the master is asked anything.
    let value = read_value(a.file.as_deref())?;
    let client = consumer(&target)?;
    let result = put_with(&client, &a, &value);
    let _ = client.close();
    let ms = result?;
    if a.cluster.json {
        print_json(&json!({"key": a.key, "bytes": value.len(), "ms": ms, "replaced": a.replace}));
    } else {
        println!("stored {} ({} bytes, {}) in {ms:.1} ms", a.key, value.len(), bytes(value.len() as u64));
    }
    Ok(())
}

fn put_with(client: &StoreClient, a: &PutArgs, value: &[u8]) -> Result<f64> {
    let mut options = client.default_options();
    if let Some(n) = a.replicas {
        options.replica_num = n.max(1);
    }
    if !a.replace && client.exists(&a.key)? {
        return Err(CliError::Usage(format!(
            "{} exists: a put leaves it as it is (--replace replaces it, `crescent rm` removes it)",
            a.key
        ))
        .into());
    }
    let progress = Progress::start(format!("put {}", a.key), value.len() as u64, false);
    let t = Instant::now();
    if a.replace {
        client.upsert_with(&a.key, value, &options)?;
    } else {
        client.put_with(&a.key, value, &options)?;
    }
    drop(progress);
    Ok(t.elapsed().as_secs_f64() * 1e3)
}

/// `crescent get KEY [-o FILE]`.
pub fn get(a: GetArgs) -> Result<()> {
    if a.cluster.json && a.output.is_none() {
        return Err(CliError::Usage("--json needs -o FILE (without it the value goes to stdout)".into()).into());
    }
    let target = a.cluster.target()?;
    // The file is created first: one that cannot be written fails before the transfer.
    let out = match &a.output {
        Some(path) if path != Path::new("-") => {
            Some((File::create(path).with_context(|| format!("cannot write {}", path.display()))?, path))
        }
        _ => None,
    };
    let client = consumer(&target)?;
    let fetched = (|| -> Result<(Vec<u8>, f64)> {
        let size = client.get_size(&a.key)?;
        let progress = Progress::start(format!("get {}", a.key), size, false);
        let t = Instant::now();
        let value = client.get(&a.key)?;
        drop(progress);
        Ok((value, t.elapsed().as_secs_f64() * 1e3))
    })();
    let _ = client.close();
    let (value, ms) = match fetched {
        Ok(v) => v,
        Err(e) => {
            if let Some((file, path)) = out {
                drop(file);
                let _ = std::fs::remove_file(path);
            }
            return Err(e);
        }
    };
    match out {
        Some((mut file, path)) => {
            let progress = Progress::start(format!("writing {}", path.display()), value.len() as u64, true);
            for chunk in value.chunks(CHUNK) {
                file.write_all(chunk).with_context(|| format!("cannot write {}", path.display()))?;
                progress.inc(chunk.len());
            }
            file.flush().with_context(|| format!("cannot write {}", path.display()))?;
            drop(progress);
            if a.cluster.json {
                print_json(&json!({"key": a.key, "bytes": value.len(), "ms": ms, "file": path}));
            } else {
                println!(
                    "got {} ({} bytes, {}) in {ms:.1} ms into {}",
                    a.key,
                    value.len(),
                    bytes(value.len() as u64),
                    path.display()
                );
            }
        }
        None => {
            let mut stdout = std::io::stdout().lock();
            match stdout.write_all(&value).and_then(|()| stdout.flush()) {
                // A reader that stopped early (`| head -c`) is not a failure.
                Err(e) if e.kind() != ErrorKind::BrokenPipe => return Err(e).context("writing to stdout"),
                _ => {}
            }
        }
    }
    Ok(())
}
