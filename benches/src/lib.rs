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

/// CPU time this process has used so far (all threads, user and system), in seconds. Unlike
/// wall-clock time it does not grow while other programs hold the CPUs, so bytes per CPU
/// second compare fairly on a busy machine.
pub fn process_cpu_seconds() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    t.tv_sec as f64 + t.tv_nsec as f64 / 1e9
}
