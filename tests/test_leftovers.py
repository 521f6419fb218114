"""Nothing a krex daemon creates outlives it (issue #49, B): on every way it ends (a start it
refuses, a stop while commands run, a crash and the next daemon's start) its shared-memory
segments, its socket, its pid file and its workers' sockets go. /dev/shm and the socket's
directory are listed before and after each path; what a daemon keeps on purpose (its log, the
learned memory peaks) is allowed."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from helpers import KREX, SIM_SIBLING, Daemon, krex_run, until

from krex.core.config import Config

# What stays on purpose: the daemon's log (the tests' Daemon writes it beside the socket) and
# the peaks it learned (krex/daemon/memory.py: read again by the next daemon).
KEPT = {"daemon.log", "krex.sock.peaks.json"}


def _prefix(sock: Path) -> str:
    """The default gates segment's name of a daemon on `sock`, without its slash: every
    segment of that daemon (its tenants' `-t<N>`, the simulated GPU's `-sim`) starts with it."""
    return Config(socket=sock).segment_name().lstrip("/")


def _shm(prefix: str) -> set[str]:
    return {e for e in os.listdir("/dev/shm") if e == prefix or e.startswith(prefix + "-")}


def _files(directory: Path) -> set[str]:
    return {p.name for p in directory.iterdir()} - KEPT


def _until(check: Callable[[], object], within_s: float = 30.0) -> None:
    until(check, within_s, every_s=0.05)


def _daemon(run_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """A daemon on run_dir/krex.sock that is expected to refuse to start."""
    return subprocess.run(
        [*KREX, "daemon", "--sim", "--socket", str(run_dir / "krex.sock"), *extra],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_daemon_refused_for_its_metrics_port_leaves_nothing(tmp_path: Path) -> None:
    """The metrics port is taken: the daemon says so and exits 2, and neither its gates
    segment nor its pid file stays (before the fix: both did)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    taken = socket.socket()
    taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        port = taken.getsockname()[1]
        p = _daemon(run_dir, "--metrics-port", str(port))
    finally:
        taken.close()
    assert p.returncode == 2, p.stderr
    assert "metrics" in p.stderr and "Traceback" not in p.stderr
    assert _shm(_prefix(run_dir / "krex.sock")) == set()
    assert _files(run_dir) == set()


def test_a_second_daemon_on_the_same_socket_leaves_the_first_one_s_files(tmp_path: Path) -> None:
    """Another daemon runs on the socket: the second refuses and touches none of the first
    one's files (its pid file still names it, its segment is still there)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    sock = run_dir / "krex.sock"
    first = Daemon(sock)
    first.start()
    try:
        before_files, before_shm = _files(run_dir), _shm(_prefix(sock))
        p = _daemon(run_dir)
        assert p.returncode == 2 and "another krex daemon" in p.stderr, p.stderr
        assert _files(run_dir) == before_files and _shm(_prefix(sock)) == before_shm
        assert first.proc is not None
        assert (run_dir / "krex.sock.pid").read_text().strip() == str(first.proc.pid)
        assert first.status() is not None
    finally:
        first.stop()
    assert first.proc.returncode == 0
    assert _files(run_dir) == set() and _shm(_prefix(sock)) == set()


def test_a_second_daemon_on_the_same_segment_leaves_nothing_of_its_own(tmp_path: Path) -> None:
    """Two sockets, one segment (docs/security.md, case 5): the second daemon refuses, leaves
    no pid file of its own (before the fix: it did) and does not remove the first one's live
    segment."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    segment = _prefix(a / "krex.sock")
    config = tmp_path / "krex.toml"
    config.write_text(f'[daemon]\nsegment = "/{segment}"\n')
    first = Daemon(a / "krex.sock", "--config", str(config))
    first.start()
    try:
        p = _daemon(b, "--config", str(config))
        assert p.returncode == 2 and "in use by another krex daemon" in p.stderr, p.stderr
        assert _files(b) == set()
        assert segment in _shm(segment)
        st = first.status()
        assert st is not None and st["segment_linked"]
    finally:
        first.stop()
    assert _files(a) == set() and _shm(segment) == set()


def _daemon_with_command(tmp_path: Path) -> tuple[Path, Daemon, subprocess.Popen[str]]:
    """A daemon on run/krex.sock (the directory returned) and a command through it on the
    simulated GPU (its tenant segment and the simulated GPU's mapped) that runs until
    killed."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    d = Daemon(run_dir / "krex.sock")
    d.start()
    cmd = krex_run(d, sys.executable, "-c", SIM_SIBLING, "idle", stdout=subprocess.PIPE)
    assert cmd.stdout is not None
    assert cmd.stdout.readline().strip() == "ready"
    return run_dir, d, cmd


def test_a_daemon_stopped_while_a_command_runs_leaves_nothing(tmp_path: Path) -> None:
    """SIGTERM while a command runs: the daemon ends at once (its socket and pid file go);
    the command carries on, its segment and the simulated GPU's stay under their names while
    it does (its new processes attach by name), and once it ends, its `krex run` removes them
    (before the fix both stayed for good, with the pid file)."""
    run_dir, d, cmd = _daemon_with_command(tmp_path)
    sock = d.socket
    try:
        prefix = _prefix(sock)
        assert {prefix, prefix + "-sim"} < _shm(prefix)  # and the command's own slots
        d.stop()
        assert d.proc is not None and d.proc.returncode == 0, d.log.read_text()
        assert _files(run_dir) == set()
        assert cmd.poll() is None, "the command goes on without its daemon"
        cmd.send_signal(signal.SIGTERM)  # krex run passes it on to the command
        cmd.wait(timeout=60)
        assert _shm(prefix) == set()
    finally:
        cmd.kill()
        cmd.wait(timeout=60)


def test_a_killed_daemon_s_leftovers_are_reclaimed_by_the_next(tmp_path: Path) -> None:
    """SIGKILL leaves everything; the next daemon on the socket takes its predecessor's
    segments over (the command still running stays drained), and once the command has ended
    and that daemon stops, nothing of either is left."""
    run_dir, d, cmd = _daemon_with_command(tmp_path)
    sock = d.socket
    try:
        assert d.proc is not None
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait(timeout=30)
        assert (run_dir / "krex.sock.pid").exists()  # what a crash leaves
        successor = Daemon(sock)
        successor.start()
        assert successor.proc is not None
        assert (run_dir / "krex.sock.pid").read_text().strip() == str(successor.proc.pid)
        cmd.kill()
        cmd.wait(timeout=60)
        # The command's segment goes once its processes have (the reaper's pass, ~1 s).
        _until(lambda: _shm(_prefix(sock)) <= {_prefix(sock), _prefix(sock) + "-sim"})
        successor.stop()
        assert successor.proc.returncode == 0, successor.log.read_text()
        assert _shm(_prefix(sock)) == set()
        assert _files(run_dir) == set()
    finally:
        cmd.kill()
        cmd.wait(timeout=60)
