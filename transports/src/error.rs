//! The transport layer's one error type, [`TransportError`].

use std::io;

/// Errors of the transport layer.
///
/// [`TransportError::is_caller_error`] tells a caller's mistake (bad arguments, overlapping
/// or unknown regions) from a fault of the system or of a peer.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// The caller passed something the transport cannot use: a zero-length region, a local
    /// range outside every registered region, a configuration bound out of its range; the
    /// text says which.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Registering `[addr, addr + len)` failed: it overlaps the region already registered
    /// at `other`. Addresses are virtual addresses of this process, `len` is in bytes.
    #[error("region [{addr:#x}, {addr:#x}+{len}) overlaps the registered region at {other:#x}")]
    Overlap {
        /// Start of the rejected range.
        addr: u64,
        /// Length of the rejected range, in bytes.
        len: u64,
        /// Start of the registered region it overlaps.
        other: u64,
    },
    /// Unregistering or looking up a region by its start address found none starting there.
    #[error("no registered region starts at {0:#x}")]
    NotRegistered(u64),
    /// The region at `addr` cannot be unregistered now: transfers of this process still use
    /// it, a peer's access did not end in time, or a same-host peer did not release its
    /// mapping in time; `why` says which.
    #[error("region at {addr:#x} is busy: {why}")]
    RegionBusy {
        /// Start of the busy region.
        addr: u64,
        /// What holds it.
        why: String,
    },
    /// The operating system refused to create or map `len` bytes of shareable memory
    /// (memfd, `ftruncate` or `mmap` failed).
    #[error("allocating {len} bytes of shareable memory failed: {source}")]
    Alloc {
        /// Requested size, in bytes.
        len: u64,
        /// The failing system call's error.
        source: io::Error,
    },
    /// A transport could not bind or inspect its listening socket (TCP address or abstract
    /// Unix socket name).
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address or socket name it tried to listen on.
        addr: String,
        /// The bind error.
        source: io::Error,
    },
    /// The named transport (`"tcp"`, `"shm"`, `"rdma"`) cannot serve: no device or library,
    /// no thread could be started, or the peer cannot be reached; the text says why. A fault
    /// of the system or the peer, not of the caller.
    #[error("transport {0} is unavailable: {1}")]
    Unavailable(&'static str, String),
    /// The device could not pin the memory: the process's locked-memory limit is too small.
    #[error("transport {transport} cannot pin the memory: {reason}")]
    PinLimit {
        /// The transport that tried to pin (`"rdma"`).
        transport: &'static str,
        /// The device's error and the limit in force.
        reason: String,
    },
    /// A device location was named, but no device driver can be loaded here (no library,
    /// or it does not initialise); the text says which library and why. The host's fault.
    #[error("device memory is unavailable: {reason}")]
    DriverUnavailable {
        /// Why the driver cannot be used.
        reason: String,
    },
    /// A call of the device driver failed.
    #[error("device driver call {call} failed: {reason}")]
    Driver {
        /// The driver's function.
        call: &'static str,
        /// The driver's error, in its words.
        reason: String,
    },
    /// A registration named a device this host does not have.
    #[error("location {location}: no such device (this process sees {devices})")]
    UnknownDevice {
        /// The location as given (`cuda:3`).
        location: String,
        /// How many devices the driver reports.
        devices: u32,
    },
    /// A registration named a device location for memory the driver does not know.
    #[error("[{addr:#x}, ...) registered at {location} is not device memory")]
    NotDeviceMemory {
        /// The range's start.
        addr: u64,
        /// The location as given.
        location: String,
    },
    /// A registration named one device for memory of another.
    #[error("[{addr:#x}, ...) registered at {location} is memory of device {actual}")]
    WrongDevice {
        /// The range's start.
        addr: u64,
        /// The location as given.
        location: String,
        /// The device the driver says it is on.
        actual: u32,
    },
    /// A range of device memory does not lie inside one allocation (transports export and copy
    /// device memory allocation by allocation).
    #[error(
        "device range [{addr:#x}, +{len}) is not inside one allocation (the one at {addr:#x} is [{base:#x}, +{size}))"
    )]
    SpansAllocations {
        /// The range's start.
        addr: u64,
        /// Its length in bytes.
        len: u64,
        /// The allocation holding `addr`: its start.
        base: u64,
        /// Its size in bytes.
        size: u64,
    },
}

impl TransportError {
    /// True when the error comes from how the caller used the API, not from the system or a peer.
    pub fn is_caller_error(&self) -> bool {
        matches!(
            self,
            TransportError::InvalidArgument(_)
                | TransportError::Overlap { .. }
                | TransportError::NotRegistered(_)
                | TransportError::RegionBusy { .. }
                | TransportError::UnknownDevice { .. }
                | TransportError::NotDeviceMemory { .. }
                | TransportError::WrongDevice { .. }
                | TransportError::SpansAllocations { .. }
        )
    }
}
