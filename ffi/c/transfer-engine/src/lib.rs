//! `libtransfer_engine`: Mooncake's `transfer_engine_c.h` (kvcache-ai/Mooncake 3b5a5941) over
//! `crescent-engine` — the same function names, types, struct layouts and return codes, so that
//! a program written against Mooncake's header (NIXL's Mooncake backend) links with
//! `-ltransfer_engine` and runs unchanged. The header is `include/transfer_engine_c.h`, copied
//! next to the built library; `build.rs` checks it declares exactly what this file exports.
//!
//! The functions are thin: handle and argument checks, conversions, one call into the engine.
//! Engine handles are tokens looked up in a table, never dereferenced: a NULL, destroyed or
//! forged handle gets the function's error value. A panic is caught and reported the same way,
//! never unwound into C. Failures are logged (`RUST_LOG`) since the header has no error-message
//! call.

#![allow(non_camel_case_types)]

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Once};

use crescent_ffi::engine::{
    handshake, BatchId, EngineConfig, EngineError, Notification, Opcode, SegmentId, TransferEngine, TransferRequest,
    TransferStatus, TransportKind, P2P_HANDSHAKE,
};
use crescent_ffi::{raw, te_code, TeCode};
use parking_lot::{Mutex, RwLock};

pub type segment_id_t = i32;
pub type batch_id_t = u64;
pub type transfer_engine_t = *mut c_void;
pub type transport_t = *mut c_void;

