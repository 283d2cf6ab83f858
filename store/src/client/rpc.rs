//! The client's connection to the master, so that the client's API stays synchronous (and
//! callable from any thread, e.g. Python's). Unary calls go over a channel of a current-thread
//! runtime that the calling thread drives itself: no hand-off to a runtime thread and back,
//! which costs two thread wake-ups per call. Streams (event subscriptions) need a runtime that
//! runs while nobody calls: they use a second channel on a one-worker runtime, as do calls
//! made beside a long piece of work (`call_beside`).
//!
//! The API is blocking, and callable from inside a tokio task as well: there a call blocks
//! the task's thread where tokio allows it (`block_in_place` on a multi-thread runtime) or
//! runs on a thread of its own (a current-thread runtime), instead of panicking as a nested
//! `block_on` would; the runtimes are shut down without waiting when the client is dropped
//! there (`outside_async`).

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use parking_lot::RwLock;
use tokio::runtime::{Handle, Runtime, RuntimeFlavor};
use tonic::transport::{Channel, Endpoint};

use crescent_transports::net::Keyring;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;

use super::fastrpc::FastRpc;
use crate::error::{Result, StoreError, Waited};
use crate::fastrpc::Method;
use crate::leader::Members;
use crate::proto::master_client::MasterClient;
use crate::proto::{Code, Status};
use crate::protocol;
use crate::protocol::MAX_MESSAGE;

/// What every call to the master carries: the bearer token of the cluster secret (naming the
/// client's tenant; see [`crate::master::access`]), or without a secret the tenant's name.
#[derive(Clone, Debug)]
pub struct Credentials {
    authorization: Option<MetadataValue<Ascii>>,
    tenant: MetadataValue<Ascii>,
}

impl Credentials {
    /// For a client of `tenant`, with the cluster's `keyring` if it has one.
    pub fn new(keyring: Option<&Keyring>, tenant: &str) -> Result<Credentials> {
        protocol::check_tenant(tenant).map_err(StoreError::Config)?;
        let value = |s: String| s.parse::<MetadataValue<Ascii>>().map_err(|e| StoreError::Config(e.to_string()));
        Ok(Credentials {
            authorization: keyring
                .map(|k| value(format!("Bearer {}", protocol::client_token(k, tenant))))
                .transpose()?,
            tenant: value(tenant.to_string())?,
        })
    }

    /// The fast RPC hello's body carrying these credentials.
    fn hello(&self) -> Vec<u8> {
        let text = |v: &MetadataValue<Ascii>| v.to_str().unwrap_or_default().to_string();
        crate::fastrpc::hello_body(&self.authorization.as_ref().map(text).unwrap_or_default(), &text(&self.tenant))
    }

    /// No secret, the default tenant.
    #[cfg(test)]
    pub fn open() -> Credentials {
        Credentials::new(None, protocol::DEFAULT_TENANT).expect("the default tenant is valid")
    }
}

impl tonic::service::Interceptor for Credentials {
    fn call(&mut self, mut req: tonic::Request<()>) -> std::result::Result<tonic::Request<()>, tonic::Status> {
        let m = req.metadata_mut();
        if let Some(a) = &self.authorization {
            m.insert("authorization", a.clone());
        }
        m.insert(protocol::TENANT_HEADER, self.tenant.clone());
        Ok(req)
    }
}

/// The channel to the master, with the client's [`Credentials`] on every call.
pub type Client = MasterClient<InterceptedService<Channel, Credentials>>;

/// Runs `run`, which blocks on a runtime, where blocking on a runtime is allowed: at once
/// outside tokio; inside a task of a multi-thread runtime, with the worker handed over
/// (`block_in_place`); inside a current-thread runtime, which cannot lend its thread, on a
/// thread of its own.
pub(crate) fn outside_async<R: Send>(run: impl FnOnce() -> R + Send) -> R {
    match Handle::try_current() {
        Err(_) => run(),
        Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => tokio::task::block_in_place(run),
        Ok(_) => std::thread::scope(|s| s.spawn(run).join()).unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
    }
}

/// A runtime that can be dropped anywhere: inside an asynchronous context (where tokio forbids
/// the blocking shutdown of a drop) it shuts down without waiting.
struct OwnRuntime(Option<Runtime>);

