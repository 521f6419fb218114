"""scripts/bench/bands.py: a finished bench run's inflation per command and per band, with
tasks left out (the GPU runs it reads are in docs/results/h200-head/)."""

from __future__ import annotations

from typing import Any

from conftest import load_script


def _cmd(mode: str, task: str, variant: str, ms: float | None, clock: int = 1980) -> dict[str, Any]:
    return {"mode": mode, "task": task, "variant": variant, "median_ms": ms,
            "output": {"sm_clock_mhz": clock}}  # fmt: skip


def test_bands_leave_out_the_tasks_named_and_count_each_band() -> None:
    bands = load_script("scripts/bench/bands.py").bands
    doc = {
        "commands": [
            _cmd("exclusive", "matmul", "cublas", 1.5, 1410),
            _cmd("krex", "matmul", "cublas", 1.65, 1980),  # +10 %: left out below
            _cmd("exclusive", "conv", "nchw", 2.0),
            _cmd("krex", "conv", "nchw", 2.004),  # +0.2 %
            _cmd("native_repeat", "conv", "nchw", 1.998),  # -0.1 %
            _cmd("exclusive", "softmax", "w8", 0.25),
            _cmd("krex", "softmax", "w8", 0.24),  # -4 %, only in the > 0.1 ms band
            _cmd("exclusive", "attention", "eager", 12.0),
            _cmd("krex", "attention", "eager", None),  # failed: no median, not counted
        ]
    }
    res = bands(doc, {"matmul"})
    assert set(res["commands"]) == {"conv/nchw", "softmax/w8", "attention/eager"}
    assert res["commands"]["conv/nchw"]["krex"] == 0.2
    assert res["commands"]["conv/nchw"]["native_repeat"] == -0.1
    krex = res["bands_pct"]["krex"]
    assert ">10ms" not in krex  # attention's krex run failed
    assert krex[">1ms"] == {"p50": 0.2, "p95_abs": 0.2, "max_abs": 0.2, "n": 1}
    assert krex[">0.1ms"]["n"] == 2 and krex[">0.1ms"]["max_abs"] == 4.0
    with_matmul = bands(doc, set())["bands_pct"]["krex"][">1ms"]
    assert with_matmul["n"] == 2 and with_matmul["max_abs"] == 10.0
    assert bands(doc, set())["commands"]["matmul/cublas"]["sm_clock_mhz"]["exclusive"] == 1410
