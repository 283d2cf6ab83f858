//! RDMA devices: opening them, choosing the port, GID and MTU, and the per-device protection
//! domain and completion queue (with its completion channel, waited on by the poller).
//!
//! Layer: verbs resources (the layer map is in the [rdma module](super)).

use std::ffi::CStr;
use std::net::Ipv4Addr;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::config::RdmaConfig;
use super::ffi::{self, ibv_comp_channel, ibv_context, ibv_cq, ibv_gid, ibv_pd, Verbs};

/// Most completion queue entries asked for per device.
const MAX_CQE: usize = 65536;

/// MTU enum value (1..=5) from a byte count.
pub fn mtu_enum(bytes: u32) -> Option<u32> {
    match bytes {
        256 => Some(1),
        512 => Some(2),
        1024 => Some(3),
        2048 => Some(4),
        4096 => Some(5),
        _ => None,
    }
}

/// The bytes of a path MTU enum value (`IBV_MTU_256` = 1 … `IBV_MTU_4096` = 5).
pub fn mtu_bytes(value: u32) -> u32 {
    128 << value.clamp(1, 5)
}

/// One opened RDMA device with an active port.
pub struct Device {
    /// The loaded library it was opened through.
    pub verbs: Arc<Verbs>,
    /// Its name (`mlx5_0`, `rxe0`).
    pub name: String,
    /// Position in the transport's device list.
    pub index: usize,
    ctx: *mut ibv_context,
    pub(crate) pd: *mut ibv_pd,
    channel: *mut ibv_comp_channel,
    pub(crate) cq: *mut ibv_cq,
    /// The port used: the configured one (`MC_IB_PORT`), else the first active one.
    pub port: u8,
    /// Service level of its queue pairs (`MC_IB_SL`).
    pub service_level: u8,
    /// Traffic class of its queue pairs' global route header (`MC_IB_TC`).
    pub traffic_class: u8,
    /// The index of [`Self::gid`] in the port's GID table.
    pub gid_index: u8,
    /// The GID its queue pairs are addressed by (on RoCE; InfiniBand routes by the LID).
    pub gid: ibv_gid,
    /// The port's local identifier (InfiniBand).
    pub lid: u16,
    /// `IBV_LINK_LAYER_INFINIBAND` or `IBV_LINK_LAYER_ETHERNET` (RoCE).
    pub link_layer: u8,
    /// Path MTU enum value used for this device's queue pairs (1..=5).
    pub mtu: u32,
    /// Most work requests one queue pair of this device may hold.
    pub max_qp_wr: u32,
    /// Outstanding RDMA reads this device can have as initiator.
    pub max_rd_init: u8,
    /// Outstanding RDMA reads this device can serve as responder.
    pub max_rd_dest: u8,
    /// Work requests that may be outstanding on this device's completion queue.
    pub cq_capacity: usize,
    cq_used: AtomicUsize,
}

// SAFETY: the raw handles are owned by this value and only used through libibverbs calls,
// which are thread-safe for distinct objects and for posting/polling (the library locks).
unsafe impl Send for Device {}
// SAFETY: see `Send`.
unsafe impl Sync for Device {}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("name", &self.name)
            .field("port", &self.port)
            .field("gid_index", &self.gid_index)
            .field("mtu", &mtu_bytes(self.mtu))
            .finish_non_exhaustive()
    }
}

impl Device {
    /// The device's libibverbs context (owned by this value).
    pub fn context(&self) -> *mut ibv_context {
        self.ctx
    }

    /// The completion channel's file descriptor, readable when the completion queue has an
    /// event (the poller sleeps on it).
    pub fn channel_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the channel lives as long as `self`; its fd is open while it does.
        unsafe { BorrowedFd::borrow_raw((*self.channel).fd) }
    }

    pub(crate) fn channel(&self) -> *mut ibv_comp_channel {
        self.channel
    }

    /// Takes up to `want` completion-queue slots; returns how many were taken.
    pub(crate) fn take_cq_room(&self, want: usize) -> usize {
        let mut used = self.cq_used.load(Ordering::Acquire);
        loop {
            let n = want.min(self.cq_capacity.saturating_sub(used));
            if n == 0 {
                return 0;
            }
            match self.cq_used.compare_exchange_weak(used, used + n, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return n,
                Err(now) => used = now,
            }
        }
    }

    pub(crate) fn give_cq_room(&self, n: usize) {
        self.cq_used.fetch_sub(n, Ordering::AcqRel);
    }

    /// The GID as an IPv6-style string (for logs).
    pub fn gid_string(&self) -> String {
        std::net::Ipv6Addr::from(self.gid.raw).to_string()
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: every queue pair and memory region of this device holds an `Arc` to it, so
        // none is left; the poller (which acknowledged every event it got) has stopped.
        unsafe {
            (self.verbs.destroy_cq)(self.cq);
            (self.verbs.destroy_comp_channel)(self.channel);
            (self.verbs.dealloc_pd)(self.pd);
            (self.verbs.close_device)(self.ctx);
        }
    }
}

