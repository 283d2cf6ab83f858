"""The sharded tensors' layout: parallel axes and read targets, the shards' and manifests'
key names, shard headers and manifests, and which slice of a tensor a shard holds
(Mooncake's store_py_parallel layout). Used by ``crescent.tensor_parallel``."""

from __future__ import annotations

import logging
import struct
from collections.abc import Sequence
from typing import Any, NamedTuple

import crescent._crescent as _native
from crescent._tensor import (
    _DTYPES,
    _HEADER,
    _SHAPES,
    MAX_TENSOR_DIMS,
    TENSOR_MAGIC,
    TENSOR_METADATA_SIZE,
    TENSOR_VERSION,
    _numpy,
    _Tensor,
    parse_tensor_header,
)

INVALID_PARAMS = _native.INVALID_PARAMS
#: Mooncake's ErrorCode::FILE_NOT_FOUND: ``save_tensor_to_safetensor`` of a key with no tensor.
FILE_NOT_FOUND = -1100

log = logging.getLogger("crescent.store")

# LayoutAxisKind numbers; their order is also the order of the axes in a shard's key.
AXIS_KINDS = ("dp", "tp", "ep", "pp")
_RESERVED_KIND = 4
MAX_LAYOUT_AXES = 4
LAYOUT_FULL, LAYOUT_SHARD = 0, 1
_AXIS = struct.Struct("<6iq")  # kind, axis_index, shard_rank, shard_count, split_dim, reserved0, reserved1
_MANIFEST = struct.Struct("<IHHiiiii4x8q")  # WriterShardManifest: header (28 bytes, padded to 32), global shape
MANIFEST_MAGIC = 0x574D414E
MANIFEST_VERSION = 1


def _fail(message: str) -> int:
    """Records `message` as this thread's last error; INVALID_PARAMS."""
    return _native._fail_invalid(message)


# ---- the request types, as Mooncake's binding exposes them ----


class ParallelAxis:
    """One axis of a shard's identity: ``kind`` ("tp", "dp", "ep" or "pp"), ``rank`` of
    ``size``, ``split_dim`` (the tensor dimension a layout axis such as TP splits),
    ``expert_id`` (EP) and ``stage_id`` (PP). Mooncake's constructor takes no arguments; the
    fields may also be given here as keywords."""

    __slots__ = ("kind", "rank", "size", "split_dim", "expert_id", "stage_id")

    def __init__(self, kind: str = "", rank: int = 0, size: int = 1, split_dim: int | None = None,
                 expert_id: int | None = None, stage_id: int | None = None):
        self.kind, self.rank, self.size = kind, rank, size
        self.split_dim, self.expert_id, self.stage_id = split_dim, expert_id, stage_id

    def __repr__(self) -> str:
        fields = ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__)
        return f"ParallelAxis({fields})"


class TensorParallelism:
    """The ordered axes that identify a stored or requested shard."""

    __slots__ = ("axes",)

    def __init__(self, axes: Sequence[ParallelAxis] | None = None):
        self.axes = list(axes) if axes is not None else []

    def __repr__(self) -> str:
        return f"TensorParallelism(axes={self.axes!r})"


_MODES = ("as_stored", "shard", "full")


class ReadTarget:
    """What a read wants: the object as stored (``mode="as_stored"``, the default), the shard
    ``parallelism`` names (``"shard"``) or the whole tensor (``"full"``). Modes are
    case-insensitive; another one is a RuntimeError, as in Mooncake."""

    __slots__ = ("_mode", "parallelism")

    def __init__(self, mode: str = "as_stored", parallelism: TensorParallelism | None = None):
        self.mode = mode
        self.parallelism = parallelism

    @property
    def mode(self) -> str:
        return self._mode

    @mode.setter
    def mode(self, value: str) -> None:
        mode = str(value).lower()
        if mode not in _MODES:
            raise RuntimeError("Unsupported ReadTarget mode")
        self._mode = mode

    def __repr__(self) -> str:
        return f"ReadTarget(mode={self._mode!r}, parallelism={self.parallelism!r})"


# ---- requests, parsed and checked (ParallelAxisSpec and friends) ----


class _Axis(NamedTuple):
    kind: str  # "dp", "tp", "ep", "pp"
    rank: int
    size: int
    split_dim: int | None = None
    expert_id: int | None = None
    stage_id: int | None = None


