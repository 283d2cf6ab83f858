//! benches/pairs.py, the helper every pair-running benchmark script prints its rows with:
//! medians of both sides, the median of the per-pair ratios (each taken within its pair) and
//! their range, the target and whether it is met, and the CSV that benches/plot.py reads.

use std::process::Command;

fn pairs_py() -> String {
    format!("{}/pairs.py", env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn a_row_takes_each_ratio_within_its_pair_and_judges_the_median() {
    let dir = tempfile::tempdir().unwrap();
    let pairs = dir.path().join("pairs");
    // The limit moves by 4x between pairs; within each pair the tool has 0.9, 0.5 and 1.0 of it.
    // Ratios of medians would say 1.0 / 2.0 = 0.5; the median ratio is 0.9.
    std::fs::write(&pairs, "0.9 1.0\n1.0 2.0\n4.0 4.0\n").unwrap();
    let csv = dir.path().join("rows.csv");
    let out = Command::new("python3")
        .arg(pairs_py())
        .args(["row", "read|64K|1"])
        .arg(&pairs)
        .args(["--target", ">= 0.90", "--columns", "op|block|threads", "--csv"])
        .arg(&csv)
        .output()
        .expect("python3");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "| read | 64K | 1 | 1.00 | 2.00 | 0.90 | 0.50-1.00 | >= 0.90 | met |"
    );
    let csv = std::fs::read_to_string(&csv).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines[0], "op,block,threads,ours,limit,ratio,ratio_min,ratio_max,target,met,pairs");
    assert_eq!(lines[1], "read,64K,1,1,2,0.9,0.5,1,>=0.90,yes,3");

    // A cost target (at most), and a second metric with its own medians and ratio.
    std::fs::write(&pairs, "1.2 6;1.0 3\n1.1 4;1.0 4\n1.3 2;1.0 2\n").unwrap();
    let out = Command::new("python3")
        .arg(pairs_py())
        .args(["row", "get|10"])
        .arg(&pairs)
        .args(["--target", "<=1.10"])
        .output();
    let out = out.expect("python3");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "| get | 10 | 1.20 | 1.00 | 1.20 | 1.10-1.30 | <= 1.10 | NOT met | 4.00 | 3.00 | 1.00 (1.00-2.00) |"
    );
}

#[test]
fn the_load_line_warns_only_when_the_machine_is_busy_at_start() {
    let out = Command::new("python3").arg(pairs_py()).args(["load", "start"]).output().expect("python3");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("load average at start: "), "{text}");
    let one: f64 =
        std::fs::read_to_string("/proc/loadavg").unwrap().split_whitespace().next().unwrap().parse().unwrap();
    // The load read by the test and by the helper may differ a little; only judge clear cases.
    if one > 1.0 {
        assert!(text.contains("warning: 1-minute load"), "{text}");
    }
    let out = Command::new("python3").arg(pairs_py()).args(["load", "end"]).output().expect("python3");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("load average at end: ") && !text.contains("warning"), "{text}");
    // The end also says what the hypervisor took since the start (same process group).
    assert!(text.contains("cpu since start: busy ") && text.contains("(steal)"), "{text}");
}
