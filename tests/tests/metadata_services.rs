//! Engines that find each other through a real metadata service: etcd and redis (started by
//! `ci/test.sh`, or privately by the test that restarts them) and the project's http server.
//! Each case runs against each service; a case whose service is not there prints `SKIPPED: …`.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crescent_benches::pattern;
use crescent_engine::metadata::server::MetadataServer;
use crescent_engine::metadata::{fetch_descriptor, Keys, MetadataStore, RpcMeta, ServiceAddress};
use crescent_engine::{EngineConfig, EngineError, Opcode, RegisteredMemory, SegmentId, TransferEngine};
use crescent_tests::services::{free_port, shared_service, unique_cluster, Kind, PrivateService};
use crescent_tests::{eventually, spawn_tebench_target_env, transfer_one, workspace_bin, ChildGuard};
use crescent_transports::SharedMemory;

fn engine(url: &str, cluster: &str, ttl: Duration) -> Arc<TransferEngine> {
    TransferEngine::new(EngineConfig {
        local_hostname: Some("127.0.0.1".into()),
        metadata_server: url.into(),
        metadata_cluster_id: Some(cluster.into()),
        metadata_ttl: ttl,
        transfer_timeout: Duration::from_secs(20),
        ..EngineConfig::default()
    })
    .unwrap_or_else(|e| panic!("engine starts with metadata server {url}: {e}"))
}

fn store(url: &str) -> Arc<dyn MetadataStore> {
    ServiceAddress::parse(url).unwrap().connect().unwrap().expect("a service, not P2P")
}

fn filled(engine: &TransferEngine, len: u64, seed: u64) -> RegisteredMemory {
    let mem = engine.alloc_registered(len, "cpu:0").unwrap();
    // SAFETY: no transfer touches the memory yet.
    pattern::fill(unsafe { mem.as_mut_slice() }, seed, 0);
    mem
}

/// Reads `len` bytes at `remote` of `seg` and checks them against the pattern `seed`.
fn read_and_check(
    engine: &TransferEngine,
    seg: SegmentId,
    local: &RegisteredMemory,
    remote: u64,
    len: u64,
    seed: u64,
) -> Result<(), EngineError> {
    transfer_one(engine, Opcode::Read, local.addr(), seg, remote, len)?;
    // SAFETY: the transfer ended.
    let got = unsafe { &local.as_slice()[..len as usize] };
    assert_eq!(pattern::first_mismatch(got, seed, 0), None, "bytes read back");
    Ok(())
}

/// Opens `owner`'s segment from `reader` and reads all of `mem` (`owner`'s, filled with the
/// pattern `seed`) back, checked.
fn reads_back(reader: &TransferEngine, owner: &TransferEngine, mem: &RegisteredMemory, seed: u64) {
    let seg = reader.open_segment(owner.segment_name()).unwrap();
    let local = reader.alloc_registered(mem.len(), "cpu:0").unwrap();
    read_and_check(reader, seg, &local, mem.addr(), mem.len(), seed).unwrap();
}

/// A fresh cluster on the shared service of `kind`: the service's URL, the cluster's name, its
/// keys and a client of the service (`_http` holds an HTTP service run by this process).
struct OnService {
    _http: Option<MetadataServer>,
    url: String,
    cluster: String,
    keys: Keys,
    service: Arc<dyn MetadataStore>,
}

/// [`OnService`] for `test`, its cluster named after `tag`; `None` where the test skips.
fn on_service(kind: Kind, test: &str, tag: &str) -> Option<OnService> {
    let mut http = None;
    let url = shared_service(kind, test, &mut http)?;
    let cluster = unique_cluster(tag);
    let keys = Keys::new(Some(&cluster));
    let service = store(&url);
    Some(OnService { _http: http, url, cluster, keys, service })
}

macro_rules! per_service {
    ($case:ident) => {
        mod $case {
            use super::*;
            #[test]
            fn etcd() {
                super::$case(Kind::Etcd, concat!(stringify!($case), "::etcd"));
            }
            #[test]
            fn redis() {
                super::$case(Kind::Redis, concat!(stringify!($case), "::redis"));
            }
            #[test]
            fn http() {
                super::$case(Kind::Http, concat!(stringify!($case), "::http"));
            }
        }
    };
}

