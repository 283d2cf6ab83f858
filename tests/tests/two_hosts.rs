//! Two hosts made by the test: network namespaces joined by a veth pair. `tebench target`
//! runs in one, `tebench initiator --verify` in the other. Skipped, with the reason printed,
//! where namespaces cannot be made (not root).

use std::process::Command;

use crescent_tests::netns::HostPair;
use crescent_tests::{spawn_tebench_target, workspace_bin};

#[test]
fn tebench_between_two_network_namespaces_moves_verified_data() {
    let Some(hosts) = HostPair::create_or_skip("teb", "tebench_between_two_network_namespaces") else { return };
    let (_target, name) = spawn_tebench_target(
        &hosts.exec_prefix(&hosts.a),
        &["--buffer-size", "64M", "--pattern", "--local-hostname", &hosts.addr_a, "--protocol", "tcp"],
    );
    assert!(name.starts_with(&hosts.addr_a), "segment named by host A's address: {name}");
    for op in ["read", "write"] {
        let out = Command::new("ip")
            .args(["netns", "exec", &hosts.b])
            .arg(workspace_bin("tebench"))
            .args(["initiator", "--segment", &name, "--operation", op, "--block-size", "64K", "--batch-size", "32"])
            .args(["--threads", "2", "--duration", "1", "--verify", "--json", "--local-hostname", &hosts.addr_b])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{op}: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        let json: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
        assert_eq!(json["verified"], true, "{op}: {json}");
        assert_eq!(json["protocol"], "tcp");
        assert!(json["bytes"].as_u64().unwrap() > 0);
    }
}
