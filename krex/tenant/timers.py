"""Kernel libraries' own timers as auto-regions: flashinfer, Triton's Proton timers and
autotuner seam, Helion's benchmarks (docs/user-guide.md, "Auto-regions").

flashinfer's `bench_gpu_time*` (flashinfer/testing/utils.py, read at 0.7.4): a whole call is
one region, its estimate, dry runs, cold-L2 flushes, CUDA graph capture and the timed loop
alike. `bench_gpu_time_with_cupti` times with CUPTI activity records, with no CUDA-event pair
around its loop, so krex/tenant/events.py sees only its 5-call estimate; `bench_gpu_time`
calls the others by their module's global names, so they are nested in its region.

Triton 3.8 and 3.9's `do_bench_proton` and `do_bench_cudagraph_proton` (triton/testing.py) time
with Proton scopes: each call is a region, like `do_bench`. Triton's autotuner gets its timer
from one place on 3.6 to 3.9: its `Autotuner.do_bench` property, which is the `do_bench=` given
to the autotuner or else `driver.active.get_benchmarker()` (the NVIDIA and AMD drivers return
`triton.testing.do_bench`, looked up at that call, so the wrapped one). That property is wrapped
(AUTOTUNER_SEAM): what it returns runs as an autotuner's candidate benchmark, in a region of its
own where it is not a wrapped timer already (a lambda around `do_bench`, a harness's own timer).

Helion's `interleaved_bench` and its kin (helion/autotuner/benchmarking.py, read at 1.5.1):
a region each. Called by Helion's autotuner (its rebenchmark of the best configurations, its
steady-window timing), it is an autotuner's candidate benchmark; called by anything else (Helion's
own `run_example`, a harness) it is a timing (CALLERS).
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable
from functools import cached_property
from types import FrameType, ModuleType
from typing import Any

from krex.tenant.markers import WRAPPED_MARK, auto_region, candidates

FLASHINFER = "flashinfer.testing.utils"
HELION = "helion.autotuner.benchmarking"
TRITON_TESTING = "triton.testing"
TRITON_AUTOTUNER = "triton.runtime.autotuner"
AUTOTUNER_SEAM = "Autotuner.do_bench"  # the property, under TRITON_AUTOTUNER
AUTOTUNER_LABEL = f"{TRITON_AUTOTUNER}.{AUTOTUNER_SEAM}"  # its regions' name in `calls`

# Added to autoregions.DEFAULT_AUTO_REGIONS.
DEFAULTS = (
    f"{TRITON_TESTING}.do_bench_proton",
    f"{TRITON_TESTING}.do_bench_cudagraph_proton",
    f"{FLASHINFER}.bench_gpu_time",
    f"{FLASHINFER}.bench_gpu_time_with_cupti",
    f"{FLASHINFER}.bench_gpu_time_with_cuda_event",
    f"{FLASHINFER}.bench_gpu_time_with_cudagraph",
    f"{HELION}.interleaved_bench",
    f"{HELION}.interleaved_bench_generic",
    f"{HELION}.do_bench",
    f"{HELION}.do_bench_generic",
)
# Full name -> (the modules whose call makes it an autotuner's candidate, its own module).
_CANDIDATE_MARK = "__krex_candidate_bench__"  # as_candidate()'s, never wrapped twice
CALLERS = {name: ("helion.autotuner.", HELION) for name in DEFAULTS if name.startswith(HELION)}


def tuning_caller(frame: FrameType | None, tuners: str, own: str) -> bool:
    """Whether a frame of a module under `tuners`, other than `own`, is on the stack from
    `frame` up: an autotuner, not a harness, called the timer (whatever wrappers lie between)."""
    while frame is not None:
        name = frame.f_globals.get("__name__")
        if isinstance(name, str) and name.startswith(tuners) and name != own:
            return True
        frame = frame.f_back
    return False


def by_caller(fn: Callable[..., Any], label: str) -> Callable[..., Any]:
    """`fn` as an auto-region labelled `label` (a name of CALLERS): a candidate's where the
    library's autotuner called it, else a timing's."""
    tuners, own = CALLERS[label]

    @functools.wraps(fn)
    def timer(*args: Any, **kwargs: Any) -> Any:
        tuning = tuning_caller(sys._getframe(1), tuners, own)
        return auto_region(label, candidate=tuning, retakes=True).call(fn, *args, **kwargs)

    setattr(timer, WRAPPED_MARK, True)
    return timer


def as_candidate(bench: Any) -> Any:
    """What Triton's autotuner times its configurations with, run as a candidate's benchmark:
    a wrapped timer (`triton.testing.do_bench`) keeps its own region and label; any other
    callable gets a region labelled AUTOTUNER_LABEL."""
    if not callable(bench) or getattr(bench, _CANDIDATE_MARK, False):
        return bench
    region = None if getattr(bench, WRAPPED_MARK, False) else auto_region(AUTOTUNER_LABEL)

    @functools.wraps(bench)
    def candidate_bench(*args: Any, **kwargs: Any) -> Any:
        with candidates(), region or contextlib.nullcontext():
            return bench(*args, **kwargs)

    setattr(candidate_bench, WRAPPED_MARK, True)
    setattr(candidate_bench, _CANDIDATE_MARK, True)
    return candidate_bench


def wrap_autotuner_seam(module: ModuleType) -> None:
    """Triton's `Autotuner.do_bench` (a cached_property on 3.6 to 3.9; a plain property is
    taken too) made to return as_candidate() of what it returned."""
    autotuner: Any = getattr(module, "Autotuner", None)
    prop = vars(autotuner).get("do_bench") if isinstance(autotuner, type) else None
    getter = prop.func if isinstance(prop, cached_property) else getattr(prop, "fget", None)
    if getter is None or getattr(getter, WRAPPED_MARK, False):
        return

    @functools.wraps(getter)
    def do_bench(self: Any) -> Any:
        return as_candidate(getter(self))

    setattr(do_bench, WRAPPED_MARK, True)
    seam: Any = property(do_bench)
    if isinstance(prop, cached_property):
        seam = cached_property(do_bench)
        seam.__set_name__(autotuner, "do_bench")
    autotuner.do_bench = seam
