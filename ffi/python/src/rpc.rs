//! `RpcInterface` (alias `CoroRPCInterface`), `ReceivedData`, `ReceivedTensor`,
//! `create_rpc_client` and `create_rpc_server`: Mooncake's message interface of
//! `mooncake.engine` (upstream `rpc_interface.cpp`, over coro_rpc) with its names, defaults and
//! return values, over `crescent_engine::rpc` (Crescent's own wire: see that module).
//!
//! * `send_data` / `send_tensor` return 0 once the server's callback has returned, -1 on any
//!   failure (`crescent.last_error()` says which); their `_async` forms return an asyncio future
//!   resolved through the loop's `call_soon_threadsafe` with 0, or failed with `RuntimeError`;
//! * the data callback gets `{"source": str, "data": bytes}`, the tensor callback a
//!   `ReceivedTensor`; both run on the server's connection threads with the GIL held, and one
//!   that raises is logged while the server goes on;
//! * the GIL is released for all network I/O, and `start_server` waits without it.

use std::sync::Arc;
use std::time::Duration;

use crescent_ffi::engine::rpc::{Handler, Received, RpcClient, RpcServer, TensorMeta};
use crescent_ffi::{te_fail, TeCode};
use crescent_transports::net::{Auth, Keyring};
use parking_lot::{Condvar, Mutex};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyCFunction, PyDict, PyMemoryView, PyTuple};

use crate::Exported;

/// Upstream's default per-target pool size, used when `pool_size` is 0.
const DEFAULT_POOL_SIZE: usize = 100;

fn failed(message: impl std::fmt::Display) -> i32 {
    te_fail(TeCode::InvalidArgument, message).code()
}

/// What upstream's `ReceivedData` holds: a message's sender and bytes. (Upstream's data
/// callback is given a dict, not this class; it is here for the name.)
#[pyclass(module = "crescent._crescent", name = "ReceivedData", frozen)]
pub(crate) struct ReceivedData {
    #[pyo3(get)]
    source_address: String,
    #[pyo3(get)]
    data_size: usize,
    data: Py<PyBytes>,
}

#[pymethods]
impl ReceivedData {
    /// The bytes.
    fn get_bytes(&self, py: Python<'_>) -> Py<PyBytes> {
        self.data.clone_ref(py)
    }

    /// A read-only memoryview of the bytes (no copy).
    fn get_memory_view<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyMemoryView>> {
        PyMemoryView::from(self.data.bind(py).as_any())
    }
}

/// A tensor as received: its sender, dtype name, shape and bytes.
#[pyclass(module = "crescent._crescent", name = "ReceivedTensor", frozen)]
pub(crate) struct ReceivedTensor {
    #[pyo3(get)]
    source_address: String,
    #[pyo3(get)]
    shape: Vec<u64>,
    #[pyo3(get)]
    dtype: String,
    #[pyo3(get)]
    total_bytes: usize,
    data: Py<PyBytes>,
}

#[pymethods]
impl ReceivedTensor {
    /// Bytes of the tensor's data.
    fn get_data_size(&self) -> usize {
        self.total_bytes
    }

    /// The tensor's bytes.
    fn get_data_as_bytes(&self, py: Python<'_>) -> Py<PyBytes> {
        self.data.clone_ref(py)
    }

    /// A read-only memoryview of the bytes (no copy).
    fn get_memory_view<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyMemoryView>> {
        PyMemoryView::from(self.data.bind(py).as_any())
    }

    fn __repr__(&self) -> String {
        format!(
            "ReceivedTensor(source_address={:?}, dtype={:?}, shape={:?}, total_bytes={})",
            self.source_address, self.dtype, self.shape, self.total_bytes
        )
    }
}

/// The Python callbacks a server calls; set at any time.
#[derive(Default)]
struct Callbacks {
    data: Mutex<Option<Py<PyAny>>>,
    tensor: Mutex<Option<Py<PyAny>>>,
}

