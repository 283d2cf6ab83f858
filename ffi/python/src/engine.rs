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

use std::collections::HashMap;
use std::sync::Arc;

use crescent_ffi::engine::{
    BatchId, EngineConfig, EngineError, Notification, Opcode, RegisteredMemory, TransferEngine, TransferRequest,
    TransferStatus, P2P_HANDSHAKE,
};
use crescent_ffi::{te_engine_fail, te_fail, TeCode};
use parking_lot::{Mutex, RwLock};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString, PyType};

use crate::{Exported, Mem};

/// Upstream's `kWildcardLocation`: memory of any placement.
const WILDCARD_LOCATION: &str = "*";

/// The `transport_hint` values upstream accepts ("" for none). Crescent chooses the transport
/// per segment, so a valid hint is accepted and has no effect.
const TRANSPORT_HINTS: [&str; 11] =
    ["", "rdma", "mnnvl", "shm", "nvlink", "gds", "io_uring", "tcp", "ascend", "sunrise_link", "unspec"];

fn check_hint(hint: &str) -> PyResult<()> {
    if TRANSPORT_HINTS.contains(&hint) {
        return Ok(());
    }
    Err(PyValueError::new_err(format!(
        "Unknown transport_hint '{hint}' (valid: {}, or empty string for no hint)",
        TRANSPORT_HINTS[1..].join(", ")
    )))
}

/// A failure reported with `code` and `message`; returns the code.
fn te(code: TeCode, message: impl std::fmt::Display) -> i32 {
    te_fail(code, message).code()
}

/// A failure of the engine reported with upstream's catch-all -1 (its Python transfer calls
/// return -1 whatever went wrong); the message says what.
fn failed(e: &EngineError) -> i32 {
    te(TeCode::InvalidArgument, e)
}

/// Mooncake's `TransferOpcode`: `Read` (0) pulls remote bytes, `Write` (1) pushes local ones.
#[pyclass(module = "crescent._crescent", name = "TransferOpcode", eq, eq_int, frozen, hash)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum PyOpcode {
    Read = 0,
    Write = 1,
}

impl PyOpcode {
    fn extract(obj: &Bound<'_, PyAny>) -> PyResult<Opcode> {
        if let Ok(op) = obj.cast::<PyOpcode>() {
            return Ok(match *op.get() {
                PyOpcode::Read => Opcode::Read,
                PyOpcode::Write => Opcode::Write,
            });
        }
        match obj.extract::<i64>() {
            Ok(0) => Ok(Opcode::Read),
            Ok(1) => Ok(Opcode::Write),
            _ => Err(PyTypeError::new_err("opcode: expected TransferOpcode.Read or TransferOpcode.Write")),
        }
    }
}

/// Mooncake's `TransferNotify(name="", msg="")`: a notification a transfer delivers to the
/// target's engine once it completed, where `get_notifies()` returns it.
#[pyclass(module = "crescent._crescent", name = "TransferNotify", get_all, set_all)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PyNotify {
    name: String,
    msg: String,
}

#[pymethods]
impl PyNotify {
    #[new]
    #[pyo3(signature = (name=String::new(), msg=String::new()))]
    fn new(name: String, msg: String) -> Self {
        PyNotify { name, msg }
    }

    fn __repr__(&self) -> String {
        format!("TransferNotify(name={:?}, msg={:?})", self.name, self.msg)
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other.cast::<PyNotify>().is_ok_and(|o| *o.borrow() == *self)
    }
}

impl From<&PyNotify> for Notification {
    fn from(n: &PyNotify) -> Self {
        Notification::new(n.name.as_bytes(), n.msg.as_bytes())
    }
}

/// What `get_engine()` returns: the engine object itself, opaque to Python.
#[pyclass(module = "crescent._crescent", name = "InnerTransferEngine", frozen)]
pub(crate) struct InnerEngine {
    _engine: Arc<TransferEngine>,
}

