"""What the region protocol does to a node: `Machinery`, the interface krex/daemon/regions.py runs
its steps through, and `NodeMachinery`, this node's: real gates, slot segments, tenant groups
(cgroups or signals), NVML and, on a simulated node, the simulated driver."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from krex.core.config import Config
from krex.core.nvml import Nvml
from krex.core.procs import running
from krex.core.shm import Gate, SlotView
from krex.core.tenants import TenantsError
from krex.daemon.fidelity import PowerHistory
from krex.daemon.gate import Hold, quiesce_and_drain
from krex.daemon.model import Gpu, Tenant
from krex.daemon.segments import Segments
from krex.sim import simgpu, simnode

log = logging.getLogger("krex.daemon")

_SETTLE_TRIES = 200
# A region settles (regions.settle_s) only after siblings' work this recent on its GPU.
SETTLE_LOOKBACK_S = 1.0
# A sample's timestamp against the end of the period it shows (NVML records samples a little
# after their period, and the grant's time is the daemon's): an allowance, not measured.
NVML_MARGIN_S = 0.25
_SUBMITS_KEEP_S = 3.0  # ticks kept: enough for one at or before SETTLE_LOOKBACK_S ago


class SubmitHistory:
    """Each live process's count of intercepted driver calls (its slot's `intercepted`), noted
    at the daemon's once-a-second tick: whether a sibling submitted work to the GPU lately,
    where NVML cannot say (no NVML, the simulated GPU; under MPS its samples name the server,
    not the client). A count that moved since the newest tick at least `since` ago did so in
    the last one to two seconds. Noted on the event loop, read from the executor: locked."""

    def __init__(self) -> None:
        self._ticks: deque[tuple[float, dict[tuple[int, int], int]]] = deque()
        self._lock = threading.Lock()

    def note(self, t: float, slots: Iterable[SlotView]) -> None:
        snap = {(s.tenant, s.pid): s.intercepted for s in slots if s.alive}
        with self._lock:
            self._ticks.append((t, snap))
            while self._ticks and t - self._ticks[0][0] > _SUBMITS_KEEP_S:
                self._ticks.popleft()

    def moved(self, slots: Iterable[SlotView], since: float) -> bool:
        """Whether any of these processes' counts differ from the newest tick at or before
        `since` (monotonic); a process that tick did not know counts from 0 (it is newer, or
        the daemon is): any call of it is recent."""
        base: dict[tuple[int, int], int] = {}
        with self._lock:
            for t, snap in self._ticks:
                if t <= since:
                    base = snap
        return any(s.intercepted != base.get((s.tenant, s.pid), 0) for s in slots)


def _on(s: SlotView, gpu: int) -> bool:
    return s.gpu == gpu or bool(s.gpus & (1 << gpu))


def unvouched(active: set[int], owner: set[int], gated: set[int]) -> list[int]:
    """Of the pids NVML's process samples saw working on a GPU since a region's grant, those
    the region cannot vouch for: neither the owner's nor a sibling process that holds a gated
    slot. Such a sibling was drained before the grant and gated since; a sample that overlaps
    the grant (they cover about 1/6 s each) shows its work from before it, not during the
    region (seen on the H200: 7-8 of 31 short autotuning regions flagged so, falsely). Its
    samples stamped clearly after the grant are `late`'s."""
    return sorted(active - owner - gated)


def _by_tenant(pids: Iterable[int], tenant_of: dict[int, int]) -> dict[int, list[int]]:
    """Those of `pids` that `tenant_of` knows, sorted, per tenant in id order."""
    out: dict[int, list[int]] = {}
    for p in sorted(pids):
        if p in tenant_of:
            out.setdefault(tenant_of[p], []).append(p)
    return dict(sorted(out.items()))


def late(samples: dict[int, float], drained: set[int], since: float, period: float) -> list[int]:
    """Of the `drained` pids (processes of siblings drained and gated before the grant at
    `since`), those NVML sampled working later than since + period + NVML_MARGIN_S (`samples`:
    pid -> its latest work sample's timestamp, wall-clock). A sample shows the sampling period
    before its timestamp, so one stamped that late shows work after the grant: the sibling
    acknowledged a drain it had not done, or worked while it should have been frozen. One
    stamped earlier may show the work it drained (on the H200 7-8 of 31 short regions were
    called unclean so, falsely, before the drained siblings' samples were left out)."""
    cutoff = since + period + NVML_MARGIN_S
    return sorted(p for p in drained if samples.get(p, 0.0) > cutoff)


