"""Device memory on the simulated GPU (issue #47, docs/memory.md): a benchmark, not a test.

A mix of commands whose peaks add up to three times the simulated GPU (KREX_SIM_MEM_BYTES),
with the driver's own memory modelled as the H200 showed it (docs/simulator.md): a context
(KREX_SIM_CTX_BYTES), a lazily loaded module (KREX_SIM_MODULE_BYTES, CUDA_MODULE_LOADING=LAZY),
a kernel's local memory at launch (`@local=`), and a library that falls back when its
workspace allocation fails (a 5x slower kernel, as cuDNN and cuBLAS do). Each command: a
context, its input held through a "compile" (a sleep: import and torch.compile happen off the
GPU), launches, the workspace, then its timing in a region. Modes side by side in one run:

- `alone`: one command at a time, no krex (what users do today; the reference for fallbacks);
- `shared8`: 8 at once with no krex (the control: failures and fallbacks expected);
- `krex8`, `krex16`: every command through `krex run` to a private daemon of 8 / 16 slots,
  as many `krex run` clients at once as slots;
- `krex8-c16`: 8 slots, 16 clients at once (8 of them queued): the slots' share of a
  difference between krex16 and krex8, apart from the clients'.

With `--agents N` the commands are N agents' candidates instead: agent a works on one problem
of the mix (the mix of N), and runs its candidates one after another, each from its own
directory, its workspace differing by up to a fifth from candidate to candidate; each candidate
is a script the agent writes before running it (`python bench.py`, the sizes in the script).
`--agent-file same` rewrites one bench.py (the command line repeats: its family's last peak is
the daemon's guess, docs/memory.md), `new` writes cand<i>.py (every command line new: the
daemon can only guess its prior), so the two runs measure what the family buys.

Per mode: commands that succeeded and failed, those that took the fallback where alone they did
not, regions and those unclean, drains that timed out, preemptions, swaps, reruns, memory waits,
throughput over successful commands (and as a multiple of `alone`'s).

    python3 scripts/bench/sim_memory.py --json OUT.json [--modes alone,shared8,krex8,krex16]
        [--commands 32] [--capacity 4G] [--compile-s 1.0] [--clients N] [--output-in-region S]
        [--timer] [--agents N [--agent-file same|new]]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts" / "bench")]

import memory_check  # noqa: E402  (scripts/bench: its private daemons)

from krex.core.config import parse_size  # noqa: E402
from krex.core.paths import sim_library_dir  # noqa: E402
from krex.sim.simnode import remove as remove_sim_node  # noqa: E402

MIB = 1 << 20
# name: (clients at once, the daemon's slots)
MODES = {"alone": (1, None), "shared8": (8, None), "krex8": (8, 8), "krex16": (16, 16),
         "krex8-c16": (16, 8)}  # fmt: skip
# The driver's own memory, per process (docs/simulator.md), at about ten times the H200's
# proportions (a context of about 0.5 GiB and its modules in 141 GiB) so that it matters here.
DRIVER = {
    "KREX_SIM_CTX_BYTES": "96M",
    "KREX_SIM_MODULE_BYTES": "32M",
    "CUDA_MODULE_LOADING": "LAZY",
}
LOCAL = "32M"  # the kernel's local memory, reserved at its first launch
FAST_NS, SLOW_NS = 2_000_000, 10_000_000  # the timed kernel with and without its workspace

COMMAND = textwrap.dedent("""
    import ctypes, json, statistics, sys, time
    from ctypes import byref, c_size_t, c_uint64
    import krex
    from krex.sim.simgpu import SimGPU
    input_mib, ws_mib = int(sys.argv[1]), int(sys.argv[2])
    compile_s, local, out_mib = float(sys.argv[3]), sys.argv[4], int(sys.argv[5])
    timer = sys.argv[6] == "timer"
    g = SimGPU()                                  # a context: the driver's own memory
    fn = g.function(g.load_module(), f"k@local={local}")   # lazy: the module loads here
    data = g.alloc((input_mib - out_mib) << 20)   # the input, held from here on
    time.sleep(compile_s)                         # import, torch.compile: off the GPU
    for _ in range(4):
        g.launch_fn(fn, 200_000)                  # first launch: its local memory
    g.sync()
    ws = c_uint64()
    rc = g.cu.cuMemAlloc_v2(byref(ws), c_size_t(ws_mib << 20))  # a library's workspace
    ns = %d if rc == 0 else %d                    # no workspace: the slower path
    outs = []
    def timed():
        if out_mib and not outs:
            outs.append(g.alloc(out_mib << 20))   # an eager op's output, at its first call
        return statistics.median(g.measure(ns, reps=5))
    if timer:  # as `krex run --auto-regions` wraps triton.testing.do_bench
        from krex.tenant import markers
        try:
            wrapped = markers.auto_region("triton.testing.do_bench", retakes=True)(timed)
        except TypeError:  # a krex from before retakes (an A/B's older tree)
            wrapped = markers.auto_region("triton.testing.do_bench")(timed)
        ms = wrapped()
        markers.flush()
    else:
        with krex.region():
            ms = timed()
    print(json.dumps({"ms": ms, "fallback": rc != 0}), flush=True)
