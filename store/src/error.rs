//! The store's one error type.
//!
//! Each variant says whose fault it is ([`StoreError::fault`]): the caller's (a bad argument, a
//! buffer too small, a range past the value), a peer's (the client holding a replica, its
//! disk service), the master's (unreachable, or an answer that makes no sense), this process's
//! or system's, or nobody's (an answer about the object: not found, leased, no space). Causes
//! are chained with `#[source]`: the engine's error, the RPC status, the I/O error.
//!
//! Errors cross the master's wire as a [`Code`] and a message ([`StoreError::code`],
//! [`StoreError::from_status`]); the message is the error's text, which `from_status` reads
//! back into the same fields (a key's `NoSpace` keeps its size, a caller's mistake does not
//! grow a second prefix).

use std::time::Duration;

use crescent_engine::EngineError;

use crate::proto::Code;

/// Whose fault an error is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// How the caller used the API (a bad argument, configuration or buffer).
    Caller,
    /// Another client: the holder of a replica, its engine or disk service.
    Peer,
    /// The master: unreachable, too slow, or an answer that makes no sense.
    Master,
    /// This process or its system (a thread, a runtime, a disk).
    Local,
    /// Nobody's: what the store answers about an object (not found, leased, no space, ...).
    Answer,
}

/// Errors of the store (master and client).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    // ---- the caller's mistakes ----
    /// An argument the call cannot use (an empty or too long key, a size of 0 or over the
    /// largest object, more replicas than allowed); the text says which.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A configuration value out of its range or contradicting another; the text names it.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The storage root cannot be used: it is read-only, or this process may not write it
    /// (a root that is merely full is not this error: the disk tier starts on it, full).
    #[error("invalid configuration: storage root {}: {what}: {source}", root.display())]
    StorageRoot {
        /// The storage root.
        root: std::path::PathBuf,
        /// What failed (`"not writable"`).
        what: &'static str,
        /// The file system's answer.
        #[source]
        source: std::io::Error,
    },
    /// A zero-copy call was given memory that no registered buffer holds whole.
    #[error("buffer [{addr:#x}, +{len}) is not registered memory: call register_buffer first")]
    NotRegistered {
        /// The buffer's address in this process.
        addr: u64,
        /// The buffer's length, in bytes.
        len: u64,
    },
    /// The destination buffer cannot hold the object (nothing was read into it).
    #[error("buffer of {have} bytes is too small for object {key:?} of {need} bytes")]
    BufferTooSmall {
        /// The object's key.
        key: String,
        /// Bytes needed: the object's (or the range's) size.
        need: u64,
        /// Bytes the buffer holds.
        have: u64,
    },
    /// A ranged read asked for bytes past the object's end.
    #[error("range [{offset}, +{len}) is not inside object {key:?} of {size} bytes")]
    BadRange {
        /// The object's key.
        key: String,
        /// The range's start, in bytes from the object's start.
        offset: u64,
        /// The range's length, in bytes.
        len: u64,
        /// The object's size, in bytes.
        size: u64,
    },

    // ---- what the store answers about an object or a client ----
    /// No complete object has this key.
    #[error("object {0:?} not found")]
    NotFound(String),
    /// A put of a key that is already stored (or being put).
    #[error("object {0:?} already exists")]
    AlreadyExists(String),
    /// The pool has no room for the object's replicas, even after evicting what may be
    /// evicted (or fewer segments are mounted than replicas asked for).
    #[error("no space for {size} bytes x {replicas} replica(s) (after eviction): {detail}")]
    NoSpace {
        /// The object's size, in bytes.
        size: u64,
        /// Replicas asked for.
        replicas: u32,
        /// What was short (segments mounted, bytes free).
        detail: String,
    },
    /// A remove without `force` of an object a reader holds a lease on.
    #[error("object {0:?} is leased by a reader; retry after the lease or force")]
    Leased(String),
    /// The object's put has started but not ended: it cannot be read, removed or copied yet.
    #[error("object {0:?} is still being written")]
    NotReady(String),
    /// The master has no segment of this name.
    #[error("segment {0} is not mounted")]
    SegmentNotFound(String),
    /// A mount of a segment name another client holds.
    #[error("segment {0} is already mounted by another client")]
    SegmentExists(String),
    /// The master knows no client of this id.
    #[error("client {0} is not known to the master")]
    ClientNotFound(String),
    /// The master has no replica task of this id: never created, forgotten (only the latest
    /// finished tasks are kept), or created at a master that has since been replaced.
    #[error("task {0} not found")]
    TaskNotFound(String),
    /// Too many replica tasks wait for their clients already: create it later.
    #[error("too many pending tasks: {0}")]
    TooManyTasks(String),
    /// A put's blank (a placement granted ahead, see the master's `blanks`) is not, or no
    /// longer, this client's at this master: expired, released, or granted by another master.
    /// Nothing was stored; the client puts the value the usual way.
    #[error("blank gone: {0}")]
    BlankGone(String),
    /// The master forgot this client (it missed its pings past the TTL, or the master
    /// restarted): it must mount its segments again before its calls succeed.
    #[error("the master dropped this client (silent past its TTL): remount needed")]
    NeedRemount,
    /// A read from memory ended after the object's read lease: the bytes may have been
    /// replaced meanwhile, so they are not returned (get it again).
    #[error("reading object {key:?} took {took_ms} ms, past its {lease_ms} ms read lease; get it again")]
    LeaseExpired {
        /// The object's key.
        key: String,
        /// The read lease the master granted, in milliseconds.
        lease_ms: u64,
        /// How long the read took, in milliseconds.
        took_ms: u64,
    },

    /// With checksums on ([`crate::ClientConfig::verify_checksums`]), a get read the whole
    /// value and its bytes do not match the checksum its writer took at the put: they were
    /// changed after it (in the holder's memory, on the way, or by a read that raced a reuse
    /// of the space), so they are not returned. Every replica the get could read was tried.
    #[error(
        "object {key:?} read back with CRC-32 {got:#010x}, not the {expected:#010x} its writer took: its bytes \
         were changed after the put, and none are returned"
    )]
    ChecksumMismatch {
        /// The object's key.
        key: String,
        /// The checksum the writer took (kept by the master).
        expected: u32,
        /// The checksum of the bytes read.
        got: u32,
    },

    // ---- peers ----
    /// The client that holds the object's replica (or its disk file) could not be read
    /// from or written to; `cause` says how.
    #[error("the holder of object {key:?} is gone: {cause}")]
    PeerGone {
        /// The object's key.
        key: String,
        /// What failed.
        #[source]
        cause: PeerFault,
    },

    // ---- the master ----
    /// No connection to the master, or the call broke off on the way (the source says how).
    #[error("master at {addr} is unreachable: {source}")]
    MasterUnreachable {
        /// The master's RPC address.
        addr: String,
        /// The connection's or the call's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The master refused the call's credentials (gRPC `UNAUTHENTICATED` or
    /// `PERMISSION_DENIED`): it runs with a cluster secret and this client has none, or
    /// another one. The caller's configuration; retrying cannot help, so it is not retried.
    #[error(
        "the master at {addr} refused this client: the master requires the cluster secret (set \
         CRESCENT_CLUSTER_SECRET_FILE or CRESCENT_CLUSTER_SECRET to the master's secret): {source}"
    )]
    Unauthenticated {
        /// The master's RPC address.
        addr: String,
        /// The master's refusal.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The master answered with an error this client has no other variant for.
    #[error("master replied {code:?}: {message}")]
    Master {
        /// The reply's code.
        code: Code,
        /// The reply's text.
        message: String,
    },
    /// The master's reply makes no sense (no status, a batch reply of the wrong length, an
    /// event stream that ended).
    #[error("bad reply from the master: {0}")]
    BadReply(String),
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

    // ---- a dummy client's standalone client ----
    /// The standalone client (`crescent-client`) cannot be reached, or the connection to it
    /// broke during the call. Retryable: the dummy client reconnects by itself (sharing its
    /// buffers again) once the standalone client is back.
    #[error("standalone client at {addr} is unavailable: {source}")]
    StandaloneUnavailable {
        /// The standalone client's address.
        addr: String,
        /// The connect's or the connection's error.
        #[source]
        source: std::io::Error,
    },
    /// The other end of the standalone wire broke its protocol (a frame past the limits, a
    /// message that does not decode, a reply that does not fit the call).
    #[error("standalone wire: {0}")]
    BadFrame(String),
    /// An error the standalone client reported for which this side has no exact variant (a
    /// peer's, the engine's, the disk tier's): its text, whose fault and whether a retry may
    /// help, as the standalone client judged them.
    #[error("{message}")]
    Relayed {
        /// Whose fault, as the standalone client judged it.
        fault: Fault,
        /// Whether the same call may succeed if made again.
        retryable: bool,
        /// The wire code it maps to.
        code: Code,
        /// The original error's text.
        message: String,
    },

    // ---- either: a deadline ----
    /// The call's deadline passed while it waited for `waited`; whose fault depends on what
    /// it waited for.
    #[error("timed out after {after:?} waiting for {waited}")]
    TimedOut {
        /// What it was waiting for.
        waited: Waited,
        /// The time it had.
        after: Duration,
    },

    // ---- the engine, the disk tier, this process ----
    /// The transfer engine refused or failed a call: the caller's fault when the engine's
    /// error is ([`EngineError::is_caller_error`]), a peer's otherwise.
    #[error("transfer engine: {0}")]
    Engine(#[from] EngineError),
    /// The disk tier failed: a file could not be created, written or read, or a remote
    /// disk read ended short; the text names the file or the object.
    #[error("disk tier: {0}")]
    Disk(String),
    /// The disk tier's file system refused a call on one of its files (`ENOSPC` on a full
    /// disk, `EIO`, ...): `what` it was doing, to which file, and the system's error.
    #[error("disk tier: {what} {}: {source}", path.display())]
    DiskIo {
        /// What failed (`"writing"`, `"flushing"`, `"reading"`).
        what: &'static str,
        /// The file (or directory).
        path: std::path::PathBuf,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// A disk file's header or contents do not check out (a torn write, a foreign file).
    #[error("corrupt disk file: {0}")]
    CorruptFile(String),
    /// A fault of this process's system (a thread or a runtime that cannot start, a socket).
    #[error("{what}: {source}")]
    System {
        /// What failed (`"starting a tokio runtime"`).
        what: String,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// A buffer given to an op as memory of a GPU that is not registered memory of that GPU
    /// (register it with `register_buffer` first; a dummy client moves host memory only).
    #[error("{key:?}: buffer [{addr:#x}, +{len}) is not registered memory of cuda:{device}: register it with register_buffer first")]
    DeviceMemory {
        /// The op's key.
        key: String,
        /// The GPU (`cuda:N`).
        device: u32,
        /// The buffer's first byte (a device pointer).
        addr: u64,
        /// Its length.
        len: u64,
    },
    /// A broken invariant of the store itself.
    #[error("internal error: {0}")]
    Internal(String),
}

/// What went wrong with a peer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PeerFault {
    /// The engine could not reach it or move the bytes.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// A transfer to or from it failed (the slice's typed reason).
    #[error("transfer failed: {0}")]
    Transfer(#[source] crescent_engine::FailureReason),
    /// Its disk service could not be reached or broke off.
    #[error("disk service {service}: {source}")]
    DiskService {
        /// The disk service's address.
        service: String,
        /// The connection's error.
        #[source]
        source: std::io::Error,
    },
    /// The master lists no replica that can be read.
    #[error("no readable replica")]
    NoReplica,
}

/// What a request waited for when its deadline passed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Waited {
    /// The master's answer.
    Master {
        /// The master's RPC address.
        addr: String,
    },
    /// The transfer of an object's bytes.
    Transfer {
        /// The object's key.
        key: String,
    },
    /// Room in the client's staging buffer (held by other calls or remote disk readers).
    Staging {
        /// Bytes asked for.
        len: u64,
    },
    /// A dummy client's standalone client: its answer to a call.
    Standalone {
        /// The standalone client's address.
        addr: String,
    },
}

impl std::fmt::Display for Waited {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Waited::Master { addr } => write!(f, "the master at {addr}"),
            Waited::Transfer { key } => write!(f, "moving object {key:?}"),
            Waited::Staging { len } => write!(f, "{len} bytes of the staging buffer"),
            Waited::Standalone { addr } => write!(f, "the standalone client at {addr}"),
        }
    }
}

