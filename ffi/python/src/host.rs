//! Mooncake's module-level host helpers: `mooncake.store.MooncakeHostMemAllocator`,
//! `get_alloc_func_addr` / `get_free_func_addr` (C-ABI allocator entry points for C/C++
//! callers), `bind_to_numa_node`, and the topology description behind
//! `TransferEngine.get_local_topology`.
//!
//! Memory from both allocators is a memfd mapped `MAP_SHARED` (the transports'
//! [`SharedMemory`]: 2 MiB huge pages when the size is a multiple of them and the host has
//! some, else normal pages, pre-faulted), kept in one table of this process by address, so
//! that a free of an address this module did not hand out is refused instead of unmapping
//! somebody else's memory.

use std::collections::HashMap;
use std::ffi::c_void;
use std::path::Path;

use crescent_transports::SharedMemory;
use parking_lot::Mutex;
use pyo3::exceptions::{PyRuntimeError, PyTypeError};
use pyo3::prelude::*;

/// The memfd name the allocations carry (`/proc/<pid>/maps` shows it).
const MEMFD_NAME: &str = "mooncake_shm";

/// Where the kernel lists NUMA nodes (absent on a host without NUMA support).
const NODE_DIR: &str = "/sys/devices/system/node";

/// Where the kernel lists RDMA devices (what libibverbs enumerates).
const RDMA_DIR: &str = "/sys/class/infiniband";

/// Every live allocation of this module, by address.
static ALLOCATIONS: Mutex<Option<HashMap<u64, SharedMemory>>> = Mutex::new(None);

/// Maps `len` bytes and records them; the address, or the reason it could not.
fn allocate(len: u64) -> Result<u64, String> {
    let mem = SharedMemory::allocate(len, MEMFD_NAME).map_err(|e| e.to_string())?;
    let addr = mem.addr();
    ALLOCATIONS.lock().get_or_insert_with(HashMap::new).insert(addr, mem);
    Ok(addr)
}

/// Unmaps the allocation starting at `addr`; false when there is none.
fn release(addr: u64) -> bool {
    let mem = ALLOCATIONS.lock().as_mut().and_then(|m| m.remove(&addr));
    mem.is_some()
}

/// A size or address: a non-negative int that fits 64 bits, as pybind's `size_t` /
/// `uintptr_t` conversions take it (anything else is a `TypeError` there too).
fn unsigned(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<u64> {
    obj.extract::<u64>().map_err(|_| {
        PyTypeError::new_err(format!(
            "{what}: expected a non-negative int that fits 64 bits, got {}",
            obj.repr().map_or_else(|_| "?".into(), |r| r.to_string())
        ))
    })
}

/// `MooncakeHostMemAllocator()`: host memory another process can map (a memfd), as upstream's
/// shared-memory helper gives. Every instance shares one table: memory allocated through one
/// can be freed through another.
#[pyclass(name = "MooncakeHostMemAllocator", module = "crescent._crescent")]
pub(crate) struct HostMemAllocator;

#[pymethods]
impl HostMemAllocator {
    #[new]
    fn new() -> Self {
        crescent_ffi::init_logging();
        HostMemAllocator
    }

    /// alloc(size) -> int: the address of `size` fresh, zeroed bytes. Raises `RuntimeError`
    /// when they cannot be mapped (0 bytes included), `TypeError` for a negative size.
    fn alloc(&self, py: Python<'_>, size: &Bound<'_, PyAny>) -> PyResult<u64> {
        let size = unsigned(size, "alloc")?;
        py.detach(|| allocate(size))
            .map_err(|e| PyRuntimeError::new_err(format!("Failed to allocate shared memory of {size} bytes: {e}")))
    }

    /// free(ptr) -> int: 0 once the allocation at `ptr` is unmapped, -1 when `ptr` is not the
    /// start of a live allocation of this allocator (logged; nothing is unmapped).
    fn free(&self, py: Python<'_>, ptr: &Bound<'_, PyAny>) -> PyResult<i32> {
        let ptr = unsigned(ptr, "free")?;
        if py.detach(|| release(ptr)) {
            Ok(0)
        } else {
            tracing::error!("Attempted to free unknown shared memory address: {ptr:#x}");
            Ok(-1)
        }
    }
}

/// `void *alloc(size_t)` for C/C++ callers (what `get_alloc_func_addr` points at): `size`
/// fresh, zeroed bytes, or NULL when they cannot be mapped (0 bytes included).
#[no_mangle]
pub extern "C" fn crescent_host_memory_alloc(size: usize) -> *mut c_void {
    match allocate(size as u64) {
        Ok(addr) => addr as *mut c_void,
        Err(e) => {
            tracing::warn!("host memory alloc of {size} bytes: {e}");
            std::ptr::null_mut()
        }
    }
}

/// `void free(void *)` for C/C++ callers (what `get_free_func_addr` points at): unmaps memory
/// `crescent_host_memory_alloc` gave; NULL is ignored, any other address is logged and left.
#[no_mangle]
pub extern "C" fn crescent_host_memory_free(ptr: *mut c_void) {
    if !ptr.is_null() && !release(ptr as u64) {
        tracing::warn!("host memory free: {ptr:p} was not allocated by crescent_host_memory_alloc; ignored");
    }
}

/// get_alloc_func_addr() -> int: the address of a C function `void *alloc(size_t size)`.
#[pyfunction]
fn get_alloc_func_addr() -> u64 {
    crescent_host_memory_alloc as extern "C" fn(usize) -> *mut c_void as usize as u64
}

/// get_free_func_addr() -> int: the address of a C function `void free(void *ptr)`.
#[pyfunction]
fn get_free_func_addr() -> u64 {
    crescent_host_memory_free as extern "C" fn(*mut c_void) as usize as u64
}

/// The NUMA node ids the kernel lists, ascending; None without NUMA support.
fn numa_nodes() -> Option<Vec<u32>> {
    let dir = std::fs::read_dir(NODE_DIR).ok()?;
    let mut nodes: Vec<u32> = dir
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().to_str()?.strip_prefix("node")?.parse().ok())
        .collect();
    nodes.sort_unstable();
    Some(nodes)
}

