//! The fast RPC wire: the hot unary calls of the master's own clients (exists, replica lists,
//! put start/end/revoke and their batch forms) as length-prefixed frames over a plain TCP
//! connection, beside gRPC. Every message is the same protobuf message as gRPC's; only the
//! framing differs. A gRPC call on loopback cost the master about 90 µs of CPU and the caller
//! as much again (HTTP/2 streams, headers, tasks), more than upstream's whole round trip; a
//! frame costs a send and a few receives on each side and no task beyond the connection's.
//!
//! A connection starts with a hello frame (tag [`HELLO`]) carrying the same credentials as a
//! gRPC call's metadata (bearer token, tenant), checked once; the master answers it with an
//! empty OK frame, or an error frame and a close. Then, one at a time, a request frame (the
//! method's tag and its request) and its reply frame (tag 0 and the reply, or a gRPC status
//! code and the error's message). Frames are a format of the net layer's one codec
//! ([`FORMAT`]: `"CF" | version | tag | length u32 LE`, then the body), so both sides check the
//! magic, the version and the announced length before they allocate for a frame. Schedulers and other
//! languages keep gRPC, which serves every call; this wire serves only the calls below.
//!
//! A connection may instead carry one owner stream ([`Method::OwnerStream`], gRPC's
//! `OwnerStream`): the master's news to a segment's owner, which every put with a checksum
//! sends at its start and whose acknowledgement its commit needs, so that the holders' part of
//! a put costs a frame each way rather than two HTTP/2 stream messages.

use crescent_transports::net::Format;
use prost::Message;

use crate::protocol::MAX_MESSAGE;

/// The frame layout, one of the net layer's codec: `"CF" | version u8 | tag u8 | length u32
/// LE`, then `length` bytes of body (a protobuf message, an error's text, or a hello).
pub const FORMAT: Format = Format {
    name: "master fast rpc",
    magic: b"CF",
    version: 1,
    header_len: HEADER,
    length_at: Some(4),
    max_payload: MAX_MESSAGE as u64,
};

/// Tag of a connection's first frame (credentials) and of an OK reply.
pub const HELLO: u8 = 0;
/// Tag of a reply that succeeded.
pub const OK: u8 = 0;
/// Bytes before a frame's body.
pub const HEADER: usize = 8;
/// Largest hello body (a bearer token and a tenant name).
pub const MAX_HELLO: usize = 8 << 10;

/// The calls the fast wire serves, by tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Method {
    /// gRPC's `Exists`.
    Exists = 1,
    /// gRPC's `BatchExists`.
    BatchExists = 2,
    /// gRPC's `GetReplicaList`.
    GetReplicaList = 3,
    /// gRPC's `BatchGetReplicaList`.
    BatchGetReplicaList = 4,
    /// gRPC's `PutStart`.
    PutStart = 5,
    /// gRPC's `PutEnd`.
    PutEnd = 6,
    /// gRPC's `PutRevoke`.
    PutRevoke = 7,
    /// gRPC's `BatchPutStart`.
    BatchPutStart = 8,
    /// gRPC's `BatchPutEnd`.
    BatchPutEnd = 9,
    /// gRPC's `BatchPutRevoke`.
    BatchPutRevoke = 10,
    /// gRPC's `OwnerStream`, for the rest of the connection: the request is the stream's
    /// first `OwnerAck` (its hello), answered with an empty OK frame or an error frame. Then
    /// the master sends `OwnerNews` frames (tag [`OK`]) and the client `OwnerAck` frames (this
    /// tag) until either side closes; no call follows on that connection.
    OwnerStream = 11,
    /// gRPC's `PutChecksum`: sent right behind a `PutStart` on the same connection, before
    /// its reply is read (the writer takes the checksum while the master places the put).
    PutChecksum = 12,
    /// gRPC's `GrantBlanks`.
    GrantBlanks = 13,
    /// gRPC's `PutCommitBlank`.
    PutCommitBlank = 14,
}

impl Method {
    /// The method of request tag `tag`, if it is one.
    pub fn from_tag(tag: u8) -> Option<Method> {
        use Method::*;
        [
            Exists,
            BatchExists,
            GetReplicaList,
            BatchGetReplicaList,
            PutStart,
            PutEnd,
            PutRevoke,
            BatchPutStart,
            BatchPutEnd,
            BatchPutRevoke,
            OwnerStream,
            PutChecksum,
            GrantBlanks,
            PutCommitBlank,
        ]
        .into_iter()
        .find(|m| *m as u8 == tag)
    }
}

/// A frame of `tag` around `body`, ready to write.
pub fn frame(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut out = header(tag, body.len());
    out.extend_from_slice(body);
    out
}

/// A frame of `tag` around the encoded `message`.
pub fn message_frame(tag: u8, message: &impl Message) -> Vec<u8> {
    let mut out = header(tag, message.encoded_len());
    message.encode_raw(&mut out);
    out
}

/// A frame's header for a body of `len` bytes, with room for the body.
fn header(tag: u8, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; HEADER];
    out.reserve(len);
    FORMAT.put_prefix(&mut out, tag);
    out[4..HEADER].copy_from_slice(&(len.min(u32::MAX as usize) as u32).to_le_bytes());
    out
}

/// An error reply: the status's code as the tag, its message as the body.
pub fn status_frame(status: &tonic::Status) -> Vec<u8> {
    let code = (status.code() as i32).clamp(1, u8::MAX as i32) as u8;
    frame(code, status.message().as_bytes())
}

/// The reply frame's body as a `tonic::Status` where its tag says it failed.
pub fn reply_status(tag: u8, body: &[u8]) -> Option<tonic::Status> {
    (tag != OK).then(|| tonic::Status::new(tonic::Code::from(tag as i32), String::from_utf8_lossy(body).into_owned()))
}

