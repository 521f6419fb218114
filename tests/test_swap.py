"""The swap keeper (krex/daemon/swapkeeper.py) against a fake driver: a command is taken off
the GPU whole or not at all, put back whole or not at all, and never left locked."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest

from krex.daemon import swapkeeper as sk


class FakeDriver:
    """cuCheckpointProcess* for some pids: `busy` pids cannot be locked (inside a driver call),
    `room` is how many restores the GPU has room for (None: any)."""

    def __init__(self, pids: list[int], busy: set[int] | None = None, room: int | None = None):
        self.state = dict.fromkeys(pids, sk.RUNNING)
        self.busy = busy or set()
        self.room = room
        self.calls: list[tuple[str, int]] = []

    def __call__(self, op: str, pid: int, timeout_ms: int) -> tuple[int, int]:
        self.calls.append((op, pid))
        st = self.state.get(pid)
        if st is None:
            return sk.INVALID_VALUE, -1
        rc = sk.SUCCESS
        if op == "lock":
            if pid in self.busy:
                rc = 600  # CUDA_ERROR_NOT_READY: the timeout passed, left running
            elif st == sk.RUNNING:
                self.state[pid] = sk.LOCKED
            else:
                rc = 401
        elif op == "checkpoint":
            if st != sk.LOCKED:
                rc = 401
            else:
                self.state[pid] = sk.CHECKPOINTED
                if self.room is not None:
                    self.room += 1
        elif op == "restore":
            if st != sk.CHECKPOINTED:
                rc = 401
            elif self.room is not None and self.room <= 0:
                rc = sk.OUT_OF_MEMORY
            else:
                self.state[pid] = sk.LOCKED
                if self.room is not None:
                    self.room -= 1
        elif op == "unlock":
            if st != sk.LOCKED:
                rc = 401
            else:
                self.state[pid] = sk.RUNNING
        return rc, self.state[pid]


LIVE: set[int] = set()
KILLED: list[int] = []


@pytest.fixture
def pids(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Two pids of no process (the keeper's liveness check and kill are faked: a keeper under
    test must never signal a real process)."""
    LIVE.clear()
    LIVE.update({900001, 900002})
    KILLED.clear()
    monkeypatch.setattr(sk, "_alive", lambda pid: pid in LIVE)
    monkeypatch.setattr(sk, "_kill", KILLED.append)
    return sorted(LIVE)


def test_a_command_is_taken_off_whole(pids: list[int]) -> None:
    drv = FakeDriver(pids)
    assert sk.take_off(drv, pids, 500) == (sk.SUCCESS, "")
    assert set(drv.state.values()) == {sk.CHECKPOINTED}
    # Every process locked before any is checkpointed: none runs on while another is copied.
    ops = [op for op, _ in drv.calls if op in ("lock", "checkpoint")]
    assert ops == ["lock", "lock", "checkpoint", "checkpoint"]


def test_a_process_that_cannot_be_locked_leaves_the_command_running(pids: list[int]) -> None:
    drv = FakeDriver(pids, busy={pids[1]})
    rc, why = sk.take_off(drv, pids, 500)
    assert rc == 600 and f"process {pids[1]} could not be locked" in why
    assert set(drv.state.values()) == {sk.RUNNING}  # the first unlocked again
    assert not any(op == "checkpoint" for op, _ in drv.calls)


def test_a_command_goes_back_whole_or_stays_off(pids: list[int]) -> None:
    drv = FakeDriver(pids, room=0)
    assert sk.take_off(drv, pids, 500)[0] == sk.SUCCESS  # room: 2 after the two are off
    drv.room = 1  # room for one of two
    assert sk.put_back(drv, pids) == sk.OUT_OF_MEMORY
    assert set(drv.state.values()) == {sk.CHECKPOINTED}  # the first taken off again
    drv.room = 2
    assert sk.put_back(drv, pids) == sk.SUCCESS
    assert set(drv.state.values()) == {sk.RUNNING}


def test_a_dead_process_counts_as_put_back(pids: list[int]) -> None:
    drv = FakeDriver(pids)
    assert sk.take_off(drv, pids, 500)[0] == sk.SUCCESS
    LIVE.discard(pids[1])  # killed meanwhile
    assert sk.put_back(drv, pids) == sk.SUCCESS
    assert drv.state[pids[0]] == sk.RUNNING and KILLED == []


def test_the_real_liveness_check_knows_a_reaped_process() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert sk._alive(os.getpid()) and not sk._alive(gone.pid)


def run_main(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    drv: FakeDriver,
    pids: list[int],
    stdin: str,
) -> tuple[int, list[dict[str, object]]]:
    monkeypatch.setattr(sk, "driver_ops", lambda: drv)
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    rc = sk.main([*map(str, pids), "--orphan-s", "0"])
    return rc, [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_the_keeper_says_out_then_in_when_asked(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], pids: list[int]
) -> None:
    drv = FakeDriver(pids, room=0)
    rc, events = run_main(monkeypatch, capsys, drv, pids, "restore\n")
    assert rc == 0 and [e["event"] for e in events] == ["out", "in"]
    assert set(drv.state.values()) == {sk.RUNNING}


