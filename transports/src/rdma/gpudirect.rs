//! GPUDirect RDMA: registering device memory with the NICs, so that they read and write it
//! without staging through host memory.
//!
//! Two ways exist, tried in this order:
//! 1. **dma-buf**: the device driver exports the range as a dma-buf
//!    ([`DeviceApi::dmabuf`](crate::device::DeviceApi::dmabuf)) and the NIC registers that
//!    (`ibv_reg_dmabuf_mr`, libibverbs 1.14 and later); no kernel module beyond the GPU's and
//!    the NIC's drivers is needed;
//! 2. **peer memory**: where a peer-memory module is loaded (`nvidia_peermem`, or the older
//!    `nv_peer_mem`), the NIC registers the device pointer itself (`ibv_reg_mr`).
//!
//! Where neither works, device memory is not registered with the NICs and the engine moves
//! the requests that touch it over tcp, staged through pinned host buffers; the reason is
//! kept ([`DevicePath::Staged`]) and said once in the log.
//!
//! [`choose`] is the decision, free of I/O: what is known so far in, the next thing to do out.
//! [`register`] runs it against the driver and the devices.
//!
//! Layer: verbs resources (the layer map is in the [rdma module](super)).

use std::fmt;
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::Arc;

use super::device::Device;
use super::mr::{Backing, MrTable, Refused};
use crate::device::DeviceMemory;
use crate::DeviceKey;

/// Where dma-buf registration stands for one range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DmaBufSupport {
    /// libibverbs has `ibv_reg_dmabuf_mr`; the driver has not been asked yet.
    Untried,
    /// libibverbs lacks `ibv_reg_dmabuf_mr` (it came with rdma-core 34, libibverbs 1.14).
    VerbsLacksIt,
    /// The device driver exports no dma-buf for this memory (too old a driver, or a device or
    /// kernel without dma-buf support).
    DriverLacksIt,
    /// The device driver's export failed; its error.
    DriverFailed(String),
    /// A NIC refused the dma-buf: its name and `errno` (`EOPNOTSUPP` where its kernel driver
    /// does not take dma-bufs, as soft-RoCE's does not).
    NicRefused {
        /// The NIC's name.
        device: String,
        /// The error libibverbs set.
        errno: i32,
    },
}

/// Where peer-memory registration stands for one range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerMemorySupport {
    /// A peer-memory module is loaded; not tried yet.
    Untried,
    /// No peer-memory module is loaded (neither `/sys/module/nvidia_peermem` nor
    /// `/sys/module/nv_peer_mem` exists), or the configuration said not to use one.
    NotLoaded,
    /// A NIC refused the device pointer: its name and `errno`.
    NicRefused {
        /// The NIC's name.
        device: String,
        /// The error libibverbs set.
        errno: i32,
    },
}

/// What is known about the ways to register one range of device memory with the NICs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Support {
    /// dma-buf registration.
    pub dmabuf: DmaBufSupport,
    /// Registration through a peer-memory module.
    pub peer_memory: PeerMemorySupport,
}

/// What [`choose`] says to do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    /// Export a dma-buf and register it.
    DmaBuf,
    /// Register the device pointer (a peer-memory module resolves it).
    PeerMemory,
    /// Register nothing: requests on the memory go over tcp, staged.
    Staged,
}

/// The next way to try: dma-buf while it is untried, else peer memory while that is untried,
/// else staging.
pub fn choose(support: &Support) -> Choice {
    match (&support.dmabuf, &support.peer_memory) {
        (DmaBufSupport::Untried, _) => Choice::DmaBuf,
        (_, PeerMemorySupport::Untried) => Choice::PeerMemory,
        _ => Choice::Staged,
    }
}

/// How a registered range of device memory reaches the NICs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DevicePath {
    /// Registered through a dma-buf (`ibv_reg_dmabuf_mr`): GPUDirect RDMA.
    DmaBuf,
    /// Registered as a device pointer through a peer-memory module: GPUDirect RDMA.
    PeerMemory,
    /// Not registered with the NICs; requests that touch it go over tcp, staged. Why.
    Staged(Support),
}

impl DevicePath {
    /// The NIC reads and writes the memory itself.
    pub fn is_gpudirect(&self) -> bool {
        !matches!(self, DevicePath::Staged(_))
    }
}

impl fmt::Display for DmaBufSupport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DmaBufSupport::Untried => write!(f, "dma-buf not tried"),
            DmaBufSupport::VerbsLacksIt => {
                write!(f, "libibverbs has no ibv_reg_dmabuf_mr (rdma-core 34 or later has it)")
            }
            DmaBufSupport::DriverLacksIt => write!(f, "the device driver exports no dma-buf for it"),
            DmaBufSupport::DriverFailed(e) => write!(f, "the device driver's dma-buf export failed: {e}"),
            DmaBufSupport::NicRefused { device, errno } => {
                write!(f, "{device} refused its dma-buf: {}", std::io::Error::from_raw_os_error(*errno))
            }
        }
    }
}

