//! The native module `crescent._crescent` behind the Python package `crescent`: Mooncake's
//! `MooncakeDistributedStore` and `TransferEngine` with their method names, argument order and
//! return conventions, over `crescent-store` and `crescent-engine`.
//!
//! Conventions (documented for users in docs/src/ffi.md and the `.pyi` stubs):
//! * methods that return a status in Mooncake return one here: 0 or a count/size for success,
//!   a negative Mooncake error code otherwise; `crescent.last_error()` gives the message;
//! * `get` returns `bytes` (empty on failure), `is_exist` 1/0 or a negative code;
//! * the store answers what Mooncake's store binding answers with a code with that code
//!   (`INVALID_PARAMS` before setup, for lists of different lengths — one per key — and sizes
//!   larger than a given buffer); wrong types raise `TypeError` / `BufferError`. The engine
//!   raises `ValueError` for sizes and lengths that do not fit;
//! * memory can be given as an int address (Mooncake's way) or as any object with the buffer
//!   protocol (bytearray, memoryview, numpy array...): no copy either way;
//! * the GIL is released during master calls and transfers, so other Python threads run.

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crescent_ffi::engine::TransferEngine;
use crescent_ffi::store::client::{Extent, Piece};
use crescent_ffi::store::proto::PutOptions;
use crescent_ffi::store::{HeldBuffer, StoreApi, StoreClient, StoreError, ValueSink};
use crescent_ffi::{fail, session_fail, store_fail, SetupArgs, SoftPinAction, Status};
use parking_lot::{Mutex, RwLock};
use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

// ---- values handed out to Python ----

/// A get's `bytes` object, made once the value's size is known and written by the get while
/// the GIL is released. Nothing in Python can reach the object until the get returns it
/// (`get` returns it only after a get that succeeded), so writing the bytes of an immutable
/// `bytes` object is safe here: CPython's `PyBytes_FromStringAndSize(NULL, n)` is made for
/// exactly this. pyo3's `PyBytes::new_with` is not used: it zeroes the buffer before handing
/// it over (`write_bytes(buffer, 0, len)` in pyo3 0.30's `types/bytes.rs`), a pass over the
/// value that faults its fresh pages in on the calling thread, which the get exists to avoid.
#[derive(Default)]
struct BytesSink {
    /// The object with its buffer's first byte and length.
    made: Option<(Py<PyBytes>, *mut u8, usize)>,
}

// SAFETY: the pointer is the buffer of the `bytes` object held beside it, which lives as long
// as the sink; nothing else can reach the object while the sink has it (see above), so the
// one thread that holds the sink is the only one that touches those bytes.
unsafe impl Send for BytesSink {}

impl ValueSink for BytesSink {
    fn buffer(&mut self, size: u64) -> crescent_ffi::store::Result<&mut [MaybeUninit<u8>]> {
        let fits = matches!(&self.made, Some((_, _, len)) if *len as u64 == size);
        if !fits {
            let len = pyo3::ffi::Py_ssize_t::try_from(size).map_err(|_| {
                StoreError::invalid(format!("a value of {size} bytes does not fit a Python bytes object"))
            })?;
            // The object is made with the GIL held (briefly: the allocation), then written
            // without it.
            let made = Python::attach(|py| -> PyResult<(Py<PyBytes>, *mut u8)> {
                // The object a previous call made (another size) goes with the GIL held.
                drop(self.made.take());
                // SAFETY: a null source makes CPython allocate `len` bytes left unwritten (and
                // a new object for every len but 0); the call returns a new reference or null
                // with an exception set, which `from_owned_ptr_or_err` takes either way.
                let obj = unsafe {
                    Bound::from_owned_ptr_or_err(py, pyo3::ffi::PyBytes_FromStringAndSize(std::ptr::null(), len))
                }?;
                let bytes = obj.cast_into::<PyBytes>()?;
                // SAFETY: a bytes object's buffer, valid while the object lives.
                let at = unsafe { pyo3::ffi::PyBytes_AsString(bytes.as_ptr()) }.cast::<u8>();
                Ok((bytes.unbind(), at))
            });
            let (obj, at) = made.map_err(|e| {
                StoreError::system(
                    format!("making a bytes object of {size} bytes"),
                    std::io::Error::new(std::io::ErrorKind::OutOfMemory, e.to_string()),
                )
            })?;
            self.made = Some((obj, at, len as usize));
        }
        let (_, at, len) = self.made.as_ref().expect("made above");
        // SAFETY: `at` is the object's buffer of `len` bytes, which this sink alone writes
        // (see `BytesSink`), borrowed for no longer than the sink.
        Ok(unsafe { std::slice::from_raw_parts_mut(at.cast::<MaybeUninit<u8>>(), *len) })
    }
}

impl BytesSink {
    /// The value after a get that succeeded (empty bytes if nothing was made).
    fn into_bytes(self, py: Python<'_>) -> Bound<'_, PyBytes> {
        match self.made {
            Some((obj, _, _)) => obj.into_bound(py),
            None => PyBytes::new(py, &[]),
        }
    }
}

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

/// Memory given as an int address (Mooncake's convention), a buffer object, or (where a call
/// takes [`Takes::HostOrDevice`]) an array offering its address: `__cuda_array_interface__`
/// or DLPack.
enum Mem {
    Addr(u64),
    Buffer(Exported),
    Array(device::DeviceArray),
}

/// Which objects a call takes for memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Takes {
    /// An int address or a buffer object (the store's calls).
    Host,
    /// Those, and arrays by address (`__cuda_array_interface__`, DLPack): the engine's calls.
    HostOrDevice,
}

impl Mem {
    /// An int address or a buffer object.
    fn new(obj: &Bound<'_, PyAny>, writable: bool, what: &str) -> PyResult<Self> {
        Self::parse(obj, writable, what, Takes::Host)
    }

    /// An int address, a buffer object, or an array by address (device memory included).
    fn any(obj: &Bound<'_, PyAny>, writable: bool, what: &str) -> PyResult<Self> {
        Self::parse(obj, writable, what, Takes::HostOrDevice)
    }

    fn parse(obj: &Bound<'_, PyAny>, writable: bool, what: &str, takes: Takes) -> PyResult<Self> {
        // First: a CUDA array (a torch tensor has `__index__` too, for one-item tensors).
        if takes == Takes::HostOrDevice {
            if let Some(array) = device::from_cuda_array_interface(obj, writable, what)? {
                return Ok(Mem::Array(array));
            }
        }
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
        let e = match Exported::new(obj, writable) {
            Ok(b) => return Ok(Mem::Buffer(b)),
            Err(e) => e,
        };
        if !e.is_instance_of::<PyTypeError>(obj.py()) {
            return Err(e);
        }
        // No buffer protocol: a DLPack exporter (a CPU or CUDA tensor of torch, say).
        if takes == Takes::HostOrDevice {
            if let Some(array) = device::from_dlpack(obj, what)? {
                return Ok(Mem::Array(array));
            }
        }
        let name = obj.get_type().name().map(|n| n.to_string()).unwrap_or_default();
        Err(if takes == Takes::Host && device::offers(obj) {
            PyTypeError::new_err(format!(
                "{what}: a {name} offers its memory by address (__cuda_array_interface__ or DLPack), which \
                 the TransferEngine's calls take; the store's take an int address or a buffer object"
            ))
        } else if takes == Takes::Host {
            PyTypeError::new_err(format!(
                "{what}: expected an int address or an object with the buffer protocol (bytearray, memoryview, \
                 numpy array), not {name}"
            ))
        } else {
            PyTypeError::new_err(format!(
                "{what}: expected an int address, an object with the buffer protocol (bytearray, memoryview, \
                 numpy array), __cuda_array_interface__ or DLPack (torch, cupy), not {name}"
            ))
        })
    }

    fn addr(&self) -> u64 {
        match self {
            Mem::Addr(a) => *a,
            Mem::Buffer(b) => b.addr(),
            Mem::Array(a) => a.addr(),
        }
    }

    /// Whether it holds an object that must stay alive while its memory is registered.
    fn holds_object(&self) -> bool {
        !matches!(self, Mem::Addr(_))
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
            (Mem::Array(a), Some(n)) if n > a.len() => {
                Err(PyValueError::new_err(format!("{what}: size {n} is larger than the array ({} bytes)", a.len())))
            }
            (Mem::Array(_), Some(n)) => Ok(n),
            (Mem::Array(a), None) => Ok(a.len()),
        }
    }
}

/// Memory for a list of buffers with optional sizes, each one of the objects `takes` says.
fn mems(
    buffers: &Bound<'_, PyAny>,
    sizes: Option<Vec<u64>>,
    writable: bool,
    count: usize,
    takes: Takes,
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
        let m = Mem::parse(obj, writable, &what, takes)?;
        lens.push(m.size(sizes.as_ref().map(|s| s[i]), &what)?);
        out.push(m);
    }
    Ok((out, lens))
}