pub const LOCAL_SEGMENT: segment_id_t = 0;
pub const INVALID_BATCH: batch_id_t = u64::MAX;
pub const OPCODE_READ: c_int = 0;
pub const OPCODE_WRITE: c_int = 1;
pub const STATUS_WAITING: c_int = 0;
pub const STATUS_PENDING: c_int = 1;
pub const STATUS_INVALID: c_int = 2;
pub const STATUS_CANCELED: c_int = 3;
pub const STATUS_COMPLETED: c_int = 4;
pub const STATUS_TIMEOUT: c_int = 5;
pub const STATUS_FAILED: c_int = 6;

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct transfer_request {
    pub opcode: c_int,
    pub source: *mut c_void,
    pub target_id: segment_id_t,
    pub target_offset: u64,
    pub length: u64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct notify_msg {
    pub name: *mut c_char,
    pub msg: *mut c_char,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct transfer_status {
    pub status: c_int,
    pub transferred_bytes: u64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct buffer_entry {
    pub addr: *mut c_void,
    pub length: usize,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct nic_load_stat {
    pub device_name: [c_char; 64],
    pub inflight_bytes: u64,
    pub ewma_bandwidth_bps: f64,
}

// ---- handles ----

struct State {
    engine: Arc<TransferEngine>,
    /// Request lengths of each batch, by task id: a completed task's `transferred_bytes`.
    lengths: Mutex<HashMap<BatchId, Vec<u64>>>,
}

impl State {
    /// The engine's segment handle for a C segment id: `LOCAL_SEGMENT` is the engine's own
    /// segment (opened on first use), others are the engine's handles.
    fn segment(&self, id: segment_id_t) -> Result<SegmentId, EngineError> {
        match id {
            LOCAL_SEGMENT => self.engine.open_segment(self.engine.segment_name()),
            id if id > 0 => Ok(id as SegmentId),
            id => Err(EngineError::InvalidArgument(format!("segment id {id} is negative"))),
        }
    }
}

static ENGINES: LazyLock<RwLock<HashMap<usize, Arc<State>>>> = LazyLock::new(|| RwLock::new(HashMap::new()));
/// Tokens are never reused, so a destroyed handle stays invalid forever.
static NEXT_TOKEN: AtomicUsize = AtomicUsize::new(1);

fn state(engine: transfer_engine_t) -> Result<Arc<State>, Failure> {
    ENGINES
        .read()
        .get(&(engine as usize))
        .cloned()
        .ok_or_else(|| Failure::new(TeCode::InvalidArgument, "invalid engine handle (NULL, destroyed or forged)"))
}

// ---- failures ----

/// Why a call failed: the code it reports and the message logged.
struct Failure {
    code: TeCode,
    message: String,
}

impl Failure {
    fn new(code: TeCode, message: impl std::fmt::Display) -> Self {
        Failure { code, message: message.to_string() }
    }
}

impl From<EngineError> for Failure {
    fn from(e: EngineError) -> Self {
        Failure { code: te_code(&e), message: e.to_string() }
    }
}

fn invalid(message: impl std::fmt::Display) -> Failure {
    Failure::new(TeCode::InvalidArgument, message)
}

/// Runs `f` for the C function `what`: a failure (or a panic) is logged and turned into
/// `on_error(code)`.
fn call<T>(what: &str, on_error: impl Fn(TeCode) -> T, f: impl FnOnce() -> Result<T, Failure>) -> T {
    let failure = match raw::guarded(f) {
        Ok(Ok(v)) => return v,
        Ok(Err(failure)) => failure,
        Err(message) => Failure::new(TeCode::InvalidArgument, message),
    };
    tracing::warn!("{what}: {}", failure.message);
    crescent_ffi::set_last_error(&failure.message);
    on_error(failure.code)
}

/// For functions returning an `ERR_*` int.
fn err_code(code: TeCode) -> c_int {
    code.code()
}

/// For functions returning Mooncake's `Status::Code`.
fn status_code(code: TeCode) -> c_int {
    code.status_code()
}

// ---- arguments ----

/// A C string, `None` for NULL.
///
/// # Safety
/// `p` is NULL or NUL-terminated and valid for the call.
unsafe fn opt_text<'a>(p: *const c_char, what: &str) -> Result<Option<&'a str>, Failure> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: non-NULL and NUL-terminated per the caller's contract.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str().map(Some).map_err(|_| invalid(format!("{what} is not valid UTF-8")))
}

/// A required C string.
///
/// # Safety
/// As [`opt_text`].
unsafe fn text<'a>(p: *const c_char, what: &str) -> Result<&'a str, Failure> {
    // SAFETY: forwarded contract.
    unsafe { opt_text(p, what) }?.ok_or_else(|| invalid(format!("{what} is NULL")))
}

/// `count` elements at `p` (NULL only with `count` 0).
///
/// # Safety
/// `p` points to `count` initialised elements valid for the call.
unsafe fn array<'a, T>(p: *const T, count: usize, what: &str) -> Result<&'a [T], Failure> {
    // SAFETY: forwarded contract.
    unsafe { raw::slice(p, count) }.map_err(|e| invalid(e.message(what, "NULL")))
}

/// A notification's two strings (bytes up to their NUL).
///
/// # Safety
/// Both pointers are NULL or NUL-terminated and valid for the call.
unsafe fn notification(n: &notify_msg) -> Result<Notification, Failure> {
    if n.name.is_null() || n.msg.is_null() {
        return Err(invalid("notify_msg.name or notify_msg.msg is NULL"));
    }
    // SAFETY: non-NULL and NUL-terminated per the caller's contract.
    let (name, msg) = unsafe { (CStr::from_ptr(n.name), CStr::from_ptr(n.msg)) };
    Ok(Notification::new(name.to_bytes(), msg.to_bytes()))
}

/// `text` into `buf` of `len` bytes as `snprintf(buf, len, "%s", text)` does.
///
/// # Safety
/// `buf` points to `len` writable bytes.
unsafe fn copy_out(text: &str, buf: *mut c_char, len: usize) -> Result<(), Failure> {
    if len == 0 {
        return Ok(());
    }
    if buf.is_null() {
        return Err(invalid("buf_out is NULL"));
    }
    let n = text.len().min(len - 1);
    // SAFETY: `len` writable bytes per the caller's contract; `n + 1 <= len`.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), buf.cast::<u8>(), n);
        *buf.add(n) = 0;
    }
    Ok(())
}

fn requests(s: &State, entries: &[transfer_request]) -> Result<Vec<TransferRequest>, Failure> {
    entries
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let opcode = match e.opcode {
                OPCODE_READ => Opcode::Read,
                OPCODE_WRITE => Opcode::Write,
                other => {
                    return Err(invalid(format!("entries[{i}].opcode {other} is neither OPCODE_READ nor OPCODE_WRITE")))
                }
            };
            Ok(TransferRequest {
                opcode,
                source: e.source as u64,
                target: s.segment(e.target_id)?,
                target_offset: e.target_offset,
                length: e.length,
            })
        })
        .collect()
}

