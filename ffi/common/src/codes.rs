//! Mooncake's status codes and the mapping of Crescent's typed errors onto them.

use crescent_engine::EngineError;
use crescent_store::error::Waited;
use crescent_store::StoreError;

/// A call's status: 0 for success, a negative code for an error. The values are Mooncake
/// Store's `ErrorCode` numbers, so code written against Mooncake's return values keeps working;
/// [`Status::InvalidHandle`] is Crescent's own (the C ABI's handle checks).
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    Ok = 0,
    /// An internal error, or an error the other codes do not describe.
    Internal = -1,
    /// The caller's buffer is smaller than the object.
    BufferOverflow = -10,
    SegmentNotFound = -101,
    SegmentAlreadyExists = -102,
    ClientNotFound = -103,
    /// No space in the pool for the value, even after eviction.
    NoAvailableHandle = -200,
    /// A bad argument: empty key or value, unregistered memory, null pointer, bad config...
    InvalidParams = -600,
    /// C ABI: a handle that is null, unknown, already freed or of the wrong kind.
    InvalidHandle = -650,
    /// No replica fit for the call (a get session: none in memory; a put session: no memory
    /// replica placed).
    InvalidReplica = -702,
    ReplicaIsNotReady = -703,
    ObjectNotFound = -704,
    ObjectAlreadyExists = -705,
    ObjectHasLease = -706,
    /// A get session's read lease ended before its ranged read did (the session ends too).
    LeaseExpired = -707,
    /// Moving the bytes failed: the peer holding them is gone, timed out, refused the access.
    TransferFail = -800,
    /// With checksums on, a get read bytes that differ from the checksum taken at the put.
    ChecksumMismatch = -801,
    /// The master (or a metadata service) cannot be reached.
    RpcFail = -900,
    /// Not possible in the current state: before setup, after close, remount pending.
    UnavailableInCurrentStatus = -1010,
    /// `query_task`: no task of this id (never created, forgotten, or at another master).
    TaskNotFound = -1400,
    /// `create_copy_task` / `create_move_task`: too many tasks wait already.
    TaskPendingLimitExceeded = -1401,
}

impl Status {
    pub fn code(self) -> i32 {
        self as i32
    }

    pub const ALL: [Status; 21] = [
        Status::Ok,
        Status::Internal,
        Status::BufferOverflow,
        Status::SegmentNotFound,
        Status::SegmentAlreadyExists,
        Status::ClientNotFound,
        Status::NoAvailableHandle,
        Status::InvalidParams,
        Status::InvalidHandle,
        Status::InvalidReplica,
        Status::ReplicaIsNotReady,
        Status::ObjectNotFound,
        Status::ObjectAlreadyExists,
        Status::ObjectHasLease,
        Status::LeaseExpired,
        Status::TransferFail,
        Status::ChecksumMismatch,
        Status::RpcFail,
        Status::UnavailableInCurrentStatus,
        Status::TaskNotFound,
        Status::TaskPendingLimitExceeded,
    ];

    /// The status with this code, if it is one.
    pub fn from_code(code: i32) -> Option<Status> {
        Status::ALL.into_iter().find(|s| s.code() == code)
    }

