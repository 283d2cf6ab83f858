//! Replica tasks: Mooncake's `CreateCopyTask`, `CreateMoveTask` and `QueryTask`, and its
//! `BatchReplicaClear`.
//!
//! The master moves no bytes, so a task runs at the client that holds the source replica:
//!
//! 1. `create_copy_task(key, targets)` / `create_move_task(key, source, target)` check the
//!    request (upstream's codes) and queue a task, `PENDING`, for the owner of the source
//!    segment (for a copy, the first complete memory replica's).
//! 2. That client's next ping takes it (`PROCESSING`, [`Master::take_tasks`]): the ping reply
//!    carries it, no new channel. The client copies with the warm-up's calls
//!    (`ReplicateStart` with the task's target segments, the engine's writes, `ReplicateEnd`),
//!    so the new replica is allocated, written and committed as a put's is: never readable
//!    half-written, and its owner acknowledges it before it counts.
//! 3. The client reports with [`Master::finish_task`]. For a move that succeeded, the master
//!    then drops the source replica, with the quarantine of any removal (a reader holding a
//!    lease on it still reads the old bytes).
//!
//! Each task ends `SUCCESS` or `FAILED` (unless its deadlines are set to 0, upstream's "none"):
//! a task still `PENDING` after
//! [`MasterConfig::task_pending_timeout`](super::config::MasterConfig::task_pending_timeout),
//! or `PROCESSING` after `task_processing_timeout`, is failed by the sweep with the message
//! "pending timeout" / "processing timeout". A key removed meanwhile fails the task
//! (`OBJECT_NOT_FOUND ...`); so does the master dropping the assigned client (silent past its
//! TTL). Tasks live in the master's memory only: after a restart or a
//! failover the new master knows none of them, and `query_task` answers `TASK_NOT_FOUND`.

use std::collections::{HashMap, VecDeque};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::error::{Result, StoreError};
use crate::master::{check_key, tenant, Master, MAX_REPLICAS};
use crate::proto::{EventKind, TaskAssignment, TaskId, TaskInfo, TaskStatus, TaskType, Tier};

/// A task's id: Mooncake's UUID, two halves.
pub type Id = (u64, u64);

/// The id as the wire carries it.
pub fn wire_id(id: Id) -> TaskId {
    TaskId { high: id.0, low: id.1 }
}

/// The id of a wire id (absent: the nil id, which no task has).
pub fn from_wire(id: Option<&TaskId>) -> Id {
    id.map_or((0, 0), |t| (t.high, t.low))
}

fn show(id: Id) -> String {
    format!("{:016x}-{:016x}", id.0, id.1)
}

fn epoch_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

struct Task {
    kind: TaskType,
    status: TaskStatus,
    /// The object's key, scoped to its tenant.
    key: String,
    source: String,
    targets: Vec<String>,
    /// The client that runs it.
    client: String,
    created_ms: i64,
    updated_ms: i64,
    /// When its status last changed (its deadline runs from there).
    since: Instant,
    message: String,
}

impl Task {
    fn info(&self, id: Id) -> TaskInfo {
        TaskInfo {
            id: Some(wire_id(id)),
            r#type: self.kind as i32,
            status: self.status as i32,
            created_at_ms_epoch: self.created_ms,
            last_updated_at_ms_epoch: self.updated_ms,
            assigned_client: self.client.clone(),
            message: self.message.clone(),
        }
    }

    fn finished(&self) -> bool {
        matches!(self.status, TaskStatus::TaskSuccess | TaskStatus::TaskFailed)
    }
}

/// The master's tasks: every task by id, the queue of each client, the finished ones in the
/// order they finished (the oldest are forgotten beyond `max_finished_tasks`).
#[derive(Default)]
pub(super) struct Tasks {
    all: HashMap<Id, Task>,
    queues: HashMap<String, VecDeque<Id>>,
    pending: usize,
    finished: VecDeque<Id>,
}

