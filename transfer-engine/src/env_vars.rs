//! Mooncake's environment variables: every `MC_*` / `MOONCAKE_*` name upstream's code reads
//! (kvcache-ai/Mooncake at 3b5a5941), and Crescent's own, each with what Crescent does with it.
//!
//! [`TABLE`] is the one list; the configuration reference's table is checked against it. At
//! the first engine or store client start, [`check_environment`] names every such variable
//! set in the process's environment that Crescent does not honour — ignored, or unknown to
//! both Mooncake and Crescent (likely a typo) — in one warning each ([`report`] is the pure
//! form). Nothing set is dropped silently.

use std::sync::Once;

/// What Crescent does with a variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Read: what it sets here.
    Read(&'static str),
    /// Accepted: Crescent always behaves as the variable's "on" value asks (what it does is
    /// given); a value asking for the other behaviour is reported as ignored.
    Accepted(&'static str),
    /// Not read: why.
    Ignored(&'static str),
}

/// Where a name comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Upstream Mooncake's code reads it.
    Mooncake,
    /// Crescent's own name (upstream has none for this setting).
    Crescent,
}

/// One group of variables sharing a status.
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    /// The variables' names.
    pub names: &'static [&'static str],
    /// Upstream's names, or Crescent's own.
    pub origin: Origin,
    /// What Crescent does with them.
    pub status: Status,
}

use Origin::{Crescent, Mooncake};
use Status::{Accepted, Ignored, Read};

const fn up(names: &'static [&'static str], status: Status) -> Entry {
    Entry { names, origin: Mooncake, status }
}

const fn own(names: &'static [&'static str], status: Status) -> Entry {
    Entry { names, origin: Crescent, status }
}

const GPU: &str = "GPU and accelerator transports are not in Crescent (host memory only)";
const NOF: &str = "the NVMe-oF transport is not in Crescent";
const TEST: &str = "upstream's own tests and benchmarks";

