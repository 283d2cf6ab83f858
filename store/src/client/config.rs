//! Client configuration: Mooncake's names, from `MOONCAKE_CONFIG_PATH` (JSON) or a builder.
//!
//! Precedence: explicit settings (flags, builder) > the config file (`MOONCAKE_CONFIG_PATH`) or,
//! without one, Mooncake's `MOONCAKE_MASTER`, ... variables (upstream's "method B") > the
//! environment's defaults (`MC_*` variables the transfer engine reads) > built-in defaults.

use std::path::{Path, PathBuf};

use crescent_engine::{parse_size, EngineConfig, TransportKind};
use crescent_transports::net::Keyring;
use serde::Deserialize;

use super::disk;
use crate::client::hot_cache::HotCacheSettings;
use crate::error::{Result, StoreError};

/// Bytes a client contributes to the pool unless configured otherwise (`global_segment_size`):
/// 512 MiB.
pub const DEFAULT_SEGMENT_SIZE: u64 = 512 << 20;
/// Bytes of a client's staging buffer unless configured otherwise (`local_buffer_size`): 128 MiB.
pub const DEFAULT_LOCAL_BUFFER_SIZE: u64 = 128 << 20;

/// Everything a [`super::StoreClient`] is set up with, under Mooncake's names. Build it
/// from [`ClientConfig::default`] with struct update, or from the environment and a
/// Mooncake JSON file ([`ClientConfig::from_env`], [`ClientConfig::apply_file`]).
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Address (or host:port) peers use to reach this client's transfer engine.
    pub local_hostname: Option<String>,
    /// `P2PHANDSHAKE` (default).
    pub metadata_server: String,
    /// The master's gRPC address, `host:port`.
    pub master_server_address: String,
    /// A forced transport (`tcp`, ...); `None` chooses per peer.
    pub protocol: Option<TransportKind>,
    /// RDMA devices (comma-separated), when the rdma transport is present.
    pub device_name: Option<String>,
    /// Bytes this client contributes to the global pool.
    pub global_segment_size: u64,
    /// Registered staging buffer for `put`/`get` of byte values.
    pub local_buffer_size: u64,
    /// Replicas per put unless a call says otherwise.
    pub replica_num: u32,
    /// Heartbeat interval (the master drops a client silent for its TTL, 10 s by default).
    pub ping_interval: std::time::Duration,
    /// Disk tier: values are also persisted under `<root>/<cluster id>/`
    /// (`MOONCAKE_STORAGE_ROOT_DIR`, `storage_root_dir`); `None`: no disk tier.
    pub storage_root_dir: Option<PathBuf>,
    /// Whether the disk tier hears removals at once on an owner stream of its own (the
    /// default; a removal is then answered after its file went), or on pings only, as with a
    /// master that keeps no link for disks: its files of removed objects stay until the next
    /// ping, and reads never serve them meanwhile (tests of that path turn it off).
    pub disk_news_stream: bool,
    /// `cluster_id`; `None`: `MC_METADATA_CLUSTER_ID`, else `default`.
    pub cluster_id: Option<String>,
    /// Bytes the disk tier may use (`storage_capacity`); `None`: what its files take plus
    /// 90 % of the file system's free space at start.
    pub storage_capacity: Option<u64>,
    /// Writer threads of the disk tier (`disk_writer_threads`).
    pub disk_writer_threads: usize,
    /// Bytes of values waiting to be written before offloads are dropped (`disk_queue_size`).
    pub disk_queue_bytes: u64,
    /// Flush each file before renaming it into place, and the rename before the master hears
    /// of the file (`disk_fsync`, default true).
    pub disk_fsync: bool,
    /// What one flush covers (`disk_fsync_scope`: `filesystem`, the default, or `file`; see
    /// [`disk::FsyncScope`]).
    pub disk_fsync_scope: disk::FsyncScope,
    /// Bytes of removed files kept to be written over by later offloads (`disk_recycle_size`,
    /// default 1 GiB; 0 turns it off).
    pub disk_recycle_bytes: u64,
    /// Disk writers write and flush through io_uring where the kernel has it (`disk_io_uring`,
    /// default true; false: plain system calls).
    pub disk_io_uring: bool,
    /// The local hot cache (`LOCAL_HOT_CACHE_SIZE`, ...): off unless a size is set.
    pub hot_cache: HotCacheSettings,
    /// `host:port` of the client's Prometheus endpoint (`GET /metrics`;
    /// `CRESCENT_CLIENT_METRICS_ADDRESS`, `client_metrics_address`); `None`: no endpoint.
    pub metrics_address: Option<String>,
    /// The cluster secret(s) (config key `cluster_secret_file`: a file of one line, or two
    /// during a rotation); `None`: the environment's (`CRESCENT_CLUSTER_SECRET_FILE`,
    /// `CRESCENT_CLUSTER_SECRET`, `CRESCENT_CLUSTER_SECRET_NEXT`), if any. Every connection of
    /// the client's engine and disk service, and its calls to the master, prove it.
    pub cluster_secret: Option<Keyring>,
    /// The client's tenant (upstream's `tenant_id`; `MOONCAKE_TENANT_ID`): it sees, reads,
    /// writes and removes only its tenant's keys, and its segment holds only them (see
    /// [`crate::master::tenant`]). With a cluster secret, the token it sends names it, so the
    /// master believes it; without one, it is the client's word. Default `default`.
    pub tenant_id: String,
    /// A put that fails because the master went away, changed or is not the leader is put
    /// again once a master answers, for this long at most (`master_failover_timeout_ms`).
    pub master_failover_timeout: std::time::Duration,
    /// End-to-end checksums (`verify_checksums`; `CRESCENT_VERIFY_CHECKSUMS=1`; default off):
    /// this client takes a CRC-32 of every value it puts (kept by the master with the object),
    /// and a get that reads a whole value whose bytes do not match its object's checksum fails
    /// with [`StoreError::ChecksumMismatch`] (see [`super::checksum`]).
    pub verify_checksums: bool,
    /// How long a call to the master, and connecting to it, may take (`MC_RPC_TIMEOUT_MS`,
    /// `MC_RPC_CONNECT_TIMEOUT_MS`; 30 s and 3 s by default).
    pub rpc_timeouts: super::rpc::RpcTimeouts,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            local_hostname: None,
            metadata_server: crescent_engine::P2P_HANDSHAKE.into(),
            master_server_address: "127.0.0.1:50051".into(),
            protocol: None,
            device_name: None,
            global_segment_size: DEFAULT_SEGMENT_SIZE,
            local_buffer_size: DEFAULT_LOCAL_BUFFER_SIZE,
            replica_num: 1,
            ping_interval: std::time::Duration::from_secs(1),
            disk_news_stream: true,
            storage_root_dir: None,
            cluster_id: None,
            storage_capacity: None,
            disk_writer_threads: disk::DEFAULT_WRITERS,
            disk_queue_bytes: disk::DEFAULT_QUEUE_BYTES,
            disk_fsync: true,
            disk_fsync_scope: disk::FsyncScope::default(),
            disk_io_uring: true,
            disk_recycle_bytes: disk::DEFAULT_RECYCLE_BYTES,
            hot_cache: HotCacheSettings::default(),
            metrics_address: None,
            cluster_secret: None,
            tenant_id: crate::protocol::DEFAULT_TENANT.into(),
            master_failover_timeout: std::time::Duration::from_secs(30),
            verify_checksums: false,
            rpc_timeouts: super::rpc::RpcTimeouts::default(),
        }
    }
}

