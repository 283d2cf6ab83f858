//! `TransferEngine`, `TransferOpcode` and `TransferNotify`: Mooncake's `mooncake.engine` over
//! `crescent-engine`, with upstream's method names, argument order, keywords, defaults and
//! return values (Mooncake 3b5a5941, `transfer_engine_py.cpp`):
//!
//! * status-returning calls give 0 on success and Mooncake's transfer-engine codes on failure:
//!   -1 for a failed transfer, an unknown segment, a bad argument or a call before
//!   `initialize` (as upstream, whose Python calls return -1 for any of these), and the engine's
//!   own codes where upstream passes them through (`register_memory`: -7 overlapping, -3 not
//!   registered, ...); `crescent.last_error()` has the message;
//! * calls that return a batch id or an address give 0 on failure;
//! * memory is an int address, or (Crescent's addition) any C-contiguous buffer object, or an
//!   array offering its address — `__cuda_array_interface__` or DLPack: torch and cupy
//!   tensors, on a GPU or not — neither framework being a dependency;
//! * the GIL is released while the engine works.

mod init;
mod transfer;
mod types;

use std::collections::HashMap;
use std::sync::Arc;

use crescent_ffi::engine::{
    BatchId, EngineError, Notification, Opcode, RegisteredMemory, TransferEngine, TransferStatus, P2P_HANDSHAKE,
};
use crescent_ffi::{te_engine_fail, te_fail, TeCode};
use parking_lot::{Mutex, RwLock};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString, PyType};

use crate::twins::pymethods_with_twins;
use crate::{Exported, Mem};
use transfer::{Buffers, Mode, Reply};
pub(crate) use types::{shared_engine, InnerEngine, PyNotify, PyOpcode};

/// Upstream's `kWildcardLocation`: memory of any placement.
const WILDCARD_LOCATION: &str = "*";

/// A failure reported with `code` and `message`; returns the code.
fn te(code: TeCode, message: impl std::fmt::Display) -> i32 {
    te_fail(code, message).code()
}

/// A failure of the engine reported with upstream's catch-all -1 (its Python transfer calls
/// return -1 whatever went wrong); the message says what.
fn failed(e: &EngineError) -> i32 {
    te(TeCode::InvalidArgument, e)
}

/// Mooncake's `TransferEngine`: registered memory and one-sided reads and writes between
/// engines. Call `initialize(...)` first; status-returning methods give 0 or a negative code.
#[pyclass(module = "crescent._crescent", name = "TransferEngine")]
pub(crate) struct Engine {
    engine: RwLock<Option<Arc<TransferEngine>>>,
    /// Buffers from `allocate_managed_buffer`, by address.
    managed: Mutex<HashMap<u64, RegisteredMemory>>,
    /// Buffer objects and arrays registered by `register_memory`, kept (exported) until
    /// unregistered.
    pinned: Mutex<HashMap<u64, Mem>>,
}

impl Engine {
    fn engine(&self) -> Option<Arc<TransferEngine>> {
        self.engine.read().clone()
    }

    fn not_initialized(what: &str) -> i32 {
        te(TeCode::InvalidArgument, format!("{what}: call initialize() first"))
    }

    /// The preamble of the methods that need the engine, written once: the last error
    /// cleared, then `f` with the engine; before `initialize` the refusal recorded for `what`
    /// and `unset(code)` answered.
    fn with_engine<T>(&self, what: &str, unset: impl FnOnce(i32) -> T, f: impl FnOnce(Arc<TransferEngine>) -> T) -> T {
        crescent_ffi::clear_last_error();
        match self.engine() {
            Some(engine) => f(engine),
            None => unset(Self::not_initialized(what)),
        }
    }
}