impl std::ops::Deref for OwnRuntime {
    type Target = Runtime;
    fn deref(&self) -> &Runtime {
        self.0.as_ref().expect("present until dropped")
    }
}

impl Drop for OwnRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            if Handle::try_current().is_ok() {
                rt.shutdown_background();
            }
        }
    }
}

/// The client's connection to the master (or to the leader of a cluster of masters, found
/// and followed through etcd): blocking calls from any thread, streams in the background.
/// Every call has a deadline; a call in flight when the followed master changes ends with a
/// retryable error.
pub struct MasterRpc {
    /// Drives the unary channel, on the calling thread (one caller at a time drives it; the
    /// others wait for their own replies).
    calls: OwnRuntime,
    /// Runs streams in the background.
    runtime: OwnRuntime,
    /// The master's channels; replaced when the leader changes.
    conn: RwLock<Conn>,
    /// With an `etcd://` address: where the leader is looked up.
    leader: Option<LeaderSource>,
    /// Signalled when the channels are replaced: calls still waiting on the old master (one
    /// frozen, say) end with a retryable error instead of waiting for their timeout.
    switched: tokio::sync::Notify,
    /// What every call carries (also on the channels to a new leader).
    credentials: Credentials,
    /// The deadlines of every call and connection.
    timeouts: RpcTimeouts,
    /// The followed master's fast RPC port, once a ping advertised it (see [`Self::unary`]);
    /// dropped when the client follows another master.
    fast: RwLock<Option<Arc<FastRpc>>>,
    /// Whether to use a fast RPC port a master advertises (`CRESCENT_FAST_RPC=0`: gRPC only).
    fast_wanted: bool,
    /// The fast RPC port that last failed to connect, and when: not tried again for
    /// [`FAST_RETRY`] (a firewalled port would hold each heartbeat for the connect timeout).
    fast_failed: parking_lot::Mutex<Option<(std::net::SocketAddr, std::time::Instant)>>,
}

/// How long a fast RPC port that could not be connected to is left alone.
const FAST_RETRY: Duration = Duration::from_secs(30);

/// How long a call to the master, and connecting to it, may take (Mooncake's
/// `MC_RPC_TIMEOUT_MS` and `MC_RPC_CONNECT_TIMEOUT_MS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RpcTimeouts {
    /// A call's deadline (30 s by default).
    pub call: Duration,
    /// Connecting's deadline (3 s by default).
    pub connect: Duration,
}

impl Default for RpcTimeouts {
    fn default() -> Self {
        RpcTimeouts { call: CALL_TIMEOUT, connect: Duration::from_secs(3) }
    }
}

impl RpcTimeouts {
    /// The defaults with `MC_RPC_TIMEOUT_MS` and `MC_RPC_CONNECT_TIMEOUT_MS` from `var`
    /// (milliseconds, 1 ms to a day; unset or blank: the default). Upstream's negative
    /// `MC_RPC_TIMEOUT_MS` (no deadline) is refused: every call here keeps one.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let ms = |name: &str| -> Result<Option<Duration>> {
            let Some(v) = var(name).filter(|v| !v.trim().is_empty()) else { return Ok(None) };
            v.trim().parse::<u64>().ok().filter(|n| (1..=86_400_000).contains(n)).map(|n| Some(Duration::from_millis(n))).ok_or_else(
                || {
                    StoreError::Config(format!(
                        "{name}={v:?} is not a number of milliseconds from 1 to 86400000 (every call to the master keeps a deadline)"
                    ))
                },
            )
        };
        let d = RpcTimeouts::default();
        Ok(RpcTimeouts {
            call: ms("MC_RPC_TIMEOUT_MS")?.unwrap_or(d.call),
            connect: ms("MC_RPC_CONNECT_TIMEOUT_MS")?.unwrap_or(d.connect),
        })
    }
}

struct Conn {
    call_client: Client,
    client: Client,
    addr: String,
}

struct LeaderSource {
    etcd: tokio::sync::Mutex<Members>,
    key: String,
    /// The term of the leader followed.
    term: AtomicU64,
}

