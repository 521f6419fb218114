"""`krex bench` end to end on the simulated GPU (the tiny profile: CI's smoke test)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from krex.bench import runner
from krex.bench.suite import Command

KREX = [sys.executable, "-m", "krex.cli"]


@pytest.fixture(scope="module")
def bench_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out: Path = tmp_path_factory.mktemp("bench")
    p = subprocess.run(
        [
            *KREX,
            "bench",
            "run",
            "--modes",
            "exclusive,shared,krex",
            "--concurrency",
            "4",
            "--profile",
            "tiny",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return out


def test_results_json_has_every_required_key(bench_dir: Path) -> None:
    """results.json carries the keys the issue names, for every mode, and says it is simulated."""
    r = json.loads((bench_dir / "results.json").read_text())
    for key in ("machine", "date", "command", "concurrency", "region_share_median"):
        assert key in r
    assert r["simulated"] is True and r["profile"] == "tiny" and r["concurrency"] == 4
    assert r["command"].startswith("krex bench run")
    for mode in ("exclusive", "native_repeat", "shared", "krex"):
        assert r["modes"][mode]["throughput_cmds_per_min"] > 0
        assert mode in r["throughput_ratio_vs_exclusive"]
        assert set(r["inflation_p95"][mode]) == {">10ms", ">1ms", ">0.1ms"}
        assert mode in r["kendall_tau_median"]
    for mode in ("native_repeat", "shared", "krex"):
        assert set(r["flip_rate"][mode]) == {"<2%", "2-5%", ">5%"}
    assert len(r["commands"]) == 4 * 20


def test_krex_measures_like_exclusive_and_shared_does_not(bench_dir: Path) -> None:
    """On the simulated GPU: krex's p95 inflation stays within the paper's bands and ranks like
    the exclusive run; unprotected sharing inflates and flips."""
    r = json.loads((bench_dir / "results.json").read_text())
    krex, shared = r["inflation_p95"]["krex"], r["inflation_p95"]["shared"]
    assert krex[">10ms"] <= 0.0030 and krex[">1ms"] <= 0.0158 and krex[">0.1ms"] <= 0.0390
    assert max(shared.values()) >= 0.30
    assert all(v == 0.0 for v in r["flip_rate"]["krex"].values())
    # Throughput is a measurement (what `krex bench` reports), not a behaviour: under load a
    # ratio asserted here failed 2 of 3 CI runs (issue #49). That it is computed is.
    assert r["throughput_ratio_vs_exclusive"]["krex"] > 0
    assert 0 < r["region_share_median"] < 1


def test_report_and_plots_are_written_and_rerendered(bench_dir: Path) -> None:
    """report.md (and the plots where matplotlib is installed) exist and `krex bench report`
    renders them again from results.json alone."""
    report = bench_dir / "report.md"
    assert "SIMULATED" in report.read_text()
    report.unlink()
    p = subprocess.run(
        [*KREX, "bench", "report", str(bench_dir)], capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0, p.stderr
    assert report.exists()


def test_bad_arguments_are_one_clear_error(tmp_path: Path) -> None:
    for args, words in (
        (["--modes", "shared,krex"], "must include exclusive"),
        (["--modes", "exclusive,turbo"], "unknown mode(s) turbo"),
        (["--profile", "tiny", "--tasks", "softmax,fft"], "unknown task(s) fft"),
        (["--settle", "-1"], "seconds must be from 0 to 5"),
        (["--settle", "9"], "seconds must be from 0 to 5"),
    ):
        p = subprocess.run(
            [*KREX, "bench", "run", "--out", str(tmp_path / "x"), *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert p.returncode == 2 and words in p.stderr, p.stderr


def side_by_side(out: Path, other: str, *args: str) -> dict[str, Any]:
    """The tiny suite's softmax and matmul tasks, exclusive, krex and `other` at 4 at once;
    results.json."""
    p = subprocess.run(
        [*KREX, "bench", "run", "--modes", f"exclusive,krex,{other}", "--concurrency", "4", *args,
         "--profile", "tiny", "--tasks", "softmax,matmul", "--out", str(out)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    return dict(json.loads((out / "results.json").read_text()))


def test_pool_on_and_off_side_by_side(tmp_path: Path) -> None:
    """--modes ...,krex,krex-cold with a simulated pool: krex's commands run warm, krex-cold's
    cold, and both measure like exclusive."""
    r = side_by_side(tmp_path / "b", "krex-cold", "--pool", "4")
    pools = {(c["mode"], c.get("pool")) for c in r["commands"]}
    assert {m for m, pool in pools if pool == "warm"} == {"krex"}, pools
    assert ("krex-cold", "cold") in pools and ("krex", "cold") not in pools
    for mode in ("krex", "krex-cold"):
        assert r["inflation_p95"][mode][">0.1ms"] <= 0.02, r["inflation_p95"]


def test_krex_settle_side_by_side_idles_its_regions_and_only_its_own(tmp_path: Path) -> None:
    """--modes ...,krex,krex-settle: krex-settle's commands run under `krex run --settle S`, so
    regions that follow the others' GPU work idle S after the freeze (the simulated GPU: the
    shim's counts say they worked); krex's never idle; both measure like exclusive."""
    out = tmp_path / "b"
    r = side_by_side(out, "krex-settle", "--settle", "0.2")
    settled = {m: [c["settle_s"] for c in r["commands"] if c["mode"] == m]
               for m in ("krex", "krex-settle")}  # fmt: skip
    assert settled["krex"] and all(x == 0.0 for x in settled["krex"]), settled
    assert any(x >= 0.2 for x in settled["krex-settle"]), settled
    for c in r["commands"]:  # each region's settle and warnings, summing to the command's
        if c["mode"] in ("krex", "krex-settle") and c["regions"]:
            recs = c["region_records"]
            assert len(recs) == c["regions"] and all(isinstance(x["warnings"], list) for x in recs)
            assert abs(sum(x["settle_s"] for x in recs) - c["settle_s"]) < 1e-9, c
    assert r["settle_s"] == 0.2 and "krex-settle" in r["throughput_ratio_vs_exclusive"]
    for mode in ("krex", "krex-settle"):
        assert r["inflation_p95"][mode][">0.1ms"] <= 0.02, r["inflation_p95"]
    assert "krex-settle" in (out / "report.md").read_text()


def test_krex_mps_side_by_side_says_whether_mps_was_in_effect(tmp_path: Path) -> None:
    """--modes ...,krex,krex-mps: krex-mps's daemon is started with `--mps`; the simulated GPU
    ignores MPS, so results.json and the report say it was not in effect, and the mode measures
    like krex (on a GPU, docs/results/h200-mps/)."""
    out = tmp_path / "b"
    r = side_by_side(out, "krex-mps")
    assert r["mps"] == {"krex-mps": False}, r.get("mps")
    assert {c["mode"] for c in r["commands"]} >= {"krex", "krex-mps"}
    assert r["inflation_p95"]["krex-mps"][">0.1ms"] <= 0.02, r["inflation_p95"]
    assert "- krex-mps: MPS not in effect" in (out / "report.md").read_text()


# --- failures: a suite of fake commands, run in-process ---------------------------------------

# A benchmarking command that behaves by its variant. "ok-*" hold a marker file for HOLD_S while
# they run, as a command holds device memory. "hungry" needs the GPU's memory to itself: it dies
# of PyTorch's out-of-memory error if it sees another command's marker while it runs (HOLD_S),
# so it fails only when it shares. "broken" always fails; "silent" exits 0 without a result;
# "slow" outlives any time-out.
FAKE = """
import json, os, sys, time
from pathlib import Path

