//! Mooncake's `setup(...)` arguments, positional or as a dict, turned into a client config.

use crescent_engine::{parse_size, TransportKind, P2P_HANDSHAKE};
use crescent_store::{ClientConfig, StoreError};

/// Mooncake's defaults for the two sizes when `setup` is called without them: 16 MiB each.
pub const DEFAULT_GLOBAL_SEGMENT_SIZE: u64 = 16 << 20;
pub const DEFAULT_LOCAL_BUFFER_SIZE: u64 = 16 << 20;

/// The arguments of Mooncake's `MooncakeDistributedStore.setup`, in its order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetupArgs {
    /// Address peers use to reach this client (`host` or `host:port`); empty: the first
    /// non-loopback IPv4 address.
    pub local_hostname: String,
    /// `P2PHANDSHAKE` (empty means the same), `etcd://…`, `redis://…` or `http://…`.
    pub metadata_server: String,
    pub global_segment_size: u64,
    pub local_buffer_size: u64,
    /// `tcp`, `rdma`, `shm`, or empty / `auto` to choose per peer.
    pub protocol: String,
    /// RDMA devices, comma-separated (empty: any).
    pub rdma_devices: String,
    /// The master's `host:port`.
    pub master_server_addr: String,
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
        }
    }
}

fn size(name: &str, value: &str) -> Result<u64, StoreError> {
    match parse_size(value) {
        Ok(0) => Err(StoreError::Config(format!("{name} is 0"))),
        Ok(n) => Ok(n),
        Err(e) => Err(StoreError::Config(format!("{name}: {e}"))),
    }
}

/// `""` and `auto` choose per peer; otherwise a transport name.
pub fn protocol_of(value: &str) -> Result<Option<TransportKind>, StoreError> {
    match value.trim() {
        "" | "auto" => Ok(None),
        v => crescent_store::client::config::parse_protocol(v).map(Some),
    }
}

impl SetupArgs {
    /// Mooncake's `setup(dict)`: keys as in the positional form (also `device_name` for
    /// `rdma_devices` and `master_server_address` for `master_server_addr`); sizes as numbers
    /// or strings such as `"512MB"`. Missing keys keep their defaults; an unknown key is an error
    /// naming it (a typo would otherwise go unnoticed).
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<Self, StoreError> {
        let mut args = SetupArgs::default();
        for (key, value) in pairs {
            match key {
                "local_hostname" => args.local_hostname = value.to_string(),
                "metadata_server" => args.metadata_server = value.to_string(),
                "global_segment_size" => args.global_segment_size = size(key, value)?,
                "local_buffer_size" => args.local_buffer_size = size(key, value)?,
                "protocol" => args.protocol = value.to_string(),
                "rdma_devices" | "device_name" => args.rdma_devices = value.to_string(),
                "master_server_addr" | "master_server_address" => args.master_server_addr = value.to_string(),
                other => {
                    return Err(StoreError::Config(format!(
                        "unknown setup key {other:?} (known: local_hostname, metadata_server, global_segment_size, \
                         local_buffer_size, protocol, rdma_devices, master_server_addr)"
                    )))
                }
            }
        }
        Ok(args)
    }

    /// The client configuration: `MOONCAKE_CONFIG_PATH`'s file (if set) overridden by these
    /// arguments.
    pub fn client_config(&self) -> Result<ClientConfig, StoreError> {
        if self.global_segment_size == 0 {
            return Err(StoreError::Config("global_segment_size is 0".into()));
        }
        if self.local_buffer_size == 0 {
            return Err(StoreError::Config("local_buffer_size is 0".into()));
        }
        if self.master_server_addr.trim().is_empty() {
            return Err(StoreError::Config("master_server_addr is empty".into()));
        }
        let mut c = ClientConfig::from_env()?;
        c.local_hostname = Some(self.local_hostname.trim().to_string()).filter(|h| !h.is_empty());
        c.metadata_server = match self.metadata_server.trim() {
            "" => P2P_HANDSHAKE.to_string(),
            m => m.to_string(),
        };
        c.global_segment_size = self.global_segment_size;
        c.local_buffer_size = self.local_buffer_size;
        c.protocol = protocol_of(&self.protocol)?;
        c.device_name = Some(self.rdma_devices.trim().to_string()).filter(|d| !d.is_empty());
        c.master_server_address = self.master_server_addr.trim().to_string();
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dict_form_reads_mooncake_keys_and_sizes() {
        let a = SetupArgs::from_pairs([
            ("local_hostname", "10.0.0.1"),
            ("global_segment_size", "64MB"),
            ("local_buffer_size", "1048576"),
            ("protocol", "tcp"),
            ("device_name", "mlx5_0"),
            ("master_server_address", "10.0.0.2:50051"),
        ])
        .unwrap();
        assert_eq!(a.global_segment_size, 64 << 20);
        assert_eq!(a.local_buffer_size, 1 << 20);
        assert_eq!(a.rdma_devices, "mlx5_0");
        let c = a.client_config().unwrap();
        assert_eq!(c.master_server_address, "10.0.0.2:50051");
        assert_eq!(c.local_hostname.as_deref(), Some("10.0.0.1"));
        assert_eq!(c.protocol, Some(TransportKind::Tcp));
        assert_eq!(c.metadata_server, P2P_HANDSHAKE);
    }

    #[test]
    fn bad_values_are_named() {
        let e = SetupArgs::from_pairs([("global_segment_size", "12XB")]).unwrap_err().to_string();
        assert!(e.contains("global_segment_size") && e.contains("12XB"), "{e}");
        let e = SetupArgs::from_pairs([("master_addr", "x")]).unwrap_err().to_string();
        assert!(e.contains("master_addr"), "{e}");
        assert!(SetupArgs::from_pairs([("local_buffer_size", "0")]).is_err());
        let bad = SetupArgs { protocol: "carrier-pigeon".into(), ..Default::default() };
        assert!(bad.client_config().unwrap_err().to_string().contains("carrier-pigeon"));
        assert_eq!(protocol_of("auto").unwrap(), None);
    }
}
