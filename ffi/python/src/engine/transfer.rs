//! The transfer methods' one body: the buffers of a call (one, or a list of each) made into
//! requests, then run blocking, submitted as a batch, or queued on a CUDA stream.

use std::convert::Infallible;

use crescent_ffi::engine::{BatchId, EngineError, Notification, Opcode, TransferRequest};
use crescent_ffi::{te_engine_fail, te_fail, TeCode};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;

use super::{failed, te, Engine};
use crate::Mem;

/// The `transport_hint` values upstream accepts ("" for none). Crescent chooses the transport
/// per segment, so a valid hint is accepted and has no effect.
const TRANSPORT_HINTS: [&str; 11] =
    ["", "rdma", "mnnvl", "shm", "nvlink", "gds", "io_uring", "tcp", "ascend", "sunrise_link", "unspec"];

fn check_hint(hint: &str) -> PyResult<()> {
    if TRANSPORT_HINTS.contains(&hint) {
        return Ok(());
    }
    Err(PyValueError::new_err(format!(
        "Unknown transport_hint '{hint}' (valid: {}, or empty string for no hint)",
        TRANSPORT_HINTS[1..].join(", ")
    )))
}

/// The buffers of a transfer method: one (a buffer object or address, the peer's address and
/// the length), or a list of each.
pub(super) enum Buffers<'a, 'py> {
    One(&'a Bound<'py, PyAny>, u64, u64),
    Many(&'a Bound<'py, PyAny>, Vec<u64>, Vec<u64>),
}

impl Buffers<'_, '_> {
    /// The requests; `Err(message)` when the lists differ in length (upstream: -1, or 0 for a
    /// batch id).
    fn requests(self, opcode: Opcode) -> PyResult<Result<Requests, String>> {
        match self {
            Buffers::One(buffer, peer, length) => Requests::one(buffer, peer, length, opcode).map(Ok),
            Buffers::Many(buffers, peers, lengths) => Requests::many(buffers, peers, lengths, opcode),
        }
    }
}

/// How a transfer method runs its requests.
pub(super) enum Mode {
    /// To the end, before it returns, then the notification sent if any: 0 or -1.
    Sync(Option<Notification>),
    /// Started as a batch of their own: its id, or 0.
    Submit,
}

/// What a transfer method returns, as a Python int: a status or a batch id.
pub(super) enum Reply {
    Status(i32),
    Batch(BatchId),
}

impl<'py> IntoPyObject<'py> for Reply {
    type Target = PyAny;
    type Output = Bound<'py, PyAny>;
    type Error = Infallible;

    fn into_pyobject(self, py: Python<'py>) -> Result<Self::Output, Infallible> {
        Ok(match self {
            Reply::Status(code) => code.into_pyobject(py)?.into_any(),
            Reply::Batch(id) => id.into_pyobject(py)?.into_any(),
        })
    }
}

/// One call's requests: local addresses (with the exports that keep buffer objects alive for
/// the call), peer addresses and lengths.
struct Requests {
    mems: Vec<Mem>,
    peers: Vec<u64>,
    lengths: Vec<u64>,
}

impl Requests {
    fn one(buffer: &Bound<'_, PyAny>, peer: u64, length: u64, opcode: Opcode) -> PyResult<Self> {
        let mem = Mem::any(buffer, opcode == Opcode::Read, "buffer")?;
        let length = mem.size(Some(length), "buffer")?;
        Ok(Requests { mems: vec![mem], peers: vec![peer], lengths: vec![length] })
    }

    fn many(
        buffers: &Bound<'_, PyAny>,
        peers: Vec<u64>,
        lengths: Vec<u64>,
        opcode: Opcode,
    ) -> PyResult<Result<Self, String>> {
        let list: Vec<Bound<'_, PyAny>> = buffers.try_iter()?.collect::<PyResult<_>>()?;
        if list.len() != peers.len() || list.len() != lengths.len() {
            return Ok(Err(format!(
                "buffers, peer_buffer_addresses and lengths have different sizes ({}, {}, {})",
                list.len(),
                peers.len(),
                lengths.len()
            )));
        }
        let mut mems = Vec::with_capacity(list.len());
        for (i, (obj, &len)) in list.iter().zip(&lengths).enumerate() {
            let what = format!("buffers[{i}]");
            let m = Mem::any(obj, opcode == Opcode::Read, &what)?;
            m.size(Some(len), &what)?;
            mems.push(m);
        }
        Ok(Ok(Requests { mems, peers, lengths }))
    }

    fn build(&self, opcode: Opcode, target: u64) -> Vec<TransferRequest> {
        self.mems
            .iter()
            .zip(&self.peers)
            .zip(&self.lengths)
            .map(|((m, &target_offset), &length)| TransferRequest {
                opcode,
                source: m.addr(),
                target,
                target_offset,
                length,
            })
            .collect()
    }
}

