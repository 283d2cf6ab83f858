//! The master's side of the fast RPC wire ([`crate::fastrpc`]): a listener beside gRPC whose
//! connections, once their hello passed the same check as a gRPC call's metadata, carry the
//! hot unary calls one at a time to the very handlers gRPC calls (scoping, metrics and
//! replies are theirs). Connections come through the gRPC port's [`Gate`], so its bounds
//! hold over both ports together; a connection idle for [`IDLE`] is closed, a frame must
//! arrive whole (and a reply be taken) within [`FRAME_DEADLINE`] of its first byte, and a
//! call is answered within the gRPC server's request timeout (a deadline error past it). A
//! connection may turn into an owner stream instead, attached as gRPC's is.

use std::sync::Arc;
use std::time::Duration;

use prost::Message;
use tokio::io::AsyncWriteExt;
use tokio_stream::StreamExt;
use tonic::metadata::MetadataMap;
use tonic::Request;

use super::{MasterRpc, MasterService, OwnerLink, MAX_REQUEST_MESSAGE};
use crate::fastrpc::{self, Method, HELLO, MAX_HELLO, OK};
use crate::master::access::{Access, Tenant, TENANT_HEADER};
use crate::master::conn_limit::{Admitted, Gate};
use crate::proto::*;

/// A connection with no call for this long is closed (clients drop theirs after half of it).
pub const IDLE: Duration = Duration::from_secs(60);
/// A frame's bytes, once its first arrived, must all arrive within this.
pub const FRAME_DEADLINE: Duration = Duration::from_secs(10);

/// Serves the fast wire on `listener` until the runtime stops: each admitted connection on a
/// task of its own.
pub async fn serve(
    listener: tokio::net::TcpListener,
    gate: Arc<Gate>,
    service: Arc<MasterService>,
    access: Access,
    request_timeout: Duration,
) {
    let mut incoming = gate.incoming(listener, true);
    while let Some(conn) = incoming.next().await {
        let Ok(conn) = conn else { continue };
        let (service, access) = (service.clone(), access.clone());
        tokio::spawn(async move {
            if let Err(why) = connection(conn, &service, &access, request_timeout).await {
                tracing::debug!("fast rpc connection closed: {why}");
            }
        });
    }
}

/// One connection: its hello, then calls until it closes, idles or sends a bad frame.
async fn connection(
    mut io: Admitted,
    service: &MasterService,
    access: &Access,
    request_timeout: Duration,
) -> Result<(), String> {
    let (tag, body) = read_frame(&mut io, FRAME_DEADLINE, MAX_HELLO).await?.ok_or("closed before its hello")?;
    let tenant = match hello(tag, &body, access) {
        Ok(tenant) => tenant,
        Err(status) => {
            let _ = write(&mut io, &fastrpc::status_frame(&status)).await;
            return Err(format!("hello refused: {}", status.message()));
        }
    };
    write(&mut io, &fastrpc::frame(OK, &[])).await?;
    loop {
        let Some((tag, body)) = read_frame(&mut io, IDLE, MAX_REQUEST_MESSAGE).await? else { return Ok(()) };
        if tag == Method::OwnerStream as u8 {
            return owner_stream(io, service, &tenant, &body).await;
        }
        let reply = match tokio::time::timeout(request_timeout, call(service, &tenant, tag, body)).await {
            Ok(reply) => reply,
            Err(_) => fastrpc::status_frame(&tonic::Status::deadline_exceeded("the master's request timeout passed")),
        };
        write(&mut io, &reply).await?;
    }
}

/// The rest of a connection as an owner stream ([`Method::OwnerStream`]) whose hello is
/// `hello`: the news as the master queues them, the acknowledgements as they come, until the
/// owner closes, sends a bad frame or stops taking news, or the master drops the link.
async fn owner_stream(io: Admitted, service: &MasterService, tenant: &Tenant, hello: &[u8]) -> Result<(), String> {
    let (mut rd, mut wr) = tokio::io::split(io);
    let attached = match OwnerAck::decode(hello) {
        Ok(hello) => service.attach_owner_link(tenant, hello),
        Err(e) => Err(tonic::Status::invalid_argument(format!("a bad owner stream hello: {e}"))),
    };
    let OwnerLink { mut news, acks: link } = match attached {
        Ok(link) => link,
        Err(status) => {
            let _ = write(&mut wr, &fastrpc::status_frame(&status)).await;
            return Err(format!("owner stream refused: {}", status.message()));
        }
    };
    let m = &service.master;
    m.metrics().fast_rpc_owner_streams.inc();
    let sent = async {
        write(&mut wr, &fastrpc::frame(OK, &[])).await?;
        while let Some(news) = news.next().await {
            write(&mut wr, &fastrpc::message_frame(OK, &news)).await?;
        }
        Err::<(), _>("the master dropped the link".to_string())
    };
    let acks = async {
        // An owner with nothing to acknowledge sends nothing: no idle bound on the next frame.
        while let Some((tag, body)) = fastrpc::read_frame(&mut rd, None, FRAME_DEADLINE, MAX_ACK).await? {
            if tag != Method::OwnerStream as u8 {
                return Err(format!("a frame of tag {tag} on an owner stream"));
            }
            let ack = OwnerAck::decode(body.as_slice()).map_err(|e| format!("a bad acknowledgement: {e}"))?;
            link.ack(m, &ack);
        }
        Ok(())
    };
    let ended = tokio::select! {
        r = sent => r,
        r = acks => r,
    };
    link.detach(m);
    ended
}

