//! Fault injection on the store (issue 24): `crescent-master` and a holder client A in one
//! network namespace, a client B in another, each a process. A holds objects; B gets them and
//! puts (and reads back) its own while a fault hits A, the link, the master, B's disk or B's
//! descriptors. Every call must end within its bound (the transfer deadline and the master's
//! connect time, plus a margin), never return wrong bytes, and calls must succeed again once
//! the fault is cleared, with no process holding more descriptors, threads or memory.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crescent_tests::faults::{
    assert_settles, bound, during_fault, host_pair, limit_fds, lowest_free_fd, rounds, signal, usage, Link, Usage,
    HOLD, RECOVERY,
};
use crescent_tests::netns::HostPair;
use crescent_tests::store::{spawn_master, ClientProc};
use crescent_tests::tmpfs::Tmpfs;
use crescent_tests::ChildGuard;
use rustix::process::Signal;

/// Each client's transfer deadline (`MC_TRANSFER_TIMEOUT`), seconds.
const TRANSFER_TIMEOUT: &str = "1";
const MASTER_PORT: u16 = 15100;
/// The master's fast RPC port: the hot calls go there, so a fault that spares the master
/// spares both of its ports.
const MASTER_FAST_PORT: u16 = 15101;
/// Objects A holds, of [`VALUE`] bytes each.
const HELD: usize = 4;
const VALUE: u64 = 1 << 20;

/// A store call's bound: the master's connect time (3 s) and the transfer deadline, with the
/// margin of [`bound`].
fn limit() -> Duration {
    bound(Duration::from_secs(3 + 1))
}

struct Cluster {
    hosts: HostPair,
    master: Mutex<ChildGuard>,
    master_addr: String,
    master_args: Vec<String>,
}

/// How a store call ended.
#[derive(Debug)]
struct Answer {
    line: String,
    took: Duration,
    command: String,
}

impl Answer {
    fn is_ok(&self) -> bool {
        self.line.starts_with("ok") && !self.line.contains("MISMATCH")
    }

    /// A value other than the one put: never allowed.
    fn is_corrupt(&self) -> bool {
        ["MISMATCH", "differs from the pattern", "bytes instead of"].iter().any(|m| self.line.contains(m))
    }
}

fn call(c: &mut ClientProc, command: &str) -> Answer {
    let start = Instant::now();
    let line = c.cmd(command);
    Answer { line, took: start.elapsed(), command: command.to_string() }
}

fn check(a: &Answer, limit: Duration) {
    assert!(!a.is_corrupt(), "{:?} returned a wrong value: {a:?}", a.command);
    assert!(a.took <= limit, "{:?} took {:?}, more than its bound {limit:?}: {a:?}", a.command, a.took);
}

fn cluster(tag: &str) -> Option<Cluster> {
    let hosts = host_pair(tag)?;
    let rpc = format!("{}:{MASTER_PORT}", hosts.addr_a);
    let master_args: Vec<String> = [
        "--rpc-address",
        &rpc,
        "--admin-address",
        "",
        "--client-ttl-ms",
        "10000",
        "--fast_rpc_port",
        &MASTER_FAST_PORT.to_string(),
    ]
    .map(String::from)
    .to_vec();
    let args: Vec<&str> = master_args.iter().map(String::as_str).collect();
    let (master, master_addr) = spawn_master(&hosts.exec_prefix(&hosts.a), &args);
    Some(Cluster { hosts, master: Mutex::new(master), master_addr, master_args })
}

impl Cluster {
    fn client(&self, on_b: bool, extra: &[&str]) -> ClientProc {
        self.client_of(on_b, "32M", extra)
    }

    fn client_of(&self, on_b: bool, segment: &str, extra: &[&str]) -> ClientProc {
        let (ns, addr) = if on_b { (&self.hosts.b, &self.hosts.addr_b) } else { (&self.hosts.a, &self.hosts.addr_a) };
        let timeout = format!("MC_TRANSFER_TIMEOUT={TRANSFER_TIMEOUT}");
        let prefix = ["ip", "netns", "exec", ns, "env", &timeout];
        let mut args = vec![
            "--master",
            &self.master_addr,
            "--local-hostname",
            addr,
            "--segment-size",
            segment,
            "--buffer-size",
            "16M",
        ];
        args.extend_from_slice(extra);
        ClientProc::spawn(&prefix, &args)
    }

