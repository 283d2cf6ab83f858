//! The shm transport's control socket: a unix `SOCK_SEQPACKET` socket in the abstract
//! namespace (which, like a tcp port, belongs to one network namespace), carrying one
//! [`Frame`] per message and, with a memory grant, the memfd as `SCM_RIGHTS`.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use rustix::net::{
    self, AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, Shutdown, SocketAddrUnix, SocketFlags, SocketType, UCred,
};

use super::wire::{Frame, WireError, FRAME_LEN};
use crate::net::serve::{Connection, Listener, PeerKey};
use crate::net::wire::wait_fd;

/// Longest abstract socket name accepted (the kernel allows 107 bytes).
pub const MAX_NAME_LEN: usize = 100;

/// What went wrong receiving a frame.
#[derive(Debug, thiserror::Error)]
pub enum RecvError {
    /// The socket failed, or the receive timed out.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The message is not a valid control frame.
    #[error("{0}")]
    Wire(#[from] WireError),
    /// A frame of this kind came with this many descriptors: only a `MapReply` granting a
    /// memfd or a VMM allocation carries one, and it carries exactly one ([`Frame::carries_fd`]).
    #[error("a {0:?} frame came with {1} file descriptor(s)")]
    Fds(super::wire::Kind, usize),
    /// The message or its descriptors did not fit the receive buffers (`MSG_TRUNC` or
    /// `MSG_CTRUNC`): the peer sent more than one frame's worth.
    #[error("a control message was truncated")]
    Truncated,
}

/// One end of a control connection, or the listening socket: frames are sent and received
/// whole, one per message, with at most one descriptor alongside.
#[derive(Debug)]
pub struct Socket {
    fd: OwnedFd,
}

fn address(name: &str) -> io::Result<SocketAddrUnix> {
    if name.is_empty() || name.len() > MAX_NAME_LEN || name.contains('\0') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?} is not a valid shm socket name (1..={MAX_NAME_LEN} bytes, no NUL)"),
        ));
    }
    Ok(SocketAddrUnix::new_abstract_name(name.as_bytes())?)
}

fn new_socket() -> io::Result<OwnedFd> {
    Ok(net::socket_with(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)?)
}

impl Socket {
    /// Listens on the abstract name `name`.
    pub fn listen(name: &str) -> io::Result<Socket> {
        let addr = address(name)?;
        let fd = new_socket()?;
        net::bind(&fd, &addr)?;
        net::listen(&fd, 128)?;
        Ok(Socket { fd })
    }

    /// Accepts a connection on a listening socket, waiting for one if none is pending.
    pub fn accept(&self) -> io::Result<Socket> {
        let fd = net::accept_with(&self.fd, SocketFlags::CLOEXEC)?;
        Ok(Socket { fd })
    }

    /// Connects to the abstract name `name`; `timeout` bounds the connect and every send.
    pub fn connect(name: &str, timeout: Duration) -> io::Result<Socket> {
        let addr = address(name)?;
        let socket = Socket { fd: new_socket()? };
        socket.set_send_timeout(timeout)?;
        net::connect(&socket.fd, &addr)?;
        Ok(socket)
    }

    /// Bounds how long a send (and a connect) may block on a peer that does not read.
    pub fn set_send_timeout(&self, timeout: Duration) -> io::Result<()> {
        net::sockopt::set_socket_timeout(&self.fd, net::sockopt::Timeout::Send, Some(timeout))?;
        Ok(())
    }

