//! The disk service: how another client reads this client's files.
//!
//! The bytes still move with the transfer engine (one-sided reads, so RDMA where there is
//! RDMA); this service only stages them. A reader connects (TCP, address in the replica's
//! `disk_service`), asks to open (key, version, size), then asks for the next piece again and
//! again: the owner reads the piece from the file into a block of its registered staging
//! buffer and answers with the block's address; the reader reads the block with the engine
//! and asks for the next piece, which releases the block. After the last piece the owner has
//! checked the value's checksum: the last answer says so, or is an error. A reader that goes
//! away (or stays silent for 30 s) releases its block.
//!
//! Wire format (untrusted both ways; property-tested below): an 8-byte header
//! `"CD" | version u8 (1) | kind u8 | payload length u32 LE`, then at most 8 KiB of payload —
//! a format of the transports' net layer ([`FORMAT`]), which checks the length before
//! allocating and gives each frame one deadline ([`IO_TIMEOUT`]). The listener runs on the net
//! layer's accept loop: [`MAX_CONNECTIONS`] readers at once, [`MAX_CONNECTIONS_PER_PEER`] from
//! one address, each closed after [`IO_TIMEOUT`] without a request.
//!
//! | kind | direction | payload |
//! |---|---|---|
//! | 1 `Open` | reader → owner | version u64, size u64, key (UTF-8) |
//! | 2 `Opened` | owner → reader | the owner's engine segment name (UTF-8) |
//! | 3 `Next` | reader → owner | most bytes wanted u64 |
//! | 4 `Piece` | owner → reader | address u64, length u64, last u8 (1: all bytes sent and checked) |
//! | 5 `Error` | owner → reader | code u8 (1 not found, 2 corrupt, 3 bad request, 4 internal), message |

use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::{Arc, Weak};
use std::time::Duration;

use crescent_engine::EngineError;
use crescent_transports::net::serve::{serve_with, Accepted};
use crescent_transports::net::{Auth, Format, Limits, Server, Service, Wire};

use super::DiskTier;
use crate::error::{PeerFault, Result, StoreError};
use crate::staging::Staging;

/// The first two bytes of every frame.
pub const MAGIC: [u8; 2] = *b"CD";
/// The version this side speaks; a peer of another version is refused.
pub const WIRE_VERSION: u8 = 1;
/// Bytes of a frame's header.
pub const HEADER_LEN: usize = 8;
/// Most payload bytes a frame may carry (8 KiB); a longer announced payload is refused unread.
pub const MAX_PAYLOAD: usize = 8 << 10;
/// How long either side waits for the other.
pub const IO_TIMEOUT: Duration = Duration::from_secs(30);
/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 256;
/// Connections served at once from one peer address.
pub const MAX_CONNECTIONS_PER_PEER: usize = 64;
/// The frame layout in the net layer's terms.
pub const FORMAT: Format = Format {
    name: "disk service",
    magic: &MAGIC,
    version: WIRE_VERSION,
    header_len: HEADER_LEN,
    length_at: Some(4),
    max_payload: MAX_PAYLOAD as u64,
};

/// A frame's kind (its wire code is the discriminant; the module doc gives each payload).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Reader → owner: open (key, version, size).
    Open = 1,
    /// Owner → reader: the file is open; the owner's segment name.
    Opened = 2,
    /// Reader → owner: the next piece, at most this many bytes (releases the last one).
    Next = 3,
    /// Owner → reader: where the next piece lies in the owner's staging buffer.
    Piece = 4,
    /// Owner → reader: the request failed (a code and a message).
    Error = 5,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::Open,
            2 => Kind::Opened,
            3 => Kind::Next,
            4 => Kind::Piece,
            5 => Kind::Error,
            _ => return None,
        })
    }
}

fn bad(why: impl Into<String>) -> StoreError {
    StoreError::Disk(format!("disk service: {}", why.into()))
}

/// Sends one frame, all of it within [`IO_TIMEOUT`].
pub fn write_frame(w: &mut (impl Wire + ?Sized), kind: Kind, payload: &[u8]) -> std::io::Result<()> {
    FORMAT.write_frame(w, kind as u8, payload, IO_TIMEOUT).map_err(|e| match e {
        crescent_transports::net::FrameError::Io { source, .. } => source,
        e if e.is_timeout() => std::io::Error::new(std::io::ErrorKind::TimedOut, e.to_string()),
        e => std::io::Error::other(e.to_string()),
    })
}

