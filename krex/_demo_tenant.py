"""A tenant program for `krex demo`: times a kernel, or keeps the GPU busy.

    python -m krex._demo_tenant sim measure NS REPS     (simulated driver, through ctypes)
    python -m krex._demo_tenant sim hammer NS SECONDS
    python -m krex._demo_tenant torch measure N REPS    (real GPU: an N x N fp32 matmul)
    python -m krex._demo_tenant torch hammer N SECONDS  (real GPU: N x N bf16 matmuls)
    python -m krex._demo_tenant sim|torch bench SIZE REPS OUTSIDE_S region|none
        a benchmarking command: OUTSIDE_S seconds of GPU work outside any region (standing for
        building inputs, compiling and checking a candidate), then the timed part, inside
        krex.region() unless "none"

It knows nothing of KREX: the shim, preloaded by the demo, sees its driver calls. `measure`
prints one JSON line with the median of REPS event-timed runs.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import statistics
import sys
import time
from ctypes import byref, c_int, c_uint, c_uint64, c_void_p
from typing import Any


class SimGPU:
    """The driver API through ctypes (each attribute is a dlsym on libcuda's handle)."""

    def __init__(self) -> None:
        self.cu = ctypes.CDLL("libcuda.so.1")
        self._ok(self.cu.cuInit(0))
        dev, self.ctx = c_int(), c_void_p()
        self._ok(self.cu.cuDeviceGet(byref(dev), 0))
        self._ok(self.cu.cuDevicePrimaryCtxRetain(byref(self.ctx), dev))
        self._ok(self.cu.cuCtxSetCurrent(self.ctx))
        mod, self.fn, self.stream = c_void_p(), c_void_p(), c_void_p()
        self._ok(self.cu.cuModuleLoadData(byref(mod), b"krex demo kernel"))
        self._ok(self.cu.cuModuleGetFunction(byref(self.fn), mod, b"spin"))
        self._ok(self.cu.cuStreamCreate(byref(self.stream), 0))
        self.cu.cuLaunchKernel.argtypes = [
            c_void_p,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_void_p,
            c_void_p,
            c_void_p,
        ]

    @staticmethod
    def _ok(rc: int) -> None:
        if rc != 0:
            raise RuntimeError(f"driver call failed with CUresult {rc}")

    def launch(self, ns: int) -> None:
        arg = c_uint64(ns)
        params = (c_void_p * 1)(ctypes.cast(ctypes.pointer(arg), c_void_p))
        self._ok(self.cu.cuLaunchKernel(self.fn, 1, 1, 1, 1, 1, 1, 0, self.stream, params, None))

    def event(self) -> c_void_p:
        ev = c_void_p()
        self._ok(self.cu.cuEventCreate(byref(ev), 0))
        return ev

    def measure(self, ns: int, reps: int) -> list[float]:
        start, end = self.event(), self.event()
        out = []
        for _ in range(reps):
            self._ok(self.cu.cuEventRecord(start, self.stream))
            self.launch(ns)
            self._ok(self.cu.cuEventRecord(end, self.stream))
            self._ok(self.cu.cuEventSynchronize(end))
            ms = ctypes.c_float()
            self._ok(self.cu.cuEventElapsedTime(byref(ms), start, end))
            out.append(ms.value)
        return out

    def hammer(self, ns: int, seconds: float) -> None:
        stop = time.monotonic() + seconds
        while time.monotonic() < stop:
            self.launch(ns)
            self.launch(ns)
            self._ok(self.cu.cuStreamSynchronize(self.stream))


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
