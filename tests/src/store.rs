//! Driving store processes: `crescent-master` and `crescent client` (commands on stdin, one
//! answer line each on stdout).

use std::io::Write;
use std::process::{ChildStdin, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::Duration;

use crate::{lines_of, workspace_bin, ChildGuard};

/// Starts `crescent-master` (through `prefix`, e.g. `ip netns exec NS`) and returns it with
/// the address it prints.
pub fn spawn_master(prefix: &[&str], args: &[&str]) -> (ChildGuard, String) {
    let (child, addr, _) = spawn_until(prefix, "crescent-master", args, "master: ", "its address");
    (child, addr)
}

/// Starts `bin` with `args` (through `prefix`) and waits for the line of its stdout that starts
/// with `prefix_of_line` (60 s at most, else a panic saying it never printed `what`): the
/// child, the rest of that line (trimmed) and its later lines.
fn spawn_until(
    prefix: &[&str],
    bin: &str,
    args: &[&str],
    prefix_of_line: &str,
    what: &str,
) -> (ChildGuard, String, Receiver<String>) {
    let mut cmd = command(prefix, bin);
    cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::inherit());
    let mut child = ChildGuard(cmd.spawn().unwrap_or_else(|e| panic!("spawn {bin}: {e}")));
    let lines = lines_of(child.0.stdout.take().expect("stdout"));
    loop {
        let line = lines.recv_timeout(Duration::from_secs(60)).unwrap_or_else(|_| panic!("{bin} printed {what}"));
        if let Some(rest) = line.strip_prefix(prefix_of_line) {
            return (child, rest.trim().to_string(), lines);
        }
    }
}

/// Starts `crescent-master` with `args` on loopback and returns it with its gRPC address and its
/// admin URL (`http://HOST:PORT`), as it prints them; the rest of its output is drained.
pub fn spawn_master_with_admin(args: &[&str]) -> (ChildGuard, String, String) {
    let mut cmd = command(&[], "crescent-master");
    cmd.args(["--rpc-address", "127.0.0.1:0", "--admin-address", "127.0.0.1:0"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut child = ChildGuard(cmd.spawn().expect("spawn crescent-master"));
    let lines = lines_of(child.0.stdout.take().expect("stdout"));
    let (mut rpc, mut admin) = (None, None);
    while rpc.is_none() || admin.is_none() {
        let line = lines.recv_timeout(Duration::from_secs(60)).expect("crescent-master printed its addresses");
        if let Some(addr) = line.strip_prefix("master: ") {
            rpc = Some(addr.trim().to_string());
        } else if let Some(url) = line.strip_prefix("admin: ") {
            admin = Some(url.trim().trim_end_matches("/metrics").to_string());
        }
    }
    std::thread::spawn(move || while lines.recv().is_ok() {});
    (child, rpc.unwrap_or_default(), admin.unwrap_or_default())
}

fn command(prefix: &[&str], bin: &str) -> Command {
    let bin = workspace_bin(bin);
    match prefix.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(bin);
            c
        }
        None => Command::new(bin),
    }
}

/// A `crescent client` process.
pub struct ClientProc {
    pub child: ChildGuard,
    stdin: ChildStdin,
    lines: Receiver<String>,
    pub segment: String,
}

impl ClientProc {
    pub fn spawn(prefix: &[&str], args: &[&str]) -> ClientProc {
        Self::spawn_as(prefix, "client", args)
    }

    /// A `crescent dummy` process: a dummy client of a standalone client, same commands.
    pub fn spawn_dummy(args: &[&str]) -> ClientProc {
        Self::spawn_as(&[], "dummy", args)
    }

