//! Where a value's bytes come from (a put) and where they go (a get): scatter/gather lists.
//!
//! A put reads its value from a `Src`: plain bytes (in one slice or in parts), or pieces of
//! registered memory taken in order (the value is their concatenation). A get writes into a `Dst`: plain bytes, or
//! extents of registered memory, each receiving one range of the value. A plain `get_into` is
//! one extent taking the whole value; a ranged or multi-buffer get is several; a byte `get` is
//! plain bytes. Every source of a read (a local replica, the hot cache, a remote replica, a
//! disk file) fills any of them, so ranges and layouts are no separate code path.

use std::mem::MaybeUninit;

use crescent_engine::{EngineError, TransferEngine};

use crate::error::{Result, StoreError};

/// `len` bytes of memory at `addr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// Its first byte, a virtual address of this process (registered memory for the
    /// zero-copy calls).
    pub addr: u64,
    /// Its length, in bytes.
    pub len: u64,
}

impl Piece {
    /// The `len` bytes at `addr`.
    pub fn new(addr: u64, len: u64) -> Piece {
        Piece { addr, len }
    }
}

/// One range of a value, `[offset, offset + len)`, read into memory at `addr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// Where the range starts in the value.
    pub offset: u64,
    /// Where the range goes: a virtual address of this process, registered memory.
    pub addr: u64,
    /// The range's length, in bytes.
    pub len: u64,
}

/// The total length of `pieces`, or `None` if it does not fit 64 bits.
pub(crate) fn total(pieces: &[Piece]) -> Option<u64> {
    pieces.iter().try_fold(0u64, |n, p| n.checked_add(p.len))
}

/// The extents that take a whole value of `size` bytes into `pieces` in order (the pieces may
/// hold more; what is past the value is left alone).
pub(crate) fn whole(pieces: &[Piece], size: u64) -> Vec<Extent> {
    let mut out = Vec::with_capacity(pieces.len());
    let mut offset = 0;
    for p in pieces {
        if offset == size {
            break;
        }
        let len = p.len.min(size - offset);
        if len > 0 {
            out.push(Extent { offset, addr: p.addr, len });
        }
        offset += len;
    }
    out
}

/// Checks that every range lies inside a value of `size` bytes (one past its end is the
/// caller's mistake); returns how many bytes they take.
pub(crate) fn check_ranges(key: &str, ranges: &[Extent], size: u64) -> Result<u64> {
    let mut n = 0u64;
    for e in ranges {
        if e.offset.checked_add(e.len).is_none_or(|end| end > size) {
            return Err(StoreError::BadRange { key: key.to_string(), offset: e.offset, len: e.len, size });
        }
        n = n.checked_add(e.len).ok_or_else(|| StoreError::invalid(format!("ranges of {key:?} longer than 2^64")))?;
    }
    Ok(n)
}

/// How the client reaches the caller's registered memory: host memory with the CPU, device
/// (GPU) memory registered with the engine only through the device layer's copies (the CPU
/// never dereferences a device pointer). [`Reach::host`] (no engine): every piece is host
/// memory, as for memory the client allocated itself.
#[derive(Clone, Copy, Default)]
pub(crate) struct Reach<'e>(Option<&'e TransferEngine>);

