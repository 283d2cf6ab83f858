//! What the transport hands its peers and its exchange server — the settings,
//! the devices with their completion dispatch, the registered memory, the queue pairs'
//! timing, the stop flag, and whether rdma has been used or turned off.
//!
//! Layer: peers (the layer map is in the [rdma module](super)).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::config::RdmaConfig;
use super::device::Device;
use super::mr::MrTable;
use super::poller::Dispatch;
use super::qp::QpTiming;

/// State shared by the transport, its peers, pollers and exchange server.
pub(crate) struct Shared {
    pub config: RdmaConfig,
    pub devices: Vec<Arc<Device>>,
    /// The completion dispatch of each device (same order as `devices`).
    pub dispatch: Vec<Arc<Dispatch>>,
    pub mrs: Arc<MrTable>,
    pub timing: QpTiming,
    stop: Arc<AtomicBool>,
    usage: Mutex<Usage>,
}

/// Whether the transport has carried anything yet, and whether it was turned off.
#[derive(Debug, Default)]
struct Usage {
    /// A queue pair to or from a peer was asked for.
    used: bool,
    withdrawn: bool,
}

impl Shared {
    pub fn new(config: RdmaConfig, devices: Vec<Arc<Device>>) -> Shared {
        Shared {
            timing: QpTiming { timeout: config.ib_timeout, retry_cnt: config.retry_cnt },
            config,
            dispatch: devices.iter().map(|_| Arc::new(Dispatch::default())).collect(),
            devices,
            mrs: Arc::new(MrTable::default()),
            stop: Arc::new(AtomicBool::new(false)),
            usage: Mutex::new(Usage::default()),
        }
    }

    pub fn is_stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// The stop flag, for the pollers.
    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        self.stop.clone()
    }

    /// Tells the pollers and keepers to stop.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
    }

    /// Notes that a queue pair to or from a peer is about to be set up; refused once the
    /// transport was withdrawn ([`Self::withdraw_if_unused`]).
    pub fn begin_use(&self) -> Result<(), String> {
        let mut usage = self.usage.lock();
        if usage.withdrawn {
            return Err("rdma is turned off on this engine (it could not register its memory)".into());
        }
        usage.used = true;
        Ok(())
    }

    /// Turns rdma off if no queue pair to or from a peer was set up yet; true if it is off
    /// (now or before). See `RdmaTransport::withdraw_if_unused`.
    pub fn withdraw_if_unused(&self) -> bool {
        let mut usage = self.usage.lock();
        if usage.used && !usage.withdrawn {
            return false;
        }
        usage.withdrawn = true;
        true
    }

    pub fn is_withdrawn(&self) -> bool {
        self.usage.lock().withdrawn
    }

    /// State without devices, for tests of the parts that need none (the exchange's messages).
    #[cfg(test)]
    pub(crate) fn without_devices() -> Shared {
        Shared::new(RdmaConfig::default(), Vec::new())
    }
}
