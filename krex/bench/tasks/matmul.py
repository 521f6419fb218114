"""Matmul: C = A @ B for 8192 x 8192 fp16 matrices, fp32 accumulation (a compute-bound kernel of
~2 ms).

Candidates: the tiled Triton kernel (grouped program order) at four tile/stage configurations,
and torch.matmul (cuBLAS).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch
import triton
import triton.language as tl

from krex.bench.tasks._harness import Variant, run

TASK = "matmul"
M = N = K = 8192


@triton.jit
def _matmul(
    a_ptr, b_ptr, c_ptr, M, N, K, sam, sak, sbk, sbn, scm, scn,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BM)
    num_pid_n = tl.cdiv(N, BN)
    in_group = GROUP * num_pid_n
    first_m = (pid // in_group) * GROUP
    group_size = min(num_pid_m - first_m, GROUP)
    pid_m = first_m + ((pid % in_group) % group_size)
    pid_n = (pid % in_group) // group_size
    offs_m = (pid_m * BM + tl.arange(0, BM)) % M
    offs_n = (pid_n * BN + tl.arange(0, BN)) % N
    offs_k = tl.arange(0, BK)
    a_ptrs = a_ptr + offs_m[:, None] * sam + offs_k[None, :] * sak
    b_ptrs = b_ptr + offs_k[:, None] * sbk + offs_n[None, :] * sbn
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k * BK, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < K - k * BK, other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BK * sak
        b_ptrs += BK * sbk
    offs_cm = pid_m * BM + tl.arange(0, BM)
    offs_cn = pid_n * BN + tl.arange(0, BN)
    c_ptrs = c_ptr + offs_cm[:, None] * scm + offs_cn[None, :] * scn
    mask = (offs_cm[:, None] < M) & (offs_cn[None, :] < N)
    tl.store(c_ptrs, acc.to(tl.float16), mask=mask)


def make_inputs(gen: torch.Generator) -> list[torch.Tensor]:
    return [(0.1 * torch.randn(M, K, device="cuda", generator=gen)).half() for _ in range(2)]


def reference(inputs: Sequence[torch.Tensor]) -> torch.Tensor:
    a, b = inputs
    return a.float() @ b.float()


def _triton(
    bm: int, bn: int, bk: int, stages: int, warps: int
) -> Callable[[Sequence[torch.Tensor]], Callable[[], Any]]:
    def build(inputs: Sequence[torch.Tensor]) -> Callable[[], Any]:
        a, b = inputs
        c = torch.empty(M, N, device="cuda", dtype=torch.float16)
        grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)

        def fn() -> torch.Tensor:
            _matmul[grid](
                a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                c.stride(0), c.stride(1), BM=bm, BN=bn, BK=bk, GROUP=8,
                num_stages=stages, num_warps=warps,
            )  # fmt: skip
            return c

        return fn

    return build


def _cublas(inputs: Sequence[torch.Tensor]) -> Callable[[], Any]:
    a, b = inputs
    return lambda: a @ b


_TOL = {"atol": 2e-2, "rtol": 1e-2}
VARIANTS = {
    "triton-128x256x64-s3w8": Variant(_triton(128, 256, 64, 3, 8), **_TOL),
    "triton-128x128x64-s4w4": Variant(_triton(128, 128, 64, 4, 4), **_TOL),
    "triton-128x128x32-s4w4": Variant(_triton(128, 128, 32, 4, 4), **_TOL),
    "triton-64x256x32-s4w4": Variant(_triton(64, 256, 32, 4, 4), **_TOL),
    "cublas": Variant(_cublas, **_TOL),
}

if __name__ == "__main__":
    sys.exit(run(TASK, make_inputs, reference, VARIANTS))
