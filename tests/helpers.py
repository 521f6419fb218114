"""Helpers shared by the test files (imported as `helpers`, as conftest is): a daemon of the
test's own on the simulated GPU, `krex run` through it, tenants that hold a region or burn CPU,
and the simulated driver's witness with a gate cycler playing the controller."""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import signal
import struct
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from conftest import Node, unique

from krex.core.shm import Segment
from krex.core.tenants import _stat
from krex.daemon.gate import exclusive
from krex.sim import simnode

KREX = [sys.executable, "-m", "krex.cli"]


def until(
    cond: Callable[[], Any],
    within_s: float = 30.0,
    what: str = "the condition",
    every_s: float = 0.02,
) -> Any:
    """Poll cond until it returns something true (returned); AssertionError naming `what` after
    within_s. The one wait of the tests: a loaded machine makes a condition late, never
    wrong, so bounds are generous and nothing is asserted about how soon."""
    deadline = time.monotonic() + within_s
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not seen within {within_s:g} s")
        time.sleep(every_s)


class Daemon:
    def __init__(self, socket: Path, *extra: str) -> None:
        self.socket = socket
        self.extra = extra
        self.log = socket.parent / "daemon.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        """How the daemon is started (a subclass may boot it otherwise)."""
        return [*KREX, "daemon", "--sim", "--socket", str(self.socket), *self.extra]

    def start(self, env: dict[str, str] | None = None, cwd: str | None = None) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=log, env=env, cwd=cwd)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.status(check=False) is not None:
                return
            assert self.proc.poll() is None, self.log.read_text()
            time.sleep(0.05)
        raise AssertionError("daemon did not start: " + self.log.read_text())

    def status(self, check: bool = True) -> dict[str, Any] | None:
        p = subprocess.run(
            [*KREX, "status", "--json", "--socket", str(self.socket)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if p.returncode != 0:
            assert not check, p.stderr
            return None
        return dict(json.loads(p.stdout))

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Signal the daemon and wait for it; one that has not exited in 30 s is killed (and
        the test fails): never left running after the suite."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
                raise


@contextlib.contextmanager
def running(d: Daemon) -> Iterator[Daemon]:
    """d started, and stopped afterwards: it must exit 0."""
    d.start()
    try:
        yield d
    finally:
        d.stop()
        assert d.proc is not None and d.proc.returncode == 0, d.log.read_text()


@contextlib.contextmanager
def configured(tmp_path: Path, config: str, slots: int = 4) -> Iterator[Daemon]:
    """A daemon on the simulated GPU with `config` (TOML) for its config file and `slots`
    slots, started, and stopped afterwards."""
    cfg = tmp_path / "krex.toml"
    cfg.write_text(config)
    d = Daemon(tmp_path / "krex.sock", "--slots", str(slots), "--config", str(cfg))
    d.start()
    try:
        yield d
    finally:
        d.stop()


def where(pid: int) -> str:
    """A process's state, kernel wait channel and freezer cgroup, as /proc tells them."""
    out = []
    for name in ("status", "wchan", "cgroup"):
        try:
            text = Path(f"/proc/{pid}/{name}").read_text()
        except OSError as e:
            text = str(e)
        if name == "status":
            text = next((x for x in text.splitlines() if x.startswith("State:")), text)
        elif name == "cgroup":
            text = " ".join(x for x in text.splitlines() if "freezer" in x or x.startswith("0:"))
        out.append(f"{name}: {text.strip()}")
    return "; ".join(out)


def blocked_tasks(limit: int = 8) -> str:
    """The processes in D state (uninterruptible) with their kernel wait channel and stack's
    first frames, to find who holds what a stuck one waits for."""
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        stat = _stat(str(proc / "stat"))
        if stat is None or stat[0] != "D":
            continue
        try:
            comm = (proc / "comm").read_text().strip()
            wchan = (proc / "wchan").read_text().strip()
            try:
                stack = " < ".join(
                    line.split("] ", 1)[-1].split("+")[0]
                    for line in (proc / "stack").read_text().splitlines()[:4]
                )
            except OSError:
                stack = "?"
        except OSError:
            continue
        out.append(f"{proc.name} {comm} {wchan} [{stack}]")
    return "; ".join(out[:limit]) or "none"


