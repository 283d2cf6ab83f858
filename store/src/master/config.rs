//! The master's settings.

use std::time::Duration;

use serde::Deserialize;

use crate::error::{Result, StoreError};

/// Where a put's replicas go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum AllocationStrategy {
    /// Any segments with room, chosen at random.
    Random,
    /// The writer's own segment first when it has room, then random (the default).
    #[value(alias = "local_first")]
    LocalFirst,
    /// The segments with the largest share of free space first.
    #[value(alias = "free_ratio_first")]
    FreeRatioFirst,
}

/// The master's settings, under upstream's names (a JSON config file's keys, the flags of
/// [`super::cli`]). Durations in a file are milliseconds. Checked by
/// [`MasterConfig::validate`] when the master starts.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MasterConfig {
    /// gRPC listen address.
    pub rpc_address: String,
    /// HTTP admin listen address (`/metrics`, `/health`, `/query_key`, `/keys`, `/segments`); empty: none.
    pub admin_address: String,
    /// Where a put's replicas go.
    pub allocation_strategy: AllocationStrategy,
    /// A read lease lasts this long after a get's replica list.
    #[serde(with = "millis", alias = "lease_ttl_ms")]
    pub lease_ttl: Duration,
    /// Default soft pin length for puts that ask for one.
    #[serde(with = "millis", alias = "default_soft_pin_ttl_ms")]
    pub default_soft_pin_ttl: Duration,
    /// Eviction starts when used / capacity passes this.
    pub eviction_high_watermark: f64,
    /// Share of capacity one eviction frees.
    pub eviction_ratio: f64,
    /// How much nicer than the rest of the master its evictor thread runs (0 to 19, added to
    /// the master's nice value, 19 at most): above 0, a round yields the cores to the calls
    /// while it runs, and takes what they leave. A put that finds no room never waits for it:
    /// it evicts what it needs itself.
    pub evictor_nice: i32,
    /// The share of one core an eviction round takes while memory is not tight (0 to 1; 1: no
    /// pauses): after each step the evictor sleeps in proportion to the step's time, so the
    /// calls keep the cores. A round runs at full speed once a put has found no room or memory
    /// use passes halfway from the high watermark to full.
    pub evictor_duty: f64,
    /// A client silent for this long is dropped with its segments and replicas.
    #[serde(with = "millis", alias = "client_ttl_ms")]
    pub client_ttl: Duration,
    /// A put started and not ended (or revoked) within this is reclaimed.
    #[serde(with = "millis", alias = "put_timeout_ms")]
    pub put_timeout: Duration,
    /// How long a blank (a placement granted to a client ahead of its puts, see the master's
    /// `blanks`) stays the client's; the sweep takes back the space of one not used by then.
    /// 0: no blanks (every put starts with `PutStart`).
    #[serde(with = "millis", alias = "blank_ttl_ms")]
    pub blank_ttl: Duration,
    /// Most bytes of blanks one client holds at once.
    pub blank_bytes_per_client: u64,
    /// How often liveness, reclaim and eviction are checked.
    #[serde(with = "millis", alias = "sweep_interval_ms")]
    pub sweep_interval: Duration,
    /// Events kept for subscribers that fall behind; beyond it they lose events (and are told).
    pub event_buffer: usize,
    /// Longest TTL a client may publish near-engine keys with.
    #[serde(with = "millis", alias = "publish_max_ttl_ms")]
    pub publish_max_ttl: Duration,
    /// Most near-engine keys published at once (all clients together).
    pub max_published_keys: usize,
    /// Hot-key policy: keys read more often than this (reads per second over `hot_window`) get
    /// one more replica, through a client running a warm-up worker; 0 turns the policy off.
    pub hot_read_threshold: f64,
    /// The window the hot-key policy counts reads over.
    #[serde(with = "millis", alias = "hot_window_ms")]
    pub hot_window: Duration,
    /// The policy adds replicas up to this many per object.
    pub hot_max_replicas: u32,
    /// Most replication tasks waiting for a worker; hot keys beyond it are dropped (and counted).
    pub hot_queue: usize,
    /// A replica task (`create_copy_task` / `create_move_task`) not taken by its client within
    /// this fails ("pending timeout"; `--pending_task_timeout_sec`); 0: no deadline (upstream's
    /// meaning of 0).
    #[serde(with = "millis", alias = "task_pending_timeout_ms")]
    pub task_pending_timeout: Duration,
    /// A replica task its client has not reported within this fails ("processing timeout";
    /// `--processing_task_timeout_sec`); 0: no deadline.
    #[serde(with = "millis", alias = "task_processing_timeout_ms")]
    pub task_processing_timeout: Duration,
    /// Most replica tasks waiting for their clients; more are refused with
    /// `TASK_PENDING_LIMIT_EXCEEDED` (`--max_total_pending_tasks`).
    pub max_pending_tasks: usize,
    /// Finished replica tasks kept for `query_task`; the oldest are forgotten beyond it
    /// (`--max_total_finished_tasks`).
    pub max_finished_tasks: usize,
    /// Directory where the master keeps what must outlive it: the removals waiting for disks
    /// that are away (see docs/src/disk-tier.md). None: kept in memory only.
    pub state_dir: Option<std::path::PathBuf>,
    /// How long a put's commit (or a removal's answer) waits for the owners of its replicas to
    /// acknowledge the news; a replica whose owner did not is not committed.
    #[serde(with = "millis", alias = "owner_ack_timeout_ms")]
    pub owner_ack_timeout: Duration,
    /// Worker threads of the runtime serving gRPC and the admin port (`--rpc_thread_num`).
    pub rpc_threads: usize,
    /// Set TCP_NODELAY on clients' connections (`--rpc_enable_tcp_no_delay`): batch replies
    /// span several segments and would otherwise wait on the client's delayed ACK.
    pub rpc_tcp_nodelay: bool,
    /// The fast RPC port for the hot calls of Crescent's own clients (`crate::fastrpc`), on
    /// the gRPC address's host (`--fast_rpc_port`): 0 picks a free port (the default; pings
    /// advertise it), `None` serves gRPC only.
    pub fast_rpc_port: Option<u16>,
    /// Where to serve an embedded http metadata server (`GET/PUT/DELETE /metadata?key=`, as
    /// Mooncake's `--enable_http_metadata_server`); empty: none.
    pub http_metadata_address: String,
    /// The cluster this master serves (`--cluster_id`); shown on `/health`, and the namespace
    /// of high availability's keys (the leader key, see docs/src/ha.md).
    pub cluster_id: String,
    /// High availability (`--enable_ha` and its backend, etcd): see docs/src/ha.md.
    pub ha: HaConfig,
    /// A file holding the cluster secret (one line; two during a rotation), `--cluster-secret-file`;
    /// `None`: [`MasterConfig::cluster_secret`], else the environment's
    /// (`CRESCENT_CLUSTER_SECRET_FILE`, `CRESCENT_CLUSTER_SECRET`, `CRESCENT_CLUSTER_SECRET_NEXT`).
    /// With a secret, every gRPC call and admin request needs its token (see
    /// [`crate::master::access`]).
    pub cluster_secret_file: Option<std::path::PathBuf>,
    /// The secret given directly (by a program embedding the master).
    #[serde(skip)]
    pub cluster_secret: Option<crescent_transports::net::Keyring>,
    /// With a secret, leave the admin port's read-only routes open (`--admin-open-reads`).
    pub admin_open_reads: bool,
    /// The most memory the objects' metadata may take (`--max-metadata-bytes`), counted as
    /// [`crate::master::OBJECT_METADATA_BYTES`] per object plus its key: a put that would pass
    /// it evicts the least recently used objects first, and is refused (`NO_SPACE`) when none
    /// can go. `None`: half the machine's memory, so that long keys under load end in
    /// eviction or refusals, never in the master killed for memory.
    pub max_metadata_bytes: Option<u64>,
}

