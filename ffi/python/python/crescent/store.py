"""The store client, as ``mooncake.store`` names it: ``MooncakeDistributedStore``, the
per-put ``ReplicateConfig``, the enums and descriptor types, and the tensor methods.

``MooncakeDistributedStore`` is the native client (``crescent._crescent``) with the tensor
methods of Mooncake's binding added here: values in Mooncake's tensor layout (a 304-byte
header, then the data), readable by either side. They take numpy arrays, torch tensors (when
torch is importable), objects with ``__dlpack__`` and buffer-protocol objects; they return
torch tensors when torch is importable, numpy arrays otherwise. The class can be subclassed
(Mooncake's ``MooncakeDistributedStoreAsync`` pattern); ``MooncakeDistributedStoreAsync``
here is that subclass, and ``AsyncStore`` wraps a store in coroutines.

``CrescentStore`` is the same class under Crescent's name.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import struct
from collections.abc import Sequence
from typing import Any

import crescent._crescent as _native
from crescent._crescent import (
    BufferHandle,
    Descriptor,
    DiskDescriptor,
    MemoryDescriptor,
    ObjectDataType,
    ReplicaDescriptor,
    ReplicaStatus,
    ReplicateConfig,
    SoftPinAction,
)

INVALID_PARAMS = _native.INVALID_PARAMS

# ---- Mooncake's tensor layout (integration_utils.h): a TensorMetadata header, then data ----

TENSOR_MAGIC = 0x4D4F4F4E
TENSOR_VERSION = 1
MAX_TENSOR_DIMS = 8
_HEADER = struct.Struct("<IHHiiIIQQ")  # magic, version, header_size, dtype, ndim, layout, flags, offset, bytes
_SHAPES = struct.Struct("<8q8qII")  # global shape, local shape, axis count, reserved
_AXES_BYTES = 4 * 32  # four LayoutAxis of 6 int32 + 1 int64, unused for a full tensor
TENSOR_METADATA_SIZE = _HEADER.size + _SHAPES.size + _AXES_BYTES  # 304

# Mooncake's TensorDtype numbers, with numpy's type of the same bytes (bfloat16 and the
# float8 kinds have none: their bits as uint16 / uint8).
_DTYPES = [
    ("float32", "<f4"), ("float64", "<f8"), ("int8", "i1"), ("uint8", "u1"), ("int16", "<i2"),
    ("uint16", "<u2"), ("int32", "<i4"), ("uint32", "<u4"), ("int64", "<i8"), ("uint64", "<u8"),
    ("bool", "?"), ("float16", "<f2"), ("bfloat16", "<u2"), ("float8_e4m3fn", "u1"), ("float8_e5m2", "u1"),
]
_NUMPY_CODE = {"f4": 0, "f8": 1, "i1": 2, "u1": 3, "i2": 4, "u2": 5, "i4": 6, "u4": 7, "i8": 8, "u8": 9, "b1": 10,
               "f2": 11}


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def _numpy():
    import numpy

    return numpy


class _Tensor:
    """A tensor's Mooncake dtype number, shape and bytes (C order)."""

    __slots__ = ("dtype", "shape", "data")

    def __init__(self, dtype: int, shape: tuple[int, ...], data: memoryview):
        self.dtype, self.shape, self.data = dtype, shape, data


def _as_tensor(obj: Any) -> _Tensor | None:
    """The dtype, shape and bytes of a torch tensor, numpy array, ``__dlpack__`` object or
    buffer; None if it is none of them or has a dtype Mooncake's layout lacks."""
    np = _numpy()
    torch = _torch()
    if torch is not None and isinstance(obj, torch.Tensor):
        names = [name for name, _ in _DTYPES]
        name = str(obj.dtype).removeprefix("torch.")
        if name not in names or obj.dim() > MAX_TENSOR_DIMS:
            return None
        t = obj.detach().cpu().contiguous()
        flat = t.reshape(-1)
        raw = flat.to(torch.uint8) if name == "bool" else flat.view(torch.uint8)
        return _Tensor(names.index(name), tuple(t.shape), memoryview(raw.numpy().tobytes()))
    if not isinstance(obj, np.ndarray):
        if hasattr(obj, "__dlpack__"):
            try:
                obj = np.from_dlpack(obj)
            except (BufferError, RuntimeError, TypeError):
                return None
        else:
            try:
                obj = np.asarray(memoryview(obj))
            except TypeError:
                return None
    a = np.ascontiguousarray(obj)
    code = _NUMPY_CODE.get(f"{a.dtype.kind}{a.dtype.itemsize}")
    if code is None or a.ndim > MAX_TENSOR_DIMS:
        return None
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    return _Tensor(code, tuple(a.shape), memoryview(a).cast("B") if a.size else memoryview(b""))