per_service!(two_engines_find_each_other_and_transfer);
fn two_engines_find_each_other_and_transfer(kind: Kind, test: &str) {
    let Some(OnService { _http, url, cluster, keys, service }) = on_service(kind, test, "pair") else {
        return;
    };
    let a = engine(&url, &cluster, Duration::from_secs(10));
    let b = engine(&url, &cluster, Duration::from_secs(10));
    let name = a.segment_name().to_string();
    let first = filled(&a, 4 << 20, 7);

    // b knows a by name only: the descriptor comes from the service.
    let seg = b.open_segment(&name).unwrap();
    let descriptor = b.segment_descriptor(seg).unwrap();
    assert_eq!(descriptor.name, name);
    assert!(descriptor.buffers.iter().any(|x| x.addr == first.addr()));
    let local = b.alloc_registered(4 << 20, "cpu:0").unwrap();
    read_and_check(&b, seg, &local, first.addr(), 4 << 20, 7).unwrap();

    // Writes land in a's memory.
    // SAFETY: no transfer of `local` is in flight.
    pattern::fill(unsafe { local.as_mut_slice() }, 9, 0);
    transfer_one(&b, Opcode::Write, local.addr(), seg, first.addr() + (1 << 20), 1 << 20).unwrap();
    // SAFETY: the write ended.
    let written = unsafe { &first.as_slice()[1 << 20..2 << 20] };
    assert_eq!(pattern::first_mismatch(written, 9, 0), None);

    // Memory a registers after b opened it is published; b's stale descriptor is refreshed.
    let second = filled(&a, 1 << 20, 11);
    read_and_check(&b, seg, &local, second.addr(), 1 << 20, 11).unwrap();

    // The rpc_meta entry tells the handshake address, as Mooncake lays it out.
    let rpc = service.get(&keys.rpc_meta(&name)).unwrap().expect("rpc_meta");
    let rpc = RpcMeta::from_json(&rpc).unwrap();
    assert_eq!((rpc.ip_or_host_name.as_str(), rpc.rpc_port), ("127.0.0.1", a.rpc_port()));

    // A clean shutdown removes a's entries at once.
    drop(a);
    assert_eq!(service.get(&keys.descriptor(&name)).unwrap(), None);
    assert_eq!(service.get(&keys.rpc_meta(&name)).unwrap(), None);
    let c = engine(&url, &cluster, Duration::from_secs(10));
    let err = c.open_segment(&name).unwrap_err();
    assert!(matches!(err, EngineError::SegmentNotFound { .. }), "{err}");
}

per_service!(a_segment_opened_before_its_owner_registered_follows_it);
/// A decode node opens a prefill node's segment while that node is still registering: the
/// registration is published as it happens, and a request for the new memory that arrives
/// before it reads the descriptor again until the memory is listed.
fn a_segment_opened_before_its_owner_registered_follows_it(kind: Kind, test: &str) {
    let Some(OnService { _http, url, cluster, keys, service }) = on_service(kind, test, "follow") else {
        return;
    };
    let owner = engine(&url, &cluster, Duration::from_secs(10));
    let initiator = engine(&url, &cluster, Duration::from_secs(10));
    let name = owner.segment_name().to_string();
    let seg = initiator.open_segment(&name).unwrap();
    assert!(initiator.segment_descriptor(seg).unwrap().buffers.is_empty(), "nothing registered yet");

    // The memory's address is known before it is registered (as a master hands it out); the
    // owner registers it a moment after the initiator's read has started.
    let mem = Arc::new(SharedMemory::allocate(1 << 20, "late").unwrap());
    // SAFETY: nothing transfers this memory yet.
    pattern::fill(unsafe { std::slice::from_raw_parts_mut(mem.addr() as *mut u8, 1 << 20) }, 13, 0);
    let local = initiator.alloc_registered(1 << 20, "cpu:0").unwrap();
    let (go, told) = std::sync::mpsc::channel::<()>();
    let registrar = {
        let (owner, mem) = (owner.clone(), mem.clone());
        std::thread::spawn(move || {
            told.recv().unwrap();
            std::thread::sleep(Duration::from_millis(200));
            owner.register(mem.addr(), mem.len(), "cpu:0").unwrap();
        })
    };
    go.send(()).unwrap();
    read_and_check(&initiator, seg, &local, mem.addr(), 1 << 20, 13).expect("the read waits for the registration");
    registrar.join().unwrap();

    // Each registration is in the service by the time register returns.
    let published = fetch_descriptor(service.as_ref(), &keys, &name).unwrap();
    assert!(published.buffers.iter().any(|b| b.addr == mem.addr() && b.length == 1 << 20), "{published:?}");
    let second = filled(&owner, 1 << 20, 17);
    let published = fetch_descriptor(service.as_ref(), &keys, &name).unwrap();
    assert!(published.buffers.iter().any(|b| b.addr == second.addr()), "{published:?}");
    read_and_check(&initiator, seg, &local, second.addr(), 1 << 20, 17).unwrap();
}

