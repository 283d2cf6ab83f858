//! The wire of a segment owner's stream from the master (the news of what its segment holds,
//! see [`super::master_link`]): gRPC's `OwnerStream`, or a connection of its own to the
//! master's fast RPC port ([`Method::OwnerStream`]) where the master advertised one. A put
//! started with a checksum has its holders told at once and its commit needs their
//! acknowledgement; when the bytes move faster than that news and its answer (small values),
//! they are on the put's path. On the fast port each is one frame, read and written by a task
//! of this runtime, instead of an HTTP/2 stream message with its connection's tasks on both
//! sides.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use prost::Message;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::fastrpc::FastRpc;
use super::rpc::Client;
use crate::fastrpc::{self, Method, OK};
use crate::proto::{OwnerAck, OwnerNews};
use crate::protocol::MAX_MESSAGE;

/// How long the master may take to open a stream.
const OPEN_TIMEOUT: Duration = Duration::from_secs(5);
/// A frame, once its first byte arrived, must be whole within this; an acknowledgement must
/// be taken by the master within it.
const FRAME_DEADLINE: Duration = Duration::from_secs(10);

/// An open owner stream: its news as they come, and where acknowledgements go.
pub(super) struct NewsStream {
    news: News,
    acks: UnboundedSender<OwnerAck>,
}

enum News {
    Grpc(Box<tonic::Streaming<OwnerNews>>),
    /// Frames from the fast port, read by a task of their own: a frame read halfway must not
    /// be lost when the caller's `select!` drops its wait.
    Fast {
        rx: UnboundedReceiver<Result<OwnerNews, String>>,
        _reader: AbortOnDrop,
        port: SocketAddr,
    },
}

impl NewsStream {
    /// Opens the stream over gRPC; `first` is its hello.
    pub async fn grpc(grpc: &mut Client, first: OwnerAck) -> Result<NewsStream, String> {
        let (acks, rx) = unbounded_channel::<OwnerAck>();
        acks.send(first).map_err(|e| e.to_string())?;
        let opened = tokio::time::timeout(OPEN_TIMEOUT, grpc.owner_stream(UnboundedReceiverStream::new(rx)))
            .await
            .map_err(|_| "the master did not open the stream in time".to_string())?
            .map_err(|s| s.message().to_string())?;
        Ok(NewsStream { news: News::Grpc(Box::new(opened.into_inner())), acks })
    }

    /// Opens the stream on a connection of its own to the master's fast port; `first` is its
    /// hello. An error where the port cannot be reached or refuses the stream (a master that
    /// does not serve streams there): the caller then opens it over gRPC.
    pub async fn fast(fast: Arc<FastRpc>, first: OwnerAck) -> Result<NewsStream, String> {
        let port = fast.addr();
        let opened = move || fast.open_owner_stream(&first).map_err(|s| s.message().to_string());
        let conn = tokio::task::spawn_blocking(opened).await.map_err(|e| e.to_string())??;
        conn.set_nonblocking(true).map_err(|e| e.to_string())?;
        let (mut rd, mut wr) = tokio::net::TcpStream::from_std(conn).map_err(|e| e.to_string())?.into_split();
        let (news_tx, news_rx) = unbounded_channel();
        let reader = tokio::spawn(async move {
            loop {
                let news = match fastrpc::read_frame(&mut rd, None, FRAME_DEADLINE, MAX_MESSAGE).await {
                    Ok(Some((OK, body))) => OwnerNews::decode(body.as_slice()).map_err(|e| format!("bad news: {e}")),
                    Ok(Some((tag, body))) => Err(fastrpc::reply_status(tag, &body)
                        .map_or_else(|| format!("a frame of tag {tag}"), |s| s.message().to_string())),
                    Ok(None) => return, // closed: the receiver sees the end
                    Err(e) => Err(e),
                };
                let failed = news.is_err();
                if news_tx.send(news).is_err() || failed {
                    return;
                }
            }
        });
        let (acks, mut acks_rx) = unbounded_channel::<OwnerAck>();
        tokio::spawn(async move {
            // Ends when the stream is dropped (its sender goes) or the master stops taking them.
            while let Some(ack) = acks_rx.recv().await {
                let frame = fastrpc::message_frame(Method::OwnerStream as u8, &ack);
                match tokio::time::timeout(FRAME_DEADLINE, wr.write_all(&frame)).await {
                    Ok(Ok(())) => {}
                    _ => return,
                }
            }
        });
        Ok(NewsStream { news: News::Fast { rx: news_rx, _reader: AbortOnDrop(reader), port }, acks })
    }

    /// The fast port this stream runs on, if it does.
    pub fn fast_port(&self) -> Option<SocketAddr> {
        match &self.news {
            News::Grpc(_) => None,
            News::Fast { port, .. } => Some(*port),
        }
    }

    /// The next news; `None` where the master closed the stream. Cancel-safe.
    pub async fn message(&mut self) -> Result<Option<OwnerNews>, String> {
        match &mut self.news {
            News::Grpc(s) => s.message().await.map_err(|s| s.message().to_string()),
            News::Fast { rx, .. } => rx.recv().await.transpose(),
        }
    }

    /// Sends an acknowledgement; an error where the stream is gone.
    pub fn ack(&self, ack: OwnerAck) -> Result<(), String> {
        self.acks.send(ack).map_err(|_| "the stream is closed".to_string())
    }
}

/// A task that ends when this is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
