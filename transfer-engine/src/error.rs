use crescent_transports::{FailureReason, TransportError};

/// Errors of the transfer engine.
///
/// [`EngineError::is_caller_error`] tells a caller's mistake from a fault of a peer, of a
/// metadata service or of the system.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("unknown batch {0}")]
    UnknownBatch(u64),
    #[error("batch {id} holds {capacity} requests at most; {requested} more do not fit")]
    BatchFull { id: u64, capacity: usize, requested: usize },
    #[error("batch {id} still has {pending} request(s) in flight; wait for them before freeing it")]
    BatchInFlight { id: u64, pending: usize },
    #[error("unknown segment handle {0}")]
    UnknownSegment(u64),
    #[error("segment {name:?} is unreachable: {reason}")]
    SegmentUnreachable { name: String, reason: String },
    #[error("timed out after {} s waiting for {what} of {peer}", waited.as_secs_f64())]
    PeerTimedOut { peer: String, waited: std::time::Duration, what: &'static str },
    #[error("peer {peer} sent an invalid reply: {reason}")]
    BadPeerReply { peer: String, reason: String },
    #[error(
        "segment {name:?} offers no transport this engine can use (it offers: {offered}; allowed here: {allowed})"
    )]
    NoCommonTransport { name: String, offered: String, allowed: String },
    #[error("metadata service {address} is unreachable: {reason}")]
    MetadataUnavailable { address: String, reason: String },
    #[error("metadata service {address} holds an invalid value under {key}: {reason}")]
    BadMetadata { address: String, key: String, reason: String },
    #[error("segment {name:?} is not published in metadata service {address} (key {key})")]
    SegmentNotFound { name: String, address: String, key: String },
    #[error("request {request}: local range [{addr:#x}, +{len}) is not registered memory")]
    LocalNotRegistered { request: usize, addr: u64, len: u64 },
    #[error("a notification of {len} bytes (name and message) is larger than the {max}-byte limit")]
    NotifyTooLarge { len: usize, max: usize },
    #[error("peer {peer} refused the notification: its queue of notifications not yet taken is full")]
    NotifyQueueFull { peer: String },
    /// A request failed; the reason's [`kind`](FailureReason::kind) says whose fault it was.
    #[error("transfer failed: request {request}: {reason}")]
    TransferFailed {
        request: usize,
        #[source]
        reason: FailureReason,
    },
    /// The connection to `peer` was not authenticated (the two ends share no cluster secret,
    /// or it could not prove it knows one).
    #[error("{peer}: {source}")]
    Unauthenticated {
        peer: String,
        #[source]
        source: crescent_transports::net::AuthError,
    },
    #[error("transfer timed out")]
    TimedOut,
    #[error(transparent)]
    Transport(#[from] TransportError),
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
}

impl EngineError {
    /// True when the error comes from how the caller used the API, not from a peer or the system.
    /// A failed transfer is not (a request outside the target's memory usually means a stale
    /// address, which another replica may not share): its reason's kind tells more.
    pub fn is_caller_error(&self) -> bool {
        match self {
            EngineError::InvalidArgument(_)
            | EngineError::Config(_)
            | EngineError::UnknownBatch(_)
            | EngineError::BatchFull { .. }
            | EngineError::BatchInFlight { .. }
            | EngineError::UnknownSegment(_)
            | EngineError::LocalNotRegistered { .. }
            | EngineError::NotifyTooLarge { .. } => true,
            EngineError::Transport(t) => t.is_caller_error(),
            _ => false,
        }
    }
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;