// ---- engine ----

/// See the header.
///
/// # Safety
/// The strings are NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn createTransferEngine(
    metadata_conn_string: *const c_char,
    local_server_name: *const c_char,
    ip_or_host_name: *const c_char,
    rpc_port: u64,
    auto_discover: c_int,
) -> transfer_engine_t {
    crescent_ffi::init_logging();
    let _ = auto_discover; // transports are always chosen per peer
    call(
        "createTransferEngine",
        |_| std::ptr::null_mut(),
        || {
            // SAFETY: the caller's contract on the strings.
            let (conn, name, ip) = unsafe {
                (
                    text(metadata_conn_string, "metadata_conn_string")?.trim(),
                    opt_text(local_server_name, "local_server_name")?.unwrap_or("").trim(),
                    opt_text(ip_or_host_name, "ip_or_host_name")?.unwrap_or("").trim(),
                )
            };
            let p2p = conn.is_empty() || conn.eq_ignore_ascii_case(P2P_HANDSHAKE);
            let (host, port) = match handshake::split_host_port(name) {
                Ok((h, p)) => (h, Some(p)),
                Err(_) => (name.to_string(), None),
            };
            let mut config = EngineConfig::from_env()?;
            config.local_hostname = Some(if host.is_empty() { ip.to_string() } else { host }).filter(|h| !h.is_empty());
            if p2p {
                // As Mooncake: the handshake port is picked free.
                config.metadata_server = P2P_HANDSHAKE.into();
            } else {
                config.metadata_server = conn.to_string();
                let fixed = port.map(u64::from).or((rpc_port != 0).then_some(rpc_port));
                if let Some(p) = fixed {
                    config.rpc_port = u16::try_from(p).map_err(|_| invalid(format!("rpc_port {p} is not a port")))?;
                }
            }
            let engine = TransferEngine::new(config)?;
            let token = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed) << 4;
            ENGINES.write().insert(token, Arc::new(State { engine, lengths: Mutex::new(HashMap::new()) }));
            Ok(token as transfer_engine_t)
        },
    )
}

/// 0: Crescent finds its devices when the engine starts.
#[no_mangle]
pub extern "C" fn discoverTopology(engine: transfer_engine_t) -> c_int {
    call("discoverTopology", err_code, || state(engine).map(|_| 0))
}

/// See the header.
///
/// # Safety
/// `buf_out` points to `buf_len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn getLocalIpAndPort(engine: transfer_engine_t, buf_out: *mut c_char, buf_len: usize) -> c_int {
    call("getLocalIpAndPort", err_code, || {
        let s = state(engine)?;
        // SAFETY: forwarded contract.
        unsafe { copy_out(s.engine.segment_name(), buf_out, buf_len) }?;
        Ok(0)
    })
}

/// A distinct non-NULL token per transport kind (never dereferenced).
static TRANSPORT_TOKENS: [u8; 3] = [0; 3];

/// See the header.
///
/// # Safety
/// `proto` is NULL or NUL-terminated; `args` is not read.
#[no_mangle]
pub unsafe extern "C" fn installTransport(
    engine: transfer_engine_t,
    proto: *const c_char,
    args: *mut *mut c_void,
) -> transport_t {
    let _ = args;
    call(
        "installTransport",
        |_| std::ptr::null_mut(),
        || {
            let s = state(engine)?;
            // SAFETY: the caller's contract on the string.
            let proto = unsafe { text(proto, "proto") }?;
            let (kind, index) = match proto {
                "tcp" => (TransportKind::Tcp, 0),
                "rdma" => (TransportKind::Rdma, 1),
                "shm" => (TransportKind::Shm, 2),
                other => {
                    return Err(Failure::new(TeCode::NotImplemented, format!("transport {other:?} is not in Crescent")))
                }
            };
            if !s.engine.transport_kinds().contains(&kind) {
                return Err(Failure::new(TeCode::Context, format!("transport {proto} is not running in this engine")));
            }
            Ok(std::ptr::addr_of!(TRANSPORT_TOKENS[index]) as transport_t)
        },
    )
}

