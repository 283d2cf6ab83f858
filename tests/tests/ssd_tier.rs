//! The disk tier through the client API, against an in-process master on loopback: values
//! persisted, read from disk once memory lost them (here and through another client),
//! restarts, removal, capacity, damaged files, cluster isolation, configuration errors, a full
//! disk (a small tmpfs of the test's own: root, or skipped).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crescent_store::master::server::MasterHandle;
use crescent_store::proto::{PutOptions, Tier};
use crescent_store::{ClientConfig, MasterConfig, StoreApi, StoreClient, StoreError};
use crescent_tests::tmpfs::Tmpfs;

fn master() -> MasterHandle {
    crescent_tests::store::loopback_master(MasterConfig::default())
}

fn config(m: &MasterHandle, root: Option<&Path>) -> ClientConfig {
    ClientConfig {
        global_segment_size: 8 << 20,
        local_buffer_size: 4 << 20,
        storage_root_dir: root.map(Path::to_path_buf),
        storage_capacity: Some(256 << 20),
        ..crescent_tests::store::loopback_client_config(m)
    }
}

fn client(m: &MasterHandle, root: Option<&Path>) -> Arc<StoreClient> {
    StoreClient::connect(config(m, root)).unwrap()
}

/// A client with a disk tier in a fresh temporary directory, which lives as long as the guard.
fn disk_client(m: &MasterHandle) -> (tempfile::TempDir, Arc<StoreClient>) {
    let root = tempfile::tempdir().unwrap();
    let a = client(m, Some(root.path()));
    (root, a)
}

fn data(len: usize, seed: u64) -> Vec<u8> {
    crescent_tests::store::pattern_bytes(len, seed)
}

/// Pushes every older object out of memory: 40 MiB of fresh values into 16 MiB of pool.
fn fill_memory(filler: &StoreClient, tag: &str) {
    for i in 0..40 {
        filler.put(&format!("fill/{tag}/{i}"), &data(1 << 20, 1000 + i)).unwrap();
    }
}

fn tiers(c: &StoreClient, key: &str) -> Vec<i32> {
    c.query(key).unwrap().replicas.iter().map(|r| r.tier).collect()
}