/// How long connecting through etcd waits for a leader to be elected.
const FIRST_LEADER_WAIT: Duration = Duration::from_secs(15);

impl MasterRpc {
    /// Connects to the master at `addr` (`host:port`); fails with a clear error if it is not there.
    #[cfg(test)]
    pub fn connect(addr: &str, credentials: Credentials) -> Result<Self> {
        Self::connect_in(addr, crate::protocol::DEFAULT_CLUSTER_ID, credentials)
    }

    /// Connects to the master at `addr`: `host:port`, or `etcd://h1:2379;h2:2379` to follow
    /// the leader of `cluster_id`'s masters.
    #[cfg(test)]
    pub fn connect_in(addr: &str, cluster_id: &str, credentials: Credentials) -> Result<Self> {
        Self::connect_with(addr, cluster_id, credentials, RpcTimeouts::default())
    }

    /// Connects to the master at `addr` (`host:port`, or `etcd://h1:2379;h2:2379` to follow the
    /// leader of `cluster_id`'s masters) with the calls' and connections' deadlines.
    pub fn connect_with(addr: &str, cluster_id: &str, credentials: Credentials, timeouts: RpcTimeouts) -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("crescent-client-rpc")
            .enable_all()
            .build()
            .map_err(|e| StoreError::system("starting a tokio runtime", e))?;
        let runtime = OwnRuntime(Some(runtime));
        let calls = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| StoreError::system("starting a tokio runtime", e))?;
        let calls = OwnRuntime(Some(calls));
        let (master, leader) = if addr.trim().starts_with(crate::leader::ETCD_SCHEME) {
            let endpoints = crate::leader::endpoints(addr)?;
            let mut etcd = outside_async(|| runtime.block_on(Members::connect(&endpoints)))?;
            let key = crate::leader::leader_key(cluster_id);
            let until = std::time::Instant::now() + FIRST_LEADER_WAIT;
            let (master, term) = loop {
                match outside_async(|| runtime.block_on(etcd.leader(&key))) {
                    Ok(Some(found)) => break found,
                    Ok(None) | Err(_) if std::time::Instant::now() < until => {
                        std::thread::sleep(Duration::from_millis(100))
                    }
                    Ok(None) => {
                        let why = format!("no master of cluster {cluster_id:?} leads ({key} is not set in etcd)");
                        return Err(StoreError::master_unreachable(addr, why));
                    }
                    Err(e) => return Err(e),
                }
            };
            let source = LeaderSource { etcd: tokio::sync::Mutex::new(etcd), key, term: AtomicU64::new(term) };
            (master, Some(source))
        } else {
            (addr.to_string(), None)
        };
        let conn = Conn::open(&calls, &runtime, &master, false, &credentials, timeouts)?;
        Ok(MasterRpc {
            calls,
            runtime,
            conn: RwLock::new(conn),
            leader,
            switched: tokio::sync::Notify::new(),
            credentials,
            timeouts,
            fast: RwLock::new(None),
            fast_wanted: std::env::var("CRESCENT_FAST_RPC").map_or(true, |v| v.trim() != "0"),
            fast_failed: parking_lot::Mutex::new(None),
        })
    }

    /// The address of the master followed now.
    pub fn addr(&self) -> String {
        self.conn.read().addr.clone()
    }

    /// With an `etcd://` address: looks the leader up and, when another master leads now,
    /// switches to it. Returns whether it did.
    pub fn follow_leader(&self) -> bool {
        let Some(source) = &self.leader else { return false };
        let found =
            outside_async(|| self.runtime.block_on(async { source.etcd.lock().await.leader(&source.key).await }));
        let Ok(Some((addr, term))) = found else { return false };
        if addr == self.conn.read().addr && term == source.term.load(Ordering::Acquire) {
            return false;
        }
        match Conn::open(&self.calls, &self.runtime, &addr, true, &self.credentials, self.timeouts) {
            Ok(conn) => {
                tracing::info!("following the master leading now: {addr} (term {term})");
                *self.conn.write() = conn;
                source.term.store(term, Ordering::Release);
                if let Some(fast) = self.fast.write().take() {
                    fast.close();
                }
                self.switched.notify_waiters();
                true
            }
            Err(e) => {
                tracing::warn!("the leader {addr}: {e}");
                false
            }
        }
    }

    /// The runtime driving the channel (for streams that outlive one call).
    pub fn handle(&self) -> tokio::runtime::Handle {
        self.runtime.handle().clone()
    }

    /// A handle on the streams' channel to the master (run it on [`Self::handle`]).
    pub fn client(&self) -> Client {
        self.conn.read().client.clone()
    }

    /// Runs one call to completion on the client's runtime.
    pub fn call<T, F, Fut>(&self, f: F) -> Result<T>
    where
        F: FnOnce(Client) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>> + Send,
        T: Send,
    {
        let client = self.conn.read().call_client.clone();
        let switched = self.switched.notified();
        let call = until_switched(f(client), switched);
        #[allow(clippy::result_large_err)] // tonic's status, as the call returns it
        let reply = outside_async(|| self.calls.block_on(call));
        self.reply(reply)
    }

    /// Takes up the fast RPC `port` a ping of the followed master advertised (0: none), on
    /// the host of its gRPC address: later [`Self::unary`] calls go there. A port that does
    /// not answer or refuses the credentials is logged, and left alone for [`FAST_RETRY`]
    /// while gRPC serves.
    pub fn offer_fast_rpc(&self, port: u32) {
        if !self.fast_wanted || Handle::try_current().is_ok() {
            return;
        }
        let addr = self.addr();
        // The port taken up already (most pings): no name lookup of the master's host.
        if port != 0
            && self.fast.read().as_ref().is_some_and(|f| u32::from(f.addr().port()) == port && f.origin() == addr)
        {
            return;
        }
        let Some(target) = u16::try_from(port).ok().filter(|p| *p != 0).and_then(|p| {
            let host = addr.rsplit_once(':').map_or(addr.as_str(), |(h, _)| h).trim_matches(['[', ']']);
            std::net::ToSocketAddrs::to_socket_addrs(&(host, p)).ok()?.next()
        }) else {
            if let Some(old) = self.fast.write().take() {
                old.close();
            }
            return;
        };
        if self.fast.read().as_ref().is_some_and(|f| f.addr() == target) {
            return;
        }
        if self.fast_failed.lock().is_some_and(|(at, when)| at == target && when.elapsed() < FAST_RETRY) {
            return;
        }
        match FastRpc::connect(&addr, target, self.credentials.hello(), self.timeouts.call, self.timeouts.connect) {
            Ok(fast) => {
                tracing::debug!("the master's hot calls go to its fast rpc port {target}");
                if addr == self.addr() {
                    if let Some(old) = self.fast.write().replace(Arc::new(fast)) {
                        old.close();
                    }
                }
            }
            Err(e) => {
                tracing::info!("the master's fast rpc port {target}: {} (gRPC for {FAST_RETRY:?})", e.message());
                *self.fast_failed.lock() = Some((target, std::time::Instant::now()));
            }
        }
    }

    /// The followed master's fast RPC port, where a ping advertised one (and it is wanted).
    pub fn fast_rpc(&self) -> Option<Arc<FastRpc>> {
        self.fast.read().clone()
    }

    /// Closes the fast RPC port's connections idle for a while (the heartbeat's, now and then).
    pub fn trim_fast_rpc(&self) {
        if let Some(fast) = self.fast.read().as_ref() {
            fast.trim();
        }
    }

    /// One hot call: over the master's fast RPC port where the master advertised one and the
    /// caller is outside tokio, else over gRPC (`grpc` makes the call from the request).
    pub fn unary<Q, R, F, Fut>(&self, method: Method, req: Q, grpc: F) -> Result<R>
    where
        Q: prost::Message,
        R: prost::Message + Default + Send,
        F: FnOnce(Client, Q) -> Fut,
        Fut: Future<Output = Result<tonic::Response<R>, tonic::Status>> + Send,
    {
        match self.fast_conn() {
            Some((fast, conn)) => self.on_fast(&fast, conn, method, &req, || ()).0,
            None => self.call(|c| grpc(c, req)),
        }
    }

    /// [`Self::unary`] running `meanwhile` on the calling thread while the master works on the
    /// call (as [`Self::call_while`]).
    pub fn unary_while<Q, R, F, Fut, X>(
        &self,
        method: Method,
        req: Q,
        grpc: F,
        meanwhile: impl FnOnce() -> X,
    ) -> (Result<R>, X)
    where
        Q: prost::Message,
        R: prost::Message + Default + Send,
        F: FnOnce(Client, Q) -> Fut,
        Fut: Future<Output = Result<tonic::Response<R>, tonic::Status>> + Send,
    {
        match self.fast_conn() {
            Some((fast, conn)) => self.on_fast(&fast, conn, method, &req, meanwhile),
            None => self.call_while(|c| grpc(c, req), meanwhile),
        }
    }

    /// [`Self::unary_while`] where `meanwhile` may give a second call to send right behind the
    /// first on the fast port's connection (see [`FastRpc::call_then`]); it is told whether
    /// the call went there. Over gRPC the second call is not made. Returns the first reply,
    /// `meanwhile`'s result and the second reply, if it was sent.
    #[allow(clippy::type_complexity)]
    pub fn unary_then<Q, R, F, Fut, X, Q2, R2>(
        &self,
        method: Method,
        req: Q,
        grpc: F,
        meanwhile: impl FnOnce(bool) -> (X, Option<(Method, Q2)>),
    ) -> (Result<R>, X, Option<Result<R2>>)
    where
        Q: prost::Message,
        R: prost::Message + Default + Send,
        F: FnOnce(Client, Q) -> Fut,
        Fut: Future<Output = Result<tonic::Response<R>, tonic::Status>> + Send,
        Q2: prost::Message,
        R2: prost::Message + Default,
    {
        match self.fast_conn() {
            Some((fast, conn)) => {
                let (reply, side, second) = fast.call_then(conn, method, &req, || meanwhile(true));
                let error = |s: tonic::Status| call_error(&self.addr(), &s, self.timeouts.call);
                (reply.map_err(error), side, second.map(|r| r.map_err(error)))
            }
            None => {
                let (reply, (side, _)) = self.call_while(|c| grpc(c, req), || meanwhile(false));
                (reply, side, None)
            }
        }
    }

    /// Whether the hot calls go to a fast RPC port now (its connection may still fail; the
    /// call then goes over gRPC).
    pub fn has_fast_rpc(&self) -> bool {
        self.fast.read().is_some() && Handle::try_current().is_err()
    }

    /// One call on a connection to the fast RPC port, its failure said as a gRPC call's.
    fn on_fast<Q: prost::Message, R: prost::Message + Default, X>(
        &self,
        fast: &FastRpc,
        conn: std::net::TcpStream,
        method: Method,
        req: &Q,
        meanwhile: impl FnOnce() -> X,
    ) -> (Result<R>, X) {
        let (reply, side) = fast.call_while(conn, method, req, meanwhile);
        (reply.map_err(|s| call_error(&self.addr(), &s, self.timeouts.call)), side)
    }

    /// A connection to the fast RPC port for one call, where the master advertised one and
    /// blocking I/O is allowed here. A port that cannot be reached (its master restarted on
    /// another port, say) is dropped until a ping names one again: the call goes over gRPC.
    fn fast_conn(&self) -> Option<(Arc<FastRpc>, std::net::TcpStream)> {
        if Handle::try_current().is_ok() {
            return None;
        }
        let fast = self.fast.read().clone()?;
        match fast.conn() {
            Some(conn) => Some((fast, conn)),
            None => {
                let mut slot = self.fast.write();
                if slot.as_ref().is_some_and(|f| Arc::ptr_eq(f, &fast)) {
                    *slot = None;
                }
                None
            }
        }
    }

    /// A call's outcome: the reply's body, or what kept it from coming.
    fn reply<T>(&self, r: Result<tonic::Response<T>, tonic::Status>) -> Result<T> {
        r.map(|r| r.into_inner()).map_err(|s| call_error(&self.addr(), &s, self.timeouts.call))
    }

    /// Runs one call and, while the master works on it, `meanwhile` on the calling thread
    /// (work that does not depend on the reply). `meanwhile` runs outside the runtime, so
    /// other threads' calls are not held up behind it.
    pub fn call_while<T, F, Fut, R>(&self, f: F, meanwhile: impl FnOnce() -> R) -> (Result<T>, R)
    where
        F: FnOnce(Client) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>> + Send,
        T: Send,
    {
        if Handle::try_current().is_ok() {
            // Inside tokio: no call left half-driven on the calling thread; the work after.
            let reply = self.call(f);
            return (reply, meanwhile());
        }
        let client = self.conn.read().call_client.clone();
        let switched = self.switched.notified();
        let mut call = Box::pin(until_switched(f(client), switched));
        // Send the request: poll the call once, then yield so that the channel's tasks write
        // it out. The reply waits in the socket until the call is driven again.
        let early = self.calls.block_on(async {
            let polled = std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await;
            match polled {
                Poll::Ready(reply) => Some(reply),
                Poll::Pending => {
                    tokio::task::yield_now().await;
                    None
                }
            }
        });
        let side = meanwhile();
        let reply = match early {
            Some(reply) => reply,
            None => self.calls.block_on(call),
        };
        (self.reply(reply), side)
    }

    /// As [`Self::call_while`], for `meanwhile` work that outlasts the round trip (a read from
    /// disk): the call runs on the background runtime, which takes the reply in as soon as it
    /// arrives instead of after `meanwhile`. Costs a hand-off to that runtime's thread, which
    /// a short `meanwhile` would not hide.
    pub fn call_beside<T, F, Fut, R>(&self, f: F, meanwhile: impl FnOnce() -> R) -> (Result<T>, R)
    where
        F: FnOnce(Client) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>> + Send + 'static,
        T: Send + 'static,
    {
        let call = self.runtime.spawn(f(self.client()));
        let switched = self.switched.notified();
        let side = meanwhile();
        let reply = outside_async(|| {
            self.runtime.block_on(async {
                tokio::select! {
                    r = call => Some(r),
                    () = switched => None,
                }
            })
        });
        let reply = match reply {
            Some(Ok(reply)) => self.reply(reply),
            Some(Err(e)) => Err(StoreError::Internal(format!("call to the master: {e}"))),
            None => self.reply(Err(switched_status())),
        };
        (reply, side)
    }
}