/// Every variable, grouped by what Crescent does with it.
pub const TABLE: &[Entry] = &[
    // ---- read: the transfer engine ----
    up(&["MC_FORCE_TCP"], Read("use tcp even where a faster transport exists")),
    up(&["MC_TRANSFER_TIMEOUT"], Read("seconds before a submission's unfinished requests end TimedOut")),
    up(&["MC_TCP_SLICE_SIZE"], Read("largest tcp frame payload")),
    up(&["MC_TCP_LANES_PER_PEER"], Read("tcp connections per peer (1-64), as MC_TCP_LANES, which wins")),
    up(&["MC_TCP_BIND_ADDRESS"], Read("the IP address the tcp transport listens on, and the engine's address when no local_hostname is given")),
    up(&["MC_HANDSHAKE_CONNECT_TIMEOUT"], Read("seconds (1-3599) a handshake with a peer (descriptor, notification) may take")),
    up(&["MC_HANDSHAKE_PORT"], Read("the handshake port with MC_LEGACY_RPC_PORT_BINDING and a metadata service, when local_hostname names none (default 12001)")),
    up(&["MC_LEGACY_RPC_PORT_BINDING"], Read("with a metadata service, listen for handshakes on local_hostname's port, else MC_HANDSHAKE_PORT, instead of a free one")),
    up(&["MC_METADATA_CLUSTER_ID"], Read("cluster id in metadata keys and the disk tier's directory")),
    up(&["MC_REDIS_USERNAME", "MC_REDIS_PASSWORD"], Read("credentials of a redis:// metadata service whose URL carries none")),
    up(&["MC_REDIS_DB_INDEX"], Read("database (0-255) of a redis:// metadata service whose URL names none")),
    up(&["MC_LOG_LEVEL"], Read("log level when RUST_LOG is unset: TRACE, INFO, WARNING or ERROR")),
    up(&["MC_TE_FILTERS"], Read("RDMA devices to use, comma-separated, when MC_DEVICE is unset")),
    // ---- read: the rdma transport ----
    up(&["MC_GID_INDEX"], Read("GID index of the RDMA port")),
    up(&["MC_MTU"], Read("RDMA path MTU in bytes")),
    up(&["MC_SLICE_SIZE"], Read("largest RDMA slice")),
    up(&["MC_NUM_QP_PER_EP"], Read("RDMA queue pairs per peer and local device")),
    up(&["MC_IB_PORT"], Read("the RDMA port number (1-255) of each device, which must be active")),
    up(&["MC_IB_SL"], Read("service level (0-15) of the queue pairs")),
    up(&["MC_IB_TC"], Read("traffic class (0-255) of the queue pairs' GRH")),
    up(&["MC_MAX_WR"], Read("work requests outstanding per queue pair (1-65535, capped by the device)")),
    up(&["MC_RETRY_CNT"], Read("attempts per RDMA slice (1-127) before it fails")),
    // ---- read: the store client ----
    up(&["MC_RPC_TIMEOUT_MS"], Read("milliseconds a call to the master may take (positive; Crescent keeps a deadline on every call)")),
    up(&["MC_RPC_CONNECT_TIMEOUT_MS"], Read("milliseconds connecting to the master may take (positive)")),
    up(&["MC_STORE_CLIENT_MIN_PORT", "MC_STORE_CLIENT_MAX_PORT"], Read("ports setup() picks from when local_hostname names none")),
    up(&["MC_STORE_LOCAL_HOT_CACHE_SIZE", "MC_STORE_LOCAL_HOT_BLOCK_SIZE"], Read("the local hot cache's sizes")),
    up(&["MOONCAKE_CONFIG_PATH"], Read("the client's JSON configuration file")),
    up(&["MOONCAKE_MASTER"], Read("master_server_address")),
    up(&["MOONCAKE_TE_META_DATA_SERVER"], Read("metadata_server")),
    up(&["MOONCAKE_LOCAL_HOSTNAME"], Read("local_hostname")),
    up(&["MOONCAKE_PROTOCOL"], Read("protocol")),
    up(&["MOONCAKE_DEVICE"], Read("device_name")),
    up(&["MOONCAKE_GLOBAL_SEGMENT_SIZE", "MOONCAKE_LOCAL_BUFFER_SIZE"], Read("the segment and buffer sizes")),
    up(&["MOONCAKE_OFFLOAD_ENABLED", "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH"], Read("the disk tier and its root")),
    up(&["MOONCAKE_ENABLE_CLIENT_HTTP_SERVER", "MOONCAKE_CLIENT_HTTP_PORT"], Read("the client's /metrics address")),
    up(&["MOONCAKE_TENANT_ID"], Read("the client's tenant")),
    // ---- accepted: Crescent always does what the "on" value asks ----
    up(&["MC_TCP_ENABLE_CONNECTION_POOL"], Accepted("Crescent always keeps a pool of tcp lanes per peer (MC_TCP_LANES)")),
    up(&["MC_STORE_MEMCPY"], Accepted("Crescent always copies a replica in the client's own memory with memcpy")),
    // ---- Crescent's own ----
    own(&["MC_DEVICE"], Read("RDMA devices to use, comma-separated")),
    own(&["MC_TCP_LANES"], Read("tcp connections per peer (1-64)")),
    own(&["MC_SHM_THREADS"], Read("shm copy threads (1-64)")),
    own(&["MC_IB_TIMEOUT", "MC_IB_RETRY_CNT"], Read("queue pairs' ACK timeout exponent and retransmissions")),
    own(&["MC_IBVERBS_LIBRARY"], Read("the verbs library to load")),
    own(&["MC_METADATA_TTL"], Read("seconds a published descriptor outlives its owner's last renewal")),
    own(&["MC_STORE_LOCAL_HOT_CACHE_FILL"], Read("how a miss fills the local hot cache")),
    own(&["MOONCAKE_STORAGE_ROOT_DIR"], Read("the disk tier's root")),
    // ---- ignored: the engine ----
    up(&["MC_TE_METRIC", "MC_TE_METRIC_INTERVAL_SECONDS"], Ignored("the engine has no periodic throughput log; the store client's Prometheus metrics (client_metrics_address) count its bytes")),
    up(&["MC_LOG_DIR"], Ignored("Crescent logs to stderr (RUST_LOG, MC_LOG_LEVEL)")),
    up(&["MC_YLT_LOG_LEVEL"], Ignored("no yalantinglibs RPC in Crescent (its RPC is gRPC, logged through RUST_LOG)")),
    up(&["MC_LOG_RDMA_SLICE_AFFINITY", "MC_TRACK_RDMA_POSTED_SLICES"], Ignored("upstream's rdma debugging aids; RUST_LOG=crescent_transports=trace logs the rdma transport")),
    up(&["MC_HANDSHAKE_LISTEN_BACKLOG"], Ignored("the handshake listener's backlog is the system's")),
    up(&["MC_HANDSHAKE_MAX_LENGTH"], Ignored("the handshake's lengths are fixed (4 KiB requests, 16 MiB descriptors)")),
    up(&["MC_MIN_RPC_PORT", "MC_MAX_RPC_PORT", "MC_MIN_PRC_PORT", "MC_MAX_PRC_PORT"], Ignored("the handshake port is local_hostname's, else one the system picks")),
    up(&["MC_USE_IPV6"], Ignored("Crescent picks an IPv4 address unless local_hostname names another")),
    up(&["MC_DISABLE_METACACHE", "MC_TE_METADATA_REFRESH_INTERVAL_SECONDS"], Ignored("Crescent caches a peer's descriptor and fetches it again when a transfer finds it stale")),
    up(&["MC_CONN_PAUSE_TTL_MS", "MC_RDMA_RAIL_PAUSE_SECONDS"], Ignored("Crescent retries a failed slice on other queue pairs and reconnects on demand; it pauses no peer or rail")),
    up(&["MC_SLICE_TIMEOUT"], Ignored("requests have one deadline, MC_TRANSFER_TIMEOUT")),
    up(&["MC_USE_TENT", "MC_USE_TEV1", "MC_TENT_CONF", "MC_TENT_RPC_THREADS"], Ignored("Crescent has one transfer engine; upstream's TENT engine and its configuration file do not apply")),
    up(&["MC_CUSTOM_TOPO_JSON", "MC_PATH_ROUNDROBIN", "MC_TE_FILTERS_EXCLUDE"], Ignored("Crescent has no NUMA/PCIe topology matrix; MC_DEVICE or MC_TE_FILTERS choose the devices")),
    up(&["MC_ENABLE_DEST_DEVICE_AFFINITY", "MC_ENABLE_HCA_PEER_AFFINITY", "MC_NIC_PEER_AFFINITY", "MC_FORCE_HCA"], Ignored("Crescent spreads a peer's slices over all its queue pairs; no NIC affinity rules")),
    up(&["MC_ENDPOINT_STORE_TYPE", "MC_MAX_EP_PER_CTX"], Ignored("Crescent keeps one endpoint per peer and device, without an eviction policy")),
    up(&["MC_METADATA_SERVER", "MC_LOCAL_SERVER_NAME"], Ignored("upstream tests' settings; Crescent's are metadata_server / local_hostname (MOONCAKE_TE_META_DATA_SERVER, MOONCAKE_LOCAL_HOSTNAME)")),
    up(&["MC_RPC_CLIENT_IO_THREADS", "MC_STORE_RPC_CLIENT_IO_THREADS", "MC_TE_RPC_CLIENT_IO_THREADS"], Ignored("Crescent's RPC runtimes size themselves")),
    up(&["MC_RPC_PROTOCOL"], Ignored("the master's RPC is gRPC over tcp and mooncake.engine.RpcInterface runs over tcp (rdma is logged at initialize); no RDMA RPC")),
    // ---- ignored: the rdma transport ----
    up(&["MC_MAX_SGE"], Ignored("Crescent posts one scatter/gather entry per work request")),
    up(&["MC_MAX_INLINE"], Ignored("Crescent sends no inline data")),
    up(&["MC_MAX_CQE_PER_CTX", "MC_NUM_CQ_PER_CTX", "MC_NUM_COMP_CHANNELS_PER_CTX", "MC_WORKERS_PER_CTX"], Ignored("Crescent has one completion queue, channel and poller per device, sized by the device")),
    up(&["MC_PKEY_INDEX"], Ignored("queue pairs use P_Key index 0")),
    up(&["MC_AUTO_GID_MAX_RETRIES"], Ignored("Crescent's GID choice is made once at start (MC_GID_INDEX fixes it)")),
    up(&["MC_IB_PCI_RELAXED_ORDERING", "MC_ENABLE_PARALLEL_REG_MR", "MC_MAX_CONCURRENT_REG_MR", "MC_MAX_MR_SIZE", "MC_MIN_REG_SIZE"], Ignored("Crescent registers each buffer once, whole, with default access flags")),
    up(&["MC_FRAGMENT_RATIO"], Ignored("Crescent cuts requests into MC_SLICE_SIZE slices only")),
    up(&["MC_MLX5_QP_UDP_SPORTS", "MC_MLX5_QP_LAG_PORT_BALANCE"], Ignored("mlx5-specific queue-pair settings are not in Crescent")),
    up(&["MC_RDMA_BIND_ADDRESS"], Ignored("the rdma queue-pair exchange is published at local_hostname")),
    up(&["MC_EFA_CQ_THREADS", "MC_EFA_NIC_SELECTION"], Ignored("the EFA transport is not in Crescent")),
    // ---- ignored: the tcp transport ----
    up(&["MC_TCP_MAX_CONNECTIONS_PER_PEER"], Ignored("deprecated upstream for MC_TCP_LANES_PER_PEER; Crescent reads MC_TCP_LANES or MC_TCP_LANES_PER_PEER")),
    up(&["MC_TCP_ADMISSION_TIMEOUT_MS", "MC_TCP_MAX_PENDING_ADMISSIONS_PER_PEER", "MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER"], Ignored("Crescent's tcp lanes queue requests without admission control; the request deadline bounds them")),
    up(&["MC_TCP_PROTO", "MC_TCP_STATUS_TIMEOUT_SEC"], Ignored("Crescent's tcp frames are its own, with fixed timeouts (30 s a frame)")),
    // ---- ignored: devices Crescent does not drive ----
    up(&["MC_DISABLE_GPU_DIRECT_RDMA", "MC_ENABLE_MNNVL", "MC_FORCE_MNNVL", "MC_INTRANODE_NVLINK", "MC_INTRA_NVLINK", "MC_USE_NVLINK_IPC"], Ignored(GPU)),
    up(&["MC_DISABLE_HIP", "MC_HIP_NUM_EVENTS", "MC_HIP_NUM_STREAMS", "MC_USE_HIP_IPC", "MOONCAKE_DISABLE_HIP_DMABUF"], Ignored(GPU)),
    up(&["MC_DISABLE_MACA", "MC_MACA_BATCHFLAG_MIN_BYTES", "MC_MACA_CALLER_SYNC", "MC_MACA_COPY_API", "MC_MACA_HOST_TRANSPORT"], Ignored(GPU)),
    up(&["MC_DISABLE_MUSA", "MC_FORCE_MUSA", "MC_MUSA_COPY_API", "MC_MUSA_IPC_OPEN_DEVICE", "MC_MUSA_TRANSFER_BATCH_MIN_BYTES"], Ignored(GPU)),
    up(&["MC_TANGRT_LIB_ARCH", "MC_TANGRT_LIB_DIR", "MC_TANGRT_ROOT", "MC_TPU_PJRT_LIB"], Ignored(GPU)),
    up(&["MC_UBSHMEM_GET_STREAM_TIMEOUT", "MC_UBSHMEM_MAX_STREAMS", "MC_UBSHMEM_STREAMS_PER_TRANSFER", "MC_UBSHMEM_THREAD_POOL_SIZE", "MC_USE_UBSHMEM_IPC"], Ignored("Ascend transports are not in Crescent")),
    up(&["MOONCAKE_EP_ACTIVE_QPS_PER_RANK", "MOONCAKE_EP_DEVICE_FILTER", "MOONCAKE_EP_MACA_ALLOC", "MOONCAKE_EP_MACA_ALLOW_NODE_P2P", "MOONCAKE_EP_MACA_DISABLE_IPC", "MOONCAKE_EP_MACA_IPC", "MOONCAKE_EP_MACA_P2P_PAIRS", "MOONCAKE_EP_NUM_LOCAL_RANKS", "MOONCAKE_EP_USE_MACA", "MOONCAKE_EP_USE_MUSA"], Ignored("Mooncake EP (expert parallelism) is not in Crescent")),
    up(&["MOONCAKE_P2P_CHUNK_SIZE", "MOONCAKE_P2P_POOL_SIZE", "MOONCAKE_PG_AUTO_DEACTIVATE_ON_FAILURE", "MOONCAKE_PG_AUTO_SYNC_ON_FAILURE", "MOONCAKE_PG_CORE_SO_PATH"], Ignored("Mooncake's torch process group is not in Crescent")),
    up(&["MC_CXL_DEV_PATH", "MC_CXL_DEV_SIZE"], Ignored("the CXL transport is not in Crescent")),
    up(&["MC_NOF_DEBUG", "MC_NOF_DEBUG_INTERVAL_MS", "MC_NOF_INFLIGHT_BYTES_LIMIT", "MC_NOF_SUBMIT_CHUNK_BYTES", "MC_NOF_TRTYPE", "MC_NOF_WORKERS"], Ignored(NOF)),
    up(&["MC_NVME_ADMIN_QUEUE_SIZE", "MC_NVME_DATA_DIGEST", "MC_NVME_FABRICS_CONNECT_TIMEOUT_US", "MC_NVME_HEADER_DIGEST", "MC_NVME_IO_QUEUE_REQUESTS", "MC_NVME_IO_QUEUE_SIZE", "MC_NVME_NUM_IO_QUEUES", "MC_NVME_TRANSPORT_ACK_TIMEOUT"], Ignored(NOF)),
    up(&["MOONCAKE_NVME_KV_BATCH_SUBMIT_CONCURRENCY", "MOONCAKE_NVME_KV_DEVICE_PATH", "MOONCAKE_NVME_KV_DRIVER", "MOONCAKE_NVME_KV_IO_CONCURRENCY", "MOONCAKE_NVME_KV_MAX_IO_CONCURRENCY", "MOONCAKE_NVME_KV_NSID", "MOONCAKE_NVME_KV_PREPARE_CONCURRENCY", "MOONCAKE_NVME_KV_PROTOCOL_MAX_VALUE_SIZE", "MOONCAKE_NVME_KV_QUEUE_DEPTH", "MOONCAKE_NVME_KV_READ_PLAN_BATCH_SIZE", "MOONCAKE_NVME_KV_ROOT_SUBMIT_CONCURRENCY", "MOONCAKE_NVME_KV_RUNTIME_TRANSFER_LIMIT", "MOONCAKE_NVME_KV_TRANSFER_ALIGNMENT_BYTES", "MOONCAKE_NVME_KV_TRANSPORT", "MOONCAKE_NVME_KV_VALUE_BLOCK_UNIT_BYTES"], Ignored("the NVMe KV backend is not in Crescent (its disk tier is files)")),
    // ---- ignored: the store client ----
    up(&["MC_STORE_CLIENT_METRIC", "MC_STORE_CLIENT_METRIC_BANDWIDTH", "MC_STORE_CLIENT_METRIC_INTERVAL"], Ignored("the client's metrics are always counted and served at client_metrics_address (MOONCAKE_ENABLE_CLIENT_HTTP_SERVER); no periodic log")),
    up(&["MC_STORE_CLUSTER_ID"], Ignored("the cluster id is MC_METADATA_CLUSTER_ID or cluster_id")),
    up(&["MC_STORE_CLIENT_SETUP_RETRIES"], Ignored("setup() picks a free port once (MC_STORE_CLIENT_MIN_PORT-MAX_PORT)")),
    up(&["MC_STORE_LOCAL_HOT_ADMISSION_THRESHOLD"], Ignored("the local hot cache's admission is LOCAL_HOT_CACHE_ADMISSION (always or second_access)")),
    up(&["MC_STORE_LOCAL_HOT_CACHE_USE_SHM"], Ignored("the local hot cache is private to its client")),
    up(&["MC_STORE_USE_HUGEPAGE", "MC_STORE_HUGEPAGE_SIZE", "MC_DISABLE_MMAP_ARENA", "MC_MMAP_ARENA_POOL_SIZE", "MC_STORE_PIN_MEMORY_MAX_BYTES", "MC_STORE_PINNED_RESTORE_ARENA_SIZE_BYTES"], Ignored("Crescent maps its segments and buffers with mmap, without huge pages or arenas")),
    up(&["MC_STORE_NUMA_SOCKET_ID"], Ignored("Crescent does not bind segments to a NUMA node")),
    up(&["MC_STORE_REPLICA_SCORING"], Ignored("the client reads the replica the master's plan names first")),
    up(&["MC_MS_AUTO_DISC", "MC_MS_FILTERS"], Ignored("the store's devices are the engine's (MC_DEVICE, device_name)")),
    up(&["MC_FILEREAD_WORKERS"], Ignored("the disk tier's threads are disk_writer_threads")),
    up(&["MOONCAKE_STORE_CHECKSUM"], Read("end-to-end checksums: a CRC-32 of each value taken at put, checked at get (as CRESCENT_VERIFY_CHECKSUMS)")),
    // ---- ignored: the disk tier and other offload backends ----
    up(&["MOONCAKE_OFFLOAD_BUCKET_DISK_SCAN_CACHE_MS", "MOONCAKE_OFFLOAD_BUCKET_EVICTION_POLICY", "MOONCAKE_OFFLOAD_BUCKET_KEYS_LIMIT", "MOONCAKE_OFFLOAD_BUCKET_MAX_PHYSICAL_BYTES", "MOONCAKE_OFFLOAD_BUCKET_MAX_TOTAL_SIZE", "MOONCAKE_OFFLOAD_BUCKET_SIZE_LIMIT_BYTES", "MOONCAKE_BUCKET_EVICTION_POLICY", "MOONCAKE_BUCKET_MAX_TOTAL_SIZE"], Ignored("Crescent's disk tier keeps one file per object, not buckets")),
    up(&["MOONCAKE_OFFSET_EVICTION_POLICY", "MOONCAKE_OFFSET_HIGH_RATIO", "MOONCAKE_OFFSET_LOW_RATIO", "MOONCAKE_OFFSET_MAX_CAPACITY_NODES", "MOONCAKE_OFFSET_MAX_EVICT_PER_OFFLOAD", "MOONCAKE_OFFSET_PERSIST_INTERVAL_SECONDS", "MOONCAKE_OFFSET_PERSIST_MODE", "MOONCAKE_OFFSET_RECORD_CRC"], Ignored("upstream's offset storage backend is not in Crescent")),
    up(&["MOONCAKE_OFFLOAD_CLIENT_BUFFER_GC_INTERVAL_SECONDS", "MOONCAKE_OFFLOAD_CLIENT_BUFFER_GC_TTL_MS", "MOONCAKE_OFFLOAD_HEARTBEAT_INTERVAL_SECONDS", "MOONCAKE_OFFLOAD_LOCAL_BUFFER_SIZE_BYTES", "MOONCAKE_OFFLOAD_STORAGE_BACKEND_DESCRIPTOR", "MOONCAKE_OFFLOAD_FSDIR"], Ignored("the disk tier is configured by storage_root_dir and the disk_* keys")),
    up(&["MOONCAKE_OFFLOAD_TOTAL_KEYS_LIMIT", "MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES", "MOONCAKE_OFFLOAD_ENABLE_EVICTION", "MOONCAKE_OFFLOAD_ENABLE_DISK_WATERMARK_EVICTION", "MOONCAKE_OFFLOAD_DISK_EVICTION_HIGH_WATERMARK_RATIO", "MOONCAKE_OFFLOAD_DISK_EVICTION_LOW_WATERMARK_RATIO", "MOONCAKE_DISK_EVICTION_HIGH_WATERMARK_RATIO", "MOONCAKE_DISK_EVICTION_LOW_WATERMARK_RATIO"], Ignored("the disk tier's bound is storage_capacity")),
    up(&["MOONCAKE_OFFLOAD_SCANMETA_ITERATOR_KEYS_LIMIT", "MOONCAKE_SCANMETA_ITERATOR_KEYS_LIMIT"], Ignored("the disk tier lists its files at start in one pass")),
    up(&["MOONCAKE_OFFLOAD_USE_URING", "MOONCAKE_USE_URING"], Ignored("the disk tier's io_uring is disk_io_uring (on by default)")),
    up(&["MOONCAKE_DFS_ALIGNMENT", "MOONCAKE_DFS_DEFERRED_FREE_SECONDS", "MOONCAKE_DFS_ENABLED", "MOONCAKE_DFS_EVICTION_CHECK_INTERVAL", "MOONCAKE_DFS_EVICTION_ENABLED", "MOONCAKE_DFS_EVICTION_HIGH_WATERMARK", "MOONCAKE_DFS_EVICTION_LOW_WATERMARK", "MOONCAKE_DFS_FS_ADAPTER", "MOONCAKE_DFS_ROOT_DIR", "MOONCAKE_DFS_SHARD_CAPACITY", "MOONCAKE_DFS_SHARD_COUNT", "MOONCAKE_DFS_SINGLE_TENANT", "MOONCAKE_ENABLE_DFS", "MOONCAKE_DISTRIBUTED_FS_TYPE", "MOONCAKE_DISTRIBUTED_HEALTH_CHECK", "MOONCAKE_DISTRIBUTED_ROOT_DIR"], Ignored("the distributed file system backend is not in Crescent")),
    up(&["MOONCAKE_AWS_ACCESS_KEY_ID", "MOONCAKE_AWS_BUCKET_NAME", "MOONCAKE_AWS_CONNECT_TIMEOUT_MS", "MOONCAKE_AWS_REGION", "MOONCAKE_AWS_REQUEST_CHECKSUM_CALCULATION", "MOONCAKE_AWS_REQUEST_TIMEOUT_MS", "MOONCAKE_AWS_RESPONSE_CHECKSUM_VALIDATION", "MOONCAKE_AWS_S3_ENDPOINT", "MOONCAKE_AWS_SECRET_ACCESS_KEY", "MOONCAKE_AWS_USE_HTTPS", "MOONCAKE_AWS_USE_VIRTUAL_ADDRESSING"], Ignored("the S3 backend is not in Crescent")),
    // ---- ignored: the master (its settings are flags) ----
    up(&["MOONCAKE_SNAPSHOT_LOCAL_PATH", "MOONCAKE_TENANT_QUOTA_ETCD_ENDPOINTS"], Ignored("master snapshots and tenant quotas are not in Crescent")),
    // ---- ignored: upstream's tests, benchmarks and build scripts ----
    up(&["MC_TEST_BOOL", "MC_TEST_DEVICE_NAME", "MC_TEST_DOUBLE", "MC_TEST_INT", "MC_TEST_INT64", "MC_TEST_LOCAL_IP", "MC_TEST_SIZET", "MC_TEST_STRING", "MC_TEST_UINT32", "MC_TEST_UINT64"], Ignored(TEST)),
    up(&["MC_INITIATOR_DEVICE_NAME", "MC_INITIATOR_SERVER_NAME", "MC_TARGET_DEVICE_NAME", "MC_TARGET_SERVER_NAME", "MC_BENCH_PROMOTION_LATENCY"], Ignored(TEST)),
    up(&["MOONCAKE_EVICT_BENCH_LARGE", "MOONCAKE_EVICT_BENCH_LOCK_DELAY_US", "MOONCAKE_EVICT_BENCH_LOCK_OBJECTS", "MOONCAKE_EVICT_BENCH_LOCK_PROBE", "MOONCAKE_EVICT_BENCH_LOCK_TRIALS"], Ignored(TEST)),
    up(&["MOONCAKE_PGTEST_DEVICE_FILTERS", "MOONCAKE_PGTEST_MASTER_ADDR", "MOONCAKE_PGTEST_MASTER_PORT", "MOONCAKE_ELASTIC_PERF_OK", "MOONCAKE_ELASTIC_TEST_OK"], Ignored(TEST)),
    up(&["MOONCAKE_TEST_FAILPOINT_DIR", "MOONCAKE_TEST_FAILPOINT_TIMEOUT_SEC", "MOONCAKE_TEST_WHEEL", "MOONCAKE_MASTER_SERVICE_SNAPSHOT_TEST_SKIP_CLEANUP", "MOONCAKE_MASTER_CONTROL_BASE"], Ignored(TEST)),
    up(&["MOONCAKE_BUILD_DIR", "MOONCAKE_STORE_MODULE"], Ignored(TEST)),
];

