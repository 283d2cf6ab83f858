//! A fake CUDA driver for tests: the subset of the driver API Crescent calls, with device
//! memory simulated by a memfd mapped twice.
//!
//! * The "device pointer" is a `PROT_NONE` mapping: any CPU touch of device memory kills the
//!   process with SIGSEGV, as it would on a real GPU (where the address is not host memory).
//! * A second, hidden read-write mapping of the same memfd is what this driver's copies use.
//! * An IPC handle names the exporting process, the memfd's descriptor number and the size:
//!   another process opens it through `/proc/<pid>/fd/<n>` and maps it the same two ways.
//!
//! * Memory of the virtual memory management API (`cuMemCreate`, `cuMemMap`...): an allocation
//!   handle is a memfd (named `fake-cuda-vmm-<pid>` after the creating process, so a test can
//!   find where it is mapped), `cuMemAddressReserve` reserves `PROT_NONE` addresses, `cuMemMap`
//!   maps the memfd over them (and a shadow), and copies refuse it until `cuMemSetAccess`.
//!   `cuMemExportToShareableHandle` hands out a duplicate of the memfd as the POSIX file
//!   descriptor; `cuIpcGetMemHandle` refuses such memory, as the real driver does.
//! * A stream runs the work queued on it in order: `cuLaunchHostFunc` runs its function on a
//!   thread of its own once the stream's earlier work is done; a copy on the stream, and
//!   `cuStreamSynchronize`, wait for that work first. Stream 0 is one default stream.
//!
//! * dma-buf export (`cuMemGetHandleForAddressRange`, for GPUDirect RDMA): the device attribute
//!   `DMA_BUF_SUPPORTED` says yes unless `FAKE_CUDA_DMABUF=0`; the range must be whole host
//!   pages inside one `cuMemAlloc` allocation, and the "dma-buf" handed out is a duplicate of
//!   its memfd. That is not a real dma-buf: a NIC's `ibv_reg_dmabuf_mr` refuses it, which is
//!   the fallback the tests check. VMM memory is refused (as the real driver refuses memory
//!   not allocated GPUDirect-RDMA-capable).
//! * `FAKE_CUDA_HOST_VISIBLE=1` (read at each `cuMemAlloc`) maps the device pointer readable
//!   and writable instead of `PROT_NONE`: a NIC can then register the pointer itself, as it can
//!   real device memory where nvidia-peermem is loaded. Only the GPUDirect route test sets it.
//!
//! It reports `FAKE_CUDA_DEVICES` devices (default 2). Built by `tests/build.rs` with plain
//! `rustc` (no dependencies) into a cdylib that tests name with `CRESCENT_CUDA_DRIVER`.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::cell::Cell;
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
use std::sync::Mutex;

type CuResult = c_int;

const SUCCESS: CuResult = 0;
const INVALID_VALUE: CuResult = 1;
const OUT_OF_MEMORY: CuResult = 2;
const INVALID_DEVICE: CuResult = 101;
const INVALID_CONTEXT: CuResult = 201;
const INVALID_HANDLE: CuResult = 400;
const NOT_SUPPORTED: CuResult = 801;

const PROT_NONE: c_int = 0;
const PROT_RW: c_int = 1 | 2;
const MAP_SHARED: c_int = 1;
const MAP_PRIVATE: c_int = 2;
const MAP_ANONYMOUS: c_int = 0x20;
const MFD_CLOEXEC: c_uint = 1;

const MAGIC: &[u8; 8] = b"FAKECUDA";

/// `CUipcMemHandle`: 64 bytes, passed by value as a C struct.
#[repr(C)]
pub struct IpcHandle {
    reserved: [u8; 64],
}

extern "C" {
    fn memfd_create(name: *const c_char, flags: c_uint) -> c_int;
    fn ftruncate(fd: c_int, len: i64) -> c_int;
    fn mmap(addr: *mut c_void, len: usize, prot: c_int, flags: c_int, fd: c_int, off: i64) -> *mut c_void;
    fn munmap(addr: *mut c_void, len: usize) -> c_int;
    fn fcntl(fd: c_int, cmd: c_int, arg: c_int) -> c_int;
}

