"""What this node has: its GPUs (how many, whose) and each GPU's CPU slice."""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import subprocess
from pathlib import Path

from krex.core.config import Config, ConfigError
from krex.core.slices import Slice, SliceError, default_slices, validate_slices


def node_plan(cfg: Config) -> tuple[int, list[Slice]]:
    """The GPUs this daemon serves and each one's CPU slice: configured, or derived from the
    machine (the GPUs the driver shows, the cores this process may run on). ConfigError when
    they do not fit."""
    vendor = resolve_vendor(cfg)
    n = cfg.gpu_count or (1 if cfg.sim else detect_gpus(vendor))
    if n == 0:
        name = "AMD" if vendor == "amd" else "NVIDIA"
        raise ConfigError(f"no {name} GPU found: run with --sim for the simulated GPU")
    available = os.sched_getaffinity(0)
    slices = default_slices(n, set(available))
    for gpu, s in cfg.slices.items():
        if gpu >= n:
            raise ConfigError(f"{cfg.source}: slices.{gpu}: there are only {n} GPUs")
        slices[gpu] = Slice(gpu=gpu, region_cores=s.region, shared_cores=s.shared)
    try:
        # Defaults may share cores when there are more GPUs than cores; configured ones not.
        validate_slices(slices, set(available), allow_overlap=not cfg.slices)
    except SliceError as e:
        raise ConfigError(f"{cfg.source}: slices: {e}") from e
    return n, slices


def resolve_vendor(cfg: Config) -> str:
    """nvidia or amd: configured, else NVIDIA where nvidia-smi is, AMD where only ROCm is
    (simulated GPUs are NVIDIA's unless configured)."""
    if cfg.vendor != "auto":
        return cfg.vendor
    if cfg.sim or shutil.which("nvidia-smi"):
        return "nvidia"
    if Path("/dev/kfd").exists() or shutil.which("amd-smi") or shutil.which("rocm-smi"):
        return "amd"
    return "nvidia"


KFD_NODES = Path("/sys/class/kfd/kfd/topology/nodes")


def detect_gpus(vendor: str = "nvidia") -> int:
    """GPUs the driver shows (0 when there is no driver). AMD: the KFD topology's GPU nodes,
    as ROCm counts them (untested on AMD hardware)."""
    if vendor == "amd":
        with contextlib.suppress(Exception):  # hip-python (krex[hip]), where installed
            hip = importlib.import_module("hip.hip")
            err, n = hip.hipGetDeviceCount()
            if err == hip.hipError_t.hipSuccess:
                return int(n)
        count = 0
        with contextlib.suppress(OSError):
            for node in KFD_NODES.iterdir():
                with contextlib.suppress(OSError, ValueError):
                    count += int((node / "gpu_id").read_text().strip() or 0) != 0
        return count
    smi = shutil.which("nvidia-smi")
    if not smi:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))
