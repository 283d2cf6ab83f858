//! The project's http metadata server: an in-memory key-value map behind
//! `GET`/`PUT`/`DELETE <path>?key=<key>`, answering as Mooncake's http metadata server does
//! (200 with the value, 404 for a missing key). A `PUT` may carry `&ttl_ms=<ms>`: the entry then
//! ages out unless it is put again in time.
//!
//! Run it with the `crescent-metadata-server` binary, or start one in-process with
//! [`MetadataServer::start`].

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Query, State};
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use parking_lot::Mutex;
use serde::Deserialize;
use tokio::runtime::Runtime;
use tokio::sync::oneshot;

use super::MAX_VALUE_LEN;

/// Most entries held at once; a `PUT` of a new key beyond it is refused with 507.
pub const MAX_ENTRIES: usize = 1 << 20;
/// Longest key accepted.
pub const MAX_KEY_LEN: usize = 4096;
/// How often expired entries are swept out (reads never see them in any case).
const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

#[derive(Default)]
struct Entries {
    map: HashMap<String, (Bytes, Option<Instant>)>,
}

impl Entries {
    fn live(&self, key: &str, now: Instant) -> Option<&Bytes> {
        match self.map.get(key) {
            Some((v, expires)) if expires.is_none_or(|t| t > now) => Some(v),
            _ => None,
        }
    }

    fn sweep(&mut self, now: Instant) {
        self.map.retain(|_, (_, expires)| expires.is_none_or(|t| t > now));
    }
}

type Shared = Arc<Mutex<Entries>>;

#[derive(Deserialize)]
struct Params {
    key: Option<String>,
    ttl_ms: Option<u64>,
}

fn key_of(p: &Params) -> Result<&str, (StatusCode, &'static str)> {
    match p.key.as_deref() {
        Some(k) if !k.is_empty() && k.len() <= MAX_KEY_LEN => Ok(k),
        Some(k) if !k.is_empty() => Err((StatusCode::BAD_REQUEST, "key too long")),
        _ => Err((StatusCode::BAD_REQUEST, "missing ?key=")),
    }
}

async fn get_value(
    State(entries): State<Shared>,
    Query(p): Query<Params>,
) -> Result<(StatusCode, Bytes), (StatusCode, &'static str)> {
    let key = key_of(&p)?;
    match entries.lock().live(key, Instant::now()) {
        Some(v) => Ok((StatusCode::OK, v.clone())),
        None => Err((StatusCode::NOT_FOUND, "metadata not found")),
    }
}

async fn put_value(
    State(entries): State<Shared>,
    Query(p): Query<Params>,
    body: Bytes,
) -> Result<&'static str, (StatusCode, &'static str)> {
    let key = key_of(&p)?;
    let expires = match p.ttl_ms {
        Some(0) => return Err((StatusCode::BAD_REQUEST, "ttl_ms must be positive")),
        // A TTL too long to represent never expires.
        Some(ms) => Instant::now().checked_add(Duration::from_millis(ms)),
        None => None,
    };
    let mut entries = entries.lock();
    if entries.map.len() >= MAX_ENTRIES && !entries.map.contains_key(key) {
        entries.sweep(Instant::now());
        if entries.map.len() >= MAX_ENTRIES {
            return Err((StatusCode::INSUFFICIENT_STORAGE, "too many entries"));
        }
    }
    entries.map.insert(key.to_string(), (body, expires));
    Ok("metadata updated")
}

async fn delete_value(
    State(entries): State<Shared>,
    Query(p): Query<Params>,
) -> Result<&'static str, (StatusCode, &'static str)> {
    let key = key_of(&p)?;
    let mut entries = entries.lock();
    let now = Instant::now();
    let was_live = entries.live(key, now).is_some();
    entries.map.remove(key);
    if was_live {
        Ok("metadata deleted")
    } else {
        Err((StatusCode::NOT_FOUND, "metadata not found"))
    }
}

/// The server's routes on `path` (e.g. `/metadata`).
fn router(path: &str, entries: Shared) -> Router {
    Router::new()
        .route(path, get(get_value).put(put_value).delete(delete_value))
        .layer(DefaultBodyLimit::max(MAX_VALUE_LEN))
        .with_state(entries)
}

/// A running http metadata server; stops when dropped.
pub struct MetadataServer {
    addr: SocketAddr,
    path: String,
    stop: Option<oneshot::Sender<()>>,
    runtime: Option<Runtime>,
}

impl MetadataServer {
    /// Listens on `bind` (port 0: any free port) and serves `path` (e.g. `/metadata`).
    pub fn start(bind: SocketAddr, path: &str) -> std::io::Result<Self> {
        if !path.starts_with('/') || path.contains(['?', '#']) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("path {path:?} must start with / and hold no query"),
            ));
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("crescent-metadata-server")
            .enable_all()
            .build()?;
        let listener = runtime.block_on(tokio::net::TcpListener::bind(bind))?;
        let addr = listener.local_addr()?;
        let entries: Shared = Arc::default();
        let app = router(path, entries.clone());
        let (stop, stopped) = oneshot::channel::<()>();
        runtime.spawn(async move {
            let served = axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await;
            if let Err(e) = served {
                tracing::error!("metadata server stopped: {e}");
            }
        });
        runtime.spawn(async move {
            let mut tick = tokio::time::interval(SWEEP_INTERVAL);
            loop {
                tick.tick().await;
                entries.lock().sweep(Instant::now());
            }
        });
        tracing::info!("metadata server listening on http://{addr}{path}");
        Ok(MetadataServer { addr, path: path.to_string(), stop: Some(stop), runtime: Some(runtime) })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The connection string engines use: `http://<addr><path>`.
    pub fn url(&self) -> String {
        format!("http://{}{}", self.addr, self.path)
    }

    /// Blocks the calling thread until the process ends.
    pub fn wait(self) -> ! {
        loop {
            std::thread::park();
        }
    }
}

