"""A hostile soak on the simulated GPU (issue #50): clients, region owners and the daemon itself
SIGKILLed at random while commands loop through `krex run`.

    python scripts/bench/hostile_soak.py --out DIR [--duration-s 600] [--clients 48]
        [--slots 8] [--region-timeout-s 60] [--client-kill-every-s 4]
        [--owner-kill-every-s 6] [--daemon-kill-every-s 60] [--seed 1]

`--clients` threads each run commands back to back (`krex run --sim` of a short Python tenant:
1 ms kernels outside its regions, a 2 ms kernel inside each of a few regions, a heartbeat line
on stdout every 50 ms of progress, its own exit status at the end). Killers SIGKILL a random
`krex run` (its command dies with it), a random command inside its region (the region's owner),
and the daemon (restarted by the next `krex run`, which starts the per-user daemon when none
answers; by the script if none has after 15 s). A command refused because the daemon died as
it was admitted (krex's own status, 125, before the command started: it says so) is run again,
as a harness would; a command is lost when it neither ended with its own status nor was killed
by us (nor, in its last try, was refused so), or hangs.

Measured: commands lost; per daemon death, the time until the gate was open and every group
under the daemon's root thawed, and the longest any running command went without a heartbeat
after it (a sibling blocked or frozen); the daemon's RSS each second, per daemon instance (its
growth, MiB per minute, past its first 10 s). Written to DIR: results.json and summary.md.
`ok` asks for: no lost command, every stall after a death below the region time-out, nothing
frozen or closed at the end, and each daemon instance that lived 60 s or more with an RSS
growth under 2 MiB/min.
"""

from __future__ import annotations

import argparse
import contextlib
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from krex.core.shm import Segment, SegmentError

KREX = [sys.executable, "-m", "krex.cli"]
EXIT_KREX = 125  # krex run's own status (krex/client/run.py)
RSS_WARMUP_S = 10.0
RSS_FLAT_MIB_PER_MIN = 2.0
TENANT = textwrap.dedent("""
    import os, sys, time
    import krex
    from krex.sim.simgpu import SimGPU
    regions, code = int(sys.argv[1]), int(sys.argv[2])
    print("pid", os.getpid(), flush=True)
    g = SimGPU()
    last = 0.0
    def beat():
        global last
        now = time.monotonic()
        if now - last >= 0.05:
            print("hb", now, flush=True)
            last = now
    for i in range(regions):
        until = time.monotonic() + 0.2
        while time.monotonic() < until:
            g.launch(1_000_000)
            g.sync()
            beat()
        try:
            with krex.region():
                print("in", flush=True)
                g.launch(2_000_000)
                g.sync()
                beat()
                print("out", flush=True)
        except krex.RegionError:
            print("unprotected", flush=True)  # its daemon died: it goes on without regions
    print("done", flush=True)
    sys.exit(code)
""")


@dataclass
class Attempt:
    """One `krex run`."""

    proc: subprocess.Popen[str]
    code: int  # the status its command ends with
    started: float
    pid: int = 0  # the command's, once it printed it
    in_region: bool = False
    killed: str = ""  # by us: "client" or "owner"
    done: bool = False
    ended: float = 0.0
    last_beat: float = 0.0
    pending: list[float] = field(default_factory=list)  # daemon deaths it has not beaten since


