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
(docs/results.md, the autotuners' winners). Whether the pool is ready first is a race: it
was in every unprotected run and in most with `--settle`, never under plain krex there.

So on the releases the fallback wraps (autoregions.INDUCTOR_FALLBACK_TORCH) the wrapped
`benchmark_gpu` first does that compile itself, outside the region, ending the thread's
lingering region first: the same call the first run would make, with the same errors (raised
from `benchmark_gpu` as before, where Inductor ignores the choice). Only a callable that is a
`CachingAutotuner.run` (bound, or in a functools.partial, as `TritonBenchmarkRequest.
make_run_fn` builds it, or behind wrappers that set `__wrapped__`) is looked at; lambdas that
call a kernel are left as they are.

Triton's own `@triton.autotune` does the same on fresh caches: each configuration is JIT-compiled
by the first call of its timing (`Autotuner._bench` hands `do_bench` a call of the kernel), so
inside do_bench's region: 3.2-3.8 s for the bench suite's four 8192^3 configurations on the H200
(docs/results.md). On the releases this was read from (TRITON_RELEASES: triton 3.6 to 3.9's
triton/runtime/autotuner.py and jit.py, alike there), `_bench` first compiles its configuration
with the kernel's own `run(..., warmup=True)` (compile, no launch: what `JITFunction.warmup`
does), and a compile (`JITFunction._do_compile`) first ends the thread's lingering region, so that a
configuration already compiled still continues the autotuning's region. A configuration the
compiler rejects gets `_bench`'s own answer for it (infinite time); any other error is left for
the timing's own call to meet, as before. Other releases: one warning, nothing patched.

Both paths of Inductor's benchmarks (the wrapped benchmarkers here, the lock hook in
krex/tenant/autoregions.py) ask for a candidate's region only where Inductor's own tuning called the
benchmarker (`inductor_tuning`); a harness's own call of it is a timing.
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from krex.tenant import releases, timers
from krex.tenant.markers import WRAPPED_MARK, Region, auto_region, candidates, end_lingering

INDUCTOR = "torch._inductor."  # Inductor's modules
BENCHMARKING = "torch._inductor.runtime.benchmarking"  # Inductor's benchmarkers
HEURISTICS = "torch._inductor.runtime.triton_heuristics"  # where CachingAutotuner lives
TRITON_AUTOTUNER = timers.TRITON_AUTOTUNER  # Autotuner._bench
TRITON_JIT = "triton.runtime.jit"  # JITFunction._do_compile
TRITON_RELEASES = releases.TRITON_READ
# The compile errors Autotuner._bench answers with an infinite time (triton 3.6 to 3.9), by class
# name: they live in three modules, and only the names are needed.
REJECTED = frozenset({"OutOfResources", "CompileTimeAssertionFailure", "PTXASError"})
_REJECTED = object()  # compile_config's answer when the compiler rejected the config


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


def inductor_tuning(frame: FrameType | None) -> bool:
    """Whether Inductor's own tuning is what called its benchmarker: a frame of an Inductor
    module other than the benchmarkers' own from `frame` up (max-autotune's choices, a kernel's
    configurations, coordinate descent, multi-kernel, a subprocess autotuner's child). Its
    benchmarks are an autotuner's candidates; a harness that calls `benchmarker.benchmark_gpu`
    itself to time what it reports is not, and its region is a timing's, which the daemon's
    settle rules see (docs/user-guide.md)."""
    return timers.tuning_caller(frame, INDUCTOR, BENCHMARKING)


def inductor_region(label: str, frame: FrameType | None) -> Region:
    """The region of one Inductor GPU benchmark called from `frame` (see inductor_tuning)."""
    return auto_region(label, candidate=inductor_tuning(frame))


def benchmark_region(fn: Callable[..., Any], label: str) -> Callable[..., Any]:
    """A benchmarker's `benchmark_gpu(self, _callable, ...)` as a region (labelled `label`),
    with what `_callable` compiles on its first run compiled before the region."""

    @functools.wraps(fn)
    def benchmark_gpu(*args: Any, **kwargs: Any) -> Any:
        compile_first(args[1] if len(args) > 1 else kwargs.get("_callable"))
        with inductor_region(label, sys._getframe(1)):
            return fn(*args, **kwargs)

    setattr(benchmark_gpu, WRAPPED_MARK, True)
    return benchmark_gpu


def triton_release_ok() -> bool:
    """Whether the imported triton is one TRITON_RELEASES was read from; else one warning."""
    releases.warn_once("triton", releases.triton_gaps(), TRITON_RELEASES)
    return releases.version("triton").startswith(TRITON_RELEASES)


def ending_lingering(fn: Callable[..., Any], _label: str) -> Callable[..., Any]:
    """`JITFunction._do_compile` that first ends the thread's lingering region."""

    @functools.wraps(fn)
    def _do_compile(*args: Any, **kwargs: Any) -> Any:
        end_lingering()  # a no-op inside a region: only a lingering one is not a timing's
        return fn(*args, **kwargs)

    setattr(_do_compile, WRAPPED_MARK, True)
    return _do_compile


def compiling_first(fn: Callable[..., Any], _label: str) -> Callable[..., Any]:
    """`Autotuner._bench(self, *args, config, **meta)` that compiles its config first."""

    @functools.wraps(fn)
    def _bench(self: Any, *args: Any, config: Any, **meta: Any) -> Any:
        if compile_config(self, args, config, meta) is _REJECTED:
            return [float("inf")] * 3  # _bench's own answer to these errors (triton 3.6 to 3.9)
        with candidates():  # its do_bench times a candidate configuration
            return fn(self, *args, config=config, **meta)

    setattr(_bench, WRAPPED_MARK, True)
    return _bench


# What autoregions wraps on TRITON_RELEASES (module, attribute path, factory): its `_wrap`.
TRITON_PATCHES: tuple[tuple[str, str, Callable[[Callable[..., Any], str], Any]], ...] = (
    (TRITON_JIT, "JITFunction._do_compile", ending_lingering),
    (TRITON_AUTOTUNER, "Autotuner._bench", compiling_first),
)


def compile_config(
    autotuner: Any, args: tuple[Any, ...], config: Any, meta: dict[str, Any]
) -> object:
    """Compile (no launch) what `autotuner._bench(*args, config=config, **meta)` would
    compile on its first call, as that call would, config.pre_hook first (it may set what the
    kernel is specialized on, a TMA descriptor's block shape); _REJECTED if the compiler
    rejects the config, else None. Other errors are left for the timing's own call."""
    current = dict(meta, **config.all_kwargs())
    try:
        if config.pre_hook:
            config.pre_hook({**autotuner.nargs, **current})
        autotuner.fn.run(*args, **{**current, "warmup": True})
    except Exception as error:  # the timing's own call meets it again (or does not)
        if any(k.__name__ in REJECTED for k in type(error).__mro__):
            return _REJECTED
    return None
