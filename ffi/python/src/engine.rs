//! `TransferEngine`: Mooncake's transfer-engine class over `crescent-engine`.

use std::collections::HashMap;
use std::sync::Arc;

use crescent_ffi::engine::{EngineConfig, Opcode, RegisteredMemory, TransferEngine, TransferRequest, P2P_HANDSHAKE};
use crescent_ffi::{engine_fail, fail, store_fail, Status};
use parking_lot::{Mutex, RwLock};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::{mems, Exported, Mem};

// ---- TransferEngine ----

/// Mooncake's `TransferEngine`: registered memory and one-sided reads and writes between
/// engines. Call `initialize(...)` first; status-returning methods give 0 or a negative code.
#[pyclass(module = "crescent._crescent", name = "TransferEngine")]
pub(crate) struct Engine {
    engine: RwLock<Option<Arc<TransferEngine>>>,
    /// Buffers from `allocate_managed_buffer`, by address.
    managed: Mutex<HashMap<u64, RegisteredMemory>>,
    /// Buffer objects registered by `register_memory`, kept exported until unregistered.
    pinned: Mutex<HashMap<u64, Exported>>,
}

impl Engine {
    fn engine(&self) -> Option<Arc<TransferEngine>> {
        self.engine.read().clone()
    }

    fn not_initialized(what: &str) -> i32 {
        fail(Status::UnavailableInCurrentStatus, format!("{what}: call initialize() first")).code()
    }

    fn transfer(
        &self,
        py: Python<'_>,
        opcode: Opcode,
        target: &str,
        locals: Vec<Mem>,
        peers: Vec<u64>,
        lengths: Vec<u64>,
    ) -> PyResult<i32> {
        let Some(engine) = self.engine() else { return Ok(Self::not_initialized("transfer")) };
        let addrs: Vec<u64> = locals.iter().map(Mem::addr).collect();
        let r = py.detach(|| {
            let segment = engine.open_segment(target)?;
            let requests: Vec<TransferRequest> = addrs
                .iter()
                .zip(&peers)
                .zip(&lengths)
                .map(|((&source, &target_offset), &length)| TransferRequest {
                    opcode,
                    source,
                    target: segment,
                    target_offset,
                    length,
                })
                .collect();
            engine.transfer_sync(&requests)
        });
        Ok(match r {
            Ok(()) => 0,
            Err(e) => engine_fail(&e).code(),
        })
    }

    fn one(
        &self,
        py: Python<'_>,
        opcode: Opcode,
        target_hostname: &str,
        buffer: &Bound<'_, PyAny>,
        peer_buffer_address: u64,
        length: u64,
    ) -> PyResult<i32> {
        crescent_ffi::clear_last_error();
        let mem = Mem::new(buffer, opcode == Opcode::Read, "buffer")?;
        let length = mem.size(Some(length), "buffer")?;
        self.transfer(py, opcode, target_hostname, vec![mem], vec![peer_buffer_address], vec![length])
    }

    fn batch(
        &self,
        py: Python<'_>,
        opcode: Opcode,
        target_hostname: &str,
        buffers: &Bound<'_, PyAny>,
        peer_buffer_addresses: Vec<u64>,
        lengths: Vec<u64>,
    ) -> PyResult<i32> {
        crescent_ffi::clear_last_error();
        let n = peer_buffer_addresses.len();
        let (mems, lengths) = mems(buffers, Some(lengths), opcode == Opcode::Read, n)?;
        self.transfer(py, opcode, target_hostname, mems, peer_buffer_addresses, lengths)
    }
}

#[pymethods]
impl Engine {
    #[new]
    fn new() -> Self {
        crescent_ffi::init_logging();
        Engine { engine: RwLock::new(None), managed: Mutex::new(HashMap::new()), pinned: Mutex::new(HashMap::new()) }
    }

    /// initialize(local_hostname, metadata_server, protocol, device_name) -> int
    ///
    /// `local_hostname`: `host` or `host:port` peers use; `metadata_server`: `P2PHANDSHAKE`
    /// (or "") or an etcd/redis/http connection string; `protocol`: `tcp`, `rdma`, `shm`, or
    /// "" / `auto`; `device_name`: RDMA devices (unused by the tcp transport).
    #[pyo3(signature = (local_hostname, metadata_server, protocol="tcp", device_name=""))]
    fn initialize(
        &self,
        py: Python<'_>,
        local_hostname: &str,
        metadata_server: &str,
        protocol: &str,
        device_name: &str,
    ) -> i32 {
        crescent_ffi::clear_last_error();
        let _ = device_name;
        if self.engine.read().is_some() {
            return fail(Status::UnavailableInCurrentStatus, "initialize: already initialized").code();
        }
        let config = (|| {
            let mut c = EngineConfig::from_env().map_err(|e| engine_fail(&e))?;
            c.local_hostname = Some(local_hostname.trim().to_string()).filter(|h| !h.is_empty());
            c.metadata_server =
                if metadata_server.trim().is_empty() { P2P_HANDSHAKE.into() } else { metadata_server.trim().into() };
            if let Some(kind) = crescent_ffi::protocol_of(protocol).map_err(|e| store_fail(&e))? {
                c.protocol = Some(kind);
            }
            Ok::<_, Status>(c)
        })();
        let config = match config {
            Ok(c) => c,
            Err(s) => return s.code(),
        };
        match py.detach(|| TransferEngine::new(config)) {
            Ok(engine) => {
                let mut slot = self.engine.write();
                if slot.is_some() {
                    return fail(Status::UnavailableInCurrentStatus, "initialize: already initialized").code();
                }
                *slot = Some(engine);
                0
            }
            Err(e) => engine_fail(&e).code(),
        }
    }

