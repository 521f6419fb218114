"""scripts/bench/multi_gpu.py on two simulated GPUs: both parts end to end, and its `mixed`
phase (issue #20: `krex run --gpus 2` commands beside one-GPU commands on both GPUs finish,
each region over both GPUs and clean). The real run is docs/results/h200x2/'s."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "bench" / "multi_gpu.py"


def _part(*args: str) -> None:
    p = subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--profile", "tiny"],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]


@pytest.mark.slow  # a soak: `make test-quick` leaves it out
def test_two_gpu_commands_beside_one_gpu_commands_finish_clean(tmp_path: Path) -> None:
    _part("native", "--out", str(tmp_path))
    _part("krex", "--out", str(tmp_path), "--native", str(tmp_path / "native.json"))
    summary = json.loads((tmp_path / "summary.json").read_text())
    node = summary["node"]
    assert node["krex_vs_exclusive"] == node["krex_cmds_per_min"] / node["exclusive_cmds_per_min"]
    assert node["krex_cmds_per_min"] > 0
    mixed = summary["mixed"]
    n = mixed["two_gpu_commands"]
    assert n >= 1 and mixed["succeeded"] == n and mixed["timed_out"] == 0, mixed
    assert mixed["two_gpu_regions"] == n  # one region each, over both GPUs, clean
    assert mixed["two_gpu_regions_on_every_gpu"] == n
    assert mixed["two_gpu_regions_clean"] == n
    assert mixed["one_gpu_regions"] > 0
    assert mixed["one_gpu_regions_clean"] == mixed["one_gpu_regions"]
    krex = json.loads((tmp_path / "krex.json").read_text())
    assert {"alone", "both", "alone_again", "mixed"} <= set(krex)
