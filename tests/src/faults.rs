//! The fault-injection suite's tools (`tests/tests/faults_*.rs`): the `fault-prober` initiator
//! process, faults on a peer or a namespace's link (signals, `ip link`, nftables, `tc`,
//! `prlimit`), and what a process holds (file descriptors, threads, resident memory) to show
//! that nothing leaks across a fault.
//!
//! Each case asserts the contract "every request ends, whatever the peer does": every call
//! ends within its bound (the configured deadline plus a margin), no call returns bytes other
//! than the right ones, calls succeed again once the fault is cleared, and the processes hold
//! no more descriptors, threads or memory than before, within a tolerance.
//! `CRESCENT_FAULT_ROUNDS` (default 1; `ci/faults.sh --long`: 5) repeats each fault.

use std::io::Write;
use std::process::{ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use crate::{lines_of, workspace_bin, ChildGuard};

/// How many times each case applies its fault (`CRESCENT_FAULT_ROUNDS`).
pub fn rounds() -> usize {
    std::env::var("CRESCENT_FAULT_ROUNDS").ok().and_then(|v| v.parse().ok()).filter(|n| *n > 0).unwrap_or(1)
}

/// How a call of the prober ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    /// `timed-out`, `failed`, `unreachable` or `other`, and the message.
    Err(String, String),
    /// Completed with wrong bytes (first differing offset): never allowed.
    Corrupt(u64),
}

/// One answered call: how it ended and how long it took (as the prober measured it).
#[derive(Debug, Clone)]
pub struct Answer {
    pub outcome: Outcome,
    pub took: Duration,
    pub command: String,
}

impl Answer {
    pub fn is_ok(&self) -> bool {
        self.outcome == Outcome::Ok
    }
}

fn parse_answer(command: &str, line: &str) -> Answer {
    let mut w = line.splitn(4, ' ');
    let (word, ms) = (w.next().unwrap_or_default(), w.next().and_then(|m| m.parse().ok()).unwrap_or(u64::MAX));
    let outcome = match word {
        "ok" => Outcome::Ok,
        "corrupt" => Outcome::Corrupt(w.next().and_then(|a| a.parse().ok()).unwrap_or(u64::MAX)),
        _ => Outcome::Err(w.next().unwrap_or("other").to_string(), w.next().unwrap_or(line).to_string()),
    };
    Answer { outcome, took: Duration::from_millis(ms), command: command.to_string() }
}

/// A `fault-prober` process (see `tests/src/bin/fault-prober.rs`).
pub struct Prober {
    pub child: ChildGuard,
    stdin: ChildStdin,
    lines: Receiver<String>,
    /// Longer than any call may take: a call not answered by then hung.
    pub hang: Duration,
}

impl Prober {
    /// Starts the prober through `prefix` (e.g. `ip netns exec NS`) with `args`.
    pub fn spawn(prefix: &[&str], args: &[&str]) -> Prober {
        let bin = workspace_bin("fault-prober");
        let mut cmd = match prefix.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(bin);
                c
            }
            None => Command::new(bin),
        };
        cmd.args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit());
        let mut child = ChildGuard(cmd.spawn().expect("spawn fault-prober"));
        let stdin = child.0.stdin.take().expect("stdin");
        let lines = lines_of(child.0.stdout.take().expect("stdout"));
        let ready = lines.recv_timeout(Duration::from_secs(60)).expect("the prober started");
        assert!(ready.starts_with("ready"), "unexpected first line {ready:?}");
        Prober { child, stdin, lines, hang: Duration::from_secs(60) }
    }

    pub fn pid(&self) -> u32 {
        self.child.0.id()
    }

    /// Runs one command; panics if it was not answered within [`Prober::hang`] (a hang).
    pub fn call(&mut self, command: &str) -> Answer {
        writeln!(self.stdin, "{command}").expect("prober stdin");
        self.stdin.flush().expect("flush");
        let line = self
            .lines
            .recv_timeout(self.hang)
            .unwrap_or_else(|_| panic!("{command:?} was not answered within {:?}: the call hung", self.hang));
        parse_answer(command, &line)
    }
}

/// What a process holds, from `/proc/<pid>`.
#[derive(Debug, Clone, Copy)]
pub struct Usage {
    pub fds: usize,
    pub threads: usize,
    pub rss_kib: u64,
}

