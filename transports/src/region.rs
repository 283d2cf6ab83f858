//! The table of this process's registered memory regions.
//!
//! One table is shared by the engine and all transports. It answers two questions:
//! * initiator side: is `[addr, addr+len)` inside one local registered region? If so the
//!   region's in-flight count is raised for as long as the returned [`InflightGuard`] lives,
//!   and unregistering it is refused meanwhile;
//! * target side: may a peer touch `[addr, addr+len)`? If so a [`RegionAccess`] holds the
//!   region's access lock (shared) while the bytes move, so that an unregister waits for
//!   the access to end and later accesses fail the bounds check.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::lock_api::ArcRwLockReadGuard;
use parking_lot::{RawRwLock, RwLock};
use serde::{Deserialize, Serialize};

use crate::device::{DeviceMemory, Devices};
use crate::{SharedMemory, TransportError};

/// Per-transport registration data of one region, published in the segment descriptor
/// (for RDMA: the memory region's keys on each device).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionKeys {
    /// The region's RDMA keys, one per device it is registered on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rdma: Vec<DeviceKey>,
}

/// An RDMA memory region's keys on one device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceKey {
    /// The device's name.
    pub device: String,
    /// The local key (the owner's work requests name the region by it).
    pub lkey: u32,
    /// The remote key (peers' work requests name the region by it).
    pub rkey: u32,
}

/// One registered region of local memory.
pub struct Region {
    addr: u64,
    len: u64,
    location: String,
    inflight: AtomicUsize,
    access: Arc<RwLock<()>>,
    keys: RwLock<RegionKeys>,
    /// Memory the engine allocated itself (kept alive while it is registered); the shm
    /// transport hands its memfd to same-host peers.
    shared: Option<Arc<SharedMemory>>,
    /// Lent to this process's own transfers only (see [`Region::local_only`]).
    local_only: bool,
    /// Device memory: the CPU never touches it; transports copy it with the driver.
    device: Option<DeviceMemory>,
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .field("location", &self.location)
            .field("inflight", &self.inflight.load(Ordering::Relaxed))
            .finish()
    }
}

impl Region {
    /// A region of `[addr, +len)` at `location` (`cpu:0`, ...), backed by `shared` when the
    /// engine allocated it (so a same-host peer can map it).
    pub fn new(addr: u64, len: u64, location: impl Into<String>, shared: Option<Arc<SharedMemory>>) -> Self {
        Region {
            addr,
            len,
            location: location.into(),
            inflight: AtomicUsize::new(0),
            access: Arc::new(RwLock::new(())),
            keys: RwLock::new(RegionKeys::default()),
            shared,
            local_only: false,
            device: None,
        }
    }

    /// A region of device memory: `[addr, +len)` inside `memory`'s allocation, at its
    /// location (`cuda:N`).
    pub fn on_device(addr: u64, len: u64, memory: DeviceMemory) -> Self {
        let location = memory.location();
        Region { device: Some(memory), ..Region::new(addr, len, location, None) }
    }

    /// Its device memory, when it is on a device (the CPU must not touch it).
    pub fn device(&self) -> Option<&DeviceMemory> {
        self.device.as_ref()
    }

    /// Memory lent to this process's own transfers only: peers never get access to it and
    /// it is never published, exported or registered with a NIC.
    pub fn local_only(addr: u64, len: u64) -> Self {
        Region { local_only: true, ..Region::new(addr, len, "local-only", None) }
    }

