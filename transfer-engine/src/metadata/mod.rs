//! Metadata services: where engines publish their segment descriptors and find each other's.
//!
//! The connection strings are Mooncake's:
//!
//! | string | service |
//! |---|---|
//! | `P2PHANDSHAKE` | none: descriptors are asked from the peer itself ([`crate::handshake`]) |
//! | `etcd://host:port[,host:port…]` (or a bare `host:port`) | etcd v3; entries live on a lease |
//! | `redis://[user:pass@]host:port[/db]` | redis; entries carry a TTL |
//! | `http://host:port/path` | an http key-value service (`GET`/`PUT`/`DELETE` `path?key=…`), e.g. [`server`] |
//!
//! Keys follow Mooncake's layout: `mooncake/[<cluster id>/]ram/<segment>` holds the segment's
//! descriptor (JSON) and `mooncake/[<cluster id>/]rpc_meta/<segment>` its handshake address
//! (JSON). The cluster id (`MC_METADATA_CLUSTER_ID`) keeps clusters that share one service apart.
//!
//! Every value read from a service is untrusted: it is size-checked and validated before use.

mod etcd;
mod http;
mod publisher;
mod redis;
pub mod server;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::{EngineConfig, P2P_HANDSHAKE};
use crate::descriptor::SegmentDescriptor;
use crate::error::{EngineError, Result};

pub(crate) use publisher::Publisher;

/// Largest value accepted from (or sent to) a metadata service.
pub const MAX_VALUE_LEN: usize = 16 << 20;
/// Limit on each call to a metadata service.
pub const SERVICE_TIMEOUT: Duration = Duration::from_secs(5);

/// A key-value metadata service holding JSON values.
pub trait MetadataStore: Send + Sync {
    /// The service's address as given, with any password hidden: for messages.
    fn address(&self) -> &str;
    /// The value under `key`, `None` if there is none (or it aged out).
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>>;
    /// Stores `value` under `key`. With a `ttl` the entry ages out unless put again within it
    /// (an etcd lease kept alive, a redis expiry, an http `ttl_ms`); each put renews it.
    fn put(&self, key: &str, value: &[u8], ttl: Option<Duration>) -> Result<()>;
    /// Removes `key`; removing a key that is not there is not an error.
    fn delete(&self, key: &str) -> Result<()>;
}

impl fmt::Debug for dyn MetadataStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MetadataStore").field("address", &self.address()).finish()
    }
}

/// A parsed metadata connection string.
#[derive(Clone, PartialEq, Eq)]
pub enum ServiceAddress {
    /// No service: the P2P handshake.
    P2PHandshake,
    /// etcd endpoints as `host:port`.
    Etcd(Vec<String>),
    /// A `redis://` URL (credentials and database number included).
    Redis(String),
    /// An `http://` URL of the key-value resource.
    Http(String),
}

impl ServiceAddress {
    /// Parses a connection string; an invalid one is a [`EngineError::Config`] naming it.
    pub fn parse(text: &str) -> Result<Self> {
        let t = text.trim();
        let bad = |why: &str| {
            EngineError::Config(format!("metadata server {:?}: {why}", redact(t).unwrap_or_else(|| t.to_string())))
        };
        if t.eq_ignore_ascii_case(P2P_HANDSHAKE) {
            return Ok(ServiceAddress::P2PHandshake);
        }
        let (scheme, rest) = match t.split_once("://") {
            Some((s, r)) => (s.to_ascii_lowercase(), r),
            // Mooncake takes a bare `host:port[,host:port]` as etcd.
            None if !t.is_empty() && t.split(',').all(|e| valid_host_port(e.trim())) => ("etcd".to_string(), t),
            None => return Err(bad("use P2PHANDSHAKE, etcd://host:port, redis://host:port or http://host:port/path")),
        };
        match scheme.as_str() {
            "etcd" => {
                let endpoints: Vec<String> =
                    rest.trim_end_matches('/').split(',').map(|e| e.trim().to_string()).collect();
                if endpoints.iter().any(|e| !valid_host_port(e)) {
                    return Err(bad("every etcd endpoint must be host:port"));
                }
                Ok(ServiceAddress::Etcd(endpoints))
            }
            "redis" => {
                redis::check_url(t).map_err(|e| bad(&e))?;
                Ok(ServiceAddress::Redis(t.to_string()))
            }
            "http" => {
                let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
                let host_port = authority.rsplit('@').next().unwrap_or("");
                if host_port.is_empty() || rest.contains(['?', '#']) {
                    return Err(bad("expected http://host:port/path without a query"));
                }
                Ok(ServiceAddress::Http(t.to_string()))
            }
            "rediss" | "https" | "etcds" => Err(bad("TLS is not supported by this build")),
            _ => Err(bad("unknown scheme (use etcd://, redis:// or http://)")),
        }
    }

