"""Mooncake's sharded tensor methods: the ``*_tensor_with_tp*`` wrappers, the unified
``*_tensor_with_parallelism*`` family with ``ParallelAxis`` / ``TensorParallelism`` /
``ReadTarget``, and ``save_tensor_to_safetensor`` / ``load_tensor_from_safetensor``.

One logical tensor is kept as one object per shard, each in Mooncake's tensor layout with a
shard header (``layout_kind`` SHARD, the global and local shapes and the layout axes), under
Mooncake's key names:

- ``<key>_tp_<rank>``: a TP shard of a single-TP-axis layout (``put_tensor_with_tp`` writes
  all of them from a full tensor; ``put_tensor_with_parallelism`` with one TP axis writes the
  shard it is given);
- ``<key>__dp_0of2__tp_1of4_sd0__ep_…_eid3__pp_…_sid7``: a shard of a multi-axis (or non-TP)
  layout, the axes in the order DP, TP, EP, PP whatever order the request gave;
- ``<key>__writer_<rank>of<size>_sd<dim>``: a shard written from a ``writer_partition``;
- ``<key>__parallelism_manifest`` / ``<key>__writer_manifest``: 96 bytes naming the global
  shape, dtype, split dimension and shard count, written next to the shards by the
  ``*_with_parallelism`` writes, so that a reader can find and reassemble them.

Only uniform sharding is accepted (the split dimension divisible by the shard count), as in
Mooncake; other inputs are INVALID_PARAMS. A reader asking for another TP size than the
writer's gets its shard reassembled from the stored ones (``mode="shard"``) or the whole tensor
(``mode="full"``); the ``*_with_tp`` getters read ``<key>_tp_<rank>`` as stored.

The methods are Mooncake's (mooncake-integration/store/store_py.cpp with store_py_internal.h
and store_py_parallel_{read,write}.h): each public method below is a one-line entry into the
few shared routines (split, write, plan a read, run it).
"""

from __future__ import annotations

import ctypes
import mmap
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import crescent._crescent as _native
from crescent._crescent import ReplicateConfig
from crescent._tensor import (
    _DTYPES,
    TENSOR_METADATA_SIZE,
    _address,
    _as_tensor,
    _memory_at,
    _numpy,
    _Tensor,
    _tensor_of_value,
    _torch,
    _to_tensor,
)
from crescent._shard_layout import (
    FILE_NOT_FOUND,
    INVALID_PARAMS,
    LAYOUT_SHARD,
    _MODES,
    _Axis,
    _Manifest,
    _Meta,
    _Object,
    ParallelAxis,
    ReadTarget,
    TensorParallelism,
    _Writer,
    _canonical,
    _check_parallelism,
    _fail,
    log,
    manifest,
    _metadata_of_prefix,
    parallelism_key,
    parallelism_manifest_key,
    parse_manifest,
    parse_metadata,
    _parse_parallelism,
    _parse_writer,
    _request,
    _shard_object,
    _shard_of,
    _shard_range,
    _single_tp,
    _tp_index,
    tp_key,
    _tp_split,
    _uniform,
    _with_tp,
    writer_key,
    writer_manifest_key,
)
from crescent._shard_plan import (
    _Plan,
    _Reconstruction,
    _Source,
    _assemble_plan,
    _compatible,
    _whole_plan,
)

#: The public names (the layout's classes live in ``crescent._shard_layout``).
__all__ = ["ParallelAxis", "ReadTarget", "ShardedTensorMethods", "TensorParallelism"]

#: Shards of at least this many data bytes in all are written from the tensor's memory
#: (registered for the call where it is not registered); smaller ones are copied through the
#: local buffer, where the copy costs less than a registration.
_DIRECT_MIN = 1 << 20


def _nbytes(part: Any) -> int:
    return part.nbytes if isinstance(part, memoryview) else len(part)


