"""What the shim adds to one intercepted call, measured against a driver that does nothing.

Builds a null libcuda.so.1 (cuLaunchKernel returns at once) and a loop of 10 million direct
calls, then runs the loop alternately without and with libkrex.so preloaded (a tenant of a
fresh segment, gate open: the path every call outside a region takes). Prints the medians.

    python scripts/bench/shim_overhead.py [--runs 9] [--calls 10000000] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from krex.core.paths import shim_library
from krex.core.shm import Segment

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def build(out: Path) -> Path:
    cc = os.environ.get("CC", "cc")
    flags = ["-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror", f"-I{ROOT / 'shim'}"]
    subprocess.run(
        [
            cc,
            *flags,
            "-fPIC",
            "-shared",
            "-Wl,-soname,libcuda.so.1",
            "-o",
            str(out / "libcuda.so.1"),
            str(HERE / "nulldriver.c"),
        ],
        check=True,
    )
    subprocess.run(
        [
            cc,
            *flags,
            "-o",
            str(out / "callloop"),
            str(HERE / "callloop.c"),
            f"-L{out}",
            "-l:libcuda.so.1",
        ],
        check=True,
    )
    return out / "callloop"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--calls", type=int, default=10_000_000)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        loop = build(Path(tmp))
        seg = Segment.create(f"/krex-bench-{os.getpid()}", n_gpus=1, n_slots=8)
        try:
            plain = dict(os.environ, LD_LIBRARY_PATH=tmp)
            shimmed = dict(
                plain,
                LD_PRELOAD=str(shim_library()),
                KREX_SHM=seg.name,
                KREX_TENANT="1",
                KREX_GPU="0",
            )
            runs: dict[str, list[float]] = {"without": [], "with": []}
            for _ in range(args.runs):
                for label, env in (("without", plain), ("with", shimmed)):
                    out = subprocess.run(
                        [str(loop), str(args.calls)],
                        env=env,
                        check=True,
                        capture_output=True,
                        text=True,
                    ).stdout
                    runs[label].append(float(out))
        finally:
            seg.close()
            seg.unlink()
    med = {k: statistics.median(v) for k, v in runs.items()}
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "machine": f"{platform.node()} ({platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores)",
        "command": "python scripts/bench/shim_overhead.py " + " ".join(sys.argv[1:]),
        "calls_per_run": args.calls,
        "ns_per_call_median": med,
        "ns_added_per_call": med["with"] - med["without"],
        "runs": runs,
    }
    print(f"ns per call, median of {args.runs} runs of {args.calls:,} calls:")
    print(
        f"  without the shim {med['without']:8.2f}   (runs {min(runs['without']):.2f} to "
        f"{max(runs['without']):.2f})"
    )
    print(
        f"  with the shim    {med['with']:8.2f}   (runs {min(runs['with']):.2f} to "
        f"{max(runs['with']):.2f})"
    )
    print(f"  added by the shim: {result['ns_added_per_call']:.2f} ns per intercepted call")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
