"""Does where a timing's buffers land move it? KernelBench's reference timing again and again in one
process, natively, beside churned device memory, and through krex 8 at once (issue #52).

    python3 scripts/bench/placement_probe.py --json OUT.json [--kb .kb/eval] [--modes M,...]
        [--rounds 6] [--trials 100] [--subset N] [--budget-s 400]

Under krex 8 at once a KernelBench command's three timings of one model move apart, region by
region, on the GPU's side, where natively they move together (docs/kernelbench.md). KernelBench
returns memory to the driver inside its timer (`torch.cuda.empty_cache()` after the warm-up) and
makes fresh inputs for every timing, so each timing's buffers come from the driver anew; alone
on a GPU they come back where they were, beside others that allocate and free they need not.
Each process here times the kb_eval.py candidates' references (`kernelbench.timing.
measure_ref_program_time`, KernelBench's own: fresh model and inputs, its timer, cuda_event,
fp32) ROUNDS times each, round after round over its problems, and the spread of one problem's
timings within one process says how much a timing moves from one to the next. The modes:

- alone: one process, natively, all the problems (the native spread);
- churn: the same beside scripts/bench/mem_churn.py (7 CUDA contexts holding and churning device
  memory, no GPU work): placement alone;
- churn-hold: churn with `torch.cuda.empty_cache` made a no-op in the process, so its memory
  stays its own between timings: whether keeping it keeps the timings together;
- hold: alone with that no-op;
- krex1: one process through `krex run --auto-regions` on a private daemon of 1 slot (each
  timer a region, no sibling): krex's regions alone;
- krex8, krex8-hold, krex8-settle: 8 processes at once through a private daemon of 8 slots, each
  with PER_PROC problems (with 12 problems every one in two processes); krex8-hold with the
  no-op, krex8-settle with `regions.settle_s` SETTLE_S (each region idles that long, siblings
  frozen, where they worked on the GPU just before): the GPU's state after the siblings' work.

A mode's figures, from the rounds after the first (a process's first timing of a problem also
pays for first use): per (process, problem) the spread of its round means, (max - min) / median
in %, and the same of each round's fastest trial (the GPU's part, free of a slow trial); per
mode the median and p90 over them. Nothing starts past a mode's share of --budget-s; a process
stops starting timings at its deadline and keeps what it has. Without CUDA a process says so
and the mode has no figures. Each timing also keeps its inputs' device addresses (`ptrs`): with
the memory held the same address is the same memory; without, it need not be.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import kb_eval  # noqa: E402  (scripts beside this one)
import kb_memory  # noqa: E402
import memory_check  # noqa: E402

SETTLE_S = 0.5  # krex8-settle's regions.settle_s


class Mode(NamedTuple):
    procs: int  # processes at once
    churn: bool  # beside mem_churn.py
    hold: bool  # torch.cuda.empty_cache a no-op in each process
    slots: int  # through a private daemon of this many slots; 0: natively
    config: str = ""  # more of that daemon's configuration (TOML)


MODES: dict[str, Mode] = {
    "alone": Mode(1, False, False, 0),
    "churn": Mode(1, True, False, 0),
    "churn-hold": Mode(1, True, True, 0),
    "hold": Mode(1, False, True, 0),
    "krex1": Mode(1, False, False, 1),
    "krex8": Mode(8, False, False, 8),
    "krex8-hold": Mode(8, False, True, 8),
    "krex8-settle": Mode(8, False, False, 8, f"[regions]\nsettle_s = {SETTLE_S}\n"),
}
PER_PROC = 3  # problems per process when several run at once
STOP_GRACE_S = 20.0  # past its deadline a process has this long to finish its timing and leave


def spread_pct(xs: list[float]) -> float | None:
    """(max - min) / median of `xs` in %, or None for fewer than two."""
    if len(xs) < 2:
        return None
    mid = statistics.median(xs)
    return round(100.0 * (max(xs) - min(xs)) / mid, 3) if mid > 0 else None


def shares(problems: list[str], procs: int, per: int = PER_PROC) -> list[list[str]]:
    """Each process's problems: all of them for one, else `per` each, in turn."""
    if procs == 1:
        return [list(problems)]
    return [[problems[(k * per + j) % len(problems)] for j in range(per)] for k in range(procs)]


# ---- The measuring process. ----


