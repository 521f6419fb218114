"""Hostile input and faults on the daemon's socket (issue #50): nothing wedges, nothing leaks.

A command's arguments that are not UTF-8 run as they would natively; a request that cannot be
looked at is one error, never a dead background task; the daemon's long-lived tasks are
supervised."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import HOLDER, Daemon, krex_run, running, until

from krex.client.run import ClientError, Connection
from krex.core import wire
from krex.daemon import daemon as daemon_mod
from krex.daemon import tasks
from krex.daemon.daemon import LogLimit

# The arguments' bytes as the command got them, hex, one a line.
SHOW_ARGV = "import os, sys; print(*(os.fsencode(a).hex() for a in sys.argv[1:]), sep='\\n')"
ODD_ARGS = [b"caf\xe9", b"\xff\xfe\x80", "café".encode(), b"plain", b""]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One slot, so that a second command queues."""
    with running(Daemon(tmp_path_factory.mktemp("hostile") / "krex.sock", "--slots", "1")) as d:
        yield d


class Raw:
    """A connection of our own to the daemon, that sent `lines`."""

    def __init__(self, d: Daemon, *lines: bytes, timeout_s: float = 30.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout_s)
        self.sock.connect(str(d.socket))
        self.file = self.sock.makefile("rb")
        self.broken = False  # the daemon closed before taking all we sent (its reply is there)
        try:
            for line in lines:
                self.sock.sendall(line)
        except BrokenPipeError:
            self.broken = True

    def reply(self) -> dict[str, Any]:
        line = self.file.readline()
        assert line, "the daemon closed the connection without a reply"
        return dict(json.loads(line))

    def close(self) -> None:
        self.file.close()  # the socket's descriptor stays open while its file is
        self.sock.close()

    def __enter__(self) -> Raw:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def native(*args: bytes) -> bytes:
    return subprocess.run(
        [sys.executable, "-c", SHOW_ARGV, *args], capture_output=True, check=True, timeout=60
    ).stdout


def assert_free(d: Daemon) -> None:
    """Nobody holds or waits for the slot, and nothing was a bug."""
    until(lambda: (g := d.status()["gpus"][0])["used"] == 0 and g["queue"] == 0,  # type: ignore[index]
          what="the slot free and the queue empty")  # fmt: skip
    assert "internal error" not in d.log.read_text(), d.log.read_text()[-3000:]
    assert "Traceback" not in d.log.read_text(), d.log.read_text()[-3000:]


