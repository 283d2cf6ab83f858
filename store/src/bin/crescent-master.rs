//! crescent-master: the store's metadata service.
//!
//! ```text
//! crescent-master                                   # gRPC on 0.0.0.0:50051, admin on 0.0.0.0:9003
//! crescent-master --rpc-address 127.0.0.1:50051 --allocation-strategy local_first
//! crescent-master --config master.json              # same names as the flags, in JSON
//! ```

use std::path::PathBuf;

use clap::Parser;
use crescent_store::master::server;
use crescent_store::{AllocationStrategy, MasterConfig};

#[derive(Parser)]
#[command(
    name = "crescent-master",
    about = "Crescent store master: owns key -> replica metadata; clients contribute memory and move the bytes",
    long_about = "Crescent store master: owns key -> replica metadata (never the bytes).\n\n\
Clients mount memory segments, then put (allocate, write, commit) and get (replica list under a read \
lease, then read) objects. The master evicts least-recently-used objects above a high watermark, \
drops clients that stop sending heartbeats, and serves Prometheus metrics and JSON views on its admin port.\n\n\
Settings come from flags, which override a JSON --config file (same names, snake_case), which \
overrides the defaults shown here."
)]
struct Cli {
    /// JSON file with any of the settings below (e.g. {"rpc_address": "0.0.0.0:50051", "lease_ttl_ms": 10000}).
    #[arg(long)]
    config: Option<PathBuf>,
    /// gRPC listen address [default: 0.0.0.0:50051].
    #[arg(long, visible_alias = "rpc_address")]
    rpc_address: Option<String>,
    /// HTTP admin listen address for /metrics, /health, /query_key, /keys, /segments; "" disables [default: 0.0.0.0:9003].
    #[arg(long, visible_alias = "admin_address")]
    admin_address: Option<String>,
    /// Where replicas go [default: local-first: the writer's own segment when it has room].
    #[arg(long, value_enum, visible_alias = "allocation_strategy")]
    allocation_strategy: Option<AllocationStrategy>,
    /// Read lease length in milliseconds [default: 10000].
    #[arg(long)]
    lease_ttl_ms: Option<u64>,
    /// Soft pin length in milliseconds for puts that ask for a soft pin without their own [default: 1800000].
    #[arg(long)]
    default_soft_pin_ttl_ms: Option<u64>,
    /// Drop a client silent for this many milliseconds [default: 10000].
    #[arg(long)]
    client_ttl_ms: Option<u64>,
    /// Reclaim a put not ended within this many milliseconds [default: 60000].
    #[arg(long)]
    put_timeout_ms: Option<u64>,
    /// Start evicting above this share of capacity [default: 0.90].
    #[arg(long)]
    eviction_high_watermark: Option<f64>,
    /// Share of capacity one eviction frees [default: 0.05].
    #[arg(long)]
    eviction_ratio: Option<f64>,
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
    /// High availability: campaign for leadership in etcd; a standby until elected.
    #[arg(long, visible_alias = "enable_ha")]
    enable_ha: bool,
    /// The HA backend; only "etcd" [default: etcd].
    #[arg(long, visible_alias = "ha_backend_type")]
    ha_backend_type: Option<String>,
    /// etcd endpoints for HA, "h1:2379;h2:2379".
    #[arg(long, visible_aliases = ["etcd_endpoints", "ha_backend_connstring", "ha-backend-connstring"])]
    etcd_endpoints: Option<String>,
    /// The cluster the masters of one store share [default: default].
    #[arg(long, visible_alias = "cluster_id")]
    cluster_id: Option<String>,
    /// The leadership lease in etcd, in milliseconds (whole seconds) [default: 2000].
    #[arg(long)]
    ha_lease_ttl_ms: Option<u64>,
    /// The address clients reach this master at, written in etcd when it leads [default: the RPC address].
    #[arg(long, visible_alias = "advertise_address")]
    advertise_address: Option<String>,
}

fn main() {
    crescent_store::init_logging();
    let cli = Cli::parse();
    if let Err(e) = run(cli) {
        eprintln!("crescent-master: error: {e}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let mut config = match &cli.config {
        Some(path) => {
            let text =
                std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
            serde_json::from_str::<MasterConfig>(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
        }
        None => MasterConfig::default(),
    };
    let ms = std::time::Duration::from_millis;
    if let Some(v) = cli.rpc_address {
        config.rpc_address = v;
    }
    if let Some(v) = cli.admin_address {
        config.admin_address = v;
    }
    if let Some(v) = cli.allocation_strategy {
        config.allocation_strategy = v;
    }
    if let Some(v) = cli.lease_ttl_ms {
        config.lease_ttl = ms(v);
    }
    if let Some(v) = cli.default_soft_pin_ttl_ms {
        config.default_soft_pin_ttl = ms(v);
    }
    if let Some(v) = cli.client_ttl_ms {
        config.client_ttl = ms(v);
    }
    if let Some(v) = cli.put_timeout_ms {
        config.put_timeout = ms(v);
    }
    if let Some(v) = cli.eviction_high_watermark {
        config.eviction_high_watermark = v;
    }
    if let Some(v) = cli.eviction_ratio {
        config.eviction_ratio = v;
    }
    if let Some(v) = cli.hot_read_threshold {
        config.hot_read_threshold = v;
    }
    if let Some(v) = cli.hot_max_replicas {
        config.hot_max_replicas = v;
    }
    if let Some(v) = cli.event_buffer {
        config.event_buffer = v;
    }
    if let Some(v) = cli.state_dir {
        config.state_dir = Some(v);
    }
    if cli.enable_ha {
        config.enable_ha = true;
    }
    if let Some(v) = cli.ha_backend_type {
        anyhow::ensure!(v == "etcd", "ha_backend_type {v:?} is not supported (only \"etcd\")");
    }
    if let Some(v) = cli.etcd_endpoints {
        config.etcd_endpoints = v;
    }
    if let Some(v) = cli.cluster_id {
        config.cluster_id = v;
    }
    if let Some(v) = cli.ha_lease_ttl_ms {
        config.ha_lease_ttl = ms(v);
    }
    if let Some(v) = cli.advertise_address {
        config.advertise_address = v;
    }
    let handle = server::start(config)?;
    println!("master: {}", handle.client_address());
    if let Some(a) = handle.admin_addr {
        println!("admin: http://{a}/metrics");
    }
    let term = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, term.clone())?;
    }
    while !term.load(std::sync::atomic::Ordering::Relaxed) {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    eprintln!("crescent-master: stopping");
    handle.shutdown();
    Ok(())
}
