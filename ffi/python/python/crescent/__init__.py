"""Crescent: a zero-copy transfer engine and distributed KV-cache store.

Drop-in for Mooncake's Python API: ``from crescent.store import MooncakeDistributedStore``
(also ``crescent.CrescentStore``) and ``from crescent.engine import TransferEngine`` (also
``crescent.TransferEngine``) with Mooncake's method names, argument order and return
conventions. Status codes are Mooncake's numbers (module constants such as
``crescent.OBJECT_NOT_FOUND``); ``crescent.last_error()`` gives the message of this thread's
last failed call.
"""

from crescent._crescent import (
    BUFFER_OVERFLOW,
    CHECKSUM_MISMATCH,
    CLIENT_NOT_FOUND,
    INTERNAL_ERROR,
    INVALID_HANDLE,
    INVALID_PARAMS,
    INVALID_REPLICA,
    LEASE_EXPIRED,
    NO_AVAILABLE_HANDLE,
    OBJECT_ALREADY_EXISTS,
    OBJECT_HAS_LEASE,
    OBJECT_NOT_FOUND,
    OK,
    REPLICA_IS_NOT_READY,
    RPC_FAIL,
    SEGMENT_ALREADY_EXISTS,
    SEGMENT_NOT_FOUND,
    TRANSFER_FAIL,
    UNAVAILABLE_IN_CURRENT_STATUS,
    ReplicateConfig,
    SoftPinAction,
    TransferEngine,
    __version__,
    last_error,
    status_name,
)

from crescent import engine, store  # noqa: E402  (submodules mirroring mooncake.store / mooncake.engine)
from crescent.store import AsyncStore, MooncakeDistributedStore  # noqa: E402

CrescentStore = MooncakeDistributedStore

__all__ = [
    "BUFFER_OVERFLOW",
    "CHECKSUM_MISMATCH",
    "CLIENT_NOT_FOUND",
    "INTERNAL_ERROR",
    "INVALID_HANDLE",
    "INVALID_PARAMS",
    "INVALID_REPLICA",
    "LEASE_EXPIRED",
    "NO_AVAILABLE_HANDLE",
    "OBJECT_ALREADY_EXISTS",
    "OBJECT_HAS_LEASE",
    "OBJECT_NOT_FOUND",
    "OK",
    "REPLICA_IS_NOT_READY",
    "RPC_FAIL",
    "SEGMENT_ALREADY_EXISTS",
    "SEGMENT_NOT_FOUND",
    "TRANSFER_FAIL",
    "UNAVAILABLE_IN_CURRENT_STATUS",
    "AsyncStore",
    "CrescentStore",
    "MooncakeDistributedStore",
    "ReplicateConfig",
    "SoftPinAction",
    "TransferEngine",
    "__version__",
    "engine",
    "last_error",
    "status_name",
    "store",
]
