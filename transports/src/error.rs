use std::io;

/// Errors of the transport layer.
///
/// [`TransportError::is_caller_error`] tells a caller's mistake (bad arguments, overlapping
/// or unknown regions) from a fault of the system or of a peer.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("region [{addr:#x}, {addr:#x}+{len}) overlaps the registered region at {other:#x}")]
    Overlap { addr: u64, len: u64, other: u64 },
    #[error("no registered region starts at {0:#x}")]
    NotRegistered(u64),
    #[error("region at {addr:#x} is busy: {why}")]
    RegionBusy { addr: u64, why: String },
    #[error("allocating {len} bytes of shareable memory failed: {source}")]
    Alloc { len: u64, source: io::Error },
    #[error("cannot listen on {addr}: {source}")]
    Listen { addr: String, source: io::Error },
    #[error("transport {0} is unavailable: {1}")]
    Unavailable(&'static str, String),
    /// The device could not pin the memory: the process's locked-memory limit is too small.
    #[error("transport {transport} cannot pin the memory: {reason}")]
    PinLimit { transport: &'static str, reason: String },
}

impl TransportError {
    /// True when the error comes from how the caller used the API, not from the system or a peer.
    pub fn is_caller_error(&self) -> bool {
        matches!(
            self,
            TransportError::InvalidArgument(_)
                | TransportError::Overlap { .. }
                | TransportError::NotRegistered(_)
                | TransportError::RegionBusy { .. }
        )
    }
}
