//! A dummy client: the whole store API ([`StoreApi`]) in a worker process, carried out by a
//! standalone client (`crescent-client`, [`crate::standalone`]) on the same host, which owns
//! the segment, the engine, the disk tier and the hot cache (Mooncake's `setup_dummy` and
//! `mooncake_client`).
//!
//! * The wire ([`frame`], [`wire`]) is a unix socket (abstract name or path; the standalone
//!   client admits peers of its own user by their kernel credentials). Every call has a
//!   deadline ([`DummyConfig::call_timeout`]); a connection is used by one call at a time and
//!   kept in a pool for the next.
//! * Memory (`memory`): what this process allocates through the API (the pool,
//!   `alloc_from_mem_pool`, the local buffer) is a memfd shared with the standalone client
//!   over the socket (`SCM_RIGHTS`); it maps and registers it, so gets land in these pages and
//!   puts read them with no extra copy. Other registered memory is bounced through the local
//!   buffer (one memcpy here). Values given or returned as bytes travel in the frames.
//! * Faults: if the standalone client goes away, calls fail with
//!   [`StoreError::StandaloneUnavailable`] (retryable) or, if it stops answering,
//!   [`StoreError::TimedOut`] at their deadline; the client reconnects by itself on the next
//!   call and from its monitor thread, sharing its regions again. A worker that dies releases
//!   what it shared: the standalone client sees its connections close.

pub mod frame;
mod memory;
pub mod wire;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use prost::Message;

use super::api::StoreApi;
use super::op::{Held, HeldBuffer};
use super::sg::{Extent, Piece};
use super::{check_per_key, one_value_per_key};
use crate::error::{Result, StoreError, Waited};
use crate::proto::{PutOptions, QueryKeyReply};
use crescent_transports::device::{Devices, Driver};
use frame::{Address, Conn, RecvError, MAX_PAYLOAD};
use memory::{Bounce, Loc, Memory, Region};
use wire::{Mem, Outcome, Reply, Request, Span};

/// Settings of a dummy client.
#[derive(Debug, Clone)]
pub struct DummyConfig {
    /// The standalone client: `@name` (abstract socket), a socket path, or `host:port` as
    /// Mooncake's `setup_dummy` takes it (the standalone client of `--port` on this host).
    pub server_address: String,
    /// Bytes of the memory pool `alloc_from_mem_pool` carves (shared once); 0: none, every
    /// allocation is a memfd of its own.
    pub mem_pool_size: u64,
    /// Bytes of the local buffer that bounces registered heap memory; 0: none.
    pub local_buffer_size: u64,
    /// How long a call may take, end to end. Longer than the standalone client's own
    /// deadlines (its engine's transfer timeout, its master calls), so that its errors come
    /// back rather than this one.
    pub call_timeout: Duration,
    /// How long connecting (and sharing the regions) may take.
    pub connect_timeout: Duration,
    /// How often the monitor thread checks the standalone client (and reconnects).
    pub ping_interval: Duration,
    /// After sending a request, how long a call may poll its socket for the reply before it
    /// blocks ([`Conn::recv_polling`]): a reply taken while polling costs no thread wake-up
    /// (tens of µs on a virtual machine). It polls only while this client's recent calls
    /// took at most this long (then up to twice their time, at most this): a longer call
    /// blocks at once, its wake-up a small part of it. Zero: never poll.
    pub reply_poll: Duration,
}

/// [`DummyConfig::reply_poll`] by default: about a 16 x 64 KiB batch's time on a busy host.
pub const DEFAULT_REPLY_POLL: Duration = Duration::from_micros(500);

/// How a dummy client's calls took their replies (see [`DummyConfig::reply_poll`]).
pub type ReplyCounts = frame::PollCounts;

impl Default for DummyConfig {
    fn default() -> Self {
        DummyConfig {
            server_address: String::new(),
            mem_pool_size: 0,
            local_buffer_size: 16 << 20,
            call_timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(5),
            ping_interval: Duration::from_secs(1),
            reply_poll: DEFAULT_REPLY_POLL,
        }
    }
}

/// The socket address `setup_dummy`'s `server_address` names.
pub fn server_socket(server_address: &str) -> Result<Address> {
    let s = server_address.trim();
    if s.starts_with('@') || s.starts_with('/') || s.starts_with('.') {
        return Address::parse(s).map_err(|e| StoreError::Config(e.to_string()));
    }
    let port = s.rsplit_once(':').map_or(s, |(_, p)| p);
    let port: u16 = port.parse().map_err(|_| {
        StoreError::Config(format!(
            "server_address {s:?}: expected host:port of a standalone client on this host, @name or a socket path"
        ))
    })?;
    Ok(frame::default_address(port))
}

