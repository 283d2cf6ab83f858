//! The store moving device (GPU) memory on the fake CUDA driver (`tests/fake-cuda`): its device
//! memory is a `PROT_NONE` mapping, so any CPU touch of it by the store client (a local
//! replica's memcpy, a hot-cache hit, a checksum, the disk tier) would kill the test. Values
//! are put from and got into registered device buffers over tcp and shm, through a replica in
//! the client's own segment and remote ones, the hot cache, batches mixing host and device
//! buffers, multi-buffer layouts, ranges and sessions; every byte is checked by copying the
//! device memory back with the driver.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crescent_engine::{EngineConfig, TransferEngine, TransportKind};
use crescent_store::client::hot_cache::{FillMode, HotCacheSettings};
use crescent_store::client::{Batch, Buffer, Extent, Op, Outcome, Piece, Source};
use crescent_store::error::Fault;
use crescent_store::master::server::MasterHandle;
use crescent_store::{pattern, AllocationStrategy, ClientConfig, MasterConfig, StoreApi, StoreClient, StoreError};
use crescent_transports::device::{Devices, Driver};

const MIB: u64 = 1 << 20;

fn fake_driver() -> PathBuf {
    PathBuf::from(env!("FAKE_CUDA_DRIVER"))
}

fn driver() -> Arc<Driver> {
    Devices::new(Some(fake_driver())).driver().expect("the fake CUDA driver loads")
}

/// Device memory of the fake driver, freed when dropped.
struct DeviceBuffer {
    driver: Arc<Driver>,
    addr: u64,
    len: u64,
}

impl DeviceBuffer {
    fn new(len: u64) -> Self {
        let driver = driver();
        let addr = driver.api().alloc(0, len).expect("fake device memory");
        DeviceBuffer { driver, addr, len }
    }

    /// Filled with the pattern of `seed` (copied from the host with the driver).
    fn with_pattern(len: u64, seed: u64) -> Self {
        let b = Self::new(len);
        b.driver.copy(0, b.addr, data(len, seed).as_ptr() as u64, len).unwrap();
        b
    }

    /// Every byte set to `v`.
    fn set(&self, v: u8) {
        let host = vec![v; self.len as usize];
        self.driver.copy(0, self.addr, host.as_ptr() as u64, self.len).unwrap();
    }

    /// `[off, +len)` copied back to the host with the driver.
    fn read_back(&self, off: u64, len: u64) -> Vec<u8> {
        let mut host = vec![0u8; len as usize];
        self.driver.copy(0, host.as_mut_ptr() as u64, self.addr + off, len).unwrap();
        host
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        let _ = self.driver.api().free(0, self.addr);
    }
}

fn data(len: u64, seed: u64) -> Vec<u8> {
    crescent_tests::store::pattern_bytes(len as usize, seed)
}

fn holds(bytes: &[u8], seed: u64, from: u64) -> bool {
    pattern::first_mismatch(bytes, seed, from).is_none()
}

fn master() -> MasterHandle {
    crescent_tests::store::loopback_master(MasterConfig {
        allocation_strategy: AllocationStrategy::LocalFirst,
        ..MasterConfig::default()
    })
}

/// A client on an engine that loads `driver`, contributing `segment` bytes (0: its replicas
/// are all another client's), with `hot` as its hot cache.
fn client_with(
    m: &MasterHandle,
    protocol: TransportKind,
    segment: u64,
    hot: HotCacheSettings,
    driver: PathBuf,
    verify: bool,
) -> Arc<StoreClient> {
    let engine = TransferEngine::new(EngineConfig {
        local_hostname: Some("127.0.0.1".into()),
        protocol: Some(protocol),
        transfer_timeout: Duration::from_secs(30),
        cuda_driver: Some(driver),
        ..EngineConfig::default()
    })
    .expect("an engine on loopback");
    let config = ClientConfig {
        global_segment_size: segment,
        local_buffer_size: 4 * MIB,
        hot_cache: hot,
        verify_checksums: verify,
        ..crescent_tests::store::loopback_client_config(m)
    };
    StoreClient::connect_with_engine(config, engine).expect("a client of the loopback master")
}

fn client(m: &MasterHandle, protocol: TransportKind, segment: u64) -> Arc<StoreClient> {
    client_with(m, protocol, segment, HotCacheSettings::default(), fake_driver(), false)
}

fn keys(names: &[&str]) -> Vec<String> {
    names.iter().map(|k| k.to_string()).collect()
}

