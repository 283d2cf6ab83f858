//! The native module `crescent._crescent` behind the Python package `crescent`: Mooncake's
//! `MooncakeDistributedStore` and `TransferEngine` with their method names, argument order and
//! return conventions, over `crescent-store` and `crescent-engine`.
//!
//! Conventions (documented for users in docs/src/ffi.md and the `.pyi` stubs):
//! * methods that return a status in Mooncake return one here: 0 or a count/size for success,
//!   a negative Mooncake error code otherwise; `crescent.last_error()` gives the message;
//! * `get` returns `bytes` (empty on failure), `is_exist` 1/0/-1;
//! * bad arguments (wrong types, sizes larger than the given buffer, lists of different
//!   lengths) raise `TypeError` / `ValueError` / `BufferError`, as Python code expects;
//! * memory can be given as an int address (Mooncake's way) or as any object with the buffer
//!   protocol (bytearray, memoryview, numpy array...): no copy either way;
//! * the GIL is released during master calls and transfers, so other Python threads run.

use std::collections::HashMap;
use std::sync::Arc;

use crescent_ffi::store::proto::PutOptions;
use crescent_ffi::store::{StoreApi, StoreClient};
use crescent_ffi::{fail, store_fail, SetupArgs, Status};
use parking_lot::{Mutex, RwLock};
use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

// ---- memory handed in from Python ----

/// A C-contiguous buffer exported by a Python object. While it lives, the object stays alive
/// and cannot be resized (the exporter refuses while an export is held); dropping it releases
/// the export.
struct Exported {
    view: Box<pyo3::ffi::Py_buffer>,
}

// SAFETY: the view is only read (its `buf` and `len`) after the export; the export holds a
// strong reference to the exporter, and it is released with the interpreter attached (Drop),
// from whichever thread drops it.
unsafe impl Send for Exported {}
// SAFETY: shared access only reads plain fields of the view.
unsafe impl Sync for Exported {}

impl Exported {
    fn new(obj: &Bound<'_, PyAny>, writable: bool) -> PyResult<Self> {
        let mut view = Box::new(pyo3::ffi::Py_buffer::new());
        let flags = if writable { pyo3::ffi::PyBUF_WRITABLE } else { pyo3::ffi::PyBUF_SIMPLE };
        // SAFETY: the interpreter is attached (we hold `obj`); `view` is a valid, writable
        // Py_buffer that stays at this heap address until released in Drop.
        if unsafe { pyo3::ffi::PyObject_GetBuffer(obj.as_ptr(), &mut *view, flags) } != 0 {
            return Err(PyErr::fetch(obj.py()));
        }
        let exported = Exported { view };
        // SAFETY: a view just filled in by a successful PyObject_GetBuffer.
        if unsafe { pyo3::ffi::PyBuffer_IsContiguous(&*exported.view, b'C' as std::ffi::c_char) } == 0 {
            return Err(PyBufferError::new_err("the buffer is not C-contiguous"));
        }
        Ok(exported)
    }

    fn addr(&self) -> u64 {
        self.view.buf as u64
    }

    fn len(&self) -> u64 {
        self.view.len.max(0) as u64
    }

    /// The bytes, for reading during a call that holds this export.
    fn bytes(&self) -> &[u8] {
        if self.len() == 0 {
            return &[];
        }
        // SAFETY: a contiguous exported buffer of `len` bytes, alive while `self` is.
        unsafe { std::slice::from_raw_parts(self.view.buf as *const u8, self.len() as usize) }
    }
}

impl Drop for Exported {
    fn drop(&mut self) {
        // SAFETY: releases the export made in `new`, exactly once, with the interpreter attached.
        Python::attach(|_| unsafe { pyo3::ffi::PyBuffer_Release(&mut *self.view) });
    }
}

/// Memory given either as an int address (Mooncake's convention) or as a buffer object.
enum Mem {
    Addr(u64),
    Buffer(Exported),
}

