//! Replica tasks (Mooncake's `create_copy_task`, `create_move_task`, `query_task`) and
//! `batch_replica_clear` against an in-process master on loopback, with real clients moving
//! real bytes: a copy that outlives its source's client, a move, bad input with upstream's
//! codes, a task on a key removed meanwhile.

use std::time::Duration;

use crescent_store::proto::{TaskInfo, TaskStatus, TaskType};
use crescent_store::{MasterConfig, StoreApi, StoreClient, StoreError};
use crescent_tests::eventually;
use crescent_tests::store::{loopback_client as client, loopback_client_config, loopback_master, pattern_bytes};

/// The task once it ended (SUCCESS or FAILED), within `timeout`.
fn ended(c: &StoreClient, id: (u64, u64), timeout: Duration) -> TaskInfo {
    let mut last = None;
    let done = eventually(timeout, || {
        let t = c.query_task(id).expect("the task is known");
        let end = t.status == TaskStatus::TaskSuccess as i32 || t.status == TaskStatus::TaskFailed as i32;
        last = Some(t);
        end
    });
    let t = last.expect("queried");
    assert!(done, "the task did not end: {t:?}");
    t
}

fn segments_of(c: &StoreClient, key: &str) -> Vec<String> {
    let mut names: Vec<String> = c.query(key).unwrap().replicas.into_iter().map(|r| r.segment_name).collect();
    names.sort();
    names
}

