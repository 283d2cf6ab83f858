//! Handles: tokens in a process-wide table, never reused, resolved per call to the engine or
//! store they name.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};

use crescent_ffi::engine::{RegisteredMemory, TransferEngine};
use crescent_ffi::store::StoreClient;
use crescent_ffi::{fail, Status};
use parking_lot::{Mutex, RwLock};

use crate::{CrescentEngine, CrescentStore, R};

pub(crate) struct EngineState {
    pub(crate) engine: Arc<TransferEngine>,
    /// Buffers from crescent_engine_alloc, by address.
    pub(crate) managed: Mutex<HashMap<u64, RegisteredMemory>>,
}

pub(crate) enum Object {
    Engine(Arc<EngineState>),
    Store(Arc<StoreClient>),
}

pub(crate) static HANDLES: LazyLock<RwLock<HashMap<usize, Object>>> = LazyLock::new(|| RwLock::new(HashMap::new()));
/// Tokens are never reused, so a freed handle stays invalid forever.
pub(crate) static NEXT_TOKEN: AtomicUsize = AtomicUsize::new(1);

pub(crate) fn insert(object: Object) -> usize {
    let token = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed) << 4;
    HANDLES.write().insert(token, object);
    token
}

pub(crate) fn bad_handle(what: &str) -> Status {
    fail(Status::InvalidHandle, format!("invalid {what} handle (null, freed, forged or of another kind)"))
}

pub(crate) fn engine_of(handle: *const CrescentEngine) -> R<Arc<EngineState>> {
    match HANDLES.read().get(&(handle as usize)) {
        Some(Object::Engine(e)) => Ok(e.clone()),
        _ => Err(bad_handle("engine")),
    }
}

pub(crate) fn store_of(handle: *const CrescentStore) -> R<Arc<StoreClient>> {
    match HANDLES.read().get(&(handle as usize)) {
        Some(Object::Store(s)) => Ok(s.clone()),
        _ => Err(bad_handle("store")),
    }
}
