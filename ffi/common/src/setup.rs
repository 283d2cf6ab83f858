//! Mooncake's `setup(...)` arguments, positional or as a dict, turned into a client config.

use crescent_engine::{parse_size, TransportKind, P2P_HANDSHAKE};
use crescent_store::{ClientConfig, StoreError};

/// Mooncake's defaults for the two sizes when `setup` is called without them: 16 MiB each.
pub const DEFAULT_GLOBAL_SEGMENT_SIZE: u64 = 16 << 20;
pub const DEFAULT_LOCAL_BUFFER_SIZE: u64 = 16 << 20;
/// Mooncake's default port of the client's HTTP endpoint (`client_http_port`).
pub const DEFAULT_CLIENT_HTTP_PORT: i64 = 9300;
/// Mooncake's bounds of a non-zero size: 1 KiB, and 1 TiB for the local buffer.
pub const MIN_SEGMENT_SIZE: u64 = 1 << 10;
pub const MAX_LOCAL_BUFFER_SIZE: u64 = 1 << 40;
/// Mooncake's range of ports a client picks from when `local_hostname` names none
/// (`MC_STORE_CLIENT_MIN_PORT` / `MC_STORE_CLIENT_MAX_PORT`).
pub const DEFAULT_CLIENT_PORTS: (u16, u16) = (12300, 14300);

/// The arguments of Mooncake's `MooncakeDistributedStore.setup`, in its order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetupArgs {
    /// Address peers use to reach this client (`host` or `host:port`); empty: the first
    /// non-loopback IPv4 address. Without a port, one is picked in 12300–14300.
    pub local_hostname: String,
    /// `P2PHANDSHAKE` (empty means the same), `etcd://…`, `redis://…` or `http://…`.
    pub metadata_server: String,
    /// Bytes contributed to the pool; 0: a pure consumer that contributes none.
    pub global_segment_size: u64,
    /// Bytes of the staging buffer of `put` / `get` of byte values; 0: none (those calls
    /// fail; the zero-copy calls work).
    pub local_buffer_size: u64,
    /// `tcp`, `rdma`, `shm`, or empty / `auto` to choose per peer.
    pub protocol: String,
    /// RDMA devices, comma-separated (empty or `auto-discovery`: any).
    pub rdma_devices: String,
    /// The master's `host:port`.
    pub master_server_addr: String,
    /// Mooncake's SSD offload: Crescent's disk tier, rooted at `ssd_offload_path` (or at
    /// `MOONCAKE_STORAGE_ROOT_DIR` when the path is empty).
    pub enable_ssd_offload: bool,
    pub ssd_offload_path: String,
    /// The client's tenant (`default` unless given; empty: the environment's or config file's).
    pub tenant_id: String,
    /// Serve the client's metrics over HTTP (`GET /metrics`) on `client_http_port`.
    pub enable_client_http_server: bool,
    pub client_http_port: i64,
}

impl Default for SetupArgs {
    fn default() -> Self {
        SetupArgs {
            local_hostname: String::new(),
            metadata_server: P2P_HANDSHAKE.into(),
            global_segment_size: DEFAULT_GLOBAL_SEGMENT_SIZE,
            local_buffer_size: DEFAULT_LOCAL_BUFFER_SIZE,
            protocol: "tcp".into(),
            rdma_devices: String::new(),
            master_server_addr: "127.0.0.1:50051".into(),
            enable_ssd_offload: false,
            ssd_offload_path: String::new(),
            tenant_id: "default".into(),
            enable_client_http_server: false,
            client_http_port: DEFAULT_CLIENT_HTTP_PORT,
        }
    }
}

/// A size of the dict form: as the engine's sizes, and, as upstream's, zero too (`"0"`,
/// `"0MB"`): a client that contributes no segment, or has no local buffer.
fn size(name: &str, value: &str) -> Result<u64, StoreError> {
    let t = value.trim();
    let unit = t.trim_start_matches(|c: char| c.is_ascii_digit());
    let zero = unit.len() < t.len() && t[..t.len() - unit.len()].bytes().all(|b| b == b'0');
    if zero && parse_size(&format!("1{unit}")).is_ok() {
        return Ok(0);
    }
    parse_size(value).map_err(|e| StoreError::Config(format!("{name}: {e}")))
}

