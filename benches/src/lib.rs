//! Shared pieces of Crescent's benchmark binaries.

pub use crescent_store::pattern;
pub mod etcd_cluster;
pub mod failover;
pub mod hotbench;
pub mod masterbench;
pub mod report;
pub mod ssd;

pub use crescent_store::init_logging;

/// CPU time this process has used so far (all threads, user and system), in seconds. Unlike
/// wall-clock time it does not grow while other programs hold the CPUs, so bytes per CPU
/// second compare fairly on a busy machine.
pub fn process_cpu_seconds() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    t.tv_sec as f64 + t.tv_nsec as f64 / 1e9
}
