//! Engine configuration: defaults, Mooncake's environment variables, and size parsing.

use std::net::Ipv4Addr;
use std::time::Duration;

use crescent_transports::net::Keyring;
use crescent_transports::rdma::RdmaConfig;
use crescent_transports::TransportKind;

use crate::error::{EngineError, Result};

/// The metadata "service" that needs no service: descriptors are asked from the peer itself.
pub const P2P_HANDSHAKE: &str = "P2PHANDSHAKE";

/// How an engine is set up: its address, metadata service, transports and their settings
/// ([`EngineConfig::from_env`] reads Mooncake's `MC_*` variables).
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Host name or IP address peers use to reach this engine, optionally `host:port` to fix
    /// the handshake port. `None`: the first non-loopback IPv4 address, else 127.0.0.1.
    pub local_hostname: Option<String>,
    /// `P2PHANDSHAKE` (default), `etcd://host:port[,host:port…]`,
    /// `redis://[user:pass@]host:port[/db]` or `http://host:port/path`.
    pub metadata_server: String,
    /// Keeps clusters sharing one metadata service apart (`MC_METADATA_CLUSTER_ID`).
    pub metadata_cluster_id: Option<String>,
    /// How long a published descriptor outlives its owner's last renewal (`MC_METADATA_TTL`,
    /// seconds); renewed every third of it.
    pub metadata_ttl: Duration,
    /// A forced transport; `None` chooses automatically per peer.
    pub protocol: Option<TransportKind>,
    /// Handshake port; 0 picks a free one (overridden by a port in `local_hostname`).
    pub rpc_port: u16,
    /// Mooncake's legacy RPC port binding (`MC_LEGACY_RPC_PORT_BINDING`): with a metadata
    /// service (not `P2PHANDSHAKE`) and a `local_hostname` naming no port, the handshake
    /// listens on this port (`MC_HANDSHAKE_PORT`, default 12001) instead of [`Self::rpc_port`].
    pub legacy_rpc_port: Option<u16>,
    /// How long a handshake with a peer (its descriptor, a notification) may take
    /// (`MC_HANDSHAKE_CONNECT_TIMEOUT`, seconds).
    pub handshake_timeout: Duration,
    /// The IPv4 address the tcp transport listens on and publishes (`MC_TCP_BIND_ADDRESS`); also
    /// the engine's address when `local_hostname` is unset. `None`: every interface.
    pub tcp_bind_address: Option<Ipv4Addr>,
    /// Connections per peer for the tcp transport.
    pub tcp_lanes: usize,
    /// Largest slice the tcp transport sends as one frame.
    pub tcp_slice_len: u64,
    /// Threads that copy the shm transport's slices.
    pub shm_copy_threads: usize,
    /// A submission's requests that have not ended by then end `TimedOut`.
    pub transfer_timeout: Duration,
    /// The rdma transport's settings (devices, GID index, MTU, slice size, queue pairs).
    pub rdma: RdmaConfig,
    /// The cluster secret(s) every connection to and from this engine proves it knows
    /// (`CRESCENT_CLUSTER_SECRET_FILE`, `CRESCENT_CLUSTER_SECRET` and
    /// `CRESCENT_CLUSTER_SECRET_NEXT`); `None`: every port is open.
    pub cluster_secret: Option<Keyring>,
    /// The CUDA driver library that device memory is reached through; `None`:
    /// `$CRESCENT_CUDA_DRIVER`, else `libcuda.so.1`. Loaded when a registration first needs
    /// it (a device location, or `*`), so a host without a GPU never loads it for `cpu:N`.
    pub cuda_driver: Option<std::path::PathBuf>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            local_hostname: None,
            metadata_server: P2P_HANDSHAKE.into(),
            metadata_cluster_id: None,
            metadata_ttl: Duration::from_secs(10),
            protocol: None,
            rpc_port: 0,
            legacy_rpc_port: None,
            handshake_timeout: Duration::from_secs(5),
            tcp_bind_address: None,
            tcp_lanes: 2,
            tcp_slice_len: 1 << 20,
            shm_copy_threads: std::thread::available_parallelism().map_or(2, |n| n.get()).min(4),
            transfer_timeout: Duration::from_secs(30),
            rdma: RdmaConfig::default(),
            cluster_secret: None,
            cuda_driver: None,
        }
    }
}

