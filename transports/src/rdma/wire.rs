//! The queue-pair exchange: how an initiator and a target connect RC queue pairs.
//!
//! One TCP connection per peer (the "control connection") carries small, versioned,
//! length-prefixed messages:
//! ```text
//! 0        4         5      6          8        12
//! | "CRQP" | version | kind | reserved | len    | payload (len bytes, at most MAX_PAYLOAD)
//! ```
//! * `Connect {slot, target device, initiator device, QP info}`: the initiator's queue pair
//!   for lane `slot`; the target creates its own on `target device`, connects it (INIT, RTR,
//!   RTS) and answers `Accept {slot, QP info}` or `Reject {reason}`. A later `Connect` for
//!   the same slot replaces the target's queue pair (a rebuilt lane).
//! * `Ping` / `Pong`: liveness, both ways (each side times the other out).
//!
//! Closing the connection destroys the target's queue pairs of that initiator. Everything
//! here comes from the network: decoding is bounds-checked and never panics.
//!
//! Both sides read with a socket timeout. A timeout between two messages is idleness
//! ([`WireError::Idle`]: nothing was consumed, the reader may read again); once a message has
//! begun, timeouts are waited out until [`MESSAGE_TIMEOUT`], so a message that arrives in
//! pieces is never cut in two (which would leave the connection out of step).

use std::io::{self, Read, Write};
use std::time::{Duration, Instant};

pub const MAGIC: [u8; 4] = *b"CRQP";
pub const VERSION: u8 = 1;
pub const HEADER_LEN: usize = 12;
pub const MAX_PAYLOAD: u32 = 1024;
pub const MAX_DEVICE_NAME: usize = 64;
/// Once a message's first byte has arrived, the rest must follow within this long.
pub const MESSAGE_TIMEOUT: Duration = Duration::from_secs(5);

/// What one side tells the other about its queue pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpInfo {
    pub qpn: u32,
    pub psn: u32,
    pub lid: u16,
    pub gid: [u8; 16],
    /// Path MTU enum value (1..=5).
    pub mtu: u8,
    /// RDMA reads this side serves at once as a responder.
    pub rd_atomic: u8,
}

const QP_INFO_LEN: usize = 4 + 4 + 2 + 16 + 1 + 1;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    Connect { slot: u32, target_device: String, initiator_device: String, qp: QpInfo },
    Accept { slot: u32, qp: QpInfo },
    Reject { reason: String },
    Ping,
    Pong,
}

#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("bad magic {0:02x?}")]
    BadMagic([u8; 4]),
    #[error("unsupported exchange version {0} (this side speaks {VERSION})")]
    Version(u8),
    #[error("unknown message kind {0}")]
    Kind(u8),
    #[error("message of {0} bytes exceeds the {MAX_PAYLOAD}-byte limit")]
    Oversized(u32),
    #[error("malformed message: {0}")]
    Malformed(&'static str),
    #[error("connection closed")]
    Closed,
    #[error("nothing received within the read timeout")]
    Idle,
    #[error("a message began but was not complete after {0:?}")]
    Stalled(Duration),
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
}

impl Message {
    fn kind(&self) -> u8 {
        match self {
            Message::Connect { .. } => 1,
            Message::Accept { .. } => 2,
            Message::Reject { .. } => 3,
            Message::Ping => 4,
            Message::Pong => 5,
        }
    }

    /// The whole message, header included.
    pub fn encode(&self) -> Vec<u8> {
        let mut payload = Vec::new();
        match self {
            Message::Connect { slot, target_device, initiator_device, qp } => {
                payload.extend_from_slice(&slot.to_le_bytes());
                put_name(&mut payload, target_device);
                put_name(&mut payload, initiator_device);
                put_qp(&mut payload, qp);
            }
            Message::Accept { slot, qp } => {
                payload.extend_from_slice(&slot.to_le_bytes());
                put_qp(&mut payload, qp);
            }
            Message::Reject { reason } => {
                let mut end = reason.len().min(MAX_PAYLOAD as usize);
                while !reason.is_char_boundary(end) {
                    end -= 1;
                }
                payload.extend_from_slice(&reason.as_bytes()[..end]);
            }
            Message::Ping | Message::Pong => {}
        }
        let mut msg = Vec::with_capacity(HEADER_LEN + payload.len());
        msg.extend_from_slice(&MAGIC);
        msg.push(VERSION);
        msg.push(self.kind());
        msg.extend_from_slice(&[0, 0]);
        msg.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        msg.extend_from_slice(&payload);
        msg
    }

