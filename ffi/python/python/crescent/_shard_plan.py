"""Sharded reads' plans: which byte ranges of which stored shards make the result a reader
asked for (as stored, one shard of another layout, or the whole tensor). Used by
``crescent.tensor_parallel``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from crescent._tensor import _DTYPES, TENSOR_METADATA_SIZE, _numpy
from crescent._shard_layout import (
    LAYOUT_FULL,
    LAYOUT_SHARD,
    _Axis,
    _Meta,
    _canonical,
    _fail,
    _shard_range,
    shard_header,
)

# ---- reads: which byte ranges of which objects make the result ----


class _Source(NamedTuple):
    key: str
    meta: _Meta


class _Plan(NamedTuple):
    """A result of `total` bytes: `header`, then the data assembled from `fragments`
    (key, offset in the result, offset in the object, length)."""

    header: bytes
    total: int
    fragments: list[tuple[str, int, int, int]]
    sources: list[_Source]


def _whole_plan(source: _Source) -> _Plan:
    meta = source.meta
    header_len = meta.offset
    return _Plan(b"", header_len + meta.nbytes, [(source.key, 0, 0, header_len + meta.nbytes)], [source])


def _assemble_plan(sources: list[_Source], global_shape: Sequence[int], split_dim: int, axes: Sequence[_Axis],
                   start: int, extent: int, context: str) -> _Plan | None:
    """Mooncake's reconstruction plan: the rows of each TP shard in `sources` that fall in
    [start, start + extent) of `split_dim`, laid out as one tensor of `global_shape` with that
    extent (a full tensor when `axes` is empty, else the shard they name); every row covered,
    or None."""
    if not sources or not 0 <= split_dim < len(global_shape):
        _fail(f"{context}: missing reconstruction shard sources")
        return None
    dtype = sources[0].meta.dtype
    itemsize = _numpy().dtype(_DTYPES[dtype][1]).itemsize
    before = after = 1
    for d in global_shape[:split_dim]:
        before *= d
    for d in global_shape[split_dim + 1:]:
        after *= d
    covered = [False] * extent
    fragments = []
    for s in sources:
        tp = s.meta.tp_axis()
        local = s.meta.local_shape
        if (s.meta.dtype != dtype or s.meta.layout != LAYOUT_SHARD or tp is None or len(local) != len(global_shape)
                or any(local[d] != global_shape[d] for d in range(len(local)) if d != split_dim)):
            _fail(f"{context}: shard shape or TP metadata mismatch for key {s.key}")
            return None
        _kind, _index, rank, count, sd, _r0, _r1 = tp
        if sd != split_dim or global_shape[split_dim] % count:
            _fail(f"{context}: invalid TP shard metadata for key {s.key}")
            return None
        s_start, s_extent = _shard_range(global_shape[split_dim], rank, count)
        if local[split_dim] != s_extent:
            _fail(f"{context}: shard extent mismatch for key {s.key}")
            return None
        lo, hi = max(s_start, start), min(s_start + s_extent, start + extent)
        if hi <= lo:
            continue
        row = (hi - lo) * after * itemsize
        for i in range(lo - start, hi - start):
            covered[i] = True
        if row == 0:
            continue
        for b in range(before):
            dst = TENSOR_METADATA_SIZE + (b * extent + lo - start) * after * itemsize
            src = s.meta.offset + (b * s_extent + lo - s_start) * after * itemsize
            fragments.append((s.key, dst, src, row))
    if not all(covered):
        _fail(f"{context}: shard extents do not cover reconstructed dimension")
        return None
    shape = list(global_shape)
    shape[split_dim] = extent
    nbytes = before * extent * after * itemsize
    header = shard_header(dtype, global_shape, shape, nbytes, axes, LAYOUT_SHARD if axes else LAYOUT_FULL)
    return _Plan(header, TENSOR_METADATA_SIZE + nbytes, fragments, sources)


class _Reconstruction(NamedTuple):
    sources: list[_Source]
    global_shape: tuple[int, ...]
    split_dim: int
    dtype: int


def _compatible(request: list[_Axis], meta: _Meta, context: str) -> bool:
    """Mooncake's resolve_tp_compatible_parallelism_from_metadata followed by
    parallelism_specs_equal_by_kind(allow_tp_rank_mismatch): the stored shard has the same
    axes as the request, its TP axis differing at most in rank."""
    stored = meta.parallelism()
    if stored is None or len(stored) != len(request):
        _fail(f"{context}: missing shard parallelism metadata or axis count mismatch")
        return False
    for want, have in zip(_canonical(request), stored):
        if want.kind == "tp" and have.kind == "tp":
            if want._replace(rank=have.rank) != have:
                _fail(f"{context}: TP axis metadata mismatch")
                return False
        elif want != have:
            _fail(f"{context}: non-TP axis metadata mismatch")
            return False
    return True
