"""scripts/bench/launch_fit.py: a mode's residual once the launch time is fitted out."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import load_script


def fitter() -> Any:
    return load_script("scripts/bench/launch_fit.py")


def run(mode: str, launch_us: float, extra: float = 1.0) -> dict[str, Any]:
    ms = (2.6 + 0.001 * launch_us) * extra
    return {"mode": mode, "parts": {"kernelbench": {
        "ms": ms, "trials": [ms] * 4, "launch_us": [launch_us] * 4}}}  # fmt: skip


def test_a_mode_that_adds_one_per_cent_shows_it_once_the_launch_is_fitted_out() -> None:
    runs = [run("exclusive", u) for u in (25, 40, 60, 90)]
    runs += [run("krex", u, 1.01) for u in (30, 80)]
    runs.append({"mode": "krex", "parts": {"cudnn": {"ms": 2.0}}})  # no kernelbench: skipped
    runs.append(run("unprotected", 150, 11.0))  # a shared GPU's reading: not in the line
    out = fitter().fit(fitter().points([{"runs": runs}]))
    assert out["runs"] == 6 and out["correlation"] > 0.8 and "unprotected" not in out["modes"]
    ex, kx = out["modes"]["exclusive"], out["modes"]["krex"]
    assert kx["residual_mean_pct"] - ex["residual_mean_pct"] == pytest.approx(1.0, abs=0.05)
    assert ex["launch_us_range"] == [25, 90] and kx["runs"] == 2
    assert ex["fast_trials"] == 4 and kx["fast_trials"] == 4  # launches under 40 us: 25, 30


def test_too_few_runs_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    f = tmp_path / "a.json"
    f.write_text(json.dumps({"runs": [run("exclusive", 30)]}))
    monkeypatch.setattr(sys, "argv", ["launch_fit.py", str(f)])
    assert fitter().main() == 2
    assert "1 runs with launch times: at least 3" in capsys.readouterr().err
    monkeypatch.setattr(sys, "argv", ["launch_fit.py", str(tmp_path / "missing.json")])
    assert fitter().main() == 2


def test_a_part_that_runs_slower_on_a_hotter_gpu_correlates_with_its_start_temperature() -> None:
    def row(mode: str, temp: int, clock: int) -> dict[str, Any]:
        ms = 6.5 + 0.01 * temp
        gpu = {"temp_c": [temp, temp + 5], "sm_clock_mhz_range": [clock, 1980]}
        return {"mode": mode, "parts": {"kb63_conv2d": {"ms": ms, "gpu": gpu}}}

    runs = [row("exclusive", t, c) for t, c in ((50, 1600), (54, 1500))]
    runs += [row("exclusive-frozen", t, c) for t, c in ((42, 1935), (45, 1920))]
    runs.append({"mode": "krex", "parts": {"kb63_conv2d": {"ms": 6.9}}})  # no samples: left out
    shared = row("unprotected", 40, 1900)  # cool, but 40x slow: its siblings' work
    shared["parts"]["kb63_conv2d"]["ms"] *= 40
    runs.append(shared)
    out = fitter().telemetry([{"runs": runs}], "kb63_conv2d")
    assert out["runs"] == 4 and "unprotected" not in out["modes"]
    assert out["corr_ms_start_temp"] == pytest.approx(1.0)
    assert out["corr_ms_min_clock"] < -0.9
    assert out["modes"]["exclusive-frozen"]["start_temp_c_range"] == [42, 45]
    assert out["modes"]["exclusive"]["min_sm_clock_mhz_range"] == [1500, 1600]
    steady = [row("exclusive", t, 1980) for t in (40, 45, 50)]  # a clock that never moved
    assert fitter().telemetry([{"runs": steady}], "kb63_conv2d")["corr_ms_min_clock"] is None
    with pytest.raises(ValueError, match="0 runs of kb19_relu"):
        fitter().telemetry([{"runs": runs}], "kb19_relu")
