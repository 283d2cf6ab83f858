//! The master's command line, shared by `crescent-master` and its alias `mooncake_master`.
//!
//! Two spellings are accepted side by side:
//!
//! * Crescent's flags (`--rpc-address 127.0.0.1:50051`, `--lease-ttl-ms`, `--config master.json`
//!   with [`MasterConfig`]'s names);
//! * `mooncake_master`'s gflags (kvcache-ai/Mooncake `mooncake-store/src/master.cpp`):
//!   `--flag=value`, `--flag value`, `-flag=value`, booleans as `--flag`, `--flag=false` or
//!   `--noflag`, `--flagfile=FILE`, and `--config_path=FILE` (upstream's JSON master config,
//!   its keys named as the flags). Durations take upstream's units: `--default_kv_lease_ttl`
//!   and `--default_kv_soft_pin_ttl` in milliseconds or with an `ms`/`s`/`m`/`h` suffix,
//!   `--client_ttl` in seconds.
//!
//! Every flag upstream defines is either honoured (mapped onto [`MasterConfig`]) or, when
//! Crescent has no such feature, accepted with its value type-checked and named in one
//! warning at start (`IGNORED`). A flag neither knows is an error. `--enable_ha` is checked as
//! upstream checks it; of its backends only etcd runs (`super::config::HaConfig`, docs/src/ha.md).
//!
//! Precedence, as upstream: the command line over the config file over the defaults; Crescent's
//! `--config` and upstream's `--config_path` may not be given together.

use std::ffi::OsString;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{ArgMatches, Command, CommandFactory, FromArgMatches, Parser};

use super::config::{AllocationStrategy, MasterConfig};
use super::server;

mod gflags;
mod ignored;

pub use gflags::{check_config_file, ConfigFormat};
use gflags::{config_file, config_path_args};
pub(crate) use gflags::{long_flags, normalize};
use ignored::{ignored_arg, IGNORED};

/// How often `--enable_metric_reporting` (on by default, as upstream) logs a summary.
pub const METRIC_REPORT_INTERVAL: Duration = Duration::from_secs(10);

