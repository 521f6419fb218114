"""Several GPUs per node, on a real machine of two GPUs (docs/results/h200x2/).

Part `native`, without krex: the suite's commands one at a time on each GPU (both GPUs at
once), twice: `exclusive` (the baseline) and `native_repeat` (its noise).
Part `krex`, one private daemon over both GPUs (8 slots and 8 warm workers each):
  1. `alone`: the suite on GPU 1, 8 commands at once, GPU 0 idle;
  2. `both`: the suite on GPU 0 and on GPU 1 at the same time, 8 at once on each;
  3. `alone_again`: as 1 (so that the order of the runs shows);
  4. `mixed`: as 2, with `krex run --gpus 2` commands started one after another all the while
     (each holds one region over both GPUs while the one-GPU commands hold theirs on either):
     every one must finish within its time-out (no deadlock), its regions clean;
  then, on real GPUs, one such command alone.
Then, per GPU, the bench's fidelity metrics (krex/bench/metrics.py) of `both` against that GPU's
own exclusive runs, and GPU 1's throughput alone against next to GPU 0's commands and regions.

    python3 scripts/bench/multi_gpu.py native --out DIR [--tasks a,b]
    python3 scripts/bench/multi_gpu.py krex --out DIR --native DIR/native.json [--tasks a,b]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rich.progress import Progress

from krex.bench import runner
from krex.bench.metrics import Measurement, ModeRun, RegionTimes, summarize
from krex.bench.suite import Command, commands
from krex.client.run import private_daemon, status

GPUS = (0, 1)
CONCURRENCY = 8


def _outcome_doc(o: runner.Outcome) -> dict[str, Any]:
    return {
        "task": o.cmd.task,
        "variant": o.cmd.variant,
        "median_ms": o.median_ms,
        "wall_s": o.wall_s,
        "pool": o.pool,
        "output": o.output,
        "region_sm_clock_mhz": o.region_clocks,
        "regions": [r.__dict__ for r in o.regions],
    }


def _run_doc(wall: float, outcomes: list[runner.Outcome]) -> dict[str, Any]:
    """One batch of commands on one GPU, as krex.json and native.json keep it."""
    return {"wall_s": wall, "outcomes": [_outcome_doc(o) for o in outcomes]}


def _mode_run(mode: str, doc: dict[str, Any]) -> ModeRun:
    return ModeRun(
        mode=mode,
        wall_s=doc["wall_s"],
        measurements=tuple(
            Measurement(
                task=o["task"],
                variant=o["variant"],
                median_ms=o["median_ms"],
                wall_s=o["wall_s"],
                region_s=sum(r["duration_s"] for r in o["regions"]),
                regions=tuple(RegionTimes(**r) for r in o["regions"]),
            )
            for o in doc["outcomes"]
        ),
    )


def _native_env(gpu: int, sim_shm: str | None) -> dict[str, str]:
    env = runner._plain_env(sim_shm)
    env.update(CUDA_DEVICE_ORDER="PCI_BUS_ID", CUDA_VISIBLE_DEVICES=str(gpu))
    if sim_shm is not None:
        env["KREX_SIM_GPUS"] = str(len(GPUS))
    return env


def _on_each(jobs: dict[int, Any]) -> dict[int, Any]:
    """Run one callable per GPU at the same time; their results by GPU."""
    with ThreadPoolExecutor(len(jobs)) as ex:
        futures = {g: ex.submit(f) for g, f in jobs.items()}
        return {g: f.result() for g, f in futures.items()}


def native(cmds: list[Command], out: Path, sim_shm: str | None) -> None:
    doc: dict[str, Any] = {str(g): {} for g in GPUS}
    with tempfile.TemporaryDirectory(prefix="krex-mgpu-") as tmp_name:
        tmp = Path(tmp_name)
        progress = Progress(disable=True)
        for mode in ("exclusive", "native_repeat"):
            t0 = time.monotonic()

            def job(g: int, mode: str = mode) -> tuple[float, list[runner.Outcome]]:
                return runner._batch(
                    cmds, 1, _native_env(g, sim_shm), None, False, tmp, progress, f"{mode}-g{g}"
                )

            done = _on_each({g: (lambda g=g: job(g)) for g in GPUS})
            for g, (wall, outcomes) in done.items():
                doc[str(g)][mode] = _run_doc(wall, outcomes)
                print(f"{mode} on GPU {g}: {len(outcomes)} commands in {wall:.1f} s", flush=True)
            print(f"{mode}: both GPUs done in {time.monotonic() - t0:.1f} s", flush=True)
    (out / "native.json").write_text(json.dumps(doc, indent=1) + "\n")


def krex_part(cmds: list[Command], out: Path, sim: bool) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="krex-mgpu-") as tmp_name:
        tmp = Path(tmp_name)
        progress = Progress(disable=True)
        t0 = time.monotonic()
        with private_daemon(
            tmp / "daemon", sim=sim, slots=CONCURRENCY, gpus=len(GPUS) if sim else None
        ) as sock:
            # private_daemon returns once the warm pools are ready, as for `krex bench`.
            gpus = status(sim, str(sock))["gpus"]
            doc["daemon"] = {
                "pool_ready_s": time.monotonic() - t0,
                "gpus": [{"gpu": g["gpu"], **g["pool"]} for g in gpus],
            }
            env = dict(os.environ)

            def job(g: int, label: str) -> tuple[float, list[runner.Outcome]]:
                return runner._batch(cmds, CONCURRENCY, env, sock, False, tmp, progress, label, g)

            wall, outcomes = job(1, "alone-g1")
            doc["alone"] = {"1": _run_doc(wall, outcomes)}
            print(f"alone: GPU 1, {len(outcomes)} commands in {wall:.1f} s", flush=True)
            done = _on_each({g: (lambda g=g: job(g, f"both-g{g}")) for g in GPUS})
            doc["both"] = {str(g): _run_doc(w, os_) for g, (w, os_) in done.items()}
            for g, (w, os_) in done.items():
                print(f"both: GPU {g}, {len(os_)} commands in {w:.1f} s", flush=True)
            # GPU 1 alone once more: the first run also warmed the workers and the caches.
            wall, outcomes = job(1, "alone-again-g1")
            doc["alone_again"] = {"1": _run_doc(wall, outcomes)}
            print(f"alone again: GPU 1, {len(outcomes)} commands in {wall:.1f} s", flush=True)
            doc["mixed"] = _mixed(lambda g: job(g, f"mixed-g{g}"), sock, tmp, sim)
            if not sim:
                doc["two_gpu_command"] = _two_gpu_command(sock, tmp, sim, "alone")
                print(f"a two-GPU command: {doc['two_gpu_command']}", flush=True)
    (out / "krex.json").write_text(json.dumps(doc, indent=1) + "\n")
    return doc


TWO_GPU = """
import json, torch, krex
assert torch.cuda.device_count() == 2, torch.cuda.device_count()
xs = [torch.randn(4096, 4096, device=f"cuda:{d}") for d in (0, 1)]
with krex.region():
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
    for d, x in enumerate(xs):
        with torch.cuda.device(d):
            ev[2 * d].record()
            for _ in range(20):
                x @ x
            ev[2 * d + 1].record()
    torch.cuda.synchronize(0); torch.cuda.synchronize(1)
