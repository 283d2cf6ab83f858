//! The engine's small Python classes: `TransferOpcode`, `TransferNotify` and what
//! `get_engine()` returns.

use std::sync::Arc;

use crescent_ffi::engine::{Notification, Opcode, TransferEngine};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

use super::Engine;

/// Mooncake's `TransferOpcode`: `Read` (0) pulls remote bytes, `Write` (1) pushes local ones.
#[pyclass(module = "crescent._crescent", name = "TransferOpcode", eq, eq_int, frozen, hash)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum PyOpcode {
    Read = 0,
    Write = 1,
}

impl PyOpcode {
    pub(super) fn extract(obj: &Bound<'_, PyAny>) -> PyResult<Opcode> {
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
    pub(super) name: String,
    pub(super) msg: String,
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
    pub(super) _engine: Arc<TransferEngine>,
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
