//! The disk tier's file format and file names.
//!
//! ```text
//! offset  size  field
//!      0     4  magic "CRSD"
//!      4     2  format version (1), LE
//!      6     2  flags (0)
//!      8     4  key length (1..=4096), LE
//!     12     4  reserved (0)
//!     16     8  value length, LE
//!     24     8  object version (the master's), LE
//!     32     4  CRC-32 of the value, LE
//!     36     4  reserved (0)
//!     40     4  CRC-32 of bytes 0..40 and the key, LE
//!     44     4  reserved (0)
//!     48     …  the key (UTF-8), then zeros up to the next multiple of 4096
//!   4096·n     the value
//! ```
//!
//! A file is named after the 128-bit xxh3 hash of its key and the object's version:
//! `<first 2 hex digits>/<32 hex digits>-<16 hex digits>.crs`, so any key (path-like, very
//! long, any bytes) gives a short, safe name; the key inside the file is compared on every
//! read, so two keys with one hash can never be confused. Files are written under a
//! temporary name (`….tmp`) and renamed when complete.
//!
//! Everything read back is untrusted: [`Header::decode`] checks every field and the header's
//! checksum and never panics (property-tested over arbitrary bytes below).

use crate::error::{Result, StoreError};

/// The first four bytes of every file.
pub const MAGIC: [u8; 4] = *b"CRSD";
/// The format version this tier writes and reads; a file of another version is refused.
pub const FORMAT_VERSION: u16 = 1;
/// Fixed part of the header.
pub const FIXED_LEN: usize = 48;
/// The value starts at a multiple of this (lets a reader use direct I/O).
pub const ALIGN: u64 = 4096;
/// Longest key (the master's limit).
pub const MAX_KEY_LEN: usize = crate::protocol::MAX_KEY_LEN;
/// Largest value (the master's limit).
pub const MAX_VALUE_LEN: u64 = crate::protocol::MAX_OBJECT_SIZE;
/// Bytes that always hold the whole header and key.
pub const MAX_HEADER_LEN: usize = 2 * ALIGN as usize;
/// Final file names end with this.
pub const FILE_SUFFIX: &str = ".crs";
/// Temporary file names end with this.
pub const TMP_SUFFIX: &str = ".tmp";

/// A file's header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// The object's key (1..=4096 bytes of UTF-8).
    pub key: String,
    /// The value's length, in bytes.
    pub value_len: u64,
    /// The object's version at the master.
    pub version: u64,
    /// CRC-32 of the value.
    pub value_crc: u32,
}

