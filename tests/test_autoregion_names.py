"""Names given to `krex run --auto-regions` that never resolve are said, not silently ignored
(issue #18): a warning at exit and the report's `auto_regions_unresolved`."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import Daemon, run_argv

MYBENCH = """
def time_kernel():
    return 1
"""

SCRIPT = """
import subprocess, sys
import mybench
mybench.time_kernel()
"""

PARENT_ONLY = """
import subprocess, sys
subprocess.run([sys.executable, "-c", "import mybench; mybench.time_kernel()"], check=True)
"""


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[Daemon]:
    d = Daemon(tmp_path / "krex.sock")
    d.start()
    try:
        yield d
    finally:
        d.stop()


def _run(d: Daemon, tmp_path: Path, names: str, script: str) -> tuple[int, str, dict[str, object]]:
    (tmp_path / "mybench.py").write_text(MYBENCH)
    (tmp_path / "main.py").write_text(script)
    report = tmp_path / "report.json"
    p = subprocess.run(
        [*run_argv(d), "--report", str(report), "--auto-regions", names, "--",
         sys.executable, str(tmp_path / "main.py")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    return p.returncode, p.stderr, json.loads(report.read_text())


def test_a_typo_in_a_name_is_warned_about_and_reported(sim: Daemon, tmp_path: Path) -> None:
    rc, err, report = _run(sim, tmp_path, "mybench.tme_kernel", SCRIPT)
    assert rc == 0, err
    assert report["auto_regions_unresolved"] == ["mybench.tme_kernel"]
    assert "--auto-regions mybench.tme_kernel was never found" in err
    assert report["regions"] == []


def test_a_name_resolved_in_a_child_process_is_not_warned_about(
    sim: Daemon, tmp_path: Path
) -> None:
    """The parent never imports the module; its child does, and that counts."""
    rc, err, report = _run(sim, tmp_path, "mybench.time_kernel", PARENT_ONLY)
    assert rc == 0, err
    assert "auto_regions_unresolved" not in report and "never found" not in err
    assert len(report["regions"]) == 1  # type: ignore[arg-type]


# A stand-in of KernelBench's src/kernelbench/timing.py (read at 423217d): its five timers with
# their signature, and get_timing_function's choice among them.
KB_METHODS = ("cuda_event", "do_bench", "do_bench_impl", "host_time", "nsight_python_time")
KB_TIMING = """
def _timer(kernel_fn, args, num_warmup=3, num_trials=10, discard_first=1, verbose=True,
           device=None):
    return [kernel_fn(*args) for _ in range(num_trials)]


time_execution_with_cuda_event = _timer
time_execution_with_do_bench_interface = _timer
time_execution_with_do_bench_impl = _timer
time_execution_with_host_time = _timer
time_execution_with_nsight_python = _timer


def get_timing_function(method="cuda_event"):
    match method:
        case "cuda_event":
            return time_execution_with_cuda_event
        case "do_bench":
            return time_execution_with_do_bench_interface
        case "do_bench_impl":
            return time_execution_with_do_bench_impl
        case "host_time":
            return time_execution_with_host_time
        case "nsight_python_time":
            return time_execution_with_nsight_python
        case _:
            raise ValueError(f"Unsupported timing method: {method}")
"""

KB_MAIN = """
import json, sys, krex
from kernelbench.timing import get_timing_function
out, last = {}, None
for method in sys.argv[1:]:
    times = get_timing_function(method)(lambda: 1.0, [], num_trials=3)
    record = krex.last_region()  # this call's region (ending it), or the one before
    out[method] = [times, record is not None and record != last]
    last = record
print(json.dumps(out))
"""


def test_kernelbench_s_timers_are_regions_by_default(sim: Daemon, tmp_path: Path) -> None:
    """`--auto-regions` alone covers KernelBench's harness: each timer get_timing_function
    hands out is the wrapped one, one region per timing call."""
    pkg = tmp_path / "kernelbench"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "timing.py").write_text(KB_TIMING)
    (tmp_path / "main.py").write_text(KB_MAIN)
    report = tmp_path / "report.json"
    p = subprocess.run(
        [*run_argv(sim), "--report", str(report), "--auto-regions", "--",
         sys.executable, str(tmp_path / "main.py"), *KB_METHODS],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got == {m: [[1.0] * 3, True] for m in KB_METHODS}
    doc = json.loads(report.read_text())
    assert len(doc["regions"]) == len(KB_METHODS) and "auto_regions_unresolved" not in doc
