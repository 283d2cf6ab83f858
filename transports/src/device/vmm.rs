//! Allocations of the virtual memory management API (CUDA's `cuMemCreate` + `cuMemMap`)
//! of another process, imported through a file descriptor it exported: IPC handles cannot
//! share such memory (PyTorch's expandable segments, many KV-cache allocators).
//!
//! Unlike an IPC handle, an exported descriptor may be imported any number of times, so each
//! grant maps its own and unmaps it when dropped.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use super::Driver;
use crate::TransportError;

/// Another process's allocation, mapped in this process until dropped.
#[derive(Debug)]
pub struct VmmMapping {
    driver: Arc<Driver>,
    device: u32,
    base: u64,
    len: u64,
}

impl VmmMapping {
    /// The allocation's first byte's address in this process.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Its length in bytes (all of it is mapped).
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True when it maps nothing (never: an import of zero bytes is refused).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The driver that mapped it.
    pub fn driver(&self) -> &Arc<Driver> {
        &self.driver
    }

    /// The device that reaches it (the one whose streams copy it).
    pub fn device(&self) -> u32 {
        self.device
    }
}

impl Drop for VmmMapping {
    fn drop(&mut self) {
        match self.driver.api().vmm_close(self.device, self.base, self.len) {
            Ok(()) => {
                tracing::debug!("device memory: unmapped a peer's allocation at {:#x} (+{})", self.base, self.len)
            }
            Err(e) => tracing::warn!("device memory: unmapping a peer's allocation at {:#x} failed: {e}", self.base),
        }
    }
}

/// See [`Driver::import_vmm`].
pub(super) fn import(driver: &Arc<Driver>, device: u32, fd: OwnedFd, len: u64) -> Result<VmmMapping, TransportError> {
    if len == 0 {
        return Err(TransportError::Driver { call: "vmm_import", reason: "an allocation of 0 bytes".into() });
    }
    let base = driver.api().vmm_import(device, fd, len)?;
    tracing::debug!("device memory: mapped a peer's allocation of {len} bytes at {base:#x} on device {device}");
    Ok(VmmMapping { driver: driver.clone(), device, base, len })
}
