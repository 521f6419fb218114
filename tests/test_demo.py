"""The README's main job: `krex demo` on the simulated GPU says so and shows what a region buys."""

from __future__ import annotations

import re
import subprocess
import sys


def test_demo_on_the_simulated_gpu() -> None:
    p = subprocess.run(
        [sys.executable, "-m", "krex.cli", "demo", "--sim"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "SIMULATED GPU" in p.stdout
    assert "simulated device time" in p.stdout
    rows = re.findall(r"^  (?:with the GPU|next to).*?([\d.]+) ms", p.stdout, flags=re.M)
    alone, shared, gated = (float(ms) for ms in rows)
    assert shared > 1.5 * alone  # unprotected neighbours inflate the kernel
    assert abs(gated - alone) / alone <= 0.01  # the region gives it back
    assert "clean = true" in p.stdout
