"""The daemon's memory arbiter and memory-aware admission (krex/daemon/memory.py), against fake
process slots: the order waiters are served in, which waits are denied (they could not succeed
alone), which command is preempted to break a deadlock, and who may be admitted."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from krex.core.config import ConfigError, from_toml, parse_size
from krex.core.shm import MEM_KINDS, SlotView
from krex.core.slices import Slice
from krex.core.tenants import TenantGroup
from krex.daemon.memory import DRIVER_WANT, GIB, Memory, Pokable, argv_key, command_asks
from krex.daemon.model import AdmitRequest, Gpu, Tenant
from krex.daemon.swap import Swap

CAP = 10 * GIB


class FakeSeg:
    def __init__(self) -> None:
        self.granted: list[int] = []
        self.denied: list[int] = []
        self.seen: list[int] = []

    def mem_grant(self, index: int) -> None:
        self.granted.append(index)

    def mem_deny(self, index: int) -> None:
        self.denied.append(index)

    def mem_seen(self, index: int) -> None:
        self.seen.append(index)


def slot(
    index: int,
    tenant: int,
    *,
    held: float = 0,
    want: float = 0,
    since: int = 0,
    kind: str = "alloc",
    pid: int = 0,
) -> SlotView:
    return SlotView(
        index=index,
        state=2,
        pid=pid or 1000 + index,
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
        mem_kind=MEM_KINDS.index(kind),
    )


class FakeSwaps(dict[int, Swap]):
    """The node's swaps by tenant (krex/daemon/swap.py's Swaps as the arbiter sees them): a
    test moves each one's phase on; `put` lists those put back."""

    def __init__(self) -> None:
        super().__init__()
        self.put: list[int] = []

    def swapped(self) -> set[int]:
        return {t for t, s in self.items() if s.phase != "done"}

    def busy(self, gpu: int) -> bool:
        return any(s.phase in ("out", "in") for s in self.values())

    def off(self, gpu: int) -> list[Swap]:
        return sorted(
            (s for s in self.values() if s.phase == "off"), key=lambda s: s.waited_since_ns
        )

    def put_back(self, s: Swap, now: float) -> None:
        s.phase = "in"
        self.put.append(s.tenant.id)


class Node:
    """One GPU, its tenants' slots (editable), and a Memory over them: the arbiter's node
    (MemoryNode). Tenants are preempted youngest (highest id) first, reruns last; `preempted`
    lists (tenant, why), `stuck` the region owners that waited for memory too long."""

    def __init__(
        self,
        tmp: Path | None = None,
        owner: int | None = None,
        *,
        deadlock_s: float = 1.0,
        reruns: set[int] | None = None,
        room: float = 0,
        users: dict[int, int] | None = None,
        free: int | None = None,
        cap: int = CAP,
        headroom: int = GIB,
        unknown: int = 0,
        headroom_each: int = 0,
    ) -> None:
        self.seg = FakeSeg()
        self.view: list[SlotView] = []
        self.gpu = Gpu(index=0, slots=8, slice=Slice(0, frozenset({0}), frozenset({1})))
        self.gpus = [self.gpu]
        self.owner = owner
        self.reruns = reruns or set()
        self.preempted: list[tuple[int, str]] = []
        self.stuck: list[tuple[int, float]] = []
        self.can_free: list[bool] = []
        self.users = users  # the driver's bytes per pid (None: unknown)
        self.free = free
        # Swaps (krex/daemon/swap.py): the tenants that can be taken off the GPU, those taken
        # (their Swap, whose phase a test moves on), and those put back.
        self.swappable: set[int] = set()
        self.blocked: list[int] = []  # each swap_out's count of the others waiting
        self.swaps = FakeSwaps()
        self.put = self.swaps.put
        self.mem = Memory(
            self,
            [cap],
            headroom=headroom,
            headroom_each=headroom_each,
            deadlock_s=deadlock_s,
            learned=tmp / "peaks.json" if tmp else None,
            room=int(room * GIB),
            room_wait_s=5.0,
            unknown=unknown,
        )

    def slots(self) -> list[tuple[Pokable, SlotView]]:
        return [(cast(Pokable, self.seg), s) for s in self.view]

    def region_owner(self, gpu: int) -> Tenant | None:
        return self.tenant(self.owner) if self.owner else None

    def owner_stuck(self, gpu: int, waited_s: float, can_free: bool) -> None:
        self.stuck.append((gpu, waited_s))
        self.can_free.append(can_free)

    def victims(self, gpu: int) -> list[Tenant]:
        ids = {s.tenant for s in self.view if s.tenant != self.owner}
        return sorted(map(self.tenant, ids), key=lambda x: (x.id in self.reruns, -x.id))

    def preempt(self, tid: int, why: str) -> bool:
        self.preempted.append((tid, why))
        return True

    def swap_out(
        self, tid: int, gpu: int, why: str, want: int, since_ns: int, blocked: int
    ) -> bool:
        self.blocked.append(blocked)
        if tid not in self.swappable:
            return False
        held = sum(s.mem_bytes for s in self.view if s.tenant == tid)
        pids = [s.pid for s in self.view if s.tenant == tid]
        self.swaps[tid] = Swap(self.tenant(tid), gpu, pids, held, held + want, since_ns, why)
        return True

    def device_free(self, gpu: int) -> int | None:
        return self.free

    def device_users(self, gpu: int) -> dict[int, int] | None:
        return self.users

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
    return AdmitRequest(argv=argv, region_timeout_s=60.0, auto=None, mem=mem, alone=alone)


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


