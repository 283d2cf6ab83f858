//! Fault injection on the tcp transport (issue 24): a `tebench target --pattern` in one network
//! namespace, a `fault-prober` initiator in another, and each fault applied to the target or
//! its link while the prober runs reads, written-and-read-back writes and batches. Every case
//! asserts the contract of `crescent_tests::faults`: each call ends within its bound, never
//! with wrong bytes, calls succeed again once the fault is cleared, and neither process holds
//! more descriptors, threads or memory afterwards.

use crescent_tests::faults::EngineCase;

fn case(tag: &str) -> Option<(EngineCase, crescent_tests::faults::Prober)> {
    EngineCase::start(tag, "tcp", false)
}

#[test]
fn tcp_target_stopped_and_continued() {
    let Some((c, mut p)) = case("tstop") else { return };
    c.target_stopped_and_continued(&mut p, true);
}

#[test]
fn tcp_target_killed_and_restarted() {
    let Some((c, mut p)) = case("tkill") else { return };
    // The restarted target has new memory and ports: the prober fetches its descriptor again.
    c.target_killed_and_restarted(&mut p);
}

#[test]
fn tcp_link_down_and_up() {
    let Some((c, mut p)) = case("tlink") else { return };
    c.each_round(&mut p, |c| c.link().down(), |c| c.link().up(), &[], true);
}

#[test]
fn tcp_black_holed_link() {
    let Some((c, mut p)) = case("thole") else { return };
    c.each_round(&mut p, |c| c.link().black_hole(&[]), |c| c.link().clear_black_hole(), &[], true);
}

#[test]
fn tcp_slow_link() {
    let Some((c, mut p)) = case("tslow") else { return };
    // 2 Mbit/s: a 256 KiB read takes about a second, past its deadline.
    c.each_round(&mut p, |c| c.link().slow("2mbit"), |c| c.link().clear_slow(), &[], true);
}

#[test]
fn tcp_target_out_of_file_descriptors() {
    let Some((c, mut p)) = case("tfds") else { return };
    c.target_out_of_fds(&mut p);
}
