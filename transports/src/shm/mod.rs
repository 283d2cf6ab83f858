//! The shm transport: same-host transfers with one copy and no network stack.
//!
//! A target listens on a unix `SOCK_SEQPACKET` socket in the abstract namespace (so, like a
//! tcp port, only processes of its network namespace reach it). An initiator connects once
//! per peer, learns the peer's pid from the kernel (`SO_PEERCRED`) and, region by region,
//! asks for *grants*:
//! * memory the engine allocated (`alloc_registered`: a memfd sealed against resizing) comes
//!   with its memfd over `SCM_RIGHTS`; the initiator maps it once and a transfer is one
//!   memcpy between its own registered memory and that mapping;
//! * device memory comes with its allocation's CUDA IPC handle; the initiator opens it once
//!   per allocation and copies with the device driver, device to device or to and from its
//!   own host memory (see [`crate::device`]); local device memory is likewise copied by the
//!   driver, through a pinned bounce buffer where the peer's memory is reached by process_vm;
//! * any other registered memory (heap, a Python buffer) is copied with one
//!   `process_vm_readv`/`process_vm_writev` by the initiator. At connection time the
//!   initiator reads a probe word of the target that way; when the kernel refuses (another
//!   user, a non-dumpable target, Yama ptrace scope), [`ShmTransport::connect`] says why and
//!   the engine uses another transport for that peer.
//!
//! The initiator copies; bounds are the target's: a grant is the exact extent of one region
//! the target has registered, and a copy is done only inside a grant the initiator holds.
//!
//! # Lifetime of granted memory
//!
//! The memory behind a grant belongs to the target, which may unregister or free it at any
//! time; after that, no copy of any peer may touch it. The rule that guarantees it:
//!
//! **A grant is used only while it is live, and the target's unregister returns only after
//! every initiator holding the grant has acknowledged its revocation.**
//!
//! * Initiator: every copy holds its grant's lock *shared* for the whole copy and checks that
//!   the grant is live (a copier keeps the lock across one run of at most `peer::RUN` copies
//!   inside the grant and yields it between runs to a revoke that waits for it). A `Revoke {region}` from the target is handled by the initiator's
//!   reader thread: it takes the lock *exclusively* (so it waits for copies in progress),
//!   marks the grant dead, drops it (unmapping the memfd) and only then sends `RevokeAck`.
//!   A later copy to that range finds no grant and asks again; the target, which no longer
//!   has the region, refuses, and the slice fails with an out-of-range error.
//! * Target: `unregister` first removes the region from the [`RegionTable`] (no new grant
//!   can be issued: a grant is looked up and sent under the connection's send lock, and the
//!   revoke goes out under the same lock, so a grant is either sent before the revoke or
//!   refused), then sends `Revoke` to each connection that holds the grant and waits for
//!   the acks. A connection that dies counts as acknowledged: the peer process is gone, or
//!   its reader thread revokes everything it holds as soon as it sees the connection close.
//!   If a live peer does not acknowledge within the unregister wait (it is stopped, say),
//!   the target disconnects it and the unregister reports the region busy.
//! * A re-registered region gets a new grant id; grants are keyed by id, so a stale
//!   revoke or grant never applies to the new registration. A peer that re-registers after
//!   a restart is a new connection with new grants: nothing from the old one survives.
//! * A dead target: the kernel closes its sockets before its pid can be reaped and reused;
//!   the initiator's reader thread sees the close, marks the peer dead and revokes every
//!   grant (waiting for copies in progress). Later copies fail without touching the old
//!   mappings (memfd pages stay alive while mapped, so even a copy racing with the death
//!   touches only orphaned pages), and process_vm is never called with the pid of a peer
//!   known dead. Between that check and the call, the pid could only name another process
//!   after the whole pid space was cycled through.
//! * Local memory: every copy runs inside the slice's [`crate::LocalAccess`] claim, so a
//!   slice that ended (timed out) never has its memory touched after its end.

