//! Prometheus export of the client's metrics (the local hot cache's and the disk tier's), in the
//! text format the master's `/metrics` uses: [`super::StoreClient::render_metrics`] for a process that
//! serves its own endpoint, and an optional HTTP endpoint of the client itself
//! (`CRESCENT_CLIENT_METRICS_ADDRESS` / config key `client_metrics_address` /
//! `ClientConfig::metrics_address`) serving `GET /metrics`.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use crescent_transports::net::{Auth, Service};
use parking_lot::Mutex;
use prometheus::proto::MetricFamily;
use prometheus::{Encoder, IntCounter, IntCounterVec, IntGauge, Registry, TextEncoder};
use tokio::sync::oneshot;

use crate::client::checksum::ChecksumCounts;
use crate::client::hot_cache::HotCacheMetrics;
use crate::error::{Result, StoreError};
use crate::metrics_registry::{counter, counter_vec, gauge, internal};

/// Environment variable naming the address of the client's metrics endpoint.
pub const METRICS_ADDRESS_ENV: &str = "CRESCENT_CLIENT_METRICS_ADDRESS";

/// The client's registry; counters are brought up to the cache's own counts at each scrape.
pub struct ClientMetrics {
    registry: Registry,
    /// Serializes scrapes (each advances the counters by what happened since the last).
    sync: Mutex<()>,
    enabled: IntGauge,
    blocks: IntGauge,
    block_size: IntGauge,
    entries: IntGauge,
    blocks_in_use: IntGauge,
    hits: IntCounter,
    misses: IntCounter,
    merged: IntCounter,
    fills: IntCounter,
    dropped_fills: IntCounter,
    deferred_fills: IntCounter,
    taken_over: IntCounter,
    filler_waits: IntCounter,
    early_copies: IntCounter,
    early_copies_wasted: IntCounter,
    evictions: IntCounter,
    bytes_served: IntCounter,
    auth_required: IntGauge,
    auth_accepted: IntCounterVec,
    auth_refused: IntCounterVec,
    auth_dial_failed: IntCounterVec,
    checksums_verified: IntCounter,
    checksum_mismatches: IntCounter,
    checksums_absent: IntCounter,
}

impl ClientMetrics {
    /// A registry of the client's series (prefix `crescent_client_`), every one at 0; fails
    /// only if two series were given one name (a bug: [`StoreError::Internal`]).
    pub fn new() -> Result<Self> {
        let registry = Registry::new_custom(Some("crescent_client".into()), None).map_err(internal)?;
        let gauge = |name: &str, help: &str| gauge(&registry, name, help);
        let counter = |name: &str, help: &str| counter(&registry, name, help);
        let by_service = |name: &str, help: &str| counter_vec(&registry, name, help, &["service"]);
        Ok(ClientMetrics {
            enabled: gauge("hot_cache_enabled", "1 when the local hot cache is on")?,
            blocks: gauge("hot_cache_blocks", "Blocks of the local hot cache")?,
            block_size: gauge("hot_cache_block_size_bytes", "Bytes per block of the local hot cache")?,
            entries: gauge("hot_cache_entries", "Objects in the local hot cache")?,
            blocks_in_use: gauge("hot_cache_blocks_in_use", "Blocks held by entries or by fills in progress")?,
            hits: counter("hot_cache_hits_total", "Gets of remote objects served from the hot cache")?,
            misses: counter("hot_cache_misses_total", "Gets of remote objects not (validly) in the hot cache")?,
            merged: counter(
                "hot_cache_merged_total",
                "Misses served by another get's fetch of the same object instead of a transfer of their own",
            )?,
            fills: counter("hot_cache_fills_total", "Objects put into the hot cache")?,
            dropped_fills: counter(
                "hot_cache_dropped_fills_total",
                "Fills given up: queue full, no block free, or the transfer failed",
            )?,
            deferred_fills: counter(
                "hot_cache_deferred_fills_total",
                "Fills handed to the background filler (deferred fill mode)",
            )?,
            taken_over: counter(
                "hot_cache_taken_over_total",
                "Deferred fills a repeat miss took over and filled inline before the filler began them",
            )?,
            filler_waits: counter(
                "hot_cache_filler_waits_total",
                "Times the background filler waited, before a piece, for this client's own reads to end",
            )?,
            early_copies: counter(
                "hot_cache_early_copies_total",
                "Hot cache hits of zero-copy batch gets copied while the master answered",
            )?,
            early_copies_wasted: counter(
                "hot_cache_early_copies_wasted_total",
                "Copies made while the master answered that its answer did not confirm (the object changed)",
            )?,
            evictions: counter("hot_cache_evictions_total", "Hot cache entries evicted to make room")?,
            bytes_served: counter("hot_cache_served_bytes_total", "Bytes copied to callers out of the hot cache")?,
            auth_required: gauge("auth_required", "1 when a cluster secret is set and every port requires it")?,
            auth_accepted: by_service(
                "auth_accepted_total",
                "Connections to this client's ports that proved knowledge of the cluster secret, by port",
            )?,
            auth_refused: by_service(
                "auth_refused_total",
                "Connections to this client's ports closed because the peer did not prove knowledge of the cluster \
                 secret, by port",
            )?,
            auth_dial_failed: by_service(
                "auth_dial_failed_total",
                "Connections from this client to a peer's port that failed to authenticate, by port",
            )?,
            checksums_verified: counter(
                "checksums_verified_total",
                "Whole-value reads whose bytes matched the checksum taken at the put (verify_checksums on)",
            )?,
            checksum_mismatches: counter(
                "checksum_mismatches_total",
                "Reads (and hot cache fills) whose bytes did not match the checksum taken at the put: each read \
                 failed with CHECKSUM_MISMATCH",
            )?,
            checksums_absent: counter(
                "checksums_absent_total",
                "Whole-value reads of objects put without a checksum (not verified)",
            )?,
            registry,
            sync: Mutex::new(()),
        })
    }

