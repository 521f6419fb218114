"""Auto-regions: wrap named benchmark callables in regions, with no change to the user's code.

`krex run --auto-regions` puts `env_for(names)` into a tenant's environment. Every Python
process of the tenant then imports `krex/tenant/_auto/sitecustomize.py`, which calls `install()`:
each named callable is wrapped in `krex.region()` as soon as its module is imported (at once if it
already is). A wrapped call is one region from its first line to its return, so it covers all
of a timing call: do_bench's first call, its estimate, warm-up, L2 flushes and final sync
(docs/user-guide.md, "Auto-regions"). Auto-regions linger (krex/tenant/markers.py, auto_region()): a
timing that follows within KREX_REGION_LINGER_S continues the same region, so an autotuner's
configurations and a harness's trials are timed in one region, alike. Where the installed torch
has Inductor's `set_gpu_benchmark_lock_context` (pytorch PR #184905), every Inductor GPU
benchmark is put in a region through it as well; on torch 2.11, which predates it, through its
benchmarkers' `benchmark_gpu` (INDUCTOR_FALLBACK), each of which first compiles, outside the
region, a Triton kernel its benchmark would compile (krex/tenant/precompile.py); on other releases
without the hook, one warning (krex/tenant/releases.py: per library, one line naming what is not
covered on a release). Triton's `@triton.autotune` compiles each configuration before its
do_bench region too, on triton 3.6 to 3.9 (krex/tenant/precompile.py), and times it as a
candidate with whatever timer it was given (krex/tenant/timers.py, with flashinfer's, Triton's
Proton and Helion's timers).
cuDNN's benchmark-mode search runs in a region too: the first call of each convolution
configuration while `torch.backends.cudnn.benchmark` is on (krex/tenant/cudnn.py); and so does a
plain CUDA-event timing, from a timing event's record outside any region to `elapsed_time`
(krex/tenant/events.py). PyTorch's TunableOp, which times GEMMs inside the op, is not covered: a
process where it tunes says so once (krex/tenant/tunableop.py).
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import os
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from krex.tenant import cudnn, events, precompile, releases, timers, tunableop
from krex.tenant.markers import WRAPPED_MARK, auto_region

ENV_VAR = "KREX_AUTO_REGIONS"
DEFAULT_AUTO_REGIONS = (
    "triton.testing.do_bench",
    "triton.testing.do_bench_cudagraph",
    "torch.utils.benchmark.Timer.timeit",
    "torch.utils.benchmark.Timer.blocked_autorange",
    "torch.utils.benchmark.Timer.adaptive_autorange",
    # KernelBench's timers (src/kernelbench/timing.py): what its get_timing_function returns,
    # looked up by name at call time, so the wrapped ones are what it hands out.
    "kernelbench.timing.time_execution_with_cuda_event",
    "kernelbench.timing.time_execution_with_do_bench_interface",
    "kernelbench.timing.time_execution_with_do_bench_impl",
    "kernelbench.timing.time_execution_with_host_time",
    "kernelbench.timing.time_execution_with_nsight_python",
    # flashinfer's, Triton's Proton timers and Helion's (krex/tenant/timers.py).
    *timers.DEFAULTS,
)
# Inductor's hook for an external benchmark lock (pytorch PR #184905): it takes a factory of
# context managers that must allow nested entry from one thread, which regions do.
INDUCTOR_MODULE = precompile.BENCHMARKING
INDUCTOR_HOOK = releases.INDUCTOR_HOOK
INDUCTOR_LABEL = f"{INDUCTOR_MODULE} (GPU benchmark)"  # its regions' name in `calls`
# Without the hook: the benchmarkers every Inductor GPU benchmark goes through (max-autotune's
# choices, coordinate descent, the Triton configs of its kernels), read from torch 2.11's
# torch/_inductor/runtime/benchmarking.py; wrapped only on the releases they were read from.
INDUCTOR_FALLBACK = ("TritonBenchmarker.benchmark_gpu", "InductorBenchmarker.benchmark_gpu")
INDUCTOR_FALLBACK_TORCH = releases.INDUCTOR_FALLBACK_TORCH

AUTO_DIR = Path(__file__).resolve().parent / "_auto"


def env_for(names: Sequence[str], base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables `krex run --auto-regions` adds to a tenant's environment.

    Args:
        names: dotted paths of the callables to wrap (see DEFAULT_AUTO_REGIONS).
        base: the environment being extended (default: os.environ); its PYTHONPATH is kept,
            after the directory of our sitecustomize.

    Returns:
        KREX_AUTO_REGIONS and PYTHONPATH.
    """
    parse(",".join(names))  # a bad name fails here, in `krex run`, not in every child
    environ = os.environ if base is None else base
    rest = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(AUTO_DIR)]
    # Only the sitecustomize directory goes first. The directory that holds krex (in a wheel
    # install, a whole site-packages) is appended by the sitecustomize only when the child
    # cannot import krex by itself, so it never shadows the child's own packages.
    return {ENV_VAR: ",".join(names), "PYTHONPATH": os.pathsep.join([str(AUTO_DIR), *rest])}