impl Conn {
    /// Channels to the master at `addr`: connected now (an error if it is not there), or
    /// `lazy` (connected by the first call).
    fn open(
        calls: &Runtime,
        runtime: &Runtime,
        addr: &str,
        lazy: bool,
        credentials: &Credentials,
        timeouts: RpcTimeouts,
    ) -> Result<Conn> {
        let endpoint = Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| StoreError::Config(format!("master address {addr:?}: {e}")))?
            .connect_timeout(timeouts.connect)
            .timeout(timeouts.call)
            .tcp_nodelay(true);
        let connect = |rt: &Runtime| {
            let channel = if lazy {
                let _in = rt.enter();
                endpoint.connect_lazy()
            } else {
                outside_async(|| rt.block_on(endpoint.connect()))
                    .map_err(|e| StoreError::master_unreachable(addr, e))?
            };
            Ok::<_, StoreError>(
                MasterClient::with_interceptor(channel, credentials.clone())
                    .max_decoding_message_size(MAX_MESSAGE)
                    .max_encoding_message_size(MAX_MESSAGE),
            )
        };
        Ok(Conn { call_client: connect(calls)?, client: connect(runtime)?, addr: addr.to_string() })
    }
}

/// A call still waiting on a master the client no longer follows.
fn switched_status() -> tonic::Status {
    tonic::Status::unavailable("the client switched to another master (a new leader) during the call")
}