#[test]
fn values_evicted_from_memory_are_read_from_disk_here_and_through_another_client() {
    let m = master();
    let (_root, a) = disk_client(&m);
    let f = client(&m, None);
    let long = format!("{}end", "very/long/key/".repeat(280)); // ~4 KiB
    let keys = ["k1", "../../../../etc/passwd", "a/b/c/./d", long.as_str()];
    let sizes = [1 << 20, 3 << 20, 5000, 2 << 20];
    for (i, k) in keys.iter().enumerate() {
        a.put(k, &data(sizes[i], i as u64)).unwrap();
    }
    assert!(a.flush_offload(Duration::from_secs(60)));
    assert_eq!(a.disk_stats().unwrap().files, 4);
    // The client's own Prometheus text has the tier's metrics, what it did as counters and its
    // sizes as gauges; a client without one has none.
    let metrics = a.render_metrics();
    for line in [
        "crescent_client_disk_files 4",
        "# TYPE crescent_client_disk_files gauge",
        "crescent_client_disk_written_total 4",
        "# TYPE crescent_client_disk_written_total counter",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} missing from:\n{metrics}");
    }
    assert!(!f.render_metrics().contains("crescent_client_disk"));
    fill_memory(&f, "x");
    for k in keys {
        assert_eq!(tiers(&a, k), [Tier::Ssd as i32], "{k}: only the disk copy is left");
    }
    // Here: the local file. Elsewhere: through A's disk service and the engine (counted as
    // Mooncake's offload RPC reads, there only).
    assert_eq!((a.remote_disk_reads(), f.remote_disk_reads()), (0, 0));
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(a.get(k).unwrap(), data(sizes[i], i as u64), "{k}");
        assert_eq!(f.get(k).unwrap(), data(sizes[i], i as u64), "{k}");
    }
    assert_eq!((a.remote_disk_reads(), f.remote_disk_reads()), (0, keys.len() as u64));
    assert!(a.exists("k1").unwrap() && f.exists(&long).unwrap());
    // Zero copy and batches take the same path.
    let mut dst = vec![0u8; 6 << 20];
    f.register_buffer(dst.as_mut_ptr() as u64, dst.len() as u64).unwrap();
    assert_eq!(f.get_into("k1", dst.as_mut_ptr() as u64, 1 << 20).unwrap(), 1 << 20);
    assert_eq!(&dst[..1 << 20], &data(1 << 20, 0)[..]);
    dst.fill(0);
    let base = dst.as_mut_ptr() as u64;
    let got = f
        .batch_get_into(
            &["k1".into(), "a/b/c/./d".into(), "nope".into()],
            &[base, base + (2 << 20), base],
            &[1 << 20, 5000, 1],
        )
        .unwrap();
    assert!(matches!(got[0], Ok(n) if n == 1 << 20) && matches!(got[1], Ok(5000)), "{got:?}");
    assert!(matches!(got[2], Err(StoreError::NotFound(_))));
    assert_eq!(&dst[2 << 20..(2 << 20) + 5000], &data(5000, 2)[..]);
    f.unregister_buffer(base).unwrap();
    let s = a.disk_stats().unwrap();
    assert!(s.local_reads >= 4 && s.served_reads >= 4, "{s:?}");
    assert_eq!(s.queue_full, 0);
    // Its files are the only copies now (A heard it from the master or from its own gets):
    // its next get reads the file while it asks.
    assert!(a.get(&long).unwrap() == data(2 << 20, 3));
    let t = a.disk_stats().unwrap();
    assert_eq!((t.early_reads - s.early_reads, t.early_reads_wasted), (1, 0), "{t:?}");
}

#[test]
fn a_restarted_client_finds_its_files_and_other_clusters_do_not() {
    let m = master();
    let (root, a) = disk_client(&m);
    for i in 0..5u64 {
        a.put(&format!("keep/{i}"), &data(300_000, i)).unwrap();
    }
    assert!(a.flush_offload(Duration::from_secs(60)));
    a.close().unwrap();
    drop(a);
    let f = client(&m, None);
    assert!(!f.exists("keep/0").unwrap(), "closing unmounted memory and disk");
    // The same root again: the files come back as SSD replicas.
    let a = client(&m, Some(root.path()));
    for i in 0..5u64 {
        assert_eq!(tiers(&f, &format!("keep/{i}")), [Tier::Ssd as i32]);
        assert_eq!(f.get(&format!("keep/{i}")).unwrap(), data(300_000, i));
    }
    a.close().unwrap();
    drop(a);
    // Another cluster id on the same root sees none of them, and its own keys stay apart.
    let mut other = config(&m, Some(root.path()));
    other.cluster_id = Some("other-cluster".into());
    let o = StoreClient::connect(other).unwrap();
    assert!(!o.exists("keep/0").unwrap());
    o.put("theirs", &data(1000, 9)).unwrap();
    assert!(o.flush_offload(Duration::from_secs(60)));
    assert!(root.path().join("other-cluster").is_dir() && root.path().join("default").is_dir());
    o.close().unwrap();
    drop(o);
    let a = client(&m, Some(root.path()));
    assert_eq!(a.disk_stats().unwrap().files, 5, "only this cluster's files");
    assert!(!tiers(&a, "theirs").contains(&(Tier::Ssd as i32)), "the other cluster's file is not announced");
    assert_eq!(tiers(&a, "keep/4"), [Tier::Ssd as i32]);
}