/// The entry naming `name`, if any.
pub fn lookup(name: &str) -> Option<&'static Entry> {
    TABLE.iter().find(|e| e.names.contains(&name))
}

/// Every name in [`TABLE`].
pub fn names() -> impl Iterator<Item = &'static str> {
    TABLE.iter().flat_map(|e| e.names.iter().copied())
}

/// Whether `name` is one this module accounts for (`MC_*` or `MOONCAKE_*`).
fn in_scope(name: &str) -> bool {
    name.starts_with("MC_") || name.starts_with("MOONCAKE_")
}

/// Why a set variable has no effect here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    /// The variable.
    pub name: String,
    /// One line naming it and saying why.
    pub message: String,
}

/// The warnings for `vars` (an environment's name/value pairs): one per `MC_*` or `MOONCAKE_*`
/// variable that Crescent ignores, accepts with a value asking otherwise, or does not know.
pub fn report<I, K, V>(vars: I) -> Vec<Warning>
where
    I: IntoIterator<Item = (K, V)>,
    K: AsRef<str>,
    V: AsRef<str>,
{
    let mut out: Vec<Warning> = Vec::new();
    for (name, value) in vars {
        let (name, value) = (name.as_ref(), value.as_ref());
        if !in_scope(name) || out.iter().any(|w| w.name == name) {
            continue;
        }
        let message = match lookup(name).map(|e| e.status) {
            Some(Read(_)) => continue,
            Some(Accepted(what)) => {
                if matches!(value.trim().to_ascii_lowercase().as_str(), "" | "1" | "true" | "yes" | "on") {
                    continue;
                }
                format!("{name}={value:?} is ignored: {what}")
            }
            Some(Ignored(why)) => format!("{name} is set but Crescent ignores it: {why}"),
            None => match closest(name) {
                Some(near) => {
                    format!("{name} is set but neither Mooncake nor Crescent reads it (did you mean {near}?)")
                }
                None => format!("{name} is set but neither Mooncake nor Crescent reads it (a typo?)"),
            },
        };
        out.push(Warning { name: name.to_string(), message });
    }
    out
}

