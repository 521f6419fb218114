"""Probes behind docs/results/h200-fidelity/ (no krex): what makes a process's later
measurement of a kernel differ from its first.

- matmul (8192^3 bf16, compute-bound), in one process: first; again at once; after 3 s idle;
  on new tensors (no empty_cache); after empty_cache and new tensors; on the first inputs drawn
  again (the default seed), at once and after 3 s idle. Then fresh processes: one at once after
  this one's heavy work, one after 10 s idle. Each measurement records the cuBLAS kernel it ran
  (torch.profiler), and NVML's SM clock, power, temperature and clock-event reasons sampled
  every 5 ms: separates the GPU's power history, the process's state and the data.
- recovery: a 3 s burst of matmuls, then 0, 5, 15 or 30 s idle, then the measurement: how
  long the GPU's power history lasts. Every measurement also reads NVML's violation counters
  (time held down by the power and the thermal limit).
- matvec (65536^2 fp16 gemv, bandwidth-bound): the matrix placed six ways (0 to 5 GiB held
  before it is allocated), timed each time: what placement in device memory alone does.

    python3 scripts/bench/fidelity_probe.py --json OUT.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pynvml
import torch
import triton.testing

GIB = 1 << 30
DEFAULT_SEED = 67280421310721  # torch's initial seed in a fresh process


def kernel_names(fn: Any) -> list[str]:
    """The GPU kernels one call of fn runs (what cuBLAS chose)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sorted({e.name for e in prof.events() if e.device_type.name == "CUDA"})


def sampled(fn: Any) -> dict[str, Any]:
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    clocks: list[int] = []
    power: list[float] = []
    temps: list[int] = []
    reasons = 0
    why = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
    why = why or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
    stop = threading.Event()

    def sample() -> None:
        nonlocal reasons
        while not stop.is_set():
            clocks.append(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM))
            power.append(pynvml.nvmlDeviceGetPowerUsage(h) / 1000)
            temps.append(pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU))
            reasons |= why(h)
            time.sleep(0.005)

    t0 = pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
    v0 = violations(h)
    w0 = time.monotonic()
    t = threading.Thread(target=sample)
    t.start()
    ms = triton.testing.do_bench(fn, return_mode="median")
    stop.set()
    t.join()
    joules = (pynvml.nvmlDeviceGetTotalEnergyConsumption(h) - t0) / 1000
    v1 = violations(h)
    return {
        "power_capped_ms": (v1[0] - v0[0]) / 1e6,
        "thermal_capped_ms": (v1[1] - v0[1]) / 1e6,
        "median_ms": ms,
        "sm_mhz_min": min(clocks),
        "sm_mhz_median": sorted(clocks)[len(clocks) // 2],
        "power_w_max": max(power),
        "power_w_mean": joules / max(time.monotonic() - w0, 1e-9),
        "temp_c_max": max(temps),
        "clock_event_reasons": hex(reasons),
        "samples": len(clocks),
    }


def violations(h: Any) -> tuple[int, int]:
    """ns the clocks were held down by the power and by the thermal limit (since load)."""
    out = []
    for policy in (pynvml.NVML_PERF_POLICY_POWER, pynvml.NVML_PERF_POLICY_THERMAL):
        try:
            out.append(int(pynvml.nvmlDeviceGetViolationStatus(h, policy).violationTime))
        except pynvml.NVMLError:
            out.append(0)
    return out[0], out[1]


def recovery() -> list[dict[str, Any]]:
    """How long the GPU takes to measure the matmul at full speed again after heavy work: a
    3 s burst of matmuls, then d seconds idle, then a measurement."""
    a, b = inputs()
    rows = []
    for idle in (0, 5, 15, 30):
        t = time.monotonic()
        while time.monotonic() - t < 3:
            for _ in range(50):
                a @ b
            torch.cuda.synchronize()
        time.sleep(idle)
        rows.append(arm(f"after a 3 s burst and {idle} s idle", lambda: a @ b) | {"idle_s": idle})
    return rows


def arm(when: str, fn: Any) -> dict[str, Any]:
    row = {"when": when, "kernels": kernel_names(fn)} | sampled(fn)
    print(json.dumps(row), flush=True)
    return row


def inputs() -> tuple[torch.Tensor, torch.Tensor]:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    return a, b


def matmul_probe() -> tuple[list[dict[str, Any]], bool]:
    a, b = inputs()
    (a @ b).sum().item()
    mm = [arm("first", lambda: a @ b), arm("again at once", lambda: a @ b)]
    time.sleep(3)
    mm.append(arm("after 3 s idle", lambda: a @ b))
    c, d = inputs()
    mm.append(arm("new tensors, at once", lambda c=c, d=d: c @ d))
    del c, d
    torch.cuda.empty_cache()
    e, f = inputs()
    mm.append(arm("empty_cache, new tensors", lambda: e @ f))
    torch.manual_seed(DEFAULT_SEED)
    a2, b2 = inputs()
    same = bool(torch.equal(a, a2) and torch.equal(b, b2))
    mm.append(arm("first inputs drawn again, at once", lambda: a2 @ b2))
    time.sleep(3)
    mm.append(arm("first inputs drawn again, after 3 s idle", lambda: a2 @ b2))
    return mm, same


def fresh(when: str) -> dict[str, Any]:
    """One fresh process's first matmul measurement."""
    p = subprocess.run(
        [sys.executable, __file__, "--first-only"], capture_output=True, text=True, timeout=120
    )
    row: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    row["when"] = when
    print(json.dumps(row), flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path)
    ap.add_argument("--first-only", action="store_true")
    ap.add_argument("--parts", default="matmul,recovery,matvec")
    args = ap.parse_args()
    pynvml.nvmlInit()
    if args.first_only:
        a, b = inputs()
        (a @ b).sum().item()
        print(json.dumps({"kernels": kernel_names(lambda: a @ b)} | sampled(lambda: a @ b)))
        return 0
    parts = set(args.parts.split(","))
    doc: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    if "matmul" in parts:
        doc["matmul"], doc["same_inputs_again"] = matmul_probe()
        # Hot GPU, fresh process: the GPU's history without the process's.
        doc["matmul"].append(fresh("fresh process, at once after the heavy one"))
        time.sleep(10)
        doc["matmul"].append(fresh("fresh process, after 10 s idle"))
    if "recovery" in parts:
        doc["recovery"] = recovery()
    torch.cuda.empty_cache()
    mv: list[dict[str, Any]] = []
    for spacer_gib in range(6 if "matvec" in parts else 0):
        spacer = torch.empty(spacer_gib * GIB + 1, dtype=torch.uint8, device="cuda")
        m = torch.randn(65536, 65536, device="cuda", dtype=torch.float16)
        x = torch.randn(65536, device="cuda", dtype=torch.float16)
        torch.mv(m, x)
        torch.cuda.synchronize()
        row = {"spacer_gib": spacer_gib} | sampled(lambda m=m, x=x: torch.mv(m, x))
        print(json.dumps(row), flush=True)
        mv.append(row)
        del spacer, m, x
        torch.cuda.empty_cache()
    doc["matvec"] = mv
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
