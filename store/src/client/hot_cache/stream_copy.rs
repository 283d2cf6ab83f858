//! A copy with non-temporal stores, for the hot cache's fills: the bytes go to memory without
//! first reading each destination line into the cache (a plain `memcpy` of a line it does not
//! hold reads it first, the read-for-ownership) and without evicting what the cache holds.
//!
//! glibc switches its `memcpy` to non-temporal stores only above a threshold derived from the
//! last-level cache's size; on the VMs these benches run on the reported L3 is 480 MiB, so it
//! never does for a value. Measured there (C, 512 MiB copied in 256 KiB-4 MiB pieces from a
//! 10 MiB source into a 1 GiB pre-faulted destination, one core, 2026-12-03 17:35 UTC, load
//! 1.2-2.0): `memcpy` 5.4-7.7 GB/s, 16-byte streaming stores 11.5-11.8 GB/s (32-byte ones the
//! same); with the other core copying too, 3.4-4.3 against 5.3-5.6 GB/s.
//!
//! Worth it where the destination is not read soon: a fill's blocks (read on a later hit), or
//! a value larger than the caches. Below [`STREAM_FROM`] bytes, and off x86_64, a plain copy.
//!
//! A hit's copy out of the cache into the caller's memory streams from [`HIT_STREAM_FROM`]
//! bytes ([`streams_hit`]). Below that, a plain copy leaves the value in the core's caches for
//! a caller that reads it next. Above it, the caches would keep only the value's tail anyway,
//! and the plain copy pays a read of every destination line first. Measured (C, five 10 MiB
//! values copied from a 250 MiB source into a pre-faulted 50 MiB destination, one core,
//! 2026-12-04 21:50 UTC, load 0.6): `memcpy` 7.1-7.5 ms, 16-byte streaming stores 5.3-6.2 ms
//! after a first pass of 7.8 ms.

use std::mem::MaybeUninit;

/// Copies shorter than this are plain ones.
pub const STREAM_FROM: usize = 256 << 10;

/// A hit's copies of at least this many bytes stream: twice the largest per-core L2 of
/// current server CPUs (2 MiB), so that a plain copy would not leave the value in cache.
pub const HIT_STREAM_FROM: usize = 4 << 20;

/// Whether a hit's copy of `len` bytes into the caller's memory streams (see above).
pub fn streams_hit(len: usize) -> bool {
    len >= HIT_STREAM_FROM
}

/// Copies `src` into `dst` (of the same length), with non-temporal stores when it is at least
/// [`STREAM_FROM`] bytes on x86_64; the bytes are in `dst` when it returns, as after a plain
/// copy (the stores are fenced).
///
/// # Panics
/// When the lengths differ.
pub fn copy_streaming(dst: &mut [MaybeUninit<u8>], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "a streaming copy between slices of different lengths");
    #[cfg(target_arch = "x86_64")]
    if src.len() >= STREAM_FROM {
        x86::copy(dst, src);
        return;
    }
    dst.write_copy_of_slice(src);
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
    use std::mem::MaybeUninit;

    /// Bytes one round of the loop moves (four 16-byte stores: one cache line).
    const LINE: usize = 64;

    pub(super) fn copy(dst: &mut [MaybeUninit<u8>], src: &[u8]) {
        let n = src.len();
        // Up to the destination's first 64-byte boundary with a plain copy, so that every
        // streamed line is whole and every store aligned.
        let head = (dst.as_ptr() as usize).next_multiple_of(LINE) - dst.as_ptr() as usize;
        let head = head.min(n);
        dst[..head].write_copy_of_slice(&src[..head]);
        let body = (n - head) / LINE * LINE;
        let (d, s) = (dst[head..].as_mut_ptr() as *mut __m128i, src[head..].as_ptr() as *const __m128i);
        for i in (0..body / 16).step_by(4) {
            // SAFETY: SSE2 is part of x86_64. `i + 3 < body / 16`, so the four 16-byte loads
            // read `src[head + 16 i .. head + 16 (i + 4))`, inside `src` (unaligned loads),
            // and the four stores write the same range of `dst`, inside it and 16-byte aligned
            // (`dst[head..]` starts on a 64-byte boundary). `dst` is borrowed mutably, so
            // nothing else reads or writes it meanwhile.
            unsafe {
                let (a, b) = (_mm_loadu_si128(s.add(i)), _mm_loadu_si128(s.add(i + 1)));
                let (c, e) = (_mm_loadu_si128(s.add(i + 2)), _mm_loadu_si128(s.add(i + 3)));
                _mm_stream_si128(d.add(i), a);
                _mm_stream_si128(d.add(i + 1), b);
                _mm_stream_si128(d.add(i + 2), c);
                _mm_stream_si128(d.add(i + 3), e);
            }
        }
        // SAFETY: SSE2 is part of x86_64. The fence orders the streaming stores before every
        // later store, so that whoever this thread hands `dst` to sees the bytes (streaming
        // stores are weakly ordered).
        unsafe { _mm_sfence() };
        dst[head + body..].write_copy_of_slice(&src[head + body..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every length and alignment around the threshold and the 64-byte lines gives the bytes a
    /// plain copy gives, and writes nothing outside the destination.
    #[test]
    fn a_streaming_copy_equals_a_plain_one_at_odd_sizes_and_alignments() {
        let max = STREAM_FROM + 4096;
        let src: Vec<u8> = (0..max + 64).map(|i| (i * 7 + i / 251) as u8).collect();
        let lens = [0, 1, 63, 64, 65, 4095, STREAM_FROM - 1, STREAM_FROM, STREAM_FROM + 1, STREAM_FROM + 63, max];
        for len in lens {
            for src_at in [0, 1, 15, 17, 63] {
                for dst_at in [0, 1, 8, 16, 33, 63] {
                    // Guard bytes on both sides of the destination.
                    let mut buf = vec![MaybeUninit::new(0xA5u8); len + 128];
                    copy_streaming(&mut buf[dst_at..dst_at + len], &src[src_at..src_at + len]);
                    // SAFETY: every byte of `buf` was initialised above, and the copy writes only
                    // initialised bytes.
                    let buf: Vec<u8> = buf.into_iter().map(|b| unsafe { b.assume_init() }).collect();
                    assert!(buf[..dst_at].iter().all(|&b| b == 0xA5), "len {len} at {src_at}/{dst_at}");
                    assert!(buf[dst_at..dst_at + len] == src[src_at..src_at + len], "len {len} at {src_at}/{dst_at}");
                    assert!(buf[dst_at + len..].iter().all(|&b| b == 0xA5), "len {len} at {src_at}/{dst_at}");
                }
            }
        }
    }
}
