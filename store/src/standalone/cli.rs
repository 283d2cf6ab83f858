//! The command line of `crescent-client` and its alias `mooncake_client`: upstream's
//! `mooncake_client` flags (kvcache-ai/Mooncake `mooncake-store/src/real_client_main.cpp`, in
//! any gflags spelling: `--flag=value`, `--flag value`, `-flag=value`, `--noflag`,
//! `--flagfile=FILE`) and Crescent's own.
//!
//! The client's settings start from the environment and `MOONCAKE_CONFIG_PATH` as for any
//! client ([`ClientConfig::from_env`]); flags override them.

use std::path::PathBuf;
use std::time::Duration;

use clap::{CommandFactory, FromArgMatches, Parser};

use super::{Access, StandaloneServer};
use crate::client::config::parse_protocol;
use crate::client::dummy::frame::{self, Address};
use crate::master::cli::{bin_name, gflags_bool, invalid, long_flags, normalize, parsed_or_exit, CliError};
use crate::{ClientConfig, StoreApi, StoreClient};

#[derive(Parser, Debug)]
#[command(
    name = "crescent-client",
    version,
    about = "Crescent's standalone store client: owns the segment, the engine and the disk tier; worker \
             processes on this host attach with setup_dummy() and use the whole store API",
    args_override_self = true
)]
struct Cli {
    /// Address peers reach this client's engine at (a host, or host:port for the engine's
    /// port); 0.0.0.0: found by itself.
    #[arg(long, default_value = "0.0.0.0")]
    host: String,
    /// Metadata service: P2PHANDSHAKE, etcd://..., redis://..., http://host:port/metadata.
    #[arg(long = "metadata_server", visible_alias = "metadata-server")]
    metadata_server: Option<String>,
    /// RDMA devices, comma-separated.
    #[arg(long = "device_names", visible_alias = "device-names")]
    device_names: Option<String>,
    /// The master, host:port.
    #[arg(long = "master_server_address", visible_alias = "master")]
    master_server_address: Option<String>,
    /// tcp, shm, rdma; default: chosen per peer.
    #[arg(long)]
    protocol: Option<String>,
    /// The service port of upstream's dummy clients: `setup_dummy(server_address="host:PORT")`
    /// finds this client at the abstract socket @crescent_client_PORT.sock.
    #[arg(long, default_value_t = 50052)]
    port: u16,
    /// Bytes contributed to the pool (e.g. "4 GB").
    #[arg(long = "global_segment_size", visible_alias = "segment-size", value_parser = crescent_engine::parse_size)]
    global_segment_size: Option<u64>,
    /// Bytes of the staging buffer for values put and got as bytes; 0: the default.
    #[arg(long = "local_buffer_size", visible_alias = "buffer-size")]
    local_buffer_size: Option<String>,
    /// Upstream's RPC threads; here every dummy client connection has a thread of its own.
    #[arg(long)]
    threads: Option<u32>,
    /// Only "default": Crescent has no tenants yet.
    #[arg(long = "tenant_id")]
    tenant_id: Option<String>,
    /// The disk tier: needs a root (--storage-root, MOONCAKE_OFFLOAD_FILE_STORAGE_PATH or
    /// MOONCAKE_STORAGE_ROOT_DIR).
    #[arg(long = "enable_offload", value_parser = gflags_bool, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    enable_offload: Option<bool>,
    /// Upstream's RPC for remote disk reads; here the disk service runs with the disk tier.
    #[arg(long = "start_offload_rpc_server", value_parser = gflags_bool, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    start_offload_rpc_server: Option<bool>,
    /// Serve the client's Prometheus metrics on --http_port.
    #[arg(long = "enable_http_server", value_parser = gflags_bool, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    enable_http_server: Option<bool>,
    #[arg(long = "http_port", default_value_t = 9300)]
    http_port: u16,
    /// Where dummy clients connect: @name (abstract socket) or a path [default:
    /// @crescent_client_<port>.sock].
    #[arg(long)]
    socket: Option<String>,
    /// Users admitted besides this process's own (by the kernel's peer credentials).
    #[arg(long = "allow-uid", value_delimiter = ',')]
    allow_uid: Vec<u32>,
    /// After a reply, how long a connection's thread polls for the worker's next request
    /// before it blocks, in µs (0: never poll; see the docs' "polling instead of wake-ups").
    #[arg(long = "request-poll-us", default_value_t = super::DEFAULT_POLL.as_micros() as u64)]
    request_poll_us: u64,
    /// The disk tier's root directory.
    #[arg(long = "storage-root")]
    storage_root: Option<PathBuf>,
}