/// Whether `e` says the file system (or the user's quota on it) has no room left.
pub fn is_no_space(e: &std::io::Error) -> bool {
    let full = [rustix::io::Errno::NOSPC, rustix::io::Errno::DQUOT];
    e.raw_os_error().is_some_and(|n| full.iter().any(|f| f.raw_os_error() == n))
}

/// The store's `Result`: [`StoreError`] unless said otherwise.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// The errors that are a bad argument or configuration of the caller's, as a pattern: they
/// are the caller's [`Fault`] and go on the wire as `INVALID_ARGUMENT`.
macro_rules! bad_argument {
    () => {
        StoreError::InvalidArgument(_)
            | StoreError::Config(_)
            | StoreError::StorageRoot { .. }
            | StoreError::NotRegistered { .. }
            | StoreError::BufferTooSmall { .. }
            | StoreError::BadRange { .. }
            | StoreError::DeviceMemory { .. }
            | StoreError::Unauthenticated { .. }
    };
}

impl StoreError {
    /// An [`StoreError::InvalidArgument`].
    pub fn invalid(why: impl Into<String>) -> StoreError {
        StoreError::InvalidArgument(why.into())
    }

    /// A [`StoreError::System`] fault: `what` failed with `source`.
    pub fn system(what: impl Into<String>, source: std::io::Error) -> StoreError {
        StoreError::System { what: what.into(), source }
    }