/// Mooncake's high-availability settings (docs/src/ha.md): with `enabled`, the master campaigns
/// for the leadership of `cluster_id` in etcd and is a standby until elected.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HaConfig {
    /// Campaign for the leadership (else this master serves alone).
    pub enabled: bool,
    /// `etcd` (upstream also names `redis` and `k8s`, which Crescent refuses).
    pub backend_type: String,
    /// The backend's endpoints, e.g. `127.0.0.1:2379;127.0.0.2:2379` for etcd.
    pub connstring: String,
    /// The leadership's lease in etcd (whole seconds; etcd's floor is 2 s).
    #[serde(with = "millis", alias = "lease_ttl_ms")]
    pub lease_ttl: Duration,
    /// The address clients reach this master at, written in etcd when it leads; empty: the RPC
    /// address (127.0.0.1 for a wildcard).
    pub advertise_address: String,
}

impl Default for HaConfig {
    fn default() -> Self {
        HaConfig {
            enabled: false,
            backend_type: "etcd".into(),
            connstring: String::new(),
            lease_ttl: Duration::from_secs(2),
            advertise_address: String::new(),
        }
    }
}

/// The HA backends upstream names.
pub const HA_BACKENDS: [&str; 3] = ["etcd", "redis", "k8s"];

pub use crate::protocol::DEFAULT_CLUSTER_ID;

