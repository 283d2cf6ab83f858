//! Memory between Python and the store: values handed out (`bytes` written in place) and
//! memory handed in (int addresses or buffer objects, exported for a call), with the argument
//! checks of the store calls that take memory.

use std::mem::MaybeUninit;

use crescent_ffi::store::client::{Extent, Piece};
use crescent_ffi::store::{StoreApi, StoreError, ValueSink};
use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::{device, invalid};

// ---- values handed out to Python ----

/// A get's `bytes` object, made once the value's size is known and written by the get while
/// the GIL is released. Nothing in Python can reach the object until the get returns it
/// (`get` returns it only after a get that succeeded), so writing the bytes of an immutable
/// `bytes` object is safe here: CPython's `PyBytes_FromStringAndSize(NULL, n)` is made for
/// exactly this. pyo3's `PyBytes::new_with` is not used: it zeroes the buffer before handing
/// it over (`write_bytes(buffer, 0, len)` in pyo3 0.30's `types/bytes.rs`), a pass over the
/// value that faults its fresh pages in on the calling thread, which the get exists to avoid.
#[derive(Default)]
pub(crate) struct BytesSink {
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
    pub(crate) fn into_bytes(self, py: Python<'_>) -> Bound<'_, PyBytes> {
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
pub(crate) struct Exported {
    view: Box<pyo3::ffi::Py_buffer>,
}

// SAFETY: the view is only read (its `buf` and `len`) after the export; the export holds a
// strong reference to the exporter, and it is released with the interpreter attached (Drop),
// from whichever thread drops it.
unsafe impl Send for Exported {}
// SAFETY: shared access only reads plain fields of the view.
unsafe impl Sync for Exported {}

impl Exported {
    pub(crate) fn new(obj: &Bound<'_, PyAny>, writable: bool) -> PyResult<Self> {
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

    pub(crate) fn addr(&self) -> u64 {
        self.view.buf as u64
    }

    pub(crate) fn len(&self) -> u64 {
        self.view.len.max(0) as u64
    }

    /// The bytes, for reading during a call that holds this export.
    pub(crate) fn bytes(&self) -> &[u8] {
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

/// Memory given as an int address (Mooncake's convention), a buffer object, or an array
/// offering its address (`__cuda_array_interface__` or DLPack; device memory included): what
/// the engine's and the store's calls take.
pub(crate) enum Mem {
    Addr(u64),
    Buffer(Exported),
    Array(device::DeviceArray),
}

impl Mem {
    /// An int address, a buffer object, or an array by address (device memory included).
    pub(crate) fn any(obj: &Bound<'_, PyAny>, writable: bool, what: &str) -> PyResult<Self> {
        // First: a CUDA array (a torch tensor has `__index__` too, for one-item tensors).
        if let Some(array) = device::from_cuda_array_interface(obj, writable, what)? {
            return Ok(Mem::Array(array));
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
        if let Some(array) = device::from_dlpack(obj, what)? {
            return Ok(Mem::Array(array));
        }
        let name = obj.get_type().name().map(|n| n.to_string()).unwrap_or_default();
        Err(PyTypeError::new_err(format!(
            "{what}: expected an int address, an object with the buffer protocol (bytearray, memoryview, numpy \
             array), __cuda_array_interface__ or DLPack (torch, cupy), not {name}"
        )))
    }

    pub(crate) fn addr(&self) -> u64 {
        match self {
            Mem::Addr(a) => *a,
            Mem::Buffer(b) => b.addr(),
            Mem::Array(a) => a.addr(),
        }
    }

    /// Whether it holds an object that must stay alive while its memory is registered.
    pub(crate) fn holds_object(&self) -> bool {
        !matches!(self, Mem::Addr(_))
    }

    /// The length to use: `size` if given (at most the buffer's length), else the buffer's.
    pub(crate) fn size(&self, size: Option<u64>, what: &str) -> PyResult<u64> {
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

/// Memory for a list of buffers with optional sizes, each one of the objects [`Mem::any`] takes.
pub(crate) fn mems(
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
        let m = Mem::any(obj, writable, &what)?;
        lens.push(m.size(sizes.as_ref().map(|s| s[i]), &what)?);
        out.push(m);
    }
    Ok((out, lens))
}

/// Memory of a store call: an int address or a buffer object, and its size (the buffer's
/// length when none is given). A size larger than a buffer object is the caller's mistake,
/// reported as INVALID_PARAMS like Mooncake's other argument checks.
pub(crate) fn store_mem(
    obj: &Bound<'_, PyAny>,
    size: Option<u64>,
    writable: bool,
    what: &str,
) -> PyResult<Result<(Mem, u64), i32>> {
    let mem = Mem::any(obj, writable, what)?;
    Ok(match (&mem, size) {
        (Mem::Addr(_), None) => Err(invalid(format!("{what}: a size is required with an int address"))),
        (Mem::Buffer(b), Some(n)) if n > b.len() => {
            Err(invalid(format!("{what}: size {n} is larger than the buffer ({} bytes)", b.len())))
        }
        (Mem::Buffer(b), None) => {
            let n = b.len();
            Ok((mem, n))
        }
        // A tensor by address (device memory included): sized as a buffer would be.
        (Mem::Array(a), Some(n)) if n > a.len() => {
            Err(invalid(format!("{what}: size {n} is larger than the array ({} bytes)", a.len())))
        }
        (Mem::Array(a), None) => {
            let n = a.len();
            Ok((mem, n))
        }
        (_, Some(n)) => Ok((mem, n)),
    })
}

/// Memory of a batch call and the size of each.
pub(crate) type Mems = (Vec<Mem>, Vec<u64>);

/// The memory of a batch call: one buffer (and size, when given) per key. Lists of other
/// lengths are INVALID_PARAMS for every key, as in Mooncake.
pub(crate) fn store_mems(
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
pub(crate) fn exported_values(values: &Bound<'_, PyAny>) -> PyResult<Vec<Exported>> {
    values.try_iter()?.map(|v| v.and_then(|v| Exported::new(&v, false))).collect()
}

/// The items of a Python list (any iterable).
pub(crate) fn items<'py>(list: &Bound<'py, PyAny>) -> PyResult<Vec<Bound<'py, PyAny>>> {
    list.try_iter()?.collect()
}

/// One key's memory in a multi-buffer call: its buffers (int addresses or buffer objects, kept
/// exported in `keep`) and their sizes as pieces of registered memory, in order; empty pieces
/// are dropped. Memory that is not registered, or a size larger than a buffer object, refuses
/// the key with INVALID_PARAMS.
pub(crate) fn key_pieces(
    client: &dyn StoreApi,
    ptrs: &[Bound<'_, PyAny>],
    sizes: &[u64],
    writable: bool,
    keep: &mut Vec<Mem>,
    key: &str,
) -> PyResult<Result<Vec<Piece>, i32>> {
    let mut pieces = Vec::with_capacity(ptrs.len());
    for (j, (obj, &size)) in ptrs.iter().zip(sizes).enumerate() {
        match registered(client, obj, size, writable, keep, &format!("{key:?}: buffer {j}"))? {
            Ok((_, 0)) => {}
            Ok((addr, len)) => pieces.push(Piece::new(addr, len)),
            Err(code) => return Ok(Err(code)),
        }
    }
    Ok(Ok(pieces))
}

/// One key's ranges in a ranged session call: buffer `j` (an int address or a buffer object,
/// kept exported in `keep`) takes or gives `sizes[j]` bytes at `offsets[j]` of the value.
/// Lists of other lengths, memory that is not registered or a size larger than a buffer
/// object refuse the key with INVALID_PARAMS. Empty ranges move nothing.
#[allow(clippy::too_many_arguments)]
pub(crate) fn key_ranges(
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
        match registered(client, obj, sizes[j], writable, keep, &format!("{what}: {key:?}: buffer {j}"))? {
            Ok((_, 0)) => {}
            Ok((addr, len)) => extents.push(Extent { offset: offsets[j], addr, len }),
            Err(code) => return Ok(Err(code)),
        }
    }
    Ok(Ok(extents))
}

/// Buffer `label` of a key (an int address or a buffer object, kept exported in `keep` once
/// accepted) of `size` bytes: its address and length. A size larger than a buffer object, or
/// memory that is not registered, refuses the key with INVALID_PARAMS; an empty buffer is
/// accepted as it is.
fn registered(
    client: &dyn StoreApi,
    obj: &Bound<'_, PyAny>,
    size: u64,
    writable: bool,
    keep: &mut Vec<Mem>,
    label: &str,
) -> PyResult<Result<(u64, u64), i32>> {
    let (mem, len) = match store_mem(obj, Some(size), writable, label)? {
        Ok(m) => m,
        Err(code) => return Ok(Err(code)),
    };
    let addr = mem.addr();
    if len > 0 && !client.is_registered(addr, len) {
        let message = format!("{label} [{addr:#x}, +{len}) is not registered memory (register_buffer first)");
        return Ok(Err(invalid(message)));
    }
    keep.push(mem);
    Ok(Ok((addr, len)))
}