impl Tasks {
    fn finish(&mut self, id: Id, status: TaskStatus, message: String, max_finished: usize) {
        let Some(task) = self.all.get_mut(&id) else { return };
        if task.finished() {
            return;
        }
        if task.status == TaskStatus::TaskPending {
            self.pending = self.pending.saturating_sub(1);
            if let Some(q) = self.queues.get_mut(&task.client) {
                q.retain(|t| *t != id);
            }
        }
        task.status = status;
        task.message = message;
        task.updated_ms = epoch_ms();
        task.since = Instant::now();
        self.finished.push_back(id);
        while self.finished.len() > max_finished {
            if let Some(old) = self.finished.pop_front() {
                self.all.remove(&old);
            }
        }
    }
}

impl Master {
    fn submit_task(
        &self,
        kind: TaskType,
        key: &str,
        source: String,
        targets: Vec<String>,
        client: String,
    ) -> Result<Id> {
        let mut tasks = self.tasks.lock();
        if tasks.pending >= self.config.max_pending_tasks {
            return Err(StoreError::TooManyTasks(format!(
                "{} tasks wait for their clients (max_pending_tasks)",
                tasks.pending
            )));
        }
        let mut id = (rand::random::<u64>(), rand::random::<u64>());
        while id == (0, 0) || tasks.all.contains_key(&id) {
            id = (rand::random::<u64>(), rand::random::<u64>());
        }
        let now = epoch_ms();
        tracing::debug!("task {} ({kind:?} of {key:?}) queued for client {client}", show(id));
        tasks.queues.entry(client.clone()).or_default().push_back(id);
        tasks.pending += 1;
        tasks.all.insert(
            id,
            Task {
                kind,
                status: TaskStatus::TaskPending,
                key: key.to_string(),
                source,
                targets,
                client,
                created_ms: now,
                updated_ms: now,
                since: Instant::now(),
                message: String::new(),
            },
        );
        Ok(id)
    }

    /// A memory segment of `key`'s tenant named `name`, for a task's target: its id.
    pub(super) fn task_target(st: &super::State, key: &str, name: &str) -> Result<u64> {
        let bad = |why: &str| Err(StoreError::InvalidArgument(format!("target segment {name:?} {why}")));
        let Some(&id) = st.core.segment_by_name.get(name) else { return bad("is not mounted") };
        let seg = &st.core.segments[&id];
        if seg.tier == Tier::Ssd {
            return bad("is a disk segment (tasks copy between memory segments)");
        }
        if tenant::tenant_of(&seg.client_id) != tenant::tenant_of(key) {
            return bad("is not mounted");
        }
        Ok(id)
    }

    /// Mooncake's `CreateCopyTask`: a task copying `key` to each of `targets` (segment names),
    /// run by the owner of one of its memory replicas. Codes as upstream's: no target or an
    /// unknown one: `INVALID_PARAMS`; no such object: `OBJECT_NOT_FOUND`.
    pub fn create_copy_task(&self, key: &str, targets: &[String]) -> Result<Id> {
        check_key(key)?;
        if targets.is_empty() {
            return Err(StoreError::InvalidArgument("a copy task needs at least one target segment".into()));
        }
        if targets.len() > MAX_REPLICAS as usize {
            return Err(StoreError::InvalidArgument(format!("at most {MAX_REPLICAS} target segments")));
        }
        let now = Instant::now();
        let st = self.lock_key(key);
        self.fence.check(now)?;
        let obj = st.objects.get(key).ok_or_else(|| StoreError::NotFound(key.to_string()))?;
        for t in targets {
            Self::task_target(&st, key, t)?;
        }
        if !obj.complete {
            return Err(StoreError::NotReady(key.to_string()));
        }
        let source = obj
            .replicas
            .iter()
            .filter_map(|r| st.core.segments.get(&r.segment_id))
            .find(|s| s.tier != Tier::Ssd)
            .ok_or_else(|| StoreError::InvalidArgument(format!("object {key:?} has no memory replica to copy from")))?;
        let (source, client) = (source.name.clone(), source.client_id.clone());
        drop(st);
        let id = self.submit_task(TaskType::ReplicaCopy, key, source, targets.to_vec(), client.clone())?;
        self.nudge_owner(&client);
        Ok(id)
    }

