//! The embedded P2P handshake: a peer asks this engine's listener for its segment
//! descriptor, so no metadata service is needed (`P2PHANDSHAKE`).
//!
//! Its messages are [`crate::handshake_wire`]'s (re-exported here). It runs on the net layer's
//! accept loop: [`MAX_CONNECTIONS`] at once, [`MAX_CONNECTIONS_PER_PEER`] from one address, and
//! closes a connection idle for [`IO_TIMEOUT`].

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use crescent_transports::net::serve::Accepted;
use crescent_transports::net::{serve, Auth, FrameError, Limits, Server, Service};

use crate::descriptor::SegmentDescriptor;
use crate::error::{EngineError, Result};
use crate::handshake_wire::connect;
pub use crate::handshake_wire::{
    read_message, read_message_within, split_host_port, write_message, MessageKind, WireError, FORMAT, HEADER_LEN,
    IO_TIMEOUT, MAGIC, MAX_REPLY, MAX_REQUEST, VERSION,
};
use crate::notify::NotifyQueue;

/// Connections the server holds at once.
pub const MAX_CONNECTIONS: usize = 256;
/// Connections the server holds at once from one address.
pub const MAX_CONNECTIONS_PER_PEER: usize = 32;

/// Serves descriptors (and takes notifications) on the engine's handshake port until dropped.
pub struct HandshakeServer {
    addr: SocketAddr,
    _server: Server,
}

impl HandshakeServer {
    /// `describe` builds the current descriptor (JSON) for each request; notifications go
    /// to `notifies`.
    /// Peers authenticate with `auth`'s secret before any request is read.
    pub fn start(
        listener: TcpListener,
        auth: &Auth,
        describe: Arc<dyn Fn() -> Vec<u8> + Send + Sync>,
        notifies: Arc<NotifyQueue>,
    ) -> Result<Self> {
        let addr = listener.local_addr()?;
        let limits =
            Limits { max_connections: MAX_CONNECTIONS, max_per_peer: MAX_CONNECTIONS_PER_PEER, idle: Some(IO_TIMEOUT) };
        let server =
            serve("handshake", listener, limits, auth.guard(Service::Handshake), move |c: Accepted<TcpStream>| {
                if let Err(e) = serve_connection(&c.stream, describe.as_ref(), &notifies) {
                    tracing::info!("handshake: dropping connection from {}: {e}", c.peer);
                }
            })?;
        Ok(HandshakeServer { addr, _server: server })
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }
}

fn serve_connection(
    stream: &TcpStream,
    describe: &(dyn Fn() -> Vec<u8> + Send + Sync),
    notifies: &NotifyQueue,
) -> Result<(), WireError> {
    let mut stream = stream;
    loop {
        let (kind, payload) = match read_message(&mut stream, MAX_REQUEST) {
            Err(WireError::Frame(FrameError::Closed | FrameError::Idle(_))) => return Ok(()),
            other => other?,
        };
        match kind {
            MessageKind::GetDescriptor => write_message(&mut stream, MessageKind::Descriptor, &describe())?,
            MessageKind::Notify => write_message(&mut stream, MessageKind::NotifyAck, &[notifies.receive(&payload)])?,
            other => {
                let msg = format!("unexpected handshake request {other:?}");
                write_message(&mut stream, MessageKind::Error, msg.as_bytes())?;
                return Err(WireError::Kind(other as u8));
            }
        }
    }
}

/// Asks the engine at `name` (`host:port`) for its descriptor, authenticating with `auth`.
pub fn fetch_descriptor(name: &str, timeout: Duration, auth: &Auth) -> Result<SegmentDescriptor> {
    let unreachable = |reason: String| EngineError::SegmentUnreachable { name: name.to_string(), reason };
    let mut stream = connect(name, name, timeout, auth)?;
    let timed_out = || EngineError::PeerTimedOut { peer: name.to_string(), waited: timeout, what: "the descriptor" };
    match write_message(&mut stream, MessageKind::GetDescriptor, name.as_bytes()) {
        Ok(()) => {}
        Err(WireError::Frame(e)) if e.is_timeout() => return Err(timed_out()),
        Err(e) => return Err(unreachable(format!("sending the request: {e}"))),
    }
    let bad = |reason: String| EngineError::BadPeerReply { peer: name.to_string(), reason };
    match read_message_within(&mut stream, MAX_REPLY, timeout) {
        Ok((MessageKind::Descriptor, payload)) => SegmentDescriptor::from_json(&payload).map_err(bad),
        Ok((MessageKind::Error, payload)) => Err(bad(String::from_utf8_lossy(&payload).into_owned())),
        Ok((kind, _)) => Err(bad(format!("unexpected reply {kind:?}"))),
        Err(WireError::Frame(e)) if e.is_timeout() => Err(timed_out()),
        Err(WireError::Frame(FrameError::Closed)) => Err(unreachable(if auth.is_required() {
            "it closed the connection without answering (too many connections?)".into()
        } else {
            // A listener with a cluster secret closes a connection that does not open with
            // the authentication exchange: say so, since this engine has no secret.
            "it closed the connection without answering: it may require the cluster secret, which this engine \
             lacks (CRESCENT_CLUSTER_SECRET or CRESCENT_CLUSTER_SECRET_FILE), or have too many connections"
                .into()
        })),
        Err(e) => Err(bad(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_that_never_answers_is_reported_as_a_timeout() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let name = format!("127.0.0.1:{}", listener.local_addr().unwrap().port());
        let holder = std::thread::spawn(move || {
            let (conn, _) = listener.accept().unwrap();
            std::thread::sleep(Duration::from_secs(3));
            drop(conn);
        });
        let err = fetch_descriptor(&name, Duration::from_millis(300), &Auth::open()).unwrap_err();
        assert!(matches!(err, EngineError::PeerTimedOut { .. }), "{err}");
        assert!(err.to_string().contains(&format!("waiting for the descriptor of {name}")), "{err}");
        holder.join().unwrap();
    }

    #[test]
    fn an_engine_without_the_secret_is_told_the_peer_may_require_it() {
        let secret =
            Auth::new(Some(crescent_transports::net::Keyring::new(&["0123456789abcdef0123456789abcdef"]).unwrap()));
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let server =
            HandshakeServer::start(listener, &secret, Arc::new(|| b"{}".to_vec()), Arc::new(NotifyQueue::default()))
                .unwrap();
        let name = format!("127.0.0.1:{}", server.port());
        let err = fetch_descriptor(&name, Duration::from_secs(10), &Auth::open()).unwrap_err();
        assert!(matches!(err, EngineError::SegmentUnreachable { .. }), "{err}");
        assert!(err.to_string().contains("cluster secret"), "the error names the likely cause: {err}");
    }
}
