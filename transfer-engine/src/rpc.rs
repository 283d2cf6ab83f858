//! Messages between processes: what Mooncake's `RpcInterface` (`mooncake.engine`, over
//! coro_rpc upstream) does, on Crescent's own wire — a client sends a block of bytes, or a
//! tensor's bytes with its dtype and shape, to a server's `host:port`; the server hands each
//! message to a handler and acknowledges it once the handler has returned.
//!
//! # Wire
//!
//! Every message is one frame of [`FORMAT`] (the net layer's codec, magic `CRPC`):
//!
//! ```text
//! 0..4 "CRPC" | 4 version | 5 kind | 6..8 zero | 8..12 meta_len u32 LE | 12..16 len u32 LE
//! payload (len bytes) = meta (meta_len bytes) | data
//! ```
//!
//! A [`Kind::Data`] frame has no meta; a [`Kind::Tensor`] frame's meta is
//! `dtype_len u8 | dtype (UTF-8) | ndim u8 | ndim × u64 LE`. The server answers each request
//! with [`Kind::Ack`] (no payload) or, for a frame of the right format it refuses (too large,
//! malformed), [`Kind::Error`] with the reason, and closes the connection.
//!
//! Bytes from the network are untrusted: the prefix, the lengths (payload at most
//! [`MAX_MESSAGE`], meta at most [`MAX_META`], at most [`MAX_DIMS`] dimensions, a dtype of at
//! most [`MAX_DTYPE`] bytes) are checked before anything is allocated, and the payload's buffer
//! grows with the bytes that actually arrive, so a peer that announces much and sends little
//! costs little. A whole frame has one deadline on either side; connections authenticate with
//! the cluster secret ([`Service::Rpc`]) before the first frame.

use std::collections::HashMap;
use std::io::{self, IoSlice};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crescent_transports::net::codec::MAX_HEADER;
use crescent_transports::net::serve::Accepted;
use crescent_transports::net::{serve, Auth, Format, FrameError, Limits, Server, Service, Wire};
use parking_lot::Mutex;

use crate::error::{EngineError, Result};
use crate::handshake_wire::split_host_port;

/// The largest message (meta and data together), in bytes.
pub const MAX_MESSAGE: u64 = 1 << 30;
/// The largest tensor meta (dtype and shape), in bytes.
pub const MAX_META: usize = 1024;
/// The most dimensions a tensor may have.
pub const MAX_DIMS: usize = 32;
/// The longest dtype name, in bytes.
pub const MAX_DTYPE: usize = 64;
/// Connections a server holds at once.
pub const MAX_CONNECTIONS: usize = 1024;
/// Connections a server holds at once from one address.
pub const MAX_CONNECTIONS_PER_PEER: usize = 256;
/// Bytes the payload's buffer grows by as they arrive.
const CHUNK: usize = 1 << 20;

/// The frame format of the rpc port.
pub const FORMAT: Format =
    Format { name: "rpc", magic: b"CRPC", version: 1, header_len: 16, length_at: Some(12), max_payload: MAX_MESSAGE };

/// The kind of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// A block of bytes (client to server).
    Data = 1,
    /// A tensor: its meta, then its bytes (client to server).
    Tensor = 2,
    /// The server handled the message (server to client).
    Ack = 3,
    /// The server refused the frame; the payload says why (server to client).
    Error = 4,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        [Kind::Data, Kind::Tensor, Kind::Ack, Kind::Error].into_iter().find(|k| *k as u8 == b)
    }
}

/// A tensor's dtype (its name: "float32", "bfloat16", ...) and shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorMeta {
    /// The dtype's name.
    pub dtype: String,
    /// The size of each dimension.
    pub shape: Vec<u64>,
}

impl TensorMeta {
    /// Its wire form; a dtype or a shape over the bounds is the caller's mistake.
    pub fn encode(&self) -> Result<Vec<u8>> {
        if self.dtype.is_empty() || self.dtype.len() > MAX_DTYPE {
            return Err(EngineError::InvalidArgument(format!(
                "a tensor's dtype name must have 1 to {MAX_DTYPE} bytes, not {}",
                self.dtype.len()
            )));
        }
        if self.shape.len() > MAX_DIMS {
            return Err(EngineError::InvalidArgument(format!(
                "a tensor of {} dimensions ({MAX_DIMS} at most)",
                self.shape.len()
            )));
        }
        let mut m = Vec::with_capacity(2 + self.dtype.len() + 8 * self.shape.len());
        m.push(self.dtype.len() as u8);
        m.extend_from_slice(self.dtype.as_bytes());
        m.push(self.shape.len() as u8);
        for d in &self.shape {
            m.extend_from_slice(&d.to_le_bytes());
        }
        Ok(m)
    }

