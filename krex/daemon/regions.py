"""The region protocol and its scheduler: the only writer of region state.

docs/architecture.md walks through it. Per GPU there is a FIFO of region requests; a region is
taken on one GPU at a time, in index order, by the steps close (gate), quiesce and drain,
freeze, pin; it is granted once it holds all of its tenant's GPUs and ends on all of them at
once (exit, owner gone, time-out, tenant gone, daemon stopping). Requests of the owner's other
threads nest into its region at once. A request waits at most (requests ahead of it) x (their
time-outs): no tenant starves.

What each step does to the node comes in through `Machinery` (krex/daemon/machinery.py, beside the
node's own), so the protocol is tested against fakes (tests/test_regions.py). Its blocking
methods run in worker threads, everything else on the daemon's event loop, so region state
needs no lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NamedTuple, Protocol

from krex.core import wire
from krex.core.errors import KrexError, ProtocolError
from krex.core.nvml import throttled
from krex.daemon import fidelity
from krex.daemon.fidelity import GIB
from krex.daemon.gate import Hold
from krex.daemon.machinery import Machinery
from krex.daemon.model import Gpu, Region, RegionRequest, Tenant, gpu_names
from krex.daemon.tasks import spawn

log = logging.getLogger("krex.regions")

# A record's entry_steps_s: the protocol's steps (the pin begins after the room step and
# runs beside quiesce, drain, freeze and settle; the audit and the sample run beside the grant).
ENTRY_STEPS = ("room", "quiesce", "drain", "freeze", "pin", "audit", "settle", "sample")
# The grant's audit and samples are joined at the region's end; past this they count as failed.
CHECKS_WAIT_S = 5.0
EXIT_STEPS = ("audit", "pin_back", "thaw", "open")  # a record's exit_steps_s, in order
GATE_GRACE_S = 30.0  # blocked threads pass on their own this long after a region's time-out


class _Last(NamedTuple):
    """A GPU's last region to end: whose, when its siblings had the GPU back (the thaw,
    time.monotonic()), and whether it ran into the power limit (_settle's gap rule)."""

    tenant: int
    t_back: float
    capped: bool


class _Queue:
    """Region state of one GPU."""

    def __init__(self) -> None:
        self.requests: deque[RegionRequest] = deque()
        self.region: Region | None = None  # holds this GPU
        self.pending: Region | None = None  # being set up on this GPU
        self.last: _Last | None = None  # the last region to end here


class Room(Protocol):
    """Step 0 (krex/daemon/memory.py, Memory is one): before the gates close, wait, bounded,
    until the GPU has room in its memory for the owner (its frozen siblings could not free any
    for it); returns the seconds waited."""

    async def make_room(self, gpu: int, owner: int) -> float: ...


class SwapsView(Protocol):
    """The commands swapped off a GPU (krex/daemon/swap.py's Swaps): their processes are
    locked, with nothing on the GPU (no drain asks them: they would block in the driver), and
    while one's memory moves no region may begin on its GPU."""

    def swapped(self) -> set[int]: ...

    async def idle(self, gpu: int) -> float: ...


class Regions:
    """Schedules and runs the regions of one node's GPUs."""

    def __init__(
        self,
        gpus: Sequence[Gpu],
        machinery: Machinery,
        room: Room | None = None,
        on_record: Callable[[Tenant, dict[str, Any]], None] = lambda t, rec: None,
        swaps: SwapsView | None = None,
    ) -> None:
        self.gpus = gpus
        self.m = machinery
        self.room = room
        self.swaps = swaps
        self.on_record = on_record  # each ended region's record (metrics)
        self._q = [_Queue() for _ in gpus]
        # The grant's audit and samples (NVML reads), off the event loop and off the grant's
        # path: their own threads, joined when the region ends.
        self._checks = ThreadPoolExecutor(max_workers=4, thread_name_prefix="krex-grant-check")
        self._checking: list[Future[Any]] = []  # those begun and perhaps not ended (busy())

    # What others read.
    def held(self, gpu: int) -> Region | None:
        """The region holding the GPU (granted, or holding it while it takes its others)."""
        return self._q[gpu].region

    def setting_up(self, gpu: int) -> Region | None:
        return self._q[gpu].pending

    def queued(self, gpu: int) -> int:
        return len(self._q[gpu].requests)

    def busy(self) -> bool:
        """Whether a region is being set up anywhere, or a grant's checks still run (their
        threads use the segments: none may be unmapped meanwhile, Segments.account)."""
        self._checking = [f for f in self._checking if not f.done()]
        return bool(self._checking) or any(q.pending is not None for q in self._q)

    def still_frozen(self) -> set[int]:
        """Tenants listed frozen by a live region. Such a region closed its gate to them and
        drained them (every context they use) before it listed them, and they cannot submit
        again until it ends: there is nothing of theirs to quiesce or drain."""
        return {s.id for r in self._live() for s in r.frozen}

    def cores(self, t: Tenant) -> set[int]:
        """Where t runs: the region cores of the GPUs its region holds, else the shared cores
        of its GPUs."""
        if t.region is not None and t.region.gpus and not t.region.ended:
            return _region_cores(self.gpus, t.region.gpus)
        return {c for i in t.gpus for c in self.gpus[i].slice.shared_cores}

    # Requests.
    async def acquire(
        self,
        t: Tenant,
        wait: Callable[[asyncio.Future[Region]], Awaitable[None]],
        pid: int | None = None,
        candidate: bool = False,
    ) -> Region:
        """t's region, granted on all of t's GPUs; `wait` waits for one GPU's grant and raises
        when the requester goes away (then everything this request holds is let go). `pid`,
        the asking process, goes into the record's `pids`; `candidate`: an autotuner's
        candidate benchmark asks (a region it begins gets no power-capped settle)."""
        loop = asyncio.get_running_loop()
        t_request = time.monotonic()
        mine: Region | None = None  # the region this request is a holder of
        # Its GPUs in index order: every command takes them in the same order, so no two wait
        # for each other (a request waits only for GPUs above those it holds).
        for i in t.gpus:
            req = RegionRequest(
                tenant=t, t_request=t_request, granted=loop.create_future(), candidate=candidate
            )
            q = self._q[i]
            q.requests.append(req)
            self._schedule(i)
            try:
                await wait(req.granted)
                region = req.granted.result()  # ConnectionError when taking this GPU failed
            except BaseException:
                if req in q.requests:
                    q.requests.remove(req)
                elif not req.granted.done():
                    req.granted.cancel()  # being set up: _take lets it go again
                elif mine is None and not req.granted.cancelled():
                    mine = req.granted.result() if req.granted.exception() is None else None
                if mine is not None:
                    self.release(mine, why="owner gone")
                raise
            mine = mine or region  # the first GPU's grant made us one of its holders
        if mine is None or mine.ended:
            raise ProtocolError("the region ended before it was granted")
        if pid is not None and pid not in mine.pids:
            mine.pids.append(pid)
        return mine

    def release(
        self, r: Region, why: str, calls: Mapping[str, int] | None = None
    ) -> dict[str, Any]:
        """One holder of region r is done (`calls`: its markers, from its region_end); the
        region ends with its last holder."""
        for name, n in (calls or {}).items():
            wire.add_call(r.calls, name, n)  # several holders' names share the same bounds
        if r.ended:
            # Already finished (revoked, or the tenant left): report what it was.
            if r.record is not None and r.calls:
                r.record["calls"] = dict(r.calls)  # the same dict as in t.regions
            return r.record or _record(r, time.monotonic(), self.m)
        r.holders -= 1
        if r.holders > 0:
            return _record(r, time.monotonic(), self.m)
        return self.finish(r, revoked=False, why=why)

    # Tenants coming and going.
    def tenant_joined(self, t: Tenant) -> asyncio.Task[None] | None:
        """t has a new process: where another tenant holds (or is taking) one of t's GPUs, t
        is listed frozen at once, so that whatever ends that region thaws it, and frozen in a
        worker thread (the task returned); while the region drains, at its freeze step."""
        joined = [r for r in self._live(t.gpus) if r.tenant is not t and t not in r.frozen]
        for r in joined:
            r.frozen.append(t)
        now = [r for r in joined if not r.draining]
        for r in joined:
            if r.draining:
                r.deferred.append(t)
        if not now:
            return None
        return asyncio.get_running_loop().create_task(self._freeze_joined(t, now))

    async def _freeze_joined(self, t: Tenant, regions: list[Region]) -> None:
        ok = await asyncio.get_running_loop().run_in_executor(None, self.m.freeze, t)
        for r in regions:
            if r.ended or r not in self._live():
                # It ended (or let this GPU go) while we froze: its thaw may have come first.
                if t in r.frozen:
                    r.frozen.remove(t)
                self._thaw(t)
            elif not ok:
                r.problems.append(f"tenant {t.id} admitted during the region did not freeze")
            else:
                r.awake += self.m.awake(t)

    def tenant_left(self, t: Tenant) -> None:
        """t is gone: its requests are dropped, its region ends, no region lists it."""
        for i in t.gpus:
            q = self._q[i]
            for req in [x for x in q.requests if x.tenant is t]:
                q.requests.remove(req)
                if not req.granted.done():
                    req.granted.cancel()
        if t.region is not None:
            self.finish(t.region, revoked=False, why="tenant finished")
        for r in self._live():
            if t in r.frozen:
                r.frozen.remove(t)

    async def shutdown(self, bound_s: float) -> None:
        """Let regions being set up finish (each wait is bounded), then end every region."""
        deadline = time.monotonic() + bound_s
        while self.busy() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        for q in self._q:
            if q.region is not None:
                self.finish(q.region, revoked=True, why="daemon stopping")

    # The protocol.
    def _schedule(self, gpu: int) -> None:
        """Start setting up the next region on the GPU, unless one is set up there now."""
        q = self._q[gpu]
        while q.pending is None and q.requests:
            r = q.region
            if r is not None:
                # Other threads of the owner nest into its region at once (counted once, on
                # its first GPU: a thread asks for each of the owner's GPUs in turn).
                for req in [x for x in q.requests if x.tenant is r.tenant]:
                    q.requests.remove(req)
                    if gpu == r.tenant.gpus[0]:
                        r.holders += 1
                    req.granted.set_result(r)
                return
            req = q.requests.popleft()
            t = req.tenant
            if t.region is None or t.region.ended:
                if gpu != t.gpus[0]:
                    # Its region ended (revoked, or its holders left) while this request waited.
                    _fail(req, "the region ended while waiting")
                    continue
                t.region = Region(tenant=t, t_request=req.t_request, candidate=req.candidate)
            # Pending from the start: a tenant that joins while it is set up is frozen into
            # it (tenant_joined), never left running beside it.
            q.pending = t.region
            spawn(self._take(gpu, req, t.region), f"region set-up on GPU {gpu}")

    async def _take(self, gpu: int, req: RegionRequest, r: Region) -> None:
        """Steps 1-5 on one GPU of region r; then grant, or let the GPU go and fail req."""
        q, t = self._q[gpu], r.tenant
        siblings: list[Tenant] = []  # those this GPU's freeze listed in r.frozen
        try:
            if t.region is not r:  # it ended (its tenant left) before its set-up began
                q.pending = None
                _fail(req, "the region ended while waiting")
                return
            r.t_setup = r.t_setup or time.monotonic()
            beside: list[asyncio.Future[Any]] = []  # the pin (beside the steps), then the audit
            try:
                r.room_s += await _make_room(self.room, gpu, t)
                if self.swaps is not None:
                    # (A deadlock broken while it made room may have begun a swap: its copies
                    # end before the region's kernels run.)
                    r.room_s += await self.swaps.idle(gpu)
                # The owner moves onto this GPU's region cores beside the gate, drain and
                # freeze: they are nobody else's while its set-up runs (one region a GPU), and
                # the owner only waits for its grant meanwhile.
                cores = _region_cores(self.gpus, [*r.gpus, gpu])  # cores(t) once this GPU is r's
                beside.append(_step(r, "pin", self.m.pin, t, cores))
                skip = self.still_frozen() | (self.swaps.swapped() if self.swaps else set())
                hold = await _close_and_drain(self.m, gpu, r, skip=skip)
                await self._freeze(gpu, r, siblings)
                await _settle(self.m, gpu, r, siblings, q.last)
                await self._pin(gpu, r, hold, beside)
            except Exception as e:
                log.exception("opening a region for tenant %d on GPU %d failed", t.id, gpu)
                # What runs beside ends first: a pin landing after _let_go's pin-back would
                # leave the owner on the region cores.
                await asyncio.gather(*beside, return_exceptions=True)
                self._let_go(gpu, r, siblings)
                if not r.gpus:
                    r.ended = True  # nothing held: the region never was
                    if t.region is r:
                        t.region = None
                _fail(req, str(e))
                return
            q.pending = None
            if r.ended:
                # Its holders left (or it was revoked) while this GPU was being taken.
                self._let_go(gpu, r, siblings)
                _fail(req, "the region ended while it was taken")
                return
            q.region = r
            if req.granted.cancelled() or t.gone:
                if gpu == t.gpus[0]:
                    self.release(r, why="owner gone before its grant")
                return
            if len(r.gpus) == len(t.gpus):
                self._grant(r)
            req.granted.set_result(r)
        finally:
            self._schedule(gpu)  # the next request, or other threads of the owner

    async def _freeze(self, gpu: int, r: Region, siblings: list[Tenant]) -> None:
        """Step 4: freeze the GPU's other tenants, its idle pool and those that joined while
        they drained, all in parallel; each is listed in r.frozen before it is frozen, so that
        whatever ends the region thaws it."""
        loop = asyncio.get_running_loop()
        t1 = time.monotonic()
        g, t = self.gpus[gpu], r.tenant
        siblings += [s for s in g.tenants if s is not t and s not in r.frozen]
        pool = g.pool_tenant
        if pool is not None and pool not in r.frozen and self.m.has_processes(pool):
            siblings.append(pool)  # idle workers: no thread runs in a region
        siblings += [s for s in r.deferred if s not in siblings and not s.gone]
        r.deferred.clear()
        r.frozen += [s for s in siblings if s not in r.frozen]
        frozen = await asyncio.gather(
            *(loop.run_in_executor(None, self.m.freeze, s) for s in siblings)
        )
        r.problems += [
            f"tenant {s.id} did not freeze"
            for s, ok in zip(siblings, frozen, strict=True)
            if not ok
        ]
        r.problems += await loop.run_in_executor(None, self.m.frozen_holds, list(r.frozen))
        r.awake += sum(self.m.awake(s) for s in siblings)
        r.freeze_s += time.monotonic() - t1

    async def _pin(
        self, gpu: int, r: Region, hold: Hold, beside: list[asyncio.Future[Any]]
    ) -> None:
        """Step 5, once frozen and settled: the GPU is r's when the owner is on its region cores
        (the pin, begun beside the earlier steps, in `beside`). The GPU's audit and the grant's
        samples (NVML reads, a few ms each, tens beside busy siblings on an H100) begin now and
        run beside the grant: what they find goes into the record when the region ends
        (_join_checks), so they never delay the owner. The siblings are frozen and drained
        by now, so what the audit sees a few ms later is what was there at the grant."""
        r.gpus.append(gpu)
        r.epochs[gpu] = hold.epoch
        checks = self._checks.submit(_grant_checks, self.m, gpu, r.tenant)
        r.checks.append(checks)
        self._checking.append(checks)  # until it ends, even past _join_checks's wait
        await asyncio.gather(*beside)
        _add(r.steps, "quiesce", hold.quiesce_s)
        _add(r.steps, "drain", hold.drain_s)

    def _grant(self, r: Region) -> None:
        """Step 6: r holds all its GPUs; its time-out starts."""
        now = time.monotonic()
        r.t_grant = now
        r.wait_s = now - r.t_request
        r.timer = asyncio.get_running_loop().call_later(
            r.tenant.region_timeout_s, self._time_out, r
        )
        if r.problems:
            log.warning(
                "region of tenant %d on GPU %s is unclean: %s",
                r.tenant.id,
                gpu_names(r.gpus),
                "; ".join(r.problems),
            )

    def _let_go(self, gpu: int, r: Region, siblings: list[Tenant]) -> None:
        """Undo taking the GPU for region r: its siblings, its place in r, its gate."""
        q = self._q[gpu]
        if q.pending is r:
            q.pending = None
        if q.region is r:
            q.region = None
        for s in siblings:
            if s in r.frozen:
                r.frozen.remove(s)
            self._thaw(s)
        if gpu in r.gpus:
            r.gpus.remove(gpu)
        self._pin_back(r.tenant)
        self.m.open_gate(gpu)

    def revoke(self, r: Region, problem: str) -> None:
        """End r now, revoked, with the reason among its problems (the memory arbiter's way
        out when r's owner waits for memory only its frozen siblings can free)."""
        if not r.ended:
            r.problems.append(problem)
            log.warning("region of tenant %d revoked: %s", r.tenant.id, problem)
            self.finish(r, revoked=True, why=problem)

    def _time_out(self, r: Region) -> None:
        if not r.ended:
            log.warning(
                "region of tenant %d on GPU %s passed its time-out (%.1f s): revoked",
                r.tenant.id,
                gpu_names(r.gpus),
                r.tenant.region_timeout_s,
            )
            self.finish(r, revoked=True, why="time-out")

    def finish(self, r: Region, *, revoked: bool, why: str) -> dict[str, Any]:
        """Exit, on every GPU the region holds: undo the pin, thaw the siblings, open the
        gates, wake the next requests."""
        if r.ended:
            return r.record or _record(r, time.monotonic(), self.m)
        r.ended = True
        t, t_end = r.tenant, time.monotonic()
        if r.timer is not None:
            r.timer.cancel()
        _join_checks(r)
        r.revoked = r.revoked or revoked
        if revoked and r.granted and why not in r.problems:
            # Its owner still times: what ran after the gate opened was not protected.
            r.problems.append(f"revoked before its owner ended it ({why})")
        for i in r.gpus:
            if self._q[i].region is r:
                self._q[i].region = None
        if t.region is r:
            t.region = None
        if r.granted:
            # Again at the end, siblings still frozen: what started beside the owner meanwhile
            # (a foreign process, a tenant's process with no shim) makes the region unclean.
            since = time.time() - (t_end - r.t_grant)
            for i in r.gpus:
                for p in _end_audit(self._checks, self._checking, self.m.audit, (i, t, since)):
                    if p not in r.problems:
                        r.problems.append(f"{p} (at the region's end)")
            r.problems.extend(p for p in self.m.memory_problems(t) if p not in r.problems)
        t1 = time.monotonic()
        self._pin_back(t)
        t2 = time.monotonic()
        for s in r.frozen:
            self._thaw(s)
        t3 = time.monotonic()
        for i in reversed(r.gpus):
            self.m.open_gate(i)
        t4 = time.monotonic()
        r.exit_s = t4 - t_end
        r.exit_steps = dict(zip(EXIT_STEPS, (t1 - t_end, t2 - t1, t3 - t2, t4 - t3), strict=True))
        r.record = _record(r, t_end, self.m)
        capped = any(w["name"] == "gpu_capped" for w in r.record["warnings"])
        if capped:
            t.power_capped = True  # its later regions settle (_settle)
        for i in r.gpus:
            self._q[i].last = _Last(t.id, t2, capped)
        t.regions.append(r.record)
        self.on_record(t, r.record)
        log.info(
            "region of tenant %d on GPU %s ended (%s) after %.3f s",
            t.id,
            gpu_names(r.gpus),
            why,
            r.record["duration_s"],
        )
        for i in r.gpus:
            self._schedule(i)
        return r.record

    # Helpers.
    def _live(self, gpus: list[int] | None = None) -> list[Region]:
        """Regions not ended that hold or are taking a GPU (of `gpus`), each once."""
        found: list[Region] = []
        for i in range(len(self._q)) if gpus is None else gpus:
            for r in (self._q[i].region, self._q[i].pending):
                if r is not None and not r.ended and r not in found:
                    found.append(r)
        return found

    def _thaw(self, t: Tenant) -> None:
        """Thaw t unless a live region still lists it frozen (it may be a sibling on two GPUs,
        frozen by the regions of both)."""
        if t.id not in self.still_frozen():
            self.m.thaw(t)

    def _pin_back(self, t: Tenant) -> None:
        if not t.gone:
            with contextlib.suppress(KrexError):
                self.m.pin(t, self.cores(t))


def _region_cores(gpus: Sequence[Gpu], held: Sequence[int]) -> set[int]:
    return {c for i in held for c in gpus[i].slice.region_cores}


def _add(steps: dict[str, float], name: str, seconds: float) -> None:
    steps[name] = steps.get(name, 0.0) + seconds


def _grant_checks(
    m: Machinery, gpu: int, owner: Tenant
) -> tuple[int, list[str], Any, Any, dict[str, float]]:
    """In a worker thread, beside the grant: the grant's clock sample first (nearest the grant),
    then the owner's and others' memory, then the audit (what may run beside the owner without
    krex's say: foreign processes, processes with no shim). Returns them with each one's own
    seconds."""
    t0 = time.monotonic()
    clock = m.clock(gpu)
    memory = m.memory_split(gpu, owner)
    t2 = time.monotonic()
    problems = m.audit(gpu, owner)
    t3 = time.monotonic()
    return gpu, problems, clock, memory, {"sample": t2 - t0, "audit": t3 - t2}


def _join_checks(r: Region) -> None:
    """At the region's end, on the event loop: the grant's checks into r (they take a few ms,
    so they are done unless the region was shorter; then this waits for them, at most
    CHECKS_WAIT_S: one that fails or does not end makes the region unclean, with the reason)."""
    for f in r.checks:
        try:
            gpu, problems, clock, memory, took = f.result(timeout=CHECKS_WAIT_S)
        except Exception as e:  # any failure is the record's, not the daemon's
            r.problems.append(f"the grant's audit did not complete ({_why(e)})")
            continue
        r.clocks[gpu], r.memory[gpu] = clock, memory
        # Not gated, not drained, not frozen: the region cannot vouch for the GPU.
        r.problems += problems
        if problems:
            why = "; ".join(problems)
            log.warning("region of tenant %d on GPU %d is unclean: %s", r.tenant.id, gpu, why)
        for name, seconds in took.items():
            _add(r.steps, name, seconds)
    r.checks.clear()


def _end_audit(
    pool: ThreadPoolExecutor,
    running: list[Future[Any]],
    audit: Callable[[int, Tenant, float], list[str]],
    args: tuple[int, Tenant, float],
) -> list[str]:
    """A region's end audit (NVML reads, which can block while a GPU is in trouble) in a
    thread of `pool`, at most CHECKS_WAIT_S on the event loop: one that fails or does not end
    in time is a problem of the region, not a hung daemon (its future joins `running`, which
    Regions.busy() counts until it ends)."""
    f = pool.submit(audit, *args)
    running.append(f)
    try:
        return f.result(timeout=CHECKS_WAIT_S)
    except Exception as e:  # the record's, not the daemon's
        return [f"the audit did not complete ({_why(e)})"]


def _why(e: Exception) -> str:
    """Why a check did not complete, for a region's problems."""
    if isinstance(e, TimeoutError):
        return f"no answer in {CHECKS_WAIT_S:g} s"
    return str(e) or type(e).__name__


def _step(r: Region, name: str, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
    """fn(*args) in a worker thread, begun now; its own duration is added to r.steps[name]
    (on the event loop: steps that run beside each other each count their own)."""

    def timed() -> tuple[Any, float]:
        t0 = time.monotonic()
        return fn(*args), time.monotonic() - t0

    async def run() -> Any:
        result, seconds = await asyncio.get_running_loop().run_in_executor(None, timed)
        _add(r.steps, name, seconds)
        return result

    return asyncio.ensure_future(run())


def _fail(req: RegionRequest, why: str) -> None:
    if not req.granted.done():
        req.granted.set_exception(ConnectionError(why))


async def _make_room(room: Room | None, gpu: int, t: Tenant) -> float:
    """Step 0 (Room): the seconds waited, logged when they count."""
    if room is None:
        return 0.0
    waited = await room.make_room(gpu, t.id)
    if waited > 0.1:
        log.info(
            "region of tenant %d on GPU %d waited %.1f s for room in device memory",
            t.id,
            gpu,
            waited,
        )
    return waited


async def _close_and_drain(m: Machinery, gpu: int, r: Region, skip: set[int]) -> Hold:
    """Steps 1-3: close the gate, wait for siblings half-way into the driver, drain them."""
    t = r.tenant
    hold = Hold(gpu=gpu, owner=t.id)
    hold.epoch = m.close_gate(gpu, t.id, t.region_timeout_s + GATE_GRACE_S)
    r.draining = True
    try:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, m.quiesce_and_drain, hold, skip)
    finally:
        r.draining = False
    r.problems += hold.problems
    return hold


async def _settle(
    m: Machinery, gpu: int, r: Region, siblings: list[Tenant], last: _Last | None
) -> None:
    """Step 5b (the tenant's region_settle_s; once one of its regions ran into the power
    limit, at least the capped settle, unless an autotuner's candidate benchmark began this
    one; 0: none): where the GPU's siblings worked on it in the last second or two, idle
    before the grant. On the H200 the suite's power-limited conv timed 0.25-0.5 s after 4 s
    of matmuls read 0.65 % slower than on the rested GPU, after 1 s 0.49 %, after 2 or 3 s
    0.24-0.29 % (docs/user-guide.md, "Power-limited kernels"); kernels that stay below the
    limit do not read the heat, so only such a command waits. Candidates are left out: the
    winners were the exclusive ones without a settle, and with it every Inductor choice cost
    2 s, 74 s a command (docs/results.md)."""
    t = r.tenant
    settle = t.region_settle_s
    capped = capped_settle(t, last, time.monotonic()) if not r.candidate else 0.0
    by_cap = capped > settle  # the power-capped rule chose it, not the command's --settle
    if by_cap:
        settle = capped
    if settle <= 0 or not siblings:
        return
    loop = asyncio.get_running_loop()
    waited = await loop.run_in_executor(None, m.settle_idle, gpu, siblings, settle)
    r.settle_s += waited
    r.settle_capped = r.settle_capped or (by_cap and waited > 0)


def capped_settle(t: Tenant, last: _Last | None, now: float) -> float:
    """The power-capped settle of t's next region (0: none): its region_capped_settle_s once
    one of its regions ran into the power limit, but no longer than the siblings had the GPU
    where the GPU's last region was t's own and ran into the limit (the gap rule: they ran
    only since then, at no more than the power the owner itself ran at, so an idle as long
    takes their share of the heat away; an autotuner's candidates, then its timing, wait tens
    of ms, not seconds: docs/user-guide.md, "Power-limited kernels")."""
    if not t.power_capped:
        return 0.0
    full = t.region_capped_settle_s
    if last is None or last.tenant != t.id or not last.capped:
        return full
    return min(full, max(0.0, now - last.t_back))


def _entry_steps(r: Region) -> dict[str, float]:
    got = {"room": r.room_s, "freeze": r.freeze_s, "settle": r.settle_s, **r.steps}
    return {k: got.get(k, 0.0) for k in ENTRY_STEPS}


def _record(r: Region, t_end: float, m: Machinery) -> dict[str, Any]:
    """What region r was, for its tenant's report (docs/architecture.md, "What a region
    record says")."""
    rec: dict[str, Any] = {
        "wait_s": r.wait_s,
        # Of that wait, its own set-up on every GPU (room, gate, drain, freeze, pin, settle):
        # the rest queued behind other regions.
        "entry_s": r.t_grant - r.t_setup if r.granted and r.t_setup else 0.0,
        "room_s": r.room_s,
        "drain_s": r.drain_s,
        "freeze_s": r.freeze_s,
        # Siblings' processes left running (regions.freeze = contexts: no GPU context).
        "awake": r.awake,
        "settle_s": r.settle_s,
        # Whose settle it was: the command's own (--settle), or the power-capped rule's.
        **({"settle_capped": True} if r.settle_capped else {}),
        **({"candidate": True} if r.candidate else {}),  # an autotuner's candidate began it
        "duration_s": t_end - r.t_grant if r.granted else 0.0,
        "exit_s": r.exit_s,
        # Where entry_s and exit_s went, step by step (docs/architecture.md, "What a region
        # record says"): the pin runs beside the gate, drain, freeze and settle, and the audit
        # beside the samples, so the entry steps do not add up to entry_s.
        "entry_steps_s": _entry_steps(r),
        "exit_steps_s": dict(r.exit_steps),
        "clean": r.clean,
        "revoked": r.revoked,
        "problems": list(r.problems),
        # Which of the command's processes held it: a child's (Inductor's subprocess
        # autotuning) is told from the command's own.
        "pids": list(r.pids),
    }
    if r.calls:  # what held it: each marker's name and how often it began or continued it
        rec["calls"] = dict(r.calls)
    if len(r.tenant.gpus) > 1:
        rec["gpus"] = list(r.gpus)
    # The SM clock and throttle reasons at each GPU's grant and now: a throttled region is
    # flagged (docs/architecture.md, "What a region record says"); power and placement
    # become named warnings (krex/daemon/fidelity.py).
    samples = [(a, b) for i in r.gpus if (a := r.clocks.get(i)) and (b := m.clock(i))]
    is_throttled = False
    if samples:
        reasons = 0
        for start, end in samples:
            reasons |= start["throttle_reasons"] | end["throttle_reasons"]
        is_throttled = throttled(reasons)
        rec["sm_clock_mhz"] = [samples[0][0]["sm_clock_mhz"], samples[0][1]["sm_clock_mhz"]]
        rec["throttle_reasons"] = reasons
        rec["throttled"] = is_throttled
        rec |= fidelity.power_fields(samples[0][0], samples[0][1], rec["duration_s"])
    memory = r.memory.get(r.gpus[0]) if r.gpus else None
    if memory is not None:
        mine, others = memory
        rec["memory_gib"] = {"owner": round(mine / GIB, 2), "others": round(others / GIB, 2)}
    rec["warnings"] = fidelity.warnings(rec, is_throttled, memory) if r.granted else []
    if r.granted and r.tenant.mem_swaps:
        rec["warnings"].append(fidelity.swapped(r.tenant.mem_swaps))
    return rec
