//! The one accept loop: every listener of Crescent (the tcp transport's data port, the shm
//! and rdma control sockets, the engine's handshake port, the store's disk service) runs it.
//!
//! * **Bounded connections**, in total and per peer ([`PeerKey`]: the address for tcp, the
//!   process for a same-host unix socket), so one peer cannot take every slot: a connection
//!   over a bound is closed at once (the handler's `refused` hook may tell it why first).
//! * **A count that cannot leak**: a connection's slot is a `Ticket` owned by its thread's
//!   closure; a thread that fails to start drops the closure, and with it the slot.
//! * **Backoff on accept errors** ([`AcceptBackoff`]): with no file descriptor left (`EMFILE`,
//!   `ENFILE`) the pending connection stays queued and `accept` fails again at once; the loop
//!   waits 5 ms doubling to 1 s between tries instead of spinning.
//! * **Idle connections end**: the handler gets the listener's idle time ([`Accepted::idle`])
//!   and ends a connection that sends nothing for that long (see [`super::codec`]).
//! * **A clean shutdown**: dropping the [`Server`] wakes the loop (an eventfd, no self-connect),
//!   shuts every live connection down (their threads return) and joins the loop's thread.
//!
//! * **Authentication** (issue 26) in one place: `open_connection` runs the listener's
//!   [`Guard`] on the connection's thread, under its slot and within the exchange's deadline,
//!   before the handler sees any byte; a peer that does not prove it knows the cluster secret
//!   is closed and counted ([`super::AuthStats`]).

use std::collections::HashMap;
use std::hash::Hash;
use std::io;
use std::net::{IpAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::Mutex;

use super::auth::Guard;
use rustix::event::{EventfdFlags, PollFd, PollFlags, Timespec};
use rustix::io::Errno;

/// Whose connection it is, for the per-peer bound.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PeerKey {
    /// A tcp peer: its address (every port of one host counts together).
    Ip(IpAddr),
    /// A same-host peer on a unix socket, as the kernel tells it (`SO_PEERCRED`).
    Process {
        /// The peer's process id.
        pid: i32,
        /// The peer's user id.
        uid: u32,
    },
    /// The kernel could not say who the peer is (`SO_PEERCRED` failed): all such peers
    /// share one per-peer bound.
    Unknown,
}

impl std::fmt::Display for PeerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PeerKey::Ip(ip) => write!(f, "{ip}"),
            PeerKey::Process { pid, uid } => write!(f, "pid {pid} (uid {uid})"),
            PeerKey::Unknown => f.write_str("an unknown peer"),
        }
    }
}

/// The bounds of one listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once, from everyone.
    pub max_connections: usize,
    /// Connections served at once from one [`PeerKey`].
    pub max_per_peer: usize,
    /// A connection that sends nothing for this long is closed (`None`: never, for
    /// connections that legitimately idle, such as shm grants).
    pub idle: Option<Duration>,
}

/// A listening socket the loop accepts from.
pub trait Listener: AsFd + Send + 'static {
    /// The kind of connection it accepts (a `TcpStream`, a unix socket).
    type Conn: Connection;
    /// Accepts one connection (the listener is non-blocking: `WouldBlock` when none is
    /// pending) and says whose it is.
    fn accept_conn(&self) -> io::Result<(Self::Conn, PeerKey)>;
}

/// An accepted connection (a socket: the authentication reads and writes its descriptor).
pub trait Connection: AsFd + Send + Sync + 'static {
    /// Ends the connection both ways: a thread blocked on it returns.
    fn shutdown(&self);
}

impl Listener for TcpListener {
    type Conn = TcpStream;
    fn accept_conn(&self) -> io::Result<(TcpStream, PeerKey)> {
        let (stream, addr) = self.accept()?;
        Ok((stream, PeerKey::Ip(addr.ip().to_canonical())))
    }
}

impl Connection for TcpStream {
    fn shutdown(&self) {
        let _ = TcpStream::shutdown(self, std::net::Shutdown::Both);
    }
}

impl Connection for std::os::unix::net::UnixStream {
    fn shutdown(&self) {
        let _ = std::os::unix::net::UnixStream::shutdown(self, std::net::Shutdown::Both);
    }
}

