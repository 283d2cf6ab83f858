//! CUDA's driver API (`libcuda.so.1`), loaded at run time: the subset [`DeviceApi`] needs.
//!
//! Every call that needs a context makes the device's primary context current on the calling
//! thread first (cheap: a thread-local store in the driver). Copies run on non-blocking streams
//! kept per device for reuse, one stream per copy in progress.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::os::fd::{FromRawFd, IntoRawFd, OwnedFd};
use std::path::Path;
use std::sync::OnceLock;

use libloading::Library;
use parking_lot::Mutex;

use super::{page_span, Allocation, DeviceApi, DmaBuf, HostFunc, IpcHandle, PendingCopy, IPC_HANDLE_LEN};
use crate::TransportError;

/// The library loaded when no path is given.
pub const DEFAULT_LIBRARY: &str = "libcuda.so.1";

type CuResult = c_int;
type CuDevice = c_int;
type CuContext = *mut c_void;
type CuStream = *mut c_void;
type CuDevicePtr = u64;
/// `CUhostFn`: what `cuLaunchHostFunc` runs.
type CuHostFn = unsafe extern "C" fn(*mut c_void);

/// `CUipcMemHandle`: 64 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
struct CuIpcMemHandle {
    reserved: [u8; IPC_HANDLE_LEN],
}

const CUDA_SUCCESS: CuResult = 0;
const CUDA_ERROR_INVALID_VALUE: CuResult = 1;
const CU_POINTER_ATTRIBUTE_MEMORY_TYPE: c_int = 2;
const CU_POINTER_ATTRIBUTE_IS_MANAGED: c_int = 8;
const CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: c_int = 9;
const CU_MEMORYTYPE_DEVICE: c_uint = 2;
const CU_STREAM_NON_BLOCKING: c_uint = 1;
const CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS: c_uint = 1;
/// Pinned for every context, not only the allocating one (bounce buffers serve every device).
const CU_MEMHOSTALLOC_PORTABLE: c_uint = 1;

/// `CUmemGenericAllocationHandle`.
type CuMemHandle = u64;

/// `CUmemLocation`.
#[repr(C)]
#[derive(Clone, Copy)]
struct CuMemLocation {
    kind: c_int,
    id: c_int,
}

/// `CUmemAllocationProp`.
#[repr(C)]
struct CuMemAllocationProp {
    kind: c_int,
    requested_handle_types: c_int,
    location: CuMemLocation,
    win32_handle_meta_data: *mut c_void,
    /// `allocFlags`: compression type, GPUDirect RDMA capable, usage, reserved.
    alloc_flags: [u8; 8],
}

/// `CUmemAccessDesc`.
#[repr(C)]
struct CuMemAccessDesc {
    location: CuMemLocation,
    flags: c_int,
}

const CU_MEM_ALLOCATION_TYPE_PINNED: c_int = 1;
const CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: c_int = 1;
const CU_MEM_LOCATION_TYPE_DEVICE: c_int = 1;
const CU_MEM_ACCESS_FLAGS_PROT_READWRITE: c_int = 3;
const CU_MEM_ALLOC_GRANULARITY_RECOMMENDED: c_int = 1;

/// `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`: the device can export its memory as dma-bufs.
const CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED: c_int = 124;
/// `CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD`.
const CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD: c_int = 1;

/// The entry points of dma-buf export (CUDA 11.7 and later, with a kernel driver that has it):
/// both or none.
struct DmaBufApi {
    device_get_attribute: unsafe extern "C" fn(*mut c_int, c_int, CuDevice) -> CuResult,
    get_handle_for_address_range: unsafe extern "C" fn(*mut c_void, CuDevicePtr, usize, c_int, u64) -> CuResult,
}

