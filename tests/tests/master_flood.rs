//! A flood of connections on the master's gRPC port (issue 24 §2), against a `crescent-master`
//! process with a limit of open files: one peer address cannot take every connection (and every
//! descriptor of the master) and lock the other clients out, and a master that ran out of
//! descriptors serves again once they come back. Peers are loopback addresses (127.0.0.0/8).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use crescent_store::master::conn_limit::MAX_CONNECTIONS_PER_PEER;
use crescent_store::proto::master_client::MasterClient;
use crescent_store::proto::KeyRequest;
use crescent_tests::eventually;
use crescent_tests::faults::{assert_settles, limit_fds, usage};
use crescent_tests::store::spawn_master;
use tokio::net::{TcpSocket, TcpStream};

/// A generous bound for a connect and one unary call to a master that serves.
const CALL: Duration = Duration::from_secs(10);
/// How long the master may take to accept (or refuse) a flood and to close what a flood left.
const SETTLE: Duration = Duration::from_secs(30);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// One `Exists` call on a new connection (from 127.0.0.1): Ok when the master answered.
async fn served(addr: SocketAddr) -> Result<(), String> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(CALL)
        .timeout(CALL)
        .connect()
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let req = KeyRequest { client_id: "flood-test".into(), key: "k".into(), ..Default::default() };
    MasterClient::new(channel).exists(req).await.map(|_| ()).map_err(|s| format!("Exists: {s}"))
}

/// Up to `n` idle connections from `from` to `addr`; stops at the first connect that fails or
/// waits (the master's listen backlog is full: it does not accept).
async fn flood(from: Ipv4Addr, addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        let s = TcpSocket::new_v4().expect("a socket");
        s.bind(SocketAddr::new(IpAddr::V4(from), 0)).expect("bind to a loopback address");
        // Generous: on a loaded machine the master's accept loop may fall behind and the
        // listen backlog fill, and the kernel retries a dropped SYN after 1 s, then 3 s.
        match tokio::time::timeout(Duration::from_secs(10), s.connect(addr)).await {
            Ok(Ok(c)) => held.push(c),
            _ => break,
        }
    }
    held
}

/// How many of `conns` the master has not closed.
fn still_open(conns: &[TcpStream]) -> usize {
    let mut buf = [0u8; 64];
    conns
        .iter()
        .filter(|c| matches!(c.try_read(&mut buf), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock))
        .count()
}

fn master() -> (crescent_tests::ChildGuard, SocketAddr, u32) {
    let (m, addr) = spawn_master(&[], &["--rpc-address", "127.0.0.1:0", "--admin-address", "127.0.0.1:0"]);
    let pid = m.0.id();
    (m, addr.parse().expect("the master's address"), pid)
}

#[test]
fn one_peer_flooding_the_master_with_connections_does_not_lock_others_out() {
    let rt = runtime();
    let (_m, addr, pid) = master();
    rt.block_on(served(addr)).expect("the master serves before the flood");
    let before = usage(pid);
    // Room for the per-peer bound and a few more, not for the whole flood.
    let limit = before.fds + MAX_CONNECTIONS_PER_PEER + 64;
    limit_fds(pid, limit);

    let conns = rt.block_on(flood(Ipv4Addr::new(127, 0, 0, 2), addr, MAX_CONNECTIONS_PER_PEER + 256));
    assert!(conns.len() > MAX_CONNECTIONS_PER_PEER, "only {} connections of the flood were made", conns.len());
    // The master refuses (closes) what is over the bound, and holds no more than the bound.
    assert!(
        eventually(SETTLE, || still_open(&conns) <= MAX_CONNECTIONS_PER_PEER),
        "{} of the flood's connections are open, the bound is {MAX_CONNECTIONS_PER_PEER}",
        still_open(&conns)
    );
    let held = usage(pid).fds;
    assert!(held < limit, "the master holds {held} descriptors, its limit is {limit}");
    rt.block_on(served(addr)).expect("another peer is served during the flood");

    drop(conns);
    assert_settles("the master after the flood", pid, before, SETTLE);
    rt.block_on(served(addr)).expect("the master serves after the flood");
}

#[test]
fn a_master_out_of_descriptors_serves_again_when_they_come_back() {
    let rt = runtime();
    let (_m, addr, pid) = master();
    rt.block_on(served(addr)).expect("the master serves before the flood");
    let before = usage(pid);
    let limit = before.fds + 128;
    limit_fds(pid, limit);

    // Four peers, each under its bound, together over the master's limit: its accepts fail.
    let conns: Vec<TcpStream> = rt.block_on(async {
        let mut all = Vec::new();
        for last in 2..6 {
            all.extend(flood(Ipv4Addr::new(127, 0, 0, last), addr, 64).await);
        }
        all
    });
    assert!(
        eventually(SETTLE, || usage(pid).fds + 2 >= limit),
        "the flood did not exhaust the master's descriptors ({} of {limit})",
        usage(pid).fds
    );
    drop(conns);
    assert!(
        eventually(SETTLE, || rt.block_on(served(addr)).is_ok()),
        "the master does not serve after its descriptors came back: {:?}",
        rt.block_on(served(addr))
    );
    assert_settles("the master after the flood", pid, before, SETTLE);
}
