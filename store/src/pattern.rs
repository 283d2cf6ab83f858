//! A deterministic byte pattern keyed by position, so that a reader can check that every byte
//! arrived from the right place (no block is periodic with any power-of-two size).

/// The byte expected at `offset` of a buffer filled with `seed`.
#[inline]
pub fn byte_at(seed: u64, offset: u64) -> u8 {
    let x = (offset ^ seed.rotate_left(17)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (x >> 56) as u8 ^ (offset >> 12) as u8
}

/// Fills `buf` with the pattern of `seed` as it runs from `base_offset` on: `buf[i]` becomes
/// [`byte_at`]`(seed, base_offset + i)`, so a piece of a value is filled as it lies in the whole.
pub fn fill(buf: &mut [u8], seed: u64, base_offset: u64) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = byte_at(seed, base_offset + i as u64);
    }
}

/// The first offset where `buf` differs from the pattern, if any. Compares the bytes `buf`
/// has, wherever they lie in the value: a whole value is checked with [`value_mismatch`],
/// which also checks its length.
pub fn first_mismatch(buf: &[u8], seed: u64, base_offset: u64) -> Option<u64> {
    buf.iter()
        .enumerate()
        .find(|(i, b)| **b != byte_at(seed, base_offset + *i as u64))
        .map(|(i, _)| base_offset + i as u64)
}

/// How a value differs from the one it should be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mismatch {
    /// Another length: truncated (`got < want`) or over-long.
    Length {
        /// The value's length, in bytes.
        got: u64,
        /// The length it should have.
        want: u64,
    },
    /// The first byte that differs.
    Byte(u64),
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Mismatch::Length { got, want } => write!(f, "{got} bytes instead of {want}"),
            Mismatch::Byte(at) => write!(f, "byte {at} differs from the pattern"),
        }
    }
}

/// Whether `buf` is the whole value of `len` bytes filled with `seed` (`None`: it is).
pub fn value_mismatch(buf: &[u8], seed: u64, len: u64) -> Option<Mismatch> {
    if buf.len() as u64 != len {
        return Some(Mismatch::Length { got: buf.len() as u64, want: len });
    }
    first_mismatch(buf, seed, 0).map(Mismatch::Byte)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shifted_blocks_do_not_match() {
        let mut a = vec![0u8; 4096];
        fill(&mut a, 1, 0);
        assert_eq!(first_mismatch(&a, 1, 0), None);
        assert!(first_mismatch(&a, 1, 4096).is_some(), "a block read from the wrong offset is caught");
        assert!(first_mismatch(&a, 2, 0).is_some(), "another seed is caught");
    }

    #[test]
    fn a_value_of_another_length_is_a_mismatch() {
        let mut a = vec![0u8; 5000];
        fill(&mut a, 3, 0);
        assert_eq!(value_mismatch(&a, 3, 5000), None);
        assert_eq!(value_mismatch(&a[..4096], 3, 5000), Some(Mismatch::Length { got: 4096, want: 5000 }), "truncated");
        let mut longer = a.clone();
        longer.push(byte_at(3, 5000));
        assert_eq!(value_mismatch(&longer, 3, 5000), Some(Mismatch::Length { got: 5001, want: 5000 }), "over-long");
        a[77] ^= 1;
        assert_eq!(value_mismatch(&a, 3, 5000), Some(Mismatch::Byte(77)));
    }
}