#[test]
fn a_file_expected_to_be_the_only_copy_is_read_while_the_master_answers_but_never_served_stale() {
    // A is silent (pings an hour apart): the master must not drop it meanwhile.
    let m = crescent_tests::store::loopback_master(MasterConfig {
        client_ttl: Duration::from_secs(300),
        ..MasterConfig::default()
    });
    let (root, a) = disk_client(&m);
    for i in 0..4u64 {
        a.put(&format!("e/{i}"), &data(1 << 20, i)).unwrap();
    }
    assert!(a.flush_offload(Duration::from_secs(60)));
    a.close().unwrap();
    drop(a);
    // Restarted: its files are the only copies. Pings an hour apart and no owner stream for its
    // disk (as with a master that keeps no link for disks, or one A is cut off from): A hears
    // of no removal during the test, so its file of a replaced object stays in its index.
    let a = StoreClient::connect(ClientConfig {
        ping_interval: Duration::from_secs(3600),
        disk_news_stream: false,
        ..config(&m, Some(root.path()))
    })
    .unwrap();
    let f = client(&m, None);
    assert!(a.get("e/0").unwrap() == data(1 << 20, 0));
    let mut dst = vec![0u8; 1 << 20];
    a.register_buffer(dst.as_mut_ptr() as u64, dst.len() as u64).unwrap();
    assert_eq!(a.get_into("e/1", dst.as_mut_ptr() as u64, 1 << 20).unwrap(), 1 << 20);
    assert!(dst == data(1 << 20, 1));
    let s = a.disk_stats().unwrap();
    assert_eq!((s.early_reads, s.early_reads_wasted, s.local_reads), (2, 0, 2), "{s:?}");

    // Another client replaces e/2 and e/3: A's files of them are stale, their objects in memory.
    for (i, k) in ["e/2", "e/3"].iter().enumerate() {
        f.remove_with(k, true).unwrap();
        f.put(k, &data(1 << 20, 70 + i as u64)).unwrap();
    }
    assert!(a.get("e/2").unwrap() == data(1 << 20, 70), "the replaced value, not the stale file");
    assert_eq!(a.get_into("e/3", dst.as_mut_ptr() as u64, 1 << 20).unwrap(), 1 << 20);
    assert!(dst == data(1 << 20, 71), "the replaced value, not the stale file");
    let s = a.disk_stats().unwrap();
    assert_eq!((s.early_reads, s.early_reads_wasted), (4, 2), "{s:?}");
    // A wasted guess is not made again.
    assert!(a.get("e/2").unwrap() == data(1 << 20, 70));
    assert_eq!(a.disk_stats().unwrap().early_reads, 4);
    // Removed: the early read finds no object, and the get says so.
    f.remove_with("e/0", true).unwrap();
    assert!(matches!(a.get("e/0"), Err(StoreError::NotFound(_))));
    // A fresh object pushed out of memory: A has no news (no pings), so its first get asks
    // first and falls back to the file; the next one reads the file early.
    a.put("e/new", &data(1 << 20, 9)).unwrap();
    assert!(a.flush_offload(Duration::from_secs(60)));
    fill_memory(&f, "e");
    assert_eq!(tiers(&a, "e/new"), [Tier::Ssd as i32]);
    let before = a.disk_stats().unwrap().early_reads;
    assert!(a.get("e/new").unwrap() == data(1 << 20, 9));
    assert_eq!(a.disk_stats().unwrap().early_reads, before);
    assert!(a.get("e/new").unwrap() == data(1 << 20, 9));
    assert_eq!(a.disk_stats().unwrap().early_reads, before + 1);
    a.unregister_buffer(dst.as_mut_ptr() as u64).unwrap();
}

#[test]
fn a_client_told_that_memory_lost_its_object_reads_the_file_early_on_the_first_get() {
    let m = master();
    let root = tempfile::tempdir().unwrap();
    let fast_pings = ClientConfig { ping_interval: Duration::from_millis(100), ..config(&m, Some(root.path())) };
    let a = StoreClient::connect(fast_pings).unwrap();
    let f = client(&m, None);
    a.put("news/k", &data(1 << 20, 5)).unwrap();
    assert!(a.flush_offload(Duration::from_secs(60)));
    fill_memory(&f, "news");
    assert_eq!(tiers(&a, "news/k"), [Tier::Ssd as i32]);
    // No get has looked since; the master's news arrives on A's pings (every 100 ms here).
    let told = crescent_tests::eventually(Duration::from_secs(20), || a.disk_stats().unwrap().only_copy_marks >= 1);
    assert!(told, "the news came on a ping: {:?}", a.disk_stats());
    assert!(a.get("news/k").unwrap() == data(1 << 20, 5));
    let s = a.disk_stats().unwrap();
    assert_eq!((s.early_reads, s.early_reads_wasted), (1, 0), "{s:?}");
}

