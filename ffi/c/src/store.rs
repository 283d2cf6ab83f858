//! The store client's functions (`crescent_store_*`): most run a row of the method table
//! (`crescent_ffi::methods::c`).

use std::ffi::{c_char, c_void};

use crescent_ffi::methods::{self, c, Mem, Method};
use crescent_ffi::store::client::Buffer;
use crescent_ffi::store::proto::PutOptions;
use crescent_ffi::store::{StoreApi, StoreClient};
use crescent_ffi::{fail, store_fail, SetupArgs, Status};

use crate::args::{
    array, array_mut, batch_args, copy_name, fill, keys_of, non_null, put_options, put_out, text, text_or,
};
use crate::calls::{status, store_call, store_status};
use crate::handles::{bad_handle, insert, Object, HANDLES};
use crate::{CrescentReplicateConfig, CrescentStore, R};

/// `len` bytes of host memory at `addr`.
fn host<'a>(addr: u64, len: usize) -> Mem<'a> {
    Mem::Buffers(vec![Buffer::host(addr, len as u64)])
}

/// Runs row `m`'s op of `key` with `mem`: 0, a size, a count or 1/0, or the op's status.
fn one<'a>(s: &StoreClient, m: &'static Method, key: &'a str, mem: Mem<'a>, options: PutOptions) -> R<i64> {
    let answer = methods::run(s, m, vec![Ok(m.op(key, mem, false))], options);
    match answer.int(m) {
        code if code < 0 => Err(Status::from_code(code as i32).unwrap_or(Status::Internal)),
        v => Ok(v),
    }
}

/// Runs row `m`'s ops of `keys` with `mems`: each op's integer (0, a size or 1/0, or its
/// status), or the status of the whole call.
fn each<'a>(
    s: &StoreClient,
    m: &'static Method,
    keys: &'a [String],
    mems: Vec<Mem<'a>>,
    options: PutOptions,
) -> R<Vec<i64>> {
    let ops = keys.iter().zip(mems).map(|(k, mem)| Ok(m.op(k, mem, false))).collect();
    let answer = methods::run(s, m, ops, options);
    answer.whole?;
    Ok(answer.ints())
}

/// Runs row `m`'s zero-copy ops of a batch, `keys[i]` on registered `buffers[i]` of `sizes[i]`
/// bytes, and writes each op's integer to `results[i]`; `options` (asked once the arrays are
/// read) place the values.
///
/// # Safety
/// `keys`, `buffers`, `sizes` and `results` point to `count` elements each.
unsafe fn each_registered<T: TryFrom<i64>>(
    s: &StoreClient,
    m: &'static Method,
    (keys, buffers, sizes, count): (*const *const c_char, *const *const c_void, *const usize, usize),
    results: *mut T,
    options: impl FnOnce() -> R<PutOptions>,
) -> R<()> {
    // SAFETY: forwarded contract.
    let ((keys, addrs, lens), out) =
        unsafe { (batch_args(keys, buffers, sizes, count, |p| p as u64)?, array_mut(results, count, "results")?) };
    let options = options()?;
    let mems = addrs.iter().zip(&lens).map(|(&a, &n)| host(a, n as usize)).collect();
    fill(out, each(s, m, &keys, mems, options)?)
}

/// The preamble of the calls on one key (or pattern, named `what` in errors), written once:
/// the last error cleared, the store's handle resolved and the key read; then `f`, whose
/// integer (0, a size, a count or 1/0) or negative status is returned.
///
/// # Safety
/// `key` is null or NUL-terminated.
unsafe fn with_key(
    store: *const CrescentStore,
    key: *const c_char,
    what: &str,
    f: impl FnOnce(&StoreClient, &str) -> R<i64>,
) -> i64 {
    store_call(store, |s| {
        // SAFETY: caller's contract.
        let key = unsafe { text(key, what) }?;
        f(s, key)
    })
}

/// Runs row `m`'s op of the key (or pattern) at `key`, named `what` in errors, with no memory.
///
/// # Safety
/// `key` is null or NUL-terminated.
unsafe fn keyed(store: *const CrescentStore, key: *const c_char, what: &str, m: &'static Method) -> i64 {
    // SAFETY: forwarded contract.
    unsafe { with_key(store, key, what, |s, key| one(s, m, key, Mem::None, PutOptions::default())) }
}

