"""Signals sent to `krex run` (issue #19): they reach the command, once, whenever they come,
and `krex run` still exits with the command's status and writes its report."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pty
import signal
import socket
import struct
import subprocess
import termios
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import KREX, Daemon, krex_run, run_argv, running

from krex.core import wire
from krex.core.build import identity

# A command that says it got a SIGINT; bounded, so that a command the signal never reaches
# fails the test instead of hanging it. (Ctrl-C from a terminal: test_controller.py.)
ON_INT = (
    "trap 'echo got INT; exit 5' INT; echo ready; "
    "i=0; while [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; exit 9"
)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with running(Daemon(tmp_path_factory.mktemp("d") / "krex.sock")) as d:
        yield d


def test_sigint_sent_to_krex_run_alone_reaches_a_cold_command(daemon: Daemon) -> None:
    """As a harness's proc.send_signal(SIGINT) does: only `krex run` gets it."""
    p = krex_run(daemon, "sh", "-c", ON_INT, stdout=subprocess.PIPE)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    p.send_signal(signal.SIGINT)
    assert p.wait(timeout=30) == 5
    assert p.stdout.read().strip() == "got INT"


def _on_a_terminal(argv: list[str]) -> tuple[subprocess.Popen[str], int]:
    """argv in a session of its own whose controlling terminal is a new pty; and its master."""
    master, slave = pty.openpty()

    def take_terminal() -> None:
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    try:
        p = subprocess.Popen(
            argv,
            stdin=slave,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            preexec_fn=take_terminal,
        )
    finally:
        os.close(slave)
    return p, master