impl Engine {
    /// A blocking transfer; 0 or -1. With `notify`, once the transfer completed the
    /// notification is sent to the target's engine before this returns, as upstream does (a
    /// refused one is logged and left in `last_error()`; the transfer still counts: 0).
    fn sync(
        &self,
        py: Python<'_>,
        opcode: Opcode,
        target: &str,
        requests: Requests,
        notify: Option<Notification>,
    ) -> i32 {
        let Some(engine) = self.engine() else { return Self::not_initialized("transfer") };
        let r = py.detach(|| {
            let segment = engine.open_segment(target)?;
            let reqs = requests.build(opcode, segment);
            if let Some(n) = &notify {
                n.check()?;
                if reqs.is_empty() {
                    return Err(EngineError::InvalidArgument("a notification follows at least one request".into()));
                }
            }
            // Ends by the engine's transfer timeout (MC_TRANSFER_TIMEOUT) whatever the peer does.
            let batch = engine.transfer_start(&reqs)?;
            engine.transfer_finish(batch)?;
            Ok(notify.map(|n| engine.send_notify(segment, &n)))
        });
        drop(requests);
        match r {
            Ok(None | Some(Ok(()))) => 0,
            Ok(Some(Err(e))) => {
                te_engine_fail(&e);
                crescent_ffi::set_last_error(format!(
                    "the transfer completed; its notification was not delivered: {e}"
                ));
                0
            }
            Err(e) => failed(&e),
        }
    }

    /// A transfer started in a batch of its own: the batch id, or 0.
    fn submit(&self, py: Python<'_>, opcode: Opcode, target: &str, requests: Requests) -> u64 {
        let Some(engine) = self.engine() else {
            Self::not_initialized("transfer");
            return 0;
        };
        let r = py.detach(|| {
            let segment = engine.open_segment(target)?;
            engine.transfer_start(&requests.build(opcode, segment))
        });
        match r {
            Ok(id) => id,
            Err(e) => {
                failed(&e);
                0
            }
        }
    }

    /// The transfer methods but `*_on_cuda`: the requests of `buffers` run as `mode` says.
    pub(super) fn transfer(
        &self,
        py: Python<'_>,
        (opcode, mode): (Opcode, Mode),
        target: &str,
        buffers: Buffers<'_, '_>,
        hint: &str,
    ) -> PyResult<Reply> {
        Ok(match (mode, Self::prepare(buffers, opcode, hint)?) {
            (Mode::Sync(notify), Ok(r)) => Reply::Status(self.sync(py, opcode, target, r, notify)),
            (Mode::Sync(_), Err(message)) => Reply::Status(te(TeCode::InvalidArgument, message)),
            (Mode::Submit, Ok(r)) => Reply::Batch(self.submit(py, opcode, target, r)),
            (Mode::Submit, Err(message)) => {
                te(TeCode::InvalidArgument, message);
                Reply::Batch(0)
            }
        })
    }

    /// The preamble of every transfer method: the last error cleared, the hint checked and
    /// the requests of `buffers` made.
    fn prepare(buffers: Buffers<'_, '_>, opcode: Opcode, hint: &str) -> PyResult<Result<Requests, String>> {
        crescent_ffi::clear_last_error();
        check_hint(hint)?;
        buffers.requests(opcode)
    }

    /// Upstream's `*_on_cuda`: the requests queued on the caller's CUDA stream (see
    /// `TransferEngine::transfer_on_stream`); `None` once queued. A refusal raises
    /// `RuntimeError` (as upstream's does), the message also in `last_error()`.
    pub(super) fn on_cuda(
        &self,
        py: Python<'_>,
        opcode: Opcode,
        target: &str,
        buffers: Buffers<'_, '_>,
        stream: Option<&Bound<'_, PyAny>>,
        hint: &str,
    ) -> PyResult<()> {
        let requests = Self::prepare(buffers, opcode, hint)?;
        let stream = stream.map_or(Ok(0), stream_handle)?;
        let requests = requests.map_err(|message| runtime(TeCode::InvalidArgument, message))?;
        let Some(engine) = self.engine() else {
            return Err(runtime(TeCode::InvalidArgument, "transfer on a CUDA stream: call initialize() first"));
        };
        let queued = py.detach(|| {
            let segment = engine.open_segment(target)?;
            let reqs = requests.build(opcode, segment);
            // The buffer objects stay exported until the transfer has ended.
            engine.transfer_on_stream(stream, reqs, requests.mems)
        });
        queued.map_err(|e| {
            te_engine_fail(&e);
            PyRuntimeError::new_err(e.to_string())
        })
    }
}

/// A `RuntimeError` with `message`, recorded as the last error with `code`.
fn runtime(code: TeCode, message: impl std::fmt::Display) -> PyErr {
    let message = message.to_string();
    te_fail(code, &message);
    PyRuntimeError::new_err(message)
}

/// A CUDA stream given to the `*_on_cuda` calls: an int handle (`cudaStream_t`, 0 for the
/// default stream), or a stream object of torch (`cuda_stream`) or cupy (`ptr`).
fn stream_handle(stream: &Bound<'_, PyAny>) -> PyResult<u64> {
    let handle = if stream.hasattr("cuda_stream")? {
        stream.getattr("cuda_stream")?
    } else if stream.hasattr("ptr")? && !stream.hasattr("__index__")? {
        stream.getattr("ptr")?
    } else {
        stream.clone()
    };
    handle.extract::<u64>().map_err(|_| {
        PyTypeError::new_err(
            "stream_ptr: expected an int CUDA stream handle (0: the default stream) or a stream object",
        )
    })
}
