//! Issue 26, the data path: a `tebench target` with a cluster secret, in a network namespace
//! of its own ("host A"); peers in host B (tcp) and in host A itself (shm). A peer without
//! the secret — raw sockets, or the real library with a wrong secret — gets nothing from the
//! handshake port, the tcp data port or the shm socket, and writes nothing; peers with the
//! secret, or with either secret of a rotation, move verified data.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use crescent_engine::handshake::{self, MessageKind};
use crescent_engine::{EngineError, SegmentDescriptor};
use crescent_tests::netns::{in_netns, HostPair};
use crescent_tests::{spawn_tebench_target_env, workspace_bin};
use crescent_transports::net::{Auth, Keyring};
use crescent_transports::tcp::frame::{FrameKind, Header, Status};
use crescent_transports::tcp::{TcpConfig, TcpTransport};
use crescent_transports::{
    Completion, CompletionSink, Endpoint, FailureKind, Opcode, RegionTable, Slice, SliceOutcome, Transport,
};
use parking_lot::Mutex;

const SECRET: &str = "3f9a0c57e1d24b8c9a6e5f4d3c2b1a09";
const NEXT: &str = "7d1e2f3a4b5c6d7e8f90a1b2c3d4e5f6";
const WRONG: &str = "00000000000000000000000000000000";

fn auth(secrets: &[&str]) -> Auth {
    Auth::new(Some(Keyring::new(secrets).unwrap()))
}

