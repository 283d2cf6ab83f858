//! The standalone client (`crescent-client`, Mooncake's `mooncake_client`): one long-lived
//! [`StoreClient`] — segment, engine, disk tier, hot cache — serving the dummy clients
//! ([`crate::client::dummy`]) of the worker processes on its host.
//!
//! * **Access**: a unix socket ([`Address`]: abstract name or path), served by the transports'
//!   accept loop ([`crescent_transports::net::serve()`]: at most [`Access::max_connections`] at
//!   a time, [`Access::max_per_process`] of one process). A connection is admitted by its
//!   peer's kernel credentials (`SO_PEERCRED`): the standalone client's own user, or one named
//!   in [`Access::uids`].
//! * **Workers**: a worker is its client id and pid; its connections share what it shared.
//!   Each shared region (a memfd) is mapped here once and registered with the engine, so the
//!   engine reads into and writes from the worker's pages. When the last connection of a
//!   worker closes (it exited, was killed, or closed), its regions are unregistered and
//!   unmapped — once the calls still using them end (each holds them, and each ends by its
//!   own deadline).
//! * **Calls**: one thread per connection; a call is the [`StoreClient`] call of the same
//!   name on the translated memory. A frame that starts must finish within
//!   [`FRAME_TIMEOUT`]; a reply must be taken within [`FRAME_TIMEOUT`]; a peer that breaks
//!   the protocol loses its connection.

pub mod cli;

use std::collections::HashMap;
use std::mem::ManuallyDrop;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crescent_engine::TransferEngine;
use crescent_transports::net::{self as tnet, PeerKey};
use crescent_transports::shm::Mapping;
use parking_lot::{Mutex, RwLock};
use prost::Message;

use crate::client::dummy::frame::{self, Address, Conn, Listener, RecvError};
use crate::client::dummy::wire::{self, Mem, Outcome, Reply, Request, Span, WireError};
use crate::client::{Extent, Piece, StoreApi, StoreClient};
use crate::error::{Result, StoreError};
use crate::proto::PutOptions;

/// How long the rest of a frame may take once it started arriving, and a reply to be taken.
pub const FRAME_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a new connection may take to say hello.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Regions one worker may share.
pub const MAX_REGIONS: usize = 4096;

/// Who may connect.
#[derive(Debug, Clone)]
pub struct Access {
    /// Users admitted besides the standalone client's own.
    pub uids: Vec<u32>,
    /// Connections served at a time (each is a thread).
    pub max_connections: usize,
    /// Connections of one process (a dummy client opens one per thread calling at once).
    pub max_per_process: usize,
    /// After a reply, how long a connection's thread polls for the worker's next request
    /// before it blocks ([`Conn::recv_polling`]): a worker calling in a loop sends it within
    /// µs, and one taken while polling costs no thread wake-up (tens of µs on a virtual
    /// machine, a tenth of a 1 MiB call). At most this much CPU per call; zero: never poll.
    pub poll: Duration,
}

/// Polling after a reply, by default: the time a worker calling in a loop takes to send its
/// next request, with room for a busy host, and short against the calls it speeds up.
pub const DEFAULT_POLL: Duration = Duration::from_micros(50);

impl Default for Access {
    fn default() -> Self {
        Access { uids: Vec::new(), max_connections: 1024, max_per_process: 256, poll: DEFAULT_POLL }
    }
}

/// How a standalone client's connections took their requests (see [`Access::poll`]): a
/// connection's first request, and one after a pause, is waited for.
pub type RequestCounts = frame::PollCounts;

/// A region a worker shared: its memfd mapped here and registered with the engine.
struct Shared {
    mapping: ManuallyDrop<Mapping>,
    addr: u64,
    len: u64,
    engine: Arc<TransferEngine>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Every call that used the region has ended (each held it): the engine has no
        // transfer on it, and unregistering waits for any anyway.
        match self.engine.unregister(self.addr) {
            // SAFETY: dropped once, here, after the engine let go of the memory.
            Ok(()) => unsafe { ManuallyDrop::drop(&mut self.mapping) },
            Err(e) => tracing::error!(
                "standalone: unregistering a worker's region [{:#x}, +{}) failed ({e}); it stays mapped",
                self.addr,
                self.len
            ),
        }
    }
}

/// One worker process.
struct Worker {
    id: String,
    pid: i32,
    regions: RwLock<HashMap<u32, Arc<Shared>>>,
}

/// The attached workers by (pid, client id): each with its open connections.
type Workers = HashMap<(i32, String), (Arc<Worker>, usize)>;