class Soak:
    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.tmp = tmp
        self.sock = tmp / "krex.sock"
        self.config = tmp / "krex.toml"
        self.config.write_text(
            f"[gpus]\nslots = {args.slots}\n[timeouts]\nregion_s = {args.region_timeout_s}\n"
        )
        self.env = {**os.environ, "KREX_CONFIG": str(self.config)}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.running: list[Attempt] = []
        self.jobs = {"completed": 0, "killed": 0, "lost": 0}
        self.attempts = {"runs": 0, "refused_at_daemon_death": 0, "hung": 0}
        self.lost: list[dict[str, Any]] = []
        self.kills = {"client": 0, "owner": 0, "daemon": 0}
        self.deaths: list[dict[str, Any]] = []
        self.stalls: list[float] = []  # per command and daemon death: seconds to its next beat
        self.rss: dict[int, list[tuple[float, int]]] = {}  # daemon pid -> (t, bytes)
        self.t0 = time.monotonic()
        self.segment = ""
        self.started: list[subprocess.Popen[bytes]] = []  # daemons the script started

    # The daemon.
    def daemon_pid(self) -> int | None:
        try:
            pid = int((self.tmp / "krex.sock.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        with contextlib.suppress(psutil.Error):
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return pid
        return None

    def start_daemon(self) -> None:
        with open(self.tmp / "krex.log", "ab") as log:
            self.started.append(subprocess.Popen(
                [*KREX, "daemon", "--sim", "--socket", str(self.sock)],
                stdout=log, stderr=log, env=self.env, start_new_session=True, cwd="/",
            ))  # fmt: skip

    def status(self) -> dict[str, Any] | None:
        p = subprocess.run(
            [*KREX, "status", "--json", "--socket", str(self.sock)],
            capture_output=True, text=True, timeout=60, env=self.env,
        )  # fmt: skip
        return dict(json.loads(p.stdout)) if p.returncode == 0 else None

    def wait_answering(self, within_s: float) -> dict[str, Any] | None:
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            st = self.status()
            if st is not None:
                return st
            time.sleep(0.2)
        return None

    # Commands.
    def run_job(self) -> None:
        """One command, run again while the daemon's death refuses it; its outcome counted."""
        code = self.rng.randrange(4)
        regions = self.rng.randint(2, 5)
        for _ in range(3):
            a = self.attempt(regions, code)
            if a.killed:
                self.count("killed")
                return
            rc = a.proc.returncode
            if a.pid == 0 and rc == EXIT_KREX and self.after_a_death(a):
                with self.lock:
                    self.attempts["refused_at_daemon_death"] += 1
                continue
            if rc == code and a.done:
                self.count("completed")
                return
            break
        self.count("lost")
        with self.lock:
            self.lost.append(
                {"rc": a.proc.returncode, "want": code, "done": a.done, "started": a.pid != 0,
                 "stderr": (a.proc.stderr.read() if a.proc.stderr else "")[-600:]}
            )  # fmt: skip

    def after_a_death(self, a: Attempt) -> bool:
        """Whether a daemon died while this attempt ran, or shortly before it started."""
        with self.lock:
            return any(a.started - 30 <= d["t"] <= a.ended for d in self.deaths)

    def count(self, what: str) -> None:
        with self.lock:
            self.jobs[what] += 1

    def attempt(self, regions: int, code: int) -> Attempt:
        proc = subprocess.Popen(
            [*KREX, "run", "--sim", "--socket", str(self.sock), "--",
             sys.executable, "-c", TENANT, str(regions), str(code)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env,
        )  # fmt: skip
        a = Attempt(proc, code, time.monotonic())
        with self.lock:
            self.running.append(a)
            self.attempts["runs"] += 1
        assert proc.stdout is not None
        bound = time.monotonic() + self.args.region_timeout_s + 120
        timer = threading.Timer(max(1.0, bound - time.monotonic()), self.hang, (a,))
        timer.daemon = True
        timer.start()
        for line in proc.stdout:
            self.line(a, line.split())
        proc.wait()
        timer.cancel()
        with self.lock:
            a.ended = time.monotonic()
            # Deaths it never beat after: it ended (by itself, or killed) since.
            if not a.killed:
                self.stalls.extend(a.ended - t for t in a.pending)
            a.pending.clear()
            self.running.remove(a)
        return a

    def hang(self, a: Attempt) -> None:
        if a.proc.poll() is None:
            with self.lock:
                self.attempts["hung"] += 1
            a.proc.kill()
            if a.pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(a.pid, signal.SIGKILL)

    def line(self, a: Attempt, words: list[str]) -> None:
        if not words:
            return
        with self.lock:
            if words[0] == "hb" and len(words) == 2:
                t = float(words[1])
                a.last_beat = t
                self.stalls.extend(t - d for d in a.pending if d <= t)
                a.pending = [d for d in a.pending if d > t]
            elif words[0] == "pid":
                a.pid = int(words[1])
            elif words[0] == "in":
                a.in_region = True
            elif words[0] in ("out", "unprotected"):
                a.in_region = False
            elif words[0] == "done":
                a.done = True

    # Killers.
    def kill_client(self) -> None:
        with self.lock:
            victims = [a for a in self.running if not a.killed and a.proc.poll() is None]
            if not victims:
                return
            a = self.rng.choice(victims)
            a.killed = "client"
            self.kills["client"] += 1
        a.proc.kill()  # its command dies with it (PR_SET_PDEATHSIG)

    def kill_owner(self) -> None:
        with self.lock:
            owners = [a for a in self.running if a.in_region and a.pid and not a.killed]
            if not owners:
                return
            a = self.rng.choice(owners)
            a.killed = "owner"
            self.kills["owner"] += 1
        with contextlib.suppress(ProcessLookupError):
            os.kill(a.pid, signal.SIGKILL)

    def kill_daemon(self) -> None:
        """SIGKILL the daemon, inside a region when one comes within 10 s (siblings shut out
        at the gate and frozen)."""
        pid = self.daemon_pid()
        if pid is None:
            return
        in_region_by = time.monotonic() + 10
        while not (closed := self.gate_closed()) and time.monotonic() < in_region_by:
            time.sleep(0.005)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        t = time.monotonic()
        with self.lock:
            self.kills["daemon"] += 1
            for a in self.running:
                if a.pid and not a.killed:
                    a.pending.append(t)
            death: dict[str, Any] = {"t": t, "at_s": round(t - self.t0, 1), "pid": pid,
                                     "gate_closed": closed}  # fmt: skip
            self.deaths.append(death)
        threading.Thread(target=self.watch_death, args=(death,), daemon=True).start()

    def watch_death(self, death: dict[str, Any]) -> None:
        """How long after the death the gate stayed closed and a group frozen; a daemon again
        if no `krex run` has started one within 15 s."""
        t, limit = death["t"], self.args.region_timeout_s + 60
        gate = thawed = None
        while time.monotonic() - t < limit and (gate is None or thawed is None):
            now = time.monotonic() - t
            if gate is None and not self.gate_closed():
                gate = now
            if thawed is None and not self.frozen():
                thawed = now
            if now > 15 and self.daemon_pid() in (None, death["pid"]):
                self.start_daemon()
                time.sleep(2)
            time.sleep(0.05)
        death["gate_open_after_s"] = None if gate is None else round(gate, 3)
        death["thawed_after_s"] = None if thawed is None else round(thawed, 3)

    def gate_closed(self) -> bool:
        try:
            with Segment.attach(self.segment) as seg:
                return any(seg.gate(g).owner for g in range(seg.n_gpus))
        except SegmentError:
            return False

    def frozen(self) -> list[str]:
        root = self.segment.lstrip("/")
        out = []
        for path in Path("/sys/fs/cgroup").glob(f"**/{root}/**/freezer.state"):
            with contextlib.suppress(OSError):
                if path.read_text().strip() != "THAWED":
                    out.append(str(path))
        for path in Path("/sys/fs/cgroup").glob(f"**/{root}/**/cgroup.freeze"):
            with contextlib.suppress(OSError):
                if path.read_text().strip() != "0":
                    out.append(str(path))
        return out

    def every(self, period_s: float, action: Any) -> None:
        while not self.stop.wait(self.rng.uniform(0.5, 1.5) * period_s):
            action()

    def sample_rss(self) -> None:
        while not self.stop.wait(1.0):
            for p in self.started:
                p.poll()  # reaped once dead (a zombie is no daemon)
            pid = self.daemon_pid()
            if pid is None:
                continue
            with contextlib.suppress(psutil.Error):
                rss = psutil.Process(pid).memory_info().rss
                if not rss:
                    continue
                with self.lock:
                    self.rss.setdefault(pid, []).append((time.monotonic() - self.t0, rss))

    # The run.
    def run(self) -> dict[str, Any]:
        self.start_daemon()
        st = self.wait_answering(60)
        if st is None:
            raise SystemExit("the daemon did not start: " + (self.tmp / "krex.log").read_text())
        self.segment = str(st["segment"])
        a = self.args
        threads = [threading.Thread(target=self.sample_rss, daemon=True)]
        for period, action in (
            (a.client_kill_every_s, self.kill_client),
            (a.owner_kill_every_s, self.kill_owner),
            (a.daemon_kill_every_s, self.kill_daemon),
        ):
            if period > 0:
                threads.append(threading.Thread(target=self.every, args=(period, action)))
        clients = [threading.Thread(target=self.client) for _ in range(a.clients)]
        for th in threads + clients:
            th.daemon = True
            th.start()
        time.sleep(a.duration_s)
        self.stop.set()  # no new commands or kills; those running finish
        for th in clients:
            th.join(timeout=a.region_timeout_s + 180)
        deaths_settled = time.monotonic() + 30
        while time.monotonic() < deaths_settled and any(
            "thawed_after_s" not in d for d in self.deaths
        ):
            time.sleep(0.2)
        end = self.wait_answering(30)
        problems = self.end_problems(end)
        pid = self.daemon_pid()
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).wait(timeout=60)
        return self.results(problems, alive=[th for th in clients if th.is_alive()])

    def client(self) -> None:
        while not self.stop.is_set():
            self.run_job()

    def end_problems(self, st: dict[str, Any] | None) -> list[str]:
        if st is None:
            return ["no daemon answers at the end"]
        problems = [
            f"GPU {g['gpu']} not idle: {g}"
            for g in st["gpus"]
            if g["used"] or g["queue"] or g["region"] is not None
        ]
        problems += [f"{p} is frozen" for p in self.frozen()]
        if self.gate_closed():
            problems.append("a gate is closed")
        return problems

    def results(self, problems: list[str], alive: list[threading.Thread]) -> dict[str, Any]:
        a = self.args
        if alive:
            problems.append(f"{len(alive)} client(s) still running at the end")
        instances = [_rss_summary(pid, s) for pid, s in self.rss.items()]
        deaths = [{k: v for k, v in d.items() if k != "t"} for d in self.deaths]
        worst_stall = max(self.stalls, default=0.0)
        blocked = [
            x
            for d in deaths
            for x in (d.get("gate_open_after_s"), d.get("thawed_after_s"))
            if x is not None
        ]
        never = [d for d in deaths if None in (d.get("gate_open_after_s"), d.get("thawed_after_s"))]
        long_lived = [i for i in instances if i["span_s"] >= 60]
        rss_flat = all(i["growth_mib_per_min"] < RSS_FLAT_MIB_PER_MIN for i in long_lived)
        ok = (
            not problems
            and self.jobs["lost"] == 0
            and self.attempts["hung"] == 0
            and not never
            and worst_stall < a.region_timeout_s
            and max(blocked, default=0.0) < a.region_timeout_s
            and rss_flat
        )
        return {
            "ok": ok,
            "settings": {k: v for k, v in vars(a).items() if k != "out"},
            "wall_s": round(time.monotonic() - self.t0, 1),
            "jobs": self.jobs,
            "attempts": self.attempts,
            "lost": self.lost[:20],
            "kills": self.kills,
            "daemon_starts_by_script": len(self.started),
            "daemon_deaths": deaths,
            "stall_after_death_s": {
                "n": len(self.stalls),
                "max": round(worst_stall, 3),
                "median": round(statistics.median(self.stalls), 3) if self.stalls else None,
            },
            "max_gate_closed_or_frozen_after_death_s": max(blocked, default=None),
            "daemon_rss": instances,
            "rss_flat": rss_flat if long_lived else None,
            "problems": problems,
        }


def _rss_summary(pid: int, samples: list[tuple[float, int]]) -> dict[str, Any]:
    """One daemon instance's RSS: first, last, most, and its growth past the warm-up (a least
    squares slope, MiB per minute)."""
    t_first = samples[0][0]
    settled = [(t, r) for t, r in samples if t - t_first >= RSS_WARMUP_S]
    slope = 0.0
    if len(settled) >= 3:
        ts, rs = [t for t, _ in settled], [r for _, r in settled]
        mt, mr = statistics.fmean(ts), statistics.fmean(rs)
        den = sum((t - mt) ** 2 for t in ts)
        slope = sum((t - mt) * (r - mr) for t, r in zip(ts, rs, strict=True)) / den if den else 0.0
    mib = 1 << 20
    return {
        "pid": pid,
        "from_s": round(t_first, 1),
        "span_s": round(samples[-1][0] - t_first, 1),
        "samples": len(samples),
        "first_mib": round(samples[0][1] / mib, 1),
        "last_mib": round(samples[-1][1] / mib, 1),
        "max_mib": round(max(r for _, r in samples) / mib, 1),
        "growth_mib_per_min": round(slope * 60 / mib, 3),
    }


def summary(doc: dict[str, Any]) -> str:
    s, j, k = doc["settings"], doc["jobs"], doc["kills"]
    lines = [
        "# Hostile soak (scripts/bench/hostile_soak.py)",
        "",
        f"{s['clients']} clients, {s['slots']} slots, {s['duration_s']:g} s "
        f"(wall {doc['wall_s']:g} s), region time-out {s['region_timeout_s']:g} s, "
        f"seed {s['seed']}: **{'ok' if doc['ok'] else 'NOT ok'}**",
        "",
        "| | |",
        "| --- | --- |",
        f"| commands completed with their own status | {j['completed']} |",
        f"| commands killed by the soak | {j['killed']} |",
        f"| **commands lost** | **{j['lost']}** |",
        f"| `krex run` attempts (refused at a daemon death, run again; hung) | "
        f"{doc['attempts']['runs']} ({doc['attempts']['refused_at_daemon_death']}; "
        f"{doc['attempts']['hung']}) |",
        f"| SIGKILLs: clients, owners in a region, the daemon | "
        f"{k['client']}, {k['owner']}, {k['daemon']} |",
        f"| longest a command went without progress after a daemon death | "
        f"{doc['stall_after_death_s']['max']} s (median {doc['stall_after_death_s']['median']} "
        f"s, {doc['stall_after_death_s']['n']} cases) |",
        f"| longest a gate stayed closed or a group frozen after a daemon death | "
        f"{doc['max_gate_closed_or_frozen_after_death_s']} s |",
        f"| daemon RSS flat (instances that lived >= 60 s) | {doc['rss_flat']} |",
        "",
        "A command's time without progress after a death is an upper bound on its time blocked"
        " or frozen: it also holds a `krex.region()` entry that retries connecting (5 s) until"
        " a successor answers (which refuses it: the command goes on unprotected). The gate and"
        " freezer times are read directly (every 50 ms).",
        "",
        "Daemon deaths (s from the start; gate closed at the kill; open and thawed after):",
        "",
    ]
    lines += [
        f"- {d['at_s']} s, pid {d['pid']}: gate closed {d['gate_closed']}, open after "
        f"{d.get('gate_open_after_s')} s, thawed after {d.get('thawed_after_s')} s"
        for d in doc["daemon_deaths"]
    ] or ["- none"]
    lines += ["", "Daemon instances (RSS MiB: first, last, max; growth past 10 s, MiB/min):", ""]
    lines += [
        f"- pid {i['pid']} from {i['from_s']} s for {i['span_s']} s: {i['first_mib']}, "
        f"{i['last_mib']}, {i['max_mib']}; {i['growth_mib_per_min']}"
        for i in doc["daemon_rss"]
    ]
    if doc["problems"]:
        lines += ["", "Problems:", "", *[f"- {p}" for p in doc["problems"]]]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument(
        "--out", type=Path, required=True, help="directory for results.json, summary.md"
    )
    ap.add_argument("--duration-s", type=float, default=600.0)
    ap.add_argument("--clients", type=int, default=48)
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--region-timeout-s", type=float, default=60.0)
    ap.add_argument("--client-kill-every-s", type=float, default=4.0, help="0: none")
    ap.add_argument("--owner-kill-every-s", type=float, default=6.0, help="0: none")
    ap.add_argument("--daemon-kill-every-s", type=float, default=60.0, help="0: none")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="krex-hostile-") as tmp_name:
        tmp = Path(tmp_name)
        soak = Soak(args, tmp)
        try:
            doc = soak.run()
        finally:
            log = tmp / "krex.log"
            if log.exists():
                (args.out / "daemon.log").write_bytes(log.read_bytes()[-200_000:])
    doc["settings"]["out"] = str(args.out)
    (args.out / "results.json").write_text(json.dumps(doc, indent=2) + "\n")
    (args.out / "summary.md").write_text(summary(doc))
    print(summary(doc))
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
