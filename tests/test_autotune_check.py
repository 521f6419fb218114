"""scripts/bench/autotune_check.py's reading of its runs (the GPU runs themselves are in
docs/results/h200-autotune/): Inductor's printed choices, and the verdict per autotuner."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conftest import load_script

from krex.core.tenants import _stat

STDERR = """\
AUTOTUNE mm(4096x4096, 4096x4096)
strides: [4096, 1], [4096, 1]
dtypes: torch.float16, torch.float16
  mm 0.1773 ms 100.0%
  triton_mm_17 0.1988 ms 89.2% ACC_TYPE='tl.float32', BLOCK_K=64
SingleProcess AUTOTUNE benchmarking takes 0.6603 seconds
AUTOTUNE mm(8192x8192, 8192x8192)
strides: [8192, 1], [8192, 1]
dtypes: torch.float16, torch.float16
  triton_mm_16 1.4100 ms 100.0% BLOCK_K=32
  mm 1.4350 ms 98.3%
AUTOTUNE addmm(1024x8192, 1024x8192, 8192x8192)
strides: [0, 1], [8192, 1], [1, 8192]
dtypes: torch.float32, torch.float32, torch.float32
  bias_addmm 2.3010 ms 100.0%
  addmm 2.3120 ms 99.5%
  triton_mm_3 2.4050 ms 95.7% ACC_TYPE='tl.float32', BLOCK_K=32
"""


def load() -> Any:
    return load_script("scripts/bench/autotune_check.py")


def test_inductors_choices_are_read_per_table() -> None:
    check = load()
    tables = check.INDUCTOR_TABLES
    assert check.inductor_choices(STDERR, tables["inductor"]) == [
        ["mm", 0.1773],
        ["triton_mm_17", 0.1988],
    ]
    assert check.inductor_choices(STDERR, tables["inductor8k"]) == [
        ["triton_mm_16", 1.41],
        ["mm", 1.435],
    ]
    # a Linear's addmm, its bias first: found by its input's shape, not by the mm tables
    assert check.inductor_choices(STDERR, tables["inductor_kb9"]) == [
        ["bias_addmm", 2.301],
        ["addmm", 2.312],
        ["triton_mm_3", 2.405],
    ]
    assert check.inductor_choices(STDERR, r"mm\(2048x") == []


def run(mode: str, winner: str, ms: float, cands: list[list[Any]] | None = None) -> dict[str, Any]:
    part: dict[str, Any] = {"winner": winner, "ms": ms}
    if cands:
        part["candidates"] = cands
    return {"mode": mode, "parts": {"triton8k": part}}


def test_what_held_the_regions_is_summed_with_the_longest_named() -> None:
    """A command's region records' `calls`: each marker's count over them, most first, and the
    longest region with what held it (run 26 found a 36 s Inductor region); none: {}."""
    check = load()
    bench = "torch._inductor.runtime.benchmarking.InductorBenchmarker.benchmark_gpu"
    regions = [
        {"duration_s": 0.2, "calls": {"triton.testing.do_bench": 4}},
        {"duration_s": 35.8, "calls": {bench: 21, "triton.testing.do_bench": 1}},
        {"duration_s": 0.1},  # a C marker's: no calls
        {"duration_s": 0.03, "calls": {bench: 1}},
    ]
    assert check.region_calls(regions) == {
        "counts": {bench: 22, "triton.testing.do_bench": 5},
        "longest": {"duration_s": 35.8, "calls": {bench: 21, "triton.testing.do_bench": 1}},
    }
    assert check.region_calls([{"duration_s": 1.0}]) == {} == check.region_calls([])


def test_the_verdict_compares_winners_and_times_with_the_exclusive_runs() -> None:
    """krex keeps the exclusive winner in every repeat; unprotected changed one; the runner-up's
    gap alone and each time against the exclusive median, in per cent."""
    check = load()
    runs = [
        run("exclusive", "A", 1.0, [["A", 1.0], ["B", 1.1]]),
        run("unprotected", "B", 5.0),
        run("krex", "A", 1.01),
        run("exclusive", "A", 1.02, [["A", 1.02], ["B", 1.0404]]),
        run("unprotected", "A", 6.0),
        run("krex", "A", 0.99),
    ]
    v = check.verdict(runs)["triton8k"]
    assert v["winners"]["krex"] == ["A", "A"] and v["exclusive_stable"]
    assert v["krex_equals_exclusive"] and v["unprotected_changed"]
    assert v["exclusive_runner_up_gap_pct"] == [10.0, 2.0]
    assert v["vs_exclusive_pct"]["krex"] == [0.0, -1.98]  # against the median, 1.01
    assert v["native_repeat_spread_pct"] == 1.98
    # krex at 0.0 and -1.98 against a spread of 1.98: both within it, one within 1 %
    assert v["within"]["krex"] == {"native_spread": "2 of 2", "one_pct": "1 of 2"}
    assert "exclusive" not in v["within"] and "krex-alone" not in v["within"]
    runs[-1]["parts"]["triton8k"]["winner"] = "B"
    assert not check.verdict(runs)["triton8k"]["krex_equals_exclusive"]


def test_the_verdict_scores_exclusive_itself_on_the_same_footing_as_the_other_modes() -> None:
    """Each exclusive timing against the other exclusive runs, krex against subsets of their
    size: an exclusive outlier misses, as it would in any other mode."""
    runs = [run("exclusive", "A", ms) for ms in (1.0, 1.0, 1.0, 1.3)]
    runs += [run("krex", "A", 1.0), run("krex-alone", "A", 1.2)]
    v = load().verdict(runs)["triton8k"]
    ex = v["equal_footing"]["exclusive"]
    assert ex == {"within_spread": "3.0 of 4", "within_one_pct": "3.0 of 4"}
    # 1.2 lies within the spread of the 3 subsets that hold 1.3, not of the one that does not
    assert v["equal_footing"]["krex-alone"]["within_spread"] == "0.8 of 1"
    assert v["equal_footing"]["krex"]["within_one_pct"] == "1.0 of 1"
    assert "unprotected" not in v["equal_footing"]


def state(pid: int) -> str:
    """A process's state letter from /proc (T: stopped)."""
    stat = _stat(f"/proc/{pid}/stat")
    assert stat is not None, f"process {pid} is gone"
    return stat[0]


