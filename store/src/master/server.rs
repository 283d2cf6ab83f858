//! Running a master: the gRPC service and the admin HTTP port on a runtime of their own.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;

use crescent_engine::metadata::server::MetadataServer;

use crate::error::{Result, StoreError};
use crate::master::access::{self, Access};
use crate::master::conn_limit;
use crate::master::fence::Role;
use crate::master::ha::HaSettings;
use crate::master::removal_records::{record_ttl, EtcdRecords, FileRecords, RemovalRecords};
use crate::master::service::MasterService;
use crate::master::{admin, Master, MasterConfig};
use tonic::service::interceptor::InterceptedService;

/// How long a stopping master waits for its clients' connections to close.
pub const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

// Bounds on what one peer can hold on the gRPC port (with the message caps of
// [`crate::master::service`]); the docs' operations page lists them.

/// Requests one connection may have in flight (HTTP/2 streams, and handlers running): a
/// client's threads beyond it wait for a free stream, they do not fail.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 64;
/// Every request, from its first byte to its reply, ends within this (`DEADLINE_EXCEEDED`):
/// a peer that sends a message slowly, or stops half way, holds nothing beyond it. Event
/// streams (Subscribe) are bounded until their reply starts, then run as long as wanted.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// HTTP/2 flow-control windows: how much a peer may send before the master reads it.
pub const STREAM_WINDOW: u32 = 1 << 20;
/// The same for a whole connection, all its streams together.
pub const CONNECTION_WINDOW: u32 = 4 << 20;
/// Largest header block (gRPC metadata is a few hundred bytes).
pub const MAX_HEADER_LIST: u32 = 64 << 10;
/// A connection whose peer does not answer HTTP/2 pings for [`KEEPALIVE_TIMEOUT`] after
/// [`KEEPALIVE_INTERVAL`] of silence is closed (a vanished host frees its connection).
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(20);
/// How long the master waits for the answer to its HTTP/2 ping.
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// A running master; dropping it (or [`MasterHandle::shutdown`]) stops it.
pub struct MasterHandle {
    /// The master itself (for calls in the same process).
    pub master: Arc<Master>,
    /// Where the gRPC service listens (the port picked when the configured one was 0).
    pub rpc_addr: SocketAddr,
    /// Where the admin port listens; `None` without one.
    pub admin_addr: Option<SocketAddr>,
    /// Where the fast RPC port listens ([`crate::fastrpc`]); `None` without one.
    pub fast_rpc_addr: Option<SocketAddr>,
    /// The embedded http metadata server ([`MasterConfig::http_metadata_address`]).
    pub metadata_server: Option<MetadataServer>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MasterHandle {
    /// The address clients use (`host:port`), with 127.0.0.1 for a wildcard bind.
    pub fn client_address(&self) -> String {
        let ip =
            if self.rpc_addr.ip().is_unspecified() { "127.0.0.1".to_string() } else { self.rpc_addr.ip().to_string() };
        format!("{ip}:{}", self.rpc_addr.port())
    }

    /// Stops serving, waits for the master's thread to end, then saves the removals waiting
    /// for disks (with a state directory).
    pub fn shutdown(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.master.save_removals_if_changed();
    }

    /// Blocks until the master stops (it stops when the handle is dropped elsewhere or on error).
    pub fn wait(mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for MasterHandle {
    fn drop(&mut self) {
        self.stop_now();
    }
}

/// Starts a master with `config`; returns once both listeners are bound.
pub fn start(config: MasterConfig) -> Result<MasterHandle> {
    let role = if config.ha.enabled { Role::Standby { leader: None } } else { Role::Single };
    let master = Master::with_role(config.clone(), role)?;
    master.start_sweeper();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(config.rpc_threads)
        .thread_name("crescent-master")
        .enable_all()
        .build()
        .map_err(|e| StoreError::Internal(format!("tokio runtime: {e}")))?;
    let bind = |addr: &str| -> Result<std::net::TcpListener> {
        let l = std::net::TcpListener::bind(addr)
            .map_err(|e| StoreError::Config(format!("cannot listen on {addr}: {e}")))?;
        l.set_nonblocking(true).map_err(|e| StoreError::Internal(e.to_string()))?;
        Ok(l)
    };
    let rpc = bind(&config.rpc_address)?;
    let admin = if config.admin_address.is_empty() { None } else { Some(bind(&config.admin_address)?) };
    let rpc_addr = rpc.local_addr().map_err(|e| StoreError::Internal(e.to_string()))?;
    let admin_addr = admin.as_ref().and_then(|a| a.local_addr().ok());
    // The fast RPC port, on the gRPC address's host.
    let fast = match config.fast_rpc_port {
        Some(port) => Some(bind(&std::net::SocketAddr::new(rpc_addr.ip(), port).to_string())?),
        None => None,
    };
    let fast_rpc_addr = fast.as_ref().and_then(|l| l.local_addr().ok());
    let fast_port = fast_rpc_addr.map_or(0, |a| a.port());
    let metadata_server = if config.http_metadata_address.is_empty() {
        None
    } else {
        let addr = &config.http_metadata_address;
        let bind = std::net::ToSocketAddrs::to_socket_addrs(addr.as_str())
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| StoreError::Config(format!("http metadata server address {addr:?} is not host:port")))?;
        Some(
            MetadataServer::start(bind, "/metadata")
                .map_err(|e| StoreError::Config(format!("cannot serve http metadata on {addr}: {e}")))?,
        )
    };
    let nodelay = config.rpc_tcp_nodelay;
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let ha = if config.ha.enabled {
        let advertise = if config.ha.advertise_address.is_empty() {
            let ip = if rpc_addr.ip().is_unspecified() { "127.0.0.1".to_string() } else { rpc_addr.ip().to_string() };
            format!("{ip}:{}", rpc_addr.port())
        } else {
            config.ha.advertise_address.clone()
        };
        Some(HaSettings {
            endpoints: crate::leader::endpoints(&config.ha.connstring)?,
            cluster_id: config.cluster_id.clone(),
            advertise,
            lease_ttl: config.ha.lease_ttl,
        })
    } else {
        None
    };
    let elections = master.clone();
    let keyring = config.secret()?;
    if keyring.is_none() && !rpc_addr.ip().is_loopback() {
        tracing::warn!(
            "master {rpc_addr} runs WITHOUT a cluster secret: anyone who reaches its gRPC and admin ports can mount, \
             read, overwrite and remove any object and learn where clients' memory is; set \
             CRESCENT_CLUSTER_SECRET_FILE (or --cluster-secret-file) on the master and every client (see docs: security)"
        );
    }
    let access = Access::new(keyring, config.admin_open_reads, master.metrics().auth_refused.clone());
    let gate = access.clone();
    let records = match (&ha, &config.state_dir) {
        (Some(ha), _) => Some(Arc::new(RemovalRecords::Etcd(EtcdRecords::new(
            &ha.endpoints,
            &ha.cluster_id,
            record_ttl(config.client_ttl),
        )))),
        (None, Some(dir)) => {
            let (file, loaded) = FileRecords::open(dir, record_ttl(config.client_ttl))?;
            if !loaded.is_empty() {
                tracing::info!("{} removal(s) recorded before this start buried for the rebuild", loaded.len());
            }
            master.inherit_removals(&loaded);
            Some(Arc::new(RemovalRecords::File(file)))
        }
        (None, None) => None,
    };
    let elected_records = records.clone();
    let shared = MasterService::shared(master.clone(), records, fast_port);
    let fast_access = access.clone();
    #[allow(clippy::result_large_err)] // tonic's Status
    let service = InterceptedService::new(MasterService::grpc(shared.clone()), move |mut req: tonic::Request<()>| {
        let tenant = gate.check_call(req.metadata())?;
        req.extensions_mut().insert(tenant);
        Ok(req)
    });
    let gate = access.clone();
    let admin_router = admin::router(master.clone())
        .layer(axum::middleware::from_fn(move |req, next| access::admin_gate(gate.clone(), req, next)));
    let thread = std::thread::Builder::new()
        .name("crescent-master-rt".into())
        .spawn(move || {
            runtime.block_on(async move {
                if let Some(ha) = ha {
                    let records = elected_records.expect("made with the HA settings");
                    tokio::spawn(crate::master::ha::run(elections, ha, records));
                }
                let rpc = tokio::net::TcpListener::from_std(rpc).expect("registering the rpc listener");
                // Replies of batch calls span several segments: without TCP_NODELAY they would
                // wait on the client's delayed ACK (40 ms per call).
                let gate = conn_limit::Gate::new(conn_limit::MAX_CONNECTIONS, conn_limit::MAX_CONNECTIONS_PER_PEER);
                let incoming = gate.incoming(rpc, nodelay);
                if let Some(fast) = fast {
                    let fast = tokio::net::TcpListener::from_std(fast).expect("registering the fast rpc listener");
                    // Its connections count against the gRPC port's bounds.
                    tokio::spawn(crate::master::service::serve_fast_rpc(
                        fast,
                        gate.clone(),
                        shared,
                        fast_access,
                        REQUEST_TIMEOUT,
                    ));
                }
                let (stop_admin_tx, stop_admin_rx) = oneshot::channel::<()>();
                if let Some(admin) = admin {
                    let admin = tokio::net::TcpListener::from_std(admin).expect("registering the admin listener");
                    tokio::spawn(async move {
                        let _ = axum::serve(admin, admin_router)
                            .with_graceful_shutdown(async move {
                                let _ = stop_admin_rx.await;
                            })
                            .await;
                    });
                }
                let stopping = Arc::new(tokio::sync::Notify::new());
                let stopping2 = stopping.clone();
                let server = tonic::transport::Server::builder()
                    .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
                    .concurrency_limit_per_connection(MAX_STREAMS_PER_CONNECTION as usize)
                    .timeout(REQUEST_TIMEOUT)
                    .initial_stream_window_size(STREAM_WINDOW)
                    .initial_connection_window_size(CONNECTION_WINDOW)
                    .http2_max_header_list_size(MAX_HEADER_LIST)
                    .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
                    .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
                    .add_service(service)
                    .serve_with_incoming_shutdown(incoming, async move {
                        let _ = stop_rx.await;
                        stopping2.notify_one();
                    });
                // A graceful stop waits for every connection to close; a peer that vanished
                // without closing (its host or network namespace gone) would hold it forever.
                let served = tokio::select! {
                    served = server => served,
                    () = async {
                        stopping.notified().await;
                        tokio::time::sleep(SHUTDOWN_GRACE).await;
                    } => {
                        tracing::warn!("connections still open {SHUTDOWN_GRACE:?} after the stop: closing them");
                        Ok(())
                    }
                };
                let _ = stop_admin_tx.send(());
                if let Err(e) = served {
                    tracing::error!("master gRPC server stopped: {e}");
                }
            });
        })
        .map_err(|e| StoreError::Internal(format!("master thread: {e}")))?;
    tracing::info!(
        "master listening: gRPC {rpc_addr}{}{}",
        if fast_port != 0 { format!(", fast rpc {}:{fast_port}", rpc_addr.ip()) } else { String::new() },
        admin_addr.map(|a| format!(", admin http://{a}/metrics")).unwrap_or_default()
    );
    Ok(MasterHandle {
        master,
        rpc_addr,
        admin_addr,
        fast_rpc_addr,
        metadata_server,
        stop: Some(stop_tx),
        thread: Some(thread),
    })
}

/// A master of the defaults on a free loopback port, without an admin port (for tests).
#[cfg(test)]
pub(crate) fn start_loopback() -> MasterHandle {
    start(MasterConfig { rpc_address: "127.0.0.1:0".into(), admin_address: String::new(), ..Default::default() })
        .expect("a master on loopback")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_does_not_wait_for_a_peer_that_never_closes() {
        let handle = start_loopback();
        // A peer that connected and went silent (as one whose host vanished does).
        let silent = std::net::TcpStream::connect(handle.rpc_addr).expect("connect");
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            handle.shutdown();
            let _ = done_tx.send(());
        });
        done_rx.recv_timeout(SHUTDOWN_GRACE * 10).expect("the master stops although a connection stays open");
        drop(silent);
    }
}
