//! Arrays handed in by their device pointer: objects with `__cuda_array_interface__` (CUDA
//! tensors of torch, cupy, numba) and DLPack exporters (`__dlpack__` / `__dlpack_device__`),
//! read without importing any framework. Each gives its first byte's address and its length in
//! bytes; it must be C-contiguous. The object (or the DLPack capsule, which keeps the tensor
//! alive) is held for as long as the address is in use.

use std::ffi::{c_void, CStr};

use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

/// The attribute of the CUDA Array Interface.
const CAI: &str = "__cuda_array_interface__";
/// A DLPack capsule not consumed yet (the legacy, unversioned `DLManagedTensor`).
const DLTENSOR: &CStr = c"dltensor";

/// DLPack's CUDA device type (`kDLCUDA`): memory of a CUDA device.
const DL_CUDA: i32 = 2;
/// DLPack's device types Crescent takes: memory the engine can register — host memory
/// (`kDLCPU`, 1), a CUDA device's (`kDLCUDA`), pinned (`kDLCUDAHost`, 3) or managed
/// (`kDLCUDAManaged`, 13) memory.
const DL_REGISTRABLE: [i32; 4] = [1, DL_CUDA, 3, 13];

/// `DLDevice`.
#[repr(C)]
struct DlDevice {
    device_type: i32,
    _device_id: i32,
}

/// `DLDataType`.
#[repr(C)]
struct DlDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

/// `DLTensor`, the first member of the `DLManagedTensor` a `dltensor` capsule points to.
#[repr(C)]
struct DlTensor {
    data: *mut c_void,
    device: DlDevice,
    ndim: i32,
    dtype: DlDataType,
    shape: *const i64,
    strides: *const i64,
    byte_offset: u64,
}

/// An array's memory, given by its address: the object that keeps it alive, held.
pub(crate) struct DeviceArray {
    addr: u64,
    len: u64,
    /// The array says its memory is a GPU's (CUDA Array Interface, DLPack's `kDLCUDA`).
    on_device: bool,
    _owner: Py<PyAny>,
}

impl DeviceArray {
    pub(crate) fn addr(&self) -> u64 {
        self.addr
    }

    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// Whether the array says its memory is a GPU's (not host, pinned or managed memory).
    pub(crate) fn on_device(&self) -> bool {
        self.on_device
    }
}

/// `obj`'s memory through `__cuda_array_interface__`; `None` when it has none.
pub(crate) fn from_cuda_array_interface(
    obj: &Bound<'_, PyAny>,
    writable: bool,
    what: &str,
) -> PyResult<Option<DeviceArray>> {
    let interface = match obj.getattr(CAI) {
        Ok(i) => i,
        Err(e) if e.is_instance_of::<pyo3::exceptions::PyAttributeError>(obj.py()) => return Ok(None),
        Err(e) => return Err(e),
    };
    let bad = |why: &str| PyTypeError::new_err(format!("{what}: __cuda_array_interface__ {why}"));
    let interface = interface.cast_into::<PyDict>().map_err(|_| bad("is not a dict"))?;
    let item = |key: &str| interface.get_item(key);
    let data = item("data")?.ok_or_else(|| bad("has no 'data'"))?;
    let data = data.cast_into::<PyTuple>().map_err(|_| bad("'data' is not a (pointer, read-only) tuple"))?;
    if data.len() != 2 {
        return Err(bad("'data' is not a (pointer, read-only) tuple"));
    }
    let addr: u64 = data.get_item(0)?.extract().map_err(|_| bad("'data' pointer is not an int"))?;
    let readonly: bool = data.get_item(1)?.is_truthy()?;
    if let Some(mask) = item("mask")? {
        if !mask.is_none() {
            return Err(PyBufferError::new_err(format!("{what}: a masked array is not contiguous memory")));
        }
    }
    let shape: Vec<u64> = item("shape")?
        .ok_or_else(|| bad("has no 'shape'"))?
        .extract()
        .map_err(|_| bad("'shape' is not a tuple of non-negative ints"))?;
    let typestr: String = item("typestr")?
        .ok_or_else(|| bad("has no 'typestr'"))?
        .extract()
        .map_err(|_| bad("'typestr' is not a str"))?;
    let itemsize: u64 = typestr
        .get(2..)
        .and_then(|n| n.parse().ok())
        .filter(|&n| n > 0)
        .ok_or_else(|| bad(&format!("'typestr' {typestr:?} has no item size")))?;
    let strides: Option<Vec<i64>> = match item("strides")? {
        Some(s) if !s.is_none() => Some(s.extract().map_err(|_| bad("'strides' is not a tuple of ints"))?),
        _ => None,
    };
    let len = contiguous_len(&shape, strides.as_deref(), itemsize, 1, what)?;
    if readonly && writable {
        return Err(PyBufferError::new_err(format!("{what}: the array is read-only, and this call writes into it")));
    }
    Ok(Some(DeviceArray { addr, len, on_device: true, _owner: obj.clone().unbind() }))
}