/// 0, as Mooncake's.
///
/// # Safety
/// `proto` is NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn uninstallTransport(engine: transfer_engine_t, proto: *const c_char) -> c_int {
    call("uninstallTransport", err_code, || {
        state(engine)?;
        // SAFETY: the caller's contract on the string.
        unsafe { text(proto, "proto") }?;
        Ok(0)
    })
}

/// See the header: the segment's id, `LOCAL_SEGMENT` for the engine's own, -1 on failure.
///
/// # Safety
/// `segment_name` is NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn openSegment(engine: transfer_engine_t, segment_name: *const c_char) -> segment_id_t {
    call(
        "openSegment",
        |_| -1,
        || {
            let s = state(engine)?;
            // SAFETY: the caller's contract on the string.
            let name = unsafe { text(segment_name, "segment_name") }?.trim_start_matches('/');
            if name.is_empty() {
                return Err(invalid("segment_name is empty"));
            }
            if name == s.engine.segment_name() {
                s.segment(LOCAL_SEGMENT)?;
                return Ok(LOCAL_SEGMENT);
            }
            let id = s.engine.open_segment(name)?;
            segment_id_t::try_from(id).map_err(|_| invalid(format!("segment handle {id} does not fit segment_id_t")))
        },
    )
}

/// `openSegment`, then the segment's descriptor fetched again.
///
/// # Safety
/// As [`openSegment`].
#[no_mangle]
pub unsafe extern "C" fn openSegmentNoCache(engine: transfer_engine_t, segment_name: *const c_char) -> segment_id_t {
    // SAFETY: forwarded contract.
    let id = unsafe { openSegment(engine, segment_name) };
    if id < 0 {
        return id;
    }
    call(
        "openSegmentNoCache",
        |_| -1,
        || {
            let s = state(engine)?;
            s.engine.resync_segment(s.segment(id)?)?;
            Ok(id)
        },
    )
}

/// 0, as Mooncake's: the segment stays open (`removeLocalSegment` forgets it).
#[no_mangle]
pub extern "C" fn closeSegment(engine: transfer_engine_t, segment_id: segment_id_t) -> c_int {
    let _ = segment_id;
    call("closeSegment", err_code, || state(engine).map(|_| 0))
}

/// 0: there is no EFA transport to warm up.
///
/// # Safety
/// `segment_name` is NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn warmupEfaSegment(engine: transfer_engine_t, segment_name: *const c_char) -> c_int {
    let _ = segment_name;
    call("warmupEfaSegment", err_code, || state(engine).map(|_| 0))
}

/// Forgets the opened segment `segment_name` (a later `openSegment` fetches it anew, under a
/// new id); 0, -1 for an empty name.
///
/// # Safety
/// `segment_name` is NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn removeLocalSegment(engine: transfer_engine_t, segment_name: *const c_char) -> c_int {
    call("removeLocalSegment", err_code, || {
        let s = state(engine)?;
        // SAFETY: the caller's contract on the string.
        let name = unsafe { text(segment_name, "segment_name") }?.trim_start_matches('/');
        if name.is_empty() {
            return Err(invalid("segment_name is empty"));
        }
        for (id, open, _) in s.engine.open_segments() {
            if open == name {
                s.engine.close_segment(id)?;
            }
        }
        Ok(0)
    })
}

/// Stops the engine once calls running on other threads are done with it.
#[no_mangle]
pub extern "C" fn destroyTransferEngine(engine: transfer_engine_t) {
    call(
        "destroyTransferEngine",
        |_| (),
        || ENGINES.write().remove(&(engine as usize)).map(drop).ok_or_else(|| invalid("invalid engine handle")),
    )
}

// ---- memory ----

/// See the header. `location` NULL means `"*"`; `remote_accessible` is not used (registered
/// memory is published to peers).
///
/// # Safety
/// `location` is NULL or NUL-terminated; the memory stays valid while registered.
#[no_mangle]
pub unsafe extern "C" fn registerLocalMemory(
    engine: transfer_engine_t,
    addr: *mut c_void,
    length: usize,
    location: *const c_char,
    remote_accessible: c_int,
) -> c_int {
    let _ = remote_accessible;
    call("registerLocalMemory", err_code, || {
        let s = state(engine)?;
        // SAFETY: the caller's contract on the string.
        let location = unsafe { opt_text(location, "location") }?.unwrap_or("*");
        if addr.is_null() {
            return Err(invalid("addr is NULL"));
        }
        s.engine.register(addr as u64, length as u64, location)?;
        Ok(0)
    })
}

