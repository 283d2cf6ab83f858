//! Replica tasks in Python: Mooncake's `QueryTaskResponse` (`TaskType` and `TaskStatus` are in
//! `enums.rs`), and
//! the store methods `create_copy_task`, `create_move_task`, `query_task` and
//! `batch_replica_clear` (their bodies; `store.rs` holds their signatures).

use crescent_ffi::store::proto::{TaskInfo, TaskStatus, TaskType};
use crescent_ffi::store::StoreApi;
use crescent_ffi::store_fail;
use pyo3::prelude::*;

use crate::enums::{PyTaskStatus, PyTaskType};
use crate::not_set_up;

/// QueryTaskResponse: a task's `id`, `type`, `status`, `created_at_ms_epoch`,
/// `last_updated_at_ms_epoch`, `assigned_client` and `message`, as `query_task` returns them.
/// `assigned_client` is the id of the client that runs the task: Crescent's client ids are
/// strings (Mooncake's a UUID pair).
#[pyclass(module = "crescent._crescent", name = "QueryTaskResponse", get_all, frozen)]
#[derive(Clone)]
pub(crate) struct PyQueryTaskResponse {
    id: (u64, u64),
    r#type: PyTaskType,
    status: PyTaskStatus,
    created_at_ms_epoch: i64,
    last_updated_at_ms_epoch: i64,
    assigned_client: String,
    message: String,
}

#[pymethods]
impl PyQueryTaskResponse {
    #[new]
    fn new() -> Self {
        PyQueryTaskResponse {
            id: (0, 0),
            r#type: PyTaskType::REPLICA_COPY,
            status: PyTaskStatus::PENDING,
            created_at_ms_epoch: 0,
            last_updated_at_ms_epoch: 0,
            assigned_client: String::new(),
            message: String::new(),
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "QueryTaskResponse(id={}-{}, type={}, status={}, created_at={}, last_updated_at={}, assigned_client={}, message={:?})",
            self.id.0,
            self.id.1,
            self.r#type as i32,
            self.status as i32,
            self.created_at_ms_epoch,
            self.last_updated_at_ms_epoch,
            self.assigned_client,
            self.message
        )
    }
}

fn response(t: TaskInfo) -> PyQueryTaskResponse {
    let id = t.id.map_or((0, 0), |i| (i.high, i.low));
    let r#type = match TaskType::try_from(t.r#type) {
        Ok(TaskType::ReplicaMove) => PyTaskType::REPLICA_MOVE,
        _ => PyTaskType::REPLICA_COPY,
    };
    let status = match TaskStatus::try_from(t.status) {
        Ok(TaskStatus::TaskProcessing) => PyTaskStatus::PROCESSING,
        Ok(TaskStatus::TaskFailed) => PyTaskStatus::FAILED,
        Ok(TaskStatus::TaskSuccess) => PyTaskStatus::SUCCESS,
        _ => PyTaskStatus::PENDING,
    };
    PyQueryTaskResponse {
        id,
        r#type,
        status,
        created_at_ms_epoch: t.created_at_ms_epoch,
        last_updated_at_ms_epoch: t.last_updated_at_ms_epoch,
        assigned_client: t.assigned_client,
        message: t.message,
    }
}

/// A created task's answer: (id, 0), or ((0, 0), a negative code).
pub(crate) fn created(
    what: &str,
    client: Option<&dyn StoreApi>,
    make: impl FnOnce(&dyn StoreApi) -> crescent_ffi::store::Result<(u64, u64)>,
) -> ((u64, u64), i32) {
    let Some(client) = client else { return ((0, 0), not_set_up(what)) };
    match make(client) {
        Ok(id) => (id, 0),
        Err(e) => ((0, 0), store_fail(&e).code()),
    }
}

/// `query_task`'s answer: (response, 0), or (None, a negative code).
pub(crate) fn queried(client: Option<&dyn StoreApi>, id: (u64, u64)) -> (Option<PyQueryTaskResponse>, i32) {
    let Some(client) = client else { return (None, not_set_up("query_task")) };
    match client.query_task(id) {
        Ok(t) => (Some(response(t)), 0),
        Err(e) => (None, store_fail(&e).code()),
    }
}

/// `batch_replica_clear`'s answer: the keys cleared ([] on any error, as Mooncake's).
pub(crate) fn cleared(client: Option<&dyn StoreApi>, keys: &[String], segment_name: &str) -> Vec<String> {
    let Some(client) = client else {
        not_set_up("batch_replica_clear");
        return Vec::new();
    };
    client.batch_replica_clear(keys, segment_name).unwrap_or_else(|e| {
        store_fail(&e);
        Vec::new()
    })
}

pub(crate) fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyTaskType>()?;
    m.add_class::<PyTaskStatus>()?;
    m.add_class::<PyQueryTaskResponse>()?;
    Ok(())
}
