//! Unit tests of replica tasks: the master's side, with the copying client played by hand.

use std::sync::Arc;
use std::time::Duration;

use crate::error::StoreError;
use crate::master::{Master, MasterConfig};
use crate::proto::{PutOptions, SegmentInfo, TaskStatus, TaskType, Tier};

const BASE: u64 = 0x10_0000_0000;

fn mount(m: &Master, client: &str, name: &str) {
    let info = SegmentInfo { name: name.into(), base: BASE, size: 1 << 20, tier: Tier::Dram as i32 };
    m.mount_segment(client, &info, "h").unwrap();
}

fn put(m: &Master, client: &str, own: &str, key: &str) {
    let opts = PutOptions { replica_num: 1, preferred_segment: own.into(), ..Default::default() };
    m.put_start(client, key, 1000, &opts).unwrap();
    m.put_end(client, key).unwrap();
}

fn segments_of(m: &Master, key: &str) -> Vec<String> {
    let mut names: Vec<String> = m.query(key).unwrap().replicas.into_iter().map(|r| r.segment_name).collect();
    names.sort();
    names
}

fn three() -> Arc<Master> {
    let m = Master::new(MasterConfig::default()).unwrap();
    for c in ["a", "b", "c"] {
        mount(&m, c, &format!("s{c}"));
    }
    m
}

fn status(m: &Master, id: super::Id) -> (TaskStatus, String) {
    let t = m.query_task(id, |_| true).unwrap();
    (TaskStatus::try_from(t.status).unwrap(), t.message)
}

/// Plays the assigned client: takes its tasks and copies each onto its targets.
fn run_tasks(m: &Master, client: &str) -> usize {
    let tasks = m.take_tasks(client);
    for t in &tasks {
        let plan = m.replicate_start_to(client, &t.key, 0, &t.targets).unwrap();
        let done: Vec<u64> = plan.targets.iter().map(|d| d.segment_id).collect();
        if !done.is_empty() {
            m.replicate_end(client, &t.key, &done).unwrap();
        }
        m.finish_task(client, super::from_wire(t.id.as_ref()), true, "").unwrap();
    }
    tasks.len()
}

