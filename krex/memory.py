"""Device memory under krex: who waits for memory, who is served next, and who may be admitted
(docs/memory.md).

The shim makes an allocation that failed for lack of memory wait instead of failing, when it
could have succeeded with the GPU to itself (shim/preload, docs/shim.md). This module is the
daemon's side:
- Order: per GPU, the waiters of a region's owner first, then every other waiter in the order
  its wait began. Only the head of that order is let retry (every tick), so memory freed goes to
  it; the others wait behind it.
- Deadlocks: when waiters exist and nothing was freed on the GPU for `deadlock_s` (for
  `ALL_WAITING_S` when no process that holds memory there could free it: all of them wait, or
  are frozen, or are idle pool workers), the youngest waiter that holds memory is released:
  its allocation fails once with the driver's error. A caching allocator (PyTorch, CuPy) then
  frees its cache and retries, which waits again, behind the others. One release per period,
  youngest first, a command's rerun (it already failed once for sharing) last.
- Room for a region: before a region's gate closes, its owner waits (at most `room_wait_s`)
  until the GPU has room for it free: `room` bytes, or what its processes gave back since
  their peak if more (a benchmark's region runs again what its warm-up ran, and a caching
  allocator that was released has freed its cache), since once its siblings are frozen
  nobody can free for it; meanwhile memory freed is not handed to other waiters, and
  deadlocks are broken for it as for a waiter.
- Admission: a GPU with waiters admits nobody; otherwise a command is admitted when the memory
  it is expected to need (`--mem`, else the peak learned from earlier runs of the same argv)
  fits beside what the GPU's tenants hold or are expected to need.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from krex.model import AdmitRequest, Gpu, Tenant
from krex.shm import SlotView

log = logging.getLogger("krex.daemon")

GIB = 1 << 30
_LEARNED_MAX = 10_000  # argv keys kept in the learned-peaks file
ALL_WAITING_S = 1.0  # the release period when nobody could free: time for a free in flight
_ROOM_POLL_S = 0.02


def argv_key(argv: Sequence[str]) -> str:
    """What 'the same command' means for learned peaks: the same argv."""
    return hashlib.sha256("\0".join(argv).encode()).hexdigest()[:32]


class Pokable(Protocol):
    """Where a process slot lives: what lets its memory waiter retry, or fails its wait."""

    def mem_grant(self, index: int) -> None: ...

    def mem_release(self, index: int) -> None: ...


Slots = Callable[[], Iterable[tuple[Pokable, SlotView]]]


@dataclass
class Waiter:
    seg: Pokable
    slot: SlotView
    owner: bool  # its tenant holds a region on the GPU


@dataclass
class GpuMemory:
    """One GPU's memory as the arbiter last saw it."""

    capacity: int
    held: int = 0  # bytes the tenants' processes hold (their allocations less frees)
    waiters: list[Waiter] = field(default_factory=list)
    progress_ns: int = 0  # last time memory was freed (or nobody waited)
    released_ns: int = 0  # last release
    releases: int = 0
    room_for: int = 0  # a tenant whose region waits for room before its gate closes (0: none)
    room_want: int = 0  # the bytes free it waits for
    others_can_free: bool = True  # some process holding memory here is running, not waiting

    def status(self, now_ns: int) -> dict[str, Any]:
        oldest = min((w.slot.mem_since_ns for w in self.waiters), default=0)
        return {
            "capacity_bytes": self.capacity,
            "held_bytes": self.held,
            "waiting": len(self.waiters),
            "oldest_wait_s": (now_ns - oldest) / 1e9 if oldest else 0.0,
            "releases": self.releases,
            "region_waits_for_room": self.room_for or None,
        }


