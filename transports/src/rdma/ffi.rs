//! The part of libibverbs' ABI this transport uses, loaded at run time with `dlopen`.
//!
//! The structures mirror `<infiniband/verbs.h>` (rdma-core, ABI `IBVERBS_1.1`, stable since
//! 2016). Only the fields this transport reads or writes are named; the rest is kept as
//! padding of the exact size. `ibv_post_send`, `ibv_poll_cq` and `ibv_req_notify_cq` are
//! `static inline` in the header (they call through `context->ops`), so they are reached the
//! same way here. The test `layouts_match_the_system_header` compiles a C program against
//! the installed header (when there is one) and compares every size and offset used here.
//!
//! Layer: verbs resources (the layer map is in the [rdma module](super)).

// The items mirror <infiniband/verbs.h> one for one, under its names; that header documents them.
#![allow(missing_docs)]
#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

use libloading::Library;

// ---- opaque handles ----

#[repr(C)]
pub struct ibv_device {
    _opaque: [u8; 0],
}

#[repr(C)]
pub struct ibv_pd {
    _opaque: [u8; 0],
}

#[repr(C)]
pub struct ibv_srq {
    _opaque: [u8; 0],
}

// ---- structures with a known layout ----

pub type PollCqFn = unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int;
pub type ReqNotifyCqFn = unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int;
pub type PostSendFn = unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int;

/// `struct ibv_context_ops`: 32 function pointers, of which three are called directly.
#[repr(C)]
pub struct ibv_context_ops {
    _before_poll_cq: [*mut c_void; 11],
    pub poll_cq: Option<PollCqFn>,
    pub req_notify_cq: Option<ReqNotifyCqFn>,
    _before_post_send: [*mut c_void; 12],
    pub post_send: Option<PostSendFn>,
    _after_post_send: [*mut c_void; 6],
}

#[repr(C)]
pub struct ibv_context {
    pub device: *mut ibv_device,
    pub ops: ibv_context_ops,
    pub cmd_fd: c_int,
    pub async_fd: c_int,
    pub num_comp_vectors: c_int,
    // pthread_mutex_t mutex; void *abi_compat; (never touched here)
}

#[repr(C)]
pub struct ibv_comp_channel {
    pub context: *mut ibv_context,
    pub fd: c_int,
    pub refcnt: c_int,
}

#[repr(C)]
pub struct ibv_cq {
    pub context: *mut ibv_context,
    pub channel: *mut ibv_comp_channel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    // mutex, cond, event counters follow (never touched here)
}

#[repr(C)]
pub struct ibv_qp {
    pub context: *mut ibv_context,
    pub qp_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub handle: u32,
    pub qp_num: u32,
    pub state: c_uint,
    pub qp_type: c_uint,
    // mutex, cond, events_completed follow (never touched here)
}

