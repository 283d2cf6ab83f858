//! The small Python types of the store: replica descriptors, `BufferHandle` and
//! `ReplicateConfig` (Mooncake's enums are in `enums.rs`).

use crescent_ffi::store::proto::PutOptions;
use crescent_ffi::store::{HeldBuffer, StoreApi};
use crescent_ffi::{store_fail, SoftPinAction};
use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::prelude::*;

use crate::enums::{PyObjectDataType, PyReplicaStatus, PySoftPinAction};
use crate::invalid;

// ---- descriptor types ----

impl From<PySoftPinAction> for SoftPinAction {
    fn from(a: PySoftPinAction) -> Self {
        match a {
            PySoftPinAction::PRESERVE => SoftPinAction::Preserve,
            PySoftPinAction::ENABLE => SoftPinAction::Enable,
            PySoftPinAction::DISABLE => SoftPinAction::Disable,
        }
    }
}

/// Descriptor: where a memory replica's bytes are — `size`, `buffer_address` (in its
/// segment) and `transport_endpoint` (the segment's name, `host:port`).
#[pyclass(module = "crescent._crescent", name = "Descriptor", get_all, set_all, from_py_object)]
#[derive(Clone, Default)]
pub(crate) struct PyBufferDescriptor {
    size: u64,
    buffer_address: u64,
    transport_endpoint: String,
}

#[pymethods]
impl PyBufferDescriptor {
    #[new]
    fn new() -> Self {
        Self::default()
    }

    fn __repr__(&self) -> String {
        format!(
            "<Descriptor size={} buffer_address={} transport_endpoint={}>",
            self.size, self.buffer_address, self.transport_endpoint
        )
    }
}

/// MemoryDescriptor: `buffer_descriptor`, the memory replica's place.
#[pyclass(module = "crescent._crescent", name = "MemoryDescriptor", get_all, set_all, from_py_object)]
#[derive(Clone)]
pub(crate) struct PyMemoryDescriptor {
    buffer_descriptor: PyBufferDescriptor,
}

/// DiskDescriptor: a disk replica's `file_path` and `object_size`.
#[pyclass(module = "crescent._crescent", name = "DiskDescriptor", get_all, set_all, from_py_object)]
#[derive(Clone)]
pub(crate) struct PyDiskDescriptor {
    file_path: String,
    object_size: u64,
}

/// ReplicaDescriptor: one replica of an object, as `get_replica_desc` lists them. Crescent's
/// disk replicas live on their owner's disk and are read through it: Mooncake's "local disk"
/// kind (`is_local_disk_replica()`), not a shared-file-system path (`is_disk_replica()`).
#[pyclass(module = "crescent._crescent", name = "ReplicaDescriptor", frozen)]
pub(crate) struct PyReplicaDescriptor {
    status: PyReplicaStatus,
    memory: Option<PyMemoryDescriptor>,
    /// The owning client's disk service, for a disk replica.
    disk_service: String,
}

#[pymethods]
impl PyReplicaDescriptor {
    #[getter]
    fn status(&self) -> PyReplicaStatus {
        self.status
    }

    fn is_memory_replica(&self) -> bool {
        self.memory.is_some()
    }

    fn is_disk_replica(&self) -> bool {
        false
    }

    fn is_local_disk_replica(&self) -> bool {
        self.memory.is_none()
    }

    fn get_memory_descriptor(&self) -> PyResult<PyMemoryDescriptor> {
        self.memory.clone().ok_or_else(|| PyValueError::new_err("not a memory replica (is_memory_replica() is False)"))
    }

    fn get_disk_descriptor(&self) -> PyResult<PyDiskDescriptor> {
        Err(PyValueError::new_err(format!(
            "not a shared-disk replica: Crescent's disk replicas are read through their owner ({})",
            self.disk_service
        )))
    }

    fn __repr__(&self) -> String {
        match &self.memory {
            Some(m) => format!(
                "<ReplicaDescriptor memory size={} at {}>",
                m.buffer_descriptor.size, m.buffer_descriptor.transport_endpoint
            ),
            None => format!("<ReplicaDescriptor local disk via {}>", self.disk_service),
        }
    }
}

pub(crate) fn replica_descriptor(r: &crescent_ffi::store::proto::ReplicaDescriptor) -> PyReplicaDescriptor {
    use crescent_ffi::store::proto::{ReplicaStatus as S, Tier};
    let status = match S::try_from(r.status) {
        Ok(S::Complete) => PyReplicaStatus::COMPLETE,
        Ok(S::Processing) => PyReplicaStatus::PROCESSING,
        _ => PyReplicaStatus::UNDEFINED,
    };
    let memory = (r.tier != Tier::Ssd as i32).then(|| PyMemoryDescriptor {
        buffer_descriptor: PyBufferDescriptor {
            size: r.size,
            buffer_address: r.address,
            // The engine's segment (a client's extra segment is `host:port#<id>` at the master).
            transport_endpoint: crescent_ffi::store::protocol::engine_segment(&r.segment_name).to_string(),
        },
    });
    PyReplicaDescriptor { status, memory, disk_service: r.disk_service.clone() }
}

