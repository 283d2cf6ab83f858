//! Device (GPU) memory: where it is, and how bytes get in and out of it without the CPU
//! touching it.
//!
//! A vendor's driver is reached through one small trait, [`DeviceApi`]: pointer attributes
//! (is this address device memory, on which device, in which allocation), copies on a stream
//! (device↔host, device↔device), and IPC export/import of allocations so that a process on
//! the same host can copy to and from them. CUDA's driver API ([`cuda::Cuda`]) is the one
//! implementation; another vendor is one more.
//!
//! The driver library is loaded at run time (like libibverbs): a binary runs on hosts with
//! and without a GPU, and only a registration that needs the driver fails without one.
//! [`Devices`] loads it once, on first use, from [`Devices::new`]'s path, else
//! `$CRESCENT_CUDA_DRIVER`, else `libcuda.so.1`.
//!
//! For GPUDirect RDMA a driver may also export a range of device memory as a dma-buf
//! ([`DeviceApi::dmabuf`]), which the rdma transport registers with the NIC.
//!
//! On top of the vendor's calls, [`Driver`] adds what every transport needs the same way:
//! pinned host bounce buffers kept for reuse ([`Bounce`]), and imported IPC allocations
//! shared by every grant that uses them ([`IpcMapping`]).

mod bounce;
pub mod cuda;
mod ipc;
mod location;
#[cfg(test)]
mod mock;
pub mod pipeline;
mod staged;
mod vmm;

use std::fmt;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use crate::TransportError;

pub use bounce::Bounce;
pub use ipc::IpcMapping;
pub use location::{Location, Placement};
pub use staged::stage;
pub use vmm::VmmMapping;

/// The variable that names the CUDA driver library to load (the fake one, in tests).
pub const CUDA_DRIVER_ENV: &str = "CRESCENT_CUDA_DRIVER";

/// Size of an IPC handle, as CUDA defines it (`CU_IPC_HANDLE_SIZE`).
pub const IPC_HANDLE_LEN: usize = 64;

/// One device allocation, as the driver knows it: the device it lives on and its extent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allocation {
    /// The device's ordinal (`N` of `cuda:N`).
    pub device: u32,
    /// Its first byte's address in this process.
    pub base: u64,
    /// Its length in bytes.
    pub len: u64,
}

impl Allocation {
    /// True when `[addr, +len)` lies inside it.
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        addr >= self.base && addr.checked_add(len).is_some_and(|end| end <= self.base + self.len)
    }
}

/// An allocation exported for another process on the same host (opaque bytes of the vendor).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct IpcHandle(
    /// The handle's bytes.
    pub [u8; IPC_HANDLE_LEN],
);

impl fmt::Debug for IpcHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IpcHandle(")?;
        for b in &self.0[..8] {
            write!(f, "{b:02x}")?;
        }
        write!(f, "…)")
    }
}

/// A range of device memory exported as a dma-buf file descriptor ([`DeviceApi::dmabuf`]),
/// which a NIC can register (`ibv_reg_dmabuf_mr`) without a peer-memory kernel module.
#[derive(Debug)]
pub struct DmaBuf {
    /// The dma-buf. Its owner closes it once the NIC registered it (a registration holds a
    /// reference of its own).
    pub fd: OwnedFd,
    /// Where the asked-for range starts inside the dma-buf, in bytes (the export covers whole
    /// host pages around it).
    pub offset: u64,
}

/// The whole host pages (`page` bytes each, a power of two) around `[addr, +len)`: their
/// start, their length, and `addr`'s offset from that start. `None` when the range is empty,
/// wraps, or `page` is not a power of two.
pub fn page_span(addr: u64, len: u64, page: u64) -> Option<(u64, u64, u64)> {
    if len == 0 || !page.is_power_of_two() {
        return None;
    }
    let start = addr & !(page - 1);
    let end = addr.checked_add(len)?.checked_next_multiple_of(page)?;
    Some((start, end - start, addr - start))
}

