//! Issue 26, the master: with a cluster secret, the master's gRPC port serves only calls that
//! carry the secret's token, its admin port only requests with the admin token (but
//! `/health`, and the read-only routes with `admin_open_reads`), and a client's disk service
//! only readers that prove the secret. The real client library with a wrong secret, or none,
//! cannot mount, put, get, list or remove; one with the secret can.

use std::io::{Read, Write};
use std::time::Duration;

use crescent_store::master::access;
use crescent_store::proto::master_client::MasterClient;
use crescent_store::proto::{BatchKeyRequest, KeyRequest, RemoveAllRequest, Tier};
use crescent_store::{ClientConfig, MasterConfig, StoreApi, StoreClient};
use crescent_tests::store::{loopback_client_config, loopback_master, pattern_bytes};
use crescent_transports::net::Keyring;

const SECRET: &str = "5b0e6c1f2a3d4e5f60718293a4b5c6d7";
const WRONG: &str = "ffffffffffffffffffffffffffffffff";

fn keyring(s: &str) -> Keyring {
    Keyring::new(&[s]).unwrap()
}

/// One HTTP request to the admin port with an optional bearer token: (status, body).
fn admin(addr: std::net::SocketAddr, path: &str, token: Option<&str>) -> (u16, String) {
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    let (status, _, body) = crescent_tests::http(addr, "GET", path, &auth, "");
    (status, body)
}

fn client(
    m: &crescent_store::master::server::MasterHandle,
    secret: Option<&str>,
) -> crescent_store::Result<std::sync::Arc<StoreClient>> {
    StoreClient::connect(ClientConfig {
        global_segment_size: 16 << 20,
        local_buffer_size: 16 << 20,
        cluster_secret: secret.map(keyring),
        ..loopback_client_config(m)
    })
}

#[test]
fn without_the_secret_the_master_and_its_admin_port_serve_nothing() {
    let m = loopback_master(MasterConfig { cluster_secret: Some(keyring(SECRET)), ..Default::default() });
    let owner = client(&m, Some(SECRET)).expect("a client with the secret mounts");
    owner.put("k", &pattern_bytes(1 << 20, 7)).unwrap();
    assert_eq!(owner.get("k").unwrap(), pattern_bytes(1 << 20, 7));

    // The real library with a wrong secret, or none, does not even mount.
    for secret in [Some(WRONG), None] {
        let err = client(&m, secret).expect_err("a client without the secret is refused");
        assert!(
            err.to_string().to_lowercase().contains("token") || err.to_string().contains("nauthenticated"),
            "{err}"
        );
    }

    // Raw gRPC: no token, a wrong secret's token, a forged tenant.
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let channel = rt
        .block_on(tonic::transport::Endpoint::from_shared(format!("http://{}", m.client_address())).unwrap().connect())
        .unwrap();
    let forged = access::client_token(&keyring(SECRET), "default").replacen("default", "other", 1);
    for token in [None, Some(access::client_token(&keyring(WRONG), "default")), Some(forged)] {
        let header = token.map(|t| format!("Bearer {t}").parse::<tonic::metadata::MetadataValue<_>>().unwrap());
        #[allow(clippy::result_large_err)] // tonic's Status
        let mut c = MasterClient::with_interceptor(channel.clone(), move |mut r: tonic::Request<()>| {
            if let Some(h) = &header {
                r.metadata_mut().insert("authorization", h.clone());
            }
            Ok(r)
        });
        let keys = BatchKeyRequest { client_id: "x".into(), keys: vec!["k".into()], ..Default::default() };
        let e = rt.block_on(c.batch_exists(keys)).unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
        let get = KeyRequest { client_id: "x".into(), key: "k".into(), ..Default::default() };
        assert_eq!(rt.block_on(c.get_replica_list(get)).unwrap_err().code(), tonic::Code::Unauthenticated);
        let all = RemoveAllRequest { client_id: "x".into(), ..Default::default() };
        assert_eq!(rt.block_on(c.remove_all(all)).unwrap_err().code(), tonic::Code::Unauthenticated);
    }
    assert_eq!(owner.get("k").unwrap(), pattern_bytes(1 << 20, 7), "nothing was removed");

    // The admin port: only /health without the admin token.
    let addr = m.admin_addr.unwrap();
    let admin_token = access::admin_token(&keyring(SECRET));
    assert_eq!(admin(addr, "/health", None).0, 200);
    for path in ["/query_key?key=k", "/get_all_keys", "/get_all_segments", "/keys", "/segments", "/metrics", "/nodes"] {
        assert_eq!(admin(addr, path, None).0, 401, "{path} without a token");
        let client_token = access::client_token(&keyring(SECRET), "default");
        assert_eq!(admin(addr, path, Some(&client_token)).0, 401, "{path} with a client's token");
        assert_eq!(admin(addr, path, Some(&access::admin_token(&keyring(WRONG)))).0, 401, "{path}, wrong secret");
    }
    let (status, body) = admin(addr, "/query_key?key=k", Some(&admin_token));
    assert_eq!(status, 200, "{body}");
    let (_, metrics) = admin(addr, "/metrics", Some(&admin_token));
    let refused = |port: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(&format!("crescent_master_auth_refused_total{{port=\"{port}\"}}")))
            .and_then(|l| l.split_whitespace().last())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    assert!(refused("grpc") >= 9 && refused("admin") >= 21, "refusals are counted:\n{metrics}");
    assert!(owner.render_metrics().contains("crescent_client_auth_required 1"));
    drop(owner);

    // `admin_open_reads` leaves the read-only routes open.
    let open = loopback_master(MasterConfig {
        cluster_secret: Some(keyring(SECRET)),
        admin_open_reads: true,
        ..Default::default()
    });
    assert_eq!(admin(open.admin_addr.unwrap(), "/get_all_keys", None).0, 200);
}

