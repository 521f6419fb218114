"""Inductor's lazily compiled Triton kernels, compiled before their benchmark's region.

Once its pool of compile workers is up, Inductor's max-autotune compiles each Triton choice in
a worker process (torch 2.11: `AlgorithmSelectorCache.make_precompile_fn` submits
`async_compile.triton` while `AsyncCompile.use_process_pool()` says the pool is ready, and the
thread-pool `precompile()` otherwise). The workers do not load the kernels, so a choice none of
whose configurations the GPU can run (shared memory over the limit) is not weeded out then: its
first run (`CachingAutotuner.run` with no launchers calls `precompile()`,
torch/_inductor/runtime/triton_heuristics.py) compiles every configuration again in the
command's own process and only then fails, inside `benchmark_gpu`, so inside its region. On the
H200 box that was 10-15 s per such choice, 41-44 s of one region with the 7 siblings frozen
(docs/results/h200-autotune/README.md, run 27). Whether the pool is ready first is a race: it
was in every unprotected run and in most with `--settle`, never under plain krex there.

So on the releases the fallback wraps (autoregions.INDUCTOR_FALLBACK_TORCH) the wrapped
`benchmark_gpu` first does that compile itself, outside the region, ending the thread's
lingering region first: the same call the first run would make, with the same errors (raised
from `benchmark_gpu` as before, where Inductor ignores the choice). Only a callable that is a
`CachingAutotuner.run` (bound, or in a functools.partial, as `TritonBenchmarkRequest.
make_run_fn` builds it, or behind wrappers that set `__wrapped__`) is looked at; lambdas that
call a kernel are left as they are.
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from typing import Any

from krex.markers import WRAPPED_MARK, auto_region, end_lingering

HEURISTICS = "torch._inductor.runtime.triton_heuristics"  # where CachingAutotuner lives


def lazy_autotuner(fn: object) -> Any | None:
    """The CachingAutotuner whose `run` fn is, if calling fn would compile it first (it has no
    launchers yet, as after a worker's compile), else None. A functools.partial, and a wrapper
    that names what it wraps in `__wrapped__` (functools.wraps does), are looked through."""
    target = fn
    for _ in range(8):  # a wrapper of a partial of a wrapper...: a few levels, never a cycle
        if isinstance(target, functools.partial):
            target = target.func
        elif (inner := getattr(target, "__wrapped__", None)) is not None:
            target = inner
        else:
            break
    if getattr(target, "__name__", None) != "run":
        return None
    owner = getattr(target, "__self__", None)
    autotuner = getattr(sys.modules.get(HEURISTICS), "CachingAutotuner", None)
    if not isinstance(autotuner, type) or not isinstance(owner, autotuner):
        return None
    launchers = getattr(owner, "launchers", None)
    if not isinstance(launchers, list) or launchers or getattr(owner, "triton_interpret", False):
        return None  # compiled already, or run() would not compile (interpreter mode)
    return owner if callable(getattr(owner, "precompile", None)) else None


def compile_first(fn: object) -> None:
    """Compile now, outside any region of this thread, what fn's first run would compile (see
    the module's text); its errors are raised here, as that run would raise them."""
    autotuner = lazy_autotuner(fn)
    if autotuner is None:
        return
    end_lingering()
    start = time.time_ns()
    autotuner.precompile()  # as CachingAutotuner.run does when it finds no launchers
    autotuner.precompile_time_taken_ns = time.time_ns() - start


def benchmark_region(fn: Callable[..., Any], label: str) -> Callable[..., Any]:
    """A benchmarker's `benchmark_gpu(self, _callable, ...)` as a region (labelled `label`),
    with what `_callable` compiles on its first run compiled before the region."""
    in_region = auto_region(label)(fn)

    @functools.wraps(fn)
    def benchmark_gpu(*args: Any, **kwargs: Any) -> Any:
        compile_first(args[1] if len(args) > 1 else kwargs.get("_callable"))
        return in_region(*args, **kwargs)

    setattr(benchmark_gpu, WRAPPED_MARK, True)
    return benchmark_gpu
