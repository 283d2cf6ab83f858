//! The disk tier across processes: `crescent client` processes SIGKILLed in the middle of
//! heavy offloading, again and again, then every key reads back exactly or not at all; and a
//! disk copy read from another host (network namespaces) through its owner.

use std::time::{Duration, Instant};

use crescent_tests::netns::HostPair;
use crescent_tests::store::{spawn_master, ClientProc};
use rand::Rng;

fn disk_stat(c: &mut ClientProc, name: &str) -> u64 {
    let stats: serde_json::Value = serde_json::from_str(&c.ok("disk_stats")).expect("disk_stats is JSON");
    stats[name].as_u64().unwrap_or_else(|| panic!("no {name} in {stats}"))
}

fn files_named(dir: &std::path::Path, suffix: &str) -> usize {
    let mut n = 0;
    for sub in std::fs::read_dir(dir).unwrap().flatten().filter(|d| d.path().is_dir()) {
        n += std::fs::read_dir(sub.path())
            .unwrap()
            .flatten()
            .filter(|f| f.file_name().to_string_lossy().ends_with(suffix))
            .count();
    }
    n
}

#[test]
fn sigkill_during_heavy_offload_never_makes_a_get_return_wrong_bytes() {
    // A TTL of 4 s against the clients' ping every 1 s: a live client's late ping (a loaded
    // host, a disk busy with fsyncs) does not get it dropped; the dead ones are waited for.
    let (_master, master) =
        spawn_master(&[], &["--rpc-address", "127.0.0.1:0", "--admin-address", "", "--client-ttl-ms", "4000"]);
    let root = tempfile::tempdir().unwrap();
    let root_s = root.path().to_str().unwrap().to_string();
    let args = [
        "--master",
        &master,
        "--local-hostname",
        "127.0.0.1",
        "--segment-size",
        "128M",
        "--buffer-size",
        "16M",
        "--storage-root",
        &root_s,
        "--storage-capacity",
        "2G",
    ];
    // A round's last value is the largest (its write is the longest).
    let sizes = [("64K", 64 << 10), ("300K", 300 << 10), ("1M", 1 << 20), ("5000", 5000), ("2M", 2 << 20)];
    // (key, seed, size in bytes)
    let mut keys: Vec<(String, u64, u64)> = Vec::new();
    // Keys removed (the master said ok): their files are kept for reuse and written over by
    // later offloads, under the same kills.
    let mut removed: Vec<String> = Vec::new();
    let mut rng = rand::rng();
    // Even rounds kill at a random time (in the middle of the puts, or after them); odd rounds
    // right after the last put (the largest value) returned, while its offload is still queued
    // or being written: an acknowledged put whose file never appears shows the kill landed
    // mid-offload. Temporary files found at each restart show kills that landed in the middle
    // of a file's write (rarer: a write is short next to the time between them).
    let mut interrupted: Vec<u64> = Vec::new();
    let mut acked: Vec<String> = Vec::new();
    // The memory segments of the clients killed.
    let mut dead: Vec<String> = Vec::new();
    for round in 0..10 {
        let mut c = ClientProc::spawn(&[], &args);
        if round > 0 {
            interrupted.push(disk_stat(&mut c, "incomplete_removed"));
            assert_eq!(disk_stat(&mut c, "corrupt_removed"), 0, "a SIGKILL never leaves a damaged final file");
            for j in 0..15 {
                let key = format!("r{}/k{j}", round - 1);
                if c.cmd(&format!("remove {key}")) == "ok" {
                    removed.push(key);
                }
            }
        }
        for j in 0..50 {
            let key = format!("r{round}/k{j}");
            let seed = round * 1000 + j;
            let (size, bytes) = sizes[j as usize % sizes.len()];
            let put = format!("put {key} {size} {seed}");
            if round % 2 == 0 {
                c.send(&put);
            } else if c.cmd(&put) == "ok" {
                acked.push(key.clone());
            }
            keys.push((key, seed, bytes));
        }
        if round % 2 == 0 {
            std::thread::sleep(Duration::from_millis(rng.random_range(100..900)));
        }
        c.child.kill_now();
        dead.push(c.segment.clone());
    }
    // A restart on the same root: temporary files of interrupted writes are gone, nothing
    // damaged was found, and once the dead clients' memory is dropped (TTL) every key either
    // reads back exactly (from disk) or is not found.
    let mut c = ClientProc::spawn(&[], &args);
    interrupted.push(disk_stat(&mut c, "incomplete_removed"));
    let dir = root.path().join("default");
    assert_eq!(files_named(&dir, ".tmp"), 0);
    // Every file's value is read and checked once after the start: none is damaged.
    let checked = crescent_tests::eventually(Duration::from_secs(60), || disk_stat(&mut c, "unverified") == 0);
    assert!(checked, "the files found at start were never all checked");
    assert_eq!(disk_stat(&mut c, "corrupt_removed"), 0, "a SIGKILL never leaves a damaged final file");
    println!("temporary files of interrupted writes found after each kill: {interrupted:?}");
    // The dead clients' memory is dropped once they have been silent for the TTL: until then
    // their replicas are listed, and a get may try one of them.
    dead.retain(|s| *s != c.segment);
    let dropped = crescent_tests::eventually(Duration::from_secs(60), || {
        keys.iter().all(|(key, _, _)| {
            let answer = c.cmd(&format!("query {key}"));
            let listed = answer.split("replicas=").nth(1).unwrap_or("");
            !listed.split(',').any(|r| dead.iter().any(|d| d == r))
        })
    });
    assert!(dropped, "the master dropped the killed clients' segments");
    let (mut verified, mut missing) = (0, 0);
    let mut lost: std::collections::BTreeMap<String, u32> = Default::default();
    for (key, seed, size) in &keys {
        // The value's length is checked too: a truncated or over-long value is a mismatch.
        let answer = c.cmd(&format!("get {key} {seed} {size}"));
        if removed.contains(key) {
            assert!(answer.starts_with("err OBJECT_NOT_FOUND"), "get of removed {key}: {answer}");
        }
        if answer == format!("ok {size} verified") {
            verified += 1;
        } else if answer.starts_with("err OBJECT_NOT_FOUND") {
            missing += 1;
            if acked.contains(key) && !removed.contains(key) {
                let r = key[1..].split('/').next().unwrap().to_string();
                *lost.entry(r).or_insert(0) += 1;
            }
        } else {
            panic!("get {key}: {answer}");
        }
    }
    println!("acknowledged puts with no file, by round: {lost:?}");
    assert!(!lost.is_empty(), "no kill landed while an acknowledged put's offload was on its way");
    let retired = disk_stat(&mut c, "retired_files");
    println!(
        "{verified} keys read back from disk, {missing} not found, of {} ({} removed; {retired} files kept for reuse)",
        keys.len(),
        removed.len()
    );
    assert!(verified > 0, "some offloads completed before the kills");
    assert_eq!(verified as u64, disk_stat(&mut c, "files"), "every file on disk is readable");
}

