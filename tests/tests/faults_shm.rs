//! Fault injection on the shm transport (issue 24): a `tebench target --pattern` and a
//! `fault-prober` initiator in one network namespace (the same host), the contract of
//! `crescent_tests::faults` asserted through each fault. Link faults do not apply (the control
//! connection is a unix socket and the bytes move through shared memory); a stopped target
//! need not be felt (copies through a mapping go on without it), but every call keeps its bound.

use crescent_tests::faults::{engine_ops, limit_fds, lowest_free_fd, EngineCase, Prober};

fn case(tag: &str) -> Option<(EngineCase, Prober)> {
    EngineCase::start(tag, "shm", true)
}

#[test]
fn shm_target_stopped_and_continued() {
    let Some((c, mut p)) = case("sstop") else { return };
    c.target_stopped_and_continued(&mut p, false);
}

#[test]
fn shm_target_killed_and_restarted() {
    let Some((c, mut p)) = case("skill") else { return };
    c.target_killed_and_restarted(&mut p);
}

#[test]
fn shm_target_out_of_file_descriptors() {
    let Some((c, mut p)) = case("sfds") else { return };
    c.target_out_of_fds(&mut p);
}

#[test]
fn shm_initiator_out_of_file_descriptors() {
    // The prober itself can open nothing: a target restarted meanwhile must be mapped anew
    // (a memfd received over the socket), which fails within the bound, and works once
    // descriptors are back.
    let Some((c, mut p)) = case("spfd") else { return };
    c.warm(&mut p);
    let pid = p.pid();
    c.restart_target();
    let had = limit_fds(pid, lowest_free_fd(pid));
    for op in ["resync"].into_iter().map(String::from).chain(engine_ops()) {
        crescent_tests::faults::check(&p.call(&op), crescent_tests::faults::handshake_limit());
    }
    limit_fds(pid, had);
    let mut again = vec!["resync".to_string()];
    again.extend(engine_ops());
    crescent_tests::faults::recovers(
        &mut p,
        &again,
        crescent_tests::faults::handshake_limit(),
        crescent_tests::faults::RECOVERY,
    );
}
