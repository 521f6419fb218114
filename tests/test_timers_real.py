"""Auto-regions against the real packages, on the CPU: torch 2.13.0+cpu (its Inductor lock
hook), triton 3.9.0, flashinfer-python 0.7.4 and helion 1.5.1, installed in another Python
(`make test-real` builds it and sets KREX_REAL_PYTHON; skipped without it). With no GPU a timer
fails inside its call (no CUDA driver, no device properties), after its region began: each test
checks that the real callable was wrapped, which region its call held and what it was named,
and that the real code's own error still reaches the caller."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_daemon import FakeDaemon
from test_timers import run_auto

from krex.tenant import autoregions, timers

PYTHON = (
    os.path.abspath(os.environ["KREX_REAL_PYTHON"]) if os.environ.get("KREX_REAL_PYTHON") else ""
)
pytestmark = pytest.mark.skipif(not PYTHON, reason="KREX_REAL_PYTHON unset (make test-real)")
# Run first in each script: what the real package's version is, as a line of its own.
VERSIONS = """
import importlib.metadata as md
print(*(md.version(p) for p in ("torch", "triton", "flashinfer-python", "helion")))
"""


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[FakeDaemon]:
    with FakeDaemon(tmp_path / "krex.sock") as d:
        yield d


def run_real(daemon: FakeDaemon, tmp_path: Path, script: str) -> list[str]:
    result = run_auto(daemon, tmp_path, VERSIONS + textwrap.dedent(script), python=PYTHON)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "2.13.0+cpu 3.9.0 0.7.4 1.5.1", lines
    return lines[1:]


def test_real_flashinfer_timers(daemon: FakeDaemon, tmp_path: Path) -> None:
    """flashinfer 0.7.4: bench_gpu_time (to its CUPTI timer) and the CUPTI timer itself."""
    lines = run_real(
        daemon,
        tmp_path,
        """
        from flashinfer.testing import bench_gpu_time, bench_gpu_time_with_cupti
        for call in (lambda: bench_gpu_time(int, enable_cupti=True),
                     lambda: bench_gpu_time_with_cupti(int)):
            try:
                call()
            except Exception as e:
                print("raised", type(e).__name__)
        """,
    )
    assert len(lines) == 2 and all(line.startswith("raised ") for line in lines), lines
    assert daemon.calls == [
        {f"{timers.FLASHINFER}.bench_gpu_time": 1},
        {f"{timers.FLASHINFER}.bench_gpu_time_with_cupti": 1},
    ]


def test_real_triton_proton_timers_and_autotuner_seam(daemon: FakeDaemon, tmp_path: Path) -> None:
    """triton 3.9.0: do_bench_proton and do_bench_cudagraph_proton are regions; its Autotuner,
    given its own do_bench, times each configuration in a candidate's region of that timer."""
    lines = run_real(
        daemon,
        tmp_path,
        """
        import triton.testing
        from triton.runtime.autotuner import Autotuner, Config
        for timer in (triton.testing.do_bench_proton, triton.testing.do_bench_cudagraph_proton):
            try:
                timer(int)
            except Exception as e:
                print("raised", type(e).__name__)
        def kernel(x, BLOCK):
            pass
        tuner = Autotuner(kernel, ["x"], [Config({"BLOCK": 64})], key=["x"], reset_to_zero=None,
                          restore_value=None, do_bench=lambda call, quantiles: [0.5] * 3)
        tuner.nargs = {"x": 1}
        print(tuner._bench(1, config=Config({"BLOCK": 64})))
        """,
    )
    assert lines[-1] == "[0.5, 0.5, 0.5]" and len(lines) == 3, lines
    assert daemon.calls == [
        {"triton.testing.do_bench_proton": 1},
        {"triton.testing.do_bench_cudagraph_proton": 1},
        {timers.AUTOTUNER_LABEL: 1},
    ]
    assert daemon.candidate == [False, False, True]


def test_real_helion_benchmarks(daemon: FakeDaemon, tmp_path: Path) -> None:
    """helion 1.5.1: interleaved_bench is wrapped where it is defined and in the name its
    autotuner's base_search imported; a harness's call is a timing's region."""
    lines = run_real(
        daemon,
        tmp_path,
        """
        from helion.autotuner import base_search, benchmarking
        print(base_search.interleaved_bench is benchmarking.interleaved_bench,
              base_search.do_bench is benchmarking.do_bench,
              getattr(benchmarking.interleaved_bench, "__krex_region__", False))
        def fn():
            import krex.tenant.markers as m
            raise RuntimeError(f"warm-up at depth {m.region_depth()}")
        try:
            benchmarking.interleaved_bench([fn], repeat=1)
        except Exception as e:
            print("raised", e)
        """,
    )
    assert lines == ["True True True", "raised warm-up at depth 1"], lines
    assert daemon.calls == [{f"{timers.HELION}.interleaved_bench": 1}]
    assert daemon.candidate == [False]


def test_real_torch_inductor_lock_hook(daemon: FakeDaemon, tmp_path: Path) -> None:
    """torch 2.13.0+cpu: auto-regions register into set_gpu_benchmark_lock_context, with no
    warning (all covered there); a harness's benchmark_gpu call holds a timing's region."""
    lines = run_real(
        daemon,
        tmp_path,
        """
        from torch._inductor.runtime import benchmarking
        from torch._inductor.codegen import multi_kernel
        previous = benchmarking.set_gpu_benchmark_lock_context(None)
        print(previous.__module__, previous.__name__)
        benchmarking.set_gpu_benchmark_lock_context(previous)
        try:
            benchmarking.benchmarker.benchmark_gpu(int)
        except Exception as e:
            print("raised", type(e).__name__)
        call = multi_kernel.MultiKernelCall.__new__(multi_kernel.MultiKernelCall)
        call._kernels = []
        print(call.benchmark_sub_kernels())
        """,
    )
    assert lines[0] == f"{autoregions.__name__} _inductor_region", lines
    assert lines[1].startswith("raised ") and lines[2] == "[]", lines
    # 2.13's multi-kernel comparison takes the lock only in each sub-kernel's benchmark_gpu
    # (none here): no region of its own, as 2.15's scope around it would hold.
    assert daemon.calls == [{autoregions.INDUCTOR_LABEL: 1}]
    assert daemon.candidate == [False]