/// One accepted connection, handed to the handler on its own thread.
pub struct Accepted<C> {
    /// The connection, already authenticated when the listener has a guard; shared with the
    /// loop, which shuts it down on [`Server`]'s shutdown.
    pub stream: Arc<C>,
    /// Whose connection it is (what the per-peer bound counted it under).
    pub peer: PeerKey,
    /// The listener's idle time (see [`Limits::idle`]).
    pub idle: Option<Duration>,
}

/// The backoff between failed accepts: transient errors (a connection reset before it was
/// accepted, a signal) are retried at once; anything else — most of all `EMFILE`/`ENFILE`,
/// which fail again at once for as long as no descriptor frees — waits 5 ms, doubling to 1 s,
/// and starts over after an accept that works.
#[derive(Debug, Default, Clone)]
pub struct AcceptBackoff {
    delay: Duration,
}

impl AcceptBackoff {
    /// The first wait after a non-transient accept error.
    pub const FIRST: Duration = Duration::from_millis(5);
    /// The longest wait, however many accepts failed in a row.
    pub const MAX: Duration = Duration::from_secs(1);

    /// How long to wait before accepting again after `err`.
    pub fn on_error(&mut self, err: &io::Error) -> Duration {
        let transient = matches!(err.kind(), io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted)
            || err.raw_os_error() == Some(Errno::PROTO.raw_os_error());
        if transient {
            return Duration::ZERO;
        }
        self.delay = (self.delay * 2).clamp(Self::FIRST, Self::MAX);
        self.delay
    }

    /// An accept worked: the next error waits [`AcceptBackoff::FIRST`] again.
    pub fn on_success(&mut self) {
        self.delay = Duration::ZERO;
    }
}

/// Connections open, in total and per peer: what an admission checks against its bounds and
/// a closed connection gives back. A peer keeps an entry only while it has connections open,
/// so peers that come and go leave nothing behind. The accept loop here and the store
/// master's gRPC port both count with it.
#[derive(Debug, Clone)]
pub struct PeerCounts<K> {
    total: usize,
    per_peer: HashMap<K, usize>,
}

impl<K> Default for PeerCounts<K> {
    fn default() -> Self {
        PeerCounts { total: 0, per_peer: HashMap::new() }
    }
}

impl<K: Eq + Hash> PeerCounts<K> {
    /// Connections open from everyone.
    pub fn total(&self) -> usize {
        self.total
    }

    /// Connections open from `peer`.
    pub fn of(&self, peer: &K) -> usize {
        self.per_peer.get(peer).copied().unwrap_or(0)
    }

    /// Counts a connection of `peer` that opened (the caller checked the bounds).
    pub fn add(&mut self, peer: K) {
        self.total += 1;
        *self.per_peer.entry(peer).or_insert(0) += 1;
    }

    /// Gives back the slot of a connection of `peer` that [`PeerCounts::add`] counted.
    pub fn remove(&mut self, peer: &K) {
        self.total -= 1;
        if let Some(n) = self.per_peer.get_mut(peer) {
            *n -= 1;
            if *n == 0 {
                self.per_peer.remove(peer);
            }
        }
    }
}

#[derive(Default)]
struct GateState {
    counts: PeerCounts<PeerKey>,
    live: HashMap<u64, Weak<dyn Connection>>,
    next: u64,
    closed: bool,
    refused: u64,
}

/// Admission of connections under [`Limits`], and the live ones (for the shutdown).
pub(crate) struct Gate {
    limits: Limits,
    state: Mutex<GateState>,
}

/// A connection's slot: released when dropped, wherever that happens.
pub(crate) struct Ticket {
    gate: Arc<Gate>,
    peer: PeerKey,
    id: u64,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut st = self.gate.state.lock();
        st.counts.remove(&self.peer);
        st.live.remove(&self.id);
    }
}

impl Gate {
    pub(crate) fn new(limits: Limits) -> Arc<Gate> {
        Arc::new(Gate { limits, state: Mutex::new(GateState::default()) })
    }