print(json.dumps({"ms": [ev[0].elapsed_time(ev[1]), ev[2].elapsed_time(ev[3])]}))
"""


# The simulated GPUs' two-GPU command: one region over both, 20 ms long.
TWO_GPU_SIM = """
import json, time, krex
with krex.region():
    time.sleep(0.02)
print(json.dumps({"ms": [20.0, 20.0]}))
"""
TWO_GPU_TIMEOUT_S = 120.0  # a two-GPU command not done by then is counted as timed out
MIXED_PAUSE_S = 0.5  # between two-GPU commands in `mixed`


def _two_gpu_command(sock: Path, tmp: Path, sim: bool, tag: str) -> dict[str, Any]:
    """`krex run --gpus 2`: a command that works on both GPUs in one region. Its status
    ("timeout" past TWO_GPU_TIMEOUT_S: a deadlock, or something as bad), wall time, output and
    its report's GPUs, pool and regions."""
    report = tmp / f"two-gpu-{tag}.json"
    krex_run = [sys.executable, "-m", "krex.cli", "run", *(["--sim"] if sim else []),
                "--gpus", "2", "--socket", str(sock)]  # fmt: skip
    program = TWO_GPU_SIM if sim else TWO_GPU
    t0 = time.monotonic()
    try:
        p = subprocess.run(
            [*krex_run, "--report", str(report), "--", sys.executable, "-c", program],
            capture_output=True,
            text=True,
            timeout=TWO_GPU_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "wall_s": time.monotonic() - t0}
    wall = time.monotonic() - t0
    if p.returncode != 0 or not report.exists():
        return {"status": p.returncode, "wall_s": wall, "stderr": p.stderr[-2000:]}
    rep = json.loads(report.read_text())
    return {
        "status": 0,
        "wall_s": wall,
        "output": json.loads(p.stdout.strip().splitlines()[-1]),
        "gpus": rep["gpus"],
        "pool": rep["pool"],
        "regions": rep["regions"],
    }