#[repr(C)]
pub struct ibv_mr {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_device_attr {
    pub fw_ver: [c_char; 64],
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: c_int,
    pub max_qp_wr: c_int,
    pub device_cap_flags: c_uint,
    pub max_sge: c_int,
    pub max_sge_rd: c_int,
    pub max_cq: c_int,
    pub max_cqe: c_int,
    pub max_mr: c_int,
    pub max_pd: c_int,
    pub max_qp_rd_atom: c_int,
    pub max_ee_rd_atom: c_int,
    pub max_res_rd_atom: c_int,
    pub max_qp_init_rd_atom: c_int,
    _rest: [c_int; 16],
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_port_attr {
    pub state: c_uint,
    pub max_mtu: c_uint,
    pub active_mtu: c_uint,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
}

/// A buffer for `ibv_query_port`: newer libraries may know more trailing fields than
/// [`ibv_port_attr`] lists, so the library gets room to spare.
#[repr(C)]
pub struct PortAttrBuf {
    pub attr: ibv_port_attr,
    _spare: [u8; 64],
}

/// `union ibv_gid`: 16 bytes, 8-byte aligned (it has a `__be64` view).
#[repr(C, align(8))]
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct ibv_gid {
    pub raw: [u8; 16],
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_global_route {
    pub dgid: ibv_gid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_ah_attr {
    pub grh: ibv_global_route,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_qp_cap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

#[repr(C)]
pub struct ibv_qp_init_attr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub cap: ibv_qp_cap,
    pub qp_type: c_uint,
    pub sq_sig_all: c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_qp_attr {
    pub qp_state: c_uint,
    pub cur_qp_state: c_uint,
    pub path_mtu: c_uint,
    pub path_mig_state: c_uint,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_uint,
    pub cap: ibv_qp_cap,
    pub ah_attr: ibv_ah_attr,
    pub alt_ah_attr: ibv_ah_attr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

impl ibv_qp_attr {
    pub fn zeroed() -> Self {
        // SAFETY: a plain C struct of integers; all-zero is a valid value of every field.
        unsafe { std::mem::zeroed() }
    }
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `struct ibv_send_wr` with the `rdma` member of its `wr` union (the one RDMA READ and
/// WRITE use); the other union members only add padding.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr {
    pub wr_id: u64,
    pub next: *mut ibv_send_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub opcode: c_uint,
    pub send_flags: c_uint,
    pub imm_data: u32,
    pub remote_addr: u64,
    pub rkey: u32,
    _wr_union_rest: [u8; 20],
    _qp_type_and_bind: [u8; 56],
}

impl ibv_send_wr {
    pub fn zeroed() -> Self {
        // SAFETY: integers and raw pointers only; null and zero are valid values.
        unsafe { std::mem::zeroed() }
    }
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_wc {
    pub wr_id: u64,
    pub status: c_uint,
    pub opcode: c_uint,
    pub vendor_err: u32,
    pub byte_len: u32,
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_uint,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

impl ibv_wc {
    pub fn zeroed() -> Self {
        // SAFETY: integers only.
        unsafe { std::mem::zeroed() }
    }
}

// ---- constants ----

pub const IBV_QPS_RESET: c_uint = 0;
pub const IBV_QPS_INIT: c_uint = 1;
pub const IBV_QPS_RTR: c_uint = 2;
pub const IBV_QPS_RTS: c_uint = 3;
pub const IBV_QPS_ERR: c_uint = 6;

pub const IBV_QPT_RC: c_uint = 2;

pub const IBV_QP_STATE: c_int = 1 << 0;
pub const IBV_QP_ACCESS_FLAGS: c_int = 1 << 3;
pub const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
pub const IBV_QP_PORT: c_int = 1 << 5;
pub const IBV_QP_AV: c_int = 1 << 7;
pub const IBV_QP_PATH_MTU: c_int = 1 << 8;
pub const IBV_QP_TIMEOUT: c_int = 1 << 9;
pub const IBV_QP_RETRY_CNT: c_int = 1 << 10;
pub const IBV_QP_RNR_RETRY: c_int = 1 << 11;
pub const IBV_QP_RQ_PSN: c_int = 1 << 12;
pub const IBV_QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
pub const IBV_QP_MIN_RNR_TIMER: c_int = 1 << 15;
pub const IBV_QP_SQ_PSN: c_int = 1 << 16;
pub const IBV_QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
pub const IBV_QP_DEST_QPN: c_int = 1 << 20;

pub const IBV_ACCESS_LOCAL_WRITE: c_int = 1;
pub const IBV_ACCESS_REMOTE_WRITE: c_int = 1 << 1;
pub const IBV_ACCESS_REMOTE_READ: c_int = 1 << 2;

pub const IBV_WR_RDMA_WRITE: c_uint = 0;
pub const IBV_WR_RDMA_READ: c_uint = 4;
pub const IBV_SEND_SIGNALED: c_uint = 1 << 1;

pub const IBV_WC_SUCCESS: c_uint = 0;
pub const IBV_WC_LOC_LEN_ERR: c_uint = 1;
pub const IBV_WC_LOC_PROT_ERR: c_uint = 4;
pub const IBV_WC_WR_FLUSH_ERR: c_uint = 5;
pub const IBV_WC_LOC_ACCESS_ERR: c_uint = 8;
pub const IBV_WC_REM_INV_REQ_ERR: c_uint = 9;
pub const IBV_WC_REM_ACCESS_ERR: c_uint = 10;

pub const IBV_PORT_ACTIVE: c_uint = 4;
pub const IBV_LINK_LAYER_INFINIBAND: u8 = 1;
pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;

// ---- the library ----

/// The functions of libibverbs this transport calls, resolved from a `dlopen`ed library.
pub struct Verbs {
    pub get_device_list: unsafe extern "C" fn(*mut c_int) -> *mut *mut ibv_device,
    pub free_device_list: unsafe extern "C" fn(*mut *mut ibv_device),
    pub get_device_name: unsafe extern "C" fn(*mut ibv_device) -> *const c_char,
    pub open_device: unsafe extern "C" fn(*mut ibv_device) -> *mut ibv_context,
    pub close_device: unsafe extern "C" fn(*mut ibv_context) -> c_int,
    pub query_device: unsafe extern "C" fn(*mut ibv_context, *mut ibv_device_attr) -> c_int,
    pub query_port: unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int,
    pub query_gid: unsafe extern "C" fn(*mut ibv_context, u8, c_int, *mut ibv_gid) -> c_int,
    pub alloc_pd: unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_pd,
    pub dealloc_pd: unsafe extern "C" fn(*mut ibv_pd) -> c_int,
    pub reg_mr: unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr,
    pub dereg_mr: unsafe extern "C" fn(*mut ibv_mr) -> c_int,
    /// `ibv_reg_dmabuf_mr(pd, offset, length, iova, fd, access)`: libibverbs 1.14 (rdma-core
    /// 34) and later; `None` before, where device memory is registered another way or staged.
    pub reg_dmabuf_mr: Option<unsafe extern "C" fn(*mut ibv_pd, u64, usize, u64, c_int, c_int) -> *mut ibv_mr>,
    pub create_comp_channel: unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_comp_channel,
    pub destroy_comp_channel: unsafe extern "C" fn(*mut ibv_comp_channel) -> c_int,
    pub create_cq:
        unsafe extern "C" fn(*mut ibv_context, c_int, *mut c_void, *mut ibv_comp_channel, c_int) -> *mut ibv_cq,
    pub destroy_cq: unsafe extern "C" fn(*mut ibv_cq) -> c_int,
    pub get_cq_event: unsafe extern "C" fn(*mut ibv_comp_channel, *mut *mut ibv_cq, *mut *mut c_void) -> c_int,
    pub ack_cq_events: unsafe extern "C" fn(*mut ibv_cq, c_uint),
    pub create_qp: unsafe extern "C" fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp,
    pub modify_qp: unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int,
    pub destroy_qp: unsafe extern "C" fn(*mut ibv_qp) -> c_int,
    pub wc_status_str: unsafe extern "C" fn(c_uint) -> *const c_char,
    /// Kept loaded for as long as any of the pointers above may be called.
    _lib: Library,
}

/// The library name tried when none is configured.
pub const DEFAULT_LIBRARY: &str = "libibverbs.so.1";

impl Verbs {
    /// Loads libibverbs (`name`, or [`DEFAULT_LIBRARY`]) and resolves every function used.
    pub fn load(name: Option<&str>) -> Result<Verbs, String> {
        let name = name.unwrap_or(DEFAULT_LIBRARY);
        // SAFETY: loading libibverbs runs its initializers, which only set up its own state
        // (provider search paths, fork safety); it has no other side effects on this process.
        let lib = unsafe { Library::new(name) }.map_err(|e| format!("cannot load {name}: {e}"))?;
        macro_rules! sym {
            ($name:literal) => {{
                // SAFETY: the symbol's type is the one verbs.h declares for it (ABI 1.1,
                // the default version `dlsym` returns), mirrored by the field's type.
                let f = unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                    .map_err(|e| format!("{name} lacks {}: {e}", $name))?;
                *f
            }};
        }
        Ok(Verbs {
            get_device_list: sym!("ibv_get_device_list"),
            free_device_list: sym!("ibv_free_device_list"),
            get_device_name: sym!("ibv_get_device_name"),
            open_device: sym!("ibv_open_device"),
            close_device: sym!("ibv_close_device"),
            query_device: sym!("ibv_query_device"),
            query_port: sym!("ibv_query_port"),
            query_gid: sym!("ibv_query_gid"),
            alloc_pd: sym!("ibv_alloc_pd"),
            dealloc_pd: sym!("ibv_dealloc_pd"),
            reg_mr: sym!("ibv_reg_mr"),
            dereg_mr: sym!("ibv_dereg_mr"),
            // SAFETY: as in `sym!`: the type verbs.h declares for it (IBVERBS_1.12).
            reg_dmabuf_mr: unsafe { lib.get(b"ibv_reg_dmabuf_mr\0") }.ok().map(|f| *f),
            create_comp_channel: sym!("ibv_create_comp_channel"),
            destroy_comp_channel: sym!("ibv_destroy_comp_channel"),
            create_cq: sym!("ibv_create_cq"),
            destroy_cq: sym!("ibv_destroy_cq"),
            get_cq_event: sym!("ibv_get_cq_event"),
            ack_cq_events: sym!("ibv_ack_cq_events"),
            create_qp: sym!("ibv_create_qp"),
            modify_qp: sym!("ibv_modify_qp"),
            destroy_qp: sym!("ibv_destroy_qp"),
            wc_status_str: sym!("ibv_wc_status_str"),
            _lib: lib,
        })
    }

    /// The library's name for a work completion status.
    pub fn status_str(&self, status: c_uint) -> String {
        // SAFETY: ibv_wc_status_str returns a static string for any value ("unknown" if
        // out of range).
        let s = unsafe { (self.wc_status_str)(status) };
        if s.is_null() {
            return format!("status {status}");
        }
        // SAFETY: a NUL-terminated static string from the library.
        unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
    }
}

/// Sizes and offsets of the mirrored structures, for the layout test: `(C expression, value)`.
#[cfg(test)]
fn layout_table() -> Vec<(&'static str, usize)> {
    use std::mem::{offset_of, size_of};
    vec![
        (
            "offsetof(struct ibv_context, ops)",
            offset_of!(ibv_context, ops),
        ),
        (
            "offsetof(struct ibv_context, ops.poll_cq)",
            offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, poll_cq),
        ),
        (
            "offsetof(struct ibv_context, ops.req_notify_cq)",
            offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, req_notify_cq),
        ),
        (
            "offsetof(struct ibv_context, ops.post_send)",
            offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, post_send),
        ),
        ("sizeof(struct ibv_context_ops)", size_of::<ibv_context_ops>()),
        (
            "offsetof(struct ibv_context, num_comp_vectors)",
            offset_of!(ibv_context, num_comp_vectors),
        ),
        (
            "offsetof(struct ibv_comp_channel, fd)",
            offset_of!(ibv_comp_channel, fd),
        ),
        ("offsetof(struct ibv_cq, cqe)", offset_of!(ibv_cq, cqe)),
        ("offsetof(struct ibv_qp, qp_num)", offset_of!(ibv_qp, qp_num)),
        ("offsetof(struct ibv_qp, state)", offset_of!(ibv_qp, state)),
        ("offsetof(struct ibv_mr, lkey)", offset_of!(ibv_mr, lkey)),
        ("offsetof(struct ibv_mr, rkey)", offset_of!(ibv_mr, rkey)),
        ("sizeof(struct ibv_device_attr)", size_of::<ibv_device_attr>()),
        (
            "offsetof(struct ibv_device_attr, max_qp_wr)",
            offset_of!(ibv_device_attr, max_qp_wr),
        ),
        (
            "offsetof(struct ibv_device_attr, max_cqe)",
            offset_of!(ibv_device_attr, max_cqe),
        ),
        (
            "offsetof(struct ibv_device_attr, max_qp_rd_atom)",
            offset_of!(ibv_device_attr, max_qp_rd_atom),
        ),
        (
            "offsetof(struct ibv_device_attr, max_qp_init_rd_atom)",
            offset_of!(ibv_device_attr, max_qp_init_rd_atom),
        ),
        (
            "offsetof(struct ibv_device_attr, phys_port_cnt)",
            offset_of!(ibv_device_attr, phys_port_cnt),
        ),
        ("sizeof(struct ibv_port_attr)", size_of::<ibv_port_attr>()),
        (
            "offsetof(struct ibv_port_attr, active_mtu)",
            offset_of!(ibv_port_attr, active_mtu),
        ),
        (
            "offsetof(struct ibv_port_attr, gid_tbl_len)",
            offset_of!(ibv_port_attr, gid_tbl_len),
        ),
        ("offsetof(struct ibv_port_attr, lid)", offset_of!(ibv_port_attr, lid)),
        (
            "offsetof(struct ibv_port_attr, link_layer)",
            offset_of!(ibv_port_attr, link_layer),
        ),
        ("sizeof(union ibv_gid)", size_of::<ibv_gid>()),
        ("_Alignof(union ibv_gid)", std::mem::align_of::<ibv_gid>()),
        ("sizeof(struct ibv_global_route)", size_of::<ibv_global_route>()),
        (
            "offsetof(struct ibv_global_route, sgid_index)",
            offset_of!(ibv_global_route, sgid_index),
        ),
        ("sizeof(struct ibv_ah_attr)", size_of::<ibv_ah_attr>()),
        ("offsetof(struct ibv_ah_attr, dlid)", offset_of!(ibv_ah_attr, dlid)),
        (
            "offsetof(struct ibv_ah_attr, is_global)",
            offset_of!(ibv_ah_attr, is_global),
        ),
        (
            "offsetof(struct ibv_ah_attr, port_num)",
            offset_of!(ibv_ah_attr, port_num),
        ),
        ("sizeof(struct ibv_qp_init_attr)", size_of::<ibv_qp_init_attr>()),
        (
            "offsetof(struct ibv_qp_init_attr, cap)",
            offset_of!(ibv_qp_init_attr, cap),
        ),
        (
            "offsetof(struct ibv_qp_init_attr, qp_type)",
            offset_of!(ibv_qp_init_attr, qp_type),
        ),
        ("sizeof(struct ibv_qp_attr)", size_of::<ibv_qp_attr>()),
        (
            "offsetof(struct ibv_qp_attr, dest_qp_num)",
            offset_of!(ibv_qp_attr, dest_qp_num),
        ),
        (
            "offsetof(struct ibv_qp_attr, qp_access_flags)",
            offset_of!(ibv_qp_attr, qp_access_flags),
        ),
        ("offsetof(struct ibv_qp_attr, ah_attr)", offset_of!(ibv_qp_attr, ah_attr)),
        (
            "offsetof(struct ibv_qp_attr, pkey_index)",
            offset_of!(ibv_qp_attr, pkey_index),
        ),
        (
            "offsetof(struct ibv_qp_attr, max_rd_atomic)",
            offset_of!(ibv_qp_attr, max_rd_atomic),
        ),
        (
            "offsetof(struct ibv_qp_attr, max_dest_rd_atomic)",
            offset_of!(ibv_qp_attr, max_dest_rd_atomic),
        ),
        (
            "offsetof(struct ibv_qp_attr, min_rnr_timer)",
            offset_of!(ibv_qp_attr, min_rnr_timer),
        ),
        ("offsetof(struct ibv_qp_attr, port_num)", offset_of!(ibv_qp_attr, port_num)),
        ("offsetof(struct ibv_qp_attr, timeout)", offset_of!(ibv_qp_attr, timeout)),
        ("offsetof(struct ibv_qp_attr, retry_cnt)", offset_of!(ibv_qp_attr, retry_cnt)),
        ("offsetof(struct ibv_qp_attr, rnr_retry)", offset_of!(ibv_qp_attr, rnr_retry)),
        ("sizeof(struct ibv_sge)", size_of::<ibv_sge>()),
        ("sizeof(struct ibv_send_wr)", size_of::<ibv_send_wr>()),
        ("offsetof(struct ibv_send_wr, next)", offset_of!(ibv_send_wr, next)),
        ("offsetof(struct ibv_send_wr, num_sge)", offset_of!(ibv_send_wr, num_sge)),
        ("offsetof(struct ibv_send_wr, opcode)", offset_of!(ibv_send_wr, opcode)),
        (
            "offsetof(struct ibv_send_wr, send_flags)",
            offset_of!(ibv_send_wr, send_flags),
        ),
        (
            "offsetof(struct ibv_send_wr, wr.rdma.remote_addr)",
            offset_of!(ibv_send_wr, remote_addr),
        ),
        ("offsetof(struct ibv_send_wr, wr.rdma.rkey)", offset_of!(ibv_send_wr, rkey)),
        ("sizeof(struct ibv_wc)", size_of::<ibv_wc>()),
        ("offsetof(struct ibv_wc, status)", offset_of!(ibv_wc, status)),
        ("offsetof(struct ibv_wc, vendor_err)", offset_of!(ibv_wc, vendor_err)),
        ("offsetof(struct ibv_wc, qp_num)", offset_of!(ibv_wc, qp_num)),
        (
            "IBV_QP_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX | IBV_QP_PORT",
            (IBV_QP_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX | IBV_QP_PORT) as usize,
        ),
        (
            "IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER",
            (IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN
                | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) as usize,
        ),
        (
            "IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC",
            (IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN
                | IBV_QP_MAX_QP_RD_ATOMIC) as usize,
        ),
        (
            "IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE << 4 | IBV_ACCESS_REMOTE_READ << 8",
            (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE << 4 | IBV_ACCESS_REMOTE_READ << 8)
                as usize,
        ),
        (
            "IBV_WR_RDMA_WRITE | IBV_WR_RDMA_READ << 4 | IBV_SEND_SIGNALED << 8",
            (IBV_WR_RDMA_WRITE | IBV_WR_RDMA_READ << 4 | IBV_SEND_SIGNALED << 8) as usize,
        ),
        (
            "IBV_QPS_RESET | IBV_QPS_INIT << 4 | IBV_QPS_RTR << 8 | IBV_QPS_RTS << 12 | IBV_QPS_ERR << 16 | IBV_QPT_RC << 20",
            (IBV_QPS_RESET | IBV_QPS_INIT << 4 | IBV_QPS_RTR << 8 | IBV_QPS_RTS << 12
                | IBV_QPS_ERR << 16 | IBV_QPT_RC << 20) as usize,
        ),
        (
            "IBV_WC_SUCCESS | IBV_WC_LOC_LEN_ERR << 4 | IBV_WC_LOC_PROT_ERR << 8 | IBV_WC_WR_FLUSH_ERR << 12 | IBV_WC_LOC_ACCESS_ERR << 16 | IBV_WC_REM_INV_REQ_ERR << 20 | (size_t)IBV_WC_REM_ACCESS_ERR << 24",
            (IBV_WC_SUCCESS | IBV_WC_LOC_LEN_ERR << 4 | IBV_WC_LOC_PROT_ERR << 8
                | IBV_WC_WR_FLUSH_ERR << 12 | IBV_WC_LOC_ACCESS_ERR << 16
                | IBV_WC_REM_INV_REQ_ERR << 20) as usize
                | (IBV_WC_REM_ACCESS_ERR as usize) << 24,
        ),
        (
            "IBV_PORT_ACTIVE | IBV_LINK_LAYER_INFINIBAND << 4 | IBV_LINK_LAYER_ETHERNET << 8",
            (IBV_PORT_ACTIVE as usize)
                | (IBV_LINK_LAYER_INFINIBAND as usize) << 4
                | (IBV_LINK_LAYER_ETHERNET as usize) << 8,
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;
    use std::process::Command;

    /// Compiles a C program against the system's verbs.h that prints every size, offset and
    /// constant this module mirrors, and compares them. Skipped (with the reason printed)
    /// where the header or a C compiler is missing; CI installs both.
    #[test]
    fn layouts_match_the_system_header() {
        let header = Path::new("/usr/include/infiniband/verbs.h");
        if !header.exists() {
            eprintln!("skipped: {} is not installed (libibverbs-dev)", header.display());
            return;
        }
        let dir = std::env::temp_dir().join(format!("crescent-verbs-layout-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let table = layout_table();
        let mut src =
            String::from("#include <stdio.h>\n#include <stddef.h>\n#include <infiniband/verbs.h>\nint main(void) {\n");
        for (expr, _) in &table {
            src.push_str(&format!("  printf(\"%zu\\n\", (size_t)({expr}));\n"));
        }
        src.push_str("  return 0;\n}\n");
        let c = dir.join("layout.c");
        let exe = dir.join("layout");
        std::fs::write(&c, src).unwrap();
        let cc = match Command::new("cc").arg(&c).arg("-o").arg(&exe).output() {
            Ok(out) => out,
            Err(e) => {
                eprintln!("skipped: no C compiler ({e})");
                return;
            }
        };
        assert!(cc.status.success(), "compiling the layout probe failed:\n{}", String::from_utf8_lossy(&cc.stderr));
        let out = Command::new(&exe).output().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let values: Vec<usize> = String::from_utf8(out.stdout).unwrap().lines().map(|l| l.parse().unwrap()).collect();
        assert_eq!(values.len(), table.len());
        let wrong: Vec<String> = table
            .iter()
            .zip(&values)
            .filter(|((_, rust), c)| rust != *c)
            .map(|((expr, rust), c)| format!("{expr}: C says {c}, Rust has {rust}"))
            .collect();
        assert!(wrong.is_empty(), "layout mismatches:\n{}", wrong.join("\n"));
    }

    #[test]
    fn a_missing_library_is_an_error_naming_it() {
        let err = Verbs::load(Some("libcrescent-no-such-verbs.so.1")).err().expect("loading a missing library fails");
        assert!(err.contains("libcrescent-no-such-verbs.so.1"), "{err}");
    }
}
