//! etcd v3 backend. The client is async: each store owns a small tokio runtime and blocks on it
//! with a timeout per call. Entries put with a TTL are attached to one lease of the store,
//! kept alive by every such put and granted again when it has expired (e.g. after the service
//! lost its data).

use std::time::Duration;

use etcd_client::{Client, ConnectOptions, PutOptions};
use parking_lot::Mutex;
use tokio::runtime::Runtime;

use super::{unavailable, MAX_VALUE_LEN, SERVICE_TIMEOUT};
use crate::error::Result;

pub(crate) struct EtcdStore {
    address: String,
    runtime: Option<Runtime>,
    client: Client,
    /// The lease entries with a TTL hang on, and its TTL in seconds.
    lease: Mutex<Option<(i64, i64)>>,
}

impl EtcdStore {
    /// Connects to `endpoints` (`host:port`) and checks that the cluster answers.
    pub(crate) fn connect(endpoints: &[String], address: &str) -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("crescent-etcd")
            .enable_all()
            .build()
            .map_err(|e| unavailable(address, format!("cannot start a runtime: {e}")))?;
        let urls: Vec<String> = endpoints.iter().map(|e| format!("http://{e}")).collect();
        let options = ConnectOptions::new()
            .with_connect_timeout(SERVICE_TIMEOUT)
            .with_timeout(SERVICE_TIMEOUT)
            .with_keep_alive(Duration::from_secs(10), SERVICE_TIMEOUT);
        let client = block_on(&runtime, address, async move {
            let mut client = Client::connect(urls, Some(options)).await?;
            // Connecting is lazy: ask something to learn whether anyone answers.
            client.status().await?;
            Ok(client)
        })?;
        tracing::info!("metadata: connected to {address}");
        Ok(EtcdStore { address: address.to_string(), runtime: Some(runtime), client, lease: Mutex::new(None) })
    }

    fn run<T>(&self, f: impl std::future::Future<Output = Result<T, etcd_client::Error>>) -> Result<T> {
        let runtime = self.runtime.as_ref().expect("the runtime lives until drop");
        block_on(runtime, &self.address, f)
    }

    /// A live lease of `ttl` seconds: the current one kept alive, or a new one.
    fn live_lease(&self, ttl: i64) -> Result<i64> {
        let current = *self.lease.lock();
        if let Some((id, lease_ttl)) = current {
            if lease_ttl == ttl {
                let mut client = self.client.clone();
                let alive = self.run(async move {
                    let (mut keeper, mut stream) = client.lease_keep_alive(id).await?;
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
        let mut client = self.client.clone();
        let id = self.run(async move { Ok(client.lease_grant(ttl, None).await?.id()) })?;
        *self.lease.lock() = Some((id, ttl));
        Ok(id)
    }
}

impl super::MetadataStore for EtcdStore {
    fn address(&self) -> &str {
        &self.address
    }

    fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let mut kv = self.client.kv_client().max_decoding_message_size(MAX_VALUE_LEN + 4096);
        let key = key.to_string();
        self.run(async move {
            let mut response = kv.get(key, None).await?;
            Ok(response.take_kvs().into_iter().next().map(|kv| kv.value().to_vec()))
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
        let mut client = self.client.clone();
        let (key, value) = (key.to_string(), value.to_vec());
        self.run(async move {
            client.put(key, value, options).await?;
            Ok(())
        })
    }

    fn delete(&self, key: &str) -> Result<()> {
        let mut client = self.client.clone();
        let key = key.to_string();
        self.run(async move {
            client.delete(key, None).await?;
            Ok(())
        })
    }
}

impl Drop for EtcdStore {
    fn drop(&mut self) {
        if let Some((id, _)) = self.lease.lock().take() {
            let mut client = self.client.clone();
            // Entries on the lease go with it; a failure leaves them to age out.
            if let Err(e) = self.run(async move {
                client.lease_revoke(id).await?;
                Ok(())
            }) {
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
    address: &str,
    f: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T> {
    match runtime.block_on(async { tokio::time::timeout(SERVICE_TIMEOUT, f).await }) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(unavailable(address, e)),
        Err(_) => Err(unavailable(address, format!("no answer within {SERVICE_TIMEOUT:?}"))),
    }
}