#[test]
fn a_copy_to_another_client_outlives_the_source_client() {
    let m = loopback_master(MasterConfig::default());
    let (a, b, reader) = (client(&m, 16 << 20), client(&m, 16 << 20), client(&m, 0));
    let value = pattern_bytes(3 << 20, 7);
    a.put("k", &value).unwrap();
    assert_eq!(segments_of(&reader, "k"), [a.segment_name().to_string()]);
    let id = reader.create_copy_task("k", &[b.segment_name().to_string()]).unwrap();
    let t = ended(&reader, id, Duration::from_secs(30));
    assert_eq!(t.status, TaskStatus::TaskSuccess as i32, "{t:?}");
    assert_eq!(t.r#type, TaskType::ReplicaCopy as i32);
    assert_eq!(t.assigned_client, a.id(), "run by the holder of the bytes");
    assert_eq!(t.message, "Task completed successfully");
    assert!(t.created_at_ms_epoch > 0 && t.last_updated_at_ms_epoch >= t.created_at_ms_epoch);
    let mut both = vec![a.segment_name().to_string(), b.segment_name().to_string()];
    both.sort();
    assert_eq!(segments_of(&reader, "k"), both);
    // The source's client goes: the copy still serves the key.
    a.close().unwrap();
    drop(a);
    assert!(eventually(Duration::from_secs(10), || segments_of(&reader, "k") == [b.segment_name().to_string()]));
    assert_eq!(reader.get("k").unwrap(), value);
}

#[test]
fn a_move_leaves_exactly_one_replica_on_the_target() {
    let m = loopback_master(MasterConfig::default());
    let (a, b) = (client(&m, 16 << 20), client(&m, 16 << 20));
    let value = pattern_bytes(1 << 20, 3);
    a.put("k", &value).unwrap();
    let id = b.create_move_task("k", a.segment_name(), b.segment_name()).unwrap();
    let t = ended(&b, id, Duration::from_secs(30));
    assert_eq!((t.status, t.r#type), (TaskStatus::TaskSuccess as i32, TaskType::ReplicaMove as i32), "{t:?}");
    assert_eq!(segments_of(&b, "k"), [b.segment_name().to_string()]);
    assert_eq!(b.get("k").unwrap(), value);
    assert_eq!(a.get("k").unwrap(), value);
}

#[test]
fn bad_task_requests_get_upstreams_codes() {
    let m = loopback_master(MasterConfig::default());
    let (a, b) = (client(&m, 16 << 20), client(&m, 16 << 20));
    a.put("k", &pattern_bytes(4096, 1)).unwrap();
    let (sa, sb) = (a.segment_name().to_string(), b.segment_name().to_string());
    let invalid = |r: crescent_store::Result<(u64, u64)>| matches!(r, Err(StoreError::InvalidArgument(_)));
    assert!(invalid(a.create_copy_task("k", &[])), "no target");
    assert!(invalid(a.create_copy_task("k", &["10.0.0.1:1".into()])), "unknown segment");
    assert!(matches!(a.create_copy_task("missing", std::slice::from_ref(&sb)), Err(StoreError::NotFound(_))));
    assert!(invalid(a.create_move_task("k", &sa, &sa)), "same source and target");
    assert!(invalid(a.create_move_task("k", &sb, &sa)), "the source holds no replica");
    assert!(invalid(a.create_move_task("k", &sa, "10.0.0.1:1")), "unknown target");
    assert!(matches!(a.create_move_task("missing", &sa, &sb), Err(StoreError::NotFound(_))));
    assert!(matches!(a.query_task((1, 2)), Err(StoreError::TaskNotFound(_))), "unknown task id");
    // Nothing was queued by the refused calls.
    assert_eq!(segments_of(&a, "k"), [sa]);
}

#[test]
fn a_task_on_a_key_removed_meanwhile_ends_failed() {
    let m = loopback_master(MasterConfig::default());
    // The source's client pings seldom: the key goes before it takes the task.
    let a = StoreClient::connect(crescent_store::ClientConfig {
        global_segment_size: 16 << 20,
        local_buffer_size: 4 << 20,
        ping_interval: Duration::from_secs(2),
        ..loopback_client_config(&m)
    })
    .unwrap();
    let b = client(&m, 16 << 20);
    a.put("k", &pattern_bytes(4096, 2)).unwrap();
    let id = b.create_copy_task("k", &[b.segment_name().to_string()]).unwrap();
    b.remove("k").unwrap();
    let t = ended(&b, id, Duration::from_secs(30));
    assert_eq!(t.status, TaskStatus::TaskFailed as i32, "{t:?}");
    assert!(t.message.starts_with("OBJECT_NOT_FOUND"), "a clear reason: {t:?}");
    assert!(!b.exists("k").unwrap(), "nothing half-copied left readable");
}

#[test]
fn batch_replica_clear_takes_only_the_callers_unleased_objects() {
    let m = loopback_master(MasterConfig { lease_ttl: Duration::from_millis(200), ..MasterConfig::default() });
    let (a, b) = (client(&m, 16 << 20), client(&m, 16 << 20));
    for k in ["a/0", "a/1"] {
        a.put(k, &pattern_bytes(4096, 4)).unwrap();
    }
    b.put("b/0", &pattern_bytes(4096, 5)).unwrap();
    let keys: Vec<String> = ["a/0", "a/1", "b/0", "missing"].iter().map(|k| k.to_string()).collect();
    // A segment that holds none of them: nothing cleared.
    assert!(a.batch_replica_clear(&keys, b.segment_name()).unwrap().is_empty());
    assert_eq!(a.batch_replica_clear(&keys, a.segment_name()).unwrap(), ["a/0", "a/1"]);
    assert!(!a.exists("a/0").unwrap() && !a.exists("a/1").unwrap());
    assert!(b.exists("b/0").unwrap(), "another client's object stays");
    // A leased object is skipped.
    b.get("b/0").unwrap();
    assert!(b.batch_replica_clear(&keys, "").unwrap().is_empty());
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(b.batch_replica_clear(&keys, "").unwrap(), ["b/0"]);
    assert!(!b.exists("b/0").unwrap());
}

#[test]
fn a_task_reaches_its_client_at_once_not_at_its_next_ping() {
    // The holder pings once a minute: the master's nudge on its owner stream, not its ping
    // tick, is what hands it the task (it stays alive on the master meanwhile: 90 s TTL).
    let m = loopback_master(MasterConfig { client_ttl: Duration::from_secs(90), ..MasterConfig::default() });
    let a = StoreClient::connect(crescent_store::ClientConfig {
        global_segment_size: 16 << 20,
        local_buffer_size: 4 << 20,
        ping_interval: Duration::from_secs(60),
        ..loopback_client_config(&m)
    })
    .unwrap();
    let b = client(&m, 16 << 20);
    let value = pattern_bytes(1 << 20, 9);
    a.put("k", &value).unwrap();
    let id = b.create_copy_task("k", &[b.segment_name().to_string()]).unwrap();
    let t = ended(&b, id, Duration::from_secs(20));
    assert_eq!(t.status, TaskStatus::TaskSuccess as i32, "{t:?}");
    assert_eq!(t.assigned_client, a.id());
    let mut both = vec![a.segment_name().to_string(), b.segment_name().to_string()];
    both.sort();
    assert_eq!(segments_of(&b, "k"), both);
}
