//! What Crescent's two foreign interfaces share, so that neither holds logic of its own:
//!
//! * [`Status`]: Mooncake's numeric status codes (0 success, negative errors) and the mapping of
//!   the store's and the engine's typed errors onto them;
//! * a per-thread last-error message that both bindings expose next to a status code;
//! * [`SetupArgs`]: Mooncake's `setup(...)` arguments (positional or as a dict) turned into a
//!   [`ClientConfig`];
//! * [`ReplicateConfig`]: Mooncake's per-put replica count, pins and preferred segments;
//! * [`TeCode`]: Mooncake Transfer Engine's own return codes (`ERR_*`, `Status::Code`) for the
//!   engine's C and Python interfaces;
//! * [`methods`]: the table of the store methods of both bindings (a row per method: its ops
//!   and its return shape) and the one function that runs a row;
//! * [`raw`]: the C interfaces' calls run with panics caught, and their raw arrays checked;
//! * [`init_logging`]: `tracing` to stderr for a process that embeds Crescent.

mod codes;
pub mod methods;
pub mod raw;
mod replicate;
mod setup;
mod te_codes;

use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::fmt::Display;

pub use codes::{engine_status, session_status, store_status, Status};
pub use replicate::{ReplicateConfig, SoftPinAction};
pub use setup::{
    client_port_range, protocol_of, SetupArgs, DEFAULT_CLIENT_HTTP_PORT, DEFAULT_GLOBAL_SEGMENT_SIZE,
    DEFAULT_LOCAL_BUFFER_SIZE,
};
pub use te_codes::{te_code, te_engine_fail, te_fail, TeCode};

pub use crescent_engine as engine;
pub use crescent_store as store;
pub use crescent_store::ClientConfig;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `message` as this thread's last error (interior NUL bytes are replaced).
pub fn set_last_error(message: impl Display) {
    let text = message.to_string().replace('\0', "\\0");
    let c = CString::new(text).unwrap_or_default();
    LAST_ERROR.with(|l| *l.borrow_mut() = c);
}

/// Clears this thread's last error.
pub fn clear_last_error() {
    LAST_ERROR.with(|l| *l.borrow_mut() = CString::default());
}

/// This thread's last error message ("" when the last failing call left none).
pub fn last_error() -> String {
    LAST_ERROR.with(|l| l.borrow().to_string_lossy().into_owned())
}

/// This thread's last error as a C string; valid until the next call that sets or clears it on
/// this thread. Never null.
pub fn last_error_ptr() -> *const c_char {
    LAST_ERROR.with(|l| l.borrow().as_ptr())
}

/// Records a failure: the message becomes this thread's last error and is logged — at debug
/// level when the caller gets the status and can act on it (a cache miss, a bad argument, a
/// lease), as a warning when a peer, the master or the system failed. Returns its status.
pub fn fail(status: Status, message: impl Display) -> Status {
    let message = message.to_string();
    match status {
        Status::ObjectNotFound
        | Status::ObjectAlreadyExists
        | Status::ObjectHasLease
        | Status::InvalidParams
        | Status::InvalidHandle
        | Status::InvalidReplica
        | Status::LeaseExpired
        | Status::BufferOverflow
        | Status::UnavailableInCurrentStatus => tracing::debug!("{message}"),
        _ => tracing::warn!("{message}"),
    }
    set_last_error(message);
    status
}

/// [`fail`] for a store error.
pub fn store_fail(e: &crescent_store::StoreError) -> Status {
    fail(store_status(e), e)
}

/// [`fail`] for a store error of a get or put session's call.
pub fn session_fail(e: &crescent_store::StoreError) -> Status {
    fail(session_status(e), e)
}

/// [`fail`] for an engine error.
pub fn engine_fail(e: &crescent_engine::EngineError) -> Status {
    fail(engine_status(e), e)
}

/// Logs to stderr once per process: `RUST_LOG` if set, else `MC_LOG_LEVEL` (Mooncake's
/// `TRACE`, `INFO`, `WARNING`, `ERROR`), else warnings and errors only (a
/// library should stay quiet inside its host's output).
pub fn init_logging() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(crescent_store::init_tool_logging);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_error_is_per_thread_and_never_null() {
        clear_last_error();
        assert!(!last_error_ptr().is_null());
        assert_eq!(last_error(), "");
        assert_eq!(fail(Status::InvalidParams, "bad\0thing"), Status::InvalidParams);
        assert_eq!(last_error(), "bad\\0thing");
        std::thread::spawn(|| assert_eq!(last_error(), "")).join().unwrap();
        assert_eq!(last_error(), "bad\\0thing");
    }
}