/// What the server's threads share.
struct State {
    client: Arc<StoreClient>,
    access: Access,
    workers: Mutex<Workers>,
    stop: AtomicBool,
    requests: frame::PollCounter,
}

/// A running standalone client's service; stopped on drop.
pub struct StandaloneServer {
    state: Arc<State>,
    address: Address,
    server: Option<tnet::Server>,
}

impl StandaloneServer {
    /// Serves `client`'s store to dummy clients at `address`.
    pub fn start(client: Arc<StoreClient>, address: &Address, access: Access) -> Result<StandaloneServer> {
        let listener = Listener::bind(address).map_err(|e| StoreError::system(format!("listening at {address}"), e))?;
        let limits = tnet::Limits {
            max_connections: access.max_connections,
            max_per_peer: access.max_per_process,
            // Dummy clients' pooled connections idle between calls.
            idle: None,
        };
        let state = Arc::new(State {
            client,
            access,
            workers: Mutex::new(HashMap::new()),
            stop: AtomicBool::new(false),
            requests: frame::PollCounter::default(),
        });
        let st = state.clone();
        // No cluster secret here: dummy clients are processes of this host on a unix socket,
        // admitted by their credentials (see `admit`), not peers of the cluster.
        let guard = tnet::Guard::open();
        let server = tnet::serve("standalone", listener, limits, guard, move |a: tnet::serve::Accepted<Conn>| {
            admit(&st, &a.stream, &a.peer)
        })
        .map_err(|e| StoreError::system(format!("serving at {address}"), e))?;
        tracing::info!("standalone client serving dummy clients at {address}");
        Ok(StandaloneServer { state, address: address.clone(), server: Some(server) })
    }

    /// Where it serves dummy clients.
    pub fn address(&self) -> &Address {
        &self.address
    }

    /// Workers attached now, and the regions they share (for tests and logs).
    pub fn workers(&self) -> Vec<(i32, usize)> {
        self.state.workers.lock().values().map(|(w, _)| (w.pid, w.regions.read().len())).collect()
    }

    /// How the requests after the hellos were taken so far (for tests and benchmarks).
    pub fn requests(&self) -> RequestCounts {
        self.state.requests.get()
    }

    /// Stops accepting and ends every connection.
    pub fn stop(&mut self) {
        self.state.stop.store(true, Ordering::Release);
        self.server.take();
    }
}

impl Drop for StandaloneServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A connection's thread: its peer's credentials checked, then served.
fn admit(state: &Arc<State>, conn: &Conn, peer: &PeerKey) {
    let own = rustix::process::getuid().as_raw();
    match *peer {
        PeerKey::Process { pid, uid } if uid == own || state.access.uids.contains(&uid) => serve(state, conn, pid),
        PeerKey::Process { pid, uid } => {
            tracing::warn!("standalone: refused a connection of pid {pid}: user {uid} is not admitted")
        }
        ref other => tracing::warn!("standalone: refused a connection of {other}: no credentials"),
    }
}

/// Sends `reply` (with `payload`); false if the connection is to end.
fn send(conn: &Conn, reply: &Reply, payload: &[&[u8]]) -> bool {
    let message = match wire::encode(reply) {
        Ok(m) => m,
        Err(e) => {
            tracing::error!("standalone: {e}");
            return false;
        }
    };
    match conn.send(&message, payload, None, Instant::now() + FRAME_TIMEOUT) {
        Ok(()) => true,
        Err(e) => {
            tracing::debug!("standalone: sending a reply: {e}");
            false
        }
    }
}

