//! The transfer engine's functions (`crescent_engine_*`).

use std::collections::HashMap;
use std::ffi::{c_char, c_void};
use std::sync::Arc;
use std::time::Duration;

use crescent_ffi::engine::{EngineConfig, Opcode, TransferEngine, TransferRequest, TransferStatus, P2P_HANDSHAKE};
use crescent_ffi::{engine_fail, fail, store_fail, Status};
use parking_lot::Mutex;

use crate::args::{array, array_mut, copy_name, invalid, non_null, put_out, text, text_or};
use crate::calls::{engine_call, engine_status, status};
use crate::handles::{bad_handle, insert, EngineState, Object, HANDLES};
use crate::{
    CrescentEngine, CrescentTransferRequest, CRESCENT_OPCODE_READ, CRESCENT_OPCODE_WRITE, CRESCENT_TRANSFER_COMPLETED,
    CRESCENT_TRANSFER_FAILED, CRESCENT_TRANSFER_PENDING, CRESCENT_TRANSFER_TIMED_OUT, R,
};

/// Starts a transfer engine and gives its handle in `*out`.
///
/// `local_hostname`: the address peers use (`host` or `host:port`); null or "" picks the first
/// non-loopback IPv4 address. `metadata_server`: null or "" for `P2PHANDSHAKE`, or an
/// `etcd://`, `redis://`, `http://` connection string. `protocol`: null, "" or "auto" to choose
/// per peer, else `tcp`, `rdma`, `shm`. `MC_*` environment variables apply as documented.
///
/// # Safety
/// Strings are null or NUL-terminated; `out` points to writable memory for one pointer.
#[no_mangle]
pub unsafe extern "C" fn crescent_engine_new(
    local_hostname: *const c_char,
    metadata_server: *const c_char,
    protocol: *const c_char,
    out: *mut *mut CrescentEngine,
) -> i32 {
    crescent_ffi::init_logging();
    status(|| {
        non_null(out, "out")?;
        // SAFETY: caller's contract on the strings.
        let host = unsafe { text_or(local_hostname, "local_hostname", "") }?;
        // SAFETY: as above.
        let metadata = unsafe { text_or(metadata_server, "metadata_server", "") }?;
        // SAFETY: as above.
        let protocol = unsafe { text_or(protocol, "protocol", "") }?;
        let mut config = EngineConfig::from_env().map_err(|e| engine_fail(&e))?;
        config.local_hostname = Some(host.trim().to_string()).filter(|h| !h.is_empty());
        config.metadata_server = if metadata.trim().is_empty() { P2P_HANDSHAKE.into() } else { metadata.into() };
        if let Some(kind) = crescent_ffi::protocol_of(protocol).map_err(|e| store_fail(&e))? {
            config.protocol = Some(kind);
        }
        let engine = TransferEngine::new(config).map_err(|e| engine_fail(&e))?;
        let token = insert(Object::Engine(Arc::new(EngineState { engine, managed: Mutex::new(HashMap::new()) })));
        // SAFETY: checked non-null above; writable per the caller's contract.
        unsafe { put_out(out, token as *mut CrescentEngine, "out") }
    })
}

/// Stops an engine and frees its handle (and the buffers from `crescent_engine_alloc`). Calls
/// still running on other threads finish first.
#[no_mangle]
pub extern "C" fn crescent_engine_free(engine: *mut CrescentEngine) -> i32 {
    status(|| {
        let mut handles = HANDLES.write();
        match handles.get(&(engine as usize)) {
            Some(Object::Engine(_)) => {
                handles.remove(&(engine as usize));
                Ok(())
            }
            _ => Err(bad_handle("engine")),
        }
    })
}

/// Copies the engine's segment name (`host:port`, what peers pass to open it) with a NUL into
/// `buf` of `len` bytes. Returns the name's length (without the NUL), or
/// `CRESCENT_ERR_BUFFER_OVERFLOW` when `len` is too small.
///
/// # Safety
/// `buf` points to `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn crescent_engine_segment_name(
    engine: *const CrescentEngine,
    buf: *mut c_char,
    len: usize,
) -> i64 {
    engine_call(engine, |e| {
        // SAFETY: forwarded contract.
        unsafe { copy_name(e.engine.segment_name(), buf, len) }
    })
}

/// The engine's handshake (RPC) port.
#[no_mangle]
pub extern "C" fn crescent_engine_rpc_port(engine: *const CrescentEngine) -> i32 {
    engine_call(engine, |e| Ok(e.engine.rpc_port() as i64)) as i32
}

/// Registers `[addr, addr+len)` for transfers; `location` null means `"cpu:0"`. The memory
/// must stay valid until `crescent_engine_unregister`.
///
/// # Safety
/// `location` is null or NUL-terminated; the memory stays valid while registered.
#[no_mangle]
pub unsafe extern "C" fn crescent_engine_register(
    engine: *const CrescentEngine,
    addr: *mut c_void,
    len: usize,
    location: *const c_char,
) -> i32 {
    engine_status(engine, |e| {
        non_null(addr, "addr")?;
        // SAFETY: caller's contract on the string.
        let location = unsafe { text_or(location, "location", "cpu:0") }?;
        e.engine.register(addr as u64, len as u64, location).map_err(|e| engine_fail(&e))
    })
}

