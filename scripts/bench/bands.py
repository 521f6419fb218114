"""A finished `krex bench` run's inflation, per command and per band, with tasks left out.

The bench's own report judges every band on all its commands. Where one task's native repeat
moves by more than the target (the fp16 8192^3 matmuls on the H200: the GPU's power cap,
docs/results.md), this tells what the rest of the band does, read from results.json alone:

    python3 scripts/bench/bands.py OUT/results.json --without matmul [--json bands.json]

Prints each command's median per mode against the exclusive run's (with the SM clock the
command sampled over its timing, where it did), then each band's p50 (signed) and p95 of the
absolute inflation per mode, without the tasks named.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from krex.bench.metrics import BANDS, quantile

NAMES = ("mode", "task", "variant")


def bands(doc: dict[str, Any], without: set[str]) -> dict[str, Any]:
    """Per command (task/variant) each mode's inflation in per cent against exclusive, and per
    mode and band the p50 and p95 (of the absolute value) over the commands kept."""
    by: dict[str, dict[str, dict[str, Any]]] = {}
    for c in doc.get("commands", []):
        if not isinstance(c, dict) or not all(isinstance(c.get(k), str) for k in NAMES):
            continue
        if c["task"] in without or not isinstance(c.get("median_ms"), (int, float)):
            continue
        by.setdefault(f"{c['task']}/{c['variant']}", {})[c["mode"]] = c
    commands: dict[str, Any] = {}
    per_mode: dict[str, list[tuple[float, float]]] = {}  # mode -> (exclusive ms, inflation %)
    for key, modes in sorted(by.items()):
        ex = modes.get("exclusive")
        if ex is None or ex["median_ms"] <= 0:
            continue
        row: dict[str, Any] = {"exclusive_ms": round(ex["median_ms"], 4)}
        for mode, c in modes.items():
            clock = (c.get("output") or {}).get("sm_clock_mhz")
            if mode != "exclusive":
                pct = (c["median_ms"] / ex["median_ms"] - 1) * 100
                row[mode] = round(pct, 2)
                per_mode.setdefault(mode, []).append((ex["median_ms"], pct))
            if clock is not None:
                row.setdefault("sm_clock_mhz", {})[mode] = clock
        commands[key] = row
    out: dict[str, Any] = {}
    for mode, points in per_mode.items():
        for band, threshold_ms in BANDS.items():
            signed = [p for ms, p in points if ms > threshold_ms]
            if signed:
                out.setdefault(mode, {})[band] = {
                    "p50": round(quantile(signed, 0.5), 2),
                    "p95_abs": round(quantile([abs(x) for x in signed], 0.95), 2),
                    "max_abs": round(max(abs(x) for x in signed), 2),
                    "n": len(signed),
                }
    return {"without": sorted(without), "commands": commands, "bands_pct": out}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path, help="a krex bench run's results.json")
    ap.add_argument("--without", default="", help="comma-separated tasks to leave out")
    ap.add_argument("--json", type=Path, help="also write the result here")
    args = ap.parse_args()
    try:
        doc = json.loads(args.results.read_text())
    except (OSError, ValueError) as e:
        print(f"bands: cannot read {args.results}: {e}", file=sys.stderr)
        return 2
    if not isinstance(doc, dict) or not isinstance(doc.get("commands"), list):
        print(f"bands: {args.results} is not a krex bench results.json", file=sys.stderr)
        return 2
    res = bands(doc, {t for t in args.without.split(",") if t})
    res["source"] = str(args.results)
    for key, row in res["commands"].items():
        pct = {m: v for m, v in row.items() if m not in ("exclusive_ms", "sm_clock_mhz")}
        rest = "  ".join(f"{m} {v:+.2f}" for m, v in pct.items())
        print(f"{key:40} {row['exclusive_ms']:9.4f} ms  {rest}  {row.get('sm_clock_mhz', '')}")
    print(json.dumps(res["bands_pct"], indent=1))
    if args.json:
        args.json.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