def test_the_frozen_mode_stops_the_siblings_over_a_timing_and_resumes_them(tmp_path: Path) -> None:
    """exclusive-frozen's handoff: a "stop" request stops every sibling before its ack, a "go"
    resumes them; leaving the handoff resumes any still stopped (they are killed after)."""
    import subprocess
    import sys
    import time

    check = load()
    sibs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], text=True)
            for _ in range(2)]  # fmt: skip
    d = tmp_path / "handoff"

    def ask(n: int, action: str) -> None:
        (d / f"req-{n}.tmp").write_text(action)  # whole, as the candidate writes it: the
        (d / f"req-{n}.tmp").rename(d / f"req-{n}")  # handoff could read an empty request
        end = time.monotonic() + 10
        while not (d / f"ack-{n}").exists():
            assert time.monotonic() < end, f"no ack of {action}"
            time.sleep(0.005)

    try:
        with check._handoff(d, sibs, wait_s=0.0):
            ask(0, "stop")
            assert [state(s.pid) for s in sibs] == ["T", "T"]
            ask(1, "go")
            assert "T" not in [state(s.pid) for s in sibs]
            ask(2, "stop")
        time.sleep(0.1)
        assert "T" not in [state(s.pid) for s in sibs]
    finally:
        for s in sibs:
            s.kill()
            s.wait()


def test_a_timings_gpu_state_has_the_clock_range_reasons_and_trace() -> None:
    check = load()
    gpu = check.Telemetry.__new__(check.Telemetry)
    gpu.samples = [
        {"t": 99.85, "sm_clock_mhz": 1980, "throttle_reasons": 0},
        {"t": 100.0, "sm_clock_mhz": 1980, "throttle_reasons": 0x1},
        {"t": 100.01, "sm_clock_mhz": 1700, "throttle_reasons": 0x4},
        {"t": 100.02, "sm_clock_mhz": 1800, "throttle_reasons": 0x4},
        {"t": 100.5, "sm_clock_mhz": 1980, "throttle_reasons": 0},
    ]
    w = check.Telemetry.window(gpu, 100.0, 100.02, trace=True)
    assert w["sm_clock_mhz_range"] == [1700, 1980] and w["throttle_reasons"] == "0x5"
    assert w["samples"] == 3 and w["sm_clock_mhz"] == 1827
    assert [row[:2] for row in w["trace"]] == [[-150, 1980], [0, 1980], [10, 1700], [20, 1800]]
    assert "trace" not in check.Telemetry.window(gpu, 100.0, 100.02)
    assert check.Telemetry.window(gpu, 101.0, 102.0) is None
    assert "mem_temp_c" not in w and "mem_clock_mhz_range" not in w  # NVML gave neither


