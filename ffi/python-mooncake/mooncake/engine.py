"""``mooncake.engine`` over Crescent: ``TransferEngine`` and what ``crescent.engine`` exports
with it."""

from crescent.engine import *  # noqa: F401,F403
from crescent.engine import __all__ as _crescent_all

__all__ = list(_crescent_all)
