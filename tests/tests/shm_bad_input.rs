//! A misbehaving client on the shm socket: requests outside registered memory are refused
//! and the connection goes on; a frame only a target may send closes that connection and
//! no other.

use std::time::Duration;

use crescent_tests::{same_host_engine, shm_socket};
use crescent_transports::shm::socket::Socket;
use crescent_transports::shm::wire::{Frame, Kind, Mode, Status};

fn request(socket: &Socket, frame: Frame) -> Frame {
    socket.send(&frame, None).unwrap();
    socket.recv().unwrap().expect("a reply").0
}

#[test]
fn shm_listener_refuses_bad_requests_and_drops_only_the_offender() {
    let engine = same_host_engine(Duration::from_secs(5));
    let mem = engine.alloc_registered(1 << 20, "cpu:0").unwrap();
    let name = shm_socket(&engine);
    let connect = || {
        let s = Socket::connect(&name, Duration::from_secs(5)).unwrap();
        s.set_recv_timeout(Some(Duration::from_secs(5))).unwrap();
        s
    };
    let map = |id, addr, len| Frame { id, addr, len, ..Frame::new(Kind::Map) };
    let bystander = connect();
    let hello = request(&bystander, Frame::new(Kind::Hello));
    assert_eq!(hello.kind, Kind::HelloReply);

    // Past the end of the region, and memory that was never registered: refused.
    for (id, addr, len) in [(1, mem.addr() + (1 << 20) - 2, 4), (2, 0x1000, 3)] {
        let reply = request(&bystander, map(id, addr, len));
        assert_eq!((reply.kind, reply.status, reply.id), (Kind::MapReply, Status::OutOfRange, id));
    }
    // The same connection is then granted the region, with its memfd.
    bystander.send(&map(3, mem.addr() + 10, 20), None).unwrap();
    let (grant, fd) = bystander.recv().unwrap().unwrap();
    assert_eq!((grant.status, grant.mode), (Status::Ok, Mode::Memfd));
    assert_eq!((grant.addr, grant.len), (mem.addr(), 1 << 20));
    assert!(fd.is_some());

    // A frame only targets send closes the offender's connection.
    let offender = connect();
    let bogus = Frame { region: 1, ..Frame::new(Kind::Revoke) };
    offender.send(&bogus, None).unwrap();
    assert!(matches!(offender.recv(), Ok(None) | Err(_)), "closed");
    // The bystander is still served.
    assert_eq!(request(&bystander, Frame::new(Kind::Hello)).kind, Kind::HelloReply);
}
