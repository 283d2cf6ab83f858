//! Making and registering Prometheus metrics, for the master's and the client's registries.

use prometheus::core::Collector;
use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

use crate::error::{Result, StoreError};

/// A metrics error (a bad name or a name registered twice: a bug of ours, not the caller's).
pub(crate) fn internal(e: prometheus::Error) -> StoreError {
    StoreError::Internal(format!("metrics: {e}"))
}

/// Registers `metric` in `registry` and hands it back.
pub(crate) fn register<M: Collector + Clone + 'static>(registry: &Registry, metric: M) -> Result<M> {
    registry.register(Box::new(metric.clone())).map_err(internal)?;
    Ok(metric)
}

pub(crate) fn gauge(registry: &Registry, name: &str, help: &str) -> Result<IntGauge> {
    register(registry, IntGauge::new(name, help).map_err(internal)?)
}

pub(crate) fn counter(registry: &Registry, name: &str, help: &str) -> Result<IntCounter> {
    register(registry, IntCounter::new(name, help).map_err(internal)?)
}

/// A counter per value of the `labels`.
pub(crate) fn counter_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> Result<IntCounterVec> {
    register(registry, IntCounterVec::new(Opts::new(name, help), labels).map_err(internal)?)
}

/// A gauge per value of the `labels`.
pub(crate) fn gauge_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> Result<IntGaugeVec> {
    register(registry, IntGaugeVec::new(Opts::new(name, help), labels).map_err(internal)?)
}
