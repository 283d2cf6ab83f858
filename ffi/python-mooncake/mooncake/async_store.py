"""``mooncake.async_store`` over Crescent: ``MooncakeDistributedStoreAsync``, whose
``async_<method>`` coroutines run ``<method>`` in the event loop's executor."""

from crescent.store import MooncakeDistributedStore, MooncakeDistributedStoreAsync

__all__ = ["MooncakeDistributedStore", "MooncakeDistributedStoreAsync"]
