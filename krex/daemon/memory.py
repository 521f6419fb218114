"""Device memory under krex: who waits for memory, who is served next, whose wait could not
end well even alone, whose command gives way when nobody can, and who may be admitted
(docs/memory.md).

The shim makes every call the driver can answer with out-of-memory (allocations, context
creation, module loading, launches, graphs) wait instead of failing, when the process alone
could have had the memory (shim/preload, docs/shim.md). This module is the daemon's side:
- Order: per GPU, the waiters of a region's owner first, then every other waiter in the order
  its wait began. Only the head of that order is let retry (every tick), so memory freed goes to
  it; the others wait behind it.
- Verdicts: a wait the command could not win even with the GPU to itself is denied at once (the
  driver's error comes back, counted as one it would have had alone, as natively): when what
  the whole command holds there (all its processes, by the driver's count where known) and
  what it asks for exceed the GPU, or when nobody else holds any memory there and a retry
  granted since has failed too.
- Deadlocks: when nobody who holds memory on the GPU can free it (every holder waits), or
  nothing was freed for `deadlock_s` while some could (for half `room_wait_s` while a region
  waits for room; freed means below the lowest seen since the last progress, so a running
  process freeing what it just took does not count), one waiting command is preempted: its
  processes are killed and `krex run` runs it again from the start, its report saying so. No
  surviving command ever sees an error it would not have seen alone, so none takes a slower
  path (a library's low-workspace fallback) that a region would then time. Youngest first (it
  lost the least work), a command already rerun last.
- Room for a region: before a region's gate closes, its owner waits (at most `room_wait_s`)
  until the GPU has room for it free: `room` bytes, or what its processes gave back since
  their peak if more, since once its siblings are frozen nobody can free for it; meanwhile
  memory freed is not handed to other waiters (nor, once found, until the region ends), and
  a deadlock of the waiters is broken as above (the owner counts as waiting), preempting as
  many as the room needs.
- Admission: a GPU with waiters admits nobody; otherwise a command is admitted when the memory
  it is expected to need (`--mem`, else the peak learned from earlier runs of the same command,
  else the last peak of its family (the same argv and directory, its files edited), else the
  median of all learned peaks, else an eighth of the GPU less eight commands' headroom) fits
  beside what the GPU's tenants hold or are expected to need, within the GPU less the
  headroom (half a GiB per command on it by default), and the driver's free figure (NVML) has
  room for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from krex.core.config import kept_free
from krex.core.messages import is_key as is_key  # a key's form is admit's mem_key's
from krex.core.shm import MEM_KINDS, SlotView
from krex.core.trust import TrustError, open_beside
from krex.daemon.model import AdmitRequest, Gpu, Tenant
from krex.daemon.swap import Swap

log = logging.getLogger("krex.daemon")

GIB = 1 << 30
_LEARNED_MAX = 10_000  # command keys kept in the learned-peaks file
_PRIOR_MIN = 3  # learned peaks needed before their median stands for an unknown command
FAMILY = "family:"  # a family's peak in the learned-peaks file, beside the commands' keys
ALL_WAITING_S = 1.0  # nobody can free: the preemption period (time for a free in flight)
# Memory back by less than this below the lowest seen since the last progress is not progress:
# a running process that frees what it just allocated (a compiler's scratch, an allocator's
# cache) gives the waiters nothing.
PROGRESS_MIN = 64 << 20
ALONE_CHECK_S = 0.3  # nobody else holds memory this long, granted retries failed: denied
STARVE_S = 10.0  # the head waited this long: no other waiter is let retry before it
# What the driver takes for a context, a module or a launch's local memory, for the verdict
# (the shim cannot know the size of the driver's own allocations).
DRIVER_WANT = 512 << 20
_ROOM_POLL_S = 0.02
_KIND_ALLOC = MEM_KINDS.index("alloc")


def _kept(st: GpuMemory) -> int:
    """What is kept free on the GPU, not for the waiters: the room a region waits for or was
    found (until it ends), or what a command off the GPU that waited before the head needs."""
    return max(st.room_want if st.room_for else st.room_kept[1], st.reserve)


def asks(s: SlotView) -> int:
    """What a waiting slot asks for: its bytes, or DRIVER_WANT for the driver's own memory
    (the arbiter's reading, a swap's need and a preempted command's: one)."""
    return s.mem_want if s.mem_kind == _KIND_ALLOC else max(s.mem_want, DRIVER_WANT)


def command_asks(slots: Iterable[SlotView]) -> int:
    """What a command's waiting processes ask for together: needed at once (a swapped or
    preempted command is put back or run again for all of it, not one ask)."""
    return sum(asks(s) for s in slots if s.mem_want)


def argv_key(argv: Sequence[str]) -> str:
    """The learned-peaks key of a command known by its argv alone (older clients). Never
    raises: an argument that is not UTF-8 (its bytes as lone surrogates) is hashed as such."""
    return hashlib.sha256("\0".join(argv).encode("utf-8", "surrogatepass")).hexdigest()[:32]


class Pokable(Protocol):
    """Where a process slot lives: what lets its memory waiter retry, or denies its wait."""

    def mem_grant(self, index: int) -> None: ...

    def mem_deny(self, index: int) -> None: ...

    def mem_seen(self, index: int) -> None: ...


class SwapView(Protocol):
    """What the arbiter asks of the node's swaps (krex/daemon/swap.py)."""

    def swapped(self) -> set[int]:
        """Tenants off a GPU or on the way: they hold nothing there and are let retry by
        nobody."""

    def busy(self, gpu: int) -> bool:
        """A swap copies on the GPU: no deadlock is broken again until its memory moved."""

    def off(self, gpu: int) -> list[Swap]:
        """The GPU's commands off it, the longest waiting first."""

    def put_back(self, s: Swap, now: float) -> None:
        """Put a command back on its GPU (its need is free there)."""


class MemoryNode(Protocol):
    """What the arbiter reads of the node it runs on, and what it may do there
    (krex.daemon.node.Node is one; tests/test_memory.py has a fake)."""

    @property
    def gpus(self) -> Sequence[Gpu]: ...

    def slots(self) -> Iterable[tuple[Pokable, SlotView]]:
        """Every process slot that is not free, with the segment it lives in."""

    def region_owner(self, gpu: int) -> Tenant | None:
        """The tenant whose region holds (or is taking) the GPU."""

    def owner_stuck(self, gpu: int, waited_s: float, can_free: bool) -> None:
        """That tenant waits for memory its frozen siblings hold: its region must end.
        `can_free`: some process holding memory there is running, not waiting (once thawed
        it may free)."""

    def victims(self, gpu: int) -> list[Tenant]:
        """The GPU's commands that may be preempted, in the order they would be."""

    def preempt(self, tid: int, why: str) -> bool:
        """End a command so that it runs again from the start (True: done)."""

    def swap_out(
        self, tid: int, gpu: int, why: str, want: int, since_ns: int, blocked: int
    ) -> bool:
        """Take a command that waits for `want` bytes more (since since_ns) off the GPU, its
        processes kept, `blocked` other commands waiting there meanwhile (True: begun; False:
        it cannot be, preempt it instead)."""

    @property
    def swaps(self) -> SwapView:
        """The commands taken off a GPU (krex/daemon/swap.py's Swaps)."""

    def device_free(self, gpu: int) -> int | None:
        """The driver's free bytes (NVML); None where unknown."""

    def device_users(self, gpu: int) -> dict[int, int] | None:
        """The driver's bytes per pid; None where unknown."""


@dataclass
class Waiter:
    seg: Pokable
    slot: SlotView
    owner: bool  # its tenant holds a region on the GPU


@dataclass
class Verdict:
    """What the arbiter knows of one wait (a slot's, since mem_since_ns)."""

    since_ns: int
    alone_since_ns: int = 0  # when nobody else was first seen holding memory (0: others hold)
    granted_alone: bool = False  # a retry was granted while nobody else held memory
    failed_at_grant: int = 0  # the process's failed retries (mem_failed) at that grant
    failed_when_free: int = -1  # mem_failed when its ask was first seen free (-1: it is not)
    over: int = 0  # consecutive looks at which the driver's figure said it could not win alone
    denied: bool = False


@dataclass
class GpuMemory:
    """One GPU's memory as the arbiter last saw it."""

    capacity: int
    held: int = 0  # bytes the tenants' processes hold (their allocations less frees)
    used: int = 0  # bytes in use by the driver's count where known (else `held`)
    waiters: list[Waiter] = field(default_factory=list)
    progress_ns: int = 0  # last time memory was freed (or nobody waited)
    # The lowest held and used bytes seen since then: memory is back only below them.
    low_held: int = 0
    low_used: int = 0
    preempted_ns: int = 0  # last preemption (or swap)
    preemptions: int = 0
    swaps: int = 0  # deadlocks broken by taking a command off the GPU instead
    reserve: int = 0  # free bytes kept for a command off the GPU that waited before the head
    denials: int = 0
    room_for: int = 0  # a tenant whose region waits for room before its gate closes (0: none)
    room_want: int = 0  # the bytes free it waits for
    room_since_ns: int = 0  # when that wait began
    # Once found, the room stays kept for that tenant until its region ends (until its
    # siblings are frozen nobody else is let take it): (tenant, bytes), (0, 0) for none.
    room_kept: tuple[int, int] = (0, 0)
    others_can_free: bool = True  # some process holding memory here is running, not waiting

    def status(self, now_ns: int) -> dict[str, Any]:
        oldest = min((w.slot.mem_since_ns for w in self.waiters), default=0)
        return {
            "capacity_bytes": self.capacity,
            "held_bytes": self.held,
            "waiting": len(self.waiters),
            "oldest_wait_s": (now_ns - oldest) / 1e9 if oldest else 0.0,
            "preemptions": self.preemptions,
            "swaps": self.swaps,
            "denials": self.denials,
            "region_waits_for_room": self.room_for or None,
        }


class Memory:
    """The node's device memory: arbitration of waiters and memory-aware admission."""

    def __init__(
        self,
        node: MemoryNode,
        capacity: Sequence[int],
        *,
        headroom: int,
        deadlock_s: float,
        headroom_each: int = 0,
        learned: Path | None,
        room: int = 0,
        room_wait_s: float = 10.0,
        unknown: int = 0,
    ) -> None:
        self.node = node
        self.gpus = node.gpus
        self.state = [GpuMemory(capacity=c) for c in capacity]
        self.headroom = headroom  # kept free in all (memory.headroom_gib)
        self.headroom_each = headroom_each  # and per command on the GPU (its default)
        self.deadlock_ns = int(deadlock_s * 1e9)
        self.learned_path = learned
        self.learned, self.families = _load(learned)
        self.room = room
        self.room_wait_s = room_wait_s
        self.verdicts: dict[tuple[int, int], Verdict] = {}  # (slot's pid, index) -> its wait
        self.unknown = unknown  # what a command never seen needs while few peaks are learned

    # The arbiter.
    def tick(self, now_ns: int) -> bool:
        """One look at every process slot: judge new waits, order the waiters, let the head of
        each GPU retry, break a deadlock. Returns whether anyone waits (the daemon then ticks
        faster)."""
        held, waiters, freeing, by_tenant, pids = _scan(self.node, self.state)
        self._forget_ended(waiters)
        anyone = False
        for i, st in enumerate(self.state):
            users = self.node.device_users(i) if waiters[i] or st.waiters else None
            used = sum(users.values()) if users is not None else None
            now_used = used if used is not None else held[i]
            came_back = held[i] < st.low_held - PROGRESS_MIN or (
                used is not None and used < st.low_used - PROGRESS_MIN
            )
            if came_back or not st.waiters or len(waiters[i]) < len(st.waiters):
                # Memory came back (by the shims' count or the driver's: a process that held
                # only its context exited), a waiter was served, or the waiting just began.
                # (Back below the lowest since the last progress: a running command freeing
                # what it just took, a compiler's scratch, serves no waiter.)
                st.progress_ns, st.low_held, st.low_used = now_ns, held[i], now_used
            st.held, st.others_can_free = held[i], freeing[i]
            st.used = now_used
            st.waiters = sorted(waiters[i], key=lambda w: (not w.owner, w.slot.mem_since_ns))
            if st.room_for:
                anyone = True
            offs = self.node.swaps.off(i)
            if offs or self.node.swaps.busy(i):
                anyone = True
            st.reserve = self._put_back(i, st, offs, users)
            if not st.waiters:
                continue
            anyone = True
            live = [
                w for w in st.waiters if not self._judge(i, st, w, now_ns, by_tenant, pids, users)
            ]
            st.waiters = live
            if not live:
                continue
            free = self.free(i, users)
            kept = self.node.region_owner(i)
            if kept is None or kept.id != st.room_kept[0]:
                st.room_kept = (0, 0)  # its region ended (or never was): the room is anyone's
            self._grant(st, live, free, now_ns)
            if self.node.swaps.busy(i):
                st.preempted_ns = now_ns  # a swap's memory is on the way: a period after it
            else:
                self._break_deadlock(i, st, now_ns, free, by_tenant, pids, users)
        return anyone

    def _grant(self, st: GpuMemory, live: list[Waiter], free: int, now_ns: int) -> None:
        """Let the head retry; and, while the head cannot be served from what is free and has
        not waited STARVE_S, any other waiter that can (what it would take and give back may
        be what the head waits for; a retry that fails only waits again). Every waiter passed
        over is told so: it waits for its turn instead of retrying on its own."""
        granted: set[int] = set()
        head = live[0]
        room = _kept(st)
        if not room or head.owner or free - room >= asks(head.slot):
            # (While a region waits for room, and once found until the region ends, what is
            # free stays free for it: the head may retry only where its ask leaves that room.)
            granted.add(id(head))
            left = free - asks(head.slot) if asks(head.slot) <= free else free
            pack = not (head.owner or room or asks(head.slot) <= free)
            if pack and now_ns - head.slot.mem_since_ns < STARVE_S * 1e9:
                for w in live[1:]:
                    if asks(w.slot) <= left:
                        granted.add(id(w))
                        left -= asks(w.slot)
        for w in live:
            if id(w) in granted:
                w.seg.mem_grant(w.slot.index)
                self._note_grant(w)
            else:
                w.seg.mem_seen(w.slot.index)

    def _put_back(
        self, gpu: int, st: GpuMemory, offs: list[Swap], users: dict[int, int] | None
    ) -> int:
        """Put the GPU's longest-waiting command off it back once what it needs is free, no
        region holds or takes the GPU (a restore's copies would share it with the region's
        kernels) and no swap copies; it goes before the waiters that began waiting after it.
        Returns the bytes to keep free for it meanwhile (0: none)."""
        if not offs:
            return 0
        first = offs[0]
        if st.waiters and st.waiters[0].slot.mem_since_ns < first.waited_since_ns:
            return 0  # the head waited longer: its turn first
        if self.node.swaps.busy(gpu) or self.node.region_owner(gpu) is not None or st.room_for:
            return first.need
        users = users if users is not None else self.node.device_users(gpu)
        margin = self.headroom_each if st.held or (users and sum(users.values())) else 0
        if self.free(gpu, users) - margin >= first.need:
            self.node.swaps.put_back(first, time.monotonic())
        return first.need

    def _forget_ended(self, waiters: list[list[Waiter]]) -> None:
        current = {(w.slot.pid, w.slot.index): w.slot.mem_since_ns for ws in waiters for w in ws}
        for key in [k for k, v in self.verdicts.items() if current.get(k) != v.since_ns]:
            del self.verdicts[key]

    def _others(
        self,
        gpu: int,
        tenant: int,
        by_tenant: dict[tuple[int, int], int],
        pids: dict[int, set[int]],
        users: dict[int, int] | None,
    ) -> tuple[int, int]:
        """(what tenant holds on gpu, what everyone else holds there): the driver's per-process
        figures where known (contexts and modules included), else the shims' counts."""
        mine_shim = by_tenant.get((gpu, tenant), 0)
        others_shim = sum(b for (g, t), b in by_tenant.items() if g == gpu and t != tenant)
        if users is None:
            return mine_shim, others_shim
        own = pids.get(tenant, set())
        mine = sum(b for p, b in users.items() if p in own)
        others = sum(b for p, b in users.items() if p not in own)
        return max(mine, mine_shim), max(others, others_shim)

    def _judge(
        self,
        gpu: int,
        st: GpuMemory,
        w: Waiter,
        now_ns: int,
        by_tenant: dict[tuple[int, int], int],
        pids: dict[int, set[int]],
        users: dict[int, int] | None,
    ) -> bool:
        """Deny w's wait if it could not succeed even with the GPU to its command alone;
        returns whether it was denied (and is no waiter any more)."""
        s = w.slot
        key = (s.pid, s.index)
        v = self.verdicts.setdefault(key, Verdict(since_ns=s.mem_since_ns))
        if v.denied:
            return True
        mine, others = self._others(gpu, s.tenant, by_tenant, pids, users)
        want = asks(s)
        why = ""
        # By the driver's figure only at two looks in a row: a retry that has just succeeded is
        # counted there at once while its slot still says it waits, for a moment (an H100,
        # 2026-12-07: such a wait was judged so; the denial reached nobody only because the
        # wait had ended). By the shims' own counts, at once.
        over = bool(st.capacity) and mine + want > st.capacity
        v.over = v.over + 1 if over else 0
        mine_shim = by_tenant.get((gpu, s.tenant), 0)
        if over and (v.over >= 2 or mine_shim + want > st.capacity):
            why = (
                f"the command holds {mine / GIB:.2f} GiB of the GPU's {st.capacity / GIB:.2f} "
                f"and asks for {want / GIB:.2f} GiB more"
            )
        elif others == 0:
            # A retry granted while alone that failed: two failures said since that grant (the
            # first may end a retry begun before it), never a time since the grant alone (on a
            # loaded machine the waiter may not have retried yet, and its command would get an
            # error it would not have had alone).
            v.alone_since_ns = v.alone_since_ns or now_ns
            tried = v.granted_alone and s.mem_failed - v.failed_at_grant >= 2
            if tried and now_ns - v.alone_since_ns >= ALONE_CHECK_S * 1e9:
                why = "nobody else holds memory on the GPU, and a retry failed"
        else:
            v.alone_since_ns, v.granted_alone = 0, False
        if not why:
            return False
        v.denied = True
        st.denials += 1
        kind = MEM_KINDS[s.mem_kind] if s.mem_kind < len(MEM_KINDS) else "call"
        log.info(
            "GPU %d: the %s wait of process %d (tenant %d) could not succeed alone (%s): "
            "its out-of-memory error goes back, as it would natively",
            gpu,
            kind,
            s.pid,
            s.tenant,
            why,
        )
        w.seg.mem_deny(s.index)
        return True

    def _not_run_yet(self, st: GpuMemory, head: Waiter, free: int) -> bool:
        """Whether the head can be served from what is free (beside the room kept) and has not
        retried since that was first seen (one failure allowed: a retry begun before may end
        after): a process not scheduled yet (a loaded machine) or stopped, not one in a
        deadlock. Before, the waiters' deadlock rule took it for one after ALL_WAITING_S
        (every holder waits) and preempted or swapped its command, which would have been
        served."""
        v = self.verdicts.get((head.slot.pid, head.slot.index))
        if v is None:
            return False
        if asks(head.slot) > free - _kept(st):
            v.failed_when_free = -1
            return False
        if v.failed_when_free < 0:
            v.failed_when_free = head.slot.mem_failed
        return head.slot.mem_failed - v.failed_when_free < 2

    def _note_grant(self, w: Waiter) -> None:
        v = self.verdicts.get((w.slot.pid, w.slot.index))
        if v is not None and v.alone_since_ns and not v.granted_alone:
            v.granted_alone, v.failed_at_grant = True, w.slot.mem_failed

    def free(self, gpu: int, users: dict[int, int] | None = None) -> int:
        """The GPU's free bytes: the driver's where known (NVML), else its capacity less what
        the driver's per-process figures (`users`) or the tenants' processes hold."""
        known = self.node.device_free(gpu)
        if known is not None:
            return known
        st = self.state[gpu]
        used = sum(users.values()) if users is not None else st.held
        return max(0, st.capacity - used)

    async def make_room(self, gpu: int, owner: int) -> float:
        """Before tenant `owner`'s region closes the gate of `gpu`: wait, at most room_wait_s,
        until the room it wants (`room_for`) is free there (nothing to wait for when room is 0
        or the capacity unknown). Returns the seconds waited."""
        st = self.state[gpu]
        if self.room <= 0 or st.capacity <= 0 or st.room_for:
            return 0.0
        t0 = time.monotonic()
        st.room_kept = (0, 0)  # (one kept by an earlier region of the same owner is not this one)
        st.room_for, st.room_want = owner, self.room_for(gpu, owner)
        st.room_since_ns = time.monotonic_ns()
        try:
            while self.free(gpu) < st.room_want and time.monotonic() - t0 < self.room_wait_s:
                await asyncio.sleep(_ROOM_POLL_S)
            if self.free(gpu) >= st.room_want:
                st.room_kept = (owner, st.room_want)
        finally:
            st.room_for = st.room_want = 0
        return time.monotonic() - t0

    def room_for(self, gpu: int, owner: int) -> int:
        """The free bytes tenant `owner`'s region waits for on `gpu`: `room`, or what its
        processes there gave back since their peaks if more, within what admission can give."""
        regrow = sum(
            max(0, s.mem_peak - s.mem_bytes)
            for _, s in self.node.slots()
            if s.alive and s.tenant == owner and s.gpu == gpu
        )
        most = self.state[gpu].capacity - self.headroom_for(1)
        return max(self.room, min(regrow, most))

    def _break_deadlock(
        self,
        gpu: int,
        st: GpuMemory,
        now_ns: int,
        free: int,
        by_tenant: dict[tuple[int, int], int],
        pids: dict[int, set[int]],
        users: dict[int, int] | None,
    ) -> None:
        stuck = now_ns - max(st.progress_ns, st.preempted_ns)
        head = st.waiters[0]
        if head.owner and head.slot.tenant != st.room_for:
            # A region's owner waits, and its frozen siblings cannot free until the region
            # ends: end it (revoked, with the reason), so that they run and free. Counted from
            # its own wait's start, not from the others' (it is let retry first: what is free
            # may serve it).
            if now_ns - max(st.progress_ns, head.slot.mem_since_ns) >= ALL_WAITING_S * 1e9:
                st.preempted_ns = now_ns
                waited_s = (now_ns - head.slot.mem_since_ns) / 1e9
                self.node.owner_stuck(gpu, waited_s, st.others_can_free)
            return
        owner = self.node.region_owner(gpu)
        held = owner is not None and owner.id != st.room_for  # its frozen siblings free at its end
        if held or self._not_run_yet(st, head, free):
            return  # a region holds the GPU, or the head is served and has not run since
        # (A region still waiting for room has frozen nobody: the waiters' deadlock is broken
        # as any other, else the region would wait its room_wait_s for memory nobody frees;
        # so too where a process of its own owner is the head.)
        period = self.deadlock_ns if st.others_can_free else int(ALL_WAITING_S * 1e9)
        if stuck < period and not self._room_stuck(st, stuck, now_ns):
            return
        # Preempt, youngest first, as many waiting commands that hold memory as it takes for
        # what they give back (with what is free) to serve the head: one period, not one
        # command a period. The head's own command only if no other holds anything.
        waiting = {w.slot.tenant for w in st.waiters}
        holds = {t: self._others(gpu, t, by_tenant, pids, users)[0] for t in waiting}
        # (For a region waiting for room, that room: what is freed goes to it first, and the
        # head's wait, frozen beside the region, is the next period's.)
        short = (st.room_want if st.room_for else asks(head.slot)) - free
        chosen: list[int] = []
        for t in self.node.victims(gpu):
            if t.id not in waiting or holds.get(t.id, 0) <= 0 or t.id == head.slot.tenant:
                continue
            chosen.append(t.id)
            short -= holds[t.id]
            if short <= 0:
                break
        if not chosen and holds.get(head.slot.tenant, 0) > 0:
            chosen = [head.slot.tenant]
        why = (
            f"a memory deadlock on GPU {gpu}: {len(st.waiters)} waiting for device memory "
            f"and none freed for {stuck / 1e9:.1f} s"
            + ("" if st.others_can_free else " (every process holding memory waits)")
            + (f" while tenant {st.room_for}'s region waits for room" if st.room_for else "")
        )
        done, swaps = _give_way(self.node, gpu, st.waiters, chosen, why)
        if done or swaps:
            st.preempted_ns = now_ns
            st.preemptions, st.swaps = st.preemptions + len(done), st.swaps + len(swaps)

    def _room_stuck(self, st: GpuMemory, stuck: int, now_ns: int) -> bool:
        """A region has waited half its room_wait_s for room, and nothing came back for as
        long. At its bound it goes ahead without the room, its owner then waits for memory its
        frozen siblings hold: revoked, its command run again, and nothing freed (on an H100,
        2026-12-06: four regions in a row, 48 s, while compiling commands held memory and so
        the deadlock waited for deadlock_s). One waiting holder preempted instead, within the
        bound: what a running holder frees in the first half comes first; the second is for
        the preempted command's memory to come back."""
        if not st.room_for:
            return False
        half = max(int(self.room_wait_s * 1e9 / 2), int(ALL_WAITING_S * 1e9))
        return min(stuck, now_ns - st.room_since_ns) >= half

    def waiting(self, gpu: int) -> bool:
        """Anyone waits for memory on the GPU (a command off it included): admission waits."""
        return bool(self.state[gpu].waiters) or bool(self.node.swaps.off(gpu))

    def status(self, gpu: int) -> dict[str, Any]:
        return self.state[gpu].status(time.monotonic_ns())

    # Admission.
    def expected(self, t: Tenant) -> int:
        """What t is expected to need: its declared budget, else its learned peak, else its
        family's last, else the prior (what a command never seen is expected to need)."""
        key = t.mem_key or argv_key(t.argv)
        return self.need(key, t.mem_declared, t.mem_rerun_need, t.mem_family)

    def requested(self, req: AdmitRequest) -> int:
        """What the command of req, asking to be admitted, is expected to need (as expected)."""
        return self.need(req.key or argv_key(req.argv), req.mem, req.rerun_need, req.family)

    def need(self, key: str, declared: int, rerun: int = 0, family: str = "") -> int:
        """What a command about to be admitted is expected to need (0: unknown): its declared
        budget, else its learned peak, else the last peak of its family (the same argv in the
        same directory, its files since edited: an agent's next candidate), else the node's
        prior; for a rerun at least what its earlier run showed."""
        family_peak = self.families.get(family, 0) if family else 0
        known = declared or self.learned.get(key, 0) or family_peak
        return max(known or self.prior(), rerun)

    def prior(self) -> int:
        """What a command never seen is expected to need: the median of the learned peaks,
        once there are a few; before, `unknown` (by default an eighth of the GPU less the
        headroom: a fresh node admits eight commands it knows nothing of at once, no more,
        whatever its slots, and a first wave of them does not oversubscribe the GPU by its number
        alone)."""
        if len(self.learned) < _PRIOR_MIN:
            return self.unknown
        return int(statistics.median(self.learned.values()))

    def fits(
        self, g: Gpu, req: AdmitRequest, *, reserved: int = 0, reserved_alone: int = 0
    ) -> bool:
        """Whether a command may be admitted to g now, as far as memory goes (`reserved`: the
        expected needs of commands already promised a slot there; `reserved_alone`: how many of
        those must run with the GPU's memory to themselves)."""
        alone = not g.tenants and reserved == 0 and g.reserved == 0
        if self.waiting(g.index) or reserved_alone or any(x.mem_alone for x in g.tenants):
            return False  # waiters first; a memory retry has the GPU's memory to itself
        if req.alone:
            return alone
        need = self.requested(req)
        capacity = self.state[g.index].capacity
        if need == 0 or capacity == 0 or alone:
            return True  # unknown, or alone: it gets the GPU whatever it was expected to need
        expected = {x.id: self.expected(x) for x in g.tenants}
        held = {x.id: self._held_by(x) for x in g.tenants}
        busy = reserved + sum(max(expected[i], held[i]) for i in expected)
        if busy + need > capacity - self.headroom_for(len(g.tenants) + g.reserved + 1):
            return False
        users = self.node.device_users(g.index)
        if users is None and self.node.device_free(g.index) is None:
            return True
        free = self.free(g.index, users)
        # The driver's free memory (contexts and modules counted), less what the tenants are
        # still expected to grow by and what is promised: a tenant of unknown need counts what
        # it holds.
        growth = reserved + sum(max(0, expected[i] - held[i]) for i in expected)
        return free - growth >= need

    def headroom_for(self, commands: int) -> int:
        """What admission keeps free on a GPU with this many commands on it."""
        return kept_free(self.headroom, self.headroom_each, commands)

    def too_large(self, declared: int, gpu: int) -> bool:
        """A declared budget the GPU cannot give even to a command alone on it."""
        capacity = self.state[gpu].capacity
        return capacity > 0 and declared > capacity

    def _held_by(self, t: Tenant) -> int:
        shim = sum(s.mem_bytes for _, s in self.node.slots() if s.tenant == t.id and s.alive)
        return max(shim + t.driver_bytes, t.device_bytes or 0)

    def learn(self, t: Tenant, peak: int) -> None:
        """Remember a finished command's peak (the most of its runs) under its key."""
        if peak <= 0 or self.learned_path is None:
            return
        key = t.mem_key or argv_key(t.argv)
        # A command's peak is the most of its runs; a family's is its last command's (the
        # next candidate is more like the last than like the largest ever), one that ran to
        # its end: a preempted one's peak is where it was stopped.
        family = t.mem_family if is_key(t.mem_family) and not t.preempted else ""
        if peak <= self.learned.get(key, 0) and (not family or self.families.get(family) == peak):
            return
        self.learned[key] = max(peak, self.learned.get(key, 0))
        if family:
            self.families.pop(family, None)  # the newest last: what a trim keeps
            self.families[family] = peak
        self.learned = _newest(self.learned)
        self.families = _newest(self.families)
        tmp = self.learned_path.with_suffix(".tmp")
        try:
            # Beside a socket someone may share a directory with: a new file of ours, never
            # written through a link they planted (krex/core/trust.py, open_beside).
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            fd = open_beside(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            doc = self.learned | {FAMILY + k: v for k, v in self.families.items()}
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(doc))
            os.replace(tmp, self.learned_path)
        except (OSError, TrustError) as e:
            log.warning("cannot save the learned peaks to %s: %s", self.learned_path, e)


Scan = tuple[
    list[int], list[list[Waiter]], list[bool], dict[tuple[int, int], int], dict[int, set[int]]
]


def _scan(node: MemoryNode, state: list[GpuMemory]) -> Scan:
    """Every live process slot once: per GPU the bytes held and the waiters, whether some
    holder runs (can free), per (GPU, tenant) the shims' bytes, per tenant its pids. A command
    off the GPU (or on the way) holds nothing there, and a retry would only block in its locked
    driver: its waits are seen (no retry on their own either) and left out."""
    held = [0] * len(state)
    waiters: list[list[Waiter]] = [[] for _ in state]
    freeing = [False] * len(state)
    by_tenant: dict[tuple[int, int], int] = {}  # (gpu, tenant) -> shim bytes
    pids: dict[int, set[int]] = {}  # tenant -> its live pids
    swapped = node.swaps.swapped()
    for seg, s in node.slots():
        if not s.alive or not 0 <= s.gpu < len(state):
            continue
        if s.tenant in swapped:
            if s.mem_want:
                seg.mem_seen(s.index)
            continue
        held[s.gpu] += s.mem_bytes
        by_tenant[s.gpu, s.tenant] = by_tenant.get((s.gpu, s.tenant), 0) + s.mem_bytes
        pids.setdefault(s.tenant, set()).add(s.pid)
        if s.mem_want:
            owner = node.region_owner(s.gpu)
            waiters[s.gpu].append(Waiter(seg, s, owner is not None and owner.id == s.tenant))
        elif s.mem_bytes and s.tenant != state[s.gpu].room_for:
            # (A command whose region waits for room waits too: for that memory.)
            freeing[s.gpu] = True
    return held, waiters, freeing, by_tenant, pids


def _give_way(
    node: MemoryNode, gpu: int, waiters: list[Waiter], chosen: list[int], why: str
) -> tuple[list[int], list[int]]:
    """The deadlock's chosen commands give way: each taken off the GPU where it can be (its
    work kept), else preempted. Returns (preempted, swapped)."""
    # Each one's wait: what all its waiting processes ask for (put back with less, one is
    # served and the others wait again, a deadlock anew), since its oldest's began.
    slots: dict[int, list[SlotView]] = {}
    for w in waiters:
        slots.setdefault(w.slot.tenant, []).append(w.slot)
    wants = {t: (command_asks(ss), min(s.mem_since_ns for s in ss)) for t, ss in slots.items()}
    blocked = len(wants) - 1  # the others that wait while its memory goes out
    swaps = [t for t in chosen if node.swap_out(t, gpu, why, *wants[t], blocked)]
    return [t for t in chosen if t not in swaps and node.preempt(t, why)], swaps


def _newest(peaks: dict[str, int]) -> dict[str, int]:
    """At most _LEARNED_MAX of them, the latest written."""
    return peaks if len(peaks) <= _LEARNED_MAX else dict(list(peaks.items())[-_LEARNED_MAX:])


def _load(path: Path | None) -> tuple[dict[str, int], dict[str, int]]:
    """The learned peaks of commands and of families (keys prefixed FAMILY in the file)."""
    if path is None:
        return {}, {}
    try:
        with os.fdopen(open_beside(path, os.O_RDONLY), encoding="utf-8") as f:
            doc = json.loads(f.read())
    except FileNotFoundError:
        return {}, {}
    except (OSError, ValueError, TrustError) as e:
        log.warning("not using the learned peaks in %s: %s", path, e)
        return {}, {}
    if not isinstance(doc, dict):
        return {}, {}
    good = {k: v for k, v in doc.items() if isinstance(k, str) and type(v) is int and v > 0}
    families = {
        k.removeprefix(FAMILY): v
        for k, v in good.items()
        if k.startswith(FAMILY) and is_key(k.removeprefix(FAMILY))
    }
    return {k: v for k, v in good.items() if not k.startswith(FAMILY)}, families