    /// Parses a meta from the wire.
    pub fn decode(m: &[u8]) -> std::result::Result<TensorMeta, FrameError> {
        let bad = |why: &str| FORMAT.malformed(format!("tensor meta: {why}"));
        let (&dtype_len, rest) = m.split_first().ok_or_else(|| bad("empty"))?;
        let dtype_len = usize::from(dtype_len);
        if dtype_len == 0 || dtype_len > MAX_DTYPE || rest.len() < dtype_len + 1 {
            return Err(bad("bad dtype length"));
        }
        let dtype = std::str::from_utf8(&rest[..dtype_len]).map_err(|_| bad("dtype is not UTF-8"))?.to_string();
        let ndim = usize::from(rest[dtype_len]);
        let dims = &rest[dtype_len + 1..];
        if ndim > MAX_DIMS || dims.len() != 8 * ndim {
            return Err(bad("bad shape length"));
        }
        let shape = dims.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect();
        Ok(TensorMeta { dtype, shape })
    }
}

/// A message as the server received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    /// The sender's address (`ip:port` of its connection).
    pub source: String,
    /// The tensor's dtype and shape; `None` for a block of bytes.
    pub tensor: Option<TensorMeta>,
    /// The bytes.
    pub data: Vec<u8>,
}

fn header(kind: Kind, meta_len: usize, len: usize) -> [u8; 16] {
    let mut h = [0u8; 16];
    FORMAT.put_prefix(&mut h, kind as u8);
    h[8..12].copy_from_slice(&(meta_len as u32).to_le_bytes());
    h[12..16].copy_from_slice(&(len as u32).to_le_bytes());
    h
}

/// Sends one frame (`meta` then `data` as its payload), all of it within `limit`.
pub fn write_frame(
    w: &mut (impl Wire + ?Sized),
    kind: Kind,
    meta: &[u8],
    data: &[u8],
    limit: Duration,
) -> std::result::Result<(), FrameError> {
    let len = FORMAT.check_len((meta.len() + data.len()) as u64, MAX_MESSAGE)?;
    let h = header(kind, meta.len(), len);
    let mut bufs = [IoSlice::new(&h), IoSlice::new(meta), IoSlice::new(data)];
    FORMAT.send(w, &mut bufs, limit)
}

/// One frame as read: its kind, its meta and its data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// Its kind.
    pub kind: Kind,
    /// The tensor meta of a [`Kind::Tensor`] frame.
    pub tensor: Option<TensorMeta>,
    /// The rest of the payload.
    pub data: Vec<u8>,
}

/// Reads one frame: its first byte is awaited until `idle` (`None`: forever), then the whole
/// frame must arrive within `limit`. [`FrameError::Closed`] / [`FrameError::Idle`]: no frame
/// began.
pub fn read_frame(
    w: &mut (impl Wire + ?Sized),
    idle: Option<Duration>,
    limit: Duration,
) -> std::result::Result<Frame, FrameError> {
    let mut h = [0u8; MAX_HEADER];
    let filled = FORMAT.await_frame(w, &mut h[..1], idle)?;
    let deadline = Instant::now() + limit;
    let kind = FORMAT.finish_header(w, &mut h, filled, deadline, limit)?;
    let kind = Kind::from_u8(kind).ok_or(FrameError::Kind { format: FORMAT.name, kind })?;
    if h[6..8] != [0, 0] {
        return Err(FORMAT.malformed("reserved header bytes are not zero"));
    }
    let meta_len = u32::from_le_bytes(h[8..12].try_into().expect("4 bytes")) as usize;
    let len = FORMAT.check_len(u64::from(u32::from_le_bytes(h[12..16].try_into().expect("4 bytes"))), MAX_MESSAGE)?;
    if meta_len > len {
        return Err(FORMAT.malformed(format!("{meta_len} bytes of meta in a payload of {len}")));
    }
    match kind {
        Kind::Tensor if meta_len == 0 || meta_len > MAX_META => {
            return Err(FORMAT.malformed(format!("a tensor meta of {meta_len} bytes (1 to {MAX_META})")))
        }
        Kind::Data | Kind::Ack | Kind::Error if meta_len != 0 => {
            return Err(FORMAT.malformed(format!("a {kind:?} frame with {meta_len} bytes of meta")))
        }
        Kind::Ack if len != 0 => return Err(FORMAT.malformed(format!("an ack with {len} payload bytes"))),
        _ => {}
    }
    let mut meta = vec![0u8; meta_len];
    FORMAT.recv_exact(w, &mut meta, deadline, limit)?;
    let tensor = if kind == Kind::Tensor { Some(TensorMeta::decode(&meta)?) } else { None };
    let rest = len - meta_len;
    let mut data = Vec::with_capacity(rest.min(CHUNK));
    while data.len() < rest {
        let from = data.len();
        data.resize(from + (rest - from).min(CHUNK), 0);
        FORMAT.recv_exact(w, &mut data[from..], deadline, limit)?;
    }
    Ok(Frame { kind, tensor, data })
}

