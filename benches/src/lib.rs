//! Shared pieces of Crescent's benchmark binaries.

pub mod pattern;
pub mod report;

/// Logs to stderr; `RUST_LOG` overrides the default level (`info`).
pub fn init_logging() {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