""") % (FAST_NS, SLOW_NS)


def mix(n: int, capacity: int, seed: int = 47) -> list[tuple[int, int]]:
    """n commands (input MiB, workspace MiB) whose inputs and workspaces add up to three times
    the capacity, from a twentieth to two fifths of it each, in a fixed shuffled order."""
    rng = random.Random(seed)
    shares = [0.05 + 0.35 * (i / max(1, n - 1)) for i in range(n)]
    scale = 3 * capacity / sum(shares) / MIB
    out = []
    for s in shares:
        total = max(8, int(s * scale))
        ws = max(1, total // 4)
        out.append((total - ws, ws))
    rng.shuffle(out)
    return out


def agents_mix(n: int, agents: int, capacity: int, seed: int = 47) -> list[tuple[int, int]]:
    """n candidates of `agents` agents, candidate i agent i % agents's: the agent's problem from
    mix(agents) (its input), its workspace within a fifth of the problem's either way."""
    rng = random.Random(seed)
    problems = mix(agents, capacity, seed)
    out = []
    for i in range(n):
        inp, ws = problems[i % agents]
        out.append((inp, max(1, int(ws * rng.uniform(0.8, 1.2)))))
    return out


class Agent(NamedTuple):
    """Where a candidate is written and run from (run_one's `agent`)."""

    directory: Path
    file: str  # the script's name: bench.py each time, or cand<i>.py


def run_one(
    cmd: tuple[int, int],
    sock: Path | None,
    env: dict[str, str],
    report: Path,
    compile_s: float,
    base: float = 0.0,
    out_share: float = 0.0,
    timer: bool = False,
    agent: Agent | None = None,
) -> dict[str, Any]:
    out_mib = str(int(cmd[0] * out_share))
    args = [str(cmd[0]), str(cmd[1]), str(compile_s), LOCAL, out_mib,
            "timer" if timer else "region"]  # fmt: skip
    argv = [sys.executable, "-c", COMMAND, *args]
    if agent is not None:  # the candidate as a script the agent wrote, its sizes inside it
        script = agent.directory / agent.file
        script.write_text(f"import sys\nsys.argv[1:] = {args!r}\n" + COMMAND)
        argv = [sys.executable, agent.file]
    if sock is not None:
        argv = [sys.executable, "-m", "krex.cli", "run", "--sim", "--socket", str(sock),
                "--report", str(report), "--", *argv]  # fmt: skip
    t0 = time.monotonic()
    p = subprocess.run(
        argv,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        cwd=None if agent is None else agent.directory,
    )
    out: dict[str, Any] = {"input_mib": cmd[0], "ws_mib": cmd[1], "rc": p.returncode}
    t1 = time.monotonic()
    out["wall_s"] = t1 - t0
    out["start_s"], out["end_s"] = t0 - base, t1 - base  # since the mode began
    lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
    if lines:
        out |= json.loads(lines[-1])  # a rerun prints again: the last attempt's
    out["oom"] = "SimOutOfMemory" in p.stderr or "out of memory" in p.stderr
    if p.returncode != 0:
        out["stderr_tail"] = p.stderr[-400:]
    if sock is not None and report.exists():
        rep = json.loads(report.read_text())
        attempts = [*rep.get("attempts", []), rep]
        out["memory"] = rep.get("memory")
        out["queue_s"] = sum(a.get("queue_s") or 0.0 for a in attempts)
        out["reruns"] = len(attempts) - 1
        out["preemptions"] = sum(bool(a.get("preempted")) for a in attempts)
        out["swaps"] = sum((a.get("memory") or {}).get("swaps", 0) for a in attempts)
        out["oom_shared"] = sum((a.get("memory") or {}).get("oom_shared", 0) for a in attempts)
        out["wait_s"] = sum((a.get("memory") or {}).get("wait_s", 0.0) for a in attempts)
        regions = [r for a in attempts for r in a.get("regions", [])]
        out["regions"] = len(regions)
        out["unclean"] = sum(not r.get("clean") for r in regions)
        out["revoked"] = sum(bool(r.get("revoked")) for r in regions)
        out["retaken"] = sum(bool(r.get("retaken")) for r in regions)
        if out["unclean"]:  # why, as the records say
            out["unclean_problems"] = [r.get("problems") for r in regions if not r.get("clean")]
        out["drains_timed_out"] = sum(
            any("drain" in p for p in r.get("problems", [])) for r in regions
        )
        out["clean_fallback"] = bool(out.get("fallback")) and all(
            r.get("clean") for r in rep.get("regions", [])
        )
    return out