def _kind(name: Any) -> int | None:
    try:
        return AXIS_KINDS.index(str(name).lower())
    except ValueError:
        return None


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _parse_parallelism(obj: Any, context: str) -> list[_Axis] | None:
    """The axes of a ``TensorParallelism`` (any object with ``axes`` of objects with
    ``kind``, ``rank`` and ``size``); None (and the reason recorded) if it is not one."""
    if not hasattr(obj, "axes"):
        _fail(f"{context}: TensorParallelism must provide axes")
        return None
    axes = []
    for a in obj.axes:
        if not all(hasattr(a, f) for f in ("kind", "rank", "size")):
            _fail(f"{context}: ParallelAxis must provide kind, rank, and size")
            return None
        if _kind(a.kind) is None:
            _fail(f"{context}: unsupported parallel axis kind {a.kind!r}")
            return None
        try:
            axes.append(_Axis(AXIS_KINDS[_kind(a.kind)], int(a.rank), int(a.size),
                              _opt_int(getattr(a, "split_dim", None)), _opt_int(getattr(a, "expert_id", None)),
                              _opt_int(getattr(a, "stage_id", None))))
        except (TypeError, ValueError):
            _fail(f"{context}: ParallelAxis fields must be integers")
            return None
    return axes


def _check_parallelism(axes: list[_Axis] | None, context: str) -> list[_Axis] | None:
    """Mooncake's validate_parallelism_spec: 1 to 4 axes of distinct kinds, each rank within
    its size; TP with a split_dim, EP with an expert_id, PP with a stage_id, only TP with a
    split_dim."""
    if axes is None:
        return None
    if not axes:
        _fail(f"{context}: parallelism axes cannot be empty")
        return None
    if len(axes) > MAX_LAYOUT_AXES:
        _fail(f"{context}: axis count exceeds max supported axes")
        return None
    seen = set()
    for a in axes:
        if a.size <= 0 or not 0 <= a.rank < a.size:
            _fail(f"{context}: invalid rank/size for axis {a.kind} ({a.rank} of {a.size})")
            return None
        if a.kind in seen:
            _fail(f"{context}: duplicate axis kinds are not supported")
            return None
        seen.add(a.kind)
        problem = {
            "tp": None if a.split_dim is not None else "TP axis requires split_dim",
            "dp": "DP axis must not provide split_dim" if a.split_dim is not None else None,
            "ep": ("EP axis requires expert_id" if a.expert_id is None else
                   "EP axis must not provide split_dim in this phase" if a.split_dim is not None else None),
            "pp": ("PP axis requires stage_id" if a.stage_id is None else
                   "PP axis must not provide split_dim" if a.split_dim is not None else None),
        }[a.kind]
        if problem:
            _fail(f"{context}: {problem}")
            return None
    return axes


def _request(obj: Any, context: str) -> list[_Axis] | None:
    """A checked ``TensorParallelism``; None if absent or bad."""
    if obj is None:
        _fail(f"{context}: parallelism is required")
        return None
    return _check_parallelism(_parse_parallelism(obj, context), context)


class _Writer(NamedTuple):
    rank: int
    size: int
    split_dim: int


def _parse_writer(obj: Any, context: str) -> _Writer | None:
    """A ``writer_partition``: any object with ``rank``, ``size`` and ``split_dim``."""
    if not all(hasattr(obj, f) for f in ("rank", "size", "split_dim")):
        _fail(f"{context}: writer_partition must provide rank, size, and split_dim")
        return None
    w = _Writer(int(obj.rank), int(obj.size), int(obj.split_dim))
    if w.size <= 0 or not 0 <= w.rank < w.size or w.split_dim < 0:
        _fail(f"{context}: invalid writer partition {tuple(w)}")
        return None
    return w


def _canonical(axes: Sequence[_Axis]) -> list[_Axis]:
    return sorted(axes, key=lambda a: AXIS_KINDS.index(a.kind))


def _tp_index(axes: Sequence[_Axis]) -> int | None:
    return next((i for i, a in enumerate(axes) if a.kind == "tp"), None)


def _single_tp(axes: Sequence[_Axis]) -> bool:
    return len(axes) == 1 and axes[0].kind == "tp"


def _with_tp(axes: Sequence[_Axis], **changes: int) -> list[_Axis]:
    """`axes` with their TP axis' fields changed."""
    return [a._replace(**changes) if a.kind == "tp" else a for a in axes]


# ---- key names (Mooncake's) ----


def tp_key(key: str, rank: int) -> str:
    return f"{key}_tp_{rank}"