/// What the server does with each message. It runs on the connection's thread; the sender's
/// call returns once it has.
pub type Handler = Arc<dyn Fn(Received) + Send + Sync>;

/// A listening rpc port: a thread per connection, until dropped.
pub struct RpcServer {
    addr: SocketAddr,
    _server: Server,
}

impl std::fmt::Debug for RpcServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RpcServer").field("addr", &self.addr).finish_non_exhaustive()
    }
}

impl RpcServer {
    /// Listens on `listen` (`host:port`; port 0 picks one) and hands every message to
    /// `handler`. Peers authenticate with `auth`'s secret first; a frame must arrive whole
    /// within `timeout`, and a connection idle for that long is closed.
    pub fn start(listen: &str, auth: &Auth, timeout: Duration, handler: Handler) -> Result<RpcServer> {
        let (host, port) = split_listen(listen)?;
        let listener = TcpListener::bind((host.as_str(), port))
            .map_err(|e| EngineError::Config(format!("rpc: cannot listen on {listen}: {e}")))?;
        let addr = listener.local_addr()?;
        let limits =
            Limits { max_connections: MAX_CONNECTIONS, max_per_peer: MAX_CONNECTIONS_PER_PEER, idle: Some(timeout) };
        let server = serve("rpc", listener, limits, auth.guard(Service::Rpc), move |c: Accepted<TcpStream>| {
            serve_connection(&c.stream, c.idle, timeout, handler.as_ref());
        })?;
        tracing::info!("rpc: listening on {addr}");
        Ok(RpcServer { addr, _server: server })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

/// `host:port` of a listen address; unlike a target, port 0 is allowed.
fn split_listen(listen: &str) -> Result<(String, u16)> {
    let bad = || EngineError::InvalidArgument(format!("rpc listen address {listen:?} is not host:port"));
    let (host, port) = listen.rsplit_once(':').ok_or_else(bad)?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(bad());
    }
    Ok((host.to_string(), port))
}

fn serve_connection(
    stream: &TcpStream,
    idle: Option<Duration>,
    limit: Duration,
    handler: &(dyn Fn(Received) + Send + Sync),
) {
    let _ = stream.set_nodelay(true);
    let source = stream.peer_addr().map_or_else(|_| "?".to_string(), |a| a.to_string());
    let mut w = stream;
    loop {
        let frame = match read_frame(&mut w, idle, limit) {
            Ok(f) => f,
            Err(FrameError::Closed | FrameError::Idle(_)) => return,
            Err(e) => {
                // A peer that speaks this format is told why before the connection closes; a
                // stranger (bad magic) or a broken connection is just dropped.
                if matches!(
                    e,
                    FrameError::Oversized { .. }
                        | FrameError::Malformed { .. }
                        | FrameError::Kind { .. }
                        | FrameError::Version { .. }
                ) {
                    let _ = write_frame(&mut w, Kind::Error, &[], e.to_string().as_bytes(), Duration::from_millis(100));
                }
                tracing::info!("rpc: dropping the connection from {source}: {e}");
                return;
            }
        };
        if !matches!(frame.kind, Kind::Data | Kind::Tensor) {
            let why = format!("a {:?} frame is no request", frame.kind);
            let _ = write_frame(&mut w, Kind::Error, &[], why.as_bytes(), Duration::from_millis(100));
            tracing::info!("rpc: dropping the connection from {source}: {why}");
            return;
        }
        handler(Received { source: source.clone(), tensor: frame.tensor, data: frame.data });
        if let Err(e) = write_frame(&mut w, Kind::Ack, &[], &[], limit) {
            tracing::info!("rpc: cannot acknowledge to {source}: {e}");
            return;
        }
    }
}

/// The sending side: connections to each target, kept for reuse.
#[derive(Debug)]
pub struct RpcClient {
    auth: Auth,
    timeout: Duration,
    pool_size: usize,
    idle: Mutex<HashMap<String, Vec<TcpStream>>>,
}

impl RpcClient {
    /// A client that authenticates with `auth`, gives each connect, send and acknowledgement
    /// `timeout`, and keeps up to `pool_size` idle connections per target.
    pub fn new(auth: Auth, timeout: Duration, pool_size: usize) -> RpcClient {
        RpcClient { auth, timeout, pool_size, idle: Mutex::new(HashMap::new()) }
    }

