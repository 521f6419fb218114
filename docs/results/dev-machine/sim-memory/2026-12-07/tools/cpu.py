"""CPU-seconds per mode of the instrumented sim_memory.py runs (README): the whole mode, the
daemon, the `krex run` clients with their commands, the commands alone."""

import json
import sys

for f in sys.argv[1:]:
    with open(f) as fh:
        d = json.load(fh)
    for m in d["modes"]:
        cs = m["commands"]
        clients = sum(c["client_cpu"] for c in cs)
        cmds = sum(c["T"]["cpu"] for c in cs if "T" in c)
        print(
            f.split("/")[-1], m["mode"], round(m["ok_per_min"], 1),
            "total", round(m["cpu_s"], 2), "daemon", round(m["daemon_cpu"], 2),
            "clients+cmds", round(clients, 2), "cmds", round(cmds, 2),
            "wall", round(m["wall_s"], 2),
        )  # fmt: skip
