//! Cutting a transfer request into slices: each slice lies inside one local and one remote
//! registered region and is no longer than the transport's maximum slice length.

/// One piece of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    pub local_addr: u64,
    pub remote_addr: u64,
    pub len: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CutError {
    /// `[addr, +len)` of the request's local side is not registered.
    Local {
        addr: u64,
        len: u64,
    },
    /// The remote side is not inside the target's registered memory.
    Remote {
        addr: u64,
        len: u64,
    },
    Empty,
}

/// Cuts `[local, +len)` ↔ `[remote, +len)` into pieces of at most `max` bytes, also at every
/// region boundary. `local_end(a)` / `remote_end(a)` give the end of the registered region that
/// contains `a`, if any; adjacent regions may thus be spanned, gaps may not.
pub fn cut(
    local: u64,
    remote: u64,
    len: u64,
    max: u64,
    local_end: impl Fn(u64) -> Option<u64>,
    remote_end: impl Fn(u64) -> Option<u64>,
) -> Result<Vec<Piece>, CutError> {
    assert!(max > 0, "maximum slice length must be positive");
    if len == 0 {
        return Err(CutError::Empty);
    }
    // Both sides must lie in registered memory before anything is sized from `len` (which
    // comes from the caller, and may be 2^63): walking region by region costs one step per
    // region, and afterwards `len` is bounded by memory that exists.
    covered(local, len, &local_end).map_err(|(addr, len)| CutError::Local { addr, len })?;
    covered(remote, len, &remote_end).map_err(|(addr, len)| CutError::Remote { addr, len })?;
    let mut pieces = Vec::new();
    let mut done = 0;
    while done < len {
        let (l, r) = (local + done, remote + done);
        let le = local_end(l).filter(|&e| e > l).ok_or(CutError::Local { addr: l, len: len - done })?;
        let re = remote_end(r).filter(|&e| e > r).ok_or(CutError::Remote { addr: r, len: len - done })?;
        let n = (len - done).min(max).min(le - l).min(re - r);
        pieces.push(Piece { local_addr: l, remote_addr: r, len: n });
        done += n;
    }
    Ok(pieces)
}

/// Checks that `[start, +len)` lies in regions as `end_of` tells them; the first uncovered
/// address and the length left from it otherwise.
fn covered(start: u64, len: u64, end_of: &impl Fn(u64) -> Option<u64>) -> Result<(), (u64, u64)> {
    let end = start.checked_add(len).ok_or((start, len))?;
    let mut at = start;
    while at < end {
        at = end_of(at).filter(|&e| e > at).ok_or((at, end - at))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ends(regions: &'static [(u64, u64)]) -> impl Fn(u64) -> Option<u64> {
        move |a| regions.iter().find(|(s, l)| a >= *s && a < s + l).map(|(s, l)| s + l)
    }

    #[test]
    fn cuts_at_max_len() {
        let p = cut(0x1000, 0x9000, 10, 4, ends(&[(0x1000, 100)]), ends(&[(0x9000, 100)])).unwrap();
        assert_eq!(p.iter().map(|p| p.len).collect::<Vec<_>>(), vec![4, 4, 2]);
        assert_eq!(p[1], Piece { local_addr: 0x1004, remote_addr: 0x9004, len: 4 });
    }

    #[test]
    fn cuts_at_both_sides_region_boundaries() {
        // local regions [0x1000,+6) [0x1006,+100); remote [0x9000,+3) [0x9003,+100)
        let p = cut(0x1000, 0x9000, 10, 64, ends(&[(0x1000, 6), (0x1006, 100)]), ends(&[(0x9000, 3), (0x9003, 100)]))
            .unwrap();
        assert_eq!(p.iter().map(|p| p.len).collect::<Vec<_>>(), vec![3, 3, 4]);
    }

    #[test]
    fn gaps_and_empty_requests_fail() {
        assert_eq!(
            cut(0x1000, 0x9000, 20, 64, ends(&[(0x1000, 10)]), ends(&[(0x9000, 100)])),
            Err(CutError::Local { addr: 0x100a, len: 10 })
        );
        assert_eq!(
            cut(0x1000, 0x9000, 20, 64, ends(&[(0x1000, 100)]), ends(&[(0x9000, 19)])),
            Err(CutError::Remote { addr: 0x9013, len: 1 })
        );
        assert_eq!(cut(0x1000, 0x9000, 0, 64, ends(&[(0x1000, 100)]), ends(&[(0x9000, 100)])), Err(CutError::Empty));
        assert!(matches!(
            cut(u64::MAX - 1, 0x9000, 4, 64, |_| Some(u64::MAX), ends(&[(0x9000, 100)])),
            Err(CutError::Local { .. })
        ));
    }

    #[test]
    fn absurd_lengths_are_refused_before_anything_is_sized() {
        let regions = ends(&[(0x1000, 1 << 20)]);
        for len in [1u64 << 63, (1 << 20) + 1] {
            assert_eq!(
                cut(0x1000, 0x1000, len, 1, &regions, &regions),
                Err(CutError::Local { addr: 0x1000 + (1 << 20), len: len - (1 << 20) }),
                "{len}"
            );
        }
        assert!(matches!(cut(0x1000, 0x1000, u64::MAX, 1, &regions, &regions), Err(CutError::Local { .. })));
        assert!(matches!(cut(0x1000, u64::MAX - 4, 8, 1, &regions, |_| Some(u64::MAX)), Err(CutError::Remote { .. })));
    }

    proptest! {
        #[test]
        fn pieces_tile_the_request(len in 1u64..10_000, max in 1u64..3000, split in 0u64..10_000) {
            let local_split = 0x10_000 + split;
            let le = move |a: u64| if (0x10_000..local_split).contains(&a) { Some(local_split) } else if (local_split..0x30_000).contains(&a) { Some(0x30_000) } else { None };
            let pieces = cut(0x10_000, 0x50_000, len, max, le, |a| (0x50_000..0x60_000).contains(&a).then_some(0x60_000)).unwrap();
            let mut next = 0x10_000;
            for p in &pieces {
                prop_assert_eq!(p.local_addr, next);
                prop_assert_eq!(p.remote_addr - 0x50_000, p.local_addr - 0x10_000);
                prop_assert!(p.len >= 1 && p.len <= max);
                prop_assert!(!(p.local_addr < local_split && p.local_addr + p.len > local_split), "crosses a boundary");
                next += p.len;
            }
            prop_assert_eq!(next, 0x10_000 + len);
        }
    }
}
