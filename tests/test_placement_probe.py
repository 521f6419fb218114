"""scripts/bench/placement_probe.py without a GPU: its spreads, each mode's processes, and the
measuring process against stand-ins for torch and KernelBench's timing module (the GPU runs
themselves are for docs/results/)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import ROOT, load_script

SCRIPT = ROOT / "scripts/bench/placement_probe.py"

# Stand-ins: a torch whose cuda is there and counts empty_cache calls into a file, and a
# kernelbench.timing whose reference timing empties the cache as KernelBench's timer does and
# hands its trials (from the problem's text) to get_timing_stats.
FAKE_TORCH = """
import os


def device(name):
    return name


class cuda:
    @staticmethod
    def is_available():
        return True

    @staticmethod
    def empty_cache():
        with open(os.environ["FAKE_EMPTIED"], "a") as f:
            f.write("x")
"""
FAKE_TIMING = """
import torch


def get_timing_stats(elapsed_times, device=None):
    return {"mean": sum(elapsed_times) / len(elapsed_times)}


class Tensor:
    def data_ptr(self):
        return 4096


def get_timing_function(method="cuda_event"):
    def time_it(kernel_fn, args, num_trials):
        torch.cuda.empty_cache()
        return kernel_fn(*args)[:num_trials]

    return time_it


def measure_ref_program_time(ref_arch_name, ref_arch_src, num_trials, device, verbose, precision):
    fn = get_timing_function()
    times = fn(lambda t, n: [float(x) for x in ref_arch_src.split()], [Tensor(), 3], num_trials)
    return get_timing_stats(times, device=device)