impl Callbacks {
    /// Runs the callback for `r` with the GIL held; an exception is logged (the server goes on).
    fn deliver(&self, r: Received) {
        let delivered = Python::try_attach(|py| {
            let (which, callback) = match r.tensor {
                None => ("data", self.data.lock().as_ref().map(|c| c.clone_ref(py))),
                Some(_) => ("tensor", self.tensor.lock().as_ref().map(|c| c.clone_ref(py))),
            };
            let Some(callback) = callback else {
                tracing::warn!("rpc: a {which} message from {} and no {which} receive callback set", r.source);
                return;
            };
            let total_bytes = r.data.len();
            let data = PyBytes::new(py, &r.data).unbind();
            let arg: PyResult<Bound<'_, PyAny>> = match r.tensor {
                None => data_dict(py, &r.source, data),
                Some(TensorMeta { dtype, shape }) => {
                    Bound::new(py, ReceivedTensor { source_address: r.source.clone(), shape, dtype, total_bytes, data })
                        .map(Bound::into_any)
                }
            };
            if let Err(e) = arg.and_then(|a| callback.call1(py, (a,))) {
                tracing::error!("rpc: the {which} receive callback raised: {e}");
            }
        });
        if delivered.is_none() {
            tracing::warn!("rpc: a message from {} arrived while Python is shutting down; dropped", r.source);
        }
    }
}

/// Upstream's argument of the data callback: `{"source": str, "data": bytes}`.
fn data_dict<'py>(py: Python<'py>, source: &str, data: Py<PyBytes>) -> PyResult<Bound<'py, PyAny>> {
    let d = PyDict::new(py);
    d.set_item("source", source)?;
    d.set_item("data", data)?;
    Ok(d.into_any())
}

struct Setup {
    listen: String,
    timeout: Duration,
    auth: Auth,
    client: Arc<RpcClient>,
}

/// Whether a server runs, for `start_server` to wait on.
#[derive(Default)]
struct Running {
    server: Mutex<Option<RpcServer>>,
    stopped: Condvar,
}

/// Mooncake's `RpcInterface`: send bytes and tensors to another process's server, and serve
/// them. `initialize(...)` first.
#[pyclass(module = "crescent._crescent", name = "RpcInterface", frozen)]
pub(crate) struct RpcInterface {
    setup: Mutex<Option<Setup>>,
    callbacks: Arc<Callbacks>,
    running: Arc<Running>,
}

/// A tensor's dtype name, shape and bytes: a torch tensor (by its methods: `data_ptr`, `numel`,
/// `element_size`, `shape`, `dtype`, as upstream) in host memory, or a C-contiguous numpy
/// array (or any buffer object with `shape` and `dtype`).
enum TensorBytes {
    Copied(Vec<u8>),
    Exported(Exported),
}

impl TensorBytes {
    fn bytes(&self) -> &[u8] {
        match self {
            TensorBytes::Copied(v) => v,
            TensorBytes::Exported(e) => e.bytes(),
        }
    }
}

fn dtype_name(dtype: &Bound<'_, PyAny>) -> PyResult<String> {
    let s = dtype.str()?.to_string();
    Ok(s.strip_prefix("torch.").unwrap_or(&s).to_string())
}

fn tensor_parts(t: &Bound<'_, PyAny>) -> PyResult<(TensorMeta, TensorBytes)> {
    let has = |name: &str| t.hasattr(name).unwrap_or(false);
    if !has("shape") || !has("dtype") {
        return Err(PyTypeError::new_err(format!(
            "send_tensor: {} is not a tensor (no shape and dtype)",
            t.get_type().name()?
        )));
    }
    let shape: Vec<u64> = t.getattr("shape")?.try_iter()?.map(|d| d?.extract::<u64>()).collect::<PyResult<_>>()?;
    let dtype = dtype_name(&t.getattr("dtype")?)?;
    let meta = TensorMeta { dtype, shape };
    if ["data_ptr", "numel", "element_size"].iter().all(|n| has(n)) {
        if has("device") {
            let device = t.getattr("device")?;
            let kind: String = device.getattr("type").and_then(|k| k.extract()).unwrap_or_else(|_| "?".into());
            if kind != "cpu" {
                return Err(PyValueError::new_err(format!(
                    "send_tensor: the tensor is on {kind} memory; send a host (cpu) tensor"
                )));
            }
        }
        if has("is_contiguous") && !t.call_method0("is_contiguous")?.is_truthy()? {
            return Err(PyValueError::new_err("send_tensor: the tensor is not contiguous (call .contiguous())"));
        }
        let ptr: usize = t.call_method0("data_ptr")?.extract()?;
        let numel: usize = t.call_method0("numel")?.extract()?;
        let element_size: usize = t.call_method0("element_size")?.extract()?;
        let len = numel
            .checked_mul(element_size)
            .ok_or_else(|| PyValueError::new_err("send_tensor: numel × element_size overflows"))?;
        if len == 0 {
            return Ok((meta, TensorBytes::Copied(Vec::new())));
        }
        if ptr == 0 {
            return Err(PyValueError::new_err("send_tensor: the tensor's data_ptr() is 0"));
        }
        // SAFETY: a contiguous host tensor holds numel × element_size bytes at data_ptr(); the
        // GIL is held for the copy, so no Python code can free or resize its storage meanwhile.
        let bytes = unsafe { std::slice::from_raw_parts(ptr as *const u8, len) }.to_vec();
        return Ok((meta, TensorBytes::Copied(bytes)));
    }
    let exported = Exported::new(t, false).map_err(|e| {
        PyTypeError::new_err(format!(
            "send_tensor: neither a torch tensor (data_ptr, numel, element_size) nor a C-contiguous array: {e}"
        ))
    })?;
    Ok((meta, TensorBytes::Exported(exported)))
}

