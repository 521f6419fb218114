"""Device memory held and churned with no GPU work, beside a native run, until stopped (SIGTERM).

Under krex 8 at once, KernelBench's timings move region by region on the GPU's side
(docs/results/h100-wave3/2026-12-06-h/): KernelBench makes fresh inputs for every timing, and
beside siblings that allocate and free their own memory those inputs land somewhere new each
time. This makes that one part alone: PROCS processes (each a CUDA context, as krex's siblings
are) each hold a random amount of device memory, up to GIB, in blocks of random sizes; every
PERIOD seconds each frees some blocks, makes others and gives what it freed back to the driver
(`torch.cuda.empty_cache`), so the free memory's layout keeps changing. No kernel runs
(`torch.empty` allocates without one). A native mode beside it (`scripts/bench/kb_memory.py`'s
`exclusive-churn`) then shows whether placement alone moves the timings.

It prints "ready" once every process holds its first blocks (or knows it cannot); on exit it
writes `--out` (JSON): whether CUDA was there, the processes, their rounds and the GiB each
held (p50, max over rounds and processes). Without torch or a GPU it writes that and exits 0:
the run beside it is then only native, and the record says so.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

BLOCK_MIB = (64, 1024)  # a block's size, MiB: from a small tensor to a large input


def step(
    blocks: list[Any],
    sizes: list[int],
    target: int,
    make: Callable[[int], Any],
    rng: random.Random,
) -> None:
    """One round: free blocks (a random one at a time) until under `target` bytes, then make
    blocks of random sizes until at it; `sizes` keeps each block's bytes."""
    while blocks and sum(sizes) > target:
        i = rng.randrange(len(blocks))
        blocks.pop(i)
        sizes.pop(i)
    while sum(sizes) < target:
        n = min(target - sum(sizes), rng.randint(*BLOCK_MIB) << 20)
        blocks.append(make(n))
        sizes.append(n)


def child(out: Path, gib: float, period: float, seed: int) -> int:
    """One churning process: its record at `out` when stopped."""
    stop = False

    def ask_stop(_sig: int, _frame: FrameType | None) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, ask_stop)
    parent = os.getppid()  # gone (killed without a stop): this one ends too
    record: dict[str, Any] = {"cuda": False, "rounds": 0, "held_gib": []}
    try:
        import torch

        cuda = bool(torch.cuda.is_available())
    except ImportError:
        cuda = False
    if not cuda:
        print("ready", flush=True)
        out.write_text(json.dumps(record))
        return 0
    record["cuda"] = True
    rng = random.Random(seed)
    blocks: list[Any] = []
    sizes: list[int] = []

    def make(n: int) -> Any:
        return torch.empty(n, dtype=torch.uint8, device="cuda")

    limit = int(gib * (1 << 30))
    step(blocks, sizes, rng.randint(limit // 2, limit), make, rng)
    print("ready", flush=True)
    while not stop and os.getppid() == parent:
        time.sleep(period)
        step(blocks, sizes, rng.randint(limit // 4, limit), make, rng)
        torch.cuda.empty_cache()  # what was freed goes back to the driver: the layout changes
        record["rounds"] += 1
        record["held_gib"].append(round(sum(sizes) / (1 << 30), 2))
    out.write_text(json.dumps(record))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="the JSON written on exit")
    ap.add_argument("--procs", type=int, default=7, help="processes (CUDA contexts)")
    ap.add_argument("--gib", type=float, default=1.5, help="the most each holds")
    ap.add_argument("--period", type=float, default=0.2, help="seconds between rounds")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.procs < 1 or args.gib <= 0 or args.period <= 0:
        ap.error("--procs must be at least 1, --gib and --period above 0")
    if args.child is not None:
        return child(args.out, args.gib, args.period, args.child)
    stopped: list[bool] = []  # first: a stop while the children start still stops them
    signal.signal(signal.SIGTERM, lambda _s, _f: stopped.append(True))
    parts = [args.out.with_name(f"{args.out.stem}-{i}.json") for i in range(args.procs)]
    me = [sys.executable, os.path.abspath(__file__), "--gib", str(args.gib)]
    me += ["--period", str(args.period)]
    procs = [
        subprocess.Popen(
            [*me, "--out", str(p), "--child", str(i)],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        for i, p in enumerate(parts)
    ]
    for p in procs:  # each says ready (or ends): the run beside starts after all of them
        assert p.stdout is not None
        p.stdout.readline()
    print("ready", flush=True)
    while not stopped and all(p.poll() is None for p in procs):
        time.sleep(0.1)
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    records = []
    for path in parts:
        try:
            records.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            records.append({"cuda": False, "error": "no record"})
    held = sorted(g for r in records for g in r.get("held_gib", []))
    out = {
        "cuda": any(r.get("cuda") for r in records),
        "procs": args.procs,
        "gib": args.gib,
        "period_s": args.period,
        "rounds": sum(r.get("rounds", 0) for r in records),
        "held_gib_p50": held[len(held) // 2] if held else None,
        "held_gib_max": held[-1] if held else None,
        "errors": [r["error"] for r in records if "error" in r],
    }
    args.out.write_text(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