def test_a_timings_gpu_state_has_the_memorys_temperature_and_clock_where_nvml_gives_them() -> None:
    check = load()
    gpu = check.Telemetry.__new__(check.Telemetry)
    gpu.samples = [
        {"t": 100.0 + i / 100, "sm_clock_mhz": 1980, "temp_c": 50 - i}
        | {"mem_temp_c": 61 - i, "mem_clock_mhz": 3201 - i}
        for i in range(3)
    ]
    w = check.Telemetry.window(gpu, 100.0, 100.02)
    assert w["temp_c"] == [50, 48] and w["mem_temp_c"] == [61, 59]
    assert w["mem_clock_mhz_range"] == [3199, 3201]


def test_a_slice_that_is_not_two_cpu_lists_is_one_clear_error(
    tmp_path: Path, monkeypatch: Any, capsys: Any
) -> None:
    """--slice REGION/SHARED: anything else stops before a daemon starts, naming the option."""
    import sys

    import pytest

    check = load()
    out = tmp_path / "out.json"
    monkeypatch.setattr(sys, "argv", ["autotune_check.py", "--json", str(out), "--slice", "12-15"])
    with pytest.raises(SystemExit) as stop:
        check.main()
    assert stop.value.code == 2
    assert "--slice: '12-15' is not REGION/SHARED" in capsys.readouterr().err
    assert not out.exists() and not out.with_suffix(".config.toml").exists()


def test_a_kernelbench_timing_file_without_its_timer_is_one_clear_error(
    tmp_path: Path, monkeypatch: Any, capsys: Any
) -> None:
    """--kernelbench-timing PATH: a missing file, or one with no cuda_event timer, stops before
    a daemon starts, naming the option."""
    import sys

    import pytest

    check = load()
    out = tmp_path / "out.json"
    other = tmp_path / "timing.py"
    other.write_text("def get_timing_function(method): ...\n")
    for path, says in ((tmp_path / "absent.py", "No such file"), (other, "no cuda_event timer")):
        argv = ["autotune_check.py", "--json", str(out), "--kernelbench-timing", str(path)]
        monkeypatch.setattr(sys, "argv", argv)
        with pytest.raises(SystemExit) as stop:
            check.main()
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert "--kernelbench-timing:" in err and says in err
    assert not out.exists()


def test_judge_gives_the_verdict_over_several_calls_files(
    tmp_path: Path, monkeypatch: Any, capsys: Any
) -> None:
    """--judge A B: the verdict over both files' runs (a run split over calls), each source
    named; a file that is not the check's own is one clear error and writes nothing."""
    import json
    import sys

    import pytest

    check = load()
    a, b, out = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "verdict.json"
    a.write_text(
        json.dumps({"date": "d1", "runs": [run("exclusive", "A", 1.0), run("krex", "A", 1.0)]})
    )
    b.write_text(
        json.dumps(
            {"date": "d2", "runs": [run("exclusive", "A", 1.02), run("unprotected", "B", 3.0)]}
        )
    )
    monkeypatch.setattr(
        sys, "argv", ["autotune_check.py", "--json", str(out), "--judge", str(a), str(b)]
    )
    assert check.main() == 0
    doc = json.loads(out.read_text())
    assert [s["date"] for s in doc["sources"]] == ["d1", "d2"] and doc["runs"] == 4
    v = doc["verdict"]["triton8k"]
    assert v["krex_equals_exclusive"] and v["unprotected_changed"]
    assert v["native_repeat_spread_pct"] == 1.98  # both files' exclusive runs, 1.0 and 1.02
    out.unlink()
    (tmp_path / "other.json").write_text("[1, 2]")
    argv = [
        "autotune_check.py",
        "--json",
        str(out),
        "--judge",
        str(a),
        str(tmp_path / "other.json"),
    ]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as stop:
        check.main()
    assert stop.value.code == 2 and "has no runs" in capsys.readouterr().err
    assert not out.exists()


