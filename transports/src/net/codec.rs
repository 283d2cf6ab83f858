//! One frame codec for every wire format of Crescent.
//!
//! Every frame starts with the same prefix — `magic | version u8 | kind u8` — followed by the
//! format's own header fields; a *length-prefixed* format ends its header with the payload's
//! length (u32, little-endian). A [`Format`] describes one such layout; it checks the prefix
//! and the announced length against its cap **before** any byte of payload is allocated, and
//! reads a whole frame against one deadline.
//!
//! | format | magic | header | length at | payload cap |
//! |---|---|---|---|---|
//! | tcp transport ([`crate::tcp::frame`]) | `CT` | 32 | — (the header's `len`, by kind) | 64 MiB |
//! | shm control ([`crate::shm::wire`]) | `CS` | 120 | — (no payload; one frame per message) | 0 |
//! | rdma control ([`crate::rdma::wire`]) | `CRQP` | 12 | 8 | 1 KiB |
//! | engine handshake (`crescent_engine::handshake`) | `CRHS` | 12 | 8 | 4 KiB requests, 16 MiB replies |
//! | store disk service (`crescent_store`) | `CD` | 8 | 4 | 8 KiB |
//! | rpc (`crescent_engine::rpc`, Mooncake's `RpcInterface`) | `CRPC` | 16 | 12 | 1 GiB, read as it arrives |
//! | store master's fast rpc (`crescent_store::fastrpc`) | `CF` | 8 | 4 | 256 MiB replies, ≈65 MiB requests |

use std::io::{self, IoSlice};
use std::time::{Duration, Instant};

use super::wire::{recv_exact_by, send_all_by, Wire};

/// Longest header of any format.
pub const MAX_HEADER: usize = 40;

/// One wire format's frame layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Format {
    /// What speaks it, for errors and logs ("tcp transport").
    pub name: &'static str,
    /// The bytes every frame starts with (2 or 4 of them: `CT`, `CRQP`, ...).
    pub magic: &'static [u8],
    /// The version byte that follows the magic; a frame of any other version is refused.
    pub version: u8,
    /// Bytes of the fixed header, prefix included.
    pub header_len: usize,
    /// For a length-prefixed format: where the header holds the payload's length (u32 LE),
    /// which is the header's last four bytes. `None`: the format's header says it otherwise.
    pub length_at: Option<usize>,
    /// Most payload bytes a frame may announce.
    pub max_payload: u64,
}

/// What went wrong reading or writing a frame. Bytes from a peer are untrusted: every
/// malformed, oversized, truncated or late frame is one of these, never a panic or a hang.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The frame does not start with the format's magic: the peer speaks something else.
    #[error("bad magic {found:02x?} (not a crescent {format} peer)")]
    BadMagic {
        /// The format's name ([`Format::name`]).
        format: &'static str,
        /// The bytes found where the magic belongs.
        found: Vec<u8>,
    },
    /// The peer speaks another version of the format.
    #[error("unsupported {format} version {found} (this side speaks {expected})")]
    Version {
        /// The format's name.
        format: &'static str,
        /// The peer's version byte.
        found: u8,
        /// This side's version ([`Format::version`]).
        expected: u8,
    },
    /// The kind byte names no message of the format (checked by the format's own decoder).
    #[error("unknown {format} message kind {kind}")]
    Kind {
        /// The format's name.
        format: &'static str,
        /// The unknown kind byte.
        kind: u8,
    },
    /// The announced payload length exceeds the cap; nothing was allocated for it.
    #[error("a {format} frame announces {len} payload bytes, more than the {max} allowed")]
    Oversized {
        /// The format's name.
        format: &'static str,
        /// Announced payload length, in bytes.
        len: u64,
        /// The cap in force, in bytes (the smaller of the caller's and the format's).
        max: u64,
    },
    /// The frame is well-delimited but its contents break the format's rules (a header too
    /// short, a field out of range); `why` says which.
    #[error("malformed {format} frame: {why}")]
    Malformed {
        /// The format's name.
        format: &'static str,
        /// What is wrong with it.
        why: String,
    },
    /// The peer closed the connection between two frames.
    #[error("the peer closed the connection")]
    Closed,
    /// Nothing arrived within the idle time (between two frames: nothing was consumed).
    #[error("nothing received for {0:?}")]
    Idle(Duration),
    /// A frame began but was not complete within its time (the connection is out of step).
    #[error("a {format} frame was not complete within {limit:?}")]
    TimedOut {
        /// The format's name.
        format: &'static str,
        /// The time the whole frame had.
        limit: Duration,
    },
    /// The connection failed (reset, broken pipe, ...) while reading or writing a frame.
    #[error("{format} connection: {source}")]
    Io {
        /// The format's name.
        format: &'static str,
        /// The socket's error.
        #[source]
        source: io::Error,
    },
}