#[no_mangle]
pub extern "C" fn unregisterLocalMemory(engine: transfer_engine_t, addr: *mut c_void) -> c_int {
    call("unregisterLocalMemory", err_code, || {
        state(engine)?.engine.unregister(addr as u64)?;
        Ok(0)
    })
}

/// All or none.
///
/// # Safety
/// `buffer_list` points to `buffer_len` entries; `location` is NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn registerLocalMemoryBatch(
    engine: transfer_engine_t,
    buffer_list: *mut buffer_entry,
    buffer_len: usize,
    location: *const c_char,
) -> c_int {
    call("registerLocalMemoryBatch", err_code, || {
        let s = state(engine)?;
        // SAFETY: the caller's contract on the array and the string.
        let (list, location) =
            unsafe { (array(buffer_list, buffer_len, "buffer_list")?, opt_text(location, "location")?.unwrap_or("*")) };
        let regions: Vec<(u64, u64)> = list.iter().map(|b| (b.addr as u64, b.length as u64)).collect();
        s.engine.register_batch(&regions, location)?;
        Ok(0)
    })
}

/// Unregisters each (all are tried); the first error's code.
///
/// # Safety
/// `addr_list` points to `addr_len` pointers.
#[no_mangle]
pub unsafe extern "C" fn unregisterLocalMemoryBatch(
    engine: transfer_engine_t,
    addr_list: *mut *mut c_void,
    addr_len: usize,
) -> c_int {
    call("unregisterLocalMemoryBatch", err_code, || {
        let s = state(engine)?;
        // SAFETY: the caller's contract on the array.
        let addrs = unsafe { array(addr_list.cast_const(), addr_len, "addr_list") }?;
        let mut first = None;
        for &a in addrs {
            if let Err(e) = s.engine.unregister(a as u64) {
                first.get_or_insert(Failure::from(e));
            }
        }
        first.map_or(Ok(0), Err)
    })
}

// ---- batches ----

/// A batch for up to `batch_size` requests (at least 1), or `INVALID_BATCH`.
#[no_mangle]
pub extern "C" fn allocateBatchID(engine: transfer_engine_t, batch_size: usize) -> batch_id_t {
    call(
        "allocateBatchID",
        |_| INVALID_BATCH,
        || {
            let s = state(engine)?;
            let id = s.engine.allocate_batch(batch_size)?;
            s.lengths.lock().insert(id, Vec::new());
            Ok(id)
        },
    )
}

/// Submits `entries` (appended to the batch's tasks), with `notify` attached if given.
///
/// # Safety
/// `entries` points to `count` requests.
unsafe fn submit(
    engine: transfer_engine_t,
    batch_id: batch_id_t,
    entries: *mut transfer_request,
    count: usize,
    notify: Option<&notify_msg>,
) -> Result<c_int, Failure> {
    let s = state(engine)?;
    // SAFETY: the caller's contract on the array.
    let entries = unsafe { array(entries.cast_const(), count, "entries") }?;
    let reqs = requests(&s, entries)?;
    match notify {
        Some(n) => {
            if reqs.is_empty() {
                return Err(invalid("entries must not be empty"));
            }
            // SAFETY: the caller's contract on the notification's strings.
            let n = unsafe { notification(n) }?;
            s.engine.submit_with_notify(batch_id, &reqs, n)?
        }
        None => s.engine.submit(batch_id, &reqs)?,
    }
    if let Some(lengths) = s.lengths.lock().get_mut(&batch_id) {
        lengths.extend(reqs.iter().map(|r| r.length));
    }
    Ok(0)
}

/// See the header: 0, or Mooncake's Status code (1, 2, 3).
///
/// # Safety
/// `entries` points to `count` requests.
#[no_mangle]
pub unsafe extern "C" fn submitTransfer(
    engine: transfer_engine_t,
    batch_id: batch_id_t,
    entries: *mut transfer_request,
    count: usize,
) -> c_int {
    // SAFETY: forwarded contract.
    call("submitTransfer", status_code, || unsafe { submit(engine, batch_id, entries, count, None) })
}