    /// The text exposition of `hot` (`None`: the cache is off; its series read 0) and of
    /// `disk` (the disk tier's own registry, its counters as counters, see `disk::stats`;
    /// `None`: no disk tier, no series).
    /// `auth`: the engine's authentication counters; `checksums`: the end-to-end checksums'.
    pub fn render(
        &self,
        hot: Option<HotCacheMetrics>,
        disk: Option<Vec<MetricFamily>>,
        auth: &Auth,
        checksums: ChecksumCounts,
    ) -> String {
        {
            let _one_at_a_time = self.sync.lock();
            self.auth_required.set(auth.is_required() as i64);
            let stats = auth.stats();
            for service in Service::ALL {
                for (vec, v) in [
                    (&self.auth_accepted, stats.accepted(service)),
                    (&self.auth_refused, stats.refused(service)),
                    (&self.auth_dial_failed, stats.dial_failed(service)),
                ] {
                    let c = vec.with_label_values(&[service.as_str()]);
                    c.inc_by(v.saturating_sub(c.get()));
                }
            }
            let m = hot.unwrap_or_default();
            self.enabled.set(hot.is_some() as i64);
            for (g, v) in [
                (&self.blocks, m.blocks),
                (&self.block_size, m.block_size),
                (&self.entries, m.entries),
                (&self.blocks_in_use, m.blocks_in_use),
            ] {
                g.set(v.min(i64::MAX as u64) as i64);
            }
            for (c, v) in [
                (&self.hits, m.hits),
                (&self.misses, m.misses),
                (&self.merged, m.merged),
                (&self.fills, m.fills),
                (&self.dropped_fills, m.dropped_fills),
                (&self.deferred_fills, m.deferred_fills),
                (&self.taken_over, m.taken_over),
                (&self.filler_waits, m.filler_waits),
                (&self.early_copies, m.early_copies),
                (&self.early_copies_wasted, m.early_copies_wasted),
                (&self.evictions, m.evictions),
                (&self.bytes_served, m.bytes_served),
                (&self.checksums_verified, checksums.verified),
                (&self.checksum_mismatches, checksums.mismatches),
                (&self.checksums_absent, checksums.unchecked),
            ] {
                c.inc_by(v.saturating_sub(c.get()));
            }
        }
        let mut out = Vec::new();
        let mut families = self.registry.gather();
        families.extend(disk.unwrap_or_default());
        if let Err(e) = TextEncoder::new().encode(&families, &mut out) {
            tracing::warn!("encoding the client's metrics: {e}");
        }
        String::from_utf8(out).unwrap_or_default()
    }
}

/// The client's HTTP metrics endpoint; stops when dropped.
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
}

impl MetricsServer {
    /// Serves `GET /metrics` on `address` (`host:port`; port 0 picks one) on `runtime`, with
    /// the text `render` gives (`None` once the client is closed).
    pub fn start(address: &str, render: Render, runtime: &tokio::runtime::Handle) -> Result<Self> {
        let listener = std::net::TcpListener::bind(address)
            .map_err(|e| StoreError::Config(format!("client metrics address {address:?}: {e}")))?;
        listener.set_nonblocking(true).map_err(|e| StoreError::system("metrics listener", e))?;
        let addr = listener.local_addr().map_err(|e| StoreError::system("metrics listener", e))?;
        let (stop, stopped) = oneshot::channel::<()>();
        let router = Router::new().route("/metrics", get(metrics)).with_state(render);
        runtime.spawn(async move {
            let listener = match tokio::net::TcpListener::from_std(listener) {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!("client metrics endpoint {addr}: {e}");
                    return;
                }
            };
            let served = axum::serve(listener, router).with_graceful_shutdown(async move {
                let _ = stopped.await;
            });
            if let Err(e) = served.await {
                tracing::warn!("client metrics endpoint {addr}: {e}");
            }
        });
        Ok(MetricsServer { addr, stop: Some(stop) })
    }

    /// The address it listens on (the port picked when the configured one was 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// What the endpoint serves: the client's metrics, `None` once it is closed.
pub type Render = Arc<dyn Fn() -> Option<String> + Send + Sync>;

async fn metrics(State(render): State<Render>) -> Response {
    match render() {
        Some(text) => ([("content-type", "text/plain; version=0.0.4")], text).into_response(),
        None => (axum::http::StatusCode::SERVICE_UNAVAILABLE, "client closed").into_response(),
    }
}
