"""``mooncake.store`` over Crescent: ``MooncakeDistributedStore``, ``ReplicateConfig``, the
enums (``SoftPinAction``, ``ReplicaStatus``, ``ObjectDataType`` and their values), the
descriptor types, ``BufferHandle`` and the sharded tensor requests (``ParallelAxis``,
``TensorParallelism``, ``ReadTarget``), the replica tasks' ``TaskType``, ``TaskStatus`` and
``QueryTaskResponse``: every name in ``crescent.store.__all__``."""

from crescent.store import *  # noqa: F401,F403
from crescent.store import __all__ as _crescent_all
from crescent.store import ObjectDataType, ReplicaStatus, TaskStatus, TaskType

# As Mooncake's export_values leaves them: TaskStatus's PROCESSING and FAILED win.
for _enum in (ObjectDataType, ReplicaStatus, TaskType, TaskStatus):
    for _name in dir(_enum):
        if _name.isupper():
            globals()[_name] = getattr(_enum, _name)
del _enum, _name

__all__ = list(_crescent_all)