/// The engine behind a Python object given to `MooncakeDistributedStore.setup(..., engine)`:
/// a `TransferEngine` (None until it is initialized) or what its `get_engine()` returned.
/// Anything else is a `TypeError`.
pub(crate) fn shared_engine(obj: &Bound<'_, PyAny>) -> PyResult<Option<Arc<TransferEngine>>> {
    if let Ok(e) = obj.cast::<Engine>() {
        return Ok(e.borrow().engine());
    }
    if let Ok(inner) = obj.cast::<InnerEngine>() {
        return Ok(Some(inner.get()._engine.clone()));
    }
    Err(PyTypeError::new_err(format!(
        "setup: engine must be a TransferEngine (or its get_engine()), not {}",
        obj.get_type().name()?
    )))
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

/// One call's requests: local addresses (with the exports that keep buffer objects alive for
/// the call), peer addresses and lengths.
struct Requests {
    mems: Vec<Mem>,
    peers: Vec<u64>,
    lengths: Vec<u64>,
}

impl Requests {
    fn one(buffer: &Bound<'_, PyAny>, peer: u64, length: u64, opcode: Opcode) -> PyResult<Self> {
        let mem = Mem::any(buffer, opcode == Opcode::Read, "buffer")?;
        let length = mem.size(Some(length), "buffer")?;
        Ok(Requests { mems: vec![mem], peers: vec![peer], lengths: vec![length] })
    }

    /// `Err(message)` when the three lists differ in length (upstream: -1, or 0 for a batch id).
    fn many(
        buffers: &Bound<'_, PyAny>,
        peers: Vec<u64>,
        lengths: Vec<u64>,
        opcode: Opcode,
    ) -> PyResult<Result<Self, String>> {
        let list: Vec<Bound<'_, PyAny>> = buffers.try_iter()?.collect::<PyResult<_>>()?;
        if list.len() != peers.len() || list.len() != lengths.len() {
            return Ok(Err(format!(
                "buffers, peer_buffer_addresses and lengths have different sizes ({}, {}, {})",
                list.len(),
                peers.len(),
                lengths.len()
            )));
        }
        let mut mems = Vec::with_capacity(list.len());
        for (i, (obj, &len)) in list.iter().zip(&lengths).enumerate() {
            let what = format!("buffers[{i}]");
            let m = Mem::any(obj, opcode == Opcode::Read, &what)?;
            m.size(Some(len), &what)?;
            mems.push(m);
        }
        Ok(Ok(Requests { mems, peers, lengths }))
    }

    fn build(&self, opcode: Opcode, target: u64) -> Vec<TransferRequest> {
        self.mems
            .iter()
            .zip(&self.peers)
            .zip(&self.lengths)
            .map(|((m, &target_offset), &length)| TransferRequest {
                opcode,
                source: m.addr(),
                target,
                target_offset,
                length,
            })
            .collect()
    }
}

impl Engine {
    fn engine(&self) -> Option<Arc<TransferEngine>> {
        self.engine.read().clone()
    }

    fn not_initialized(what: &str) -> i32 {
        te(TeCode::InvalidArgument, format!("{what}: call initialize() first"))
    }

    /// Starts the engine; 0 or -1.
    fn start(
        &self,
        py: Python<'_>,
        local_hostname: &str,
        connection: String,
        protocol: &str,
        device_name: &str,
    ) -> i32 {
        crescent_ffi::clear_last_error();
        if self.engine.read().is_some() {
            return te(TeCode::InvalidArgument, "initialize: already initialized");
        }
        let config = match engine_config(local_hostname, connection, protocol, device_name) {
            Ok(c) => c,
            Err(message) => return te(TeCode::InvalidArgument, format!("initialize: {message}")),
        };
        match py.detach(|| TransferEngine::new(config)) {
            Ok(engine) => {
                let mut slot = self.engine.write();
                if slot.is_some() {
                    return te(TeCode::InvalidArgument, "initialize: already initialized");
                }
                *slot = Some(engine);
                0
            }
            Err(e) => te(TeCode::InvalidArgument, format!("initialize: {e}")),
        }
    }

    /// A blocking transfer; 0 or -1. With `notify`, once the transfer completed the
    /// notification is sent to the target's engine before this returns, as upstream does (a
    /// refused one is logged and left in `last_error()`; the transfer still counts: 0).
    fn sync(
        &self,
        py: Python<'_>,
        opcode: Opcode,
        target: &str,
        requests: Requests,
        notify: Option<Notification>,
    ) -> i32 {
        let Some(engine) = self.engine() else { return Self::not_initialized("transfer") };
        let r = py.detach(|| {
            let segment = engine.open_segment(target)?;
            let reqs = requests.build(opcode, segment);
            if let Some(n) = &notify {
                n.check()?;
                if reqs.is_empty() {
                    return Err(EngineError::InvalidArgument("a notification follows at least one request".into()));
                }
            }
            // Ends by the engine's transfer timeout (MC_TRANSFER_TIMEOUT) whatever the peer does.
            let batch = engine.transfer_start(&reqs)?;
            engine.transfer_finish(batch)?;
            Ok(notify.map(|n| engine.send_notify(segment, &n)))
        });
        drop(requests);
        match r {
            Ok(None | Some(Ok(()))) => 0,
            Ok(Some(Err(e))) => {
                te_engine_fail(&e);
                crescent_ffi::set_last_error(format!(
                    "the transfer completed; its notification was not delivered: {e}"
                ));
                0
            }
            Err(e) => failed(&e),
        }
    }

    /// A transfer started in a batch of its own: the batch id, or 0.
    fn submit(&self, py: Python<'_>, opcode: Opcode, target: &str, requests: Requests) -> u64 {
        let Some(engine) = self.engine() else {
            Self::not_initialized("transfer");
            return 0;
        };
        let r = py.detach(|| {
            let segment = engine.open_segment(target)?;
            engine.transfer_start(&requests.build(opcode, segment))
        });
        match r {
            Ok(id) => id,
            Err(e) => {
                failed(&e);
                0
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn many_async(
        &self,
        py: Python<'_>,
        opcode: Opcode,
        target: &str,
        buffers: &Bound<'_, PyAny>,
        peers: Vec<u64>,
        lengths: Vec<u64>,
        hint: &str,
    ) -> PyResult<u64> {
        crescent_ffi::clear_last_error();
        check_hint(hint)?;
        Ok(match Requests::many(buffers, peers, lengths, opcode)? {
            Ok(r) => self.submit(py, opcode, target, r),
            Err(message) => {
                te(TeCode::InvalidArgument, message);
                0
            }
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn many_sync(
        &self,
        py: Python<'_>,
        opcode: Opcode,
        target: &str,
        buffers: &Bound<'_, PyAny>,
        peers: Vec<u64>,
        lengths: Vec<u64>,
        notify: Option<&PyNotify>,
        hint: &str,
    ) -> PyResult<i32> {
        crescent_ffi::clear_last_error();
        check_hint(hint)?;
        Ok(match Requests::many(buffers, peers, lengths, opcode)? {
            Ok(r) => self.sync(py, opcode, target, r, notify.map(Notification::from)),
            Err(message) => te(TeCode::InvalidArgument, message),
        })
    }

    /// Upstream's `*_on_cuda`: the requests queued on the caller's CUDA stream (see
    /// `TransferEngine::transfer_on_stream`); `None` once queued. A refusal raises
    /// `RuntimeError` (as upstream's does), the message also in `last_error()`.
    fn on_cuda(
        &self,
        py: Python<'_>,
        opcode: Opcode,
        target: &str,
        requests: Result<Requests, String>,
        stream: Option<&Bound<'_, PyAny>>,
        hint: &str,
    ) -> PyResult<()> {
        check_hint(hint)?;
        let stream = stream.map_or(Ok(0), stream_handle)?;
        let requests = requests.map_err(|message| runtime(TeCode::InvalidArgument, message))?;
        let Some(engine) = self.engine() else {
            return Err(runtime(TeCode::InvalidArgument, "transfer on a CUDA stream: call initialize() first"));
        };
        let queued = py.detach(|| {
            let segment = engine.open_segment(target)?;
            let reqs = requests.build(opcode, segment);
            // The buffer objects stay exported until the transfer has ended.
            engine.transfer_on_stream(stream, reqs, requests.mems)
        });
        queued.map_err(|e| {
            te_engine_fail(&e);
            PyRuntimeError::new_err(e.to_string())
        })
    }
}

/// A `RuntimeError` with `message`, recorded as the last error with `code`.
fn runtime(code: TeCode, message: impl std::fmt::Display) -> PyErr {
    let message = message.to_string();
    te_fail(code, &message);
    PyRuntimeError::new_err(message)
}

/// A CUDA stream given to the `*_on_cuda` calls: an int handle (`cudaStream_t`, 0 for the
/// default stream), or a stream object of torch (`cuda_stream`) or cupy (`ptr`).
fn stream_handle(stream: &Bound<'_, PyAny>) -> PyResult<u64> {
    let handle = if stream.hasattr("cuda_stream")? {
        stream.getattr("cuda_stream")?
    } else if stream.hasattr("ptr")? && !stream.hasattr("__index__")? {
        stream.getattr("ptr")?
    } else {
        stream.clone()
    };
    handle.extract::<u64>().map_err(|_| {
        PyTypeError::new_err(
            "stream_ptr: expected an int CUDA stream handle (0: the default stream) or a stream object",
        )
    })
}

/// The engine's configuration for upstream's `initialize` arguments: a port in
/// `local_hostname` is ignored with P2P handshake (upstream picks a free one) and kept with a
/// metadata service (part of the segment's name there).
fn engine_config(
    local_hostname: &str,
    connection: String,
    protocol: &str,
    device_name: &str,
) -> Result<EngineConfig, String> {
    let mut c = EngineConfig::from_env().map_err(|e| e.to_string())?;
    let p2p = connection.is_empty() || connection.eq_ignore_ascii_case(P2P_HANDSHAKE);
    let host = local_hostname.trim();
    let host = match crescent_ffi::engine::handshake::split_host_port(host) {
        Ok((h, _)) if p2p => h,
        _ => host.to_string(),
    };
    c.local_hostname = Some(host).filter(|h| !h.is_empty());
    c.metadata_server = if p2p { P2P_HANDSHAKE.into() } else { connection };
    if let Some(kind) = crescent_ffi::protocol_of(protocol).map_err(|e| e.to_string())? {
        c.protocol = Some(kind);
    }
    if !device_name.trim().is_empty() {
        c.rdma.devices = crescent_ffi::engine::parse_device_list(device_name).map_err(|e| e.to_string())?;
    }
    Ok(c)
}

#[pymethods]
impl Engine {
    #[new]
    fn new() -> Self {
        crescent_ffi::init_logging();
        Engine { engine: RwLock::new(None), managed: Mutex::new(HashMap::new()), pinned: Mutex::new(HashMap::new()) }
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
        &self,
        py: Python<'_>,
        local_hostname: &str,
        metadata_server: &str,
        protocol: &str,
        device_name: &str,
    ) -> i32 {
        self.start(py, local_hostname, metadata_server.trim().to_string(), protocol, device_name)
    }

    /// initialize_ext(local_hostname, metadata_server, protocol, device_name, metadata_type)
    /// -> int: as `initialize`, the service named by `metadata_type` (`etcd`, `redis`,
    /// `http`) when `metadata_server` has no `scheme://`.
    fn initialize_ext(
        &self,
        py: Python<'_>,
        local_hostname: &str,
        metadata_server: &str,
        protocol: &str,
        device_name: &str,
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
        let results: Vec<Result<(), EngineError>> = py.detach(|| addrs.iter().map(|&a| engine.unregister(a)).collect());
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

    /// transfer_sync_write(target_hostname, buffer, peer_buffer_address, length,
    /// transport_hint="") -> int: writes local registered memory into the target's; 0 or -1.
    #[pyo3(signature = (target_hostname, buffer, peer_buffer_address, length, transport_hint=""))]
    fn transfer_sync_write(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffer: &Bound<'_, PyAny>,
        peer_buffer_address: u64,
        length: u64,
        transport_hint: &str,
    ) -> PyResult<i32> {
        crescent_ffi::clear_last_error();
        check_hint(transport_hint)?;
        let r = Requests::one(buffer, peer_buffer_address, length, Opcode::Write)?;
        Ok(self.sync(py, Opcode::Write, target_hostname, r, None))
    }

    /// transfer_sync_read(target_hostname, buffer, peer_buffer_address, length,
    /// transport_hint="") -> int: reads the target's registered memory into local; 0 or -1.
    #[pyo3(signature = (target_hostname, buffer, peer_buffer_address, length, transport_hint=""))]
    fn transfer_sync_read(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffer: &Bound<'_, PyAny>,
        peer_buffer_address: u64,
        length: u64,
        transport_hint: &str,
    ) -> PyResult<i32> {
        crescent_ffi::clear_last_error();
        check_hint(transport_hint)?;
        let r = Requests::one(buffer, peer_buffer_address, length, Opcode::Read)?;
        Ok(self.sync(py, Opcode::Read, target_hostname, r, None))
    }

    /// transfer_sync(target_hostname, buffer, peer_buffer_address, length, opcode,
    /// notify=None, transport_hint="") -> int: 0 or -1; with `notify`, the target's engine
    /// receives it once the transfer completed.
    #[pyo3(signature = (target_hostname, buffer, peer_buffer_address, length, opcode, notify=None, transport_hint=""))]
    #[allow(clippy::too_many_arguments)]
    fn transfer_sync(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffer: &Bound<'_, PyAny>,
        peer_buffer_address: u64,
        length: u64,
        opcode: &Bound<'_, PyAny>,
        notify: Option<PyRef<'_, PyNotify>>,
        transport_hint: &str,
    ) -> PyResult<i32> {
        crescent_ffi::clear_last_error();
        check_hint(transport_hint)?;
        let opcode = PyOpcode::extract(opcode)?;
        let r = Requests::one(buffer, peer_buffer_address, length, opcode)?;
        Ok(self.sync(py, opcode, target_hostname, r, notify.as_deref().map(Notification::from)))
    }

    /// batch_transfer_sync_write(target_hostname, buffers, peer_buffer_addresses, lengths,
    /// transport_hint="") -> int: 0 or -1.
    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint=""))]
    fn batch_transfer_sync_write(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffers: &Bound<'_, PyAny>,
        peer_buffer_addresses: Vec<u64>,
        lengths: Vec<u64>,
        transport_hint: &str,
    ) -> PyResult<i32> {
        self.many_sync(
            py,
            Opcode::Write,
            target_hostname,
            buffers,
            peer_buffer_addresses,
            lengths,
            None,
            transport_hint,
        )
    }

    /// batch_transfer_sync_read(target_hostname, buffers, peer_buffer_addresses, lengths,
    /// transport_hint="") -> int: 0 or -1.
    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint=""))]
    fn batch_transfer_sync_read(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffers: &Bound<'_, PyAny>,
        peer_buffer_addresses: Vec<u64>,
        lengths: Vec<u64>,
        transport_hint: &str,
    ) -> PyResult<i32> {
        self.many_sync(py, Opcode::Read, target_hostname, buffers, peer_buffer_addresses, lengths, None, transport_hint)
    }

    /// batch_transfer_sync(target_hostname, buffers, peer_buffer_addresses, lengths, opcode,
    /// notify=None, transport_hint="") -> int: 0 or -1; `notify` as in `transfer_sync`.
    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, opcode, notify=None, transport_hint=""))]
    #[allow(clippy::too_many_arguments)]
    fn batch_transfer_sync(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffers: &Bound<'_, PyAny>,
        peer_buffer_addresses: Vec<u64>,
        lengths: Vec<u64>,
        opcode: &Bound<'_, PyAny>,
        notify: Option<PyRef<'_, PyNotify>>,
        transport_hint: &str,
    ) -> PyResult<i32> {
        let opcode = PyOpcode::extract(opcode)?;
        self.many_sync(
            py,
            opcode,
            target_hostname,
            buffers,
            peer_buffer_addresses,
            lengths,
            notify.as_deref(),
            transport_hint,
        )
    }

    /// batch_transfer_async_write(target_hostname, buffers, peer_buffer_addresses, lengths,
    /// transport_hint="") -> int: a batch id (wait with `get_batch_transfer_status`), 0 on failure.
    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint=""))]
    fn batch_transfer_async_write(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffers: &Bound<'_, PyAny>,
        peer_buffer_addresses: Vec<u64>,
        lengths: Vec<u64>,
        transport_hint: &str,
    ) -> PyResult<u64> {
        self.many_async(py, Opcode::Write, target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint)
    }

    /// batch_transfer_async_read(target_hostname, buffers, peer_buffer_addresses, lengths,
    /// transport_hint="") -> int: a batch id, 0 on failure.
    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint=""))]
    fn batch_transfer_async_read(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffers: &Bound<'_, PyAny>,
        peer_buffer_addresses: Vec<u64>,
        lengths: Vec<u64>,
        transport_hint: &str,
    ) -> PyResult<u64> {
        self.many_async(py, Opcode::Read, target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint)
    }

    /// batch_transfer_async(target_hostname, buffers, peer_buffer_addresses, lengths, opcode,
    /// transport_hint="") -> int: a batch id, 0 on failure.
    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, opcode, transport_hint=""))]
    #[allow(clippy::too_many_arguments)]
    fn batch_transfer_async(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffers: &Bound<'_, PyAny>,
        peer_buffer_addresses: Vec<u64>,
        lengths: Vec<u64>,
        opcode: &Bound<'_, PyAny>,
        transport_hint: &str,
    ) -> PyResult<u64> {
        let opcode = PyOpcode::extract(opcode)?;
        self.many_async(py, opcode, target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint)
    }

    /// transfer_write_on_cuda(target_hostname, buffer, peer_buffer_address, length,
    /// stream_ptr=0, transport_hint="") -> None: the write is queued on the CUDA stream: it
    /// starts once the work queued before it is done, and later work waits for it. Raises
    /// `RuntimeError` when it cannot be queued; a failure of the transfer itself is logged and
    /// raised by the engine's next `*_on_cuda` call (upstream ends the process).
    #[pyo3(signature = (target_hostname, buffer, peer_buffer_address, length, stream_ptr=None, transport_hint=""))]
    #[allow(clippy::too_many_arguments)]
    fn transfer_write_on_cuda(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffer: &Bound<'_, PyAny>,
        peer_buffer_address: u64,
        length: u64,
        stream_ptr: Option<&Bound<'_, PyAny>>,
        transport_hint: &str,
    ) -> PyResult<()> {
        crescent_ffi::clear_last_error();
        let r = Requests::one(buffer, peer_buffer_address, length, Opcode::Write)?;
        self.on_cuda(py, Opcode::Write, target_hostname, Ok(r), stream_ptr, transport_hint)
    }

    /// transfer_read_on_cuda(target_hostname, buffer, peer_buffer_address, length,
    /// stream_ptr=0, transport_hint="") -> None: the read, queued on the CUDA stream as
    /// `transfer_write_on_cuda` queues a write.
    #[pyo3(signature = (target_hostname, buffer, peer_buffer_address, length, stream_ptr=None, transport_hint=""))]
    #[allow(clippy::too_many_arguments)]
    fn transfer_read_on_cuda(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffer: &Bound<'_, PyAny>,
        peer_buffer_address: u64,
        length: u64,
        stream_ptr: Option<&Bound<'_, PyAny>>,
        transport_hint: &str,
    ) -> PyResult<()> {
        crescent_ffi::clear_last_error();
        let r = Requests::one(buffer, peer_buffer_address, length, Opcode::Read)?;
        self.on_cuda(py, Opcode::Read, target_hostname, Ok(r), stream_ptr, transport_hint)
    }

    /// batch_transfer_write_on_cuda(target_hostname, buffers, peer_buffer_addresses, lengths,
    /// stream_ptr=0, transport_hint="") -> None: the writes, queued on the CUDA stream as one.
    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, stream_ptr=None, transport_hint=""))]
    #[allow(clippy::too_many_arguments)]
    fn batch_transfer_write_on_cuda(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffers: &Bound<'_, PyAny>,
        peer_buffer_addresses: Vec<u64>,
        lengths: Vec<u64>,
        stream_ptr: Option<&Bound<'_, PyAny>>,
        transport_hint: &str,
    ) -> PyResult<()> {
        crescent_ffi::clear_last_error();
        let r = Requests::many(buffers, peer_buffer_addresses, lengths, Opcode::Write)?;
        self.on_cuda(py, Opcode::Write, target_hostname, r, stream_ptr, transport_hint)
    }

    /// batch_transfer_read_on_cuda(target_hostname, buffers, peer_buffer_addresses, lengths,
    /// stream_ptr=0, transport_hint="") -> None: the reads, queued on the CUDA stream as one.
    #[pyo3(signature = (target_hostname, buffers, peer_buffer_addresses, lengths, stream_ptr=None, transport_hint=""))]
    #[allow(clippy::too_many_arguments)]
    fn batch_transfer_read_on_cuda(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffers: &Bound<'_, PyAny>,
        peer_buffer_addresses: Vec<u64>,
        lengths: Vec<u64>,
        stream_ptr: Option<&Bound<'_, PyAny>>,
        transport_hint: &str,
    ) -> PyResult<()> {
        crescent_ffi::clear_last_error();
        let r = Requests::many(buffers, peer_buffer_addresses, lengths, Opcode::Read)?;
        self.on_cuda(py, Opcode::Read, target_hostname, r, stream_ptr, transport_hint)
    }

    /// transfer_submit_write(target_hostname, buffer, peer_buffer_address, length,
    /// transport_hint="") -> int: a batch id (poll with `transfer_check_status`), 0 on failure.
    #[pyo3(signature = (target_hostname, buffer, peer_buffer_address, length, transport_hint=""))]
    fn transfer_submit_write(
        &self,
        py: Python<'_>,
        target_hostname: &str,
        buffer: &Bound<'_, PyAny>,
        peer_buffer_address: u64,
        length: u64,
        transport_hint: &str,
    ) -> PyResult<u64> {
        crescent_ffi::clear_last_error();
        check_hint(transport_hint)?;
        let r = Requests::one(buffer, peer_buffer_address, length, Opcode::Write)?;
        Ok(self.submit(py, Opcode::Write, target_hostname, r))
    }

    /// get_batch_transfer_status(batch_ids) -> int: waits for every batch to end and frees
    /// them; 0 if all completed, -1 if any failed, timed out or is unknown.
    fn get_batch_transfer_status(&self, py: Python<'_>, batch_ids: Vec<BatchId>) -> i32 {
        crescent_ffi::clear_last_error();
        let Some(engine) = self.engine() else { return Self::not_initialized("get_batch_transfer_status") };
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
    }

    /// transfer_check_status(batch_id) -> int: 0 while in flight; once ended (the batch is then
    /// freed) 1 completed, -1 failed, -2 timed out; -1 for an unknown batch.
    fn transfer_check_status(&self, py: Python<'_>, batch_id: BatchId) -> i32 {
        crescent_ffi::clear_last_error();
        let Some(engine) = self.engine() else { return Self::not_initialized("transfer_check_status") };
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
                TransferStatus::Failed(reason) => return te(TeCode::InvalidArgument, format!("request {i}: {reason}")),
                TransferStatus::TimedOut => {
                    te(TeCode::InvalidArgument, format!("request {i} timed out"));
                    result = -2;
                }
                _ => {}
            }
        }
        result
    }

    /// allocate_managed_buffer(length) -> int: the address of `length` bytes of registered
    /// memory, or 0 on failure. Free it with `free_managed_buffer`.
    fn allocate_managed_buffer(&self, py: Python<'_>, length: u64) -> u64 {
        crescent_ffi::clear_last_error();
        let Some(engine) = self.engine() else {
            Self::not_initialized("allocate_managed_buffer");
            return 0;
        };
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
    }

    /// free_managed_buffer(buffer_addr, length) -> int: 0, or -1 for an address that is not a
    /// managed buffer of at least `length` bytes.
    fn free_managed_buffer(&self, py: Python<'_>, buffer_addr: u64, length: u64) -> i32 {
        crescent_ffi::clear_last_error();
        let Some(engine) = self.engine() else { return Self::not_initialized("free_managed_buffer") };
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
        crescent_ffi::clear_last_error();
        let Some(engine) = self.engine() else {
            Self::not_initialized("get_first_buffer_address");
            return 0;
        };
        let r = py.detach(|| engine.open_segment(segment_name).and_then(|id| engine.segment_descriptor(id)));
        match r {
            Ok(d) => d.buffers.first().map_or(0, |b| b.addr),
            Err(e) => {
                failed(&e);
                0
            }
        }
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
            return Ok(te(TeCode::InvalidArgument, format!("[{buffer_addr:#x}, +{length}) is not registered memory")));
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
        crescent_ffi::clear_last_error();
        let Some(engine) = self.engine() else {
            Self::not_initialized("read_bytes_from_buffer");
            return PyBytes::new(py, &[]);
        };
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
        crescent_ffi::clear_last_error();
        let Some(engine) = self.engine() else { return Self::not_initialized("send_probe") };
        match py.detach(|| engine.probe(peer_server_name)) {
            Ok(()) => 0,
            Err(e) => te_engine_fail(&e).code(),
        }
    }

    /// warmup_efa_segment(segment_name) -> int: 0 (there is no EFA transport, as in upstream
    /// builds without EFA).
    fn warmup_efa_segment(&self, segment_name: &str) -> i32 {
        let _ = segment_name;
        0
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
