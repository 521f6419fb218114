"""How long after heavy GPU work a power-limited kernel reads as it does on a rested GPU.

Issue #18's conv bar (docs/results/h200-autotune/): a region is granted the moment the siblings
are frozen, so its first kernels start at the power state of the siblings' work. The bench
suite's cuDNN conv read +0.2 to +0.7 % there against exclusive; `krex run --settle 3` took that
away, a 0.4 s settle did not. This sweep, in one process and natively (no krex), finds the
settle between: heat the GPU as busy siblings do (fp32 8192^2 matmuls back to back) for
`--heat` seconds, idle S seconds, then time the conv (triton's do_bench median, cudnn.benchmark
on) with NVML's power, temperature, SM clock and power-capped time over the timing; each S of
`--settles`, shuffled, `--rounds` times, against the rested GPU (before any heat, and after
`--rest` seconds idle at the end). One JSON line per timing, written as it is taken, then the
summary: per settle, the median reading against the rested ones. With `--trace S`, the first S
of that rest after one more heat are sampled every 0.1 s (temperatures, SM clock, power): what a
settle that waits on the GPU, not on a clock, could watch.

    python3 scripts/bench/settle_sweep.py --out OUT.jsonl [--heat 4] [--settles 0,0.5,1,2,3]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def summary(points: list[dict[str, Any]]) -> dict[str, Any]:
    """Per settle (seconds, as a string key), the median reading and its excess over the
    rested readings' median (per cent); `rested` is the rested readings' median (ms)."""
    rested = [p["ms"] for p in points if p["settle_s"] is None]
    if not rested:
        raise ValueError("no rested timing to compare with")
    base = statistics.median(rested)
    by: dict[float, list[float]] = {}
    for p in points:
        if p["settle_s"] is not None:
            by.setdefault(float(p["settle_s"]), []).append(p["ms"])
    return {
        "rested_ms": base,
        "rested_spread_pct": round((max(rested) - min(rested)) / base * 100, 3),
        "settles": {
            f"{s:g}": {
                "n": len(ms),
                "median_ms": statistics.median(ms),
                "excess_pct": round((statistics.median(ms) / base - 1) * 100, 3),
                "range_pct": [
                    round((min(ms) / base - 1) * 100, 3),
                    round((max(ms) / base - 1) * 100, 3),
                ],
            }
            for s, ms in sorted(by.items())
        },
    }


def emit(out: Path, line: dict[str, Any]) -> None:
    """One JSON line of `out`, written as it is taken (a run cut short keeps what it took)."""
    with out.open("a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")


def report(out: Path, result: dict[str, Any]) -> int:
    """The summary: `out`'s last line, and on stdout; the exit status."""
    emit(out, {"summary": result})
    print(json.dumps(result, indent=1))
    return 0


def suite_conv() -> tuple[Callable[[], Any], Any]:
    """The bench suite's conv candidate (krex/bench/tasks/conv.py), as autotune_check times
    it, on GPU 0, cuDNN's benchmark mode on and its search done; and the seeded generator."""
    import torch
    import torch.nn.functional as F

    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(256, 128, 64, 64, device="cuda", generator=gen)
    w = torch.randn(128, 128, 3, 3, device="cuda", generator=gen) / (3 * 128**0.5)
    bias = 0.1 * torch.randn(128, device="cuda", generator=gen)
    torch.backends.cudnn.benchmark = True

    def conv() -> Any:
        return F.relu(F.conv2d(x, w, bias, padding=1))

    conv()
    return conv, gen