    /// Connects to the service and checks that it answers; `None` for P2P handshake.
    ///
    /// An unreachable service is a [`EngineError::MetadataUnavailable`] naming the address.
    pub fn connect(&self) -> Result<Option<Arc<dyn MetadataStore>>> {
        let store: Arc<dyn MetadataStore> = match self {
            ServiceAddress::P2PHandshake => return Ok(None),
            ServiceAddress::Etcd(endpoints) => Arc::new(etcd::EtcdStore::connect(endpoints, &self.to_string())?),
            ServiceAddress::Redis(url) => Arc::new(redis::RedisStore::connect(url, &self.to_string())?),
            ServiceAddress::Http(url) => Arc::new(http::HttpStore::connect(url)?),
        };
        Ok(Some(store))
    }
}

/// Shows the address with any password replaced by `***`.
impl fmt::Display for ServiceAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServiceAddress::P2PHandshake => f.write_str(P2P_HANDSHAKE),
            ServiceAddress::Etcd(e) => write!(f, "etcd://{}", e.join(",")),
            ServiceAddress::Redis(u) | ServiceAddress::Http(u) => f.write_str(&redact(u).unwrap_or_else(|| u.clone())),
        }
    }
}

impl fmt::Debug for ServiceAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ServiceAddress({self})")
    }
}

/// `scheme://user:secret@host…` → `scheme://user:***@host…`; `None` when there is no password.
fn redact(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let (userinfo, host) = authority.rsplit_once('@')?;
    let (user, _password) = userinfo.split_once(':')?;
    Some(format!("{scheme}://{user}:***@{host}{tail}"))
}

fn valid_host_port(s: &str) -> bool {
    match s.rsplit_once(':') {
        Some((host, port)) => {
            let host = host.trim_start_matches('[').trim_end_matches(']');
            !host.is_empty() && !host.contains(['/', '@', ' ', ',']) && port.parse::<u16>().is_ok_and(|p| p != 0)
        }
        None => false,
    }
}

/// Mooncake's key layout under one cluster id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    /// Keys of the cluster `cluster_id` (`None` or blank: the shared default cluster).
    pub fn new(cluster_id: Option<&str>) -> Self {
        let id = cluster_id.map(|c| c.trim().trim_matches('/')).unwrap_or("");
        let prefix = if id.is_empty() { "mooncake/".to_string() } else { format!("mooncake/{id}/") };
        Keys { prefix }
    }

    /// Where the descriptor of `segment` lives.
    pub fn descriptor(&self, segment: &str) -> String {
        format!("{}ram/{segment}", self.prefix)
    }

    /// Where the handshake address of `segment` lives.
    pub fn rpc_meta(&self, segment: &str) -> String {
        format!("{}rpc_meta/{segment}", self.prefix)
    }
}

/// The value under an `rpc_meta` key: how to reach a segment's handshake listener.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RpcMeta {
    /// The listener's host.
    pub ip_or_host_name: String,
    /// The listener's port.
    pub rpc_port: u16,
}