def _mixed(suite: Any, sock: Path, tmp: Path, sim: bool) -> dict[str, Any]:
    """The suite on both GPUs at once (`suite(g)` per GPU) while two-GPU commands run one after
    another until it is done: both sides' outcomes, and a verdict."""
    stop = threading.Event()
    twos: list[dict[str, Any]] = []

    def two_gpu_loop() -> None:
        while not stop.is_set():
            twos.append(_two_gpu_command(sock, tmp, sim, f"mixed-{len(twos)}"))
            stop.wait(MIXED_PAUSE_S)

    loop = threading.Thread(target=two_gpu_loop, name="two-gpu", daemon=True)
    loop.start()
    try:
        done = _on_each({g: (lambda g=g: suite(g)) for g in GPUS})
    finally:
        stop.set()
        loop.join(TWO_GPU_TIMEOUT_S + 10)
    doc: dict[str, Any] = {str(g): _run_doc(w, os_) for g, (w, os_) in done.items()}
    doc["two_gpu_commands"] = twos
    doc["verdict"] = mixed_verdict(doc, len(GPUS))
    print(f"mixed: {json.dumps(doc['verdict'])}", flush=True)
    return doc


def mixed_verdict(doc: dict[str, Any], gpus: int) -> dict[str, Any]:
    """`mixed`'s two-GPU commands: how many finished, failed, timed out; their regions (each
    must hold every GPU, clean) and waits; and the one-GPU commands' regions beside them."""
    twos = doc.get("two_gpu_commands", [])
    regions = [r for t in twos for r in t.get("regions", [])]
    ones = [r for g in range(gpus) for o in doc[str(g)]["outcomes"] for r in o["regions"]]
    waits = sorted(float(r.get("wait_s", 0.0)) for r in regions)
    return {
        "two_gpu_commands": len(twos),
        "succeeded": sum(t["status"] == 0 for t in twos),
        "timed_out": sum(t["status"] == "timeout" for t in twos),
        "two_gpu_regions": len(regions),
        "two_gpu_regions_clean": sum(bool(r.get("clean")) for r in regions),
        "two_gpu_regions_on_every_gpu": sum(len(r.get("gpus", [])) == gpus for r in regions),
        "two_gpu_region_wait_s_median_max": (
            [statistics.median(waits), waits[-1]] if waits else None
        ),
        "one_gpu_regions": len(ones),
        "one_gpu_regions_clean": sum(bool(r.get("clean")) for r in ones),
    }


def _smi() -> str:
    return subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.strip()


