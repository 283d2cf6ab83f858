//! `MooncakeDistributedStore`: Mooncake's store methods; those that are rows of
//! `crescent_ffi::methods` run through `Store::call` (see `call.rs`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crescent_ffi::engine::TransferEngine;
use crescent_ffi::methods::{mooncake as mc, Mem as OpMem};
use crescent_ffi::store::client::Buffer;
use crescent_ffi::store::{StoreApi, StoreClient};
use crescent_ffi::{fail, session_fail, store_fail, SetupArgs, Status};
use parking_lot::{Mutex, RwLock};
use pyo3::exceptions::{PyRuntimeError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::mem::*;
use crate::ranges::RangeLists;
use crate::sessions::*;
use crate::twins::pymethods_with_twins;
use crate::types::*;
use crate::{dummy, engine, invalid, not_set_up, per_key, status};

// ---- MooncakeDistributedStore ----

/// A client of the Crescent store with Mooncake's `MooncakeDistributedStore` interface.
///
/// Call `setup(...)` first. Status-returning methods give 0 (or a count / size) on success and
/// a negative Mooncake error code on failure; `crescent.last_error()` gives the message.
/// Memory for the zero-copy calls is an int address or a buffer object (bytearray,
/// memoryview, numpy array), registered once with `register_buffer`.
#[pyclass(module = "crescent._crescent", name = "MooncakeDistributedStore", subclass)]
pub(crate) struct Store {
    /// A full client (`setup`) or a dummy client (`setup_dummy`, see `dummy.rs`).
    pub(crate) client: RwLock<Option<Arc<dyn StoreApi>>>,
    /// Buffer objects registered by `register_buffer`, kept exported until unregistered.
    pub(crate) pinned: Mutex<HashMap<u64, Mem>>,
    /// `setup` was given `local_buffer_size` 0: the calls that move values through the local
    /// buffer (byte puts and gets) fail, as in Mooncake.
    pub(crate) no_local_buffer: AtomicBool,
}

/// The staging buffer a client set up with `local_buffer_size` 0 still has, for its own
/// internal copies (disk tier, warm-up); the calls that need a local buffer are refused.
pub(crate) const INTERNAL_STAGING: u64 = 1 << 20;

/// Mooncake's segment methods answer -1 for what the client checks itself (and before
/// setup); a failure at the master keeps its code.
fn segment_code(e: &crescent_ffi::store::StoreError) -> i32 {
    match e {
        crescent_ffi::store::StoreError::InvalidArgument(_) => {
            fail(Status::InvalidParams, e);
            -1
        }
        _ => store_fail(e).code(),
    }
}

/// The replicas of `key`; None with the failure recorded (missing, or the query failed).
fn replicas(client: &dyn StoreApi, key: &str) -> Option<Vec<PyReplicaDescriptor>> {
    match client.query(key) {
        Ok(q) if q.exists => Some(q.replicas.iter().map(replica_descriptor).collect()),
        Ok(_) => {
            fail(Status::ObjectNotFound, format!("object {key:?} not found"));
            None
        }
        Err(e) => {
            store_fail(&e);
            None
        }
    }
}

fn segment_unset(what: &str) -> i32 {
    not_set_up(what);
    -1
}

/// The dict the mounting methods answer: `{"ret": 0 or a code, "segment_ids": [...]}`, and
/// with `sized` (the segments the client allocated) `"allocated_size"`, 0 on a failure;
/// `mounted` is None before setup.
fn mounted_reply<'py>(
    py: Python<'py>,
    what: &str,
    mounted: Option<crescent_ffi::store::Result<(Vec<String>, u64)>>,
    sized: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let (ret, ids, allocated) = match mounted {
        None => (segment_unset(what), Vec::new(), 0),
        Some(Ok((ids, allocated))) => (0, ids, allocated),
        Some(Err(e)) => (segment_code(&e), Vec::new(), 0),
    };
    let out = PyDict::new(py);
    out.set_item("ret", ret)?;
    out.set_item("segment_ids", ids)?;
    if sized {
        out.set_item("allocated_size", allocated)?;
    }
    Ok(out)
}

impl Store {
    /// `unmount_segment` and `unmount_and_free_segment`: 0, or the first failure's code.
    fn unmount_segments(&self, what: &str, py: Python<'_>, ids: Vec<String>, free: bool, grace_s: u64) -> i32 {
        let Some(c) = self.client() else { return segment_unset(what) };
        let grace = std::time::Duration::from_secs(grace_s);
        let results = py.detach(|| c.unmount_segments(&ids, free, grace));
        results.iter().find_map(|r| r.as_ref().err()).map_or(0, segment_code)
    }

    /// Connects the client, on `shared` (an engine the caller runs) when given, else on an
    /// engine of its own.
    pub(crate) fn start(&self, py: Python<'_>, args: SetupArgs, shared: Option<Arc<TransferEngine>>) -> i32 {
        if self.client.read().is_some() {
            return invalid("setup: already set up; close() first");
        }
        let no_local_buffer = args.local_buffer_size == 0;
        let connected = py.detach(|| {
            let mut config = args.client_config()?;
            if no_local_buffer {
                config.local_buffer_size = INTERNAL_STAGING;
            }
            match shared {
                Some(engine) => StoreClient::connect_with_engine(config, engine),
                None => StoreClient::connect(config),
            }
        });
        match connected {
            Ok(client) => {
                let client: Arc<dyn StoreApi> = client;
                let mut slot = self.client.write();
                if slot.is_some() {
                    drop(slot);
                    let _ = py.detach(|| client.close());
                    return invalid("setup: already set up; close() first");
                }
                self.no_local_buffer.store(no_local_buffer, Ordering::Release);
                *slot = Some(client);
                0
            }
            Err(e) => store_fail(&e).code(),
        }
    }
}

