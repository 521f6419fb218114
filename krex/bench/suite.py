"""The workload suites `krex bench` runs.

A suite is a list of commands, each one candidate (variant) of one task, written the way agents
write them: build inputs, compile the candidate, check it, time it in a region. Variants of a
task differ by a few per cent, so rankings within a task are what fidelity is about; tasks
spread the timed kernels over < 0.1 ms, 0.1-1 ms, 1-10 ms and > 10 ms.

Profiles:
- `tiny`: the simulated GPU (`krex.bench.simcmd`), for CI and machines without a GPU.
- `quick`, `full`: the agent-style PyTorch/Triton suite for real GPUs (not written yet).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

PROFILES = ("tiny", "quick", "full")


class SuiteError(ValueError):
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


def commands(profile: str) -> list[Command]:
    """The commands of a profile (SuiteError when the profile cannot run here)."""
    if profile not in PROFILES:
        raise SuiteError(f"unknown profile {profile!r} (choose from {', '.join(PROFILES)})")
    if profile != "tiny":
        raise SuiteError(
            f"the {profile} profile needs the agent-style PyTorch/Triton suite for real GPUs, "
            "which is not written yet; use --profile tiny (simulated GPU)"
        )
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
