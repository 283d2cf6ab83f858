//! The ranged session calls: their preamble and their ranges checked per key.

use crescent_ffi::session_fail;
use crescent_ffi::store::client::Extent;
use crescent_ffi::store::StoreApi;
use pyo3::prelude::*;

use crate::mem::*;
use crate::store::Store;
use crate::{invalid, not_set_up, per_key};

/// Per key of a ranged session call: its result so far (Ok until refused) and its ranges.
pub(crate) type SessionRanges = (Vec<Result<u64, i32>>, Vec<Vec<Extent>>);

/// The arguments of a ranged session call: per key, its buffers (int addresses or buffer
/// objects), their sizes and their offsets in the value.
struct Ranges<'a, 'py> {
    keys: &'a [String],
    buffers: &'a Bound<'py, PyAny>,
    sizes: &'a [Vec<u64>],
    offsets: &'a [Vec<u64>],
}

/// The ranges of a ranged session call, checked per key (see [`key_ranges`]); lists of other
/// lengths are INVALID_PARAMS for every key.
fn checked_ranges(
    client: &dyn StoreApi,
    what: &str,
    args: &Ranges<'_, '_>,
    writable: bool,
    keep: &mut Vec<Mem>,
) -> PyResult<SessionRanges> {
    let Ranges { keys, buffers, sizes, offsets } = *args;
    let n = keys.len();
    let ptr_lists = items(buffers)?;
    if ptr_lists.len() != n || sizes.len() != n || offsets.len() != n {
        let message = format!(
            "{what}: {n} keys, {} buffer lists, {} size lists, {} offset lists",
            ptr_lists.len(),
            sizes.len(),
            offsets.len()
        );
        return Ok((per_key(n, Err(invalid(message))), vec![Vec::new(); n]));
    }
    let mut results = Vec::with_capacity(n);
    let mut ranges = Vec::with_capacity(n);
    for i in 0..n {
        let r = key_ranges(client, &ptr_lists[i], &sizes[i], &offsets[i], writable, keep, what, &keys[i])?;
        results.push(r.as_ref().map(|_| 0).map_err(|c| *c));
        ranges.push(r.unwrap_or_default());
    }
    Ok((results, ranges))
}

impl Store {
    /// A ranged session call, `batch_get_into_multi_buffer_ranges` (`get`) or
    /// `batch_put_from_multi_buffer_ranges`: per key `i`, `sizes[i][j]` bytes at
    /// `offsets[i][j]` of the value, to or from `buffers[i][j]`. The ranges checked per key
    /// (buffers written for a get), then the transfer of the keys not refused, with the GIL
    /// released. Bytes moved per key, or a negative code.
    pub(crate) fn session_ranges(
        &self,
        py: Python<'_>,
        keys: &[String],
        buffers: &Bound<'_, PyAny>,
        sizes: &[Vec<u64>],
        offsets: &[Vec<u64>],
        get: bool,
    ) -> PyResult<Vec<i64>> {
        let what = if get { "batch_get_into_multi_buffer_ranges" } else { "batch_put_from_multi_buffer_ranges" };
        let args = Ranges { keys, buffers, sizes, offsets };
        crescent_ffi::clear_last_error();
        let Some(client) = self.client() else {
            not_set_up(what);
            return Ok(Vec::new());
        };
        let mut keep = Vec::new();
        let (mut results, ranges) = checked_ranges(&*client, what, &args, get, &mut keep)?;
        py.detach(|| {
            on_accepted(&mut results, args.keys, ranges, |keys, ranges| {
                let refs: Vec<&[Extent]> = ranges.iter().map(|r| &r[..]).collect();
                let moved = if get {
                    client.batch_get_into_session_ranges(keys, &refs)
                } else {
                    client.batch_put_from_session_ranges(keys, &refs)
                };
                let codes = session_codes(moved, keys.len(), |n| n as i64);
                codes.into_iter().map(|c| if c < 0 { Err(c as i32) } else { Ok(c as u64) }).collect()
            })
        });
        Ok(results.into_iter().map(|r| r.map_or_else(|code| code as i64, |n| n as i64)).collect())
    }
}

/// A session call's per-key results as Mooncake's codes.
pub(crate) fn session_codes<T>(
    rs: Result<Vec<Result<T, crescent_ffi::store::StoreError>>, crescent_ffi::store::StoreError>,
    n: usize,
    ok: impl Fn(T) -> i64,
) -> Vec<i64> {
    match rs {
        Ok(rs) => rs.into_iter().map(|r| r.map_or_else(|e| session_fail(&e).code() as i64, &ok)).collect(),
        Err(e) => per_key(n, session_fail(&e).code() as i64),
    }
}

/// Runs a batch call on the keys not refused yet (`results[i]` is `Err(code)` for a refused
/// key), and puts each of its results in its key's place.
pub(crate) fn on_accepted<T, V>(
    results: &mut [Result<T, i32>],
    keys: &[String],
    values: Vec<V>,
    call: impl FnOnce(&[String], &[V]) -> Vec<Result<T, i32>>,
) {
    let accepted: Vec<usize> = (0..keys.len()).filter(|&i| results[i].is_ok()).collect();
    if accepted.is_empty() {
        return;
    }
    let sub_keys: Vec<String> = accepted.iter().map(|&i| keys[i].clone()).collect();
    let mut values: Vec<Option<V>> = values.into_iter().map(Some).collect();
    let sub_values: Vec<V> = accepted.iter().filter_map(|&i| values[i].take()).collect();
    for (&i, r) in accepted.iter().zip(call(&sub_keys, &sub_values)) {
        results[i] = r;
    }
}
