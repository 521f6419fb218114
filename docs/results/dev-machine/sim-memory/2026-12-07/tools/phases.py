"""Mean seconds per phase of a command, per mode, over the instrumented runs (README)."""

import json
import statistics as st
import sys

agg: dict[str, dict[str, list[float]]] = {}
for f in sys.argv[1:]:
    with open(f) as fh:
        d = json.load(fh)
    for m in d["modes"]:
        ph = agg.setdefault(m["mode"], {})
        ph.setdefault("okpm", []).append(m["ok_per_min"])
        for c in m["commands"]:
            t, tc = c.get("T"), c.get("tc")
            if not t or not tc or tc["t_admitted"] is None:
                continue
            steps = [
                ("boot", c["w0"], tc["t_proc"]),
                ("cli", tc["t_proc"], tc["t_attempt"]),
                ("queue", tc["t_attempt"], tc["t_admitted"]),
                ("spawn", tc["t_admitted"], t["first"]),
                ("ctx", t["first"], t["ctx"]),
                ("input", t["ctx"], t["input"]),
                ("sleep", t["input"], t["slept"]),
                ("launch", t["slept"], t["launched"]),
                ("ws", t["launched"], t["ws"]),
                ("regwait", t["pre_region"], t["in_region"]),
                ("region", t["in_region"], t["region_end"]),
                ("exit", t["region_end"], c["w1"]),
            ]
            for k, a, b in steps:
                ph.setdefault(k, []).append(b - a)
for mode, ph in agg.items():
    okpm = st.mean(ph.pop("okpm"))
    print(mode, "ok/min", round(okpm, 1), " ".join(f"{k}={st.mean(v):.3f}" for k, v in ph.items()))