impl FrameError {
    /// True for a deadline that passed (idle or mid-frame).
    pub fn is_timeout(&self) -> bool {
        matches!(self, FrameError::Idle(_) | FrameError::TimedOut { .. })
    }
}

/// A length-prefixed frame as read: its kind, its header and its payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawFrame {
    /// The kind byte (after magic and version), not yet checked against the format's kinds.
    pub kind: u8,
    /// The fixed header, prefix included, in its first [`Format::header_len`] bytes; the
    /// rest is zero.
    pub header: [u8; MAX_HEADER],
    /// The payload, exactly as long as the header announced.
    pub payload: Vec<u8>,
}

impl Format {
    fn io(&self, limit: Duration) -> impl Fn(io::Error) -> FrameError + '_ {
        move |source| match source.kind() {
            io::ErrorKind::TimedOut => FrameError::TimedOut { format: self.name, limit },
            _ => FrameError::Io { format: self.name, source },
        }
    }

    /// Sends all of `bufs` (a frame, or its pieces in order) by `limit` from now; a deadline
    /// that passes is [`FrameError::TimedOut`].
    pub fn send(
        &self,
        w: &mut (impl Wire + ?Sized),
        bufs: &mut [IoSlice<'_>],
        limit: Duration,
    ) -> Result<(), FrameError> {
        send_all_by(w, bufs, Some(Instant::now() + limit)).map_err(self.io(limit))
    }

    /// Fills `buf` with the next bytes of a frame that began with `limit` to arrive whole,
    /// by its `deadline`; a deadline that passes is [`FrameError::TimedOut`].
    pub fn recv_exact(
        &self,
        w: &mut (impl Wire + ?Sized),
        buf: &mut [u8],
        deadline: Instant,
        limit: Duration,
    ) -> Result<(), FrameError> {
        recv_exact_by(w, buf, Some(deadline)).map_err(self.io(limit))
    }

    /// A format-specific malformation.
    pub fn malformed(&self, why: impl Into<String>) -> FrameError {
        FrameError::Malformed { format: self.name, why: why.into() }
    }

    /// Checks a header's prefix (magic and version); returns its kind byte.
    pub fn check(&self, header: &[u8]) -> Result<u8, FrameError> {
        let m = self.magic.len();
        if header.len() < m + 2 {
            return Err(self.malformed(format!("a header of {} bytes", header.len())));
        }
        if &header[..m] != self.magic {
            return Err(FrameError::BadMagic { format: self.name, found: header[..m].to_vec() });
        }
        if header[m] != self.version {
            return Err(FrameError::Version { format: self.name, found: header[m], expected: self.version });
        }
        Ok(header[m + 1])
    }

    /// Checks an announced payload length against `max` (and the format's cap).
    pub fn check_len(&self, len: u64, max: u64) -> Result<usize, FrameError> {
        let max = max.min(self.max_payload);
        if len > max {
            return Err(FrameError::Oversized { format: self.name, len, max });
        }
        Ok(len as usize)
    }

    /// Writes the prefix of a frame of `kind` into `header` (zeroing the rest).
    pub fn put_prefix(&self, header: &mut [u8], kind: u8) {
        header.fill(0);
        let m = self.magic.len();
        header[..m].copy_from_slice(self.magic);
        header[m] = self.version;
        header[m + 1] = kind;
    }

    fn length_at(&self) -> usize {
        self.length_at.expect("a length-prefixed format")
    }

    /// The whole length-prefixed frame of `kind` with `payload`; a payload over the cap is an
    /// error, never a truncated frame.
    pub fn encode(&self, kind: u8, payload: &[u8]) -> Result<Vec<u8>, FrameError> {
        let len = self.check_len(payload.len() as u64, u64::MAX)?;
        let at = self.length_at();
        let mut frame = vec![0u8; self.header_len + len];
        self.put_prefix(&mut frame[..self.header_len], kind);
        frame[at..at + 4].copy_from_slice(&(len as u32).to_le_bytes());
        frame[self.header_len..].copy_from_slice(payload);
        Ok(frame)
    }

    /// Sends a length-prefixed frame, all of it by `deadline`.
    pub fn write_frame(
        &self,
        w: &mut (impl Wire + ?Sized),
        kind: u8,
        payload: &[u8],
        limit: Duration,
    ) -> Result<(), FrameError> {
        let frame = self.encode(kind, payload)?;
        self.send(w, &mut [IoSlice::new(&frame)], limit)
    }

    /// Waits until `idle` (`None`: forever) for the first byte of a frame and reads it into
    /// `first`. [`FrameError::Closed`] / [`FrameError::Idle`]: no frame began (nothing consumed).
    pub fn await_frame(
        &self,
        w: &mut (impl Wire + ?Sized),
        first: &mut [u8],
        idle: Option<Duration>,
    ) -> Result<usize, FrameError> {
        let deadline = idle.map(|d| Instant::now() + d);
        match w.recv_by(first, deadline) {
            Ok(0) => Err(FrameError::Closed),
            Ok(n) => Ok(n),
            Err(e) if e.kind() == io::ErrorKind::TimedOut => Err(FrameError::Idle(idle.unwrap_or_default())),
            Err(e) => Err(FrameError::Io { format: self.name, source: e }),
        }
    }

    /// Reads the rest of a header whose first `filled` bytes are in `header`, by `deadline`.
    pub fn finish_header(
        &self,
        w: &mut (impl Wire + ?Sized),
        header: &mut [u8],
        filled: usize,
        deadline: Instant,
        limit: Duration,
    ) -> Result<u8, FrameError> {
        self.recv_exact(w, &mut header[filled..self.header_len], deadline, limit)?;
        self.check(&header[..self.header_len])
    }

    /// Reads one length-prefixed frame: its first byte is awaited until `idle`; from then on,
    /// the whole frame must arrive within `limit`. The payload is allocated only once its
    /// length passed `max` (and the format's cap).
    pub fn read_frame(
        &self,
        w: &mut (impl Wire + ?Sized),
        max: u64,
        idle: Option<Duration>,
        limit: Duration,
    ) -> Result<RawFrame, FrameError> {
        let mut header = [0u8; MAX_HEADER];
        let filled = self.await_frame(w, &mut header[..1], idle)?;
        let deadline = Instant::now() + limit;
        let kind = self.finish_header(w, &mut header, filled, deadline, limit)?;
        let at = self.length_at();
        let len = u32::from_le_bytes(header[at..at + 4].try_into().expect("4 bytes"));
        let len = self.check_len(u64::from(len), max)?;
        let mut payload = vec![0u8; len];
        self.recv_exact(w, &mut payload, deadline, limit)?;
        Ok(RawFrame { kind, header, payload })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const TEST: Format =
        Format { name: "test", magic: b"TT", version: 3, header_len: 8, length_at: Some(4), max_payload: 100 };

    /// Hands out one byte per call, 100 ms apart: never late for a per-read timeout.
    struct Trickle(Vec<u8>);

    impl Wire for Trickle {
        fn recv_by(&mut self, buf: &mut [u8], _: Option<Instant>) -> io::Result<usize> {
            std::thread::sleep(Duration::from_millis(100));
            if self.0.is_empty() || buf.is_empty() {
                return Ok(0);
            }
            buf[0] = self.0.remove(0);
            Ok(1)
        }
        fn send_by(&mut self, _: &[IoSlice<'_>], _: Option<Instant>) -> io::Result<usize> {
            Ok(0)
        }
    }

    /// Counts the bytes asked for: a cap must be checked before the payload is allocated.
    struct Announces(Vec<u8>, usize);

    impl Wire for Announces {
        fn recv_by(&mut self, buf: &mut [u8], _: Option<Instant>) -> io::Result<usize> {
            self.1 = self.1.max(buf.len());
            let n = buf.len().min(self.0.len());
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0.drain(..n);
            Ok(n)
        }
        fn send_by(&mut self, _: &[IoSlice<'_>], _: Option<Instant>) -> io::Result<usize> {
            Ok(0)
        }
    }

    #[test]
    fn frames_roundtrip() {
        let mut out = Vec::new();
        TEST.write_frame(&mut out, 9, b"payload", Duration::from_secs(1)).unwrap();
        assert_eq!(&out[..8], &[b'T', b'T', 3, 9, 7, 0, 0, 0]);
        let f = TEST.read_frame(&mut out.as_slice(), 100, None, Duration::from_secs(1)).unwrap();
        assert_eq!((f.kind, f.payload.as_slice()), (9, &b"payload"[..]));
        assert!(matches!(TEST.encode(1, &[0; 101]), Err(FrameError::Oversized { len: 101, max: 100, .. })));
    }

    #[test]
    fn a_frame_that_trickles_in_ends_with_a_timeout() {
        let frame = TEST.encode(1, &[5; 20]).unwrap();
        let err = TEST.read_frame(&mut Trickle(frame), 100, None, Duration::from_millis(250)).unwrap_err();
        assert!(matches!(err, FrameError::TimedOut { .. }), "{err}");
    }

    #[test]
    fn the_cap_is_checked_before_the_payload_is_allocated() {
        let mut header = vec![b'T', b'T', 3, 1];
        header.extend_from_slice(&u32::MAX.to_le_bytes());
        let mut r = Announces(header, 0);
        let err = TEST.read_frame(&mut r, 100, None, Duration::from_secs(1)).unwrap_err();
        assert!(matches!(err, FrameError::Oversized { len, max: 100, .. } if len == u64::from(u32::MAX)), "{err}");
        assert!(r.1 <= MAX_HEADER, "asked for {} bytes", r.1);
        // A smaller cap of the caller's wins over the format's.
        let frame = TEST.encode(1, &[0; 50]).unwrap();
        assert!(matches!(
            TEST.read_frame(&mut frame.as_slice(), 10, None, Duration::from_secs(1)),
            Err(FrameError::Oversized { max: 10, .. })
        ));
    }

    #[test]
    fn bad_prefixes_and_closes_are_typed() {
        let good = TEST.encode(2, b"x").unwrap();
        let read = |b: &[u8]| TEST.read_frame(&mut &b[..], 100, None, Duration::from_secs(1));
        let mut b = good.clone();
        b[0] = b'X';
        assert!(matches!(read(&b), Err(FrameError::BadMagic { .. })));
        let mut b = good.clone();
        b[2] = 4;
        assert!(matches!(read(&b), Err(FrameError::Version { found: 4, expected: 3, .. })));
        assert!(matches!(read(&[]), Err(FrameError::Closed)));
        assert!(matches!(read(&good[..5]), Err(FrameError::Io { .. })));
        assert!(matches!(read(&good[..good.len() - 1]), Err(FrameError::Io { .. })));
    }

    #[test]
    fn an_idle_peer_is_told_apart_from_a_stalled_frame() {
        let (mut a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let err = TEST.read_frame(&mut a, 100, Some(Duration::from_millis(20)), Duration::from_secs(1)).unwrap_err();
        assert!(matches!(err, FrameError::Idle(_)), "{err}");
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let mut r = bytes.as_slice();
            while let Ok(f) = TEST.read_frame(&mut r, 100, None, Duration::from_secs(1)) {
                prop_assert!(f.payload.len() <= 100);
            }
        }
    }
}
