//! Issue 26, tenants: clients of tenants A and B on one master (with the cluster secret, whose
//! tokens name the tenants) are isolated for every store call, the query API and events; B
//! gets no room in A's pool; and a client without the secret cannot claim a tenant.

use std::sync::Arc;
use std::time::Duration;

use crescent_store::proto::EventKind;
use crescent_store::{ClientConfig, MasterConfig, StoreApi, StoreClient, StoreError};
use crescent_tests::store::{loopback_client_config, loopback_master, pattern_bytes};
use crescent_transports::net::Keyring;

const SECRET: &str = "0c1d2e3f405162738495a6b7c8d9eafb";

fn client(m: &crescent_store::master::server::MasterHandle, tenant: &str, segment: u64) -> Arc<StoreClient> {
    StoreClient::connect(ClientConfig {
        global_segment_size: segment,
        local_buffer_size: 8 << 20,
        cluster_secret: Some(Keyring::new(&[SECRET]).unwrap()),
        tenant_id: tenant.into(),
        ..loopback_client_config(m)
    })
    .unwrap_or_else(|e| panic!("a client of {tenant} connects: {e}"))
}

#[test]
fn tenants_on_one_master_neither_see_read_overwrite_nor_remove_each_others_keys() {
    let m =
        loopback_master(MasterConfig { cluster_secret: Some(Keyring::new(&[SECRET]).unwrap()), ..Default::default() });
    let a = client(&m, "team-a", 16 << 20);
    let b = client(&m, "team-b", 16 << 20);
    let (va, vb) = (pattern_bytes(64 << 10, 1), pattern_bytes(64 << 10, 2));
    let mut events_b = b.sched().subscribe("").unwrap();

    a.put("k", &va).unwrap();
    a.put("a/only", &va).unwrap();
    // B sees none of A's keys, by any call.
    assert!(!b.exists("k").unwrap());
    assert_eq!(b.batch_exists(&["k".into(), "a/only".into()]).unwrap(), vec![false, false]);
    assert!(matches!(b.get("k"), Err(StoreError::NotFound(_))), "B reads A's key");
    assert!(!b.query("k").unwrap().exists);
    let q = b.sched().query_keys(&["k".into()]).unwrap();
    assert!(!q.items[0].exists && q.items[0].locations.is_empty(), "B's query API shows A's key: {q:?}");
    assert_eq!(b.sched().prefix_query(&["k".into()]).unwrap().pool_prefix_len, 0);
    // B's key of the same name is B's own: A's value stays A's.
    b.put("k", &vb).unwrap();
    assert_eq!(a.get("k").unwrap(), va);
    assert_eq!(b.get("k").unwrap(), vb);
    // The first event B sees is its own put, not A's two before it.
    let first = events_b.recv_timeout(Duration::from_secs(10)).unwrap().expect("B's event").event.unwrap();
    assert_eq!((first.key.as_str(), first.kind), ("k", EventKind::Stored as i32), "{first:?}");
    // B's removals remove B's keys only (forced: B's get leased its key).
    assert_eq!(b.remove_by_regex_with(".*", true).unwrap(), 1);
    b.put("k", &vb).unwrap();
    assert_eq!(b.remove_all_with(true).unwrap(), 1);
    b.put("k", &vb).unwrap();
    b.remove_with("k", true).unwrap();
    assert!(matches!(b.remove("a/only"), Err(StoreError::NotFound(_))));
    assert_eq!(a.get("k").unwrap(), va);
    assert_eq!(a.get("a/only").unwrap(), va);
    // Node stats list the tenant's own clients only.
    let nodes = b.sched().node_stats().unwrap().nodes;
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    assert_eq!(nodes[0].client_id, b.id());
}

#[test]
fn a_tenant_gets_no_room_in_another_tenants_pool() {
    let m =
        loopback_master(MasterConfig { cluster_secret: Some(Keyring::new(&[SECRET]).unwrap()), ..Default::default() });
    let a = client(&m, "team-a", 16 << 20);
    // B mounts nothing: A's pool, with room, is not B's.
    let b = client(&m, "team-b", 0);
    let e = b.put("k", &pattern_bytes(4096, 3)).unwrap_err();
    assert!(matches!(e, StoreError::NoSpace { .. }), "{e}");
    // A client of A's tenant does use it.
    let a2 = client(&m, "team-a", 0);
    a2.put("k", &pattern_bytes(4096, 3)).unwrap();
    assert_eq!(a.get("k").unwrap(), pattern_bytes(4096, 3));
    // The replica a2 put is in A's segment.
    assert_eq!(a.query("k").unwrap().replicas[0].segment_name, a.segment_name());
}

#[test]
fn without_a_secret_a_tenant_is_the_clients_word_but_names_stay_apart() {
    let m = loopback_master(MasterConfig::default());
    let open = |tenant: &str| {
        StoreClient::connect(ClientConfig {
            global_segment_size: 16 << 20,
            local_buffer_size: 8 << 20,
            tenant_id: tenant.into(),
            ..loopback_client_config(&m)
        })
        .unwrap()
    };
    let (d, a) = (open("default"), open("team-a"));
    a.put("k", &pattern_bytes(4096, 1)).unwrap();
    assert!(!d.exists("k").unwrap());
    // Spelling team-a's scoped name reaches a scope of the default tenant's own.
    assert!(!d.exists("\0team-a\0k").unwrap());
    assert_eq!(a.get("k").unwrap(), pattern_bytes(4096, 1));
}
