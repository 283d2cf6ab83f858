"""Leases of registered scratch memory for the zero-copy calls: Mooncake's ``BufferPool``.

``BufferPool(store)`` hands out leases of the store client's local buffer (the one ``setup``
registers, ``local_buffer_size`` bytes, shared with the store's own byte calls), so that a
caller that needs a destination for ``get_into`` or a source for ``put_from`` now and then does
not register and unregister memory each time. When the local buffer has no room, a lease gets
memory of its own, registered for the lease's life and unregistered when it is released
("overflow"). ``max_bytes`` bounds local and overflow leases together (default: twice the local
buffer), ``max_regions`` the number of leases held at once.

A lease: ``ptr`` (the address for the zero-copy calls), ``size`` (the size asked for),
``buffer`` (a ``memoryview`` of ``size`` bytes), ``release()`` (also on leaving a ``with``
block, and when the lease is collected). ``release()`` refuses while a ``memoryview`` of the
lease is alive; ``close()`` refuses while a lease is held.

Errors are ``RuntimeError`` with Mooncake's messages: an exhausted pool with ``block=False``,
a wait past its ``timeout``, a size past ``max_bytes``, a closed pool.
"""

from __future__ import annotations

import ctypes
import mmap
import sys
import threading
import time
from typing import Any

__all__ = [
    "BufferLease",
    "BufferLeaseView",
    "BufferPool",
    "RegisteredBufferLease",
    "RegisteredBufferLeaseView",
    "RegisteredBufferPool",
]


class _Overflow:
    """Memory of a lease's own (the local buffer had no room): an anonymous mapping, aligned
    as the pool asks, registered with the store until it is freed."""

    def __init__(self, store: Any, size: int, alignment: int):
        self.store = store
        self.map = mmap.mmap(-1, size + alignment)
        # The mapping's address; the ctypes object is an export of the mapping, dropped at free.
        self._anchor = ctypes.c_char.from_buffer(self.map)
        base = ctypes.addressof(self._anchor)
        self.offset = (-base) % alignment
        self.ptr = base + self.offset
        self.size = size
        self.registered = False
        rc = store.register_buffer(self.ptr, size)
        if rc != 0:
            self.free()
            raise RuntimeError("overflow buffer registration failed")
        self.registered = True

    def view(self) -> memoryview:
        return memoryview(self.map)[self.offset:self.offset + self.size]

    def free(self) -> None:
        if self.registered:
            self.registered = False
            if self.store.unregister_buffer(self.ptr) != 0:
                raise RuntimeError("overflow buffer unregistration failed")
        self._anchor = None
        try:
            self.map.close()
        except BufferError:
            pass  # a view of it is still alive: the mapping goes with the last one


class _Region:
    """What one lease holds: a block of the local buffer (a ``BufferHandle``) or an overflow."""

    __slots__ = ("handle", "overflow", "ptr", "size")

    def __init__(self, handle: Any, overflow: _Overflow | None, size: int):
        self.handle = handle
        self.overflow = overflow
        self.ptr = overflow.ptr if overflow is not None else handle.ptr()
        self.size = size

    def backing(self) -> Any:
        """The object every view of this region keeps alive (so counts the views)."""
        return self.overflow.map if self.overflow is not None else self.handle

    def view(self, n: int) -> memoryview:
        if self.overflow is not None:
            return self.overflow.view()[:n]
        return memoryview(self.handle)[:n]


class BufferLeaseView:
    """A ``memoryview`` of a lease (Mooncake's ``BufferLeaseView``: ``.buffer``)."""

    def __init__(self, view: memoryview):
        self.buffer = view


class BufferLease:
    """One lease of a :class:`BufferPool`; see the module's documentation."""

    def __init__(self, pool: BufferPool, region: _Region, size: int):
        self._pool: BufferPool | None = pool
        self._region: _Region | None = region
        self._size = size
        # References to the region's backing object that are not views' (this lease's, and
        # getrefcount's argument): any more are views alive.
        self._base_refs = sys.getrefcount(region.backing())

    @property
    def ptr(self) -> int:
        if self._region is None:
            raise RuntimeError("buffer lease is closed")
        return self._region.ptr

    @property
    def size(self) -> int:
        return self._size

    @property
    def buffer(self) -> memoryview:
        if self._region is None:
            raise RuntimeError("buffer lease is closed")
        return self._region.view(self._size)

    def _exported(self) -> bool:
        region = self._region
        return region is not None and sys.getrefcount(region.backing()) > self._base_refs

    def release(self) -> None:
        """Gives the memory back to the pool; refused while a view of it is alive."""
        if self._region is None:
            return
        if self._exported():
            raise RuntimeError("cannot release buffer while exported views exist")
        self._release()

    def _release(self) -> None:
        region, pool = self._region, self._pool
        self._region = None
        self._pool = None
        if region is not None and pool is not None:
            pool._release(region)

    def __enter__(self) -> BufferLease:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __del__(self) -> None:
        try:
            self._release()
        except Exception:  # noqa: BLE001 (nothing to tell at collection)
            pass