def parallelism_key(key: str, axes: Sequence[_Axis]) -> str:
    """The key of the shard `axes` name: ``<key>_tp_<rank>`` for one TP axis, else one
    ``__<kind>_<rank>of<size>[_sd<d>][_eid<e>][_sid<s>]`` per axis in DP, TP, EP, PP order."""
    if _single_tp(axes):
        return tp_key(key, axes[0].rank)
    out = key
    for a in _canonical(axes):
        out += f"__{a.kind}_{a.rank}of{a.size}"
        for tag, value in (("sd", a.split_dim), ("eid", a.expert_id), ("sid", a.stage_id)):
            if value is not None:
                out += f"_{tag}{value}"
    return out


def writer_key(key: str, w: _Writer) -> str:
    return f"{key}__writer_{w.rank}of{w.size}_sd{w.split_dim}"


def writer_manifest_key(key: str) -> str:
    return key + "__writer_manifest"


def parallelism_manifest_key(key: str) -> str:
    return key + "__parallelism_manifest"


# ---- shard headers and manifests ----


def _shape_fields(shape: Sequence[int]) -> list[int]:
    return list(shape) + [-1] * (MAX_TENSOR_DIMS - len(shape))


def shard_header(dtype: int, global_shape: Sequence[int], local_shape: Sequence[int], data_bytes: int,
                 axes: Sequence[_Axis] = (), layout: int = LAYOUT_SHARD) -> bytes:
    """Mooncake's TensorMetadata of a shard: the axes in the request's order, each with its
    rank, count and split_dim (-1 for none), EP's expert_id / PP's stage_id in reserved0 and
    the shard's extent along split_dim in reserved1."""
    packed = b""
    for i, a in enumerate(axes):
        extra = a.expert_id if a.kind == "ep" else a.stage_id if a.kind == "pp" else None
        extent = local_shape[a.split_dim] if a.split_dim is not None else 0
        packed += _AXIS.pack(AXIS_KINDS.index(a.kind), i, a.rank, a.size,
                             -1 if a.split_dim is None else a.split_dim, extra or 0, extent)
    packed += bytes(MAX_LAYOUT_AXES * _AXIS.size - len(packed))
    return (_HEADER.pack(TENSOR_MAGIC, TENSOR_VERSION, TENSOR_METADATA_SIZE, dtype, len(global_shape), layout, 0,
                         TENSOR_METADATA_SIZE, data_bytes)
            + _SHAPES.pack(*_shape_fields(global_shape), *_shape_fields(local_shape), len(axes), 0) + packed)


class _Meta(NamedTuple):
    """A parsed TensorMetadata."""

    dtype: int
    global_shape: tuple[int, ...]
    local_shape: tuple[int, ...]
    layout: int
    axes: tuple[tuple[int, int, int, int, int, int, int], ...]  # the stored LayoutAxis fields
    offset: int
    nbytes: int

    def tp_axis(self):
        return next((a for a in self.axes if a[0] == 1), None)

    def parallelism(self) -> list[_Axis] | None:
        """Mooncake's parallelism_from_metadata: the stored axes, in DP, TP, EP, PP order."""
        if self.layout != LAYOUT_SHARD:
            return None
        axes = []
        for kind, _index, rank, count, split_dim, reserved0, _extent in self.axes:
            name = AXIS_KINDS[kind] if kind < len(AXIS_KINDS) else "unknown"
            axes.append(_Axis(name, rank, count, split_dim if split_dim >= 0 else None,
                              reserved0 if name == "ep" else None, reserved0 if name == "pp" else None))
        return sorted(axes, key=lambda a: (AXIS_KINDS + ("unknown",)).index(a.kind))


def parse_metadata(raw: Any, total: int) -> _Meta | None:
    """The TensorMetadata at the start of a value of `total` bytes, checked as Mooncake's
    ValidateTensorMetadata does (its layout axes included); None if it is not one."""
    base = parse_tensor_header(raw, total)
    if base is None:
        return None
    dtype, local_shape, offset, nbytes = base
    layout = _HEADER.unpack_from(raw, 0)[5]
    fields = _SHAPES.unpack_from(raw, _HEADER.size)
    ndim = len(local_shape)
    axes = tuple(_AXIS.unpack_from(raw, _HEADER.size + _SHAPES.size + i * _AXIS.size) for i in range(fields[16]))
    for kind, _index, rank, count, split_dim, _r0, _r1 in axes:
        if not 0 <= kind <= _RESERVED_KIND or count <= 0 or not 0 <= rank < count or not -1 <= split_dim < ndim:
            return None
    return _Meta(dtype, tuple(fields[:ndim]), local_shape, layout, axes, offset, nbytes)


