"""Where a sim_memory.py run's 16-against-8 difference lies: the first wave or the rest.

For each mode of each run: ok/min over the whole run (the benchmark's figure), when its first
command ended, when its 8th ended, and ok/min from the 8th command's end to the last's (the
rate once the first wave is out). Then each pair's 16 / 8 by the whole run and after the
first wave, and their means over the runs.

    python3 waves.py RUN.json [RUN.json ...]
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

FIRST = 8  # commands ended by the end of the first wave at 8 slots


def waves(mode: dict) -> dict[str, float]:
    ends = sorted(c["end_s"] for c in mode["commands"] if c["rc"] == 0)
    return {
        "ok_min": mode["ok_per_min"],
        "first_end_s": ends[0],
        "eighth_end_s": ends[FIRST - 1],
        "after_ok_min": (len(ends) - FIRST) / (ends[-1] - ends[FIRST - 1]) * 60,
        "preempted": mode["preemptions"],
    }


def main(paths: list[str]) -> None:
    whole, after, first = [], [], []
    print(
        "run | first | krex8 ok/min | krex16 ok/min | 16/8 | first end 8 / 16 s"
        " | after 1st wave 8 / 16 ok/min | 16/8 after | preemptions 8 / 16"
    )
    for p in paths:
        run = json.loads(Path(p).read_text())["modes"]
        modes, order = {m["mode"]: waves(m) for m in run}, run[0]["mode"]
        a, b = modes["krex8"], modes["krex16"]
        whole.append((a["ok_min"], b["ok_min"]))
        after.append((a["after_ok_min"], b["after_ok_min"]))
        first.append(b["first_end_s"] - a["first_end_s"])
        print(
            f"{p} | {order} | {a['ok_min']:.1f} | {b['ok_min']:.1f} | "
            f"{b['ok_min'] / a['ok_min']:.2f} | {a['first_end_s']:.2f} / {b['first_end_s']:.2f}"
            f" | {a['after_ok_min']:.1f} / {b['after_ok_min']:.1f} | "
            f"{b['after_ok_min'] / a['after_ok_min']:.2f} | {a['preempted']} / {b['preempted']}"
        )

    def ratio(pairs: list[tuple[float, float]]) -> str:
        m8, m16 = statistics.mean(x for x, _ in pairs), statistics.mean(y for _, y in pairs)
        return f"{m16:.1f} against {m8:.1f} ok/min ({m16 / m8:.3f})"

    print(f"means, whole run: {ratio(whole)}")
    print(f"means, after the first wave: {ratio(after)}")
    print(
        f"first command ended later at 16 by {statistics.mean(first):.2f} s on the mean "
        f"(median {statistics.median(first):.2f} s)"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