/// `call`, or a retryable error once the client switched to another master.
async fn until_switched<T>(
    call: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    switched: tokio::sync::futures::Notified<'_>,
) -> Result<tonic::Response<T>, tonic::Status> {
    tokio::select! {
        r = call => r,
        () = switched => Err(switched_status()),
    }
}

/// How long a call may wait for the master's answer unless `MC_RPC_TIMEOUT_MS` says otherwise.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// The error for a call that got no reply from the master at `addr`: a master that took too
/// long is told apart from one that cannot be reached, and both from one that refused this
/// client's credentials (not retried: the same credentials would be refused again).
fn call_error(addr: &str, s: &tonic::Status, after: Duration) -> StoreError {
    match s.code() {
        tonic::Code::DeadlineExceeded => {
            StoreError::TimedOut { waited: Waited::Master { addr: addr.to_string() }, after }
        }
        tonic::Code::Unauthenticated | tonic::Code::PermissionDenied => {
            StoreError::Unauthenticated { addr: addr.to_string(), source: Box::new(s.clone()) }
        }
        // The call itself was refused (a batch over the master's cap, a message too large):
        // the same call would be refused again.
        tonic::Code::InvalidArgument | tonic::Code::OutOfRange => {
            StoreError::InvalidArgument(format!("the master at {addr} refused the call: {}", s.message()))
        }
        _ => StoreError::master_unreachable(addr, s.clone()),
    }
}

