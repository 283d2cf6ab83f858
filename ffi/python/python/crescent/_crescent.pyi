"""Type stubs of the native module behind ``crescent`` (see the package docstring)."""

from collections.abc import Iterable, Sequence
from typing import Any, Protocol
from types import TracebackType

from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12

__version__: str

OK: int
INTERNAL_ERROR: int
BUFFER_OVERFLOW: int
SEGMENT_NOT_FOUND: int
SEGMENT_ALREADY_EXISTS: int
CLIENT_NOT_FOUND: int
NO_AVAILABLE_HANDLE: int
INVALID_PARAMS: int
INVALID_HANDLE: int
INVALID_REPLICA: int
REPLICA_IS_NOT_READY: int
OBJECT_NOT_FOUND: int
OBJECT_ALREADY_EXISTS: int
OBJECT_HAS_LEASE: int
LEASE_EXPIRED: int
TRANSFER_FAIL: int
CHECKSUM_MISMATCH: int
RPC_FAIL: int
UNAVAILABLE_IN_CURRENT_STATUS: int

# Memory for the zero-copy calls: an int address (Mooncake's convention) or any C-contiguous
# object with the buffer protocol (bytearray, memoryview, numpy array, ...).
Memory = int | Buffer

class DeviceArray(Protocol):
    """An array the TransferEngine's calls take by address (Crescent's addition): a CUDA tensor
    of torch or cupy (``__cuda_array_interface__``), or any DLPack exporter (host or CUDA
    memory). It must be C-contiguous."""

# Memory for the TransferEngine's calls: the store's, and device arrays.
EngineMemory = int | Buffer | DeviceArray

def last_error() -> str:
    """The message of this thread's last failed call ("" if it succeeded)."""

def status_name(code: int) -> str:
    """Mooncake's name for a status code ("OBJECT_NOT_FOUND", ...) or "UNKNOWN"."""

def _fail_invalid(message: str) -> int:
    """Records ``message`` as this thread's last error; returns INVALID_PARAMS."""

def _is_registered(store: MooncakeDistributedStore, addr: int, len: int) -> bool:
    """Whether ``[addr, +len)`` lies in memory registered with ``store``'s client (False before setup)."""

class MooncakeHostMemAllocator:
    """Host memory another process can map (a memfd), as upstream's shared-memory helper gives."""
    def __init__(self) -> None: ...
    def alloc(self, size: int) -> int:
        """The address of ``size`` fresh, zeroed bytes; RuntimeError when they cannot be mapped."""
    def free(self, ptr: int) -> int:
        """0 once the allocation at ``ptr`` is unmapped, -1 for an address it did not give."""

def get_alloc_func_addr() -> int:
    """The address of a C function ``void *alloc(size_t size)`` (NULL on failure)."""

def get_free_func_addr() -> int:
    """The address of a C function ``void free(void *ptr)`` for what that ``alloc`` gave."""

def bind_to_numa_node(node: int) -> None:
    """Runs the calling thread on ``node``'s CPUs and prefers its memory; a warning (and no
    change) without NUMA support or for a node out of range (-1: every node)."""

class SoftPinAction:
    """What a put or upsert does to the object's soft pin (Mooncake's values)."""

    PRESERVE: SoftPinAction
    ENABLE: SoftPinAction
    DISABLE: SoftPinAction
    def __int__(self) -> int: ...

class ObjectDataType:
    """Mooncake's classification of a value (accepted, no effect on placement)."""

    UNKNOWN: ObjectDataType
    KVCACHE: ObjectDataType
    TENSOR: ObjectDataType
    WEIGHT: ObjectDataType
    SAMPLE: ObjectDataType
    ACTIVATION: ObjectDataType
    GRADIENT: ObjectDataType
    OPTIMIZER_STATE: ObjectDataType
    METADATA: ObjectDataType
    GENERAL: ObjectDataType
    def __int__(self) -> int: ...

