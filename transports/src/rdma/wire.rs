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
//! Messages are frames of the net layer's codec ([`FORMAT`]): a message that has begun must
//! be complete within [`MESSAGE_TIMEOUT`] (one deadline for all of it, so pauses inside it do
//! not cut it, and a peer that trickles it cannot hold the reader longer); between messages a
//! reader waits as long as its caller's idle time.
//!
//! Layer: peers (the layer map is in the [rdma module](super)).

use std::time::Duration;

pub use super::qp::QpInfo;
use crate::net::{Format, FrameError, Wire};

/// The first bytes of every message.
pub const MAGIC: [u8; 4] = *b"CRQP";
/// The exchange's version; a message of another version is refused.
pub const VERSION: u8 = 1;
/// Bytes before the payload.
pub const HEADER_LEN: usize = 12;
/// Longest payload accepted; a longer length is refused before anything is allocated.
pub const MAX_PAYLOAD: u32 = 1024;
/// The frame layout in the net layer's terms.
pub const FORMAT: Format = Format {
    name: "rdma control",
    magic: &MAGIC,
    version: VERSION,
    header_len: HEADER_LEN,
    length_at: Some(8),
    max_payload: MAX_PAYLOAD as u64,
};
/// Longest device name a `Connect` may carry.
pub const MAX_DEVICE_NAME: usize = 64;
/// Once a message's first byte has arrived, the rest must follow within this long.
pub const MESSAGE_TIMEOUT: Duration = Duration::from_secs(5);

const QP_INFO_LEN: usize = 4 + 4 + 2 + 16 + 1 + 1;

/// One message of the exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// Initiator → target: connect a queue pair of yours on `target_device` to my `qp` (on
    /// `initiator_device`) for lane `slot`; replaces the slot's earlier one.
    Connect {
        /// The initiator's lane number.
        slot: u32,
        /// The target's device to create the queue pair on.
        target_device: String,
        /// The initiator's device its queue pair is on.
        initiator_device: String,
        /// The initiator's queue pair.
        qp: QpInfo,
    },
    /// Target → initiator: the queue pair for lane `slot` is connected, this is it.
    Accept {
        /// The lane number of the `Connect` answered.
        slot: u32,
        /// The target's queue pair.
        qp: QpInfo,
    },
    /// Target → initiator: the `Connect` failed, and why.
    Reject {
        /// What failed, for the initiator's error.
        reason: String,
    },
    /// Are you alive? (either side)
    Ping,
    /// The answer to a `Ping`.
    Pong,
}

/// Why a message could not be read.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// Bad magic or version, an oversized length, a close, an idle or stalled connection: the
    /// net layer's errors.
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// A kind byte no message has.
    #[error("unknown message kind {0}")]
    Kind(u8),
    /// A payload that does not decode as its kind's.
    #[error("malformed message: {0}")]
    Malformed(&'static str),
}

impl WireError {
    /// The peer closed the connection between two messages.
    pub fn is_closed(&self) -> bool {
        matches!(self, WireError::Frame(FrameError::Closed))
    }

    /// Nothing arrived within the idle time (nothing consumed).
    pub fn is_idle(&self) -> bool {
        matches!(self, WireError::Frame(FrameError::Idle(_)))
    }
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
            Message::Reject { reason } => payload.extend_from_slice(&reason.as_bytes()[..fitted(reason)]),
            Message::Ping | Message::Pong => {}
        }
        // Every payload is bounded by construction (names and reasons are cut to fit).
        FORMAT.encode(self.kind(), &payload).expect("control messages fit the payload cap")
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
                // Invalid UTF-8 becomes U+FFFD (3 bytes a byte): cut to what a Reject can carry,
                // so that a decoded message is one this side could send.
                let mut reason = String::from_utf8_lossy(r.0).into_owned();
                reason.truncate(fitted(&reason));
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

    /// Sends the message, all of it within [`MESSAGE_TIMEOUT`].
    pub fn write_to(&self, w: &mut (impl Wire + ?Sized)) -> Result<(), WireError> {
        let bytes = self.encode();
        let deadline = std::time::Instant::now() + MESSAGE_TIMEOUT;
        crate::net::wire::send_all_by(w, &mut [std::io::IoSlice::new(&bytes)], Some(deadline))
            .map_err(|source| FrameError::Io { format: FORMAT.name, source })?;
        Ok(())
    }

    /// Reads one message: its first byte is awaited until `idle` (`None`: forever;
    /// [`WireError::is_idle`] then, nothing consumed), the rest within [`MESSAGE_TIMEOUT`].
    pub fn read(r: &mut (impl Wire + ?Sized), idle: Option<Duration>) -> Result<Message, WireError> {
        Self::read_within(r, idle, MESSAGE_TIMEOUT)
    }

    /// [`Message::read`] where a begun message must be complete within `limit` (a timeout
    /// otherwise: the connection is then out of step and must close).
    pub fn read_within(
        r: &mut (impl Wire + ?Sized),
        idle: Option<Duration>,
        limit: Duration,
    ) -> Result<Message, WireError> {
        let frame = FORMAT.read_frame(r, u64::from(MAX_PAYLOAD), idle, limit)?;
        Message::decode(frame.kind, &frame.payload)
    }
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