mod copy;
mod mapping;
mod peer;
mod server;
pub mod socket;
pub mod wire;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use parking_lot::Mutex;

use crate::{
    Endpoint, FailureReason, Region, RegionKeys, RegionTable, Slice, SliceOutcome, Transport, TransportError,
    TransportKind,
};
use peer::{CopyError, Peer};
use server::Server;
use socket::Socket;

/// A same-host peer's sealed memfd mapped here, for other users of memfd passing (the store's
/// standalone client maps its dummy clients' buffers with it).
pub use mapping::Mapping;

/// How long an unregister waits for same-host peers to release the region.
pub const UNREGISTER_WAIT: Duration = Duration::from_secs(5);

/// Settings of the shm transport.
#[derive(Debug, Clone)]
pub struct ShmConfig {
    /// Abstract unix socket name to listen on (unique in the network namespace).
    pub socket_name: String,
    /// Threads that copy slices; a batch's slices are spread over them.
    pub copy_threads: usize,
    /// Largest slice; larger requests are cut by the engine.
    pub max_slice_len: u64,
    /// The cluster secret both ends of a connection prove they know (none: open; the
    /// kernel's peer credentials only bound connections per process).
    pub auth: crate::net::Auth,
}

impl Default for ShmConfig {
    fn default() -> Self {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        ShmConfig {
            socket_name: format!("crescent-shm-{}-{n}", std::process::id()),
            copy_threads: std::thread::available_parallelism().map_or(2, |n| n.get()).min(4),
            max_slice_len: 4 << 20,
            auth: crate::net::Auth::open(),
        }
    }
}

#[derive(Default)]
struct PeerSlot {
    peer: Mutex<Option<Arc<Peer>>>,
}

/// What a copy thread is handed.
enum Job {
    /// One slice: a large one, or a small one whose grant the submitting thread did not have
    /// at hand.
    One(Arc<Peer>, Slice),
    /// The small slices of one submit, which the submitting thread copies too.
    Share(Arc<Share>),
}

/// The small slices of one submit, shared by the submitting thread and the copy threads it
/// woke: each copier takes the next slice nobody took yet, so a copy thread that is slow to
/// start (on a busy machine, or a vCPU slow to wake) holds back no slice, and a submit costs
/// one hand-off per copy thread woken instead of one per slice.
struct Share {
    peer: Arc<Peer>,
    slices: Box<[Mutex<Option<Slice>>]>,
    next: AtomicUsize,
}

impl Share {
    /// The next slice nobody took yet.
    fn take(&self) -> Option<Slice> {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        self.slices.get(i)?.lock().take()
    }
}

/// The shm transport of one engine: the listener that grants same-host peers access to the
/// engine's registered regions, one control connection per peer it reaches, and the threads
/// that copy its slices (the submitting thread copies its share of the small ones itself, see
/// [`INLINE_SLICE_MAX`]). Dropping it stops the listener and closes its connections; the copy
/// threads finish the slices already queued, then end.
pub struct ShmTransport {
    config: ShmConfig,
    /// This process's registered memory (its peers' copies look up which local ranges are on
    /// a device).
    table: Arc<RegionTable>,
    server: Arc<Server>,
    /// The accept loop; dropping it closes the socket and every served connection.
    listener: Option<crate::net::Server>,
    peers: Mutex<HashMap<Endpoint, Arc<PeerSlot>>>,
    jobs: Option<Sender<Job>>,
    workers: Vec<JoinHandle<()>>,
    /// Copy threads not copying now (waiting for a job).
    idle: Arc<AtomicUsize>,
    /// Submitting threads copying their share of small slices now.
    inline: AtomicUsize,
    /// CPUs this process may run on: more copiers than that only take turns on them.
    cpus: usize,
    /// Copy threads woken to help with a submit's small slices, so far.
    helpers_woken: AtomicUsize,
}