def wait_pool_ready(d: Daemon, n: int, timeout_s: float = 60.0) -> dict[str, Any]:
    """Until n warm workers of GPU 0 are ready; their pool status."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        st = d.status()
        assert st is not None
        p = st["gpus"][0]["pool"]
        if p["idle"] >= n:
            return dict(p)
        time.sleep(0.05)
    raise AssertionError(f"no {n} ready worker(s): {d.status()}\n{d.log.read_text()[-3000:]}")


def preloading_daemon(tmp: Path, modules: Path, preload: list[str]) -> Daemon:
    """A started daemon with one warm worker that preloads `preload`, found in `modules` (on
    the daemon's PYTHONPATH, so its workers have it too)."""
    cfg = tmp / "config.toml"
    cfg.write_text(f"[pool]\npreload = {json.dumps(preload)}\n")
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(modules)
    try:
        d = Daemon(tmp / "krex.sock", "--pool", "1", "--config", str(cfg))
        d.start()
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH")
        else:
            os.environ["PYTHONPATH"] = old
    return d


def run_argv(d: Daemon) -> list[str]:
    """`krex run` on the simulated GPU through d."""
    return [*KREX, "run", "--sim", "--socket", str(d.socket)]


def krex_run(
    d: Daemon,
    *argv: str,
    report: Path | None = None,
    **popen: Any,
) -> subprocess.Popen[str]:
    cmd = run_argv(d)
    if report is not None:
        cmd += ["--report", str(report)]
    return subprocess.Popen([*cmd, "--", *argv], text=True, **popen)


BURNER = textwrap.dedent("""
    import sys, time
    n = 0
    while True:
        n += 1
        if n % 20000 == 0:
            print(n, flush=True)
""")


class Counter:
    """A CPU-burning tenant whose progress we can read (it prints its loop count)."""

    def __init__(self, d: Daemon) -> None:
        self.proc = krex_run(d, sys.executable, "-c", BURNER, stdout=subprocess.PIPE)
        self.last = 0
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        # Its start (krex run, admission, Python) on a loaded machine: CI beside two CPU hogs
        # once took more than 10 s.
        self.wait_moving(within_s=60.0)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.last = int(line)

    def value(self) -> int:
        return self.last

    def settled(self, quiet_s: float = 0.15, within_s: float = 1.0) -> int:
        """The count once no line has come for `quiet_s` (at most `within_s`): what a frozen
        tenant printed before it froze may still be in the pipe when a loaded machine is slow
        to run the reader thread."""
        t0 = last_change = time.monotonic()
        seen = self.value()
        while time.monotonic() - t0 < within_s:
            time.sleep(0.01)
            if self.value() != seen:
                seen, last_change = self.value(), time.monotonic()
            elif time.monotonic() - last_change >= quiet_s:
                break
        return seen

    def wait_moving(self, within_s: float = 10.0) -> float:
        """Seconds until the count moves (fails if it does not within `within_s`)."""
        t0 = time.monotonic()
        start = self.value()
        while time.monotonic() - t0 < within_s:
            time.sleep(0.01)
            if self.value() != start:
                return time.monotonic() - t0
        raise AssertionError("the sibling does not make progress")

    def stop(self) -> None:
        self.proc.kill()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            # Seen twice in full runs on the 2-core VM (2026-12-02): a SIGKILLed `krex run`
            # still there after 30 s, in D state in its exit's memory teardown
            # (unlink_file_vma_batch_process: waiting for a mapped file's i_mmap lock). Say
            # where it and every other blocked task were, then give the kernel longer: the
            # process is going, and the test's subject is not its teardown.
            seen = f"{where(self.proc.pid)}; blocked: {blocked_tasks()}"
            try:
                self.proc.wait(timeout=150)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"krex run outlived SIGKILL by 180 s: {seen}") from None
            print(f"krex run took over 30 s to die after SIGKILL: {seen}", file=sys.stderr)


HOLDER = textwrap.dedent("""
    import os, sys, time, krex
    with krex.region():
        print("in region", os.getpid(), flush=True)
        time.sleep(float(sys.argv[1]))
    print("out", flush=True)
""")