impl Drop for MetadataServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(Duration::from_secs(1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::http::HttpStore;
    use crate::metadata::MetadataStore;
    use proptest::prelude::*;
    use std::io::{Read, Write};
    use std::sync::OnceLock;

    /// One server and client for all cases of this module.
    fn shared() -> &'static (MetadataServer, HttpStore) {
        static SHARED: OnceLock<(MetadataServer, HttpStore)> = OnceLock::new();
        SHARED.get_or_init(|| {
            let server =
                MetadataServer::start("127.0.0.1:0".parse().unwrap(), "/metadata").expect("server starts on loopback");
            let client = HttpStore::connect(&server.url()).expect("client connects");
            (server, client)
        })
    }

    #[test]
    fn puts_gets_deletes_and_expiry() {
        let (_, client) = shared();
        for key in ["mooncake/ram/10.0.0.1:80", "a&b=c", "sp ace/%20/ü", "?#"] {
            assert_eq!(client.get(key).unwrap(), None, "{key}");
            client.put(key, b"{\"v\":1}", None).unwrap();
            assert_eq!(client.get(key).unwrap().as_deref(), Some(&b"{\"v\":1}"[..]));
            client.delete(key).unwrap();
            assert_eq!(client.get(key).unwrap(), None);
            client.delete(key).unwrap();
        }
        client.put("short-lived", b"1", Some(Duration::from_millis(50))).unwrap();
        client.put("long-lived", b"2", Some(Duration::from_secs(600))).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(client.get("short-lived").unwrap(), None);
        assert_eq!(client.get("long-lived").unwrap().as_deref(), Some(&b"2"[..]));
    }

    #[test]
    fn oversized_values_and_bad_requests_are_refused() {
        let (server, client) = shared();
        let err = client.put("big", &vec![b'x'; MAX_VALUE_LEN + 1], None).unwrap_err();
        assert!(err.to_string().contains("413"), "{err}");
        let raw = |request: &str| {
            let mut c = std::net::TcpStream::connect(server.local_addr()).unwrap();
            c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            c.write_all(request.as_bytes()).unwrap();
            let mut answer = String::new();
            let _ = c.read_to_string(&mut answer);
            answer
        };
        let no_key = raw("GET /metadata HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        assert!(no_key.starts_with("HTTP/1.1 400"), "{no_key}");
        let zero_ttl =
            raw("PUT /metadata?key=k&ttl_ms=0 HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nConnection: close\r\n\r\nx");
        assert!(zero_ttl.starts_with("HTTP/1.1 400"), "{zero_ttl}");
        let huge_ttl = raw(&format!(
            "PUT /metadata?key=k&ttl_ms={} HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nConnection: close\r\n\r\nx",
            u64::MAX
        ));
        assert!(huge_ttl.starts_with("HTTP/1.1 200"), "{huge_ttl}");
        assert_eq!(client.get("k").unwrap().as_deref(), Some(&b"x"[..]));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn any_key_and_value_roundtrip(
            key in "(?s).{1,64}",
            value in proptest::collection::vec(any::<u8>(), 0..512),
        ) {
            let (_, client) = shared();
            client.put(&key, &value, None).unwrap();
            prop_assert_eq!(client.get(&key).unwrap(), Some(value));
            client.delete(&key).unwrap();
            prop_assert_eq!(client.get(&key).unwrap(), None);
        }

        #[test]
        fn garbage_requests_leave_the_server_serving(
            bytes in proptest::collection::vec(any::<u8>(), 0..256),
        ) {
            let (server, client) = shared();
            let mut c = std::net::TcpStream::connect(server.local_addr()).unwrap();
            c.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
            let _ = c.write_all(&bytes);
            let _ = c.shutdown(std::net::Shutdown::Write);
            let _ = c.read(&mut [0u8; 1024]);
            client.put("still-there", b"1", None).unwrap();
            prop_assert_eq!(client.get("still-there").unwrap(), Some(b"1".to_vec()));
        }
    }

    #[test]
    fn expired_entries_are_not_live_and_are_swept() {
        let mut e = Entries::default();
        let now = Instant::now();
        e.map.insert("a".into(), (Bytes::from_static(b"1"), None));
        e.map.insert("b".into(), (Bytes::from_static(b"2"), Some(now + Duration::from_secs(5))));
        e.map.insert("c".into(), (Bytes::from_static(b"3"), Some(now)));
        assert!(e.live("a", now).is_some());
        assert!(e.live("b", now).is_some());
        assert!(e.live("c", now).is_none());
        assert!(e.live("b", now + Duration::from_secs(6)).is_none());
        e.sweep(now + Duration::from_secs(6));
        assert_eq!(e.map.len(), 1);
    }
}