/// What the standalone client told us in its hello.
#[derive(Debug, Clone, Default)]
struct ServerInfo {
    segment_name: String,
    replica_num: u32,
}

struct Inner {
    address: Address,
    id: String,
    config: DummyConfig,
    memory: Memory,
    idle: Mutex<Vec<Conn>>,
    /// Held while a connection is made and the regions shared, so that a region is shared
    /// before any other connection of a new standalone client is used.
    connecting: Mutex<()>,
    server: RwLock<ServerInfo>,
    /// Whether the last attempt reached the standalone client (for one log line per change).
    up: AtomicBool,
    closed: AtomicBool,
    /// Recent calls' time from request sent to reply taken, in ns (a moving average).
    service_ns: AtomicU64,
    replies: frame::PollCounter,
}

/// A dummy client; see the module documentation.
pub struct DummyClient {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for DummyClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DummyClient").field("id", &self.inner.id).field("server", &self.inner.address).finish()
    }
}

/// A call's caller memory, named for the wire, with the bounce blocks of its heap pieces.
struct Placed<'m> {
    /// Per value: its pieces on the wire.
    mems: Vec<Vec<Mem>>,
    /// Heap pieces: their value, the caller's piece, where it starts in the value's pieces.
    heap: Vec<(usize, Piece, u64)>,
    bounce: Option<Bounce<'m>>,
}

impl Placed<'_> {
    /// Copies the heap pieces into their bounce blocks (before a put).
    fn copy_in(&self) {
        let Some(b) = &self.bounce else { return };
        for (i, &(_, p, _)) in self.heap.iter().enumerate() {
            // SAFETY: the caller registered [p.addr, +p.len) and lends it for the call; the
            // bounce block of p.len bytes is ours until `b` drops.
            unsafe { std::ptr::copy_nonoverlapping(p.addr as *const u8, b.addr(i) as *mut u8, p.len as usize) }
        }
    }

    /// Copies back the heap pieces of value `v` after a get: of each, `n(start, piece)` bytes
    /// at most (`start`: where the piece starts in the value's pieces).
    fn copy_out(&self, v: usize, n: impl Fn(u64, &Piece) -> u64) {
        let Some(b) = &self.bounce else { return };
        for (i, &(value, p, start)) in self.heap.iter().enumerate() {
            if value != v {
                continue;
            }
            let len = n(start, &p).min(p.len);
            // SAFETY: as in `copy_in`, the other way; the standalone client's transfers into
            // the block ended with its reply.
            unsafe { std::ptr::copy_nonoverlapping(b.addr(i) as *const u8, p.addr as *mut u8, len as usize) }
        }
    }
}

impl DummyClient {
    /// Connects to the standalone client, shares the pool and the local buffer, and starts
    /// the monitor thread. Fails when the standalone client cannot be reached.
    pub fn connect(config: DummyConfig) -> Result<DummyClient> {
        let address = server_socket(&config.server_address)?;
        let memory = Memory::new(config.mem_pool_size, config.local_buffer_size)?;
        let inner = Arc::new(Inner {
            address,
            id: uuid::Uuid::new_v4().to_string(),
            config,
            memory,
            idle: Mutex::new(Vec::new()),
            connecting: Mutex::new(()),
            server: RwLock::new(ServerInfo::default()),
            up: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            service_ns: AtomicU64::new(0),
            replies: frame::PollCounter::default(),
        });
        let conn = inner.open(Instant::now() + inner.config.connect_timeout)?;
        inner.idle.lock().push(conn);
        start_monitor(Arc::downgrade(&inner));
        tracing::info!("dummy client {} attached to the standalone client at {}", inner.id, inner.address);
        Ok(DummyClient { inner })
    }

    /// Its id: a UUID made at connect, sent in every connection's `Hello` (so the standalone
    /// client knows a reconnection as the same client).
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    /// The standalone client's socket.
    pub fn server(&self) -> &Address {
        &self.inner.address
    }

    /// How this client's calls took their replies so far (for tests and benchmarks).
    pub fn replies(&self) -> ReplyCounts {
        self.inner.replies.get()
    }

    /// `len` bytes of shared memory (zeroed at first use): from the pool, or a memfd of its own
    /// shared at once. Usable by the zero-copy calls without `register_buffer`.
    pub fn alloc(&self, len: u64) -> Result<u64> {
        let (addr, own) = self.inner.memory.alloc(len)?;
        if let Some(region) = own {
            if let Err(e) = self.inner.share(&region) {
                // Not shared now: shared with the rest at the next connection, unless the
                // standalone client refused it.
                if !matches!(e, StoreError::StandaloneUnavailable { .. } | StoreError::TimedOut { .. }) {
                    let _ = self.inner.memory.free(addr);
                    return Err(e);
                }
            }
        }
        Ok(addr)
    }