/// A size in a config file: a number of bytes or a string such as `"512MB"`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum SizeValue {
    Bytes(u64),
    Text(String),
}

#[derive(Debug, Deserialize, Default)]
struct FileConfig {
    local_hostname: Option<String>,
    metadata_server: Option<String>,
    master_server_address: Option<String>,
    protocol: Option<String>,
    device_name: Option<String>,
    global_segment_size: Option<SizeValue>,
    local_buffer_size: Option<SizeValue>,
    replica_num: Option<u32>,
    storage_root_dir: Option<String>,
    cluster_id: Option<String>,
    storage_capacity: Option<SizeValue>,
    disk_writer_threads: Option<usize>,
    disk_queue_size: Option<SizeValue>,
    disk_fsync: Option<bool>,
    disk_fsync_scope: Option<String>,
    disk_io_uring: Option<bool>,
    disk_recycle_size: Option<SizeValue>,
    local_hot_cache_size: Option<serde_json::Value>,
    local_hot_block_size: Option<serde_json::Value>,
    local_hot_cache_admission: Option<String>,
    local_hot_cache_fill: Option<String>,
    client_metrics_address: Option<String>,
    cluster_secret_file: Option<String>,
    tenant_id: Option<String>,
    master_failover_timeout_ms: Option<u64>,
    verify_checksums: Option<bool>,
}

