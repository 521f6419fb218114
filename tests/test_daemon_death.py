"""A daemon SIGKILLed mid-region (issue #50): the sibling it shut out at the gate goes on within
seconds, not at the gate's deadline (the region's time-out + 30 s), whether the clients that
watch the daemon live on (they thaw, and reopen the gates) or die with it (the shim's own look
at the daemon's liveness lock lets it pass: docs/shim.md, "A dead controller").

The region's time-out is set to 300 s, so the deadline (330 s) can never be what released it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import HOLDER, Daemon, krex_run, until

from krex.core.shm import Segment
from krex.core.tenants import recover

REGION_S = 300.0
GATE_DEADLINE_S = REGION_S + 30.0  # krex/daemon/regions.py: GATE_GRACE_S
RELEASED_WITHIN_S = 30.0  # generous (a loaded machine), and far below the deadline

# A sibling on the simulated GPU: its pid, then "ready", then a count of 1 ms kernels done.
KERNELS = textwrap.dedent("""
    import os
    from krex.sim.simgpu import SimGPU
    print(os.getpid(), flush=True)
    g = SimGPU()
    g.launch(1000)
    g.sync()
    print("ready", flush=True)
    n = 0
    while True:
        g.launch(1_000_000)
        g.sync()
        n += 1
        if n % 5 == 0:
            print(n, flush=True)
""")


class Kernels:
    """The sibling's command, its count read from its output by a thread. `nested`: the
    kernels run in a child of the command (a harness's worker), which outlives its `krex run`
    (the command itself dies with it: PR_SET_PDEATHSIG)."""

    def __init__(self, d: Daemon, nested: bool = False) -> None:
        argv = [sys.executable, "-c", KERNELS]
        if nested:
            argv = ["sh", "-c", '"$0" -c "$1" & wait', sys.executable, KERNELS]
        self.proc = krex_run(d, *argv, stdout=subprocess.PIPE)
        assert self.proc.stdout is not None
        self.pid = int(self.proc.stdout.readline())  # the command's, under krex run
        assert self.proc.stdout.readline().strip() == "ready"
        self.count = 0
        threading.Thread(target=self._read, daemon=True).start()
        until(lambda: self.count > 0, what="the sibling's first kernels")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.count = int(line)

    def settled(self, quiet_s: float = 1.0) -> int:
        """The count once it has not moved for quiet_s."""
        last = [self.count, time.monotonic()]

        def quiet() -> bool:
            if self.count != last[0]:
                last[:] = [self.count, time.monotonic()]
            return time.monotonic() - last[1] >= quiet_s

        until(quiet, within_s=60, what="the sibling standing still")
        return self.count


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    cfg = tmp_path / "krex.toml"
    cfg.write_text(f"[gpus]\nslots = 4\n[timeouts]\nregion_s = {REGION_S}\n")
    d = Daemon(tmp_path / "krex.sock", "--config", str(cfg))
    d.start()
    try:
        yield d
    finally:
        # A daemon again on the socket recovers what is left (reopens, thaws), then stops.
        if d.proc is None or d.proc.poll() is not None:
            with contextlib.suppress(AssertionError):
                d.start()
        d.stop()


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _region_with_a_blocked_sibling(
    d: Daemon, nested: bool = False
) -> tuple[Kernels, subprocess.Popen[str], int, str]:
    """A sibling launching kernels, then an owner in a long region: the sibling stands still
    (shut out at the gate, frozen). Returns the sibling, the owner's krex run and command pid,
    and the gates segment's name."""
    sib = Kernels(d, nested)
    owner = krex_run(d, sys.executable, "-c", HOLDER, "120", stdout=subprocess.PIPE)
    assert owner.stdout is not None
    line = owner.stdout.readline()
    assert line.startswith("in region"), line
    owner_pid = int(line.split()[2])
    st = d.status()
    assert st is not None and st["gpus"][0]["region"] is not None
    sib.settled()
    return sib, owner, owner_pid, str(st["segment"])


def _gate_closed(name: str) -> bool:
    with Segment.attach(name) as seg:
        return seg.gate(0).owner != 0


def _assert_released(sib: Kernels, frozen_at: int) -> None:
    """The sibling's kernels run again, within seconds and long before the gate's deadline."""
    t0 = time.monotonic()
    until(
        lambda: sib.count > frozen_at,
        within_s=RELEASED_WITHIN_S,
        what="the sibling's kernels after the daemon's death",
    )
    assert time.monotonic() - t0 < GATE_DEADLINE_S


def test_the_watching_clients_release_the_blocked_sibling(daemon: Daemon) -> None:
    """The daemon SIGKILLed mid-region, its clients alive: the sibling's `krex run` thaws it
    and the gates reopen; the sibling's kernels run again within seconds (before issue #50 it
    was thawed but sat at the gate until the deadline, 330 s here), and its command goes on."""
    sib, owner, owner_pid, name = _region_with_a_blocked_sibling(daemon)
    try:
        frozen_at = sib.count
        assert daemon.proc is not None
        daemon.proc.kill()
        daemon.proc.wait(timeout=30)
        _assert_released(sib, frozen_at)
        until(lambda: not _gate_closed(name), what="the gate reopened by a watching client")
        assert sib.proc.poll() is None, "the sibling's command goes on"
    finally:
        for p in (sib.proc, owner):
            p.kill()
            p.wait(timeout=60)
        _kill(sib.pid)
        _kill(owner_pid)


def test_a_sibling_whose_clients_died_too_passes_the_gate_on_its_own(daemon: Daemon) -> None:
    """The daemon and every `krex run` SIGKILLed mid-region: nobody reopens the gate. The
    sibling's kernels run in a child of its command, which outlives its `krex run`. Once it is
    thawed (here by the test, as `tenants.recover` does: a thaw alone, the gate stays closed),
    the shim sees that no one holds the daemon's liveness lock and lets it pass within seconds;
    before issue #50 it sat at the gate until the deadline."""
    sib, owner, owner_pid, name = _region_with_a_blocked_sibling(daemon, nested=True)
    try:
        frozen_at = sib.count
        assert daemon.proc is not None
        # Stopped first, all three, then killed: a watching client woken by the daemon's death
        # (or the daemon by a client's) in the moment between two kills reopened the gate once
        # on a loaded machine.
        for p in (daemon.proc, sib.proc, owner):
            os.kill(p.pid, signal.SIGSTOP)
        for p in (daemon.proc, sib.proc, owner):
            p.kill()
        for p in (daemon.proc, sib.proc, owner):
            p.wait(timeout=60)
        assert _gate_closed(name), "nobody is left to open it"
        recover(name.lstrip("/"))
        _assert_released(sib, frozen_at)
        assert _gate_closed(name), "the shim passed the gate on its own, still closed"
    finally:
        _kill(sib.pid)
        _kill(owner_pid)