def _spans(ranges: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The (address, length) ranges merged into disjoint spans, empty ones left out."""
    out: list[tuple[int, int]] = []
    for addr, n in sorted(r for r in ranges if r[1] > 0):
        if out and addr <= out[-1][0] + out[-1][1]:
            start = out[-1][0]
            out[-1] = (start, max(out[-1][0] + out[-1][1], addr + n) - start)
        else:
            out.append((addr, n))
    return out


def _repeat_groups(config: Any, n: int) -> Any:
    """`config` for a batch of `n` shards of one tensor: its one group id (``_key_config``)
    repeated for each (Mooncake's MakeRepeatedIndexedConfig)."""
    groups = getattr(config, "group_ids", None) if config is not None else None
    if groups is None or len(groups) == n or len(groups) != 1:
        return config
    return _config_for(config, list(groups) * n)


def _tensor(obj: Any, context: str) -> _Tensor | None:
    t = None if obj is None else _as_tensor(obj)
    if t is None:
        _fail(f"{context}: not a tensor Mooncake's layout can hold (torch tensor, numpy array, __dlpack__ or "
              "buffer object of a supported dtype, at most 8 dimensions)")
    return t


def _tensor_at(addr: int, size: int, context: str) -> tuple[_Tensor, _Meta] | None:
    """The tensor object in registered memory at `addr` ([header][data], `size` bytes)."""
    if addr == 0 or size < TENSOR_METADATA_SIZE:
        _fail(f"{context}: the buffer is null or smaller than the tensor header ({size} bytes)")
        return None
    raw = _memory_at(addr, size)
    meta = parse_metadata(raw, size)
    if meta is None:
        _fail(f"{context}: invalid tensor object metadata")
        return None
    return _Tensor(meta.dtype, meta.local_shape, raw[meta.offset:meta.offset + meta.nbytes]), meta


def _check_config(config: Any) -> int:
    """Mooncake's validate_replicate_config: preferred_segments, when given, one per replica."""
    preferred = getattr(config, "preferred_segments", None) if config is not None else None
    if preferred and len(preferred) != config.replica_num:
        return _fail(f"Preferred segments size ({len(preferred)}) must match replica_num ({config.replica_num})")
    return 0


_CONFIG_FIELDS = ("replica_num", "nof_replica_num", "dfs_replica_num", "soft_pin_action", "soft_pin_ttl_ms",
                  "with_hard_pin", "preferred_segment", "preferred_segments", "preferred_nof_segments",
                  "prefer_alloc_in_same_node", "data_type")


def _config_for(config: Any, group_ids: list[str] | None) -> Any:
    """`config` with its group_ids replaced (Mooncake's ForSingleKey / MakeRepeatedIndexedConfig)."""
    if config is None or getattr(config, "group_ids", None) is None:
        return config
    copy = ReplicateConfig()
    for name in _CONFIG_FIELDS:
        if hasattr(config, name):
            setattr(copy, name, getattr(config, name))
    copy.group_ids = group_ids
    return copy


def _key_config(config: Any, i: int) -> Any:
    groups = getattr(config, "group_ids", None) if config is not None else None
    return _config_for(config, [groups[i]]) if groups is not None and i < len(groups) else config


# ---- the methods ----

_PUT, _UPSERT = "put", "upsert"


#: Idle result memory a store keeps registered for its next sharded reads (``_ResultPool``).
_POOL_IDLE = 1 << 30


class _ResultPool:
    """Memory for the sharded reads' results, registered once and used again: a read takes an
    idle block large enough (else maps and registers a new one), its results are views of the
    block, and the block comes back when the last of them is gone. A fresh allocation's first
    touch (its pages faulted in) costs about as much as reading the tensor; at most _POOL_IDLE
    bytes stay idle, the rest is unregistered and unmapped."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.idle: list[tuple[mmap.mmap, int]] = []  # (block, address), smallest first

    def take(self, store: Any, n: int) -> tuple[mmap.mmap, int] | None:
        with self.lock:
            fit = next((i for i, (b, _) in enumerate(self.idle) if n <= len(b) <= 2 * n), None)
            got = self.idle.pop(fit) if fit is not None else None
        if got is not None and _native._is_registered(store, got[1], len(got[0])):
            return got
        if got is not None:
            self._drop(store, got)  # its client was closed and set up again: map a new one
        block = mmap.mmap(-1, max(n, 1 << 20))
        addr = ctypes.addressof(ctypes.c_char.from_buffer(block))
        if store.register_buffer(addr, len(block)) != 0:
            block.close()
            return None
        return block, addr

    def give(self, store: Any, got: tuple[mmap.mmap, int]) -> None:
        with self.lock:
            self.idle.append(got)
            self.idle.sort(key=lambda g: len(g[0]))
            drop = []
            while sum(len(b) for b, _ in self.idle) > _POOL_IDLE:
                drop.append(self.idle.pop())
        for g in drop:
            self._drop(store, g)

    @staticmethod
    def _drop(store: Any, got: tuple[mmap.mmap, int]) -> None:
        if _native._is_registered(store, got[1], len(got[0])):
            store.unregister_buffer(got[1])


class ShardedTensorMethods:
    """The sharded tensor methods of ``MooncakeDistributedStore`` (mixed into it)."""

    # -- the shared routines --

    def _write_objects(self, objects: list[_Object], config: Any, mode: str) -> int:
        """Writes the objects in one batch call, the manifests (objects without data) in a
        second one once every shard is in; 0, or the first failure's code. Shards of
        _DIRECT_MIN bytes or more in all go from the tensor's own memory (``_write_direct``),
        smaller ones (and upserts) through the local buffer."""
        shards = [o for o in objects if len(o.parts) > 1]
        for group in (shards, [o for o in objects if len(o.parts) <= 1]):
            if not group:
                continue
            config_n = _repeat_groups(config, len(group))
            rc = None
            if mode == _PUT and sum(_nbytes(o.parts[1]) for o in group if len(o.parts) > 1) >= _DIRECT_MIN:
                rc = self._write_direct(group, config_n)
            if rc is None:
                write = self.upsert_batch if mode == _UPSERT else self.put_batch
                values = [b"".join(o.parts) for o in group]
                keys = [o.key for o in group]
                rc = write(keys, values, config_n) if config_n is not None else write(keys, values)
            if rc != 0:
                return rc
        return 0

    def _write_direct(self, objects: list[_Object], config: Any) -> int | None:
        """Puts the objects with one ``batch_put_from_multi_buffers``: each object's first
        part (its header) from a scratch buffer, its data from the tensor's memory where it
        is (registered for the call where it is not registered already: no copy). 0 or the
        first failure's code; None (nothing written) when that memory cannot be registered."""
        heads = bytearray(b"".join(o.parts[0] for o in objects))
        base = _address(heads)
        data = [(_address(o.parts[1]), _nbytes(o.parts[1])) if len(o.parts) > 1 and _nbytes(o.parts[1]) else None
                for o in objects]
        lent = self._lend([(base, len(heads))] + [d for d in data if d is not None])
        if lent is None:
            return None
        try:
            ptrs, sizes, at = [], [], base
            for o, d in zip(objects, data):
                n = len(o.parts[0])
                ptrs.append([at] if d is None else [at, d[0]])
                sizes.append([n] if d is None else [n, d[1]])
                at += n
            keys = [o.key for o in objects]
            results = (self.batch_put_from_multi_buffers(keys, ptrs, sizes, config) if config is not None
                       else self.batch_put_from_multi_buffers(keys, ptrs, sizes))
        finally:
            self._give_back(lent)
        return next((rc for rc in results if rc != 0), 0)

    def _lend(self, ranges: Sequence[tuple[int, int]]) -> list[int] | None:
        """Registers the memory of `ranges` (address, length) that is not registered with
        this client already; the addresses it registered (for ``_give_back``), or None, with
        nothing left registered, when a range can be neither."""
        mine: list[int] = []
        for addr, n in _spans(ranges):
            if _native._is_registered(self, addr, n):
                continue
            if _native._register_source(self, addr, n) != 0:
                log.debug("tensor memory [%#x, +%d) could not be registered: %s", addr, n, _native.last_error())
                self._give_back(mine)
                return None
            mine.append(addr)
        return mine

    def _give_back(self, addrs: Sequence[int]) -> None:
        for addr in addrs:
            if self.unregister_buffer(addr) != 0:
                log.warning("tensor memory at %#x stays registered: %s", addr, _native.last_error())

    def _whole_writes(self, keys: list[str], tensors: list[Any], config: Any, mode: str) -> list[int]:
        """Each tensor whole under its key, with its own group id when `config` has them."""
        return [self._put_tensors([k], [t], _key_config(config, i), mode == _UPSERT)[0]
                for i, (k, t) in enumerate(zip(keys, tensors))]

    def _tp_write(self, keys: Sequence[str], tensors: Sequence[Any], config: Any, tp_size: int, split_dim: int,
                  mode: str, context: str) -> list[int]:
        """``*_tensor_with_tp``: each full tensor split into all `tp_size` shards under
        ``<key>_tp_<rank>``; tp_size <= 1 stores the tensor whole under its key."""
        keys, tensors = list(keys), list(tensors)
        if len(keys) != len(tensors) or not keys:
            if keys:
                _fail(f"{context}: {len(keys)} keys but {len(tensors)} tensors")
            return [INVALID_PARAMS] * len(keys)
        rc = _check_config(config)
        if rc:
            return [INVALID_PARAMS] * len(keys)
        groups = getattr(config, "group_ids", None) if config is not None else None
        if groups is not None and len(groups) != len(keys):
            return [_fail(f"{context}: group_ids size must match keys size")] * len(keys)
        if tp_size <= 1:
            return self._whole_writes(keys, tensors, config, mode)
        results = []
        for i, (key, tensor) in enumerate(zip(keys, tensors)):
            t = _tensor(tensor, context)
            shards = None if t is None else _tp_split(key, t, tp_size, split_dim, None, context)
            results.append(INVALID_PARAMS if shards is None else
                           self._write_objects(shards, _key_config(config, i), mode))
        return results

    def _tp_write_from(self, keys: Sequence[str], buffer_ptrs: Sequence[Any], sizes: Sequence[int], tp_size: int,
                       split_dim: int, context: str) -> list[int]:
        """``*_tensor_with_tp_from``: each buffer holds a full tensor object, split as
        ``_tp_write`` does; tp_size <= 1 stores it whole."""
        keys, buffer_ptrs, sizes = list(keys), list(buffer_ptrs), list(sizes)
        if tp_size <= 1:
            return self._tensors_from(keys, buffer_ptrs, sizes, False)
        if not len(keys) == len(buffer_ptrs) == len(sizes) or not keys:
            if keys:
                _fail(f"{context}: keys, buffer_ptrs and sizes must have the same length")
            return [INVALID_PARAMS] * len(keys)
        results = []
        for key, ptr, size in zip(keys, buffer_ptrs, sizes):
            got = _tensor_at(_address(ptr), size, context)
            shards = None if got is None else _tp_split(key, got[0], tp_size, split_dim, None, context)
            results.append(INVALID_PARAMS if shards is None else self._write_objects(shards, None, _PUT))
        return results

    def _parallelism_write(self, key: str, tensor: Any, parallelism: Any, config: Any, writer_partition: Any,
                           mode: str, context: str, from_buffer: tuple[int, int] | None = None) -> int:
        """One ``*_tensor_with_parallelism[_from]`` write (Mooncake's write routes):

        - ``writer_partition`` (not with ``parallelism``): shard ``rank`` of the full tensor,
          under ``<key>__writer_<rank>of<size>_sd<dim>``, and the writer manifest;
        - neither: the tensor whole under ``key``;
        - one TP axis: the tensor is that shard (``_from``: the buffer is the full tensor and
          every shard is written), under ``<key>_tp_<rank>``, with the parallelism manifest;
        - several axes with TP: shard ``rank`` of the full tensor (``_from``: every shard),
          under the key of the axes, with the parallelism manifest (``_from``: none);
        - no TP axis: the tensor as it is, under the key of the axes.
        """
        if writer_partition is not None and parallelism is not None:
            return _fail(f"{context}: writer_partition cannot be combined with parallelism")
        if from_buffer is not None:
            addr, size = from_buffer
            got = _tensor_at(addr, size, context)
            if got is None:
                return INVALID_PARAMS
            t, meta = got
        else:
            t, meta = None, None
        if writer_partition is not None:
            w = _parse_writer(writer_partition, context)
            if w is None:
                return INVALID_PARAMS
            if t is None:
                t = _tensor(tensor, context)
            if t is None or not _uniform(t.shape, w.split_dim, w.size, context):
                return INVALID_PARAMS
            if meta is not None and meta.global_shape != meta.local_shape:
                return _fail(f"{context}: the buffer holds a shard, not a full tensor")
            axes = [_Axis("tp", w.rank, w.size, w.split_dim)]
            shard = _shard_object(writer_key(key, w), t, _shard_of(t, w.split_dim, w.rank, w.size), axes)
            return self._write_objects(
                [shard, _Object(writer_manifest_key(key), (manifest(t.shape, t.dtype, w.split_dim, w.size),))],
                config, mode)
        if parallelism is None:
            rc = _check_config(config)
            if rc:
                return rc
            if from_buffer is not None:
                write = self.upsert_from if mode == _UPSERT else self.put_from
                return write(key, from_buffer[0], from_buffer[1], config) if config is not None else \
                    write(key, from_buffer[0], from_buffer[1])
            return self._put_tensors([key], [tensor], config, mode == _UPSERT)[0]
        axes = _request(parallelism, context)
        if axes is None:
            return INVALID_PARAMS
        if t is None:
            t = _tensor(tensor, context)
            if t is None:
                return INVALID_PARAMS
        tp = _tp_index(axes)
        if tp is None:
            # A shard whose identity has no layout axis: stored as given (Mooncake's generic route).
            g = t.shape if meta is None else meta.global_shape
            return self._write_objects([_shard_object(parallelism_key(key, axes), t, t, axes, g)], config, mode)
        size, split_dim = axes[tp].size, axes[tp].split_dim
        if from_buffer is not None:
            if meta.global_shape != meta.local_shape:
                return _fail(f"{context}: the buffer holds a shard, not a full tensor")
            shards = _tp_split(key, t, size, split_dim, axes, context)
            return INVALID_PARAMS if shards is None else self._write_objects(shards, config, mode)
        if len(axes) == 1:
            # The tensor is the shard: the global shape is its shape times the shard count.
            if not 0 <= split_dim < len(t.shape):
                return _fail(f"{context}: split_dim {split_dim} out of range for {len(t.shape)} dims")
            global_shape = list(t.shape)
            global_shape[split_dim] *= size
            objects = [_shard_object(parallelism_key(key, axes), t, t, axes, global_shape)]
        else:
            if not _uniform(t.shape, split_dim, size, context):
                return INVALID_PARAMS
            global_shape = t.shape
            objects = [_shard_object(parallelism_key(key, axes), t, _shard_of(t, split_dim, axes[tp].rank, size),
                                     axes)]
        objects.append(_Object(parallelism_manifest_key(key), (manifest(global_shape, t.dtype, split_dim, size),)))
        return self._write_objects(objects, config, mode)

    def _parallelism_batch_write(self, keys: Sequence[str], values: Sequence[Any], parallelisms: Any, config: Any,
                                 writer_partitions: Any, mode: str, context: str,
                                 sizes: Sequence[int] | None = None) -> list[int]:
        """The batch forms: one request per key from ``parallelisms`` or ``writer_partitions``
        (lists as long as ``keys``, not both), or plain whole-tensor writes when neither."""
        keys, values = list(keys), list(values)
        n = len(keys)
        groups = getattr(config, "group_ids", None) if config is not None else None
        if groups is not None and len(groups) != n:
            return [_fail(f"{context}: group_ids size must match keys size")] * n
        if parallelisms is not None and writer_partitions is not None:
            return [_fail(f"{context}: writer_partitions cannot be combined with parallelisms")] * n
        if len(values) != n or (sizes is not None and len(list(sizes)) != n):
            return [_fail(f"{context}: values and keys must have the same length")] * n
        sizes = list(sizes) if sizes is not None else None
        if parallelisms is None and writer_partitions is None:
            rc = _check_config(config)
            if rc:
                return [rc] * n
            if sizes is None:
                return self._whole_writes(keys, values, config, mode)
            if config is None:
                return self._tensors_from(keys, values, sizes, mode == _UPSERT)
            if not keys:
                return []
            for i, (ptr, size) in enumerate(zip(values, sizes)):
                if _tensor_at(_address(ptr), size, f"{context}: tensor object buffer at index {i}") is None:
                    return [INVALID_PARAMS] * n
            write = self.batch_upsert_from if mode == _UPSERT else self.batch_put_from
            return write(keys, values, sizes, config)
        requests, name = ((parallelisms, "parallelisms") if parallelisms is not None
                          else (writer_partitions, "writer_partitions"))
        if not isinstance(requests, list) or len(requests) != n:
            return [_fail(f"{context}: {name} must be a list as long as keys")] * n
        results = []
        for i, key in enumerate(keys):
            p, w = (requests[i], None) if parallelisms is not None else (None, requests[i])
            buffer = None if sizes is None else (_address(values[i]), sizes[i])
            results.append(self._parallelism_write(key, values[i], p, _key_config(config, i), w, mode, context,
                                                   buffer))
        return results

    # -- reads --

    def _load(self, keys: list[str], context: str) -> list[_Source] | None:
        """The metadata of each key's object (its header only, ``_headers``); None if one is
        missing or not a tensor."""
        if not keys:
            return []
        metas = self._headers(keys, context)
        if metas is None:
            return None
        for key, meta in zip(keys, metas):
            if meta is None:
                _fail(f"{context}: missing reconstructed shard source for key {key}")
                return None
        return [_Source(k, m) for k, m in zip(keys, metas)]

    def _headers(self, keys: list[str], context: str) -> list[_Meta | None] | None:
        """The metadata of each key's object, None where it is missing or not a tensor: the
        first TENSOR_METADATA_SIZE bytes of every key in one ranged read into a scratch
        buffer. None (recorded) when the scratch buffer cannot be registered."""
        scratch = bytearray(TENSOR_METADATA_SIZE * len(keys))
        addr = _address(scratch)
        if self.register_buffer(addr, len(scratch)) != 0:
            _fail(f"{context}: failed to register metadata scratch buffer")
            return None
        try:
            got = self.get_into_ranges([addr], [keys], [[[i * TENSOR_METADATA_SIZE] for i in range(len(keys))]],
                                       [[[0] for _ in keys]], [[[TENSOR_METADATA_SIZE] for _ in keys]])
        finally:
            self.unregister_buffer(addr)
        view = memoryview(scratch)
        return [_metadata_of_prefix(view[i * TENSOR_METADATA_SIZE:(i + 1) * TENSOR_METADATA_SIZE])
                if got[0][i] == [TENSOR_METADATA_SIZE] else None for i in range(len(keys))]

    def _load_one(self, key: str, context: str) -> _Source | None:
        got = self._load([key], context)
        return got[0] if got else None

    def _manifest(self, key: str) -> _Manifest | None:
        return parse_manifest(self.get_buffer(key))

    def _writer_reconstruction(self, key: str, context: str) -> _Reconstruction | None:
        """The shards a writer-partition manifest names, checked."""
        m = self._manifest(writer_manifest_key(key))
        if m is None:
            return None
        keys = [writer_key(key, _Writer(r, m.count, m.split_dim)) for r in range(m.count)]
        sources = self._load(keys, context)
        if sources is None:
            return None
        for rank, s in enumerate(sources):
            stored = s.meta.parallelism()
            if not stored or not _single_tp(stored) or stored[0][1:4] != (rank, m.count, m.split_dim):
                _fail(f"{context}: writer shard metadata mismatch for key {s.key}")
                return None
        return _Reconstruction(sources, m.global_shape, m.split_dim, m.dtype)

    def _parallelism_reconstruction(self, key: str, axes: list[_Axis], context: str) -> _Reconstruction | None:
        """Mooncake's load_parallelism_full_reconstruction_sources: the TP shards that make up
        the tensor `axes` belongs to — the ones its parallelism manifest counts, else those
        the request's (or, for one TP axis, the stored) TP size names."""
        tp = _tp_index(axes)
        if tp is None:
            _fail(f"{context}: full reconstruction requires a TP axis")
            return None
        want = axes[tp]
        canonical = _canonical(axes)
        m = self._manifest(parallelism_manifest_key(key))
        if (m is not None and want.split_dim == m.split_dim and m.global_shape[m.split_dim] % want.size == 0
                and m.global_shape[m.split_dim] % m.count == 0):
            keys = [parallelism_key(key, _with_tp(canonical, rank=r, size=m.count)) for r in range(m.count)]
            sources = self._load(keys, context)
            if sources is not None and all(_compatible(_with_tp(canonical, rank=r, size=m.count), s.meta, context)
                                           for r, s in enumerate(sources)):
                return _Reconstruction(sources, m.global_shape, m.split_dim, m.dtype)
        if _single_tp(canonical):
            first = self._load_one(key if want.size <= 1 else tp_key(key, 0), context)
            stored = None if first is None else first.meta.tp_axis()
            if first is None or first.meta.layout != LAYOUT_SHARD or stored is None:
                _fail(f"{context}: no shard matched requested layout for TP rank 0")
                return None
            count, split_dim, g = stored[3], stored[4], first.meta.global_shape
            if want.split_dim != split_dim or not 0 <= split_dim < len(g) or g[split_dim] % want.size \
                    or g[split_dim] % count:
                _fail(f"{context}: split_dim mismatch or non-uniform sharding")
                return None
            sources = self._load([key if count <= 1 else tp_key(key, r) for r in range(count)], context)
            if sources is None:
                return None
            for r, s in enumerate(sources):
                a = s.meta.tp_axis()
                if s.meta.layout != LAYOUT_SHARD or a is None or a[2:5] != (r, count, split_dim):
                    _fail(f"{context}: shard metadata mismatch for TP rank {r}")
                    return None
            return _Reconstruction(sources, g, split_dim, first.meta.dtype)
        keys = [parallelism_key(key, _with_tp(canonical, rank=r)) for r in range(want.size)]
        sources = self._load(keys, context)
        if sources is None or not all(_compatible(_with_tp(canonical, rank=r), s.meta, context)
                                      for r, s in enumerate(sources)):
            return None
        g = sources[0].meta.global_shape
        split_dim = sources[0].meta.tp_axis()[4]
        if want.split_dim != split_dim or g[split_dim] % want.size:
            _fail(f"{context}: split_dim mismatch or non-uniform sharding")
            return None
        return _Reconstruction(sources, g, split_dim, sources[0].meta.dtype)

    def _full_plan(self, r: _Reconstruction, context: str) -> _Plan | None:
        return _assemble_plan(r.sources, r.global_shape, r.split_dim, (), 0, r.global_shape[r.split_dim], context)

    def _shard_plan(self, r: _Reconstruction, axes: list[_Axis], context: str) -> _Plan | None:
        want = axes[_tp_index(axes)]
        start, extent = _shard_range(r.global_shape[r.split_dim], want.rank, want.size)
        return _assemble_plan(r.sources, r.global_shape, r.split_dim, axes, start, extent, context)

    def _plan(self, key: str, target: Any, context: str) -> _Plan | None:
        """How to make what `target` (a ReadTarget or None) asks of `key` (Mooncake's
        get_tensor_with_parallelism and build_tensor_into_plan_for_target)."""
        if target is None:
            mode, parallelism = "as_stored", None
        elif not (hasattr(target, "mode") and hasattr(target, "parallelism")):
            _fail(f"{context}: ReadTarget must provide mode and parallelism")
            return None
        else:
            mode, parallelism = str(target.mode).lower(), target.parallelism
            if mode not in _MODES:
                _fail(f"{context}: unsupported ReadTarget mode {target.mode!r}")
                return None
        if parallelism is None and mode == "as_stored":
            s = self._load_one(key, context)
            return None if s is None else _whole_plan(s)
        if parallelism is None and mode == "full":
            r = self._writer_reconstruction(key, context)
            if r is None:
                s = self._load_one(key, context)
                return None if s is None else _whole_plan(s)
            return self._full_plan(r, context)
        axes = _request(parallelism, context)
        if axes is None:
            return None
        if mode == "shard":
            direct = [parallelism_key(key, axes)]
            if _single_tp(axes):
                a = axes[0]
                direct.append(writer_key(key, _Writer(a.rank, a.size, a.split_dim or 0)))
            for read_key in direct:
                s = self._load_one(read_key, context)
                if s is not None and s.meta.parallelism() == _canonical(axes):
                    return _whole_plan(s)
            if _tp_index(axes) is None:
                _fail(f"{context}: parallelism metadata mismatch for key {key}")
                return None
            r = self._parallelism_reconstruction(key, axes, context)
            return None if r is None else self._shard_plan(r, axes, context)
        if mode == "full":
            r = self._parallelism_reconstruction(key, axes, context)
            return None if r is None else self._full_plan(r, context)
        _fail(f"{context}: unsupported ReadTarget mode (as_stored with a parallelism)")
        return None

    def _run_fresh(self, plans: list[_Plan | None], context: str) -> list[Any]:
        """Runs plans into memory the results own (one block of the store's ``_ResultPool``) in
        one get_into_ranges: the shards' byte ranges land where the results keep them (no
        copy). A tensor per plan (None where the plan is None or its read failed)."""
        out: list[Any] = [None] * len(plans)
        where = [i for i, p in enumerate(plans) if p is not None and p.total > 0]
        if not where:
            return out
        np = _numpy()
        offsets, total = [], 0
        for i in where:
            offsets.append(total)
            total += (plans[i].total + 63) // 64 * 64  # each result's data aligned as numpy's own
        pool = self.__dict__.setdefault("_result_pool", _ResultPool())
        block = pool.take(self, total)
        if block is None:
            _fail(f"{context}: cannot register {total} bytes for the result")
            return out
        # Every result is a view of `anchor` (numpy collapses views onto it, the first array
        # over memory it does not own): the block goes back to the pool once none is left.
        anchor = np.frombuffer(block[0], dtype=np.uint8, count=total)
        weakref.finalize(anchor, pool.give, self, block)
        views = [memoryview(anchor[o:o + plans[i].total]) for i, o in zip(where, offsets)]
        got = self._run_into([(plans[i], block[1] + o, plans[i].total) for i, o in zip(where, offsets)], context,
                             views)
        del views, anchor
        for i, t in zip(where, got):
            out[i] = t
        return out

    def _run_into(self, plans: list[tuple[_Plan, int, int]], context: str,
                  views: list[memoryview] | None = None) -> list[Any]:
        """Runs plans into registered memory (address, size) in one get_into_ranges; a tensor
        over each buffer (over `views[i]`, the same memory, when given), or None where its
        plan did not fit or a range failed."""
        out: list[Any] = [None] * len(plans)
        batch = []
        for i, (plan, addr, size) in enumerate(plans):
            if plan.total > size:
                _fail(f"{context}: buffer too small ({size} bytes) for {plan.total} bytes")
                continue
            keys: dict[str, list[list[int]]] = {}
            for key, dst, src, n in plan.fragments:
                ranges = keys.setdefault(key, [[], [], []])
                ranges[0].append(dst)
                ranges[1].append(src)
                ranges[2].append(n)
            batch.append((i, addr, keys))
        sent = [b for b in batch if b[2]]
        results = iter(self.get_into_ranges([b[1] for b in sent], [list(b[2]) for b in sent],
                                            [[r[0] for r in b[2].values()] for b in sent],
                                            [[r[1] for r in b[2].values()] for b in sent],
                                            [[r[2] for r in b[2].values()] for b in sent]) if sent else [])
        for i, addr, keys in batch:
            if keys and next(results) != [r[2] for r in keys.values()]:
                _fail(f"{context}: a range of the read failed")
                continue
            plan, _, _ = plans[i]
            if plan.header:
                ctypes.memmove(addr, plan.header, TENSOR_METADATA_SIZE)
            memory = views[i] if views is not None else _memory_at(addr, plan.total)
            out[i] = _tensor_of_value(memory, plan.total, copy=False)
        return out

    def _parallelism_get(self, keys: Sequence[str], targets: Any, context: str) -> list[Any]:
        keys = list(keys)
        if targets is None:
            return self.batch_get_tensor(keys)
        if not isinstance(targets, list) or len(targets) != len(keys):
            _fail(f"{context}: targets must be a list as long as keys")
            return [None] * len(keys)
        out = self._run_fresh([self._plan(k, t, context) for k, t in zip(keys, targets)], context)
        # Mooncake's last resort for one TP axis: the object under <key>_tp_<rank> as it is.
        for i, (k, t) in enumerate(zip(keys, targets)):
            if out[i] is None and t is not None and str(getattr(t, "mode", "")).lower() == "shard":
                axes = _check_parallelism(_parse_parallelism(t.parallelism, context), context) \
                    if getattr(t, "parallelism", None) is not None else None
                if axes and _single_tp(axes):
                    out[i] = self.get_tensor(k if axes[0].size <= 1 else tp_key(k, axes[0].rank))
        return out

    def _parallelism_get_into(self, keys: Sequence[str], buffer_ptrs: Sequence[Any], sizes: Sequence[int],
                              targets: Any, context: str) -> list[Any]:
        keys, buffer_ptrs, sizes = list(keys), list(buffer_ptrs), list(sizes)
        if not len(keys) == len(buffer_ptrs) == len(sizes):
            _fail(f"{context}: keys, buffer_ptrs, and sizes must have the same length")
            return [None] * len(keys)
        if targets is not None and (not isinstance(targets, list) or len(targets) != len(keys)):
            _fail(f"{context}: targets must be a list as long as keys")
            return [None] * len(keys)
        targets = targets if targets is not None else [None] * len(keys)
        planned, where = [], []
        for i, (k, p, n, t) in enumerate(zip(keys, buffer_ptrs, sizes, targets)):
            addr = _address(p)
            if addr == 0:
                _fail(f"{context}: buffer pointer cannot be null")
                continue
            plan = self._plan(k, t, context)
            if plan is not None:
                planned.append((plan, addr, n))
                where.append(i)
        out: list[Any] = [None] * len(keys)
        for i, got in zip(where, self._run_into(planned, context)):
            out[i] = got
        return out

    def _tp_read_keys(self, keys: Sequence[str], tp_rank: int, tp_size: int) -> list[str]:
        return list(keys) if tp_size <= 1 else [tp_key(k, tp_rank) for k in keys]

    # -- Mooncake's methods: *_tensor_with_tp --

    def put_tensor_with_tp(self, key: str, tensor: Any, tp_rank: int = 0, tp_size: int = 1,
                           split_dim: int = 0) -> int:
        """Splits the full `tensor` into `tp_size` shards along `split_dim` and stores shard r
        under ``<key>_tp_<r>`` (every shard, whatever `tp_rank`); tp_size <= 1 stores it whole
        under `key`. 0, INVALID_PARAMS (a split_dim out of range, a size not divisible) or the
        first failed put's code."""
        return self._tp_write([key], [tensor], None, tp_size, split_dim, _PUT, "put_tensor_with_tp")[0]

    def pub_tensor_with_tp(self, key: str, tensor: Any, config: ReplicateConfig | None = None, tp_rank: int = 0,
                           tp_size: int = 1, split_dim: int = 0) -> int:
        """``put_tensor_with_tp`` with each shard placed as `config` asks."""
        return self._tp_write([key], [tensor], config, tp_size, split_dim, _PUT, "pub_tensor_with_tp")[0]

    def batch_put_tensor_with_tp(self, base_keys: Sequence[str], tensors_list: Sequence[Any], tp_rank: int = 0,
                                 tp_size: int = 1, split_dim: int = 0) -> list[int]:
        return self._tp_write(base_keys, tensors_list, None, tp_size, split_dim, _PUT, "batch_put_tensor_with_tp")

    def batch_pub_tensor_with_tp(self, base_keys: Sequence[str], tensors_list: Sequence[Any],
                                 config: ReplicateConfig | None = None, tp_rank: int = 0, tp_size: int = 1,
                                 split_dim: int = 0) -> list[int]:
        return self._tp_write(base_keys, tensors_list, config, tp_size, split_dim, _PUT, "batch_pub_tensor_with_tp")

    def _tp_get(self, keys: list[str], context: str) -> list[Any]:
        """The tensors under `keys` as stored (None where missing or not a tensor), read whole
        straight into memory the results own (no copy, no room needed in the local buffer):
        one master round trip gives the sizes, a block of the ``_ResultPool`` is taken for
        them, and one engine batch reads every value into it."""
        if not keys:
            return []
        np = _numpy()
        pool = self.__dict__.setdefault("_result_pool", _ResultPool())
        taken: dict[str, Any] = {}

        def place(sizes: list[int | None]) -> list[int | None]:
            offsets: list[int | None] = []
            total = 0
            for n in sizes:
                if n is None or n < TENSOR_METADATA_SIZE:
                    offsets.append(None)
                    continue
                offsets.append(total)
                total += (n + 63) // 64 * 64  # each value aligned as numpy's own
            block = pool.take(self, total) if total else None
            if block is None:
                if total:
                    _fail(f"{context}: cannot register {total} bytes for the result")
                return [None] * len(sizes)
            taken.update(block=block, total=total, offsets=offsets)
            return [None if o is None else block[1] + o for o in offsets]

        got = self._batch_get_into_placed(keys, place)
        if "block" not in taken:
            return [None] * len(keys)
        block = taken["block"]
        # Every result is a view of `anchor`: the block goes back to the pool once none is left.
        anchor = np.frombuffer(block[0], dtype=np.uint8, count=taken["total"])
        weakref.finalize(anchor, pool.give, self, block)
        out: list[Any] = []
        for n, o in zip(got, taken["offsets"]):
            value = None if n < 0 or o is None else memoryview(anchor[o:o + n])
            out.append(None if value is None or parse_metadata(value, n) is None
                       else _tensor_of_value(value, n, copy=False))
        return out

    def get_tensor_with_tp(self, key: str, tp_rank: int = 0, tp_size: int = 1, split_dim: int = 0) -> Any:
        """The object under ``<key>_tp_<tp_rank>`` as stored (``key`` when tp_size <= 1); None
        if missing. It is not re-split: a reader of another TP size than the writer's gets
        the writer's shard of that rank (``get_tensor_with_parallelism`` re-splits)."""
        return self._tp_get(self._tp_read_keys([key], tp_rank, tp_size), "get_tensor_with_tp")[0]

    def batch_get_tensor_with_tp(self, base_keys: Sequence[str], tp_rank: int = 0, tp_size: int = 1) -> list[Any]:
        return self._tp_get(self._tp_read_keys(base_keys, tp_rank, tp_size), "batch_get_tensor_with_tp")

    def get_tensor_with_tp_into(self, key: str, buffer_ptr: Any, size: int, tp_rank: int = 0, tp_size: int = 1,
                                split_dim: int = 0) -> Any:
        return self.get_tensor_into(self._tp_read_keys([key], tp_rank, tp_size)[0], buffer_ptr, size)

    def batch_get_tensor_with_tp_into(self, base_keys: Sequence[str], buffer_ptrs: Sequence[Any],
                                      sizes: Sequence[int], tp_rank: int = 0, tp_size: int = 1) -> list[Any]:
        return self.batch_get_tensor_into(self._tp_read_keys(base_keys, tp_rank, tp_size), buffer_ptrs, sizes)

    def put_tensor_with_tp_from(self, key: str, buffer_ptr: Any, size: int, tp_rank: int = 0, tp_size: int = 1,
                                split_dim: int = 0) -> int:
        """``put_tensor_with_tp`` of the full tensor object ([header][data]) in registered
        memory."""
        return self._tp_write_from([key], [buffer_ptr], [size], tp_size, split_dim, "put_tensor_with_tp_from")[0]

    def batch_put_tensor_with_tp_from(self, base_keys: Sequence[str], buffer_ptrs: Sequence[Any],
                                      sizes: Sequence[int], tp_rank: int = 0, tp_size: int = 1,
                                      split_dim: int = 0) -> list[int]:
        return self._tp_write_from(base_keys, buffer_ptrs, sizes, tp_size, split_dim, "batch_put_tensor_with_tp_from")

    # -- Mooncake's methods: *_tensor_with_parallelism --

    def put_tensor_with_parallelism(self, key: str, tensor: Any, parallelism: TensorParallelism | None = None,
                                    config: ReplicateConfig | None = None, writer_partition: Any = None) -> int:
        """Stores `tensor` as the object `parallelism` names (see ``_parallelism_write``), or
        shard ``writer_partition.rank`` of it; 0 or a negative code."""
        return self._parallelism_write(key, tensor, parallelism, config, writer_partition, _PUT,
                                       "put_tensor_with_parallelism")

    def upsert_tensor_with_parallelism(self, key: str, tensor: Any, parallelism: TensorParallelism | None = None,
                                       config: ReplicateConfig | None = None, writer_partition: Any = None) -> int:
        return self._parallelism_write(key, tensor, parallelism, config, writer_partition, _UPSERT,
                                       "upsert_tensor_with_parallelism")

    def put_tensor_with_parallelism_from(self, key: str, buffer_ptr: Any, size: int,
                                         parallelism: TensorParallelism | None = None,
                                         config: ReplicateConfig | None = None, writer_partition: Any = None) -> int:
        return self._parallelism_write(key, None, parallelism, config, writer_partition, _PUT,
                                       "put_tensor_with_parallelism_from", (_address(buffer_ptr), size))

    def upsert_tensor_with_parallelism_from(self, key: str, buffer_ptr: Any, size: int,
                                            parallelism: TensorParallelism | None = None,
                                            config: ReplicateConfig | None = None,
                                            writer_partition: Any = None) -> int:
        return self._parallelism_write(key, None, parallelism, config, writer_partition, _UPSERT,
                                       "upsert_tensor_with_parallelism_from", (_address(buffer_ptr), size))

    def batch_put_tensor_with_parallelism(self, keys: Sequence[str], tensors_list: Sequence[Any],
                                          parallelisms: list[TensorParallelism | None] | None = None,
                                          config: ReplicateConfig | None = None,
                                          writer_partitions: list[Any] | None = None) -> list[int]:
        return self._parallelism_batch_write(keys, tensors_list, parallelisms, config, writer_partitions, _PUT,
                                             "batch_put_tensor_with_parallelism")

    def batch_upsert_tensor_with_parallelism(self, keys: Sequence[str], tensors_list: Sequence[Any],
                                             parallelisms: list[TensorParallelism | None] | None = None,
                                             config: ReplicateConfig | None = None,
                                             writer_partitions: list[Any] | None = None) -> list[int]:
        return self._parallelism_batch_write(keys, tensors_list, parallelisms, config, writer_partitions, _UPSERT,
                                             "batch_upsert_tensor_with_parallelism")

    def batch_put_tensor_with_parallelism_from(self, keys: Sequence[str], buffer_ptrs: Sequence[Any],
                                               sizes: Sequence[int],
                                               parallelisms: list[TensorParallelism | None] | None = None,
                                               config: ReplicateConfig | None = None,
                                               writer_partitions: list[Any] | None = None) -> list[int]:
        return self._parallelism_batch_write(keys, buffer_ptrs, parallelisms, config, writer_partitions, _PUT,
                                             "batch_put_tensor_with_parallelism_from", sizes)

    def batch_upsert_tensor_with_parallelism_from(self, keys: Sequence[str], buffer_ptrs: Sequence[Any],
                                                  sizes: Sequence[int],
                                                  parallelisms: list[TensorParallelism | None] | None = None,
                                                  config: ReplicateConfig | None = None,
                                                  writer_partitions: list[Any] | None = None) -> list[int]:
        return self._parallelism_batch_write(keys, buffer_ptrs, parallelisms, config, writer_partitions, _UPSERT,
                                             "batch_upsert_tensor_with_parallelism_from", sizes)

    def get_tensor_with_parallelism(self, key: str, target: ReadTarget | None = None) -> Any:
        """What `target` asks of `key`: the object as stored (None / ``as_stored``), the shard
        ``target.parallelism`` names, reassembled from the stored shards when none is stored
        under its key (``shard``), or the whole tensor (``full``). None on failure."""
        return self._parallelism_get([key], [target], "get_tensor_with_parallelism")[0]

    def batch_get_tensor_with_parallelism(self, keys: Sequence[str],
                                          targets: list[ReadTarget | None] | None = None) -> list[Any]:
        return self._parallelism_get(keys, targets, "batch_get_tensor_with_parallelism")

    def get_tensor_with_parallelism_into(self, key: str, buffer_ptr: Any, size: int,
                                         target: ReadTarget | None = None) -> Any:
        """``get_tensor_with_parallelism`` into registered memory ([header][data], the shards'
        byte ranges read straight into place); a tensor over the buffer, or None."""
        return self._parallelism_get_into([key], [buffer_ptr], [size], None if target is None else [target],
                                          "get_tensor_with_parallelism_into")[0]

    def batch_get_tensor_with_parallelism_into(self, keys: Sequence[str], buffer_ptrs: Sequence[Any],
                                               sizes: Sequence[int],
                                               targets: list[ReadTarget | None] | None = None) -> list[Any]:
        return self._parallelism_get_into(keys, buffer_ptrs, sizes, targets, "batch_get_tensor_with_parallelism_into")

    # -- safetensors files --

    def save_tensor_to_safetensor(self, key: str, file_name: str | None = None) -> int:
        """Writes the tensor under `key` to the safetensors file `file_name` (default: the key)
        as its one entry, named `key`. 0; FILE_NOT_FOUND (-1100) when the key holds no tensor;
        INVALID_PARAMS when the file cannot be written or the ``safetensors`` package is
        missing (and, without torch, for bfloat16 / float8 tensors, which numpy cannot name)."""
        raw = self.get_buffer(key)
        meta = None if raw is None else parse_metadata(raw, raw.size())
        if meta is None:
            _fail(f"save_tensor_to_safetensor: failed to fetch tensor for key {key}")
            return FILE_NOT_FOUND
        try:
            save_file = _safetensors_module("save_tensor_to_safetensor", meta.dtype).save_file
            tensor = _to_tensor(meta.dtype, meta.local_shape, memoryview(raw)[meta.offset:], copy=True)
            save_file({key: tensor}, key if file_name is None else file_name)
        except Exception as e:  # noqa: BLE001  (a missing package, safetensors' and the OS's errors alike)
            log.warning("Failed to save tensor to safetensor file: %s", e)
            return _fail(f"Failed to save tensor to safetensor file: {e}")
        return 0

    def load_tensor_from_safetensor(self, key: str | None = None, file_name: str | None = None) -> Any:
        """Reads a safetensors file and stores its tensor named `key` (else its first, with a
        warning) under `key` (default: the file name); the tensor, or None."""
        if file_name is None:
            raise TypeError("load_tensor_from_safetensor() missing required argument: 'file_name'")
        try:
            loaded = _safetensors_module("load_tensor_from_safetensor").load_file(file_name)
        except Exception as e:  # noqa: BLE001
            log.warning("Failed to load tensor from safetensor file: %s", e)
            _fail(f"Failed to load tensor from safetensor file: {e}")
            return None
        if not loaded:
            _fail(f"No tensors found in safetensor file: {file_name}")
            return None
        store_key = file_name if key is None else key
        if key is not None and key not in loaded:
            log.warning("Key %s not found in safetensor file; using first entry", key)
        tensor = loaded[key] if key is not None and key in loaded else next(iter(loaded.values()))
        rc = self.put_tensor(store_key, tensor)
        if rc != 0:
            _fail(f"Failed to store tensor for key {store_key}, rc={rc}")
            return None
        return tensor


def _safetensors_module(context: str, dtype: int | None = None) -> Any:
    """``safetensors.torch`` (Mooncake's choice) where torch is importable, else
    ``safetensors.numpy``; ImportError with the reason when the package is missing, TypeError
    for a `dtype` numpy cannot name (bfloat16, float8) without torch."""
    try:
        if _torch() is not None:
            import safetensors.torch as module
        else:
            import safetensors.numpy as module
    except ImportError as e:
        raise ImportError(f"{context} needs the safetensors package (pip install safetensors): {e}") from e
    name = None if dtype is None else _DTYPES[dtype][0]
    if _torch() is None and name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        raise TypeError(f"{context}: a {name} tensor needs torch (numpy has no such dtype)")
    return module
