"""A tenant program for `krex demo`: times a kernel, or keeps the GPU busy.

    python -m krex.tenant.demo sim measure NS REPS     (simulated driver, through ctypes)
    python -m krex.tenant.demo sim hammer NS SECONDS
    python -m krex.tenant.demo torch measure N REPS    (real GPU: an N x N fp32 matmul)
    python -m krex.tenant.demo torch hammer N SECONDS  (real GPU: N x N bf16 matmuls)
    python -m krex.tenant.demo sim|torch bench SIZE REPS OUTSIDE_S region|none
        a benchmarking command: OUTSIDE_S seconds of GPU work outside any region (standing for
        building inputs, compiling and checking a candidate), then the timed part, inside
        krex.region() unless "none"

It knows nothing of KREX: the shim, preloaded by the demo, sees its driver calls. `measure`
prints one JSON line with the median of REPS event-timed runs.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import sys
import time
from typing import Any

from krex.sim.simgpu import SimGPU


def torch_measure(n: int, reps: int) -> list[float]:
    import torch

    a, b = torch.randn(n, n, device="cuda"), torch.randn(n, n, device="cuda")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(10):
        a @ b
    out = []
    for _ in range(reps):
        start.record()
        a @ b
        end.record()
        end.synchronize()
        out.append(float(start.elapsed_time(end)))
    return out


def torch_hammer(n: int, seconds: float) -> None:
    import torch

    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    stop = time.monotonic() + seconds
    while time.monotonic() < stop:
        for _ in range(4):
            a @ a
        torch.cuda.synchronize()


def bench(backend: str, size: int, reps: int, outside_s: float, use_region: bool) -> list[float]:
    """Work outside the region, then the timed part (in a region unless use_region is False)."""
    import krex

    if backend == "sim":
        gpu = SimGPU()
        gpu.hammer(1_000_000, outside_s)
        with krex.region() if use_region else contextlib.nullcontext():
            return gpu.measure(size, reps)
    torch_hammer(4096, outside_s)
    with krex.region() if use_region else contextlib.nullcontext():
        return torch_measure(size, reps)


def main(argv: list[str]) -> int:
    backend, action, size, amount = argv[0], argv[1], int(argv[2]), float(argv[3])
    result: dict[str, Any]
    if action == "bench":
        runs = bench(backend, size, int(amount), float(argv[4]), argv[5] == "region")
        print(json.dumps({"median_ms": statistics.median(runs), "runs": len(runs)}), flush=True)
    elif action == "measure":
        runs = (
            SimGPU().measure(size, int(amount))
            if backend == "sim"
            else torch_measure(size, int(amount))
        )
        result = {"median_ms": statistics.median(runs), "runs": len(runs)}
        print(json.dumps(result), flush=True)
    else:
        gpu = SimGPU() if backend == "sim" else None
        print("ready", flush=True)
        if gpu:
            gpu.hammer(size, amount)
        else:
            torch_hammer(size, amount)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