per_service!(clusters_sharing_a_service_are_isolated);
fn clusters_sharing_a_service_are_isolated(kind: Kind, test: &str) {
    let mut http = None;
    let Some(url) = shared_service(kind, test, &mut http) else {
        return;
    };
    let (x, y) = (unique_cluster("x"), unique_cluster("y"));
    let a = engine(&url, &x, Duration::from_secs(10));
    let _mem = filled(&a, 1 << 20, 3);
    let stranger = engine(&url, &y, Duration::from_secs(10));
    let err = stranger.open_segment(a.segment_name()).unwrap_err();
    match &err {
        EngineError::SegmentNotFound { key, .. } => {
            assert!(key.starts_with(&format!("mooncake/{y}/ram/")), "{key}")
        }
        other => panic!("another cluster's segment is not found: {other}"),
    }
    let friend = engine(&url, &x, Duration::from_secs(10));
    reads_back(&friend, &a, &_mem, 3);
}

per_service!(a_crashed_owner_ages_out_and_a_live_one_stays);
fn a_crashed_owner_ages_out_and_a_live_one_stays(kind: Kind, test: &str) {
    let mut http = None;
    let mut _server_process = None;
    let url = if kind == Kind::Http {
        // The project's server binary, as users run it.
        let (child, url) = spawn_metadata_server();
        _server_process = Some(child);
        url
    } else {
        match shared_service(kind, test, &mut http) {
            Some(url) => url,
            None => return,
        }
    };
    let cluster = unique_cluster("crash");
    let keys = Keys::new(Some(&cluster));
    let service = store(&url);
    // A TTL of 6 s, renewed every 2 s: a renewal up to 4 s late (a loaded host) still comes
    // in time.
    let envs = [("MC_METADATA_TTL", "6"), ("MC_METADATA_CLUSTER_ID", cluster.as_str())];
    let (mut target, name) = spawn_tebench_target_env(
        &[],
        &["--buffer-size", "16M", "--pattern", "--local-hostname", "127.0.0.1", "--metadata-server", &url],
        &envs,
    );
    // tebench finds the target through the service and moves verified bytes.
    let out = Command::new(workspace_bin("tebench"))
        .args(["initiator", "--segment", &name, "--metadata-server", &url])
        .args(["--local-hostname", "127.0.0.1", "--block-size", "64K"])
        .args(["--batch-size", "8", "--duration", "0.5", "--verify", "--json"])
        .envs(envs)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "tebench initiator through {url}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // Renewed while the owner lives: still there after more than twice the TTL.
    std::thread::sleep(Duration::from_secs(13));
    assert!(service.get(&keys.descriptor(&name)).unwrap().is_some());

    // SIGKILL: no clean shutdown; the entries age out on their own.
    target.kill_now();
    let killed = Instant::now();
    assert!(
        eventually(Duration::from_secs(30), || {
            service.get(&keys.descriptor(&name)).unwrap().is_none()
                && service.get(&keys.rpc_meta(&name)).unwrap().is_none()
        }),
        "the crashed owner's entries expired ({:?} after the kill)",
        killed.elapsed()
    );
    let reader = engine(&url, &cluster, Duration::from_secs(10));
    assert!(matches!(reader.open_segment(&name), Err(EngineError::SegmentNotFound { .. })));
}