/// The virtual memory management entry points (CUDA 10.2 and later): all or none.
struct VmmApi {
    create: unsafe extern "C" fn(*mut CuMemHandle, usize, *const CuMemAllocationProp, u64) -> CuResult,
    release: unsafe extern "C" fn(CuMemHandle) -> CuResult,
    address_reserve: unsafe extern "C" fn(*mut CuDevicePtr, usize, usize, CuDevicePtr, u64) -> CuResult,
    address_free: unsafe extern "C" fn(CuDevicePtr, usize) -> CuResult,
    map: unsafe extern "C" fn(CuDevicePtr, usize, usize, CuMemHandle, u64) -> CuResult,
    unmap: unsafe extern "C" fn(CuDevicePtr, usize) -> CuResult,
    set_access: unsafe extern "C" fn(CuDevicePtr, usize, *const CuMemAccessDesc, usize) -> CuResult,
    export: unsafe extern "C" fn(*mut c_void, CuMemHandle, c_int, u64) -> CuResult,
    import: unsafe extern "C" fn(*mut CuMemHandle, *mut c_void, c_int) -> CuResult,
    retain: unsafe extern "C" fn(*mut CuMemHandle, *mut c_void) -> CuResult,
    granularity: unsafe extern "C" fn(*mut usize, *const CuMemAllocationProp, c_int) -> CuResult,
}

/// The driver's entry points this crate calls, as `cuda.h` declares them (the `_v2` symbols
/// are those `cuda.h` maps the plain names to).
struct Api {
    init: unsafe extern "C" fn(c_uint) -> CuResult,
    device_get_count: unsafe extern "C" fn(*mut c_int) -> CuResult,
    device_get: unsafe extern "C" fn(*mut CuDevice, c_int) -> CuResult,
    primary_ctx_retain: unsafe extern "C" fn(*mut CuContext, CuDevice) -> CuResult,
    ctx_set_current: unsafe extern "C" fn(CuContext) -> CuResult,
    ctx_get_current: unsafe extern "C" fn(*mut CuContext) -> CuResult,
    pointer_get_attribute: unsafe extern "C" fn(*mut c_void, c_int, CuDevicePtr) -> CuResult,
    mem_get_address_range: unsafe extern "C" fn(*mut CuDevicePtr, *mut usize, CuDevicePtr) -> CuResult,
    stream_create: unsafe extern "C" fn(*mut CuStream, c_uint) -> CuResult,
    stream_synchronize: unsafe extern "C" fn(CuStream) -> CuResult,
    memcpy_async: unsafe extern "C" fn(CuDevicePtr, CuDevicePtr, usize, CuStream) -> CuResult,
    ipc_get_mem_handle: unsafe extern "C" fn(*mut CuIpcMemHandle, CuDevicePtr) -> CuResult,
    ipc_open_mem_handle: unsafe extern "C" fn(*mut CuDevicePtr, CuIpcMemHandle, c_uint) -> CuResult,
    ipc_close_mem_handle: unsafe extern "C" fn(CuDevicePtr) -> CuResult,
    mem_alloc: unsafe extern "C" fn(*mut CuDevicePtr, usize) -> CuResult,
    mem_free: unsafe extern "C" fn(CuDevicePtr) -> CuResult,
    mem_host_alloc: unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> CuResult,
    mem_free_host: unsafe extern "C" fn(*mut c_void) -> CuResult,
    get_error_string: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult,
    /// `cuLaunchHostFunc` (CUDA 10 and later); without it, work cannot be queued on a stream.
    launch_host_func: Option<unsafe extern "C" fn(CuStream, CuHostFn, *mut c_void) -> CuResult>,
    /// Without them (before CUDA 10.2), no memory is VMM memory and none is imported.
    vmm: Option<VmmApi>,
    /// Without them (before CUDA 11.7), no memory is exported as a dma-buf.
    dmabuf: Option<DmaBufApi>,
}

/// The CUDA driver, loaded and initialised.
pub struct Cuda {
    api: Api,
    devices: u32,
    /// Each device's primary context (as an address), retained on first use.
    contexts: Vec<OnceLock<usize>>,
    /// Idle streams, with their device.
    streams: Mutex<Vec<(u32, usize)>>,
    /// Kept loaded for as long as any of the pointers in `api` may be called.
    _lib: Library,
}

impl std::fmt::Debug for Cuda {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cuda").field("devices", &self.devices).finish_non_exhaustive()
    }
}