def test_arguments_that_are_not_utf8_reach_the_command_as_they_are(
    daemon: Daemon, tmp_path: Path
) -> None:
    """Cold, and queued behind a command that holds the only slot: the command gets the same
    bytes as when run natively; the report names them as Python's fsdecode does."""
    want = native(*ODD_ARGS)
    assert want.decode().split("\n")[:-1] == [a.hex() for a in ODD_ARGS]
    args = [os.fsdecode(a) for a in ODD_ARGS]
    report = tmp_path / "r.json"
    p = krex_run(daemon, sys.executable, "-c", SHOW_ARGV, *args, report=report,
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    assert out.encode() == want
    assert json.loads(report.read_text())["argv"][3:] == args
    holder = krex_run(daemon, sys.executable, "-c", HOLDER, "3", stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline().startswith("in region")
        p = krex_run(daemon, sys.executable, "-c", SHOW_ARGV, *args,
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
        until(lambda: daemon.status()["gpus"][0]["queue"] == 1, what="the command queued")  # type: ignore[index]
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        assert out.encode() == want
    finally:
        holder.wait(timeout=60)
    assert_free(daemon)


def test_a_warm_command_gets_the_same_bytes(pool: Daemon, tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    p = krex_run(pool, sys.executable, "-c", SHOW_ARGV, *map(os.fsdecode, ODD_ARGS),
                 report=report, stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    assert json.loads(report.read_text())["pool"] == "warm"
    assert out.encode() == native(*ODD_ARGS)


ADMIT = {"op": "admit", "sim": True}  # an older client's: no mem_key, the daemon hashes argv


def test_an_older_clients_admit_with_such_arguments_is_admitted_and_queued(
    daemon: Daemon,
) -> None:
    """Without the client's key the daemon hashes the argv itself (it raised on a lone
    surrogate: 'internal error'); queued behind a held slot it is admitted once the slot is
    free, and the next command after it too (the admission goes on)."""
    argv = ["prog", os.fsdecode(b"caf\xe9")]
    with Raw(daemon, wire.encode({**ADMIT, "argv": argv})) as first:
        assert first.reply()["ok"] is True  # the only slot
        with (
            Raw(daemon, wire.encode({**ADMIT, "argv": [*argv, "2"]})) as second,
            Raw(daemon, wire.encode({**ADMIT, "argv": ["prog", "3"]})) as third,
        ):
            assert second.reply() == {
                "ok": True, "queued": 1, "gpu": 0, "why": "all 1 slots taken"
            }  # fmt: skip
            assert third.reply() == {
                "ok": True, "queued": 2, "gpu": 0, "why": "1 command(s) queued before it"
            }  # fmt: skip
            first.close()
            for conn in (second, third):
                granted = conn.reply()
                assert granted["ok"] is True and "tenant" in granted, granted
                conn.close()
    assert_free(daemon)


@pytest.mark.parametrize(
    ("arg", "why"),
    [("\ud800", "argv[1] has a surrogate that stands for no byte"),
     ("a\0b", "argv[1] contains a NUL byte")],
)  # fmt: skip
def test_an_argument_no_command_can_get_is_one_clear_error(
    daemon: Daemon, arg: str, why: str
) -> None:
    with Raw(daemon, wire.encode({**ADMIT, "argv": ["prog", arg]})) as conn:
        r = conn.reply()
    assert r["ok"] is False and r["error"].startswith(why), r
    assert_free(daemon)


def test_a_background_task_that_dies_is_started_again_and_logged(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tasks, "RESTART_DELAY_S", 0.0)
    runs: list[int] = []
    fatal: list[str] = []

    async def flaky() -> None:
        runs.append(1)
        if len(runs) < 3:
            raise RuntimeError(f"boom {len(runs)}")
        await asyncio.sleep(3600)

    async def main() -> None:
        sup = tasks.Supervisor(fatal.append)
        sup.keep("test loop", flaky)
        while len(runs) < 3:
            await asyncio.sleep(0.01)
        sup.cancel()
        await asyncio.sleep(0)

    with caplog.at_level(logging.ERROR, logger="krex.daemon"):
        asyncio.run(main())
    assert len(runs) == 3 and fatal == []
    died = [r for r in caplog.records if "test loop died; starting it again" in r.getMessage()]
    assert len(died) == 2 and all(r.exc_info for r in died)


def test_a_background_task_that_keeps_dying_ends_the_daemon_loudly(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tasks, "RESTART_DELAY_S", 0.0)
    fatal: list[str] = []

    async def broken() -> None:
        raise ValueError("always")

    async def main() -> None:
        tasks.Supervisor(fatal.append).keep("memory arbiter", broken)
        while not fatal:
            await asyncio.sleep(0.01)

    with caplog.at_level(logging.ERROR, logger="krex.daemon"):
        asyncio.run(main())
    assert fatal == ["its memory arbiter kept dying: ValueError: always"]
    assert any(r.levelno == logging.CRITICAL and "the daemon stops" in r.getMessage()
               for r in caplog.records)  # fmt: skip


def test_a_short_task_that_fails_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    async def fails() -> None:
        raise KeyError("lost")

    async def main() -> None:
        task = tasks.spawn(fails(), "region set-up")
        await asyncio.wait({task})
        await asyncio.sleep(0)

    with caplog.at_level(logging.ERROR, logger="krex.daemon"):
        asyncio.run(main())
    assert any("'region set-up' failed" in r.getMessage() and r.exc_info for r in caplog.records)


# Connections: a cap, a first-request time-out, rate-limited log lines (krex/daemon/daemon.py).
def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_kib(pid: int) -> int:
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines()
                if x.startswith("VmRSS:"))  # fmt: skip
    return int(line.split()[1])


def connect(d: Daemon) -> socket.socket:
    """A connection to d that sends nothing (tried again while d's backlog is full)."""
    deadline = time.monotonic() + 60
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(60)
        try:
            s.connect(str(d.socket))
            return s
        except BlockingIOError:
            s.close()
            assert time.monotonic() < deadline, "the daemon took no connection for 60 s"
            time.sleep(0.01)


@pytest.fixture
def many_descriptors() -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_flood_of_idle_connections_leaves_room_for_commands_and_nothing_behind(
    tmp_path: Path, many_descriptors: None
) -> None:
    """1,000 connections that never send a request: the daemon keeps at most MAX_WAITING of
    them (the longest-waiting told why and closed), a command runs meanwhile, the log says it
    in a few lines, and once they are gone the daemon's descriptors and memory are back."""
    d = Daemon(tmp_path / "krex.sock")
    d.start()
    assert d.proc is not None
    try:
        until(lambda: d.status(), what="the daemon serving")
        fds0, rss0 = fds(d.proc.pid), rss_kib(d.proc.pid)
        idle = []
        try:
            for _ in range(1000):
                idle.append(connect(d))
            # Taken from the backlog in bursts, then closed down to MAX_WAITING.
            bound = fds0 + daemon_mod.MAX_WAITING + 16
            until(lambda: fds(d.proc.pid) <= bound, what=f"at most {bound} descriptors")  # type: ignore[union-attr]
            p = krex_run(d, "true", stderr=subprocess.PIPE)
            assert p.wait(timeout=120) == 0, p.communicate()[1]
            closed = json.loads(idle[0].makefile("rb").readline())
            assert closed["ok"] is False and closed["error"].startswith("closed: no request yet")
        finally:
            for s in idle:
                s.close()
        until(lambda: fds(d.proc.pid) <= fds0 + 2, what="the descriptors back")  # type: ignore[union-attr]
        assert rss_kib(d.proc.pid) < rss0 + 30 * 1024, (rss0, rss_kib(d.proc.pid))
        assert d.status() is not None
    finally:
        d.stop()
    log = d.log.read_text()
    assert "Traceback" not in log and "out of system resource" not in log, log[-3000:]
    said = [x for x in log.splitlines() if "closed a connection" in x]
    assert 1 <= len(said) <= LogLimit.BURST, said


def test_a_connection_that_sends_nothing_is_closed_with_one_line(daemon: Daemon) -> None:
    with Raw(daemon, timeout_s=daemon_mod.FIRST_REQUEST_S + 60) as idle:
        r = idle.reply()
        assert r == {"ok": False, "error": f"no request within {daemon_mod.FIRST_REQUEST_S:g} s"}
        assert idle.file.readline() == b""  # then closed
    assert_free(daemon)


class Limited(Daemon):
    """A daemon started with `nofile` descriptors at most (soft and hard)."""

    nofile = daemon_mod.FD_RESERVE + 40

    def command(self) -> list[str]:
        return ["prlimit", f"--nofile={self.nofile}:{self.nofile}", *super().command()]


def test_past_the_connection_cap_a_client_is_refused_with_one_line(tmp_path: Path) -> None:
    """Under a low descriptor limit the cap is what the limit leaves: one more connection than
    that gets one error line (and asyncio never runs out of descriptors at accept); once they
    are gone the daemon serves again."""
    d = Limited(tmp_path / "krex.sock", "--slots", "1")
    d.start()
    cap = Limited.nofile - daemon_mod.FD_RESERVE
    held: list[Raw] = []
    try:
        # Each asks for the only slot: one is admitted, the others queue, all hold on.
        for i in range(cap + 10):
            conn = Raw(d, wire.encode({**ADMIT, "argv": ["prog", str(i)]}))
            got = conn.reply()
            if not got["ok"]:
                conn.close()
                break
            held.append(conn)
        else:
            raise AssertionError(f"{cap + 10} connections held, none refused")
        assert "connections open, its most" in got["error"], got
        assert not conn.broken, "the refusal closed before the request was taken in"
        assert cap - 8 <= len(held) <= cap  # a pool worker would hold one
        # krex's own client past the cap: the daemon's reason, not a broken pipe.
        with pytest.raises(ClientError, match="connections open, its most"):
            refused = Connection(d.socket)
            try:
                refused.send({**ADMIT, "argv": ["prog", "late"]})
                refused.recv()
            finally:
                refused.close()
    finally:
        for conn in held:
            conn.close()
    try:
        until(lambda: (st := d.status(check=False)) and st["gpus"][0]["used"] == 0,
              what="the daemon serving again, its slot free")  # fmt: skip
    finally:
        d.stop()
    log = d.log.read_text()
    assert "Traceback" not in log and "out of system resource" not in log, log[-3000:]


def test_a_refusal_that_closed_mid_send_still_reaches_the_client(tmp_path: Path) -> None:
    """A listener that answers one error line and closes without reading (a daemon past its
    cap whose client was slow): the client's send fails (EPIPE), and krex's client reports the
    line, not the broken pipe."""
    path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as srv:
        srv.bind(str(path))
        srv.listen()
        conn = Connection(path)
        try:
            peer, _ = srv.accept()
            peer.sendall(wire.encode_reply({"ok": False, "error": "refused for a reason"}))
            peer.close()
            with pytest.raises(ClientError, match="refused for a reason"):
                conn.send({**ADMIT, "argv": ["x" * 4_000_000]})  # more than the socket takes
        finally:
            conn.close()


# Long argv, JSON the parser cannot take, a fork server's socket flooded.
SHOW_HASH = (
    "import hashlib, os, sys; "
    "print(hashlib.sha256(b'\\0'.join(map(os.fsencode, sys.argv[1:]))).hexdigest())"
)


def test_an_argv_as_long_as_the_os_allows_runs(daemon: Daemon) -> None:
    """1.2 MB of arguments (over the 64 KiB of a request line; natively up to ARG_MAX), one
    of them not UTF-8: the command gets them all, byte for byte."""
    args = [bytes([97 + i]) * 100_000 for i in range(12)] + [b"caf\xe9"]
    want = hashlib.sha256(b"\0".join(args)).hexdigest()
    p = krex_run(daemon, sys.executable, "-c", SHOW_HASH, *map(os.fsdecode, args),
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err[-2000:]
    assert out.strip() == want
    assert_free(daemon)


@pytest.mark.parametrize(
    ("value", "why"),
    [(b"[" * 30_000 + b"]" * 30_000, "message nests arrays or objects too deeply"),
     (b'{"a":' * 10_000 + b"1" + b"}" * 10_000, "message nests arrays or objects too deeply"),
     (b"9" * 5_000, "message has an integer beyond 64 bits"),
     (b"-" + b"9" * 19, "message has an integer beyond 64 bits")],
)  # fmt: skip
def test_json_the_parser_cannot_take_is_one_protocol_error(
    daemon: Daemon, value: bytes, why: str
) -> None:
    with Raw(daemon, b'{"v":1,"op":"hello","x":' + value + b"}\n") as conn:
        assert conn.reply() == {"ok": False, "error": why}
    assert_free(daemon)


def test_a_request_other_than_admit_is_still_one_line_of_64_kib(daemon: Daemon) -> None:
    big = wire.encode({"op": "status", "x": "a" * wire.MAX_LINE})
    with Raw(daemon, big) as conn:
        assert conn.reply() == {"ok": False, "error": f"request longer than {wire.MAX_LINE} bytes"}
    assert_free(daemon)


def test_a_flooded_fork_server_runs_the_next_command_warm_and_quietly(
    pool: Daemon, tmp_path: Path
) -> None:
    """Connections to a warm worker's socket from a process with no job (idle, or sending
    junk) are closed unread: the next warm command runs warm, nothing is written on its
    stderr, and the worker says so in a line or two, not one per connection."""
    listen = next(pool.socket.parent.glob(pool.socket.name + ".w*"))
    junk = []
    for i in range(200):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.connect(str(listen))
            if i % 2:
                s.send(b"\x00\x00\x00\x10not a frame at all")
        except (BlockingIOError, BrokenPipeError, ConnectionResetError):
            pass
        junk.append(s)
    try:
        report = tmp_path / "r.json"
        p = krex_run(pool, sys.executable, "-c", "print('warm')", report=report,
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
        out, err = p.communicate(timeout=120)
    finally:
        for s in junk:
            s.close()
    assert (p.returncode, out, err) == (0, "warm\n", "")
    assert json.loads(report.read_text())["pool"] == "warm"
    refused = [x for x in pool.log.read_text().splitlines() if "refused a client" in x]
    assert 1 <= len(refused) <= 3, refused
