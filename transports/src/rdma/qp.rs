//! RC queue pairs and their state changes RESET → INIT → RTR → RTS (and → ERR to flush).
//!
//! Layer: verbs resources (the layer map is in the [rdma module](super)).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use super::device::Device;
use super::ffi::{self, ibv_qp, ibv_qp_attr};

/// What one side tells the other about its queue pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpInfo {
    /// The queue-pair number.
    pub qpn: u32,
    /// The first packet sequence number it sends (and the other side expects).
    pub psn: u32,
    /// Its port's local identifier (InfiniBand).
    pub lid: u16,
    /// Its device's GID (RoCE).
    pub gid: [u8; 16],
    /// Path MTU enum value (1..=5).
    pub mtu: u8,
    /// RDMA reads this side serves at once as a responder.
    pub rd_atomic: u8,
}

/// Timing of a queue pair's retransmissions.
#[derive(Debug, Clone, Copy)]
pub struct QpTiming {
    /// Local ACK timeout exponent: 4.096 µs × 2^timeout.
    pub timeout: u8,
    /// Retransmissions before a work request fails with a retry error.
    pub retry_cnt: u8,
}

/// One RC queue pair; destroyed when dropped.
pub struct Qp {
    /// The device it was created on (its protection domain and completion queue).
    pub device: Arc<Device>,
    qp: *mut ibv_qp,
    /// Its queue-pair number.
    pub qpn: u32,
    /// Its initial packet sequence number.
    pub psn: u32,
    /// Path MTU actually used (enum value), once connected.
    mtu: AtomicU32,
}

// SAFETY: the handle is owned by this value; libibverbs serializes posting on a queue pair
// internally, and state changes here are done by one thread at a time (the lane's owner).
unsafe impl Send for Qp {}
// SAFETY: see `Send`.
unsafe impl Sync for Qp {}

fn err(what: &str) -> String {
    format!("{what}: {}", std::io::Error::last_os_error())
}

fn rc_err(what: &str, rc: i32) -> String {
    format!("{what}: {}", std::io::Error::from_raw_os_error(rc))
}

/// A 24-bit starting packet sequence number that differs between queue pairs.
fn initial_psn(qpn: u32) -> u32 {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    (nanos ^ qpn.rotate_left(7) ^ SEQ.fetch_add(0x9e37, Ordering::Relaxed)) & 0x00ff_ffff
}

