"""Every timer auto-regions cover, on a real GPU: does each read under krex beside 7 busy
siblings what it reads alone? Side by side in one invocation.

Each timer is one command (scripts/bench/timer_candidate.py: a seeded 4096^2 fp32 matmul timed
--calls times by that timer after one untimed call; the command's reading is the median of its
calls). The timers (TIMERS; --timers picks): triton.testing.do_bench and do_bench_cudagraph;
torch.utils.benchmark.Timer's timeit, blocked_autorange and adaptive_autorange; a plain
per-trial CUDA-event loop (krex/tenant/events.py's case); Triton's @triton.autotune with a
do_bench= of its own (its configurations' regions are candidates'); KernelBench's four timers
(cuda_event, do_bench, do_bench_impl, host_time: its get_timing_function's, 100 trials, their
mean) when its src/kernelbench/timing.py is given (--kernelbench-timing; default
.kb/eval/src/kernelbench/timing.py where kb_eval.py --populate made it), and Triton's Proton
timers when the installed triton is 3.8 or later. flashinfer's bench_gpu_time and Helion's
do_bench are selectable but in no default list: flashinfer 0.7.4 needs apache-tvm-ffi,
cuda-python and nvidia-cutlass-dsl, compiled wheels, and Helion 1.5.1 does not import on torch
2.11 (torch._inductor.runtime.triton_compat has no IntelGPUError there).

Modes (--modes, default alone,krex,repeat), each over every timer in the same order:
- alone: natively, one command at a time, no krex;
- krex: `krex run --auto-regions` to a private daemon of 8 slots (memory_check.daemon) beside 7
  busy siblings (sibling_matmul.py steady under `krex run --no-pool`), the daemon and siblings
  started once for the whole mode;
- repeat: natively again, the native repeat; COOL_S of idle first when it follows krex, so that
  the siblings' heat is not read as spread.
krex sits between the native runs so that a slow drift of the GPU moves it as it moves them.

Per timer: each mode's reading (ms), |krex - alone| and |repeat - alone| in %, `within` (krex's
difference at most the repeat's + MARGIN_PTS points: the issue's bar), the krex command's
regions from its `krex run --report` (seen, clean, candidates'), and `pass` (within, with
regions seen and every one clean).

Time: --budget-s (default 555 s, RESERVE_S of it kept for stopping and writing). Each mode gets a
deadline when it starts, its estimate's share of the time left (kb_memory.share_deadline), and
each command at most COMMAND_LIMIT_S; past either it is killed and recorded "not run". Every
command's record is appended to OUT/commands.jsonl as it ends and the results JSON rewritten
after each, so a run cut from outside keeps its data. Estimated, not measured: a native command
~10 s (import torch, CUDA start, 5 calls), a warm krex command ~6 s, the krex mode's start ~45 s:
with 11 timers about 330 s.

    python3 scripts/bench/timers_check.py --json OUT/timers_check.json [--timers A,B]
        [--modes alone,krex,repeat] [--calls 5] [--budget-s 555] [--kernelbench-timing PATH]

(`PARTS=timers bash scripts/gpu_check.sh`: TIMERS_LIST, TIMERS_KB_TIMING, TIMERS_BUDGET_S.)
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kb_memory  # scripts beside this one: commands killed at a deadline, budgets, reports
import memory_check

from krex.bench.runner import not_ready

ROOT = Path(__file__).resolve().parents[2]
CANDIDATE = ROOT / "scripts" / "bench" / "timer_candidate.py"
SIBLING = ROOT / "scripts" / "bench" / "sibling_matmul.py"
KB_TIMING = ROOT / ".kb" / "eval" / "src" / "kernelbench" / "timing.py"
BASE = ("do_bench", "do_bench_cudagraph", "timer_timeit", "timer_blocked_autorange",
        "timer_adaptive_autorange", "events", "autotune")  # fmt: skip
KB = ("kb_cuda_event", "kb_do_bench", "kb_do_bench_impl", "kb_host_time")
PROTON = ("do_bench_proton", "do_bench_cudagraph_proton")  # triton 3.8 and later
OPT_IN = ("flashinfer_bench_gpu_time", "helion_do_bench")  # not measurable on the H200 box
TIMERS = (*BASE, *KB, *PROTON, *OPT_IN)
MODES = ("alone", "krex", "repeat")
NATIVE = ("alone", "repeat")
SIBLINGS, SLOTS = 7, 8
MARGIN_PTS = 0.3  # krex may differ from alone by the native repeat's difference + this
RESERVE_S = 15.0  # of the budget: stopping the daemon and siblings, writing the results
COMMAND_LIMIT_S = 120.0  # one command at most (a hung one must not take the mode)
COOL_S = 5.0  # a native mode after krex: idle first
EST_S = {"alone": 10.0, "repeat": 10.0, "krex": 6.0}  # a command's seconds (estimates)
EST_START_S = {"krex": 45.0, "repeat": COOL_S}  # a mode's fixed start (estimates)


def triton_version() -> str | None:
    try:
        return importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        return None


def _at_least(version: str | None, major: int, minor: int) -> bool:
    try:
        parts = [int(x) for x in (version or "").split(".")[:2]]
    except ValueError:
        return False
    return len(parts) == 2 and (parts[0], parts[1]) >= (major, minor)


def default_timers(kb: bool, triton: str | None) -> list[str]:
    """Every timer measurable here: BASE, KB's with its timing.py, Proton's on triton 3.8+."""
    return [*BASE, *(KB if kb else ()), *(PROTON if _at_least(triton, 3, 8) else ())]


def pick_timers(spec: str | None, kb: bool, triton: str | None) -> list[str]:
    """--timers (comma-separated) or the default list.

    Raises:
        ValueError: an unknown timer, or a KernelBench timer without its timing.py.
    """
    if not spec:
        return default_timers(kb, triton)
    names = [t for t in spec.split(",") if t]
    unknown = [t for t in names if t not in TIMERS]
    if unknown or not names:
        raise ValueError(f"unknown timer(s) {', '.join(unknown) or '(none)'}: {', '.join(TIMERS)}")
    if not kb and any(t in KB for t in names):
        raise ValueError("KernelBench's timers need --kernelbench-timing (its timing.py)")
    return names


def pick_modes(spec: str) -> list[str]:
    """--modes: each of MODES at most once, alone among them.

    Raises:
        ValueError: an unknown or repeated mode, or no alone.
    """
    names = [m for m in spec.split(",") if m]
    if any(m not in MODES for m in names) or len(set(names)) != len(names):
        raise ValueError(f"--modes: each of {', '.join(MODES)} at most once")
    if "alone" not in names:
        raise ValueError("--modes: alone is the reference, it must run")
    return names


def command_argv(
    timer: str, mode: str, calls: int, sock: Path | None = None, report: Path | None = None
) -> list[str]:
    """A command's argv: the candidate natively, or under krex (`sock`, `report`) through
    `krex run --auto-regions` with its report."""
    argv = [sys.executable, str(CANDIDATE), timer, "--calls", str(calls)]
    if mode not in NATIVE:
        if sock is None or report is None:
            raise ValueError(f"mode {mode} runs through krex: a socket and a report are needed")
        argv = memory_check.krex_argv(argv, sock, report, auto_regions=True)
    return argv


def kb_lib(timing: Path, lib: Path) -> Path:
    """A `kernelbench` package under `lib` holding a copy of KernelBench's timing.py (what
    auto-regions wrap: kernelbench.timing); `lib` is put on the commands' PYTHONPATH."""
    pkg = lib / "kernelbench"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    shutil.copyfile(timing, pkg / "timing.py")
    return lib