fn size_of(name: &str, v: SizeValue) -> Result<u64> {
    match v {
        SizeValue::Bytes(0) => Err(StoreError::Config(format!("{name} is 0"))),
        SizeValue::Bytes(b) => Ok(b),
        SizeValue::Text(t) => parse_size(&t).map_err(|e| StoreError::Config(format!("{name}: {e}"))),
    }
}

impl ClientConfig {
    /// Defaults, the hot cache's variables and the master's RPC deadlines (`MC_RPC_TIMEOUT_MS`,
    /// `MC_RPC_CONNECT_TIMEOUT_MS`), then `MOONCAKE_STORAGE_ROOT_DIR`, then the JSON
    /// file named by `MOONCAKE_CONFIG_PATH` if set, else Mooncake's `MOONCAKE_*` variables
    /// ([`Self::apply_mooncake_env`]).
    pub fn from_env() -> Result<Self> {
        let mut c = ClientConfig {
            hot_cache: HotCacheSettings::from_env()?,
            rpc_timeouts: super::rpc::RpcTimeouts::from_vars(|name| std::env::var(name).ok())?,
            ..ClientConfig::default()
        };
        if let Ok(addr) = std::env::var(super::metrics::METRICS_ADDRESS_ENV) {
            c.metrics_address = Some(addr.trim().to_string()).filter(|a| !a.is_empty());
        }
        if let Some(on) = super::checksum::verify_from_env(|name| std::env::var(name).ok())? {
            c.verify_checksums = on;
        }
        if let Ok(root) = std::env::var("MOONCAKE_STORAGE_ROOT_DIR") {
            if !root.trim().is_empty() {
                c.storage_root_dir = Some(PathBuf::from(root.trim()));
            }
        }
        match std::env::var("MOONCAKE_CONFIG_PATH") {
            Ok(path) if !path.trim().is_empty() => c.apply_file(Path::new(&path))?,
            // Without a config file, Mooncake's "method B" variables (as upstream: a file,
            // when named, is the whole configuration and these are not read).
            _ => c.apply_mooncake_env(|name| std::env::var(name).ok())?,
        }
        Ok(c)
    }

    // ---- Mooncake's "method B": configuration by environment variables ----

