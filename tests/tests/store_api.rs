//! The store client's API in one process against an in-process master on loopback:
//! zero-copy calls, batches, errors, and bad input straight to the master's gRPC service.

use std::sync::Arc;

use crescent_store::client::{Extent, HeldBuffer, Piece};
use crescent_store::master::server::MasterHandle;
use crescent_store::proto::master_client::MasterClient;
use crescent_store::proto::{
    BatchPutStartRequest, Checksum, Code, KeyRequest, MountSegmentRequest, PutOptions, PutStartRequest, SegmentInfo,
    UnmountSegmentRequest,
};
use crescent_store::{ClientConfig, MasterConfig, StoreApi, StoreClient, StoreError};
use crescent_tests::store::loopback_client;

fn master() -> MasterHandle {
    crescent_tests::store::loopback_master(MasterConfig::default())
}

fn client(m: &MasterHandle) -> Arc<StoreClient> {
    loopback_client(m, 32 << 20)
}

fn data(len: usize, seed: u64) -> Vec<u8> {
    crescent_tests::store::pattern_bytes(len, seed)
}

#[test]
fn concurrent_byte_gets_share_a_small_staging_buffer_without_deadlock() {
    let m = master();
    let (a, b) = (client(&m), client(&m));
    let values: Vec<Vec<u8>> = (0..3).map(|i| data((5 << 20) + i * 4097, 10 + i as u64)).collect();
    for (i, v) in values.iter().enumerate() {
        a.put(&format!("v{i}"), v).unwrap();
    }
    // Six readers, each wanting two of the four 1 MiB pieces of b's 4 MiB staging buffer at
    // once: a reader takes its second piece only when one is free, so all finish.
    let values = Arc::new(values);
    let readers: Vec<_> = (0..6)
        .map(|t| {
            let (b, values) = (b.clone(), values.clone());
            std::thread::spawn(move || {
                for round in 0..4 {
                    let i = (t + round) % values.len();
                    let got = b.get(&format!("v{i}")).unwrap();
                    assert!(got == values[i], "reader {t} got wrong bytes for v{i}");
                }
            })
        })
        .collect();
    for r in readers {
        r.join().expect("reader");
    }
}

#[test]
fn zero_copy_and_byte_calls_agree_across_two_clients() {
    let m = master();
    let (a, b) = (client(&m), client(&m));
    // Values larger than the 4 MiB staging buffer go through it in pieces.
    let big = data(9 << 20, 3);
    a.put("big", &big).unwrap();
    assert_eq!(b.get("big").unwrap(), big);

    // Zero copy: registered caller memory on both sides.
    let src = data(3 << 20, 4);
    let mut dst = vec![0u8; 4 << 20];
    a.register_buffer(src.as_ptr() as u64, src.len() as u64).unwrap();
    b.register_buffer(dst.as_mut_ptr() as u64, dst.len() as u64).unwrap();
    a.put_from("zc", src.as_ptr() as u64, src.len() as u64).unwrap();
    let n = b.get_into("zc", dst.as_mut_ptr() as u64, dst.len() as u64).unwrap();
    assert_eq!(n, src.len() as u64);
    assert_eq!(&dst[..n as usize], &src[..]);

    // Batches of zero-copy calls.
    let keys: Vec<String> = (0..4).map(|i| format!("zb{i}")).collect();
    let chunk = 512 << 10;
    let addrs: Vec<u64> = (0..4).map(|i| src.as_ptr() as u64 + i * chunk).collect();
    let sizes = vec![chunk; 4];
    assert!(a.batch_put_from(&keys, &addrs, &sizes).unwrap().iter().all(|r| r.is_ok()));
    let daddrs: Vec<u64> = (0..4).map(|i| dst.as_mut_ptr() as u64 + i * chunk).collect();
    dst.fill(0);
    let got = b.batch_get_into(&keys, &daddrs, &sizes).unwrap();
    assert!(got.iter().all(|r| matches!(r, Ok(n) if *n == chunk)), "{got:?}");
    assert_eq!(&dst[..4 * chunk as usize], &src[..4 * chunk as usize]);

    // Byte batches, with a missing key reported per key.
    let values = [data(1000, 5), data(70_000, 6)];
    let refs: Vec<&[u8]> = values.iter().map(|v| v.as_slice()).collect();
    let r = b.put_batch(&["p0".into(), "p1".into()], &refs).unwrap();
    assert!(r.iter().all(|x| x.is_ok()));
    let got = a.get_batch(&["p0".into(), "nope".into(), "p1".into()]).unwrap();
    assert_eq!(got[0].as_ref().unwrap(), &values[0]);
    assert!(matches!(got[1], Err(StoreError::NotFound(_))));
    assert_eq!(got[2].as_ref().unwrap(), &values[1]);
    assert_eq!(a.batch_exists(&["p0".into(), "nope".into()]).unwrap(), vec![true, false]);
    assert_eq!(a.get_size("p1").unwrap(), 70_000);
    b.unregister_buffer(dst.as_mut_ptr() as u64).unwrap();
    a.unregister_buffer(src.as_ptr() as u64).unwrap();
}

/// A holder with a 64 MiB segment, and a writer with a segment of `writer_segment` bytes and
/// a 4 MiB staging buffer (1 MiB pieces).
fn holder_and_writer(m: &MasterHandle, writer_segment: u64) -> (Arc<StoreClient>, Arc<StoreClient>) {
    let holder = StoreClient::connect(ClientConfig {
        global_segment_size: 64 << 20,
        ..crescent_tests::store::loopback_client_config(m)
    })
    .unwrap();
    let writer = loopback_client(m, writer_segment);
    (holder, writer)
}

