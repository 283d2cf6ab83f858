//! Every Grafana dashboard under `monitoring/grafana/` is valid JSON that Grafana can import
//! (a title, a uid, panels with unique ids, each query with an expression), and every metric
//! name its queries use is one the code exports: scraped from a running master's admin port
//! and from a store client's own `/metrics` endpoint (with a disk tier and the hot cache on, so
//! that every series the client can export is there).

use crescent_store::client::hot_cache::HotCacheSettings;
use crescent_store::{ClientConfig, MasterConfig, StoreApi, StoreClient};
use crescent_tests::dashboards::{dashboard_exprs, exports, promql_names, repo_path};
use crescent_tests::store::{loopback_client_config, loopback_master};

/// `GET /metrics` of `addr`: the body of a 200 answer.
fn scrape(addr: std::net::SocketAddr) -> String {
    let (status, head, body) = crescent_tests::http(addr, "GET", "/metrics", "", "");
    assert!(status == 200, "{head}");
    body
}

fn dashboards() -> Vec<(String, serde_json::Value)> {
    let dir = repo_path("monitoring/grafana");
    let mut found: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            let json = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not valid JSON: {e}", p.display()));
            (p.file_name().unwrap().to_string_lossy().into_owned(), json)
        })
        .collect();
    found.sort_by(|a, b| a.0.cmp(&b.0));
    found
}

#[test]
fn every_dashboard_is_importable_and_names_only_exported_series() {
    let all = dashboards();
    let names: Vec<&str> = all.iter().map(|(n, _)| n.as_str()).collect();
    assert!(names.contains(&"crescent-master.json") && names.contains(&"crescent-client.json"), "{names:?}");

    // What the code exports: a master's series and a client's, every kind of both.
    let master = loopback_master(MasterConfig::default());
    let root = tempfile::tempdir().unwrap();
    let client = StoreClient::connect(ClientConfig {
        global_segment_size: 16 << 20,
        local_buffer_size: 4 << 20,
        storage_root_dir: Some(root.path().to_path_buf()),
        storage_capacity: Some(64 << 20),
        metrics_address: Some("127.0.0.1:0".into()),
        hot_cache: HotCacheSettings::with_sizes(32 << 20, Some(4 << 20)),
        ..loopback_client_config(&master)
    })
    .expect("a client with a disk tier, a hot cache and a metrics endpoint");
    // Series with labels appear once they count something: a put, a get, a failed get.
    client.put("dashboards/a", &[7u8; 4096]).unwrap();
    assert_eq!(client.get("dashboards/a").unwrap().len(), 4096);
    assert!(client.get("dashboards/missing").is_err());
    let exported = format!(
        "{}{}",
        scrape(master.admin_addr.expect("the master's admin port")),
        scrape(client.metrics_addr().expect("the client's metrics endpoint"))
    );
    assert!(exported.contains("crescent_client_disk_used_bytes"), "the disk tier's series are scraped");

    let mut uids = Vec::new();
    for (name, d) in &all {
        for field in ["title", "uid"] {
            assert!(d[field].as_str().is_some_and(|s| !s.is_empty()), "{name}: no {field}");
        }
        uids.push(d["uid"].as_str().unwrap().to_string());
        let mut ids = Vec::new();
        let mut panels: Vec<&serde_json::Value> = d["panels"].as_array().expect("panels").iter().collect();
        while let Some(p) = panels.pop() {
            ids.push(p["id"].as_u64().unwrap_or_else(|| panic!("{name}: a panel without an id: {p}")));
            assert!(p["type"].is_string() && p["title"].is_string(), "{name}: {p}");
            if let Some(inner) = p["panels"].as_array() {
                panels.extend(inner);
            }
            for t in p["targets"].as_array().into_iter().flatten() {
                assert!(t["expr"].as_str().is_some_and(|e| !e.trim().is_empty()), "{name}: a query without expr: {t}");
            }
        }
        let mut unique = ids.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), ids.len(), "{name}: panel ids repeat: {ids:?}");

        let mut exprs = Vec::new();
        dashboard_exprs(d, &mut exprs);
        let used: Vec<String> = exprs.iter().flat_map(|e| promql_names(e)).collect();
        assert!(used.len() >= 10, "{name}: its queries name {used:?}");
        let missing: Vec<&String> = used.iter().filter(|n| !exports(&exported, n)).collect();
        assert!(missing.is_empty(), "{name} queries series the code does not export: {missing:?}");
    }
    uids.sort();
    let n = uids.len();
    uids.dedup();
    assert_eq!(uids.len(), n, "two dashboards share a uid");
    client.close().unwrap();
}
