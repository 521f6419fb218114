"""Softmax: row softmax of a 16384 x 8192 fp32 matrix (a memory-bound kernel of ~0.3 ms).

Candidates: a Triton kernel (one row per program) at three warp counts, eager torch.softmax, and
torch.compile of it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch
import triton
import triton.language as tl

from krex.bench.tasks._harness import Variant, run

TASK = "softmax"
M, N = 16384, 8192


@triton.jit
def _softmax_rows(x_ptr, out_ptr, n_cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride + offs, mask=mask, other=-float("inf"))
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(out_ptr + row * stride + offs, e / tl.sum(e, axis=0), mask=mask)


def make_inputs(gen: torch.Generator) -> list[torch.Tensor]:
    return [torch.randn(M, N, device="cuda", generator=gen)]


def reference(inputs: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.softmax(inputs[0].double(), dim=1)


def _triton(warps: int) -> Callable[[Sequence[torch.Tensor]], Callable[[], Any]]:
    def build(inputs: Sequence[torch.Tensor]) -> Callable[[], Any]:
        (x,) = inputs
        out = torch.empty_like(x)
        block = triton.next_power_of_2(N)

        def fn() -> torch.Tensor:
            _softmax_rows[(M,)](x, out, N, x.stride(0), BLOCK=block, num_warps=warps)
            return out

        return fn

    return build


def _eager(inputs: Sequence[torch.Tensor]) -> Callable[[], Any]:
    (x,) = inputs
    return lambda: torch.softmax(x, dim=1)


def _compiled(inputs: Sequence[torch.Tensor]) -> Callable[[], Any]:
    f = torch.compile(lambda x: torch.softmax(x, dim=1))
    return lambda: f(inputs[0])


VARIANTS = {
    "triton-w8": Variant(_triton(8), atol=1e-6, rtol=1e-4),
    "triton-w16": Variant(_triton(16), atol=1e-6, rtol=1e-4),
    "triton-w32": Variant(_triton(32), atol=1e-6, rtol=1e-4),
    "eager": Variant(_eager, atol=1e-6, rtol=1e-4),
    "compiled": Variant(_compiled, atol=1e-6, rtol=1e-4),
}

if __name__ == "__main__":
    sys.exit(run(TASK, make_inputs, reference, VARIANTS))