    /// Decodes a payload of message kind `kind`.
    pub fn decode(kind: u8, payload: &[u8]) -> Result<Message, WireError> {
        let mut r = Reader(payload);
        let msg = match kind {
            1 => {
                Message::Connect { slot: r.u32()?, target_device: r.name()?, initiator_device: r.name()?, qp: r.qp()? }
            }
            2 => Message::Accept { slot: r.u32()?, qp: r.qp()? },
            3 => {
                let reason = String::from_utf8_lossy(r.0).into_owned();
                r.0 = &[];
                Message::Reject { reason }
            }
            4 => Message::Ping,
            5 => Message::Pong,
            k => return Err(WireError::Kind(k)),
        };
        if !r.0.is_empty() {
            return Err(WireError::Malformed("trailing bytes"));
        }
        Ok(msg)
    }

    pub fn write_to(&self, w: &mut impl Write) -> io::Result<()> {
        w.write_all(&self.encode())
    }

    /// Reads one message. A read timeout before its first byte is [`WireError::Idle`] (nothing
    /// consumed); after it, the rest is awaited until [`MESSAGE_TIMEOUT`].
    pub fn read_from(r: &mut impl Read) -> Result<Message, WireError> {
        Self::read_within(r, MESSAGE_TIMEOUT)
    }

    /// [`Message::read_from`] where a begun message must be complete within `limit`
    /// ([`WireError::Stalled`] otherwise: the connection is then out of step and must close).
    pub fn read_within(r: &mut impl Read, limit: Duration) -> Result<Message, WireError> {
        let mut header = [0u8; HEADER_LEN];
        let first = loop {
            match r.read(&mut header[..1]) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if is_timeout(&e) => return Err(WireError::Idle),
                Err(e) => return Err(e.into()),
            }
        };
        if first == 0 {
            return Err(WireError::Closed);
        }
        let began = Instant::now();
        read_rest(r, &mut header[1..], began, limit)?;
        let (kind, len) = parse_header(&header)?;
        let mut payload = vec![0u8; len as usize];
        read_rest(r, &mut payload, began, limit)?;
        Message::decode(kind, &payload)
    }
}

/// A read that gave up for the socket's timeout (`WouldBlock` on Unix, `TimedOut` elsewhere).
fn is_timeout(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut)
}

