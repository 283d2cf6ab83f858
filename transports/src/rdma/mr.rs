//! Memory registration: every registered region is registered on every device.
//!
//! Layer: verbs resources (the layer map is in the [rdma module](super)).

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::Arc;

use parking_lot::RwLock;

use super::device::Device;
use super::ffi;
use crate::{DeviceKey, TransportError};

/// One region registered on one device.
struct Mr {
    device: Arc<Device>,
    mr: *mut ffi::ibv_mr,
    lkey: u32,
    rkey: u32,
}

// SAFETY: the handle is only used to deregister, once, in `Drop`.
unsafe impl Send for Mr {}
// SAFETY: see `Send`; shared access only reads the copied keys.
unsafe impl Sync for Mr {}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: a memory region registered by `MrTable::register` and deregistered only here.
        let rc = unsafe { (self.device.verbs.dereg_mr)(self.mr) };
        if rc != 0 {
            tracing::warn!(
                "rdma: deregistering memory on {} failed: {}",
                self.device.name,
                std::io::Error::from_raw_os_error(rc)
            );
        }
    }
}

struct Registered {
    len: u64,
    /// One per device, in device order.
    mrs: Vec<Mr>,
}

/// This process's regions registered with the RDMA devices, keyed by start address.
#[derive(Default)]
pub struct MrTable {
    regions: RwLock<BTreeMap<u64, Registered>>,
}

/// What a region is registered from.
#[derive(Debug, Clone, Copy)]
pub enum Backing<'a> {
    /// Its addresses: host memory, or device memory where a peer-memory kernel module
    /// (nvidia-peermem) resolves them for the NIC.
    Pointer,
    /// A dma-buf the device driver exported: `fd`, the region starting `offset` bytes into it.
    DmaBuf {
        /// The dma-buf (the caller closes it when it likes: a registration holds its own
        /// reference).
        fd: BorrowedFd<'a>,
        /// Where the region starts inside the dma-buf.
        offset: u64,
    },
}

/// A registration that a device refused: its name and the error libibverbs set.
#[derive(Debug)]
pub struct Refused {
    /// The device's name.
    pub device: String,
    /// The error (`errno`).
    pub error: std::io::Error,
}

impl MrTable {
    /// Registers `[addr, addr+len)` on every device for local and remote read and write.
    pub fn register(&self, devices: &[Arc<Device>], addr: u64, len: u64) -> Result<Vec<DeviceKey>, TransportError> {
        if usize::try_from(len).is_err() {
            return Err(TransportError::InvalidArgument(format!("region of {len} bytes is too large")));
        }
        self.register_from(devices, addr, len, Backing::Pointer).map_err(|Refused { device, error }| {
            let reason = format!("registering [{addr:#x}, +{len}) on {device} failed: {error}");
            match pin_limit(&error) {
                Some(limit) => TransportError::PinLimit {
                    transport: "rdma",
                    reason: format!(
                        "{reason} (the locked-memory limit is {limit} bytes; raise it: ulimit -l unlimited)"
                    ),
                },
                None => TransportError::Unavailable("rdma", reason),
            }
        })
    }

    /// Registers `[addr, addr+len)` from `backing` on every device, for local and remote read
    /// and write; `addr` is the address work requests name it by. All or none: the first
    /// device that refuses undoes the others.
    pub fn register_from(
        &self,
        devices: &[Arc<Device>],
        addr: u64,
        len: u64,
        backing: Backing<'_>,
    ) -> Result<Vec<DeviceKey>, Refused> {
        let access = ffi::IBV_ACCESS_LOCAL_WRITE | ffi::IBV_ACCESS_REMOTE_READ | ffi::IBV_ACCESS_REMOTE_WRITE;
        let errno = |device: &Device, code: i32| Refused {
            device: device.name.clone(),
            error: std::io::Error::from_raw_os_error(code),
        };
        let mut mrs = Vec::with_capacity(devices.len());
        for d in devices {
            let Ok(size) = usize::try_from(len) else {
                return Err(errno(d, rustix::io::Errno::OVERFLOW.raw_os_error()));
            };
            let mr = match backing {
                // SAFETY: the engine registers only memory the caller keeps valid until it is
                // unregistered (the region table's contract); the device pins the pages.
                Backing::Pointer => unsafe { (d.verbs.reg_mr)(d.pd, addr as *mut _, size, access) },
                Backing::DmaBuf { fd, offset } => {
                    let Some(reg_dmabuf_mr) = d.verbs.reg_dmabuf_mr else {
                        return Err(errno(d, rustix::io::Errno::OPNOTSUPP.raw_os_error()));
                    };
                    // SAFETY: `fd` is an open dma-buf for the duration of the call (borrowed);
                    // the kernel takes its own reference to it for the memory region. `addr`
                    // is only the I/O virtual address work requests will use.
                    unsafe { reg_dmabuf_mr(d.pd, offset, size, addr, fd.as_raw_fd(), access) }
                }
            };
            if mr.is_null() {
                // `mrs` is dropped on return: what was registered on other devices is undone.
                return Err(Refused { device: d.name.clone(), error: std::io::Error::last_os_error() });
            }
            // SAFETY: a memory region the library just returned.
            let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
            mrs.push(Mr { device: d.clone(), mr, lkey, rkey });
        }
        let keys =
            mrs.iter().map(|m| DeviceKey { device: m.device.name.clone(), lkey: m.lkey, rkey: m.rkey }).collect();
        self.regions.write().insert(addr, Registered { len, mrs });
        Ok(keys)
    }