task, variant, markers, hold_s = sys.argv[1], sys.argv[2], Path(sys.argv[3]), float(sys.argv[4])
if variant == "broken":
    sys.exit("Traceback (most recent call last):\\nValueError: the candidate is broken")
if variant == "silent":
    sys.exit(0)
if variant == "slow":
    time.sleep(60)
if variant == "hungry":
    end = time.monotonic() + hold_s
    while time.monotonic() < end:
        if any(markers.iterdir()):
            sys.exit("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB")
        time.sleep(0.01)
else:
    mine = markers / f"{variant}-{os.getpid()}"
    mine.touch()
    time.sleep(hold_s)
    mine.unlink()
print(json.dumps({"task": task, "variant": variant, "median_ms": 1.0 + len(variant) / 10}))
"""


@pytest.fixture
def fake_suite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A function that makes runner.run's suite the fake commands of the given variants."""
    script = tmp_path / "fake_cmd.py"
    script.write_text(textwrap.dedent(FAKE))
    markers = tmp_path / "markers"
    markers.mkdir()

    def use(*variants: str, hold_s: float = 2.0) -> None:
        cmds = [
            Command(
                "fake",
                v,
                (sys.executable, str(script), "fake", v, str(markers), str(hold_s)),
                simulated=True,
            )
            for v in variants
        ]
        monkeypatch.setattr(runner, "commands", lambda profile, tasks=None: cmds)

    return use


