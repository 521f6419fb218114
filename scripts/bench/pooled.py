"""One part's timings over many autotune_check runs: each mode against exclusive, pooled.

A single run's verdict (`autotune_check.verdict`) counts a mode's timings "within the native
repeat" when they lie no further from the exclusive runs' median than those runs' own spread.
With 3-5 exclusive runs that is a coin with unknown bias: even exclusive, timed once more, would
miss it part of the time. So this sets every mode on the same footing: each exclusive timing
is scored against the *other* exclusive runs of its run (leave one out), and every other mode's
timing against each subset of the same size (averaged), so that a mode that repeats like
exclusive scores like exclusive. Beside that, per mode: the signed per cent against the run's
exclusive median (exclusive's own left out), pooled, and per run; and for each pair of modes,
over the runs that have both, how often and by how much one read above the other (a sign test,
two-sided: the chance of so lopsided a split if neither read above the other more often).

    python3 scripts/bench/pooled.py RUN/autotune_check.json [...] --part cudnn [--json OUT.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

BASE = "exclusive"


def timed(run: dict[str, Any], part: str) -> bool:
    """Whether an autotune_check run timed the part (its `ms` a number)."""
    p = run.get("parts", {}).get(part)
    return isinstance(p, dict) and isinstance(p.get("ms"), int | float)


def timings(doc: dict[str, Any], part: str) -> dict[str, list[float]]:
    """Per mode, in run order, the part's timings (ms) of one autotune_check json."""
    by: dict[str, list[float]] = {}
    for run in doc.get("runs", []):
        if timed(run, part):
            by.setdefault(run["mode"], []).append(float(run["parts"][part]["ms"]))
    return by


def _pct(x: float, ref: list[float]) -> float:
    base = statistics.median(ref)
    return (x - base) / base * 100


def _scores(x: float, refs: list[list[float]], limit: float | None) -> float:
    """The share of reference sets x lies within: their spread (limit None) or `limit` %."""
    hits = 0
    for ref in refs:
        bound = limit if limit is not None else (max(ref) - min(ref)) / statistics.median(ref) * 100
        hits += abs(_pct(x, ref)) <= bound
    return hits / len(refs)


def one_run(by: dict[str, list[float]]) -> dict[str, Any] | None:
    """Per mode: signed per cent against exclusive and the equal-footing scores (None: fewer
    than 3 exclusive timings, too few to leave one out)."""
    ex = by.get(BASE, [])
    if len(ex) < 3:
        return None
    subsets = [list(s) for s in itertools.combinations(ex, len(ex) - 1)]
    out: dict[str, Any] = {}
    for mode, xs in by.items():
        if not xs:
            continue
        pct, spread, one = [], 0.0, 0.0
        for i, x in enumerate(xs):
            refs = [ex[:i] + ex[i + 1 :]] if mode == BASE else subsets
            pct.append(statistics.mean(_pct(x, r) for r in refs))
            spread += _scores(x, refs, None)
            one += _scores(x, refs, 1.0)
        out[mode] = {"pct": pct, "within_spread": spread, "within_one_pct": one, "n": len(xs)}
    return out


def _sign_p(above: int, below: int) -> float:
    """Two-sided sign test: the chance of a split at least this lopsided by coin flips."""
    n = above + below
    if n == 0:
        return 1.0
    k = max(above, below)
    tail = sum(math.comb(n, i) for i in range(k, n + 1)) / 2**n
    return float(min(1.0, 2 * tail))


def pooled(docs: list[tuple[str, dict[str, Any]]], part: str) -> dict[str, Any]:
    """Everything above over the named docs (name, json) for one part."""
    runs: dict[str, dict[str, Any]] = {}
    for name, doc in docs:
        r = one_run(timings(doc, part))
        if r is not None:
            runs[name] = r
    if not runs:
        raise ValueError(f"no run has 3 or more exclusive timings of {part!r}")
    modes: dict[str, Any] = {}
    for r in runs.values():
        for mode, v in r.items():
            m = modes.setdefault(mode, {"pct": [], "spread": 0.0, "one": 0.0, "n": 0})
            m["pct"] += v["pct"]
            m["spread"] += v["within_spread"]
            m["one"] += v["within_one_pct"]
            m["n"] += v["n"]
    summary = {
        mode: {
            "n": m["n"],
            "mean_pct": round(statistics.mean(m["pct"]), 3),
            "median_pct": round(statistics.median(m["pct"]), 3),
            "sd_pct": round(statistics.stdev(m["pct"]), 3) if len(m["pct"]) > 1 else None,
            "within_spread_share": round(m["spread"] / m["n"], 3),
            "within_one_pct_share": round(m["one"] / m["n"], 3),
        }
        for mode, m in modes.items()
    }
    means = {n: {m: statistics.mean(v["pct"]) for m, v in r.items()} for n, r in runs.items()}
    pairs: dict[str, Any] = {}
    # Each pair once, in the order the modes first ran, exclusive always second.
    order = [m for m in modes if m != BASE] + ([BASE] if BASE in modes else [])
    for a, b in itertools.combinations(order, 2):
        both = [(m[a], m[b]) for m in means.values() if a in m and b in m]
        if not both:
            continue
        diff = [x - y for x, y in both]
        above, below = sum(d > 0 for d in diff), sum(d < 0 for d in diff)
        pairs[f"{a} - {b}"] = {
            "runs": len(both),
            "mean_diff_points": round(statistics.mean(diff), 3),
            "above": above,
            "below": below,
            "sign_p": round(_sign_p(above, below), 4),
        }
    per_run = {n: {m: round(v, 3) for m, v in r.items()} for n, r in means.items()}
    return {"part": part, "modes": summary, "pairs": pairs, "run_means_pct": per_run}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("jsons", nargs="+", type=Path)
    ap.add_argument("--part", required=True)
    ap.add_argument("--json", type=Path, help="write the result here too")
    args = ap.parse_args()
    docs = []
    for path in args.jsons:
        try:
            docs.append((str(path), json.loads(path.read_text())))
        except (OSError, ValueError) as e:
            print(f"pooled: {path}: {e}", file=sys.stderr)
            return 2
    try:
        out = pooled(docs, args.part)
    except ValueError as e:
        print(f"pooled: {e}", file=sys.stderr)
        return 1
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