/// A vendor's device driver: the calls the transports need, nothing more.
///
/// Contract: every call may come from any thread, concurrently; copies are complete when
/// [`DeviceApi::copy`] returns (the implementation waits for its stream); addresses are this
/// process's (unified addressing: a device pointer and a host pointer never coincide).
pub trait DeviceApi: Send + Sync + fmt::Debug {
    /// Its vendor's name for device locations (`"cuda"` for `cuda:N`).
    fn vendor(&self) -> &'static str;
    /// How many devices this process sees.
    fn device_count(&self) -> Result<u32, TransportError>;
    /// The device allocation holding `addr`, or `None` when `addr` is not device memory.
    fn allocation(&self, addr: u64) -> Result<Option<Allocation>, TransportError>;
    /// Copies `len` bytes from `src` to `dst` (either may be device or host memory) on a
    /// stream of `device`, and waits for the copy to end.
    fn copy(&self, device: u32, dst: u64, src: u64, len: u64) -> Result<(), TransportError>;
    /// Starts copying `len` bytes from `src` to `dst` on a stream of `device` and returns
    /// without waiting; [`DeviceApi::copy_wait`] waits for it, exactly once. Both ranges must
    /// stay valid until then ([`Driver::copy_start`] makes sure of it).
    ///
    /// The default: copies now (the wait has nothing left to do).
    fn copy_start(&self, device: u32, dst: u64, src: u64, len: u64) -> Result<PendingCopy, TransportError> {
        self.copy(device, dst, src, len).map(|()| PendingCopy(0))
    }
    /// Waits for a copy [`DeviceApi::copy_start`] started.
    fn copy_wait(&self, device: u32, copy: PendingCopy) -> Result<(), TransportError> {
        let _ = (device, copy);
        Ok(())
    }
    /// Exports `allocation` for another process on this host.
    fn ipc_export(&self, allocation: &Allocation) -> Result<IpcHandle, TransportError>;
    /// Opens an allocation another process exported, on `device`; returns its base address
    /// here. Each handle is opened once per process (see [`Driver::open_ipc`]).
    fn ipc_open(&self, device: u32, handle: &IpcHandle) -> Result<u64, TransportError>;
    /// Closes an allocation opened with [`DeviceApi::ipc_open`].
    fn ipc_close(&self, device: u32, base: u64) -> Result<(), TransportError>;
    /// Allocates `len` bytes of memory on `device`.
    fn alloc(&self, device: u32, len: u64) -> Result<u64, TransportError>;
    /// Frees memory from [`DeviceApi::alloc`].
    fn free(&self, device: u32, addr: u64) -> Result<(), TransportError>;
    /// Allocates `len` bytes of page-locked host memory (fast device copies).
    fn alloc_pinned(&self, len: u64) -> Result<u64, TransportError>;
    /// Frees memory from [`DeviceApi::alloc_pinned`].
    fn free_pinned(&self, addr: u64) -> Result<(), TransportError>;
    /// Exports `allocation` as a POSIX file descriptor when it is memory of the virtual
    /// memory management API (CUDA's `cuMemCreate` + `cuMemMap`, which IPC handles cannot
    /// share); `Ok(None)` when it is not (an [`DeviceApi::ipc_export`] allocation).
    ///
    /// The default: no such memory.
    fn vmm_export(&self, allocation: &Allocation) -> Result<Option<OwnedFd>, TransportError> {
        let _ = allocation;
        Ok(None)
    }
    /// Maps the `len` bytes of an allocation another process exported with
    /// [`DeviceApi::vmm_export`] (`fd`, consumed) into this process, readable and writable by
    /// `device`; returns their address here. Undone by [`DeviceApi::vmm_close`].
    ///
    /// The default: refused.
    fn vmm_import(&self, device: u32, fd: OwnedFd, len: u64) -> Result<u64, TransportError> {
        let _ = (device, fd, len);
        Err(TransportError::Driver {
            call: "vmm_import",
            reason: format!("the {} driver cannot import shareable allocations", self.vendor()),
        })
    }
    /// Unmaps an allocation mapped by [`DeviceApi::vmm_import`] and frees its addresses.
    fn vmm_close(&self, device: u32, base: u64, len: u64) -> Result<(), TransportError> {
        let _ = (device, base, len);
        Ok(())
    }
    /// Allocates at least `len` bytes on `device` through the virtual memory management API,
    /// exportable with [`DeviceApi::vmm_export`] (as a framework's allocator does; tests and
    /// benchmarks use it). Freed with [`DeviceApi::vmm_free`].
    ///
    /// The default: refused.
    fn vmm_alloc(&self, device: u32, len: u64) -> Result<u64, TransportError> {
        let _ = (device, len);
        Err(TransportError::Driver {
            call: "vmm_alloc",
            reason: format!("the {} driver has no virtual memory management", self.vendor()),
        })
    }
    /// Frees memory from [`DeviceApi::vmm_alloc`].
    fn vmm_free(&self, device: u32, addr: u64) -> Result<(), TransportError> {
        let _ = (device, addr);
        Ok(())
    }
    /// Exports `[addr, +len)` of `device`'s memory as a dma-buf for a NIC to register, or
    /// `Ok(None)` when this driver or device offers none (the rdma transport then tries
    /// other ways, and stages the memory over tcp as a last resort). An error is a driver
    /// call that failed on memory it should have exported.
    ///
    /// The default: none.
    fn dmabuf(&self, device: u32, addr: u64, len: u64) -> Result<Option<DmaBuf>, TransportError> {
        let _ = (device, addr, len);
        Ok(None)
    }
    /// Queues `f` on the caller's `stream` (a handle of the vendor's, `0` for the default
    /// stream): the driver runs it on a thread of its own once the work queued before it on
    /// that stream is done, and work queued after it waits until `f` returns. `f` must not
    /// call the driver (a vendor may deadlock). The stream belongs to the context current on
    /// the calling thread; where none is, to `device`'s primary context. When this returns
    /// an error, `f` was dropped without running.
    ///
    /// The default: a driver without such callbacks refuses.
    fn launch_host_func(&self, device: u32, stream: u64, f: HostFunc) -> Result<(), TransportError> {
        let _ = (device, stream, f);
        Err(TransportError::Driver {
            call: "launch_host_func",
            reason: format!("the {} driver has no host functions on streams", self.vendor()),
        })
    }
}