impl ShmTransport {
    /// Starts listening; the listener grants peers access to `table`'s regions.
    pub fn start(config: ShmConfig, table: Arc<RegionTable>) -> Result<Self, TransportError> {
        if !(1..=256).contains(&config.copy_threads) || config.max_slice_len == 0 {
            return Err(TransportError::InvalidArgument(format!(
                "shm copy threads must be in 1..=256 and the slice length positive (got {} \
                 threads, {} bytes)",
                config.copy_threads, config.max_slice_len
            )));
        }
        let listener = Socket::listen(&config.socket_name).map_err(|source| TransportError::Listen {
            addr: format!("unix socket @{}", config.socket_name),
            source,
        })?;
        let server = Server::new(table.clone());
        let unavailable = |e: std::io::Error| TransportError::Unavailable("shm", format!("no thread: {e}"));
        let limits = crate::net::Limits {
            max_connections: server::MAX_CONNECTIONS,
            max_per_peer: server::MAX_CONNECTIONS_PER_PROCESS,
            idle: None,
        };
        let serving = server.clone();
        let listener =
            crate::net::serve("shm-serve", listener, limits, config.auth.guard(crate::net::Service::Shm), move |c| {
                serving.serve_connection(c)
            })
            .map_err(unavailable)?;
        let (tx, rx) = crossbeam_channel::unbounded::<Job>();
        let idle = Arc::new(AtomicUsize::new(config.copy_threads));
        let workers = (0..config.copy_threads)
            .map(|_| {
                let (rx, idle) = (rx.clone(), idle.clone());
                std::thread::Builder::new().name("crescent-shm-copy".into()).spawn(move || copy_loop(rx, &idle))
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(unavailable)?;
        tracing::debug!("shm transport listening on @{}, {} copy threads", config.socket_name, config.copy_threads);
        Ok(ShmTransport {
            config,
            table,
            server,
            listener: Some(listener),
            peers: Mutex::new(HashMap::new()),
            jobs: Some(tx),
            workers,
            idle,
            inline: AtomicUsize::new(0),
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            helpers_woken: AtomicUsize::new(0),
        })
    }

    /// The connection to `peer`, made now if there is none or the last one died.
    fn peer(&self, endpoint: &Endpoint) -> Result<Arc<Peer>, String> {
        let Endpoint::Shm { socket } = endpoint else {
            return Err(format!("{endpoint} is not an shm endpoint"));
        };
        let slot = self.peers.lock().entry(endpoint.clone()).or_default().clone();
        let mut current = slot.peer.lock();
        if let Some(peer) = current.as_ref() {
            if !peer.is_dead() {
                return Ok(peer.clone());
            }
        }
        *current = None;
        let peer = Peer::connect(socket, &self.config.auth, self.table.clone())?;
        *current = Some(peer.clone());
        Ok(peer)
    }
}

/// Slices at most this long may be copied on the thread that submits them, when it can take
/// their grant at once: handing a small slice to a copy thread costs two wake-ups (the
/// worker's, then the waiter's), and on a busy machine each waits for a CPU. A submit's small
/// slices are shared (`Share`): the submitting thread and the idle copy threads it wakes
/// (none for a single slice, nor while the threads copying already number the CPUs) each
/// take the next slice until none is left, so a large batch of small slices still spreads
/// over the cores, and a copy thread that starts late takes fewer.
pub const INLINE_SLICE_MAX: u64 = 256 << 10;
/// Bytes one `submit` copies on the submitting thread at most; the rest goes to the copy
/// threads.
pub const INLINE_SUBMIT_MAX: u64 = 16 << 20;

/// Counts a submitting thread as copying until dropped.
struct Copying<'a>(&'a AtomicUsize);

impl<'a> Copying<'a> {
    fn enter(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Copying(count)
    }
}

impl Drop for Copying<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

fn copy_loop(rx: Receiver<Job>, idle: &AtomicUsize) {
    for job in rx {
        idle.fetch_sub(1, Ordering::Relaxed);
        match job {
            Job::One(peer, slice) => {
                let mut slice = Some(slice);
                peer.copy_run(true, &mut || slice.take(), &mut |s, result| finish(&peer, s, result));
            }
            Job::Share(share) => {
                let peer = &share.peer;
                peer.copy_run(true, &mut || share.take(), &mut |s, result| finish(peer, s, result));
            }
        }
        idle.fetch_add(1, Ordering::Relaxed);
    }
}

/// Ends a slice with the outcome of its copy.
fn finish(peer: &Peer, slice: Slice, result: Result<(), CopyError>) {
    let Slice { remote_addr, len, completion, .. } = slice;
    match result {
        Ok(()) => completion.complete(SliceOutcome::Completed),
        Err(CopyError::OutOfRange) | Err(CopyError::Revoked) => completion.fail(FailureReason::out_of_range(format!(
            "target {} rejected the access: [{remote_addr:#x}, +{len}) is outside its registered memory",
            peer.name()
        ))),
        Err(CopyError::Failed(reason)) => completion.fail(reason),
    }
}

impl Transport for ShmTransport {
    fn kind(&self) -> TransportKind {
        TransportKind::Shm
    }

