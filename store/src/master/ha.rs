//! High availability on etcd: several masters, one leader.
//!
//! Each master campaigns for the leader key ([`crate::leader`]) with a lease of `ha_lease_ttl`
//! (2 s by default, etcd's floor): a transaction puts its RPC address there if the key does not
//! exist. The winner's term is the key's create revision; it starts from an empty state, which
//! its clients' reports rebuild ([`super::rebuild`]). It renews the lease every third of the
//! TTL, and writes only until *last keep-alive sent + TTL − margin* ([`super::fence`]) — earlier
//! than etcd can expire the lease, so a leader cut off or frozen stops writing before anyone
//! else can be elected. A leader that cannot renew in time steps down: it forgets its state,
//! becomes a standby (answering every call with "not the leader"), revokes its lease if it
//! still can, and campaigns again. Standbys poll the key and campaign when it is gone.
//! One log line per election and per step-down.

use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};

use super::removal_records::RemovalRecords;
use super::Master;
use crate::error::Result;
use crate::leader::{leader_key, Members};

/// How often a standby looks at the leader key.
const STANDBY_POLL: Duration = Duration::from_millis(50);
/// Pause after etcd could not be reached.
const RETRY: Duration = Duration::from_millis(200);

/// What a master's elections need.
#[derive(Debug, Clone)]
pub struct HaSettings {
    /// etcd's endpoints, `host:port` each.
    pub endpoints: Vec<String>,
    /// The cluster the masters campaign in (names the leader key).
    pub cluster_id: String,
    /// The address clients reach this master at (the leader key's value).
    pub advertise: String,
    /// The leadership's lease in etcd (whole seconds).
    pub lease_ttl: Duration,
}

impl HaSettings {
    /// The fence's margin: a fifth of the TTL (clock rate differences, a write that began
    /// just before the deadline).
    pub fn margin(&self) -> Duration {
        self.lease_ttl / 5
    }
}

/// Campaigns, leads and steps down until the runtime stops.
/// A master elected reads the removals earlier leaders recorded (`records`) before it takes
/// its first call; one that cannot read them does not lead.
pub async fn run(master: Arc<Master>, ha: HaSettings, records: Arc<RemovalRecords>) {
    let key = leader_key(&ha.cluster_id);
    let mut etcd = loop {
        match Members::connect(&ha.endpoints).await {
            Ok(m) => break m,
            Err(e) => {
                tracing::warn!("HA: cannot reach etcd at {:?}: {e}", ha.endpoints);
                tokio::time::sleep(RETRY).await;
            }
        }
    };
    tracing::info!("HA: standby, campaigning for {key} at {:?} as {}", ha.endpoints, ha.advertise);
    loop {
        match campaign(&mut etcd, &key, &ha).await {
            Ok(Some((lease, term, sent))) => {
                let inherited = match records.load().await {
                    Ok(t) => t,
                    Err(e) => {
                        tracing::warn!("HA: won term {term} but cannot read the removal records, not leading: {e}");
                        let _ = etcd.run(|mut c| async move { c.lease_revoke(lease).await }).await;
                        tokio::time::sleep(RETRY).await;
                        continue;
                    }
                };
                if !inherited.is_empty() {
                    tracing::info!(
                        "HA: {} removal(s) recorded by earlier leaders buried for the rebuild",
                        inherited.len()
                    );
                }
                master.become_leader(term, sent + ha.lease_ttl.saturating_sub(ha.margin()), &inherited);
                master.metrics().elections.inc();
                tracing::info!("HA: elected leader of cluster {} (term {term}) at {}", ha.cluster_id, ha.advertise);
                let why = lead(&master, &mut etcd, lease, &ha).await;
                master.step_down(None);
                tracing::warn!("HA: stepped down from term {term}: {why}");
                let _ = etcd.run(|mut c| async move { c.lease_revoke(lease).await }).await;
            }
            Ok(None) => {
                if let Ok(leader) = etcd.leader(&key).await {
                    master.fence().set_leader(leader.map(|(addr, term)| format!("{addr} (term {term})")));
                }
                tokio::time::sleep(STANDBY_POLL).await;
            }
            Err(e) => {
                tracing::debug!("HA: campaign: {e}");
                master.fence().set_leader(None);
                tokio::time::sleep(RETRY).await;
            }
        }
    }
}

/// One try at the key: `Some((lease, term, when the lease was asked for))` when won.
async fn campaign(etcd: &mut Members, key: &str, ha: &HaSettings) -> Result<Option<(i64, u64, Instant)>> {
    if etcd.leader(key).await?.is_some() {
        return Ok(None);
    }
    let ttl = ha.lease_ttl.as_secs().max(1) as i64;
    let sent = Instant::now();
    let lease = etcd.run(|mut c| async move { c.lease_grant(ttl, None).await }).await?.id();
    let (k, v) = (key.to_string(), ha.advertise.clone());
    let txn = move || {
        Txn::new().when([Compare::create_revision(k.clone(), CompareOp::Equal, 0)]).and_then([TxnOp::put(
            k.clone(),
            v.clone(),
            Some(PutOptions::new().with_lease(lease)),
        )])
    };
    let resp = etcd.run(|mut c| {
        let t = txn();
        async move { c.txn(t).await }
    });
    let resp = match resp.await {
        Ok(r) => r,
        Err(e) => {
            let _ = etcd.run(|mut c| async move { c.lease_revoke(lease).await }).await;
            return Err(e);
        }
    };
    if !resp.succeeded() {
        let _ = etcd.run(|mut c| async move { c.lease_revoke(lease).await }).await;
        return Ok(None);
    }
    // The put's revision is the key's create revision.
    let term = resp.header().map_or(0, |h| h.revision()) as u64;
    Ok(Some((lease, term, sent)))
}

/// Keeps the lease alive while leading; returns why leadership ended.
async fn lead(master: &Master, etcd: &mut Members, lease: i64, ha: &HaSettings) -> String {
    let every = ha.lease_ttl / 3;
    let mut first = true;
    loop {
        // The first renewal comes at once: a slow campaign may have used much of the lease.
        if !std::mem::take(&mut first) {
            tokio::time::sleep(every).await;
        }
        if !master.fence().leads(Instant::now()) {
            return "the lease was not renewed before the deadline".into();
        }
        let sent = Instant::now();
        let renewed = etcd
            .run(|mut c| async move {
                let (mut keeper, mut stream) = c.lease_keep_alive(lease).await?;
                keeper.keep_alive().await?;
                Ok(stream.message().await?.map_or(0, |r| r.ttl()))
            })
            .await;
        match renewed {
            Ok(ttl) if ttl > 0 => {
                master.fence().renewed(sent, ha.lease_ttl, ha.margin());
            }
            Ok(_) => return "etcd says the lease expired".into(),
            Err(e) => tracing::warn!("HA: renewing the lease: {e}"),
        }
    }
}