    /// Frees memory from [`Self::alloc`].
    pub fn free_to_mem_pool(&self, addr: u64) -> Result<()> {
        self.inner.free(addr)
    }

    fn options(options: &PutOptions) -> Vec<u8> {
        options.encode_to_vec()
    }

    /// Names `values`' pieces for the wire, bouncing heap pieces (all in one bounce).
    fn place<'m>(&'m self, values: &[&[Piece]], deadline: Instant) -> Result<Placed<'m>> {
        let mut mems = Vec::with_capacity(values.len());
        let mut heap = Vec::new();
        let mut slots = Vec::new();
        for (v, pieces) in values.iter().enumerate() {
            let mut out = Vec::with_capacity(pieces.len());
            let mut start = 0u64;
            for (j, p) in pieces.iter().enumerate() {
                match self.inner.memory.locate(p.addr, p.len)? {
                    Loc::Shared(m) => out.push(m),
                    Loc::Heap => {
                        heap.push((v, *p, start));
                        slots.push((v, j));
                        out.push(Mem { region: 0, offset: 0, len: p.len }); // its bounce block, below
                    }
                }
                start = start.saturating_add(p.len);
            }
            mems.push(out);
        }
        let bounce = if heap.is_empty() {
            None
        } else {
            let lens: Vec<u64> = heap.iter().map(|(_, p, _)| p.len).collect();
            let b = self.inner.memory.bounce(&lens, deadline)?;
            for (k, &(v, j)) in slots.iter().enumerate() {
                mems[v][j] = b.mem(k, lens[k]);
            }
            Some(b)
        };
        Ok(Placed { mems, heap, bounce })
    }

    /// A put of the value made of `parts` (bytes), one after another.
    fn put_bytes(&self, key: &str, parts: &[&[u8]], options: &PutOptions, upsert: bool) -> Result<()> {
        let total = parts.iter().map(|p| p.len() as u64).sum::<u64>();
        if total > MAX_PAYLOAD as u64 {
            return Err(too_large(total));
        }
        let request = Request::Put { key: key.to_string(), options: Self::options(options), upsert };
        done(self.inner.call(&request, parts, None)?)
    }

    fn put_pieces(&self, key: &str, pieces: &[Piece], options: &PutOptions, upsert: bool) -> Result<()> {
        let placed = self.place(&[pieces], self.deadline())?;
        placed.copy_in();
        let request = Request::PutFrom {
            key: key.to_string(),
            pieces: placed.mems[0].clone(),
            options: Self::options(options),
            upsert,
        };
        done(self.inner.call(&request, &[], None)?)
    }

    fn put_many(
        &self,
        keys: &[String],
        values: &[&[u8]],
        options: &PutOptions,
        upsert: bool,
    ) -> Result<Vec<Result<()>>> {
        one_value_per_key(keys.len(), values.len())?;
        // In frames of at most MAX_PAYLOAD bytes; a value over it alone is refused.
        let mut results: Vec<Option<Result<()>>> = (0..keys.len()).map(|_| None).collect();
        let mut i = 0;
        while i < keys.len() {
            if values[i].len() > MAX_PAYLOAD {
                results[i] = Some(Err(too_large(values[i].len() as u64)));
                i += 1;
                continue;
            }
            let start = i;
            let mut bytes = 0usize;
            while i < keys.len() && values[i].len() <= MAX_PAYLOAD && bytes + values[i].len() <= MAX_PAYLOAD {
                bytes += values[i].len();
                i += 1;
            }
            let request = Request::PutBatch {
                keys: keys[start..i].to_vec(),
                lens: values[start..i].iter().map(|v| v.len() as u64).collect(),
                options: Self::options(options),
                upsert,
            };
            let reply = self.inner.call(&request, &values[start..i], None)?;
            let part = self.results(reply, i - start, |_, o| match o {
                Outcome::Done => Ok(()),
                o => Err(unexpected_outcome(&o)),
            })?;
            for (k, r) in part.into_iter().enumerate() {
                results[start + k] = Some(r);
            }
        }
        Ok(results.into_iter().map(|r| r.expect("every key answered")).collect())
    }

    fn put_many_from(
        &self,
        keys: &[String],
        values: &[&[Piece]],
        options: &PutOptions,
        upsert: bool,
    ) -> Result<Vec<Result<()>>> {
        one_value_per_key(keys.len(), values.len())?;
        let placed = self.place(values, self.deadline())?;
        placed.copy_in();
        let request = Request::PutFromBatch {
            keys: keys.to_vec(),
            values: placed.mems.clone(),
            options: Self::options(options),
            upsert,
        };
        let reply = self.inner.call(&request, &[], None)?;
        self.results(reply, keys.len(), |_, o| match o {
            Outcome::Done => Ok(()),
            o => Err(unexpected_outcome(&o)),
        })
    }

    /// [`StoreApi::batch_get_buffer`]: the sizes, memory for each, then one batch of gets. A
    /// value that grew between its size and its get is asked again once, in memory of its new
    /// size.
    fn get_buffers(&self, keys: &[String]) -> Result<Vec<Result<HeldBuffer>>> {
        let mut out: Vec<Option<Result<HeldBuffer>>> = (0..keys.len()).map(|_| None).collect();
        for _round in 0..2 {
            let todo: Vec<usize> = (0..keys.len()).filter(|&i| out[i].is_none()).collect();
            if todo.is_empty() {
                break;
            }
            let mut blocks: Vec<(usize, PoolBlock)> = Vec::with_capacity(todo.len());
            for &i in &todo {
                match self
                    .get_size(&keys[i])
                    .and_then(|n| Ok(PoolBlock { inner: self.inner.clone(), addr: self.alloc(n.max(1))?, len: n }))
                {
                    Ok(b) => blocks.push((i, b)),
                    Err(e) => out[i] = Some(Err(e)),
                }
            }
            let names: Vec<String> = blocks.iter().map(|(i, _)| keys[*i].clone()).collect();
            let pieces: Vec<[Piece; 1]> = blocks.iter().map(|(_, b)| [Piece::new(b.addr, b.len)]).collect();
            let refs: Vec<&[Piece]> = pieces.iter().map(|p| &p[..]).collect();
            let rs = self.get_whole(&names, &refs)?;
            for ((i, block), r) in blocks.into_iter().zip(rs) {
                match r {
                    Ok(n) => {
                        let mut block = block;
                        block.len = n.min(block.len);
                        out[i] = Some(Ok(HeldBuffer::new(block)));
                    }
                    Err(StoreError::BufferTooSmall { .. }) => {}
                    Err(e) => out[i] = Some(Err(e)),
                }
            }
        }
        Ok(out
            .into_iter()
            .zip(keys)
            .map(|(r, key)| {
                r.unwrap_or_else(|| Err(StoreError::invalid(format!("{key:?}: its value kept changing size"))))
            })
            .collect())
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.inner.config.call_timeout
    }

    fn results<T>(
        &self,
        reply: Reply,
        n: usize,
        mut each: impl FnMut(usize, Outcome) -> Result<T>,
    ) -> Result<Vec<Result<T>>> {
        let Reply::Results(outcomes) = reply else { return Err(unexpected(&reply)) };
        super::one_per_key(outcomes.len(), n)
            .map_err(|_| StoreError::BadFrame(format!("{} results for {n} keys", outcomes.len())))?;
        Ok(outcomes
            .into_iter()
            .enumerate()
            .map(|(i, o)| match o {
                Outcome::Fail(e) => Err(e.into()),
                o => each(i, o),
            })
            .collect())
    }

    /// Whole values into pieces (in order); copies heap pieces back.
    fn get_whole(&self, keys: &[String], values: &[&[Piece]]) -> Result<Vec<Result<u64>>> {
        let placed = self.place(values, self.deadline())?;
        let request = Request::GetIntoBatch { keys: keys.to_vec(), values: placed.mems.clone() };
        let reply = self.inner.call(&request, &[], None)?;
        self.results(reply, keys.len(), |i, o| match o {
            Outcome::Size(n) => {
                placed.copy_out(i, |start, _| n.saturating_sub(start));
                Ok(n)
            }
            o => Err(unexpected_outcome(&o)),
        })
    }
}