/// A copy in progress, [`DeviceApi::copy_start`]: the vendor's token for it (CUDA: its stream).
#[derive(Debug, PartialEq, Eq)]
pub struct PendingCopy(
    /// The vendor's token.
    pub u64,
);

/// A copy in progress on a [`Driver`]: [`Copying::wait`] waits for it; dropped without a wait,
/// it waits then (so the memory it uses outlives it).
#[derive(Debug)]
pub struct Copying {
    driver: Arc<Driver>,
    device: u32,
    pending: Option<PendingCopy>,
}

impl Copying {
    /// Waits until the copy has ended.
    pub fn wait(mut self) -> Result<(), TransportError> {
        match self.pending.take() {
            Some(pending) => self.driver.api.copy_wait(self.device, pending),
            None => Ok(()),
        }
    }
}

impl Drop for Copying {
    fn drop(&mut self) {
        if let Some(pending) = self.pending.take() {
            if let Err(e) = self.driver.api.copy_wait(self.device, pending) {
                tracing::debug!("device memory: a copy nobody waited for failed: {e}");
            }
        }
    }
}

/// Work a driver runs on a stream, [`DeviceApi::launch_host_func`].
pub type HostFunc = Box<dyn FnOnce() + Send + 'static>;

/// A loaded device driver and the services built on it, shared by the registrations and
/// transports of a process.
#[derive(Debug)]
pub struct Driver {
    api: Box<dyn DeviceApi>,
    bounce: bounce::Pool,
    ipc: ipc::Opened,
}

impl Driver {
    /// Wraps a vendor's driver.
    pub fn new(api: Box<dyn DeviceApi>) -> Arc<Driver> {
        Arc::new(Driver { api, bounce: bounce::Pool::default(), ipc: ipc::Opened::default() })
    }

    /// The vendor's calls.
    pub fn api(&self) -> &dyn DeviceApi {
        &*self.api
    }

    /// Copies `len` bytes from `src` to `dst` on a stream of `device` and waits for the copy.
    pub fn copy(&self, device: u32, dst: u64, src: u64, len: u64) -> Result<(), TransportError> {
        self.api.copy(device, dst, src, len)
    }

    /// Starts copying `len` bytes from `src` to `dst` on a stream of `device`; the copy has
    /// ended when the returned [`Copying`] is waited for or dropped.
    pub fn copy_start(self: &Arc<Self>, device: u32, dst: u64, src: u64, len: u64) -> Result<Copying, TransportError> {
        let pending = self.api.copy_start(device, dst, src, len)?;
        Ok(Copying { driver: self.clone(), device, pending: Some(pending) })
    }

    /// A pinned host buffer of at least `len` bytes, reused from earlier transfers when one is
    /// free; it goes back to the pool when dropped.
    pub fn bounce(self: &Arc<Self>, len: u64) -> Result<Bounce, TransportError> {
        bounce::take(self, len)
    }

    /// Maps the allocation of `len` bytes that another process exported as `fd` (see
    /// [`DeviceApi::vmm_export`]) on `device`, until the [`VmmMapping`] is dropped.
    pub fn import_vmm(self: &Arc<Self>, device: u32, fd: OwnedFd, len: u64) -> Result<VmmMapping, TransportError> {
        vmm::import(self, device, fd, len)
    }

    /// Opens the allocation behind `handle` (another process's) on `device`, or shares the
    /// mapping already open: a process opens each handle once, and closes it when the last
    /// [`IpcMapping`] of it is dropped.
    pub fn open_ipc(self: &Arc<Self>, device: u32, handle: &IpcHandle) -> Result<Arc<IpcMapping>, TransportError> {
        ipc::open(self, device, handle)
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        for addr in self.bounce.drain() {
            if let Err(e) = self.api.free_pinned(addr) {
                tracing::debug!("device memory: freeing a pinned bounce buffer failed: {e}");
            }
        }
    }
}

