"""What the daemon leaves behind (issue #19): the simulated GPU's segment after a clean stop."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from helpers import Daemon, krex_run, run_argv, running

USE_THE_GPU = "from krex.simgpu import SimGPU; g = SimGPU(); g.launch(1000); g.sync()"


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