def child(args: argparse.Namespace) -> int:
    """Times each of args.problems args.rounds times; writes its record to args.out."""
    deadline = time.monotonic() + args.deadline_s
    rec: dict[str, Any] = {"problems": args.problems, "hold": args.hold, "timings": []}
    out = Path(args.out)
    try:
        import torch

        rec["cuda"] = bool(torch.cuda.is_available())
    except ImportError:
        rec["cuda"] = False
    if not rec["cuda"]:
        out.write_text(json.dumps(rec))
        return 0
    sys.path.insert(0, str(Path(args.kb) / "src"))
    from kb_eval_candidate import StubFinder

    sys.meta_path.append(StubFinder())
    timing: Any = importlib.import_module("kernelbench.timing")
    if args.hold:  # KernelBench's empty_cache calls (in its timer) keep the memory now
        torch.cuda.empty_cache = lambda: None
    trials: list[list[float]] = []
    stats = timing.get_timing_stats

    def observed(elapsed_times: list[float], device: Any = None) -> Any:
        trials.append([float(t) for t in elapsed_times])
        return stats(elapsed_times, device=device)

    timing.get_timing_stats = observed
    ptrs: list[list[int]] = []  # each timing's inputs' device addresses: where they landed
    pick = timing.get_timing_function

    def picked(*a: Any, **k: Any) -> Any:
        fn = pick(*a, **k)

        def timed(kernel_fn: Any, args: list[Any], *more: Any, **kw: Any) -> Any:
            ptrs.append([int(x.data_ptr()) for x in args if hasattr(x, "data_ptr")])
            return fn(kernel_fn, args, *more, **kw)

        return timed

    timing.get_timing_function = picked
    sources = {p: (Path(args.kb) / "reference" / p).read_text() for p in args.problems}
    for r in range(args.rounds):
        for p in args.problems:
            if time.monotonic() >= deadline:
                rec["stopped"] = "deadline"
                out.write_text(json.dumps(rec))
                return 0
            n = len(trials)
            timing.measure_ref_program_time(
                ref_arch_name=p, ref_arch_src=sources[p], num_trials=args.trials,
                device=torch.device("cuda:0"), verbose=False, precision="fp32",
            )  # fmt: skip
            if len(trials) > n:
                ts = trials[-1]
                rec["timings"].append(
                    {"problem": p, "round": r, "mean_ms": sum(ts) / len(ts), "min_ms": min(ts),
                     "ptrs": ptrs[-1] if ptrs else []}
                )  # fmt: skip
    out.write_text(json.dumps(rec))
    return 0


# ---- The modes. ----


def argvs(name: str, args: argparse.Namespace, problems: list[str], logs: Path,
          deadline_s: float, sock: Path | None) -> list[list[str]]:  # fmt: skip
    """A mode's processes' command lines (through `krex run` at `sock` when there is one), each
    writing its record to logs/proc-K.json."""
    hold = MODES[name].hold
    out = []
    for k, mine in enumerate(shares(problems, MODES[name].procs)):
        argv = [sys.executable, str(Path(__file__).resolve()), "--child", "--kb", str(args.kb),
                "--rounds", str(args.rounds), "--trials", str(args.trials),
                "--deadline-s", str(round(max(1.0, deadline_s), 1)),
                "--out", str(logs / f"proc-{k}.json"), *(["--hold"] if hold else []),
                "--problems", *mine]  # fmt: skip
        if sock is not None:
            argv = memory_check.krex_argv(argv, sock, logs / f"report-{k}.json", auto_regions=True)
        out.append(argv)
    return out


def run_mode(name: str, args: argparse.Namespace, problems: list[str], out_dir: Path,
             tmp: Path, budget_s: float) -> dict[str, Any]:  # fmt: skip
    """One mode: its processes (natively, or through a daemon of 8 slots), their records."""
    m = MODES[name]
    t0 = time.monotonic()
    mode: dict[str, Any] = {"mode": name, "procs": []}
    logs = out_dir / "logs" / name
    logs.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        sock: Path | None = None
        try:
            if m.slots:
                sock = stack.enter_context(
                    memory_check.daemon(tmp, m.slots, start_s=max(1.0, budget_s / 2), stop_s=10,
                                        tag=f"placement-{name}", config=m.config)
                )  # fmt: skip
            if m.churn:
                script = [str(kb_memory.MEM_CHURN), "--out", str(out_dir / f"churn-{name}.json")]
                mode["churn"] = stack.enter_context(
                    kb_memory.beside(script, out_dir / f"churn-{name}.json")
                )
        except Exception as e:  # the mode is lost, not the run
            mode["error"] = str(e)[-1500:]
            return mode
        left = budget_s - (time.monotonic() - t0)

        def one(k: int, argv: list[str]) -> dict[str, Any]:
            env = memory_check.command_env(tmp / f"{name}-{k}")
            with open(logs / f"proc-{k}.log", "wb") as log:
                rc, killed = kb_memory.run_to_deadline(
                    argv, env, log, subprocess.STDOUT, t0 + budget_s
                )
            got: dict[str, Any]
            try:
                got = json.loads((logs / f"proc-{k}.json").read_text())
            except (OSError, ValueError) as e:
                got = {"error": f"no record ({e})"}
            return got | {"proc": k, "rc": "killed" if killed else rc}

        cmds = argvs(name, args, problems, logs, left - STOP_GRACE_S, sock)
        with ThreadPoolExecutor(len(cmds)) as pool:
            mode["procs"] = list(pool.map(one, range(len(cmds)), cmds))
        for k, got in enumerate(mode["procs"]):
            report = logs / f"report-{k}.json"
            if report.exists():
                with contextlib.suppress(OSError, ValueError):
                    got["krex"] = kb_memory.krex_summary(json.loads(report.read_text()))
    mode["wall_s"] = round(time.monotonic() - t0, 1)
    return mode | figures(mode["procs"])


