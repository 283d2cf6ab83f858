//! crescent: the store's command-line tool.
//!
//! ```text
//! crescent status | top | ls | stat | get | put | rm   # an operator's view of a running cluster
//! crescent demo                       # a master and two clients on this machine: put, get, verify
//! crescent token [--tenant T | --admin] # the master's bearer token of the cluster secret
//! crescent client --master HOST:PORT  # (hidden) a long-lived client driven by commands on stdin
//! crescent dummy --server HOST:PORT   # (hidden) the same, as a dummy client of a crescent-client
//! ```
//!
//! The operator's subcommands are in [`cluster`]; the stdin harnesses the tests drive in
//! [`harness`].
// The doc comments of the clap types below are the tool's `--help` text, written for a
// terminal (`[SIZE]`, `DIR/<cluster id>/`), not as rustdoc markup.
#![allow(rustdoc::broken_intra_doc_links, rustdoc::invalid_html_tags)]

mod cluster;
mod harness;

use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use crescent_engine::parse_size;
use crescent_store::master::server;
use crescent_store::{pattern, ClientConfig, MasterConfig, StoreApi, StoreClient};

#[derive(Parser)]
#[command(
    name = "crescent",
    about = "Crescent distributed KV-cache store tool",
    after_help = "The cluster's master: --master HOST:PORT (gRPC; else master_server_address of --config or \
                  MOONCAKE_CONFIG_PATH, else MOONCAKE_MASTER), its admin port --admin HOST:PORT (else \
                  CRESCENT_MASTER_ADMIN, else the master's host at port 9003). With a cluster secret \
                  (CRESCENT_CLUSTER_SECRET_FILE), the tokens are made from it."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// One screen on the cluster: leader and term, clients, segments with capacity and use,
    /// disk tiers, keys, evictions.
    Status(cluster::status::StatusArgs),
    /// A live view of the master's rates and fills, once a second: one line per sample when
    /// stdout is not a terminal, a redrawn screen when it is.
    Top(cluster::status::TopArgs),
    /// List the keys (with a complete object), all or those under PREFIX (or matching --regex).
    Ls(cluster::keys::LsArgs),
    /// Where one key is: size, version, replicas and their tiers, its read lease.
    Stat(cluster::keys::StatArgs),
    /// Read a key's value into FILE (-o) or to stdout.
    Get(cluster::transfer::GetArgs),
    /// Store FILE (or stdin) under KEY.
    Put(cluster::transfer::PutArgs),
    /// Remove a key, or every key matching --regex.
    Rm(cluster::keys::RmArgs),
    /// Start a master and two clients on this machine, put values on one, get them on the other.
    Demo(DemoArgs),
    /// Run a client that contributes memory and executes commands read from stdin, one per line:
    /// put KEY SIZE SEED | get KEY SEED [SIZE] | exists KEY | size KEY | remove KEY |
    /// remove_regex PATTERN | batch_put SEED KEY:SIZE... | batch_get SEED KEY[:SIZE]... | query KEY |
    /// flush | disk_stats | quit. Each command answers one line: "ok ..." or "err CODE message".
    /// A get checks the bytes against the pattern of SEED, and with SIZE also the length (a
    /// truncated or over-long value is a mismatch). Test support.
    #[command(hide = true)]
    Client(harness::ClientArgs),
    /// A dummy client of a standalone client (crescent-client) on this host, driven by the
    /// commands of `client` and these zero-copy ones, on memory from the dummy client's pool
    /// (or, with `heap`, registered heap memory): put_from KEY SIZE SEED [heap] |
    /// get_into KEY SIZE SEED [heap] | get_sg KEY SEED LEN,LEN... | get_ranges KEY SEED OFF:LEN... |
    /// batch_put_from SEED KEY:SIZE... | batch_get_into SEED KEY:SIZE... | batch_exists KEY... |
    /// remove_all | spin_get_into KEY SIZE (gets in a loop, in the background, until the process
    /// ends). Test support.
    #[command(hide = true)]
    Dummy(harness::DummyArgs),
    /// Print the bearer token the master accepts, made from the cluster secret
    /// (CRESCENT_CLUSTER_SECRET_FILE, else CRESCENT_CLUSTER_SECRET): for a tenant's clients, or
    /// with --admin for the admin port (`curl -H "Authorization: Bearer $(crescent token --admin)"`).
    Token(TokenArgs),
}

#[derive(Args)]
struct TokenArgs {
    /// The tenant whose clients' token to print.
    #[arg(long, default_value = crescent_store::master::access::DEFAULT_TENANT)]
    tenant: String,
    /// The admin port's token instead.
    #[arg(long)]
    admin: bool,
    /// The secret file (default: the environment's).
    #[arg(long)]
    secret_file: Option<std::path::PathBuf>,
}

fn token(a: TokenArgs) -> Result<()> {
    use crescent_store::master::access;
    use crescent_transports::net::Keyring;
    let keyring = match &a.secret_file {
        Some(path) => Keyring::load(path)?,
        None => Keyring::from_env()?.context("no cluster secret: set CRESCENT_CLUSTER_SECRET_FILE or --secret-file")?,
    };
    if a.admin {
        println!("{}", access::admin_token(&keyring));
    } else {
        access::check_tenant(&a.tenant).map_err(anyhow::Error::msg)?;
        println!("{}", access::client_token(&keyring, &a.tenant));
    }
    Ok(())
}