impl Mem {
    fn new(obj: &Bound<'_, PyAny>, writable: bool, what: &str) -> PyResult<Self> {
        // An int, or an integer-like scalar without a length (numpy.uint64 has the buffer
        // protocol too, but means an address here, e.g. from an array of addresses).
        let int_like =
            obj.is_instance_of::<pyo3::types::PyInt>() || (obj.hasattr("__index__")? && !obj.hasattr("__len__")?);
        if int_like {
            return obj.call_method0("__index__")?.extract::<u64>().map(Mem::Addr).map_err(|_| {
                PyValueError::new_err(format!("{what}: an address must be a non-negative int below 2**64"))
            });
        }
        if obj.is_instance_of::<pyo3::types::PyString>() {
            return Err(PyTypeError::new_err(format!("{what}: expected an int address or a buffer, not str")));
        }
        Exported::new(obj, writable).map(Mem::Buffer).map_err(|e| {
            if e.is_instance_of::<PyTypeError>(obj.py()) {
                PyTypeError::new_err(format!(
                    "{what}: expected an int address or an object with the buffer protocol (bytearray, memoryview, \
                     numpy array), not {}",
                    obj.get_type().name().map(|n| n.to_string()).unwrap_or_default()
                ))
            } else {
                e
            }
        })
    }

    fn addr(&self) -> u64 {
        match self {
            Mem::Addr(a) => *a,
            Mem::Buffer(b) => b.addr(),
        }
    }

    /// The length to use: `size` if given (at most the buffer's length), else the buffer's.
    fn size(&self, size: Option<u64>, what: &str) -> PyResult<u64> {
        match (self, size) {
            (Mem::Addr(_), Some(n)) => Ok(n),
            (Mem::Addr(_), None) => {
                Err(PyTypeError::new_err(format!("{what}: a size is required with an int address")))
            }
            (Mem::Buffer(b), Some(n)) if n > b.len() => {
                Err(PyValueError::new_err(format!("{what}: size {n} is larger than the buffer ({} bytes)", b.len())))
            }
            (Mem::Buffer(_), Some(n)) => Ok(n),
            (Mem::Buffer(b), None) => Ok(b.len()),
        }
    }
}

/// Memory for a list of buffers with optional sizes.
fn mems(
    buffers: &Bound<'_, PyAny>,
    sizes: Option<Vec<u64>>,
    writable: bool,
    count: usize,
) -> PyResult<(Vec<Mem>, Vec<u64>)> {
    let list: Vec<Bound<'_, PyAny>> = buffers.try_iter()?.collect::<PyResult<_>>()?;
    if list.len() != count {
        return Err(PyValueError::new_err(format!("{count} keys but {} buffers", list.len())));
    }
    if let Some(s) = &sizes {
        if s.len() != count {
            return Err(PyValueError::new_err(format!("{count} keys but {} sizes", s.len())));
        }
    }
    let mut out = Vec::with_capacity(count);
    let mut lens = Vec::with_capacity(count);
    for (i, obj) in list.iter().enumerate() {
        let what = format!("buffers[{i}]");
        let m = Mem::new(obj, writable, &what)?;
        lens.push(m.size(sizes.as_ref().map(|s| s[i]), &what)?);
        out.push(m);
    }
    Ok((out, lens))
}

fn not_set_up(what: &str) -> i32 {
    fail(Status::UnavailableInCurrentStatus, format!("{what}: call setup() first (or it was closed)")).code()
}

// ---- MooncakeDistributedStore ----

// ---- ReplicateConfig ----

/// ReplicateConfig(): Mooncake's per-put placement — `replica_num` (1), `with_soft_pin`
/// (False: True keeps the object from eviction for the master's soft-pin time, 30 min by
/// default), `with_hard_pin` (False: True never evicts it), `preferred_segment` ("") and
/// `preferred_segments` ([]): segment names (`get_hostname()` of a client) tried first for
/// the replicas, in order, whatever the master's allocation strategy; a full or unknown one
/// falls back to the strategy's choice.
#[pyclass(module = "crescent._crescent", name = "ReplicateConfig", get_all, set_all)]
#[derive(Clone)]
struct PyReplicateConfig {
    replica_num: u32,
    with_soft_pin: bool,
    with_hard_pin: bool,
    preferred_segment: String,
    preferred_segments: Vec<String>,
}

#[pymethods]
impl PyReplicateConfig {
    #[new]
    fn new() -> Self {
        let d = crescent_ffi::ReplicateConfig::default();
        PyReplicateConfig {
            replica_num: d.replica_num,
            with_soft_pin: d.with_soft_pin,
            with_hard_pin: d.with_hard_pin,
            preferred_segment: d.preferred_segment,
            preferred_segments: d.preferred_segments,
        }
    }