/// Puts and gets of device buffers between a client holding the replicas (its own segment: a
/// local copy) and a pure consumer (remote replicas through the engine), both ways.
fn device_memory_moves_through_the_store(protocol: TransportKind) {
    let m = master();
    let holder = client(&m, protocol, 32 * MIB);
    let consumer = client(&m, protocol, 0);
    let len = MIB + 333;
    let (src, dst) = (DeviceBuffer::with_pattern(len, 1), DeviceBuffer::new(len));
    let (csrc, cdst) = (DeviceBuffer::with_pattern(len, 2), DeviceBuffer::new(len));
    holder.register_buffer(src.addr, len).unwrap();
    holder.register_buffer(dst.addr, len).unwrap();
    consumer.register_buffer(csrc.addr, len).unwrap();
    consumer.register_buffer(cdst.addr, len).unwrap();

    // Into the holder's own segment (a device-to-host copy), then to the consumer's device
    // (a remote read into device memory) and back into the holder's (host-to-device).
    holder.put_from("local", src.addr, len).unwrap();
    assert_eq!(consumer.get_into("local", cdst.addr, len).unwrap(), len);
    assert!(holds(&cdst.read_back(0, len), 1, 0), "{protocol}: remote replica into device memory");
    assert_eq!(holder.get_into("local", dst.addr, len).unwrap(), len);
    assert!(holds(&dst.read_back(0, len), 1, 0), "{protocol}: own replica into device memory");

    // From the consumer's device into the holder's segment (a remote write from device memory).
    consumer.put_from("remote", csrc.addr, len).unwrap();
    dst.set(0);
    assert_eq!(holder.get_into("remote", dst.addr, len).unwrap(), len);
    assert!(holds(&dst.read_back(0, len), 2, 0), "{protocol}: remote write from device memory");
    assert_eq!(holder.get("remote").unwrap(), data(len, 2), "{protocol}: the host sees the same bytes");

    // Ranges of a value into device memory, from the own replica and a remote one.
    for c in [&holder, &consumer] {
        let d = if Arc::ptr_eq(c, &holder) { &dst } else { &cdst };
        d.set(0);
        let ranges =
            [Extent { offset: 10, addr: d.addr, len: 100 }, Extent { offset: MIB, addr: d.addr + 200, len: 333 }];
        assert_eq!(c.get_into_ranges("remote", &ranges).unwrap(), 433);
        let back = d.read_back(0, 533);
        assert!(holds(&back[..100], 2, 10) && holds(&back[200..], 2, MIB), "{protocol}: ranges");
    }
}

#[test]
fn tcp_puts_and_gets_device_memory_through_own_and_remote_replicas() {
    device_memory_moves_through_the_store(TransportKind::Tcp);
}

#[test]
fn shm_puts_and_gets_device_memory_through_own_and_remote_replicas() {
    device_memory_moves_through_the_store(TransportKind::Shm);
}