    /// get_rpc_port() -> int: the handshake port peers connect to (negative before initialize).
    fn get_rpc_port(&self) -> i32 {
        match self.engine() {
            Some(e) => e.rpc_port() as i32,
            None => Self::not_initialized("get_rpc_port"),
        }
    }

    /// get_segment_name() -> str: `host:port`, the name peers pass as `target_hostname`.
    fn get_segment_name(&self) -> String {
        self.engine().map(|e| e.segment_name().to_string()).unwrap_or_default()
    }

    /// register_memory(buffer_addr, capacity=None) -> int: an int address with its capacity,
    /// or a buffer object (kept alive and unresizable until `unregister_memory`).
    #[pyo3(signature = (buffer_addr, capacity=None))]
    fn register_memory(&self, py: Python<'_>, buffer_addr: &Bound<'_, PyAny>, capacity: Option<u64>) -> PyResult<i32> {
        crescent_ffi::clear_last_error();
        let mem = Mem::new(buffer_addr, false, "buffer_addr")?;
        let len = mem.size(capacity, "buffer_addr")?;
        let Some(engine) = self.engine() else { return Ok(Self::not_initialized("register_memory")) };
        let addr = mem.addr();
        Ok(match py.detach(|| engine.register(addr, len, "cpu:0")) {
            Ok(()) => {
                if let Mem::Buffer(b) = mem {
                    self.pinned.lock().insert(addr, b);
                }
                0
            }
            Err(e) => engine_fail(&e).code(),
        })
    }

    /// batch_register_memory(buffer_addresses, capacities=None) -> int: all or none.
    #[pyo3(signature = (buffer_addresses, capacities=None))]
    fn batch_register_memory(
        &self,
        py: Python<'_>,
        buffer_addresses: &Bound<'_, PyAny>,
        capacities: Option<Vec<u64>>,
    ) -> PyResult<i32> {
        crescent_ffi::clear_last_error();
        let n = buffer_addresses.len()?;
        let (mems, lens) = mems(buffer_addresses, capacities, false, n)?;
        let Some(engine) = self.engine() else { return Ok(Self::not_initialized("batch_register_memory")) };
        let regions: Vec<(u64, u64)> = mems.iter().map(Mem::addr).zip(lens).collect();
        Ok(match py.detach(|| engine.register_batch(&regions, "cpu:0")) {
            Ok(()) => {
                let mut pinned = self.pinned.lock();
                for m in mems {
                    if let Mem::Buffer(b) = m {
                        pinned.insert(b.addr(), b);
                    }
                }
                0
            }
            Err(e) => engine_fail(&e).code(),
        })
    }

    /// unregister_memory(buffer_addr) -> int: the int address or the buffer object registered.
    fn unregister_memory(&self, py: Python<'_>, buffer_addr: &Bound<'_, PyAny>) -> PyResult<i32> {
        crescent_ffi::clear_last_error();
        let addr = Mem::new(buffer_addr, false, "buffer_addr")?.addr();
        let Some(engine) = self.engine() else { return Ok(Self::not_initialized("unregister_memory")) };
        Ok(match py.detach(|| engine.unregister(addr)) {
            Ok(()) => {
                self.pinned.lock().remove(&addr);
                0
            }
            Err(e) => engine_fail(&e).code(),
        })
    }

    /// transfer_sync_read(target_hostname, buffer, peer_buffer_address, length) -> int: reads
    /// `length` bytes of the target's registered memory into local registered `buffer`.
    fn transfer_sync_read(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffer: &Bound<'_, PyAny>,
        peer_buffer_address: u64,
        length: u64,
    ) -> PyResult<i32> {
        self.one(py, Opcode::Read, target_hostname, buffer, peer_buffer_address, length)
    }

    /// transfer_sync_write(target_hostname, buffer, peer_buffer_address, length) -> int:
    /// writes `length` bytes of local registered `buffer` into the target's registered memory.
    fn transfer_sync_write(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffer: &Bound<'_, PyAny>,
        peer_buffer_address: u64,
        length: u64,
    ) -> PyResult<i32> {
        self.one(py, Opcode::Write, target_hostname, buffer, peer_buffer_address, length)
    }

    /// batch_transfer_sync_read(target_hostname, buffers, peer_buffer_addresses, lengths) -> int
    fn batch_transfer_sync_read(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffers: &Bound<'_, PyAny>,
        peer_buffer_addresses: Vec<u64>,
        lengths: Vec<u64>,
    ) -> PyResult<i32> {
        self.batch(py, Opcode::Read, target_hostname, buffers, peer_buffer_addresses, lengths)
    }