#[derive(Parser, Debug)]
#[command(
    name = "crescent-master",
    version,
    about = "Crescent store master: owns key -> replica metadata; clients contribute memory and move the bytes",
    long_about = "Crescent store master: owns key -> replica metadata (never the bytes).\n\n\
Clients mount memory segments, then put (allocate, write, commit) and get (replica list under a read \
lease, then read) objects. The master evicts least-recently-used objects above a high watermark, \
drops clients that stop sending heartbeats, and serves Prometheus metrics and JSON views on its admin port.\n\n\
Settings come from flags, which override a JSON --config file (same names, snake_case), which \
overrides the defaults shown here. mooncake_master's gflags (--port=50051, --default_kv_lease_ttl=5s, \
-eviction_ratio=0.1, ...) are accepted too; the ones Crescent does not implement are named in one \
warning at start.",
    args_override_self = true
)]
struct Cli {
    /// JSON file with any of the settings below (e.g. {"rpc_address": "0.0.0.0:50051", "lease_ttl_ms": 10000}).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Mooncake's master config file (JSON; keys named as mooncake_master's flags).
    #[arg(long = "config_path")]
    config_path: Option<PathBuf>,
    /// gRPC listen address, host:port, or (as mooncake_master's --rpc_address) a host to bind with
    /// --port/--rpc_port [default: 0.0.0.0:50051].
    #[arg(long, visible_alias = "rpc_address")]
    rpc_address: Option<String>,
    /// gRPC port (mooncake_master's deprecated spelling of --rpc_port).
    #[arg(long)]
    port: Option<u16>,
    /// gRPC port; 0: use --port.
    #[arg(long = "rpc_port")]
    rpc_port: Option<u16>,
    /// Threads serving gRPC and the admin port [default: 2].
    #[arg(long = "rpc_thread_num")]
    rpc_thread_num: Option<usize>,
    /// Threads serving gRPC (mooncake_master's deprecated spelling of --rpc_thread_num).
    #[arg(long = "max_threads")]
    max_threads: Option<usize>,
    /// Set TCP_NODELAY on clients' connections [default: true].
    #[arg(long = "rpc_enable_tcp_no_delay", value_parser = gflags_bool, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    rpc_enable_tcp_no_delay: Option<bool>,
    /// Port of the fast RPC wire for Crescent's clients' hot calls, on the gRPC address's host:
    /// 0 picks a free one (pings advertise it), -1 serves gRPC only [default: 0].
    #[arg(long = "fast_rpc_port", allow_negative_numbers = true, value_parser = clap::value_parser!(i32).range(-1..=65535))]
    fast_rpc_port: Option<i32>,
    /// HTTP admin listen address for /metrics, /health, /query_key, /get_all_keys,
    /// /get_all_segments, /keys, /segments; "" disables [default: 0.0.0.0:9003].
    #[arg(long, visible_alias = "admin_address")]
    admin_address: Option<String>,
    /// Admin port (mooncake_master's name for it).
    #[arg(long = "metrics_port")]
    metrics_port: Option<u16>,
    /// Admin host (mooncake_master's name for it; "::" for IPv6).
    #[arg(long = "metrics_host")]
    metrics_host: Option<String>,
    /// Log a summary of the metrics every 10 s [default: true].
    #[arg(long = "enable_metric_reporting", value_parser = gflags_bool, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    enable_metric_reporting: Option<bool>,
    /// Where replicas go [default: local-first: the writer's own segment when it has room].
    #[arg(long, value_enum, visible_alias = "allocation_strategy")]
    allocation_strategy: Option<AllocationStrategy>,
    /// Read lease length in milliseconds [default: 10000].
    #[arg(long)]
    lease_ttl_ms: Option<u64>,
    /// Read lease length: milliseconds, or a number with ms, s, m or h (mooncake_master's flag).
    #[arg(long = "default_kv_lease_ttl", value_parser = duration_flag)]
    default_kv_lease_ttl: Option<Duration>,
    /// Soft pin length in milliseconds for puts that ask for a soft pin without their own [default: 1800000].
    #[arg(long)]
    default_soft_pin_ttl_ms: Option<u64>,
    /// Default soft pin length: milliseconds, or with ms, s, m or h (mooncake_master's flag).
    #[arg(long = "default_kv_soft_pin_ttl", value_parser = duration_flag)]
    default_kv_soft_pin_ttl: Option<Duration>,
    /// Drop a client silent for this many milliseconds [default: 10000].
    #[arg(long)]
    client_ttl_ms: Option<u64>,
    /// Drop a client silent for this many seconds (mooncake_master's flag).
    #[arg(long = "client_ttl")]
    client_ttl: Option<u64>,
    /// Reclaim a put not ended within this many milliseconds [default: 60000].
    #[arg(long)]
    put_timeout_ms: Option<u64>,
    /// Take back a blank (a placement granted to a client ahead of its puts) not used within
    /// this many milliseconds; 0: no blanks [default: 10000].
    #[arg(long)]
    blank_ttl_ms: Option<u64>,
    /// Reclaim a put not ended within this many seconds (mooncake_master's flag).
    #[arg(long = "put_start_discard_timeout_sec")]
    put_start_discard_timeout_sec: Option<u64>,
    /// Fail a replica task its client has not taken within this many seconds; 0: never
    /// [default: 300] (mooncake_master's flag).
    #[arg(long = "pending_task_timeout_sec")]
    pending_task_timeout_sec: Option<u64>,
    /// Fail a replica task its client has not reported within this many seconds; 0: never
    /// [default: 300] (mooncake_master's flag).
    #[arg(long = "processing_task_timeout_sec")]
    processing_task_timeout_sec: Option<u64>,
    /// Most replica tasks waiting for their clients [default: 10000] (mooncake_master's flag).
    #[arg(long = "max_total_pending_tasks")]
    max_total_pending_tasks: Option<usize>,
    /// Finished replica tasks kept for query_task [default: 10000] (mooncake_master's flag).
    #[arg(long = "max_total_finished_tasks")]
    max_total_finished_tasks: Option<usize>,
    /// Start evicting above this share of capacity [default: 0.90].
    #[arg(long, visible_alias = "eviction_high_watermark_ratio")]
    eviction_high_watermark: Option<f64>,
    /// Share of capacity one eviction frees [default: 0.05].
    #[arg(long, visible_alias = "eviction_ratio")]
    eviction_ratio: Option<f64>,
    /// How much nicer than the master its evictor thread runs, 0 to 19: above 0, eviction
    /// rounds yield the cores to the calls [default: 0].
    #[arg(long)]
    evictor_nice: Option<i32>,
    /// The share of one core an eviction round takes while memory is not tight, in (0, 1]; a
    /// round that a put is waiting for, or above halfway from the watermark to full, runs at
    /// full speed [default: 0.25].
    #[arg(long)]
    evictor_duty: Option<f64>,
    /// Hot-key policy: keys read faster than this (reads/s) get one more replica through a
    /// client's warm-up worker; 0 turns it off [default: 0].
    #[arg(long)]
    hot_read_threshold: Option<f64>,
    /// Most replicas the hot-key policy gives an object [default: 3].
    #[arg(long)]
    hot_max_replicas: Option<u32>,
    /// Events kept for a subscriber that falls behind [default: 65536].
    #[arg(long)]
    event_buffer: Option<usize>,
    /// Directory for what must outlive a restart of the master: removals of objects whose disk
    /// copies sit on clients that are away [default: none, kept in memory].
    #[arg(long, visible_alias = "state_dir")]
    state_dir: Option<PathBuf>,
    /// The most memory the objects' metadata may take, e.g. 8G: beyond it puts evict the least
    /// recently used objects, or are refused with NO_SPACE [default: half the machine's memory].
    #[arg(long, value_parser = size_flag)]
    max_metadata_bytes: Option<u64>,
    /// File holding the cluster secret (one line; two during a rotation): every gRPC call and
    /// admin request must then carry its token [default: CRESCENT_CLUSTER_SECRET_FILE, else
    /// CRESCENT_CLUSTER_SECRET and CRESCENT_CLUSTER_SECRET_NEXT, else none: open].
    #[arg(long, visible_alias = "cluster_secret_file")]
    cluster_secret_file: Option<PathBuf>,
    /// With a cluster secret, leave the admin port's read-only routes (/metrics, /query_key,
    /// /get_all_*, /keys, /segments, /query, /prefix, /nodes) open to requests without the token.
    #[arg(long, visible_alias = "admin_open_reads", value_parser = gflags_bool, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    admin_open_reads: Option<bool>,
    /// Serve an http metadata server (GET/PUT/DELETE /metadata?key=) in this process.
    #[arg(long = "enable_http_metadata_server", value_parser = gflags_bool, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    enable_http_metadata_server: Option<bool>,
    /// Its host [default: 0.0.0.0].
    #[arg(long = "http_metadata_server_host")]
    http_metadata_server_host: Option<String>,
    /// Its port [default: 8080].
    #[arg(long = "http_metadata_server_port")]
    http_metadata_server_port: Option<u16>,
    /// The cluster this master serves [default: mooncake_cluster].
    #[arg(long = "cluster_id")]
    cluster_id: Option<String>,
    /// High availability: campaign for leadership in etcd (docs/src/ha.md); other backends are refused.
    #[arg(long = "enable_ha", value_parser = gflags_bool, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    enable_ha: Option<bool>,
    /// HA backend: etcd, redis or k8s [default: etcd].
    #[arg(long = "ha_backend_type")]
    ha_backend_type: Option<String>,
    /// HA backend endpoints (etcd: host:port;host:port).
    #[arg(long = "ha_backend_connstring")]
    ha_backend_connstring: Option<String>,
    /// etcd endpoints, used for HA when --ha_backend_connstring is unset and the backend is etcd.
    #[arg(long = "etcd_endpoints")]
    etcd_endpoints: Option<String>,
    /// HA's metadata op log: needs --enable_ha (Crescent rebuilds from its clients instead; accepted and ignored).
    #[arg(long = "enable_oplog", value_parser = gflags_bool, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    enable_oplog: Option<bool>,
    /// Allocator of segments: offset (Crescent's) or cachelib (accepted; Crescent uses offset).
    #[arg(long = "memory_allocator")]
    memory_allocator: Option<String>,
    /// Log verbosity as glog's -v: 1 logs debug lines, 2 and more trace lines (RUST_LOG wins).
    #[arg(long)]
    v: Option<i32>,
}