pub fn usage(pid: u32) -> Usage {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0);
    let threads = std::fs::read_dir(format!("/proc/{pid}/task")).map(|d| d.count()).unwrap_or(0);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    Usage { fds, threads, rss_kib }
}

/// Asserts that `after` holds no more than `before` within a tolerance: a few descriptors and
/// threads (connections and workers come and go), 64 MiB or a quarter more memory.
pub fn assert_no_leak(what: &str, before: Usage, after: Usage) {
    assert!(after.fds <= before.fds + 8, "{what}: file descriptors {} -> {}", before.fds, after.fds);
    assert!(after.threads <= before.threads + 8, "{what}: threads {} -> {}", before.threads, after.threads);
    let slack = (64 << 10).max(before.rss_kib / 4);
    assert!(
        after.rss_kib <= before.rss_kib + slack,
        "{what}: resident memory {} KiB -> {} KiB",
        before.rss_kib,
        after.rss_kib
    );
}

/// Waits for `after` to come back under the tolerance (threads and connections of a fault end
/// by their own timeouts), then asserts it.
pub fn assert_settles(what: &str, pid: u32, before: Usage, within: Duration) {
    let end = Instant::now() + within;
    loop {
        let now = usage(pid);
        let ok = now.fds <= before.fds + 8
            && now.threads <= before.threads + 8
            && now.rss_kib <= before.rss_kib + (64 << 10).max(before.rss_kib / 4);
        if ok || Instant::now() >= end {
            return assert_no_leak(what, before, now);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn run(cmd: &str, args: &[&str]) {
    let out = Command::new(cmd).args(args).output().unwrap_or_else(|e| panic!("cannot run {cmd}: {e}"));
    assert!(out.status.success(), "{cmd} {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
}

/// Sends `signal` to `pid`.
pub fn signal(pid: u32, signal: rustix::process::Signal) {
    let pid = rustix::process::Pid::from_raw(pid as i32).expect("a pid");
    rustix::process::kill_process(pid, signal).expect("signalling a process");
}

/// Link faults inside one namespace of a [`crate::netns::HostPair`] (on its veth end).
pub struct Link<'a> {
    pub ns: &'a str,
    pub dev: String,
}

impl Link<'_> {
    pub fn down(&self) {
        run("ip", &["-n", self.ns, "link", "set", &self.dev, "down"]);
    }

    /// Up again, with the addresses and the route that went with it.
    pub fn up(&self) {
        run("ip", &["-n", self.ns, "link", "set", &self.dev, "up"]);
    }

    /// Drops every packet in and out of the namespace's veth, except tcp to or from `spare`
    /// ports (nftables, table `crescent_fault`): the peer neither answers nor refuses.
    pub fn black_hole(&self, spare: &[u16]) {
        let spare = if spare.is_empty() {
            String::new()
        } else {
            let ports = spare.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", ");
            format!("tcp sport {{ {ports} }} accept; tcp dport {{ {ports} }} accept;")
        };
        let dev = &self.dev;
        let rules = format!(
            "table inet crescent_fault {{
               chain in {{ type filter hook input priority -10; iifname \"{dev}\" {spare} iifname \"{dev}\" drop; }}
               chain out {{ type filter hook output priority -10; oifname \"{dev}\" {spare} oifname \"{dev}\" drop; }}
             }}"
        );
        run("ip", &["netns", "exec", self.ns, "nft", &rules]);
    }

    pub fn clear_black_hole(&self) {
        run("ip", &["netns", "exec", self.ns, "nft", "delete table inet crescent_fault"]);
    }

    /// Shapes the namespace's egress to `rate` (e.g. `1mbit`) with a token bucket.
    pub fn slow(&self, rate: &str) {
        run(
            "tc",
            &[
                "-n", self.ns, "qdisc", "add", "dev", &self.dev, "root", "tbf", "rate", rate, "burst", "16kb",
                "latency", "400ms",
            ],
        );
    }

    pub fn clear_slow(&self) {
        run("tc", &["-n", self.ns, "qdisc", "del", "dev", &self.dev, "root"]);
    }
}

/// The lowest descriptor number `pid` does not use: with its limit of open files set to
/// that, the process can open no file or socket (a new descriptor takes the lowest free number).
pub fn lowest_free_fd(pid: u32) -> usize {
    let used: std::collections::HashSet<usize> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect())
        .unwrap_or_default();
    (0..).find(|n| !used.contains(n)).expect("a free number")
}

/// Sets the soft limit of open files of `pid` (`prlimit`); returns the one it had.
pub fn limit_fds(pid: u32, n: usize) -> usize {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).expect("the process's limits");
    let soft = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|v| v.parse().ok())
        .expect("a limit of open files");
    run("prlimit", &["--pid", &pid.to_string(), &format!("--nofile={n}:")]);
    soft
}

