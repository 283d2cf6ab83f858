//! Crescent's transfer engine.
//!
//! Register memory once, open a peer's segment by name, then move slices one-sidedly:
//! `Read` pulls remote bytes into local registered memory, `Write` pushes local bytes into
//! remote registered memory. Requests go in batches that end `Completed`, `Failed(reason)` or
//! `TimedOut` — never hang.
//!
//! Two engines in one process on loopback: the target registers a buffer, the initiator
//! opens the target's segment by its name and reads from it, then writes into it.
//!
//! ```
//! use crescent_engine::{EngineConfig, Opcode, TransferEngine, TransferRequest, TransportKind};
//! let config = || EngineConfig {
//!     local_hostname: Some("127.0.0.1".into()),
//!     protocol: Some(TransportKind::Tcp), // or None: chosen per peer (shm on this host)
//!     ..EngineConfig::default()
//! };
//! let target = TransferEngine::new(config())?;
//! let exported = target.alloc_registered(8192, "cpu:0")?;
//! // SAFETY: `exported` is 8192 bytes this example owns; nothing transfers into it yet.
//! unsafe { std::ptr::write_bytes(exported.addr() as *mut u8, 7, 8192) };
//!
//! let initiator = TransferEngine::new(config())?;
//! let local = initiator.alloc_registered(4096, "cpu:0")?;
//! let segment = initiator.open_segment(target.segment_name())?;
//! let remote = initiator.segment_descriptor(segment)?.buffers[0].addr;
//! let read = TransferRequest { opcode: Opcode::Read, source: local.addr(), target: segment, target_offset: remote, length: 4096 };
//! initiator.transfer_sync(&[read])?;
//! // SAFETY: the read has ended; `local` is 4096 bytes of registered memory.
//! let got = unsafe { std::slice::from_raw_parts(local.addr() as *const u8, 4096) };
//! assert!(got.iter().all(|&b| b == 7));
//!
//! // A write of those bytes to the second half of the target's buffer.
//! let write = TransferRequest { opcode: Opcode::Write, target_offset: remote + 4096, ..read };
//! initiator.transfer_sync(&[write])?;
//! // SAFETY: the write has ended; `exported` is 8192 bytes of registered memory.
//! let there = unsafe { std::slice::from_raw_parts(exported.addr() as *const u8, 8192) };
//! assert!(there.iter().all(|&b| b == 7));
//! # Ok::<(), crescent_engine::EngineError>(())
//! ```

#![warn(missing_docs)]

pub mod batch;
pub mod config;
pub mod descriptor;
mod engine;
pub mod env_vars;
pub mod error;
pub mod handshake;
pub mod handshake_wire;
pub mod host;
mod memory;
pub mod metadata;
pub mod notify;
pub mod rpc;
pub mod shared_segment;
pub mod slicing;

pub use batch::{BatchCompletion, BatchId, TransferStatus};
pub use config::{parse_device_list, parse_size, EngineConfig, P2P_HANDSHAKE};
pub use crescent_transports::{FailureKind, FailureReason, Opcode, TransportKind};
pub use descriptor::{BufferDescriptor, SegmentDescriptor};
pub use engine::{SegmentId, TransferEngine, TransferRequest};
pub use error::{EngineError, Result};
pub use memory::{LocalLoan, RegisteredMemory};
pub use notify::Notification;
