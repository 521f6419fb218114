"""KernelBench problems as an agent's workload on a real GPU, where device memory binds: does krex
keep every command alive and every timing honest? Side by side in one invocation.

The workload: the 16 public KernelBench level-1 problems of PROBLEMS below, at their published
sizes, each once eager and once `torch.compile` (default mode): 32 commands, each
`scripts/bench/kb_candidate.py PROBLEM_FILE eager|compile` with fresh Triton and Inductor caches
(a correctness check, then `triton.testing.do_bench`, one JSON line). The 32 run in one fixed
order (a shuffle seeded with SEED) in every mode:

- exclusive: natively, one at a time, no krex (what users do today); exclusive2: the same again,
  the native repeat that measures run-to-run spread;
- shared8: 8 at once natively, no krex (the unprotected control);
- krex8, krex16: all 32 submitted at once through `krex run --auto-regions` (do_bench is a
  region with no code change) to a private daemon of 8 / 16 slots, default configuration
  otherwise (scripts/bench/memory_check.py's daemons; their logs beside the results);
- krex8-cold: krex8 with `krex run --no-pool` (every command started cold, as natively): the
  warm pool's gain is krex8's throughput against it (docs/pool.md);
- krex1, krex1-cold: one at a time through krex (a daemon of 1 slot), warm and cold: what
  krex's own machinery does to a timing with no sibling at all, apart from what siblings do;
  krex1-allcores, krex8-allcores: krex1 and krex8 with the region's owner not pinned (the
  daemon's CPU slice gives the region every CPU): whether the pinning onto the region's cores
  is what moves a timing, alone and beside siblings (frozen over each region either way);
- exclusive-nvml: exclusive beside scripts/bench/nvml_poll.py, which makes the NVML reads krex's
  daemon makes (at each grant, beside the owner's timing, and once a second) every
  NVML_POLL_S: whether those reads alone move a timing, with no krex at all;
- exclusive-churn: exclusive beside scripts/bench/mem_churn.py: 7 processes (CUDA contexts)
  holding device memory and churning it, no GPU work: whether where a command's fresh buffers
  land beside others' memory alone moves a timing;
- krex16-perslot: krex16 with the headroom admission kept before 2026-12-06, half a GiB per
  slot (`memory.headroom_gib = 8`), where krex16 now keeps half a GiB per command on the GPU:
  side by side, what that change buys at 16 slots.

- krex8-agents, krex8-agents-new: 8 agents at once, agent a on the problem and variant of the
  a-th command, each running 4 candidates one after another (32 commands); a candidate is its
  problem's file with a line of its own, written just before it runs, to the agent's bench.py
  (krex8-agents: its command line repeats, a family that the daemon knows from the second
  candidate on, docs/memory.md) or to a new cand<j>.py (-new: every command line new). Their
  commands are not the other modes': compare the two with each other.

A krex mode named twice in one run (`--modes krex8,krex16,krex8,krex16`) runs the second time
with the first's daemon name, so knowing every command's peak it learned (`peaks_known` in the
JSON, "known" in the table, the repeat labelled krex8#2): a fresh daemon's admission against a
daemon that has seen these commands before. Modes of other names (krex8-cold) have daemons of
their own and know nothing of each other's commands.

Memory: PROBLEMS gives each problem's device memory from its shapes (fp32: inputs, outputs,
parameters, the eager forward's temporaries; a compile command also keeps the eager output as
the check's reference): from 0.19 GiB to 24 GiB a command, 14.3 GiB on average, plus ~0.24 GiB
of do_bench's cache-flush buffer and each process's context (~0.5 GiB). No level-1 problem at
its published size needs more than 24 GiB so (all 100 checked on the meta device; the largest
input is 45_Average_Pooling_2D's 16 GiB): no command comes near 36 GiB. Eight commands at once
average ~120 GiB with their contexts, more while the long-lived compile commands dominate (the
first eight of the order: ~133 GiB), so on the H200's ~139 GiB eight regularly do not fit
(about one draw in three, weighted by duration, by our estimate); sixteen almost never fit.

Time: the invocation ends inside --budget-s (default 540 s, of which RESERVE_S is kept for
killing, stopping a daemon and writing the results). Each mode gets a deadline when it starts:
its share of the time left, in proportion to the estimates below among the modes still to run
(a mode that ends early leaves its time to the later ones). Past it nothing more is started,
what runs is killed (its process group), and those commands are recorded "not run (budget)".
Every command's record is appended to OUT/commands.jsonl as it ends and the results JSON is
rewritten after each mode, so a run killed from outside still leaves its data.

Estimated on the H200 (import torch 3-4 s and ~5 s of start-up per native command; a compile
with fresh caches 10-15 s): a native eager command ~5 s, a compile one ~14 s (both end with
os._exit once their line is out: kb_candidate.py says why), so exclusive ~300 s for the 32,
krex8 ~100 s and krex16 ~120 s with their daemons' start: ~520 s, just inside the default
budget; if the estimate is short, the last commands of krex16 are the ones cut. What fits with
room to spare: `--subset 12` (the first 12 problems, 24 commands: exclusive ~230 s, krex8 ~80 s,
krex16 ~95 s). exclusive2 and shared8 do not fit beside the default modes in one call: run
`--modes exclusive,exclusive2 --subset 12` in one call (~460 s) and pass its JSON to another
(`--modes krex8,krex16,shared8 --subset 12 --baseline FIRST.json`, ~250 s): the same subset.

The problem files are not in this repository: `--problems DIR` holds copies of PROBLEMS' files,
made from a KernelBench checkout (https://github.com/ScalingIntelligence/KernelBench; the sizes
above were read at its commit 423217d) with

    python3 scripts/bench/kb_memory.py --populate KERNELBENCH_CHECKOUT --problems .kb/problems

(.kb/ is ignored by git; carry it to the GPU machine with the tree). Then

    python3 scripts/bench/kb_memory.py --problems .kb/problems --json OUT/kb_memory.json
        [--modes exclusive,krex8,krex16] [--budget-s 540] [--subset N] [--baseline PREV.json]

(`PARTS=kbmem bash scripts/gpu_check.sh`: KB_MODES, KB_BUDGET_S, KB_SUBSET, KB_BASELINE.)
Results: the JSON (per mode the counts, throughput against exclusive, the krex reports' figures,
every command's record with its median against exclusive's) and a table on stdout, last.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
import memory_check  # a script beside this one: its daemons, environments and report fields

CANDIDATE = Path(__file__).resolve().parent / "kb_candidate.py"
NVML_POLL = Path(__file__).resolve().parent / "nvml_poll.py"
MEM_CHURN = Path(__file__).resolve().parent / "mem_churn.py"
LEVEL1 = "KernelBench/level1"  # where PROBLEMS are in a KernelBench checkout
SEED = 20261204  # the fixed order of the commands
RESERVE_S = 15.0  # of the budget, kept for killing, a daemon's stop and the results
KILL_GRACE_S = 3.0  # SIGTERM, then SIGKILL
OFF_MARGIN_PTS = 0.3  # a timing is off past the native repeat's spread + this many points
# mode: (commands at once, krex slots or None for natively)
MODES: dict[str, tuple[int, int | None]] = {
    "exclusive": (1, None),
    "exclusive2": (1, None),
    "shared8": (8, None),
    "krex8": (8, 8),
    "krex16": (16, 16),
    "krex8-cold": (8, 8),
    # One at a time through krex, warm and cold: what krex's own machinery (shim, regions,
    # the warm pool) does to a timing with no sibling at all, apart from what siblings do.
    "krex1": (1, 1),
    "krex1-cold": (1, 1),
    "krex1-allcores": (1, 1),
    "krex8-allcores": (8, 8),
    "exclusive-nvml": (1, None),
    "exclusive-churn": (1, None),
    # 16 slots with the headroom admission kept before 2026-12-06 (half a GiB per slot, 8 GiB
    # in all, `memory.headroom_gib = 8`), beside krex16's per command: what the change buys.
    "krex16-perslot": (16, 16),
    # Agents (AGENTS): 8 at once, each its own problem, 4 candidates one after another.
    "krex8-agents": (8, 8),
    "krex8-agents-new": (8, 8),
    # krex8 and krex16 with swaps off (`memory.swap = "off"`): a deadlock preempts its victim,
    # as before swaps; the comparison shows what swaps buy
    "krex8-noswap": (8, 8),
    "krex16-noswap": (16, 16),
}
# An agent's candidates: the file it writes each one to, rewritten (its command line repeats:
# a family, docs/memory.md) or new each time (every command line new).
AGENTS = {"krex8-agents": "same", "krex8-agents-new": "new"}
AGENT_COUNT, AGENT_CANDIDATES = 8, 4
# through `krex run --no-pool`: the warm pool's gain is krex8 against krex8-cold
COLD = ("krex8-cold", "krex1-cold")
NATIVE = ("exclusive", "exclusive2")  # the references: a command's median against these
# Regions whose owner is not pinned: the daemon's CPU slice gives the region every CPU it has
# (docs/operator-guide.md, "Core slices"), so a region's owner runs where it ran before.
ALL_CORES = ("krex1-allcores", "krex8-allcores")
NVML_POLL_S = 0.1
READY_S = 60.0  # a script's start beside a mode (Python, torch, CUDA contexts) at most
# Native modes beside a script of ours: the key their mode keeps its record under, the record's
# file (out_dir/FILE-MODE.json) and the script. nvml_poll.py makes krex's daemon's NVML reads
# every NVML_POLL_S (ten times as often as its tick, so an effect too small to see at once a
# second shows); mem_churn.py holds device memory and churns it, no work.
BESIDE: dict[str, tuple[str, str, list[str]]] = {
    "exclusive-nvml": ("nvml_poll", "nvml", [str(NVML_POLL), "--period", str(NVML_POLL_S)]),
    "exclusive-churn": ("churn", "churn", [str(MEM_CHURN)]),
}


@contextlib.contextmanager
def beside(script: list[str], out: Path) -> Iterator[dict[str, Any]]:
    """A script of ours running for the block (started once it prints its first line, stopped
    with SIGTERM after); yields a dict that holds, after the block, the JSON it left at `out`
    (what it did), or why there is none."""
    info: dict[str, Any] = {}
    argv = [sys.executable, *script]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    try:
        # Its first line once it reads (or knows it cannot): the commands start after that.
        assert proc.stdout is not None
        if select.select([proc.stdout], [], [], READY_S)[0]:
            proc.stdout.readline()
        yield info
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        try:
            info |= json.loads(out.read_text())
        except (OSError, ValueError) as e:
            info |= {"error": f"{Path(script[0]).name} left no record ({e})"}


def all_cores_config(cpus: Iterable[int] | None = None) -> str:
    """A daemon configuration whose GPU 0 has every CPU (this process's affinity) for its region
    owner and for the rest alike."""
    text = ",".join(str(c) for c in sorted(os.sched_getaffinity(0) if cpus is None else cpus))
    return f'[slices.0]\nregion = "{text}"\nshared = "{text}"\n'


def mode_config(name: str) -> str:
    """More of a krex mode's daemon configuration (TOML)."""
    if name in ALL_CORES:
        return all_cores_config()
    if name.endswith("-noswap"):
        return '[memory]\nswap = "off"\n'
    return "[memory]\nheadroom_gib = 8\n" if name == "krex16-perslot" else ""


# The budget's shares: a native command's seconds one at a time, each mode's speed-up over that
# and its fixed start (a daemon and its warm workers). Estimates, not measurements.
EST_S = {"eager": 5.0, "compile": 14.0}
EST_SPEEDUP = {"exclusive": 1.0, "exclusive2": 1.0, "shared8": 4.0, "krex8": 4.0, "krex16": 3.0,
               "krex8-cold": 3.0, "krex1": 1.2, "krex1-cold": 1.0,
               "krex1-allcores": 1.2, "krex8-allcores": 4.0, "exclusive-nvml": 1.0,
               "exclusive-churn": 1.0, "krex16-perslot": 3.0, "krex8-agents": 4.0,
               "krex8-agents-new": 4.0, "krex8-noswap": 4.0, "krex16-noswap": 3.0}  # fmt: skip
EST_START_S = {"krex8": 20.0, "krex16": 20.0, "krex8-cold": 10.0, "krex1": 20.0,
               "krex1-cold": 10.0, "krex1-allcores": 20.0, "krex8-allcores": 20.0,
               "exclusive-churn": 10.0, "krex16-perslot": 20.0, "krex8-agents": 20.0,
               "krex8-agents-new": 20.0, "krex8-noswap": 20.0, "krex16-noswap": 20.0}  # fmt: skip


class Problem(NamedTuple):
    file: str  # in KernelBench/level1/
    eager_gib: float  # device memory of an eager command, from the shapes (GiB = 2^30 bytes)
    compile_gib: float  # of a compile command: the eager reference output kept besides


# Each problem's memory at its published sizes, fp32: in = inputs, out = output, tmp = the eager
# forward's temporaries at its peak, ref = the eager output a compile command keeps for its check
# (checked on the meta device with torch 2.11: live storage at the eager forward's peak). In an
# order that keeps the range in any first N (--subset).
PROBLEMS = (
    # A, B, C 4096^2: 3 x 64 MiB; compile: + ref 64 MiB
    Problem("1_Square_matrix_multiplication_.py", 0.19, 0.25),
    # x (32768, 65535) 8 GiB, tmp |x| 8 GiB, out 8 GiB; compile: in + ref + out
    Problem("38_L1Norm_.py", 16.0, 24.0),
    # x (32768, 32768) 4 GiB, out 4 GiB; compile: + ref
    Problem("89_cumsum.py", 8.0, 12.0),
    # x (112, 64, 512, 512) 7 GiB, out 7 GiB; compile: + ref
    Problem("34_InstanceNorm.py", 14.0, 21.0),
    # x (16, 16, 1024, 1024) 1 GiB, out (16, 128, 1022, 1022) 7.97 GiB (+ cuDNN's workspace);
    # compile: + ref
    Problem("63_conv_standard_2D__square_input__square_kernel.py", 8.97, 16.94),
    # x (4096, 393216) 6 GiB, tmp sigmoid(x) 6 GiB, out 6 GiB; compile: in + ref + out
    Problem("25_Swish.py", 18.0, 18.0),
    # predictions, targets (32768, 32768) 2 x 4 GiB, tmp their difference and its square 2 x 4
    # GiB, out a scalar; compile: the eager peak
    Problem("94_MSELoss.py", 16.0, 16.0),
    # x (32768, 65535) 8 GiB, out 8 GiB; compile: + ref
    Problem("39_L2Norm_.py", 16.0, 24.0),
    # x (16, 64, 256, 256) 256 MiB, weight and bias (64, 256, 256) 32 MiB, out 256 MiB; + ref
    Problem("40_LayerNorm.py", 0.53, 0.78),
    # x (16, 64, 1024, 1024) 4 GiB, out (16, 128, 1024, 1024) 8 GiB; compile: + ref
    Problem("87_conv_pointwise_2D.py", 12.0, 20.0),
    # x (4096, 393216) 6 GiB, out 6 GiB; compile: + ref
    Problem("23_Softmax.py", 12.0, 18.0),
    # x (112, 64, 512, 512) 7 GiB, tmp x ** 2 7 GiB (then the rms, 0.11 GiB), out 7 GiB;
    # compile: in + ref + out
    Problem("36_RMSNorm_.py", 14.11, 21.0),
    # x (16, 64, 2048, 2048) 16 GiB, out (16, 64, 186, 186) 0.13 GiB; compile: + ref
    Problem("45_Average_Pooling_2D.py", 16.13, 16.26),
    # x (4096, 393216) 6 GiB, tmp 1 + |x| 6 GiB (and |x| before it), out 6 GiB; compile: in +
    # ref + out
    Problem("30_Softsign.py", 18.0, 18.0),
    # x (32768, 32768) 4 GiB, mask 1 GiB, tmp x * mask 4 GiB, out 4 GiB (get_inputs: an int64
    # mask of 8 GiB first); compile: in + ref + out
    Problem("93_masked_cumsum.py", 13.0, 13.0),
    # x (112, 64, 512, 512) 7 GiB, out 7 GiB (the norm a scalar); compile: + ref
    Problem("37_FrobeniusNorm_.py", 14.0, 21.0),
)


class Command(NamedTuple):
    problem: str  # a file of PROBLEMS (or a test's name; an agent's candidate: its path)
    variant: str  # eager | compile
    est_gib: float = 0.0
    agent: str = ""  # an agent's candidate: "a<agent>c<candidate>" (agent_candidates)
    of: str = ""  # an agent's candidate: the file of PROBLEMS it is a copy of
    candidate: int = -1  # an agent's candidate: its number j (its table row, c<j>)

    @property
    def key(self) -> str:
        return f"{self.problem}:{self.variant}"

    @property
    def tag(self) -> str:
        tag = f"{Path(self.problem).stem}-{self.variant}"
        return f"{tag}-{self.agent}" if self.agent else tag


def commands(problems: Iterable[Problem] = PROBLEMS, seed: int = SEED) -> list[Command]:
    """Each problem eager and compiled, in the fixed order every mode runs them in."""
    cmds = [
        Command(p.file, v, p.eager_gib if v == "eager" else p.compile_gib)
        for p in problems
        for v in ("eager", "compile")
    ]
    random.Random(seed).shuffle(cmds)
    return cmds


class Candidate:
    """A command's argv (natively; krex modes put `krex run` before it), its problem a file in
    `problems_dir` (or a path of its own: an agent's candidate)."""

    def __init__(self, problems_dir: Path) -> None:
        self.problems_dir = problems_dir

    def __call__(self, c: Command) -> list[str]:
        return [sys.executable, str(CANDIDATE), str(self.problems_dir / c.problem), c.variant]


def candidate(problems_dir: Path) -> Candidate:
    return Candidate(problems_dir)


def agent_candidates(cmds: list[Command], where: Path, file: str) -> list[list[Command]]:
    """AGENT_COUNT agents' candidates: agent a works on the problem (and variant) of the a-th
    command, AGENT_CANDIDATES of them one after another, each written under where/agent<a>/ to
    bench.py (file "same": one command line, a family) or cand<j>.py ("new")."""
    out = []
    for a, c in enumerate(cmds[:AGENT_COUNT]):
        home = where / f"agent{a}"
        out.append([
            Command(str(home / memory_check.agent_script(j, file)), c.variant, c.est_gib,
                    f"a{a}c{j}", c.problem, j)
            for j in range(AGENT_CANDIDATES)
        ])  # fmt: skip
    return out


def write_candidate(c: Command, source: Path) -> None:
    """An agent's candidate j: its problem's text and a line of its own (another command each
    time: its key hashes the file, docs/memory.md)."""
    Path(c.problem).parent.mkdir(parents=True, exist_ok=True)
    Path(c.problem).write_text(source.read_text() + f"\n# candidate {c.agent}\n")


def estimate_s(mode: str, cmds: list[Command]) -> float:
    work = sum(EST_S.get(c.variant, EST_S["compile"]) for c in cmds)
    return EST_START_S.get(mode, 0.0) + work / EST_SPEEDUP[mode]


def share_deadline(now: float, end: float, est_this: float, est_later: float) -> float:
    """A mode's deadline: of the time left before `end`, its estimate's share among its own and
    the later modes' estimates."""
    left = max(0.0, end - now)
    total = est_this + est_later
    return now + (left * est_this / total if total > 0 else left)


class Log:
    """OUT/commands.jsonl, a line per command as it ends (threads write it)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def write(self, row: dict[str, Any]) -> None:
        with self._lock, open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")


def _kill_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _exited(pid: int) -> bool:
    """Whether the child ended, without reaping it: its process group cannot be reused yet."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def run_to_deadline(
    argv: list[str], env: dict[str, str], out: IO[bytes], err: IO[bytes] | int, deadline: float
) -> tuple[int, bool]:
    """argv in a process group of its own, its output to `out` and `err` (or
    subprocess.STDOUT); SIGTERM to the group at `deadline`, SIGKILL KILL_GRACE_S later, and
    what it left running in its group is ended once it exits. Its exit status, and whether it
    was killed."""
    p = subprocess.Popen(
        argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True
    )
    killed = False
    term_at: float | None = None
    while not _exited(p.pid):
        now = time.monotonic()
        if now >= deadline and term_at is None:
            killed, term_at = True, now
            _kill_group(p.pid, signal.SIGTERM)
        elif term_at is not None and now >= term_at + KILL_GRACE_S:
            _kill_group(p.pid, signal.SIGKILL)
        time.sleep(0.05)
    _kill_group(p.pid, signal.SIGKILL)  # what it left running (Inductor's compile workers)
    return p.wait(), killed


