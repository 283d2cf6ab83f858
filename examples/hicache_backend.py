"""A storage backend for SGLang's hierarchical KV cache (HiCache) on top of Crescent's store.

It has the shape of SGLang's ``HiCacheStorage`` interface -- ``get``, ``batch_get``, ``set``,
``batch_set``, ``exists``, ``batch_exists`` -- so an SGLang deployment can plug it in where it
would use the Mooncake backend. It has no SGLang or torch dependency: values are bytes-like
objects, and the zero-copy path takes host memory as int addresses or buffer objects (a torch
tensor's ``data_ptr()`` works as an address).

    store = crescent.MooncakeDistributedStore()
    store.setup("10.0.0.1", "P2PHANDSHAKE", 4 << 30, 256 << 20, "tcp", "", "10.0.0.5:50051")
    backend = CrescentHiCacheStorage(store, host_pool=kv_host_buffer)   # registered once
    backend.batch_set(keys, target_locations=[...], target_sizes=[...])  # zero copy
    hits = backend.batch_exists(prefix_keys)                             # consecutive hits
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

import crescent


class CrescentHiCacheStorage:
    """HiCache storage on a Crescent store client.

    ``store``: a set-up ``crescent.MooncakeDistributedStore``. ``host_pool``: optional host
    memory (buffer object, or ``(address, size)``) registered once for the zero-copy calls --
    ``target_location(s)`` must then lie inside it. ``key_prefix`` keeps deployments (or
    tensor-parallel ranks) that share a store apart.
    """

    def __init__(self, store: crescent.MooncakeDistributedStore, host_pool: Any = None, key_prefix: str = ""):
        self.store = store
        self.key_prefix = key_prefix
        self._pool = host_pool
        if host_pool is not None:
            if isinstance(host_pool, tuple):
                rc = store.register_buffer(*host_pool)
            else:
                rc = store.register_buffer(host_pool)
            if rc != 0:
                raise RuntimeError(f"registering the host pool failed: {rc} {crescent.last_error()}")

    def _key(self, key: str) -> str:
        return self.key_prefix + key

    def close(self) -> None:
        """Unregisters the host pool (the store stays open: it belongs to the caller)."""
        if self._pool is not None:
            pool = self._pool[0] if isinstance(self._pool, tuple) else self._pool
            self.store.unregister_buffer(pool)
            self._pool = None

    # ---- reads ----

    def get(self, key: str, target_location: Any = None, target_sizes: Optional[int] = None) -> Any:
        """The value (bytes), or with ``target_location`` the number of bytes read into it;
        None on a miss or an error."""
        if target_location is None:
            value = self.store.get(self._key(key))
            return value if value else None
        n = self.store.get_into(self._key(key), target_location, target_sizes)
        return n if n >= 0 else None

    def batch_get(
        self, keys: Sequence[str], target_locations: Optional[Sequence[Any]] = None,
        target_sizes: Optional[Sequence[int]] = None,
    ) -> List[Any]:
        """One entry per key as ``get`` gives it; one master round trip."""
        full = [self._key(k) for k in keys]
        if target_locations is None:
            return [v if v else None for v in self.store.get_batch(full)]
        sizes = None if target_sizes is None else list(target_sizes)
        return [n if n >= 0 else None for n in self.store.batch_get_into(full, list(target_locations), sizes)]

    # ---- writes ----

    def set(self, key: str, value: Any = None, target_location: Any = None,
            target_sizes: Optional[int] = None) -> bool:
        """Stores a value (bytes-like) or, zero copy, ``target_sizes`` bytes at
        ``target_location``. A key already present counts as stored (KV blocks of a key never
        change). True on success."""
        if self.store.is_exist(self._key(key)) == 1:
            return True
        if target_location is not None:
            rc = self.store.put_from(self._key(key), target_location, target_sizes)
        elif value is not None:
            rc = self.store.put(self._key(key), value)
        else:
            raise ValueError("set() needs a value or a target_location")
        return rc == 0 or rc == crescent.OBJECT_ALREADY_EXISTS

    def batch_set(self, keys: Sequence[str], values: Optional[Sequence[Any]] = None,
                  target_locations: Optional[Sequence[Any]] = None,
                  target_sizes: Optional[Sequence[int]] = None) -> bool:
        """``set`` for many keys (keys already present are skipped); True if all are stored."""
        keys = list(keys)
        present = self.store.batch_is_exist([self._key(k) for k in keys])
        todo = [i for i, p in enumerate(present) if p != 1]
        if not todo:
            return True
        full = [self._key(keys[i]) for i in todo]
        if target_locations is not None:
            locs = list(target_locations)
            sizes = None if target_sizes is None else [list(target_sizes)[i] for i in todo]
            rcs = self.store.batch_put_from(full, [locs[i] for i in todo], sizes)
            return all(rc in (0, crescent.OBJECT_ALREADY_EXISTS) for rc in rcs)
        if values is None:
            raise ValueError("batch_set() needs values or target_locations")
        vals = list(values)
        ok = True
        # put_batch reports one status; put the values one call, then check what is missing.
        if self.store.put_batch(full, [vals[i] for i in todo]) != 0:
            ok = all(v == 1 for v in self.store.batch_is_exist(full))
        return ok

    # ---- probes ----

    def exists(self, key: str) -> bool:
        return self.store.is_exist(self._key(key)) == 1

    def batch_exists(self, keys: Sequence[str]) -> int:
        """How many keys, from the first, exist without a gap (HiCache loads a prefix)."""
        hits = 0
        for present in self.store.batch_is_exist([self._key(k) for k in keys]):
            if present != 1:
                break
            hits += 1
        return hits