/// The status of a call refused because the store is not set up: Mooncake's bindings answer
/// INVALID_PARAMS ("Client is not initialized").
fn not_set_up(what: &str) -> i32 {
    fail(Status::InvalidParams, format!("{what}: the store is not set up (call setup() first) or was closed")).code()
}

/// A caller's mistake that Mooncake reports with INVALID_PARAMS rather than an exception.
fn invalid(message: impl std::fmt::Display) -> i32 {
    fail(Status::InvalidParams, message).code()
}

/// One status per key: `code` for each.
fn per_key<T: Clone>(n: usize, code: T) -> Vec<T> {
    vec![code; n]
}

/// A status for each result of a batch of puts.
fn put_statuses(rs: &[Result<(), crescent_ffi::store::StoreError>]) -> Vec<i32> {
    rs.iter().map(|r| r.as_ref().map_or_else(|e| store_fail(e).code(), |()| 0)).collect()
}

/// Memory of a store call: an int address or a buffer object, and its size (the buffer's
/// length when none is given). A size larger than a buffer object is the caller's mistake,
/// reported as INVALID_PARAMS like Mooncake's other argument checks.
fn store_mem(
    obj: &Bound<'_, PyAny>,
    size: Option<u64>,
    writable: bool,
    what: &str,
) -> PyResult<Result<(Mem, u64), i32>> {
    let mem = Mem::new(obj, writable, what)?;
    Ok(match (&mem, size) {
        (Mem::Addr(_), None) => Err(invalid(format!("{what}: a size is required with an int address"))),
        (Mem::Buffer(b), Some(n)) if n > b.len() => {
            Err(invalid(format!("{what}: size {n} is larger than the buffer ({} bytes)", b.len())))
        }
        (Mem::Buffer(b), None) => {
            let n = b.len();
            Ok((mem, n))
        }
        // Not taken by the store's calls (`Mem::new`); sized as a buffer would be.
        (Mem::Array(a), None) => {
            let n = a.len();
            Ok((mem, n))
        }
        (_, Some(n)) => Ok((mem, n)),
    })
}

/// Memory of a batch call and the size of each.
type Mems = (Vec<Mem>, Vec<u64>);

/// The memory of a batch call: one buffer (and size, when given) per key. Lists of other
/// lengths are INVALID_PARAMS for every key, as in Mooncake.
fn store_mems(
    buffers: &Bound<'_, PyAny>,
    sizes: Option<Vec<u64>>,
    writable: bool,
    count: usize,
) -> PyResult<Result<Mems, i32>> {
    let list: Vec<Bound<'_, PyAny>> = buffers.try_iter()?.collect::<PyResult<_>>()?;
    if list.len() != count {
        return Ok(Err(invalid(format!("{count} keys but {} buffers", list.len()))));
    }
    if let Some(s) = &sizes {
        if s.len() != count {
            return Ok(Err(invalid(format!("{count} keys but {} sizes", s.len()))));
        }
    }
    let mut mems = Vec::with_capacity(count);
    let mut lens = Vec::with_capacity(count);
    for (i, obj) in list.iter().enumerate() {
        match store_mem(obj, sizes.as_ref().map(|s| s[i]), writable, &format!("buffers[{i}]"))? {
            Ok((m, n)) => {
                mems.push(m);
                lens.push(n);
            }
            Err(code) => return Ok(Err(code)),
        }
    }
    Ok(Ok((mems, lens)))
}

/// Values of a batch of byte puts: buffer objects (exported for the call).
fn exported_values(values: &Bound<'_, PyAny>) -> PyResult<Vec<Exported>> {
    values.try_iter()?.map(|v| v.and_then(|v| Exported::new(&v, false))).collect()
}

/// The items of a Python list (any iterable).
fn items<'py>(list: &Bound<'py, PyAny>) -> PyResult<Vec<Bound<'py, PyAny>>> {
    list.try_iter()?.collect()
}