/// A size in `setup`: an int (negative is INVALID_PARAMS) or a string such as "512MB".
pub(crate) fn setup_size(name: &str, v: &Bound<'_, PyAny>) -> PyResult<Result<u64, i32>> {
    if let Ok(s) = v.cast::<pyo3::types::PyString>() {
        let s = s.to_string();
        return Ok(crescent_ffi::engine::parse_size(&s).map_err(|e| invalid(format!("setup: {name}: {e}"))));
    }
    let n: i128 = v.extract().map_err(|_| PyTypeError::new_err(format!("setup: {name} must be an int")))?;
    Ok(u64::try_from(n).map_err(|_| invalid(format!("setup: {name} is {n}: it must be 0 or more"))))
}

/// Values of a setup dict as strings, as Mooncake's binding converts them (`str(value)`;
/// booleans as `true` / `false`).
pub(crate) fn dict_pairs(d: &Bound<'_, PyDict>) -> PyResult<Vec<(String, String)>> {
    let mut pairs = Vec::new();
    for (k, v) in d.iter() {
        let key: String = k.str()?.to_string();
        let value = if v.is_instance_of::<pyo3::types::PyBool>() {
            if v.is_truthy()? { "true" } else { "false" }.to_string()
        } else {
            v.str()?.to_string()
        };
        pairs.push((key, value));
    }
    Ok(pairs)
}

