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
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from conftest import remove_shm
from helpers import HOLDER, KREX, Daemon, krex_run, until
from test_security import NOBODY, SYSTEM_PYTHON, as_root

import krex
from krex.core.paths import sim_library_dir
from krex.sim import simnode


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


# --- item 4: links planted beside a --socket in a shared directory ------------------------------


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory the other user (nobody) made and lets everyone write in (0777, no sticky
    bit): the victim (root, here: "any file") was told to put its socket there."""
    d = Path(tempfile.mkdtemp(prefix="krex-shared-", dir="/tmp"))
    os.chown(d, NOBODY, NOBODY)
    d.chmod(0o777)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def precious(tmp_path: Path) -> Path:
    """A file of the victim's that the planted links point to."""
    f = tmp_path / "precious.txt"
    f.write_text("the victim's own\n")
    return f


def plant_link(link: Path, target: Path) -> None:
    as_nobody(f"import os; os.symlink({str(target)!r}, {str(link)!r})")


def as_nobody(code: str) -> str:
    p = subprocess.run(
        [str(SYSTEM_PYTHON), "-c", code],
        preexec_fn=_drop,
        capture_output=True,
        text=True,
        cwd="/",
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    return p.stdout


@as_root
def test_a_pid_file_planted_as_a_link_is_refused_not_written_through(
    shared: Path, precious: Path
) -> None:
    """`<sock>.pid` -> the victim's file: the daemon opened it O_CREAT, following the link,
    truncated the file and wrote its pid in it. Now: one line, exit 2, the file untouched."""
    sock = shared / "k.sock"
    plant_link(Path(f"{sock}.pid"), precious)
    p = subprocess.run(
        [*KREX, "daemon", "--sim", "--socket", str(sock)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert precious.read_text() == "the victim's own\n"
    assert p.returncode == 2, p.stderr
    assert "k.sock.pid is a symlink: refusing to use it" in p.stderr
    assert "Traceback" not in p.stderr


@as_root
def test_a_daemon_log_and_lock_planted_as_links_are_refused_by_krex_run(
    shared: Path, precious: Path
) -> None:
    """The auto-started daemon's log beside the socket (`k.log`) -> the victim's file: krex
    run appended the daemon's output to it (open(log, 'ab')). Now exit 125, one line."""
    sock = shared / "k.sock"
    plant_link(shared / "k.log", precious)
    p = subprocess.run(
        [*KREX, "run", "--sim", "--socket", str(sock), "--", "true"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    try:
        assert precious.read_text() == "the victim's own\n"
        assert p.returncode == 125, p.stderr
        assert "k.log is a symlink: refusing to use it" in p.stderr, p.stderr
        assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1
        # The lock file the same way (it was opened O_CREAT through the link).
        other = shared / "l.sock"
        plant_link(Path(f"{other}.lock"), precious)
        p = subprocess.run(
            [*KREX, "run", "--sim", "--socket", str(other), "--", "true"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert p.returncode == 125 and "l.sock.lock is a symlink" in p.stderr, p.stderr
    finally:
        subprocess.run([*KREX, "daemon", "stop", "--socket", str(sock)], timeout=120)


def test_learned_peaks_are_never_written_through_a_planted_temporary_file(
    tmp_path: Path, precious: Path
) -> None:
    """`<sock>.peaks.tmp` -> the victim's file, planted while the daemon runs: write_text
    followed it. Now the temporary file is made anew (O_EXCL, O_NOFOLLOW), the link removed."""
    from test_memory import Node

    from krex.daemon.memory import GIB

    node = Node(tmp_path)
    tmp = tmp_path / "peaks.tmp"  # Memory's temporary file beside peaks.json
    tmp.symlink_to(precious)
    node.mem.learn(node.tenant(5, argv=["python", "big.py"]), 8 * GIB)
    assert precious.read_text() == "the victim's own\n"
    assert not tmp.exists() and not tmp.is_symlink()
    assert Node(tmp_path).mem.learned  # saved, and read again
    # A peaks file that is a link is not read (a root daemon would read any file).
    (tmp_path / "peaks.json").unlink()
    (tmp_path / "peaks.json").symlink_to(precious)
    assert Node(tmp_path).mem.learned == {}


@as_root
def test_krex_daemon_stop_signals_no_pid_from_a_file_someone_else_planted(
    shared: Path,
) -> None:
    """Another user plants `<sock>.pid` (theirs, locked, naming a process of the victim's):
    `krex daemon stop` sent SIGTERM to whatever pid it named. Now one line, exit 2."""
    sock = shared / "k.sock"
    innocent = subprocess.Popen(["sleep", "120"])
    holder = subprocess.Popen(
        [
            str(SYSTEM_PYTHON),
            "-c",
            textwrap.dedent(f"""
            import fcntl, os, time
            fd = os.open({f"{sock}.pid"!r}, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(fd, b"{innocent.pid}\\n")
            print("ready", flush=True)
            time.sleep(120)
        """),
        ],
        preexec_fn=_drop,
        stdout=subprocess.PIPE,
        text=True,
        cwd="/",
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        p = subprocess.run(
            [*KREX, "daemon", "stop", "--socket", str(sock), "--timeout", "5"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert p.returncode == 2, p.stderr
        assert f"belongs to uid {NOBODY}" in p.stderr and "refusing" in p.stderr
        assert innocent.poll() is None  # not signalled
    finally:
        holder.kill()
        holder.wait()
        innocent.kill()
        innocent.wait()


# --- item 7: a report target that would block; a simulated node someone else made --------------


@pytest.fixture(scope="module")
def sim_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = Daemon(tmp_path_factory.mktemp("report") / "krex.sock")
    d.start()
    try:
        yield d
    finally:
        d.stop()


def _reported_command(d: Daemon, report: Path, marker: Path) -> subprocess.Popen[str]:
    """krex run --report REPORT of a command that notes its end (its pid) in marker, exit 3."""
    code = f"import os; open({str(marker)!r}, 'w').write(str(os.getpid())); raise SystemExit(3)"
    return krex_run(d, sys.executable, "-c", code, report=report, stderr=subprocess.PIPE)


def _gone(pid: int) -> bool:
    """Whether pid has exited (a zombie, or reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def test_a_report_fifo_nobody_reads_is_given_up_with_one_line(
    sim_daemon: Daemon, tmp_path: Path
) -> None:
    """Item 7: `--report` to a FIFO with no reader hung krex run for ever (open() blocks).
    Now it waits a while for a reader, then one line; the command's exit status stays."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    p = _reported_command(sim_daemon, fifo, tmp_path / "done")
    try:
        _, err = p.communicate(timeout=120)
    finally:
        p.kill()  # when it hangs (it did)
    assert p.returncode == 3, err
    assert f"cannot write the report to {fifo}: nobody opened it for reading within" in err
    assert "Traceback" not in err


def test_sigterm_ends_krex_run_waiting_on_a_report_fifo(sim_daemon: Daemon, tmp_path: Path) -> None:
    """SIGTERM while krex run waits to write its report (signals are held then: the
    command's, sent after it ended) was ignored, and the open() never returned. Now it ends
    krex run at once, with one line."""
    fifo, marker = tmp_path / "fifo", tmp_path / "done"
    os.mkfifo(fifo)
    p = _reported_command(sim_daemon, fifo, marker)
    until(lambda: marker.exists() and marker.read_text(), 120, "the command's end")
    # Not while the command still exits (a SIGTERM then is the command's: 143, seen under
    # load). The first may still reach krex run while it reaps the command (then it is the
    # command's, and the command is gone): send until one ends the report's wait.
    until(lambda: _gone(int(marker.read_text())), 60, "the command's exit")
    deadline = time.monotonic() + 120
    try:
        while p.poll() is None and time.monotonic() < deadline:
            p.send_signal(signal.SIGTERM)
            time.sleep(0.5)
        _, err = p.communicate(timeout=60)
    finally:
        p.kill()  # when it hangs (it did)
    assert p.returncode == 3, err
    assert "nobody opened it for reading, and SIGTERM came" in err, err


def test_a_report_fifo_read_late_gets_the_whole_report(sim_daemon: Daemon, tmp_path: Path) -> None:
    fifo, marker = tmp_path / "fifo", tmp_path / "done"
    os.mkfifo(fifo)
    p = _reported_command(sim_daemon, fifo, marker)
    until(marker.exists, 120, "the command's end")
    time.sleep(0.5)  # krex run is waiting for a reader by now, or soon
    with open(fifo) as f:
        report = json.loads(f.read())
    _, err = p.communicate(timeout=60)
    assert p.returncode == 3 and report["exit_code"] == 3, err


def test_a_report_to_a_socket_is_refused_before_the_command_runs(tmp_path: Path) -> None:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "s"))
    try:
        p = subprocess.run(
            [*KREX, "run", "--sim", "--report", str(tmp_path / "s"), "--", "true"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        sock.close()
    assert p.returncode == 125 and "is a socket" in p.stderr, p.stderr


@as_root
def test_the_simulated_node_refuses_a_segment_another_uid_made(tmp_path: Path) -> None:
    """Another uid makes the simulated node's segment first (a valid one), 0666: our
    processes used to attach and share simulated GPUs with them. Now cuInit fails with one
    line naming the owner, as the daemon refuses a gates segment not its own."""
    name = f"/krex-hostile-sim-{os.getpid()}"
    src = Path(krex.__file__).resolve().parent.parent
    site = Path(click.__file__).resolve().parent.parent
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": f"{src}:{site}",
        "LD_LIBRARY_PATH": str(sim_library_dir()),
        "KREX_SIM_SHM": name,
    }
    use = "from krex.sim.simgpu import SimGPU; g = SimGPU(); g.launch(1000); g.sync(); print('ok')"
    try:
        maker = subprocess.run(
            [str(SYSTEM_PYTHON), "-c", use + f"; import os; os.chmod('/dev/shm{name}', 0o666)"],
            preexec_fn=_drop,
            capture_output=True,
            text=True,
            cwd="/",
            env=env,
            timeout=60,
        )
        assert maker.returncode == 0 and "ok" in maker.stdout, maker.stderr
        mine = subprocess.run(
            [sys.executable, "-c", use],
            capture_output=True,
            text=True,
            env={**os.environ, **env, "PYTHONPATH": os.environ.get("PYTHONPATH", "")},
            timeout=60,
        )
        assert mine.returncode != 0 and "ok" not in mine.stdout
        assert f"shared segment {name} is not this user's alone (uid {NOBODY}" in mine.stderr
        # The controller's view of it (the daemon's) is "unknown", never its pids.
        assert simnode.lock_holders(name) == set()
        assert simnode.busy(name, 0, None) is None
        assert simnode.remove(name) is False  # not ours to remove
    finally:
        remove_shm(name)


def test_the_daemon_socket_is_made_private_without_a_chmod_by_name(
    sim_daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon's socket is 0600 from its bind (a umask), so nothing chmods it by name
    afterwards (that would follow a link swapped in for it); bind_private leaves the
    process's umask as it was."""
    from krex.core.trust import bind_private

    assert sim_daemon.socket.stat().st_mode & 0o777 == 0o600
    path = sim_daemon.socket.parent / "private.sock"
    chmods: list[object] = []
    monkeypatch.setattr(os, "chmod", lambda *a, **k: chmods.append(a))
    before = os.umask(0o022)
    try:
        sock = bind_private(path)
        sock.close()
        assert path.stat().st_mode & 0o777 == 0o600
        assert os.umask(0o022) == 0o022
    finally:
        os.umask(before)
        path.unlink(missing_ok=True)
    assert chmods == []