/// A kernel cpu list ("0-3,8,10-11") as CPU numbers.
fn parse_cpulist(text: &str) -> Option<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => cpus.extend(a.trim().parse::<usize>().ok()?..=b.trim().parse::<usize>().ok()?),
            None => cpus.push(part.trim().parse().ok()?),
        }
    }
    Some(cpus)
}

fn node_cpus(node: u32) -> Option<Vec<usize>> {
    parse_cpulist(&std::fs::read_to_string(format!("{NODE_DIR}/node{node}/cpulist")).ok()?)
}

/// Restricts the calling thread to `cpus` (those below 8192).
fn set_affinity(cpus: &[usize]) -> std::io::Result<()> {
    const BITS: usize = 8192;
    let word = libc::c_ulong::BITS as usize;
    let mut mask = [0 as libc::c_ulong; BITS / libc::c_ulong::BITS as usize];
    for &cpu in cpus.iter().filter(|&&c| c < BITS) {
        mask[cpu / word] |= 1 << (cpu % word);
    }
    // SAFETY: the kernel reads `size_of_val(&mask)` bytes of `mask`, a live local; pid 0 is
    // the calling thread, the only one whose affinity changes.
    let rc = unsafe { libc::syscall(libc::SYS_sched_setaffinity, 0, std::mem::size_of_val(&mask), mask.as_ptr()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The calling thread's memory policy: MPOL_PREFERRED for `node`, or MPOL_DEFAULT (None).
fn set_preferred(node: Option<u32>) -> std::io::Result<()> {
    const MPOL_DEFAULT: libc::c_long = 0;
    const MPOL_PREFERRED: libc::c_long = 1;
    const BITS: usize = 1024;
    let mut mask = [0 as libc::c_ulong; BITS / libc::c_ulong::BITS as usize];
    let (mode, mask_ptr, maxnode) = match node {
        Some(n) if (n as usize) < BITS => {
            mask[n as usize / libc::c_ulong::BITS as usize] |= 1 << (n % libc::c_ulong::BITS);
            (MPOL_PREFERRED, mask.as_ptr(), BITS as libc::c_ulong + 1)
        }
        Some(n) => return Err(std::io::Error::other(format!("node {n} is beyond {BITS}"))),
        None => (MPOL_DEFAULT, std::ptr::null(), 0),
    };
    // SAFETY: set_mempolicy reads at most `maxnode` bits of `mask`, a live local of `BITS`
    // bits (or nothing with a null mask); it changes only this thread's policy.
    let rc = unsafe { libc::syscall(libc::SYS_set_mempolicy, mode, mask_ptr, maxnode) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// bind_to_numa_node(node) -> None: runs the calling thread on `node`'s CPUs and prefers its
/// memory for the thread's future allocations (falling back to other nodes), as upstream's
/// libnuma calls do. Without NUMA support a warning is logged and nothing changes; a node
/// out of range is logged too, and `-1`, as for libnuma, lets the thread run on every node
/// (local allocation again).
#[pyfunction]
fn bind_to_numa_node(py: Python<'_>, node: i32) {
    crescent_ffi::init_logging();
    py.detach(|| {
        let Some(nodes) = numa_nodes().filter(|n| !n.is_empty()) else {
            tracing::warn!("NUMA is not available on this system; binding skipped");
            return;
        };
        let max_node = nodes.last().copied().unwrap_or(0);
        let valid = u32::try_from(node).ok().filter(|n| nodes.contains(n));
        if valid.is_none() {
            tracing::warn!("Invalid NUMA node: {node}. Valid range: 0-{max_node}");
            if node != -1 {
                return;
            }
        }
        let cpus = match valid {
            Some(n) => node_cpus(n),
            None => Some(nodes.iter().filter_map(|&n| node_cpus(n)).flatten().collect()),
        };
        match cpus.filter(|c| !c.is_empty()) {
            Some(cpus) => {
                if let Err(e) = set_affinity(&cpus) {
                    tracing::warn!("running on NUMA node {node} failed: {e}");
                }
            }
            None => tracing::warn!("running on NUMA node {node} failed: it has no CPUs"),
        }
        if let Err(e) = set_preferred(valid) {
            tracing::warn!("preferring memory of NUMA node {node} failed: {e}");
        }
    });
}

/// One RDMA device: its name and NUMA node (-1 when the kernel does not say).
struct Hca {
    name: String,
    numa_node: i64,
}

fn rdma_devices(filter: &[&str]) -> Vec<Hca> {
    let Ok(dir) = std::fs::read_dir(RDMA_DIR) else { return Vec::new() };
    let mut hcas: Vec<Hca> = dir
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| filter.is_empty() || filter.contains(&name.as_str()))
        .map(|name| {
            let numa_node = std::fs::read_to_string(Path::new(RDMA_DIR).join(&name).join("device/numa_node"))
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(-1);
            Hca { name, numa_node }
        })
        .collect();
    hcas.sort_by(|a, b| a.name.cmp(&b.name));
    hcas
}

/// Upstream's topology matrix as JSON: `{"cpu:<node>": [[preferred HCAs], [other HCAs]], ...}`,
/// an HCA preferred by the node it hangs off, and `"cuda:<n>"` for each GPU when the device
/// driver loads; `{}` without NUMA support or GPUs. `device_name`
/// (comma-separated) keeps only the HCAs it names.
pub(crate) fn local_topology(device_name: Option<&str>) -> String {
    let filter: Vec<&str> = device_name.unwrap_or("").split(',').filter(|s| !s.is_empty()).collect();
    let hcas = rdma_devices(&filter);
    let mut matrix = serde_json::Map::new();
    for node in numa_nodes().unwrap_or_default() {
        let (preferred, avail): (Vec<&Hca>, Vec<&Hca>) = hcas.iter().partition(|h| h.numa_node == i64::from(node));
        let names = |v: Vec<&Hca>| serde_json::Value::from(v.into_iter().map(|h| h.name.clone()).collect::<Vec<_>>());
        matrix.insert(format!("cpu:{node}"), serde_json::Value::from(vec![names(preferred), names(avail)]));
    }
    // GPUs, when a driver loads: every RDMA device preferred (their PCI distance to the GPU,
    // which upstream ranks them by, is not read here).
    if let Ok(driver) = crescent_transports::device::Devices::default().driver() {
        let api = driver.api();
        let all: Vec<String> = hcas.iter().map(|h| h.name.clone()).collect();
        for i in 0..api.device_count().unwrap_or(0) {
            let entry = vec![serde_json::Value::from(all.clone()), serde_json::Value::from(Vec::<String>::new())];
            matrix.insert(format!("{}:{i}", api.vendor()), serde_json::Value::from(entry));
        }
    }
    serde_json::to_string_pretty(&serde_json::Value::Object(matrix)).unwrap_or_else(|_| "{}".into())
}

pub(crate) fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<HostMemAllocator>()?;
    m.add_function(wrap_pyfunction!(get_alloc_func_addr, m)?)?;
    m.add_function(wrap_pyfunction!(get_free_func_addr, m)?)?;
    m.add_function(wrap_pyfunction!(bind_to_numa_node, m)?)?;
    Ok(())
}
