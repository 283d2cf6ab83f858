//! `SharedSegment`: Mooncake's shared host segment of `mooncake.engine` (upstream
//! `shared_segment_py.cpp`) over `crescent_engine::shared_segment`, with upstream's static
//! methods, keywords and defaults; a failure raises `RuntimeError` with upstream's status text
//! (`"InvalidArgument: ..."`, `"NotImplemented: ..."`, `"Memory: ..."`).

use crescent_ffi::engine::shared_segment::{SegmentOptions, SharedSegment};
use crescent_ffi::engine::EngineError;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// Upstream's `Status::ToString()` of an error: its code's name, then the message.
fn status_error(e: EngineError) -> PyErr {
    let text = match &e {
        EngineError::InvalidArgument(m) => format!("InvalidArgument: {m}"),
        EngineError::Unsupported(m) => format!("NotImplemented: {m} is not supported by this build"),
        other => format!("Memory: {other}"),
    };
    PyRuntimeError::new_err(text)
}

/// One rank's share of a segment of host memory that the owner rank's process holds and every
/// rank maps: `create` on every rank, all-gather the blobs, then `complete(blobs)`.
#[pyclass(module = "crescent._crescent", name = "SharedSegment")]
pub(crate) struct PySharedSegment {
    inner: SharedSegment,
}

#[pymethods]
impl PySharedSegment {
    /// Phase one: returns `(segment, blob)`; the caller all-gathers the blobs (indexed by
    /// rank) and passes them to `complete`.
    #[staticmethod]
    #[pyo3(signature = (name, size, world_size, rank_id, owner_rank=0, device_id=0, mmap=true, host_register=false))]
    #[allow(clippy::too_many_arguments)]
    fn create<'py>(
        py: Python<'py>,
        name: &str,
        size: u64,
        world_size: u32,
        rank_id: u32,
        owner_rank: u32,
        device_id: i32,
        mmap: bool,
        host_register: bool,
    ) -> PyResult<(PySharedSegment, Bound<'py, PyBytes>)> {
        let options = SegmentOptions { world_size, rank_id, owner_rank, device_id, mmap, host_register };
        let (inner, blob) = py.detach(|| SharedSegment::create(name, size, options)).map_err(status_error)?;
        Ok((PySharedSegment { inner }, PyBytes::new(py, &blob)))
    }

    /// Whether this build can share memory across processes this way: POSIX shared memory
    /// (`mmap=True`) yes; the platform VMM path and Ascend registration no.
    #[staticmethod]
    #[pyo3(signature = (mmap=true, host_register=false))]
    fn supported(mmap: bool, host_register: bool) -> bool {
        SharedSegment::supported(mmap, host_register)
    }

    /// Phase two: checks that every rank declared the same segment and maps the owner's pages
    /// (on a non-owner). `blobs` are every rank's, indexed by rank.
    fn complete(&mut self, py: Python<'_>, blobs: Vec<Vec<u8>>) -> PyResult<()> {
        let inner = &mut self.inner;
        py.detach(|| inner.complete(blobs.as_slice())).map_err(status_error)
    }

    /// True once `complete` succeeded.
    fn ready(&self) -> bool {
        self.inner.ready()
    }

    /// This rank's address of the segment (valid for use once ready).
    fn base_addr(&self) -> u64 {
        self.inner.base_addr()
    }

    /// 0: no device mapping in this build.
    fn device_addr(&self) -> u64 {
        self.inner.device_addr()
    }

    /// The size asked for, in bytes.
    fn size(&self) -> u64 {
        self.inner.size()
    }
}

pub(crate) fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PySharedSegment>()
}
