//! The standalone wire's messages: a dummy client's [`Request`]s and the standalone client's
//! [`Reply`]s, encoded with postcard inside [`super::frame`]s. Bulk bytes (values given or
//! returned as bytes) travel in the frame's payload, never in the message.
//!
//! Memory is named by *region* (a memfd the dummy client shared, [`Request::Share`]) and an
//! offset in it ([`Mem`]): the standalone client maps each region once, registers it with its
//! engine, and reads or writes the dummy client's pages there. Raw addresses of the dummy
//! client never cross the wire.
//!
//! Errors cross as [`WireError`]: the caller's mistakes and the store's answers come back as
//! the very [`StoreError`] variants; anything else as [`StoreError::Relayed`] with its text,
//! fault and retryability.

use serde::{Deserialize, Serialize};

use crate::error::{Fault, StoreError};
use crate::proto::Code;

/// The protocol's version, exchanged in [`Request::Hello`].
pub const VERSION: u32 = 2;

/// `len` bytes at `offset` of shared region `region`.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mem {
    pub region: u32,
    pub offset: u64,
    pub len: u64,
}

/// The range `[offset, +dst.len)` of a value, read into `dst`.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    pub offset: u64,
    pub dst: Mem,
}

/// A dummy client's call. `options` are a prost-encoded [`crate::proto::PutOptions`].
#[derive(Serialize, Deserialize, Debug)]
pub enum Request {
    /// The first message of a connection: who calls (its id, stable across reconnects).
    Hello {
        version: u32,
        client_id: String,
    },
    /// Shares a memfd (attached) as region `region` of `len` bytes.
    Share {
        region: u32,
        len: u64,
    },
    /// Ends the sharing of a region.
    Unshare {
        region: u32,
    },
    Ping,
    /// Whether the standalone client's master answers.
    Health,
    /// The value is the payload. `upsert`: replacing the key's value if it has one.
    Put {
        key: String,
        options: Vec<u8>,
        upsert: bool,
    },
    PutFrom {
        key: String,
        pieces: Vec<Mem>,
        options: Vec<u8>,
        upsert: bool,
    },
    Get {
        key: String,
    },
    GetInto {
        key: String,
        pieces: Vec<Mem>,
    },
    GetRanges {
        key: String,
        ranges: Vec<Span>,
    },
    /// The values, one after another, are the payload.
    PutBatch {
        keys: Vec<String>,
        lens: Vec<u64>,
        options: Vec<u8>,
        upsert: bool,
    },
    PutFromBatch {
        keys: Vec<String>,
        values: Vec<Vec<Mem>>,
        options: Vec<u8>,
        upsert: bool,
    },
    GetBatch {
        keys: Vec<String>,
    },
    GetIntoBatch {
        keys: Vec<String>,
        values: Vec<Vec<Mem>>,
    },
    GetRangesBatch {
        keys: Vec<String>,
        ranges: Vec<Vec<Span>>,
    },
    Exists {
        key: String,
    },
    BatchExists {
        keys: Vec<String>,
    },
    Query {
        key: String,
    },
    GetSize {
        key: String,
    },
    Remove {
        key: String,
        force: bool,
    },
    RemoveByRegex {
        pattern: String,
        force: bool,
    },
    RemoveAll {
        force: bool,
    },
}

/// The standalone client's answer to one request.
#[derive(Serialize, Deserialize, Debug)]
pub enum Reply {
    /// To `Hello`: whether this client's regions are still shared (another connection of it
    /// is open), and what `default_options` needs.
    Hello {
        version: u32,
        known: bool,
        segment_name: String,
        replica_num: u32,
    },
    Done,
    Fail(WireError),
    Size(u64),
    Bool(bool),
    Bools(Vec<bool>),
    /// The value is the payload.
    Bytes,
    /// A prost-encoded [`crate::proto::QueryKeyReply`].
    Query(Vec<u8>),
    /// One per key; `Outcome::Bytes` values lie one after another in the payload.
    Results(Vec<Outcome>),
}

/// One key's result in a batch.
#[derive(Serialize, Deserialize, Debug)]
pub enum Outcome {
    Done,
    Size(u64),
    /// This many bytes of the payload.
    Bytes(u64),
    Fail(WireError),
}

/// A [`StoreError`] on the wire.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum WireError {
    Invalid(String),
    Config(String),
    NotRegistered {
        addr: u64,
        len: u64,
    },
    BufferTooSmall {
        key: String,
        need: u64,
        have: u64,
    },
    BadRange {
        key: String,
        offset: u64,
        len: u64,
        size: u64,
    },
    /// An answer about an object or a client, rebuilt by [`StoreError::from_status`].
    Status {
        code: i32,
        message: String,
        key: String,
    },
    /// Anything else.
    Relayed {
        fault: u8,
        retryable: bool,
        code: i32,
        message: String,
    },
}

fn fault_byte(f: Fault) -> u8 {
    match f {
        Fault::Caller => 0,
        Fault::Peer => 1,
        Fault::Master => 2,
        Fault::Local => 3,
        Fault::Answer => 4,
    }
}

