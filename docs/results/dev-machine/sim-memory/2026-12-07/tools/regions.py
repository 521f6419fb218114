"""The daemon's region entry and exit steps (mean ms), per mode, from the instrumented runs'
region records (README)."""

import json
import statistics as st
import sys

agg: dict[str, dict[str, list[float]]] = {}
for f in sys.argv[1:]:
    with open(f) as fh:
        d = json.load(fh)
    for m in d["modes"]:
        a = agg.setdefault(m["mode"], {})
        for c in m["commands"]:
            for r in c.get("region_recs") or []:
                for k in ("wait_s", "entry_s", "duration_s", "exit_s"):
                    a.setdefault(k, []).append(r[k])
                for k, v in r["entry_steps_s"].items():
                    a.setdefault("e." + k, []).append(v)
                for k, v in r["exit_steps_s"].items():
                    a.setdefault("x." + k, []).append(v)
for mode, a in agg.items():
    print(mode, " ".join(f"{k}={1000 * st.mean(v):.1f}" for k, v in a.items()))
