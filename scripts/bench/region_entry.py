"""Region overhead by sibling kind: where a region's entry and exit time go (docs/bench.md).

For each kind of sibling (scripts/bench/region_sibling.py: idle, launching, compiling, memwait:
one holding most of the GPU's memory and the others waiting for memory; and deep, launching
synced every 16 kernels instead of every two, not in the default list), a
private daemon of SIBLINGS + 1 slots, SIBLINGS siblings of that kind through `krex run`, and
once they all run, an owner that takes REGIONS short regions one after another. Per kind, from
the owner's `krex run --report` (docs/architecture.md, "What a region record says"): p50, p95
and max of `entry_s` (its own set-up: room to grant), `wait_s` (request to grant), `drain_s`,
`freeze_s`, `settle_s`, `exit_s`, each step of entry and exit (`entry_steps_s`: quiesce, drain,
freeze, pin, audit, sample; `exit_steps_s`: audit, pin_back, thaw, open), how many regions
were clean, and the most sibling processes a region left running (`awake`). Before the
launching (or deep) siblings start, one turn of their loop (its kernels and a sync) is timed
alone: `turn_ms`, and `queued_most_ms` = SIBLINGS turns, the most GPU work queued as a gate
closes, which a drain waits for (queued work is not withdrawn; pacing bounds it); how many turns
a second they got done together in FREE_S before the owner's first region
(`sibling_turns_free_per_s`: what pacing alone costs them) and while the owner took its regions
(`sibling_turns_per_s`: lower also where regions come faster, the GPU the owner's more often).

    python3 scripts/bench/region_entry.py --json OUT.json [--sim]
        [--kinds idle,launching,compiling,memwait (default; or any of these, deep)]
        [--siblings 7] [--regions 30] [--freeze all|contexts|all,contexts] [--pace-ms 0,5]

`--freeze`: the daemon's regions.freeze (docs/operator-guide.md); with both, each kind runs
under each setting in turn, with the same siblings' kind and number (default all).
`--pace-ms`: the daemon's regions.pace_ms (docs/shim.md, "Pacing"), one or more (0: off, the
default); each kind runs under each, after each freeze setting.

`--sim`: on the simulated GPU (no GPU needed; behaviour, not figures: the simulated driver and
a 2-core machine say nothing of a real GPU's costs). Otherwise on the GPU, with torch.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "bench"))
sys.path.insert(0, str(ROOT))

import memory_check  # noqa: E402
from region_sibling import KERNELS as LAUNCHING  # noqa: E402

from krex.core.paths import sim_library_dir  # noqa: E402
from krex.daemon.regions import ENTRY_STEPS, EXIT_STEPS  # noqa: E402
from krex.sim.simnode import remove as remove_sim_node  # noqa: E402

SIBLING = ROOT / "scripts" / "bench" / "region_sibling.py"
KINDS = ("idle", "launching", "compiling", "memwait", "deep")
DEFAULT_KINDS = KINDS[:4]
FREEZES = ("all", "contexts")  # regions.freeze
FIELDS = ("entry_s", "wait_s", "room_s", "drain_s", "freeze_s", "settle_s", "exit_s")
# The records' step by step split of entry_s and exit_s (the pin runs beside the gate, drain
# and freeze; the audit and the samples beside the grant since 2026-12-05, so not in entry_s:
# entry's steps do not add up to entry_s).
STEPS = {
    "entry_steps_s": tuple(s for s in ENTRY_STEPS if s not in ("room", "settle")),  # in FIELDS
    "exit_steps_s": EXIT_STEPS,
}
READY_S = 240.0  # a sibling's start (torch import, a first compile) on a loaded machine
WARM_S, FREE_S = 1.0, 3.0  # launching siblings' first turns, then their turns with no region


@contextlib.contextmanager
def node(sim: bool) -> Iterator[dict[str, str]]:
    """The environment the daemon and its commands run with (a private simulated node)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KREX_")}
    env.pop("LD_PRELOAD", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    if not sim:
        yield env
        return
    shm = f"/krex-entry-{uuid.uuid4().hex[:8]}"
    env["KREX_SIM_SHM"] = shm
    try:
        yield env
    finally:
        remove_sim_node(shm)


def _start(argv: list[str], env: dict[str, str], err: Path | None = None) -> subprocess.Popen[str]:
    """A command in a session of its own; its stderr to `err` (else dropped)."""
    with open(err or os.devnull, "w") as stderr:
        return subprocess.Popen(
            argv, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True,
            start_new_session=True, bufsize=1,
        )  # fmt: skip


def _stop(p: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        p.wait(timeout=60)


def run_kind(
    kind: str,
    sim: bool,
    siblings: int,
    regions: int,
    tmp: Path,
    freeze: str = "all",
    pace_ms: float = 0.0,
) -> dict[str, Any]:
    """One kind under regions.freeze = `freeze` and regions.pace_ms = `pace_ms`: the owner
    admitted first (a GPU where someone waits for memory admits nobody), then the siblings;
    once they all run their kind, the owner's regions; their records summarised."""
    where = "sim" if sim else "gpu"
    name = f"{kind}-{freeze}-{pace_ms:g}"
    go, owner_go = tmp / f"go-{name}", tmp / f"owner-go-{name}"
    report, err = tmp / f"owner-{name}.json", tmp / f"owner-{name}.err"
    cfg = f'[regions]\nfreeze = "{freeze}"\npace_ms = {pace_ms:g}\n'
    out: dict[str, Any] = {"kind": kind, "freeze": freeze, "pace_ms": pace_ms,
                           "siblings": siblings}  # fmt: skip
    with contextlib.ExitStack() as stack:
        env = stack.enter_context(node(sim))
        if kind in LAUNCHING:  # what the drain can at most wait for, measured first
            out |= turn(where, env, siblings, LAUNCHING[kind])
        sock = stack.enter_context(
            memory_check.daemon(tmp, siblings + 1, sim=sim, env=env, tag=name, config=cfg)
        )
        # Declared: with its memory unknown a command is admitted as an eighth of the GPU, so
        # an owner and 8 siblings would leave one queued (on the H200, 2026-12-05: the 8th
        # sibling never started). What they hold is small.
        run = [sys.executable, "-m", "krex.cli", "run", *(["--sim"] if sim else []), "--socket",
               str(sock), "--mem", "2G"]  # fmt: skip
        owner = _start([*run, "--report", str(report), "--", sys.executable, str(SIBLING),
                        "owner", where, str(owner_go), str(regions)], env, err)  # fmt: skip
        procs = [owner]
        try:
            deadline = time.monotonic() + READY_S
            _ready(owner, "the owner", deadline)
            for _ in range(siblings):
                procs.append(_start([*run, "--", sys.executable, str(SIBLING), kind, where,
                                     str(go)], env))  # fmt: skip
                _ready(procs[-1], f"a {kind} sibling", deadline)
            go.touch()
            if kind == "memwait":  # until all but the holder wait for memory
                _until_waiting(sock, env, siblings - 1, deadline)
            if kind in LAUNCHING:  # pacing's cost alone: no region yet
                out["sibling_turns_free_per_s"] = _free_turns(go)
            t0 = time.monotonic()
            before = _turns(go)
            owner_go.touch()
            rc = owner.wait(timeout=600)
            wall = time.monotonic() - t0
            if kind in LAUNCHING:
                out["sibling_turns_per_s"] = _turns_per_s(before, _turns(go))
        finally:
            for p in procs:
                _stop(p)
    out |= {"rc": rc, "owner_wall_s": wall}
    if rc != 0 or not report.exists():
        return out | {"stderr_tail": err.read_text()[-800:]}
    records = json.loads(report.read_text())["regions"]
    return out | summarise(records)


def _free_turns(go: Path) -> float | None:
    """The launching siblings' turns a second together over FREE_S, after WARM_S of turns."""
    time.sleep(WARM_S)
    before = _turns(go)
    time.sleep(FREE_S)
    return _turns_per_s(before, _turns(go))


def _turns(go: Path) -> dict[str, tuple[int, float]]:
    """Each launching sibling's count of turns and when it was written (region_sibling.py)."""
    out = {}
    for f in go.parent.glob(go.name + ".turns-*"):
        with contextlib.suppress(OSError, ValueError):
            n, t = f.read_text().split()
            out[f.name] = (int(n), float(t))
    return out


def _turns_per_s(
    before: dict[str, tuple[int, float]], after: dict[str, tuple[int, float]]
) -> float | None:
    """The siblings' turns a second between the two readings, summed over the siblings."""
    rates = [
        (after[k][0] - n) / (after[k][1] - t)
        for k, (n, t) in before.items()
        if k in after and after[k][1] > t
    ]
    return round(sum(rates), 2) if rates else None


def turn(where: str, env: dict[str, str], siblings: int, kernels: int = 2) -> dict[str, Any]:
    """A launching sibling's turn (its `kernels` kernels and a sync) timed alone, no sibling and
    no krex: `turn_ms`; `queued_most_ms`, siblings turns: the GPU work a drain waits for when
    every sibling has just launched its turn as the gate closes (none launches more), the floor
    of an unpaced drain's worst case (queued work is not withdrawn)."""
    argv = [sys.executable, str(SIBLING), "turn", where, "-", str(kernels)]
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=READY_S)
    if p.returncode != 0:
        return {"turn_error": (p.stdout + p.stderr)[-800:]}
    ms = float(json.loads(p.stdout.strip().splitlines()[-1])["turn_ms"])
    return {"turn_ms": ms, "queued_most_ms": siblings * ms}


def _ready(p: subprocess.Popen[str], who: str, deadline: float) -> None:
    """Until p says "ready" (by `deadline`, else RuntimeError)."""
    assert p.stdout is not None
    left = deadline - time.monotonic()
    if left <= 0 or not select.select([p.stdout], [], [], left)[0]:
        raise RuntimeError(f"{who} did not start within {READY_S:g} s")
    line = p.stdout.readline().strip()
    if line != "ready":
        raise RuntimeError(f"{who} did not start (said {line!r}, status {p.poll()})")


def _until_waiting(sock: Path, env: dict[str, str], n: int, deadline: float) -> None:
    """Until n processes wait for memory on GPU 0 (`krex status`), or RuntimeError."""
    status = [sys.executable, "-m", "krex.cli", "status", "--json", "--socket", str(sock)]
    while True:
        p = subprocess.run(status, env=env, capture_output=True, text=True, timeout=60)
        if p.returncode == 0 and json.loads(p.stdout)["gpus"][0]["memory"]["waiting"] >= n:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{n} memory waiters not seen: {p.stdout[-500:]}{p.stderr[-500:]}")
        time.sleep(0.2)


def summarise(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per field p50, p95, max (ms); regions and how many were clean."""
    out: dict[str, Any] = {
        "regions": len(records),
        "clean": sum(bool(r.get("clean")) for r in records),
        "problems": sorted({p for r in records for p in r.get("problems", [])})[:10],
        "awake": max((int(r.get("awake", 0)) for r in records), default=0),
    }
    for f in FIELDS:
        out[f] = _ms([float(r.get(f, 0.0)) for r in records])
    for key, steps in STEPS.items():
        out[key] = {s: _ms([float(r.get(key, {}).get(s, 0.0)) for r in records]) for s in steps}
    return out


def _ms(seconds: list[float]) -> dict[str, float | None]:
    xs = sorted(1000 * x for x in seconds)
    return {"p50_ms": _q(xs, 0.5), "p95_ms": _q(xs, 0.95), "max_ms": xs[-1] if xs else None}


def _q(xs: list[float], q: float) -> float | None:
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else None


def _setting(k: dict[str, Any]) -> str:
    return f"{k['kind']:<10} {k.get('freeze', 'all'):<8} {k.get('pace_ms', 0.0):>5g}"


def table(kinds: list[dict[str, Any]]) -> str:
    head = f"{'kind':<10} {'freeze':<8} {'pace':>5} {'clean':>7} {'awake':>5} " + " ".join(
        f"{f[:-2] + ' p50/p95':>17}" for f in FIELDS
    )
    lines = [head]
    for k in kinds:
        what = _setting(k)
        if "regions" not in k:
            lines.append(f"{what} failed (rc {k['rc']})")
            continue
        cells = " ".join(f"{k[f]['p50_ms']:>8.1f}/{k[f]['p95_ms']:<8.1f}" for f in FIELDS)
        lines.append(f"{what} {k['clean']:>3}/{k['regions']:<3} {k['awake']:>5} {cells}")
    for k in kinds:
        if "turn_ms" in k and "regions" in k:
            lines.append(
                f"{k['kind']} ({k.get('freeze', 'all')}, pace {k.get('pace_ms', 0.0):g} ms): a "
                f"sibling's turn alone {k['turn_ms']:.1f} ms; {k['siblings']} siblings' most "
                f"queued work {k['queued_most_ms']:.1f} ms; drain p50/p95/max "
                f"{k['drain_s']['p50_ms']:.1f}/{k['drain_s']['p95_ms']:.1f}/"
                f"{k['drain_s']['max_ms']:.1f} ms; the siblings' turns a second "
                f"{k.get('sibling_turns_free_per_s')} with no region, "
                f"{k.get('sibling_turns_per_s')} during the owner's"
            )
    head = "step by step, p50/p95 ms (entry: the pin beside the others, audit and sample beside"
    lines += ["", f"{head} the grant; exit)"]
    names = [(key, s) for key, steps in STEPS.items() for s in steps]
    lines.append(f"{'kind':<10} {'freeze':<8} {'pace':>5} " + " ".join(
        f"{('exit ' if key.startswith('exit') else '') + s:>13}" for key, s in names
    ))  # fmt: skip
    for k in kinds:
        if "regions" in k and all(key in k for key in STEPS):
            cells = " ".join(
                f"{k[key][s]['p50_ms']:>6.1f}/{k[key][s]['p95_ms']:<6.1f}" for key, s in names
            )
            lines.append(f"{_setting(k)} {cells}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--sim", action="store_true", help="the simulated GPU (behaviour only)")
    ap.add_argument("--kinds", default=",".join(DEFAULT_KINDS))
    ap.add_argument("--siblings", type=int, default=7)
    ap.add_argument("--regions", type=int, default=30)
    ap.add_argument("--freeze", default="all", help="all, contexts or all,contexts")
    ap.add_argument("--pace-ms", default="0", help="regions.pace_ms, one or more (0: off)")
    args = ap.parse_args()
    kinds = [k for k in args.kinds.split(",") if k]
    if bad := [k for k in kinds if k not in KINDS]:
        ap.error(f"unknown kind(s) {', '.join(bad)} (known: {', '.join(KINDS)})")
    freezes = [f for f in args.freeze.split(",") if f]
    if not freezes or (bad := [f for f in freezes if f not in FREEZES]):
        ap.error(f"--freeze {args.freeze!r}: one or both of {', '.join(FREEZES)}")
    try:
        paces = [float(p) for p in args.pace_ms.split(",") if p]
    except ValueError:
        paces = []
    if not paces or any(not 0 <= p <= 1000 for p in paces):
        ap.error(f"--pace-ms {args.pace_ms!r}: milliseconds 0..1000, separated by commas")
    if args.sim:
        os.environ["LD_LIBRARY_PATH"] = str(sim_library_dir())
    results: list[dict[str, Any]] = []
    date = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    command = " ".join(["python3", "scripts/bench/region_entry.py", *sys.argv[1:]])
    with tempfile.TemporaryDirectory(prefix="krex-entry-") as d:
        memory_check.LOGS = args.json.parent
        for kind in kinds:
            for freeze, pace in [(f, p) for f in freezes for p in paces]:
                tmp = Path(d) / str(len(results))  # a setting given twice runs twice
                tmp.mkdir()
                results.append(
                    run_kind(kind, args.sim, args.siblings, args.regions, tmp, freeze, pace)
                )
                doc = {"date": date, "command": command, "sim": args.sim,
                       "siblings": args.siblings, "kinds": results}  # fmt: skip
                args.json.write_text(json.dumps(doc, indent=1))  # after each: nothing lost
    print(("SIMULATED GPU (behaviour only)\n" if args.sim else "") + table(results))
    return 0 if all(k["rc"] == 0 for k in results) else 1


if __name__ == "__main__":
    sys.exit(main())
