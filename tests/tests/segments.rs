//! Segments a client mounts and unmounts while it runs (Mooncake's `mount_segment`,
//! `allocate_and_mount_segment`, `unmount_segment`, `unmount_and_free_segment`): values
//! round-trip through them, an unmount takes the replicas it held (an object whose only
//! replica it was is gone, one with another replica keeps it), bad input is refused, and a
//! restarted master learns what they hold from their owner.

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crescent_store::proto::PutOptions;
use crescent_store::{ClientConfig, StoreApi, StoreClient, StoreError};
use crescent_tests::services::free_port;
use crescent_tests::store::{loopback_client, loopback_master, pattern_bytes, spawn_master};

const MIB: u64 = 1 << 20;

/// Where the replicas of `key` are, by segment name.
fn holders(c: &StoreClient, key: &str) -> Vec<String> {
    let reply = c.query(key).expect("query");
    reply.replicas.iter().map(|r| r.segment_name.clone()).collect()
}

fn two_replicas() -> PutOptions {
    PutOptions { replica_num: 2, ..PutOptions::default() }
}

#[test]
fn values_round_trip_through_mounted_segments_and_an_unmount_takes_only_what_it_held() {
    let m = loopback_master(crescent_store::MasterConfig::default());
    // Pure consumers: the only memory in the pool is what they mount at run time.
    let (a, b) = (loopback_client(&m, 0), loopback_client(&m, 0));
    let (ids, allocated) = a.allocate_and_mount_segment(5 * MIB, "").unwrap();
    assert_eq!(ids.len(), 1);
    assert_eq!(allocated, 8 * MIB, "rounded up to Mooncake's 4 MiB slabs");
    let a_seg = ids[0].clone();

    // Only a's new segment has room: b's put lands there, both read it back.
    let only = pattern_bytes((3 * MIB) as usize + 17, 1);
    b.put("only", &only).unwrap();
    assert!(holders(&b, "only").iter().all(|s| s.ends_with(&a_seg)), "{:?}", holders(&b, "only"));
    assert_eq!(b.get("only").unwrap(), only);
    assert_eq!(a.get("only").unwrap(), only);

    // A second segment (b's): a put of two replicas is on both.
    let (b_ids, _) = b.allocate_and_mount_segment(4 * MIB, "cpu:0").unwrap();
    let both = pattern_bytes(MIB as usize, 2);
    a.put_with("both", &both, &two_replicas()).unwrap();
    assert_eq!(holders(&a, "both").len(), 2);

    // a unmounts its segment: "only" is gone, "both" keeps b's replica.
    let r = a.unmount_segments(std::slice::from_ref(&a_seg), true, Duration::ZERO);
    assert!(r[0].is_ok(), "{r:?}");
    assert!(matches!(b.get("only"), Err(StoreError::NotFound(_))), "{:?}", b.get("only").map(|v| v.len()));
    assert!(!b.exists("only").unwrap());
    assert_eq!(b.get("both").unwrap(), both);
    assert_eq!(a.get("both").unwrap(), both);
    let left = holders(&b, "both");
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(left[0].ends_with(&b_ids[0]), "{left:?}");

    // The pool is b's segment alone now, and it works.
    let after = pattern_bytes(MIB as usize, 3);
    a.put("after", &after).unwrap();
    assert_eq!(a.get("after").unwrap(), after);
    assert!(b.unmount_segments(&b_ids, true, Duration::ZERO)[0].is_ok());
    assert!(a.put("none", &after).is_err(), "no segment left in the pool");
}

#[test]
fn bad_segment_calls_are_refused_and_change_nothing() {
    let m = loopback_master(crescent_store::MasterConfig::default());
    let (a, b) = (loopback_client(&m, 0), loopback_client(&m, 0));
    let invalid = |r: &crescent_store::Result<()>| matches!(r, Err(StoreError::InvalidArgument(_)));

    assert!(matches!(a.allocate_and_mount_segment(0, ""), Err(StoreError::InvalidArgument(_))));
    let r = a.unmount_segments(&["not-a-segment".to_string()], false, Duration::ZERO);
    assert!(invalid(&r[0]), "{r:?}");

    let (ids, _) = a.allocate_and_mount_segment(4 * MIB, "").unwrap();
    // Another client's id, and the wrong method for it, are refused; it stays mounted.
    assert!(invalid(&b.unmount_segments(&ids, true, Duration::ZERO)[0]));
    assert!(invalid(&a.unmount_segments(&ids, false, Duration::ZERO)[0]));
    let v = pattern_bytes(1000, 4);
    b.put("k", &v).unwrap();
    assert_eq!(b.get("k").unwrap(), v);
    // Unmounted once; the second time it is unknown.
    assert!(a.unmount_segments(&ids, true, Duration::ZERO)[0].is_ok());
    assert!(invalid(&a.unmount_segments(&ids, true, Duration::ZERO)[0]));
    assert!(matches!(b.get("k"), Err(StoreError::NotFound(_))));
}