/// What the command line asks for.
#[derive(Debug)]
pub struct Settings {
    /// The master's configuration: defaults, then the config file, then the flags.
    pub config: MasterConfig,
    /// Log a metrics summary every [`METRIC_REPORT_INTERVAL`].
    pub metric_reporting: bool,
    /// glog's `-v`, when given.
    pub verbosity: Option<i32>,
    /// Upstream flags given that Crescent does not implement (named in one warning).
    pub ignored: Vec<String>,
    /// Warnings to log once logging is set up.
    pub warnings: Vec<String>,
}

/// A bad command line: the message to print, and whether it is a request for help/version.
#[derive(Debug)]
pub enum CliError {
    /// What clap made of the arguments: an unknown or malformed flag, or `--help` / `--version`.
    Clap(clap::Error),
    /// A flag's value that parses but cannot be used; the message names the flag.
    Invalid(String),
}

impl std::fmt::Display for CliError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CliError::Clap(e) => write!(f, "{e}"),
            CliError::Invalid(m) => write!(f, "{m}"),
        }
    }
}

impl From<clap::Error> for CliError {
    fn from(e: clap::Error) -> Self {
        CliError::Clap(e)
    }
}

pub(crate) fn invalid(m: impl Into<String>) -> CliError {
    CliError::Invalid(m.into())
}

/// gflags' booleans: true/false, 1/0, yes/no, t/f, y/n, any case.
pub(crate) fn gflags_bool(v: &str) -> Result<bool, String> {
    match v.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "t" | "y" => Ok(true),
        "false" | "0" | "no" | "f" | "n" => Ok(false),
        _ => Err(format!("{v:?} is not a boolean (true, false, 1, 0, yes, no)")),
    }
}

/// A size flag: bytes, or with K, M, G or T.
fn size_flag(v: &str) -> Result<u64, String> {
    crescent_engine::parse_size(v)
}

