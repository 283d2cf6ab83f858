//! The store across two hosts made by the test (network namespaces joined by a veth pair):
//! the master and client A on host A, client B on host B, each a separate process.
//! Skipped with a printed reason where namespaces cannot be made (not root).

use std::time::{Duration, Instant};

use crescent_tests::netns::HostPair;
use crescent_tests::store::{spawn_master, ClientProc};

struct Cluster {
    hosts: HostPair,
    _master: crescent_tests::ChildGuard,
    master: String,
}

fn cluster(tag: &str, master_args: &[&str]) -> Option<Cluster> {
    let hosts = HostPair::create_or_skip(tag, "the store on two hosts")?;
    let rpc = format!("{}:0", hosts.addr_a);
    let mut args = vec!["--rpc-address", &rpc, "--admin-address", ""];
    args.extend_from_slice(master_args);
    let (master_proc, master) = spawn_master(&hosts.exec_prefix(&hosts.a), &args);
    Some(Cluster { hosts, _master: master_proc, master })
}

impl Cluster {
    fn client(&self, on_b: bool, segment: &str, extra: &[&str]) -> ClientProc {
        let (ns, addr) = if on_b { (&self.hosts.b, &self.hosts.addr_b) } else { (&self.hosts.a, &self.hosts.addr_a) };
        let mut args =
            vec!["--master", &self.master, "--local-hostname", addr, "--segment-size", segment, "--buffer-size", "16M"];
        args.extend_from_slice(extra);
        ClientProc::spawn(&self.hosts.exec_prefix(ns), &args)
    }
}

#[test]
fn put_on_one_host_get_on_the_other_with_batches_replicas_and_regex_removal() {
    // A long read lease: the read of k0 must still hold it at the last step, however slow
    // the steps in between are.
    let Some(c) = cluster("sput", &["--lease-ttl-ms", "120000"]) else { return };
    let mut a = c.client(false, "64M", &[]);
    let mut b = c.client(true, "64M", &[]);
    // Single values of several sizes, read back on the other host.
    for (i, size) in ["1", "4097", "1M", "10M"].iter().enumerate() {
        a.ok(&format!("put k{i} {size} {i}"));
        let got = b.ok(&format!("get k{i} {i} {size}"));
        assert!(got.ends_with("verified"), "{got}");
    }
    // Batches: one master round trip each way.
    assert_eq!(b.ok("batch_put 7 bk1:100K bk2:2M bk3:3"), "ok ok ok");
    assert_eq!(a.ok("batch_get 7 bk1 bk2 bk3 missing"), "102400 2097152 3 OBJECT_NOT_FOUND");
    // Two replicas land on the two distinct segments.
    let mut r = c.client(true, "64M", &["--replicas", "2"]);
    r.ok("put two 1M 9");
    let q = a.ok("query two");
    let replicas = q.split("replicas=").nth(1).unwrap();
    let segs: std::collections::HashSet<&str> = replicas.split(',').collect();
    assert_eq!(segs.len(), 2, "{q}");
    assert!(a.ok("get two 9 1M").ends_with("verified"));
    // Existence, size, removal.
    assert_eq!(b.ok("exists k3"), "true");
    assert_eq!(b.ok("size k3"), (10u64 << 20).to_string());
    assert_eq!(b.ok("exists nope"), "false");
    assert!(b.cmd("get nope 1").starts_with("err OBJECT_NOT_FOUND"));
    // Keys read above are leased (120 s): regex removal skips them; fresh keys go.
    a.ok("put tmp/x 10 1");
    a.ok("put tmp/y 10 1");
    assert_eq!(b.ok("remove_regex ^tmp/"), "2");
    assert_eq!(b.ok("exists tmp/x"), "false");
    assert!(b.cmd("remove k0").starts_with("err OBJECT_LEASED"), "a leased object is not removed");
}

#[test]
fn eviction_keeps_a_full_pool_accepting_puts_and_spares_leased_objects() {
    let Some(c) = cluster("sevi", &["--lease-ttl-ms", "60000"]) else { return };
    let mut a = c.client(false, "8M", &[]);
    let mut b = c.client(true, "8M", &[]);
    a.ok("put keep 1M 1");
    assert!(b.ok("get keep 1 1M").ends_with("verified")); // leased for 60 s
    for i in 0..40 {
        a.ok(&format!("put fill{i} 1M {i}"));
    }
    // 16 MiB of pool, 41 MiB put: eviction made room, the leased object is still readable.
    assert!(b.ok("get keep 1 1M").ends_with("verified"));
    assert!(b.ok("get fill39 39 1M").ends_with("verified"), "the newest is there");
    assert_eq!(b.ok("exists fill0"), "false", "the oldest unleased was evicted");
    // exists probes do not renew leases: probed keys are still evicted.
    for _ in 0..20 {
        assert_eq!(b.ok("exists fill38"), "true");
    }
    for i in 40..80 {
        a.ok(&format!("put fill{i} 1M {i}"));
    }
    assert_eq!(b.ok("exists fill38"), "false", "probing did not protect it");
    assert_eq!(b.ok("exists fill39"), "true", "the read lease did");
    assert!(b.ok("get keep 1 1M").ends_with("verified"));
}

