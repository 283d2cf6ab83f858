//! Small socket helpers shared by both sides of the tcp transport.

use std::io::{self, IoSlice, Read, Write};

use super::frame::HEADER_LEN;

pub(super) enum HeaderRead {
    Header,
    Closed,
}

/// Reads one header. A clean close or an idle read timeout at a frame boundary is not an
/// error (idle connections are normal); a close or a stall in the middle of a header is.
pub(super) fn read_header(stream: &mut impl Read, buf: &mut [u8; HEADER_LEN]) -> io::Result<HeaderRead> {
    read_header_from(stream, buf, 0)
}

/// [`read_header`] when the first `filled` bytes of `buf` are already there.
pub(super) fn read_header_from(
    stream: &mut impl Read,
    buf: &mut [u8; HEADER_LEN],
    mut filled: usize,
) -> io::Result<HeaderRead> {
    while filled < HEADER_LEN {
        match stream.read(&mut buf[filled..]) {
            Ok(0) if filled == 0 => return Ok(HeaderRead::Closed),
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("truncated frame header ({filled} of {HEADER_LEN} bytes)"),
                ))
            }
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if filled == 0 && matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(HeaderRead::Header)
}

/// Reads and drops `len` bytes (the payload of a rejected request), keeping the stream in sync.
pub(super) fn discard(stream: &mut impl Read, mut len: u64) -> io::Result<()> {
    let mut scratch = [0u8; 16 * 1024];
    while len > 0 {
        let n = len.min(scratch.len() as u64) as usize;
        stream.read_exact(&mut scratch[..n])?;
        len -= n as u64;
    }
    Ok(())
}

/// Writes every byte of `bufs`, gathering with `writev`.
pub(super) fn write_all_vectored(stream: &mut impl Write, mut bufs: &mut [IoSlice<'_>]) -> io::Result<()> {
    IoSlice::advance_slices(&mut bufs, 0);
    while !bufs.is_empty() {
        match stream.write_vectored(bufs) {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::WriteZero, "peer stopped accepting bytes")),
            Ok(n) => IoSlice::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
