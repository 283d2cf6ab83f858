//! The target's side of the queue-pair exchange: for each initiator's control connection,
//! one queue pair per lane it asks for, connected to the initiator's; all of them are
//! destroyed when the connection closes or falls silent.
//!
//! Layer: peers (the layer map is in the [rdma module](super)).

use std::collections::HashMap;
use std::io;
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use super::qp::{Qp, QpInfo};
use super::shared::Shared;
use super::wire::{Message, WireError};
use crate::net::serve::Accepted;
use crate::net::{serve, Limits, Server};

/// Control connections served at once.
pub const MAX_CONNECTIONS: usize = 256;
/// Control connections served at once from one peer address (an initiator needs one).
pub const MAX_CONNECTIONS_PER_PEER: usize = 32;
/// Queue pairs one initiator may hold.
pub const MAX_QPS_PER_CONNECTION: usize = 1024;
/// An initiator silent for this long (it pings every second) is considered gone.
pub const SILENCE_LIMIT: Duration = Duration::from_secs(10);

/// Serves the queue-pair exchange on `listener`.
pub(crate) fn start(shared: Arc<Shared>, listener: TcpListener) -> io::Result<Server> {
    let limits =
        Limits { max_connections: MAX_CONNECTIONS, max_per_peer: MAX_CONNECTIONS_PER_PEER, idle: Some(SILENCE_LIMIT) };
    let guard = shared.config.auth.guard(crate::net::Service::RdmaControl);
    serve("rdma-ctl", listener, limits, guard, move |c: Accepted<TcpStream>| {
        let peer = c.peer.clone();
        match serve_connection(&shared, &c.stream, c.idle) {
            Ok(()) => tracing::debug!("rdma: control connection from {peer} closed"),
            Err(e) => tracing::info!("rdma: dropping control connection from {peer}: {e}"),
        }
    })
}

fn serve_connection(shared: &Shared, stream: &TcpStream, idle: Option<Duration>) -> Result<(), WireError> {
    let _ = stream.set_nodelay(true);
    let mut stream = stream;
    let mut qps: HashMap<u32, Qp> = HashMap::new();
    loop {
        let msg = match Message::read(&mut stream, idle) {
            Ok(m) => m,
            Err(e) if e.is_closed() => return Ok(()),
            Err(e) => return Err(e),
        };
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
            serve_connection(&shared, &stream, Some(SILENCE_LIMIT))
        });
        let mut client = TcpStream::connect(addr).unwrap();
        // Half a header, then a pause over the initiator's keepalive period, then the rest. The
        // pause stays well inside the time the server gives a begun message (MESSAGE_TIMEOUT):
        // seconds to spare for this thread's wake-up on a loaded host.
        let pause = super::super::peer::KEEPALIVE * 2;
        assert!(pause + Duration::from_secs(3) <= super::super::wire::MESSAGE_TIMEOUT);
        let ping = Message::Ping.encode();
        client.write_all(&ping[..6]).unwrap();
        std::thread::sleep(pause);
        client.write_all(&ping[6..]).unwrap();
        assert_eq!(Message::read(&mut client, None).unwrap(), Message::Pong, "the split ping is answered");
        // Still in step: the next message is understood as well.
        Message::Ping.write_to(&mut client).unwrap();
        assert_eq!(Message::read(&mut client, None).unwrap(), Message::Pong);
        drop(client);
        assert!(server.join().unwrap().is_ok(), "the initiator closed; no error");
    }
}