def test_a_deadlock_preempts_the_youngest_waiting_command_that_holds_memory_once_per_period() -> (
    None
):
    """Every process holding memory waits, nothing is freed: after ALL_WAITING_S the youngest
    command that waits and holds memory is preempted (run again from the start; no error
    reaches anyone); one per period."""
    node = Node()
    node.view = [
        slot(0, 1, held=4, want=3, since=1 * S),
        slot(1, 2, held=4, want=3, since=2 * S),
        slot(2, 3, held=0, want=3, since=3 * S),  # youngest, but holds nothing to give
    ]
    node.mem.tick(10 * S)
    assert node.preempted == []  # the clock of "no progress" starts now
    node.mem.tick(10 * S + S // 2)
    assert node.preempted == []
    node.mem.tick(11 * S + 1)
    assert [tid for tid, _ in node.preempted] == [2]
    assert "every process holding memory waits" in node.preempted[0][1]
    node.mem.tick(11 * S + S // 2)
    assert len(node.preempted) == 1  # not again within the period
    node.mem.tick(12 * S + 2)
    assert [tid for tid, _ in node.preempted] == [2, 2]  # the fake never frees: again
    assert node.mem.status(0)["preemptions"] == 2
    assert node.seg.denied == []  # nobody's wait ended in an error


def test_a_region_owner_stuck_behind_frozen_holders_ends_its_region() -> None:
    node = Node(owner=7)
    node.view = [slot(0, 7, held=1, want=4, since=9 * S), slot(1, 2, held=8)]  # 2 is frozen
    node.mem.tick(10 * S)
    node.mem.tick(11 * S + 1)
    assert node.stuck == [(0, 2.000000001)] and node.preempted == [] and node.seg.denied == []
    assert node.can_free == [True]  # 2 runs: thawed, it may free (a timing may be retaken)


def test_a_region_owner_stuck_behind_frozen_holders_that_all_wait_says_so() -> None:
    """Where every other process holding memory waits too, the revocation says nothing can
    come back but by a preemption: the owner's command is preempted, not its timing retaken."""
    node = Node(owner=7)
    node.view = [slot(0, 7, held=1, want=4, since=9 * S), slot(1, 2, held=8, want=1, since=S)]
    node.mem.tick(10 * S)
    node.mem.tick(11 * S + 1)
    assert node.stuck == [(0, 2.000000001)] and node.can_free == [False]


def test_a_region_owner_joining_a_long_wait_is_let_retry_before_its_region_ends() -> None:
    """Others have waited for seconds with nothing freed when the region's owner begins to
    wait: it is let retry first, and its region ends only after ALL_WAITING_S of its own wait
    (on the H100, 2026-12-05, three regions were revoked at the owner's first tick, "the owner
    waited 0.0 s", before the retry it was granted could run)."""
    node = Node(owner=7)
    node.view = [slot(1, 2, held=5, want=4, since=1 * S)]  # 2 waits, frozen by 7's region
    node.mem.tick(2 * S)
    node.view.append(slot(0, 7, held=1, want=1, since=9 * S))
    node.mem.tick(9 * S + S // 10)
    assert node.seg.granted[-1] == 0 and node.stuck == []  # 4 GiB free: its retry may succeed
    node.mem.tick(10 * S + 1)
    assert node.stuck == [(0, 1.000000001)]


def test_memory_coming_back_is_progress() -> None:
    node = Node()
    node.view = [slot(0, 1, held=4, want=3, since=1 * S), slot(1, 2, held=6, want=1, since=2 * S)]
    node.mem.tick(10 * S)
    node.view[1] = dataclasses.replace(node.view[1], mem_bytes=5 * GIB)  # freed 1 GiB
    node.mem.tick(10 * S + 900_000_000)
    node.mem.tick(11 * S + 500_000_000)
    assert node.preempted == []  # 0.6 s since memory came back


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


def test_admission_counts_the_drivers_own_memory_beside_the_shims(tmp_path: Path) -> None:
    """A tenant's context and modules (the driver's figure beyond the shim's count, as last
    sampled) hold memory as its allocations do: 2 GiB allocated + 1.5 GiB the driver's own
    leave no room for 6 GiB more within 9 (before, only the 2 GiB were counted)."""
    node = Node(tmp_path)
    node.mem.learn(node.tenant(5, argv=["python", "six.py"]), 6 * GIB)
    t = node.tenant(1)
    node.gpu.tenants.append(t)
    node.view = [slot(0, 1, held=2)]
    assert node.mem.fits(node.gpu, req(["python", "six.py"], 0))  # 2 + 6 <= 9
    t.driver_bytes = int(1.5 * GIB)
    assert not node.mem.fits(node.gpu, req(["python", "six.py"], 0))  # 3.5 + 6 > 9


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
    assert cfg.headroom_each_bytes() == 0  # a total configured: nothing per command
    sim = from_toml("[gpus]\nsim = true\n")
    assert sim.headroom_bytes() == sim.headroom_each_bytes() == 0
    for slots in (8, 16):
        real = from_toml(f"[gpus]\nslots = {slots}\n")
        assert (real.headroom_bytes(), real.headroom_each_bytes()) == (0, GIB // 2)


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
    """Every process that holds memory waits: the preemption comes after ALL_WAITING_S; while
    one that holds memory runs, only after deadlock_s; while a region holds the GPU (its frozen
    siblings free once it ends), never."""
    stuck = [slot(0, 1, held=4, want=3, since=1 * S), slot(1, 2, held=4, want=3, since=2 * S)]
    node = Node(deadlock_s=5.0)
    node.view = list(stuck)
    node.mem.tick(10 * S)
    node.mem.tick(11 * S + 1)
    assert [tid for tid, _ in node.preempted] == [2]
    busy = Node(deadlock_s=5.0)
    busy.view = [*stuck, slot(2, 3, held=2)]  # tenant 3 runs and may free its 2 GiB
    busy.mem.tick(10 * S)
    busy.mem.tick(11 * S + 1)
    assert busy.preempted == []
    busy.mem.tick(15 * S + 1)
    assert [tid for tid, _ in busy.preempted] == [2]  # tenant 3 does not wait: not a victim
    region = Node(deadlock_s=5.0, owner=3)
    region.view = [*stuck, slot(2, 3, held=2)]  # tenant 3's region has 1 and 2 frozen
    region.mem.tick(10 * S)
    region.mem.tick(20 * S)
    assert region.preempted == []


def test_a_deadlock_beside_a_region_waiting_for_room_is_broken_for_the_room() -> None:
    """Seen on an H100 (2026-12-05, 8 warm KernelBench commands on a fresh daemon): every
    command holding memory waited for more while a region waited for room, and nothing broke
    the deadlock until the room's bound (10 s) ran out, three regions in a row: 35 s lost.
    The region has frozen nobody yet, so the waiters' deadlock is broken as any other (its
    owner, not waiting for memory but for the room, counts as waiting, and is no victim),
    preempting as many as the room needs; on eaabccf nothing was preempted."""
    node = Node(deadlock_s=30.0, owner=9, room=2)
    node.view = [
        slot(0, 1, held=3, want=3, since=1 * S),
        slot(1, 2, held=1, want=3, since=2 * S),
        slot(2, 3, held=1.5, want=3, since=3 * S),
        slot(3, 9, held=4),  # the region's owner: in region_begin, waiting for room
    ]
    node.mem.state[0].room_for, node.mem.state[0].room_want = 9, 2 * GIB
    node.mem.tick(10 * S)
    node.mem.tick(10 * S + S // 2)
    assert node.preempted == []  # not before ALL_WAITING_S
    node.mem.tick(11 * S + 1)
    # 0.5 GiB free: the youngest waiting holder (1.5 GiB) is enough for the 2 GiB of room.
    assert [tid for tid, _ in node.preempted] == [3]
    assert "every process holding memory waits" in node.preempted[0][1]
    own = Node(deadlock_s=30.0, owner=9, room=2)
    own.view = [*node.view[:3], slot(3, 9, held=4, want=1, since=4 * S)]  # 9's child waits too
    own.mem.state[0].room_for, own.mem.state[0].room_want = 9, 2 * GIB
    own.mem.tick(10 * S)
    own.mem.tick(11 * S + 1)
    assert [tid for tid, _ in own.preempted] == [3] and own.stuck == []
    held = Node(deadlock_s=30.0, owner=9, room=2)
    held.view = list(node.view)  # the same, but the region holds the GPU: nobody preempted
    held.mem.tick(10 * S)
    held.mem.tick(20 * S)
    assert held.preempted == []


def test_a_rerun_is_preempted_last() -> None:
    node = Node(reruns={3})
    node.view = [
        slot(0, 1, held=4, want=3, since=1 * S),
        slot(1, 2, held=2, want=3, since=2 * S),
        slot(2, 3, held=2, want=3, since=3 * S),  # youngest, but a rerun
    ]
    node.mem.tick(10 * S)
    node.mem.tick(11 * S + 1)
    assert [tid for tid, _ in node.preempted] == [2]


def test_a_running_process_freeing_what_it_just_took_is_not_progress() -> None:
    """A compiling command holds memory and allocates and frees scratch all along while the
    others wait (on an H100, 2026-12-06, a fresh daemon's first wave waited 48 s beside three
    compiling commands). Memory is back only below the lowest seen since the last progress
    (before: any decrease since the last tick, and the deadlock below was never broken)."""
    node = Node(deadlock_s=5.0)
    waiting = [slot(0, 1, held=4, want=3, since=1 * S), slot(1, 2, held=3, want=3, since=2 * S)]
    for i in range(60):  # 6 s of ticks; tenant 3 compiles: 2 GiB, then 2.5, then 2 again
        node.view = [*waiting, slot(2, 3, held=2.5 if i % 2 else 2)]
        node.mem.tick(10 * S + i * S // 10)
    assert [tid for tid, _ in node.preempted] == [2]  # the youngest waiting holder
    freed = Node(deadlock_s=5.0)
    for i in range(60):  # the same, but tenant 3 gives back 0.5 GiB for good each second
        freed.view = [*waiting, slot(2, 3, held=8 - 0.5 * (i // 10))]
        freed.mem.tick(10 * S + i * S // 10)
    assert freed.preempted == []


def test_a_region_waiting_for_room_beside_a_running_holder_preempts_within_its_bound() -> None:
    """A region waits for room; the waiters hold memory and a running command holds some too
    (so the deadlock's period is deadlock_s, 30 s). On an H100 (2026-12-06) each such region
    went ahead at its room bound (10 s) without the room, its owner then waited for memory its
    frozen siblings held, and the region was revoked: four in a row, their commands run again,
    nothing freed. Now, at half the bound, the youngest waiting holder is preempted for the
    room (before: nobody, for as long as deadlock_s)."""
    node = Node(deadlock_s=30.0, owner=9, room=2)
    node.view = [
        slot(0, 1, held=3, want=3, since=1 * S),
        slot(1, 2, held=1.5, want=3, since=2 * S),
        slot(2, 3, held=2),  # running: it may free
        slot(3, 9, held=2),  # the region's owner, waiting for room
    ]
    st = node.mem.state[0]
    st.room_for, st.room_want, st.room_since_ns = 9, 2 * GIB, 10 * S
    node.mem.tick(10 * S)
    node.mem.tick(12 * S)
    assert node.preempted == []  # within the first half of the room's 5 s bound
    node.mem.tick(12 * S + S // 2 + 1)
    assert [tid for tid, _ in node.preempted] == [2]
    assert "while tenant 9's region waits for room" in node.preempted[0][1]
    late = Node(deadlock_s=30.0, owner=9, room=2)  # the waiters were stuck before the room
    late.view = list(node.view)
    late.mem.tick(1 * S)
    st = late.mem.state[0]
    st.room_for, st.room_want, st.room_since_ns = 9, 2 * GIB, 10 * S
    late.mem.tick(10 * S + S // 10)
    assert late.preempted == []  # the room's own wait has just begun
    late.mem.tick(12 * S + S // 2 + 1)
    assert [tid for tid, _ in late.preempted] == [2]


def test_a_region_waiting_for_room_keeps_freed_memory() -> None:
    """While tenant 9's region waits for 2 GiB free, the head waiter is not let retry (what is
    freed stays free for the region); once there is room, it is."""
    node = Node(room=2)
    node.view = [
        slot(0, 1, held=6, want=3, since=1 * S),
        slot(1, 2, want=3, since=2 * S),
        slot(2, 3, held=3.5),
    ]
    node.mem.state[0].room_for, node.mem.state[0].room_want = 9, 2 * GIB
    node.mem.tick(10 * S)
    assert node.seg.granted == []  # 0.5 GiB free < 2: nobody else takes it
    node.view[0] = dataclasses.replace(node.view[0], mem_bytes=0, mem_want=0)  # gave back 6
    node.mem.tick(10 * S + 2)
    assert node.seg.granted == [1]  # 6.5 GiB free: room enough, the waiter may retry


def test_a_waiter_is_not_let_take_the_room_a_region_waits_for() -> None:
    """While a region waits for 2 GiB of room, 3 GiB are free: enough for the head's 3 GiB or
    for the room, not both. The head is not let retry (before, it was, whenever the room alone
    was free, and a retry that won took the room away again)."""
    node = Node(room=2)
    node.view = [slot(0, 1, held=4, want=3, since=1 * S), slot(1, 2, held=3)]
    node.mem.state[0].room_for, node.mem.state[0].room_want = 9, 2 * GIB
    node.mem.tick(10 * S)
    assert node.seg.granted == []
    node.view[1] = dataclasses.replace(node.view[1], mem_bytes=int(1.5 * GIB))  # 4.5 free
    node.mem.tick(10 * S + 1)
    assert node.seg.granted == []  # 4.5 - 2 < 3
    node.view[1] = dataclasses.replace(node.view[1], mem_bytes=GIB)  # 5 free: both fit
    node.mem.tick(10 * S + 2)
    assert node.seg.granted == [0]


def test_a_room_found_stays_kept_until_its_region_ends() -> None:
    """The room found, the region's gate closes, its siblings drain and freeze: until then a
    waiter let retry could take the room again (on the simulated GPU under load, the owner then
    waited inside its region and the region was revoked). So once found it stays kept for that
    owner until its region ends, and only then is it anyone's."""
    node = Node(room=2, owner=9)
    node.view = [slot(0, 1, held=4, want=3.5, since=1 * S), slot(1, 9, held=1)]

    async def found() -> float:
        return await node.mem.make_room(0, owner=9)  # 5 GiB free: found at once

    assert asyncio.run(found()) == pytest.approx(0.0, abs=0.5)
    assert node.mem.state[0].room_kept == (9, 2 * GIB)
    node.mem.tick(10 * S)
    assert node.seg.granted == []  # 5 - 2 < 3.5: the head waits while 9's region is on
    node.owner = None  # 9's region ended
    node.mem.tick(10 * S + 1)
    assert node.seg.granted == [0] and node.mem.state[0].room_kept == (0, 0)


def test_a_wait_the_whole_command_could_not_win_alone_is_denied_at_once() -> None:
    """Issue #47, 6: "would it fit alone" is judged for the command, all its processes: its
    child holds 6 GiB of 10, its parent waits for 5 more; natively that fails at once, so under
    krex too (the error counts as one it would have had alone). Each process alone would fit."""
    node = Node()
    node.view = [slot(0, 1, held=6, pid=50), slot(1, 1, want=5, since=1 * S, pid=51)]
    node.view.append(slot(2, 2, held=1, want=1, since=2 * S))
    node.mem.tick(2 * S)
    assert node.seg.denied == [1]
    assert node.mem.status(0)["denials"] == 1
    assert node.seg.granted == [2]  # the denied wait is nobody's head
    node.mem.tick(2 * S + 1)
    assert node.seg.denied == [1]  # once per wait


def test_a_wait_with_nobody_else_holding_memory_is_denied_after_a_failed_retry() -> None:
    """Nobody else holds memory on the GPU (the driver's count, contexts included): first a
    retry (someone may just have freed), then, once the process says retries since failed
    (two: the first may end a retry begun before the grant), the wait is denied: its error is
    one the command would have had alone. While anyone else holds memory, never."""
    node = Node(users={1000: 9 * GIB})
    node.view = [slot(0, 1, held=8, want=0.5, since=1 * S, kind="module")]
    node.mem.tick(2 * S)
    assert node.seg.granted == [0] and node.seg.denied == []
    node.view = [dataclasses.replace(node.view[0], mem_failed=1)]
    node.mem.tick(2 * S + S // 10)
    assert node.seg.denied == []  # too soon, and one failure may be a retry from before
    node.view = [dataclasses.replace(node.view[0], mem_failed=2)]
    node.mem.tick(3 * S)
    assert node.seg.denied == [0]
    shared = Node(users={1000: 8 * GIB, 2000: GIB // 2})  # someone's context: 0.5 GiB
    shared.view = [slot(0, 1, held=8, want=0.5, since=1 * S, kind="context")]
    for n in range(10):
        shared.view = [dataclasses.replace(shared.view[0], mem_failed=n)]
        shared.mem.tick(2 * S + n * S)
    assert shared.seg.denied == [] and len(shared.seg.granted) == 10


def test_a_wait_alone_is_not_denied_before_its_process_has_retried() -> None:
    """A waiter granted a retry while nobody else holds memory, that has not run since (a
    loaded machine: it may be scheduled seconds later), is not denied however long it has
    been: before layout 2.2 it was, 0.3 s after the grant, and its command got an
    out-of-memory error it would not have had alone (its retry would have succeeded)."""
    node = Node(users={1000: 1 * GIB})
    node.view = [slot(0, 1, held=1, want=0.5, since=1 * S, kind="alloc")]
    for n in range(20):
        node.mem.tick(2 * S + n * S)
    assert node.seg.denied == [] and node.seg.granted
    node.view = [dataclasses.replace(node.view[0], mem_failed=2)]  # it ran: two retries failed
    node.mem.tick(30 * S)
    assert node.seg.denied == [0]


def test_a_driver_wait_is_judged_with_the_driver_share_it_may_need() -> None:
    """A context, module or launch wait asks for memory of unknown size: the verdict takes
    DRIVER_WANT for it, so a command that holds all but a sliver of the GPU is denied."""
    node = Node()
    node.view = [slot(0, 1, held=9.8, want=0, since=1 * S, kind="launch")]
    node.view[0] = dataclasses.replace(node.view[0], mem_want=1)
    node.view.append(slot(1, 2, held=0.1))
    node.mem.tick(2 * S)
    assert node.seg.denied == [0]


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


def test_a_first_rerun_is_admitted_once_what_it_needed_fits_beside_others() -> None:
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


def test_nothing_is_admitted_beside_a_promised_alone_rerun() -> None:
    """Issue #47, 6: a rerun that must run alone is promised a slot (not yet a tenant): the
    same admission pass admits nobody beside it."""
    node = Node()
    assert node.mem.fits(node.gpu, req(["again"], alone=True))
    assert not node.mem.fits(node.gpu, req(["other"]), reserved_alone=1)


def test_a_command_never_seen_is_expected_to_need_the_median_of_the_learned_peaks(
    tmp_path: Path,
) -> None:
    """Issue #47, 5: with what it can know: once a few commands' peaks are learned, a command
    of unknown need counts as their median, not as nothing."""
    node = Node(tmp_path)
    node.gpu.tenants.append(node.tenant(1))
    node.view = [slot(0, 1, held=6)]
    assert node.mem.fits(node.gpu, req(["new"]))  # nothing learned: unknown, admitted
    for i, gib in enumerate((3, 4, 6)):
        node.mem.learn(node.tenant(10 + i, argv=[f"seen{i}"]), gib * GIB)
    assert node.mem.prior() == 4 * GIB
    assert not node.mem.fits(node.gpu, req(["new"]))  # 6 + 4 > 10 - 1
    assert node.mem.fits(node.gpu, req(["new"], 3 * GIB))  # declared: 6 + 3 <= 9


def test_the_driver_free_figure_holds_back_admission() -> None:
    """NVML's free memory (contexts and what the shim cannot see included) less what the
    tenants are still expected to grow by must hold the newcomer's need."""
    tight = Node(free=2 * GIB)
    tight.gpu.tenants.append(tight.tenant(1))
    tight.view = [slot(0, 1, held=2)]
    assert not tight.mem.fits(tight.gpu, req(["x"], 3 * GIB))  # the driver has 2 GiB free
    roomy = Node(free=7 * GIB)
    roomy.gpu.tenants.append(roomy.tenant(1))
    roomy.view = [slot(0, 1, held=2)]
    assert roomy.mem.fits(roomy.gpu, req(["x"], 3 * GIB))


def test_learned_peaks_are_kept_under_the_command_key(tmp_path: Path) -> None:
    """A client's key (argv and the files it names) stands for the command, not its argv: the
    same `python bench.py` with other contents is another command."""
    node = Node(tmp_path)
    t = node.tenant(1, argv=["python", "bench.py"])
    t.mem_key = "a" * 32
    node.mem.learn(t, 7 * GIB)
    assert node.mem.learned == {"a" * 32: 7 * GIB}
    assert node.mem.need("a" * 32, 0) == 7 * GIB
    assert node.mem.need("b" * 32, 0) == 0


def test_a_command_never_seen_is_expected_to_need_its_familys_last_peak(tmp_path: Path) -> None:
    """The guess for an agent's next candidate (a rewritten bench.py: a new key, the same
    family): its family's last peak, not the largest, and not one a preemption cut short; a
    declared budget or the command's own peak first, the prior where the family is new too.
    Families are kept in the peaks file beside the commands and are not in the prior's median."""
    node = Node(tmp_path)
    fam = "f" * 32
    for i, (gib, preempted) in enumerate([(20, ""), (6, ""), (1, "a memory deadlock")]):
        t = node.tenant(i + 1, argv=["python", "bench.py"])
        t.mem_key, t.mem_family, t.preempted = f"{i:032x}", fam, preempted
        node.mem.learn(t, gib * GIB)
    assert node.mem.families == {fam: 6 * GIB}  # the last that ran to its end
    assert node.mem.learned[f"{2:032x}"] == GIB  # a command's own peak: learned all the same
    assert node.mem.need("e" * 32, 0, family=fam) == 6 * GIB
    assert node.mem.need("e" * 32, 3 * GIB, family=fam) == 3 * GIB  # declared first
    assert node.mem.need(f"{0:032x}", 0, family=fam) == 20 * GIB  # its own peak first
    assert node.mem.need("e" * 32, 0, rerun=8 * GIB, family=fam) == 8 * GIB
    assert node.mem.need("e" * 32, 0, family="d" * 32) == node.mem.prior()
    r = dataclasses.replace(req(["python", "bench.py"]), key="e" * 32, family=fam)
    assert node.mem.requested(r) == 6 * GIB
    t = node.tenant(9, argv=["python", "bench.py"])
    t.mem_key, t.mem_family = "e" * 32, fam
    assert node.mem.expected(t) == 6 * GIB
    again = Node(tmp_path)  # a daemon started again reads both back
    assert again.mem.families == {fam: 6 * GIB} and again.mem.learned == node.mem.learned
    peaks = json.loads((tmp_path / "peaks.json").read_text())
    assert peaks["family:" + fam] == 6 * GIB and len(peaks) == 4
    just_families = Node(tmp_path / "x")
    (tmp_path / "x").mkdir()
    for i in range(5):
        t = just_families.tenant(i + 1)
        t.mem_key, t.mem_family = f"{i % 2:032x}", f"{i:032x}"
        just_families.mem.learn(t, (i + 1) * GIB)
    assert len(just_families.mem.learned) == 2  # fewer than three commands: no median yet
    assert just_families.mem.prior() == just_families.mem.unknown
    # A planted family of no key (or not a key) stands for nobody: not for the commands that
    # come with no family (older clients).
    planted = tmp_path / "y"
    planted.mkdir()
    (planted / "peaks.json").write_text(json.dumps({"family:": 9 * GIB, "family:x": 9 * GIB}))
    hand = Node(planted)
    assert hand.mem.families == {}
    assert hand.mem.need("e" * 32, 0) == hand.mem.need("e" * 32, 0, family="") == hand.mem.prior()


def test_the_admission_pass_that_admits_an_alone_rerun_admits_nobody_else() -> None:
    """Issue #47, 6, in the daemon's own admission pass: the GPU empties with an alone rerun at
    the head of its queue and others behind it. The rerun is promised the slot; before, the
    same pass went on to admit the others beside it (it was not a tenant yet)."""
    from krex.daemon.admission import Admission
    from krex.daemon.model import AdmissionTicket

    async def scenario() -> list[bool]:
        node = Node()
        loop = asyncio.get_running_loop()
        reqs = [req(["again"], alone=True), req(["a"], GIB), req(["b"], GIB)]
        tickets = [AdmissionTicket(granted=loop.create_future(), req=r) for r in reqs]
        node.gpu.admission.extend(tickets)
        Admission([node.gpu], node.mem).admit_next(node.gpu)
        return [t.granted.done() for t in tickets]

    assert asyncio.run(scenario()) == [True, False, False]


def test_a_commands_key_is_its_argv_and_the_contents_of_the_files_it_names(
    tmp_path: Path,
) -> None:
    """Issue #47, 5: what identifies a command for its learned peak. An agent's `python
    bench.py` is another command once bench.py changes (its argv alone was the key: one
    candidate's peak stood for every other's), and the same one in another directory."""
    from krex.client.run import command_key
    from krex.daemon.memory import is_key

    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "bench.py").write_text("x = 1\n")
    (b / "bench.py").write_text("x = 1\n")
    argv = ["python", "bench.py"]
    key = command_key(argv, str(a))
    assert is_key(key)
    assert command_key(argv, str(b)) == key  # same program, another directory
    (b / "bench.py").write_text("x = 2\n")
    assert command_key(argv, str(b)) != key  # rewritten: another command
    assert command_key(["python", "other.py"], str(a)) != key
    assert command_key(["python", "caf\udce9.py"], str(a))  # a non-UTF-8 name: still a key


def test_a_commands_family_is_its_argv_and_directory_whatever_its_files_hold(
    tmp_path: Path,
) -> None:
    """The family: what stays when an agent rewrites bench.py (the key changes with it)."""
    from krex.client.run import command_family, command_key
    from krex.daemon.memory import is_key

    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "bench.py").write_text("x = 1\n")
    argv = ["python", "bench.py"]
    family, key = command_family(argv, str(a)), command_key(argv, str(a))
    assert is_key(family) and family != key
    (a / "bench.py").write_text("x = 2\n")
    assert command_family(argv, str(a)) == family and command_key(argv, str(a)) != key
    assert command_family(argv, str(b)) != family  # another directory: another agent's
    assert command_family(["python", "bench.py", "--n", "2"], str(a)) != family
    assert command_family(["python", "bench.py--n"], str(a)) != command_family(
        ["python", "bench.py", "--n"], str(a)
    )  # arguments kept apart
    assert is_key(command_family(["python", "caf\udce9.py"], str(a)))


def test_eight_commands_never_seen_are_admitted_at_once_on_a_fresh_node() -> None:
    """The default expectation of an unknown command is an eighth of what admission may give
    (the GPU less its headroom): on the H200 an eighth of the whole GPU admitted seven, and
    an eighth long-running command of 0.6 GiB queued behind them for good."""
    cap = 140 * GIB
    cfg = from_toml("[gpus]\nslots = 8\n")
    unknown = cfg.unknown_bytes(cap)
    assert 8 * (unknown + cfg.headroom_each_bytes()) <= cap
    node = Node(
        cap=cap, headroom=0, headroom_each=cfg.headroom_each_bytes(), unknown=unknown,
        deadlock_s=30.0,
    )  # fmt: skip
    node.view = [slot(i, i + 1, held=0.6) for i in range(7)]
    gpu, mem = node.gpu, node.mem
    for tid in range(1, 8):
        gpu.tenants.append(Node().tenant(tid))
    assert mem.fits(gpu, req(["the eighth"]))
    gpu.tenants.append(Node().tenant(8))
    assert not mem.fits(gpu, req(["a ninth"]))  # eight unknowns fill what may be given
    # Queued, the ninth's krex run is told why (its notice on stderr after 10 s).
    from krex.daemon.admission import Admission

    gpu.slots = 16
    why = Admission([gpu], mem).why_queued(gpu, req(["a ninth"]))
    assert why.startswith(
        f"waiting for the device memory it is expected to need ({unknown / GIB:.1f} GiB"
    ), why


def test_a_promise_is_taken_back_exactly_when_the_expectation_changed_meanwhile(
    tmp_path: Path,
) -> None:
    """A slot promised while nothing was learned (the command expected to need the prior),
    handed on after three peaks were learned (the prior now their median): what the promise
    added to the GPU's promised memory is taken back, not today's expectation. Before, the
    difference stayed, the GPU never counted as empty again, and a rerun that must run alone
    queued for good with every slot free (found by the random-mix test)."""
    from krex.daemon.admission import Admission

    node = Node(tmp_path)
    node.mem.unknown = 5 * GIB
    adm = Admission([node.gpu], node.mem)
    r = req(["new"])
    adm.reserve(node.gpu, r)
    assert node.gpu.reserved_mem == 5 * GIB
    for i, gib in enumerate((1, 2, 3)):
        node.mem.learn(node.tenant(10 + i, argv=[f"seen{i}"]), gib * GIB)
    assert node.mem.need(r.key, r.mem, r.rerun_need) == 2 * GIB  # the expectation moved
    adm.reserve(node.gpu, r, -1)
    assert (node.gpu.reserved, node.gpu.reserved_mem) == (0, 0)
    assert adm.room(node.gpu, req(["again"], alone=True))  # the empty GPU takes an alone rerun


@pytest.mark.parametrize("held", [[15.5, 16.5, 24.5], [10.0, 20.0, 30.0, 4.0]])
def test_more_slots_admit_as_much_as_fewer_where_memory_binds(held: list[float]) -> None:
    """Issue #47, 5: more slots must never mean less throughput. The default headroom was half
    a GiB per slot: 8 GiB kept free at 16 slots where 3-4 commands ran on an H100's 79 GiB, so
    16 slots admitted fewer than 8 did (2026-12-06: 3.5 commands running on average against
    3.8, 24.1 against 26.1 commands a minute). Now half a GiB per command on the GPU: the same
    commands fit at any number of slots, and with them all slots taken, as much is kept free."""
    cap = int(79.2 * GIB)
    answers = {}
    for slots in (8, 16):
        cfg = from_toml(f"[gpus]\nslots = {slots}\n")
        node = Node(
            cap=cap, headroom=cfg.headroom_bytes(), headroom_each=cfg.headroom_each_bytes(),
            deadlock_s=30.0,
        )  # fmt: skip
        node.gpu.slots = slots
        node.view = [slot(i, i + 1, held=h) for i, h in enumerate(held)]
        node.gpu.tenants += [node.tenant(i + 1) for i in range(len(held))]
        free = cap / GIB - sum(held)
        answers[slots] = [
            node.mem.fits(node.gpu, req(["new"], int(need * GIB)))
            for need in (free - 5.0, free - 3.0, free - 2.0, free - 1.5, free - 0.5)
        ]
        # Every slot taken: at least the old per-slot headroom is kept free.
        assert node.mem.headroom_for(slots) >= slots * GIB // 2
    assert answers[8] == answers[16], answers
    assert answers[8][0] and not answers[8][-1]  # what fits with room kept, and what does not


@settings(max_examples=200, deadline=None)
@given(
    held=st.lists(st.floats(0.1, 30.0), min_size=1, max_size=8),
    need=st.floats(0.1, 40.0),
    declared=st.booleans(),
)
def test_admission_never_depends_on_the_number_of_slots(
    held: list[float], need: float, declared: bool
) -> None:
    """Issue #47, 5, for any GPU of up to 8 commands and any newcomer: 8, 16 or 64 slots give
    the same answer (the headroom counts commands, not slots)."""
    cap = int(79.2 * GIB)
    answers = set()
    for slots in (8, 16, 64):
        cfg = from_toml(f"[gpus]\nslots = {slots}\n")
        node = Node(
            cap=cap, headroom=cfg.headroom_bytes(), headroom_each=cfg.headroom_each_bytes(),
            deadlock_s=30.0, unknown=cfg.unknown_bytes(cap),
        )  # fmt: skip
        node.gpu.slots = slots
        node.view = [slot(i, i + 1, held=h) for i, h in enumerate(held)]
        node.gpu.tenants += [node.tenant(i + 1) for i in range(len(held))]
        answers.add(node.mem.fits(node.gpu, req(["new"], int(need * GIB) if declared else 0)))
    assert len(answers) == 1


def deadlocked(node: Node) -> None:
    """Tenants 1 and 2 each hold 4 GiB and want 3 more of 10 (1 GiB of headroom): every holder
    waits."""
    node.view = [slot(0, 1, held=4, want=3, since=1 * S), slot(1, 2, held=4, want=3, since=2 * S)]


def test_a_deadlock_takes_a_command_that_can_be_swapped_off_the_gpu_instead_of_preempting_it() -> (
    None
):
    """Issue #47, 2: where the driver can checkpoint the youngest waiting holder, the deadlock
    is broken by taking it off the GPU, its work kept, instead of killing it; while its memory
    moves, nobody else is taken or preempted; what it held is not counted as anyone's."""
    node = Node()
    node.swappable = {2}
    deadlocked(node)
    node.mem.tick(10 * S)
    node.mem.tick(11 * S + 1)
    assert node.preempted == [] and list(node.swaps) == [2]
    assert node.swaps[2].need == 7 * GIB  # what it held, and what it waits for
    assert node.blocked == [1]  # tenant 1 waits while it goes out
    assert node.mem.status(0)["swaps"] == 1 and node.mem.status(0)["preemptions"] == 0
    for t in range(12, 20):  # its copy out takes long: no second victim meanwhile
        node.mem.tick(t * S)
    assert node.preempted == [] and list(node.swaps) == [2]
    node.swaps[2].phase = "off"
    node.seg.seen.clear()
    node.mem.tick(20 * S)
    assert node.mem.status(0)["held_bytes"] == 4 * GIB  # tenant 2's is off the GPU
    assert 1 not in node.seg.granted  # slot 1 is tenant 2's
    assert 1 in node.seg.seen  # its wait is seen: no retry of its own into the locked driver
    assert node.mem.waiting(0)  # admission waits while a command is off the GPU


def test_a_command_of_several_waiting_processes_is_put_back_for_all_their_asks() -> None:
    """Issue #47, 2: a command whose two processes each wait for 1.5 GiB is put back only when
    what it held and both asks fit (7 GiB), not one ask's (5.5): put back for one, the other
    would wait again beside whoever holds the rest, a deadlock anew."""
    node = Node()
    node.swappable = {2}
    node.view = [
        slot(0, 1, held=4, want=3, since=1 * S),
        slot(1, 2, held=2, want=1.5, since=2 * S, pid=2001),
        slot(2, 2, held=2, want=1.5, since=3 * S, pid=2002),
    ]
    node.mem.tick(10 * S)
    node.mem.tick(11 * S + 1)
    assert list(node.swaps) == [2] and node.preempted == []
    assert node.swaps[2].need == 7 * GIB
    assert node.swaps[2].waited_since_ns == 2 * S  # its oldest process's wait


def test_a_commands_ask_reads_a_driver_wait_as_the_arbiter_does() -> None:
    """What a command's waiting processes ask, for its swap's need and a preempted command's
    rerun alike: a wait for the driver's own memory (its size unknown, the slot says 1 byte)
    counts DRIVER_WANT, as the arbiter reads it; a process not waiting, nothing. (A preempted
    command's need summed the slots' bytes: 1 for a context.)"""
    mine = [
        slot(0, 2, held=1, want=0.5),
        slot(1, 2, held=1, want=1 / GIB, kind="context"),
        slot(2, 2, held=1),
    ]
    assert command_asks(mine) == GIB // 2 + DRIVER_WANT


def test_a_command_that_cannot_be_swapped_is_preempted_as_before() -> None:
    node = Node()
    deadlocked(node)
    node.mem.tick(10 * S)
    node.mem.tick(11 * S + 1)
    assert [t for t, _ in node.preempted] == [2] and node.swaps == {}


def test_a_command_off_the_gpu_is_put_back_once_its_need_is_free_and_no_region_holds_it() -> None:
    node = Node(free=0)
    node.swappable = {2}
    deadlocked(node)
    node.mem.tick(10 * S)
    node.mem.tick(11 * S + 1)
    node.swaps[2].phase = "off"
    node.free = 6 * GIB  # tenant 2's 4 GiB back, tenant 1 still waits for 3
    node.mem.tick(12 * S)
    assert node.put == []  # tenant 1 waited longer (since 1 s): its turn first
    node.view = [s for s in node.view if s.tenant == 2]  # tenant 1 got its memory and ended
    node.free = 7 * GIB - 1
    node.mem.tick(13 * S)
    assert node.put == []  # 7 GiB needed
    node.owner = 5  # a region holds the GPU: a restore's copies would share it
    node.free = 10 * GIB
    node.mem.tick(14 * S)
    assert node.put == []
    node.owner = None
    node.mem.tick(15 * S)
    assert node.put == [2] and node.swaps[2].phase == "in"


def test_memory_freed_is_kept_for_a_command_off_the_gpu_that_waited_before_the_head() -> None:
    """A younger waiter is not let take, bit by bit, what the command off the GPU waits for:
    memory goes in the order waits began, as for any waiter."""
    node = Node(free=0)
    node.swappable = {1}
    node.view = [slot(0, 2, held=4, want=3, since=1 * S), slot(1, 1, held=4, want=3, since=2 * S)]
    node.mem.tick(10 * S)
    node.mem.tick(11 * S + 1)
    assert list(node.swaps) == [1]  # not the head's command (2)
    node.swaps[1].phase = "off"
    node.view[0] = slot(0, 2, held=7)  # tenant 2 got its memory and runs
    node.view.append(slot(2, 3, held=0, want=1, since=30 * S))
    node.free = 5 * GIB  # less than tenant 1's 7 GiB
    node.seg.granted.clear()
    node.mem.tick(31 * S)
    assert node.seg.granted == [] and node.put == []  # tenant 3's 1 GiB would leave 4
    node.free = 8 * GIB
    node.mem.tick(32 * S)
    assert node.put == [1] and node.seg.granted == [2]  # 8 - 1 >= 7: both


def test_a_retry_that_just_succeeded_is_not_judged_by_the_drivers_count_of_its_own_bytes() -> None:
    """The head's retry is granted and succeeds: the driver's figure (NVML) counts its new
    bytes at once, while its slot says it waits until the call has returned. Judged in that
    instant, "what it holds and asks for exceed the GPU" was true, and it was denied (an H100,
    2026-12-07). A wait still standing at the next look is judged so."""
    node = Node(users={1000: 4 * GIB, 2000: 2 * GIB})
    node.view = [slot(0, 1, held=4, want=5, since=1 * S), slot(1, 2, held=2)]
    node.mem.tick(2 * S)
    assert node.seg.granted == [0] and node.seg.denied == []
    node.users = {1000: 9 * GIB, 2000: 2 * GIB}  # its 5 GiB, before its slot says so
    node.mem.tick(2 * S + S // 50)
    assert node.seg.denied == []
    node.users = {1000: 4 * GIB, 2000: 2 * GIB}  # the wait ended: the slot says so
    node.view[0] = slot(0, 1, held=9)
    node.mem.tick(2 * S + 2 * S // 50)
    assert node.seg.denied == []
    # A new wait that could not win alone by the driver's figure only (its contexts and
    # modules: 6 GiB against the shim's 4): denied at the second look.
    node.view[0] = slot(0, 1, held=4, want=5, since=3 * S)
    node.users = {1000: 6 * GIB, 2000: 2 * GIB}
    node.mem.tick(3 * S)
    assert node.seg.denied == []
    node.mem.tick(3 * S + S // 50)
    assert node.seg.denied == [0]