def figures(procs: list[dict[str, Any]]) -> dict[str, Any]:
    """A mode's spreads: per (process, problem), then the median and p90 over them."""
    per: list[dict[str, Any]] = []
    for p in procs:
        for prob in p.get("problems") or []:
            ts = [t for t in p.get("timings") or [] if t["problem"] == prob and t["round"] > 0]
            a, b = spread_pct([t["mean_ms"] for t in ts]), spread_pct([t["min_ms"] for t in ts])
            if a is not None and b is not None:
                per.append({"proc": p.get("proc"), "problem": prob, "n": len(ts),
                            "spread_pct": a, "fastest_spread_pct": b})  # fmt: skip
    n = sum(len(p.get("timings") or []) for p in procs)
    out: dict[str, Any] = {"spreads": per, "timings": n}
    for key in ("spread_pct", "fastest_spread_pct"):
        xs = sorted(x[key] for x in per)
        out[key] = {"p50": kb_memory._q(xs, 0.5), "p90": kb_memory._q(xs, 0.9)} if xs else None
    return out


def table(doc: dict[str, Any]) -> str:
    """The modes' figures, one line each (recomputed from the processes' records)."""
    lines = [f"{'mode':12} {'timings':>7} {'wall s':>7} {'spread p50%':>11} {'p90%':>6} "
             f"{'fastest p50%':>12} {'p90%':>6}  notes"]  # fmt: skip
    for m in doc["modes"]:
        m = m | figures(m.get("procs") or [])  # today's rule, for an earlier run's record too
        s, f = m.get("spread_pct") or {}, m.get("fastest_spread_pct") or {}

        def v(d: dict[str, Any], k: str) -> str:
            return "-" if d.get(k) is None else f"{d[k]:.2f}"

        notes = m.get("error") or ("no CUDA" if m.get("procs") and not any(
            p.get("cuda") for p in m["procs"]) else "")  # fmt: skip
        if not notes and m.get("timings") and not m.get("spreads"):
            # A spread needs a problem timed in two rounds after its first: say why none was.
            cut = any(p.get("stopped") == "deadline" for p in m.get("procs") or [])
            notes = "no spread: " + ("cut by its share of --budget-s" if cut else "too few rounds")
        lines.append(f"{m['mode']:12} {m.get('timings', 0):7d} {m.get('wall_s', 0):7.1f} "
                     f"{v(s, 'p50'):>11} {v(s, 'p90'):>6} {v(f, 'p50'):>12} {v(f, 'p90'):>6}  "
                     f"{notes[:60]}")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="the results (required unless --child)")
    ap.add_argument("--kb", type=Path, default=Path(".kb/eval"), help="kb_eval.py --populate's")
    ap.add_argument("--modes", default="alone,churn,churn-hold,krex8,krex8-hold")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--trials", type=int, default=100, help="KernelBench's timer's trials")
    ap.add_argument("--subset", type=int, help="only the first N of kb_eval.py's candidates")
    ap.add_argument("--budget-s", type=float, default=400.0)
    ap.add_argument("--table", type=Path, help="print an earlier run's table and exit")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--hold", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--deadline-s", type=float, default=1e9, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--problems", nargs="*", default=[], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)
    if args.table:
        print(table(json.loads(args.table.read_text())))
        return 0
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes or args.json is None or args.rounds < 3 or args.trials < 1:
        ap.error(f"--json is required, --rounds at least 3, --trials at least 1, --modes from "
                 f"{', '.join(MODES)} (got {', '.join(bad) or args.modes!r})")  # fmt: skip
    if args.budget_s <= 0 or (args.subset is not None and args.subset < 1):
        ap.error("--budget-s must be above 0 and --subset at least 1")
    names = kb_eval.CANDIDATES[: args.subset]
    missing = [n for n in names if not (args.kb / "reference" / n).is_file()]
    if missing:
        ap.error(f"{args.kb}/reference lacks {missing[0]} (run kb_eval.py --populate first)")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    memory_check.LOGS = args.json.resolve().parent
    out_dir = args.json.resolve().parent / "placement"
    doc: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                           "command": sys.argv, "problems": list(names), "modes": []}  # fmt: skip
    end = time.monotonic() + args.budget_s
    with tempfile.TemporaryDirectory(prefix="krex-placement-") as tmp:
        for i, name in enumerate(modes):
            share = (end - time.monotonic()) / (len(modes) - i)
            print(f"== {name}: {share:.0f} s", flush=True)
            doc["modes"].append(run_mode(name, args, list(names), out_dir, Path(tmp), share))
            args.json.write_text(json.dumps(doc, indent=1))
    print(table(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
