//! How a disk writer hands a file's bytes and its flush to the kernel: an [`IoEngine`], one
//! per writer thread, of the kind chosen once when the tier opens ([`EngineKind::choose`]).
//!
//! * `psync`: plain system calls one by one (`pwritev`, then `fdatasync`): everywhere.
//! * `uring`: the write and its flush as one linked io_uring submission (one system call
//!   and one sleep for both), where the kernel offers io_uring; a writer whose ring fails
//!   in a way plain calls may not falls back to them for good (logged).

pub(crate) mod psync;
pub(crate) mod uring;

use std::fs::File;
use std::io::{self, IoSlice};

/// The engines there are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    /// Plain system calls (`psync`).
    Psync,
    /// Linked io_uring submissions (`uring`).
    IoUring,
}

impl EngineKind {
    /// io_uring when `want_uring` and the kernel makes a ring now (one is made and dropped to
    /// find out: Linux 5.1 and later, not refused by a seccomp filter or
    /// `kernel.io_uring_disabled`), plain calls otherwise (the reason logged).
    pub fn choose(want_uring: bool) -> EngineKind {
        if !want_uring {
            return EngineKind::Psync;
        }
        match uring::Ring::new() {
            Ok(_) => EngineKind::IoUring,
            Err(e) => {
                tracing::info!("disk tier: no io_uring ({e}); writers make their calls one by one");
                EngineKind::Psync
            }
        }
    }

    /// An engine of this kind, for one writer. (A ring the kernel refuses now, though it made
    /// one at [`Self::choose`], leaves the writer with plain calls, logged.)
    pub fn engine(self) -> Box<dyn IoEngine> {
        match self {
            EngineKind::Psync => Box::new(psync::Psync),
            EngineKind::IoUring => match uring::Uring::new() {
                Ok(u) => Box::new(u),
                Err(e) => {
                    tracing::warn!("disk tier: a writer's io_uring: {e}; it makes its calls one by one");
                    Box::new(psync::Psync)
                }
            },
        }
    }
}

/// One writer's way to the kernel. Not shared: each writer thread owns its engine.
///
/// The contract, for every implementation:
/// * [`Self::write_all`] writes every byte of `slices`, in order, at the start of `file`
///   (offset 0), or returns an error; with `then_sync` it also flushes the file's data
///   (`fdatasync`) once the write completed, before it returns. It returns only once the
///   kernel holds no reference to the memory of `slices`: the caller frees or reuses it
///   right after, whatever the outcome.
/// * [`Self::sync_data`] flushes the file's data (`fdatasync`).
/// * Neither blocks longer than the kernel's calls do, and a failure is the call's own: an
///   engine that stops using its fast path (a broken ring) still takes later calls.
/// * [`Self::kind`] names the path the next call takes (for the tier's counters).
pub trait IoEngine: Send {
    /// Writes all of `slices` at offset 0 of `file`, then flushes its data if `then_sync` (see
    /// the contract above).
    fn write_all(&mut self, file: &File, slices: &[IoSlice<'_>], then_sync: bool) -> io::Result<()>;
    /// Flushes `file`'s data (`fdatasync`).
    fn sync_data(&mut self, file: &File) -> io::Result<()>;
    /// The path the next call takes.
    fn kind(&self) -> EngineKind;
}
