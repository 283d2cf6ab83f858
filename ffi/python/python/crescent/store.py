"""The store client, as ``mooncake.store`` names it: ``MooncakeDistributedStore``.

``CrescentStore`` is the same class under Crescent's name.
"""

from crescent._crescent import MooncakeDistributedStore

CrescentStore = MooncakeDistributedStore

__all__ = ["CrescentStore", "MooncakeDistributedStore"]
