//! The standalone wire's framing: a unix stream socket carrying length-prefixed frames, each a
//! small message, a payload of bulk bytes beside it (never serialized), and at most one file
//! descriptor (`SCM_RIGHTS`, a memfd being shared).
//!
//! ```text
//! | magic u32 | message length u32 | payload length u32 | message | payload |
//! ```
//!
//! Both lengths are checked against the caps before anything is allocated; every send and
//! receive has a deadline (a frame that starts arriving must finish arriving in time), so a
//! peer that stops mid-frame costs a bounded wait, never a hang.
//!
//! The standalone client accepts on the transports' one accept loop
//! ([`crescent_transports::net::serve()`]: bounded connections in total and per process,
//! backoff, clean shutdown), as the shm transport's control socket does. The framing is its
//! own for the same reason as shm's: a frame may carry a descriptor (`SCM_RIGHTS`), which the
//! net layer's codec (plain reads and writes) cannot; it moves there once the codec can.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use rustix::net::{
    self, AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, Shutdown, SocketAddrUnix, SocketFlags, SocketType, UCred,
};

/// Marks a frame of this protocol (and its version): `"CRS"` and 1.
const MAGIC: u32 = u32::from_le_bytes(*b"CRS\x01");
const HEADER: usize = 12;
/// Bytes after the header taken with it in a frame's first read.
const EARLY: usize = 4096;

/// Largest message (keys, piece lists): a batch of many thousand keys fits.
pub const MAX_MESSAGE: usize = 16 << 20;
/// Largest payload (the bytes of `put`/`get` values given or returned as bytes). Larger
/// values go through shared memory (`put_from`/`get_into`).
pub const MAX_PAYLOAD: usize = 256 << 20;

/// One frame.
#[derive(Debug, Default)]
pub struct Frame {
    /// The encoded call or reply ([`super::wire`]), at most [`MAX_MESSAGE`] bytes.
    pub message: Vec<u8>,
    /// A byte value given or returned with it, at most [`MAX_PAYLOAD`] bytes (often empty).
    pub payload: Vec<u8>,
    /// A descriptor passed alongside (`SCM_RIGHTS`): a memfd the dummy client shares.
    pub fd: Option<OwnedFd>,
}

/// Why a frame could not be received.
#[derive(Debug, thiserror::Error)]
pub enum RecvError {
    /// The socket failed or the deadline passed (`TimedOut`/`WouldBlock`).
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The peer closed the connection between frames.
    #[error("the peer closed the connection")]
    Closed,
    /// The peer sent something that is not a frame of this protocol.
    #[error("{0}")]
    Bad(String),
}

/// Where a standalone client listens: a path, or a name in the abstract namespace (`@name`,
/// which, like a tcp port, belongs to the network namespace).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    /// A socket file at this path (1..=100 bytes).
    Path(std::path::PathBuf),
    /// This name in the abstract namespace (written `@name`; 1..=100 bytes).
    Abstract(String),
}

impl Address {
    /// `@name` (abstract) or a path.
    pub fn parse(s: &str) -> io::Result<Address> {
        let bad = |why: &str| io::Error::new(io::ErrorKind::InvalidInput, format!("{s:?}: {why}"));
        if let Some(name) = s.strip_prefix('@') {
            if name.is_empty() || name.len() > 100 || name.contains('\0') {
                return Err(bad("an abstract socket name takes 1..=100 bytes, no NUL"));
            }
            return Ok(Address::Abstract(name.to_string()));
        }
        if s.is_empty() || s.len() > 100 || s.contains('\0') {
            return Err(bad("a socket path takes 1..=100 bytes, no NUL"));
        }
        Ok(Address::Path(s.into()))
    }

    fn sockaddr(&self) -> io::Result<SocketAddrUnix> {
        Ok(match self {
            Address::Path(p) => SocketAddrUnix::new(p.as_path())?,
            Address::Abstract(n) => SocketAddrUnix::new_abstract_name(n.as_bytes())?,
        })
    }
}

impl std::fmt::Display for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Address::Path(p) => write!(f, "{}", p.display()),
            Address::Abstract(n) => write!(f, "@{n}"),
        }
    }
}

/// A listening socket.
#[derive(Debug)]
pub struct Listener {
    fd: OwnedFd,
    address: Address,
}

