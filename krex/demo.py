"""`krex demo` (the README's main job): what a region buys a kernel benchmark on a shared GPU.

One benchmarking command times a kernel three ways: with the GPU to itself, next to three
neighbour commands that keep the GPU busy, and next to the same neighbours inside a KREX region
(the gate closed to them, their queued work drained). On a machine with an NVIDIA GPU and
PyTorch it runs real matmuls; elsewhere it runs on KREX's simulated GPU and says so.

This is the foundation-stage demo: the demo process plays the controller itself through
krex.gate. `krex run` and the daemon replace that in the controller issue.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from krex.gate import exclusive
from krex.paths import shim_library, sim_library_dir
from krex.shm import Segment

NEIGHBOURS = 3


@dataclass(frozen=True)
class Backend:
    name: str
    label: str
    size: int  # simulated: kernel length in ns; real: matmul side
    neighbour_size: int
    reps: int
    what: str


SIM = Backend(
    "sim",
    "SIMULATED GPU (no NVIDIA GPU here: kernels are simulated on the CPU)",
    2_000_000,
    2_000_000,
    15,
    "a 2.000 ms simulated kernel",
)
GPU = Backend("torch", "NVIDIA GPU (real CUDA)", 4096, 8192, 30, "a 4096x4096 fp32 matmul (cuBLAS)")


def gpu_available() -> bool:
    if not (shutil.which("nvidia-smi") or Path("/dev/nvidia0").exists()):
        return False
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def main(force_sim: bool | None = None) -> int:
    """Run the demo; force_sim True/False forces the simulated or the real GPU."""
    use_gpu = gpu_available() if force_sim is None else not force_sim
    if use_gpu and not gpu_available():
        print(
            "krex demo: --gpu asked for, but no usable NVIDIA GPU with PyTorch was found",
            file=sys.stderr,
        )
        return 2
    b = GPU if use_gpu else SIM
    seg = Segment.create(f"/krex-demo-{os.getpid()}", n_gpus=1, n_slots=64)
    sim_shm = f"/krex-demo-sim-{os.getpid()}"
    env = dict(
        os.environ,
        LD_PRELOAD=str(shim_library()),
        KREX_SHM=seg.name,
        KREX_GPU="0",
        KREX_SIM_SHM=sim_shm,
    )
    if b is SIM:
        env["LD_LIBRARY_PATH"] = f"{sim_library_dir()}:{env.get('LD_LIBRARY_PATH', '')}"
    tenant = [sys.executable, "-m", "krex._demo_tenant", b.name]

    def measure() -> float:
        p = subprocess.run(
            [*tenant, "measure", str(b.size), str(b.reps)],
            env=dict(env, KREX_TENANT="1"),
            capture_output=True,
            text=True,
            timeout=300,
        )
        if p.returncode != 0:
            raise RuntimeError(f"the measuring command failed:\n{p.stderr}")
        return float(json.loads(p.stdout.strip().splitlines()[-1])["median_ms"])

    print(f"KREX demo on the {b.label}")
    print(f"One command times {b.what} (median of {b.reps} event-timed runs).\n")
    neighbours: list[subprocess.Popen[str]] = []
    try:
        alone = measure()
        for i in range(NEIGHBOURS):
            p = subprocess.Popen(
                [*tenant, "hammer", str(b.neighbour_size), "600"],
                env=dict(env, KREX_TENANT=str(2 + i)),
                stdout=subprocess.PIPE,
                text=True,
            )
            neighbours.append(p)
        for p in neighbours:
            assert p.stdout is not None
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError("a neighbour command failed to start")
        time.sleep(0.5)
        shared = measure()
        with exclusive(seg, 0, owner=1) as hold:
            gated = measure()
    finally:
        for p in neighbours:
            p.kill()
            p.wait()
        seg.close()
        seg.unlink()
        sim_path = Path("/dev/shm") / sim_shm.lstrip("/")
        if sim_path.exists():
            sim_path.unlink()

    def row(label: str, ms: float) -> str:
        return f"  {label:<44} {ms:9.3f} ms   ({(ms / alone - 1) * 100:+6.1f} %)"

    print(f"  {'with the GPU to itself':<44} {alone:9.3f} ms")
    print(row(f"next to {NEIGHBOURS} busy neighbours, unprotected", shared))
    print(row(f"next to {NEIGHBOURS} busy neighbours, in a KREX region", gated))
    print(
        f"\n  region: gate closed to {hold.drained} neighbour process(es), quiesce "
        f"{hold.quiesce_s * 1e3:.2f} ms, drain {hold.drain_s * 1e3:.2f} ms, "
        f"clean = {str(hold.clean).lower()}"
    )
    if b is SIM:
        print(
            "\n  (simulated GPU: every number above is simulated device time, not a "
            "measurement of real hardware)"
        )
    return 0 if hold.clean else 1


if __name__ == "__main__":
    sys.exit(main())