def idle_trace(nvml: Any, seconds: float, every: float = 0.1) -> list[dict[str, Any]]:
    """NVML samples of GPU 0 every `every` s for `seconds` of idle: t (s), temperatures, SM
    clock, and the mean power (W) since the sample before, from the energy counter."""
    samples: list[dict[str, Any]] = []
    t0 = time.monotonic()
    last: tuple[float, int] | None = None
    while (now := time.monotonic()) - t0 <= seconds:
        s = nvml.sample(0) or {}
        row: dict[str, Any] = {"t": round(now - t0, 3)}
        row.update({k: s.get(k) for k in ("temp_c", "mem_temp_c", "sm_clock_mhz")})
        if "energy_mj" in s:
            if last is not None and now > last[0]:
                row["power_w"] = round((s["energy_mj"] - last[1]) / 1000 / (now - last[0]), 1)
            last = (now, s["energy_mj"])
        samples.append(row)
        time.sleep(max(0.0, every - (time.monotonic() - now)))
    return samples


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON lines: each timing, then the summary")
    ap.add_argument("--heat", type=float, default=4.0, help="seconds of matmuls before a timing")
    ap.add_argument("--first-heat", type=float, default=10.0, help="seconds before the first")
    ap.add_argument("--settles", default="0,0.25,0.5,1,2,3", help="idle seconds, comma-separated")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--rest", type=float, default=8.0, help="idle seconds before the last rested")
    ap.add_argument("--trace", type=float, default=0.0, help="seconds of that rest sampled")
    args = ap.parse_args()
    try:
        settles = [float(s) for s in args.settles.split(",") if s.strip()]
    except ValueError:
        print(f"settle_sweep: --settles {args.settles!r}: not numbers", file=sys.stderr)
        return 2
    if not settles or min(settles) < 0 or args.heat <= 0 or args.rounds < 1:
        print("settle_sweep: need settles >= 0, --heat > 0 and --rounds >= 1", file=sys.stderr)
        return 2
    if not 0 <= args.trace <= args.rest:
        print("settle_sweep: need 0 <= --trace <= --rest", file=sys.stderr)
        return 2

    import torch
    import triton.testing

    from krex.core.nvml import Nvml

    nvml = Nvml.open()
    conv, gen = suite_conv()  # cuDNN's search, on the rested GPU
    a = torch.randn(8192, 8192, device="cuda", generator=gen)
    c = torch.empty_like(a)
    torch.cuda.synchronize()

    def heat(seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for _ in range(4):
                torch.mm(a, a, out=c)
            torch.cuda.synchronize()

    out = Path(args.out)
    points: list[dict[str, Any]] = []

    def timing(settle_s: float | None, label: str) -> None:
        before = nvml.sample(0) if nvml else None
        t0 = time.monotonic()
        ms = float(triton.testing.do_bench(conv, return_mode="median"))
        span = time.monotonic() - t0
        after = nvml.sample(0) if nvml else None
        point: dict[str, Any] = {"label": label, "settle_s": settle_s, "ms": ms, "span_s": span}
        if before and after:
            point["start"] = {k: before.get(k) for k in ("temp_c", "mem_temp_c", "sm_clock_mhz")}
            point["end_sm_clock_mhz"] = after.get("sm_clock_mhz")
            point["throttle_reasons"] = hex(before["throttle_reasons"] | after["throttle_reasons"])
            if "energy_mj" in before and "energy_mj" in after:
                point["power_w"] = round((after["energy_mj"] - before["energy_mj"]) / 1000 / span)
            if "power_capped_ns" in before and "power_capped_ns" in after:
                capped = after["power_capped_ns"] - before["power_capped_ns"]
                point["power_capped_ms"] = round(capped / 1e6, 1)
        points.append(point)
        emit(out, point)
        print(json.dumps(point), flush=True)

    timing(None, "rested (before any heat)")
    rng = random.Random(0)
    order = [s for _ in range(args.rounds) for s in rng.sample(settles, len(settles))]
    heat(args.first_heat)
    for settle in order:
        heat(args.heat)
        time.sleep(settle)
        timing(settle, f"{args.heat:g} s of matmuls, then {settle:g} s idle")
    if args.trace > 0 and nvml:
        heat(args.heat)
        emit(out, {"trace": idle_trace(nvml, args.trace)})
        time.sleep(max(0.0, args.rest - args.trace))
    else:
        time.sleep(args.rest)
    timing(None, f"rested ({args.rest:g} s idle after the sweep)")
    return report(out, summary(points))


if __name__ == "__main__":
    sys.exit(main())