/// What the command line asks for.
#[derive(Debug)]
pub struct Settings {
    /// The client's configuration: the environment's, with the flags applied over it.
    pub config: ClientConfig,
    /// Where to serve dummy clients (`--socket`, or the default address).
    pub socket: Address,
    /// Who may connect (`--allow-uid` besides this process's user) and how many at once.
    pub access: Access,
    /// One line per flag accepted for Mooncake's sake but ignored here, to log at start.
    pub warnings: Vec<String>,
}

/// Parses `args` (the program name first) over the environment's client settings.
pub fn parse<I, T>(args: I) -> Result<Settings, CliError>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let mut args: Vec<String> = args.into_iter().map(|a| a.into().to_string_lossy().into_owned()).collect();
    let bin = if args.is_empty() { "crescent-client".to_string() } else { args.remove(0) };
    let cmd = Cli::command().bin_name(bin.clone());
    let known = long_flags(&cmd);
    let mut argv = vec![bin];
    argv.extend(normalize(args, &known, 0)?);
    let matches = cmd.try_get_matches_from(argv)?;
    let cli = Cli::from_arg_matches(&matches)?;
    let config = ClientConfig::from_env().map_err(|e| invalid(e.to_string()))?;
    settings(cli, config)
}

fn settings(cli: Cli, mut config: ClientConfig) -> Result<Settings, CliError> {
    let mut warnings = Vec::new();
    let host = cli.host.trim();
    if !host.is_empty() && host != "0.0.0.0" {
        config.local_hostname = Some(host.to_string());
    }
    if let Some(m) = cli.metadata_server {
        config.metadata_server = m;
    }
    if let Some(d) = cli.device_names.filter(|d| !d.trim().is_empty()) {
        config.device_name = Some(d);
    }
    if let Some(m) = cli.master_server_address {
        config.master_server_address = m;
    }
    if let Some(p) = cli.protocol {
        config.protocol =
            Some(parse_protocol(&p.to_ascii_lowercase()).map_err(|e| invalid(format!("--protocol: {e}")))?);
    }
    if let Some(s) = cli.global_segment_size {
        config.global_segment_size = s;
    }
    match cli.local_buffer_size.as_deref().map(str::trim) {
        None | Some("0") => {}
        Some(s) => {
            config.local_buffer_size =
                crescent_engine::parse_size(s).map_err(|e| invalid(format!("--local_buffer_size: {e}")))?
        }
    }
    if let Some(t) = cli.threads {
        warnings
            .push(format!("--threads={t} is ignored: every dummy client connection is served by a thread of its own"));
    }
    if let Some(t) = cli.tenant_id.filter(|t| t != "default") {
        return Err(invalid(format!("--tenant_id={t:?}: Crescent has no tenants yet (only \"default\")")));
    }
    if cli.storage_root.is_some() {
        config.storage_root_dir = cli.storage_root;
    }
    if cli.enable_offload == Some(true) && config.storage_root_dir.is_none() {
        match std::env::var("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH").ok().filter(|p| !p.trim().is_empty()) {
            Some(p) => config.storage_root_dir = Some(PathBuf::from(p.trim())),
            None => {
                return Err(invalid(
                    "--enable_offload needs the disk tier's root: --storage-root, MOONCAKE_OFFLOAD_FILE_STORAGE_PATH \
                     or MOONCAKE_STORAGE_ROOT_DIR",
                ))
            }
        }
    }
    if cli.start_offload_rpc_server == Some(false) {
        warnings.push("--start_offload_rpc_server=false is ignored: the disk service runs with the disk tier".into());
    }
    if cli.enable_http_server == Some(true) {
        config.metrics_address = Some(format!("0.0.0.0:{}", cli.http_port));
    }
    let socket = match cli.socket {
        Some(s) => Address::parse(&s).map_err(|e| invalid(format!("--socket: {e}")))?,
        None => frame::default_address(cli.port),
    };
    Ok(Settings {
        config,
        socket,
        access: Access {
            uids: cli.allow_uid,
            poll: std::time::Duration::from_micros(cli.request_poll_us),
            ..Access::default()
        },
        warnings,
    })
}

