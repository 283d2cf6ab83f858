//! `initialize`: the engine started from upstream's arguments.

use crescent_ffi::engine::{EngineConfig, TransferEngine, P2P_HANDSHAKE};
use crescent_ffi::TeCode;
use pyo3::prelude::*;

use super::{te, Engine};

impl Engine {
    /// Starts the engine; 0 or -1.
    pub(super) fn start(
        &self,
        py: Python<'_>,
        local_hostname: &str,
        connection: String,
        protocol: &str,
        device_name: &str,
    ) -> i32 {
        crescent_ffi::clear_last_error();
        if self.engine.read().is_some() {
            return te(TeCode::InvalidArgument, "initialize: already initialized");
        }
        let config = match engine_config(local_hostname, connection, protocol, device_name) {
            Ok(c) => c,
            Err(message) => return te(TeCode::InvalidArgument, format!("initialize: {message}")),
        };
        match py.detach(|| TransferEngine::new(config)) {
            Ok(engine) => {
                let mut slot = self.engine.write();
                if slot.is_some() {
                    return te(TeCode::InvalidArgument, "initialize: already initialized");
                }
                *slot = Some(engine);
                0
            }
            Err(e) => te(TeCode::InvalidArgument, format!("initialize: {e}")),
        }
    }
}

/// The engine's configuration for upstream's `initialize` arguments: a port in
/// `local_hostname` is ignored with P2P handshake (upstream picks a free one) and kept with a
/// metadata service (part of the segment's name there).
fn engine_config(
    local_hostname: &str,
    connection: String,
    protocol: &str,
    device_name: &str,
) -> Result<EngineConfig, String> {
    let mut c = EngineConfig::from_env().map_err(|e| e.to_string())?;
    let p2p = connection.is_empty() || connection.eq_ignore_ascii_case(P2P_HANDSHAKE);
    let host = local_hostname.trim();
    let host = match crescent_ffi::engine::handshake::split_host_port(host) {
        Ok((h, _)) if p2p => h,
        _ => host.to_string(),
    };
    c.local_hostname = Some(host).filter(|h| !h.is_empty());
    c.metadata_server = if p2p { P2P_HANDSHAKE.into() } else { connection };
    if let Some(kind) = crescent_ffi::protocol_of(protocol).map_err(|e| e.to_string())? {
        c.protocol = Some(kind);
    }
    if !device_name.trim().is_empty() {
        c.rdma.devices = crescent_ffi::engine::parse_device_list(device_name).map_err(|e| e.to_string())?;
    }
    Ok(c)
}
