"""Naming what an autotuner picked, from what it leaves behind (no torch needed here).

The bench's self-tuning candidates report a `choice` (krex/bench/tasks/_harness.py) and
scripts/bench/autotune_check.py a `winner`; both name it the same way: Triton's `best_config`
as Triton prints it, Inductor's max-autotune from the code it generated, cuDNN's benchmark mode
from the CUDA kernels one call runs (cuDNN keeps its choice internal; its kernels' names carry
the algorithm's tile and variant).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

KERNEL_NAME_CHARS = 120
"""Kernel names past this are cut: templated C++ names run to thousands of characters."""


def inductor_winner(code: str) -> str:
    """What Inductor's generated wrapper code runs for a matmul: "aten mm" (cuBLAS through
    extern_kernels; "aten addmm" where a Linear's bias goes with it) or "template" with the
    Triton template's constexpr block sizes and its launch's stages and warps (the first
    launch)."""
    if "extern_kernels.addmm(" in code:
        return "aten addmm"
    if "extern_kernels.mm(" in code or "extern_kernels.bmm(" in code:
        return "aten mm"
    consts = dict(re.findall(r"(\w+) : tl\.constexpr = (\w+)", code))
    launch = re.findall(r"num_stages=(\d+), num_warps=(\d+)", code)
    sizes = ",".join(f"{k}={v}" for k, v in sorted(consts.items()) if k.isupper())
    return f"template {sizes} stages,warps={launch[:1]}"


def kernel_names(names: Iterable[str]) -> str:
    """The distinct CUDA kernels a call ran, sorted, each cut to KERNEL_NAME_CHARS."""
    return " | ".join(sorted({n[:KERNEL_NAME_CHARS] for n in names}))