/// Unregisters the region that starts at `addr` (refused while transfers use it).
#[no_mangle]
pub extern "C" fn crescent_engine_unregister(engine: *const CrescentEngine, addr: *mut c_void) -> i32 {
    engine_status(engine, |e| e.engine.unregister(addr as u64).map_err(|e| engine_fail(&e)))
}

/// Allocates `len` bytes of registered, shareable memory; the address goes to `*out_addr`.
/// Free it with `crescent_engine_free_buffer` (or with the engine).
///
/// # Safety
/// `out_addr` points to writable memory for one pointer.
#[no_mangle]
pub unsafe extern "C" fn crescent_engine_alloc(
    engine: *const CrescentEngine,
    len: usize,
    out_addr: *mut *mut c_void,
) -> i32 {
    engine_status(engine, |e| {
        non_null(out_addr, "out_addr")?;
        let mem = e.engine.alloc_registered(len as u64, "cpu:0").map_err(|e| engine_fail(&e))?;
        let addr = mem.addr();
        e.managed.lock().insert(addr, mem);
        // SAFETY: checked non-null; writable per the caller's contract.
        unsafe { put_out(out_addr, addr as *mut c_void, "out_addr") }
    })
}

/// Frees a buffer from `crescent_engine_alloc`.
#[no_mangle]
pub extern "C" fn crescent_engine_free_buffer(engine: *const CrescentEngine, addr: *mut c_void) -> i32 {
    engine_status(engine, |e| {
        let mem = e
            .managed
            .lock()
            .remove(&(addr as u64))
            .ok_or_else(|| invalid(format!("{addr:p} is not a buffer from crescent_engine_alloc")))?;
        e.engine.free_registered(mem.clone()).map_err(|err| {
            e.managed.lock().insert(mem.addr(), mem);
            engine_fail(&err)
        })
    })
}

/// Opens the segment `name` (`host:port`, from the peer's `crescent_engine_segment_name`);
/// its handle goes to `*out_segment`. Opening the same name again gives the same handle.
///
/// # Safety
/// `name` is NUL-terminated; `out_segment` points to a writable `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn crescent_engine_open_segment(
    engine: *const CrescentEngine,
    name: *const c_char,
    out_segment: *mut u64,
) -> i32 {
    engine_status(engine, |e| {
        // SAFETY: caller's contract on the string.
        let name = unsafe { text(name, "name") }?;
        non_null(out_segment, "out_segment")?;
        let id = e.engine.open_segment(name).map_err(|e| engine_fail(&e))?;
        // SAFETY: checked non-null; writable per the caller's contract.
        unsafe { put_out(out_segment, id, "out_segment") }
    })
}

/// The address and length of an opened segment's `index`-th registered buffer, as last
/// fetched. Returns the number of buffers; `CRESCENT_ERR_INVALID_PARAMS` if `index` is past it.
///
/// # Safety
/// `out_addr` and `out_len` point to writable `uint64_t`s.
#[no_mangle]
pub unsafe extern "C" fn crescent_engine_segment_buffer(
    engine: *const CrescentEngine,
    segment: u64,
    index: usize,
    out_addr: *mut u64,
    out_len: *mut u64,
) -> i64 {
    engine_call(engine, |e| {
        let d = e.engine.segment_descriptor(segment).map_err(|e| engine_fail(&e))?;
        let b = d
            .buffers
            .get(index)
            .ok_or_else(|| invalid(format!("segment has {} buffer(s); index {index} is past them", d.buffers.len())))?;
        // SAFETY: writable per the caller's contract (null is refused by put_out).
        unsafe { put_out(out_addr, b.addr, "out_addr") }?;
        // SAFETY: as above.
        unsafe { put_out(out_len, b.length, "out_len") }?;
        Ok(d.buffers.len() as i64)
    })
}

/// Creates a batch for up to `capacity` requests; its id goes to `*out_batch`.
///
/// # Safety
/// `out_batch` points to a writable `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn crescent_engine_allocate_batch(
    engine: *const CrescentEngine,
    capacity: usize,
    out_batch: *mut u64,
) -> i32 {
    engine_status(engine, |e| {
        non_null(out_batch, "out_batch")?;
        let id = e.engine.allocate_batch(capacity).map_err(|e| engine_fail(&e))?;
        // SAFETY: checked non-null; writable per the caller's contract.
        unsafe { put_out(out_batch, id, "out_batch") }
    })
}

