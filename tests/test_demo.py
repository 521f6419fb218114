"""The README's main job: `krex demo` on the simulated GPU says so and shows what krex buys."""

from __future__ import annotations

import re
import subprocess
import sys


def test_demo_on_the_simulated_gpu() -> None:
    """Concurrent commands through krex: faster than one at a time, exact where unprotected
    sharing is not, and the output says the GPU is simulated."""
    p = subprocess.run(
        [sys.executable, "-m", "krex.cli", "demo", "--sim"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "SIMULATED GPU" in p.stdout
    assert "simulated device time" in p.stdout
    rows = {
        m.group(1).strip(): (float(m.group(2)), float(m.group(3)), float(m.group(4)))
        for m in re.finditer(
            r"^  (one at a time|all at once, unprotected|all at once through krex)\s+"
            r"([\d.]+)s\s+[\d.]+\s+[\d.]+x\s+([\d.]+)%\s+([\d.]+)%",
            p.stdout,
            flags=re.M,
        )
    }
    serial, shared, krexed = (
        rows["one at a time"],
        rows["all at once, unprotected"],
        rows["all at once through krex"],
    )
    assert krexed[0] < serial[0]  # wall time: concurrency pays
    assert shared[1] >= 30  # unprotected sharing corrupts the measurements
    assert krexed[2] <= 1.0  # through krex every command measures the truth within 1 %