"""


@pytest.fixture
def probe() -> Any:
    return load_script("scripts/bench/placement_probe.py")


def test_a_spread_is_max_less_min_over_the_median_in_percent(probe: Any) -> None:
    assert probe.spread_pct([1.0, 1.02, 0.99]) == pytest.approx(3.0)
    assert probe.spread_pct([2.0]) is None and probe.spread_pct([0.0, 0.0]) is None
    # One process has every problem; eight have three each, every problem in two of them.
    names = [f"p{i}" for i in range(12)]
    assert probe.shares(names, 1) == [names]
    eight = probe.shares(names, 8)
    assert len(eight) == 8 and all(len(s) == 3 for s in eight)
    assert all(sum(n in s for s in eight) == 2 for n in names)


def test_a_modes_figures_are_per_process_and_problem(probe: Any) -> None:
    """From the rounds after the first (first use), per process and problem."""

    def t(p: str, mean: float, low: float, r: int = 1) -> dict[str, Any]:
        return {"problem": p, "mean_ms": mean, "min_ms": low, "round": r}

    first = [t("a", 9.0, 9.0, 0), t("b", 9.0, 9.0, 0)]
    procs = [
        {"proc": 0, "problems": ["a", "b"],
         "timings": [*first, t("a", 1.0, 0.9), t("b", 2.0, 2.0), t("a", 1.1, 0.9, 2),
                     t("b", 2.0, 1.9, 2)]},
        {"proc": 1, "problems": ["a"], "timings": [t("a", 1.0, 1.0)]},  # one round: no spread
    ]  # fmt: skip
    f = probe.figures(procs)
    assert f["timings"] == 7 and [(s["proc"], s["problem"]) for s in f["spreads"]] == [
        (0, "a"),
        (0, "b"),
    ]
    assert f["spreads"][0]["spread_pct"] == pytest.approx(100 * 0.1 / 1.05, abs=1e-3)
    assert f["spreads"][0]["fastest_spread_pct"] == 0.0
    assert f["spreads"][1]["fastest_spread_pct"] == pytest.approx(100 * 0.1 / 1.95, abs=1e-3)
    assert probe.figures([{"proc": 0, "cuda": False, "timings": []}])["spread_pct"] is None
    # --table recomputes from the processes' records (an earlier run's figures by today's rule).
    line = probe.table({"modes": [{"mode": "alone", "procs": procs, "spread_pct": {"p50": 99}}]})
    assert line.splitlines()[1].split()[:4] == [
        "alone",
        "7",
        "0.0",
        f"{f['spread_pct']['p50']:.2f}",
    ]
    # A mode with no problem timed twice after its first says why there is no figure (the H100,
    # 2026-12-06-j: `alone` cut by its share of a 60 s budget, its line blank but for dashes).
    cut = [
        {"proc": 0, "cuda": True, "problems": ["a"], "timings": first[:1], "stopped": "deadline"}
    ]
    assert probe.table({"modes": [{"mode": "alone", "procs": cut}]}).endswith(
        "no spread: cut by its share of --budget-s"
    )
    short = [
        {"proc": 0, "cuda": True, "problems": ["a"], "timings": [*first[:1], t("a", 1.0, 1.0)]}
    ]
    assert probe.table({"modes": [{"mode": "alone", "procs": short}]}).endswith("too few rounds")


def test_krex_modes_run_eight_processes_through_krex_run_with_auto_regions(
    probe: Any, tmp_path: Path
) -> None:
    args = SimpleNamespace(kb=tmp_path / "kb", rounds=4, trials=50)
    names = [f"level1/{i}.py" for i in range(12)]
    alone = probe.argvs("alone", args, names, tmp_path, 30.0, None)
    assert len(alone) == 1 and "--hold" not in alone[0] and alone[0][-12:] == names
    assert probe.MODES["krex8-settle"].config == "[regions]\nsettle_s = 0.5\n"
    assert probe.MODES["krex1"].slots == 1 and probe.MODES["krex8-hold"].slots == 8
    hold = probe.argvs("krex8-hold", args, names, tmp_path, 30.0, tmp_path / "k.sock")
    assert len(hold) == 8
    for k, argv in enumerate(hold):
        run = argv.index("run")
        assert argv[run - 2 : run] == ["-m", "krex.cli"] and "--auto-regions" in argv
        assert argv[argv.index("--socket") + 1] == str(tmp_path / "k.sock")
        mine = argv[argv.index("--") + 1 :]
        assert mine[1] == str(SCRIPT) and "--child" in mine and "--hold" in mine
        assert mine[mine.index("--out") + 1] == str(tmp_path / f"proc-{k}.json")
        assert len(mine) - mine.index("--problems") - 1 == 3


@pytest.mark.parametrize("hold", [False, True])
def test_the_measuring_process_times_each_problem_each_round(tmp_path: Path, hold: bool) -> None:
    """Rounds over the problems, each timing's mean and fastest trial kept; with --hold
    KernelBench's empty_cache calls no longer reach torch's."""
    fake = tmp_path / "fake"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch/__init__.py").write_text(textwrap.dedent(FAKE_TORCH))
    kb = tmp_path / "kb"
    (kb / "src/kernelbench").mkdir(parents=True)
    (kb / "src/kernelbench/__init__.py").write_text("")
    (kb / "src/kernelbench/timing.py").write_text(textwrap.dedent(FAKE_TIMING))
    (kb / "reference/level1").mkdir(parents=True)
    (kb / "reference/level1/a.py").write_text("1.0 2.0 3.0")
    (kb / "reference/level1/b.py").write_text("5.0 4.0")
    out, emptied = tmp_path / "rec.json", tmp_path / "emptied"
    emptied.write_text("")
    env = os.environ | {"PYTHONPATH": str(fake), "FAKE_EMPTIED": str(emptied)}
    argv = [sys.executable, str(SCRIPT), "--child", "--kb", str(kb), "--rounds", "2"]
    argv += ["--trials", "2", "--out", str(out), *(["--hold"] if hold else [])]
    argv += ["--problems", "level1/a.py", "level1/b.py"]
    subprocess.run(argv, env=env, check=True, timeout=120)
    rec = json.loads(out.read_text())
    assert rec["cuda"] is True and rec["hold"] is hold
    got = [(t["problem"], t["round"], t["mean_ms"], t["min_ms"]) for t in rec["timings"]]
    assert all(t["ptrs"] == [4096] for t in rec["timings"])  # the inputs' device addresses
    assert got == [
        ("level1/a.py", 0, 1.5, 1.0),
        ("level1/b.py", 0, 4.5, 4.0),
        ("level1/a.py", 1, 1.5, 1.0),
        ("level1/b.py", 1, 4.5, 4.0),
    ]
    assert emptied.read_text() == ("" if hold else "xxxx")


def test_without_cuda_each_mode_says_so_and_bad_input_gets_one_error(tmp_path: Path) -> None:
    kb = tmp_path / "kb"
    (kb / "reference/level1").mkdir(parents=True)
    (kb / "reference/level2").mkdir(parents=True)
    probe = load_script("scripts/bench/placement_probe.py")
    for name in probe.kb_eval.CANDIDATES[:2]:
        (kb / "reference" / name).write_text("")
    out = tmp_path / "p.json"
    base = [sys.executable, str(SCRIPT), "--kb", str(kb), "--json", str(out), "--subset", "2"]
    env = os.environ | {"CUDA_VISIBLE_DEVICES": ""}
    r = subprocess.run([*base, "--modes", "alone,hold", "--rounds", "3", "--budget-s", "60"],
                       env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert [m["mode"] for m in doc["modes"]] == ["alone", "hold"]
    for m in doc["modes"]:
        assert m["timings"] == 0 and m["spread_pct"] is None
        assert m["procs"][0]["cuda"] is False or m["procs"][0].get("error")
    assert "no CUDA" in r.stdout or "torch" in r.stdout
    for bad in (["--modes", "alone,bogus"], ["--rounds", "2"], ["--subset", "3"]):
        r = subprocess.run([*base, *bad], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and r.stderr.count("error:") == 1, (bad, r.stderr)
