"""scripts/bench/settle_sweep.py: its summary and its bad input (the sweep itself needs a GPU)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts" / "bench"))

import settle_sweep  # noqa: E402


def test_summary_sets_each_settle_against_the_rested_median() -> None:
    points: list[dict[str, Any]] = [
        {"settle_s": None, "ms": 2.000},
        {"settle_s": None, "ms": 2.004},
        {"settle_s": 0.0, "ms": 2.020},
        {"settle_s": 0.0, "ms": 2.010},
        {"settle_s": 3.0, "ms": 2.002},
    ]
    out = settle_sweep.summary(points)
    assert out["rested_ms"] == pytest.approx(2.002)
    assert out["rested_spread_pct"] == pytest.approx(0.2, abs=1e-3)
    assert list(out["settles"]) == ["0", "3"]
    assert out["settles"]["0"]["n"] == 2
    assert out["settles"]["0"]["excess_pct"] == pytest.approx((2.015 / 2.002 - 1) * 100, abs=1e-3)
    assert out["settles"]["3"]["excess_pct"] == pytest.approx(0.0, abs=1e-3)


def test_summary_needs_a_rested_timing() -> None:
    with pytest.raises(ValueError, match="rested"):
        settle_sweep.summary([{"settle_s": 1.0, "ms": 2.0}])


@pytest.mark.parametrize(
    "args", [["--settles", "a,b"], ["--settles", "-1"], ["--heat", "0"], ["--trace", "9"]]
)
def test_bad_arguments_get_one_clear_error(tmp_path: Path, args: list[str]) -> None:
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts/bench/settle_sweep.py"),
            "--out",
            str(tmp_path / "o"),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("settle_sweep: "), result.stderr
    assert not (tmp_path / "o").exists()


def test_gap_settle_sets_each_condition_against_native_and_refuses_bad_gaps() -> None:
    """scripts/bench/gap_settle.py: per gap, no settle, an idle as long and the whole settle,
    each against native's median; a gap that is not a positive number is one clear error."""
    import gap_settle

    conds = gap_settle.conditions([0.05], 2.0)
    assert conds[0] == ("native", 0.0, gap_settle.HOST_GAP_S)
    assert [c[1:] for c in conds[1:]] == [(0.05, 0.0), (0.05, 0.05), (0.05, 2.0)]
    points: list[dict[str, Any]] = [
        {"label": "native", "ms": 2.000},
        {"label": "native", "ms": 2.004},
        {"label": "gap 0.05, no settle", "ms": 2.030},
        {"label": "gap 0.05, idle 0.05", "ms": 2.004},
    ]
    out = gap_settle.summary(points)
    assert out["native_ms"] == pytest.approx(2.002)
    assert out["conditions"]["gap 0.05, no settle"]["excess_pct"] == pytest.approx(1.399, abs=1e-3)
    with pytest.raises(ValueError):
        gap_settle.summary(points[2:])
    for bad in ("a", "0", "-1"):
        run = subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "bench" / "gap_settle.py"), "--out", "x",
             "--gaps", bad],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert run.returncode == 2 and "gap_settle:" in run.stderr, (bad, run.stderr)
