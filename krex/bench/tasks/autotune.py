"""Autotuned matmul: C = A @ B for 4096 x 4096 fp16 matrices, where the candidate picks its own
kernel by timing alternatives when it is built (a kernel of ~0.2 ms on an H200).

Candidates: the matmul task's Triton kernel (the tutorial's) under `@triton.autotune` with the
tutorial's eight CUDA configs (the winner is timed at the first call), torch.compile in
max-autotune mode (Inductor times cuBLAS against its Triton templates at compile time), and
plain cuBLAS. Their choices are
made outside `krex.region()`: only `krex run --auto-regions` (the bench's krex modes) times
them in regions (docs/bench.md).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch
import triton

from krex.bench.choices import inductor_winner
from krex.bench.tasks import matmul
from krex.bench.tasks._harness import Choice, Variant, run

TASK = "autotune"
M = N = K = 4096


def _config(bm: int, bn: int, bk: int, stages: int, warps: int) -> triton.Config:
    return triton.Config(
        {"BM": bm, "BN": bn, "BK": bk, "GROUP": 8}, num_stages=stages, num_warps=warps
    )


# The matmul task's kernel (the tutorial's grouped-order kernel) under `@triton.autotune` with the
# CUDA configs of triton's tutorial 03-matrix-multiplication.py.
_matmul = triton.autotune(
    configs=[
        _config(128, 256, 64, 3, 8),
        _config(64, 256, 32, 4, 4),
        _config(128, 128, 32, 4, 4),
        _config(128, 64, 32, 4, 4),
        _config(64, 128, 32, 4, 4),
        _config(128, 32, 32, 4, 4),
        _config(64, 32, 32, 5, 2),
        _config(32, 64, 32, 5, 2),
    ],
    key=["M", "N", "K"],
)(matmul._matmul)


def make_inputs(gen: torch.Generator) -> list[torch.Tensor]:
    return [(0.1 * torch.randn(M, K, device="cuda", generator=gen)).half() for _ in range(2)]


def reference(inputs: Sequence[torch.Tensor]) -> torch.Tensor:
    a, b = inputs
    return a.float() @ b.float()


def _triton_autotune(inputs: Sequence[torch.Tensor]) -> Callable[[], Any]:
    a, b = inputs
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty(M, N, device=a.device, dtype=torch.float16)

    def grid(meta: dict[str, Any]) -> tuple[int]:
        return (triton.cdiv(M, meta["BM"]) * triton.cdiv(N, meta["BN"]),)

    def fn() -> torch.Tensor:
        _matmul[grid](
            a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
            c.stride(0), c.stride(1),
        )  # fmt: skip
        return c

    return fn


def _max_autotune(inputs: Sequence[torch.Tensor]) -> Callable[[], Any]:
    a, b = inputs
    f = torch.compile(lambda x, y: x @ y, mode="max-autotune-no-cudagraphs")
    try:  # a testing helper of Inductor's: where a torch lacks it, the choice goes unnamed
        from torch._inductor.utils import run_and_get_code
    except ImportError:
        return lambda: f(a, b)
    _, codes = run_and_get_code(f, a, b)  # compiles (and autotunes) here, keeping the code
    _picked["max-autotune"] = inductor_winner("\n".join(codes))
    return lambda: f(a, b)


def _cublas(inputs: Sequence[torch.Tensor]) -> Callable[[], Any]:
    a, b = inputs
    return lambda: a @ b


_TOL = {"atol": 2e-2, "rtol": 1e-2}
VARIANTS = {
    "triton-autotune": Variant(_triton_autotune, **_TOL),
    "max-autotune": Variant(_max_autotune, **_TOL),
    "cublas": Variant(_cublas, **_TOL),
}

# What each self-tuning candidate picked, for the report: Triton's winner, `best_config` (triton
# 3.6: "BM: 128, BN: 256, BK: 64, GROUP: 8, num_warps: 8, ..."); max-autotune's, what Inductor's
# generated code runs (aten's mm, or a Triton template's block sizes).
_picked: dict[str, str] = {}
CHOICES: dict[str, Choice] = {
    "triton-autotune": lambda fn: _matmul.best_config,
    "max-autotune": lambda fn: _picked["max-autotune"],
}

if __name__ == "__main__":
    sys.exit(run(TASK, make_inputs, reference, VARIANTS, choices=CHOICES))
