"""Embedding tables in the store, looked up by row: Mooncake's ``EngramStore``.

One layer's tables (``EngramStoreConfig``: a row count per head, ``table_vocab_sizes``, and a
row width, ``embedding_dim``) are stored one key per head, ``engram:l<layer_id>:h<head>``,
each a float32 ``[N_h, D]`` table, written once by ``populate`` (one ``batch_put_from``) and
read by ``lookup(row_ids)``: for row ids of shape ``[B, L, H]`` (a numpy array or nested
lists), the rows ``[B, L, H, D]``, read with one ``get_into_ranges`` straight into the result.
The caller computes the row ids; nothing here hashes or tokenizes. numpy is needed for
``populate`` and ``lookup`` (as in Mooncake), not to import this module.

Failures raise as Mooncake's do: ``ValueError`` for a bad configuration, ``RuntimeError``
for a failed populate (nothing of it is left stored), lookup (a row id out of its table's
range included) or removal.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Sequence
from typing import Any

__all__ = ["EngramStore", "EngramStoreConfig"]

log = logging.getLogger("crescent.store")

_OBJECT_NOT_FOUND = -704
_INVALID_PARAMS = -600
_FLOAT32 = 4


class EngramStoreConfig:
    """The physical layout of one layer's tables: rows per head and the row width."""

    def __init__(self) -> None:
        self.table_vocab_sizes: list[int] = [1024]
        self.embedding_dim: int = 64

    def __repr__(self) -> str:
        return f"EngramStoreConfig(table_vocab_sizes={self.table_vocab_sizes!r}, embedding_dim={self.embedding_dim!r})"


def _numpy() -> Any:
    try:
        import numpy
    except ImportError as e:  # pragma: no cover - numpy is there wherever tables are
        raise RuntimeError("EngramStore needs numpy") from e
    return numpy


def _contiguous(np: Any, value: Any, dtype: Any, error: str) -> Any:
    """``value`` as a C-contiguous array of ``dtype``; ``RuntimeError(error)`` when it does not
    convert."""
    try:
        return np.ascontiguousarray(value, dtype=dtype)
    except (TypeError, ValueError) as e:
        raise RuntimeError(error) from e