impl EngineConfig {
    /// Defaults, then the environment: `MC_FORCE_TCP=1`, `MC_TCP_LANES` (or
    /// `MC_TCP_LANES_PER_PEER`), `MC_TCP_SLICE_SIZE`, `MC_TCP_BIND_ADDRESS`, `MC_SHM_THREADS`,
    /// `MC_TRANSFER_TIMEOUT` (seconds), `MC_METADATA_CLUSTER_ID`, `MC_METADATA_TTL` (seconds),
    /// `MC_HANDSHAKE_CONNECT_TIMEOUT` (seconds), `MC_LEGACY_RPC_PORT_BINDING` with
    /// `MC_HANDSHAKE_PORT`, and for rdma `MC_DEVICE` (or `MC_TE_FILTERS`: comma-separated device
    /// names), `MC_GID_INDEX`, `MC_MTU`, `MC_SLICE_SIZE`, `MC_NUM_QP_PER_EP`, `MC_IB_PORT`,
    /// `MC_IB_SL`, `MC_IB_TC`, `MC_MAX_WR`, `MC_RETRY_CNT`, `MC_IB_TIMEOUT`, `MC_IB_RETRY_CNT`,
    /// `MC_IBVERBS_LIBRARY`, and the cluster secret (`CRESCENT_CLUSTER_SECRET_FILE`, else `CRESCENT_CLUSTER_SECRET` with
    /// `CRESCENT_CLUSTER_SECRET_NEXT`). Invalid values are errors naming the value.
    pub fn from_env() -> Result<Self> {
        let mut config = EngineConfig::default();
        config.apply_env()?;
        Ok(config)
    }

    /// Overrides the fields that `MC_*` variables set; a malformed value is an
    /// [`EngineError::Config`].
    pub fn apply_env(&mut self) -> Result<()> {
        self.apply_vars(&|name| std::env::var(name).ok())
    }