impl Listener {
    /// Listens at `address`. A path left behind by a dead listener is replaced; a path a
    /// live listener holds is refused (`AddrInUse`).
    pub fn bind(address: &Address) -> io::Result<Listener> {
        let fd = new_socket()?;
        if let Address::Path(p) = address {
            if p.exists() && Conn::connect(address, Duration::from_secs(1)).is_err() {
                std::fs::remove_file(p)?;
            }
        }
        net::bind(&fd, &address.sockaddr()?)?;
        net::listen(&fd, 128)?;
        Ok(Listener { fd, address: address.clone() })
    }

    /// Where it listens.
    pub fn address(&self) -> &Address {
        &self.address
    }

    /// The next connection, and its peer's credentials as the kernel saw them.
    pub fn accept(&self) -> io::Result<(Conn, UCred)> {
        let fd = net::accept_with(&self.fd, SocketFlags::CLOEXEC)?;
        let conn = Conn { fd };
        let cred = net::sockopt::socket_peercred(&conn.fd)?;
        Ok((conn, cred))
    }
}

/// On the net layer's accept loop: a peer is a process, as the kernel tells it.
impl crescent_transports::net::serve::Listener for Listener {
    type Conn = Conn;
    fn accept_conn(&self) -> io::Result<(Conn, crescent_transports::net::PeerKey)> {
        let (conn, cred) = self.accept()?;
        let peer =
            crescent_transports::net::PeerKey::Process { pid: cred.pid.as_raw_nonzero().get(), uid: cred.uid.as_raw() };
        Ok((conn, peer))
    }
}

impl AsFd for Listener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl crescent_transports::net::serve::Connection for Conn {
    fn shutdown(&self) {
        Conn::shutdown(self);
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Address::Path(p) = &self.address {
            let _ = std::fs::remove_file(p);
        }
    }
}

fn new_socket() -> io::Result<OwnedFd> {
    Ok(net::socket_with(AddressFamily::UNIX, SocketType::STREAM, SocketFlags::CLOEXEC, None)?)
}
/// How frames were taken on one side of the wire: while polling, or after blocking (see
/// [`Conn::recv_polling`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PollCounts {
    /// Frames that arrived while the receiver polled.
    pub polled: u64,
    /// Frames the receiver blocked for.
    pub waited: u64,
}

/// [`PollCounts`] kept by threads as they take frames.
#[derive(Debug, Default)]
pub struct PollCounter {
    polled: std::sync::atomic::AtomicU64,
    waited: std::sync::atomic::AtomicU64,
}

impl PollCounter {
    /// Counts one frame, taken while polling or not.
    pub fn count(&self, polled: bool) {
        let counter = if polled { &self.polled } else { &self.waited };
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// The counts so far.
    pub fn get(&self) -> PollCounts {
        use std::sync::atomic::Ordering::Relaxed;
        PollCounts { polled: self.polled.load(Relaxed), waited: self.waited.load(Relaxed) }
    }
}

/// One connection.
#[derive(Debug)]
pub struct Conn {
    fd: OwnedFd,
}

/// What is left of a deadline, at least a millisecond (a zero socket timeout means none).
fn left(deadline: Instant) -> io::Result<Duration> {
    let now = Instant::now();
    if now >= deadline {
        return Err(io::Error::new(io::ErrorKind::TimedOut, "deadline passed"));
    }
    Ok((deadline - now).max(Duration::from_millis(1)))
}

impl Conn {
    /// Connects to `address` within `timeout`.
    pub fn connect(address: &Address, timeout: Duration) -> io::Result<Conn> {
        let conn = Conn { fd: new_socket()? };
        net::sockopt::set_socket_timeout(&conn.fd, net::sockopt::Timeout::Send, Some(timeout))?;
        net::connect(&conn.fd, &address.sockaddr()?)?;
        Ok(conn)
    }

    /// True when the peer closed the connection or sent something unasked (a connection
    /// that waits in a pool expects nothing): it must not be used.
    pub fn is_stale(&self) -> bool {
        let mut fds = [rustix::event::PollFd::new(&self.fd, rustix::event::PollFlags::IN)];
        let zero = rustix::event::Timespec { tv_sec: 0, tv_nsec: 0 };
        !matches!(rustix::event::poll(&mut fds, Some(&zero)), Ok(0))
    }

