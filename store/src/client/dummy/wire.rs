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
    /// The shared region's id.
    pub region: u32,
    /// Offset in the region, in bytes.
    pub offset: u64,
    /// Length, in bytes.
    pub len: u64,
}

/// The range `[offset, +dst.len)` of a value, read into `dst`.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// Where the range starts in the value, in bytes.
    pub offset: u64,
    /// The shared memory receiving it (its `len` is the range's length).
    pub dst: Mem,
}

/// A dummy client's call. `options` are a prost-encoded [`crate::proto::PutOptions`].
#[derive(Serialize, Deserialize, Debug)]
pub enum Request {
    /// The first message of a connection: who calls (its id, stable across reconnects).
    Hello {
        /// The caller's [`VERSION`]; another version is refused.
        version: u32,
        /// The dummy client's id.
        client_id: String,
    },
    /// Shares a memfd (attached) as region `region` of `len` bytes.
    Share {
        /// The id the dummy client gives the region.
        region: u32,
        /// Its length, in bytes (the memfd must be as long).
        len: u64,
    },
    /// Ends the sharing of a region.
    Unshare {
        /// The region's id.
        region: u32,
    },
    /// Keeps the connection alive; answered `Done`.
    Ping,
    /// Whether the standalone client's master answers.
    Health,
    /// The value is the payload. `upsert`: replacing the key's value if it has one.
    Put {
        /// The object's key.
        key: String,
        /// The put's options, prost-encoded (empty: the standalone client's defaults).
        options: Vec<u8>,
        /// Replace the key's value if it has one (an upsert) instead of leaving it.
        upsert: bool,
    },
    /// Zero-copy put of the value held by `pieces`; answered `Done`.
    PutFrom {
        /// The object's key.
        key: String,
        /// Shared memory holding the value, in order.
        pieces: Vec<Mem>,
        /// The put's options, prost-encoded (empty: the standalone client's defaults).
        options: Vec<u8>,
        /// Replace the key's value if it has one (an upsert) instead of leaving it.
        upsert: bool,
    },
    /// The whole value, answered `Bytes` (the value in the payload).
    Get {
        /// The object's key.
        key: String,
    },
    /// Zero-copy get of the whole value into `pieces`; answered `Size`.
    GetInto {
        /// The object's key.
        key: String,
        /// Shared memory receiving the value, in order.
        pieces: Vec<Mem>,
    },
    /// Zero-copy get of ranges of the value; answered `Size` (the bytes read).
    GetRanges {
        /// The object's key.
        key: String,
        /// The ranges to read, each into shared memory.
        ranges: Vec<Span>,
    },
    /// The values, one after another, are the payload.
    PutBatch {
        /// The objects' keys.
        keys: Vec<String>,
        /// Per key, the length of its value in the payload, in bytes.
        lens: Vec<u64>,
        /// The put's options, prost-encoded (empty: the standalone client's defaults).
        options: Vec<u8>,
        /// Replace the key's value if it has one (an upsert) instead of leaving it.
        upsert: bool,
    },
    /// Zero-copy puts of several values; answered `Results`.
    PutFromBatch {
        /// The objects' keys.
        keys: Vec<String>,
        /// Per key, its pieces of shared memory, in order.
        values: Vec<Vec<Mem>>,
        /// The put's options, prost-encoded (empty: the standalone client's defaults).
        options: Vec<u8>,
        /// Replace the key's value if it has one (an upsert) instead of leaving it.
        upsert: bool,
    },
    /// Several values, answered `Results` with the values one after another in the payload.
    GetBatch {
        /// The objects' keys.
        keys: Vec<String>,
    },
    /// Zero-copy gets of several whole values; answered `Results` of sizes.
    GetIntoBatch {
        /// The objects' keys.
        keys: Vec<String>,
        /// Per key, its pieces of shared memory, in order.
        values: Vec<Vec<Mem>>,
    },
    /// Zero-copy gets of ranges of several values; answered `Results` of sizes.
    GetRangesBatch {
        /// The objects' keys.
        keys: Vec<String>,
        /// Per key, the ranges to read, each into shared memory.
        ranges: Vec<Vec<Span>>,
    },
    /// Whether a committed object has the key; answered `Bool`.
    Exists {
        /// The object's key.
        key: String,
    },
    /// [`Request::Exists`] for several keys; answered `Bools`.
    BatchExists {
        /// The objects' keys.
        keys: Vec<String>,
    },
    /// Everything the master knows of the key; answered `Query`.
    Query {
        /// The object's key.
        key: String,
    },
    /// The object's size; answered `Size`.
    GetSize {
        /// The object's key.
        key: String,
    },
    /// Removes the object; answered `Done`.
    Remove {
        /// The object's key.
        key: String,
        /// Remove leased objects too.
        force: bool,
    },
    /// Removes every object whose key matches; answered `Size` (how many).
    RemoveByRegex {
        /// A regular expression; keys it matches anywhere are removed.
        pattern: String,
        /// Remove leased objects too.
        force: bool,
    },
    /// Removes every object; answered `Size` (how many).
    RemoveAll {
        /// Remove leased objects too.
        force: bool,
    },
}

