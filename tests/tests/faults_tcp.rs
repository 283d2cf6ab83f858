//! Fault injection on the tcp transport (issue 24): a `tebench target --pattern` in one network
//! namespace, a `fault-prober` initiator in another, and each fault applied to the target or
//! its link while the prober runs reads, written-and-read-back writes and batches. Every case
//! asserts the contract of `crescent_tests::faults`: each call ends within its bound, never
//! with wrong bytes, calls succeed again once the fault is cleared, and neither process holds
//! more descriptors, threads or memory afterwards.

use std::sync::Mutex;
use std::time::Duration;

use crescent_tests::faults::{
    assert_settles, bound, limit_fds, lowest_free_fd, recovers, rounds, signal, through_fault, tools_missing, usage,
    Link, Prober, Usage,
};
use crescent_tests::netns::HostPair;
use crescent_tests::{skip, spawn_tebench_target, ChildGuard};
use rustix::process::Signal;

/// The prober's transfer timeout (`MC_TRANSFER_TIMEOUT`).
const TIMEOUT: &str = "1";
/// The target's handshake port (each case has namespaces of its own).
const PORT: &str = "15000";
/// How long each fault lasts.
const HOLD: Duration = Duration::from_secs(3);
/// How long calls may take to succeed again after a fault.
const RECOVERY: Duration = Duration::from_secs(40);

/// A call's bound: a `writeback` is two transfers, each with the 1 s deadline.
fn limit() -> Duration {
    bound(Duration::from_secs(1)) * 2
}

fn ops() -> Vec<String> {
    ["read 0 262144", "writeback 262144", "batch 8 65536"].map(String::from).to_vec()
}

/// The namespaces and the target of one case (the prober apart, so that a fault can borrow
/// this while the prober runs).
struct Env {
    pair: HostPair,
    target: Mutex<ChildGuard>,
}

fn start_target(pair: &HostPair) -> ChildGuard {
    let args =
        ["--buffer-size", "16M", "--pattern", "--local-hostname", &pair.addr_b, "--port", PORT, "--protocol", "tcp"];
    spawn_tebench_target(&pair.exec_prefix(&pair.b), &args).0
}

fn prober(pair: &HostPair) -> Prober {
    let name = format!("{}:{PORT}", pair.addr_b);
    let args = ["--segment", &name, "--local-hostname", &pair.addr_a, "--protocol", "tcp", "--timeout", TIMEOUT];
    let mut p = Prober::spawn(&pair.exec_prefix(&pair.a), &args);
    let open = p.call("open");
    assert!(open.is_ok(), "{open:?}");
    p
}

fn setup(tag: &str) -> Option<(Env, Prober)> {
    if let Some(why) = tools_missing() {
        skip(&why);
        return None;
    }
    let pair = match HostPair::create(tag) {
        Ok(p) => p,
        Err(why) => {
            skip(&why);
            return None;
        }
    };
    let target = Mutex::new(start_target(&pair));
    let prober = prober(&pair);
    Some((Env { pair, target }, prober))
}

impl Env {
    fn target_pid(&self) -> u32 {
        self.target.lock().unwrap().0.id()
    }

    fn link(&self) -> Link<'_> {
        Link { ns: &self.pair.b, dev: self.pair.veth_b() }
    }
}

/// A few rounds that all succeed, then what `pid` holds.
fn warm(prober: &mut Prober, pid: u32) -> (Usage, Usage) {
    for _ in 0..3 {
        recovers(prober, &ops(), limit(), RECOVERY);
    }
    (usage(prober.pid()), usage(pid))
}