def test_the_cooled_mode_acks_a_stop_only_after_its_wait(tmp_path: Path) -> None:
    """exclusive-cooled: the timing may start only `wait_s` after the siblings stopped."""
    import subprocess
    import sys
    import time

    check = load()
    sib = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], text=True)
    d = tmp_path / "handoff"
    try:
        with check._handoff(d, [sib], wait_s=0.5):
            t0 = time.monotonic()
            (d / "req-0.tmp").write_text("stop")  # whole, as the candidate writes it
            (d / "req-0.tmp").rename(d / "req-0")
            while not (d / "ack-0").exists():
                assert time.monotonic() - t0 < 60, "no ack"
                time.sleep(0.005)
            assert time.monotonic() - t0 >= 0.5
            assert state(sib.pid) == "T"
    finally:
        sib.kill()
        sib.wait()


def test_the_verdict_fits_the_kernelbench_timer_against_its_launch_time() -> None:
    """A mode that reads slow only because its launches were slow has no residual."""

    def run(mode: str, launch_us: float) -> dict[str, Any]:
        ms = 2.65 + 0.0012 * launch_us
        kb = {"ms": ms, "trials": [ms] * 3, "launch_us": [launch_us] * 3}
        return {"mode": mode, "repeat": 0, "parts": {"kernelbench": kb}}

    runs = [run("exclusive", u) for u in (25, 35, 90)] + [run("krex", u) for u in (30, 85)]
    fit = load().verdict(runs)["kernelbench"]["launch_fit"]
    assert fit["correlation"] == 1.0
    assert fit["residual_mean_pct"] == {"exclusive": 0.0, "krex": 0.0}
    # Without launch times (older runs): no fit, and no error.
    bare = [{"mode": r["mode"], "repeat": 0, "parts": {"kernelbench": {"ms": 2.7}}} for r in runs]
    assert "launch_fit" not in load().verdict(bare)["kernelbench"]


def test_the_verdict_sets_the_convs_timings_beside_the_gpus_state_at_their_start() -> None:
    """Runs 7-13's conv residual followed the GPU's temperature: the verdict says by how much,
    per mode, with the memory's temperature where the runs recorded it."""

    def run(mode: str, temp: int, mem: int | None) -> dict[str, Any]:
        gpu: dict[str, Any] = {"temp_c": [temp, temp], "sm_clock_mhz_range": [1980, 1980]}
        if mem is not None:
            gpu["mem_temp_c"] = [mem, mem]
        conv = {"winner": "k", "ms": 2.0 + 0.001 * mem if mem else 2.0, "gpu": gpu}
        return {"mode": mode, "repeat": 0, "parts": {"cudnn": conv}}

    runs = [run("exclusive", 30, m) for m in (40, 41)] + [run("krex", 50, m) for m in (55, 60)]
    state = load().verdict(runs)["cudnn"]["gpu_state"]
    assert state["corr_ms_start_mem_temp"] == 1.0 and state["corr_ms_min_clock"] is None
    assert state["modes"]["krex"]["start_mem_temp_c_range"] == [55, 60]
    assert state["modes"]["exclusive"]["start_temp_c_range"] == [30, 30]
    older = [run("exclusive", t, None) for t in (30, 31, 33)]  # runs before run 14: no memory's
    state = load().verdict(older)["cudnn"]["gpu_state"]
    assert state["corr_ms_start_mem_temp"] is None
    assert "start_mem_temp_c_range" not in state["modes"]["exclusive"]
    assert "gpu_state" not in load().verdict(older[:2])["cudnn"]  # too few to correlate


def test_the_verdict_counts_the_conv_timings_within_the_spread_apart_when_power_capped() -> None:
    """Runs 14-16's slow conv readings were those the power limit held down: the verdict counts
    the capped and the uncapped timings apart, per mode."""

    def run(mode: str, ms: float, capped: float | None) -> dict[str, Any]:
        gpu: dict[str, Any] = {"temp_c": [40, 40], "sm_clock_mhz_range": [1980, 1980]}
        if capped is not None:
            gpu["power_capped_ms"] = capped
        return {
            "mode": mode,
            "repeat": 0,
            "parts": {"cudnn": {"winner": "k", "ms": ms, "gpu": gpu}},
        }

    runs = [run("exclusive", ms, 0.0) for ms in (2.000, 2.001, 2.002)]  # spread 0.1 points
    runs += [run("krex", 2.001, 0.0), run("krex", 2.010, 25.0), run("krex", 2.0015, 3.0)]
    runs.append(run("krex", 2.020, None))  # no samples of the counter: left out
    v = load().verdict(runs)["cudnn"]
    assert v["within_by_capping"]["krex"] == {"capped": "1 of 2", "uncapped": "1 of 1"}
    assert v["within_by_capping"]["exclusive"] == {"uncapped": "3 of 3"}
    assert v["gpu_state"]["modes"]["exclusive"]["capped_runs"] == 0
    assert "capped_runs" not in v["gpu_state"]["modes"]["krex"]  # one run without the counter


