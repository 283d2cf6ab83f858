//! `get_into_ranges`: ranges of many values read into registered buffers, every key in one
//! master round trip and one engine batch.

use std::collections::HashMap;

use crescent_ffi::store::client::Extent;
use crescent_ffi::store::StoreApi;
use crescent_ffi::{store_fail, Status};
use pyo3::prelude::*;

use crate::mem::*;
use crate::store::Store;
use crate::{invalid, not_set_up};

/// The lists of a `get_into_ranges` call, per buffer `i`, key `j`, range `k`.
pub(crate) struct RangeLists {
    pub(crate) all_keys: Vec<Vec<String>>,
    pub(crate) all_dst_offsets: Vec<Vec<Vec<u64>>>,
    pub(crate) all_src_offsets: Vec<Vec<Vec<u64>>>,
    pub(crate) all_sizes: Vec<Vec<Vec<u64>>>,
}

impl Store {
    /// `get_into_ranges`: the bytes read or a negative code per range, in the lists' shape.
    pub(crate) fn read_ranges(
        &self,
        py: Python<'_>,
        buffer_ptrs: &Bound<'_, PyAny>,
        lists: RangeLists,
    ) -> PyResult<Vec<Vec<Vec<i64>>>> {
        let RangeLists { all_keys, all_dst_offsets, all_src_offsets, all_sizes } = lists;
        crescent_ffi::clear_last_error();
        let what = "get_into_ranges";
        let buffers = items(buffer_ptrs)?;
        let nb = buffers.len();
        // Mooncake's shape of the results, every range INVALID_PARAMS until it is read.
        let bad = Status::InvalidParams.code() as i64;
        let mut results: Vec<Vec<Vec<i64>>> = (0..nb)
            .map(|i| {
                let nk = all_keys.get(i).map_or(1, Vec::len);
                (0..nk).map(|j| vec![bad; all_dst_offsets.get(i).and_then(|d| d.get(j)).map_or(1, Vec::len)]).collect()
            })
            .collect();
        let Some(client) = self.client() else {
            not_set_up(what);
            return Ok(results);
        };
        if [all_keys.len(), all_dst_offsets.len(), all_src_offsets.len(), all_sizes.len()].iter().any(|&l| l != nb) {
            invalid(format!("{what}: {nb} buffers but lists of other lengths"));
            return Ok(results);
        }
        // Each key's ranges (from every buffer), and where each range's result goes.
        let mut keys: Vec<String> = Vec::new();
        let mut index: HashMap<String, usize> = HashMap::new();
        let mut ranges: Vec<KeyRanges> = Vec::new();
        let mut keep = Vec::with_capacity(nb);
        for i in 0..nb {
            let mem = Mem::any(&buffers[i], true, &format!("{what}: buffer_ptrs[{i}]"))?;
            let base = mem.addr();
            let capacity = match &mem {
                Mem::Buffer(b) => Some(b.len()),
                Mem::Array(a) => Some(a.len()),
                Mem::Addr(_) => None,
            };
            keep.push(mem);
            let (ks, dsts, srcs, sizes) = (&all_keys[i], &all_dst_offsets[i], &all_src_offsets[i], &all_sizes[i]);
            if dsts.len() != ks.len() || srcs.len() != ks.len() || sizes.len() != ks.len() {
                invalid(format!("{what}: buffer {i}: {} keys but lists of other lengths", ks.len()));
                continue;
            }
            for (j, key) in ks.iter().enumerate() {
                let (dst, src, size) = (&dsts[j], &srcs[j], &sizes[j]);
                if src.len() != dst.len() || size.len() != dst.len() {
                    invalid(format!("{what}: buffer {i}, key {key:?}: offsets and sizes of other lengths"));
                    continue;
                }
                let slot = *index.entry(key.clone()).or_insert_with(|| {
                    keys.push(key.clone());
                    ranges.push(Vec::new());
                    keys.len() - 1
                });
                for k in 0..dst.len() {
                    let (d, len) = (dst[k], size[k]);
                    let inside = d.checked_add(len).is_some_and(|end| capacity.is_none_or(|c| end <= c));
                    let addr = base.wrapping_add(d);
                    if !inside || (len > 0 && !client.is_registered(addr, len)) {
                        invalid(format!(
                            "{what}: buffer {i}, key {key:?}, range {k}: [{addr:#x}, +{len}) is not registered memory"
                        ));
                        continue;
                    }
                    if len == 0 {
                        results[i][j][k] = 0;
                        continue;
                    }
                    ranges[slot].push((Extent { offset: src[k], addr, len }, (i, j, k)));
                }
            }
        }
        let wanted: Vec<usize> = (0..keys.len()).filter(|&s| !ranges[s].is_empty()).collect();
        let outcome = py.detach(|| ranged_reads(&*client, &keys, &ranges, &wanted));
        for (slot, r) in outcome {
            for (&(e, (i, j, k)), r) in ranges[slot].iter().zip(r) {
                results[i][j][k] = r.map_or_else(|code| code as i64, |()| e.len as i64);
            }
        }
        Ok(results)
    }
}