    /// It is [`Region::local_only`].
    pub fn is_local_only(&self) -> bool {
        self.local_only
    }
    /// Its first byte's address.
    pub fn addr(&self) -> u64 {
        self.addr
    }
    /// Its length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }
    /// It has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The address one past its last byte.
    pub fn end(&self) -> u64 {
        self.addr + self.len
    }
    /// Where the memory is, as registered (`cpu:0`, ...).
    pub fn location(&self) -> &str {
        &self.location
    }
    /// The transports' keys for it, as published.
    pub fn keys(&self) -> RegionKeys {
        self.keys.read().clone()
    }
    /// Whether an RDMA device registered it (its keys name at least one device): for device
    /// memory, whether it is registered for GPUDirect RDMA.
    pub fn has_rdma_keys(&self) -> bool {
        !self.keys.read().rdma.is_empty()
    }
    /// Sets the keys the transports registered it under.
    pub fn set_keys(&self, keys: RegionKeys) {
        *self.keys.write() = keys;
    }
    /// The shareable memory backing this region, when the engine allocated it.
    pub fn shared_memory(&self) -> Option<&Arc<SharedMemory>> {
        self.shared.as_ref()
    }
    /// Transfers issued by this process that still use this region.
    pub fn inflight(&self) -> usize {
        self.inflight.load(Ordering::Acquire)
    }
    fn contains(&self, addr: u64, len: u64) -> bool {
        addr >= self.addr && addr.checked_add(len).is_some_and(|end| end <= self.end())
    }
}

/// Keeps a local region marked in use by a transfer; dropping it ends the use.
#[derive(Debug)]
pub struct InflightGuard {
    region: Arc<Region>,
}

impl InflightGuard {
    /// The region in use.
    pub fn region(&self) -> &Arc<Region> {
        &self.region
    }
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        self.region.inflight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A peer's permission to touch `[addr, addr+len)` of a local region, held while the bytes move.
pub struct RegionAccess {
    addr: u64,
    len: u64,
    region: Arc<Region>,
    _lock: ArcRwLockReadGuard<RawRwLock, ()>,
}

impl RegionAccess {
    /// The first byte's address.
    pub fn addr(&self) -> u64 {
        self.addr
    }
    /// The length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }
    /// It covers no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The region's device memory when it is on a device: then the bytes move through the
    /// driver's copies only, never [`RegionAccess::as_slice`].
    pub fn device(&self) -> Option<&DeviceMemory> {
        self.region.device()
    }
    /// The bytes as a slice (host memory only: see [`RegionAccess::device`]).
    pub fn as_slice(&self) -> &[u8] {
        assert!(self.region.device.is_none(), "device memory is never touched by the CPU");
        // SAFETY: `[addr, addr+len)` lies inside a registered region (checked when the access
        // was granted) that cannot be unregistered while this access holds its lock.
        unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.len as usize) }
    }
    /// The bytes as a mutable slice (host memory only). Registered memory is shared with remote peers by
    /// contract: the owner does not expect exclusive use of it while it is registered.
    #[allow(clippy::mut_from_ref)]
    pub fn as_mut_slice(&self) -> &mut [u8] {
        assert!(self.region.device.is_none(), "device memory is never touched by the CPU");
        // SAFETY: as in `as_slice`; writes into registered memory are what the owner
        // registered it for (one-sided remote writes).
        unsafe { std::slice::from_raw_parts_mut(self.addr as *mut u8, self.len as usize) }
    }
}

/// All registered regions of this process, keyed by start address, and the device driver
/// that reaches those on a device.
#[derive(Debug, Default)]
pub struct RegionTable {
    regions: RwLock<BTreeMap<u64, Arc<Region>>>,
    devices: Devices,
    /// Regions on a device now: while none is, transports skip the look-up of a slice's region.
    device_regions: AtomicUsize,
}

impl RegionTable {
    /// A table with no region; its device driver is loaded from the default place when first
    /// needed.
    pub fn new() -> Self {
        Self::default()
    }

    /// A table with no region whose device driver is `devices`.
    pub fn with_devices(devices: Devices) -> Self {
        RegionTable { devices, ..Self::default() }
    }

    /// The device driver of this process's registrations.
    pub fn devices(&self) -> &Devices {
        &self.devices
    }

    /// Whether any registered region is on a device now.
    pub fn holds_device_memory(&self) -> bool {
        self.device_regions.load(Ordering::Acquire) > 0
    }

    /// The device memory holding `[addr, +len)`, when a registered region on a device holds
    /// it (host memory and unregistered ranges: `None`). Cheap while no region is on a device.
    pub fn device_memory(&self, addr: u64, len: u64) -> Option<DeviceMemory> {
        if self.device_regions.load(Ordering::Acquire) == 0 {
            return None;
        }
        self.find(addr, len)?.device().cloned()
    }

