"""`krex bench run`: one workload suite in several modes, side by side, in one run.

Modes: `exclusive` (one command at a time without krex: today's command-granular baseline, run
twice so that the second run, `native_repeat`, shows the native noise), `shared` (C at once, no
protection), `krex` (C at once through `krex run`, timed parts in regions, Python commands in
warm pool workers where the daemon has a pool), `krex-cold` (the same with the pool off: every
command its own process), `krex-settle` (krex with `krex run --settle S`: each region idles S
seconds after the freeze where the siblings worked lately, what that costs and buys),
`krex-mps` (krex whose daemon runs its own MPS control daemon, `krex daemon --mps`: the
commands' work outside regions shares the SMs at once instead of in time slices; ignored on the
simulated GPU, and results.json's `mps` says whether it was in effect) and `krex-serial` (one at
a time through krex). The krex modes use a
private daemon on a socket of their own.

A command that exits non-zero, runs past COMMAND_TIMEOUT_S or prints no JSON result line is a
failure of its mode, counted and listed (`metrics.Failure`), not an abort: under sharing a
command may die of out-of-memory only because it shared the GPU, and the bench must show that.
Only an exclusive run in which every command failed is an error: there is nothing to compare.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.progress import Progress

from krex.bench import SETTLE_S
from krex.bench.metrics import Failure, Measurement, ModeRun, RegionTimes, summarize
from krex.bench.suite import Command, commands
from krex.client.run import ClientError, private_daemon, status
from krex.core.errors import KrexError
from krex.core.nvml import Nvml
from krex.core.paths import sim_library_dir

MODES = ("exclusive", "shared", "krex", "krex-cold", "krex-settle", "krex-mps", "krex-serial")
COMMAND_TIMEOUT_S = 600.0
REASON_CHARS = 200  # a failure's reason: the last line of its stderr, at most this long
STDERR_TAIL = 1500  # how much of a failed command's stderr an error message shows

# Device out-of-memory as PyTorch (torch.cuda.OutOfMemoryError, "CUDA out of memory"), the driver
# (CUDA_ERROR_OUT_OF_MEMORY), HIP (hipErrorOutOfMemory) and others ("out of memory") say it.
_OOM = re.compile(r"out[ _]?of[ _]?memory", re.IGNORECASE)


class BenchError(KrexError):
    """The benchmark could not run; the message says why."""


@dataclass
class Outcome:
    cmd: Command
    median_ms: float
    wall_s: float
    regions: list[RegionTimes]
    output: dict[str, Any]  # the rest of the command's JSON line (setup time, clock, ...)
    region_clocks: list[list[int]]  # per region, [SM MHz at grant, at end], where recorded
    pool: str | None  # krex modes: "warm" or "cold"
    memory: dict[str, Any] | None = None  # krex modes: the report's `memory` (docs/memory.md)
    attempts: int = 0  # krex modes: earlier runs krex made after a sharing-induced out-of-memory


@dataclass
class Failed:
    """A command of a batch that produced no result (see `metrics.Failure`)."""

    cmd: Command
    status: int | None  # None: killed after COMMAND_TIMEOUT_S
    wall_s: float
    oom: bool
    reason: str
    attempts: int
    stderr_tail: str

    def describe(self) -> str:
        """'CMD failed with status 1' (or timed out, or printed no result), for an error."""
        if self.status is None:
            what = f"timed out after {COMMAND_TIMEOUT_S:g} s"
        elif self.status == 0:
            what = "exited 0 but printed no JSON result line"
        else:
            what = f"failed with status {self.status}"
        return f"{shlex.join(self.cmd.argv)} {what}"


def parse_modes(text: str) -> list[str]:
    """'exclusive,shared,krex' -> the modes to run, in the order given (exclusive required)."""
    modes = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise BenchError(f"unknown mode(s) {', '.join(bad)} (choose from {', '.join(MODES)})")
    if "exclusive" not in modes:
        raise BenchError("--modes must include exclusive: it is the baseline of every metric")
    return list(dict.fromkeys(modes))


def _plain_env(sim_shm: str | None) -> dict[str, str]:
    """A command's environment outside krex: no shim, no tenant (markers are no-ops); on the
    simulated GPU, a simulated driver of its own (`sim_shm`)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KREX_")}
    env.pop("LD_PRELOAD", None)
    if sim_shm is not None:
        env["LD_LIBRARY_PATH"] = f"{sim_library_dir()}:{env.get('LD_LIBRARY_PATH', '')}"
        env["KREX_SIM_SHM"] = sim_shm
    return env