def parse(value: str) -> list[str]:
    """The names of a KREX_AUTO_REGIONS value (comma-separated dotted paths).

    Raises:
        ValueError: a name is not a dotted path of identifiers with at least one dot.
    """
    names = [name.strip() for name in value.split(",") if name.strip()]
    for name in names:
        parts = name.split(".")
        if len(parts) < 2 or not all(part.isidentifier() for part in parts):
            raise ValueError(f"{ENV_VAR}: {name!r} is not a dotted path such as module.function")
    return names


class _Registry:
    """What install() asked for, keyed by the modules whose import may make it resolvable."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        # module name -> attribute paths under it ("Timer.timeit"); for a.b.c.f every split
        # (a.b.c + f, a.b + c.f, a + b.c.f): which prefix is the module is known only on import.
        self.watched: dict[str, set[str]] = {}
        # Full dotted name -> how to wrap it, for names not wrapped in a plain region.
        self.factories: dict[str, Callable[[Any, str], Any]] = {}
        # Module name -> what to run with the module once it is imported (beyond wrapping).
        self.hooks: dict[str, list[Callable[[ModuleType], None]]] = {}
        self.requested: set[str] = set()  # the names install() was given
        self.resolved: set[str] = set()  # those found (and wrapped) in this process


_registry = _Registry()


def install(
    names: Iterable[str] = DEFAULT_AUTO_REGIONS,
    *,
    inductor: bool = True,
    cudnn_search: bool = True,
    cuda_events: bool = True,
    tunable_op: bool = True,
    triton_compile: bool = True,
) -> None:
    """Wrap each named callable in a region, now or when its module is imported.

    Idempotent; names whose module is never imported cost nothing. With `inductor`, a torch
    that has Inductor's GPU benchmark lock hook gets a region registered into it (or its
    benchmarkers wrapped, see INDUCTOR_FALLBACK). With `cudnn_search`, cuDNN's benchmark-mode
    search of each new convolution configuration runs in a region (krex/tenant/cudnn.py). With
    `cuda_events`, a plain CUDA-event timing (a timing event recorded outside any region, until
    `elapsed_time` is read) is a region (krex/tenant/events.py). With `tunable_op`, a process whose
    PyTorch TunableOp tunes (its GEMM timings cannot be regions) says so once
    (krex/tenant/tunableop.py).
    Where a name under `triton.` is wrapped, Triton's autotuner times its configurations as
    candidates, whatever its timer (krex/tenant/timers.py); with `triton_compile`, it compiles
    each configuration before its timing's region (krex/tenant/precompile.py).

    Raises:
        ValueError: a name is not a dotted path (see parse()).
    """
    names = parse(",".join(names))
    with _registry.lock:
        _registry.requested.update(names)
        for name in names:
            parts = name.split(".")
            for cut in range(len(parts) - 1, 0, -1):
                prefix = ".".join(parts[:cut])
                _registry.watched.setdefault(prefix, set()).add(".".join(parts[cut:]))
        for name in timers.CALLERS:  # a candidate's region where their autotuner calls them
            _registry.factories[name] = timers.by_caller
        _arm_torch(inductor, cudnn_search, cuda_events, tunable_op)
        if any(name.startswith("triton.") for name in _registry.requested):
            _arm_triton(triton_compile)
        if _FINDER not in sys.meta_path:
            sys.meta_path.insert(0, _FINDER)
        # Longest module names first: a.b.c's own attribute is the one to wrap, before a.b's
        # re-export of it is reached (then found wrapped already).
        for module_name in sorted(_registry.watched, key=len, reverse=True):
            module = sys.modules.get(module_name)
            if module is not None:
                _on_import(module)


def _arm_torch(inductor: bool, cudnn_search: bool, cuda_events: bool, tunable_op: bool) -> None:
    """install()'s torch parts (see its arguments); caller holds the registry's lock."""
    if inductor:
        _hook(INDUCTOR_MODULE, _register_inductor)
        for path in INDUCTOR_FALLBACK:  # a kernel's lazy compile kept out of the region
            _registry.factories[f"{INDUCTOR_MODULE}.{path}"] = precompile.benchmark_region
    if cudnn_search:
        # Under `torch` only: wrapped once torch's own import is complete.
        _registry.watched.setdefault("torch", set()).update(cudnn.TORCH_PATHS)
        for path in cudnn.TORCH_PATHS:
            _registry.factories[f"torch.{path}"] = cudnn.search_region
        _hook(cudnn.INDUCTOR_CONV_MODULE, _inductor_conv)
    if cuda_events:
        _hook("torch", events.install)
    if tunable_op:
        _hook("torch", tunableop.on_torch)
        _hook(tunableop.MODULE, tunableop.install)


def _arm_triton(triton_compile: bool) -> None:
    """install()'s triton parts: its autotuner's timer as a candidate's (timers.py) and, with
    `triton_compile`, its compiles before their timings' regions; caller holds the lock."""
    _hook(timers.TRITON_AUTOTUNER, _triton_seam)
    if triton_compile:
        for module_name, path, factory in precompile.TRITON_PATCHES:
            _registry.factories[f"{module_name}.{path}"] = factory
            _hook(module_name, _triton_fallback)


