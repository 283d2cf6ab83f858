//! The one preamble of the `Store` methods (`with_client`, `detached` for those outside the
//! table); for the rows of `crescent_ffi::methods`: the last error cleared, the set-up check
//! (and the local buffer's, for the byte calls), the put options, the GIL released while the
//! ops run, and the answer shaped as the row says.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crescent_ffi::methods::{self, Answer, Mem as OpMem, Method, OpKind};
use crescent_ffi::store::client::{Buffer, Op, Outcome};
use crescent_ffi::store::proto::PutOptions;
use crescent_ffi::store::StoreApi;
use crescent_ffi::Status;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};

use crate::mem::*;
use crate::store::Store;
use crate::types::*;
use crate::{invalid, not_set_up, status};

/// Ops of a call, each made or refused with its status; or the whole call refused.
pub(crate) type Ops<'a> = Result<Vec<Result<Op<'a>, Status>>, Status>;

/// One call of a table row on a `Store`.
pub(crate) struct Call<'s, 'py> {
    store: &'s Store,
    py: Python<'py>,
    m: &'static Method,
}

impl Store {
    /// Runs the method of row `m`: `f` parses the arguments and hands its ops to
    /// [`Call::run`].
    pub(crate) fn call(
        &self,
        py: Python<'_>,
        m: &'static Method,
        f: impl FnOnce(&Call<'_, '_>) -> PyResult<Answer>,
    ) -> PyResult<Answer> {
        crescent_ffi::clear_last_error();
        f(&Call { store: self, py, m })
    }

    /// The client for row `m`, or the status of a call refused before it ran (recorded).
    fn client_for(&self, m: &Method) -> Result<Arc<dyn StoreApi>, Status> {
        if m.local_buffer {
            self.byte_client(m.name).map_err(status)
        } else {
            self.client().ok_or_else(|| status(not_set_up(m.name)))
        }
    }
}

impl Call<'_, '_> {
    /// The call refused with `code` (recorded already) for each of its `keys` keys.
    pub(crate) fn refused(&self, keys: usize, code: i32) -> Answer {
        Answer::refused(keys, status(code))
    }

    /// The op of `key` with `mem`.
    pub(crate) fn op<'a>(&self, key: &'a str, mem: OpMem<'a>, force: bool) -> Op<'a> {
        self.m.op(key, mem, force)
    }

    /// Runs the ops that `build` makes for the client (after the set-up check and the put
    /// options of `config` for `keys` keys), with the GIL released.
    pub(crate) fn run<'a>(
        &self,
        keys: usize,
        config: Option<&PyReplicateConfig>,
        build: impl FnOnce(&dyn StoreApi) -> PyResult<Ops<'a>>,
    ) -> PyResult<Answer> {
        let client = match self.store.client_for(self.m) {
            Ok(c) => c,
            Err(_) if self.m.unset_empty => return Ok(Answer::refused(0, Status::Ok)),
            Err(s) => return Ok(Answer::refused(keys, s)),
        };
        let options = match self.m.kind {
            OpKind::Put { .. } => match put_options(&*client, config, keys) {
                Ok(o) => o,
                Err(code) => return Ok(self.refused(keys, code)),
            },
            _ => PutOptions::default(),
        };
        let ops = match build(&*client)? {
            Ok(ops) => ops,
            Err(s) => return Ok(Answer::refused(keys, s)),
        };
        Ok(self.py.detach(|| methods::run(&*client, self.m, ops, options)))
    }

    /// A call of one op per key without memory (exists, size, remove), `force` for removes.
    pub(crate) fn keys(&self, keys: &[String], force: bool) -> PyResult<Answer> {
        self.run(keys.len(), None, |_| Ok(Ok(keys.iter().map(|k| Ok(self.op(k, OpMem::None, force))).collect())))
    }

    /// A zero-copy call of one key with one buffer (an int address or a buffer object, and
    /// its size): `put_from`, `upsert_from`, `get_into`.
    pub(crate) fn one_buffer(
        &self,
        key: &str,
        buffer_ptr: &Bound<'_, PyAny>,
        size: Option<u64>,
        config: Option<&PyReplicateConfig>,
    ) -> PyResult<Answer> {
        let writable = self.m.kind == OpKind::Get;
        let (mem, len) = match store_mem(buffer_ptr, size, writable, "buffer_ptr")? {
            Ok(m) => m,
            Err(code) => return Ok(self.refused(1, code)),
        };
        let buffers = vec![Buffer::host(mem.addr(), len)];
        self.run(1, config, |_| Ok(Ok(vec![Ok(self.op(key, OpMem::Buffers(buffers), false))])))
    }

    /// A zero-copy batch call, one buffer per key: `batch_put_from`, `batch_upsert_from`,
    /// `batch_get_into`.
    pub(crate) fn buffer_each(
        &self,
        keys: &[String],
        buffer_ptrs: &Bound<'_, PyAny>,
        sizes: Option<Vec<u64>>,
        config: Option<&PyReplicateConfig>,
    ) -> PyResult<Answer> {
        let writable = self.m.kind == OpKind::Get;
        let n = keys.len();
        let (mems, lens) = match store_mems(buffer_ptrs, sizes, writable, n)? {
            Ok(m) => m,
            Err(code) => return Ok(self.refused(n, code)),
        };
        self.run(n, config, |_| {
            Ok(Ok(keys
                .iter()
                .zip(mems.iter().zip(&lens))
                .map(|(k, (m, &len))| Ok(self.op(k, OpMem::Buffers(vec![Buffer::host(m.addr(), len)]), false)))
                .collect()))
        })
    }
}

