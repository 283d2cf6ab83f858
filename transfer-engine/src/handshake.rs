//! The embedded P2P handshake: a peer asks this engine's listener for its segment
//! descriptor, so no metadata service is needed (`P2PHANDSHAKE`).
//!
//! Messages are length-prefixed and versioned, with a 12-byte header:
//! ```text
//! 0        4         5      6          8        12
//! | "CRHS" | version | kind | reserved | len    | payload (len bytes)
//! ```
//! Requests are capped at [`MAX_REQUEST`] bytes, replies at [`MAX_REPLY`]; every socket has
//! a read and write timeout, so garbage, oversized or truncated input never hangs the server.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::descriptor::SegmentDescriptor;
use crate::error::{EngineError, Result};
use crate::notify::NotifyQueue;

pub const MAGIC: [u8; 4] = *b"CRHS";
pub const VERSION: u8 = 1;
pub const HEADER_LEN: usize = 12;
pub const MAX_REQUEST: u32 = 4096;
pub const MAX_REPLY: u32 = 16 << 20;
pub const IO_TIMEOUT: Duration = Duration::from_secs(5);
pub const MAX_CONNECTIONS: usize = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum MessageKind {
    GetDescriptor = 1,
    Descriptor = 2,
    Error = 3,
    /// A notification for the engine's queue ([`crate::notify`]).
    Notify = 4,
    /// The answer to [`MessageKind::Notify`]: one byte, accepted or why not.
    NotifyAck = 5,
}

#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("bad magic {0:02x?}")]
    BadMagic([u8; 4]),
    #[error("unsupported handshake version {0} (this side speaks {VERSION})")]
    Version(u8),
    #[error("unknown message kind {0}")]
    Kind(u8),
    #[error("message of {len} bytes exceeds the {max}-byte limit")]
    Oversized { len: u32, max: u32 },
    #[error("connection closed before a message began")]
    Closed,
    #[error("truncated or unreadable message: {0}")]
    Io(#[from] io::Error),
}

pub fn write_message(w: &mut impl Write, kind: MessageKind, payload: &[u8]) -> io::Result<()> {
    let len = u32::try_from(payload.len()).map_err(|_| io::Error::other("handshake payload too large"))?;
    let mut header = [0u8; HEADER_LEN];
    header[0..4].copy_from_slice(&MAGIC);
    header[4] = VERSION;
    header[5] = kind as u8;
    header[8..12].copy_from_slice(&len.to_le_bytes());
    let mut msg = Vec::with_capacity(HEADER_LEN + payload.len());
    msg.extend_from_slice(&header);
    msg.extend_from_slice(payload);
    w.write_all(&msg)
}

/// Reads one message, refusing more than `max` payload bytes.
pub fn read_message(r: &mut impl Read, max: u32) -> Result<(MessageKind, Vec<u8>), WireError> {
    let mut header = [0u8; HEADER_LEN];
    let mut first = [0u8; 1];
    match r.read(&mut first)? {
        0 => return Err(WireError::Closed),
        _ => header[0] = first[0],
    }
    r.read_exact(&mut header[1..])?;
    let magic: [u8; 4] = header[0..4].try_into().expect("4 bytes");
    if magic != MAGIC {
        return Err(WireError::BadMagic(magic));
    }
    if header[4] != VERSION {
        return Err(WireError::Version(header[4]));
    }
    let kind = match header[5] {
        1 => MessageKind::GetDescriptor,
        2 => MessageKind::Descriptor,
        3 => MessageKind::Error,
        4 => MessageKind::Notify,
        5 => MessageKind::NotifyAck,
        k => return Err(WireError::Kind(k)),
    };
    let len = u32::from_le_bytes(header[8..12].try_into().expect("4 bytes"));
    if len > max {
        return Err(WireError::Oversized { len, max });
    }
    let mut payload = vec![0u8; len as usize];
    r.read_exact(&mut payload)?;
    Ok((kind, payload))
}

/// Serves descriptors (and takes notifications) on the engine's handshake port until dropped.
pub struct HandshakeServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl HandshakeServer {
    /// `describe` builds the current descriptor (JSON) for each request; notifications go
    /// to `notifies`.
    pub fn start(
        listener: TcpListener,
        describe: Arc<dyn Fn() -> Vec<u8> + Send + Sync>,
        notifies: Arc<NotifyQueue>,
    ) -> Result<Self> {
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        std::thread::Builder::new()
            .name("crescent-handshake".into())
            .spawn(move || accept_loop(listener, describe, notifies, stop2))?;
        Ok(HandshakeServer { addr, stop })
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }
}