class Memory:
    """The node's device memory: arbitration of waiters and memory-aware admission."""

    def __init__(
        self,
        gpus: Sequence[Gpu],
        slots: Slots,
        capacity: Sequence[int],
        *,
        headroom: int,
        deadlock_s: float,
        learned: Path | None,
        owner_of: Callable[[int], Tenant | None],
        owner_stuck: Callable[[int, float], None] = lambda gpu, waited_s: None,
        can_free: Callable[[int], bool] = lambda tenant: True,
        rerun: Callable[[int], bool] = lambda tenant: False,
        room: int = 0,
        room_wait_s: float = 10.0,
        device_free: Callable[[int], int | None] = lambda gpu: None,
    ) -> None:
        self.gpus = gpus
        self.slots = slots  # every process slot that is not free, with its segment
        self.state = [GpuMemory(capacity=c) for c in capacity]
        self.headroom = headroom
        self.deadlock_ns = int(deadlock_s * 1e9)
        self.learned_path = learned
        self.learned: dict[str, int] = _load(learned)
        self.owner_of = owner_of  # the tenant holding a region on a GPU, if any
        self.owner_stuck = owner_stuck  # that tenant has waited deadlock_s for nothing
        self.can_free = can_free  # a tenant that is running (not frozen, not the idle pool)
        self.rerun = rerun  # a tenant that is a command's rerun after a sharing failure
        self.room = room
        self.room_wait_s = room_wait_s
        self.device_free = device_free  # the driver's free bytes (NVML), None where unknown

    # The arbiter.
    def tick(self, now_ns: int) -> bool:
        """One look at every process slot: order the waiters, let the head of each GPU retry,
        break a deadlock. Returns whether anyone waits (the daemon then ticks faster)."""
        held = [0] * len(self.state)
        waiters: list[list[Waiter]] = [[] for _ in self.state]
        freeing = [False] * len(self.state)
        for seg, s in self.slots():
            if not s.alive or not 0 <= s.gpu < len(self.state):
                continue
            held[s.gpu] += s.mem_bytes
            if s.mem_want:
                owner = self.owner_of(s.gpu)
                waiters[s.gpu].append(Waiter(seg, s, owner is not None and owner.id == s.tenant))
            elif s.mem_bytes and not freeing[s.gpu] and self.can_free(s.tenant):
                freeing[s.gpu] = True
        anyone = False
        for i, st in enumerate(self.state):
            if held[i] < st.held or not st.waiters or len(waiters[i]) < len(st.waiters):
                # Memory came back, a waiter was served, or the waiting has just begun.
                st.progress_ns = now_ns
            st.held, st.others_can_free = held[i], freeing[i]
            st.waiters = sorted(waiters[i], key=lambda w: (not w.owner, w.slot.mem_since_ns))
            if st.room_for:
                anyone = True
            if not st.waiters:
                continue
            anyone = True
            head = st.waiters[0]
            if head.owner or not st.room_for or self.free(i) >= st.room_want:
                # While a region waits for room, what is freed stays free for it.
                head.seg.mem_grant(head.slot.index)
            self._break_deadlock(i, st, now_ns)
        return anyone

    def free(self, gpu: int) -> int:
        """The GPU's free bytes: the driver's where known, else its capacity less what the
        tenants' processes hold."""
        known = self.device_free(gpu)
        if known is not None:
            return known
        st = self.state[gpu]
        return max(0, st.capacity - st.held)

    async def make_room(self, gpu: int, owner: int) -> float:
        """Before tenant `owner`'s region closes the gate of `gpu`: wait, at most room_wait_s,
        until the room it wants (`room_for`) is free there (nothing to wait for when room is 0
        or the capacity unknown). Returns the seconds waited."""
        st = self.state[gpu]
        if self.room <= 0 or st.capacity <= 0 or st.room_for:
            return 0.0
        t0 = time.monotonic()
        st.room_for, st.room_want = owner, self.room_for(gpu, owner)
        try:
            while self.free(gpu) < st.room_want and time.monotonic() - t0 < self.room_wait_s:
                await asyncio.sleep(_ROOM_POLL_S)
        finally:
            st.room_for = st.room_want = 0
        return time.monotonic() - t0

    def room_for(self, gpu: int, owner: int) -> int:
        """The free bytes tenant `owner`'s region waits for on `gpu`: `room`, or what its
        processes there gave back since their peaks if more, within what admission can give."""
        regrow = sum(
            max(0, s.mem_peak - s.mem_bytes)
            for _, s in self.slots()
            if s.alive and s.tenant == owner and s.gpu == gpu
        )
        most = self.state[gpu].capacity - self.headroom
        return max(self.room, min(regrow, most))

    def _break_deadlock(self, gpu: int, st: GpuMemory, now_ns: int) -> None:
        stuck = now_ns - max(st.progress_ns, st.released_ns)
        period = self.deadlock_ns
        if not st.others_can_free:
            period = min(period, int(ALL_WAITING_S * 1e9))
        if stuck < period:
            return
        head = st.waiters[0]
        if head.owner:
            # A region's owner waits, and its frozen siblings cannot free until the region
            # ends: end it (revoked, with the reason), so that they run and free.
            st.released_ns = now_ns
            self.owner_stuck(gpu, (now_ns - head.slot.mem_since_ns) / 1e9)
            return
        # Youngest first: it has waited least, and its framework (a caching allocator) can free
        # what it holds and ask again. A rerun last: it already failed once for sharing. While
        # a region waits for room, the head is a candidate too (the region is ahead of it).
        candidates = st.waiters if st.room_for else st.waiters[1:]
        order = sorted(
            reversed(candidates), key=lambda w: self.rerun(w.slot.tenant)
        )  # stable: youngest first within each group
        for w in order:
            if w.slot.mem_bytes > 0 and w.slot.tenant != st.room_for:
                log.warning(
                    "GPU %d: no memory freed for %.1f s with %d waiting: releasing the wait of "
                    "process %d (tenant %d, holds %.2f GiB, wants %.2f GiB)",
                    gpu,
                    stuck / 1e9,
                    len(st.waiters),
                    w.slot.pid,
                    w.slot.tenant,
                    w.slot.mem_bytes / GIB,
                    w.slot.mem_want / GIB,
                )
                w.seg.mem_release(w.slot.index)
                st.released_ns, st.releases = now_ns, st.releases + 1
                return

    def waiting(self, gpu: int) -> bool:
        return bool(self.state[gpu].waiters)

    def status(self, gpu: int) -> dict[str, Any]:
        return self.state[gpu].status(time.monotonic_ns())

    # Admission.
    def expected(self, t: Tenant) -> int:
        """What t is expected to need: its declared budget, else its learned peak, else 0."""
        return self.need(t.argv, t.mem_declared, t.mem_rerun_need)

    def need(self, argv: Sequence[str], declared: int, rerun: int = 0) -> int:
        """What a command about to be admitted is expected to need (0: unknown): its declared
        budget, else its learned peak; for a rerun at least what its failed run showed."""
        return max(declared or self.learned.get(argv_key(argv), 0), rerun)

    def fits(self, g: Gpu, req: AdmitRequest, *, reserved: int = 0) -> bool:
        """Whether a command may be admitted to g now, as far as memory goes (`reserved`: the
        expected needs of commands already promised a slot there)."""
        alone = not g.tenants and reserved == 0 and g.reserved == 0
        if self.waiting(g.index) or any(x.mem_alone for x in g.tenants):
            return False  # waiters first; a memory retry has the GPU's memory to itself
        if req.alone:
            return alone
        need = self.need(req.argv, req.mem, req.rerun_need)
        capacity = self.state[g.index].capacity
        if need == 0 or capacity == 0 or alone:
            return True  # unknown, or alone: it gets the GPU whatever it was expected to need
        busy = reserved + sum(max(self.expected(x), self._held_by(x)) for x in g.tenants)
        return busy + need <= capacity - self.headroom

    def too_large(self, declared: int, gpu: int) -> bool:
        """A declared budget the GPU cannot give even to a command alone on it."""
        capacity = self.state[gpu].capacity
        return capacity > 0 and declared > capacity

    def _held_by(self, t: Tenant) -> int:
        return sum(s.mem_bytes for _, s in self.slots() if s.tenant == t.id and s.alive)

    def learn(self, t: Tenant, peak: int) -> None:
        """Remember a finished command's peak (the most of its runs) for its argv."""
        if peak <= 0 or self.learned_path is None:
            return
        key = argv_key(t.argv)
        if peak <= self.learned.get(key, 0):
            return
        self.learned[key] = peak
        if len(self.learned) > _LEARNED_MAX:
            self.learned = dict(list(self.learned.items())[-_LEARNED_MAX:])
        with contextlib.suppress(OSError):
            tmp = self.learned_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.learned))
            os.replace(tmp, self.learned_path)


def _load(path: Path | None) -> dict[str, int]:
    if path is None:
        return {}
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(doc, dict):
        return {}
    return {k: v for k, v in doc.items() if isinstance(k, str) and type(v) is int and v > 0}
