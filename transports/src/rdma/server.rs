//! The target's side of the queue-pair exchange: for each initiator's control connection,
//! one queue pair per lane it asks for, connected to the initiator's; all of them are
//! destroyed when the connection closes or falls silent.

use std::collections::HashMap;
use std::io;
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::peer::KEEPALIVE;
use super::qp::Qp;
use super::wire::{Message, QpInfo, WireError};
use super::Shared;

/// Control connections served at once.
pub const MAX_CONNECTIONS: usize = 256;
/// Queue pairs one initiator may hold.
pub const MAX_QPS_PER_CONNECTION: usize = 1024;
/// An initiator silent for this long (it pings every second) is considered gone.
const SILENCE_LIMIT: Duration = Duration::from_secs(10);

pub(crate) fn accept_loop(shared: Arc<Shared>, listener: TcpListener) {
    let active = Arc::new(AtomicUsize::new(0));
    for stream in listener.incoming() {
        if shared.is_stopping() {
            return;
        }
        let Ok(stream) = stream else { continue };
        if active.load(Ordering::Acquire) >= MAX_CONNECTIONS {
            tracing::warn!("rdma: {MAX_CONNECTIONS} control connections open, refusing one more");
            continue;
        }
        active.fetch_add(1, Ordering::AcqRel);
        let (shared, active) = (shared.clone(), active.clone());
        let spawned = std::thread::Builder::new().name("crescent-rdma-ctl".into()).spawn(move || {
            let peer = stream.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "?".into());
            match serve(&shared, stream) {
                Ok(()) => tracing::debug!("rdma: control connection from {peer} closed"),
                Err(e) => tracing::info!("rdma: dropping control connection from {peer}: {e}"),
            }
            active.fetch_sub(1, Ordering::AcqRel);
        });
        if let Err(e) = spawned {
            tracing::error!("rdma: cannot start a control connection thread: {e}");
        }
    }
}

fn serve(shared: &Shared, mut stream: TcpStream) -> Result<(), WireError> {
    stream.set_nodelay(true)?;
    // Short reads so the stop flag is seen; silence is measured across them.
    stream.set_read_timeout(Some(KEEPALIVE))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut qps: HashMap<u32, Qp> = HashMap::new();
    let mut last_heard = Instant::now();
    loop {
        if shared.is_stopping() {
            return Ok(());
        }
        let msg = match Message::read_from(&mut stream) {
            Ok(m) => m,
            Err(WireError::Closed) => return Ok(()),
            // Only between messages: a timeout inside one is waited out by `read_from`.
            Err(WireError::Idle) => {
                if last_heard.elapsed() >= SILENCE_LIMIT {
                    return Err(WireError::Io(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("initiator silent for {SILENCE_LIMIT:?}"),
                    )));
                }
                continue;
            }
            Err(e) => return Err(e),
        };
        last_heard = Instant::now();
        match msg {
            Message::Ping => Message::Pong.write_to(&mut stream)?,
            Message::Connect { slot, target_device, initiator_device, qp } => {
                let reply = if qps.len() >= MAX_QPS_PER_CONNECTION && !qps.contains_key(&slot) {
                    Message::Reject { reason: format!("{MAX_QPS_PER_CONNECTION} queue pairs per initiator at most") }
                } else if let Err(reason) = shared.begin_use() {
                    Message::Reject { reason }
                } else {
                    match accept(shared, &target_device, &qp) {
                        Ok(local) => {
                            let info = local.info();
                            tracing::debug!(
                                "rdma: queue pair {} on {target_device} connected to {} on the initiator's {initiator_device} (slot {slot})",
                                local.qpn,
                                qp.qpn
                            );
                            // Replaces (destroys) the queue pair of a rebuilt lane.
                            qps.insert(slot, local);
                            Message::Accept { slot, qp: info }
                        }
                        Err(reason) => Message::Reject { reason },
                    }
                };
                reply.write_to(&mut stream)?;
            }
            other => {
                let kind = format!("{other:?}");
                let _ = Message::Reject { reason: format!("unexpected {kind}") }.write_to(&mut stream);
                return Err(WireError::Malformed("unexpected message from an initiator"));
            }
        }
    }
}

fn accept(shared: &Shared, device: &str, remote: &QpInfo) -> Result<Qp, String> {
    let dev = shared.devices.iter().find(|d| d.name == device).ok_or_else(|| format!("no device {device} here"))?;
    let qp = Qp::create(dev, 1)?;
    qp.to_init()?;
    qp.to_rtr(remote)?;
    qp.to_rts(remote, shared.timing)?;
    Ok(qp)
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn a_message_split_by_a_pause_longer_than_the_read_timeout_keeps_the_connection() {
        let shared = Shared::without_devices();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            serve(&shared, stream)
        });
        let mut client = TcpStream::connect(addr).unwrap();
        client.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        // Half a header, then a pause over the server's read timeout (KEEPALIVE), then the rest.
        // The pause stays well inside the time the server gives a begun message
        // (MESSAGE_TIMEOUT): seconds to spare for this thread's wake-up on a loaded host.
        let pause = KEEPALIVE * 2;
        assert!(pause + Duration::from_secs(3) <= super::super::wire::MESSAGE_TIMEOUT);
        let ping = Message::Ping.encode();
        client.write_all(&ping[..6]).unwrap();
        std::thread::sleep(pause);
        client.write_all(&ping[6..]).unwrap();
        assert_eq!(Message::read_from(&mut client).unwrap(), Message::Pong, "the split ping is answered");
        // Still in step: the next message is understood as well.
        Message::Ping.write_to(&mut client).unwrap();
        assert_eq!(Message::read_from(&mut client).unwrap(), Message::Pong);
        drop(client);
        assert!(server.join().unwrap().is_ok(), "the initiator closed; no error");
    }
}