/// [`MasterConfig::evictor_nice`]'s default: 0, the evictor at the master's own priority. At
/// 10 (a nice-10 thread weighs about a tenth of a nice-0 one where both want the same core)
/// the 10 M-object store's batched puts while evicting fell to 44.9 k ops/s against 104.3 k
/// at 0 (storebench master, 2026-12-03 19:05 / 19:15 UTC): puts that found no room evicted for
/// themselves while the nice evictor waited for a core. See docs/src/benchmarks.md.
pub const DEFAULT_EVICTOR_NICE: i32 = 0;

/// [`MasterConfig::evictor_duty`]'s default. See docs/src/benchmarks.md for what it does to a
/// call's p99 while a round runs.
pub const DEFAULT_EVICTOR_DUTY: f64 = 0.25;

/// Threads serving gRPC on a machine of `cpus` CPUs when no flag says: as upstream's
/// `mooncake_master` (its `--max_threads` default of 4, capped at the CPU count).
pub fn rpc_threads_for(cpus: usize) -> usize {
    cpus.clamp(1, 4)
}

impl Default for MasterConfig {
    fn default() -> Self {
        MasterConfig {
            rpc_address: "0.0.0.0:50051".into(),
            admin_address: "0.0.0.0:9003".into(),
            allocation_strategy: AllocationStrategy::LocalFirst,
            lease_ttl: Duration::from_secs(10),
            default_soft_pin_ttl: Duration::from_secs(30 * 60),
            eviction_high_watermark: 0.90,
            eviction_ratio: 0.05,
            evictor_nice: DEFAULT_EVICTOR_NICE,
            evictor_duty: DEFAULT_EVICTOR_DUTY,
            client_ttl: Duration::from_secs(10),
            put_timeout: Duration::from_secs(60),
            blank_ttl: Duration::from_secs(10),
            blank_bytes_per_client: 256 << 20,
            sweep_interval: Duration::from_millis(200),
            event_buffer: 65_536,
            publish_max_ttl: Duration::from_secs(3600),
            max_published_keys: 4 << 20,
            hot_read_threshold: 0.0,
            hot_window: Duration::from_secs(5),
            hot_max_replicas: 3,
            hot_queue: 1024,
            task_pending_timeout: Duration::from_secs(300),
            task_processing_timeout: Duration::from_secs(300),
            max_pending_tasks: 10_000,
            max_finished_tasks: 10_000,
            state_dir: None,
            owner_ack_timeout: Duration::from_secs(3),
            rpc_threads: rpc_threads_for(std::thread::available_parallelism().map_or(1, |p| p.get())),
            rpc_tcp_nodelay: true,
            fast_rpc_port: Some(0),
            http_metadata_address: String::new(),
            cluster_id: DEFAULT_CLUSTER_ID.into(),
            ha: HaConfig::default(),
            cluster_secret_file: None,
            cluster_secret: None,
            admin_open_reads: false,
            max_metadata_bytes: None,
        }
    }
}

impl MasterConfig {
    /// The cluster secret: [`Self::cluster_secret_file`], else [`Self::cluster_secret`], else
    /// the environment's; `None` when none is set.
    pub fn secret(&self) -> Result<Option<crescent_transports::net::Keyring>> {
        use crescent_transports::net::Keyring;
        let config = |e: crescent_transports::net::AuthError| StoreError::Config(e.to_string());
        if let Some(path) = &self.cluster_secret_file {
            return Keyring::load(path).map(Some).map_err(config);
        }
        if let Some(k) = &self.cluster_secret {
            return Ok(Some(k.clone()));
        }
        Keyring::from_env().map_err(config)
    }