/// Mooncake's `setup`: starts a store client, contributes `global_segment_size` bytes to the
/// pool and connects to the master at `master_server_addr`; the handle goes to `*out`.
/// Null strings and zero sizes take Mooncake's defaults (auto host, `P2PHANDSHAKE`, 16 MiB,
/// 16 MiB, `tcp`, no devices, `127.0.0.1:50051`).
///
/// # Safety
/// Strings are null or NUL-terminated; `out` points to writable memory for one pointer.
#[no_mangle]
#[allow(clippy::too_many_arguments)] // Mooncake's argument list
pub unsafe extern "C" fn crescent_store_setup(
    local_hostname: *const c_char,
    metadata_server: *const c_char,
    global_segment_size: u64,
    local_buffer_size: u64,
    protocol: *const c_char,
    rdma_devices: *const c_char,
    master_server_addr: *const c_char,
    out: *mut *mut CrescentStore,
) -> i32 {
    crescent_ffi::init_logging();
    status(|| {
        non_null(out, "out")?;
        let d = SetupArgs::default();
        // SAFETY: the caller's contract on the strings (null or NUL-terminated), for all five.
        let (local_hostname, metadata_server, protocol, rdma_devices, master_server_addr) = unsafe {
            (
                text_or(local_hostname, "local_hostname", "")?,
                text_or(metadata_server, "metadata_server", &d.metadata_server)?,
                text_or(protocol, "protocol", &d.protocol)?,
                text_or(rdma_devices, "rdma_devices", "")?,
                text_or(master_server_addr, "master_server_addr", &d.master_server_addr)?,
            )
        };
        let args = SetupArgs {
            local_hostname: local_hostname.into(),
            metadata_server: metadata_server.into(),
            global_segment_size: if global_segment_size == 0 { d.global_segment_size } else { global_segment_size },
            local_buffer_size: if local_buffer_size == 0 { d.local_buffer_size } else { local_buffer_size },
            protocol: protocol.into(),
            rdma_devices: rdma_devices.into(),
            master_server_addr: master_server_addr.into(),
            ..SetupArgs::default()
        };
        let config = args.client_config().map_err(|e| store_fail(&e))?;
        let client = StoreClient::connect(config).map_err(|e| store_fail(&e))?;
        let token = insert(Object::Store(client));
        // SAFETY: checked non-null; writable per the caller's contract.
        unsafe { put_out(out, token as *mut CrescentStore, "out") }
    })
}

/// Closes a store client (unmounts its segment; its objects leave the pool) and frees the
/// handle, which is invalid afterwards even if closing reported an error.
#[no_mangle]
pub extern "C" fn crescent_store_close(store: *mut CrescentStore) -> i32 {
    status(|| {
        let client = {
            let mut handles = HANDLES.write();
            match handles.get(&(store as usize)) {
                Some(Object::Store(s)) => {
                    let s = s.clone();
                    handles.remove(&(store as usize));
                    s
                }
                _ => return Err(bad_handle("store")),
            }
        };
        client.close().map_err(|e| store_fail(&e))
    })
}

/// Copies the client's segment name (`host:port`, Mooncake's `get_hostname`: what a
/// `CrescentReplicateConfig` names to prefer it) with a NUL into `buf` of `len` bytes.
/// Returns the name's length (without the NUL), or `CRESCENT_ERR_BUFFER_OVERFLOW`.
///
/// # Safety
/// `buf` points to `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn crescent_store_segment_name(store: *const CrescentStore, buf: *mut c_char, len: usize) -> i64 {
    store_call(store, |s| {
        // SAFETY: forwarded contract.
        unsafe { copy_name(s.segment_name(), buf, len) }
    })
}

/// Puts `len` bytes at `value` under `key` (copied through the client's staging buffer).
///
/// # Safety
/// `key` is NUL-terminated; `value` points to `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn crescent_store_put(
    store: *const CrescentStore,
    key: *const c_char,
    value: *const c_void,
    len: usize,
) -> i32 {
    // SAFETY: forwarded contract; no config.
    unsafe { crescent_store_put_with(store, key, value, len, std::ptr::null()) }
}

/// `crescent_store_put`, placed as `config` asks (null: as `crescent_store_put`).
///
/// # Safety
/// As `crescent_store_put`; `config` is null or valid, its strings NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn crescent_store_put_with(
    store: *const CrescentStore,
    key: *const c_char,
    value: *const c_void,
    len: usize,
    config: *const CrescentReplicateConfig,
) -> i32 {
    let put = |s: &StoreClient, key: &str| {
        // SAFETY: a null or valid config and `len` readable bytes per the caller's contract.
        let (options, value) = unsafe { (put_options(s, config)?, array(value.cast::<u8>(), len, "value")?) };
        one(s, &c::PUT, key, Mem::Bytes(value), options).map(|_| 0)
    };
    // SAFETY: the caller's contract on the key.
    unsafe { with_key(store, key, "key", put) as i32 }
}

