"""PyTorch under the shim: eager kernels, cuBLAS matmuls, a CUDA graph; each launch counted."""

from __future__ import annotations

import sys

import torch
from common import check, expect, finish, measure, window
from torch.profiler import ProfilerActivity, profile

N = 1000
dev = torch.device("cuda")
sync = torch.cuda.synchronize

# Eager elementwise: one kernel launch per add_.
x = torch.zeros(1 << 20, device=dev)
for _ in range(3):
    x.add_(1.0)
window("torch eager add_ x1000 (loop count)", N, lambda: [x.add_(1.0) for _ in range(N)], sync)
check("torch eager add_ result", float(x[0].item()) == 3.0 + N)

# cuBLAS matmuls: the independent count is the profiler's device activities in the window.
a = torch.randn(2048, 2048, device=dev)
b = torch.randn(2048, 2048, device=dev)
c = a @ b
sync()
products: list[torch.Tensor] = []
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    got = measure(lambda: products.extend(a @ b for _ in range(100)), sync)
device_ops = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
expect("torch cuBLAS matmul x100 (vs profiler's device activities)", device_ops, got)
check("torch profiler saw at least one kernel per matmul", device_ops >= 100, device_ops=device_ops)
ref = (a.double() @ b.double()).float()
err = float((products[-1] - ref).norm() / ref.norm())
check("torch matmul result (rel. error vs float64)", err < 1e-2, rel_error=err)

# A CUDA graph: one cuGraphLaunch per replay, however many kernels it holds.
static_in = torch.randn(1 << 16, device=dev)
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(3):
        static_out = (static_in * 2.0 + 1.0).relu()
torch.cuda.current_stream().wait_stream(s)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    static_out = (static_in * 2.0 + 1.0).relu()
sync()
window(
    "torch CUDA graph replay x100 (loop count)", 100, lambda: [g.replay() for _ in range(100)], sync
)
check("torch graph result", bool(torch.allclose(static_out, (static_in * 2.0 + 1.0).relu())))

sys.exit(finish("torch"))