    /// Mooncake's client variables (upstream `mooncake_config.py`, `load_from_env`), each
    /// applied when set and not empty: `MOONCAKE_MASTER`, `MOONCAKE_TE_META_DATA_SERVER`,
    /// `MOONCAKE_LOCAL_HOSTNAME`, `MOONCAKE_PROTOCOL`, `MOONCAKE_DEVICE` (empty or
    /// `auto-discovery`: every device), `MOONCAKE_GLOBAL_SEGMENT_SIZE`,
    /// `MOONCAKE_LOCAL_BUFFER_SIZE` (bytes or sizes such as `4gb`), `MOONCAKE_OFFLOAD_ENABLED`
    /// with `MOONCAKE_OFFLOAD_FILE_STORAGE_PATH` (the disk tier's root),
    /// `MOONCAKE_ENABLE_CLIENT_HTTP_SERVER` with `MOONCAKE_CLIENT_HTTP_PORT` (default 9300: the
    /// client's `/metrics` on that port), and `MOONCAKE_TENANT_ID` (the client's tenant,
    /// [`ClientConfig::tenant_id`]). Unset variables keep Crescent's defaults.
    pub fn apply_mooncake_env(&mut self, var: impl Fn(&str) -> Option<String>) -> Result<()> {
        let get = |name: &str| var(name).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
        let flag = |name: &str| -> Result<Option<bool>> {
            match get(name).map(|v| v.to_ascii_lowercase()) {
                None => Ok(None),
                Some(v) if ["true", "1", "yes", "on", "enable"].contains(&v.as_str()) => Ok(Some(true)),
                Some(v) if ["false", "0", "no", "off", "disable"].contains(&v.as_str()) => Ok(Some(false)),
                Some(v) => Err(StoreError::Config(format!("{name}={v:?} is not a boolean (true or false)"))),
            }
        };
        if let Some(v) = get("MOONCAKE_MASTER") {
            self.master_server_address = v;
        }
        if let Some(v) = get("MOONCAKE_TE_META_DATA_SERVER") {
            self.metadata_server = v;
        }
        if let Some(v) = get("MOONCAKE_LOCAL_HOSTNAME") {
            self.local_hostname = Some(v);
        }
        if let Some(v) = get("MOONCAKE_PROTOCOL") {
            self.protocol = Some(
                parse_protocol(&v.to_ascii_lowercase())
                    .map_err(|e| StoreError::Config(format!("MOONCAKE_PROTOCOL: {e}")))?,
            );
        }
        if var("MOONCAKE_DEVICE").is_some() {
            self.device_name = get("MOONCAKE_DEVICE").filter(|d| d != "auto-discovery");
        }
        if let Some(v) = get("MOONCAKE_GLOBAL_SEGMENT_SIZE") {
            self.global_segment_size = size_of("MOONCAKE_GLOBAL_SEGMENT_SIZE", SizeValue::Text(v))?;
        }
        if let Some(v) = get("MOONCAKE_LOCAL_BUFFER_SIZE") {
            self.local_buffer_size = size_of("MOONCAKE_LOCAL_BUFFER_SIZE", SizeValue::Text(v))?;
        }
        if flag("MOONCAKE_OFFLOAD_ENABLED")? == Some(true) {
            let path = get("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH").ok_or_else(|| {
                StoreError::Config("MOONCAKE_OFFLOAD_ENABLED needs MOONCAKE_OFFLOAD_FILE_STORAGE_PATH".into())
            })?;
            self.storage_root_dir = Some(PathBuf::from(path));
        }
        if flag("MOONCAKE_ENABLE_CLIENT_HTTP_SERVER")? == Some(true) {
            let port = get("MOONCAKE_CLIENT_HTTP_PORT").unwrap_or_else(|| "9300".into());
            let port: u16 = port
                .parse()
                .map_err(|_| StoreError::Config(format!("MOONCAKE_CLIENT_HTTP_PORT={port:?} is not a port")))?;
            self.metrics_address = Some(format!("0.0.0.0:{port}"));
        }
        if let Some(t) = get("MOONCAKE_TENANT_ID") {
            self.set_tenant("MOONCAKE_TENANT_ID", &t)?;
        }
        Ok(())
    }

    fn set_tenant(&mut self, name: &str, tenant: &str) -> Result<()> {
        crate::protocol::check_tenant(tenant).map_err(|e| StoreError::Config(format!("{name}: {e}")))?;
        self.tenant_id = tenant.to_string();
        Ok(())
    }