/// Largest acknowledgement frame body (a client id, a few numbers).
const MAX_ACK: usize = 4 << 10;

/// Writes a frame, all of it within [`FRAME_DEADLINE`] (a peer that stops reading loses its
/// connection).
async fn write<W: tokio::io::AsyncWrite + Unpin>(io: &mut W, frame: &[u8]) -> Result<(), String> {
    match tokio::time::timeout(FRAME_DEADLINE, io.write_all(frame)).await {
        Ok(written) => written.map_err(|e| e.to_string()),
        Err(_) => Err(format!("a reply not taken within {FRAME_DEADLINE:?}")),
    }
}

/// The tenant a hello names, checked as a gRPC call's metadata is.
#[allow(clippy::result_large_err)] // tonic's Status, as gRPC's check returns it
fn hello(tag: u8, body: &[u8], access: &Access) -> Result<Tenant, tonic::Status> {
    if tag != HELLO {
        return Err(tonic::Status::invalid_argument("the first frame is not a hello"));
    }
    let (authorization, tenant) = fastrpc::parse_hello(body).map_err(tonic::Status::invalid_argument)?;
    let mut metadata = MetadataMap::new();
    let mut put = |name: &'static str, value: &str| {
        if !value.is_empty() {
            let value = value.parse().map_err(|_| tonic::Status::invalid_argument(format!("a bad {name} value")))?;
            metadata.insert(name, value);
        }
        Ok::<_, tonic::Status>(())
    };
    put("authorization", authorization)?;
    put(TENANT_HEADER, tenant)?;
    access.check_call(&metadata)
}

/// The next frame of a connection, as [`fastrpc::read_frame`] reads it with `idle` and
/// [`FRAME_DEADLINE`].
async fn read_frame(io: &mut Admitted, idle: Duration, max: usize) -> Result<Option<(u8, Vec<u8>)>, String> {
    fastrpc::read_frame(io, Some(idle), FRAME_DEADLINE, max).await
}

/// One call: the request decoded, handed to the gRPC handler of its method under `tenant`,
/// and its reply (or status) framed.
async fn call(service: &MasterService, tenant: &Tenant, tag: u8, body: Vec<u8>) -> Vec<u8> {
    service.master.metrics().fast_rpc_calls.inc();
    macro_rules! unary {
        ($req:ty, $handler:ident) => {{
            match <$req>::decode(body.as_slice()) {
                Ok(r) => {
                    let mut req = Request::new(r);
                    req.extensions_mut().insert(tenant.clone());
                    match service.$handler(req).await {
                        Ok(reply) => fastrpc::message_frame(OK, reply.get_ref()),
                        Err(status) => fastrpc::status_frame(&status),
                    }
                }
                Err(e) => fastrpc::status_frame(&tonic::Status::invalid_argument(format!("a bad request: {e}"))),
            }
        }};
    }
    match Method::from_tag(tag) {
        Some(Method::Exists) => unary!(KeyRequest, exists),
        Some(Method::BatchExists) => unary!(BatchKeyRequest, batch_exists),
        Some(Method::GetReplicaList) => unary!(KeyRequest, get_replica_list),
        Some(Method::BatchGetReplicaList) => unary!(BatchKeyRequest, batch_get_replica_list),
        Some(Method::PutStart) => unary!(PutStartRequest, put_start),
        Some(Method::PutEnd) => unary!(KeyRequest, put_end),
        Some(Method::PutRevoke) => unary!(KeyRequest, put_revoke),
        Some(Method::PutChecksum) => unary!(KeyRequest, put_checksum),
        Some(Method::GrantBlanks) => unary!(GrantBlanksRequest, grant_blanks),
        Some(Method::PutCommitBlank) => unary!(PutCommitBlankRequest, put_commit_blank),
        Some(Method::BatchPutStart) => unary!(BatchPutStartRequest, batch_put_start),
        Some(Method::BatchPutEnd) => unary!(BatchKeyRequest, batch_put_end),
        Some(Method::BatchPutRevoke) => unary!(BatchKeyRequest, batch_put_revoke),
        // An owner stream is opened only by a connection's first call (see `connection`).
        Some(Method::OwnerStream) | None => {
            fastrpc::status_frame(&tonic::Status::unimplemented(format!("no method of tag {tag} here")))
        }
    }
}