#[derive(Args)]
struct DemoArgs {
    /// Bytes each client contributes.
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    segment_size: u64,
    /// Values to put, by size.
    #[arg(long, value_delimiter = ',', default_value = "1M,10M,25M", value_parser = parse_size)]
    sizes: Vec<u64>,
}

fn main() {
    crescent_store::init_tool_logging();
    let result = match Cli::parse().command {
        Command::Status(a) => cluster::status::status(a),
        Command::Top(a) => cluster::status::top(a),
        Command::Ls(a) => cluster::keys::ls(a),
        Command::Stat(a) => cluster::keys::stat(a),
        Command::Get(a) => cluster::transfer::get(a),
        Command::Put(a) => cluster::transfer::put(a),
        Command::Rm(a) => cluster::keys::rm(a),
        Command::Demo(a) => demo(a),
        Command::Client(a) => harness::client(a),
        Command::Dummy(a) => harness::dummy(a),
        Command::Token(a) => token(a),
    };
    if let Err(e) = result {
        // One line: each cause once (an error's text often holds its source's already),
        // whatever line breaks the causes' own texts hold.
        let mut message = String::new();
        for cause in e.chain().map(|c| c.to_string()) {
            if !message.contains(&cause) {
                if !message.is_empty() {
                    message.push_str(": ");
                }
                message.push_str(&cause);
            }
        }
        let message: Vec<&str> = message.split_whitespace().collect();
        eprintln!("crescent: error: {}", message.join(" "));
        std::process::exit(1);
    }
}

fn demo(args: DemoArgs) -> Result<()> {
    println!("starting a master on 127.0.0.1 (gRPC and admin ports chosen freely)");
    let master = server::start(MasterConfig {
        rpc_address: "127.0.0.1:0".into(),
        admin_address: "127.0.0.1:0".into(),
        ..MasterConfig::default()
    })?;
    let config = ClientConfig {
        master_server_address: master.client_address(),
        local_hostname: Some("127.0.0.1".into()),
        global_segment_size: args.segment_size,
        local_buffer_size: 64 << 20,
        ..ClientConfig::from_env()?
    };
    let a = StoreClient::connect(config.clone())?;
    let b = StoreClient::connect(config)?;
    println!("client A: {} contributes {} MiB", a.segment_name(), args.segment_size >> 20);
    println!("client B: {} contributes {} MiB", b.segment_name(), args.segment_size >> 20);
    for (i, &size) in args.sizes.iter().enumerate() {
        let key = format!("demo/prefix-{i}/{}MiB", size >> 20);
        let mut value = vec![0u8; size as usize];
        pattern::fill(&mut value, i as u64 + 1, 0);
        let t = Instant::now();
        a.put(&key, &value)?;
        let put_ms = t.elapsed().as_secs_f64() * 1e3;
        let q = b.query(&key)?;
        let holder = &q.replicas.first().with_context(|| format!("the master lists no replica of {key}"))?.segment_name;
        let whose = if holder == a.segment_name() { "A" } else { "B" };
        let t = Instant::now();
        let got = b.get(&key)?;
        let get_ms = t.elapsed().as_secs_f64() * 1e3;
        if pattern::value_mismatch(&got, i as u64 + 1, value.len() as u64).is_some() {
            bail!("client B read different bytes for {key}");
        }
        let path = if whose == "B" {
            "a local memcpy".to_string()
        } else {
            format!("{} from A", b.engine().segment_transport(b.engine().open_segment(holder)?)?)
        };
        println!(
            "put {key} ({} bytes) from A in {put_ms:.1} ms -> stored on client {whose}; get on B in {get_ms:.1} ms via {path}: bytes verified",
            value.len()
        );
    }
    println!(
        "B sees {} of {} keys exist",
        b.batch_exists(&keys(&args.sizes))?.iter().filter(|e| **e).count(),
        args.sizes.len()
    );
    let removed = a.remove_by_regex("^demo/")?;
    println!(
        "remove_by_regex ^demo/ removed {removed} key(s): B's gets hold read leases ({} s), which protect objects from removal",
        MasterConfig::default().lease_ttl.as_secs()
    );
    for k in keys(&args.sizes) {
        a.remove_with(&k, true)?;
    }
    println!("forced removal: exists now {:?}", b.batch_exists(&keys(&args.sizes))?);
    let totals = master.master.totals();
    println!(
        "master: {} segment(s), {} bytes capacity, {} used ({} of them held until B's read leases end: a read in flight never gets another object's bytes)",
        totals.segments,
        totals.capacity,
        totals.used,
        master.master.quarantined_bytes()
    );
    a.close()?;
    b.close()?;
    println!("demo finished");
    Ok(())
}

fn keys(sizes: &[u64]) -> Vec<String> {
    sizes.iter().enumerate().map(|(i, s)| format!("demo/prefix-{i}/{}MiB", s >> 20)).collect()
}