#[test]
fn a_disk_copy_is_read_from_another_host_through_its_owner() {
    let Some(hosts) = HostPair::create_or_skip("ssdr", "a disk copy read from another host") else { return };
    let rpc = format!("{}:0", hosts.addr_a);
    let (_master, master) = spawn_master(&hosts.exec_prefix(&hosts.a), &["--rpc-address", &rpc, "--admin-address", ""]);
    let root = tempfile::tempdir().unwrap();
    let root_s = root.path().to_str().unwrap().to_string();
    let common = |addr: &str| -> Vec<String> {
        ["--master", &master, "--local-hostname", addr, "--segment-size", "8M", "--buffer-size", "8M"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    };
    let mut a_args = common(&hosts.addr_a);
    a_args.extend(["--storage-root".to_string(), root_s, "--storage-capacity".into(), "1G".into()]);
    let a_refs: Vec<&str> = a_args.iter().map(|s| s.as_str()).collect();
    let mut a = ClientProc::spawn(&hosts.exec_prefix(&hosts.a), &a_refs);
    let b_args = common(&hosts.addr_b);
    let b_refs: Vec<&str> = b_args.iter().map(|s| s.as_str()).collect();
    let mut b = ClientProc::spawn(&hosts.exec_prefix(&hosts.b), &b_refs);
    a.ok("put cold/1 3M 11");
    a.ok("put cold/2 100K 12");
    a.ok("flush");
    for i in 0..40 {
        b.ok(&format!("put fill{i} 1M {i}"));
    }
    let q = b.ok("query cold/1");
    assert!(q.contains("(SSD)") && !q.contains(&a.segment), "only the disk copy is left: {q}");
    let t = Instant::now();
    assert_eq!(b.ok("get cold/1 11 3M"), "3145728 verified");
    assert_eq!(b.ok("batch_get 12 cold/2:100K"), "102400");
    assert!(t.elapsed() < Duration::from_secs(30));
    assert!(disk_stat(&mut a, "served_reads") >= 2);
    // The owner gone: its disk copies go with it, and the get says so.
    a.child.kill_now();
    let answer = b.cmd("get cold/1 11");
    assert!(answer.starts_with("err"), "{answer}");
}

/// Sends `signal` (`STOP`, `CONT`) to a process.
fn signal(pid: u32, signal: &str) {
    let ok = std::process::Command::new("kill").args([&format!("-{signal}"), &pid.to_string()]).status().unwrap();
    assert!(ok.success(), "kill -{signal} {pid}");
}

#[test]
fn a_removal_the_owner_missed_survives_a_master_restart() {
    // A master on a fixed port, so that a second one can take its place.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let rpc = format!("127.0.0.1:{port}");
    let master_args = ["--rpc-address", rpc.as_str(), "--admin-address", ""];
    let (mut first_master, master) = spawn_master(&[], &master_args);
    let (root_a, root_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let client = |root: &std::path::Path| {
        let root = root.to_str().unwrap();
        let args = ["--master", master.as_str(), "--local-hostname", "127.0.0.1", "--segment-size", "8M"];
        let disk = ["--buffer-size", "8M", "--storage-root", root, "--storage-capacity", "256M"];
        ClientProc::spawn(&[], &[&args[..], &disk[..]].concat())
    };
    let (mut a, mut b) = (client(root_a.path()), client(root_b.path()));
    a.ok("put gone/1 100K 5");
    a.ok("put kept/1 100K 6");
    a.ok("flush");
    assert_eq!(disk_stat(&mut a, "files"), 2);

    // The owner of the disk copies is frozen (alive to the master, deaf to removals) while B
    // removes a key: the removal waits at the master for A's disk.
    signal(a.pid(), "STOP");
    b.ok("remove gone/1");
    // B, which has a disk too, keeps the removals pending at the master, durably.
    let tombstones = root_b.path().join("default").join("TOMBSTONES");
    let kept = crescent_tests::eventually(Duration::from_secs(8), || {
        std::fs::read_to_string(&tombstones).is_ok_and(|t| t.contains("gone/1"))
    });
    assert!(kept, "B keeps the removal pending at the master");
    // The master restarts, knowing nothing; then A wakes up and re-announces its files.
    first_master.kill_now();
    let (_second_master, _) = spawn_master(&[], &master_args);
    signal(a.pid(), "CONT");
    assert!(
        crescent_tests::eventually(Duration::from_secs(30), || b.cmd("exists kept/1") == "ok true"),
        "A re-announced its disk copies to the new master"
    );
    assert!(
        crescent_tests::eventually(Duration::from_secs(30), || b.cmd("exists gone/1") == "ok false"
            && disk_stat(&mut a, "files") == 1),
        "the removed key does not come back, and its file is deleted"
    );
    assert_eq!(b.ok("get kept/1 6 100K"), "102400 verified");
}
