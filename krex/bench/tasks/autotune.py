"""Autotuned matmul: C = A @ B for 4096 x 4096 fp16 matrices, where the candidate picks its own
kernel by timing alternatives when it is built (a kernel of ~0.2 ms on an H200).

Candidates: the Triton tutorial's matmul under `@triton.autotune` with the tutorial's eight
CUDA configs (the winner is timed at the first call), torch.compile in max-autotune mode (Inductor
times cuBLAS against its Triton templates at compile time), and plain cuBLAS. Their choices are
made outside `krex.region()`: only `krex run --auto-regions` (the bench's krex modes) times
them in regions (docs/bench.md).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch
import triton
import triton.language as tl

from krex.bench.tasks._harness import Variant, run

TASK = "autotune"
M = N = K = 4096


def _config(bm: int, bn: int, bk: int, stages: int, warps: int) -> triton.Config:
    meta = {"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": 8}
    return triton.Config(meta, num_stages=stages, num_warps=warps)


# The CUDA configs of triton's tutorial 03-matrix-multiplication.py.
@triton.autotune(
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
)
@triton.jit
def _matmul(
    a_ptr, b_ptr, c_ptr, M, N, K, sam, sak, sbk, sbn, scm, scn,
    BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    in_group = GROUP_SIZE_M * num_pid_n
    first_m = (pid // in_group) * GROUP_SIZE_M
    group_size = min(num_pid_m - first_m, GROUP_SIZE_M)
    pid_m = first_m + ((pid % in_group) % group_size)
    pid_n = (pid % in_group) // group_size
    offs_m = (pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)) % M
    offs_n = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)) % N
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    a_ptrs = a_ptr + offs_m[:, None] * sam + offs_k[None, :] * sak
    b_ptrs = b_ptr + offs_k[:, None] * sbk + offs_n[None, :] * sbn
    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
        a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k * BLOCK_SIZE_K, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < K - k * BLOCK_SIZE_K, other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_SIZE_K * sak
        b_ptrs += BLOCK_SIZE_K * sbk
    offs_cm = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    c_ptrs = c_ptr + offs_cm[:, None] * scm + offs_cn[None, :] * scn
    mask = (offs_cm[:, None] < M) & (offs_cn[None, :] < N)
    tl.store(c_ptrs, acc.to(tl.float16), mask=mask)


def make_inputs(gen: torch.Generator) -> list[torch.Tensor]:
    return [(0.1 * torch.randn(M, K, device="cuda", generator=gen)).half() for _ in range(2)]


def reference(inputs: Sequence[torch.Tensor]) -> torch.Tensor:
    a, b = inputs
    return a.float() @ b.float()


def _triton_autotune(inputs: Sequence[torch.Tensor]) -> Callable[[], Any]:
    a, b = inputs
    c = torch.empty(M, N, device="cuda", dtype=torch.float16)

    def grid(meta: dict[str, Any]) -> tuple[int]:
        return (triton.cdiv(M, meta["BLOCK_SIZE_M"]) * triton.cdiv(N, meta["BLOCK_SIZE_N"]),)

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

if __name__ == "__main__":
    sys.exit(run(TASK, make_inputs, reference, VARIANTS))