def _hook(module_name: str, hook: Callable[[ModuleType], None]) -> None:
    """Run hook(module) once `module_name` is imported (at once if it is); caller holds the
    registry's lock."""
    hooks = _registry.hooks.setdefault(module_name, [])
    if hook not in hooks:
        hooks.append(hook)
    _registry.watched.setdefault(module_name, set())


def _on_import(module: ModuleType) -> None:
    with _registry.lock:
        paths = sorted(_registry.watched.get(module.__name__, ()))
        hooks = list(_registry.hooks.get(module.__name__, ()))
    for path in paths:
        _wrap(module, path)
    for hook in hooks:
        hook(module)


def _wrap(module: ModuleType, path: str) -> None:
    """Replace module.<path> by a region-wrapped version, if it exists and is not yet wrapped."""
    *owners, attr = path.split(".")
    owner: Any = module
    for name in owners:
        owner = _lookup(owner, name)
        if owner is None:
            return  # not there (yet): a later import may bring it
    raw = _lookup(owner, attr)
    if raw is None:
        return
    kind = type(raw) if isinstance(raw, (staticmethod, classmethod)) else None
    fn = raw.__func__ if kind is not None else raw
    if not callable(fn):
        return
    full = f"{module.__name__}.{path}"
    with _registry.lock:
        _registry.resolved.add(full)
        factory = _registry.factories.get(full)
    if getattr(fn, WRAPPED_MARK, False):
        return
    # A timer krex knows is made again where its region is revoked for memory (a retake,
    # krex/tenant/markers.py); a callable the user named may do more than time, so it is not.
    region = auto_region(full, retakes=full in DEFAULT_AUTO_REGIONS)
    wrapped: Any = factory(fn, full) if factory is not None else region(fn)
    setattr(owner, attr, kind(wrapped) if kind is not None else wrapped)


LOG_VAR = "KREX_AUTO_REGIONS_LOG"  # where each process notes, at exit, the names it resolved


def resolution() -> dict[str, list[str]]:
    """The names install() was given and those resolved in this process so far."""
    with _registry.lock:
        return {"requested": sorted(_registry.requested), "resolved": sorted(_registry.resolved)}


