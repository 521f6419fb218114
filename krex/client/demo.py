"""`krex demo` (the README's main job): concurrent benchmarking through krex, side by side.

The same benchmarking commands run three ways on one GPU: one at a time (what users do today),
all at once with no protection, and all at once through `krex run` with their timed part in a
region. Each command does some GPU work outside its region (standing for building inputs,
compiling and checking a candidate), then times a kernel. The demo reports wall time,
throughput and how far each command's measurement is from the truth.

On a machine with an NVIDIA GPU and PyTorch it runs real matmuls (the truth: the one-at-a-time
medians); elsewhere it runs on KREX's simulated GPU (the truth: the simulated kernel's length)
and says so. It runs its own daemon on a private socket, stopped at the end.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from krex.client.run import ClientError, private_daemon

COMMANDS = 6


@dataclass(frozen=True)
class Backend:
    name: str
    label: str
    size: int  # simulated: kernel length in ns; real: matmul side
    reps: int
    outside_s: float
    what: str


SIM = Backend(
    "sim",
    "the SIMULATED GPU (no NVIDIA GPU here: kernels are simulated on the CPU)",
    2_000_000,
    15,
    0.4,
    "a 2.000 ms simulated kernel",
)
GPU = Backend(
    "torch", "an NVIDIA GPU (real CUDA)", 4096, 30, 3.0, "a 4096x4096 fp32 matmul (cuBLAS)"
)


def gpu_available() -> bool:
    if not (shutil.which("nvidia-smi") or Path("/dev/nvidia0").exists()):
        return False
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


@dataclass
class Batch:
    wall_s: float
    medians_ms: list[float]


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
    tmp = Path(tempfile.mkdtemp(prefix="krex-demo-"))
    try:
        with private_daemon(tmp, sim=b is SIM, slots=COMMANDS) as sock:
            print(f"KREX demo on {b.label}")
            print(
                f"{COMMANDS} benchmarking commands; each does {b.outside_s:g} s of GPU work "
                f"outside its region, then times {b.what}\n(median of {b.reps} event-timed runs).\n"
            )
            serial = _batch(_command(b, sock, region=True), at_once=False)
            shared = _batch(_command(b, sock, region=False), at_once=True)
            krexed = _batch(_command(b, sock, region=True), at_once=True)
    except (ClientError, RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"krex demo: {e}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _print_table(b, serial, shared, krexed)
    return 0


def _command(b: Backend, sock: Path, region: bool) -> list[str]:
    """One benchmarking command through `krex run` on `sock`, its timed part in a region or
    not."""
    sim = ["--sim"] if b is SIM else []
    run = [sys.executable, "-m", "krex.cli", "run", *sim, "--socket", str(sock), "--"]
    tenant = [sys.executable, "-m", "krex.tenant.demo", b.name, "bench", str(b.size)]
    return [*run, *tenant, str(b.reps), str(b.outside_s), "region" if region else "none"]


def _batch(cmd: list[str], at_once: bool) -> Batch:
    """COMMANDS runs of `cmd`, all at once or one at a time: the wall time and their medians."""
    t0 = time.monotonic()
    outs: list[str] = []
    if at_once:
        procs = [
            subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(COMMANDS)
        ]
        results = [p.communicate(timeout=600) for p in procs]
        codes = [p.returncode for p in procs]
    else:
        done = [
            subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            for _ in range(COMMANDS)
        ]
        results = [(d.stdout, d.stderr) for d in done]
        codes = [d.returncode for d in done]
    wall = time.monotonic() - t0
    for code, (out, err) in zip(codes, results, strict=True):
        if code != 0:
            raise RuntimeError(f"a benchmarking command failed ({code}):\n{err[-2000:]}")
        outs.append(out)
    return Batch(wall, [float(json.loads(o.strip().splitlines()[-1])["median_ms"]) for o in outs])


def _print_table(b: Backend, serial: Batch, shared: Batch, krexed: Batch) -> None:
    """Wall time, throughput, speed-up and measurement errors of the three ways."""
    truth = b.size / 1e6 if b is SIM else statistics.median(serial.medians_ms)
    print(
        f"  {'mode':<34} {'wall':>7} {'cmds/min':>9} {'speed-up':>9} {'median error':>13}"
        f" {'worst error':>12}"
    )
    for label, bt in (
        ("one at a time", serial),
        ("all at once, unprotected", shared),
        ("all at once through krex", krexed),
    ):
        errors = [abs(m / truth - 1) * 100 for m in bt.medians_ms]
        print(
            f"  {label:<34} {bt.wall_s:6.1f}s {COMMANDS / bt.wall_s * 60:9.1f} "
            f"{serial.wall_s / bt.wall_s:8.2f}x {statistics.median(errors):12.2f}% "
            f"{max(errors):11.2f}%"
        )
    basis = "the simulated kernel's length" if b is SIM else "the one-at-a-time median"
    print(f"\n  error: each command's measured median against {basis} ({truth:.3f} ms)")
    if b is SIM:
        print(
            "  (simulated GPU: every time above is simulated device time or this machine's "
            "wall time, not a measurement of real hardware)"
        )


if __name__ == "__main__":
    sys.exit(main())