#[test]
fn byte_puts_into_another_clients_memory_arrive_whole_whether_staged_ahead_or_not() {
    let m = master();
    // The writer's own segment takes only the small values (the master places local-first):
    // the others go to the holder, values under 1 MiB and values in parts through the writer's
    // staging buffer, larger ones from the caller's memory lent to the engine for the call.
    let (holder, writer) = holder_and_writer(&m, 256 << 10);
    let sizes = [300 << 10, (3 << 20) + 5, (9 << 20) + 123];
    let mut written = Vec::new();
    for round in 0..2u64 {
        // A put that stays in the writer's segment, then remote ones: the first of them has
        // nothing staged ahead, the next ones stage their first piece during put_start.
        let small = data(4096, 100 + round);
        writer.put(&format!("small{round}"), &small).unwrap();
        written.push((format!("small{round}"), small));
        for (i, len) in sizes.iter().enumerate() {
            let key = format!("r{round}/v{i}");
            let v = data(*len, round * 10 + i as u64);
            writer.put(&key, &v).unwrap();
            written.push((key, v));
            let key = format!("r{round}/p{i}");
            let v = data(*len, round * 10 + i as u64 + 5);
            let (a, b) = v.split_at(len / 3);
            writer.put_parts_with(&key, &[a, b], &writer.default_options()).unwrap();
            written.push((key, v));
        }
    }
    for (key, v) in &written {
        assert!(holder.get(key).unwrap() == *v, "{key} read back from the holder");
        assert!(writer.get(key).unwrap() == *v, "{key} read back by its writer");
    }
}

#[test]
fn large_byte_puts_and_byte_batches_need_no_room_in_the_staging_buffer() {
    // A value of 1 MiB or more, and every value of a batch, goes from the caller's memory
    // (lent to the engine for the call), so puts go on while the whole local buffer is held
    // (by a BufferPool lease, say).
    let m = master();
    // No segment of its own: every value goes to the holder, through the engine.
    let (holder, writer) = holder_and_writer(&m, 0);
    let held = writer.hold_local(4 << 20).unwrap().expect("the whole buffer is free");
    for (i, len) in [1 << 20, (9 << 20) + 77].into_iter().enumerate() {
        let v = data(len, 40 + i as u64);
        writer.put(&format!("big{i}"), &v).unwrap();
        assert!(holder.get(&format!("big{i}")).unwrap() == v, "big{i} read back whole");
    }
    let keys: Vec<String> = (0..3).map(|i| format!("batch{i}")).collect();
    let values: Vec<Vec<u8>> = [4096, 300 << 10, (5 << 20) + 3].iter().map(|&n| data(n, n as u64)).collect();
    let refs: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
    assert!(writer.put_batch(&keys, &refs).unwrap().iter().all(Result::is_ok));
    for (k, v) in keys.iter().zip(&values) {
        assert!(holder.get(k).unwrap() == *v, "{k} read back whole");
    }
    drop(held);
}

#[test]
fn byte_values_in_registered_memory_go_through_the_staging_buffer_and_arrive_whole() {
    // Bytes that lie in memory the caller registered cannot be lent to the engine as well:
    // those puts copy through the staging buffer (4 MiB, 1 MiB pieces), as every byte put
    // does where rdma needs registered memory.
    let m = master();
    let (holder, writer) = holder_and_writer(&m, 0);
    let mut buf = data((11 << 20) + 4096, 77);
    writer.register_buffer(buf.as_mut_ptr() as u64, buf.len() as u64).unwrap();
    let (one, rest) = buf.split_at((9 << 20) + 5);
    writer.put("staged", one).unwrap();
    let (a, b) = rest.split_at(rest.len() / 2);
    let keys = vec!["staged-a".to_string(), "staged-b".to_string()];
    assert!(writer.put_batch(&keys, &[a, b]).unwrap().iter().all(Result::is_ok));
    assert!(holder.get("staged").unwrap() == one);
    assert!(holder.get("staged-a").unwrap() == a && holder.get("staged-b").unwrap() == b);
    writer.unregister_buffer(buf.as_ptr() as u64).unwrap();
}

#[test]
fn caller_mistakes_and_missing_things_give_typed_errors() {
    let m = master();
    let a = client(&m);
    a.put("k", b"hello").unwrap();
    // A put of an existing key succeeds and leaves the value (Mooncake's puts).
    a.put("k", b"again").unwrap();
    assert_eq!(a.get("k").unwrap(), b"hello");
    assert!(matches!(a.put("empty", b""), Err(ref e) if e.is_caller_error()));
    assert!(matches!(a.get("missing"), Err(StoreError::NotFound(_))));
    assert!(matches!(a.get_size("missing"), Err(StoreError::NotFound(_))));
    let mut small = [0u8; 2];
    a.register_buffer(small.as_mut_ptr() as u64, 2).unwrap();
    let e = a.get_into("k", small.as_mut_ptr() as u64, 2).unwrap_err();
    assert!(matches!(e, StoreError::BufferTooSmall { need: 5, have: 2, .. }), "{e}");
    // Zero-copy from memory that was never registered is refused, not read.
    let heap = [1u8; 64];
    let e = a.put_from("unregistered", heap.as_ptr() as u64, 64).unwrap_err();
    assert!(e.is_caller_error(), "{e}");
    assert!(!a.exists("unregistered").unwrap(), "the failed put was revoked");
    // Huge key.
    let e = a.put(&"x".repeat(5000), b"v").unwrap_err();
    assert!(matches!(e, StoreError::InvalidArgument(_)), "{e}");
    assert!(matches!(a.remove_by_regex("("), Err(StoreError::InvalidArgument(_))));
    // The failed get_into still read the replica list, which leases "k": remove_all skips it.
    assert_eq!(a.remove_all().unwrap(), 0);
    a.remove_with("k", true).unwrap();
    assert!(!a.exists("k").unwrap());
}

