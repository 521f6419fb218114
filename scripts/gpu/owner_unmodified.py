"""An unmodified benchmarking script (no krex import): krex run --auto-regions wraps do_bench."""

import json

import torch
import triton

a = torch.randn(4096, 4096, device="cuda")
b = torch.randn(4096, 4096, device="cuda")
a @ b
torch.cuda.synchronize()
medians = [
    float(triton.testing.do_bench(lambda: a @ b, warmup=50, rep=300, return_mode="median"))
    for _ in range(3)
]
print(json.dumps({"medians_ms": medians}))