/// An asyncio future of `event_loop` and how to resolve it from another thread.
fn future<'py>(event_loop: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    event_loop.call_method0("create_future")
}

/// Resolves `fut` on `event_loop` (through `call_soon_threadsafe`) with 0, or fails it with
/// `RuntimeError(message)`; a future cancelled meanwhile is left alone.
fn resolve(event_loop: Py<PyAny>, fut: Py<PyAny>, outcome: Result<(), String>) {
    let done = Python::try_attach(|py| -> PyResult<()> {
        let setter = PyCFunction::new_closure(
            py,
            None,
            None,
            move |args: &Bound<'_, PyTuple>, _: Option<&Bound<'_, PyDict>>| -> PyResult<()> {
                let f = fut.bind(args.py());
                if f.call_method0("done")?.is_truthy()? {
                    return Ok(());
                }
                match &outcome {
                    Ok(()) => f.call_method1("set_result", (0,))?,
                    Err(m) => f.call_method1("set_exception", (PyRuntimeError::new_err(m.clone()),))?,
                };
                Ok(())
            },
        )?;
        event_loop.bind(py).call_method1("call_soon_threadsafe", (setter,))?;
        Ok(())
    });
    match done {
        Some(Ok(())) => {}
        Some(Err(e)) => tracing::warn!("rpc: cannot resolve an async send's future (is its loop closed?): {e}"),
        None => tracing::warn!("rpc: an async send ended while Python is shutting down"),
    }
}

impl RpcInterface {
    fn client(&self) -> Option<Arc<RpcClient>> {
        self.setup.lock().as_ref().map(|s| s.client.clone())
    }

    fn stop(&self, py: Python<'_>) {
        let server = self.running.server.lock().take();
        if let Some(server) = server {
            // Dropping joins the accept thread; connection threads may wait for the GIL.
            py.detach(move || drop(server));
            tracing::info!("rpc: server stopped");
        }
        self.running.stopped.notify_all();
    }

    /// Sends one message now, the GIL let go: 0 once the server's callback has returned, -1
    /// (with the reason) on failure or before `initialize`.
    fn send_now(&self, py: Python<'_>, what: &str, target: &str, meta: Option<&TensorMeta>, bytes: &[u8]) -> i32 {
        let Some(client) = self.client() else {
            return failed(format!("RpcInterface.{what}: call initialize(...) first"));
        };
        match py.detach(|| client.send(target, meta, bytes)) {
            Ok(()) => 0,
            Err(e) => failed(format!("{what} to {target}: {e}")),
        }
    }

    /// Sends on a thread of its own and resolves a future of `event_loop` with the outcome.
    fn send_async<'py>(
        &self,
        target_address: String,
        event_loop: &Bound<'py, PyAny>,
        what: &'static str,
        parts: PyResult<(Option<TensorMeta>, TensorBytes)>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let fut = future(event_loop)?;
        let fail_now = |m: String| -> PyResult<Bound<'py, PyAny>> {
            fut.call_method1("set_exception", (PyRuntimeError::new_err(m),))?;
            Ok(fut.clone())
        };
        let Some(client) = self.client() else {
            return fail_now("Communicator not initialized".into());
        };
        let (meta, bytes) = match parts {
            Ok(p) => p,
            Err(e) => return fail_now(format!("Send {what} error: {e}")),
        };
        let (l, f) = (event_loop.clone().unbind(), fut.clone().unbind());
        let spawned = std::thread::Builder::new().name("crescent-rpc-send".into()).spawn(move || {
            let outcome = client
                .send(&target_address, meta.as_ref(), bytes.bytes())
                .map_err(|e| format!("Send {what} failed: {e}"));
            drop(bytes);
            resolve(l, f, outcome);
        });
        match spawned {
            Ok(_) => Ok(fut.clone()),
            Err(e) => fail_now(format!("Send {what} error: cannot start a thread: {e}")),
        }
    }
}

