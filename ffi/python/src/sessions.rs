//! The ranged session calls: their preamble and their ranges checked per key.

use std::sync::Arc;

use crescent_ffi::session_fail;
use crescent_ffi::store::client::Extent;
use crescent_ffi::store::{Result as StoreResult, StoreApi};
use pyo3::prelude::*;

use crate::mem::*;
use crate::store::Store;
use crate::{invalid, not_set_up, per_key};

/// Per key of a ranged session call: its result so far (Ok until refused) and its ranges.
pub(crate) type SessionRanges = (Vec<Result<u64, i32>>, Vec<Vec<Extent>>);

/// The arguments of a ranged session call: per key, its buffers (int addresses or buffer
/// objects), their sizes and their offsets in the value.
pub(crate) struct Ranges<'a, 'py> {
    pub(crate) keys: &'a [String],
    pub(crate) buffers: &'a Bound<'py, PyAny>,
    pub(crate) sizes: &'a [Vec<u64>],
    pub(crate) offsets: &'a [Vec<u64>],
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

/// The per-key results of a session's ranged transfer of many keys.
type RangedResults = StoreResult<Vec<StoreResult<u64>>>;

impl Store {
    /// The preamble of the session calls: the last error cleared; before set-up the refusal
    /// recorded and no result (`[]`, Mooncake's answer).
    pub(crate) fn session<T>(&self, what: &str, f: impl FnOnce(Arc<dyn StoreApi>) -> Vec<T>) -> Vec<T> {
        crescent_ffi::clear_last_error();
        let Some(client) = self.client() else {
            not_set_up(what);
            return Vec::new();
        };
        f(client)
    }

    /// A ranged session call: the ranges checked per key (buffers written when `writable`),
    /// then `transfer` of the keys not refused, with the GIL released. Bytes moved per key, or
    /// a negative code.
    pub(crate) fn session_ranges(
        &self,
        py: Python<'_>,
        what: &str,
        args: Ranges<'_, '_>,
        writable: bool,
        transfer: impl FnOnce(&dyn StoreApi, &[String], &[&[Extent]]) -> RangedResults + Send,
    ) -> PyResult<Vec<i64>> {
        crescent_ffi::clear_last_error();
        let Some(client) = self.client() else {
            not_set_up(what);
            return Ok(Vec::new());
        };
        let mut keep = Vec::new();
        let (mut results, ranges) = checked_ranges(&*client, what, &args, writable, &mut keep)?;
        py.detach(|| {
            on_accepted(&mut results, args.keys, ranges, |keys, ranges| {
                let refs: Vec<&[Extent]> = ranges.iter().map(|r| &r[..]).collect();
                let codes = session_codes(transfer(&*client, keys, &refs), keys.len(), |n| n as i64);
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
