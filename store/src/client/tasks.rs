//! Replica tasks from the client's side: creating and querying them (Mooncake's
//! `create_copy_task`, `create_move_task`, `query_task`), `batch_replica_clear`, and running
//! the tasks the master assigns to this client (they come with its ping replies).
//!
//! A task copies with the warm-up's calls ([`Scheduling::replicate`](super::sched::Scheduling::replicate) onto named segments):
//! the master allocates the new replica, this client writes it with the engine, the master
//! commits it once its owner acknowledged. The client then reports the outcome; for a move the
//! master drops the source replica at that report. See `docs/src/store.md`.

use std::sync::Arc;
use std::time::Duration;

use super::rpc::check;
use super::StoreClient;
use crate::error::{Result, StoreError};
use crate::proto::*;

/// Attempts at a task whose copy failed for a reason that may pass (no room yet, the object
/// busy with another replication): Mooncake's `max_retry_attempts` default.
const TASK_ATTEMPTS: u32 = 10;

/// A task's id: Mooncake's UUID, two halves.
pub type TaskIdPair = (u64, u64);

impl StoreClient {
    /// Runs tasks the master assigned to this client, one after another on a thread of their
    /// own (the heartbeat goes on meanwhile), reporting each.
    pub(super) fn run_tasks(self: &Arc<Self>, tasks: Vec<TaskAssignment>) {
        let weak = Arc::downgrade(self);
        let spawned = std::thread::Builder::new().name("crescent-tasks".into()).spawn(move || {
            for task in tasks {
                let Some(client) = weak.upgrade() else { return };
                client.run_task(&task);
            }
        });
        if let Err(e) = spawned {
            tracing::warn!("replica tasks: no thread to run them ({e}); they will time out at the master");
        }
    }

    fn run_task(&self, task: &TaskAssignment) {
        let outcome = self.copy_for_task(task);
        let (ok, message) = match &outcome {
            Ok(()) => (true, String::new()),
            Err(e) => (false, format!("{}: {e}", e.code().as_str_name())),
        };
        tracing::debug!("replica task of {:?}: {}", task.key, if ok { "done" } else { &message });
        let req = FinishTaskRequest { client_id: self.id.clone(), id: task.id, ok, message };
        let reported = self.rpc.call(|mut c| async move { c.finish_task(req).await }).and_then(|r| check(r.status, ""));
        if let Err(e) = reported {
            tracing::warn!(
                "replica task of {:?}: its report failed ({e}); the master fails it at its deadline",
                task.key
            );
        }
    }

    /// The copy a task asks for, tried again a few times while it may succeed later.
    fn copy_for_task(&self, task: &TaskAssignment) -> Result<()> {
        if task.targets.is_empty() {
            return Err(StoreError::BadReply("a replica task without a target".into()));
        }
        let mut attempt = 0;
        loop {
            match self.replicate_with(&task.key, 0, task.targets.clone()) {
                Ok(_) => return Ok(()),
                Err(e @ (StoreError::NoSpace { .. } | StoreError::NotReady(_))) if attempt + 1 < TASK_ATTEMPTS => {
                    attempt += 1;
                    tracing::debug!("replica task of {:?}: {e}; attempt {} of {TASK_ATTEMPTS}", task.key, attempt + 1);
                    std::thread::sleep(Duration::from_millis(50 * u64::from(attempt)));
                }
                Err(e) => return Err(e),
            }
        }
    }
}

pub(super) fn task_id(id: Option<&TaskId>) -> Result<TaskIdPair> {
    id.map(|t| (t.high, t.low)).ok_or_else(|| StoreError::BadReply("a task's creation reply carries no id".into()))
}