fn boolean(name: &str, value: &str) -> Result<bool, StoreError> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" | "" => Ok(false),
        _ => Err(StoreError::Config(format!("{name}: {value:?} is not a boolean"))),
    }
}

/// `""` and `auto` choose per peer; otherwise a transport name.
pub fn protocol_of(value: &str) -> Result<Option<TransportKind>, StoreError> {
    match value.trim() {
        "" | "auto" => Ok(None),
        v => crescent_store::client::config::parse_protocol(v).map(Some),
    }
}

/// Whether `host` names a port (`h:p`, `[v6]:p`); a bare IPv6 address does not.
fn has_port(host: &str) -> bool {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split_once(']').is_some_and(|(_, tail)| tail.starts_with(':'));
    }
    host.matches(':').count() == 1
}

/// Mooncake's rule for the range a client's port is picked from: both ends within
/// 1024–65535, outside the ephemeral ports (32768–60999), in order; otherwise the default.
pub fn client_port_range(min: Option<&str>, max: Option<&str>) -> (u16, u16) {
    let parse = |v: Option<&str>, d: u16| v.map_or(Some(d), |v| v.trim().parse::<u16>().ok());
    let valid = |p: u16| p >= 1024 && !(32768..=60999).contains(&p);
    match (parse(min, DEFAULT_CLIENT_PORTS.0), parse(max, DEFAULT_CLIENT_PORTS.1)) {
        (Some(lo), Some(hi)) if valid(lo) && valid(hi) && lo <= hi => (lo, hi),
        _ => {
            tracing::warn!(
                "invalid client port range [{min:?}, {max:?}], using [{}, {}]",
                DEFAULT_CLIENT_PORTS.0,
                DEFAULT_CLIENT_PORTS.1
            );
            DEFAULT_CLIENT_PORTS
        }
    }
}

/// A port of `range` that could be bound on all addresses just now, picked at random as
/// Mooncake does (up to 20 tries).
fn pick_port((lo, hi): (u16, u16)) -> Result<u16, StoreError> {
    use rand::Rng;
    let mut rng = rand::rng();
    for _ in 0..20 {
        let port = rng.random_range(lo..=hi);
        if std::net::TcpListener::bind(("0.0.0.0", port)).is_ok() {
            return Ok(port);
        }
    }
    Err(StoreError::Config(format!("no free port in {lo}-{hi} for this client (20 tries)")))
}

impl SetupArgs {
    /// Mooncake's `setup(dict)`: its keys (also `device_name` for `rdma_devices` and
    /// `master_server_address` for `master_server_addr`), values as strings (sizes also like
    /// `"512MB"`). `local_hostname` and `metadata_server` are required, as in Mooncake; other
    /// keys keep their defaults; keys Mooncake ignores are ignored (with a warning).
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<Self, StoreError> {
        let mut args =
            SetupArgs { local_hostname: String::new(), metadata_server: String::new(), ..Default::default() };
        for (key, value) in pairs {
            match key {
                "local_hostname" => args.local_hostname = value.to_string(),
                "metadata_server" => args.metadata_server = value.to_string(),
                "global_segment_size" => args.global_segment_size = size(key, value)?,
                "local_buffer_size" => args.local_buffer_size = size(key, value)?,
                "protocol" => args.protocol = value.to_string(),
                "rdma_devices" | "device_name" => args.rdma_devices = value.to_string(),
                "master_server_addr" | "master_server_address" => args.master_server_addr = value.to_string(),
                "enable_ssd_offload" => args.enable_ssd_offload = boolean(key, value)?,
                "ssd_offload_path" => args.ssd_offload_path = value.to_string(),
                "tenant_id" => args.tenant_id = value.to_string(),
                "enable_client_http_server" => args.enable_client_http_server = boolean(key, value)?,
                "client_http_port" => {
                    args.client_http_port = value
                        .trim()
                        .parse()
                        .map_err(|_| StoreError::Config(format!("client_http_port: {value:?} is not a number")))?
                }
                "ipc_socket_path" => tracing::warn!("setup: ipc_socket_path is for standalone clients; ignored"),
                other => tracing::warn!("setup: unknown key {other:?} ignored"),
            }
        }
        for (key, value) in [("local_hostname", &args.local_hostname), ("metadata_server", &args.metadata_server)] {
            if value.trim().is_empty() {
                return Err(StoreError::Config(format!("setup: {key} is required")));
            }
        }
        Ok(args)
    }

