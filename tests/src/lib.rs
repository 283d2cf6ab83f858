//! Helpers for Crescent's cross-crate and multi-process tests.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crescent_engine::{BufferDescriptor, EngineConfig, Opcode, SegmentId, TransferEngine, TransferRequest};

pub mod dashboards;
pub mod etcd_cluster;
pub mod faults;
pub mod netns;
pub mod partition;
pub mod services;
pub mod store;
pub mod tmpfs;

/// A test that cannot run here says why (`SKIPPED: <why>`) and returns, unless
/// `CRESCENT_NO_SKIP=1`: `ci/test.sh` sets it where it provides what the tests need (root for
/// namespaces, the services), and there a skip is a failure, so CI never passes a test it
/// did not run.
pub fn skip(why: &str) {
    if std::env::var("CRESCENT_NO_SKIP").is_ok_and(|v| v == "1") {
        panic!("this test cannot run here: {why} (CRESCENT_NO_SKIP=1: skipping is a failure)");
    }
    println!("SKIPPED: {why}");
}

/// An engine on loopback with the given transfer timeout, moving bytes over tcp (the
/// transport these tests exercise) even to peers on this host.
pub fn loopback_engine(timeout: Duration) -> Arc<TransferEngine> {
    let config = EngineConfig {
        local_hostname: Some("127.0.0.1".into()),
        protocol: Some(crescent_engine::TransportKind::Tcp),
        transfer_timeout: timeout,
        ..EngineConfig::default()
    };
    TransferEngine::new(config).expect("engine starts on loopback")
}

/// An engine on loopback that chooses its transport per peer (shm for this host's).
pub fn same_host_engine(timeout: Duration) -> Arc<TransferEngine> {
    let config =
        EngineConfig { local_hostname: Some("127.0.0.1".into()), transfer_timeout: timeout, ..EngineConfig::default() };
    TransferEngine::new(config).expect("engine starts on loopback")
}

/// One HTTP/1.1 request (`Connection: close`, a 30 s read timeout) with the extra `headers`
/// (each ending in CRLF) and `body`: the answer's status, head and body (as sent, not
/// dechunked).
pub fn http(
    addr: impl std::net::ToSocketAddrs,
    method: &str,
    path: &str,
    headers: &str,
    body: &str,
) -> (u16, String, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").expect("an HTTP reply");
    let status = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).expect("a status");
    (status, head.to_string(), body.to_string())
}

/// Opens the segment `name` (a `tebench target`'s, say) and returns it with its first buffer.
pub fn open_first_buffer(engine: &TransferEngine, name: &str) -> (SegmentId, BufferDescriptor) {
    let seg = engine.open_segment(name).unwrap();
    let remote = engine.segment_descriptor(seg).unwrap().buffers[0].clone();
    (seg, remote)
}

/// One request in a batch of its own, waited for: `length` bytes between the registered local
/// memory at `source` and `target_offset` of segment `target`.
pub fn transfer_one(
    engine: &TransferEngine,
    opcode: Opcode,
    source: u64,
    target: SegmentId,
    target_offset: u64,
    length: u64,
) -> crescent_engine::Result<()> {
    engine.transfer_sync(&[TransferRequest { opcode, source, target, target_offset, length }])
}

/// The shm endpoint's socket name of `engine`.
pub fn shm_socket(engine: &TransferEngine) -> String {
    engine
        .local_descriptor()
        .endpoints
        .iter()
        .find_map(|e| match e {
            crescent_transports::Endpoint::Shm { socket } => Some(socket.clone()),
            _ => None,
        })
        .expect("an shm endpoint")
}

/// Path of a binary of this workspace built beside the test executable (`cargo test`
/// builds `tebench` with the workspace).
pub fn workspace_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target/<profile>");
    let bin = dir.join(name);
    assert!(
        bin.exists(),
        "{} not built: run `cargo build --workspace` (or `cargo test --workspace`) first",
        bin.display()
    );
    bin
}

/// A child process killed (SIGKILL) when dropped.
pub struct ChildGuard(pub Child);

impl ChildGuard {
    pub fn kill_now(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.kill_now();
    }
}

/// Starts `tebench target` through `prefix` (e.g. `ip netns exec NS`) and waits for the
/// segment name it prints.
pub fn spawn_tebench_target(prefix: &[&str], args: &[&str]) -> (ChildGuard, String) {
    spawn_tebench_target_env(prefix, args, &[])
}

/// [`spawn_tebench_target`] with extra environment variables.
pub fn spawn_tebench_target_env(prefix: &[&str], args: &[&str], envs: &[(&str, &str)]) -> (ChildGuard, String) {
    let bin = workspace_bin("tebench");
    let mut cmd = match prefix.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(&bin);
            c
        }
        None => Command::new(&bin),
    };
    cmd.arg("target").args(args).envs(envs.iter().copied()).stdout(Stdio::piped()).stderr(Stdio::inherit());
    let mut child = ChildGuard(cmd.spawn().expect("spawn tebench target"));
    let stdout = child.0.stdout.take().expect("piped stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(name) = line.strip_prefix("segment: ") {
                let _ = tx.send(name.trim().to_string());
            }
        }
    });
    let name = rx.recv_timeout(Duration::from_secs(60)).expect("tebench target printed its segment name");
    (child, name)
}

