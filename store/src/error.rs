use crescent_engine::EngineError;

use crate::proto::Code;

/// Errors of the store (master and client). [`StoreError::is_caller_error`] tells a caller's
/// mistake from a fault of a peer, of the master or of the system.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("object {0:?} not found")]
    NotFound(String),
    #[error("object {0:?} already exists")]
    AlreadyExists(String),
    #[error("no space for {size} bytes x {replicas} replica(s) (after eviction): {detail}")]
    NoSpace { size: u64, replicas: u32, detail: String },
    #[error("object {0:?} is leased by a reader; retry after the lease or force")]
    Leased(String),
    #[error("object {0:?} is still being written")]
    NotReady(String),
    #[error("segment {0} is not mounted")]
    SegmentNotFound(String),
    #[error("segment {0} is already mounted by another client")]
    SegmentExists(String),
    #[error("client {0} is not known to the master")]
    ClientNotFound(String),
    #[error("the master dropped this client (silent past its TTL): remount needed")]
    NeedRemount,
    #[error("the holder of object {key:?} is gone: {reason}")]
    PeerGone { key: String, reason: String },
    #[error("master at {addr} is unreachable: {reason}")]
    MasterUnreachable { addr: String, reason: String },
    #[error("timed out: {0}")]
    TimedOut(String),
    /// A read from memory ended after the object's read lease: the bytes may have been
    /// replaced meanwhile, so they are not returned (get it again).
    #[error("reading object {key:?} took {took_ms} ms, past its {lease_ms} ms read lease; get it again")]
    LeaseExpired { key: String, lease_ms: u64, took_ms: u64 },
    #[error("buffer of {have} bytes is too small for object {key:?} of {need} bytes")]
    BufferTooSmall { key: String, need: u64, have: u64 },
    #[error("transfer engine: {0}")]
    Engine(#[from] EngineError),
    #[error("master replied: {0}")]
    Remote(String),
    #[error("internal error: {0}")]
    Internal(String),
    /// This master is a standby or was deposed (the message names the leader when known).
    #[error("not the leader: {0}")]
    NotLeader(String),
    /// The master changed while this call was in flight (a restart, a failover): a put in
    /// flight must be put again.
    #[error("the master changed: {0}")]
    MasterChanged(String),
    /// No owner of the object's replicas acknowledged the commit in time: nothing was stored.
    #[error("no owner of object {0:?}'s replicas acknowledged its commit in time; put it again")]
    OwnersUnreachable(String),
    #[error("disk tier: {0}")]
    Disk(String),
    #[error("corrupt disk file: {0}")]
    CorruptFile(String),
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

impl StoreError {
    /// True when the error comes from how the caller used the API.
    pub fn is_caller_error(&self) -> bool {
        match self {
            StoreError::InvalidArgument(_)
            | StoreError::Config(_)
            | StoreError::AlreadyExists(_)
            | StoreError::BufferTooSmall { .. }
            | StoreError::SegmentExists(_) => true,
            StoreError::Engine(e) => e.is_caller_error(),
            _ => false,
        }
    }

    /// True when the call failed because the master went away, changed or is not the leader:
    /// the same call may succeed once the client follows the (new) master.
    pub fn is_master_change(&self) -> bool {
        matches!(
            self,
            StoreError::MasterUnreachable { .. }
                | StoreError::NotLeader(_)
                | StoreError::MasterChanged(_)
                | StoreError::OwnersUnreachable(_)
                | StoreError::NeedRemount
        )
    }

    /// The wire code for this error.
    pub fn code(&self) -> Code {
        match self {
            StoreError::InvalidArgument(_) | StoreError::Config(_) | StoreError::BufferTooSmall { .. } => {
                Code::InvalidArgument
            }
            StoreError::NotFound(_) => Code::ObjectNotFound,
            StoreError::AlreadyExists(_) => Code::ObjectAlreadyExists,
            StoreError::NoSpace { .. } => Code::NoSpace,
            StoreError::Leased(_) => Code::ObjectLeased,
            StoreError::NotReady(_) => Code::ObjectNotReady,
            StoreError::SegmentNotFound(_) => Code::SegmentNotFound,
            StoreError::SegmentExists(_) => Code::SegmentAlreadyExists,
            StoreError::ClientNotFound(_) => Code::ClientNotFound,
            StoreError::NeedRemount => Code::NeedRemount,
            StoreError::LeaseExpired { .. } => Code::LeaseExpired,
            StoreError::NotLeader(_) => Code::NotLeader,
            StoreError::MasterChanged(_) => Code::MasterChanged,
            StoreError::OwnersUnreachable(_) => Code::OwnersUnreachable,
            _ => Code::Internal,
        }
    }

    /// Rebuilds an error from a master's status (code + message); `key` names the object.
    pub fn from_status(code: Code, message: &str, key: &str) -> StoreError {
        match code {
            Code::InvalidArgument => StoreError::InvalidArgument(message.to_string()),
            Code::ObjectNotFound => StoreError::NotFound(key.to_string()),
            Code::ObjectAlreadyExists => StoreError::AlreadyExists(key.to_string()),
            Code::NoSpace => StoreError::NoSpace { size: 0, replicas: 0, detail: message.to_string() },
            Code::ObjectLeased => StoreError::Leased(key.to_string()),
            Code::ObjectNotReady => StoreError::NotReady(key.to_string()),
            Code::SegmentNotFound => StoreError::SegmentNotFound(message.to_string()),
            Code::SegmentAlreadyExists => StoreError::SegmentExists(message.to_string()),
            Code::ClientNotFound => StoreError::ClientNotFound(message.to_string()),
            Code::NeedRemount => StoreError::NeedRemount,
            Code::LeaseExpired => StoreError::LeaseExpired { key: key.to_string(), lease_ms: 0, took_ms: 0 },
            Code::NotLeader => StoreError::NotLeader(message.to_string()),
            Code::MasterChanged => StoreError::MasterChanged(message.to_string()),
            Code::OwnersUnreachable => StoreError::OwnersUnreachable(key.to_string()),
            _ => StoreError::Remote(message.to_string()),
        }
    }
}