    /// [`Self::apply_env`] with `var` as the environment (unset and blank values are skipped).
    pub fn apply_vars(&mut self, var: &dyn Fn(&str) -> Option<String>) -> Result<()> {
        let env = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        if let Some(v) = env("MC_FORCE_TCP") {
            if parse_bool("MC_FORCE_TCP", &v)? {
                self.protocol = Some(TransportKind::Tcp);
            }
        }
        // Mooncake's name for the lanes, read when Crescent's is not set.
        for name in ["MC_TCP_LANES_PER_PEER", "MC_TCP_LANES"] {
            if let Some(v) = env(name) {
                self.tcp_lanes = parse_int(name, &v, 1, 64)? as usize;
            }
        }
        if let Some(v) = env("MC_TCP_BIND_ADDRESS") {
            let ip = v
                .trim()
                .parse::<Ipv4Addr>()
                .map_err(|_| EngineError::Config(format!("MC_TCP_BIND_ADDRESS={v:?} is not an IPv4 address")))?;
            self.tcp_bind_address = Some(ip);
        }
        if let Some(v) = env("MC_HANDSHAKE_CONNECT_TIMEOUT") {
            self.handshake_timeout = Duration::from_secs(parse_int("MC_HANDSHAKE_CONNECT_TIMEOUT", &v, 1, 3599)?);
        }
        let handshake_port = match env("MC_HANDSHAKE_PORT") {
            Some(v) => parse_int("MC_HANDSHAKE_PORT", &v, 1, u64::from(u16::MAX))? as u16,
            None => DEFAULT_HANDSHAKE_PORT,
        };
        if env("MC_LEGACY_RPC_PORT_BINDING").is_some() {
            self.legacy_rpc_port = Some(handshake_port);
        }
        if let Some(v) = env("MC_SHM_THREADS") {
            self.shm_copy_threads = v
                .trim()
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=64).contains(n))
                .ok_or_else(|| EngineError::Config(format!("MC_SHM_THREADS={v:?} is not a number from 1 to 64")))?;
        }
        if let Some(v) = env("MC_TCP_SLICE_SIZE") {
            self.tcp_slice_len = parse_size(&v).map_err(|e| EngineError::Config(format!("MC_TCP_SLICE_SIZE: {e}")))?;
        }
        if let Some(v) = env("MC_TRANSFER_TIMEOUT") {
            self.transfer_timeout = parse_seconds("MC_TRANSFER_TIMEOUT", &v)?;
        }
        if let Some(v) = env("MC_METADATA_CLUSTER_ID") {
            self.metadata_cluster_id = Some(v.trim().to_string());
        }
        if let Some(v) = env("MC_METADATA_TTL") {
            self.metadata_ttl = parse_seconds("MC_METADATA_TTL", &v)?;
        }
        if let Some(k) = Keyring::from_vars(var).map_err(|e| EngineError::Config(e.to_string()))? {
            self.cluster_secret = Some(k);
        }
        self.apply_rdma_vars(var)
    }

    /// The rdma settings of [`Self::apply_env`], with `var` as the environment.
    fn apply_rdma_vars(&mut self, var: &dyn Fn(&str) -> Option<String>) -> Result<()> {
        let env = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        let rdma = &mut self.rdma;
        // Mooncake's device allow-list, read when `MC_DEVICE` is not set.
        for name in ["MC_TE_FILTERS", "MC_DEVICE"] {
            if let Some(v) = env(name) {
                rdma.devices = parse_device_list(&v).map_err(|e| EngineError::Config(format!("{name}: {e}")))?;
            }
        }
        if let Some(v) = env("MC_GID_INDEX") {
            // A queue pair names its source GID in 8 bits; the port's table is checked at start.
            rdma.gid_index = Some(parse_int("MC_GID_INDEX", &v, 0, u64::from(u8::MAX))? as u32);
        }
        if let Some(v) = env("MC_MTU") {
            let mtu = parse_int("MC_MTU", &v, 256, 4096)? as u32;
            if !matches!(mtu, 256 | 512 | 1024 | 2048 | 4096) {
                return Err(EngineError::Config(format!("MC_MTU={v:?} is not one of 256, 512, 1024, 2048, 4096")));
            }
            rdma.mtu = Some(mtu);
        }
        if let Some(v) = env("MC_SLICE_SIZE") {
            rdma.max_slice_len = parse_size(&v)
                .ok()
                .filter(|n| *n <= 1 << 30)
                .ok_or_else(|| EngineError::Config(format!("MC_SLICE_SIZE={v:?} is not a size from 1 byte to 1G")))?;
        }
        if let Some(v) = env("MC_NUM_QP_PER_EP") {
            rdma.qps_per_peer = parse_int("MC_NUM_QP_PER_EP", &v, 1, 64)? as usize;
        }
        if let Some(v) = env("MC_IB_TIMEOUT") {
            rdma.ib_timeout = parse_int("MC_IB_TIMEOUT", &v, 1, 31)? as u8;
        }
        if let Some(v) = env("MC_IB_RETRY_CNT") {
            rdma.retry_cnt = parse_int("MC_IB_RETRY_CNT", &v, 0, 7)? as u8;
        }
        if let Some(v) = env("MC_IB_PORT") {
            rdma.ib_port = Some(parse_int("MC_IB_PORT", &v, 1, u64::from(u8::MAX))? as u8);
        }
        if let Some(v) = env("MC_IB_SL") {
            rdma.service_level = parse_int("MC_IB_SL", &v, 0, 15)? as u8;
        }
        if let Some(v) = env("MC_IB_TC") {
            rdma.traffic_class = parse_int("MC_IB_TC", &v, 0, u64::from(u8::MAX))? as u8;
        }
        if let Some(v) = env("MC_MAX_WR") {
            rdma.max_send_wr = parse_int("MC_MAX_WR", &v, 1, u64::from(u16::MAX))? as u32;
        }
        if let Some(v) = env("MC_RETRY_CNT") {
            rdma.max_attempts = parse_int("MC_RETRY_CNT", &v, 1, 127)? as u32;
        }
        if let Some(v) = env("MC_IBVERBS_LIBRARY") {
            rdma.library = Some(v.trim().to_string());
        }
        Ok(())
    }
}