/// BufferHandle: a value read by `get_buffer` / `batch_get_buffer` into the client's local
/// buffer (registered memory: one copy from wherever the value lay, none after), held until
/// the handle and every view of it are gone. The buffer protocol (`memoryview(handle)`,
/// `numpy.frombuffer(handle, ...)`, `torch.frombuffer`) exposes those very bytes, writable as
/// in Mooncake; `ptr()` is their address (usable by the zero-copy calls as it is) and
/// `size()` their length.
#[pyclass(module = "crescent._crescent", name = "BufferHandle", frozen)]
pub(crate) struct PyBufferHandle {
    pub(crate) block: HeldBuffer,
}

#[pymethods]
impl PyBufferHandle {
    /// The address of the bytes (valid while the handle lives).
    fn ptr(&self) -> u64 {
        self.block.addr()
    }

    fn size(&self) -> usize {
        self.block.len() as usize
    }

    fn __len__(&self) -> usize {
        self.block.len() as usize
    }

    /// # Safety
    /// Called by the interpreter with a valid `view`; the handle is frozen and holds its block
    /// of the local buffer, which outlives the view (it holds a reference to the handle).
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut pyo3::ffi::Py_buffer,
        flags: std::ffi::c_int,
    ) -> PyResult<()> {
        if view.is_null() {
            return Err(PyBufferError::new_err("a null view"));
        }
        let block = &slf.get().block;
        // SAFETY: `view` is valid per the interpreter's contract; the block belongs to this
        // handle alone (no get or put of the client touches it while held), and the frozen
        // handle, kept alive by the view through `obj`, keeps it.
        unsafe {
            (*view).obj = slf.clone().into_any().into_ptr();
            (*view).buf = block.addr() as *mut std::ffi::c_void;
            (*view).len = block.len() as isize;
            (*view).readonly = 0;
            (*view).itemsize = 1;
            (*view).format = if flags & pyo3::ffi::PyBUF_FORMAT == pyo3::ffi::PyBUF_FORMAT {
                c"B".as_ptr() as *mut std::ffi::c_char
            } else {
                std::ptr::null_mut()
            };
            (*view).ndim = 1;
            (*view).shape = if flags & pyo3::ffi::PyBUF_ND == pyo3::ffi::PyBUF_ND {
                &mut (*view).len
            } else {
                std::ptr::null_mut()
            };
            (*view).strides = if flags & pyo3::ffi::PyBUF_STRIDES == pyo3::ffi::PyBUF_STRIDES {
                &mut (*view).itemsize
            } else {
                std::ptr::null_mut()
            };
            (*view).suboffsets = std::ptr::null_mut();
            (*view).internal = std::ptr::null_mut();
        }
        Ok(())
    }

    fn __repr__(&self) -> String {
        format!("<BufferHandle size={}>", self.block.len())
    }
}

// ---- ReplicateConfig ----

/// ReplicateConfig(): Mooncake's per-put placement — `replica_num` (1); `soft_pin_action`
/// (`SoftPinAction.PRESERVE`; `ENABLE` keeps the object from eviction for `soft_pin_ttl_ms`,
/// or the master's soft-pin time, 30 min, when that is None); `with_hard_pin` (False: True
/// never evicts it); `preferred_segment` ("") and `preferred_segments` ([]): segment names
/// (`get_hostname()` of a client) tried first for the replicas, in order; a full or unknown
/// one falls back to the master's choice. `with_soft_pin` is Crescent's older spelling of
/// `soft_pin_action = ENABLE`. `nof_replica_num`, `dfs_replica_num` (0: Crescent has no
/// NVMe-oF or DFS pool), `prefer_alloc_in_same_node` (refused by puts, as in Mooncake),
/// `preferred_nof_segments`, `data_type` and `group_ids` are accepted for compatibility.
#[pyclass(module = "crescent._crescent", name = "ReplicateConfig")]
#[derive(Clone)]
pub(crate) struct PyReplicateConfig {
    #[pyo3(get, set)]
    replica_num: u32,
    #[pyo3(get, set)]
    nof_replica_num: u32,
    #[pyo3(get, set)]
    dfs_replica_num: u32,
    #[pyo3(get, set)]
    soft_pin_action: PySoftPinAction,
    soft_pin_ttl_ms: Option<u64>,
    #[pyo3(get, set)]
    with_hard_pin: bool,
    #[pyo3(get, set)]
    preferred_segment: String,
    #[pyo3(get, set)]
    preferred_segments: Vec<String>,
    #[pyo3(get, set)]
    preferred_nof_segments: Vec<String>,
    #[pyo3(get, set)]
    prefer_alloc_in_same_node: bool,
    #[pyo3(get, set)]
    data_type: PyObjectDataType,
    #[pyo3(get, set)]
    group_ids: Option<Vec<String>>,
}