    /// The master at `addr` could not be reached (`source`: the connection's or the call's
    /// error).
    pub fn master_unreachable(addr: &str, source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> StoreError {
        StoreError::MasterUnreachable { addr: addr.to_string(), source: source.into() }
    }

    /// The holder of `key` failed us.
    pub fn peer_gone(key: &str, cause: impl Into<PeerFault>) -> StoreError {
        StoreError::PeerGone { key: key.to_string(), cause: cause.into() }
    }

    /// Whose fault the error is.
    pub fn fault(&self) -> Fault {
        match self {
            bad_argument!() => Fault::Caller,
            StoreError::NotFound(_)
            | StoreError::AlreadyExists(_)
            | StoreError::NoSpace { .. }
            | StoreError::Leased(_)
            | StoreError::NotReady(_)
            | StoreError::SegmentNotFound(_)
            | StoreError::ClientNotFound(_)
            | StoreError::TaskNotFound(_)
            | StoreError::TooManyTasks(_)
            | StoreError::BlankGone(_)
            | StoreError::NeedRemount
            | StoreError::LeaseExpired { .. } => Fault::Answer,
            // Mounting a segment another client holds: this client's configuration.
            StoreError::SegmentExists(_) => Fault::Caller,
            StoreError::PeerGone { .. } => Fault::Peer,
            // The bytes changed where they were kept or on their way: the holder's side.
            StoreError::ChecksumMismatch { .. } => Fault::Peer,
            StoreError::MasterUnreachable { .. }
            | StoreError::Master { .. }
            | StoreError::BadReply(_)
            | StoreError::NotLeader(_)
            | StoreError::MasterChanged(_) => Fault::Master,
            // The owners of the replicas did not acknowledge: peers.
            StoreError::OwnersUnreachable(_) => Fault::Peer,
            StoreError::TimedOut { waited: Waited::Master { .. }, .. } => Fault::Master,
            StoreError::TimedOut { waited: Waited::Transfer { .. }, .. } => Fault::Peer,
            StoreError::TimedOut { waited: Waited::Staging { .. }, .. } => Fault::Local,
            StoreError::TimedOut { waited: Waited::Standalone { .. }, .. } => Fault::Peer,
            StoreError::StandaloneUnavailable { .. } | StoreError::BadFrame(_) => Fault::Peer,
            StoreError::Relayed { fault, .. } => *fault,
            StoreError::Engine(e) if e.is_caller_error() => Fault::Caller,
            StoreError::Engine(_) => Fault::Peer,
            StoreError::Disk(_)
            | StoreError::DiskIo { .. }
            | StoreError::CorruptFile(_)
            | StoreError::System { .. }
            | StoreError::Internal(_) => Fault::Local,
        }
    }

    /// True when the error comes from how the caller used the API.
    pub fn is_caller_error(&self) -> bool {
        self.fault() == Fault::Caller
    }

    /// True when the same call may succeed if made again (later, or after the client
    /// remounted): a peer or the master failed for now, a lease or an unfinished put is in the
    /// way, room may be freed. A caller's mistake, or an answer that will not change by
    /// itself (not found, already exists), is not.
    pub fn is_retryable(&self) -> bool {
        match self {
            StoreError::Leased(_)
            | StoreError::NotReady(_)
            | StoreError::NoSpace { .. }
            | StoreError::TooManyTasks(_)
            | StoreError::BlankGone(_)
            | StoreError::NeedRemount
            | StoreError::LeaseExpired { .. }
            | StoreError::PeerGone { .. }
            | StoreError::MasterUnreachable { .. }
            | StoreError::StandaloneUnavailable { .. }
            | StoreError::NotLeader(_)
            | StoreError::MasterChanged(_)
            | StoreError::OwnersUnreachable(_)
            | StoreError::TimedOut { .. } => true,
            StoreError::Relayed { retryable, .. } => *retryable,
            StoreError::Engine(e) => !e.is_caller_error(),
            _ => false,
        }
    }

    /// True when a file system refused a write for want of space (`ENOSPC`, or `EDQUOT`: a
    /// quota is full): the disk is full, not broken.
    pub fn is_disk_full(&self) -> bool {
        matches!(self, StoreError::DiskIo { source, .. } | StoreError::StorageRoot { source, .. } if is_no_space(source))
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
            bad_argument!() => Code::InvalidArgument,
            StoreError::NotFound(_) => Code::ObjectNotFound,
            StoreError::AlreadyExists(_) => Code::ObjectAlreadyExists,
            StoreError::NoSpace { .. } => Code::NoSpace,
            StoreError::Leased(_) => Code::ObjectLeased,
            StoreError::NotReady(_) => Code::ObjectNotReady,
            StoreError::SegmentNotFound(_) => Code::SegmentNotFound,
            StoreError::SegmentExists(_) => Code::SegmentAlreadyExists,
            StoreError::ClientNotFound(_) => Code::ClientNotFound,
            StoreError::TaskNotFound(_) => Code::TaskNotFound,
            StoreError::TooManyTasks(_) => Code::TaskPendingLimitExceeded,
            StoreError::BlankGone(_) => Code::BlankGone,
            StoreError::NeedRemount => Code::NeedRemount,
            StoreError::LeaseExpired { .. } => Code::LeaseExpired,
            StoreError::NotLeader(_) => Code::NotLeader,
            StoreError::MasterChanged(_) => Code::MasterChanged,
            StoreError::OwnersUnreachable(_) => Code::OwnersUnreachable,
            StoreError::ChecksumMismatch { .. } => Code::ChecksumMismatch,
            StoreError::Master { code, .. } | StoreError::Relayed { code, .. } => *code,
            _ => Code::Internal,
        }
    }