    /// Applies a Mooncake-style JSON config file.
    pub fn apply_file(&mut self, path: &Path) -> Result<()> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| StoreError::Config(format!("cannot read config file {}: {e}", path.display())))?;
        self.apply_json(&text).map_err(|e| StoreError::Config(format!("{}: {e}", path.display())))
    }

    /// Applies a Mooncake-style JSON config given as text: each key present overrides the
    /// field of the same name, sizes may be numbers or strings (`"512MB"`). Unknown keys are
    /// ignored; a value out of range is a [`StoreError::Config`] naming the key.
    pub fn apply_json(&mut self, text: &str) -> Result<()> {
        let f: FileConfig =
            serde_json::from_str(text).map_err(|e| StoreError::Config(format!("invalid JSON config: {e}")))?;
        if let Some(v) = f.local_hostname {
            self.local_hostname = Some(v);
        }
        if let Some(v) = f.metadata_server {
            self.metadata_server = v;
        }
        if let Some(v) = f.master_server_address {
            self.master_server_address = v;
        }
        if let Some(v) = f.protocol {
            self.protocol = Some(parse_protocol(&v)?);
        }
        if let Some(v) = f.device_name {
            self.device_name = Some(v).filter(|d| !d.is_empty());
        }
        if let Some(v) = f.global_segment_size {
            self.global_segment_size = size_of("global_segment_size", v)?;
        }
        if let Some(v) = f.local_buffer_size {
            self.local_buffer_size = size_of("local_buffer_size", v)?;
        }
        if let Some(v) = f.replica_num {
            self.replica_num = v.max(1);
        }
        if let Some(v) = f.storage_root_dir {
            self.storage_root_dir = Some(PathBuf::from(v)).filter(|p| !p.as_os_str().is_empty());
        }
        if let Some(v) = f.cluster_id {
            disk::check_cluster_id(&v)?;
            self.cluster_id = Some(v);
        }
        if let Some(v) = f.storage_capacity {
            self.storage_capacity = Some(size_of("storage_capacity", v)?);
        }
        if let Some(v) = f.disk_writer_threads {
            if v == 0 || v > 64 {
                return Err(StoreError::Config(format!("disk_writer_threads {v}: use 1 to 64")));
            }
            self.disk_writer_threads = v;
        }
        if let Some(v) = f.disk_queue_size {
            self.disk_queue_bytes = size_of("disk_queue_size", v)?;
        }
        if let Some(v) = f.disk_fsync {
            self.disk_fsync = v;
        }
        if let Some(v) = f.disk_fsync_scope {
            self.disk_fsync_scope = v.parse()?;
        }
        if let Some(v) = f.disk_io_uring {
            self.disk_io_uring = v;
        }
        if let Some(v) = f.disk_recycle_size {
            self.disk_recycle_bytes = match v {
                SizeValue::Bytes(0) => 0,
                SizeValue::Text(t) if t.trim() == "0" => 0,
                v => size_of("disk_recycle_size", v)?,
            };
        }
        let hot = &mut self.hot_cache;
        HotCacheSettings::apply_file_value(&mut hot.cache_size, "local_hot_cache_size", f.local_hot_cache_size);
        HotCacheSettings::apply_file_value(&mut hot.block_size, "local_hot_block_size", f.local_hot_block_size);
        if let Some(v) = f.local_hot_cache_admission {
            hot.admission = v.parse().map_err(|e| StoreError::Config(format!("local_hot_cache_admission: {e}")))?;
        }
        if let Some(v) = f.local_hot_cache_fill {
            hot.fill = v.parse().map_err(|e| StoreError::Config(format!("local_hot_cache_fill: {e}")))?;
        }
        if let Some(v) = f.client_metrics_address {
            self.metrics_address = Some(v.trim().to_string()).filter(|a| !a.is_empty());
        }
        if let Some(v) = f.tenant_id.filter(|v| !v.trim().is_empty()) {
            self.set_tenant("tenant_id", v.trim())?;
        }
        if let Some(v) = f.cluster_secret_file.filter(|v| !v.trim().is_empty()) {
            self.cluster_secret = Some(
                Keyring::load(Path::new(v.trim()))
                    .map_err(|e| StoreError::Config(format!("cluster_secret_file: {e}")))?,
            );
        }
        if let Some(v) = f.master_failover_timeout_ms {
            self.master_failover_timeout = std::time::Duration::from_millis(v);
        }
        if let Some(v) = f.verify_checksums {
            self.verify_checksums = v;
        }
        Ok(())
    }

    /// The cluster id: `cluster_id`, else `MC_METADATA_CLUSTER_ID`, else `default` (the disk
    /// tier's directory, and the masters' leader key with an `etcd://` master address).
    pub fn resolved_cluster_id(&self) -> Result<String> {
        let cluster_id = match &self.cluster_id {
            Some(c) => c.clone(),
            None => self.engine_config()?.metadata_cluster_id.unwrap_or_else(|| "default".into()),
        };
        disk::check_cluster_id(&cluster_id)?;
        Ok(cluster_id)
    }

    /// The cluster whose masters' leader an `etcd://` master address looks up: `cluster_id`,
    /// else `MC_METADATA_CLUSTER_ID`, else the masters' default (`mooncake_cluster`, as
    /// `--cluster_id`'s; the disk tier's directory defaults to `default` instead).
    pub fn leader_cluster_id(&self) -> String {
        self.cluster_id
            .clone()
            .or_else(|| std::env::var("MC_METADATA_CLUSTER_ID").ok().filter(|c| !c.trim().is_empty()))
            .unwrap_or_else(|| crate::protocol::DEFAULT_CLUSTER_ID.to_string())
    }

    /// The disk tier's settings, if a storage root is set.
    pub fn disk_config(&self) -> Result<Option<disk::DiskConfig>> {
        let Some(root) = &self.storage_root_dir else { return Ok(None) };
        let cluster_id = self.resolved_cluster_id()?;
        Ok(Some(disk::DiskConfig {
            root: root.clone(),
            cluster_id,
            capacity: self.storage_capacity,
            writers: self.disk_writer_threads,
            queue_bytes: self.disk_queue_bytes,
            fsync: self.disk_fsync.then_some(self.disk_fsync_scope),
            recycle_bytes: self.disk_recycle_bytes,
            io_uring: self.disk_io_uring,
        }))
    }

    /// The transfer engine's configuration for this client.
    pub fn engine_config(&self) -> Result<EngineConfig> {
        let mut e = EngineConfig::from_env()?;
        e.local_hostname = self.local_hostname.clone();
        e.metadata_server = self.metadata_server.clone();
        if self.protocol.is_some() {
            e.protocol = self.protocol;
        }
        // Mooncake's `device_name` (one name or a comma-separated list) overrides `MC_DEVICE`.
        if let Some(devices) = &self.device_name {
            e.rdma.devices = crescent_engine::parse_device_list(devices)
                .map_err(|err| StoreError::Config(format!("device_name {devices:?}: {err}")))?;
        }
        if let Some(k) = &self.cluster_secret {
            e.cluster_secret = Some(k.clone());
        }
        Ok(e)
    }
}

