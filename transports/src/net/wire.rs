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

/// Bytes received from a socket ahead of the frame being parsed: one receive brings in as many
/// small frames (headers, acknowledgements) as have arrived, up to its capacity, instead of one
/// receive per frame; and a payload's last part and the next frame's start come in the same
/// receive ([`RecvBuf::recv_payload_now`]).
pub struct RecvBuf {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
}

impl RecvBuf {
    /// An empty buffer of `capacity` bytes (at least one frame header).
    pub fn new(capacity: usize) -> Self {
        RecvBuf { buf: vec![0u8; capacity.max(1)].into_boxed_slice(), start: 0, end: 0 }
    }

    /// The bytes received and not consumed yet.
    pub fn buffered(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    /// Drops the first `n` buffered bytes (at most all of them).
    pub fn consume(&mut self, n: usize) {
        self.start = (self.start + n).min(self.end);
        if self.start == self.end {
            (self.start, self.end) = (0, 0);
        }
    }

    /// Room for at least `want` more bytes after what is buffered (moving it to the front).
    fn make_room(&mut self, want: usize) {
        if self.buf.len() - self.end < want.min(self.buf.len() - (self.end - self.start)) {
            self.buf.copy_within(self.start..self.end, 0);
            (self.start, self.end) = (0, self.end - self.start);
        }
    }

    /// One receive that does not wait into the free space: `Ok(None)` when nothing has
    /// arrived, `Ok(Some(0))` when the peer closed the stream (or the buffer is full).
    pub fn recv_now(&mut self, fd: BorrowedFd<'_>) -> io::Result<Option<usize>> {
        self.make_room(self.buf.len());
        let n = recv_now(fd, &mut self.buf[self.end..])?;
        if let Some(n) = n {
            self.end += n;
        }
        Ok(n)
    }

    /// One receive into the free space, waiting until `deadline` for at least one byte.
    /// `Ok(0)`: the peer closed the stream; [`io::ErrorKind::TimedOut`]: nothing by `deadline`.
    pub fn recv_by(&mut self, fd: BorrowedFd<'_>, deadline: Option<Instant>) -> io::Result<usize> {
        loop {
            match self.recv_now(fd)? {
                Some(n) => return Ok(n),
                None => wait_fd(fd, PollFlags::IN, deadline)?,
            }
        }
    }

    /// Receives until at least `n` bytes (at most the capacity) are buffered, by `deadline`.
    /// A close before is [`io::ErrorKind::UnexpectedEof`].
    pub fn fill_by(&mut self, fd: BorrowedFd<'_>, n: usize, deadline: Option<Instant>) -> io::Result<()> {
        let n = n.min(self.buf.len());
        self.make_room(n - self.buffered().len().min(n));
        while self.buffered().len() < n {
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(timed_out());
            }
            if self.recv_by(fd, deadline)? == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("the connection closed after {} of {n} bytes", self.buffered().len()),
                ));
            }
        }
        Ok(())
    }

    /// Moves the next payload bytes into `dest` without waiting: those already buffered, then
    /// (if `dest` has room left) one receive straight into `dest` that also brings what
    /// follows the payload into the buffer. Returns how many bytes went into `dest`;
    /// `Ok(None)` when none were buffered and none have arrived, `Ok(Some(0))` when the peer
    /// closed the stream (or `dest` is empty).
    pub fn recv_payload_now(&mut self, fd: BorrowedFd<'_>, dest: &mut [u8]) -> io::Result<Option<usize>> {
        let k = self.buffered().len().min(dest.len());
        if k > 0 || dest.is_empty() {
            dest[..k].copy_from_slice(&self.buf[self.start..self.start + k]);
            self.consume(k);
            return Ok(Some(k));
        }
        // The buffer is empty here: all of it takes what follows the payload.
        let mut iov = [io::IoSliceMut::new(dest), io::IoSliceMut::new(&mut self.buf[..])];
        let n = loop {
            let mut control = rustix::net::RecvAncillaryBuffer::default();
            match rustix::net::recvmsg(fd, &mut iov, &mut control, RecvFlags::DONTWAIT) {
                Ok(m) => break m.bytes,
                Err(Errno::INTR) => continue,
                Err(Errno::AGAIN) => return Ok(None),
                Err(e) => return Err(e.into()),
            }
        };
        let into_dest = n.min(dest.len());
        (self.start, self.end) = (0, n - into_dest);
        Ok(Some(into_dest))
    }

    /// Receives exactly `dest.len()` payload bytes by `deadline` (buffered ones first); what
    /// follows them stays buffered.
    pub fn recv_exact_by(&mut self, fd: BorrowedFd<'_>, dest: &mut [u8], deadline: Option<Instant>) -> io::Result<()> {
        let mut got = 0;
        while got < dest.len() {
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(timed_out());
            }
            match self.recv_payload_now(fd, &mut dest[got..])? {
                Some(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("the connection closed after {got} of {} bytes", dest.len()),
                    ))
                }
                Some(n) => got += n,
                None => wait_fd(fd, PollFlags::IN, deadline)?,
            }
        }
        Ok(())
    }

    /// Receives and drops `len` bytes by `deadline` (buffered ones first), keeping the stream
    /// in step.
    pub fn discard_by(&mut self, fd: BorrowedFd<'_>, len: u64, deadline: Option<Instant>) -> io::Result<()> {
        let k = (self.buffered().len() as u64).min(len);
        self.consume(k as usize);
        let mut fd = fd;
        discard_by(&mut fd, len - k, deadline)
    }
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

    /// `n` bytes of a pattern that starts at `seed`.
    fn bytes(seed: u8, n: usize) -> Vec<u8> {
        (0..n).map(|i| seed.wrapping_add((i % 251) as u8)).collect()
    }

    #[test]
    fn a_header_split_over_two_receives_is_joined() {
        let (mut a, b) = UnixStream::pair().unwrap();
        let (header, payload) = (bytes(1, 32), bytes(50, 5));
        let mut rb = RecvBuf::new(2048);
        a.write_all(&header[..10]).unwrap();
        assert_eq!(rb.recv_now(b.as_fd()).unwrap(), Some(10));
        a.write_all(&header[10..]).unwrap();
        a.write_all(&payload).unwrap();
        rb.fill_by(b.as_fd(), 32, None).unwrap();
        assert_eq!(&rb.buffered()[..32], &header[..]);
        rb.consume(32);
        let mut dest = [0u8; 5];
        rb.recv_exact_by(b.as_fd(), &mut dest, None).unwrap();
        assert_eq!(&dest[..], &payload[..]);
        assert!(rb.buffered().is_empty());
    }

    #[test]
    fn a_payload_longer_than_the_buffer_lands_in_place_and_the_next_header_stays_buffered() {
        let (mut a, b) = UnixStream::pair().unwrap();
        let (first, payload, next) = (bytes(1, 32), bytes(7, 10_000), bytes(90, 32));
        a.write_all(&[&first[..], &payload, &next].concat()).unwrap();
        drop(a);
        let mut rb = RecvBuf::new(64);
        rb.fill_by(b.as_fd(), 32, None).unwrap();
        assert_eq!(&rb.buffered()[..32], &first[..]);
        rb.consume(32);
        let mut dest = vec![0u8; payload.len()];
        rb.recv_exact_by(b.as_fd(), &mut dest, None).unwrap();
        assert!(dest == payload, "the payload differs");
        // The next header came along with the payload's end, or is read now.
        rb.fill_by(b.as_fd(), 32, None).unwrap();
        assert_eq!(rb.buffered(), &next[..]);
        rb.consume(32);
        assert_eq!(rb.recv_by(b.as_fd(), None).unwrap(), 0, "then the close");
    }

    #[test]
    fn two_frames_in_one_receive_are_parsed_from_the_buffer() {
        let (mut a, b) = UnixStream::pair().unwrap();
        let frames: Vec<(Vec<u8>, Vec<u8>)> = vec![(bytes(1, 32), bytes(2, 8)), (bytes(3, 32), bytes(4, 8))];
        let wire: Vec<u8> = frames.iter().flat_map(|(h, p)| [h.clone(), p.clone()].concat()).collect();
        a.write_all(&wire).unwrap();
        let mut rb = RecvBuf::new(2048);
        assert_eq!(rb.recv_now(b.as_fd()).unwrap(), Some(wire.len()), "one receive takes both");
        // Closed before they are parsed: both come from the buffer alone.
        drop(a);
        for (header, payload) in &frames {
            rb.fill_by(b.as_fd(), 32, None).unwrap();
            assert_eq!(&rb.buffered()[..32], &header[..]);
            rb.consume(32);
            let mut dest = [0u8; 8];
            rb.recv_exact_by(b.as_fd(), &mut dest, None).unwrap();
            assert_eq!(&dest[..], &payload[..]);
        }
        assert_eq!(rb.recv_by(b.as_fd(), None).unwrap(), 0);
    }

    #[test]
    fn a_discarded_payload_takes_the_buffered_part_first_and_keeps_the_stream_in_step() {
        let (mut a, b) = UnixStream::pair().unwrap();
        let (header, payload, next) = (bytes(1, 32), bytes(2, 5000), bytes(3, 32));
        a.write_all(&[&header[..], &payload, &next].concat()).unwrap();
        let mut rb = RecvBuf::new(100);
        rb.fill_by(b.as_fd(), 32, None).unwrap();
        rb.consume(32);
        assert!(!rb.buffered().is_empty(), "part of the payload is buffered");
        rb.discard_by(b.as_fd(), payload.len() as u64, None).unwrap();
        rb.fill_by(b.as_fd(), 32, None).unwrap();
        assert_eq!(&rb.buffered()[..32], &next[..]);
    }

    #[test]
    fn a_header_cut_by_the_close_is_an_unexpected_end() {
        let (mut a, b) = UnixStream::pair().unwrap();
        a.write_all(&bytes(1, 20)).unwrap();
        drop(a);
        let mut rb = RecvBuf::new(2048);
        assert_eq!(rb.fill_by(b.as_fd(), 32, None).unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
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
