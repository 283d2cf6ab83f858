//! `mooncake_master` as operators run it: upstream's flags, admin routes and metric names on
//! a master process, the flags it refuses, and the bounds on what a peer can make it hold.

use std::process::{Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::Duration;

use crescent_store::master::service::{MAX_BATCH_KEYS, MAX_REQUEST_MESSAGE};
use crescent_store::master::MAX_KEY_LEN;
use crescent_store::proto::master_client::MasterClient;
use crescent_store::proto::{BatchKeyRequest, PutStartRequest};
use crescent_store::{ClientConfig, StoreApi, StoreClient};
use crescent_tests::dashboards::{dashboard_exprs, exports, promql_names, repo_file};
use crescent_tests::{lines_of, workspace_bin, ChildGuard};

/// A master process and what it printed: its gRPC, admin and metadata addresses, its stderr.
struct MasterProc {
    child: ChildGuard,
    rpc: String,
    admin: String,
    metadata: Option<String>,
    stderr: Receiver<String>,
}

/// Starts `bin` (`mooncake_master` or `crescent-master`) with `args`; waits for its addresses.
fn spawn(bin: &str, args: &[&str]) -> MasterProc {
    let mut child = ChildGuard(
        Command::new(workspace_bin(bin))
            .args(args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the master"),
    );
    let stdout = lines_of(child.0.stdout.take().expect("stdout"));
    let stderr = lines_of(child.0.stderr.take().expect("stderr"));
    let (mut rpc, mut admin, mut metadata) = (None, None, None);
    let wants_metadata = args.iter().any(|a| a.starts_with("--enable_http_metadata_server"));
    while rpc.is_none() || admin.is_none() || (wants_metadata && metadata.is_none()) {
        let line = stdout.recv_timeout(Duration::from_secs(60)).expect("the master printed its addresses");
        if let Some(a) = line.strip_prefix("master: ") {
            rpc = Some(a.trim().to_string());
        } else if let Some(a) = line.strip_prefix("admin: http://") {
            admin = Some(a.trim().trim_end_matches("/metrics").to_string());
        } else if let Some(a) = line.strip_prefix("metadata server: ") {
            metadata = Some(a.trim().to_string());
        }
    }
    MasterProc { child, rpc: rpc.unwrap(), admin: admin.unwrap(), metadata, stderr }
}

/// One HTTP/1.1 request; returns the status and the body.
fn http(addr: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let (status, head, body) = crescent_tests::http(addr, method, path, "", body);
    // The admin port answers with a length; the metadata server may answer chunked.
    let body = if head.to_ascii_lowercase().contains("transfer-encoding: chunked") { dechunk(&body) } else { body };
    (status, body)
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        body = &rest[n + 2..];
    }
    out
}

#[test]
fn mooncake_master_with_upstreams_flags_serves_upstreams_routes_and_metric_names() {
    let mut m = spawn(
        "mooncake_master",
        &[
            "--rpc_address=127.0.0.1",
            "--port=0",
            "--metrics_host=127.0.0.1",
            "--metrics_port=0",
            "--enable_http_metadata_server=true",
            "--http_metadata_server_host=127.0.0.1",
            "--http_metadata_server_port=0",
            "--default_kv_lease_ttl=2s",
            "-client_ttl=5",
            "--eviction_high_watermark_ratio=0.9",
            "--eviction_ratio",
            "0.1",
            "--enable_snapshot",
            "--kv_events_queue_capacity=1024",
        ],
    );
    // A client puts and gets through it; a get of a missing key fails (so errors are counted).
    let client = StoreClient::connect(ClientConfig {
        master_server_address: m.rpc.clone(),
        local_hostname: Some("127.0.0.1".into()),
        global_segment_size: 16 << 20,
        local_buffer_size: 4 << 20,
        ..ClientConfig::default()
    })
    .expect("a client connects to mooncake_master");
    let value = crescent_tests::store::pattern_bytes(300_000, 7);
    client.put("compat/1", &value).unwrap();
    assert_eq!(client.get("compat/1").unwrap(), value);
    assert!(client.get("compat/missing").is_err());
    let keys: Vec<String> = (0..4).map(|i| format!("compat/b{i}")).collect();
    let values: Vec<&[u8]> = keys.iter().map(|_| &value[..1000]).collect();
    assert!(client.put_batch(&keys, &values).unwrap().iter().all(|r| r.is_ok()));

    // The flags took effect: the lease is 2 s (upstream's duration syntax).
    let (code, q) = http(&m.admin, "GET", "/query_key?key=compat/1", "");
    let q: serde_json::Value = serde_json::from_str(&q).unwrap();
    assert_eq!((code, q["success"].as_bool()), (200, Some(true)), "{q}");
    assert!(q["lease_remaining_ms"].as_u64().unwrap() <= 2000, "{q}");
    assert_eq!(q["data"][0]["transport_endpoint_"].as_str(), Some(client.segment_name()), "{q}");

    // SGLang's check_server(): the segments, one per line.
    let (code, segments) = http(&m.admin, "GET", "/get_all_segments", "");
    assert_eq!((code, segments), (200, format!("{}\n", client.segment_name())));
    let (code, keys_text) = http(&m.admin, "GET", "/get_all_keys", "");
    let mut listed: Vec<&str> = keys_text.lines().collect();
    listed.sort();
    assert_eq!((code, listed), (200, vec!["compat/1", "compat/b0", "compat/b1", "compat/b2", "compat/b3"]));
    let (code, health) = http(&m.admin, "GET", "/health", "");
    let health: serde_json::Value = serde_json::from_str(&health).unwrap();
    assert_eq!((code, health["status"].as_str(), health["role"].as_str()), (200, Some("ok"), Some("leader")));

    // The embedded metadata server answers as Mooncake's does.
    let url = m.metadata.clone().expect("a metadata server");
    let addr = url.trim_start_matches("http://").split('/').next().unwrap().to_string();
    assert_eq!(http(&addr, "PUT", "/metadata?key=k1", "v1").0, 200);
    assert_eq!(http(&addr, "GET", "/metadata?key=k1", ""), (200, "v1".to_string()));
    assert_eq!(http(&addr, "GET", "/metadata?key=absent", "").0, 404);

    // Every series upstream's dashboard queries is exported, and every one Crescent's queries.
    let (code, metrics) = http(&m.admin, "GET", "/metrics", "");
    assert_eq!(code, 200);
    let upstream: Vec<String> = repo_file("tests/fixtures/mooncake-dashboard-series.txt")
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.trim().to_string())
        .collect();
    assert!(upstream.len() > 100, "the fixture lists upstream's series");
    let missing: Vec<&String> = upstream.iter().filter(|n| !exports(&metrics, n)).collect();
    assert!(missing.is_empty(), "series of Mooncake's dashboard not exported: {missing:?}");
    let ours: serde_json::Value = serde_json::from_str(&repo_file("monitoring/grafana/crescent-master.json")).unwrap();
    let mut exprs = Vec::new();
    dashboard_exprs(&ours, &mut exprs);
    let names: Vec<String> = exprs.iter().flat_map(|e| promql_names(e)).collect();
    assert!(names.len() > 20, "{names:?}");
    let missing: Vec<&String> = names.iter().filter(|n| !exports(&metrics, n)).collect();
    assert!(missing.is_empty(), "series of Crescent's dashboard not exported: {missing:?}");

    // Values: the same operations under both names.
    let value_of = |name: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
            .unwrap_or_else(|| panic!("{name}"))
    };
    assert_eq!(value_of("master_key_count"), 5.0);
    assert_eq!(value_of("master_batch_put_start_requests_total"), 1.0);
    assert_eq!(value_of("master_batch_put_start_items_total"), 4.0);
    assert_eq!(value_of("master_mount_segment_requests_total"), 1.0);
    assert!(value_of("master_get_replica_list_failures_total") >= 1.0);

    // One warning names the upstream flags Crescent does not implement, and only them.
    drop(client);
    m.child.kill_now();
    let stderr: Vec<String> = m.stderr.try_iter().collect();
    let warned: Vec<&String> = stderr.iter().filter(|l| l.contains("does not implement")).collect();
    assert_eq!(warned.len(), 1, "{stderr:#?}");
    assert!(warned[0].contains("--enable_snapshot") && warned[0].contains("--kv_events_queue_capacity"), "{warned:?}");
    assert!(!warned[0].contains("eviction_ratio"), "an honoured flag is not named: {warned:?}");
}