#[test]
fn a_file_mounted_as_a_segment_holds_the_values_put_there() {
    let m = loopback_master(crescent_store::MasterConfig::default());
    let (a, b) = (loopback_client(&m, 0), loopback_client(&m, 0));
    let dir = std::env::temp_dir().join(format!("crescent-segments-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("segment");
    let mut file = std::fs::File::create(&path).unwrap();
    file.write_all(&vec![0u8; (8 * MIB) as usize]).unwrap();
    drop(file);

    // Bad ranges: past the file's end, an offset off the page size; size 0 mounts nothing.
    assert!(matches!(a.mount_segment(&path, 0, 9 * MIB, ""), Err(StoreError::InvalidArgument(_))));
    assert!(matches!(a.mount_segment(&path, 100, MIB, ""), Err(StoreError::InvalidArgument(_))));
    assert!(matches!(a.mount_segment(&dir.join("absent"), 0, MIB, ""), Err(StoreError::InvalidArgument(_))));
    assert_eq!(a.mount_segment(&path, 0, 0, "").unwrap(), Vec::<String>::new());

    let ids = a.mount_segment(&path, 4 * MIB, 4 * MIB, "").unwrap();
    let v = pattern_bytes((2 * MIB) as usize, 5);
    b.put("f", &v).unwrap();
    assert_eq!(b.get("f").unwrap(), v);
    // The bytes are the file's: the value is in its second half.
    let on_disk = std::fs::read(&path).unwrap();
    let at = on_disk.windows(64).position(|w| w == &v[..64]).expect("the value is in the file");
    assert!(at >= (4 * MIB) as usize);
    assert_eq!(&on_disk[at..at + v.len()], &v[..]);

    assert!(matches!(a.unmount_segments(&ids, true, Duration::ZERO)[0], Err(StoreError::InvalidArgument(_))));
    assert!(a.unmount_segments(&ids, false, Duration::ZERO)[0].is_ok());
    assert!(matches!(b.get("f"), Err(StoreError::NotFound(_))));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_restarted_master_learns_what_mounted_segments_hold() {
    let port = free_port();
    let args = |port: u16| {
        let rpc = format!("127.0.0.1:{port}");
        vec![
            "--rpc-address".to_string(),
            rpc,
            "--admin-address".into(),
            String::new(),
            "--client-ttl-ms".into(),
            "10000".into(),
        ]
    };
    let spawn = |port| {
        let a = args(port);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        spawn_master(&[], &a).0
    };
    let mut master = spawn(port);
    let client = || {
        Arc::new(
            StoreClient::connect(ClientConfig {
                master_server_address: format!("127.0.0.1:{port}"),
                local_hostname: Some("127.0.0.1".into()),
                global_segment_size: 0,
                local_buffer_size: 4 << 20,
                ping_interval: Duration::from_millis(100),
                ..ClientConfig::default()
            })
            .expect("client connects"),
        )
    };
    let (a, b) = (client(), client());
    let (ids, _) = a.allocate_and_mount_segment(8 * MIB, "").unwrap();
    let v = pattern_bytes(MIB as usize + 5, 6);
    b.put("kept", &v).unwrap();

    master.kill_now();
    master = spawn(port);
    let deadline = Instant::now() + Duration::from_secs(20);
    let got = loop {
        match b.get("kept") {
            Ok(got) => break got,
            Err(e) if Instant::now() >= deadline => panic!("the value is gone after the restart: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    assert_eq!(got, v);
    // The new master knows the segment as a's: a can unmount it, and the value goes with it.
    assert!(a.unmount_segments(&ids, true, Duration::ZERO)[0].is_ok());
    assert!(matches!(b.get("kept"), Err(StoreError::NotFound(_))));
    drop(master);
}