class ReplicaStatus:
    UNDEFINED: ReplicaStatus
    INITIALIZED: ReplicaStatus
    PROCESSING: ReplicaStatus
    COMPLETE: ReplicaStatus
    REMOVED: ReplicaStatus
    FAILED: ReplicaStatus
    def __int__(self) -> int: ...

class TaskType:
    REPLICA_COPY: TaskType
    REPLICA_MOVE: TaskType
    def __int__(self) -> int: ...

class TaskStatus:
    PENDING: TaskStatus
    PROCESSING: TaskStatus
    FAILED: TaskStatus
    SUCCESS: TaskStatus
    def __int__(self) -> int: ...

class QueryTaskResponse:
    """A replica task's state, as query_task returns it."""
    id: tuple[int, int]
    type: TaskType
    status: TaskStatus
    created_at_ms_epoch: int
    last_updated_at_ms_epoch: int
    assigned_client: str
    message: str
    def __init__(self) -> None: ...

class Descriptor:
    """Where a memory replica's bytes are."""

    size: int
    buffer_address: int
    transport_endpoint: str
    def __init__(self) -> None: ...

class MemoryDescriptor:
    buffer_descriptor: Descriptor

class DiskDescriptor:
    file_path: str
    object_size: int

class ReplicaDescriptor:
    """One replica of an object. Crescent's disk replicas are Mooncake's "local disk" kind."""

    @property
    def status(self) -> ReplicaStatus: ...
    def is_memory_replica(self) -> bool: ...
    def is_disk_replica(self) -> bool: ...
    def is_local_disk_replica(self) -> bool: ...
    def get_memory_descriptor(self) -> MemoryDescriptor: ...
    def get_disk_descriptor(self) -> DiskDescriptor: ...

class BufferHandle:
    """A value read by ``get_buffer`` into the client's local (registered) buffer, held while
    the handle lives: its bytes through the buffer protocol (no copy), ``ptr()`` their address."""

    def ptr(self) -> int: ...
    def size(self) -> int: ...
    def __len__(self) -> int: ...
    def __buffer__(self, flags: int) -> memoryview: ...

class ReplicateConfig:
    """How a put places its object (Mooncake's ``ReplicateConfig``).

    ``preferred_segment`` and then ``preferred_segments`` (segment names, as
    ``get_hostname()`` gives them) are tried first for the replicas, in order, whatever the
    master's allocation strategy; a full or unknown one falls back to the strategy's choice.
    ``soft_pin_action = ENABLE`` keeps the object from eviction for ``soft_pin_ttl_ms`` (None:
    the master's soft-pin time, 30 min by default); a time with another action is
    INVALID_PARAMS. ``with_soft_pin`` is Crescent's older spelling of ``ENABLE``.
    ``with_hard_pin`` never evicts it. ``replica_num`` 0, ``nof_replica_num`` or
    ``dfs_replica_num`` above 0 and ``prefer_alloc_in_same_node`` make puts fail with
    INVALID_PARAMS (as in Mooncake without those pools).
    """

    replica_num: int
    nof_replica_num: int
    dfs_replica_num: int
    soft_pin_action: SoftPinAction
    soft_pin_ttl_ms: int | None
    with_soft_pin: bool
    with_hard_pin: bool
    preferred_segment: str
    preferred_segments: list[str]
    preferred_nof_segments: list[str]
    prefer_alloc_in_same_node: bool
    data_type: ObjectDataType
    group_ids: list[str] | None
    def __init__(self) -> None: ...

