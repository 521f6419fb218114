"""Triton under the shim: a jit kernel (cuLaunchKernelEx through dlsym) and do_bench."""

# mypy: disable-error-code="untyped-decorator,no-untyped-def,func-returns-value"

from __future__ import annotations

import sys

import torch
import triton
import triton.language as tl
from common import check, counts, finish, window


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(
        out_ptr + offs,
        tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask),
        mask=mask,
    )


n = 1 << 20
x = torch.randn(n, device="cuda")
y = torch.randn(n, device="cuda")
out = torch.empty_like(x)
grid = (triton.cdiv(n, 1024),)


def launch() -> None:
    add_kernel[grid](x, y, out, n, BLOCK=1024)


launch()  # compile
torch.cuda.synchronize()
window(
    "triton jit kernel x1000 (loop count)",
    1000,
    lambda: [launch() for _ in range(1000)],
    torch.cuda.synchronize,
)
check("triton result", bool(torch.allclose(out, x + y)))
c0, _ = counts()
ms = triton.testing.do_bench(launch, return_mode="median")
c1, _ = counts()
check(
    "triton do_bench runs and is intercepted",
    ms > 0 and c1 - c0 > 10,
    median_ms=ms,
    intercepted=c1 - c0,
)
sys.exit(finish("triton"))
