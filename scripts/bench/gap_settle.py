"""Does an idle as long as the siblings' gap take their heat away, after the owner's own
power-capped work? The physics behind the power-capped settle's gap rule (docs/user-guide.md,
"Power-limited kernels"), measured natively in one process (no krex), as settle_sweep.py does
for the full settle.

Under krex a command whose regions run into the power limit (an autotuner's candidates, then
its timing) gets the GPU back a few tens of ms after its previous region ended: in between its
siblings ran, for the gap G, at most at the same power limit. This times the bench suite's
cuDNN conv (power-limited on the H200 even on a rested GPU) with triton's do_bench (median)
after `--own` seconds of the conv back to back (the owner's own capped work), then:

- `native`: 5 ms idle (the host's own gap between a command's autotune and its timing);
- `gap G, no settle`: G seconds of fp32 4096^2 matmuls (the siblings), then at once;
- `gap G, idle G`: the same, then G seconds idle (the rule);
- `gap G, idle 2 s`: the same, then the full capped settle.

Each condition `--rounds` times, shuffled, each G of `--gaps`; per condition the median
reading against native's median (per cent), and native's own spread. One JSON line per
timing, written as it is taken, then the summary.

`--own-work idle`: the owner's own work is `--own` seconds of an idle GPU instead (a command
whose last region stayed below the power limit, such as Inductor's candidates of small
kernels): whether the gap rule could hold after an uncapped region too (it does not apply
there today: docs/user-guide.md, "Power-limited kernels").

    python3 scripts/bench/gap_settle.py --out OUT.jsonl [--own 1] [--gaps 0.02,0.05,0.1,0.25]
        [--rounds 4] [--full 2] [--own-work conv|idle]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
HOST_GAP_S = 0.005  # a command's own gap between its autotune and its timing, natively


def conditions(gaps: list[float], full: float) -> list[tuple[str, float, float]]:
    """(label, sibling heat seconds, idle seconds) of each condition, native first."""
    out = [("native", 0.0, HOST_GAP_S)]
    for g in gaps:
        out += [
            (f"gap {g:g}, no settle", g, 0.0),
            (f"gap {g:g}, idle {g:g}", g, g),
            (f"gap {g:g}, idle {full:g}", g, full),
        ]
    return out


def summary(points: list[dict[str, Any]]) -> dict[str, Any]:
    """Per condition the median reading (ms), its excess over native's median and its range
    (per cent); native's spread is its own range."""
    by: dict[str, list[float]] = {}
    for p in points:
        by.setdefault(p["label"], []).append(p["ms"])
    if "native" not in by:
        raise ValueError("no native timing to compare with")
    base = statistics.median(by["native"])

    def pct(ms: float) -> float:
        return round((ms / base - 1) * 100, 3)

    return {
        "native_ms": base,
        "native_spread_pct": round((max(by["native"]) - min(by["native"])) / base * 100, 3),
        "conditions": {
            label: {
                "n": len(ms),
                "median_ms": statistics.median(ms),
                "excess_pct": pct(statistics.median(ms)),
                "range_pct": [pct(min(ms)), pct(max(ms))],
            }
            for label, ms in by.items()
        },
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON lines: each timing, then the summary")
    ap.add_argument("--own", type=float, default=1.0, help="seconds of the owner's own conv")
    ap.add_argument("--gaps", default="0.02,0.05,0.1,0.25", help="sibling seconds, comma-separated")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--full", type=float, default=2.0, help="the full capped settle, seconds")
    ap.add_argument(
        "--own-work", choices=("conv", "idle"), default="conv",
        help="the owner's own work before the gap: its conv, or an idle GPU",
    )  # fmt: skip
    args = ap.parse_args()
    try:
        gaps = [float(s) for s in args.gaps.split(",") if s.strip()]
    except ValueError:
        print(f"gap_settle: --gaps {args.gaps!r}: not numbers", file=sys.stderr)
        return 2
    if not gaps or min(gaps) <= 0 or args.own <= 0 or args.rounds < 1 or args.full < 0:
        print("gap_settle: need gaps > 0, --own > 0, --rounds >= 1, --full >= 0", file=sys.stderr)
        return 2

    import torch
    import triton.testing
    from settle_sweep import emit, report, suite_conv

    conv, gen = suite_conv()  # the conv settle_sweep.py times, cuDNN's search done
    a = torch.randn(4096, 4096, device="cuda", generator=gen)
    c = torch.empty_like(a)
    torch.cuda.synchronize()

    def run_for(seconds: float, step: Any) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            step()
            torch.cuda.synchronize()

    def own() -> None:
        for _ in range(8):
            conv()

    def sibling() -> None:
        torch.mm(a, a, out=c)

    out = Path(args.out)
    points: list[dict[str, Any]] = []

    conds = conditions(gaps, args.full)
    rng = random.Random(0)
    order = [c for _ in range(args.rounds) for c in rng.sample(conds, len(conds))]
    idle = args.own_work == "idle"
    if not idle:
        run_for(5.0, own)  # the GPU at its working state first
    for label, heat_s, idle_s in order:
        if idle:
            time.sleep(args.own)
        else:
            run_for(args.own, own)
        if heat_s > 0:
            run_for(heat_s, sibling)
        time.sleep(idle_s)
        ms = float(triton.testing.do_bench(conv, return_mode="median"))
        point = {"label": label, "own_work": args.own_work, "gap_s": heat_s, "idle_s": idle_s,
                 "ms": ms}  # fmt: skip
        points.append(point)
        emit(out, point)
        print(json.dumps(point), flush=True)
    return report(out, summary(points))


if __name__ == "__main__":
    sys.exit(main())