    fn endpoint(&self) -> Endpoint {
        Endpoint::Shm { socket: self.config.socket_name.clone() }
    }

    fn max_slice_len(&self) -> u64 {
        self.config.max_slice_len
    }

    fn register_region(&self, region: &Arc<Region>) -> Result<RegionKeys, TransportError> {
        self.server.export(region);
        Ok(RegionKeys::default())
    }

    fn unregister_region(&self, region: &Arc<Region>) -> Result<(), TransportError> {
        self.server.revoke(region, UNREGISTER_WAIT)
    }

    /// Connects and checks that the kernel lets this process copy the peer's memory with
    /// process_vm_readv/writev; the error says why not.
    fn connect(&self, endpoint: &Endpoint) -> Result<(), TransportError> {
        let peer = self.peer(endpoint).map_err(|e| TransportError::Unavailable("shm", e))?;
        match peer.process_vm_denied() {
            None => Ok(()),
            Some(why) => Err(TransportError::Unavailable("shm", format!("{}: {why}", peer.name()))),
        }
    }

    fn submit(&self, endpoint: &Endpoint, slices: Vec<Slice>) {
        let Some(jobs) = &self.jobs else {
            return; // dropping the slices fails them
        };
        match self.peer(endpoint) {
            Ok(peer) => {
                let queue = |job: Job| {
                    if let Err(e) = jobs.send(job) {
                        match e.0 {
                            Job::One(_, slice) => {
                                slice.completion.fail(FailureReason::local("the shm transport is shutting down"))
                            }
                            Job::Share(_) => {} // this thread takes what nobody else does
                        }
                        return false;
                    }
                    true
                };
                // Large slices go to the copy threads first, so that they start while this
                // thread copies the small ones.
                let (small, large): (Vec<Slice>, Vec<Slice>) =
                    slices.into_iter().partition(|slice| slice.len <= INLINE_SLICE_MAX);
                for slice in large {
                    queue(Job::One(peer.clone(), slice));
                }
                if small.is_empty() {
                    return;
                }
                let bytes: u64 = small.iter().map(|slice| slice.len).sum();
                let share = Arc::new(Share {
                    peer: peer.clone(),
                    slices: small.into_iter().map(|slice| Mutex::new(Some(slice))).collect(),
                    next: AtomicUsize::new(0),
                });
                // Idle copy threads help (one slice alone is not worth a wake-up) while CPUs
                // are left over by the threads copying now, this one included: with as many
                // submitting threads as CPUs, each copies its own slices, as a plain memcpy
                // per thread would, and no hand-off or copier taking turns on a CPU costs
                // anything. One helps at least when this thread's budget does not cover the
                // submit.
                let _copying = Copying::enter(&self.inline);
                let n = share.slices.len();
                let idle = self.idle.load(Ordering::Relaxed).min(self.config.copy_threads);
                let copying = self.inline.load(Ordering::Relaxed) + (self.config.copy_threads - idle);
                let mut helpers = idle.min(n - 1).min(self.cpus.saturating_sub(copying));
                if bytes > INLINE_SUBMIT_MAX {
                    helpers = helpers.max(1);
                }
                let mut budget = INLINE_SUBMIT_MAX;
                for _ in 0..helpers {
                    if !queue(Job::Share(share.clone())) {
                        budget = u64::MAX; // no copy thread left to take the rest
                        break;
                    }
                    self.helpers_woken.fetch_add(1, Ordering::Relaxed);
                }
                let mut next = || {
                    if budget == 0 {
                        return None; // the copy threads take the rest
                    }
                    let slice = share.take()?;
                    budget = budget.saturating_sub(slice.len);
                    Some(slice)
                };
                // Without a grant at hand (the first access to a region, a revoke in
                // progress), a copy thread asks the peer for it.
                while let Some(slice) = peer.copy_run(false, &mut next, &mut |s, result| finish(&peer, s, result)) {
                    queue(Job::One(peer.clone(), slice));
                }
            }
            Err(reason) => {
                for slice in slices {
                    slice.completion.fail(FailureReason::peer_gone(reason.clone()));
                }
            }
        }
    }

