"""krex/core/procs.py: process look-ups by pid (the daemon's and the tenant groups')."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

from krex.core import procs


def test_running_is_false_for_zombies_gone_and_impossible_pids() -> None:
    assert procs.running(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    # Not reaped yet: a zombie, which has no GPU context any more.
    while procs.running(child.pid):
        assert time.monotonic() < deadline, "the child never exited"
        time.sleep(0.01)
    assert child.pid in procs.children()  # still our child until reaped
    child.wait()
    assert not procs.running(child.pid)
    assert child.pid not in procs.children()
    assert not procs.running(0) and not procs.running(-1)


def test_parent_and_ancestors() -> None:
    assert procs.parent(os.getpid()) == os.getppid()
    assert procs.parent(0) is None and procs.parent(-5) is None
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert procs.parent(child.pid) is None
    mine = procs.self_and_ancestors()
    assert {os.getpid(), os.getppid()} <= mine


def test_tgid_of_a_thread_is_its_process() -> None:
    started, done = threading.Event(), threading.Event()
    tid: list[int] = []

    def body() -> None:
        tid.append(threading.get_native_id())
        started.set()
        done.wait(10)

    t = threading.Thread(target=body)
    t.start()
    try:
        assert started.wait(10)
        assert tid[0] != os.getpid()
        assert procs.tgid(tid[0]) == os.getpid()
        assert procs.tgid(os.getpid()) == os.getpid()
    finally:
        done.set()
        t.join()
    assert procs.tgid(0) is None
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert procs.tgid(child.pid) is None
