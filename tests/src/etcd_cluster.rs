//! A private etcd cluster of several members on loopback, for the masters' HA tests: each
//! member can be SIGKILLed on its own; dropping the cluster kills the rest and removes the
//! data.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::eventually;
use crate::services::{etcd_healthy, find_binary, free_port};

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
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| format!("etcd: {e}"))?;
            members.push(Some(child));
        }
        let cluster = EtcdCluster { members, client_ports, dir };
        for &port in &cluster.client_ports {
            assert!(eventually(Duration::from_secs(30), || etcd_healthy(port)), "etcd member on {port} is healthy");
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
