"""scripts/bench/kb_eval.py and kb_eval_candidate.py without a GPU: the candidates, populate,
the command each mode runs, the candidate's line (a fake torch and KernelBench in place of the
real ones, KernelBench's missing imports served by the stand-ins), the comparison of verdicts
and speedups, the table and the time budget (the GPU runs themselves are for docs/results/)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, load_script

MIRROR = Path("/work/.mirror/ScalingIntelligence+KernelBench/repo")  # a bare clone, if here

# KernelBench's package as far as the candidate uses it: the imports of the real one (utils:
# dotenv, tqdm, openai, litellm; eval: numpy, requests, pydantic), its result record, an eval
# that times the candidate and (excessive-speedup check) the reference through get_timing_stats
# as eval.py does, and measure_ref_program_time. A "timer" returns trials around a cost.
FAKE_KB = {
    "__init__.py": "from . import utils\n",
    "utils.py": """
        from dotenv import load_dotenv
        from tqdm import tqdm
        from openai import OpenAI
        from litellm import completion
        load_dotenv()
    """,
    "timing.py": """
        def time_execution_with_cuda_event(cost, args, num_warmup=3, num_trials=10, **kw):
            return [cost * (1 + 0.001 * i) for i in range(num_trials)]

        def get_timing_function(method="cuda_event"):
            assert method == "cuda_event"
            return time_execution_with_cuda_event

        def get_timing_stats(elapsed_times, device=None):
            mean = sum(elapsed_times) / len(elapsed_times)
            return {"mean": float(f"{mean:.3g}"), "num_trials": len(elapsed_times)}

        def measure_ref_program_time(ref_arch_name, ref_arch_src, num_trials=100, **kw):
            assert not kw["use_torch_compile"] and kw["precision"] == "fp32"
            return get_timing_stats(time_execution_with_cuda_event(2.6, [], num_trials=num_trials))
    """,
    "eval.py": """
        import numpy
        import requests
        from pydantic import BaseModel
        from . import timing

        class KernelExecResult(BaseModel):
            compiled: bool = False
            correctness: bool = False
            metadata: dict = {}
            runtime: float = -1.0
            runtime_stats: dict = {}
            ref_runtime: float = -1.0
            ref_runtime_stats: dict = {}

        def eval_kernel_against_ref(original_model_src, custom_model_src, num_perf_trials=10,
                                    measure_performance=False, **kw):
            assert "class Model(" in original_model_src and "class ModelNew(" in custom_model_src
            assert kw["backend"] == "cuda" and kw["device"] == "cuda:0" and measure_performance
            if "RETRY" in custom_model_src:
                return None
            if "RAISE" in custom_model_src:
                raise RuntimeError("CUDA error: an illegal memory access")
            ok = "WRONG" not in custom_model_src
            meta = {"hardware": "fake"} if ok else {"runtime_error": ValueError("boom")}
            result = KernelExecResult(compiled=True, correctness=ok, metadata=meta)
            fn = timing.get_timing_function(kw["timing_method"])
            if ok:
                stats = timing.get_timing_stats(fn(1.23456, [], num_trials=num_perf_trials))
                result.runtime, result.runtime_stats = stats["mean"], stats
            stats = timing.get_timing_stats(fn(2.4, [], num_trials=num_perf_trials))
            result.ref_runtime, result.ref_runtime_stats = stats["mean"], stats
            return result
    """,
}
FAKE_TORCH = """
float32 = "torch.float32"

def device(name):
    return name

class cuda:
    @staticmethod
    def max_memory_allocated():
        return 1234
"""
REFERENCE = """import torch
import torch.nn as nn

class Model(nn.Module):
    \"\"\"A Model that adds one.\"\"\"
    def __init__(self):
        super(Model, self).__init__()

    def forward(self, x):
        return x + 1

def get_inputs():
    return [torch.rand(4)]

def get_init_inputs():
    return []