/// The known name nearest to `name`, if one is within a couple of edits.
fn closest(name: &str) -> Option<&'static str> {
    names().map(|n| (edit_distance(name, n), n)).filter(|(d, _)| *d <= 2).min_by_key(|(d, _)| *d).map(|(_, n)| n)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (row[j + 1] + 1).min(row[j] + 1).min(diag + usize::from(ca != cb));
            diag = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

/// Logs [`report`] of the process's environment, once per process: called at the first
/// engine or store client start.
pub fn check_environment() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let vars =
            std::env::vars_os().filter_map(|(k, v)| Some((k.into_string().ok()?, v.to_string_lossy().into_owned())));
        for w in report(vars) {
            tracing::warn!(variable = %w.name, "{}", w.message);
        }
    });
}

/// Why a variable's value cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{name}={value:?}: {expected}")]
pub struct EnvVarError {
    /// The variable.
    pub name: &'static str,
    /// Its value.
    pub value: String,
    /// What it should be.
    pub expected: &'static str,
}

/// Upstream's log levels (`MC_LOG_LEVEL`: `TRACE`, `INFO`, `WARNING`, `ERROR`; any case, and
/// `WARN`) as a `tracing` filter; `None` when unset or blank.
pub fn log_filter(var: impl Fn(&str) -> Option<String>) -> Result<Option<&'static str>, EnvVarError> {
    let Some(v) = var("MC_LOG_LEVEL").filter(|v| !v.trim().is_empty()) else { return Ok(None) };
    let level = match v.trim().to_ascii_uppercase().as_str() {
        "TRACE" => "trace",
        "INFO" => "info",
        "WARNING" | "WARN" => "warn",
        "ERROR" => "error",
        _ => {
            return Err(EnvVarError { name: "MC_LOG_LEVEL", value: v, expected: "one of TRACE, INFO, WARNING, ERROR" })
        }
    };
    Ok(Some(level))
}

