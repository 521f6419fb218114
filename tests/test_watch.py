"""krex run's watch over its daemon connection (krex/client/watch.py): stopped, it ends at once,
so the command's end reaches the daemon (which frees its slot) without waiting out a poll; the
connection's end is still noticed, and a reply is left to the client."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from krex.client import watch


@dataclass
class Watched:
    ours: socket.socket  # krex run's end of the connection
    daemon: socket.socket  # the daemon's
    w: watch.DaemonWatch
    gone: list[int] = field(default_factory=list)  # one entry per death the watch noticed


@pytest.fixture
def watched(tmp_path: Path) -> Iterator[Watched]:
    ours, daemon = socket.socketpair()
    w = watch.DaemonWatch(ours, tmp_path / "krex.sock", "krex-test")
    x = Watched(ours, daemon, w)
    w._daemon_gone = lambda: x.gone.append(1)  # type: ignore[method-assign]
    w.start()
    try:
        yield x
    finally:
        w.stop()
        ours.close()
        daemon.close()


def test_stop_wakes_the_watch_thread_out_of_its_poll(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(watch, "_POLL_S", 30.0)  # a poll no stop should wait out
    ours, daemon = socket.socketpair()
    try:
        w = watch.DaemonWatch(ours, tmp_path / "krex.sock", "krex-test").start()
        time.sleep(0.2)  # the thread is in its poll by now (or soon: stop wakes it either way)
        t0 = time.monotonic()
        w.stop()
        took = time.monotonic() - t0
        assert not w._thread.is_alive() and w.thawed is None
        assert took < 10, took  # far above any scheduling delay, far below the poll (before: 30 s)
        w.stop()  # twice: harmless (the pipe is closed, not written)
    finally:
        ours.close()
        daemon.close()


def test_the_daemon_s_end_is_still_noticed(watched: Watched) -> None:
    watched.daemon.close()
    watched.w._thread.join(timeout=30)
    assert watched.gone == [1] and not watched.w._thread.is_alive()


def test_a_reply_is_left_to_the_client(watched: Watched) -> None:
    """Data from the daemon (a reply the client reads itself) is neither taken nor a death."""
    watched.daemon.sendall(b"reply")
    time.sleep(0.5)
    assert watched.w._thread.is_alive() and watched.gone == []
    assert watched.ours.recv(16) == b"reply"
    watched.w.stop()
    assert not watched.w._thread.is_alive()


def _answering_at(path: Path, pid: int) -> threading.Thread:
    """A daemon at path that answers one hello with `pid`, in a thread."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)

    def serve() -> None:
        with listener:
            conn, _ = listener.accept()
            with conn:
                conn.makefile("rb").readline()
                conn.sendall(json.dumps({"ok": True, "pid": pid}).encode() + b"\n")

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("other", [True, False])
def test_a_daemon_that_answers_after_ours_is_named_if_it_is_another(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], other: bool
) -> None:
    """Our connection ends and a daemon answers at the socket: where it is another process (a
    successor), krex run says the command goes on unprotected, its regions refused by it; where
    it is ours (it ended our connection and lives on), nothing is said. Either way nothing is
    thawed or opened by the client (the successor does that as it starts). Before, nothing was
    said, and the command's next region failed with "tenant N is not admitted here" alone."""
    ours, daemon = socket.socketpair()  # the daemon's end is this process: its pid is ours
    path = tmp_path / "krex.sock"
    server = _answering_at(path, os.getpid() + 1 if other else os.getpid())
    w = watch.DaemonWatch(ours, path, "krex-test").start()
    try:
        daemon.close()
        w._thread.join(timeout=30)
        server.join(timeout=30)
        assert not w._thread.is_alive() and not server.is_alive()
    finally:
        w.stop()
        ours.close()
    err = capfd.readouterr().err
    said = f"another (pid {os.getpid() + 1}) answers there and refuses this command's regions"
    assert (said in err) == other, err
    assert w.thawed is None and w.reopened == 0
