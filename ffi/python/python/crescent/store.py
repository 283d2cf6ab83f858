"""The store client, as ``mooncake.store`` names it: ``MooncakeDistributedStore``, and the
per-put ``ReplicateConfig``.

``CrescentStore`` is the same class under Crescent's name.
"""

from crescent._crescent import MooncakeDistributedStore, ReplicateConfig

CrescentStore = MooncakeDistributedStore

__all__ = ["CrescentStore", "MooncakeDistributedStore", "ReplicateConfig"]