def result_line(stdout: str) -> dict[str, Any] | None:
    """The command's last JSON line (a command krex ran again printed one per attempt)."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                row = json.loads(line)
                if isinstance(row, dict):
                    return row
    return None


def is_oom(stderr: str) -> bool:
    """Out of device memory as PyTorch and the driver say it, or a CUDA library's allocation
    failing (CUBLAS_STATUS_ALLOC_FAILED, CUDNN_STATUS_ALLOC_FAILED)."""
    text = stderr.lower()
    return "out of memory" in text or "alloc_failed" in text


def error_line(stderr: str) -> str:
    """The error's first line: the out-of-memory message, else kb_candidate's `error:` line,
    else stderr's last line."""
    lines = [x.strip() for x in stderr.splitlines() if x.strip()]
    if is_oom(stderr):
        hit = [x for x in lines if "out of memory" in x.lower() or "alloc_failed" in x.lower()]
        return hit[0][:300]
    errs = [x for x in lines if x.startswith("error: ")]
    return (errs[-1] if errs else lines[-1] if lines else "no output")[:300]


def run_command(
    cmd: Command,
    argv: list[str],
    env: dict[str, str],
    logs: Path,
    deadline: float,
    value: str = "median_ms",
) -> dict[str, Any]:
    """One command, its output to files under `logs`, killed (its process group) at `deadline`.
    Processes it left behind in its group are ended once it exits. It is ok when it exits 0
    with a last JSON line that holds `value` (copied into the record)."""
    out_path, err_path = logs / f"{cmd.tag}.out", logs / f"{cmd.tag}.err"
    t0 = time.monotonic()
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        rc, killed = run_to_deadline(argv, env, out, err, deadline)
    row: dict[str, Any] = {"rc": rc, "wall_s": round(time.monotonic() - t0, 3)}
    if killed:
        return row | {"status": "not_run", "why": f"budget (killed after {row['wall_s']:.0f} s)"}
    stdout = out_path.read_text(errors="replace")
    stderr = err_path.read_text(errors="replace")
    line = result_line(stdout)
    if line is not None:
        row["result"] = line
    if rc == 0 and line is not None and line.get(value):
        return row | {"status": "ok", value: line[value]}
    row["status"] = "oom" if rc != 0 and is_oom(stderr) else "failed"
    row["error"] = error_line(stderr) if rc != 0 else f"exit 0 without its {value}"
    row["stderr_tail"] = stderr[-1500:]
    return row


