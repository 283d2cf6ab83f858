"""The transfer engine, as ``mooncake.engine`` names it: ``TransferEngine``."""

from crescent._crescent import TransferEngine

__all__ = ["TransferEngine"]