impl Cuda {
    /// Loads the driver (`path`, or [`DEFAULT_LIBRARY`]), resolves every entry point used and
    /// initialises it. The error says which step failed.
    pub fn load(path: Option<&Path>) -> Result<Cuda, String> {
        let name = path.map_or_else(|| DEFAULT_LIBRARY.to_string(), |p| p.display().to_string());
        // SAFETY: loading the CUDA driver runs its initializers, which set up its own state
        // only; nothing else in this process is touched.
        let lib = unsafe {
            match path {
                Some(p) => Library::new(p),
                None => Library::new(DEFAULT_LIBRARY),
            }
        }
        .map_err(|e| format!("cannot load {name}: {e}"))?;
        macro_rules! sym {
            ($($name:literal),+) => {{
                let mut found = None;
                $(
                    if found.is_none() {
                        // SAFETY: the symbol's type is the one cuda.h declares for it, mirrored
                        // by the field's type.
                        found = unsafe { lib.get(concat!($name, "\0").as_bytes()) }.ok().map(|f| *f);
                    }
                )+
                found.ok_or_else(|| format!("{name} lacks {}", [$($name),+].join(" / ")))?
            }};
        }
        // An optional entry point, inside a closure that gives up (`None`) on the first one
        // missing: the tables of the VMM and dma-buf APIs, each usable whole or not at all.
        macro_rules! opt {
            ($name:literal) => {
                // SAFETY: as in `sym!`: the type cuda.h declares for it.
                unsafe { lib.get(concat!($name, "\0").as_bytes()) }.ok().map(|f| *f)?
            };
        }
        let api = Api {
            init: sym!("cuInit"),
            device_get_count: sym!("cuDeviceGetCount"),
            device_get: sym!("cuDeviceGet"),
            primary_ctx_retain: sym!("cuDevicePrimaryCtxRetain"),
            ctx_set_current: sym!("cuCtxSetCurrent"),
            ctx_get_current: sym!("cuCtxGetCurrent"),
            pointer_get_attribute: sym!("cuPointerGetAttribute"),
            mem_get_address_range: sym!("cuMemGetAddressRange_v2"),
            stream_create: sym!("cuStreamCreate"),
            stream_synchronize: sym!("cuStreamSynchronize"),
            memcpy_async: sym!("cuMemcpyAsync"),
            ipc_get_mem_handle: sym!("cuIpcGetMemHandle"),
            ipc_open_mem_handle: sym!("cuIpcOpenMemHandle_v2", "cuIpcOpenMemHandle"),
            ipc_close_mem_handle: sym!("cuIpcCloseMemHandle"),
            mem_alloc: sym!("cuMemAlloc_v2"),
            mem_free: sym!("cuMemFree_v2"),
            mem_host_alloc: sym!("cuMemHostAlloc"),
            mem_free_host: sym!("cuMemFreeHost"),
            get_error_string: sym!("cuGetErrorString"),
            // SAFETY: as in `sym!`: the type cuda.h declares for cuLaunchHostFunc.
            launch_host_func: unsafe { lib.get(b"cuLaunchHostFunc\0") }.ok().map(|f| *f),
            vmm: (|| {
                Some(VmmApi {
                    create: opt!("cuMemCreate"),
                    release: opt!("cuMemRelease"),
                    address_reserve: opt!("cuMemAddressReserve"),
                    address_free: opt!("cuMemAddressFree"),
                    map: opt!("cuMemMap"),
                    unmap: opt!("cuMemUnmap"),
                    set_access: opt!("cuMemSetAccess"),
                    export: opt!("cuMemExportToShareableHandle"),
                    import: opt!("cuMemImportFromShareableHandle"),
                    retain: opt!("cuMemRetainAllocationHandle"),
                    granularity: opt!("cuMemGetAllocationGranularity"),
                })
            })(),
            dmabuf: (|| {
                Some(DmaBufApi {
                    device_get_attribute: opt!("cuDeviceGetAttribute"),
                    get_handle_for_address_range: opt!("cuMemGetHandleForAddressRange"),
                })
            })(),
        };
        let mut cuda = Cuda { api, devices: 0, contexts: Vec::new(), streams: Mutex::new(Vec::new()), _lib: lib };
        // SAFETY: cuInit takes flags (0) and touches nothing of ours.
        cuda.check("cuInit", unsafe { (cuda.api.init)(0) }).map_err(|e| e.to_string())?;
        let mut count: c_int = 0;
        // SAFETY: the driver writes one int through the pointer.
        cuda.check("cuDeviceGetCount", unsafe { (cuda.api.device_get_count)(&mut count) })
            .map_err(|e| e.to_string())?;
        cuda.devices = u32::try_from(count).unwrap_or(0);
        cuda.contexts = (0..cuda.devices).map(|_| OnceLock::new()).collect();
        Ok(cuda)
    }