    fn forget_peer(&self, endpoint: &Endpoint) {
        if let Some(slot) = self.peers.lock().remove(endpoint) {
            if let Some(peer) = slot.peer.lock().take() {
                peer.close();
            }
        }
    }
}

impl Drop for ShmTransport {
    fn drop(&mut self) {
        // Stops accepting and ends every served connection.
        drop(self.listener.take());
        for slot in self.peers.lock().drain().map(|(_, s)| s) {
            if let Some(peer) = slot.peer.lock().take() {
                peer.close();
            }
        }
        // Workers finish the slices already queued, then end.
        self.jobs = None;
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::wire::{Frame, Kind, Mode};
    use super::*;

    /// A target transport serving one 1 MiB heap region, and a raw client that holds a grant
    /// of it.
    fn target_with_a_granted_client() -> (ShmTransport, Arc<Region>, Vec<u8>, Socket) {
        let mut memory = vec![0u8; 1 << 20];
        let table = Arc::new(RegionTable::new());
        let region = table.insert(Region::new(memory.as_mut_ptr() as u64, 1 << 20, "cpu:0", None)).unwrap();
        let transport = ShmTransport::start(ShmConfig::default(), table).unwrap();
        transport.register_region(&region).unwrap();
        let client = Socket::connect(&transport.config.socket_name, Duration::from_secs(5)).unwrap();
        client.set_recv_timeout(Some(Duration::from_secs(5))).unwrap();
        let map = Frame { id: 1, addr: region.addr() + 100, len: 10, ..Frame::new(Kind::Map) };
        client.send(&map, None).unwrap();
        let (grant, _) = client.recv().unwrap().unwrap();
        assert_eq!((grant.kind, grant.mode), (Kind::MapReply, Mode::ProcessVm));
        (transport, region, memory, client)
    }

    /// A transport with `copy_threads` copy threads that copies between two 4 MiB buffers of
    /// this process through its endpoint to itself: `remote` (bytes `i % 251`), registered,
    /// and `local` (bytes `i % 241`). `bases` are their addresses (local, remote) and
    /// `buffers` the buffers themselves, to drop after the transport.
    struct ToItself {
        transport: ShmTransport,
        endpoint: Endpoint,
        bases: (u64, u64),
        buffers: (Vec<u8>, Vec<u8>),
        _region: Arc<Region>,
    }

    impl ToItself {
        fn start(copy_threads: usize) -> ToItself {
            const LEN: usize = 4 << 20;
            let mut remote: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8).collect();
            let table = Arc::new(RegionTable::new());
            let region = table.insert(Region::new(remote.as_mut_ptr() as u64, LEN as u64, "cpu:0", None)).unwrap();
            let transport = ShmTransport::start(ShmConfig { copy_threads, ..ShmConfig::default() }, table).unwrap();
            transport.register_region(&region).unwrap();
            let endpoint = transport.endpoint();
            let mut local: Vec<u8> = (0..LEN).map(|i| (i % 241) as u8).collect();
            let bases = (local.as_mut_ptr() as u64, remote.as_mut_ptr() as u64);
            ToItself { transport, endpoint, bases, buffers: (local, remote), _region: region }
        }
    }

