//! Crescent's transfer engine.
//!
//! Register memory once, open a peer's segment by name, then move slices one-sidedly:
//! `Read` pulls remote bytes into local registered memory, `Write` pushes local bytes into
//! remote registered memory. Requests go in batches that end `Completed`, `Failed(reason)` or
//! `TimedOut` — never hang.
//!
//! ```no_run
//! use crescent_engine::{EngineConfig, Opcode, TransferEngine, TransferRequest};
//! let engine = TransferEngine::new(EngineConfig::from_env()?)?;
//! let buf = engine.alloc_registered(1 << 20, "cpu:0")?;
//! let target = engine.open_segment("10.0.0.2:12345")?;
//! let remote = engine.segment_descriptor(target)?.buffers[0].addr;
//! engine.transfer_sync(&[TransferRequest {
//!     opcode: Opcode::Read, source: buf.addr(), target, target_offset: remote, length: 4096,
//! }])?;
//! # Ok::<(), crescent_engine::EngineError>(())
//! ```

#![warn(missing_docs)]

pub mod batch;
pub mod config;
pub mod descriptor;
mod engine;
#[allow(missing_docs)] // the variants and fields say what they are in their `#[error]` messages
pub mod error;
pub mod handshake;
pub mod host;
pub mod metadata;
pub mod notify;
pub mod slicing;

pub use batch::{BatchCompletion, BatchId, TransferStatus};
pub use config::{parse_device_list, parse_size, EngineConfig, P2P_HANDSHAKE};
pub use crescent_transports::{Opcode, TransportKind};
pub use descriptor::{BufferDescriptor, SegmentDescriptor};
pub use engine::{LocalLoan, RegisteredMemory, SegmentId, TransferEngine, TransferRequest};
pub use error::{EngineError, Result};
pub use notify::Notification;
