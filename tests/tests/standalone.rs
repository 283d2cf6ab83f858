//! The standalone client (`crescent-client`) and its dummy clients: workers in several
//! processes sharing one standalone client (every API family, data verified), a worker killed
//! mid-call, the standalone client killed and restarted, and bad input on the wire.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crescent_store::client::dummy::frame::{Address, Conn};
use crescent_store::client::dummy::wire::{self, Mem, Reply, Request};
use crescent_store::client::{Extent, Piece};
use crescent_store::standalone::{Access, StandaloneServer};
use crescent_store::{ClientConfig, DummyClient, DummyConfig, MasterConfig, StoreApi, StoreClient, StoreError};
use crescent_tests::eventually;
use crescent_tests::store::{loopback_client_config, loopback_master, pattern_bytes, spawn_standalone, ClientProc};

fn unique_socket(tag: &str) -> String {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("@crescent-test-{tag}-{}-{n}", std::process::id())
}

fn standalone_args(master: &str, socket: &str) -> Vec<String> {
    [
        format!("--master_server_address={master}"),
        "--host=127.0.0.1".into(),
        "--global_segment_size=64MB".into(),
        "--local_buffer_size=16MB".into(),
        format!("--socket={socket}"),
    ]
    .into()
}

fn spawn_sc(master: &str, socket: &str) -> crescent_tests::ChildGuard {
    let args = standalone_args(master, socket);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let (child, printed) = spawn_standalone(&refs);
    assert_eq!(printed, socket);
    child
}

fn worker(socket: &str) -> ClientProc {
    ClientProc::spawn_dummy(&["--server", socket, "--mem-pool-size=32M", "--local-buffer-size=8M"])
}

/// Mappings of dummy clients' memfds in process `pid`.
fn dummy_maps(pid: u32) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .map(|m| m.lines().filter(|l| l.contains("memfd:crescent-dummy")).count())
        .unwrap_or(0)
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

#[test]
fn workers_in_several_processes_share_one_standalone_client() {
    let m = loopback_master(MasterConfig::default());
    let socket = unique_socket("share");
    let _sc = spawn_sc(&m.client_address(), &socket);
    let mut a = worker(&socket);
    let mut b = worker(&socket);
    let mut c = worker(&socket);

    // Bytes in, zero-copy out (and the other way), across processes.
    a.ok("put bytes 3M 1");
    assert_eq!(b.ok("get_into bytes 4M 1"), "3145728 verified");
    assert_eq!(c.ok("get_into bytes 3M 1 heap"), "3145728 verified", "heap memory, bounced");
    b.ok("put_from pool 5M 2");
    c.ok("put_from heap 700K 3 heap");
    assert_eq!(a.ok("get pool 2 5M"), "5242880 verified");
    assert_eq!(a.ok("get heap 3 700K"), "716800 verified");
    // Scatter/gather and ranges.
    assert_eq!(c.ok("get_sg pool 2 1M,3M,2M"), "5242880 verified");
    assert_eq!(a.ok("get_sg pool 2 2M,1M,4M heap"), "5242880 verified");
    assert_eq!(b.ok("get_ranges pool 2 0:10 4096:100000 5242000:880"), "100890 verified");
    // Batches.
    assert_eq!(a.ok("batch_put_from 4 k1:10K k2:1M k3:3K"), "ok ok ok");
    assert_eq!(b.ok("batch_get_into 4 k1:10K k2:1M k3:3K nope:1K"), "10240 1048576 3072 OBJECT_NOT_FOUND");
    assert_eq!(c.ok("batch_get 4 k1:10K k2:1M"), "10240 1048576");
    assert_eq!(c.ok("batch_put 5 j1:2K j2:20K"), "ok ok");
    assert_eq!(a.ok("batch_get_into 5 j1:2K j2:20K heap"), "2048 20480");
    // Probes and removal.
    assert_eq!(b.ok("batch_exists k1 nope j2"), "true false true");
    assert_eq!(c.ok("exists k3"), "true");
    assert_eq!(a.ok("size pool"), "5242880");
    assert!(b.ok("query pool").starts_with("exists=true size=5242880"));
    a.ok("remove_force k1");
    assert_eq!(b.ok("exists k1"), "false");
    let removed: u64 = c.ok("remove_regex ^j").parse().unwrap();
    assert!(removed <= 2, "leased objects stay");
    assert!(a.cmd("get_into pool 1M 2").starts_with("err INVALID_ARGUMENT buffer of 1048576 bytes is too small"));
    assert!(a.cmd("get nothing 1").starts_with("err OBJECT_NOT_FOUND"));
    let _ = a.ok("remove_all");
}