/// Upstream's durations (`ParseDurationMs`): a non-negative integer of milliseconds, or with a
/// unit `ms`, `s`, `m` or `h` (any case, blanks allowed around it).
pub fn duration_flag(v: &str) -> Result<Duration, String> {
    let t = v.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    if digits == 0 {
        return Err(format!("{v:?} is not a duration (milliseconds, or a number with ms, s, m or h)"));
    }
    let n: u64 = t[..digits].parse().map_err(|_| format!("{v:?} is too large"))?;
    let unit = match t[digits..].trim().to_ascii_lowercase().as_str() {
        "" | "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        u => return Err(format!("{v:?}: unknown unit {u:?} (use ms, s, m or h)")),
    };
    n.checked_mul(unit).map(Duration::from_millis).ok_or_else(|| format!("{v:?} is too large"))
}

/// The parser: Crescent's flags, the honoured upstream ones, and [`IGNORED`] (hidden).
fn command(bin: &str) -> Command {
    // Built once: building checks the whole definition (clap's debug assertions compare every
    // pair of arguments), which costs more than parsing a command line.
    static BUILT: std::sync::OnceLock<Command> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let mut cmd = Cli::command();
            for f in IGNORED {
                cmd = cmd.arg(ignored_arg(f));
            }
            cmd.build();
            cmd
        })
        .clone()
        .bin_name(bin.to_string())
}

fn given(m: &ArgMatches, id: &str) -> bool {
    matches!(m.value_source(id), Some(ValueSource::CommandLine))
}

/// `host` and `port` as a listen address (brackets around an IPv6 address).
fn host_port(host: &str, port: u16) -> String {
    match host.parse::<IpAddr>() {
        Ok(IpAddr::V6(ip)) => format!("[{ip}]:{port}"),
        _ => format!("{host}:{port}"),
    }
}

/// An address as `(host, port)`: `host:port`, `[v6]:port`, or a bare host (`None` port).
fn split_address(a: &str) -> (String, Option<u16>) {
    if let Ok(sa) = a.parse::<std::net::SocketAddr>() {
        return (sa.ip().to_string(), Some(sa.port()));
    }
    if a.parse::<IpAddr>().is_ok() {
        return (a.to_string(), None);
    }
    match a.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => match p.parse() {
            Ok(p) => (h.to_string(), Some(p)),
            Err(_) => (a.to_string(), None),
        },
        _ => (a.trim_start_matches('[').trim_end_matches(']').to_string(), None),
    }
}

/// Parses a command line (`args[0]` the program) into the master's settings.
pub fn parse<I, T>(args: I) -> Result<Settings, CliError>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString>,
{
    let mut args: Vec<String> = args.into_iter().map(|a| a.into().to_string_lossy().into_owned()).collect();
    let bin = args
        .first()
        .map(|a| Path::new(a).file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_else(|| a.clone()))
        .unwrap_or_else(|| "crescent-master".into());
    let rest = if args.is_empty() { Vec::new() } else { args.split_off(1) };
    let cmd = command(&bin);
    let known = long_flags(&cmd);
    let line = normalize(rest, &known, 0)?;
    let first = cmd.clone().try_get_matches_from(std::iter::once(bin.clone()).chain(line.iter().cloned()))?;
    // Upstream's config file: its values go first, so the command line overrides them.
    let mut full = vec![bin.clone()];
    if let Some(path) = first.get_one::<PathBuf>("config_path") {
        full.extend(config_path_args(path, &known)?);
    }
    full.extend(line);
    let m = cmd.try_get_matches_from(full)?;
    let cli = Cli::from_arg_matches(&m)?;
    settings(cli, &m)
}

/// Overrides `field` with a flag's value where the flag was given.
fn set<T>(field: &mut T, flag: Option<T>) {
    if let Some(v) = flag {
        *field = v;
    }
}

