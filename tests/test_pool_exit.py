"""How a warm command ends (issue #17): as it would natively, and with no exit tax. Exit
handlers, left-open process pools and threads, SIGTERM, and a framework's slow teardown
(a stand-in `torch` whose compile helper and exit handler behave as Inductor's do:
docs/results/h200-pool/probe/)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from helpers import HOLDER, KREX, Daemon, krex_run, preloading_daemon, until, wait_pool_ready

TORCH = textwrap.dedent("""
    # A stand-in for torch: its settings, its seed, and torch.compile's leftovers: a helper
    # process (as Inductor's compile workers) and a slow exit handler (as its shutdown of them).
    import atexit, random, subprocess, sys, time, types, warnings
    warnings.filterwarnings("ignore", message="from torch's internals")  # as torch's own
    backends = types.SimpleNamespace(cudnn=types.SimpleNamespace(benchmark=False))
    class _Generator:  # as torch's: a fresh one is seeded from the system's entropy
        def __init__(self):
            self.seed()
        def seed(self):
            self._seed = random.SystemRandom().getrandbits(63)
            return self._seed
        def manual_seed(self, s):
            self._seed = s
            return self
        def initial_seed(self):
            return self._seed
    default_generator = _Generator()
    def manual_seed(s):
        default_generator.manual_seed(s)
    def initial_seed():
        return default_generator.initial_seed()
    def _shutdown_compile_workers():
        time.sleep(30)
    def compile(fn):
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                          "torch._inductor.compile_worker"])
        atexit.register(_shutdown_compile_workers)
        return fn
""")


@pytest.fixture
def torch_pool(tmp_path: Path) -> Iterator[Daemon]:
    """A pool whose workers preload the stand-in torch."""
    fake = tmp_path / "fake"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text(TORCH)
    d = preloading_daemon(tmp_path, fake, ["torch"])
    wait_pool_ready(d, 1)
    try:
        yield d
    finally:
        d.stop()


def run(d: Daemon, tmp: Path, script: str, *pre: str, name: str = "cmd.py") -> tuple[
    subprocess.CompletedProcess[str], dict[str, Any], float
]:  # fmt: skip
    path = tmp / name
    path.write_text(textwrap.dedent(script))
    report = tmp / f"{name}.json"
    t0 = time.monotonic()
    p = subprocess.run(
        [*KREX, "run", "--sim", "--socket", str(d.socket), "--report", str(report), *pre, "--",
         sys.executable, str(path)],
        capture_output=True, text=True, timeout=120, cwd=tmp,
    )  # fmt: skip
    return p, json.loads(report.read_text()), time.monotonic() - t0


def gone_within(pids: list[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in pids):
            return True
        time.sleep(0.05)
    return False


def test_exit_handlers_run_before_the_status_and_the_worker_serves_on(
    pool: Daemon, tmp_path: Path
) -> None:
    """The command's atexit handlers run, in CPython's order, and what they print is in its
    output before `krex run` returns; the next command runs warm from the same worker."""
    p, rep, _ = run(pool, tmp_path, """
        import atexit, os
        atexit.register(print, "registered first, runs last")
        atexit.register(lambda: print("registered last, runs first"))
        print("main", os.getppid())
    """)  # fmt: skip
    assert p.returncode == 0 and rep["pool"] == "warm", p.stderr
    lines = p.stdout.splitlines()
    assert lines[1:] == ["registered last, runs first", "registered first, runs last"], lines
    q, rep2, _ = run(pool, tmp_path, "import os\nprint('main', os.getppid())\n", name="next.py")
    assert rep2["pool"] == "warm" and q.stdout.split()[1] == lines[0].split()[1]


LEFT_OPEN = """
    import concurrent.futures, os, threading, time
    pool = concurrent.futures.ProcessPoolExecutor(2)
    print(pool.submit(pow, 2, 10).result(), flush=True)
    print("workers", *[p.pid for p in pool._processes.values()], flush=True)
    def late():
        time.sleep(1.0)
        print("late thread done", flush=True)
    threading.Thread(target=late).start()
    print("main done", flush=True)
"""


def test_a_left_open_pool_and_thread_end_as_natively(pool: Daemon, tmp_path: Path) -> None:
    """A ProcessPoolExecutor left open and a non-daemon thread: the interpreter's exit joins
    the thread and shuts the pool down, warm as natively (the same output, status 0, the
    pool's processes gone); before issue #17 `krex run` never returned."""
    native = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(LEFT_OPEN)], capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    p, rep, wall = run(pool, tmp_path, LEFT_OPEN)
    assert p.returncode == native.returncode == 0 and rep["pool"] == "warm", p.stderr
    strip = [x for x in p.stdout.splitlines() if not x.startswith("workers")]
    assert strip == [x for x in native.stdout.splitlines() if not x.startswith("workers")]
    assert strip == ["1024", "main done", "late thread done"]
    assert 1.0 <= wall < 30, wall
    workers = [int(x) for x in p.stdout.splitlines()[1].split()[1:]]
    assert workers and gone_within(workers, 10), "the pool's processes outlived the command"