    /// Records each slice's outcome; with a gate, the first claim of the slice's local memory
    /// says so on `entered` and waits for `release` (a copy thread kept busy).
    #[derive(Default)]
    struct Sink {
        outcomes: parking_lot::Mutex<Vec<(usize, SliceOutcome)>>,
        gate: Option<(Sender<()>, Receiver<()>)>,
        /// Claims begun (true) and ended (false), by slice, in order.
        claims: parking_lot::Mutex<Vec<(bool, usize)>>,
        /// The thread that claimed each slice, in order.
        copiers: parking_lot::Mutex<Vec<std::thread::ThreadId>>,
    }
    impl crate::CompletionSink for Sink {
        fn begin_local_access(&self, slice: usize) -> bool {
            if let Some((entered, release)) = &self.gate {
                let _ = entered.send(());
                let _ = release.recv();
            }
            self.claims.lock().push((true, slice));
            self.copiers.lock().push(std::thread::current().id());
            true
        }
        fn end_local_access(&self, slice: usize) {
            self.claims.lock().push((false, slice));
        }
        fn complete(&self, slice: usize, outcome: SliceOutcome) {
            self.outcomes.lock().push((slice, outcome));
        }
    }

    /// Slice `n` of `sink`: `len` bytes at offset `at` of the local and the remote buffer.
    fn slice(opcode: crate::Opcode, bases: (u64, u64), at: usize, len: usize, sink: &Arc<Sink>, n: usize) -> Slice {
        Slice {
            opcode,
            local_addr: bases.0 + at as u64,
            remote_addr: bases.1 + at as u64,
            len: len as u64,
            completion: crate::Completion::new(sink.clone(), n),
        }
    }

