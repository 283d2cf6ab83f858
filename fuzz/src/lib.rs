//! Fuzz targets: every parser of Crescent that reads bytes another process wrote. Each
//! function takes the fuzzer's input, runs it through the parser the way a listener or a
//! client does, and asserts what must hold of what comes out (a bounded length, a range inside
//! the registered memory, an encoding that decodes back to the same value). A panic — from an
//! assertion, an overflow, an index or an allocation — is a crash the fuzzer reports.
//!
//! The binaries in `fuzz_targets/` are one line each; `ci/fuzz.sh` builds them with libFuzzer's
//! coverage instrumentation on the pinned stable toolchain and runs them.

use std::sync::OnceLock;
use std::time::Duration;

use crescent_engine::handshake::{self, MessageKind};
use crescent_engine::metadata::RpcMeta;
use crescent_engine::notify::{Notification, NotifyQueue};
use crescent_engine::rpc;
use crescent_engine::{EngineConfig, SegmentDescriptor};
use crescent_store::client::disk::{format, service};
use crescent_store::client::hot_cache::HotCacheSettings;
use crescent_store::master::cli::{check_config_file, ConfigFormat};
use crescent_store::ClientConfig;
use crescent_transports::rdma::wire::Message;
use crescent_transports::shm::wire as shm;
use crescent_transports::tcp::frame::{self, FrameKind, Header, HEADER_LEN};
use crescent_transports::{Region, RegionTable};

/// Generous for a slice that never blocks: a read past the input's end is a close.
const LIMIT: Duration = Duration::from_secs(1);

fn u64_from(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    let n = b.len().min(8);
    a[..n].copy_from_slice(&b[..n]);
    u64::from_le_bytes(a)
}

/// A registered region of real memory, as a tcp target serves it.
struct Served {
    table: RegionTable,
    addr: u64,
    len: u64,
}

fn served() -> &'static Served {
    static SERVED: OnceLock<Served> = OnceLock::new();
    SERVED.get_or_init(|| {
        let mem: &'static mut [u8] = Box::leak(vec![0u8; 1 << 16].into_boxed_slice());
        let (addr, len) = (mem.as_ptr() as u64, mem.len() as u64);
        let table = RegionTable::new();
        table.insert(Region::local_only(addr, len)).expect("one region");
        Served { table, addr, len }
    })
}

/// The tcp transport's target: headers (32 bytes each) as its connection reads them, and
/// every request's range checked against the registered memory before it is touched.
pub fn tcp_frame(data: &[u8]) {
    let s = served();
    let mut rest = data;
    while let Some((chunk, tail)) = rest.split_first_chunk::<HEADER_LEN>() {
        rest = tail;
        let Ok(h) = Header::decode(chunk) else { continue };
        assert!(h.len <= frame::MAX_PAYLOAD && h.payload_len() <= h.len, "{h:?}");
        assert_eq!(Header::decode(&h.encode()).ok(), Some(h), "a decoded header encodes back to itself");
        if !matches!(h.kind, FrameKind::ReadRequest | FrameKind::WriteRequest) {
            continue;
        }
        if let Some(access) = s.table.access(h.addr, h.len) {
            assert!(
                access.addr() >= s.addr && access.addr() + access.len() <= s.addr + s.len && access.len() == h.len,
                "[{:#x}, +{}) granted outside [{:#x}, +{})",
                h.addr,
                h.len,
                s.addr,
                s.len
            );
            match h.kind {
                FrameKind::WriteRequest => {
                    let n = (access.len() as usize).min(rest.len());
                    access.as_mut_slice()[..n].copy_from_slice(&rest[..n]);
                }
                _ => {
                    std::hint::black_box(access.as_slice().iter().fold(0u8, |a, b| a ^ b));
                }
            }
        }
    }
}

/// The shm control socket: 120-byte frames (and input of any other length, refused).
pub fn shm_wire(data: &[u8]) {
    let _ = shm::Frame::decode(data);
    for chunk in data.chunks(shm::FRAME_LEN) {
        let Ok(f) = shm::Frame::decode(chunk) else { continue };
        assert_eq!(shm::Frame::decode(&f.encode()).ok(), Some(f), "a decoded frame encodes back to itself");
        if matches!(f.kind, shm::Kind::Map | shm::Kind::MapReply) && f.status == shm::Status::Ok {
            assert!(f.addr != 0 && f.len != 0 && f.addr.checked_add(f.len).is_some(), "{f:?}");
            // Whatever a frame grants, `contains` never admits a range outside it.
            let (addr, len) =
                (u64_from(chunk.get(8..).unwrap_or_default()), u64_from(chunk.get(24..).unwrap_or_default()));
            if f.contains(addr, len) {
                assert!(addr >= f.addr && addr + len <= f.addr + f.len, "{f:?} contains [{addr:#x}, +{len})");
            }
        }
    }
}

