"""Elementwise: out = gelu(x) * y over 2**24 fp32 values (a memory-bound kernel of ~0.05 ms).

Candidates: a Triton kernel at three block sizes, and eager PyTorch (two kernels).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch
import triton
import triton.language as tl

from krex.bench.tasks._harness import Variant, run

TASK = "elementwise"
N = 1 << 24


@triton.jit
def _gelu_mul(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476)) * y, mask=mask)


def make_inputs(gen: torch.Generator) -> list[torch.Tensor]:
    return [torch.randn(N, device="cuda", generator=gen) for _ in range(2)]


def reference(inputs: Sequence[torch.Tensor]) -> torch.Tensor:
    x, y = inputs
    return torch.nn.functional.gelu(x) * y


def _triton(block: int, warps: int) -> Callable[[Sequence[torch.Tensor]], Callable[[], Any]]:
    def build(inputs: Sequence[torch.Tensor]) -> Callable[[], Any]:
        x, y = inputs
        out = torch.empty_like(x)
        grid = (triton.cdiv(N, block),)

        def fn() -> torch.Tensor:
            _gelu_mul[grid](x, y, out, N, BLOCK=block, num_warps=warps)
            return out

        return fn

    return build


def _eager(inputs: Sequence[torch.Tensor]) -> Callable[[], Any]:
    return lambda: reference(inputs)


def _compiled(inputs: Sequence[torch.Tensor]) -> Callable[[], Any]:
    f = torch.compile(reference)
    return lambda: f(inputs)


VARIANTS = {
    "triton-b256": Variant(_triton(256, 2), atol=1e-5, rtol=1e-5),
    "triton-b1024": Variant(_triton(1024, 4), atol=1e-5, rtol=1e-5),
    "triton-b4096": Variant(_triton(4096, 8), atol=1e-5, rtol=1e-5),
    "eager": Variant(_eager, atol=1e-5, rtol=1e-5),
    "compiled": Variant(_compiled, atol=1e-5, rtol=1e-5),
}

if __name__ == "__main__":
    sys.exit(run(TASK, make_inputs, reference, VARIANTS))