/// One key's memory in a multi-buffer call: its buffers (int addresses or buffer objects, kept
/// exported in `keep`) and their sizes as pieces of registered memory, in order; empty pieces
/// are dropped. Memory that is not registered, or a size larger than a buffer object, refuses
/// the key with INVALID_PARAMS.
fn key_pieces(
    client: &dyn StoreApi,
    ptrs: &[Bound<'_, PyAny>],
    sizes: &[u64],
    writable: bool,
    keep: &mut Vec<Mem>,
    key: &str,
) -> PyResult<Result<Vec<Piece>, i32>> {
    let mut pieces = Vec::with_capacity(ptrs.len());
    for (j, (obj, &size)) in ptrs.iter().zip(sizes).enumerate() {
        let (mem, len) = match store_mem(obj, Some(size), writable, &format!("{key:?}: buffer {j}"))? {
            Ok(m) => m,
            Err(code) => return Ok(Err(code)),
        };
        if len > 0 {
            if !client.is_registered(mem.addr(), len) {
                return Ok(Err(invalid(format!(
                    "{key:?}: buffer {j} [{:#x}, +{len}) is not registered memory (register_buffer first)",
                    mem.addr()
                ))));
            }
            pieces.push(Piece::new(mem.addr(), len));
        }
        keep.push(mem);
    }
    Ok(Ok(pieces))
}

/// One key's ranges in a ranged session call: buffer `j` (an int address or a buffer object,
/// kept exported in `keep`) takes or gives `sizes[j]` bytes at `offsets[j]` of the value.
/// Lists of other lengths, memory that is not registered or a size larger than a buffer
/// object refuse the key with INVALID_PARAMS. Empty ranges move nothing.
#[allow(clippy::too_many_arguments)]
fn key_ranges(
    client: &dyn StoreApi,
    ptrs: &Bound<'_, PyAny>,
    sizes: &[u64],
    offsets: &[u64],
    writable: bool,
    keep: &mut Vec<Mem>,
    what: &str,
    key: &str,
) -> PyResult<Result<Vec<Extent>, i32>> {
    let ptrs = items(ptrs)?;
    if ptrs.len() != sizes.len() || ptrs.len() != offsets.len() {
        return Ok(Err(invalid(format!(
            "{what}: key {key:?} has {} buffers, {} sizes and {} offsets",
            ptrs.len(),
            sizes.len(),
            offsets.len()
        ))));
    }
    let mut extents = Vec::with_capacity(ptrs.len());
    for (j, obj) in ptrs.iter().enumerate() {
        let (mem, len) = match store_mem(obj, Some(sizes[j]), writable, &format!("{what}: {key:?}: buffer {j}"))? {
            Ok(m) => m,
            Err(code) => return Ok(Err(code)),
        };
        if len > 0 {
            if !client.is_registered(mem.addr(), len) {
                return Ok(Err(invalid(format!(
                    "{what}: {key:?}: buffer {j} [{:#x}, +{len}) is not registered memory (register_buffer first)",
                    mem.addr()
                ))));
            }
            extents.push(Extent { offset: offsets[j], addr: mem.addr(), len });
        }
        keep.push(mem);
    }
    Ok(Ok(extents))
}

/// Per key of a ranged session call: its result so far (Ok until refused) and its ranges.
type SessionRanges = (Vec<Result<u64, i32>>, Vec<Vec<Extent>>);

/// The ranges of a ranged session call, checked per key (see [`key_ranges`]); lists of other
/// lengths are INVALID_PARAMS for every key.
#[allow(clippy::too_many_arguments)]
fn session_ranges(
    client: &dyn StoreApi,
    what: &str,
    keys: &[String],
    all_buffer_ptrs: &Bound<'_, PyAny>,
    all_sizes: &[Vec<u64>],
    all_offsets: &[Vec<u64>],
    writable: bool,
    keep: &mut Vec<Mem>,
) -> PyResult<SessionRanges> {
    let n = keys.len();
    let ptr_lists = items(all_buffer_ptrs)?;
    if ptr_lists.len() != n || all_sizes.len() != n || all_offsets.len() != n {
        let message = format!(
            "{what}: {n} keys, {} buffer lists, {} size lists, {} offset lists",
            ptr_lists.len(),
            all_sizes.len(),
            all_offsets.len()
        );
        return Ok((per_key(n, Err(invalid(message))), vec![Vec::new(); n]));
    }
    let mut results = Vec::with_capacity(n);
    let mut ranges = Vec::with_capacity(n);
    for i in 0..n {
        let r = key_ranges(client, &ptr_lists[i], &all_sizes[i], &all_offsets[i], writable, keep, what, &keys[i])?;
        results.push(r.as_ref().map(|_| 0).map_err(|c| *c));
        ranges.push(r.unwrap_or_default());
    }
    Ok((results, ranges))
}

/// A session call's per-key results as Mooncake's codes.
fn session_codes<T>(
    rs: Result<Vec<Result<T, crescent_ffi::store::StoreError>>, crescent_ffi::store::StoreError>,
    n: usize,
    ok: impl Fn(T) -> i64,
) -> Vec<i64> {
    match rs {
        Ok(rs) => rs.into_iter().map(|r| r.map_or_else(|e| session_fail(&e).code() as i64, &ok)).collect(),
        Err(e) => per_key(n, session_fail(&e).code() as i64),
    }
}

/// Runs a batch call on the keys not refused yet (`results[i]` is `Err(code)` for a refused
/// key), and puts each of its results in its key's place.
fn on_accepted<T, V>(
    results: &mut [Result<T, i32>],
    keys: &[String],
    values: Vec<V>,
    call: impl FnOnce(&[String], &[V]) -> Vec<Result<T, i32>>,
) {
    let accepted: Vec<usize> = (0..keys.len()).filter(|&i| results[i].is_ok()).collect();
    if accepted.is_empty() {
        return;
    }
    let sub_keys: Vec<String> = accepted.iter().map(|&i| keys[i].clone()).collect();
    let mut values: Vec<Option<V>> = values.into_iter().map(Some).collect();
    let sub_values: Vec<V> = accepted.iter().filter_map(|&i| values[i].take()).collect();
    for (&i, r) in accepted.iter().zip(call(&sub_keys, &sub_values)) {
        results[i] = r;
    }
}

// ---- enums and descriptor types ----

/// SoftPinAction: what a put or upsert does to the object's soft pin (Mooncake's values).
#[pyclass(module = "crescent._crescent", name = "SoftPinAction", eq, eq_int, frozen, hash, from_py_object)]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
#[allow(clippy::upper_case_acronyms)]
enum PySoftPinAction {
    PRESERVE = 0,
    ENABLE = 1,
    DISABLE = 2,
}

impl From<PySoftPinAction> for SoftPinAction {
    fn from(a: PySoftPinAction) -> Self {
        match a {
            PySoftPinAction::PRESERVE => SoftPinAction::Preserve,
            PySoftPinAction::ENABLE => SoftPinAction::Enable,
            PySoftPinAction::DISABLE => SoftPinAction::Disable,
        }
    }
}

/// ObjectDataType: Mooncake's classification of a value (accepted in `ReplicateConfig`; it
/// does not change where or how Crescent stores it).
#[pyclass(module = "crescent._crescent", name = "ObjectDataType", eq, eq_int, frozen, hash, from_py_object)]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
#[allow(clippy::upper_case_acronyms, non_camel_case_types)]
enum PyObjectDataType {
    UNKNOWN = 0,
    KVCACHE = 1,
    TENSOR = 2,
    WEIGHT = 3,
    SAMPLE = 4,
    ACTIVATION = 5,
    GRADIENT = 6,
    OPTIMIZER_STATE = 7,
    METADATA = 8,
    GENERAL = 9,
}

/// ReplicaStatus of a replica descriptor (Mooncake's values).
#[pyclass(module = "crescent._crescent", name = "ReplicaStatus", eq, eq_int, frozen, hash, from_py_object)]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
#[allow(clippy::upper_case_acronyms)]
enum PyReplicaStatus {
    UNDEFINED = 0,
    INITIALIZED = 1,
    PROCESSING = 2,
    COMPLETE = 3,
    REMOVED = 4,
    FAILED = 5,
}

/// Descriptor: where a memory replica's bytes are — `size`, `buffer_address` (in its
/// segment) and `transport_endpoint` (the segment's name, `host:port`).
#[pyclass(module = "crescent._crescent", name = "Descriptor", get_all, set_all, from_py_object)]
#[derive(Clone, Default)]
struct PyBufferDescriptor {
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
struct PyMemoryDescriptor {
    buffer_descriptor: PyBufferDescriptor,
}

/// DiskDescriptor: a disk replica's `file_path` and `object_size`.
#[pyclass(module = "crescent._crescent", name = "DiskDescriptor", get_all, set_all, from_py_object)]
#[derive(Clone)]
struct PyDiskDescriptor {
    file_path: String,
    object_size: u64,
}

/// ReplicaDescriptor: one replica of an object, as `get_replica_desc` lists them. Crescent's
/// disk replicas live on their owner's disk and are read through it: Mooncake's "local disk"
/// kind (`is_local_disk_replica()`), not a shared-file-system path (`is_disk_replica()`).
#[pyclass(module = "crescent._crescent", name = "ReplicaDescriptor", frozen)]
struct PyReplicaDescriptor {
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

fn replica_descriptor(r: &crescent_ffi::store::proto::ReplicaDescriptor) -> PyReplicaDescriptor {
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
            transport_endpoint: r.segment_name.clone(),
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
struct PyBufferHandle {
    block: HeldBuffer,
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
struct PyReplicateConfig {
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
    fn common(&self) -> crescent_ffi::ReplicateConfig {
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
fn put_options(client: &dyn StoreApi, config: Option<&PyReplicateConfig>, keys: usize) -> Result<PutOptions, i32> {
    let c = config.map_or_else(crescent_ffi::ReplicateConfig::default, PyReplicateConfig::common);
    if let Some(groups) = config.and_then(|c| c.group_ids.as_ref()) {
        if groups.len() != keys {
            return Err(invalid(format!("group_ids has {} entries for {keys} keys", groups.len())));
        }
    }
    c.put_options(client).map_err(|e| store_fail(&e).code())
}

// ---- MooncakeDistributedStore ----

/// A client of the Crescent store with Mooncake's `MooncakeDistributedStore` interface.
///
/// Call `setup(...)` first. Status-returning methods give 0 (or a count / size) on success and
/// a negative Mooncake error code on failure; `crescent.last_error()` gives the message.
/// Memory for the zero-copy calls is an int address or a buffer object (bytearray,
/// memoryview, numpy array), registered once with `register_buffer`.
#[pyclass(module = "crescent._crescent", name = "MooncakeDistributedStore", subclass)]
struct Store {
    /// A full client (`setup`) or a dummy client (`setup_dummy`, see `dummy.rs`).
    client: RwLock<Option<Arc<dyn StoreApi>>>,
    /// Buffer objects registered by `register_buffer`, kept exported until unregistered.
    pinned: Mutex<HashMap<u64, Exported>>,
    /// `setup` was given `local_buffer_size` 0: the calls that move values through the local
    /// buffer (byte puts and gets) fail, as in Mooncake.
    no_local_buffer: AtomicBool,
}

/// The staging buffer a client set up with `local_buffer_size` 0 still has, for its own
/// internal copies (disk tier, warm-up); the calls that need a local buffer are refused.
const INTERNAL_STAGING: u64 = 1 << 20;

impl Store {
    fn client(&self) -> Option<Arc<dyn StoreApi>> {
        self.client.read().clone()
    }

    /// The client, for a call that moves bytes through the local buffer.
    fn byte_client(&self, what: &str) -> Result<Arc<dyn StoreApi>, i32> {
        let client = self.client().ok_or_else(|| not_set_up(what))?;
        if self.no_local_buffer.load(Ordering::Acquire) {
            return Err(invalid(format!(
                "{what}: setup had local_buffer_size 0, and this call needs the local buffer (the zero-copy calls \
                 do not)"
            )));
        }
        Ok(client)
    }

    /// Connects the client, on `shared` (an engine the caller runs) when given, else on an
    /// engine of its own.
    fn start(&self, py: Python<'_>, args: SetupArgs, shared: Option<Arc<TransferEngine>>) -> i32 {
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

    fn put_one(
        &self,
        py: Python<'_>,
        what: &str,
        key: &str,
        value: &Bound<'_, PyAny>,
        config: Option<&PyReplicateConfig>,
        upsert: bool,
    ) -> PyResult<i32> {
        crescent_ffi::clear_last_error();
        let value = Exported::new(value, false)?;
        let client = match self.byte_client(what) {
            Ok(c) => c,
            Err(code) => return Ok(code),
        };
        let options = match put_options(&*client, config, 1) {
            Ok(o) => o,
            Err(code) => return Ok(code),
        };
        let bytes = value.bytes();
        let r = py.detach(|| {
            if upsert {
                client.upsert_with(key, bytes, &options)
            } else {
                client.put_with(key, bytes, &options)
            }
        });
        Ok(r.map_or_else(|e| store_fail(&e).code(), |()| 0))
    }

    fn put_many(
        &self,
        py: Python<'_>,
        what: &str,
        keys: Vec<String>,
        values: &Bound<'_, PyAny>,
        config: Option<&PyReplicateConfig>,
        upsert: bool,
    ) -> PyResult<i32> {
        crescent_ffi::clear_last_error();
        let values = exported_values(values)?;
        let client = match self.byte_client(what) {
            Ok(c) => c,
            Err(code) => return Ok(code),
        };
        if values.len() != keys.len() {
            return Ok(invalid(format!("{what}: {} keys but {} values", keys.len(), values.len())));
        }
        let options = match put_options(&*client, config, keys.len()) {
            Ok(o) => o,
            Err(code) => return Ok(code),
        };
        let slices: Vec<&[u8]> = values.iter().map(Exported::bytes).collect();
        let r = py.detach(|| {
            if upsert {
                client.upsert_batch_with(&keys, &slices, &options)
            } else {
                client.put_batch_with(&keys, &slices, &options)
            }
        });
        Ok(match r {
            Ok(rs) => put_statuses(&rs).into_iter().find(|c| *c != 0).unwrap_or(0),
            Err(e) => store_fail(&e).code(),
        })
    }

    fn parts_one(
        &self,
        py: Python<'_>,
        what: &str,
        key: &str,
        parts: &Bound<'_, pyo3::types::PyTuple>,
        config: Option<&PyReplicateConfig>,
        upsert: bool,
    ) -> PyResult<i32> {
        crescent_ffi::clear_last_error();
        let parts: Vec<Exported> = parts.iter().map(|p| Exported::new(&p, false)).collect::<PyResult<_>>()?;
        let client = match self.byte_client(what) {
            Ok(c) => c,
            Err(code) => return Ok(code),
        };
        let options = match put_options(&*client, config, 1) {
            Ok(o) => o,
            Err(code) => return Ok(code),
        };
        let slices: Vec<&[u8]> = parts.iter().map(Exported::bytes).collect();
        if slices.iter().all(|s| s.is_empty()) {
            // Mooncake: "Attempting to put empty data" is a warning and a success.
            tracing::warn!("{what}: empty value for key {key:?}; nothing stored");
            return Ok(0);
        }
        let r = py.detach(|| {
            if upsert {
                client.upsert_parts_with(key, &slices, &options)
            } else {
                client.put_parts_with(key, &slices, &options)
            }
        });
        Ok(r.map_or_else(|e| store_fail(&e).code(), |()| 0))
    }

    #[allow(clippy::too_many_arguments)]
    fn put_from_one(
        &self,
        py: Python<'_>,
        what: &str,
        key: &str,
        buffer_ptr: &Bound<'_, PyAny>,
        size: Option<u64>,
        config: Option<&PyReplicateConfig>,
        upsert: bool,
    ) -> PyResult<i32> {
        crescent_ffi::clear_last_error();
        let (mem, len) = match store_mem(buffer_ptr, size, false, "buffer_ptr")? {
            Ok(m) => m,
            Err(code) => return Ok(code),
        };
        let Some(client) = self.client() else { return Ok(not_set_up(what)) };
        let options = match put_options(&*client, config, 1) {
            Ok(o) => o,
            Err(code) => return Ok(code),
        };
        if len == 0 {
            // Mooncake: "Attempting to put empty data" is a warning and a success.
            tracing::warn!("{what}: empty value for key {key:?}; nothing stored");
            return Ok(0);
        }
        let addr = mem.addr();
        let r = py.detach(|| {
            if upsert {
                client.upsert_from_with(key, addr, len, &options)
            } else {
                client.put_from_with(key, addr, len, &options)
            }
        });
        Ok(r.map_or_else(|e| store_fail(&e).code(), |()| 0))
    }

    #[allow(clippy::too_many_arguments)]
    fn put_from_many(
        &self,
        py: Python<'_>,
        what: &str,
        keys: Vec<String>,
        buffer_ptrs: &Bound<'_, PyAny>,
        sizes: Option<Vec<u64>>,
        config: Option<&PyReplicateConfig>,
        upsert: bool,
    ) -> PyResult<Vec<i32>> {
        crescent_ffi::clear_last_error();
        let n = keys.len();
        let (mems, lens) = match store_mems(buffer_ptrs, sizes, false, n)? {
            Ok(m) => m,
            Err(code) => return Ok(per_key(n, code)),
        };
        let Some(client) = self.client() else { return Ok(per_key(n, not_set_up(what))) };
        let options = match put_options(&*client, config, n) {
            Ok(o) => o,
            Err(code) => return Ok(per_key(n, code)),
        };
        if n == 0 {
            return Ok(Vec::new());
        }
        let addrs: Vec<u64> = mems.iter().map(Mem::addr).collect();
        let r = py.detach(|| {
            if upsert {
                let pieces: Vec<[Piece; 1]> = addrs.iter().zip(&lens).map(|(&a, &n)| [Piece::new(a, n)]).collect();
                let values: Vec<&[Piece]> = pieces.iter().map(|p| &p[..]).collect();
                client.batch_upsert_from_sg(&keys, &values, &options)
            } else {
                client.batch_put_from_with(&keys, &addrs, &lens, &options)
            }
        });
        Ok(match r {
            Ok(rs) => put_statuses(&rs),
            Err(e) => per_key(n, store_fail(&e).code()),
        })
    }
}

/// A key's ranges in `get_into_ranges`, each with where its result goes (buffer, key, range).
type KeyRanges = Vec<(Extent, (usize, usize, usize))>;

/// The ranged reads of `get_into_ranges`: the keys `wanted` (by slot) with their ranges, one
/// batch. A range past the end of its value fails alone: the key's other ranges are read
/// again without it (the value's size comes with the refusal). Per key, a result per range.
fn ranged_reads(
    client: &dyn StoreApi,
    keys: &[String],
    ranges: &[KeyRanges],
    wanted: &[usize],
) -> Vec<(usize, Vec<Result<(), i32>>)> {
    use crescent_ffi::store::StoreError;
    // Per slot: Ok, or the code and, for a range past the end, the value's size.
    let read = |slots: &[usize], keep: &dyn Fn(usize, &Extent) -> bool| -> Vec<Result<(), (i32, Option<u64>)>> {
        let ks: Vec<String> = slots.iter().map(|&s| keys[s].clone()).collect();
        let extents: Vec<Vec<Extent>> =
            slots.iter().map(|&s| ranges[s].iter().map(|(e, _)| *e).filter(|e| keep(s, e)).collect()).collect();
        let refs: Vec<&[Extent]> = extents.iter().map(|e| &e[..]).collect();
        let fail = |e: &StoreError| {
            let size = match e {
                StoreError::BadRange { size, .. } => Some(*size),
                _ => None,
            };
            (store_fail(e).code(), size)
        };
        match client.batch_get_into_ranges(&ks, &refs) {
            Ok(rs) => rs.into_iter().map(|r| r.map(|_| ()).map_err(|e| fail(&e))).collect(),
            Err(e) => {
                let f = fail(&e);
                slots.iter().map(|_| Err((f.0, None))).collect()
            }
        }
    };
    let mut out: Vec<(usize, Vec<Result<(), i32>>)> = Vec::with_capacity(wanted.len());
    let mut sizes: HashMap<usize, u64> = HashMap::new();
    for (&slot, r) in wanted.iter().zip(read(wanted, &|_, _| true)) {
        match r {
            Err((_, Some(size))) => {
                sizes.insert(slot, size);
            }
            r => out.push((slot, vec![r.map_err(|(code, _)| code); ranges[slot].len()])),
        }
    }
    if sizes.is_empty() {
        return out;
    }
    let inside = |size: u64, e: &Extent| e.offset.checked_add(e.len).is_some_and(|end| end <= size);
    let again: Vec<usize> = wanted.iter().copied().filter(|s| sizes.contains_key(s)).collect();
    // Keys with no range inside their value are not read again.
    let some_inside = |s: usize| ranges[s].iter().any(|(e, _)| inside(sizes[&s], e));
    let reread: Vec<usize> = again.iter().copied().filter(|&s| some_inside(s)).collect();
    let mut second = read(&reread, &|s, e| inside(sizes[&s], e)).into_iter();
    for &slot in &again {
        let size = sizes[&slot];
        let code = if some_inside(slot) { second.next().unwrap_or(Ok(())).map_err(|(code, _)| code) } else { Ok(()) };
        let per_range = ranges[slot]
            .iter()
            .map(|(e, _)| {
                if inside(size, e) {
                    code
                } else {
                    Err(invalid(format!(
                        "get_into_ranges: {:?}: range [{}, +{}) is past the end of the value ({size} bytes)",
                        keys[slot], e.offset, e.len
                    )))
                }
            })
            .collect();
        out.push((slot, per_range));
    }
    out
}

/// A size in `setup`: an int (negative is INVALID_PARAMS) or a string such as "512MB".
fn setup_size(name: &str, v: &Bound<'_, PyAny>) -> PyResult<Result<u64, i32>> {
    if let Ok(s) = v.cast::<pyo3::types::PyString>() {
        let s = s.to_string();
        return Ok(crescent_ffi::engine::parse_size(&s).map_err(|e| invalid(format!("setup: {name}: {e}"))));
    }
    let n: i128 = v.extract().map_err(|_| PyTypeError::new_err(format!("setup: {name} must be an int")))?;
    Ok(u64::try_from(n).map_err(|_| invalid(format!("setup: {name} is {n}: it must be 0 or more"))))
}

/// Values of a setup dict as strings, as Mooncake's binding converts them (`str(value)`;
/// booleans as `true` / `false`).
fn dict_pairs(d: &Bound<'_, PyDict>) -> PyResult<Vec<(String, String)>> {
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

#[pymethods]
impl Store {
    #[new]
    #[pyo3(signature = (*_args, **_kwargs))]
    fn new(_args: &Bound<'_, pyo3::types::PyTuple>, _kwargs: Option<&Bound<'_, PyDict>>) -> Self {
        crescent_ffi::init_logging();
        Store { client: RwLock::new(None), pinned: Mutex::new(HashMap::new()), no_local_buffer: AtomicBool::new(false) }
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
                None => return Ok(invalid("setup: the engine given is not initialized; call its initialize() first")),
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
    fn setup_dummy(&self, py: Python<'_>, mem_pool_size: u64, local_buffer_size: u64, server_address: String) -> i32 {
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

    /// get_hostname() -> str: this client's segment name (`host:port`), "" before setup.
    fn get_hostname(&self) -> String {
        self.client().map(|c| c.segment_name().to_string()).unwrap_or_default()
    }

    /// put(key, value, config=None) -> int: stores `value` (bytes or any buffer object) under
    /// `key`, placed as `config` (a `ReplicateConfig`) asks. A key that exists keeps its value
    /// and the put returns 0, as in Mooncake (`upsert` replaces).
    #[pyo3(signature = (key, value, config=None))]
    fn put(
        &self,
        py: Python<'_>,
        key: &str,
        value: &Bound<'_, PyAny>,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> PyResult<i32> {
        self.put_one(py, "put", key, value, config.as_deref(), false)
    }

    /// upsert(key, value, config=None) -> int: stores `value`, replacing the key's value if it
    /// has one. OBJECT_HAS_LEASE while a reader holds a lease on the old value.
    #[pyo3(signature = (key, value, config=None))]
    fn upsert(
        &self,
        py: Python<'_>,
        key: &str,
        value: &Bound<'_, PyAny>,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> PyResult<i32> {
        self.put_one(py, "upsert", key, value, config.as_deref(), true)
    }

    /// get(key) -> bytes: the value, or empty bytes if it is missing or the get failed.
    ///
    /// The value is read straight into the `bytes` object returned (made, not zeroed, once
    /// the master has given the size), with the GIL released during the transfer: no copy
    /// after the get (see [`BytesSink`]).
    fn get<'py>(&self, py: Python<'py>, key: &str) -> Bound<'py, PyBytes> {
        crescent_ffi::clear_last_error();
        let client = match self.byte_client("get") {
            Ok(c) => c,
            Err(_) => return PyBytes::new(py, &[]),
        };
        let mut sink = BytesSink::default();
        match py.detach(|| client.get_with(key, &mut sink)) {
            Ok(_) => sink.into_bytes(py),
            Err(e) => {
                store_fail(&e);
                PyBytes::new(py, &[])
            }
        }
    }

    /// get_buffer(key) -> BufferHandle | None: the value as a buffer object (None if it is
    /// missing or the get failed).
    fn get_buffer(&self, py: Python<'_>, key: &str) -> Option<PyBufferHandle> {
        crescent_ffi::clear_last_error();
        let client = self.byte_client("get_buffer").ok()?;
        match py.detach(|| client.get_buffer(key)) {
            Ok(block) => Some(PyBufferHandle { block }),
            Err(e) => {
                store_fail(&e);
                None
            }
        }
    }

    /// batch_get_buffer(keys) -> list[BufferHandle | None]: one per key, None where the get
    /// failed.
    fn batch_get_buffer(&self, py: Python<'_>, keys: Vec<String>) -> Vec<Option<PyBufferHandle>> {
        crescent_ffi::clear_last_error();
        let Ok(client) = self.byte_client("batch_get_buffer") else { return keys.iter().map(|_| None).collect() };
        if keys.is_empty() {
            return Vec::new();
        }
        match py.detach(|| client.batch_get_buffer(&keys)) {
            Ok(rs) => rs
                .into_iter()
                .map(|r| match r {
                    Ok(block) => Some(PyBufferHandle { block }),
                    Err(e) => {
                        store_fail(&e);
                        None
                    }
                })
                .collect(),
            Err(e) => {
                store_fail(&e);
                keys.iter().map(|_| None).collect()
            }
        }
    }

    /// put_batch(keys, values, config=None) -> int: 0 if every put succeeded, else the first
    /// error code (INVALID_PARAMS for lists of different lengths).
    #[pyo3(signature = (keys, values, config=None))]
    fn put_batch(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        values: &Bound<'_, PyAny>,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> PyResult<i32> {
        self.put_many(py, "put_batch", keys, values, config.as_deref(), false)
    }

    /// upsert_batch(keys, values, config=None) -> int: `upsert` of each; 0 or the first error.
    #[pyo3(signature = (keys, values, config=None))]
    fn upsert_batch(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        values: &Bound<'_, PyAny>,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> PyResult<i32> {
        self.put_many(py, "upsert_batch", keys, values, config.as_deref(), true)
    }

    /// get_batch(keys) -> list[bytes]: one value per key, empty bytes where a get failed.
    fn get_batch<'py>(&self, py: Python<'py>, keys: Vec<String>) -> Vec<Bound<'py, PyBytes>> {
        crescent_ffi::clear_last_error();
        let Ok(client) = self.byte_client("get_batch") else {
            return keys.iter().map(|_| PyBytes::new(py, &[])).collect();
        };
        if keys.is_empty() {
            return Vec::new();
        }
        // Each value straight into the bytes object returned for it, as `get`.
        let mut sinks: Vec<BytesSink> = keys.iter().map(|_| BytesSink::default()).collect();
        let got = py.detach(|| {
            let mut refs: Vec<&mut dyn ValueSink> = sinks.iter_mut().map(|s| s as &mut dyn ValueSink).collect();
            client.get_batch_with(&keys, &mut refs)
        });
        match got {
            Ok(rs) => rs
                .into_iter()
                .zip(sinks)
                .map(|(r, sink)| match r {
                    Ok(_) => sink.into_bytes(py),
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
        let (mem, len) = match store_mem(buffer_ptr, size, false, "buffer_ptr")? {
            Ok(m) => m,
            Err(code) => return Ok(code),
        };
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
    /// registered memory (size 0 stores nothing and returns 0, as in Mooncake).
    #[pyo3(signature = (key, buffer_ptr, size=None, config=None))]
    fn put_from(
        &self,
        py: Python<'_>,
        key: &str,
        buffer_ptr: &Bound<'_, PyAny>,
        size: Option<u64>,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> PyResult<i32> {
        self.put_from_one(py, "put_from", key, buffer_ptr, size, config.as_deref(), false)
    }

    /// upsert_from(key, buffer_ptr, size=None, config=None) -> int: `upsert` from registered
    /// memory.
    #[pyo3(signature = (key, buffer_ptr, size=None, config=None))]
    fn upsert_from(
        &self,
        py: Python<'_>,
        key: &str,
        buffer_ptr: &Bound<'_, PyAny>,
        size: Option<u64>,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> PyResult<i32> {
        self.put_from_one(py, "upsert_from", key, buffer_ptr, size, config.as_deref(), true)
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
    ) -> PyResult<i32> {
        crescent_ffi::clear_last_error();
        let (data, size) = match store_mem(buffer_ptr, Some(size), false, "buffer_ptr")? {
            Ok(m) => m,
            Err(code) => return Ok(code),
        };
        let (meta, metadata_size) =
            match store_mem(metadata_buffer_ptr, Some(metadata_size), false, "metadata_buffer_ptr")? {
                Ok(m) => m,
                Err(code) => return Ok(code),
            };
        let Some(client) = self.client() else { return Ok(not_set_up("put_from_with_metadata")) };
        let options = match put_options(&*client, config.as_deref(), 1) {
            Ok(o) => o,
            Err(code) => return Ok(code),
        };
        if size == 0 {
            tracing::warn!("put_from_with_metadata: empty data for key {key:?}; nothing stored");
            return Ok(0);
        }
        for (what, addr, len) in
            [("buffer_ptr", data.addr(), size), ("metadata_buffer_ptr", meta.addr(), metadata_size)]
        {
            if len > 0 && !client.is_registered(addr, len) {
                return Ok(invalid(format!(
                    "put_from_with_metadata: {what} [{addr:#x}, +{len}) is not registered memory: call register_buffer first"
                )));
            }
        }
        // The two regions, metadata then data, as one value: a put from two pieces (zero copy).
        let pieces: Vec<Piece> = [Piece::new(meta.addr(), metadata_size), Piece::new(data.addr(), size)]
            .into_iter()
            .filter(|p| p.len > 0)
            .collect();
        let r = py.detach(|| client.put_from_sg(key, &pieces, &options));
        Ok(r.map_or_else(|e| store_fail(&e).code(), |()| 0))
    }

    /// get_into(key, buffer_ptr, size=None) -> int: zero-copy get into registered memory;
    /// the bytes read, or a negative error code (-10 when the buffer is too small).
    #[pyo3(signature = (key, buffer_ptr, size=None))]
    fn get_into(&self, py: Python<'_>, key: &str, buffer_ptr: &Bound<'_, PyAny>, size: Option<u64>) -> PyResult<i64> {
        crescent_ffi::clear_last_error();
        let (mem, len) = match store_mem(buffer_ptr, size, true, "buffer_ptr")? {
            Ok(m) => m,
            Err(code) => return Ok(code as i64),
        };
        let Some(client) = self.client() else { return Ok(not_set_up("get_into") as i64) };
        let addr = mem.addr();
        Ok(match py.detach(|| client.get_into(key, addr, len)) {
            Ok(n) => n as i64,
            Err(e) => store_fail(&e).code() as i64,
        })
    }

    /// batch_put_from(keys, buffer_ptrs, sizes=None, config=None) -> list[int]: zero-copy
    /// puts, one master round trip; a status per key (INVALID_PARAMS for each when the lists'
    /// lengths differ).
    #[pyo3(signature = (keys, buffer_ptrs, sizes=None, config=None))]
    fn batch_put_from(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        buffer_ptrs: &Bound<'_, PyAny>,
        sizes: Option<Vec<u64>>,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> PyResult<Vec<i32>> {
        self.put_from_many(py, "batch_put_from", keys, buffer_ptrs, sizes, config.as_deref(), false)
    }

    /// batch_upsert_from(keys, buffer_ptrs, sizes=None, config=None) -> list[int]: `upsert`
    /// of each from registered memory; a status per key.
    #[pyo3(signature = (keys, buffer_ptrs, sizes=None, config=None))]
    fn batch_upsert_from(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        buffer_ptrs: &Bound<'_, PyAny>,
        sizes: Option<Vec<u64>>,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> PyResult<Vec<i32>> {
        self.put_from_many(py, "batch_upsert_from", keys, buffer_ptrs, sizes, config.as_deref(), true)
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
        crescent_ffi::clear_last_error();
        let n = keys.len();
        let (mems, lens) = match store_mems(buffer_ptrs, sizes, true, n)? {
            Ok(m) => m,
            Err(code) => return Ok(per_key(n, code as i64)),
        };
        let Some(client) = self.client() else { return Ok(per_key(n, not_set_up("batch_get_into") as i64)) };
        if n == 0 {
            return Ok(Vec::new());
        }
        let addrs: Vec<u64> = mems.iter().map(Mem::addr).collect();
        Ok(match py.detach(|| client.batch_get_into(&keys, &addrs, &lens)) {
            Ok(rs) => {
                rs.iter().map(|r| r.as_ref().map_or_else(|e| store_fail(e).code() as i64, |n| *n as i64)).collect()
            }
            Err(e) => per_key(n, store_fail(&e).code() as i64),
        })
    }

    /// batch_put_from_multi_buffers(keys, all_buffer_ptrs, all_sizes, config=None) -> list[int]:
    /// zero-copy puts of values laid out in several buffers each (the value is the
    /// concatenation of its buffers, in order), one master round trip and one engine batch; a
    /// status per key. Lists of other lengths (of keys, of buffers and sizes, or of one key's
    /// buffers and sizes) are INVALID_PARAMS for every key, as in Mooncake; a key with memory
    /// that is not registered, or no bytes, is INVALID_PARAMS alone. Before setup: [].
    #[pyo3(signature = (keys, all_buffer_ptrs, all_sizes, config=None))]
    fn batch_put_from_multi_buffers(
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        all_buffer_ptrs: &Bound<'_, PyAny>,
        all_sizes: Vec<Vec<u64>>,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> PyResult<Vec<i32>> {
        crescent_ffi::clear_last_error();
        let what = "batch_put_from_multi_buffers";
        let Some(client) = self.client() else {
            not_set_up(what);
            return Ok(Vec::new());
        };
        let n = keys.len();
        let ptr_lists = items(all_buffer_ptrs)?;
        if ptr_lists.len() != n || all_sizes.len() != n {
            let message = format!("{what}: {n} keys, {} buffer lists, {} size lists", ptr_lists.len(), all_sizes.len());
            return Ok(per_key(n, invalid(message)));
        }
        let ptr_lists: Vec<Vec<Bound<'_, PyAny>>> = ptr_lists.iter().map(items).collect::<PyResult<_>>()?;
        if let Some(i) = (0..n).find(|&i| ptr_lists[i].len() != all_sizes[i].len()) {
            let message = format!(
                "{what}: key {:?} has {} buffers and {} sizes",
                keys[i],
                ptr_lists[i].len(),
                all_sizes[i].len()
            );
            return Ok(per_key(n, invalid(message)));
        }
        let options = match put_options(&*client, config.as_deref(), n) {
            Ok(o) => o,
            Err(code) => return Ok(per_key(n, code)),
        };
        let mut keep = Vec::new();
        let mut values = Vec::with_capacity(n);
        let mut results: Vec<Result<(), i32>> = Vec::with_capacity(n);
        for i in 0..n {
            let pieces = match key_pieces(&*client, &ptr_lists[i], &all_sizes[i], false, &mut keep, &keys[i])? {
                Ok(p) if p.is_empty() => Err(invalid(format!("{what}: key {:?} has no bytes to put", keys[i]))),
                r => r,
            };
            results.push(pieces.as_ref().map(|_| ()).map_err(|c| *c));
            values.push(pieces.unwrap_or_default());
        }
        py.detach(|| {
            on_accepted(&mut results, &keys, values, |keys, values| {
                let refs: Vec<&[Piece]> = values.iter().map(|v| &v[..]).collect();
                match client.batch_put_from_sg(keys, &refs, &options) {
                    Ok(rs) => rs.into_iter().map(|r| r.map_err(|e| store_fail(&e).code())).collect(),
                    Err(e) => per_key(keys.len(), Err(store_fail(&e).code())),
                }
            })
        });
        Ok(results.into_iter().map(|r| r.map_or_else(|code| code, |()| 0)).collect())
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
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        all_buffer_ptrs: &Bound<'_, PyAny>,
        all_sizes: Vec<Vec<u64>>,
        prefer_alloc_in_same_node: bool,
    ) -> PyResult<Vec<i64>> {
        let _ = prefer_alloc_in_same_node;
        crescent_ffi::clear_last_error();
        let what = "batch_get_into_multi_buffers";
        let n = keys.len();
        let Some(client) = self.client() else { return Ok(per_key(n, not_set_up(what) as i64)) };
        let ptr_lists = items(all_buffer_ptrs)?;
        if ptr_lists.len() != n || all_sizes.len() != n {
            let message = format!("{what}: {n} keys, {} buffer lists, {} size lists", ptr_lists.len(), all_sizes.len());
            return Ok(per_key(n, invalid(message) as i64));
        }
        let mut keep = Vec::new();
        let mut values = Vec::with_capacity(n);
        let mut results: Vec<Result<u64, i32>> = Vec::with_capacity(n);
        for i in 0..n {
            let ptrs = items(&ptr_lists[i])?;
            let pieces = if ptrs.len() != all_sizes[i].len() {
                Err(invalid(format!(
                    "{what}: key {:?} has {} buffers and {} sizes",
                    keys[i],
                    ptrs.len(),
                    all_sizes[i].len()
                )))
            } else {
                key_pieces(&*client, &ptrs, &all_sizes[i], true, &mut keep, &keys[i])?
            };
            results.push(pieces.as_ref().map(|_| 0).map_err(|c| *c));
            values.push(pieces.unwrap_or_default());
        }
        py.detach(|| {
            on_accepted(&mut results, &keys, values, |keys, values| {
                let refs: Vec<&[Piece]> = values.iter().map(|v| &v[..]).collect();
                // Buffers too small for a value are INVALID_PARAMS here, as in Mooncake.
                let code = |e: &crescent_ffi::store::StoreError| match e {
                    crescent_ffi::store::StoreError::BufferTooSmall { .. } => invalid(e),
                    e => store_fail(e).code(),
                };
                match client.batch_get_into_sg(keys, &refs) {
                    Ok(rs) => rs.into_iter().map(|r| r.map_err(|e| code(&e))).collect(),
                    Err(e) => per_key(keys.len(), Err(code(&e))),
                }
            })
        });
        Ok(results.into_iter().map(|r| r.map_or_else(|code| code as i64, |n| n as i64)).collect())
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
        crescent_ffi::clear_last_error();
        let what = "get_into_ranges";
        let buffers = items(buffer_ptrs)?;
        let nb = buffers.len();
        // Mooncake's shape of the results, every range INVALID_PARAMS until it is read.
        let bad = Status::InvalidParams.code() as i64;
        let mut results: Vec<Vec<Vec<i64>>> = (0..nb)
            .map(|i| {
                let nk = all_keys.get(i).map_or(1, Vec::len);
                (0..nk).map(|j| vec![bad; all_dst_offsets.get(i).and_then(|d| d.get(j)).map_or(1, Vec::len)]).collect()
            })
            .collect();
        let Some(client) = self.client() else {
            not_set_up(what);
            return Ok(results);
        };
        if [all_keys.len(), all_dst_offsets.len(), all_src_offsets.len(), all_sizes.len()].iter().any(|&l| l != nb) {
            invalid(format!("{what}: {nb} buffers but lists of other lengths"));
            return Ok(results);
        }
        // Each key's ranges (from every buffer), and where each range's result goes.
        let mut keys: Vec<String> = Vec::new();
        let mut index: HashMap<String, usize> = HashMap::new();
        let mut ranges: Vec<KeyRanges> = Vec::new();
        let mut keep = Vec::with_capacity(nb);
        for i in 0..nb {
            let mem = Mem::new(&buffers[i], true, &format!("{what}: buffer_ptrs[{i}]"))?;
            let base = mem.addr();
            let capacity = match &mem {
                Mem::Buffer(b) => Some(b.len()),
                Mem::Array(a) => Some(a.len()),
                Mem::Addr(_) => None,
            };
            keep.push(mem);
            let (ks, dsts, srcs, sizes) = (&all_keys[i], &all_dst_offsets[i], &all_src_offsets[i], &all_sizes[i]);
            if dsts.len() != ks.len() || srcs.len() != ks.len() || sizes.len() != ks.len() {
                invalid(format!("{what}: buffer {i}: {} keys but lists of other lengths", ks.len()));
                continue;
            }
            for (j, key) in ks.iter().enumerate() {
                let (dst, src, size) = (&dsts[j], &srcs[j], &sizes[j]);
                if src.len() != dst.len() || size.len() != dst.len() {
                    invalid(format!("{what}: buffer {i}, key {key:?}: offsets and sizes of other lengths"));
                    continue;
                }
                let slot = *index.entry(key.clone()).or_insert_with(|| {
                    keys.push(key.clone());
                    ranges.push(Vec::new());
                    keys.len() - 1
                });
                for k in 0..dst.len() {
                    let (d, len) = (dst[k], size[k]);
                    let inside = d.checked_add(len).is_some_and(|end| capacity.is_none_or(|c| end <= c));
                    let addr = base.wrapping_add(d);
                    if !inside || (len > 0 && !client.is_registered(addr, len)) {
                        invalid(format!(
                            "{what}: buffer {i}, key {key:?}, range {k}: [{addr:#x}, +{len}) is not registered memory"
                        ));
                        continue;
                    }
                    if len == 0 {
                        results[i][j][k] = 0;
                        continue;
                    }
                    ranges[slot].push((Extent { offset: src[k], addr, len }, (i, j, k)));
                }
            }
        }
        let wanted: Vec<usize> = (0..keys.len()).filter(|&s| !ranges[s].is_empty()).collect();
        let outcome = py.detach(|| ranged_reads(&*client, &keys, &ranges, &wanted));
        for (slot, r) in outcome {
            for (&(e, (i, j, k)), r) in ranges[slot].iter().zip(r) {
                results[i][j][k] = r.map_or_else(|code| code as i64, |()| e.len as i64);
            }
        }
        Ok(results)
    }

    /// batch_get_session_start(keys) -> list[int]: starts a get session per key — its replicas
    /// asked once (one master round trip) and kept, with their read lease, for
    /// `batch_get_into_multi_buffer_ranges` — until `batch_get_session_end` or the lease's end.
    /// 0 per key, or a negative code: OBJECT_NOT_FOUND, INVALID_REPLICA (no replica in
    /// memory)... A key's previous session is replaced. Before setup: [].
    fn batch_get_session_start(&self, py: Python<'_>, keys: Vec<String>) -> Vec<i64> {
        crescent_ffi::clear_last_error();
        let Some(client) = self.client() else {
            not_set_up("batch_get_session_start");
            return Vec::new();
        };
        if keys.is_empty() {
            return Vec::new();
        }
        session_codes(py.detach(|| client.batch_get_session_start(&keys)), keys.len(), |()| 0)
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
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        all_buffer_ptrs: &Bound<'_, PyAny>,
        all_sizes: Vec<Vec<u64>>,
        all_src_offsets: Vec<Vec<u64>>,
    ) -> PyResult<Vec<i64>> {
        crescent_ffi::clear_last_error();
        let what = "batch_get_into_multi_buffer_ranges";
        let Some(client) = self.client() else {
            not_set_up(what);
            return Ok(Vec::new());
        };
        let mut keep = Vec::new();
        let (mut results, ranges) =
            session_ranges(&*client, what, &keys, all_buffer_ptrs, &all_sizes, &all_src_offsets, true, &mut keep)?;
        py.detach(|| {
            on_accepted(&mut results, &keys, ranges, |keys, ranges| {
                let refs: Vec<&[Extent]> = ranges.iter().map(|r| &r[..]).collect();
                let codes = session_codes(client.batch_get_into_session_ranges(keys, &refs), keys.len(), |n| n as i64);
                codes.into_iter().map(|c| if c < 0 { Err(c as i32) } else { Ok(c as u64) }).collect()
            })
        });
        Ok(results.into_iter().map(|r| r.map_or_else(|code| code as i64, |n| n as i64)).collect())
    }

    /// batch_get_session_end(keys) -> int: ends the get sessions of `keys` (keys without one
    /// are fine); 0. Before setup: -1, as Mooncake's binding answers.
    fn batch_get_session_end(&self, py: Python<'_>, keys: Vec<String>) -> i32 {
        crescent_ffi::clear_last_error();
        let Some(client) = self.client() else {
            fail(Status::Internal, "batch_get_session_end: the store is not set up (call setup() first) or was closed");
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
        crescent_ffi::clear_last_error();
        let what = "batch_put_session_start";
        let Some(client) = self.client() else {
            not_set_up(what);
            return Vec::new();
        };
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
        &self,
        py: Python<'_>,
        keys: Vec<String>,
        all_buffer_ptrs: &Bound<'_, PyAny>,
        all_sizes: Vec<Vec<u64>>,
        all_dst_offsets: Vec<Vec<u64>>,
    ) -> PyResult<Vec<i64>> {
        crescent_ffi::clear_last_error();
        let what = "batch_put_from_multi_buffer_ranges";
        let Some(client) = self.client() else {
            not_set_up(what);
            return Ok(Vec::new());
        };
        let mut keep = Vec::new();
        let (mut results, ranges) =
            session_ranges(&*client, what, &keys, all_buffer_ptrs, &all_sizes, &all_dst_offsets, false, &mut keep)?;
        py.detach(|| {
            on_accepted(&mut results, &keys, ranges, |keys, ranges| {
                let refs: Vec<&[Extent]> = ranges.iter().map(|r| &r[..]).collect();
                let codes = session_codes(client.batch_put_from_session_ranges(keys, &refs), keys.len(), |n| n as i64);
                codes.into_iter().map(|c| if c < 0 { Err(c as i32) } else { Ok(c as u64) }).collect()
            })
        });
        Ok(results.into_iter().map(|r| r.map_or_else(|code| code as i64, |n| n as i64)).collect())
    }

    /// batch_put_session_end(keys) -> list[int]: commits the objects of the put sessions of
    /// `keys` (one master round trip; ranged writes in flight are waited for) and ends the
    /// sessions. 0 per key, or a negative code: INVALID_PARAMS without a session (never
    /// started, ended already); the master's answer otherwise (OBJECT_NOT_FOUND once it has
    /// dropped the placement), and then the session stays for another end or a revoke.
    /// Before setup: [].
    fn batch_put_session_end(&self, py: Python<'_>, keys: Vec<String>) -> Vec<i64> {
        crescent_ffi::clear_last_error();
        let Some(client) = self.client() else {
            not_set_up("batch_put_session_end");
            return Vec::new();
        };
        session_codes(py.detach(|| client.batch_put_session_end(&keys)), keys.len(), |()| 0)
    }

    /// batch_put_session_revoke(keys) -> list[int]: gives back the space of the put sessions
    /// of `keys` (one master round trip; ranged writes in flight are waited for) and ends the
    /// sessions; nothing is stored. 0 per key (also when the master had dropped the placement),
    /// INVALID_PARAMS without a session, else the master's answer (the session stays).
    /// Before setup: [].
    fn batch_put_session_revoke(&self, py: Python<'_>, keys: Vec<String>) -> Vec<i64> {
        crescent_ffi::clear_last_error();
        let Some(client) = self.client() else {
            not_set_up("batch_put_session_revoke");
            return Vec::new();
        };
        session_codes(py.detach(|| client.batch_put_session_revoke(&keys)), keys.len(), |()| 0)
    }

    /// put_parts(key, *parts, config=None) -> int: puts the concatenation of `parts`
    /// (buffer objects: bytes, bytearray, memoryview, numpy arrays) as one value, copied once
    /// as a byte put copies it; 0 or a negative code (no bytes at all: 0, nothing stored, as
    /// in Mooncake). A put of an existing key keeps its value and returns 0.
    #[pyo3(signature = (key, *parts, config=None))]
    fn put_parts(
        &self,
        py: Python<'_>,
        key: &str,
        parts: &Bound<'_, pyo3::types::PyTuple>,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> PyResult<i32> {
        self.parts_one(py, "put_parts", key, parts, config.as_deref(), false)
    }

    /// upsert_parts(key, *parts, config=None) -> int: `put_parts` that replaces the key's
    /// value if it has one.
    #[pyo3(signature = (key, *parts, config=None))]
    fn upsert_parts(
        &self,
        py: Python<'_>,
        key: &str,
        parts: &Bound<'_, pyo3::types::PyTuple>,
        config: Option<PyRef<'_, PyReplicateConfig>>,
    ) -> PyResult<i32> {
        self.parts_one(py, "upsert_parts", key, parts, config.as_deref(), true)
    }

    /// is_exist(key) -> int: 1 if the key exists, 0 if not, a negative code on error. Grants
    /// no lease.
    fn is_exist(&self, py: Python<'_>, key: &str) -> i32 {
        crescent_ffi::clear_last_error();
        let Some(client) = self.client() else { return not_set_up("is_exist") };
        match py.detach(|| client.exists(key)) {
            Ok(b) => i32::from(b),
            Err(e) => store_fail(&e).code(),
        }
    }

    /// batch_is_exist(keys) -> list[int]: 1 / 0 per key, a negative code for every key if the
    /// call failed.
    fn batch_is_exist(&self, py: Python<'_>, keys: Vec<String>) -> Vec<i32> {
        crescent_ffi::clear_last_error();
        let Some(client) = self.client() else { return per_key(keys.len(), not_set_up("batch_is_exist")) };
        if keys.is_empty() {
            return Vec::new();
        }
        match py.detach(|| client.batch_exists(&keys)) {
            Ok(v) if v.len() == keys.len() => v.into_iter().map(i32::from).collect(),
            Ok(v) => per_key(
                keys.len(),
                fail(Status::Internal, format!("{} answers for {} keys", v.len(), keys.len())).code(),
            ),
            Err(e) => per_key(keys.len(), store_fail(&e).code()),
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

    /// get_replica_desc(key) -> list[ReplicaDescriptor]: the key's replicas ([] if it is
    /// missing or the query failed). Grants no lease.
    fn get_replica_desc(&self, py: Python<'_>, key: &str) -> Vec<PyReplicaDescriptor> {
        crescent_ffi::clear_last_error();
        let Some(client) = self.client() else {
            not_set_up("get_replica_desc");
            return Vec::new();
        };
        match py.detach(|| client.query(key)) {
            Ok(q) if q.exists => q.replicas.iter().map(replica_descriptor).collect(),
            Ok(_) => {
                fail(Status::ObjectNotFound, format!("object {key:?} not found"));
                Vec::new()
            }
            Err(e) => {
                store_fail(&e);
                Vec::new()
            }
        }
    }

    /// batch_get_replica_desc(keys) -> dict[str, list[ReplicaDescriptor]]: the replicas of
    /// each key that exists (missing keys are left out, as in Mooncake).
    fn batch_get_replica_desc(&self, py: Python<'_>, keys: Vec<String>) -> HashMap<String, Vec<PyReplicaDescriptor>> {
        crescent_ffi::clear_last_error();
        let Some(client) = self.client() else {
            not_set_up("batch_get_replica_desc");
            return HashMap::new();
        };
        let answers = py.detach(|| keys.iter().map(|k| (k.clone(), client.query(k))).collect::<Vec<_>>());
        let mut out = HashMap::new();
        for (key, answer) in answers {
            match answer {
                Ok(q) if q.exists => {
                    out.insert(key, q.replicas.iter().map(replica_descriptor).collect());
                }
                Ok(_) => {
                    fail(Status::ObjectNotFound, format!("object {key:?} not found"));
                }
                Err(e) => {
                    store_fail(&e);
                }
            }
        }
        out
    }

    /// remove(key, force=False) -> int: 0, or a negative error code (-706 while a reader
    /// holds a lease, unless `force`).
    #[pyo3(signature = (key, force=false))]
    fn remove(&self, py: Python<'_>, key: &str, force: bool) -> i32 {
        crescent_ffi::clear_last_error();
        let Some(client) = self.client() else { return not_set_up("remove") };
        match py.detach(|| client.remove_with(key, force)) {
            Ok(()) => 0,
            Err(e) => store_fail(&e).code(),
        }
    }

    /// batch_remove(keys, force=False) -> list[int]: a status per key, as `remove`.
    #[pyo3(signature = (keys, force=false))]
    fn batch_remove(&self, py: Python<'_>, keys: Vec<String>, force: bool) -> Vec<i32> {
        crescent_ffi::clear_last_error();
        let Some(client) = self.client() else { return per_key(keys.len(), not_set_up("batch_remove")) };
        let rs = py.detach(|| keys.iter().map(|k| client.remove_with(k, force)).collect::<Vec<_>>());
        put_statuses(&rs)
    }

    /// remove_by_regex(regex_pattern, force=False) -> int: how many objects were removed, or
    /// a negative error code.
    #[pyo3(signature = (regex_pattern, force=false))]
    fn remove_by_regex(&self, py: Python<'_>, regex_pattern: &str, force: bool) -> i64 {
        crescent_ffi::clear_last_error();
        let Some(client) = self.client() else { return not_set_up("remove_by_regex") as i64 };
        match py.detach(|| client.remove_by_regex_with(regex_pattern, force)) {
            Ok(n) => n as i64,
            Err(e) => store_fail(&e).code() as i64,
        }
    }

    /// remove_all(force=False) -> int: how many objects were removed, or a negative error
    /// code.
    #[pyo3(signature = (force=false))]
    fn remove_all(&self, py: Python<'_>, force: bool) -> i64 {
        crescent_ffi::clear_last_error();
        let Some(client) = self.client() else { return not_set_up("remove_all") as i64 };
        match py.detach(|| client.remove_all_with(force)) {
            Ok(n) => n as i64,
            Err(e) => store_fail(&e).code() as i64,
        }
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

/// _fail_invalid(message) -> int: records `message` as this thread's last error and returns
/// INVALID_PARAMS (for the package's Python methods).
#[pyfunction]
fn _fail_invalid(message: &str) -> i32 {
    invalid(message)
}

/// status_name(code) -> str: Mooncake's name of a status code ("OBJECT_NOT_FOUND", ...).
#[pyfunction]
fn status_name(code: i32) -> &'static str {
    Status::from_code(code).map_or("UNKNOWN", Status::name)
}

mod device;
mod dummy;
mod engine;

#[pymodule]
fn _crescent(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Store>()?;
    m.add_class::<PyReplicateConfig>()?;
    m.add_class::<PySoftPinAction>()?;
    m.add_class::<PyObjectDataType>()?;
    m.add_class::<PyReplicaStatus>()?;
    m.add_class::<PyReplicaDescriptor>()?;
    m.add_class::<PyMemoryDescriptor>()?;
    m.add_class::<PyDiskDescriptor>()?;
    m.add_class::<PyBufferDescriptor>()?;
    m.add_class::<PyBufferHandle>()?;
    engine::add_classes(m)?;
    m.add_function(wrap_pyfunction!(last_error, m)?)?;
    m.add_function(wrap_pyfunction!(status_name, m)?)?;
    m.add_function(wrap_pyfunction!(_fail_invalid, m)?)?;
    for s in Status::ALL {
        m.add(s.name(), s.code())?;
    }
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