/// Opens the configured devices (or every device with an active port).
pub fn open_devices(verbs: &Arc<Verbs>, config: &RdmaConfig) -> Result<Vec<Arc<Device>>, String> {
    let mut count = 0;
    // SAFETY: returns a NULL-terminated array we free below, or NULL.
    let list = unsafe { (verbs.get_device_list)(&mut count) };
    if list.is_null() {
        let e = std::io::Error::last_os_error();
        let cause = if e.raw_os_error() == Some(38) {
            "the kernel has no RDMA support".to_string()
        } else {
            format!("listing devices failed: {e}")
        };
        return Err(format!("no RDMA device found{} ({cause})", asked_for(config)));
    }
    let mut names = Vec::new();
    for i in 0..count.max(0) as usize {
        // SAFETY: `list` holds `count` valid device pointers.
        let dev = unsafe { *list.add(i) };
        // SAFETY: a valid device; the name is a NUL-terminated string owned by it.
        let name = unsafe { CStr::from_ptr((verbs.get_device_name)(dev)) }.to_string_lossy().into_owned();
        names.push((name, dev));
    }
    let result = open_selected(verbs, config, &names);
    // SAFETY: opened contexts stay valid after the list is freed (libibverbs refcounts them).
    unsafe { (verbs.free_device_list)(list) };
    result
}

fn asked_for(config: &RdmaConfig) -> String {
    if config.devices.is_empty() {
        String::new()
    } else {
        format!(" (asked for {})", config.devices.join(", "))
    }
}

fn open_selected(
    verbs: &Arc<Verbs>,
    config: &RdmaConfig,
    found: &[(String, *mut ffi::ibv_device)],
) -> Result<Vec<Arc<Device>>, String> {
    if found.is_empty() {
        return Err(format!("no RDMA device found{}", asked_for(config)));
    }
    let wanted: Vec<&str> = if config.devices.is_empty() {
        found.iter().map(|(n, _)| n.as_str()).collect()
    } else {
        config.devices.iter().map(String::as_str).collect()
    };
    let mut devices = Vec::new();
    let mut problems = Vec::new();
    for name in wanted {
        let Some((_, dev)) = found.iter().find(|(n, _)| n == name) else {
            problems.push(format!(
                "{name}: no such device (present: {})",
                found.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>().join(", ")
            ));
            continue;
        };
        match open_one(verbs, config, name, *dev, devices.len()) {
            Ok(d) => devices.push(Arc::new(d)),
            Err(e) => problems.push(format!("{name}: {e}")),
        }
    }
    if devices.is_empty() {
        return Err(format!("no usable RDMA device ({})", problems.join("; ")));
    }
    if !problems.is_empty() {
        tracing::warn!("rdma: some devices are not used: {}", problems.join("; "));
    }
    Ok(devices)
}

struct Opened {
    verbs: Arc<Verbs>,
    ctx: *mut ibv_context,
    pd: *mut ibv_pd,
    channel: *mut ibv_comp_channel,
}

impl Drop for Opened {
    fn drop(&mut self) {
        // SAFETY: releases, in reverse order, what `open_one` created before it failed.
        unsafe {
            if !self.channel.is_null() {
                (self.verbs.destroy_comp_channel)(self.channel);
            }
            if !self.pd.is_null() {
                (self.verbs.dealloc_pd)(self.pd);
            }
            (self.verbs.close_device)(self.ctx);
        }
    }
}

