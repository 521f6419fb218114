"""Hostile files and names beside krex's own (issue #50, items 3, 4 and 7): another uid's
slot-segment names planted in /dev/shm, symlinks planted beside a `--socket` in a shared
directory, a `--report` that would block, a simulated node's segment someone else made.
Each is skipped, refused with one line, or written without following anyone's link; nothing
wedges and nothing of the victim's is written.

Tests that need a second uid run it as `nobody`, as tests/test_security.py does.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from conftest import remove_shm
from helpers import HOLDER, until
from test_security import NOBODY, SYSTEM_PYTHON, as_root

import krex


def _drop() -> None:
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


class Victim:
    """krex as uid 65534 (`nobody`, the victim) with the system python3 and this checkout's
    krex and packages on its path, its daemon's socket in a directory of its own; root (the
    test) is the other user who plants things."""

    def __init__(self, home: Path) -> None:
        home.mkdir(mode=0o700, exist_ok=True)
        os.chown(home, NOBODY, NOBODY)
        self.home = home
        self.sock = home / "krex.sock"
        src = Path(krex.__file__).resolve().parent.parent
        site = Path(click.__file__).resolve().parent.parent
        self.env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(home),
            "PYTHONPATH": f"{src}:{site}",
        }
        self.daemon: subprocess.Popen[bytes] | None = None
        # Its segment, as its daemon names it (the crc of the socket's path).
        self.gates = f"/krex-{NOBODY}-{zlib.crc32(str(self.sock).encode()):08x}"

    def krex(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(SYSTEM_PYTHON), "-m", "krex.cli", *args],
            preexec_fn=_drop,
            capture_output=True,
            text=True,
            cwd="/",
            env=self.env,
            timeout=timeout,
        )

    def start(self) -> None:
        log = self.home / "daemon.log"
        with open(log, "ab") as f:
            self.daemon = subprocess.Popen(
                [
                    str(SYSTEM_PYTHON),
                    "-m",
                    "krex.cli",
                    "daemon",
                    "--sim",
                    "--socket",
                    str(self.sock),
                ],
                preexec_fn=_drop,
                stdout=f,
                stderr=f,
                cwd="/",
                env=self.env,
            )
        until(
            lambda: (
                self.krex("status", "--socket", str(self.sock)).returncode == 0
                or self.daemon is None
                or self.daemon.poll() is not None
            ),
            60,
            "the victim's daemon answering",
        )
        assert self.daemon.poll() is None, log.read_text()

    def log(self) -> str:
        return (self.home / "daemon.log").read_text(errors="replace")

    def region(self, name: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
        report = self.home / f"{name}.json"
        p = self.krex(
            "run",
            "--sim",
            "--socket",
            str(self.sock),
            "--report",
            str(report),
            "--",
            str(SYSTEM_PYTHON),
            "-c",
            HOLDER,
            "0.05",
        )
        return p, (json.loads(report.read_text()) if report.exists() else {})

    def stop(self) -> None:
        if self.daemon is not None and self.daemon.poll() is None:
            self.daemon.terminate()
            self.daemon.wait(timeout=60)
        for entry in os.listdir("/dev/shm"):
            if entry.startswith(self.gates.lstrip("/")):
                remove_shm("/" + entry)


@pytest.fixture
def victim() -> Iterator[Victim]:
    """The victim, at home in a directory under /tmp (pytest's tmp_path is root's alone)."""
    top = Path(tempfile.mkdtemp(prefix="krex-victim-", dir="/tmp"))
    top.chmod(0o755)
    v = Victim(top / "victim")
    try:
        yield v
    finally:
        v.stop()
        shutil.rmtree(top, ignore_errors=True)


def plant_shm(names: list[str]) -> None:
    """Another uid (root, here) makes these /dev/shm names first, mode 0666 (empty files):
    in the sticky /dev/shm the victim can neither remove nor take them."""
    old = os.umask(0)
    try:
        for n in names:
            os.close(
                os.open("/dev/shm/" + n.lstrip("/"), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o666)
            )
    finally:
        os.umask(old)


@as_root
def test_planted_slot_segment_names_are_skipped_never_an_internal_error(
    victim: Victim,
) -> None:
    """Item 3: another uid plants the next slot-segment names (0666) under a running daemon:
    every `krex run` of the victim used to exit 125 'internal error' (the PermissionError of
    unlinking another's file in sticky /dev/shm), and each try burned an id. Now the planted
    ids are skipped: the command runs, gated, on the next free one."""
    victim.start()
    p, first = victim.region("first")
    assert p.returncode == 0, p.stderr + victim.log()[-2000:]
    tid = int(first["tenant"])
    planted = [tid + k for k in (1, 2, 3, 7, 8)]
    plant_shm([f"{victim.gates}-t{n}" for n in planted])
    seen = []
    for i in range(4):
        p, rep = victim.region(f"run{i}")
        assert p.returncode == 0, p.stderr + victim.log()[-2000:]
        assert "internal error" not in p.stderr
        assert rep["regions"] and rep["regions"][0]["clean"] is True, rep
        seen.append(int(rep["tenant"]))
    assert not set(planted) & set(seen), seen
    assert seen == [tid + 4, tid + 5, tid + 6, tid + 9], seen
    assert "skipping tenant id" in victim.log()


@as_root
def test_a_planted_name_with_a_huge_id_does_not_push_the_ids_past_32_bits(
    victim: Victim,
) -> None:
    """A planted `-t4294967295` at the daemon's start used to raise its next id to 2^32: the
    shim takes a tenant id of 32 bits, and a command with a larger one would run ungated."""
    plant_shm([f"{victim.gates}-t4294967295"])
    victim.start()
    p, rep = victim.region("r")
    assert p.returncode == 0, p.stderr + victim.log()[-2000:]
    assert int(rep["tenant"]) < 1000 and rep["regions"][0]["clean"] is True, rep
