"""KernelBench's own eval of N candidates on one GPU, natively one at a time and all at once
through krex: the same correctness verdicts, the same speedups, and how much sooner?

The candidates: CANDIDATES, 12 level-1 and 12 level-2 KernelBench problems, each reference its
own candidate (its source with the class renamed ModelNew; KernelBench checks its references
against themselves in scripts/verify_bench.py, there by passing Model twice). Each is one
command, scripts/bench/kb_eval_candidate.py: KernelBench's `eval_kernel_against_ref`,
unmodified (5 correctness trials, then its cuda_event timer, 100 trials, on the candidate and on
the reference), then the reference's eager time by its `measure_ref_program_time`, as its
scripts/run_and_check.py does; the speedup is that time over the candidate's. The commands run
in one fixed order (a shuffle seeded with SEED) in every mode:

- exclusive: natively, one at a time (what scripts/eval_from_generations.py does on one GPU);
- krex8: all submitted at once through `krex run --auto-regions` to a private daemon of 8 slots
  (scripts/bench/kb_memory.py's modes and daemons): KernelBench's timers are regions as they
  are, its correctness trials run beside the others' work, unchanged;
- exclusive2: natively again, the native repeat: each candidate's run-to-run spread.

(Any mode of kb_memory.MODES runs; the default order puts krex8 between the two native runs.)

Results, per mode against exclusive: the verdicts (compiled, correct) that agree; each correct
candidate's speedup, |difference| in % (p50, p95, max), and "off" where it exceeds the native
repeat's difference for that candidate + 0.3 points (for krex modes over candidates whose timing
regions were clean), and beside it how many a third native run would be expected to have by the
same rule (`off_if_native`: the share of ordered pairs of the native repeat's differences where one
exceeds the other + 0.3 points, times the candidates compared; one native repeat is a noisy bound),
and the same bar read over the distribution (`within_native_dist`: the mode's |difference| p50, p95
and max against the native repeat's + 0.3 points). The speedups are from the trials' unrounded
means (the `raw` figures of the candidate's line); KernelBench's own, from the 3 significant digits
its get_timing_stats keeps, are compared too (`_kb`): their rounding alone can move a speedup by up
to ~1 %. Then each mode's wall clock and exclusive's over it (the whole set in both, else evals per
minute). And, to tell the GPU's part of a difference from the host's: the speedups from each
timing's fastest and median trial against exclusive's (from the trials each line keeps,
`raw.trials_ms`), the trials' spread per mode (`trial_spread`), and how much slower a timing's
first trials are than the rest (`early_trials`: the grant's NVML reads run beside them under krex;
`exclusive-nvml` is a native run beside such reads, scripts/bench/nvml_poll.py).

Choice: references with nothing random in forward (no dropout), inputs of at most 256 MiB
(KernelBench makes them on the host, 8 times an eval: 5 correctness trials, 3 timings) and a
forward of ~0.2-6 ms on an H200 by our estimate from the shapes (fp32 GEMMs of 51-290 GFLOP,
convolutions, a layer norm, an elementwise GELU). Time, estimated, not measured: a native
eval ~8.5 s (start-up and `import torch` ~5 s, the models' and inputs' making on the host,
~330 forwards), so exclusive and exclusive2 ~205 s each for 24 and krex8 ~70 s with its
daemon's start: ~480 s of the default budget's 525 s (540 - RESERVE_S). If it runs longer, each
mode's last commands are the ones cut (`--subset 20` leaves room).
Budget as kb_memory's (--budget-s, RESERVE_S kept; each mode a deadline, its estimate's share
of the time left; past it, commands are killed and recorded "not run"); each command's record
is appended to OUT/commands.jsonl as it ends and the JSON rewritten after each mode.

The files are not in this repository: --kb DIR (default .kb/eval, ignored by git, carried to the
GPU machine with the tree) holds KernelBench's src/kernelbench package, the references and the
candidates, made from a KernelBench checkout (read at its commit 423217d) by

    python3 scripts/bench/kb_eval.py --populate KERNELBENCH_CHECKOUT [--kb .kb/eval]

Then

    python3 scripts/bench/kb_eval.py --json OUT/kb_eval.json [--modes exclusive,krex8,exclusive2]
        [--budget-s 540] [--subset N] [--baseline PREV.json]

(`PARTS=kbeval bash scripts/gpu_check.sh`: KB_EVAL_MODES, KB_EVAL_BUDGET_S, KB_EVAL_SUBSET,
KB_EVAL_BASELINE, KB_EVAL_DIR.) The recipe for one's own candidates: docs/kernelbench.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kb_memory  # a script beside this one: its modes, budget, daemons and records

CANDIDATE = Path(__file__).resolve().parent / "kb_eval_candidate.py"
SEED = 20261206  # the fixed order of the commands
EST_S = 8.5  # a native eval's seconds (see the module's text): the budget's shares
VARIANT = "eval"  # kb_memory.Command's variant for every command here
RESULT = "verdict"  # the field of a candidate's line that says its eval ran
# In an order that keeps both levels in any first N (--subset).
CANDIDATES = (
    "level1/1_Square_matrix_multiplication_.py",
    "level2/12_Gemm_Multiply_LeakyReLU.py",
    "level1/40_LayerNorm.py",
    "level2/57_Conv2d_ReLU_HardSwish.py",
    "level1/8_Matmul_with_irregular_shapes_.py",
    "level2/33_Gemm_Scale_BatchNorm.py",
    "level1/88_MinGPTNewGelu.py",
    "level2/71_Conv2d_Divide_LeakyReLU.py",
    "level1/50_conv_standard_2D__square_input__square_kernel.py",
    "level2/99_Matmul_GELU_Softmax.py",
    "level1/10_3D_tensor_matrix_multiplication.py",
    "level2/73_Conv2d_BatchNorm_Scaling.py",
    "level1/2_Standard_matrix_multiplication_.py",
    "level2/9_Matmul_Subtract_Multiply_ReLU.py",
    "level1/62_conv_standard_2D__square_input__asymmetric_kernel.py",
    "level2/14_Gemm_Divide_Sum_Scaling.py",
    "level1/12_Matmul_with_diagonal_matrices_.py",
    "level2/29_Matmul_Mish_Mish.py",
    "level1/13_Matmul_for_symmetric_matrices.py",
    "level2/63_Gemm_ReLU_Divide.py",
    "level1/14_Matmul_for_upper_triangular_matrices.py",
    "level2/76_Gemm_Add_ReLU.py",
    "level1/16_Matmul_with_transposed_A.py",
    "level2/86_Matmul_Divide_GELU.py",
)
MODEL = re.compile(r"\bModel\b")


def as_candidate(reference: str) -> str:
    """The reference's source as a candidate: every `Model` (its class, `super(Model, self)`)
    renamed ModelNew, the name eval_kernel_against_ref loads.

    Raises:
        ValueError: the source defines no class Model.
    """
    if not re.search(r"^class Model\(", reference, re.M):
        raise ValueError("no `class Model(` in the reference")
    return MODEL.sub("ModelNew", reference)


def populate(checkout: Path, kb: Path, names: tuple[str, ...] = CANDIDATES) -> list[str]:
    """KernelBench's src/kernelbench package, the references (kb/reference/) and their
    candidates (kb/candidate/) from a checkout, and where they came from (kb/kernelbench.json);
    returns what the checkout lacks."""
    src = checkout / "src" / "kernelbench"
    if not (src / "eval.py").is_file():
        return [str(src / "eval.py")]
    shutil.copytree(
        src,
        kb / "src" / "kernelbench",
        dirs_exist_ok=True,
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    missing = []
    for name in names:
        ref = checkout / "KernelBench" / name
        if not ref.is_file():
            missing.append(name)
            continue
        text = ref.read_text()
        for sub, body in (("reference", text), ("candidate", as_candidate(text))):
            (kb / sub / name).parent.mkdir(parents=True, exist_ok=True)
            (kb / sub / name).write_text(body)
    commit = None
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        commit = subprocess.run(
            ["git", "-C", str(checkout), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    source = {"checkout": str(checkout.resolve()), "commit": commit or None}
    (kb / "kernelbench.json").write_text(json.dumps(source) + "\n")
    return missing


def populated(checkout: Path, kb: Path) -> int:
    """--populate: 0, else 1 with what the checkout lacks on stderr."""
    missing = populate(checkout, kb)
    print("".join(f"not in {checkout}: {name}\n" for name in missing), end="", file=sys.stderr)
    return 1 if missing else 0


def lacking(kb: Path, names: tuple[str, ...]) -> list[str]:
    """What a run needs that `kb` lacks (see --populate)."""
    need = [kb / "src" / "kernelbench" / "eval.py"]
    need += [kb / sub / n for n in names for sub in ("reference", "candidate")]
    return [str(p) for p in need if not p.is_file()]


def commands(names: tuple[str, ...] = CANDIDATES, seed: int = SEED) -> list[kb_memory.Command]:
    """One command per candidate, in the fixed order every mode runs them in."""
    cmds = [kb_memory.Command(n, VARIANT) for n in names]
    random.Random(seed).shuffle(cmds)
    return cmds


def candidate(
    kb: Path, correct_trials: int = 5, perf_trials: int = 100, timing_method: str = "cuda_event"
) -> Callable[[kb_memory.Command], list[str]]:
    """A command's argv (natively; krex modes put `krex run` before it)."""
    opts = [
        "--correct-trials",
        str(correct_trials),
        "--perf-trials",
        str(perf_trials),
        "--timing-method",
        timing_method,
    ]
    return lambda c: [
        sys.executable,
        str(CANDIDATE),
        str(kb / "src"),
        str(kb / "reference" / c.problem),
        str(kb / "candidate" / c.problem),
        *opts,
    ]


