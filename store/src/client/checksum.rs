//! End-to-end checksums (optional: [`crate::ClientConfig::verify_checksums`]).
//!
//! With the setting on, a client takes a CRC-32 of every whole value it puts before the put
//! starts, sends it with the start (`PutStart`, see [`START_MAX`]) and the commit (`PutEnd`);
//! the master keeps it with the object and hands it out with every
//! replica list. A get of such a client that reads the whole value computes the checksum of
//! the bytes it read, after the transfer and before it returns: bytes that do not match fail
//! the read with [`StoreError::ChecksumMismatch`] (the get tries the object's other sources
//! first, as after any failed source) and are counted (in the client's `checksum_mismatches` metric). What is
//! not verified: ranged reads and get sessions (they read part of the value), objects put
//! without a checksum (by a client with the setting off, an older client, a put session) and
//! hot-cache hits (an entry is verified when it is filled, and a fill that does not match is
//! never entered).
//!
//! The algorithm is CRC-32 (ISO-HDLC, `crc32fast`, which the disk tier uses for its files
//! already): on this project's machine it ran at 45-68 GB/s from cache (64 KiB-1 MiB) and
//! 15.5 GB/s from memory (16 MiB), against 16-23 and 12.7 GB/s for CRC-32C (`crc32c`, SSE4.2)
//! and 14 and 11.8 GB/s for xxh3-64 (`xxhash-rust`, SSE2 build); and its 32 bits fit in
//! the padding of the master's object record, where a 64-bit sum would add 8 bytes per object.

use std::sync::atomic::{AtomicU64, Ordering};

use super::sg::{Dst, Src};
use crate::error::{Result, StoreError};

/// The environment variables that turn checksums on: Crescent's and upstream Mooncake's (the
/// same switch there: computed at put, verified at get).
pub const VERIFY_ENV: [&str; 2] = ["CRESCENT_VERIFY_CHECKSUMS", "MOONCAKE_STORE_CHECKSUM"];

/// The setting from the environment ([`VERIFY_ENV`], the first one set wins); `None` when
/// neither is set (or both are empty).
pub fn verify_from_env(var: impl Fn(&str) -> Option<String>) -> Result<Option<bool>> {
    for name in VERIFY_ENV {
        let Some(v) = var(name).map(|v| v.trim().to_ascii_lowercase()).filter(|v| !v.is_empty()) else { continue };
        return match v.as_str() {
            "1" | "true" | "yes" | "on" => Ok(Some(true)),
            "0" | "false" | "no" | "off" => Ok(Some(false)),
            _ => Err(StoreError::Config(format!("{name}={v:?} is not a boolean (1 or 0)"))),
        };
    }
    Ok(None)
}

/// Largest value whose checksum a put takes before it starts with `verify_checksums` off
/// (with it on, every value's is taken anyway). The holders of the replicas are told of the
/// placement with it (a pending commit, see the master's `owners` module), so that the commit
/// answers without waiting for a further word from them; that saves about one owner round
/// trip per put, and taking the CRC costs the value's bytes at 15-68 GB/s (see above) on
/// the put's path: at 2 MiB, 30-130 us, about what it saves. Larger values are started
/// without one and commit as before (the commit waits for the holders' acknowledgement).
/// A first estimate from those figures: `storebench master` and the put benchmarks are the
/// place to tune it.
///
/// The bound is on the bytes of one call ([`take_at_start`]): a batch waits for its holders'
/// acknowledgements once for all its keys, so it saves one owner round trip whatever its size,
/// while the checksums cost every byte of it. A `batch_put_from` of 32 x 1 MiB spent 2.6-2.9 ms
/// of its 15 ms taking them (memory not in cache, 11-12 GB/s) to save about 0.3 ms.
pub const START_MAX: u64 = 2 << 20;

/// Smallest value whose checksum a put sends behind its start (`PutChecksum`, on the master's
/// fast port) rather than in it: taken while the master places the put, it leaves the put's
/// path, but the second frame and the master's handling of it join the path, about 30 us on
/// this project's machine. Below this the CRC costs less (64 KiB: 1-4 us), and the start
/// carries it. Measured with 1 MiB and 64 KiB values, alternated runs of 2026-12-07: 1 MiB
/// puts 40 us faster behind, 64 KiB ones 30 us slower.
pub const BEHIND_MIN: u64 = 256 << 10;

/// Whether a put of values of `sizes` (one call: a single put or a batch) takes their
/// checksums before it starts: always with `verify` on, else when they hold [`START_MAX`]
/// bytes or fewer in all.
pub fn take_at_start(verify: bool, sizes: impl IntoIterator<Item = u64>) -> bool {
    verify || sizes.into_iter().try_fold(0u64, |sum, n| sum.checked_add(n).filter(|s| *s <= START_MAX)).is_some()
}