    fn __repr__(&self) -> String {
        let py_bool = |b: bool| if b { "True" } else { "False" };
        format!(
            "ReplicateConfig(replica_num={}, with_soft_pin={}, with_hard_pin={}, preferred_segment={:?}, \
             preferred_segments={:?})",
            self.replica_num,
            py_bool(self.with_soft_pin),
            py_bool(self.with_hard_pin),
            self.preferred_segment,
            self.preferred_segments
        )
    }
}

/// The put options of `config` for `client` (its defaults when no config is given).
fn put_options(client: &Arc<dyn StoreApi>, config: Option<&PyReplicateConfig>) -> Result<PutOptions, Status> {
    let Some(c) = config else { return Ok(client.default_options()) };
    let config = crescent_ffi::ReplicateConfig {
        replica_num: c.replica_num,
        with_soft_pin: c.with_soft_pin,
        with_hard_pin: c.with_hard_pin,
        preferred_segment: c.preferred_segment.clone(),
        preferred_segments: c.preferred_segments.clone(),
    };
    config.put_options(&**client).map_err(|e| store_fail(&e))
}

/// A client of the Crescent store with Mooncake's `MooncakeDistributedStore` interface.
///
/// Call `setup(...)` first. Status-returning methods give 0 (or a count / size) on success and
/// a negative Mooncake error code on failure; `crescent.last_error()` gives the message.
/// Memory for the zero-copy calls is an int address or a buffer object (bytearray,
/// memoryview, numpy array), registered once with `register_buffer`.
#[pyclass(module = "crescent._crescent", name = "MooncakeDistributedStore")]
struct Store {
    /// A full client (`setup`) or a dummy client (`setup_dummy`, see `dummy.rs`).
    client: RwLock<Option<Arc<dyn StoreApi>>>,
    /// Buffer objects registered by `register_buffer`, kept exported until unregistered.
    pinned: Mutex<HashMap<u64, Exported>>,
}

impl Store {
    fn client(&self) -> Option<Arc<dyn StoreApi>> {
        self.client.read().clone()
    }
}

/// Sizes in a setup dict: ints or strings such as "512MB".
fn dict_pairs(d: &Bound<'_, PyDict>) -> PyResult<Vec<(String, String)>> {
    let mut pairs = Vec::new();
    for (k, v) in d.iter() {
        let key: String = k.extract().map_err(|_| PyTypeError::new_err("setup dict keys must be str"))?;
        let value = if v.is_instance_of::<pyo3::types::PyString>() || v.is_instance_of::<pyo3::types::PyInt>() {
            v.str()?.to_string()
        } else {
            return Err(PyTypeError::new_err(format!("setup dict value of {key:?} must be str or int")));
        };
        pairs.push((key, value));
    }
    Ok(pairs)
}

#[pymethods]
impl Store {
    #[new]
    fn new() -> Self {
        crescent_ffi::init_logging();
        Store { client: RwLock::new(None), pinned: Mutex::new(HashMap::new()) }
    }

