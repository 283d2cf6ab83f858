//! Issue 49: `crescent` for a running cluster. A master (`crescent-master`) and a holder client
//! (`crescent client`, contributing memory) run as processes; the operator's subcommands run as
//! the `crescent` binary against them, as an operator would type them: status, put/get of a
//! file, ls, stat, rm, top, and the bad input (a master down, a wrong secret, a missing key, an
//! unreadable file), each of which must end in one line on stderr and a non-zero exit.

use std::io::Write;
use std::process::{Command, Stdio};

use crescent_tests::store::{pattern_bytes, spawn_master_with_admin, ClientProc};
use crescent_tests::workspace_bin;

/// What one run of `crescent` left: its exit code, stdout, stderr.
struct Run {
    code: i32,
    out: Vec<u8>,
    err: String,
}

impl Run {
    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.out).into_owned()
    }

    /// Succeeded, and said nothing on stderr (no log lines, no progress bar off a terminal).
    fn ok(self, what: &str) -> Run {
        assert_eq!(self.code, 0, "{what}: exit {}; stderr: {}", self.code, self.err);
        assert!(self.err.is_empty(), "{what}: stderr should be empty off a terminal: {:?}", self.err);
        self
    }

    /// Failed with one line on stderr, `crescent: error: ...` holding `needle`, and no panic.
    fn one_line_error(self, what: &str, needle: &str) -> Run {
        assert_ne!(self.code, 0, "{what} should fail; stdout: {}", self.stdout());
        assert!(!self.err.contains("panicked"), "{what} panicked: {}", self.err);
        let lines: Vec<&str> = self.err.lines().collect();
        assert_eq!(lines.len(), 1, "{what}: one line on stderr, got {:?}", self.err);
        assert!(lines[0].starts_with("crescent: error: "), "{what}: {:?}", lines[0]);
        assert!(lines[0].contains(needle), "{what}: {:?} should say {needle:?}", lines[0]);
        self
    }
}