/// Device memory that is registered: the driver that reaches it and its allocation.
#[derive(Debug, Clone)]
pub struct DeviceMemory {
    /// The driver of its device.
    pub driver: Arc<Driver>,
    /// The allocation the registered range lies in.
    pub allocation: Allocation,
}

impl DeviceMemory {
    /// Its location's name (`cuda:0`).
    pub fn location(&self) -> String {
        format!("{}:{}", self.driver.api().vendor(), self.allocation.device)
    }
}

/// The device driver of a process, loaded on first use.
pub struct Devices {
    path: Option<PathBuf>,
    loaded: OnceLock<Result<Arc<Driver>, String>>,
}

impl fmt::Debug for Devices {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.loaded.get() {
            None => "not loaded",
            Some(Ok(_)) => "loaded",
            Some(Err(_)) => "unavailable",
        };
        f.debug_struct("Devices").field("path", &self.path).field("state", &state).finish()
    }
}

impl Default for Devices {
    fn default() -> Self {
        Devices::new(None)
    }
}

impl Devices {
    /// Loads the CUDA driver from `path` when first needed; `None`: `$CRESCENT_CUDA_DRIVER`,
    /// else `libcuda.so.1`.
    pub fn new(path: Option<PathBuf>) -> Self {
        Devices { path, loaded: OnceLock::new() }
    }

    /// Uses `driver` (another vendor's, or one a test provides).
    pub fn with_driver(driver: Arc<Driver>) -> Self {
        let loaded = OnceLock::new();
        let _ = loaded.set(Ok(driver));
        Devices { path: None, loaded }
    }

    /// The driver, loaded now if it was not; an error ([`TransportError::DriverUnavailable`])
    /// says why it cannot be, every time it is asked.
    pub fn driver(&self) -> Result<Arc<Driver>, TransportError> {
        let loaded = self.loaded.get_or_init(|| {
            let path = self.path.clone().or_else(|| std::env::var_os(CUDA_DRIVER_ENV).map(PathBuf::from));
            let name = path.as_deref().map_or_else(|| cuda::DEFAULT_LIBRARY.into(), |p| p.display().to_string());
            match cuda::Cuda::load(path.as_deref()) {
                Ok(api) => {
                    tracing::info!("device memory: loaded the CUDA driver {name}");
                    Ok(Driver::new(Box::new(api)))
                }
                Err(e) => {
                    // Quiet: every `*` registration of a host without a GPU comes here once.
                    tracing::debug!("device memory: no CUDA driver ({e}); device locations cannot be registered");
                    Err(e)
                }
            }
        });
        loaded.clone().map_err(|reason| TransportError::DriverUnavailable { reason })
    }

    /// The driver if it was loaded already (no attempt to load it).
    pub fn loaded(&self) -> Option<Arc<Driver>> {
        self.loaded.get().and_then(|l| l.as_ref().ok()).cloned()
    }

    /// Where `[addr, +len)` registered at `location` lives; see [`Placement`].
    pub fn place(&self, addr: u64, len: u64, location: &str) -> Result<Placement, TransportError> {
        location::place(self, addr, len, location)
    }
}

#[cfg(test)]
mod tests {
    use super::page_span;

    #[test]
    fn a_page_span_covers_the_range_with_whole_pages() {
        const PAGE: u64 = 4096;
        assert_eq!(page_span(0x10000, 4096, PAGE), Some((0x10000, 4096, 0)), "aligned already");
        assert_eq!(page_span(0x10001, 1, PAGE), Some((0x10000, 4096, 1)));
        assert_eq!(page_span(0x10fff, 2, PAGE), Some((0x10000, 8192, 0xfff)), "crosses a page boundary");
        assert_eq!(page_span(0x12345, 0x10000, PAGE), Some((0x12000, 0x11000, 0x345)));
        assert_eq!(page_span(0x200000, 3 << 20, 2 << 20), Some((0x200000, 4 << 20, 0)), "2 MiB pages");
    }

    #[test]
    fn a_page_span_refuses_empty_wrapping_and_odd_pages() {
        assert_eq!(page_span(0x1000, 0, 4096), None);
        assert_eq!(page_span(u64::MAX - 10, 5, 4096), None, "its end rounds past the address space");
        assert_eq!(page_span(u64::MAX - 10, 20, 4096), None, "wraps");
        assert_eq!(page_span(0x1000, 1, 0), None);
        assert_eq!(page_span(0x1000, 1, 3000), None);
    }
}
