"""One KernelBench problem as an agent's benchmarking command, for scripts/bench/kb_memory.py.

    python3 kb_candidate.py PROBLEM_FILE eager|compile

PROBLEM_FILE is a KernelBench problem (it defines `Model`, `get_inputs()` and
`get_init_inputs()`), run at its published sizes: `Model(*get_init_inputs())` and
`get_inputs()` are called with CUDA as the default device (KernelBench's harness makes them on
the host and copies them: at these sizes that takes seconds per command and, 8 to 16 commands
at once, up to ~200 GiB of host memory), seed 42, under `torch.no_grad()` as KernelBench
evaluates. `eager` checks that the output is finite; `compile` runs the eager model for a
reference, then `torch.compile(model)` (default mode; its compile caches are wherever
TRITON_CACHE_DIR and TORCHINDUCTOR_CACHE_DIR say) and compares with KernelBench's tolerance
(atol = rtol = 1e-2), in slices so that the check adds little memory. Then the timed part,
`triton.testing.do_bench(lambda: model(*inputs), return_mode="median")`, with no krex code:
under `krex run --auto-regions` do_bench is a region as it is.

Prints one JSON line: problem, variant, median_ms, peak_bytes (torch.cuda.max_memory_allocated),
reserved_bytes (max_memory_reserved), total_bytes (the GPU's memory), the check's result and
when each phase ended (seconds from the start). Exit 0; 4 for a wrong or non-finite result; 1
for any exception, its traceback and a last line `error: TYPE: MESSAGE` on stderr (an
out-of-memory error says "out of memory" there); 2 for bad arguments.

The process ends with os._exit once its line is flushed: a torch.compile command otherwise
spends 7-9 s after its last line in Inductor's exit handlers and the interpreter's finalisation
(docs/results/h200-pool/probe/), which is not what is measured, and krex's warm pool already
spares its commands that. Before it, a region krex's auto-regions still hold for the
command (they linger a few ms after do_bench returns) is ended as the interpreter's exit would
end it (krex.tenant.markers.flush, registered with atexit; nothing natively, where krex is not
loaded).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

T0 = time.monotonic()
ATOL = RTOL = 1e-2  # KernelBench's for fp32
SEED = 42
SLICE = 1 << 24  # elements per slice of the checks (64 MiB of fp32)
DEVICE = "cuda"


def since() -> float:
    return round(time.monotonic() - T0, 3)


def load(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location("kb_problem", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["kb_problem"] = module
    spec.loader.exec_module(module)
    return module


def tensors(out: Any) -> list[Any]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def slices(t: Any, limit: int = SLICE) -> Iterator[Any]:
    """Views of t, each of at most `limit` elements (a row at a time, or smaller), in order."""
    if t.dim() == 0 or t.numel() <= limit:
        yield t
        return
    rows = t.shape[0]
    per_row = t.numel() // rows
    if per_row > limit:
        for i in range(rows):
            yield from slices(t[i], limit)
        return
    step = limit // per_row
    for i in range(0, rows, step):
        yield t[i : i + step]


def finite(out: Any) -> str | None:
    """None when every floating output is finite, else what is not."""
    import torch

    for k, t in enumerate(tensors(out)):
        floating = isinstance(t, torch.Tensor) and t.is_floating_point()
        if floating and not all(bool(torch.isfinite(s).all()) for s in slices(t)):
            return f"output {k} is not finite"
    return None


def compare(ref: Any, out: Any) -> tuple[str | None, float]:
    """(None, the largest absolute difference) when out matches ref within KernelBench's
    tolerance, else (what differs, the difference so far)."""
    import torch

    refs, outs = tensors(ref), tensors(out)
    if len(refs) != len(outs):
        return f"{len(outs)} outputs, the eager model gave {len(refs)}", 0.0
    worst = 0.0
    for k, (a, b) in enumerate(zip(refs, outs, strict=True)):
        if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
            if a != b:
                return f"output {k}: {b!r}, the eager model gave {a!r}", worst
            continue
        if a.shape != b.shape:
            return f"output {k}: shape {tuple(b.shape)}, eager {tuple(a.shape)}", worst
        for x, y in zip(slices(a), slices(b), strict=True):
            if not x.is_floating_point():
                if not torch.equal(x, y):
                    return f"output {k} differs", worst
                continue
            if x.numel():
                worst = max(worst, float((x.float() - y.float()).abs().max()))
            if not torch.allclose(x, y, atol=ATOL, rtol=RTOL):
                return f"output {k} differs beyond atol=rtol={ATOL} (max diff {worst:.3g})", worst
    return None, worst


def run(path: Path, variant: str) -> tuple[int, dict[str, Any]]:
    import torch
    import triton.testing

    row: dict[str, Any] = {"problem": path.name, "variant": variant, "t_import_s": since()}
    problem = load(path)
    torch.manual_seed(SEED)
    with torch.no_grad():
        with torch.device(DEVICE):
            model = problem.Model(*problem.get_init_inputs())
            inputs = problem.get_inputs()
        model = model.to(DEVICE)
        inputs = [x.to(DEVICE) if isinstance(x, torch.Tensor) else x for x in inputs]
        torch.cuda.synchronize()
        row["t_ready_s"] = since()
        fn = model
        if variant == "compile":
            ref = model(*inputs)
            fn = torch.compile(model)
            out = fn(*inputs)
            torch.cuda.synchronize()
            row["t_compiled_s"] = since()
            why, row["max_abs_diff"] = compare(ref, out)
            del ref
        else:
            out = fn(*inputs)
            why = finite(out)
        del out
        if why is not None:
            row["error"] = why
            return 4, row
        row["median_ms"] = triton.testing.do_bench(lambda: fn(*inputs), return_mode="median")
        torch.cuda.synchronize()
    row["t_timed_s"] = since()
    row["peak_bytes"] = torch.cuda.max_memory_allocated()
    row["reserved_bytes"] = torch.cuda.max_memory_reserved()
    row["total_bytes"] = torch.cuda.get_device_properties(0).total_memory
    return 0, row


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[2] not in ("eager", "compile"):
        print("usage: kb_candidate.py PROBLEM_FILE eager|compile", file=sys.stderr)
        return 2
    try:
        code, row = run(Path(argv[1]), argv[2])
    except Exception as e:
        traceback.print_exc()
        first = (str(e).strip().splitlines() or [""])[0]
        print(f"error: {type(e).__name__}: {first}", file=sys.stderr)
        return 1
    print(json.dumps(row), flush=True)
    if code:
        print(f"error: {row['error']}", file=sys.stderr)
    return code


def leave(code: int) -> None:
    """End the process now (see the module's text)."""
    markers = sys.modules.get("krex.tenant.markers")
    if markers is not None:
        markers.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    leave(main(sys.argv))