class Machinery(Protocol):
    """The effects of the protocol's steps on the node. Methods marked blocking run in a
    worker thread; each wait in them is bounded."""

    def close_gate(self, gpu: int, owner: int, deadline_s: float) -> int:
        """Step 1: close the gate to everyone but owner; returns the new epoch."""

    def open_gate(self, gpu: int) -> None:
        """Open the gate and wake the submissions blocked at it."""

    def quiesce_and_drain(self, hold: Hold, skip: set[int]) -> None:
        """Steps 2 and 3 for hold's GPU, leaving out the tenants in skip (frozen by a live
        region: nothing of theirs can be in flight); fills in hold. Blocking."""

    def freeze(self, tenant: Tenant) -> bool:
        """Step 4 for one sibling: whether it is frozen (or gone), as far as regions.freeze
        asks (all its processes, or those that may reach the GPU). Blocking."""

    def awake(self, tenant: Tenant) -> int:
        """How many of the tenant's processes its freeze left running."""

    def thaw(self, tenant: Tenant) -> None:
        """Undo step 4 for one tenant."""

    def frozen_holds(self, frozen: list[Tenant]) -> list[str]:
        """After the freeze: make sure no frozen tenant holds something the owner needs (the
        simulated driver's lock); the problems left. Blocking."""

    def pin(self, tenant: Tenant, cores: set[int]) -> None:
        """Step 5: move the tenant's threads onto cores. KrexError when it cannot."""

    def settle_idle(self, gpu: int, siblings: list[Tenant], settle_s: float) -> float:
        """Step 5b: idle settle_s where the platform saw any of `siblings` work on the GPU in
        the last SETTLE_LOOKBACK_S (or submit to it, in the last one to two seconds); returns
        the seconds idled. Blocking."""

    def has_processes(self, tenant: Tenant) -> bool:
        """Whether the tenant's group holds any process (an empty pool is not frozen)."""

    def foreign(self, gpu: int) -> set[int]:
        """Processes on the GPU that krex does not manage. Blocking."""

    def audit(self, gpu: int, owner: Tenant, since: float | None = None) -> list[str]:
        """What may run on the GPU beside the owner without krex's say (foreign processes,
        tenants' processes with no slot, drivers loaded apart; with `since`, a wall-clock
        time, GPU work of others since then where the platform records it): the problems.
        Blocking."""

    def clock(self, gpu: int) -> dict[str, int] | None:
        """The GPU's SM clock and throttle reasons now, with its power counters and the mean
        power before now where known (krex/daemon/fidelity.py); None where unknown."""

    def memory_split(self, gpu: int, owner: Tenant) -> tuple[int, int] | None:
        """(the owner's, everyone else's) device bytes on the GPU now; None where unknown."""

    def memory_problems(self, tenant: Tenant) -> list[str]:
        """Problems of the tenant's regions as far as memory goes (shared out-of-memory errors
        that reached it)."""


class AllUsers:
    """The processes any GPU lists as its users (NVML's), for regions.freeze = contexts: a
    region's siblings freeze in parallel and each asks, so one read is kept while a gate is
    closed and no gate changed since (while closed no new context is made: the shim's context
    creation passes the gate); a new close or an open reads afresh."""

    def __init__(
        self, segments: Segments, gpus: Sequence[Gpu], users: Callable[[int], set[int] | None]
    ) -> None:
        self._segments, self._gpus, self._users = segments, gpus, users
        self._memo: tuple[tuple[Gate, ...], set[int] | None] | None = None
        self._lock = threading.Lock()

    def read(self) -> set[int] | None:
        """Their union; None where one GPU's users are unknown."""
        key = tuple(self._segments.gates.gate(g.index) for g in self._gpus)
        with self._lock:  # the first freeze reads, the others wait for its answer
            if self._memo is not None and self._memo[0] == key and any(g.owner for g in key):
                return self._memo[1]
            seen = [self._users(g.index) for g in self._gpus]
            known = [u for u in seen if u is not None]
            users = set[int]().union(*known) if len(known) == len(seen) else None
            self._memo = (key, users)
            return users