impl RpcMeta {
    /// Parses an entry read from a metadata service (untrusted): one without a host or a
    /// port is refused.
    pub fn from_json(bytes: &[u8]) -> Result<Self, String> {
        let m: RpcMeta = serde_json::from_slice(bytes).map_err(|e| format!("not an rpc_meta entry: {e}"))?;
        if m.ip_or_host_name.is_empty() || m.rpc_port == 0 {
            return Err("rpc_meta entry without a host or a port".into());
        }
        Ok(m)
    }
}

/// Reads the descriptor of `name` from `store` and checks it.
pub fn fetch_descriptor(store: &dyn MetadataStore, keys: &Keys, name: &str) -> Result<SegmentDescriptor> {
    let key = keys.descriptor(name);
    let bad =
        |reason: String| EngineError::BadMetadata { address: store.address().to_string(), key: key.clone(), reason };
    let value = store.get(&key)?.ok_or_else(|| EngineError::SegmentNotFound {
        name: name.to_string(),
        address: store.address().to_string(),
        key: key.clone(),
    })?;
    if value.len() > MAX_VALUE_LEN {
        return Err(bad(format!("{} bytes (at most {MAX_VALUE_LEN} accepted)", value.len())));
    }
    let descriptor = SegmentDescriptor::from_json(&value).map_err(bad)?;
    if descriptor.name != name {
        return Err(bad(format!("the descriptor is of segment {:?}", descriptor.name)));
    }
    Ok(descriptor)
}

/// Where an engine finds segments' descriptors and publishes its own: the peers themselves
/// (P2P handshake) or a metadata service.
pub(crate) struct Directory {
    service: Option<Service>,
    /// How connections to peers' handshake listeners authenticate.
    auth: crescent_transports::net::Auth,
}

struct Service {
    store: Arc<dyn MetadataStore>,
    keys: Keys,
    publisher: Publisher,
}

impl Directory {
    /// For `config.metadata_server`: connects to the service and publishes this engine's
    /// segment (`host:port` of its handshake listener). Errors name the service's address.
    pub(crate) fn start(
        config: &EngineConfig,
        auth: &crescent_transports::net::Auth,
        segment: &str,
        rpc: RpcMeta,
        describe: publisher::Describe,
    ) -> Result<Self> {
        let auth = auth.clone();
        let address = ServiceAddress::parse(&config.metadata_server)?;
        let Some(store) = address.connect()? else {
            return Ok(Directory { service: None, auth });
        };
        if config.metadata_ttl.is_zero() {
            return Err(EngineError::Config("metadata TTL must be positive".into()));
        }
        let keys = Keys::new(config.metadata_cluster_id.as_deref());
        let publisher = Publisher::start(store.clone(), &keys, segment, rpc, describe, config.metadata_ttl)?;
        Ok(Directory { service: Some(Service { store, keys, publisher }), auth })
    }

    /// The descriptor of segment `name`, from the service or else from the peer itself.
    pub(crate) fn fetch(&self, name: &str, timeout: Duration) -> Result<SegmentDescriptor> {
        match &self.service {
            Some(s) => fetch_descriptor(s.store.as_ref(), &s.keys, name),
            None => crate::handshake::fetch_descriptor(name, timeout, &self.auth),
        }
    }

    /// Where segment `name`'s handshake listener is (`host:port`): its `rpc_meta` entry in
    /// the service, or with P2P handshake the name itself.
    pub(crate) fn handshake_address(&self, name: &str) -> Result<String> {
        let Some(s) = &self.service else {
            crate::handshake::split_host_port(name)?;
            return Ok(name.to_string());
        };
        let key = s.keys.rpc_meta(name);
        let address = s.store.address().to_string();
        let value = s.store.get(&key)?.ok_or_else(|| EngineError::SegmentNotFound {
            name: name.to_string(),
            address: address.clone(),
            key: key.clone(),
        })?;
        let meta = RpcMeta::from_json(&value).map_err(|reason| EngineError::BadMetadata { address, key, reason })?;
        Ok(if meta.ip_or_host_name.contains(':') {
            format!("[{}]:{}", meta.ip_or_host_name, meta.rpc_port)
        } else {
            format!("{}:{}", meta.ip_or_host_name, meta.rpc_port)
        })
    }