    /// A holder in namespace a with [`HELD`] objects `k0..`, seeded by their index.
    fn holder(&self) -> ClientProc {
        let mut a = self.client(false, &[]);
        for i in 0..HELD {
            a.ok(&format!("put k{i} {VALUE} {i}"));
        }
        a
    }

    fn restart_master(&self) {
        self.master.lock().unwrap().kill_now();
        let args: Vec<&str> = self.master_args.iter().map(String::as_str).collect();
        let (m, _) = spawn_master(&self.hosts.exec_prefix(&self.hosts.a), &args);
        *self.master.lock().unwrap() = m;
    }

    fn master_pid(&self) -> u32 {
        self.master.lock().unwrap().0.id()
    }

    /// B's end of the link.
    fn link(&self) -> Link<'_> {
        Link { ns: &self.hosts.b, dev: self.hosts.veth_b() }
    }
}

/// B's calls of round `r`: a get of one of A's objects, and a put of its own read back (its
/// replica may be on A's segment: placement is the master's).
fn ops(r: usize) -> Vec<String> {
    let (i, n) = (r % HELD, 1000 + r);
    vec![format!("get k{i} {i} {VALUE}"), format!("put b{n} 262144 {n}"), format!("get b{n} {n} 262144")]
}

/// Runs B's calls while `fault` is applied for [`HOLD`] and then `clear`ed; every call keeps
/// its bound and returns no wrong value. Returns the answers during the fault.
fn through_fault(
    b: &mut ClientProc,
    round: &mut usize,
    fault: impl FnOnce() + Send,
    clear: impl FnOnce() + Send,
) -> Vec<Answer> {
    during_fault(HOLD, fault, clear, |answers| {
        *round += 1;
        for op in ops(*round) {
            let a = call(b, &op);
            check(&a, limit());
            answers.push(a);
        }
    })
}