    /// Deregisters the region starting at `addr` (no-op if unknown).
    pub fn unregister(&self, addr: u64) {
        let removed = self.regions.write().remove(&addr);
        drop(removed);
    }

    /// The local key of `[addr, addr+len)` on device `device` (its index), if registered.
    pub fn lkey(&self, addr: u64, len: u64, device: usize) -> Option<u32> {
        let map = self.regions.read();
        let (start, r) = map.range(..=addr).next_back()?;
        let end = start.checked_add(r.len)?;
        (addr.checked_add(len)? <= end).then(|| r.mrs.get(device).map(|m| m.lkey)).flatten()
    }

    /// Deregisters every region on every device.
    pub fn clear(&self) {
        let all = std::mem::take(&mut *self.regions.write());
        drop(all);
    }
}

/// The process's locked-memory limit, when `e` (from registering memory) is what the kernel
/// answers once pinning would exceed it: ENOMEM, or EPERM where the limit is 0. `None` where
/// the limit is unlimited (the error has another cause).
fn pin_limit(e: &std::io::Error) -> Option<u64> {
    use rustix::io::Errno;
    let code = e.raw_os_error()?;
    if code != Errno::NOMEM.raw_os_error() && code != Errno::PERM.raw_os_error() {
        return None;
    }
    rustix::process::getrlimit(rustix::process::Resource::Memlock).current
}

/// A peer's regions and their remote keys per device name, from its descriptor.
#[derive(Debug, Default)]
pub struct RemoteKeys {
    regions: BTreeMap<u64, (u64, Vec<(String, u32)>)>,
}

impl RemoteKeys {
    /// The keys of a peer's regions; empty or wrapping regions are left out.
    pub fn from_regions(regions: Vec<crate::RemoteRegion>) -> Self {
        let mut map = BTreeMap::new();
        for r in regions {
            if r.len == 0 || r.addr.checked_add(r.len).is_none() {
                continue;
            }
            let keys = r.keys.rdma.into_iter().map(|k| (k.device, k.rkey)).collect();
            map.insert(r.addr, (r.len, keys));
        }
        RemoteKeys { regions: map }
    }

    /// The remote key of `[addr, addr+len)` on the peer's device `device`.
    pub fn rkey(&self, addr: u64, len: u64, device: &str) -> Option<u32> {
        let (start, (rlen, keys)) = self.regions.range(..=addr).next_back()?;
        if addr.checked_add(len)? > start.checked_add(*rlen)? {
            return None;
        }
        keys.iter().find(|(d, _)| d == device).map(|(_, k)| *k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{RegionKeys, RemoteRegion};

    #[test]
    fn remote_keys_are_found_only_inside_a_region() {
        let keys = RemoteKeys::from_regions(vec![
            RemoteRegion {
                addr: 0x1000,
                len: 0x1000,
                keys: RegionKeys {
                    rdma: vec![
                        DeviceKey { device: "rxe0".into(), lkey: 1, rkey: 11 },
                        DeviceKey { device: "rxe1".into(), lkey: 2, rkey: 22 },
                    ],
                },
            },
            RemoteRegion { addr: u64::MAX - 1, len: 10, keys: RegionKeys::default() },
        ]);
        assert_eq!(keys.rkey(0x1000, 0x1000, "rxe0"), Some(11));
        assert_eq!(keys.rkey(0x1800, 0x10, "rxe1"), Some(22));
        assert_eq!(keys.rkey(0x1800, 0x10, "mlx5_0"), None);
        assert_eq!(keys.rkey(0x1fff, 2, "rxe0"), None, "crosses the end");
        assert_eq!(keys.rkey(0xfff, 1, "rxe0"), None);
        assert_eq!(keys.rkey(u64::MAX, 1, "rxe0"), None);
    }
}
