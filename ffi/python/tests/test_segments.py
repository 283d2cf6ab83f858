"""Segments mounted and unmounted at run time through Mooncake's names: round trips into a
segment mounted after setup, an unmount that takes the sole replica of one object and leaves
another's second replica, upstream's return shapes and codes for bad input."""

import os
import time
import uuid

import numpy as np
import pytest

import crescent
from crescent.store import MooncakeDistributedStore

from conftest import MiB, connect, master_fixture


def key(tag: str) -> str:
    return f"{tag}/{uuid.uuid4().hex}"


def pattern(n: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


# Its own master: the pool holds only the segments these tests mount.
master = master_fixture("--lease-ttl-ms", "2000")


@pytest.fixture()
def pair(master):
    a, b = connect(master, segment=0), connect(master, segment=0)
    yield a, b
    a.close()
    b.close()


def test_a_value_put_into_a_mounted_segment_is_gone_with_it_while_a_replicated_one_stays(pair):
    a, b = pair
    got = a.allocate_and_mount_segment(5 * MiB)
    assert got["ret"] == 0, crescent.last_error()
    assert got["allocated_size"] == 8 * MiB
    assert len(got["segment_ids"]) == 1
    seg_a = got["segment_ids"][0]

    only, v_only = key("only"), pattern(3 * MiB, 1)
    assert b.put(only, v_only) == 0
    assert b.get(only) == v_only
    assert a.get(only) == v_only
    assert [d.is_memory_replica() for d in b.get_replica_desc(only)] == [True]

    got_b = b.allocate_and_mount_segment(4 * MiB, "tcp", "cpu:0")
    assert got_b["ret"] == 0, crescent.last_error()
    both, v_both = key("both"), pattern(MiB, 2)
    cfg = crescent.ReplicateConfig()
    cfg.replica_num = 2
    assert a.put(both, v_both, cfg) == 0
    assert len(b.get_replica_desc(both)) == 2

    assert a.unmount_and_free_segment([seg_a]) == 0
    assert b.is_exist(only) == 0
    assert b.get_size(only) == crescent.OBJECT_NOT_FOUND
    assert b.get(both) == v_both
    assert len(b.get_replica_desc(both)) == 1
    assert b.unmount_and_free_segment(got_b["segment_ids"], 0) == 0


def test_a_file_mounted_as_a_segment(pair, tmp_path):
    a, b = pair
    path = tmp_path / "segment"
    path.write_bytes(bytes(8 * MiB))
    got = a.mount_segment(str(path), 4 * MiB, 4 * MiB, "tcp", "")
    assert got["ret"] == 0, crescent.last_error()
    k, v = key("file"), pattern(2 * MiB, 3)
    assert b.put(k, v) == 0
    assert a.get(k) == v
    assert v in path.read_bytes()
    assert a.unmount_segment(got["segment_ids"], grace_period_seconds=0) == 0
    assert b.is_exist(k) == 0


def test_bad_input_gets_upstreams_codes(master, pair, tmp_path):
    a, b = pair
    # Zero sizes: allocation refuses, a file mount of 0 bytes mounts nothing (upstream's answer).
    assert a.allocate_and_mount_segment(0) == {"ret": -1, "segment_ids": [], "allocated_size": 0}
    path = tmp_path / "small"
    path.write_bytes(bytes(MiB))
    assert a.mount_segment(str(path), 0) == {"ret": 0, "segment_ids": []}
    # Beyond the file, an offset off the page size, no such file.
    assert a.mount_segment(str(path), 2 * MiB)["ret"] == -1
    assert a.mount_segment(str(path), 4096, 100)["ret"] == -1
    assert a.mount_segment(str(tmp_path / "absent"), MiB) == {"ret": -1, "segment_ids": []}
    # Unknown ids, another client's id, the other method's id, a double unmount.
    assert a.unmount_segment(["no-such-segment"]) == -1
    assert a.unmount_and_free_segment(["no-such-segment"], 0) == -1
    seg = a.allocate_and_mount_segment(4 * MiB)["segment_ids"]
    assert b.unmount_and_free_segment(seg) == -1
    assert a.unmount_segment(seg) == -1
    assert a.unmount_and_free_segment(seg) == 0
    assert a.unmount_and_free_segment(seg) == -1
    # No disk tier: upstream answers 0.
    assert a.unmount_local_disk_segment() == 0
    assert a.unmount_local_disk_segment(grace_period_seconds=0) == 0
    # Before setup: -1, and the dict shapes.
    s = MooncakeDistributedStore()
    assert s.allocate_and_mount_segment(MiB) == {"ret": -1, "segment_ids": [], "allocated_size": 0}
    assert s.mount_segment(str(path), MiB) == {"ret": -1, "segment_ids": []}
    assert s.unmount_segment(["x"]) == -1
    assert s.unmount_and_free_segment(["x"]) == -1
    assert s.unmount_local_disk_segment() == -1


def test_unmount_local_disk_segment_drops_the_disk_copies(master, tmp_path):
    os.environ["MOONCAKE_STORAGE_ROOT_DIR"] = str(tmp_path)
    try:
        a = connect(master, segment=16 * MiB)
    finally:
        del os.environ["MOONCAKE_STORAGE_ROOT_DIR"]
    b = connect(master, segment=0)
    try:
        k, v = key("disk"), pattern(MiB, 4)
        assert a.put(k, v) == 0
        on_disk = lambda: [d for d in b.get_replica_desc(k) if d.is_local_disk_replica()]
        deadline = time.monotonic() + 20
        while not on_disk():
            assert time.monotonic() < deadline, "the value never reached the disk tier"
            time.sleep(0.05)
        assert a.unmount_local_disk_segment(0) == 0
        # The disk's copy is no longer listed; the memory replica stays.
        assert on_disk() == []
        assert len(b.get_replica_desc(k)) == 1
        assert b.get(k) == v
        assert a.unmount_local_disk_segment(0) == 0
    finally:
        a.close()
        b.close()