    fn error_text(&self, code: CuResult) -> String {
        let mut text: *const c_char = std::ptr::null();
        // SAFETY: the driver stores a pointer to a static string (or fails for an unknown code).
        let known = unsafe { (self.api.get_error_string)(code, &mut text) } == CUDA_SUCCESS && !text.is_null();
        if !known {
            return format!("error {code}");
        }
        // SAFETY: a NUL-terminated static string of the driver.
        let text = unsafe { CStr::from_ptr(text) }.to_string_lossy();
        format!("{text} ({code})")
    }

    fn check(&self, call: &'static str, code: CuResult) -> Result<(), TransportError> {
        if code == CUDA_SUCCESS {
            return Ok(());
        }
        Err(TransportError::Driver { call, reason: self.error_text(code) })
    }

    /// Makes `device`'s primary context current on this thread (retaining it the first time).
    fn enter(&self, device: u32) -> Result<(), TransportError> {
        let slot = self.contexts.get(device as usize).ok_or_else(|| TransportError::UnknownDevice {
            location: format!("cuda:{device}"),
            devices: self.devices,
        })?;
        let ctx = match slot.get() {
            Some(ctx) => *ctx,
            None => {
                let mut dev: CuDevice = 0;
                // SAFETY: the driver writes one device handle through the pointer.
                self.check("cuDeviceGet", unsafe { (self.api.device_get)(&mut dev, device as c_int) })?;
                let mut ctx: CuContext = std::ptr::null_mut();
                // SAFETY: the driver writes the context handle through the pointer; a primary
                // context retained here stays retained for the life of the process.
                self.check("cuDevicePrimaryCtxRetain", unsafe { (self.api.primary_ctx_retain)(&mut ctx, dev) })?;
                // Two threads may retain it at once: the driver counts both, one is kept.
                *slot.get_or_init(|| ctx as usize)
            }
        };
        // SAFETY: a primary context retained above.
        self.check("cuCtxSetCurrent", unsafe { (self.api.ctx_set_current)(ctx as CuContext) })
    }

    /// Makes `device`'s primary context current on this thread unless a context is current
    /// already (the caller's own, e.g. a framework's, which owns the caller's streams).
    fn enter_unless_current(&self, device: u32) -> Result<(), TransportError> {
        let mut ctx: CuContext = std::ptr::null_mut();
        // SAFETY: the driver writes the current context's handle (or null) through the pointer.
        self.check("cuCtxGetCurrent", unsafe { (self.api.ctx_get_current)(&mut ctx) })?;
        if ctx.is_null() {
            self.enter(device)?;
        }
        Ok(())
    }

    fn vmm_api(&self, call: &'static str) -> Result<&VmmApi, TransportError> {
        self.api.vmm.as_ref().ok_or_else(|| TransportError::Driver {
            call,
            reason: "this CUDA driver lacks the virtual memory management API (CUDA 10.2 or later has it)".into(),
        })
    }

    /// Maps `handle` (`len` bytes) at new addresses, readable and writable by `device`; the
    /// mapping holds the allocation, so the handle can be released by the caller.
    fn vmm_map(&self, vmm: &VmmApi, device: u32, handle: CuMemHandle, len: usize) -> Result<u64, TransportError> {
        let mut base: CuDevicePtr = 0;
        // SAFETY: the driver writes the reserved range's address through the pointer.
        self.check("cuMemAddressReserve", unsafe { (vmm.address_reserve)(&mut base, len, 0, 0, 0) })?;
        // SAFETY: `[base, +len)` was just reserved and nothing is mapped there.
        let mapped = self.check("cuMemMap", unsafe { (vmm.map)(base, len, 0, handle, 0) });
        let access = mapped.and_then(|()| {
            let desc = CuMemAccessDesc {
                location: CuMemLocation { kind: CU_MEM_LOCATION_TYPE_DEVICE, id: device as c_int },
                flags: CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            };
            // SAFETY: one descriptor, read by the driver during the call; the range is mapped.
            let set = self.check("cuMemSetAccess", unsafe { (vmm.set_access)(base, len, &desc, 1) });
            if set.is_err() {
                // SAFETY: mapped above, used by nobody yet.
                unsafe { (vmm.unmap)(base, len) };
            }
            set
        });
        if let Err(e) = access {
            // SAFETY: reserved above; nothing is mapped there any more.
            unsafe { (vmm.address_free)(base, len) };
            return Err(e);
        }
        Ok(base)
    }

