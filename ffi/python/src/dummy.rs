//! `MooncakeDistributedStore`'s dummy-client mode (Mooncake's `setup_dummy`): the store
//! object forwards every call to a standalone client (`crescent-client`) on this host instead
//! of owning a segment. Also `init_all` and `alloc_from_mem_pool`, with upstream's return
//! conventions: `setup_dummy` and `init_all` give 0 or -1 (the message in `last_error()`),
//! `alloc_from_mem_pool` an address or 0.

use std::sync::Arc;

use crescent_ffi::store::{DummyClient, DummyConfig};
use crescent_ffi::{fail, store_fail, SetupArgs, Status};
use pyo3::prelude::*;

use crate::Store;

/// `setup_dummy(mem_pool_size, local_buffer_size, server_address)`.
pub(crate) fn setup_dummy(
    store: &Store,
    py: Python<'_>,
    mem_pool_size: u64,
    local_buffer_size: u64,
    server_address: String,
) -> i32 {
    crescent_ffi::clear_last_error();
    if store.client.read().is_some() {
        fail(Status::UnavailableInCurrentStatus, "setup_dummy: already set up; close() first");
        return -1;
    }
    let config = DummyConfig { server_address, mem_pool_size, local_buffer_size, ..DummyConfig::default() };
    match py.detach(|| DummyClient::connect(config)) {
        Ok(d) => {
            let mut slot = store.client.write();
            if slot.is_some() {
                fail(Status::UnavailableInCurrentStatus, "setup_dummy: already set up; close() first");
                return -1;
            }
            *slot = Some(Arc::new(d));
            0
        }
        Err(e) => {
            store_fail(&e);
            -1
        }
    }
}

/// `init_all(protocol, device_name, mount_segment_size)`: upstream's real client set up with
/// its fixed defaults (as `setup("localhost:12345", "127.0.0.1:2379", mount_segment_size,
/// 1 GiB, protocol, device_name)`); -1 when already set up (a dummy client refuses it too).
pub(crate) fn init_all(
    store: &Store,
    py: Python<'_>,
    protocol: String,
    device_name: String,
    mount_segment_size: u64,
) -> i32 {
    crescent_ffi::clear_last_error();
    if store.client.read().is_some() {
        fail(Status::InvalidParams, "init_all: the client is already initialized");
        return -1;
    }
    let args = SetupArgs {
        local_hostname: "localhost:12345".into(),
        metadata_server: "127.0.0.1:2379".into(),
        global_segment_size: mount_segment_size,
        local_buffer_size: 1 << 30,
        protocol,
        rdma_devices: device_name,
        master_server_addr: "127.0.0.1:50051".into(),
        ..SetupArgs::default()
    };
    if store.start(py, args, None) == 0 {
        0
    } else {
        -1
    }
}

/// `alloc_from_mem_pool(size)`: memory shared with the standalone client, or 0.
pub(crate) fn alloc_from_mem_pool(store: &Store, py: Python<'_>, size: u64) -> u64 {
    crescent_ffi::clear_last_error();
    let Some(client) = store.client() else {
        fail(Status::UnavailableInCurrentStatus, "alloc_from_mem_pool: call setup_dummy() first");
        return 0;
    };
    match py.detach(|| client.alloc_from_mem_pool(size)) {
        Ok(addr) => addr,
        Err(e) => {
            store_fail(&e);
            0
        }
    }
}
