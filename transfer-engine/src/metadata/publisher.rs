//! Keeps an engine's entries in a metadata service: published at start and whenever the
//! registered regions change, put again every third of the TTL (which renews the etcd lease or
//! redis expiry, and restores them after the service lost its data), deleted on drop.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use super::{Keys, MetadataStore, RpcMeta};
use crate::error::Result;

/// Builds the current descriptor (JSON).
pub(crate) type Describe = Arc<dyn Fn() -> Vec<u8> + Send + Sync>;

/// Shortest wait between two renewals, whatever the TTL.
const MIN_PERIOD: Duration = Duration::from_millis(50);
/// Longest wait before trying again while the service is unreachable.
const MAX_RETRY: Duration = Duration::from_secs(1);

struct Shared {
    store: Arc<dyn MetadataStore>,
    segment: String,
    descriptor_key: String,
    rpc_key: String,
    rpc_value: Vec<u8>,
    describe: Describe,
    ttl: Duration,
    /// Serializes puts, so that the last put always carries the newest descriptor.
    publishing: Mutex<()>,
    state: Mutex<State>,
    wake: Condvar,
}

struct State {
    stop: bool,
    /// The last put succeeded.
    healthy: bool,
}

pub(crate) struct Publisher {
    shared: Arc<Shared>,
    keeper: Option<JoinHandle<()>>,
}

impl Publisher {
    /// Publishes the segment's entries once (an error if that fails) and starts renewing them.
    pub(crate) fn start(
        store: Arc<dyn MetadataStore>,
        keys: &Keys,
        segment: &str,
        rpc: RpcMeta,
        describe: Describe,
        ttl: Duration,
    ) -> Result<Self> {
        let shared = Arc::new(Shared {
            store,
            segment: segment.to_string(),
            descriptor_key: keys.descriptor(segment),
            rpc_key: keys.rpc_meta(segment),
            rpc_value: serde_json::to_vec(&rpc).expect("rpc_meta serializes"),
            describe,
            ttl,
            publishing: Mutex::new(()),
            state: Mutex::new(State { stop: false, healthy: true }),
            wake: Condvar::new(),
        });
        shared.put()?;
        let keeper = {
            let shared = shared.clone();
            std::thread::Builder::new().name("crescent-metadata".into()).spawn(move || shared.keep())?
        };
        tracing::info!("metadata: published segment {segment} to {} (TTL {ttl:?})", shared.store.address());
        Ok(Publisher { shared, keeper: Some(keeper) })
    }

    /// Publishes the current descriptor now (registered regions changed). A failure is logged
    /// and left to the renewal loop, which retries until the service answers; while the
    /// service is known to be unreachable, registration does not wait for it at all.
    pub(crate) fn publish(&self) {
        if !self.shared.state.lock().healthy {
            self.shared.wake.notify_all();
            return;
        }
        let result = self.shared.put();
        self.shared.note(&result);
    }
}

impl Shared {
    fn put(&self) -> Result<()> {
        let _one_at_a_time = self.publishing.lock();
        let descriptor = (self.describe)();
        self.store.put(&self.descriptor_key, &descriptor, Some(self.ttl))?;
        self.store.put(&self.rpc_key, &self.rpc_value, Some(self.ttl))
    }

    /// Logs transitions between reachable and unreachable; true if healthy now.
    fn note(&self, result: &Result<()>) -> bool {
        let mut state = self.state.lock();
        match result {
            Ok(()) if !state.healthy => {
                state.healthy = true;
                tracing::info!(
                    "metadata: {} answers again; segment {} re-published",
                    self.store.address(),
                    self.segment
                );
            }
            Err(e) if state.healthy => {
                state.healthy = false;
                tracing::warn!(
                    "metadata: cannot publish segment {} ({e}); transfers with known peers go on, retrying",
                    self.segment
                );
            }
            _ => {}
        }
        state.healthy
    }

    fn keep(&self) {
        let period = (self.ttl / 3).max(MIN_PERIOD);
        let mut wait = period;
        loop {
            {
                let mut state = self.state.lock();
                if !state.stop {
                    self.wake.wait_for(&mut state, wait);
                }
                if state.stop {
                    return;
                }
            }
            let result = self.put();
            wait = if self.note(&result) { period } else { period.min(MAX_RETRY) };
        }
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.shared.state.lock().stop = true;
        self.shared.wake.notify_all();
        if let Some(keeper) = self.keeper.take() {
            let _ = keeper.join();
        }
        if !self.shared.state.lock().healthy {
            // Not worth waiting for an unreachable service: the entries age out.
            return;
        }
        for key in [&self.shared.descriptor_key, &self.shared.rpc_key] {
            if let Err(e) = self.shared.store.delete(key) {
                tracing::warn!("metadata: could not delete {key} ({e}); it will age out");
            }
        }
    }
}
