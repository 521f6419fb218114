"""How far a KernelBench-style timing follows its launch time, per mode, over autotune_check runs.

KernelBench's cuda_event timer reads the part of each launch that outlasts its L2 flush
(docs/results/h200-autotune/). This fits each run's `kernelbench` mean against the median of
its trials' launch times (least squares, over every run and mode given) and gives, per mode,
the residuals in per cent of the fitted value: what a mode adds once the launch is accounted
for. It also gives each mode's mean over the trials whose launch took under FAST_US.

    python3 scripts/bench/launch_fit.py RUN/autotune_check.json [...] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

FAST_US = 40.0  # a launch the flush (about 70 us) hides with room to spare
SHARED = "unprotected"
"""The mode whose reading is its siblings' work on a shared GPU, not its launch: left out of the
fit (one 30 ms reading among 2.7 ms ones would set the line; H200 run 23)."""


def _measured(docs: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every run of the docs but those of the SHARED mode."""
    for doc in docs:
        yield from (run for run in doc.get("runs", []) if run.get("mode") != SHARED)


def points(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """(mode, median launch us, mean ms, trials, launches) of each run with per-trial launches,
    but those of the SHARED mode."""
    out = []
    for run in _measured(docs):
        kb = run.get("parts", {}).get("kernelbench")
        if not kb or not isinstance(kb.get("launch_us"), list) or not kb["launch_us"]:
            continue
        launches = kb["launch_us"]
        out.append({"mode": run["mode"], "launch_us": statistics.median(launches),
                    "ms": kb["ms"], "trials": kb["trials"], "launches": launches})  # fmt: skip
    return out


def _corr(xs: list[float], ys: list[float]) -> float | None:
    """Pearson's r, or None where either series is constant (no correlation to speak of)."""
    try:
        return round(statistics.correlation(xs, ys), 3)
    except statistics.StatisticsError:
        return None


def _span(values: list[Any], digits: int | None = None) -> list[Any]:
    return [min(values), max(values)] if digits is None else [
        round(min(values), digits), round(max(values), digits)]  # fmt: skip


def fit(pts: list[dict[str, Any]]) -> dict[str, Any]:
    """The least-squares line ms = a + b * launch_us, and per mode its residuals (%)."""
    if len(pts) < 3:
        raise ValueError(f"{len(pts)} runs with launch times: at least 3 are needed")
    xs, ys = [p["launch_us"] for p in pts], [p["ms"] for p in pts]
    b, a = statistics.linear_regression(xs, ys)
    modes: dict[str, Any] = {}
    for p in pts:
        m = modes.setdefault(p["mode"], {"residual_pct": [], "launch_us": [], "fast": []})
        m["residual_pct"].append(round((p["ms"] / (a + b * p["launch_us"]) - 1) * 100, 3))
        m["launch_us"].append(p["launch_us"])
        m["fast"] += [t for t, u in zip(p["trials"], p["launches"], strict=False) if u < FAST_US]
    for m in modes.values():
        r, fast, launch = m.pop("residual_pct"), m.pop("fast"), m.pop("launch_us")
        m["runs"] = len(r)
        m["residual_mean_pct"] = round(statistics.mean(r), 3)
        m["residual_range_pct"] = _span(r)
        m["launch_us_range"] = _span(launch, 1)
        m["fast_trials"] = len(fast)
        m["fast_mean_ms"] = round(statistics.mean(fast), 4) if fast else None
    return {"runs": len(pts), "intercept_ms": round(a, 4), "ms_per_launch_us": round(b, 5),
            "correlation": round(statistics.correlation(xs, ys), 3), "modes": modes}  # fmt: skip


CAPPED_MS = 1.0
"""A timing during which NVML's power-limit violation counter advanced by this much or more is
`capped` (runs 14-16 of docs/results/h200-autotune/: the conv's slow readings were these)."""


def telemetry(docs: list[dict[str, Any]], part: str) -> dict[str, Any]:
    """How `part`'s timing follows the GPU's and its memory's temperature at its start, its
    lowest SM clock and the time the power limit held its clocks down (the SHARED mode left
    out: its timings are its siblings' work)."""
    rows = []
    for run in _measured(docs):
        p = run.get("parts", {}).get(part)
        g = (p or {}).get("gpu") or {}
        if p and "temp_c" in g and "sm_clock_mhz_range" in g:
            rows.append({
                "mode": run["mode"],
                "ms": p["ms"],
                "temp": g["temp_c"][0],
                "clock": g["sm_clock_mhz_range"][0],
                "mem_temp": g.get("mem_temp_c", [None])[0],  # recorded from run 14
                "capped": g.get("power_capped_ms"),
            })  # fmt: skip
    if len(rows) < 3:
        raise ValueError(f"{len(rows)} runs of {part} with the GPU's samples: at least 3 needed")
    ms = [r["ms"] for r in rows]

    def corr(key: str) -> float | None:
        ys = [r[key] for r in rows]
        return _corr(ms, ys) if all(y is not None for y in ys) else None

    modes: dict[str, Any] = {}
    for mode in dict.fromkeys(r["mode"] for r in rows):
        mine = [r for r in rows if r["mode"] == mode]
        modes[mode] = {
            "runs": len(mine),
            "ms_range": _span([r["ms"] for r in mine], 4),
            "start_temp_c_range": _span([r["temp"] for r in mine]),
            "min_sm_clock_mhz_range": _span([r["clock"] for r in mine]),
        }
        if all(r["mem_temp"] is not None for r in mine):
            modes[mode]["start_mem_temp_c_range"] = _span([r["mem_temp"] for r in mine])
        if all(r["capped"] is not None for r in mine):
            modes[mode]["capped_runs"] = sum(r["capped"] >= CAPPED_MS for r in mine)
    return {
        "part": part,
        "runs": len(rows),
        "corr_ms_start_temp": corr("temp"),
        "corr_ms_min_clock": corr("clock"),
        "corr_ms_start_mem_temp": corr("mem_temp"),
        "corr_ms_power_capped": corr("capped"),
        "modes": modes,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="autotune_check.json files")
    ap.add_argument("--part", help="a part's timing against the GPU's temperature and clock")
    ap.add_argument("--json", help="also write the fit there")
    args = ap.parse_args()
    try:
        docs = [json.loads(Path(f).read_text()) for f in args.runs]
        out = telemetry(docs, args.part) if args.part else fit(points(docs))
    except (OSError, ValueError) as e:
        print(f"launch_fit: {e}", file=sys.stderr)
        return 2
    out["files"] = args.runs
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
