//! Two "hosts" on one machine: two network namespaces joined by a veth pair, with addresses
//! from 198.18.0.0/15 (the benchmarking range) chosen by the test. Needs root and `ip`.

use std::process::Command;

pub struct HostPair {
    pub a: String,
    pub b: String,
    pub addr_a: String,
    pub addr_b: String,
    pub veth_a: String,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip").args(args).output().map_err(|e| format!("cannot run ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

impl HostPair {
    /// [`HostPair::create`], or `None` once [`crate::skip`] has said why (after `what`, the
    /// test's name for itself) the test cannot run here.
    pub fn create_or_skip(tag: &str, what: &str) -> Option<HostPair> {
        HostPair::create(tag).map_err(|why| crate::skip(&format!("{what}: {why}"))).ok()
    }

    /// Creates the pair, or says why it cannot (not root, no `ip`): the caller skips.
    pub fn create(tag: &str) -> Result<HostPair, String> {
        if !rustix::process::geteuid().is_root() {
            return Err("not root: network namespaces need CAP_SYS_ADMIN".into());
        }
        let id = std::process::id() % 100_000;
        let n = (id as usize + tag.len() * 7919) % 250 + 1;
        let pair = HostPair {
            a: format!("crsc-{tag}-a-{id}"),
            b: format!("crsc-{tag}-b-{id}"),
            addr_a: format!("198.18.{n}.1"),
            addr_b: format!("198.18.{n}.2"),
            veth_a: format!("cv{id}{}a", &tag[..tag.len().min(4)]),
        };
        let veth_b = pair.veth_a.trim_end_matches('a').to_string() + "b";
        let setup = || -> Result<(), String> {
            ip(&["netns", "add", &pair.a])?;
            ip(&["netns", "add", &pair.b])?;
            ip(&["link", "add", &pair.veth_a, "type", "veth", "peer", "name", &veth_b])?;
            ip(&["link", "set", &pair.veth_a, "netns", &pair.a])?;
            ip(&["link", "set", &veth_b, "netns", &pair.b])?;
            for (ns, dev, addr) in [(&pair.a, &pair.veth_a, &pair.addr_a), (&pair.b, &veth_b, &pair.addr_b)] {
                ip(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", dev])?;
                ip(&["-n", ns, "link", "set", dev, "up"])?;
                ip(&["-n", ns, "link", "set", "lo", "up"])?;
            }
            Ok(())
        };
        setup()?;
        Ok(pair)
    }

    /// The veth end inside namespace `b`.
    pub fn veth_b(&self) -> String {
        self.veth_a.trim_end_matches('a').to_string() + "b"
    }

    /// `ip netns exec <ns>` as a command prefix.
    pub fn exec_prefix<'a>(&'a self, ns: &'a str) -> [&'a str; 4] {
        ["ip", "netns", "exec", ns]
    }
}

/// Runs `f` on a thread of its own that has moved into the network namespace `ns` (made by
/// [`HostPair`]): sockets it opens, and threads it starts, live there.
pub fn in_netns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let path = format!("/var/run/netns/{ns}");
    std::thread::spawn(move || {
        let fd = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        rustix::thread::move_into_link_name_space(
            std::os::fd::AsFd::as_fd(&fd),
            Some(rustix::thread::LinkNameSpaceType::Network),
        )
        .unwrap_or_else(|e| panic!("setns {path}: {e}"));
        f()
    })
    .join()
    .expect("the thread in the namespace panicked")
}

impl Drop for HostPair {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.a]);
        let _ = ip(&["netns", "del", &self.b]);
    }
}