/// The rdma queue-pair exchange: a stream of control messages, and one payload alone.
pub fn rdma_wire(data: &[u8]) {
    if let Some((kind, payload)) = data.split_first() {
        let _ = Message::decode(*kind, payload);
    }
    let mut r = data;
    while let Ok(m) = Message::read_within(&mut r, None, LIMIT) {
        let bytes = m.encode();
        let again = Message::read_within(&mut bytes.as_slice(), None, LIMIT).expect("an encoded message decodes");
        assert_eq!(again, m);
    }
}

fn notify_queue() -> &'static NotifyQueue {
    static QUEUE: OnceLock<NotifyQueue> = OnceLock::new();
    QUEUE.get_or_init(NotifyQueue::default)
}

/// The engine's handshake port, both ways: requests as the server reads them (descriptor
/// queries, notifications into the bounded queue) and replies as a client reads them.
pub fn handshake(data: &[u8]) {
    let (server_side, client_side) = data.split_at(data.len() / 2);
    let mut r = server_side;
    while let Ok((kind, payload)) = handshake::read_message_within(&mut r, handshake::MAX_REQUEST, LIMIT) {
        assert!(payload.len() <= handshake::MAX_REQUEST as usize);
        if kind == MessageKind::Notify {
            let q = notify_queue();
            let _ = q.receive(&payload);
            if q.len() > 1000 {
                q.take_all();
            }
        }
    }
    let mut r = client_side;
    while let Ok((kind, payload)) = handshake::read_message_within(&mut r, handshake::MAX_REPLY, LIMIT) {
        match kind {
            MessageKind::Descriptor => {
                let _ = SegmentDescriptor::from_json(&payload);
            }
            MessageKind::Notify => {
                if let Ok(n) = Notification::decode(&payload) {
                    assert!(n.check().is_ok(), "a decoded notification is within its bounds");
                    assert_eq!(Notification::decode(&n.encode()).ok(), Some(n));
                }
            }
            _ => {}
        }
    }
}

/// The rpc port of `RpcInterface`: frames as the server and the client read them; what decodes
/// stays within the bounds and encodes back to the same frame.
pub fn rpc_frame(data: &[u8]) {
    let mut r = data;
    while let Ok(f) = rpc::read_frame(&mut r, None, LIMIT) {
        assert!(f.data.len() as u64 <= rpc::MAX_MESSAGE);
        let meta = match &f.tensor {
            Some(t) => {
                assert!(t.dtype.len() <= rpc::MAX_DTYPE && t.shape.len() <= rpc::MAX_DIMS, "{t:?}");
                t.encode().expect("a decoded meta encodes")
            }
            None => Vec::new(),
        };
        let mut again = Vec::new();
        rpc::write_frame(&mut again, f.kind, &meta, &f.data, LIMIT).expect("a decoded frame encodes");
        assert_eq!(rpc::read_frame(&mut again.as_slice(), None, LIMIT).ok(), Some(f));
    }
}

/// The store's disk service: frames as both ends read them, each kind's payload decoded, and
/// the header of a disk file (another process of the same client may have written it).
pub fn disk_service(data: &[u8]) {
    let mut r = data;
    while let Ok((kind, payload)) = service::read_frame(&mut r) {
        assert!(payload.len() <= service::MAX_PAYLOAD);
        match kind {
            service::Kind::Open => {
                if let Ok(o) = service::OpenRequest::decode(&payload) {
                    assert_eq!(service::OpenRequest::decode(&o.encode()).ok(), Some(o));
                }
            }
            service::Kind::Piece => {
                if let Ok(p) = service::Piece::decode(&payload) {
                    assert_eq!(service::Piece::decode(&p.encode()).ok(), Some(p));
                }
            }
            service::Kind::Error => {
                let _ = service::decode_error(&payload, "key");
            }
            _ => {}
        }
    }
    if let Ok(h) = format::Header::decode(data) {
        assert!(h.value_len > 0 && h.value_len <= format::MAX_VALUE_LEN);
        assert!(h.data_offset() >= format::FIXED_LEN as u64 && h.file_len() >= h.data_offset() + h.value_len);
        let enc = h.encode();
        assert_eq!(format::Header::decode(&enc).ok().as_ref(), Some(&h));
    }
    if let Ok(name) = std::str::from_utf8(data) {
        let _ = format::parse_name(name);
    }
}