    /// Adds a region; rejects empty, wrapping or overlapping ranges.
    pub fn insert(&self, region: Region) -> Result<Arc<Region>, TransportError> {
        let (addr, len) = (region.addr, region.len);
        if len == 0 {
            return Err(TransportError::InvalidArgument(format!("region at {addr:#x} has length 0")));
        }
        if addr == 0 || addr.checked_add(len).is_none() {
            return Err(TransportError::InvalidArgument(format!(
                "region [{addr:#x}, +{len}) is not a valid address range"
            )));
        }
        let mut map = self.regions.write();
        if let Some(other) = Self::overlapping(&map, addr, len) {
            return Err(TransportError::Overlap { addr, len, other });
        }
        let region = Arc::new(region);
        if region.device.is_some() {
            self.device_regions.fetch_add(1, Ordering::AcqRel);
        }
        map.insert(addr, region.clone());
        Ok(region)
    }

    fn overlapping(map: &BTreeMap<u64, Arc<Region>>, addr: u64, len: u64) -> Option<u64> {
        let end = addr + len;
        if let Some((_, before)) = map.range(..=addr).next_back() {
            if before.end() > addr {
                return Some(before.addr);
            }
        }
        map.range(addr..end).next().map(|(a, _)| *a)
    }

    /// Removes the region that starts at `addr`.
    ///
    /// Refused while transfers issued by this process use it. A peer's access in progress is
    /// waited for up to `wait`; if it does not end by then the region stays registered and
    /// the call fails with [`TransportError::RegionBusy`].
    pub fn remove(&self, addr: u64, wait: Duration) -> Result<Arc<Region>, TransportError> {
        let region = {
            let mut map = self.regions.write();
            let region = map.get(&addr).cloned().ok_or(TransportError::NotRegistered(addr))?;
            let inflight = region.inflight();
            if inflight > 0 {
                return Err(TransportError::RegionBusy {
                    addr,
                    why: format!("{inflight} transfer slice(s) in flight use it"),
                });
            }
            map.remove(&addr);
            region
        };
        // No new access can start now; wait for accesses in progress to end.
        let quiesced = region.access.try_write_for(wait).is_some();
        match quiesced {
            true => {
                if region.device.is_some() {
                    self.device_regions.fetch_sub(1, Ordering::AcqRel);
                }
                Ok(region)
            }
            false => {
                self.regions.write().insert(addr, region.clone());
                Err(TransportError::RegionBusy { addr, why: format!("a peer's access did not end within {wait:?}") })
            }
        }
    }

    /// Where the region containing `addr` ends, if one does (a look-up without taking a
    /// reference to the region).
    pub fn end_of(&self, addr: u64) -> Option<u64> {
        Self::find_in(&self.regions.read(), addr, 1).map(|region| region.end())
    }

    /// The region containing all of `[addr, addr+len)`, if any.
    pub fn find(&self, addr: u64, len: u64) -> Option<Arc<Region>> {
        let map = self.regions.read();
        Self::find_in(&map, addr, len).cloned()
    }

    fn find_in(map: &BTreeMap<u64, Arc<Region>>, addr: u64, len: u64) -> Option<&Arc<Region>> {
        let (_, region) = map.range(..=addr).next_back()?;
        region.contains(addr, len).then_some(region)
    }

    /// Initiator side: marks the region holding `[addr, addr+len)` in use by a transfer.
    pub fn acquire_local(&self, addr: u64, len: u64) -> Result<InflightGuard, TransportError> {
        let map = self.regions.read();
        let region = Self::find_in(&map, addr, len).ok_or_else(|| {
            TransportError::InvalidArgument(format!(
                "local range [{addr:#x}, +{len}) is not inside one registered region"
            ))
        })?;
        region.inflight.fetch_add(1, Ordering::AcqRel);
        Ok(InflightGuard { region: region.clone() })
    }

    /// Target side: grants a peer access to `[addr, addr+len)` if it lies inside one
    /// registered region; `None` otherwise (the peer gets an out-of-range error).
    pub fn access(&self, addr: u64, len: u64) -> Option<RegionAccess> {
        let region = self.find(addr, len).filter(|r| !r.local_only)?;
        let lock = region.access.read_arc();
        Some(RegionAccess { addr, len, region, _lock: lock })
    }