/// Runs `crescent ARGS` with `stdin` (none: an empty one), away from the caller's configuration.
fn crescent(args: &[&str], stdin: Option<&[u8]>) -> Run {
    let mut cmd = Command::new(workspace_bin("crescent"));
    cmd.args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    for var in [
        "MOONCAKE_CONFIG_PATH",
        "MOONCAKE_MASTER",
        "CRESCENT_MASTER_ADMIN",
        "CRESCENT_CLUSTER_SECRET",
        "CRESCENT_CLUSTER_SECRET_FILE",
        "CRESCENT_CLUSTER_SECRET_NEXT",
        "MOONCAKE_TENANT_ID",
        "RUST_LOG",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("MOONCAKE_LOCAL_HOSTNAME", "127.0.0.1");
    let mut child = cmd.spawn().expect("spawn crescent (cargo build -p crescent-store --bin crescent)");
    let mut input = child.stdin.take().expect("stdin");
    let data = stdin.unwrap_or_default().to_vec();
    let feeder = std::thread::spawn(move || {
        let _ = input.write_all(&data);
    });
    let out = child.wait_with_output().expect("crescent ran");
    let _ = feeder.join();
    Run {
        code: out.status.code().unwrap_or(-1),
        out: out.stdout,
        err: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `crescent SUB --master M --admin A REST...`.
fn at(sub: &str, master: &str, admin: &str, rest: &[&str]) -> Run {
    let mut args = vec![sub, "--master", master, "--admin", admin];
    args.extend_from_slice(rest);
    crescent(&args, None)
}

#[test]
fn an_operator_sees_and_manages_a_running_cluster() {
    let (_master, rpc, admin) = spawn_master_with_admin(&["--lease-ttl-ms", "300"]);
    let holder = ClientProc::spawn(
        &[],
        &["--master", &rpc, "--local-hostname", "127.0.0.1", "--segment-size", "64M", "--buffer-size", "8M"],
    );
    let dir = tempfile::tempdir().unwrap();

    // status: who leads, the holder's segment with its capacity, on one screen.
    let screen = at("status", &rpc, &admin, &[]).ok("status").stdout();
    assert!(screen.contains("leader (single master), term"), "{screen}");
    assert!(screen.contains(&holder.segment), "the holder's segment is listed: {screen}");
    assert!(screen.contains("64.0 MiB"), "its capacity: {screen}");
    assert!(screen.contains("clients    1"), "{screen}");
    let status: serde_json::Value =
        serde_json::from_slice(&at("status", &rpc, &admin, &["--json"]).ok("status --json").out)
            .expect("status --json is JSON");
    assert_eq!(status["role"], "single");
    assert_eq!(status["clients"], 1, "the tool itself is no client of the master: {status}");
    let segments = status["segments"].as_array().expect("segments");
    assert_eq!(segments.len(), 1, "{status}");
    assert_eq!(segments[0]["name"], holder.segment.as_str());
    assert_eq!(segments[0]["capacity"], 64u64 << 20);

    // put from a file, get it back into another file and to stdout: the same bytes.
    let value = pattern_bytes(3 << 20, 49);
    let file = dir.path().join("value.bin");
    std::fs::write(&file, &value).unwrap();
    let said = at("put", &rpc, &admin, &["cli/a", file.to_str().unwrap()]).ok("put FILE").stdout();
    assert!(said.starts_with("stored cli/a (3145728 bytes"), "{said}");
    let copy = dir.path().join("copy.bin");
    at("get", &rpc, &admin, &["cli/a", "-o", copy.to_str().unwrap()]).ok("get -o");
    assert!(std::fs::read(&copy).unwrap() == value, "get -o wrote other bytes");
    assert!(at("get", &rpc, &admin, &["cli/a"]).ok("get to stdout").out == value, "get to stdout: other bytes");
    let mut args = vec!["put", "--master", &rpc, "--admin", &admin, "cli/b", "-"];
    crescent(&args, Some(b"from stdin")).ok("put from stdin");
    assert_eq!(at("get", &rpc, &admin, &["cli/b"]).ok("get cli/b").out, b"from stdin");
    args[5] = "other/c";
    crescent(&args, Some(b"elsewhere")).ok("put other/c");
    // The holder holds them: the bytes moved between the tool and the holder's segment.
    let screen = at("status", &rpc, &admin, &[]).ok("status after puts").stdout();
    assert!(screen.contains("keys       3 "), "{screen}");

    // A put of an existing key is refused, not silently ignored; --replace replaces.
    at("put", &rpc, &admin, &["cli/b", file.to_str().unwrap()]).one_line_error("put over cli/b", "cli/b exists");
    // A replacement is refused while a reader's lease lasts (as upstream's upsert): the get of
    // cli/b above leased it for 300 ms.
    std::thread::sleep(std::time::Duration::from_millis(400));
    at("put", &rpc, &admin, &["--replace", "cli/b", file.to_str().unwrap()]).ok("put --replace");
    assert!(at("get", &rpc, &admin, &["cli/b"]).ok("get replaced").out == value);

    // ls: all, by prefix, by regex, as JSON, with sizes.
    let lines = |r: Run| r.stdout().lines().map(str::to_string).collect::<Vec<_>>();
    assert_eq!(lines(at("ls", &rpc, &admin, &[]).ok("ls")), ["cli/a", "cli/b", "other/c"]);
    assert_eq!(lines(at("ls", &rpc, &admin, &["cli/"]).ok("ls cli/")), ["cli/a", "cli/b"]);
    assert_eq!(lines(at("ls", &rpc, &admin, &["--regex", "^o.*c$"]).ok("ls --regex")), ["other/c"]);
    assert!(lines(at("ls", &rpc, &admin, &["nothing/"]).ok("ls nothing/")).is_empty());
    let listed: serde_json::Value =
        serde_json::from_slice(&at("ls", &rpc, &admin, &["--json", "cli/"]).ok("ls --json").out).unwrap();
    assert_eq!(listed, serde_json::json!(["cli/a", "cli/b"]));
    let long = at("ls", &rpc, &admin, &["-l", "other/"]).ok("ls -l").stdout();
    assert!(long.contains("9  DRAM") && long.contains("other/c"), "{long}");

    // stat: size, tier, the holder, the lease of the gets above.
    let stat = at("stat", &rpc, &admin, &["cli/a"]).ok("stat").stdout();
    assert!(stat.contains("size       3145728 (3.0 MiB)"), "{stat}");
    assert!(stat.contains(&holder.segment) && stat.contains("DRAM") && stat.contains("COMPLETE"), "{stat}");
    assert!(stat.contains("lease      "), "{stat}");
    let stat: serde_json::Value =
        serde_json::from_slice(&at("stat", &rpc, &admin, &["--json", "cli/a"]).ok("stat --json").out).unwrap();
    assert_eq!(stat["size"], 3u64 << 20);
    assert_eq!(stat["tiers"], serde_json::json!(["DRAM"]));
    assert_eq!(stat["replicas"][0]["segment"], holder.segment.as_str());

    // rm, then the key is gone: stat says so and fails.
    std::thread::sleep(std::time::Duration::from_millis(400)); // the gets' read leases (300 ms) end
    assert_eq!(at("rm", &rpc, &admin, &["cli/a"]).ok("rm").stdout().trim(), "removed cli/a");
    at("stat", &rpc, &admin, &["cli/a"]).one_line_error("stat of a removed key", "cli/a: no such key");
    at("get", &rpc, &admin, &["cli/a", "-o", copy.to_str().unwrap()]).one_line_error("get of a removed key", "cli/a");
    let removed = at("rm", &rpc, &admin, &["--regex", "^(cli|other)/"]).ok("rm --regex").stdout();
    assert_eq!(removed.trim(), "removed 2 key(s) matching \"^(cli|other)/\"");
    assert!(lines(at("ls", &rpc, &admin, &[]).ok("ls after rm")).is_empty());

    // top off a terminal: one line per sample, exactly --count of them.
    let top = at("top", &rpc, &admin, &["--count", "2", "--interval", "200ms"]).ok("top").stdout();
    let samples: Vec<&str> = top.lines().collect();
    assert_eq!(samples.len(), 2, "{top}");
    assert!(samples.iter().all(|l| l.contains(" keys=0 clients=1 ") && l.contains("put/s=")), "{top}");
    let top = at("top", &rpc, &admin, &["--count", "1", "--interval", "100ms", "--json"]).ok("top --json").stdout();
    let sample: serde_json::Value = serde_json::from_str(top.trim()).expect("top --json: one JSON object per line");
    assert_eq!(sample["capacity"], 64u64 << 20);

    // Bad input: a missing key, a file that cannot be read (absent, a directory).
    at("stat", &rpc, &admin, &["no/such"]).one_line_error("stat of a missing key", "no/such: no such key");
    let out = dir.path().join("never.bin");
    at("get", &rpc, &admin, &["no/such", "-o", out.to_str().unwrap()])
        .one_line_error("get of a missing key", "no/such");
    assert!(!out.exists(), "a failed get leaves no file behind");
    at("rm", &rpc, &admin, &["no/such"]).one_line_error("rm of a missing key", "no/such");
    at("put", &rpc, &admin, &["k", "/nonexistent/value.bin"])
        .one_line_error("put of an absent file", "cannot read /nonexistent/value.bin");
    at("put", &rpc, &admin, &["k", dir.path().to_str().unwrap()]).one_line_error("put of a directory", "directory");
    at("get", &rpc, &admin, &["--json", "k"]).one_line_error("get --json to stdout", "-o FILE");
    drop(holder);
}

#[test]
fn a_master_that_is_down_is_one_line_and_a_non_zero_exit() {
    // Ports nobody listens on: bound, then let go.
    let free = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
    let (rpc, admin) = (free(), free());
    for sub in [&["status"][..], &["ls"], &["stat", "k"], &["top", "--count", "1"]] {
        let mut args = vec![sub[0], "--master", &rpc, "--admin", &admin];
        args.extend_from_slice(&sub[1..]);
        crescent(&args, None).one_line_error(sub[0], "cannot be reached");
    }
    // Through the gRPC port: the client's own error, on one line.
    for sub in [&["get", "k"][..], &["rm", "k"]] {
        let mut args = vec![sub[0], "--master", &rpc];
        args.extend_from_slice(&sub[1..]);
        crescent(&args, None).one_line_error(sub[0], &rpc);
    }
    // MOONCAKE_MASTER names the master when no flag does.
    let r = {
        let mut cmd = Command::new(workspace_bin("crescent"));
        cmd.args(["get", "k"]).env_remove("MOONCAKE_CONFIG_PATH").env("MOONCAKE_MASTER", &rpc);
        let o = cmd.stdin(Stdio::null()).output().unwrap();
        Run { code: o.status.code().unwrap_or(-1), out: o.stdout, err: String::from_utf8_lossy(&o.stderr).into_owned() }
    };
    r.one_line_error("get by MOONCAKE_MASTER", &rpc);
}

#[test]
fn the_admin_token_is_made_from_the_cluster_secret() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "5b0e6c1f2a3d4e5f60718293a4b5c6d7\n").unwrap();
    let wrong = dir.path().join("wrong");
    std::fs::write(&wrong, "00000000000000000000000000000000\n").unwrap();
    let (_master, rpc, admin) = spawn_master_with_admin(&["--cluster-secret-file", secret.to_str().unwrap()]);
    let with = |file: &std::path::Path, sub: &[&str]| {
        let mut args = vec![sub[0], "--master", &rpc, "--admin", &admin, "--secret-file", file.to_str().unwrap()];
        args.extend_from_slice(&sub[1..]);
        crescent(&args, None)
    };
    let screen = with(&secret, &["status"]).ok("status with the secret").stdout();
    assert!(screen.contains("leader (single master)"), "{screen}");
    with(&secret, &["ls"]).ok("ls with the secret");
    with(&wrong, &["status"]).one_line_error("status with a wrong secret", "refused the admin token");
    at("ls", &rpc, &admin, &[]).one_line_error("ls without a secret", "no cluster secret is set here");
    // gRPC: a wrong secret cannot use the master either.
    with(&wrong, &["get", "k"]).one_line_error("get with a wrong secret", "");
}