fn unexpected(reply: &Reply) -> StoreError {
    StoreError::BadFrame(format!("a reply that does not fit the call: {reply:?}"))
}

fn unexpected_outcome(o: &Outcome) -> StoreError {
    StoreError::BadFrame(format!("a result that does not fit the call: {o:?}"))
}

/// How long a call polls for its reply, given the bound and recent calls' time (zero: none
/// yet): none when they took longer than the bound, else up to twice their time.
fn poll_bound(cap: Duration, recent: Duration) -> Duration {
    if recent > cap {
        Duration::ZERO
    } else if recent.is_zero() {
        cap
    } else {
        cap.min(recent * 2)
    }
}

fn done(reply: Reply) -> Result<()> {
    match reply {
        Reply::Done => Ok(()),
        r => Err(unexpected(&r)),
    }
}

fn size(reply: Reply) -> Result<u64> {
    match reply {
        Reply::Size(n) => Ok(n),
        r => Err(unexpected(&r)),
    }
}

fn too_large(len: u64) -> StoreError {
    StoreError::invalid(format!(
        "{len} bytes are over the standalone wire's {MAX_PAYLOAD}-byte limit for values given or returned as \
         bytes: put and get them through memory from alloc_from_mem_pool (put_from / get_into)"
    ))
}