def tensor_header(dtype: int, shape: Sequence[int], data_bytes: int) -> bytes:
    """Mooncake's TensorMetadata of a full (unsharded) tensor."""
    dims = list(shape) + [-1] * (MAX_TENSOR_DIMS - len(shape))
    return (_HEADER.pack(TENSOR_MAGIC, TENSOR_VERSION, TENSOR_METADATA_SIZE, dtype, len(shape), 0, 0,
                         TENSOR_METADATA_SIZE, data_bytes)
            + _SHAPES.pack(*dims, *dims, 0, 0) + bytes(_AXES_BYTES))


def parse_tensor_header(raw: bytes | memoryview, total: int) -> tuple[int, tuple[int, ...], int, int] | None:
    """(dtype, shape, data offset, data bytes) of a value of `total` bytes starting with
    `raw`, checked as Mooncake's ValidateTensorMetadata does; None if it is not one."""
    if total < TENSOR_METADATA_SIZE or len(raw) < TENSOR_METADATA_SIZE:
        return None
    magic, version, header_size, dtype, ndim, layout, _flags, offset, nbytes = _HEADER.unpack_from(raw, 0)
    fields = _SHAPES.unpack_from(raw, _HEADER.size)
    global_shape, local_shape, axis_count = fields[:8], fields[8:16], fields[16]
    if (magic, version, header_size) != (TENSOR_MAGIC, TENSOR_VERSION, TENSOR_METADATA_SIZE):
        return None
    if not 0 <= dtype < len(_DTYPES) or not 0 <= ndim <= MAX_TENSOR_DIMS or layout > 1 or axis_count > 4:
        return None
    if not TENSOR_METADATA_SIZE <= offset <= total or nbytes != total - offset:
        return None
    if any(d < 0 for d in global_shape[:ndim] + local_shape[:ndim]):
        return None
    if any(d != -1 for d in global_shape[ndim:] + local_shape[ndim:]):
        return None
    shape = tuple(local_shape[:ndim])
    numel = 1
    for d in shape:
        numel *= d
    if numel * _numpy().dtype(_DTYPES[dtype][1]).itemsize != nbytes:
        return None
    return dtype, shape, offset, nbytes


def _to_tensor(dtype: int, shape: tuple[int, ...], data: Any, copy: bool) -> Any:
    """The tensor of those bytes: torch when importable (bfloat16 / float8 as themselves),
    numpy otherwise."""
    np = _numpy()
    name, np_type = _DTYPES[dtype]
    a = np.frombuffer(data, dtype=np_type) if len(data) else np.empty(0, dtype=np_type)
    if copy:
        a = a.copy()
    a = a.reshape(shape)
    torch = _torch()
    if torch is None:
        return a
    if not a.flags.writeable:
        a = a.copy()
    t = torch.from_numpy(a)
    if name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        t = t.view(getattr(torch, name))
    return t


def _tensor_of_value(raw: Any, total: int, copy: bool) -> Any:
    parsed = parse_tensor_header(raw, total)
    if parsed is None:
        return None
    dtype, shape, offset, nbytes = parsed
    return _to_tensor(dtype, shape, memoryview(raw)[offset:offset + nbytes], copy)


def _memory_at(addr: int, size: int) -> memoryview:
    """`size` bytes of process memory at `addr` (registered memory the caller owns)."""
    return memoryview((ctypes.c_char * size).from_address(addr)).cast("B") if size else memoryview(b"")


def _address(buffer: Any) -> int:
    """An int address, or the address of a buffer object's bytes."""
    if isinstance(buffer, int) or (hasattr(buffer, "__index__") and not hasattr(buffer, "__len__")):
        return buffer.__index__()
    np = _numpy()
    return np.frombuffer(memoryview(buffer), dtype=np.uint8).ctypes.data


