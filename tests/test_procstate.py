"""What a cold command inherits from `krex run` besides argv, environment, cwd and stdio, and
how a warm child takes it on (krex/pool/plan.py, ProcState; issue #48)."""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import subprocess
import sys
import textwrap

import pytest

from krex.pool.plan import ProcState

# Captures its state, applies another (a JSON ProcState on argv[1]) and prints what it has.
CHILD = textwrap.dedent("""
    import json, os, resource, sys
    from krex.pool.plan import ProcState
    want = ProcState(**json.loads(sys.argv[1]))
    print(json.dumps({"unfit": want.unfit()}), flush=True)
    if want.unfit() is None:
        want.apply()
    now = ProcState.capture()
    print(json.dumps({"umask": now.umask, "nice": now.nice, "rlimits": now.rlimits}), flush=True)
""")


def run_child(state: ProcState) -> list[dict[str, object]]:
    p = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(dataclasses.asdict(state))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    return [json.loads(line) for line in p.stdout.splitlines()]


def test_capture_reads_this_process() -> None:
    s = ProcState.capture()
    assert s.uid == os.getuid() and s.nice == os.getpriority(os.PRIO_PROCESS, 0)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert s.rlimits["RLIMIT_NOFILE"] == [soft, hard]
    assert all(fd > 2 for fd in s.fds)
    assert s.unfit() is None  # a child of this process can take this process's state on


def test_a_child_takes_on_a_lower_limit_umask_and_nice() -> None:
    """What a harness sets before running a command (`ulimit -n 512`, `umask 077`, `nice 5`)
    is what the warm child runs with."""
    s = ProcState.capture()
    s.umask, s.nice = 0o077, s.nice + 5
    soft, hard = s.rlimits["RLIMIT_NOFILE"]
    s.rlimits["RLIMIT_NOFILE"] = [min(soft, 512), min(hard, 512)]
    s.rlimits["RLIMIT_CPU"] = [3, 3]
    verdict, now = run_child(s)
    assert verdict == {"unfit": None}
    assert now["umask"] == 0o077 and now["nice"] == s.nice
    limits = now["rlimits"]
    assert isinstance(limits, dict)
    assert limits["RLIMIT_NOFILE"] == s.rlimits["RLIMIT_NOFILE"] and limits["RLIMIT_CPU"] == [3, 3]


def test_what_a_child_cannot_take_on_without_privilege_is_unfit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Unprivileged (as a user's worker is): a hard limit above the worker's, a lower nice,
    other groups, a real-time policy are refused (the command then runs cold, where it
    inherits them from krex run itself); the same state as the worker's is fit."""
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    me = ProcState.capture()
    assert me.unfit() is None
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY:
        above = dataclasses.replace(me, rlimits={**me.rlimits, "RLIMIT_NOFILE": [hard, hard + 1]})
        assert "RLIMIT_NOFILE" in str(above.unfit())
    assert "nice" in str(dataclasses.replace(me, nice=me.nice - 1).unfit())
    assert "groups" in str(dataclasses.replace(me, groups=[*me.groups, 99999]).unfit())
    assert "real-time" in str(dataclasses.replace(me, sched=os.SCHED_FIFO).unfit())
    assert "descriptors" in str(dataclasses.replace(me, fds=list(range(3, 80))).unfit())