def test_a_command_failing_only_when_shared_is_counted_not_raised(
    fake_suite: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """hungry fails of out-of-memory when it shares the GPU and succeeds alone; broken fails
    everywhere. The run completes, results.json counts both in each mode (krex included), the
    report lists them and stderr says how many failed per mode."""
    fake_suite("ok-a", "ok-b", "hungry", "broken")
    out = tmp_path / "out"
    r = runner.run(["exclusive", "shared", "krex"], 3, out, "tiny", "krex bench run (test)")
    doc = json.loads((out / "results.json").read_text())
    assert doc["modes"] == r["modes"]
    excl, shared, krex = (doc["modes"][m] for m in ("exclusive", "shared", "krex"))
    assert (excl["commands"], excl["succeeded"], excl["failed_alone"]) == (4, 3, 1)
    assert (shared["failed"], shared["failed_oom"], shared["failed_only_when_shared"]) == (2, 1, 1)
    by_variant = {f["variant"]: f for f in doc["failures"]["shared"]}
    assert by_variant["hungry"]["oom"] and by_variant["hungry"]["only_when_shared"]
    assert by_variant["hungry"]["reason"].startswith("torch.OutOfMemoryError: CUDA out of memory")
    assert by_variant["broken"] == {
        "task": "fake",
        "variant": "broken",
        "status": 1,
        "oom": False,
        "only_when_shared": False,
        "reason": "ValueError: the candidate is broken",
        "attempts": 0,
        "wall_s": by_variant["broken"]["wall_s"],
    }
    # Through krex the broken command fails too, and is counted, with krex's exit status.
    krex_broken = [f for f in doc["failures"]["krex"] if f["variant"] == "broken"]
    assert krex_broken and krex_broken[0]["status"] == 1 and krex["failed_alone"] == 1
    # Only commands that succeeded have records; krex's carry their report's memory figures.
    assert {(c["mode"], c["variant"]) for c in doc["commands"]} >= {
        ("exclusive", "hungry"),
        ("shared", "ok-a"),
    }
    assert ("shared", "hungry") not in {(c["mode"], c["variant"]) for c in doc["commands"]}
    assert all("wait_s" in c["memory"] for c in doc["commands"] if c["mode"] == "krex")
    assert krex["memory_wait_s"]["n"] == krex["succeeded"]
    assert excl["memory_wait_s"]["n"] == 0
    err = capsys.readouterr().err
    assert "shared: 2 of 4 commands failed (1 out of memory, 1 only when shared)" in err
    assert "exclusive: 1 of 4 commands failed (0 out of memory, 0 only when shared)" in err
    report = (out / "report.md").read_text()
    assert "| shared | fake/hungry | 1 | yes | yes | 0 | torch.OutOfMemoryError" in report


def test_time_outs_and_missing_results_are_failures(
    fake_suite: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A command killed at the time-out has status None and says so; one that exits 0 without
    a JSON result line is a failure with status 0."""
    monkeypatch.setattr(runner, "COMMAND_TIMEOUT_S", 0.5)
    fake_suite("ok-a", "slow", "silent", hold_s=0.0)
    r = runner.run(["exclusive"], 1, tmp_path / "out", "tiny", "krex bench run (test)")
    failures = {f["variant"]: f for f in r["failures"]["exclusive"]}
    assert failures["slow"]["status"] is None
    assert failures["slow"]["reason"] == "timed out after 0.5 s"
    assert failures["slow"]["wall_s"] < 30
    assert failures["silent"]["status"] == 0
    assert failures["silent"]["reason"] == "printed no JSON result line"
    assert r["modes"]["native_repeat"]["failed"] == 2


def test_an_exclusive_run_without_any_success_is_an_error(fake_suite: Any, tmp_path: Path) -> None:
    """When every command fails in the baseline there is nothing to compare: one BenchError
    with the first command's status and stderr, and no results.json."""
    fake_suite("broken", "silent")
    with pytest.raises(runner.BenchError, match="failed with status 1") as e:
        runner.run(["exclusive", "shared"], 2, tmp_path / "out", "tiny", "krex bench run")
    assert "every command failed in the exclusive run" in str(e.value)
    assert "ValueError: the candidate is broken" in str(e.value)
    assert not (tmp_path / "out" / "results.json").exists()


@pytest.mark.parametrize(
    ("stderr", "memory", "oom"),
    [
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate", None, True),
        ("RuntimeError: CUDA error: CUDA_ERROR_OUT_OF_MEMORY", None, True),
        ("hipErrorOutOfMemory", None, True),
        ("cupy: out of memory allocating 1 GiB", None, True),
        ("ValueError: bad shape", {"oom_alone": 0, "oom_shared": 2}, True),
        ("ValueError: bad shape", {"oom_alone": 1, "oom_shared": 0}, True),
        ("ValueError: bad shape", {"oom_alone": 0, "oom_shared": 0}, False),
        ("MemoryError", None, False),
    ],
)
def test_out_of_memory_is_read_from_stderr_or_the_krex_report(
    stderr: str, memory: dict[str, int] | None, oom: bool
) -> None:
    """Each framework's spelling of device out-of-memory, or a krex report counting one, is
    out of memory; other errors (a host MemoryError) are not."""
    assert runner.out_of_memory(stderr, memory) is oom


def test_run_timed_keeps_the_last_json_line_and_fresh_caches(tmp_path: Path) -> None:
    """The GPU scripts' one way to run and time a command natively: its status, wall time, the
    last JSON line it printed (not a later plain line), and compile caches of its own."""
    script = textwrap.dedent("""
        import json, os
        print(json.dumps({"n": 1}))
        print(json.dumps({"n": 2, "cache": os.environ["TRITON_CACHE_DIR"]}))
        print("done")
        raise SystemExit(3)
        """)
    r = runner.run_timed(
        [sys.executable, "-c", script], tmp_path, "t", sock=None, warm=False, timeout=60
    )
    assert (r.rc, r.report) == (3, None)
    assert r.result == {"n": 2, "cache": str(tmp_path / "cache-t" / "triton")}
    assert r.wall_s > 0


def test_not_ready_names_the_processes_that_did_not_say_ready_in_time() -> None:
    """A process that hangs before its first line cannot hang the caller: it is returned once
    the time-out passes, as is one that said something else; those that said it are not."""
    import subprocess
    import sys
    import time

    from krex.bench.runner import not_ready

    def proc(code: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)

    ok = proc("print('ready', flush=True); import time; time.sleep(30)")
    hung = proc("import time; time.sleep(30)")
    wrong = proc("print('no gpu', flush=True)")
    procs = [ok, hung, wrong]
    try:
        t0 = time.monotonic()
        assert not_ready(procs, timeout_s=1.5) == [hung, wrong]
        assert time.monotonic() - t0 < 10
        assert not_ready([ok], timeout_s=0.5) == [ok]  # its one line has been read already
    finally:
        for p in procs:
            p.kill()
            p.wait()