/// A header's tag and body length, checked (magic, version, the length against `max`).
pub fn parse_header(header: &[u8; HEADER], max: usize) -> Result<(usize, u8), String> {
    let tag = FORMAT.check(header).map_err(|e| e.to_string())?;
    let len = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
    let len = FORMAT.check_len(u64::from(len), max as u64).map_err(|e| e.to_string())?;
    Ok((len, tag))
}

/// The next frame's tag and body from `io`, or `None` where the peer closed (or, with an
/// `idle` bound, sent nothing for that long) before its first byte. Its length is checked
/// against `max` before anything is allocated for it, and once its first byte arrived the
/// rest must follow within `whole`. Not cancel-safe: a frame read halfway is lost with the
/// future (read from one task, not in a `select!`).
pub async fn read_frame<R: tokio::io::AsyncRead + Unpin>(
    io: &mut R,
    idle: Option<std::time::Duration>,
    whole: std::time::Duration,
    max: usize,
) -> Result<Option<(u8, Vec<u8>)>, String> {
    use tokio::io::AsyncReadExt;
    let mut header = [0u8; HEADER];
    let first = async {
        match idle {
            Some(idle) => tokio::time::timeout(idle, io.read(&mut header)).await.unwrap_or(Ok(0)),
            None => io.read(&mut header).await,
        }
    };
    let first = match first.await {
        Ok(0) => return Ok(None),
        Ok(n) => n,
        Err(e) => return Err(e.to_string()),
    };
    let rest = async {
        io.read_exact(&mut header[first..]).await?;
        let (len, tag) = parse_header(&header, max).map_err(std::io::Error::other)?;
        let mut body = vec![0u8; len];
        io.read_exact(&mut body).await?;
        Ok::<_, std::io::Error>((tag, body))
    };
    match tokio::time::timeout(whole, rest).await {
        Ok(Ok(frame)) => Ok(Some(frame)),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("a frame not whole within {whole:?}")),
    }
}

/// A hello's body: the bearer token's header value (may be empty) and the tenant, each a
/// `u16 LE` length and its bytes.
pub fn hello_body(authorization: &str, tenant: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + authorization.len() + tenant.len());
    for s in [authorization, tenant] {
        out.extend_from_slice(&(s.len().min(u16::MAX as usize) as u16).to_le_bytes());
        out.extend_from_slice(&s.as_bytes()[..s.len().min(u16::MAX as usize)]);
    }
    out
}

/// The (authorization, tenant) of a hello's body, or why it is not one.
pub fn parse_hello(body: &[u8]) -> Result<(&str, &str), String> {
    let mut rest = body;
    let mut field = || -> Result<&str, String> {
        if rest.len() < 2 {
            return Err("a hello cut short".into());
        }
        let n = u16::from_le_bytes([rest[0], rest[1]]) as usize;
        let (s, tail) = rest[2..].split_at_checked(n).ok_or("a hello cut short")?;
        rest = tail;
        std::str::from_utf8(s).map_err(|_| "a hello that is not UTF-8".to_string())
    };
    let authorization = field()?;
    let tenant = field()?;
    Ok((authorization, tenant))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// A hello is untrusted bytes: any of them parse or are refused, never panic, and a
        /// hello that parses reads back to the same fields.
        #[test]
        fn any_bytes_as_a_hello_parse_or_are_refused(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Ok((auth, tenant)) = parse_hello(&bytes) {
                let again = hello_body(auth, tenant);
                prop_assert_eq!(parse_hello(&again), Ok((auth, tenant)));
            }
        }

        /// Any header either names a body within the bound or is refused.
        #[test]
        fn any_header_is_bounded(header in any::<[u8; HEADER]>(), max in 0usize..1 << 20) {
            if let Ok((len, _)) = parse_header(&header, max) {
                prop_assert!(len <= max);
                prop_assert_eq!(&header[..3], &[b'C', b'F', 1][..]);
            }
        }
    }

    #[test]
    fn a_hello_reads_back_and_a_cut_one_is_refused() {
        let body = hello_body("Bearer t.abc", "team-a");
        assert_eq!(parse_hello(&body), Ok(("Bearer t.abc", "team-a")));
        for cut in 0..body.len() {
            assert!(parse_hello(&body[..cut]).is_err(), "a hello cut at {cut} read as whole");
        }
    }

    #[test]
    fn a_frame_over_its_bound_is_refused_before_its_body() {
        let f = frame(Method::PutEnd as u8, &[7; 10]);
        let header: [u8; HEADER] = f[..HEADER].try_into().unwrap();
        assert_eq!(parse_header(&header, 10), Ok((10, Method::PutEnd as u8)));
        assert!(parse_header(&header, 9).is_err());
        let mut other = header;
        other[0] = b'X';
        assert!(parse_header(&other, 10).is_err(), "another protocol's bytes are refused");
        other = header;
        other[2] = 9;
        assert!(parse_header(&other, 10).is_err(), "another version is refused");
        assert_eq!(Method::from_tag(Method::BatchPutRevoke as u8), Some(Method::BatchPutRevoke));
        assert_eq!(Method::from_tag(0), None);
        assert_eq!(Method::from_tag(200), None);
    }

    #[test]
    fn an_error_reply_keeps_its_code_and_message() {
        let f = status_frame(&tonic::Status::not_found("no such key"));
        let header: [u8; HEADER] = f[..HEADER].try_into().unwrap();
        let (len, tag) = parse_header(&header, 100).unwrap();
        let s = reply_status(tag, &f[HEADER..HEADER + len]).expect("an error");
        assert_eq!((s.code(), s.message()), (tonic::Code::NotFound, "no such key"));
        assert!(reply_status(OK, b"").is_none());
    }
}
