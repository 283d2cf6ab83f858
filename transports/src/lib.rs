//! Crescent's transports.
//!
//! A transport moves bytes one-sidedly between a local registered region and a peer's
//! registered region: `Read` pulls remote bytes into local memory, `Write` pushes local
//! bytes into remote memory. Transports know nothing of segment names, metadata services
//! or keys: the engine hands them already-validated [`Slice`]s addressed to an
//! [`Endpoint`], and every slice ends through its [`Completion`].
//!
//! The same [`RegionTable`] is shared by the engine (which registers memory) and by
//! every transport (which checks each remote access against it on the target side).
#![warn(missing_docs)]

pub mod device;
pub mod error;
pub mod memory;
pub mod net;
pub mod rdma;
pub mod region;
pub mod shm;
pub mod slice;
pub mod tcp;
mod transport;

pub use error::TransportError;
pub use memory::SharedMemory;
pub use region::{DeviceKey, InflightGuard, Region, RegionAccess, RegionKeys, RegionTable};
pub use slice::{
    Abort, BorrowedClaim, Completion, CompletionSink, FailureKind, FailureReason, LocalAccess, LocalClaim, Opcode,
    Slice, SliceOutcome,
};
pub use transport::{Endpoint, RemoteRegion, Transport, TransportKind};
