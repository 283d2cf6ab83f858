//! `StoreClient::get_with` (issue 28 §2): a byte get that reads the value into memory the
//! caller makes once the size is known (what the Python `get` lands its `bytes` object with).
//! In one process against an in-process master on loopback: the sink is asked for the value's
//! size and gets every byte (from a remote replica, the client's own segment, its disk file,
//! another size's stale file); a sink's memory of the wrong length is refused as the caller's
//! mistake; a miss never asks the sink; a sink's own failure ends the get with its error.

use std::mem::MaybeUninit;
use std::time::Duration;

use crescent_store::{ClientConfig, MasterConfig, StoreApi, StoreClient, StoreError, ValueSink};

/// A sink that records the sizes it was asked for and gives `size + skew` bytes (a wrong
/// length when `skew` is not 0), or `fail`'s error.
#[derive(Default)]
struct Recording {
    asked: Vec<u64>,
    skew: i64,
    fail: bool,
    buf: Vec<MaybeUninit<u8>>,
}

impl ValueSink for Recording {
    fn buffer(&mut self, size: u64) -> crescent_store::Result<&mut [MaybeUninit<u8>]> {
        self.asked.push(size);
        if self.fail {
            return Err(StoreError::system(
                "making the caller's buffer",
                std::io::Error::new(std::io::ErrorKind::OutOfMemory, "no memory for it"),
            ));
        }
        let len = (size as i64 + self.skew) as usize;
        self.buf = vec![MaybeUninit::uninit(); len];
        Ok(&mut self.buf)
    }
}

impl Recording {
    /// The value, after a get that succeeded (it wrote every byte of the last buffer).
    fn value(&self) -> Vec<u8> {
        // SAFETY: the get succeeded, so every byte of the buffer it was last given was written.
        self.buf.iter().map(|b| unsafe { b.assume_init() }).collect()
    }
}

fn reader(m: &crescent_store::master::server::MasterHandle) -> std::sync::Arc<StoreClient> {
    // No segment of its own: every value it gets lies in another client's memory.
    StoreClient::connect(ClientConfig {
        global_segment_size: 0,
        local_buffer_size: 4 << 20,
        ..crescent_tests::store::loopback_client_config(m)
    })
    .expect("reader client")
}

#[test]
fn get_with_asks_the_sink_for_the_size_once_and_fills_it_from_memory() {
    let m = crescent_tests::store::loopback_master(MasterConfig::default());
    let holder = crescent_tests::store::loopback_client(&m, 64 << 20);
    let reader = reader(&m);
    let piece = 2 << 20;
    for (i, len) in [1, 4095, 4097, piece + 1, 3 * piece + 5].into_iter().enumerate() {
        let key = format!("gw/{len}");
        let value = crescent_tests::store::pattern_bytes(len, 60 + i as u64);
        holder.put(&key, &value).expect("put");
        // From the holder's memory over the engine, and from the holder's own segment.
        for (who, client) in [("reader", &reader), ("holder", &holder)] {
            let mut sink = Recording::default();
            assert_eq!(client.get_with(&key, &mut sink).expect("get_with"), len as u64, "{who}, {len} bytes");
            assert_eq!(sink.asked, [len as u64], "{who}, {len} bytes: asked once, for the value's size");
            assert!(sink.value() == value, "{who}, {len} bytes: wrong bytes");
        }
    }
}

#[test]
fn a_sink_of_the_wrong_length_is_the_callers_mistake_a_miss_never_asks_and_a_sinks_error_ends_the_get() {
    let m = crescent_tests::store::loopback_master(MasterConfig::default());
    let holder = crescent_tests::store::loopback_client(&m, 16 << 20);
    let reader = reader(&m);
    let value = crescent_tests::store::pattern_bytes(10_000, 7);
    holder.put("gw/k", &value).expect("put");

    let mut short = Recording { skew: -1, ..Recording::default() };
    match reader.get_with("gw/k", &mut short) {
        Err(e @ StoreError::BufferTooSmall { need: 10_000, have: 9_999, .. }) => assert!(e.is_caller_error(), "{e}"),
        other => panic!("a short buffer: {other:?}"),
    }
    let mut long = Recording { skew: 1, ..Recording::default() };
    match reader.get_with("gw/k", &mut long) {
        Err(e @ StoreError::InvalidArgument(_)) => assert!(e.is_caller_error(), "{e}"),
        other => panic!("a longer buffer: {other:?}"),
    }

    let mut failing = Recording { fail: true, ..Recording::default() };
    match reader.get_with("gw/k", &mut failing) {
        Err(e @ StoreError::System { .. }) => assert!(!e.is_caller_error() && !e.is_retryable(), "{e}"),
        other => panic!("a sink that failed: {other:?}"),
    }

    let mut miss = Recording::default();
    assert!(matches!(reader.get_with("gw/none", &mut miss), Err(StoreError::NotFound(_))));
    assert!(miss.asked.is_empty(), "a miss asked the sink for {:?}", miss.asked);

    // None of that harmed the object: a right-sized sink gets it.
    let mut right = Recording::default();
    assert_eq!(reader.get_with("gw/k", &mut right).unwrap(), 10_000);
    assert!(right.value() == value);
}