#[pymethods]
impl PyReplicateConfig {
    #[new]
    fn new() -> Self {
        let d = crescent_ffi::ReplicateConfig::default();
        PyReplicateConfig {
            replica_num: d.replica_num,
            nof_replica_num: d.nof_replica_num,
            dfs_replica_num: d.dfs_replica_num,
            soft_pin_action: PySoftPinAction::PRESERVE,
            soft_pin_ttl_ms: d.soft_pin_ttl_ms,
            with_hard_pin: d.with_hard_pin,
            preferred_segment: d.preferred_segment,
            preferred_segments: d.preferred_segments,
            preferred_nof_segments: Vec::new(),
            prefer_alloc_in_same_node: d.prefer_alloc_in_same_node,
            data_type: PyObjectDataType::UNKNOWN,
            group_ids: None,
        }
    }

    /// None (the master's default time) or a number of milliseconds (0 to 2**64-1).
    #[getter]
    fn soft_pin_ttl_ms(&self) -> Option<u64> {
        self.soft_pin_ttl_ms
    }

    #[setter]
    fn set_soft_pin_ttl_ms(&mut self, value: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        self.soft_pin_ttl_ms = match value {
            None => None,
            Some(v) if v.is_none() => None,
            Some(v) => Some(
                v.extract::<u64>()
                    .map_err(|_| PyTypeError::new_err("soft_pin_ttl_ms must be None or an int from 0 to 2**64-1"))?,
            ),
        };
        Ok(())
    }

    /// Crescent's older spelling: True is `soft_pin_action == SoftPinAction.ENABLE`.
    #[getter]
    fn with_soft_pin(&self) -> bool {
        self.soft_pin_action == PySoftPinAction::ENABLE
    }

    #[setter]
    fn set_with_soft_pin(&mut self, value: bool) {
        self.soft_pin_action = if value { PySoftPinAction::ENABLE } else { PySoftPinAction::PRESERVE };
    }

    fn __str__(&self) -> String {
        self.__repr__()
    }

    fn __repr__(&self) -> String {
        let py_bool = |b: bool| if b { "True" } else { "False" };
        let action = match self.soft_pin_action {
            PySoftPinAction::PRESERVE => "PRESERVE",
            PySoftPinAction::ENABLE => "ENABLE",
            PySoftPinAction::DISABLE => "DISABLE",
        };
        format!(
            "ReplicateConfig(replica_num={}, soft_pin_action={action}, soft_pin_ttl_ms={}, with_hard_pin={}, \
             preferred_segment={:?}, preferred_segments={:?}, prefer_alloc_in_same_node={})",
            self.replica_num,
            self.soft_pin_ttl_ms.map_or("None".to_string(), |t| t.to_string()),
            py_bool(self.with_hard_pin),
            self.preferred_segment,
            self.preferred_segments,
            py_bool(self.prefer_alloc_in_same_node),
        )
    }
}

impl PyReplicateConfig {
    pub(crate) fn common(&self) -> crescent_ffi::ReplicateConfig {
        crescent_ffi::ReplicateConfig {
            replica_num: self.replica_num,
            nof_replica_num: self.nof_replica_num,
            dfs_replica_num: self.dfs_replica_num,
            soft_pin_action: self.soft_pin_action.into(),
            soft_pin_ttl_ms: self.soft_pin_ttl_ms,
            with_hard_pin: self.with_hard_pin,
            preferred_segment: self.preferred_segment.clone(),
            preferred_segments: self.preferred_segments.clone(),
            prefer_alloc_in_same_node: self.prefer_alloc_in_same_node,
        }
    }
}

/// The put options of `config` for `client` (Mooncake's default `ReplicateConfig` when none
/// is given), checked for a batch of `keys` keys (`group_ids`, when set, has one per key).
pub(crate) fn put_options(
    client: &dyn StoreApi,
    config: Option<&PyReplicateConfig>,
    keys: usize,
) -> Result<PutOptions, i32> {
    let c = config.map_or_else(crescent_ffi::ReplicateConfig::default, PyReplicateConfig::common);
    if let Some(groups) = config.and_then(|c| c.group_ids.as_ref()) {
        if groups.len() != keys {
            return Err(invalid(format!("group_ids has {} entries for {keys} keys", groups.len())));
        }
    }
    c.put_options(client).map_err(|e| store_fail(&e).code())
}
