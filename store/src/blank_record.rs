//! The record a put writes behind its value in a *blank* (a placement the master granted ahead
//! of the put, without a key; see the master's `blanks` module): which object the blank now
//! holds. The master commits the put on the writer's word (`PutCommitBlank`) and tells the
//! blank's owner afterwards, without waiting; if the master goes before the owner learnt of the
//! commit, the owner reads this record to report the object to the next master, as it settles
//! any pending commit: the record whole, naming this blank, and the value's bytes matching its
//! checksum.
//!
//! Layout, little-endian, at the blank's start + the value's size:
//! `"CRBK" | format u8 | flags u8 (1: hard pin) | key length u16 | blank id u64 | value size
//! u64 | value CRC-32 u32 | soft pin ms u64 | key | CRC-32 of all before it u32`. A blank's capacity is its value's size plus
//! [`RECORD_MAX`], so the owner finds the record at capacity − [`RECORD_MAX`] from the
//! blank's start. The bytes are the segment's (written by any client the master let write
//! there): read with every bound checked, never trusted.

/// Room a blank keeps behind its value for the record.
pub const RECORD_MAX: u64 = 512;
/// Bytes of a record before its key.
const HEAD: usize = 36;
/// Longest key a put through a blank may have (longer keys put the usual way).
pub const KEY_MAX: usize = RECORD_MAX as usize - HEAD - 4;
const MAGIC: &[u8; 4] = b"CRBK";
const FORMAT: u8 = 1;
const HARD_PIN: u8 = 1;

/// What a blank holds, as its writer recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The blank's id (the object's version).
    pub blank: u64,
    /// The key the value was put under (the writer's name for it).
    pub key: String,
    /// The value's bytes, from the blank's start.
    pub size: u64,
    /// The value's CRC-32.
    pub crc: u32,
    /// The put's hard pin.
    pub hard_pin: bool,
    /// The put's soft pin, in milliseconds from its commit (0: none).
    pub soft_pin_ms: u64,
}

impl Record {
    /// The record's bytes; `None` for a key longer than [`KEY_MAX`].
    pub fn encode(&self) -> Option<Vec<u8>> {
        let key = self.key.as_bytes();
        if key.len() > KEY_MAX {
            return None;
        }
        let mut out = Vec::with_capacity(HEAD + key.len() + 4);
        out.extend_from_slice(MAGIC);
        out.push(FORMAT);
        out.push(if self.hard_pin { HARD_PIN } else { 0 });
        out.extend_from_slice(&(key.len() as u16).to_le_bytes());
        out.extend_from_slice(&self.blank.to_le_bytes());
        out.extend_from_slice(&self.size.to_le_bytes());
        out.extend_from_slice(&self.crc.to_le_bytes());
        out.extend_from_slice(&self.soft_pin_ms.to_le_bytes());
        out.extend_from_slice(key);
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        Some(out)
    }

    /// The record at the start of `bytes` (a blank's [`RECORD_MAX`] bytes behind its value),
    /// if one is there whole: magic, format, lengths within bounds, its own checksum right,
    /// and a key of UTF-8. Anything else (never written, torn, another format) is `None`.
    pub fn decode(bytes: &[u8]) -> Option<Record> {
        let head = bytes.get(..HEAD)?;
        if &head[..4] != MAGIC || head[4] != FORMAT || head[5] & !HARD_PIN != 0 {
            return None;
        }
        let key_len = u16::from_le_bytes([head[6], head[7]]) as usize;
        if key_len == 0 || key_len > KEY_MAX {
            return None;
        }
        let body = bytes.get(..HEAD + key_len)?;
        let crc = u32::from_le_bytes(bytes.get(HEAD + key_len..HEAD + key_len + 4)?.try_into().ok()?);
        if crc32fast::hash(body) != crc {
            return None;
        }
        let u64_at = |at: usize| u64::from_le_bytes(head[at..at + 8].try_into().expect("8 bytes"));
        Some(Record {
            blank: u64_at(8),
            size: u64_at(16),
            crc: u32::from_le_bytes(head[24..28].try_into().expect("4 bytes")),
            hard_pin: head[5] & HARD_PIN != 0,
            soft_pin_ms: u64_at(28),
            key: String::from_utf8(body[HEAD..].to_vec()).ok()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> Record {
        Record {
            blank: 0x1122_3344_5566_7788,
            key: "layer/7/prefix".into(),
            size: 1 << 20,
            crc: 0xdead_beef,
            hard_pin: true,
            soft_pin_ms: 60_000,
        }
    }

    #[test]
    fn a_record_reads_back_from_a_blank_tail() {
        let r = record();
        let mut tail = r.encode().expect("short key");
        assert!(tail.len() as u64 <= RECORD_MAX);
        tail.resize(RECORD_MAX as usize, 0xaa);
        assert_eq!(Record::decode(&tail), Some(r));
    }

    #[test]
    fn a_torn_foreign_or_oversized_record_is_none() {
        let bytes = record().encode().unwrap();
        for cut in 0..bytes.len() {
            assert_eq!(Record::decode(&bytes[..cut]), None, "cut at {cut}");
        }
        for i in 0..bytes.len() {
            let mut flipped = bytes.clone();
            flipped[i] ^= 0x40;
            assert_eq!(Record::decode(&flipped), None, "byte {i} flipped");
        }
        assert_eq!(Record::decode(&[0u8; RECORD_MAX as usize]), None, "never written");
        let long = Record { key: "k".repeat(KEY_MAX + 1), ..record() };
        assert_eq!(long.encode(), None);
        let longest = Record { key: "k".repeat(KEY_MAX), ..record() };
        assert_eq!(longest.encode().unwrap().len() as u64, RECORD_MAX);
    }
}