/// A key's ranges in `get_into_ranges`, each with where its result goes (buffer, key, range).
pub(crate) type KeyRanges = Vec<(Extent, (usize, usize, usize))>;

/// The ranged reads of `get_into_ranges`: the keys `wanted` (by slot) with their ranges, one
/// batch. A range past the end of its value fails alone: the key's other ranges are read
/// again without it (the value's size comes with the refusal). Per key, a result per range.
pub(crate) fn ranged_reads(
    client: &dyn StoreApi,
    keys: &[String],
    ranges: &[KeyRanges],
    wanted: &[usize],
) -> Vec<(usize, Vec<Result<(), i32>>)> {
    use crescent_ffi::store::StoreError;
    // Per slot: Ok, or the code and, for a range past the end, the value's size.
    let read = |slots: &[usize], keep: &dyn Fn(usize, &Extent) -> bool| -> Vec<Result<(), (i32, Option<u64>)>> {
        let ks: Vec<String> = slots.iter().map(|&s| keys[s].clone()).collect();
        let extents: Vec<Vec<Extent>> =
            slots.iter().map(|&s| ranges[s].iter().map(|(e, _)| *e).filter(|e| keep(s, e)).collect()).collect();
        let refs: Vec<&[Extent]> = extents.iter().map(|e| &e[..]).collect();
        let fail = |e: &StoreError| {
            let size = match e {
                StoreError::BadRange { size, .. } => Some(*size),
                _ => None,
            };
            (store_fail(e).code(), size)
        };
        match client.batch_get_into_ranges(&ks, &refs) {
            Ok(rs) => rs.into_iter().map(|r| r.map(|_| ()).map_err(|e| fail(&e))).collect(),
            Err(e) => {
                let f = fail(&e);
                slots.iter().map(|_| Err((f.0, None))).collect()
            }
        }
    };
    let mut out: Vec<(usize, Vec<Result<(), i32>>)> = Vec::with_capacity(wanted.len());
    let mut sizes: HashMap<usize, u64> = HashMap::new();
    for (&slot, r) in wanted.iter().zip(read(wanted, &|_, _| true)) {
        match r {
            Err((_, Some(size))) => {
                sizes.insert(slot, size);
            }
            r => out.push((slot, vec![r.map_err(|(code, _)| code); ranges[slot].len()])),
        }
    }
    if sizes.is_empty() {
        return out;
    }
    let inside = |size: u64, e: &Extent| e.offset.checked_add(e.len).is_some_and(|end| end <= size);
    let again: Vec<usize> = wanted.iter().copied().filter(|s| sizes.contains_key(s)).collect();
    // Keys with no range inside their value are not read again.
    let some_inside = |s: usize| ranges[s].iter().any(|(e, _)| inside(sizes[&s], e));
    let reread: Vec<usize> = again.iter().copied().filter(|&s| some_inside(s)).collect();
    let mut second = read(&reread, &|s, e| inside(sizes[&s], e)).into_iter();
    for &slot in &again {
        let size = sizes[&slot];
        let code = if some_inside(slot) { second.next().unwrap_or(Ok(())).map_err(|(code, _)| code) } else { Ok(()) };
        let per_range = ranges[slot]
            .iter()
            .map(|(e, _)| {
                if inside(size, e) {
                    code
                } else {
                    Err(invalid(format!(
                        "get_into_ranges: {:?}: range [{}, +{}) is past the end of the value ({size} bytes)",
                        keys[slot], e.offset, e.len
                    )))
                }
            })
            .collect();
        out.push((slot, per_range));
    }
    out
}