    /// An idle stream of `device` (the caller's context current), or a new one.
    fn take_stream(&self, device: u32) -> Result<CuStream, TransportError> {
        let idle = {
            let mut streams = self.streams.lock();
            streams.iter().position(|(d, _)| *d == device).map(|i| streams.swap_remove(i).1)
        };
        if let Some(stream) = idle {
            return Ok(stream as CuStream);
        }
        let mut stream: CuStream = std::ptr::null_mut();
        // SAFETY: the driver writes the new stream's handle through the pointer.
        self.check("cuStreamCreate", unsafe { (self.api.stream_create)(&mut stream, CU_STREAM_NON_BLOCKING) })?;
        Ok(stream)
    }

    fn attribute<T: Default>(&self, attribute: c_int, addr: u64) -> Result<Option<T>, TransportError> {
        let mut value = T::default();
        // SAFETY: `value` has the type the driver writes for `attribute` (callers pair them).
        let code = unsafe { (self.api.pointer_get_attribute)(&mut value as *mut T as *mut c_void, attribute, addr) };
        match code {
            CUDA_SUCCESS => Ok(Some(value)),
            // Memory the driver does not know: plain host memory.
            CUDA_ERROR_INVALID_VALUE => Ok(None),
            code => self.check("cuPointerGetAttribute", code).map(|()| None),
        }
    }
}

