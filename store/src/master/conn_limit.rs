//! Connections to the master's gRPC port, bounded in total and per peer address, so that one
//! peer (or a flood of them) cannot take every descriptor and lock the other clients out.
//! A connection over a bound is closed right after `accept`. Each admitted connection carries
//! its slot; the slot is given back when the connection is dropped, however it ends.
//!
//! [`Gate::incoming`] is the accept loop: an accept that fails (out of descriptors) waits and
//! tries again. tonic's own loop ends the server on such an error, for good.

use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use crescent_transports::net::serve::PeerCounts;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// Connections the master serves at once, from everyone.
pub const MAX_CONNECTIONS: usize = 8192;
/// Connections the master serves at once from one address. A store client holds two (calls
/// and streams); many clients on one host share its address.
pub const MAX_CONNECTIONS_PER_PEER: usize = 512;
/// How long the accept loop waits after an accept failed for want of resources (descriptors,
/// memory) before it tries again; connections wait in the listen backlog meanwhile.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The admission of connections under the two bounds.
pub struct Gate {
    max_total: usize,
    max_per_peer: usize,
    counts: Mutex<PeerCounts<IpAddr>>,
}

impl Gate {
    /// A gate admitting `max_total` connections at once, `max_per_peer` of them from one address.
    pub fn new(max_total: usize, max_per_peer: usize) -> Arc<Gate> {
        Arc::new(Gate { max_total, max_per_peer, counts: Mutex::new(PeerCounts::default()) })
    }

    /// The connection with its slot, or `None` (it is dropped: closed) over a bound.
    pub fn admit(self: &Arc<Self>, stream: TcpStream) -> Option<Admitted> {
        let peer = stream.peer_addr().ok()?.ip().to_canonical();
        let mut c = self.counts.lock();
        let (total, of_peer) = (c.total(), c.of(&peer));
        if total >= self.max_total || of_peer >= self.max_per_peer {
            tracing::warn!(
                "master: refusing a connection from {peer}: {total} open ({of_peer} from it; at most {} and {} per peer)",
                self.max_total,
                self.max_per_peer
            );
            return None;
        }
        c.add(peer);
        Some(Admitted { stream, slot: Slot { gate: self.clone(), peer } })
    }

    /// The admitted connections of `listener`, as tonic's `serve_with_incoming` takes them
    /// (each with `TCP_NODELAY` set to `nodelay`). The accept loop is a task of the current
    /// runtime; it ends when the stream is dropped (at its next connection) or the runtime stops.
    pub fn incoming(self: &Arc<Self>, listener: TcpListener, nodelay: bool) -> ReceiverStream<io::Result<Admitted>> {
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let gate = self.clone();
        tokio::spawn(async move {
            loop {
                let stream = match listener.accept().await {
                    Ok((s, _)) => s,
                    Err(e) if is_transient(&e) => continue,
                    Err(e) => {
                        tracing::warn!(
                            "master: accepting a connection failed ({e}); trying again in {ACCEPT_BACKOFF:?}"
                        );
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(nodelay);
                if let Some(a) = gate.admit(stream) {
                    if tx.send(Ok(a)).await.is_err() {
                        return;
                    }
                }
            }
        });
        ReceiverStream::new(rx)
    }

    /// Connections open now: in total, and from `peer`.
    pub fn open(&self, peer: IpAddr) -> (usize, usize) {
        let c = self.counts.lock();
        (c.total(), c.of(&peer))
    }
}

/// An accept error about that one connection (it went away before `accept`), not the listener.
fn is_transient(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset | io::ErrorKind::Interrupted)
}

struct Slot {
    gate: Arc<Gate>,
    peer: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.gate.counts.lock().remove(&self.peer);
    }
}

/// An admitted connection: the stream, and its slot until it is dropped.
pub struct Admitted {
    stream: TcpStream,
    slot: Slot,
}

impl Admitted {
    /// The address the connection came from (what the per-peer bound counts it under).
    pub fn peer(&self) -> IpAddr {
        self.slot.peer
    }
}

impl Connected for Admitted {
    type ConnectInfo = TcpConnectInfo;
    fn connect_info(&self) -> TcpConnectInfo {
        self.stream.connect_info()
    }
}

impl AsyncRead for Admitted {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Admitted {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_peer_cannot_take_every_slot_and_slots_come_back() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let gate = Gate::new(3, 2);
        let mut admitted = Vec::new();
        let mut refused = 0;
        for _ in 0..3 {
            let _client = TcpStream::connect(addr).await.unwrap();
            let (s, _) = listener.accept().await.unwrap();
            match gate.admit(s) {
                Some(a) => admitted.push((a, _client)),
                None => refused += 1,
            }
        }
        assert_eq!((admitted.len(), refused), (2, 1), "two per peer");
        let peer = admitted[0].0.peer();
        assert_eq!(gate.open(peer), (2, 2));
        admitted.pop();
        assert_eq!(gate.open(peer), (1, 1), "a dropped connection gives its slot back");
    }
}
