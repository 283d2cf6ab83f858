//! A private etcd cluster of several members on loopback, for the masters' HA tests and the
//! failover benchmark: each member can be SIGKILLed on its own; dropping the cluster kills the
//! rest and removes the data.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::eventually;

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free loopback port")
}

/// `name` on `PATH` (or in /usr/bin, /usr/sbin).
pub fn find_binary(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/sbin")])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Whether the etcd member on `port` says it is healthy (it has a leader).
pub fn etcd_healthy(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&SocketAddr::from(([127, 0, 0, 1], port)), Duration::from_millis(500))
    else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = s.set_write_timeout(Some(Duration::from_secs(2)));
    if s.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").is_err() {
        return false;
    }
    let mut reply = String::new();
    let _ = s.read_to_string(&mut reply);
    reply.contains(r#""health":"true""#)
}

pub struct EtcdCluster {
    members: Vec<Option<Child>>,
    pub client_ports: Vec<u16>,
    dir: PathBuf,
}

impl EtcdCluster {
    /// Starts `n` members and waits until each is healthy; `Err` (the caller skips) when
    /// `etcd` is not installed.
    pub fn start(n: usize) -> Result<EtcdCluster, String> {
        let binary = find_binary("etcd").ok_or("etcd is not installed")?;
        let dir = std::env::temp_dir().join(format!(
            "crescent-etcd-cluster-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let client_ports: Vec<u16> = (0..n).map(|_| free_port()).collect();
        let peer_ports: Vec<u16> = (0..n).map(|_| free_port()).collect();
        let initial: Vec<String> =
            peer_ports.iter().enumerate().map(|(i, p)| format!("e{i}=http://127.0.0.1:{p}")).collect();
        let token = format!("crescent-{:08x}", rand::random::<u32>());
        let mut members = Vec::new();
        for i in 0..n {
            let client = format!("http://127.0.0.1:{}", client_ports[i]);
            let peer = format!("http://127.0.0.1:{}", peer_ports[i]);
            let child = Command::new(&binary)
                .args(["--name", &format!("e{i}"), "--data-dir"])
                .arg(dir.join(format!("e{i}")))
                .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
                .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
                .args(["--initial-cluster", &initial.join(","), "--initial-cluster-state", "new"])
                .args(["--initial-cluster-token", &token])
                // As a deployment runs it: the masters' removal records are writes whose history
                // etcd keeps until compacted.
                .args(["--auto-compaction-mode", "periodic", "--auto-compaction-retention", "1m"])
                // etcd 3.6's default: the raft log in memory is cut every 10 000 entries (3.4
                // and 3.5 keep 100 000, which a record per remove fills in an hour).
                .args(["--snapshot-count", "10000"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| format!("etcd: {e}"))?;
            members.push(Some(child));
        }
        let cluster = EtcdCluster { members, client_ports, dir };
        for &port in &cluster.client_ports {
            if !eventually(Duration::from_secs(30), || etcd_healthy(port)) {
                return Err(format!("the etcd member on port {port} did not become healthy"));
            }
        }
        Ok(cluster)
    }

    /// `etcd://127.0.0.1:A;127.0.0.1:B;…`
    pub fn url(&self) -> String {
        let eps: Vec<String> = self.client_ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        format!("etcd://{}", eps.join(";"))
    }

    /// The endpoints without the scheme, `;`-separated (a master's `--etcd_endpoints`).
    pub fn endpoints(&self) -> String {
        self.url().trim_start_matches("etcd://").to_string()
    }

    /// The process ids of the members still running.
    pub fn pids(&self) -> Vec<u32> {
        self.members.iter().flatten().map(Child::id).collect()
    }

    /// SIGKILLs member `i`.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