    /// Mooncake's name for the code (`OBJECT_NOT_FOUND`, ...), NUL-terminated for C.
    pub fn name_c(self) -> &'static str {
        match self {
            Status::Ok => "OK\0",
            Status::Internal => "INTERNAL_ERROR\0",
            Status::BufferOverflow => "BUFFER_OVERFLOW\0",
            Status::SegmentNotFound => "SEGMENT_NOT_FOUND\0",
            Status::SegmentAlreadyExists => "SEGMENT_ALREADY_EXISTS\0",
            Status::ClientNotFound => "CLIENT_NOT_FOUND\0",
            Status::NoAvailableHandle => "NO_AVAILABLE_HANDLE\0",
            Status::InvalidParams => "INVALID_PARAMS\0",
            Status::InvalidHandle => "INVALID_HANDLE\0",
            Status::InvalidReplica => "INVALID_REPLICA\0",
            Status::ReplicaIsNotReady => "REPLICA_IS_NOT_READY\0",
            Status::ObjectNotFound => "OBJECT_NOT_FOUND\0",
            Status::ObjectAlreadyExists => "OBJECT_ALREADY_EXISTS\0",
            Status::ObjectHasLease => "OBJECT_HAS_LEASE\0",
            Status::LeaseExpired => "LEASE_EXPIRED\0",
            Status::TransferFail => "TRANSFER_FAIL\0",
            Status::ChecksumMismatch => "CHECKSUM_MISMATCH\0",
            Status::RpcFail => "RPC_FAIL\0",
            Status::UnavailableInCurrentStatus => "UNAVAILABLE_IN_CURRENT_STATUS\0",
            Status::TaskNotFound => "TASK_NOT_FOUND\0",
            Status::TaskPendingLimitExceeded => "TASK_PENDING_LIMIT_EXCEEDED\0",
        }
    }

    /// Mooncake's name for the code.
    pub fn name(self) -> &'static str {
        self.name_c().trim_end_matches('\0')
    }
}

/// The status a store error is reported with.
pub fn store_status(e: &StoreError) -> Status {
    match e {
        StoreError::InvalidArgument(_)
        | StoreError::Config(_)
        | StoreError::StorageRoot { .. }
        | StoreError::NotRegistered { .. }
        | StoreError::BadRange { .. }
        | StoreError::DeviceMemory { .. } => Status::InvalidParams,
        StoreError::BufferTooSmall { .. } => Status::BufferOverflow,
        StoreError::NotFound(_) => Status::ObjectNotFound,
        StoreError::AlreadyExists(_) => Status::ObjectAlreadyExists,
        StoreError::NoSpace { .. } => Status::NoAvailableHandle,
        StoreError::Leased(_) => Status::ObjectHasLease,
        StoreError::NotReady(_) => Status::ReplicaIsNotReady,
        StoreError::SegmentNotFound(_) => Status::SegmentNotFound,
        StoreError::SegmentExists(_) => Status::SegmentAlreadyExists,
        StoreError::ClientNotFound(_) => Status::ClientNotFound,
        StoreError::TaskNotFound(_) => Status::TaskNotFound,
        StoreError::TooManyTasks(_) => Status::TaskPendingLimitExceeded,
        // Never handed to a caller (the client puts the usual way instead); retryable if it were.
        StoreError::BlankGone(_) => Status::RpcFail,
        StoreError::NeedRemount => Status::UnavailableInCurrentStatus,
        // A read past its lease: moving the bytes did not give the object's bytes.
        StoreError::TimedOut { waited: Waited::Master { .. }, .. } => Status::RpcFail,
        StoreError::PeerGone { .. } | StoreError::TimedOut { .. } | StoreError::LeaseExpired { .. } => {
            Status::TransferFail
        }
        StoreError::MasterUnreachable { .. } | StoreError::BadReply(_) => Status::RpcFail,
        // Upstream's code for the same check (`MOONCAKE_STORE_CHECKSUM`).
        StoreError::ChecksumMismatch { .. } => Status::ChecksumMismatch,
        // The master refused this client's credentials (no cluster secret, or another one): a
        // bad configuration, as the caller's other mistakes, and not RPC_FAIL, which upstream's
        // clients retry.
        StoreError::Unauthenticated { .. } => Status::InvalidParams,
        // A master change (restart, failover, a standby answering) or owners that did not
        // acknowledge a commit: retryable, as upstream's clients treat RPC_FAIL.
        StoreError::NotLeader(_) | StoreError::MasterChanged(_) | StoreError::OwnersUnreachable(_) => Status::RpcFail,
        StoreError::Engine(e) => engine_status(e),
        _ => Status::Internal,
    }
}