/// The standalone client's answer to one request.
#[derive(Serialize, Deserialize, Debug)]
pub enum Reply {
    /// To `Hello`: whether this client's regions are still shared (another connection of it
    /// is open), and what `default_options` needs.
    Hello {
        /// The standalone client's [`VERSION`].
        version: u32,
        /// True when this client's regions are still shared (it need not share them again).
        known: bool,
        /// The standalone client's segment (what `local_first` puts prefer).
        segment_name: String,
        /// Its configured replicas per put.
        replica_num: u32,
    },
    /// The call succeeded and returns nothing.
    Done,
    /// The call failed.
    Fail(WireError),
    /// A size or a count: bytes read, an object's size, objects removed.
    Size(u64),
    /// A yes or no (`Exists`, `Health`).
    Bool(bool),
    /// One yes or no per key (`BatchExists`).
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
    /// The key's call succeeded (a put).
    Done,
    /// Bytes read into the key's memory.
    Size(u64),
    /// This many bytes of the payload.
    Bytes(u64),
    /// The key's call failed.
    Fail(WireError),
}

/// A [`StoreError`] on the wire.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum WireError {
    /// [`StoreError::InvalidArgument`].
    Invalid(String),
    /// [`StoreError::Config`].
    Config(String),
    /// [`StoreError::NotRegistered`].
    NotRegistered {
        /// The buffer's address in the dummy client.
        addr: u64,
        /// Its length, in bytes.
        len: u64,
    },
    /// [`StoreError::BufferTooSmall`].
    BufferTooSmall {
        /// The object's key.
        key: String,
        /// Bytes needed.
        need: u64,
        /// Bytes the buffer holds.
        have: u64,
    },
    /// [`StoreError::BadRange`].
    BadRange {
        /// The object's key.
        key: String,
        /// The range's start in the value, in bytes.
        offset: u64,
        /// The range's length, in bytes.
        len: u64,
        /// The object's size, in bytes.
        size: u64,
    },
    /// An answer about an object or a client, rebuilt by [`StoreError::from_status`].
    Status {
        /// The [`Code`] as a number.
        code: i32,
        /// The error's text.
        message: String,
        /// The key it is about (empty for answers about a client or the pool).
        key: String,
    },
    /// Anything else.
    Relayed {
        /// Whose fault ([`Fault`]: 0 caller, 1 peer, 2 master, 3 local, 4 answer).
        fault: u8,
        /// Whether the same call may succeed if made again.
        retryable: bool,
        /// The [`Code`] it maps to, as a number.
        code: i32,
        /// The error's text.
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
            StoreError::LeaseExpired { key, .. } | StoreError::ChecksumMismatch { key, .. } => status(key),
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