def fresh_caches(env: dict[str, str], directory: Path) -> dict[str, str]:
    """env with compile caches of its own: each command compiles as a new candidate would."""
    return env | {
        "TRITON_CACHE_DIR": str(directory / "triton"),
        "TORCHINDUCTOR_CACHE_DIR": str(directory / "inductor"),
    }


def slice_config(spec: str, path: Path) -> Path:
    """A daemon configuration at `path` that gives GPU 0 the CPU slice `spec`, REGION/SHARED
    as two CPU lists (e.g. "12-15/0-11"), for the GPU scripts that compare where a region's
    owner runs; ValueError (one sentence) for anything else. The lists themselves are checked
    by the daemon that reads it (KREX_CONFIG)."""
    region, sep, shared = spec.partition("/")
    if not sep or not region.strip() or not shared.strip() or '"' in spec:
        raise ValueError(f"{spec!r} is not REGION/SHARED (two CPU lists such as 12-15/0-11)")
    path.write_text(f'[slices.0]\nregion = "{region.strip()}"\nshared = "{shared.strip()}"\n')
    return path


@dataclass(frozen=True)
class Timed:
    """One command's run (`run_timed`): its exit status, its wall time until it returned (s),
    the last JSON line of its stdout (None: none), its stderr, and its `krex run --report`
    (None: it ran natively, or wrote none)."""

    rc: int
    wall_s: float
    result: dict[str, Any] | None
    stderr: str
    report: dict[str, Any] | None


def _first_line(stream: Any, into: list[str]) -> None:
    into.append(stream.readline())


def not_ready(
    procs: Sequence[subprocess.Popen[str]], timeout_s: float = 180.0, word: str = "ready"
) -> list[subprocess.Popen[str]]:
    """Those of `procs` (text stdout pipes) whose first line was not `word` within `timeout_s`
    in all; [] when every one said it. Each line is read in a thread, so that a process that
    hangs before its first line cannot hang the caller (which kills what this returns)."""
    deadline = time.monotonic() + timeout_s
    late: list[subprocess.Popen[str]] = []
    for p in procs:
        line: list[str] = []
        if p.stdout is not None:
            reader = threading.Thread(target=_first_line, args=(p.stdout, line), daemon=True)
            reader.start()
            reader.join(max(0.0, deadline - time.monotonic()))
        if not line or line[0].strip() != word:
            late.append(p)
    return late


def run_timed(
    argv: Sequence[str], tmp: Path, tag: str, *, sock: Path | None, warm: bool, timeout: float
) -> Timed:
    """Run argv once with fresh compile caches under tmp (named by tag): natively, or through
    `krex run` on the daemon at sock (with --no-pool unless warm), as the GPU scripts under
    scripts/bench/ compare them. subprocess.TimeoutExpired past timeout."""
    report = tmp / f"{tag}.json"
    if sock is not None:
        pre = [sys.executable, "-m", "krex.cli", "run", "--socket", str(sock), "--report"]
        argv = [*pre, str(report), *([] if warm else ["--no-pool"]), "--", *argv]
    env = fresh_caches(dict(os.environ), tmp / f"cache-{tag}")
    t0 = time.monotonic()
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.monotonic() - t0
    lines = [x for x in p.stdout.splitlines() if x.startswith("{")]
    return Timed(
        rc=p.returncode,
        wall_s=wall,
        result=json.loads(lines[-1]) if lines else None,
        stderr=p.stderr,
        report=json.loads(report.read_text()) if report.exists() else None,
    )


def _machine(simulated: bool) -> str:
    """This host, its cores and (on a real GPU, where NVML answers) the GPU's name."""
    text = f"{platform.node()} ({os.cpu_count()} cores)"
    if simulated:
        return text + ", simulated GPU"
    nvml = Nvml.open()
    if nvml is not None:
        described = nvml.describe(0)
        nvml.close()
        if described:
            text += f", {described}"
    return text