@contextlib.contextmanager
def node(capacity: int) -> Iterator[dict[str, str]]:
    """A private simulated node: the environment its commands (and daemon) run with."""
    shm = f"/krex-simmem-{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KREX_")}
    env.pop("LD_PRELOAD", None)
    env |= DRIVER | {"KREX_SIM_MEM_BYTES": str(capacity), "KREX_SIM_SHM": shm}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    try:
        yield env
    finally:
        remove_sim_node(shm)


def run_mode(
    name: str,
    cmds: list[tuple[int, int]],
    capacity: int,
    compile_s: float,
    clients: int = 0,
    out_share: float = 0.0,
    timer: bool = False,
    agents: int = 0,
    agent_file: str = "same",
) -> dict[str, Any]:
    concurrency, slots = MODES[name]
    if slots and clients:  # krex modes: this many `krex run` clients at once instead
        concurrency = clients
    if agents:  # each agent one client, its candidates one after another
        concurrency = min(concurrency, agents)
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.TemporaryDirectory(prefix=f"krex-simmem-{name}-") as d, node(capacity) as env:
        tmp = Path(d)
        with contextlib.ExitStack() as stack:
            sock = (
                stack.enter_context(memory_check.daemon(tmp, slots, sim=True, env=env))
                if slots
                else None
            )
            if sock is None:
                env = env | {"LD_LIBRARY_PATH": str(sim_library_dir())}
            t0 = time.monotonic()

            def one(i: int, agent: Agent | None = None) -> dict[str, Any]:
                report = tmp / f"{i}.json"
                return run_one(cmds[i], sock, env, report, compile_s, t0, out_share, timer, agent)

            def candidates(a: int) -> list[tuple[int, dict[str, Any]]]:
                directory = tmp / f"agent{a}"
                directory.mkdir()
                mine = range(a, len(cmds), agents)
                return [
                    (i, one(i, Agent(directory, memory_check.agent_script(i, agent_file))))
                    for i in mine
                ]

            with ThreadPoolExecutor(concurrency) as ex:
                if agents:
                    done = dict(r for f in [ex.submit(candidates, a) for a in range(agents)]
                                for r in f.result())  # fmt: skip
                    results = [done[i] for i in range(len(cmds))]
                else:
                    results = [f.result() for f in [ex.submit(one, i) for i in range(len(cmds))]]
            wall = time.monotonic() - t0
    # CPU-seconds of everything this mode started and waited for (clients, their commands, the
    # daemon and its pool once it stopped): what more clients cost on a machine of few cores.
    now = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = now.ru_utime + now.ru_stime - used.ru_utime - used.ru_stime
    return {"mode": name, "concurrency": concurrency, **counts(results, wall), "cpu_s": cpu_s} | {
        "commands": results
    }