/// See the header.
///
/// # Safety
/// `entries` points to `count` requests; the notification's strings are NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn submitTransferWithNotify(
    engine: transfer_engine_t,
    batch_id: batch_id_t,
    entries: *mut transfer_request,
    count: usize,
    notify_msg: notify_msg,
) -> c_int {
    // SAFETY: forwarded contract.
    call("submitTransferWithNotify", status_code, || unsafe {
        submit(engine, batch_id, entries, count, Some(&notify_msg))
    })
}

/// See the header: `status` is `STATUS_WAITING` in flight, then `STATUS_COMPLETED`,
/// `STATUS_FAILED` or `STATUS_TIMEOUT`; 1 for an unknown batch or a task id out of range.
///
/// # Safety
/// `status` points to a writable `struct transfer_status`.
#[no_mangle]
pub unsafe extern "C" fn getTransferStatus(
    engine: transfer_engine_t,
    batch_id: batch_id_t,
    task_id: usize,
    status: *mut transfer_status,
) -> c_int {
    call("getTransferStatus", status_code, || {
        let s = state(engine)?;
        if status.is_null() {
            return Err(invalid("status is NULL"));
        }
        let (code, bytes) = match s.engine.transfer_status(batch_id, task_id)? {
            TransferStatus::Pending => (STATUS_WAITING, 0),
            TransferStatus::Completed => {
                (STATUS_COMPLETED, s.lengths.lock().get(&batch_id).and_then(|l| l.get(task_id).copied()).unwrap_or(0))
            }
            TransferStatus::Failed(reason) => {
                tracing::debug!("batch {batch_id} task {task_id} failed: {reason}");
                (STATUS_FAILED, 0)
            }
            TransferStatus::TimedOut => (STATUS_TIMEOUT, 0),
        };
        // SAFETY: non-NULL and writable per the caller's contract.
        unsafe { status.write(transfer_status { status: code, transferred_bytes: bytes }) };
        Ok(0)
    })
}

/// 0; 4 while tasks are in flight; 1 for an unknown batch.
#[no_mangle]
pub extern "C" fn freeBatchID(engine: transfer_engine_t, batch_id: batch_id_t) -> c_int {
    call("freeBatchID", status_code, || {
        let s = state(engine)?;
        s.engine.free_batch(batch_id)?;
        s.lengths.lock().remove(&batch_id);
        Ok(0)
    })
}

/// Fetches the descriptor of every opened segment again; 0 (a segment that cannot be reached
/// is logged, as Mooncake does).
#[no_mangle]
pub extern "C" fn syncSegmentCache(engine: transfer_engine_t) -> c_int {
    call("syncSegmentCache", err_code, || {
        let s = state(engine)?;
        for (id, name, _) in s.engine.open_segments() {
            if let Err(e) = s.engine.resync_segment(id) {
                tracing::warn!("segment {name} is now invalid: {e}");
            }
        }
        Ok(0)
    })
}

// ---- notifications ----

/// See the header.
///
/// # Safety
/// `size` points to a writable int.
#[no_mangle]
pub unsafe extern "C" fn getNotifsFromEngine(engine: transfer_engine_t, size: *mut c_int) -> *mut notify_msg {
    call(
        "getNotifsFromEngine",
        |_| std::ptr::null_mut(),
        || {
            let s = state(engine)?;
            if size.is_null() {
                return Err(invalid("size is NULL"));
            }
            let taken = s.engine.take_notifies();
            // SAFETY: non-NULL and writable per the caller's contract.
            unsafe { size.write(taken.len() as c_int) };
            if taken.is_empty() {
                return Ok(std::ptr::null_mut());
            }
            // SAFETY: plain malloc of `len` zeroed entries, released by freeNotifsMsgBuf (free).
            let array = unsafe { libc::calloc(taken.len(), size_of::<notify_msg>()) }.cast::<notify_msg>();
            if array.is_null() {
                // SAFETY: as above.
                unsafe { size.write(0) };
                return Err(Failure::new(TeCode::Memory, "out of memory for the notifications"));
            }
            for (i, n) in taken.iter().enumerate() {
                // SAFETY: `i` < the allocated count; each string is malloc'ed with its NUL.
                unsafe {
                    let entry = &mut *array.add(i);
                    entry.name = c_string(&n.name);
                    entry.msg = c_string(&n.message);
                    if entry.name.is_null() || entry.msg.is_null() {
                        freeNotifsMsgBuf(array, taken.len() as c_int);
                        size.write(0);
                        return Err(Failure::new(TeCode::Memory, "out of memory for the notifications"));
                    }
                }
            }
            Ok(array)
        },
    )
}