#[test]
fn a_worker_killed_mid_call_releases_its_memory_and_hurts_no_one() {
    let m = loopback_master(MasterConfig::default());
    let socket = unique_socket("kill-worker");
    let sc = spawn_sc(&m.client_address(), &socket);
    let sc_pid = sc.0.id();
    let (maps0, fds0) = (dummy_maps(sc_pid), open_fds(sc_pid));
    let mut b = worker(&socket);
    b.ok("put_from v 4M 7");
    let (maps_b, fds_b) = (dummy_maps(sc_pid), open_fds(sc_pid));
    assert_eq!(maps_b, maps0 + 2, "b's pool and local buffer are mapped");
    let mut a = worker(&socket);
    assert!(dummy_maps(sc_pid) == maps_b + 2);
    // a spins get_into (in the standalone client, into a's pages) and dies mid-call.
    assert_eq!(a.ok("spin_get_into v 4M"), "spinning");
    std::thread::sleep(Duration::from_millis(300));
    a.child.kill_now();
    assert!(
        eventually(Duration::from_secs(30), || dummy_maps(sc_pid) == maps_b && open_fds(sc_pid) <= fds_b),
        "the killed worker's mappings and connections are released: maps {} (want {maps_b}), fds {} (want <= {fds_b})",
        dummy_maps(sc_pid),
        open_fds(sc_pid)
    );
    // The other worker and the standalone client carry on.
    assert_eq!(b.ok("get_into v 4M 7"), "4194304 verified");
    b.ok("put w 1M 8");
    assert_eq!(b.ok("get w 8 1M"), "1048576 verified");
    drop(b);
    assert!(eventually(Duration::from_secs(30), || dummy_maps(sc_pid) == maps0 && open_fds(sc_pid) <= fds0));
}

#[test]
fn a_killed_standalone_client_gives_retryable_errors_and_workers_reconnect() {
    let m = loopback_master(MasterConfig { client_ttl: Duration::from_secs(2), ..MasterConfig::default() });
    let socket = unique_socket("kill-sc");
    let mut sc = spawn_sc(&m.client_address(), &socket);
    let mut w = ClientProc::spawn_dummy(&["--server", &socket, "--call-timeout-ms=5000"]);
    w.ok("put_from before 1M 1");
    sc.kill_now();
    let t = Instant::now();
    let answer = w.cmd("get_into before 1M 1");
    assert!(answer.starts_with("err ") && answer.contains("retryable: standalone client"), "{answer}");
    assert!(t.elapsed() < Duration::from_secs(5), "within the call's deadline");
    let answer = w.cmd("put again 1K 2");
    assert!(answer.contains("unavailable"), "{answer}");
    // Back: the worker reconnects by itself and shares its pool again (get_into lands there).
    let sc = spawn_sc(&m.client_address(), &socket);
    let ok = eventually(Duration::from_secs(30), || w.cmd("put_from after 2M 3") == "ok");
    assert!(ok, "the worker works again once the standalone client is back");
    assert_eq!(w.ok("get_into after 2M 3"), "2097152 verified");
    assert!(dummy_maps(sc.0.id()) >= 2, "the pool and the local buffer are shared with the new one");
}

// ---- in one process: the typed errors and the wire's bounds ----

struct Setup {
    _master: crescent_store::master::server::MasterHandle,
    _server: StandaloneServer,
    socket: String,
}

fn in_process() -> Setup {
    in_process_with(Access::default())
}

fn in_process_with(access: Access) -> Setup {
    let m = loopback_master(MasterConfig::default());
    let client = StoreClient::connect(ClientConfig {
        global_segment_size: 32 << 20,
        local_buffer_size: 4 << 20,
        ..loopback_client_config(&m)
    })
    .unwrap();
    let socket = unique_socket("inproc");
    let server = StandaloneServer::start(client, &Address::parse(&socket).unwrap(), access).unwrap();
    Setup { _master: m, _server: server, socket }
}

