//! The wrapper of every call: the last error cleared, the handle resolved, an error returned
//! as its status and a panic caught as `CRESCENT_ERR_INTERNAL`.

use crescent_ffi::{fail, raw, Status};

use crescent_ffi::store::StoreClient;

use crate::handles::{engine_of, store_of, EngineState};
use crate::{CrescentEngine, CrescentStore, R};

/// Runs `f`, turning an error into its status and a panic into `CRESCENT_ERR_INTERNAL`.
pub(crate) fn call(f: impl FnOnce() -> R<i64>) -> i64 {
    match raw::guarded(f) {
        Ok(Ok(v)) => v,
        Ok(Err(status)) => status.code() as i64,
        Err(message) => fail(Status::Internal, message).code() as i64,
    }
}

/// [`call`] for functions that return a status.
pub(crate) fn status(f: impl FnOnce() -> R<()>) -> i32 {
    call(|| f().map(|()| 0)) as i32
}

/// The preamble of the engine calls that return an integer, written once: [`call`] with the
/// engine's handle resolved.
pub(crate) fn engine_call(engine: *const CrescentEngine, f: impl FnOnce(&EngineState) -> R<i64>) -> i64 {
    call(|| f(&*engine_of(engine)?))
}

/// The preamble of the engine calls that return a status: [`status`] with the engine's handle
/// resolved.
pub(crate) fn engine_status(engine: *const CrescentEngine, f: impl FnOnce(&EngineState) -> R<()>) -> i32 {
    status(|| f(&*engine_of(engine)?))
}

/// The preamble of the store calls that return an integer: [`call`] with the client's handle
/// resolved.
pub(crate) fn store_call(store: *const CrescentStore, f: impl FnOnce(&StoreClient) -> R<i64>) -> i64 {
    call(|| f(&*store_of(store)?))
}

/// The preamble of the store calls that return a status: [`status`] with the client's handle
/// resolved.
pub(crate) fn store_status(store: *const CrescentStore, f: impl FnOnce(&StoreClient) -> R<()>) -> i32 {
    status(|| f(&*store_of(store)?))
}