    /// Bounds how long a receive may block (`None`: forever).
    pub fn set_recv_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        net::sockopt::set_socket_timeout(&self.fd, net::sockopt::Timeout::Recv, timeout)?;
        Ok(())
    }

    /// The peer's pid and uid, as the kernel saw them when it connected.
    pub fn peer_cred(&self) -> io::Result<UCred> {
        Ok(net::sockopt::socket_peercred(&self.fd)?)
    }

    /// Sends one frame, with `fd` attached if given.
    pub fn send(&self, frame: &Frame, fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
        let bytes = frame.encode();
        let iov = [IoSlice::new(&bytes)];
        let fds: Vec<BorrowedFd<'_>> = fd.into_iter().collect();
        let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(&fds)) {
            return Err(io::Error::other("no room for a file descriptor"));
        }
        loop {
            match net::sendmsg(&self.fd, &iov, &mut control, SendFlags::NOSIGNAL) {
                Ok(n) if n == FRAME_LEN => return Ok(()),
                Ok(n) => return Err(io::Error::other(format!("sent {n} of {FRAME_LEN} bytes"))),
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Receives one frame and the descriptor that came with it; `None` when the peer closed
    /// the connection. A frame with a missing or an unexpected descriptor is an error (and an
    /// unexpected descriptor is closed).
    pub fn recv(&self) -> Result<Option<(Frame, Option<OwnedFd>)>, RecvError> {
        self.recv_by(None)
    }

    /// [`Socket::recv`], waiting until `deadline` at most (an error of kind
    /// [`io::ErrorKind::TimedOut`] then); with no deadline, as long as the socket's receive
    /// timeout says. A frame is one message: it comes whole or not at all.
    pub fn recv_by(&self, deadline: Option<Instant>) -> Result<Option<(Frame, Option<OwnedFd>)>, RecvError> {
        // One byte more than a frame, to see a longer message as such and not as a frame.
        let mut bytes = [0u8; FRAME_LEN + 1];
        let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(2))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let flags = match deadline {
            Some(_) => RecvFlags::CMSG_CLOEXEC | RecvFlags::DONTWAIT,
            None => RecvFlags::CMSG_CLOEXEC,
        };
        let msg = loop {
            let mut iov = [IoSliceMut::new(&mut bytes)];
            match net::recvmsg(&self.fd, &mut iov, &mut control, flags) {
                Ok(msg) => break msg,
                Err(rustix::io::Errno::INTR) => continue,
                Err(rustix::io::Errno::AGAIN) => wait_fd(self.fd.as_fd(), rustix::event::PollFlags::IN, deadline)?,
                Err(e) => return Err(RecvError::Io(e.into())),
            }
        };
        let mut fds: Vec<OwnedFd> = Vec::new();
        for message in control.drain() {
            if let RecvAncillaryMessage::ScmRights(received) = message {
                fds.extend(received);
            }
        }
        if msg.flags.intersects(ReturnFlags::CTRUNC | ReturnFlags::TRUNC) {
            return Err(RecvError::Truncated);
        }
        if msg.bytes == 0 && fds.is_empty() {
            return Ok(None);
        }
        let frame = Frame::decode(&bytes[..msg.bytes])?;
        let expected = usize::from(frame.carries_fd());
        if fds.len() != expected {
            return Err(RecvError::Fds(frame.kind, fds.len()));
        }
        Ok(Some((frame, fds.pop())))
    }

    /// Ends the connection both ways; a thread blocked in `recv` returns.
    pub fn shutdown(&self) {
        let _ = net::shutdown(&self.fd, Shutdown::Both);
    }
}

/// The shm listener on the net layer's accept loop: a peer is a process, as the kernel
/// tells it (`SO_PEERCRED`).
impl Listener for Socket {
    type Conn = Socket;
    fn accept_conn(&self) -> io::Result<(Socket, PeerKey)> {
        let socket = self.accept()?;
        let peer = match socket.peer_cred() {
            Ok(c) => PeerKey::Process { pid: c.pid.as_raw_nonzero().get(), uid: c.uid.as_raw() },
            Err(_) => PeerKey::Unknown,
        };
        Ok((socket, peer))
    }
}

impl Connection for Socket {
    fn shutdown(&self) {
        Socket::shutdown(self);
    }
}

impl AsFd for Socket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::wire::{Kind, Mode};
    use crate::SharedMemory;

    fn pair() -> (Socket, Socket) {
        let (a, b) = net::socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None).unwrap();
        (Socket { fd: a }, Socket { fd: b })
    }

    #[test]
    fn frames_and_descriptors_cross() {
        let (a, b) = pair();
        let mem = SharedMemory::allocate(4096, "crescent-test").unwrap();
        let grant =
            Frame { mode: Mode::Memfd, id: 1, addr: mem.addr(), len: 4096, region: 2, ..Frame::new(Kind::MapReply) };
        a.send(&grant, Some(mem.fd())).unwrap();
        let (frame, fd) = b.recv().unwrap().unwrap();
        assert_eq!(frame, grant);
        assert!(fd.is_some());
        a.send(&Frame::new(Kind::Hello), None).unwrap();
        let (frame, fd) = b.recv().unwrap().unwrap();
        assert_eq!(frame.kind, Kind::Hello);
        assert!(fd.is_none());
        drop(a);
        assert!(b.recv().unwrap().is_none(), "a closed peer reads as None");
    }

    #[test]
    fn unexpected_or_missing_descriptors_are_refused() {
        let (a, b) = pair();
        let mem = SharedMemory::allocate(4096, "crescent-test").unwrap();
        a.send(&Frame::new(Kind::Hello), Some(mem.fd())).unwrap();
        assert!(matches!(b.recv(), Err(RecvError::Fds(Kind::Hello, 1))));
        let grant = Frame { mode: Mode::Memfd, addr: 0x1000, len: 1, ..Frame::new(Kind::MapReply) };
        a.send(&grant, None).unwrap();
        assert!(matches!(b.recv(), Err(RecvError::Fds(Kind::MapReply, 0))));
    }

    #[test]
    fn garbage_messages_are_refused() {
        let (a, b) = pair();
        for garbage in [&[0u8; 3][..], &[7u8; FRAME_LEN][..], &[0u8; 200][..]] {
            net::send(&a, garbage, SendFlags::NOSIGNAL).unwrap();
            assert!(b.recv().is_err(), "{} bytes", garbage.len());
        }
    }

    #[test]
    fn names_are_checked() {
        assert!(Socket::listen("").is_err());
        assert!(Socket::listen(&"x".repeat(MAX_NAME_LEN + 1)).is_err());
        assert!(Socket::connect("a\0b", Duration::from_secs(1)).is_err());
    }
}
