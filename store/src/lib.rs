//! Crescent's distributed KV-cache store.
//!
//! * [`master`]: the master service (`crescent-master`): metadata only — key → replicas —
//!   allocation, leases, eviction, liveness, metrics.
//! * [`client`]: the store client: contributes memory, puts and gets values, moving the
//!   bytes client-to-client with the transfer engine.

pub mod client;
pub mod error;
pub mod leader;
pub mod master;
mod metrics_registry;
pub mod pattern;
pub mod proto;

pub use client::{ClientConfig, StoreClient};
pub use error::{Result, StoreError};
pub use master::{AllocationStrategy, Master, MasterConfig};

/// Logs to stderr (`RUST_LOG` overrides the default `info`), with colours only on a terminal.
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .try_init();
}