fn serve(state: &Arc<State>, conn: &Conn, pid: i32) {
    let hello = match conn.recv(Some(Instant::now() + HELLO_TIMEOUT), FRAME_TIMEOUT) {
        Ok(f) => f,
        Err(e) => {
            tracing::debug!("standalone: pid {pid} connected but said no hello: {e}");
            return;
        }
    };
    let (version, client_id) = match wire::decode::<Request>(&hello.message) {
        Ok(Request::Hello { version, client_id }) => (version, client_id),
        Ok(other) => {
            let e = StoreError::BadFrame(format!("the first message must be Hello, not {other:?}"));
            send(conn, &Reply::Fail(WireError::from(&e)), &[]);
            return;
        }
        Err(e) => {
            send(conn, &Reply::Fail(WireError::from(&e)), &[]);
            return;
        }
    };
    if version != wire::VERSION || client_id.is_empty() || client_id.len() > 128 {
        let e = StoreError::BadFrame(format!(
            "hello of version {version} with a client id of {} bytes (this is version {}, ids of 1..=128 bytes)",
            client_id.len(),
            wire::VERSION
        ));
        send(conn, &Reply::Fail(WireError::from(&e)), &[]);
        return;
    }
    let (worker, known) = attach(state, pid, &client_id);
    let reply = Reply::Hello {
        version: wire::VERSION,
        known,
        segment_name: state.client.segment_name().to_string(),
        replica_num: state.client.default_options().replica_num,
    };
    if send(conn, &reply, &[]) {
        loop {
            let frame = match conn.recv_polling(None, FRAME_TIMEOUT, state.access.poll) {
                Ok((f, polled)) => {
                    state.requests.count(polled);
                    f
                }
                Err(RecvError::Closed) => break,
                Err(e) => {
                    if !state.stop.load(Ordering::Acquire) {
                        tracing::warn!("standalone: worker {} (pid {pid}): {e}; closing its connection", worker.id);
                    }
                    break;
                }
            };
            let request = match wire::decode::<Request>(&frame.message) {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!("standalone: worker {} (pid {pid}): {e}; closing its connection", worker.id);
                    send(conn, &Reply::Fail(WireError::from(&e)), &[]);
                    break;
                }
            };
            let (reply, payload) = handle(state, &worker, request, frame.payload, frame.fd);
            let parts: Vec<&[u8]> = payload.iter().map(|p| &p[..]).collect();
            if !send(conn, &reply, &parts) {
                break;
            }
        }
    }
    detach(state, &worker);
}

/// Joins a connection to its worker; whether the worker was known (its regions shared).
fn attach(state: &State, pid: i32, id: &str) -> (Arc<Worker>, bool) {
    let mut workers = state.workers.lock();
    let key = (pid, id.to_string());
    if let Some((w, n)) = workers.get_mut(&key) {
        *n += 1;
        return (w.clone(), true);
    }
    let w = Arc::new(Worker { id: id.to_string(), pid, regions: RwLock::new(HashMap::new()) });
    workers.insert(key, (w.clone(), 1));
    tracing::info!("standalone: dummy client {id} (pid {pid}) attached ({} worker(s))", workers.len());
    (w, false)
}

/// A connection of `worker` ended; with its last one, what it shared is released (once the
/// calls still holding it end).
fn detach(state: &State, worker: &Arc<Worker>) {
    let mut workers = state.workers.lock();
    let key = (worker.pid, worker.id.clone());
    let last = match workers.get_mut(&key) {
        Some((_, n)) if *n > 1 => {
            *n -= 1;
            false
        }
        Some(_) => true,
        None => false,
    };
    if last {
        workers.remove(&key);
        let regions: Vec<Arc<Shared>> = worker.regions.write().drain().map(|(_, r)| r).collect();
        let bytes: u64 = regions.iter().map(|r| r.len).sum();
        tracing::info!(
            "standalone: dummy client {} (pid {}) detached: {} region(s), {bytes} bytes released ({} worker(s))",
            worker.id,
            worker.pid,
            regions.len(),
            workers.len()
        );
    }
}

/// The memory of `mems` here, and the regions it lies in (held for the call).
fn translate(worker: &Worker, mems: &[Mem], held: &mut Vec<Arc<Shared>>) -> Result<Vec<Piece>> {
    let regions = worker.regions.read();
    mems.iter()
        .map(|m| {
            let r = regions.get(&m.region).ok_or_else(|| {
                StoreError::invalid(format!("region {} is not shared with the standalone client", m.region))
            })?;
            let at = r.mapping.at(m.offset, m.len).ok_or_else(|| {
                StoreError::invalid(format!(
                    "[{}, +{}) is outside shared region {} of {} bytes",
                    m.offset, m.len, m.region, r.len
                ))
            })?;
            if !held.iter().any(|h| Arc::ptr_eq(h, r)) {
                held.push(r.clone());
            }
            Ok(Piece::new(at as u64, m.len))
        })
        .collect()
}

fn extents(worker: &Worker, spans: &[Span], held: &mut Vec<Arc<Shared>>) -> Result<Vec<Extent>> {
    let mems: Vec<Mem> = spans.iter().map(|s| s.dst).collect();
    let pieces = translate(worker, &mems, held)?;
    Ok(spans.iter().zip(pieces).map(|(s, p)| Extent { offset: s.offset, addr: p.addr, len: p.len }).collect())
}

