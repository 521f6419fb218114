"""Kernel libraries' timers as auto-regions (krex/tenant/timers.py), against stand-ins of the
real packages' call structure, in unmodified child processes of a fake daemon. The same
timers against the real packages: tests/test_timers_real.py (opt-in, `make test-real`)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_daemon import FakeDaemon

from krex.tenant import autoregions, timers

TENANT = 7
KREX_ENV = ("KREX_SOCKET", "KREX_TENANT", "KREX_REGION_LINGER_S", "KREX_AUTO_REGIONS")


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[FakeDaemon]:
    with FakeDaemon(tmp_path / "krex.sock") as d:
        yield d


def run_auto(
    daemon: FakeDaemon, root: Path, script: str, python: str = sys.executable
) -> subprocess.CompletedProcess[str]:
    """`python -c script` under the default auto-regions, stand-ins under `root` first on its
    path, as a tenant of `daemon`, regions not lingering (one per outermost call)."""
    env = {k: v for k, v in os.environ.items() if k not in KREX_ENV}
    env.update(autoregions.env_for(autoregions.DEFAULT_AUTO_REGIONS, {"PYTHONPATH": str(root)}))
    env.update(daemon.env(TENANT))
    env["KREX_REGION_LINGER_S"] = "0"
    return subprocess.run(
        [python, "-c", textwrap.dedent(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=root,  # not the source tree, which would put krex on the path
    )


def ran(result: subprocess.CompletedProcess[str]) -> list[str]:
    """The lines a child that ran cleanly (status 0, nothing on stderr) printed."""
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    return result.stdout.splitlines()


def write_files(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text))


WHERE = """
def where(what):
    import krex.tenant.markers as m
    print(what, "in a region" if m.region_depth() else "outside any region")