impl<'e> Reach<'e> {
    /// Memory that is host memory throughout.
    pub(crate) fn host() -> Reach<'static> {
        Reach(None)
    }

    /// The reach of the `(address, length)` pieces given: through `engine`'s registrations
    /// when one of them is device memory, else [`Reach::host`] (nothing to look up later).
    pub(crate) fn of(engine: &'e TransferEngine, pieces: impl IntoIterator<Item = (u64, u64)>) -> Reach<'e> {
        let device = pieces.into_iter().any(|(addr, len)| len > 0 && engine.local_device_memory(addr, len).is_some());
        Reach(device.then_some(engine))
    }

    /// Whether some of the memory is device memory.
    pub(crate) fn has_device(&self) -> bool {
        self.0.is_some()
    }

    /// The driver and device of `[addr, +len)` when it is device memory.
    fn device(&self, addr: u64, len: u64) -> Option<crescent_transports::device::DeviceMemory> {
        self.0?.local_device_memory(addr, len)
    }

    /// Copies host bytes `src` to the caller's memory at `addr` (host-to-device on a device).
    pub(crate) fn write(&self, addr: u64, src: &[u8]) -> Result<()> {
        let len = src.len() as u64;
        if len == 0 {
            return Ok(());
        }
        match self.device(addr, len) {
            Some(m) => m.driver.copy(m.allocation.device, addr, src.as_ptr() as u64, len).map_err(device_copy),
            None => {
                // SAFETY: host memory the caller registered (or lent) for this call, checked at
                // the call's entry; nothing else writes it during the call.
                unsafe { raw_out(addr, len) }.write_copy_of_slice(src);
                Ok(())
            }
        }
    }

    /// Copies the caller's memory at `addr` into host memory `dst` (device-to-host on a device).
    pub(crate) fn read(&self, addr: u64, dst: &mut [u8]) -> Result<()> {
        let len = dst.len() as u64;
        if len == 0 {
            return Ok(());
        }
        match self.device(addr, len) {
            Some(m) => m.driver.copy(m.allocation.device, dst.as_mut_ptr() as u64, addr, len).map_err(device_copy),
            None => {
                // SAFETY: host memory the caller registered for this call (checked at the call's
                // entry) and keeps valid and unchanged during it.
                dst.copy_from_slice(unsafe { std::slice::from_raw_parts(addr as *const u8, len as usize) });
                Ok(())
            }
        }
    }
}

/// A copy of the device layer that failed (the driver's error, in the engine's terms).
fn device_copy(e: crescent_transports::TransportError) -> StoreError {
    StoreError::Engine(EngineError::Transport(e))
}

/// A put's value.
#[derive(Clone, Copy)]
pub(crate) enum Src<'a> {
    /// Plain memory: moved through the staging buffer.
    Bytes(&'a [u8]),
    /// Plain memory in parts, one after another (Mooncake's `put_parts`): moved through the
    /// staging buffer, gathered as it is copied there.
    Parts(&'a [&'a [u8]]),
    /// Registered memory, piece after piece: moved by the engine directly (zero copy); the
    /// client reaches it itself (its own replica, the disk tier) as [`Reach`] says.
    Registered(&'a [Piece], Reach<'a>),
}

