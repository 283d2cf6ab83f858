//! The client's connection to the master: a tonic channel driven by a small runtime of its
//! own, so the client's API stays synchronous (and callable from any thread, e.g. Python's).

use std::future::Future;
use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

use crate::error::{Result, StoreError};
use crate::master::service::MAX_MESSAGE;
use crate::proto::master_client::MasterClient;
use crate::proto::{Code, Status};

pub struct MasterRpc {
    runtime: tokio::runtime::Runtime,
    client: MasterClient<Channel>,
    addr: String,
}

impl MasterRpc {
    /// Connects to the master at `addr` (`host:port`); fails with a clear error if it is not there.
    pub fn connect(addr: &str) -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("crescent-client-rpc")
            .enable_all()
            .build()
            .map_err(|e| StoreError::Internal(format!("tokio runtime: {e}")))?;
        let unreachable = |reason: String| StoreError::MasterUnreachable { addr: addr.to_string(), reason };
        let endpoint = Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| StoreError::Config(format!("master address {addr:?}: {e}")))?
            .connect_timeout(Duration::from_secs(3))
            .timeout(Duration::from_secs(30))
            .tcp_nodelay(true);
        let channel = runtime.block_on(endpoint.connect()).map_err(|e| unreachable(format!("{e}: {e:?}")))?;
        let client =
            MasterClient::new(channel).max_decoding_message_size(MAX_MESSAGE).max_encoding_message_size(MAX_MESSAGE);
        Ok(MasterRpc { runtime, client, addr: addr.to_string() })
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The runtime driving the channel (for streams that outlive one call).
    pub fn handle(&self) -> tokio::runtime::Handle {
        self.runtime.handle().clone()
    }

    /// A handle on the channel to the master.
    pub fn client(&self) -> MasterClient<Channel> {
        self.client.clone()
    }

    /// Runs one call to completion on the client's runtime.
    pub fn call<T, F, Fut>(&self, f: F) -> Result<T>
    where
        F: FnOnce(MasterClient<Channel>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.runtime
            .block_on(f(self.client.clone()))
            .map(|r| r.into_inner())
            .map_err(|s| StoreError::MasterUnreachable { addr: self.addr.clone(), reason: s.message().to_string() })
    }
}

/// Turns a reply's status into a result; `key` names the object in errors.
pub fn check(status: Option<Status>, key: &str) -> Result<()> {
    let s = status.unwrap_or_default();
    let code = Code::try_from(s.code).unwrap_or(Code::Internal);
    if code == Code::Ok {
        Ok(())
    } else {
        Err(StoreError::from_status(code, &s.message, key))
    }
}