fn dummy(s: &Setup) -> DummyClient {
    DummyClient::connect(DummyConfig {
        server_address: s.socket.clone(),
        mem_pool_size: 8 << 20,
        local_buffer_size: 1 << 20,
        call_timeout: Duration::from_secs(10),
        ..DummyConfig::default()
    })
    .unwrap()
}

#[test]
fn bad_input_gets_typed_errors() {
    let s = in_process();
    let d = dummy(&s);
    let v = pattern_bytes(100_000, 5);
    d.put("k", &v).unwrap();
    // Unknown memory: neither allocated through the API nor registered.
    let stray = vec![0u8; 4096];
    let e = d.get_into("k", stray.as_ptr() as u64, 4096).unwrap_err();
    assert!(matches!(e, StoreError::NotRegistered { .. }) && e.is_caller_error(), "{e:?}");
    // Too small a buffer, shared or bounced.
    let small = d.alloc_from_mem_pool(1000).unwrap();
    let e = d.get_into("k", small, 1000).unwrap_err();
    assert!(matches!(e, StoreError::BufferTooSmall { need: 100_000, have: 1000, .. }), "{e:?}");
    let e = d.get_into_ranges("k", &[Extent { offset: 99_999, addr: small, len: 2 }]).unwrap_err();
    assert!(matches!(e, StoreError::BadRange { .. }), "{e:?}");
    // More heap memory in one call than the local buffer holds.
    let heap = vec![0u8; 2 << 20];
    d.register_buffer(heap.as_ptr() as u64, heap.len() as u64).unwrap();
    let e = d.get_into("k", heap.as_ptr() as u64, heap.len() as u64).unwrap_err();
    assert!(e.is_caller_error() && e.to_string().contains("local buffer"), "{e}");
    // A value too large to travel as bytes.
    let e = d.put("huge", &vec![0u8; crescent_store::client::dummy::frame::MAX_PAYLOAD + 1]).unwrap_err();
    assert!(e.is_caller_error() && e.to_string().contains("alloc_from_mem_pool"), "{e}");
    // Still fine afterwards.
    let got = d.alloc_from_mem_pool(100_000).unwrap();
    assert_eq!(d.get_into_sg("k", &[Piece::new(got, 100_000)]).unwrap(), 100_000);
    // SAFETY: 100000 bytes of this test's pool allocation, written by the get above.
    let bytes = unsafe { std::slice::from_raw_parts(got as *const u8, 100_000) };
    assert!(bytes == &v[..]);
}

#[test]
fn the_wire_refuses_unknown_regions_and_oversized_frames() {
    let s = in_process();
    let address = Address::parse(&s.socket).unwrap();
    let soon = || Instant::now() + Duration::from_secs(5);
    let conn = Conn::connect(&address, Duration::from_secs(5)).unwrap();
    let call = |conn: &Conn, r: &Request| {
        conn.send(&wire::encode(r).unwrap(), &[], None, soon()).unwrap();
        wire::decode::<Reply>(&conn.recv(Some(soon()), Duration::from_secs(5)).unwrap().message).unwrap()
    };
    let hello = call(&conn, &Request::Hello { version: wire::VERSION, client_id: "raw".into() });
    assert!(matches!(hello, Reply::Hello { known: false, .. }), "{hello:?}");
    // A region never shared, and a Share without its memfd.
    let r = call(&conn, &Request::GetInto { key: "k".into(), pieces: vec![Mem { region: 999, offset: 0, len: 10 }] });
    let Reply::Fail(e) = r else { panic!("{r:?}") };
    let e = StoreError::from(e);
    assert!(e.is_caller_error() && e.to_string().contains("region 999 is not shared"), "{e}");
    let r = call(&conn, &Request::Share { region: 1, len: 4096 });
    assert!(matches!(r, Reply::Fail(_)), "{r:?}");
    // An oversized frame: the connection is dropped, the service goes on.
    let mut header = Vec::new();
    header.extend_from_slice(b"CRS\x01");
    header.extend_from_slice(&u32::MAX.to_le_bytes());
    header.extend_from_slice(&0u32.to_le_bytes());
    use std::io::Write;
    use std::os::linux::net::SocketAddrExt;
    let name = std::os::unix::net::SocketAddr::from_abstract_name(s.socket.trim_start_matches('@')).unwrap();
    let mut raw = std::os::unix::net::UnixStream::connect_addr(&name).unwrap();
    raw.write_all(&header).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; 64];
    use std::io::Read;
    assert!(matches!(raw.read(&mut buf), Ok(0) | Err(_)), "the standalone client closed the connection");
    // A hello that never comes ends the same way, after its deadline; others are served meanwhile.
    let d = dummy(&s);
    d.put("after", b"fine").unwrap();
    assert_eq!(d.get("after").unwrap(), b"fine");
    let arc: Arc<dyn StoreApi> = Arc::new(d);
    assert!(arc.exists("after").unwrap());
}