_PREFLIGHT = """
import sys
try:
    import torch, triton
except ImportError as e:
    sys.exit(f"cannot import {e.name}")
if not torch.cuda.is_available():
    sys.exit("PyTorch sees no CUDA GPU")
"""


def _preflight(profile: str) -> None:
    """One clear error, before anything runs, where the real-GPU suite cannot run."""
    try:
        p = subprocess.run(
            [sys.executable, "-c", _PREFLIGHT],
            env=_plain_env(None),
            capture_output=True,
            text=True,
            timeout=300,
        )
    except subprocess.TimeoutExpired:
        raise BenchError(f"the {profile} profile: importing torch took over 300 s") from None
    if p.returncode != 0:
        why = (p.stderr.strip().splitlines() or [f"status {p.returncode}"])[-1]
        raise BenchError(
            f"the {profile} profile needs PyTorch, Triton and a CUDA GPU ({why}); "
            "use --profile tiny for the simulated GPU"
        )


def _result_line(out: str) -> dict[str, Any] | None:
    """The command's result: the last stdout line that is a JSON object with a positive, finite
    `median_ms`; None when there is none."""
    for text in reversed(out.splitlines()):
        try:
            line = json.loads(text)
        except ValueError:
            continue
        if not isinstance(line, dict):
            continue
        median = line.get("median_ms")
        if (
            isinstance(median, (int, float))
            and not isinstance(median, bool)
            and math.isfinite(median)
            and median > 0
        ):
            return line
    return None


def _read_report(path: Path) -> dict[str, Any]:
    """A `krex run --report` document; {} when krex wrote none (it could not do its part) or it
    cannot be read."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def out_of_memory(stderr: str, memory: object = None) -> bool:
    """Whether a failed command died of device out-of-memory: its stderr says so (PyTorch's
    OutOfMemoryError and "CUDA out of memory", CUDA_ERROR_OUT_OF_MEMORY, hipErrorOutOfMemory,
    "out of memory"), or its krex report's `memory` counts out-of-memory errors, alone or shared."""
    if _OOM.search(stderr):
        return True
    if not isinstance(memory, dict):
        return False
    return any(
        isinstance(memory.get(k), (int, float)) and memory[k] > 0
        for k in ("oom_alone", "oom_shared")
    )


def _attempts(report: dict[str, Any]) -> int:
    """How many earlier runs of the command krex made (the report's `attempts` list)."""
    attempts = report.get("attempts")
    return len(attempts) if isinstance(attempts, list) else 0


def _reason(err: str, status: int | None) -> str:
    """One line saying why a command failed (`status` None: it timed out): the last non-empty
    line of its stderr, after what the runner saw where the status does not say it; at most
    REASON_CHARS."""
    last = next((ln.strip() for ln in reversed(err.splitlines()) if ln.strip()), "")
    if status is None:
        why = f"timed out after {COMMAND_TIMEOUT_S:g} s"
    elif status == 0:
        why = "printed no JSON result line"
    else:
        why = last or f"exit status {status}"
        last = ""
    text = f"{why}: {last}" if last else why
    return text if len(text) <= REASON_CHARS else text[: REASON_CHARS - 3] + "..."