#[test]
fn an_absent_master_is_a_clear_error_naming_its_address() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let e = StoreClient::connect(ClientConfig { master_server_address: closed.to_string(), ..ClientConfig::default() })
        .unwrap_err();
    assert!(matches!(e, StoreError::MasterUnreachable { ref addr, .. } if *addr == closed.to_string()), "{e}");
}

#[test]
fn bad_grpc_input_gets_error_codes_never_a_crash() {
    let m = master();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut c = MasterClient::connect(format!("http://{}", m.client_address())).await.unwrap();
        let code = |s: Option<crescent_store::proto::Status>| Code::try_from(s.unwrap().code).unwrap();
        // A key too long, a zero size, and a put with no segment mounted to take it.
        for (key, size, want, why) in [
            ("k".repeat(1 << 20), 10, Code::InvalidArgument, "key too long"),
            ("k".into(), 0, Code::InvalidArgument, "zero size"),
            ("k".into(), 10, Code::NoSpace, "no segment mounted"),
        ] {
            let r = c
                .put_start(PutStartRequest { client_id: "x".into(), key, size, options: None, checksum: None })
                .await
                .unwrap();
            assert_eq!(code(r.into_inner().status), want, "{why}");
        }
        let r = c.unmount_segment(UnmountSegmentRequest { client_id: "x".into(), segment_id: 12345 }).await.unwrap();
        assert_eq!(code(r.into_inner().status), Code::SegmentNotFound);
        let r = c
            .mount_segment(MountSegmentRequest { client_id: "".into(), segment: None, host: "".into() })
            .await
            .unwrap();
        assert_eq!(code(r.into_inner().status), Code::InvalidArgument);
        let r = c
            .mount_segment(MountSegmentRequest {
                client_id: "x".into(),
                segment: Some(SegmentInfo { name: "s".into(), base: u64::MAX - 1, size: 100, tier: 99 }),
                host: "".into(),
            })
            .await
            .unwrap();
        assert_eq!(code(r.into_inner().status), Code::InvalidArgument);
        let r = c
            .batch_put_start(BatchPutStartRequest {
                client_id: "x".into(),
                keys: vec!["a".into()],
                sizes: vec![],
                options: None,
                checksums: vec![],
            })
            .await
            .unwrap();
        assert_eq!(code(r.into_inner().items[0].status.clone()), Code::InvalidArgument);
        // Checksums: none, or one per key.
        let r = c
            .batch_put_start(BatchPutStartRequest {
                client_id: "x".into(),
                keys: vec!["a".into(), "b".into()],
                sizes: vec![10, 10],
                options: None,
                checksums: vec![Checksum { crc32: 1 }],
            })
            .await
            .unwrap();
        let items = r.into_inner().items;
        assert_eq!(items.len(), 2);
        assert!(items.iter().all(|i| code(i.status.clone()) == Code::InvalidArgument), "{items:?}");
        // A put this master never started, from a client it does not know: a put of a master
        // that is gone (restarted, failed over), which the writer must start again.
        let r = c
            .put_end(KeyRequest { client_id: "x".into(), key: "never-started".into(), ..Default::default() })
            .await
            .unwrap();
        assert_eq!(code(r.into_inner().status), Code::MasterChanged);
    });
    // The master still serves.
    let a = client(&m);
    a.put("after", b"fine").unwrap();
    assert_eq!(a.get("after").unwrap(), b"fine");
}

/// The value of the Prometheus sample `name` (with its labels, as printed) in `text`.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