impl Call<'_, '_> {
    /// `put`, `upsert`: a value of plain bytes (any buffer object).
    pub(crate) fn bytes(
        &self,
        key: &str,
        value: &Bound<'_, PyAny>,
        config: Option<&PyReplicateConfig>,
    ) -> PyResult<Answer> {
        let value = Exported::new(value, false)?;
        self.run(1, config, |_| Ok(Ok(vec![Ok(self.op(key, OpMem::Bytes(value.bytes()), false))])))
    }

    /// `put_batch`, `upsert_batch`: values of plain bytes.
    pub(crate) fn bytes_each(
        &self,
        keys: &[String],
        values: &Bound<'_, PyAny>,
        config: Option<&PyReplicateConfig>,
    ) -> PyResult<Answer> {
        let values = exported_values(values)?;
        self.run(keys.len(), config, |_| {
            if values.len() != keys.len() {
                let message = format!("{}: {} keys but {} values", self.m.name, keys.len(), values.len());
                return Ok(Err(status(invalid(message))));
            }
            Ok(Ok(keys.iter().zip(&values).map(|(k, v)| Ok(self.op(k, OpMem::Bytes(v.bytes()), false))).collect()))
        })
    }

    /// `put_parts`, `upsert_parts`: a value of plain bytes in parts.
    pub(crate) fn parts(
        &self,
        key: &str,
        parts: &Bound<'_, PyTuple>,
        config: Option<&PyReplicateConfig>,
    ) -> PyResult<Answer> {
        let parts: Vec<Exported> = parts.iter().map(|p| Exported::new(&p, false)).collect::<PyResult<_>>()?;
        let slices: Vec<&[u8]> = parts.iter().map(Exported::bytes).collect();
        self.run(1, config, |_| Ok(Ok(vec![Ok(self.op(key, OpMem::Parts(slices), false))])))
    }

    /// `batch_put_from_multi_buffers`, `batch_get_into_multi_buffers`: see [`multi_buffer_ops`].
    pub(crate) fn multi_buffers(
        &self,
        keys: &[String],
        all_buffer_ptrs: &Bound<'_, PyAny>,
        all_sizes: &[Vec<u64>],
        config: Option<&PyReplicateConfig>,
    ) -> PyResult<Answer> {
        let mut keep = Vec::new();
        let writable = self.m.kind == OpKind::Get;
        self.run(keys.len(), config, |client| {
            multi_buffer_ops(self, client, keys, all_buffer_ptrs, all_sizes, writable, &mut keep)
        })
    }
}

/// The ops of a multi-buffer call (`batch_put_from_multi_buffers`,
/// `batch_get_into_multi_buffers`): key `i`'s value is the concatenation of its buffers
/// `all_buffer_ptrs[i]` of `all_sizes[i]` bytes (kept exported in `keep`). Lists of other
/// lengths refuse every key with INVALID_PARAMS (a put's also when one key's buffers and sizes
/// differ in number); memory that is not registered, a key's buffers and sizes of other
/// numbers (a get), or no bytes to put refuse that key alone.
fn multi_buffer_ops<'a>(
    c: &Call<'_, '_>,
    client: &dyn StoreApi,
    keys: &'a [String],
    all_buffer_ptrs: &Bound<'_, PyAny>,
    all_sizes: &[Vec<u64>],
    writable: bool,
    keep: &mut Vec<super::Mem>,
) -> PyResult<Ops<'a>> {
    let (what, n) = (c.m.name, keys.len());
    let ptr_lists = items(all_buffer_ptrs)?;
    if ptr_lists.len() != n || all_sizes.len() != n {
        let message = format!("{what}: {n} keys, {} buffer lists, {} size lists", ptr_lists.len(), all_sizes.len());
        return Ok(Err(status(invalid(message))));
    }
    let ptr_lists: Vec<Vec<Bound<'_, PyAny>>> = ptr_lists.iter().map(items).collect::<PyResult<_>>()?;
    let miscounted = |i: usize| {
        let (key, ptrs, sizes) = (&keys[i], ptr_lists[i].len(), all_sizes[i].len());
        status(invalid(format!("{what}: key {key:?} has {ptrs} buffers and {sizes} sizes")))
    };
    let put = !writable;
    if put {
        if let Some(i) = (0..n).find(|&i| ptr_lists[i].len() != all_sizes[i].len()) {
            return Ok(Err(miscounted(i)));
        }
    }
    let mut ops = Vec::with_capacity(n);
    for i in 0..n {
        if ptr_lists[i].len() != all_sizes[i].len() {
            ops.push(Err(miscounted(i)));
            continue;
        }
        let op = match key_pieces(client, &ptr_lists[i], &all_sizes[i], writable, keep, &keys[i])? {
            Ok(p) if put && p.is_empty() => {
                Err(status(invalid(format!("{what}: key {:?} has no bytes to put", keys[i]))))
            }
            Ok(p) => {
                let buffers = p.iter().map(|p| Buffer::host(p.addr, p.len)).collect();
                Ok(c.op(&keys[i], OpMem::Buffers(buffers), false))
            }
            Err(code) => Err(status(code)),
        };
        ops.push(op);
    }
    Ok(Ok(ops))
}