fn requests_of(reqs: &[CrescentTransferRequest]) -> R<Vec<TransferRequest>> {
    reqs.iter()
        .enumerate()
        .map(|(i, r)| {
            let opcode = match r.opcode {
                CRESCENT_OPCODE_READ => Opcode::Read,
                CRESCENT_OPCODE_WRITE => Opcode::Write,
                other => return Err(invalid(format!("requests[{i}].opcode {other} is neither READ nor WRITE"))),
            };
            Ok(TransferRequest {
                opcode,
                source: r.source as u64,
                target: r.segment,
                target_offset: r.target_offset,
                length: r.length,
            })
        })
        .collect()
}

/// Submits `count` requests into a batch (after those already in it); returns at once. A
/// request whose local memory is not registered rejects the whole submission; one outside the
/// target's memory ends `CRESCENT_TRANSFER_FAILED`.
///
/// # Safety
/// `requests` points to `count` requests.
#[no_mangle]
pub unsafe extern "C" fn crescent_engine_submit(
    engine: *const CrescentEngine,
    batch: u64,
    requests: *const CrescentTransferRequest,
    count: usize,
) -> i32 {
    engine_status(engine, |e| {
        // SAFETY: `count` requests per the caller's contract.
        let reqs = requests_of(unsafe { array(requests, count, "requests") }?)?;
        e.engine.submit(batch, &reqs).map_err(|e| engine_fail(&e))
    })
}

fn write_statuses(statuses: &[TransferStatus], out: *mut i32, count: usize) -> R<i64> {
    if statuses.len() > count {
        return Err(fail(
            Status::BufferOverflow,
            format!("the batch holds {} submitted requests; the status array has room for {count}", statuses.len()),
        ));
    }
    // SAFETY: `count` writable ints per the caller's contract (checked by array_mut).
    let out = unsafe { array_mut(out, count, "statuses") }?;
    for (o, s) in out.iter_mut().zip(statuses) {
        *o = match s {
            TransferStatus::Pending => CRESCENT_TRANSFER_PENDING,
            TransferStatus::Completed => CRESCENT_TRANSFER_COMPLETED,
            TransferStatus::Failed(_) => CRESCENT_TRANSFER_FAILED,
            TransferStatus::TimedOut => CRESCENT_TRANSFER_TIMED_OUT,
        };
    }
    if let Some((i, TransferStatus::Failed(reason))) =
        statuses.iter().enumerate().find(|(_, s)| matches!(s, TransferStatus::Failed(_)))
    {
        // Not an error of this call: the reason of the first failure, for the caller's log.
        crescent_ffi::set_last_error(format!("request {i} failed: {reason}"));
    }
    Ok(statuses.len() as i64)
}

/// Polls a batch: writes each submitted request's state (`CRESCENT_TRANSFER_*`) into
/// `statuses` (room for `count`) and returns how many were written. After a failed request,
/// `crescent_last_error` names the reason of the first failure.
///
/// # Safety
/// `statuses` points to `count` writable `int32_t`s.
#[no_mangle]
pub unsafe extern "C" fn crescent_engine_batch_status(
    engine: *const CrescentEngine,
    batch: u64,
    statuses: *mut i32,
    count: usize,
) -> i64 {
    engine_call(engine, |e| {
        let s = e.engine.batch_status(batch).map_err(|e| engine_fail(&e))?;
        write_statuses(&s, statuses, count)
    })
}

/// Blocks until every submitted request of the batch has ended, or `timeout_ms` passes
/// (negative: no limit beyond the engine's own transfer timeout), then writes the states as
/// `crescent_engine_batch_status` does.
///
/// # Safety
/// `statuses` points to `count` writable `int32_t`s.
#[no_mangle]
pub unsafe extern "C" fn crescent_engine_wait_batch(
    engine: *const CrescentEngine,
    batch: u64,
    timeout_ms: i64,
    statuses: *mut i32,
    count: usize,
) -> i64 {
    engine_call(engine, |e| {
        let timeout = u64::try_from(timeout_ms).ok().map(Duration::from_millis);
        let s = e.engine.wait_batch(batch, timeout).map_err(|e| engine_fail(&e))?;
        write_statuses(&s, statuses, count)
    })
}

/// Frees a batch; refused (`CRESCENT_ERR_UNAVAILABLE_IN_CURRENT_STATUS`) while requests are
/// in flight.
#[no_mangle]
pub extern "C" fn crescent_engine_free_batch(engine: *const CrescentEngine, batch: u64) -> i32 {
    engine_status(engine, |e| e.engine.free_batch(batch).map_err(|e| engine_fail(&e)))
}

/// Moves `count` requests and blocks until all have ended; `CRESCENT_OK` only if all completed.
///
/// # Safety
/// `requests` points to `count` requests.
#[no_mangle]
pub unsafe extern "C" fn crescent_engine_transfer_sync(
    engine: *const CrescentEngine,
    requests: *const CrescentTransferRequest,
    count: usize,
) -> i32 {
    engine_status(engine, |e| {
        // SAFETY: `count` requests per the caller's contract.
        let reqs = requests_of(unsafe { array(requests, count, "requests") }?)?;
        e.engine.transfer_sync(&reqs).map_err(|e| engine_fail(&e))
    })
}