    /// Sends one frame (its payload given as slices written one after another), with `fd`
    /// attached, by `deadline`.
    pub fn send(
        &self,
        message: &[u8],
        payload: &[&[u8]],
        fd: Option<BorrowedFd<'_>>,
        deadline: Instant,
    ) -> io::Result<()> {
        let payload_len: usize = payload.iter().map(|p| p.len()).sum();
        if message.len() > MAX_MESSAGE || payload_len > MAX_PAYLOAD {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "a frame of {} message and {payload_len} payload bytes is over the limits ({MAX_MESSAGE} and \
                     {MAX_PAYLOAD})",
                    message.len()
                ),
            ));
        }
        let mut header = [0u8; HEADER];
        header[..4].copy_from_slice(&MAGIC.to_le_bytes());
        header[4..8].copy_from_slice(&(message.len() as u32).to_le_bytes());
        header[8..].copy_from_slice(&(payload_len as u32).to_le_bytes());
        let mut parts: Vec<&[u8]> = Vec::with_capacity(2 + payload.len());
        parts.push(&header);
        parts.push(message);
        parts.extend(payload.iter().copied().filter(|p| !p.is_empty()));
        let total = HEADER + message.len() + payload_len;
        let mut sent = 0usize;
        let mut fd = fd;
        // The first attempt does not wait (a call's frame usually fits the socket's buffer
        // at once); only when the socket is full does the send wait, by the deadline.
        let mut wait = false;
        while sent < total {
            let flags = if wait {
                net::sockopt::set_socket_timeout(&self.fd, net::sockopt::Timeout::Send, Some(left(deadline)?))?;
                SendFlags::NOSIGNAL
            } else {
                SendFlags::NOSIGNAL | SendFlags::DONTWAIT
            };
            // The parts not yet (fully) sent.
            let mut skip = sent;
            let mut iov = Vec::with_capacity(parts.len());
            for p in &parts {
                if skip >= p.len() {
                    skip -= p.len();
                    continue;
                }
                iov.push(IoSlice::new(&p[skip..]));
                skip = 0;
            }
            let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
            let mut control = SendAncillaryBuffer::new(&mut space);
            let fds: Vec<BorrowedFd<'_>> = fd.take().into_iter().collect();
            if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(&fds)) {
                return Err(io::Error::other("no room for a file descriptor"));
            }
            match net::sendmsg(&self.fd, &iov, &mut control, flags) {
                Ok(0) => return Err(io::Error::new(io::ErrorKind::WriteZero, "the peer takes no more bytes")),
                Ok(n) => {
                    sent += n;
                    wait = true;
                }
                Err(rustix::io::Errno::INTR | rustix::io::Errno::AGAIN) if sent == 0 && !wait => {
                    fd = fds.first().copied();
                    wait = true;
                }
                Err(rustix::io::Errno::INTR) if sent == 0 => fd = fds.first().copied(),
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Receives one frame. `first`: how long to wait for it to start (`None`: as long as it
    /// takes, for a server between calls); once it started, the rest must arrive by `rest`
    /// from then (or by `first`'s deadline, whichever is later).
    pub fn recv(&self, first: Option<Instant>, rest: Duration) -> Result<Frame, RecvError> {
        self.recv_polling(first, rest, Duration::ZERO).map(|(frame, _)| frame)
    }

    /// [`Self::recv`], polling the socket for up to `poll` (and no later than `first`) before
    /// it blocks: a frame that starts arriving meanwhile is taken with no thread wake-up,
    /// which on a virtual machine costs tens of µs. Polling yields the CPU between its
    /// non-blocking reads, so the threads doing the work it waits for keep running. Also
    /// says whether the frame was taken while polling.
    pub fn recv_polling(
        &self,
        first: Option<Instant>,
        rest: Duration,
        poll: Duration,
    ) -> Result<(Frame, bool), RecvError> {
        // The header and the start of the frame in one read (a call's message is small, so
        // it usually arrives whole with it: one system call per frame, not one per part).
        // The peer sends nothing more before this side answers, so whatever arrives beyond
        // this frame's end breaks the protocol.
        let mut head = [0u8; HEADER + EARLY];
        let mut fds = Vec::new();
        let mut polled = None;
        if !poll.is_zero() {
            let start = Instant::now();
            let until = first.map_or(start + poll, |f| f.min(start + poll));
            loop {
                if let Some(n) = self.read_now(&mut head, &mut fds, true)? {
                    polled = Some(n);
                    break;
                }
                if Instant::now() >= until {
                    break;
                }
                std::thread::yield_now();
            }
        }
        let taken_polling = polled.is_some();
        let mut got = match polled {
            Some(n) => n,
            None => self.read(&mut head, first, &mut fds, true)?,
        };
        if got == 0 {
            return Err(RecvError::Closed);
        }
        let deadline = first.map_or_else(|| Instant::now() + rest, |f| f.max(Instant::now() + rest));
        while got < HEADER {
            got += self.read(&mut head[got..], Some(deadline), &mut fds, false)?;
        }
        let magic = u32::from_le_bytes(head[..4].try_into().expect("4 bytes"));
        if magic != MAGIC {
            return Err(RecvError::Bad(format!("not a frame of this protocol (magic {magic:#010x})")));
        }
        let message_len = u32::from_le_bytes(head[4..8].try_into().expect("4 bytes")) as usize;
        let payload_len = u32::from_le_bytes(head[8..HEADER].try_into().expect("4 bytes")) as usize;
        if message_len > MAX_MESSAGE || payload_len > MAX_PAYLOAD {
            return Err(RecvError::Bad(format!(
                "a frame of {message_len} message and {payload_len} payload bytes is over the limits \
                 ({MAX_MESSAGE} and {MAX_PAYLOAD})"
            )));
        }
        let early = &head[HEADER..got];
        if early.len() > message_len + payload_len {
            return Err(RecvError::Bad("a frame arrived before the answer to the previous one".into()));
        }
        let (early_message, early_payload) = early.split_at(early.len().min(message_len));
        let mut message = vec![0u8; message_len];
        message[..early_message.len()].copy_from_slice(early_message);
        self.read_exact(&mut message[early_message.len()..], deadline, &mut fds)?;
        let mut payload = vec![0u8; payload_len];
        payload[..early_payload.len()].copy_from_slice(early_payload);
        self.read_exact(&mut payload[early_payload.len()..], deadline, &mut fds)?;
        if fds.len() > 1 {
            return Err(RecvError::Bad(format!("a frame came with {} file descriptors (at most 1)", fds.len())));
        }
        Ok((Frame { message, payload, fd: fds.pop() }, taken_polling))
    }

    fn read_exact(&self, buf: &mut [u8], deadline: Instant, fds: &mut Vec<OwnedFd>) -> Result<(), RecvError> {
        let mut got = 0;
        while got < buf.len() {
            got += self.read(&mut buf[got..], Some(deadline), fds, false)?;
        }
        Ok(())
    }

    /// One `recvmsg` into `buf`, waiting until `deadline` (`None`: forever); 0 only when
    /// `may_close` (between frames) and the peer closed.
    fn read(
        &self,
        buf: &mut [u8],
        deadline: Option<Instant>,
        fds: &mut Vec<OwnedFd>,
        may_close: bool,
    ) -> Result<usize, RecvError> {
        let timeout = deadline.map(left).transpose()?;
        net::sockopt::set_socket_timeout(&self.fd, net::sockopt::Timeout::Recv, timeout).map_err(io::Error::from)?;
        self.recvmsg(buf, RecvFlags::empty(), fds, may_close)?
            .ok_or_else(|| RecvError::Io(io::Error::new(io::ErrorKind::TimedOut, "deadline passed")))
    }

    /// One `recvmsg` into `buf` that does not wait: `None` when nothing has arrived.
    fn read_now(&self, buf: &mut [u8], fds: &mut Vec<OwnedFd>, may_close: bool) -> Result<Option<usize>, RecvError> {
        self.recvmsg(buf, RecvFlags::DONTWAIT, fds, may_close)
    }

    /// One `recvmsg` into `buf` with `flags`, its descriptors added to `fds`; `None` when it
    /// would block (or its socket timeout passed).
    fn recvmsg(
        &self,
        buf: &mut [u8],
        flags: RecvFlags,
        fds: &mut Vec<OwnedFd>,
        may_close: bool,
    ) -> Result<Option<usize>, RecvError> {
        let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(2))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let msg = loop {
            let mut iov = [IoSliceMut::new(buf)];
            match net::recvmsg(&self.fd, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC | flags) {
                Ok(msg) => break msg,
                Err(rustix::io::Errno::INTR) => continue,
                Err(rustix::io::Errno::AGAIN) => return Ok(None),
                Err(e) => return Err(RecvError::Io(e.into())),
            }
        };
        for message in control.drain() {
            if let RecvAncillaryMessage::ScmRights(received) = message {
                fds.extend(received);
            }
        }
        if msg.flags.contains(ReturnFlags::CTRUNC) {
            return Err(RecvError::Bad("file descriptors were truncated (more than one sent)".into()));
        }
        if msg.bytes == 0 {
            return if may_close {
                Ok(Some(0))
            } else {
                Err(RecvError::Io(io::Error::new(io::ErrorKind::UnexpectedEof, "the peer closed mid-frame")))
            };
        }
        Ok(Some(msg.bytes))
    }

    /// Ends the connection both ways; a thread blocked receiving on it returns.
    pub fn shutdown(&self) {
        let _ = net::shutdown(&self.fd, Shutdown::Both);
    }
}

