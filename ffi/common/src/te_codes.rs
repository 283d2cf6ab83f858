//! Mooncake Transfer Engine's return codes — its `error.h` (`ERR_*`, negative ints that
//! `registerLocalMemory`, `openSegment`, the Python `TransferEngine` and others return) and its
//! `Status::Code` (the positive numbers the C ABI's `submitTransfer`, `getTransferStatus`,
//! `freeBatchID` return) — and the mapping of the engine's typed errors onto them.
//!
//! The store's codes ([`crate::Status`]) are another table: Mooncake uses both, one per API.

use crescent_engine::EngineError;
use crescent_transports::TransportError;

/// A transfer-engine return code (Mooncake's `ERR_*` value).
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TeCode {
    Ok = 0,
    /// `ERR_INVALID_ARGUMENT`: a bad argument, an unknown segment or batch, and the code
    /// Mooncake's Python calls return for any failure.
    InvalidArgument = -1,
    /// `ERR_TOO_MANY_REQUESTS`: more requests than the batch holds; a peer's notification
    /// queue is full.
    TooManyRequests = -2,
    /// `ERR_ADDRESS_NOT_REGISTERED`: local memory that is not registered.
    AddressNotRegistered = -3,
    /// `ERR_BATCH_BUSY`: a batch freed while requests are in flight.
    BatchBusy = -4,
    /// `ERR_DEVICE_NOT_FOUND`.
    DeviceNotFound = -6,
    /// `ERR_ADDRESS_OVERLAPPED`: a registration overlapping a registered region.
    AddressOverlapped = -7,
    /// `ERR_DNS`.
    Dns = -101,
    /// `ERR_SOCKET`: a peer that cannot be reached.
    Socket = -102,
    /// `ERR_MALFORMED_JSON`: an invalid descriptor in the metadata service.
    MalformedJson = -103,
    /// `ERR_REJECT_HANDSHAKE`: a peer that answered wrongly.
    RejectHandshake = -104,
    /// `ERR_METADATA`: the metadata service unreachable, or a segment it does not hold.
    Metadata = -200,
    /// `ERR_ENDPOINT`: no transport in common with the peer.
    Endpoint = -201,
    /// `ERR_CONTEXT`: a transport that cannot start.
    Context = -202,
    /// `ERR_MEMORY`: allocation failed.
    Memory = -302,
    /// `ERR_NOT_IMPLEMENTED`.
    NotImplemented = -303,
}

impl TeCode {
    /// The `ERR_*` value.
    pub fn code(self) -> i32 {
        self as i32
    }

    /// The value of Mooncake's `Status::Code` for the same error (what the C ABI's
    /// `Status`-returning functions return): the `ERR_*` magnitude, but 999 for
    /// `kNotImplemented`.
    pub fn status_code(self) -> i32 {
        match self {
            TeCode::NotImplemented => 999,
            c => -c.code(),
        }
    }
}

/// The code an engine error is reported with.
pub fn te_code(e: &EngineError) -> TeCode {
    match e {
        EngineError::BatchFull { .. } | EngineError::NotifyQueueFull { .. } => TeCode::TooManyRequests,
        EngineError::BatchInFlight { .. } => TeCode::BatchBusy,
        EngineError::LocalNotRegistered { .. } => TeCode::AddressNotRegistered,
        EngineError::SegmentUnreachable { .. } | EngineError::PeerUnreachable { .. } | EngineError::Io(_) => {
            TeCode::Socket
        }
        EngineError::BadPeerReply { .. } => TeCode::RejectHandshake,
        EngineError::NoCommonTransport { .. } => TeCode::Endpoint,
        EngineError::MetadataUnavailable { .. } | EngineError::SegmentNotFound { .. } => TeCode::Metadata,
        EngineError::BadMetadata { .. } => TeCode::MalformedJson,
        EngineError::Transport(t) => match t {
            TransportError::Overlap { .. } => TeCode::AddressOverlapped,
            TransportError::NotRegistered(_) => TeCode::AddressNotRegistered,
            TransportError::Alloc { .. } => TeCode::Memory,
            TransportError::Listen { .. } => TeCode::Socket,
            TransportError::Unavailable(..)
            | TransportError::PinLimit { .. }
            | TransportError::DriverUnavailable { .. }
            | TransportError::Driver { .. } => TeCode::Context,
            _ => TeCode::InvalidArgument,
        },
        _ => TeCode::InvalidArgument,
    }
}

/// Records a transfer-engine failure like [`crate::fail`] (this thread's last error, logged
/// at debug level for the caller's mistakes, else as a warning) and returns its code.
pub fn te_fail(code: TeCode, message: impl std::fmt::Display) -> TeCode {
    let message = message.to_string();
    match code {
        TeCode::InvalidArgument | TeCode::AddressNotRegistered | TeCode::AddressOverlapped | TeCode::BatchBusy => {
            tracing::debug!("{message}")
        }
        _ => tracing::warn!("{message}"),
    }
    crate::set_last_error(message);
    code
}

/// [`te_fail`] for an engine error.
pub fn te_engine_fail(e: &EngineError) -> TeCode {
    te_fail(te_code(e), e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_errors_map_to_mooncakes_codes() {
        let cases = [
            (EngineError::InvalidArgument("x".into()), -1, 1),
            (EngineError::UnknownSegment(3), -1, 1),
            (EngineError::BatchFull { id: 1, capacity: 1, requested: 2 }, -2, 2),
            (EngineError::LocalNotRegistered { request: 0, addr: 16, len: 1 }, -3, 3),
            (EngineError::BatchInFlight { id: 1, pending: 1 }, -4, 4),
            (EngineError::Transport(TransportError::Overlap { addr: 1, len: 1, other: 1 }), -7, 7),
            (EngineError::Transport(TransportError::NotRegistered(8)), -3, 3),
            (EngineError::SegmentUnreachable { name: "a:1".into(), reason: "r".into() }, -102, 102),
            (EngineError::MetadataUnavailable { address: "etcd://a:1".into(), reason: "r".into() }, -200, 200),
            (EngineError::NotifyQueueFull { peer: "a:1".into() }, -2, 2),
        ];
        for (e, code, status) in cases {
            assert_eq!(te_code(&e).code(), code, "{e}");
            assert_eq!(te_code(&e).status_code(), status, "{e}");
        }
        assert_eq!(TeCode::NotImplemented.status_code(), 999);
        assert_eq!(TeCode::Ok.status_code(), 0);
    }
}