#[test]
fn removal_deletes_disk_copies_for_good() {
    let m = master();
    let (root, a) = disk_client(&m);
    let f = client(&m, None);
    for k in ["r/one", "r/two", "x/three", "x/four"] {
        a.put(k, &data(100_000, 1)).unwrap();
    }
    assert!(a.flush_offload(Duration::from_secs(60)));
    f.remove("r/one").unwrap(); // another client removes: the owner hears it on its ping
    assert!(!a.exists("r/one").unwrap());
    let eventually =
        |n: u64| crescent_tests::eventually(Duration::from_secs(10), || a.disk_stats().unwrap().files == n);
    assert!(eventually(3), "{:?}", a.disk_stats());
    assert_eq!(a.remove_by_regex("^r/").unwrap(), 1);
    assert!(eventually(2));
    assert!(a.remove_all().unwrap() >= 2);
    assert!(eventually(0));
    // Not even a restart brings them back.
    a.close().unwrap();
    drop(a);
    let a = client(&m, Some(root.path()));
    assert_eq!(a.disk_stats().unwrap().files, 0);
    assert!(!f.exists("x/three").unwrap());
}

/// A removal is answered once the disks with a copy deleted it (their clients' owner streams
/// for the disk acknowledged), not on their next ping: a removed key's file cannot come back
/// at a new master. Both a holder's disk and that of a writer without a memory segment.
#[test]
fn a_removal_is_answered_after_the_disks_with_a_copy_deleted_it() {
    let m = master();
    let slow_pings = |root: &Path, segment: u64| ClientConfig {
        ping_interval: Duration::from_secs(30),
        global_segment_size: segment,
        ..config(&m, Some(root))
    };
    let (root_a, root_w) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let holder = StoreClient::connect(slow_pings(root_a.path(), 8 << 20)).unwrap();
    let writer = StoreClient::connect(slow_pings(root_w.path(), 0)).unwrap();
    let other = client(&m, None);
    holder.put("held", &data(100_000, 1)).unwrap();
    writer.put("written", &data(100_000, 2)).unwrap();
    assert!(holder.flush_offload(Duration::from_secs(60)) && writer.flush_offload(Duration::from_secs(60)));
    assert_eq!((holder.disk_stats().unwrap().files, writer.disk_stats().unwrap().files), (1, 1));
    other.remove("held").unwrap();
    other.remove("written").unwrap();
    assert_eq!(holder.disk_stats().unwrap().files, 0, "the holder's disk deleted its copy before the answer");
    assert_eq!(writer.disk_stats().unwrap().files, 0, "the writer's disk deleted its copy before the answer");
}

#[test]
fn the_disk_never_holds_more_than_its_capacity() {
    let m = master();
    let root = tempfile::tempdir().unwrap();
    let mut c = config(&m, Some(root.path()));
    c.storage_capacity = Some(3 * ((1 << 20) + 4096));
    c.disk_writer_threads = 1;
    let a = StoreClient::connect(c).unwrap();
    let f = client(&m, None);
    for i in 0..6u64 {
        a.put(&format!("cap/{i}"), &data(1 << 20, i)).unwrap();
        assert!(a.flush_offload(Duration::from_secs(60)));
    }
    let s = a.disk_stats().unwrap();
    assert!(s.used_bytes <= s.capacity, "{s:?}");
    assert_eq!((s.files, s.evicted), (3, 3), "{s:?}");
    fill_memory(&f, "cap");
    // The newest three are on disk; the evicted files are no longer listed anywhere.
    for i in 0..3u64 {
        assert!(matches!(f.get(&format!("cap/{i}")), Err(StoreError::NotFound(_))), "cap/{i}");
    }
    for i in 3..6u64 {
        assert_eq!(f.get(&format!("cap/{i}")).unwrap(), data(1 << 20, i));
    }
}

