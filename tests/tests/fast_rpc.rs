//! Issue 46: the master's fast RPC port. A client's hot calls (exists, replica lists, put
//! start/end and their batch forms) go there once a ping named it, with the same answers as
//! over gRPC; the port refuses what gRPC refuses (no token, a wrong one), bounds a frame before
//! it reads it, answers an unknown call with an error and lives on; a master without it
//! serves everything over gRPC. A holder's owner stream moves there too and carries the
//! news and acknowledgements of its puts' commits; a put's checksum follows its start there.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crescent_store::fastrpc::{self, Method, HEADER, HELLO};
use crescent_store::master::access;
use crescent_store::master::server::MasterHandle;
use crescent_store::proto::{ExistsReply, KeyRequest, OwnerAck};
use crescent_store::{ClientConfig, MasterConfig, StoreApi, StoreClient};
use crescent_tests::store::{loopback_client_config, loopback_master, pattern_bytes};
use crescent_transports::net::Keyring;
use prost::Message;

const SECRET: &str = "5b0e6c1f2a3d4e5f60718293a4b5c6d7";

fn client(m: &MasterHandle, secret: Option<&str>) -> Arc<StoreClient> {
    StoreClient::connect(ClientConfig {
        global_segment_size: 16 << 20,
        local_buffer_size: 16 << 20,
        cluster_secret: secret.map(|s| Keyring::new(&[s]).unwrap()),
        ..loopback_client_config(m)
    })
    .expect("client")
}

fn fast_calls(m: &MasterHandle) -> u64 {
    m.master.metrics().fast_rpc_calls.get()
}

/// Puts and reads back keys until the master has served `at_least` calls on its fast port
/// (the client takes the port up from its first ping's reply, at once but in the background).
fn until_fast(m: &MasterHandle, c: &StoreClient, at_least: u64) {
    let until = Instant::now() + Duration::from_secs(20);
    let mut i = 0;
    while fast_calls(m) < at_least {
        assert!(Instant::now() < until, "the client's calls never reached the fast rpc port");
        let v = pattern_bytes(4096, i);
        c.put(&format!("warm-{i}"), &v).unwrap();
        assert_eq!(c.get(&format!("warm-{i}")).unwrap(), v);
        i += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A raw connection's next reply frame: (tag, body); `None` once the master closed it.
fn reply(s: &mut TcpStream) -> Option<(u8, Vec<u8>)> {
    let mut h = [0u8; HEADER];
    s.read_exact(&mut h).ok()?;
    let (len, tag) = fastrpc::parse_header(&h, 1 << 20).unwrap();
    let mut body = vec![0; len];
    s.read_exact(&mut body).ok()?;
    Some((tag, body))
}

fn raw(addr: SocketAddr, authorization: &str) -> (TcpStream, (u8, Vec<u8>)) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&fastrpc::frame(HELLO, &fastrpc::hello_body(authorization, ""))).unwrap();
    let answer = reply(&mut s).expect("an answer to the hello");
    (s, answer)
}

fn exists_frame(key: &str) -> Vec<u8> {
    fastrpc::message_frame(
        Method::Exists as u8,
        &KeyRequest { client_id: "raw".into(), key: key.into(), ..Default::default() },
    )
}

