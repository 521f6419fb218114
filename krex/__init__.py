"""KREX: share a GPU among kernel-benchmarking commands while each timing-critical region runs
alone (see README.md)."""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"
__all__ = ["__version__", "region"]


def __getattr__(name: str) -> Any:
    # `krex.region` is imported on first use, so `import krex` works without its dependencies.
    if name == "region":
        # Importing the submodule krex.region binds the package attribute `region` to the module;
        # rebind it to the function, so later `krex.region` look-ups get the function directly.
        function = importlib.import_module("krex.region").region
        globals()["region"] = function
        return function
    raise AttributeError(f"module 'krex' has no attribute {name!r}")
