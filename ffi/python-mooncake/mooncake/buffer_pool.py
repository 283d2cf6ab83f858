"""``mooncake.buffer_pool`` over Crescent: ``BufferPool`` (also ``RegisteredBufferPool``),
leases of the store's local buffer for the zero-copy calls (``crescent.buffer_pool``)."""

from crescent.buffer_pool import BufferPool, RegisteredBufferPool

__all__ = ["BufferPool", "RegisteredBufferPool"]
