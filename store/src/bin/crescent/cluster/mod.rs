//! The operator's subcommands: a running cluster seen and managed through its master.
//!
//! Two of the master's ports are used, each for what only it serves:
//!
//! * its **admin port** (HTTP, `--admin`; [`admin`]) for what is read: `status` and `top`
//!   (`/health`, `/metrics`, `/segments`, `/nodes`), `ls` (`/get_all_keys`, `POST /query`) and
//!   `stat` (`/query_key`). These take no lease and start no engine.
//! * its **gRPC port** (`--master`) for what moves or removes bytes: `get`, `put` and `rm` run a
//!   [`crescent_store::StoreClient`] that contributes no memory (a pure consumer), so the bytes
//!   travel between this process and the holder, never through the master.
//!
//! Where the addresses come from: [`ClusterArgs`]. Every failure is one [`CliError`] or a
//! store error, which `main` prints on one line.

pub mod admin;
pub mod keys;
pub mod prom;
pub mod status;
pub mod transfer;

use std::path::PathBuf;

use clap::Args;
use crescent_store::ClientConfig;
use crescent_transports::net::Keyring;

/// The admin port a master listens on unless told otherwise (`--admin-address`,
/// `--metrics_port`).
pub const DEFAULT_ADMIN_PORT: u16 = 9003;

/// What went wrong, in the operator's words.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The admin port did not answer (the master is down, or another address was meant).
    #[error("the master's admin port {url} cannot be reached: {cause} (is the master running? --admin or CRESCENT_MASTER_ADMIN names the port)")]
    Unreachable { url: String, cause: String },
    /// The master answered as a standby or a deposed leader.
    #[error("the master at {url} is {role}, not the leader{}", leader.as_ref().map(|l| format!(" (the leader is {l})")).unwrap_or_default())]
    NotLeader { url: String, role: String, leader: Option<String> },
    /// 401: no admin token, or a wrong one.
    #[error("the master at {url} refused the admin token: {why}")]
    Refused { url: String, why: String },
    /// The key has no complete object.
    #[error("{key}: no such key")]
    NotFound { key: String },
    /// An answer the tool cannot read (another program on the port, a version mismatch).
    #[error("the master at {url} answered {path} with {what}")]
    BadAnswer { url: String, path: String, what: String },
    /// Arguments that cannot work together, or an address that is not one.
    #[error("{0}")]
    Usage(String),
}

/// Where the cluster is, common to every operator subcommand.
#[derive(Args, Clone, Debug)]
pub struct ClusterArgs {
    /// The master's gRPC address, HOST:PORT (or etcd://HOST:PORT,... with HA) [default:
    /// master_server_address of --config or MOONCAKE_CONFIG_PATH, else MOONCAKE_MASTER, else
    /// 127.0.0.1:50051].
    #[arg(long, value_name = "HOST:PORT")]
    pub master: Option<String>,
    /// The master's admin port, HOST:PORT or http://HOST:PORT [default: the master's host at
    /// port 9003].
    #[arg(long, value_name = "HOST:PORT", env = "CRESCENT_MASTER_ADMIN")]
    pub admin: Option<String>,
    /// A Mooncake client configuration file (JSON) [default: MOONCAKE_CONFIG_PATH].
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The cluster secret's file [default: CRESCENT_CLUSTER_SECRET_FILE, CRESCENT_CLUSTER_SECRET].
    #[arg(long, value_name = "FILE")]
    pub secret_file: Option<PathBuf>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// The cluster as the arguments, the config file and the environment name it.
pub struct Target {
    /// The client settings: the master's gRPC address, the tenant, the secret.
    pub config: ClientConfig,
    /// The cluster secret, when one is set.
    pub keyring: Option<Keyring>,
    admin: Option<String>,
}

impl ClusterArgs {
    /// Resolves the addresses and the secret (flags > config file > environment).
    pub fn target(&self) -> anyhow::Result<Target> {
        let mut config = match &self.config {
            Some(path) => {
                let mut c = ClientConfig::default();
                c.apply_file(path)?;
                c
            }
            None => ClientConfig::from_env()?,
        };
        if let Some(m) = &self.master {
            config.master_server_address = m.trim().to_string();
        }
        let keyring = match &self.secret_file {
            Some(path) => Some(Keyring::load(path)?),
            None => match config.cluster_secret.clone() {
                Some(k) => Some(k),
                None => Keyring::from_env()?,
            },
        };
        config.cluster_secret = keyring.clone();
        Ok(Target { config, keyring, admin: self.admin.clone().filter(|a| !a.trim().is_empty()) })
    }
}

impl Target {
    /// The admin port's base URL: `--admin`, else the master's host at [`DEFAULT_ADMIN_PORT`].
    pub fn admin_url(&self) -> Result<String, CliError> {
        match &self.admin {
            Some(a) => admin_base(a),
            None => {
                let master = self.config.master_server_address.trim();
                if master.contains("://") {
                    return Err(CliError::Usage(format!(
                        "the master is {master}: name its admin port with --admin HOST:PORT (or CRESCENT_MASTER_ADMIN)"
                    )));
                }
                let host = match master.rsplit_once(':') {
                    Some((host, _)) => host,
                    None => master,
                };
                admin_base(&format!("{host}:{DEFAULT_ADMIN_PORT}"))
            }
        }
    }

