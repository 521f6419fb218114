"""One timer as one command, for scripts/bench/timers_check.py.

    python3 timer_candidate.py TIMER [--calls 5] [--seed 0]

The workload is fixed: torch.matmul of two seeded 4096^2 fp32 matrices (autotune: a Triton
matmul of the same matrices, below). After a few untimed matmuls and one untimed call of the
timer (its own first-call costs), the timer is called --calls times; each call gives one reading
in ms, the figure that timer reports: do_bench's median, a torch Timer Measurement's median,
KernelBench's mean of its 100 trials (what its eval reports), a plain event loop's median of 100
trials, Triton's autotuner's time of its winner. Nothing of krex is in here: under `krex run
--auto-regions` each timer's call is a region as it stands.

Prints one JSON line: the timer, `ms` (the median of the readings), the readings, the library
versions; or `unavailable` (why) with no `ms` where the timer's library is not there (flashinfer,
helion, Proton before triton 3.8, KernelBench's timing.py not on the path). Exit 0 once the line
is out, 2 for an unknown timer.
"""
# mypy: disable-error-code="untyped-decorator,no-untyped-def"

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

N = 4096
KB_TRIALS = 100  # KernelBench's eval times 100 trials
EVENT_TRIALS = 100


def _kb(method: str) -> Callable[[Callable[[], Any]], float]:
    def timer(fn: Callable[[], Any]) -> float:
        # a copy of KernelBench's timing.py (timers_check.py puts it on the path)
        timing = importlib.import_module("kernelbench.timing")
        time_it = timing.get_timing_function(method)
        times = time_it(lambda: fn(), [], num_warmup=3, num_trials=KB_TRIALS, verbose=False)
        return float(statistics.mean(times))

    return timer


def _events(fn: Callable[[], Any]) -> float:
    """A per-trial CUDA-event loop in no named harness (krex/tenant/events.py's case)."""
    import torch

    times = []
    for _ in range(EVENT_TRIALS):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return float(statistics.median(times))


def _torch_timer(how: str) -> Callable[[Callable[[], Any]], float]:
    def timer(fn: Callable[[], Any]) -> float:
        from torch.utils.benchmark import Timer

        t = Timer(stmt="fn()", globals={"fn": fn})
        if how == "timeit":
            m = t.timeit(100)
        elif how == "blocked_autorange":
            m = t.blocked_autorange(min_run_time=0.5)
        else:
            m = t.adaptive_autorange(threshold=0.1, max_run_time=2.0)
        return float(m.median) * 1e3

    return timer


def _triton(name: str) -> Callable[[Callable[[], Any]], float]:
    def timer(fn: Callable[[], Any]) -> float:
        import triton.testing

        return float(getattr(triton.testing, name)(fn, return_mode="median"))

    return timer


def _flashinfer(fn: Callable[[], Any]) -> float:
    bench_gpu_time = importlib.import_module("flashinfer.testing").bench_gpu_time
    return float(statistics.median(bench_gpu_time(fn)))


def _helion(fn: Callable[[], Any]) -> float:
    do_bench = importlib.import_module("helion.autotuner.benchmarking").do_bench
    return float(do_bench(fn, return_mode="median"))


# name: the timer, given the workload's callable (autotune has its own workload: _autotune)
TIMERS: dict[str, Callable[[Callable[[], Any]], float]] = {
    "do_bench": _triton("do_bench"),
    "do_bench_cudagraph": _triton("do_bench_cudagraph"),
    "timer_timeit": _torch_timer("timeit"),
    "timer_blocked_autorange": _torch_timer("blocked_autorange"),
    "timer_adaptive_autorange": _torch_timer("adaptive_autorange"),
    "kb_cuda_event": _kb("cuda_event"),
    "kb_do_bench": _kb("do_bench"),
    "kb_do_bench_impl": _kb("do_bench_impl"),
    "kb_host_time": _kb("host_time"),
    "events": _events,
    "do_bench_proton": _triton("do_bench_proton"),
    "do_bench_cudagraph_proton": _triton("do_bench_cudagraph_proton"),
    "flashinfer_bench_gpu_time": _flashinfer,
    "helion_do_bench": _helion,
}
AUTOTUNE = "autotune"  # Triton's @autotune with do_bench=: its candidates' regions
NAMES = (*TIMERS, AUTOTUNE)