#[test]
fn a_clients_hot_calls_go_over_the_fast_port_with_the_same_answers() {
    let m = loopback_master(MasterConfig::default());
    assert!(m.fast_rpc_addr.is_some(), "a master serves the fast port by default");
    let c = client(&m, None);
    until_fast(&m, &c, 1);
    let before = fast_calls(&m);
    let v = pattern_bytes(256 << 10, 3);
    c.put("k", &v).unwrap();
    assert_eq!(c.get("k").unwrap(), v);
    assert!(c.exists("k").unwrap());
    assert!(!c.exists("nope").unwrap());
    let keys: Vec<String> = (0..8).map(|i| format!("b{i}")).collect();
    let values: Vec<Vec<u8>> = (0..8).map(|i| pattern_bytes(8192, i)).collect();
    let refs: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
    assert!(c.put_batch(&keys, &refs).unwrap().iter().all(Result::is_ok));
    assert_eq!(c.batch_exists(&keys).unwrap(), vec![true; 8]);
    for (got, want) in c.get_batch(&keys).unwrap().into_iter().zip(&values) {
        assert_eq!(&got.unwrap(), want);
    }
    // Put start and end, get, two exists, batch put start and end, batch exists, batch get.
    assert!(fast_calls(&m) >= before + 9, "{} calls on the fast port, not 9", fast_calls(&m) - before);
    // Another client (over gRPC or fast, whichever it has) reads what went over the fast port.
    let other = client(&m, None);
    assert_eq!(other.get("k").unwrap(), v);
}

#[test]
fn a_master_without_the_fast_port_serves_everything_over_grpc() {
    let m = loopback_master(MasterConfig { fast_rpc_port: None, ..Default::default() });
    assert!(m.fast_rpc_addr.is_none());
    let c = client(&m, None);
    std::thread::sleep(Duration::from_millis(300)); // its first ping is answered meanwhile
    for i in 0..20 {
        c.put(&format!("k{i}"), &pattern_bytes(4096, i)).unwrap();
        assert_eq!(c.get(&format!("k{i}")).unwrap(), pattern_bytes(4096, i));
    }
    assert_eq!(fast_calls(&m), 0);
}

#[test]
fn the_fast_port_refuses_what_grpc_refuses_and_bounds_every_frame() {
    let keyring = Keyring::new(&[SECRET]).unwrap();
    let m = loopback_master(MasterConfig { cluster_secret: Some(keyring.clone()), ..Default::default() });
    let addr = m.fast_rpc_addr.unwrap();

    // No token, a wrong secret's token: refused at the hello, then closed.
    let wrong = access::client_token(&Keyring::new(&["ffffffffffffffffffffffffffffffff"]).unwrap(), "default");
    for auth in [String::new(), format!("Bearer {wrong}")] {
        let (mut s, (tag, body)) = raw(addr, &auth);
        assert_eq!(tonic::Code::from(tag as i32), tonic::Code::Unauthenticated, "{}", String::from_utf8_lossy(&body));
        let _ = s.write_all(&exists_frame("k"));
        assert!(reply(&mut s).is_none(), "a refused connection is closed");
    }
    // A request instead of a hello: refused.
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&exists_frame("k")).unwrap();
    let (tag, _) = reply(&mut s).expect("an answer");
    assert_eq!(tonic::Code::from(tag as i32), tonic::Code::InvalidArgument);

    // With the token: calls are served; an unknown one is an error and the connection lives on.
    let token = format!("Bearer {}", access::client_token(&keyring, "default"));
    let (mut s, (tag, _)) = raw(addr, &token);
    assert_eq!(tag, fastrpc::OK);
    s.write_all(&fastrpc::frame(200, b"")).unwrap();
    let (tag, _) = reply(&mut s).unwrap();
    assert_eq!(tonic::Code::from(tag as i32), tonic::Code::Unimplemented);
    s.write_all(&exists_frame("k")).unwrap();
    let (tag, body) = reply(&mut s).unwrap();
    assert_eq!(tag, fastrpc::OK);
    assert!(!ExistsReply::decode(body.as_slice()).unwrap().exists);
    // Garbage where a request should be: an error, not a crash.
    s.write_all(&fastrpc::frame(Method::PutStart as u8, &[0xff; 7])).unwrap();
    let (tag, _) = reply(&mut s).unwrap();
    assert_eq!(tonic::Code::from(tag as i32), tonic::Code::InvalidArgument);
    // A frame announcing 4 GiB: the connection is closed at once, nothing allocated for it.
    s.write_all(&[b'C', b'F', 1, Method::Exists as u8, 0xff, 0xff, 0xff, 0xff]).unwrap();
    assert!(reply(&mut s).is_none(), "an oversized frame closes the connection");
    // Another protocol's bytes (gRPC's HTTP/2 preface): closed.
    let (mut s, _) = raw(addr, &token);
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").unwrap();
    assert!(reply(&mut s).is_none(), "a frame of another protocol closes the connection");

    // An owner stream whose hello is garbage, or names a segment nobody mounted: refused
    // with the code gRPC's stream gives, and closed.
    for (hello, code) in [
        (fastrpc::frame(Method::OwnerStream as u8, &[0xff; 5]), tonic::Code::InvalidArgument),
        (
            fastrpc::message_frame(
                Method::OwnerStream as u8,
                &OwnerAck { client_id: "raw".into(), term: 1, acked: 0, segment_id: 77 },
            ),
            tonic::Code::FailedPrecondition,
        ),
    ] {
        let (mut s, _) = raw(addr, &token);
        s.write_all(&hello).unwrap();
        let (tag, body) = reply(&mut s).expect("an answer");
        assert_eq!(tonic::Code::from(tag as i32), code, "{}", String::from_utf8_lossy(&body));
        assert!(reply(&mut s).is_none(), "a refused stream is closed");
    }
    assert_eq!(m.master.metrics().fast_rpc_owner_streams.get(), 0);

    // The master goes on serving, the real client's calls included.
    let c = client(&m, Some(SECRET));
    until_fast(&m, &c, fast_calls(&m) + 1);
}