const MAP_FIXED: c_int = 0x10;
const MAP_NORESERVE: c_int = 0x4000;
const F_DUPFD_CLOEXEC: c_int = 1030;

struct Alloc {
    /// The device pointer: a PROT_NONE mapping.
    base: u64,
    len: u64,
    /// The read-write mapping of the same pages, which copies use.
    shadow: u64,
    device: u32,
    /// The memfd (kept open so that other processes can open the allocation).
    fd: Option<OwnedFd>,
    /// Opened from another process's handle (closed with cuIpcCloseMemHandle).
    imported: bool,
    /// Mapped with cuMemMap: the allocation handle's id (unmapped with cuMemUnmap).
    vmm: Option<u64>,
    /// cuMemSetAccess was called on it (always true for other memory).
    access: bool,
}

/// An allocation handle of the VMM API: its memfd, held by its handle and its mappings.
struct Handle {
    id: u64,
    fd: OwnedFd,
    len: u64,
    device: u32,
    /// Created asking for POSIX descriptors (or imported from one): exportable.
    exportable: bool,
    /// Handles given out plus mappings; the memfd is closed at zero.
    refs: u32,
}

static HANDLES: Mutex<Vec<Handle>> = Mutex::new(Vec::new());
static NEXT_HANDLE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
/// Address ranges reserved with cuMemAddressReserve.
static RESERVED: Mutex<Vec<(u64, u64)>> = Mutex::new(Vec::new());

static ALLOCS: Mutex<Vec<Alloc>> = Mutex::new(Vec::new());
static PINNED: Mutex<Vec<(u64, usize)>> = Mutex::new(Vec::new());

thread_local! {
    static CURRENT: Cell<u32> = const { Cell::new(0) };
    /// Whether cuCtxSetCurrent was called on this thread (cuCtxGetCurrent answers null before).
    static CONTEXT_SET: Cell<bool> = const { Cell::new(false) };
}