def command_env(cache: Path, lib: Path | None) -> dict[str, str]:
    """memory_check's environment (no KREX_ variables; Triton and Inductor caches under
    `cache`, one for all commands: the autotuner's kernels compile once), `lib` first on
    PYTHONPATH."""
    env = memory_check.command_env(cache)
    if lib is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(lib), env.get("PYTHONPATH")) if p)
    return env


def region_fields(report: dict[str, Any]) -> dict[str, Any]:
    """A krex command's regions from its report: seen, clean, candidates'; kb_memory's summary
    besides."""
    s = kb_memory.krex_summary(report)
    regions = [x for x in report.get("regions") or [] if isinstance(x, dict)]
    return s | {"clean": s["regions"] - s["unclean"],
                "candidates": sum(bool(x.get("candidate")) for x in regions)}  # fmt: skip


def _pct(x: float, ref: float) -> float:
    return abs(x / ref - 1) * 100


def judge(timer: str, records: list[dict[str, Any]]) -> dict[str, Any]:
    """One timer's verdict from its records (any modes): each mode's reading (the median of its
    ok commands' readings), the differences, within and pass (the module's text)."""
    out: dict[str, Any] = {"timer": timer, "modes": {}}
    for r in records:
        if r.get("timer") != timer:
            continue
        m = out["modes"].setdefault(r["mode"], {"readings": [], "status": []})
        m["status"].append(r.get("status"))
        if r.get("status") == "ok":
            m["readings"].append(r["ms"])
        if isinstance(r.get("krex"), dict):
            m["regions"] = m.get("regions", 0) + r["krex"]["regions"]
            m["clean"] = m.get("clean", 0) + r["krex"]["clean"]
            m["candidates"] = m.get("candidates", 0) + r["krex"]["candidates"]
        if r.get("unavailable"):
            out["unavailable"] = r["unavailable"]
    ms = {k: statistics.median(v["readings"]) for k, v in out["modes"].items() if v["readings"]}
    for k, v in ms.items():
        out["modes"][k]["ms"] = v
    alone, krex, repeat = ms.get("alone"), ms.get("krex"), ms.get("repeat")
    out["krex_pct"] = None if not alone or krex is None else _pct(krex, alone)
    out["repeat_pct"] = None if not alone or repeat is None else _pct(repeat, alone)
    k = out["modes"].get("krex", {})
    out["regions"], out["regions_clean"] = k.get("regions"), k.get("clean")
    out["candidate_regions"] = k.get("candidates")
    if out["krex_pct"] is None or out["repeat_pct"] is None:
        out["within"] = out["pass"] = None
        return out
    # 1e-9: a difference exactly at the bar is within it, whatever the float rounding
    out["within"] = out["krex_pct"] <= out["repeat_pct"] + MARGIN_PTS + 1e-9
    regions_ok = bool(out["regions"]) and out["regions_clean"] == out["regions"]
    out["pass"] = out["within"] and regions_ok
    return out