class BufferPool:
    """Leases of the store's local buffer, with registered overflow; see the module's
    documentation. Arguments and defaults as Mooncake's."""

    def __init__(self, store: Any, max_bytes: int = 0, min_size_class: int = 64 * 1024,
                 max_size_class: int | None = None, alignment: int = 8 * 1024 * 1024,
                 block_on_exhaustion: bool = True, default_timeout: float | None = None,
                 max_regions: int | None = None, prewarm_size: int | None = None, prewarm_count: int = 0):
        if store is None:
            raise RuntimeError("MooncakeDistributedStore is not initialized")
        if not hasattr(store, "_hold_local_buffer") and hasattr(store, "_get_pyclient_capsule"):
            store = store._get_pyclient_capsule()  # a wrapper of a store, as Mooncake unwraps it
        if not hasattr(store, "_hold_local_buffer"):
            raise RuntimeError("BufferPool store parameter must be a PyClient or store wrapper that implements "
                               "_get_pyclient_capsule()")
        if min_size_class <= 0 or alignment <= 0:
            raise RuntimeError("min_size_class and alignment must be positive")
        if alignment < ctypes.sizeof(ctypes.c_void_p) or alignment & (alignment - 1):
            raise RuntimeError("alignment must be a power of two and at least sizeof(void*)")
        local = store._local_buffer_size()
        if local == 0:
            raise RuntimeError("BufferPool requires a store configured with a local buffer")
        self._store = store
        self._local = local
        self._max_bytes = 2 * local if max_bytes == 0 else max(max_bytes, local)
        self._max_size_class = self._max_bytes if max_size_class is None else int(max_size_class)
        self._alignment = alignment
        self._block = bool(block_on_exhaustion)
        self._timeout = None if default_timeout is None else float(default_timeout)
        self._max_regions = None if max_regions is None else int(max_regions)
        self._cond = threading.Condition()
        self._in_use: dict[int, _Region] = {}
        self._total = 0
        self._reserved = 0
        self._reserved_regions = 0
        self._closed = False
        self._closing = False
        if prewarm_size is not None and prewarm_count > 0:
            self.prewarm(prewarm_size, prewarm_count)

    def acquire(self, size: int, block: bool | None = None, timeout: float | None = None) -> BufferLease:
        """A lease of ``size`` bytes. Waits while the pool is exhausted (``block``, default the
        pool's ``block_on_exhaustion``) until ``timeout`` seconds (default the pool's
        ``default_timeout``; None waits as long as it takes)."""
        size = int(size)
        if size < 0:
            raise RuntimeError("size must be non-negative")
        should_block = self._block if block is None else bool(block)
        wait = self._timeout if timeout is None else float(timeout)
        if wait is not None and wait < 0:
            raise RuntimeError("timeout must be non-negative")
        deadline = None if wait is None else time.monotonic() + wait
        if max(size, 1) > self._max_bytes:
            raise RuntimeError("requested buffer size exceeds pool capacity")
        with self._cond:
            while True:
                self._raise_if_not_open()
                region = self._try_acquire(size)
                if region is not None:
                    self._in_use[region.ptr] = region
                    return BufferLease(self, region, size)
                if not should_block:
                    raise RuntimeError("buffer pool is exhausted")
                if deadline is None:
                    self._cond.wait()
                else:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise RuntimeError("timed out waiting for buffer")
                    self._cond.wait(left)

    def buffer(self, size: int, block: bool | None = None, timeout: float | None = None) -> BufferLease:
        """The same as :meth:`acquire` (for ``with pool.buffer(n) as lease``)."""
        return self.acquire(size, block, timeout)

    def prewarm(self, size: int, count: int) -> None:
        """Nothing to do: leases come from memory registered already (as in Mooncake)."""

    def close(self) -> None:
        """Closes the pool once the allocations under way ended; refused while a lease is held."""
        with self._cond:
            if self._closed:
                return
            self._closing = True
            while self._reserved_regions:
                self._cond.wait()
            if self._in_use:
                self._closing = False
                self._cond.notify_all()
                raise RuntimeError("cannot close buffer pool with active leases")
            self._closed = True
            self._closing = False
            self._cond.notify_all()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 (leases still held: they give their memory back themselves)
            pass

    # ---- under self._cond ----

    def _raise_if_not_open(self) -> None:
        if self._closed:
            raise RuntimeError("buffer pool is closed")
        if self._closing:
            raise RuntimeError("buffer pool is closing")

    def _has_room(self, n: int) -> bool:
        if n > self._max_bytes - self._total - self._reserved:
            return False
        return self._max_regions is None or len(self._in_use) + self._reserved_regions < self._max_regions

    def _try_acquire(self, size: int) -> _Region | None:
        """A region of ``size`` bytes if the pool has room for it (the allocation runs with
        the lock let go: an overflow's registration takes a while)."""
        n = max(size, 1)
        if not self._has_room(n):
            return None
        self._reserved += n
        self._reserved_regions += 1
        self._cond.release()
        try:
            handle = self._store._hold_local_buffer(n) if n <= self._local else None
            overflow = None if handle is not None else _Overflow(self._store, n, self._alignment)
        finally:
            self._cond.acquire()
            self._reserved -= n
            self._reserved_regions -= 1
            self._cond.notify_all()
        region = _Region(handle, overflow, n)
        if self._closing or self._closed:
            self._free(region)
            raise RuntimeError("buffer pool is closing")
        self._total += n
        return region

    @staticmethod
    def _free(region: _Region) -> None:
        if region.overflow is not None:
            region.overflow.free()
        region.handle = None

    # ---- from a lease ----

    def _release(self, region: _Region) -> None:
        with self._cond:
            if self._in_use.pop(region.ptr, None) is None:
                raise RuntimeError("buffer lease is not active")
            self._total -= region.size
            self._cond.notify_all()
        self._free(region)


RegisteredBufferPool = BufferPool
RegisteredBufferLease = BufferLease
RegisteredBufferLeaseView = BufferLeaseView
