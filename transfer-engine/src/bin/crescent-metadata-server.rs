//! crescent-metadata-server: an http metadata service for clusters without etcd or redis.
//!
//! ```text
//! $ crescent-metadata-server --port 8080
//! metadata server: http://0.0.0.0:8080/metadata
//! $ tebench target --metadata-server http://<this host>:8080/metadata
//! ```
//! Entries live in memory only: a restarted server is empty until engines publish again
//! (they do so every third of their TTL).

use std::net::{IpAddr, SocketAddr};

use clap::Parser;
use crescent_engine::metadata::server::MetadataServer;

#[derive(Parser)]
#[command(
    name = "crescent-metadata-server",
    about = "In-memory http metadata service: GET/PUT/DELETE <path>?key=<key>"
)]
struct Cli {
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0")]
    host: IpAddr,
    /// Port to listen on (0: any free port).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Path of the key-value resource.
    #[arg(long, default_value = "/metadata")]
    path: String,
}

fn main() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
    let cli = Cli::parse();
    match MetadataServer::start(SocketAddr::new(cli.host, cli.port), &cli.path) {
        Ok(server) => {
            // The first line on stdout is the URL (tests and scripts read it).
            println!("metadata server: {}", server.url());
            server.wait()
        }
        Err(e) => {
            eprintln!("crescent-metadata-server: cannot serve on {}:{}: {e}", cli.host, cli.port);
            std::process::exit(1);
        }
    }
}