def test_a_group_sigterm_gives_143_and_a_report(daemon: Daemon, tmp_path: Path) -> None:
    """`timeout 60 krex run -- sleep 30`: at the time-out, SIGTERM to `krex run` and then to
    its whole process group. The second one often came after the command was reaped."""
    report = tmp_path / "r.json"
    for _ in range(12):
        report.unlink(missing_ok=True)
        p = subprocess.Popen(
            [*run_argv(daemon), "--report", str(report), "--", "sh", "-c", "echo r; exec sleep 30"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        assert p.stdout is not None and p.stdout.readline() == "r\n"
        p.send_signal(signal.SIGTERM)
        os.killpg(p.pid, signal.SIGTERM)
        _, err = p.communicate(timeout=30)
        assert p.returncode == 128 + signal.SIGTERM and "Traceback" not in err, err
        assert json.loads(report.read_text())["exit_code"] == 128 + signal.SIGTERM


class FakeAdmission:
    """A daemon that admits one command (with no shim: an empty environment) and calls
    `at(op, peer_pid)` when a message arrives, before it answers."""

    def __init__(
        self, path: Path, at: Callable[[str, int], None], admit: dict[str, Any] | None = None
    ) -> None:
        self.path, self.at, self.admit = path, at, admit or {}
        self.ops: list[str] = []
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(1)
        self.listener.settimeout(30)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError), self.listener.accept()[0] as conn:
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            peer = struct.unpack("3i", creds)[0]
            conn.settimeout(30)
            f = conn.makefile("rwb")
            answers: dict[str, dict[str, Any]] = {
                "admit": {
                    "tenant": 1,
                    "gpu": 0,
                    "gpus": [0],
                    "env": {},
                    "build": identity(),
                    **self.admit,
                },
                "started": {"freezer": "signal"},
                "finished": {"report": {"regions": []}, "worker_status": None},
            }
            while line := f.readline():
                op = str(json.loads(line)["op"])
                self.ops.append(op)
                self.at(op, peer)
                f.write(wire.encode({"ok": True, **answers[op]}))
                f.flush()

    def close(self) -> None:
        self.listener.close()
        self.thread.join(10)


def test_sigint_before_the_command_runs_is_not_lost(tmp_path: Path) -> None:
    """SIGINT while the daemon takes the command in (forked, not yet running): it reaches the
    command as soon as it runs, and the report says so."""

    def interrupt(op: str, peer: int) -> None:
        if op == "started":
            os.kill(peer, signal.SIGINT)
            time.sleep(0.2)  # delivered to krex run before it lets the command start

    fake = FakeAdmission(tmp_path / "fake.sock", interrupt)
    report = tmp_path / "r.json"
    argv = [*KREX, "run", "--socket", str(fake.path), "--report", str(report), "--", "sleep", "20"]
    try:
        t0 = time.monotonic()
        p = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        fake.close()
    assert p.returncode == 128 + signal.SIGINT, p.stderr
    assert time.monotonic() - t0 < 15, "the command ran on"
    assert fake.ops == ["admit", "started", "finished"]
    assert json.loads(report.read_text())["exit_code"] == 128 + signal.SIGINT


@pytest.mark.parametrize("step_s", [0.5, 4.0])
def test_the_client_waits_for_started_as_long_as_the_daemon_says(
    tmp_path: Path, step_s: float
) -> None:
    """The admission's `step_s` is how long the daemon may take to place the command (its
    freeze into a live region included): shorter, and krex run gives up with one line and
    exit 125, the command killed; longer, and a slow answer is waited for."""

    def slow(op: str, peer: int) -> None:
        if op == "started":
            time.sleep(1.5)

    fake = FakeAdmission(tmp_path / "fake.sock", slow, admit={"step_s": step_s})
    argv = [*KREX, "run", "--socket", str(fake.path), "--", "true"]
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    finally:
        fake.close()
    if step_s < 1.5:
        assert p.returncode == 125, p.stderr
        assert "did not answer in time" in p.stderr and len(p.stderr.splitlines()) == 1
    else:
        assert p.returncode == 0, p.stderr
        assert fake.ops == ["admit", "started", "finished"]


def test_ctrl_c_before_the_command_runs_is_not_lost(tmp_path: Path) -> None:
    """The same from the terminal: the kernel signals the whole group, the command (forked,
    not yet running) included, which must not make it exit 127 as if it could not start."""
    master = -1

    def ctrl_c(op: str, peer: int) -> None:
        if op == "started":
            os.write(master, b"\x03")
            time.sleep(0.2)

    fake = FakeAdmission(tmp_path / "fake.sock", ctrl_c)
    report = tmp_path / "r.json"
    argv = [*KREX, "run", "--socket", str(fake.path), "--report", str(report), "--", "sleep", "20"]
    try:
        p, master = _on_a_terminal(argv)
        _, err = p.communicate(timeout=60)
    finally:
        fake.close()
        if master >= 0:
            os.close(master)
    assert p.returncode == 128 + signal.SIGINT and "Traceback" not in err, err
    assert json.loads(report.read_text())["exit_code"] == 128 + signal.SIGINT


def test_ctrl_c_while_queued_ends_krex_run_in_one_line(tmp_path: Path) -> None:
    admitted = threading.Event()

    def hang(op: str, peer: int) -> None:
        admitted.set()
        time.sleep(5)  # never answers in time: the command is queued

    fake = FakeAdmission(tmp_path / "fake.sock", hang)
    try:
        p = subprocess.Popen(
            [*KREX, "run", "--socket", str(fake.path), "--", "true"],
            stderr=subprocess.PIPE,
            text=True,
        )
        assert admitted.wait(30)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=30)
    finally:
        fake.close()
    assert p.returncode == 128 + signal.SIGINT, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines == ["krex run: interrupted before the command started"], err


def test_a_command_killed_before_the_daemon_placed_it_ends_with_its_own_status(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`started` refused because the held command is gone (a kill aimed at it before the
    daemon placed it, as `make stress`'s killer does): krex run ends with the command's status
    (128 + 9), not krex's 125; a command still alive is killed and krex's 125 it is."""
    from krex.client import run as client

    dead = subprocess.Popen(["sleep", "60"])
    dead.send_signal(signal.SIGKILL)
    refused = client.ClientError("cannot place process: Process does not exist")
    assert client._not_taken_in(dead.pid, refused) == 128 + signal.SIGKILL
    assert "the command ended before it started" in capsys.readouterr().err
    alive = subprocess.Popen(["sleep", "60"])
    assert client._not_taken_in(alive.pid, refused) == client.EXIT_KREX
    assert "could not take the command in" in capsys.readouterr().err
    with pytest.raises(ProcessLookupError):
        os.kill(alive.pid, 0)  # killed and reaped