"""


@pytest.fixture
def ke() -> Any:
    return load_script("scripts/bench/kb_eval.py")


@pytest.fixture
def cand(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.syspath_prepend(str(ROOT / "scripts" / "bench"))  # for its kb_candidate import
    return load_script("scripts/bench/kb_eval_candidate.py")


def fake_checkout(root: Path, names: tuple[str, ...]) -> Path:
    for name, body in FAKE_KB.items():
        (root / "src" / "kernelbench").mkdir(parents=True, exist_ok=True)
        (root / "src" / "kernelbench" / name).write_text(textwrap.dedent(body))
    (root / "src" / "kernelbench" / "__pycache__").mkdir()
    for name in names:
        (root / "KernelBench" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "KernelBench" / name).write_text(REFERENCE)
    return root


def test_24_candidates_from_both_levels_in_one_fixed_order(ke: Any) -> None:
    names = ke.CANDIDATES
    assert len(names) == len(set(names)) == 24
    assert sum(n.startswith("level1/") for n in names) == 12
    assert sum(n.startswith("level2/") for n in names) == 12
    assert {n.split("/")[0] for n in names[:2]} == {"level1", "level2"}  # any --subset has both
    cmds = ke.commands()
    assert cmds == ke.commands() and [c.problem for c in cmds] != list(names)
    assert sorted(c.problem for c in cmds) == sorted(names)
    assert {c.variant for c in cmds} == {"eval"} and len({c.tag for c in cmds}) == 24


def test_a_reference_as_its_own_candidate(ke: Any) -> None:
    new = ke.as_candidate(REFERENCE)
    assert "class ModelNew(nn.Module):" in new and "super(ModelNew, self)" in new
    assert "nn.Module" in new and "A ModelNew that adds one" in new
    assert new.replace("ModelNew", "Model") == REFERENCE
    with pytest.raises(ValueError):
        ke.as_candidate("class Net(nn.Module):\n    pass\n")


def test_populate_copies_the_package_references_and_candidates(ke: Any, tmp_path: Path) -> None:
    names = ("level1/1_A.py", "level2/7_B.py", "level2/9_C.py")
    checkout = fake_checkout(tmp_path / "KernelBench", names[:2])
    kb = tmp_path / ".kb" / "eval"
    assert ke.populate(checkout, kb, names) == ["level2/9_C.py"]
    assert ke.lacking(kb, names[:2]) == []
    assert ke.lacking(kb, names) == [
        str(kb / sub / "level2/9_C.py") for sub in ("reference", "candidate")
    ]
    assert sorted(p.name for p in (kb / "src" / "kernelbench").iterdir()) == sorted(FAKE_KB)
    assert (kb / "reference" / "level2" / "7_B.py").read_text() == REFERENCE
    assert "class ModelNew(" in (kb / "candidate" / "level2" / "7_B.py").read_text()
    assert json.loads((kb / "kernelbench.json").read_text()) == {
        "checkout": str(checkout.resolve()),
        "commit": None,  # not a git checkout
    }
    assert ke.populate(tmp_path / "nothing", tmp_path / "kb2") == [
        str(tmp_path / "nothing" / "src" / "kernelbench" / "eval.py")
    ]


@pytest.mark.skipif(not MIRROR.is_dir(), reason="no KernelBench clone on this machine")
def test_every_candidate_is_in_kernelbench_with_a_class_model(ke: Any) -> None:
    for name in ke.CANDIDATES:
        text = subprocess.run(
            ["git", "-C", str(MIRROR), "show", f"HEAD:KernelBench/{name}"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        assert "class ModelNew(" in ke.as_candidate(text), name
        assert "Dropout" not in text and "def get_inputs" in text, name


def test_the_command_natively_and_through_krex(
    ke: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kb = tmp_path / "kb"
    argv_for = ke.candidate(kb, correct_trials=3, perf_trials=50, timing_method="do_bench")
    c = ke.commands()[0]
    assert argv_for(c) == [
        sys.executable, str(ROOT / "scripts" / "bench" / "kb_eval_candidate.py"),
        str(kb / "src"), str(kb / "reference" / c.problem), str(kb / "candidate" / c.problem),
        "--correct-trials", "3", "--perf-trials", "50", "--timing-method", "do_bench",
    ]  # fmt: skip
    seen: list[list[str]] = []

    def fake_run(
        cmd: Any, argv: list[str], env: dict[str, str], logs: Path, deadline: float, value: str
    ) -> Any:
        seen.append(argv)
        assert value == "verdict"
        report = Path(argv[argv.index("--report") + 1])
        report.write_text(json.dumps({"exit_code": 0, "regions": [{"clean": True}] * 2}))
        return {"rc": 0, "status": "ok", "verdict": "correct", "result": {"verdict": "correct"}}

    @contextlib.contextmanager
    def fake_daemon(tmp: Path, slots: int, **kw: Any) -> Iterator[Path]:
        yield tmp / f"krex-{slots}.sock"

    monkeypatch.setattr(ke.kb_memory.memory_check, "daemon", fake_daemon)
    monkeypatch.setattr(ke.kb_memory, "run_command", fake_run)
    cmds = ke.commands(ke.CANDIDATES[:3])
    log = ke.kb_memory.Log(tmp_path / "c.jsonl")
    m = ke.kb_memory.run_mode("krex8", cmds, argv_for, tmp_path, tmp_path, time.monotonic() + 60,
                              log, ke.RESULT)  # fmt: skip
    assert m["ok"] == 3 and m["regions"] == 6 and m["slots"] == 8
    for argv in seen:
        run = argv.index("run")
        assert argv[run - 2 : run] == ["-m", "krex.cli"] and "--auto-regions" in argv
        assert "--no-pool" not in argv
        assert argv[argv.index("--") + 1 :] in [argv_for(c) for c in cmds]


def candidate_line(tmp_path: Path, body: str) -> tuple[int, dict[str, Any], str]:
    """kb_eval_candidate.py run on a populated fake KernelBench; (exit code, its line, stderr)."""
    kb, checkout = tmp_path / "kb", fake_checkout(tmp_path / "KernelBench", ("level1/1_A.py",))
    (tmp_path / "torch").mkdir(exist_ok=True)
    (tmp_path / "torch" / "__init__.py").write_text(textwrap.dedent(FAKE_TORCH))
    load_script("scripts/bench/kb_eval.py").populate(checkout, kb, ("level1/1_A.py",))
    (kb / "candidate" / "level1" / "1_A.py").write_text(body)
    p = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench" / "kb_eval_candidate.py"), str(kb / "src"),
         str(kb / "reference" / "level1" / "1_A.py"), str(kb / "candidate" / "level1" / "1_A.py"),
         "--perf-trials", "5"],
        capture_output=True, text=True, timeout=60, env={"PYTHONPATH": str(tmp_path)},
    )  # fmt: skip
    lines = [x for x in p.stdout.splitlines() if x.startswith("{")]
    return p.returncode, json.loads(lines[-1]) if lines else {}, p.stderr


def test_the_candidates_line_kernelbench_figures_and_the_trials_own(
    ke: Any, cand: Any, tmp_path: Path
) -> None:
    rc, row, err = candidate_line(tmp_path, ke.as_candidate(REFERENCE))
    assert rc == 0, err
    assert row["verdict"] == "correct" and row["compiled"] and row["correctness"]
    trials = [1 + 0.001 * i for i in range(5)]
    new, ref = 1.23456 * sum(trials) / 5, 2.6 * sum(trials) / 5
    assert row["runtime_ms"] == float(f"{new:.3g}") == 1.24  # as get_timing_stats rounds it
    assert row["ref_runtime_ms"] == float(f"{ref:.3g}") and row["eval_ref_runtime_ms"] == 2.4
    assert row["speedup"] == pytest.approx(row["ref_runtime_ms"] / row["runtime_ms"])
    raw = row["raw"]
    assert raw["runtime_ms"] == pytest.approx(new) and raw["ref_runtime_ms"] == pytest.approx(ref)
    assert raw["eval_ref_runtime_ms"] == pytest.approx(2.4 * sum(trials) / 5)
    assert raw["speedup"] == pytest.approx(ref / new) and raw["trials"] == [5, 5, 5]
    assert raw["speedup"] != pytest.approx(row["speedup"], abs=1e-4)  # the rounding, shown
    each = raw["trials_ms"]
    assert each["candidate"] == pytest.approx([1.23456 * t for t in trials], abs=1e-6)
    assert each["eval_reference"] == pytest.approx([2.4 * t for t in trials], abs=1e-6)
    assert each["reference"] == pytest.approx([2.6 * t for t in trials], abs=1e-6)
    missing = [m for m in cand.STUBS if importlib.util.find_spec(m) is None]
    assert row["stubbed"] == sorted(missing) and "pydantic" in missing  # this venv lacks it
    assert row["metadata"] == {"hardware": "fake"} and row["peak_bytes"] == 1234


def test_the_candidates_line_when_wrong_when_it_raises_when_to_retry(
    ke: Any, tmp_path: Path
) -> None:
    rc, row, _ = candidate_line(tmp_path / "a", ke.as_candidate(REFERENCE) + "# WRONG\n")
    assert rc == 0 and row["verdict"] == "incorrect" and row["speedup"] is None
    assert row["runtime_ms"] is None and row["raw"]["speedup"] is None
    assert row["raw"]["trials"] == [0, 5, 5] and row["eval_ref_runtime_ms"] == 2.4
    assert row["metadata"] == {"runtime_error": "boom"}  # an exception, as its text
    rc, row, err = candidate_line(tmp_path / "b", ke.as_candidate(REFERENCE) + "# RAISE\n")
    assert rc == 0 and row["verdict"] == "error" and not row["compiled"]
    assert "CUDA error" in row["metadata"]["other_error"] and "Traceback" in err
    rc, row, _ = candidate_line(tmp_path / "c", ke.as_candidate(REFERENCE) + "# RETRY\n")
    assert rc == 3 and row["verdict"] == "retry"


def test_the_stand_ins_are_asked_last_and_copy_their_defaults(
    cand: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "kbe_real.py").write_text("VALUE = 'real'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(cand.STUBS, "kbe_real", "VALUE = 'stub'\n")
    monkeypatch.setitem(cand.STUBS, "kbe_absent", "VALUE = 'stub'\n")
    finder = cand.StubFinder()
    monkeypatch.setattr(sys, "meta_path", [*sys.meta_path, finder])
    for name in ("kbe_real", "kbe_absent"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    import kbe_absent  # type: ignore[import-not-found]
    import kbe_real  # type: ignore[import-not-found]

    assert (kbe_real.VALUE, kbe_absent.VALUE) == ("real", "stub") and finder.served == [
        "kbe_absent"
    ]
    pydantic: dict[str, Any] = {}
    exec(cand.STUBS["pydantic"], pydantic)

    base: Any = pydantic["BaseModel"]

    class Result(base):  # type: ignore[misc]
        compiled: bool = False
        metadata: dict[str, Any] = {}  # noqa: RUF012

    a, b = Result(compiled=True), Result(metadata={"x": 1})
    a.metadata["y"] = 2
    assert (a.compiled, a.metadata, b.compiled, b.metadata) == (True, {"y": 2}, False, {"x": 1})
    assert Result.metadata == {} and b.model_dump() == {"compiled": False, "metadata": {"x": 1}}


def rec(problem: str, verdict: str = "correct", raw: float | None = 1.0, kb: float | None = 1.0,
        clean: bool | None = None, status: str = "ok") -> dict[str, Any]:  # fmt: skip
    """A command's record as run_mode keeps it, with the candidate's line."""
    res = {"verdict": verdict, "compiled": verdict != "not compiled",
           "correctness": verdict == "correct", "speedup": kb, "raw": {"speedup": raw}}  # fmt: skip
    r: dict[str, Any] = {"problem": problem, "variant": "eval", "status": status, "result": res}
    if clean is not None:
        r["krex"] = {"timing_clean": clean}
    return r


def mode(name: str, rows: list[dict[str, Any]], wall: float, slots: int | None = None) -> Any:
    not_run = sum(r["status"] == "not_run" for r in rows)
    ok = len(rows) - not_run
    return {"mode": name, "slots": slots, "commands": rows, "wall_s": wall, "ok": ok,
            "failed": 0, "not_run": not_run, "cmds_per_min_ok": 60 * ok / wall}  # fmt: skip


def native(name: str, a: float, b: float, wall: float) -> Any:
    """exclusive or exclusive2: a and b correct with those speedups, c incorrect, d at 1."""
    rows = [rec("a", raw=a, kb=1.0), rec("b", raw=b, kb=2.0), rec("c", "incorrect", None, None)]
    return mode(name, [*rows, rec("d")], wall)


def test_verdicts_speedups_against_the_native_repeat_and_the_wall_clock(ke: Any) -> None:
    ex, rep = native("exclusive", 1.0, 2.0, 40.0), native("exclusive2", 1.001, 1.996, 41.0)
    rows = [
        rec("a", raw=1.004, kb=1.01, clean=True),  # off: 0.4 > 0.1 + 0.3
        rec("b", raw=2.002, kb=2.00, clean=True),  # within: 0.1 <= 0.2 + 0.3
        rec("c", "correct", 1.0, 1.0, clean=True),  # a verdict that differs
        rec("d", raw=1.1, kb=1.1, clean=False),  # its timing's region unclean
    ]
    krex = mode("krex8", rows, 10.0, slots=8)
    doc = ke.summarise([ex, krex, rep])  # fmt: skip
    assert doc["native_spread_pct"] == pytest.approx({"a": 0.1, "b": 0.2, "d": 0.0})
    k = doc["modes"][1]
    assert (k["verdicts_agree"], k["verdicts_of"]) == (3, 4)
    assert k["verdict_mismatches"] == ["c: correct (exclusive: incorrect)"]
    a, b, c, d = k["commands"]
    assert a["speedup_diff_pct"] == pytest.approx(0.4) and a["off"] is True
    assert a["speedup_diff_pct_kb"] == pytest.approx(1.0)
    assert b["speedup_diff_pct"] == pytest.approx(0.1) and b["off"] is False
    assert c["speedup_diff_pct"] is None and "off" not in c and "off" not in d  # unclean
    assert (k["off"], k["off_of"]) == (1, 2)
    assert k["off_if_native"] == 0.0  # spreads 0.1, 0.2, 0.0: none exceeds another + 0.3
    q = k["speedup_diff_pct_abs"]
    assert q["max"] == pytest.approx(10.0) and q["p50"] == pytest.approx(0.4)
    assert k["wall_ratio"] == 4.0 and k["throughput_vs_exclusive"] == 4.0
    assert k["verdicts"] == {"correct": 4} and doc["modes"][0]["verdicts"] == {
        "correct": 3, "incorrect": 1}  # fmt: skip
    r2 = doc["modes"][2]
    assert (
        "off" not in r2 and r2["verdicts_agree"] == 4 and r2["wall_ratio"] == pytest.approx(40 / 41)
    )
    text = ke.table(doc)
    assert "+0.40%!" in text and "correct!" in text and "+0.10%" in text
    assert text.splitlines()[-1].startswith("exclusive2") and " 3/4 " in text
    # Without the native repeat nothing is called off; a mode cut short has no wall ratio.
    cut = mode("krex8", [rec("a", raw=1.5, clean=True), rec("b", status="not_run")], 5.0, 8)
    doc = ke.summarise([mode("exclusive", [rec("a"), rec("b")], 20.0), cut])
    assert doc["modes"][1]["off"] == "no native repeat" and doc["modes"][1]["wall_ratio"] is None
    assert doc["modes"][1]["throughput_vs_exclusive"] == pytest.approx(2.0)
    assert doc["native_spread_pct"] is None and "no native repeat" in ke.table(doc)


def test_the_timing_order_of_the_same_model_thrice(ke: Any) -> None:
    """Per mode, the median % of the candidate's time over the eval's reference time, and of
    that over the final reference's (the speedup's numerator): a lean of one timing shows
    apart from the speedups; incorrect candidates and missing figures are left out."""

    def timed(problem: str, cand: float, ref1: float, ref2: float) -> dict[str, Any]:
        r = rec(problem)
        r["result"]["raw"] |= {"runtime_ms": cand, "eval_ref_runtime_ms": ref1,
                               "ref_runtime_ms": ref2}  # fmt: skip
        return r

    rows = [timed("a", 1.01, 1.0, 1.0), timed("b", 2.0, 2.02, 2.0), timed("c", 3.0, 3.0, 2.97)]
    wrong = rec("d", "incorrect", None, None)
    wrong["result"]["raw"] = {"runtime_ms": 9.0, "eval_ref_runtime_ms": 1.0, "ref_runtime_ms": 1.0}
    m = mode("krex8", [*rows, wrong, rec("e")], 10.0, slots=8)  # e: no timings recorded
    o = ke.timing_order(m)
    assert o["candidate_over_eval_reference"] == pytest.approx(0.0)  # -0.99, 0, +1: median 0
    assert o["eval_reference_over_final_reference"] == pytest.approx(1.0)  # 0, +1, +1.01
    doc = ke.summarise([mode("exclusive", [rec("a")], 20.0), m])
    assert doc["modes"][1]["timing_order_pct"] == o
    assert "krex8        +0.00   +1.00" in ke.table(doc)
    assert ke.timing_order(mode("x", [], 1.0)) == dict.fromkeys(ke.TIMING_ORDER)


def test_how_much_the_trials_of_one_timing_scatter(ke: Any) -> None:
    """Per mode, the median over the candidate's and the final reference's stats of std over
    mean and of mean over the fastest trial, in %; incorrect candidates and stats without a
    mean or a fastest trial left out."""

    def stats(mean: float, std: float, low: float) -> dict[str, float]:
        return {"mean": mean, "std": std, "min": low, "max": 2 * mean, "num_trials": 100}

    a, b, wrong = rec("a"), rec("b"), rec("c", "incorrect", None, None)
    a["result"] |= {"runtime_stats": stats(2.0, 0.02, 1.98),
                    "ref_runtime_stats": stats(1.0, 0.03, 0.99)}  # fmt: skip
    b["result"] |= {"runtime_stats": stats(4.0, 0.02, 3.96), "ref_runtime_stats": {"mean": 0}}
    wrong["result"]["runtime_stats"] = stats(1.0, 0.5, 0.5)
    m = mode("krex1", [a, b, wrong, rec("d")], 10.0, slots=1)
    t = ke.trial_spread(m)
    assert t["std_over_mean"] == pytest.approx(1.0)  # 1, 3, 0.5: median 1
    assert t["mean_over_min"] == pytest.approx(1.0101, abs=1e-3)  # 1.0101 thrice
    doc = ke.summarise([mode("exclusive", [rec("a")], 20.0), m])
    assert doc["modes"][1]["trial_spread_pct"] == t
    assert doc["modes"][0]["trial_spread_pct"] == dict.fromkeys(ke.TRIAL_SPREAD)
    assert "krex1         1.00    1.01" in ke.table(doc)


def test_speedups_from_the_fastest_and_the_median_trial(ke: Any) -> None:
    """From each timing's trials (the line's raw.trials_ms): the fastest trials' speedup is the
    GPU's part of a difference; a slow launch on the host moves the median, not the fastest."""

    def timed(problem: str, cand: list[float], ref: list[float]) -> dict[str, Any]:
        r = rec(problem)
        r["result"]["raw"]["trials_ms"] = {"candidate": cand, "eval_reference": ref,
                                           "reference": ref}  # fmt: skip
        return r

    ex = mode("exclusive", [timed("a", [1.0, 1.0, 1.1], [2.0, 2.0, 2.2]), rec("b")], 20.0)
    # a: the reference's trials slow on the host but its fastest trial the same; b: no trials
    k = mode("krex8", [timed("a", [1.0, 1.0, 1.1], [2.0, 2.1, 2.1]), rec("b")], 5.0, slots=8)
    doc = ke.summarise([ex, k])
    m = doc["modes"][1]
    assert m["speedup_fastest_diff_pct_abs"] == {"p50": 0.0, "p95": 0.0, "max": 0.0}
    assert m["speedup_median_diff_pct_abs"]["p50"] == pytest.approx(5.0)
    assert "krex8        0.00 / 0.00      5.00 / 5.00" in ke.table(doc)
    # Lines from before the trials were kept, and incorrect candidates, give no figure.
    old = ke.summarise([mode("exclusive", [rec("a")], 20.0), mode("krex8", [rec("a")], 5.0, 8)])
    assert old["modes"][1]["speedup_fastest_diff_pct_abs"] is None
    wrong = timed("a", [1.0], [2.0])
    wrong["result"]["correctness"] = False
    assert ke._trial_speedup(wrong, min) is None