class MooncakeDistributedStore:
    """A store client with Mooncake's interface. Call ``setup`` first.

    Status-returning methods give 0 (or a count / size) on success and a negative Mooncake
    error code on failure (``last_error()`` has the message): INVALID_PARAMS before setup or
    after close, for lists of different lengths (one per key in batches) and sizes that do
    not fit. Wrong types raise ``TypeError`` / ``BufferError``. The GIL is released during
    master calls and transfers.
    """

    def __init__(self, *args: object, **kwargs: object) -> None: ...
    def setup(
        self,
        local_hostname: str | dict[str, object],
        metadata_server: str | None = None,
        global_segment_size: int | str = 16777216,
        local_buffer_size: int | str = 16777216,
        protocol: str = "tcp",
        rdma_devices: str = "",
        master_server_addr: str = "127.0.0.1:50051",
        engine: object | None = None,
        enable_ssd_offload: bool = False,
        ssd_offload_path: str = "",
        tenant_id: str = "default",
        enable_client_http_server: bool = False,
        client_http_port: int = 9300,
    ) -> int:
        """Starts the client and mounts ``global_segment_size`` bytes (0: a pure consumer);
        0 or a negative code. Also ``setup(dict)`` with Mooncake's keys."""
    def setup_dummy(self, mem_pool_size: int, local_buffer_size: int, server_address: str) -> int:
        """Attaches, as a dummy client, to the standalone client (``crescent-client`` /
        ``mooncake_client``) at ``server_address`` (``host:port`` of its ``--port`` on this
        host, ``@name`` or a socket path): every call is carried out there, in memory shared
        with it (``alloc_from_mem_pool``). 0, or -1 (``last_error()`` says why)."""
    def init_all(self, protocol: str, device_name: str, mount_segment_size: int = 16777216) -> int:
        """Upstream's fixed-default setup (``localhost:12345``, metadata ``127.0.0.1:2379``,
        a 1 GiB local buffer); 0, or -1 when already set up or it fails."""
    def alloc_from_mem_pool(self, size: int) -> int:
        """``size`` bytes shared with the standalone client (a dummy client's pool), usable by
        the zero-copy calls without ``register_buffer``; the address, or 0."""
    def close(self) -> int:
        """Unmounts this client's segment (its objects leave the pool); 0 or a negative code."""
    def health_check(self) -> int:
        """0 healthy, 1 not set up or closed, 2 the master unreachable."""
    def get_hostname(self) -> str:
        """This client's segment name (``host:port``); "" before setup."""
    def get_offload_rpc_read_count(self) -> int:
        """Values read from another client's disk through its disk service (0 before setup)."""
    def mount_segment(
        self, path: str, size: int, offset: int = 0, protocol: str = "tcp", location: str = ""
    ) -> dict[str, Any]:
        """Maps ``[offset, +size)`` of a file and mounts it: ``{"ret", "segment_ids"}``."""
    def unmount_segment(self, segment_ids: list[str], grace_period_seconds: int = 0) -> int:
        """Unmounts segments from ``mount_segment``: 0, or the first failure's code (-1)."""
    def allocate_and_mount_segment(
        self, size: int, protocol: str = "tcp", location: str = ""
    ) -> dict[str, Any]:
        """Allocates and mounts a segment: ``{"ret", "segment_ids", "allocated_size"}``."""
    def unmount_and_free_segment(self, segment_ids: list[str], grace_period_seconds: int = 0) -> int:
        """Unmounts segments from ``allocate_and_mount_segment`` and frees their memory."""
    def unmount_local_disk_segment(self, grace_period_seconds: int = 0) -> int:
        """Unmounts this client's disk tier at the master (0 also without one)."""
    def put(self, key: str, value: Buffer, config: ReplicateConfig | None = None) -> int:
        """Stores ``value`` under ``key``; a key that exists keeps its value (0)."""
    def upsert(self, key: str, value: Buffer, config: ReplicateConfig | None = None) -> int:
        """Stores ``value``, replacing the key's value (OBJECT_HAS_LEASE while it is leased)."""
    def get(self, key: str) -> bytes:
        """The value of ``key``; empty bytes if it is missing or the get failed."""
    def get_buffer(self, key: str) -> BufferHandle | None:
        """The value as a buffer object; None if it is missing or the get failed."""
    def batch_get_buffer(self, keys: Sequence[str]) -> list[BufferHandle | None]: ...
    def put_batch(
        self, keys: Sequence[str], values: Iterable[Buffer], config: ReplicateConfig | None = None
    ) -> int:
        """0 if every put succeeded, else the first error code."""
    def upsert_batch(
        self, keys: Sequence[str], values: Iterable[Buffer], config: ReplicateConfig | None = None
    ) -> int: ...
    def get_batch(self, keys: Sequence[str]) -> list[bytes]:
        """One value per key; empty bytes where a get failed."""
    def register_buffer(self, buffer_ptr: Memory, size: int | None = None) -> int:
        """Registers memory for the zero-copy calls (a buffer object is kept alive until
        ``unregister_buffer``); 0 or a negative code."""
    def unregister_buffer(self, buffer_ptr: Memory) -> int:
        """Unregisters memory registered by ``register_buffer``; 0 or a negative code."""
    def put_from(
        self, key: str, buffer_ptr: Memory, size: int | None = None, config: ReplicateConfig | None = None
    ) -> int:
        """Zero-copy put from registered memory; 0 or a negative code."""
    def upsert_from(
        self, key: str, buffer_ptr: Memory, size: int | None = None, config: ReplicateConfig | None = None
    ) -> int: ...
    def put_from_with_metadata(
        self,
        key: str,
        buffer_ptr: Memory,
        metadata_buffer_ptr: Memory,
        size: int,
        metadata_size: int,
        config: ReplicateConfig | None = None,
    ) -> int:
        """Stores the metadata's bytes, then the data's, from registered memory."""
    def get_into(self, key: str, buffer_ptr: Memory, size: int | None = None) -> int:
        """Zero-copy get into registered memory; bytes read or a negative code
        (BUFFER_OVERFLOW when the buffer is too small)."""
    def batch_put_from(
        self,
        keys: Sequence[str],
        buffer_ptrs: Iterable[Memory],
        sizes: Sequence[int] | None = None,
        config: ReplicateConfig | None = None,
    ) -> list[int]:
        """Zero-copy puts in one master round trip; a status per key."""
    def batch_upsert_from(
        self,
        keys: Sequence[str],
        buffer_ptrs: Iterable[Memory],
        sizes: Sequence[int] | None = None,
        config: ReplicateConfig | None = None,
    ) -> list[int]: ...
    def batch_get_into(
        self, keys: Sequence[str], buffer_ptrs: Iterable[Memory], sizes: Sequence[int] | None = None
    ) -> list[int]:
        """Zero-copy gets in one master round trip and one engine batch; bytes read or a
        negative code per key."""
    def batch_put_from_multi_buffers(
        self,
        keys: Sequence[str],
        all_buffer_ptrs: Sequence[Sequence[Memory]],
        all_sizes: Sequence[Sequence[int]],
        config: ReplicateConfig | None = None,
    ) -> list[int]:
        """Zero-copy puts of values laid out in several registered buffers each; a status per
        key ([] before setup)."""
    def batch_get_into_multi_buffers(
        self,
        keys: Sequence[str],
        all_buffer_ptrs: Sequence[Sequence[Memory]],
        all_sizes: Sequence[Sequence[int]],
        prefer_alloc_in_same_node: bool = False,
    ) -> list[int]:
        """Zero-copy gets of whole values into several registered buffers each; bytes read or
        a negative code per key."""
    def get_into_ranges(
        self,
        buffer_ptrs: Sequence[Memory],
        all_keys: Sequence[Sequence[str]],
        all_dst_offsets: Sequence[Sequence[Sequence[int]]],
        all_src_offsets: Sequence[Sequence[Sequence[int]]],
        all_sizes: Sequence[Sequence[Sequence[int]]],
    ) -> list[list[list[int]]]:
        """Ranges of values into registered buffers; bytes read or a negative code per range."""
    def batch_get_session_start(self, keys: Sequence[str]) -> list[int]:
        """Starts a get session per key (replicas asked once, kept with their read lease); 0 or
        a negative code per key ([] before setup)."""
    def batch_get_into_multi_buffer_ranges(
        self,
        keys: Sequence[str],
        all_buffer_ptrs: Sequence[Sequence[Memory]],
        all_sizes: Sequence[Sequence[int]],
        all_src_offsets: Sequence[Sequence[int]],
    ) -> list[int]:
        """Ranged gets on get sessions (no master round trip); bytes read or a negative code
        per key (LEASE_EXPIRED once the session's lease ended)."""
    def batch_get_session_end(self, keys: Sequence[str]) -> int:
        """Ends the get sessions of ``keys``; 0 (-1 before setup)."""
    def batch_put_session_start(
        self, keys: Sequence[str], sizes: Sequence[int], config: ReplicateConfig | None = None
    ) -> list[int]:
        """Starts a put session per key (the object placed, not yet readable); 0 or a negative
        code per key ([] before setup)."""
    def batch_put_from_multi_buffer_ranges(
        self,
        keys: Sequence[str],
        all_buffer_ptrs: Sequence[Sequence[Memory]],
        all_sizes: Sequence[Sequence[int]],
        all_dst_offsets: Sequence[Sequence[int]],
    ) -> list[int]:
        """Ranged writes on put sessions (no master round trip); bytes written or a negative
        code per key."""
    def batch_put_session_end(self, keys: Sequence[str]) -> list[int]:
        """Commits the put sessions' objects and ends the sessions; 0 or a negative code per key."""
    def batch_put_session_revoke(self, keys: Sequence[str]) -> list[int]:
        """Gives back the put sessions' space and ends the sessions; 0 or a negative code per key."""
    def put_parts(self, key: str, *parts: Buffer, config: ReplicateConfig | None = None) -> int:
        """Puts the concatenation of ``parts`` as one value; 0 or a negative code."""
    def upsert_parts(self, key: str, *parts: Buffer, config: ReplicateConfig | None = None) -> int: ...
    def is_exist(self, key: str) -> int:
        """1 if ``key`` exists, 0 if not, a negative code on error (no lease is granted)."""
    def batch_is_exist(self, keys: Sequence[str]) -> list[int]:
        """1 / 0 per key; a negative code for every key if the call failed."""
    def get_size(self, key: str) -> int:
        """The value's size in bytes, or a negative code."""
    def get_replica_desc(self, key: str) -> list[ReplicaDescriptor]: ...
    def batch_replica_clear(self, keys: list[str], segment_name: str = "") -> list[str]: ...
    def create_copy_task(self, key: str, targets: list[str]) -> tuple[tuple[int, int], int]: ...
    def create_move_task(self, key: str, source: str, target: str) -> tuple[tuple[int, int], int]: ...
    def query_task(self, task_id: tuple[int, int]) -> tuple[QueryTaskResponse | None, int]: ...
    def batch_get_replica_desc(self, keys: Sequence[str]) -> dict[str, list[ReplicaDescriptor]]: ...
    def remove(self, key: str, force: bool = False) -> int:
        """0, or a negative code (OBJECT_HAS_LEASE while a reader holds a lease, unless force)."""
    def batch_remove(self, keys: Sequence[str], force: bool = False) -> list[int]: ...
    def remove_by_regex(self, regex_pattern: str, force: bool = False) -> int:
        """How many objects were removed, or a negative code."""
    def remove_all(self, force: bool = False) -> int:
        """How many objects were removed, or a negative code."""
    def __enter__(self) -> MooncakeDistributedStore: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool: ...

