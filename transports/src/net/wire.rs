//! Byte streams read and written against a deadline.
//!
//! Socket timeouts (`SO_RCVTIMEO`/`SO_SNDTIMEO`) bound one system call, so a peer that sends
//! (or accepts) a byte now and then restarts them forever. Here every call takes the
//! *deadline* of the whole operation: a socket is read and written without blocking
//! (`MSG_DONTWAIT`) and waited on with `poll` until that instant, which never moves.

use std::io::{self, IoSlice};
use std::net::TcpStream;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::io::Errno;
use rustix::net::{RecvFlags, SendAncillaryBuffer, SendFlags};

/// A connected byte stream that can be read and written against a deadline.
pub trait Wire {
    /// Receives what has arrived into `buf`, waiting until `deadline` (`None`: forever) for at
    /// least one byte. `Ok(0)`: the peer closed the stream; an error of kind
    /// [`io::ErrorKind::TimedOut`]: nothing arrived by `deadline`.
    fn recv_by(&mut self, buf: &mut [u8], deadline: Option<Instant>) -> io::Result<usize>;

    /// Sends a prefix of `bufs` (gathered), waiting until `deadline` for room; returns how many
    /// bytes went. [`io::ErrorKind::TimedOut`]: no room by `deadline`.
    fn send_by(&mut self, bufs: &[IoSlice<'_>], deadline: Option<Instant>) -> io::Result<usize>;
}

/// The error a deadline that passed is reported with.
pub fn timed_out() -> io::Error {
    io::Error::from(io::ErrorKind::TimedOut)
}

/// Waits until `fd` is ready for `flags` or `deadline` passes ([`io::ErrorKind::TimedOut`]).
/// Hang-ups and errors count as ready: the next read or write reports them.
pub fn wait_fd(fd: BorrowedFd<'_>, flags: PollFlags, deadline: Option<Instant>) -> io::Result<()> {
    loop {
        let timeout = match deadline {
            None => None,
            Some(d) => {
                let now = Instant::now();
                if now >= d {
                    return Err(timed_out());
                }
                // Round up so that a wake-up never comes just before the deadline.
                let left = (d - now) + Duration::from_micros(999);
                Some(Timespec {
                    tv_sec: left.as_secs().min(i64::MAX as u64) as i64,
                    tv_nsec: (left.subsec_millis() * 1_000_000) as _,
                })
            }
        };
        let mut fds = [PollFd::new(&fd, flags)];
        match rustix::event::poll(&mut fds, timeout.as_ref()) {
            Ok(0) => continue, // the deadline is checked at the top
            Ok(_) => return Ok(()),
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// [`Wire::recv_by`] on a socket.
pub fn recv_fd(fd: BorrowedFd<'_>, buf: &mut [u8], deadline: Option<Instant>) -> io::Result<usize> {
    loop {
        match rustix::net::recv(fd, &mut *buf, RecvFlags::DONTWAIT) {
            Ok((n, _)) => return Ok(n),
            Err(Errno::INTR) => continue,
            Err(Errno::AGAIN) => wait_fd(fd, PollFlags::IN, deadline)?,
            Err(e) => return Err(e.into()),
        }
    }
}

/// One receive that does not wait: `Ok(None)` when nothing has arrived yet.
pub fn recv_now(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<Option<usize>> {
    loop {
        match rustix::net::recv(fd, &mut *buf, RecvFlags::DONTWAIT) {
            Ok((n, _)) => return Ok(Some(n)),
            Err(Errno::INTR) => continue,
            Err(Errno::AGAIN) => return Ok(None),
            Err(e) => return Err(e.into()),
        }
    }
}

/// One gathered send that does not wait: `Ok(None)` when the socket has no room now.
pub fn send_now(fd: BorrowedFd<'_>, bufs: &[IoSlice<'_>]) -> io::Result<Option<usize>> {
    loop {
        let mut control = SendAncillaryBuffer::default();
        match rustix::net::sendmsg(fd, bufs, &mut control, SendFlags::DONTWAIT | SendFlags::NOSIGNAL) {
            Ok(n) => return Ok(Some(n)),
            Err(Errno::INTR) => continue,
            Err(Errno::AGAIN) => return Ok(None),
            Err(e) => return Err(e.into()),
        }
    }
}

/// [`Wire::send_by`] on a socket.
pub fn send_fd(fd: BorrowedFd<'_>, bufs: &[IoSlice<'_>], deadline: Option<Instant>) -> io::Result<usize> {
    loop {
        match send_now(fd, bufs)? {
            Some(n) => return Ok(n),
            None => wait_fd(fd, PollFlags::OUT, deadline)?,
        }
    }
}

macro_rules! socket_wire {
    ($($t:ty),*) => {$(
        impl Wire for $t {
            fn recv_by(&mut self, buf: &mut [u8], deadline: Option<Instant>) -> io::Result<usize> {
                recv_fd(self.as_fd(), buf, deadline)
            }
            fn send_by(&mut self, bufs: &[IoSlice<'_>], deadline: Option<Instant>) -> io::Result<usize> {
                send_fd(self.as_fd(), bufs, deadline)
            }
        }
    )*};
}
socket_wire!(TcpStream, &TcpStream, UnixStream, &UnixStream, BorrowedFd<'_>);

/// Bytes in memory read as a stream (what the parsers' tests and fuzzers feed them): all of
/// it is there at once, and its end is the peer closing.
impl Wire for &[u8] {
    fn recv_by(&mut self, buf: &mut [u8], _: Option<Instant>) -> io::Result<usize> {
        io::Read::read(self, buf)
    }
    fn send_by(&mut self, _: &[IoSlice<'_>], _: Option<Instant>) -> io::Result<usize> {
        Err(io::Error::new(io::ErrorKind::Unsupported, "a byte slice is read-only"))
    }
}

/// A buffer that collects what is sent (and reads as a closed stream).
impl Wire for Vec<u8> {
    fn recv_by(&mut self, _: &mut [u8], _: Option<Instant>) -> io::Result<usize> {
        Ok(0)
    }
    fn send_by(&mut self, bufs: &[IoSlice<'_>], _: Option<Instant>) -> io::Result<usize> {
        let n = bufs.iter().map(|b| b.len()).sum();
        for b in bufs {
            self.extend_from_slice(b);
        }
        Ok(n)
    }
}

/// Receives exactly `buf.len()` bytes by `deadline`. A close before the last byte is
/// [`io::ErrorKind::UnexpectedEof`]; the deadline passing is [`io::ErrorKind::TimedOut`].
pub fn recv_exact_by(w: &mut (impl Wire + ?Sized), buf: &mut [u8], deadline: Option<Instant>) -> io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(timed_out());
        }
        match w.recv_by(&mut buf[got..], deadline)? {
            0 => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("the connection closed after {got} of {} bytes", buf.len()),
                ))
            }
            n => got += n,
        }
    }
    Ok(())
}

/// Sends every byte of `bufs` by `deadline` (one deadline for all of it).
pub fn send_all_by(
    w: &mut (impl Wire + ?Sized),
    mut bufs: &mut [IoSlice<'_>],
    deadline: Option<Instant>,
) -> io::Result<()> {
    IoSlice::advance_slices(&mut bufs, 0);
    while !bufs.is_empty() {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(timed_out());
        }
        match w.send_by(bufs, deadline)? {
            0 => return Err(io::Error::new(io::ErrorKind::WriteZero, "the peer stopped accepting bytes")),
            n => IoSlice::advance_slices(&mut bufs, n),
        }
    }
    Ok(())
}

/// Receives and drops `len` bytes by `deadline` (the payload of a frame nobody wants),
/// keeping the stream in step.
pub fn discard_by(w: &mut (impl Wire + ?Sized), mut len: u64, deadline: Option<Instant>) -> io::Result<()> {
    let mut scratch = [0u8; 16 * 1024];
    while len > 0 {
        let n = len.min(scratch.len() as u64) as usize;
        recv_exact_by(w, &mut scratch[..n], deadline)?;
        len -= n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_stream_that_trickles_runs_into_the_deadline_of_the_whole_read() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let writer = std::thread::spawn(move || {
            // One byte per 100 ms: each read finds a byte well within any per-read timeout.
            for _ in 0..40 {
                if a.write_all(&[7]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let mut buf = [0u8; 32];
        let err = recv_exact_by(&mut b, &mut buf, Some(Instant::now() + Duration::from_millis(350))).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
        drop(b);
        writer.join().unwrap();
    }

    #[test]
    fn a_peer_that_stops_reading_runs_into_the_deadline_of_the_whole_write() {
        let (mut a, b) = UnixStream::pair().unwrap();
        let big = vec![1u8; 64 << 20];
        let err = send_all_by(&mut a, &mut [IoSlice::new(&big)], Some(Instant::now() + Duration::from_millis(200)))
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
        drop(b);
    }

    #[test]
    fn reads_and_writes_complete_and_a_close_is_reported() {
        let (mut a, mut b) = UnixStream::pair().unwrap();
        send_all_by(&mut a, &mut [IoSlice::new(b"hello"), IoSlice::new(b" world")], None).unwrap();
        let mut buf = [0u8; 11];
        recv_exact_by(&mut b, &mut buf, None).unwrap();
        assert_eq!(&buf, b"hello world");
        drop(a);
        assert_eq!(recv_exact_by(&mut b, &mut buf, None).unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
    }
}