def summary(
    cmds: list[Command],
    profile: str,
    native_doc: dict[str, Any],
    krex_doc: dict[str, Any],
    out: Path,
) -> dict[str, Any]:
    """Per GPU: the bench's results.json and report of `both` against that GPU's baseline;
    and the isolation figures."""
    simulated = any(c.simulated for c in cmds)
    machine = runner._machine(simulated)
    smi = "simulated GPUs" if simulated else _smi()
    date = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    command = "python3 scripts/bench/multi_gpu.py " + " ".join(sys.argv[1:])
    per_gpu: dict[str, Any] = {}
    for g in GPUS:
        key = str(g)
        runs = {
            "exclusive": _mode_run("exclusive", native_doc[key]["exclusive"]),
            "native_repeat": _mode_run("native_repeat", native_doc[key]["native_repeat"]),
            "krex": _mode_run("krex", krex_doc["both"][key]),
        }
        results: dict[str, Any] = dict(
            summarize(runs, machine=machine, date=date, command=command, concurrency=CONCURRENCY)
        )
        results["commands"] = [
            {
                "mode": mode,
                "task": o["task"],
                "variant": o["variant"],
                "median_ms": o["median_ms"],
                "wall_s": o["wall_s"],
                "region_s": sum(r["duration_s"] for r in o["regions"]),
                "regions": len(o["regions"]),
                "output": o["output"],
                **({"pool": o["pool"]} if o["pool"] else {}),
            }
            for mode, doc in (
                ("exclusive", native_doc[key]["exclusive"]),
                ("native_repeat", native_doc[key]["native_repeat"]),
                ("krex", krex_doc["both"][key]),
            )
            for o in doc["outcomes"]
        ]
        results.update(
            simulated=simulated,
            profile=profile,
            tasks=sorted({c.task for c in cmds}),
            pool=None,
            gpu=g,
            nvidia_smi=smi,
        )
        d = out / f"gpu{g}"
        d.mkdir(parents=True, exist_ok=True)
        (d / "results.json").write_text(json.dumps(results, indent=2) + "\n")
        runner.render_report(results, d)
        regions = [r for o in krex_doc["both"][key]["outcomes"] for r in o["regions"]]
        per_gpu[key] = {
            "throughput_ratio_vs_exclusive": results["throughput_ratio_vs_exclusive"]["krex"],
            "inflation_p95": results["inflation_p95"],
            "flip_rate": results["flip_rate"],
            "regions": len(regions),
            "unclean_regions": sum(not r["clean"] for r in regions),
        }
    n = len(cmds)

    def rate(doc: dict[str, Any]) -> float:
        return 60.0 * n / float(doc["wall_s"])

    def waits(doc: dict[str, Any]) -> list[float]:
        return sorted(r["wait_s"] for o in doc["outcomes"] for r in o["regions"])

    alone, both = krex_doc["alone"]["1"], krex_doc["both"]["1"]
    again = krex_doc.get("alone_again", {}).get("1")
    alone_rates = [rate(alone)] + ([rate(again)] if again else [])
    iso = {
        "gpu1_alone_cmds_per_min": alone_rates,
        "gpu1_next_to_gpu0_cmds_per_min": rate(both),
        "gpu1_throughput_change_vs_alone_mean": rate(both) / statistics.mean(alone_rates) - 1,
        "gpu0_next_to_gpu1_cmds_per_min": rate(krex_doc["both"]["0"]),
        "gpu1_region_wait_median_s": {
            "alone": statistics.median(waits(alone)),
            "next_to_gpu0": statistics.median(waits(both)),
            **({"alone_again": statistics.median(waits(again))} if again else {}),
        },
        "gpu1_command_medians_alone_vs_both": {
            f"{a['task']}/{a['variant']}": [a["median_ms"], b["median_ms"]]
            for a, b in zip(alone["outcomes"], both["outcomes"], strict=True)
        },
    }

    # The node: every GPU's commands at once, 8 at a time each under krex (`both`), against
    # one at a time on each GPU (the native part ran the GPUs at the same time as well).
    def node_rate(walls: list[float]) -> float:
        return 60.0 * n * len(walls) / max(walls)

    node_krex = node_rate([float(krex_doc["both"][str(g)]["wall_s"]) for g in GPUS])
    node_exclusive = node_rate([float(native_doc[str(g)]["exclusive"]["wall_s"]) for g in GPUS])
    node = {
        "krex_cmds_per_min": node_krex,
        "exclusive_cmds_per_min": node_exclusive,
        "krex_vs_exclusive": node_krex / node_exclusive,
    }
    doc = {
        "date": date,
        "machine": machine,
        "nvidia_smi": smi,
        "command": command,
        "concurrency_per_gpu": CONCURRENCY,
        "commands_per_gpu": n,
        "daemon": krex_doc.get("daemon"),
        "isolation": iso,
        "node": node,
        "per_gpu": per_gpu,
        # Two-GPU commands beside one-GPU ones on both GPUs (issue #20: no deadlock, clean).
        "mixed": krex_doc.get("mixed", {}).get("verdict"),
    }
    (out / "summary.json").write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps({"isolation": {k: v for k, v in iso.items() if "medians" not in k}}, indent=1))
    print(json.dumps({"node": node, "per_gpu": per_gpu, "mixed": doc["mixed"]}, indent=1))
    return doc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("part", choices=("native", "krex"))
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--native", type=Path, help="native.json of the native part (part krex)")
    ap.add_argument("--tasks", help="comma-separated suite tasks (default: all of the profile)")
    ap.add_argument("--profile", default="quick", help="quick (real GPUs) or tiny (simulated)")
    args = ap.parse_args()
    tasks = [t for t in args.tasks.split(",") if t] if args.tasks else None
    cmds = commands(args.profile, tasks)
    simulated = any(c.simulated for c in cmds)
    if not simulated:
        runner._preflight(args.profile)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.part == "native":
        sim_shm = f"/krex-mgpu-{os.getpid()}" if simulated else None
        try:
            native(cmds, args.out, sim_shm)
        finally:
            if sim_shm is not None:
                Path("/dev/shm", sim_shm.lstrip("/")).unlink(missing_ok=True)
        return 0
    if args.native is None:
        ap.error("part krex needs --native (the native part's native.json)")
    native_doc = json.loads(args.native.read_text())
    krex_doc = krex_part(cmds, args.out, simulated)
    summary(cmds, args.profile, native_doc, krex_doc, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