    /// Sends `data` (a tensor's bytes when `tensor` says its dtype and shape) to the server at
    /// `target` (`host:port`); returns once the server's handler has taken it.
    pub fn send(&self, target: &str, tensor: Option<&TensorMeta>, data: &[u8]) -> Result<()> {
        let meta = tensor.map(TensorMeta::encode).transpose()?.unwrap_or_default();
        if (meta.len() + data.len()) as u64 > MAX_MESSAGE {
            return Err(EngineError::InvalidArgument(format!(
                "a message of {} bytes is larger than the {MAX_MESSAGE}-byte limit",
                data.len()
            )));
        }
        let kind = if tensor.is_some() { Kind::Tensor } else { Kind::Data };
        // A pooled connection the server has closed since (idle, restarted) fails before any
        // reply: then once more on a fresh one.
        if let Some(conn) = self.pooled(target) {
            match self.exchange(&conn, target, kind, &meta, data) {
                Ok(()) => {
                    self.put_back(target, conn);
                    return Ok(());
                }
                Err(Attempt::Stale(e)) => {
                    tracing::debug!("rpc: a pooled connection to {target} failed ({e}); a fresh one")
                }
                Err(Attempt::Failed(e)) => return Err(e),
            }
        }
        let conn = self.connect(target)?;
        match self.exchange(&conn, target, kind, &meta, data) {
            Ok(()) => {
                self.put_back(target, conn);
                Ok(())
            }
            Err(Attempt::Stale(e) | Attempt::Failed(e)) => Err(e),
        }
    }

    fn pooled(&self, target: &str) -> Option<TcpStream> {
        let mut idle = self.idle.lock();
        let conns = idle.get_mut(target)?;
        while let Some(c) = conns.pop() {
            // An idle connection has nothing to read: readable means the server closed it.
            let mut fds = [rustix::event::PollFd::new(&c, rustix::event::PollFlags::IN)];
            let zero = rustix::event::Timespec { tv_sec: 0, tv_nsec: 0 };
            if matches!(rustix::event::poll(&mut fds, Some(&zero)), Ok(0)) {
                return Some(c);
            }
        }
        None
    }

    fn put_back(&self, target: &str, conn: TcpStream) {
        let mut idle = self.idle.lock();
        let conns = idle.entry(target.to_string()).or_default();
        if conns.len() < self.pool_size {
            conns.push(conn);
        }
    }

    fn connect(&self, target: &str) -> Result<TcpStream> {
        let (host, port) = split_host_port(target)?;
        let unreachable = |reason: String| EngineError::PeerUnreachable { peer: target.to_string(), reason };
        let deadline = Instant::now() + self.timeout;
        let addr = (host.as_str(), port)
            .to_socket_addrs()
            .map_err(|e| unreachable(format!("cannot resolve {host}: {e}")))?
            .next()
            .ok_or_else(|| unreachable(format!("{host} resolves to no address")))?;
        let conn = TcpStream::connect_timeout(&addr, self.timeout).map_err(|e| match e.kind() {
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => {
                EngineError::PeerTimedOut { peer: target.to_string(), waited: self.timeout, what: "a connection" }
            }
            _ => unreachable(format!("connect: {e}")),
        })?;
        let _ = conn.set_nodelay(true);
        self.auth
            .dial(Service::Rpc, &mut &conn, Some(deadline))
            .map_err(|source| EngineError::Unauthenticated { peer: format!("rpc server {target}"), source })?;
        Ok(conn)
    }