def test_the_keeper_says_short_when_the_gpu_has_no_room_and_tries_again(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], pids: list[int]
) -> None:
    drv = FakeDriver(pids, room=0)
    real = drv.__call__

    def tight(op: str, pid: int, timeout_ms: int) -> tuple[int, int]:
        if op == "restore" and sum(1 for o, _ in drv.calls if o == "restore") < 1:
            drv.calls.append((op, pid))
            return sk.OUT_OF_MEMORY, drv.state[pid]  # the first restore finds no room
        return real(op, pid, timeout_ms)

    monkeypatch.setattr(sk, "driver_ops", lambda: tight)
    monkeypatch.setattr(sys, "stdin", io.StringIO("restore\nrestore\n"))
    rc = sk.main([*map(str, pids), "--orphan-s", "0"])
    events = [json.loads(line)["event"] for line in capsys.readouterr().out.splitlines()]
    assert rc == 0 and events == ["out", "short", "in"]
    assert set(drv.state.values()) == {sk.RUNNING}


def test_the_keeper_refuses_and_touches_nothing_where_a_process_is_busy(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], pids: list[int]
) -> None:
    drv = FakeDriver(pids, busy={pids[0]})
    rc, events = run_main(monkeypatch, capsys, drv, pids, "")
    assert rc == 3 and events[0]["event"] == "refused" and events[0]["rc"] == 600
    assert set(drv.state.values()) == {sk.RUNNING}


def test_an_orphaned_keeper_puts_the_command_back_when_the_daemon_is_gone(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], pids: list[int]
) -> None:
    """stdin closed (the daemon died): the command goes back as soon as it fits, never left
    locked."""
    drv = FakeDriver(pids)
    monkeypatch.setattr(sk, "driver_ops", lambda: drv)
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    assert sk.main([*map(str, pids), "--orphan-s", "5"]) == 0
    assert set(drv.state.values()) == {sk.RUNNING} and KILLED == []


def test_an_orphaned_keeper_kills_a_command_that_never_fits(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], pids: list[int]
) -> None:
    """Locked, it could never go on: after --orphan-s it is killed, not left hanging."""
    drv = FakeDriver(pids, room=-100)  # never room enough
    monkeypatch.setattr(sk, "driver_ops", lambda: drv)
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    monkeypatch.setattr(sk, "_nap", lambda: None)
    assert sk.main([*map(str, pids), "--orphan-s", "0.05"]) == 1
    assert pids == KILLED


def test_no_driver_is_a_refusal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], pids: list[int]
) -> None:
    def none() -> sk.Op:
        raise OSError("libcuda.so.1: cannot open shared object file")

    monkeypatch.setattr(sk, "driver_ops", none)
    assert sk.main([*map(str, pids)]) == 3
    ev = json.loads(capsys.readouterr().out)
    assert ev["event"] == "refused" and "no CUDA driver" in ev["why"]


def test_a_victim_is_swapped_only_where_its_work_is_worth_the_swap() -> None:
    """A rerun loses the victim's work (its time less its waits); a swap costs its round trip
    and every other waiter's wait while its memory goes out: a first-wave command that mostly
    waited is preempted, one that worked long is swapped, a command swapped twice is not
    swapped again, and nothing is where swaps are off or the driver cannot."""
    from typing import cast

    from krex.core.tenants import TenantGroup
    from krex.daemon.model import Tenant
    from krex.daemon.swap import GIB, MAX_SWAPS, Swaps, swap_cost_s

    def swaps(enabled: bool = True) -> Swaps:
        return Swaps(enabled=enabled, sim_shm="", on_refused=print, on_failed=print)

    t = Tenant(id=1, gpu=0, argv=["x"], group=cast(TenantGroup, None), region_timeout_s=60,
               t_admit=0)  # fmt: skip
    held = 12 * GIB
    assert swap_cost_s(held, 7) == pytest.approx(12 * (0.75 + 0.55 * 7))
    assert "cost less than a swap" in swaps().can_take(t, held, work_s=2.0, blocked=7)
    assert swaps().can_take(t, held, work_s=60.0, blocked=7) == ""
    assert swaps().can_take(t, held, work_s=10.0, blocked=0) == ""  # 9 s: worth it
    assert "off" in swaps(enabled=False).can_take(t, held, work_s=600.0, blocked=0)
    cannot = swaps()
    cannot.unsupported = "the driver cannot checkpoint here"
    assert cannot.can_take(t, held, work_s=600.0, blocked=0) == cannot.unsupported
    t.mem_swaps = MAX_SWAPS
    assert "swapped 2 times" in swaps().can_take(t, held, work_s=600.0, blocked=0)


def test_a_commands_work_counts_its_processes_waits_going_on_together_once() -> None:
    """What a rerun loses: a command 15 s old whose two processes have both waited since 10 s
    ago did 5 s of work (summed, their waits made 20 s and the command seemed to have done
    none: a swap refused where one process's alone was granted); a wait over before counts as
    it was; waits never make work negative."""
    from krex.daemon.swap import work_s

    s = 10**9
    now = 100 * s
    assert work_s(15.0, 20 * s, [90 * s, 90 * s], now) == pytest.approx(5.0)
    assert work_s(15.0, 10 * s, [90 * s], now) == pytest.approx(5.0)  # one process: the same
    # 3 s over before, and the two going on since 10 s and 8 s ago: 13 s waited.
    assert work_s(20.0, 3 * s + 10 * s + 8 * s, [90 * s, 92 * s], now) == pytest.approx(7.0)
    assert work_s(15.0, 4 * s, [], now) == pytest.approx(11.0)  # nothing going on
    assert work_s(5.0, 20 * s, [90 * s, 90 * s], now) == 0.0
