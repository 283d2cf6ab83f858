//! An example cache-aware scheduler: routes a request (an ordered list of KV-cache chunk keys)
//! to the node that holds the longest cached prefix in the fastest tier, discounted by load,
//! using only the master's side-effect-free gRPC queries (`PrefixQuery`, `NodeStats`,
//! `QueryKeys`) — what a scheduler in any language would call.
//!
//! ```text
//! cargo run -p crescent-store --example scheduler                  # a demo cluster in this process
//! cargo run -p crescent-store --example scheduler -- --master HOST:PORT --chunks k0,k1,k2
//! ```

use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use crescent_store::master::server;
use crescent_store::proto::master_client::MasterClient;
use crescent_store::proto::{NodeStatsRequest, QueryKeysRequest, Tier};
use crescent_store::{ClientConfig, MasterConfig, StoreApi, StoreClient};

#[derive(Parser)]
struct Cli {
    /// A running master (host:port); default: start a demo cluster in this process.
    #[arg(long)]
    master: Option<String>,
    /// The request's chunk keys, in order.
    #[arg(long, value_delimiter = ',')]
    chunks: Vec<String>,
    /// Chunks of prefill one unit of load costs (load = used share + gets/s / 100).
    #[arg(long, default_value_t = 4.0)]
    load_weight: f64,
}

/// How much of a chunk's prefill a cached copy saves, by tier (copying from slower tiers costs).
fn tier_value(t: Tier) -> f64 {
    match t {
        Tier::Vram => 1.0,
        Tier::Dram => 0.8,
        Tier::Ssd => 0.5,
        Tier::Unspecified => 0.0,
    }
}

fn main() -> Result<()> {
    crescent_store::init_logging();
    let cli = Cli::parse();
    let (_cluster, master, chunks) = match &cli.master {
        Some(m) => {
            anyhow::ensure!(!cli.chunks.is_empty(), "--chunks is needed with --master");
            (None, m.clone(), cli.chunks.clone())
        }
        None => {
            let (cluster, master, chunks) = demo_cluster()?;
            (Some(cluster), master, chunks)
        }
    };
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(route(&master, &chunks, cli.load_weight))
}

/// Master + three nodes: A holds chunks 0..8 in its DRAM segment; B's engine holds chunks
/// 0..12 in VRAM (published) but B serves many reads; C is idle and holds nothing.
/// What keeps the demo cluster running: the master and its nodes.
type Cluster = (server::MasterHandle, Vec<std::sync::Arc<StoreClient>>);

fn demo_cluster() -> Result<(Cluster, String, Vec<String>)> {
    let handle = server::start(MasterConfig {
        rpc_address: "127.0.0.1:0".into(),
        admin_address: String::new(),
        ..MasterConfig::default()
    })?;
    let addr = handle.client_address();
    let node = || {
        StoreClient::connect(ClientConfig {
            master_server_address: addr.clone(),
            local_hostname: Some("127.0.0.1".into()),
            global_segment_size: 64 << 20,
            local_buffer_size: 8 << 20,
            ..ClientConfig::default()
        })
    };
    let (a, b, c) = (node()?, node()?, node()?);
    let chunks: Vec<String> = (0..16).map(|i| format!("req-42/chunk-{i:02}")).collect();
    let chunk = vec![7u8; 256 << 10];
    for k in &chunks[..8] {
        a.put(k, &chunk)?; // local_first: in A's segment
    }
    let published: Vec<(String, u64)> = chunks[..12].iter().map(|k| (k.clone(), chunk.len() as u64)).collect();
    b.sched().publish(&published, Tier::Vram, Duration::from_secs(60))?;
    b.put("popular", &chunk)?;
    for _ in 0..2000 {
        a.get("popular")?; // B serves these reads: its get rate is its load
    }
    println!("demo cluster: master {addr}");
    println!("  node A {}: chunks 0-7 in its DRAM segment", a.id());
    println!("  node B {}: chunks 0-11 published in VRAM, serving many reads", b.id());
    println!("  node C {}: idle, nothing cached", c.id());
    Ok(((handle, vec![a, b, c]), addr, chunks))
}

async fn route(master: &str, chunks: &[String], load_weight: f64) -> Result<()> {
    let mut rpc = MasterClient::connect(format!("http://{master}")).await.context("connecting to the master")?;
    let req = QueryKeysRequest { client_id: "scheduler".into(), keys: chunks.to_vec() };
    let prefix = rpc.prefix_query(req.clone()).await?.into_inner();
    let stats = rpc.node_stats(NodeStatsRequest { client_id: "scheduler".into() }).await?.into_inner();
    let located = rpc.query_keys(req).await?.into_inner();
    let anywhere = located.items.iter().filter(|i| !i.locations.is_empty()).count();
    println!(
        "\nrequest: {} chunks; {} cached somewhere; the pool holds the first {} (any node can fetch those)",
        chunks.len(),
        anywhere,
        prefix.pool_prefix_len
    );
    println!("\n| node | host | cached prefix | VRAM | DRAM | SSD | used | gets/s | score |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let mut best: Option<(f64, String, String)> = None;
    for n in &stats.nodes {
        let p = prefix.nodes.iter().find(|p| p.client_id == n.client_id);
        let (len, vram, dram, ssd) = p.map_or((0, 0, 0, 0), |p| (p.prefix_len, p.vram, p.dram, p.ssd));
        let saved = vram as f64 * tier_value(Tier::Vram)
            + dram as f64 * tier_value(Tier::Dram)
            + ssd as f64 * tier_value(Tier::Ssd);
        let used = if n.capacity > 0 { n.used as f64 / n.capacity as f64 } else { 0.0 };
        let load = used + n.get_rate / 100.0;
        let score = saved - load_weight * load;
        println!(
            "| {} | {} | {len} | {vram} | {dram} | {ssd} | {:.0} % | {:.1} | {score:.2} |",
            short(&n.client_id),
            n.host,
            used * 100.0,
            n.get_rate
        );
        let why = format!(
            "{len} of {} leading chunks cached there ({vram} in VRAM, {dram} in DRAM, {ssd} on SSD) worth {saved:.1} \
             chunks of prefill, minus load {load:.2} x {load_weight} ({:.0} % used, {:.1} gets/s)",
            chunks.len(),
            used * 100.0,
            n.get_rate
        );
        if best.as_ref().is_none_or(|(s, _, _)| score > *s) {
            best = Some((score, n.client_id.clone(), why));
        }
    }
    match best {
        Some((score, node, why)) => println!("\nroute to node {} (score {score:.2}): {why}", short(&node)),
        None => println!("\nno node is mounted: nothing to route to"),
    }
    Ok(())
}

fn short(id: &str) -> &str {
    &id[..id.len().min(8)]
}
