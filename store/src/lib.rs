//! Crescent's distributed KV-cache store.
//!
//! * [`master`]: the master service (`crescent-master`): metadata only — key → replicas —
//!   allocation, leases, eviction, liveness, metrics.
//! * [`client`]: the store client: contributes memory, puts and gets values, moving the
//!   bytes client-to-client with the transfer engine.

pub mod allocator;
pub mod client;
pub mod error;
pub mod leader;
mod logging;
pub mod master;
mod metrics_registry;
pub mod pattern;
pub mod proto;
pub mod protocol;
pub mod staging;
pub mod standalone;

pub use client::{ClientConfig, DummyClient, DummyConfig, HeldBuffer, StoreApi, StoreClient};
pub use error::{Result, StoreError};
pub use logging::init_logging;
pub use master::{AllocationStrategy, Master, MasterConfig};