/// Turns a reply's status into a result; `key` names the object in errors. A reply without a
/// status is the master's fault, never a success.
pub fn check(status: Option<Status>, key: &str) -> Result<()> {
    let Some(s) = status else {
        return Err(StoreError::BadReply(format!("the reply about {key:?} carries no status")));
    };
    let code = Code::try_from(s.code).unwrap_or(Code::Internal);
    if code == Code::Ok {
        Ok(())
    } else {
        Err(StoreError::from_status(code, &s.message, key))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::master::server;
    use crate::proto::KeyRequest;

    fn exists(rpc: &MasterRpc) -> Result<crate::proto::ExistsReply> {
        let req = KeyRequest { client_id: "c".into(), key: "k".into(), ..Default::default() };
        rpc.call(|mut c| async move { c.exists(req).await })
    }

    #[test]
    fn mooncake_rpc_timeouts_set_the_deadlines_and_bad_values_are_named() {
        let from = |pairs: &'static [(&'static str, &'static str)]| {
            RpcTimeouts::from_vars(move |n| pairs.iter().find(|(k, _)| *k == n).map(|(_, v)| v.to_string()))
        };
        assert_eq!(from(&[]).unwrap(), RpcTimeouts::default());
        let t = from(&[("MC_RPC_TIMEOUT_MS", "1500"), ("MC_RPC_CONNECT_TIMEOUT_MS", " 250 ")]).unwrap();
        assert_eq!((t.call, t.connect), (Duration::from_millis(1500), Duration::from_millis(250)));
        for (name, bad) in [
            ("MC_RPC_TIMEOUT_MS", "-1"),
            ("MC_RPC_TIMEOUT_MS", "0"),
            ("MC_RPC_TIMEOUT_MS", "5s"),
            ("MC_RPC_CONNECT_TIMEOUT_MS", "86400001"),
        ] {
            let pairs: &'static [(&str, &str)] = Box::leak(Box::new([(name, bad)]));
            let e = from(pairs).unwrap_err().to_string();
            assert!(e.contains(name) && e.contains(bad), "{name}={bad}: {e}");
        }
    }

    #[test]
    fn a_master_too_slow_is_a_timeout_and_a_reply_without_status_is_no_success() {
        let slow = call_error("m:1", &tonic::Status::deadline_exceeded("Timeout expired"), CALL_TIMEOUT);
        assert!(slow.to_string().contains("m:1"), "{slow}");
        assert!(matches!(slow, StoreError::TimedOut { waited: Waited::Master { .. }, .. }), "{slow:?}");
        let gone = call_error("m:1", &tonic::Status::unavailable("connection refused"), CALL_TIMEOUT);
        assert!(matches!(gone, StoreError::MasterUnreachable { .. }), "{gone:?}");
        for refusal in [tonic::Status::unauthenticated("a wrong token"), tonic::Status::permission_denied("no")] {
            let refused = call_error("m:1", &refusal, CALL_TIMEOUT);
            assert!(matches!(refused, StoreError::Unauthenticated { .. }), "{refused:?}");
            assert!(!refused.is_retryable() && !refused.is_master_change() && refused.is_caller_error());
            assert!(refused.to_string().contains("CRESCENT_CLUSTER_SECRET"), "{refused}");
        }
        for refusal in [
            tonic::Status::invalid_argument("16387 keys in one batch call; at most 16384 (split the batch)"),
            tonic::Status::out_of_range("message too large"),
        ] {
            let refused = call_error("m:1", &refusal, CALL_TIMEOUT);
            assert!(matches!(refused, StoreError::InvalidArgument(_)), "{refused:?}");
            assert!(!refused.is_retryable() && refused.is_caller_error(), "{refused:?}");
        }
        assert!(matches!(check(None, "k"), Err(StoreError::BadReply(_))));
        assert!(check(Some(Status { code: Code::Ok as i32, message: String::new() }), "k").is_ok());
        let refused = check(Some(Status { code: Code::ObjectNotFound as i32, message: "no".into() }), "k");
        assert!(matches!(refused, Err(StoreError::NotFound(ref k)) if k == "k"));
    }

    #[test]
    fn a_fast_port_that_does_not_answer_is_left_alone_and_grpc_serves() {
        let master = server::start_loopback();
        let timeouts = RpcTimeouts { call: Duration::from_secs(5), connect: Duration::from_millis(300) };
        let rpc = MasterRpc::connect_with(
            &master.client_address(),
            crate::protocol::DEFAULT_CLUSTER_ID,
            Credentials::open(),
            timeouts,
        )
        .unwrap();
        // A port that accepts connections and never answers the hello (a wrong service there,
        // or a frozen master): the offer waits for the connect timeout once, then not again.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = u32::from(silent.local_addr().unwrap().port());
        let t = Instant::now();
        rpc.offer_fast_rpc(port);
        assert!(t.elapsed() >= Duration::from_millis(300), "the hello was waited for");
        silent.set_nonblocking(true).unwrap();
        let accepted = || std::iter::from_fn(|| silent.accept().ok()).count();
        assert_eq!(accepted(), 1);
        let t = Instant::now();
        for _ in 0..3 {
            rpc.offer_fast_rpc(port);
        }
        assert!(t.elapsed() < Duration::from_millis(300), "later offers of the port wait for nothing");
        assert_eq!(accepted(), 0, "the port is left alone after its failure");
        // The hot calls go over gRPC meanwhile.
        let req = KeyRequest { client_id: "c".into(), key: "k".into(), ..Default::default() };
        let reply: crate::proto::ExistsReply =
            rpc.unary(Method::Exists, req, |mut c, req| async move { c.exists(req).await }).unwrap();
        assert!(!reply.exists);
        assert_eq!(master.master.metrics().fast_rpc_calls.get(), 0);
        // The master's own port, once offered, takes them.
        rpc.offer_fast_rpc(u32::from(master.fast_rpc_addr.unwrap().port()));
        let req = KeyRequest { client_id: "c".into(), key: "k".into(), ..Default::default() };
        let _: crate::proto::ExistsReply =
            rpc.unary(Method::Exists, req, |mut c, req| async move { c.exists(req).await }).unwrap();
        assert_eq!(master.master.metrics().fast_rpc_calls.get(), 1);
    }

    #[test]
    fn work_beside_a_call_does_not_hold_up_other_threads_calls() {
        let master = server::start_loopback();
        let rpc = Arc::new(MasterRpc::connect(&master.client_address(), Credentials::open()).unwrap());
        exists(&rpc).unwrap();
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let slow = {
            let rpc = rpc.clone();
            std::thread::spawn(move || {
                let req = KeyRequest { client_id: "c".into(), key: "k".into(), ..Default::default() };
                let (reply, side) = rpc.call_while(
                    |mut c| async move { c.exists(req).await },
                    || {
                        started_tx.send(()).unwrap();
                        // The side work lasts until the other thread's calls are done: they
                        // can only be done if they did not wait for it (then this gives up,
                        // after a minute).
                        done_rx.recv_timeout(Duration::from_secs(60)).is_ok()
                    },
                );
                (reply.map(|r| r.exists), side)
            })
        };
        started_rx.recv().unwrap();
        // While the other thread works beside its call, this thread's calls go through.
        let t = Instant::now();
        for _ in 0..5 {
            exists(&rpc).unwrap();
        }
        let waited = t.elapsed();
        let _ = done_tx.send(());
        let (reply, side) = slow.join().unwrap();
        assert!(side, "calls waited {waited:?} behind the side work");
        assert!(!reply.unwrap(), "the call beside the work still gets its reply");
    }
}