/// Applies `fault` for [`HOLD`], [`rounds`] times, with the contract checked throughout; after
/// each, calls (`after` first) succeed again; at the end, nothing leaked.
fn each_round(
    env: &Env,
    prober: &mut Prober,
    fault: impl Fn(&Env) + Sync,
    clear: impl Fn(&Env) + Sync,
    after: &[&str],
) {
    let (p0, t0) = warm(prober, env.target_pid());
    for _ in 0..rounds() {
        let answers = through_fault(prober, &ops(), limit(), HOLD, || fault(env), || clear(env));
        assert!(answers.iter().any(|a| !a.is_ok()), "the fault was never felt: {answers:?}");
        let mut again: Vec<String> = after.iter().map(|s| s.to_string()).collect();
        again.extend(ops());
        // `resync` is a handshake (5 s per step).
        recovers(prober, &again, bound(Duration::from_secs(5)) * 2, RECOVERY);
    }
    for _ in 0..3 {
        recovers(prober, &ops(), limit(), RECOVERY);
    }
    assert_settles("the prober", prober.pid(), p0, Duration::from_secs(40));
    if after.is_empty() {
        // The same target process throughout.
        assert_settles("the target", env.target_pid(), t0, Duration::from_secs(40));
    }
}

#[test]
fn tcp_target_stopped_and_continued() {
    let Some((env, mut prober)) = setup("tstop") else { return };
    each_round(
        &env,
        &mut prober,
        |e| signal(e.target_pid(), Signal::STOP),
        |e| signal(e.target_pid(), Signal::CONT),
        &[],
    );
}

#[test]
fn tcp_target_killed_and_restarted() {
    let Some((env, mut prober)) = setup("tkill") else { return };
    // The restarted target has new memory: the prober fetches its descriptor again.
    each_round(
        &env,
        &mut prober,
        |e| e.target.lock().unwrap().kill_now(),
        |e| {
            let t = start_target(&e.pair);
            *e.target.lock().unwrap() = t;
        },
        &["resync"],
    );
}

#[test]
fn tcp_link_down_and_up() {
    let Some((env, mut prober)) = setup("tlink") else { return };
    each_round(&env, &mut prober, |e| e.link().down(), |e| e.link().up(), &[]);
}

#[test]
fn tcp_black_holed_link() {
    let Some((env, mut prober)) = setup("thole") else { return };
    each_round(&env, &mut prober, |e| e.link().black_hole(&[]), |e| e.link().clear_black_hole(), &[]);
}

#[test]
fn tcp_slow_link() {
    let Some((env, mut prober)) = setup("tslow") else { return };
    // 2 Mbit/s: a 256 KiB read takes about a second, past its deadline.
    each_round(&env, &mut prober, |e| e.link().slow("2mbit"), |e| e.link().clear_slow(), &[]);
}

#[test]
fn tcp_target_out_of_file_descriptors() {
    let Some((env, mut prober)) = setup("tfds") else { return };
    let pid = env.target_pid();
    let (p0, t0) = warm(&mut prober, pid);
    for _ in 0..rounds() {
        // No descriptor left for the target: a new initiator's connections are queued by the
        // kernel but not accepted; its handshake must end within its bound, and succeed once
        // descriptors are back. The first initiator's connections keep working meanwhile.
        let had = limit_fds(pid, lowest_free_fd(pid));
        let mut late = prober_for(&env);
        let open = late.call("open");
        let handshake = bound(Duration::from_secs(5)) * 2;
        crescent_tests::faults::check(&open, handshake);
        assert!(!open.is_ok(), "a target without descriptors accepted a connection: {open:?}");
        for op in ops() {
            crescent_tests::faults::check(&prober.call(&op), limit());
        }
        limit_fds(pid, had);
        let mut again = vec!["open".to_string()];
        again.extend(ops());
        recovers(&mut late, &again, handshake, RECOVERY);
        drop(late);
    }
    recovers(&mut prober, &ops(), limit(), RECOVERY);
    assert_settles("the prober", prober.pid(), p0, Duration::from_secs(40));
    assert_settles("the target", pid, t0, Duration::from_secs(40));
}

fn prober_for(env: &Env) -> Prober {
    let name = format!("{}:{PORT}", env.pair.addr_b);
    let args = ["--segment", &name, "--local-hostname", &env.pair.addr_a, "--protocol", "tcp", "--timeout", TIMEOUT];
    Prober::spawn(&env.pair.exec_prefix(&env.pair.a), &args)
}
