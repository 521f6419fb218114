"""A sibling for scripts/bench/fidelity_check.py: holds HOLD GiB of device memory; with
"churn" it also allocates and frees 1 GiB and runs an elementwise kernel over 256 MiB, back to
back, until killed; with "idle" it only holds."""

import sys
import time

import torch

hold_gib, mode = float(sys.argv[1]), sys.argv[2]
held = torch.empty(int(hold_gib * (1 << 30)), dtype=torch.uint8, device="cuda")
held.fill_(1)
small = torch.randn(1 << 27, device="cuda", dtype=torch.float16)
torch.cuda.synchronize()
print("ready", flush=True)
while True:
    if mode == "churn":
        chunk = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
        chunk.fill_(2)
        small.mul_(1.0001).add_(0.5)
        del chunk
        torch.cuda.empty_cache()  # back to the driver: a real free and a real allocation
        torch.cuda.synchronize()
    else:
        time.sleep(0.5)
