//! Facts about this host: the address to advertise and the host id that tells "same host"
//! (same kernel and same network namespace) from "another host".

use std::net::IpAddr;

/// The first non-loopback IPv4 address of an interface that is up, else 127.0.0.1.
pub fn default_advertise_host() -> String {
    if_addrs::get_if_addrs()
        .ok()
        .and_then(|ifs| {
            ifs.into_iter().filter(|i| !i.is_loopback()).map(|i| i.ip()).find(|ip| matches!(ip, IpAddr::V4(_)))
        })
        .map(|ip| ip.to_string())
        .unwrap_or_else(|| "127.0.0.1".to_string())
}

/// `<boot id>/<network namespace inode>`: equal only for processes that share a kernel
/// (boot) and a network namespace. Two namespaces on one machine are two hosts.
pub fn host_id() -> String {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown-boot".into());
    let netns = std::fs::read_link("/proc/self/ns/net")
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "unknown-netns".into());
    format!("{boot}/{netns}")
}

#[cfg(test)]
mod tests {
    #[test]
    fn host_id_is_stable_and_names_the_namespace() {
        let a = super::host_id();
        assert_eq!(a, super::host_id());
        assert!(a.contains("net:["), "{a}");
    }
}