    /// The checks Mooncake makes of the sizes: each 0 or at least 1 KiB; the local buffer at
    /// most 1 TiB.
    fn check_sizes(&self) -> Result<(), StoreError> {
        let bad = |name: &str, v: u64, limit: &str| {
            Err(StoreError::Config(format!("{name} is {v}: it must be 0 or {limit}")))
        };
        if self.global_segment_size != 0 && self.global_segment_size < MIN_SEGMENT_SIZE {
            return bad("global_segment_size", self.global_segment_size, "at least 1 KiB");
        }
        if self.local_buffer_size != 0 && !(MIN_SEGMENT_SIZE..=MAX_LOCAL_BUFFER_SIZE).contains(&self.local_buffer_size)
        {
            return bad("local_buffer_size", self.local_buffer_size, "between 1 KiB and 1 TiB");
        }
        Ok(())
    }

    /// The client configuration: `MOONCAKE_CONFIG_PATH`'s file (if set) overridden by these
    /// arguments. A `local_hostname` without a port gets one of
    /// `MC_STORE_CLIENT_MIN_PORT`–`MC_STORE_CLIENT_MAX_PORT` (12300–14300), free when picked.
    pub fn client_config(&self) -> Result<ClientConfig, StoreError> {
        self.check_sizes()?;
        if self.master_server_addr.trim().is_empty() {
            return Err(StoreError::Config("master_server_addr is empty".into()));
        }
        let mut c = ClientConfig::from_env()?;
        let tenant = self.tenant_id.trim();
        if !tenant.is_empty() {
            crescent_store::master::access::check_tenant(tenant)
                .map_err(|e| StoreError::Config(format!("tenant_id: {e}")))?;
            c.tenant_id = tenant.to_string();
        }
        let host = self.local_hostname.trim();
        c.local_hostname = if host.is_empty() {
            None
        } else if has_port(host) {
            Some(host.to_string())
        } else {
            let range = client_port_range(
                std::env::var("MC_STORE_CLIENT_MIN_PORT").ok().as_deref(),
                std::env::var("MC_STORE_CLIENT_MAX_PORT").ok().as_deref(),
            );
            let host =
                if host.contains(':') && !host.starts_with('[') { format!("[{host}]") } else { host.to_string() };
            Some(format!("{host}:{}", pick_port(range)?))
        };
        c.metadata_server = match self.metadata_server.trim() {
            "" => P2P_HANDSHAKE.to_string(),
            m => m.to_string(),
        };
        c.global_segment_size = self.global_segment_size;
        c.local_buffer_size = self.local_buffer_size;
        c.protocol = protocol_of(&self.protocol)?;
        c.device_name = Some(self.rdma_devices.trim().to_string()).filter(|d| !d.is_empty() && d != "auto-discovery");
        c.master_server_address = self.master_server_addr.trim().to_string();
        if self.enable_ssd_offload {
            if !self.ssd_offload_path.trim().is_empty() {
                c.storage_root_dir = Some(self.ssd_offload_path.trim().into());
            }
            if c.storage_root_dir.is_none() {
                return Err(StoreError::Config(
                    "enable_ssd_offload needs ssd_offload_path (or MOONCAKE_STORAGE_ROOT_DIR)".into(),
                ));
            }
        }
        if self.enable_client_http_server {
            let port = u16::try_from(self.client_http_port).ok().filter(|p| *p != 0).ok_or_else(|| {
                StoreError::Config(format!("client_http_port {} is not a port (1-65535)", self.client_http_port))
            })?;
            c.metrics_address = Some(format!("0.0.0.0:{port}"));
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn required<'a>(more: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
        let mut pairs = vec![("local_hostname", "10.0.0.1:5000"), ("metadata_server", "P2PHANDSHAKE")];
        pairs.extend_from_slice(more);
        pairs
    }

    #[test]
    fn dict_form_reads_mooncake_keys_and_sizes() {
        let a = SetupArgs::from_pairs(required(&[
            ("global_segment_size", "64MB"),
            ("local_buffer_size", "1048576"),
            ("protocol", "tcp"),
            ("device_name", "mlx5_0"),
            ("master_server_address", "10.0.0.2:50051"),
            ("enable_client_http_server", "True"),
            ("client_http_port", "9400"),
            ("some_future_key", "x"),
        ]))
        .unwrap();
        assert_eq!(a.global_segment_size, 64 << 20);
        assert_eq!(a.local_buffer_size, 1 << 20);
        assert_eq!(a.rdma_devices, "mlx5_0");
        let c = a.client_config().unwrap();
        assert_eq!(c.master_server_address, "10.0.0.2:50051");
        assert_eq!(c.local_hostname.as_deref(), Some("10.0.0.1:5000"));
        assert_eq!(c.protocol, Some(TransportKind::Tcp));
        assert_eq!(c.metadata_server, P2P_HANDSHAKE);
        assert_eq!(c.metrics_address.as_deref(), Some("0.0.0.0:9400"));
    }

    #[test]
    fn bad_values_are_named() {
        let e = SetupArgs::from_pairs(required(&[("global_segment_size", "12XB")])).unwrap_err().to_string();
        assert!(e.contains("global_segment_size") && e.contains("12XB"), "{e}");
        let e = SetupArgs::from_pairs([("metadata_server", "P2PHANDSHAKE")]).unwrap_err().to_string();
        assert!(e.contains("local_hostname"), "{e}");
        let bad = SetupArgs { protocol: "carrier-pigeon".into(), ..Default::default() };
        assert!(bad.client_config().unwrap_err().to_string().contains("carrier-pigeon"));
        assert_eq!(protocol_of("auto").unwrap(), None);
        for bad in [
            SetupArgs { global_segment_size: 1023, ..Default::default() },
            SetupArgs { local_buffer_size: 1, ..Default::default() },
            SetupArgs { local_buffer_size: MAX_LOCAL_BUFFER_SIZE + 1, ..Default::default() },
            SetupArgs { tenant_id: "_reserved".into(), ..Default::default() },
            SetupArgs { enable_client_http_server: true, client_http_port: 70000, ..Default::default() },
            SetupArgs { enable_ssd_offload: true, ..Default::default() },
        ] {
            let e = bad.client_config();
            assert!(matches!(e, Err(StoreError::Config(_))), "{bad:?}: {e:?}");
        }
    }

    /// LMCache's scheduler-side lookup client sets up a pure consumer with sizes of `"0"`.
    #[test]
    fn zero_sizes_of_the_dict_form_are_accepted() {
        for zero in ["0", " 0 ", "00", "0MB", "0 GiB"] {
            let a = SetupArgs::from_pairs(required(&[("global_segment_size", zero), ("local_buffer_size", zero)]))
                .unwrap_or_else(|e| panic!("{zero:?}: {e}"));
            assert_eq!((a.global_segment_size, a.local_buffer_size), (0, 0), "{zero:?}");
        }
        for bad in ["", "0x", "-0", "0.5"] {
            let e = SetupArgs::from_pairs(required(&[("global_segment_size", bad)])).unwrap_err().to_string();
            assert!(e.contains("global_segment_size"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn zero_sizes_are_accepted() {
        let a = SetupArgs { global_segment_size: 0, local_buffer_size: 0, ..Default::default() };
        let c = a.client_config().unwrap();
        assert_eq!((c.global_segment_size, c.local_buffer_size), (0, 0));
    }

    #[test]
    fn a_host_without_port_gets_one_in_mooncakes_range() {
        for host in ["127.0.0.1", "localhost"] {
            let c = SetupArgs { local_hostname: host.into(), ..Default::default() }.client_config().unwrap();
            let name = c.local_hostname.unwrap();
            let (h, port) = name.rsplit_once(':').unwrap();
            assert_eq!(h, host);
            let port: u16 = port.parse().unwrap();
            assert!((12300..=14300).contains(&port), "{name}");
        }
        assert!(has_port("h:1") && has_port("[::1]:5") && !has_port("::1") && !has_port("[::1]") && !has_port("h"));
        assert_eq!(client_port_range(Some("20000"), Some("20010")), (20000, 20010));
        for (lo, hi) in [("20010", "20000"), ("80", "2000"), ("40000", "40001"), ("x", "2000")] {
            assert_eq!(client_port_range(Some(lo), Some(hi)), DEFAULT_CLIENT_PORTS, "{lo}-{hi}");
        }
    }
}
