//! A deterministic byte pattern keyed by position, so that a reader can check that every byte
//! arrived from the right place (no block is periodic with any power-of-two size).

/// The byte expected at `offset` of a buffer filled with `seed`.
#[inline]
pub fn byte_at(seed: u64, offset: u64) -> u8 {
    let x = (offset ^ seed.rotate_left(17)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (x >> 56) as u8 ^ (offset >> 12) as u8
}

pub fn fill(buf: &mut [u8], seed: u64, base_offset: u64) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = byte_at(seed, base_offset + i as u64);
    }
}

/// The first offset where `buf` differs from the pattern, if any.
pub fn first_mismatch(buf: &[u8], seed: u64, base_offset: u64) -> Option<u64> {
    buf.iter()
        .enumerate()
        .find(|(i, b)| **b != byte_at(seed, base_offset + *i as u64))
        .map(|(i, _)| base_offset + i as u64)
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
}
