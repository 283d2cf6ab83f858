//! `tebench auth-pair` end to end at a tiny size: the benchmark of the cluster secret's cost
//! (docs/src/benchmarks.md, docs/src/security.md) prints its rows and its handshake line, and
//! its "on" side really holds the secret (it checks that a secretless engine and a secretless
//! client are refused, and fails otherwise).

use std::process::Command;

#[test]
fn auth_pair_prints_every_row_and_its_secret_on_side_refuses_secretless_peers() {
    let out = Command::new(env!("CARGO_BIN_EXE_tebench"))
        .args([
            "auth-pair",
            "--rounds",
            "2",
            "--pairs",
            "4",
            "--chunk",
            "1M",
            "--block-size",
            "256K",
            "--value-size",
            "256K",
        ])
        .args(["--connects", "2", "--resamples", "50"])
        .env_remove("CRESCENT_CLUSTER_SECRET")
        .env_remove("CRESCENT_CLUSTER_SECRET_NEXT")
        .env_remove("CRESCENT_CLUSTER_SECRET_FILE")
        .output()
        .expect("running tebench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "tebench auth-pair failed: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("secret applied: the secret-on target refused an engine without the secret"), "{stdout}");
    assert!(
        stdout.lines().any(|l| l.starts_with("secret applied: the secret-on master at ")
            && l.ends_with("refused a client without the secret")),
        "{stdout}"
    );
    assert!(stdout.contains("load average at start") && stdout.contains("load average at end"), "{stdout}");
    assert!(stdout.lines().any(|l| l.starts_with("handshake: ") && l.contains("per connection")), "{stdout}");
    // Per connection: the secret-on target and holder authenticated some connections while the
    // rows ran (their tcp lanes), and fewer than the requests they served.
    let counts = stdout
        .lines()
        .find_map(|l| l.strip_prefix("authenticated connections while the rows ran (secret-on side): "))
        .unwrap_or_else(|| panic!("no count of authenticated connections in:\n{stdout}"));
    let numbers: Vec<u64> = counts.split_whitespace().filter_map(|w| w.parse().ok()).collect();
    assert_eq!(numbers.len(), 4, "{counts}");
    assert!(numbers[0] > 0 && numbers[0] < numbers[1], "engine target: {counts}");
    assert!(numbers[2] > 0 && numbers[2] < numbers[3], "store holder: {counts}");
    let cells =
        |line: &str| line.split('|').map(str::trim).filter(|c| !c.is_empty()).map(String::from).collect::<Vec<_>>();
    for label in ["engine read", "engine write", "store put", "store get", "store get_into (zero copy)"] {
        let row = stdout
            .lines()
            .map(cells)
            .find(|c| c.len() == 10 && c[0] == label)
            .unwrap_or_else(|| panic!("no {label:?} row in:\n{stdout}"));
        for (i, what) in [(2, "on GB/s"), (3, "off GB/s"), (4, "ratio")] {
            let v: f64 = row[i].parse().unwrap_or_else(|_| panic!("{what} of {row:?}"));
            assert!(v > 0.0, "{what} of {row:?}");
        }
        assert_eq!(row[7].split_whitespace().count(), 2, "one median per round: {row:?}");
        assert_eq!(row[8], ">= 0.98", "{row:?}");
    }
}