/// Reads one frame (waiting [`IO_TIMEOUT`] for it, and as long for all of it); anything
/// malformed is an error (the connection is then dropped).
pub fn read_frame(r: &mut (impl Wire + ?Sized)) -> Result<(Kind, Vec<u8>)> {
    let frame =
        FORMAT.read_frame(r, MAX_PAYLOAD as u64, Some(IO_TIMEOUT), IO_TIMEOUT).map_err(|e| bad(e.to_string()))?;
    let kind = Kind::from_u8(frame.kind).ok_or_else(|| bad(format!("unknown kind {}", frame.kind)))?;
    Ok((kind, frame.payload))
}

fn u64_at(p: &[u8], at: usize) -> Result<u64> {
    p.get(at..at + 8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes"))).ok_or_else(|| bad("short payload"))
}

/// An `Open` request.
#[derive(Debug, PartialEq, Eq)]
pub struct OpenRequest {
    /// The object's version the reader expects.
    pub version: u64,
    /// The value's size the reader expects, in bytes.
    pub size: u64,
    /// The object's key.
    pub key: String,
}

impl OpenRequest {
    /// Its payload: version, size, then the key.
    pub fn encode(&self) -> Vec<u8> {
        let mut p = Vec::with_capacity(16 + self.key.len());
        p.extend_from_slice(&self.version.to_le_bytes());
        p.extend_from_slice(&self.size.to_le_bytes());
        p.extend_from_slice(self.key.as_bytes());
        p
    }
    /// Parses a payload from a peer (untrusted): short payloads, keys that are not UTF-8, empty
    /// or longer than the longest key are refused ([`StoreError::Disk`]).
    pub fn decode(p: &[u8]) -> Result<OpenRequest> {
        let version = u64_at(p, 0)?;
        let size = u64_at(p, 8)?;
        let key = std::str::from_utf8(&p[16..]).map_err(|_| bad("key is not UTF-8"))?;
        if key.is_empty() || key.len() > crate::protocol::MAX_KEY_LEN {
            return Err(bad(format!("key of {} bytes", key.len())));
        }
        Ok(OpenRequest { version, size, key: key.to_string() })
    }
}

/// A `Piece` answer.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub struct Piece {
    /// The piece's address in the owner's registered staging buffer (read it with the engine).
    pub addr: u64,
    /// Its length, in bytes.
    pub len: u64,
    /// True on the value's last piece: every byte was sent and the checksum checked.
    pub last: bool,
}

impl Piece {
    /// Its 17-byte payload: address, length, last.
    pub fn encode(&self) -> Vec<u8> {
        let mut p = Vec::with_capacity(17);
        p.extend_from_slice(&self.addr.to_le_bytes());
        p.extend_from_slice(&self.len.to_le_bytes());
        p.push(self.last as u8);
        p
    }
    /// Parses a payload from the owner (untrusted): exactly 17 bytes, `last` 0 or 1.
    pub fn decode(p: &[u8]) -> Result<Piece> {
        if p.len() != 17 || p[16] > 1 {
            return Err(bad("malformed piece"));
        }
        Ok(Piece { addr: u64_at(p, 0)?, len: u64_at(p, 8)?, last: p[16] == 1 })
    }
}

fn error_payload(e: &StoreError) -> Vec<u8> {
    let code = match e {
        StoreError::NotFound(_) => 1,
        StoreError::CorruptFile(_) => 2,
        StoreError::InvalidArgument(_) => 3,
        _ => 4,
    };
    let mut p = vec![code];
    let msg = e.to_string();
    let mut end = msg.len().min(MAX_PAYLOAD - 1);
    while !msg.is_char_boundary(end) {
        end -= 1;
    }
    p.extend_from_slice(&msg.as_bytes()[..end]);
    p
}

/// The error an `Error` answer carries, for object `key`.
pub fn decode_error(p: &[u8], key: &str) -> StoreError {
    let msg = String::from_utf8_lossy(p.get(1..).unwrap_or_default()).to_string();
    match p.first() {
        Some(1) => StoreError::NotFound(key.to_string()),
        Some(2) => StoreError::CorruptFile(msg),
        _ => bad(format!("the owner answered: {msg}")),
    }
}

/// The owner's side: a listener and a thread per reader.
pub struct DiskService {
    addr: SocketAddr,
    _server: Server,
}

