"""krex run's watch over its daemon connection (krex/client/watch.py): stopped, it ends at once,
so the command's end reaches the daemon (which frees its slot) without waiting out a poll."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from krex.client import watch


def test_stop_wakes_the_watch_thread_out_of_its_poll(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(watch, "_POLL_S", 30.0)  # a poll no stop should wait out
    ours, daemon = socket.socketpair()
    try:
        w = watch.DaemonWatch(ours, tmp_path / "krex.sock", "krex-test").start()
        time.sleep(0.2)  # the thread is in its select by now (or soon: stop wakes it either way)
        t0 = time.monotonic()
        w.stop()
        took = time.monotonic() - t0
        assert not w._thread.is_alive() and w.thawed is None
        # Far above any scheduling delay, far below the poll (before: 30 s).
        assert took < 10, took
        w.stop()  # twice: harmless (the pipe is closed, not written)
    finally:
        ours.close()
        daemon.close()


def test_the_daemon_s_end_is_still_noticed(tmp_path: Path) -> None:
    """The wake-up pipe does not hide the connection: its EOF still reaches the watch."""
    ours, daemon = socket.socketpair()
    try:
        w = watch.DaemonWatch(ours, tmp_path / "gone.sock", "krex-test-none").start()
        called = []
        w._daemon_gone = lambda: called.append(1)  # type: ignore[method-assign]
        daemon.close()
        w._thread.join(timeout=30)
        assert called == [1] and not w._thread.is_alive()
    finally:
        ours.close()


def test_a_reply_is_left_to_the_client(tmp_path: Path) -> None:
    """Data from the daemon (a reply the client reads itself) is neither taken nor a death."""
    ours, daemon = socket.socketpair()
    try:
        w = watch.DaemonWatch(ours, tmp_path / "krex.sock", "krex-test").start()
        called = []
        w._daemon_gone = lambda: called.append(1)  # type: ignore[method-assign]
        daemon.sendall(b"reply")
        time.sleep(0.5)
        assert w._thread.is_alive() and called == []
        assert ours.recv(16) == b"reply"
        w.stop()
        assert not w._thread.is_alive()
    finally:
        ours.close()
        daemon.close()
