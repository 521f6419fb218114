"""The siblings' turns a second read against the share of the owner's window left to them
(2026-12-07 evening, on the development VM, from this folder's region_entry.json files: the
README's "Read again"):

    cd docs/results/h100-wave3/2026-12-07-g && python3 window.py \
        {1-shim-entry,4-entry-compiling,5-entry-again}/region_entry.json > window.txt

Per setting: the owner's window per region (its wall over its regions), the siblings' time
blocked per region (p50s: entry less drain, the gate shut with their queued work done and them
frozen, plus exit), the share of the window left to them, their turns a second over that share.
"""

import json
import sys
from pathlib import Path

for f in sys.argv[1:]:
    for k in json.loads(Path(f).read_text())["kinds"]:
        if "sibling_turns_per_s" not in k:
            continue
        per = 1000 * k["owner_wall_s"] / k["regions"]
        blocked = k["entry_s"]["p50_ms"] - k["drain_s"]["p50_ms"] + k["exit_s"]["p50_ms"]
        share = 1 - blocked / per
        rate, where = k["sibling_turns_per_s"], Path(f).parent.name or "."
        print(
            f"{where:<18} {k['kind']:<9} pace {k['pace_ms']:g}: window {per:.1f} ms, "
            f"blocked {blocked:.1f} ms, left {share:.3f}, turns/s {rate} -> {rate / share:.1f} "
            "over what was left"
        )
