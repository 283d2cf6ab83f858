//! What the master answers about its state: a get's replica list, a ping's outcome, the
//! totals and segment list of the metrics and the admin page. Plain data, built by the core
//! ([`super::state::CoreState`]) and the driver from what they hold.

use std::time::Duration;

use crate::proto::ReplicaDescriptor;

/// A get's answer: the replicas to read from, under a lease.
#[derive(Debug, Clone)]
pub struct ReplicaList {
    /// Where the bytes are: memory replicas first, then disk copies (read through their owners).
    pub replicas: Vec<ReplicaDescriptor>,
    /// The object's size, in bytes.
    pub size: u64,
    /// The object's version (what the replicas hold).
    pub version: u64,
    /// How long the read lease lasts from now: read within it, or the bytes may be replaced.
    pub lease_ttl: Duration,
    /// The CRC-32 its writer took of the value (none: not taken).
    pub checksum: Option<u32>,
}

/// Totals for metrics and the admin page.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize)]
pub struct Totals {
    /// Bytes contributed by mounted memory segments.
    pub capacity: u64,
    /// Bytes allocated to objects in them.
    pub used: u64,
    /// Objects, committed or being written.
    pub keys: u64,
    /// Mounted segments.
    pub segments: u64,
    /// Live clients.
    pub clients: u64,
}

/// The disk tier as the master sees it (metrics and admin page).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct DiskTotals {
    /// Mounted disk segments, and the bytes they may use.
    pub segments: u64,
    /// Bytes those disk segments may use.
    pub capacity: u64,
    /// Bytes of the values with a copy on a disk (per copy).
    pub used: u64,
    /// Disk copies (one per object and disk).
    pub replicas: u64,
    /// Objects whose only copies are on disks.
    pub disk_only_keys: u64,
    /// Removals waiting for a disk to acknowledge them.
    pub removals_pending: u64,
}

/// One mounted segment, as the admin port lists it (and the `crescent` command reads it).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct SegmentView {
    /// The segment's id at this master.
    pub id: u64,
    /// Its name (the engine segment of its client, or `ssd:<disk id>`).
    pub name: String,
    /// The client that mounted it.
    pub client_id: String,
    /// That client's host, as it reported it.
    pub host: String,
    /// Its tier's name (`DRAM`, `VRAM`, `SSD`).
    pub tier: String,
    /// Bytes it contributes.
    pub capacity: u64,
    /// Bytes allocated in it.
    pub used: u64,
}

/// What a ping learns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PingOutcome {
    /// The client is known; its heartbeat is noted.
    Ok,
    /// The master does not know the client (dropped for silence, restarted, or its owner link was
    /// lost): it must mount again.
    NeedRemount,
    /// A standby or a deposed leader: the reason, naming the leader when known.
    NotLeader(String),
}