def test_sigterm_to_krex_run_ends_a_warm_command_in_bounded_time(
    pool: Daemon, tmp_path: Path
) -> None:
    """As `timeout` does: SIGTERM to `krex run` reaches the command, which ends (143), with the
    process pool it left; nothing of it stays behind."""
    script = tmp_path / "term.py"
    script.write_text(textwrap.dedent("""
        import concurrent.futures, os, time
        pool = concurrent.futures.ProcessPoolExecutor(2)
        pool.submit(pow, 2, 2).result()
        print(os.getpid(), *[p.pid for p in pool._processes.values()], flush=True)
        time.sleep(120)
    """))  # fmt: skip
    report = tmp_path / "term.json"
    p = subprocess.Popen(
        [*KREX, "run", "--sim", "--socket", str(pool.socket), "--report", str(report), "--",
         sys.executable, str(script)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert p.stdout is not None
    pids = [int(x) for x in p.stdout.readline().split()]
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=20) == 143
    assert time.monotonic() - t0 < 10
    rep = json.loads(report.read_text())
    assert (rep["pool"], rep["exit_code"]) == ("warm", 143), rep
    assert gone_within(pids, 15), "processes of the command outlived it"


def test_krex_run_returns_before_the_framework_teardown(torch_pool: Daemon, tmp_path: Path) -> None:
    """A command whose framework leaves a helper process (holding its stdout) and a 30 s exit
    handler, as torch.compile's Inductor does: `krex run` returns once the command's own work
    and handlers are done, its output complete, whoever reads the output to its end stops
    waiting; the teardown goes on in the pool tenant (never foreign), and a region of another
    command meanwhile is clean."""
    p, rep, wall = run(torch_pool, tmp_path, """
        import atexit, os, torch
        from krex.sim.simgpu import SimGPU
        g = SimGPU()  # it uses the GPU, so the region below would see it if it were not ours
        g.launch(1000)
        g.sync()
        f = torch.compile(lambda x: x)
        atexit.register(print, "own handler")
        print("done", os.getpid(), flush=True)
    """)  # fmt: skip
    assert p.returncode == 0 and rep["pool"] == "warm", p.stderr
    assert p.stdout.splitlines()[-1] == "own handler"
    assert wall < 15, f"{wall:.1f} s: the 30 s framework teardown was waited for"
    child = int(p.stdout.split()[1])
    assert psutil.pid_exists(child), "its teardown goes on after the return"
    # The daemon takes the teardown in once the command's end reaches it (polled: later than
    # krex run's return on a loaded machine); it lasts 30 s.
    until(
        lambda: (torch_pool.status() or {})["gpus"][0]["pool"]["tearing_down"] >= 1,
        20,
        "the teardown in the pool tenant",
    )
    owner = tmp_path / "owner.json"
    h = krex_run(torch_pool, sys.executable, "-c", HOLDER, "0.2", report=owner,
                 stdout=subprocess.PIPE)  # fmt: skip
    assert h.wait(timeout=60) == 0
    (region,) = json.loads(owner.read_text())["regions"]
    assert region["clean"] is True and region["problems"] == [], region


def test_settings_and_seeds_of_a_preloaded_framework_start_fresh(
    torch_pool: Daemon, tmp_path: Path
) -> None:
    """torch settings a command changes (cudnn.benchmark) and its seed do not reach the next
    command: each starts with the preloaded module as a fresh import left it."""
    script = """
        import torch
        print(torch.backends.cudnn.benchmark, torch.initial_seed())
        torch.backends.cudnn.benchmark = True
        torch.manual_seed(1234)
    """
    outs = []
    for i in range(3):
        p, rep, _ = run(torch_pool, tmp_path, script, name=f"s{i}.py")
        assert p.returncode == 0 and rep["pool"] == "warm", p.stderr
        outs.append(p.stdout.split())
    assert [o[0] for o in outs] == ["False"] * 3, outs
    # As a fresh torch: a seed of its own each time (not the last command's, not a constant).
    seeds = [int(o[1]) for o in outs]
    assert len(set(seeds)) == 3 and 1234 not in seeds, outs


def test_warning_options_sit_behind_the_filters_a_preload_added(
    torch_pool: Daemon, tmp_path: Path
) -> None:
    """`python -W error cmd.py` where cmd.py imports torch: natively torch's own ignores, added
    at its import, come before -W error, so a warning they ignore stays ignored. Warm, torch was
    imported before the options existed; they must still land behind its filters."""
    script = tmp_path / "w.py"
    script.write_text(
        textwrap.dedent("""
        import warnings, torch
        warnings.warn("from torch's internals")
        print([(f[0], f[1] and f[1].pattern) for f in warnings.filters[:3]])
    """)
    )
    argv = [sys.executable, "-W", "error", str(script)]
    native = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(tmp_path / "fake")})  # fmt: skip
    assert native.returncode == 0, native.stderr
    report = tmp_path / "w.json"
    warm = subprocess.run(
        [*KREX, "run", "--sim", "--socket", str(torch_pool.socket), "--report", str(report),
         "--", *argv],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert json.loads(report.read_text())["pool"] == "warm"
    assert (warm.returncode, warm.stdout, warm.stderr) == (0, native.stdout, ""), warm.stderr


def test_auto_regions_run_warm(pool: Daemon, tmp_path: Path) -> None:
    """--auto-regions no longer forces a cold start: the forked child installs the wrappers
    as sitecustomize would have at start-up."""
    (tmp_path / "mybench.py").write_text("def timed():\n    return 42\n")
    p, rep, _ = run(pool, tmp_path, """
        import mybench
        print(mybench.timed())
    """, "--auto-regions", "mybench.timed")  # fmt: skip
    assert p.returncode == 0 and p.stdout.strip() == "42", p.stderr
    assert rep["pool"] == "warm", rep
    assert len(rep["regions"]) == 1 and rep["regions"][0]["clean"] is True, rep
    assert rep.get("auto_regions_unresolved", []) == [], rep