/// A stream: the last work queued on it (each piece of work waits for the one before).
struct Stream {
    last: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// Stream 0.
static DEFAULT_STREAM: Stream = Stream { last: Mutex::new(None) };

/// The stream behind a handle (0: the default stream).
unsafe fn stream<'a>(handle: *mut c_void) -> &'a Stream {
    if handle.is_null() {
        &DEFAULT_STREAM
    } else {
        &*(handle as *const Stream)
    }
}

impl Stream {
    /// Waits for the work queued so far.
    fn drain(&self) {
        let last = self.last.lock().unwrap().take();
        if let Some(work) = last {
            let _ = work.join();
        }
    }
}

fn devices() -> u32 {
    std::env::var("FAKE_CUDA_DEVICES").ok().and_then(|v| v.parse().ok()).unwrap_or(2)
}

/// Maps `fd` twice (device view, shadow view); `None` if either mapping fails. The device view
/// is `PROT_NONE` unless `visible`.
fn map_twice(fd: c_int, len: usize) -> Option<(u64, u64)> {
    map_twice_as(fd, len, false)
}

fn map_twice_as(fd: c_int, len: usize, visible: bool) -> Option<(u64, u64)> {
    let prot = if visible { PROT_RW } else { PROT_NONE };
    // SAFETY: fresh shared mappings of a file we hold; no existing memory is touched.
    unsafe {
        let base = mmap(std::ptr::null_mut(), len, prot, MAP_SHARED, fd, 0);
        if base as isize == -1 {
            return None;
        }
        let shadow = mmap(std::ptr::null_mut(), len, PROT_RW, MAP_SHARED, fd, 0);
        if shadow as isize == -1 {
            munmap(base, len);
            return None;
        }
        Some((base as u64, shadow as u64))
    }
}

fn unmap(a: &Alloc) {
    // SAFETY: the two mappings this allocation made.
    unsafe {
        munmap(a.base as *mut c_void, a.len as usize);
        munmap(a.shadow as *mut c_void, a.len as usize);
    }
}

/// Where the CPU may touch `[ptr, +len)`: the shadow for device memory (which must hold all of
/// it), the address itself for host memory.
fn resolve(allocs: &[Alloc], ptr: u64, len: u64) -> Result<u64, CuResult> {
    for a in allocs {
        if ptr >= a.base && ptr < a.base + a.len {
            if ptr.checked_add(len).is_none_or(|end| end > a.base + a.len) {
                return Err(INVALID_VALUE);
            }
            if !a.access {
                return Err(INVALID_VALUE);
            }
            return Ok(a.shadow + (ptr - a.base));
        }
    }
    Ok(ptr)
}

#[no_mangle]
pub extern "C" fn cuInit(_flags: c_uint) -> CuResult {
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CuResult {
    *count = devices() as c_int;
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(device: *mut c_int, ordinal: c_int) -> CuResult {
    if ordinal < 0 || ordinal as u32 >= devices() {
        return INVALID_DEVICE;
    }
    *device = ordinal;
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(ctx: *mut *mut c_void, device: c_int) -> CuResult {
    if device < 0 || device as u32 >= devices() {
        return INVALID_DEVICE;
    }
    *ctx = (device as usize + 1) as *mut c_void;
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuCtxSetCurrent(ctx: *mut c_void) -> CuResult {
    let n = ctx as usize;
    if n == 0 || n as u32 > devices() {
        return INVALID_CONTEXT;
    }
    CURRENT.with(|c| c.set(n as u32 - 1));
    CONTEXT_SET.with(|c| c.set(true));
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(ctx: *mut *mut c_void) -> CuResult {
    *ctx = if CONTEXT_SET.with(Cell::get) { (CURRENT.with(Cell::get) as usize + 1) as *mut c_void } else { std::ptr::null_mut() };
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttribute(data: *mut c_void, attribute: c_int, ptr: u64) -> CuResult {
    let allocs = ALLOCS.lock().unwrap();
    let Some(a) = allocs.iter().find(|a| ptr >= a.base && ptr < a.base + a.len) else {
        return INVALID_VALUE;
    };
    match attribute {
        2 => *(data as *mut c_uint) = 2, // CU_MEMORYTYPE_DEVICE
        8 => *(data as *mut c_int) = 0,  // not managed
        9 => *(data as *mut c_int) = a.device as c_int,
        _ => return INVALID_VALUE,
    }
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetAddressRange_v2(base: *mut u64, size: *mut usize, ptr: u64) -> CuResult {
    let allocs = ALLOCS.lock().unwrap();
    let Some(a) = allocs.iter().find(|a| ptr >= a.base && ptr < a.base + a.len) else {
        return INVALID_VALUE;
    };
    if !base.is_null() {
        *base = a.base;
    }
    if !size.is_null() {
        *size = a.len as usize;
    }
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamCreate(handle: *mut *mut c_void, _flags: c_uint) -> CuResult {
    *handle = Box::into_raw(Box::new(Stream { last: Mutex::new(None) })).cast();
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize(handle: *mut c_void) -> CuResult {
    stream(handle).drain();
    SUCCESS
}

/// Runs `f(data)` on a thread of its own once the stream's earlier work is done.
#[no_mangle]
pub unsafe extern "C" fn cuLaunchHostFunc(
    handle: *mut c_void,
    f: Option<unsafe extern "C" fn(*mut c_void)>,
    data: *mut c_void,
) -> CuResult {
    let Some(f) = f else {
        return INVALID_VALUE;
    };
    let s = stream(handle);
    let mut last = s.last.lock().unwrap();
    let before = last.take();
    let data = data as usize;
    let work = std::thread::Builder::new().name("fake-cuda-host-fn".into()).spawn(move || {
        if let Some(before) = before {
            let _ = before.join();
        }
        f(data as *mut c_void);
    });
    match work {
        Ok(work) => {
            *last = Some(work);
            SUCCESS
        }
        Err(_) => OUT_OF_MEMORY,
    }
}

/// Copies once the stream's earlier work is done, before returning.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyAsync(dst: u64, src: u64, len: usize, handle: *mut c_void) -> CuResult {
    stream(handle).drain();
    let allocs = ALLOCS.lock().unwrap();
    let (to, from) = match (resolve(&allocs, dst, len as u64), resolve(&allocs, src, len as u64)) {
        (Ok(to), Ok(from)) => (to, from),
        _ => return INVALID_VALUE,
    };
    std::ptr::copy(from as *const u8, to as *mut u8, len);
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(ptr: *mut u64, len: usize) -> CuResult {
    if len == 0 {
        return INVALID_VALUE;
    }
    let fd = memfd_create(c"fake-cuda".as_ptr(), MFD_CLOEXEC);
    if fd < 0 {
        return OUT_OF_MEMORY;
    }
    let fd = OwnedFd::from_raw_fd(fd);
    if ftruncate(fd.as_raw_fd(), len as i64) != 0 {
        return OUT_OF_MEMORY;
    }
    let visible = std::env::var("FAKE_CUDA_HOST_VISIBLE").is_ok_and(|v| v == "1");
    let Some((base, shadow)) = map_twice_as(fd.as_raw_fd(), len, visible) else {
        return OUT_OF_MEMORY;
    };
    let device = CURRENT.with(Cell::get);
    ALLOCS.lock().unwrap().push(Alloc { base, len: len as u64, shadow, device, fd: Some(fd), imported: false, vmm: None, access: true });
    *ptr = base;
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuMemFree_v2(ptr: u64) -> CuResult {
    let mut allocs = ALLOCS.lock().unwrap();
    let Some(i) = allocs.iter().position(|a| a.base == ptr && !a.imported && a.vmm.is_none()) else {
        return INVALID_VALUE;
    };
    let a = allocs.swap_remove(i);
    unmap(&a);
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuMemHostAlloc(ptr: *mut *mut c_void, len: usize, _flags: c_uint) -> CuResult {
    let p = mmap(std::ptr::null_mut(), len, PROT_RW, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if p as isize == -1 {
        return OUT_OF_MEMORY;
    }
    PINNED.lock().unwrap().push((p as u64, len));
    *ptr = p;
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeHost(ptr: *mut c_void) -> CuResult {
    let mut pinned = PINNED.lock().unwrap();
    let Some(i) = pinned.iter().position(|(p, _)| *p == ptr as u64) else {
        return INVALID_VALUE;
    };
    let (p, len) = pinned.swap_remove(i);
    munmap(p as *mut c_void, len);
    SUCCESS
}

/// The handle: magic, pid, descriptor number, size, device.
#[no_mangle]
pub unsafe extern "C" fn cuIpcGetMemHandle(handle: *mut IpcHandle, ptr: u64) -> CuResult {
    let allocs = ALLOCS.lock().unwrap();
    let Some(a) = allocs.iter().find(|a| a.base == ptr && !a.imported) else {
        return INVALID_VALUE;
    };
    // As the real driver: memory of cuMemCreate has no legacy IPC handle.
    if a.vmm.is_some() {
        return INVALID_VALUE;
    }
    let fd = a.fd.as_ref().expect("an allocation of this process keeps its memfd").as_raw_fd();
    let mut h = [0u8; 64];
    h[..8].copy_from_slice(MAGIC);
    h[8..12].copy_from_slice(&std::process::id().to_le_bytes());
    h[12..16].copy_from_slice(&fd.to_le_bytes());
    h[16..24].copy_from_slice(&a.len.to_le_bytes());
    h[24..28].copy_from_slice(&a.device.to_le_bytes());
    (*handle).reserved = h;
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuIpcOpenMemHandle_v2(ptr: *mut u64, handle: IpcHandle, _flags: c_uint) -> CuResult {
    let handle = handle.reserved;
    if &handle[..8] != MAGIC {
        return INVALID_HANDLE;
    }
    let pid = u32::from_le_bytes(handle[8..12].try_into().unwrap());
    let fd = i32::from_le_bytes(handle[12..16].try_into().unwrap());
    let len = u64::from_le_bytes(handle[16..24].try_into().unwrap());
    // As the real driver: a process cannot open its own allocation's handle.
    if pid == std::process::id() {
        return INVALID_CONTEXT;
    }
    let file = match std::fs::OpenOptions::new().read(true).write(true).open(format!("/proc/{pid}/fd/{fd}")) {
        Ok(f) => f,
        Err(_) => return INVALID_HANDLE,
    };
    match file.metadata() {
        Ok(m) if m.len() == len => {}
        _ => return INVALID_HANDLE,
    }
    let fd = file.into_raw_fd();
    let mapped = map_twice(fd, len as usize);
    drop(OwnedFd::from_raw_fd(fd));
    let Some((base, shadow)) = mapped else {
        return OUT_OF_MEMORY;
    };
    let device = CURRENT.with(Cell::get);
    ALLOCS.lock().unwrap().push(Alloc { base, len, shadow, device, fd: None, imported: true, vmm: None, access: true });
    *ptr = base;
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuIpcCloseMemHandle(ptr: u64) -> CuResult {
    let mut allocs = ALLOCS.lock().unwrap();
    let Some(i) = allocs.iter().position(|a| a.base == ptr && a.imported) else {
        return INVALID_VALUE;
    };
    let a = allocs.swap_remove(i);
    unmap(&a);
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuGetErrorString(code: CuResult, text: *mut *const c_char) -> CuResult {
    let s: &'static std::ffi::CStr = match code {
        SUCCESS => c"no error",
        INVALID_VALUE => c"invalid argument",
        OUT_OF_MEMORY => c"out of memory",
        INVALID_DEVICE => c"invalid device ordinal",
        INVALID_CONTEXT => c"invalid device context",
        INVALID_HANDLE => c"invalid resource handle",
        NOT_SUPPORTED => c"operation not supported",
        _ => return INVALID_VALUE,
    };
    *text = s.as_ptr();
    SUCCESS
}

extern "C" {
    fn sysconf(name: c_int) -> i64;
}
const SC_PAGESIZE: c_int = 30;

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetAttribute(value: *mut c_int, attribute: c_int, device: c_int) -> CuResult {
    if device < 0 || device as u32 >= devices() {
        return INVALID_DEVICE;
    }
    match attribute {
        // CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED
        124 => *value = c_int::from(std::env::var("FAKE_CUDA_DMABUF").map_or(true, |v| v != "0")),
        _ => return INVALID_VALUE,
    }
    SUCCESS
}

/// A "dma-buf" of whole pages of one `cuMemAlloc` allocation: a duplicate of its memfd (the
/// caller's to close).
#[no_mangle]
pub unsafe extern "C" fn cuMemGetHandleForAddressRange(handle: *mut c_void, ptr: u64, len: usize, kind: c_int, flags: u64) -> CuResult {
    // CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, no flags.
    if handle.is_null() || kind != 1 || flags != 0 || len == 0 {
        return INVALID_VALUE;
    }
    if std::env::var("FAKE_CUDA_DMABUF").is_ok_and(|v| v == "0") {
        return NOT_SUPPORTED;
    }
    let page = sysconf(SC_PAGESIZE) as u64;
    if ptr % page != 0 || len as u64 % page != 0 {
        return INVALID_VALUE;
    }
    let allocs = ALLOCS.lock().unwrap();
    let Some(a) = allocs.iter().find(|a| ptr >= a.base && ptr < a.base + a.len) else {
        return INVALID_VALUE;
    };
    // The allocation's last page is whole on the device, whatever size was asked for.
    if ptr + len as u64 > a.base + a.len.next_multiple_of(page) {
        return INVALID_VALUE;
    }
    let Some(fd) = a.fd.as_ref().filter(|_| a.vmm.is_none() && !a.imported) else {
        return NOT_SUPPORTED;
    };
    let dup = fcntl(fd.as_raw_fd(), F_DUPFD_CLOEXEC, 0);
    if dup < 0 {
        return OUT_OF_MEMORY;
    }
    *(handle as *mut c_int) = dup;
    SUCCESS
}

/// `CUmemAllocationProp`'s first fields: type, requested handle types, location (type, id).
#[repr(C)]
pub struct AllocationProp {
    kind: c_int,
    handle_types: c_int,
    location_kind: c_int,
    location_id: c_int,
}

const POSIX_FD: c_int = 1;
const GRANULARITY: usize = 2 << 20;

#[no_mangle]
pub unsafe extern "C" fn cuMemGetAllocationGranularity(g: *mut usize, prop: *const AllocationProp, _o: c_int) -> CuResult {
    if g.is_null() || prop.is_null() {
        return INVALID_VALUE;
    }
    *g = GRANULARITY;
    SUCCESS
}

fn new_handle(fd: OwnedFd, len: u64, device: u32, exportable: bool) -> u64 {
    let id = NEXT_HANDLE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    HANDLES.lock().unwrap().push(Handle { id, fd, len, device, exportable, refs: 1 });
    id
}

/// Drops one reference of handle `id`; the memfd closes with the last.
fn unref(handles: &mut Vec<Handle>, id: u64) -> bool {
    let Some(i) = handles.iter().position(|h| h.id == id) else {
        return false;
    };
    handles[i].refs -= 1;
    if handles[i].refs == 0 {
        handles.swap_remove(i);
    }
    true
}

#[no_mangle]
pub unsafe extern "C" fn cuMemCreate(handle: *mut u64, len: usize, prop: *const AllocationProp, _flags: u64) -> CuResult {
    if prop.is_null() || len == 0 || len % GRANULARITY != 0 {
        return INVALID_VALUE;
    }
    let prop = &*prop;
    if prop.kind != 1 || prop.location_kind != 1 || prop.location_id < 0 || prop.location_id as u32 >= devices() {
        return INVALID_VALUE;
    }
    let name = std::ffi::CString::new(format!("fake-cuda-vmm-{}", std::process::id())).unwrap();
    let fd = memfd_create(name.as_ptr(), MFD_CLOEXEC);
    if fd < 0 {
        return OUT_OF_MEMORY;
    }
    let fd = OwnedFd::from_raw_fd(fd);
    if ftruncate(fd.as_raw_fd(), len as i64) != 0 {
        return OUT_OF_MEMORY;
    }
    *handle = new_handle(fd, len as u64, prop.location_id as u32, prop.handle_types & POSIX_FD != 0);
    SUCCESS
}

#[no_mangle]
pub extern "C" fn cuMemRelease(handle: u64) -> CuResult {
    if unref(&mut HANDLES.lock().unwrap(), handle) {
        SUCCESS
    } else {
        INVALID_HANDLE
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAddressReserve(ptr: *mut u64, len: usize, _align: usize, _addr: u64, _flags: u64) -> CuResult {
    if len == 0 || len % GRANULARITY != 0 {
        return INVALID_VALUE;
    }
    let p = mmap(std::ptr::null_mut(), len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if p as isize == -1 {
        return OUT_OF_MEMORY;
    }
    RESERVED.lock().unwrap().push((p as u64, len as u64));
    *ptr = p as u64;
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAddressFree(ptr: u64, len: usize) -> CuResult {
    let mut reserved = RESERVED.lock().unwrap();
    let Some(i) = reserved.iter().position(|&r| r == (ptr, len as u64)) else {
        return INVALID_VALUE;
    };
    if ALLOCS.lock().unwrap().iter().any(|a| a.base >= ptr && a.base < ptr + len as u64) {
        return INVALID_VALUE; // still mapped
    }
    reserved.swap_remove(i);
    munmap(ptr as *mut c_void, len);
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuMemMap(ptr: u64, len: usize, offset: usize, handle: u64, _flags: u64) -> CuResult {
    let inside = RESERVED.lock().unwrap().iter().any(|&(b, l)| ptr >= b && ptr + len as u64 <= b + l);
    if offset != 0 || len == 0 || !inside {
        return INVALID_VALUE;
    }
    let mut allocs = ALLOCS.lock().unwrap();
    if allocs.iter().any(|a| a.base < ptr + len as u64 && ptr < a.base + a.len) {
        return INVALID_VALUE; // already mapped
    }
    let mut handles = HANDLES.lock().unwrap();
    let Some(h) = handles.iter_mut().find(|h| h.id == handle) else {
        return INVALID_HANDLE;
    };
    if len as u64 > h.len {
        return INVALID_VALUE;
    }
    let fd = h.fd.as_raw_fd();
    let base = mmap(ptr as *mut c_void, len, PROT_NONE, MAP_SHARED | MAP_FIXED, fd, 0);
    if base as isize == -1 {
        return OUT_OF_MEMORY;
    }
    let shadow = mmap(std::ptr::null_mut(), len, PROT_RW, MAP_SHARED, fd, 0);
    if shadow as isize == -1 {
        mmap(ptr as *mut c_void, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
        return OUT_OF_MEMORY;
    }
    h.refs += 1;
    allocs.push(Alloc {
        base: ptr,
        len: len as u64,
        shadow: shadow as u64,
        device: h.device,
        fd: None,
        imported: false,
        vmm: Some(handle),
        access: false,
    });
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuMemUnmap(ptr: u64, len: usize) -> CuResult {
    let mut allocs = ALLOCS.lock().unwrap();
    let Some(i) = allocs.iter().position(|a| a.base == ptr && a.len == len as u64 && a.vmm.is_some()) else {
        return INVALID_VALUE;
    };
    let a = allocs.swap_remove(i);
    munmap(a.shadow as *mut c_void, len);
    // Back to reserved addresses.
    mmap(ptr as *mut c_void, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    unref(&mut HANDLES.lock().unwrap(), a.vmm.unwrap());
    SUCCESS
}

/// `CUmemAccessDesc`: location (type, id), flags.
#[repr(C)]
pub struct AccessDesc {
    location_kind: c_int,
    location_id: c_int,
    flags: c_int,
}

#[no_mangle]
pub unsafe extern "C" fn cuMemSetAccess(ptr: u64, len: usize, desc: *const AccessDesc, count: usize) -> CuResult {
    if desc.is_null() || count == 0 {
        return INVALID_VALUE;
    }
    let descs = std::slice::from_raw_parts(desc, count);
    if descs.iter().any(|d| d.location_kind != 1 || d.location_id < 0 || d.location_id as u32 >= devices()) {
        return INVALID_DEVICE;
    }
    let read_write = descs.iter().any(|d| d.flags == 3);
    let mut allocs = ALLOCS.lock().unwrap();
    let end = ptr + len as u64;
    let mut covered = 0;
    for a in allocs.iter_mut().filter(|a| a.vmm.is_some() && a.base >= ptr && a.base + a.len <= end) {
        a.access = read_write;
        covered += a.len;
    }
    if covered != len as u64 {
        return INVALID_VALUE;
    }
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuMemRetainAllocationHandle(handle: *mut u64, addr: *mut c_void) -> CuResult {
    let allocs = ALLOCS.lock().unwrap();
    let addr = addr as u64;
    let Some(id) = allocs.iter().find(|a| addr >= a.base && addr < a.base + a.len).and_then(|a| a.vmm) else {
        return INVALID_VALUE;
    };
    let mut handles = HANDLES.lock().unwrap();
    let Some(h) = handles.iter_mut().find(|h| h.id == id) else {
        return INVALID_VALUE;
    };
    h.refs += 1;
    *handle = id;
    SUCCESS
}

/// A POSIX descriptor: a duplicate of the handle's memfd, the caller's to close.
#[no_mangle]
pub unsafe extern "C" fn cuMemExportToShareableHandle(out: *mut c_void, handle: u64, kind: c_int, _flags: u64) -> CuResult {
    if out.is_null() || kind != POSIX_FD {
        return INVALID_VALUE;
    }
    let handles = HANDLES.lock().unwrap();
    let Some(h) = handles.iter().find(|h| h.id == handle) else {
        return INVALID_HANDLE;
    };
    if !h.exportable {
        return INVALID_VALUE;
    }
    let fd = fcntl(h.fd.as_raw_fd(), F_DUPFD_CLOEXEC, 0);
    if fd < 0 {
        return OUT_OF_MEMORY;
    }
    *(out as *mut c_int) = fd;
    SUCCESS
}

/// Imports a POSIX descriptor (passed as the pointer's value; it stays the caller's).
#[no_mangle]
pub unsafe extern "C" fn cuMemImportFromShareableHandle(handle: *mut u64, os: *mut c_void, kind: c_int) -> CuResult {
    if handle.is_null() || kind != POSIX_FD {
        return INVALID_VALUE;
    }
    let fd = fcntl(os as usize as c_int, F_DUPFD_CLOEXEC, 0);
    if fd < 0 {
        return INVALID_HANDLE;
    }
    let file = std::fs::File::from_raw_fd(fd);
    let len = match file.metadata() {
        Ok(m) if m.len() > 0 && m.len() % GRANULARITY as u64 == 0 => m.len(),
        _ => return INVALID_HANDLE,
    };
    *handle = new_handle(OwnedFd::from(file), len, CURRENT.with(Cell::get), true);
    SUCCESS
}