    #[test]
    fn small_slices_are_copied_by_the_submitting_thread_while_the_copy_threads_are_busy() {
        use crate::Opcode::{Read, Write};
        let ToItself { transport, endpoint, bases, buffers, _region } = ToItself::start(1);

        // The first slice finds no grant at hand: a copy thread asks the peer for it.
        let first = Arc::new(Sink::default());
        transport.submit(&endpoint, vec![slice(Read, bases, 0, 4096, &first, 0)]);
        let waited = std::time::Instant::now();
        while first.outcomes.lock().is_empty() {
            assert!(waited.elapsed() < Duration::from_secs(60), "the first slice never ended");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(*first.outcomes.lock(), vec![(0, SliceOutcome::Completed)]);

        // The only copy thread takes a large slice and stays inside its copy until released.
        let (entered_tx, entered) = crossbeam_channel::bounded(1);
        let (release, release_rx) = crossbeam_channel::bounded(1);
        let blocked = Arc::new(Sink { gate: Some((entered_tx, release_rx)), ..Sink::default() });
        let big = (INLINE_SLICE_MAX * 2) as usize;
        transport.submit(&endpoint, vec![slice(Read, bases, 0, big, &blocked, 0)]);
        entered.recv().unwrap();

        // Small reads and writes meanwhile: all ended, with their bytes, when submit returns.
        let small = Arc::new(Sink::default());
        let block = 64 << 10;
        let slices = (0..8)
            .map(|n| {
                let at = big + n * block;
                slice(if n % 2 == 0 { Read } else { Write }, bases, at, block, &small, n)
            })
            .collect();
        transport.submit(&endpoint, slices);
        let mut outcomes = std::mem::take(&mut *small.outcomes.lock());
        outcomes.sort_by_key(|(n, _)| *n);
        assert_eq!(outcomes, (0..8).map(|n| (n, SliceOutcome::Completed)).collect::<Vec<_>>());
        // In runs of four (`peer::RUN`): a run's slices are all claimed before its copies, and
        // the claims end after them (no claim's end waits for the stores of one copy alone).
        let (begin, end) = (|n| (true, n), |n| (false, n));
        let runs = [0..4, 4..8].map(|run| run.clone().map(begin).chain(run.map(end)).collect::<Vec<_>>()).concat();
        assert_eq!(*small.claims.lock(), runs);
        for n in 0..8 {
            let at = big + n * block;
            // SAFETY: no copy of these ranges is in flight (their slices ended above).
            let (l, r) = unsafe {
                (
                    std::slice::from_raw_parts((bases.0 as *const u8).add(at), block),
                    std::slice::from_raw_parts((bases.1 as *const u8).add(at), block),
                )
            };
            assert!(l == r, "slice {n}: the bytes differ");
            let pattern = if n % 2 == 0 { 251 } else { 241 };
            assert!(r.iter().enumerate().all(|(i, &b)| b == ((at + i) % pattern) as u8), "slice {n}: wrong source");
        }

        release.send(()).unwrap();
        drop(transport); // the copy thread finishes the large slice first
        assert_eq!(*blocked.outcomes.lock(), vec![(0, SliceOutcome::Completed)]);
        drop(buffers);
    }

    #[test]
    fn a_run_of_small_slices_in_one_grant_looks_the_grant_up_once_per_copier() {
        use crate::Opcode::{Read, Write};
        let ToItself { transport, endpoint, bases, buffers, _region } = ToItself::start(2);
        let wait_for = |sink: &Sink, n: usize| {
            let waited = std::time::Instant::now();
            while sink.outcomes.lock().len() < n {
                assert!(waited.elapsed() < Duration::from_secs(60), "the slices never ended");
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        // The first slice gets the grant.
        let first = Arc::new(Sink::default());
        transport.submit(&endpoint, vec![slice(Read, bases, 0, 4096, &first, 0)]);
        wait_for(&first, 1);
        let peer = transport.peer(&endpoint).unwrap();
        let before = peer.lookups();

        const SLICES: usize = 48;
        let block = 64 << 10;
        let sink = Arc::new(Sink::default());
        let slices = (0..SLICES)
            .map(|n| slice(if n % 2 == 0 { Read } else { Write }, bases, n * block, block, &sink, n))
            .collect();
        transport.submit(&endpoint, slices);
        wait_for(&sink, SLICES);
        let mut outcomes = std::mem::take(&mut *sink.outcomes.lock());
        outcomes.sort_by_key(|(n, _)| *n);
        assert_eq!(outcomes, (0..SLICES).map(|n| (n, SliceOutcome::Completed)).collect::<Vec<_>>());
        for n in 0..SLICES {
            let at = n * block;
            // SAFETY: no copy of these ranges is in flight (their slices ended above).
            let (l, r) = unsafe {
                (
                    std::slice::from_raw_parts((bases.0 as *const u8).add(at), block),
                    std::slice::from_raw_parts((bases.1 as *const u8).add(at), block),
                )
            };
            assert!(l == r, "slice {n}: the bytes differ");
        }
        // The submitting thread and at most both copy threads: one lookup each.
        let lookups = peer.lookups() - before;
        assert!((1..=3).contains(&lookups), "{lookups} grant lookups for {SLICES} slices in one grant");
        drop(transport);
        drop(buffers);
    }

    #[test]
    fn copy_threads_help_with_small_slices_only_while_cpus_are_left_over() {
        use crate::Opcode::{Read, Write};
        let ToItself { mut transport, endpoint, bases, buffers, _region } = ToItself::start(2);
        let settle = |transport: &ShmTransport, sink: &Sink, n: usize| {
            let waited = std::time::Instant::now();
            while sink.outcomes.lock().len() < n || transport.idle.load(Ordering::Relaxed) < 2 {
                assert!(waited.elapsed() < Duration::from_secs(60), "the slices never ended");
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        // The first slice gets the grant (a copy thread asks the peer).
        let first = Arc::new(Sink::default());
        transport.submit(&endpoint, vec![slice(Read, bases, 0, 4096, &first, 0)]);
        settle(&transport, &first, 1);

        let block = 64 << 10;
        let batch = |sink: &Arc<Sink>, from: usize| {
            (0..8)
                .map(|n| slice(if n % 2 == 0 { Read } else { Write }, bases, (from + n) * block, block, sink, n))
                .collect()
        };
        // One CPU, taken by the submitting thread: it copies every slice itself, and wakes
        // neither copy thread (they would only take turns with it).
        transport.cpus = 1;
        let alone = Arc::new(Sink::default());
        transport.submit(&endpoint, batch(&alone, 0));
        assert_eq!(transport.helpers_woken.load(Ordering::Relaxed), 0);
        assert_eq!(alone.outcomes.lock().len(), 8, "every slice ended on the submitting thread");
        assert!(alone.copiers.lock().iter().all(|&t| t == std::thread::current().id()));

        // Two CPUs: one copy thread helps, not both.
        transport.cpus = 2;
        let helped = Arc::new(Sink::default());
        transport.submit(&endpoint, batch(&helped, 8));
        settle(&transport, &helped, 8);
        assert_eq!(transport.helpers_woken.load(Ordering::Relaxed), 1);

        let mut outcomes =
            [alone, helped].iter().flat_map(|s| std::mem::take(&mut *s.outcomes.lock())).collect::<Vec<_>>();
        outcomes.sort_by_key(|(n, _)| *n);
        assert!(outcomes.iter().all(|(_, o)| *o == SliceOutcome::Completed), "{outcomes:?}");
        // SAFETY: no copy of these ranges is in flight (their slices ended above).
        let (l, r) = unsafe {
            (
                std::slice::from_raw_parts(bases.0 as *const u8, 16 * block),
                std::slice::from_raw_parts(bases.1 as *const u8, 16 * block),
            )
        };
        assert!(l == r, "the copied bytes differ");
        drop(transport);
        drop(buffers);
    }

    #[test]
    fn revoke_returns_once_the_peer_acknowledges() {
        let (transport, region, _memory, client) = target_with_a_granted_client();
        let acker = std::thread::spawn(move || {
            let (revoke, _) = client.recv().unwrap().unwrap();
            assert_eq!(revoke.kind, Kind::Revoke);
            let ack = Frame { region: revoke.region, ..Frame::new(Kind::RevokeAck) };
            client.send(&ack, None).unwrap();
            client
        });
        transport.server.revoke(&region, Duration::from_secs(10)).unwrap();
        let client = acker.join().unwrap();
        // The peer stays connected, and the region is now refused.
        let map = Frame { id: 2, addr: region.addr(), len: 1, ..Frame::new(Kind::Map) };
        client.send(&map, None).unwrap();
        let (reply, _) = client.recv().unwrap().unwrap();
        assert_eq!(reply.status, wire::Status::OutOfRange);
    }

    #[test]
    fn revoke_does_not_wait_for_a_peer_that_is_gone() {
        let (transport, region, _memory, client) = target_with_a_granted_client();
        drop(client);
        // A generous wait: only an error (not a long wait) would show a wrong outcome.
        transport.server.revoke(&region, Duration::from_secs(30)).unwrap();
    }

    #[test]
    fn a_peer_that_never_acknowledges_makes_the_region_busy_and_is_cut_off() {
        let (transport, region, _memory, client) = target_with_a_granted_client();
        let err = transport.server.revoke(&region, Duration::from_millis(100)).unwrap_err();
        assert!(matches!(err, TransportError::RegionBusy { .. }), "{err}");
        let (revoke, _) = client.recv().unwrap().unwrap();
        assert_eq!(revoke.kind, Kind::Revoke);
        assert!(client.recv().unwrap().is_none(), "then disconnected");
    }
}