#[test]
fn crescent_master_keeps_its_own_flags() {
    let m = spawn("crescent-master", &["--rpc-address", "127.0.0.1:0", "--admin-address", "127.0.0.1:0"]);
    let (code, health) = http(&m.admin, "GET", "/health", "");
    assert_eq!(code, 200, "{health}");
    assert!(m.rpc.starts_with("127.0.0.1:"));
}

#[test]
fn bad_flags_end_the_master_with_a_clear_error_and_exit_code_2() {
    for (args, named) in [
        (&["--no_such_flag=1"][..], "no_such_flag"),
        (&["--default_kv_lease_ttl=5d"][..], "5d"),
        (&["--eviction_high_watermark_ratio=2"][..], "eviction_high_watermark"),
        // HA runs on etcd (tests/master_ha.rs); upstream's other backends are refused.
        (&["--enable_ha", "--ha_backend_type=redis", "--ha_backend_connstring=127.0.0.1:6379"][..], "not supported"),
        (&["--enable_ha=true"][..], "ha_backend_connstring"),
        (&["--memory_allocator=jemalloc"][..], "jemalloc"),
    ] {
        let out = Command::new(workspace_bin("mooncake_master"))
            .args(args)
            .args(["--port=0", "--metrics_port=0"])
            .stdin(Stdio::null())
            .output()
            .expect("run mooncake_master");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(named), "{args:?}: {stderr}");
        assert!(!String::from_utf8_lossy(&out.stdout).contains("master: "), "{args:?} did not start a master");
    }
}

