//! The client's side of the fast RPC wire ([`crate::fastrpc`]): a few plain TCP connections
//! to the master's fast port, each carrying one call at a time on the calling thread (the net
//! layer's `send_all_by` and `Format::read_frame`: no runtime, no other thread woken).
//! Connections wait in a pool between calls and are closed once idle for 10 s (the master
//! closes them after 60 s). A call has one deadline, the client's call timeout, for its request and its reply;
//! [`FastRpc::close`] (the client followed a new leader) shuts down those in flight, which
//! end with a retryable error as gRPC's calls do.

use std::collections::HashMap;
use std::io::IoSlice;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use prost::Message;

use crescent_transports::net::wire::{recv_now, send_all_by};
use crescent_transports::net::FrameError;

use crate::fastrpc::{self, Method, FORMAT, HELLO};
use crate::protocol::MAX_MESSAGE;

/// Pooled connections idle longer than this are dropped (at the next call or heartbeat,
/// [`FastRpc::trim`]): well within the master's idle bound, and a client that went quiet
/// keeps no more connections than it needs.
const POOLED_IDLE: Duration = Duration::from_secs(10);
/// Most connections kept idle in the pool.
const POOL_MAX: usize = 16;

/// Connections to one master's fast RPC port.
pub struct FastRpc {
    /// The gRPC address of the master that advertised the port.
    origin: String,
    addr: SocketAddr,
    hello: Vec<u8>,
    call_timeout: Duration,
    connect_timeout: Duration,
    idle: Mutex<Vec<(TcpStream, Instant)>>,
    /// Connections with a call in flight (clones of their sockets), to shut down on close.
    busy: Mutex<HashMap<u64, TcpStream>>,
    next: AtomicU64,
    closed: AtomicBool,
}

impl FastRpc {
    /// Connects to `addr` (the port that `origin`, a master's gRPC address, advertised) and says hello (`hello`: [`fastrpc::hello_body`]); an error where
    /// the port does not answer or refuses the credentials (the caller then keeps gRPC).
    #[allow(clippy::result_large_err)] // tonic's Status, as gRPC's calls return it
    pub fn connect(
        origin: &str,
        addr: SocketAddr,
        hello: Vec<u8>,
        call_timeout: Duration,
        connect_timeout: Duration,
    ) -> Result<FastRpc, tonic::Status> {
        let rpc = FastRpc {
            origin: origin.to_string(),
            addr,
            hello,
            call_timeout,
            connect_timeout,
            idle: Mutex::new(Vec::new()),
            busy: Mutex::new(HashMap::new()),
            next: AtomicU64::new(0),
            closed: AtomicBool::new(false),
        };
        let first = rpc.open()?;
        rpc.idle.lock().push((first, Instant::now()));
        Ok(rpc)
    }

