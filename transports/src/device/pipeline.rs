//! Device memory moved through a socket in chunks, so that the driver's copy of one chunk
//! overlaps the socket's transfer of the one before: the copy off the device of chunk `i + 1`
//! runs while chunk `i` is sent, and the copy onto the device of chunk `i` while chunk `i + 1`
//! is received. At most [`DEPTH`] pinned bounce buffers of [`CHUNK`] bytes are used per
//! transfer, each reused once the copy out of (or into) it has ended.

use std::io;

use super::{Bounce, Copying, DeviceMemory};

/// Bytes per chunk.
pub const CHUNK: u64 = 256 << 10;
/// Bounce buffers in flight per transfer (one being copied while the other is on the socket).
pub const DEPTH: usize = 2;

fn driver_error(e: crate::TransportError) -> io::Error {
    io::Error::other(e)
}

/// How a move of `len` bytes is cut: `chunks` of [`CHUNK`] bytes (the last shorter), at most
/// `depth` of them in flight, each in flight in its own bounce buffer (`buffers[i % depth]`).
struct Stages {
    len: u64,
    chunks: u64,
    depth: usize,
    /// The copy running into or out of each buffer. Declared before the buffers: fields drop
    /// in order, so copies still running (after an error) end before their buffers go back
    /// to the pool.
    copies: Vec<Option<Copying>>,
    buffers: Vec<Bounce>,
}

impl Stages {
    fn new(memory: &DeviceMemory, len: u64) -> io::Result<Stages> {
        let chunks = len.div_ceil(CHUNK);
        let depth = DEPTH.min(chunks as usize);
        let buffers = (0..depth).map(|_| memory.driver.bounce(CHUNK.min(len))).collect::<Result<Vec<_>, _>>();
        let buffers = buffers.map_err(driver_error)?;
        Ok(Stages { len, chunks, depth, copies: (0..depth).map(|_| None).collect(), buffers })
    }

    /// Chunk `i`'s length.
    fn chunk_len(&self, i: u64) -> u64 {
        CHUNK.min(self.len - i * CHUNK)
    }

    /// Chunk `i`'s buffer slot, once the copy last running through it has ended.
    fn free_slot(&mut self, i: u64) -> io::Result<usize> {
        let slot = (i % self.depth as u64) as usize;
        if let Some(copy) = self.copies[slot].take() {
            copy.wait().map_err(driver_error)?;
        }
        Ok(slot)
    }
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
    let mut st = Stages::new(memory, len)?;
    let start = |st: &Stages, i: u64| {
        let b = &st.buffers[(i % st.depth as u64) as usize];
        driver.copy_start(device, b.addr(), addr + i * CHUNK, st.chunk_len(i)).map_err(driver_error)
    };
    for i in 0..st.depth as u64 {
        st.copies[i as usize] = Some(start(&st, i)?);
    }
    for i in 0..st.chunks {
        let slot = st.free_slot(i)?;
        send(st.buffers[slot].bytes(st.chunk_len(i)))?;
        if i + (st.depth as u64) < st.chunks {
            st.copies[slot] = Some(start(&st, i + st.depth as u64)?);
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
    let mut st = Stages::new(memory, len)?;
    for i in 0..st.chunks {
        // The buffer's last copy onto the device must have ended before it is refilled.
        let slot = st.free_slot(i)?;
        let n = st.chunk_len(i);
        recv(st.buffers[slot].bytes_mut(n))?;
        let copy = driver.copy_start(device, addr + i * CHUNK, st.buffers[slot].addr(), n).map_err(driver_error)?;
        st.copies[slot] = Some(copy);
    }
    for i in 0..st.depth as u64 {
        st.free_slot(i)?;
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