impl Src<'_> {
    pub(crate) fn len(&self) -> u64 {
        match self {
            Src::Bytes(b) => b.len() as u64,
            Src::Parts(parts) => parts.iter().map(|p| p.len() as u64).sum(),
            Src::Registered(pieces, _) => total(pieces).unwrap_or(u64::MAX),
        }
    }

    /// Whether the value is plain memory, which the engine moves only through the staging
    /// buffer.
    pub(crate) fn is_plain(&self) -> bool {
        matches!(self, Src::Bytes(_) | Src::Parts(_))
    }

    /// The value's bytes `[off, off + dst.len())`, gathered into `dst` (host memory).
    pub(crate) fn copy_to(&self, off: u64, dst: &mut [u8]) -> Result<()> {
        match self {
            Src::Bytes(b) => dst.copy_from_slice(&b[off as usize..off as usize + dst.len()]),
            Src::Parts(parts) => {
                let end = off + dst.len() as u64;
                let mut at = 0u64;
                for p in parts.iter() {
                    let n = p.len() as u64;
                    let (lo, hi) = (at.max(off), (at + n).min(end));
                    if lo < hi {
                        dst[(lo - off) as usize..(hi - off) as usize]
                            .copy_from_slice(&p[(lo - at) as usize..(hi - at) as usize]);
                    }
                    at += n;
                }
            }
            Src::Registered(pieces, reach) => {
                let end = off + dst.len() as u64;
                let mut at = 0u64;
                for p in pieces.iter() {
                    let (lo, hi) = (at.max(off), (at + p.len).min(end));
                    if lo < hi {
                        // The caller registered this piece and keeps it valid and unchanged
                        // for the put (checked registered before the put starts).
                        reach.read(p.addr + lo - at, &mut dst[(lo - off) as usize..(hi - off) as usize])?;
                    }
                    at += p.len;
                }
            }
        }
        Ok(())
    }

    /// The value as one slice when it is in one piece of host memory.
    pub(crate) fn contiguous(&self) -> Option<&[u8]> {
        match self {
            Src::Bytes(b) | Src::Parts([b]) => Some(b),
            Src::Parts(_) => None,
            Src::Registered(_, reach) if reach.has_device() => None,
            Src::Registered([p], _) => {
                // SAFETY: as in `copy_to`: the caller's registered memory, valid during the put.
                Some(unsafe { std::slice::from_raw_parts(p.addr as *const u8, p.len as usize) })
            }
            Src::Registered(..) => None,
        }
    }

    /// The value in one slice of host memory: itself, or gathered into `scratch` (device
    /// memory copied from the device).
    pub(crate) fn gathered<'s>(&'s self, scratch: &'s mut Vec<u8>) -> Result<&'s [u8]> {
        if let Some(b) = self.contiguous() {
            return Ok(b);
        }
        scratch.resize(self.len() as usize, 0);
        self.copy_to(0, scratch)?;
        Ok(scratch)
    }

    /// `(address, offset in the value, length)` of each registered piece (none for bytes).
    pub(crate) fn registered_pieces(&self) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
        let pieces: &[Piece] = match self {
            Src::Registered(p, _) => p,
            Src::Bytes(_) | Src::Parts(_) => &[],
        };
        pieces.iter().filter(|p| p.len > 0).scan(0u64, |at, p| {
            let off = *at;
            *at += p.len;
            Some((p.addr, off, p.len))
        })
    }
}

/// Where a get's bytes go.
pub(crate) enum Dst<'a> {
    /// Plain memory holding the value's range from `offset` on: filled through the staging
    /// buffer, the hot cache's blocks or a loan to the engine. It need not have been written
    /// before (a byte get's fresh vector is neither zeroed nor faulted in first): every source
    /// writes all of it or fails, and it is read only once a source has written it.
    Bytes { out: &'a mut [MaybeUninit<u8>], offset: u64 },
    /// Registered (or lent) memory: the engine writes the extents directly; the client
    /// reaches them itself (a local replica, a cache hit, a disk file) as [`Reach`] says.
    Registered(&'a [Extent], Reach<'a>),
}