    fn exchange(
        &self,
        conn: &TcpStream,
        target: &str,
        kind: Kind,
        meta: &[u8],
        data: &[u8],
    ) -> std::result::Result<(), Attempt> {
        let timed_out = |what| EngineError::PeerTimedOut { peer: target.to_string(), waited: self.timeout, what };
        let mut w = conn;
        if let Err(e) = write_frame(&mut w, kind, meta, data, self.timeout) {
            return Err(if e.is_timeout() {
                Attempt::Failed(timed_out("room to send the message"))
            } else {
                Attempt::Stale(EngineError::PeerUnreachable { peer: target.to_string(), reason: e.to_string() })
            });
        }
        match read_frame(&mut w, Some(self.timeout), self.timeout) {
            Ok(Frame { kind: Kind::Ack, .. }) => Ok(()),
            Ok(Frame { kind: Kind::Error, data, .. }) => Err(Attempt::Failed(EngineError::Rejected {
                peer: target.to_string(),
                reason: String::from_utf8_lossy(&data).into_owned(),
            })),
            Ok(f) => Err(Attempt::Failed(EngineError::BadPeerReply {
                peer: target.to_string(),
                reason: format!("a {:?} frame where an ack was due", f.kind),
            })),
            Err(e) if e.is_timeout() => Err(Attempt::Failed(timed_out("the acknowledgement"))),
            Err(e @ FrameError::Closed) => {
                let reason = if self.auth.is_required() {
                    format!("{e} (too many connections, or the message was refused?)")
                } else {
                    format!("{e} (does it require the cluster secret, which this process lacks?)")
                };
                Err(Attempt::Stale(EngineError::PeerUnreachable { peer: target.to_string(), reason }))
            }
            Err(e @ FrameError::Io { .. }) => {
                Err(Attempt::Stale(EngineError::PeerUnreachable { peer: target.to_string(), reason: e.to_string() }))
            }
            Err(e) => {
                Err(Attempt::Failed(EngineError::BadPeerReply { peer: target.to_string(), reason: e.to_string() }))
            }
        }
    }
}

/// How one try of a send ended: `Stale` — the connection failed before any reply (worth one
/// more try on a fresh connection when it was a pooled one); `Failed` — the answer is final.
enum Attempt {
    Stale(EngineError),
    Failed(EngineError),
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::sync::mpsc;

    const SECOND: Duration = Duration::from_secs(1);

    fn meta() -> TensorMeta {
        TensorMeta { dtype: "float32".into(), shape: vec![2, 3] }
    }

    #[test]
    fn frames_round_trip() {
        let mut buf = Vec::new();
        write_frame(&mut buf, Kind::Tensor, &meta().encode().unwrap(), &[7u8; 24], SECOND).unwrap();
        write_frame(&mut buf, Kind::Data, &[], b"hello", SECOND).unwrap();
        write_frame(&mut buf, Kind::Ack, &[], &[], SECOND).unwrap();
        let mut r = buf.as_slice();
        let t = read_frame(&mut r, None, SECOND).unwrap();
        assert_eq!((t.kind, t.tensor, t.data), (Kind::Tensor, Some(meta()), vec![7u8; 24]));
        let d = read_frame(&mut r, None, SECOND).unwrap();
        assert_eq!((d.kind, d.tensor, d.data.as_slice()), (Kind::Data, None, &b"hello"[..]));
        assert_eq!(read_frame(&mut r, None, SECOND).unwrap().kind, Kind::Ack);
        assert!(matches!(read_frame(&mut r, None, SECOND), Err(FrameError::Closed)));
    }

    #[test]
    fn an_oversized_announcement_is_refused_before_any_allocation() {
        let mut h = header(Kind::Data, 0, 0);
        h[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(read_frame(&mut &h[..], None, SECOND), Err(FrameError::Oversized { .. })));
    }

