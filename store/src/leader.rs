//! The leader of a cluster's masters, as etcd has it: the key
//! `/crescent/<cluster id>/master/leader`, held under the leader's lease, whose value is the
//! leader's RPC address and whose create revision is the leader's term. Masters campaign for
//! it (`master::ha`); clients given `etcd://h1:2379;h2:2379` as the master address read it to
//! find the leader (`client::rpc`).
//!
//! One client per etcd member, tried in turn (the last that answered first): a dead member
//! costs one timeout, never the election.

use std::future::Future;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};

use crate::error::{Result, StoreError};

/// The scheme of a master address that names etcd endpoints instead of a master.
pub const ETCD_SCHEME: &str = "etcd://";

/// How long one etcd call may take.
pub const ETCD_CALL_TIMEOUT: Duration = Duration::from_millis(800);

/// The etcd key the leader of cluster `cluster_id` holds: `/crescent/<cluster_id>/master/leader`.
pub fn leader_key(cluster_id: &str) -> String {
    format!("/crescent/{cluster_id}/master/leader")
}

/// `host:port` endpoints of `etcd://h1:2379;h2:2379` (also `,`-separated, or without the
/// scheme); an error names the address when it lists none.
pub fn endpoints(address: &str) -> Result<Vec<String>> {
    let list = address.trim().strip_prefix(ETCD_SCHEME).unwrap_or(address.trim());
    let eps: Vec<String> = list
        .split([';', ','])
        .map(|e| e.trim().trim_start_matches("http://").trim_end_matches('/').to_string())
        .filter(|e| !e.is_empty())
        .collect();
    if eps.is_empty() {
        return Err(StoreError::Config(format!("etcd address {address:?} lists no endpoint")));
    }
    Ok(eps)
}

/// The members of an etcd cluster.
pub struct Members {
    members: Vec<(String, Client)>,
    preferred: usize,
}

impl Members {
    /// Builds a (lazy) client per endpoint; nothing is asked yet.
    pub async fn connect(endpoints: &[String]) -> Result<Members> {
        let options = ConnectOptions::new()
            .with_connect_timeout(ETCD_CALL_TIMEOUT)
            .with_timeout(ETCD_CALL_TIMEOUT)
            .with_keep_alive(Duration::from_secs(2), ETCD_CALL_TIMEOUT);
        let mut members = Vec::new();
        for ep in endpoints {
            let url = format!("http://{ep}");
            let client = Client::connect([url], Some(options.clone()))
                .await
                .map_err(|e| StoreError::Config(format!("etcd endpoint {ep}: {e}")))?;
            members.push((ep.clone(), client));
        }
        Ok(Members { members, preferred: 0 })
    }

    /// Runs `op` on the preferred member, then on each other one until one answers.
    pub async fn run<T, F, Fut>(&mut self, op: F) -> Result<T>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let n = self.members.len();
        let mut failures = Vec::new();
        for i in 0..n {
            let k = (self.preferred + i) % n;
            let (ep, client) = &self.members[k];
            match tokio::time::timeout(ETCD_CALL_TIMEOUT, op(client.clone())).await {
                Ok(Ok(v)) => {
                    self.preferred = k;
                    return Ok(v);
                }
                Ok(Err(e)) => failures.push(format!("{ep}: {e}")),
                Err(_) => failures.push(format!("{ep}: no answer within {ETCD_CALL_TIMEOUT:?}")),
            }
        }
        Err(StoreError::master_unreachable("etcd", failures.join("; ")))
    }

    /// The leader's (address, term), or `None` when no master leads.
    pub async fn leader(&mut self, key: &str) -> Result<Option<(String, u64)>> {
        let key = key.to_string();
        let got = self.run(|mut c| {
            let key = key.clone();
            async move { c.get(key, None).await }
        });
        let resp = got.await?;
        Ok(resp.kvs().first().and_then(|kv| {
            let addr = kv.value_str().ok()?.to_string();
            Some((addr, kv.create_revision() as u64))
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_addresses_name_their_endpoints() {
        assert_eq!(endpoints("etcd://h1:2379;h2:2379").unwrap(), ["h1:2379", "h2:2379"]);
        assert_eq!(endpoints("etcd://http://h1:2379/, h2:2379").unwrap(), ["h1:2379", "h2:2379"]);
        assert_eq!(endpoints("h1:2379").unwrap(), ["h1:2379"]);
        assert!(matches!(endpoints("etcd://;"), Err(StoreError::Config(_))));
        assert_eq!(leader_key("c1"), "/crescent/c1/master/leader");
    }
}
