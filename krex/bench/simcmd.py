"""A benchmarking command of the simulated suite, shaped like the ones agents write.

    python -m krex.bench.simcmd TASK VARIANT KERNEL_NS COMPILE_S

It "compiles" its candidate (COMPILE_S seconds of CPU work, as a fresh Triton/Inductor compile
burns CPU), checks it (a few launches outside any region), then times it the way
triton.testing.do_bench does (warm-up, then as many runs as fit a 100 ms budget, at least 5,
each after a cache-flush kernel, median) inside krex.region(), and prints one JSON line.
Outside krex the region is a no-op.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import sys
import time

from krex.sim.simgpu import SimGPU
from krex.tenant.markers import region

FLUSH_NS = 100_000  # do_bench clears a 256 MB buffer before each run: about this long on an H200


def main(argv: list[str]) -> int:
    task, variant, kernel_ns, compile_s = argv[0], argv[1], int(argv[2]), float(argv[3])
    stop = time.monotonic() + compile_s
    h = hashlib.sha256(task.encode())
    while time.monotonic() < stop:
        h.update(h.digest())
    gpu = SimGPU()
    for _ in range(3):  # the correctness check
        gpu.launch(kernel_ns)
    gpu.sync()
    reps = max(5, min(100, int(100e6 // max(kernel_ns, 1))))
    with region():
        gpu.launch(kernel_ns)  # warm-up, inside the region as do_bench's is
        gpu.sync()
        ms = gpu.measure(kernel_ns, reps, flush_ns=FLUSH_NS)
    print(
        json.dumps(
            {"task": task, "variant": variant, "median_ms": statistics.median(ms), "reps": reps}
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