/// A malloc'ed NUL-terminated copy of `bytes` up to their first NUL (as C would see them).
///
/// # Safety
/// The result is NULL or to be released with `free`.
unsafe fn c_string(bytes: &[u8]) -> *mut c_char {
    let bytes = bytes.split(|&b| b == 0).next().unwrap_or(&[]);
    // SAFETY: a fresh allocation of len + 1 bytes, filled below.
    let p = unsafe { libc::malloc(bytes.len() + 1) }.cast::<u8>();
    if !p.is_null() {
        // SAFETY: `p` has room for the bytes and the NUL.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), p, bytes.len());
            *p.add(bytes.len()) = 0;
        }
    }
    p.cast()
}

/// Frees what `getNotifsFromEngine` returned; 0. NULL is allowed.
///
/// # Safety
/// `msg` is NULL or an array of `size` entries from `getNotifsFromEngine`, not freed yet.
#[no_mangle]
pub unsafe extern "C" fn freeNotifsMsgBuf(msg: *mut notify_msg, size: c_int) -> c_int {
    if msg.is_null() {
        return 0;
    }
    for i in 0..size.max(0) as usize {
        // SAFETY: `size` entries per the caller's contract, each string malloc'ed or NULL.
        unsafe {
            let entry = &*msg.add(i);
            libc::free(entry.name.cast());
            libc::free(entry.msg.cast());
        }
    }
    // SAFETY: the array was calloc'ed by getNotifsFromEngine.
    unsafe { libc::free(msg.cast()) };
    0
}

/// See the header: 0, -200 for an unknown segment id, or the sending's error code (-102 the
/// peer unreachable, -2 its queue full, -1 too large).
///
/// # Safety
/// The notification's strings are NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn genNotifyInEngine(engine: transfer_engine_t, target_id: u64, notify_msg: notify_msg) -> c_int {
    call("genNotifyInEngine", err_code, || {
        let s = state(engine)?;
        // SAFETY: the caller's contract on the strings.
        let n = unsafe { notification(&notify_msg) }?;
        let id = i32::try_from(target_id).map_err(|_| Failure::new(TeCode::Metadata, "invalid segment id"))?;
        let segment = s.segment(id).map_err(|e| Failure::new(TeCode::Metadata, e))?;
        match s.engine.send_notify(segment, &n) {
            Err(e @ EngineError::UnknownSegment(_)) => Err(Failure::new(TeCode::Metadata, e)),
            r => r.map(|()| 0).map_err(Failure::from),
        }
    })
}

// ---- introspection ----

/// No NIC load is tracked: `*count` becomes 0; 0, -1 for NULL arguments.
///
/// # Safety
/// `count` points to a writable size_t.
#[no_mangle]
pub unsafe extern "C" fn getNicLoadStats(
    engine: transfer_engine_t,
    stats: *mut nic_load_stat,
    count: *mut usize,
) -> c_int {
    call("getNicLoadStats", err_code, || {
        state(engine)?;
        if stats.is_null() || count.is_null() {
            return Err(invalid("stats or count is NULL"));
        }
        // SAFETY: non-NULL and writable per the caller's contract.
        unsafe { count.write(0) };
        Ok(0)
    })
}

static SHUTDOWN: Once = Once::new();

