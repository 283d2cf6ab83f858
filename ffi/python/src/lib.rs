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

mod call;
mod device;
mod dummy;
mod engine;
mod enums;
mod host;
mod mem;
mod ranges;
mod rpc;
mod segment;
mod sessions;
mod store;
mod tasks;
mod twins;
mod types;

use enums::*;
use mem::{mems, Exported, Mem};
use store::Store;
use types::*;

use crescent_ffi::{fail, Status};
use pyo3::prelude::*;

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

/// A recorded code as its status.
fn status(code: i32) -> Status {
    Status::from_code(code).unwrap_or(Status::Internal)
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

/// _is_registered(store, addr, len) -> bool: whether `[addr, +len)` lies in memory registered
/// with `store`'s client (the tensor methods' choice between the caller's registration and one
/// of their own for the call); False before setup.
#[pyfunction]
fn _is_registered(store: PyRef<'_, Store>, addr: u64, len: u64) -> bool {
    store.client().is_some_and(|c| c.is_registered(addr, len))
}

/// _register_source(store, addr, len) -> int: registers `[addr, +len)` for the puts the
/// tensor methods make from a tensor's own memory (no pages made resident: they hold the
/// tensor's bytes already); 0 or a negative code, the reason in last_error().
#[pyfunction]
fn _register_source(py: Python<'_>, store: PyRef<'_, Store>, addr: u64, len: u64) -> i32 {
    crescent_ffi::clear_last_error();
    let Some(client) = store.client() else { return not_set_up("_register_source") };
    match py.detach(|| client.register_source(addr, len)) {
        Ok(()) => 0,
        Err(e) => crescent_ffi::store_fail(&e).code(),
    }
}

/// status_name(code) -> str: Mooncake's name of a status code ("OBJECT_NOT_FOUND", ...).
#[pyfunction]
fn status_name(code: i32) -> &'static str {
    Status::from_code(code).map_or("UNKNOWN", Status::name)
}

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
    host::add(m)?;
    rpc::add(m)?;
    segment::add(m)?;
    tasks::add(m)?;
    m.add_function(wrap_pyfunction!(last_error, m)?)?;
    m.add_function(wrap_pyfunction!(status_name, m)?)?;
    m.add_function(wrap_pyfunction!(_fail_invalid, m)?)?;
    m.add_function(wrap_pyfunction!(_is_registered, m)?)?;
    m.add_function(wrap_pyfunction!(_register_source, m)?)?;
    for s in Status::ALL {
        m.add(s.name(), s.code())?;
    }
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