impl Dst<'_> {
    /// The extents of the value this destination takes, with where each goes.
    pub(crate) fn extents(&mut self) -> Vec<Extent> {
        match self {
            Dst::Bytes { out, offset } => {
                vec![Extent { offset: *offset, addr: out.as_mut_ptr() as u64, len: out.len() as u64 }]
            }
            Dst::Registered(e, _) => e.to_vec(),
        }
    }

    /// Whether some of the destination is device memory (which the CPU must not touch).
    pub(crate) fn on_device(&self) -> bool {
        matches!(self, Dst::Registered(_, reach) if reach.has_device())
    }

    /// Whether the destination takes exactly the value `[0, size)` in one extent.
    pub(crate) fn whole_in_one(&self, size: u64) -> bool {
        match self {
            Dst::Bytes { out, offset } => *offset == 0 && out.len() as u64 == size,
            Dst::Registered([e], _) => e.offset == 0 && e.len == size,
            Dst::Registered(..) => false,
        }
    }

    /// Whether the destination takes the value `[0, size)` whole (a hot-cache fill needs it).
    pub(crate) fn covers(&self, size: u64) -> bool {
        match self {
            Dst::Bytes { out, offset } => *offset == 0 && out.len() as u64 == size,
            Dst::Registered(extents, _) => {
                let mut e: Vec<(u64, u64)> = extents.iter().map(|x| (x.offset, x.offset + x.len)).collect();
                e.sort_unstable();
                let mut reach = 0;
                for (lo, hi) in e {
                    if lo > reach {
                        return false;
                    }
                    reach = reach.max(hi);
                }
                reach >= size
            }
        }
    }

    /// Writes `src`, the value's bytes from `from` on, into the parts of the destination it
    /// overlaps.
    pub(crate) fn write_at(&mut self, from: u64, src: &[u8]) -> Result<()> {
        let end = from + src.len() as u64;
        match self {
            Dst::Bytes { out, offset } => {
                let (lo, hi) = (from.max(*offset), end.min(*offset + out.len() as u64));
                if lo < hi {
                    out[(lo - *offset) as usize..(hi - *offset) as usize]
                        .write_copy_of_slice(&src[(lo - from) as usize..(hi - from) as usize]);
                }
            }
            Dst::Registered(extents, reach) => {
                for e in extents.iter() {
                    let (lo, hi) = (from.max(e.offset), end.min(e.offset + e.len));
                    if lo < hi {
                        // The caller registered (or lent) [addr, +len) for this call and keeps it
                        // valid; nothing else writes it during the get.
                        reach.write(e.addr + lo - e.offset, &src[(lo - from) as usize..(hi - from) as usize])?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Calls `f(value offset, bytes)` for each part of the destination once the value's bytes
    /// have landed there (to copy them on, e.g. into the hot cache). Only after a read into the
    /// whole destination has succeeded. Device memory is copied to the host for `f` first.
    pub(crate) fn landed(&mut self, mut f: impl FnMut(u64, &[u8])) -> Result<()> {
        match self {
            // SAFETY: the read into all of `out` has succeeded (the contract above), so every
            // byte of it has been written.
            Dst::Bytes { out, offset } => f(*offset, unsafe { out.assume_init_ref() }),
            Dst::Registered(extents, reach) if reach.has_device() => {
                let mut host = Vec::new();
                for e in extents.iter() {
                    host.resize(e.len as usize, 0);
                    reach.read(e.addr, &mut host)?;
                    f(e.offset, &host);
                }
            }
            Dst::Registered(extents, _) => {
                for e in extents.iter() {
                    // SAFETY: the caller registered (or lent) [addr, +len) for this call; the
                    // transfers into it have ended.
                    f(e.offset, unsafe { std::slice::from_raw_parts(e.addr as *const u8, e.len as usize) });
                }
            }
        }
        Ok(())
    }
}

/// `len` bytes at `addr` as memory to write, whether or not it has been written before.
///
/// # Safety
/// `[addr, +len)` must be valid for writes for as long as the slice lives, and nothing else
/// may access it meanwhile.
pub(crate) unsafe fn raw_out<'a>(addr: u64, len: u64) -> &'a mut [MaybeUninit<u8>] {
    // SAFETY: the caller's contract; any bytes are valid `MaybeUninit<u8>`.
    unsafe { std::slice::from_raw_parts_mut(addr as *mut MaybeUninit<u8>, len as usize) }
}

/// Where `[from, from + len)` of a value lands in `extents`: `(local address, offset in the
/// value, length)` of each part that some extent takes.
pub(crate) fn spans(extents: &[Extent], from: u64, len: u64) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
    let end = from + len;
    extents.iter().filter_map(move |e| {
        let (lo, hi) = (from.max(e.offset), end.min(e.offset + e.len));
        (lo < hi).then(|| (e.addr + lo - e.offset, lo, hi - lo))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_whole_value_fills_pieces_in_order_and_leaves_the_rest() {
        let p = [Piece::new(100, 4), Piece::new(200, 10), Piece::new(300, 8)];
        assert_eq!(
            whole(&p, 9),
            vec![Extent { offset: 0, addr: 100, len: 4 }, Extent { offset: 4, addr: 200, len: 5 }]
        );
        assert_eq!(whole(&p, 0), vec![]);
    }

    #[test]
    fn ranges_inside_the_value_are_taken_and_others_refused() {
        let at = |offset, len| Extent { offset, addr: 0x1000, len };
        assert_eq!(check_ranges("k", &[at(3, 4), at(0, 10), at(9, 1), at(10, 0)], 10).unwrap(), 15);
        for bad in [at(7, 4), at(11, 0), at(u64::MAX, 2)] {
            let e = check_ranges("k", &[at(0, 1), bad], 10).unwrap_err();
            assert!(matches!(e, StoreError::BadRange { .. }) && e.is_caller_error(), "{e}");
        }
        let e = check_ranges("k", &[at(0, u64::MAX), at(0, u64::MAX)], u64::MAX).unwrap_err();
        assert!(e.is_caller_error(), "{e}");
    }

    #[test]
    fn sources_gather_and_destinations_scatter_across_pieces() {
        let value: Vec<u8> = (0..32).collect();
        let (a, b) = (value[..10].to_vec(), value[10..].to_vec());
        let pieces = [Piece::new(a.as_ptr() as u64, 10), Piece::new(b.as_ptr() as u64, 22)];
        let src = Src::Registered(&pieces, Reach::host());
        assert_eq!(src.len(), 32);
        assert!(src.contiguous().is_none());
        let mut scratch = Vec::new();
        assert_eq!(src.gathered(&mut scratch).unwrap(), &value[..]);
        let mut mid = [0u8; 6];
        src.copy_to(7, &mut mid).unwrap();
        assert_eq!(&mid, &value[7..13]);
        assert_eq!(src.registered_pieces().map(|(_, off, len)| (off, len)).collect::<Vec<_>>(), [(0, 10), (10, 22)]);

        let (mut x, mut y) = (vec![0u8; 5], vec![0u8; 7]);
        let extents = [
            Extent { offset: 20, addr: y.as_mut_ptr() as u64, len: 7 },
            Extent { offset: 2, addr: x.as_mut_ptr() as u64, len: 5 },
        ];
        let mut dst = Dst::Registered(&extents, Reach::host());
        assert!(!dst.covers(32) && !dst.whole_in_one(32));
        dst.write_at(0, &value[..16]).unwrap();
        dst.write_at(16, &value[16..]).unwrap();
        assert_eq!((&x[..], &y[..]), (&value[2..7], &value[20..27]));
        let got: Vec<(u64, u64, u64)> = spans(&extents, 4, 18).map(|(_, o, l)| (o, l, 0)).collect();
        assert_eq!(got, [(20, 2, 0), (4, 3, 0)]);

        let parts: [&[u8]; 4] = [&value[..3], &[], &value[3..20], &value[20..]];
        let src = Src::Parts(&parts);
        assert_eq!(src.len(), 32);
        assert!(src.is_plain() && src.contiguous().is_none() && src.registered_pieces().next().is_none());
        let mut scratch = Vec::new();
        assert_eq!(src.gathered(&mut scratch).unwrap(), &value[..]);
        let mut mid = [0u8; 19];
        src.copy_to(2, &mut mid).unwrap();
        assert_eq!(&mid, &value[2..21]);

        let mut out: Vec<u8> = Vec::with_capacity(4);
        let mut bytes = Dst::Bytes { out: &mut out.spare_capacity_mut()[..4], offset: 3 };
        bytes.write_at(0, &value[..5]).unwrap();
        bytes.write_at(5, &value[5..10]).unwrap();
        let mut seen = Vec::new();
        bytes.landed(|off, b| seen.push((off, b.to_vec()))).unwrap();
        assert_eq!(seen, [(3, value[3..7].to_vec())]);
    }
}