def _truthy(x: Any) -> bool:
    return bool(x) and x not in ("0", "false", "False")


def _num(x: Any) -> float:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else 0.0


def krex_summary(rep: dict[str, Any]) -> dict[str, Any]:
    """A command's `krex run --report`, in figures; fields an older daemon does not write are
    left out or counted as none. Its earlier attempts (`attempts`, when krex ran it again) count
    towards waits, preemptions and regions; the timing is the last attempt's."""
    attempts = [a for a in rep.get("attempts") or [] if isinstance(a, dict)]
    reports = [*attempts, rep]

    def regions(r: dict[str, Any]) -> list[dict[str, Any]]:
        return [x for x in r.get("regions") or [] if isinstance(x, dict)]

    def mem(r: dict[str, Any]) -> dict[str, Any]:
        m = r.get("memory")
        return m if isinstance(m, dict) else {}

    every = [x for r in reports for x in regions(r)]
    # The timings the command kept: not an autotuner's candidates, nor a region revoked for
    # memory whose call was timed again in a new region (`retaken`: its result was dropped).
    timing = [x for x in regions(rep) if not x.get("candidate") and not x.get("retaken")]
    kinds: dict[str, float] = {}
    for r in reports:
        for k, v in (mem(r).get("waits_by_kind") or {}).items():
            kinds[str(k)] = kinds.get(str(k), 0.0) + _num(v)
    preempted = [
        r for r in reports if _truthy(r.get("preempted")) or _truthy(mem(r).get("preempted"))
    ]
    out: dict[str, Any] = {
        "exit_code": rep.get("exit_code"),
        "pool": rep.get("pool"),
        "pool_reason": rep.get("pool_reason"),
        "attempts": len(attempts),
        "preempted": len(preempted),
        # taken off the GPU to break a deadlock instead (krex/daemon/swap.py), and the seconds
        # it spent off it
        "swaps": int(sum(_num(mem(r).get("swaps")) for r in reports)),
        "off_gpu_s": sum(_num(mem(r).get("off_gpu_s")) for r in reports),
        "peak_bytes": mem(rep).get("peak_bytes"),
        "nvml_peak_bytes": mem(rep).get("nvml_peak_bytes"),
        "queue_s": sum(_num(r.get("queue_s")) for r in reports),  # admission's, every attempt
        "mem_wait_s": sum(_num(mem(r).get("wait_s")) for r in reports),
        "mem_waits": sum(_num(mem(r).get("waits")) for r in reports),
        "oom_alone": sum(_num(mem(r).get("oom_alone")) for r in reports),
        "oom_shared": sum(_num(mem(r).get("oom_shared")) for r in reports),
        "regions": len(every),
        "unclean": sum(not x.get("clean") for x in every),
        "revoked": sum(bool(x.get("revoked")) for x in every),
        # revoked for memory while a timer ran, and that call timed again in a new region
        "retaken": sum(bool(x.get("retaken")) for x in every),
        "drain_timeouts": sum(
            any("drain" in str(p).lower() for p in x.get("problems") or []) for x in every
        ),
        "timing_clean": bool(timing) and all(x.get("clean") for x in timing),
        "region_s": sum(_num(x.get("duration_s")) for x in every),
        "region_wait_s": sum(_num(x.get("wait_s")) for x in every),
        "drain_s": sum(_num(x.get("drain_s")) for x in every),
        "freeze_s": sum(_num(x.get("freeze_s")) for x in every),
        "problems": [str(p) for x in every for p in x.get("problems") or []][:5],
        "warnings": sorted(
            {
                str(w.get("name"))
                for x in every
                for w in x.get("warnings") or []
                if isinstance(w, dict)
            }
        ),
    }
    if kinds:
        out["waits_by_kind"] = kinds
    return out