    /// batch_transfer_sync_write(target_hostname, buffers, peer_buffer_addresses, lengths) -> int
    fn batch_transfer_sync_write(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffers: &Bound<'_, PyAny>,
        peer_buffer_addresses: Vec<u64>,
        lengths: Vec<u64>,
    ) -> PyResult<i32> {
        self.batch(py, Opcode::Write, target_hostname, buffers, peer_buffer_addresses, lengths)
    }

    /// allocate_managed_buffer(length) -> int: the address of `length` bytes of registered
    /// memory, or 0 on failure. Free it with `free_managed_buffer`.
    fn allocate_managed_buffer(&self, py: Python<'_>, length: u64) -> u64 {
        crescent_ffi::clear_last_error();
        let Some(engine) = self.engine() else {
            Self::not_initialized("allocate_managed_buffer");
            return 0;
        };
        match py.detach(|| engine.alloc_registered(length, "cpu:0")) {
            Ok(mem) => {
                let addr = mem.addr();
                self.managed.lock().insert(addr, mem);
                addr
            }
            Err(e) => {
                engine_fail(&e);
                0
            }
        }
    }

    /// free_managed_buffer(buffer_addr, length) -> int
    fn free_managed_buffer(&self, py: Python<'_>, buffer_addr: u64, length: u64) -> i32 {
        crescent_ffi::clear_last_error();
        let Some(engine) = self.engine() else { return Self::not_initialized("free_managed_buffer") };
        let Some(mem) = self.managed.lock().remove(&buffer_addr) else {
            return fail(Status::InvalidParams, format!("{buffer_addr:#x} is not a managed buffer")).code();
        };
        if mem.len() < length {
            self.managed.lock().insert(buffer_addr, mem);
            return fail(
                Status::InvalidParams,
                format!("the managed buffer at {buffer_addr:#x} is smaller than {length}"),
            )
            .code();
        }
        match py.detach(|| engine.free_registered(mem.clone())) {
            Ok(()) => 0,
            Err(e) => {
                self.managed.lock().insert(buffer_addr, mem);
                engine_fail(&e).code()
            }
        }
    }

    /// get_first_buffer_address(segment_name) -> int: the address of the segment's first
    /// registered buffer, or 0 if it cannot be opened or has none.
    fn get_first_buffer_address(&self, py: Python<'_>, segment_name: &str) -> u64 {
        crescent_ffi::clear_last_error();
        let Some(engine) = self.engine() else {
            Self::not_initialized("get_first_buffer_address");
            return 0;
        };
        let r = py.detach(|| engine.open_segment(segment_name).and_then(|id| engine.segment_descriptor(id)));
        match r {
            Ok(d) => d.buffers.first().map_or(0, |b| b.addr),
            Err(e) => {
                engine_fail(&e);
                0
            }
        }
    }

    /// write_bytes_to_buffer(buffer_addr, src, length) -> int: copies `length` bytes of `src`
    /// into local registered memory at `buffer_addr` (refused outside registered memory).
    fn write_bytes_to_buffer(&self, buffer_addr: u64, src: &Bound<'_, PyAny>, length: u64) -> PyResult<i32> {
        crescent_ffi::clear_last_error();
        let src = Exported::new(src, false)?;
        if length > src.len() {
            return Err(PyValueError::new_err(format!("length {length} is larger than src ({} bytes)", src.len())));
        }
        let Some(engine) = self.engine() else { return Ok(Self::not_initialized("write_bytes_to_buffer")) };
        if length == 0 {
            return Ok(0);
        }
        if !engine.is_registered(buffer_addr, length) {
            return Ok(
                fail(Status::InvalidParams, format!("[{buffer_addr:#x}, +{length}) is not registered memory")).code()
            );
        }
        // SAFETY: the range lies inside memory registered with this engine, which its owner
        // keeps valid while registered; `src` is a live export of at least `length` bytes.
        unsafe { std::ptr::copy_nonoverlapping(src.bytes().as_ptr(), buffer_addr as *mut u8, length as usize) };
        Ok(0)
    }

    /// read_bytes_from_buffer(buffer_addr, length) -> bytes: a copy of local registered memory
    /// (empty bytes outside registered memory).
    fn read_bytes_from_buffer<'py>(&self, py: Python<'py>, buffer_addr: u64, length: u64) -> Bound<'py, PyBytes> {
        crescent_ffi::clear_last_error();
        let Some(engine) = self.engine() else {
            Self::not_initialized("read_bytes_from_buffer");
            return PyBytes::new(py, &[]);
        };
        if length == 0 || !engine.is_registered(buffer_addr, length) {
            fail(Status::InvalidParams, format!("[{buffer_addr:#x}, +{length}) is not registered memory"));
            return PyBytes::new(py, &[]);
        }
        // SAFETY: the range lies inside memory registered with this engine (valid while
        // registered); it is copied out at once.
        let bytes = unsafe { std::slice::from_raw_parts(buffer_addr as *const u8, length as usize) };
        PyBytes::new(py, bytes)
    }
}
