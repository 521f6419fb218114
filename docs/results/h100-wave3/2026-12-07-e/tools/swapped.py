"""Each command a mode took off the GPU (krex/daemon/swap.py): its timing there against the same
command's in the other modes, its waits and time off the GPU.

    python3 tools/swapped.py 2-kbmem/kb_memory.json
"""

from __future__ import annotations

import json
import sys


def main(path: str) -> None:
    with open(path) as f:
        modes = json.load(f)["modes"]
    by = {m["mode"]: {(c["problem"], c["variant"]): c for c in m["commands"]} for m in modes}
    for m in modes:
        for c in m["commands"]:
            k = c.get("krex") or {}
            if not k.get("swaps"):
                continue
            key = (c["problem"], c["variant"])
            others = {n: cs[key].get("median_ms") for n, cs in by.items() if n != m["mode"]}
            cells = ", ".join(f"{n} {v:.4f}" for n, v in others.items() if v)
            print(
                f"{m['mode']}: {key[0]} {key[1]}: swaps {k['swaps']}, off the GPU "
                f"{k['off_gpu_s']:.1f} s, memory wait {k['mem_wait_s']:.1f} s, wall "
                f"{c['wall_s']:.1f} s, timing clean {k['timing_clean']}, warnings "
                f"{k['warnings']}, median {c.get('median_ms') or 0:.4f} ms ({cells})"
            )


if __name__ == "__main__":
    main(sys.argv[1])