def run_mode(
    name: str,
    cmds: list[Command],
    argv_for: Callable[[Command], list[str]],
    out_dir: Path,
    tmp: Path,
    deadline: float,
    log: Log,
    value: str = "median_ms",
) -> dict[str, Any]:
    """One mode over the commands, in their order, `concurrency` at once; nothing starts after
    `deadline` and what runs then is killed. `value`: the result line's field that says a
    command ended well (run_command)."""
    concurrency, slots = MODES[name]
    logs, reports = out_dir / "logs" / name, out_dir / "reports" / name
    logs.mkdir(parents=True, exist_ok=True)
    reports.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    mode: dict[str, Any] = {"mode": name, "concurrency": concurrency, "slots": slots}
    mode["deadline_s"] = round(deadline - t_start, 1)
    records: list[dict[str, Any]] = []
    t0 = t_start

    def one(i: int, c: Command, sock: Path | None) -> dict[str, Any]:
        row: dict[str, Any] = {"mode": name, "index": i, "problem": c.problem}
        row |= {"variant": c.variant, "est_gib": c.est_gib}
        if c.agent:  # its problem's row and exclusive's timing (row_key)
            row |= {"agent": c.agent, "of": c.of, "candidate": c.candidate}
        if time.monotonic() >= deadline:
            row |= {"status": "not_run", "why": "budget (not started)"}
        else:
            argv, report = argv_for(c), reports / f"{c.tag}.json"
            if sock is not None:
                argv = memory_check.krex_argv(
                    argv, sock, report, auto_regions=True, cold=name in COLD
                )
            env = memory_check.command_env(tmp / f"{name}-{i}")
            row["started_s"] = round(time.monotonic() - t0, 3)
            row |= run_command(c, argv, env, logs, deadline, value)
            if sock is not None and report.exists():
                with contextlib.suppress(ValueError, OSError):
                    row["krex"] = krex_summary(json.loads(report.read_text()))
        log.write(row)
        mark = row.get(value) or row.get("why") or row.get("error")
        print(f"   {name} {i:2d} {c.tag:60.60} {row['status']:7} {mark}", flush=True)
        return row

    with contextlib.ExitStack() as stack:
        sock: Path | None = None
        if slots:
            try:
                start_s = max(1.0, deadline - time.monotonic())
                # Each mode's daemon its own (name, log, learned peaks): krex8-cold after
                # krex8 would otherwise start knowing every command's peak.
                tag = "" if name == f"krex{slots}" else name.removeprefix(f"krex{slots}-")
                sock = stack.enter_context(
                    memory_check.daemon(tmp, slots, start_s=start_s, stop_s=10, tag=tag,
                                        config=mode_config(name))
                )  # fmt: skip
            except Exception as e:  # the mode is lost, not the run
                mode["error"] = str(e)[-1500:]
                why = (
                    "budget (daemon not ready)" if time.monotonic() >= deadline else "daemon failed"
                )
                for i, c in enumerate(cmds):
                    row = {"mode": name, "index": i, "problem": c.problem, "variant": c.variant}
                    records.append(row | {"status": "not_run", "why": why})
                    log.write(records[-1])
        if name in BESIDE:
            key, file, script = BESIDE[name]
            out = out_dir / f"{file}-{name}.json"
            mode[key] = stack.enter_context(beside([*script, "--out", str(out)], out))
        mode["start_s"] = round(time.monotonic() - t_start, 1)  # the daemon's, with its pool
        if sock is not None:
            mode["peaks_known"] = peaks_known(sock)
        t0 = time.monotonic()
        if not records and name in AGENTS:
            records = run_agents(one, cmds, argv_for, tmp / name, AGENTS[name], sock)
        elif not records:
            with ThreadPoolExecutor(concurrency) as pool:
                futs = [pool.submit(one, i, c, sock) for i, c in enumerate(cmds)]
                records = [f.result() for f in futs]
        wall = time.monotonic() - t0
    return mode | counts(records, wall) | {"commands": records}


