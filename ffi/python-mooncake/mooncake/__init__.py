"""Mooncake's import names over Crescent: ``mooncake.store``, ``mooncake.engine`` and
``mooncake.async_store`` re-export Crescent's classes under Mooncake's names, so that code
written against Mooncake's Python API runs on Crescent unchanged.

This package comes from the ``crescent-mooncake`` wheel, installed on purpose. Both it and
Mooncake's own wheel (``mooncake-transfer-engine``) provide ``mooncake``; with both installed,
which one answers depends on installation order, so importing refuses to guess.
"""

from importlib import metadata as _metadata

for _dist in ("mooncake-transfer-engine", "mooncake-transfer-engine-non-cuda", "mooncake-transfer-engine-cuda13"):
    try:
        _metadata.distribution(_dist)
    except _metadata.PackageNotFoundError:
        continue
    raise ImportError(
        f"both Mooncake ({_dist}) and Crescent's mooncake alias (crescent-mooncake) are installed and provide "
        f"`mooncake`; uninstall one of them (pip uninstall {_dist} or pip uninstall crescent-mooncake)"
    )

import crescent as _crescent  # noqa: E402

from mooncake.buffer_pool import BufferPool, RegisteredBufferPool  # noqa: E402

__version__ = _crescent.__version__
#: The implementation behind these names.
backend = "crescent"

__all__ = ["BufferPool", "RegisteredBufferPool", "backend"]
