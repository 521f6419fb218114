"""The workload suites `krex bench` runs.

A suite is a list of commands, each one candidate (variant) of one task, written the way agents
write them: build inputs, compile the candidate, check it, time it in a region. Variants of a
task differ by a few per cent, so rankings within a task are what fidelity is about; tasks
spread the timed kernels over < 0.1 ms, 0.1-1 ms, 1-10 ms and > 10 ms.

Profiles:
- `tiny`: the simulated GPU (`krex.bench.simcmd`), for CI and machines without a GPU.
- `quick`, `full`: the agent-style PyTorch/Triton suite for real GPUs (`krex/bench/tasks/`):
  `full` runs every candidate, torch.compile ones included; `quick` a subset without
  torch.compile (10-15 s of compile each), small enough for one 10-minute device call.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from krex.core.errors import KrexError

PROFILES = ("tiny", "quick", "full")


class SuiteError(KrexError, ValueError):
    """A profile that cannot run here; the message says why."""


@dataclass(frozen=True)
class Command:
    """One benchmarking command of the suite."""

    task: str
    variant: str
    argv: tuple[str, ...]
    simulated: bool


# Simulated tasks: (name, kernel length of variant v0 in ns). One per band, two in the busiest.
_SIM_TASKS = (
    ("elementwise", 60_000),
    ("softmax", 400_000),
    ("layernorm", 900_000),
    ("matmul", 3_000_000),
    ("attention", 15_000_000),
)
# Variants: the same kernel 1 %, 3.5 % and 8 % slower: one pair in each gap class.
_SIM_VARIANTS = (("v0", 1.0), ("v1", 1.01), ("v2", 1.035), ("v3", 1.08))
_SIM_COMPILE_S = 0.15


TASKS_DIR = Path(__file__).parent / "tasks"
# The real-GPU suite: task -> candidates (keys of VARIANTS in krex/bench/tasks/TASK.py; a test
# checks they exist). Kernel times (H200): elementwise and reduction < 0.1 ms, softmax and
# layernorm 0.1-1 ms, matmul and conv 1-10 ms, attention > 10 ms.
FULL: dict[str, tuple[str, ...]] = {
    "elementwise": ("triton-b256", "triton-b1024", "triton-b4096", "eager", "compiled"),
    "reduction": ("triton-b512", "triton-b1024", "triton-b2048", "torch-sum", "compiled"),
    "softmax": ("triton-w8", "triton-w16", "triton-w32", "eager", "compiled"),
    "layernorm": ("triton-w8", "triton-w16", "triton-w32", "eager", "compiled"),
    "matmul": (
        "triton-128x256x64-s3w8",
        "triton-128x128x64-s4w4",
        "triton-128x128x32-s4w4",
        "triton-64x256x32-s4w4",
        "cublas",
    ),
    "conv": ("eager-nchw", "eager-channels-last", "cudnn-benchmark", "compiled"),
    "attention": ("eager", "baddbmm", "chunked-2", "compiled"),
    "autotune": ("triton-autotune", "max-autotune", "cublas"),
}
# Candidates that compile with Inductor (tens of seconds each, fresh caches): `full` only.
_INDUCTOR = ("compiled", "max-autotune")
QUICK: dict[str, tuple[str, ...]] = {
    task: tuple(v for v in variants if v not in _INDUCTOR) for task, variants in FULL.items()
}
SEED = 0


def _gpu_commands(suite: dict[str, tuple[str, ...]]) -> list[Command]:
    return [
        Command(
            task=task,
            variant=variant,
            argv=(sys.executable, str(TASKS_DIR / f"{task}.py"), variant, "--seed", str(SEED)),
            simulated=False,
        )
        for task, variants in suite.items()
        for variant in variants
    ]


def _sim_commands() -> list[Command]:
    return [
        Command(
            task=task,
            variant=name,
            argv=(
                sys.executable,
                "-m",
                "krex.bench.simcmd",
                task,
                name,
                str(round(base * factor)),
                str(_SIM_COMPILE_S),
            ),
            simulated=True,
        )
        for task, base in _SIM_TASKS
        for name, factor in _SIM_VARIANTS
    ]


def commands(profile: str, tasks: Sequence[str] | None = None) -> list[Command]:
    """The commands of a profile, only those of `tasks` when given (SuiteError on bad input)."""
    if profile not in PROFILES:
        raise SuiteError(f"unknown profile {profile!r} (choose from {', '.join(PROFILES)})")
    cmds = (
        _sim_commands()
        if profile == "tiny"
        else _gpu_commands(QUICK if profile == "quick" else FULL)
    )
    if tasks:
        known = sorted({c.task for c in cmds})
        bad = [t for t in tasks if t not in known]
        if bad:
            raise SuiteError(
                f"unknown task(s) {', '.join(bad)} in the {profile} profile "
                f"(choose from {', '.join(known)})"
            )
        cmds = [c for c in cmds if c.task in tasks]
    return cmds