fn open_one(
    verbs: &Arc<Verbs>,
    config: &RdmaConfig,
    name: &str,
    dev: *mut ffi::ibv_device,
    index: usize,
) -> Result<Device, String> {
    let os_err = || std::io::Error::last_os_error();
    // SAFETY: a device from the current device list.
    let ctx = unsafe { (verbs.open_device)(dev) };
    if ctx.is_null() {
        return Err(format!("cannot open: {}", os_err()));
    }
    let mut opened = Opened { verbs: verbs.clone(), ctx, pd: std::ptr::null_mut(), channel: std::ptr::null_mut() };
    // SAFETY: all-zero is valid for this struct of integers; the library fills it.
    let mut attr: ffi::ibv_device_attr = unsafe { std::mem::zeroed() };
    // SAFETY: a valid context and a buffer of the mirrored (checked) size.
    if unsafe { (verbs.query_device)(ctx, &mut attr) } != 0 {
        return Err(format!("query_device failed: {}", os_err()));
    }
    let mut port = None;
    if let Some(p) = config.ib_port {
        if p > attr.phys_port_cnt {
            return Err(format!("has no port {p} (MC_IB_PORT; it has {})", attr.phys_port_cnt));
        }
    }
    let candidates = match config.ib_port {
        Some(p) => p..=p,
        None => 1..=attr.phys_port_cnt,
    };
    for p in candidates {
        // SAFETY: zeroed integers; `PortAttrBuf` leaves spare room after the known fields.
        let mut buf: ffi::PortAttrBuf = unsafe { std::mem::zeroed() };
        // SAFETY: a valid context, an existing port number and a large enough buffer.
        if unsafe { (verbs.query_port)(ctx, p, &mut buf.attr) } == 0 && buf.attr.state == ffi::IBV_PORT_ACTIVE {
            port = Some((p, buf.attr));
            break;
        }
    }
    let (port, pattr) = match (port, config.ib_port) {
        (Some(found), _) => found,
        (None, Some(p)) => return Err(format!("port {p} (MC_IB_PORT) is not active")),
        (None, None) => return Err("no active port".into()),
    };
    let gid_index = match config.gid_index {
        Some(i) => check_gid_index(i, pattr.gid_tbl_len)?,
        None => auto_gid_index(verbs, ctx, name, port, &pattr)?,
    };
    let mut gid = ibv_gid::default();
    // SAFETY: a valid context, port and index; `gid` is 16 writable bytes.
    if unsafe { (verbs.query_gid)(ctx, port, i32::from(gid_index), &mut gid) } != 0 {
        return Err(format!("cannot read GID {gid_index} of port {port}: {}", os_err()));
    }
    if pattr.link_layer == ffi::IBV_LINK_LAYER_ETHERNET && gid.raw == [0; 16] {
        return Err(format!("GID {gid_index} of port {port} is empty (RoCE needs an address on the netdev)"));
    }
    let active = pattr.active_mtu.clamp(1, 5);
    let mtu = match config.mtu {
        Some(bytes) => {
            let want =
                mtu_enum(bytes).ok_or_else(|| format!("MTU {bytes} is not one of 256, 512, 1024, 2048, 4096"))?;
            want.min(active)
        }
        None => active,
    };
    // SAFETY: a valid context.
    let pd = unsafe { (verbs.alloc_pd)(ctx) };
    if pd.is_null() {
        return Err(format!("cannot allocate a protection domain: {}", os_err()));
    }
    opened.pd = pd;
    // SAFETY: a valid context.
    let channel = unsafe { (verbs.create_comp_channel)(ctx) };
    if channel.is_null() {
        return Err(format!("cannot create a completion channel: {}", os_err()));
    }
    opened.channel = channel;
    // SAFETY: the channel is open; its fd is made non-blocking so the poller can wait on it
    // with a timeout and drain it without blocking.
    let fd = unsafe { BorrowedFd::borrow_raw((*channel).fd) };
    rustix::fs::fcntl_setfl(fd, rustix::fs::OFlags::NONBLOCK)
        .map_err(|e| format!("cannot make the completion channel non-blocking: {e}"))?;
    let cqe = (attr.max_cqe.max(1) as usize).min(MAX_CQE);
    // SAFETY: a valid context and channel; no per-CQ context pointer.
    let cq = unsafe { (verbs.create_cq)(ctx, cqe as i32, std::ptr::null_mut(), channel, 0) };
    if cq.is_null() {
        return Err(format!("cannot create a completion queue of {cqe} entries: {}", os_err()));
    }
    // SAFETY: the CQ was just created; the library wrote its real size.
    let cq_capacity = unsafe { (*cq).cqe }.max(1) as usize;
    std::mem::forget(opened);
    let device = Device {
        verbs: verbs.clone(),
        name: name.to_string(),
        index,
        ctx,
        pd,
        channel,
        cq,
        port,
        service_level: config.service_level,
        traffic_class: config.traffic_class,
        gid_index,
        gid,
        lid: pattr.lid,
        link_layer: pattr.link_layer,
        mtu,
        max_qp_wr: attr.max_qp_wr.max(1) as u32,
        max_rd_init: attr.max_qp_init_rd_atom.clamp(1, 16) as u8,
        max_rd_dest: attr.max_qp_rd_atom.clamp(1, 16) as u8,
        cq_capacity,
        cq_used: AtomicUsize::new(0),
    };
    tracing::debug!(
        "rdma: {name} port {port}: GID {gid_index} = {}, LID {}, MTU {}, {} CQ entries",
        device.gid_string(),
        device.lid,
        mtu_bytes(mtu),
        cq_capacity
    );
    Ok(device)
}

