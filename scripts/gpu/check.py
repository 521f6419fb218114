"""The foundation's GPU check: real CUDA programs under the shim (make gpu-check).

Creates a KREX segment, runs the PyTorch, Triton, CuPy and cuda-python checks under
LD_PRELOAD=libkrex.so (each counts intercepted calls against an independent count), measures
the per-launch cost with and without the library, and exercises the gate and the drain on the
real driver. Writes OUT/gpu_check.json and OUT/gpu_check.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from krex.core.paths import shim_library
from krex.core.shm import Segment

HERE = Path(__file__).resolve().parent


def run(cmd: list[str], env: dict[str, str], timeout: float) -> tuple[int, str, str]:
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        return p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        return 124, str(e.stdout or ""), f"timed out after {timeout}s"


def last_json(text: str) -> dict[str, Any] | None:
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            try:
                return dict(json.loads(line))
            except json.JSONDecodeError:
                return None
    return None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--ptx", type=Path, required=True)
    ap.add_argument("--overhead-bin", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    name = f"/krex-gpucheck-{os.getpid()}"
    seg = Segment.create(name, n_gpus=1, n_slots=64)
    shim = str(shim_library())
    base = dict(os.environ, PYTHONPATH=f"{HERE}:{os.environ.get('PYTHONPATH', '')}")
    tenant = dict(base, LD_PRELOAD=shim, KREX_SHM=name, KREX_TENANT="1", KREX_GPU="0")
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "machine": platform.node(),
        "command": "make gpu-check",
        "programs": [],
    }
    try:
        gpu = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        report["gpu"] = gpu
        versions = subprocess.run(
            [
                sys.executable,
                "-c",
                "import importlib.metadata as m, sys; print(sys.version.split()[0], *(f'{p}="
                "{m.version(p)}' for p in ('torch', 'triton', 'cupy-cuda13x', 'cuda-bindings')))",
            ],
            capture_output=True,
            text=True,
        ).stdout.split()
        report["python"] = versions[0] if versions else None
        report["packages"] = versions[1:]
        for prog, extra in [
            ("torch_check.py", []),
            ("triton_check.py", []),
            ("cupy_check.py", []),
            ("cudapython_check.py", [str(args.ptx)]),
        ]:
            t0 = time.time()
            rc, out, err = run([sys.executable, str(HERE / prog), *extra], tenant, 300)
            res = last_json(out) or {"program": prog, "ok": False}
            res.update(rc=rc, seconds=round(time.time() - t0, 1), stderr_tail=err[-2000:])
            report["programs"].append(res)
            print(f"{prog}: rc={rc} ok={res.get('ok')}", flush=True)

        # Per-launch cost: alternate runs without and with the library.
        without: list[float] = []
        with_: list[float] = []
        for _ in range(7):
            for env, acc in ((base, without), (tenant, with_)):
                rc, out, err = run([str(args.overhead_bin), str(args.ptx), "200000"], env, 120)
                got = last_json(out)
                if rc == 0 and got:
                    acc.append(float(got["ns_per_launch"]))
                else:
                    print("overhead run failed:", err[-500:], flush=True)
        if without and with_:
            w, s = statistics.median(without), statistics.median(with_)
            report["launch_overhead"] = {
                "ns_per_launch_without": w,
                "ns_per_launch_with": s,
                "runs_without": without,
                "runs_with": with_,
                "ratio": s / w,
                "target_ratio_max": 1.02,
                "met": s / w <= 1.02,
            }
            print(f"launch: {w:.1f} ns without, {s:.1f} ns with, ratio {s / w:.4f}", flush=True)

        rc, out, err = run([sys.executable, str(HERE / "gate_check.py")], tenant, 400)
        res = last_json(out) or {"program": "gate", "ok": False}
        res.update(rc=rc, stderr_tail=err[-2000:])
        report["gate"] = res
        print(f"gate_check: rc={rc} ok={res.get('ok')}", flush=True)
    finally:
        seg.close()
        seg.unlink()
    (args.out / "gpu_check.json").write_text(json.dumps(report, indent=2))
    ok = all(p.get("ok") for p in report["programs"]) and report.get("gate", {}).get("ok", False)
    print(json.dumps({k: v for k, v in report.items() if k != "programs"}, indent=1)[:6000])
    for p in report["programs"]:
        print(
            p.get("program"),
            p.get("ok"),
            [
                (r["check"], r.get("expected"), r.get("intercepted"), r["ok"])
                for r in p.get("results", [])
            ],
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
