"""The warm pool on a real GPU: a typical benchmarking command cold vs warm, and the throughput
of 32 such commands at 8 slots cold vs warm.

A typical command is one of the bench suite's (`krex/bench/tasks/`): import torch, compile a
Triton kernel into a fresh cache, check it, time it with do_bench in a region. Everything runs
through `krex run` against one private daemon (8 slots, 8 warm workers); cold runs pass
`--no-pool`. Wall times are measured here, around the whole `krex run` process.

    python3 scripts/bench/pool_check.py --json OUT.json [--reps 5] [--commands 32]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from krex.bench import suite
from krex.bench.runner import fresh_caches
from krex.client import private_daemon, status

TYPICAL = ("softmax", "triton-w8")


def one(sock: Path, task: str, variant: str, warm: bool, tmp: Path, tag: str) -> dict[str, Any]:
    report = tmp / f"{tag}.json"
    cache = tmp / f"cache-{tag}"
    env = fresh_caches(dict(os.environ), cache)
    argv = [sys.executable, "-m", "krex.cli", "run", "--socket", str(sock)]
    argv += ["--report", str(report), *([] if warm else ["--no-pool"]), "--"]
    argv += [sys.executable, str(suite.TASKS_DIR / f"{task}.py"), variant]
    t0 = time.monotonic()
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        raise RuntimeError(f"{task} {variant} ({tag}) failed: {p.stderr[-2000:]}")
    rep = json.loads(report.read_text())
    line = json.loads(p.stdout.strip().splitlines()[-1])
    return {
        "task": task,
        "variant": variant,
        "wall_s": wall,
        "pool": rep["pool"],
        "pool_reason": rep["pool_reason"],
        "median_ms": line["median_ms"],
        "setup_s": line.get("setup_s"),
        "region_s": sum(r["duration_s"] for r in rep["regions"]),
    }


def batch(sock: Path, cmds: list[tuple[str, str]], warm: bool, tmp: Path) -> dict[str, Any]:
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=8) as ex:
        rows = list(
            ex.map(
                lambda ic: one(sock, *ic[1], warm, tmp, f"{'w' if warm else 'c'}32-{ic[0]}"),
                enumerate(cmds),
            )
        )
    wall = time.monotonic() - t0
    return {
        "commands": len(cmds),
        "wall_s": wall,
        "cmds_per_min": 60 * len(cmds) / wall,
        "warm_runs": sum(r["pool"] == "warm" for r in rows),
        "median_command_wall_s": statistics.median(r["wall_s"] for r in rows),
        "runs": rows,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--commands", type=int, default=32)
    args = ap.parse_args()
    doc: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        t0 = time.monotonic()
        with private_daemon(tmp / "d", sim=False, slots=8, pool=8, gpus=1) as sock:
            doc["pool_ready_s"] = time.monotonic() - t0
            doc["pool"] = status(False, str(sock))["gpus"][0]["pool"]
            print("pool ready after", round(doc["pool_ready_s"], 1), "s:", doc["pool"], flush=True)
            typical: dict[str, list[dict[str, Any]]] = {"cold": [], "warm": []}
            for i in range(args.reps):  # interleaved, so drift hits both alike
                for kind in ("cold", "warm"):
                    row = one(sock, *TYPICAL, kind == "warm", tmp, f"{kind}-{i}")
                    typical[kind].append(row)
                    print(kind, json.dumps(row), flush=True)
            doc["typical"] = {
                kind: {
                    "median_wall_s": statistics.median(r["wall_s"] for r in rows),
                    "runs": rows,
                }
                for kind, rows in typical.items()
            }
            quick = [(c.task, c.variant) for c in suite.commands("quick")]
            cmds = (quick * (1 + args.commands // len(quick)))[: args.commands]
            doc["throughput"] = {}
            for kind in ("cold", "warm"):
                res = batch(sock, cmds, kind == "warm", tmp)
                doc["throughput"][kind] = res
                print(
                    kind,
                    f"{res['commands']} commands at 8 slots: {res['wall_s']:.1f} s, "
                    f"{res['cmds_per_min']:.1f} cmds/min, {res['warm_runs']} warm",
                    flush=True,
                )
            doc["pool_after"] = status(False, str(sock))["gpus"][0]["pool"]
        # The daemon's log says why workers retired: keep it beside the results.
        log = tmp / "d" / "daemon.log"
        if log.exists():
            Path(args.json).with_suffix(".daemon.log").write_text(log.read_text())
    Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    t, q = doc["typical"], doc["throughput"]
    print(
        f"typical command: cold {t['cold']['median_wall_s']:.2f} s, "
        f"warm {t['warm']['median_wall_s']:.2f} s; 32 at 8 slots: cold "
        f"{q['cold']['cmds_per_min']:.1f}, warm {q['warm']['cmds_per_min']:.1f} cmds/min"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
