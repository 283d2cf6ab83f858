//! Client configuration: Mooncake's names, from `MOONCAKE_CONFIG_PATH` (JSON) or a builder.
//!
//! Precedence: explicit settings (flags, builder) > the config file > the environment's
//! defaults (`MC_*` variables the transfer engine reads) > built-in defaults.

use std::path::{Path, PathBuf};

use crescent_engine::{parse_size, EngineConfig, TransportKind};
use serde::Deserialize;

use super::disk;
use crate::client::hot_cache::HotCacheSettings;
use crate::error::{Result, StoreError};

pub const DEFAULT_SEGMENT_SIZE: u64 = 512 << 20;
pub const DEFAULT_LOCAL_BUFFER_SIZE: u64 = 128 << 20;

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
    client_metrics_address: Option<String>,
}

fn size_of(name: &str, v: SizeValue) -> Result<u64> {
    match v {
        SizeValue::Bytes(0) => Err(StoreError::Config(format!("{name} is 0"))),
        SizeValue::Bytes(b) => Ok(b),
        SizeValue::Text(t) => parse_size(&t).map_err(|e| StoreError::Config(format!("{name}: {e}"))),
    }
}

impl ClientConfig {
    /// Defaults and the hot cache's variables, then `MOONCAKE_STORAGE_ROOT_DIR`, then the JSON
    /// file named by `MOONCAKE_CONFIG_PATH`, if set.
    pub fn from_env() -> Result<Self> {
        let mut c = ClientConfig { hot_cache: HotCacheSettings::from_env()?, ..ClientConfig::default() };
        if let Ok(addr) = std::env::var(super::metrics::METRICS_ADDRESS_ENV) {
            c.metrics_address = Some(addr.trim().to_string()).filter(|a| !a.is_empty());
        }
        if let Ok(root) = std::env::var("MOONCAKE_STORAGE_ROOT_DIR") {
            if !root.trim().is_empty() {
                c.storage_root_dir = Some(PathBuf::from(root.trim()));
            }
        }
        if let Ok(path) = std::env::var("MOONCAKE_CONFIG_PATH") {
            if !path.trim().is_empty() {
                c.apply_file(Path::new(&path))?;
            }
        }
        Ok(c)
    }

    /// Applies a Mooncake-style JSON config file.
    pub fn apply_file(&mut self, path: &Path) -> Result<()> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| StoreError::Config(format!("cannot read config file {}: {e}", path.display())))?;
        self.apply_json(&text).map_err(|e| StoreError::Config(format!("{}: {e}", path.display())))
    }

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
        if let Some(v) = f.client_metrics_address {
            self.metrics_address = Some(v.trim().to_string()).filter(|a| !a.is_empty());
        }
        Ok(())
    }

    /// The disk tier's settings, if a storage root is set.
    pub fn disk_config(&self) -> Result<Option<disk::DiskConfig>> {
        let Some(root) = &self.storage_root_dir else { return Ok(None) };
        let cluster_id = match &self.cluster_id {
            Some(c) => c.clone(),
            None => self.engine_config()?.metadata_cluster_id.unwrap_or_else(|| "default".into()),
        };
        disk::check_cluster_id(&cluster_id)?;
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
        use crate::client::hot_cache::{Admission, Layout, Resolved};
        let mut c = ClientConfig::default();
        c.apply_json(r#"{"local_hot_cache_size":838860800,"local_hot_block_size":"16777216","local_hot_cache_admission":"second_access"}"#)
            .unwrap();
        assert_eq!(
            c.hot_cache.resolve(),
            Resolved::Enabled(Layout { blocks: 50, block_size: 16 << 20, admission: Admission::SecondAccess })
        );
        // Sizes take the grammar of the other size keys.
        c.apply_json(r#"{"local_hot_cache_size":"800MB"}"#).unwrap();
        assert_eq!(
            c.hot_cache.resolve(),
            Resolved::Enabled(Layout { blocks: 50, block_size: 16 << 20, admission: Admission::SecondAccess })
        );
        // An unusable size is not an error: the client starts without the cache.
        c.apply_json(r#"{"local_hot_cache_size":"800XB"}"#).unwrap();
        assert!(matches!(c.hot_cache.resolve(), Resolved::Disabled { warning: Some(w) } if w.contains("\"800XB\"")));
        assert!(c.apply_json(r#"{"local_hot_cache_admission":"maybe"}"#).is_err());
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