#[test]
fn one_process_cannot_take_every_connection() {
    let s = in_process_with(Access { max_per_process: 2, ..Access::default() });
    let address = Address::parse(&s.socket).unwrap();
    let soon = || Instant::now() + Duration::from_secs(5);
    let hello = |conn: &Conn| -> Option<Reply> {
        let r = Request::Hello { version: wire::VERSION, client_id: "greedy".into() };
        conn.send(&wire::encode(&r).unwrap(), &[], None, soon()).ok()?;
        let frame = conn.recv(Some(soon()), Duration::from_secs(5)).ok()?;
        wire::decode::<Reply>(&frame.message).ok()
    };
    let first = Conn::connect(&address, Duration::from_secs(5)).unwrap();
    let second = Conn::connect(&address, Duration::from_secs(5)).unwrap();
    assert!(hello(&first).is_some() && hello(&second).is_some(), "two connections are served");
    // A third from the same process is closed unserved.
    let third = Conn::connect(&address, Duration::from_secs(5)).unwrap();
    assert!(hello(&third).is_none(), "a process over its bound is refused");
    // One closes: the process may connect again.
    drop(first);
    let again = eventually(Duration::from_secs(10), || {
        Conn::connect(&address, Duration::from_secs(5)).ok().and_then(|c| hello(&c)).is_some()
    });
    assert!(again, "a freed slot is served again");
}

#[test]
fn a_dummy_client_upserts_puts_parts_holds_buffers_and_forces_removals() {
    let s = in_process();
    let d = dummy(&s);
    let opts = d.default_options();
    // A put keeps what is there; an upsert replaces it, from bytes and from shared memory
    // (a get leases its object for a while: each upsert below is of a key not read yet).
    d.put("k", b"first").unwrap();
    d.put_with("k", b"second", &opts).unwrap();
    assert_eq!(d.get("k").unwrap(), b"first");
    d.put("u", b"first").unwrap();
    d.upsert_with("u", b"third", &opts).unwrap();
    assert_eq!(d.get("u").unwrap(), b"third");
    let v = pattern_bytes(300_000, 9);
    let pool = d.alloc_from_mem_pool(v.len() as u64).unwrap();
    // SAFETY: `pool` is v.len() bytes of this dummy client's pool, ours until freed.
    unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), pool as *mut u8, v.len()) };
    d.put("w", b"old").unwrap();
    d.upsert_from_with("w", pool, v.len() as u64, &opts).unwrap();
    assert!(d.get("w").unwrap() == v);
    // Parts, one after another.
    d.put_parts_with("p", &[b"ab", b"", b"cde"], &opts).unwrap();
    d.upsert_parts_with("p", &[b"x", b"yz"], &opts).unwrap();
    assert_eq!(d.get("p").unwrap(), b"xyz");
    // Batches of upserts.
    let keys = vec!["b1".to_string(), "b2".to_string()];
    d.put("b1", b"old").unwrap();
    let rs = d.upsert_batch_with(&keys, &[b"11", b"22"], &opts).unwrap();
    assert!(rs.iter().all(Result::is_ok), "{rs:?}");
    let keys = vec!["c1".to_string(), "c2".to_string()];
    d.put("c2", b"old").unwrap();
    let rs = d.batch_upsert_from_sg(&keys, &[&[Piece::new(pool, 10)][..], &[Piece::new(pool + 10, 20)][..]], &opts);
    assert!(rs.unwrap().iter().all(Result::is_ok));
    assert_eq!(d.get("b1").unwrap(), b"11");
    assert_eq!(d.get("c2").unwrap(), &v[10..30]);
    // get_buffer: the value held in this process's shared memory, freed when dropped.
    let held = d.get_buffer("w").unwrap();
    assert_eq!(held.len(), v.len() as u64);
    assert!(held.bytes() == &v[..] && d.is_registered(held.addr(), held.len()));
    let many = d.batch_get_buffer(&["c1".into(), "nope".into(), "c2".into()]).unwrap();
    assert_eq!(many[0].as_ref().unwrap().bytes(), &v[..10]);
    assert!(matches!(many[1], Err(StoreError::NotFound(_))), "{:?}", many[1]);
    assert_eq!(many[2].as_ref().unwrap().bytes(), &v[10..30]);
    drop(held);
    assert!(!d.is_registered(0x1000, 16), "stray memory is not registered");
    // The master is reachable through the standalone client.
    assert!(d.master_reachable());
    // A lease held by a reader stops a removal; force goes through it.
    assert!(matches!(d.remove_with("w", false), Err(StoreError::Leased(_))));
    assert!(d.remove_all_with(true).unwrap() >= 8);
    assert!(!d.exists("w").unwrap());
    d.put("r1", b"1").unwrap();
    assert_eq!(d.remove_by_regex_with("^r", true).unwrap(), 1);
}

