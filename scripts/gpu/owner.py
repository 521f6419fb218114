"""The measuring command of the controller check: do_bench of a 4096^2 fp32 matmul (~2.7 ms on
an H200), inside krex.region() unless --no-region; prints one JSON line."""

import json
import sys

import torch
import triton

import krex

a = torch.randn(4096, 4096, device="cuda")
b = torch.randn(4096, 4096, device="cuda")
a @ b
torch.cuda.synchronize()
use_region = "--no-region" not in sys.argv
medians = []
for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 3):
    if use_region:
        with krex.region():
            ms = triton.testing.do_bench(lambda: a @ b, warmup=50, rep=300, return_mode="median")
    else:
        ms = triton.testing.do_bench(lambda: a @ b, warmup=50, rep=300, return_mode="median")
    medians.append(float(ms))
print(json.dumps({"medians_ms": medians, "region": use_region}))
