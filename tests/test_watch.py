"""krex run's watch over its daemon connection (krex/client/watch.py): stopped, it ends at once,
so the command's end reaches the daemon (which frees its slot) without waiting out a poll; the
connection's end is still noticed, and a reply is left to the client."""

from __future__ import annotations

import socket
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
