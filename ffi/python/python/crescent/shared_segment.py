"""Named blocks of torch tensors in one shared host segment (``mooncake.shared_segment``).

The KV cache of an MLA model is the same on every rank of a tensor-parallel group; offloading it
per rank keeps one copy per rank. Here one rank (``owner_rank``) holds the pages and every rank
of the group maps them (``crescent.engine.SharedSegment``), and each rank sees the same blocks of
tensors at the same offsets:

    seg = create_shared_segment(
        "kv",
        blocks={"k": dict(count=layers, shape=k_shape, dtype=torch.bfloat16),
                "v": dict(count=layers, shape=v_shape, dtype=torch.bfloat16)},
        world_size=tp_size, rank_id=tp_rank, comm_group=tp_group,
    )
    k_caches = seg.tensors("k")   # one host tensor per layer, shared by the group

torch is imported when a segment is created, not when this module is: importing it needs only
Crescent. The blobs are all-gathered over ``comm_group`` (a torch process group with a CPU
backend, or an object whose ``cpu_group`` is one); with ``world_size`` 1 none is needed.
Crescent maps host memory only (``mmap=True``): the VMM path and device registration raise
``SharedSegmentError``, and ``tensors()`` are CPU tensors.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from crescent.engine import SharedSegment as _Native

__all__ = ["SharedSegment", "SharedSegmentError", "create_shared_segment", "shared_segment_supported"]

#: Each block starts on a page.
_PAGE = 4096


class SharedSegmentError(RuntimeError):
    """A shared segment could not be created, completed or addressed."""


def shared_segment_supported(mmap: bool = True, host_register: bool = False) -> bool:
    """Whether this build shares memory that way (POSIX shared memory: ``mmap=True`` alone)."""
    return _Native.supported(mmap, host_register)


@dataclass(frozen=True)
class _Block:
    count: int
    shape: tuple[int, ...]
    dtype: Any
    nbytes: int


def _torch() -> Any:
    try:
        import torch
    except ImportError as e:
        raise SharedSegmentError("create_shared_segment needs torch, which is not installed") from e
    return torch


def _block(torch: Any, name: str, spec: Mapping[str, Any]) -> _Block:
    try:
        count = int(spec["count"])
        shape = tuple(int(d) for d in spec["shape"])
        dtype = spec["dtype"]
    except (KeyError, TypeError, ValueError) as e:
        raise SharedSegmentError(f"block {name!r}: give count, shape and dtype") from e
    if count < 1:
        raise SharedSegmentError(f"block {name!r}: count must be positive, not {count}")
    if not shape or min(shape) < 1:
        raise SharedSegmentError(f"block {name!r}: every dimension of shape must be positive, not {shape}")
    nbytes = torch.empty(0, dtype=dtype).element_size()
    for d in shape:
        nbytes *= d
    return _Block(count, shape, dtype, nbytes)


def _round_up(n: int) -> int:
    return -(-n // _PAGE) * _PAGE


def _group(comm_group: Any, tp_group: Any) -> Any:
    if tp_group is not None and comm_group is not None and comm_group is not tp_group:
        raise SharedSegmentError("give comm_group only (tp_group is its old name)")
    return comm_group if comm_group is not None else tp_group


def _cpu_group(group: Any) -> Any:
    return getattr(group, "cpu_group", None) or group


def _agree(torch: Any, error: str, world_size: int, rank_id: int, group: Any, phase: str) -> None:
    """Raises on every rank when any rank failed `phase`, naming each failure."""
    if world_size == 1:
        if error:
            raise SharedSegmentError(error)
        return
    if group is None:
        raise SharedSegmentError("comm_group is needed when world_size > 1")
    failures: list[Any] = [None] * world_size
    torch.distributed.all_gather_object(failures, (rank_id, error) if error else None, group=_cpu_group(group))
    failed = [f for f in failures if f is not None]
    if failed:
        raise SharedSegmentError(f"shared segment {phase} failed: " + "; ".join(f"rank {r}: {m}" for r, m in failed))


def _all_gather(torch: Any, blob: bytes, world_size: int, group: Any) -> list[bytes]:
    mine = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
    everyone = [torch.empty_like(mine) for _ in range(world_size)]
    torch.distributed.all_gather(everyone, mine, group=_cpu_group(group))
    return [bytes(t.numpy()) for t in everyone]


def create_shared_segment(
    name: str,
    blocks: Mapping[str, Mapping[str, Any]],
    world_size: int,
    rank_id: int,
    owner_rank: int = 0,
    device_id: int | None = None,
    comm_group: Any = None,
    mmap: bool = True,
    host_register: bool = False,
    *,
    tp_group: Any = None,
) -> SharedSegment:
    """Creates the segment on every rank of the group (each rank calls this with the same
    declaration) and returns it ready. ``blocks`` maps a block's name to ``count`` tensors of
    ``shape`` and ``dtype``; a rank that declared anything else makes every rank raise."""
    torch = _torch()
    group = _group(comm_group, tp_group)
    if host_register and not mmap:
        raise SharedSegmentError("host_register needs mmap=True")
    if not shared_segment_supported(mmap, host_register):
        what = "the VMM path (mmap=False)" if not mmap else "device registration (host_register=True)"
        raise SharedSegmentError(f"Crescent does not support {what} for shared segments")
    if not blocks:
        raise SharedSegmentError("a shared segment needs at least one block")
    names = sorted(blocks)
    specs = {n: _block(torch, n, blocks[n]) for n in names}
    offsets, stride = {}, 0
    for n in names:
        offsets[n] = stride
        stride += _round_up(specs[n].nbytes)
    total = stride * max(b.count for b in specs.values())
    # The layout goes into the name, so that the native fingerprint catches a rank whose
    # blocks differ in count, shape or dtype.
    layout = ";".join(f"{n}:{b.count}:{'x'.join(map(str, b.shape))}:{b.dtype}" for n, b in specs.items())
    device = 0 if device_id is None else device_id

    native, blob, error = None, b"", ""
    try:
        native, blob = _Native.create(f"{name}|{layout}", total, world_size, rank_id, owner_rank, device, mmap,
                                      host_register)
    except RuntimeError as e:
        error = str(e)
    _agree(torch, error, world_size, rank_id, group, "create")

    error = ""
    try:
        blobs = [blob] if world_size == 1 else _all_gather(torch, blob, world_size, group)
        native.complete(blobs)
    except RuntimeError as e:
        error = str(e)
    _agree(torch, error, world_size, rank_id, group, "complete")
    return SharedSegment(native, specs, offsets, stride)


class SharedSegment:
    """A ready segment: ``tensors(block)`` are views of its memory, shared by the group. Keep
    it (or its tensors: each holds it) alive while they are used."""

    def __init__(self, native: Any, specs: dict[str, _Block], offsets: dict[str, int], stride: int) -> None:
        self._native = native
        self._specs = specs
        self._offsets = offsets
        self._stride = stride

    def tensors(self, block: str) -> list[Any]:
        """The ``count`` tensors of ``block``, in order: CPU tensors over the shared pages (no
        copy)."""
        torch = _torch()
        spec = self._specs.get(block)
        if spec is None:
            raise SharedSegmentError(f"no block {block!r} (blocks: {sorted(self._specs)})")
        base = self._native.base_addr()
        views = []
        for i in range(spec.count):
            addr = base + self._offsets[block] + i * self._stride
            memory = (ctypes.c_uint8 * spec.nbytes).from_address(addr)
            view = torch.frombuffer(memory, dtype=spec.dtype).view(spec.shape)
            view._crescent_segment = self  # the mapping outlives the view
            views.append(view)
        return views

    def base_addr(self) -> int:
        """This rank's address of the segment."""
        return self._native.base_addr()

    def total_size(self) -> int:
        """The segment's size in bytes (every block's tensors, page-aligned)."""
        return self._native.size()
