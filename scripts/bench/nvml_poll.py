"""The NVML reads krex's daemon makes, every PERIOD seconds, until stopped (SIGTERM or SIGINT).

A native run beside it (`scripts/bench/kb_memory.py`'s mode `exclusive-nvml`) shows whether
those reads alone move a timing: the daemon makes them once a second (its tick: the GPU's
clocks, power and temperature counters, and each process's device memory) and at every grant
(the clock sample, the memory split and the audit's process lists), while the region's owner
times. Each round here makes all of them: `Nvml.sample`, `process_memory`, `processes` and
`work_samples`, as krex/daemon/machinery.py does.

It prints "ready" once it can be stopped with a record left; on exit it writes `--out`
(JSON): whether NVML opened, how many rounds ran and their seconds (p50, max). Without NVML (no
GPU, no pynvml) it writes that and exits 0 at once: the run beside it is then only native, and
the record says so.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path
from types import FrameType

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from krex.core.nvml import Nvml


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="the JSON written on exit")
    ap.add_argument("--period", type=float, default=0.1, help="seconds between rounds")
    ap.add_argument("--gpu", type=int, default=0, help="the NVML index read")
    args = ap.parse_args(argv)
    if args.period <= 0:
        ap.error(f"--period must be above 0, not {args.period}")
    stop = False

    def ask_stop(_sig: int, _frame: FrameType | None) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, ask_stop)
    signal.signal(signal.SIGINT, ask_stop)
    nvml = Nvml.open()
    print("ready", flush=True)  # to whoever started it: stopping it now leaves a record
    rounds: list[float] = []
    while nvml is not None and not stop:
        t0 = time.monotonic()
        nvml.sample(args.gpu)
        nvml.process_memory(args.gpu)
        nvml.processes(args.gpu)
        nvml.work_samples(args.gpu, time.time() - 1.0)
        rounds.append(time.monotonic() - t0)
        time.sleep(max(0.0, args.period - rounds[-1]))
    rounds.sort()
    out = {
        "nvml": nvml is not None,
        "period_s": args.period,
        "rounds": len(rounds),
        "round_ms_p50": round(1e3 * rounds[len(rounds) // 2], 3) if rounds else None,
        "round_ms_max": round(1e3 * rounds[-1], 3) if rounds else None,
    }
    args.out.write_text(json.dumps(out) + "\n")
    if nvml is not None:
        nvml.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