#[pymethods]
impl RpcInterface {
    #[new]
    fn new() -> Self {
        RpcInterface { setup: Mutex::new(None), callbacks: Arc::default(), running: Arc::default() }
    }

    /// Sets the interface up: a client (connections to each target, `pool_size` kept idle per
    /// target) and, with a `listen_address` (`host:port`), a server that `start_server` starts.
    /// `thread_count` is accepted for upstream's signature: the server runs a thread per
    /// connection. Each connect, send and acknowledgement has `timeout_seconds`.
    #[pyo3(signature = (listen_address=String::new(), thread_count=0, timeout_seconds=30, pool_size=100))]
    fn initialize(
        &self,
        py: Python<'_>,
        listen_address: String,
        thread_count: usize,
        timeout_seconds: u64,
        pool_size: usize,
    ) -> bool {
        let _ = thread_count;
        if timeout_seconds == 0 {
            failed("RpcInterface.initialize: timeout_seconds must be at least 1");
            return false;
        }
        let pool_size = if pool_size == 0 {
            tracing::warn!("rpc: pool_size 0; using {DEFAULT_POOL_SIZE}");
            DEFAULT_POOL_SIZE
        } else {
            pool_size
        };
        let keyring = match Keyring::from_env() {
            Ok(k) => k,
            Err(e) => {
                failed(format!("RpcInterface.initialize: {e}"));
                return false;
            }
        };
        if std::env::var("MC_RPC_PROTOCOL").is_ok_and(|v| v == "rdma") {
            tracing::info!("rpc: MC_RPC_PROTOCOL=rdma: Crescent's rpc runs over tcp");
        }
        // As upstream, a second initialize replaces the first (and stops its server).
        self.stop(py);
        let timeout = Duration::from_secs(timeout_seconds);
        let auth = Auth::new(keyring).with_timeout(timeout);
        let client = Arc::new(RpcClient::new(auth.clone(), timeout, pool_size));
        *self.setup.lock() = Some(Setup { listen: listen_address, timeout, auth, client });
        true
    }

    /// `initialize("", 0, timeout_seconds, pool_size)`.
    #[pyo3(signature = (pool_size=100, timeout_seconds=30))]
    fn initialize_client(&self, py: Python<'_>, pool_size: usize, timeout_seconds: u64) -> bool {
        self.initialize(py, String::new(), 0, timeout_seconds, pool_size)
    }

    /// `initialize(listen_address, thread_count, timeout_seconds, 100)`.
    #[pyo3(signature = (listen_address, thread_count=8, timeout_seconds=30))]
    fn initialize_server(
        &self,
        py: Python<'_>,
        listen_address: String,
        thread_count: usize,
        timeout_seconds: u64,
    ) -> bool {
        self.initialize(py, listen_address, thread_count, timeout_seconds, DEFAULT_POOL_SIZE)
    }

    /// Starts the server and returns True at once (False without a listen address, or when the
    /// address cannot be listened on; `crescent.last_error()` says why). True if it runs already.
    fn start_server_async(&self, py: Python<'_>) -> bool {
        let (listen, auth, timeout) = match self.setup.lock().as_ref() {
            Some(s) if !s.listen.is_empty() => (s.listen.clone(), s.auth.clone(), s.timeout),
            Some(_) => {
                failed("RpcInterface.start_server: initialized without a listen address");
                return false;
            }
            None => {
                failed("RpcInterface.start_server: call initialize(...) first");
                return false;
            }
        };
        if self.running.server.lock().is_some() {
            return true;
        }
        let callbacks = self.callbacks.clone();
        let handler: Handler = Arc::new(move |r: Received| callbacks.deliver(r));
        // The lock is not held across the wait for the GIL: a callback (holding the GIL) may
        // call stop_server, which takes it.
        match py.detach(|| RpcServer::start(&listen, &auth, timeout, handler)) {
            Ok(s) => {
                let mut server = self.running.server.lock();
                if server.is_none() {
                    *server = Some(s);
                }
                true
            }
            Err(e) => {
                failed(format!("RpcInterface.start_server: {e}"));
                false
            }
        }
    }