/// Batches mixing host and device buffers, values laid out in several device buffers, and
/// the op runner: over `protocol`, the holder's own replicas and the consumer's remote ones.
fn batches_mix_host_and_device_buffers(protocol: TransportKind) {
    let m = master();
    let holder = client(&m, protocol, 32 * MIB);
    let consumer = client(&m, protocol, 0);
    let (a_len, b_len) = (256 * 1024 + 7, 64 * 1024);
    let dev = DeviceBuffer::with_pattern(a_len, 10);
    let (part1, part2) = (DeviceBuffer::with_pattern(b_len, 11), DeviceBuffer::with_pattern(b_len, 12));
    let mut host = data(a_len, 13);
    for c in [&holder, &consumer] {
        c.register_buffer(dev.addr, a_len).unwrap();
        c.register_buffer(part1.addr, b_len).unwrap();
        c.register_buffer(part2.addr, b_len).unwrap();
        c.register_buffer(host.as_mut_ptr() as u64, a_len).unwrap();
    }
    for (w, writer) in [&holder, &consumer].into_iter().enumerate() {
        let names: Vec<String> = ["dev", "host", "multi"].iter().map(|k| format!("{k}{w}")).collect();
        let pieces_dev = [Piece::new(dev.addr, a_len)];
        let pieces_host = [Piece::new(host.as_ptr() as u64, a_len)];
        let pieces_multi = [Piece::new(part1.addr, b_len), Piece::new(part2.addr, b_len)];
        let values: Vec<&[Piece]> = vec![&pieces_dev, &pieces_host, &pieces_multi];
        let put = writer.batch_put_from_sg(&names, &values, &writer.default_options()).unwrap();
        assert!(put.iter().all(Result::is_ok), "{protocol}: {put:?}");

        for reader in [&holder, &consumer] {
            let (into_dev, into_host_dev, into1, into2) = (
                DeviceBuffer::new(a_len),
                DeviceBuffer::new(a_len),
                DeviceBuffer::new(b_len),
                DeviceBuffer::new(b_len),
            );
            let mut into_host = vec![0u8; a_len as usize];
            for (addr, len) in
                [(into_dev.addr, a_len), (into_host_dev.addr, a_len), (into1.addr, b_len), (into2.addr, b_len)]
            {
                reader.register_buffer(addr, len).unwrap();
            }
            reader.register_buffer(into_host.as_mut_ptr() as u64, a_len).unwrap();
            // The device value into host memory, the host value into device memory, the
            // multi-buffer value into two device buffers.
            let got = reader
                .batch_get_into_sg(
                    &names,
                    &[
                        &[Piece::new(into_host.as_mut_ptr() as u64, a_len)],
                        &[Piece::new(into_host_dev.addr, a_len)],
                        &[Piece::new(into1.addr, b_len), Piece::new(into2.addr, b_len)],
                    ],
                )
                .unwrap();
            assert!(got.iter().all(|r| r.is_ok()), "{protocol}: {got:?}");
            assert!(holds(&into_host, 10, 0), "{protocol}: device value into host memory");
            assert!(holds(&into_host_dev.read_back(0, a_len), 13, 0), "{protocol}: host value into device memory");
            assert!(holds(&into1.read_back(0, b_len), 11, 0) && holds(&into2.read_back(0, b_len), 12, 0));

            // batch_get_into with one device buffer per key.
            let got = reader.batch_get_into(&names[..1], &[into_dev.addr], &[a_len]).unwrap();
            assert!(matches!(got[..], [Ok(n)] if n == a_len), "{got:?}");
            assert!(holds(&into_dev.read_back(0, a_len), 10, 0), "{protocol}: batch_get_into device memory");
            for addr in [into_dev.addr, into_host_dev.addr, into1.addr, into2.addr, into_host.as_ptr() as u64] {
                reader.unregister_buffer(addr).unwrap();
            }
        }
    }

    // The op runner: a device buffer tagged as such moves; one tagged as a GPU's that is host
    // memory is refused alone.
    let api: &dyn StoreApi = &*consumer;
    let ops = vec![
        Op::Put { key: "op-dev", from: Source::Buffers(vec![Buffer::cuda(0, dev.addr, a_len)]), upsert: false },
        Op::Put {
            key: "op-lie",
            from: Source::Buffers(vec![Buffer::cuda(0, host.as_ptr() as u64, a_len)]),
            upsert: false,
        },
    ];
    let got = api.run(Batch::together(ops, api.default_options())).unwrap();
    assert!(matches!(got[0], Ok(Outcome::Done)), "{:?}", got[0]);
    assert!(matches!(&got[1], Err(StoreError::DeviceMemory { key, device: 0, .. }) if key == "op-lie"), "{:?}", got[1]);
    assert_eq!(holder.get("op-dev").unwrap(), data(a_len, 10));
}

#[test]
fn tcp_batches_mix_host_and_device_buffers_and_multi_buffer_layouts() {
    batches_mix_host_and_device_buffers(TransportKind::Tcp);
}

#[test]
fn shm_batches_mix_host_and_device_buffers_and_multi_buffer_layouts() {
    batches_mix_host_and_device_buffers(TransportKind::Shm);
}