fn settings(cli: Cli, m: &ArgMatches) -> Result<Settings, CliError> {
    if cli.config.is_some() && cli.config_path.is_some() {
        return Err(invalid("--config (Crescent's JSON) and --config_path (mooncake_master's) exclude each other"));
    }
    let mut config = match &cli.config {
        Some(path) => {
            let text =
                std::fs::read_to_string(path).map_err(|e| invalid(format!("cannot read {}: {e}", path.display())))?;
            config_file(&path.display().to_string(), &text)?
        }
        None => MasterConfig::default(),
    };
    let mut warnings = Vec::new();
    let ms = Duration::from_millis;

    // gRPC address: Crescent's host:port, or upstream's host with --rpc_port / --port.
    let (mut host, mut port) = split_address(&config.rpc_address);
    if let Some(a) = &cli.rpc_address {
        let (h, p) = split_address(a);
        host = h;
        if p.is_some() {
            port = p;
        }
    }
    match (cli.rpc_port.filter(|p| *p > 0), cli.port) {
        (Some(p), other) => {
            if other.is_some() {
                warnings.push(format!("both --rpc_port and --port are set: using --rpc_port={p}"));
            }
            port = Some(p);
        }
        (None, Some(p)) => port = Some(p),
        (None, None) => {}
    }
    config.rpc_address = host_port(&host, port.unwrap_or(50051));

    match (cli.rpc_thread_num.filter(|n| *n > 0), cli.max_threads) {
        (Some(n), _) => config.rpc_threads = n,
        (None, Some(n)) => config.rpc_threads = n.min(std::thread::available_parallelism().map_or(n, |p| p.get())),
        (None, None) => {}
    }
    set(&mut config.rpc_tcp_nodelay, cli.rpc_enable_tcp_no_delay);
    if let Some(port) = cli.fast_rpc_port {
        config.fast_rpc_port = u16::try_from(port).ok();
    }

    // Admin port: Crescent's --admin-address, then upstream's --metrics_host / --metrics_port.
    set(&mut config.admin_address, cli.admin_address);
    if cli.metrics_host.is_some() || cli.metrics_port.is_some() {
        let (h, p) = if config.admin_address.is_empty() {
            ("0.0.0.0".to_string(), Some(9003))
        } else {
            split_address(&config.admin_address)
        };
        let h = cli.metrics_host.clone().unwrap_or(h);
        config.admin_address = host_port(&h, cli.metrics_port.or(p).unwrap_or(9003));
    }

    set(&mut config.allocation_strategy, cli.allocation_strategy);
    set(&mut config.lease_ttl, cli.lease_ttl_ms.map(ms));
    set(&mut config.lease_ttl, cli.default_kv_lease_ttl);
    set(&mut config.default_soft_pin_ttl, cli.default_soft_pin_ttl_ms.map(ms));
    set(&mut config.default_soft_pin_ttl, cli.default_kv_soft_pin_ttl);
    set(&mut config.client_ttl, cli.client_ttl_ms.map(ms));
    set(&mut config.client_ttl, cli.client_ttl.map(Duration::from_secs));
    set(&mut config.put_timeout, cli.put_timeout_ms.map(ms));
    set(&mut config.blank_ttl, cli.blank_ttl_ms.map(ms));
    set(&mut config.put_timeout, cli.put_start_discard_timeout_sec.map(Duration::from_secs));
    set(&mut config.task_pending_timeout, cli.pending_task_timeout_sec.map(Duration::from_secs));
    set(&mut config.task_processing_timeout, cli.processing_task_timeout_sec.map(Duration::from_secs));
    set(&mut config.max_pending_tasks, cli.max_total_pending_tasks);
    set(&mut config.max_finished_tasks, cli.max_total_finished_tasks);
    set(&mut config.eviction_high_watermark, cli.eviction_high_watermark);
    set(&mut config.eviction_ratio, cli.eviction_ratio);
    set(&mut config.evictor_nice, cli.evictor_nice);
    set(&mut config.evictor_duty, cli.evictor_duty);
    set(&mut config.hot_read_threshold, cli.hot_read_threshold);
    set(&mut config.hot_max_replicas, cli.hot_max_replicas);
    set(&mut config.event_buffer, cli.event_buffer);
    set(&mut config.cluster_secret_file, cli.cluster_secret_file.map(Some));
    set(&mut config.admin_open_reads, cli.admin_open_reads);
    set(&mut config.state_dir, cli.state_dir.map(Some));
    set(&mut config.max_metadata_bytes, cli.max_metadata_bytes.map(Some));

    // The embedded http metadata server (upstream's defaults: 0.0.0.0:8080).
    if cli.enable_http_metadata_server == Some(true) {
        let host = cli.http_metadata_server_host.as_deref().unwrap_or("0.0.0.0");
        config.http_metadata_address = host_port(host, cli.http_metadata_server_port.unwrap_or(8080));
    } else if cli.http_metadata_server_host.is_some() || cli.http_metadata_server_port.is_some() {
        warnings.push(
            "--http_metadata_server_host/port are set but --enable_http_metadata_server is not: no metadata server"
                .into(),
        );
    }
    set(&mut config.cluster_id, cli.cluster_id);

    // HA: accepted and checked as upstream does; enabling it is refused by `validate` below.
    set(&mut config.ha.backend_type, cli.ha_backend_type);
    set(&mut config.ha.enabled, cli.enable_ha);
    let etcd = cli.etcd_endpoints.unwrap_or_default();
    let conn = cli.ha_backend_connstring.unwrap_or_default();
    if !conn.is_empty() && !etcd.is_empty() && conn != etcd {
        warnings.push(format!(
            "both --ha_backend_connstring and --etcd_endpoints are set: using --ha_backend_connstring={conn}"
        ));
    }
    config.ha.connstring = if !conn.is_empty() {
        conn
    } else if config.ha.backend_type == "etcd" {
        etcd.clone()
    } else {
        String::new()
    };
    if !config.ha.enabled && (!config.ha.connstring.is_empty() || !etcd.is_empty()) {
        warnings.push("an HA backend is set but --enable_ha is not: it is not used".into());
    }
    if cli.enable_oplog == Some(true) && !config.ha.enabled {
        return Err(invalid("--enable_oplog needs --enable_ha"));
    }
    if cli.enable_oplog == Some(true) {
        warnings.push("--enable_oplog: no op log is kept; a new leader is rebuilt from its clients' reports".into());
    }
    let mut ignored: Vec<String> = IGNORED.iter().filter(|f| given(m, f.name)).map(|f| f.name.to_string()).collect();
    match cli.memory_allocator.as_deref() {
        None | Some("offset") => {}
        Some("cachelib") => ignored.push("memory_allocator=cachelib (Crescent's allocator is offset)".into()),
        Some(other) => return Err(invalid(format!("--memory_allocator={other}: must be offset or cachelib"))),
    }
    config.validate().map_err(|e| invalid(e.to_string()))?;
    Ok(Settings {
        config,
        metric_reporting: cli.enable_metric_reporting.unwrap_or(true),
        verbosity: cli.v,
        ignored,
        warnings,
    })
}