fn options(state: &State, bytes: &[u8]) -> Result<PutOptions> {
    if bytes.is_empty() {
        return Ok(state.client.default_options());
    }
    PutOptions::decode(bytes).map_err(|e| StoreError::BadFrame(format!("put options do not decode: {e}")))
}

fn share(state: &State, worker: &Worker, region: u32, len: u64, fd: Option<OwnedFd>) -> Result<()> {
    let fd = fd.ok_or_else(|| StoreError::BadFrame("Share came without a memfd".into()))?;
    if len == 0 {
        return Err(StoreError::invalid("cannot share 0 bytes"));
    }
    {
        let regions = worker.regions.read();
        if let Some(r) = regions.get(&region) {
            // Shared already (a reconnection raced with a new allocation's own share).
            return if r.len == len {
                Ok(())
            } else {
                Err(StoreError::invalid(format!("region {region} is shared already with {} bytes", r.len)))
            };
        }
        if regions.len() >= MAX_REGIONS {
            return Err(StoreError::invalid(format!("a worker may share at most {MAX_REGIONS} regions")));
        }
    }
    let mapping = Mapping::map(fd, len).map_err(StoreError::invalid)?;
    let addr = mapping.at(0, len).expect("mapped with this length") as u64;
    let engine = state.client.engine().clone();
    engine.register(addr, len, "cpu:0")?;
    let shared = Arc::new(Shared { mapping: ManuallyDrop::new(mapping), addr, len, engine });
    worker.regions.write().insert(region, shared);
    tracing::debug!("standalone: worker {} shared region {region} ({len} bytes) at {addr:#x}", worker.id);
    Ok(())
}

fn outcome<T>(r: Result<T>, f: impl FnOnce(T) -> Outcome) -> Outcome {
    match r {
        Ok(v) => f(v),
        Err(e) => Outcome::Fail(WireError::from(&e)),
    }
}

/// Carries out one request; the reply and its payload.
fn handle(
    state: &State,
    worker: &Worker,
    request: Request,
    payload: Vec<u8>,
    fd: Option<OwnedFd>,
) -> (Reply, Vec<Vec<u8>>) {
    if fd.is_some() && !matches!(request, Request::Share { .. }) {
        let e = StoreError::BadFrame("a file descriptor came with a request that takes none".into());
        return (Reply::Fail(WireError::from(&e)), Vec::new());
    }
    match call(state, worker, request, payload, fd) {
        Ok(r) => r,
        Err(e) => (Reply::Fail(WireError::from(&e)), Vec::new()),
    }
}

