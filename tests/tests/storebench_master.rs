//! `storebench master` end to end on a tiny store: the benchmark that issue 28's master figures
//! come from runs every phase against a real `crescent-master` and loses no call.

use std::process::Command;

use crescent_tests::workspace_bin;

#[test]
fn storebench_master_runs_every_phase_without_a_failed_call() {
    let out = Command::new(workspace_bin("storebench"))
        .args(["master", "--objects", "3k", "--clients", "4", "--duration", "0.3", "--eviction-rounds", "1"])
        .arg("--master-bin")
        .arg(workspace_bin("crescent-master"))
        .output()
        .expect("storebench runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "storebench master failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("failed calls: 0"), "{stdout}");
    // One row per phase in the summary table (the per-RPC table repeats the phase names).
    let phase_rows = |phase: &str| stdout.lines().filter(|l| l.starts_with(&format!("| 3000 | {phase}"))).count();
    for phase in [
        "fill (",
        "mixed, 1 key per call, below the watermark |",
        "mixed, batched x128, below the watermark |",
        "mixed, 1 key per call, evicting |",
        "mixed, batched x128, evicting |",
        "mixed, 1 key per call, evicting, open loop: ",
    ] {
        assert!(phase_rows(phase) >= 1, "no row for phase {phase:?}:\n{stdout}");
    }
    // The open loop runs once per share of --open-loop (0.5 and 0.75 by default), each naming it.
    for share in ["(50 % of the closed loop)", "(75 % of the closed loop)"] {
        assert!(
            stdout.lines().any(|l| l.contains("open loop") && l.contains(share)),
            "no open-loop row at {share}:\n{stdout}"
        );
    }
    // The eviction round was seen and timed.
    assert!(stdout.contains("per object evicted"), "{stdout}");
}