impl Drop for HandshakeServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let wake = SocketAddr::from(([127, 0, 0, 1], self.addr.port()));
        let _ = TcpStream::connect_timeout(&wake, Duration::from_millis(200));
    }
}

fn accept_loop(
    listener: TcpListener,
    describe: Arc<dyn Fn() -> Vec<u8> + Send + Sync>,
    notifies: Arc<NotifyQueue>,
    stop: Arc<AtomicBool>,
) {
    let active = Arc::new(AtomicUsize::new(0));
    for stream in listener.incoming() {
        if stop.load(Ordering::Acquire) {
            return;
        }
        let Ok(stream) = stream else { continue };
        if active.load(Ordering::Acquire) >= MAX_CONNECTIONS {
            tracing::warn!("handshake: {MAX_CONNECTIONS} connections open, refusing one more");
            continue;
        }
        active.fetch_add(1, Ordering::AcqRel);
        let (describe, notifies, active) = (describe.clone(), notifies.clone(), active.clone());
        let spawned = std::thread::Builder::new().name("crescent-handshake-conn".into()).spawn(move || {
            let peer = stream.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "?".into());
            if let Err(e) = serve(stream, describe.as_ref(), &notifies) {
                tracing::warn!("handshake: dropping connection from {peer}: {e}");
            }
            active.fetch_sub(1, Ordering::AcqRel);
        });
        if let Err(e) = spawned {
            tracing::error!("handshake: cannot start a connection thread: {e}");
        }
    }
}

fn serve(
    mut stream: TcpStream,
    describe: &(dyn Fn() -> Vec<u8> + Send + Sync),
    notifies: &NotifyQueue,
) -> Result<(), WireError> {
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    loop {
        let (kind, payload) = match read_message(&mut stream, MAX_REQUEST) {
            Err(WireError::Closed) => return Ok(()),
            other => other?,
        };
        match kind {
            MessageKind::GetDescriptor => write_message(&mut stream, MessageKind::Descriptor, &describe())?,
            MessageKind::Notify => write_message(&mut stream, MessageKind::NotifyAck, &[notifies.receive(&payload)])?,
            other => {
                let msg = format!("unexpected handshake request {other:?}");
                write_message(&mut stream, MessageKind::Error, msg.as_bytes())?;
                return Err(WireError::Kind(other as u8));
            }
        }
    }
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

/// Asks the engine at `name` (`host:port`) for its descriptor.
pub fn fetch_descriptor(name: &str, timeout: Duration) -> Result<SegmentDescriptor> {
    let (host, port) = split_host_port(name)?;
    let unreachable = |reason: String| EngineError::SegmentUnreachable { name: name.to_string(), reason };
    let addr = (host.as_str(), port)
        .to_socket_addrs()
        .map_err(|e| unreachable(format!("cannot resolve {host}: {e}")))?
        .next()
        .ok_or_else(|| unreachable(format!("{host} resolves to no address")))?;
    let mut stream = TcpStream::connect_timeout(&addr, timeout).map_err(|e| unreachable(format!("connect: {e}")))?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    write_message(&mut stream, MessageKind::GetDescriptor, name.as_bytes())
        .map_err(|e| unreachable(format!("sending the request: {e}")))?;
    let bad = |reason: String| EngineError::BadPeerReply { peer: name.to_string(), reason };
    match read_message(&mut stream, MAX_REPLY) {
        Ok((MessageKind::Descriptor, payload)) => SegmentDescriptor::from_json(&payload).map_err(bad),
        Ok((MessageKind::Error, payload)) => Err(bad(String::from_utf8_lossy(&payload).into_owned())),
        Ok((kind, _)) => Err(bad(format!("unexpected reply {kind:?}"))),
        Err(e) => Err(bad(e.to_string())),
    }
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
        assert!(matches!(read_message(&mut buf.as_slice(), 4), Err(WireError::Oversized { len: 5, max: 4 })));
        assert!(matches!(read_message(&mut &buf[..8], 16), Err(WireError::Io(_))));
        assert!(matches!(read_message(&mut &buf[..HEADER_LEN + 2], 16), Err(WireError::Io(_))));
        assert!(matches!(read_message(&mut &b""[..], 16), Err(WireError::Closed)));
        assert!(matches!(read_message(&mut &b"GET / HTTP/1.1\r\n"[..], 16), Err(WireError::BadMagic(_))));
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
