//! etcd v3 backend. The client is async: each store owns a small tokio runtime and blocks on it
//! with a timeout per call. Each listed member has its own client; a call that fails on one
//! member is tried on the next (every call here can be repeated), and the member that answered
//! is asked first next time. Entries put with a TTL are attached to one lease of the store,
//! kept alive by every such put and granted again when it has expired (e.g. after the service
//! lost its data).

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, PutOptions};
use parking_lot::Mutex;
use tokio::runtime::Runtime;

use super::{unavailable, MAX_VALUE_LEN, SERVICE_TIMEOUT};
use crate::error::Result;

/// How long dropping the store waits for the lease to be revoked.
const REVOKE_TIMEOUT: Duration = Duration::from_secs(1);

type EtcdResult<T> = std::result::Result<T, etcd_client::Error>;

pub(crate) struct EtcdStore {
    address: String,
    runtime: Option<Runtime>,
    /// One client per member, in the order given.
    members: Vec<(String, Client)>,
    /// The member asked first: the last one that answered.
    preferred: AtomicUsize,
    /// The lease entries with a TTL hang on, and its TTL in seconds.
    lease: Mutex<Option<(i64, i64)>>,
}

impl EtcdStore {
    /// Connects to `endpoints` (`host:port`) and checks that a member answers.
    pub(crate) fn connect(endpoints: &[String], address: &str) -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("crescent-etcd")
            .enable_all()
            .build()
            .map_err(|e| unavailable(address, format!("cannot start a runtime: {e}")))?;
        let options = ConnectOptions::new()
            .with_connect_timeout(SERVICE_TIMEOUT)
            .with_timeout(SERVICE_TIMEOUT)
            .with_keep_alive(Duration::from_secs(10), SERVICE_TIMEOUT);
        let mut members = Vec::with_capacity(endpoints.len());
        for endpoint in endpoints {
            // Connecting is lazy: this only builds the channel.
            let url = format!("http://{endpoint}");
            let client = block_on(&runtime, SERVICE_TIMEOUT, Client::connect([url], Some(options.clone())))
                .map_err(|e| unavailable(address, format!("{endpoint}: {e}")))?;
            members.push((endpoint.clone(), client));
        }
        let store = EtcdStore {
            address: address.to_string(),
            runtime: Some(runtime),
            members,
            preferred: AtomicUsize::new(0),
            lease: Mutex::new(None),
        };
        // Ask something to learn whether anyone answers.
        store.run(SERVICE_TIMEOUT, |mut c| async move { c.status().await.map(drop) })?;
        tracing::info!("metadata: connected to {address}");
        Ok(store)
    }

    /// Runs `op` on the preferred member, then on each other one until one answers.
    fn run<T, F, Fut>(&self, timeout: Duration, op: F) -> Result<T>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = EtcdResult<T>>,
    {
        let runtime = self.runtime.as_ref().expect("the runtime lives until drop");
        let first = self.preferred.load(Ordering::Relaxed);
        let mut failures = Vec::new();
        for i in 0..self.members.len() {
            let k = (first + i) % self.members.len();
            let (endpoint, client) = &self.members[k];
            match block_on(runtime, timeout, op(client.clone())) {
                Ok(v) => {
                    if i > 0 {
                        self.preferred.store(k, Ordering::Relaxed);
                    }
                    return Ok(v);
                }
                Err(e) if self.members.len() == 1 => failures.push(e),
                Err(e) => failures.push(format!("{endpoint}: {e}")),
            }
        }
        Err(unavailable(&self.address, failures.join("; ")))
    }

    /// A live lease of `ttl` seconds: the current one kept alive, or a new one.
    fn live_lease(&self, ttl: i64) -> Result<i64> {
        let current = *self.lease.lock();
        if let Some((id, lease_ttl)) = current {
            if lease_ttl == ttl {
                let alive = self.run(SERVICE_TIMEOUT, |mut c| async move {
                    let (mut keeper, mut stream) = c.lease_keep_alive(id).await?;
                    keeper.keep_alive().await?;
                    Ok(stream.message().await?.is_some_and(|r| r.ttl() > 0))
                });
                match alive {
                    Ok(true) => return Ok(id),
                    // A lease the service no longer knows (it expired, or the service lost
                    // its data) answers TTL 0 or an error: grant a new one below.
                    Ok(false) => {
                        tracing::info!("metadata: lease {id:x} on {} expired; granting a new one", self.address)
                    }
                    Err(e) => tracing::debug!("metadata: keeping lease {id:x} alive: {e}"),
                }
            }
        }
        let id = self.run(SERVICE_TIMEOUT, |mut c| async move { Ok(c.lease_grant(ttl, None).await?.id()) })?;
        *self.lease.lock() = Some((id, ttl));
        Ok(id)
    }
}

impl super::MetadataStore for EtcdStore {
    fn address(&self) -> &str {
        &self.address
    }

    fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        self.run(SERVICE_TIMEOUT, |c| {
            let mut kv = c.kv_client().max_decoding_message_size(MAX_VALUE_LEN + 4096);
            let key = key.to_string();
            async move {
                let mut response = kv.get(key, None).await?;
                Ok(response.take_kvs().into_iter().next().map(|kv| kv.value().to_vec()))
            }
        })
    }

    fn put(&self, key: &str, value: &[u8], ttl: Option<Duration>) -> Result<()> {
        let options = match ttl {
            Some(ttl) => {
                // Leases count whole seconds.
                let secs = i64::try_from(ttl.as_secs_f64().ceil() as u64).unwrap_or(i64::MAX).max(1);
                Some(PutOptions::new().with_lease(self.live_lease(secs)?))
            }
            None => None,
        };
        self.run(SERVICE_TIMEOUT, |mut c| {
            let (key, value, options) = (key.to_string(), value.to_vec(), options.clone());
            async move { c.put(key, value, options).await.map(drop) }
        })
    }

    fn delete(&self, key: &str) -> Result<()> {
        self.run(SERVICE_TIMEOUT, |mut c| {
            let key = key.to_string();
            async move { c.delete(key, None).await.map(drop) }
        })
    }
}

impl Drop for EtcdStore {
    fn drop(&mut self) {
        if let Some((id, _)) = self.lease.lock().take() {
            // Entries on the lease go with it. Not worth a long wait at shutdown: if the
            // service does not answer soon, they age out with the lease.
            if let Err(e) = self.run(REVOKE_TIMEOUT, |mut c| async move { c.lease_revoke(id).await.map(drop) }) {
                tracing::debug!("metadata: revoking lease {id:x}: {e}");
            }
        }
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

fn block_on<T>(
    runtime: &Runtime,
    timeout: Duration,
    f: impl Future<Output = EtcdResult<T>>,
) -> std::result::Result<T, String> {
    match runtime.block_on(async { tokio::time::timeout(timeout, f).await }) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {timeout:?}")),
    }
}
