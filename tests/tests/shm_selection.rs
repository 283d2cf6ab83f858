//! Which transport moves the bytes: shm between processes of one host (same kernel and
//! network namespace), tcp between two network namespaces of one machine, and whatever a
//! forced protocol (`--protocol`, `MC_FORCE_TCP=1`, `EngineConfig::protocol`) says.

use std::process::{Command, Output};
use std::time::Duration;

use crescent_engine::{EngineConfig, TransferEngine, TransportKind};
use crescent_tests::netns::HostPair;
use crescent_tests::{same_host_engine, spawn_tebench_target, workspace_bin};

fn tebench_initiator(prefix: &[&str], segment: &str, extra: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = match prefix.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(workspace_bin("tebench"));
            c
        }
        None => Command::new(workspace_bin("tebench")),
    };
    cmd.args(["initiator", "--segment", segment, "--block-size", "64K", "--batch-size", "8"])
        .args(["--duration", "0.5", "--verify", "--json", "--report-interval", "0"])
        .args(extra)
        .env_remove("MC_FORCE_TCP");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

/// The JSON summary of a successful, verified run.
fn summary(out: &Output) -> serde_json::Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let json: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(json["verified"], true, "{json}");
    json
}

#[test]
fn same_host_engines_use_shm_unless_told_otherwise() {
    let target = same_host_engine(Duration::from_secs(10));
    let _mem = target.alloc_registered(1 << 20, "cpu:0").unwrap();
    let auto = same_host_engine(Duration::from_secs(10));
    let seg = auto.open_segment(target.segment_name()).unwrap();
    assert_eq!(auto.segment_transport(seg).unwrap(), TransportKind::Shm);
    for forced in [TransportKind::Tcp, TransportKind::Shm] {
        let engine = TransferEngine::new(EngineConfig {
            local_hostname: Some("127.0.0.1".into()),
            protocol: Some(forced),
            ..EngineConfig::default()
        })
        .unwrap();
        let seg = engine.open_segment(target.segment_name()).unwrap();
        assert_eq!(engine.segment_transport(seg).unwrap(), forced);
    }
}

#[test]
fn tebench_picks_shm_on_one_host_and_obeys_protocol_and_mc_force_tcp() {
    let (_target, name) =
        spawn_tebench_target(&[], &["--buffer-size", "16M", "--pattern", "--local-hostname", "127.0.0.1"]);
    let host = ["--local-hostname", "127.0.0.1"];
    let auto = summary(&tebench_initiator(&[], &name, &host, &[]));
    assert_eq!(auto["protocol"], "shm");
    let shm = summary(&tebench_initiator(&[], &name, &[&host[..], &["--protocol", "shm"]].concat(), &[]));
    assert_eq!(shm["protocol"], "shm");
    let tcp = summary(&tebench_initiator(&[], &name, &[&host[..], &["--protocol", "tcp"]].concat(), &[]));
    assert_eq!(tcp["protocol"], "tcp");
    let forced = summary(&tebench_initiator(&[], &name, &host, &[("MC_FORCE_TCP", "1")]));
    assert_eq!(forced["protocol"], "tcp");
}

#[test]
fn two_network_namespaces_are_two_hosts() {
    let Some(hosts) = HostPair::create_or_skip("shms", "two_network_namespaces_are_two_hosts") else { return };
    // No protocol given on either side: the target offers shm and tcp.
    let (_target, name) = spawn_tebench_target(
        &hosts.exec_prefix(&hosts.a),
        &["--buffer-size", "16M", "--pattern", "--local-hostname", &hosts.addr_a],
    );
    let host_b = ["--local-hostname", hosts.addr_b.as_str()];
    let prefix = hosts.exec_prefix(&hosts.b);
    let auto = summary(&tebench_initiator(&prefix, &name, &host_b, &[]));
    assert_eq!(auto["protocol"], "tcp", "another namespace is another host");
    // Forcing shm across namespaces fails with the reason instead of moving anything.
    let forced = tebench_initiator(&prefix, &name, &[&host_b[..], &["--protocol", "shm"]].concat(), &[]);
    let stderr = String::from_utf8_lossy(&forced.stderr);
    assert!(!forced.status.success());
    assert!(stderr.contains("another host"), "{stderr}");
}