fn byte_fault(b: u8) -> Fault {
    match b {
        0 => Fault::Caller,
        1 => Fault::Peer,
        2 => Fault::Master,
        4 => Fault::Answer,
        _ => Fault::Local,
    }
}

impl From<&StoreError> for WireError {
    fn from(e: &StoreError) -> WireError {
        let status = |key: &str| WireError::Status { code: e.code() as i32, message: e.to_string(), key: key.into() };
        match e {
            StoreError::InvalidArgument(m) => WireError::Invalid(m.clone()),
            StoreError::Config(m) => WireError::Config(m.clone()),
            StoreError::NotRegistered { addr, len } => WireError::NotRegistered { addr: *addr, len: *len },
            StoreError::BufferTooSmall { key, need, have } => {
                WireError::BufferTooSmall { key: key.clone(), need: *need, have: *have }
            }
            StoreError::BadRange { key, offset, len, size } => {
                WireError::BadRange { key: key.clone(), offset: *offset, len: *len, size: *size }
            }
            StoreError::NotFound(k)
            | StoreError::AlreadyExists(k)
            | StoreError::Leased(k)
            | StoreError::NotReady(k) => status(k),
            StoreError::LeaseExpired { key, .. } => status(key),
            StoreError::NoSpace { .. }
            | StoreError::SegmentNotFound(_)
            | StoreError::SegmentExists(_)
            | StoreError::ClientNotFound(_)
            | StoreError::NeedRemount
            | StoreError::Master { .. } => status(""),
            other => WireError::Relayed {
                fault: fault_byte(other.fault()),
                retryable: other.is_retryable(),
                code: other.code() as i32,
                message: other.to_string(),
            },
        }
    }
}

impl From<WireError> for StoreError {
    fn from(e: WireError) -> StoreError {
        match e {
            WireError::Invalid(m) => StoreError::InvalidArgument(m),
            WireError::Config(m) => StoreError::Config(m),
            WireError::NotRegistered { addr, len } => StoreError::NotRegistered { addr, len },
            WireError::BufferTooSmall { key, need, have } => StoreError::BufferTooSmall { key, need, have },
            WireError::BadRange { key, offset, len, size } => StoreError::BadRange { key, offset, len, size },
            WireError::Status { code, message, key } => {
                StoreError::from_status(Code::try_from(code).unwrap_or(Code::Internal), &message, &key)
            }
            WireError::Relayed { fault, retryable, code, message } => StoreError::Relayed {
                fault: byte_fault(fault),
                retryable,
                code: Code::try_from(code).unwrap_or(Code::Internal),
                message,
            },
        }
    }
}

/// Encodes a message (it cannot fail for these types; a failure is an internal error).
pub fn encode<T: Serialize>(m: &T) -> Result<Vec<u8>, StoreError> {
    postcard::to_stdvec(m).map_err(|e| StoreError::Internal(format!("encoding a standalone message: {e}")))
}

/// Decodes a message from untrusted bytes.
pub fn decode<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, StoreError> {
    postcard::from_bytes(bytes).map_err(|e| StoreError::BadFrame(format!("a message does not decode: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::PeerFault;

    #[test]
    fn errors_cross_with_their_variant_or_their_fault_and_retryability() {
        let exact = [
            StoreError::invalid("x"),
            StoreError::Config("y".into()),
            StoreError::NotRegistered { addr: 0x1000, len: 5 },
            StoreError::BufferTooSmall { key: "k".into(), need: 10, have: 5 },
            StoreError::BadRange { key: "k".into(), offset: 9, len: 2, size: 10 },
            StoreError::NotFound("k".into()),
            StoreError::Leased("k".into()),
            StoreError::NoSpace { size: 4096, replicas: 1, detail: "full".into() },
            StoreError::LeaseExpired { key: "k".into(), lease_ms: 10, took_ms: 20 },
        ];
        for e in exact {
            let back = StoreError::from(WireError::from(&e));
            assert_eq!(back.to_string(), e.to_string());
            assert_eq!((back.fault(), back.is_retryable(), back.code()), (e.fault(), e.is_retryable(), e.code()));
            assert_eq!(std::mem::discriminant(&back), std::mem::discriminant(&e), "{e:?} came back as {back:?}");
        }
        let relayed = [
            StoreError::peer_gone("k", PeerFault::NoReplica),
            StoreError::master_unreachable("m:1", "refused"),
            StoreError::Disk("full".into()),
        ];
        for e in relayed {
            let back = StoreError::from(WireError::from(&e));
            assert!(matches!(back, StoreError::Relayed { .. }));
            assert_eq!(back.to_string(), e.to_string());
            assert_eq!((back.fault(), back.is_retryable(), back.code()), (e.fault(), e.is_retryable(), e.code()));
        }
    }

    #[test]
    fn garbage_does_not_decode() {
        assert!(matches!(decode::<Request>(&[0xff; 7]), Err(StoreError::BadFrame(_))));
        // A length prefix promising more than there is.
        let mut m = encode(&Request::Get { key: "k".into() }).unwrap();
        m[1] = 0x7f;
        assert!(decode::<Request>(&m).is_err());
        let r: Request = decode(&encode(&Request::RemoveAll { force: true }).unwrap()).unwrap();
        assert!(matches!(r, Request::RemoveAll { force: true }));
    }
}