#[test]
fn a_copy_runs_at_the_source_owner_and_adds_the_replicas() {
    let m = three();
    put(&m, "a", "sa", "k");
    let id = m.create_copy_task("k", &["sb".into(), "sc".into()]).unwrap();
    let t = m.query_task(id, |_| true).unwrap();
    assert_eq!((t.r#type, t.status, t.assigned_client.as_str()), (TaskType::ReplicaCopy as i32, 0, "a"));
    assert_eq!(run_tasks(&m, "b"), 0, "b holds no source");
    assert_eq!(run_tasks(&m, "a"), 1);
    assert_eq!(status(&m, id).0, TaskStatus::TaskSuccess);
    assert_eq!(segments_of(&m, "k"), ["sa", "sb", "sc"]);
    assert_eq!(run_tasks(&m, "a"), 0, "handed over once");
}

#[test]
fn a_move_leaves_one_replica_on_the_target() {
    let m = three();
    put(&m, "a", "sa", "k");
    let id = m.create_move_task("k", "sa", "sc").unwrap();
    assert_eq!(run_tasks(&m, "a"), 1);
    assert_eq!(status(&m, id), (TaskStatus::TaskSuccess, "Task completed successfully".into()));
    assert_eq!(segments_of(&m, "k"), ["sc"]);
}

#[test]
fn bad_requests_get_upstreams_codes() {
    let m = three();
    put(&m, "a", "sa", "k");
    let invalid = |r: crate::Result<super::Id>| matches!(r, Err(StoreError::InvalidArgument(_)));
    assert!(invalid(m.create_copy_task("k", &[])), "no target");
    assert!(invalid(m.create_copy_task("k", &["nowhere".into()])), "unknown target");
    assert!(matches!(m.create_copy_task("nope", &["sb".into()]), Err(StoreError::NotFound(_))));
    assert!(invalid(m.create_move_task("k", "sa", "sa")), "same segment");
    assert!(invalid(m.create_move_task("k", "sb", "sc")), "source holds none");
    assert!(invalid(m.create_move_task("k", "sa", "nowhere")), "unknown target");
    assert!(matches!(m.create_move_task("nope", "sa", "sb"), Err(StoreError::NotFound(_))));
    assert!(matches!(m.query_task((1, 2), |_| true), Err(StoreError::TaskNotFound(_))));
    // Another tenant's task is not found either.
    let id = m.create_copy_task("k", &["sb".into()]).unwrap();
    assert!(matches!(m.query_task(id, |_| false), Err(StoreError::TaskNotFound(_))));
    // Only the assigned client reports it.
    assert!(matches!(m.finish_task("b", id, true, ""), Err(StoreError::InvalidArgument(_))));
}

#[test]
fn a_task_on_a_key_removed_meanwhile_fails() {
    let m = three();
    put(&m, "a", "sa", "k");
    let id = m.create_move_task("k", "sa", "sb").unwrap();
    let tasks = m.take_tasks("a");
    m.remove("k", true).unwrap();
    // The client's copy finds it gone and says so.
    let e = m.replicate_start_to("a", "k", 0, &tasks[0].targets).unwrap_err();
    assert!(matches!(e, StoreError::NotFound(_)));
    m.finish_task("a", id, false, &format!("{}: {e}", e.code().as_str_name())).unwrap();
    let (s, message) = status(&m, id);
    assert_eq!(s, TaskStatus::TaskFailed);
    assert!(message.starts_with("OBJECT_NOT_FOUND"), "{message}");
    // A move whose object goes between its copy and its report fails too.
    put(&m, "a", "sa", "k2");
    let id = m.create_move_task("k2", "sa", "sb").unwrap();
    let t = m.take_tasks("a").remove(0);
    let plan = m.replicate_start_to("a", "k2", 0, &t.targets).unwrap();
    m.replicate_end("a", "k2", &[plan.targets[0].segment_id]).unwrap();
    m.remove("k2", true).unwrap();
    m.finish_task("a", id, true, "").unwrap();
    let (s, message) = status(&m, id);
    assert_eq!(s, TaskStatus::TaskFailed);
    assert!(message.contains("removed during the move"), "{message}");
}

#[test]
fn tasks_fail_at_their_deadlines() {
    let m = Master::new(MasterConfig {
        task_pending_timeout: Duration::from_millis(20),
        task_processing_timeout: Duration::from_millis(20),
        ..MasterConfig::default()
    })
    .unwrap();
    mount(&m, "a", "sa");
    mount(&m, "b", "sb");
    put(&m, "a", "sa", "k");
    let waiting = m.create_copy_task("k", &["sb".into()]).unwrap();
    std::thread::sleep(Duration::from_millis(30));
    m.sweep();
    assert_eq!(status(&m, waiting), (TaskStatus::TaskFailed, "pending timeout".into()));
    assert!(m.take_tasks("a").is_empty(), "a failed task is not handed out");
    let taken = m.create_copy_task("k", &["sb".into()]).unwrap();
    assert_eq!(m.take_tasks("a").len(), 1);
    assert_eq!(status(&m, taken).0, TaskStatus::TaskProcessing);
    std::thread::sleep(Duration::from_millis(30));
    m.sweep();
    assert_eq!(status(&m, taken), (TaskStatus::TaskFailed, "processing timeout".into()));
    // A report after the deadline changes nothing.
    m.finish_task("a", taken, true, "").unwrap();
    assert_eq!(status(&m, taken).0, TaskStatus::TaskFailed);
}

#[test]
fn pending_tasks_are_bounded_and_finished_ones_forgotten_oldest_first() {
    let m =
        Master::new(MasterConfig { max_pending_tasks: 2, max_finished_tasks: 1, ..MasterConfig::default() }).unwrap();
    mount(&m, "a", "sa");
    mount(&m, "b", "sb");
    put(&m, "a", "sa", "k");
    let first = m.create_copy_task("k", &["sb".into()]).unwrap();
    let second = m.create_copy_task("k", &["sb".into()]).unwrap();
    assert!(matches!(m.create_copy_task("k", &["sb".into()]), Err(StoreError::TooManyTasks(_))));
    assert_eq!(run_tasks(&m, "a"), 2);
    assert!(matches!(m.query_task(first, |_| true), Err(StoreError::TaskNotFound(_))), "forgotten");
    assert_eq!(status(&m, second).0, TaskStatus::TaskSuccess);
}

#[test]
fn batch_replica_clear_takes_the_callers_unleased_objects() {
    let m = Master::new(MasterConfig { lease_ttl: Duration::from_millis(300), ..MasterConfig::default() }).unwrap();
    for c in ["a", "b", "c"] {
        mount(&m, c, &format!("s{c}"));
    }
    put(&m, "a", "sa", "mine");
    put(&m, "a", "sa", "leased");
    put(&m, "b", "sb", "theirs");
    put(&m, "a", "sa", "two");
    let id = m.create_copy_task("two", &["sb".into()]).unwrap();
    run_tasks(&m, "a");
    assert_eq!(status(&m, id).0, TaskStatus::TaskSuccess);
    // The copy leased its source for a while.
    std::thread::sleep(Duration::from_millis(400));
    m.get_replica_list("leased").unwrap();
    let keys: Vec<String> = ["mine", "leased", "theirs", "missing", "two"].iter().map(|k| k.to_string()).collect();
    // On one segment: "two" keeps its other replica; "mine" had only that one and goes.
    let (cleared, _) = m.batch_replica_clear("a", &keys, "sa").unwrap();
    assert_eq!(cleared, ["mine", "two"]);
    assert!(!m.exists("mine").unwrap());
    assert_eq!(segments_of(&m, "two"), ["sb"]);
    assert!(m.exists("leased").unwrap() && m.exists("theirs").unwrap());
    // Every replica.
    let (cleared, _) = m.batch_replica_clear("a", &keys, "").unwrap();
    assert_eq!(cleared, ["two"]);
    assert!(!m.exists("two").unwrap());
}

#[test]
fn the_tasks_of_a_client_that_went_away_fail() {
    let m = Master::new(MasterConfig { client_ttl: Duration::from_millis(50), ..MasterConfig::default() }).unwrap();
    mount(&m, "a", "sa");
    mount(&m, "b", "sb");
    put(&m, "a", "sa", "k");
    let id = m.create_copy_task("k", &["sb".into()]).unwrap();
    std::thread::sleep(Duration::from_millis(80));
    m.ping("b");
    m.sweep();
    let (s, message) = status(&m, id);
    assert_eq!(s, TaskStatus::TaskFailed);
    assert!(message.contains("went away"), "{message}");
}