    /// A slot for `conn` of `peer`, or why not.
    pub(crate) fn admit<C: Connection>(self: &Arc<Self>, peer: &PeerKey, conn: &Arc<C>) -> Result<Ticket, String> {
        let mut st = self.state.lock();
        let (total, of_peer) = (st.counts.total(), st.counts.of(peer));
        let refusal = if st.closed {
            Some("the listener is shutting down".to_string())
        } else if total >= self.limits.max_connections {
            Some(format!("{total} connections are open, the most this listener serves"))
        } else if of_peer >= self.limits.max_per_peer {
            Some(format!("{peer} has {of_peer} connections open, the most one peer may"))
        } else {
            None
        };
        if let Some(why) = refusal {
            st.refused += 1;
            return Err(why);
        }
        st.counts.add(peer.clone());
        let id = st.next;
        st.next += 1;
        let weak: Weak<C> = Arc::downgrade(conn);
        st.live.insert(id, weak);
        Ok(Ticket { gate: self.clone(), peer: peer.clone(), id })
    }

    /// Connections served now: in total and from `peer`.
    #[cfg(test)]
    pub(crate) fn counts(&self, peer: &PeerKey) -> (usize, usize) {
        let st = self.state.lock();
        (st.counts.total(), st.counts.of(peer))
    }

    fn refused(&self) -> u64 {
        self.state.lock().refused
    }

    /// Refuses new connections and shuts down the live ones.
    fn close(&self) {
        let live: Vec<Arc<dyn Connection>> = {
            let mut st = self.state.lock();
            st.closed = true;
            st.live.values().filter_map(Weak::upgrade).collect()
        };
        for c in live {
            c.shutdown();
        }
    }
}

/// What a connection's thread runs before the handler: the per-connection setup every
/// listener needs — the authentication of the peer by `guard` (issue 26).
fn open_connection<C: Connection>(guard: &Guard, conn: &Accepted<C>) -> Result<(), String> {
    guard.accept(&mut conn.stream.as_fd()).map_err(|e| {
        let service = guard.service().map_or("?", |s| s.as_str());
        format!("it did not authenticate to the {service} port: {e}")
    })
}

type Spawn = fn(String, Box<dyn FnOnce() + Send>) -> io::Result<()>;

fn os_spawn(name: String, f: Box<dyn FnOnce() + Send>) -> io::Result<()> {
    std::thread::Builder::new().name(name).spawn(f).map(|_| ())
}

/// Starts a connection's thread; its slot goes with the closure (freed if it cannot start).
fn start_connection<C: Connection>(
    name: &'static str,
    spawn: Spawn,
    ticket: Ticket,
    conn: Accepted<C>,
    guard: Guard,
    handler: Arc<dyn Fn(Accepted<C>) + Send + Sync>,
) -> io::Result<()> {
    spawn(
        format!("crescent-{name}"),
        Box::new(move || {
            let _slot = ticket;
            match open_connection(&guard, &conn) {
                Ok(()) => handler(conn),
                Err(why) => {
                    // Counted; logged loudly at 1, 2, 4, 8, ... refusals (a scanner cannot
                    // flood the log).
                    let n = guard.refused();
                    if n.is_power_of_two() {
                        tracing::warn!("{name}: closing a connection from {}: {why} ({n} refused so far)", conn.peer);
                    } else {
                        tracing::debug!("{name}: closing a connection from {}: {why}", conn.peer);
                    }
                    conn.stream.shutdown();
                }
            }
        }),
    )
}

/// The stop signal of a loop: a flag and an eventfd that wakes its `poll`.
struct Stop {
    efd: OwnedFd,
    stopped: std::sync::atomic::AtomicBool,
}

impl Stop {
    fn new() -> io::Result<Stop> {
        let efd = rustix::event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        Ok(Stop { efd, stopped: std::sync::atomic::AtomicBool::new(false) })
    }

    fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        let _ = rustix::io::write(&self.efd, &1u64.to_ne_bytes());
    }

    fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    /// Waits until `fd` is readable, the stop, or `timeout`; true unless stopped.
    fn wait(&self, fd: Option<std::os::fd::BorrowedFd<'_>>, timeout: Option<Duration>) -> bool {
        let ts = timeout.map(|t| Timespec { tv_sec: t.as_secs() as i64, tv_nsec: t.subsec_nanos() as _ });
        let mut fds = vec![PollFd::new(&self.efd, PollFlags::IN)];
        if let Some(fd) = &fd {
            fds.push(PollFd::new(fd, PollFlags::IN));
        }
        let _ = rustix::event::poll(&mut fds, ts.as_ref());
        !self.is_stopped()
    }
}

/// A running accept loop; dropping it stops the loop and shuts its connections down.
pub struct Server {
    name: &'static str,
    stop: Arc<Stop>,
    gate: Arc<Gate>,
    thread: Option<JoinHandle<()>>,
    accepted: Arc<AtomicU64>,
}

impl Server {
    /// Connections served now.
    pub fn connections(&self) -> usize {
        self.gate.state.lock().counts.total()
    }

    /// Connections refused by a bound so far.
    pub fn refused(&self) -> u64 {
        self.gate.refused()
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server").field("name", &self.name).finish_non_exhaustive()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.gate.close();
    }
}