impl Qp {
    /// Creates an RC queue pair on `device` with room for `depth` outstanding sends.
    pub fn create(device: &Arc<Device>, depth: u32) -> Result<Qp, String> {
        let mut init = ffi::ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: device.cq,
            recv_cq: device.cq,
            srq: std::ptr::null_mut(),
            cap: ffi::ibv_qp_cap {
                max_send_wr: depth,
                max_recv_wr: 1,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: ffi::IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: a valid protection domain and completion queue of the same device.
        let qp = unsafe { (device.verbs.create_qp)(device.pd, &mut init) };
        if qp.is_null() {
            return Err(err(&format!("creating a queue pair on {}", device.name)));
        }
        // SAFETY: a queue pair the library just created.
        let qpn = unsafe { (*qp).qp_num };
        Ok(Qp { device: device.clone(), qp, qpn, psn: initial_psn(qpn), mtu: AtomicU32::new(device.mtu) })
    }

    /// The libibverbs queue pair (owned by this value).
    pub fn raw(&self) -> *mut ibv_qp {
        self.qp
    }

    /// What the peer needs to connect to this queue pair.
    pub fn info(&self) -> QpInfo {
        QpInfo {
            qpn: self.qpn,
            psn: self.psn,
            lid: self.device.lid,
            gid: self.device.gid.raw,
            mtu: self.device.mtu as u8,
            rd_atomic: self.device.max_rd_dest,
        }
    }

    /// The path MTU enum value in use (the smaller of both ends' once connected).
    pub fn mtu(&self) -> u32 {
        self.mtu.load(Ordering::Relaxed)
    }

    fn modify(&self, attr: &mut ibv_qp_attr, mask: i32, what: &str) -> Result<(), String> {
        // SAFETY: a valid queue pair and a fully initialized attribute struct.
        let rc = unsafe { (self.device.verbs.modify_qp)(self.qp, attr, mask) };
        if rc != 0 {
            return Err(rc_err(&format!("queue pair {} to {what}", self.qpn), rc));
        }
        Ok(())
    }

    /// RESET → INIT, allowing the peer's RDMA reads and writes.
    pub fn to_init(&self) -> Result<(), String> {
        let mut a = ibv_qp_attr::zeroed();
        a.qp_state = ffi::IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = self.device.port;
        a.qp_access_flags =
            (ffi::IBV_ACCESS_LOCAL_WRITE | ffi::IBV_ACCESS_REMOTE_READ | ffi::IBV_ACCESS_REMOTE_WRITE) as u32;
        self.modify(
            &mut a,
            ffi::IBV_QP_STATE | ffi::IBV_QP_PKEY_INDEX | ffi::IBV_QP_PORT | ffi::IBV_QP_ACCESS_FLAGS,
            "INIT",
        )
    }

    /// INIT → RTR: addresses the peer's queue pair.
    pub fn to_rtr(&self, remote: &QpInfo) -> Result<(), String> {
        let mtu = self.device.mtu.min(remote.mtu as u32);
        let mut a = ibv_qp_attr::zeroed();
        a.qp_state = ffi::IBV_QPS_RTR;
        a.path_mtu = mtu;
        a.dest_qp_num = remote.qpn;
        a.rq_psn = remote.psn;
        a.max_dest_rd_atomic = self.device.max_rd_dest;
        a.min_rnr_timer = 12;
        a.ah_attr.port_num = self.device.port;
        a.ah_attr.dlid = remote.lid;
        a.ah_attr.sl = self.device.service_level;
        if self.device.link_layer == ffi::IBV_LINK_LAYER_ETHERNET || remote.lid == 0 {
            a.ah_attr.is_global = 1;
            a.ah_attr.grh.dgid.raw = remote.gid;
            a.ah_attr.grh.sgid_index = self.device.gid_index;
            a.ah_attr.grh.hop_limit = 64;
            a.ah_attr.grh.traffic_class = self.device.traffic_class;
        }
        self.modify(
            &mut a,
            ffi::IBV_QP_STATE
                | ffi::IBV_QP_AV
                | ffi::IBV_QP_PATH_MTU
                | ffi::IBV_QP_DEST_QPN
                | ffi::IBV_QP_RQ_PSN
                | ffi::IBV_QP_MAX_DEST_RD_ATOMIC
                | ffi::IBV_QP_MIN_RNR_TIMER,
            "RTR",
        )?;
        self.mtu.store(mtu, Ordering::Relaxed);
        Ok(())
    }

    /// RTR → RTS: retransmission timing and our outstanding reads (at most what the peer serves).
    pub fn to_rts(&self, remote: &QpInfo, timing: QpTiming) -> Result<(), String> {
        let mut a = ibv_qp_attr::zeroed();
        a.qp_state = ffi::IBV_QPS_RTS;
        a.timeout = timing.timeout;
        a.retry_cnt = timing.retry_cnt;
        a.rnr_retry = 7;
        a.sq_psn = self.psn;
        a.max_rd_atomic = self.device.max_rd_init.min(remote.rd_atomic).max(1);
        self.modify(
            &mut a,
            ffi::IBV_QP_STATE
                | ffi::IBV_QP_TIMEOUT
                | ffi::IBV_QP_RETRY_CNT
                | ffi::IBV_QP_RNR_RETRY
                | ffi::IBV_QP_SQ_PSN
                | ffi::IBV_QP_MAX_QP_RD_ATOMIC,
            "RTS",
        )
    }

    /// Moves the queue pair to ERR: every outstanding work request completes flushed.
    pub fn to_error(&self) {
        let mut a = ibv_qp_attr::zeroed();
        a.qp_state = ffi::IBV_QPS_ERR;
        if let Err(e) = self.modify(&mut a, ffi::IBV_QP_STATE, "ERR") {
            tracing::debug!("rdma: {e}");
        }
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: a queue pair created in `create`, destroyed only here; nothing posts to it
        // any more (its owner is being dropped).
        let rc = unsafe { (self.device.verbs.destroy_qp)(self.qp) };
        if rc != 0 {
            tracing::warn!(
                "rdma: destroying queue pair {} failed: {}",
                self.qpn,
                std::io::Error::from_raw_os_error(rc)
            );
        }
    }
}