/// `obj`'s memory through DLPack (`__dlpack_device__`, then `__dlpack__()`); `None` when it has
/// no `__dlpack__`.
pub(crate) fn from_dlpack(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Option<DeviceArray>> {
    if !obj.hasattr("__dlpack__")? {
        return Ok(None);
    }
    let bad = |why: String| PyTypeError::new_err(format!("{what}: DLPack {why}"));
    if obj.hasattr("__dlpack_device__")? {
        let (device_type, _id): (i32, i32) = obj
            .call_method0("__dlpack_device__")?
            .extract()
            .map_err(|_| bad("__dlpack_device__() is not a (type, id) tuple".into()))?;
        if !DL_REGISTRABLE.contains(&device_type) {
            return Err(bad(format!(
                "device type {device_type} is not host or CUDA memory (DLPack types 1, 2, 3 and 13 are taken)"
            )));
        }
    }
    let capsule = obj.call_method0("__dlpack__")?;
    // SAFETY: the interpreter is attached (we hold `capsule`); the call only reads the object.
    if unsafe { pyo3::ffi::PyCapsule_IsValid(capsule.as_ptr(), DLTENSOR.as_ptr()) } == 0 {
        return Err(bad("__dlpack__() did not return an unconsumed 'dltensor' capsule".into()));
    }
    // SAFETY: a valid capsule of that name (checked above): its pointer is the producer's
    // `DLManagedTensor`, alive while the capsule is (the capsule's destructor frees it, since it
    // is never renamed 'used_dltensor' here).
    let tensor = unsafe { pyo3::ffi::PyCapsule_GetPointer(capsule.as_ptr(), DLTENSOR.as_ptr()) };
    if tensor.is_null() {
        return Err(PyErr::fetch(obj.py()));
    }
    // SAFETY: `DLManagedTensor` begins with its `DLTensor`, which the producer filled in.
    let t = unsafe { &*tensor.cast::<DlTensor>() };
    if !DL_REGISTRABLE.contains(&t.device.device_type) {
        return Err(bad(format!("device type {} is not host or CUDA memory", t.device.device_type)));
    }
    let ndim = usize::try_from(t.ndim).map_err(|_| bad(format!("ndim {}", t.ndim)))?;
    let bits = u64::from(t.dtype.bits) * u64::from(t.dtype.lanes);
    if bits == 0 || bits % 8 != 0 {
        return Err(bad(format!(
            "items of {} bits (code {}, {} lanes) are not whole bytes",
            t.dtype.bits, t.dtype.code, t.dtype.lanes
        )));
    }
    let read = |p: *const i64| -> PyResult<Vec<i64>> {
        if ndim == 0 {
            return Ok(Vec::new());
        }
        if p.is_null() {
            return Err(bad("shape is null".into()));
        }
        // SAFETY: DLPack's shape and strides arrays hold `ndim` values, alive with the tensor.
        Ok(unsafe { std::slice::from_raw_parts(p, ndim) }.to_vec())
    };
    let shape = read(t.shape)?;
    let shape: Vec<u64> = shape
        .iter()
        .map(|&d| u64::try_from(d))
        .collect::<Result<_, _>>()
        .map_err(|_| bad(format!("shape {shape:?}")))?;
    // DLPack's strides count items, not bytes; null means C-contiguous.
    let strides = if t.strides.is_null() { None } else { Some(read(t.strides)?) };
    let len = contiguous_len(&shape, strides.as_deref(), bits / 8, (bits / 8) as i64, what)?;
    let addr = (t.data as u64)
        .checked_add(t.byte_offset)
        .ok_or_else(|| PyValueError::new_err(format!("{what}: DLPack data pointer plus byte_offset overflows")))?;
    let on_device = t.device.device_type == DL_CUDA;
    Ok(Some(DeviceArray { addr, len, on_device, _owner: capsule.unbind() }))
}

/// The length in bytes of an array of `shape` whose items are `itemsize` bytes, refused unless
/// `strides` (in units of `unit` bytes; `None`: C-contiguous) describe C-contiguous memory.
fn contiguous_len(shape: &[u64], strides: Option<&[i64]>, itemsize: u64, unit: i64, what: &str) -> PyResult<u64> {
    let too_large = || PyValueError::new_err(format!("{what}: an array of shape {shape:?} is too large"));
    let items = shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d)).ok_or_else(too_large)?;
    let len = items.checked_mul(itemsize).ok_or_else(too_large)?;
    let Some(strides) = strides else { return Ok(len) };
    if strides.len() != shape.len() {
        return Err(PyTypeError::new_err(format!("{what}: {} strides for {} dimensions", strides.len(), shape.len())));
    }
    if items == 0 {
        return Ok(0);
    }
    // Expected, from the last dimension: each stride the product of the later extents.
    let mut expected = itemsize as i128;
    for (&d, &s) in shape.iter().zip(strides).rev() {
        if d != 1 && i128::from(s) * i128::from(unit) != expected {
            return Err(PyBufferError::new_err(format!(
                "{what}: the array is not C-contiguous (shape {shape:?}, strides {strides:?})"
            )));
        }
        expected *= i128::from(d);
    }
    Ok(len)
}