/// Serves `listener`: each admitted connection is authenticated by `guard`, then runs
/// `handler` on a thread of its own (named `crescent-<name>`) until it returns.
pub fn serve<L, H>(name: &'static str, listener: L, limits: Limits, guard: Guard, handler: H) -> io::Result<Server>
where
    L: Listener,
    H: Fn(Accepted<L::Conn>) + Send + Sync + 'static,
{
    serve_with(name, listener, limits, guard, handler, |_: &L::Conn, _: &str| {})
}

/// [`serve`], with `refused` called for a connection refused by a bound (on the accept
/// thread, before the connection closes: it must not block, e.g. a small non-blocking write
/// that tells the peer why).
pub fn serve_with<L, H, R>(
    name: &'static str,
    listener: L,
    limits: Limits,
    guard: Guard,
    handler: H,
    refused: R,
) -> io::Result<Server>
where
    L: Listener,
    H: Fn(Accepted<L::Conn>) + Send + Sync + 'static,
    R: Fn(&L::Conn, &str) + Send + 'static,
{
    serve_inner(name, listener, limits, guard, Arc::new(handler), refused, os_spawn)
}

fn serve_inner<L, R>(
    name: &'static str,
    listener: L,
    limits: Limits,
    guard: Guard,
    handler: Arc<dyn Fn(Accepted<L::Conn>) + Send + Sync>,
    refused: R,
    spawn: Spawn,
) -> io::Result<Server>
where
    L: Listener,
    R: Fn(&L::Conn, &str) + Send + 'static,
{
    rustix::io::ioctl_fionbio(&listener, true)?;
    let stop = Arc::new(Stop::new()?);
    let gate = Gate::new(limits);
    let accepted = Arc::new(AtomicU64::new(0));
    let (stop2, gate2, accepted2) = (stop.clone(), gate.clone(), accepted.clone());
    let thread = std::thread::Builder::new().name(format!("crescent-{name}-accept")).spawn(move || {
        let mut backoff = AcceptBackoff::default();
        while stop2.wait(Some(listener.as_fd()), None) {
            let (conn, peer) = match listener.accept_conn() {
                Ok(c) => c,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => {
                    let delay = backoff.on_error(&e);
                    if delay >= AcceptBackoff::FIRST {
                        tracing::warn!("{name}: accept failed ({e}); trying again in {delay:?}");
                    }
                    if !delay.is_zero() && !stop2.wait(None, Some(delay)) {
                        break;
                    }
                    continue;
                }
            };
            backoff.on_success();
            accepted2.fetch_add(1, Ordering::Relaxed);
            let conn = Arc::new(conn);
            let ticket = match gate2.admit(&peer, &conn) {
                Ok(t) => t,
                Err(why) => {
                    let n = gate2.refused();
                    if n.is_power_of_two() {
                        tracing::warn!("{name}: refused a connection from {peer}: {why} ({n} refused so far)");
                    }
                    refused(&conn, &why);
                    conn.shutdown();
                    continue;
                }
            };
            let accepted = Accepted { stream: conn.clone(), peer: peer.clone(), idle: limits.idle };
            if let Err(e) = start_connection(name, spawn, ticket, accepted, guard.clone(), handler.clone()) {
                tracing::error!("{name}: cannot start a thread for a connection from {peer}: {e}");
                conn.shutdown();
            }
        }
    })?;
    Ok(Server { name, stop, gate, thread: Some(thread), accepted })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::net::SocketAddr;

    fn fake() -> Arc<std::os::unix::net::UnixStream> {
        Arc::new(std::os::unix::net::UnixStream::pair().unwrap().0)
    }

    const LIMITS: Limits = Limits { max_connections: 4, max_per_peer: 2, idle: None };

    fn ip(last: u8) -> PeerKey {
        PeerKey::Ip(IpAddr::from([10, 0, 0, last]))
    }

    #[test]
    fn one_peer_at_its_cap_leaves_room_for_another() {
        let gate = Gate::new(LIMITS);
        let c = fake();
        let a1 = gate.admit(&ip(1), &c).unwrap();
        let _a2 = gate.admit(&ip(1), &c).unwrap();
        let err = gate.admit(&ip(1), &c).err().unwrap();
        assert!(err.contains("10.0.0.1"), "{err}");
        let _b1 = gate.admit(&ip(2), &c).expect("another peer still gets in");
        let _b2 = gate.admit(&ip(2), &c).unwrap();
        assert!(gate.admit(&ip(3), &c).is_err(), "the total bound holds too");
        drop(a1);
        assert_eq!(gate.counts(&ip(1)), (3, 1));
        let _a3 = gate.admit(&ip(1), &c).expect("a freed slot is usable again");
    }

    #[test]
    fn a_thread_that_cannot_start_does_not_leak_its_slot() {
        fn failing(_: String, _: Box<dyn FnOnce() + Send>) -> io::Result<()> {
            Err(io::Error::from_raw_os_error(Errno::AGAIN.raw_os_error()))
        }
        let gate = Gate::new(LIMITS);
        let c = fake();
        for _ in 0..10 {
            let ticket = gate.admit(&ip(1), &c).unwrap();
            let accepted = Accepted { stream: c.clone(), peer: ip(1), idle: None };
            assert!(start_connection("test", failing, ticket, accepted, Guard::open(), Arc::new(|_| {})).is_err());
        }
        assert_eq!(gate.counts(&ip(1)), (0, 0));
    }

    #[test]
    fn accept_errors_back_off_and_an_accept_that_works_starts_over() {
        let mut b = AcceptBackoff::default();
        let emfile = io::Error::from_raw_os_error(Errno::MFILE.raw_os_error());
        let delays: Vec<u128> = (0..10).map(|_| b.on_error(&emfile).as_millis()).collect();
        assert_eq!(delays, vec![5, 10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        let aborted = io::Error::from(io::ErrorKind::ConnectionAborted);
        assert_eq!(b.on_error(&aborted), Duration::ZERO, "a reset connection is retried at once");
        b.on_success();
        assert_eq!(b.on_error(&emfile), AcceptBackoff::FIRST);
    }

    /// A listener whose first `fails` accepts fail with EMFILE (it stays "readable", like a
    /// listener with a queued connection and no descriptor left), then hands out real ones.
    struct Exhausted {
        fails: Mutex<u32>,
        calls: Arc<AtomicU64>,
        real: TcpListener,
    }
    impl AsFd for Exhausted {
        fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
            self.real.as_fd()
        }
    }
    impl Listener for Exhausted {
        type Conn = TcpStream;
        fn accept_conn(&self) -> io::Result<(TcpStream, PeerKey)> {
            self.calls.fetch_add(1, Ordering::Relaxed);
            let mut fails = self.fails.lock();
            if *fails > 0 {
                *fails -= 1;
                return Err(io::Error::from_raw_os_error(Errno::MFILE.raw_os_error()));
            }
            self.real.accept_conn()
        }
    }

    fn exhausted(fails: u32) -> (Exhausted, SocketAddr, Arc<AtomicU64>) {
        let real = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = real.local_addr().unwrap();
        let calls = Arc::new(AtomicU64::new(0));
        (Exhausted { fails: Mutex::new(fails), calls: calls.clone(), real }, addr, calls)
    }

    #[test]
    fn the_loop_waits_out_accept_errors_and_then_serves() {
        let (listener, addr, calls) = exhausted(4);
        let server = serve("test", listener, LIMITS, Guard::open(), |c: Accepted<TcpStream>| {
            use std::io::Write;
            let _ = (&*c.stream).write_all(b"hi");
        })
        .unwrap();
        let mut client = TcpStream::connect(addr).unwrap();
        client.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut buf = [0u8; 2];
        client.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"hi");
        assert_eq!(calls.load(Ordering::Relaxed), 5, "four failures, then the connection");
        drop(server);
    }

    #[test]
    fn a_listener_out_of_descriptors_is_not_spun_on() {
        let (listener, addr, calls) = exhausted(u32::MAX);
        let server = serve("test", listener, LIMITS, Guard::open(), |_: Accepted<TcpStream>| {}).unwrap();
        let _queued = TcpStream::connect(addr).unwrap();
        assert!(eventually(|| calls.load(Ordering::Relaxed) >= 1), "the loop tries");
        let before = calls.load(Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(500));
        // With the backoff (5 ms doubling) about 7 tries fit in this time (fewer on a loaded
        // machine); a loop that spins makes tens of thousands.
        let n = calls.load(Ordering::Relaxed) - before;
        assert!(n < 50, "{n} accept calls in half a second");
        drop(server);
    }

    #[test]
    fn dropping_the_server_ends_its_connections() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let server = serve("test", listener, LIMITS, Guard::open(), move |c: Accepted<TcpStream>| {
            let mut b = [0u8; 1];
            let ended = (&*c.stream).read(&mut b);
            let _ = tx.send(ended.map(|n| n == 0).unwrap_or(true));
        })
        .unwrap();
        let _client = TcpStream::connect(addr).unwrap();
        assert!(crate::net::serve::tests::eventually(|| server.connections() == 1));
        drop(server);
        assert!(rx.recv_timeout(Duration::from_secs(30)).unwrap(), "the handler's read returned");
        assert!(TcpStream::connect(addr).is_err(), "the port is closed");
    }

    #[test]
    fn a_guarded_listener_serves_only_peers_that_prove_the_secret() {
        use super::super::auth::{Auth, Keyring, Service};
        let secret = |s: &str| Auth::new(Some(Keyring::new(&[s]).unwrap()));
        let auth = secret("the cluster's secret, long enough");
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = serve("test", listener, LIMITS, auth.guard(Service::Tcp), |c: Accepted<TcpStream>| {
            use std::io::Write;
            let _ = (&*c.stream).write_all(b"served");
        })
        .unwrap();
        let read_all = |mut s: &TcpStream| {
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            let mut got = Vec::new();
            let _ = s.read_to_end(&mut got);
            got
        };
        // An outsider with a raw socket: a tcp transport request, then whatever comes back.
        let raw = TcpStream::connect(addr).unwrap();
        let _ = std::io::Write::write_all(&mut &raw, &[b'C', b'T', 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(read_all(&raw), b"", "an outsider gets nothing, not a byte of the handler's");
        // A peer with another secret.
        let wrong = TcpStream::connect(addr).unwrap();
        let err = secret("another cluster's secret, long too").dial(Service::Tcp, &mut &wrong, None).unwrap_err();
        assert!(matches!(err, super::super::AuthError::NoSharedSecret), "{err}");
        assert_eq!(read_all(&wrong), b"");
        // A peer with the secret is served.
        let good = TcpStream::connect(addr).unwrap();
        secret("the cluster's secret, long enough").dial(Service::Tcp, &mut &good, None).unwrap();
        assert_eq!(read_all(&good), b"served");
        assert_eq!((auth.stats().refused(Service::Tcp), auth.stats().accepted(Service::Tcp)), (2, 1));
        drop(server);
    }

    pub(crate) fn eventually(mut f: impl FnMut() -> bool) -> bool {
        for _ in 0..3000 {
            if f() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }
}