"""

FLASHINFER = {
    "flashinfer/__init__.py": "",
    "flashinfer/testing/__init__.py": '''
        """Stand-in of flashinfer 0.7.4's flashinfer/testing/__init__.py: its re-exports."""
        from .utils import (
            bench_gpu_time,
            bench_gpu_time_with_cuda_event,
            bench_gpu_time_with_cudagraph,
            bench_gpu_time_with_cupti,
        )
        ''',
    "flashinfer/testing/utils.py": '''
        """Stand-in of flashinfer 0.7.4's flashinfer/testing/utils.py, its call structure: the
        bench_gpu_time dispatcher calls the three timers by this module's global names, and the
        CUPTI timer has no CUDA-event pair around its timed loop."""
        from krex_where import where


        def bench_gpu_time_with_cupti(fn, use_cuda_graph=False, cold_l2_cache=True):
            where("cupti loop")
            fn()
            return [1.0]


        def bench_gpu_time_with_cuda_event(fn, cold_l2_cache=True):
            fn()
            return [2.0]


        def bench_gpu_time_with_cudagraph(fn, cold_l2_cache=True):
            fn()
            return [3.0]


        def bench_gpu_time(fn, enable_cupti=False, use_cuda_graph=False, cold_l2_cache=True):
            if enable_cupti:
                return bench_gpu_time_with_cupti(fn, use_cuda_graph=use_cuda_graph)
            if use_cuda_graph:
                return bench_gpu_time_with_cudagraph(fn)
            return bench_gpu_time_with_cuda_event(fn)
        ''',
    "krex_where.py": WHERE,
}


def test_flashinfers_timers_are_regions(daemon: FakeDaemon, tmp_path: Path) -> None:
    """flashinfer's bench_gpu_time (each of its paths) and its CUPTI timer called directly are
    one region each, named after the outermost timer, through the package's re-exports."""
    write_files(tmp_path, FLASHINFER)
    result = run_auto(
        daemon,
        tmp_path,
        """
        from flashinfer.testing import bench_gpu_time, bench_gpu_time_with_cupti
        print(bench_gpu_time(int, enable_cupti=True), bench_gpu_time(int, use_cuda_graph=True))
        print(bench_gpu_time(int), bench_gpu_time_with_cupti(int))
        """,
    )
    assert ran(result) == [
        "cupti loop in a region",
        "[1.0] [3.0]",
        "cupti loop in a region",
        "[2.0] [1.0]",
    ]
    assert daemon.ops() == ["region_begin", "region_end"] * 4
    utils = timers.FLASHINFER
    assert daemon.calls == [
        {f"{utils}.bench_gpu_time": 1},
        {f"{utils}.bench_gpu_time": 1},
        {f"{utils}.bench_gpu_time": 1},
        {f"{utils}.bench_gpu_time_with_cupti": 1},
    ]
    assert daemon.candidate == [False] * 4  # timings a command reports


TRITON = {
    "triton/__init__.py": """
        '''Stand-in of triton 3.9.0's package: its version and submodules.'''
        __version__ = "3.9.0"
        from triton import runtime, testing  # noqa: F401
        """,
    "triton/runtime/__init__.py": "from triton.runtime import autotuner, driver  # noqa: F401\n",
    "triton/runtime/driver.py": '''
        """Stand-in of triton 3.9.0's triton/runtime/driver.py and the NVIDIA driver's
        get_benchmarker (third_party/nvidia/backend/driver.py): triton.testing.do_bench,
        looked up at the call."""


        class CudaDriver:
            def get_benchmarker(self):
                from triton.testing import do_bench
                return do_bench


        class DriverConfig:
            active = CudaDriver()


        driver = DriverConfig()
        ''',
    "triton/runtime/autotuner.py": '''
        """Stand-in of triton 3.9.0's triton/runtime/autotuner.py, where it times: the do_bench
        cached_property (the do_bench= given, else the driver's benchmarker) that _bench calls
        with a call of the kernel."""
        from functools import cached_property

        from triton.runtime.driver import driver


        class Config:
            def __init__(self, kwargs):
                self.kwargs = kwargs

            def all_kwargs(self):
                return dict(self.kwargs)


        class Autotuner:
            def __init__(self, fn, configs, do_bench=None):
                self.fn, self.configs, self._do_bench, self.nargs = fn, configs, do_bench, {}

            @cached_property
            def do_bench(self):
                if self._do_bench is None:
                    return driver.active.get_benchmarker()
                return self._do_bench

            def _bench(self, *args, config, **meta):
                def kernel_call():
                    self.fn(*args, **config.all_kwargs())

                return self.do_bench(kernel_call, quantiles=(0.5, 0.2, 0.8))

            def run(self, *args):
                timings = {c: self._bench(*args, config=c) for c in self.configs}
                return min(timings.values())
        ''',
    "triton/testing.py": '''
        """Stand-in of triton 3.9.0's triton/testing.py: do_bench and the Proton timers each
        call fn (Proton scopes, no CUDA-event pair around the timed loop)."""
        from krex_where import where


        def do_bench(fn, warmup=25, rep=100, quantiles=None, return_mode="mean"):
            fn()
            return [1.0, 1.0, 1.0] if quantiles else 1.0


        def do_bench_proton(fn, warmup=25, rep=100, quantiles=None, return_mode="mean"):
            where("proton scopes")
            fn()
            return 2.0


        def do_bench_cudagraph_proton(fn, rep=20, quantiles=None, return_mode="mean"):
            fn()
            return 3.0
        ''',
    "krex_where.py": WHERE,
}


def test_tritons_proton_timers_are_regions(daemon: FakeDaemon, tmp_path: Path) -> None:
    """triton 3.8 and 3.9's do_bench_proton and do_bench_cudagraph_proton: a region each."""
    write_files(tmp_path, TRITON)
    result = run_auto(
        daemon,
        tmp_path,
        """
        import triton.testing
        print(triton.testing.do_bench_proton(int), triton.testing.do_bench_cudagraph_proton(int))
        """,
    )
    assert ran(result) == ["proton scopes in a region", "2.0 3.0"]
    assert daemon.calls == [
        {"triton.testing.do_bench_proton": 1},
        {"triton.testing.do_bench_cudagraph_proton": 1},
    ]
    assert daemon.candidate == [False, False]


def test_tritons_autotuner_times_candidates_with_whatever_timer_it_has(
    daemon: FakeDaemon, tmp_path: Path
) -> None:
    """Triton's autotuner, through its do_bench property: the driver's benchmarker (the wrapped
    do_bench, keeping its label), a do_bench= that calls a wrapped timer, and one that times by
    itself (its own region) are all candidates' regions; a harness's own do_bench stays a
    timing's."""
    write_files(tmp_path, TRITON)
    result = run_auto(
        daemon,
        tmp_path,
        """
        import triton.testing
        from triton.runtime.autotuner import Autotuner, Config
        configs = [Config({"BLOCK": 64}), Config({"BLOCK": 128})]
        def own_timer(kernel_call, quantiles):
            kernel_call()
            return [0.5, 0.5, 0.5]
        proton = lambda call, quantiles: triton.testing.do_bench_proton(call, quantiles=quantiles)
        for bench in (None, proton, own_timer):
            print(Autotuner(lambda BLOCK: None, configs, do_bench=bench).run())
        print(triton.testing.do_bench(int))
        """,
    )
    lines = ran(result)
    assert lines[0] == "[1.0, 1.0, 1.0]" and lines[-1] == "1.0", lines
    assert daemon.ops() == ["region_begin", "region_end"] * 7
    proton = {timers.AUTOTUNER_LABEL: 1}  # the lambda's region, the outermost
    assert daemon.calls == [
        {"triton.testing.do_bench": 1},
        {"triton.testing.do_bench": 1},
        proton,
        proton,
        {timers.AUTOTUNER_LABEL: 1},
        {timers.AUTOTUNER_LABEL: 1},
        {"triton.testing.do_bench": 1},
    ]
    assert daemon.candidate == [True] * 6 + [False]


HELION = {
    "helion/__init__.py": "",
    "helion/autotuner/__init__.py": "",
    "helion/autotuner/benchmarking.py": '''
        """Stand-in of helion 1.5.1's helion/autotuner/benchmarking.py: interleaved_bench warms
        each function up, then times them in turn; do_bench, its steady-window timer."""
        from krex_where import where


        def interleaved_bench(fns, *, repeat, desc=None, max_total_ms=None, **kwargs):
            for fn in fns:
                fn()
            where("interleaved")
            return [1.0 for _ in fns]


        def interleaved_bench_generic(fns, *, repeat, desc=None, **kwargs):
            return [2.0 for _ in fns]


        def do_bench(fn, warmup=25, rep=100, return_mode="mean", **kwargs):
            fn()
            return 3.0
        ''',
    "helion/autotuner/base_search.py": '''
        """Stand-in of helion 1.5.1's helion/autotuner/base_search.py: the names imported from
        benchmarking when the module loads, and the rebenchmark of the best configurations
        through interleaved_bench (a functools.partial of it) or do_bench."""
        import functools

        from .benchmarking import do_bench
        from .benchmarking import interleaved_bench


        class BaseSearch:
            def rebenchmark(self, fns, use_interleaved=True):
                if use_interleaved:
                    bench = functools.partial(interleaved_bench, max_total_ms=100.0)
                    return bench(fns, repeat=3)
                return [do_bench(fn, return_mode="median") for fn in fns]
        ''',
    "helion/_testing.py": '''
        """Stand-in of helion 1.5.1's helion/_testing.py: run_example times the kernels it
        compares through interleaved_bench, to report them."""
        from .autotuner.benchmarking import interleaved_bench


        def run_example(fns):
            return interleaved_bench(fns, repeat=3)
        ''',
    "krex_where.py": WHERE,
}


def test_helions_benchmarks_are_candidates_where_its_autotuner_calls_them(
    daemon: FakeDaemon, tmp_path: Path
) -> None:
    """Helion's interleaved_bench and do_bench are regions (the warm-up inside); called by its
    autotuner (through the names base_search imported) they are candidates', called by
    run_example or a harness, timings'."""
    write_files(tmp_path, HELION)
    result = run_auto(
        daemon,
        tmp_path,
        """
        from helion._testing import run_example
        from helion.autotuner import benchmarking
        from helion.autotuner.base_search import BaseSearch
        fns = [lambda: None, lambda: None]
        print(BaseSearch().rebenchmark(fns), BaseSearch().rebenchmark(fns, use_interleaved=False))
        print(run_example(fns), benchmarking.interleaved_bench_generic(fns, repeat=1))
        """,
    )
    assert ran(result) == [
        "interleaved in a region",
        "[1.0, 1.0] [3.0, 3.0]",
        "interleaved in a region",
        "[1.0, 1.0] [2.0, 2.0]",
    ]
    module = timers.HELION
    assert daemon.calls == [
        {f"{module}.interleaved_bench": 1},
        {f"{module}.do_bench": 1},
        {f"{module}.do_bench": 1},
        {f"{module}.interleaved_bench": 1},
        {f"{module}.interleaved_bench_generic": 1},
    ]
    assert daemon.candidate == [True, True, True, False, False]


def test_a_python_without_krex_gets_the_regions(daemon: FakeDaemon, tmp_path: Path) -> None:
    """A command's Python that cannot import krex (another environment's) finds it through the
    sitecustomize, which appends the directory holding the krex package (krex/tenant/_auto is
    three levels down): its timers are regions, with no `krex:` line."""
    base = getattr(sys, "_base_executable", "")
    probe = [base, "-c", "import krex"]
    found = subprocess.run(probe, capture_output=True, timeout=60, cwd=tmp_path) if base else None
    if found is None or found.returncode == 0:
        pytest.skip("no Python without krex beside this one")
    write_files(tmp_path, FLASHINFER)
    script = "from flashinfer.testing import bench_gpu_time\nprint(bench_gpu_time(int))"
    result = run_auto(daemon, tmp_path, script, python=base)
    assert (result.returncode, result.stdout, result.stderr) == (0, "[2.0]\n", ""), result.stderr
    assert daemon.calls == [{f"{timers.FLASHINFER}.bench_gpu_time": 1}]
