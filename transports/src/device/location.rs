//! Mooncake's memory locations (`cpu:0`, `cuda:1`, `*`) and where a registered range lies.

use std::str::FromStr;

use super::{DeviceMemory, Devices};
use crate::TransportError;

/// A location as a registration names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// Host memory, with its label as given (`cpu:0`, or any name that is not a device's).
    Host(String),
    /// Memory of CUDA device `N` (`cuda:N`).
    Cuda(u32),
    /// `*` (or empty): the driver's pointer attributes decide, as upstream's
    /// `getMemoryLocation` does; host memory when no driver is loaded.
    Any,
}

impl FromStr for Location {
    type Err = TransportError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s.is_empty() || s == "*" {
            return Ok(Location::Any);
        }
        match s.split_once(':') {
            Some((vendor, n)) if vendor.eq_ignore_ascii_case("cuda") => n.parse().map(Location::Cuda).map_err(|_| {
                TransportError::InvalidArgument(format!(
                    "location {s:?}: a device location is cuda:N with N a device number"
                ))
            }),
            _ => Ok(Location::Host(s.to_string())),
        }
    }
}

/// Where a registered range lies, as found at registration.
#[derive(Debug, Clone)]
pub enum Placement {
    /// Host memory, with its location's label.
    Host(String),
    /// Device memory.
    Device(DeviceMemory),
}

impl Placement {
    /// The location to publish (`cpu:0`, `cuda:1`, `*`).
    pub fn label(&self) -> String {
        match self {
            Placement::Host(label) => label.clone(),
            Placement::Device(memory) => memory.location(),
        }
    }
}

/// See [`Devices::place`]: a host location is taken as given (the driver is not asked); a
/// device location must name a device the driver knows, and the range must lie inside one
/// allocation on that device; `*` asks the driver, when there is one.
pub(super) fn place(devices: &Devices, addr: u64, len: u64, location: &str) -> Result<Placement, TransportError> {
    match location.parse::<Location>()? {
        Location::Host(label) => Ok(Placement::Host(label)),
        Location::Any => {
            let driver = match devices.driver() {
                Ok(driver) => driver,
                Err(_) => return Ok(Placement::Host(location.trim().to_string())),
            };
            // As upstream: a pointer the driver cannot classify is registered as host memory.
            let found = driver.api().allocation(addr).unwrap_or_else(|e| {
                tracing::warn!("device memory: cannot tell where {addr:#x} is ({e}); registering it as host memory");
                None
            });
            match found {
                None => Ok(Placement::Host(location.trim().to_string())),
                Some(allocation) => {
                    check_inside(addr, len, &allocation)?;
                    Ok(Placement::Device(DeviceMemory { driver, allocation }))
                }
            }
        }
        Location::Cuda(device) => {
            let driver = devices.driver()?;
            let count = driver.api().device_count()?;
            if device >= count {
                return Err(TransportError::UnknownDevice { location: location.trim().to_string(), devices: count });
            }
            let allocation = driver
                .api()
                .allocation(addr)?
                .ok_or_else(|| TransportError::NotDeviceMemory { addr, location: location.trim().to_string() })?;
            if allocation.device != device {
                return Err(TransportError::WrongDevice {
                    addr,
                    location: location.trim().to_string(),
                    actual: allocation.device,
                });
            }
            check_inside(addr, len, &allocation)?;
            Ok(Placement::Device(DeviceMemory { driver, allocation }))
        }
    }
}

fn check_inside(addr: u64, len: u64, allocation: &super::Allocation) -> Result<(), TransportError> {
    if allocation.contains(addr, len) {
        return Ok(());
    }
    Err(TransportError::SpansAllocations { addr, len, base: allocation.base, size: allocation.len })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_parse_as_upstream_names_them() {
        assert_eq!("cuda:0".parse::<Location>().unwrap(), Location::Cuda(0));
        assert_eq!(" CUDA:3 ".parse::<Location>().unwrap(), Location::Cuda(3));
        assert_eq!("*".parse::<Location>().unwrap(), Location::Any);
        assert_eq!("".parse::<Location>().unwrap(), Location::Any);
        assert_eq!("cpu:1".parse::<Location>().unwrap(), Location::Host("cpu:1".into()));
        let err = "cuda:x".parse::<Location>().unwrap_err();
        assert!(err.is_caller_error(), "{err}");
        assert!("cuda:".parse::<Location>().is_err());
    }

    #[test]
    fn a_device_location_without_a_driver_is_a_clear_error_and_host_memory_needs_none() {
        let devices = Devices::new(Some("/nonexistent/libcuda-for-this-test.so".into()));
        let err = devices.place(0x1000, 10, "cuda:0").unwrap_err();
        assert!(matches!(err, TransportError::DriverUnavailable { .. }), "{err}");
        assert!(!err.is_caller_error(), "a missing driver is the host's fault");
        assert!(err.to_string().contains("libcuda-for-this-test"), "{err}");
        assert!(matches!(devices.place(0x1000, 10, "cpu:0").unwrap(), Placement::Host(l) if l == "cpu:0"));
        assert!(matches!(devices.place(0x1000, 10, "*").unwrap(), Placement::Host(l) if l == "*"));
    }
}