def run_agents(
    one: Callable[[int, Command, Path | None], dict[str, Any]],
    cmds: list[Command],
    argv_for: Callable[[Command], list[str]],
    where: Path,
    file: str,
    sock: Path | None,
) -> list[dict[str, Any]]:
    """The agents of agent_candidates at once, each its candidates one after another, each
    written from its problem's file just before it runs."""
    if not isinstance(argv_for, Candidate):
        raise ValueError("agent modes need the problems' directory (kb_memory.candidate)")
    agents = agent_candidates(cmds, where, file)

    def agent(a: int) -> list[dict[str, Any]]:
        rows = []
        for j, c in enumerate(agents[a]):
            write_candidate(c, argv_for.problems_dir / cmds[a].problem)
            rows.append(one(a * AGENT_CANDIDATES + j, c, sock))
        return rows

    with ThreadPoolExecutor(len(agents)) as pool:
        return [r for rows in pool.map(agent, range(len(agents))) for r in rows]


def peaks_known(sock: Path) -> int | None:
    """How many commands' peaks a daemon knew as it started: what it learned in a mode of the
    same name earlier in this run (its `<socket>.peaks.json`, docs/operator-guide.md). A mode
    named twice runs the second time knowing every peak of the first: its admission is then
    not a fresh daemon's."""
    try:
        doc = json.loads(Path(f"{sock}.peaks.json").read_text())
    except FileNotFoundError:
        return 0
    except (OSError, ValueError):
        return None  # unreadable: the daemon would not use it either
    return len(doc) if isinstance(doc, dict) else None


def _q(xs: list[float], q: float) -> float | None:
    return memory_check._q(sorted(xs), q)