class TransferOpcode:
    """Mooncake's ``TransferOpcode``: ``Read`` (0) and ``Write`` (1); compares equal to its int."""

    Read: TransferOpcode
    Write: TransferOpcode
    def __int__(self) -> int: ...

class TransferNotify:
    """A notification the target's engine receives once the transfer it follows completed."""

    name: str
    msg: str
    def __init__(self, name: str = "", msg: str = "") -> None: ...

class InnerTransferEngine:
    """The engine object ``TransferEngine.get_engine()`` returns (opaque)."""

TransportHint = str  # "", "rdma", "mnnvl", "shm", "nvlink", "gds", "io_uring", "tcp", "ascend", "sunrise_link", "unspec"

class TransferEngine:
    """Mooncake's transfer engine: registered memory and one-sided reads and writes between
    engines. Call ``initialize`` first. Status-returning methods give 0 or Mooncake's negative
    transfer-engine code (-1 for a failed transfer or a call before ``initialize``); batch ids
    and addresses are 0 on failure. ``transport_hint`` is checked and has no effect (the
    transport is chosen per segment)."""

    TransferOpcode: type[TransferOpcode]
    def __init__(self) -> None: ...
    def initialize(self, local_hostname: str, metadata_server: str, protocol: str = "tcp", device_name: str = "") -> int:
        """Starts the engine; 0 or -1. With ``P2PHANDSHAKE`` a port in ``local_hostname`` is
        ignored (a free one is picked, as upstream does)."""
    def initialize_ext(
        self, local_hostname: str, metadata_server: str, protocol: str, device_name: str, metadata_type: str
    ) -> int:
        """As ``initialize``, ``metadata_type`` (etcd, redis, http) naming the service when
        ``metadata_server`` has no ``scheme://``."""
    def get_rpc_port(self) -> int:
        """The handshake port peers connect to (-1 before ``initialize``)."""
    def get_segment_name(self) -> str:
        """``host:port``: what peers pass as ``target_hostname`` (Crescent's addition)."""
    def get_engine(self) -> InnerTransferEngine | None: ...
    def get_engine_ptr(self) -> int: ...
    def register_memory(self, buffer_addr: EngineMemory, capacity: int | None = None, location: str = "*") -> int:
        """0, -7 overlapping registered memory, -1 a zero capacity."""
    def batch_register_memory(
        self, buffer_addresses: Sequence[EngineMemory], capacities: Sequence[int] | None = None, location: str = "*"
    ) -> int:
        """Registers all regions or none."""
    def unregister_memory(self, buffer_addr: EngineMemory) -> int:
        """0, or -3 when nothing is registered there."""
    def batch_unregister_memory(self, buffer_addresses: Sequence[EngineMemory]) -> int:
        """Unregisters each; the first error's code."""
    def transfer_sync_read(
        self, target_hostname: str, buffer: EngineMemory, peer_buffer_address: int, length: int, transport_hint: str = ""
    ) -> int:
        """Reads ``length`` bytes of the target's registered memory into local ``buffer``; 0 or -1."""
    def transfer_sync_write(
        self, target_hostname: str, buffer: EngineMemory, peer_buffer_address: int, length: int, transport_hint: str = ""
    ) -> int:
        """Writes ``length`` bytes of local ``buffer`` into the target's registered memory; 0 or -1."""
    def transfer_sync(
        self,
        target_hostname: str,
        buffer: EngineMemory,
        peer_buffer_address: int,
        length: int,
        opcode: TransferOpcode | int,
        notify: TransferNotify | None = None,
        transport_hint: str = "",
    ) -> int:
        """0 or -1; the target's engine receives ``notify`` once the transfer completed."""
    def batch_transfer_sync_read(
        self,
        target_hostname: str,
        buffers: Sequence[EngineMemory],
        peer_buffer_addresses: Sequence[int],
        lengths: Sequence[int],
        transport_hint: str = "",
    ) -> int: ...
    def batch_transfer_sync_write(
        self,
        target_hostname: str,
        buffers: Sequence[EngineMemory],
        peer_buffer_addresses: Sequence[int],
        lengths: Sequence[int],
        transport_hint: str = "",
    ) -> int: ...
    def batch_transfer_sync(
        self,
        target_hostname: str,
        buffers: Sequence[EngineMemory],
        peer_buffer_addresses: Sequence[int],
        lengths: Sequence[int],
        opcode: TransferOpcode | int,
        notify: TransferNotify | None = None,
        transport_hint: str = "",
    ) -> int: ...
    def batch_transfer_async_read(
        self,
        target_hostname: str,
        buffers: Sequence[EngineMemory],
        peer_buffer_addresses: Sequence[int],
        lengths: Sequence[int],
        transport_hint: str = "",
    ) -> int:
        """A batch id (wait with ``get_batch_transfer_status``), 0 on failure."""
    def batch_transfer_async_write(
        self,
        target_hostname: str,
        buffers: Sequence[EngineMemory],
        peer_buffer_addresses: Sequence[int],
        lengths: Sequence[int],
        transport_hint: str = "",
    ) -> int:
        """A batch id (wait with ``get_batch_transfer_status``), 0 on failure."""
    def batch_transfer_async(
        self,
        target_hostname: str,
        buffers: Sequence[EngineMemory],
        peer_buffer_addresses: Sequence[int],
        lengths: Sequence[int],
        opcode: TransferOpcode | int,
        transport_hint: str = "",
    ) -> int: ...
    def get_batch_transfer_status(self, batch_ids: Sequence[int]) -> int:
        """Waits for the batches and frees them; 0 if all completed, else -1."""
    def transfer_write_on_cuda(
        self,
        target_hostname: str,
        buffer: EngineMemory,
        peer_buffer_address: int,
        length: int,
        stream_ptr: int | object | None = 0,
        transport_hint: str = "",
    ) -> None:
        """Queues the write on the CUDA stream (an int ``cudaStream_t``, 0 the default stream, or
        a torch/cupy stream object): it starts once the stream's earlier work is done, and later
        work waits for it. ``RuntimeError`` when it cannot be queued; a failure of the transfer
        itself is logged and raised by the engine's next ``*_on_cuda`` call."""
    def transfer_read_on_cuda(
        self,
        target_hostname: str,
        buffer: EngineMemory,
        peer_buffer_address: int,
        length: int,
        stream_ptr: int | object | None = 0,
        transport_hint: str = "",
    ) -> None:
        """Queues the read on the CUDA stream, as ``transfer_write_on_cuda``."""
    def batch_transfer_write_on_cuda(
        self,
        target_hostname: str,
        buffers: Sequence[EngineMemory],
        peer_buffer_addresses: Sequence[int],
        lengths: Sequence[int],
        stream_ptr: int | object | None = 0,
        transport_hint: str = "",
    ) -> None:
        """Queues the writes on the CUDA stream, as one."""
    def batch_transfer_read_on_cuda(
        self,
        target_hostname: str,
        buffers: Sequence[EngineMemory],
        peer_buffer_addresses: Sequence[int],
        lengths: Sequence[int],
        stream_ptr: int | object | None = 0,
        transport_hint: str = "",
    ) -> None:
        """Queues the reads on the CUDA stream, as one."""
    def transfer_submit_write(
        self, target_hostname: str, buffer: EngineMemory, peer_buffer_address: int, length: int, transport_hint: str = ""
    ) -> int:
        """A batch id (poll with ``transfer_check_status``), 0 on failure."""
    def transfer_check_status(self, batch_id: int) -> int:
        """0 in flight; then (batch freed) 1 completed, -1 failed or unknown, -2 timed out."""
    def allocate_managed_buffer(self, length: int) -> int:
        """The address of ``length`` bytes of registered memory, or 0 on failure."""
    def free_managed_buffer(self, buffer_addr: int, length: int) -> int: ...
    def get_local_topology(self, device_name: str | None = None) -> str:
        """Upstream's topology matrix as JSON: ``{"cpu:<node>": [[preferred RDMA devices], [others]]}``,
        and ``"cuda:<n>"`` per GPU when the CUDA driver loads."""
    def get_first_buffer_address(self, segment_name: str) -> int:
        """The address of the segment's first registered buffer, or 0."""
    def write_bytes_to_buffer(self, buffer_addr: int, src: Buffer | str, length: int) -> int:
        """Copies ``src`` into local registered memory (device memory through its driver); -1
        outside it."""
    def read_bytes_from_buffer(self, buffer_addr: int, length: int) -> bytes:
        """A copy of local registered memory (device memory through its driver; empty bytes
        outside it)."""
    def get_notifies(self) -> list[TransferNotify]:
        """The notifications received since the last call, oldest first; each once."""
    def send_probe(self, peer_server_name: str) -> int:
        """0 if the peer's engine answers, else a negative code."""
    def warmup_efa_segment(self, segment_name: str) -> int:
        """0 (no EFA transport)."""