/// Mooncake accepts `tcp` and `rdma`; Crescent also `shm`, and `auto` (or empty) to choose per peer.
pub fn parse_protocol(v: &str) -> Result<TransportKind> {
    v.parse::<TransportKind>().map_err(|e| StoreError::Config(format!("protocol: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mooncake_json_keys_are_read() {
        let mut c = ClientConfig::default();
        c.apply_json(
            r#"{"local_hostname":"10.1.1.1","metadata_server":"P2PHANDSHAKE","master_server_address":"10.1.1.2:50051",
                "protocol":"tcp","device_name":"","global_segment_size":3355443200,"local_buffer_size":"64MB"}"#,
        )
        .unwrap();
        assert_eq!(c.local_hostname.as_deref(), Some("10.1.1.1"));
        assert_eq!(c.master_server_address, "10.1.1.2:50051");
        assert_eq!(c.protocol, Some(TransportKind::Tcp));
        assert_eq!(c.device_name, None);
        assert_eq!(c.global_segment_size, 3_355_443_200);
        assert_eq!(c.local_buffer_size, 64 << 20);
    }

    #[test]
    fn device_name_chooses_the_engines_rdma_devices() {
        let mut c = ClientConfig::default();
        c.apply_json(r#"{"device_name":"mlx5_0,mlx5_1"}"#).unwrap();
        assert_eq!(c.engine_config().unwrap().rdma.devices, vec!["mlx5_0", "mlx5_1"]);
        c.apply_json(r#"{"device_name":"mlx5_0,bad/name"}"#).unwrap();
        let err = c.engine_config().unwrap_err().to_string();
        assert!(err.contains("device_name") && err.contains("bad/name"), "{err}");
    }

    #[test]
    fn disk_tier_keys_are_read() {
        let mut c = ClientConfig::default();
        assert!(c.disk_config().unwrap().is_none(), "no root, no disk tier");
        c.apply_json(
            r#"{"storage_root_dir":"/data/kv","cluster_id":"prod-1","storage_capacity":"2GB",
                "disk_writer_threads":2,"disk_queue_size":"64MB","disk_fsync":false,
                "disk_recycle_size":"256MB","disk_io_uring":false}"#,
        )
        .unwrap();
        let d = c.disk_config().unwrap().unwrap();
        assert_eq!(d.root, PathBuf::from("/data/kv"));
        assert_eq!(d.cluster_id, "prod-1");
        assert_eq!(d.capacity, Some(2 << 30));
        assert_eq!((d.writers, d.queue_bytes, d.fsync), (2, 64 << 20, None), "disk_fsync false: no flushes");
        assert_eq!(d.recycle_bytes, 256 << 20);
        assert!(!d.io_uring);
        c.apply_json(r#"{"disk_recycle_size":0}"#).unwrap();
        assert_eq!(c.disk_config().unwrap().unwrap().recycle_bytes, 0, "0 turns reuse off");
        c.apply_json(r#"{"disk_fsync":true}"#).unwrap();
        assert_eq!(c.disk_config().unwrap().unwrap().fsync, Some(disk::FsyncScope::FileSystem), "the default scope");
        c.apply_json(r#"{"disk_fsync_scope":"file"}"#).unwrap();
        assert_eq!(c.disk_config().unwrap().unwrap().fsync, Some(disk::FsyncScope::File));
        let e = c.apply_json(r#"{"disk_fsync_scope":"sometimes"}"#).unwrap_err().to_string();
        assert!(e.contains("disk_fsync_scope") && e.contains("sometimes"), "{e}");
        let e = c.apply_json(r#"{"cluster_id":"../../etc"}"#).unwrap_err().to_string();
        assert!(e.contains("../../etc"), "{e}");
        assert!(c.apply_json(r#"{"disk_writer_threads":0}"#).is_err());
    }

    #[test]
    fn hot_cache_keys_are_read_from_the_file_and_judged_later() {
        use crate::client::hot_cache::{Admission, FillMode, Layout, Resolved};
        let mut c = ClientConfig::default();
        c.apply_json(r#"{"local_hot_cache_size":838860800,"local_hot_block_size":"16777216","local_hot_cache_admission":"second_access","local_hot_cache_fill":"deferred"}"#)
            .unwrap();
        assert_eq!(
            c.hot_cache.resolve(),
            Resolved::Enabled(Layout {
                blocks: 50,
                block_size: 16 << 20,
                admission: Admission::SecondAccess,
                fill: FillMode::Deferred
            })
        );
        // Sizes take the grammar of the other size keys.
        c.apply_json(r#"{"local_hot_cache_size":"800MB"}"#).unwrap();
        assert_eq!(
            c.hot_cache.resolve(),
            Resolved::Enabled(Layout {
                blocks: 50,
                block_size: 16 << 20,
                admission: Admission::SecondAccess,
                fill: FillMode::Deferred
            })
        );
        // An unusable size is not an error: the client starts without the cache.
        c.apply_json(r#"{"local_hot_cache_size":"800XB"}"#).unwrap();
        assert!(matches!(c.hot_cache.resolve(), Resolved::Disabled { warning: Some(w) } if w.contains("\"800XB\"")));
        assert!(c.apply_json(r#"{"local_hot_cache_admission":"maybe"}"#).is_err());
        assert!(c.apply_json(r#"{"local_hot_cache_fill":"later"}"#).is_err());
        c.apply_json(r#"{"local_hot_cache_fill":"inline"}"#).unwrap();
        assert_eq!(c.hot_cache.fill, FillMode::Inline);
    }

    #[test]
    fn mooncakes_method_b_variables_configure_the_client() {
        fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
            let pairs: Vec<(String, String)> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            move |name| pairs.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
        }
        let mut c = ClientConfig::default();
        c.apply_mooncake_env(env(&[
            ("MOONCAKE_MASTER", "10.0.0.1:50051"),
            ("MOONCAKE_TE_META_DATA_SERVER", "http://10.0.0.1:8080/metadata"),
            ("MOONCAKE_LOCAL_HOSTNAME", "10.0.0.2"),
            ("MOONCAKE_PROTOCOL", "TCP"),
            ("MOONCAKE_DEVICE", ""),
            ("MOONCAKE_GLOBAL_SEGMENT_SIZE", "4gb"),
            ("MOONCAKE_LOCAL_BUFFER_SIZE", "67108864"),
            ("MOONCAKE_OFFLOAD_ENABLED", "true"),
            ("MOONCAKE_OFFLOAD_FILE_STORAGE_PATH", "/nvme/kv"),
            ("MOONCAKE_ENABLE_CLIENT_HTTP_SERVER", "1"),
            ("MOONCAKE_TENANT_ID", "default"),
        ]))
        .unwrap();
        assert_eq!(c.master_server_address, "10.0.0.1:50051");
        assert_eq!(c.metadata_server, "http://10.0.0.1:8080/metadata");
        assert_eq!(c.local_hostname.as_deref(), Some("10.0.0.2"));
        assert_eq!(c.protocol, Some(TransportKind::Tcp), "upstream lowercases the protocol");
        assert_eq!(c.device_name, None);
        assert_eq!((c.global_segment_size, c.local_buffer_size), (4 << 30, 64 << 20));
        assert_eq!(c.storage_root_dir, Some(PathBuf::from("/nvme/kv")));
        assert_eq!(c.metrics_address.as_deref(), Some("0.0.0.0:9300"), "upstream's default client http port");
        // Unset variables leave the defaults; bad values name themselves.
        let mut d = ClientConfig::default();
        d.apply_mooncake_env(env(&[("MOONCAKE_DEVICE", "mlx5_0,mlx5_1")])).unwrap();
        assert_eq!(d.device_name.as_deref(), Some("mlx5_0,mlx5_1"));
        assert_eq!(d.master_server_address, ClientConfig::default().master_server_address);
        assert_eq!(d.tenant_id, "default");
        d.apply_mooncake_env(env(&[("MOONCAKE_TENANT_ID", "team-a")])).unwrap();
        assert_eq!(d.tenant_id, "team-a");
        for bad in [
            &[("MOONCAKE_GLOBAL_SEGMENT_SIZE", "lots")][..],
            &[("MOONCAKE_PROTOCOL", "carrier-pigeon")][..],
            &[("MOONCAKE_OFFLOAD_ENABLED", "maybe")][..],
            &[("MOONCAKE_OFFLOAD_ENABLED", "yes")][..],
            &[("MOONCAKE_TENANT_ID", "_reserved")][..],
        ] {
            let e = ClientConfig::default().apply_mooncake_env(env(bad)).unwrap_err().to_string();
            assert!(e.contains(bad[0].0), "{bad:?}: {e}");
        }
    }

    #[test]
    fn invalid_values_name_themselves() {
        let mut c = ClientConfig::default();
        let e = c.apply_json(r#"{"protocol":"carrier-pigeon"}"#).unwrap_err().to_string();
        assert!(e.contains("carrier-pigeon"), "{e}");
        let e = c.apply_json(r#"{"local_buffer_size":"12XB"}"#).unwrap_err().to_string();
        assert!(e.contains("local_buffer_size") && e.contains("12XB"), "{e}");
        assert!(c.apply_json(r#"{"global_segment_size":0}"#).is_err());
        assert!(c.apply_json("not json").is_err());
    }
}