impl DiskService {
    /// Listens on `host` (any port) and serves `tier`'s files through `staging`, a registered
    /// buffer of the engine whose segment is `segment`.
    /// Readers authenticate with `auth`'s secret before their first request.
    pub fn start(
        host: &str,
        auth: &Auth,
        tier: &Arc<DiskTier>,
        staging: Arc<Staging>,
        segment: String,
    ) -> Result<DiskService> {
        let listener = TcpListener::bind((host, 0)).map_err(|e| bad(format!("listening on {host}: {e}")))?;
        let addr = listener.local_addr().map_err(|e| bad(e.to_string()))?;
        let weak = Arc::downgrade(tier);
        let limits =
            Limits { max_connections: MAX_CONNECTIONS, max_per_peer: MAX_CONNECTIONS_PER_PEER, idle: Some(IO_TIMEOUT) };
        let server = serve_with(
            "disk-reader",
            listener,
            limits,
            auth.guard(Service::Disk),
            move |c: Accepted<TcpStream>| serve(&c.stream, &weak, &staging, &segment),
            |conn: &TcpStream, why: &str| {
                // A fresh connection has room for one small frame: this does not block.
                let e = StoreError::Disk(format!("too many readers: {why}"));
                let _ = FORMAT.write_frame(&mut &*conn, Kind::Error as u8, &error_payload(&e), Duration::ZERO);
            },
        )
        .map_err(|e| bad(format!("spawning: {e}")))?;
        tracing::info!("disk service listening on {addr}");
        Ok(DiskService { addr, _server: server })
    }

    /// `host:port` readers connect to.
    pub fn address(&self) -> String {
        self.addr.to_string()
    }
}

fn serve(conn: &TcpStream, tier: &Weak<DiskTier>, staging: &Staging, segment: &str) {
    let _ = conn.set_nodelay(true);
    let mut conn = conn;
    let mut open: Option<(super::TierReader, String, u64)> = None;
    let mut held: Option<crate::staging::StagingBlock<'_>> = None;
    loop {
        let Ok((kind, payload)) = read_frame(&mut conn) else { return };
        drop(held.take()); // the reader has read the last piece
        let Some(tier) = tier.upgrade() else { return };
        let answer: Result<(Kind, Vec<u8>)> = match kind {
            Kind::Open => OpenRequest::decode(&payload).and_then(|req| {
                let r = tier.open_reader(&req.key, req.version, req.size)?;
                open = Some((r, req.key, req.version));
                Ok((Kind::Opened, segment.as_bytes().to_vec()))
            }),
            Kind::Next => match (u64_at(&payload, 0), open.as_mut()) {
                (Ok(max), Some((reader, key, version))) if max > 0 && reader.remaining() > 0 => {
                    let block = staging.acquire(max.min(reader.remaining()), std::time::Instant::now() + IO_TIMEOUT);
                    match block.and_then(|mut block| {
                        let n = block.len() as usize;
                        reader.read_next(&mut block.bytes()[..n]).map(|n| (n, block))
                    }) {
                        Ok((n, block)) => {
                            let last = reader.remaining() == 0;
                            if last {
                                tier.count_served();
                            }
                            let piece = Piece { addr: block.addr(), len: n as u64, last };
                            held = Some(block);
                            Ok((Kind::Piece, piece.encode()))
                        }
                        Err(e) => {
                            tier.on_read_error(key, *version, &e);
                            open = None;
                            Err(e)
                        }
                    }
                }
                _ => Err(StoreError::InvalidArgument("next without an open file with bytes left".into())),
            },
            _ => Err(StoreError::InvalidArgument(format!("unexpected {kind:?}"))),
        };
        let sent = match answer {
            Ok((kind, payload)) => write_frame(&mut conn, kind, &payload),
            Err(e) => write_frame(&mut conn, Kind::Error, &error_payload(&e)),
        };
        if sent.is_err() {
            return;
        }
    }
}

/// The reader's side of one read.
pub struct DiskReader {
    conn: TcpStream,
    key: String,
}

