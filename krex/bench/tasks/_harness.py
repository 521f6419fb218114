"""What every benchmarking command of the real-GPU suite does, in the order agents do it.

Seed and build the inputs, build the candidate and run it once (the compile: Triton JIT or
torch.compile, into the fresh cache the harness was given through TRITON_CACHE_DIR and
TORCHINDUCTOR_CACHE_DIR), check it against the torch reference, then time it with
`triton.testing.do_bench` inside `krex.region()` (a no-op outside krex) and print one JSON line:
{"task", "variant", "median_ms", ...}; a candidate that picks its own kernel when it compiles
(an autotuner) also says which, as "choice" (the report sets each mode's against exclusive's).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import triton.testing

import krex
from krex.bench.choices import kernel_names

Choice = Callable[[Callable[[], Any]], object]
"""What a self-tuning candidate picked, asked with its built function after the first call."""


@dataclass(frozen=True)
class Variant:
    """One candidate: build(inputs) returns the function to time (it may compile on first call)."""

    build: Callable[[Sequence[torch.Tensor]], Callable[[], Any]]
    atol: float
    rtol: float


def run(
    task: str,
    make_inputs: Callable[[torch.Generator], Sequence[torch.Tensor]],
    reference: Callable[[Sequence[torch.Tensor]], torch.Tensor],
    variants: dict[str, Variant],
    argv: Sequence[str] | None = None,
    choices: dict[str, Choice] | None = None,
) -> int:
    """Parse argv (VARIANT [--seed N]), check and time that variant, print its JSON line.
    `choices`: per variant that picks its own kernel, what it picked (asked, with the built
    function, after its first call)."""
    ap = argparse.ArgumentParser(prog=f"{task}.py")
    ap.add_argument("variant", choices=sorted(variants))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    v = variants[args.variant]
    t0 = time.perf_counter()
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    inputs = make_inputs(gen)
    fn = v.build(inputs)
    out = fn()  # the first call compiles the candidate
    torch.cuda.synchronize()
    t_compile = time.perf_counter() - t0
    choice = _choice((choices or {}).get(args.variant), fn)
    expected = reference(inputs)
    try:
        torch.testing.assert_close(out.float(), expected.float(), atol=v.atol, rtol=v.rtol)
    except AssertionError as e:
        print(f"{task} {args.variant}: wrong result: {e}", file=sys.stderr)
        return 1
    del expected
    with krex.region():
        t_start = time.time()
        ms = triton.testing.do_bench(fn, return_mode="median")
        t_end = time.time()
        clock = _clock()  # still the timed run's clock: read before the region ends
    print(
        json.dumps(
            {
                "task": task,
                "variant": args.variant,
                "median_ms": ms,
                "setup_s": round(t_compile, 3),
                "seed": args.seed,
                "timed_window": [round(t_start, 4), round(t_end, 4)],  # epoch seconds
                **clock,
                **({"choice": choice} if choice is not None else {}),
            }
        ),
        flush=True,
    )
    return 0


def _choice(picked: Choice | None, fn: Callable[[], Any]) -> str | None:
    """What the candidate picked, as text; None when it does not say (or cannot: a label never
    fails a candidate)."""
    if picked is None:
        return None
    try:
        return str(picked(fn))
    except Exception:
        return None


def kernels_run(fn: Callable[[], Any]) -> str:
    """The CUDA kernels one call of fn runs (torch.profiler): what an autotuner that keeps its
    choice to itself (cuDNN's benchmark mode) picked. Run before the timing, in every mode
    alike."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    cuda = torch.autograd.DeviceType.CUDA
    return kernel_names(e.name for e in prof.events() if e.device_type == cuda)


def _clock() -> dict[str, int]:
    """The GPU's SM clock (MHz) and power draw (mW) now, where NVML answers; else nothing.
    A kernel's time moves with the clock, so the bench keeps it beside each median."""
    try:
        return {"sm_clock_mhz": torch.cuda.clock_rate(), "power_mw": torch.cuda.power_draw()}
    except Exception:  # no pynvml, or NVML cannot read this GPU
        return {}
