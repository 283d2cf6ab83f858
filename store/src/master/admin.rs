//! The master's HTTP admin port.
//!
//! Mooncake's routes, answering as upstream's `master_admin_service.cpp` does (its JSON fields,
//! plain-text lists, status codes): `/metrics` (Prometheus text: Crescent's `crescent_master_*`
//! and Mooncake's `master_*` names), `/health`, `/query_key?key=`, `/get_all_keys`,
//! `/get_all_segments`. Crescent's own: `/keys`, `/segments` (JSON), and the scheduler queries
//! of [`super::query_http`] (`/query`, `/prefix`, `/nodes`). Where a Mooncake route and
//! Crescent's share a path, the answer carries both's fields.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use axum::Router;
use serde_json::json;

use crate::master::Master;
use crate::proto::{ReplicaStatus, Tier};

/// Mooncake's error codes that the admin port's answers carry (upstream `types.h`).
const MOONCAKE_INVALID_KEY: i32 = -400;
const MOONCAKE_OBJECT_NOT_FOUND: i32 = -704;

/// The admin port's routes over `master`: Mooncake's and Crescent's (see the module doc),
/// without access control (the server adds it, see [`super::access`]).
pub fn router(master: Arc<Master>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/health", get(health))
        .route("/query_key", get(query_key))
        .route("/get_all_keys", get(get_all_keys))
        .route("/get_all_segments", get(get_all_segments))
        .route("/keys", get(keys))
        .route("/segments", get(segments))
        .merge(super::query_http::routes())
        .with_state(master)
}

async fn metrics(State(m): State<Arc<Master>>) -> Response {
    m.refresh_scrape_gauges();
    ([("content-type", "text/plain; version=0.0.4")], m.render_metrics()).into_response()
}

/// Upstream's fields (a master without HA is the leader, serving), then Crescent's role, term and totals.
async fn health(State(m): State<Arc<Master>>) -> Json<serde_json::Value> {
    // Upstream's role is leader or standby; `crescent_role` tells a single master, an HA
    // leader, a standby and a deposed leader apart (docs/src/ha.md).
    let (role, term, leader) = m.role_view();
    let serving = role == "single" || role == "leader";
    Json(json!({
        "status": "ok",
        "role": if serving { "leader" } else { "standby" },
        "ha_state": if serving { "serving" } else { "standby" },
        "service_ready": serving,
        "cluster_id": m.config().cluster_id,
        "crescent_role": role,
        "term": term,
        "leader": leader,
        "totals": m.totals(),
    }))
}

/// Upstream's answer: `{"success": true, "data": [<memory replica descriptors>]}` (each
/// `size_`, `buffer_address_`, `protocol_`, `transport_endpoint_`), 404 with
/// `{"success": false, "error_code": -704, ...}` for a key with no complete object; `protocol_`
/// is `auto` (a Crescent client picks the transport per peer, not per replica). Crescent's
/// fields come beside them: `key`, `exists`, `size`, `version`, `lease_remaining_ms`,
/// `hard_pinned`, and every replica (any tier, any status) under `replicas`. No lease is
/// taken (a query is not a get).
async fn query_key(State(m): State<Arc<Master>>, Query(q): Query<HashMap<String, String>>) -> Response {
    let Some(key) = q.get("key") else {
        let body = json!({"success": false, "error_code": MOONCAKE_INVALID_KEY, "error_message": "missing ?key="});
        return (StatusCode::BAD_REQUEST, Json(body)).into_response();
    };
    let r = match m.query(key) {
        Ok(r) => r,
        Err(e) => {
            let body = json!({"success": false, "error_code": MOONCAKE_INVALID_KEY, "error_message": e.to_string()});
            return (StatusCode::BAD_REQUEST, Json(body)).into_response();
        }
    };
    let complete = |x: &&crate::proto::ReplicaDescriptor| x.status == ReplicaStatus::Complete as i32;
    let data: Vec<_> = r
        .replicas
        .iter()
        .filter(complete)
        .filter(|x| x.tier != Tier::Ssd as i32)
        .map(|x| {
            json!({
                "size_": x.size, "buffer_address_": x.address, "protocol_": "auto",
                "transport_endpoint_": x.segment_name,
            })
        })
        .collect();
    let replicas: Vec<_> = r
        .replicas
        .iter()
        .map(|x| {
            json!({
                "segment": x.segment_name, "segment_id": x.segment_id, "address": x.address, "size": x.size,
                "client_id": x.client_id, "host": x.host,
                "tier": Tier::try_from(x.tier).map(|t| t.as_str_name()).unwrap_or("?"),
                "status": ReplicaStatus::try_from(x.status).map(|s| s.as_str_name()).unwrap_or("?"),
            })
        })
        .collect();
    let mut body = json!({
        "key": key,
        "exists": r.exists,
        "size": r.size,
        "version": r.version,
        "lease_remaining_ms": r.lease_remaining_ms,
        "hard_pinned": r.hard_pinned,
        "replicas": replicas,
    });
    if r.exists {
        body["success"] = json!(true);
        body["data"] = json!(data);
        Json(body).into_response()
    } else {
        body["success"] = json!(false);
        body["error_code"] = json!(MOONCAKE_OBJECT_NOT_FOUND);
        body["error_message"] = json!("OBJECT_NOT_FOUND");
        (StatusCode::NOT_FOUND, Json(body)).into_response()
    }
}

/// Upstream's plain text, one name per line.
fn lines(items: impl IntoIterator<Item = String>) -> Response {
    let mut body = String::new();
    for item in items {
        body.push_str(&item);
        body.push('\n');
    }
    ([("content-type", "text/plain; version=0.0.4")], body).into_response()
}

/// Every key with a complete object, one per line.
async fn get_all_keys(State(m): State<Arc<Master>>) -> Response {
    lines(m.keys(usize::MAX))
}

/// Every mounted memory segment's name, one per line (disks are not segments upstream).
async fn get_all_segments(State(m): State<Arc<Master>>) -> Response {
    lines(m.segments().into_iter().filter(|s| s.tier != Tier::Ssd.as_str_name()).map(|s| s.name))
}

async fn keys(State(m): State<Arc<Master>>, Query(q): Query<HashMap<String, String>>) -> Json<serde_json::Value> {
    let limit = q.get("limit").and_then(|l| l.parse().ok()).unwrap_or(10_000);
    Json(json!({"keys": m.keys(limit)}))
}

async fn segments(State(m): State<Arc<Master>>) -> Json<serde_json::Value> {
    Json(json!({"segments": m.segments()}))
}
