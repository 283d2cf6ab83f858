//! The tcp transport's wire format: fixed 32-byte little-endian headers, each optionally
//! followed by `len` payload bytes.
//!
//! ```text
//! 0      2        3      4         8        16        24       32
//! | "CT" | version | kind | status  | id     | addr    | len     |
//! ```
//! * `ReadRequest {addr, len}` (no payload) → `ReadResponse` with `len` bytes, or an error status and none.
//! * `WriteRequest {addr, len}` + `len` bytes → `WriteResponse` (no payload).
//!
//! `id` is the initiator's; responses on one connection come in request order.

use crate::net::{Format, FrameError as NetError};

/// The first two bytes of every header.
pub const MAGIC: [u8; 2] = *b"CT";
/// The version this side speaks; a peer of another version is refused.
pub const VERSION: u8 = 1;
/// Every header's size, in bytes.
pub const HEADER_LEN: usize = 32;
/// Largest payload a frame may announce; larger is a protocol violation.
pub const MAX_PAYLOAD: u64 = 64 << 20;
/// The frame layout in the net layer's terms (the payload length is the header's `len`, for
/// the kinds that carry one).
pub const FORMAT: Format = Format {
    name: "tcp transport",
    magic: &MAGIC,
    version: VERSION,
    header_len: HEADER_LEN,
    length_at: None,
    max_payload: MAX_PAYLOAD,
};

/// What a frame is (its wire code is the discriminant).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    /// Initiator → target: send me `len` bytes from `addr`; no payload.
    ReadRequest = 1,
    /// Initiator → target: store the `len` payload bytes that follow at `addr`.
    WriteRequest = 2,
    /// Target → initiator: the `len` bytes read (when the status is `Ok`; none otherwise).
    ReadResponse = 3,
    /// Target → initiator: the write's status; no payload.
    WriteResponse = 4,
}

/// Status of a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Status {
    /// The access was done (also the status of every request).
    Ok = 0,
    /// The range is not inside one registered region of the target.
    OutOfRange = 1,
}

/// One frame's header, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// What the frame is.
    pub kind: FrameKind,
    /// A response's outcome; `Ok` in a request.
    pub status: Status,
    /// The initiator's id of the request, echoed by its response.
    pub id: u64,
    /// Start of the accessed range, a virtual address in the target's registered memory.
    pub addr: u64,
    /// Length of the accessed range in bytes, at most [`MAX_PAYLOAD`]; also the payload's
    /// length where the kind carries one ([`Header::payload_len`]).
    pub len: u64,
}

/// Why a received header was refused; the connection is then dropped.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// Bad magic or version, or an oversized payload: the net layer's checks.
    #[error(transparent)]
    Frame(#[from] NetError),
    /// The kind byte names no [`FrameKind`].
    #[error("unknown frame kind {0}")]
    Kind(u8),
    /// The status word names no [`Status`].
    #[error("unknown status {0}")]
    Status(u32),
    /// A failed read response announces payload bytes.
    #[error("a {0:?} frame must not carry a payload length with an error status")]
    Inconsistent(FrameKind),
}

impl Header {
    /// The header's 32 wire bytes (layout in the module doc).
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        FORMAT.put_prefix(&mut b, self.kind as u8);
        b[4..8].copy_from_slice(&(self.status as u32).to_le_bytes());
        b[8..16].copy_from_slice(&self.id.to_le_bytes());
        b[16..24].copy_from_slice(&self.addr.to_le_bytes());
        b[24..32].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Parses and validates a header received from a peer (untrusted bytes).
    pub fn decode(b: &[u8; HEADER_LEN]) -> Result<Header, FrameError> {
        let kind = match FORMAT.check(b)? {
            1 => FrameKind::ReadRequest,
            2 => FrameKind::WriteRequest,
            3 => FrameKind::ReadResponse,
            4 => FrameKind::WriteResponse,
            k => return Err(FrameError::Kind(k)),
        };
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let status = match u32::from_le_bytes(b[4..8].try_into().expect("4 bytes")) {
            0 => Status::Ok,
            1 => Status::OutOfRange,
            s => return Err(FrameError::Status(s)),
        };
        let header = Header { kind, status, id: u64_at(8), addr: u64_at(16), len: u64_at(24) };
        // Every kind's `len` is bounded, the payload-less ones' too: a read request is
        // answered with that many bytes.
        FORMAT.check_len(header.len, MAX_PAYLOAD)?;
        if header.kind == FrameKind::ReadResponse && status != Status::Ok && header.len != 0 {
            return Err(FrameError::Inconsistent(kind));
        }
        Ok(header)
    }

    /// Payload bytes that follow this header on the wire.
    pub fn payload_len(&self) -> u64 {
        match self.kind {
            FrameKind::WriteRequest => self.len,
            FrameKind::ReadResponse if self.status == Status::Ok => self.len,
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn roundtrip() {
        let h = Header { kind: FrameKind::WriteRequest, status: Status::Ok, id: 9, addr: 0xdead_beef, len: 4096 };
        assert_eq!(Header::decode(&h.encode()).unwrap(), h);
        assert_eq!(h.payload_len(), 4096);
    }

    #[test]
    fn rejects_bad_frames() {
        let good = Header { kind: FrameKind::ReadRequest, status: Status::Ok, id: 1, addr: 2, len: 3 }.encode();
        let mut b = good;
        b[0] = b'X';
        assert!(matches!(Header::decode(&b), Err(FrameError::Frame(NetError::BadMagic { .. }))));
        let mut b = good;
        b[2] = 2;
        assert!(matches!(Header::decode(&b), Err(FrameError::Frame(NetError::Version { found: 2, .. }))));
        let mut b = good;
        b[3] = 77;
        assert!(matches!(Header::decode(&b), Err(FrameError::Kind(77))));
        let mut b = good;
        b[4] = 9;
        assert!(matches!(Header::decode(&b), Err(FrameError::Status(9))));
        let mut b = good;
        b[24..32].copy_from_slice(&(MAX_PAYLOAD + 1).to_le_bytes());
        assert!(matches!(
            Header::decode(&b),
            Err(FrameError::Frame(NetError::Oversized { len, .. })) if len == MAX_PAYLOAD + 1
        ));
        let h = Header { kind: FrameKind::ReadResponse, status: Status::OutOfRange, id: 1, addr: 0, len: 5 };
        assert!(matches!(Header::decode(&h.encode()), Err(FrameError::Inconsistent(_))));
    }

    proptest! {
        // Fuzzing the parser: arbitrary bytes never panic, and whatever parses re-encodes
        // to the same bytes and never announces more than MAX_PAYLOAD.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::array::uniform32(any::<u8>())) {
            if let Ok(h) = Header::decode(&bytes) {
                prop_assert!(h.payload_len() <= MAX_PAYLOAD);
                prop_assert_eq!(h.encode(), bytes);
                prop_assert!(h.len <= MAX_PAYLOAD);
            }
        }
    }
}
