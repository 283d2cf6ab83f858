//! Device memory moved through a socket in chunks, so that the driver's copy of one chunk
//! overlaps the socket's transfer of the one before: the copy off the device of chunk `i + 1`
//! runs while chunk `i` is sent, and the copy onto the device of chunk `i` while chunk `i + 1`
//! is received. At most [`DEPTH`] pinned bounce buffers of [`CHUNK`] bytes are used per
//! transfer, each reused once the copy out of (or into) it has ended.

use std::io;

use super::{Copying, DeviceMemory};

/// Bytes per chunk.
pub const CHUNK: u64 = 256 << 10;
/// Bounce buffers in flight per transfer (one being copied while the other is on the socket).
pub const DEPTH: usize = 2;

fn driver_error(e: crate::TransportError) -> io::Error {
    io::Error::other(e)
}

/// Sends the `len` bytes of device memory at `addr` (inside `memory`) with `send`, chunk by
/// chunk, copying each off the device while the one before is sent.
pub fn send_from_device(
    memory: &DeviceMemory,
    addr: u64,
    len: u64,
    mut send: impl FnMut(&[u8]) -> io::Result<()>,
) -> io::Result<()> {
    if len == 0 {
        return Ok(());
    }
    let (driver, device) = (&memory.driver, memory.allocation.device);
    let chunks = len.div_ceil(CHUNK);
    let depth = DEPTH.min(chunks as usize);
    let chunk_len = |i: u64| CHUNK.min(len - i * CHUNK);
    // Declared before the copies, so that copies still running (an error) end before their
    // buffers go back to the pool.
    let buffers = (0..depth).map(|_| driver.bounce(CHUNK.min(len))).collect::<Result<Vec<_>, _>>();
    let buffers = buffers.map_err(driver_error)?;
    let mut copies: Vec<Option<Copying>> = (0..depth).map(|_| None).collect();
    let start = |i: u64| {
        let b = &buffers[(i % depth as u64) as usize];
        driver.copy_start(device, b.addr(), addr + i * CHUNK, chunk_len(i)).map_err(driver_error)
    };
    for i in 0..depth as u64 {
        copies[i as usize] = Some(start(i)?);
    }
    for i in 0..chunks {
        let slot = (i % depth as u64) as usize;
        if let Some(copy) = copies[slot].take() {
            copy.wait().map_err(driver_error)?;
        }
        send(buffers[slot].bytes(chunk_len(i)))?;
        if i + (depth as u64) < chunks {
            copies[slot] = Some(start(i + depth as u64)?);
        }
    }
    Ok(())
}

/// Receives `len` bytes with `recv` into the device memory at `addr` (inside `memory`), chunk
/// by chunk, copying each onto the device while the next is received. Bytes received before
/// an error may have reached the device (as they reach host memory received into directly).
pub fn recv_into_device(
    memory: &DeviceMemory,
    addr: u64,
    len: u64,
    mut recv: impl FnMut(&mut [u8]) -> io::Result<()>,
) -> io::Result<()> {
    if len == 0 {
        return Ok(());
    }
    let (driver, device) = (&memory.driver, memory.allocation.device);
    let chunks = len.div_ceil(CHUNK);
    let depth = DEPTH.min(chunks as usize);
    let chunk_len = |i: u64| CHUNK.min(len - i * CHUNK);
    // As in `send_from_device`: the copies end before their buffers are dropped.
    let buffers = (0..depth).map(|_| driver.bounce(CHUNK.min(len))).collect::<Result<Vec<_>, _>>();
    let mut buffers = buffers.map_err(driver_error)?;
    let mut copies: Vec<Option<Copying>> = (0..depth).map(|_| None).collect();
    for i in 0..chunks {
        let slot = (i % depth as u64) as usize;
        // The buffer's last copy onto the device must have ended before it is refilled.
        if let Some(copy) = copies[slot].take() {
            copy.wait().map_err(driver_error)?;
        }
        let n = chunk_len(i);
        recv(buffers[slot].bytes_mut(n))?;
        let copy = driver.copy_start(device, addr + i * CHUNK, buffers[slot].addr(), n).map_err(driver_error)?;
        copies[slot] = Some(copy);
    }
    for copy in copies.into_iter().flatten() {
        copy.wait().map_err(driver_error)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::mock::Mock;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    fn memory(mock: &Arc<Mock>, base: u64, len: u64) -> DeviceMemory {
        mock.memory(base, len)
    }

    #[test]
    fn every_byte_goes_through_in_order_at_any_size_and_offset_with_bounded_buffers() {
        let big = 3 * CHUNK + 4099;
        let source: Vec<u8> = (0..big + 13).map(|i| (i % 251) as u8).collect();
        for (offset, len) in [(0, 1), (7, CHUNK - 1), (0, CHUNK), (5, CHUNK + 1), (13, big), (1, 2 * CHUNK)] {
            let mock = Arc::new(Mock::default());
            let base = source.as_ptr() as u64;
            let device = memory(&mock, base, source.len() as u64);
            let mut wire = Vec::new();
            let mut sends = 0;
            send_from_device(&device, base + offset, len, |bytes| {
                assert!(bytes.len() as u64 <= CHUNK);
                sends += 1;
                wire.extend_from_slice(bytes);
                Ok(())
            })
            .unwrap();
            assert_eq!(wire, source[offset as usize..(offset + len) as usize], "sent [{offset}, +{len})");
            assert_eq!(sends, len.div_ceil(CHUNK));

            let mut target = vec![0u8; (len + 3) as usize];
            let into = memory(&mock, target.as_ptr() as u64, target.len() as u64);
            let mut at = 0usize;
            recv_into_device(&into, target.as_mut_ptr() as u64 + 3, len, |buf| {
                buf.copy_from_slice(&wire[at..at + buf.len()]);
                at += buf.len();
                Ok(())
            })
            .unwrap();
            assert_eq!(target[3..], wire[..], "received [+3, +{len})");
            assert_eq!(target[..3], [0, 0, 0], "nothing before the range");
            assert_eq!(mock.running.load(Ordering::SeqCst), 0, "every copy waited for");
            assert!(mock.most.load(Ordering::SeqCst) <= DEPTH, "at most {DEPTH} copies at once");
        }
    }

    #[test]
    fn a_socket_error_stops_the_transfer_and_waits_for_the_copies_in_flight() {
        let mock = Arc::new(Mock::default());
        let source = vec![1u8; (4 * CHUNK) as usize];
        let device = memory(&mock, source.as_ptr() as u64, source.len() as u64);
        let mut sends = 0;
        let err = send_from_device(&device, source.as_ptr() as u64, 4 * CHUNK, |_| {
            sends += 1;
            if sends == 2 {
                return Err(io::Error::new(io::ErrorKind::BrokenPipe, "gone"));
            }
            Ok(())
        })
        .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
        assert_eq!(mock.running.load(Ordering::SeqCst), 0, "the copy started ahead was waited for");
    }
}
