//! `storebench master` end to end at a tiny size: the master-at-scale benchmark of
//! docs/src/benchmarks.md keeps working. It spawns `crescent-master` from beside the
//! storebench binary (build it first: `cargo build -p crescent-store -p crescent-benches`).

use std::process::Command;

#[test]
fn storebench_master_runs_every_phase_with_no_failed_call_and_measures_eviction_rounds() {
    let out = Command::new(env!("CARGO_BIN_EXE_storebench"))
        .args(["master", "--clients", "4", "--objects", "1000,2000", "--duration", "0.3"])
        .args(["--eviction-rounds", "2", "--batch", "8", "--value-size", "64K"])
        .output()
        .expect("running storebench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "storebench master failed: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let cells =
        |line: &str| line.split('|').map(str::trim).filter(|c| !c.is_empty()).map(String::from).collect::<Vec<_>>();
    for n in ["1000", "2000"] {
        for phase in [
            "fill (BatchPutStart + BatchPutEnd x8)",
            "mixed, 1 key per call, below the watermark",
            "mixed, batched x8, below the watermark",
            "mixed, 1 key per call, evicting",
            "mixed, batched x8, evicting",
        ] {
            let row = stdout
                .lines()
                .map(cells)
                .find(|c| c.len() == 13 && c[0] == n && c[1] == phase)
                .unwrap_or_else(|| panic!("no {n} / {phase:?} row in:\n{stdout}"));
            assert_eq!(row[11], "0", "failed calls in {row:?}");
            let ops: f64 = row[3].parse().unwrap_or_else(|_| panic!("ops/s of {row:?}"));
            assert!(ops > 0.0, "{row:?}");
            if phase.ends_with("below the watermark") {
                assert_eq!(row[10], "0", "a phase below the watermark evicted: {row:?}");
                assert_eq!(row[9], "0", "a get or exists missed a stored key below the watermark: {row:?}");
            }
            if phase.ends_with("evicting") {
                let evicted: u64 = row[10].parse().unwrap();
                assert!(evicted > 0, "nothing evicted in {row:?}");
            }
        }
        // The open loop runs while evicting once per share of --open-loop (0.5 and 0.75 by
        // default), and below the watermark at the first share, each row naming its share,
        // with no failed call.
        for (share, when) in [("50 %", "below the watermark"), ("50 %", "evicting"), ("75 %", "evicting")] {
            let row = stdout
                .lines()
                .map(cells)
                .find(|c| {
                    c.len() == 13
                        && c[0] == n
                        && c[1].starts_with("mixed, 1 key per call, open loop: ")
                        && c[1].ends_with(&format!("({share} of the closed loop), {when}"))
                })
                .unwrap_or_else(|| panic!("no {n} open-loop row at {share} {when} in:\n{stdout}"));
            assert_eq!(row[11], "0", "failed calls in {row:?}");
            if when == "below the watermark" {
                assert_eq!(row[10], "0", "the open loop below the watermark evicted: {row:?}");
            } else {
                assert!(row[10].parse::<u64>().unwrap() > 0, "nothing evicted in {row:?}");
            }
        }
        // Eviction rounds were found and timed, and the master's memory was read.
        let size = stdout
            .lines()
            .map(cells)
            .find(|c| c.len() == 11 && c[0] == n && c[3].ends_with("B (target <= 256)"))
            .unwrap_or_else(|| panic!("no memory and eviction row for {n} in:\n{stdout}"));
        assert_ne!(size[4], "-", "no eviction round timed: {size:?}");
        let per_round: u64 = size[6].parse().unwrap();
        assert!(per_round > 0, "{size:?}");
        assert!(size[7].ends_with(" us"), "no cost per object evicted: {size:?}");
        // The evictor thread's CPU was read (a few ticks at this size: maybe 0.00).
        let cpu: f64 = size[8].strip_suffix(" us").and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{size:?}"));
        assert!(cpu >= 0.0, "{size:?}");
        // The put that crossed the watermark, beside an ordinary one (the round runs after it).
        for put_start in &size[9..11] {
            assert!(put_start.ends_with(" ms") || put_start.ends_with(" us"), "no PutStart timed: {size:?}");
        }
    }
    assert!(stdout.contains("eviction round at 2000 objects:"), "{stdout}");
    assert!(stdout.contains("per object evicted at 2000 objects:"), "{stdout}");
    assert!(stdout.contains("load average at start:") && stdout.contains("load average at end:"), "{stdout}");
    assert!(stdout.lines().any(|l| l == "failed calls: 0"), "{stdout}");
}
