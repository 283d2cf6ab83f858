//! The master's settings.

use std::time::Duration;

use serde::Deserialize;

use crate::error::{Result, StoreError};

/// Where a put's replicas go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum AllocationStrategy {
    /// Any segments with room, chosen at random.
    Random,
    /// The writer's own segment first when it has room, then random.
    LocalFirst,
    /// The segments with the largest share of free space first.
    FreeRatioFirst,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MasterConfig {
    /// gRPC listen address.
    pub rpc_address: String,
    /// HTTP admin listen address (`/metrics`, `/health`, `/query_key`, `/keys`, `/segments`); empty: none.
    pub admin_address: String,
    pub allocation_strategy: AllocationStrategy,
    /// A read lease lasts this long after a get's replica list.
    #[serde(with = "millis")]
    pub lease_ttl: Duration,
    /// Default soft pin length for puts that ask for one.
    #[serde(with = "millis")]
    pub default_soft_pin_ttl: Duration,
    /// Eviction starts when used / capacity passes this.
    pub eviction_high_watermark: f64,
    /// Share of capacity one eviction frees.
    pub eviction_ratio: f64,
    /// A client silent for this long is dropped with its segments and replicas.
    #[serde(with = "millis")]
    pub client_ttl: Duration,
    /// A put started and not ended (or revoked) within this is reclaimed.
    #[serde(with = "millis")]
    pub put_timeout: Duration,
    /// How often liveness, reclaim and eviction are checked.
    #[serde(with = "millis")]
    pub sweep_interval: Duration,
}

impl Default for MasterConfig {
    fn default() -> Self {
        MasterConfig {
            rpc_address: "0.0.0.0:50051".into(),
            admin_address: "0.0.0.0:9003".into(),
            allocation_strategy: AllocationStrategy::Random,
            lease_ttl: Duration::from_secs(10),
            default_soft_pin_ttl: Duration::from_secs(30 * 60),
            eviction_high_watermark: 0.90,
            eviction_ratio: 0.05,
            client_ttl: Duration::from_secs(10),
            put_timeout: Duration::from_secs(60),
            sweep_interval: Duration::from_millis(200),
        }
    }
}

impl MasterConfig {
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(StoreError::Config(m));
        if !(self.eviction_high_watermark > 0.0 && self.eviction_high_watermark <= 1.0) {
            return bad(format!("eviction_high_watermark {} is not in (0, 1]", self.eviction_high_watermark));
        }
        if !(self.eviction_ratio > 0.0 && self.eviction_ratio <= 1.0) {
            return bad(format!("eviction_ratio {} is not in (0, 1]", self.eviction_ratio));
        }
        for (name, d) in
            [("lease_ttl", self.lease_ttl), ("client_ttl", self.client_ttl), ("put_timeout", self.put_timeout)]
        {
            if d.is_zero() {
                return bad(format!("{name} must be positive"));
            }
        }
        if self.sweep_interval.is_zero() {
            return bad("sweep_interval must be positive".into());
        }
        Ok(())
    }
}

mod millis {
    use serde::{Deserialize, Deserializer};
    use std::time::Duration;

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_millis(u64::deserialize(d)?))
    }
}