class ReceivedData:
    """A message's sender and bytes (upstream's name; the data callback gets a dict)."""
    source_address: str
    data_size: int
    def get_bytes(self) -> bytes: ...
    def get_memory_view(self) -> memoryview: ...

class ReceivedTensor:
    """What the tensor callback gets: the sender (``ip:port``), dtype name, shape and bytes."""
    source_address: str
    shape: list[int]
    dtype: str
    total_bytes: int
    def get_data_size(self) -> int: ...
    def get_data_as_bytes(self) -> bytes: ...
    def get_memory_view(self) -> memoryview: ...

class RpcInterface:
    """Mooncake's message interface: send bytes and tensors to another process's server."""
    def __init__(self) -> None: ...
    def initialize(
        self, listen_address: str = "", thread_count: int = 0, timeout_seconds: int = 30, pool_size: int = 100
    ) -> bool: ...
    def initialize_client(self, pool_size: int = 100, timeout_seconds: int = 30) -> bool: ...
    def initialize_server(self, listen_address: str, thread_count: int = 8, timeout_seconds: int = 30) -> bool: ...
    def start_server(self) -> bool:
        """Serves until ``stop_server``; False if it cannot start."""
    def start_server_async(self) -> bool: ...
    def stop_server(self) -> None: ...
    def send_data(self, target_address: str, data: Buffer) -> int:
        """0 once the server's data callback returned, -1 on failure."""
    def send_data_async(self, target_address: str, data: Buffer, loop: Any) -> Any:
        """An asyncio future of ``loop``: 0, or RuntimeError."""
    def send_tensor(self, target_address: str, tensor: Any) -> int:
        """A host torch tensor or a C-contiguous numpy array, with its dtype and shape: 0 or -1."""
    def send_tensor_async(self, target_address: str, tensor: Any, loop: Any) -> Any: ...
    def set_data_receive_callback(self, callback: Any) -> None:
        """``callback({"source": str, "data": bytes})`` per data message."""
    def set_tensor_receive_callback(self, callback: Any) -> None:
        """``callback(ReceivedTensor)`` per tensor."""

def create_rpc_client(local_rank: int = 0, world_size: int = 1) -> RpcInterface: ...
def create_rpc_server(local_rank: int = 0, world_size: int = 1) -> RpcInterface: ...

class SharedSegment:
    """Host memory the owner rank holds and every rank of a group maps."""
    @staticmethod
    def create(
        name: str,
        size: int,
        world_size: int,
        rank_id: int,
        owner_rank: int = 0,
        device_id: int = 0,
        mmap: bool = True,
        host_register: bool = False,
    ) -> tuple[SharedSegment, bytes]: ...
    @staticmethod
    def supported(mmap: bool = True, host_register: bool = False) -> bool: ...
    def complete(self, blobs: Sequence[bytes]) -> None: ...
    def ready(self) -> bool: ...
    def base_addr(self) -> int: ...
    def device_addr(self) -> int: ...
    def size(self) -> int: ...