/// The master process's peak resident memory (VmHWM), in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM");
    kb << 10
}

fn grpc(addr: &str) -> (tokio::runtime::Runtime, MasterClient<tonic::transport::Channel>) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let channel = rt
        .block_on(tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap().connect())
        .expect("connect to the master");
    // As a hostile or buggy peer: no cap on what it sends.
    let client = MasterClient::new(channel).max_encoding_message_size(usize::MAX).max_decoding_message_size(usize::MAX);
    (rt, client)
}

#[test]
fn an_oversized_grpc_message_is_refused_before_the_master_holds_it() {
    let m = spawn("crescent-master", &["--rpc-address", "127.0.0.1:0", "--admin-address", "127.0.0.1:0"]);
    let pid = m.child.0.id();
    let (rt, client) = grpc(&m.rpc);
    // Warm the master up (its threads and first allocations) before measuring.
    let mut c = client.clone();
    rt.block_on(c.batch_exists(BatchKeyRequest {
        client_id: "w".into(),
        keys: vec!["warm".into()],
        ..Default::default()
    }))
    .unwrap();
    let before = peak_rss(pid);
    // 200 MiB in one message (a 200 MiB key): before the cap, the master buffered all of it.
    let huge =
        PutStartRequest { client_id: "x".into(), key: "k".repeat(200 << 20), size: 1, options: None, checksum: None };
    let answer = rt.block_on(c.put_start(huge));
    let grown = peak_rss(pid).saturating_sub(before);
    println!("master peak RSS {} MiB before, +{} MiB after a 200 MiB message", before >> 20, grown >> 20);
    let refused = answer.expect_err("a 200 MiB message is refused");
    assert_eq!(refused.code(), tonic::Code::OutOfRange, "{refused:?}");
    assert!(refused.message().contains("too large"), "{refused:?}");
    assert!(grown < 32 << 20, "the master's peak RSS grew by {} MiB for a refused message", grown >> 20);

    // The master still serves, and the largest legitimate batch passes: 10 001 keys of the
    // longest length (41 MB in one message).
    let keys: Vec<String> = (0..10_001).map(|i| format!("{i:05}{}", "k".repeat(MAX_KEY_LEN - 5))).collect();
    let request = BatchKeyRequest { client_id: "x".into(), keys, ..Default::default() };
    assert!(prost::Message::encoded_len(&request) < MAX_REQUEST_MESSAGE);
    let reply = rt.block_on(c.batch_exists(request)).expect("a 10 001-key batch of 4 KiB keys passes").into_inner();
    assert_eq!(reply.exists.len(), 10_001);
    assert!(reply.exists.iter().all(|e| !e));
    // A batch of more keys than the limit is refused whole, as the caller's mistake.
    let keys: Vec<String> = (0..=MAX_BATCH_KEYS).map(|i| format!("k{i}")).collect();
    let refused =
        rt.block_on(c.batch_exists(BatchKeyRequest { client_id: "x".into(), keys, ..Default::default() })).unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains(&MAX_BATCH_KEYS.to_string()), "{refused:?}");
}
