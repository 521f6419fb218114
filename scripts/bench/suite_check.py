"""Check the real-GPU suite on a GPU: every candidate of every task, in one process (no krex).

For each candidate: build and compile it, check it against the torch reference, time it with
triton.testing.do_bench (median), and say which band its kernel time falls in. Then time a few
candidates as the commands the bench runs (fresh process, fresh compile caches) to show what a
command costs end to end. Writes a JSON file with everything.

    python3 scripts/bench/suite_check.py --json OUT.json [--tasks a,b]
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import triton.testing

from krex.bench import suite
from krex.bench.runner import fresh_caches


def band(ms: float) -> str:
    return "<0.1ms" if ms < 0.1 else "0.1-1ms" if ms < 1 else "1-10ms" if ms < 10 else ">10ms"


def check_in_process(tasks: list[str]) -> list[dict[str, Any]]:
    rows = []
    for task in tasks:
        mod = importlib.import_module(f"krex.bench.tasks.{task}")
        for name in suite.FULL[task]:
            v = mod.VARIANTS[name]
            row: dict[str, Any] = {"task": task, "variant": name}
            t0 = time.perf_counter()
            try:
                gen = torch.Generator(device="cuda").manual_seed(suite.SEED)
                inputs = mod.make_inputs(gen)
                fn = v.build(inputs)
                out = fn()
                torch.cuda.synchronize()
                row["setup_s"] = round(time.perf_counter() - t0, 2)
                torch.testing.assert_close(
                    out.float(), mod.reference(inputs).float(), atol=v.atol, rtol=v.rtol
                )
                ms = triton.testing.do_bench(fn, return_mode="median")
                row |= {"median_ms": ms, "band": band(ms), "ok": True}
            except Exception as e:  # report every failure, go on to the next candidate
                row |= {"ok": False, "error": f"{type(e).__name__}: {str(e)[:500]}"}
            print(json.dumps(row), flush=True)
            rows.append(row)
            del inputs, fn
            gc.collect()
            torch.cuda.empty_cache()
            torch.backends.cudnn.benchmark = False
    return rows


def time_commands(picks: list[tuple[str, str]]) -> list[dict[str, Any]]:
    rows = []
    for task, variant in picks:
        with tempfile.TemporaryDirectory() as cache:
            env = fresh_caches(dict(os.environ), Path(cache))
            t0 = time.monotonic()
            p = subprocess.run(
                [sys.executable, str(suite.TASKS_DIR / f"{task}.py"), variant],
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            wall = time.monotonic() - t0
        row = {"task": task, "variant": variant, "wall_s": round(wall, 2), "rc": p.returncode}
        row["line"] = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else p.stderr[-800:]
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--tasks", default=",".join(suite.FULL))
    args = ap.parse_args()
    tasks = [t for t in args.tasks.split(",") if t]
    doc = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "in_process": check_in_process(tasks),
        "commands": time_commands(
            [("elementwise", "triton-b1024"), ("matmul", "cublas"), ("softmax", "compiled")]
        ),
    }
    with open(args.json, "w") as f:
        json.dump(doc, f, indent=2)
    return 0 if all(r["ok"] for r in doc["in_process"]) else 1


if __name__ == "__main__":
    sys.exit(main())
