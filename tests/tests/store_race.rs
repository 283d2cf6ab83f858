//! A read never returns another object's bytes: a writer process force-removes and puts again
//! the keys a reader process is reading (get, get_into, batch_get_into and get_batch in four
//! threads), over tcp and over shm, with and without the reader's hot cache. Every value a call
//! hands over with success must be one generation of its key, whole (`store-race` checks every
//! word). Before the master held force-removed ranges until their leases ended, about one read
//! in fourteen came back mixing two generations.

use std::process::{Command, Stdio};
use std::time::Duration;

use crescent_store::MasterConfig;
use crescent_tests::{lines_of, ChildGuard};

const KEYS: &str = "8";
const SIZE: u64 = 4 << 20;
const SECONDS: &str = "4";

/// Spawns `store-race ROLE` against `master` and returns it with its stdout's lines.
fn spawn(role: &str, master: &str, extra: &[&str]) -> (ChildGuard, std::sync::mpsc::Receiver<String>) {
    let mut child = ChildGuard(
        Command::new(env!("CARGO_BIN_EXE_store-race"))
            .args([role, "--master", master, "--keys", KEYS, "--size", &SIZE.to_string(), "--seconds", SECONDS])
            .args(extra)
            .env("RUST_LOG", "error")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn store-race"),
    );
    let lines = lines_of(child.0.stdout.take().expect("stdout"));
    (child, lines)
}

/// Runs the race with `extra` flags for both sides (`reader_extra` for the reader alone) and
/// returns the reader's per-method counts: (method, ok, torn, failed).
fn race(extra: &[&str], reader_extra: &[&str]) -> Vec<(String, u64, u64, u64)> {
    // A short lease: the writer's segment holds what force-removed ranges wait for.
    let m = crescent_tests::store::loopback_master(MasterConfig {
        lease_ttl: Duration::from_millis(1500),
        ..MasterConfig::default()
    });
    let master = m.client_address();
    let (mut writer, wlines) = spawn("writer", &master, extra);
    assert_eq!(wlines.recv_timeout(Duration::from_secs(60)).as_deref(), Ok("ready"));
    let (mut reader, rlines) = spawn("reader", &master, &[extra, reader_extra].concat());
    let mut counts = Vec::new();
    loop {
        let line = rlines.recv_timeout(Duration::from_secs(120)).expect("the reader reports");
        if line == "done" {
            break;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        assert!(f.len() == 7 && f[1] == "ok" && f[3] == "torn" && f[5] == "failed", "unexpected line {line:?}");
        let n = |i: usize| f[i].parse::<u64>().expect("a count");
        counts.push((f[0].to_string(), n(2), n(4), n(6)));
    }
    let summary = wlines.recv_timeout(Duration::from_secs(120)).expect("the writer reports");
    assert!(reader.0.wait().expect("reader").success());
    assert!(writer.0.wait().expect("writer").success());
    let f: Vec<&str> = summary.split_whitespace().collect();
    let removes: u64 = f.get(4).and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("writer said {summary:?}"));
    assert!(removes > 0, "the writer force-removed keys while they were read: {summary}");
    eprintln!("{extra:?} {reader_extra:?}: {summary}; reader {counts:?}");
    counts
}

fn assert_never_torn(counts: &[(String, u64, u64, u64)]) {
    assert_eq!(counts.len(), 4, "every method reported");
    for (method, ok, torn, _) in counts {
        assert_eq!(*torn, 0, "{method} returned {torn} values mixing two objects: {counts:?}");
        assert!(*ok > 0, "{method} read some values whole: {counts:?}");
    }
}

#[test]
fn force_removed_values_are_never_read_torn_over_tcp() {
    assert_never_torn(&race(&["--protocol", "tcp"], &[]));
}

#[test]
fn force_removed_values_are_never_read_torn_over_shm() {
    assert_never_torn(&race(&["--protocol", "shm"], &[]));
}

#[test]
fn force_removed_values_are_never_read_torn_over_tcp_through_the_hot_cache() {
    assert_never_torn(&race(&["--protocol", "tcp"], &["--hot-cache", &(4 * SIZE).to_string()]));
}

#[test]
fn force_removed_values_are_never_read_torn_over_shm_through_the_hot_cache() {
    assert_never_torn(&race(&["--protocol", "shm"], &["--hot-cache", &(4 * SIZE).to_string()]));
}
