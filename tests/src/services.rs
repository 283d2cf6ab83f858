//! Real metadata services for tests: the shared etcd and redis that `ci/test.sh` starts
//! (`CRESCENT_TEST_ETCD`, `CRESCENT_TEST_REDIS` = `127.0.0.1:PORT`), private instances that a
//! test starts, stops and restarts itself (from the `etcd` and `redis-server` binaries), and
//! the project's own http metadata server.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crescent_benches::etcd_cluster::{etcd_healthy, find_binary};

use crate::eventually;

/// A metadata service kind under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Etcd,
    Redis,
    Http,
}

/// `Some(connection string)` of the shared service of `kind`, or `None` after printing
/// `SKIPPED: <test>: …` when the environment has none. Http always has one: the in-process
/// server in `http`, which the caller keeps alive.
pub fn shared_service(
    kind: Kind,
    test: &str,
    http: &mut Option<crescent_engine::metadata::server::MetadataServer>,
) -> Option<String> {
    let from_env = |var: &str, scheme: &str| match std::env::var(var) {
        Ok(addr) if !addr.trim().is_empty() => Some(format!("{scheme}://{}", addr.trim())),
        _ => {
            crate::skip(&format!("{test}: {var} is not set (ci/test.sh starts the service and sets it)"));
            None
        }
    };
    match kind {
        Kind::Etcd => from_env("CRESCENT_TEST_ETCD", "etcd"),
        Kind::Redis => from_env("CRESCENT_TEST_REDIS", "redis"),
        Kind::Http => {
            let server =
                crescent_engine::metadata::server::MetadataServer::start("127.0.0.1:0".parse().unwrap(), "/metadata")
                    .expect("http metadata server starts on loopback");
            let url = server.url();
            *http = Some(server);
            Some(url)
        }
    }
}

/// A cluster id no other test uses, so that tests sharing one service never see each other.
pub fn unique_cluster(tag: &str) -> String {
    format!("crescent-test-{tag}-{}-{:08x}", std::process::id(), rand::random::<u32>())
}

/// A free loopback port (free when asked; the caller binds it soon after).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free loopback port")
}

fn answers(port: u16) -> bool {
    TcpStream::connect_timeout(&SocketAddr::from(([127, 0, 0, 1], port)), Duration::from_millis(200)).is_ok()
}

/// A service process of a test's own, on a port it keeps across restarts; killed on drop.
pub struct PrivateService {
    kind: Kind,
    binary: PathBuf,
    pub port: u16,
    peer_port: u16,
    /// Extra arguments (e.g. redis ACL users).
    extra: Vec<String>,
    dir: PathBuf,
    child: Option<Child>,
}

impl PrivateService {
    /// Starts a private `etcd` or `redis-server`; `Err` (the caller skips) when the binary is
    /// not installed.
    pub fn start(kind: Kind, extra: &[&str]) -> Result<Self, String> {
        let name = match kind {
            Kind::Etcd => "etcd",
            Kind::Redis => "redis-server",
            Kind::Http => return Err("http runs in-process".into()),
        };
        let binary = find_binary(name).ok_or_else(|| format!("{name} is not installed"))?;
        let dir =
            std::env::temp_dir().join(format!("crescent-{name}-{}-{:08x}", std::process::id(), rand::random::<u32>()));
        let mut service = PrivateService {
            kind,
            binary,
            port: free_port(),
            peer_port: free_port(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            dir,
            child: None,
        };
        service.launch();
        Ok(service)
    }

    fn launch(&mut self) {
        // A fresh data directory each time: a restarted service has lost every entry.
        let _ = std::fs::remove_dir_all(&self.dir);
        std::fs::create_dir_all(&self.dir).expect("service data directory");
        let mut cmd = Command::new(&self.binary);
        match self.kind {
            Kind::Etcd => {
                let client = format!("http://127.0.0.1:{}", self.port);
                let peer = format!("http://127.0.0.1:{}", self.peer_port);
                cmd.args(["--name", "crescent-test", "--data-dir"])
                    .arg(self.dir.join("etcd"))
                    .args(["--listen-client-urls", &client])
                    .args(["--advertise-client-urls", &client])
                    .args(["--listen-peer-urls", &peer])
                    .args(["--initial-advertise-peer-urls", &peer])
                    .args(["--initial-cluster", &format!("crescent-test={peer}")]);
            }
            Kind::Redis => {
                cmd.args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
                    .args(["--save", "", "--appendonly", "no", "--dir"])
                    .arg(&self.dir);
            }
            Kind::Http => unreachable!(),
        }
        cmd.args(&self.extra).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
        self.child = Some(cmd.spawn().expect("service process starts"));
        let port = self.port;
        assert!(eventually(Duration::from_secs(20), || answers(port)), "{:?} answers on port {port}", self.kind);
        if self.kind == Kind::Etcd {
            // The client port opens before the member has elected itself leader.
            assert!(eventually(Duration::from_secs(20), || etcd_healthy(port)), "etcd on port {port} has a leader");
        }
    }

    /// Kills the service (SIGKILL): it is gone, with its data.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port, empty.
    pub fn restart(&mut self) {
        self.stop();
        self.launch();
    }

    /// The connection string; `userinfo` like `alice:pw@`, `db` like `/3`.
    pub fn url(&self, userinfo: &str, db: &str) -> String {
        match self.kind {
            Kind::Etcd => format!("etcd://127.0.0.1:{}", self.port),
            _ => format!("redis://{userinfo}127.0.0.1:{}{db}", self.port),
        }
    }
}

impl Drop for PrivateService {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
