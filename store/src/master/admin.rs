//! The master's HTTP admin port: `/metrics` (Prometheus), `/health`, `/query_key?key=`,
//! `/keys`, `/segments` (JSON), and the scheduler queries of [`super::query_http`]
//! (`/query`, `/prefix`, `/nodes`).

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

pub fn router(master: Arc<Master>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/health", get(health))
        .route("/query_key", get(query_key))
        .route("/keys", get(keys))
        .route("/segments", get(segments))
        .merge(super::query_http::routes())
        .with_state(master)
}

async fn metrics(State(m): State<Arc<Master>>) -> Response {
    ([("content-type", "text/plain; version=0.0.4")], m.render_metrics()).into_response()
}

async fn health(State(m): State<Arc<Master>>) -> Json<serde_json::Value> {
    let (role, term, leader) = m.role_view();
    Json(json!({"status": "ok", "role": role, "term": term, "leader": leader, "totals": m.totals()}))
}

async fn query_key(State(m): State<Arc<Master>>, Query(q): Query<HashMap<String, String>>) -> Response {
    let Some(key) = q.get("key") else {
        return (StatusCode::BAD_REQUEST, "missing ?key=").into_response();
    };
    match m.query(key) {
        Ok(r) => Json(json!({
            "key": key,
            "exists": r.exists,
            "size": r.size,
            "version": r.version,
            "lease_remaining_ms": r.lease_remaining_ms,
            "hard_pinned": r.hard_pinned,
            "replicas": r.replicas.iter().map(|x| json!({
                "segment": x.segment_name, "segment_id": x.segment_id, "address": x.address, "size": x.size,
                "client_id": x.client_id, "host": x.host,
                "tier": Tier::try_from(x.tier).map(|t| t.as_str_name()).unwrap_or("?"),
                "status": ReplicaStatus::try_from(x.status).map(|s| s.as_str_name()).unwrap_or("?"),
            })).collect::<Vec<_>>(),
        }))
        .into_response(),
        Err(e) => (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    }
}

async fn keys(State(m): State<Arc<Master>>, Query(q): Query<HashMap<String, String>>) -> Json<serde_json::Value> {
    let limit = q.get("limit").and_then(|l| l.parse().ok()).unwrap_or(10_000);
    Json(json!({"keys": m.keys(limit)}))
}

async fn segments(State(m): State<Arc<Master>>) -> Json<serde_json::Value> {
    Json(json!({"segments": m.segments()}))
}