class NodeMachinery:
    """The node's gates, drains, freezer, pinning, foreign-process check and clocks."""

    def __init__(
        self, cfg: Config, gpus: Sequence[Gpu], segments: Segments, nvml: Nvml | None
    ) -> None:
        self.cfg = cfg
        self.gpus = gpus
        self.segments = segments
        self.nvml = nvml
        self.sim_shm = simnode.segment_name(segments.gates.name) if cfg.sim else None
        # Whether a pid is a helper of krex's own on the GPU (its MPS server, krex/daemon/mps.py):
        # not foreign, and its work is the tenants' (set by the daemon when it starts MPS).
        self.helper: Callable[[int], bool] = lambda pid: False
        self.power = PowerHistory()
        self.submits = SubmitHistory()
        self.all_users = AllUsers(segments, gpus, self.users)

    def tick(self) -> None:
        """Note each GPU's energy counter and each process's intercepted calls (the daemon's
        once-a-second tick)."""
        self.submits.note(time.monotonic(), (s for _, s in self.segments.live_slots()))
        if self.nvml is None:
            return
        for g in self.gpus:
            s = self.nvml.sample(g.index)
            if s is not None and "energy_mj" in s:
                self.power.note(g.index, time.monotonic(), s["energy_mj"])

    def close_gate(self, gpu: int, owner: int, deadline_s: float) -> int:
        return self.segments.gates.gate_close(gpu, owner, deadline_s=deadline_s)

    def open_gate(self, gpu: int) -> None:
        self.segments.gates.gate_open(gpu)

    def quiesce_and_drain(self, hold: Hold, skip: set[int]) -> None:
        quiesce_and_drain(
            self.segments.to_drain(skip),
            hold,
            quiesce_timeout_s=self.cfg.quiesce_timeout_s,
            drain_timeout_s=self.cfg.drain_timeout_s,
        )

    def freeze(self, tenant: Tenant) -> bool:
        try:
            return tenant.group.freeze(self.cfg.freeze_timeout_s, _contextless(self, tenant))
        except TenantsError as e:  # e.g. it left while the region was being set up
            log.warning("freezing tenant %d failed: %s", tenant.id, e)
            return tenant.gone

    def awake(self, tenant: Tenant) -> int:
        with contextlib.suppress(TenantsError):
            return len(tenant.group.awake())
        return 0

    def thaw(self, tenant: Tenant) -> None:
        with contextlib.suppress(TenantsError):
            tenant.group.thaw()

    def frozen_holds(self, frozen: list[Tenant]) -> list[str]:
        """On a simulated node, never leave a sibling frozen inside the simulated driver's
        shared lock (shim/sim/krexsim.h): thaw it a moment and freeze it again."""
        if self.sim_shm is None:
            return []
        for _ in range(_SETTLE_TRIES):
            holders = simnode.lock_holders(self.sim_shm)
            stuck = [s for s in frozen if holders & set(s.group.pids())]
            if not stuck:
                return []
            for s in stuck:
                s.group.thaw()
            time.sleep(0.0005)
            for s in stuck:
                self.freeze(s)
        return ["a frozen tenant kept the simulated driver's lock"]

    def pin(self, tenant: Tenant, cores: set[int]) -> None:
        tenant.group.pin(cores)

    def settle_idle(self, gpu: int, siblings: list[Tenant], settle_s: float) -> float:
        if settle_s <= 0 or not self._worked(gpu, siblings):
            return 0.0
        t0 = time.monotonic()
        time.sleep(settle_s)
        return time.monotonic() - t0

    def _worked(self, gpu: int, siblings: list[Tenant]) -> bool:
        """Whether the siblings worked on the GPU lately: NVML's process samples (about every
        1/6 s) of the last SETTLE_LOOKBACK_S name one of their processes, or one of their
        processes on the GPU made a driver call the shim counted since the tick at least that
        long ago (without NVML, and under MPS, where NVML names the server)."""
        if self.nvml is not None:
            active = self.nvml.active(gpu, time.time() - SETTLE_LOOKBACK_S)
            if active & {p for s in siblings for p in _pids(s)}:
                return True
        ids = {s.id for s in siblings}
        mine = [s for _, s in self.segments.live_slots() if s.tenant in ids and _on(s, gpu)]
        return self.submits.moved(mine, time.monotonic() - SETTLE_LOOKBACK_S)

    def has_processes(self, tenant: Tenant) -> bool:
        return bool(tenant.group.pids())

    def foreign(self, gpu: int) -> set[int]:
        """Processes using the GPU that krex does not manage (seen through NVML, or through
        the simulated node); only those visible in our pid namespace."""
        users = self.users(gpu)
        return self._foreign(gpu, users) if users else set()

    def audit(self, gpu: int, owner: Tenant, since: float | None = None) -> list[str]:
        users = self.users(gpu)
        slots = [s for _, s in self.segments.live_slots() if s.alive]
        problems: list[str] = []
        if users:
            if foreign := self._foreign(gpu, users):
                # Not gated, not drained, not frozen: the region cannot vouch for the GPU.
                problems.append(f"foreign GPU process(es) {sorted(foreign)} on GPU {gpu}")
            for t, pids in _slotless(self.gpus[gpu], users, {s.pid for s in slots}).items():
                problems.append(
                    f"process(es) {pids} of tenant {t} use GPU {gpu} without the krex shim (no "
                    "slot: started without LD_PRELOAD, or after its segment was removed): "
                    "their work is neither gated nor drained"
                )
        ungated = sorted(s.pid for s in slots if s.ungated and s.tenant != owner.id and _on(s, gpu))
        if ungated:
            problems.append(
                f"process(es) {ungated} on GPU {gpu} reach a GPU driver past the shim (loaded "
                "apart with dlmopen, a second copy of the driver, or RTLD_DEEPBIND references "
                "it could not route; the process's warning names the library): its work is "
                "neither gated nor drained"
            )
        if self.sim_shm is not None:
            problems += self._sim_drained(self.sim_shm, gpu, owner, slots, since)
        if since is not None and self.nvml is not None:
            problems += self._sampled(gpu, owner, slots, since)
        return problems

    def _sampled(self, gpu: int, owner: Tenant, slots: list[SlotView], since: float) -> list[str]:
        """What NVML's process samples since the grant (`since`) say: work of processes the
        region cannot vouch for, and work of a drained sibling later than a sample overlapping
        the grant can show (`late`)."""
        assert self.nvml is not None
        seen = self.nvml.work_samples(gpu, since)
        if not seen:
            return []
        mine = set(_pids(owner))
        gated = {s.pid: s.tenant for s in slots if not s.ungated and s.tenant != owner.id}
        problems = []
        if others := [p for p in unvouched(set(seen), mine, set(gated)) if self._stranger(p)]:
            problems.append(
                f"GPU work of process(es) {others} on GPU {gpu} during the region "
                "(NVML's process samples)"
            )
        after = late(seen, set(gated) - mine, since, self.nvml.sample_period(gpu))
        problems += [
            f"process(es) {ps} of tenant {t} had GPU work running on GPU {gpu} after its "
            "drain was acknowledged (NVML's process samples)"
            for t, ps in _by_tenant(after, gated).items()
        ]
        return problems

    def _siblings(self, gpu: int, owner: Tenant, slots: list[SlotView]) -> dict[int, int]:
        """The processes of the GPU's other tenants (its idle pool's included), each with its
        tenant's id: those a region's drain and freeze answer for."""
        g = self.gpus[gpu]
        mine = set(_pids(owner))
        out: dict[int, int] = {}
        for t in [*g.tenants, *([g.pool_tenant] if g.pool_tenant else [])]:
            if t is not owner and t.id != owner.id:
                out.update((p, t.id) for p in _pids(t))
        for s in slots:
            if s.tenant != owner.id and _on(s, gpu):
                out.setdefault(s.pid, s.tenant)
        return {p: t for p, t in out.items() if p not in mine}

    def _sim_drained(
        self, sim_shm: str, gpu: int, owner: Tenant, slots: list[SlotView], since: float | None
    ) -> list[str]:
        """Whether the siblings' drain held, by the simulated driver's own record rather than
        their acknowledgements (which each writes in a segment of its own): a sibling's process
        with work queued or running on the GPU now, or (with `since`, a wall-clock time) whose
        work there completed since then, ran beside the owner after it said it had drained."""
        since_mono = None if since is None else time.monotonic() - (time.time() - since)
        seen = simnode.busy(sim_shm, gpu, since_mono)
        if seen is None:
            return [f"the simulated driver's record of GPU {gpu} could not be read: the "
                    "siblings' drain is unconfirmed"]  # fmt: skip
        pids, lost = seen
        problems = [
            f"process(es) {ps} of tenant {t} had GPU work running on GPU {gpu} after its "
            "drain was acknowledged (the simulated driver's record)"
            for t, ps in _by_tenant(pids, self._siblings(gpu, owner, slots)).items()
        ]
        if lost:
            problems.append(
                f"the simulated driver's record of GPU {gpu} lost who completed work during "
                "the region (more processes than it keeps): a sibling's cannot be ruled out"
            )
        return problems

    def users(self, gpu: int) -> set[int] | None:
        """The processes the GPU lists as its users (NVML's, or the simulated node's); None
        where unknown."""
        if self.sim_shm is not None:
            return simnode.users(self.sim_shm, gpu)
        return self.nvml.processes(gpu) if self.nvml is not None else None

    def _foreign(self, gpu: int, users: set[int]) -> set[int]:
        g = self.gpus[gpu]
        ours = {os.getpid(), *(w.proc.pid for w in g.pool)}
        for t in [*g.tenants, *([g.pool_tenant] if g.pool_tenant else [])]:
            ours.update(_pids(t))
        return {p for p in users - ours if self._stranger(p)}

    def _stranger(self, pid: int) -> bool:
        """A live process that is not a helper of krex's own (its MPS server): one whose GPU
        work nobody vouched for, unless it is a tenant's."""
        return running(pid) and not self.helper(pid)

    def clock(self, gpu: int) -> dict[str, int] | None:
        s = self.nvml.sample(gpu) if self.nvml is not None else None
        if s is not None and "energy_mj" in s:
            before = self.power.mean_w(gpu, time.monotonic(), s["energy_mj"])
            if before is not None:
                s["power_w_before"] = round(before)
        return s

    def device_users(self, gpu: int) -> dict[int, int] | None:
        """The driver's device bytes per process on the GPU (NVML's, or the simulated
        driver's), krex's own helpers (its MPS server) left out; None where unknown."""
        if self.sim_shm is not None:
            return simgpu.mem_users(self.sim_shm, gpu)
        used = self.nvml.process_memory(gpu) if self.nvml is not None else None
        return None if used is None else {p: b for p, b in used.items() if not self.helper(p)}

    def memory_problems(self, tenant: Tenant) -> list[str]:
        """Why the tenant's timings may not be what it would measure alone, as far as memory
        goes: out-of-memory errors only sharing caused reached it (a library that gets one may
        take a slower path, docs/memory.md)."""
        n = self.segments.totals(tenant).mem_oom_shared
        if not n:
            return []
        return [
            f"{n} out-of-memory error(s) that only sharing caused reached the command before "
            "this region ended (a wait for memory ran out of time): what it measured may be a "
            "slower path it took for want of memory"
        ]

    def memory_split(self, gpu: int, owner: Tenant) -> tuple[int, int] | None:
        # NVML's per-process figure where there is one (contexts and what the shim does not
        # see included); else what the shims counted (the simulated GPU).
        mine = set(_pids(owner))
        used = self.nvml.process_memory(gpu) if self.nvml is not None else None
        if used is not None:
            # krex's own helper (the MPS server) is no one's neighbour: its bytes are neither.
            own = sum(b for p, b in used.items() if p in mine)
            return own, sum(b for p, b in used.items() if p not in mine and not self.helper(p))
        own = others = 0
        for _, s in self.segments.live_slots():
            if s.alive and _on(s, gpu):
                if s.tenant == owner.id or s.pid in mine:
                    own += s.mem_bytes
                else:
                    others += s.mem_bytes
        return own, others