per_service!(a_malformed_descriptor_is_an_error);
fn a_malformed_descriptor_is_an_error(kind: Kind, test: &str) {
    let Some(OnService { _http, url, cluster, keys, service }) = on_service(kind, test, "bad") else {
        return;
    };
    let reader = engine(&url, &cluster, Duration::from_secs(10));
    let cases: [(&str, &[u8]); 5] = [
        ("garbage.invalid:1", b"{not json"),
        ("empty.invalid:1", b""),
        (
            "other.invalid:1",
            br#"{"name":"someone-else:1","endpoints":[],"buffers":[]}"#,
        ),
        (
            "overlap.invalid:1",
            br#"{"name":"overlap.invalid:1","endpoints":[],"buffers":[{"addr":4096,"length":8192},{"addr":8192,"length":10}]}"#,
        ),
        (
            "wrap.invalid:1",
            br#"{"name":"wrap.invalid:1","endpoints":[],"buffers":[{"addr":18446744073709551615,"length":2}]}"#,
        ),
    ];
    for (name, value) in cases {
        service.put(&keys.descriptor(name), value, None).unwrap();
        let err = reader.open_segment(name).unwrap_err();
        match &err {
            EngineError::BadMetadata { key, .. } => assert_eq!(key, &keys.descriptor(name)),
            other => panic!("{name}: expected BadMetadata, got {other}"),
        }
        assert!(!err.is_caller_error());
        service.delete(&keys.descriptor(name)).unwrap();
    }
    // The engine goes on working.
    let owner = engine(&url, &cluster, Duration::from_secs(10));
    let mem = filled(&owner, 1 << 20, 5);
    reads_back(&reader, &owner, &mem, 5);
}

/// A service that can be stopped and started again, empty, on the same address.
enum Restartable {
    Process(PrivateService),
    InProcess(Option<MetadataServer>, std::net::SocketAddr),
}

impl Restartable {
    fn stop(&mut self) {
        match self {
            Restartable::Process(p) => p.stop(),
            Restartable::InProcess(s, _) => drop(s.take()),
        }
    }
    fn restart(&mut self) {
        match self {
            Restartable::Process(p) => p.restart(),
            Restartable::InProcess(s, addr) => {
                drop(s.take());
                *s = Some(MetadataServer::start(*addr, "/metadata").unwrap());
            }
        }
    }
}