/// `tebench initiator --verify` from `ns` with `envs`; its exit status and output.
fn initiator(ns: &str, host: &str, segment: &str, op: &str, envs: &[(&str, &str)]) -> (bool, String) {
    let out = Command::new("ip")
        .args(["netns", "exec", ns])
        .arg(workspace_bin("tebench"))
        .args(["initiator", "--segment", segment, "--operation", op, "--block-size", "64K", "--batch-size", "8"])
        .args(["--threads", "1", "--duration", "1", "--verify", "--json", "--local-hostname", host])
        .env_remove("CRESCENT_CLUSTER_SECRET")
        .env_remove("CRESCENT_CLUSTER_SECRET_NEXT")
        .env_remove("CRESCENT_CLUSTER_SECRET_FILE")
        .envs(envs.iter().copied())
        .output()
        .unwrap();
    let text = format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

/// Everything a connection gives back until it closes (or 20 s pass).
fn drain(mut s: &TcpStream) -> Vec<u8> {
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    got
}

#[derive(Default)]
struct Outcomes(Mutex<Vec<Option<SliceOutcome>>>);

impl CompletionSink for Outcomes {
    fn begin_local_access(&self, _: usize) -> bool {
        true
    }
    fn end_local_access(&self, _: usize) {}
    fn complete(&self, slice: usize, outcome: SliceOutcome) {
        let mut v = self.0.lock();
        if v.len() <= slice {
            v.resize(slice + 1, None);
        }
        v[slice].get_or_insert(outcome);
    }
}

/// One read of `len` bytes at `remote` through a tcp transport holding `secrets`.
fn tcp_read_with(secrets: Option<&[&str]>, peer: &Endpoint, remote: u64, len: u64) -> SliceOutcome {
    let auth = secrets.map_or_else(Auth::open, auth);
    let config = TcpConfig { lanes: 1, auth, ..TcpConfig::default() };
    let t = TcpTransport::start(config, Arc::new(RegionTable::new())).unwrap();
    let mut local = vec![0u8; len as usize];
    let sink = Arc::new(Outcomes::default());
    let slice = Slice {
        opcode: Opcode::Read,
        local_addr: local.as_mut_ptr() as u64,
        remote_addr: remote,
        len,
        completion: Completion::new(sink.clone(), 0),
    };
    t.submit(peer, vec![slice]);
    assert!(
        crescent_tests::eventually(Duration::from_secs(30), || sink.0.lock().first().is_some_and(|o| o.is_some())),
        "the read ended"
    );
    let outcome = sink.0.lock()[0].clone().unwrap();
    outcome
}

#[test]
fn without_the_cluster_secret_no_port_of_an_engine_serves_anything() {
    let Some(hosts) = HostPair::create_or_skip("auth", "auth data path") else { return };
    let (_target, segment) = spawn_tebench_target_env(
        &hosts.exec_prefix(&hosts.a),
        &["--buffer-size", "16M", "--pattern", "--local-hostname", &hosts.addr_a],
        &[("CRESCENT_CLUSTER_SECRET", SECRET), ("CRESCENT_CLUSTER_SECRET_NEXT", NEXT)],
    );
    let (host_a, host_b) = (hosts.addr_a.clone(), hosts.addr_b.clone());

    // A peer with the secret (the current one, or the next one of the rotation) reads
    // verified data, over tcp from host B and over shm from host A.
    for (ns, host) in [(&hosts.b, &host_b), (&hosts.a, &host_a)] {
        for envs in [vec![("CRESCENT_CLUSTER_SECRET", SECRET)], vec![("CRESCENT_CLUSTER_SECRET", NEXT)]] {
            let (ok, out) = initiator(ns, host, &segment, "read", &envs);
            assert!(ok, "read from {ns} with {envs:?}: {out}");
        }
    }

    // The real library with no secret, or a wrong one, is refused at the handshake.
    for envs in [vec![], vec![("CRESCENT_CLUSTER_SECRET", WRONG)]] {
        for (ns, host) in [(&hosts.b, &host_b), (&hosts.a, &host_a)] {
            let (ok, out) = initiator(ns, host, &segment, "read", &envs);
            assert!(!ok, "a read from {ns} with {envs:?} must fail: {out}");
        }
    }

    // What the attackers aim at: the descriptor (which only an authenticated peer gets).
    let seg = segment.clone();
    let descriptor: SegmentDescriptor = in_netns(&hosts.b, move || {
        handshake::fetch_descriptor(&seg, Duration::from_secs(10), &auth(&[SECRET])).expect("descriptor")
    });
    let buffer = descriptor.buffers[0].addr;
    let tcp = descriptor.endpoints.iter().find(|e| matches!(e, Endpoint::Tcp { .. })).unwrap().clone();
    let shm = descriptor.endpoints.iter().find_map(|e| match e {
        Endpoint::Shm { socket } => Some(socket.clone()),
        _ => None,
    });

    let seg = segment.clone();
    let tcp2 = tcp.clone();
    in_netns(&hosts.b, move || {
        // The handshake port: a raw descriptor request, and the library with a wrong secret.
        let raw = TcpStream::connect(seg.as_str()).unwrap();
        let _ = handshake::write_message(&mut &raw, MessageKind::GetDescriptor, seg.as_bytes());
        assert_eq!(drain(&raw), b"", "the handshake port gave an outsider bytes");
        for secrets in [None, Some(&[WRONG][..])] {
            let a = secrets.map_or_else(Auth::open, auth);
            let err = handshake::fetch_descriptor(&seg, Duration::from_secs(10), &a).unwrap_err();
            assert!(
                matches!(
                    err,
                    EngineError::Unauthenticated { .. }
                        | EngineError::SegmentUnreachable { .. }
                        | EngineError::BadPeerReply { .. }
                ),
                "{err}"
            );
        }
        // The tcp data port: a raw read of the buffer, a raw write over it.
        let Endpoint::Tcp { host, port } = &tcp2 else { unreachable!() };
        let read = Header { kind: FrameKind::ReadRequest, status: Status::Ok, id: 1, addr: buffer, len: 4096 };
        let raw = TcpStream::connect((host.as_str(), *port)).unwrap();
        let _ = (&raw).write_all(&read.encode());
        assert_eq!(drain(&raw), b"", "the tcp port answered an outsider's read");
        let write = Header { kind: FrameKind::WriteRequest, status: Status::Ok, id: 2, addr: buffer, len: 65536 };
        let raw = TcpStream::connect((host.as_str(), *port)).unwrap();
        let _ = (&raw).write_all(&write.encode());
        let _ = (&raw).write_all(&[0xEE; 65536]);
        assert_eq!(drain(&raw), b"", "the tcp port acknowledged an outsider's write");
        // The real tcp transport without the secret, and with a wrong one.
        for secrets in [None, Some(&[WRONG][..])] {
            match tcp_read_with(secrets, &tcp2, buffer, 4096) {
                SliceOutcome::Failed(r) => {
                    assert!(matches!(r.kind, FailureKind::Unauthenticated | FailureKind::PeerGone), "{r:?}")
                }
                SliceOutcome::Completed => panic!("a tcp read with {secrets:?} completed"),
            }
        }
        // With the secret, the same read works.
        assert_eq!(tcp_read_with(Some(&[SECRET]), &tcp2, buffer, 4096), SliceOutcome::Completed);
    });

    // The shm socket, from host A: a raw hello gets no answer and no memory.
    if let Some(socket) = shm {
        in_netns(&hosts.a, move || {
            use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
            let fd = rustix::net::socket_with(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)
                .unwrap();
            rustix::net::connect(&fd, &SocketAddrUnix::new_abstract_name(socket.as_bytes()).unwrap()).unwrap();
            // A shm hello frame: magic "CS", version 1, kind 1 (hello), zeros.
            let mut hello = [0u8; 40];
            hello[..4].copy_from_slice(&[b'C', b'S', 1, 1]);
            let _ = rustix::net::send(&fd, &hello, rustix::net::SendFlags::NOSIGNAL);
            rustix::net::sockopt::set_socket_timeout(
                &fd,
                rustix::net::sockopt::Timeout::Recv,
                Some(Duration::from_secs(20)),
            )
            .unwrap();
            let mut buf = [0u8; 64];
            let got = rustix::net::recv(&fd, &mut buf, rustix::net::RecvFlags::empty()).map(|(n, _)| n);
            assert!(matches!(got, Ok(0) | Err(_)), "the shm socket answered an outsider: {got:?}");
        });
    }

    // After all that, the target's memory still holds its pattern: the outsider's write did
    // not land.
    let (ok, out) = initiator(&hosts.b, &host_b, &segment, "read", &[("CRESCENT_CLUSTER_SECRET", NEXT)]);
    assert!(ok, "verified read after the outsiders: {out}");
    // And peers with the secret write (each checks its write by reading it back).
    for (ns, host) in [(&hosts.b, &host_b), (&hosts.a, &host_a)] {
        let (ok, out) = initiator(ns, host, &segment, "write", &[("CRESCENT_CLUSTER_SECRET", SECRET)]);
        assert!(ok, "write from {ns}: {out}");
    }
}