#[test]
fn a_damaged_file_is_an_error_never_wrong_bytes() {
    let m = master();
    let (_root, a) = disk_client(&m);
    let f = client(&m, None);
    a.put("dmg/local", &data(200_000, 1)).unwrap();
    a.put("dmg/remote", &data(200_000, 2)).unwrap();
    assert!(a.flush_offload(Duration::from_secs(60)));
    fill_memory(&f, "dmg");
    // Flip one byte in the middle of each value.
    let dir = a.disk_dir().unwrap().to_path_buf();
    let mut n = 0;
    for sub in std::fs::read_dir(&dir).unwrap().flatten().filter(|d| d.path().is_dir()) {
        for file in std::fs::read_dir(sub.path()).unwrap().flatten() {
            let mut b = std::fs::read(file.path()).unwrap();
            let at = b.len() - 100_000;
            b[at] ^= 1;
            std::fs::write(file.path(), b).unwrap();
            n += 1;
        }
    }
    assert_eq!(n, 2);
    assert!(a.get("dmg/local").is_err(), "local read of a damaged file");
    assert!(f.get("dmg/remote").is_err(), "remote read of a damaged file");
    assert_eq!(a.disk_stats().unwrap().corrupt_reads, 2);
    // The damaged copies are gone, and so are the objects (they had no other replica).
    assert!(matches!(f.get("dmg/local"), Err(StoreError::NotFound(_))));
    assert!(!f.exists("dmg/remote").unwrap());
}

#[test]
fn a_value_damaged_while_its_client_was_down_is_removed_after_the_restart_and_never_served() {
    let m = master();
    let (root, a) = disk_client(&m);
    a.put("bad/1", &data(300_000, 1)).unwrap();
    a.put("good/1", &data(300_000, 2)).unwrap();
    assert!(a.flush_offload(Duration::from_secs(60)));
    let version = a.query("bad/1").unwrap().version;
    let dir = a.disk_dir().unwrap().to_path_buf();
    a.close().unwrap();
    drop(a);
    // One byte of the value goes bad on the device; header and length stay right.
    let (sub, name) = crescent_store::client::disk::format::file_name("bad/1", version);
    let path = dir.join(sub).join(name);
    let mut b = std::fs::read(&path).unwrap();
    let at = b.len() - 1000;
    b[at] ^= 0x10;
    std::fs::write(&path, b).unwrap();
    let a = client(&m, Some(root.path()));
    let checked = crescent_tests::eventually(Duration::from_secs(30), || a.disk_stats().unwrap().unverified == 0);
    assert!(checked, "the files found at start were never checked");
    let s = a.disk_stats().unwrap();
    assert_eq!((s.files, s.corrupt_removed), (1, 1), "{s:?}");
    assert!(!path.exists(), "the damaged file is removed");
    let f = client(&m, None);
    assert!(matches!(f.get("bad/1"), Err(StoreError::NotFound(_))), "the master was told");
    assert!(matches!(a.get("bad/1"), Err(StoreError::NotFound(_))));
    assert_eq!(f.get("good/1").unwrap(), data(300_000, 2));
}

#[test]
fn an_unusable_storage_root_fails_the_start_with_a_clear_error() {
    let m = master();
    let root = tempfile::tempdir().unwrap();
    let missing = root.path().join("missing");
    let e = StoreClient::connect(config(&m, Some(&missing))).unwrap_err();
    assert!(matches!(e, StoreError::Config(_)) && e.to_string().contains("missing"), "{e}");
    let mut bad = config(&m, Some(root.path()));
    bad.cluster_id = Some("../escape".into());
    assert!(StoreClient::connect(bad).unwrap_err().to_string().contains("cluster id"));
    let _a = client(&m, Some(root.path()));
    let e = StoreClient::connect(config(&m, Some(root.path()))).unwrap_err();
    assert!(e.to_string().contains("in use"), "{e}");
}