impl Inner {
    fn unavailable(&self, source: std::io::Error) -> StoreError {
        if self.up.swap(false, Ordering::AcqRel) {
            tracing::warn!("standalone client at {} lost: {source}", self.address);
        }
        StoreError::StandaloneUnavailable { addr: self.address.to_string(), source }
    }

    /// A new connection: hello, and the regions shared again if the standalone client does
    /// not hold them (it restarted, or every earlier connection closed).
    fn open(&self, deadline: Instant) -> Result<Conn> {
        let _one = self.connecting.lock();
        let timeout = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
        let conn = Conn::connect(&self.address, timeout).map_err(|e| self.unavailable(e))?;
        let hello = Request::Hello { version: wire::VERSION, client_id: self.id.clone() };
        let reply = self.exchange(&conn, &hello, &[], None, deadline)?;
        let Reply::Hello { version, known, segment_name, replica_num } = reply.0 else {
            return Err(unexpected(&reply.0));
        };
        if version != wire::VERSION {
            return Err(StoreError::BadFrame(format!(
                "the standalone client speaks version {version} of the protocol, this client {}",
                wire::VERSION
            )));
        }
        *self.server.write() = ServerInfo { segment_name, replica_num };
        if !known {
            let regions = self.memory.regions();
            for r in &regions {
                let share = Request::Share { region: r.id, len: r.mem.len() };
                done(self.exchange(&conn, &share, &[], Some(&r.mem), deadline)?.0)?;
            }
            tracing::debug!("dummy client {}: {} region(s) shared with {}", self.id, regions.len(), self.address);
        }
        if !self.up.swap(true, Ordering::AcqRel) {
            tracing::info!("dummy client {}: standalone client at {} reachable", self.id, self.address);
        }
        Ok(conn)
    }

    /// One request and its reply on `conn`; an error of the connection itself is returned as
    /// such (the connection is then not to be reused).
    fn exchange(
        &self,
        conn: &Conn,
        request: &Request,
        payload: &[&[u8]],
        fd: Option<&crescent_transports::SharedMemory>,
        deadline: Instant,
    ) -> Result<(Reply, Vec<u8>)> {
        let message = wire::encode(request)?;
        conn.send(&message, payload, fd.map(|m| m.fd()), deadline).map_err(|e| self.io_error(e))?;
        let sent = Instant::now();
        let (frame, polled) = conn.recv_polling(Some(deadline), Duration::ZERO, self.poll()).map_err(|e| match e {
            RecvError::Io(e) => self.io_error(e),
            RecvError::Closed => self.unavailable(std::io::Error::new(
                std::io::ErrorKind::ConnectionAborted,
                "the standalone client closed the connection before answering",
            )),
            RecvError::Bad(m) => StoreError::BadFrame(m),
        })?;
        self.served(sent.elapsed(), polled);
        if frame.fd.is_some() {
            return Err(StoreError::BadFrame("a reply came with a file descriptor".into()));
        }
        let reply: Reply = wire::decode(&frame.message)?;
        match reply {
            Reply::Fail(e) => Err(e.into()),
            r => Ok((r, frame.payload)),
        }
    }

    /// How long the next call polls for its reply: up to twice the recent calls' time, while
    /// that is within [`DummyConfig::reply_poll`] (and all of it before the first call).
    fn poll(&self) -> Duration {
        poll_bound(self.config.reply_poll, Duration::from_nanos(self.service_ns.load(Ordering::Relaxed)))
    }

    /// Counts a reply, and its call's time in the moving average (a quarter per call).
    fn served(&self, took: Duration, polled: bool) {
        self.replies.count(polled);
        let took = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        // Concurrent calls may lose each other's update: an average of recent calls either way.
        let old = self.service_ns.load(Ordering::Relaxed);
        let new = if old == 0 { took } else { old - old / 4 + took / 4 };
        self.service_ns.store(new, Ordering::Relaxed);
    }

    fn io_error(&self, e: std::io::Error) -> StoreError {
        if matches!(e.kind(), std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock) {
            StoreError::TimedOut {
                waited: Waited::Standalone { addr: self.address.to_string() },
                after: self.config.call_timeout,
            }
        } else {
            self.unavailable(e)
        }
    }

    fn checkout(&self, deadline: Instant) -> Result<Conn> {
        if self.closed.load(Ordering::Acquire) {
            return Err(StoreError::invalid("the dummy client is closed"));
        }
        while let Some(conn) = self.idle.lock().pop() {
            if !conn.is_stale() {
                return Ok(conn);
            }
        }
        self.open(deadline.min(Instant::now() + self.config.connect_timeout))
    }

