"""ReplicateConfig, Mooncake's per-put placement: replica count, preferred segments and pins,
through every put call, against a master and clients of each test's own (segments leave)."""

import uuid

import numpy as np
import pytest

import crescent
from crescent.store import MooncakeDistributedStore, ReplicateConfig

from conftest import MiB, Master, connect


def key(tag: str) -> str:
    return f"{tag}/{uuid.uuid4().hex}"


@pytest.fixture
def cluster():
    # local-first: without a preference, a client's puts stay in its own segment.
    m = Master("--allocation-strategy", "local-first")
    a, b = connect(m, segment=16 * MiB), connect(m, segment=16 * MiB)
    yield m, a, b
    for s in (a, b):
        s.close()
    m.stop()


def test_defaults_and_attributes_are_mooncakes():
    assert crescent.ReplicateConfig is ReplicateConfig
    c = ReplicateConfig()
    assert (c.replica_num, c.with_soft_pin, c.with_hard_pin, c.preferred_segment, c.preferred_segments) == (
        1, False, False, "", [])
    c.replica_num, c.with_soft_pin, c.with_hard_pin = 2, True, True
    c.preferred_segment, c.preferred_segments = "h:1", ["h:2", "h:3"]
    assert (c.replica_num, c.with_soft_pin, c.with_hard_pin, c.preferred_segment, c.preferred_segments) == (
        2, True, True, "h:1", ["h:2", "h:3"])
    assert "replica_num=2" in repr(c) and "h:2" in repr(c)
    with pytest.raises(TypeError):
        c.replica_num = "two"
    with pytest.raises(OverflowError):
        c.replica_num = -1


def on_b(b: MooncakeDistributedStore) -> ReplicateConfig:
    c = ReplicateConfig()
    c.preferred_segment = b.get_hostname()
    return c


def test_preferred_segment_places_every_kind_of_put_there(cluster):
    _, a, b = cluster
    value = np.arange(MiB, dtype=np.uint8)
    assert a.register_buffer(value) == 0
    keys = {
        "put": key("put"), "put_batch": key("put_batch"), "put_from": key("put_from"),
        "batch_put_from": key("batch_put_from"), "default": key("default"),
    }
    assert a.put(keys["put"], value, on_b(b)) == 0
    assert a.put_batch([keys["put_batch"]], [value], on_b(b)) == 0
    assert a.put_from(keys["put_from"], value, value.nbytes, on_b(b)) == 0
    assert a.batch_put_from([keys["batch_put_from"]], [value], [value.nbytes], config=on_b(b)) == [0]
    assert a.put(keys["default"], value) == 0
    for k in keys.values():
        assert a.get(k) == value.tobytes(), k
    # b leaves with its segment: what was placed there goes with it, a's own put stays.
    assert b.close() == 0
    for name, k in keys.items():
        assert a.is_exist(k) == (1 if name == "default" else 0), name
    assert a.unregister_buffer(value) == 0


def test_two_replicas_outlive_one_segment(cluster):
    _, a, b = cluster
    one, two = key("one"), key("two")
    c = on_b(b)
    assert a.put(one, b"x" * 4096, c) == 0
    c.replica_num = 2
    assert a.put(two, b"y" * 4096, c) == 0
    assert b.close() == 0
    assert a.is_exist(one) == 0
    assert a.get(two) == b"y" * 4096


def test_more_replicas_than_segments_or_none_fail_clearly(cluster):
    _, a, _ = cluster
    c = ReplicateConfig()
    c.replica_num = 3
    k = key("three")
    assert a.put(k, b"v", c) < 0
    assert a.is_exist(k) == 0
    c.replica_num = 0
    assert a.put(k, b"v", c) == crescent.INVALID_PARAMS
    assert "replica_num" in crescent.last_error()
    assert a.batch_put_from([k], [np.zeros(16, dtype=np.uint8)], config=c) == [crescent.INVALID_PARAMS]
    assert a.is_exist(k) == 0


@pytest.mark.parametrize("pin", ["with_hard_pin", "with_soft_pin"])
def test_pinned_objects_are_not_evicted(pin):
    m = Master("--allocation-strategy", "local-first")
    s = connect(m, segment=16 * MiB)
    try:
        c = ReplicateConfig()
        setattr(c, pin, True)
        pinned, plain = key("pinned"), key("plain")
        assert s.put(pinned, b"p" * MiB, c) == 0
        assert s.put(plain, b"q" * MiB) == 0
        # Three segments' worth of puts: the master must evict to place them.
        for i in range(48):
            assert s.put(key(f"fill{i}"), b"f" * MiB) == 0, crescent.last_error()
        assert s.is_exist(plain) == 0, "the fill evicted nothing: the test shows nothing"
        assert s.get(pinned) == b"p" * MiB
    finally:
        s.close()
        m.stop()
