//! The rdma transport's settings ([`RdmaConfig`]), read by every layer of it.
//!
//! Layer: settings (the layer map is in the [rdma module](super)).

use std::time::Duration;

/// Settings of the rdma transport.
#[derive(Debug, Clone)]
pub struct RdmaConfig {
    /// libibverbs to load (default `libibverbs.so.1`).
    pub library: Option<String>,
    /// Devices to use (`device_name` / `MC_DEVICE`); empty: every device with an active port.
    pub devices: Vec<String>,
    /// GID index (`MC_GID_INDEX`); `None`: RoCE v2 with an IPv4-mapped address preferred.
    pub gid_index: Option<u32>,
    /// Path MTU in bytes (`MC_MTU`), capped by each port's active MTU; `None`: the active MTU.
    pub mtu: Option<u32>,
    /// The port number used on each device (`MC_IB_PORT`), which must be active; `None`: the
    /// first active port.
    pub ib_port: Option<u8>,
    /// Service level of the queue pairs, 0-15 (`MC_IB_SL`).
    pub service_level: u8,
    /// Traffic class of the queue pairs' global route header (`MC_IB_TC`; RoCE and routed
    /// InfiniBand).
    pub traffic_class: u8,
    /// Address the queue-pair exchange listens on.
    pub bind_host: String,
    /// Host peers use to reach the exchange (published in the descriptor).
    pub advertise_host: String,
    /// Exchange port; 0 picks a free one.
    pub port: u16,
    /// Largest slice (`MC_SLICE_SIZE`).
    pub max_slice_len: u64,
    /// Queue pairs per peer and local device.
    pub qps_per_peer: usize,
    /// Work requests outstanding per queue pair, capped by the device (`MC_MAX_WR`).
    pub max_send_wr: u32,
    /// ACK timeout exponent of each queue pair: 4.096 µs × 2^n (`MC_IB_TIMEOUT`).
    pub ib_timeout: u8,
    /// Retransmissions of each queue pair before its work request fails (`MC_IB_RETRY_CNT`).
    pub retry_cnt: u8,
    /// Attempts per slice (on different queue pairs) before it fails (`MC_RETRY_CNT`).
    pub max_attempts: u32,
    /// How long the poller spins on an empty completion queue before sleeping on events.
    pub poll_spin: Duration,
    /// How long opening the control connection to a peer may take.
    pub connect_timeout: Duration,
    /// The cluster secret both ends of the queue-pair exchange prove they know (none: open).
    pub auth: crate::net::Auth,
    /// Whether to register device memory as a plain pointer when dma-buf registration is not
    /// possible, for a peer-memory kernel module to resolve (GPUDirect RDMA through
    /// nvidia-peermem); `None`: where `/sys/module` lists `nvidia_peermem` or `nv_peer_mem`.
    pub peer_memory: Option<bool>,
}

impl Default for RdmaConfig {
    fn default() -> Self {
        RdmaConfig {
            library: None,
            devices: Vec::new(),
            gid_index: None,
            mtu: None,
            ib_port: None,
            service_level: 0,
            traffic_class: 0,
            bind_host: "0.0.0.0".into(),
            advertise_host: "127.0.0.1".into(),
            port: 0,
            max_slice_len: 64 << 10,
            qps_per_peer: 2,
            max_send_wr: 256,
            ib_timeout: 18,
            retry_cnt: 7,
            max_attempts: 3,
            poll_spin: Duration::from_micros(50),
            connect_timeout: Duration::from_secs(3),
            auth: crate::net::Auth::open(),
            peer_memory: None,
        }
    }
}