/// Mooncake's default handshake port (`MC_HANDSHAKE_PORT`), used with
/// `MC_LEGACY_RPC_PORT_BINDING`.
pub const DEFAULT_HANDSHAKE_PORT: u16 = 12001;

/// Parses a comma-separated list of RDMA device names (Mooncake's `device_name`).
pub fn parse_device_list(text: &str) -> Result<Vec<String>> {
    let names: Vec<String> = text.split(',').map(str::trim).filter(|n| !n.is_empty()).map(str::to_string).collect();
    for n in &names {
        if n.len() > 64 || !n.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.:".contains(&b)) {
            return Err(EngineError::Config(format!("{n:?} is not an RDMA device name")));
        }
    }
    Ok(names)
}

fn parse_int(name: &str, v: &str, min: u64, max: u64) -> Result<u64> {
    v.trim()
        .parse::<u64>()
        .ok()
        .filter(|n| (min..=max).contains(n))
        .ok_or_else(|| EngineError::Config(format!("{name}={v:?} is not a number from {min} to {max}")))
}

/// A positive number of seconds, at most a year.
fn parse_seconds(name: &str, v: &str) -> Result<Duration> {
    v.trim()
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s > 0.0 && *s <= 365.0 * 86400.0)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| {
            EngineError::Config(format!("{name}={v:?} is not a positive number of seconds (at most a year)"))
        })
}

fn parse_bool(name: &str, v: &str) -> Result<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(EngineError::Config(format!("{name}={v:?} is not a boolean (use 1 or 0)"))),
    }
}

