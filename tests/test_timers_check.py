"""scripts/bench/timers_check.py and timer_candidate.py without a GPU: which timers run, the
command each mode runs, the verdict on synthetic records (at the bar and past it), the budget,
and the command line end to end with a fake torch, triton and KernelBench timing.py (the GPU
runs themselves are for docs/results/)."""

from __future__ import annotations

import contextlib
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


@pytest.fixture
def tc(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.syspath_prepend(str(ROOT / "scripts" / "bench"))  # its kb_memory import
    return load_script("scripts/bench/timers_check.py")


def test_the_default_timers_are_those_measurable_here(tc: Any) -> None:
    assert tc.default_timers(False, "3.6.0") == list(tc.BASE)
    assert tc.default_timers(True, "3.6.0") == [*tc.BASE, *tc.KB]
    assert tc.default_timers(True, "3.8.0") == [*tc.BASE, *tc.KB, *tc.PROTON]
    assert tc.default_timers(False, None) == list(tc.BASE)
    assert not set(tc.OPT_IN) & set(tc.default_timers(True, "3.10.1"))
    assert tc.pick_timers("events,helion_do_bench", False, "3.6.0") == ["events", "helion_do_bench"]
    with pytest.raises(ValueError, match="unknown timer"):
        tc.pick_timers("do_bench,bogus", True, "3.6.0")
    with pytest.raises(ValueError, match="--kernelbench-timing"):
        tc.pick_timers("kb_cuda_event", False, "3.6.0")
    assert tc.pick_modes("alone,repeat") == ["alone", "repeat"]
    for bad in ("krex,repeat", "alone,alone", "alone,shared"):
        with pytest.raises(ValueError):
            tc.pick_modes(bad)


def test_every_timer_is_the_candidates(tc: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    cand = load_script("scripts/bench/timer_candidate.py")
    assert set(tc.TIMERS) == set(cand.NAMES)


def test_the_command_natively_and_through_krex(tc: Any, tmp_path: Path) -> None:
    native = [sys.executable, str(tc.CANDIDATE), "do_bench", "--calls", "5"]
    assert tc.command_argv("do_bench", "alone", 5) == native
    assert tc.command_argv("do_bench", "repeat", 5) == native
    sock, rep = tmp_path / "k.sock", tmp_path / "r.json"
    argv = tc.command_argv("do_bench", "krex", 5, sock, rep)
    run = [sys.executable, "-m", "krex.cli", "run", "--socket", str(sock), "--auto-regions"]
    assert argv == [*run, "--report", str(rep), "--", *native]
    with pytest.raises(ValueError):
        tc.command_argv("do_bench", "krex", 5)


def test_kernelbenchs_timing_is_served_as_kernelbench_timing(tc: Any, tmp_path: Path) -> None:
    timing = tmp_path / "timing.py"
    timing.write_text("X = 1\n")
    lib = tc.kb_lib(timing, tmp_path / "lib")
    assert (lib / "kernelbench" / "timing.py").read_text() == "X = 1\n"
    env = tc.command_env(tmp_path / "cache", lib)
    assert env["PYTHONPATH"].split(":")[0] == str(lib)
    assert env["TRITON_CACHE_DIR"].startswith(str(tmp_path / "cache"))
    assert not any(k.startswith("KREX_") for k in env)


def rec(mode: str, ms: float | None, timer: str = "t", **kw: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"mode": mode, "timer": timer, "status": "ok" if ms else "failed"}
    return row | ({"ms": ms} if ms else {}) | kw


def regions(n: int, clean: int, candidates: int = 0) -> dict[str, Any]:
    return {"krex": {"regions": n, "clean": clean, "candidates": candidates}}


def test_krex_within_the_repeat_plus_three_tenths_of_a_point(tc: Any) -> None:
    """At the bar passes, past it fails; unclean or no regions fail; no repeat: no verdict."""
    at = [rec("alone", 2.0), rec("repeat", 2.004), rec("krex", 2.01, **regions(1, 1))]
    v = tc.judge("t", at)
    assert v["repeat_pct"] == pytest.approx(0.2) and v["krex_pct"] == pytest.approx(0.5)
    assert v["within"] and v["pass"] and v["regions"] == v["regions_clean"] == 1
    past = [rec("alone", 2.0), rec("repeat", 2.004), rec("krex", 2.0102, **regions(1, 1))]
    assert not tc.judge("t", past)["within"] and not tc.judge("t", past)["pass"]
    faster = [rec("alone", 2.0), rec("repeat", 2.0), rec("krex", 1.994, **regions(2, 2))]
    assert tc.judge("t", faster)["pass"]  # |difference|: faster counts as off too
    assert not tc.judge("t", [*faster[:2], rec("krex", 1.9938, **regions(2, 2))])["within"]
    unclean = [rec("alone", 2.0), rec("repeat", 2.0), rec("krex", 2.0, **regions(3, 2, 3))]
    u = tc.judge("t", unclean)
    assert u["within"] and not u["pass"] and u["candidate_regions"] == 3
    assert not tc.judge("t", [*unclean[:2], rec("krex", 2.0, **regions(0, 0))])["pass"]
    none = tc.judge("t", [rec("alone", 2.0), rec("krex", 2.0, **regions(1, 1))])
    assert none["pass"] is None and none["repeat_pct"] is None and none["krex_pct"] == 0
    gone = tc.judge("t", [rec("alone", None, status="unavailable", unavailable="no proton")])
    assert gone["pass"] is None and gone["unavailable"] == "no proton"
    doc = tc.summarise(["t", "u"], [*at, *[r | {"timer": "u"} for r in past]])
    assert (doc["passed"], doc["judged"], doc["all_pass"]) == (1, 2, False)
    assert "1 of 2 judged pass" in tc.table(doc)


@contextlib.contextmanager
def fake_phase(tmp: Path, env: dict[str, str], deadline: float) -> Iterator[Path]:
    yield tmp / "fake.sock"


def test_a_run_within_its_budget_keeps_every_record(
    tc: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each mode gets its share of the budget; past it nothing starts; every record goes to
    commands.jsonl and the JSON, rewritten after each command; krex commands' reports read."""
    monkeypatch.setattr(tc, "RESERVE_S", 0.0)
    monkeypatch.setattr(tc, "COOL_S", 0.0)
    monkeypatch.setattr(tc, "krex_phase", fake_phase)
    out = tmp_path / "r.json"
    seen: list[int] = []

    def run_one(cmd: Any, argv: list[str], env: dict[str, str], logs: Path, deadline: float,
                value: str) -> dict[str, Any]:  # fmt: skip
        if out.exists():
            seen.append(len(json.loads(out.read_text())["records"]))
        if cmd.variant == "krex":
            report = Path(argv[argv.index("--report") + 1])
            report.write_text(json.dumps({"regions": [{"clean": True, "candidate": False}]}))
        if cmd.problem == "slow":
            time.sleep(max(0.0, deadline - time.monotonic()))
            return {"status": "not_run", "why": "budget (killed)"}
        if cmd.problem == "gone":
            return {"status": "failed", "result": {"unavailable": "no such library"}}
        return {"status": "ok", "ms": 2.0, "result": {"ms": 2.0}}

    timers, modes = ["a", "gone", "slow", "b"], ["alone", "krex", "repeat"]
    t0 = time.monotonic()
    doc = tc.run(timers, modes, out, tmp_path / "o", 3.0, run_one=run_one)
    assert time.monotonic() - t0 < 3.0 + 1.0
    by = {(r["mode"], r["timer"]): r for r in doc["records"]}
    assert by[("alone", "a")]["status"] == "ok" and by[("alone", "slow")]["status"] == "not_run"
    assert by[("alone", "b")]["why"] == "budget (not started)"  # alone's share was spent
    assert by[("krex", "a")]["krex"]["clean"] == 1
    assert by[("krex", "gone")]["status"] == "unavailable"
    assert by[("repeat", "gone")]["unavailable"] == "no such library"
    assert seen[0] == 1 and seen == sorted(seen) and len(doc["records"]) == 12
    lines = (tmp_path / "o" / "commands.jsonl").read_text().splitlines()
    assert len(lines) == 12 and not json.loads(out.read_text())["partial"]
    a = next(p for p in doc["timers"] if p["timer"] == "a")
    assert a["pass"] and a["krex_pct"] == 0


def test_a_krex_phase_that_does_not_start_loses_its_mode_only(
    tc: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Broken:
        def __init__(self, *a: Any) -> None:
            pass

        def __enter__(self) -> Path:
            raise RuntimeError("daemon did not start")

        def __exit__(self, *a: object) -> None:
            pass

    monkeypatch.setattr(tc, "krex_phase", Broken)
    monkeypatch.setattr(tc, "COOL_S", 0.0)

    def ok(*a: Any) -> dict[str, Any]:
        return {"status": "ok", "ms": 1.0}

    doc = tc.run(["a"], ["alone", "krex", "repeat"], tmp_path / "r.json", tmp_path / "o", 60.0,
                 run_one=ok)  # fmt: skip
    assert [r["status"] for r in doc["records"]] == ["ok", "not_run", "ok"]
    assert "did not start" in doc["mode_errors"]["krex"] and doc["timers"][0]["pass"] is None


def test_mode_deadlines_share_the_time_left_by_estimate(tc: Any) -> None:
    modes = ["alone", "krex", "repeat"]
    est = [10 * tc.EST_S["alone"], tc.EST_START_S["krex"] + 10 * tc.EST_S["krex"],
           tc.EST_START_S["repeat"] + 10 * tc.EST_S["repeat"]]  # fmt: skip
    assert tc.mode_deadline(0.0, 300.0, modes, 0, 10) == pytest.approx(300 * est[0] / sum(est))
    assert tc.mode_deadline(100.0, 300.0, modes, 2, 10) == pytest.approx(300.0)
    assert tc.mode_deadline(400.0, 300.0, modes, 1, 10) == pytest.approx(400.0)  # none left


FAKE_TORCH = """
__version__ = "0.0-fake"

class Generator:
    def __init__(self, device=None):
        pass
    def manual_seed(self, seed):
        return self

def randn(*shape, device=None, generator=None):
    return 1.0

def matmul(a, b):
    return a * b

class cuda:
    @staticmethod
    def synchronize(*a, **k):
        pass
"""
FAKE_TIMING = """
def time_execution_with_cuda_event(kernel_fn, args, num_warmup=3, num_trials=10, discard_first=1,
                                   verbose=True, device=None):
    kernel_fn(*args)
    return [2.0 + 0.01 * (i % 3) for i in range(num_trials)]

def get_timing_function(method="cuda_event"):
    print(f"[Profiling] Using timing method: {method}")
    return {"cuda_event": time_execution_with_cuda_event}[method]
"""


def test_the_command_line_alone_twice_with_fakes(tmp_path: Path) -> None:
    """KernelBench's cuda_event timer (faked) and a Proton timer that triton 3.6 lacks, natively
    twice: readings, the unavailable one said, the table last."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(textwrap.dedent(FAKE_TORCH))
    (tmp_path / "triton").mkdir()
    (tmp_path / "triton" / "__init__.py").write_text('__version__ = "3.6.0"\n')
    (tmp_path / "triton" / "testing.py").write_text("")
    timing = tmp_path / "timing.py"
    timing.write_text(textwrap.dedent(FAKE_TIMING))
    out = tmp_path / "r.json"
    p = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench" / "timers_check.py"), "--json", str(out),
         "--modes", "alone,repeat", "--timers", "kb_cuda_event,do_bench_proton", "--calls", "2",
         "--kernelbench-timing", str(timing), "--budget-s", "120"],
        capture_output=True, text=True, env={"PYTHONPATH": f"{tmp_path}:{ROOT}"}, timeout=120,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    doc = json.loads(out.read_text())
    kb, proton = doc["timers"]
    assert kb["modes"]["alone"]["ms"] == pytest.approx(2.0099) and kb["repeat_pct"] == 0
    assert kb["pass"] is None  # no krex mode: no verdict
    first = next(r for r in doc["records"] if r["timer"] == "kb_cuda_event")
    assert first["result"]["readings"] == [pytest.approx(2.0099)] * 2
    assert "3.8 and later" in proton["unavailable"]
    assert p.stdout.splitlines()[-1].startswith("(% = |mode - alone|")
    assert (tmp_path / "timers_check" / "commands.jsonl").exists()  # beside --json
    if (ROOT / ".kb" / "eval" / "src" / "kernelbench" / "timing.py").exists():
        return  # the default timing.py is there: no error to see
    bad = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench" / "timers_check.py"), "--json", str(out),
         "--timers", "kb_host_time"], capture_output=True, text=True, cwd=tmp_path,
        env={"PYTHONPATH": f"{tmp_path}:{ROOT}"},
    )  # fmt: skip
    assert bad.returncode == 2 and "--kernelbench-timing" in bad.stderr


def test_gpu_check_has_the_timers_section() -> None:
    sh = (ROOT / "scripts" / "gpu_check.sh").read_text()
    assert subprocess.run(["bash", "-n", str(ROOT / "scripts" / "gpu_check.sh")]).returncode == 0
    section = sh[sh.index('*" timers "*') :].split("\nfi\n")[0]
    assert "scripts/bench/timers_check.py --json" in section and "$OUT/timers_check.json" in section
    for knob in ("TIMERS_LIST", "TIMERS_KB_TIMING", "TIMERS_BUDGET_S"):
        assert knob in section and knob in sh[: sh.index("PARTS=${PARTS")]
