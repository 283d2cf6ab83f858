"""Mooncake's tensor value layout (integration_utils.h): a 304-byte ``TensorMetadata`` header
(``TensorObjectHeader`` then ``TensorLayoutMetadata``), then the data in C order; and the
conversions between it and numpy arrays / torch tensors (torch only where importable)."""

from __future__ import annotations

import ctypes
import struct
import sys
from collections.abc import Sequence
from typing import Any

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


#: Set once ``import torch`` failed: a failed import is not remembered by Python and searches
#: every directory of sys.path again (about 0.25 ms per get_tensor_with_tp call, which asks
#: twice).
_no_torch = False


def _torch():
    global _no_torch
    torch = sys.modules.get("torch")
    if torch is not None or _no_torch:
        return torch
    try:
        import torch
    except ImportError:
        _no_torch = True
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
        # The tensor's own bytes (numpy's view of them), not a copy.
        return _Tensor(names.index(name), tuple(t.shape), memoryview(raw.numpy()))
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