    /// Publishes this engine's current descriptor (its registered regions changed).
    pub(crate) fn publish(&self) {
        if let Some(s) = &self.service {
            s.publisher.publish();
        }
    }
}

fn unavailable(address: &str, reason: impl fmt::Display) -> EngineError {
    EngineError::MetadataUnavailable { address: address.to_string(), reason: reason.to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn connection_strings() {
        use ServiceAddress::*;
        assert_eq!(ServiceAddress::parse("P2PHANDSHAKE").unwrap(), P2PHandshake);
        assert_eq!(ServiceAddress::parse(" p2phandshake ").unwrap(), P2PHandshake);
        assert_eq!(
            ServiceAddress::parse("etcd://10.0.0.1:2379,etcd-b:2379").unwrap(),
            Etcd(vec!["10.0.0.1:2379".into(), "etcd-b:2379".into()])
        );
        assert_eq!(ServiceAddress::parse("10.0.0.1:2379").unwrap(), Etcd(vec!["10.0.0.1:2379".into()]));
        assert_eq!(
            ServiceAddress::parse("redis://u:pw@10.0.0.1:6379/2").unwrap(),
            Redis("redis://u:pw@10.0.0.1:6379/2".into())
        );
        assert_eq!(
            ServiceAddress::parse("http://10.0.0.1:8080/metadata").unwrap(),
            Http("http://10.0.0.1:8080/metadata".into())
        );
        for bad in [
            "",
            "etcd://",
            "etcd://a:1,,b:2",
            "etcd://a",
            "etcd://a:0",
            "redis://",
            "redis://h:notaport",
            "http://",
            "http:///metadata",
            "http://h:1/m?key=x",
            "https://h/m",
            "rediss://h:1",
            "ftp://h:1",
            "nonsense",
        ] {
            let err = ServiceAddress::parse(bad).unwrap_err();
            assert!(err.is_caller_error(), "{bad:?}: {err}");
        }
    }

    #[test]
    fn passwords_never_show() {
        let a = ServiceAddress::parse("redis://alice:s3cret@h:6379/1").unwrap();
        assert_eq!(a.to_string(), "redis://alice:***@h:6379/1");
        assert!(!format!("{a:?}").contains("s3cret"));
        let e = ServiceAddress::parse("redis://alice:s3cret@h:x/1").unwrap_err();
        assert!(!e.to_string().contains("s3cret"), "{e}");
        let a = ServiceAddress::parse("redis://:s3cret@h:6379").unwrap();
        assert_eq!(a.to_string(), "redis://:***@h:6379");
        let a = ServiceAddress::parse("redis://h:6379").unwrap();
        assert_eq!(a.to_string(), "redis://h:6379");
    }

    #[test]
    fn key_layout() {
        let k = Keys::new(None);
        assert_eq!(k.descriptor("10.0.0.1:12345"), "mooncake/ram/10.0.0.1:12345");
        assert_eq!(k.rpc_meta("10.0.0.1:12345"), "mooncake/rpc_meta/10.0.0.1:12345");
        assert_eq!(Keys::new(Some("  ")), k);
        let k = Keys::new(Some("prod-a"));
        assert_eq!(k.descriptor("n:1"), "mooncake/prod-a/ram/n:1");
        assert_eq!(k.rpc_meta("n:1"), "mooncake/prod-a/rpc_meta/n:1");
    }

    #[test]
    fn rpc_meta_roundtrip_and_rejects() {
        let m = RpcMeta { ip_or_host_name: "10.0.0.1".into(), rpc_port: 5 };
        let json = serde_json::to_vec(&m).unwrap();
        assert_eq!(RpcMeta::from_json(&json).unwrap(), m);
        for bad in [
            &br#"{"ip_or_host_name":"","rpc_port":5}"#[..],
            br#"{"ip_or_host_name":"h","rpc_port":0}"#,
            br#"{"ip_or_host_name":"h","rpc_port":70000}"#,
            br#"[]"#,
            b"",
        ] {
            assert!(RpcMeta::from_json(bad).is_err());
        }
    }

    /// A service in memory, for the reading side's checks.
    struct MemStore(parking_lot::Mutex<std::collections::HashMap<String, Vec<u8>>>);

    impl MetadataStore for MemStore {
        fn address(&self) -> &str {
            "mem://"
        }
        fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
            Ok(self.0.lock().get(key).cloned())
        }
        fn put(&self, key: &str, value: &[u8], _ttl: Option<Duration>) -> Result<()> {
            self.0.lock().insert(key.into(), value.into());
            Ok(())
        }
        fn delete(&self, key: &str) -> Result<()> {
            self.0.lock().remove(key);
            Ok(())
        }
    }

    fn mem() -> MemStore {
        MemStore(Default::default())
    }

    #[test]
    fn descriptors_are_checked_on_the_way_in() {
        let (store, keys) = (mem(), Keys::new(Some("c")));
        assert!(matches!(fetch_descriptor(&store, &keys, "a:1"), Err(EngineError::SegmentNotFound { .. })));
        let good = br#"{"name":"a:1","endpoints":[],"buffers":[{"addr":4096,"length":10}]}"#;
        store.put(&keys.descriptor("a:1"), good, None).unwrap();
        assert_eq!(fetch_descriptor(&store, &keys, "a:1").unwrap().buffers.len(), 1);
        store.put(&keys.descriptor("b:1"), good, None).unwrap();
        let err = fetch_descriptor(&store, &keys, "b:1").unwrap_err();
        assert!(err.to_string().contains("a:1"), "{err}");
        let mut huge = br#"{"name":"c:1","endpoints":[],"buffers":[]}"#.to_vec();
        huge.resize(MAX_VALUE_LEN + 1, b' ');
        store.put(&keys.descriptor("c:1"), &huge, None).unwrap();
        let err = fetch_descriptor(&store, &keys, "c:1").unwrap_err();
        assert!(matches!(err, EngineError::BadMetadata { .. }), "{err}");
    }

    proptest! {
        #[test]
        fn arbitrary_values_in_the_service_never_panic(
            bytes in proptest::collection::vec(any::<u8>(), 0..512),
        ) {
            let (store, keys) = (mem(), Keys::new(None));
            store.put(&keys.descriptor("a:1"), &bytes, None).unwrap();
            let is_bad_metadata = matches!(
                fetch_descriptor(&store, &keys, "a:1"),
                Err(EngineError::BadMetadata { .. })
            );
            prop_assert!(is_bad_metadata);
        }

        #[test]
        fn arbitrary_connection_strings_never_panic(s in "\\PC{0,80}") {
            if let Ok(a) = ServiceAddress::parse(&s) {
                let _ = a.to_string();
            }
        }

        #[test]
        fn scheme_like_strings_never_panic(
            scheme in "(etcd|redis|http|rediss|x)",
            rest in "[a-z0-9:@/,.\\[\\]?#%]{0,40}",
        ) {
            let _ = ServiceAddress::parse(&format!("{scheme}://{rest}"));
        }

        #[test]
        fn etcd_endpoint_lists_roundtrip(
            hosts in proptest::collection::vec(("[a-z][a-z0-9.-]{0,12}", 1u16..), 1..4)
        ) {
            let eps: Vec<String> = hosts.iter().map(|(h, p)| format!("{h}:{p}")).collect();
            let parsed = ServiceAddress::parse(&format!("etcd://{}", eps.join(","))).unwrap();
            prop_assert_eq!(parsed, ServiceAddress::Etcd(eps));
        }

        #[test]
        fn arbitrary_rpc_meta_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..128)) {
            let _ = RpcMeta::from_json(&bytes);
        }
    }
}