#[test]
fn get_with_reads_disk_files_and_asks_again_when_a_stale_file_had_another_size() {
    // A is silent (pings an hour apart): the master must not drop it meanwhile.
    let m = crescent_tests::store::loopback_master(MasterConfig {
        client_ttl: Duration::from_secs(300),
        ..MasterConfig::default()
    });
    let root = tempfile::tempdir().unwrap();
    let config = |ping_interval| ClientConfig {
        global_segment_size: 8 << 20,
        local_buffer_size: 4 << 20,
        storage_root_dir: Some(root.path().to_path_buf()),
        storage_capacity: Some(256 << 20),
        ping_interval,
        // Removals reach the disk on pings only (as with a master that keeps no link for
        // disks): the stale file below stays.
        disk_news_stream: false,
        ..crescent_tests::store::loopback_client_config(&m)
    };
    let a = StoreClient::connect(config(Duration::from_secs(1))).unwrap();
    let sizes = [4097, (1 << 20) + 3];
    for (i, len) in sizes.into_iter().enumerate() {
        a.put(&format!("gwd/{i}"), &crescent_tests::store::pattern_bytes(len, 80 + i as u64)).unwrap();
    }
    assert!(a.flush_offload(Duration::from_secs(60)));
    a.close().unwrap();
    drop(a);
    // Restarted: its files are the only copies, read while the master answers.
    let a = StoreClient::connect(config(Duration::from_secs(3600))).unwrap();
    let mut sink = Recording::default();
    assert_eq!(a.get_with("gwd/0", &mut sink).unwrap(), 4097);
    assert_eq!(sink.asked, [4097]);
    assert!(sink.value() == crescent_tests::store::pattern_bytes(4097, 80));
    assert_eq!(a.disk_stats().unwrap().early_reads, 1);

    // Another client replaces gwd/1 with a value of another size: A's file of it is stale (A
    // hears nothing of it, pings an hour apart), so the file is read into the first buffer and
    // the value into a second one of the new size.
    let f = crescent_tests::store::loopback_client(&m, 16 << 20);
    f.remove_with("gwd/1", true).unwrap();
    let replaced = crescent_tests::store::pattern_bytes(3 << 20, 90);
    f.put("gwd/1", &replaced).unwrap();
    let mut sink = Recording::default();
    assert_eq!(a.get_with("gwd/1", &mut sink).unwrap(), 3 << 20);
    assert_eq!(sink.asked, [(1 << 20) + 3, 3 << 20], "the stale file's size, then the value's");
    assert!(sink.value() == replaced, "the replaced value, not the stale file");
    let s = a.disk_stats().unwrap();
    assert_eq!((s.early_reads, s.early_reads_wasted), (2, 1), "{s:?}");
}

#[test]
fn get_batch_with_fills_each_keys_sink_and_fails_a_wrong_sink_or_a_miss_alone() {
    let m = crescent_tests::store::loopback_master(MasterConfig::default());
    let holder = crescent_tests::store::loopback_client(&m, 64 << 20);
    let reader = reader(&m);
    let lens = [1, 4097, (2 << 20) + 1, 3 << 20];
    let values: Vec<Vec<u8>> =
        lens.iter().enumerate().map(|(i, &n)| crescent_tests::store::pattern_bytes(n, 120 + i as u64)).collect();
    for (i, v) in values.iter().enumerate() {
        holder.put(&format!("gwb/{i}"), v).expect("put");
    }
    let mut keys: Vec<String> = (0..lens.len()).map(|i| format!("gwb/{i}")).collect();
    keys.push("gwb/none".into());
    keys.push("gwb/1".into()); // again, into a sink one byte short
    for client in [&reader, &holder] {
        let mut sinks: Vec<Recording> = keys.iter().map(|_| Recording::default()).collect();
        sinks[keys.len() - 1].skew = -1;
        let mut refs: Vec<&mut dyn ValueSink> = sinks.iter_mut().map(|s| s as &mut dyn ValueSink).collect();
        let got = client.get_batch_with(&keys, &mut refs).expect("get_batch_with");
        for (i, &n) in lens.iter().enumerate() {
            assert!(matches!(got[i], Ok(m) if m == n as u64), "{n} bytes: {:?}", got[i]);
            assert_eq!(sinks[i].asked, [n as u64]);
            assert!(sinks[i].value() == values[i], "{n} bytes: wrong bytes");
        }
        assert!(matches!(got[4], Err(StoreError::NotFound(_))), "{:?}", got[4]);
        assert!(sinks[4].asked.is_empty(), "a miss asked its sink");
        match &got[5] {
            Err(e @ StoreError::BufferTooSmall { need: 4097, have: 4096, .. }) => assert!(e.is_caller_error()),
            other => panic!("a short sink: {other:?}"),
        }
    }
    let mut one = Recording::default();
    let mut refs: Vec<&mut dyn ValueSink> = vec![&mut one];
    assert!(matches!(reader.get_batch_with(&keys, &mut refs), Err(StoreError::InvalidArgument(_))));
}