/// `RUST_LOG` if set, else Mooncake's `MC_LOG_LEVEL`, else glog's `-v` (1: debug, 2: trace),
/// else info; then the environment's Mooncake variables this master ignores, named once.
fn init_logging(verbosity: Option<i32>) {
    let default = match verbosity {
        Some(v) if v >= 2 => "trace",
        Some(1) => "debug",
        _ => "info",
    };
    let (directives, warning) = match verbosity {
        Some(v) if v >= 1 && std::env::var_os("RUST_LOG").is_none() => (default.to_string(), None),
        _ => crescent_engine::env_vars::log_filter_or(default),
    };
    crate::logging::install(&directives, default, warning);
    crescent_engine::env_vars::check_environment();
}

/// The binaries' `main`: parses the command line, runs the master until SIGINT/SIGTERM.
/// Exit codes: 0 after a signal, 2 for a bad command line, 1 when the master cannot start.
pub fn main() -> ! {
    let bin = bin_name("crescent-master");
    let settings = parsed_or_exit(&bin, parse(std::env::args_os()));
    init_logging(settings.verbosity);
    if let Err(e) = run(settings) {
        eprintln!("{bin}: error: {e}");
        std::process::exit(1);
    }
    std::process::exit(0)
}

/// The name this binary was started under (its file name), else `default`.
pub(crate) fn bin_name(default: &str) -> String {
    let bin = std::env::args().next().unwrap_or_else(|| default.into());
    Path::new(&bin).file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or(bin)
}

/// The parsed command line, or the process ends: clap's own exit for `--help`, `--version`
/// and its errors, exit code 2 with the message for the others.
pub(crate) fn parsed_or_exit<S>(bin: &str, parsed: Result<S, CliError>) -> S {
    match parsed {
        Ok(s) => s,
        Err(CliError::Clap(e)) => e.exit(),
        Err(CliError::Invalid(m)) => {
            eprintln!("{bin}: error: {m}");
            std::process::exit(2);
        }
    }
}

