//! A driver for the device layer's unit tests: "device memory" is either the test's own host
//! memory (copies are plain `memcpy`) or one made-up address range backed by a vector the CPU
//! never sees through that address (so a transport that touched it would read garbage, not
//! the bytes). Counts the copies started and not yet waited for. The fake CUDA driver
//! (`tests/fake-cuda`) covers the real driver calls across processes.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::{Allocation, DeviceApi, DeviceMemory, Driver, IpcHandle, PendingCopy};
use crate::TransportError;

/// Where the mock's own device range starts, and its length.
pub const BASE: u64 = 0x7e00_0000_0000;
pub const LEN: u64 = 1 << 16;

#[derive(Debug, Default)]
pub struct Mock {
    /// The bytes of `[BASE, BASE + LEN)`, when the mock has its own range.
    pub memory: Option<parking_lot::Mutex<Vec<u8>>>,
    /// Copies started and not yet waited for, and the most at once.
    pub running: AtomicUsize,
    pub most: AtomicUsize,
}

impl Mock {
    /// A mock with its own device range, filled with `i % 251`.
    pub fn with_range() -> Arc<Mock> {
        Arc::new(Mock {
            memory: Some(parking_lot::Mutex::new((0..LEN).map(|i| (i % 251) as u8).collect())),
            ..Mock::default()
        })
    }

    /// Where `[addr, addr + len)` of the mock's own range is in its vector.
    pub fn at(&self, addr: u64, len: u64) -> Option<*mut u8> {
        let memory = self.memory.as_ref()?;
        (addr >= BASE && addr + len <= BASE + LEN).then(|| {
            // SAFETY: inside the vector, which is never resized.
            unsafe { memory.lock().as_mut_ptr().add((addr - BASE) as usize) }
        })
    }

    /// `[base, base + len)` as device memory of this mock.
    pub fn memory(self: &Arc<Self>, base: u64, len: u64) -> DeviceMemory {
        DeviceMemory { driver: Driver::new(Box::new(self.clone())), allocation: Allocation { device: 0, base, len } }
    }

    /// The bytes of the mock's own range (a copy).
    pub fn bytes(&self, from: usize, to: usize) -> Vec<u8> {
        self.memory.as_ref().expect("a mock with its own range").lock()[from..to].to_vec()
    }
}

fn refused(call: &'static str) -> TransportError {
    TransportError::Driver { call, reason: "mock".into() }
}

impl DeviceApi for Arc<Mock> {
    fn vendor(&self) -> &'static str {
        "mock"
    }
    fn device_count(&self) -> Result<u32, TransportError> {
        Ok(1)
    }
    fn allocation(&self, addr: u64) -> Result<Option<Allocation>, TransportError> {
        Ok(self.at(addr, 1).map(|_| Allocation { device: 0, base: BASE, len: LEN }))
    }
    fn copy(&self, _: u32, dst: u64, src: u64, len: u64) -> Result<(), TransportError> {
        let to = self.at(dst, len).unwrap_or(dst as *mut u8);
        let from = self.at(src, len).unwrap_or(src as *mut u8);
        // SAFETY: test memory: the mock's vector, the test's vectors or bounce buffers.
        unsafe { std::ptr::copy(from, to, len as usize) };
        Ok(())
    }
    fn copy_start(&self, device: u32, dst: u64, src: u64, len: u64) -> Result<PendingCopy, TransportError> {
        self.copy(device, dst, src, len)?;
        let running = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(running, Ordering::SeqCst);
        Ok(PendingCopy(1))
    }
    fn copy_wait(&self, _: u32, copy: PendingCopy) -> Result<(), TransportError> {
        assert_eq!(copy, PendingCopy(1));
        self.running.fetch_sub(1, Ordering::SeqCst);
        Ok(())
    }
    fn ipc_export(&self, _: &Allocation) -> Result<IpcHandle, TransportError> {
        Err(refused("ipc_export"))
    }
    fn ipc_open(&self, _: u32, _: &IpcHandle) -> Result<u64, TransportError> {
        Err(refused("ipc_open"))
    }
    fn ipc_close(&self, _: u32, _: u64) -> Result<(), TransportError> {
        Ok(())
    }
    fn alloc(&self, _: u32, _: u64) -> Result<u64, TransportError> {
        Err(refused("alloc"))
    }
    fn free(&self, _: u32, _: u64) -> Result<(), TransportError> {
        Ok(())
    }
    fn alloc_pinned(&self, len: u64) -> Result<u64, TransportError> {
        Ok(Box::leak(vec![0u8; len as usize].into_boxed_slice()).as_mut_ptr() as u64)
    }
    fn free_pinned(&self, _: u64) -> Result<(), TransportError> {
        Ok(())
    }
}
