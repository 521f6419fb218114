"""The gate and the drain on the real driver, and what they buy.

This process is the owner tenant (it runs under the shim as tenant 1) and, for this check, also
plays the controller: it closes the gate to a sibling tenant that hammers the GPU with matmuls,
quiesces and drains it through the shim's drain thread, and times a 4096^2 fp32 matmul with
triton's do_bench alone, next to the sibling, and with the sibling gated.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch
import triton

from krex.core.shm import Segment
from krex.daemon.gate import exclusive

seg = Segment.attach(os.environ["KREX_SHM"])
here = Path(__file__).resolve().parent
a = torch.randn(4096, 4096, device="cuda")
b = torch.randn(4096, 4096, device="cuda")


def bench() -> float:
    return float(triton.testing.do_bench(lambda: a @ b, warmup=100, rep=500, return_mode="median"))


def sibling_count(pid: int) -> int:
    return sum(s.intercepted for s in seg.slots_of(pid) if s.alive)


def start_sibling() -> subprocess.Popen[str]:
    env = dict(os.environ, KREX_TENANT="2")
    p = subprocess.Popen(
        [sys.executable, str(here / "sibling.py")], env=env, stdout=subprocess.PIPE, text=True
    )
    assert p.stdout is not None
    assert p.stdout.readline().strip() == "ready"
    time.sleep(2.0)  # let it reach its steady state
    return p


out: dict[str, Any] = {"program": "gate"}
out["solo_ms"] = [bench() for _ in range(3)]
sib = start_sibling()
out["shared_ms"] = [bench() for _ in range(3)]
gated = []
holds = []
for _ in range(3):
    with exclusive(seg, 0, owner=1, quiesce_timeout_s=5, drain_timeout_s=30) as hold:
        before = sibling_count(sib.pid)
        t0 = time.perf_counter()
        gated.append(bench())
        time.sleep(0.2)
        after = sibling_count(sib.pid)
        holds.append(
            {
                "quiesce_s": hold.quiesce_s,
                "drain_s": hold.drain_s,
                "drained_slots": hold.drained,
                "clean": hold.clean,
                "sibling_calls_while_held": after - before,
                "held_s": time.perf_counter() - t0,
            }
        )
    time.sleep(0.5)
resumed_from = sibling_count(sib.pid)
time.sleep(1.0)
out["sibling_resumed_calls_1s"] = sibling_count(sib.pid) - resumed_from
out["gated_ms"] = gated
out["holds"] = holds
sib.kill()
sib.wait()
out["solo_after_ms"] = [bench() for _ in range(3)]
solo = sorted(out["solo_ms"] + out["solo_after_ms"])
solo_med = solo[len(solo) // 2]
out["solo_median_ms"] = solo_med
out["shared_inflation"] = sorted(out["shared_ms"])[1] / solo_med - 1
out["gated_inflation"] = sorted(gated)[1] / solo_med - 1
out["ok"] = all(h["sibling_calls_while_held"] == 0 and h["clean"] for h in holds) and (
    out["sibling_resumed_calls_1s"] > 0
)
print(json.dumps(out))
sys.exit(0 if out["ok"] else 1)