def estimate_s(mode: str, n: int) -> float:
    return kb_memory.EST_START_S.get(mode, 0.0) + n * EST_S / kb_memory.EST_SPEEDUP[mode]


def run(
    names: list[str],
    cmds: list[kb_memory.Command],
    argv_for: Callable[[kb_memory.Command], list[str]],
    json_path: Path,
    out_dir: Path,
    budget_s: float,
    baseline: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The modes one after another within the budget (kb_memory.run), summarised here."""
    est = {n: estimate_s(n, len(cmds)) for n in names}
    return kb_memory.run(names, cmds, argv_for, json_path, out_dir, budget_s, baseline, est,
                         RESULT, summarise)  # fmt: skip


def _result(r: dict[str, Any]) -> dict[str, Any]:
    res = r.get("result") if r.get("status") == "ok" else None
    return res if isinstance(res, dict) else {}


def _speedups(r: dict[str, Any]) -> tuple[float | None, float | None]:
    """(from the trials' means, KernelBench's) of a correct candidate's record."""
    res = _result(r)
    if not res.get("correctness"):
        return None, None
    raw = res.get("raw")
    return (raw.get("speedup") if isinstance(raw, dict) else None), res.get("speedup")


def _trials(r: dict[str, Any]) -> dict[str, Any]:
    """A correct candidate's trials per timing (`raw.trials_ms`, kept since 2026-12-06: the
    candidate's, the eval's reference's, the final reference's); empty otherwise."""
    res = _result(r)
    raw = res.get("raw") if res.get("correctness") else None
    each = raw.get("trials_ms") if isinstance(raw, dict) else None
    return each if isinstance(each, dict) else {}


def _trial_speedup(r: dict[str, Any], pick: Callable[[list[float]], float]) -> float | None:
    """A correct candidate's speedup from one statistic of each timing's trials (the fastest,
    the median), where its line has the trials."""
    each = _trials(r)
    cand, ref = each.get("candidate"), each.get("reference")
    if not cand or not ref or not isinstance(cand, list) or not isinstance(ref, list):
        return None
    a, b = pick(cand), pick(ref)
    return b / a if a > 0 and b > 0 else None


TRIAL_SPEEDUPS: dict[str, Callable[[list[float]], float]] = {
    "fastest": min,
    "median": statistics.median,
}


def _pct(a: float | None, b: float | None) -> float | None:
    return None if not a or not b else (a / b - 1) * 100


def _abs_q(xs: list[float]) -> dict[str, float | None]:
    a = sorted(abs(x) for x in xs)
    return {"p50": kb_memory._q(a, 0.5), "p95": kb_memory._q(a, 0.95), "max": max(a, default=None)}


def _verdict(res: dict[str, Any]) -> tuple[Any, Any]:
    return res.get("compiled"), res.get("correctness")


def versus(m: dict[str, Any], ref: dict[str, dict[str, Any]], spread: dict[str, float]) -> None:
    """A mode's records against exclusive's (`ref`, by candidate): verdicts that agree, each
    speedup's % difference (`speedup_diff_pct`, KernelBench's figures `_kb`), and `off` where
    the difference exceeds `spread` (the native repeat's, by candidate) + OFF_MARGIN_PTS; under
    krex only where the candidate's timing regions were clean."""
    mismatched, diffs, diffs_kb = [], [], []
    pairs: list[tuple[float, float]] = []  # compared: (|difference|, the native repeat's)
    agree = off = compared = 0
    for r in m["commands"]:
        x, e = _result(r), _result(ref.get(r["problem"], {}))
        if not x or not e:
            continue
        if _verdict(x) == _verdict(e):
            agree += 1
        else:
            mismatched.append(f"{r['problem']}: {x.get(RESULT)} (exclusive: {e.get(RESULT)})")
        (s, s_kb), (s0, s0_kb) = _speedups(r), _speedups(ref[r["problem"]])
        d = r["speedup_diff_pct"] = _pct(s, s0)
        r["speedup_diff_pct_kb"] = _pct(s_kb, s0_kb)
        if d is None:
            continue
        diffs.append(d)
        if r["speedup_diff_pct_kb"] is not None:
            diffs_kb.append(r["speedup_diff_pct_kb"])
        clean = not m.get("slots") or bool((r.get("krex") or {}).get("timing_clean"))
        if m["mode"] != "exclusive2" and r["problem"] in spread and clean:
            r["off"] = abs(d) > spread[r["problem"]] + kb_memory.OFF_MARGIN_PTS
            compared += 1
            off += r["off"]
            pairs.append((abs(d), spread[r["problem"]]))
    for name, pick in TRIAL_SPEEDUPS.items():
        ds = [d for r in m["commands"] if r["problem"] in ref
              if (d := _pct(_trial_speedup(r, pick), _trial_speedup(ref[r["problem"]], pick)))
              is not None]  # fmt: skip
        m[f"speedup_{name}_diff_pct_abs"] = _abs_q(ds) if ds else None
    m["verdicts_agree"], m["verdicts_of"] = agree, agree + len(mismatched)
    m["verdict_mismatches"] = mismatched
    m["speedup_diff_pct_abs"], m["speedup_diff_pct_abs_kb"] = _abs_q(diffs), _abs_q(diffs_kb)
    if m["mode"] != "exclusive2":
        m["off"], m["off_of"] = (off, compared) if spread else ("no native repeat", 0)
        m["off_if_native"] = kb_memory.off_if_native(spread, compared)
        m["within_native_dist"] = within_native_dist(pairs)


def within_native_dist(pairs: list[tuple[float, float]]) -> dict[str, Any] | None:
    """The bar read over the distribution instead of candidate by candidate: over the compared
    candidates, the mode's |difference| p50, p95 and max against the native repeat's at the
    same quantile + OFF_MARGIN_PTS (`mode`, `native`, `within` each). Beside `off`: where the
    native repeat itself moves a few candidates by several %, a third native run is off for
    about as many candidates as a mode (`off_if_native`), and this reading says whether the
    mode's differences are larger than the native ones as a whole."""
    if not pairs:
        return None
    mode, native = _abs_q([a for a, _ in pairs]), _abs_q([b for _, b in pairs])
    out: dict[str, Any] = {}
    for k in ("p50", "p95", "max"):
        a, b = mode[k], native[k]
        ok = None if a is None or b is None else a <= b + kb_memory.OFF_MARGIN_PTS
        out[k] = {"mode": a, "native": b, "within": ok}
    return out


TIMING_ORDER = ("candidate_over_eval_reference", "eval_reference_over_final_reference")


def timing_order(m: dict[str, Any]) -> dict[str, float | None]:
    """Each eval times the same model three times, in one order: the candidate, the eval's
    reference, the final reference (whose time over the candidate's is the speedup). Per
    mode, the median % of each over the next, over correct candidates: about 0 natively;
    where one reads off under krex, the speedups move by as much (on an H100, 2026-12-06,
    krex8's eval reference read 0.62 % over the final one, natively 0.22 and -0.00 %; the
    H100 the day before: -0.15 %, natively 0.07 and -0.01 %)."""
    first, second = [], []
    for r in m["commands"]:
        res = _result(r)
        raw = res.get("raw") if res.get("correctness") else None
        if not isinstance(raw, dict):
            continue
        a, b, c = (raw.get(k) for k in ("runtime_ms", "eval_ref_runtime_ms", "ref_runtime_ms"))
        if (d := _pct(a, b)) is not None:
            first.append(d)
        if (d := _pct(b, c)) is not None:
            second.append(d)
    med = kb_memory._q
    return dict(zip(TIMING_ORDER, (med(sorted(first), 0.5), med(sorted(second), 0.5)), strict=True))


RAW_TIMINGS = ("runtime_ms", "eval_ref_runtime_ms", "ref_runtime_ms")


def timings_apart(m: dict[str, Any], ref: dict[str, dict[str, Any]]) -> float | None:
    """Per mode, the median over correct candidates of how far apart its three timings moved
    against exclusive's (the largest of the three % differences less the smallest, points). A
    shift of the whole command (its GPU, its buffers' placement) moves the three together and
    leaves the speedup; one of each region's own moves them apart (2026-12-06, three H100
    calls: 8 at once through krex 1.55, 2.01, 0.80; the native repeat 0.80, 0.61, 0.35)."""
    apart = []
    for r in m["commands"]:
        res, res0 = _result(r), _result(ref.get(r["problem"], {}))
        raw, raw0 = res.get("raw"), res0.get("raw")
        if not (res.get("correctness") and isinstance(raw, dict) and isinstance(raw0, dict)):
            continue
        ds = [d for k in RAW_TIMINGS if (d := _pct(raw.get(k), raw0.get(k))) is not None]
        if len(ds) == len(RAW_TIMINGS):
            apart.append(max(ds) - min(ds))
    return kb_memory._q(sorted(apart), 0.5)


STATS = ("runtime_stats", "ref_runtime_stats")  # the candidate's and the final reference's
TRIAL_SPREAD = ("std_over_mean", "mean_over_min")


def trial_spread(m: dict[str, Any]) -> dict[str, float | None]:
    """Per mode, the median over the timings KernelBench keeps the stats of (the candidate's,
    the final reference's; correct candidates) of the trials' std over their mean and of
    their mean over their fastest trial, in %: how much the 100 trials of one timing scatter.
    Natively 0.4-0.8 % and 0.4-1.1 % on H100s; a mode that adds to it moves the means, and so
    the speedups (2026-12-06, one at a time through krex: 0.9 and 1.0 % on one H100, as
    native on another)."""
    spread, above = [], []
    for r in m["commands"]:
        res = _result(r)
        for key in STATS if res.get("correctness") else ():
            s = res.get(key)
            if not isinstance(s, dict) or not s.get("mean") or not s.get("min"):
                continue
            if isinstance(s.get("std"), int | float):
                spread.append(s["std"] / s["mean"] * 100)
            above.append((s["mean"] / s["min"] - 1) * 100)
    med = kb_memory._q
    return dict(zip(TRIAL_SPREAD, (med(spread, 0.5), med(above, 0.5)), strict=True))


EARLY_TRIALS = 10  # the trials timed while the grant's NVML reads may still run (~15-25 ms)


def early_trials(m: dict[str, Any]) -> float | None:
    """Per mode, the median over every timing whose trials its line keeps (`raw.trials_ms`:
    the candidate's and both references'; correct candidates) of the mean of its first
    EARLY_TRIALS trials over the mean of the rest, in %. A region's grant starts NVML reads
    beside the owner (krex/daemon/regions.py, the clock sample, the memory split, the audit:
    ~15-25 ms, the first ~10 trials of a KernelBench timing): if those reads slowed the GPU or
    the host's launch, krex's early trials would be slower than natively. On an H100
    (2026-12-06) +0.46 to +0.60 % under krex, with or without those reads, against +0.19 to
    +0.41 % natively."""
    ratios = []
    for r in m["commands"]:
        for trials in _trials(r).values():
            if not isinstance(trials, list) or len(trials) < 2 * EARLY_TRIALS:
                continue
            first, rest = trials[:EARLY_TRIALS], trials[EARLY_TRIALS:]
            if all(isinstance(x, int | float) and x > 0 for x in trials):
                ratios.append((statistics.fmean(first) / statistics.fmean(rest) - 1) * 100)
    return kb_memory._q(sorted(ratios), 0.5)


def summarise(modes: list[dict[str, Any]]) -> dict[str, Any]:
    """Each mode against exclusive: verdicts, speedups (versus), wall clock (the module's
    text); the native repeat's spread by candidate."""
    by = {m["mode"]: {r["problem"]: r for r in m["commands"]} for m in modes}
    ref = by.get("exclusive", {})
    spread = {}  # the native repeat's |difference| of each candidate's speedup, %
    for p, r in by.get("exclusive2", {}).items():
        d = _pct(_speedups(r)[0], _speedups(ref.get(p, {}))[0])
        if d is not None:
            spread[p] = abs(d)
    base = next((m for m in modes if m["mode"] == "exclusive"), None)
    for m in modes:
        results = [_result(r).get(RESULT) for r in m["commands"]]
        m["verdicts"] = {v: results.count(v) for v in sorted({v for v in results if v})}
        m["timing_order_pct"] = timing_order(m)
        m["trial_spread_pct"] = trial_spread(m)
        m["early_trials_pct"] = early_trials(m)
        if base is None or m is base:
            continue
        versus(m, ref, spread)
        m["timings_apart_pct"] = timings_apart(m, ref)
        if base.get("cmds_per_min_ok"):
            m["throughput_vs_exclusive"] = m["cmds_per_min_ok"] / base["cmds_per_min_ok"]
        whole = not m["not_run"] and not base["not_run"]
        whole = whole and len(m["commands"]) == len(base["commands"]) and m["wall_s"] > 0
        m["wall_ratio"] = base["wall_s"] / m["wall_s"] if whole else None
    return {"modes": modes, "native_spread_pct": spread or None}


def _f(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _cell(r: dict[str, Any], ex: dict[str, Any]) -> str:
    """A candidate's cell in a mode: its speedup's difference, else its verdict or status; !
    when off or when its verdict is not exclusive's."""
    v, v0, d = _result(r).get(RESULT), _result(ex).get(RESULT), r.get("speedup_diff_pct")
    cell = r.get("status", "-") if v is None else v if d is None else f"{d:+.2f}%"
    return cell + ("!" if r.get("off") or (v and v0 and v != v0) else "")


# What ran beside a native mode (kb_memory.BESIDE), by the key its record is under: the field
# that says it ran, what it did, and what is said where it did not, with the default reason.
BESIDE_TEXT = {
    "nvml_poll": (
        "nvml",
        "beside it NVML read every {period_s} s ({rounds} rounds, p50 {round_ms_p50} ms, max"
        " {round_ms_max} ms)",
        "no NVML read beside it",
        "NVML did not open",
    ),
    "churn": (
        "cuda",
        "beside it {procs} processes held device memory, churned every {period_s} s ({rounds}"
        " rounds, each held p50 {held_gib_p50} GiB, max {held_gib_max})",
        "no device memory held beside it",
        "no CUDA",
    ),
}


def table(doc: dict[str, Any]) -> str:
    """Per candidate (exclusive's verdict and speedup, each mode's difference), then per mode."""
    modes = doc["modes"]
    names = [m["mode"] for m in modes if m["mode"] != "exclusive"]
    rows: dict[str, dict[str, dict[str, Any]]] = {}
    for m in modes:
        for r in m["commands"]:
            rows.setdefault(r["problem"], {})[m["mode"]] = r
    head = f"{'candidate':52} {'verdict':>9} {'speedup':>8} "
    lines = [head + " ".join(f"{n:>11}" for n in names)]
    for problem, by in rows.items():
        ex = by.get("exclusive", {})
        verdict = _result(ex).get(RESULT) or ex.get("status", "-")
        lead = f"{problem[:52]:52} {verdict:>9} {_f(_speedups(ex)[0], '.4f'):>8} "
        lines.append(lead + " ".join(f"{_cell(by.get(n, {}), ex):>11}" for n in names))
    lines.append(
        "(speedup: exclusive's, from the trials' means; % its difference in each mode, ! off\n"
        " by more than the native repeat's + 0.3 points, or a verdict that differs)"
    )
    lines.append("")
    lines.append(
        f"{'mode':10} {'ok':>3} {'fail':>4} {'not':>3} {'wall s':>6} {'wall x':>6} {'rate x':>6} "
        f"{'verdicts':>8} {'|d|p50%':>7} {'|d|p95%':>7} {'|d|max%':>7} {'kb max%':>7} "
        f"{'regions':>7} {'unclean':>7}  off"
    )
    for m in modes:
        q, qk = m.get("speedup_diff_pct_abs") or {}, m.get("speedup_diff_pct_abs_kb") or {}
        agree = "-" if "verdicts_of" not in m else f"{m['verdicts_agree']}/{m['verdicts_of']}"
        off = kb_memory.off_cell(m)
        figures = [q.get("p50"), q.get("p95"), q.get("max"), qk.get("max")]
        lines.append(
            f"{m['mode']:10} {m['ok']:>3} {m['failed']:>4} {m['not_run']:>3} {m['wall_s']:>6.0f} "
            f"{_f(m.get('wall_ratio'), '.2f'):>6} {_f(m.get('throughput_vs_exclusive'), '.2f'):>6} "
            f"{agree:>8} " + " ".join(f"{_f(x, '.2f'):>7}" for x in figures) + " "
            f"{_f(m.get('regions'), 'd'):>7} {_f(m.get('unclean'), 'd'):>7}  {off or '-'}"
        )
    dist = [(m["mode"], d) for m in modes if (d := m.get("within_native_dist"))]
    if dist:
        lines.append("")
        lines.append(
            "read over the distribution: the mode's |d| p50 / p95 / max against the native"
        )
        lines.append("repeat's at the same quantile + 0.3 points, over the candidates compared")
    for name, d in dist:
        cells = [
            f"{_f(d[k]['mode'], '.2f')} vs {_f(d[k]['native'], '.2f')} "
            + ("within" if d[k]["within"] else "beyond")
            for k in ("p50", "p95", "max")
        ]
        lines.append(f"{name:10} " + " | ".join(cells))
    lines.append("")
    lines.append(
        "timing order, the same model thrice (median %): candidate over the eval's reference,"
    )
    lines.append("that over the final reference (about 0 natively; the speedup moves by either);")
    lines.append("then how far apart the three moved against exclusive's (median, points)")
    for m in modes:
        o = m.get("timing_order_pct") or {}
        first, second = (o.get(k) for k in TIMING_ORDER)
        apart = _f(m.get("timings_apart_pct"), ".2f")
        lines.append(f"{m['mode']:10} {_f(first, '+.2f'):>7} {_f(second, '+.2f'):>7} {apart:>7}")
    lines.append("")
    lines.append("speedups from each timing's fastest and median trial, |d| p50 / max % against")
    lines.append("exclusive's (the fastest: the GPU's part, free of a slow launch on the host)")
    for m in modes:
        if m["mode"] == "exclusive":
            continue
        cells = []
        for name in TRIAL_SPEEDUPS:
            q = m.get(f"speedup_{name}_diff_pct_abs") or {}
            cells.append(f"{_f(q.get('p50'), '.2f'):>6} / {_f(q.get('max'), '.2f'):<6}")
        lines.append(f"{m['mode']:10} " + "  ".join(cells))
    lines.append("")
    lines.append(
        "the trials of one timing (median over timings, %): std / mean, mean / fastest,"
        f" the first {EARLY_TRIALS} over the rest"
    )
    for m in modes:
        t = m.get("trial_spread_pct") or {}
        sd, above = (t.get(k) for k in TRIAL_SPREAD)
        early = _f(m.get("early_trials_pct"), "+.2f")
        lines.append(f"{m['mode']:10} {_f(sd, '.2f'):>7} {_f(above, '.2f'):>7} {early:>7}")
    for m in modes:
        for key, (ran, did, none, why) in BESIDE_TEXT.items():
            r = m.get(key)
            if isinstance(r, dict):
                text = did.format_map(defaultdict(lambda: None, r)) if r.get(ran) else none
                reason = "" if r.get(ran) else f" ({r.get('error') or why})"
                lines.append(f"{m['mode']}: {text}{reason}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kb", type=Path, default=Path(".kb/eval"), help="see --populate")
    ap.add_argument("--json", type=Path, help="the results (required unless --populate)")
    ap.add_argument("--out", type=Path, help="logs and reports (default: beside --json)")
    ap.add_argument(
        "--modes", default="exclusive,krex8,exclusive2", help=", ".join(kb_memory.MODES)
    )
    ap.add_argument("--budget-s", type=float, default=540.0)
    ap.add_argument("--subset", type=int, help="only the first N of CANDIDATES")
    ap.add_argument("--baseline", type=Path, help="exclusive, exclusive2 from an earlier JSON")
    ap.add_argument("--correct-trials", type=int, default=5, help="eval_from_generations' 5")
    ap.add_argument("--perf-trials", type=int, default=100, help="eval_from_generations' 100")
    ap.add_argument("--timing-method", default="cuda_event", help="see KernelBench's timing.py")
    ap.add_argument(
        "--populate",
        type=Path,
        metavar="KERNELBENCH_CHECKOUT",
        help="copy KernelBench's package and the candidates into --kb, and exit",
    )
    ap.add_argument(
        "--table",
        type=Path,
        metavar="RESULTS_JSON",
        help="summarise an earlier run's results again and print its table (runs nothing)",
    )
    args = ap.parse_args()
    if args.populate is not None:
        return populated(args.populate, args.kb)
    if args.table is not None:
        try:
            modes = json.loads(args.table.read_text())["modes"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            ap.error(f"--table {args.table}: not a kb_eval.py results file ({e})")
        print(table(summarise(modes)))
        return 0
    if args.json is None:
        ap.error("--json is required")
    names = kb_memory.mode_names(ap, args.modes)
    chosen = CANDIDATES[: args.subset] if args.subset else CANDIDATES
    missing = lacking(args.kb, chosen)
    if missing:
        more = " ..." if len(missing) > 3 else ""
        ap.error(f"{args.kb} lacks {', '.join(missing[:3])}{more} (see --populate)")
    baseline = kb_memory.baseline_modes(args.baseline, names)
    args.json.resolve().parent.mkdir(parents=True, exist_ok=True)
    out_dir = args.out or args.json.resolve().parent / "kb_eval"
    cmds = commands(chosen)
    argv_for = candidate(
        args.kb.resolve(), args.correct_trials, args.perf_trials, args.timing_method
    )
    doc = run(names, cmds, argv_for, args.json, out_dir, args.budget_s, baseline)
    doc["date"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    doc["command"] = "python3 scripts/bench/kb_eval.py " + " ".join(sys.argv[1:])
    doc["order"] = [c.problem for c in cmds]
    doc["settings"] = {
        "correct_trials": args.correct_trials,
        "perf_trials": args.perf_trials,
        "timing_method": args.timing_method,
    }
    with contextlib.suppress(OSError, ValueError):
        doc["kernelbench"] = json.loads((args.kb / "kernelbench.json").read_text())
    args.json.write_text(json.dumps(doc, indent=1))
    print(table(doc), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
