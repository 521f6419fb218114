"""The daemon's memory arbiter and memory-aware admission (krex/memory.py), against fake
process slots: the order waiters are served in, deadlock releases, and who may be admitted."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import cast

import pytest

from krex.config import ConfigError, from_toml, parse_size
from krex.memory import GIB, Memory, Pokable, argv_key
from krex.model import AdmitRequest, Gpu, Tenant
from krex.shm import SlotView
from krex.slices import Slice
from krex.tenants import TenantGroup

CAP = 10 * GIB


class FakeSeg:
    def __init__(self) -> None:
        self.granted: list[int] = []
        self.released: list[int] = []

    def mem_grant(self, index: int) -> None:
        self.granted.append(index)

    def mem_release(self, index: int) -> None:
        self.released.append(index)


def slot(index: int, tenant: int, *, held: float = 0, want: float = 0, since: int = 0) -> SlotView:
    return SlotView(
        index=index,
        state=2,
        pid=1000 + index,
        tenant=tenant,
        gpu=0,
        gpus=1,
        in_flight=0,
        intercepted=0,
        blocked=0,
        unmatched=0,
        drain_req=0,
        drain_ack=0,
        alive=True,
        mem_bytes=int(held * GIB),
        mem_want=int(want * GIB),
        mem_since_ns=since,
    )


class Node:
    """One GPU, its tenants' slots (editable), and a Memory over them."""

    def __init__(
        self,
        tmp: Path | None = None,
        owner: int | None = None,
        *,
        deadlock_s: float = 1.0,
        running: set[int] | None = None,
        reruns: set[int] | None = None,
        room: float = 0,
    ) -> None:
        self.seg = FakeSeg()
        self.view: list[SlotView] = []
        self.gpu = Gpu(index=0, slots=8, slice=Slice(0, frozenset({0}), frozenset({1})))
        self.owner = owner
        self.mem = Memory(
            [self.gpu],
            lambda: [(cast(Pokable, self.seg), s) for s in self.view],
            [CAP],
            headroom=GIB,
            deadlock_s=deadlock_s,
            learned=tmp / "peaks.json" if tmp else None,
            owner_of=lambda g: self.tenant(owner) if owner else None,
            can_free=lambda t: running is None or t in running,
            rerun=lambda t: t in (reruns or set()),
            room=int(room * GIB),
            room_wait_s=5.0,
        )

    def tenant(self, tid: int, argv: list[str] | None = None, declared: float = 0) -> Tenant:
        t = Tenant(
            id=tid,
            gpu=0,
            argv=argv or [f"cmd{tid}"],
            group=cast(TenantGroup, None),
            region_timeout_s=60,
            t_admit=0,
            mem_declared=int(declared * GIB),
        )
        return t


S = 1_000_000_000  # ns


def req(argv: list[str], mem: int = 0, alone: bool = False) -> AdmitRequest:
    return AdmitRequest(argv=argv, timeout=60.0, auto=None, mem=mem, alone=alone)


def test_only_the_oldest_waiter_is_let_retry() -> None:
    node = Node()
    node.view = [slot(0, 1, held=4, want=3, since=5 * S), slot(1, 2, held=4, want=3, since=2 * S)]
    assert node.mem.tick(10 * S) is True
    assert node.seg.granted == [1]  # waiting since 2 s: first
    assert node.mem.waiting(0)


def test_a_region_owner_waits_ahead_of_everyone() -> None:
    node = Node(owner=7)
    node.view = [slot(0, 1, want=1, since=1 * S), slot(3, 7, want=1, since=9 * S)]
    node.mem.tick(10 * S)
    assert node.seg.granted == [3]


def test_nobody_waiting_means_no_grants_and_a_slow_tick() -> None:
    node = Node()
    node.view = [slot(0, 1, held=9)]
    assert node.mem.tick(1 * S) is False
    assert node.seg.granted == [] and not node.mem.waiting(0)
    assert node.mem.status(0)["held_bytes"] == 9 * GIB