/// The checksum of `bytes`.
pub fn of_bytes(bytes: &[u8]) -> u32 {
    crc32fast::hash(bytes)
}

/// The checksum of `parts`, one after another.
pub fn of_parts<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> u32 {
    let mut h = crc32fast::Hasher::new();
    for p in parts {
        h.update(p);
    }
    h.finalize()
}

/// The checksum of a put's value; `None` for a value in device memory (the writer takes no
/// checksum of it: that would need the CPU to read the device's memory, or a copy of it).
pub(crate) fn of_src(src: &Src<'_>) -> Option<u32> {
    Some(match src {
        Src::Bytes(b) => of_bytes(b),
        Src::Parts(parts) => of_parts(parts.iter().copied()),
        Src::Registered(_, reach) if reach.has_device() => return None,
        Src::Registered(pieces, _) => of_parts(pieces.iter().map(|p| {
            // SAFETY: the caller registered this piece and keeps it valid and unchanged for the
            // put (checked registered before the put starts).
            unsafe { std::slice::from_raw_parts(p.addr as *const u8, p.len as usize) }
        })),
    })
}

/// The checksum of the value `[0, size)` that a read has written into `dst`, when `dst` takes
/// exactly that (its extents side by side, no overlap, no gap); `None` otherwise (a ranged
/// read: nothing to compare). Device memory is copied to the host to be summed.
pub(crate) fn of_dst(dst: &mut Dst<'_>, size: u64) -> Result<Option<u32>> {
    let mut extents = dst.extents();
    extents.retain(|e| e.len > 0);
    extents.sort_unstable_by_key(|e| e.offset);
    let mut reach = 0;
    for e in &extents {
        if e.offset != reach {
            return Ok(None);
        }
        reach += e.len;
    }
    if reach != size {
        return Ok(None);
    }
    if let Dst::Registered(_, device) = dst {
        if device.has_device() {
            let mut h = crc32fast::Hasher::new();
            let mut host = Vec::new();
            for e in &extents {
                host.resize(e.len as usize, 0);
                device.read(e.addr, &mut host)?;
                h.update(&host);
            }
            return Ok(Some(h.finalize()));
        }
    }
    Ok(Some(of_parts(extents.iter().map(|e| {
        // SAFETY: the destination's memory for this call (the caller's registered or lent
        // memory, or its bytes), which the read has written whole (the caller's contract:
        // called once a source served the read); nothing else writes it during the get.
        unsafe { std::slice::from_raw_parts(e.addr as *const u8, e.len as usize) }
    }))))
}

/// The client's checksum counters.
#[derive(Debug, Default)]
pub struct Checksums {
    verified: AtomicU64,
    mismatches: AtomicU64,
    unchecked: AtomicU64,
}

/// What [`Checksums`] counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChecksumCounts {
    /// Whole-value reads whose bytes matched their object's checksum.
    pub verified: u64,
    /// Reads (and hot-cache fills) whose bytes did not match.
    pub mismatches: u64,
    /// Whole-value reads of objects that have no checksum (put without one).
    pub unchecked: u64,
}

impl Checksums {
    /// The counts so far.
    pub fn counts(&self) -> ChecksumCounts {
        ChecksumCounts {
            verified: self.verified.load(Ordering::Relaxed),
            mismatches: self.mismatches.load(Ordering::Relaxed),
            unchecked: self.unchecked.load(Ordering::Relaxed),
        }
    }

    /// Checks the bytes a read of `key` wrote into `dst` against the object's checksum
    /// (`expected`; none: not taken at the put). Ranged reads pass unchecked.
    pub(crate) fn verify(&self, key: &str, expected: Option<u32>, size: u64, dst: &mut Dst<'_>) -> Result<()> {
        let Some(expected) = expected else {
            if dst.covers(size) {
                self.unchecked.fetch_add(1, Ordering::Relaxed);
            }
            return Ok(());
        };
        match of_dst(dst, size)? {
            Some(got) => self.judge(key, expected, got),
            None => Ok(()),
        }
    }

    /// Counts the outcome of a comparison; a mismatch is an error.
    pub(crate) fn judge(&self, key: &str, expected: u32, got: u32) -> Result<()> {
        if got == expected {
            self.verified.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        self.mismatches.fetch_add(1, Ordering::Relaxed);
        tracing::warn!("object {key:?}: the bytes read have CRC-32 {got:#010x}, its writer's {expected:#010x}");
        Err(StoreError::ChecksumMismatch { key: key.to_string(), expected, got })
    }
}

#[cfg(test)]
mod tests {
    use std::mem::MaybeUninit;

