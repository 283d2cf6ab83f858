//! Argument conversion: C strings, arrays and out-pointers checked and turned into Rust values
//! (null pointers, bad UTF-8 and short buffers as statuses).

use std::ffi::{c_char, CStr};

use crescent_ffi::store::proto::PutOptions;
use crescent_ffi::store::{StoreApi, StoreClient};
use crescent_ffi::{fail, raw, store_fail, ReplicateConfig, SoftPinAction, Status};

use crate::{CrescentReplicateConfig, R};

pub(crate) fn invalid(message: impl std::fmt::Display) -> Status {
    fail(Status::InvalidParams, message)
}

/// `Ok` when `p`, named `what` in the error, is not null.
pub(crate) fn non_null<T>(p: *const T, what: &str) -> R<()> {
    if p.is_null() {
        return Err(invalid(format!("{what} is null")));
    }
    Ok(())
}

/// A required C string.
///
/// # Safety
/// `p` is null or points to a NUL-terminated string that outlives the call.
pub(crate) unsafe fn text<'a>(p: *const c_char, what: &str) -> R<&'a str> {
    if p.is_null() {
        return Err(invalid(format!("{what} is null")));
    }
    // SAFETY: non-null, NUL-terminated per the caller's contract.
    unsafe { CStr::from_ptr(p) }.to_str().map_err(|_| invalid(format!("{what} is not valid UTF-8")))
}

/// An optional C string: null gives `default`.
///
/// # Safety
/// As [`text`].
pub(crate) unsafe fn text_or<'a>(p: *const c_char, what: &str, default: &'a str) -> R<&'a str> {
    if p.is_null() {
        Ok(default)
    } else {
        // SAFETY: forwarded contract.
        unsafe { text(p, what) }
    }
}

/// `count` elements at `p` (null allowed only when `count` is 0).
///
/// # Safety
/// `p` points to `count` initialised elements that outlive the call.
pub(crate) unsafe fn array<'a, T>(p: *const T, count: usize, what: &str) -> R<&'a [T]> {
    // SAFETY: forwarded contract.
    unsafe { raw::slice(p, count) }.map_err(|e| invalid(e.message(what, "null")))
}

/// `count` writable elements at `p`.
///
/// # Safety
/// `p` points to `count` writable elements that outlive the call and nothing else aliases them.
pub(crate) unsafe fn array_mut<'a, T>(p: *mut T, count: usize, what: &str) -> R<&'a mut [T]> {
    // SAFETY: forwarded contract.
    unsafe { raw::slice_mut(p, count) }.map_err(|e| invalid(e.message(what, "null")))
}

/// Keys from an array of C strings.
///
/// # Safety
/// `keys` points to `count` pointers, each a NUL-terminated string that outlives the call.
pub(crate) unsafe fn keys_of(keys: *const *const c_char, count: usize) -> R<Vec<String>> {
    // SAFETY: forwarded contract.
    unsafe { texts(keys, count, "keys") }
}

/// Strings from an array of `count` C strings, named `what[i]` in errors.
///
/// # Safety
/// As [`keys_of`].
pub(crate) unsafe fn texts(p: *const *const c_char, count: usize, what: &str) -> R<Vec<String>> {
    // SAFETY: forwarded contract.
    let ptrs = unsafe { array(p, count, what) }?;
    ptrs.iter()
        .enumerate()
        // SAFETY: each element is a string per the caller's contract.
        .map(|(i, &p)| unsafe { text(p, &format!("{what}[{i}]")) }.map(str::to_string))
        .collect()
}

/// The put options of `config` (null: the client's defaults).
///
/// # Safety
/// `config` is null or points to a valid `CrescentReplicateConfig` whose strings outlive the
/// call.
pub(crate) unsafe fn put_options(s: &StoreClient, config: *const CrescentReplicateConfig) -> R<PutOptions> {
    // SAFETY: null or valid per the caller's contract.
    let Some(c) = (unsafe { config.as_ref() }) else {
        return Ok(s.default_options());
    };
    // SAFETY: the strings per the caller's contract.
    let (preferred_segment, preferred_segments) = unsafe {
        (
            text_or(c.preferred_segment, "preferred_segment", "")?.to_string(),
            texts(c.preferred_segments, c.preferred_segments_count, "preferred_segments")?,
        )
    };
    let config = ReplicateConfig {
        replica_num: c.replica_num,
        soft_pin_action: if c.with_soft_pin { SoftPinAction::Enable } else { SoftPinAction::Preserve },
        with_hard_pin: c.with_hard_pin,
        preferred_segment,
        preferred_segments,
        ..ReplicateConfig::default()
    };
    config.put_options(s).map_err(|e| store_fail(&e))
}

/// The arrays of a zero-copy batch call as the store client takes them: keys, buffer
/// addresses (`addr` turns a buffer pointer into one) and sizes.
///
/// # Safety
/// `keys`, `buffers` and `sizes` point to `count` elements each.
pub(crate) unsafe fn batch_args<P: Copy>(
    keys: *const *const c_char,
    buffers: *const P,
    sizes: *const usize,
    count: usize,
    addr: impl Fn(P) -> u64,
) -> R<(Vec<String>, Vec<u64>, Vec<u64>)> {
    // SAFETY: forwarded contract.
    let (keys, bufs, sizes) =
        unsafe { (keys_of(keys, count)?, array(buffers, count, "buffers")?, array(sizes, count, "sizes")?) };
    Ok((keys, bufs.iter().map(|&p| addr(p)).collect(), sizes.iter().map(|&n| n as u64).collect()))
}

/// Copies `name` with a NUL into `buf` of `len` bytes: its length, or BUFFER_OVERFLOW.
///
/// # Safety
/// `buf` points to `len` writable bytes.
pub(crate) unsafe fn copy_name(name: &str, buf: *mut c_char, len: usize) -> R<i64> {
    let name = name.as_bytes();
    if name.len() + 1 > len {
        return Err(fail(
            Status::BufferOverflow,
            format!("the segment name needs {} bytes, the buffer has {len}", name.len() + 1),
        ));
    }
    // SAFETY: `len` writable bytes per the caller's contract.
    let dst = unsafe { array_mut(buf.cast::<u8>(), len, "buf") }?;
    dst[..name.len()].copy_from_slice(name);
    dst[name.len()] = 0;
    Ok(name.len() as i64)
}

/// Writes each key's integer into its result.
pub(crate) fn fill<T: TryFrom<i64>>(out: &mut [T], values: Vec<i64>) -> R<()> {
    for (o, v) in out.iter_mut().zip(values) {
        *o = T::try_from(v).map_err(|_| fail(Status::Internal, format!("result {v} does not fit")))?;
    }
    Ok(())
}

/// Writes through an out-pointer.
///
/// # Safety
/// `out` is null or points to writable memory for one `T`.
pub(crate) unsafe fn put_out<T>(out: *mut T, value: T, what: &str) -> R<()> {
    if out.is_null() {
        return Err(invalid(format!("{what} is null")));
    }
    // SAFETY: non-null and writable per the caller's contract.
    unsafe { out.write(value) };
    Ok(())
}