pub use crescent_benches::eventually;

/// A peer that answers the handshake with a descriptor (one 64 MiB buffer at 0x10000000)
/// whose tcp endpoint accepts connections, reads requests and never answers; with
/// `close_after`, it closes each connection after that long instead.
pub struct SilentPeer {
    pub name: String,
    pub buffer: u64,
}

impl SilentPeer {
    pub fn start(close_after: Option<Duration>) -> SilentPeer {
        use std::io::Read;
        Self::serving(move |conn| {
            let mut conn = conn;
            let started = Instant::now();
            conn.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
            let mut sink = [0u8; 65536];
            loop {
                if close_after.is_some_and(|d| started.elapsed() >= d) {
                    return; // drop: the initiator sees the connection close
                }
                match conn.read(&mut sink) {
                    Ok(0) => return,
                    _ => continue,
                }
            }
        })
    }

    /// A peer whose handshake answers like [`SilentPeer::start`]'s and whose tcp data
    /// connections are each served by `serve`, on a thread of its own.
    pub fn serving(serve: impl Fn(std::net::TcpStream) + Send + Sync + 'static) -> SilentPeer {
        use crescent_engine::handshake::{read_message, write_message, MessageKind, MAX_REQUEST};
        use crescent_engine::{BufferDescriptor, SegmentDescriptor};
        use crescent_transports::Endpoint;
        use std::net::TcpListener;

        let data = TcpListener::bind("127.0.0.1:0").unwrap();
        let data_port = data.local_addr().unwrap().port();
        let serve = Arc::new(serve);
        std::thread::spawn(move || {
            for conn in data.incoming().map_while(Result::ok) {
                let serve = serve.clone();
                std::thread::spawn(move || serve(conn));
            }
        });
        let hs = TcpListener::bind("127.0.0.1:0").unwrap();
        let name = format!("127.0.0.1:{}", hs.local_addr().unwrap().port());
        let buffer = 0x1000_0000;
        let descriptor = SegmentDescriptor {
            name: name.clone(),
            host_id: "silent-peer".into(),
            endpoints: vec![Endpoint::Tcp { host: "127.0.0.1".into(), port: data_port }],
            buffers: vec![BufferDescriptor {
                addr: buffer,
                length: 64 << 20,
                location: "cpu:0".into(),
                keys: Default::default(),
            }],
        };
        std::thread::spawn(move || {
            for conn in hs.incoming().map_while(Result::ok) {
                let mut conn = conn;
                while let Ok((MessageKind::GetDescriptor, _)) = read_message(&mut conn, MAX_REQUEST) {
                    if write_message(&mut conn, MessageKind::Descriptor, &descriptor.to_json()).is_err() {
                        break;
                    }
                }
            }
        });
        SilentPeer { name, buffer }
    }
}

/// Batches of alternating reads and writes (`count` requests of `len` bytes each, request `i`
/// at `local + i*len` ↔ `remote + i*len`) in a loop, until a batch has a request that did not
/// complete — what the "peer dies mid-transfer" tests run while they kill the peer.
pub struct BatchLoop {
    completed: Arc<std::sync::atomic::AtomicUsize>,
    handle: std::thread::JoinHandle<Vec<Vec<crescent_engine::TransferStatus>>>,
}

impl BatchLoop {
    pub fn start(
        engine: &Arc<TransferEngine>,
        seg: crescent_engine::SegmentId,
        local: u64,
        remote: u64,
        count: u64,
        len: u64,
    ) -> Self {
        use crescent_engine::{Opcode, TransferRequest, TransferStatus};
        use std::sync::atomic::Ordering;
        let completed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (engine, done) = (engine.clone(), completed.clone());
        let handle = std::thread::spawn(move || {
            let mut outcomes = Vec::new();
            loop {
                let reqs: Vec<_> = (0..count)
                    .map(|i| TransferRequest {
                        opcode: if i % 2 == 0 { Opcode::Read } else { Opcode::Write },
                        source: local + i * len,
                        target: seg,
                        target_offset: remote + i * len,
                        length: len,
                    })
                    .collect();
                let id = engine.allocate_batch(count as usize).unwrap();
                engine.submit(id, &reqs).unwrap();
                let statuses = engine.wait_batch(id, None).unwrap();
                engine.free_batch(id).unwrap();
                let failed = statuses.iter().any(|s| *s != TransferStatus::Completed);
                outcomes.push(statuses);
                done.fetch_add(1, Ordering::Relaxed);
                if failed {
                    return outcomes;
                }
            }
        });
        BatchLoop { completed, handle }
    }

    /// Waits (up to a minute: a loaded machine can be slow) until `n` batches have ended.
    pub fn wait_for_batches(&self, n: usize) {
        let completed = &self.completed;
        assert!(
            eventually(Duration::from_secs(60), || completed.load(std::sync::atomic::Ordering::Relaxed) >= n),
            "{n} batch(es) ended"
        );
    }

    /// Joins the loop (it ends at the first batch with a request that did not complete) and
    /// returns every batch's statuses.
    pub fn join(self) -> Vec<Vec<crescent_engine::TransferStatus>> {
        self.handle.join().expect("the batch loop panicked")
    }
}

/// The lines a child process writes to `out`, as they come (the channel ends with them).
pub fn lines_of(out: impl std::io::Read + Send + 'static) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}
