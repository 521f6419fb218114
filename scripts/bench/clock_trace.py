"""Where the native run-to-run spread of a suite command comes from: run it N times one after
another (as the exclusive mode does) while a sampler reads the SM clock and power through NVML
every 10 ms, and print each run's median next to the clock during its timed window.

    python3 scripts/bench/clock_trace.py --json OUT.json TASK:VARIANT [TASK:VARIANT ...] [-n 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pynvml

from krex.bench import suite
from krex.bench.runner import fresh_caches


class Sampler(threading.Thread):
    def __init__(self) -> None:
        super().__init__(daemon=True)
        pynvml.nvmlInit()
        self.h = pynvml.nvmlDeviceGetHandleByIndex(0)
        self.samples: list[tuple[float, int, int]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            clock = pynvml.nvmlDeviceGetClockInfo(self.h, pynvml.NVML_CLOCK_SM)
            power = pynvml.nvmlDeviceGetPowerUsage(self.h)
            self.samples.append((time.time(), clock, power))
            time.sleep(0.01)

    def window(self, t0: float, t1: float) -> dict[str, Any]:
        inside = [(c, p) for t, c, p in self.samples if t0 <= t <= t1]
        if not inside:
            return {"samples": 0}
        clocks = [c for c, _ in inside]
        return {
            "samples": len(inside),
            "sm_clock_min": min(clocks),
            "sm_clock_median": statistics.median(clocks),
            "sm_clock_max": max(clocks),
            "power_w_max": max(p for _, p in inside) / 1000,
        }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("-n", type=int, default=5)
    ap.add_argument("commands", nargs="+")
    args = ap.parse_args()
    sampler = Sampler()
    sampler.start()
    rows = []
    for spec in args.commands:
        task, variant = spec.split(":", 1)
        for i in range(args.n):
            with tempfile.TemporaryDirectory() as cache:
                env = fresh_caches(dict(os.environ), Path(cache))
                p = subprocess.run(
                    [sys.executable, str(suite.TASKS_DIR / f"{task}.py"), variant],
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=300,
                )
            if p.returncode != 0:
                print(p.stderr[-1500:], file=sys.stderr)
                return 1
            line = json.loads(p.stdout.strip().splitlines()[-1])
            t0, t1 = line["timed_window"]
            row = {"task": task, "variant": variant, "run": i, "median_ms": line["median_ms"]}
            row |= {"timed_s": round(t1 - t0, 3)} | sampler.window(t0, t1)
            print(json.dumps(row), flush=True)
            rows.append(row)
    sampler.stop.set()
    with open(args.json, "w") as f:
        json.dump({"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "runs": rows}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
