"""Reduction: the row sums of an 8192 x 8192 fp32 matrix (a memory-bound kernel of ~0.07 ms).

Candidates: a Triton kernel (one program per row, a loop over blocks) at three block sizes, and
torch.sum.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch
import triton
import triton.language as tl

from krex.bench.tasks._harness import Variant, run

TASK = "reduction"
M = N = 8192


@triton.jit
def _row_sum(x_ptr, out_ptr, n_cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + row * stride + offs, mask=offs < n_cols, other=0.0)
    tl.store(out_ptr + row, tl.sum(acc, axis=0))


def make_inputs(gen: torch.Generator) -> list[torch.Tensor]:
    return [torch.randn(M, N, device="cuda", generator=gen)]


def reference(inputs: Sequence[torch.Tensor]) -> torch.Tensor:
    return inputs[0].double().sum(dim=1)


def _triton(block: int, warps: int) -> Callable[[Sequence[torch.Tensor]], Callable[[], Any]]:
    def build(inputs: Sequence[torch.Tensor]) -> Callable[[], Any]:
        (x,) = inputs
        out = torch.empty(M, device="cuda")

        def fn() -> torch.Tensor:
            _row_sum[(M,)](x, out, N, x.stride(0), BLOCK=block, num_warps=warps)
            return out

        return fn

    return build


def _torch_sum(inputs: Sequence[torch.Tensor]) -> Callable[[], Any]:
    (x,) = inputs
    return lambda: x.sum(dim=1)


def _compiled(inputs: Sequence[torch.Tensor]) -> Callable[[], Any]:
    f = torch.compile(lambda x: x.sum(dim=1))
    return lambda: f(inputs[0])


VARIANTS = {
    "triton-b512": Variant(_triton(512, 4), atol=1e-3, rtol=1e-4),
    "triton-b1024": Variant(_triton(1024, 4), atol=1e-3, rtol=1e-4),
    "triton-b2048": Variant(_triton(2048, 8), atol=1e-3, rtol=1e-4),
    "torch-sum": Variant(_torch_sum, atol=1e-3, rtol=1e-4),
    "compiled": Variant(_compiled, atol=1e-3, rtol=1e-4),
}

if __name__ == "__main__":
    sys.exit(run(TASK, make_inputs, reference, VARIANTS))
