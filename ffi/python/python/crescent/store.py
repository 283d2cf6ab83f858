"""The store client, as ``mooncake.store`` names it: ``MooncakeDistributedStore``, the
per-put ``ReplicateConfig``, the enums and descriptor types, and the tensor methods.

``MooncakeDistributedStore`` is the native client (``crescent._crescent``) with the tensor
methods of Mooncake's binding added here: values in Mooncake's tensor layout (a 304-byte
header, then the data), readable by either side. They take numpy arrays, torch tensors (when
torch is importable), objects with ``__dlpack__`` and buffer-protocol objects; they return
torch tensors when torch is importable, numpy arrays otherwise. The sharded forms
(``*_tensor_with_tp*``, ``*_tensor_with_parallelism*`` with ``ParallelAxis``,
``TensorParallelism`` and ``ReadTarget``) and the safetensors files come from
``crescent.tensor_parallel``. The class can be subclassed
(Mooncake's ``MooncakeDistributedStoreAsync`` pattern); ``MooncakeDistributedStoreAsync``
here is that subclass, and ``AsyncStore`` wraps a store in coroutines.

``CrescentStore`` is the same class under Crescent's name.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Sequence
from typing import Any

import crescent._crescent as _native
from crescent._crescent import (
    BufferHandle,
    Descriptor,
    DiskDescriptor,
    MemoryDescriptor,
    MooncakeHostMemAllocator,
    ObjectDataType,
    QueryTaskResponse,
    ReplicaDescriptor,
    ReplicaStatus,
    ReplicateConfig,
    SoftPinAction,
    TaskStatus,
    TaskType,
    bind_to_numa_node,
    get_alloc_func_addr,
    get_free_func_addr,
)
from crescent._tensor import (  # noqa: F401  (the layout's helpers, kept importable from here)
    MAX_TENSOR_DIMS,
    TENSOR_MAGIC,
    TENSOR_METADATA_SIZE,
    TENSOR_VERSION,
    _address,
    _as_tensor,
    _memory_at,
    _tensor_of_value,
    _to_tensor,
    parse_tensor_header,
    tensor_header,
)
from crescent.buffer_pool import (
    BufferLease,
    BufferLeaseView,
    BufferPool,
    RegisteredBufferLease,
    RegisteredBufferLeaseView,
    RegisteredBufferPool,
)
from crescent.engram import EngramStore, EngramStoreConfig
from crescent.tensor_parallel import ParallelAxis, ReadTarget, ShardedTensorMethods, TensorParallelism

INVALID_PARAMS = _native.INVALID_PARAMS
_log = logging.getLogger("crescent.store")


class MooncakeDistributedStore(ShardedTensorMethods, _native.MooncakeDistributedStore):
    __doc__ = _native.MooncakeDistributedStore.__doc__

    def _get_pyclient_capsule(self) -> MooncakeDistributedStore:
        """Mooncake's handle of the client for its helper classes (``BufferPool``,
        ``EngramStore``); Crescent's store is its own client, so the store itself."""
        return self

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


def _tensor_metadata_size() -> int:
    """The size of Mooncake's tensor header in front of a tensor value (304 bytes)."""
    return TENSOR_METADATA_SIZE


def _serialize_tensor(tensor: Any) -> tuple[bytes, int, int, Any]:
    """Mooncake's ``(header, data address, data bytes, owner)`` of a tensor: the header a
    value of it starts with, and where its bytes are (C order; ``owner`` keeps them alive).
    ``ValueError`` for what Mooncake's layout cannot hold."""
    t = _as_tensor(tensor)
    if t is None:
        raise ValueError("unsupported tensor for Mooncake tensor serialization")
    nbytes = t.data.nbytes
    addr = _address(t.data) if nbytes else 0
    return tensor_header(t.dtype, t.shape, nbytes), addr, nbytes, t.data


def _deserialize_tensor(payload: bytes) -> Any:
    """The tensor of a value in Mooncake's layout (a copy of its bytes); ``ValueError`` for
    bytes that are not one."""
    tensor = _tensor_of_value(payload, len(payload), copy=True)
    if tensor is None:
        raise ValueError("invalid serialized Mooncake tensor payload")
    return tensor


def _get_pyclient_from_wrapper(wrapper: Any) -> Any:
    """Mooncake's handle of a store's client for its helper classes; here the store itself,
    which ``BufferPool`` and ``EngramStore`` take."""
    return wrapper._get_pyclient_capsule()


class MooncakeDistributedNoFRegister:
    """Mooncake's registration of NVMe-oF SSDs (SPDK targets) with the master: hardware
    Crescent does not drive. Both calls log why and answer -1, Mooncake's failure code for
    them (as when its master cannot be reached)."""

    def real_register(self, nqn: str = "", nsid: int = 1, traddr: str = "", trsvcid: int = 4420, base: int = 0,
                      size: int = 1024, master_server_addr: str = "127.0.0.1:50051") -> int:
        return self._unsupported(f"real_register({nqn!r}, nsid={nsid}, traddr={traddr!r})")

    def real_unregister_by_endpoint(self, nqn: str = "", nsid: int = 1, traddr: str = "", trsvcid: int = 4420,
                                    master_server_addr: str = "127.0.0.1:50051") -> int:
        return self._unsupported(f"real_unregister_by_endpoint({nqn!r}, nsid={nsid}, traddr={traddr!r})")

    @staticmethod
    def _unsupported(call: str) -> int:
        message = f"{call}: NVMe-oF segments are not supported by Crescent (no SPDK / NVMe-oF transport)"
        _log.error("%s", message)
        _native._fail_invalid(message)
        return -1


CrescentStore = MooncakeDistributedStore

# Mooncake exports the values of these enums at module level (pybind's export_values); as in
# Mooncake, TaskStatus's PROCESSING and FAILED are the ones left at module level.
for _enum in (ObjectDataType, ReplicaStatus, TaskType, TaskStatus):
    for _name in dir(_enum):
        if _name.isupper():
            globals()[_name] = getattr(_enum, _name)
del _enum, _name

__all__ = [
    "AsyncStore",
    "BufferHandle",
    "BufferLease",
    "BufferLeaseView",
    "BufferPool",
    "CrescentStore",
    "Descriptor",
    "DiskDescriptor",
    "EngramStore",
    "EngramStoreConfig",
    "MemoryDescriptor",
    "MooncakeDistributedNoFRegister",
    "MooncakeDistributedStore",
    "MooncakeHostMemAllocator",
    "MooncakeDistributedStoreAsync",
    "ObjectDataType",
    "ParallelAxis",
    "QueryTaskResponse",
    "ReadTarget",
    "RegisteredBufferLease",
    "RegisteredBufferLeaseView",
    "RegisteredBufferPool",
    "ReplicaDescriptor",
    "ReplicaStatus",
    "ReplicateConfig",
    "SoftPinAction",
    "TENSOR_METADATA_SIZE",
    "_deserialize_tensor",
    "_get_pyclient_from_wrapper",
    "_serialize_tensor",
    "_tensor_metadata_size",
    "TaskStatus",
    "TaskType",
    "TensorParallelism",
    "bind_to_numa_node",
    "get_alloc_func_addr",
    "get_free_func_addr",
    "parse_tensor_header",
    "tensor_header",
]