/// Two hosts for a fault case, or `None` after saying why the case skips (a tool missing, not
/// root: see [`crate::skip`]).
pub fn host_pair(tag: &str) -> Option<crate::netns::HostPair> {
    if let Some(why) = tools_missing() {
        crate::skip(&why);
        return None;
    }
    crate::netns::HostPair::create(tag).map_err(|why| crate::skip(&why)).ok()
}

/// Whether the tools of the suite are here (`nft`, `tc`, `prlimit`, `ip`).
pub fn tools_missing() -> Option<String> {
    for tool in ["ip", "nft", "tc", "prlimit"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if !found {
            return Some(format!("{tool} is not installed"));
        }
    }
    None
}

/// The bound a call must end within: its deadline plus a margin for a loaded machine (and, for
/// transfers, the connection set-up that precedes them).
pub fn bound(deadline: Duration) -> Duration {
    deadline * 2 + Duration::from_secs(3)
}

/// Applies `fault` (200 ms in) for `hold` and then `clear`s it, on a thread of its own, while
/// `round` runs again and again (at least once) until the fault is cleared; `round` pushes its
/// answers onto the list this returns.
pub fn during_fault<A>(
    hold: Duration,
    fault: impl FnOnce() + Send,
    clear: impl FnOnce() + Send,
    mut round: impl FnMut(&mut Vec<A>),
) -> Vec<A> {
    let mut answers = Vec::new();
    std::thread::scope(|s| {
        let (done_tx, done_rx) = channel();
        s.spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            fault();
            std::thread::sleep(hold);
            clear();
            let _ = done_tx.send(());
        });
        let mut cleared = false;
        while !cleared {
            round(&mut answers);
            cleared = done_rx.try_recv().is_ok();
        }
    });
    answers
}

/// Runs `ops` in a loop while `fault` is applied for `hold` and then `clear`ed, and asserts
/// the contract on every call: it ended within `limit` and never with wrong bytes. Returns
/// the answers during the fault.
pub fn through_fault(
    prober: &mut Prober,
    ops: &[String],
    limit: Duration,
    hold: Duration,
    fault: impl FnOnce() + Send,
    clear: impl FnOnce() + Send,
) -> Vec<Answer> {
    during_fault(hold, fault, clear, |answers| {
        for op in ops {
            let a = prober.call(op);
            check(&a, limit);
            answers.push(a);
        }
    })
}

/// The contract on one call: within `limit`, never wrong bytes.
pub fn check(a: &Answer, limit: Duration) {
    assert!(!matches!(a.outcome, Outcome::Corrupt(_)), "{:?} completed with wrong bytes: {a:?}", a.command);
    assert!(a.took <= limit, "{:?} took {:?}, more than its bound {limit:?}: {a:?}", a.command, a.took);
}