@dataclass(frozen=True)
class _Launcher:
    """How a batch starts its commands: as they are, or through `krex run` on `krex_socket`
    (on `gpu` when given, with `settle_s` as every region's settle when given)."""

    env: dict[str, str]
    krex_socket: Path | None
    no_pool: bool
    tmp: Path
    label: str
    gpu: int | None
    settle_s: float | None

    def start(self, i: int, cmd: Command) -> tuple[subprocess.Popen[str], float, Path]:
        """The batch's `i`th command started: its process, when, and where its report goes."""
        report = self.tmp / f"{self.label}-{i}.json"
        argv = list(cmd.argv)
        if self.krex_socket is not None:
            argv = self._krex_run(cmd, self.krex_socket, report)
        p = subprocess.Popen(
            argv,
            env=fresh_caches(self.env, self.tmp / "cache" / f"{self.label}-{i}"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        return p, time.monotonic(), report

    def _krex_run(self, cmd: Command, socket: Path, report: Path) -> list[str]:
        settle = self.settle_s
        return [
            sys.executable,
            "-m",
            "krex.cli",
            "run",
            *(["--sim"] if cmd.simulated else []),
            *(["--no-pool"] if self.no_pool else []),
            *(["--gpu", str(self.gpu)] if self.gpu is not None else []),
            # krex-settle: every region's settle is S, the power-capped rule's too
            # (0: krex with no settle at all, as before regions.capped_settle_s).
            *(["--settle", f"{settle:g}", "--capped-settle", f"{settle:g}"] if settle is not None
              else []),
            # Autotuners' and harness timers' timings in regions too, as a user who wants them
            # protected runs (docs/bench.md); the simulated commands have none.
            *([] if cmd.simulated else ["--auto-regions"]),
            "--socket",
            str(socket),
            "--report",
            str(report),
            "--",
            *cmd.argv,
        ]  # fmt: skip


def _batch(
    cmds: Sequence[Command],
    concurrency: int,
    env: dict[str, str],
    krex_socket: Path | None,
    no_pool: bool,
    tmp: Path,
    progress: Progress,
    label: str,
    gpu: int | None = None,
    failures: list[Failed] | None = None,
    settle_s: float | None = None,
) -> tuple[float, list[Outcome]]:
    """Run cmds, at most `concurrency` at once (through krex on `gpu` when given); returns
    (wall time, outcomes of the commands that succeeded, in suite order).

    A command fails when it exits non-zero, runs past COMMAND_TIMEOUT_S (it is killed) or prints
    no JSON result line. With `failures`, each failure is appended to it, in suite order, and
    the batch goes on; without, the first one raises BenchError.
    """
    launcher = _Launcher(env, krex_socket, no_pool, tmp, label, gpu, settle_s)
    task = progress.add_task(label, total=len(cmds))
    pending = deque(enumerate(cmds))
    running: dict[int, tuple[subprocess.Popen[str], float, Path]] = {}
    results: dict[int, Outcome] = {}
    failed: dict[int, Failed] = {}
    killed: set[int] = set()
    t0 = time.monotonic()
    try:
        while pending or running:
            while pending and len(running) < concurrency:
                i, cmd = pending.popleft()
                running[i] = launcher.start(i, cmd)
            time.sleep(0.005)
            for i, (p, started, report) in list(running.items()):
                if p.poll() is None:
                    if time.monotonic() - started > COMMAND_TIMEOUT_S and i not in killed:
                        p.kill()
                        killed.add(i)
                    continue
                del running[i]
                out, err = p.communicate()
                wall = time.monotonic() - started
                progress.advance(task)
                report_doc = _read_report(report) if krex_socket is not None else {}
                status = None if i in killed else p.returncode
                done = _finished(cmds[i], status, out, err, wall, report_doc)
                if isinstance(done, Outcome):
                    results[i] = done
                    continue
                failed[i] = done
                if failures is None:
                    raise BenchError(f"{done.describe()}:\n{done.stderr_tail}")
    finally:
        for p, _, _ in running.values():
            p.kill()
    if failures is not None:
        failures += [failed[i] for i in sorted(failed)]
    return time.monotonic() - t0, [results[i] for i in sorted(results)]


def _finished(
    cmd: Command, status: int | None, out: str, err: str, wall: float, report: dict[str, Any]
) -> Outcome | Failed:
    """What a command that ended gave (`status` None: it was killed, having run too long), with
    its krex report (empty when it ran without krex)."""
    memory = report.get("memory")
    memory = memory if isinstance(memory, dict) else None
    line = _result_line(out) if status == 0 else None
    if line is None:
        return Failed(
            cmd=cmd,
            status=status,
            wall_s=wall,
            oom=out_of_memory(err, memory),
            reason=_reason(err, status),
            attempts=_attempts(report),
            stderr_tail=err[-STDERR_TAIL:],
        )
    region_docs = report.get("regions") or []
    clocks = [r["sm_clock_mhz"] for r in region_docs if "sm_clock_mhz" in r]
    regions = [
        RegionTimes(
            wait_s=r["wait_s"],
            drain_s=r["drain_s"],
            freeze_s=r["freeze_s"],
            duration_s=r["duration_s"],
            clean=r["clean"],
            warnings=tuple(w["name"] for w in r.get("warnings", [])),
            settle_s=r.get("settle_s", 0.0),
            settle_capped=r.get("settle_capped") is True,
            candidate=r.get("candidate") is True,
        )
        for r in region_docs
    ]
    rest = {k: v for k, v in line.items() if k not in ("task", "variant", "median_ms")}
    pool = report.get("pool")
    return Outcome(
        cmd, float(line["median_ms"]), wall, regions, rest, clocks, pool, memory, _attempts(report)
    )


def _memory_wait(memory: dict[str, Any] | None) -> float | None:
    """A report's memory wait in seconds, None without one."""
    wait = (memory or {}).get("wait_s")
    if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not math.isfinite(wait):
        return None
    return max(0.0, float(wait))


def _mode_run(mode: str, wall: float, outcomes: list[Outcome], failed: list[Failed]) -> ModeRun:
    return ModeRun(
        mode=mode,
        wall_s=wall,
        measurements=tuple(
            Measurement(
                task=o.cmd.task,
                variant=o.cmd.variant,
                median_ms=o.median_ms,
                wall_s=o.wall_s,
                region_s=sum(r.duration_s for r in o.regions),
                regions=tuple(o.regions),
                memory_wait_s=_memory_wait(o.memory),
            )
            for o in outcomes
        ),
        failures=tuple(
            Failure(
                task=f.cmd.task,
                variant=f.cmd.variant,
                status=f.status,
                oom=f.oom,
                reason=f.reason,
                wall_s=f.wall_s,
                attempts=f.attempts,
            )
            for f in failed
        ),
    )


def failure_lines(results: dict[str, Any]) -> list[str]:
    """One line per mode with failures: 'krex: 2 of 24 commands failed (2 out of memory, 0 only
    when shared)'."""
    lines = []
    for mode, m in results["modes"].items():
        if m["failed"]:
            lines.append(
                f"{mode}: {m['failed']} of {m['commands']} commands failed "
                f"({m['failed_oom']} out of memory, {m['failed_only_when_shared']} only when "
                "shared)"
            )
    return lines


def run(
    modes: list[str],
    concurrency: int,
    out_dir: Path,
    profile: str,
    command: str,
    tasks: Sequence[str] | None = None,
    pool: int | None = None,
    settle_s: float = SETTLE_S,
) -> dict[str, Any]:
    """Run the suite (only `tasks` when given) in every mode, write DIR/results.json and the
    report; return the results. `settle_s`: the krex-settle mode's `krex run --settle`."""
    if concurrency < 1:
        raise BenchError(f"--concurrency must be at least 1, got {concurrency}")
    cmds = commands(profile, tasks)
    simulated = any(c.simulated for c in cmds)
    if not simulated:
        _preflight(profile)
    out_dir.mkdir(parents=True, exist_ok=True)
    runs, records, mps = _run_modes(cmds, modes, concurrency, pool, settle_s)
    results: dict[str, Any] = dict(
        summarize(
            runs,
            machine=_machine(simulated),
            date=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            command=command,
            concurrency=concurrency,
        )
    )
    results["commands"] = records
    results["simulated"] = simulated
    results["profile"] = profile
    results["tasks"] = sorted({c.task for c in cmds})
    results["pool"] = pool
    if "krex-settle" in runs:
        results["settle_s"] = settle_s
    if mps:
        results["mps"] = mps
    (out_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    render_report(results, out_dir)
    for line in failure_lines(results):
        print(line, file=sys.stderr)
    return results


def _run_modes(
    cmds: list[Command], modes: list[str], concurrency: int, pool: int | None, settle_s: float
) -> tuple[dict[str, ModeRun], list[dict[str, Any]], dict[str, bool]]:
    """Every mode's batch: the runs, results.json's `commands` records, and per krex-mps run
    whether its daemon ran MPS."""
    simulated = any(c.simulated for c in cmds)
    runs: dict[str, ModeRun] = {}
    records: list[dict[str, Any]] = []
    mps: dict[str, bool] = {}  # krex-mps: whether its daemon ran MPS (never on a simulated GPU)
    with tempfile.TemporaryDirectory(prefix="krex-bench-") as tmp_name, Progress() as progress:
        tmp = Path(tmp_name)
        sim_shm = f"/krex-bench-{os.getpid()}-plain" if simulated else None
        try:
            for name, c, through_krex in _plan(modes, concurrency):
                failed: list[Failed] = []
                if through_krex:
                    wall, outcomes = _krex_mode(
                        name, cmds, c, tmp, progress, failed, pool, settle_s, mps
                    )
                else:
                    env = _plain_env(sim_shm)
                    wall, outcomes = _batch(
                        cmds, c, env, None, False, tmp, progress, name, failures=failed
                    )
                if name == "exclusive" and failed and not outcomes:
                    raise BenchError(
                        f"every command failed in the exclusive run, the baseline; the first, "
                        f"{failed[0].describe()}:\n{failed[0].stderr_tail}"
                    )
                runs[name] = _mode_run(name, wall, outcomes, failed)
                records += [_record(name, o) for o in outcomes]
        except ClientError as e:
            raise BenchError(str(e)) from e
        finally:
            if sim_shm is not None:
                with contextlib.suppress(FileNotFoundError):
                    Path("/dev/shm", sim_shm.lstrip("/")).unlink()
    return runs, records, mps


def _plan(modes: list[str], concurrency: int) -> list[tuple[str, int, bool]]:
    """(mode name in the results, concurrency, whether through krex) per batch to run: the
    exclusive mode is two batches (its repeat says how much one-at-a-time timings vary)."""
    plan: list[tuple[str, int, bool]] = []
    for m in modes:
        if m == "exclusive":
            plan += [("exclusive", 1, False), ("native_repeat", 1, False)]
        else:
            plan.append((m, 1 if m == "krex-serial" else concurrency, m.startswith("krex")))
    return plan


def _krex_mode(
    name: str,
    cmds: Sequence[Command],
    concurrency: int,
    tmp: Path,
    progress: Progress,
    failed: list[Failed],
    pool: int | None,
    settle_s: float,
    mps: dict[str, bool],
) -> tuple[float, list[Outcome]]:
    """One krex mode's batch, on a daemon of its own (for krex-mps, whether it ran MPS goes into
    `mps`)."""
    # krex: the daemon's default pool (as many warm workers as slots on a real GPU);
    # krex-cold: none, and every command its own process. One GPU, also on a node of several:
    # the baselines run on device 0 only.
    cold = name == "krex-cold"
    with private_daemon(
        tmp / name,
        sim=any(c.simulated for c in cmds),
        slots=max(concurrency, 1),
        pool=0 if cold else pool,
        gpus=1,
        mps=name == "krex-mps",
    ) as sock:
        if name == "krex-mps":
            mps[name] = bool(status(False, str(sock)).get("mps"))
        return _batch(
            cmds,
            concurrency,
            dict(os.environ),
            sock,
            cold,
            tmp,
            progress,
            name,
            failures=failed,
            settle_s=settle_s if name == "krex-settle" else None,
        )


def _record(mode: str, o: Outcome) -> dict[str, Any]:
    """A command's entry in results.json's `commands`."""
    return {
        "mode": mode,
        "task": o.cmd.task,
        "variant": o.cmd.variant,
        "median_ms": o.median_ms,
        "wall_s": o.wall_s,
        "region_s": sum(r.duration_s for r in o.regions),
        "regions": len(o.regions),
        "settle_s": sum(r.settle_s for r in o.regions),
        **({"region_records": [r.record() for r in o.regions]} if o.regions else {}),
        "output": o.output,
        **({"pool": o.pool} if o.pool else {}),
        **({"region_sm_clock_mhz": o.region_clocks} if o.region_clocks else {}),
        **({"memory": o.memory} if o.memory is not None else {}),
        **({"attempts": o.attempts} if o.attempts else {}),
    }


def render_report(results: dict[str, Any], out_dir: Path) -> list[Path]:
    """report.md and the plots, from results.json's content."""
    from krex.bench.report import render

    return render(results, out_dir)