class EngramStore:
    """One layer's embedding tables in the store; see the module's documentation. ``store``:
    a set-up ``MooncakeDistributedStore``, or None for the layout alone (populate, lookup and
    removal then fail)."""

    def __init__(self, layer_id: int, config: EngramStoreConfig, store: Any = None):
        sizes = [int(n) for n in config.table_vocab_sizes]
        dim = int(config.embedding_dim)
        if not sizes:
            raise ValueError("EngramStoreConfig.table_vocab_sizes must not be empty")
        if dim <= 0:
            raise ValueError("EngramStoreConfig.embedding_dim must be positive")
        if any(n <= 0 for n in sizes):
            raise ValueError("EngramStoreConfig.table_vocab_sizes must contain only positive values")
        if store is not None and not hasattr(store, "get_into_ranges") and hasattr(store, "_get_pyclient_capsule"):
            store = store._get_pyclient_capsule()  # a wrapper of a store, as Mooncake unwraps it
        if store is not None and not hasattr(store, "get_into_ranges"):
            raise RuntimeError("EngramStore store parameter must be a PyClient or store wrapper that implements "
                               "_get_pyclient_capsule()")
        self._store = store
        self._sizes = sizes
        self._dim = dim
        self._keys = [f"engram:l{layer_id}:h{h}" for h in range(len(sizes))]

    def get_table_vocab_sizes(self) -> list[int]:
        return list(self._sizes)

    def get_store_keys(self) -> list[str]:
        return list(self._keys)

    def get_num_heads(self) -> int:
        return len(self._sizes)

    def get_embedding_dim(self) -> int:
        return self._dim

    # ---- writing and removing ----

    def populate(self, embedding_buffers: Sequence[Any]) -> None:
        """Stores one float32 table ``[N_h, D]`` per head (other float arrays are converted).
        Refused when a key of the layer exists already: remove the layer first."""
        np = _numpy()
        buffers = list(embedding_buffers)
        if len(buffers) != len(self._keys):
            raise RuntimeError("embedding_buffers size must match num_heads")
        tables = []
        for buf, rows in zip(buffers, self._sizes):
            if not isinstance(buf, np.ndarray):
                raise RuntimeError("embedding_buffers must be NumPy arrays")
            table = _contiguous(np, buf, np.float32, "embedding_buffers must be float32 arrays")
            if table.ndim != 2:
                raise RuntimeError("each embedding buffer must be 2D [N_h, D]")
            if table.shape != (rows, self._dim):
                raise RuntimeError("embedding buffer shape does not match get_table_vocab_sizes()/get_embedding_dim()")
            tables.append(table)
        if self._populate(tables) != 0:
            raise RuntimeError("populate failed")

    def _populate(self, tables: list[Any]) -> int:
        store = self._store
        if store is None:
            return -1
        exists = store.batch_is_exist(self._keys)
        if len(exists) != len(self._keys):
            log.error("EngramStore populate: the existence check answered %d of %d keys", len(exists), len(self._keys))
            return -1
        for key, e in zip(self._keys, exists):
            if e < 0:
                log.error("EngramStore populate: checking %r failed, rc=%d", key, e)
                return -1
            if e != 0:
                log.error("EngramStore populate needs %r empty: remove the existing layer first", key)
                return -1
        ptrs = [t.ctypes.data for t in tables]
        sizes = [t.nbytes for t in tables]
        registered = []
        ok = True
        for ptr, size in zip(ptrs, sizes):
            if store.register_buffer(ptr, size) != 0:
                ok = False
                break
            registered.append(ptr)
        results: list[int] = []
        if ok:
            results = list(store.batch_put_from(self._keys, ptrs, sizes))
            ok = len(results) == len(self._keys) and all(r == 0 for r in results)
        for ptr in registered:
            if store.unregister_buffer(ptr) != 0:
                log.error("EngramStore populate: unregistering a table at %#x failed", ptr)
                ok = False
        if ok:
            return 0
        # Nothing of a failed populate stays readable.
        complete = len(results) == len(self._keys)
        for i, key in enumerate(self._keys):
            if complete and results[i] != 0:
                continue
            rc = store.remove(key, True)
            if rc not in (0, _OBJECT_NOT_FOUND):
                log.error("EngramStore populate: rolling back %r failed, rc=%d", key, rc)
        return -1

    def remove_from_store(self, force: bool = False) -> int:
        """Removes the layer's tables; returns how many there were (missing ones are skipped)."""
        if self._store is None:
            raise RuntimeError(f"remove_from_store failed, rc={_INVALID_PARAMS}")
        removed = 0
        first_error = 0
        for key in self._keys:
            rc = self._store.remove(key, force)
            if rc == 0:
                removed += 1
            elif rc != _OBJECT_NOT_FOUND and first_error == 0:
                first_error = rc
        if first_error:
            raise RuntimeError(f"remove_from_store failed, rc={first_error}")
        return removed

    # ---- reading ----

    def lookup(self, row_ids: Any) -> Any:
        """The rows ``row_ids`` ``[B, L, H]`` name, as a float32 array ``[B, L, H, D]``."""
        np = _numpy()
        heads = len(self._sizes)
        if isinstance(row_ids, np.ndarray):
            ids = _contiguous(np, row_ids, np.int64, "row_ids array must be convertible to int64")
            if ids.ndim != 3:
                raise RuntimeError("row_ids array must have shape [B, L, H]")
            if ids.shape[2] != heads:
                raise RuntimeError("row_ids last dimension must match num_heads")
        else:
            nested = [[[operator.index(i) for i in token] for token in batch] for batch in row_ids]
            if not nested or not nested[0]:
                raise RuntimeError("row_ids must not be empty")
            length = len(nested[0])
            if any(len(b) != length for b in nested) or any(len(t) != heads for b in nested for t in b):
                raise RuntimeError("EngramStore lookup failed")
            ids = np.array(nested, dtype=np.int64).reshape(len(nested), length, heads)
        out = np.zeros((ids.shape[0], ids.shape[1], heads, self._dim), dtype=np.float32)
        if self._lookup(np, ids, out) != 0:
            out[...] = 0
            raise RuntimeError("EngramStore lookup failed")
        return out

    def _lookup(self, np: Any, ids: Any, out: Any) -> int:
        store = self._store
        batch, length, heads = ids.shape
        if store is None or batch <= 0 or length <= 0:
            return -1
        vocab = np.array(self._sizes, dtype=np.int64)
        if ((ids < 0) | (ids >= vocab)).any():
            log.error("EngramStore lookup: a row id is out of its table's range")
            return -1
        row = self._dim * _FLOAT32
        tokens = batch * length
        flat = ids.reshape(tokens, heads)
        slots = np.arange(tokens, dtype=np.int64) * heads
        dst = [((slots + h) * row).tolist() for h in range(heads)]
        src = [(flat[:, h] * row).tolist() for h in range(heads)]
        lens = [[row] * tokens for _ in range(heads)]
        ptr, size = out.ctypes.data, out.nbytes
        if store.register_buffer(ptr, size) != 0:
            return -1
        try:
            results = store.get_into_ranges([ptr], [self._keys], [dst], [src], [lens])
        except BaseException:
            store.unregister_buffer(ptr)
            raise
        if store.unregister_buffer(ptr) != 0:
            return -1
        if len(results) != 1 or len(results[0]) != heads:
            return -1
        if any(len(r) != tokens or any(n != row for n in r) for r in results[0]):
            return -1
        return 0