impl AsFd for Conn {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// The default abstract name of the standalone client serving port `port`.
pub fn default_address(port: u16) -> Address {
    Address::Abstract(format!("crescent_client_{port}.sock"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (Conn, Conn) {
        let (a, b) = net::socketpair(AddressFamily::UNIX, SocketType::STREAM, SocketFlags::CLOEXEC, None).unwrap();
        (Conn { fd: a }, Conn { fd: b })
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(5)
    }

    #[test]
    fn frames_with_payloads_and_descriptors_cross() {
        let (a, b) = pair();
        let mem = crescent_transports::SharedMemory::allocate(4096, "crescent-test").unwrap();
        a.send(b"hello", &[b"ab", b"", b"cd"], Some(mem.fd()), soon()).unwrap();
        let f = b.recv(Some(soon()), Duration::from_secs(1)).unwrap();
        assert_eq!((&f.message[..], &f.payload[..]), (&b"hello"[..], &b"abcd"[..]));
        assert!(f.fd.is_some());
        // A large payload crosses in several writes (the reader drains meanwhile).
        let big = vec![7u8; 8 << 20];
        let reader = std::thread::spawn(move || b.recv(Some(soon()), Duration::from_secs(5)).map(|f| f.payload));
        a.send(b"", &[&big], None, soon()).unwrap();
        assert_eq!(reader.join().unwrap().unwrap(), big);
    }

    #[test]
    fn the_bytes_read_with_the_header_go_to_the_message_and_the_payload_they_belong_to() {
        let (a, b) = pair();
        // Message and payload both start in the frame's first read, and the message is longer
        // than that read takes: each part gets exactly its bytes.
        for (message_len, payload_len) in [(10, 20), (EARLY - 3, 40), (EARLY + 100, 5), (0, EARLY * 2)] {
            let message: Vec<u8> = (0..message_len).map(|i| (i % 251) as u8).collect();
            let payload: Vec<u8> = (0..payload_len).map(|i| (i % 241) as u8 ^ 0x5a).collect();
            a.send(&message, &[&payload], None, soon()).unwrap();
            let f = b.recv(Some(soon()), Duration::from_secs(1)).unwrap();
            assert_eq!((f.message, f.payload), (message, payload), "{message_len} + {payload_len}");
        }
        // A second frame sent before the first was answered breaks the protocol: it is told,
        // not taken as part of the first.
        a.send(b"one", &[], None, soon()).unwrap();
        a.send(b"two", &[], None, soon()).unwrap();
        assert!(matches!(b.recv(Some(soon()), Duration::from_secs(1)), Err(RecvError::Bad(_))));
    }

    #[test]
    fn a_closed_peer_reads_as_closed_and_a_silent_one_as_a_timeout() {
        let (a, b) = pair();
        let t = Instant::now();
        let e = b.recv(Some(Instant::now() + Duration::from_millis(100)), Duration::from_millis(100)).unwrap_err();
        assert!(matches!(&e, RecvError::Io(io) if io.kind() == io::ErrorKind::TimedOut), "{e:?}");
        assert!(t.elapsed() < Duration::from_secs(5));
        // Half a frame, then silence: the rest has its own deadline.
        net::send(&a.fd, &MAGIC.to_le_bytes(), SendFlags::NOSIGNAL).unwrap();
        let e = b.recv(None, Duration::from_millis(100)).unwrap_err();
        assert!(matches!(&e, RecvError::Io(io) if io.kind() == io::ErrorKind::TimedOut), "{e:?}");
        drop(a);
        assert!(matches!(b.recv(None, Duration::from_secs(1)), Err(RecvError::Closed)));
    }

    #[test]
    fn polling_takes_a_frame_that_is_there_without_blocking_and_stops_at_a_close_or_the_deadline() {
        let (a, b) = pair();
        let mem = crescent_transports::SharedMemory::allocate(4096, "crescent-test").unwrap();
        // Already there: taken by polling, whole (payload and descriptor too).
        a.send(b"call", &[b"xy"], Some(mem.fd()), soon()).unwrap();
        let (f, polled) = b.recv_polling(Some(soon()), Duration::from_secs(1), Duration::from_secs(5)).unwrap();
        assert!(polled);
        assert_eq!((&f.message[..], &f.payload[..], f.fd.is_some()), (&b"call"[..], &b"xy"[..], true));
        // Without polling, the same frame is taken by a blocking read.
        a.send(b"call", &[], None, soon()).unwrap();
        let (f, polled) = b.recv_polling(Some(soon()), Duration::from_secs(1), Duration::ZERO).unwrap();
        assert!(!polled);
        assert_eq!(f.message, b"call");
        // A frame sent after the poll ended still arrives (the reader blocks for it).
        let reader = std::thread::spawn(move || {
            let r = b.recv_polling(None, Duration::from_secs(5), Duration::from_micros(1)).map(|(f, _)| f.message);
            (b, r)
        });
        std::thread::sleep(Duration::from_millis(20));
        a.send(b"late", &[], None, soon()).unwrap();
        let (b, r) = reader.join().unwrap();
        assert_eq!(r.unwrap(), b"late");
        // The first deadline bounds the poll; a closed peer ends it.
        let e =
            b.recv_polling(Some(Instant::now() + Duration::from_millis(20)), Duration::ZERO, Duration::from_secs(600));
        assert!(matches!(&e, Err(RecvError::Io(io)) if io.kind() == io::ErrorKind::TimedOut), "{e:?}");
        drop(a);
        assert!(matches!(
            b.recv_polling(None, Duration::from_secs(1), Duration::from_secs(600)),
            Err(RecvError::Closed)
        ));
    }

    #[test]
    fn oversized_or_foreign_frames_are_refused_before_allocating() {
        let (a, b) = pair();
        let mut header = [0u8; HEADER];
        header[..4].copy_from_slice(&MAGIC.to_le_bytes());
        header[4..8].copy_from_slice(&(MAX_MESSAGE as u32 + 1).to_le_bytes());
        net::send(&a.fd, &header, SendFlags::NOSIGNAL).unwrap();
        let e = b.recv(Some(soon()), Duration::from_secs(1)).unwrap_err();
        assert!(matches!(&e, RecvError::Bad(m) if m.contains("over the limits")), "{e:?}");
        net::send(&a.fd, b"GET / HTTP/1.1\r\n", SendFlags::NOSIGNAL).unwrap();
        let e = b.recv(Some(soon()), Duration::from_secs(1)).unwrap_err();
        assert!(matches!(&e, RecvError::Bad(m) if m.contains("magic")), "{e:?}");
        let too_big = vec![0u8; MAX_PAYLOAD + 1];
        assert_eq!(a.send(b"", &[&too_big], None, soon()).unwrap_err().kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn addresses_parse_and_listeners_serve() {
        assert_eq!(Address::parse("@x").unwrap(), Address::Abstract("x".into()));
        assert!(Address::parse("@").is_err() && Address::parse("").is_err());
        let dir = tempfile::tempdir().unwrap();
        let addr = Address::parse(dir.path().join("s.sock").to_str().unwrap()).unwrap();
        let l = Listener::bind(&addr).unwrap();
        let c = Conn::connect(&addr, Duration::from_secs(1)).unwrap();
        let (s, cred) = l.accept().unwrap();
        assert_eq!(cred.pid.as_raw_nonzero().get() as u32, std::process::id());
        c.send(b"x", &[], None, soon()).unwrap();
        assert_eq!(s.recv(Some(soon()), Duration::from_secs(1)).unwrap().message, b"x");
        assert!(!c.is_stale());
        drop(s);
        assert!(c.is_stale(), "a closed peer makes a pooled connection stale");
        assert!(Listener::bind(&addr).is_err(), "a live listener keeps its path");
        drop(l);
        assert!(!addr.to_string().is_empty());
    }
}