#[test]
fn a_holders_owner_stream_moves_to_the_fast_port_and_carries_its_commits() {
    let m = loopback_master(MasterConfig::default());
    let holder = client(&m, None);
    let streams = || m.master.metrics().fast_rpc_owner_streams.get();
    let until = Instant::now() + Duration::from_secs(20);
    while streams() == 0 {
        assert!(Instant::now() < until, "the holder's owner stream never reached the fast port");
        std::thread::sleep(Duration::from_millis(20));
    }
    // A writer without a segment puts into the holder: each put's holder is told at its start
    // and acknowledges on that stream; every put commits and reads back, from either client.
    let writer = StoreClient::connect(ClientConfig {
        global_segment_size: 0,
        local_buffer_size: 16 << 20,
        ..loopback_client_config(&m)
    })
    .unwrap();
    until_fast(&m, &writer, fast_calls(&m) + 1);
    let checksums = || m.master.metrics().rpc_latency.with_label_values(&["PutChecksum"]).get_sample_count();
    let blanks = || m.master.metrics().blanks_committed.get();
    let (before, blanks_before) = (checksums(), blanks());
    for i in 0..20u64 {
        let v = pattern_bytes(512 << 10, i);
        writer.put(&format!("s{i}"), &v).unwrap();
        assert_eq!(holder.get(&format!("s{i}")).unwrap(), v);
    }
    // Each put's checksum went right behind its start, taken while the master placed it; or
    // the put went into a blank the master granted ahead (its commit carries the checksum).
    let (started, in_blanks) = (checksums() - before, blanks() - blanks_before);
    assert_eq!(started + in_blanks, 20, "one PutChecksum per put started at the master");
    assert!(started >= 2, "the first puts of a size start at the master");
    // A small value's start carries it (cheaper to take than a second frame).
    for i in 0..20u64 {
        let v = pattern_bytes(64 << 10, i);
        writer.put(&format!("t{i}"), &v).unwrap();
        assert_eq!(holder.get(&format!("t{i}")).unwrap(), v);
    }
    assert_eq!(checksums() - before, started, "no PutChecksum for 64 KiB values");
    assert_eq!(streams(), 1, "one stream, kept");
    // A removal is answered once the holder acknowledged it on that stream.
    writer.put("gone", &pattern_bytes(4096, 99)).unwrap();
    writer.remove("gone").unwrap();
    assert!(!holder.exists("gone").unwrap());
}
