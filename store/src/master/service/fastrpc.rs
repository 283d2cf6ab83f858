//! The master's side of the fast RPC wire ([`crate::fastrpc`]): a listener beside gRPC whose
//! connections, once their hello passed the same check as a gRPC call's metadata, carry the
//! hot unary calls one at a time to the very handlers gRPC calls (scoping, metrics and
//! replies are theirs). Connections come through the gRPC port's [`Gate`], so its bounds
//! hold over both ports together; a connection idle for [`IDLE`] is closed, a frame must
//! arrive whole (and a reply be taken) within [`FRAME_DEADLINE`] of its first byte, and a
//! call is answered within the gRPC server's request timeout (a deadline error past it).

use std::sync::Arc;
use std::time::Duration;

use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_stream::StreamExt;
use tonic::metadata::MetadataMap;
use tonic::Request;

use super::{MasterRpc, MasterService, MAX_REQUEST_MESSAGE};
use crate::fastrpc::{self, Method, HEADER, HELLO, MAX_HELLO, OK};
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
        let reply = match tokio::time::timeout(request_timeout, call(service, &tenant, tag, body)).await {
            Ok(reply) => reply,
            Err(_) => fastrpc::status_frame(&tonic::Status::deadline_exceeded("the master's request timeout passed")),
        };
        write(&mut io, &reply).await?;
    }
}

/// Writes a frame, all of it within [`FRAME_DEADLINE`] (a peer that stops reading loses its
/// connection).
async fn write(io: &mut Admitted, frame: &[u8]) -> Result<(), String> {
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

/// The next frame (tag and body), or `None` where the peer closed or idled for `idle` before
/// its first byte; an error for a frame over `max` (before any allocation for it) or one that
/// stalls.
async fn read_frame(io: &mut Admitted, idle: Duration, max: usize) -> Result<Option<(u8, Vec<u8>)>, String> {
    let mut header = [0u8; HEADER];
    let first = match tokio::time::timeout(idle, io.read(&mut header)).await {
        Err(_) | Ok(Ok(0)) => return Ok(None),
        Ok(Ok(n)) => n,
        Ok(Err(e)) => return Err(e.to_string()),
    };
    let rest = async {
        io.read_exact(&mut header[first..]).await?;
        let (len, tag) = fastrpc::parse_header(&header, max).map_err(std::io::Error::other)?;
        let mut body = vec![0u8; len];
        io.read_exact(&mut body).await?;
        Ok::<_, std::io::Error>((tag, body))
    };
    match tokio::time::timeout(FRAME_DEADLINE, rest).await {
        Ok(Ok(frame)) => Ok(Some(frame)),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("a frame not whole within {FRAME_DEADLINE:?}")),
    }
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
        Some(Method::BatchPutStart) => unary!(BatchPutStartRequest, batch_put_start),
        Some(Method::BatchPutEnd) => unary!(BatchKeyRequest, batch_put_end),
        Some(Method::BatchPutRevoke) => unary!(BatchKeyRequest, batch_put_revoke),
        None => fastrpc::status_frame(&tonic::Status::unimplemented(format!("no method of tag {tag} here"))),
    }
}