/// Gets `key` into `buf` (any memory, `len` bytes). Returns the object's size, or
/// `CRESCENT_ERR_BUFFER_OVERFLOW` (nothing written) when it does not fit.
///
/// # Safety
/// `key` is NUL-terminated; `buf` points to `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn crescent_store_get(
    store: *const CrescentStore,
    key: *const c_char,
    buf: *mut c_void,
    len: usize,
) -> i64 {
    let get = |s: &StoreClient, key: &str| {
        let value = s.get(key).map_err(|e| store_fail(&e))?;
        if value.len() > len {
            return Err(fail(
                Status::BufferOverflow,
                format!("buffer of {len} bytes is too small for object {key:?} of {} bytes", value.len()),
            ));
        }
        // SAFETY: `len` writable bytes per the caller's contract.
        let dst = unsafe { array_mut(buf.cast::<u8>(), len, "buf") }?;
        dst[..value.len()].copy_from_slice(&value);
        Ok(value.len() as i64)
    };
    // SAFETY: the caller's contract on the key.
    unsafe { with_key(store, key, "key", get) }
}

/// Registers caller memory for the zero-copy calls (`put_from`, `get_into` and their batch
/// forms). Register once and reuse: registration is slow on RDMA NICs.
///
/// # Safety
/// The memory stays valid until `crescent_store_unregister_buffer` or close.
#[no_mangle]
pub unsafe extern "C" fn crescent_store_register_buffer(
    store: *const CrescentStore,
    addr: *mut c_void,
    len: usize,
) -> i32 {
    store_status(store, |s| {
        non_null(addr, "addr")?;
        s.register_buffer(addr as u64, len as u64).map_err(|e| store_fail(&e))
    })
}

/// Unregisters the buffer registered at `addr`.
#[no_mangle]
pub extern "C" fn crescent_store_unregister_buffer(store: *const CrescentStore, addr: *mut c_void) -> i32 {
    store_status(store, |s| s.unregister_buffer(addr as u64).map_err(|e| store_fail(&e)))
}

/// Zero-copy put of `len` bytes of registered memory at `buf`.
///
/// # Safety
/// `key` is NUL-terminated; `buf` is registered and holds `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn crescent_store_put_from(
    store: *const CrescentStore,
    key: *const c_char,
    buf: *const c_void,
    len: usize,
) -> i32 {
    // SAFETY: forwarded contract; no config.
    unsafe { crescent_store_put_from_with(store, key, buf, len, std::ptr::null()) }
}

/// `crescent_store_put_from`, placed as `config` asks (null: as `crescent_store_put_from`).
///
/// # Safety
/// As `crescent_store_put_from`; `config` is null or valid, its strings NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn crescent_store_put_from_with(
    store: *const CrescentStore,
    key: *const c_char,
    buf: *const c_void,
    len: usize,
    config: *const CrescentReplicateConfig,
) -> i32 {
    let put = |s: &StoreClient, key: &str| {
        // SAFETY: a null or valid config per the caller's contract.
        let options = unsafe { put_options(s, config) }?;
        one(s, &c::PUT_FROM, key, host(buf as u64, len), options).map(|_| 0)
    };
    // SAFETY: the caller's contract on the key.
    unsafe { with_key(store, key, "key", put) as i32 }
}

/// Zero-copy get into registered memory (`len` bytes at `buf`). Returns the object's size,
/// or `CRESCENT_ERR_BUFFER_OVERFLOW` when it does not fit.
///
/// # Safety
/// `key` is NUL-terminated; `buf` is registered and holds `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn crescent_store_get_into(
    store: *const CrescentStore,
    key: *const c_char,
    buf: *mut c_void,
    len: usize,
) -> i64 {
    // SAFETY: the caller's contract on the key.
    unsafe {
        with_key(store, key, "key", |s, key| one(s, &c::GET_INTO, key, host(buf as u64, len), PutOptions::default()))
    }
}

/// Zero-copy puts of `count` values: `keys[i]` from registered `buffers[i]` of `sizes[i]`
/// bytes, one master round trip. `results[i]` gets each key's status. Returns `CRESCENT_OK`
/// when the call ran (see `results`), or an error for the whole call.
///
/// # Safety
/// `keys`, `buffers`, `sizes` and `results` point to `count` elements each.
#[no_mangle]
pub unsafe extern "C" fn crescent_store_batch_put_from(
    store: *const CrescentStore,
    keys: *const *const c_char,
    buffers: *const *const c_void,
    sizes: *const usize,
    count: usize,
    results: *mut i32,
) -> i32 {
    // SAFETY: forwarded contract; no config.
    unsafe { crescent_store_batch_put_from_with(store, keys, buffers, sizes, count, results, std::ptr::null()) }
}

