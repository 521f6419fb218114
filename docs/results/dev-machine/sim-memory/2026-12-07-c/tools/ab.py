"""Means of ok/min per mode, the 16/8 ratio, preemptions and swaps over sim_memory.py runs.

python3 tools/ab.py base*.json     python3 tools/ab.py new*.json
"""

from __future__ import annotations

import json
import statistics
import sys


def main(paths: list[str]) -> None:
    rate: dict[str, list[float]] = {}
    pre: dict[str, int] = {}
    swaps: dict[str, int] = {}
    for p in paths:
        with open(p) as f:
            modes = json.load(f)["modes"]
        for m in modes:
            name = m["mode"]
            rate.setdefault(name, []).append(m["ok_per_min"])
            pre[name] = pre.get(name, 0) + m["preemptions"]
            cmds = m.get("commands", [])
            swaps[name] = swaps.get(name, 0) + sum(
                (c.get("memory") or {}).get("swaps", 0) for c in cmds
            )
    for name, v in sorted(rate.items()):
        print(
            f"{name}: {len(v)} runs, ok/min mean {statistics.mean(v):.1f} "
            f"(median {statistics.median(v):.1f}), preemptions {pre[name]}, swaps {swaps[name]}"
        )
    if "krex8" in rate and "krex16" in rate:
        ratio = statistics.mean(rate["krex16"]) / statistics.mean(rate["krex8"])
        pairs = [round(a / b, 3) for a, b in zip(rate["krex16"], rate["krex8"], strict=True)]
        print(f"16 / 8 on the means: {ratio:.3f}; per run: {pairs}")


if __name__ == "__main__":
    main(sys.argv[1:])