pymethods_with_twins! {
    #[pymethods]
    impl Store {
        #[new]
        #[pyo3(signature = (*_args, **_kwargs))]
        fn new(_args: &Bound<'_, pyo3::types::PyTuple>, _kwargs: Option<&Bound<'_, PyDict>>) -> Self {
            crescent_ffi::init_logging();
            Store {
                client: RwLock::new(None),
                pinned: Mutex::new(HashMap::new()),
                no_local_buffer: AtomicBool::new(false),
            }
        }

        /// setup(local_hostname, metadata_server, global_segment_size=16 MiB, local_buffer_size=16 MiB,
        ///       protocol="tcp", rdma_devices="", master_server_addr="127.0.0.1:50051", engine=None,
        ///       enable_ssd_offload=False, ssd_offload_path="", tenant_id="default",
        ///       enable_client_http_server=False, client_http_port=9300) -> int
        ///
        /// Also `setup(config: dict)` with Mooncake's keys (`local_hostname` and `metadata_server`
        /// required). Starts the client and mounts `global_segment_size` bytes (0: a pure
        /// consumer); `local_buffer_size` 0 leaves byte puts and gets failing, as in Mooncake.
        /// Without a port in `local_hostname`, one is picked in 12300–14300. `engine`: None (the
        /// store runs its own transfer engine) or an initialized `TransferEngine` (or its
        /// `get_engine()`) that the store then shares — its hostname, metadata and transports
        /// apply, and `local_hostname`, `metadata_server`, `protocol` and `rdma_devices` are not
        /// used (an engine not initialized: -600). Returns 0 or a negative code (e.g.
        /// -600 for bad arguments, -900 when the master is unreachable).
        #[pyo3(signature = (local_hostname, metadata_server=None, global_segment_size=None, local_buffer_size=None,
                            protocol="tcp".to_string(), rdma_devices=String::new(),
                            master_server_addr="127.0.0.1:50051".to_string(), engine=None, enable_ssd_offload=false,
                            ssd_offload_path=String::new(), tenant_id="default".to_string(),
                            enable_client_http_server=false, client_http_port=crescent_ffi::DEFAULT_CLIENT_HTTP_PORT))]
        #[allow(clippy::too_many_arguments)] // Mooncake's argument list
        fn setup(
            &self,
            py: Python<'_>,
            local_hostname: &Bound<'_, PyAny>,
            metadata_server: Option<String>,
            global_segment_size: Option<&Bound<'_, PyAny>>,
            local_buffer_size: Option<&Bound<'_, PyAny>>,
            protocol: String,
            rdma_devices: String,
            master_server_addr: String,
            engine: Option<&Bound<'_, PyAny>>,
            enable_ssd_offload: bool,
            ssd_offload_path: String,
            tenant_id: String,
            enable_client_http_server: bool,
            client_http_port: i64,
        ) -> PyResult<i32> {
            crescent_ffi::clear_last_error();
            if let Ok(d) = local_hostname.cast::<PyDict>() {
                let pairs = dict_pairs(d)?;
                return Ok(match SetupArgs::from_pairs(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str()))) {
                    Ok(args) => self.start(py, args, None),
                    Err(e) => store_fail(&e).code(),
                });
            }
            let local_hostname: String = local_hostname
                .extract()
                .map_err(|_| PyTypeError::new_err("setup: local_hostname must be str (or pass one dict)"))?;
            let metadata_server =
                metadata_server.ok_or_else(|| PyTypeError::new_err("setup() missing argument: metadata_server"))?;
            let shared = match engine.filter(|e| !e.is_none()) {
                None => None,
                Some(e) => match engine::shared_engine(e)? {
                    Some(shared) => Some(shared),
                    None => {
                        return Ok(invalid("setup: the engine given is not initialized; call its initialize() first"))
                    }
                },
            };
            let size = |name: &str, v: Option<&Bound<'_, PyAny>>, default: u64| match v {
                None => Ok(Ok(default)),
                Some(v) => setup_size(name, v),
            };
            let global_segment_size =
                match size("global_segment_size", global_segment_size, crescent_ffi::DEFAULT_GLOBAL_SEGMENT_SIZE)? {
                    Ok(n) => n,
                    Err(code) => return Ok(code),
                };
            let local_buffer_size =
                match size("local_buffer_size", local_buffer_size, crescent_ffi::DEFAULT_LOCAL_BUFFER_SIZE)? {
                    Ok(n) => n,
                    Err(code) => return Ok(code),
                };
            Ok(self.start(
                py,
                SetupArgs {
                    local_hostname,
                    metadata_server,
                    global_segment_size,
                    local_buffer_size,
                    protocol,
                    rdma_devices,
                    master_server_addr,
                    enable_ssd_offload,
                    ssd_offload_path,
                    tenant_id,
                    enable_client_http_server,
                    client_http_port,
                },
                shared,
            ))
        }

        /// setup_dummy(mem_pool_size, local_buffer_size, server_address) -> int: see `dummy.rs`.
        #[pyo3(signature = (mem_pool_size, local_buffer_size, server_address))]
        fn setup_dummy(
            &self, py: Python<'_>, mem_pool_size: u64, local_buffer_size: u64, server_address: String,
        ) -> i32 {
            dummy::setup_dummy(self, py, mem_pool_size, local_buffer_size, server_address)
        }

        /// init_all(protocol, device_name, mount_segment_size=16 MiB) -> int: see `dummy.rs`.
        #[pyo3(signature = (protocol, device_name, mount_segment_size=16 << 20))]
        fn init_all(&self, py: Python<'_>, protocol: String, device_name: String, mount_segment_size: u64) -> i32 {
            dummy::init_all(self, py, protocol, device_name, mount_segment_size)
        }

        /// alloc_from_mem_pool(size) -> int: an address, or 0; see `dummy.rs`.
        fn alloc_from_mem_pool(&self, py: Python<'_>, size: u64) -> u64 {
            dummy::alloc_from_mem_pool(self, py, size)
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

        /// health_check() -> int: 0 healthy, 1 not set up or closed, 2 the master unreachable at
        /// the last heartbeat (Mooncake's values).
        fn health_check(&self) -> i32 {
            match self.client() {
                None => 1,
                Some(c) if !c.master_reachable() => 2,
                Some(_) => 0,
            }
        }

        /// get_offload_rpc_read_count() -> int: how many values this client read from another
        /// client's disk through its disk service (0 before setup, and for a dummy client, as
        /// upstream).
        fn get_offload_rpc_read_count(&self) -> i64 {
            self.client().map_or(0, |c| c.remote_disk_reads() as i64)
        }

        /// get_hostname() -> str: this client's segment name (`host:port`), "" before setup.
        fn get_hostname(&self) -> String {
            self.client().map(|c| c.segment_name().to_string()).unwrap_or_default()
        }

        /// mount_segment(path, size, offset=0, protocol="tcp", location="") -> dict: maps
        /// `[offset, +size)` of the file at `path` (shared, read-write) and mounts it as another
        /// segment of this client: `{"ret": 0, "segment_ids": [id]}`, or `ret` -1 (an unreadable
        /// file, a range beyond it, an offset not page-aligned) and no ids; `size` 0 mounts nothing
        /// (`ret` 0, no ids), as Mooncake. `protocol` is the engine's, chosen at setup.
        #[pyo3(signature = (path, size, offset=0, protocol="tcp".to_string(), location=String::new()))]
        fn mount_segment<'py>(
            &self, py: Python<'py>, path: String, size: u64, offset: u64, protocol: String, location: String,
        ) -> PyResult<Bound<'py, PyDict>> {
            let _ = protocol;
            let path = std::path::Path::new(&path);
            let mounted = self.client().map(|c| py.detach(|| c.mount_segment(path, offset, size, &location)));
            mounted_reply(py, "mount_segment", mounted.map(|r| r.map(|ids| (ids, 0))), false)
        }

        /// allocate_and_mount_segment(size, protocol="tcp", location="") -> dict: allocates `size`
        /// bytes (rounded up to 4 MiB, as Mooncake's slabs) of host memory, registers and mounts
        /// them as another segment of this client: `{"ret": 0, "segment_ids": [id],
        /// "allocated_size": n}`, or `ret` -1 (size 0, no memory) with no ids and size 0.
        #[pyo3(signature = (size, protocol="tcp".to_string(), location=String::new()))]
        fn allocate_and_mount_segment<'py>(
            &self, py: Python<'py>, size: u64, protocol: String, location: String,
        ) -> PyResult<Bound<'py, PyDict>> {
            let _ = protocol;
            let mounted = self.client().map(|c| py.detach(|| c.allocate_and_mount_segment(size, &location)));
            mounted_reply(py, "allocate_and_mount_segment", mounted, true)
        }

        /// unmount_segment(segment_ids, grace_period_seconds=0) -> int: unmounts segments that
        /// `mount_segment` mounted; their objects lose those replicas (an object whose only replica
        /// was there is gone). 0, or the first failure's code (-1 for an id this client did not
        /// mount with `mount_segment`, or unmounted already). The mapping stays while reads granted
        /// before may still use it, and at least the grace period.
        #[pyo3(signature = (segment_ids, grace_period_seconds=0))]
        fn unmount_segment(&self, py: Python<'_>, segment_ids: Vec<String>, grace_period_seconds: u64) -> i32 {
            self.unmount_segments("unmount_segment", py, segment_ids, false, grace_period_seconds)
        }

        /// unmount_and_free_segment(segment_ids, grace_period_seconds=0) -> int: as
        /// `unmount_segment`, for segments `allocate_and_mount_segment` allocated; their memory is
        /// freed once no read granted before can use it (and the grace period passed).
        #[pyo3(signature = (segment_ids, grace_period_seconds=0))]
        fn unmount_and_free_segment(&self, py: Python<'_>, segment_ids: Vec<String>, grace_period_seconds: u64) -> i32 {
            self.unmount_segments("unmount_and_free_segment", py, segment_ids, true, grace_period_seconds)
        }

        /// unmount_local_disk_segment(grace_period_seconds=0) -> int: unmounts this client's disk
        /// tier at the master (its files no longer serve gets; objects whose only copy they were are
        /// gone), then waits the grace period. 0 also without a disk tier, as Mooncake.
        #[pyo3(signature = (grace_period_seconds=0))]
        fn unmount_local_disk_segment(&self, py: Python<'_>, grace_period_seconds: u64) -> i32 {
            let Some(c) = self.client() else { return segment_unset("unmount_local_disk_segment") };
            match py.detach(|| c.unmount_local_disk_segment(std::time::Duration::from_secs(grace_period_seconds))) {
                Ok(()) => 0,
                Err(e) => segment_code(&e),
            }
        }

        /// get(key) -> bytes: the value, or empty bytes if it is missing or the get failed.
        ///
        /// The value is read straight into the `bytes` object returned (made, not zeroed, once
        /// the master has given the size), with the GIL released during the transfer: no copy
        /// after the get (see [`BytesSink`]).
        fn get<'py>(&self, py: Python<'py>, key: &str) -> Bound<'py, PyBytes> {
            let key = [key.to_string()];
            self.get_bytes(py, &mc::GET, &key).pop().unwrap_or_else(|| PyBytes::new(py, &[]))
        }

        /// get_buffer(key) -> BufferHandle | None: the value as a buffer object (None if it is
        /// missing or the get failed).
        fn get_buffer(&self, py: Python<'_>, key: &str) -> Option<PyBufferHandle> {
            self.held(py, &mc::GET_BUFFER, &[key.to_string()]).pop().flatten()
        }

        /// batch_get_buffer(keys) -> list[BufferHandle | None]: one per key, None where the get
        /// failed.
        fn batch_get_buffer(&self, py: Python<'_>, keys: Vec<String>) -> Vec<Option<PyBufferHandle>> {
            self.held(py, &mc::BATCH_GET_BUFFER, &keys)
        }

        /// _batch_get_into_placed(keys, place) -> list[int]: whole values read into registered
        /// memory that `place(sizes)` gives once the sizes are known (one master round trip for
        /// all): `sizes[i]` is None where key `i` has no value, and `place` answers an address per
        /// key (None skips it). Per key, the value's size or a negative code. An exception `place`
        /// raises is raised. The sharded tensor reads' path (`crescent.tensor_parallel`).
        fn _batch_get_into_placed(
            &self, py: Python<'_>, keys: Vec<String>, place: Bound<'_, PyAny>,
        ) -> PyResult<Vec<i64>> {
            crescent_ffi::clear_last_error();
            let Some(client) = self.client() else {
                let code = not_set_up("_batch_get_into_placed") as i64;
                return Ok(vec![code; keys.len()]);
            };
            let place = place.unbind();
            let mut raised: Option<PyErr> = None;
            let result = py.detach(|| {
                client.batch_get_into_placed(&keys, &mut |sizes| {
                    Python::attach(|py| {
                        let placed = place.bind(py).call1((sizes.to_vec(),));
                        placed.and_then(|r| r.extract::<Vec<Option<u64>>>()).map_err(|e| {
                            let message = e.to_string();
                            raised = Some(e);
                            crescent_ffi::store::StoreError::invalid(message)
                        })
                    })
                })
            });
            if let Some(e) = raised {
                return Err(e);
            }
            Ok(match result {
                Ok(results) => {
                    results.into_iter().map(|r| r.map_or_else(|e| store_fail(&e).code() as i64, |n| n as i64)).collect()
                }
                Err(e) => vec![store_fail(&e).code() as i64; keys.len()],
            })
        }

        /// _local_buffer_size() -> int: the size of the local buffer `BufferPool` leases from; 0
        /// before setup, for a dummy client and after a setup with `local_buffer_size` 0.
        fn _local_buffer_size(&self) -> u64 {
            match self.client() {
                Some(client) if !self.no_local_buffer.load(Ordering::Acquire) => client.local_buffer_size(),
                _ => 0,
            }
        }

        /// _hold_local_buffer(size) -> BufferHandle | None: `size` bytes of the local buffer, held
        /// until the handle goes, or None while that much is not free in one piece (`BufferPool`'s
        /// leases). RuntimeError for a size of 0 or past the buffer, and without a local buffer.
        fn _hold_local_buffer(&self, py: Python<'_>, size: u64) -> PyResult<Option<PyBufferHandle>> {
            if self._local_buffer_size() == 0 {
                return Err(PyRuntimeError::new_err("BufferPool requires a store configured with a local buffer"));
            }
            let Some(client) = self.client() else {
                return Err(PyRuntimeError::new_err("MooncakeDistributedStore is not initialized"));
            };
            match py.detach(|| client.hold_local(size)) {
                Ok(block) => Ok(block.map(|block| PyBufferHandle { block })),
                Err(e) => Err(PyRuntimeError::new_err(e.to_string())),
            }
        }

        /// get_batch(keys) -> list[bytes]: one value per key, empty bytes where a get failed.
        fn get_batch<'py>(&self, py: Python<'py>, keys: Vec<String>) -> Vec<Bound<'py, PyBytes>> {
            self.get_bytes(py, &mc::GET_BATCH, &keys)
        }

        /// register_buffer(buffer_ptr, size=None) -> int: registers memory for the zero-copy
        /// calls — an int address with its size, or a buffer object (kept alive and unresizable
        /// until `unregister_buffer`). Register once and reuse.
        #[pyo3(signature = (buffer_ptr, size=None))]
        fn register_buffer(&self, py: Python<'_>, buffer_ptr: &Bound<'_, PyAny>, size: Option<u64>) -> PyResult<i32> {
            crescent_ffi::clear_last_error();
            let (mem, len) = match store_mem(buffer_ptr, size, false, "buffer_ptr")? {
                Ok(m) => m,
                Err(code) => return Ok(code),
            };
            let Some(client) = self.client() else { return Ok(not_set_up("register_buffer")) };
            let addr = mem.addr();
            // A tensor that says it is a GPU's memory must be: registered as such (a clear error
            // without a driver); an int address is told apart by the driver, as upstream's.
            let location = match &mem {
                Mem::Array(a) if a.on_device() => "cuda",
                _ => "*",
            };
            Ok(match py.detach(|| client.register_buffer_at(addr, len, location)) {
                Ok(()) => {
                    if mem.holds_object() {
                        self.pinned.lock().insert(addr, mem);
                    }
                    0
                }
                Err(e) => store_fail(&e).code(),
            })
        }

        /// unregister_buffer(buffer_ptr) -> int: the int address or the buffer object registered.
        fn unregister_buffer(&self, py: Python<'_>, buffer_ptr: &Bound<'_, PyAny>) -> PyResult<i32> {
            crescent_ffi::clear_last_error();
            let addr = Mem::any(buffer_ptr, false, "buffer_ptr")?.addr();
            let Some(client) = self.client() else { return Ok(not_set_up("unregister_buffer")) };
            Ok(match py.detach(|| client.unregister_buffer(addr)) {
                Ok(()) => {
                    self.pinned.lock().remove(&addr);
                    0
                }
                Err(e) => store_fail(&e).code(),
            })
        }

        /// put_from_with_metadata(key, buffer_ptr, metadata_buffer_ptr, size, metadata_size,
        /// config=None) -> int: stores the metadata's bytes followed by the data's, both from
        /// registered memory (size 0 stores nothing and returns 0, as in Mooncake).
        #[pyo3(signature = (key, buffer_ptr, metadata_buffer_ptr, size, metadata_size, config=None))]
        #[allow(clippy::too_many_arguments)] // Mooncake's argument list
        fn put_from_with_metadata(
            &self,
            py: Python<'_>,
            key: &str,
            buffer_ptr: &Bound<'_, PyAny>,
            metadata_buffer_ptr: &Bound<'_, PyAny>,
            size: u64,
            metadata_size: u64,
            config: Option<PyRef<'_, PyReplicateConfig>>,
        ) -> PyResult<i64> {
            let m = &mc::PUT_FROM_WITH_METADATA;
            let answer = self.call(py, m, |c| {
                let (data, size) = match store_mem(buffer_ptr, Some(size), false, "buffer_ptr")? {
                    Ok(x) => x,
                    Err(code) => return Ok(c.refused(1, code)),
                };
                let (meta, metadata_size) =
                    match store_mem(metadata_buffer_ptr, Some(metadata_size), false, "metadata_buffer_ptr")? {
                        Ok(x) => x,
                        Err(code) => return Ok(c.refused(1, code)),
                    };
                c.run(1, config.as_deref(), |client| {
                    if size == 0 {
                        tracing::warn!("put_from_with_metadata: empty data for key {key:?}; nothing stored");
                        return Ok(Err(Status::Ok));
                    }
                    for (what, addr, len) in
                        [("buffer_ptr", data.addr(), size), ("metadata_buffer_ptr", meta.addr(), metadata_size)]
                    {
                        if len > 0 && !client.is_registered(addr, len) {
                            return Ok(Err(status(invalid(format!(
                                "put_from_with_metadata: {what} [{addr:#x}, +{len}) is not registered memory: call register_buffer first"
                            )))));
                        }
                    }
                    // The two regions, metadata then data, as one value: a put from two pieces.
                    let buffers = [Buffer::host(meta.addr(), metadata_size), Buffer::host(data.addr(), size)]
                        .into_iter()
                        .filter(|b| b.len > 0)
                        .collect();
                    Ok(Ok(vec![Ok(c.op(key, OpMem::Buffers(buffers), false))]))
                })
            })?;
            Ok(answer.int(m))
        }

        /// get_into(key, buffer_ptr, size=None) -> int: zero-copy get into registered memory;
        /// the bytes read, or a negative error code (-10 when the buffer is too small).
        #[pyo3(signature = (key, buffer_ptr, size=None))]
        fn get_into(
            &self, py: Python<'_>, key: &str, buffer_ptr: &Bound<'_, PyAny>, size: Option<u64>,
        ) -> PyResult<i64> {
            let m = &mc::GET_INTO;
            Ok(self.call(py, m, |c| c.one_buffer(key, buffer_ptr, size, None))?.int(m))
        }

        /// batch_get_into(keys, buffer_ptrs, sizes=None) -> list[int]: zero-copy gets, one master
        /// round trip and one engine batch; bytes read per key, or a negative error code
        /// (INVALID_PARAMS for each when the lists' lengths differ).
        #[pyo3(signature = (keys, buffer_ptrs, sizes=None))]
        fn batch_get_into(
            &self,
            py: Python<'_>,
            keys: Vec<String>,
            buffer_ptrs: &Bound<'_, PyAny>,
            sizes: Option<Vec<u64>>,
        ) -> PyResult<Vec<i64>> {
            Ok(self.call(py, &mc::BATCH_GET_INTO, |c| c.buffer_each(&keys, buffer_ptrs, sizes, None))?.ints())
        }

        /// batch_put_from_multi_buffers(keys, all_buffer_ptrs, all_sizes, config=None) -> list[int]:
        /// zero-copy puts of values laid out in several buffers each (the value is the
        /// concatenation of its buffers, in order), one master round trip and one engine batch; a
        /// status per key. Lists of other lengths (of keys, of buffers and sizes, or of one key's
        /// buffers and sizes) are INVALID_PARAMS for every key, as in Mooncake; a key with memory
        /// that is not registered, or no bytes, is INVALID_PARAMS alone. Before setup: [].
        #[pyo3(signature = (keys, all_buffer_ptrs, all_sizes, config=None))]
        fn batch_put_from_multi_buffers(
            &self, py: Python<'_>, keys: Vec<String>, all_buffer_ptrs: &Bound<'_, PyAny>, all_sizes: Vec<Vec<u64>>,
            config: Option<PyRef<'_, PyReplicateConfig>>,
        ) -> PyResult<Vec<i64>> {
            let m = &mc::BATCH_PUT_FROM_MULTI_BUFFERS;
            Ok(self.call(py, m, |c| c.multi_buffers(&keys, all_buffer_ptrs, &all_sizes, config.as_deref()))?.ints())
        }

        /// batch_get_into_multi_buffers(keys, all_buffer_ptrs, all_sizes,
        /// prefer_alloc_in_same_node=False) -> list[int]: zero-copy gets of whole values into
        /// several buffers each (filled in order), one master round trip and one engine batch;
        /// bytes read per key, or a negative code: INVALID_PARAMS for every key when the lists'
        /// lengths differ, for one key whose buffers are too small for its value, not registered
        /// or not as many as its sizes. `prefer_alloc_in_same_node` is accepted (Mooncake's
        /// Ascend option) and changes nothing.
        #[pyo3(signature = (keys, all_buffer_ptrs, all_sizes, prefer_alloc_in_same_node=false))]
        fn batch_get_into_multi_buffers(
            &self, py: Python<'_>, keys: Vec<String>, all_buffer_ptrs: &Bound<'_, PyAny>, all_sizes: Vec<Vec<u64>>,
            prefer_alloc_in_same_node: bool,
        ) -> PyResult<Vec<i64>> {
            let _ = prefer_alloc_in_same_node;
            let m = &mc::BATCH_GET_INTO_MULTI_BUFFERS;
            Ok(self.call(py, m, |c| c.multi_buffers(&keys, all_buffer_ptrs, &all_sizes, None))?.ints())
        }

        /// get_into_ranges(buffer_ptrs, all_keys, all_dst_offsets, all_src_offsets, all_sizes)
        /// -> list[list[list[int]]]: ranges of values into registered buffers. For buffer `i`,
        /// key `all_keys[i][j]`, range `k`: `all_sizes[i][j][k]` bytes of the value from
        /// `all_src_offsets[i][j][k]` go to `buffer_ptrs[i] + all_dst_offsets[i][j][k]`; the
        /// result is the bytes read or a negative code for that range, in the same shape.
        /// INVALID_PARAMS where the lists' shapes differ, for a range past the end of its value
        /// or outside registered memory; a key's other failures (missing, transfer) for each of
        /// its ranges. All keys in one master round trip and one engine batch.
        fn get_into_ranges(
            &self,
            py: Python<'_>,
            buffer_ptrs: &Bound<'_, PyAny>,
            all_keys: Vec<Vec<String>>,
            all_dst_offsets: Vec<Vec<Vec<u64>>>,
            all_src_offsets: Vec<Vec<Vec<u64>>>,
            all_sizes: Vec<Vec<Vec<u64>>>,
        ) -> PyResult<Vec<Vec<Vec<i64>>>> {
            self.read_ranges(py, buffer_ptrs, RangeLists { all_keys, all_dst_offsets, all_src_offsets, all_sizes })
        }

        /// batch_get_session_start(keys) -> list[int]: starts a get session per key — its replicas
        /// asked once (one master round trip) and kept, with their read lease, for
        /// `batch_get_into_multi_buffer_ranges` — until `batch_get_session_end` or the lease's end.
        /// 0 per key, or a negative code: OBJECT_NOT_FOUND, INVALID_REPLICA (no replica in
        /// memory)... A key's previous session is replaced. Before setup: [].
        fn batch_get_session_start(&self, py: Python<'_>, keys: Vec<String>) -> Vec<i64> {
            self.with_client("batch_get_session_start", |client| {
                if keys.is_empty() {
                    return Vec::new();
                }
                session_codes(py.detach(|| client.batch_get_session_start(&keys)), keys.len(), |()| 0)
            })
        }

        /// batch_get_into_multi_buffer_ranges(keys, all_buffer_ptrs, all_sizes, all_src_offsets)
        /// -> list[int]: ranged gets on get sessions, without asking the master: for key `i`,
        /// `all_sizes[i][j]` bytes of the value from `all_src_offsets[i][j]` into registered
        /// buffer `all_buffer_ptrs[i][j]`; the remote reads of every key in one engine batch.
        /// Bytes read per key, or a negative code: INVALID_PARAMS for every key when the lists'
        /// lengths differ; for a key without a session (never started, ended), with lists of other
        /// lengths, a range past the value's end or memory not registered; LEASE_EXPIRED when the
        /// session's lease ended (the session ends with it). Before setup: [].
        fn batch_get_into_multi_buffer_ranges(
            &self, py: Python<'_>, keys: Vec<String>, all_buffer_ptrs: &Bound<'_, PyAny>, all_sizes: Vec<Vec<u64>>,
            all_src_offsets: Vec<Vec<u64>>,
        ) -> PyResult<Vec<i64>> {
            self.session_ranges(py, &keys, all_buffer_ptrs, &all_sizes, &all_src_offsets, true)
        }

        /// batch_get_session_end(keys) -> int: ends the get sessions of `keys` (keys without one
        /// are fine); 0. Before setup: -1, as Mooncake's binding answers.
        fn batch_get_session_end(&self, py: Python<'_>, keys: Vec<String>) -> i32 {
            crescent_ffi::clear_last_error();
            let Some(client) = self.client() else {
                let message = "batch_get_session_end: the store is not set up (call setup() first) or was closed";
                fail(Status::Internal, message);
                return Status::Internal.code();
            };
            py.detach(|| client.batch_get_session_end(&keys)).map_or_else(|e| session_fail(&e).code(), |()| 0)
        }

        /// batch_put_session_start(keys, sizes, config=None) -> list[int]: starts a put session
        /// per key — an object of `sizes[i]` bytes placed by the master (one round trip), written
        /// by `batch_put_from_multi_buffer_ranges`, then made readable by `batch_put_session_end`
        /// or given back by `batch_put_session_revoke`. 0 per key, or a negative code:
        /// INVALID_PARAMS for every key when the lists' lengths differ (or `config` is refused),
        /// for a key with an open session or size 0; OBJECT_ALREADY_EXISTS for a key that exists;
        /// NO_AVAILABLE_HANDLE without room. Before setup: [].
        #[pyo3(signature = (keys, sizes, config=None))]
        fn batch_put_session_start(
            &self,
            py: Python<'_>,
            keys: Vec<String>,
            sizes: Vec<u64>,
            config: Option<PyRef<'_, PyReplicateConfig>>,
        ) -> Vec<i64> {
            let what = "batch_put_session_start";
            self.with_client(what, |client| {
                let n = keys.len();
                if sizes.len() != n {
                    return per_key(n, invalid(format!("{what}: {n} keys but {} sizes", sizes.len())) as i64);
                }
                let options = match put_options(&*client, config.as_deref(), n) {
                    Ok(o) => o,
                    Err(code) => return per_key(n, code as i64),
                };
                if n == 0 {
                    return Vec::new();
                }
                session_codes(py.detach(|| client.batch_put_session_start(&keys, &sizes, &options)), n, |()| 0)
            })
        }

        /// batch_put_from_multi_buffer_ranges(keys, all_buffer_ptrs, all_sizes, all_dst_offsets)
        /// -> list[int]: ranged writes on put sessions, without asking the master: for key `i`,
        /// `all_sizes[i][j]` bytes from registered buffer `all_buffer_ptrs[i][j]` at
        /// `all_dst_offsets[i][j]` of the value, into every replica (the remote writes of every
        /// key in one engine batch). Bytes written per key, or a negative code: INVALID_PARAMS for
        /// every key when the lists' lengths differ; for a key without a session (never started,
        /// ended, being ended), with lists of other lengths, a range past the value's end, memory
        /// not registered, or past the master's put timeout. Before setup: [].
        fn batch_put_from_multi_buffer_ranges(
            &self, py: Python<'_>, keys: Vec<String>, all_buffer_ptrs: &Bound<'_, PyAny>, all_sizes: Vec<Vec<u64>>,
            all_dst_offsets: Vec<Vec<u64>>,
        ) -> PyResult<Vec<i64>> {
            self.session_ranges(py, &keys, all_buffer_ptrs, &all_sizes, &all_dst_offsets, false)
        }

        /// batch_put_session_end(keys) -> list[int]: commits the objects of the put sessions of
        /// `keys` (one master round trip; ranged writes in flight are waited for) and ends the
        /// sessions. 0 per key, or a negative code: INVALID_PARAMS without a session (never
        /// started, ended already); the master's answer otherwise (OBJECT_NOT_FOUND once it has
        /// dropped the placement), and then the session stays for another end or a revoke.
        /// Before setup: [].
        fn batch_put_session_end(&self, py: Python<'_>, keys: Vec<String>) -> Vec<i64> {
            self.with_client("batch_put_session_end", |client| {
                session_codes(py.detach(|| client.batch_put_session_end(&keys)), keys.len(), |()| 0)
            })
        }

        /// batch_put_session_revoke(keys) -> list[int]: gives back the space of the put sessions
        /// of `keys` (one master round trip; ranged writes in flight are waited for) and ends the
        /// sessions; nothing is stored. 0 per key (also when the master had dropped the placement),
        /// INVALID_PARAMS without a session, else the master's answer (the session stays).
        /// Before setup: [].
        fn batch_put_session_revoke(&self, py: Python<'_>, keys: Vec<String>) -> Vec<i64> {
            self.with_client("batch_put_session_revoke", |client| {
                session_codes(py.detach(|| client.batch_put_session_revoke(&keys)), keys.len(), |()| 0)
            })
        }

        /// batch_is_exist(keys) -> list[int]: 1 / 0 per key, a negative code for every key if the
        /// call failed.
        fn batch_is_exist(&self, py: Python<'_>, keys: Vec<String>) -> PyResult<Vec<i64>> {
            let m = &mc::BATCH_IS_EXIST;
            Ok(self.call(py, m, |c| c.keys(&keys, false))?.ints())
        }

        /// get_replica_desc(key) -> list[ReplicaDescriptor]: the key's replicas ([] if it is
        /// missing or the query failed). Grants no lease.
        fn get_replica_desc(&self, py: Python<'_>, key: &str) -> Vec<PyReplicaDescriptor> {
            self.with_client("get_replica_desc", |c| py.detach(|| replicas(&*c, key)).unwrap_or_default())
        }

        /// batch_get_replica_desc(keys) -> dict[str, list[ReplicaDescriptor]]: the replicas of
        /// each key that exists (missing keys are left out, as in Mooncake).
        fn batch_get_replica_desc(
            &self, py: Python<'_>, keys: Vec<String>,
        ) -> HashMap<String, Vec<PyReplicaDescriptor>> {
            self.with_client("batch_get_replica_desc", |c| {
                py.detach(|| keys.iter().filter_map(|k| Some((k.clone(), replicas(&*c, k)?))).collect())
            })
        }

        /// batch_replica_clear(keys, segment_name="") -> list[str]: of `keys`, the objects this
        /// client put whose read leases are over lose their replicas on `segment_name` (with "",
        /// they go); returns the keys cleared ([] on an error).
        #[pyo3(signature = (keys, segment_name=String::new()))]
        fn batch_replica_clear(&self, py: Python<'_>, keys: Vec<String>, segment_name: String) -> Vec<String> {
            self.detached(py, |c| crate::tasks::cleared(c, &keys, &segment_name))
        }

        /// create_copy_task(key, targets) -> tuple[tuple[int, int], int]: (the task's id, 0), or
        /// ((0, 0), a negative code). The owner of a replica copies it to each target segment.
        fn create_copy_task(&self, py: Python<'_>, key: String, targets: Vec<String>) -> ((u64, u64), i32) {
            self.detached(py, |c| crate::tasks::created("create_copy_task", c, |c| c.create_copy_task(&key, &targets)))
        }

        /// create_move_task(key, source, target) -> tuple[tuple[int, int], int]: (the task's id, 0),
        /// or ((0, 0), a negative code). The owner of `source` copies its replica to `target`,
        /// then the source replica goes.
        fn create_move_task(&self, py: Python<'_>, key: String, source: String, target: String) -> ((u64, u64), i32) {
            let create = |c: &dyn StoreApi| c.create_move_task(&key, &source, &target);
            self.detached(py, |c| crate::tasks::created("create_move_task", c, create))
        }

        /// query_task(task_id) -> tuple[QueryTaskResponse | None, int]: the task's state and 0, or
        /// (None, a negative code: TASK_NOT_FOUND for an id the master does not know).
        fn query_task(&self, py: Python<'_>, task_id: (u64, u64)) -> (Option<crate::tasks::PyQueryTaskResponse>, i32) {
            self.detached(py, |c| crate::tasks::queried(c, task_id))
        }

        /// remove(key, force=False) -> int: 0, or a negative error code (-706 while a reader
        /// holds a lease, unless `force`).
        #[pyo3(signature = (key, force=false))]
        fn remove(&self, py: Python<'_>, key: &str, force: bool) -> PyResult<i64> {
            let m = &mc::REMOVE;
            Ok(self.call(py, m, |c| c.keys(&[key.to_string()], force))?.int(m))
        }

        /// batch_remove(keys, force=False) -> list[int]: a status per key, as `remove`.
        #[pyo3(signature = (keys, force=false))]
        fn batch_remove(&self, py: Python<'_>, keys: Vec<String>, force: bool) -> PyResult<Vec<i64>> {
            let m = &mc::BATCH_REMOVE;
            Ok(self.call(py, m, |c| c.keys(&keys, force))?.ints())
        }

        /// remove_by_regex(regex_pattern, force=False) -> int: how many objects were removed, or
        /// a negative error code.
        #[pyo3(signature = (regex_pattern, force=false))]
        fn remove_by_regex(&self, py: Python<'_>, regex_pattern: &str, force: bool) -> PyResult<i64> {
            let m = &mc::REMOVE_BY_REGEX;
            Ok(self.call(py, m, |c| c.keys(&[regex_pattern.to_string()], force))?.int(m))
        }

        /// remove_all(force=False) -> int: how many objects were removed, or a negative error
        /// code.
        #[pyo3(signature = (force=false))]
        fn remove_all(&self, py: Python<'_>, force: bool) -> PyResult<i64> {
            let m = &mc::REMOVE_ALL;
            Ok(self.call(py, m, |c| c.keys(&[String::new()], force))?.int(m))
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

    /// put(key, value, config=None) -> int: stores `value` (bytes or any buffer object) under
    /// `key`, placed as `config` (a `ReplicateConfig`) asks. A key that exists keeps its value
    /// and the put returns 0, as in Mooncake (`upsert` replaces).
    fn put = &mc::PUT_BYTES;
    /// upsert(key, value, config=None) -> int: stores `value`, replacing the key's value if it
    /// has one. OBJECT_HAS_LEASE while a reader holds a lease on the old value.
    fn upsert = &mc::UPSERT_BYTES;
    with m #[pyo3(signature = (key, value, config=None))]
    fn (&self, py: Python<'_>, key: &str, value: &Bound<'_, PyAny>,
        config: Option<PyRef<'_, PyReplicateConfig>>) -> PyResult<i64> {
        Ok(self.call(py, m, |c| c.bytes(key, value, config.as_deref()))?.int(m))
    }

    /// put_batch(keys, values, config=None) -> int: 0 if every put succeeded, else the first
    /// error code (INVALID_PARAMS for lists of different lengths).
    fn put_batch = &mc::PUT_BATCH;
    /// upsert_batch(keys, values, config=None) -> int: `upsert` of each; 0 or the first error.
    fn upsert_batch = &mc::UPSERT_BATCH;
    with m #[pyo3(signature = (keys, values, config=None))]
    fn (&self, py: Python<'_>, keys: Vec<String>, values: &Bound<'_, PyAny>,
        config: Option<PyRef<'_, PyReplicateConfig>>) -> PyResult<i64> {
        Ok(self.call(py, m, |c| c.bytes_each(&keys, values, config.as_deref()))?.int(m))
    }

    /// put_from(key, buffer_ptr, size=None, config=None) -> int: zero-copy put from
    /// registered memory (size 0 stores nothing and returns 0, as in Mooncake).
    fn put_from = &mc::PUT_FROM;
    /// upsert_from(key, buffer_ptr, size=None, config=None) -> int: `upsert` from registered
    /// memory.
    fn upsert_from = &mc::UPSERT_FROM;
    with m #[pyo3(signature = (key, buffer_ptr, size=None, config=None))]
    fn (&self, py: Python<'_>, key: &str, buffer_ptr: &Bound<'_, PyAny>, size: Option<u64>,
        config: Option<PyRef<'_, PyReplicateConfig>>) -> PyResult<i64> {
        Ok(self.call(py, m, |c| c.one_buffer(key, buffer_ptr, size, config.as_deref()))?.int(m))
    }

    /// batch_put_from(keys, buffer_ptrs, sizes=None, config=None) -> list[int]: zero-copy
    /// puts, one master round trip; a status per key (INVALID_PARAMS for each when the lists'
    /// lengths differ).
    fn batch_put_from = &mc::BATCH_PUT_FROM;
    /// batch_upsert_from(keys, buffer_ptrs, sizes=None, config=None) -> list[int]: `upsert`
    /// of each from registered memory; a status per key.
    fn batch_upsert_from = &mc::BATCH_UPSERT_FROM;
    with m #[pyo3(signature = (keys, buffer_ptrs, sizes=None, config=None))]
    fn (&self, py: Python<'_>, keys: Vec<String>, buffer_ptrs: &Bound<'_, PyAny>, sizes: Option<Vec<u64>>,
        config: Option<PyRef<'_, PyReplicateConfig>>) -> PyResult<Vec<i64>> {
        Ok(self.call(py, m, |c| c.buffer_each(&keys, buffer_ptrs, sizes, config.as_deref()))?.ints())
    }

    /// put_parts(key, *parts, config=None) -> int: puts the concatenation of `parts`
    /// (buffer objects: bytes, bytearray, memoryview, numpy arrays) as one value, copied once
    /// as a byte put copies it; 0 or a negative code (no bytes at all: 0, nothing stored, as
    /// in Mooncake). A put of an existing key keeps its value and returns 0.
    fn put_parts = &mc::PUT_PARTS;
    /// upsert_parts(key, *parts, config=None) -> int: `put_parts` that replaces the key's
    /// value if it has one.
    fn upsert_parts = &mc::UPSERT_PARTS;
    with m #[pyo3(signature = (key, *parts, config=None))]
    fn (&self, py: Python<'_>, key: &str, parts: &Bound<'_, pyo3::types::PyTuple>,
        config: Option<PyRef<'_, PyReplicateConfig>>) -> PyResult<i64> {
        Ok(self.call(py, m, |c| c.parts(key, parts, config.as_deref()))?.int(m))
    }

    /// is_exist(key) -> int: 1 if the key exists, 0 if not, a negative code on error. Grants
    /// no lease.
    fn is_exist = &mc::IS_EXIST;
    /// get_size(key) -> int: the value's size in bytes, or a negative error code.
    fn get_size = &mc::GET_SIZE;
    with m #[pyo3(signature = (key))]
    fn (&self, py: Python<'_>, key: &str) -> PyResult<i64> {
        Ok(self.call(py, m, |c| c.keys(&[key.to_string()], false))?.int(m))
    }
}
