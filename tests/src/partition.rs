//! A network partition between one process and a service, made with a relay the test holds:
//! the process is given the relay's address instead of the service's, and [`Partition::cut`]
//! stops the relay moving bytes either way. Connections stay open and nothing is refused —
//! a black hole, as a cable pulled between two switches, not a reset — and
//! [`Partition::heal`] lets what waited flow on. Used where the process shares the test's
//! network namespace with others that must keep reaching the service (e.g. one master of
//! several cut off from etcd while the clients still reach it).

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How often a stopped relay thread looks again.
const POLL: Duration = Duration::from_millis(20);

/// A relay on loopback to one service address.
pub struct Partition {
    addr: SocketAddr,
    cut: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
}

impl Partition {
    /// Relays connections to `target` (healed) on a free loopback port.
    pub fn start(target: SocketAddr) -> Partition {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port for the relay");
        listener.set_nonblocking(true).expect("a non-blocking listener");
        let addr = listener.local_addr().expect("the relay's address");
        let (cut, stop) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        let (c, s) = (cut.clone(), stop.clone());
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let Ok(service) = TcpStream::connect_timeout(&target, Duration::from_secs(2)) else {
                            continue; // the service is down: so is the relayed connection
                        };
                        for (from, to) in [(&client, &service), (&service, &client)] {
                            let (from, to) = (from.try_clone().expect("clone"), to.try_clone().expect("clone"));
                            let (c, s) = (c.clone(), s.clone());
                            std::thread::spawn(move || pump(from, to, &c, &s));
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(POLL),
                    Err(_) => std::thread::sleep(POLL),
                }
            }
        });
        Partition { addr, cut, stop }
    }

    /// Where the process is to connect instead of the service.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// No byte moves either way until [`Self::heal`]; connections stay open.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::Relaxed);
    }

    pub fn heal(&self) {
        self.cut.store(false, Ordering::Relaxed);
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Moves bytes `from` → `to` while not cut; while cut, reads nothing (the sender's bytes wait
/// in the kernel's buffers, then its window closes). Ends when either side closes or the
/// relay stops.
fn pump(mut from: TcpStream, mut to: TcpStream, cut: &AtomicBool, stop: &AtomicBool) {
    let _ = from.set_read_timeout(Some(POLL * 5));
    let mut buf = vec![0u8; 64 << 10];
    while !stop.load(Ordering::Relaxed) {
        if cut.load(Ordering::Relaxed) {
            std::thread::sleep(POLL);
            continue;
        }
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
    let _ = to.shutdown(Shutdown::Write);
    let _ = from.shutdown(Shutdown::Read);
}