impl DeviceApi for Cuda {
    fn vendor(&self) -> &'static str {
        "cuda"
    }

    fn device_count(&self) -> Result<u32, TransportError> {
        Ok(self.devices)
    }

    fn allocation(&self, addr: u64) -> Result<Option<Allocation>, TransportError> {
        let Some(kind) = self.attribute::<c_uint>(CU_POINTER_ATTRIBUTE_MEMORY_TYPE, addr)? else {
            return Ok(None);
        };
        // Managed memory is reachable by the CPU: it moves as host memory.
        let managed = self.attribute::<c_int>(CU_POINTER_ATTRIBUTE_IS_MANAGED, addr)?.unwrap_or(0) != 0;
        if kind != CU_MEMORYTYPE_DEVICE || managed {
            return Ok(None);
        }
        let Some(device) = self.attribute::<c_int>(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, addr)? else {
            return Ok(None);
        };
        let device = u32::try_from(device).map_err(|_| TransportError::Driver {
            call: "cuPointerGetAttribute",
            reason: format!("device ordinal {device} of {addr:#x}"),
        })?;
        self.enter(device)?;
        let (mut base, mut len): (CuDevicePtr, usize) = (0, 0);
        // SAFETY: the driver writes the allocation's base and size through the pointers.
        self.check("cuMemGetAddressRange", unsafe { (self.api.mem_get_address_range)(&mut base, &mut len, addr) })?;
        Ok(Some(Allocation { device, base, len: len as u64 }))
    }

    fn copy_start(&self, device: u32, dst: u64, src: u64, len: u64) -> Result<PendingCopy, TransportError> {
        self.enter(device)?;
        let stream = self.take_stream(device)?;
        // SAFETY: the caller (a `Copying`) keeps `[src, +len)` and `[dst, +len)` valid until
        // `copy_wait` has synchronised the stream.
        let queued = self.check("cuMemcpyAsync", unsafe { (self.api.memcpy_async)(dst, src, len as usize, stream) });
        if let Err(e) = queued {
            // SAFETY: a stream of ours; whatever was queued on it before has ended.
            unsafe { (self.api.stream_synchronize)(stream) };
            return Err(e);
        }
        Ok(PendingCopy(stream as u64))
    }

    fn copy_wait(&self, device: u32, copy: PendingCopy) -> Result<(), TransportError> {
        self.enter(device)?;
        let stream = copy.0 as CuStream;
        // SAFETY: a stream `copy_start` took from the pool, waited for once.
        let done = self.check("cuStreamSynchronize", unsafe { (self.api.stream_synchronize)(stream) });
        if done.is_ok() {
            self.streams.lock().push((device, stream as usize));
        }
        done
    }

    fn copy(&self, device: u32, dst: u64, src: u64, len: u64) -> Result<(), TransportError> {
        self.enter(device)?;
        let stream = self.take_stream(device)?;
        // SAFETY: the caller (a transport) guarantees that `[src, +len)` and `[dst, +len)` are
        // memory it may read and write now (registered, claimed, or a bounce buffer of its
        // own) until this call returns: the stream is synchronised before it does.
        let queued = self.check("cuMemcpyAsync", unsafe { (self.api.memcpy_async)(dst, src, len as usize, stream) });
        // SAFETY: a stream created above (or kept idle in the pool).
        let done = self.check("cuStreamSynchronize", unsafe { (self.api.stream_synchronize)(stream) });
        // A stream whose copy failed is not reused (its state is the driver's to report).
        if queued.is_ok() && done.is_ok() {
            self.streams.lock().push((device, stream as usize));
        }
        queued.and(done)
    }

    fn ipc_export(&self, allocation: &Allocation) -> Result<IpcHandle, TransportError> {
        self.enter(allocation.device)?;
        let mut handle = CuIpcMemHandle { reserved: [0; IPC_HANDLE_LEN] };
        // SAFETY: the driver fills the 64-byte handle for the allocation's base address.
        self.check("cuIpcGetMemHandle", unsafe { (self.api.ipc_get_mem_handle)(&mut handle, allocation.base) })?;
        Ok(IpcHandle(handle.reserved))
    }

    fn ipc_open(&self, device: u32, handle: &IpcHandle) -> Result<u64, TransportError> {
        self.enter(device)?;
        let mut base: CuDevicePtr = 0;
        let handle = CuIpcMemHandle { reserved: handle.0 };
        // SAFETY: the driver maps the exported allocation and writes its address here; the
        // handle is passed by value as cuda.h declares.
        self.check("cuIpcOpenMemHandle", unsafe {
            (self.api.ipc_open_mem_handle)(&mut base, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
        })?;
        Ok(base)
    }

    fn ipc_close(&self, device: u32, base: u64) -> Result<(), TransportError> {
        self.enter(device)?;
        // SAFETY: `base` was returned by cuIpcOpenMemHandle and no copy uses it any more
        // (its last user dropped it).
        self.check("cuIpcCloseMemHandle", unsafe { (self.api.ipc_close_mem_handle)(base) })
    }

    fn vmm_export(&self, allocation: &Allocation) -> Result<Option<OwnedFd>, TransportError> {
        let Some(vmm) = self.api.vmm.as_ref() else {
            return Ok(None);
        };
        self.enter(allocation.device)?;
        let mut handle: CuMemHandle = 0;
        // SAFETY: the driver writes the handle of the allocation mapped at `base` (and retains
        // it), or fails for memory that is not of cuMemMap.
        let code = unsafe { (vmm.retain)(&mut handle, allocation.base as *mut c_void) };
        if code != CUDA_SUCCESS {
            tracing::trace!("device memory: {:#x} is not VMM memory ({})", allocation.base, self.error_text(code));
            return Ok(None);
        }
        let mut fd: c_int = -1;
        // SAFETY: for a POSIX descriptor the driver writes an int through the pointer.
        let exported = self.check("cuMemExportToShareableHandle", unsafe {
            (vmm.export)((&mut fd as *mut c_int).cast(), handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)
        });
        // SAFETY: the handle retained above, released once.
        let released = self.check("cuMemRelease", unsafe { (vmm.release)(handle) });
        exported?;
        if fd < 0 {
            return Err(TransportError::Driver {
                call: "cuMemExportToShareableHandle",
                reason: format!("descriptor {fd}"),
            });
        }
        // SAFETY: a descriptor the driver opened for this caller, owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        released?;
        Ok(Some(fd))
    }

    fn vmm_import(&self, device: u32, fd: OwnedFd, len: u64) -> Result<u64, TransportError> {
        let vmm = self.vmm_api("cuMemImportFromShareableHandle")?;
        let len = usize::try_from(len)
            .map_err(|_| TransportError::Driver { call: "cuMemAddressReserve", reason: format!("{len} bytes") })?;
        self.enter(device)?;
        let raw = fd.into_raw_fd();
        let mut handle: CuMemHandle = 0;
        // SAFETY: the driver writes the imported allocation's handle; a POSIX descriptor is
        // passed as the pointer's value, and stays ours (closed below).
        let imported = self.check("cuMemImportFromShareableHandle", unsafe {
            (vmm.import)(&mut handle, raw as usize as *mut c_void, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        });
        // SAFETY: the descriptor taken from `fd` above; the driver holds its own reference.
        drop(unsafe { OwnedFd::from_raw_fd(raw) });
        imported?;
        let mapped = self.vmm_map(vmm, device, handle, len);
        // SAFETY: the handle imported above, released once; a mapping holds the allocation.
        let released = self.check("cuMemRelease", unsafe { (vmm.release)(handle) });
        let base = mapped?;
        if let Err(e) = released {
            tracing::debug!("device memory: releasing an imported handle failed: {e}");
        }
        Ok(base)
    }

    fn vmm_close(&self, device: u32, base: u64, len: u64) -> Result<(), TransportError> {
        let vmm = self.vmm_api("cuMemUnmap")?;
        self.enter(device)?;
        // SAFETY: `[base, +len)` was mapped by `vmm_import` and no copy uses it any more.
        let unmapped = self.check("cuMemUnmap", unsafe { (vmm.unmap)(base, len as usize) });
        // SAFETY: the range `vmm_import` reserved, unmapped above.
        let freed = self.check("cuMemAddressFree", unsafe { (vmm.address_free)(base, len as usize) });
        unmapped.and(freed)
    }

    fn vmm_alloc(&self, device: u32, len: u64) -> Result<u64, TransportError> {
        let vmm = self.vmm_api("cuMemCreate")?;
        self.enter(device)?;
        let prop = CuMemAllocationProp {
            kind: CU_MEM_ALLOCATION_TYPE_PINNED,
            requested_handle_types: CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            location: CuMemLocation { kind: CU_MEM_LOCATION_TYPE_DEVICE, id: device as c_int },
            win32_handle_meta_data: std::ptr::null_mut(),
            alloc_flags: [0; 8],
        };
        let mut granularity: usize = 0;
        // SAFETY: the driver reads `prop` and writes one size through the pointer.
        self.check("cuMemGetAllocationGranularity", unsafe {
            (vmm.granularity)(&mut granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
        })?;
        let len = usize::try_from(len)
            .ok()
            .and_then(|len| len.max(1).checked_next_multiple_of(granularity.max(1)))
            .ok_or_else(|| TransportError::Driver { call: "cuMemCreate", reason: format!("{len} bytes") })?;
        let mut handle: CuMemHandle = 0;
        // SAFETY: the driver reads `prop` and writes the new allocation's handle.
        self.check("cuMemCreate", unsafe { (vmm.create)(&mut handle, len, &prop, 0) })?;
        let mapped = self.vmm_map(vmm, device, handle, len);
        // SAFETY: the handle created above, released once; the mapping holds the allocation.
        unsafe { (vmm.release)(handle) };
        mapped
    }

    fn vmm_free(&self, device: u32, addr: u64) -> Result<(), TransportError> {
        self.enter(device)?;
        let (mut base, mut len): (CuDevicePtr, usize) = (0, 0);
        // SAFETY: the driver writes the mapping's base and size through the pointers.
        self.check("cuMemGetAddressRange", unsafe { (self.api.mem_get_address_range)(&mut base, &mut len, addr) })?;
        self.vmm_close(device, base, len as u64)
    }

    fn alloc(&self, device: u32, len: u64) -> Result<u64, TransportError> {
        self.enter(device)?;
        let mut addr: CuDevicePtr = 0;
        // SAFETY: the driver writes the new allocation's address through the pointer.
        self.check("cuMemAlloc", unsafe { (self.api.mem_alloc)(&mut addr, len as usize) })?;
        Ok(addr)
    }

    fn free(&self, device: u32, addr: u64) -> Result<(), TransportError> {
        self.enter(device)?;
        // SAFETY: `addr` came from `alloc`, and its owner no longer uses it.
        self.check("cuMemFree", unsafe { (self.api.mem_free)(addr) })
    }

    fn alloc_pinned(&self, len: u64) -> Result<u64, TransportError> {
        self.enter(0)?;
        let mut addr: *mut c_void = std::ptr::null_mut();
        // SAFETY: the driver writes the new host allocation's address through the pointer.
        self.check("cuMemHostAlloc", unsafe {
            (self.api.mem_host_alloc)(&mut addr, len as usize, CU_MEMHOSTALLOC_PORTABLE)
        })?;
        Ok(addr as u64)
    }

    fn free_pinned(&self, addr: u64) -> Result<(), TransportError> {
        self.enter(0)?;
        // SAFETY: `addr` came from `alloc_pinned`, and its owner no longer uses it.
        self.check("cuMemFreeHost", unsafe { (self.api.mem_free_host)(addr as *mut c_void) })
    }

    fn dmabuf(&self, device: u32, addr: u64, len: u64) -> Result<Option<DmaBuf>, TransportError> {
        let Some(api) = self.api.dmabuf.as_ref() else {
            tracing::debug!("device memory: this CUDA driver lacks cuMemGetHandleForAddressRange (CUDA 11.7 or later)");
            return Ok(None);
        };
        self.enter(device)?;
        let mut dev: CuDevice = 0;
        // SAFETY: the driver writes one device handle through the pointer.
        self.check("cuDeviceGet", unsafe { (self.api.device_get)(&mut dev, device as c_int) })?;
        let mut supported: c_int = 0;
        // SAFETY: the driver writes one int through the pointer.
        let code = unsafe { (api.device_get_attribute)(&mut supported, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, dev) };
        if code != CUDA_SUCCESS || supported == 0 {
            let answer = if code == CUDA_SUCCESS { "0".to_string() } else { self.error_text(code) };
            tracing::debug!("device memory: cuda:{device} exports no dma-buf (DMA_BUF_SUPPORTED: {answer})");
            return Ok(None);
        }
        // The driver exports whole host pages only.
        let page = rustix::param::page_size() as u64;
        let (start, span, offset) = page_span(addr, len, page).ok_or_else(|| {
            TransportError::InvalidArgument(format!("no dma-buf for the device range [{addr:#x}, +{len})"))
        })?;
        let span = usize::try_from(span).map_err(|_| TransportError::Driver {
            call: "cuMemGetHandleForAddressRange",
            reason: format!("{span} bytes"),
        })?;
        let mut fd: c_int = -1;
        // SAFETY: for a dma-buf the driver writes an int (the descriptor) through the pointer;
        // the range is whole pages of device memory the caller registered.
        self.check("cuMemGetHandleForAddressRange", unsafe {
            (api.get_handle_for_address_range)(
                (&mut fd as *mut c_int).cast(),
                start,
                span,
                CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                0,
            )
        })?;
        if fd < 0 {
            return Err(TransportError::Driver {
                call: "cuMemGetHandleForAddressRange",
                reason: format!("descriptor {fd}"),
            });
        }
        // SAFETY: a descriptor the driver opened for this caller, owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Some(DmaBuf { fd, offset }))
    }

    fn launch_host_func(&self, device: u32, stream: u64, f: HostFunc) -> Result<(), TransportError> {
        let Some(launch) = self.api.launch_host_func else {
            return Err(TransportError::Driver {
                call: "cuLaunchHostFunc",
                reason: "this CUDA driver lacks it (CUDA 10 or later has it)".into(),
            });
        };
        self.enter_unless_current(device)?;
        let data = Box::into_raw(Box::new(f));
        // SAFETY: `run_host_func` takes back the box made here exactly once, when the driver
        // runs it; `stream` is the caller's handle (0: the default stream of the current
        // context), which the driver checks.
        let queued = self.check("cuLaunchHostFunc", unsafe { launch(stream as CuStream, run_host_func, data.cast()) });
        if queued.is_err() {
            // SAFETY: the driver refused, so it will never run the callback: the box is still ours.
            drop(unsafe { Box::from_raw(data) });
        }
        queued
    }
}

/// What the driver calls for [`DeviceApi::launch_host_func`]: runs the boxed work once. A
/// panic stops here (it must not unwind into the driver).
unsafe extern "C" fn run_host_func(data: *mut c_void) {
    // SAFETY: `data` is the box `launch_host_func` leaked for this one call.
    let f = unsafe { Box::from_raw(data.cast::<HostFunc>()) };
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err() {
        tracing::error!("device memory: work queued on a stream panicked");
    }
}