    /// Makes one call: a pooled (or new) connection, the request, its reply. A connection that
    /// failed is dropped (the next call opens a new one); the standalone client's own errors
    /// come back as the store's errors.
    fn call_with(
        &self,
        request: &Request,
        payload: &[&[u8]],
        fd: Option<&crescent_transports::SharedMemory>,
    ) -> Result<(Reply, Vec<u8>)> {
        let deadline = Instant::now() + self.config.call_timeout;
        let conn = self.checkout(deadline)?;
        match self.exchange(&conn, request, payload, fd, deadline) {
            Ok(r) => {
                self.idle.lock().push(conn);
                Ok(r)
            }
            // Its answer: the connection is fine.
            Err(e)
                if !matches!(
                    e,
                    StoreError::StandaloneUnavailable { .. } | StoreError::TimedOut { .. } | StoreError::BadFrame(_)
                ) =>
            {
                self.idle.lock().push(conn);
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    fn call(
        &self,
        request: &Request,
        payload: &[&[u8]],
        fd: Option<&crescent_transports::SharedMemory>,
    ) -> Result<Reply> {
        self.call_with(request, payload, fd).map(|(r, _)| r)
    }

    fn free(&self, addr: u64) -> Result<()> {
        if let Some(region) = self.memory.free(addr)? {
            match self.call(&Request::Unshare { region: region.id }, &[], None) {
                Ok(_) | Err(StoreError::StandaloneUnavailable { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn share(&self, region: &Region) -> Result<()> {
        done(self.call(&Request::Share { region: region.id, len: region.mem.len() }, &[], Some(&region.mem))?)
    }
}

/// Pings the standalone client every `ping_interval` (reconnecting, and sharing the regions
/// again, once it is back) while the client lives.
fn start_monitor(inner: Weak<Inner>) {
    let spawned = std::thread::Builder::new().name("crescent-dummy-ping".into()).spawn(move || loop {
        let Some(interval) = inner.upgrade().map(|i| i.config.ping_interval) else { return };
        std::thread::sleep(interval);
        let Some(i) = inner.upgrade() else { return };
        if i.closed.load(Ordering::Acquire) {
            return;
        }
        if let Err(e) = i.call(&Request::Ping, &[], None) {
            tracing::debug!("dummy client {}: ping: {e}", i.id);
        }
    });
    if let Err(e) = spawned {
        tracing::warn!("dummy client: no monitor thread ({e}); reconnecting on calls only");
    }
}

/// Memory from [`DummyClient::alloc`] holding a value for `get_buffer`'s caller; freed on drop.
struct PoolBlock {
    inner: Arc<Inner>,
    addr: u64,
    len: u64,
}

impl Held for PoolBlock {
    fn addr(&self) -> u64 {
        self.addr
    }
    fn len(&self) -> u64 {
        self.len
    }
}

impl Drop for PoolBlock {
    fn drop(&mut self) {
        if let Err(e) = self.inner.free(self.addr) {
            tracing::debug!("dummy client {}: freeing a get_buffer block: {e}", self.inner.id);
        }
    }
}

impl StoreApi for DummyClient {
    fn segment_name(&self) -> String {
        self.inner.server.read().segment_name.clone()
    }

    fn default_options(&self) -> PutOptions {
        let s = self.inner.server.read();
        PutOptions {
            replica_num: s.replica_num.max(1),
            preferred_segment: s.segment_name.clone(),
            ..Default::default()
        }
    }

    fn register_buffer(&self, addr: u64, len: u64) -> Result<()> {
        // Its calls copy registered memory through the local buffer with the CPU: a GPU's
        // memory is refused here (told apart by the driver, where one loads).
        if let Some(device) = device_of_pointer(addr) {
            return Err(StoreError::invalid(format!(
                "register_buffer({addr:#x}, {len}): memory of cuda:{device}; a dummy client (setup_dummy) moves host \
                 memory only: register device memory with a client set up with setup()"
            )));
        }
        self.inner.memory.register(addr, len)
    }

    fn alloc_from_mem_pool(&self, len: u64) -> Result<u64> {
        self.alloc(len)
    }

    fn unregister_buffer(&self, addr: u64) -> Result<()> {
        self.inner.memory.unregister(addr)
    }

    fn is_registered(&self, addr: u64, len: u64) -> bool {
        self.inner.memory.locate(addr, len).is_ok()
    }

    fn put_with(&self, key: &str, value: &[u8], options: &PutOptions) -> Result<()> {
        self.put_bytes(key, &[value], options, false)
    }

    fn put_from_sg(&self, key: &str, pieces: &[Piece], options: &PutOptions) -> Result<()> {
        self.put_pieces(key, pieces, options, false)
    }

    fn upsert_with(&self, key: &str, value: &[u8], options: &PutOptions) -> Result<()> {
        self.put_bytes(key, &[value], options, true)
    }

    fn upsert_from_sg(&self, key: &str, pieces: &[Piece], options: &PutOptions) -> Result<()> {
        self.put_pieces(key, pieces, options, true)
    }

    /// The parts travel one after another as the frame's payload: no copy here.
    fn put_parts_with(&self, key: &str, parts: &[&[u8]], options: &PutOptions) -> Result<()> {
        self.put_bytes(key, parts, options, false)
    }

    fn upsert_parts_with(&self, key: &str, parts: &[&[u8]], options: &PutOptions) -> Result<()> {
        self.put_bytes(key, parts, options, true)
    }

    /// Read into memory of this client's own (its pool, or a region of its own when the pool
    /// is full), shared with the standalone client: the engine writes the value there, and
    /// it is freed when the result is dropped.
    fn get_buffer(&self, key: &str) -> Result<HeldBuffer> {
        self.get_buffers(std::slice::from_ref(&key.to_string()))?.pop().expect("one result per key")
    }

    fn batch_get_buffer(&self, keys: &[String]) -> Result<Vec<Result<HeldBuffer>>> {
        self.get_buffers(keys)
    }

    fn get(&self, key: &str) -> Result<Vec<u8>> {
        match self.inner.call_with(&Request::Get { key: key.to_string() }, &[], None)? {
            (Reply::Bytes, payload) => Ok(payload),
            (r, _) => Err(unexpected(&r)),
        }
    }

    fn get_into_sg(&self, key: &str, pieces: &[Piece]) -> Result<u64> {
        let placed = self.place(&[pieces], self.deadline())?;
        let request = Request::GetInto { key: key.to_string(), pieces: placed.mems[0].clone() };
        let n = size(self.inner.call(&request, &[], None)?)?;
        placed.copy_out(0, |start, _| n.saturating_sub(start));
        Ok(n)
    }

    fn get_into_ranges(&self, key: &str, ranges: &[Extent]) -> Result<u64> {
        let pieces: Vec<Piece> = ranges.iter().map(|e| Piece::new(e.addr, e.len)).collect();
        let placed = self.place(&[&pieces], self.deadline())?;
        let spans = ranges.iter().zip(&placed.mems[0]).map(|(e, m)| Span { offset: e.offset, dst: *m }).collect();
        let n = size(self.inner.call(&Request::GetRanges { key: key.to_string(), ranges: spans }, &[], None)?)?;
        placed.copy_out(0, |_, p| p.len);
        Ok(n)
    }

    fn put_batch_with(&self, keys: &[String], values: &[&[u8]], options: &PutOptions) -> Result<Vec<Result<()>>> {
        self.put_many(keys, values, options, false)
    }

    fn upsert_batch_with(&self, keys: &[String], values: &[&[u8]], options: &PutOptions) -> Result<Vec<Result<()>>> {
        self.put_many(keys, values, options, true)
    }

    fn batch_put_from_sg(&self, keys: &[String], values: &[&[Piece]], options: &PutOptions) -> Result<Vec<Result<()>>> {
        self.put_many_from(keys, values, options, false)
    }

    fn batch_upsert_from_sg(
        &self,
        keys: &[String],
        values: &[&[Piece]],
        options: &PutOptions,
    ) -> Result<Vec<Result<()>>> {
        self.put_many_from(keys, values, options, true)
    }

    fn get_batch(&self, keys: &[String]) -> Result<Vec<Result<Vec<u8>>>> {
        let (reply, payload) = self.inner.call_with(&Request::GetBatch { keys: keys.to_vec() }, &[], None)?;
        let mut at = 0usize;
        self.results(reply, keys.len(), |_, o| match o {
            Outcome::Bytes(n) => {
                let end = at.checked_add(n as usize).filter(|e| *e <= payload.len());
                let end = end.ok_or_else(|| StoreError::BadFrame("values past the payload".into()))?;
                let v = payload[at..end].to_vec();
                at = end;
                Ok(v)
            }
            o => Err(unexpected_outcome(&o)),
        })
    }

    fn batch_get_into_sg(&self, keys: &[String], values: &[&[Piece]]) -> Result<Vec<Result<u64>>> {
        check_per_key(keys.len(), values.len(), "buffer lists")?;
        self.get_whole(keys, values)
    }

    fn batch_get_into_ranges(&self, keys: &[String], ranges: &[&[Extent]]) -> Result<Vec<Result<u64>>> {
        check_per_key(keys.len(), ranges.len(), "range lists")?;
        let pieces: Vec<Vec<Piece>> =
            ranges.iter().map(|r| r.iter().map(|e| Piece::new(e.addr, e.len)).collect()).collect();
        let refs: Vec<&[Piece]> = pieces.iter().map(|p| &p[..]).collect();
        let placed = self.place(&refs, self.deadline())?;
        let spans: Vec<Vec<Span>> = ranges
            .iter()
            .zip(&placed.mems)
            .map(|(r, mems)| r.iter().zip(mems).map(|(e, m)| Span { offset: e.offset, dst: *m }).collect())
            .collect();
        let reply = self.inner.call(&Request::GetRangesBatch { keys: keys.to_vec(), ranges: spans }, &[], None)?;
        self.results(reply, keys.len(), |i, o| match o {
            Outcome::Size(n) => {
                placed.copy_out(i, |_, p| p.len);
                Ok(n)
            }
            o => Err(unexpected_outcome(&o)),
        })
    }

    fn exists(&self, key: &str) -> Result<bool> {
        match self.inner.call(&Request::Exists { key: key.to_string() }, &[], None)? {
            Reply::Bool(b) => Ok(b),
            r => Err(unexpected(&r)),
        }
    }

    fn batch_exists(&self, keys: &[String]) -> Result<Vec<bool>> {
        match self.inner.call(&Request::BatchExists { keys: keys.to_vec() }, &[], None)? {
            Reply::Bools(b) if b.len() == keys.len() => Ok(b),
            r => Err(unexpected(&r)),
        }
    }

    fn query(&self, key: &str) -> Result<QueryKeyReply> {
        match self.inner.call(&Request::Query { key: key.to_string() }, &[], None)? {
            Reply::Query(bytes) => QueryKeyReply::decode(&bytes[..])
                .map_err(|e| StoreError::BadFrame(format!("a query reply does not decode: {e}"))),
            r => Err(unexpected(&r)),
        }
    }

    fn get_size(&self, key: &str) -> Result<u64> {
        size(self.inner.call(&Request::GetSize { key: key.to_string() }, &[], None)?)
    }

    fn remove_with(&self, key: &str, force: bool) -> Result<()> {
        done(self.inner.call(&Request::Remove { key: key.to_string(), force }, &[], None)?)
    }

    fn remove_by_regex_with(&self, pattern: &str, force: bool) -> Result<u64> {
        size(self.inner.call(&Request::RemoveByRegex { pattern: pattern.to_string(), force }, &[], None)?)
    }

    fn remove_all_with(&self, force: bool) -> Result<u64> {
        size(self.inner.call(&Request::RemoveAll { force }, &[], None)?)
    }

    /// The standalone client's master, as the standalone client last saw it; false when the
    /// standalone client cannot be reached.
    fn master_reachable(&self) -> bool {
        matches!(self.inner.call(&Request::Health, &[], None), Ok(Reply::Bool(true)))
    }

    /// Closes every connection: the standalone client releases what this client shared.
    fn close(&self) -> Result<()> {
        if !self.inner.closed.swap(true, Ordering::AcqRel) {
            for conn in self.inner.idle.lock().drain(..) {
                conn.shutdown();
            }
            tracing::info!("dummy client {} detached from {}", self.inner.id, self.inner.address);
        }
        Ok(())
    }
}

impl Drop for DummyClient {
    fn drop(&mut self) {
        let _ = StoreApi::close(self);
    }
}

/// The GPU whose memory `addr` is, when the CUDA driver loads and says so (none without one:
/// then nothing in this process can be device memory the driver would know).
/// A driver that does not load is tried again at the next registration (it is rare).
fn device_of_pointer(addr: u64) -> Option<u32> {
    static DRIVER: std::sync::OnceLock<Arc<Driver>> = std::sync::OnceLock::new();
    let driver = match DRIVER.get() {
        Some(driver) => driver,
        None => {
            let loaded = Devices::default().driver().ok()?;
            DRIVER.get_or_init(|| loaded)
        }
    };
    driver.api().allocation(addr).ok().flatten().map(|a| a.device)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_polls_for_twice_its_predecessors_time_within_the_bound_and_not_after_long_calls() {
        let us = Duration::from_micros;
        assert_eq!(poll_bound(us(500), Duration::ZERO), us(500), "nothing known yet: the bound");
        assert_eq!(poll_bound(us(500), us(100)), us(200));
        assert_eq!(poll_bound(us(500), us(400)), us(500));
        assert_eq!(poll_bound(us(500), us(501)), Duration::ZERO, "longer calls block at once");
        assert_eq!(poll_bound(Duration::ZERO, us(10)), Duration::ZERO, "zero: never");
    }
}