/// The binaries' `main`: runs the standalone client until SIGINT/SIGTERM. Exit codes: 0 after
/// a signal, 2 for a bad command line, 1 when the client cannot start.
pub fn main() -> ! {
    let bin = bin_name("crescent-client");
    crate::logging::init_logging();
    let settings = parsed_or_exit(&bin, parse(std::env::args_os()));
    if let Err(e) = run(settings) {
        eprintln!("{bin}: error: {e:#}");
        std::process::exit(1);
    }
    std::process::exit(0)
}

fn run(settings: Settings) -> anyhow::Result<()> {
    for w in &settings.warnings {
        tracing::warn!("{w}");
    }
    let term = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, term.clone())?;
    }
    let client = StoreClient::connect(settings.config)?;
    let mut server = StandaloneServer::start(client.clone(), &settings.socket, settings.access)?;
    println!("socket: {}", server.address());
    println!("segment: {}", client.segment_name());
    if let Some(a) = client.metrics_addr() {
        println!("metrics: http://{a}/metrics");
    }
    use std::io::Write;
    std::io::stdout().flush()?;
    while !term.load(std::sync::atomic::Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
    }
    tracing::info!("stopping: dummy clients are disconnected, the segment unmounted");
    server.stop();
    client.close()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_ok(args: &[&str]) -> Settings {
        let cli =
            Cli::try_parse_from(std::iter::once("crescent-client".to_string()).chain(
                normalize(args.iter().map(|s| s.to_string()).collect(), &long_flags(&Cli::command()), 0).unwrap(),
            ))
            .unwrap();
        settings(cli, ClientConfig::default()).unwrap()
    }

    #[test]
    fn upstreams_flags_set_the_client() {
        let s = parse_ok(&[
            "--host=10.0.0.5",
            "-master_server_address=10.0.0.1:50051",
            "--metadata_server",
            "P2PHANDSHAKE",
            "--protocol=tcp",
            "--port=50099",
            "--global_segment_size=4 GB",
            "--local_buffer_size=64MB",
            "--enable_http_server",
            "--http_port=9400",
            "--threads=8",
        ]);
        assert_eq!(s.config.local_hostname.as_deref(), Some("10.0.0.5"));
        assert_eq!(s.config.master_server_address, "10.0.0.1:50051");
        assert_eq!(s.config.metadata_server, "P2PHANDSHAKE");
        assert_eq!(s.config.global_segment_size, 4 << 30);
        assert_eq!(s.config.local_buffer_size, 64 << 20);
        assert_eq!(s.config.metrics_address.as_deref(), Some("0.0.0.0:9400"));
        assert_eq!(s.socket, Address::Abstract("crescent_client_50099.sock".into()));
        assert!(s.warnings.iter().any(|w| w.contains("--threads")));
    }

    #[test]
    fn crescents_flags_and_bad_values() {
        let s = parse_ok(&["--socket=/run/crescent/client.sock", "--allow-uid=1000,1001", "--local_buffer_size=0"]);
        assert_eq!(s.socket, Address::Path("/run/crescent/client.sock".into()));
        assert_eq!(s.access.uids, vec![1000, 1001]);
        assert_eq!(s.access.poll, Access::default().poll, "the request poll's default");
        let quiet = parse_ok(&["--request-poll-us=0"]);
        assert!(quiet.access.poll.is_zero(), "0 turns the request poll off");
        assert_eq!(parse_ok(&["--request-poll-us", "200"]).access.poll, std::time::Duration::from_micros(200));
        assert_eq!(s.config.local_buffer_size, ClientConfig::default().local_buffer_size, "0: the default");
        let bad = |args: &[&str]| {
            let cli = Cli::try_parse_from(std::iter::once("c").chain(args.iter().copied()));
            cli.map_err(|e| e.to_string()).and_then(|c| settings(c, ClientConfig::default()).map_err(|e| e.to_string()))
        };
        assert!(bad(&["--tenant_id=a"]).unwrap_err().contains("tenants"));
        assert!(bad(&["--protocol=carrier-pigeon"]).is_err());
        assert!(bad(&["--no_such_flag=1"]).is_err());
        assert!(bad(&["--socket=@"]).unwrap_err().contains("abstract"));
    }
}