#[test]
fn disk_copies_are_read_into_several_buffers_and_by_ranges_here_and_elsewhere() {
    use crescent_store::client::{Extent, Piece};
    let m = master();
    let (_root, a) = disk_client(&m);
    let f = client(&m, None);
    let value = data((3 << 20) + 99, 42);
    a.put("on-disk", &value).unwrap();
    assert!(a.flush_offload(Duration::from_secs(60)));
    fill_memory(&f, "sg");
    assert_eq!(tiers(&a, "on-disk"), [Tier::Ssd as i32], "only the disk copy is left");
    for c in [&a, &f] {
        // Here the file is read whole and the parts copied out; elsewhere the owner's disk
        // service stages it piece by piece and each piece lands where the buffers take it.
        let mut buf = vec![0u8; 4 << 20];
        let at = buf.as_mut_ptr() as u64;
        c.register_buffer(at, buf.len() as u64).unwrap();
        let pieces =
            [Piece::new(at, 1000), Piece::new(at + 1000, (3 << 20) - 1000), Piece::new(at + (3 << 20), 1 << 20)];
        assert_eq!(c.get_into_sg("on-disk", &pieces).unwrap(), value.len() as u64);
        assert!(buf[..value.len()] == value[..], "{}", c.segment_name());
        buf.fill(0);
        // Across the owner's 1 MiB pieces, and the last bytes.
        let ranges = [
            Extent { offset: (1 << 20) - 8, addr: at, len: 16 },
            Extent { offset: value.len() as u64 - 4, addr: at + 16, len: 4 },
        ];
        assert_eq!(c.get_into_ranges("on-disk", &ranges).unwrap(), 20);
        assert!(buf[..16] == value[(1 << 20) - 8..(1 << 20) + 8] && buf[16..20] == value[value.len() - 4..]);
        let past = [Extent { offset: value.len() as u64, addr: at, len: 1 }];
        assert!(matches!(c.get_into_ranges("on-disk", &past), Err(StoreError::BadRange { .. })));
        c.unregister_buffer(at).unwrap();
    }
}

#[test]
fn a_put_whose_file_is_announced_after_a_master_restart_is_served_from_it() {
    // A master on a fixed port, so that a second one can take its place.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let master_config =
        MasterConfig { rpc_address: format!("127.0.0.1:{port}"), admin_address: String::new(), ..Default::default() };
    let first = crescent_store::master::server::start(master_config.clone()).unwrap();
    let root = tempfile::tempdir().unwrap();
    let a = client(&first, Some(root.path()));
    // B holds the only memory replica of "after": once B is gone, A's disk file is its only
    // copy (a new master hears of it from A's announcement alone, not from an owner's report).
    let b = client(&first, None);
    a.put("before", &data(200_000, 1)).unwrap();
    assert!(a.flush_offload(Duration::from_secs(60)));
    // The next put commits; its file is written and waits, not yet announced, at the hold.
    let hold = crescent_store::client::disk::hold::hold_commits(a.disk_dir().unwrap());
    let on_b = PutOptions { preferred_segment: b.segment_name().to_string(), replica_num: 1, ..a.default_options() };
    a.put_with("after", &data(300_000, 2), &on_b).unwrap();
    let q = a.query("after").unwrap();
    assert!(q.replicas.len() == 1 && q.replicas[0].segment_name == b.segment_name(), "in B's memory only: {q:?}");
    assert!(hold.wait_reached(Duration::from_secs(60)), "the file of \"after\" reached its commit round");
    // The master restarts, knowing nothing, and B is gone meanwhile; A remounts (reporting
    // what its own segment holds) and re-announces the files it has.
    first.shutdown();
    b.close().ok();
    drop(b);
    let second = crescent_store::master::server::start(master_config).unwrap();
    assert!(
        crescent_tests::eventually(Duration::from_secs(30), || second.master.exists("before").unwrap_or(false)),
        "A remounted its disk at the new master"
    );
    assert!(!second.master.exists("after").unwrap(), "the new master never heard of \"after\"");
    // Only now is the file of "after" committed and announced, to a master that never saw its put.
    hold.release();
    assert!(a.flush_offload(Duration::from_secs(60)));
    assert!(second.master.exists("after").unwrap(), "an acknowledged put is not taken for a removed one");
    assert_eq!(tiers(&a, "after"), [Tier::Ssd as i32]);
    assert!(a.get("after").unwrap() == data(300_000, 2), "served from the file, bytes intact");
    assert!(a.get("before").unwrap() == data(200_000, 1));
    let s = a.disk_stats().unwrap();
    // The new master took the fresh announcement itself (no refusal the client had to doubt).
    assert_eq!((s.files, s.stale_refused, s.ambiguous_refusals), (2, 0, 0), "{s:?}");
}