    /// The gRPC address of the master that advertised this port.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The master's fast port this talks to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A connection for one call: a pooled one still open, else a new one; `None` where the
    /// port cannot be reached or was closed (the caller then uses gRPC: nothing was sent).
    pub fn conn(&self) -> Option<TcpStream> {
        if self.closed.load(Ordering::Acquire) {
            return None;
        }
        loop {
            let Some((s, since)) = self.idle.lock().pop() else { break };
            if since.elapsed() < POOLED_IDLE && still_open(&s) {
                return Some(s);
            }
        }
        match self.open() {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::debug!("the master's fast rpc port {}: {}", self.addr, e.message());
                None
            }
        }
    }

    /// One call of `method` on `conn` (from [`Self::conn`]), running `meanwhile` on the
    /// calling thread once the request is sent and before the reply is read: the reply, or a
    /// status as gRPC's would carry (a broken or timed-out connection is `UNAVAILABLE` /
    /// `DEADLINE_EXCEEDED`).
    #[allow(clippy::result_large_err)] // tonic's Status, as gRPC's calls return it
    pub fn call_while<Q: Message, R: Message + Default, X>(
        &self,
        conn: TcpStream,
        method: Method,
        req: &Q,
        meanwhile: impl FnOnce() -> X,
    ) -> (Result<R, tonic::Status>, X) {
        let no_second = || (meanwhile(), None::<(Method, crate::proto::KeyRequest)>);
        let (reply, side, _) = self.call_then::<Q, R, _, crate::proto::StatusReply, X>(conn, method, req, no_second);
        (reply, side)
    }

    /// [`Self::call_while`] with a second call behind the first on the same connection:
    /// `meanwhile` runs once the first request is sent and may give the second request, which
    /// is sent before the first reply is read (the master answers a connection's calls in
    /// order). Returns the first reply, `meanwhile`'s result, and the second reply if one was
    /// sent. The connection goes back to the pool only when both replies came.
    #[allow(clippy::result_large_err, clippy::type_complexity)] // tonic's Status
    pub fn call_then<Q: Message, R: Message + Default, Q2: Message, R2: Message + Default, X>(
        &self,
        mut conn: TcpStream,
        method: Method,
        req: &Q,
        meanwhile: impl FnOnce() -> (X, Option<(Method, Q2)>),
    ) -> (Result<R, tonic::Status>, X, Option<Result<R2, tonic::Status>>) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        if let Ok(clone) = conn.try_clone() {
            self.busy.lock().insert(id, clone);
        }
        let deadline = Instant::now() + self.call_timeout;
        let request = fastrpc::message_frame(method as u8, req);
        let sent =
            send_all_by(&mut conn, &mut [IoSlice::new(&request)], Some(deadline)).map_err(|e| self.io_status(&e));
        let (side, second) = meanwhile();
        let second = match (&sent, second) {
            (Ok(()), Some((method, req))) => {
                let frame = fastrpc::message_frame(method as u8, &req);
                Some(
                    send_all_by(&mut conn, &mut [IoSlice::new(&frame)], Some(deadline)).map_err(|e| self.io_status(&e)),
                )
            }
            _ => None,
        };
        let reply = sent.and_then(|()| self.read_reply(&mut conn, deadline));
        let second = second.map(|sent| {
            let read = reply.as_ref().map_err(Clone::clone).and(sent);
            read.and_then(|()| self.read_reply(&mut conn, deadline))
        });
        self.busy.lock().remove(&id);
        // A connection whose call failed may hold half a frame: never reused.
        let whole = reply.is_ok() && second.as_ref().is_none_or(Result::is_ok);
        if whole && !self.closed.load(Ordering::Acquire) {
            let mut idle = self.idle.lock();
            if idle.len() < POOL_MAX {
                idle.push((conn, Instant::now()));
            }
        }
        let second = second.map(|r| r.and_then(|(tag, body)| decode(tag, &body)));
        (reply.and_then(|(tag, body)| decode(tag, &body)), side, second)
    }

    /// Closes the pooled connections idle for longer than [`POOLED_IDLE`].
    pub fn trim(&self) {
        self.idle.lock().retain(|(_, since)| since.elapsed() < POOLED_IDLE);
    }

    /// Drops the pool and shuts down the connections in flight: their calls end with
    /// `UNAVAILABLE`, and later ones fail at once.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.idle.lock().clear();
        for s in self.busy.lock().values() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// A connection of its own for an owner stream ([`Method::OwnerStream`]): said hello, then
    /// the stream's first acknowledgement `first`, answered OK within the connect timeout.
    /// Blocking; the stream is the caller's to read and write from then on.
    #[allow(clippy::result_large_err)]
    pub fn open_owner_stream(&self, first: &crate::proto::OwnerAck) -> Result<TcpStream, tonic::Status> {
        if self.closed.load(Ordering::Acquire) {
            return Err(tonic::Status::unavailable("the master's fast rpc port was given up"));
        }
        let s = self.open()?;
        self.opening(s, &fastrpc::message_frame(Method::OwnerStream as u8, first))
    }

    /// A new connection, its hello answered.
    #[allow(clippy::result_large_err)]
    fn open(&self) -> Result<TcpStream, tonic::Status> {
        let s = TcpStream::connect_timeout(&self.addr, self.connect_timeout).map_err(|e| self.io_status(&e))?;
        s.set_nodelay(true).map_err(|e| self.io_status(&e))?;
        self.opening(s, &fastrpc::frame(HELLO, &self.hello))
    }

    /// `s` once the master answered the opening frame `frame` (a hello, an owner stream's
    /// first acknowledgement) OK, both within the connect timeout; its refusal otherwise.
    #[allow(clippy::result_large_err)]
    fn opening(&self, mut s: TcpStream, frame: &[u8]) -> Result<TcpStream, tonic::Status> {
        let deadline = Instant::now() + self.connect_timeout;
        send_all_by(&mut s, &mut [IoSlice::new(frame)], Some(deadline)).map_err(|e| self.io_status(&e))?;
        let (tag, body) = self.read_reply(&mut s, deadline)?;
        match fastrpc::reply_status(tag, &body) {
            Some(refused) => Err(refused),
            None => Ok(s),
        }
    }

    /// A reply frame's tag and body, whole by `deadline`; its length is bounded before
    /// anything is allocated for it.
    #[allow(clippy::result_large_err)]
    fn read_reply(&self, s: &mut TcpStream, deadline: Instant) -> Result<(u8, Vec<u8>), tonic::Status> {
        let left = deadline.saturating_duration_since(Instant::now());
        match FORMAT.read_frame(s, MAX_MESSAGE as u64, Some(left), left) {
            Ok(frame) => Ok((frame.kind, frame.payload)),
            Err(e) if e.is_timeout() => Err(tonic::Status::deadline_exceeded(format!(
                "no reply from the master's fast rpc port {} within {:?}",
                self.addr, self.call_timeout
            ))),
            Err(FrameError::Io { source, .. }) => Err(self.io_status(&source)),
            Err(FrameError::Closed) => Err(tonic::Status::unavailable(format!(
                "the master's fast rpc port {} closed the connection",
                self.addr
            ))),
            Err(e) => Err(tonic::Status::internal(format!("the master's fast rpc reply: {e}"))),
        }
    }

    /// What an I/O error on the connection means for the call, as gRPC would say it.
    fn io_status(&self, e: &std::io::Error) -> tonic::Status {
        use std::io::ErrorKind::*;
        match e.kind() {
            WouldBlock | TimedOut => tonic::Status::deadline_exceeded(format!(
                "no reply from the master's fast rpc port {} within {:?}",
                self.addr, self.call_timeout
            )),
            _ => tonic::Status::unavailable(format!("the master's fast rpc port {}: {e}", self.addr)),
        }
    }
}

/// Whether a pooled connection is still open: nothing to read on it (a master that restarted
/// or closed it for idling has sent its end), checked without blocking.
fn still_open(s: &TcpStream) -> bool {
    matches!(recv_now(s.as_fd(), &mut [0u8; 1]), Ok(None))
}

/// A reply frame's message, or its status.
#[allow(clippy::result_large_err)]
fn decode<R: Message + Default>(tag: u8, body: &[u8]) -> Result<R, tonic::Status> {
    if let Some(status) = fastrpc::reply_status(tag, body) {
        return Err(status);
    }
    R::decode(body).map_err(|e| tonic::Status::internal(format!("a reply from the master's fast rpc port: {e}")))
}
