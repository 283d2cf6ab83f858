//! Same host, but the kernel forbids process_vm access to the target (another user, or a
//! non-dumpable target seen by a process without CAP_SYS_PTRACE): the initiator says why,
//! once, and moves the bytes over tcp instead. Needs root (to run the initiator as another
//! user or without CAP_SYS_PTRACE) and `setpriv`; skipped with the reason otherwise.

use std::process::{Command, Output};

use crescent_tests::{spawn_tebench_target, workspace_bin};

fn can_drop_privileges() -> Result<(), String> {
    let root = Command::new("id").arg("-u").output().map_err(|e| e.to_string())?;
    if String::from_utf8_lossy(&root.stdout).trim() != "0" {
        return Err("not root".into());
    }
    Command::new("setpriv").arg("--version").output().map_err(|e| format!("no setpriv: {e}"))?;
    Ok(())
}

fn initiator_with(setpriv: &[&str], segment: &str) -> Output {
    Command::new("setpriv")
        .args(setpriv)
        .arg(workspace_bin("tebench"))
        .args(["initiator", "--segment", segment, "--block-size", "64K", "--batch-size", "8"])
        .args(["--duration", "0.5", "--verify", "--json", "--report-interval", "0"])
        .args(["--local-hostname", "127.0.0.1"])
        .env_remove("MC_FORCE_TCP")
        .output()
        .unwrap()
}

fn assert_fell_back_to_tcp(out: &Output) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let json: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(json["verified"], true, "{json}");
    assert_eq!(json["protocol"], "tcp", "{json}");
    let why: Vec<&str> = stderr.lines().filter(|l| l.contains("not using shm")).collect();
    assert_eq!(why.len(), 1, "one line says why: {stderr}");
    assert!(why[0].contains("denies access"), "{}", why[0]);
}

#[test]
fn another_user_falls_back_to_tcp() {
    if let Err(why) = can_drop_privileges() {
        crescent_tests::skip(&format!("another_user_falls_back_to_tcp: {why}"));
        return;
    }
    let (_target, name) =
        spawn_tebench_target(&[], &["--buffer-size", "16M", "--pattern", "--heap", "--local-hostname", "127.0.0.1"]);
    let nobody = ["--reuid=65534", "--regid=65534", "--clear-groups"];
    assert_fell_back_to_tcp(&initiator_with(&nobody, &name));
}

#[test]
fn non_dumpable_target_falls_back_to_tcp_without_cap_sys_ptrace() {
    if let Err(why) = can_drop_privileges() {
        crescent_tests::skip(&format!("non_dumpable_target_falls_back_to_tcp: {why}"));
        return;
    }
    let (_target, name) = spawn_tebench_target(
        &[],
        &["--buffer-size", "16M", "--pattern", "--not-dumpable", "--local-hostname", "127.0.0.1"],
    );
    let no_ptrace = ["--bounding-set=-sys_ptrace", "--inh-caps=-sys_ptrace"];
    assert_fell_back_to_tcp(&initiator_with(&no_ptrace, &name));
}
