"""The transfer engine, as ``mooncake.engine`` names it: ``TransferEngine``, ``TransferOpcode``
(also as ``Read`` / ``Write``), ``TransferNotify``, ``InnerTransferEngine`` (what
``TransferEngine.get_engine()`` returns) and the ``SUPPORT_*`` build flags: CUDA device memory
is supported (the driver is loaded at run time, so every build has the ``*_on_cuda`` calls); no
HIP, MUSA, EFA or NVLink transports in Crescent.

Return values are upstream's: 0 or a negative transfer-engine code (-1 for a failed transfer),
a batch id or an address that is 0 on failure; ``crescent.last_error()`` has the message.

Also as upstream: ``RpcInterface`` (alias ``CoroRPCInterface``) sends bytes and tensors to
another process's server (``ReceivedTensor`` is what its tensor callback gets; ``ReceivedData``
exists for the name), ``create_rpc_client`` / ``create_rpc_server`` make one, and
``SharedSegment`` shares one rank's host memory with the other ranks of a group.
"""

from crescent._crescent import (
    InnerTransferEngine,
    ReceivedData,
    ReceivedTensor,
    RpcInterface,
    SharedSegment,
    TransferEngine,
    TransferNotify,
    TransferOpcode,
    create_rpc_client,
    create_rpc_server,
)

CoroRPCInterface = RpcInterface

Read = TransferOpcode.Read
Write = TransferOpcode.Write

SUPPORT_CUDA = True
SUPPORT_EFA = False
SUPPORT_HIP = False
SUPPORT_INTRA_NVLINK = False
SUPPORT_MNNVL = False
SUPPORT_MUSA = False

__all__ = [
    "SUPPORT_CUDA",
    "SUPPORT_EFA",
    "SUPPORT_HIP",
    "SUPPORT_INTRA_NVLINK",
    "SUPPORT_MNNVL",
    "SUPPORT_MUSA",
    "CoroRPCInterface",
    "InnerTransferEngine",
    "Read",
    "ReceivedData",
    "ReceivedTensor",
    "RpcInterface",
    "SharedSegment",
    "TransferEngine",
    "TransferNotify",
    "TransferOpcode",
    "Write",
    "create_rpc_client",
    "create_rpc_server",
]