def summarise(timers: list[str], records: list[dict[str, Any]]) -> dict[str, Any]:
    per = [judge(t, records) for t in timers]
    judged = [p for p in per if p["pass"] is not None]
    return {
        "timers": per,
        "passed": sum(bool(p["pass"]) for p in judged),
        "judged": len(judged),
        "all_pass": bool(judged) and len(judged) == len(timers) and all(p["pass"] for p in per),
    }


def _f(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def table(doc: dict[str, Any]) -> str:
    lines = [
        f"{'timer':26} {'alone ms':>9} {'repeat %':>8} {'krex %':>7} {'within':>6} "
        f"{'regions':>8} {'cand':>4}  pass"
    ]
    for p in doc["timers"]:
        alone = p["modes"].get("alone", {}).get("ms")
        regions = "-" if p["regions"] is None else f"{p['regions_clean']}/{p['regions']}"
        verdict = p.get("unavailable", "")[:40] if p["pass"] is None else str(p["pass"])
        lines.append(
            f"{p['timer']:26} {_f(alone, '.4f'):>9} {_f(p['repeat_pct'], '.3f'):>8} "
            f"{_f(p['krex_pct'], '.3f'):>7} {_f(p['within'], ''):>6} {regions:>8} "
            f"{_f(p['candidate_regions'], 'd'):>4}  {verdict}"
        )
    lines.append(
        f"(% = |mode - alone| / alone; within: krex % <= repeat % + {MARGIN_PTS}; regions: "
        f"clean/seen under krex; pass: within, regions seen and clean) {doc['passed']} of "
        f"{doc['judged']} judged pass"
    )
    return "\n".join(lines)


def mode_deadline(now: float, end: float, modes: list[str], k: int, n: int) -> float:
    """Mode k's deadline: its estimate's share of the time left (n timers a mode)."""
    est = [EST_START_S.get(m, 0.0) + n * EST_S[m] for m in modes]
    return kb_memory.share_deadline(now, end, est[k], sum(est[k + 1 :]))


@contextlib.contextmanager
def krex_phase(tmp: Path, env: dict[str, str], deadline: float) -> Iterator[Path]:
    """A private daemon of SLOTS slots and SIBLINGS busy siblings under it, both started by
    `deadline` (monotonic); yields its socket.

    Raises:
        RuntimeError: the daemon or a sibling did not start in time.
    """
    start_s = max(1.0, deadline - time.monotonic())
    with memory_check.daemon(tmp, SLOTS, start_s=start_s, stop_s=10) as sock:
        pre = [sys.executable, "-m", "krex.cli", "run", "--socket", str(sock), "--no-pool", "--"]
        sibs = [
            subprocess.Popen(
                [*pre, sys.executable, str(SIBLING), "steady"],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                start_new_session=True,
            )
            for _ in range(SIBLINGS)
        ]
        try:
            late = not_ready(sibs, timeout_s=max(1.0, deadline - time.monotonic()))
            if late:
                raise RuntimeError(f"{len(late)} of {SIBLINGS} siblings did not start")
            yield sock
        finally:
            for s in sibs:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(s.pid, signal.SIGKILL)
            for s in sibs:
                s.wait()


def run(
    timers: list[str],
    modes: list[str],
    json_path: Path,
    out_dir: Path,
    budget_s: float,
    calls: int = 5,
    timing: Path | None = None,
    head: dict[str, Any] | None = None,
    run_one: Callable[..., dict[str, Any]] = kb_memory.run_command,
) -> dict[str, Any]:
    """The modes one after another within the budget (the module's text); `run_one`:
    kb_memory.run_command's signature (a test's stand-in)."""
    t0 = time.monotonic()
    end = t0 + budget_s - RESERVE_S
    out_dir.mkdir(parents=True, exist_ok=True)
    memory_check.LOGS = out_dir  # the daemon's log
    log = kb_memory.Log(out_dir / "commands.jsonl")
    records: list[dict[str, Any]] = []
    doc: dict[str, Any] = dict(head or {}) | {"timers_run": timers, "modes_run": modes}
    doc |= {"budget_s": budget_s, "calls": calls}

    def write(partial: bool) -> None:
        doc.update(summarise(timers, records), partial=partial, records=records)
        json_path.write_text(json.dumps(doc, indent=1))

    def record(row: dict[str, Any]) -> None:
        records.append(row)
        log.write(row)
        mark = row.get("ms") or row.get("unavailable") or row.get("why") or row.get("error")
        print(f"   {row['mode']:6} {row['timer']:26} {row['status']:11} {mark}", flush=True)
        write(partial=True)

    with tempfile.TemporaryDirectory(prefix="krex-timers-") as d:
        tmp = Path(d)
        lib = kb_lib(timing, tmp / "lib") if timing is not None else None
        env = command_env(tmp / "cache", lib)
        for k, mode in enumerate(modes):
            now = time.monotonic()
            deadline = mode_deadline(now, end, modes, k, len(timers))
            print(f"== {mode}: {len(timers)} timers, {deadline - now:.0f} s", flush=True)
            logs, reports = out_dir / "logs" / mode, out_dir / "reports" / mode
            logs.mkdir(parents=True, exist_ok=True)
            reports.mkdir(parents=True, exist_ok=True)
            with contextlib.ExitStack() as stack:
                sock: Path | None = None
                try:
                    if mode == "krex":
                        sock = stack.enter_context(krex_phase(tmp, env, deadline))
                    elif k and modes[k - 1] == "krex":
                        time.sleep(min(COOL_S, max(0.0, deadline - time.monotonic())))
                except Exception as e:  # the mode is lost, not the run
                    doc.setdefault("mode_errors", {})[mode] = str(e)[-1500:]
                    for t in timers:
                        record({"mode": mode, "timer": t, "status": "not_run",
                                "why": "krex phase did not start"})  # fmt: skip
                    continue
                for t in timers:
                    row: dict[str, Any] = {"mode": mode, "timer": t}
                    start = time.monotonic()
                    if start >= deadline:
                        record(row | {"status": "not_run", "why": "budget (not started)"})
                        continue
                    report = reports / f"{t}.json"
                    argv = command_argv(t, mode, calls, sock, report)
                    cmd = kb_memory.Command(t, mode)
                    limit = min(deadline, start + COMMAND_LIMIT_S)
                    row |= run_one(cmd, argv, env, logs, limit, "ms")
                    res = row.get("result") or {}
                    if res.get("unavailable"):
                        row |= {"status": "unavailable", "unavailable": res["unavailable"]}
                    if sock is not None and report.exists():
                        with contextlib.suppress(ValueError, OSError):
                            row["krex"] = region_fields(json.loads(report.read_text()))
                    record(row)
    doc["wall_s"] = round(time.monotonic() - t0, 1)
    write(partial=False)
    return doc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, required=True, help="the results")
    ap.add_argument("--out", type=Path, help="logs and reports (default: beside --json)")
    ap.add_argument("--timers", help=f"comma-separated, of {', '.join(TIMERS)}")
    ap.add_argument("--modes", default=",".join(MODES), help="their order")
    ap.add_argument("--calls", type=int, default=5, help="readings a command")
    ap.add_argument("--budget-s", type=float, default=555.0)
    ap.add_argument(
        "--kernelbench-timing",
        type=Path,
        help=f"KernelBench's src/kernelbench/timing.py (default {KB_TIMING.relative_to(ROOT)} "
        "where it exists)",
    )
    args = ap.parse_args()
    timing = args.kernelbench_timing
    if timing is None and KB_TIMING.is_file():
        timing = KB_TIMING
    if timing is not None and not timing.is_file():
        ap.error(f"--kernelbench-timing: no file {timing}")
    if args.calls < 1 or args.budget_s <= RESERVE_S:
        ap.error(f"--calls 1 or more, --budget-s more than {RESERVE_S:g}")
    tv = triton_version()
    try:
        timers = pick_timers(args.timers, timing is not None, tv)
        modes = pick_modes(args.modes)
    except ValueError as e:
        ap.error(str(e))
    args.json.resolve().parent.mkdir(parents=True, exist_ok=True)
    out_dir = args.out or args.json.resolve().parent / "timers_check"
    head: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "command": "python3 scripts/bench/timers_check.py " + " ".join(sys.argv[1:]),
        "triton": tv,
        "kernelbench_timing": None if timing is None else str(timing),
    }
    print(f"timers: {', '.join(timers)}; modes: {', '.join(modes)}", flush=True)
    doc = run(timers, modes, args.json, out_dir, args.budget_s, args.calls, timing, head)
    print(table(doc), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