def _metadata_of_prefix(raw: Any) -> _Meta | None:
    """The metadata of a value of which only the first TENSOR_METADATA_SIZE bytes are at hand."""
    if len(raw) < TENSOR_METADATA_SIZE:
        return None
    offset, nbytes = _HEADER.unpack_from(raw, 0)[7:9]
    return parse_metadata(raw, offset + nbytes)


def manifest(global_shape: Sequence[int], dtype: int, split_dim: int, count: int) -> bytes:
    """Mooncake's WriterShardManifest (96 bytes), for the writer and the parallelism manifests."""
    return _MANIFEST.pack(MANIFEST_MAGIC, MANIFEST_VERSION, _MANIFEST.size, dtype, len(global_shape), split_dim, count,
                          0, *_shape_fields(global_shape))


class _Manifest(NamedTuple):
    dtype: int
    global_shape: tuple[int, ...]
    split_dim: int
    count: int


def parse_manifest(raw: Any) -> _Manifest | None:
    if raw is None or len(raw) < _MANIFEST.size:
        return None
    magic, version, size, dtype, ndim, split_dim, count, _r, *shape = _MANIFEST.unpack_from(raw, 0)
    if ((magic, version, size) != (MANIFEST_MAGIC, MANIFEST_VERSION, _MANIFEST.size) or not 0 <= ndim <= MAX_TENSOR_DIMS
            or count <= 0 or not 0 <= split_dim < ndim or any(d < 0 for d in shape[:ndim])):
        return None
    return _Manifest(dtype, tuple(shape[:ndim]), split_dim, count)


# ---- splitting a tensor ----


def _uniform(shape: Sequence[int], split_dim: int, count: int, context: str) -> bool:
    """Mooncake's validate_uniform_shard_request."""
    if not 0 <= split_dim < len(shape) or count <= 0:
        _fail(f"{context}: invalid shard parameters (split_dim {split_dim} of {len(shape)} dims, {count} shards)")
        return False
    if shape[split_dim] % count:
        _fail(f"{context}: only uniform sharding is supported ({shape[split_dim]} is not divisible by {count})")
        return False
    return True


def _shard_range(extent: int, rank: int, count: int) -> tuple[int, int]:
    """Mooncake's calculate_shard_range: (start, length) of shard `rank` of `count`."""
    if extent < 0 or count <= 0 or not 0 <= rank < count:
        return 0, 0
    start, end = extent * rank // count, extent * (rank + 1) // count
    return start, end - start


def _array(t: _Tensor):
    np = _numpy()
    np_type = _DTYPES[t.dtype][1]
    a = np.frombuffer(t.data, dtype=np_type) if t.data.nbytes else np.empty(0, dtype=np_type)
    return a.reshape(t.shape)


def _shard_of(t: _Tensor, split_dim: int, rank: int, count: int) -> _Tensor:
    """Shard `rank` of `count` of `t` along `split_dim` (uniform sharding checked before)."""
    start, length = _shard_range(t.shape[split_dim], rank, count)
    part = _numpy().ascontiguousarray(_array(t)[(slice(None),) * split_dim + (slice(start, start + length),)])
    return _Tensor(t.dtype, tuple(part.shape), memoryview(part).cast("B") if part.size else memoryview(b""))


# ---- a tensor's shards as objects to write ----


class _Object(NamedTuple):
    """One object to write: its key and its parts (header, data)."""

    key: str
    parts: tuple[Any, ...]


def _shard_object(key: str, full: _Tensor, shard: _Tensor, axes: Sequence[_Axis],
                  global_shape: Sequence[int] | None = None) -> _Object:
    header = shard_header(shard.dtype, full.shape if global_shape is None else global_shape, shard.shape,
                          shard.data.nbytes, axes)
    return _Object(key, (header, shard.data))


def _tp_split(key: str, t: _Tensor, size: int, split_dim: int, axes: Sequence[_Axis] | None,
              context: str) -> list[_Object] | None:
    """All `size` TP shards of the full tensor `t` (Mooncake's build_tp_shard_infos): under
    ``<key>_tp_<rank>`` with one TP axis when `axes` is None, else under the key of `axes`
    with their TP rank set."""
    if not _uniform(t.shape, split_dim, size, context):
        return None
    out = []
    for rank in range(size):
        shard_axes = ([_Axis("tp", rank, size, split_dim)] if axes is None else _with_tp(axes, rank=rank))
        out.append(_shard_object(parallelism_key(key, shard_axes), t, _shard_of(t, split_dim, rank, size),
                                 shard_axes))
    return out