# A sibling on the simulated GPU: `busy` launches 1 ms kernels back to back, `idle` launches one
# and then only sleeps (it keeps its slot, with calls counted long ago).
SIM_SIBLING = textwrap.dedent("""
    import sys, time
    from krex.sim.simgpu import SimGPU
    g = SimGPU()
    g.launch(1000)
    g.sync()
    print("ready", flush=True)
    while sys.argv[1] == "busy":
        g.launch(1_000_000)
        g.sync()
    time.sleep(120)
""")


def assert_frozen_for_the_region(d: Daemon, sib: Counter, hold_s: float) -> None:
    """A region held `hold_s` seconds: `sib` makes no progress inside it, moves again after,
    and the region's owner finishes (exit 0)."""
    holder = krex_run(d, sys.executable, "-c", HOLDER, str(hold_s), stdout=subprocess.PIPE)
    assert holder.stdout is not None
    assert holder.stdout.readline().startswith("in region")
    granted = time.monotonic()
    frozen_at = sib.settled()
    # Look again well before the region ends: on a loaded machine settling can take most of a
    # short hold, and a look after the release would see the sibling move for the right reason.
    time.sleep(max(0.0, min(hold_s * 0.5, granted + hold_s * 0.8 - time.monotonic())))
    assert sib.value() == frozen_at, "the sibling ran during the region"
    assert holder.stdout.readline().strip() == "out"
    assert holder.wait(timeout=30) == 0, "the owner did not finish"
    sib.wait_moving(within_s=30.0)


class Witness:
    """The simulated driver's view: `granted` is written by us, the counts by the driver."""

    def __init__(self) -> None:
        self.path = Path("/dev/shm") / unique("krex-witness").lstrip("/")
        self.path.write_bytes(bytes(64))
        self._f = self.path.open("r+b")
        self._mm = mmap.mmap(self._f.fileno(), 64)

    def grant(self, owner: int) -> None:
        self._mm[0:4] = struct.pack("<I", owner)

    @property
    def submissions(self) -> int:
        return int(struct.unpack_from("<Q", self._mm, 8)[0])

    @property
    def violations(self) -> int:
        return int(struct.unpack_from("<Q", self._mm, 16)[0])

    def close(self) -> None:
        self._mm.close()
        self._f.close()
        self.path.unlink()


def progress(seg: Segment, pids: set[int]) -> dict[int, int]:
    return {s.pid: s.intercepted for s in seg.slots() if s.pid in pids and s.alive}


def cycle_gate(
    node: Node,
    procs: list[subprocess.Popen[str]],
    schedule: list[tuple[int, int, int]],
    witness: Witness,
) -> int:
    """Play the controller while procs run: close the gate for each (owner, hold ms, gap ms) of
    the schedule in turn, telling the witness who owns the GPU; after each region, every
    process still running must move again. Returns how many regions there were."""
    pids = {p.pid for p in procs}
    deadline = time.monotonic() + 120
    i = 0
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        owner, hold_ms, gap_ms = schedule[i % len(schedule)]
        i += 1
        with exclusive(node.seg, 0, owner=owner, quiesce_timeout_s=10, drain_timeout_s=10) as hold:
            assert hold.clean, hold.problems
            witness.grant(owner)
            time.sleep(hold_ms / 1000)
            witness.grant(0)
            before = progress(node.seg, pids)
        # No waiter is left blocked: every process still running moves again after open.
        moved_by = time.monotonic() + 5
        stuck: list[int] = []
        while time.monotonic() < moved_by:
            now = progress(node.seg, pids)
            stuck = [
                pid
                for pid, n in before.items()
                if pid in now
                and now[pid] == n
                and next(p for p in procs if p.pid == pid).poll() is None
            ]
            if not stuck:
                break
            time.sleep(0.002)
        assert not stuck, f"processes {stuck} did not move after the gate opened"
        time.sleep(gap_ms / 1000)
    return i


def assert_slotted_once_listed(node: Node, argv: list[str], env: dict[str, str]) -> None:
    """Start a tenant's program; once simulated GPU 0 of `node` lists it (from its context's
    creation, as NVML does), it must hold a slot: a region's audit flags a tenant's process on
    the GPU with none. The program is killed after."""
    p = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while p.pid not in (simnode.users(node.sim_shm, 0) or set()):
            assert time.monotonic() < deadline and p.poll() is None, "never listed"
            time.sleep(0.002)
        assert node.seg.slots_of(p.pid), "listed on the GPU with no slot"
    finally:
        p.kill()
        p.wait(timeout=30)