def test_a_deadlock_releases_the_youngest_waiter_that_holds_memory_once_per_period() -> None:
    """Every tenant waits, nothing is freed: after deadlock_s the youngest holder is released
    (its caching allocator frees and asks again); one release per period."""
    node = Node()
    node.view = [
        slot(0, 1, held=4, want=3, since=1 * S),
        slot(1, 2, held=4, want=3, since=2 * S),
        slot(2, 3, held=0, want=3, since=3 * S),  # youngest, but holds nothing to give
    ]
    node.mem.tick(10 * S)
    assert node.seg.released == []  # the clock of "no progress" starts now
    node.mem.tick(10 * S + S // 2)
    assert node.seg.released == []
    node.mem.tick(11 * S + 1)
    assert node.seg.released == [1]
    node.mem.tick(11 * S + S // 2)
    assert node.seg.released == [1]  # not again within the period
    node.mem.tick(12 * S + 2)
    assert node.seg.released == [1, 1]  # still stuck (the fake never frees): again
    assert node.mem.status(0)["releases"] == 2


def test_a_region_owner_stuck_behind_frozen_holders_ends_its_region() -> None:
    stuck: list[tuple[int, float]] = []
    node = Node(owner=7)
    node.mem.owner_stuck = lambda gpu, waited: stuck.append((gpu, waited))
    node.view = [slot(0, 7, held=1, want=4, since=9 * S), slot(1, 2, held=8)]  # 2 is frozen
    node.mem.tick(10 * S)
    node.mem.tick(11 * S + 1)
    assert stuck == [(0, 2.000000001)] and node.seg.released == []


def test_memory_coming_back_is_progress() -> None:
    node = Node()
    node.view = [slot(0, 1, held=4, want=3, since=1 * S), slot(1, 2, held=6, want=1, since=2 * S)]
    node.mem.tick(10 * S)
    node.view[1] = dataclasses.replace(node.view[1], mem_bytes=5 * GIB)  # freed 1 GiB
    node.mem.tick(10 * S + 900_000_000)
    node.mem.tick(11 * S + 500_000_000)
    assert node.seg.released == []  # 0.6 s since memory came back


def test_a_waiter_served_is_progress_and_the_next_one_is_head() -> None:
    node = Node()
    node.view = [slot(0, 1, want=3, since=1 * S), slot(1, 2, want=1, since=2 * S)]
    node.mem.tick(10 * S)
    node.view[0] = dataclasses.replace(node.view[0], mem_want=0, mem_bytes=3 * GIB)
    node.mem.tick(10 * S + S // 10)
    assert node.seg.granted == [0, 1]


def test_dead_processes_and_other_gpus_are_not_counted() -> None:
    node = Node()
    node.view = [
        dataclasses.replace(slot(0, 1, held=5, want=1), alive=False),
        dataclasses.replace(slot(1, 2, held=5, want=1), gpu=3),
    ]
    assert node.mem.tick(1 * S) is False
    assert node.mem.status(0)["held_bytes"] == 0


def test_admission_is_paused_while_anyone_waits() -> None:
    node = Node()
    node.gpu.tenants.append(node.tenant(1))
    node.view = [slot(0, 1, held=1, want=1, since=1)]
    node.mem.tick(2)
    assert not node.mem.fits(node.gpu, req(["small"], 0))
    node.view = [slot(0, 1, held=2)]
    node.mem.tick(3)
    assert node.mem.fits(node.gpu, req(["small"], 0))


def test_declared_budgets_are_admitted_while_they_fit_beside_the_others() -> None:
    node = Node()
    node.gpu.tenants += [node.tenant(1, declared=4), node.tenant(2)]
    node.view = [slot(0, 1, held=1), slot(1, 2, held=2)]  # tenant 1 expects 4, tenant 2 holds 2
    assert node.mem.fits(node.gpu, req(["x"], 3 * GIB))  # 4 + 2 + 3 = 9 <= 10 - 1 headroom
    assert not node.mem.fits(node.gpu, req(["x"], 4 * GIB))
    assert not node.mem.fits(node.gpu, req(["x"], 3 * GIB), reserved=1 * GIB)  # promised to another
    assert node.mem.fits(node.gpu, req(["x"], 0))  # unknown need: admitted


def test_a_command_alone_is_admitted_whatever_it_needs() -> None:
    node = Node()
    assert node.mem.fits(node.gpu, req(["x"], 9_999 * GIB))
    assert node.mem.too_large(11 * GIB, 0) and not node.mem.too_large(10 * GIB, 0)


def test_peaks_are_learned_per_argv_and_used_for_admission(tmp_path: Path) -> None:
    node = Node(tmp_path)
    big = node.tenant(5, argv=["python", "big.py"])
    node.mem.learn(big, 8 * GIB)
    node.mem.learn(big, 2 * GIB)  # the most of its runs is kept
    again = Node(tmp_path)  # a restarted daemon reads what was learned
    assert again.mem.learned[argv_key(["python", "big.py"])] == 8 * GIB
    again.gpu.tenants.append(again.tenant(1))
    again.view = [slot(0, 1, held=2)]
    assert not again.mem.fits(again.gpu, req(["python", "big.py"], 0))  # 2 + 8 > 9
    assert again.mem.fits(again.gpu, req(["python", "small.py"], 0))


def test_a_damaged_peaks_file_is_ignored(tmp_path: Path) -> None:
    (tmp_path / "peaks.json").write_text('{"a": -1, "b": "x", "c": 5} trailing')
    assert Node(tmp_path).mem.learned == {}
    (tmp_path / "peaks.json").write_text('{"a": -1, "b": "x", "c": 5, "d": true}')
    assert Node(tmp_path).mem.learned == {"c": 5}


@pytest.mark.parametrize(
    ("text", "want"),
    [("24G", 24 * GIB), ("512M", 512 << 20), ("1.5T", int(1.5 * (1 << 40))), ("2GiB", 2 * GIB),
     ("3gb", 3 * GIB), ("1073741824", GIB), (" 8 G ", 8 * GIB)],
)  # fmt: skip
def test_sizes_parse(text: str, want: int) -> None:
    assert parse_size(text) == want


@pytest.mark.parametrize("text", ["", "G", "abc", "-1G", "infG", "nan", "1e999G", "1Q"])
def test_bad_sizes_are_one_clear_error(text: str) -> None:
    with pytest.raises(ValueError, match="is not a size"):
        parse_size(text)


@pytest.mark.parametrize(
    ("doc", "words"),
    [
        ("[memory]\nwait_s = 0\n", "memory.wait_s must be > 0"),
        ("[memory]\ndeadlock_s = nan\n", "memory.deadlock_s must be > 0"),
        ("[memory]\nheadroom_gib = -1\n", "memory.headroom_gib must be >= 0"),
        ("[memory]\nheadroom = 1\n", "unknown key memory.headroom"),
    ],
)
def test_bad_memory_config_names_the_key(doc: str, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        from_toml(doc, "t.toml")


def test_memory_config_defaults_and_values() -> None:
    cfg = from_toml("[memory]\nheadroom_gib = 2\nwait_s = 30\n", "t.toml")
    assert cfg.headroom_bytes() == 2 * GIB and cfg.memory_wait_s == 30.0
    assert from_toml("[gpus]\nsim = true\n").headroom_bytes() == 0
    assert from_toml("[gpus]\nslots = 8\n").headroom_bytes() == 4 * GIB


def test_a_memory_retry_is_admitted_only_alone_and_then_admits_nobody_beside_it() -> None:
    node = Node()
    node.gpu.tenants.append(node.tenant(1))
    assert not node.mem.fits(node.gpu, req(["again"], alone=True))
    node.gpu.tenants.clear()
    assert node.mem.fits(node.gpu, req(["again"], alone=True))
    retry = node.tenant(2)
    retry.mem_alone = True
    node.gpu.tenants.append(retry)
    assert not node.mem.fits(node.gpu, req(["other"]))


def test_nobody_able_to_free_is_a_deadlock_broken_within_a_second() -> None:
    """Every process that holds memory waits (or cannot run): the release comes after
    ALL_WAITING_S, not after deadlock_s; while one of them runs, after deadlock_s."""
    stuck = [slot(0, 1, held=4, want=3, since=1 * S), slot(1, 2, held=4, want=3, since=2 * S)]
    node = Node(deadlock_s=5.0, running={1, 2})
    node.view = list(stuck)
    node.mem.tick(10 * S)
    node.mem.tick(11 * S + 1)
    assert node.seg.released == [1]
    busy = Node(deadlock_s=5.0, running={1, 2, 3})
    busy.view = [*stuck, slot(2, 3, held=2)]  # tenant 3 runs and may free its 2 GiB
    busy.mem.tick(10 * S)
    busy.mem.tick(11 * S + 1)
    assert busy.seg.released == []
    busy.mem.tick(15 * S + 1)
    assert busy.seg.released == [1]
    frozen = Node(deadlock_s=5.0, running={1, 2})
    frozen.view = [*stuck, slot(2, 3, held=2)]  # tenant 3 holds memory but is frozen
    frozen.mem.tick(10 * S)
    frozen.mem.tick(11 * S + 1)
    assert frozen.seg.released == [1]


def test_a_rerun_is_released_last() -> None:
    node = Node(reruns={3})
    node.view = [
        slot(0, 1, held=4, want=3, since=1 * S),
        slot(1, 2, held=2, want=3, since=2 * S),
        slot(2, 3, held=2, want=3, since=3 * S),  # youngest, but a rerun
    ]
    node.mem.tick(10 * S)
    node.mem.tick(11 * S + 1)
    assert node.seg.released == [1]


def test_a_region_waiting_for_room_keeps_freed_memory_and_gets_deadlocks_broken() -> None:
    """While tenant 9's region waits for 2 GiB free, the head waiter is not let retry (what is
    freed stays free for the region), and a deadlock may release even the head: the region is
    ahead of it."""
    node = Node(room=2, running={1, 2})
    node.view = [
        slot(0, 1, held=6, want=3, since=1 * S),
        slot(1, 2, want=3, since=2 * S),  # holds nothing to give
        slot(2, 3, held=3.5),  # frozen or idle: cannot free
    ]
    node.mem.state[0].room_for, node.mem.state[0].room_want = 9, 2 * GIB
    node.mem.tick(10 * S)
    assert node.seg.granted == []  # 0.5 GiB free < 2: nobody else takes it
    node.mem.tick(11 * S + 1)
    assert node.seg.released == [0]
    node.view[0] = dataclasses.replace(node.view[0], mem_bytes=0, mem_want=0)  # gave back 6
    node.mem.tick(11 * S + 2)
    assert node.seg.granted == [1]  # 6.5 GiB free: room enough, the waiter may retry


def test_making_room_waits_until_enough_is_free_and_no_longer_than_its_bound() -> None:
    node = Node(room=2)
    node.view = [slot(0, 1, held=9)]
    node.mem.tick(1 * S)

    async def scenario() -> tuple[float, float]:
        async def free_later() -> None:
            await asyncio.sleep(0.3)
            node.view = [slot(0, 1, held=7)]
            node.mem.tick(2 * S)

        asyncio.get_running_loop().create_task(free_later())
        waited = await node.mem.make_room(0, owner=5)
        assert node.mem.state[0].room_for == 0
        node.mem.room_wait_s = 0.2
        node.view = [slot(0, 1, held=9.5)]
        node.mem.tick(3 * S)
        return waited, await node.mem.make_room(0, owner=5)

    waited, bounded = asyncio.run(scenario())
    assert 0.25 <= waited < 2.0 and 0.2 <= bounded < 1.0
    assert asyncio.run(Node().mem.make_room(0, owner=5)) == 0.0  # room 0: off


def test_a_first_rerun_is_admitted_with_twice_its_failed_peak_beside_others() -> None:
    node = Node()
    node.gpu.tenants.append(node.tenant(1))
    node.view = [slot(0, 1, held=4)]
    rerun = dataclasses.replace(req(["again"]), rerun=True, rerun_need=4 * GIB)
    assert node.mem.fits(node.gpu, rerun)  # 4 + 4 <= 10 - 1
    assert not node.mem.fits(node.gpu, dataclasses.replace(rerun, rerun_need=6 * GIB))


def test_room_config_defaults_and_bounds() -> None:
    cfg = from_toml("")
    assert cfg.room_bytes(140 * GIB) == GIB and cfg.room_bytes(GIB) == GIB // 16
    assert from_toml("[memory]\nroom_gib = 0\n").room_bytes(140 * GIB) == 0
    with pytest.raises(ConfigError, match=r"memory\.room_gib must be >= 0"):
        from_toml("[memory]\nroom_gib = -1\n", "t.toml")
    with pytest.raises(ConfigError, match=r"memory\.room_wait_s must be > 0"):
        from_toml("[memory]\nroom_wait_s = inf\n", "t.toml")


def test_a_region_waits_for_what_its_owner_gave_back_since_its_peak() -> None:
    """The owner peaked at 6 GiB and holds 1 now (its warm-up's memory went back: a released
    cache): its region waits for 5 GiB free, not the 1 GiB room; never more than admission
    can give."""
    node = Node(room=1)
    node.view = [dataclasses.replace(slot(0, 5, held=1), mem_peak=6 * GIB), slot(1, 2, held=3)]
    assert node.mem.room_for(0, 5) == 5 * GIB
    assert node.mem.room_for(0, 2) == 1 * GIB  # tenant 2 gave nothing back
    node.view[0] = dataclasses.replace(node.view[0], mem_peak=40 * GIB)
    assert node.mem.room_for(0, 5) == 9 * GIB  # capacity 10 less 1 of headroom