/// A small tmpfs of `size` for a full-disk test; `None` (the test skipped) where this process
/// cannot mount one.
fn small_fs(size: &str) -> Option<Tmpfs> {
    Tmpfs::mount(size).map_err(|why| crescent_tests::skip(&why)).ok()
}

/// The value of the client's metric `name` in its Prometheus text.
fn metric(c: &StoreClient, name: &str) -> String {
    let text = c.render_metrics();
    let line = text.lines().find(|l| l.split_once(' ').is_some_and(|(n, _)| n == name));
    line.and_then(|l| l.split_once(' ')).map(|(_, v)| v.to_string()).unwrap_or_else(|| panic!("no {name} in:\n{text}"))
}

#[test]
fn a_client_restarted_on_a_full_disk_serves_its_files_skips_offloads_and_writes_again_once_there_is_room() {
    let Some(fs) = small_fs("16M") else { return };
    let m = master();
    let a = client(&m, Some(fs.path()));
    a.put("before", &data(1 << 20, 1)).unwrap();
    assert!(a.flush_offload(Duration::from_secs(60)));
    a.close().unwrap();
    drop(a);
    // Other programs fill the disk while the client is down.
    fs.fill("filler");
    let a = StoreClient::connect(config(&m, Some(fs.path())))
        .unwrap_or_else(|e| panic!("a client did not start on a full disk: {e}"));
    let s = a.disk_stats().unwrap();
    assert!(s.full && s.files == 1, "{s:?}");
    assert_eq!(metric(&a, "crescent_client_disk_full"), "1");
    // Its file is served, here and to another client (it is the object's only copy).
    let f = client(&m, None);
    assert_eq!(tiers(&f, "before"), [Tier::Ssd as i32]);
    assert!(a.get("before").unwrap() == data(1 << 20, 1));
    assert!(f.get("before").unwrap() == data(1 << 20, 1));
    // A put succeeds in memory; its offload is skipped and counted, not tried.
    a.put("while-full", &data(1 << 20, 2)).unwrap();
    assert!(a.flush_offload(Duration::from_secs(60)));
    let s = a.disk_stats().unwrap();
    assert_eq!((s.full, s.full_skipped, s.written, s.write_failures, s.files), (true, 1, 0, 0, 1), "{s:?}");
    assert_eq!(metric(&a, "crescent_client_disk_full_skipped_total"), "1");
    assert!(a.get("while-full").unwrap() == data(1 << 20, 2));
    // Room again: the next offload is written, without a restart.
    std::fs::remove_file(fs.path().join("filler")).unwrap();
    a.put("after", &data(1 << 20, 3)).unwrap();
    assert!(a.flush_offload(Duration::from_secs(60)));
    let s = a.disk_stats().unwrap();
    assert_eq!((s.full, s.written, s.files, s.full_skipped), (false, 1, 2, 1), "{s:?}");
    assert_eq!(metric(&a, "crescent_client_disk_full"), "0");
    fill_memory(&f, "full");
    assert_eq!(tiers(&f, "after"), [Tier::Ssd as i32]);
    assert!(f.get("after").unwrap() == data(1 << 20, 3));
}