    /// Rebuilds an error from a master's status (code + message, the error's text); `key`
    /// names the object. The fields the text carries come back: a caller's mistake keeps its
    /// words without a second prefix, `NoSpace` its size and replica count.
    pub fn from_status(code: Code, message: &str, key: &str) -> StoreError {
        let after = |prefix: &str| message.strip_prefix(prefix).unwrap_or(message).to_string();
        let between = |prefix: &str, suffix: &str| {
            message.strip_prefix(prefix).and_then(|m| m.strip_suffix(suffix)).unwrap_or(message).to_string()
        };
        match code {
            Code::InvalidArgument => match message.strip_prefix("invalid configuration: ") {
                Some(m) => StoreError::Config(m.to_string()),
                None => StoreError::InvalidArgument(after("invalid argument: ")),
            },
            Code::ObjectNotFound => StoreError::NotFound(key.to_string()),
            Code::ObjectAlreadyExists => StoreError::AlreadyExists(key.to_string()),
            Code::NoSpace => parse_no_space(message).unwrap_or(StoreError::NoSpace {
                size: 0,
                replicas: 0,
                detail: message.to_string(),
            }),
            Code::ObjectLeased => StoreError::Leased(key.to_string()),
            Code::ObjectNotReady => StoreError::NotReady(key.to_string()),
            Code::SegmentNotFound => StoreError::SegmentNotFound(between("segment ", " is not mounted")),
            Code::SegmentAlreadyExists => {
                StoreError::SegmentExists(between("segment ", " is already mounted by another client"))
            }
            Code::ClientNotFound => StoreError::ClientNotFound(between("client ", " is not known to the master")),
            Code::NeedRemount => StoreError::NeedRemount,
            Code::TaskNotFound => StoreError::TaskNotFound(between("task ", " not found")),
            Code::TaskPendingLimitExceeded => StoreError::TooManyTasks(after("too many pending tasks: ")),
            Code::BlankGone => StoreError::BlankGone(after("blank gone: ")),
            Code::LeaseExpired => parse_lease_expired(message, key).unwrap_or(StoreError::LeaseExpired {
                key: key.to_string(),
                lease_ms: 0,
                took_ms: 0,
            }),
            Code::NotLeader => StoreError::NotLeader(after("not the leader: ")),
            Code::MasterChanged => StoreError::MasterChanged(after("the master changed: ")),
            Code::OwnersUnreachable => StoreError::OwnersUnreachable(key.to_string()),
            Code::ChecksumMismatch => parse_checksum_mismatch(message, key)
                .unwrap_or(StoreError::Master { code, message: message.to_string() }),
            code => StoreError::Master { code, message: message.to_string() },
        }
    }
}

