//! Crescent's distributed KV-cache store.
//!
//! * [`master`]: the master service (`crescent-master`): metadata only — key → replicas —
//!   allocation, leases, eviction, liveness, metrics.
//! * [`client`]: the store client: contributes memory, puts and gets values, moving the
//!   bytes client-to-client with the transfer engine.
//!
//! A master and two clients in one process on loopback: one puts a value (placed in the
//! pool, here in the other client's memory), the other gets it, into bytes or into its own
//! registered buffer without a copy.
//!
//! ```
//! use crescent_store::master::server;
//! use crescent_store::{ClientConfig, MasterConfig, StoreApi, StoreClient, StoreError};
//! let master = server::start(MasterConfig {
//!     rpc_address: "127.0.0.1:0".into(),
//!     admin_address: String::new(), // no admin/metrics port
//!     ..MasterConfig::default()
//! })?;
//! let config = || ClientConfig {
//!     master_server_address: master.client_address(),
//!     local_hostname: Some("127.0.0.1".into()),
//!     global_segment_size: 16 << 20, // memory contributed to the pool
//!     local_buffer_size: 4 << 20,    // staging for byte puts and gets
//!     ..ClientConfig::default()
//! };
//! let (a, b) = (StoreClient::connect(config())?, StoreClient::connect(config())?);
//!
//! let value = vec![42u8; 300_000];
//! a.put("prefix/0", &value)?;
//! assert!(b.exists("prefix/0")?);
//! assert_eq!(b.get("prefix/0")?, value);
//!
//! // Zero copy: straight into memory registered with b's engine.
//! let buf = b.engine().alloc_registered(300_000, "cpu:0")?;
//! assert_eq!(b.get_into("prefix/0", buf.addr(), buf.len())?, 300_000);
//! assert!(matches!(a.get("prefix/1"), Err(StoreError::NotFound(_))));
//! a.close()?;
//! b.close()?;
//! master.shutdown();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![warn(missing_docs)]

mod allocator;
pub mod blank_record;
pub mod client;
pub mod error;
pub mod fastrpc;
pub mod leader;
mod logging;
pub mod master;
mod metrics_registry;
pub mod pattern;
pub mod proto;
pub mod protocol;
mod resident;
mod staging;
pub mod standalone;

pub use client::{ClientConfig, DummyClient, DummyConfig, HeldBuffer, StoreApi, StoreClient, ValueSink};
pub use error::{Result, StoreError};
pub use logging::{init_logging, init_tool_logging};
pub use master::{AllocationStrategy, Master, MasterConfig};