#[test]
fn hot_cache_hits_and_fills_serve_device_memory() {
    let m = master();
    let holder = client(&m, TransportKind::Tcp, 32 * MIB);
    let hot = HotCacheSettings { fill: FillMode::Inline, ..HotCacheSettings::with_sizes(8 * MIB, Some(MIB)) };
    let reader = client_with(&m, TransportKind::Tcp, 4 * MIB, hot, fake_driver(), false);
    let len = MIB / 2 + 5;
    let value = data(len, 21);
    holder.put("hot", &value).unwrap();
    holder.put("hot2", &data(len, 22)).unwrap();
    let dst = DeviceBuffer::new(len);
    reader.register_buffer(dst.addr, len).unwrap();
    // A miss reads into device memory and fills the cache from it; the next get is a hit.
    assert_eq!(reader.get_into("hot", dst.addr, len).unwrap(), len);
    assert!(holds(&dst.read_back(0, len), 21, 0));
    reader.hot_cache().unwrap().flush();
    dst.set(0);
    assert_eq!(reader.get_into("hot", dst.addr, len).unwrap(), len);
    assert!(holds(&dst.read_back(0, len), 21, 0), "a hit copied into device memory");
    // Batches: a hit and a miss into device memory.
    let dst2 = DeviceBuffer::new(len);
    reader.register_buffer(dst2.addr, len).unwrap();
    dst.set(0);
    let got = reader.batch_get_into(&keys(&["hot", "hot2"]), &[dst.addr, dst2.addr], &[len, len]).unwrap();
    assert!(got.iter().all(|r| matches!(r, Ok(n) if *n == len)), "{got:?}");
    assert!(holds(&dst.read_back(0, len), 21, 0) && holds(&dst2.read_back(0, len), 22, 0));
    reader.hot_cache().unwrap().flush();
    let metrics = reader.hot_cache_metrics().unwrap();
    assert!(metrics.hits >= 2, "{metrics:?}");
    // The entries filled from device memory hold the value: a byte get hits them.
    assert_eq!(reader.get("hot2").unwrap(), data(len, 22));
}

#[test]
fn sessions_and_checksums_move_device_memory() {
    let m = master();
    let holder = client_with(&m, TransportKind::Tcp, 32 * MIB, HotCacheSettings::default(), fake_driver(), true);
    let consumer = client_with(&m, TransportKind::Tcp, 0, HotCacheSettings::default(), fake_driver(), true);
    let len = 300 * 1024;
    let src = DeviceBuffer::with_pattern(len, 31);
    let dst = DeviceBuffer::new(len);
    for c in [&holder, &consumer] {
        c.register_buffer(src.addr, len).unwrap();
        c.register_buffer(dst.addr, len).unwrap();
    }
    // With checksums on: a device value is put without the writer's checksum; a host value
    // read into device memory is verified (copied back to be summed).
    holder.put("checked", &data(len, 32)).unwrap();
    for (i, c) in [&holder, &consumer].into_iter().enumerate() {
        dst.set(0);
        assert_eq!(c.get_into("checked", dst.addr, len).unwrap(), len);
        assert!(holds(&dst.read_back(0, len), 32, 0));
        let key = format!("unchecked{i}");
        c.put_from(&key, src.addr, len).unwrap();
        assert_eq!(holder.get(&key).unwrap(), data(len, 31));
    }

    // Put and get sessions, in two ranges each, from and into device memory.
    for (i, c) in [&holder, &consumer].into_iter().enumerate() {
        let k = keys(&[&format!("session{i}")]);
        let started = c.batch_put_session_start(&k, &[len], &c.default_options()).unwrap();
        assert!(started[0].is_ok(), "{started:?}");
        let half = len / 2;
        let ranges = [
            Extent { offset: 0, addr: src.addr, len: half },
            Extent { offset: half, addr: src.addr + half, len: len - half },
        ];
        let wrote = c.batch_put_from_session_ranges(&k, &[&ranges]).unwrap();
        assert!(matches!(wrote[..], [Ok(n)] if n == len), "{wrote:?}");
        assert!(c.batch_put_session_end(&k).unwrap()[0].is_ok());
        for reader in [&holder, &consumer] {
            dst.set(0);
            assert!(reader.batch_get_session_start(&k).unwrap()[0].is_ok());
            let ranges = [
                Extent { offset: half, addr: dst.addr + half, len: len - half },
                Extent { offset: 0, addr: dst.addr, len: half },
            ];
            let read = reader.batch_get_into_session_ranges(&k, &[&ranges]).unwrap();
            assert!(matches!(read[..], [Ok(n)] if n == len), "{read:?}");
            reader.batch_get_session_end(&k).unwrap();
            assert!(holds(&dst.read_back(0, len), 31, 0), "session {i} into device memory");
        }
    }
}