/// Runs B's calls until a whole round succeeds, within [`RECOVERY`].
fn recovers(b: &mut ClientProc, round: &mut usize, extra: &[String]) {
    let end = Instant::now() + RECOVERY;
    let mut last = Vec::new();
    while Instant::now() < end {
        *round += 1;
        last = extra.iter().cloned().chain(ops(*round)).map(|op| call(b, &op)).collect::<Vec<_>>();
        last.iter().for_each(|a| check(a, limit()));
        if last.iter().all(Answer::is_ok) {
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("B's calls did not succeed again within {RECOVERY:?}: {last:?}");
}

/// The whole case: warm up, `rounds` faults, recovery after each, nothing leaked by B (and by
/// A and the master when they are the same processes at the end).
fn each_round(
    c: &Cluster,
    a: &Mutex<ClientProc>,
    b: &mut ClientProc,
    fault: impl Fn() + Sync,
    clear: impl Fn() + Sync,
    felt: bool,
) {
    let mut round = 0;
    for _ in 0..3 {
        recovers(b, &mut round, &[]);
    }
    let (b0, a_pid, a0, m_pid, m0): (Usage, u32, Usage, u32, Usage) = {
        let a_pid = a.lock().unwrap().pid();
        (usage(b.pid()), a_pid, usage(a_pid), c.master_pid(), usage(c.master_pid()))
    };
    for _ in 0..rounds() {
        let answers = through_fault(b, &mut round, &fault, &clear);
        if felt {
            assert!(answers.iter().any(|a| !a.is_ok()), "the fault was never felt: {answers:?}");
        }
        recovers(b, &mut round, &[]);
    }
    for _ in 0..3 {
        recovers(b, &mut round, &[]);
    }
    assert_settles("client B", b.pid(), b0, RECOVERY);
    if a.lock().unwrap().pid() == a_pid {
        assert_settles("client A", a_pid, a0, RECOVERY);
    }
    if c.master_pid() == m_pid {
        assert_settles("the master", m_pid, m0, RECOVERY);
    }
}

#[test]
fn store_holder_stopped_and_continued() {
    let Some(c) = cluster("hstop") else { return };
    let a = Mutex::new(c.holder());
    let mut b = c.client(true, &[]);
    let pid = a.lock().unwrap().pid();
    each_round(&c, &a, &mut b, || signal(pid, Signal::STOP), || signal(pid, Signal::CONT), true);
}

#[test]
fn store_link_down_and_up() {
    let Some(c) = cluster("hlink") else { return };
    let a = Mutex::new(c.holder());
    let mut b = c.client(true, &[]);
    // A call in flight may wait for the link (tcp retransmits; the master's calls have 30 s)
    // rather than fail: the fault need not be felt, every call must keep its bound.
    each_round(&c, &a, &mut b, || c.link().down(), || c.link().up(), false);
}

#[test]
fn store_black_holed_data_path() {
    // Everything between the hosts is dropped but the master's port: gets and puts learn
    // where the bytes are and then wait on a peer that never answers.
    let Some(c) = cluster("hhole") else { return };
    let a = Mutex::new(c.holder());
    let mut b = c.client(true, &[]);
    each_round(
        &c,
        &a,
        &mut b,
        || c.link().black_hole(&[MASTER_PORT, MASTER_FAST_PORT]),
        || c.link().clear_black_hole(),
        true,
    );
}

#[test]
fn store_slow_link() {
    let Some(c) = cluster("hslow") else { return };
    let a = Mutex::new(c.holder());
    let mut b = c.client(true, &[]);
    // A's egress at 2 Mbit/s: a 1 MiB get takes four seconds, past its deadline.
    let a_link = Link { ns: &c.hosts.a, dev: c.hosts.veth_a.clone() };
    each_round(&c, &a, &mut b, || a_link.slow("2mbit"), || a_link.clear_slow(), true);
}

/// B's own put of a new object and its read-back, tried again until both work (for at most
/// [`RECOVERY`]): every call keeps its bound and returns no wrong value. The `also` calls ride
/// along, checked the same way, but need not work. Panics, naming `after`, if they do not.
fn own_calls_recover(b: &mut ClientProc, round: &mut usize, also: &[String], after: &str) {
    let end = Instant::now() + RECOVERY;
    loop {
        *round += 1;
        let n = 1000 + *round;
        let own = [format!("put b{n} 262144 {n}"), format!("get b{n} {n} 262144")];
        let got: Vec<Answer> = own.iter().chain(also).map(|op| call(b, op)).collect();
        got.iter().for_each(|a| check(a, limit()));
        if got[0].is_ok() && got[1].is_ok() {
            return;
        }
        assert!(Instant::now() < end, "B did not work again{after}: {got:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn store_master_killed_and_restarted() {
    let Some(c) = cluster("hmast") else { return };
    let a = Mutex::new(c.holder());
    let mut b = c.client(true, &[]);
    // A's objects are lost with the master's state unless A reports them again; B's own
    // calls (put, then get) must work once the new master is up.
    let mut round = 0;
    recovers(&mut b, &mut round, &[]);
    let b0 = usage(b.pid());
    for _ in 0..rounds() {
        let answers = during_fault(
            HOLD,
            || c.master.lock().unwrap().kill_now(),
            || c.restart_master(),
            |answers| {
                round += 1;
                let n = 1000 + round;
                for op in [format!("put b{n} 262144 {n}"), format!("get b{n} {n} 262144")] {
                    let ans = call(&mut b, &op);
                    check(&ans, limit());
                    answers.push(ans);
                }
            },
        );
        // Calls ran through the whole outage (the loop ends once the new master is up). Since
        // the ha merge a put waits for the new master and is retried there, so the fault may
        // be felt as a slow call rather than an error: each call's bound and bytes are checked.
        assert!(!answers.is_empty(), "no call ran during the outage");
        own_calls_recover(&mut b, &mut round, &[], " with the new master");
    }
    drop(a);
    assert_settles("client B", b.pid(), b0, RECOVERY);
}

#[test]
fn store_holder_killed() {
    let Some(c) = cluster("hkill") else { return };
    let a = Mutex::new(c.holder());
    let mut b = c.client(true, &[]);
    let mut round = 0;
    recovers(&mut b, &mut round, &[]);
    let b0 = usage(b.pid());
    for _ in 0..rounds() {
        // A dies; a new holder takes its place. A's objects are gone (a get ends, with an
        // error, within its bound: never with other bytes); new objects work.
        let answers = through_fault(
            &mut b,
            &mut round,
            || a.lock().unwrap().child.kill_now(),
            || {
                *a.lock().unwrap() = c.client(false, &[]);
            },
        );
        // Calls ran through the whole outage (the loop ends once the new holder is up); each
        // call's bound and bytes are checked. A's old objects may stay gone: a get of one rides
        // along, bound and bytes checked, but need not work.
        assert!(!answers.is_empty(), "no call ran during the outage");
        own_calls_recover(&mut b, &mut round, &[format!("get k0 0 {VALUE}")], "");
    }
    assert_settles("client B", b.pid(), b0, RECOVERY);
}

#[test]
fn store_reader_out_of_file_descriptors() {
    let Some(c) = cluster("hfds") else { return };
    let a = Mutex::new(c.holder());
    let mut b = c.client(true, &[]);
    let mut round = 0;
    recovers(&mut b, &mut round, &[]);
    let b0 = usage(b.pid());
    for _ in 0..rounds() {
        // B can open nothing while a new holder appears: its gets of the new holder's objects
        // need connections it cannot make, and must end within their bound.
        let pid = b.pid();
        let had = limit_fds(pid, lowest_free_fd(pid));
        let mut fresh = c.client(false, &[]);
        fresh.ok(&format!("put f{round} {VALUE} 77"));
        let get = call(&mut b, &format!("get f{round} 77 {VALUE}"));
        check(&get, limit());
        assert!(!get.is_ok(), "a get that needed a new connection worked without descriptors: {get:?}");
        for op in ops(round + 1) {
            check(&call(&mut b, &op), limit());
        }
        limit_fds(pid, had);
        let again = format!("get f{round} 77 {VALUE}");
        recovers(&mut b, &mut round, &[again]);
        drop(fresh);
    }
    drop(a);
    assert_settles("client B", b.pid(), b0, RECOVERY);
}

fn disk_stat(c: &mut ClientProc, name: &str) -> u64 {
    let stats: serde_json::Value = serde_json::from_str(&c.ok("disk_stats")).expect("disk_stats is JSON");
    stats[name].as_u64().unwrap_or_else(|| panic!("no {name} in {stats}"))
}

#[test]
fn store_disk_full_during_offload() {
    let Some(c) = cluster("hdisk") else { return };
    // The tier believes it has 64 MiB; the file system holds 6: offloads fail with ENOSPC.
    // Memory (8 MiB) evicts the older values, so later gets read the disk (A's own, and B's
    // through A's disk service) — whatever was not written whole must not be served.
    let disk = Tmpfs::mount("6M").expect("the fault suite runs as root");
    let extra = ["--storage-root", disk.path().to_str().unwrap(), "--storage-capacity", "64M"];
    let mut a = c.client_of(false, "8M", &extra);
    let mut b = c.client(true, &[]);
    let offload_bound = Duration::from_secs(120) + limit();
    for i in 0..4 {
        check(&call(&mut a, &format!("put w{i} {VALUE} {i}")), limit());
    }
    check(&call(&mut a, "flush"), offload_bound);
    let a0 = usage(a.pid());
    let failures0 = disk_stat(&mut a, "write_failures");
    for r in 0..rounds() {
        for i in 0..24 {
            let put = call(&mut a, &format!("put d{r}_{i} {VALUE} {i}"));
            check(&put, limit());
        }
        check(&call(&mut a, "flush"), offload_bound);
        assert!(disk_stat(&mut a, "write_failures") > failures0, "no offload failed on a full disk");
        for client in [&mut a, &mut b] {
            for i in 0..24 {
                check(&call(client, &format!("get d{r}_{i} {i} {VALUE}")), limit());
            }
        }
        // Room again: new offloads are written whole and read back from the disk.
        disk.resize("256M");
        let written = disk_stat(&mut a, "written");
        let failures = disk_stat(&mut a, "write_failures");
        for i in 0..16 {
            a.ok(&format!("put e{r}_{i} {VALUE} {i}"));
        }
        a.ok("flush");
        assert!(disk_stat(&mut a, "written") >= written + 16, "offloads were not written after the disk had room");
        assert_eq!(disk_stat(&mut a, "write_failures"), failures, "offloads failed with room on the disk");
        // (Memory may evict a value before its disk copy is announced: then it is gone, a typed
        // OBJECT_NOT_FOUND. Nearly all are served, every byte checked.)
        for client in [&mut a, &mut b] {
            let mut served = 0;
            for i in 0..16 {
                let get = call(client, &format!("get e{r}_{i} {i} {VALUE}"));
                check(&get, limit());
                assert!(get.is_ok() || get.line.contains("OBJECT_NOT_FOUND"), "{get:?}");
                served += usize::from(get.is_ok());
            }
            let stats = client.ok("disk_stats");
            assert!(served >= 12, "{served} of 16 values served after the disk had room; disk: {stats}");
        }
        // Full again for the next round: the room used now and 2 MiB.
        disk.resize(&format!("{}", disk.used() + (2 << 20)));
    }
    assert_settles("client A", a.pid(), a0, RECOVERY);
}