    /// Mooncake's `CreateMoveTask`: a task moving `key`'s replica on segment `source` to
    /// `target` (copy, then drop the source replica), run by the owner of `source`. Codes as
    /// upstream's: no such object: `OBJECT_NOT_FOUND`; the same segment twice, a target not
    /// mounted, a source holding no replica of it: `INVALID_PARAMS`.
    pub fn create_move_task(&self, key: &str, source: &str, target: &str) -> Result<Id> {
        check_key(key)?;
        let now = Instant::now();
        let st = self.lock_key(key);
        self.fence.check(now)?;
        let obj = st.objects.get(key).ok_or_else(|| StoreError::NotFound(key.to_string()))?;
        if source == target {
            return Err(StoreError::InvalidArgument(format!("source and target are the same segment {source:?}")));
        }
        let target_id = Self::task_target(&st, key, target)?;
        let source_id = st.core.segment_by_name.get(source).copied();
        let holds = |id: Option<u64>| id.is_some_and(|id| obj.replicas.iter().any(|r| r.segment_id == id));
        if !holds(source_id) {
            return Err(StoreError::InvalidArgument(format!(
                "segment {source:?} holds no replica of {key:?} (the source of a move must)"
            )));
        }
        if holds(Some(target_id)) {
            return Err(StoreError::InvalidArgument(format!("segment {target:?} holds a replica of {key:?} already")));
        }
        if !obj.complete {
            return Err(StoreError::NotReady(key.to_string()));
        }
        let client = st.core.segments[&source_id.expect("holds a replica")].client_id.clone();
        drop(st);
        let id =
            self.submit_task(TaskType::ReplicaMove, key, source.to_string(), vec![target.to_string()], client.clone())?;
        self.nudge_owner(&client);
        Ok(id)
    }

    /// Mooncake's `QueryTask`: the task's state; `TASK_NOT_FOUND` for an id this master does
    /// not know, or whose key `visible` refuses (another tenant's).
    pub fn query_task(&self, id: Id, visible: impl Fn(&str) -> bool) -> Result<TaskInfo> {
        self.expire_tasks(Instant::now());
        let tasks = self.tasks.lock();
        match tasks.all.get(&id) {
            Some(t) if visible(&t.key) => Ok(t.info(id)),
            _ => Err(StoreError::TaskNotFound(show(id))),
        }
    }

    /// Hands `client_id` its pending tasks (now `PROCESSING`): what its ping reply carries.
    pub fn take_tasks(&self, client_id: &str) -> Vec<TaskAssignment> {
        let mut tasks = self.tasks.lock();
        let Some(queue) = tasks.queues.remove(client_id) else { return Vec::new() };
        let mut out = Vec::with_capacity(queue.len());
        for id in queue {
            let Some(task) = tasks.all.get_mut(&id) else { continue };
            if task.status != TaskStatus::TaskPending {
                continue;
            }
            task.status = TaskStatus::TaskProcessing;
            task.updated_ms = epoch_ms();
            task.since = Instant::now();
            out.push(TaskAssignment {
                id: Some(wire_id(id)),
                r#type: task.kind as i32,
                key: task.key.clone(),
                source: task.source.clone(),
                targets: task.targets.clone(),
            });
        }
        tasks.pending = tasks.pending.saturating_sub(out.len());
        out
    }