#[test]
fn a_client_without_the_secret_is_refused_at_its_first_call_with_a_typed_error() {
    let m = loopback_master(MasterConfig { cluster_secret: Some(keyring(SECRET)), ..Default::default() });
    let refused = || m.master.metrics().auth_refused.with_label_values(&["grpc"]).get();
    for (i, secret) in [Some(WRONG), None].into_iter().enumerate() {
        let err = client(&m, secret).expect_err("a client without the secret is refused");
        // Not `MasterUnreachable`, which the mount retries for its whole first-mount wait.
        assert!(matches!(err, crescent_store::StoreError::Unauthenticated { .. }), "{err:?}");
        assert!(err.is_caller_error() && !err.is_retryable(), "{err}");
        assert!(err.to_string().contains("CRESCENT_CLUSTER_SECRET"), "the error says what to set: {err}");
        assert_eq!(refused(), i as u64 + 1, "one refused call per client, no retries");
    }
}

#[test]
fn a_disk_service_serves_files_only_to_readers_with_the_secret() {
    let m = loopback_master(MasterConfig { cluster_secret: Some(keyring(SECRET)), ..Default::default() });
    let root = tempfile::tempdir().unwrap();
    let owner = StoreClient::connect(ClientConfig {
        global_segment_size: 16 << 20,
        local_buffer_size: 16 << 20,
        storage_root_dir: Some(root.path().to_path_buf()),
        cluster_secret: Some(keyring(SECRET)),
        ..loopback_client_config(&m)
    })
    .unwrap();
    owner.put("on-disk", &pattern_bytes(256 << 10, 3)).unwrap();
    assert!(owner.flush_offload(Duration::from_secs(30)), "the value reached the disk");
    let q = owner.query("on-disk").unwrap();
    let disk = q.replicas.iter().find(|r| r.tier == Tier::Ssd as i32).expect("a disk replica");
    assert!(!disk.disk_service.is_empty());
    // A raw reader: an Open request for the file, as the disk service's format has it.
    let key = b"on-disk";
    let mut open = vec![b'C', b'D', 1, 1];
    open.extend_from_slice(&((16 + key.len()) as u32).to_le_bytes());
    open.extend_from_slice(&q.version.to_le_bytes());
    open.extend_from_slice(&(256u64 << 10).to_le_bytes());
    open.extend_from_slice(key);
    let mut raw = std::net::TcpStream::connect(disk.disk_service.as_str()).unwrap();
    let _ = raw.write_all(&open);
    raw.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut got = Vec::new();
    let _ = raw.read_to_end(&mut got);
    assert_eq!(got, b"", "the disk service answered a reader without the secret");
    // The library's reader with a wrong secret.
    let wrong = crescent_transports::net::Auth::new(Some(keyring(WRONG)));
    let err = crescent_store::client::disk::service::DiskReader::open(
        &disk.disk_service,
        &wrong,
        "on-disk",
        q.version,
        256 << 10,
    )
    .err()
    .expect("a reader with a wrong secret is refused");
    assert!(err.to_string().contains("secret"), "{err}");
    // With the secret, it opens.
    let right = crescent_transports::net::Auth::new(Some(keyring(SECRET)));
    crescent_store::client::disk::service::DiskReader::open(
        &disk.disk_service,
        &right,
        "on-disk",
        q.version,
        256 << 10,
    )
    .expect("a reader with the secret opens the file");
    // The service counts a refusal once its side of the exchange has ended, which can be
    // after the refused reader has seen it end (a reader with a wrong secret stops at the
    // service's proof and hangs up first): wait for the count, boundedly.
    let refused = "crescent_client_auth_refused_total{service=\"disk\"} 2";
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !owner.render_metrics().contains(refused) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(owner.render_metrics().contains(refused), "{}", owner.render_metrics());
}