/// `crescent_store_batch_put_from`, every value placed as `config` asks (null: as
/// `crescent_store_batch_put_from`).
///
/// # Safety
/// As `crescent_store_batch_put_from`; `config` is null or valid, its strings NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn crescent_store_batch_put_from_with(
    store: *const CrescentStore,
    keys: *const *const c_char,
    buffers: *const *const c_void,
    sizes: *const usize,
    count: usize,
    results: *mut i32,
    config: *const CrescentReplicateConfig,
) -> i32 {
    store_status(store, |s| {
        // SAFETY: `count` elements each and a null or valid config per the caller's contract.
        let options = || unsafe { put_options(s, config) };
        // SAFETY: as above.
        unsafe { each_registered(s, &c::BATCH_PUT_FROM, (keys, buffers, sizes, count), results, options) }
    })
}

/// Zero-copy gets of `count` keys into registered `buffers[i]` of `sizes[i]` bytes, one master
/// round trip and one engine batch. `results[i]` gets the size read or a negative status.
/// Returns `CRESCENT_OK` when the call ran (see `results`), or an error for the whole call.
///
/// # Safety
/// `keys`, `buffers`, `sizes` and `results` point to `count` elements each.
#[no_mangle]
pub unsafe extern "C" fn crescent_store_batch_get_into(
    store: *const CrescentStore,
    keys: *const *const c_char,
    buffers: *const *mut c_void,
    sizes: *const usize,
    count: usize,
    results: *mut i64,
) -> i32 {
    store_status(store, |s| {
        let batch = (keys, buffers.cast::<*const c_void>(), sizes, count);
        // SAFETY: `count` elements each per the caller's contract.
        unsafe { each_registered(s, &c::BATCH_GET_INTO, batch, results, || Ok(PutOptions::default())) }
    })
}

/// 1 if `key` exists, 0 if not, a negative status on error. Grants no lease.
///
/// # Safety
/// `key` is NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn crescent_store_exists(store: *const CrescentStore, key: *const c_char) -> i32 {
    // SAFETY: forwarded contract.
    unsafe { keyed(store, key, "key", &c::EXISTS) as i32 }
}

/// Existence of `count` keys: `results[i]` = 1 or 0. Returns `CRESCENT_OK` or an error for
/// the whole call.
///
/// # Safety
/// `keys` and `results` point to `count` elements each.
#[no_mangle]
pub unsafe extern "C" fn crescent_store_batch_exists(
    store: *const CrescentStore,
    keys: *const *const c_char,
    count: usize,
    results: *mut i32,
) -> i32 {
    store_status(store, |s| {
        // SAFETY: `count` elements each per the caller's contract.
        let (keys, out) = unsafe { (keys_of(keys, count)?, array_mut(results, count, "results")?) };
        let mems = keys.iter().map(|_| Mem::None).collect();
        fill(out, each(s, &c::BATCH_EXISTS, &keys, mems, PutOptions::default())?)
    })
}

/// The size of `key`'s value, or a negative status (`CRESCENT_ERR_OBJECT_NOT_FOUND`, ...).
///
/// # Safety
/// `key` is NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn crescent_store_get_size(store: *const CrescentStore, key: *const c_char) -> i64 {
    // SAFETY: forwarded contract.
    unsafe { keyed(store, key, "key", &c::GET_SIZE) }
}

/// Removes `key` (refused with `CRESCENT_ERR_OBJECT_HAS_LEASE` while a reader holds it).
///
/// # Safety
/// `key` is NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn crescent_store_remove(store: *const CrescentStore, key: *const c_char) -> i32 {
    // SAFETY: forwarded contract.
    unsafe { keyed(store, key, "key", &c::REMOVE) as i32 }
}

/// Removes every object whose key matches the regular expression; returns how many.
///
/// # Safety
/// `pattern` is NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn crescent_store_remove_by_regex(store: *const CrescentStore, pattern: *const c_char) -> i64 {
    // SAFETY: forwarded contract.
    unsafe { keyed(store, pattern, "pattern", &c::REMOVE_BY_REGEX) }
}

/// Removes every object; returns how many.
#[no_mangle]
pub extern "C" fn crescent_store_remove_all(store: *const CrescentStore) -> i64 {
    store_call(store, |s| one(s, &c::REMOVE_ALL, "", Mem::None, PutOptions::default()))
}