/// The status a store error is reported with by the session calls (`batch_get_session_*`,
/// `batch_put_session_*`, their ranged transfers), as Mooncake's: a lease that ended is
/// `LEASE_EXPIRED` (elsewhere `TRANSFER_FAIL`, see [`store_status`]), no replica in memory
/// `INVALID_REPLICA`.
pub fn session_status(e: &StoreError) -> Status {
    match e {
        StoreError::LeaseExpired { .. } => Status::LeaseExpired,
        StoreError::PeerGone { cause: crescent_store::error::PeerFault::NoReplica, .. } => Status::InvalidReplica,
        e => store_status(e),
    }
}

/// The status an engine error is reported with.
pub fn engine_status(e: &EngineError) -> Status {
    match e {
        EngineError::UnknownBatch(_) | EngineError::UnknownSegment(_) => Status::InvalidHandle,
        EngineError::BatchInFlight { .. } => Status::UnavailableInCurrentStatus,
        EngineError::SegmentUnreachable { .. }
        | EngineError::SegmentNotFound { .. }
        | EngineError::NoCommonTransport { .. }
        | EngineError::PeerTimedOut { .. }
        | EngineError::BadPeerReply { .. } => Status::SegmentNotFound,
        EngineError::MetadataUnavailable { .. } | EngineError::BadMetadata { .. } => Status::RpcFail,
        EngineError::TransferFailed { .. } | EngineError::TimedOut => Status::TransferFail,
        e if e.is_caller_error() => Status::InvalidParams,
        EngineError::Transport(_) => Status::TransferFail,
        _ => Status::Internal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_errors_map_to_mooncake_numbers() {
        let cases = [
            (StoreError::NotFound("k".into()), -704),
            (StoreError::AlreadyExists("k".into()), -705),
            (StoreError::Leased("k".into()), -706),
            (StoreError::InvalidArgument("x".into()), -600),
            (StoreError::BufferTooSmall { key: "k".into(), need: 2, have: 1 }, -10),
            (StoreError::NoSpace { size: 1, replicas: 1, detail: String::new() }, -200),
            (StoreError::master_unreachable("a", "r"), -900),
            (StoreError::Unauthenticated { addr: "a".into(), source: "wrong token".into() }, -600),
            (StoreError::peer_gone("k", crescent_store::error::PeerFault::NoReplica), -800),
            (StoreError::BadRange { key: "k".into(), offset: 1, len: 2, size: 2 }, -600),
            (StoreError::NotRegistered { addr: 1, len: 2 }, -600),
            (StoreError::Internal("x".into()), -1),
            (StoreError::ChecksumMismatch { key: "k".into(), expected: 1, got: 2 }, -801),
        ];
        for (e, code) in cases {
            assert_eq!(store_status(&e).code(), code, "{e}");
        }
    }

    #[test]
    fn session_calls_tell_an_ended_lease_and_a_missing_memory_replica_apart() {
        let lease = StoreError::LeaseExpired { key: "k".into(), lease_ms: 1, took_ms: 2 };
        let none = StoreError::peer_gone("k", crescent_store::error::PeerFault::NoReplica);
        assert_eq!((session_status(&lease).code(), store_status(&lease).code()), (-707, -800));
        assert_eq!((session_status(&none).code(), store_status(&none).code()), (-702, -800));
        assert_eq!(session_status(&StoreError::NotFound("k".into())).code(), -704);
    }

    #[test]
    fn codes_round_trip_with_names() {
        for s in Status::ALL {
            assert_eq!(Status::from_code(s.code()), Some(s));
            assert!(s.name_c().ends_with('\0') && !s.name().contains('\0'));
        }
        assert_eq!(Status::from_code(-12345), None);
        assert_eq!(Status::ObjectNotFound.name(), "OBJECT_NOT_FOUND");
    }

    #[test]
    fn engine_errors_say_whose_fault() {
        assert_eq!(engine_status(&EngineError::InvalidArgument("x".into())), Status::InvalidParams);
        assert_eq!(engine_status(&EngineError::UnknownSegment(7)), Status::InvalidHandle);
        assert_eq!(engine_status(&EngineError::TimedOut), Status::TransferFail);
        assert_eq!(
            store_status(&StoreError::Engine(EngineError::BatchFull { id: 1, capacity: 1, requested: 2 })),
            Status::InvalidParams
        );
    }
}