def counts(results: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    ok = [r for r in results if r["rc"] == 0]
    waits = sorted(r["wait_s"] for r in results if "wait_s" in r)
    return {
        "wall_s": wall,
        "succeeded": len(ok),
        "failed": len(results) - len(ok),
        "oom": sum(r["oom"] for r in results),
        "fallbacks": sum(bool(r.get("fallback")) for r in ok),
        "clean_fallbacks": sum(bool(r.get("clean_fallback")) for r in ok),
        "regions": sum(r.get("regions", 0) for r in results),
        "unclean": sum(r.get("unclean", 0) for r in results),
        "revoked": sum(r.get("revoked", 0) for r in results),
        "retaken": sum(r.get("retaken", 0) for r in results),
        "drains_timed_out": sum(r.get("drains_timed_out", 0) for r in results),
        "preemptions": sum(r.get("preemptions", 0) for r in results),
        "swaps": sum(r.get("swaps", 0) for r in results),
        "reruns": sum(r.get("reruns", 0) for r in results),
        "oom_shared": sum(r.get("oom_shared", 0) for r in results),
        "wait_p50_s": q(waits, 0.5),
        "wait_p95_s": q(waits, 0.95),
        "ok_per_min": 60 * len(ok) / wall,
    }


def q(xs: list[float], quantile: float) -> float | None:
    return xs[min(len(xs) - 1, int(quantile * len(xs)))] if xs else None


def summarise(modes: list[dict[str, Any]]) -> None:
    """Against `alone`: throughput as a multiple, and fallbacks taken where alone took none."""
    base = next((m for m in modes if m["mode"] == "alone"), None)
    if base is None:
        return
    alone_fell = [bool(c.get("fallback")) for c in base["commands"]]
    for m in modes:
        m["x_alone"] = m["ok_per_min"] / base["ok_per_min"] if base["ok_per_min"] else None
        m["fallbacks_not_alone"] = sum(
            bool(c.get("fallback")) and c["rc"] == 0 and not fell
            for c, fell in zip(m["commands"], alone_fell, strict=True)
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--modes", default="alone,shared8,krex8,krex16", help=", ".join(MODES))
    ap.add_argument("--commands", type=int, default=32)
    ap.add_argument("--capacity", default="4G", help="the simulated GPU's memory")
    ap.add_argument("--compile-s", type=float, default=1.0)
    ap.add_argument(
        "--clients", type=int, default=0,
        help="krex modes: `krex run` clients at once (default: as many as slots; the GPU "
        "benchmark kb_memory.py submits every command at once)",
    )  # fmt: skip
    ap.add_argument(
        "--output-in-region", type=float, default=0.0, metavar="SHARE",
        help="the share (0..0.9) of each command's input it allocates inside its timing region "
        "instead of before it, as an eager op allocates its output at the first timed call "
        "(the H100's revoked regions, docs/results/h100-wave3/2026-12-06-d/); default 0",
    )  # fmt: skip
    ap.add_argument(
        "--timer", action="store_true",
        help="time each command through a timer krex's auto-regions wrap (as they wrap "
        "triton.testing.do_bench: a region revoked for memory is retaken), not krex.region()",
    )  # fmt: skip
    by_agents = ap.add_argument_group(
        "agents",
        "the commands as agents' candidates, each agent's one after another (the "
        "module's docstring)",
    )
    by_agents.add_argument("--agents", type=int, default=0, help="how many (default 0: none)")
    by_agents.add_argument("--agent-file", choices=("same", "new"), default="same",
                           help="each candidate written to the agent's bench.py (same) or to "
                           "a new cand<i>.py (new)")  # fmt: skip
    args = ap.parse_args()
    names = [m for m in args.modes.split(",") if m]
    if unknown := [m for m in names if m not in MODES]:
        ap.error(f"unknown mode(s) {', '.join(unknown)}: choose from {', '.join(MODES)}")
    try:
        capacity = parse_size(args.capacity)
    except ValueError as e:
        ap.error(f"--capacity: {e}")
    if args.commands < 1 or not args.compile_s >= 0 or args.clients < 0 or args.agents < 0:
        ap.error("--commands must be >= 1, --compile-s >= 0, --clients and --agents >= 0")
    if not 0 <= args.output_in_region <= 0.9:
        ap.error("--output-in-region must be a share from 0 to 0.9")
    agents = args.agents
    cmds = agents_mix(args.commands, agents, capacity) if agents else mix(args.commands, capacity)
    args.json.resolve().parent.mkdir(parents=True, exist_ok=True)
    memory_check.LOGS = args.json.resolve().parent  # the daemons' logs
    modes = []
    for name in names:
        print(f"== {name} (simulated GPU)", flush=True)
        share, timer = args.output_in_region, args.timer
        modes.append(
            run_mode(name, cmds, capacity, args.compile_s, args.clients, share, timer, agents,
                     args.agent_file)
        )  # fmt: skip
        args.json.write_text(json.dumps({"partial": True, "modes": modes}, indent=1))
    summarise(modes)
    doc = {
        "simulated": True,
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "command": "python3 scripts/bench/sim_memory.py " + " ".join(sys.argv[1:]),
        "capacity_bytes": capacity,
        "peaks_sum_bytes": sum(a + b for a, b in cmds) * MIB,
        "agents": agents,
        "agent_file": args.agent_file if agents else None,
        "driver": DRIVER | {"local": LOCAL},
        "modes": modes,
    }
    args.json.write_text(json.dumps(doc, indent=1))
    cols = ("ok", "fail", "oom", "fallbk", "not-alone", "regions", "unclean", "revoked",
            "retaken", "drain-to", "preempt", "swaps", "reruns", "wait p95", "wall s", "cpu s",
            "ok/min", "x alone")  # fmt: skip
    print("simulated GPU; mode    " + " ".join(f"{c:>9}" for c in cols))
    for m in modes:
        vals = (m["succeeded"], m["failed"], m["oom"], m["fallbacks"],
                m.get("fallbacks_not_alone"), m["regions"], m["unclean"], m["revoked"],
                m["retaken"], m["drains_timed_out"],
                m["preemptions"], m.get("swaps"), m["reruns"], m["wait_p95_s"], m["wall_s"],
                m.get("cpu_s"), m["ok_per_min"], m.get("x_alone"))  # fmt: skip
        cells = ["-" if v is None else f"{v:.2f}" if isinstance(v, float) else str(v) for v in vals]
        print(f"{m['mode']:22} " + " ".join(f"{c:>9}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
