"""Soak and load tests of the controller on the simulated GPU (`make stress`).

    python scripts/stress.py soak --tenants 32 --regions 1000 [--kills 0.05] [--json OUT]
    python scripts/stress.py load --clients 64 --slots 8 --regions 10000 [--json OUT]

soak: `--tenants` commands at once, each taking regions in a loop (a short simulated kernel in
each); a killer SIGKILLs random commands, some inside their regions; finished or killed commands
are replaced until `--regions` regions have been granted in all. At the end: no deadlock (it
finishes within its time-out), every surviving command exited with its own status, the daemon
holds no slot, queue or region, nothing is frozen, and every shared-memory slot is free.

load: `--clients` `krex run` at once on one simulated GPU with `--slots` slots, `--regions`
regions in all: throughput, region wait (grant latency) p50/p99, the daemon's CPU time and
peak memory. Prints one JSON document (and writes it with --json).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import psutil

KREX = [sys.executable, "-m", "krex.cli"]
TENANT = textwrap.dedent("""
    import os, sys, krex
    from krex.sim.simgpu import SimGPU
    n, code = int(sys.argv[1]), int(sys.argv[2])
    g = SimGPU()
    for i in range(n):
        with krex.region():
            g.launch(50_000)
            g.sync()
        print(i + 1, flush=True)
    sys.exit(code)