/// Segment descriptors and rpc_meta entries from a metadata service (or a peer's handshake).
pub fn descriptor_json(data: &[u8]) {
    if let Ok(d) = SegmentDescriptor::from_json(data) {
        let again = SegmentDescriptor::from_json(&d.to_json()).expect("a valid descriptor re-reads");
        assert_eq!(again.to_json(), d.to_json());
    }
    let _ = RpcMeta::from_json(data);
}

/// The master's gRPC methods (of the streaming `Subscribe` and `OwnerStream`: their start).
pub const MASTER_METHODS: [&str; 36] = [
    "MountSegment",
    "UnmountSegment",
    "RemountSegment",
    "PutStart",
    "PutEnd",
    "PutRevoke",
    "BatchPutStart",
    "BatchPutEnd",
    "BatchPutRevoke",
    "GetReplicaList",
    "BatchGetReplicaList",
    "Exists",
    "BatchExists",
    "QueryKey",
    "Remove",
    "RemoveByRegex",
    "RemoveAll",
    "Ping",
    "QueryKeys",
    "PrefixQuery",
    "NodeStats",
    "Publish",
    "Retract",
    "ReplicateStart",
    "ReplicateEnd",
    "TakeReplicationTasks",
    "Subscribe",
    "MountDisk",
    "UpdateDiskReplicas",
    "OwnerStream",
    "RemountWithReport",
    "CreateCopyTask",
    "CreateMoveTask",
    "QueryTask",
    "FinishTask",
    "BatchReplicaClear",
];

type Service = crescent_store::proto::master_server::MasterServer<crescent_store::master::service::MasterService>;

thread_local! {
    static MASTER: std::cell::RefCell<(Service, u32)> = std::cell::RefCell::new((new_master(), 0));
    /// The master's handlers run on tokio, as in `crescent-master` (timers: the owner
    /// stream's first acknowledgement waits with a deadline).
    static RUNTIME: tokio::runtime::Runtime =
        tokio::runtime::Builder::new_current_thread().enable_time().build().expect("a tokio runtime");
}

fn new_master() -> Service {
    let config = crescent_store::MasterConfig::default();
    let master = crescent_store::Master::new(config).expect("a master with the default configuration");
    crescent_store::master::service::MasterService::new(master)
}