    /// Checks the settings: watermark and eviction ratio in (0, 1], the leases and timeouts
    /// positive, the HA settings valid; the first value out of range is a
    /// [`StoreError::Config`] naming it.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(StoreError::Config(m));
        if !(self.eviction_high_watermark > 0.0 && self.eviction_high_watermark <= 1.0) {
            return bad(format!("eviction_high_watermark {} is not in (0, 1]", self.eviction_high_watermark));
        }
        if !(self.eviction_ratio > 0.0 && self.eviction_ratio <= 1.0) {
            return bad(format!("eviction_ratio {} is not in (0, 1]", self.eviction_ratio));
        }
        if !(0..=19).contains(&self.evictor_nice) {
            return bad(format!("evictor_nice {} is not in 0..=19", self.evictor_nice));
        }
        if !(self.evictor_duty > 0.0 && self.evictor_duty <= 1.0) {
            return bad(format!("evictor_duty {} is not in (0, 1]", self.evictor_duty));
        }
        for (name, d) in [
            ("lease_ttl", self.lease_ttl),
            ("client_ttl", self.client_ttl),
            ("put_timeout", self.put_timeout),
            ("owner_ack_timeout", self.owner_ack_timeout),
        ] {
            if d.is_zero() {
                return bad(format!("{name} must be positive"));
            }
        }
        if self.sweep_interval.is_zero() {
            return bad("sweep_interval must be positive".into());
        }
        if self.event_buffer == 0 || self.event_buffer > 1 << 24 {
            return bad(format!("event_buffer {} is not in 1..=16777216", self.event_buffer));
        }
        if self.publish_max_ttl.is_zero() {
            return bad("publish_max_ttl must be positive".into());
        }
        if !(self.hot_read_threshold >= 0.0 && self.hot_read_threshold.is_finite()) {
            return bad(format!("hot_read_threshold {} is not a rate >= 0", self.hot_read_threshold));
        }
        if self.hot_window.is_zero() {
            return bad("hot_window must be positive".into());
        }
        if !(1..=super::core::limits::MAX_REPLICAS).contains(&self.hot_max_replicas) {
            return bad(format!(
                "hot_max_replicas {} is not in 1..={}",
                self.hot_max_replicas,
                super::core::limits::MAX_REPLICAS
            ));
        }
        if !(1..=256).contains(&self.rpc_threads) {
            return bad(format!("rpc_threads {} is not in 1..=256", self.rpc_threads));
        }
        if self.cluster_id.is_empty()
            || self.cluster_id.len() > 128
            || !self.cluster_id.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        {
            return bad(format!("cluster_id {:?}: use 1 to 128 of A-Z a-z 0-9 - _ .", self.cluster_id));
        }
        self.ha.validate()
    }
}

impl HaConfig {
    /// Checks the settings as upstream does; of the backends, only etcd runs.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(StoreError::Config(m));
        if !HA_BACKENDS.contains(&self.backend_type.as_str()) {
            return bad(format!("ha_backend_type {:?} is not one of {}", self.backend_type, HA_BACKENDS.join(", ")));
        }
        if !self.enabled {
            return Ok(());
        }
        if self.connstring.trim().is_empty() {
            return bad(format!(
                "enable_ha needs the HA backend's endpoints (ha_backend_connstring, or etcd_endpoints for \
                 ha_backend_type=etcd); backend {} has none",
                self.backend_type
            ));
        }
        if self.backend_type != "etcd" {
            return bad(format!(
                "enable_ha: the {} backend is not supported by Crescent (use ha_backend_type=etcd)",
                self.backend_type
            ));
        }
        crate::leader::endpoints(&self.connstring)?;
        if self.lease_ttl < Duration::from_secs(1) || self.lease_ttl.subsec_nanos() != 0 {
            return bad(format!("the HA lease_ttl {:?} is not a whole number of seconds >= 1", self.lease_ttl));
        }
        Ok(())
    }
}

mod millis {
    use serde::{Deserialize, Deserializer};
    use std::time::Duration;

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_millis(u64::deserialize(d)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::ValueEnum;

    /// With no thread flag the master serves gRPC on as many threads as upstream's does: one
    /// per CPU, at most 4.
    #[test]
    fn grpc_threads_default_to_the_cpus_at_most_four() {
        assert_eq!([1, 2, 3, 4, 8, 96].map(rpc_threads_for), [1, 2, 3, 4, 4, 4]);
        let cpus = std::thread::available_parallelism().map_or(1, |p| p.get());
        assert_eq!(MasterConfig::default().rpc_threads, cpus.min(4));
    }

    #[test]
    fn strategies_are_named_as_flags_and_as_in_json() {
        for (name, want) in [
            ("random", AllocationStrategy::Random),
            ("local-first", AllocationStrategy::LocalFirst),
            ("local_first", AllocationStrategy::LocalFirst),
            ("free-ratio-first", AllocationStrategy::FreeRatioFirst),
            ("free_ratio_first", AllocationStrategy::FreeRatioFirst),
        ] {
            assert_eq!(AllocationStrategy::from_str(name, false), Ok(want), "flag {name}");
        }
        let c: MasterConfig = serde_json::from_str(r#"{"allocation_strategy":"free_ratio_first"}"#).unwrap();
        assert_eq!(c.allocation_strategy, AllocationStrategy::FreeRatioFirst);
        assert!(AllocationStrategy::from_str("fastest", false).is_err());
    }

    #[test]
    fn durations_in_json_take_the_flags_names_too() {
        let c: MasterConfig =
            serde_json::from_str(r#"{"lease_ttl_ms":2500,"client_ttl":4000,"default_soft_pin_ttl_ms":60000}"#).unwrap();
        assert_eq!(c.lease_ttl, Duration::from_millis(2500));
        assert_eq!(c.client_ttl, Duration::from_millis(4000));
        assert_eq!(c.default_soft_pin_ttl, Duration::from_secs(60));
        assert!(serde_json::from_str::<MasterConfig>(r#"{"lease_tll_ms":1}"#).is_err(), "a misspelt name is refused");
    }
}