impl Store {
    pub(crate) fn client(&self) -> Option<Arc<dyn StoreApi>> {
        self.client.read().clone()
    }

    /// The preamble of the methods outside the table that need the client, written once: the
    /// last error cleared, then `f` with the client; before setup (or after close) the refusal
    /// recorded for `what` and `T::default()` (`[]` or `{}`, Mooncake's answers).
    pub(crate) fn with_client<T: Default>(&self, what: &str, f: impl FnOnce(Arc<dyn StoreApi>) -> T) -> T {
        crescent_ffi::clear_last_error();
        match self.client() {
            Some(client) => f(client),
            None => {
                not_set_up(what);
                T::default()
            }
        }
    }

    /// The preamble of the task methods: the last error cleared, then `f` with the client (None
    /// before setup) and the GIL released.
    pub(crate) fn detached<T: Send>(&self, py: Python<'_>, f: impl FnOnce(Option<&dyn StoreApi>) -> T + Send) -> T {
        crescent_ffi::clear_last_error();
        let client = self.client();
        py.detach(|| f(client.as_deref()))
    }

    /// The client, for a call that moves bytes through the local buffer.
    pub(crate) fn byte_client(&self, what: &str) -> Result<Arc<dyn StoreApi>, i32> {
        let client = self.client().ok_or_else(|| not_set_up(what))?;
        if self.no_local_buffer.load(Ordering::Acquire) {
            return Err(invalid(format!(
                "{what}: setup had local_buffer_size 0, and this call needs the local buffer (the zero-copy calls \
                 do not)"
            )));
        }
        Ok(client)
    }

    /// `get_buffer`, `batch_get_buffer`: values held in the client's memory, None where a get
    /// failed.
    pub(crate) fn held(&self, py: Python<'_>, m: &'static Method, keys: &[String]) -> Vec<Option<PyBufferHandle>> {
        let answer = self.call(py, m, |c| {
            c.run(keys.len(), None, |_| Ok(Ok(keys.iter().map(|k| Ok(c.op(k, OpMem::Held, false))).collect())))
        });
        values(answer, keys.len(), |o| match o {
            Outcome::Held(block) => Some(PyBufferHandle { block }),
            _ => None,
        })
        .into_iter()
        .map(Option::flatten)
        .collect()
    }

    /// `get`, `get_batch`: values as `bytes`, each read straight into the object returned for
    /// it (see [`BytesSink`]); empty bytes where a get failed.
    pub(crate) fn get_bytes<'py>(
        &self,
        py: Python<'py>,
        m: &'static Method,
        keys: &[String],
    ) -> Vec<Bound<'py, PyBytes>> {
        let mut sinks: Vec<BytesSink> = keys.iter().map(|_| BytesSink::default()).collect();
        let answer = self.call(py, m, |c| {
            c.run(keys.len(), None, |_| {
                Ok(Ok(keys.iter().zip(sinks.iter_mut()).map(|(k, s)| Ok(c.op(k, OpMem::Sink(s), false))).collect()))
            })
        });
        let got = values(answer, keys.len(), |_| ());
        got.into_iter()
            .zip(sinks)
            .map(|(r, sink)| if r.is_some() { sink.into_bytes(py) } else { PyBytes::new(py, &[]) })
            .collect()
    }
}

/// Per key of a call whose reply is its values: `Some(value)` where the op succeeded (failures
/// are recorded already); a whole-call failure or an error raised is None for each key.
pub(crate) fn values<T>(answer: PyResult<Answer>, keys: usize, value: impl Fn(Outcome) -> T) -> Vec<Option<T>> {
    match answer {
        Ok(Answer { whole: Ok(()), each, .. }) => each.into_iter().map(|r| r.ok().map(&value)).collect(),
        _ => (0..keys).map(|_| None).collect(),
    }
}