pymethods_with_twins! {
    #[pymethods]
    #[allow(clippy::too_many_arguments)] // Mooncake's argument lists
    impl Engine {
        #[new]
        fn new() -> Self {
            crescent_ffi::init_logging();
            Engine {
                engine: RwLock::new(None),
                managed: Mutex::new(HashMap::new()),
                pinned: Mutex::new(HashMap::new()),
            }
        }

        /// `TransferEngine.TransferOpcode`, as upstream nests it.
        #[classattr]
        #[pyo3(name = "TransferOpcode")]
        fn transfer_opcode(py: Python<'_>) -> Py<PyType> {
            py.get_type::<PyOpcode>().unbind()
        }

        /// initialize(local_hostname, metadata_server, protocol="tcp", device_name="") -> int
        ///
        /// `local_hostname`: the host peers use (a port in it is ignored with `P2PHANDSHAKE`,
        /// which picks a free one); `metadata_server`: `P2PHANDSHAKE` (or "") or an
        /// etcd/redis/http connection string (a bare `host:port` is etcd); `protocol`: `tcp`,
        /// `rdma`, `shm`, or "" / `auto`; `device_name`: RDMA devices, comma-separated.
        #[pyo3(signature = (local_hostname, metadata_server, protocol="tcp", device_name=""))]
        fn initialize(
            &self, py: Python<'_>, local_hostname: &str, metadata_server: &str, protocol: &str, device_name: &str,
        ) -> i32 {
            self.start(py, local_hostname, metadata_server.trim().to_string(), protocol, device_name)
        }

        /// initialize_ext(local_hostname, metadata_server, protocol, device_name, metadata_type)
        /// -> int: as `initialize`, the service named by `metadata_type` (`etcd`, `redis`,
        /// `http`) when `metadata_server` has no `scheme://`.
        fn initialize_ext(
            &self, py: Python<'_>, local_hostname: &str, metadata_server: &str, protocol: &str, device_name: &str,
            metadata_type: &str,
        ) -> i32 {
            let server = metadata_server.trim();
            let bare = !server.eq_ignore_ascii_case(P2P_HANDSHAKE) && !server.contains("://");
            let connection = if !bare || metadata_type.trim().is_empty() {
                server.to_string()
            } else {
                format!("{}://{server}", metadata_type.trim())
            };
            self.start(py, local_hostname, connection, protocol, device_name)
        }

        /// get_rpc_port() -> int: the handshake port peers connect to (-1 before initialize).
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

        /// get_engine() -> InnerTransferEngine: the engine object (opaque); None before initialize.
        fn get_engine(&self) -> Option<InnerEngine> {
            self.engine().map(|e| InnerEngine { _engine: e })
        }

        /// get_engine_ptr() -> int: an opaque non-zero identity of the engine (0 before initialize).
        fn get_engine_ptr(&self) -> u64 {
            self.engine().map_or(0, |e| Arc::as_ptr(&e) as u64)
        }

        /// register_memory(buffer_addr, capacity, location="*") -> int: an int address with its
        /// capacity, or a buffer object (kept alive and unresizable until `unregister_memory`).
        /// -7 when it overlaps registered memory, -1 for a zero capacity.
        #[pyo3(signature = (buffer_addr, capacity=None, location=WILDCARD_LOCATION))]
        fn register_memory(
            &self,
            py: Python<'_>,
            buffer_addr: &Bound<'_, PyAny>,
            capacity: Option<u64>,
            location: &str,
        ) -> PyResult<i32> {
            crescent_ffi::clear_last_error();
            let mem = Mem::any(buffer_addr, false, "buffer_addr")?;
            let len = mem.size(capacity, "buffer_addr")?;
            let Some(engine) = self.engine() else { return Ok(Self::not_initialized("register_memory")) };
            let addr = mem.addr();
            Ok(match py.detach(|| engine.register(addr, len, location)) {
                Ok(()) => {
                    if mem.holds_object() {
                        self.pinned.lock().insert(addr, mem);
                    }
                    0
                }
                Err(e) => te_engine_fail(&e).code(),
            })
        }

        /// batch_register_memory(buffer_addresses, capacities, location="*") -> int: all or none.
        #[pyo3(signature = (buffer_addresses, capacities=None, location=WILDCARD_LOCATION))]
        fn batch_register_memory(
            &self,
            py: Python<'_>,
            buffer_addresses: &Bound<'_, PyAny>,
            capacities: Option<Vec<u64>>,
            location: &str,
        ) -> PyResult<i32> {
            crescent_ffi::clear_last_error();
            let n = buffer_addresses.len()?;
            let (mems, lens) = crate::mems(buffer_addresses, capacities, false, n)?;
            let Some(engine) = self.engine() else { return Ok(Self::not_initialized("batch_register_memory")) };
            let regions: Vec<(u64, u64)> = mems.iter().map(Mem::addr).zip(lens).collect();
            Ok(match py.detach(|| engine.register_batch(&regions, location)) {
                Ok(()) => {
                    let mut pinned = self.pinned.lock();
                    for m in mems {
                        if m.holds_object() {
                            pinned.insert(m.addr(), m);
                        }
                    }
                    0
                }
                Err(e) => te_engine_fail(&e).code(),
            })
        }

        /// unregister_memory(buffer_addr) -> int: the int address or the buffer object registered;
        /// -3 if nothing is registered there.
        fn unregister_memory(&self, py: Python<'_>, buffer_addr: &Bound<'_, PyAny>) -> PyResult<i32> {
            crescent_ffi::clear_last_error();
            let addr = Mem::any(buffer_addr, false, "buffer_addr")?.addr();
            let Some(engine) = self.engine() else { return Ok(Self::not_initialized("unregister_memory")) };
            Ok(match py.detach(|| engine.unregister(addr)) {
                Ok(()) => {
                    self.pinned.lock().remove(&addr);
                    0
                }
                Err(e) => te_engine_fail(&e).code(),
            })
        }

        /// batch_unregister_memory(buffer_addresses) -> int: unregisters each (all are tried);
        /// the first error's code.
        fn batch_unregister_memory(&self, py: Python<'_>, buffer_addresses: &Bound<'_, PyAny>) -> PyResult<i32> {
            crescent_ffi::clear_last_error();
            let addrs: Vec<u64> = buffer_addresses
                .try_iter()?
                .enumerate()
                .map(|(i, o)| Ok(Mem::any(&o?, false, &format!("buffer_addresses[{i}]"))?.addr()))
                .collect::<PyResult<_>>()?;
            let Some(engine) = self.engine() else { return Ok(Self::not_initialized("batch_unregister_memory")) };
            let results: Vec<Result<(), EngineError>> =
                py.detach(|| addrs.iter().map(|&a| engine.unregister(a)).collect());
            let mut first = 0;
            let mut pinned = self.pinned.lock();
            for (addr, r) in addrs.iter().zip(results) {
                match r {
                    Ok(()) => {
                        pinned.remove(addr);
                    }
                    Err(e) => {
                        let code = te_engine_fail(&e).code();
                        if first == 0 {
                            first = code;
                        }
                    }
                }
            }
            Ok(first)
        }

        /// transfer_sync(target_hostname, buffer, peer_buffer_address, length, opcode,
        /// notify=None, transport_hint="") -> int: 0 or -1; with `notify`, the target's engine
        /// receives it once the transfer completed.
        #[pyo3(signature = (target_hostname, buffer, peer_buffer_address, length, opcode, notify=None,
                            transport_hint=""))]
        fn transfer_sync(
            &self, py: Python<'_>, target_hostname: &str, buffer: &Bound<'_, PyAny>, peer_buffer_address: u64,
            length: u64, opcode: &Bound<'_, PyAny>, notify: Option<PyRef<'_, PyNotify>>, transport_hint: &str,
        ) -> PyResult<Reply> {
            let how = (PyOpcode::extract(opcode)?, Mode::Sync(notify.as_deref().map(Notification::from)));
            self.transfer(py, how, target_hostname, Buffers::One(buffer, peer_buffer_address, length), transport_hint)
        }

        /// batch_transfer_sync(target_hostname, buffers, peer_buffer_addresses, lengths, opcode,
        /// notify=None, transport_hint="") -> int: 0 or -1; `notify` as in `transfer_sync`.
        #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, opcode, notify=None,
                            transport_hint=""))]
        fn batch_transfer_sync(
            &self, py: Python<'_>, target_hostname: &str, buffers: &Bound<'_, PyAny>, peer_buffer_addresses: Vec<u64>,
            lengths: Vec<u64>, opcode: &Bound<'_, PyAny>, notify: Option<PyRef<'_, PyNotify>>, transport_hint: &str,
        ) -> PyResult<Reply> {
            let how = (PyOpcode::extract(opcode)?, Mode::Sync(notify.as_deref().map(Notification::from)));
            let buffers = Buffers::Many(buffers, peer_buffer_addresses, lengths);
            self.transfer(py, how, target_hostname, buffers, transport_hint)
        }

        /// batch_transfer_async(target_hostname, buffers, peer_buffer_addresses, lengths, opcode,
        /// transport_hint="") -> int: a batch id, 0 on failure.
        #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, opcode, transport_hint=""))]
        fn batch_transfer_async(
            &self, py: Python<'_>, target_hostname: &str, buffers: &Bound<'_, PyAny>, peer_buffer_addresses: Vec<u64>,
            lengths: Vec<u64>, opcode: &Bound<'_, PyAny>, transport_hint: &str,
        ) -> PyResult<Reply> {
            let buffers = Buffers::Many(buffers, peer_buffer_addresses, lengths);
            self.transfer(py, (PyOpcode::extract(opcode)?, Mode::Submit), target_hostname, buffers, transport_hint)
        }

        /// get_batch_transfer_status(batch_ids) -> int: waits for every batch to end and frees
        /// them; 0 if all completed, -1 if any failed, timed out or is unknown.
        fn get_batch_transfer_status(&self, py: Python<'_>, batch_ids: Vec<BatchId>) -> i32 {
            self.with_engine("get_batch_transfer_status", |code| code, |engine| {
                let first_error = py.detach(|| {
                    let mut first = None;
                    for id in batch_ids {
                        if let Err(e) = engine.transfer_finish(id) {
                            first.get_or_insert(e);
                        }
                    }
                    first
                });
                match first_error {
                    None => 0,
                    Some(e) => failed(&e),
                }
            })
        }

        /// transfer_check_status(batch_id) -> int: 0 while in flight; once ended (the batch is then
        /// freed) 1 completed, -1 failed, -2 timed out; -1 for an unknown batch.
        fn transfer_check_status(&self, py: Python<'_>, batch_id: BatchId) -> i32 {
            self.with_engine("transfer_check_status", |code| code, |engine| {
                let statuses = match engine.batch_status(batch_id) {
                    Ok(s) => s,
                    Err(e) => return failed(&e),
                };
                if statuses.iter().any(|s| !s.is_final()) {
                    return 0;
                }
                let freed = py.detach(|| engine.free_batch(batch_id));
                if let Err(e) = freed {
                    return failed(&e);
                }
                let mut result = 1;
                for (i, s) in statuses.iter().enumerate() {
                    match s {
                        TransferStatus::Failed(reason) => {
                            return te(TeCode::InvalidArgument, format!("request {i}: {reason}"))
                        }
                        TransferStatus::TimedOut => {
                            te(TeCode::InvalidArgument, format!("request {i} timed out"));
                            result = -2;
                        }
                        _ => {}
                    }
                }
                result
            })
        }

        /// allocate_managed_buffer(length) -> int: the address of `length` bytes of registered
        /// memory, or 0 on failure. Free it with `free_managed_buffer`.
        fn allocate_managed_buffer(&self, py: Python<'_>, length: u64) -> u64 {
            self.with_engine("allocate_managed_buffer", |_| 0, |engine| {
                match py.detach(|| engine.alloc_registered(length, WILDCARD_LOCATION)) {
                    Ok(mem) => {
                        let addr = mem.addr();
                        self.managed.lock().insert(addr, mem);
                        addr
                    }
                    Err(e) => {
                        te_engine_fail(&e);
                        0
                    }
                }
            })
        }

        /// free_managed_buffer(buffer_addr, length) -> int: 0, or -1 for an address that is not a
        /// managed buffer of at least `length` bytes.
        fn free_managed_buffer(&self, py: Python<'_>, buffer_addr: u64, length: u64) -> i32 {
            self.with_engine("free_managed_buffer", |code| code, |engine| {
                let Some(mem) = self.managed.lock().remove(&buffer_addr) else {
                    return te(TeCode::InvalidArgument, format!("{buffer_addr:#x} is not a managed buffer"));
                };
                if mem.len() < length {
                    self.managed.lock().insert(buffer_addr, mem);
                    return te(
                        TeCode::InvalidArgument,
                        format!("the managed buffer at {buffer_addr:#x} is smaller than {length}"),
                    );
                }
                match py.detach(|| engine.free_registered(mem.clone())) {
                    Ok(()) => 0,
                    Err(e) => {
                        self.managed.lock().insert(buffer_addr, mem);
                        te_engine_fail(&e).code()
                    }
                }
            })
        }

        /// get_local_topology(device_name=None) -> str: upstream's topology matrix as JSON, an
        /// object `{"cpu:<numa node>": [[preferred RDMA devices], [the others]]}` (an RDMA device
        /// is preferred by the NUMA node it hangs off); `device_name` (comma-separated) keeps only
        /// those devices; a `cuda:<n>` entry per GPU when the CUDA driver loads (every device
        /// preferred). `{}` on a host without NUMA support or GPUs. Needs no `initialize`.
        #[pyo3(signature = (device_name=None))]
        fn get_local_topology(&self, py: Python<'_>, device_name: Option<String>) -> String {
            py.detach(|| crate::host::local_topology(device_name.as_deref()))
        }

        /// get_first_buffer_address(segment_name) -> int: the address of the segment's first
        /// registered buffer, or 0 if it cannot be opened or has none.
        fn get_first_buffer_address(&self, py: Python<'_>, segment_name: &str) -> u64 {
            self.with_engine("get_first_buffer_address", |_| 0, |engine| {
                let r = py.detach(|| engine.open_segment(segment_name).and_then(|id| engine.segment_descriptor(id)));
                match r {
                    Ok(d) => d.buffers.first().map_or(0, |b| b.addr),
                    Err(e) => {
                        failed(&e);
                        0
                    }
                }
            })
        }

        /// write_bytes_to_buffer(buffer_addr, src, length) -> int: copies `length` bytes of `src`
        /// (bytes-like or str) into local registered memory at `buffer_addr` (device memory through
        /// its driver); -1 outside it.
        fn write_bytes_to_buffer(
            &self,
            py: Python<'_>,
            buffer_addr: u64,
            src: &Bound<'_, PyAny>,
            length: u64,
        ) -> PyResult<i32> {
            crescent_ffi::clear_last_error();
            let encoded;
            let src = match src.cast::<PyString>() {
                Ok(s) => {
                    encoded = PyBytes::new(src.py(), s.to_str()?.as_bytes());
                    Exported::new(encoded.as_any(), false)?
                }
                Err(_) => Exported::new(src, false)?,
            };
            if length > src.len() {
                return Err(PyValueError::new_err(format!("length {length} is larger than src ({} bytes)", src.len())));
            }
            let Some(engine) = self.engine() else { return Ok(Self::not_initialized("write_bytes_to_buffer")) };
            if length == 0 {
                return Ok(0);
            }
            if !engine.is_registered(buffer_addr, length) {
                let message = format!("[{buffer_addr:#x}, +{length}) is not registered memory");
                return Ok(te(TeCode::InvalidArgument, message));
            }
            if let Some(device) = engine.local_device_memory(buffer_addr, length) {
                // Device memory: copied in by its driver (the CPU cannot touch it).
                let from = src.bytes().as_ptr() as u64;
                let copied = py.detach(|| device.driver.copy(device.allocation.device, buffer_addr, from, length));
                return Ok(match copied {
                    Ok(()) => 0,
                    Err(e) => te_engine_fail(&e.into()).code(),
                });
            }
            // SAFETY: the range lies inside memory registered with this engine, which its owner
            // keeps valid while registered; `src` is a live export of at least `length` bytes.
            unsafe { std::ptr::copy_nonoverlapping(src.bytes().as_ptr(), buffer_addr as *mut u8, length as usize) };
            Ok(0)
        }

        /// read_bytes_from_buffer(buffer_addr, length) -> bytes: a copy of local registered memory
        /// (device memory through its driver; empty bytes outside registered memory).
        fn read_bytes_from_buffer<'py>(&self, py: Python<'py>, buffer_addr: u64, length: u64) -> Bound<'py, PyBytes> {
            self.with_engine("read_bytes_from_buffer", |_| PyBytes::new(py, &[]), |engine| {
                if length == 0 || !engine.is_registered(buffer_addr, length) {
                    te(TeCode::InvalidArgument, format!("[{buffer_addr:#x}, +{length}) is not registered memory"));
                    return PyBytes::new(py, &[]);
                }
                if let Some(device) = engine.local_device_memory(buffer_addr, length) {
                    // Device memory: copied out by its driver (the CPU cannot touch it).
                    let mut out = vec![0u8; length as usize];
                    let to = out.as_mut_ptr() as u64;
                    return match py.detach(|| device.driver.copy(device.allocation.device, to, buffer_addr, length)) {
                        Ok(()) => PyBytes::new(py, &out),
                        Err(e) => {
                            te_engine_fail(&e.into());
                            PyBytes::new(py, &[])
                        }
                    };
                }
                // SAFETY: the range lies inside memory registered with this engine (valid while
                // registered); it is copied out at once.
                let bytes = unsafe { std::slice::from_raw_parts(buffer_addr as *const u8, length as usize) };
                PyBytes::new(py, bytes)
            })
        }

        /// get_notifies() -> list[TransferNotify]: the notifications received since the last
        /// call, oldest first; each is returned once.
        fn get_notifies(&self) -> Vec<PyNotify> {
            let Some(engine) = self.engine() else {
                Self::not_initialized("get_notifies");
                return Vec::new();
            };
            engine
                .take_notifies()
                .into_iter()
                .map(|n| PyNotify {
                    name: String::from_utf8_lossy(&n.name).into_owned(),
                    msg: String::from_utf8_lossy(&n.message).into_owned(),
                })
                .collect()
        }

        /// send_probe(peer_server_name) -> int: 0 if the peer's engine answers, else a negative
        /// code (-200 unknown to the metadata service, -102 unreachable, -1 a bad name).
        fn send_probe(&self, py: Python<'_>, peer_server_name: &str) -> i32 {
            self.with_engine("send_probe", |code| code, |engine| {
                match py.detach(|| engine.probe(peer_server_name)) {
                    Ok(()) => 0,
                    Err(e) => te_engine_fail(&e).code(),
                }
            })
        }

        /// warmup_efa_segment(segment_name) -> int: 0 (there is no EFA transport, as in upstream
        /// builds without EFA).
        fn warmup_efa_segment(&self, segment_name: &str) -> i32 {
            let _ = segment_name;
            0
        }
    }

    /// transfer_sync_write(target_hostname, buffer, peer_buffer_address, length,
    /// transport_hint="") -> int: writes local registered memory into the target's; 0 or -1.
    fn transfer_sync_write = (Opcode::Write, Mode::Sync(None));
    /// transfer_sync_read(target_hostname, buffer, peer_buffer_address, length,
    /// transport_hint="") -> int: reads the target's registered memory into local; 0 or -1.
    fn transfer_sync_read = (Opcode::Read, Mode::Sync(None));
    /// transfer_submit_write(target_hostname, buffer, peer_buffer_address, length,
    /// transport_hint="") -> int: a batch id (poll with `transfer_check_status`), 0 on failure.
    fn transfer_submit_write = (Opcode::Write, Mode::Submit);
    with how
    #[pyo3(signature = (target_hostname, buffer, peer_buffer_address, length, transport_hint=""))]
    fn (
        &self, py: Python<'_>, target_hostname: &str, buffer: &Bound<'_, PyAny>, peer_buffer_address: u64, length: u64,
        transport_hint: &str,
    ) -> PyResult<Reply> {
        self.transfer(py, how, target_hostname, Buffers::One(buffer, peer_buffer_address, length), transport_hint)
    }

    /// batch_transfer_sync_write(target_hostname, buffers, peer_buffer_addresses, lengths,
    /// transport_hint="") -> int: 0 or -1.
    fn batch_transfer_sync_write = (Opcode::Write, Mode::Sync(None));
    /// batch_transfer_sync_read(target_hostname, buffers, peer_buffer_addresses, lengths,
    /// transport_hint="") -> int: 0 or -1.
    fn batch_transfer_sync_read = (Opcode::Read, Mode::Sync(None));
    /// batch_transfer_async_write(target_hostname, buffers, peer_buffer_addresses, lengths,
    /// transport_hint="") -> int: a batch id (wait with `get_batch_transfer_status`), 0 on failure.
    fn batch_transfer_async_write = (Opcode::Write, Mode::Submit);
    /// batch_transfer_async_read(target_hostname, buffers, peer_buffer_addresses, lengths,
    /// transport_hint="") -> int: a batch id, 0 on failure.
    fn batch_transfer_async_read = (Opcode::Read, Mode::Submit);
    with how
    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint=""))]
    fn (
        &self, py: Python<'_>, target_hostname: &str, buffers: &Bound<'_, PyAny>, peer_buffer_addresses: Vec<u64>,
        lengths: Vec<u64>, transport_hint: &str,
    ) -> PyResult<Reply> {
        let buffers = Buffers::Many(buffers, peer_buffer_addresses, lengths);
        self.transfer(py, how, target_hostname, buffers, transport_hint)
    }

    /// transfer_write_on_cuda(target_hostname, buffer, peer_buffer_address, length,
    /// stream_ptr=0, transport_hint="") -> None: the write is queued on the CUDA stream: it
    /// starts once the work queued before it is done, and later work waits for it. Raises
    /// `RuntimeError` when it cannot be queued; a failure of the transfer itself is logged and
    /// raised by the engine's next `*_on_cuda` call (upstream ends the process).
    fn transfer_write_on_cuda = Opcode::Write;
    /// transfer_read_on_cuda(target_hostname, buffer, peer_buffer_address, length,
    /// stream_ptr=0, transport_hint="") -> None: the read, queued on the CUDA stream as
    /// `transfer_write_on_cuda` queues a write.
    fn transfer_read_on_cuda = Opcode::Read;
    with opcode
    #[pyo3(signature = (target_hostname, buffer, peer_buffer_address, length, stream_ptr=None, transport_hint=""))]
    fn (
        &self, py: Python<'_>, target_hostname: &str, buffer: &Bound<'_, PyAny>, peer_buffer_address: u64, length: u64,
        stream_ptr: Option<&Bound<'_, PyAny>>, transport_hint: &str,
    ) -> PyResult<()> {
        let buffers = Buffers::One(buffer, peer_buffer_address, length);
        self.on_cuda(py, opcode, target_hostname, buffers, stream_ptr, transport_hint)
    }

    /// batch_transfer_write_on_cuda(target_hostname, buffers, peer_buffer_addresses, lengths,
    /// stream_ptr=0, transport_hint="") -> None: the writes, queued on the CUDA stream as one.
    fn batch_transfer_write_on_cuda = Opcode::Write;
    /// batch_transfer_read_on_cuda(target_hostname, buffers, peer_buffer_addresses, lengths,
    /// stream_ptr=0, transport_hint="") -> None: the reads, queued on the CUDA stream as one.
    fn batch_transfer_read_on_cuda = Opcode::Read;
    with opcode
    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, stream_ptr=None, transport_hint=""))]
    fn (
        &self, py: Python<'_>, target_hostname: &str, buffers: &Bound<'_, PyAny>, peer_buffer_addresses: Vec<u64>,
        lengths: Vec<u64>, stream_ptr: Option<&Bound<'_, PyAny>>, transport_hint: &str,
    ) -> PyResult<()> {
        let requests = Buffers::Many(buffers, peer_buffer_addresses, lengths);
        self.on_cuda(py, opcode, target_hostname, requests, stream_ptr, transport_hint)
    }
}

/// Adds the engine's classes to the module.
pub(crate) fn add_classes(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Engine>()?;
    m.add_class::<PyOpcode>()?;
    m.add_class::<PyNotify>()?;
    m.add_class::<InnerEngine>()?;
    Ok(())
}
