//! The owner stream of the client's disk: the master's removals of objects with a copy on
//! this client's disk, applied at once and acknowledged (see the master's `disk` module).
//!
//! The master opens an owner link for every mounted disk, as for a memory segment: news
//! numbered from 1 per mount, acknowledged cumulatively, sent again after a reconnect. A disk's
//! news are drops only: `(key, version)` — the file of `key`, if it holds `version` or older,
//! is deleted, and a write of it still in flight is doomed ([`DiskTier::apply_owner_removal`])
//! before the acknowledgement goes. A removal is answered after that acknowledgement, so a
//! removed object's file can no longer come back at a new master (it would otherwise need a
//! removal record: the master's `removal_records`). The same removals still come on pings
//! too, until the file's deletion is announced (the path for a master without disk links).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio_stream::wrappers::UnboundedReceiverStream;

use super::disk::DiskTier;
use super::rpc::MasterRpc;
use crate::proto::{Code, OwnerAck};

/// How often an open stream checks whether the disk's mount changed or the client stopped.
const MOUNT_CHECK: Duration = Duration::from_millis(100);
/// Pause before opening the stream again after it failed or closed.
const STREAM_RETRY: Duration = Duration::from_millis(50);
/// Pause when the master keeps no link for this disk (an older master, or a mount it lost).
const NO_LINK_RETRY: Duration = Duration::from_secs(1);

/// The disk's mount at the master: its segment and the master's term (the stream is about
/// that mount; 0 while not mounted).
#[derive(Default)]
pub(crate) struct DiskMount {
    pub segment_id: Arc<AtomicU64>,
    pub term: AtomicU64,
}

/// Keeps the disk's owner stream open while the client runs (until `stop`).
pub(crate) async fn run(
    rpc: Weak<MasterRpc>,
    tier: Weak<DiskTier>,
    client_id: String,
    mount: Arc<DiskMount>,
    stop: Arc<AtomicBool>,
) {
    // (segment, term) of the news applied so far, and the last one applied.
    let mut applied = (0, 0, 0);
    loop {
        if stop.load(Ordering::Acquire) {
            return;
        }
        let Some(mut grpc) = rpc.upgrade().map(|r| r.client()) else { return };
        let at = (mount.segment_id.load(Ordering::Acquire), mount.term.load(Ordering::Acquire));
        if at.0 == 0 {
            tokio::time::sleep(STREAM_RETRY).await;
            continue;
        }
        if (applied.0, applied.1) != at {
            applied = (at.0, at.1, 0);
        }
        let pause = match stream(&mut grpc, &tier, &client_id, &mount, &stop, at, &mut applied.2).await {
            Ok(()) => STREAM_RETRY,
            Err(s) => {
                tracing::debug!("owner stream of disk segment {} (term {}): {}", at.0, at.1, s.message());
                // The master answers a stream it keeps no link for with the code's name first.
                if s.message().starts_with(Code::NeedRemount.as_str_name()) {
                    NO_LINK_RETRY
                } else {
                    STREAM_RETRY
                }
            }
        };
        tokio::time::sleep(pause).await;
    }
}

/// One stream, until it fails, the mount changes or the client stops.
async fn stream(
    grpc: &mut super::rpc::Client,
    tier: &Weak<DiskTier>,
    client_id: &str,
    mount: &DiskMount,
    stop: &AtomicBool,
    (segment_id, term): (u64, u64),
    acked: &mut u64,
) -> Result<(), tonic::Status> {
    let plain = |e: String| tonic::Status::unavailable(e);
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<OwnerAck>();
    let ack = |acked| OwnerAck { client_id: client_id.to_string(), term, acked, segment_id };
    tx.send(ack(*acked)).map_err(|e| plain(e.to_string()))?;
    let opened = tokio::time::timeout(Duration::from_secs(5), grpc.owner_stream(UnboundedReceiverStream::new(rx)))
        .await
        .map_err(|_| plain("the master did not open the stream in time".into()))??;
    let mut news = opened.into_inner();
    loop {
        let next = tokio::select! {
            n = news.message() => n,
            () = tokio::time::sleep(MOUNT_CHECK) => {
                let now = (mount.segment_id.load(Ordering::Acquire), mount.term.load(Ordering::Acquire));
                if stop.load(Ordering::Acquire) || now != (segment_id, term) {
                    return Ok(());
                }
                continue;
            }
        };
        let n = match next {
            Ok(Some(n)) => n,
            Ok(None) => return Err(plain("closed by the master".into())),
            Err(s) => return Err(s),
        };
        if n.term != term {
            return Ok(()); // about another mount: this stream is stale
        }
        let Some(tier) = tier.upgrade() else { return Ok(()) };
        for item in &n.items {
            // Numbered per mount without gaps: an item seen already (sent again) is skipped.
            if item.seq <= *acked {
                continue;
            }
            if !item.commit && item.segment_id == segment_id {
                tier.apply_owner_removal(&item.key, item.version);
            }
            *acked = item.seq;
        }
        tx.send(ack(*acked)).map_err(|e| plain(e.to_string()))?;
    }
}
