//! The query API over HTTP (JSON) on the admin port, for schedulers that do not speak gRPC:
//!
//! * `GET /query?key=K` and `POST /query` with `{"keys": [...]}`: where each key is;
//! * `POST /prefix` with `{"keys": [...]}` (ordered chunk keys): the longest cached prefix per node;
//! * `GET /nodes`: per-node capacity, used, objects, recent get/put rates, published keys.
//!
//! Same answers as the gRPC calls, with each location's node spelled out.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::master::Master;
use crate::proto::{QueryKeysReply, Tier};

/// Largest request body (a million short keys fit).
const MAX_BODY: usize = 64 << 20;

#[derive(Deserialize)]
struct Keys {
    keys: Vec<String>,
}

/// The scheduler's query routes, merged into the admin port: `GET /query?key=` and
/// `POST /query` (several keys), `POST /prefix`, `GET /nodes`.
pub fn routes() -> Router<Arc<Master>> {
    Router::new()
        .route("/query", get(query_one).post(query_many))
        .route("/prefix", post(prefix))
        .route("/nodes", get(nodes))
        .layer(DefaultBodyLimit::max(MAX_BODY))
}

fn tier_name(t: i32) -> &'static str {
    Tier::try_from(t).map(|t| t.as_str_name()).unwrap_or("?")
}

fn locations_json(keys: &[String], r: &QueryKeysReply) -> Value {
    let items: Vec<Value> = keys
        .iter()
        .zip(&r.items)
        .map(|(key, item)| {
            let locations: Vec<Value> = item
                .locations
                .iter()
                .filter_map(|l| {
                    let n = r.nodes.get(l.node as usize)?;
                    Some(json!({
                        "client_id": n.client_id, "host": n.host, "segment": n.segment, "segment_id": n.segment_id,
                        "tier": tier_name(l.tier), "published": l.published, "size": l.size,
                    }))
                })
                .collect();
            json!({"key": key, "exists": item.exists, "size": item.size, "locations": locations})
        })
        .collect();
    json!({ "items": items })
}

fn answer(m: &Master, keys: Vec<String>) -> Response {
    match m.query_keys(&keys) {
        Ok(r) => Json(locations_json(&keys, &r)).into_response(),
        Err(e) => (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    }
}

async fn query_one(State(m): State<Arc<Master>>, Query(q): Query<HashMap<String, String>>) -> Response {
    match q.get("key") {
        Some(key) => answer(&m, vec![key.clone()]),
        None => (StatusCode::BAD_REQUEST, "missing ?key= (or POST {\"keys\": [...]})").into_response(),
    }
}

async fn query_many(State(m): State<Arc<Master>>, Json(body): Json<Keys>) -> Response {
    answer(&m, body.keys)
}

async fn prefix(State(m): State<Arc<Master>>, Json(body): Json<Keys>) -> Response {
    match m.prefix_query(&body.keys) {
        Ok(r) => Json(json!({
            "chunks": body.keys.len(),
            "pool_prefix_len": r.pool_prefix_len,
            "nodes": r.nodes.iter().map(|n| json!({
                "client_id": n.client_id, "host": n.host, "prefix_len": n.prefix_len,
                "prefix_bytes": n.prefix_bytes, "vram": n.vram, "dram": n.dram, "ssd": n.ssd,
            })).collect::<Vec<_>>(),
        }))
        .into_response(),
        Err(e) => (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    }
}

async fn nodes(State(m): State<Arc<Master>>) -> Json<Value> {
    let r = m.node_stats();
    Json(json!({
        "window_ms": r.window_ms,
        "nodes": r.nodes.iter().map(|n| json!({
            "client_id": n.client_id, "host": n.host, "segments": n.segments, "capacity": n.capacity,
            "used": n.used, "objects": n.objects, "get_rate": n.get_rate, "put_rate": n.put_rate,
            "published_keys": n.published_keys, "ms_since_ping": n.ms_since_ping,
        })).collect::<Vec<_>>(),
    }))
}