def test_how_often_a_native_run_would_be_called_off_by_the_same_rule(ke: Any) -> None:
    """The control for `off`: over ordered pairs of the native repeat's differences, the share
    where one exceeds the other + 0.3 points."""
    rate = ke.kb_memory.off_rate_if_native
    assert rate({"a": 0.0, "b": 1.0, "c": 2.0}) == pytest.approx(0.5)
    assert rate({"a": 0.1, "b": 0.35}) == 0.0  # 0.35 > 0.4: no
    assert rate({"a": 1.0}) is None and rate({}) is None
    ex, rep = native("exclusive", 1.0, 2.0, 40.0), native("exclusive2", 1.01, 2.0, 41.0)
    krex = mode("krex8", [rec("a", raw=1.0, clean=True), rec("b", raw=2.0, clean=True)], 9.0, 8)
    k = ke.summarise([ex, krex, rep])["modes"][1]
    # spreads a 1.0, b 0.0, d 0.0: (a, b) and (a, d) of 6 pairs; 2 compared: 0.67
    assert (k["off"], k["off_of"], k["off_if_native"]) == (0, 2, 0.7)
    assert "0 of 2 (a native run: 0.7)" in ke.table({"modes": [ex, k, rep]})


def test_table_summarises_an_earlier_run_again_and_refuses_what_is_not_one(
    ke: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ex, rep = native("exclusive", 1.0, 2.0, 40.0), native("exclusive2", 1.01, 2.0, 41.0)
    krex = mode("krex8", [rec("a", raw=1.0, clean=True), rec("b", raw=2.0, clean=True)], 9.0, 8)
    saved = tmp_path / "kb_eval.json"
    saved.write_text(json.dumps({"modes": [ex, krex, rep]}))
    monkeypatch.setattr("sys.argv", ["kb_eval.py", "--table", str(saved)])
    assert ke.main() == 0
    assert "0 of 2 (a native run: 0.7)" in capsys.readouterr().out
    monkeypatch.setattr("sys.argv", ["kb_eval.py", "--table", str(tmp_path / "none.json")])
    with pytest.raises(SystemExit) as e:
        ke.main()
    assert e.value.code == 2 and "not a kb_eval.py results file" in capsys.readouterr().err


FAKE_CANDIDATE = """
import json, os, sys, time
name = os.path.basename(sys.argv[3])
if name.startswith("hang"):
    time.sleep(60)
print(json.dumps({"verdict": "correct", "compiled": True, "correctness": True, "speedup": 1.0,
                  "raw": {"speedup": 1.0}}))
"""


def test_a_run_within_its_budget_keeps_every_record(
    ke: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A command past its mode's deadline is killed and recorded not run, the later ones are
    not started; every record is in commands.jsonl and the JSON is rewritten after each mode."""
    script = tmp_path / "fake.py"
    script.write_text(textwrap.dedent(FAKE_CANDIDATE))
    monkeypatch.setattr(ke.kb_memory, "RESERVE_S", 0.0)
    monkeypatch.setattr(ke.kb_memory, "KILL_GRACE_S", 0.5)
    cmds = [ke.kb_memory.Command(n, "eval") for n in ("ok_a", "hang_b", "ok_c")]
    argv_for = lambda c: [sys.executable, str(script), "src", "ref", c.problem]  # noqa: E731
    out = tmp_path / "r.json"
    t0 = time.monotonic()
    doc = ke.run(["exclusive", "exclusive2"], cmds, argv_for, out, tmp_path / "o", 4.0)
    assert time.monotonic() - t0 < 4.0 + 2 * 0.5 + 5
    ex, rep = doc["modes"]
    assert [r["status"] for r in ex["commands"]] == ["ok", "not_run", "not_run"]
    assert ex["commands"][1]["why"].startswith("budget (killed")
    assert rep["commands"][0]["status"] == "ok" and rep["verdicts_agree"] == 1
    assert json.loads(out.read_text())["partial"]
    lines = (tmp_path / "o" / "commands.jsonl").read_text().splitlines()
    assert len(lines) == 6 and all(json.loads(x)["mode"] for x in lines)
    assert "budget 4 s; estimates: exclusive 26 s, exclusive2 26 s" in capsys.readouterr().out


def test_gpu_check_has_the_kbeval_section() -> None:
    sh = (ROOT / "scripts" / "gpu_check.sh").read_text()
    assert subprocess.run(["bash", "-n", str(ROOT / "scripts" / "gpu_check.sh")]).returncode == 0
    section = sh[sh.index('*" kbeval "*') :].split("\nfi\n")[0]
    assert "scripts/bench/kb_eval.py --kb" in section and "$OUT/kb_eval.json" in section
    for knob in ("KB_EVAL_DIR", "KB_EVAL_MODES", "KB_EVAL_BUDGET_S", "KB_EVAL_SUBSET",
                 "KB_EVAL_BASELINE"):  # fmt: skip
        assert knob in section and knob in sh[: sh.index("PARTS=${PARTS")]


def test_the_command_line_from_populate_to_the_table(ke: Any, tmp_path: Path) -> None:
    """--populate, then two candidates natively twice, KernelBench and torch faked."""
    names = ke.CANDIDATES[:2]
    checkout, kb = fake_checkout(tmp_path / "KernelBench", names), tmp_path / "kb"
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(textwrap.dedent(FAKE_TORCH))
    script = [sys.executable, str(ROOT / "scripts" / "bench" / "kb_eval.py"), "--kb", str(kb)]
    env = {"PYTHONPATH": str(tmp_path)}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*script, *args], capture_output=True, text=True, env=env)

    pop = run("--populate", str(checkout))  # the fake checkout has only the first two
    assert pop.returncode == 1 and len(pop.stderr.splitlines()) == 22 and names[0] not in pop.stderr
    missing = run("--json", str(tmp_path / "r.json"))
    assert missing.returncode == 2 and "lacks" in missing.stderr and "--populate" in missing.stderr
    p = run("--json", str(tmp_path / "r.json"), "--modes", "exclusive,exclusive2", "--subset", "2",
            "--perf-trials", "7")  # fmt: skip
    assert p.returncode == 0, p.stderr
    doc = json.loads((tmp_path / "r.json").read_text())
    assert [m["mode"] for m in doc["modes"]] == ["exclusive", "exclusive2"]
    assert doc["modes"][1]["verdicts_agree"] == 2 and doc["native_spread_pct"] == {
        n: 0.0 for n in names
    }
    assert sorted(doc["order"]) == sorted(names) and doc["settings"]["perf_trials"] == 7
    assert doc["kernelbench"]["commit"] is None and "--subset 2" in doc["command"]
    first = doc["modes"][0]["commands"][0]["result"]
    assert first["raw"]["trials"] == [7, 7, 7] and first["verdict"] == "correct"
    assert p.stdout.splitlines()[-1].startswith("exclusive2")
    assert (tmp_path / "kb_eval" / "commands.jsonl").exists()  # beside --json


def test_how_much_slower_a_timings_first_trials_are(ke: Any) -> None:
    """Per mode, the median over timings with their trials of the first EARLY_TRIALS trials'
    mean over the rest's, in %: where the grant's NVML reads would show. Timings too short to
    split, incorrect candidates and lines without trials are left out; the table prints it,
    and what the NVML poller beside a native mode did."""
    n = ke.EARLY_TRIALS

    def timed(problem: str, first: float, rest: float, verdict: str = "correct") -> Any:
        r = rec(problem, verdict)
        trials = [first] * n + [rest] * (3 * n)
        r["result"]["raw"] = {"trials_ms": {"candidate": trials, "eval_reference": trials,
                                            "reference": [1.0] * (n + 1)}}  # fmt: skip
        return r

    k = mode("krex1", [timed("a", 1.02, 1.0), timed("b", 1.04, 1.0), timed("e", 1.03, 1.0),
                       timed("c", 9.0, 1.0, "incorrect"), rec("d")], 10.0, slots=1)  # fmt: skip
    assert ke.early_trials(k) == pytest.approx(3.0)  # 2, 2, 3, 3, 4, 4 %: 3
    ex = mode("exclusive", [timed("a", 1.0, 1.0)], 20.0)
    nv = mode("exclusive-nvml", [timed("a", 1.0, 1.0)], 20.0)
    nv["nvml_poll"] = {"nvml": True, "period_s": 0.1, "rounds": 200, "round_ms_p50": 2.5,
                       "round_ms_max": 9.0}  # fmt: skip
    doc = ke.summarise([ex, k, nv])
    assert [m["early_trials_pct"] for m in doc["modes"]] == [0.0, pytest.approx(3.0), 0.0]
    text = ke.table(doc)
    assert "krex1            -       -   +3.00" in text
    assert "exclusive-nvml: beside it NVML read every 0.1 s (200 rounds, p50 2.5 ms" in text
    nv["nvml_poll"] = {"nvml": False, "rounds": 0}
    assert "exclusive-nvml: no NVML read beside it (NVML did not open)" in ke.table(doc)
    nv["churn"] = {"cuda": True, "procs": 7, "period_s": 0.2, "rounds": 50,
                   "held_gib_p50": 0.9, "held_gib_max": 1.5}  # fmt: skip
    assert ("exclusive-nvml: beside it 7 processes held device memory, churned every 0.2 s"
            " (50 rounds, each held p50 0.9 GiB, max 1.5)") in ke.table(doc)  # fmt: skip
    nv["churn"] = {"cuda": False, "procs": 7}
    assert "exclusive-nvml: no device memory held beside it (no CUDA)" in ke.table(doc)


def test_how_far_apart_a_commands_three_timings_move(ke: Any) -> None:
    """Per mode against exclusive: the median over correct candidates of the largest less the
    smallest of the three timings' % differences; a command moved whole reads 0."""

    def timed(problem: str, cand: float, eval_ref: float, ref: float) -> Any:
        r = rec(problem)
        r["result"]["raw"] |= {"runtime_ms": cand, "eval_ref_runtime_ms": eval_ref,
                               "ref_runtime_ms": ref}  # fmt: skip
        return r

    ex = mode("exclusive", [timed(p, 1.0, 1.0, 1.0) for p in "abcd"], 20.0)
    k = mode("krex8", [timed("a", 1.01, 1.01, 1.01),  # moved whole: 0
                       timed("b", 0.98, 1.0, 1.02),   # apart: 4 points
                       timed("c", 1.0, 1.01, 1.0),    # 1 point
                       rec("d")], 5.0, slots=8)  # fmt: skip
    doc = ke.summarise([ex, k])
    assert doc["modes"][1]["timings_apart_pct"] == pytest.approx(1.0)  # 0, 1, 4
    assert "krex8        -0.99   +0.00    1.00" in ke.table(doc)


def test_the_bar_read_over_the_distribution_beside_candidate_by_candidate(ke: Any) -> None:
    """Where the native repeat moves a few candidates by several % (an H100, 2026-12-06-j: up to
    4.8 %), candidate by candidate a third native run is off as often as krex (8 of 23 against
    8.0); the distribution's reading says whether krex's differences are larger as a whole:
    each quantile of the mode's |d| against the native repeat's + 0.3 points."""
    ex, rep = native("exclusive", 1.0, 2.0, 40.0), native("exclusive2", 1.02, 2.0, 41.0)
    rows = [rec("a", raw=1.0, clean=True), rec("b", raw=2.02, clean=True)]
    k = ke.summarise([ex, mode("krex8", rows, 9.0, 8), rep])["modes"][1]
    # a: krex 0 against the repeat's 2 %; b: krex 1 % against 0: off by candidate,
    assert (k["off"], k["off_of"]) == (1, 2)
    d = k["within_native_dist"]  # but p50 1.0 <= 2.0 + 0.3 and max 1.0 <= 2.0 + 0.3
    assert d["p50"] == {"mode": pytest.approx(1.0), "native": pytest.approx(2.0), "within": True}
    assert d["max"]["within"] is True
    text = ke.table({"modes": [ex, k, rep]})
    assert "read over the distribution" in text and "1.00 vs 2.00 within" in text
    worse = [rec("a", raw=1.05, clean=True), rec("b", raw=2.1, clean=True)]
    k2 = ke.summarise([ex, mode("krex8", worse, 9.0, 8), rep])["modes"][1]
    assert k2["within_native_dist"]["p50"]["within"] is False  # 5 against 2 + 0.3
    assert ke.within_native_dist([]) is None
