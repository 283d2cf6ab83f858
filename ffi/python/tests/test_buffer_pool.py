"""Mooncake's ``BufferPool``: leases of the store's local buffer for the zero-copy calls, with
registered overflow when the local buffer is full, bounded by ``max_bytes`` and
``max_regions``; Mooncake's refusals (a live view at release, a held lease at close, an
exhausted pool without blocking, a wait past its timeout, bad arguments)."""

import threading
import time
import uuid

import pytest

import crescent
from crescent.store import BufferPool, RegisteredBufferPool

from conftest import MiB, connect, pattern


def key(tag: str) -> str:
    return f"pool/{tag}/{uuid.uuid4().hex}"


@pytest.fixture(scope="module")
def small(master):
    """A client whose local buffer is 1 MiB: a pool over it overflows soon."""
    s = connect(master, buffer=1 * MiB)
    yield s
    s.close()


def test_a_lease_is_registered_memory_for_get_into_and_put_from(store_a, store_b):
    value = pattern(300_000, 1).tobytes()
    k = key("into")
    assert store_a.put(k, value) == 0
    pool = BufferPool(store_b)
    with pool.buffer(len(value)) as lease:
        assert lease.size == len(value)
        assert store_b.get_into(k, lease.ptr, lease.size) == len(value)
        view = lease.buffer
        assert len(view) == len(value) and bytes(view) == value
        # And back out of the lease, as a put's source.
        view[:5] = b"hello"
        del view
        k2 = key("from")
        assert store_b.put_from(k2, lease.ptr, lease.size) == 0
    assert store_a.get(k2) == b"hello" + value[5:]
    pool.close()


def test_a_full_local_buffer_gives_a_registered_overflow_that_goes_at_release(small, store_a):
    value = pattern(MiB, 2).tobytes()
    k = key("overflow")
    assert store_a.put(k, value) == 0
    pool = BufferPool(small)  # max_bytes: twice the local buffer
    first = pool.acquire(MiB)
    second = pool.acquire(MiB)  # the local buffer is taken: memory of its own
    assert first.ptr != second.ptr
    for lease in (first, second):
        assert small.get_into(k, lease.ptr, lease.size) == MiB
        assert bytes(lease.buffer) == value
    overflow = second.ptr
    second.release()
    # Released: no longer registered (unregistering it again fails).
    assert small.unregister_buffer(overflow) != 0
    first.release()
    # The local buffer is whole again: a lease of all of it comes from there, as does a byte get.
    again = pool.acquire(MiB)
    again.release()
    assert small.get(k) == value
    pool.close()


def test_an_exhausted_pool_refuses_without_blocking_times_out_and_wakes_a_waiter(small):
    pool = BufferPool(small, max_bytes=2 * MiB)
    held = [pool.acquire(MiB), pool.acquire(MiB)]
    with pytest.raises(RuntimeError, match="exhausted"):
        pool.acquire(1, block=False)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="timed out waiting for buffer"):
        pool.acquire(1, timeout=0.2)
    assert time.monotonic() - start >= 0.2
    got = []
    waiter = threading.Thread(target=lambda: got.append(pool.acquire(4096, timeout=30)))
    waiter.start()
    time.sleep(0.2)
    assert not got, "the waiter waits while the pool is exhausted"
    held.pop().release()
    waiter.join(30)
    assert got and got[0].size == 4096
    got[0].release()
    held.pop().release()
    pool.close()


def test_max_regions_bounds_the_leases_held_at_once(store_b):
    pool = BufferPool(store_b, max_regions=1, block_on_exhaustion=False)
    lease = pool.acquire(4096)
    with pytest.raises(RuntimeError, match="exhausted"):
        pool.acquire(4096)
    lease.release()
    pool.acquire(4096).release()
    pool.close()


def test_release_refuses_while_a_view_lives_and_close_while_a_lease_is_held(store_b):
    pool = BufferPool(store_b)
    lease = pool.acquire(1000)
    view = lease.buffer[:10]
    with pytest.raises(RuntimeError, match="exported views exist"):
        lease.release()
    with pytest.raises(RuntimeError, match="active leases"):
        pool.close()
    del view
    lease.release()
    lease.release()  # a second release does nothing
    with pytest.raises(RuntimeError, match="closed"):
        lease.ptr
    pool.close()
    with pytest.raises(RuntimeError, match="closed"):
        pool.acquire(10)


def test_a_lease_dropped_without_release_gives_its_memory_back(small):
    pool = BufferPool(small, max_bytes=MiB, block_on_exhaustion=False)
    lease = pool.acquire(MiB)
    del lease
    pool.acquire(MiB).release()
    pool.close()


def test_bad_arguments_are_refused_as_mooncake_refuses_them(master, store_b):
    with pytest.raises(RuntimeError, match="not initialized"):
        BufferPool(None)
    with pytest.raises(RuntimeError, match="power of two"):
        BufferPool(store_b, alignment=3 * 4096)
    with pytest.raises(RuntimeError, match="positive"):
        BufferPool(store_b, min_size_class=0)
    pool = BufferPool(store_b, max_bytes=1)  # raised to the local buffer's size
    with pytest.raises(RuntimeError, match="exceeds pool capacity"):
        pool.acquire(16 * MiB + 1)
    with pytest.raises(RuntimeError, match="non-negative"):
        pool.acquire(10, timeout=-1)
    pool.close()
    assert crescent.store.RegisteredBufferPool is RegisteredBufferPool is BufferPool
    consumer = connect(master, segment=0, buffer=0)
    try:
        with pytest.raises(RuntimeError, match="local buffer"):
            BufferPool(consumer)
    finally:
        consumer.close()
    with pytest.raises(RuntimeError, match="local buffer"):
        BufferPool(crescent.MooncakeDistributedStore())  # not set up


def test_leases_are_registered_memory_for_the_batch_calls(store_a, store_b):
    values = [pattern(50_000 + i, 10 + i).tobytes() for i in range(4)]
    keys = [key(f"batch{i}") for i in range(4)]
    pool = BufferPool(store_b)
    leases = [pool.acquire(len(v)) for v in values]
    for lease, v in zip(leases, values):
        lease.buffer[:] = v
    assert store_b.batch_put_from(keys, [l.ptr for l in leases], [l.size for l in leases]) == [0] * 4
    for lease in leases:
        lease.buffer[:] = b"\0" * lease.size
    assert store_b.batch_get_into(keys, [l.ptr for l in leases], [l.size for l in leases]) == [len(v) for v in values]
    assert [bytes(l.buffer) for l in leases] == values
    for lease in leases:
        lease.release()
    pool.close()
