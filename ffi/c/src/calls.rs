//! The wrapper of every call: the last error cleared, an error returned as its status and a
//! panic caught as `CRESCENT_ERR_INTERNAL`.

use std::panic::{catch_unwind, AssertUnwindSafe};

use crescent_ffi::{clear_last_error, fail, Status};

use crate::R;

/// Runs `f`, turning an error into its status and a panic into `CRESCENT_ERR_INTERNAL`.
pub(crate) fn call(f: impl FnOnce() -> R<i64>) -> i64 {
    clear_last_error();
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(status)) => status.code() as i64,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            fail(Status::Internal, format!("internal error (panic): {what}")).code() as i64
        }
    }
}

/// [`call`] for functions that return a status.
pub(crate) fn status(f: impl FnOnce() -> R<()>) -> i32 {
    call(|| f().map(|()| 0)) as i32
}