def _contextless(m: NodeMachinery, tenant: Tenant) -> set[int]:
    """With regions.freeze = contexts, the tenant's processes a region may leave running:
    those that hold no slot, are not among the processes that found no free slot, and no GPU
    lists as its user. They cannot put work on the GPU (a context is made only through the
    shim, which takes a slot first and waits at the gate) and run on the shared cores. None
    with `all`, for the idle pool (frozen whole), or where a GPU's users or the overflowing
    processes are not all known."""
    if m.cfg.region_freeze != "contexts" or any(g.pool_tenant is tenant for g in m.gpus):
        return set()
    busy = {s.pid for _, s in m.segments.live_slots()}  # dead or not: never awake
    for seg in m.segments.all():
        count, recorded = seg.overflow
        if count > len(recorded):
            return set()  # some that found no slot are unnamed
        busy.update(recorded)
    users = m.all_users.read()
    if users is None:
        return set()
    return set(_pids(tenant)) - busy - users


def _slotless(g: Gpu, users: set[int], slotted: set[int]) -> dict[int, list[int]]:
    """Per tenant of GPU g, its processes that use it but hold no live slot (`slotted`: the
    pids that hold one)."""
    out: dict[int, list[int]] = {}
    for t in [*g.tenants, *([g.pool_tenant] if g.pool_tenant else [])]:
        bare = sorted(p for p in _pids(t) if p in users and p not in slotted and running(p))
        if bare:
            out[t.id] = bare
    return out


def _pids(t: Tenant) -> list[int]:
    """t's processes (none once its group is gone)."""
    with contextlib.suppress(TenantsError):
        return t.group.pids()
    return []