def counts(records: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    """A mode's counts, throughput and krex figures from its commands' records."""
    by = {s: [r for r in records if r.get("status") == s] for s in ("ok", "failed", "oom")}
    kx = [r["krex"] for r in records if isinstance(r.get("krex"), dict)]
    out: dict[str, Any] = {
        "wall_s": round(wall, 1),
        "ok": len(by["ok"]),
        "failed": len(by["failed"]) + len(by["oom"]),
        "oom": len(by["oom"]),
        "not_run": sum(r.get("status") == "not_run" for r in records),
        "cmds_per_min_ok": 60 * len(by["ok"]) / wall if wall > 0 else 0.0,
        "oom_errors": [f"{r['problem']} {r['variant']}: {r.get('error')}" for r in by["oom"]],
        "errors": [f"{r['problem']} {r['variant']}: {r.get('error')}" for r in by["failed"]],
    }
    if kx:
        waits = [k["mem_wait_s"] for k in kx]
        queues = [k.get("queue_s", 0.0) for k in kx]
        out |= {
            "reruns": sum(k["attempts"] > 0 for k in kx),
            "preempted": sum(k["preempted"] for k in kx),
            "swaps": int(sum(k.get("swaps", 0) for k in kx)),
            "off_gpu_s": round(sum(k.get("off_gpu_s", 0.0) for k in kx), 1),
            "queue_p50_s": _q(queues, 0.5),
            "queue_p95_s": _q(queues, 0.95),
            "mem_wait_p50_s": _q(waits, 0.5),
            "mem_wait_p95_s": _q(waits, 0.95),
            "regions": sum(k["regions"] for k in kx),
            "unclean": sum(k["unclean"] for k in kx),
            "revoked": sum(k["revoked"] for k in kx),
            "retaken": sum(k.get("retaken", 0) for k in kx),
            "drain_timeouts": sum(k["drain_timeouts"] for k in kx),
            "warm": sum(k.get("pool") == "warm" for k in kx),
        }
        kinds: dict[str, float] = {}
        for k in kx:
            for kind, v in (k.get("waits_by_kind") or {}).items():
                kinds[kind] = kinds.get(kind, 0.0) + v
        if kinds:
            out["waits_by_kind"] = kinds
    return out


def off_if_native(spread: dict[str, float], compared: int) -> float | None:
    """How many of `compared` commands a third native run would have off (off_rate_if_native's
    share of them, to a tenth); None where the rate is unknown."""
    rate = off_rate_if_native(spread)
    return None if rate is None else round(rate * compared, 1)


def off_cell(m: dict[str, Any]) -> str | None:
    """A mode's "off" for a table: the count of those compared, and the native run's beside it."""
    off = m.get("off")
    if off is None or isinstance(off, str):
        return off
    native = m.get("off_if_native")
    return f"{off} of {m.get('off_of')}" + (
        "" if native is None else f" (a native run: {native:.1f})"
    )


def off_rate_if_native(spread: dict[str, float]) -> float | None:
    """How often a third native run would be called off by the same rule: over every ordered
    pair of two commands' native-repeat differences, the share where one exceeds the other +
    OFF_MARGIN_PTS (one native run's difference standing in for the third run's, the other's
    for the bound). A control for `off`, computed from this run's own figures; None with fewer
    than two candidates."""
    xs = list(spread.values())
    pairs = [(a, b) for i, a in enumerate(xs) for j, b in enumerate(xs) if i != j]
    if not pairs:
        return None
    return sum(a > b + OFF_MARGIN_PTS for a, b in pairs) / len(pairs)


def row_key(r: dict[str, Any]) -> str:
    """A record's command: its problem and variant; an agent's candidate, the problem it is a
    copy of (its timing compared with that problem's alone)."""
    return f"{r.get('of') or r['problem']}:{r['variant']}"


def summarise(modes: list[dict[str, Any]], capacity_bytes: float | None = None) -> dict[str, Any]:
    """Throughput against exclusive, and each command's median against its exclusive median:
    a % difference, and whether it is off by more than the native repeat's spread (exclusive2
    against exclusive, that command's) + OFF_MARGIN_PTS points; for krex modes counted over
    commands whose timing regions were clean."""

    def medians(mode: str) -> dict[str, float]:
        m = next((x for x in modes if x["mode"] == mode), None)
        rows = m["commands"] if m else []
        return {row_key(r): r["median_ms"] for r in rows if r.get("median_ms")}

    ref, rep = medians("exclusive"), medians("exclusive2")
    base = next((m for m in modes if m["mode"] == "exclusive"), None)
    has_repeat = any(m["mode"] == "exclusive2" for m in modes)
    spread = {k: abs(rep[k] / ref[k] - 1) * 100 for k in rep if k in ref}
    for m in modes:
        if base is not None and base.get("cmds_per_min_ok"):
            m["throughput_vs_exclusive"] = m["cmds_per_min_ok"] / base["cmds_per_min_ok"]
        if m["mode"] == "exclusive":
            continue
        diffs: list[float] = []
        off = compared = 0
        for r in m["commands"]:
            key = row_key(r)
            if r.get("status") != "ok" or key not in ref:
                continue
            r["diff_pct"] = (r["median_ms"] / ref[key] - 1) * 100
            diffs.append(abs(r["diff_pct"]))
            # Under krex a timing counts when its region was clean (no report: unknown).
            clean = not m.get("slots") or bool((r.get("krex") or {}).get("timing_clean"))
            if m["mode"] == "exclusive2" or key not in spread or not clean:
                continue
            r["off"] = abs(r["diff_pct"]) > spread[key] + OFF_MARGIN_PTS
            compared += 1
            off += r["off"]
        m["diff_pct_abs_p50"] = _q(diffs, 0.5)
        m["diff_pct_abs_max"] = max(diffs) if diffs else None
        if m["mode"] == "exclusive2":
            continue
        if not has_repeat:
            m["off"] = "no native repeat"
        else:
            m["off"] = off
            m["off_of"] = compared  # clean (krex) or all (native) commands with a repeat
            m["off_if_native"] = off_if_native(spread, compared)
    return {
        "modes": modes,
        "native_spread_pct": spread or None,
        "memory_ceiling": [c for m in modes if m["mode"] != "exclusive2"
                           if (c := memory_time_ceiling(modes, capacity_bytes, m["mode"]))],
    }  # fmt: skip


def memory_time_ceiling(
    modes: list[dict[str, Any]], capacity_bytes: float | None = None, mode: str = "exclusive"
) -> dict[str, Any] | None:
    """What the GPU's memory allows any scheduler that runs these commands unchanged at `mode`'s
    speeds (exclusive: alone), from that mode's records: each command holds at least its
    max_memory_allocated from the end of its set-up (t_ready_s) to the end of its timing
    (t_timed_s), so the commands a minute can be at most the capacity over the mean of peak x
    held seconds (perfect packing: a ceiling, not an estimate), against exclusive's commands a
    minute. `capacity_bytes` defaults to the GPU's memory any mode's commands recorded."""
    base = next((m for m in modes if m["mode"] == "exclusive"), None)
    this = next((m for m in modes if m["mode"] == mode), None)
    rows = [r.get("result") or {} for r in (this or {}).get("commands", [])
            if r.get("status") == "ok"]  # fmt: skip
    held = [(r["peak_bytes"], r["t_timed_s"] - r["t_ready_s"]) for r in rows
            if {"peak_bytes", "t_ready_s", "t_timed_s"} <= r.keys()]  # fmt: skip
    every = [r.get("result") or {} for m in modes for r in m.get("commands", [])]
    capacity = capacity_bytes or max((r.get("total_bytes") or 0 for r in every), default=0)
    byte_s = sum(b * max(s, 0.0) for b, s in held) / len(held) if held else 0.0
    if not byte_s or not capacity or not base or not base.get("cmds_per_min_ok"):
        return None
    per_min = 60.0 * capacity / byte_s
    return {
        "mode": mode,
        "commands": len(held),
        "capacity_gib": capacity / (1 << 30),
        "gib_s_per_command": byte_s / (1 << 30),
        "cmds_per_min": per_min,
        "x_exclusive": per_min / base["cmds_per_min_ok"],
    }


def _f(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def mode_labels(modes: list[dict[str, Any]]) -> list[str]:
    """Each mode's name in the tables, a mode run again numbered: krex8, krex8#2."""
    seen: dict[str, int] = {}
    labels = []
    for m in modes:
        seen[m["mode"]] = seen.get(m["mode"], 0) + 1
        labels.append(m["mode"] + (f"#{seen[m['mode']]}" if seen[m["mode"]] > 1 else ""))
    return labels


def table(doc: dict[str, Any]) -> str:
    """Per command (its medians against exclusive), then per mode: the summary, last."""
    modes = doc["modes"]
    labels = mode_labels(modes)
    names = [n for n in labels if n != "exclusive"]
    # An agent's candidate j of a problem is a row of its own beside the problem's, in every
    # agent mode the same row (c<j>), whatever file it was written to.
    rows: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for m, label in zip(modes, labels, strict=True):
        for r in m["commands"]:
            cand = f" c{r['candidate']}" if r.get("agent") else ""
            key = (r.get("of") or r["problem"], r["variant"] + cand)
            rows.setdefault(key, {})[label] = r
    head = f"{'command':44} {'est GiB':>7} {'peak GiB':>8} {'excl ms':>9} "
    lines = [head + " ".join(f"{n:>10}" for n in names)]
    for (problem, variant), by in rows.items():
        ex = by.get("exclusive", {}).get("median_ms")
        peaks = [(r.get("result") or {}).get("peak_bytes") for r in by.values()]
        peak = max((x for x in peaks if isinstance(x, (int, float))), default=None)
        est = next(iter(by.values())).get("est_gib")
        cells = []
        for n in names:
            r = by.get(n, {})
            d = r.get("diff_pct")
            cell = (
                r.get("status", "-") if d is None else f"{d:+.2f}%" + ("!" if r.get("off") else "")
            )
            cells.append(f"{cell:>10}")
        name = f"{Path(problem).stem} {variant}"
        peak_gib = None if peak is None else peak / (1 << 30)
        lead = f"{name[:44]:44} {_f(est, '.2f'):>7} {_f(peak_gib, '.2f'):>8} {_f(ex, '.4f'):>9} "
        lines.append(lead + " ".join(cells))
    lines.append(
        "(est: from the shapes; peak: the largest max_memory_allocated of its runs; % against "
        "exclusive, ! when off by more than the native repeat's spread + 0.3 points; queue: "
        "a command's wait for admission (a slot, memory); wait: its waits for memory once "
        "running; preem: commands preempted (killed, run again) to break a memory deadlock; swap: "
        "commands taken off the GPU (checkpointed, put back) instead; retake: regions revoked "
        "for memory whose timing call was timed again in a new "
        "region, its command not run again; unclean counts them; known: the peaks its daemon "
        "had learned as it started, from a mode of the same name before it (#2: its second run))"
    )
    lines.append("")
    lines.append(f"{'mode':16} {'known':>5} {'ok':>3} {'fail':>4} {'oom':>3} {'not':>3} "
                 f"{'wall s':>6} {'ok/min':>6} {'x excl':>6} {'rerun':>5} {'preem':>5} "
                 f"{'swap':>4} {'retake':>6} {'queue p95':>9} "
                 f"{'wait p50':>8} "
                 f"{'wait p95':>8} {'regions':>7} {'unclean':>7} {'drain':>5} "
                 f"{'|d|p50%':>7} {'|d|max%':>7}  off")  # fmt: skip
    for m, label in zip(modes, labels, strict=True):
        off = off_cell(m)
        lines.append(
            f"{label:16} {_f(m.get('peaks_known'), 'd'):>5} {m['ok']:>3} {m['failed']:>4} "
            f"{m['oom']:>3} {m['not_run']:>3} "
            f"{m['wall_s']:>6.0f} {m['cmds_per_min_ok']:>6.1f} "
            f"{_f(m.get('throughput_vs_exclusive'), '.2f'):>6} {_f(m.get('reruns'), 'd'):>5} "
            f"{_f(m.get('preempted'), 'd'):>5} {_f(m.get('swaps'), 'd'):>4} "
            f"{_f(m.get('retaken'), 'd'):>6} "
            f"{_f(m.get('queue_p95_s'), '.1f'):>9} "
            f"{_f(m.get('mem_wait_p50_s'), '.1f'):>8} "
            f"{_f(m.get('mem_wait_p95_s'), '.1f'):>8} {_f(m.get('regions'), 'd'):>7} "
            f"{_f(m.get('unclean'), 'd'):>7} {_f(m.get('drain_timeouts'), 'd'):>5} "
            f"{_f(m.get('diff_pct_abs_p50'), '.2f'):>7} {_f(m.get('diff_pct_abs_max'), '.2f'):>7}  "
            f"{off or '-'}"
        )
    for c in doc.get("memory_ceiling") or []:
        lines.append(
            f"memory-time ceiling at {c['mode']}'s speeds: {c['cmds_per_min']:.1f} commands a "
            f"minute, {c['x_exclusive']:.2f}x exclusive ({c['gib_s_per_command']:.0f} GiB x s "
            f"held a command, mean of {c['commands']}; a GPU of {c['capacity_gib']:.1f} GiB)"
        )
    if doc.get("memory_ceiling"):
        lines.append("(no scheduler runs these commands unchanged, at those speeds, faster)")
    return "\n".join(lines)


def populate(checkout: Path, problems_dir: Path) -> list[str]:
    """Copy PROBLEMS' files from a KernelBench checkout; returns the names it lacks."""
    problems_dir.mkdir(parents=True, exist_ok=True)
    missing = []
    for p in PROBLEMS:
        src = checkout / LEVEL1 / p.file
        if src.is_file():
            shutil.copyfile(src, problems_dir / p.file)
        else:
            missing.append(p.file)
    return missing


def run(
    names: list[str],
    cmds: list[Command],
    argv_for: Callable[[Command], list[str]],
    json_path: Path,
    out_dir: Path,
    budget_s: float,
    baseline: list[dict[str, Any]] | None = None,
    est: dict[str, float] | None = None,
    value: str = "median_ms",
    summary: Callable[[list[dict[str, Any]]], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The modes one after another within the budget; the results JSON rewritten after each;
    `summary` (default summarise) of `baseline`'s modes and theirs. For other commands: `est`,
    each mode's estimated seconds (default estimate_s), `value` the field of a command's line
    that says it ended well (run_command)."""
    est = est or {n: estimate_s(n, cmds) for n in names}
    end = time.monotonic() + budget_s - RESERVE_S
    out_dir.mkdir(parents=True, exist_ok=True)
    memory_check.LOGS = out_dir  # the daemons' logs
    log = Log(out_dir / "commands.jsonl")
    modes: list[dict[str, Any]] = list(baseline or [])
    print(f"budget {budget_s:.0f} s; estimates: "
          + ", ".join(f"{n} {s:.0f} s" for n, s in est.items()), flush=True)  # fmt: skip
    if sum(est.values()) > budget_s - RESERVE_S:
        print("   over the budget: later commands will not run (see --subset)", flush=True)
    with tempfile.TemporaryDirectory(prefix="krex-kb-") as d:
        for k, name in enumerate(names):
            now = time.monotonic()
            deadline = share_deadline(now, end, est[name], sum(est[n] for n in names[k + 1 :]))
            print(f"== {name}: {len(cmds)} commands, {deadline - now:.0f} s", flush=True)
            modes.append(run_mode(name, cmds, argv_for, out_dir, Path(d), deadline, log, value))
            m = modes[-1]
            print(f"   {m['ok']} ok, {m['failed']} failed ({m['oom']} out of memory), "
                  f"{m['not_run']} not run, {m['wall_s']:.0f} s", flush=True)  # fmt: skip
            json_path.write_text(json.dumps({"partial": True, "modes": modes}, indent=1))
    return (summary or summarise)(modes)


def merge(paths: list[Path], json_path: Path, capacity_gib: float | None = None) -> int:
    """Calls' results as one summary: every mode of the first (a mode it ran twice, twice),
    then those of the next that the calls before lack (each mode keeps the call it ran in:
    `from_call`). One call's alone: its summary again (a newer summary, e.g. the memory-time
    ceiling)."""
    docs = [json.loads(p.read_text()) for p in paths]
    modes: list[dict[str, Any]] = []
    for path, d in zip(paths, docs, strict=True):
        before = {x["mode"] for x in modes}
        for m in d.get("modes", []):
            if m.get("from_baseline") or m["mode"] in before:
                continue
            modes.append(m | {"from_call": str(path)})
    doc = summarise(modes, capacity_gib * (1 << 30) if capacity_gib else None)
    doc["merged_from"] = {str(p): {"date": d.get("date"), "command": d.get("command")}
                          for p, d in zip(paths, docs, strict=True)}  # fmt: skip
    doc["order"] = docs[0].get("order")
    json_path.write_text(json.dumps(doc, indent=1))
    print(table(doc), flush=True)
    return 0


def mode_names(ap: argparse.ArgumentParser, modes: str) -> list[str]:
    """--modes' names, each one of MODES (else the parser's error)."""
    names = [m for m in modes.split(",") if m]
    unknown = [m for m in names if m not in MODES]
    if unknown:
        ap.error(f"unknown mode(s) {', '.join(unknown)}: choose from {', '.join(MODES)}")
    return names


def baseline_modes(path: Path | None, names: list[str]) -> list[dict[str, Any]]:
    """--baseline: the native modes of an earlier run's JSON that `names` does not run again."""
    if path is None:
        return []
    prev = json.loads(path.read_text())
    return [m | {"from_baseline": str(path)} for m in prev.get("modes", [])
            if m.get("mode") in NATIVE and m["mode"] not in names]  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--problems", type=Path, required=True, help="copies of PROBLEMS' files")
    ap.add_argument("--json", type=Path, help="the results (required unless --populate)")
    ap.add_argument("--out", type=Path, help="logs and reports (default: beside --json)")
    ap.add_argument("--modes", default="exclusive,krex8,krex16", help=", ".join(MODES))
    ap.add_argument("--budget-s", type=float, default=540.0)
    ap.add_argument("--subset", type=int, help="only the first N problems of PROBLEMS")
    ap.add_argument("--baseline", type=Path, help="exclusive, exclusive2 from an earlier JSON")
    ap.add_argument(
        "--populate",
        type=Path,
        metavar="KERNELBENCH_CHECKOUT",
        help="copy the problems from a KernelBench checkout into --problems, and exit",
    )
    ap.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        metavar="JSON",
        help="no run: the first JSON's modes and each next one's others (calls' JSONs, e.g. "
        "exclusive, krex8, krex16 and exclusive2, shared8) summarised together into --json",
    )
    ap.add_argument(
        "--capacity-gib",
        type=float,
        help="with --merge: the GPU's memory for the memory-time ceiling, where the records "
        "predate total_bytes",
    )
    args = ap.parse_args()
    if args.merge is not None:
        if args.json is None:
            ap.error("--json is required")
        return merge(args.merge, args.json, args.capacity_gib)
    if args.populate is not None:
        missing = populate(args.populate, args.problems)
        for name in missing:
            print(f"not in {args.populate / LEVEL1}: {name}", file=sys.stderr)
        return 1 if missing else 0
    if args.json is None:
        ap.error("--json is required")
    names = mode_names(ap, args.modes)
    problems = PROBLEMS[: args.subset] if args.subset else PROBLEMS
    missing = [p.file for p in problems if not (args.problems / p.file).is_file()]
    if missing:
        ap.error(f"{args.problems} lacks {', '.join(missing)} (see --populate)")
    baseline = baseline_modes(args.baseline, names)
    args.json.resolve().parent.mkdir(parents=True, exist_ok=True)
    out_dir = args.out or args.json.resolve().parent / "kb_memory"
    cmds = commands(problems)
    doc = run(names, cmds, candidate(args.problems.resolve()), args.json, out_dir,
              args.budget_s, baseline)  # fmt: skip
    doc["date"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    doc["command"] = "python3 scripts/bench/kb_memory.py " + " ".join(sys.argv[1:])
    doc["order"] = [c.key for c in cmds]
    args.json.write_text(json.dumps(doc, indent=1))
    print(table(doc), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
