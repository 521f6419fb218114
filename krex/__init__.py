"""KREX: share a GPU among kernel-benchmarking commands while each timing-critical region runs
alone (see README.md)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from krex.tenant.markers import RegionError, last_region, region

from krex.core.version import __version__

__all__ = ["RegionError", "__version__", "last_region", "region"]

# Re-exported from krex.tenant.markers on first use, so `import krex` stays light. The module is not
# called krex.region: importing a submodule binds its name on the package, which would shadow
# the function `krex.region`.
_MARKERS = ("region", "last_region", "RegionError")


def __getattr__(name: str) -> Any:
    if name in _MARKERS:
        value = getattr(importlib.import_module("krex.tenant.markers"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'krex' has no attribute {name!r}")