/// Parses a byte size: a number with an optional binary suffix (`K`, `M`, `G`, `T`, with or
/// without `B`/`iB`), e.g. `64K`, `1MiB`, `16m`, `4096`.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, suffix) = t.split_at(split);
    let value: u64 = digits.parse().map_err(|_| format!("{text:?} is not a size (examples: 4096, 64K, 1M, 1G)"))?;
    let shift = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(format!("{text:?} has an unknown unit (use K, M, G or T)")),
    };
    let bytes =
        value.checked_shl(shift).filter(|b| b >> shift == value).ok_or_else(|| format!("{text:?} is too large"))?;
    if bytes == 0 {
        return Err(format!("{text:?} is zero"));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cluster_secret_comes_from_the_variables_given_not_the_process_environment() {
        assert!(std::env::var_os("CRESCENT_CLUSTER_SECRET").is_none(), "run without a secret in the environment");
        let vars =
            |name: &str| (name == "CRESCENT_CLUSTER_SECRET").then(|| "0123456789abcdef0123456789abcdef".to_string());
        let mut c = EngineConfig::default();
        c.apply_vars(&vars).unwrap();
        assert!(c.cluster_secret.is_some());
        let only_next = |name: &str| (name == "CRESCENT_CLUSTER_SECRET_NEXT").then(|| "x".repeat(32));
        assert!(EngineConfig::default().apply_vars(&only_next).is_err(), "the next secret alone is refused");
    }

    #[test]
    fn seconds() {
        assert_eq!(parse_seconds("X", "2").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_seconds("X", " 0.5 ").unwrap(), Duration::from_millis(500));
        for bad in ["", "0", "-1", "nan", "inf", "1e12", "2s"] {
            let err = parse_seconds("MC_METADATA_TTL", bad).unwrap_err();
            assert!(err.to_string().contains("MC_METADATA_TTL"), "{bad:?}: {err}");
        }
    }

    /// Found by the env_values fuzz target: a timeout too large for a `Duration` aborted the
    /// process (`Duration::from_secs_f64` panics) instead of being refused.
    #[test]
    fn a_transfer_timeout_too_large_is_refused() {
        let vars = |name: &str| (name == "MC_TRANSFER_TIMEOUT").then(|| "99922222222222222222222".to_string());
        let err = EngineConfig::default().apply_vars(&vars).unwrap_err();
        assert!(err.to_string().contains("MC_TRANSFER_TIMEOUT"), "{err}");
        let vars = |name: &str| (name == "MC_TRANSFER_TIMEOUT").then(|| "2.5".to_string());
        let mut c = EngineConfig::default();
        c.apply_vars(&vars).unwrap();
        assert_eq!(c.transfer_timeout, Duration::from_millis(2500));
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(65536));
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_size("16m"), Ok(16 << 20));
        assert_eq!(parse_size(" 1G "), Ok(1 << 30));
        for bad in ["", "K", "1X", "-1", "0", "99999999999T", "1.5M"] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
    }

    fn rdma_from(vars: &[(&str, &str)]) -> Result<RdmaConfig> {
        let vars: std::collections::HashMap<String, String> =
            vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let mut config = EngineConfig::default();
        config.apply_rdma_vars(&|name| vars.get(name).cloned())?;
        Ok(config.rdma)
    }

    #[test]
    fn rdma_variables_set_the_rdma_settings() {
        let rdma = rdma_from(&[
            ("MC_DEVICE", "mlx5_0,mlx5_1"),
            ("MC_GID_INDEX", " 3 "),
            ("MC_MTU", "2048"),
            ("MC_SLICE_SIZE", "256K"),
            ("MC_NUM_QP_PER_EP", "4"),
            ("MC_IB_TIMEOUT", "14"),
            ("MC_IB_RETRY_CNT", "0"),
            ("MC_IBVERBS_LIBRARY", "/opt/rdma/libibverbs.so.1"),
        ])
        .unwrap();
        assert_eq!(rdma.devices, vec!["mlx5_0", "mlx5_1"]);
        assert_eq!(rdma.gid_index, Some(3));
        assert_eq!(rdma.mtu, Some(2048));
        assert_eq!(rdma.max_slice_len, 256 << 10);
        assert_eq!(rdma.qps_per_peer, 4);
        assert_eq!(rdma.ib_timeout, 14);
        assert_eq!(rdma.retry_cnt, 0);
        assert_eq!(rdma.library.as_deref(), Some("/opt/rdma/libibverbs.so.1"));
        // Unset or empty: the defaults.
        let defaults = RdmaConfig::default();
        let rdma = rdma_from(&[("MC_GID_INDEX", ""), ("MC_MTU", "  ")]).unwrap();
        assert_eq!((rdma.gid_index, rdma.mtu, rdma.qps_per_peer), (None, None, defaults.qps_per_peer));
        assert_eq!(rdma_from(&[("MC_GID_INDEX", "255")]).unwrap().gid_index, Some(255));
    }

    #[test]
    fn invalid_rdma_variables_are_errors_naming_the_value() {
        for (name, value) in [
            ("MC_GID_INDEX", "256"),
            ("MC_GID_INDEX", "65535"),
            ("MC_GID_INDEX", "-1"),
            ("MC_GID_INDEX", "one"),
            ("MC_MTU", "1500"),
            ("MC_MTU", "8192"),
            ("MC_SLICE_SIZE", "2G"),
            ("MC_SLICE_SIZE", "0"),
            ("MC_NUM_QP_PER_EP", "0"),
            ("MC_NUM_QP_PER_EP", "65"),
            ("MC_IB_TIMEOUT", "0"),
            ("MC_IB_TIMEOUT", "32"),
            ("MC_IB_RETRY_CNT", "8"),
            ("MC_DEVICE", "mlx5_0,bad/name"),
        ] {
            let err = rdma_from(&[(name, value)]).unwrap_err();
            let text = err.to_string();
            let named = if name == "MC_DEVICE" { "bad/name" } else { value };
            assert!(text.contains(named), "{name}={value}: {text}");
            assert!(err.is_caller_error(), "{name}={value}: {text}");
        }
    }

    fn engine_from(vars: &[(&str, &str)]) -> Result<EngineConfig> {
        let vars: std::collections::HashMap<String, String> =
            vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let mut config = EngineConfig::default();
        config.apply_vars(&|name| vars.get(name).cloned())?;
        Ok(config)
    }

    #[test]
    fn mooncake_engine_variables_set_their_settings() {
        let c = engine_from(&[
            ("MC_TCP_BIND_ADDRESS", " 10.0.0.7 "),
            ("MC_HANDSHAKE_CONNECT_TIMEOUT", "12"),
            ("MC_TCP_LANES_PER_PEER", "6"),
            ("MC_TE_FILTERS", "mlx5_2, mlx5_3"),
            ("MC_IB_PORT", "2"),
            ("MC_IB_SL", "3"),
            ("MC_IB_TC", "106"),
            ("MC_MAX_WR", "1024"),
            ("MC_RETRY_CNT", "9"),
        ])
        .unwrap();
        assert_eq!(c.tcp_bind_address, Some(Ipv4Addr::new(10, 0, 0, 7)));
        assert_eq!(c.handshake_timeout, Duration::from_secs(12));
        assert_eq!(c.tcp_lanes, 6);
        assert_eq!(c.rdma.devices, vec!["mlx5_2", "mlx5_3"]);
        assert_eq!(c.rdma.ib_port, Some(2));
        assert_eq!((c.rdma.service_level, c.rdma.traffic_class), (3, 106));
        assert_eq!((c.rdma.max_send_wr, c.rdma.max_attempts), (1024, 9));
        // Crescent's own names win over Mooncake's.
        let c = engine_from(&[
            ("MC_TCP_LANES_PER_PEER", "6"),
            ("MC_TCP_LANES", "3"),
            ("MC_TE_FILTERS", "a"),
            ("MC_DEVICE", "b"),
        ])
        .unwrap();
        assert_eq!((c.tcp_lanes, c.rdma.devices), (3, vec!["b".to_string()]));
        // Unset: the defaults.
        let c = engine_from(&[]).unwrap();
        assert_eq!((c.tcp_bind_address, c.handshake_timeout, c.legacy_rpc_port), (None, Duration::from_secs(5), None));
    }

    #[test]
    fn the_handshake_port_counts_only_with_the_legacy_binding() {
        assert_eq!(engine_from(&[("MC_HANDSHAKE_PORT", "13000")]).unwrap().legacy_rpc_port, None);
        let c = engine_from(&[("MC_LEGACY_RPC_PORT_BINDING", "1"), ("MC_HANDSHAKE_PORT", "13000")]).unwrap();
        assert_eq!(c.legacy_rpc_port, Some(13000));
        let c = engine_from(&[("MC_LEGACY_RPC_PORT_BINDING", "1")]).unwrap();
        assert_eq!(c.legacy_rpc_port, Some(DEFAULT_HANDSHAKE_PORT));
    }

    #[test]
    fn invalid_mooncake_engine_variables_are_errors_naming_them() {
        for (name, value) in [
            ("MC_TCP_BIND_ADDRESS", "eth0"),
            ("MC_TCP_BIND_ADDRESS", "::1"),
            ("MC_HANDSHAKE_CONNECT_TIMEOUT", "0"),
            ("MC_HANDSHAKE_CONNECT_TIMEOUT", "3600"),
            ("MC_HANDSHAKE_PORT", "0"),
            ("MC_HANDSHAKE_PORT", "65536"),
            ("MC_TCP_LANES_PER_PEER", "0"),
            ("MC_TE_FILTERS", "bad/name"),
            ("MC_IB_PORT", "0"),
            ("MC_IB_SL", "16"),
            ("MC_IB_TC", "256"),
            ("MC_MAX_WR", "0"),
            ("MC_MAX_WR", "65536"),
            ("MC_RETRY_CNT", "0"),
            ("MC_RETRY_CNT", "128"),
        ] {
            let err = engine_from(&[(name, value)]).unwrap_err();
            let text = err.to_string();
            assert!(text.contains(name) && text.contains(value), "{name}={value}: {text}");
            assert!(err.is_caller_error(), "{name}={value}: {text}");
        }
    }

    #[test]
    fn device_lists() {
        assert_eq!(parse_device_list("mlx5_0, mlx5_1,,rxe0").unwrap(), vec!["mlx5_0", "mlx5_1", "rxe0"]);
        assert!(parse_device_list("").unwrap().is_empty());
        let err = parse_device_list("mlx5_0,bad/name").unwrap_err();
        assert!(err.to_string().contains("bad/name"), "{err}");
        assert!(err.is_caller_error());
    }
}