    fn spawn_as(prefix: &[&str], sub: &str, args: &[&str]) -> ClientProc {
        let mut cmd = command(prefix, "crescent");
        cmd.arg(sub).args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit());
        let mut child = ChildGuard(cmd.spawn().expect("spawn crescent client"));
        let stdin = child.0.stdin.take().expect("stdin");
        let lines = lines_of(child.0.stdout.take().expect("stdout"));
        let ready = lines.recv_timeout(Duration::from_secs(60)).expect("client started");
        let segment =
            ready.strip_prefix("ready ").unwrap_or_else(|| panic!("unexpected first line {ready:?}")).to_string();
        ClientProc { child, stdin, lines, segment }
    }

    /// Sends one command and returns its answer line.
    pub fn cmd(&mut self, command: &str) -> String {
        writeln!(self.stdin, "{command}").expect("client stdin");
        self.stdin.flush().expect("flush");
        self.lines.recv_timeout(Duration::from_secs(60)).unwrap_or_else(|_| panic!("no answer to {command:?}"))
    }

    /// Sends a command without waiting for its answer (the answers queue up unread).
    pub fn send(&mut self, command: &str) {
        writeln!(self.stdin, "{command}").expect("client stdin");
        self.stdin.flush().expect("flush");
    }

    /// Sends a command that must succeed; returns what follows "ok".
    pub fn ok(&mut self, command: &str) -> String {
        let answer = self.cmd(command);
        match answer.strip_prefix("ok") {
            Some(rest) => rest.trim().to_string(),
            None => panic!("{command:?} failed: {answer}"),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.0.id()
    }
}

/// Starts `crescent-client` (a standalone client) and returns it with the socket it serves.
pub fn spawn_standalone(args: &[&str]) -> (ChildGuard, String) {
    let (child, socket, lines) = spawn_until(&[], "crescent-client", args, "socket: ", "its socket");
    // The rest of its output is drained (a full pipe would block it).
    std::thread::spawn(move || while lines.recv().is_ok() {});
    (child, socket)
}

/// A master in this process on loopback (free gRPC and admin ports), with `config`'s other settings.
pub fn loopback_master(config: crescent_store::MasterConfig) -> crescent_store::master::server::MasterHandle {
    crescent_store::master::server::start(crescent_store::MasterConfig {
        rpc_address: "127.0.0.1:0".into(),
        admin_address: "127.0.0.1:0".into(),
        ..config
    })
    .expect("master starts on loopback")
}

/// A client's settings for a master on loopback (this process's address); tests set the
/// sizes they need on top.
pub fn loopback_client_config(m: &crescent_store::master::server::MasterHandle) -> crescent_store::ClientConfig {
    crescent_store::ClientConfig {
        master_server_address: m.client_address(),
        local_hostname: Some("127.0.0.1".into()),
        ..crescent_store::ClientConfig::default()
    }
}

/// A client of the master `m` on loopback contributing `segment` bytes (0: a pure consumer,
/// whose replicas are all remote), with a 4 MiB local buffer.
pub fn loopback_client(
    m: &crescent_store::master::server::MasterHandle,
    segment: u64,
) -> std::sync::Arc<crescent_store::StoreClient> {
    crescent_store::StoreClient::connect(crescent_store::ClientConfig {
        global_segment_size: segment,
        local_buffer_size: 4 << 20,
        ..loopback_client_config(m)
    })
    .expect("a client of the loopback master")
}

/// `len` bytes of the store's checkable pattern, seeded with `seed`.
pub fn pattern_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; len];
    crescent_store::pattern::fill(&mut v, seed, 0);
    v
}

/// One HTTP/1.1 request to the master's admin port; returns (status, body as JSON, or as a
/// JSON string when it is not JSON).
pub fn admin_http(
    m: &crescent_store::master::server::MasterHandle,
    method: &str,
    path: &str,
    body: &str,
) -> (u16, serde_json::Value) {
    let addr = m.admin_addr.expect("the master has an admin port");
    let (status, _, body) = crate::http(addr, method, path, "Content-Type: application/json\r\n", body);
    (status, serde_json::from_str(&body).unwrap_or(serde_json::Value::String(body)))
}