    /// [`RegionTable::access`] without waiting: `Err(())` when the region's lock cannot be
    /// taken now (an unregister waits for it). For a caller that already holds an access to
    /// the region: a second blocking one would wait behind that unregister, which waits for
    /// the first.
    #[allow(clippy::result_unit_err)]
    pub fn try_access(&self, addr: u64, len: u64) -> Result<Option<RegionAccess>, ()> {
        let Some(region) = self.find(addr, len).filter(|r| !r.local_only) else {
            return Ok(None);
        };
        let lock = region.access.try_read_arc().ok_or(())?;
        Ok(Some(RegionAccess { addr, len, region, _lock: lock }))
    }

    /// Every registered region, in address order.
    pub fn snapshot(&self) -> Vec<Arc<Region>> {
        self.regions.read().values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table_with(regions: &[(u64, u64)]) -> RegionTable {
        let t = RegionTable::new();
        for &(a, l) in regions {
            t.insert(Region::new(a, l, "cpu:0", None)).unwrap();
        }
        t
    }

    #[test]
    fn overlapping_regions_are_rejected() {
        let t = table_with(&[(0x1000, 0x1000)]);
        for (a, l) in [(0x1000, 1), (0x1fff, 1), (0x800, 0x801), (0x800, 0x2000)] {
            let err = t.insert(Region::new(a, l, "cpu:0", None)).unwrap_err();
            assert!(matches!(err, TransportError::Overlap { other: 0x1000, .. }), "{a:#x}+{l}: {err}");
        }
        // Adjacent on both sides is fine.
        t.insert(Region::new(0x800, 0x800, "cpu:0", None)).unwrap();
        t.insert(Region::new(0x2000, 0x10, "cpu:0", None)).unwrap();
    }

    #[test]
    fn invalid_ranges_are_rejected() {
        let t = RegionTable::new();
        assert!(t.insert(Region::new(0x1000, 0, "cpu:0", None)).is_err());
        assert!(t.insert(Region::new(u64::MAX - 4, 10, "cpu:0", None)).is_err());
        assert!(t.insert(Region::new(0, 10, "cpu:0", None)).is_err());
    }

    #[test]
    fn access_is_bounds_checked() {
        let t = table_with(&[(0x1000, 0x1000), (0x2000, 0x1000)]);
        assert!(t.access(0x1000, 0x1000).is_some());
        assert!(t.access(0x1fff, 1).is_some());
        assert!(t.access(0x1fff, 2).is_none(), "a single access never spans two regions");
        assert!(t.access(0xfff, 1).is_none());
        assert!(t.access(0x3000, 1).is_none());
        assert!(t.access(u64::MAX, 2).is_none());
    }

    #[test]
    fn local_only_memory_serves_own_transfers_but_never_a_peer() {
        let t = RegionTable::new();
        t.insert(Region::local_only(0x1000, 0x1000)).unwrap();
        assert!(t.acquire_local(0x1000, 0x1000).is_ok(), "this process's transfers may use it");
        assert!(t.access(0x1000, 1).is_none(), "a peer may not");
        assert!(t.find(0x1000, 1).unwrap().is_local_only());
    }

    #[test]
    fn unregister_is_refused_while_in_flight() {
        let t = table_with(&[(0x1000, 0x1000)]);
        let guard = t.acquire_local(0x1100, 16).unwrap();
        let err = t.remove(0x1000, Duration::from_millis(10)).unwrap_err();
        assert!(matches!(err, TransportError::RegionBusy { .. }));
        drop(guard);
        t.remove(0x1000, Duration::from_millis(10)).unwrap();
        assert!(t.access(0x1100, 1).is_none());
    }

    #[test]
    fn unregister_waits_for_a_peer_access_then_gives_up() {
        let t = table_with(&[(0x1000, 0x1000)]);
        let access = t.access(0x1000, 8).unwrap();
        let err = t.remove(0x1000, Duration::from_millis(20)).unwrap_err();
        assert!(matches!(err, TransportError::RegionBusy { .. }));
        // The failed unregister left the region registered.
        assert!(t.find(0x1000, 1).is_some());
        drop(access);
        t.remove(0x1000, Duration::from_millis(20)).unwrap();
    }
}
