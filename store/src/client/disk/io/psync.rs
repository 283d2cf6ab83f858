//! The plain engine: `pwritev` until every byte is written, then `fdatasync` when asked.

use std::fs::File;
use std::io::{self, IoSlice};

use super::{EngineKind, IoEngine};

/// Plain system calls, one by one.
#[derive(Debug, Default, Clone, Copy)]
pub struct Psync;

impl IoEngine for Psync {
    fn write_all(&mut self, file: &File, slices: &[IoSlice<'_>], then_sync: bool) -> io::Result<()> {
        write_at(file, slices, 0)?;
        if then_sync {
            file.sync_data()?;
        }
        Ok(())
    }

    fn sync_data(&mut self, file: &File) -> io::Result<()> {
        file.sync_data()
    }

    fn kind(&self) -> EngineKind {
        EngineKind::Psync
    }
}

/// Writes every byte of `slices` at `offset` of `file` (short writes continued, `EINTR`
/// retried).
pub(super) fn write_at(file: &File, slices: &[IoSlice<'_>], mut offset: u64) -> io::Result<()> {
    let mut owned = slices.to_vec();
    let mut left = &mut owned[..];
    // (Leading empty slices go, so that nothing but bytes is ever asked for.)
    IoSlice::advance_slices(&mut left, 0);
    while !left.is_empty() {
        match rustix::io::pwritev(file, left, offset) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                offset += n as u64;
                IoSlice::advance_slices(&mut left, n);
            }
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_slice_lands_in_order_from_the_start_and_empty_ones_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![7u8; 20]).unwrap();
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        let (a, b) = (b"0123".to_vec(), b"456789".to_vec());
        Psync.write_all(&f, &[IoSlice::new(&[]), IoSlice::new(&a), IoSlice::new(&b)], true).unwrap();
        let mut want = b"0123456789".to_vec();
        want.extend([7u8; 10]);
        assert_eq!(std::fs::read(&path).unwrap(), want, "written over the start, the rest untouched");
        let read_only = File::open(&path).unwrap();
        assert!(Psync.write_all(&read_only, &[IoSlice::new(&a)], false).is_err());
    }
}