#[test]
fn a_disk_that_fills_while_running_turns_full_after_one_refused_write_and_writes_again_once_there_is_room() {
    let Some(fs) = small_fs("8M") else { return };
    let m = master();
    let mut c = config(&m, Some(fs.path()));
    c.disk_writer_threads = 1;
    let a = StoreClient::connect(c).unwrap();
    let put = |k: &str, seed| {
        a.put(k, &data(1 << 20, seed)).unwrap();
        assert!(a.flush_offload(Duration::from_secs(60)));
        a.disk_stats().unwrap()
    };
    let s = put("k0", 0);
    assert_eq!((s.full, s.written), (false, 1), "{s:?}");
    let uring_before = s.uring_writes;
    fs.fill("filler");
    // The first write refused for want of space makes the tier full; later offloads are not tried.
    let s = put("k1", 1);
    assert_eq!((s.full, s.write_failures, s.full_skipped), (true, 1, 0), "{s:?}");
    for i in 2..5 {
        put(&format!("k{i}"), i);
    }
    let s = a.disk_stats().unwrap();
    assert_eq!((s.full, s.write_failures, s.full_skipped, s.files), (true, 1, 3, 1), "{s:?}");
    for i in 0..5u64 {
        assert!(a.get(&format!("k{i}")).unwrap() == data(1 << 20, i), "k{i}");
    }
    std::fs::remove_file(fs.path().join("filler")).unwrap();
    let s = put("k5", 5);
    assert_eq!((s.full, s.written, s.files), (false, 2, 2), "{s:?}");
    // A writer that wrote through io_uring still does: a full disk is not the ring's fault.
    assert!(uring_before == 0 || s.uring_writes > uring_before, "{s:?}");
}

#[test]
fn a_client_starts_full_on_a_full_disk_it_never_used_and_takes_its_capacity_once_there_is_room() {
    let Some(fs) = small_fs("8M") else { return };
    fs.fill("filler");
    let m = master();
    let mut c = config(&m, Some(fs.path()));
    c.storage_capacity = None; // a share of the free space: none now
    let a = StoreClient::connect(c).unwrap_or_else(|e| panic!("a client did not start on a full disk: {e}"));
    let s = a.disk_stats().unwrap();
    assert!(s.full && s.capacity < 1 << 20, "{s:?}");
    a.put("k0", &data(1 << 20, 0)).unwrap();
    assert!(a.flush_offload(Duration::from_secs(60)));
    assert_eq!(a.disk_stats().unwrap().full_skipped, 1);
    std::fs::remove_file(fs.path().join("filler")).unwrap();
    a.put("k1", &data(1 << 20, 1)).unwrap();
    assert!(a.flush_offload(Duration::from_secs(60)));
    let s = a.disk_stats().unwrap();
    assert!(!s.full && s.capacity > 1 << 20 && s.written == 1, "{s:?}");
    assert!(a.disk_dir().unwrap().join("DISK_ID").exists(), "the disk id is saved with the first file");
}

#[test]
fn a_read_only_storage_root_still_fails_the_start_with_a_clear_error() {
    let Some(fs) = small_fs("4M") else { return };
    let m = master();
    client(&m, Some(fs.path())).close().unwrap();
    fs.read_only();
    let e = StoreClient::connect(config(&m, Some(fs.path()))).unwrap_err();
    assert!(matches!(e, StoreError::StorageRoot { .. }) && e.is_caller_error(), "{e:?}");
    let source = std::error::Error::source(&e).and_then(|s| s.downcast_ref::<std::io::Error>());
    assert_eq!(source.and_then(std::io::Error::raw_os_error), Some(rustix::io::Errno::ROFS.raw_os_error()), "{e}");
    assert!(e.to_string().contains("not writable"), "{e}");
}
