//! Crescent's distributed KV-cache store.
//!
//! * [`master`]: the master service (`crescent-master`): metadata only — key → replicas —
//!   allocation, leases, eviction, liveness, metrics.
//! * [`client`]: the store client: contributes memory, puts and gets values, moving the
//!   bytes client-to-client with the transfer engine.

pub mod client;
pub mod error;
pub mod master;
pub mod proto;

pub use client::{ClientConfig, StoreClient};
pub use error::{Result, StoreError};
pub use master::{AllocationStrategy, Master, MasterConfig};