    use super::*;
    use crate::client::sg::{Extent, Piece, Reach};

    #[test]
    fn a_batch_takes_checksums_at_its_start_only_within_the_bound_of_its_bytes() {
        assert!(take_at_start(false, [START_MAX]), "one value at the bound");
        assert!(!take_at_start(false, [START_MAX + 1]), "one value past it");
        assert!(take_at_start(false, [START_MAX / 2, START_MAX / 2]), "a batch whose values fill the bound");
        assert!(!take_at_start(false, vec![1 << 20; 32]), "32 x 1 MiB: 16 times the bound in all");
        assert!(!take_at_start(false, [u64::MAX, 2]), "a sum past u64");
        assert!(take_at_start(true, vec![1 << 20; 32]), "with verify_checksums on, always");
    }

    #[test]
    fn every_form_of_a_value_has_the_checksum_of_its_bytes() {
        let value: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        let want = of_bytes(&value);
        assert_eq!(of_bytes(b"123456789"), 0xcbf4_3926, "the standard check value");
        let (a, b) = value.split_at(1234);
        assert_eq!(of_src(&Src::Bytes(&value)), Some(want));
        assert_eq!(of_src(&Src::Parts(&[a, b])), Some(want));
        let pieces = [Piece::new(a.as_ptr() as u64, a.len() as u64), Piece::new(b.as_ptr() as u64, b.len() as u64)];
        assert_eq!(of_src(&Src::Registered(&pieces, Reach::host())), Some(want));
    }

    #[test]
    fn a_destination_is_checked_only_when_it_takes_the_whole_value() {
        let value: Vec<u8> = (0..4096u32).map(|i| i as u8).collect();
        let want = of_bytes(&value);
        let (a, b) = value.split_at(1000);
        // Out of order in the list, side by side in the value.
        let whole = [
            Extent { offset: 1000, addr: b.as_ptr() as u64, len: b.len() as u64 },
            Extent { offset: 0, addr: a.as_ptr() as u64, len: a.len() as u64 },
        ];
        assert_eq!(of_dst(&mut Dst::Registered(&whole, Reach::host()), 4096).unwrap(), Some(want));
        assert_eq!(of_dst(&mut Dst::Registered(&whole[..1], Reach::host()), 4096).unwrap(), None, "a range");
        let overlap = [whole[1], Extent { offset: 999, ..whole[0] }];
        assert_eq!(of_dst(&mut Dst::Registered(&overlap, Reach::host()), 4095).unwrap(), None, "overlapping extents");
        let mut out: Vec<MaybeUninit<u8>> = value.iter().map(|&b| MaybeUninit::new(b)).collect();
        assert_eq!(of_dst(&mut Dst::Bytes { out: &mut out, offset: 0 }, 4096).unwrap(), Some(want));
        assert_eq!(of_dst(&mut Dst::Bytes { out: &mut out[..10], offset: 5 }, 4096).unwrap(), None);
    }

    #[test]
    fn a_mismatch_is_a_typed_error_and_counted() {
        let c = Checksums::default();
        let value = vec![7u8; 512];
        let mut out: Vec<MaybeUninit<u8>> = value.iter().map(|&b| MaybeUninit::new(b)).collect();
        let mut dst = Dst::Bytes { out: &mut out, offset: 0 };
        c.verify("k", Some(of_bytes(&value)), 512, &mut dst).unwrap();
        c.verify("k", None, 512, &mut dst).unwrap();
        let e = c.verify("k", Some(of_bytes(&value) ^ 1), 512, &mut dst).unwrap_err();
        assert!(
            matches!(e, StoreError::ChecksumMismatch { ref key, expected, got } if key == "k" && got == of_bytes(&value) && expected == got ^ 1),
            "{e:?}"
        );
        assert_eq!(e.code(), crate::proto::Code::ChecksumMismatch);
        assert_eq!(c.counts(), ChecksumCounts { verified: 1, mismatches: 1, unchecked: 1 });
    }

    #[test]
    fn the_setting_reads_either_variable() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |n: &str| pairs.iter().find(|(k, _)| *k == n).map(|(_, v)| v.to_string())
        };
        assert_eq!(verify_from_env(env(&[])).unwrap(), None);
        assert_eq!(verify_from_env(env(&[("MOONCAKE_STORE_CHECKSUM", "1")])).unwrap(), Some(true));
        assert_eq!(verify_from_env(env(&[("CRESCENT_VERIFY_CHECKSUMS", "off")])).unwrap(), Some(false));
        assert!(verify_from_env(env(&[("CRESCENT_VERIFY_CHECKSUMS", "maybe")])).is_err());
    }
}