    /// Starts the server and blocks until `stop_server` (from another thread or a callback);
    /// returns True then, False if it could not start. Ctrl-C stops it and raises
    /// KeyboardInterrupt.
    fn start_server(&self, py: Python<'_>) -> PyResult<bool> {
        if !self.start_server_async(py) {
            return Ok(false);
        }
        loop {
            let stopped = py.detach(|| {
                let mut server = self.running.server.lock();
                if server.is_some() {
                    self.running.stopped.wait_for(&mut server, Duration::from_millis(100));
                }
                server.is_none()
            });
            if stopped {
                return Ok(true);
            }
            if let Err(e) = py.check_signals() {
                self.stop(py);
                return Err(e);
            }
        }
    }

    /// Stops the server (its connections close); a blocked `start_server` returns.
    fn stop_server(&self, py: Python<'_>) {
        self.stop(py);
    }

    /// Sends `data` (bytes or any C-contiguous buffer) to the server at `target_address`
    /// (`host:port`): 0 once its data callback has returned, -1 on failure.
    fn send_data(&self, py: Python<'_>, target_address: &str, data: &Bound<'_, PyAny>) -> PyResult<i32> {
        if self.client().is_none() {
            return Ok(failed("RpcInterface.send_data: call initialize(...) first"));
        }
        let exported = Exported::new(data, false)?;
        Ok(self.send_now(py, "send_data", target_address, None, exported.bytes()))
    }

    /// `send_data` on another thread: an asyncio future of `loop`, resolved with 0 or failed
    /// with RuntimeError.
    fn send_data_async<'py>(
        &self,
        target_address: String,
        data: &Bound<'py, PyAny>,
        r#loop: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let parts = Exported::new(data, false).map(|e| (None, TensorBytes::Exported(e)));
        self.send_async(target_address, r#loop, "data", parts)
    }

    /// Sends a tensor (a host torch tensor, or a C-contiguous numpy array) with its dtype and
    /// shape: 0 once the server's tensor callback has returned, -1 on failure.
    fn send_tensor(&self, py: Python<'_>, target_address: &str, tensor: &Bound<'_, PyAny>) -> i32 {
        if self.client().is_none() {
            return failed("RpcInterface.send_tensor: call initialize(...) first");
        }
        match tensor_parts(tensor) {
            Ok((meta, bytes)) => self.send_now(py, "send_tensor", target_address, Some(&meta), bytes.bytes()),
            Err(e) => failed(e),
        }
    }

    /// `send_tensor` on another thread: an asyncio future of `loop`, resolved with 0 or failed
    /// with RuntimeError.
    fn send_tensor_async<'py>(
        &self,
        target_address: String,
        tensor: &Bound<'py, PyAny>,
        r#loop: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let parts = tensor_parts(tensor).map(|(m, b)| (Some(m), b));
        self.send_async(target_address, r#loop, "tensor", parts)
    }

    /// `callback({"source": str, "data": bytes})` for each data message.
    fn set_data_receive_callback(&self, callback: Py<PyAny>) {
        *self.callbacks.data.lock() = Some(callback);
    }

    /// `callback(ReceivedTensor)` for each tensor.
    fn set_tensor_receive_callback(&self, callback: Py<PyAny>) {
        *self.callbacks.tensor.lock() = Some(callback);
    }
}

/// `create_rpc_client(local_rank=0, world_size=1)`: an interface initialized as upstream's
/// (no server, 30 s, 10 pooled connections per target).
#[pyfunction]
#[pyo3(signature = (local_rank=0, world_size=1))]
fn create_rpc_client(py: Python<'_>, local_rank: u64, world_size: u64) -> RpcInterface {
    let _ = (local_rank, world_size);
    let i = RpcInterface::new();
    i.initialize(py, String::new(), 0, 30, 10);
    i
}

/// `create_rpc_server(local_rank=0, world_size=1)`: an interface initialized as upstream's, to
/// serve on 0.0.0.0:8080 once started (30 s, 10 pooled connections per target).
#[pyfunction]
#[pyo3(signature = (local_rank=0, world_size=1))]
fn create_rpc_server(py: Python<'_>, local_rank: u64, world_size: u64) -> RpcInterface {
    let _ = (local_rank, world_size);
    let i = RpcInterface::new();
    i.initialize(py, "0.0.0.0:8080".into(), 0, 30, 10);
    i
}

pub(crate) fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<RpcInterface>()?;
    m.add_class::<ReceivedData>()?;
    m.add_class::<ReceivedTensor>()?;
    m.add_function(wrap_pyfunction!(create_rpc_client, m)?)?;
    m.add_function(wrap_pyfunction!(create_rpc_server, m)?)?;
    Ok(())
}
