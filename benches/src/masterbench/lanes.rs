//! The lanes: one closed-loop phase per call kind, timed per call.

use super::*;

/// The runtimes the simulated clients run on: `n` threads, each a single-threaded runtime,
/// or with `n` = 0 one work-stealing runtime of two threads. A work-stealing runtime wakes its
/// other thread for each task that becomes ready while one runs; on two shared cores those
/// wake-ups (cross-CPU interrupts in a VM) cost the master's share of the CPU.
pub(super) struct Lanes {
    handles: Vec<tokio::runtime::Handle>,
    /// Dropped at the end: the single-threaded runtimes' threads end.
    _stop: tokio::sync::watch::Sender<()>,
    _shared: Option<tokio::runtime::Runtime>,
}

impl Lanes {
    pub(super) fn start(n: usize) -> Result<Lanes> {
        let (stop, stopped) = tokio::sync::watch::channel(());
        if n == 0 {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("storebench-clients")
                .enable_all()
                .build()?;
            return Ok(Lanes { handles: vec![rt.handle().clone()], _stop: stop, _shared: Some(rt) });
        }
        let mut handles = Vec::new();
        for i in 0..n {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            handles.push(rt.handle().clone());
            let mut stopped = stopped.clone();
            std::thread::Builder::new().name(format!("storebench-clients-{i}")).spawn(move || {
                rt.block_on(async move {
                    let _ = stopped.changed().await;
                })
            })?;
        }
        Ok(Lanes { handles, _stop: stop, _shared: None })
    }

    pub(super) fn of(&self, client: usize) -> tokio::runtime::Handle {
        self.handles[client % self.handles.len()].clone()
    }
}
