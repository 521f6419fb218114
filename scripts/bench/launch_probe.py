"""How long launching a kernel takes the CPU, per set of cores, natively and in a krex region.

KernelBench's cuda_event timer records its start event after a ~70 us L2 flush and then
launches the kernel: a launch that takes the CPU longer than the flush is timed. On the H200
(docs/results/h200-autotune/, run 9) `torch.matmul`'s launch took 62-89 us (median) in krex
regions against 23-37 us in most native runs. This probe separates where the process runs from
krex: it times the launch (sync, then the CPU time of one `torch.matmul` of fp32 4096^2)
- natively, pinned in turn to each quarter of the cores and to all of them (sched_setaffinity
  in-process: no krex at all);
- under `krex run` (a private daemon, 1 GPU, default or --slice CPU slice), inside a region,
  alone and beside 7 siblings under krex that hold memory and work in bursts.
Beside each launch it times a fixed piece of CPU-only work (`ref`), and over each set it reads
the hypervisor's steal time on those cores (/proc/stat), the thread's wait on the run queue
(schedstat) and its involuntary context switches: whether a slow launch is a slow CPU (the
reference slows with it), a CPU taken away (steal, run-queue wait) or the driver's path alone.

    python3 scripts/bench/launch_probe.py --json OUT.json [--slice 12-15/0-11]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from krex.bench.runner import not_ready, slice_config
from krex.client.run import private_daemon

# The siblings are autotune_check's ("bursty": 8192^2 matmuls in bursts of 0.05-0.5 s).
SIBLING = Path(__file__).resolve().parent / "sibling_matmul.py"

KREX = [sys.executable, "-m", "krex.cli"]
TRIALS = 200


def core_sets(cpus: list[int], parts: int = 4) -> list[list[int]]:
    """All the CPUs, then `parts` contiguous groups of them (fewer when there are fewer CPUs)."""
    cpus = sorted(cpus)
    n = min(parts, len(cpus))
    size, extra = divmod(len(cpus), n)
    out, start = [cpus], 0
    for i in range(n):
        end = start + size + (1 if i < extra else 0)
        out.append(cpus[start:end])
        start = end
    return out


def summary(us: list[float]) -> dict[str, float]:
    """Median, 10th and 90th percentiles of launch times (us)."""
    q = statistics.quantiles(us, n=10)
    return {"median_us": round(statistics.median(us), 1), "p10_us": round(q[0], 1),
            "p90_us": round(q[-1], 1)}  # fmt: skip


def steal_ms(cpus: list[int], stat: str | None = None) -> float:
    """The hypervisor's steal time (ms) on `cpus` since boot, from /proc/stat (or `stat`)."""
    if stat is None:
        stat = Path("/proc/stat").read_text()
    want = {f"cpu{c}" for c in cpus}
    ticks = sum(int(f[8]) for f in (line.split() for line in stat.splitlines())
                if f and f[0] in want and len(f) > 8)  # fmt: skip
    return ticks * 1000 / os.sysconf("SC_CLK_TCK")


