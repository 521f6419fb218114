"""KREX's sitecustomize: wrap the callables named in KREX_AUTO_REGIONS in regions.

`krex run --auto-regions` puts this file's directory first on a tenant's PYTHONPATH, so every
Python process of the tenant imports it at start-up. It never raises: a failure is one `krex:`
line on stderr, and the program runs without auto-regions. Then it runs the sitecustomize
that it hides (the next one on sys.path) as `sitecustomize`, as Python would have.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.realpath(__file__))
# The directory that holds the krex package (a source tree, or a site-packages): _auto is in
# krex/tenant/.
_KREX_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(_HERE)))


def _install(value: str) -> None:
    try:
        import krex.tenant.autoregions
    except ImportError:
        # Another environment's Python: use ours, but after its own packages, never before.
        if _KREX_PARENT in sys.path:
            raise
        sys.path.append(_KREX_PARENT)
        try:
            import krex.tenant.autoregions
        except ImportError:
            sys.path.remove(_KREX_PARENT)
            raise
    krex.tenant.autoregions.install(krex.tenant.autoregions.parse(value))
    log = os.environ.get(krex.tenant.autoregions.LOG_VAR)
    if log:
        krex.tenant.autoregions.note_at_exit(log)


def _chain() -> None:
    """Run the next `sitecustomize` on sys.path after this directory, as `sitecustomize`."""
    entries = [os.path.realpath(entry or os.curdir) for entry in sys.path]
    if _HERE not in entries:
        return
    later = sys.path[entries.index(_HERE) + 1 :]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", later)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


if __name__ == "sitecustomize":
    _value = os.environ.get("KREX_AUTO_REGIONS", "")
    if _value.strip():
        try:
            _install(_value)
        except Exception as exc:
            print(f"krex: auto-regions are off in this process: {exc}", file=sys.stderr)
    # Not guarded: if theirs raises, site.py reports it exactly as it would without us.
    _chain()