    /// The assigned client's report of a task it ran. For a move that succeeded, the source
    /// replica is dropped now (with a removal's quarantine); if the object went meanwhile, or
    /// the new replica is not there, the task fails instead. A task finished already (it timed
    /// out) keeps its status.
    pub fn finish_task(&self, client_id: &str, id: Id, ok: bool, message: &str) -> Result<()> {
        let now = Instant::now();
        self.fence.check(now)?;
        let (kind, key, source, target) = {
            let tasks = self.tasks.lock();
            let task = tasks.all.get(&id).ok_or_else(|| StoreError::TaskNotFound(show(id)))?;
            if task.client != client_id {
                return Err(StoreError::InvalidArgument(format!("task {} is assigned to another client", show(id))));
            }
            if task.finished() {
                tracing::debug!("task {} reported after it ended {:?}: {}", show(id), task.status, task.message);
                return Ok(());
            }
            (task.kind, task.key.clone(), task.source.clone(), task.targets.first().cloned().unwrap_or_default())
        };
        let outcome = if !ok {
            Err(if message.is_empty() { "the client failed the task".to_string() } else { message.to_string() })
        } else if kind == TaskType::ReplicaMove {
            self.drop_moved_replica(&key, &source, &target, now)
        } else {
            Ok(())
        };
        let (status, message) = match outcome {
            Ok(()) => (TaskStatus::TaskSuccess, "Task completed successfully".to_string()),
            Err(why) => (TaskStatus::TaskFailed, why),
        };
        tracing::debug!("task {} of {key:?}: {status:?} {message}", show(id));
        self.tasks.lock().finish(id, status, message, self.config.max_finished_tasks);
        Ok(())
    }

    /// A move's last step: the replica on `source` goes, once the one on `target` is there.
    fn drop_moved_replica(
        &self,
        key: &str,
        source: &str,
        target: &str,
        now: Instant,
    ) -> std::result::Result<(), String> {
        let mut st = self.lock_key(key);
        let st = &mut st;
        let Some(obj) = st.objects.get(key) else {
            return Err(format!("OBJECT_NOT_FOUND: object {key:?} was removed during the move"));
        };
        let id_of = |name: &str| st.core.segment_by_name.get(name).copied();
        let (source_id, target_id) = (id_of(source), id_of(target));
        if !target_id.is_some_and(|t| obj.replicas.iter().any(|r| r.segment_id == t)) {
            return Err(format!("the new replica of {key:?} on {target:?} is not there (its segment went?)"));
        }
        let Some(i) = source_id.and_then(|s| obj.replicas.iter().position(|r| r.segment_id == s)) else {
            // Gone already (its segment went, or a clear took it): moved all the same.
            return Ok(());
        };
        let (size, version) = (obj.size, obj.version);
        let hold = obj.lease_until.map(|t| t.instant()).filter(|t| *t > now);
        let source_id = source_id.expect("found above");
        self.emit_replica(st, key, size, source_id, EventKind::Removed);
        let obj = st.objects.get_mut(key).expect("looked up above");
        let replica = obj.replicas.remove(i);
        let announced = replica.news().is_some();
        Self::free_replica(st, key, version, source_id, replica.block, announced, hold);
        self.flush_news(st);
        Ok(())
    }

    /// Fails the unfinished tasks of clients the master dropped (silent past their TTL).
    pub(super) fn fail_tasks_of(&self, clients: &[String]) {
        if clients.is_empty() {
            return;
        }
        let mut tasks = self.tasks.lock();
        let theirs: Vec<(Id, String)> = tasks
            .all
            .iter()
            .filter(|(_, t)| !t.finished() && clients.contains(&t.client))
            .map(|(id, t)| (*id, t.client.clone()))
            .collect();
        for (id, client) in theirs {
            tracing::warn!("task {}: its client {client} went away", show(id));
            let why = format!("the assigned client {client} went away (silent past its TTL)");
            tasks.finish(id, TaskStatus::TaskFailed, why, self.config.max_finished_tasks);
        }
    }

