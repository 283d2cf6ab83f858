//! The engine's one error type, [`EngineError`]: each variant a caller can match on, and
//! [`EngineError::is_caller_error`] to tell the caller's mistake from a peer's or the system's fault.

use crescent_transports::{FailureReason, TransportError};

/// Errors of the transfer engine.
///
/// [`EngineError::is_caller_error`] tells a caller's mistake from a fault of a peer, of a
/// metadata service or of the system.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The caller passed a value the call cannot take (what and why in the message).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A setting (an `MC_*` variable, a config file's key, an argument of `initialize`) is
    /// malformed or out of range; the message names it and its value.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// No batch of this engine has this id (never allocated, or freed already).
    #[error("unknown batch {0}")]
    UnknownBatch(u64),
    /// A submission would put more requests in the batch than it was allocated for.
    #[error("batch {id} holds {capacity} requests at most; {requested} more do not fit")]
    BatchFull {
        /// The batch.
        id: u64,
        /// Requests it was allocated for.
        capacity: usize,
        /// Requests the submission added.
        requested: usize,
    },
    /// The batch cannot be freed: requests of it are still in flight.
    #[error("batch {id} still has {pending} request(s) in flight; wait for them before freeing it")]
    BatchInFlight {
        /// The batch.
        id: u64,
        /// Its requests not yet ended.
        pending: usize,
    },
    /// No segment was opened under this handle (or it was closed).
    #[error("unknown segment handle {0}")]
    UnknownSegment(u64),
    /// No transport could reach the segment.
    #[error("segment {name:?} is unreachable: {reason}")]
    SegmentUnreachable {
        /// The segment's name.
        name: String,
        /// Why no transport reached it.
        reason: String,
    },
    /// A peer did not answer in time.
    #[error("timed out after {} s waiting for {what} of {peer}", waited.as_secs_f64())]
    PeerTimedOut {
        /// The peer (its address or segment name).
        peer: String,
        /// How long this side waited.
        waited: std::time::Duration,
        /// What it waited for (a handshake's reply, a connection).
        what: &'static str,
    },
    /// Something this build does not do (a hardware path it does not drive).
    #[error("not supported by this build: {0}")]
    Unsupported(String),
    /// A peer could not be reached: nothing listens there, the connection was reset or closed
    /// before it answered.
    #[error("peer {peer} is unreachable: {reason}")]
    PeerUnreachable {
        /// The peer's address.
        peer: String,
        /// What failed.
        reason: String,
    },
    /// A peer refused a message and said why (an rpc server, for a message over its bounds).
    #[error("peer {peer} rejected the message: {reason}")]
    Rejected {
        /// The peer's address.
        peer: String,
        /// Its reason.
        reason: String,
    },
    /// A peer answered with bytes that are not a valid reply.
    #[error("peer {peer} sent an invalid reply: {reason}")]
    BadPeerReply {
        /// The peer.
        peer: String,
        /// What was wrong with its reply.
        reason: String,
    },
    /// The segment and this engine share no transport.
    #[error(
        "segment {name:?} offers no transport this engine can use (it offers: {offered}; allowed here: {allowed})"
    )]
    NoCommonTransport {
        /// The segment's name.
        name: String,
        /// The transports its descriptor lists.
        offered: String,
        /// The transports this engine may use.
        allowed: String,
    },
    /// The metadata service could not be reached.
    #[error("metadata service {address} is unreachable: {reason}")]
    MetadataUnavailable {
        /// The metadata service's address.
        address: String,
        /// Why it could not be reached.
        reason: String,
    },
    /// The metadata service holds a value that does not parse.
    #[error("metadata service {address} holds an invalid value under {key}: {reason}")]
    BadMetadata {
        /// The metadata service's address.
        address: String,
        /// The key whose value is invalid.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No segment of this name is published in the metadata service.
    #[error("segment {name:?} is not published in metadata service {address} (key {key})")]
    SegmentNotFound {
        /// The segment's name.
        name: String,
        /// The metadata service's address.
        address: String,
        /// The key looked up.
        key: String,
    },
    /// A request's local memory is not registered with this engine.
    #[error("request {request}: local range [{addr:#x}, +{len}) is not registered memory")]
    LocalNotRegistered {
        /// The request's index in its batch.
        request: usize,
        /// Start of the local range.
        addr: u64,
        /// Its length in bytes.
        len: u64,
    },
    /// A notification is larger than a peer takes.
    #[error("a notification of {len} bytes (name and message) is larger than the {max}-byte limit")]
    NotifyTooLarge {
        /// Bytes of the name and message together.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The peer's queue of notifications is full.
    #[error("peer {peer} refused the notification: its queue of notifications not yet taken is full")]
    NotifyQueueFull {
        /// The peer.
        peer: String,
    },
    /// A request failed; the reason's [`kind`](FailureReason::kind) says whose fault it was.
    #[error("transfer failed: request {request}: {reason}")]
    TransferFailed {
        /// The request's index in its batch.
        request: usize,
        /// Why it failed.
        #[source]
        reason: FailureReason,
    },
    /// The connection to `peer` was not authenticated (the two ends share no cluster secret,
    /// or it could not prove it knows one).
    #[error("{peer}: {source}")]
    Unauthenticated {
        /// The peer.
        peer: String,
        /// What failed in the challenge-response.
        #[source]
        source: crescent_transports::net::AuthError,
    },
    /// A transfer queued on a device stream ([`TransferEngine::transfer_on_stream`]) failed
    /// after that call had returned; the engine's next such call reports it, once.
    ///
    /// [`TransferEngine::transfer_on_stream`]: crate::TransferEngine::transfer_on_stream
    #[error("a transfer queued on a device stream earlier failed: {reason}")]
    StreamTransferFailed {
        /// Why it failed.
        reason: String,
    },
    /// A transfer did not end within its deadline (`MC_TRANSFER_TIMEOUT`).
    #[error("transfer timed out")]
    TimedOut,
    /// A transport's own error (its kind tells whose fault).
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// A system call failed on this host.
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

/// The engine's result type.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;
