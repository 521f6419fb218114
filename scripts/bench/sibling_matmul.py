"""A busy sibling for the autotune, launch and linger checks (scripts/bench/autotune_check.py,
launch_probe.py, scripts/gpu/linger_check.py): "steady", a 4096^2 fp32 matmul, a sync and 10 ms
of sleep, over and over; "bursty", as agents' siblings alternate compiling and timing, 0.05-0.5 s
of 8192^2 matmuls back to back, then 0-0.3 s idle, at random (seeded by its pid). With "hold"
after either it holds its device memory and does no work. It prints "ready" once it has run."""

import os
import random
import sys
import time

import torch

rng = random.Random(os.getpid())
bursty = sys.argv[1] == "bursty"
n = 8192 if bursty else 4096
a = torch.randn(n, n, device="cuda")
if len(sys.argv) > 2 and sys.argv[2] == "hold":  # its device memory, and no work
    (a @ a).sum().item()
    print("ready", flush=True)
    time.sleep(1e6)
print("ready", flush=True)
while True:
    if not bursty:
        (a @ a).sum().item()
        time.sleep(0.01)
        continue
    end = time.monotonic() + rng.uniform(0.05, 0.5)
    while time.monotonic() < end:
        (a @ a).sum().item()
    time.sleep(rng.uniform(0.0, 0.3))