    /// Fails the tasks past their deadline (the sweep calls this; so does a query).
    pub(super) fn expire_tasks(&self, now: Instant) {
        let (pending_max, processing_max) = (self.config.task_pending_timeout, self.config.task_processing_timeout);
        let mut tasks = self.tasks.lock();
        let late: Vec<(Id, &'static str)> = tasks
            .all
            .iter()
            .filter_map(|(id, t)| {
                let age = now.saturating_duration_since(t.since);
                let past = |max: std::time::Duration| !max.is_zero() && age > max;
                match t.status {
                    TaskStatus::TaskPending if past(pending_max) => Some((*id, "pending timeout")),
                    TaskStatus::TaskProcessing if past(processing_max) => Some((*id, "processing timeout")),
                    _ => None,
                }
            })
            .collect();
        for (id, why) in late {
            tracing::warn!("task {}: {why}", show(id));
            tasks.finish(id, TaskStatus::TaskFailed, why.to_string(), self.config.max_finished_tasks);
        }
    }

    /// Mooncake's `BatchReplicaClear`: of `keys`, the objects `client_id` put whose read
    /// leases are over lose their replicas on `segment_name` (those left with none go), or,
    /// with an empty `segment_name`, go altogether. Keys missing, another client's, leased or
    /// unfinished are skipped; returns the keys cleared and the owners' acknowledgements to
    /// wait for.
    pub fn batch_replica_clear(
        &self,
        client_id: &str,
        keys: &[String],
        segment_name: &str,
    ) -> Result<(Vec<String>, super::removal_records::Removal)> {
        let now = Instant::now();
        let mut cleared = Vec::new();
        let mut segments = Vec::new();
        let mut gone = Vec::new();
        for key in keys {
            if check_key(key).is_err() {
                continue;
            }
            let mut st = self.lock_key(key);
            self.fence.check(now)?;
            let Some(obj) = st.objects.get(key) else { continue };
            let mine = obj.writer.as_ref().is_some_and(|w| &*w.client == client_id);
            if !mine || !obj.complete || obj.leased(now) {
                continue;
            }
            let its: Vec<u64> = obj.replicas.iter().map(|r| r.segment_id).collect();
            let next = st.core.next_version;
            if segment_name.is_empty() {
                let (disks, disk_unlinked) = Self::disk_holders(&st, obj);
                let its: Vec<u64> = its.into_iter().chain(disks).collect();
                segments.extend(its.iter().copied());
                gone.push(super::removal_records::Removed {
                    key: key.clone(),
                    mark: next,
                    segments: its,
                    disk_unlinked,
                });
                self.emit_object(&st, key, EventKind::Removed);
                Self::remove_object(&mut st, key, now);
                st.window.removed(key, next, now);
            } else {
                let Some(&seg) = st.core.segment_by_name.get(segment_name) else { continue };
                let Some(i) = obj.replicas.iter().position(|r| r.segment_id == seg) else { continue };
                if obj.replicas.len() == 1 && obj.ssd.is_empty() {
                    // Its last replica: the object goes.
                    segments.push(seg);
                    gone.push(super::removal_records::Removed {
                        key: key.clone(),
                        mark: next,
                        segments: its,
                        disk_unlinked: false,
                    });
                    self.emit_object(&st, key, EventKind::Removed);
                    Self::remove_object(&mut st, key, now);
                    st.window.removed(key, next, now);
                } else {
                    let (size, version) = (obj.size, obj.version);
                    let st = &mut st;
                    self.emit_replica(st, key, size, seg, EventKind::Removed);
                    let obj = st.objects.get_mut(key).expect("looked up above");
                    let replica = obj.replicas.remove(i);
                    let memory_gone = obj.replicas.is_empty();
                    let announced = replica.news().is_some();
                    Self::free_replica(st, key, version, seg, replica.block, announced, None);
                    if memory_gone {
                        Self::tell_disks_memory_is_gone(st, key);
                    }
                    segments.push(seg);
                }
            }
            self.flush_news(&mut st);
            cleared.push(key.clone());
        }
        let wait = Self::waits(&self.state.lock(), segments);
        self.update_gauges();
        Ok((cleared, super::removal_records::Removal { wait, removed: gone }))
    }
}

#[cfg(test)]
mod tests;