fn run(settings: Settings) -> anyhow::Result<()> {
    for w in &settings.warnings {
        tracing::warn!("{w}");
    }
    if !settings.ignored.is_empty() {
        tracing::warn!(
            "mooncake_master flags Crescent does not implement, accepted and ignored: --{}",
            settings.ignored.join(", --")
        );
    }
    let handle = server::start(settings.config)?;
    println!("master: {}", handle.client_address());
    if let Some(a) = handle.admin_addr {
        println!("admin: http://{a}/metrics");
    }
    if let Some(s) = &handle.metadata_server {
        println!("metadata server: {}", s.url());
    }
    let term = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, term.clone())?;
    }
    let mut last_report = std::time::Instant::now();
    while !term.load(std::sync::atomic::Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
        if settings.metric_reporting && last_report.elapsed() >= METRIC_REPORT_INTERVAL {
            last_report = std::time::Instant::now();
            tracing::info!("master metrics: {}", handle.master.summary());
        }
    }
    tracing::info!("stopping");
    handle.shutdown();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_ok(args: &[&str]) -> Settings {
        let mut v = vec!["mooncake_master"];
        v.extend_from_slice(args);
        parse(v).unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    fn parse_err(args: &[&str]) -> String {
        let mut v = vec!["mooncake_master"];
        v.extend_from_slice(args);
        match parse(v) {
            Ok(s) => panic!("{args:?} accepted: {s:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn the_fast_rpc_port_is_a_free_one_by_default_a_given_one_or_none() {
        assert_eq!(parse_ok(&[]).config.fast_rpc_port, Some(0));
        assert_eq!(parse_ok(&["--fast_rpc_port=7051"]).config.fast_rpc_port, Some(7051));
        assert_eq!(parse_ok(&["--fast_rpc_port", "-1"]).config.fast_rpc_port, None);
        assert_eq!(parse_ok(&["--fast_rpc_port=-1"]).config.fast_rpc_port, None);
        parse_err(&["--fast_rpc_port=70000"]);
        parse_err(&["--fast_rpc_port=-2"]);
    }

    #[test]
    fn upstream_flags_in_every_gflags_spelling_set_the_config() {
        let s = parse_ok(&[
            "--port=50061",
            "-rpc_address",
            "127.0.0.1",
            "--default_kv_lease_ttl=5s",
            "--default_kv_soft_pin_ttl",
            "2m",
            "-eviction_high_watermark_ratio=0.8",
            "--eviction_ratio=0.2",
            "--client_ttl=30",
            "--metrics_port=9013",
            "--rpc_thread_num=3",
            "--norpc_enable_tcp_no_delay",
            "--enable_metric_reporting=false",
            "--allocation_strategy=random",
            "--cluster_id=c1",
            "--put_start_discard_timeout_sec=40",
        ]);
        let c = &s.config;
        assert_eq!(c.rpc_address, "127.0.0.1:50061");
        assert_eq!(c.lease_ttl, Duration::from_secs(5));
        assert_eq!(c.default_soft_pin_ttl, Duration::from_secs(120));
        assert_eq!((c.eviction_high_watermark, c.eviction_ratio), (0.8, 0.2));
        assert_eq!(c.client_ttl, Duration::from_secs(30), "--client_ttl is in seconds, as upstream");
        assert_eq!(c.admin_address, "0.0.0.0:9013");
        assert_eq!(c.rpc_threads, 3);
        assert!(!c.rpc_tcp_nodelay);
        assert!(!s.metric_reporting);
        assert_eq!(c.allocation_strategy, AllocationStrategy::Random);
        assert_eq!(c.cluster_id, "c1");
        assert_eq!(c.put_timeout, Duration::from_secs(40));
        assert!(s.ignored.is_empty(), "{:?}", s.ignored);
    }

    #[test]
    fn rpc_port_wins_over_port_and_durations_take_plain_milliseconds() {
        let s = parse_ok(&["--port=1", "--rpc_port=50070", "--default_kv_lease_ttl=2500", "--rpc_address=::1"]);
        assert_eq!(s.config.rpc_address, "[::1]:50070");
        assert_eq!(s.config.lease_ttl, Duration::from_millis(2500));
        assert_eq!(s.warnings.len(), 1, "{:?}", s.warnings);
    }

    #[test]
    fn crescents_own_flags_keep_working() {
        let s = parse_ok(&[
            "--rpc-address",
            "127.0.0.1:0",
            "--admin-address",
            "",
            "--lease-ttl-ms",
            "700",
            "--client-ttl-ms",
            "1500",
            "--eviction-high-watermark",
            "0.5",
            "--allocation-strategy",
            "free-ratio-first",
        ]);
        let c = &s.config;
        assert_eq!((c.rpc_address.as_str(), c.admin_address.as_str()), ("127.0.0.1:0", ""));
        assert_eq!((c.lease_ttl, c.client_ttl), (Duration::from_millis(700), Duration::from_millis(1500)));
        assert_eq!(c.eviction_high_watermark, 0.5);
        assert_eq!(c.allocation_strategy, AllocationStrategy::FreeRatioFirst);
    }

    #[test]
    fn flags_without_a_crescent_feature_are_accepted_checked_and_named() {
        let s = parse_ok(&["--enable_snapshot", "--snapshot_interval_seconds=60", "-v=1", "--nopromotion_on_hit"]);
        assert_eq!(s.ignored, vec!["promotion_on_hit", "enable_snapshot", "snapshot_interval_seconds"]);
        assert_eq!(s.verbosity, Some(1));
        let e = parse_err(&["--snapshot_interval_seconds=soon"]);
        assert!(e.contains("snapshot_interval_seconds") && e.contains("soon"), "{e}");
    }

    #[test]
    fn bad_flags_are_errors_that_name_them() {
        for (args, named) in [
            (&["--no_such_flag=1"][..], "no_such_flag"),
            (&["-bogus"][..], "bogus"),
            (&["--default_kv_lease_ttl=5d"][..], "5d"),
            (&["--eviction_ratio=lots"][..], "lots"),
            (&["--enable_ha=maybe"][..], "maybe"),
            (&["--port=70000"][..], "70000"),
            (&["--memory_allocator=jemalloc"][..], "jemalloc"),
            (&["--ha_backend_type=zookeeper"][..], "zookeeper"),
            (&["--eviction_high_watermark_ratio=1.5"][..], "1.5"),
        ] {
            let e = parse_err(args);
            assert!(e.contains(named), "{args:?}: {e}");
        }
    }

    #[test]
    fn a_config_file_is_checked_as_the_parse_reads_it() {
        let ok = r#"{"rpc_port": 50052, "default_kv_lease_ttl": "5s", "eviction_ratio": 0.1, "enable_ha": false}"#;
        check_config_file(ConfigFormat::Mooncake, ok).expect("upstream's keys and values");
        for (text, named) in [
            (r#"{"no_such_key": 1}"#, "no_such_key"),
            (r#"{"eviction_ratio": "lots"}"#, "lots"),
            (r#"{"default_kv_lease_ttl": "5d"}"#, "5d"),
            (r#"{"rpc_port": 70000}"#, "70000"),
            (r#"{"enable_ha": "maybe"}"#, "maybe"),
            (r#"[1, 2]"#, "not a JSON object"),
        ] {
            let e = check_config_file(ConfigFormat::Mooncake, text).expect_err(text).to_string();
            assert!(e.contains(named), "{text}: {e}");
            // The parse refuses the same file for the same reason.
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("m.json");
            std::fs::write(&path, text).unwrap();
            let p = parse_err(&[&format!("--config_path={}", path.display())]);
            assert!(p.contains(named), "{text}: {p}");
        }
        check_config_file(ConfigFormat::Crescent, r#"{"lease_ttl_ms": 2000}"#).expect("Crescent's keys");
        let e = check_config_file(ConfigFormat::Crescent, r#"{"eviction_high_watermark": 1.5}"#).unwrap_err();
        assert!(e.to_string().contains("watermark"), "{e}");
    }

    #[test]
    fn ha_is_checked_as_upstream_and_only_etcd_runs() {
        let e = parse_err(&["--enable_ha"]);
        assert!(e.contains("ha_backend_connstring"), "no endpoints: {e}");
        let s = parse_ok(&["--enable_ha=true", "--etcd_endpoints=127.0.0.1:2379;127.0.0.2:2379", "--cluster_id=prod"]);
        assert!(s.config.ha.enabled && s.config.ha.connstring == "127.0.0.1:2379;127.0.0.2:2379");
        assert_eq!(s.config.cluster_id, "prod");
        let e = parse_err(&["--enable_ha", "--ha_backend_type=k8s", "--ha_backend_connstring=k8s://x"]);
        assert!(e.contains("not supported"), "{e}");
        let e = parse_err(&["--enable_ha", "--ha_backend_type=redis", "--etcd_endpoints=127.0.0.1:2379"]);
        assert!(e.contains("redis has none"), "etcd_endpoints serves etcd only: {e}");
        let e = parse_err(&["--enable_oplog"]);
        assert!(e.contains("enable_ha"), "{e}");
        let s = parse_ok(&["--enable_ha=false", "--etcd_endpoints=127.0.0.1:2379", "--cluster_id=prod"]);
        assert!(!s.config.ha.enabled);
        assert!(s.warnings.iter().any(|w| w.contains("not used")), "{:?}", s.warnings);
    }

    #[test]
    fn the_http_metadata_server_takes_upstreams_defaults() {
        let s = parse_ok(&["--enable_http_metadata_server=true"]);
        assert_eq!(s.config.http_metadata_address, "0.0.0.0:8080");
        let s = parse_ok(&[
            "--enable_http_metadata_server",
            "--http_metadata_server_port=0",
            "--http_metadata_server_host=127.0.0.1",
        ]);
        assert_eq!(s.config.http_metadata_address, "127.0.0.1:0");
        assert_eq!(parse_ok(&[]).config.http_metadata_address, "");
    }

    #[test]
    fn config_path_and_flagfile_are_read_and_the_command_line_wins() {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("master.json");
        std::fs::write(
            &conf,
            r#"{"rpc_port": 50099, "default_kv_lease_ttl": "3s", "client_live_ttl_sec": 20, "eviction_ratio": 0.3}"#,
        )
        .unwrap();
        let flags = dir.path().join("flags");
        std::fs::write(&flags, "# a comment\n--eviction_high_watermark_ratio=0.7\n-enable_snapshot\n").unwrap();
        let s = parse_ok(&[
            &format!("--config_path={}", conf.display()),
            &format!("--flagfile={}", flags.display()),
            "--eviction_ratio=0.4",
        ]);
        let c = &s.config;
        assert_eq!(c.rpc_address, "0.0.0.0:50099");
        assert_eq!(c.lease_ttl, Duration::from_secs(3));
        assert_eq!(c.client_ttl, Duration::from_secs(20));
        assert_eq!(c.eviction_ratio, 0.4, "the command line overrides the file");
        assert_eq!(c.eviction_high_watermark, 0.7);
        assert_eq!(s.ignored, vec!["enable_snapshot"]);
        std::fs::write(&conf, r#"{"no_such_setting": 1}"#).unwrap();
        let e = parse_err(&[&format!("--config_path={}", conf.display())]);
        assert!(e.contains("no_such_setting"), "{e}");
    }

    #[test]
    fn durations_parse_as_upstreams() {
        for (text, ms) in
            [("0", 0), ("10000", 10_000), ("250ms", 250), (" 5 S ", 5000), ("2m", 120_000), ("1h", 3_600_000)]
        {
            assert_eq!(duration_flag(text), Ok(Duration::from_millis(ms)), "{text:?}");
        }
        for bad in ["", "s", "-1", "1.5s", "3d", "99999999999999999999"] {
            assert!(duration_flag(bad).is_err(), "{bad:?}");
        }
    }
}
