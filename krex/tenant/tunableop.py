"""PyTorch's TunableOp under auto-regions: not covered, and said so once.

With TunableOp on and its tuning on (`PYTORCH_TUNABLEOP_ENABLED=1`, tuning's default
`PYTORCH_TUNABLEOP_TUNING=1`, or `torch.cuda.tunable.enable(True)`), the first call of a GEMM
for each new shape benchmarks every implementation inside the op itself and keeps the fastest
(docs: torch.cuda.tunable). That timing happens inside `torch.matmul` and kin, which krex cannot
wrap (dynamo would break the graph at every call, as it does for `torch.conv2d`:
krex/tenant/cudnn.py), so its choices are made beside busy siblings. Rather than leave that
silent, a process under auto-regions whose TunableOp can tune says so once on stderr, with the
way round it: tune alone, then reuse the results file with tuning off.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

MODULE = "torch.cuda.tunable"
WARNING = (
    "krex: auto-regions: PyTorch TunableOp is tuning: it times each new GEMM shape's "
    "implementations inside the op, outside any region, so its choices are made beside the "
    "other commands on the GPU; tune in a run of its own (its results file, "
    "PYTORCH_TUNABLEOP_FILENAME) and run under krex with PYTORCH_TUNABLEOP_TUNING=0"
)
# The functions that turn TunableOp or its tuning on (torch/cuda/tunable.py).
SWITCHES = ("enable", "tuning_enable")
_WRAPPED = "__krex_tunableop__"
_warned = threading.Event()


def tuning_by_env(environ: Mapping[str, str]) -> bool:
    """Whether the environment turns TunableOp and its tuning on (tuning defaults to on)."""
    return (
        environ.get("PYTORCH_TUNABLEOP_ENABLED") == "1"
        and environ.get("PYTORCH_TUNABLEOP_TUNING", "1") != "0"
    )


def warn_once() -> None:
    if not _warned.is_set():
        _warned.set()
        print(WARNING, file=sys.stderr, flush=True)


def on_torch(_module: ModuleType) -> None:
    """When torch is imported: the warning, if the environment has TunableOp tune."""
    if tuning_by_env(os.environ):
        warn_once()


def install(module: ModuleType) -> None:
    """torch.cuda.tunable's switches wrapped: once a call leaves TunableOp on with tuning on,
    the warning (once per process). Anything of a different shape is left alone."""
    is_enabled = getattr(module, "is_enabled", None)
    tuning_is_enabled = getattr(module, "tuning_is_enabled", None)
    if not callable(is_enabled) or not callable(tuning_is_enabled):
        return
    for name in SWITCHES:
        fn = getattr(module, name, None)
        if callable(fn) and not getattr(fn, _WRAPPED, False):
            setattr(module, name, _switch(fn, is_enabled, tuning_is_enabled))


def _switch(
    fn: Callable[..., Any], is_enabled: Callable[[], Any], tuning: Callable[[], Any]
) -> Callable[..., Any]:
    @functools.wraps(fn)
    def switched(*args: Any, **kwargs: Any) -> Any:
        result = fn(*args, **kwargs)
        try:
            on = bool(is_enabled()) and bool(tuning())
        except Exception:  # a query that fails never breaks the user's call
            on = False
        if on:
            warn_once()
        return result

    setattr(switched, _WRAPPED, True)
    return switched