def unavailable(timer: str) -> str | None:
    """Why the timer's library cannot be used here, or None."""
    need = {"kb_": "kernelbench.timing", "flashinfer": "flashinfer.testing",
            "helion": "helion.autotuner.benchmarking"}  # fmt: skip
    for prefix, module in need.items():
        if timer.startswith(prefix):
            try:
                importlib.import_module(module)
            except Exception as e:  # an import error of any kind: not measurable here
                return f"import {module}: {type(e).__name__}: {e}"[:300]
    if "proton" in timer:
        import triton.testing

        if not hasattr(triton.testing, timer):
            return f"triton {triton.__version__} has no triton.testing.{timer} (3.8 and later)"
    return None


def _autotune(a: Any, b: Any, calls: int) -> tuple[list[float], list[str]]:
    """Triton's @triton.autotune over three configs of a plain matmul kernel, with a do_bench=
    that calls triton.testing.do_bench: each call tunes afresh (its cache cleared); the
    reading is the winner's median, and the winner is kept."""
    import torch
    import triton
    import triton.language as tl

    configs = [
        triton.Config({"BM": 128, "BN": 128, "BK": 32}, num_warps=4, num_stages=3),
        triton.Config({"BM": 128, "BN": 128, "BK": 32}, num_warps=8, num_stages=3),
        triton.Config({"BM": 64, "BN": 128, "BK": 32}, num_warps=4, num_stages=4),
    ]

    def bench(fn: Callable[[], Any], quantiles: Any) -> Any:
        return triton.testing.do_bench(fn, quantiles=quantiles)

    @triton.autotune(configs=configs, key=["M", "N", "K"], do_bench=bench)
    @triton.jit
    def matmul(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr,
               BK: tl.constexpr):  # fmt: skip
        pm, pn = tl.program_id(0), tl.program_id(1)
        rm = pm * BM + tl.arange(0, BM)
        rn = pn * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k in range(0, K, BK):
            x = tl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :])
            y = tl.load(b_ptr + (k + rk)[:, None] * N + rn[None, :])
            acc += tl.dot(x, y)
        tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc)

    c = torch.empty_like(a)

    def grid(meta: dict[str, Any]) -> tuple[int, int]:
        return (N // meta["BM"], N // meta["BN"])

    readings, winners = [], []
    for i in range(calls + 1):  # the first: compiles and tunes, untimed
        matmul.cache.clear()
        matmul[grid](a, b, c, N, N, N)
        torch.cuda.synchronize()
        best = matmul.best_config
        if i:
            readings.append(float(matmul.configs_timings[best][0]))
            winners.append(str(best))
    return readings, winners


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("timer", help=", ".join(NAMES))
    ap.add_argument("--calls", type=int, default=5, help="readings, after one untimed call")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.timer not in NAMES:
        ap.error(f"unknown timer {args.timer}; known: {', '.join(NAMES)}")
    t0 = time.monotonic()
    import torch
    import triton

    row: dict[str, Any] = {"timer": args.timer, "torch": torch.__version__}
    row["triton"] = triton.__version__
    why = unavailable(args.timer)
    if why:
        print(json.dumps(row | {"unavailable": why}), flush=True)
        return 0
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    a = torch.randn(N, N, device="cuda", generator=gen)
    b = torch.randn(N, N, device="cuda", generator=gen)

    def fn() -> Any:
        return torch.matmul(a, b)

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    winners: list[str] = []
    if args.timer == AUTOTUNE:
        readings, winners = _autotune(a, b, args.calls)
    else:
        timer = TIMERS[args.timer]
        timer(fn)  # untimed: the timer's first call
        readings = [timer(fn) for _ in range(args.calls)]
    row |= {"ms": statistics.median(readings), "readings": readings}
    if winners:
        row["winners"] = winners
    row["wall_s"] = round(time.monotonic() - t0, 2)
    print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
