//! The handshake port's wire: its messages, read and written, and how a peer dials it. Both
//! the descriptor service ([`crate::handshake`]) and notifications ([`crate::notify`]) speak it.
//!
//! Messages are length-prefixed and versioned, with a 12-byte header:
//! ```text
//! 0        4         5      6          8        12
//! | "CRHS" | version | kind | reserved | len    | payload (len bytes)
//! ```
//! Messages are frames of the transports' net layer ([`FORMAT`]). Requests are capped at
//! [`MAX_REQUEST`] bytes, replies at [`MAX_REPLY`] (checked before anything is allocated); a
//! message must arrive whole within [`IO_TIMEOUT`] of its first byte.

use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use crescent_transports::net::{Auth, Format, FrameError, Service, Wire};

use crate::error::{EngineError, Result};

/// The first bytes of every message.
pub const MAGIC: [u8; 4] = *b"CRHS";
/// The handshake's version; a message of another version is refused.
pub const VERSION: u8 = 1;
/// Bytes before the payload.
pub const HEADER_LEN: usize = 12;
/// Longest request payload the server reads.
pub const MAX_REQUEST: u32 = 4096;
/// Longest reply payload a client reads (a descriptor).
pub const MAX_REPLY: u32 = 16 << 20;
/// How long a message may take from its first byte to its last, and how long the server
/// keeps an idle connection.
pub const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// The frame layout in the net layer's terms.
pub const FORMAT: Format = Format {
    name: "handshake",
    magic: &MAGIC,
    version: VERSION,
    header_len: HEADER_LEN,
    length_at: Some(8),
    max_payload: MAX_REPLY as u64,
};

/// A message's kind byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum MessageKind {
    /// Asks for the descriptor of the segment named in the payload.
    GetDescriptor = 1,
    /// The answer: the descriptor as JSON.
    Descriptor = 2,
    /// The answer when there is none: why, as text.
    Error = 3,
    /// A notification for the engine's queue ([`crate::notify`]).
    Notify = 4,
    /// The answer to [`MessageKind::Notify`]: one byte, accepted or why not.
    NotifyAck = 5,
}

/// Why a message could not be read.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// Bad magic or version, an oversized length, a close, a timeout: the net layer's errors.
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// A kind byte no message has.
    #[error("unknown message kind {0}")]
    Kind(u8),
}

/// Sends one message, all of it within [`IO_TIMEOUT`].
pub fn write_message(w: &mut (impl Wire + ?Sized), kind: MessageKind, payload: &[u8]) -> Result<(), WireError> {
    Ok(FORMAT.write_frame(w, kind as u8, payload, IO_TIMEOUT)?)
}

/// Reads one message, refusing more than `max` payload bytes; it must begin within
/// [`IO_TIMEOUT`] and arrive whole within as long again.
pub fn read_message(r: &mut (impl Wire + ?Sized), max: u32) -> Result<(MessageKind, Vec<u8>), WireError> {
    read_message_within(r, max, IO_TIMEOUT)
}

/// [`read_message`] with `timeout` for both the wait and the message.
pub fn read_message_within(
    r: &mut (impl Wire + ?Sized),
    max: u32,
    timeout: Duration,
) -> Result<(MessageKind, Vec<u8>), WireError> {
    let frame = FORMAT.read_frame(r, u64::from(max), Some(timeout), timeout)?;
    let kind = match frame.kind {
        1 => MessageKind::GetDescriptor,
        2 => MessageKind::Descriptor,
        3 => MessageKind::Error,
        4 => MessageKind::Notify,
        5 => MessageKind::NotifyAck,
        k => return Err(WireError::Kind(k)),
    };
    Ok((kind, frame.payload))
}

/// Splits a segment name `host:port` (IPv6 as `[addr]:port`).
pub fn split_host_port(name: &str) -> Result<(String, u16)> {
    let bad = || EngineError::InvalidArgument(format!("segment name {name:?} is not host:port"));
    let (host, port) = name.rsplit_once(':').ok_or_else(bad)?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() || port == 0 {
        return Err(bad());
    }
    Ok((host.to_string(), port))
}

/// Connects to the handshake listener at `address` (`host:port`) and authenticates both ends
/// with `auth`, all within `timeout`; `peer` names it in errors.
pub(crate) fn connect(peer: &str, address: &str, timeout: Duration, auth: &Auth) -> Result<TcpStream> {
    let (host, port) = split_host_port(address)?;
    let unreachable = |reason: String| EngineError::SegmentUnreachable { name: peer.to_string(), reason };
    let addr = (host.as_str(), port)
        .to_socket_addrs()
        .map_err(|e| unreachable(format!("cannot resolve {host}: {e}")))?
        .next()
        .ok_or_else(|| unreachable(format!("{host} resolves to no address")))?;
    let deadline = std::time::Instant::now() + timeout;
    let stream = TcpStream::connect_timeout(&addr, timeout).map_err(|e| unreachable(format!("connect: {e}")))?;
    auth.dial(Service::Handshake, &mut &stream, Some(deadline))
        .map_err(|source| EngineError::Unauthenticated { peer: peer.to_string(), source })?;
    Ok(stream)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn message_roundtrip_and_limits() {
        let mut buf = Vec::new();
        write_message(&mut buf, MessageKind::Descriptor, b"hello").unwrap();
        let (kind, payload) = read_message(&mut buf.as_slice(), 16).unwrap();
        assert_eq!((kind, payload.as_slice()), (MessageKind::Descriptor, &b"hello"[..]));
        assert!(matches!(
            read_message(&mut buf.as_slice(), 4),
            Err(WireError::Frame(FrameError::Oversized { len: 5, max: 4, .. }))
        ));
        assert!(matches!(read_message(&mut &buf[..8], 16), Err(WireError::Frame(FrameError::Io { .. }))));
        assert!(matches!(read_message(&mut &buf[..HEADER_LEN + 2], 16), Err(WireError::Frame(FrameError::Io { .. }))));
        assert!(matches!(read_message(&mut &b""[..], 16), Err(WireError::Frame(FrameError::Closed))));
        assert!(matches!(
            read_message(&mut &b"GET / HTTP/1.1\r\n"[..], 16),
            Err(WireError::Frame(FrameError::BadMagic { .. }))
        ));
    }

    #[test]
    fn host_port_names() {
        assert_eq!(split_host_port("10.1.2.3:80").unwrap(), ("10.1.2.3".into(), 80));
        assert_eq!(split_host_port("[::1]:9").unwrap(), ("::1".into(), 9));
        for bad in ["nohost", ":80", "a:0", "a:70000", "a:b"] {
            assert!(split_host_port(bad).is_err(), "{bad}");
        }
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = read_message(&mut bytes.as_slice(), MAX_REQUEST);
        }
    }
}