/// On SIGINT or SIGTERM, stops every engine (their descriptors leave the metadata service),
/// then lets the signal do what it would have done. Installed once per process.
#[no_mangle]
pub extern "C" fn enableGracefulShutdown(engine: transfer_engine_t) {
    call(
        "enableGracefulShutdown",
        |_| (),
        || {
            state(engine)?;
            let mut result = Ok(());
            SHUTDOWN.call_once(|| {
                let signals =
                    signal_hook::iterator::Signals::new([signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM]);
                result = signals
                    .and_then(|mut signals| {
                        std::thread::Builder::new().name("crescent-shutdown".into()).spawn(move || {
                            if let Some(signal) = signals.forever().next() {
                                tracing::info!("signal {signal}: stopping the transfer engines");
                                ENGINES.write().clear();
                                let _ = signal_hook::low_level::emulate_default_handler(signal);
                            }
                        })
                    })
                    .map(drop)
                    .map_err(|e| Failure::new(TeCode::Context, format!("installing the signal handlers: {e}")));
            });
            result
        },
    )
}

/// The engine's segment and the segments it opened with their transports: one line each, or
/// JSON (`{"local": ..., "links": [{"segment_id", "segment", "transport"}]}`); truncated to
/// `buf_len` as snprintf does. 0, -1 for a NULL buffer or a zero length.
///
/// # Safety
/// `buf_out` points to `buf_len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn showLinks(
    engine: transfer_engine_t,
    buf_out: *mut c_char,
    buf_len: usize,
    json: c_int,
) -> c_int {
    call("showLinks", err_code, || {
        let s = state(engine)?;
        if buf_out.is_null() || buf_len == 0 {
            return Err(invalid("buf_out is NULL or buf_len is 0"));
        }
        let links = s.engine.open_segments();
        let text = if json != 0 {
            serde_json::json!({
                "local": s.engine.segment_name(),
                "links": links.iter().map(|(id, name, kind)| serde_json::json!({
                    "segment_id": id, "segment": name, "transport": kind.to_string(),
                })).collect::<Vec<_>>(),
            })
            .to_string()
        } else {
            let mut t = format!("local segment {}\n", s.engine.segment_name());
            for (id, name, kind) in &links {
                t.push_str(&format!("segment {id} {name} via {kind}\n"));
            }
            t
        };
        // SAFETY: forwarded contract.
        unsafe { copy_out(&text, buf_out, buf_len) }?;
        Ok(0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;

    /// The layouts of upstream's structs on LP64 (x86_64, aarch64); the C test asserts the
    /// same numbers against the header.
    #[test]
    fn struct_layouts_match_the_header() {
        assert_eq!(size_of::<transfer_request>(), 40);
        assert_eq!(
            [
                offset_of!(transfer_request, opcode),
                offset_of!(transfer_request, source),
                offset_of!(transfer_request, target_id),
                offset_of!(transfer_request, target_offset),
                offset_of!(transfer_request, length),
            ],
            [0, 8, 16, 24, 32]
        );
        assert_eq!((size_of::<notify_msg>(), offset_of!(notify_msg, msg)), (16, 8));
        assert_eq!((size_of::<transfer_status>(), offset_of!(transfer_status, transferred_bytes)), (16, 8));
        assert_eq!((size_of::<buffer_entry>(), offset_of!(buffer_entry, length)), (16, 8));
        assert_eq!(size_of::<nic_load_stat>(), 80);
        assert_eq!(
            (offset_of!(nic_load_stat, inflight_bytes), offset_of!(nic_load_stat, ewma_bandwidth_bps)),
            (64, 72)
        );
    }

    #[test]
    fn bad_handles_get_the_error_values() {
        let bogus = 12345usize as transfer_engine_t;
        assert_eq!(discoverTopology(std::ptr::null_mut()), -1);
        assert_eq!(allocateBatchID(bogus, 4), INVALID_BATCH);
        assert_eq!(freeBatchID(bogus, 1), 1);
        // SAFETY: NULL strings are allowed by the functions' contracts.
        unsafe {
            assert!(createTransferEngine(std::ptr::null(), std::ptr::null(), std::ptr::null(), 0, 1).is_null());
            assert_eq!(openSegment(bogus, c"a:1".as_ptr()), -1);
            assert!(installTransport(bogus, c"tcp".as_ptr(), std::ptr::null_mut()).is_null());
            assert_eq!(freeNotifsMsgBuf(std::ptr::null_mut(), 0), 0);
        }
        destroyTransferEngine(bogus);
    }
}
