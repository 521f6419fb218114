"""One agent-style candidate with a realistic working set, for scripts/bench/memory_check.py.

python memory_candidate.py SIZE_GIB eager|compile: allocates about SIZE_GIB of device memory
(an fp16 input and its output), checks the candidate (x * 1.5 + 0.5, ReLU) against a float32
reference on a slice, and times it with triton's do_bench inside `krex.region()` (a no-op
outside krex). Prints one JSON line; exit 3 on CUDA out-of-memory.
"""

from __future__ import annotations

import json
import sys
import time

t0 = time.monotonic()
import torch  # noqa: E402
import triton.testing  # noqa: E402

import krex  # noqa: E402


def candidate(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x * 1.5 + 0.5)


def main() -> int:
    size_gib, mode = float(sys.argv[1]), sys.argv[2]
    n = int(size_gib * (1 << 30) / 2 / 2)  # fp16: half the set is the input, half the output
    try:
        x = torch.randn(n, device="cuda", dtype=torch.float16)
        fn = torch.compile(candidate) if mode == "compile" else candidate
        out = fn(x)
        k = min(n, 1 << 20)
        ref = torch.relu(x[:k].float() * 1.5 + 0.5)
        ok = bool(torch.allclose(out[:k].float(), ref, rtol=1e-2, atol=1e-2))
        del out
        with krex.region():
            ms = triton.testing.do_bench(lambda: fn(x), return_mode="median")
        torch.cuda.synchronize()
    except torch.OutOfMemoryError as e:
        print(json.dumps({"oom": True, "error": str(e).splitlines()[0][:200]}), flush=True)
        return 3
    peak = torch.cuda.max_memory_allocated() / (1 << 30)
    print(
        json.dumps({"ok": ok, "median_ms": ms, "peak_gib": peak, "wall_s": time.monotonic() - t0}),
        flush=True,
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