#[test]
fn a_killed_client_loses_its_replicas_within_the_ttl_and_a_stalled_one_remounts() {
    // A TTL of 4 s against the clients' ping every 1 s: a live client's late ping (a loaded
    // host) does not get it dropped; the dead and the stalled ones are waited for below.
    let Some(c) = cluster("sliv", &["--client-ttl-ms", "4000", "--allocation-strategy", "local-first"]) else { return };
    let mut a = c.client(false, "16M", &[]);
    let mut b = c.client(true, "16M", &[]);
    a.ok("put on-a 1M 1"); // local-first: stored in A's segment
    assert!(a.ok("query on-a").ends_with(&a.segment));
    assert!(b.ok("get on-a 1 1M").ends_with("verified"));
    a.child.kill_now();
    // Right away, the get fails fast with a clear error (the holder is gone) ...
    let t = Instant::now();
    let answer = b.cmd("get on-a 1");
    assert!(answer.starts_with("err"), "{answer}");
    assert!(t.elapsed() < Duration::from_secs(10), "failed fast");
    // ... and after the TTL the master drops A's replicas: the key is gone.
    let deadline = Instant::now() + Duration::from_secs(30);
    while b.ok("exists on-a") == "true" {
        assert!(Instant::now() < deadline, "replicas of the dead client were dropped");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(b.cmd("get on-a 1").starts_with("err OBJECT_NOT_FOUND"));

    // A client that stalls past the TTL is dropped, then remounts on its next heartbeat.
    let mut s = c.client(false, "16M", &[]);
    s.ok("put on-s 1M 5");
    let pid = s.pid().to_string();
    assert!(std::process::Command::new("kill").args(["-STOP", &pid]).status().unwrap().success());
    assert!(
        crescent_tests::eventually(Duration::from_secs(30), || b.ok("exists on-s") == "false"),
        "dropped while silent"
    );
    assert!(std::process::Command::new("kill").args(["-CONT", &pid]).status().unwrap().success());
    // After remounting, the client's segment takes puts again (local-first puts land there).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let answer = s.cmd("put again 1M 6");
        if answer == "ok" && s.ok("query again").ends_with(&s.segment) {
            break;
        }
        assert!(Instant::now() < deadline, "the client remounted: {answer}");
        let _ = s.cmd("remove again");
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(b.ok("get again 6 1M").ends_with("verified"));
}

/// Shapes the egress of host A's end of the link (`rate` as tc takes it), or removes it.
fn shape_a(c: &Cluster, rate: Option<&str>) {
    let mut cmd = std::process::Command::new("ip");
    cmd.args(["netns", "exec", &c.hosts.a, "tc", "qdisc"]);
    match rate {
        Some(r) => cmd.args(["replace", "dev", &c.hosts.veth_a, "root", "tbf", "rate", r, "burst", "16kb"]),
        None => cmd.args(["del", "dev", &c.hosts.veth_a, "root"]),
    };
    let status = cmd.args(rate.map_or(&[][..], |_| &["latency", "1s"][..])).status().expect("run tc");
    assert!(status.success(), "tc qdisc on {}", c.hosts.veth_a);
}

#[test]
fn a_read_that_outlasts_its_lease_fails_instead_of_returning_bytes_that_may_be_replaced() {
    // A 3 s lease (time enough for the quick reads on a loaded host), and a link slowed so
    // that reading 2 MiB from A takes at least 5.6 s (16.8 Mbit at 3 Mbit/s, less the 16 KiB
    // burst): past the lease, A's range may already hold another object, so the get must not
    // return it.
    let Some(c) = cluster("slea", &["--lease-ttl-ms", "3000", "--allocation-strategy", "local-first"]) else {
        return;
    };
    let mut a = c.client(false, "16M", &[]);
    let mut b = c.client(true, "16M", &[]);
    a.ok("put slow 2M 3"); // local-first: in A's segment, so B reads across the link
    assert!(b.ok("get slow 3 2M").ends_with("verified"), "a quick read within the lease");
    shape_a(&c, Some("3mbit"));
    let answer = b.cmd("get slow 3");
    assert!(answer.starts_with("err LEASE_EXPIRED"), "{answer}");
    assert_eq!(b.ok("batch_get 3 slow"), "LEASE_EXPIRED", "batch gets check the lease too");
    shape_a(&c, None);
    assert!(b.ok("get slow 3 2M").ends_with("verified"), "read again, within a new lease");
}
