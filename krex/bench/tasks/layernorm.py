"""LayerNorm: over the last dimension of a 16384 x 8192 fp16 matrix, fp32 statistics (a
memory-bound kernel of ~0.15 ms).

Candidates: a fused Triton kernel (one row per program) at three warp counts, eager
F.layer_norm, and torch.compile of it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch
import triton
import triton.language as tl

from krex.bench.tasks._harness import Variant, run

TASK = "layernorm"
M, N = 16384, 8192
EPS = 1e-5


@triton.jit
def _layernorm(x_ptr, w_ptr, b_ptr, out_ptr, n_cols, stride, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride + offs, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / n_cols
    d = tl.where(mask, x - mean, 0.0)
    rstd = tl.rsqrt(tl.sum(d * d, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + offs, mask=mask).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=mask).to(tl.float32)
    tl.store(out_ptr + row * stride + offs, (d * rstd * w + b).to(tl.float16), mask=mask)


def make_inputs(gen: torch.Generator) -> list[torch.Tensor]:
    x = torch.randn(M, N, device="cuda", generator=gen).half()
    w = (1 + 0.1 * torch.randn(N, device="cuda", generator=gen)).half()
    b = (0.1 * torch.randn(N, device="cuda", generator=gen)).half()
    return [x, w, b]


def reference(inputs: Sequence[torch.Tensor]) -> torch.Tensor:
    x, w, b = (t.float() for t in inputs)
    return torch.nn.functional.layer_norm(x, (N,), w, b, EPS)


def _triton(warps: int) -> Callable[[Sequence[torch.Tensor]], Callable[[], Any]]:
    def build(inputs: Sequence[torch.Tensor]) -> Callable[[], Any]:
        x, w, b = inputs
        out = torch.empty_like(x)
        block = triton.next_power_of_2(N)

        def fn() -> torch.Tensor:
            _layernorm[(M,)](x, w, b, out, N, x.stride(0), EPS, BLOCK=block, num_warps=warps)
            return out

        return fn

    return build


def _eager(inputs: Sequence[torch.Tensor]) -> Callable[[], Any]:
    x, w, b = inputs
    return lambda: torch.nn.functional.layer_norm(x, (N,), w, b, EPS)


def _compiled(inputs: Sequence[torch.Tensor]) -> Callable[[], Any]:
    x, w, b = inputs
    f = torch.compile(lambda x, w, b: torch.nn.functional.layer_norm(x, (N,), w, b, EPS))
    return lambda: f(x, w, b)


VARIANTS = {
    "triton-w8": Variant(_triton(8), atol=1e-2, rtol=1e-2),
    "triton-w16": Variant(_triton(16), atol=1e-2, rtol=1e-2),
    "triton-w32": Variant(_triton(32), atol=1e-2, rtol=1e-2),
    "eager": Variant(_eager, atol=1e-2, rtol=1e-2),
    "compiled": Variant(_compiled, atol=1e-2, rtol=1e-2),
}

if __name__ == "__main__":
    sys.exit(run(TASK, make_inputs, reference, VARIANTS))