fn call(
    state: &State,
    worker: &Worker,
    request: Request,
    payload: Vec<u8>,
    fd: Option<OwnedFd>,
) -> Result<(Reply, Vec<Vec<u8>>)> {
    let c = &state.client;
    let mut held = Vec::new();
    let none = Vec::new;
    Ok(match request {
        Request::Hello { .. } => return Err(StoreError::BadFrame("a second Hello".into())),
        Request::Share { region, len } => {
            share(state, worker, region, len, fd)?;
            (Reply::Done, none())
        }
        Request::Unshare { region } => {
            worker
                .regions
                .write()
                .remove(&region)
                .ok_or_else(|| StoreError::invalid(format!("region {region} is not shared")))?;
            (Reply::Done, none())
        }
        Request::Ping => (Reply::Done, none()),
        Request::Health => (Reply::Bool(c.master_reachable()), none()),
        Request::Put { key, options: o, upsert } => {
            let o = options(state, &o)?;
            if upsert {
                c.upsert_with(&key, &payload, &o)?;
            } else {
                c.put_with(&key, &payload, &o)?;
            }
            (Reply::Done, none())
        }
        Request::PutFrom { key, pieces, options: o, upsert } => {
            let pieces = translate(worker, &pieces, &mut held)?;
            let o = options(state, &o)?;
            if upsert {
                c.upsert_from_sg(&key, &pieces, &o)?;
            } else {
                c.put_from_sg(&key, &pieces, &o)?;
            }
            (Reply::Done, none())
        }
        Request::Get { key } => {
            let v = c.get(&key)?;
            if v.len() > frame::MAX_PAYLOAD {
                return Err(StoreError::invalid(format!(
                    "object {key:?} of {} bytes is over the standalone wire's {}-byte limit for values returned as \
                     bytes: get it into memory from alloc_from_mem_pool (get_into)",
                    v.len(),
                    frame::MAX_PAYLOAD
                )));
            }
            (Reply::Bytes, vec![v])
        }
        Request::GetInto { key, pieces } => {
            let pieces = translate(worker, &pieces, &mut held)?;
            (Reply::Size(c.get_into_sg(&key, &pieces)?), none())
        }
        Request::GetRanges { key, ranges } => {
            let extents = extents(worker, &ranges, &mut held)?;
            (Reply::Size(c.get_into_ranges(&key, &extents)?), none())
        }
        Request::PutBatch { keys, lens, options: o, upsert } => {
            if keys.len() != lens.len() {
                return Err(StoreError::BadFrame(format!("{} keys but {} lengths", keys.len(), lens.len())));
            }
            let mut values = Vec::with_capacity(lens.len());
            let mut at = 0usize;
            for &n in &lens {
                let end = usize::try_from(n).ok().and_then(|n| at.checked_add(n)).filter(|e| *e <= payload.len());
                let end = end.ok_or_else(|| StoreError::BadFrame("values past the payload".into()))?;
                values.push(&payload[at..end]);
                at = end;
            }
            let o = options(state, &o)?;
            let rs =
                if upsert { c.upsert_batch_with(&keys, &values, &o)? } else { c.put_batch_with(&keys, &values, &o)? };
            (Reply::Results(rs.into_iter().map(|r| outcome(r, |()| Outcome::Done)).collect()), none())
        }
        Request::PutFromBatch { keys, values, options: o, upsert } => {
            let pieces = values.iter().map(|v| translate(worker, v, &mut held)).collect::<Result<Vec<_>>>()?;
            let refs: Vec<&[Piece]> = pieces.iter().map(|p| &p[..]).collect();
            let o = options(state, &o)?;
            let rs =
                if upsert { c.batch_upsert_from_sg(&keys, &refs, &o)? } else { c.batch_put_from_sg(&keys, &refs, &o)? };
            (Reply::Results(rs.into_iter().map(|r| outcome(r, |()| Outcome::Done)).collect()), none())
        }
        Request::GetBatch { keys } => {
            let rs = c.get_batch(&keys)?;
            let mut total = 0usize;
            let mut out = Vec::new();
            let outcomes = rs
                .into_iter()
                .zip(&keys)
                .map(|(r, key)| match r {
                    Ok(v) if total + v.len() > frame::MAX_PAYLOAD => {
                        Outcome::Fail(WireError::from(&StoreError::invalid(format!(
                            "object {key:?} does not fit the rest of this batch's reply: get it alone or into memory"
                        ))))
                    }
                    Ok(v) => {
                        total += v.len();
                        let n = v.len() as u64;
                        out.push(v);
                        Outcome::Bytes(n)
                    }
                    Err(e) => Outcome::Fail(WireError::from(&e)),
                })
                .collect();
            (Reply::Results(outcomes), out)
        }
        Request::GetIntoBatch { keys, values } => {
            let pieces = values.iter().map(|v| translate(worker, v, &mut held)).collect::<Result<Vec<_>>>()?;
            let refs: Vec<&[Piece]> = pieces.iter().map(|p| &p[..]).collect();
            let rs = c.batch_get_into_sg(&keys, &refs)?;
            (Reply::Results(rs.into_iter().map(|r| outcome(r, Outcome::Size)).collect()), none())
        }
        Request::GetRangesBatch { keys, ranges } => {
            let extents = ranges.iter().map(|r| extents(worker, r, &mut held)).collect::<Result<Vec<_>>>()?;
            let refs: Vec<&[Extent]> = extents.iter().map(|e| &e[..]).collect();
            let rs = c.batch_get_into_ranges(&keys, &refs)?;
            (Reply::Results(rs.into_iter().map(|r| outcome(r, Outcome::Size)).collect()), none())
        }
        Request::Exists { key } => (Reply::Bool(c.exists(&key)?), none()),
        Request::BatchExists { keys } => (Reply::Bools(c.batch_exists(&keys)?), none()),
        Request::Query { key } => (Reply::Query(c.query(&key)?.encode_to_vec()), none()),
        Request::GetSize { key } => (Reply::Size(c.get_size(&key)?), none()),
        Request::Remove { key, force } => {
            c.remove_with(&key, force)?;
            (Reply::Done, none())
        }
        Request::RemoveByRegex { pattern, force } => (Reply::Size(c.remove_by_regex_with(&pattern, force)?), none()),
        Request::RemoveAll { force } => (Reply::Size(c.remove_all_with(force)?), none()),
    })
}
