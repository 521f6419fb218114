"""What the daemon leaves behind (issue #19): the simulated GPU's segment after a clean stop,
and a pool worker's count of processes that found no slot after its command is gone."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from helpers import Daemon, krex_run, run_argv, running, until

USE_THE_GPU = "from krex.sim.simgpu import SimGPU; g = SimGPU(); g.launch(1000); g.sync()"


def sim_segment(d: Daemon) -> Path:
    st = d.status()
    assert st is not None
    return Path("/dev/shm", st["segment"].lstrip("/") + "-sim")


def test_a_clean_stop_removes_the_simulated_gpus_segment(tmp_path: Path) -> None:
    d = Daemon(tmp_path / "krex.sock")
    with running(d):
        seg = sim_segment(d)
        p = subprocess.run(
            [*run_argv(d), "--", sys.executable, "-c", USE_THE_GPU],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert p.returncode == 0, p.stderr
        assert seg.exists()
    assert not seg.exists(), "left in /dev/shm"


def test_the_simulated_gpus_segment_stays_while_a_process_uses_it(tmp_path: Path) -> None:
    d = Daemon(tmp_path / "krex.sock")
    user: subprocess.Popen[str] | None = None
    seg: Path | None = None
    try:
        with running(d):
            seg = sim_segment(d)
            script = USE_THE_GPU + "; print('ready', flush=True); import time; time.sleep(30)"
            user = krex_run(d, sys.executable, "-c", script, stdout=subprocess.PIPE)
            assert user.stdout is not None and user.stdout.readline().strip() == "ready"
        assert seg.exists(), "removed under a process that maps it"
    finally:
        if user is not None:
            user.kill()
            user.wait(timeout=30)
        if seg is not None:
            seg.unlink(missing_ok=True)


# N processes using the GPU at once: each holds its slot until all have one (or found none).
FORK_USERS = textwrap.dedent("""
    import os, sys
    from krex.sim.simgpu import SimGPU
    n = int(sys.argv[1])
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pids = []
    for _ in range(n):
        pid = os.fork()
        if pid == 0:
            os.close(go_w)
            g = SimGPU()
            g.launch(1000)
            g.sync()
            os.write(ready_w, b"x")
            os.read(go_r, 1)  # EOF once the parent lets all go
            os._exit(0)
        pids.append(pid)
    got = 0
    while got < n:
        got += len(os.read(ready_r, n))
    os.close(go_w)
    for pid in pids:
        os.waitpid(pid, 0)
""")

REGION = textwrap.dedent("""
    import json, krex
    from krex.sim.simgpu import SimGPU
    g = SimGPU()
    with krex.region():
        g.launch(1000)
        g.sync()
    print(json.dumps(krex.last_region()))
""")


def assert_a_clean_region(d: Daemon, *opts: str) -> None:
    """Another command's region, taken now, is clean."""
    p = subprocess.run(
        [*run_argv(d), *opts, "--", sys.executable, "-c", REGION],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    record = json.loads(p.stdout.strip().splitlines()[-1])
    assert record["clean"] and record["problems"] == [], record


def _pool(d: Daemon) -> dict[str, Any]:
    st = d.status()
    assert st is not None
    return {**st["gpus"][0]["pool"], "slot_segments": st["slot_segments"]}


def _settled(d: Daemon, within_s: float = 60.0) -> None:
    """Until both workers are ready, and no slot segment is left (workers have none)."""
    until(
        lambda: (p := _pool(d))["idle"] >= 2 and p["slot_segments"] == 0,
        within_s,
        "two idle workers and no slot segment",
        every_s=0.1,
    )


def test_processes_without_a_slot_in_a_warm_command_do_not_spoil_later_regions(
    tmp_path: Path,
) -> None:
    """A warm command forks more processes using the GPU than its tenant's segment has slots
    (64). Once it is gone, another tenant's region is clean."""
    d = Daemon(tmp_path / "krex.sock", "--pool", "2")
    with running(d):
        _settled(d)
        report = tmp_path / "a.json"
        script = tmp_path / "fork_users.py"
        script.write_text(FORK_USERS)
        p = subprocess.run(
            [*run_argv(d), "--report", str(report), "--", sys.executable, str(script), "68"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert p.returncode == 0, p.stderr
        assert json.loads(report.read_text())["pool"] == "warm"
        assert "slots of the KREX segment are taken" in p.stderr, "no process overflowed"
        _settled(d)
        assert_a_clean_region(d, "--no-pool")


# N processes using the GPU at once, then gone; the command itself stays a while.
USERS_THEN_STAY = FORK_USERS + textwrap.dedent("""
    print("users gone", flush=True)
    import time
    time.sleep(float(sys.argv[2]))
""")


def test_processes_without_a_slot_that_are_gone_do_not_spoil_regions_while_their_tenant_runs(
    tmp_path: Path,
) -> None:
    """A cold command forks more processes using the GPU than its segment has slots (64); they
    exit and the command stays: another tenant's region is clean (the segment records the
    overflowing pids, and the count ends with them)."""
    d = Daemon(tmp_path / "krex.sock", "--slots", "2")
    with running(d):
        script = tmp_path / "users_then_stay.py"
        script.write_text(USERS_THEN_STAY)
        holder = subprocess.Popen(
            [*run_argv(d), "--", sys.executable, str(script), "68", "30"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline().strip() == "users gone"
            assert_a_clean_region(d)
        finally:
            holder.kill()
            _, err = holder.communicate(timeout=30)
        assert "slots of the KREX segment are taken" in err, "no process overflowed"