def counters(cpus: list[int]) -> dict[str, float]:
    """This thread's run-queue wait and involuntary switches, and the steal on `cpus`, now."""
    try:  # run_delay: the second field of schedstat, in ns
        wait_ns = int(Path("/proc/thread-self/schedstat").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        wait_ns = 0
    ru = resource.getrusage(resource.RUSAGE_THREAD)
    return {"steal_ms": steal_ms(cpus), "runq_wait_ms": wait_ns / 1e6,
            "involuntary_switches": float(ru.ru_nivcsw)}  # fmt: skip


def reference() -> None:
    """A fixed piece of CPU-only work, about as long as a fast launch."""
    x = 0
    for i in range(600):
        x ^= i * 7
    if x < 0:  # never: keeps the loop's result used
        print(x)


def launches(trials: int = TRIALS) -> tuple[list[float], list[float]]:
    """The CPU time (us) of launching `torch.matmul` on fp32 4096^2 after a sync, per trial,
    and of `reference()` right after each launch."""
    import torch

    a = torch.randn(4096, 4096, device="cuda")
    b = torch.randn(4096, 4096, device="cuda")
    for _ in range(3):
        torch.matmul(a, b)
    out, ref = [], []
    for _ in range(trials):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        torch.matmul(a, b)
        t1 = time.perf_counter()
        out.append((t1 - t0) * 1e6)
        reference()
        ref.append((time.perf_counter() - t1) * 1e6)
    torch.cuda.synchronize()
    return out, ref


def measured(cpus: list[int]) -> dict[str, Any]:
    """Launches on `cpus` (where this thread runs now): their summary, the reference's, how
    the two move together per trial, and the CPU counters' change over the set."""
    before = counters(cpus)
    us, ref = launches()
    after = counters(cpus)
    return {**summary(us), "ref": summary(ref),
            "launch_ref_corr": round(statistics.correlation(us, ref), 2),
            **{k: round(after[k] - before[k], 3) for k in before}}  # fmt: skip


def inner() -> None:
    """Under `krex run`: the launches outside a region, then inside one (where krex pins)."""
    import krex

    outside = sorted(os.sched_getaffinity(0))
    res: dict[str, Any] = {"outside": measured(outside), "cpus_outside": outside}
    with krex.region():
        res["cpus_inside"] = sorted(os.sched_getaffinity(0))
        res["inside"] = measured(res["cpus_inside"])
    print(json.dumps(res), flush=True)


def under_krex(sock: Path, siblings: int) -> dict[str, Any]:
    pre = [*KREX, "run", "--socket", str(sock), "--no-pool", "--"]
    sibs = [subprocess.Popen([*pre, sys.executable, str(SIBLING), "bursty"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            for _ in range(siblings)]  # fmt: skip
    try:
        if late := not_ready(sibs):
            raise RuntimeError(f"{len(late)} of {siblings} siblings did not start")
        p = subprocess.run([*pre, sys.executable, __file__, "--inner"], capture_output=True,
                           text=True, timeout=300)  # fmt: skip
        if p.returncode != 0:
            return {"rc": p.returncode, "stderr": p.stderr[-2000:]}
        return dict(json.loads(p.stdout.strip().splitlines()[-1]))
    finally:
        for s in sibs:
            s.kill()
            s.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="where the results go (JSON)")
    ap.add_argument("--slice", metavar="REGION/SHARED", help="the daemon's CPU slice for GPU 0")
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inner:
        inner()
        return 0
    if not args.json:
        ap.error("--json is required")
    doc: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "command": "python3 scripts/bench/launch_probe.py " + " ".join(sys.argv[1:]),
    }
    out = Path(args.json)
    if args.slice:
        try:
            config = slice_config(args.slice, out.with_suffix(".config.toml"))
        except ValueError as e:
            ap.error(f"--slice: {e}")
        os.environ["KREX_CONFIG"] = str(config)
    mine = sorted(os.sched_getaffinity(0))
    doc["native"] = []
    for _ in range(2):  # twice round, so that a set's reading is not one moment's
        for cores in core_sets(mine):
            os.sched_setaffinity(0, cores)
            doc["native"].append({"cpus": cores, **measured(cores)})
            print("native", json.dumps(doc["native"][-1]), flush=True)
    os.sched_setaffinity(0, mine)
    doc["steal_ms_total"] = steal_ms(mine)  # since boot, on every core this probe may use
    with tempfile.TemporaryDirectory(prefix="krex-launch-") as d:
        tmp = Path(d)
        with private_daemon(tmp / "d", sim=False, slots=8, pool=0, gpus=1) as sock:
            for name, n in (("krex_alone", 0), ("krex_7_siblings", 7), ("krex_alone_again", 0)):
                doc[name] = under_krex(sock, n)
                print(name, json.dumps(doc[name]), flush=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