/// Runs `ops` until a whole round succeeds (or `within` passes: then it did not recover);
/// every call meanwhile keeps the contract.
pub fn recovers(prober: &mut Prober, ops: &[String], limit: Duration, within: Duration) {
    let end = Instant::now() + within;
    let mut last = Vec::new();
    while Instant::now() < end {
        last.clear();
        for op in ops {
            let a = prober.call(op);
            check(&a, limit);
            last.push(a);
        }
        if last.iter().all(Answer::is_ok) {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("calls did not succeed again within {within:?} of the fault's end: {last:?}");
}

// ---- one initiator and one target of the transfer engine ----

/// The target's handshake port (each case has namespaces of its own).
pub const TARGET_PORT: &str = "15000";
/// How long each fault lasts.
pub const HOLD: Duration = Duration::from_secs(3);
/// How long calls may take to succeed again after a fault.
pub const RECOVERY: Duration = Duration::from_secs(40);
/// The prober's transfer timeout (`MC_TRANSFER_TIMEOUT`), seconds.
pub const TRANSFER_TIMEOUT: u64 = 1;

/// A call's bound: a `writeback` is two transfers, each with its deadline.
pub fn transfer_limit() -> Duration {
    bound(Duration::from_secs(TRANSFER_TIMEOUT)) * 2
}

/// A bound for calls that include a handshake (5 s a step), such as `open` and `resync`.
pub fn handshake_limit() -> Duration {
    bound(Duration::from_secs(5)) * 2
}

/// What the prober runs: reads checked against the target's pattern, writes read back, and
/// batches.
pub fn engine_ops() -> Vec<String> {
    ["read 0 262144", "writeback 262144", "batch 8 65536"].map(String::from).to_vec()
}

/// Where a case's processes run.
pub enum Place {
    /// The target in namespace `b`; the prober in `a` (over the veth pair), or in `b` too
    /// with `same_host` (shm).
    Namespaces { pair: crate::netns::HostPair, same_host: bool },
    /// Both on this host's loopback, with these environment variables (the rdma cases in the
    /// soft-RoCE VM: `MC_DEVICE`, `MC_GID_INDEX`).
    Loopback { env: Vec<String> },
}

/// A `tebench target --pattern` and where the prober runs. The prober is kept apart, so that
/// a fault can borrow this while the prober runs.
pub struct EngineCase {
    pub place: Place,
    pub target: std::sync::Mutex<ChildGuard>,
    pub protocol: &'static str,
}

impl EngineCase {
    /// The case in two namespaces of their own, or `None` (after [`crate::skip`]) where it
    /// cannot run.
    pub fn start(tag: &str, protocol: &'static str, same_host: bool) -> Option<(EngineCase, Prober)> {
        if let Some(why) = tools_missing() {
            crate::skip(&why);
            return None;
        }
        let pair = match crate::netns::HostPair::create(tag) {
            Ok(p) => p,
            Err(why) => {
                crate::skip(&why);
                return None;
            }
        };
        Some(Self::start_at(Place::Namespaces { pair, same_host }, protocol))
    }

    /// The case at `place`.
    pub fn start_at(place: Place, protocol: &'static str) -> (EngineCase, Prober) {
        let target = std::sync::Mutex::new(Self::spawn_target(&place, protocol));
        let case = EngineCase { place, target, protocol };
        let mut prober = case.prober();
        let open = prober.call("open");
        assert!(open.is_ok(), "{open:?}");
        (case, prober)
    }

    /// The command prefix and the address of the target (`false`) or the prober (`true`).
    fn at(place: &Place, prober: bool) -> (Vec<String>, String) {
        match place {
            Place::Namespaces { pair, same_host } => {
                let (ns, addr) = if prober && !same_host { (&pair.a, &pair.addr_a) } else { (&pair.b, &pair.addr_b) };
                (pair.exec_prefix(ns).iter().map(|s| s.to_string()).collect(), addr.clone())
            }
            Place::Loopback { env } => {
                let mut prefix = vec!["env".to_string()];
                prefix.extend(env.iter().cloned());
                (prefix, "127.0.0.1".into())
            }
        }
    }

    fn spawn_target(place: &Place, protocol: &str) -> ChildGuard {
        let (prefix, addr) = Self::at(place, false);
        let prefix: Vec<&str> = prefix.iter().map(String::as_str).collect();
        let args = [
            "--buffer-size",
            "16M",
            "--pattern",
            "--local-hostname",
            &addr,
            "--port",
            TARGET_PORT,
            "--protocol",
            protocol,
        ];
        crate::spawn_tebench_target(&prefix, &args).0
    }

    /// Kills the target and starts another on the same port (new memory, new data ports).
    pub fn restart_target(&self) {
        self.target.lock().unwrap().kill_now();
        let t = Self::spawn_target(&self.place, self.protocol);
        *self.target.lock().unwrap() = t;
    }

    /// A new prober (not yet opened).
    pub fn prober(&self) -> Prober {
        let (_, target) = Self::at(&self.place, false);
        let (prefix, addr) = Self::at(&self.place, true);
        let prefix: Vec<&str> = prefix.iter().map(String::as_str).collect();
        let name = format!("{target}:{TARGET_PORT}");
        let timeout = TRANSFER_TIMEOUT.to_string();
        let args = ["--segment", &name, "--local-hostname", &addr, "--protocol", self.protocol, "--timeout", &timeout];
        Prober::spawn(&prefix, &args)
    }

    pub fn target_pid(&self) -> u32 {
        self.target.lock().unwrap().0.id()
    }

    /// The target's end of the link (cases in namespaces).
    pub fn link(&self) -> Link<'_> {
        match &self.place {
            Place::Namespaces { pair, .. } => Link { ns: &pair.b, dev: pair.veth_b() },
            Place::Loopback { .. } => panic!("a case on loopback has no link of its own"),
        }
    }

    /// A few rounds that all succeed, then what the prober and the target hold.
    pub fn warm(&self, prober: &mut Prober) -> (Usage, Usage) {
        for _ in 0..3 {
            recovers(prober, &engine_ops(), transfer_limit(), RECOVERY);
        }
        (usage(prober.pid()), usage(self.target_pid()))
    }

    /// Applies `fault` for [`HOLD`], [`rounds`] times, with the contract checked throughout;
    /// with `felt`, some call must have failed during it (else the fault did not land). After
    /// each round, calls (`after` first) succeed again; at the end, nothing leaked.
    pub fn each_round(
        &self,
        prober: &mut Prober,
        fault: impl Fn(&EngineCase) + Sync,
        clear: impl Fn(&EngineCase) + Sync,
        after: &[&str],
        felt: bool,
    ) {
        let (p0, t0) = self.warm(prober);
        let t_pid = self.target_pid();
        for _ in 0..rounds() {
            let answers = through_fault(prober, &engine_ops(), transfer_limit(), HOLD, || fault(self), || clear(self));
            if felt {
                assert!(answers.iter().any(|a| !a.is_ok()), "the fault was never felt: {answers:?}");
            }
            let mut again: Vec<String> = after.iter().map(|s| s.to_string()).collect();
            again.extend(engine_ops());
            recovers(prober, &again, handshake_limit(), RECOVERY);
        }
        for _ in 0..3 {
            recovers(prober, &engine_ops(), transfer_limit(), RECOVERY);
        }
        assert_settles("the prober", prober.pid(), p0, RECOVERY);
        if self.target_pid() == t_pid {
            assert_settles("the target", t_pid, t0, RECOVERY);
        }
    }

    /// The target stopped (`SIGSTOP`) for [`HOLD`] and continued, with [`Self::each_round`]:
    /// `felt` where the transport must notice (a call fails meanwhile).
    pub fn target_stopped_and_continued(&self, prober: &mut Prober, felt: bool) {
        use rustix::process::Signal;
        self.each_round(
            prober,
            |c| signal(c.target_pid(), Signal::STOP),
            |c| signal(c.target_pid(), Signal::CONT),
            &[],
            felt,
        );
    }

    /// The target killed and a new one started in its place, with [`Self::each_round`]: the
    /// fault is felt, and calls succeed again after a `resync` (the new target has new memory
    /// and ports: the prober fetches its descriptor again).
    pub fn target_killed_and_restarted(&self, prober: &mut Prober) {
        self.each_round(prober, |c| c.target.lock().unwrap().kill_now(), |c| c.restart_target(), &["resync"], true);
    }

    /// The target out of file descriptors: a new initiator's connections are queued by the
    /// kernel but not accepted; its `open` must end within its bound with an error, and
    /// succeed once descriptors are back. The first initiator's calls keep their bound.
    pub fn target_out_of_fds(&self, prober: &mut Prober) {
        let pid = self.target_pid();
        let (p0, t0) = self.warm(prober);
        for _ in 0..rounds() {
            let had = limit_fds(pid, lowest_free_fd(pid));
            let mut late = self.prober();
            let open = late.call("open");
            check(&open, handshake_limit());
            assert!(!open.is_ok(), "a target without descriptors accepted a connection: {open:?}");
            for op in engine_ops() {
                check(&prober.call(&op), transfer_limit());
            }
            limit_fds(pid, had);
            let mut again = vec!["open".to_string()];
            again.extend(engine_ops());
            recovers(&mut late, &again, handshake_limit(), RECOVERY);
        }
        recovers(prober, &engine_ops(), transfer_limit(), RECOVERY);
        assert_settles("the prober", prober.pid(), p0, RECOVERY);
        assert_settles("the target", pid, t0, RECOVERY);
    }
}