/// `n` calls that reach the standalone client (each asks its master).
fn calls(d: &DummyClient, n: usize) {
    for i in 0..n {
        assert!(!d.exists(&format!("poll-{i}")).unwrap());
    }
}

#[test]
fn back_to_back_calls_are_taken_by_polling_and_polling_is_bounded_and_optional() {
    // A poll longer than any gap between a reply and the worker's next request: every
    // request after the first is taken while the connection's thread polls, none after
    // blocking; the worker's first reply (before any call's time is known) is polled for.
    let s = in_process_with(Access { poll: Duration::from_secs(5), ..Access::default() });
    let d = DummyClient::connect(DummyConfig {
        server_address: s.socket.clone(),
        mem_pool_size: 0,
        local_buffer_size: 0,
        reply_poll: Duration::from_secs(5),
        ping_interval: Duration::from_secs(3600),
        ..DummyConfig::default()
    })
    .unwrap();
    calls(&d, 20);
    let requests = s._server.requests();
    assert_eq!(requests, crescent_store::standalone::RequestCounts { polled: 20, waited: 0 }, "{requests:?}");
    let replies = d.replies();
    assert!(replies.polled >= 1, "{replies:?}");
    assert_eq!(replies.polled + replies.waited, 21, "the hello and 20 calls: {replies:?}");
    // A worker that pauses past the poll is still served: its thread blocked meanwhile.
    let s = in_process_with(Access { poll: Duration::from_micros(1), ..Access::default() });
    let d = DummyClient::connect(DummyConfig {
        server_address: s.socket.clone(),
        mem_pool_size: 0,
        local_buffer_size: 0,
        reply_poll: Duration::from_nanos(1),
        ping_interval: Duration::from_secs(3600),
        ..DummyConfig::default()
    })
    .unwrap();
    std::thread::sleep(Duration::from_millis(50));
    calls(&d, 1);
    assert!(s._server.requests().waited >= 1, "{:?}", s._server.requests());
    // Calls longer than the client's bound block for their replies (the first, polled for
    // up to 1 ns before any call's time is known, at most is taken polling).
    calls(&d, 10);
    assert!(d.replies().polled <= 1, "{:?}", d.replies());
    assert_eq!(d.replies().polled + d.replies().waited, 12);
    // Zero: never polls.
    let s = in_process_with(Access { poll: Duration::ZERO, ..Access::default() });
    let d = DummyClient::connect(DummyConfig {
        server_address: s.socket.clone(),
        mem_pool_size: 0,
        local_buffer_size: 0,
        reply_poll: Duration::ZERO,
        ping_interval: Duration::from_secs(3600),
        ..DummyConfig::default()
    })
    .unwrap();
    calls(&d, 10);
    assert_eq!(s._server.requests(), crescent_store::standalone::RequestCounts { polled: 0, waited: 10 });
    assert_eq!(d.replies(), crescent_store::client::dummy::ReplyCounts { polled: 0, waited: 11 });
}