    /// A client of the admin port, with the admin token when a secret is set.
    pub fn admin(&self) -> Result<admin::Admin, CliError> {
        let token = self.keyring.as_ref().map(crescent_store::master::access::admin_token);
        Ok(admin::Admin::new(self.admin_url()?, token))
    }

    /// The master's name for a key of this tenant.
    pub fn scoped(&self, key: &str) -> String {
        crescent_store::master::tenant::scope(&self.config.tenant_id, key)
    }

    /// This tenant's name for one of the master's keys (None: another tenant's).
    pub fn unscoped<'a>(&self, key: &'a str) -> Option<&'a str> {
        crescent_store::master::tenant::unscope(&self.config.tenant_id, key)
    }
}

/// `http://HOST:PORT` of `HOST:PORT`, `http://HOST:PORT` or `http://HOST:PORT/metrics` (what
/// the master prints).
fn admin_base(given: &str) -> Result<String, CliError> {
    let given = given.trim();
    let rest = given.strip_prefix("http://").unwrap_or(given);
    if rest.contains("://") {
        return Err(CliError::Usage(format!("admin address {given:?}: only http://HOST:PORT or HOST:PORT")));
    }
    let authority = rest.split('/').next().unwrap_or_default();
    if authority.is_empty() || !authority.contains(':') {
        return Err(CliError::Usage(format!("admin address {given:?}: give HOST:PORT")));
    }
    Ok(format!("http://{authority}"))
}

/// `n` bytes for a reader: `0 B`, `512 B`, `1.5 KiB`, `12.0 MiB`, ...
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

/// `used` of `capacity` as a percentage (0 without capacity).
pub fn percent(used: u64, capacity: u64) -> f64 {
    if capacity == 0 {
        0.0
    } else {
        used as f64 * 100.0 / capacity as f64
    }
}

/// Prints `value` as one line of JSON on stdout.
pub fn print_json(value: &serde_json::Value) {
    println!("{value}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_addresses_as_operators_write_them() {
        assert_eq!(admin_base("10.0.0.1:9003").unwrap(), "http://10.0.0.1:9003");
        assert_eq!(admin_base("http://10.0.0.1:9003").unwrap(), "http://10.0.0.1:9003");
        assert_eq!(admin_base("http://127.0.0.1:41000/metrics").unwrap(), "http://127.0.0.1:41000");
        assert!(admin_base("https://x:1").is_err());
        assert!(admin_base("nohost").is_err());
    }

    #[test]
    fn the_admin_port_defaults_to_the_masters_host() {
        let t = Target {
            config: ClientConfig { master_server_address: "10.1.2.3:50051".into(), ..ClientConfig::default() },
            keyring: None,
            admin: None,
        };
        assert_eq!(t.admin_url().unwrap(), "http://10.1.2.3:9003");
        let ha = Target {
            config: ClientConfig { master_server_address: "etcd://10.0.0.1:2379".into(), ..ClientConfig::default() },
            keyring: None,
            admin: None,
        };
        assert!(matches!(ha.admin_url(), Err(CliError::Usage(_))));
    }

    #[test]
    fn sizes_read_as_people_read_them() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(12 << 20), "12.0 MiB");
        assert_eq!(percent(1, 4), 25.0);
        assert_eq!(percent(1, 0), 0.0);
    }
}