    /// setup(local_hostname, metadata_server, global_segment_size=16 MiB, local_buffer_size=16 MiB,
    ///       protocol="tcp", rdma_devices="", master_server_addr="127.0.0.1:50051") -> int
    ///
    /// Also `setup(config: dict)` with the same keys. Starts the client, contributes
    /// `global_segment_size` bytes to the pool and mounts them at the master. Returns 0 or a
    /// negative error code (e.g. -900 when the master is unreachable).
    #[pyo3(signature = (local_hostname, metadata_server=None, global_segment_size=crescent_ffi::DEFAULT_GLOBAL_SEGMENT_SIZE,
                        local_buffer_size=crescent_ffi::DEFAULT_LOCAL_BUFFER_SIZE, protocol="tcp".to_string(),
                        rdma_devices=String::new(), master_server_addr="127.0.0.1:50051".to_string()))]
    #[allow(clippy::too_many_arguments)] // Mooncake's argument list
    fn setup(
        &self,
        py: Python<'_>,
        local_hostname: &Bound<'_, PyAny>,
        metadata_server: Option<String>,
        global_segment_size: u64,
        local_buffer_size: u64,
        protocol: String,
        rdma_devices: String,
        master_server_addr: String,
    ) -> PyResult<i32> {
        crescent_ffi::clear_last_error();
        let args = if let Ok(d) = local_hostname.cast::<PyDict>() {
            let pairs = dict_pairs(d)?;
            match SetupArgs::from_pairs(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str()))) {
                Ok(a) => a,
                Err(e) => return Err(PyValueError::new_err(e.to_string())),
            }
        } else {
            let local_hostname: String = local_hostname
                .extract()
                .map_err(|_| PyTypeError::new_err("local_hostname must be str (or pass one dict)"))?;
            let metadata_server =
                metadata_server.ok_or_else(|| PyTypeError::new_err("setup() missing argument: metadata_server"))?;
            SetupArgs {
                local_hostname,
                metadata_server,
                global_segment_size,
                local_buffer_size,
                protocol,
                rdma_devices,
                master_server_addr,
            }
        };
        if self.client.read().is_some() {
            return Ok(fail(Status::UnavailableInCurrentStatus, "setup: already set up; close() first").code());
        }
        let connected = py.detach(|| {
            let config = args.client_config()?;
            StoreClient::connect(config)
        });
        match connected {
            Ok(client) => {
                let client: Arc<dyn StoreApi> = client;
                let mut slot = self.client.write();
                if slot.is_some() {
                    drop(slot);
                    let _ = py.detach(|| client.close());
                    return Ok(fail(Status::UnavailableInCurrentStatus, "setup: already set up; close() first").code());
                }
                *slot = Some(client);
                Ok(0)
            }
            Err(e) => Ok(store_fail(&e).code()),
        }
    }

    /// close() -> int: unmounts this client's segment (its objects leave the pool) and stops
    /// it. Buffers registered from Python objects are released. Closing twice is fine.
    fn close(&self, py: Python<'_>) -> i32 {
        crescent_ffi::clear_last_error();
        let Some(client) = self.client.write().take() else { return 0 };
        let r = py.detach(|| client.close());
        drop(client);
        self.pinned.lock().clear();
        match r {
            Ok(()) => 0,
            Err(e) => store_fail(&e).code(),
        }
    }

    /// get_hostname() -> str: this client's segment name (`host:port`), "" before setup.
    fn get_hostname(&self) -> String {
        self.client().map(|c| c.segment_name().to_string()).unwrap_or_default()
    }

    /// put(key, value, config=None) -> int: stores `value` (bytes or any buffer object) under
    /// `key`, placed as `config` (a `ReplicateConfig`) asks.
    #[pyo3(signature = (key, value, config=None))]
    fn put(
        &self,
        py: Python<'_>,
        key: &str,
        value: &Bound<'_, PyAny>,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> PyResult<i32> {
        crescent_ffi::clear_last_error();
        let value = Exported::new(value, false)?;
        let Some(client) = self.client() else { return Ok(not_set_up("put")) };
        let options = match put_options(&client, config.as_deref()) {
            Ok(o) => o,
            Err(status) => return Ok(status.code()),
        };
        let bytes = value.bytes();
        Ok(match py.detach(|| client.put_with(key, bytes, &options)) {
            Ok(()) => 0,
            Err(e) => store_fail(&e).code(),
        })
    }

    /// get(key) -> bytes: the value, or empty bytes if it is missing or the get failed.
    fn get<'py>(&self, py: Python<'py>, key: &str) -> Bound<'py, PyBytes> {
        crescent_ffi::clear_last_error();
        let Some(client) = self.client() else {
            not_set_up("get");
            return PyBytes::new(py, &[]);
        };
        match py.detach(|| client.get(key)) {
            Ok(v) => PyBytes::new(py, &v),
            Err(e) => {
                store_fail(&e);
                PyBytes::new(py, &[])
            }
        }
    }

    /// put_batch(keys, values, config=None) -> int: 0 if every put succeeded, else the first
    /// error code.
    #[pyo3(signature = (keys, values, config=None))]
    fn put_batch(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        values: &Bound<'_, PyAny>,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> PyResult<i32> {
        crescent_ffi::clear_last_error();
        let values: Vec<Exported> =
            values.try_iter()?.map(|v| v.and_then(|v| Exported::new(&v, false))).collect::<PyResult<_>>()?;
        if values.len() != keys.len() {
            return Err(PyValueError::new_err(format!("{} keys but {} values", keys.len(), values.len())));
        }
        let Some(client) = self.client() else { return Ok(not_set_up("put_batch")) };
        let options = match put_options(&client, config.as_deref()) {
            Ok(o) => o,
            Err(status) => return Ok(status.code()),
        };
        let slices: Vec<&[u8]> = values.iter().map(Exported::bytes).collect();
        Ok(match py.detach(|| client.put_batch_with(&keys, &slices, &options)) {
            Ok(rs) => rs.iter().find_map(|r| r.as_ref().err()).map_or(0, |e| store_fail(e).code()),
            Err(e) => store_fail(&e).code(),
        })
    }

    /// get_batch(keys) -> list[bytes]: one value per key, empty bytes where a get failed.
    fn get_batch<'py>(&self, py: Python<'py>, keys: Vec<String>) -> Vec<Bound<'py, PyBytes>> {
        crescent_ffi::clear_last_error();
        let Some(client) = self.client() else {
            not_set_up("get_batch");
            return keys.iter().map(|_| PyBytes::new(py, &[])).collect();
        };
        match py.detach(|| client.get_batch(&keys)) {
            Ok(rs) => rs
                .into_iter()
                .map(|r| match r {
                    Ok(v) => PyBytes::new(py, &v),
                    Err(e) => {
                        store_fail(&e);
                        PyBytes::new(py, &[])
                    }
                })
                .collect(),
            Err(e) => {
                store_fail(&e);
                keys.iter().map(|_| PyBytes::new(py, &[])).collect()
            }
        }
    }

    /// register_buffer(buffer_ptr, size=None) -> int: registers memory for the zero-copy
    /// calls — an int address with its size, or a buffer object (kept alive and unresizable
    /// until `unregister_buffer`). Register once and reuse.
    #[pyo3(signature = (buffer_ptr, size=None))]
    fn register_buffer(&self, py: Python<'_>, buffer_ptr: &Bound<'_, PyAny>, size: Option<u64>) -> PyResult<i32> {
        crescent_ffi::clear_last_error();
        let mem = Mem::new(buffer_ptr, false, "buffer_ptr")?;
        let len = mem.size(size, "buffer_ptr")?;
        let Some(client) = self.client() else { return Ok(not_set_up("register_buffer")) };
        let addr = mem.addr();
        Ok(match py.detach(|| client.register_buffer(addr, len)) {
            Ok(()) => {
                if let Mem::Buffer(b) = mem {
                    self.pinned.lock().insert(addr, b);
                }
                0
            }
            Err(e) => store_fail(&e).code(),
        })
    }

    /// unregister_buffer(buffer_ptr) -> int: the int address or the buffer object registered.
    fn unregister_buffer(&self, py: Python<'_>, buffer_ptr: &Bound<'_, PyAny>) -> PyResult<i32> {
        crescent_ffi::clear_last_error();
        let addr = Mem::new(buffer_ptr, false, "buffer_ptr")?.addr();
        let Some(client) = self.client() else { return Ok(not_set_up("unregister_buffer")) };
        Ok(match py.detach(|| client.unregister_buffer(addr)) {
            Ok(()) => {
                self.pinned.lock().remove(&addr);
                0
            }
            Err(e) => store_fail(&e).code(),
        })
    }

    /// put_from(key, buffer_ptr, size=None, config=None) -> int: zero-copy put from
    /// registered memory.
    #[pyo3(signature = (key, buffer_ptr, size=None, config=None))]
    fn put_from(
        &self,
        py: Python<'_>,
        key: &str,
        buffer_ptr: &Bound<'_, PyAny>,
        size: Option<u64>,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> PyResult<i32> {
        crescent_ffi::clear_last_error();
        let mem = Mem::new(buffer_ptr, false, "buffer_ptr")?;
        let len = mem.size(size, "buffer_ptr")?;
        let Some(client) = self.client() else { return Ok(not_set_up("put_from")) };
        let options = match put_options(&client, config.as_deref()) {
            Ok(o) => o,
            Err(status) => return Ok(status.code()),
        };
        let addr = mem.addr();
        Ok(match py.detach(|| client.put_from_with(key, addr, len, &options)) {
            Ok(()) => 0,
            Err(e) => store_fail(&e).code(),
        })
    }

    /// get_into(key, buffer_ptr, size=None) -> int: zero-copy get into registered memory;
    /// the bytes read, or a negative error code (-10 when the buffer is too small).
    #[pyo3(signature = (key, buffer_ptr, size=None))]
    fn get_into(&self, py: Python<'_>, key: &str, buffer_ptr: &Bound<'_, PyAny>, size: Option<u64>) -> PyResult<i64> {
        crescent_ffi::clear_last_error();
        let mem = Mem::new(buffer_ptr, true, "buffer_ptr")?;
        let len = mem.size(size, "buffer_ptr")?;
        let Some(client) = self.client() else { return Ok(not_set_up("get_into") as i64) };
        let addr = mem.addr();
        Ok(match py.detach(|| client.get_into(key, addr, len)) {
            Ok(n) => n as i64,
            Err(e) => store_fail(&e).code() as i64,
        })
    }

    /// batch_put_from(keys, buffer_ptrs, sizes=None, config=None) -> list[int]: zero-copy
    /// puts, one master round trip; a status per key.
    #[pyo3(signature = (keys, buffer_ptrs, sizes=None, config=None))]
    fn batch_put_from(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        buffer_ptrs: &Bound<'_, PyAny>,
        sizes: Option<Vec<u64>>,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> PyResult<Vec<i32>> {
        crescent_ffi::clear_last_error();
        let (mems, lens) = mems(buffer_ptrs, sizes, false, keys.len())?;
        let Some(client) = self.client() else {
            return Ok(vec![not_set_up("batch_put_from"); keys.len()]);
        };
        let options = match put_options(&client, config.as_deref()) {
            Ok(o) => o,
            Err(status) => return Ok(vec![status.code(); keys.len()]),
        };
        let addrs: Vec<u64> = mems.iter().map(Mem::addr).collect();
        Ok(match py.detach(|| client.batch_put_from_with(&keys, &addrs, &lens, &options)) {
            Ok(rs) => rs.iter().map(|r| r.as_ref().map_or_else(|e| store_fail(e).code(), |()| 0)).collect(),
            Err(e) => vec![store_fail(&e).code(); keys.len()],
        })
    }

    /// batch_get_into(keys, buffer_ptrs, sizes=None) -> list[int]: zero-copy gets, one master
    /// round trip and one engine batch; bytes read per key, or a negative error code.
    #[pyo3(signature = (keys, buffer_ptrs, sizes=None))]
    fn batch_get_into(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        buffer_ptrs: &Bound<'_, PyAny>,
        sizes: Option<Vec<u64>>,
    ) -> PyResult<Vec<i64>> {
        crescent_ffi::clear_last_error();
        let (mems, lens) = mems(buffer_ptrs, sizes, true, keys.len())?;
        let Some(client) = self.client() else {
            return Ok(vec![not_set_up("batch_get_into") as i64; keys.len()]);
        };
        let addrs: Vec<u64> = mems.iter().map(Mem::addr).collect();
        Ok(match py.detach(|| client.batch_get_into(&keys, &addrs, &lens)) {
            Ok(rs) => {
                rs.iter().map(|r| r.as_ref().map_or_else(|e| store_fail(e).code() as i64, |n| *n as i64)).collect()
            }
            Err(e) => vec![store_fail(&e).code() as i64; keys.len()],
        })
    }

    /// is_exist(key) -> int: 1 if the key exists, 0 if not, -1 on error. Grants no lease.
    fn is_exist(&self, py: Python<'_>, key: &str) -> i32 {
        crescent_ffi::clear_last_error();
        let Some(client) = self.client() else {
            not_set_up("is_exist");
            return -1;
        };
        match py.detach(|| client.exists(key)) {
            Ok(b) => i32::from(b),
            Err(e) => {
                store_fail(&e);
                -1
            }
        }
    }

    /// batch_is_exist(keys) -> list[int]: 1 / 0 per key, -1 for every key if the call failed.
    fn batch_is_exist(&self, py: Python<'_>, keys: Vec<String>) -> Vec<i32> {
        crescent_ffi::clear_last_error();
        let Some(client) = self.client() else {
            not_set_up("batch_is_exist");
            return vec![-1; keys.len()];
        };
        match py.detach(|| client.batch_exists(&keys)) {
            Ok(v) if v.len() == keys.len() => v.into_iter().map(i32::from).collect(),
            Ok(v) => {
                fail(Status::Internal, format!("{} answers for {} keys", v.len(), keys.len()));
                vec![-1; keys.len()]
            }
            Err(e) => {
                store_fail(&e);
                vec![-1; keys.len()]
            }
        }
    }

    /// get_size(key) -> int: the value's size in bytes, or a negative error code.
    fn get_size(&self, py: Python<'_>, key: &str) -> i64 {
        crescent_ffi::clear_last_error();
        let Some(client) = self.client() else { return not_set_up("get_size") as i64 };
        match py.detach(|| client.get_size(key)) {
            Ok(n) => n as i64,
            Err(e) => store_fail(&e).code() as i64,
        }
    }

    /// remove(key) -> int: 0, or a negative error code (-706 while a reader holds a lease).
    fn remove(&self, py: Python<'_>, key: &str) -> i32 {
        crescent_ffi::clear_last_error();
        let Some(client) = self.client() else { return not_set_up("remove") };
        match py.detach(|| client.remove(key)) {
            Ok(()) => 0,
            Err(e) => store_fail(&e).code(),
        }
    }

    /// remove_by_regex(regex) -> int: how many objects were removed, or a negative error code.
    fn remove_by_regex(&self, py: Python<'_>, regex: &str) -> i64 {
        crescent_ffi::clear_last_error();
        let Some(client) = self.client() else { return not_set_up("remove_by_regex") as i64 };
        match py.detach(|| client.remove_by_regex(regex)) {
            Ok(n) => n as i64,
            Err(e) => store_fail(&e).code() as i64,
        }
    }

    /// remove_all() -> int: how many objects were removed, or a negative error code.
    fn remove_all(&self, py: Python<'_>) -> i64 {
        crescent_ffi::clear_last_error();
        let Some(client) = self.client() else { return not_set_up("remove_all") as i64 };
        match py.detach(|| client.remove_all()) {
            Ok(n) => n as i64,
            Err(e) => store_fail(&e).code() as i64,
        }
    }

    /// setup_dummy(mem_pool_size, local_buffer_size, server_address) -> int: see `dummy.rs`.
    fn setup_dummy(&self, py: Python<'_>, mem_pool_size: u64, local_buffer_size: u64, server_address: String) -> i32 {
        dummy::setup_dummy(self, py, mem_pool_size, local_buffer_size, server_address)
    }

    /// init_all(protocol, device_name, mount_segment_size=16 MiB) -> int: see `dummy.rs`.
    #[pyo3(signature = (protocol, device_name, mount_segment_size=16 << 20))]
    fn init_all(
        &self,
        py: Python<'_>,
        protocol: String,
        device_name: String,
        mount_segment_size: u64,
    ) -> PyResult<i32> {
        dummy::init_all(self, py, protocol, device_name, mount_segment_size)
    }

    /// alloc_from_mem_pool(size) -> int: an address, or 0; see `dummy.rs`.
    fn alloc_from_mem_pool(&self, py: Python<'_>, size: u64) -> u64 {
        dummy::alloc_from_mem_pool(self, py, size)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __exit__(
        &self,
        py: Python<'_>,
        _exc_type: &Bound<'_, PyAny>,
        _exc: &Bound<'_, PyAny>,
        _tb: &Bound<'_, PyAny>,
    ) -> bool {
        self.close(py);
        false
    }
}

/// last_error() -> str: the message of this thread's last failed call ("" if it succeeded).
#[pyfunction]
fn last_error() -> String {
    crescent_ffi::last_error()
}

/// status_name(code) -> str: Mooncake's name of a status code ("OBJECT_NOT_FOUND", ...).
#[pyfunction]
fn status_name(code: i32) -> &'static str {
    Status::from_code(code).map_or("UNKNOWN", Status::name)
}

mod dummy;
mod engine;

#[pymodule]
fn _crescent(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Store>()?;
    m.add_class::<PyReplicateConfig>()?;
    engine::add_classes(m)?;
    m.add_function(wrap_pyfunction!(last_error, m)?)?;
    m.add_function(wrap_pyfunction!(status_name, m)?)?;
    for s in Status::ALL {
        m.add(s.name(), s.code())?;
    }
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