/// `NoSpace`'s fields back from its text.
fn parse_no_space(message: &str) -> Option<StoreError> {
    let rest = message.strip_prefix("no space for ")?;
    let (size, rest) = rest.split_once(" bytes x ")?;
    let (replicas, detail) = rest.split_once(" replica(s) (after eviction): ")?;
    Some(StoreError::NoSpace { size: size.parse().ok()?, replicas: replicas.parse().ok()?, detail: detail.to_string() })
}

/// `ChecksumMismatch`'s checksums back from its text.
fn parse_checksum_mismatch(message: &str, key: &str) -> Option<StoreError> {
    let hex = |s: &str| u32::from_str_radix(s.strip_prefix("0x")?, 16).ok();
    let (_, rest) = message.split_once(" read back with CRC-32 ")?;
    let (got, rest) = rest.split_once(", not the ")?;
    let (expected, _) = rest.split_once(' ')?;
    Some(StoreError::ChecksumMismatch { key: key.to_string(), expected: hex(expected)?, got: hex(got)? })
}

/// `LeaseExpired`'s durations back from its text.
fn parse_lease_expired(message: &str, key: &str) -> Option<StoreError> {
    let (_, rest) = message.split_once(" took ")?;
    let (took, rest) = rest.split_once(" ms, past its ")?;
    let (lease, _) = rest.split_once(" ms read lease")?;
    Some(StoreError::LeaseExpired { key: key.to_string(), lease_ms: lease.parse().ok()?, took_ms: took.parse().ok()? })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_rebuilt_from_a_status_keep_their_fields_and_one_prefix() {
        let cases = [
            StoreError::invalid("object size 0 is not in 1..=1024"),
            StoreError::Config("global_segment_size is 0".into()),
            StoreError::NotFound("k".into()),
            StoreError::AlreadyExists("k".into()),
            StoreError::NoSpace { size: 4096, replicas: 2, detail: "1 memory segment(s) mounted".into() },
            StoreError::Leased("k".into()),
            StoreError::NotReady("k".into()),
            StoreError::SegmentNotFound("127.0.0.1:5000".into()),
            StoreError::SegmentExists("127.0.0.1:5000".into()),
            StoreError::ClientNotFound("c-1".into()),
            StoreError::NeedRemount,
            StoreError::LeaseExpired { key: "k".into(), lease_ms: 100, took_ms: 250 },
            StoreError::ChecksumMismatch { key: "k".into(), expected: 0xdead_beef, got: 0 },
            StoreError::NotLeader("this master is a standby; the leader is 10.0.0.2:50051".into()),
            StoreError::MasterChanged("this master does not know the put".into()),
            StoreError::OwnersUnreachable("k".into()),
        ];
        for e in cases {
            let back = StoreError::from_status(e.code(), &e.to_string(), "k");
            assert_eq!(back.to_string(), e.to_string(), "{e:?} came back as {back:?}");
            assert_eq!(back.code(), e.code());
            assert_eq!(back.fault(), e.fault(), "{e}");
        }
        let e = StoreError::from_status(
            Code::NoSpace,
            "no space for 4096 bytes x 2 replica(s) (after eviction): full",
            "k",
        );
        assert!(matches!(e, StoreError::NoSpace { size: 4096, replicas: 2, .. }), "{e:?}");
        // A code without a variant of its own: the master's fault, its code kept.
        let e = StoreError::from_status(Code::Internal, "lock poisoned", "k");
        assert_eq!((e.code(), e.fault()), (Code::Internal, Fault::Master));
    }

    #[test]
    fn the_type_says_whose_fault_and_whether_to_retry() {
        use std::error::Error as _;
        let gone = StoreError::peer_gone("k", EngineError::TimedOut);
        assert_eq!(gone.fault(), Fault::Peer);
        assert!(gone.is_retryable() && !gone.is_caller_error());
        assert!(gone.source().is_some_and(|s| s.to_string().contains("timed out")), "the engine's error is chained");
        let down = StoreError::master_unreachable("m:1", std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(down.fault(), Fault::Master);
        assert!(down.is_retryable() && down.source().is_some());
        for e in [
            StoreError::invalid("x"),
            StoreError::NotRegistered { addr: 1, len: 2 },
            StoreError::BadRange { key: "k".into(), offset: 5, len: 1, size: 5 },
            StoreError::BufferTooSmall { key: "k".into(), need: 2, have: 1 },
        ] {
            assert!(e.is_caller_error() && !e.is_retryable(), "{e}");
            assert_eq!(e.code(), Code::InvalidArgument);
        }
        let staging = StoreError::TimedOut { waited: Waited::Staging { len: 4096 }, after: Duration::from_secs(1) };
        assert_eq!(staging.fault(), Fault::Local);
        assert!(staging.is_retryable());
        assert!(!StoreError::NotFound("k".into()).is_retryable());
        assert!(StoreError::NeedRemount.is_retryable());
    }
}
