"""Region grant latency: time from entering krex.region() to being inside it, N times."""

import json
import statistics
import sys
import time

import torch

import krex

torch.zeros(1, device="cuda")
torch.cuda.synchronize()
n = int(sys.argv[1])
lat = []
for _ in range(n):
    t0 = time.perf_counter()
    with krex.region():
        lat.append(time.perf_counter() - t0)
lat.sort()
print(
    json.dumps(
        {
            "n": n,
            "p50_ms": 1e3 * lat[n // 2],
            "p99_ms": 1e3 * lat[int(n * 0.99) - 1],
            "max_ms": 1e3 * lat[-1],
            "mean_ms": 1e3 * statistics.mean(lat),
        }
    )
)
