//! Get and put sessions of the store client (Mooncake's `batch_get_session_*` and
//! `batch_put_session_*`) against an in-process master on loopback: a value written layer by
//! layer and read back layer by layer with one master round trip per session step, not per
//! layer; what a session holds and when it ends (end, revoke, its lease, the master's put
//! timeout, the client's close); and the caller's mistakes, each failing its key alone.

use std::time::Duration;

use crescent_store::client::Extent;
use crescent_store::master::server::MasterHandle;
use crescent_store::{MasterConfig, StoreApi, StoreClient, StoreError};

const PAGE: usize = 64 << 10;
const LAYERS: usize = 4;

fn master_with(config: MasterConfig) -> MasterHandle {
    crescent_tests::store::loopback_master(config)
}

use crescent_tests::store::loopback_client as client;

/// Registered memory holding `bytes` (the caller keeps it alive).
fn registered(c: &StoreClient, bytes: Vec<u8>) -> Vec<u8> {
    c.register_buffer(bytes.as_ptr() as u64, bytes.len() as u64).unwrap();
    bytes
}

fn rpc_counts(m: &MasterHandle, methods: &[&str]) -> Vec<u64> {
    let (_, body) = crescent_tests::store::admin_http(m, "GET", "/metrics", "");
    let text = body.as_str().expect("Prometheus text").to_string();
    methods
        .iter()
        .map(|method| {
            let series = format!(r#"crescent_master_rpc_latency_seconds_count{{method="{method}"}}"#);
            text.lines().find_map(|l| l.strip_prefix(&series).and_then(|v| v.trim().parse::<f64>().ok())).unwrap_or(0.0)
                as u64
        })
        .collect()
}

const METHODS: [&str; 6] =
    ["BatchPutStart", "BatchPutEnd", "PutStart", "PutEnd", "BatchGetReplicaList", "GetReplicaList"];

/// Per layer, one extent per key: page `k` of `layer_buf` is `[layer * PAGE, +PAGE)` of key `k`.
fn layer_ranges(layer_buf: &[u8], layer: usize, keys: usize) -> Vec<[Extent; 1]> {
    (0..keys)
        .map(|k| {
            [Extent {
                offset: (layer * PAGE) as u64,
                addr: layer_buf.as_ptr() as u64 + (k * PAGE) as u64,
                len: PAGE as u64,
            }]
        })
        .collect()
}

/// Whether a key's result is the caller's mistake of using a session it does not hold (or
/// another bad argument).
fn invalid<T>(r: &Result<T, StoreError>) -> bool {
    matches!(r, Err(StoreError::InvalidArgument(_)))
}

fn refs(r: &[[Extent; 1]]) -> Vec<&[Extent]> {
    r.iter().map(|e| &e[..]).collect()
}

#[test]
fn a_value_saved_layer_by_layer_in_a_session_loads_back_layer_by_layer_without_a_master_round_trip_per_layer() {
    let m = master_with(MasterConfig::default());
    let holder = client(&m, 32 << 20);
    let consumer = client(&m, 0);
    let keys: Vec<String> = (0..3).map(|i| format!("blk{i}")).collect();
    // One buffer per layer holding every key's page of it, as an engine's KV cache does.
    let layers: Vec<Vec<u8>> = (0..LAYERS)
        .map(|l| registered(&consumer, crescent_tests::store::pattern_bytes(keys.len() * PAGE, 10 + l as u64)))
        .collect();
    let value = |k: usize| -> Vec<u8> { layers.iter().flat_map(|l| l[k * PAGE..(k + 1) * PAGE].to_vec()).collect() };
    let sizes = vec![(LAYERS * PAGE) as u64; keys.len()];

    // The consumer's replicas are all in the holder's segment: its writes cross the network.
    let before = rpc_counts(&m, &METHODS);
    let started = consumer.batch_put_session_start(&keys, &sizes, &consumer.default_options()).unwrap();
    assert!(started.iter().all(|r| r.is_ok()), "{started:?}");
    for (l, buf) in layers.iter().enumerate().rev() {
        let r = layer_ranges(buf, l, keys.len());
        let wrote = consumer.batch_put_from_session_ranges(&keys, &refs(&r)).unwrap();
        assert!(wrote.iter().all(|w| w.as_ref().is_ok_and(|n| *n == PAGE as u64)), "layer {l}: {wrote:?}");
    }
    assert!(!holder.exists(&keys[0]).unwrap(), "reserved, not readable before the end");
    let ended = consumer.batch_put_session_end(&keys).unwrap();
    assert!(ended.iter().all(|r| r.is_ok()), "{ended:?}");
    let calls: Vec<u64> = rpc_counts(&m, &METHODS).iter().zip(&before).map(|(x, y)| x - y).collect();
    assert_eq!(calls, vec![1, 1, 0, 0, 0, 0], "calls of {METHODS:?} for a session of {LAYERS} layers");
    for (k, key) in keys.iter().enumerate() {
        assert!(holder.get(key).unwrap() == value(k), "value {k}, read whole");
    }

    // Loaded back layer by layer: by the consumer (remote reads) and by the holder (its own
    // replicas), into fresh per-layer buffers.
    for reader in [&consumer, &holder] {
        let before = rpc_counts(&m, &METHODS);
        let started = reader.batch_get_session_start(&keys).unwrap();
        assert!(started.iter().all(|r| r.is_ok()), "{started:?}");
        let dsts: Vec<Vec<u8>> = (0..LAYERS).map(|_| registered(reader, vec![0xEE; keys.len() * PAGE])).collect();
        for (l, buf) in dsts.iter().enumerate() {
            let r = layer_ranges(buf, l, keys.len());
            let got = reader.batch_get_into_session_ranges(&keys, &refs(&r)).unwrap();
            assert!(got.iter().all(|g| g.as_ref().is_ok_and(|n| *n == PAGE as u64)), "layer {l}: {got:?}");
        }
        reader.batch_get_session_end(&keys).unwrap();
        let calls: Vec<u64> = rpc_counts(&m, &METHODS).iter().zip(&before).map(|(x, y)| x - y).collect();
        assert_eq!(calls, vec![0, 0, 0, 0, 1, 0], "calls of {METHODS:?} for a get session");
        assert!(dsts == layers, "every layer back in place");
        for d in &dsts {
            reader.unregister_buffer(d.as_ptr() as u64).unwrap();
        }
    }

    // The holder's own session: its replica is in its own segment (a memcpy), read remotely.
    let own = vec!["own".to_string()];
    let src = registered(&holder, crescent_tests::store::pattern_bytes(3 * PAGE, 99));
    assert!(holder.batch_put_session_start(&own, &[3 * PAGE as u64], &holder.default_options()).unwrap()[0].is_ok());
    let halves = [
        Extent { offset: PAGE as u64, addr: src.as_ptr() as u64 + PAGE as u64, len: 2 * PAGE as u64 },
        Extent { offset: 0, addr: src.as_ptr() as u64, len: PAGE as u64 },
    ];
    assert_eq!(*holder.batch_put_from_session_ranges(&own, &[&halves]).unwrap()[0].as_ref().unwrap(), 3 * PAGE as u64);
    assert!(holder.batch_put_session_end(&own).unwrap()[0].is_ok());
    assert!(consumer.get("own").unwrap() == src);
}

#[test]
fn sessions_end_once_and_refuse_what_they_do_not_hold_key_by_key() {
    let m = master_with(MasterConfig::default());
    let c = client(&m, 32 << 20);
    let src = registered(&c, crescent_tests::store::pattern_bytes(2 * PAGE, 5));
    let whole = |at: u64| [Extent { offset: at, addr: src.as_ptr() as u64, len: PAGE as u64 }];
    let one = |k: &str| vec![k.to_string()];
    let size = [2 * PAGE as u64];
    let opts = c.default_options();

    // Nothing started: writes, ends and revokes are the caller's mistake.
    assert!(invalid(&c.batch_put_from_session_ranges(&one("none"), &[&whole(0)]).unwrap()[0]));
    assert!(invalid(&c.batch_put_session_end(&one("none")).unwrap()[0]));
    assert!(invalid(&c.batch_put_session_revoke(&one("none")).unwrap()[0]));
    assert!(invalid(&c.batch_get_into_session_ranges(&one("none"), &[&whole(0)]).unwrap()[0]));
    assert!(c.batch_put_session_start(&one("a"), &[1, 2], &opts).is_err(), "keys and sizes of other lengths");

    // One session per key; an empty value or an existing key gets none.
    c.put("exists", b"value").unwrap();
    let keys: Vec<String> = ["a", "a", "empty", "exists"].iter().map(|s| s.to_string()).collect();
    let r = c.batch_put_session_start(&keys, &[size[0], size[0], 0, 5], &opts).unwrap();
    assert!(r[0].is_ok(), "{r:?}");
    assert!(r[1].is_err(), "the same key twice in a batch: one session: {r:?}");
    assert!(invalid(&r[2]) && matches!(r[3], Err(StoreError::AlreadyExists(_))), "{r:?}");
    assert!(invalid(&c.batch_put_session_start(&one("a"), &size, &opts).unwrap()[0]), "a second start");

    // Ranges past the value or from memory not registered fail their key alone; the session
    // goes on.
    let heap = vec![0u8; PAGE];
    let past = [Extent { offset: PAGE as u64 + 1, addr: src.as_ptr() as u64, len: PAGE as u64 }];
    let loose = [Extent { offset: 0, addr: heap.as_ptr() as u64, len: PAGE as u64 }];
    let ak = vec!["a".to_string(), "a".to_string(), "a".to_string()];
    let r = c.batch_put_from_session_ranges(&ak, &[&past, &loose, &whole(PAGE as u64)]).unwrap();
    assert!(matches!(r[0], Err(StoreError::BadRange { .. })), "{r:?}");
    assert!(matches!(r[1], Err(StoreError::NotRegistered { .. })), "{r:?}");
    assert_eq!(*r[2].as_ref().unwrap(), PAGE as u64);
    assert_eq!(*c.batch_put_from_session_ranges(&one("a"), &[&whole(0)]).unwrap()[0].as_ref().unwrap(), PAGE as u64);

    // End once: then no session, no writes; the object is readable.
    assert!(c.batch_put_session_end(&one("a")).unwrap()[0].is_ok());
    assert!(invalid(&c.batch_put_session_end(&one("a")).unwrap()[0]), "end twice");
    assert!(invalid(&c.batch_put_session_revoke(&one("a")).unwrap()[0]), "revoke after end");
    assert!(invalid(&c.batch_put_from_session_ranges(&one("a"), &[&whole(0)]).unwrap()[0]), "write after end");
    let mut expect = src[..PAGE].to_vec();
    expect.extend_from_slice(&src[..PAGE]);
    assert!(c.get("a").unwrap() == expect);

    // Revoke: nothing stored, the key free for a new put.
    assert!(c.batch_put_session_start(&one("r"), &size, &opts).unwrap()[0].is_ok());
    assert!(c.batch_put_from_session_ranges(&one("r"), &[&whole(0)]).unwrap()[0].is_ok());
    assert!(c.batch_put_session_revoke(&one("r")).unwrap()[0].is_ok());
    assert!(invalid(&c.batch_put_session_revoke(&one("r")).unwrap()[0]), "revoke twice");
    assert!(matches!(c.batch_get_session_start(&one("r")).unwrap()[0], Err(StoreError::NotFound(_))));
    c.put("r", b"again").unwrap();
    assert_eq!(c.get("r").unwrap(), b"again");

    // Get sessions: a missing key has none; ranges past the value fail alone; after the end
    // (twice is fine), none.
    let dst = registered(&c, vec![0; 2 * PAGE]);
    let into = |at: u64, len: usize| [Extent { offset: at, addr: dst.as_ptr() as u64, len: len as u64 }];
    let gk: Vec<String> = vec!["a".into(), "missing".into()];
    let r = c.batch_get_session_start(&gk).unwrap();
    assert!(r[0].is_ok() && matches!(r[1], Err(StoreError::NotFound(_))), "{r:?}");
    let r = c.batch_get_into_session_ranges(&gk, &[&into(PAGE as u64 + 1, PAGE), &into(0, 1)]).unwrap();
    assert!(matches!(r[0], Err(StoreError::BadRange { .. })) && invalid(&r[1]), "{r:?}");
    assert_eq!(
        *c.batch_get_into_session_ranges(&one("a"), &[&into(0, 2 * PAGE)]).unwrap()[0].as_ref().unwrap(),
        2 * PAGE as u64
    );
    assert!(dst == expect);
    c.batch_get_session_end(&gk).unwrap();
    c.batch_get_session_end(&gk).unwrap();
    assert!(invalid(&c.batch_get_into_session_ranges(&one("a"), &[&into(0, 1)]).unwrap()[0]), "after the end");
}

#[test]
fn a_get_session_ends_with_its_lease() {
    let m = master_with(MasterConfig { lease_ttl: Duration::from_millis(400), ..MasterConfig::default() });
    let c = client(&m, 32 << 20);
    c.put("k", &[7u8; 4096]).unwrap();
    let dst = registered(&c, vec![0; 4096]);
    let all = [Extent { offset: 0, addr: dst.as_ptr() as u64, len: 4096 }];
    let k = vec!["k".to_string()];
    assert!(c.batch_get_session_start(&k).unwrap()[0].is_ok());
    assert_eq!(*c.batch_get_into_session_ranges(&k, &[&all]).unwrap()[0].as_ref().unwrap(), 4096);
    std::thread::sleep(Duration::from_millis(500));
    let r = c.batch_get_into_session_ranges(&k, &[&all]).unwrap();
    assert!(matches!(r[0], Err(StoreError::LeaseExpired { .. })), "{r:?}");
    let r = c.batch_get_into_session_ranges(&k, &[&all]).unwrap();
    assert!(matches!(r[0], Err(StoreError::InvalidArgument(_))), "the session ended with its lease: {r:?}");
    assert!(c.batch_get_session_start(&k).unwrap()[0].is_ok(), "a new start, a new lease");
    assert!(c.batch_get_into_session_ranges(&k, &[&all]).unwrap()[0].is_ok());
}

#[test]
fn a_put_session_writes_nothing_once_the_master_may_have_given_its_space_away() {
    let m = master_with(MasterConfig { put_timeout: Duration::from_millis(400), ..MasterConfig::default() });
    let c = client(&m, 32 << 20);
    let src = registered(&c, vec![3u8; 4096]);
    let all = [Extent { offset: 0, addr: src.as_ptr() as u64, len: 4096 }];
    let k = vec!["slow".to_string()];
    assert!(c.batch_put_session_start(&k, &[4096], &c.default_options()).unwrap()[0].is_ok());
    assert!(c.batch_put_from_session_ranges(&k, &[&all]).unwrap()[0].is_ok(), "within the put timeout");
    std::thread::sleep(Duration::from_millis(500));
    let r = c.batch_put_from_session_ranges(&k, &[&all]).unwrap();
    assert!(matches!(&r[0], Err(StoreError::InvalidArgument(why)) if why.contains("put timeout")), "{r:?}");
    assert!(c.batch_put_session_revoke(&k).unwrap()[0].is_ok(), "revoked, whether the master still had it or not");
}

#[test]
fn closing_a_client_gives_back_its_open_put_sessions() {
    let m = master_with(MasterConfig::default());
    let holder = client(&m, 32 << 20);
    let k = vec!["left-open".to_string()];
    let leaver = client(&m, 0);
    assert!(leaver.batch_put_session_start(&k, &[4096], &leaver.default_options()).unwrap()[0].is_ok());
    leaver.close().unwrap();
    // Not held until the master's put timeout: the key can be put at once.
    let r = holder.batch_put_session_start(&k, &[4096], &holder.default_options()).unwrap();
    assert!(r[0].is_ok(), "{r:?}");
    assert!(holder.batch_put_session_revoke(&k).unwrap()[0].is_ok());
}