fn corrupt(why: impl Into<String>) -> StoreError {
    StoreError::CorruptFile(why.into())
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

impl Header {
    /// Where the value starts.
    pub fn data_offset(&self) -> u64 {
        data_offset(self.key.len())
    }

    /// The complete file's length.
    pub fn file_len(&self) -> u64 {
        self.data_offset() + self.value_len
    }

    /// The bytes the file takes on disk ([`disk_len`]).
    pub fn disk_len(&self) -> u64 {
        disk_len(self.file_len())
    }

    /// The header, key and padding: the first [`Self::data_offset`] bytes of the file.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; self.data_offset() as usize];
        b[0..4].copy_from_slice(&MAGIC);
        b[4..6].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        b[8..12].copy_from_slice(&(self.key.len() as u32).to_le_bytes());
        b[16..24].copy_from_slice(&self.value_len.to_le_bytes());
        b[24..32].copy_from_slice(&self.version.to_le_bytes());
        b[32..36].copy_from_slice(&self.value_crc.to_le_bytes());
        b[FIXED_LEN..FIXED_LEN + self.key.len()].copy_from_slice(self.key.as_bytes());
        let crc = header_crc(&b[..40], self.key.as_bytes());
        b[40..44].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Parses the start of a file (at least the header and the key; [`MAX_HEADER_LEN`]
    /// bytes always suffice). Checks magic, version, lengths, reserved fields and the
    /// header's checksum.
    pub fn decode(b: &[u8]) -> Result<Header> {
        if b.len() < FIXED_LEN {
            return Err(corrupt(format!("{} bytes: shorter than a header", b.len())));
        }
        if b[0..4] != MAGIC {
            return Err(corrupt("bad magic"));
        }
        let version = u16_at(b, 4);
        if version != FORMAT_VERSION {
            return Err(corrupt(format!("format version {version} (this build reads {FORMAT_VERSION})")));
        }
        if u16_at(b, 6) != 0 || u32_at(b, 12) != 0 || u32_at(b, 36) != 0 || u32_at(b, 44) != 0 {
            return Err(corrupt("reserved fields are not zero"));
        }
        let key_len = u32_at(b, 8) as usize;
        if key_len == 0 || key_len > MAX_KEY_LEN {
            return Err(corrupt(format!("key length {key_len}")));
        }
        if b.len() < FIXED_LEN + key_len {
            return Err(corrupt(format!("{} bytes: the key needs {}", b.len(), FIXED_LEN + key_len)));
        }
        let key_bytes = &b[FIXED_LEN..FIXED_LEN + key_len];
        if header_crc(&b[..40], key_bytes) != u32_at(b, 40) {
            return Err(corrupt("header checksum mismatch"));
        }
        let value_len = u64_at(b, 16);
        if value_len == 0 || value_len > MAX_VALUE_LEN {
            return Err(corrupt(format!("value length {value_len}")));
        }
        let key = std::str::from_utf8(key_bytes).map_err(|_| corrupt("key is not UTF-8"))?.to_string();
        Ok(Header { key, value_len, version: u64_at(b, 24), value_crc: u32_at(b, 32) })
    }
}

fn header_crc(fixed: &[u8], key: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(fixed);
    h.update(key);
    h.finalize()
}

/// Where the value of a file whose key has `key_len` bytes starts.
pub fn data_offset(key_len: usize) -> u64 {
    (FIXED_LEN + key_len).div_ceil(ALIGN as usize) as u64 * ALIGN
}

/// The bytes a file of `file_len` bytes takes on disk: whole 4 KiB blocks, as file systems
/// allocate them (the last block of a file is whole on disk however little of it is used).
/// The tier's capacity counts these, not the files' lengths: a file of a 5000-byte value
/// under a short key is 9096 bytes long and takes 12288.
pub fn disk_len(file_len: u64) -> u64 {
    file_len.div_ceil(ALIGN) * ALIGN
}

/// The 32 hex digits naming a key's files.
pub fn key_hash(key: &str) -> String {
    format!("{:032x}", xxhash_rust::xxh3::xxh3_128(key.as_bytes()))
}

/// `<2 hex>/<32 hex>-<16 hex>.crs`, relative to the cluster's directory.
pub fn file_name(key: &str, version: u64) -> (String, String) {
    let h = key_hash(key);
    (h[..2].to_string(), format!("{h}-{version:016x}{FILE_SUFFIX}"))
}

/// What a name in a hash directory is.
#[derive(Debug, PartialEq, Eq)]
pub enum NameKind {
    /// A final file: its key hash and version.
    File {
        /// The key's hash, 32 lowercase hex digits.
        hash: String,
        /// The object's version.
        version: u64,
    },
    /// A temporary file left by an interrupted write.
    Temporary,
    /// Something this tier did not write.
    Other,
}

/// What the entry `name` of a hash directory is: a final file (32 lowercase hex digits of
/// the key's hash, `-`, 16 of the version, `.crs`), a temporary file, or something else.
pub fn parse_name(name: &str) -> NameKind {
    if name.ends_with(TMP_SUFFIX) && name.len() > 32 && name.as_bytes()[..32].iter().all(u8::is_ascii_hexdigit) {
        return NameKind::Temporary;
    }
    let Some(stem) = name.strip_suffix(FILE_SUFFIX) else { return NameKind::Other };
    let Some((hash, version)) = stem.split_once('-') else { return NameKind::Other };
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'));
    if !hex(hash, 32) || !hex(version, 16) {
        return NameKind::Other;
    }
    match u64::from_str_radix(version, 16) {
        Ok(version) => NameKind::File { hash: hash.to_string(), version },
        Err(_) => NameKind::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn header(key: &str) -> Header {
        Header { key: key.into(), value_len: 12345, version: 77, value_crc: 0xdead_beef }
    }

    #[test]
    fn round_trip_and_alignment() {
        for key in ["k", "a/../../etc/passwd", &"x".repeat(MAX_KEY_LEN), "ключ/🔑"] {
            let h = header(key);
            let b = h.encode();
            assert_eq!(b.len() as u64, h.data_offset());
            assert_eq!(h.data_offset() % ALIGN, 0);
            assert!(b.len() <= MAX_HEADER_LEN);
            assert_eq!(Header::decode(&b).unwrap(), h);
        }
    }

    #[test]
    fn names_are_short_safe_and_parse_back() {
        let long = "/".repeat(4000);
        for key in ["k", "../../x", long.as_str(), "a\0b", "."] {
            let (dir, name) = file_name(key, 0xabc);
            assert_eq!(dir.len(), 2);
            assert!(name.len() < 60 && !name.contains('/') && !name.starts_with('.'));
            assert_eq!(parse_name(&name), NameKind::File { hash: key_hash(key), version: 0xabc });
        }
        assert_ne!(key_hash("a"), key_hash("b"));
        assert_eq!(parse_name("notes.txt"), NameKind::Other);
        assert_eq!(parse_name(&format!("{}-{:016x}.1234.tmp", key_hash("k"), 5)), NameKind::Temporary);
        assert_eq!(parse_name("0123-0000000000000001.crs"), NameKind::Other);
    }

    #[test]
    fn damaged_headers_are_refused() {
        let b = header("key").encode();
        assert!(Header::decode(&b[..FIXED_LEN + 1]).is_err(), "truncated key");
        assert!(Header::decode(&b[..10]).is_err(), "truncated header");
        for i in 0..FIXED_LEN + 3 {
            for bit in 0..8 {
                let mut bad = b.clone();
                bad[i] ^= 1 << bit;
                assert!(Header::decode(&bad).is_err(), "flipped bit {bit} of byte {i} went unnoticed");
            }
        }
    }

    proptest! {
        /// Arbitrary bytes never panic the parser.
        #[test]
        fn fuzz_decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..9000)) {
            let _ = Header::decode(&bytes);
        }

        /// Valid headers with arbitrary garbage appended still parse; a changed byte is caught.
        #[test]
        fn fuzz_mutations_are_caught(
            key in "[^\u{0}]{1,300}",
            value_len in 1u64..(1 << 40),
            version in any::<u64>(),
            crc in any::<u32>(),
            at in any::<proptest::sample::Index>(),
            xor in 1u8..=255,
            tail in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let h = Header { key, value_len, version, value_crc: crc };
            let mut b = h.encode();
            b.extend_from_slice(&tail);
            prop_assert_eq!(Header::decode(&b).unwrap(), h.clone());
            let i = at.index(FIXED_LEN + h.key.len());
            b[i] ^= xor;
            prop_assert!(Header::decode(&b).is_err());
        }

        #[test]
        fn fuzz_names_never_panic(name in "\\PC{0,80}") {
            let _ = parse_name(&name);
        }
    }
}