    #[test]
    fn malformed_headers_and_metas_are_typed_errors() {
        let tensor_without_meta = header(Kind::Tensor, 0, 4);
        let data_with_meta = header(Kind::Data, 4, 8);
        let meta_longer_than_payload = header(Kind::Tensor, 9, 8);
        let mut unknown_kind = header(Kind::Data, 0, 0);
        unknown_kind[5] = 9;
        for h in [tensor_without_meta, data_with_meta, meta_longer_than_payload, unknown_kind] {
            let mut r = &h[..];
            let e = read_frame(&mut r, None, SECOND).unwrap_err();
            assert!(matches!(e, FrameError::Malformed { .. } | FrameError::Kind { .. }), "{e}");
        }
        // A meta whose shape does not match its ndim, and one whose dtype runs past it.
        assert!(TensorMeta::decode(&[1, b'f', 2, 0, 0]).is_err());
        assert!(TensorMeta::decode(&[200, b'f']).is_err());
        assert!(TensorMeta::decode(&[]).is_err());
        assert!(TensorMeta { dtype: "x".repeat(MAX_DTYPE + 1), shape: vec![] }.encode().is_err());
    }

    #[test]
    fn a_truncated_frame_is_an_error_not_a_hang() {
        let mut buf = Vec::new();
        write_frame(&mut buf, Kind::Data, &[], &[1u8; 100], SECOND).unwrap();
        buf.truncate(60);
        assert!(matches!(read_frame(&mut buf.as_slice(), None, SECOND), Err(FrameError::Io { .. })));
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_parse_or_fail_without_panicking(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..64)) {
            let mut with_prefix = b"CRPC\x01".to_vec();
            with_prefix.extend_from_slice(&bytes);
            let _ = read_frame(&mut with_prefix.as_slice(), None, SECOND);
            let _ = read_frame(&mut bytes.as_slice(), None, SECOND);
            let _ = TensorMeta::decode(&bytes);
        }
    }

    fn server(auth: &Auth) -> (RpcServer, mpsc::Receiver<Received>) {
        let (tx, rx) = mpsc::channel();
        let tx = Mutex::new(tx);
        let handler: Handler = Arc::new(move |r: Received| {
            let _ = tx.lock().send(r);
        });
        (RpcServer::start("127.0.0.1:0", auth, 5 * SECOND, handler).unwrap(), rx)
    }

    #[test]
    fn messages_reach_the_handler_and_garbage_does_not_stop_the_server() {
        let (server, rx) = server(&Auth::open());
        let target = server.local_addr().to_string();
        let client = RpcClient::new(Auth::open(), 5 * SECOND, 2);
        client.send(&target, None, b"one").unwrap();
        let got = rx.recv_timeout(SECOND).unwrap();
        assert_eq!((got.tensor, got.data.as_slice()), (None, &b"one"[..]));
        assert!(got.source.starts_with("127.0.0.1:"), "{}", got.source);

        let mut garbage = TcpStream::connect(server.local_addr()).unwrap();
        garbage.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
        let mut oversized = TcpStream::connect(server.local_addr()).unwrap();
        let mut h = header(Kind::Data, 0, 0);
        h[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        oversized.write_all(&h).unwrap();
        let answer = read_frame(&mut &oversized, Some(5 * SECOND), 5 * SECOND).unwrap();
        assert_eq!(answer.kind, Kind::Error);

        client.send(&target, Some(&meta()), &[1u8; 24]).unwrap();
        let got = rx.recv_timeout(SECOND).unwrap();
        assert_eq!((got.tensor, got.data), (Some(meta()), vec![1u8; 24]));
        assert!(rx.try_recv().is_err(), "nothing else was delivered");
    }

    #[test]
    fn without_the_secret_a_client_is_refused_and_nothing_is_delivered() {
        let keyring = crescent_transports::net::Keyring::new(&["0123456789abcdef0123456789abcdef"]).unwrap();
        let (server, rx) = server(&Auth::new(Some(keyring.clone())));
        let target = server.local_addr().to_string();
        let outsider = RpcClient::new(Auth::open(), 2 * SECOND, 2);
        assert!(outsider.send(&target, None, b"x").is_err());
        let member = RpcClient::new(Auth::new(Some(keyring)), 2 * SECOND, 2);
        member.send(&target, None, b"y").unwrap();
        assert_eq!(rx.recv_timeout(SECOND).unwrap().data, b"y");
        assert!(rx.try_recv().is_err(), "the outsider's message was not delivered");
    }

    #[test]
    fn nothing_listening_is_an_error() {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let client = RpcClient::new(Auth::open(), SECOND, 2);
        let e = client.send(&format!("127.0.0.1:{port}"), None, b"x").unwrap_err();
        assert!(matches!(e, EngineError::PeerUnreachable { .. }), "{e}");
        assert!(matches!(client.send("no-port", None, b"x"), Err(EngineError::InvalidArgument(_))));
    }
}
