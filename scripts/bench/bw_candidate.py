"""One fidelity candidate for scripts/bench/fidelity_check.py (issue: a clean region 12 % slow).

python bw_candidate.py KIND [--realloc] [--big GIB]: KIND is matvec (a bandwidth-bound cuBLAS
gemv over an 8 GiB fp16 matrix), reduce (a sum over 4 GiB of fp32), elementwise (y = relu(x *
1.5 + 0.5) over 2 GiB of fp16 in and out) or matmul (a compute-bound 8192^3 bf16 matmul).
Times it with triton's do_bench (median) inside `krex.region()` (a no-op outside krex), then,
with --realloc, frees its tensors, empties PyTorch's cache, allocates them again and times it
again (placement of the same process's memory, the first suspect of a warm worker's slowdown).
--big GIB first allocates and frees GIB of device memory (a previous command's working set).
Prints one JSON line with what it measured and what the process's allocator held before.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable

import torch
import triton.testing

import krex

GIB = 1 << 30


def make(kind: str) -> tuple[list[torch.Tensor], Callable[[], object]]:
    if kind == "matvec":
        a = torch.randn(65536, 65536, device="cuda", dtype=torch.float16)
        x = torch.randn(65536, device="cuda", dtype=torch.float16)
        return [a, x], lambda: torch.mv(a, x)
    if kind == "reduce":
        a = torch.randn(GIB, device="cuda", dtype=torch.float32)
        return [a], lambda: a.sum()
    if kind == "elementwise":
        a = torch.randn(GIB, device="cuda", dtype=torch.float16)
        return [a], lambda: torch.relu(a * 1.5 + 0.5)
    if kind == "matmul":
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        return [a, b], lambda: a @ b
    raise SystemExit(f"unknown kind {kind}")


def timed(fn: Callable[[], object]) -> tuple[float, dict[str, object] | None]:
    with krex.region():
        ms = triton.testing.do_bench(fn, return_mode="median")
    return float(ms), krex.last_region()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("kind")
    ap.add_argument("--realloc", action="store_true")
    ap.add_argument("--big", type=float, default=0.0)
    args = ap.parse_args()
    before = {
        "reserved": torch.cuda.memory_reserved(),
        "segments": len(torch.cuda.memory_snapshot()),
    }
    if args.big:
        big = torch.empty(int(args.big * GIB), dtype=torch.uint8, device="cuda")
        big.fill_(1)
        del big
    tensors, fn = make(args.kind)
    fn()
    torch.cuda.synchronize()
    out: dict[str, object] = {"kind": args.kind, "pid": os.getpid(), "before": before}
    out["median_ms"], region = timed(fn)
    out["ptr_mod_2m"] = tensors[0].data_ptr() % (2 << 20)
    if region is not None:
        out["clean"] = region.get("clean")
        out["problems"] = region.get("problems")
        out["sm_clock_mhz"] = region.get("sm_clock_mhz")
    if args.realloc:
        shapes = [(t.shape, t.dtype) for t in tensors]
        del tensors, fn
        torch.cuda.empty_cache()
        tensors2, fn2 = make(args.kind)
        assert [(t.shape, t.dtype) for t in tensors2] == shapes
        fn2()
        torch.cuda.synchronize()
        out["realloc_median_ms"], _ = timed(fn2)
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
