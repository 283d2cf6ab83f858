//! The store's binaries' logging: `tracing` to stderr.

/// Logs to stderr (`RUST_LOG`, else `MC_LOG_LEVEL`, overrides the default `info`), with colours only on a terminal:
/// for servers (`crescent-master`, the standalone client), whose log is their record.
pub fn init_logging() {
    init_logging_at("info");
}

/// Logs to stderr at `warn` unless `RUST_LOG` (or `MC_LOG_LEVEL`) says otherwise: for
/// command-line tools (`crescent`, `tebench`, `storebench`), whose output on stdout is what
/// the user reads, and for the bindings, which stay quiet inside their host's output; the
/// engine's and the clients' routine messages (a segment mounted, a peer connected) would
/// bury it.
pub fn init_tool_logging() {
    init_logging_at("warn");
}

/// `RUST_LOG` if set, else Mooncake's `MC_LOG_LEVEL` (`TRACE`, `INFO`, `WARNING`, `ERROR`),
/// else `default`; an unusable `MC_LOG_LEVEL` is named in a warning once logging is up.
fn init_logging_at(default: &'static str) {
    let (directives, warning) = crescent_engine::env_vars::log_filter_or(default);
    install(&directives, default, warning);
}

/// Logs to stderr with `directives` (`default` where they do not parse), colours only on a
/// terminal; then says `warning`, if any. A second call in a process changes nothing.
pub fn install(directives: &str, default: &'static str, warning: Option<String>) {
    let filter = tracing_subscriber::EnvFilter::try_new(directives).unwrap_or_else(|_| default.into());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .try_init();
    if let Some(w) = warning {
        tracing::warn!("{w}");
    }
}