impl fmt::Display for PeerMemorySupport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PeerMemorySupport::Untried => write!(f, "peer memory not tried"),
            PeerMemorySupport::NotLoaded => write!(f, "no peer-memory module (nvidia_peermem) is loaded"),
            PeerMemorySupport::NicRefused { device, errno } => {
                write!(f, "{device} refused the device pointer: {}", std::io::Error::from_raw_os_error(*errno))
            }
        }
    }
}

impl fmt::Display for Support {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}; {}", self.dmabuf, self.peer_memory)
    }
}

/// Whether a peer-memory module is loaded, as its `/sys/module` entry says.
pub fn peer_memory_loaded() -> bool {
    ["nvidia_peermem", "nv_peer_mem"].iter().any(|m| Path::new("/sys/module").join(m).exists())
}

/// Registers `[addr, +len)` of `memory` on every device in `devices` the first way that works
/// ([`choose`]), starting from `peer_memory` (whether to try a peer-memory module). Returns
/// the keys (none where it is staged) and the path taken.
pub fn register(
    mrs: &MrTable,
    devices: &[Arc<Device>],
    memory: &DeviceMemory,
    addr: u64,
    len: u64,
    peer_memory: bool,
) -> (Vec<DeviceKey>, DevicePath) {
    let verbs_has_it = devices.iter().all(|d| d.verbs.reg_dmabuf_mr.is_some());
    let mut support = Support {
        dmabuf: if verbs_has_it { DmaBufSupport::Untried } else { DmaBufSupport::VerbsLacksIt },
        peer_memory: if peer_memory { PeerMemorySupport::Untried } else { PeerMemorySupport::NotLoaded },
    };
    let refused = |Refused { device, error }: Refused| (device, error.raw_os_error().unwrap_or(0));
    loop {
        match choose(&support) {
            Choice::DmaBuf => {
                let device = memory.allocation.device;
                support.dmabuf = match memory.driver.api().dmabuf(device, addr, len) {
                    Ok(Some(buf)) => {
                        let backing = Backing::DmaBuf { fd: buf.fd.as_fd(), offset: buf.offset };
                        let registered = mrs.register_from(devices, addr, len, backing);
                        // The dma-buf is closed here: each memory region holds its own reference.
                        drop(buf);
                        match registered {
                            Ok(keys) => return (keys, DevicePath::DmaBuf),
                            Err(e) => {
                                let (device, errno) = refused(e);
                                DmaBufSupport::NicRefused { device, errno }
                            }
                        }
                    }
                    Ok(None) => DmaBufSupport::DriverLacksIt,
                    Err(e) => DmaBufSupport::DriverFailed(e.to_string()),
                };
            }
            Choice::PeerMemory => match mrs.register_from(devices, addr, len, Backing::Pointer) {
                Ok(keys) => return (keys, DevicePath::PeerMemory),
                Err(e) => {
                    let (device, errno) = refused(e);
                    support.peer_memory = PeerMemorySupport::NicRefused { device, errno };
                }
            },
            Choice::Staged => return (Vec::new(), DevicePath::Staged(support)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn support(dmabuf: DmaBufSupport, peer_memory: PeerMemorySupport) -> Support {
        Support { dmabuf, peer_memory }
    }

    #[test]
    fn dma_buf_comes_first_while_untried() {
        for peer in [PeerMemorySupport::Untried, PeerMemorySupport::NotLoaded] {
            assert_eq!(choose(&support(DmaBufSupport::Untried, peer)), Choice::DmaBuf);
        }
    }

    #[test]
    fn peer_memory_comes_next_whatever_stopped_dma_buf() {
        let refused = DmaBufSupport::NicRefused { device: "mlx5_0".into(), errno: 95 };
        for dmabuf in [
            DmaBufSupport::VerbsLacksIt,
            DmaBufSupport::DriverLacksIt,
            DmaBufSupport::DriverFailed("invalid argument (1)".into()),
            refused,
        ] {
            assert_eq!(choose(&support(dmabuf.clone(), PeerMemorySupport::Untried)), Choice::PeerMemory, "{dmabuf}");
        }
    }

    #[test]
    fn staged_when_neither_way_is_left() {
        let refused = PeerMemorySupport::NicRefused { device: "rxe0".into(), errno: 14 };
        for peer in [PeerMemorySupport::NotLoaded, refused] {
            assert_eq!(choose(&support(DmaBufSupport::DriverLacksIt, peer.clone())), Choice::Staged, "{peer}");
        }
    }

    #[test]
    fn the_reason_names_both_ways_and_the_errno() {
        let why = support(DmaBufSupport::NicRefused { device: "rxe0".into(), errno: 95 }, PeerMemorySupport::NotLoaded)
            .to_string();
        assert!(why.contains("rxe0 refused its dma-buf") && why.contains("os error 95"), "{why}");
        assert!(why.contains("nvidia_peermem"), "{why}");
        let why = support(DmaBufSupport::VerbsLacksIt, PeerMemorySupport::NotLoaded).to_string();
        assert!(why.contains("ibv_reg_dmabuf_mr"), "{why}");
        assert!(DevicePath::DmaBuf.is_gpudirect() && DevicePath::PeerMemory.is_gpudirect());
        assert!(!DevicePath::Staged(support(DmaBufSupport::DriverLacksIt, PeerMemorySupport::NotLoaded)).is_gpudirect());
    }
}