#[test]
fn bad_device_input_is_a_typed_error_never_a_crash() {
    let m = master();
    let c = client(&m, TransportKind::Tcp, 8 * MIB);
    let (a, b) = (DeviceBuffer::with_pattern(MIB, 41), DeviceBuffer::new(MIB));
    // Not registered: refused before any byte moves.
    let err = c.put_from("k", a.addr, MIB).unwrap_err();
    assert!(matches!(err, StoreError::NotRegistered { .. }) && err.fault() == Fault::Caller, "{err}");
    let err = c.get_into("k", a.addr, MIB).unwrap_err();
    assert!(matches!(err, StoreError::NotRegistered { .. }), "{err}");
    // A range crossing the end of an allocation, detected or given.
    for location in ["*", "cuda:0"] {
        let err = c.register_buffer_at(a.addr + MIB - 10, 100, location).unwrap_err();
        assert!(err.fault() == Fault::Caller && err.to_string().contains("allocation"), "{location}: {err}");
    }
    let err = c.register_buffer_at(a.addr, MIB, "cuda:9").unwrap_err();
    assert_eq!(err.fault(), Fault::Caller, "{err}");
    // Two registered allocations side by side are still two: a range over both is refused.
    c.register_buffer(a.addr, MIB).unwrap();
    c.register_buffer(b.addr, MIB).unwrap();
    let (lo, hi) = (a.addr.min(b.addr), a.addr.max(b.addr));
    if hi == lo + MIB {
        let err = c.put_from("k", lo + MIB - 10, 100).unwrap_err();
        assert!(matches!(err, StoreError::NotRegistered { .. }), "{err}");
    }
    // A get into device memory too small for the value.
    c.put_from("k", a.addr, MIB).unwrap();
    let err = c.get_into("k", b.addr, MIB / 2).unwrap_err();
    assert!(matches!(err, StoreError::BufferTooSmall { .. }), "{err}");
    assert!(holds(&b.read_back(0, 0), 0, 0));

    // Without a driver: a device registration is a clear error (the host's, not the caller's).
    let none = client_with(
        &m,
        TransportKind::Tcp,
        0,
        HotCacheSettings::default(),
        PathBuf::from("/nonexistent/libcuda.so.1"),
        false,
    );
    let err = none.register_buffer_at(a.addr, MIB, "cuda:0").unwrap_err();
    assert!(err.fault() != Fault::Caller && err.to_string().contains("libcuda"), "{err}");
}

#[test]
fn the_disk_tier_takes_a_put_from_device_memory_and_serves_gets_into_it() {
    let m = crescent_tests::store::loopback_master(MasterConfig::default());
    let root = tempfile::tempdir().unwrap();
    let engine = |driver| {
        TransferEngine::new(EngineConfig {
            local_hostname: Some("127.0.0.1".into()),
            protocol: Some(TransportKind::Tcp),
            cuda_driver: Some(driver),
            ..EngineConfig::default()
        })
        .unwrap()
    };
    let config = |root: Option<&std::path::Path>| ClientConfig {
        global_segment_size: 8 * MIB,
        local_buffer_size: 4 * MIB,
        storage_root_dir: root.map(|r| r.to_path_buf()),
        storage_capacity: Some(256 * MIB),
        ..crescent_tests::store::loopback_client_config(&m)
    };
    let a = StoreClient::connect_with_engine(config(Some(root.path())), engine(fake_driver())).unwrap();
    let f = StoreClient::connect_with_engine(config(None), engine(fake_driver())).unwrap();
    let len = 3 * MIB + 99;
    let src = DeviceBuffer::with_pattern(len, 51);
    a.register_buffer(src.addr, len).unwrap();
    // The disk tier's copy of a put from device memory is copied out with the driver.
    a.put_from("on-disk", src.addr, len).unwrap();
    assert!(a.flush_offload(Duration::from_secs(60)));
    for i in 0..40 {
        f.put(&format!("fill/{i}"), &data(MIB, 1000 + i)).unwrap();
    }
    let tiers: Vec<i32> = a.query("on-disk").unwrap().replicas.iter().map(|r| r.tier).collect();
    assert_eq!(tiers, [crescent_store::proto::Tier::Ssd as i32], "only the disk copy is left");
    // Its own file (read into host memory, then to the device) and another client's (staged by
    // the owner's disk service, read by the engine into device memory).
    for c in [&a, &f] {
        let dst = DeviceBuffer::new(len);
        c.register_buffer(dst.addr, len).unwrap();
        assert_eq!(c.get_into("on-disk", dst.addr, len).unwrap(), len);
        assert!(holds(&dst.read_back(0, len), 51, 0), "{}", c.segment_name());
        let two = [Piece::new(dst.addr, MIB), Piece::new(dst.addr + MIB, len - MIB)];
        dst.set(0);
        assert_eq!(c.get_into_sg("on-disk", &two).unwrap(), len);
        assert!(holds(&dst.read_back(0, len), 51, 0), "{}: two buffers", c.segment_name());
        c.unregister_buffer(dst.addr).unwrap();
    }
}