def note_at_exit(path: str) -> None:
    """At this process's exit, append what it resolved to `path` (one JSON line), so that
    `krex run` can say which names no process of the command ever found."""
    import atexit
    import json

    def note() -> None:
        from krex.core.trust import TrustError, open_beside

        # A name in the shared temporary directory: never through a link someone planted.
        with contextlib.suppress(OSError, TrustError):
            fd = open_beside(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            with os.fdopen(fd, "a", encoding="utf-8") as f:
                f.write(json.dumps({"pid": os.getpid(), **resolution()}) + "\n")

    atexit.register(note)


def unresolved(path: Path, requested: Sequence[str]) -> list[str]:
    """Of `requested`, the names no process that noted in `path` resolved (all of them when
    none noted: the command ran no Python, or none of its processes got that far)."""
    from krex.core.trust import TrustError, open_beside

    found: set[str] = set()
    with contextlib.suppress(OSError, TrustError):
        import json

        with os.fdopen(open_beside(path, os.O_RDONLY), encoding="utf-8") as f:
            text = f.read()
        for line in text.splitlines():
            with contextlib.suppress(ValueError, TypeError, AttributeError):
                found.update(str(n) for n in json.loads(line).get("resolved", []))
    return [n for n in requested if n not in found]


def _lookup(owner: Any, attr: str) -> Any:
    """owner.attr as stored: no module __getattr__ runs (it may import), and a class gives
    its staticmethod or classmethod object itself, not what that binds."""
    if isinstance(owner, type):
        for klass in owner.__mro__:
            if attr in vars(klass):
                return vars(klass)[attr]
        return None
    if isinstance(owner, ModuleType):
        return vars(owner).get(attr)
    return None


def _register_inductor(module: ModuleType) -> None:
    setter = getattr(module, INDUCTOR_HOOK, None)
    releases.warn_once("torch", releases.torch_gaps(callable(setter)), releases.TORCH_READ)
    if not callable(setter):
        _inductor_fallback(module)
        return
    previous = setter(_inductor_region)
    if previous is None or previous is _inductor_region or getattr(previous, WRAPPED_MARK, False):
        return  # nothing of theirs to keep, or ours already
    # Someone registered their own lock first: keep it, outside the region, so that waiting
    # for their lock never holds the GPU closed to everyone else.

    @contextlib.contextmanager
    def both() -> Iterator[None]:
        with previous(), precompile.inductor_region(INDUCTOR_LABEL, sys._getframe(1)):
            yield

    setattr(both, WRAPPED_MARK, True)
    setter(both)


def _inductor_fallback(module: ModuleType) -> None:
    """A torch without the hook: its benchmarkers' benchmark_gpu wrapped, on the releases
    INDUCTOR_FALLBACK was read from (a patch of internals we have not read could wrap the wrong
    thing; releases.warn_once() says what is left out)."""
    if releases.version("torch").startswith(INDUCTOR_FALLBACK_TORCH):
        for path in INDUCTOR_FALLBACK:
            _wrap(module, path)


def _triton_fallback(module: ModuleType) -> None:
    """A Triton module of precompile.TRITON_PATCHES imported: its compile moved out of the
    timing's region, on the triton releases that was read from (else one warning)."""
    if precompile.triton_release_ok():
        for module_name, path, _factory in precompile.TRITON_PATCHES:
            if module_name == module.__name__:
                _wrap(module, path)


def _triton_seam(module: ModuleType) -> None:
    """Triton's autotuner imported: what it times with is a candidate's benchmark, on the
    releases read (else one warning)."""
    if precompile.triton_release_ok():
        timers.wrap_autotuner_seam(module)


def _inductor_conv(_module: ModuleType) -> None:
    """Inductor's extern convolution wrapped (krex/tenant/cudnn.py), on the releases it was read
    from; elsewhere releases.warn_once() says so."""
    benchmarking = sys.modules.get(INDUCTOR_MODULE)
    has_hook = None if benchmarking is None else callable(vars(benchmarking).get(INDUCTOR_HOOK))
    releases.warn_once("torch", releases.torch_gaps(has_hook), releases.TORCH_READ)
    if releases.version("torch").startswith(cudnn.INDUCTOR_TORCH):
        cudnn.wrap_inductor_conv()


def _inductor_region() -> contextlib.AbstractContextManager[None]:
    # Called by the benchmarker inside benchmark_gpu: whoever called that is up the stack.
    return precompile.inductor_region(INDUCTOR_LABEL, sys._getframe(1))


class _PostImportLoader(importlib.abc.Loader):
    """A loader that runs the real one, then wraps what was asked for in the fresh module.

    It stands in only while the module executes: afterwards the module's __loader__ and
    __spec__.loader are the real loader again, for everything that inspects them.
    """

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        try:
            self.loader.exec_module(module)
        finally:
            if getattr(module, "__loader__", None) is self:
                module.__loader__ = self.loader
            spec = getattr(module, "__spec__", None)
            if spec is not None and spec.loader is self:
                spec.loader = self.loader
        _on_import(module)

    def __getattr__(self, name: str) -> Any:
        # get_source, get_resource_reader, is_package...: whatever the real loader offers.
        return getattr(self.loader, name)


class _Finder(importlib.abc.MetaPathFinder):
    """First on sys.meta_path; for a watched module, asks the finders after it for the spec and
    puts the post-import loader in front of the real one. Other modules pass untouched."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        with _registry.lock:
            if fullname not in _registry.watched:
                return None
        finders = list(sys.meta_path)
        rest = finders[finders.index(self) + 1 :] if self in finders else finders
        for finder in rest:
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec: importlib.machinery.ModuleSpec | None = find(fullname, path, target)
            if spec is None:
                continue
            loader = spec.loader
            if loader is not None and hasattr(loader, "exec_module"):
                spec.loader = _PostImportLoader(loader)
            return spec
        return None


_FINDER = _Finder()
