//! Allocations of other processes opened through IPC handles: each handle is opened once per
//! process (CUDA refuses a second open of the same handle) and closed with its last user.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use super::{Driver, IpcHandle, IPC_HANDLE_LEN};
use crate::TransportError;

/// The handles this process has open, by their bytes.
#[derive(Debug, Default)]
pub(super) struct Opened {
    open: Mutex<HashMap<[u8; IPC_HANDLE_LEN], Weak<IpcMapping>>>,
}

/// Another process's device allocation, open in this process until dropped.
#[derive(Debug)]
pub struct IpcMapping {
    driver: Arc<Driver>,
    handle: IpcHandle,
    device: u32,
    base: u64,
}

impl IpcMapping {
    /// The allocation's first byte's address in this process.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// The driver that opened it.
    pub fn driver(&self) -> &Arc<Driver> {
        &self.driver
    }

    /// The device it was opened on (the one whose streams copy it).
    pub fn device(&self) -> u32 {
        self.device
    }
}

impl Drop for IpcMapping {
    fn drop(&mut self) {
        // Closed under the lock, so that an open of the same handle waits for the close.
        let mut open = self.driver.ipc.open.lock();
        if open.get(&self.handle.0).is_some_and(|w| w.strong_count() == 0) {
            open.remove(&self.handle.0);
        }
        if let Err(e) = self.driver.api().ipc_close(self.device, self.base) {
            tracing::warn!("device memory: closing an IPC mapping at {:#x} failed: {e}", self.base);
        }
    }
}

/// See [`Driver::open_ipc`].
pub(super) fn open(driver: &Arc<Driver>, device: u32, handle: &IpcHandle) -> Result<Arc<IpcMapping>, TransportError> {
    loop {
        let mut open = driver.ipc.open.lock();
        match open.get(&handle.0).map(Weak::upgrade) {
            Some(Some(mapping)) => return Ok(mapping),
            // Its last user is closing it: let the close finish (it takes this lock).
            Some(None) => {
                drop(open);
                std::thread::yield_now();
                continue;
            }
            None => {}
        }
        let base = driver.api().ipc_open(device, handle)?;
        let mapping = Arc::new(IpcMapping { driver: driver.clone(), handle: *handle, device, base });
        open.insert(handle.0, Arc::downgrade(&mapping));
        return Ok(mapping);
    }
}