def test_the_candidate_and_sibling_programs_compile_and_find_krexs_helpers() -> None:
    """The programs the check runs on the GPU (held as text) are valid Python, and what they
    import from krex exists (a typo there would cost a device call)."""
    import importlib
    import re

    check = load()
    compile(check.AUTOTUNE, "AUTOTUNE", "exec")
    compile(check.SIBLING.read_text(), str(check.SIBLING), "exec")
    for module, names in re.findall(r"from (krex[\w.]*) import ([\w, ]+)", check.AUTOTUNE):
        if module.startswith("krex.bench.tasks"):
            continue  # they import torch, which CI does not have
        mod = importlib.import_module(module)
        for n in names.split(","):
            assert hasattr(mod, n.strip()), f"{module}.{n.strip()}"


def test_a_pinned_candidate_runs_on_those_cpus_only_from_its_start() -> None:
    """exclusive-pinned's command: its affinity is the given CPUs before its first line runs,
    and its threads inherit it; without CPUs it keeps this process's."""
    import os
    import sys

    check = load()
    mine = sorted(os.sched_getaffinity(0))
    probe = (
        "import os, threading; seen = []; "
        "t = threading.Thread(target=lambda: seen.append(sorted(os.sched_getaffinity(0)))); "
        "t.start(); t.join(); print(sorted(os.sched_getaffinity(0)), seen[0])"
    )
    got = check.run_on([sys.executable, "-c", probe], dict(os.environ), {mine[-1]}, timeout=30)
    assert got.returncode == 0, got.stderr
    assert got.stdout.split("\n")[0] == f"[{mine[-1]}] [{mine[-1]}]"
    free = check.run_on([sys.executable, "-c", probe], dict(os.environ), None, timeout=30)
    assert free.stdout.split("\n")[0] == f"{mine} {mine}"


def test_pinned_cpus_that_are_no_cpu_list_or_not_ours_are_one_clear_error(
    tmp_path: Path, monkeypatch: Any, capsys: Any
) -> None:
    """--pinned CPUS: text that is no CPU list, an empty list or CPUs this process may not use
    stop before a daemon starts, naming the option."""
    import os
    import sys

    import pytest

    check = load()
    out = tmp_path / "out.json"
    beyond = str(max(os.sched_getaffinity(0)) + 1)
    for cpus, says in (("0-x", "is not a CPU list"), (",", "names no CPU"), (beyond, "may use")):
        argv = ["autotune_check.py", "--json", str(out), "--pinned", cpus]
        monkeypatch.setattr(sys, "argv", argv)
        with pytest.raises(SystemExit) as stop:
            check.main()
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert "--pinned:" in err and says in err, err
    assert not out.exists()


def test_the_pinned_mode_is_judged_beside_exclusive() -> None:
    """exclusive-pinned's timings are set against the exclusive median like every mode's."""
    check = load()
    runs = [
        {"mode": "exclusive", "repeat": 0, "parts": {"kernelbench": {"ms": 2.70}}},
        {"mode": "exclusive", "repeat": 1, "parts": {"kernelbench": {"ms": 2.80}}},
        {"mode": "exclusive-pinned", "repeat": 0, "parts": {"kernelbench": {"ms": 2.73}}},
        {"mode": "krex", "repeat": 0, "parts": {"kernelbench": {"ms": 2.72}}},
    ]
    v = check.verdict(runs)["kernelbench"]
    assert v["vs_exclusive_pct"]["exclusive-pinned"] == [-0.73]
    assert v["within"]["exclusive-pinned"] == {"native_spread": "1 of 1", "one_pct": "1 of 1"}