#[test]
fn the_admin_port_shows_capacity_keys_operations_errors_and_placements() {
    let m = master();
    let a = client(&m);
    a.put("adm/1", &data(100_000, 1)).unwrap();
    assert_eq!(a.get("adm/1").unwrap(), data(100_000, 1));
    assert!(matches!(a.get("adm/none"), Err(StoreError::NotFound(_))));
    assert!(matches!(a.remove("adm/none"), Err(StoreError::NotFound(_))));
    a.put("adm/1", &data(10, 2)).unwrap(); // refused by the master, reported as success

    let (code, body) = crescent_tests::store::admin_http(&m, "GET", "/metrics", "");
    assert_eq!(code, 200);
    let text = body.as_str().expect("Prometheus text");
    let get = |name: &str| sample(text, name).unwrap_or_else(|| panic!("{name} in\n{text}"));
    assert_eq!(get("crescent_master_capacity_bytes"), (32 << 20) as f64);
    assert!(get("crescent_master_used_bytes") >= 100_000.0);
    assert_eq!(get("crescent_master_keys"), 1.0);
    assert_eq!(get("crescent_master_puts_total"), 1.0, "the refused second put did not start");
    assert_eq!(get("crescent_master_gets_total"), 1.0);
    // Errors by kind, from every RPC: the get and the removal of a missing key, the put of one
    // that exists.
    assert_eq!(get(r#"crescent_master_errors_total{kind="OBJECT_NOT_FOUND"}"#), 2.0);
    assert_eq!(get(r#"crescent_master_errors_total{kind="OBJECT_ALREADY_EXISTS"}"#), 1.0);
    assert_eq!(get(r#"crescent_master_rpc_latency_seconds_count{method="GetReplicaList"}"#), 2.0);

    let (code, health) = crescent_tests::store::admin_http(&m, "GET", "/health", "");
    assert_eq!((code, health["status"].as_str()), (200, Some("ok")), "{health}");
    let (code, q) = crescent_tests::store::admin_http(&m, "GET", "/query_key?key=adm/1", "");
    assert_eq!(code, 200, "{q}");
    assert_eq!((q["exists"].as_bool(), q["size"].as_u64()), (Some(true), Some(100_000)), "{q}");
    assert_eq!(q["replicas"][0]["segment"].as_str(), Some(a.segment_name()), "{q}");
    assert_eq!(q["replicas"][0]["tier"].as_str(), Some("DRAM"), "{q}");
    // Mooncake's fields beside Crescent's: the complete memory replicas under `data`.
    assert_eq!(q["success"].as_bool(), Some(true), "{q}");
    assert_eq!(q["data"][0]["size_"].as_u64(), Some(100_000), "{q}");
    assert_eq!(q["data"][0]["transport_endpoint_"].as_str(), Some(a.segment_name()), "{q}");
    let (code, q) = crescent_tests::store::admin_http(&m, "GET", "/query_key?key=adm/none", "");
    assert_eq!((code, q["success"].as_bool(), q["error_code"].as_i64()), (404, Some(false), Some(-704)), "{q}");
    let (code, _) = crescent_tests::store::admin_http(&m, "GET", "/query_key", "");
    assert_eq!(code, 400, "a query without a key is the caller's mistake");
    let (code, all) = crescent_tests::store::admin_http(&m, "GET", "/get_all_keys", "");
    assert_eq!((code, all.as_str()), (200, Some("adm/1\n")), "Mooncake's plain list, one key per line");
    let (code, all) = crescent_tests::store::admin_http(&m, "GET", "/get_all_segments", "");
    assert_eq!((code, all.as_str()), (200, Some(format!("{}\n", a.segment_name()).as_str())));
    assert_eq!((health["role"].as_str(), health["service_ready"].as_bool()), (Some("leader"), Some(true)));
    // Mooncake's metric names count the same operations.
    assert_eq!(get("master_put_start_requests_total"), 2.0, "both puts asked, one refused");
    assert_eq!(get("master_put_start_failures_total"), 1.0);
    assert_eq!(get("master_get_replica_list_requests_total"), 2.0);
    assert_eq!(get("master_get_replica_list_failures_total"), 1.0);
    assert_eq!(get("master_remove_failures_total"), 1.0);
    assert_eq!(get("master_key_count"), 1.0);
    assert_eq!(get("master_total_capacity_bytes"), (32 << 20) as f64);
    assert_eq!(get(&format!(r#"segment_total_capacity_bytes{{segment="{}"}}"#, a.segment_name())), (32 << 20) as f64);
    assert_eq!(get("master_active_clients"), 1.0);
    assert_eq!(get("valid_get_nums_"), 1.0);
    assert_eq!(get("mem_cache_hit_bytes_total"), 100_000.0);
    let (_, keys) = crescent_tests::store::admin_http(&m, "GET", "/keys", "");
    assert_eq!(keys["keys"], serde_json::json!(["adm/1"]));
    let (_, segments) = crescent_tests::store::admin_http(&m, "GET", "/segments", "");
    let names: Vec<&str> = segments["segments"].as_array().unwrap().iter().filter_map(|s| s["name"].as_str()).collect();
    assert_eq!(names, vec![a.segment_name()], "{segments}");
}

/// How many calls of each gRPC method the master has served, from its `/metrics`.
fn rpc_counts(m: &MasterHandle, methods: &[&str]) -> Vec<u64> {
    let (_, body) = crescent_tests::store::admin_http(m, "GET", "/metrics", "");
    let text = body.as_str().expect("Prometheus text").to_string();
    let count = |method: &str| {
        sample(&text, &format!(r#"crescent_master_rpc_latency_seconds_count{{method="{method}"}}"#)).unwrap_or(0.0)
            as u64
    };
    methods.iter().map(|&method| count(method)).collect()
}

#[test]
fn batch_calls_make_one_master_round_trip_per_batch_whatever_their_size() {
    let m = master();
    let (a, b) = (client(&m), client(&m));
    let keys: Vec<String> = (0..16).map(|i| format!("rt{i}")).collect();
    let values: Vec<Vec<u8>> = (0..16).map(|i| data(10_000 + i, i as u64)).collect();
    let refs: Vec<&[u8]> = values.iter().map(|v| v.as_slice()).collect();
    let methods = ["BatchPutStart", "BatchPutEnd", "PutStart", "PutEnd", "BatchGetReplicaList", "GetReplicaList"];
    let before = rpc_counts(&m, &methods);
    assert!(a.put_batch(&keys, &refs).unwrap().iter().all(|r| r.is_ok()));
    let got = b.get_batch(&keys).unwrap();
    assert!(got.iter().zip(&values).all(|(g, v)| g.as_ref().is_ok_and(|g| g == v)));
    let after = rpc_counts(&m, &methods);
    let calls: Vec<u64> = after.iter().zip(&before).map(|(x, y)| x - y).collect();
    assert_eq!(calls, vec![1, 1, 0, 0, 1, 0], "calls of {methods:?} for a 16-key batch put and get");
    let before = rpc_counts(&m, &["BatchExists", "Exists"]);
    assert_eq!(b.batch_exists(&keys).unwrap(), vec![true; 16]);
    let after = rpc_counts(&m, &["BatchExists", "Exists"]);
    assert_eq!((after[0] - before[0], after[1] - before[1]), (1, 0));
}

#[test]
fn a_batch_larger_than_the_masters_cap_is_split_into_calls_it_accepts() {
    use crescent_store::master::service::MAX_BATCH_KEYS;
    let m = master();
    let (a, b) = (client(&m), client(&m));
    let n = MAX_BATCH_KEYS + 3;
    let keys: Vec<String> = (0..n).map(|i| format!("big{i}")).collect();
    let values: Vec<Vec<u8>> = (0..n).map(|i| (i as u32).to_le_bytes().to_vec()).collect();
    let refs: Vec<&[u8]> = values.iter().map(|v| v.as_slice()).collect();
    let methods = ["BatchPutStart", "BatchPutEnd", "BatchGetReplicaList", "BatchExists"];
    let before = rpc_counts(&m, &methods);
    let put = a.put_batch(&keys, &refs).unwrap();
    assert!(put.iter().all(|r| r.is_ok()), "{:?}", put.iter().find(|r| r.is_err()));
    let mut asked = keys.clone();
    asked.push("never-put".into());
    let exists = b.batch_exists(&asked).unwrap();
    assert_eq!(exists.len(), n + 1);
    assert!(exists[..n].iter().all(|&e| e) && !exists[n], "every key put exists, in order; the other not");
    let got = b.get_batch(&keys).unwrap();
    assert_eq!(got.len(), n);
    for (i, (g, v)) in got.iter().zip(&values).enumerate() {
        assert!(g.as_ref().is_ok_and(|g| g == v), "key {i}: {g:?}");
    }
    let after = rpc_counts(&m, &methods);
    let calls: Vec<u64> = after.iter().zip(&before).map(|(x, y)| x - y).collect();
    assert_eq!(calls, vec![2, 2, 2, 2], "calls of {methods:?} for batches of {n} keys");
}

#[test]
fn puts_of_existing_keys_keep_the_value_and_upserts_replace_it() {
    let m = master();
    let (a, b) = (client(&m), client(&m));
    a.put("k", b"first").unwrap();
    b.put("k", b"second").unwrap();
    let keys = vec!["k".to_string(), "new".to_string()];
    let rs = b.put_batch(&keys, &[b"third".as_slice(), b"fresh".as_slice()]).unwrap();
    assert!(rs.iter().all(Result::is_ok), "{rs:?}");
    assert_eq!(a.get("k").unwrap(), b"first");
    assert_eq!(a.get("new").unwrap(), b"fresh");
    // Upsert replaces, with another size too; a reader's lease protects the old value.
    let options = b.default_options();
    assert!(matches!(b.upsert_with("k", b"replaced", &options), Err(StoreError::Leased(_))));
    b.upsert_with("unleased", b"one", &options).unwrap();
    b.upsert_with("unleased", b"two, longer", &options).unwrap();
    assert_eq!(a.get("unleased").unwrap(), b"two, longer");
    // Batches: replaced where unleased, a new key put, a leased key refused (per key).
    b.upsert_with("u/batch", b"one", &options).unwrap();
    let keys = vec!["u/batch".to_string(), "fresh".to_string(), "k".to_string()];
    let rs = b.upsert_batch_with(&keys, &[b"three".as_slice(), b"new", b"nope"], &options).unwrap();
    assert!(rs[0].is_ok() && rs[1].is_ok(), "{rs:?}");
    assert!(matches!(rs[2], Err(StoreError::Leased(_))), "{rs:?}");
    assert_eq!(a.get("u/batch").unwrap(), b"three");
    assert_eq!(a.get("fresh").unwrap(), b"new");
    // From registered memory in pieces: a put keeps the value, an upsert replaces it.
    let (head, tail) = (registered(&b, 1000, 7), registered(&b, 500, 8));
    let pieces = [Piece::new(head.as_ptr() as u64, 1000), Piece::new(tail.as_ptr() as u64, 500)];
    b.put("sg/1", b"orig").unwrap();
    let keys = vec!["sg/1".to_string(), "sg/2".to_string()];
    let rs = b.batch_put_from_sg(&keys, &[&pieces, &pieces], &options).unwrap();
    assert!(rs.iter().all(Result::is_ok), "{rs:?}");
    assert_eq!(b.get_size("sg/1").unwrap(), 4);
    let keys = vec!["sg/1".to_string(), "sg/3".to_string()];
    let rs = b.batch_upsert_from_sg(&keys, &[&pieces, &pieces[..1]], &options).unwrap();
    assert!(rs.iter().all(Result::is_ok), "{rs:?}");
    b.upsert_from_sg("sg/2", &pieces[1..], &options).unwrap();
    let mut whole = vec![7u8; 1000];
    whole.extend([8u8; 500]);
    assert_eq!(a.get("sg/1").unwrap(), whole);
    assert_eq!(a.get("sg/2").unwrap(), vec![8u8; 500]);
    assert_eq!(a.get("sg/3").unwrap(), vec![7u8; 1000]);
}

#[test]
fn a_pure_consumer_contributes_nothing_and_reads_and_writes_the_pool() {
    let m = master();
    let holder = client(&m);
    let consumer = loopback_client(&m, 0);
    consumer.put("c/1", &data(300_000, 3)).unwrap();
    assert_eq!(holder.get("c/1").unwrap(), data(300_000, 3));
    let q = consumer.query("c/1").unwrap();
    assert!(q.replicas.iter().all(|r| r.segment_name == holder.segment_name()), "{q:?}");
    // Heartbeats go on (the master does not know a consumer): it still reads and writes.
    std::thread::sleep(std::time::Duration::from_millis(2500));
    assert!(consumer.master_reachable());
    assert_eq!(consumer.get("c/1").unwrap(), data(300_000, 3));
    consumer.close().unwrap();
    assert_eq!(holder.get("c/1").unwrap(), data(300_000, 3));
}

/// Registered memory of `len` bytes filled with `fill` (the caller keeps it alive).
fn registered(c: &StoreClient, len: usize, fill: u8) -> Vec<u8> {
    let v = vec![fill; len];
    c.register_buffer(v.as_ptr() as u64, len as u64).unwrap();
    v
}

/// `buf` cut into pieces of these lengths, in order.
fn split(buf: &[u8], lens: &[usize]) -> Vec<Piece> {
    let mut at = 0;
    lens.iter()
        .map(|&n| {
            let p = Piece::new(buf.as_ptr() as u64 + at as u64, n as u64);
            at += n;
            p
        })
        .collect()
}

#[test]
fn values_in_several_buffers_come_back_into_another_split_and_by_ranges() {
    let m = master();
    let (a, b) = (client(&m), client(&m));
    let value = data((3 << 20) + 4321, 77);
    let src = registered(&a, value.len(), 0);
    // SAFETY: writing the bytes of a buffer this test owns, which nothing else uses meanwhile.
    unsafe { std::ptr::copy_nonoverlapping(value.as_ptr(), src.as_ptr() as *mut u8, value.len()) };
    a.put_from_sg("layers", &split(&src, &[1 << 20, 4321, 2 << 20]), &a.default_options()).unwrap();
    // Read back by the other client (remote replica) and by the putter (its own replica), into
    // a split the put never saw, with room to spare at the end.
    for c in [&b, &a] {
        let dst = registered(c, value.len() + 100, 0xEE);
        let pieces = split(&dst, &[10, (2 << 20) + 7, value.len() + 100 - 17 - (2 << 20)]);
        assert_eq!(c.get_into_sg("layers", &pieces).unwrap(), value.len() as u64);
        assert!(dst[..value.len()] == value[..], "the value, whole and in order");
        assert!(dst[value.len()..].iter().all(|&x| x == 0xEE), "nothing past the value");
        c.unregister_buffer(dst.as_ptr() as u64).unwrap();
    }
    // Ranges inside the value, in any order, into one buffer.
    let dst = registered(&b, 300, 0);
    let at = dst.as_ptr() as u64;
    let ranges = [
        Extent { offset: value.len() as u64 - 100, addr: at, len: 100 },
        Extent { offset: 0, addr: at + 100, len: 100 },
        Extent { offset: 1 << 20, addr: at + 200, len: 100 },
    ];
    assert_eq!(b.get_into_ranges("layers", &ranges).unwrap(), 300);
    assert!(dst[..100] == value[value.len() - 100..] && dst[100..200] == value[..100]);
    assert!(dst[200..] == value[1 << 20..(1 << 20) + 100]);
    // A range past the end is the caller's mistake, and reads nothing.
    let past = [Extent { offset: value.len() as u64 - 10, addr: at, len: 11 }];
    let e = b.get_into_ranges("layers", &past).unwrap_err();
    assert!(matches!(e, StoreError::BadRange { len: 11, .. }) && e.is_caller_error(), "{e}");
    assert_eq!(e.code(), Code::InvalidArgument);
    // Pieces of memory that are not registered are refused before anything moves.
    let heap = [0u8; 64];
    let e = b.get_into_sg("layers", &[Piece::new(at, 300), Piece::new(heap.as_ptr() as u64, 64)]).unwrap_err();
    assert!(matches!(e, StoreError::NotRegistered { .. }), "{e}");
    let e = a.put_from_sg("bad", &[Piece::new(heap.as_ptr() as u64, 64)], &a.default_options()).unwrap_err();
    assert!(e.is_caller_error() && !a.exists("bad").unwrap(), "{e}");
}

#[test]
fn batches_of_multi_buffer_puts_and_gets_are_one_round_trip_each() {
    let m = master();
    let (a, b) = (client(&m), client(&m));
    let keys: Vec<String> = (0..6).map(|i| format!("mb{i}")).collect();
    let values: Vec<Vec<u8>> = (0..6).map(|i| data(50_000 + i * 1000, 100 + i as u64)).collect();
    let srcs: Vec<Vec<u8>> = values.iter().map(|v| registered(&a, v.len(), 0)).collect();
    for (s, v) in srcs.iter().zip(&values) {
        // SAFETY: writing the bytes of a buffer this test owns, which nothing else uses meanwhile.
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), s.as_ptr() as *mut u8, v.len()) };
    }
    // Each value in three pieces (as layers of a KV cache would be).
    let put_layout: Vec<Vec<Piece>> = srcs.iter().map(|s| split(s, &[1000, 20_000, s.len() - 21_000])).collect();
    let put_refs: Vec<&[Piece]> = put_layout.iter().map(|p| &p[..]).collect();
    let methods = ["BatchPutStart", "BatchPutEnd", "BatchGetReplicaList", "PutStart", "GetReplicaList"];
    let before = rpc_counts(&m, &methods);
    let put = a.batch_put_from_sg(&keys, &put_refs, &a.default_options()).unwrap();
    assert!(put.iter().all(|r| r.is_ok()), "{put:?}");
    // Back in two pieces each on the other client, and as a range of each value.
    let dsts: Vec<Vec<u8>> = values.iter().map(|v| registered(&b, v.len(), 0)).collect();
    let get_layout: Vec<Vec<Piece>> = dsts.iter().map(|d| split(d, &[d.len() / 2, d.len() - d.len() / 2])).collect();
    let get_refs: Vec<&[Piece]> = get_layout.iter().map(|p| &p[..]).collect();
    let got = b.batch_get_into_sg(&keys, &get_refs).unwrap();
    let tails = registered(&b, 6 * 16, 0);
    let range_of: Vec<[Extent; 1]> = (0..6)
        .map(|i| [Extent { offset: values[i].len() as u64 - 16, addr: tails.as_ptr() as u64 + 16 * i as u64, len: 16 }])
        .collect();
    let range_refs: Vec<&[Extent]> = range_of.iter().map(|r| &r[..]).collect();
    let tails_got = b.batch_get_into_ranges(&keys, &range_refs).unwrap();
    let calls: Vec<u64> = rpc_counts(&m, &methods).iter().zip(&before).map(|(x, y)| x - y).collect();
    assert_eq!(calls, vec![1, 1, 2, 0, 0], "calls of {methods:?}");
    for i in 0..6 {
        assert_eq!(*got[i].as_ref().unwrap(), values[i].len() as u64);
        assert!(dsts[i] == values[i], "value {i}");
        assert_eq!(*tails_got[i].as_ref().unwrap(), 16);
        assert!(tails[16 * i..16 * (i + 1)] == values[i][values[i].len() - 16..], "tail {i}");
    }
    // Per key: a missing key, a range past the end and a buffer too small fail alone.
    let small = registered(&b, 10, 0);
    let keys2: Vec<String> = vec!["mb0".into(), "missing".into(), "mb1".into()];
    let past = [Extent { offset: 1, addr: dsts[1].as_ptr() as u64, len: values[1].len() as u64 }];
    let ranges2: Vec<&[Extent]> = vec![range_refs[0], range_refs[1], &past];
    let r = b.batch_get_into_ranges(&keys2, &ranges2).unwrap();
    assert!(r[0].is_ok() && matches!(r[1], Err(StoreError::NotFound(_))), "{r:?}");
    assert!(matches!(r[2], Err(StoreError::BadRange { .. })), "{r:?}");
    let tiny = [Piece::new(small.as_ptr() as u64, 10)];
    let r = b.batch_get_into_sg(&keys2[..1], &[&tiny]).unwrap();
    assert!(matches!(r[0], Err(StoreError::BufferTooSmall { have: 10, .. })), "{r:?}");
}

#[test]
fn the_blocking_api_works_and_drops_inside_tokio_tasks() {
    let m = master();
    let config = ClientConfig {
        global_segment_size: 8 << 20,
        local_buffer_size: 2 << 20,
        ..crescent_tests::store::loopback_client_config(&m)
    };
    let use_and_drop = |config: ClientConfig, tag: &str| {
        let c = StoreClient::connect(config).unwrap();
        let key = format!("in-tokio-{tag}");
        c.put(&key, b"from a task").unwrap();
        assert_eq!(c.get(&key).unwrap(), b"from a task");
        assert_eq!(c.get_batch(std::slice::from_ref(&key)).unwrap()[0].as_ref().unwrap(), b"from a task");
        assert!(c.exists(&key).unwrap());
        c.remove_with(&key, true).unwrap();
        drop(c); // closes the client and its runtimes inside the task
    };
    let current = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    current.block_on(async { use_and_drop(config.clone(), "current") });
    let multi = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let config2 = config.clone();
    multi.block_on(async move { tokio::spawn(async move { use_and_drop(config2, "worker") }).await.unwrap() });
    multi.block_on(async { use_and_drop(config, "multi") });
}

#[test]
fn a_put_right_after_a_master_restart_remounts_instead_of_failing_for_space() {
    let m = master();
    let addr = m.client_address();
    let a = StoreClient::connect(ClientConfig {
        global_segment_size: 8 << 20,
        local_buffer_size: 2 << 20,
        // No heartbeat during the test: only the put itself can bring the segment back.
        ping_interval: std::time::Duration::from_secs(600),
        ..crescent_tests::store::loopback_client_config(&m)
    })
    .unwrap();
    a.put("before", b"x").unwrap();
    let restart = |m: MasterHandle| {
        m.shutdown();
        crescent_store::master::server::start(MasterConfig {
            rpc_address: addr.clone(),
            admin_address: String::new(),
            ..Default::default()
        })
        .unwrap()
    };
    // The first call after a restart may find the old connection broken (in a running client
    // the heartbeat's ping is that call).
    let reconnect = |a: &StoreClient| {
        let _ = a.exists("probe");
    };
    // The new master knows no segment yet: the put remounts this client's and lands there.
    let m = restart(m);
    reconnect(&a);
    a.put("after", b"value").unwrap();
    assert_eq!(a.get("after").unwrap(), b"value");
    // A batch as well.
    let m = restart(m);
    reconnect(&a);
    let keys = vec!["b1".to_string(), "b2".to_string()];
    let r = a.put_batch(&keys, &[b"one", b"two"]).unwrap();
    assert!(r.iter().all(|r| r.is_ok()), "{r:?}");
    assert_eq!(a.get("b2").unwrap(), b"two");
    drop(m);
}

#[test]
fn a_value_put_in_parts_is_their_concatenation_wherever_it_lands() {
    let m = master();
    let (a, b) = (client(&m), client(&m));
    let options = a.default_options();
    let value = data((2 << 20) + 999, 21);
    // Parts as LMCache gives them (a small header, then the chunk), an empty one between.
    let parts: [&[u8]; 4] = [&value[..64], &[], &value[64..(1 << 20) + 5], &value[(1 << 20) + 5..]];
    a.put_parts_with("p/1", &parts, &options).unwrap();
    assert_eq!(b.get("p/1").unwrap(), value);
    assert_eq!(a.get("p/1").unwrap(), value);
    // Placed in the other client's segment only: the parts go through the staging buffer.
    let there = PutOptions { preferred_segment: b.segment_name().to_string(), ..options.clone() };
    a.put_parts_with("p/2", &parts[2..], &there).unwrap();
    let q = a.query("p/2").unwrap();
    assert!(q.replicas.iter().all(|r| r.segment_name == b.segment_name()), "{q:?}");
    assert_eq!(a.get("p/2").unwrap(), value[64..]);
    // Put keeps an existing value; upsert replaces it.
    a.put_parts_with("p/3", &[b"old".as_slice()], &options).unwrap();
    a.put_parts_with("p/3", &[b"new".as_slice(), b" value"], &options).unwrap();
    assert_eq!(a.get_size("p/3").unwrap(), 3);
    a.upsert_parts_with("p/3", &[b"new".as_slice(), b" value"], &options).unwrap();
    assert_eq!(b.get("p/3").unwrap(), b"new value");
    assert!(a.put_parts_with("p/4", &[b"".as_slice(), b""], &options).unwrap_err().is_caller_error());
}

#[test]
fn get_buffer_reads_once_into_the_clients_own_registered_memory_and_holds_it() {
    let m = master();
    let (a, b) = (client(&m), client(&m));
    let value = data(1 << 20, 31);
    a.put("gb/1", &value).unwrap();
    b.put("gb/2", &data(1000, 32)).unwrap();
    // From another client's segment (an engine read) and from b's own.
    let held = b.get_buffer("gb/1").unwrap();
    assert_eq!(held.bytes(), &value[..]);
    let own = b.get_buffer("gb/2").unwrap();
    assert_eq!(own.bytes(), &data(1000, 32)[..]);
    // The bytes lie in memory b registered (its local buffer): no copy out of it, and the
    // zero-copy calls take them as they are.
    assert!(b.engine().is_registered(held.addr(), held.len()));
    b.put_from("gb/copy", held.addr(), held.len()).unwrap();
    assert_eq!(a.get("gb/copy").unwrap(), value);
    // Held while the caller keeps it: another read gets other memory, the removal of the
    // object changes nothing in it.
    let again = b.get_buffer("gb/1").unwrap();
    assert_ne!(again.addr(), held.addr());
    drop(again);
    a.remove_with("gb/1", true).unwrap();
    assert_eq!(held.bytes(), &value[..]);
    // Batches: one result per key.
    let keys = vec!["gb/2".to_string(), "gb/none".to_string(), "gb/copy".to_string()];
    let got = b.batch_get_buffer(&keys).unwrap();
    assert_eq!(got[0].as_ref().unwrap().bytes(), &data(1000, 32)[..]);
    assert!(matches!(got[1], Err(StoreError::NotFound(_))), "{:?}", got[1]);
    assert_eq!(got[2].as_ref().unwrap().bytes(), &value[..]);
    // More than the local buffer (4 MiB) holds is the caller's mistake.
    a.put("gb/big", &data(5 << 20, 33)).unwrap();
    let e = b.get_buffer("gb/big").unwrap_err();
    assert!(e.is_caller_error(), "{e}");
    // The blocks go back when dropped: the whole buffer is free again.
    drop((held, own, got));
    a.put("gb/1b", &data(1 << 20, 34)).unwrap();
    let four: Vec<HeldBuffer> = (0..4).map(|_| b.get_buffer("gb/1b").unwrap()).collect();
    assert!(four.iter().all(|h| h.bytes() == &data(1 << 20, 34)[..]));
}

/// How many pages of `buf` (whole 4 KiB pages) are present (`/proc/self/pagemap`, bit 63).
fn present_pages(buf: &[u8]) -> (usize, usize) {
    use std::io::{Read, Seek, SeekFrom};
    let first = (buf.as_ptr() as usize).div_ceil(4096);
    let end = (buf.as_ptr() as usize + buf.len()) / 4096;
    let mut map = std::fs::File::open("/proc/self/pagemap").unwrap();
    map.seek(SeekFrom::Start(first as u64 * 8)).unwrap();
    let mut raw = vec![0u8; (end - first) * 8];
    map.read_exact(&mut raw).unwrap();
    let present = raw.chunks_exact(8).filter(|e| u64::from_le_bytes((*e).try_into().unwrap()) >> 63 == 1).count();
    (present, end - first)
}

#[test]
fn a_registered_buffer_is_resident_before_the_first_transfer_and_keeps_its_bytes() {
    let m = master();
    let (a, b) = (client(&m), client(&m));
    // A fresh allocation (above glibc's largest mmap threshold, 32 MiB, so never recycled
    // heap): its pages are not there until something touches them.
    let mut dst = vec![0u8; 40 << 20];
    let (before, pages) = present_pages(&dst);
    assert!(before < pages / 2, "{before} of {pages} pages present before registering");
    b.register_buffer(dst.as_mut_ptr() as u64, dst.len() as u64).unwrap();
    // As an RDMA registration would pin them: the transfers into it do not fault page by page.
    assert_eq!(present_pages(&dst), (pages, pages), "every page present once registered");
    assert!(dst.iter().all(|&x| x == 0), "registering changed no byte");
    let value = data(3 << 20, 41);
    a.put("res/1", &value).unwrap();
    let n = b.get_into("res/1", dst.as_mut_ptr() as u64, dst.len() as u64).unwrap();
    assert_eq!(&dst[..n as usize], &value[..]);
    b.unregister_buffer(dst.as_mut_ptr() as u64).unwrap();
}

#[test]
fn puts_of_a_size_put_often_go_into_blanks_and_read_back_whole() {
    // A put of a size this client put before goes into a blank the master granted ahead of it:
    // the transfer and one call, no PutStart. Values of two sizes, interleaved, from a client
    // without a segment (as the side-by-side benchmark's writer), read back by another.
    let m = master();
    let holder = client(&m);
    let writer = loopback_client(&m, 0);
    let sizes = [64 << 10, (1 << 20) + 3];
    let puts = 40u64;
    for i in 0..puts {
        writer.put(&format!("blank/{i}"), &data(sizes[i as usize % 2], i)).unwrap();
        // (Time for the pool's refills, which run beside the puts.)
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    for i in 0..puts {
        let got = holder.get(&format!("blank/{i}"));
        assert!(
            got.as_ref().is_ok_and(|v| *v == data(sizes[i as usize % 2], i)),
            "blank/{i}: {:?}",
            got.map(|v| v.len())
        );
    }
    let metrics = m.master.metrics();
    let (granted, committed) = (metrics.blanks_granted.get(), metrics.blanks_committed.get());
    assert!(committed >= puts / 2, "{committed} of {puts} puts went into blanks ({granted} granted)");
    assert_eq!(metrics.puts.get(), puts, "every put counted once, either way");
    // A put of a key that exists keeps the first value (Mooncake's put), through a blank too.
    writer.put("blank/1", &data(sizes[1], 999)).unwrap();
    assert!(holder.get("blank/1").unwrap() == data(sizes[1], 1));
    assert_eq!(metrics.blanks_committed.get(), committed, "the refused put committed nothing");
}