/// Checks a GID index asked for (`MC_GID_INDEX`) against the port's GID table of `table_len`
/// entries. A queue pair's address names its source GID in 8 bits (`sgid_index`), so indices
/// above 255 are refused too, never truncated.
pub fn check_gid_index(index: u32, table_len: i32) -> Result<u8, String> {
    if i64::from(index) >= i64::from(table_len) {
        return Err(format!("GID index {index} is out of range (the port has {table_len} GIDs)"));
    }
    u8::try_from(index).map_err(|_| {
        format!("GID index {index} is out of range (queue pairs can use GID indices 0 to {} only)", u8::MAX)
    })
}

/// Picks the GID index: on InfiniBand ports 0; on RoCE ports the best-ranked non-empty GID
/// (RoCE v2 with an IPv4-mapped address, then any RoCE v2, then any other), lowest index first,
/// among the first 256 (those a queue pair can use).
fn auto_gid_index(
    verbs: &Verbs,
    ctx: *mut ibv_context,
    name: &str,
    port: u8,
    pattr: &ffi::ibv_port_attr,
) -> Result<u8, String> {
    if pattr.link_layer != ffi::IBV_LINK_LAYER_ETHERNET {
        return Ok(0);
    }
    let mut best: Option<(u8, u8)> = None;
    let mut empty_run = 0;
    let usable = u8::try_from(pattr.gid_tbl_len.clamp(0, 256) - 1).ok();
    for i in usable.map(|last| 0..=last).into_iter().flatten() {
        let mut gid = ibv_gid::default();
        // SAFETY: a valid context, port and in-range index; 16 writable bytes.
        if unsafe { (verbs.query_gid)(ctx, port, i32::from(i), &mut gid) } != 0 || gid.raw == [0; 16] {
            empty_run += 1;
            // GID tables are filled from the start; a long empty run ends the search.
            if best.is_some() && empty_run >= 8 {
                break;
            }
            continue;
        }
        empty_run = 0;
        let kind = std::fs::read_to_string(format!("/sys/class/infiniband/{name}/ports/{port}/gid_attrs/types/{i}"))
            .unwrap_or_default();
        let rank = gid_rank(&gid.raw, kind.trim());
        if best.is_none_or(|(r, _)| rank > r) {
            best = Some((rank, i));
        }
    }
    best.map(|(_, i)| i).ok_or_else(|| format!("port {port} has no usable GID (no IP address on its netdev?)"))
}

/// Ranks a GID for RoCE: 3 = RoCE v2 + IPv4-mapped, 2 = RoCE v2, 1 = other.
pub fn gid_rank(raw: &[u8; 16], kind: &str) -> u8 {
    let v2 = kind.eq_ignore_ascii_case("RoCE v2");
    let mapped = std::net::Ipv6Addr::from(*raw).to_ipv4_mapped().is_some_and(|v4: Ipv4Addr| !v4.is_unspecified());
    match (v2, mapped) {
        (true, true) => 3,
        (true, false) => 2,
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roce_v2_ipv4_mapped_gids_rank_first() {
        let mapped: [u8; 16] = std::net::Ipv4Addr::new(192, 0, 2, 1).to_ipv6_mapped().octets();
        let link_local: [u8; 16] = "fe80::1".parse::<std::net::Ipv6Addr>().unwrap().octets();
        assert_eq!(gid_rank(&mapped, "RoCE v2"), 3);
        assert_eq!(gid_rank(&link_local, "RoCE v2"), 2);
        assert_eq!(gid_rank(&mapped, "IB/RoCE v1"), 1);
        assert_eq!(gid_rank(&link_local, ""), 1);
    }

    #[test]
    fn gid_indices_beyond_the_table_or_8_bits_are_refused_not_truncated() {
        assert_eq!(check_gid_index(0, 16), Ok(0));
        assert_eq!(check_gid_index(15, 16), Ok(15));
        assert_eq!(check_gid_index(255, 1024), Ok(255));
        for (index, len) in [(16, 16), (0, 0), (3, -1), (256, 1024), (257, 1024), (60_000, 1024), (u32::MAX, i32::MAX)]
        {
            let err = check_gid_index(index, len).unwrap_err();
            assert!(err.contains(&format!("GID index {index} is out of range")), "{index} of {len}: {err}");
        }
    }

    #[test]
    fn mtu_values() {
        assert_eq!(mtu_enum(4096), Some(5));
        assert_eq!(mtu_enum(1024), Some(3));
        assert_eq!(mtu_enum(1500), None);
        assert_eq!(mtu_bytes(3), 1024);
        assert_eq!(mtu_bytes(5), 4096);
    }
}