/// The master's gRPC service as a peer reaches it: the first byte picks a method, the rest is
/// the protobuf message, framed as gRPC and sent through tonic's server (its decode, its size
/// cap) into the service's own checks. The master's state carries over between inputs (puts
/// then gets) and starts over every 4096 inputs, so it stays small.
pub fn master_request(data: &[u8]) {
    use http_body_util::BodyExt;
    use tonic::codegen::Service as _;
    let Some((pick, message)) = data.split_first() else { return };
    let method = MASTER_METHODS[*pick as usize % MASTER_METHODS.len()];
    let mut body = Vec::with_capacity(5 + message.len());
    body.push(0);
    body.extend_from_slice(&(message.len() as u32).to_be_bytes());
    body.extend_from_slice(message);
    let req = http::Request::builder()
        .method("POST")
        .uri(format!("http://master/crescent.master.v1.Master/{method}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(http_body_util::Full::new(bytes::Bytes::from(body)))
        .expect("a request");
    MASTER.with(|m| {
        let mut m = m.borrow_mut();
        m.1 += 1;
        if m.1 % 4096 == 0 {
            m.0 = new_master();
        }
        let fut = m.0.call(req);
        let resp = RUNTIME.with(|rt| rt.block_on(fut)).expect("the service answers every request");
        if !matches!(method, "Subscribe" | "OwnerStream") {
            // The reply (or the status in its trailers) is produced here.
            let _ = RUNTIME.with(|rt| rt.block_on(resp.into_body().collect()));
        }
    });
}

/// The client's JSON file (`MOONCAKE_CONFIG_PATH`), and the settings derived from it.
pub fn client_config(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut c = ClientConfig::default();
    if c.apply_json(&text).is_ok() {
        let _ = c.engine_config();
        let _ = c.disk_config();
        let _ = c.hot_cache.resolve();
    }
}

/// The master's configuration files: upstream's `--config_path` JSON (first byte even) or
/// Crescent's `--config` JSON (odd), read by [`check_config_file`] (the file formats alone, fast
/// enough for millions of inputs). A file the check accepts then goes through the whole
/// command-line parse, which must agree: it never refuses the file itself (upstream's format:
/// no error about `--config_path=`; Crescent's: no error at all, nothing else being set).
pub fn master_config(data: &[u8]) {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    let Some((pick, text)) = data.split_first() else { return };
    let Ok(text) = std::str::from_utf8(text) else { return };
    let format = if pick % 2 == 0 { ConfigFormat::Mooncake } else { ConfigFormat::Crescent };
    if check_config_file(format, text).is_err() {
        return;
    }
    let dir = DIR.get_or_init(|| tempfile::tempdir().expect("a temporary directory"));
    let path = dir.path().join("master.json");
    std::fs::write(&path, text).expect("writing the config file");
    let flag = if format == ConfigFormat::Mooncake { "--config_path" } else { "--config" };
    let parsed =
        crescent_store::master::cli::parse(["crescent-master".to_string(), format!("{flag}={}", path.display())]);
    match (format, parsed) {
        (_, Ok(_)) => {}
        (ConfigFormat::Mooncake, Err(e)) => {
            let shown = e.to_string();
            assert!(!shown.contains("--config_path="), "the check accepted a file the parse refuses: {shown}");
        }
        (ConfigFormat::Crescent, Err(e)) => panic!("the check accepted a file the parse refuses: {e}"),
    }
}

/// Every environment variable of the engine, the store client and the hot cache: the input's
/// lines are the values, in this order.
pub const ENV_NAMES: [&str; 31] = [
    "MC_FORCE_TCP",
    "MC_TCP_LANES",
    "MC_SHM_THREADS",
    "MC_TCP_SLICE_SIZE",
    "MC_TRANSFER_TIMEOUT",
    "MC_METADATA_CLUSTER_ID",
    "MC_METADATA_TTL",
    "MC_DEVICE",
    "MC_GID_INDEX",
    "MC_MTU",
    "MC_SLICE_SIZE",
    "MC_NUM_QP_PER_EP",
    "MC_IB_TIMEOUT",
    "MC_IB_RETRY_CNT",
    "MC_IBVERBS_LIBRARY",
    "MOONCAKE_MASTER",
    "MOONCAKE_TE_META_DATA_SERVER",
    "MOONCAKE_LOCAL_HOSTNAME",
    "MOONCAKE_PROTOCOL",
    "MOONCAKE_DEVICE",
    "MOONCAKE_GLOBAL_SEGMENT_SIZE",
    "MOONCAKE_LOCAL_BUFFER_SIZE",
    "MOONCAKE_OFFLOAD_ENABLED",
    "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH",
    "MOONCAKE_ENABLE_CLIENT_HTTP_SERVER",
    "MOONCAKE_CLIENT_HTTP_PORT",
    "MOONCAKE_TENANT_ID",
    "LOCAL_HOT_CACHE_SIZE",
    "LOCAL_HOT_BLOCK_SIZE",
    "MC_STORE_LOCAL_HOT_CACHE_SIZE",
    "LOCAL_HOT_CACHE_FILL",
];

/// Environment values (sizes, durations, numbers, names): line `i` of the input is the value
/// of [`ENV_NAMES`]`[i]` (an empty line: unset).
pub fn env_values(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let values: Vec<&str> = text.split('\n').collect();
    let var = |name: &str| {
        let i = ENV_NAMES.iter().position(|n| *n == name)?;
        values.get(i).filter(|v| !v.is_empty()).map(|v| v.to_string())
    };
    let _ = EngineConfig::default().apply_vars(&var);
    let _ = ClientConfig::default().apply_mooncake_env(var);
    if let Ok(h) = HotCacheSettings::from_vars(var) {
        let _ = h.resolve();
    }
    for v in &values {
        if let Ok(n) = crescent_engine::parse_size(v) {
            assert!(n > 0);
        }
    }
}