class MooncakeDistributedStore(_native.MooncakeDistributedStore):
    __doc__ = _native.MooncakeDistributedStore.__doc__

    # ---- tensor puts ----

    def _tensor_value(self, key: str, tensor: Any) -> bytes | None:
        t = _as_tensor(tensor)
        if t is None:
            _native._fail_invalid(f"{key}: not a tensor Mooncake's layout can hold (torch tensor, numpy array, "
                                  "__dlpack__ or buffer object of a supported dtype, at most 8 dimensions)")
            return None
        return tensor_header(t.dtype, t.shape, t.data.nbytes) + t.data.tobytes()

    def _put_tensors(self, keys: Sequence[str], tensors: Sequence[Any], config: Any, upsert: bool) -> list[int]:
        keys = list(keys)
        tensors = list(tensors)
        if len(keys) != len(tensors):
            _native._fail_invalid(f"{len(keys)} keys but {len(tensors)} tensors")
            return [INVALID_PARAMS] * len(keys)
        results = [0] * len(keys)
        ok_keys, values, where = [], [], []
        for i, (key, tensor) in enumerate(zip(keys, tensors)):
            value = self._tensor_value(key, tensor)
            if value is None:
                results[i] = INVALID_PARAMS
            else:
                ok_keys.append(key)
                values.append(value)
                where.append(i)
        for i, key, value in zip(where, ok_keys, values):
            put = self.upsert if upsert else self.put
            results[i] = put(key, value, config) if config is not None else put(key, value)
        return results

    def put_tensor(self, key: str, tensor: Any) -> int:
        """Stores a tensor in Mooncake's layout; 0 or a negative code."""
        return self._put_tensors([key], [tensor], None, False)[0]

    def pub_tensor(self, key: str, tensor: Any, config: ReplicateConfig | None = None) -> int:
        """``put_tensor`` placed as ``config`` asks."""
        return self._put_tensors([key], [tensor], config, False)[0]

    def upsert_tensor(self, key: str, tensor: Any) -> int:
        """``put_tensor`` replacing the key's value if it has one."""
        return self._put_tensors([key], [tensor], None, True)[0]

    def upsert_pub_tensor(self, key: str, tensor: Any, config: ReplicateConfig | None = None) -> int:
        return self._put_tensors([key], [tensor], config, True)[0]

    def batch_put_tensor(self, keys: Sequence[str], tensors_list: Sequence[Any]) -> list[int]:
        """A status per key (INVALID_PARAMS for each when the lists' lengths differ)."""
        return self._put_tensors(keys, tensors_list, None, False)

    def batch_pub_tensor(self, keys: Sequence[str], tensors_list: Sequence[Any],
                         config: ReplicateConfig | None = None) -> list[int]:
        return self._put_tensors(keys, tensors_list, config, False)

    def batch_upsert_tensor(self, keys: Sequence[str], tensors_list: Sequence[Any]) -> list[int]:
        return self._put_tensors(keys, tensors_list, None, True)

    def batch_upsert_pub_tensor(self, keys: Sequence[str], tensors_list: Sequence[Any],
                                config: ReplicateConfig | None = None) -> list[int]:
        return self._put_tensors(keys, tensors_list, config, True)

    def _tensors_from(self, keys: Sequence[str], buffer_ptrs: Sequence[Any], sizes: Sequence[int],
                      upsert: bool) -> list[int]:
        keys, buffer_ptrs, sizes = list(keys), list(buffer_ptrs), list(sizes)
        if not keys:
            return []
        if not len(keys) == len(buffer_ptrs) == len(sizes):
            _native._fail_invalid("keys, buffer_ptrs and sizes must have the same length")
            return [INVALID_PARAMS] * len(keys)
        for i, (ptr, size) in enumerate(zip(buffer_ptrs, sizes)):
            addr = _address(ptr)
            if addr == 0 or size < TENSOR_METADATA_SIZE:
                _native._fail_invalid(f"buffer {i}: null, or smaller than the tensor header ({size} bytes)")
                return [INVALID_PARAMS] * len(keys)
            if parse_tensor_header(_memory_at(addr, TENSOR_METADATA_SIZE), size) is None:
                _native._fail_invalid(f"buffer {i}: not a tensor in Mooncake's layout")
                return [INVALID_PARAMS] * len(keys)
        call = self.batch_upsert_from if upsert else self.batch_put_from
        return call(keys, buffer_ptrs, sizes)

    def put_tensor_from(self, key: str, buffer_ptr: Any, size: int) -> int:
        """Stores registered memory laid out as [header][data] (as ``get_tensor_into`` leaves
        it); INVALID_PARAMS if it is not a tensor in Mooncake's layout."""
        return self._tensors_from([key], [buffer_ptr], [size], False)[0]

    def batch_put_tensor_from(self, keys: Sequence[str], buffer_ptrs: Sequence[Any],
                              sizes: Sequence[int]) -> list[int]:
        return self._tensors_from(keys, buffer_ptrs, sizes, False)

    def upsert_tensor_from(self, key: str, buffer_ptr: Any, size: int) -> int:
        return self._tensors_from([key], [buffer_ptr], [size], True)[0]

    def batch_upsert_tensor_from(self, keys: Sequence[str], buffer_ptrs: Sequence[Any],
                                 sizes: Sequence[int]) -> list[int]:
        return self._tensors_from(keys, buffer_ptrs, sizes, True)

    # ---- tensor gets ----

    def get_tensor(self, key: str) -> Any:
        """The tensor under ``key`` (torch if importable, else numpy); None if it is missing
        or not a tensor."""
        handle = self.get_buffer(key)
        if handle is None:
            return None
        return _tensor_of_value(handle, handle.size(), copy=True)

    def batch_get_tensor(self, keys: Sequence[str]) -> list[Any]:
        handles = self.batch_get_buffer(list(keys))
        return [None if h is None else _tensor_of_value(h, h.size(), copy=True) for h in handles]

    def get_tensor_into(self, key: str, buffer_ptr: Any, size: int) -> Any:
        """Reads the value into registered memory and returns a tensor over it (no copy);
        None on failure."""
        addr = _address(buffer_ptr)
        if addr == 0:
            _native._fail_invalid("get_tensor_into: the buffer pointer is null")
            return None
        n = self.get_into(key, buffer_ptr, size)
        if n < 0:
            return None
        return _tensor_of_value(_memory_at(addr, n), n, copy=False)

    def batch_get_tensor_into(self, keys: Sequence[str], buffer_ptrs: Sequence[Any],
                              sizes: Sequence[int]) -> list[Any]:
        """A tensor (over its buffer) or None per key; INVALID_PARAMS for each key when the
        lists' lengths differ or a pointer is null (as in Mooncake)."""
        keys, buffer_ptrs, sizes = list(keys), list(buffer_ptrs), list(sizes)
        if not len(keys) == len(buffer_ptrs) == len(sizes):
            _native._fail_invalid("keys, buffer_ptrs and sizes must have the same length")
            return [INVALID_PARAMS] * len(keys)
        addrs = [_address(p) for p in buffer_ptrs]
        if any(a == 0 for a in addrs):
            _native._fail_invalid("batch_get_tensor_into: a buffer pointer is null")
            return [INVALID_PARAMS] * len(keys)
        lengths = self.batch_get_into(keys, buffer_ptrs, sizes)
        return [None if n < 0 else _tensor_of_value(_memory_at(a, n), n, copy=False) for a, n in zip(addrs, lengths)]

    def get_tensor_into_cuda(self, key: str, tensor: Any) -> int:
        """GPU destinations need Mooncake's standalone (dummy) client: INVALID_PARAMS, as
        Mooncake answers a client set up with ``setup``."""
        _native._fail_invalid("get_tensor_into_cuda needs GPU memory through a standalone client: not supported")
        return INVALID_PARAMS

    def batch_get_tensor_into_cuda(self, keys: Sequence[str], tensors_list: Sequence[Any]) -> list[int]:
        _native._fail_invalid("batch_get_tensor_into_cuda needs GPU memory through a standalone client: not supported")
        return [INVALID_PARAMS] * len(list(keys))