""")


class Node:
    """A private simulated daemon."""

    def __init__(self, tmp: Path, slots: int) -> None:
        self.sock = tmp / "krex.sock"
        self.log = tmp / "daemon.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [*KREX, "daemon", "--sim", "--socket", str(self.sock), "--slots", str(slots)],
                stdout=log,
                stderr=log,
            )
        deadline = time.monotonic() + 30
        while not self.sock.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("daemon did not start: " + self.log.read_text()[-2000:])
            time.sleep(0.05)
        self.ps = psutil.Process(self.proc.pid)

    def status(self) -> dict[str, Any]:
        p = subprocess.run(
            [*KREX, "status", "--json", "--socket", str(self.sock)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        return dict(json.loads(p.stdout))

    def run(self, n: int, code: int, report: Path) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [*KREX, "run", "--sim", "--socket", str(self.sock), "--report", str(report), "--",
             sys.executable, "-c", TENANT, str(n), str(code)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)


def _check_end(node: Node) -> list[str]:
    """What is wrong with the node once every command is over (empty: nothing)."""
    problems = []
    st = node.status()
    root = st["segment"].lstrip("/")  # this node's cgroups live under it
    for g in st["gpus"]:
        if g["used"] or g["queue"] or g["region"] is not None or g["region_queue"]:
            problems.append(f"GPU {g['gpu']} not idle: {g}")
    for path in Path("/sys/fs/cgroup").glob(f"**/{root}/**/freezer.state"):
        if path.read_text().strip() != "THAWED":
            problems.append(f"{path} is {path.read_text().strip()}")
    for path in Path("/sys/fs/cgroup").glob(f"**/{root}/**/cgroup.freeze"):
        if path.read_text().strip() != "0":
            problems.append(f"{path} is frozen")
    from krex.core.shm import Segment

    seg = Segment.attach(st["segment"])
    try:
        live = [s for s in seg.slots() if s.alive]
        if live:
            problems.append(f"{len(live)} live slot(s) left: {[s.pid for s in live]}")
    finally:
        seg.close()
    return problems


def soak(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="krex-soak-") as tmp_name:
        tmp = Path(tmp_name)
        node = Node(tmp, slots=args.tenants)
        running: dict[int, tuple[subprocess.Popen[str], int, Path]] = {}
        killed: set[int] = set()
        outcomes = {"finished": 0, "killed": 0, "wrong_status": 0}
        granted = 0
        next_id = 0
        lock = threading.Lock()
        stop = threading.Event()

        def killer() -> None:
            while not stop.wait(args.kill_every_s):
                with lock:
                    victims = [i for i in running if i not in killed]
                    if not victims or rng.random() > args.kills:
                        continue
                    i = rng.choice(victims)
                    killed.add(i)
                    p = running[i][0]
                # Kill the command itself (a child of krex run), often inside a region.
                for child in psutil.Process(p.pid).children(recursive=True):
                    with _quiet():
                        child.kill()

        t0 = time.monotonic()
        killer_thread = threading.Thread(target=killer, daemon=True)
        killer_thread.start()
        try:
            while granted < args.regions or running:
                while (
                    granted + sum(n for _, n, _ in running.values()) < args.regions
                    and len(running) < args.tenants
                ):
                    n = rng.randint(5, 40)
                    code = 40 + next_id % 13
                    report = tmp / f"r{next_id}.json"
                    with lock:
                        running[next_id] = (node.run(n, code, report), n, report)
                    next_id += 1
                time.sleep(0.01)
                for i, (p, n, _report) in list(running.items()):
                    if p.poll() is None:
                        if time.monotonic() - t0 > args.timeout_s:
                            raise SystemExit(f"no progress: deadlock? {node.status()}")
                        continue
                    with lock:
                        del running[i]
                    out, err = p.communicate()
                    done = len(out.split())
                    granted += done
                    if i in killed and p.returncode == 40 + i % 13 and done == n:
                        killed.discard(i)  # the kill came after it had finished
                    if i in killed:
                        outcomes["killed"] += 1
                        if p.returncode != 128 + signal.SIGKILL:
                            outcomes["wrong_status"] += 1
                            print(f"killed command {i} gave {p.returncode}: {err[-500:]}")
                    else:
                        outcomes["finished"] += 1
                        if p.returncode != 40 + i % 13 or done != n:
                            outcomes["wrong_status"] += 1
                            print(f"command {i} gave {p.returncode} after {done}/{n}: {err[-500:]}")
        finally:
            stop.set()
            for p, _, _ in running.values():
                p.kill()
        wall = time.monotonic() - t0
        time.sleep(1.5)  # the daemon's reaper runs every second
        problems = _check_end(node)
        node.stop()
        return {
            "test": "soak",
            "tenants": args.tenants,
            "regions_granted": granted,
            "commands": next_id,
            **outcomes,
            "wall_s": round(wall, 2),
            "problems": problems,
            "ok": not problems and outcomes["wrong_status"] == 0,
        }


def load(args: argparse.Namespace) -> dict[str, Any]:
    per = args.regions // args.clients
    with tempfile.TemporaryDirectory(prefix="krex-load-") as tmp_name:
        tmp = Path(tmp_name)
        node = Node(tmp, slots=args.slots)
        cpu0 = node.ps.cpu_times()
        peak = [node.ps.memory_info().rss]
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(0.2):
                with _quiet():
                    peak[0] = max(peak[0], node.ps.memory_info().rss)

        threading.Thread(target=sample, daemon=True).start()
        t0 = time.monotonic()
        extra = args.regions - per * args.clients  # the first few take one more
        procs = [node.run(per + (i < extra), 0, tmp / f"r{i}.json") for i in range(args.clients)]
        errors = 0
        for p in procs:
            _, err = p.communicate(timeout=args.timeout_s)
            if p.returncode != 0:
                errors += 1
                print(err[-500:])
        wall = time.monotonic() - t0
        stop.set()
        cpu1 = node.ps.cpu_times()
        waits, setups, unclean = [], [], 0
        for i in range(args.clients):
            for r in json.loads((tmp / f"r{i}.json").read_text())["regions"]:
                waits.append(r["wait_s"])
                setups.append(r["drain_s"] + r["freeze_s"])
                unclean += not r["clean"]
        problems = _check_end(node)
        node.stop()

        def q(v: list[float], p: float) -> float:
            return statistics.quantiles(v, n=100, method="inclusive")[int(p) - 1]

        return {
            "test": "load",
            "clients": args.clients,
            "slots": args.slots,
            "regions": len(waits),
            "errors": errors,
            "unclean_regions": unclean,
            "wall_s": round(wall, 2),
            "regions_per_s": round(len(waits) / wall, 1),
            "region_wait_ms": {
                "p50": round(1000 * q(waits, 50), 2),
                "p99": round(1000 * q(waits, 99), 2),
            },
            "region_setup_ms": {
                "p50": round(1000 * q(setups, 50), 2),
                "p99": round(1000 * q(setups, 99), 2),
            },
            "daemon_cpu_s": round(cpu1.user + cpu1.system - cpu0.user - cpu0.system, 2),
            "daemon_peak_rss_mib": round(peak[0] / 2**20, 1),
            "problems": problems,
            "ok": errors == 0 and not problems,
        }


class _quiet:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return exc[0] is not None and issubclass(exc[0], (psutil.Error, OSError))  # type: ignore[arg-type]


def main() -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="test", required=True)
    s = sub.add_parser("soak")
    s.add_argument("--tenants", type=int, default=32)
    s.add_argument("--regions", type=int, default=1000)
    s.add_argument("--kills", type=float, default=0.5, help="chance of a kill at each tick")
    s.add_argument("--kill-every-s", type=float, default=0.25)
    s.add_argument("--seed", type=int, default=1)
    s.add_argument("--timeout-s", type=float, default=1800)
    s.add_argument("--json")
    lo = sub.add_parser("load")
    lo.add_argument("--clients", type=int, default=64)
    lo.add_argument("--slots", type=int, default=8)
    lo.add_argument("--regions", type=int, default=10000)
    lo.add_argument("--timeout-s", type=float, default=3600)
    lo.add_argument("--json")
    args = ap.parse_args()
    doc = soak(args) if args.test == "soak" else load(args)
    doc |= {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "machine": f"{os.uname().nodename} ({os.cpu_count()} cores), simulated GPU",
        "command": "python scripts/stress.py " + " ".join(sys.argv[1:]),
    }
    text = json.dumps(doc, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