impl DiskReader {
    /// Connects to `service` and opens (`key`, `version`, `size`); returns the reader and the
    /// owner's engine segment name (where the pieces are).
    /// Both ends authenticate with `auth` first.
    pub fn open(service: &str, auth: &Auth, key: &str, version: u64, size: u64) -> Result<(DiskReader, String)> {
        let gone = |source: std::io::Error| {
            StoreError::peer_gone(key, PeerFault::DiskService { service: service.to_string(), source })
        };
        let addr = service
            .to_socket_addrs()
            .map_err(gone)?
            .next()
            .ok_or_else(|| gone(std::io::Error::new(std::io::ErrorKind::AddrNotAvailable, "no address")))?;
        let conn = TcpStream::connect_timeout(&addr, Duration::from_secs(3)).map_err(gone)?;
        let _ = conn.set_nodelay(true);
        auth.dial(Service::Disk, &mut &conn, None).map_err(|source| {
            StoreError::peer_gone(
                key,
                PeerFault::Engine(EngineError::Unauthenticated { peer: format!("disk service {service}"), source }),
            )
        })?;
        let mut r = DiskReader { conn, key: key.to_string() };
        let req = OpenRequest { version, size, key: key.to_string() };
        let (kind, payload) = r.ask(Kind::Open, &req.encode())?;
        match kind {
            Kind::Opened => {
                let segment = String::from_utf8(payload).map_err(|_| bad("segment name is not UTF-8"))?;
                Ok((r, segment))
            }
            Kind::Error => Err(decode_error(&payload, key)),
            other => Err(bad(format!("answer {other:?} to open"))),
        }
    }

    fn ask(&mut self, kind: Kind, payload: &[u8]) -> Result<(Kind, Vec<u8>)> {
        write_frame(&mut self.conn, kind, payload).map_err(|source| {
            let service = self.conn.peer_addr().map_or_else(|_| "?".into(), |a| a.to_string());
            StoreError::peer_gone(&self.key, PeerFault::DiskService { service, source })
        })?;
        read_frame(&mut self.conn)
    }

    /// Asks for the next piece of at most `max` bytes.
    pub fn next(&mut self, max: u64) -> Result<Piece> {
        let (kind, payload) = self.ask(Kind::Next, &max.to_le_bytes())?;
        match kind {
            Kind::Piece => {
                let p = Piece::decode(&payload)?;
                if p.len == 0 || p.len > max {
                    return Err(bad(format!("a piece of {} bytes for at most {max}", p.len)));
                }
                Ok(p)
            }
            Kind::Error => Err(decode_error(&payload, &self.key)),
            other => Err(bad(format!("answer {other:?} to next"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn frames_round_trip() {
        let mut b = Vec::new();
        let open = OpenRequest { version: 9, size: 1 << 30, key: "a/b/../c".into() };
        write_frame(&mut b, Kind::Open, &open.encode()).unwrap();
        let piece = Piece { addr: 0x1000, len: 4096, last: true };
        write_frame(&mut b, Kind::Piece, &piece.encode()).unwrap();
        let mut r = &b[..];
        let (k, p) = read_frame(&mut r).unwrap();
        assert_eq!((k, OpenRequest::decode(&p).unwrap()), (Kind::Open, open));
        let (k, p) = read_frame(&mut r).unwrap();
        assert_eq!((k, Piece::decode(&p).unwrap()), (Kind::Piece, piece));
        assert!(read_frame(&mut r).is_err(), "end of stream");
    }

    #[test]
    fn bad_frames_are_errors() {
        let too_big = [b'C', b'D', 1, 1, 0, 0, 1, 0];
        assert!(read_frame(&mut &too_big[..]).is_err());
        let unknown = [b'C', b'D', 1, 9, 0, 0, 0, 0];
        assert!(read_frame(&mut &unknown[..]).is_err());
        let truncated = [b'C', b'D', 1, 1, 4, 0, 0, 0, 1];
        assert!(read_frame(&mut &truncated[..]).is_err());
        assert!(OpenRequest::decode(&[0; 16]).is_err(), "empty key");
        assert!(Piece::decode(&[0; 17][..16]).is_err());
        assert!(matches!(decode_error(&[1], "k"), StoreError::NotFound(_)));
        assert!(matches!(decode_error(&[], "k"), StoreError::Disk(_)));
    }

    proptest! {
        #[test]
        fn fuzz_frames_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let mut r = &bytes[..];
            while let Ok((_, p)) = read_frame(&mut r) {
                let _ = OpenRequest::decode(&p);
                let _ = Piece::decode(&p);
                let _ = decode_error(&p, "k");
            }
        }
    }
}