class MooncakeDistributedStoreAsync(MooncakeDistributedStore):
    """Mooncake's asyncio pattern: ``await store.async_<method>(...)`` runs ``<method>`` in
    the event loop's default executor."""

    def __getattr__(self, name: str):
        if not name.startswith("async_"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        method = getattr(self, name[len("async_"):], None)
        if method is None or not callable(method):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

        @functools.wraps(method)
        async def call(*args, **kwargs):
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(None, functools.partial(method, *args, **kwargs))

        setattr(self, name, call)
        return call


class AsyncStore:
    """Coroutines over a store: ``await AsyncStore(store).get(key)`` runs ``store.get(key)``
    in ``executor`` (the loop's default one if None). The store's calls release the GIL, so
    several run at once."""

    def __init__(self, store: MooncakeDistributedStore, executor: Any = None):
        self.store = store
        self.executor = executor

    def __getattr__(self, name: str):
        method = getattr(self.store, name)
        if not callable(method):
            return method

        @functools.wraps(method)
        async def call(*args, **kwargs):
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self.executor, functools.partial(method, *args, **kwargs))

        return call


CrescentStore = MooncakeDistributedStore

# Mooncake exports the values of these enums at module level (pybind's export_values).
for _enum in (ObjectDataType, ReplicaStatus):
    for _name in dir(_enum):
        if _name.isupper():
            globals()[_name] = getattr(_enum, _name)
del _enum, _name

__all__ = [
    "AsyncStore",
    "BufferHandle",
    "CrescentStore",
    "Descriptor",
    "DiskDescriptor",
    "MemoryDescriptor",
    "MooncakeDistributedStore",
    "MooncakeDistributedStoreAsync",
    "ObjectDataType",
    "ReplicaDescriptor",
    "ReplicaStatus",
    "ReplicateConfig",
    "SoftPinAction",
    "TENSOR_METADATA_SIZE",
    "parse_tensor_header",
    "tensor_header",
]
