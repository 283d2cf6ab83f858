//! Memory the engine holds for its caller: what it allocated and registered
//! ([`RegisteredMemory`]) and what the caller lent it for one call ([`LocalLoan`]).

use std::sync::Arc;
use std::time::Duration;

use crescent_transports::{RegionTable, SharedMemory};

/// Memory allocated and registered by [`TransferEngine::alloc_registered`](crate::TransferEngine::alloc_registered).
///
/// The bytes stay valid while this value or the registration lives: dropping it without
/// [`TransferEngine::free_registered`](crate::TransferEngine::free_registered) leaves the memory registered (and allocated) until the
/// engine is dropped.
#[derive(Debug, Clone)]
pub struct RegisteredMemory {
    pub(crate) mem: Arc<SharedMemory>,
}

impl RegisteredMemory {
    /// Its first byte's address.
    pub fn addr(&self) -> u64 {
        self.mem.addr()
    }
    /// Its length in bytes.
    pub fn len(&self) -> u64 {
        self.mem.len()
    }
    /// It has no bytes.
    pub fn is_empty(&self) -> bool {
        self.mem.is_empty()
    }
    /// The mapping underneath (shareable with a process on the same host).
    pub fn shared_memory(&self) -> &Arc<SharedMemory> {
        &self.mem
    }
    /// The bytes.
    ///
    /// # Safety
    /// No transfer (local or a peer's) may write this memory while the slice is alive.
    pub unsafe fn as_slice(&self) -> &[u8] {
        // SAFETY: a live mapping of `len` bytes; the caller rules out concurrent writes.
        unsafe { std::slice::from_raw_parts(self.addr() as *const u8, self.len() as usize) }
    }
    /// The bytes, mutable.
    ///
    /// # Safety
    /// No transfer may read or write this memory while the slice is alive, and no other
    /// reference to it may exist.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn as_mut_slice(&self) -> &mut [u8] {
        // SAFETY: a live mapping of `len` bytes; the caller guarantees exclusive use.
        unsafe { std::slice::from_raw_parts_mut(self.addr() as *mut u8, self.len() as usize) }
    }
}

/// Memory lent with [`TransferEngine::lend_local`](crate::TransferEngine::lend_local); dropping it takes the memory back.
pub struct LocalLoan<'a> {
    pub(crate) table: &'a RegionTable,
    pub(crate) addr: u64,
}

impl Drop for LocalLoan<'_> {
    /// Returns only once no transfer uses the memory any more, so that its owner may free it
    /// right after: a transfer the caller waited for has let go of it already, so this is
    /// one removal from the table in practice.
    fn drop(&mut self) {
        let mut warned = false;
        while let Err(e) = self.table.remove(self.addr, Duration::from_millis(100)) {
            if matches!(e, crescent_transports::TransportError::NotRegistered(_)) {
                return;
            }
            if !std::mem::replace(&mut warned, true) {
                tracing::warn!("lent memory at {:#x} is still in use ({e}); waiting for it", self.addr);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
