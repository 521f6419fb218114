"""Attention-like: softmax(Q K^T / sqrt(d)) V for batch x heads = 64, sequence 4096, head size
64, fp32 at PyTorch's default (full fp32) matmul precision: a kernel sequence of > 10 ms.

Candidates: eager (matmul, scale, softmax, matmul), eager with the scale folded into baddbmm,
eager in two chunks of heads (half the memory), and torch.compile.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch

from krex.bench.tasks._harness import Variant, run

TASK = "attention"
BH, S, D = 64, 4096, 64
SCALE = 1.0 / math.sqrt(D)


def make_inputs(gen: torch.Generator) -> list[torch.Tensor]:
    return [torch.randn(BH, S, D, device="cuda", generator=gen) for _ in range(3)]


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.softmax((q @ k.transpose(1, 2)) * SCALE, dim=-1) @ v


def reference(inputs: Sequence[torch.Tensor]) -> torch.Tensor:
    q, k, v = inputs
    # in chunks of heads: the double-precision scores of all 64 would take 8 GiB
    return torch.cat(
        [_attention(q[i : i + 8].double(), k[i : i + 8].double(), v[i : i + 8].double())
         for i in range(0, BH, 8)]
    )  # fmt: skip


def _eager(inputs: Sequence[torch.Tensor]) -> Callable[[], Any]:
    q, k, v = inputs
    return lambda: _attention(q, k, v)


def _baddbmm(inputs: Sequence[torch.Tensor]) -> Callable[[], Any]:
    q, k, v = inputs
    scores = torch.empty(BH, S, S, device="cuda")

    def fn() -> torch.Tensor:
        s = torch.baddbmm(scores, q, k.transpose(1, 2), beta=0.0, alpha=SCALE)
        return torch.softmax(s, dim=-1) @ v

    return fn


def _chunked(inputs: Sequence[torch.Tensor]) -> Callable[[], Any]:
    q, k, v = inputs
    half = BH // 2
    return lambda: torch.cat([_attention(q[i : i + half], k[i : i + half], v[i : i + half])
                              for i in (0, half)])  # fmt: skip


def _compiled(inputs: Sequence[torch.Tensor]) -> Callable[[], Any]:
    q, k, v = inputs
    f = torch.compile(_attention)
    return lambda: f(q, k, v)


_TOL = {"atol": 1e-4, "rtol": 1e-3}
VARIANTS = {
    "eager": Variant(_eager, **_TOL),
    "baddbmm": Variant(_baddbmm, **_TOL),
    "chunked-2": Variant(_chunked, **_TOL),
    "compiled": Variant(_compiled, **_TOL),
}

if __name__ == "__main__":
    sys.exit(run(TASK, make_inputs, reference, VARIANTS))
