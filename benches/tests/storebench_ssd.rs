//! `storebench ssd` end to end at a tiny size: the disk benchmark of docs/src/benchmarks.md keeps working.
//! Its own checks fail the run when an offload is missing or a read returns wrong bytes.

use std::process::Command;

#[test]
fn storebench_ssd_offloads_every_value_in_batches_and_reads_each_back_from_disk() {
    // Inside the target directory: on disk (O_DIRECT, which dd and the tier use, fails on tmpfs).
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let dir = tmp.path().to_str().unwrap();
    // 5 values in batches of 2: two full batches and a last one of a single value.
    let out = Command::new(env!("CARGO_BIN_EXE_storebench"))
        .args(["ssd", "--dir", dir, "--sizes", "64K", "--bytes-per-row", "320K", "--repeat", "1", "--batch", "2"])
        .output()
        .expect("running storebench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "storebench ssd failed: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let row = |op: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(&format!("| {op} | 64.00 KiB | 5 |")))
            .unwrap_or_else(|| panic!("no {op:?} row in:\n{stdout}"))
            .to_string()
    };
    // Each row: both medians, the median ratio, its range and the target.
    assert!(row("offload write (put_batch x2)").contains("| >= 0.80 |"));
    assert!(row("read on miss").contains("| >= 0.80 |"));
    assert!(stdout.contains("load average at start:") && stdout.contains("load average at end:"), "{stdout}");
    let counts = stdout.lines().find(|l| l.starts_with("64.00 KiB:")).expect("per-size counts");
    assert!(counts.contains("5 of 5 gets read their file"), "{counts}");
    // The benchmark removes its work directory.
    let left: Vec<_> = std::fs::read_dir(dir).unwrap().collect();
    assert!(left.is_empty(), "storebench ssd left {left:?} behind");
}