/// The length of the longest prefix of `reason` (cut at a character) a payload can carry.
fn fitted(reason: &str) -> usize {
    let mut end = reason.len().min(MAX_PAYLOAD as usize);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    end
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn qp() -> QpInfo {
        QpInfo { qpn: 17, psn: 0xabcdef, lid: 3, gid: [7; 16], mtu: 3, rd_atomic: 16 }
    }

    fn read(bytes: &[u8]) -> Result<Message, WireError> {
        Message::read(&mut &bytes[..], None)
    }

    /// Found by the rdma_wire fuzz target: a reason of invalid UTF-8 grew past the payload cap
    /// when decoded (each byte a 3-byte U+FFFD), so sending it on cut it to another message.
    #[test]
    fn a_reject_of_invalid_utf8_decodes_to_a_message_that_fits() {
        let m = Message::decode(3, &[0xa7; MAX_PAYLOAD as usize]).unwrap();
        let Message::Reject { reason } = &m else { panic!("{m:?}") };
        assert!(reason.len() <= MAX_PAYLOAD as usize, "a reason of {} bytes", reason.len());
        assert_eq!(read(&m.encode()).unwrap(), m);
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
            assert_eq!(read(&m.encode()).unwrap(), m);
        }
    }

    #[test]
    fn bad_input_is_a_typed_error() {
        let good = Message::Accept { slot: 1, qp: qp() }.encode();
        let mut bad = good.clone();
        bad[0] = b'X';
        assert!(matches!(read(&bad), Err(WireError::Frame(FrameError::BadMagic { .. }))));
        let mut bad = good.clone();
        bad[4] = 9;
        assert!(matches!(read(&bad), Err(WireError::Frame(FrameError::Version { found: 9, .. }))));
        let mut bad = good.clone();
        bad[8..12].copy_from_slice(&(MAX_PAYLOAD + 1).to_le_bytes());
        assert!(matches!(read(&bad), Err(WireError::Frame(FrameError::Oversized { .. }))));
        assert!(matches!(read(&good[..good.len() - 1]), Err(WireError::Frame(FrameError::Io { .. }))));
        assert!(read(b"").unwrap_err().is_closed());
        let zero_qpn = Message::Accept { slot: 1, qp: QpInfo { qpn: 0, ..qp() } }.encode();
        assert!(matches!(read(&zero_qpn), Err(WireError::Malformed(_))));
        let bad_mtu = Message::Accept { slot: 1, qp: QpInfo { mtu: 6, ..qp() } }.encode();
        assert!(read(&bad_mtu).is_err());
        assert!(matches!(Message::decode(42, &[]), Err(WireError::Kind(42))));
        assert!(matches!(Message::decode(4, &[1]), Err(WireError::Malformed("trailing bytes"))));
    }

    /// Writes `pieces` to a socket with a pause before each; returns the reading end.
    fn paced(pieces: Vec<Vec<u8>>, pause: Duration) -> std::os::unix::net::UnixStream {
        use std::io::Write;
        let (mut w, r) = std::os::unix::net::UnixStream::pair().unwrap();
        std::thread::spawn(move || {
            for p in pieces {
                std::thread::sleep(pause);
                if w.write_all(&p).is_err() {
                    return;
                }
            }
            std::thread::sleep(Duration::from_secs(2));
        });
        r
    }

    #[test]
    fn pauses_inside_a_message_do_not_cut_it() {
        let accept = Message::Accept { slot: 3, qp: qp() }.encode();
        let ping = Message::Ping.encode();
        let mut r = paced(
            vec![accept[..5].to_vec(), accept[5..HEADER_LEN + 2].to_vec(), accept[HEADER_LEN + 2..].to_vec(), ping],
            Duration::from_millis(50),
        );
        assert!(Message::read(&mut r, Some(Duration::from_millis(1))).unwrap_err().is_idle(), "idle: nothing consumed");
        assert_eq!(Message::read(&mut r, None).unwrap(), Message::Accept { slot: 3, qp: qp() });
        // The reader is still in step: the next message decodes.
        assert_eq!(Message::read(&mut r, None).unwrap(), Message::Ping);
    }

    #[test]
    fn a_message_that_stops_halfway_fails_once_its_time_is_up() {
        let ping = Message::Ping.encode();
        let mut r = paced(vec![ping[..6].to_vec()], Duration::ZERO);
        let err = Message::read_within(&mut r, None, Duration::from_millis(100)).unwrap_err();
        assert!(matches!(err, WireError::Frame(FrameError::TimedOut { .. })), "{err}");
        let err = read(&ping[..6]).unwrap_err();
        assert!(
            matches!(&err, WireError::Frame(FrameError::Io { source, .. }) if source.kind() == std::io::ErrorKind::UnexpectedEof),
            "{err}"
        );
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
            let _ = Message::read(&mut bytes.as_slice(), None);
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
            prop_assert_eq!(Message::read(&mut bytes.as_slice(), None).unwrap(), m);
        }
    }
}
