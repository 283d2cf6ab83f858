//! Pinned host bounce buffers: where device memory is staged for a transport that can only
//! move host memory (tcp). Pinning is slow, so buffers are kept and reused.

use std::sync::Arc;

use parking_lot::Mutex;

use super::Driver;
use crate::TransportError;

/// Smallest buffer allocated (smaller requests share this size, so buffers are reusable).
const MIN_BUFFER: u64 = 64 << 10;
/// Free buffers kept at most, in bytes; more are given back to the driver.
const KEEP_BYTES: u64 = 256 << 20;

/// A driver's free bounce buffers.
#[derive(Debug, Default)]
pub(super) struct Pool {
    free: Mutex<Vec<(u64, u64)>>,
}

impl Pool {
    /// Takes every free buffer's address (for the driver to free them).
    pub(super) fn drain(&mut self) -> Vec<u64> {
        self.free.get_mut().drain(..).map(|(addr, _)| addr).collect()
    }
}

/// A pinned host buffer of at least the length asked for; back to its driver's pool when dropped.
#[derive(Debug)]
pub struct Bounce {
    driver: Arc<Driver>,
    addr: u64,
    capacity: u64,
}

impl Bounce {
    /// Its first byte's address.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Its size in bytes (at least the length asked for).
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Its first `len` bytes (at most its capacity), for a socket to read.
    pub fn bytes(&self, len: u64) -> &[u8] {
        let len = len.min(self.capacity) as usize;
        // SAFETY: host memory the driver pinned for this buffer, owned by it until dropped;
        // the device copies into it are complete when `Driver::copy` returns.
        unsafe { std::slice::from_raw_parts(self.addr as *const u8, len) }
    }

    /// Its first `len` bytes (at most its capacity), for a socket to fill.
    pub fn bytes_mut(&mut self, len: u64) -> &mut [u8] {
        let len = len.min(self.capacity) as usize;
        // SAFETY: as in `bytes`; `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.addr as *mut u8, len) }
    }
}

impl Drop for Bounce {
    fn drop(&mut self) {
        let pool = &self.driver.bounce;
        let mut free = pool.free.lock();
        let kept: u64 = free.iter().map(|(_, c)| c).sum();
        if kept + self.capacity <= KEEP_BYTES {
            free.push((self.addr, self.capacity));
            return;
        }
        drop(free);
        if let Err(e) = self.driver.api().free_pinned(self.addr) {
            tracing::warn!("device memory: freeing a pinned bounce buffer failed: {e}");
        }
    }
}

/// See [`Driver::bounce`]: the smallest free buffer that holds `len` bytes, else a new one.
pub(super) fn take(driver: &Arc<Driver>, len: u64) -> Result<Bounce, TransportError> {
    {
        let mut free = driver.bounce.free.lock();
        let best = free.iter().enumerate().filter(|(_, (_, c))| *c >= len).min_by_key(|(_, (_, c))| *c).map(|(i, _)| i);
        if let Some(i) = best {
            let (addr, capacity) = free.swap_remove(i);
            return Ok(Bounce { driver: driver.clone(), addr, capacity });
        }
    }
    let capacity = len.max(MIN_BUFFER).next_power_of_two();
    let addr = driver.api().alloc_pinned(capacity)?;
    Ok(Bounce { driver: driver.clone(), addr, capacity })
}