/// The log filter a process starts with: `RUST_LOG` if set, else `MC_LOG_LEVEL`, else
/// `default`; with the warning to log once logging is up when `MC_LOG_LEVEL` is unusable.
pub fn log_filter_or(default: &'static str) -> (String, Option<String>) {
    if let Ok(f) = std::env::var("RUST_LOG") {
        if !f.trim().is_empty() {
            return (f, None);
        }
    }
    match log_filter(|n| std::env::var(n).ok()) {
        Ok(level) => (level.unwrap_or(default).to_string(), None),
        Err(e) => (default.to_string(), Some(format!("{e}; logging at {default}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn every_name_is_listed_once_and_in_scope() {
        let mut seen = BTreeSet::new();
        for n in names() {
            assert!(in_scope(n), "{n}");
            assert!(seen.insert(n), "{n} is listed twice");
        }
        let upstream = TABLE.iter().filter(|e| e.origin == Mooncake).map(|e| e.names.len()).sum::<usize>();
        // kvcache-ai/Mooncake at 3b5a5941: the quoted MC_* / MOONCAKE_* names of its C++ and
        // Python sources.
        assert_eq!(upstream, 296);
    }

    #[test]
    fn an_ignored_variable_yields_exactly_one_warning_naming_it() {
        let w = report([("MC_NOF_WORKERS", "4"), ("PATH", "/bin"), ("MC_FORCE_TCP", "1")]);
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!(w[0].name, "MC_NOF_WORKERS");
        assert!(w[0].message.contains("MC_NOF_WORKERS") && w[0].message.contains("NVMe-oF"), "{w:?}");
        // The same name twice (an environment built by hand) is still one warning.
        assert_eq!(report([("MC_TE_METRIC", "1"), ("MC_TE_METRIC", "1")]).len(), 1);
    }

    #[test]
    fn an_unknown_variable_is_named_with_the_nearest_known_one() {
        let w = report([("MC_FORCE_TPC", "1"), ("MOONCAKE_WHATEVER_ELSE", "x")]);
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(w[0].message.contains("MC_FORCE_TPC") && w[0].message.contains("did you mean MC_FORCE_TCP"), "{w:?}");
        assert!(w[1].message.contains("MOONCAKE_WHATEVER_ELSE") && w[1].message.contains("typo"), "{w:?}");
    }

    #[test]
    fn read_variables_and_accepted_on_values_are_quiet() {
        assert!(report([("MC_GID_INDEX", "3"), ("MOONCAKE_MASTER", "h:1"), ("MC_TCP_ENABLE_CONNECTION_POOL", "1")])
            .is_empty());
        let w = report([("MC_TCP_ENABLE_CONNECTION_POOL", "0")]);
        assert_eq!(w.len(), 1);
        assert!(w[0].message.contains("always keeps a pool"), "{w:?}");
        let w = report([("MC_STORE_MEMCPY", "false")]);
        assert!(w[0].message.contains("MC_STORE_MEMCPY"), "{w:?}");
    }

    #[test]
    fn log_levels() {
        let from = |v: &str| {
            let v = v.to_string();
            log_filter(move |n| (n == "MC_LOG_LEVEL").then(|| v.clone()))
        };
        assert_eq!(from("TRACE"), Ok(Some("trace")));
        assert_eq!(from("INFO"), Ok(Some("info")));
        assert_eq!(from("WARNING"), Ok(Some("warn")));
        assert_eq!(from("error"), Ok(Some("error")));
        assert_eq!(from(" "), Ok(None));
        let e = from("LOUD").unwrap_err().to_string();
        assert!(e.contains("MC_LOG_LEVEL") && e.contains("LOUD"), "{e}");
    }

    /// The configuration reference's table names exactly the variables of [`TABLE`], each
    /// with the same status.
    #[test]
    fn the_docs_table_lists_the_same_variables() {
        let page = include_str!("../../docs/src/configuration.md");
        let start = page.find(DOCS_HEADING).expect("the configuration page has the variables' section");
        let section = &page[start + DOCS_HEADING.len()..];
        let section = &section[..section.find("\n## ").unwrap_or(section.len())];
        let mut documented = std::collections::BTreeMap::new();
        for line in section.lines().filter(|l| l.starts_with("| `")) {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let status = cells.get(2).copied().unwrap_or_default();
            for name in cells[1].split('`').filter(|n| in_scope(n)) {
                assert!(documented.insert(name.to_string(), status.to_string()).is_none(), "{name} twice in the docs");
            }
        }
        for e in TABLE {
            let want = match e.status {
                Read(_) => "read",
                Accepted(_) => "accepted",
                Ignored(_) => "ignored",
            };
            for n in e.names {
                let got = documented.remove(*n).unwrap_or_else(|| panic!("{n} is not in the docs' table"));
                assert_eq!(got, want, "{n}'s status in the docs");
            }
        }
        assert!(documented.is_empty(), "in the docs but not in env_vars::TABLE: {documented:?}");
    }

    const DOCS_HEADING: &str = "## Mooncake's environment variables";
}