per_service!(a_service_restart_mid_run);
fn a_service_restart_mid_run(kind: Kind, test: &str) {
    let (mut service, url) = match kind {
        Kind::Http => {
            let s = MetadataServer::start("127.0.0.1:0".parse().unwrap(), "/metadata").unwrap();
            let (addr, url) = (s.local_addr(), s.url());
            (Restartable::InProcess(Some(s), addr), url)
        }
        Kind::Redis => {
            // Credentials and a database number in the URL, as users write them.
            let args = ["--user", "default", "off", "--user", "crescent", "on", ">s3cret", "~*", "&*", "+@all"];
            match PrivateService::start(kind, &args) {
                Ok(p) => {
                    let url = p.url("crescent:s3cret@", "/3");
                    (Restartable::Process(p), url)
                }
                Err(why) => return crescent_tests::skip(&format!("{test}: {why}")),
            }
        }
        Kind::Etcd => match PrivateService::start(kind, &[]) {
            Ok(p) => {
                let url = p.url("", "");
                (Restartable::Process(p), url)
            }
            Err(why) => return crescent_tests::skip(&format!("{test}: {why}")),
        },
    };
    let cluster = unique_cluster("restart");
    let keys = Keys::new(Some(&cluster));
    let ttl = Duration::from_secs(3);
    let a = engine(&url, &cluster, ttl);
    let b = engine(&url, &cluster, ttl);
    let first = filled(&a, 1 << 20, 21);
    let seg = b.open_segment(a.segment_name()).unwrap();
    let local = b.alloc_registered(1 << 20, "cpu:0").unwrap();
    read_and_check(&b, seg, &local, first.addr(), 1 << 20, 21).unwrap();

    service.stop();
    // Engines that know each other go on moving bytes.
    read_and_check(&b, seg, &local, first.addr(), 1 << 20, 21).unwrap();
    // New memory cannot be published now, but registering it works.
    let second = filled(&a, 1 << 20, 22);
    // Opening an unknown segment fails with the service's address, password hidden.
    let err = b.open_segment("nobody.invalid:1").unwrap_err();
    assert!(matches!(err, EngineError::MetadataUnavailable { .. }), "{err}");
    let shown = err.to_string();
    assert!(!shown.contains("s3cret"), "{shown}");
    assert!(shown.contains(url.rsplit('@').next().unwrap().trim_start_matches("etcd://")), "{shown}");

    // The service comes back empty: a re-publishes everything, new memory included.
    service.restart();
    let fresh = store(&url);
    assert!(
        eventually(Duration::from_secs(15), || {
            fresh
                .get(&keys.descriptor(a.segment_name()))
                .ok()
                .flatten()
                .is_some_and(|d| String::from_utf8_lossy(&d).contains(&format!("\"addr\":{}", second.addr())))
        }),
        "a re-published its descriptor after the restart"
    );
    // b reaches the new memory: its stale descriptor is refreshed from the service.
    assert!(
        eventually(Duration::from_secs(10), || read_and_check(&b, seg, &local, second.addr(), 1 << 20, 22).is_ok()),
        "b reads memory a registered while the service was down"
    );
    let c = engine(&url, &cluster, ttl);
    c.open_segment(a.segment_name()).unwrap();
}

#[test]
fn an_unreachable_service_at_start_is_a_clear_error() {
    let port = free_port();
    for url in [
        format!("etcd://127.0.0.1:{port}"),
        format!("redis://user:hidden@127.0.0.1:{port}/1"),
        format!("http://127.0.0.1:{port}/metadata"),
    ] {
        let err = TransferEngine::new(EngineConfig {
            local_hostname: Some("127.0.0.1".into()),
            metadata_server: url.clone(),
            ..EngineConfig::default()
        })
        .unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, EngineError::MetadataUnavailable { .. }), "{url}: {text}");
        assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
        assert!(!text.contains("hidden"), "{text}");
    }
    let err =
        TransferEngine::new(EngineConfig { metadata_server: "zookeeper://h:1".into(), ..EngineConfig::default() })
            .unwrap_err();
    assert!(err.is_caller_error(), "{err}");
}

/// Starts `crescent-metadata-server` on a free port and returns it with its URL.
fn spawn_metadata_server() -> (ChildGuard, String) {
    use std::io::{BufRead, BufReader};
    let mut child = ChildGuard(
        Command::new(workspace_bin("crescent-metadata-server"))
            .args(["--host", "127.0.0.1", "--port", "0"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut line = String::new();
    BufReader::new(child.0.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let url = line
        .trim()
        .strip_prefix("metadata server: ")
        .unwrap_or_else(|| panic!("server printed its URL: {line:?}"))
        .to_string();
    (child, url)
}

#[test]
fn an_etcd_list_with_a_dead_member_still_serves() {
    let mut none = None;
    let Some(url) = shared_service(Kind::Etcd, "an_etcd_list_with_a_dead_member_still_serves", &mut none) else {
        return;
    };
    let live = url.trim_start_matches("etcd://");
    let url = format!("etcd://127.0.0.1:{},{live}", free_port());
    let cluster = unique_cluster("list");
    let a = engine(&url, &cluster, Duration::from_secs(10));
    let mem = filled(&a, 1 << 20, 13);
    let b = engine(&url, &cluster, Duration::from_secs(10));
    let seg = b.open_segment(a.segment_name()).unwrap();
    let local = b.alloc_registered(1 << 20, "cpu:0").unwrap();
    read_and_check(&b, seg, &local, mem.addr(), 1 << 20, 13).unwrap();
}