/// Fills `buf` with the rest of a message that began at `began`, waiting out read timeouts
/// until `limit` has passed since then.
fn read_rest(r: &mut impl Read, buf: &mut [u8], began: Instant, limit: Duration) -> Result<(), WireError> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => {
                return Err(WireError::Io(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the connection closed in the middle of a message",
                )))
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if is_timeout(&e) => {
                if began.elapsed() >= limit {
                    return Err(WireError::Stalled(limit));
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Checks a header; returns the message kind and payload length.
pub fn parse_header(header: &[u8; HEADER_LEN]) -> Result<(u8, u32), WireError> {
    let magic: [u8; 4] = [header[0], header[1], header[2], header[3]];
    if magic != MAGIC {
        return Err(WireError::BadMagic(magic));
    }
    if header[4] != VERSION {
        return Err(WireError::Version(header[4]));
    }
    let len = u32::from_le_bytes([header[8], header[9], header[10], header[11]]);
    if len > MAX_PAYLOAD {
        return Err(WireError::Oversized(len));
    }
    Ok((header[5], len))
}

fn put_name(out: &mut Vec<u8>, name: &str) {
    let mut end = name.len().min(MAX_DEVICE_NAME);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    out.push(end as u8);
    out.extend_from_slice(&name.as_bytes()[..end]);
}

fn put_qp(out: &mut Vec<u8>, qp: &QpInfo) {
    out.extend_from_slice(&qp.qpn.to_le_bytes());
    out.extend_from_slice(&qp.psn.to_le_bytes());
    out.extend_from_slice(&qp.lid.to_le_bytes());
    out.extend_from_slice(&qp.gid);
    out.push(qp.mtu);
    out.push(qp.rd_atomic);
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        if self.0.len() < n {
            return Err(WireError::Malformed("truncated payload"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u32(&mut self) -> Result<u32, WireError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn name(&mut self) -> Result<String, WireError> {
        let len = self.take(1)?[0] as usize;
        if len == 0 || len > MAX_DEVICE_NAME {
            return Err(WireError::Malformed("device name length"));
        }
        let bytes = self.take(len)?;
        let name = std::str::from_utf8(bytes).map_err(|_| WireError::Malformed("device name"))?;
        if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.:".contains(&b)) {
            return Err(WireError::Malformed("device name characters"));
        }
        Ok(name.to_string())
    }

    fn qp(&mut self) -> Result<QpInfo, WireError> {
        let b = self.take(QP_INFO_LEN)?;
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[10..26]);
        let info = QpInfo {
            qpn: u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            psn: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
            lid: u16::from_le_bytes([b[8], b[9]]),
            gid,
            mtu: b[26],
            rd_atomic: b[27],
        };
        if info.qpn == 0 || info.qpn > 0x00ff_ffff || info.psn > 0x00ff_ffff {
            return Err(WireError::Malformed("queue pair number or PSN out of range"));
        }
        if !(1..=5).contains(&info.mtu) {
            return Err(WireError::Malformed("path MTU"));
        }
        if info.rd_atomic == 0 {
            return Err(WireError::Malformed("zero RDMA read resources"));
        }
        Ok(info)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn qp() -> QpInfo {
        QpInfo { qpn: 17, psn: 0xabcdef, lid: 3, gid: [7; 16], mtu: 3, rd_atomic: 16 }
    }

    #[test]
    fn messages_roundtrip() {
        for m in [
            Message::Connect { slot: 5, target_device: "rxe0".into(), initiator_device: "mlx5_1".into(), qp: qp() },
            Message::Accept { slot: 9, qp: qp() },
            Message::Reject { reason: "no such device".into() },
            Message::Ping,
            Message::Pong,
        ] {
            let bytes = m.encode();
            assert_eq!(Message::read_from(&mut bytes.as_slice()).unwrap(), m);
        }
    }

    #[test]
    fn bad_input_is_a_typed_error() {
        let good = Message::Accept { slot: 1, qp: qp() }.encode();
        let mut bad = good.clone();
        bad[0] = b'X';
        assert!(matches!(Message::read_from(&mut bad.as_slice()), Err(WireError::BadMagic(_))));
        let mut bad = good.clone();
        bad[4] = 9;
        assert!(matches!(Message::read_from(&mut bad.as_slice()), Err(WireError::Version(9))));
        let mut bad = good.clone();
        bad[8..12].copy_from_slice(&(MAX_PAYLOAD + 1).to_le_bytes());
        assert!(matches!(Message::read_from(&mut bad.as_slice()), Err(WireError::Oversized(_))));
        assert!(matches!(Message::read_from(&mut &good[..good.len() - 1]), Err(WireError::Io(_))));
        assert!(matches!(Message::read_from(&mut &b""[..]), Err(WireError::Closed)));
        let zero_qpn = Message::Accept { slot: 1, qp: QpInfo { qpn: 0, ..qp() } }.encode();
        assert!(matches!(Message::read_from(&mut zero_qpn.as_slice()), Err(WireError::Malformed(_))));
        let bad_mtu = Message::Accept { slot: 1, qp: QpInfo { mtu: 6, ..qp() } }.encode();
        assert!(Message::read_from(&mut bad_mtu.as_slice()).is_err());
        assert!(matches!(Message::decode(42, &[]), Err(WireError::Kind(42))));
        assert!(matches!(Message::decode(4, &[1]), Err(WireError::Malformed("trailing bytes"))));
    }

    /// Hands out its bytes in the given pieces, with a read timeout between two pieces.
    struct Pieces(std::collections::VecDeque<Option<Vec<u8>>>);

    impl Pieces {
        fn new(pieces: Vec<Option<Vec<u8>>>) -> Self {
            Pieces(pieces.into())
        }
    }

    impl Read for Pieces {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            match self.0.pop_front() {
                None => Ok(0),
                Some(None) => Err(io::ErrorKind::WouldBlock.into()),
                Some(Some(mut piece)) => {
                    let n = piece.len().min(buf.len());
                    buf[..n].copy_from_slice(&piece[..n]);
                    if n < piece.len() {
                        self.0.push_front(Some(piece.split_off(n)));
                    }
                    Ok(n)
                }
            }
        }
    }

    #[test]
    fn read_timeouts_inside_a_message_do_not_cut_it() {
        let accept = Message::Accept { slot: 3, qp: qp() }.encode();
        let ping = Message::Ping.encode();
        let mut r = Pieces::new(vec![
            None, // idle before the first message: nothing consumed
            Some(accept[..5].to_vec()),
            None,
            Some(accept[5..HEADER_LEN + 2].to_vec()),
            None,
            None,
            Some(accept[HEADER_LEN + 2..].to_vec()),
            Some(ping.clone()),
        ]);
        assert!(matches!(Message::read_from(&mut r), Err(WireError::Idle)));
        assert_eq!(Message::read_from(&mut r).unwrap(), Message::Accept { slot: 3, qp: qp() });
        // The reader is still in step: the next message decodes.
        assert_eq!(Message::read_from(&mut r).unwrap(), Message::Ping);
        assert!(matches!(Message::read_from(&mut r), Err(WireError::Closed)));
    }

    #[test]
    fn a_message_that_stops_halfway_fails_once_its_time_is_up() {
        let ping = Message::Ping.encode();
        let mut r = Pieces::new(vec![Some(ping[..6].to_vec()), None, None, None]);
        assert!(matches!(Message::read_within(&mut r, Duration::ZERO), Err(WireError::Stalled(_))));
        let mut r = Pieces::new(vec![Some(ping[..6].to_vec())]);
        let err = Message::read_from(&mut r).unwrap_err();
        assert!(matches!(&err, WireError::Io(e) if e.kind() == io::ErrorKind::UnexpectedEof), "{err}");
    }

    #[test]
    fn device_names_are_checked() {
        let mut payload = 1u32.to_le_bytes().to_vec();
        payload.push(3);
        payload.extend_from_slice(b"a/b");
        assert!(Message::decode(1, &payload).is_err());
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..128)) {
            let _ = Message::read_from(&mut bytes.as_slice());
        }

        #[test]
        fn arbitrary_payloads_never_panic(kind in 0u8..8, payload in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Message::decode(kind, &payload);
        }

        #[test]
        fn arbitrary_connects_roundtrip(
            slot in any::<u32>(), qpn in 1u32..0x00ff_ffff, psn in 0u32..0x00ff_ffff,
            lid in any::<u16>(), gid in any::<[u8; 16]>(), mtu in 1u8..=5, rd in 1u8..=255,
            dev in "[a-z0-9_]{1,64}",
        ) {
            let m = Message::Connect {
                slot, target_device: dev.clone(), initiator_device: dev,
                qp: QpInfo { qpn, psn, lid, gid, mtu, rd_atomic: rd },
            };
            let bytes = m.encode();
            prop_assert_eq!(Message::read_from(&mut bytes.as_slice()).unwrap(), m);
        }
    }
}
